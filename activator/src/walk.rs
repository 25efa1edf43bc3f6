//! The walk over a directory tree a node machine may have written, whatever
//! its depth and however long its paths.
//!
//! `std::fs::read_dir` recursion keeps one open directory per level and
//! names entries by their full path: a node that writes a tree deeper than
//! the open-file limit, or a chain of long names past `PATH_MAX` (4096
//! bytes), makes such a walk fail (EMFILE, "File name too long"), and every
//! check built on it with it. [`walk`] holds at most three descriptors at
//! any depth: it goes down by `openat` of a child (`O_NOFOLLOW |
//! O_DIRECTORY`) and back up by `openat(..)`, checking that the parent it
//! comes back to is the directory it left (device and inode), and keeps
//! only names in memory; every syscall is relative to a directory
//! descriptor, so no path it builds is ever resolved. Nothing is followed.
//!
//! It owns the traversal only: a [`Visit`] decides what to do with each
//! entry (record it, count it, unlink it) and whether to go into a
//! directory. Used by `remove` (tree removal), `integrity` (records and
//! their checks) and `fingerprint` (the rollback mark).

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Dir, Mode, OFlags, Stat, CWD};

/// Why a walk stopped: the entry it was at (the root joined with the
/// relative path; shown, never opened) and the error.
#[derive(Debug, thiserror::Error)]
#[error("{}: {error}", path.display())]
pub struct WalkError {
    pub path: PathBuf,
    pub error: io::Error,
}

impl WalkError {
    /// As an `io::Error` whose message names the entry.
    pub fn into_io(self) -> io::Error {
        io::Error::new(
            self.error.kind(),
            format!("{}: {}", self.path.display(), self.error),
        )
    }
}

/// One entry below the walk's root.
pub struct Entry<'a> {
    /// The directory that holds it (open for the duration of the call).
    pub dir: BorrowedFd<'a>,
    /// Its name in `dir`.
    pub name: &'a CStr,
    /// Its path relative to the walk's root (no leading `/`).
    pub rel: &'a [u8],
    /// `lstat` of it (a symlink is not followed).
    pub stat: &'a Stat,
}

impl Entry<'_> {
    pub fn is_dir(&self) -> bool {
        rustix::fs::FileType::from_raw_mode(self.stat.st_mode) == rustix::fs::FileType::Directory
    }
}

/// What a walk does with what it finds.
pub trait Visit {
    /// Every entry below the root, a directory before its contents. For a
    /// directory, `Ok(true)` walks into it.
    fn entry(&mut self, entry: &Entry) -> io::Result<bool>;

    /// After everything below the directory `name` (at `rel`) was visited,
    /// with its parent open: where a removal unlinks it.
    fn leave(&mut self, _parent: BorrowedFd, _name: &CStr, _rel: &[u8]) -> io::Result<()> {
        Ok(())
    }
}

/// One directory on the way down: its name in its parent, the parent's
/// identity (checked when coming back up), the parent's subdirectories
/// still to walk, and where its name starts in the relative path.
struct Level {
    name: CString,
    parent: (u64, u64),
    pending: Vec<CString>,
    rel_len: usize,
}

/// Walks everything below the directory `root` (not `root` itself) with
/// `visit`. `root` must be a directory, not a link to one.
pub fn walk(root: &Path, visit: &mut impl Visit) -> Result<(), WalkError> {
    let shown = |rel: &[u8]| {
        if rel.is_empty() {
            root.to_path_buf()
        } else {
            root.join(std::ffi::OsStr::from_bytes(rel))
        }
    };
    let fail = |rel: &[u8], error: io::Error| WalkError {
        path: shown(rel),
        error,
    };
    let mut fd = open_dir(CWD, root.as_os_str().as_bytes()).map_err(|e| fail(b"", e.into()))?;
    let mut levels: Vec<Level> = Vec::new();
    let mut rel: Vec<u8> = Vec::new();
    let mut pending = visit_dir(&fd, &mut rel, visit).map_err(|(r, e)| fail(&r, e))?;
    loop {
        if let Some(child) = pending.pop() {
            let parent = id(&fd).map_err(|e| fail(&rel, e.into()))?;
            let rel_len = rel.len();
            push_name(&mut rel, &child);
            let cfd = open_dir(&fd, child.as_bytes()).map_err(|e| fail(&rel, e.into()))?;
            levels.push(Level {
                name: child,
                parent,
                pending,
                rel_len,
            });
            fd = cfd;
            pending = visit_dir(&fd, &mut rel, visit).map_err(|(r, e)| fail(&r, e))?;
            continue;
        }
        let Some(level) = levels.pop() else {
            return Ok(());
        };
        let pfd = open_dir(&fd, b"..").map_err(|e| fail(&rel, e.into()))?;
        if id(&pfd).map_err(|e| fail(&rel, e.into()))? != level.parent {
            return Err(fail(
                &rel,
                io::Error::other("its parent changed during the walk"),
            ));
        }
        drop(fd);
        visit
            .leave(pfd.as_fd(), &level.name, &rel)
            .map_err(|e| fail(&rel, e))?;
        rel.truncate(level.rel_len);
        fd = pfd;
        pending = level.pending;
    }
}

fn push_name(rel: &mut Vec<u8>, name: &CStr) {
    if !rel.is_empty() {
        rel.push(b'/');
    }
    rel.extend_from_slice(name.to_bytes());
}

/// Visits every entry of the open directory `fd` (at `rel`); returns the
/// subdirectories to walk into. The names are read first, so a visitor may
/// unlink what it is shown. An error carries the path it was about.
fn visit_dir(
    fd: &OwnedFd,
    rel: &mut Vec<u8>,
    visit: &mut impl Visit,
) -> Result<Vec<CString>, (Vec<u8>, io::Error)> {
    let here = rel.clone();
    let mut names = Vec::new();
    let mut dir = Dir::read_from(fd).map_err(|e| (here.clone(), e.into()))?;
    while let Some(entry) = dir.read() {
        let entry = entry.map_err(|e| (here.clone(), e.into()))?;
        let name = entry.file_name();
        if name.to_bytes() != b"." && name.to_bytes() != b".." {
            names.push(name.to_owned());
        }
    }
    drop(dir);
    let mut dirs = Vec::new();
    for name in names {
        let len = rel.len();
        push_name(rel, &name);
        let result = (|| {
            let stat = rustix::fs::statat(fd, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)?;
            let entry = Entry {
                dir: fd.as_fd(),
                name: &name,
                rel,
                stat: &stat,
            };
            let descend = visit.entry(&entry)? && entry.is_dir();
            Ok::<_, io::Error>(descend)
        })();
        match result {
            Ok(true) => dirs.push(name),
            Ok(false) => {}
            // a name gone between listing and stat (only a removal
            // racing with a writer) is not an entry any more
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NOENT.raw_os_error()) => {}
            Err(e) => return Err((rel.clone(), e)),
        }
        rel.truncate(len);
    }
    Ok(dirs)
}

/// Opens the directory `name` under `at`, following nothing.
pub fn open_dir(at: impl AsFd, name: &[u8]) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat(
        at,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

fn id(fd: &OwnedFd) -> rustix::io::Result<(u64, u64)> {
    let st = rustix::fs::fstat(fd)?;
    Ok((st.st_dev, st.st_ino))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Collects every entry's relative path.
    struct Paths(Vec<String>);
    impl Visit for Paths {
        fn entry(&mut self, e: &Entry) -> io::Result<bool> {
            self.0.push(String::from_utf8_lossy(e.rel).into_owned());
            Ok(true)
        }
    }

    #[test]
    fn every_entry_once_with_its_relative_path_and_links_not_followed() {
        let t = tempfile::tempdir().unwrap();
        let tree = t.path().join("tree");
        std::fs::create_dir_all(tree.join("a/b")).unwrap();
        std::fs::write(tree.join("a/b/f"), b"1").unwrap();
        std::fs::create_dir(t.path().join("outside")).unwrap();
        std::fs::write(t.path().join("outside/secret"), b"x").unwrap();
        std::os::unix::fs::symlink(t.path().join("outside"), tree.join("a/link")).unwrap();
        let mut p = Paths(Vec::new());
        walk(&tree, &mut p).unwrap();
        p.0.sort();
        assert_eq!(p.0, ["a", "a/b", "a/b/f", "a/link"]);
    }

    #[test]
    fn a_chain_of_names_longer_than_path_max_is_walked() {
        // 25 levels of 200-byte names: 5,025 bytes, past PATH_MAX.
        let t = tempfile::tempdir().unwrap();
        let tree = t.path().join("tree");
        std::fs::create_dir(&tree).unwrap();
        let long = "d".repeat(200);
        let mut fd = open_dir(CWD, tree.as_os_str().as_bytes()).unwrap();
        for _ in 0..25 {
            rustix::fs::mkdirat(&fd, long.as_str(), Mode::from_raw_mode(0o755)).unwrap();
            fd = open_dir(&fd, long.as_bytes()).unwrap();
        }
        let mut p = Paths(Vec::new());
        walk(&tree, &mut p).unwrap();
        assert_eq!(p.0.len(), 25);
        assert_eq!(p.0.last().unwrap().len(), 25 * 200 + 24);
    }
}
