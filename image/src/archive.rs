//! `oci-archive` files (a tar of an OCI image layout): safe extraction into a
//! private directory that is then opened as a [`Layout`].
//!
//! Hosts read an archive in place: [`scan`] reads every header (with caps on
//! extension headers: the tar crate's own reading is never used for them)
//! and writes only `oci-layout` and `index.json`; each blob is copied out
//! when it is read ([`extract_member`]: documents, the signature) or
//! streamed straight from its offset (layers, by `Source::open_blob`), so
//! the signature is checked before any layer is written and only the blobs
//! of the selected image are. The builder uses [`extract`] (everything).
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

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::digest::{Digest, HashingReader};
use crate::layout::{Layout, LayoutError, MAX_DOCUMENT_BYTES};

/// Archives with more entries than this are refused (a layout has a few
/// documents and one blob per layer, config and manifest).
pub const MAX_ENTRIES: u64 = 100_000;
/// Total bytes written from one archive.
pub const MAX_TOTAL_BYTES: u64 = 256 * 1024 * 1024 * 1024;
/// A GNU long name's data (a layout's names are under 100 bytes; this is
/// room, not a need), and a PAX extended header's. Extension headers are
/// read by us with these caps: the tar crate would read any size into
/// memory (a crafted 3 GiB long-name header took 4 GiB of RSS).
pub const MAX_LONG_NAME_BYTES: u64 = 4096;
pub const MAX_PAX_BYTES: u64 = 64 * 1024;

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
    let f = File::open(file).map_err(|error| ArchiveError::Io {
        file: file.to_path_buf(),
        error,
    })?;
    walk(file, &f, into, false).map(|(layout, _)| layout)
}

/// Where each blob's bytes lie in an archive: data offset and size.
pub type Members = BTreeMap<Digest, (u64, u64)>;

/// Reads an archive's headers (every rule of [`extract`] applies) but
/// writes only `oci-layout` and `index.json`; returns the layout and where
/// each blob lies. Blobs are copied out one by one on demand
/// ([`extract_member`]), so an image's signature is checked before any
/// layer is written, and only the blobs an image uses are.
pub fn scan(file: &Path, into: &Path) -> Result<(Layout, Members, Arc<File>), ArchiveError> {
    let f = File::open(file).map_err(|error| ArchiveError::Io {
        file: file.to_path_buf(),
        error,
    })?;
    let (layout, members) = walk(file, &f, into, true)?;
    // Every later read goes through this one descriptor (positioned reads):
    // the file a run verified is the file it unpacks, even if the path is
    // replaced meanwhile.
    Ok((layout, members, Arc::new(f)))
}

/// Reads `len` bytes at `at` of a shared file, without moving its offset.
pub struct ReadAt {
    file: Arc<File>,
    at: u64,
    left: u64,
}

impl ReadAt {
    pub fn new(file: Arc<File>, at: u64, len: u64) -> ReadAt {
        ReadAt {
            file,
            at,
            left: len,
        }
    }
}

impl Read for ReadAt {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use std::os::unix::fs::FileExt as _;
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        if want == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..want], self.at)?;
        self.at = self.at.saturating_add(n as u64);
        self.left -= n as u64;
        Ok(n)
    }
}

/// Copies the blob `digest` (at `offset`, `size` bytes, from [`scan`]) out
/// of the archive into the layout at `into`, hashed while written and
/// renamed into place only when it matches.
pub fn extract_member(
    file: &Path,
    archive: &Arc<File>,
    into: &Path,
    digest: &Digest,
    (offset, size): (u64, u64),
) -> Result<(), ArchiveError> {
    let io_err = |error| ArchiveError::Io {
        file: file.to_path_buf(),
        error,
    };
    let sha_dir = into.join("blobs").join("sha256");
    let dest = sha_dir.join(digest.hex());
    if dest.exists() {
        return Ok(());
    }
    let tmp = sha_dir.join(format!(".partial-{}", digest.hex()));
    let _ = fs::remove_file(&tmp);
    let mut out = create_new(&tmp).map_err(io_err)?;
    let mut hashing = HashingReader::new(ReadAt::new(archive.clone(), offset, size));
    io::copy(&mut hashing, &mut out).map_err(io_err)?;
    let (actual, n) = hashing.finish();
    if n != size || actual != *digest {
        let _ = fs::remove_file(&tmp);
        return Err(ArchiveError::Archive {
            file: file.to_path_buf(),
            rule: format!("blob {digest}: {n} bytes at offset {offset} hash to {actual}"),
        });
    }
    fs::rename(&tmp, &dest).map_err(io_err)
}

fn walk(file: &Path, f: &File, into: &Path, lazy: bool) -> Result<(Layout, Members), ArchiveError> {
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

    let mut archive = tar::Archive::new(io::BufReader::with_capacity(1 << 20, f));
    let mut members = Members::new();
    let mut seen = BTreeSet::new();
    let mut total = 0u64;
    // Raw entries: extension headers come to us, read with caps, and name
    // the next entry (GNU long name, PAX `path`).
    let mut long_name: Option<Vec<u8>> = None;
    // With seek: data a lazy scan does not read is skipped, not read.
    for (index, entry) in archive
        .entries_with_seek()
        .map_err(io_err)?
        .raw(true)
        .enumerate()
    {
        let index = index as u64;
        let mut entry = entry.map_err(io_err)?;
        let ty = entry.header().entry_type();
        let cap = match ty {
            tar::EntryType::GNULongName => Some(MAX_LONG_NAME_BYTES),
            tar::EntryType::XHeader => Some(MAX_PAX_BYTES),
            _ => None,
        };
        if let Some(cap) = cap {
            long_name = Some(extension_name(file, &mut entry, index, cap, &long_name)?);
            continue;
        }
        let raw = match long_name.take() {
            Some(n) if !n.is_empty() => n,
            _ => entry.header().path_bytes().into_owned(),
        };
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
        let member = Member {
            file,
            into,
            sha_dir: &sha_dir,
            lazy,
            refuse: &refuse,
        };
        member.store(&mut entry, what, size, &mut members)?;
    }
    if long_name.is_some() {
        return Err(ArchiveError::Archive {
            file: file.to_path_buf(),
            rule: "the archive ends with an extension header that names no entry".into(),
        });
    }
    for doc in ["oci-layout", "index.json"] {
        if !seen.contains(doc) {
            return Err(ArchiveError::Archive {
                file: file.to_path_buf(),
                rule: format!("no {doc}: not an OCI layout archive"),
            });
        }
    }
    let layout = Layout::open(into).map_err(|source| ArchiveError::Layout {
        file: file.to_path_buf(),
        error: source,
    })?;
    Ok((layout, members))
}

/// Reads extension header `entry` (at most `cap` bytes) and returns the
/// name it gives the next entry: a GNU long name up to its NUL, or a PAX
/// `path` (empty when it has none). `pending` is a name an earlier
/// extension header already gave: two for one entry are refused.
fn extension_name<R: Read>(
    file: &Path,
    entry: &mut tar::Entry<'_, R>,
    index: u64,
    cap: u64,
    pending: &Option<Vec<u8>>,
) -> Result<Vec<u8>, ArchiveError> {
    let ty = entry.header().entry_type();
    let declared = entry.header().size().map_err(|error| ArchiveError::Io {
        file: file.to_path_buf(),
        error,
    })?;
    let name = String::from_utf8_lossy(&entry.header().path_bytes())
        .escape_default()
        .to_string();
    let refuse = |rule: String| ArchiveError::Entry {
        file: file.to_path_buf(),
        index,
        name: name.clone(),
        rule,
    };
    if declared > cap {
        return Err(refuse(format!(
            "a {declared}-byte {ty:?} extension header, more than the {cap} allowed"
        )));
    }
    if pending.is_some() {
        return Err(refuse(
            "two extension headers describe the same entry".into(),
        ));
    }
    let mut data = Vec::with_capacity(declared as usize);
    (&mut *entry)
        .take(declared)
        .read_to_end(&mut data)
        .map_err(|error| ArchiveError::Io {
            file: file.to_path_buf(),
            error,
        })?;
    if data.len() as u64 != declared {
        return Err(refuse("truncated extension header".into()));
    }
    Ok(if ty == tar::EntryType::GNULongName {
        let end = data.iter().position(|b| *b == 0).unwrap_or(data.len());
        data[..end].to_vec()
    } else {
        pax_path(&data).map_err(refuse)?.unwrap_or_default()
    })
}

/// Where an accepted member goes: documents into `into`, blobs (hashed
/// while written) into `sha_dir`, or, for a `lazy` scan, only their
/// offsets into the members map.
struct Member<'a> {
    file: &'a Path,
    into: &'a Path,
    sha_dir: &'a Path,
    lazy: bool,
    /// The error naming this entry and the rule it breaks.
    refuse: &'a dyn Fn(String) -> ArchiveError,
}

impl Member<'_> {
    /// Stores `entry` (`size` bytes, classified `what`).
    fn store<R: Read>(
        &self,
        entry: &mut tar::Entry<'_, R>,
        what: Kind,
        size: u64,
        members: &mut Members,
    ) -> Result<(), ArchiveError> {
        let refuse = self.refuse;
        let io_err = |error| ArchiveError::Io {
            file: self.file.to_path_buf(),
            error,
        };
        match what {
            Kind::Dir => {}
            Kind::Document(doc) => {
                if size > MAX_DOCUMENT_BYTES {
                    return Err(refuse(format!(
                        "{doc} of {size} bytes exceeds the {MAX_DOCUMENT_BYTES}-byte limit"
                    )));
                }
                let mut out = create_new(&self.into.join(doc)).map_err(io_err)?;
                let n = io::copy(&mut (&mut *entry).take(size), &mut out).map_err(io_err)?;
                if n != size {
                    return Err(refuse("truncated".into()));
                }
            }
            Kind::Blob(digest) if self.lazy => {
                members.insert(digest, (entry.raw_file_position(), size));
            }
            Kind::Blob(digest) => {
                let mut out = create_new(&self.sha_dir.join(digest.hex())).map_err(io_err)?;
                let mut hashing = HashingReader::new((&mut *entry).take(size));
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
        Ok(())
    }
}

/// The `path` of a PAX extended header (other keys are ignored: a layout
/// member has a name and a size, and the size is the header's own); a key
/// given twice is refused, as the unpacker does.
fn pax_path(data: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let mut keys = BTreeSet::new();
    let mut path = None;
    for rec in tar::PaxExtensions::new(data) {
        let rec = rec.map_err(|e| format!("PAX record: {e}"))?;
        if !keys.insert(rec.key_bytes().to_vec()) {
            return Err(format!(
                "PAX key {:?} appears twice in one header",
                String::from_utf8_lossy(rec.key_bytes())
            ));
        }
        match rec.key_bytes() {
            b"path" => path = Some(rec.value_bytes().to_vec()),
            b"size" => return Err("a PAX size (blobs over 8 GiB) is not supported".into()),
            _ => {}
        }
    }
    Ok(path)
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
