//! The filesystem half of the unpacker: a [`Tree`] holds the target as a
//! directory handle and performs every change relative to handles, never
//! following a symlink.
//!
//! It is given the target directory and single-component leaf names under
//! parents it resolved itself. Parents are resolved with `openat2`
//! (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`), so a
//! symlink anywhere in a parent path is an error rather than a redirection,
//! and a precise component-by-component walk (`O_NOFOLLOW`) explains the
//! failure or creates missing parents. Leaves are created with `O_EXCL`,
//! `mkdirat`, `symlinkat`, `linkat` without `AT_SYMLINK_FOLLOW`, and changed
//! with `fchown`/`fchmod`/`futimens` on an fd or the `AT_SYMLINK_NOFOLLOW`
//! variants. It deliberately knows nothing about tar, layers or policy.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{
    self as rfs, AtFlags, Dir, FileType, Mode, OFlags, ResolveFlags, Timespec, Timestamps,
};
use rustix::io::Errno;

use super::path::ImagePath;
use super::rules::{escape, Rule};

/// A broken rule (or failed operation) and the reason, before the caller
/// adds layer and entry.
pub(crate) type Fail = (Rule, String);

fn io_fail(what: &str, name: &[u8], e: Errno) -> Fail {
    (Rule::Io, format!("{what} \"{}\": {e}", escape(name)))
}

/// Directory parents are opened as `O_PATH` handles: enough to be a dirfd,
/// never readable or writable themselves.
const DIR_PATH: OFlags = OFlags::PATH
    .union(OFlags::DIRECTORY)
    .union(OFlags::CLOEXEC)
    .union(OFlags::NOFOLLOW);

const BENEATH: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// Ownership, mode and time to give a new leaf.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Meta {
    pub uid: u32,
    pub gid: u32,
    /// Permission bits including setuid/setgid/sticky (`& 0o7777`).
    pub mode: u32,
    pub mtime: Timespec,
}

impl Meta {
    pub fn timestamps(&self) -> Timestamps {
        Timestamps {
            last_access: self.mtime,
            last_modification: self.mtime,
        }
    }
}

/// The unpack target, held open as a directory handle.
pub(crate) struct Tree {
    root: OwnedFd,
    /// The last parent resolved (entries come grouped by directory), cleared
    /// whenever anything is removed so a stale handle is never reused.
    cache: Option<(Vec<u8>, OwnedFd)>,
}

impl Tree {
    /// Opens `target` (which must be an existing, empty directory that is
    /// not itself a symlink).
    pub fn open(target: &Path) -> Result<Tree, Fail> {
        let shown = target.display().to_string();
        let root = rfs::open(
            target,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )
        .map_err(|e| {
            (
                Rule::Target,
                format!("{shown}: cannot open as a directory (symlinks refused): {e}"),
            )
        })?;
        let mut dir = Dir::read_from(&root)
            .map_err(|e| (Rule::Target, format!("{shown}: cannot list: {e}")))?;
        while let Some(ent) = dir.read() {
            let ent = ent.map_err(|e| (Rule::Target, format!("{shown}: cannot list: {e}")))?;
            let n = ent.file_name().to_bytes();
            if n != b"." && n != b".." {
                return Err((
                    Rule::Target,
                    format!(
                        "{shown}: not empty (holds \"{}\"); unpack needs an empty staging directory",
                        escape(n)
                    ),
                ));
            }
        }
        Ok(Tree { root, cache: None })
    }

    pub fn root(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// Forgets the cached parent handle (after any removal).
    pub fn invalidate(&mut self) {
        self.cache = None;
    }

    /// Resolves directory `dir` (relative, normalised) to a handle, creating
    /// missing components (mode 0755, root-owned) when `create` is set.
    /// `Ok(None)`: missing and not created.
    pub fn dir(&mut self, dir: &[u8], create: bool) -> Result<Option<BorrowedFd<'_>>, Fail> {
        if dir.is_empty() {
            return Ok(Some(self.root.as_fd()));
        }
        let hit = matches!(&self.cache, Some((p, _)) if p.as_slice() == dir);
        if !hit {
            let Some(fd) = self.open_dir(dir, create)? else {
                return Ok(None);
            };
            self.cache = Some((dir.to_vec(), fd));
        }
        Ok(self.cache.as_ref().map(|(_, fd)| fd.as_fd()))
    }

    /// Like [`Tree::dir`] but returns a handle of its own, bypassing the cache
    /// (for hardlink targets, which need a second parent at the same time).
    pub fn open_dir(&self, dir: &[u8], create: bool) -> Result<Option<OwnedFd>, Fail> {
        if dir.is_empty() {
            return rfs::openat(&self.root, ".", DIR_PATH, Mode::empty())
                .map(Some)
                .map_err(|e| io_fail("open the target", b".", e));
        }
        match rfs::openat2(&self.root, dir, DIR_PATH, Mode::empty(), BENEATH) {
            Ok(fd) => Ok(Some(fd)),
            // Anything else (a symlink, a non-directory, a missing part, an
            // old kernel without openat2): walk to say which, or to create.
            Err(_) => self.walk(dir, create),
        }
    }

    /// Resolves `dir` one component at a time with `O_NOFOLLOW`.
    fn walk(&self, dir: &[u8], create: bool) -> Result<Option<OwnedFd>, Fail> {
        let mut cur = rfs::openat(&self.root, ".", DIR_PATH, Mode::empty())
            .map_err(|e| io_fail("open the target", b".", e))?;
        let mut done = 0usize;
        for comp in dir.split(|&b| b == b'/') {
            let so_far = &dir[..(done + comp.len()).min(dir.len())];
            done += comp.len() + 1;
            let next = match rfs::openat(&cur, comp, DIR_PATH, Mode::empty()) {
                Ok(fd) => fd,
                Err(Errno::NOENT) if create => {
                    match rfs::mkdirat(&cur, comp, Mode::from_raw_mode(0o755)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(io_fail("create parent directory", so_far, e)),
                    }
                    rfs::openat(&cur, comp, DIR_PATH, Mode::empty())
                        .map_err(|e| io_fail("open parent directory", so_far, e))?
                }
                Err(Errno::NOENT) => return Ok(None),
                Err(e) => return Err(explain_parent(&cur, comp, so_far, e)),
            };
            // O_PATH|O_NOFOLLOW opens a symlink itself; O_DIRECTORY then
            // fails with ENOTDIR, handled above. Double-check the type anyway.
            let st = rfs::fstat(&next).map_err(|e| io_fail("stat", so_far, e))?;
            if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
                return Err(explain_parent(&cur, comp, so_far, Errno::NOTDIR));
            }
            cur = next;
        }
        Ok(Some(cur))
    }

    /// Removes whatever is at `parent/name` (a whole subtree for a
    /// directory). Missing is fine.
    pub fn remove(
        &mut self,
        parent: BorrowedFd<'_>,
        name: &[u8],
        shown: &[u8],
    ) -> Result<(), Fail> {
        self.cache = None;
        remove_at(parent, name, shown, 0)
    }

    /// Creates a regular file (replacing what is there) and writes `data`
    /// into it; returns the open file for metadata.
    pub fn create_file(
        &mut self,
        parent: BorrowedFd<'_>,
        name: &[u8],
        shown: &[u8],
    ) -> Result<std::fs::File, Fail> {
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let mode = Mode::from_raw_mode(0o600);
        let fd = match rfs::openat(parent, name, flags, mode) {
            Err(Errno::EXIST) => {
                self.remove(parent, name, shown)?;
                rfs::openat(parent, name, flags, mode)
            }
            r => r,
        }
        .map_err(|e| io_fail("create file", shown, e))?;
        Ok(std::fs::File::from(fd))
    }

    /// Creates a directory, or keeps an existing one (a directory over a
    /// directory keeps its children); a non-directory in the way is removed.
    /// Returns a readable handle for metadata.
    pub fn create_dir(
        &mut self,
        parent: BorrowedFd<'_>,
        name: &[u8],
        shown: &[u8],
    ) -> Result<OwnedFd, Fail> {
        match rfs::mkdirat(parent, name, Mode::from_raw_mode(0o700)) {
            Ok(()) => {}
            Err(Errno::EXIST) => {
                let st = rfs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(|e| io_fail("stat", shown, e))?;
                if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
                    self.remove(parent, name, shown)?;
                    rfs::mkdirat(parent, name, Mode::from_raw_mode(0o700))
                        .map_err(|e| io_fail("create directory", shown, e))?;
                }
            }
            Err(e) => return Err(io_fail("create directory", shown, e)),
        }
        rfs::openat(
            parent,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io_fail("open directory", shown, e))
    }

    /// Runs `make` to create leaf `parent/name`; when something is already
    /// there, removes it (a whole subtree for a directory) and runs `make`
    /// once more.
    fn replace_leaf(
        &mut self,
        parent: BorrowedFd<'_>,
        name: &[u8],
        shown: &[u8],
        what: &str,
        make: impl Fn() -> Result<(), Errno>,
    ) -> Result<(), Fail> {
        match make() {
            Err(Errno::EXIST) => {
                self.remove(parent, name, shown)?;
                make()
            }
            r => r,
        }
        .map_err(|e| io_fail(what, shown, e))
    }

    /// Creates a symlink (never resolved) and gives it owner and times.
    pub fn create_symlink(
        &mut self,
        parent: BorrowedFd<'_>,
        name: &[u8],
        target: &[u8],
        meta: &Meta,
        shown: &[u8],
    ) -> Result<(), Fail> {
        self.replace_leaf(parent, name, shown, "create symlink", || {
            rfs::symlinkat(target, parent, name)
        })?;
        chown_leaf(parent, name, meta).map_err(|e| io_fail("chown symlink", shown, e))?;
        rfs::utimensat(parent, name, &meta.timestamps(), AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| io_fail("set symlink times", shown, e))
    }

    /// Creates a FIFO or socket node, then owner, mode and times.
    pub fn create_node(
        &mut self,
        parent: BorrowedFd<'_>,
        name: &[u8],
        kind: FileType,
        meta: &Meta,
        shown: &[u8],
    ) -> Result<(), Fail> {
        let mode = Mode::from_raw_mode(0o600);
        self.replace_leaf(parent, name, shown, "create node", || {
            rfs::mknodat(parent, name, kind, mode, 0)
        })?;
        chown_leaf(parent, name, meta).map_err(|e| io_fail("chown node", shown, e))?;
        // fchmodat cannot refuse to follow (and a socket cannot be opened
        // for fchmod): check that the leaf still is the node we made, in a
        // staging directory nobody else writes to.
        let st = rfs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| io_fail("stat node", shown, e))?;
        if FileType::from_raw_mode(st.st_mode) != kind {
            return Err(io_fail("chmod node", shown, Errno::STALE));
        }
        rfs::chmodat(
            parent,
            name,
            Mode::from_raw_mode(meta.mode),
            AtFlags::empty(),
        )
        .map_err(|e| io_fail("chmod node", shown, e))?;
        rfs::utimensat(parent, name, &meta.timestamps(), AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| io_fail("set node times", shown, e))
    }

    /// Hardlinks `link_parent/link_name` to `target_parent/target_name`
    /// (which the caller checked is a regular file), replacing what is
    /// at the link name unless it already is that very file.
    pub fn create_hardlink(
        &mut self,
        target_parent: BorrowedFd<'_>,
        target_name: &[u8],
        link_parent: BorrowedFd<'_>,
        link_name: &[u8],
        shown: &[u8],
    ) -> Result<(), Fail> {
        match rfs::linkat(
            target_parent,
            target_name,
            link_parent,
            link_name,
            AtFlags::empty(),
        ) {
            Ok(()) => Ok(()),
            Err(Errno::EXIST) => {
                let a = rfs::statat(target_parent, target_name, AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(|e| io_fail("stat hardlink target", shown, e))?;
                let b = rfs::statat(link_parent, link_name, AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(|e| io_fail("stat", shown, e))?;
                if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino) {
                    return Ok(());
                }
                self.remove(link_parent, link_name, shown)?;
                rfs::linkat(
                    target_parent,
                    target_name,
                    link_parent,
                    link_name,
                    AtFlags::empty(),
                )
                .map_err(|e| io_fail("create hardlink", shown, e))
            }
            Err(e) => Err(io_fail("create hardlink", shown, e)),
        }
    }

    /// Removes from directory `dir_path` every entry for which `keep` is
    /// false, descending into kept directories (an opaque directory, or a
    /// whiteout of a directory this layer also wrote).
    /// The caller must [`Tree::invalidate`] afterwards.
    /// `before_change` is called once per directory before the first
    /// removal in it (to save its times).
    pub fn prune(
        &self,
        dir: &OwnedFd,
        dir_path: &ImagePath,
        keep: &dyn Fn(&[u8]) -> bool,
        before_change: &mut dyn FnMut(&ImagePath, BorrowedFd<'_>) -> Result<(), Fail>,
    ) -> Result<(), Fail> {
        let mut noted = false;
        for (name, ft) in list(dir.as_fd(), dir_path.as_bytes())? {
            let child = dir_path.join(&name);
            if keep(child.as_bytes()) {
                if ft == FileType::Directory {
                    let sub = rfs::openat(dir, name.as_slice(), DIR_PATH, Mode::empty())
                        .map_err(|e| io_fail("open directory", child.as_bytes(), e))?;
                    self.prune(&sub, &child, keep, before_change)?;
                }
            } else {
                if !noted {
                    before_change(dir_path, dir.as_fd())?;
                    noted = true;
                }
                remove_at(dir.as_fd(), &name, child.as_bytes(), 0)?;
            }
        }
        Ok(())
    }
}

/// Gives leaf `parent/name` (not followed) the entry's owner.
fn chown_leaf(parent: BorrowedFd<'_>, name: &[u8], meta: &Meta) -> Result<(), Errno> {
    rfs::chownat(
        parent,
        name,
        Some(rfs::Uid::from_raw(meta.uid)),
        Some(rfs::Gid::from_raw(meta.gid)),
        AtFlags::SYMLINK_NOFOLLOW,
    )
}

/// Why the component `comp` of a parent path could not be opened as a
/// directory: a symlink, a non-directory or another error.
fn explain_parent(cur: &OwnedFd, comp: &[u8], so_far: &[u8], e: Errno) -> Fail {
    match rfs::statat(cur, comp, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => match FileType::from_raw_mode(st.st_mode) {
            FileType::Symlink => (
                Rule::SymlinkParent,
                format!(
                    "parent \"{}\" is a symlink; the unpacker never follows one",
                    escape(so_far)
                ),
            ),
            FileType::Directory => io_fail("open parent directory", so_far, e),
            other => (
                Rule::ParentNotDirectory,
                format!(
                    "parent \"{}\" is a {other:?}, not a directory",
                    escape(so_far)
                ),
            ),
        },
        Err(e2) => io_fail("stat parent", so_far, e2),
    }
}

/// The entries of a directory (without `.` and `..`) with their types.
fn list(dir: BorrowedFd<'_>, shown: &[u8]) -> Result<Vec<(Vec<u8>, FileType)>, Fail> {
    // `dir` may be an O_PATH handle, which cannot be read: open it for reading.
    let readable = rfs::openat(
        dir,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_fail("open directory", shown, e))?;
    let mut d = Dir::new(readable).map_err(|e| io_fail("list directory", shown, e))?;
    let mut out = Vec::new();
    while let Some(ent) = d.read() {
        let ent = ent.map_err(|e| io_fail("list directory", shown, e))?;
        let n = ent.file_name().to_bytes();
        if n == b"." || n == b".." {
            continue;
        }
        let mut ft = ent.file_type();
        if ft == FileType::Unknown {
            ft = rfs::statat(dir, n, AtFlags::SYMLINK_NOFOLLOW)
                .map(|st| FileType::from_raw_mode(st.st_mode))
                .map_err(|e| io_fail("stat", n, e))?;
        }
        out.push((n.to_vec(), ft));
    }
    Ok(out)
}

/// Removes `parent/name`, recursing through directories by handle. The
/// depth is bounded by what we created (itself bounded by `max_depth`);
/// `depth` guards against anything else.
fn remove_at(parent: BorrowedFd<'_>, name: &[u8], shown: &[u8], depth: usize) -> Result<(), Fail> {
    const MAX_REMOVE_DEPTH: usize = 4096;
    match rfs::unlinkat(parent, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => return Ok(()),
        // EISDIR (Linux) or EPERM (POSIX) for a directory.
        Err(Errno::ISDIR) | Err(Errno::PERM) => {}
        Err(e) => return Err(io_fail("remove", shown, e)),
    }
    if depth > MAX_REMOVE_DEPTH {
        return Err(io_fail("remove", shown, Errno::LOOP));
    }
    let dir = rfs::openat(parent, name, DIR_PATH, Mode::empty())
        .map_err(|e| io_fail("open directory to remove", shown, e))?;
    for (child, ft) in list(dir.as_fd(), shown)? {
        if ft == FileType::Directory {
            remove_at(dir.as_fd(), &child, shown, depth + 1)?;
        } else {
            match rfs::unlinkat(&dir, child.as_slice(), AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(e) => return Err(io_fail("remove", shown, e)),
            }
        }
    }
    match rfs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(io_fail("remove directory", shown, e)),
    }
}
