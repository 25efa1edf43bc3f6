//! Per-file records of what a layer directory held when it was unpacked,
//! and the check of a directory against its record (`verify-layers`).
//!
//! A record lists every regular file (path bytes hex-encoded, size,
//! sha256), every symlink (its target) and every directory of a tree, as
//! JSON written atomically beside the layer (`layers/<diff_id>.files`),
//! before the layer directory is renamed into place: a layer never exists
//! without its record. [`check`] walks the tree again without following
//! anything and reports what differs: changed, missing, added or retyped
//! entries. It owns no policy about what to do with a difference.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use kubeslot_image::digest::HashingReader;
use serde::{Deserialize, Serialize};

/// One entry of a tree, keyed by its path (hex of the bytes) in [`Record`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Entry {
    File {
        size: u64,
        sha256: String,
    },
    Symlink {
        target: String,
    },
    Dir,
    /// Anything else (an overlay whiteout device, a FIFO): present, unhashed.
    Other {
        mode: u32,
    },
}

/// What a tree held: entry by hex-encoded relative path.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub entries: BTreeMap<String, Entry>,
}

/// One difference between a tree and its record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Mismatch {
    pub path: String,
    pub what: String,
}

fn shown(hex_path: &str) -> String {
    hex::decode(hex_path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_else(|_| hex_path.to_string())
}

/// Records `dir` (not following links).
pub fn record(dir: &Path) -> io::Result<Record> {
    let mut r = Record::default();
    walk(dir, Path::new(""), &mut r)?;
    Ok(r)
}

fn entry_of(path: &Path, meta: &std::fs::Metadata) -> io::Result<Entry> {
    use std::os::unix::fs::MetadataExt as _;
    let t = meta.file_type();
    Ok(if t.is_file() {
        let mut h = HashingReader::new(File::open(path)?);
        io::copy(&mut h, &mut io::sink())?;
        let (digest, size) = h.finish();
        Entry::File {
            size,
            sha256: digest.hex(),
        }
    } else if t.is_symlink() {
        Entry::Symlink {
            target: hex::encode(std::fs::read_link(path)?.as_os_str().as_bytes()),
        }
    } else if t.is_dir() {
        Entry::Dir
    } else {
        Entry::Other { mode: meta.mode() }
    })
}

fn walk(root: &Path, rel: &Path, r: &mut Record) -> io::Result<()> {
    for e in std::fs::read_dir(root.join(rel))? {
        let e = e?;
        let rel = rel.join(e.file_name());
        let full = root.join(&rel);
        let meta = std::fs::symlink_metadata(&full)?;
        r.entries.insert(
            hex::encode(rel.as_os_str().as_bytes()),
            entry_of(&full, &meta)?,
        );
        if meta.is_dir() {
            walk(root, &rel, r)?;
        }
    }
    Ok(())
}

/// Writes `record` to `path` atomically (0600).
pub fn save(path: &Path, record: &Record) -> io::Result<()> {
    let bytes = serde_json::to_vec(record).map_err(io::Error::other)?;
    kubeslot_image::atomic::write_file_mode(path, &bytes, 0o600)
        .map_err(|e| io::Error::other(e.to_string()))
}

pub fn load(path: &Path) -> io::Result<Record> {
    serde_json::from_slice(&std::fs::read(path)?).map_err(io::Error::other)
}

/// What differs between `dir` now and `record`.
pub fn check(dir: &Path, record: &Record) -> io::Result<Vec<Mismatch>> {
    let now = self::record(dir)?;
    let mut out = Vec::new();
    for (p, want) in &record.entries {
        match now.entries.get(p) {
            None => out.push(Mismatch {
                path: shown(p),
                what: "missing".into(),
            }),
            Some(got) if got != want => out.push(Mismatch {
                path: shown(p),
                what: match (want, got) {
                    (Entry::File { .. }, Entry::File { .. }) => "contents changed".into(),
                    _ => "changed type or target".into(),
                },
            }),
            Some(_) => {}
        }
    }
    for p in now.entries.keys() {
        if !record.entries.contains_key(p) {
            out.push(Mismatch {
                path: shown(p),
                what: "added".into(),
            });
        }
    }
    Ok(out)
}

/// The record file of the tree at `dir`: `<dir>.files`.
pub fn record_path(dir: &Path) -> PathBuf {
    let mut s = dir.as_os_str().to_owned();
    s.push(".files");
    PathBuf::from(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_added_or_removed_entry_is_reported() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("layer");
        std::fs::create_dir_all(d.join("usr/bin")).unwrap();
        std::fs::write(d.join("usr/bin/kubelet"), b"v1").unwrap();
        std::fs::write(d.join("etc"), b"x").unwrap();
        std::os::unix::fs::symlink("kubelet", d.join("usr/bin/k")).unwrap();
        let r = record(&d).unwrap();
        save(&record_path(&d), &r).unwrap();
        assert_eq!(load(&record_path(&d)).unwrap(), r);
        assert!(check(&d, &r).unwrap().is_empty());
        std::fs::write(d.join("usr/bin/kubelet"), b"v2").unwrap();
        std::fs::remove_file(d.join("etc")).unwrap();
        std::fs::write(d.join("new"), b"").unwrap();
        std::fs::remove_file(d.join("usr/bin/k")).unwrap();
        std::os::unix::fs::symlink("/etc/shadow", d.join("usr/bin/k")).unwrap();
        let mut m: Vec<(String, String)> = check(&d, &r)
            .unwrap()
            .into_iter()
            .map(|m| (m.path, m.what))
            .collect();
        m.sort();
        assert_eq!(
            m,
            [
                ("etc".to_string(), "missing".to_string()),
                ("new".into(), "added".into()),
                ("usr/bin/k".into(), "changed type or target".into()),
                ("usr/bin/kubelet".into(), "contents changed".into()),
            ]
        );
    }
}
