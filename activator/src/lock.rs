//! The activator's run lock: an exclusive `flock` on `/var/lib/kubeslot/lock`
//! held for a whole `activate`/`rollback`/`fetch`, so two runs never
//! interleave (a timer and the `.path` unit may fire together).
//!
//! The lock is root's alone: the state dir is 0700 and the lock file 0600,
//! opened `O_NOFOLLOW` (any user who could open it could `flock` it and
//! keep every run out, `wait` and the package's `prerm` with them). Taking
//! it replaces a lock file an earlier version made wider, or one not
//! root's (a chmod would leave a descriptor opened meanwhile working), and
//! narrows what else an earlier version made wider: the state dir, then
//! the layer store, the slot dirs and `/var/lib/machines`.
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
    let open = |create: bool| {
        OpenOptions::new()
            .create_new(create)
            .read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc_nofollow())
            .open(&path)
    };
    for _ in 0..8 {
        match open(false) {
            Ok(f) => {
                // A lock file an earlier version made 0644, or one that is
                // not root's, is replaced, never narrowed: a descriptor
                // another user opened while it was wider keeps working
                // after a chmod (and could hold the lock), while it stays
                // on the old file once that file is gone.
                let st = rustix::fs::fstat(&f).map_err(|e| io(e.into()))?;
                let regular = rustix::fs::FileType::from_raw_mode(st.st_mode)
                    == rustix::fs::FileType::RegularFile;
                if regular
                    && st.st_mode & 0o7777 == 0o600
                    && st.st_uid == rustix::process::geteuid().as_raw()
                {
                    return Ok((f, path));
                }
                // Unless a run of an earlier version holds it right now (a
                // root process: this run waits for it, or is busy, as on
                // any lock; the next run replaces the file).
                if held_only_by_root(&f, &st) {
                    return Ok((f, path));
                }
                drop(f);
                match std::fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io(e)),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => match open(true) {
                Ok(f) => {
                    // the umask may have narrowed it further
                    rustix::fs::fchmod(&f, rustix::fs::Mode::from_raw_mode(0o600))
                        .map_err(|e| io(e.into()))?;
                    return Ok((f, path));
                }
                // another run made it first: open that one
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io(e)),
            },
            Err(e) => return Err(io(e)),
        }
    }
    Err(io(std::io::Error::other(
        "replaced again and again while it was being opened",
    )))
}

/// Whether someone holds a `flock` on `f` (stat `st`) and every holder
/// `/proc/locks` names is a process of this user: an activator run, not
/// another user who opened the file while it was wider.
fn held_only_by_root(f: &File, st: &rustix::fs::Stat) -> bool {
    if flock(f, FlockOperation::NonBlockingLockExclusive).is_ok() {
        let _ = flock(f, FlockOperation::Unlock);
        return false;
    }
    let me = rustix::process::geteuid().as_raw();
    let id = format!(
        "{:02x}:{:02x}:{}",
        rustix::fs::major(st.st_dev),
        rustix::fs::minor(st.st_dev),
        st.st_ino
    );
    let Ok(locks) = std::fs::read_to_string("/proc/locks") else {
        return false;
    };
    let mut holders = locks
        .lines()
        .filter(|l| !l.contains("->") && l.split_whitespace().any(|f| f == id))
        .filter_map(|l| l.split_whitespace().find_map(|f| f.parse::<u32>().ok()))
        .peekable();
    holders.peek().is_some()
        && holders.all(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Uid:"))
                    .and_then(|u| u.split_whitespace().nth(1))
                    .and_then(|u| u.parse::<u32>().ok())
                    == Some(me)
            })
        })
}

/// Whether `f` (locked) is still the file at `path`: a run that replaced
/// a too-wide lock file between our open and our `flock` left us holding
/// the old one, which locks nothing.
fn still_there(f: &File, path: &std::path::Path) -> bool {
    let (Ok(a), Ok(b)) = (rustix::fs::fstat(f), rustix::fs::lstat(path)) else {
        return false;
    };
    (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
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

/// Opens the lock file and applies `op` to it, again when a run replaced
/// the file meanwhile: `Ok(None)` when another run holds it (a
/// non-blocking `op`).
fn take(root: &Root, op: FlockOperation) -> Result<Option<Lock>, LockError> {
    loop {
        let (f, path) = open(root)?;
        match flock(&f, op) {
            Ok(()) if still_there(&f, &path) => return Ok(Some(Lock { file: f })),
            Ok(()) => continue,
            Err(rustix::io::Errno::WOULDBLOCK) => return Ok(None),
            Err(e) => {
                return Err(LockError::Io {
                    path,
                    source: e.into(),
                })
            }
        }
    }
}

impl Lock {
    /// Takes the exclusive lock, failing at once when another run holds it.
    pub fn try_exclusive(root: &Root) -> Result<Lock, LockError> {
        match take(root, FlockOperation::NonBlockingLockExclusive)? {
            Some(lock) => {
                tighten(root)?;
                Ok(lock)
            }
            None => Err(LockError::Busy {
                path: root.lock_file(),
            }),
        }
    }

    /// Holds the lock shared when no run holds it; `None` while one does
    /// (`wait --provisioned` polls so, within its timeout).
    pub fn try_shared(root: &Root) -> Result<Option<Lock>, LockError> {
        take(root, FlockOperation::NonBlockingLockShared)
    }

    /// Blocks until no run holds the lock (for `wait`), then holds it shared.
    pub fn wait_shared(root: &Root) -> Result<Lock, LockError> {
        Ok(take(root, FlockOperation::LockShared)?.expect("a blocking flock"))
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
