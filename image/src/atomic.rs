//! Atomic file writes: the one implementation of "temp file in the same
//! directory, fsync, rename, fsync the directory" that every writer of
//! layouts, state, reports, locks and host files goes through.
//!
//! Given a path and the bytes (and, for private files, the exact mode), a
//! reader of `path` sees either the old file or the whole new one, also
//! after a crash or power loss at any point. A write that fails leaves no
//! temp file behind (tempfile removes it on drop). It does not lock: callers
//! that race on one path serialise themselves.

use std::fs::{self, DirBuilder, File, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A write, rename, sync or mkdir that failed, with the path it failed on.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct AtomicError {
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

fn err(path: &Path) -> impl FnOnce(io::Error) -> AtomicError + '_ {
    move |source| AtomicError {
        path: path.to_path_buf(),
        source,
    }
}

fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Writes a file others may read: mode 0644 narrowed by the umask (not
/// tempfile's private 0600), for layouts, archives, locks and reports.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<(), AtomicError> {
    let dir = parent_of(path);
    let tmp = tempfile::Builder::new()
        .prefix(".tmp-")
        .permissions(Permissions::from_mode(0o644))
        .tempfile_in(dir)
        .map_err(err(dir))?;
    finish(tmp, path, bytes)
}

/// Writes a file with exactly `mode` (the umask does not apply), set before
/// the first byte is written: a credential is never readable by others,
/// not even for a moment.
pub fn write_file_mode(path: &Path, bytes: &[u8], mode: u32) -> Result<(), AtomicError> {
    let dir = parent_of(path);
    let tmp = tempfile::Builder::new()
        .prefix(".tmp-")
        .tempfile_in(dir)
        .map_err(err(dir))?;
    tmp.as_file()
        .set_permissions(Permissions::from_mode(mode))
        .map_err(err(path))?;
    finish(tmp, path, bytes)
}

fn finish(mut tmp: tempfile::NamedTempFile, path: &Path, bytes: &[u8]) -> Result<(), AtomicError> {
    tmp.write_all(bytes).map_err(err(path))?;
    tmp.as_file().sync_all().map_err(err(path))?;
    tmp.persist(path).map_err(|e| err(path)(e.error))?;
    sync_dir(parent_of(path))
}

/// fsyncs a directory so that a rename or create inside it survives power
/// loss.
pub fn sync_dir(dir: &Path) -> Result<(), AtomicError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(err(dir))
}

/// Creates `dir` with exactly `mode` (missing parents get 0755), fsyncing
/// each parent that gained an entry. An existing `dir` is left as it is.
pub fn create_dir(dir: &Path, mode: u32) -> Result<(), AtomicError> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        if !parent.is_dir() {
            create_dir(parent, 0o755)?;
        }
    }
    match DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => return Err(err(dir)(e)),
    }
    // the umask may have narrowed the mode
    fs::set_permissions(dir, Permissions::from_mode(mode)).map_err(err(dir))?;
    sync_dir(parent_of(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn replaces_whole_files_and_leaves_no_temp() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        write_file(&p, b"one").unwrap();
        write_file(&p, b"two").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        let names: Vec<_> = fs::read_dir(d.path()).unwrap().flatten().collect();
        assert_eq!(names.len(), 1, "only the file itself: {names:?}");
    }

    #[test]
    fn private_files_get_exactly_their_mode() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("token");
        write_file_mode(&p, b"secret", 0o600).unwrap();
        assert_eq!(mode(&p), 0o600);
        write_file_mode(&p, b"public", 0o644).unwrap();
        assert_eq!(mode(&p), 0o644);
    }

    #[test]
    fn a_failed_write_names_the_path() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("missing-dir/f");
        let e = write_file(&p, b"x").unwrap_err();
        assert!(e.to_string().contains("missing-dir"), "{e}");
    }

    #[test]
    fn create_dir_sets_the_mode_and_makes_parents() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a/b/c");
        create_dir(&p, 0o700).unwrap();
        assert_eq!(mode(&p), 0o700);
        assert_eq!(mode(&d.path().join("a/b")), 0o755);
        create_dir(&p, 0o755).unwrap(); // existing: left alone
        assert_eq!(mode(&p), 0o700);
    }
}
