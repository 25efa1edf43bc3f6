//! Removing a directory tree a node machine wrote, whatever its depth.
//!
//! `std::fs::remove_dir_all` keeps one open directory per level, so a node
//! that writes a tree deeper than the process's open-file limit makes
//! every later removal of that tree fail (EMFILE). [`remove_tree`] walks it
//! with [`crate::walk`] (at most three descriptors at any depth, nothing
//! followed, every name relative to an open directory): non-directories
//! are unlinked as they are met, each directory once it is empty.
//!
//! It owns no policy about *what* to remove; callers (staging, slot trees,
//! overlay uppers, layers, uninstall) decide, and report its errors.

use std::ffi::CStr;
use std::io;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, CWD};

use crate::walk::{self, Entry, Visit};

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

/// Unlinks files as they are met and directories once they are empty.
struct Remover;

impl Visit for Remover {
    fn entry(&mut self, e: &Entry) -> io::Result<bool> {
        if e.is_dir() {
            return Ok(true);
        }
        rustix::fs::unlinkat(e.dir, e.name, AtFlags::empty())?;
        Ok(false)
    }

    fn leave(&mut self, parent: BorrowedFd, name: &CStr, _rel: &[u8]) -> io::Result<()> {
        Ok(rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR)?)
    }
}

/// Removes `path` and everything under it (a file or symlink is unlinked);
/// a missing `path` is not an error.
pub fn remove_tree(path: &Path) -> Result<(), RemoveError> {
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
    walk::walk(path, &mut Remover).map_err(|e| RemoveError {
        path: e.path,
        error: e.error,
    })?;
    rustix::fs::unlinkat(CWD, path, AtFlags::REMOVEDIR).map_err(|e| RemoveError {
        path: path.into(),
        error: e.into(),
    })
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
        // activator/tests/host/activate.rs: this process's fd count moves with the
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
