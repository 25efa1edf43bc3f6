//! OCI image layout directories (`oci:DIR`): reading `index.json` and blobs
//! with their digests checked, and writing blobs atomically.
//!
//! The activator's content store (`/var/lib/kubeslot/blobs/sha256/…`) has the
//! same shape as a layout's `blobs/` directory, so one type serves both: a
//! [`BlobDir`] where a blob only ever appears under its name after its bytes
//! were hashed, fsynced and renamed into place. Readers still re-check what
//! they read (a layout handed to us is untrusted input). `oci-archive` files
//! are handled by the callers that need them (extract, then open as a layout).

use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use crate::atomic::{self, AtomicError};
use crate::digest::{Digest, HashingReader};
use crate::oci::{Descriptor, Index, LayoutMarker};

/// Index and manifest documents larger than this are refused unread.
pub const MAX_DOCUMENT_BYTES: u64 = 4 * 1024 * 1024;

/// Errors reading or writing a layout; each names the path or blob.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: not an OCI image layout ({reason})")]
    NotALayout { path: PathBuf, reason: String },
    #[error("blob {digest} in {dir}: content hashes to {actual}")]
    DigestMismatch {
        dir: PathBuf,
        digest: Digest,
        actual: Digest,
    },
    #[error("blob {digest} in {dir}: {actual} bytes, expected {expected}")]
    SizeMismatch {
        dir: PathBuf,
        digest: Digest,
        expected: u64,
        actual: u64,
    },
    #[error("{path}: larger than the {limit}-byte limit for a JSON document")]
    TooLarge { path: PathBuf, limit: u64 },
    #[error("{path}: invalid JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

impl From<AtomicError> for LayoutError {
    fn from(e: AtomicError) -> Self {
        LayoutError::Io {
            path: e.path,
            source: e.source,
        }
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> LayoutError + '_ {
    move |source| LayoutError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A `blobs/sha256/` directory: a layout's, or the activator's content store.
#[derive(Clone, Debug)]
pub struct BlobDir {
    /// The directory that contains `sha256/`.
    root: PathBuf,
}

impl BlobDir {
    /// Uses (and creates) `<root>/sha256/`.
    pub fn create(root: impl Into<PathBuf>) -> Result<Self, LayoutError> {
        let root = root.into();
        let sha = root.join("sha256");
        fs::create_dir_all(&sha).map_err(io_err(&sha))?;
        Ok(BlobDir { root })
    }

    /// Uses `<root>/sha256/` without creating anything.
    pub fn open(root: impl Into<PathBuf>) -> Self {
        BlobDir { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn path(&self, digest: &Digest) -> PathBuf {
        self.root.join("sha256").join(digest.hex())
    }

    pub fn contains(&self, digest: &Digest) -> bool {
        self.path(digest).is_file()
    }

    /// Opens a blob for streaming; the caller checks the digest as it reads
    /// (see [`BlobDir::read_verified`] for small documents).
    pub fn open_blob(&self, digest: &Digest) -> Result<File, LayoutError> {
        let p = self.path(digest);
        open_regular(&p).map_err(io_err(&p))
    }

    /// Reads a whole blob of at most `limit` bytes and checks its digest (and
    /// its size, when `expected_size` is given).
    pub fn read_verified(
        &self,
        digest: &Digest,
        expected_size: Option<u64>,
        limit: u64,
    ) -> Result<Vec<u8>, LayoutError> {
        let p = self.path(digest);
        let f = open_regular(&p).map_err(io_err(&p))?;
        let mut bytes = Vec::new();
        f.take(limit.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(io_err(&p))?;
        if bytes.len() as u64 > limit {
            return Err(LayoutError::TooLarge { path: p, limit });
        }
        if let Some(expected) = expected_size {
            if bytes.len() as u64 != expected {
                return Err(LayoutError::SizeMismatch {
                    dir: self.root.clone(),
                    digest: *digest,
                    expected,
                    actual: bytes.len() as u64,
                });
            }
        }
        let actual = Digest::of(&bytes);
        if actual != *digest {
            return Err(LayoutError::DigestMismatch {
                dir: self.root.clone(),
                digest: *digest,
                actual,
            });
        }
        Ok(bytes)
    }

    /// Stores `bytes` under their digest (atomic; a no-op if present).
    pub fn put_bytes(&self, bytes: &[u8]) -> Result<Digest, LayoutError> {
        let digest = Digest::of(bytes);
        if !self.contains(&digest) {
            atomic::write_file(&self.path(&digest), bytes)?;
        }
        Ok(digest)
    }

    /// Streams `reader` into the store. The blob appears under its name only
    /// if it hashes to `expected` with `expected_size` bytes (when given);
    /// otherwise the partial file is removed and the error names both digests.
    /// Reads at most `expected_size + 1` bytes so a lying source cannot fill
    /// the disk.
    pub fn put_verified(
        &self,
        expected: &Digest,
        expected_size: Option<u64>,
        reader: impl Read,
    ) -> Result<u64, LayoutError> {
        let dest = self.path(expected);
        let dir = self.root.join("sha256");
        let mut tmp = tempfile::Builder::new()
            .prefix(".partial-")
            // what other users may read (umask applies), not tempfile's 0600
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .tempfile_in(&dir)
            .map_err(io_err(&dir))?;
        let limit = expected_size.map_or(u64::MAX, |s| s.saturating_add(1));
        let mut hashing = HashingReader::new(reader.take(limit));
        io::copy(&mut hashing, tmp.as_file_mut()).map_err(io_err(&dest))?;
        let (actual, len) = hashing.finish();
        if let Some(expected_size) = expected_size {
            if len != expected_size {
                return Err(LayoutError::SizeMismatch {
                    dir: self.root.clone(),
                    digest: *expected,
                    expected: expected_size,
                    actual: len,
                });
            }
        }
        if actual != *expected {
            return Err(LayoutError::DigestMismatch {
                dir: self.root.clone(),
                digest: *expected,
                actual,
            });
        }
        tmp.as_file().sync_all().map_err(io_err(&dest))?;
        tmp.persist(&dest).map_err(|e| io_err(&dest)(e.error))?;
        atomic::sync_dir(&dir)?;
        Ok(len)
    }
}

/// An OCI image layout directory.
#[derive(Clone, Debug)]
pub struct Layout {
    dir: PathBuf,
    blobs: BlobDir,
}

impl Layout {
    /// Opens an existing layout, checking its `oci-layout` marker.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, LayoutError> {
        let dir = dir.into();
        let marker_path = dir.join("oci-layout");
        let marker = open_regular(&marker_path)
            .and_then(|f| {
                let mut v = Vec::new();
                f.take(MAX_DOCUMENT_BYTES).read_to_end(&mut v).map(|_| v)
            })
            .map_err(|e| LayoutError::NotALayout {
                path: dir.clone(),
                reason: format!("cannot read oci-layout: {e}"),
            })?;
        let marker: LayoutMarker =
            serde_json::from_slice(&marker).map_err(|e| LayoutError::NotALayout {
                path: dir.clone(),
                reason: format!("oci-layout: {e}"),
            })?;
        if marker.image_layout_version != "1.0.0" {
            return Err(LayoutError::NotALayout {
                path: dir.clone(),
                reason: format!(
                    "unsupported imageLayoutVersion {}",
                    marker.image_layout_version
                ),
            });
        }
        let blobs = BlobDir::open(dir.join("blobs"));
        Ok(Layout { dir, blobs })
    }

    /// Creates (or reuses) a layout directory with its marker and blob dir.
    pub fn create(dir: impl Into<PathBuf>) -> Result<Self, LayoutError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        let marker = serde_json::to_vec(&LayoutMarker::default()).expect("marker serialises");
        atomic::write_file(&dir.join("oci-layout"), &marker)?;
        let blobs = BlobDir::create(dir.join("blobs"))?;
        Ok(Layout { dir, blobs })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn blobs(&self) -> &BlobDir {
        &self.blobs
    }

    /// Reads `index.json`.
    pub fn index(&self) -> Result<Index, LayoutError> {
        let p = self.dir.join("index.json");
        let f = open_regular(&p).map_err(io_err(&p))?;
        let mut bytes = Vec::new();
        f.take(MAX_DOCUMENT_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(io_err(&p))?;
        if bytes.len() as u64 > MAX_DOCUMENT_BYTES {
            return Err(LayoutError::TooLarge {
                path: p,
                limit: MAX_DOCUMENT_BYTES,
            });
        }
        serde_json::from_slice(&bytes).map_err(|source| LayoutError::Json { path: p, source })
    }

    /// Writes `index.json` atomically (the last step of writing a layout, so
    /// a reader never sees an index pointing at missing blobs).
    pub fn write_index(&self, index: &Index) -> Result<(), LayoutError> {
        let bytes = serde_json::to_vec(index).expect("index serialises");
        Ok(atomic::write_file(&self.dir.join("index.json"), &bytes)?)
    }

    /// Adds `entries` to `index.json` (created when missing) by the rule of
    /// [`Index::upsert`], then writes it atomically.
    pub fn upsert_index(
        &self,
        entries: impl IntoIterator<Item = Descriptor>,
    ) -> Result<(), LayoutError> {
        let mut index = if self.dir.join("index.json").exists() {
            self.index()?
        } else {
            Index::new(Vec::new())
        };
        for e in entries {
            index.upsert(e);
        }
        self.write_index(&index)
    }

    /// Reads a JSON document blob (manifest, index, config), digest checked.
    pub fn read_json<T: serde::de::DeserializeOwned>(
        &self,
        digest: &Digest,
        expected_size: Option<u64>,
    ) -> Result<T, LayoutError> {
        let bytes = self
            .blobs
            .read_verified(digest, expected_size, MAX_DOCUMENT_BYTES)?;
        serde_json::from_slice(&bytes).map_err(|source| LayoutError::Json {
            path: self.blobs.path(digest),
            source,
        })
    }
}

/// Opens a file of a layout for reading: never through a symlink
/// (`O_NOFOLLOW`), never blocking on a FIFO or device (`O_NONBLOCK`, then
/// anything but a regular file is refused). A layout is input, and a
/// symlinked blob could name any file on the host.
pub fn open_regular(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags((rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK).bits() as i32)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) {
                io::Error::other("a symlink, not a file (layouts are read without following links)")
            } else {
                e
            }
        })?;
    if !f.metadata()?.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oci::{Descriptor, MEDIA_TYPE_INDEX, MEDIA_TYPE_MANIFEST};

    #[test]
    fn round_trip_and_tamper() {
        let tmp = tempfile::tempdir().unwrap();
        let layout = Layout::create(tmp.path().join("l")).unwrap();
        let d = layout.blobs().put_bytes(b"{\"a\":1}").unwrap();
        let index = Index {
            schema_version: 2,
            media_type: Some(MEDIA_TYPE_INDEX.into()),
            manifests: vec![Descriptor::new(MEDIA_TYPE_MANIFEST, d, 7)],
            annotations: Default::default(),
        };
        layout.write_index(&index).unwrap();
        let again = Layout::open(layout.dir()).unwrap();
        assert_eq!(again.index().unwrap(), index);
        let v: serde_json::Value = again.read_json(&d, Some(7)).unwrap();
        assert_eq!(v["a"], 1);

        std::fs::write(again.blobs().path(&d), b"{\"a\":2}").unwrap();
        let e = again
            .read_json::<serde_json::Value>(&d, Some(7))
            .unwrap_err();
        assert!(matches!(e, LayoutError::DigestMismatch { .. }), "{e}");
    }

    #[test]
    fn put_verified_leaves_nothing_on_mismatch() {
        let tmp = tempfile::tempdir().unwrap();
        let store = BlobDir::create(tmp.path()).unwrap();
        let want = Digest::of(b"good");
        assert!(store.put_verified(&want, Some(4), &b"evil"[..]).is_err());
        assert!(store
            .put_verified(&want, Some(4), &b"good and more"[..])
            .is_err());
        assert_eq!(
            std::fs::read_dir(tmp.path().join("sha256"))
                .unwrap()
                .count(),
            0
        );
        store.put_verified(&want, Some(4), &b"good"[..]).unwrap();
        assert!(store.contains(&want));
    }

    #[test]
    fn open_rejects_non_layout() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(matches!(
            Layout::open(tmp.path()),
            Err(LayoutError::NotALayout { .. })
        ));
    }
}
