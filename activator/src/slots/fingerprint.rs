//! A slot tree's cheap fingerprint: the image digest plus the number of
//! entries and the total size of its regular files, kept in
//! `/var/lib/kubeslot/slots/<machine>.tree`.
//!
//! Given the root handle and a machine; [`count`] walks a tree without
//! following symlinks, [`record`] writes the mark atomically and [`check`]
//! recounts and compares. The flip engine records the mark of the slot it
//! commits away from (that machine was just stopped, so its tree is frozen
//! until a rollback starts it again: what a running node wrote to its own
//! tree is counted in), again when a failed rollback stops it (it ran, and
//! stays the previous slot), and `rollback` refuses a slot whose mark is missing,
//! names another image, or does not match a recount.
//!
//! It is deliberately not a content hash: it catches deleted, added or
//! truncated files and a tree swapped for another image, cheaply (one
//! `lstat` per entry), not a same-size edit; the tree was verified when it
//! was unpacked and nothing else writes it.

use std::fs;
use std::path::{Path, PathBuf};

use kubeslot_image::atomic::{self, AtomicError};
use kubeslot_image::digest::Digest;
use serde::{Deserialize, Serialize};

use crate::paths::Root;
use crate::walk::{self, Visit};

/// What a mark records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TreeMark {
    /// The image the tree was unpacked from (absent for a tree `adopt`
    /// took over: it came from no image).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<Digest>,
    /// Every entry below the tree's root (directories, files, links, ...).
    pub entries: u64,
    /// The sum of the sizes of its regular files.
    pub bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum FingerprintError {
    #[error("tree {path}: {source}")]
    Walk {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("tree mark: {0}")]
    Write(#[source] AtomicError),
    #[error("tree mark {path} is missing (the slot was never committed away from by this activator, or the mark was removed)")]
    Missing { path: PathBuf },
    #[error("tree mark {path}: unreadable or invalid: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error(
        "tree mark {path} names {}, but the state says the slot holds {}",
        image_name(marked),
        image_name(expected)
    )]
    OtherImage {
        path: PathBuf,
        marked: Option<Digest>,
        expected: Option<Digest>,
    },
    #[error("{tree} has {entries} entries and {bytes} bytes, but {path} recorded {marked_entries} entries and {marked_bytes} bytes when it was last stopped (changed since; activate the image again instead)")]
    Changed {
        tree: PathBuf,
        path: PathBuf,
        entries: u64,
        bytes: u64,
        marked_entries: u64,
        marked_bytes: u64,
    },
}

/// Counts the entries and regular-file bytes below `tree`, without
/// following symlinks (a link counts as one entry; its target is not
/// visited), at any depth and path length ([`crate::walk`]). Hardlinked
/// files count once per name.
pub fn count(tree: &Path) -> Result<(u64, u64), FingerprintError> {
    struct Counter(u64, u64);
    impl Visit for Counter {
        fn entry(&mut self, e: &walk::Entry) -> std::io::Result<bool> {
            self.0 += 1;
            if rustix::fs::FileType::from_raw_mode(e.stat.st_mode)
                == rustix::fs::FileType::RegularFile
            {
                self.1 += e.stat.st_size as u64;
            }
            Ok(true)
        }
    }
    let mut c = Counter(0, 0);
    walk::walk(tree, &mut c).map_err(|e| FingerprintError::Walk {
        path: e.path,
        source: e.error,
    })?;
    Ok((c.0, c.1))
}

/// How a mark's image reads in messages.
fn image_name(digest: &Option<Digest>) -> String {
    digest.map_or_else(
        || "an adopted tree (no image)".to_string(),
        |d| format!("image {d}"),
    )
}

/// Counts `machine`'s tree and records it as holding `digest` (`None`: an
/// adopted tree).
pub fn record(
    root: &Root,
    machine: &str,
    digest: Option<Digest>,
) -> Result<TreeMark, FingerprintError> {
    let (entries, bytes) = count(&root.machine_tree(machine))?;
    let mark = TreeMark {
        digest,
        entries,
        bytes,
    };
    let path = root.slot_tree_mark(machine);
    let mut text = serde_json::to_vec_pretty(&mark).expect("mark serialises");
    text.push(b'\n');
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(|source| FingerprintError::Walk {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    atomic::write_file(&path, &text).map_err(FingerprintError::Write)?;
    Ok(mark)
}

/// Reads `machine`'s mark, if any.
pub fn load(root: &Root, machine: &str) -> Result<Option<TreeMark>, FingerprintError> {
    let path = root.slot_tree_mark(machine);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(FingerprintError::Invalid {
                path,
                reason: e.to_string(),
            })
        }
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| FingerprintError::Invalid {
            path,
            reason: e.to_string(),
        })
}

/// Checks that `machine`'s tree still is what its mark recorded for
/// `digest`: the mark exists, names `digest`, and a recount agrees.
pub fn check(
    root: &Root,
    machine: &str,
    digest: Option<Digest>,
) -> Result<TreeMark, FingerprintError> {
    let path = root.slot_tree_mark(machine);
    let mark = load(root, machine)?.ok_or(FingerprintError::Missing { path: path.clone() })?;
    if mark.digest != digest {
        return Err(FingerprintError::OtherImage {
            path,
            marked: mark.digest,
            expected: digest,
        });
    }
    let tree = root.machine_tree(machine);
    let (entries, bytes) = count(&tree)?;
    if (entries, bytes) != (mark.entries, mark.bytes) {
        return Err(FingerprintError::Changed {
            tree,
            path,
            entries,
            bytes,
            marked_entries: mark.entries,
            marked_bytes: mark.bytes,
        });
    }
    Ok(mark)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(root: &Root) -> PathBuf {
        let t = root.machine_tree("kube1");
        fs::create_dir_all(t.join("etc/sub")).unwrap();
        fs::write(t.join("etc/a"), b"12345").unwrap();
        fs::write(t.join("etc/sub/b"), b"xy").unwrap();
        std::os::unix::fs::symlink("/nonexistent/target", t.join("link")).unwrap();
        t
    }

    #[test]
    fn a_recount_matches_until_the_tree_changes() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let t = tree(&root);
        let image = Digest::of(b"image");
        let d = Some(image);
        // etc, etc/sub, etc/a, etc/sub/b, link; the link is not followed
        assert_eq!(count(&t).unwrap(), (5, 7));
        let e = check(&root, "kube1", d).unwrap_err().to_string();
        assert!(e.contains("kube1.tree") && e.contains("missing"), "{e}");

        assert_eq!(record(&root, "kube1", d).unwrap().entries, 5);
        check(&root, "kube1", d).unwrap();
        let e = check(&root, "kube1", Some(Digest::of(b"other")))
            .unwrap_err()
            .to_string();
        assert!(e.contains(&image.to_string()), "{e}");
        let e = check(&root, "kube1", None).unwrap_err().to_string();
        assert!(e.contains("adopted tree"), "{e}");

        // a truncated file
        fs::write(t.join("etc/a"), b"1234").unwrap();
        let e = check(&root, "kube1", d).unwrap_err().to_string();
        assert!(
            e.contains("5 entries and 6 bytes") && e.contains("7 bytes"),
            "{e}"
        );
        fs::write(t.join("etc/a"), b"12345").unwrap();
        check(&root, "kube1", d).unwrap();
        // a deleted file
        fs::remove_file(t.join("etc/sub/b")).unwrap();
        let e = check(&root, "kube1", d).unwrap_err().to_string();
        assert!(e.contains("4 entries and 5 bytes"), "{e}");
    }

    #[test]
    fn an_adopted_tree_is_marked_without_an_image() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        tree(&root);
        record(&root, "kube1", None).unwrap();
        check(&root, "kube1", None).unwrap();
        let e = check(&root, "kube1", Some(Digest::of(b"image")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("names an adopted tree"), "{e}");
        // a mark written before adopted trees existed still loads
        fs::write(
            root.slot_tree_mark("kube1"),
            format!(
                r#"{{"digest": "{}", "entries": 5, "bytes": 7}}"#,
                Digest::of(b"old")
            ),
        )
        .unwrap();
        check(&root, "kube1", Some(Digest::of(b"old"))).unwrap();
    }
}
