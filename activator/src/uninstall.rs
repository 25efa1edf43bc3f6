//! `uninstall`: take kubeslot off a host: the activator's units stopped and
//! disabled, both node machines stopped and disabled, their trees and every
//! file the activator rendered or wrote removed, then its state.
//!
//! Given the root handle and the [`Systemd`] boundary. The order makes it
//! safe to run again after an interruption: first nothing can start an
//! activation (the path unit) or a machine at boot, then the machines stop
//! (and a tree is removed only once its machine is gone), then files, then
//! `daemon-reload`, and the state last. `/var/lib/kubeslot/node` (the
//! kubelet's identity, containerd's image cache) is kept unless `purge`.
//!
//! It never removes the activator binary, the packaged unit files under
//! `/usr/lib/systemd/system` or the operator's `/etc/kubeslot` (config, keys):
//! those belong to the package manager and the operator. The kernel keeps
//! the sysctl values until the next boot.

use std::path::{Path, PathBuf};

use crate::host_settings;
use crate::lock::{Lock, LockError};
use crate::paths::{Root, RENDER_UNIT};
use crate::slot::Slot;
use crate::systemd::{Systemd, SystemdError};

/// The units the package ships (disabled by `uninstall`; their files are
/// removed only when they were installed by hand under /etc).
pub const ACTIVATOR_UNITS: [&str; 2] = ["kubeslot-activator.path", "kubeslot-activator.service"];

#[derive(Debug, thiserror::Error)]
pub enum UninstallError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Systemd(#[from] SystemdError),
    #[error(
        "uninstall: machine {machine} still runs after `systemctl stop {unit}`: its tree is kept"
    )]
    StillRunning { machine: Slot, unit: String },
    #[error("uninstall: cannot remove {path}: {source}")]
    Remove {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What `uninstall` did, for the operator.
#[derive(Clone, Debug, Default)]
pub struct Uninstalled {
    /// Units stopped and disabled.
    pub units: Vec<String>,
    /// Paths removed (host-absolute).
    pub removed: Vec<PathBuf>,
    /// The node state kept (absent with `purge`, or when there was none).
    pub kept: Option<PathBuf>,
}

fn remove(path: &Path, shown: PathBuf, out: &mut Vec<PathBuf>) -> Result<(), UninstallError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(UninstallError::Remove {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    // remove_dir_all does not follow symlinks inside the tree
    let result = if meta.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
    result.map_err(|source| UninstallError::Remove {
        path: path.to_path_buf(),
        source,
    })?;
    out.push(shown);
    Ok(())
}

/// Takes kubeslot off the host under `root` (see the module doc).
pub fn uninstall(
    root: &Root,
    systemd: &dyn Systemd,
    purge: bool,
) -> Result<Uninstalled, UninstallError> {
    let _lock = Lock::try_exclusive(root)?;
    let host = Root::host();
    let mut done = Uninstalled::default();

    // Nothing starts an activation or a machine from here on. (systemctl
    // refuses to stop or disable a unit whose file does not exist: a host
    // that never had the units installed skips them.)
    for unit in ACTIVATOR_UNITS {
        let installed = [
            "etc/systemd/system",
            "usr/lib/systemd/system",
            "lib/systemd/system",
        ]
        .iter()
        .any(|d| root.join(d).join(unit).exists());
        if installed {
            systemd.stop(unit)?;
            systemd.disable(unit)?;
            done.units.push(unit.to_string());
        }
    }
    for slot in Slot::ALL {
        let unit = slot.unit();
        systemd.stop(&unit)?;
        systemd.disable(&unit)?;
        if systemd.is_active(&unit)? || systemd.machine_registered(slot.machine())? {
            return Err(UninstallError::StillRunning {
                machine: slot,
                unit,
            });
        }
        done.units.push(unit);
    }

    let mut paths: Vec<(PathBuf, PathBuf)> = Vec::new();
    let both = |f: &dyn Fn(&Root) -> PathBuf| (f(root), f(&host));
    for slot in Slot::ALL {
        let m = slot.machine();
        paths.push(both(&|r| r.machine_tree(m)));
        paths.push(both(&|r| r.machine_staging(m)));
        paths.push(both(&|r| r.nspawn_file(m)));
        paths.push(both(&|r| {
            r.dropin_file(m)
                .parent()
                .expect("a drop-in dir")
                .to_path_buf()
        }));
        paths.push(both(&|r| r.machine_wants_link(m)));
    }
    // staging and archive dirs of killed runs (`.staging-<m>-*`, `.archive-*`)
    if let Ok(entries) = std::fs::read_dir(root.machines_dir()) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(".staging-")
                || name.starts_with(".archive-")
                || name.starts_with(".kubeslot-")
            {
                paths.push((e.path(), host.machines_dir().join(&name)));
            }
        }
    }
    paths.push(both(&|r| r.systemd_system_dir().join(RENDER_UNIT)));
    for unit in ACTIVATOR_UNITS {
        // installed by hand; the package's copies live under /usr/lib
        paths.push(both(&|r| r.systemd_system_dir().join(unit)));
    }
    paths.push(both(&|r| r.join(crate::paths::host::HOST_FILES_DIR)));
    for (p, shown) in paths {
        remove(&p, shown, &mut done.removed)?;
    }
    for f in host_settings::remove(root).map_err(|e| UninstallError::Remove {
        path: root.sysctl_dropin(),
        source: std::io::Error::other(kubeslot_image::error_chain(&e)),
    })? {
        done.removed.push(host.dir().join(f));
    }
    systemd.daemon_reload()?;

    // The state last: an interrupted uninstall is run again.
    let state_dir = root.state_dir();
    if let Ok(entries) = std::fs::read_dir(&state_dir) {
        for e in entries.flatten() {
            let shown = host.state_dir().join(e.file_name());
            if e.path() == root.node_state() && !purge {
                done.kept = Some(shown);
                continue;
            }
            remove(&e.path(), shown, &mut done.removed)?;
        }
    }
    if done.kept.is_none() {
        match std::fs::remove_dir(&state_dir) {
            Ok(()) => done.removed.push(host.state_dir()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(UninstallError::Remove {
                    path: state_dir,
                    source,
                })
            }
        }
    }
    Ok(done)
}
