//! Removing a directory tree a node machine wrote, whatever its depth.
//!
//! `std::fs::remove_dir_all` keeps one open directory per level, so a node
//! that writes a tree deeper than the process's open-file limit makes
//! every later removal of that tree fail (EMFILE). [`remove_tree`] holds
//! at most three descriptors at any depth: it walks down by `openat` of a
//! child and back up by `openat(..)`, checking that the parent it comes back
//! to is the directory it left (device and inode), and keeps only names in
//! memory. Nothing is followed: symlinks are unlinked as entries, children
//! are opened with `O_NOFOLLOW | O_DIRECTORY`.
//!
//! It owns no policy about *what* to remove; callers (staging, slot trees,
//! overlay uppers, layers, uninstall) decide, and report its errors.

use std::ffi::CString;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, CWD};

/// Why a tree could not be removed: the path of the entry and the error.
#[derive(Debug, thiserror::Error)]
#[error("removing {path}: {error}")]
pub struct RemoveError {
    pub path: PathBuf,
    pub error: io::Error,
}

impl RemoveError {
    /// As an `io::Error` whose message names the entry (for callers whose
    /// error names the tree).
    pub fn into_io(self) -> io::Error {
        io::Error::new(
            self.error.kind(),
            format!("{}: {}", self.path.display(), self.error),
        )
    }
}

/// One directory on the way down: its name in its parent, the parent's
/// identity (checked when coming back up), and the parent's subdirectories
/// still to remove.
struct Level {
    name: CString,
    parent: (u64, u64),
    pending: Vec<CString>,
}

/// Removes `path` and everything under it (a file or symlink is unlinked);
/// a missing `path` is not an error.
pub fn remove_tree(path: &Path) -> Result<(), RemoveError> {
    let err = |p: PathBuf| {
        move |e: rustix::io::Errno| RemoveError {
            path: p,
            error: e.into(),
        }
    };
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(error) => {
            return Err(RemoveError {
                path: path.into(),
                error,
            })
        }
        Ok(m) if !m.is_dir() => {
            return std::fs::remove_file(path).map_err(|error| RemoveError {
                path: path.into(),
                error,
            })
        }
        Ok(_) => {}
    }
    let mut fd = open_dir(&CWD, path.as_os_str().as_bytes()).map_err(err(path.into()))?;
    let mut levels: Vec<Level> = Vec::new();
    let shown = |levels: &[Level], leaf: Option<&CString>| {
        let mut p = path.to_path_buf();
        for l in levels {
            p.push(std::ffi::OsStr::from_bytes(l.name.as_bytes()));
        }
        if let Some(n) = leaf {
            p.push(std::ffi::OsStr::from_bytes(n.as_bytes()));
        }
        p
    };
    let mut pending = empty_files(&fd).map_err(|(n, e)| err(shown(&levels, n.as_ref()))(e))?;
    loop {
        if let Some(child) = pending.pop() {
            let parent = id(&fd).map_err(err(shown(&levels, None)))?;
            let cfd = open_dir(&fd, child.as_bytes()).map_err(err(shown(&levels, Some(&child))))?;
            levels.push(Level {
                name: child,
                parent,
                pending,
            });
            fd = cfd;
            pending = empty_files(&fd).map_err(|(n, e)| err(shown(&levels, n.as_ref()))(e))?;
            continue;
        }
        let Some(level) = levels.pop() else {
            drop(fd);
            return rustix::fs::unlinkat(CWD, path, AtFlags::REMOVEDIR).map_err(err(path.into()));
        };
        let here = shown(&levels, Some(&level.name));
        let pfd = open_dir(&fd, b"..").map_err(err(here.clone()))?;
        if id(&pfd).map_err(err(here.clone()))? != level.parent {
            return Err(RemoveError {
                path: here,
                error: io::Error::other("its parent changed while the tree was being removed"),
            });
        }
        drop(fd);
        rustix::fs::unlinkat(&pfd, level.name.as_c_str(), AtFlags::REMOVEDIR).map_err(err(here))?;
        fd = pfd;
        pending = level.pending;
    }
}

fn open_dir(at: &impl std::os::fd::AsFd, name: &[u8]) -> rustix::io::Result<OwnedFd> {
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

/// Unlinks every non-directory entry of `fd`; returns the names of its
/// subdirectories. An error names the entry it was about, if any.
#[allow(clippy::type_complexity)]
fn empty_files(fd: &OwnedFd) -> Result<Vec<CString>, (Option<CString>, rustix::io::Errno)> {
    let mut dirs = Vec::new();
    let mut dir = Dir::read_from(fd).map_err(|e| (None, e))?;
    while let Some(entry) = dir.read() {
        let entry = entry.map_err(|e| (None, e))?;
        let name = entry.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        let name = name.to_owned();
        let kind = match entry.file_type() {
            FileType::Unknown => rustix::fs::statat(fd, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)
                .map(|st| FileType::from_raw_mode(st.st_mode))
                .map_err(|e| (Some(name.clone()), e))?,
            t => t,
        };
        if kind == FileType::Directory {
            dirs.push(name);
        } else {
            rustix::fs::unlinkat(fd, name.as_c_str(), AtFlags::empty())
                .map_err(|e| (Some(name.clone()), e))?;
        }
    }
    Ok(dirs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn removes_files_links_and_nested_dirs_without_following_links() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), b"x").unwrap();
        let tree = t.path().join("tree");
        std::fs::create_dir_all(tree.join("a/b/c")).unwrap();
        std::fs::write(tree.join("a/b/c/f"), b"1").unwrap();
        std::fs::write(tree.join("top"), b"2").unwrap();
        symlink(&outside, tree.join("a/link-to-outside")).unwrap();
        symlink("/", tree.join("a/b/root")).unwrap();
        for i in 0..50 {
            std::fs::create_dir_all(tree.join(format!("many/d{i}/e"))).unwrap();
        }
        remove_tree(&tree).unwrap();
        assert!(!tree.exists());
        assert_eq!(std::fs::read(outside.join("keep")).unwrap(), b"x");
        // missing is fine; a file is unlinked
        remove_tree(&tree).unwrap();
        std::fs::write(&tree, b"f").unwrap();
        remove_tree(&tree).unwrap();
        assert!(!tree.exists());
    }

    #[test]
    fn a_tree_deeper_than_the_fd_limit_is_removed() {
        // 1,100 levels: std's remove_dir_all would hold 1,100 descriptors.
        let t = tempfile::tempdir().unwrap();
        let tree = t.path().join("deep");
        kubeslot_test_support::host::deep_tree(&tree, 1100);
        // (the descriptor bound itself is tested under RLIMIT_NOFILE 1024 in
        // activator/tests/host.rs: this process's fd count moves with the
        // other tests' threads)
        remove_tree(&tree).unwrap();
        assert!(!tree.exists());
    }

    #[test]
    fn an_error_names_the_path() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("f"), b"1").unwrap();
        // a path through a file: ENOTDIR, reported with the path
        let e = remove_tree(&t.path().join("f/nope")).unwrap_err();
        assert!(e.to_string().contains("f/nope"), "{e}");
    }
}
