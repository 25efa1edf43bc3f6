//! What the activator takes on trust from the host's files and paths
//! (issue 40 item 6): the files that decide what runs (the config, the
//! kubelet's extra arguments, signing keys, the keyless trusted root, CA
//! and password files) must be root's and writable by nobody else, and so
//! must every directory above them (another user who may write any of them
//! could swap the file); a host path bound into a node machine
//! (`extra_mounts`, `images.bundle_dir`) is walked component by component
//! without following a link (nspawn would follow it, and a link can point
//! at kubeslot's own state), every directory on the way root's.
//!
//! Given host paths (under the root handle where the caller joins them).
//! Reads metadata only.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Component, Path, PathBuf};

/// A file or path the activator refuses to trust: which, why, and the fix.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct Untrusted {
    pub path: PathBuf,
    pub reason: String,
}

/// The owner the activator trusts: root (or the user it runs as, for a
/// run that is not root's, such as a developer's `render`).
fn trusted_owner(uid: u32) -> bool {
    uid == 0 || uid == rustix::process::geteuid().as_raw()
}

/// Why a directory on a trusted file's path is not trusted: not root's, or
/// writable by group or others without the sticky bit (`/tmp` is fine: no
/// one else may rename what root has there).
fn dir_problem(path: &Path, m: &std::fs::Metadata) -> Option<String> {
    let mode = m.mode() & 0o7777;
    if !trusted_owner(m.uid()) {
        return Some(format!(
            "directory owned by uid {}, not root: another user could replace what lies below it (fix: chown root:root {})",
            m.uid(),
            path.display()
        ));
    }
    if mode & 0o022 != 0 && mode & 0o1000 == 0 {
        return Some(format!(
            "directory mode {mode:04o} is group/world-writable: another user could replace what lies below it (fix: chmod go-w {})",
            path.display()
        ));
    }
    None
}

/// Checks `path` and every directory above it: each a directory that is
/// root's and not writable by others ([`dir_problem`]); a link on the way
/// is followed (its own directory was checked) and its target's path is
/// checked the same way.
fn check_dirs(path: &Path, what: &str) -> Result<(), Untrusted> {
    let untrusted = |p: &Path, reason: String| Untrusted {
        path: p.to_path_buf(),
        reason: format!("{reason} (kubeslot trusts it as {what})"),
    };
    let mut at = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::RootDir | Component::CurDir => continue,
            Component::ParentDir => {
                at.pop();
                continue;
            }
            Component::Normal(n) => at.push(n),
            Component::Prefix(_) => continue,
        }
        let m = std::fs::symlink_metadata(&at).map_err(|e| untrusted(&at, e.to_string()))?;
        if m.file_type().is_symlink() {
            let real = std::fs::canonicalize(&at).map_err(|e| untrusted(&at, e.to_string()))?;
            check_dirs(&real, what)?;
            at = real;
            continue;
        }
        if m.is_dir() {
            if let Some(why) = dir_problem(&at, &m) {
                return Err(untrusted(&at, why));
            }
        }
    }
    Ok(())
}

/// Checks a file the activator trusts (`what`: "the config", "a signing
/// key", ...): a regular file, root's, not group/world-writable, in
/// directories that are root's and not writable by others. A relative
/// path is taken from the working directory. A missing file passes: the
/// caller's read names it, as it always did.
pub fn check_file(path: &Path, what: &str) -> Result<(), Untrusted> {
    if std::fs::metadata(path).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
        return Ok(());
    }
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| Untrusted {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })?
            .join(path)
    };
    let parent = abs.parent().unwrap_or(Path::new("/"));
    check_dirs(parent, what)?;
    let m = std::fs::metadata(&abs).map_err(|e| Untrusted {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let mode = m.mode() & 0o7777;
    let reason = if !m.is_file() {
        "not a regular file".to_string()
    } else if !trusted_owner(m.uid()) {
        format!(
            "owned by uid {}, not root, so its owner decides what kubeslot does (fix: chown root:root {})",
            m.uid(),
            path.display()
        )
    } else if mode & 0o022 != 0 {
        format!(
            "mode {mode:04o} is group/world-writable, so anyone in them decides what kubeslot does (fix: chmod go-w {})",
            path.display()
        )
    } else {
        return Ok(());
    };
    Err(Untrusted {
        path: path.to_path_buf(),
        reason: format!("{reason} (kubeslot trusts it as {what})"),
    })
}

/// Walks host path `path` (absolute, joined under the root by the caller:
/// `host` is how errors show it) component by component without following
/// a link: every component below `base` (the root handle's directory) must
/// exist and be no link, and every directory above the last component must
/// be root's and not writable by others, so the path nspawn binds is the
/// path the config names and no other user can change where it leads. The
/// last component may be anyone's (a data directory's owner writes its
/// contents, not where it is). A missing component passes: the caller
/// names what is missing.
pub fn check_bind_source(base: &Path, host: &Path, field: &str) -> Result<(), Untrusted> {
    let untrusted = |p: &Path, reason: String| Untrusted {
        path: p.to_path_buf(),
        reason: format!("{reason} ({field} binds it into the node machine)"),
    };
    let names: Vec<_> = host
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    let mut at = base.to_path_buf();
    let mut shown = PathBuf::from("/");
    for (i, n) in names.iter().enumerate() {
        at.push(n);
        shown.push(n);
        let m = match std::fs::symlink_metadata(&at) {
            Ok(m) => m,
            // what is missing the caller names (nspawn needs it)
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(untrusted(&shown, e.to_string())),
        };
        if m.file_type().is_symlink() {
            let target = std::fs::read_link(&at)
                .map(|t| t.display().to_string())
                .unwrap_or_default();
            return Err(untrusted(
                &shown,
                format!(
                    "is a symbolic link (to {target}): a bind source is never reached through a link; name the real path"
                ),
            ));
        }
        if i + 1 < names.len() {
            if !m.is_dir() {
                return Err(untrusted(&shown, "is not a directory".into()));
            }
            if let Some(why) = dir_problem(&shown, &m) {
                return Err(untrusted(&shown, why));
            }
        }
    }
    Ok(())
}
