//! `uninstall`: take kubeslot off a host: the activator's units stopped and
//! disabled, kubeslot's node machines stopped and disabled, their trees and
//! every file the activator rendered or wrote removed, then its state.
//!
//! Given the root handle and the [`Systemd`] boundary. It touches only the
//! machines that are kubeslot's: a slot `state.json` records (not empty,
//! not adopted), or an empty one that holds nothing but what kubeslot
//! rendered. A machine `adopt` took over is left as it is (tree, the other
//! tool's `.nspawn` and drop-in, running or not) unless
//! [`Options::remove_adopted`]; a `kube1`/`kube2` machine the state has no
//! record of (another tool's node, e.g. unbounded-agent's `kube1` never
//! adopted) refuses the whole uninstall, naming the machine and what was
//! found, before anything changes, unless [`Options::remove_unmanaged`].
//! A state that cannot be read is no dead end: every slot is then judged
//! by its files alone (kubeslot's rendered `.nspawn`/drop-in, its saved
//! slot config), and the output says so.
//!
//! The order makes it safe to run again after an interruption: first
//! nothing can start an activation (the path unit) or a machine at boot,
//! then the machines stop (and a tree is removed only once its machine is
//! gone), then files, then `daemon-reload`, and the state last.
//! `/var/lib/kubeslot/node` (the kubelet's identity, containerd's image
//! cache) is kept unless `purge`.
//!
//! It never removes the activator binary, the packaged unit files under
//! `/usr/lib/systemd/system` or the operator's `/etc/kubeslot` (config, keys):
//! those belong to the package manager and the operator. It disables the
//! packaged units, so that neither a boot nor a config change activates the
//! node again; a reinstall of the package without `--purge` keeps them
//! disabled (Debian keeps the administrator's choice): `systemctl enable
//! --now kubeslot-activator.path kubeslot-activator.service` turns them on
//! again. The kernel keeps the sysctl values until the next boot.

use std::path::{Path, PathBuf};

use crate::host::network;
use crate::lock::{Lock, LockError};
use crate::paths::{Root, RENDER_UNIT};
use crate::render::host_settings;
use crate::render::rendered_by_kubeslot;
use crate::slot::Slot;
use crate::state::{SlotStatus, State};
use crate::systemd::{Systemd, SystemdError};

/// The units the package ships (disabled by `uninstall`; their files are
/// removed only when they were installed by hand under /etc).
const ACTIVATOR_UNITS: [&str; 2] = ["kubeslot-activator.path", "kubeslot-activator.service"];

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
    /// A node machine kubeslot has no record of.
    #[error("uninstall: machine {machine} is not kubeslot's ({state} records no node in {machine}; found: {found}): another tool's node (unbounded-agent names its machine kube1; `adopt` takes one over); nothing was changed; pass --remove-unmanaged to stop and remove it too")]
    Unmanaged {
        machine: Slot,
        state: PathBuf,
        found: String,
    },
    #[error(transparent)]
    Overlay(#[from] crate::slots::overlay::OverlayError),
    #[error("uninstall: the node's network leftovers: {0}")]
    Network(#[from] network::NetworkError),
    #[error("uninstall: cannot remove {path}: {source}")]
    Remove {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What `uninstall` is asked to do.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Also remove `/var/lib/kubeslot/node` (the node's identity, its pod
    /// image cache).
    pub purge: bool,
    /// Also stop and remove machines `adopt` took over (their trees and
    /// the other tool's `.nspawn` files and drop-ins).
    pub remove_adopted: bool,
    /// Also stop and remove `kube1`/`kube2` machines the state has no
    /// record of (instead of refusing).
    pub remove_unmanaged: bool,
    /// Change nothing; say what would be stopped and removed.
    pub dry_run: bool,
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
    /// Adopted machines left as they were, and whether each runs.
    pub kept_adopted: Vec<(Slot, bool)>,
    /// The state could not be read (why): machines were told apart by
    /// their files alone.
    pub state_unreadable: Option<String>,
    /// Nothing was changed: the lists say what would be.
    pub dry_run: bool,
    /// The node's network leftovers removed (links, routing tables).
    pub network: Vec<String>,
    /// Why no network leftover is removed (the host's network was never
    /// recorded), when so.
    pub network_note: Option<String>,
}

/// Whose a slot's machine is, as far as `uninstall` can tell.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Owner {
    /// Recorded by the state (or only kubeslot's rendered files there).
    Kubeslot,
    /// Taken over by `adopt`.
    Adopted,
    /// Something the state has no record of: what was found.
    Unmanaged(Vec<String>),
    /// Nothing there.
    Absent,
}

fn running(systemd: &dyn Systemd, slot: Slot) -> Result<bool, SystemdError> {
    Ok(systemd.is_active(&slot.unit())? || systemd.machine_registered(slot.machine())?)
}

/// Whether `path` is a file kubeslot rendered, or a directory holding
/// nothing else (a drop-in dir).
fn kubeslot_file(path: &Path) -> bool {
    if path.is_dir() {
        return std::fs::read_dir(path).is_ok_and(|rd| {
            rd.flatten()
                .all(|e| std::fs::read_to_string(e.path()).is_ok_and(|t| rendered_by_kubeslot(&t)))
        });
    }
    std::fs::read_to_string(path).is_ok_and(|t| rendered_by_kubeslot(&t))
}

fn owner(
    root: &Root,
    systemd: &dyn Systemd,
    state: &State,
    slot: Slot,
) -> Result<Owner, SystemdError> {
    let rec = state.slot(slot);
    if rec.adopted {
        return Ok(Owner::Adopted);
    }
    if rec.status != SlotStatus::Empty {
        return Ok(Owner::Kubeslot);
    }
    // An empty slot: a run may have left a tree or rendered files there
    // (a flip that died before it was recorded); anything else belongs
    // to someone else.
    let m = slot.machine();
    let host = Root::host();
    let mut found = Vec::new();
    // the config a flip rendered the slot from: kubeslot used this slot
    let mut ours = root.slot_inputs(m).exists();
    let up = running(systemd, slot)?;
    let dropin_dir = |r: &Root| {
        r.dropin_file(m)
            .parent()
            .expect("a drop-in dir")
            .to_path_buf()
    };
    for (path, shown) in [
        (root.nspawn_file(m), host.nspawn_file(m)),
        (dropin_dir(root), dropin_dir(&host)),
    ] {
        if std::fs::symlink_metadata(&path).is_ok() {
            if kubeslot_file(&path) {
                ours = true;
            } else {
                found.push(shown.display().to_string());
            }
        }
    }
    // a machine that runs (or a tree) with kubeslot's files is kubeslot's
    // node, whatever the record says (a state that cannot be read)
    if up && !ours {
        found.insert(0, "the machine is running".to_string());
    }
    if root.machine_tree(m).exists() && !ours {
        found.push(host.machine_tree(m).display().to_string());
    }
    Ok(if !found.is_empty() {
        Owner::Unmanaged(found)
    } else if ours || root.machine_tree(m).exists() {
        Owner::Kubeslot
    } else {
        Owner::Absent
    })
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
    // remove_tree does not follow symlinks, whatever the tree's depth
    let result = if meta.is_dir() {
        crate::remove::remove_tree(path).map_err(crate::remove::RemoveError::into_io)
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

/// What kubeslot put on the host, as (path under `root`, path shown): the
/// trees, staging dirs, rendered files and boot links of the machines
/// `ours` names, leftovers of killed runs, the layer store (when no overlay
/// slot stays), the render and activator units, the host files.
fn kubeslots_paths(root: &Root, host: &Root, ours: &[Slot]) -> Vec<(PathBuf, PathBuf)> {
    let mut paths: Vec<(PathBuf, PathBuf)> = Vec::new();
    let both = |f: &dyn Fn(&Root) -> PathBuf| (f(root), f(host));
    for &slot in ours {
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
        paths.push(both(&|r| r.bpffs_mount_unit_file(m)));
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
    // The layer store holds only what overlay slots were made of.
    if ours.len() == Slot::ALL.len()
        || !Slot::ALL
            .iter()
            .any(|s| crate::slots::overlay::is_overlay(root, *s))
    {
        paths.push(both(&|r| r.layers_dir()));
    }
    paths.push(both(&|r| r.systemd_system_dir().join(RENDER_UNIT)));
    for unit in ACTIVATOR_UNITS {
        // installed by hand; the package's copies live under /usr/lib
        paths.push(both(&|r| r.systemd_system_dir().join(unit)));
    }
    paths.push(both(&|r| r.join(crate::paths::host::HOST_FILES_DIR)));
    paths
}

/// Takes kubeslot off the host under `root` (see the module doc).
pub fn uninstall(
    root: &Root,
    systemd: &dyn Systemd,
    opts: &Options,
) -> Result<Uninstalled, UninstallError> {
    let _lock = Lock::try_exclusive(root)?;
    let host = Root::host();
    let mut done = Uninstalled::default();
    let ours = owned_slots(root, systemd, opts, &mut done)?;
    let units = installed_units(root);
    if opts.dry_run {
        return dry_run(root, &ours, &units, done);
    }

    // Nothing starts an activation or a machine from here on.
    for unit in units {
        systemd.stop(unit)?;
        systemd.disable(unit)?;
        done.units.push(unit.to_string());
    }
    stop_machines(root, systemd, &ours, &mut done)?;
    for (p, shown) in kubeslots_paths(root, &host, &ours) {
        remove(&p, shown, &mut done.removed)?;
    }
    for f in host_settings::remove(root).map_err(|e| UninstallError::Remove {
        path: root.sysctl_dropin(),
        source: std::io::Error::other(kubeslot_image::error_chain(&e)),
    })? {
        done.removed.push(host.dir().join(f));
    }
    // The node's network leftovers, once no node runs to make them again;
    // before the state (and the record of what the host had) goes.
    let leftovers = network::leftovers(root)?;
    done.network_note = leftovers.unrecorded.clone();
    done.network = network::remove(root, &leftovers)?;
    systemd.daemon_reload()?;

    // The state last: an interrupted uninstall is run again.
    remove_state(root, opts, &mut done)?;
    Ok(done)
}

/// Whose each machine is, decided before anything changes: the slots to
/// take away; a foreign machine refuses the whole run. A state that
/// cannot be read cannot say whose the machines are; the files on disk
/// still can (kubeslot's rendered ones), and the rest is refused as
/// unmanaged: an uninstall is never blocked for good.
fn owned_slots(
    root: &Root,
    systemd: &dyn Systemd,
    opts: &Options,
    done: &mut Uninstalled,
) -> Result<Vec<Slot>, UninstallError> {
    let state = match State::load_torn(root) {
        Ok((state, _repair)) => state,
        Err(e) => {
            done.state_unreadable = Some(kubeslot_image::error_chain(&e));
            State::default()
        }
    };
    let mut ours = Vec::new();
    for slot in Slot::ALL {
        match owner(root, systemd, &state, slot)? {
            Owner::Kubeslot => ours.push(slot),
            Owner::Adopted if opts.remove_adopted => ours.push(slot),
            Owner::Adopted => done.kept_adopted.push((slot, running(systemd, slot)?)),
            Owner::Unmanaged(_) if opts.remove_unmanaged => ours.push(slot),
            Owner::Unmanaged(mut found) => {
                if let Some(why) = &done.state_unreadable {
                    found.insert(0, format!("the state cannot be read: {why}"));
                }
                return Err(UninstallError::Unmanaged {
                    machine: slot,
                    state: Root::host().state_file(),
                    found: found.join(", "),
                });
            }
            Owner::Absent => {}
        }
    }
    Ok(ours)
}

/// The activator's units installed on the host (systemctl refuses to stop
/// or disable a unit whose file does not exist: a host that never had the
/// units installed skips them).
fn installed_units(root: &Root) -> Vec<&'static str> {
    ACTIVATOR_UNITS
        .iter()
        .copied()
        .filter(|unit| {
            [
                "etc/systemd/system",
                "usr/lib/systemd/system",
                "lib/systemd/system",
            ]
            .iter()
            .any(|d| root.join(d).join(unit).exists())
        })
        .collect()
}

/// What the run would do (units, paths that exist, the host settings, the
/// network leftovers), nothing changed.
fn dry_run(
    root: &Root,
    ours: &[Slot],
    units: &[&str],
    mut done: Uninstalled,
) -> Result<Uninstalled, UninstallError> {
    let host = Root::host();
    done.dry_run = true;
    done.units = units.iter().map(|u| u.to_string()).collect();
    for &slot in ours {
        done.units.push(slot.unit());
        if crate::slots::overlay::is_overlay(root, slot) {
            done.units.push(root.mount_unit(slot.machine()));
            done.removed.push(host.slot_overlay_dir(slot.machine()));
        }
    }
    done.removed.extend(
        kubeslots_paths(root, &host, ours)
            .into_iter()
            .filter(|(p, _)| std::fs::symlink_metadata(p).is_ok())
            .map(|(_, shown)| shown),
    );
    done.removed.extend(
        [root.sysctl_dropin(), root.modules_load_dropin()]
            .iter()
            .filter(|p| p.exists())
            .map(|p| host.dir().join(p.strip_prefix(root.dir()).unwrap_or(p))),
    );
    let l = network::leftovers(root)?;
    done.network_note = l.unrecorded.clone();
    done.network = l
        .links
        .iter()
        .map(|n| format!("link {n}"))
        .chain(
            l.tables
                .iter()
                .map(|(t, what)| format!("routing table {t} ({})", what.join("; "))),
        )
        .collect();
    Ok(done)
}

/// Stops and disables each slot's machine (and checks it is gone), an
/// overlay slot's mount (its unit and upper removed), its bpffs mount.
fn stop_machines(
    root: &Root,
    systemd: &dyn Systemd,
    ours: &[Slot],
    done: &mut Uninstalled,
) -> Result<(), UninstallError> {
    let host = Root::host();
    for &slot in ours {
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
        // An overlay slot: its mount stopped, its unit and upper removed.
        if crate::slots::overlay::is_overlay(root, slot) {
            crate::slots::overlay::remove(root, systemd, slot)?;
            done.units.push(root.mount_unit(slot.machine()));
            done.removed.push(host.mount_unit_file(slot.machine()));
            done.removed.push(host.slot_overlay_dir(slot.machine()));
        }
        // its private BPF filesystem (the file goes with the paths)
        if root.bpffs_mount_unit_file(slot.machine()).exists() {
            let unit = crate::paths::bpffs_mount_unit(slot.machine());
            systemd.stop(&unit)?;
            done.units.push(unit);
        }
    }
    Ok(())
}

/// `/var/lib/kubeslot` removed, `node/` kept unless `purge`.
fn remove_state(root: &Root, opts: &Options, done: &mut Uninstalled) -> Result<(), UninstallError> {
    let host = Root::host();
    let state_dir = root.state_dir();
    if let Ok(entries) = std::fs::read_dir(&state_dir) {
        for e in entries.flatten() {
            let shown = host.state_dir().join(e.file_name());
            if e.path() == root.node_state() && !opts.purge {
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
    Ok(())
}
