//! One tar entry applied to the tree: [`Unpacker::entry`] decodes the
//! header (`header.rs`), records the path for this layer, and dispatches on
//! what the entry is to one function per kind: the root directory, a
//! whiteout, an opaque marker, a regular file, a directory, a symlink, a
//! hardlink, a FIFO or socket. Device nodes never get here (`header.rs`
//! refuses them).
//!
//! Every create goes through the `Tree` of `apply.rs` (handles,
//! never following a symlink). Parents an entry needs but its layer does
//! not list are created in one place, [`Unpacker::implicit_parents`].
//! Ownership, mode, xattrs and times are set in the order that keeps them
//! ([`Unpacker::set_meta`]); setuid, setgid and file capabilities only on
//! allowlisted paths ([`Unpacker::check_setuid`], and for a hardlink to
//! such a file).
//!
//! It does not read the tar stream, check digests or date directories once
//! a layer is complete (`mod.rs` does).

use std::hash::BuildHasher;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use super::apply::Meta;
use super::header::{self, Decoded, EntryKind, Ext};
use super::path::ImagePath;
use super::rules::{escape, Limits, Rule};
use super::whiteout::{self, Kind};
use super::{LayerState, LayerStats, Step, Unpacker, Whiteouts, OVERLAY_OPAQUE};
use crate::digest::Hasher;

impl Unpacker {
    /// Applies one entry: decode, record, then one function per kind.
    pub(super) fn entry<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        ext: &Ext,
        raw_path: &[u8],
        state: &mut LayerState,
    ) -> Result<(), Step> {
        let d = header::decode(
            entry.header(),
            ext,
            raw_path,
            &self.policy,
            &mut state.stats.ignored_xattrs,
        )?;
        let key = self.record(&d.path, state)?;
        if d.path.is_root() {
            return self.root_dir(d, state);
        }
        match whiteout::classify(&d.path).map_err(Step::from)? {
            Kind::Plain => {}
            Kind::Whiteout(dir, name) => {
                state.stats.whiteouts += 1;
                return self.whiteout(dir, name, state);
            }
            Kind::Opaque(dir) => {
                state.stats.opaque_dirs += 1;
                return self.opaque(dir, state);
            }
        }
        match d.kind {
            EntryKind::File => self.file(entry, &d, state),
            EntryKind::Dir => self.dir(d, key, state),
            EntryKind::Symlink => self.symlink(&ext.link(entry.header()), &d, state),
            EntryKind::Hardlink => {
                self.hardlink(&d.path, &ext.link(entry.header()), state)?;
                state.stats.ignored_xattrs += d.xattrs.len() as u64;
                state.stats.hardlinks += 1;
                Ok(())
            }
            EntryKind::Node(ft) => self.node(ft, &d, state),
        }
    }

    /// Records `path` as written by this layer (and its ancestors); returns
    /// its key. One path, one entry per layer: a second entry for the same
    /// path is how tar-level tricks make tools disagree.
    fn record(&self, path: &ImagePath, state: &mut LayerState) -> Result<u128, Step> {
        let key = self.path_key(path.as_bytes());
        if !state.written.insert(key) {
            return Err(Step::Rule(
                Rule::Duplicate,
                "the same path appears twice in one layer".into(),
            ));
        }
        for anc in path.ancestors() {
            if !state.ancestors.insert(self.path_key(anc)) {
                break; // its own ancestors were recorded with it
            }
        }
        Ok(key)
    }

    /// A `./` entry: the target directory itself takes its metadata.
    fn root_dir(&mut self, d: Decoded, state: &mut LayerState) -> Result<(), Step> {
        if d.kind != EntryKind::Dir {
            return Err(root_entry());
        }
        let fd = rfs::openat(
            self.tree.root(),
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| Step::Rule(Rule::Io, format!("open the target: {e}")))?;
        clear_user_xattrs(&fd, d.path.as_bytes())?;
        self.set_meta(&fd, &d.path, &d.meta, &d.xattrs, false, &mut state.stats)?;
        state.dir_times.push((d.path, d.meta.mtime));
        state.stats.dirs += 1;
        Ok(())
    }

    /// A regular file: created (replacing what is there), its data copied
    /// from the entry and checked against the header's size, then its
    /// metadata (after the data: writing clears capabilities).
    fn file<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        d: &Decoded,
        state: &mut LayerState,
    ) -> Result<(), Step> {
        let (dir, name) = leaf(&d.path)?;
        let shown = d.path.as_bytes();
        self.check_setuid(&d.path, d.meta.mode, &d.xattrs)?;
        let parent = self.parent(dir, state)?;
        let mut file = self.tree.create_file(parent.as_fd(), name, shown)?;
        let expected = entry.size();
        let mut copied = 0u64;
        let mut hasher = (self.contents && self.hashes.is_some()).then(Hasher::new);
        loop {
            let k = match entry.read(&mut self.buf) {
                Ok(0) => break,
                Ok(k) => k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Step::Stream(e)),
            };
            if self.contents {
                file.write_all(&self.buf[..k]).map_err(|e| {
                    Step::Rule(Rule::Io, format!("write \"{}\": {e}", escape(shown)))
                })?;
                if let Some(h) = hasher.as_mut() {
                    h.update(&self.buf[..k]);
                }
            }
            copied += k as u64;
        }
        if copied != expected {
            return Err(Step::Rule(
                Rule::MalformedArchive,
                format!("entry data ends after {copied} of {expected} bytes"),
            ));
        }
        self.set_meta(&file, &d.path, &d.meta, &d.xattrs, true, &mut state.stats)?;
        if let (Some(h), Some(hashes)) = (hasher, self.hashes.as_mut()) {
            let st = rfs::fstat(&file)
                .map_err(|e| Step::Rule(Rule::Io, format!("stat \"{}\": {e}", escape(shown))))?;
            hashes.insert((st.st_dev, st.st_ino), (copied, h.finish()));
        }
        state.stats.files += 1;
        Ok(())
    }

    /// A directory: created, or an existing directory kept (its metadata
    /// replaced); dated when the layer is complete.
    fn dir(&mut self, d: Decoded, key: u128, state: &mut LayerState) -> Result<(), Step> {
        let (dir, name) = leaf(&d.path)?;
        let shown = d.path.as_bytes();
        let parent = self.parent(dir, state)?;
        let fd = self.tree.create_dir(parent.as_fd(), name, shown)?;
        // A directory over a directory: its attributes are the entry's
        // (image-spec layer.md), its old `user.*` xattrs go.
        clear_user_xattrs(&fd, shown)?;
        self.set_meta(&fd, &d.path, &d.meta, &d.xattrs, false, &mut state.stats)?;
        if self.whiteouts == Whiteouts::Overlay && state.whited.contains(&key) {
            // Whited out and written in the same layer: the lower
            // layers' directory is gone, this layer's stays.
            set_opaque(&fd, shown)?;
        }
        state.dir_times.push((d.path, d.meta.mtime));
        state.stats.dirs += 1;
        Ok(())
    }

    /// A symlink: its target is stored as written (never resolved here);
    /// xattrs on it are ignored.
    fn symlink(&mut self, target: &[u8], d: &Decoded, state: &mut LayerState) -> Result<(), Step> {
        let (dir, name) = leaf(&d.path)?;
        check_link_target(target, &self.policy.limits)?;
        state.stats.ignored_xattrs += d.xattrs.len() as u64;
        let parent = self.parent(dir, state)?;
        self.tree
            .create_symlink(parent.as_fd(), name, target, &d.meta, d.path.as_bytes())?;
        state.stats.symlinks += 1;
        Ok(())
    }

    /// A FIFO or socket (the policy allowed it); xattrs on it are ignored.
    fn node(&mut self, ft: FileType, d: &Decoded, state: &mut LayerState) -> Result<(), Step> {
        let (dir, name) = leaf(&d.path)?;
        state.stats.ignored_xattrs += d.xattrs.len() as u64;
        let parent = self.parent(dir, state)?;
        self.tree
            .create_node(parent.as_fd(), name, ft, &d.meta, d.path.as_bytes())?;
        state.stats.nodes += 1;
        Ok(())
    }

    /// A hardlink: the target must be a regular file already in the tree
    /// (in overlay mode: in this layer).
    fn hardlink(
        &mut self,
        path: &ImagePath,
        target: &[u8],
        state: &mut LayerState,
    ) -> Result<(), Step> {
        let tpath = ImagePath::parse(target, &self.policy.limits).map_err(|(r, d)| match r {
            Rule::Dotdot | Rule::Absolute => Step::Rule(
                Rule::HardlinkOutside,
                format!("hardlink target \"{}\": {d}", escape(target)),
            ),
            r => Step::Rule(r, format!("hardlink target \"{}\": {d}", escape(target))),
        })?;
        let Some((tdir, tname)) = tpath.split_last() else {
            return Err(Step::Rule(
                Rule::HardlinkToDirectory,
                "hardlink to the root directory".into(),
            ));
        };
        let (tparent, setuid) = self.link_target(&tpath, tdir, tname)?;
        // A second name for a privileged file is a privileged file.
        let privileged = setuid || has_capability(&tparent, tname)?;
        if privileged && !self.allowlisted(path) {
            return Err(Step::Rule(
                Rule::Setuid,
                format!(
                    "hardlink {} to setuid/setgid or capability file \"{}\" is not in the setuid allowlist",
                    path.to_absolute(),
                    escape(tpath.as_bytes())
                ),
            ));
        }
        let (dir, name) = leaf(path)?;
        let parent = self.parent(dir, state)?;
        self.tree.create_hardlink(
            tparent.as_fd(),
            tname,
            parent.as_fd(),
            name,
            path.as_bytes(),
        )?;
        Ok(())
    }

    /// The parent of hardlink target `tpath` (`tdir/tname`), which must be
    /// a regular file in the tree, and whether that file is setuid/setgid.
    fn link_target(
        &self,
        tpath: &ImagePath,
        tdir: &[u8],
        tname: &[u8],
    ) -> Result<(OwnedFd, bool), Step> {
        let shown = || escape(tpath.as_bytes());
        let missing = || {
            Step::Rule(
                Rule::HardlinkMissing,
                if self.whiteouts == Whiteouts::Overlay {
                    format!(
                        "hardlink target \"{}\" is not in this layer (an overlay layer cannot link into a lower one; slots.mode = \"copy\" can)",
                        shown()
                    )
                } else {
                    format!("hardlink target \"{}\" is not in the tree (yet)", shown())
                },
            )
        };
        let tparent = self.tree.open_dir(tdir, false)?.ok_or_else(missing)?;
        let st = match rfs::statat(&tparent, tname, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::NOENT) => return Err(missing()),
            Err(e) => return Err(Step::Rule(Rule::Io, format!("stat hardlink target: {e}"))),
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => Ok((tparent, st.st_mode & 0o6000 != 0)),
            FileType::Directory => Err(Step::Rule(
                Rule::HardlinkToDirectory,
                format!("hardlink target \"{}\" is a directory", shown()),
            )),
            other => Err(Step::Rule(
                Rule::HardlinkNotRegular,
                format!(
                    "hardlink target \"{}\" is a {other:?}, not a regular file",
                    shown()
                ),
            )),
        }
    }

    /// `dir/.wh.name`: removes `dir/name` of lower layers. If this layer
    /// already wrote that path (or something under it), only lower
    /// layers' contents beneath it go.
    fn whiteout(&mut self, dir: &[u8], name: &[u8], state: &mut LayerState) -> Result<(), Step> {
        if self.whiteouts == Whiteouts::Overlay {
            return self.overlay_whiteout(dir, name, state);
        }
        let Some(parent) = self.tree.open_dir(dir, false)? else {
            return Ok(()); // nothing below to hide
        };
        let target = ImagePath::from_normalised(dir).join(name);
        if state.wrote(self.path_key(target.as_bytes())) {
            // This layer's own non-directory stays as it is; a directory
            // keeps this layer's entries and loses lower layers' ones.
            if let Some(fd) = own_dir(&parent, name) {
                self.prune(&fd, &target, state)?;
            }
            return Ok(());
        }
        let exists = rfs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW).is_ok();
        if exists {
            state.saved.note(self.path_key(dir), dir, parent.as_fd())?;
            self.tree.remove(parent.as_fd(), name, target.as_bytes())?;
        }
        Ok(())
    }

    /// `dir/.wh..wh..opq`: removes lower layers' entries in `dir`.
    fn opaque(&mut self, dir: &[u8], state: &mut LayerState) -> Result<(), Step> {
        if self.whiteouts == Whiteouts::Overlay {
            let parent = self.parent(dir, state)?;
            return set_opaque(&parent, dir);
        }
        let Some(fd) = self.tree.open_dir(dir, false)? else {
            return Ok(());
        };
        self.prune(&fd, &ImagePath::from_normalised(dir), state)
    }

    /// `dir/.wh.name` in a layer of its own: an overlayfs whiteout device
    /// `dir/name` (0:0), unless this layer wrote that path itself: its own
    /// non-directory hides the lower one already, its own directory becomes
    /// opaque. A later entry of this layer for the path replaces the device.
    fn overlay_whiteout(
        &mut self,
        dir: &[u8],
        name: &[u8],
        state: &mut LayerState,
    ) -> Result<(), Step> {
        let target = ImagePath::from_normalised(dir).join(name);
        let key = self.path_key(target.as_bytes());
        let parent = self.parent(dir, state)?;
        if state.wrote(key) {
            if let Some(fd) = own_dir(&parent, name) {
                set_opaque(&fd, target.as_bytes())?;
            }
            return Ok(());
        }
        state.whited.insert(key);
        rfs::mknodat(
            &parent,
            name,
            FileType::CharacterDevice,
            Mode::empty(),
            rfs::makedev(0, 0),
        )
        .map_err(|e| {
            Step::Rule(
                Rule::Io,
                format!(
                    "create the overlayfs whiteout \"{}\" (a 0:0 character device): {e}",
                    escape(target.as_bytes())
                ),
            )
        })
    }

    /// Removes lower layers' entries under `dir` (see `Tree::prune`).
    fn prune(&mut self, fd: &OwnedFd, dir: &ImagePath, state: &mut LayerState) -> Result<(), Step> {
        let LayerState {
            written,
            ancestors,
            saved,
            ..
        } = state;
        let keys = &self.keys;
        let key_of = |p: &[u8]| {
            let a = keys.0.hash_one(p) as u128;
            let b = keys.1.hash_one(p) as u128;
            (a << 64) | b
        };
        let keep = |p: &[u8]| {
            let k = key_of(p);
            written.contains(&k) || ancestors.contains(&k)
        };
        let mut before_change =
            |p: &ImagePath, fd: BorrowedFd<'_>| saved.note(key_of(p.as_bytes()), p.as_bytes(), fd);
        let r = self.tree.prune(fd, dir, &keep, &mut before_change);
        self.tree.invalidate();
        r.map_err(Step::from)
    }

    /// The parent directory of a new leaf (a handle of its own, so the tree
    /// can be changed while it is held); missing parents are created by
    /// [`Unpacker::implicit_parents`].
    fn parent(&mut self, dir: &[u8], state: &mut LayerState) -> Result<OwnedFd, Step> {
        if self.whiteouts == Whiteouts::Overlay && !state.whited.is_empty() {
            self.unwhite(dir, state)?;
        }
        let key = self.path_key(dir);
        let Some(fd) = self.tree.dir(dir, false)? else {
            return self.implicit_parents(dir, state);
        };
        state.saved.note(key, dir, fd)?;
        fd.try_clone_to_owned()
            .map_err(|e| Step::Rule(Rule::Io, format!("duplicate a directory handle: {e}")))
    }

    /// Creates directory `dir` and whichever of its ancestors are missing:
    /// directories an entry needs but its layer does not list. In both
    /// modes they are made 0755 root:root (`Tree::dir` with `create`) and
    /// dated like any directory the layer changed. The first existing
    /// ancestor's times are saved first (it is about to change). The one
    /// place implicit parents are made, in copy and overlay-layer mode.
    fn implicit_parents(&mut self, dir: &[u8], state: &mut LayerState) -> Result<OwnedFd, Step> {
        let dir_path = ImagePath::from_normalised(dir);
        for anc in dir_path.ancestors().chain([&b""[..]]) {
            let key = self.path_key(anc);
            if let Some(fd) = self.tree.open_dir(anc, false)? {
                state.saved.note(key, anc, fd.as_fd())?;
                break;
            }
        }
        let fd = self.tree.dir(dir, true)?.ok_or_else(|| {
            Step::Rule(
                Rule::Io,
                format!("parent \"{}\" was not created", escape(dir)),
            )
        })?;
        fd.try_clone_to_owned()
            .map_err(|e| Step::Rule(Rule::Io, format!("duplicate a directory handle: {e}")))
    }

    /// Overlay layers: `.wh.D` and then `D/new` in one layer (no `D/`
    /// entry) is a fresh `D` holding `new` (image-spec layer.md: the
    /// whiteout hides the lower `D` only). The whiteout device this layer
    /// made at `dir` or one of its ancestors becomes an opaque directory,
    /// 0755 root:root like any directory a layer needs but does not list.
    fn unwhite(&mut self, dir: &[u8], state: &mut LayerState) -> Result<(), Step> {
        let mut end = 0;
        while end < dir.len() {
            end = dir[end..]
                .iter()
                .position(|b| *b == b'/')
                .map_or(dir.len(), |i| end + i);
            let prefix = &dir[..end];
            end += 1;
            if !state.whited.contains(&self.path_key(prefix)) {
                continue;
            }
            let (pdir, name) = match prefix.iter().rposition(|b| *b == b'/') {
                Some(i) => (&prefix[..i], &prefix[i + 1..]),
                None => (&b""[..], prefix),
            };
            let Some(parent) = self.tree.open_dir(pdir, false)? else {
                continue;
            };
            let is_device = rfs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW)
                .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::CharacterDevice);
            if !is_device {
                continue;
            }
            self.tree.remove(parent.as_fd(), name, prefix)?;
            rfs::mkdirat(&parent, name, Mode::from_raw_mode(0o755)).map_err(|e| {
                Step::Rule(
                    Rule::Io,
                    format!("create directory \"{}\": {e}", escape(prefix)),
                )
            })?;
            let fd = own_dir(&parent, name).ok_or_else(|| {
                Step::Rule(Rule::Io, format!("open directory \"{}\"", escape(prefix)))
            })?;
            set_opaque(&fd, prefix)?;
        }
        Ok(())
    }

    /// Whether `path` is on the setuid allowlist (compared byte for byte; a
    /// name that is not UTF-8 never is).
    fn allowlisted(&self, path: &ImagePath) -> bool {
        std::str::from_utf8(path.as_bytes())
            .is_ok_and(|s| self.setuid_allowed.contains(&format!("/{s}")))
    }

    /// Setuid/setgid bits and file capabilities only on allowlisted paths.
    fn check_setuid(
        &self,
        path: &ImagePath,
        mode: u32,
        xattrs: &[(String, Vec<u8>)],
    ) -> Result<(), Step> {
        let caps = xattrs.iter().any(|(n, _)| n == "security.capability");
        if (mode & 0o6000 != 0 || caps) && !self.allowlisted(path) {
            let what = if caps {
                "file capabilities (security.capability)".to_string()
            } else {
                format!("mode {mode:04o} (setuid/setgid)")
            };
            return Err(Step::Rule(
                Rule::Setuid,
                format!(
                    "{what} on {}, which is not in the setuid allowlist",
                    path.to_absolute()
                ),
            ));
        }
        Ok(())
    }

    /// Owner, mode, allowed xattrs, and (for files) times, in the order that
    /// keeps them: chown clears setuid bits and capabilities, so it goes
    /// first; writing clears capabilities, so data is already written.
    fn set_meta(
        &self,
        fd: &impl AsFd,
        path: &ImagePath,
        meta: &Meta,
        xattrs: &[(String, Vec<u8>)],
        is_file: bool,
        stats: &mut LayerStats,
    ) -> Result<(), Step> {
        let shown = || escape(path.as_bytes());
        rfs::fchown(
            fd,
            Some(rfs::Uid::from_raw(meta.uid)),
            Some(rfs::Gid::from_raw(meta.gid)),
        )
        .map_err(|e| Step::Rule(Rule::Io, format!("chown \"{}\": {e}", shown())))?;
        rfs::fchmod(fd, Mode::from_raw_mode(meta.mode))
            .map_err(|e| Step::Rule(Rule::Io, format!("chmod \"{}\": {e}", shown())))?;
        for (name, value) in xattrs {
            let wanted = name.starts_with("user.") || (is_file && name == "security.capability");
            if !wanted {
                stats.ignored_xattrs += 1;
                continue;
            }
            rfs::fsetxattr(fd, name.as_str(), value, rfs::XattrFlags::empty()).map_err(|e| {
                Step::Rule(
                    Rule::Xattr,
                    format!("xattr {name:?} on \"{}\": {e}", shown()),
                )
            })?;
        }
        if is_file {
            rfs::futimens(fd, &meta.timestamps())
                .map_err(|e| Step::Rule(Rule::Io, format!("set times \"{}\": {e}", shown())))?;
        }
        Ok(())
    }
}

/// The parent directory and name of a non-root entry.
fn leaf(path: &ImagePath) -> Result<(&[u8], &[u8]), Step> {
    path.split_last().ok_or_else(root_entry)
}

fn root_entry() -> Step {
    Step::Rule(
        Rule::RootEntry,
        "the root of the tree can only be a directory".into(),
    )
}

/// `parent/name` as an `O_PATH` handle if it is a directory (a symlink
/// there is not followed): a directory this layer wrote.
fn own_dir(parent: &OwnedFd, name: &[u8]) -> Option<OwnedFd> {
    rfs::openat(
        parent,
        name,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()
}

/// Whether regular file `parent/name` carries file capabilities.
fn has_capability(parent: &OwnedFd, name: &[u8]) -> Result<bool, Step> {
    let f = rfs::openat(
        parent,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    )
    .map_err(|e| Step::Rule(Rule::Io, format!("open hardlink target: {e}")))?;
    Ok(rfs::fgetxattr(&f, "security.capability", &mut [0u8; 64][..]).is_ok())
}

/// Removes the `user.*` xattrs of directory `fd` (an entry for it brings
/// its own).
fn clear_user_xattrs(fd: &impl AsFd, shown: &[u8]) -> Result<(), Step> {
    let fail = |what: &str, e: Errno| {
        Step::Rule(
            Rule::Xattr,
            format!("{what} xattrs of \"{}\": {e}", escape(shown)),
        )
    };
    // XATTR_LIST_MAX: 64 KiB.
    let mut names = vec![0u8; 65536];
    let n = match rfs::flistxattr(fd, &mut names[..]) {
        Ok(n) => n,
        Err(Errno::NOTSUP) => return Ok(()),
        Err(e) => return Err(fail("list", e)),
    };
    for name in names[..n].split(|b| *b == 0) {
        if name.starts_with(b"user.") {
            rfs::fremovexattr(fd, name).map_err(|e| fail("remove", e))?;
        }
    }
    Ok(())
}

/// Marks directory `fd` opaque for overlayfs (lower layers' entries under
/// it are hidden). `fd` may be an `O_PATH` handle: it is reopened readable.
fn set_opaque(fd: &impl AsFd, shown: &[u8]) -> Result<(), Step> {
    let readable = rfs::openat(
        fd,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| {
        Step::Rule(
            Rule::Io,
            format!("open directory \"{}\": {e}", escape(shown)),
        )
    })?;
    rfs::fsetxattr(&readable, OVERLAY_OPAQUE, b"y", rfs::XattrFlags::empty()).map_err(|e| {
        Step::Rule(
            Rule::Xattr,
            format!(
                "{OVERLAY_OPAQUE} on \"{}\" (the layer store's filesystem must keep trusted.* xattrs): {e}",
                escape(shown)
            ),
        )
    })
}

fn check_link_target(target: &[u8], limits: &Limits) -> Result<(), Step> {
    if target.is_empty() {
        return Err(Step::Rule(Rule::EmptyName, "empty symlink target".into()));
    }
    if target.contains(&0) {
        return Err(Step::Rule(
            Rule::NulByte,
            "symlink target contains a NUL byte".into(),
        ));
    }
    if target.len() > limits.max_path_bytes {
        return Err(Step::Rule(
            Rule::PathTooLong,
            format!(
                "symlink target is {} bytes, more than the limit of {}",
                target.len(),
                limits.max_path_bytes
            ),
        ));
    }
    Ok(())
}
