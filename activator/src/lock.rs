//! The activator's run lock: an exclusive `flock` on `/var/lib/kubeslot/lock`
//! held for a whole `activate`/`rollback`/`fetch`, so two runs never
//! interleave (a timer and the `.path` unit may fire together).
//!
//! The lock is root's alone: the state dir is 0700 and the lock file 0600,
//! opened `O_NOFOLLOW` (any user who could open it could `flock` it and
//! keep every run out, `wait` and the package's `prerm` with them). Taking
//! it narrows what an earlier version made wider: the state dir and lock
//! file, then the layer store, the slot dirs and `/var/lib/machines`.
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
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = root.lock_file();
    crate::paths::private_dir(&root.state_dir()).map_err(|e| LockError::Io {
        path: e.path,
        source: e.source,
    })?;
    let io = |source| LockError::Io {
        path: path.clone(),
        source,
    };
    // O_NOFOLLOW: a link put there is not followed to something else
    // to lock (or to create).
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc_nofollow())
        .open(&path)
        .map_err(io)?;
    // A lock file an earlier version made 0644 is narrowed: nobody but
    // root may open it, so nobody else can hold it.
    let mode = rustix::fs::fstat(&f).map_err(|e| io(e.into()))?.st_mode & 0o7777;
    if mode != 0o600 {
        rustix::fs::fchmod(&f, rustix::fs::Mode::from_raw_mode(0o600)).map_err(|e| io(e.into()))?;
    }
    Ok((f, path))
}

/// `O_NOFOLLOW` as `OpenOptionsExt::custom_flags` takes it.
fn libc_nofollow() -> i32 {
    rustix::fs::OFlags::NOFOLLOW.bits() as i32
}

/// The directories under the root that hold what only root may read or
/// write (layers with setuid programs and world-writable dirs, slot trees,
/// overlay uppers), narrowed to 0700 where an earlier version left them
/// wider; missing ones are left missing.
fn tighten(root: &Root) -> Result<(), LockError> {
    let slots = root.state_dir().join("slots");
    let mut dirs = vec![root.layers_dir(), root.machines_dir(), slots.clone()];
    dirs.extend(crate::slot::Slot::ALL.map(|s| root.slot_overlay_dir(s.machine())));
    for dir in dirs {
        if std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
            crate::paths::private_dir(&dir).map_err(|e| LockError::Io {
                path: e.path,
                source: e.source,
            })?;
        }
    }
    Ok(())
}

impl Lock {
    /// Takes the exclusive lock, failing at once when another run holds it.
    pub fn try_exclusive(root: &Root) -> Result<Lock, LockError> {
        let (f, path) = open(root)?;
        match flock(&f, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {
                let lock = Lock { file: f };
                tighten(root)?;
                Ok(lock)
            }
            Err(rustix::io::Errno::WOULDBLOCK) => Err(LockError::Busy { path }),
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
