//! Putting a machine's rendered host files in place and showing what that
//! would change: [`write`] (atomic per file, only what changed, stale files
//! of the machine's host-files dir removed, under an flock of that dir),
//! [`save_inputs`] (the config a slot was activated with), [`diff`] and
//! [`unified`] (for `plan`; a private file's change is only named).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use kubeslot_image::atomic::{self, AtomicError};

use crate::config::Config;
use crate::paths::{host, Root};
use crate::slot::Slot;

use super::{FileDiff, HostFiles, RenderError, RenderedFile, WriteOutcome};

impl From<AtomicError> for RenderError {
    fn from(e: AtomicError) -> Self {
        RenderError::Write {
            path: e.path,
            source: e.source,
        }
    }
}

fn write_err(path: &Path) -> impl FnOnce(std::io::Error) -> RenderError + '_ {
    move |source| RenderError::Write {
        path: path.to_path_buf(),
        source,
    }
}

/// The host-files dirs (relative) the rendered files live in.
fn host_file_dirs(files: &HostFiles) -> BTreeSet<PathBuf> {
    let base = Root::new("").join(host::HOST_FILES_DIR);
    files
        .files
        .iter()
        .filter_map(|f| f.path.parent())
        .filter(|p| p.parent() == Some(base.as_path()))
        .map(Path::to_path_buf)
        .collect()
}

/// Names in a host-files dir that no rendered file claims (including temp
/// files of a write that died).
fn stale_files(root: &Root, files: &HostFiles) -> Vec<PathBuf> {
    let wanted: BTreeSet<&Path> = files.files.iter().map(|f| f.path.as_path()).collect();
    let mut stale = Vec::new();
    // subdirectories too (certs.d/<registry>/): a registry dropped from the
    // config loses its files
    let mut pending: Vec<PathBuf> = host_file_dirs(files).into_iter().collect();
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(root.dir().join(&dir)) else {
            continue;
        };
        for e in entries.flatten() {
            let rel = dir.join(e.file_name());
            let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
            if is_dir {
                pending.push(rel);
            } else if !wanted.contains(rel.as_path()) {
                stale.push(rel);
            }
        }
    }
    stale.sort();
    stale
}

fn is_current(path: &Path, file: &RenderedFile) -> bool {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return false;
    };
    meta.is_file()
        && meta.permissions().mode() & 0o7777 == file.mode
        && std::fs::read(path).is_ok_and(|b| b == file.contents.as_bytes())
}

/// Writes the files that differ from what is on disk (content or mode), each
/// atomically, in path order (host files, then the `.nspawn` file, then the
/// units, so the drop-in never refers to a missing render unit), removes
/// stale files of the machine's host-files dir, and makes sure the node state
/// directories bound read-write exist.
pub fn write(root: &Root, files: &HostFiles) -> Result<WriteOutcome, RenderError> {
    let mut outcome = WriteOutcome::default();
    // Bind= sources must exist or the machine does not start.
    atomic::create_dir(&root.node_state().join("kubelet"), 0o700)?;
    atomic::create_dir(&root.node_state().join("containerd"), 0o711)?;
    // Held until the end: two renders of one machine (a manual run beside the
    // oneshot) take turns, so neither removes the other's temp file as stale.
    let mut _locks = Vec::new();
    for dir in host_file_dirs(files) {
        // holds the credential: root only, also when an older dir drifted
        let dir = root.dir().join(dir);
        atomic::create_dir(&dir, 0o700)?;
        let handle = std::fs::File::open(&dir).map_err(write_err(&dir))?;
        rustix::fs::flock(&handle, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| write_err(&dir)(e.into()))?;
        _locks.push(handle);
        if std::fs::metadata(&dir)
            .map_err(write_err(&dir))?
            .permissions()
            .mode()
            & 0o7777
            != 0o700
        {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
                .map_err(write_err(&dir))?;
        }
    }
    // The bundle's private copy before the .nspawn file that binds it; its
    // lock is held to the end, so gc never takes a copy not yet named.
    if let Some(copy) = &files.bundle {
        _locks.push(super::bundle::install(root, copy)?);
    }
    for file in &files.files {
        let path = root.dir().join(&file.path);
        if is_current(&path, file) {
            continue;
        }
        if let Some(parent) = path.parent() {
            atomic::create_dir(parent, 0o755)?;
        }
        atomic::write_file_mode(&path, file.contents.as_bytes(), file.mode)?;
        outcome.changed.push(file.path.clone());
    }
    let stale = stale_files(root, files);
    let mut dirs = BTreeSet::new();
    for rel in stale {
        let path = root.dir().join(&rel);
        std::fs::remove_file(&path).map_err(write_err(&path))?;
        if let Some(parent) = path.parent() {
            dirs.insert(parent.to_path_buf());
        }
        outcome.changed.push(rel);
    }
    for dir in dirs {
        // a directory of a dropped registry goes with its last file
        let empty = std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_none());
        if empty && std::fs::remove_dir(&dir).is_ok() {
            if let Some(parent) = dir.parent() {
                atomic::sync_dir(parent)?;
            }
            continue;
        }
        atomic::sync_dir(&dir)?;
    }
    let units = Root::new("").systemd_system_dir();
    outcome.dropin_changed = outcome.changed.iter().any(|p| p.starts_with(&units));
    Ok(outcome)
}

/// Records the config `slot` was activated with at
/// `/var/lib/kubeslot/slots/<machine>.json` (mode 0600: it holds the
/// credential), atomically. `render <machine>` prefers it over the current
/// config, so a machine (re)start never depends on a newer, possibly broken
/// config. Called by `activate` when it renders a slot.
pub fn save_inputs(root: &Root, slot: Slot, config: &Config) -> Result<PathBuf, RenderError> {
    let path = root.slot_inputs(slot.machine());
    if let Some(parent) = path.parent() {
        atomic::create_dir(parent, 0o700)?;
    }
    let mut bytes = serde_json::to_vec_pretty(config).expect("a config serialises");
    bytes.push(b'\n');
    atomic::write_file_mode(&path, &bytes, 0o600)?;
    Ok(path)
}

/// What a diff shows for a private (credential) file that changes.
pub const SECRET_CHANGED: &str = "secret changed";

/// What [`write`] would change: one entry per rendered file (diff `""` when
/// equal) and one per stale file it would remove. Files rendered private
/// (mode 0600: the kubelet's credential) are never shown: their diff says
/// [`SECRET_CHANGED`] and the size, so `plan`, `--dry-run` and `--json`
/// carry no token or credential env value.
pub fn diff(root: &Root, files: &HostFiles) -> Vec<FileDiff> {
    let mut out = Vec::new();
    for file in &files.files {
        let path = root.dir().join(&file.path);
        let old = std::fs::read_to_string(&path).ok();
        let old_mode = std::fs::symlink_metadata(&path)
            .ok()
            .map(|m| m.permissions().mode() & 0o7777);
        let shown = file.path.display().to_string();
        let from = if old.is_some() {
            format!("a/{shown}")
        } else {
            "/dev/null".to_string()
        };
        let same_text = old.as_deref() == Some(file.contents.as_str());
        let mut d = if file.mode & 0o077 != 0 {
            unified(
                old.as_deref().unwrap_or(""),
                &file.contents,
                &from,
                &format!("b/{shown}"),
            )
        } else if same_text {
            String::new()
        } else {
            // A private file holds a credential (the bootstrap token, the
            // exec credential's env): never shown, only that it changes.
            format!(
                "--- {from}\n+++ b/{shown}\n{SECRET_CHANGED} ({} bytes, mode {:04o}; contents not shown)\n",
                file.contents.len(),
                file.mode
            )
        };
        if let Some(m) = old_mode.filter(|m| *m != file.mode) {
            d.insert_str(0, &format!("mode {m:04o} -> {:04o} {shown}\n", file.mode));
        }
        out.push(FileDiff {
            path: file.path.clone(),
            diff: d,
        });
    }
    for rel in stale_files(root, files) {
        let full = root.dir().join(&rel);
        let shown = rel.display().to_string();
        let private =
            std::fs::symlink_metadata(&full).is_ok_and(|m| m.permissions().mode() & 0o077 == 0);
        if private {
            out.push(FileDiff {
                path: rel,
                diff: format!("--- a/{shown}\n+++ /dev/null\n{SECRET_CHANGED} (removed; contents not shown)\n"),
            });
            continue;
        }
        let old = std::fs::read_to_string(&full).unwrap_or_default();
        let mut d = unified(&old, "", &format!("a/{shown}"), "/dev/null");
        if d.is_empty() {
            d = format!("--- a/{shown}\n+++ /dev/null\n");
        }
        out.push(FileDiff { path: rel, diff: d });
    }
    out
}

/// A unified diff of two texts by lines (longest common subsequence; the
/// files are small), 3 lines of context; `""` when equal.
pub fn unified(old: &str, new: &str, old_name: &str, new_name: &str) -> String {
    if old == new {
        return String::new();
    }
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    // lcs[i][j]: length of the LCS of a[i..] and b[j..]
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    // the edit script: (tag, old index, new index, line)
    let mut ops: Vec<(char, usize, usize, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            ops.push((' ', i, j, a[i]));
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            ops.push(('-', i, j, a[i]));
            i += 1;
        } else {
            ops.push(('+', i, j, b[j]));
            j += 1;
        }
    }
    const CONTEXT: usize = 3;
    let changed: Vec<usize> = (0..ops.len()).filter(|&k| ops[k].0 != ' ').collect();
    let mut out = format!("--- {old_name}\n+++ {new_name}\n");
    if changed.is_empty() {
        // only a difference the line split hides (a missing final newline)
        out.push_str("\\ no newline at end of file\n");
        return out;
    }
    let mut k = 0;
    while k < changed.len() {
        let start = changed[k].saturating_sub(CONTEXT);
        let mut end = changed[k];
        while k < changed.len() && changed[k] <= end + 2 * CONTEXT + 1 {
            end = changed[k];
            k += 1;
        }
        let end = (end + CONTEXT + 1).min(ops.len());
        let hunk = &ops[start..end];
        let old_len = hunk.iter().filter(|o| o.0 != '+').count();
        let new_len = hunk.iter().filter(|o| o.0 != '-').count();
        let old_start = hunk[0].1 + usize::from(old_len > 0);
        let new_start = hunk[0].2 + usize::from(new_len > 0);
        let _ = writeln!(out, "@@ -{old_start},{old_len} +{new_start},{new_len} @@");
        for (tag, _, _, line) in hunk {
            let _ = writeln!(out, "{tag}{line}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unified_diff_shows_changes_with_context() {
        let old = "a\nb\nc\nd\ne\nf\ng\nh\n";
        let new = "a\nb\nc\nD\ne\nf\ng\nh\ni\n";
        let d = unified(old, new, "a/x", "b/x");
        assert_eq!(
            d,
            "--- a/x\n+++ b/x\n@@ -1,8 +1,9 @@\n a\n b\n c\n-d\n+D\n e\n f\n g\n h\n+i\n"
        );
        assert_eq!(unified(old, old, "a", "b"), "");
        let d = unified("", "x\n", "/dev/null", "b/x");
        assert_eq!(d, "--- /dev/null\n+++ b/x\n@@ -0,0 +1,1 @@\n+x\n");
    }

    #[test]
    fn far_apart_changes_make_two_hunks() {
        let old: String = (0..20).map(|i| format!("{i}\n")).collect();
        let new = old.replace("2\n", "two\n").replace("17\n", "seventeen\n");
        let d = unified(&old, &new, "a", "b");
        assert_eq!(d.matches("@@ -").count(), 2, "{d}");
        assert!(d.contains("-17\n+seventeen\n"), "{d}");
    }
}
