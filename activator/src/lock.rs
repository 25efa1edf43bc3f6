//! The activator's run lock: an exclusive `flock` on `/var/lib/kubeslot/lock`
//! held for a whole `activate`/`rollback`/`fetch`, so two runs never
//! interleave (a timer and the `.path` unit may fire together).
//!
//! Given the root handle. It does not record who holds the lock (the kernel
//! drops a `flock` when its holder dies, so a crashed run never leaves a stale
//! lock behind; recovery is `activate`'s job, not the lock's).

use std::fs::{File, OpenOptions};
use std::path::PathBuf;

use rustix::fs::{flock, FlockOperation};

use crate::paths::Root;

/// A held lock; released on drop (or when the process dies).
#[derive(Debug)]
pub struct Lock {
    file: File,
}

impl Drop for Lock {
    /// Unlocks explicitly before the descriptor closes. A `flock` belongs to
    /// the open file description, and a child forked by another thread of
    /// this process (tests run flips side by side; each spawns `systemctl`)
    /// keeps a copy of the descriptor until its `exec` closes it: without
    /// the unlock the lock outlives this `Lock` for that moment, and a
    /// second run of the same process is refused as busy.
    fn drop(&mut self) {
        let _ = flock(&self.file, FlockOperation::Unlock);
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("lock {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "lock {path}: another kubeslot-activator run holds it (use `kubeslot-activator wait`)"
    )]
    Busy { path: PathBuf },
}

fn open(root: &Root) -> Result<(File, PathBuf), LockError> {
    let path = root.lock_file();
    let dir = root.state_dir();
    std::fs::create_dir_all(&dir).map_err(|source| LockError::Io {
        path: dir.clone(),
        source,
    })?;
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|source| LockError::Io {
            path: path.clone(),
            source,
        })?;
    Ok((f, path))
}

impl Lock {
    /// Takes the exclusive lock, failing at once when another run holds it.
    pub fn try_exclusive(root: &Root) -> Result<Lock, LockError> {
        let (f, path) = open(root)?;
        match flock(&f, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(Lock { file: f }),
            Err(rustix::io::Errno::WOULDBLOCK) => Err(LockError::Busy { path }),
            Err(e) => Err(LockError::Io {
                path,
                source: e.into(),
            }),
        }
    }

    /// Holds the lock shared when no run holds it; `None` while one does
    /// (`wait --provisioned` polls so, within its timeout).
    pub fn try_shared(root: &Root) -> Result<Option<Lock>, LockError> {
        let (f, path) = open(root)?;
        match flock(&f, FlockOperation::NonBlockingLockShared) {
            Ok(()) => Ok(Some(Lock { file: f })),
            Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
            Err(e) => Err(LockError::Io {
                path,
                source: e.into(),
            }),
        }
    }

    /// Blocks until no run holds the lock (for `wait`), then holds it shared.
    pub fn wait_shared(root: &Root) -> Result<Lock, LockError> {
        let (f, path) = open(root)?;
        flock(&f, FlockOperation::LockShared).map_err(|e| LockError::Io {
            path,
            source: e.into(),
        })?;
        Ok(Lock { file: f })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_exclusive_lock_is_refused_until_the_first_drops() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let a = Lock::try_exclusive(&root).unwrap();
        let e = Lock::try_exclusive(&root).unwrap_err().to_string();
        assert!(e.contains("another kubeslot-activator run"), "{e}");
        drop(a);
        Lock::try_exclusive(&root).unwrap();
    }
}
