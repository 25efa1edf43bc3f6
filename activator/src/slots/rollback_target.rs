//! Whether a rollback target is still its image: what the node that ran
//! it may have written, and everything else it may not.
//!
//! The running node is not trusted: it is root in its machine, and a slot
//! it ran is started again by `rollback` without anything being
//! downloaded. So before that, every entry the image holds is compared
//! with the slot's tree wherever it lies: a changed, retyped, chmod-ed or
//! chown-ed image file is a change, and so is anything added or removed.
//! The node's own are only:
//!
//! * the few files systemd writes at boot ([`NODE_FILES`]: the machine id,
//!   `/etc/.updated`, `/etc/.pwd.lock`, `/var/log/wtmp`, `btmp`,
//!   `lastlog`), whatever the image had there;
//! * below its state ([`NODE_STATE`]: `/var`, `/tmp`, `/run`, `/root`,
//!   `/home`, the CNI dirs, `/opt/containerd`): what it added or removed,
//!   and a directory's mode, owner and xattrs (systemd-tmpfiles adjusts
//!   them at boot); in its data ([`NODE_DATA`]: `/var`, `/tmp`, `/run`,
//!   `/home`) also an image file's contents; never an image file's type,
//!   mode or owner, nor anywhere else its contents (the image's
//!   `/opt/cni/bin/bridge`, which containerd runs as root for every
//!   sandbox, or `/root/.profile`);
//! * nspawn's mount points (the `Bind=` targets of the slot's `.nspawn`
//!   file, resolved in the tree as nspawn resolves them, their parents,
//!   and `/dev`, `/proc`, `/sys`).
//!
//! * A copied slot ([`copy_slot`]) is checked against the record of its
//!   tree taken when it was installed (`slots/<machine>.files`).
//! * An overlay slot ([`overlay_lowers`], [`overlay_upper`]): every lower
//!   its mount unit names (the layers, whatever made them) is checked
//!   against its own record, and every entry of its upper (what the node
//!   wrote) outside the node's paths is a change, except a directory
//!   overlayfs copied up unchanged (mode, owner and xattrs of the lower's).
//!
//! Given the root handle and the slot; reads only. What to do with a change
//! (refuse, `--force`, `--clean`) is `rollback`'s.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::AsRawFd as _;
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

use crate::paths::Root;
use crate::slot::Slot;
use crate::slots::overlay;
use crate::slots::record::{self, Entry, Kind, Mismatch, Record};
use crate::walk::{self, Visit};

/// Files a booting node writes whatever the image had there (a path equal
/// to one or below it), each with the reason.
pub const NODE_FILES: &[(&str, &str)] = &[
    (
        "etc/machine-id",
        "systemd writes the machine id at first boot",
    ),
    (
        "etc/.updated",
        "systemd-update-done stamps /etc at boot (a timestamp only)",
    ),
    (
        "etc/.pwd.lock",
        "systemd-sysusers locks the user database at boot",
    ),
    (
        "var/log/wtmp",
        "systemd-update-utmp records boots (tmpfiles sets its mode)",
    ),
    ("var/log/btmp", "failed logins (tmpfiles sets its mode)"),
    ("var/log/lastlog", "logins (tmpfiles sets its mode)"),
];

/// The parts of [`NODE_STATE`] that hold data the node rewrites (logs,
/// databases, caches): there an image file's contents may change too,
/// never its type, mode, owner or xattrs. Nothing below them is run by
/// a machine's root the way `/opt/cni/bin` or `/root` is.
pub const NODE_DATA: &[&str] = &["var", "tmp", "run", "home"];

/// The node's state, below the tree's root (a path equal to one or below
/// it), each with the reason: what it adds or removes there is its own,
/// as is a directory's mode, owner and xattrs; the image's files there
/// are compared like any other.
pub const NODE_STATE: &[(&str, &str)] = &[
    ("var", "the node's state"),
    ("tmp", "scratch"),
    ("run", "runtime state"),
    ("root", "root's home"),
    ("home", "homes"),
    (
        "etc/cni/net.d",
        "the cluster's network plugin writes its config there",
    ),
    (
        "opt/cni/bin",
        "the cluster's network plugin installs its binaries there",
    ),
    ("opt/containerd", "containerd creates its plugin dirs there"),
];

/// Mount points nspawn makes in every machine.
const API_MOUNTS: [&str; 3] = ["dev", "proc", "sys"];

/// Whether `path` (relative, as bytes) is `base` or below it.
fn under(path: &[u8], base: &[u8]) -> bool {
    path.starts_with(base) && (path.len() == base.len() || path[base.len()] == b'/')
}

/// The places in a slot's tree whose differences are the node's.
pub struct NodePaths {
    /// nspawn's mount points in this tree, resolved.
    mounts: Vec<Vec<u8>>,
}

impl NodePaths {
    /// For `slot`: its `.nspawn` file's bind targets, each resolved in the
    /// slot's tree (mounted, for an overlay slot) the way nspawn resolves
    /// it (symlinks followed inside the tree: `/lib/modules` is
    /// `usr/lib/modules` in a merged-/usr image), plus the API mounts.
    pub fn of(root: &Root, slot: Slot) -> NodePaths {
        let tree = root.machine_tree(slot.machine());
        let text = std::fs::read_to_string(root.nspawn_file(slot.machine())).unwrap_or_default();
        let mut mounts: Vec<Vec<u8>> = API_MOUNTS.iter().map(|m| m.as_bytes().to_vec()).collect();
        for line in text.lines() {
            let Some(value) = line
                .strip_prefix("Bind=")
                .or_else(|| line.strip_prefix("BindReadOnly="))
            else {
                continue;
            };
            let value = value.trim().trim_start_matches('-');
            let mut parts = value.splitn(3, ':');
            let source = parts.next().unwrap_or("");
            let target = parts.next().filter(|t| !t.is_empty()).unwrap_or(source);
            let literal = target.trim_start_matches('/').as_bytes().to_vec();
            if let Some(resolved) = resolve_in(&tree, target) {
                mounts.push(resolved);
            }
            mounts.push(literal);
        }
        NodePaths { mounts }
    }

    /// Whether everything at and below `path` is the node's, the image's
    /// entries included (the walk need not look there): a boot-written
    /// file, a mount point.
    pub fn skips(&self, path: &[u8]) -> bool {
        NODE_FILES.iter().any(|(p, _)| under(path, p.as_bytes()))
            || self.mounts.iter().any(|m| under(path, m))
    }

    /// Whether an image file's contents at `path` may change ([`NODE_DATA`]).
    pub fn in_data(&self, path: &[u8]) -> bool {
        NODE_DATA.iter().any(|p| under(path, p.as_bytes()))
    }

    /// Whether `path` is in the node's state ([`NODE_STATE`]).
    pub fn in_state(&self, path: &[u8]) -> bool {
        NODE_STATE.iter().any(|(p, _)| under(path, p.as_bytes()))
    }

    /// Whether an entry the image lacks at `path` is the node's: in its
    /// state, or a parent nspawn made for a mount point (or one of the
    /// node's paths the image lacks).
    pub fn excuses_addition(&self, path: &[u8]) -> bool {
        self.in_state(path)
            || self.mounts.iter().any(|m| under(m, path))
            || NODE_FILES
                .iter()
                .chain(NODE_STATE)
                .any(|(p, _)| under(p.as_bytes(), path))
    }
}

/// `target` (absolute, in the machine) resolved inside `tree` as if `tree`
/// were `/` (`openat2(RESOLVE_IN_ROOT)`), relative to it; `None` when it
/// does not resolve to something inside.
fn resolve_in(tree: &Path, target: &str) -> Option<Vec<u8>> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let dir = walk::open_dir(rustix::fs::CWD, tree.as_os_str().as_bytes()).ok()?;
    let fd = rustix::fs::openat2(
        &dir,
        target,
        OFlags::PATH | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
    )
    .ok()?;
    let at = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()?;
    let base = std::fs::read_link(format!("/proc/self/fd/{}", dir.as_raw_fd())).ok()?;
    let rel = at.strip_prefix(&base).ok()?;
    Some(rel.as_os_str().as_bytes().to_vec())
}

/// One difference that counts, for messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// `/path` in the machine, or `layer <dir>: /path`.
    pub path: String,
    pub what: String,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.path, self.what)
    }
}

fn change(m: &Mismatch) -> Change {
    Change {
        path: format!("/{}", m.path),
        what: m.what.clone(),
    }
}

/// A copied slot's changes since it was installed, per its record.
/// `Ok(None)`: it has no record (an adopted tree, which came from no
/// image): nothing to check against.
pub fn copy_slot(root: &Root, slot: Slot) -> io::Result<Option<Vec<Change>>> {
    let path = root.slot_files_record(slot.machine());
    let record = match record::load(&path) {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
    };
    let node = NodePaths::of(root, slot);
    let tree = root.machine_tree(slot.machine());
    // what the node added in its state is neither read nor walked (nothing
    // below an entry the image lacks is the image's)
    let skip = |p: &[u8]| {
        node.skips(p) || (node.in_state(p) && !record.entries.contains_key(&hex::encode(p)))
    };
    Ok(Some(
        record::check_except(&tree, &record, &skip)?
            .iter()
            .filter(|m| !copy_excused(&node, &record, m))
            .map(change)
            .collect(),
    ))
}

/// Whether a copied slot's difference is the node's: an addition it may
/// make, a removal in its state, a directory's attributes in its state.
fn copy_excused(node: &NodePaths, record: &Record, m: &Mismatch) -> bool {
    if m.is_addition() {
        return node.excuses_addition(&m.bytes);
    }
    if !node.in_state(&m.bytes) {
        return false;
    }
    let dir = record
        .entries
        .get(&hex::encode(&m.bytes))
        .is_some_and(|e| e.kind == Kind::Dir);
    m.is_removal() || (dir && !m.is_retype()) || (node.in_data(&m.bytes) && m.is_contents_only())
}

/// Every lower `slot`'s mount unit names, checked against its record:
/// the lowers (top first) with their records, and what differs.
pub fn overlay_lowers(root: &Root, slot: Slot) -> io::Result<(Vec<Record>, Vec<Change>)> {
    let mut records = Vec::new();
    let mut changes = Vec::new();
    for lower in overlay::lowers(root, slot)? {
        let shown = |what: String| Change {
            path: format!("layer {}", lower.display()),
            what,
        };
        let record = match record::load(&record::record_path(&lower)) {
            Ok(r) => r,
            Err(e) => {
                changes.push(shown(format!("no usable record: {e}")));
                continue;
            }
        };
        for m in record::check(&lower, &record)? {
            changes.push(Change {
                path: format!("layer {}: /{}", lower.display(), m.path),
                what: m.what,
            });
        }
        records.push(record);
    }
    Ok((records, changes))
}

/// What `slot`'s machine wrote into its upper outside its own paths:
/// every entry is a change but one equal to the topmost lower's that has
/// it (a directory copied up unchanged, a file written again with the
/// image's contents, mode, owner and xattrs; `lowers`: their records, top
/// first).
pub fn overlay_upper(root: &Root, slot: Slot, lowers: &[Record]) -> io::Result<Vec<Change>> {
    let mut v = Upper {
        node: NodePaths::of(root, slot),
        lowers,
        changes: Vec::new(),
    };
    walk::walk(&overlay::upper_dir(root, slot), &mut v).map_err(walk::WalkError::into_io)?;
    Ok(v.changes)
}

struct Upper<'a> {
    node: NodePaths,
    lowers: &'a [Record],
    changes: Vec<Change>,
}

/// overlayfs's own xattrs on upper entries (origin, impure, ...).
const OVERLAY_XATTRS: &str = "trusted.overlay.";

fn without_overlay(x: &BTreeMap<String, String>) -> BTreeMap<&String, &String> {
    x.iter()
        .filter(|(k, _)| !k.starts_with(OVERLAY_XATTRS))
        .collect()
}

impl Visit for Upper<'_> {
    fn entry(&mut self, e: &walk::Entry) -> io::Result<bool> {
        if self.node.skips(e.rel) {
            return Ok(false);
        }
        let key = hex::encode(e.rel);
        let image = self.lowers.iter().find_map(|r| r.entries.get(&key));
        let absent = image.is_none_or(|i| i.kind == Kind::Char { rdev: 0 });
        let state = self.node.in_state(e.rel);
        if absent && self.node.excuses_addition(e.rel) {
            // nothing below an entry the image lacks is the image's
            return Ok(!state);
        }
        let got = record::entry_of(e)?;
        let whiteout = got.kind == Kind::Char { rdev: 0 }
            || got.xattrs.contains_key("trusted.overlay.whiteout");
        let opaque = got.xattrs.get("trusted.overlay.opaque").map(String::as_str)
            == Some(hex::encode("y").as_str());
        let what = match (&got.kind, image) {
            // what the node removes in its state is its own
            _ if whiteout && state => None,
            _ if whiteout => Some("removed by the node".to_string()),
            // its image contents hidden: each is a removal, and what the
            // node wrote there is compared below
            _ if opaque && state => None,
            _ if opaque => Some("replaced by the node (its image contents hidden)".into()),
            (Kind::Dir, Some(i)) if i.kind == Kind::Dir && state => None,
            (Kind::Dir, Some(i)) if i.kind == Kind::Dir => copied_up(i, &got),
            // written again exactly as the image has it (ldconfig.service
            // regenerating /etc/ld.so.cache at first boot): no change
            (_, Some(i)) if !absent && i.kind == got.kind && copied_up(i, &got).is_none() => None,
            // data the node rewrites (a log the image ships)
            (Kind::File { .. }, Some(i))
                if matches!(i.kind, Kind::File { .. })
                    && self.node.in_data(e.rel)
                    && copied_up(i, &got).is_none() =>
            {
                None
            }
            (_, Some(_)) if !absent => Some("changed by the node".into()),
            _ => Some("added by the node".into()),
        };
        if let Some(what) = what {
            self.changes.push(Change {
                path: format!("/{}", String::from_utf8_lossy(e.rel)),
                what,
            });
        }
        Ok(true)
    }
}

/// A directory in the upper over `image`'s: `None` when overlayfs copied
/// it up unchanged (a child was written), else what changed.
fn copied_up(image: &Entry, got: &Entry) -> Option<String> {
    let mut what = Vec::new();
    if image.mode != got.mode {
        what.push(format!("mode {:04o} -> {:04o}", image.mode, got.mode));
    }
    if (image.uid, image.gid) != (got.uid, got.gid) {
        what.push(format!(
            "owner {}:{} -> {}:{}",
            image.uid, image.gid, got.uid, got.gid
        ));
    }
    if without_overlay(&image.xattrs) != without_overlay(&got.xattrs) {
        what.push("xattrs changed".into());
    }
    (!what.is_empty()).then(|| format!("changed by the node: {}", what.join(", ")))
}

/// The changes as one line (the first ten), for a refusal.
pub fn shown(changes: &[Change]) -> String {
    let mut s = changes
        .iter()
        .take(10)
        .map(Change::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if changes.len() > 10 {
        s.push_str(", ...");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_paths_and_mount_points_are_the_nodes() {
        let t = tempfile::tempdir().unwrap();
        let root = Root::new(t.path());
        let tree = root.machine_tree("kube1");
        std::fs::create_dir_all(tree.join("usr/lib")).unwrap();
        std::os::unix::fs::symlink("usr/lib", tree.join("lib")).unwrap();
        let nspawn = root.nspawn_file("kube1");
        std::fs::create_dir_all(nspawn.parent().unwrap()).unwrap();
        std::fs::write(
            &nspawn,
            "[Files]\nBindReadOnly=/lib/modules\nBindReadOnly=/etc/kubeslot/host/kube1:/etc/kubeslot/host\n",
        )
        .unwrap();
        std::fs::create_dir_all(tree.join("usr/lib/modules")).unwrap();
        let n = NodePaths::of(&root, Slot::Kube1);
        // boot-written files and mount points: the node's, whatever is there
        assert!(n.skips(b"etc/machine-id"));
        assert!(!n.skips(b"etc/machine-idx"));
        assert!(n.skips(b"usr/lib/modules"), "resolved through /lib");
        assert!(n.skips(b"etc/kubeslot/host/x"));
        // its state: additions (and parents of its paths) only
        for state in [
            "var/lib/x",
            "opt/cni/bin/calico",
            "etc/cni/net.d/10-x",
            "root/.x",
        ] {
            assert!(n.in_state(state.as_bytes()), "{state}");
            assert!(n.excuses_addition(state.as_bytes()), "{state}");
            assert!(!n.skips(state.as_bytes()), "{state}");
        }
        assert!(n.excuses_addition(b"opt"), "a parent of opt/cni/bin");
        assert!(n.excuses_addition(b"etc/kubeslot"), "a parent nspawn made");
        assert!(!n.in_state(b"opt"));
        assert!(!n.in_state(b"optx/cni/bin"));
        assert!(!n.excuses_addition(b"usr/local/bin/kubelet"));
        assert!(!n.excuses_addition(b"etc/systemd/system/persist.service"));
    }
}
