//! `oci-archive` files (a tar of an OCI image layout): safe extraction into a
//! private directory that is then opened as a [`Layout`].
//!
//! Given an archive path and an empty private directory, [`extract`] writes
//! only what a layout is made of: `oci-layout`, `index.json` and
//! `blobs/sha256/<hex>` regular files. Every other entry (links, devices,
//! other paths, `..`, absolute names, duplicates) is refused with the entry
//! named, documents are capped at [`MAX_DOCUMENT_BYTES`], and each blob is
//! hashed while it is written, so the returned layout holds only blobs whose
//! bytes match their names. Files are created with `O_EXCL` below the
//! directories this module made itself, so nothing is written through a
//! symlink.
//!
//! It does not fsync: the directory is scratch space whose blobs are copied
//! (and checked again) into the content store. It does not interpret the
//! layout (tags, platforms, signatures): that is [`crate::source`].

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use crate::digest::{Digest, HashingReader};
use crate::layout::{Layout, LayoutError, MAX_DOCUMENT_BYTES};

/// Archives with more entries than this are refused (a layout has a few
/// documents and one blob per layer, config and manifest).
pub const MAX_ENTRIES: u64 = 100_000;
/// Total bytes written from one archive.
pub const MAX_TOTAL_BYTES: u64 = 256 * 1024 * 1024 * 1024;

/// Why an archive was refused; every variant names the archive and, where
/// there is one, the entry.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("oci-archive {file}: {error}")]
    Io { file: PathBuf, error: io::Error },
    #[error("oci-archive {file}: entry {index} {name:?}: {rule}")]
    Entry {
        file: PathBuf,
        index: u64,
        name: String,
        rule: String,
    },
    #[error("oci-archive {file}: {rule}")]
    Archive { file: PathBuf, rule: String },
    #[error("oci-archive {file}: {error}")]
    Layout { file: PathBuf, error: LayoutError },
}

/// What an accepted entry becomes.
enum Kind {
    /// `.`, `blobs`, `blobs/sha256`: created by us, so ignored.
    Dir,
    Document(&'static str),
    Blob(Digest),
}

/// Classifies a normalised entry name; `None` means "not part of a layout".
fn classify(name: &str, is_dir: bool) -> Option<Kind> {
    if is_dir {
        return matches!(name, "" | "blobs" | "blobs/sha256").then_some(Kind::Dir);
    }
    match name {
        "oci-layout" => Some(Kind::Document("oci-layout")),
        "index.json" => Some(Kind::Document("index.json")),
        _ => {
            let hex = name.strip_prefix("blobs/sha256/")?;
            // Digest::from_hex accepts only 64 lower-case hex digits, so the
            // name cannot contain '/' or '..'.
            Digest::from_hex(hex).ok().map(Kind::Blob)
        }
    }
}

/// Strips a leading `./` and trailing `/`; refuses anything that is not a
/// plain relative name.
fn normalise(raw: &[u8]) -> Option<String> {
    let s = std::str::from_utf8(raw).ok()?;
    let s = s.strip_prefix("./").unwrap_or(s);
    let s = s.trim_end_matches('/');
    if s.is_empty() || s == "." {
        return Some(String::new());
    }
    if s.starts_with('/') || s.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return None;
    }
    Some(s.to_string())
}

/// Extracts the layout in `file` into `into` (an existing, empty, private
/// directory) and opens it.
pub fn extract(file: &Path, into: &Path) -> Result<Layout, ArchiveError> {
    let io_err = |source| ArchiveError::Io {
        file: file.to_path_buf(),
        error: source,
    };
    if fs::read_dir(into).map_err(io_err)?.next().is_some() {
        return Err(ArchiveError::Archive {
            file: file.to_path_buf(),
            rule: format!("extraction directory {} is not empty", into.display()),
        });
    }
    let sha_dir = into.join("blobs").join("sha256");
    fs::create_dir_all(&sha_dir).map_err(io_err)?;

    let f = File::open(file).map_err(io_err)?;
    let mut archive = tar::Archive::new(io::BufReader::with_capacity(1 << 20, f));
    let mut seen = BTreeSet::new();
    let mut total = 0u64;
    for (index, entry) in archive.entries().map_err(io_err)?.enumerate() {
        let index = index as u64;
        let mut entry = entry.map_err(io_err)?;
        let raw = entry.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&raw).escape_default().to_string();
        let refuse = |rule: String| ArchiveError::Entry {
            file: file.to_path_buf(),
            index,
            name: shown.clone(),
            rule,
        };
        if index >= MAX_ENTRIES {
            return Err(refuse(format!("more than {MAX_ENTRIES} entries")));
        }
        let kind = entry.header().entry_type();
        let is_dir = kind.is_dir();
        if !(is_dir || kind.is_file() || kind.is_contiguous()) {
            return Err(refuse(format!(
                "entry type {:?} is not allowed in an oci-archive (only regular files and the blob directories)",
                kind
            )));
        }
        let Some(name) = normalise(&raw) else {
            return Err(refuse("not a plain relative path".into()));
        };
        let Some(what) = classify(&name, is_dir) else {
            return Err(refuse(
                "not part of an OCI layout (only oci-layout, index.json and blobs/sha256/<hex>)"
                    .into(),
            ));
        };
        if !seen.insert(name.clone()) && !is_dir {
            return Err(refuse("duplicate entry".into()));
        }
        let size = entry.header().size().map_err(io_err)?;
        total = total.saturating_add(size);
        if total > MAX_TOTAL_BYTES {
            return Err(refuse(format!(
                "archive content exceeds {MAX_TOTAL_BYTES} bytes"
            )));
        }
        match what {
            Kind::Dir => {}
            Kind::Document(doc) => {
                if size > MAX_DOCUMENT_BYTES {
                    return Err(refuse(format!(
                        "{doc} of {size} bytes exceeds the {MAX_DOCUMENT_BYTES}-byte limit"
                    )));
                }
                let mut out = create_new(&into.join(doc)).map_err(io_err)?;
                let n = io::copy(&mut (&mut entry).take(size), &mut out).map_err(io_err)?;
                if n != size {
                    return Err(refuse("truncated".into()));
                }
            }
            Kind::Blob(digest) => {
                let mut out = create_new(&sha_dir.join(digest.hex())).map_err(io_err)?;
                let mut hashing = HashingReader::new((&mut entry).take(size));
                io::copy(&mut hashing, &mut out).map_err(io_err)?;
                let (actual, n) = hashing.finish();
                if n != size {
                    return Err(refuse("truncated".into()));
                }
                if actual != digest {
                    return Err(refuse(format!("blob content hashes to {actual}")));
                }
            }
        }
    }
    for doc in ["oci-layout", "index.json"] {
        if !seen.contains(doc) {
            return Err(ArchiveError::Archive {
                file: file.to_path_buf(),
                rule: format!("no {doc}: not an OCI layout archive"),
            });
        }
    }
    Layout::open(into).map_err(|source| ArchiveError::Layout {
        file: file.to_path_buf(),
        error: source,
    })
}

/// `O_CREAT|O_EXCL`: never reuses (or follows) something already there.
fn create_new(path: &Path) -> io::Result<File> {
    OpenOptions::new().write(true).create_new(true).open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(entries: &[(&str, tar::EntryType, &[u8])]) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        let mut b = tar::Builder::new(f.reopen().unwrap());
        for (name, kind, data) in entries {
            let mut h = tar::Header::new_ustar();
            h.set_entry_type(*kind);
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            if *kind == tar::EntryType::Symlink {
                h.set_link_name("/etc/passwd").unwrap();
            }
            // set_path refuses `..`; write the raw name to test our checks
            let bytes = name.as_bytes();
            h.as_old_mut().name[..bytes.len()].copy_from_slice(bytes);
            h.set_cksum();
            b.append(&h, *data).unwrap();
        }
        b.finish().unwrap();
        f
    }

    type Spec<'a> = (&'a str, tar::EntryType, &'a [u8]);

    const MARKER: &[u8] = br#"{"imageLayoutVersion":"1.0.0"}"#;
    const INDEX: &[u8] = br#"{"schemaVersion":2,"manifests":[]}"#;

    #[test]
    fn extracts_a_layout() {
        let blob = b"hello";
        let d = Digest::of(blob);
        let name = format!("blobs/sha256/{}", d.hex());
        let a = archive(&[
            ("./", tar::EntryType::Directory, b""),
            ("oci-layout", tar::EntryType::Regular, MARKER),
            ("./index.json", tar::EntryType::Regular, INDEX),
            ("blobs/", tar::EntryType::Directory, b""),
            (&name, tar::EntryType::Regular, blob),
        ]);
        let dir = tempfile::tempdir().unwrap();
        let layout = extract(a.path(), dir.path()).unwrap();
        assert_eq!(layout.blobs().read_verified(&d, Some(5), 10).unwrap(), blob);
        assert!(layout.index().unwrap().manifests.is_empty());
    }

    #[test]
    fn refuses_what_a_layout_does_not_hold() {
        let d = Digest::of(b"hello");
        let good = format!("blobs/sha256/{}", d.hex());
        let cases: Vec<(Vec<Spec>, &str)> = vec![
            (
                vec![("../evil", tar::EntryType::Regular, b"x")],
                "plain relative",
            ),
            (
                vec![("/etc/x", tar::EntryType::Regular, b"x")],
                "plain relative",
            ),
            (
                vec![("etc/passwd", tar::EntryType::Regular, b"x")],
                "not part of an OCI layout",
            ),
            (
                vec![("oci-layout", tar::EntryType::Symlink, b"")],
                "entry type",
            ),
            (
                vec![("blobs/sha256/abc", tar::EntryType::Regular, b"x")],
                "not part",
            ),
            (
                vec![(&good, tar::EntryType::Regular, b"hellx")],
                "hashes to",
            ),
            (
                vec![
                    ("oci-layout", tar::EntryType::Regular, MARKER),
                    ("oci-layout", tar::EntryType::Regular, MARKER),
                ],
                "duplicate",
            ),
            (
                vec![("oci-layout", tar::EntryType::Regular, MARKER)],
                "no index.json",
            ),
        ];
        for (entries, rule) in cases {
            let a = archive(&entries);
            let dir = tempfile::tempdir().unwrap();
            let e = extract(a.path(), dir.path()).unwrap_err().to_string();
            assert!(e.contains(rule), "{rule}: {e}");
        }
    }
}
