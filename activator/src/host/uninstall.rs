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
//! gone), then files, then `daemon-reload`, and the state last. What it
//! stops and removes is one list (`Removal`), made before anything
//! changes: `--dry-run` prints it, the run works through it.
//! `/var/lib/kubeslot/node` (the kubelet's identity, containerd's image
//! cache) and the operator's `/etc/kubeslot` (the config, trust keys and
//! the bootstrap token or exec credential it holds) are kept unless
//! `purge`, which removes them last, as the seed's reset removed its config
//! directory and as Debian's purge removes a package's configuration.
//!
//! It never removes the activator binary or the packaged unit files under
//! `/usr/lib/systemd/system`: those belong to the package manager. It disables the
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
    /// image cache) and `/etc/kubeslot` (config, trust keys, credentials).
    pub purge: bool,
    /// Also stop and remove machines `adopt` took over (their trees and
    /// the other tool's `.nspawn` files and drop-ins).
    pub remove_adopted: bool,
    /// Also stop and remove `kube1`/`kube2` machines the state has no
    /// record of (instead of refusing).
    pub remove_unmanaged: bool,
    /// Change nothing; say what would be stopped and removed.
    pub dry_run: bool,
    /// Also remove the node's network leftovers. Off by default: a link or
    /// rule of the node's patterns the host made itself after the first
    /// activation cannot be told from the node's.
    pub network: bool,
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
    /// `/etc/kubeslot` kept (absent with `purge`, or when there was none).
    pub kept_config: Option<PathBuf>,
    /// Adopted machines left as they were, and whether each runs.
    pub kept_adopted: Vec<(Slot, bool)>,
    /// The state could not be read (why): machines were told apart by
    /// their files alone.
    pub state_unreadable: Option<String>,
    /// Nothing was changed: the lists say what would be.
    pub dry_run: bool,
    /// The node's network leftovers removed (links, routing tables).
    pub network: Vec<String>,
    /// The node's network leftovers left in place (without
    /// [`Options::network`]).
    pub network_left: Vec<String>,
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

/// Removes `path`, one of [`Removal`]'s (it existed when the list was
/// made): one already gone was taken by an earlier step of the run (a
/// boot link by `systemctl disable`) and counts as removed, as the list
/// said.
fn remove(path: &Path, shown: PathBuf, out: &mut Vec<PathBuf>) -> Result<(), UninstallError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            out.push(shown);
            return Ok(());
        }
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

/// What `uninstall` takes off the host, decided once before anything
/// changes: `--dry-run` prints it, the run works through it, in this order.
#[derive(Clone, Debug, Default)]
struct Removal {
    /// The activator's units installed on the host: stopped and disabled
    /// first, so nothing starts an activation or a machine from then on.
    activator_units: Vec<&'static str>,
    /// The machines taken away: stopped and disabled, then an overlay
    /// slot's mount removed (its unit file and upper), its bpffs mount
    /// stopped.
    machines: Vec<Machine>,
    /// Then the paths that exist, as (path under the root, path shown):
    /// trees, rendered files, stores, the host settings.
    paths: Vec<(PathBuf, PathBuf)>,
    /// Then the node's network leftovers (read before the machines stop;
    /// removed once none runs to make them again).
    network: network::Leftovers,
    /// Last, what is left of `/var/lib/kubeslot` (the directory itself
    /// unless `node/` is kept).
    state: Vec<(PathBuf, PathBuf)>,
    /// The node state kept (without `purge`).
    kept: Option<PathBuf>,
    /// `/etc/kubeslot` kept (without `purge`).
    kept_config: Option<PathBuf>,
}

/// One machine `uninstall` takes away.
#[derive(Clone, Debug)]
struct Machine {
    slot: Slot,
    /// An overlay slot: its mount unit (and upper) goes too.
    overlay: bool,
    /// Its private BPF filesystem's mount unit is there.
    bpffs: bool,
}

impl Removal {
    /// The units in the order they are stopped.
    fn units(&self, root: &Root) -> Vec<String> {
        let mut units: Vec<String> = self.activator_units.iter().map(|u| u.to_string()).collect();
        for m in &self.machines {
            units.push(m.slot.unit());
            if m.overlay {
                units.push(root.mount_unit(m.slot.machine()));
            }
            if m.bpffs {
                units.push(crate::paths::bpffs_mount_unit(m.slot.machine()));
            }
        }
        units
    }

    /// The paths in the order they are removed, as shown.
    fn paths(&self) -> Vec<PathBuf> {
        let host = Root::host();
        let mut out = Vec::new();
        for m in self.machines.iter().filter(|m| m.overlay) {
            out.push(host.mount_unit_file(m.slot.machine()));
            out.push(host.slot_overlay_dir(m.slot.machine()));
        }
        out.extend(self.paths.iter().map(|(_, shown)| shown.clone()));
        out.extend(self.state.iter().map(|(_, shown)| shown.clone()));
        out
    }
}

/// Takes kubeslot off the host under `root` (see the module doc).
pub fn uninstall(
    root: &Root,
    systemd: &dyn Systemd,
    opts: &Options,
) -> Result<Uninstalled, UninstallError> {
    let _lock = Lock::try_exclusive(root)?;
    let mut done = Uninstalled::default();
    let removal = removal(root, systemd, opts, &mut done)?;
    done.network_note = removal.network.unrecorded.clone();
    if !opts.network {
        done.network_left = described(&removal.network);
    }
    if opts.dry_run {
        done.dry_run = true;
        done.units = removal.units(root);
        done.removed = removal.paths();
        done.kept = removal.kept.clone();
        done.kept_config = removal.kept_config.clone();
        if opts.network {
            done.network = described(&removal.network);
        }
        return Ok(done);
    }

    // Nothing starts an activation or a machine from here on.
    for unit in &removal.activator_units {
        systemd.stop(unit)?;
        systemd.disable(unit)?;
        done.units.push(unit.to_string());
    }
    stop_machines(root, systemd, &removal.machines, &mut done)?;
    for (p, shown) in &removal.paths {
        remove(p, shown.clone(), &mut done.removed)?;
    }
    // The node's network leftovers, once no node runs to make them again;
    // before the state (and the record of what the host had) goes. Only
    // when asked: what the host made itself after the first activation
    // matches the same names.
    if opts.network {
        done.network = network::remove(root, &removal.network)?;
    }
    systemd.daemon_reload()?;

    // The state last: an interrupted uninstall is run again.
    for (p, shown) in &removal.state {
        if *p == root.state_dir() {
            remove_state_dir(p, shown.clone(), &mut done.removed)?;
        } else {
            remove(p, shown.clone(), &mut done.removed)?;
        }
    }
    done.kept = removal.kept;
    done.kept_config = removal.kept_config;
    Ok(done)
}

/// The one list of what `uninstall` takes away (see [`Removal`]), read
/// without changing anything.
fn removal(
    root: &Root,
    systemd: &dyn Systemd,
    opts: &Options,
    done: &mut Uninstalled,
) -> Result<Removal, UninstallError> {
    let host = Root::host();
    let ours = owned_slots(root, systemd, opts, done)?;
    let machines = ours
        .iter()
        .map(|&slot| Machine {
            slot,
            overlay: crate::slots::overlay::is_overlay(root, slot),
            bpffs: root.bpffs_mount_unit_file(slot.machine()).exists(),
        })
        .collect();
    let mut paths: Vec<(PathBuf, PathBuf)> = kubeslots_paths(root, &host, &ours)
        .into_iter()
        .filter(|(p, _)| std::fs::symlink_metadata(p).is_ok())
        .collect();
    paths.extend(
        host_settings::render()
            .into_iter()
            .filter(|f| std::fs::symlink_metadata(root.dir().join(&f.path)).is_ok())
            .map(|f| (root.dir().join(&f.path), host.dir().join(&f.path))),
    );
    let (mut state, kept) = state_entries(root, opts, &paths);
    // The operator's config (with its credentials) goes last, on purge.
    let config = root.config_dir();
    let mut kept_config = None;
    if std::fs::symlink_metadata(&config).is_ok() {
        if opts.purge {
            state.push((config, host.config_dir()));
        } else {
            kept_config = Some(host.config_dir());
        }
    }
    Ok(Removal {
        activator_units: installed_units(root),
        machines,
        paths,
        network: network::leftovers(root)?,
        state,
        kept,
        kept_config,
    })
}

/// The node's network leftovers as `--dry-run` names them.
fn described(l: &network::Leftovers) -> Vec<String> {
    l.links
        .iter()
        .map(|n| format!("link {n}"))
        .chain(
            l.tables
                .iter()
                .map(|(t, what)| format!("routing table {t} ({})", what.join("; "))),
        )
        .collect()
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

/// Stops and disables each machine (and checks it is gone), an overlay
/// slot's mount (its unit and upper removed), its bpffs mount.
fn stop_machines(
    root: &Root,
    systemd: &dyn Systemd,
    machines: &[Machine],
    done: &mut Uninstalled,
) -> Result<(), UninstallError> {
    let host = Root::host();
    for m in machines {
        let slot = m.slot;
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
        if m.overlay {
            crate::slots::overlay::remove(root, systemd, slot)?;
            done.units.push(root.mount_unit(slot.machine()));
            done.removed.push(host.mount_unit_file(slot.machine()));
            done.removed.push(host.slot_overlay_dir(slot.machine()));
        }
        // its private BPF filesystem (the file goes with the paths)
        if m.bpffs {
            let unit = crate::paths::bpffs_mount_unit(slot.machine());
            systemd.stop(&unit)?;
            done.units.push(unit);
        }
    }
    Ok(())
}

/// What is left of `/var/lib/kubeslot` once `paths` are gone, removed
/// last: its entries, `node/` kept unless `purge`, then the directory
/// itself unless something is kept. Returns the node state kept, too.
fn state_entries(
    root: &Root,
    opts: &Options,
    paths: &[(PathBuf, PathBuf)],
) -> (Vec<(PathBuf, PathBuf)>, Option<PathBuf>) {
    let host = Root::host();
    let state_dir = root.state_dir();
    let mut out = Vec::new();
    let mut kept = None;
    let Ok(entries) = std::fs::read_dir(&state_dir) else {
        return (out, kept);
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        let shown = host.state_dir().join(path.file_name().unwrap_or_default());
        if path == root.node_state() && !opts.purge {
            kept = Some(shown);
        } else if !paths.iter().any(|(p, _)| *p == path) {
            out.push((path, shown));
        }
    }
    if kept.is_none() {
        out.push((state_dir, host.state_dir()));
    }
    (out, kept)
}

/// `/var/lib/kubeslot` itself, once emptied.
fn remove_state_dir(
    path: &Path,
    shown: PathBuf,
    out: &mut Vec<PathBuf>,
) -> Result<(), UninstallError> {
    match std::fs::remove_dir(path) {
        Ok(()) => out.push(shown),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(UninstallError::Remove {
                path: path.to_path_buf(),
                source,
            })
        }
    }
    Ok(())
}
