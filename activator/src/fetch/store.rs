//! The content store under `/var/lib/kubeslot/blobs/sha256/`: verified blobs
//! only, reused across activations.
//!
//! Given a [`Source`] and the descriptors an image needs, [`Store::fetch`]
//! streams each missing blob into `sha256/.partial-<hex>`, hashing and
//! counting while it writes, and renames it to `sha256/<hex>` (after fsync of
//! the file, then of the directory) only when size and digest match. A blob
//! already present is reused without a request, after its bytes are hashed
//! again: a stored blob that no longer matches its name (disk damage, an
//! edit) is removed and downloaded once more, never reused. A download cut off by the
//! network keeps its partial file, and the next run asks for the rest with
//! `Range` (re-hashing what it has); a partial whose bytes turn out wrong is
//! deleted, so a bad partial is never counted as good and never reused twice.
//! [`FetchReport`] says what was downloaded and what was reused (the
//! activation report and the e2e "one changed layer" check read it).
//!
//! Each image's platform manifest is stored beside its blobs (the list
//! [`crate::host::gc`] keeps by). It does not decide which blobs an image needs
//! ([`kubeslot_image::source`]), check signatures, or collect garbage.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use kubeslot_image::atomic;
use kubeslot_image::digest::{Digest, Hasher, HashingReader};
use kubeslot_image::layout::{BlobDir, LayoutError};
use kubeslot_image::oci::Descriptor;
use kubeslot_image::source::{SelectedImage, Source, SourceError};
use rustix::fs::{flock, FlockOperation};
use serde::{Deserialize, Serialize};

use crate::progress;

/// What one fetch did, in blobs and bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchReport {
    /// Blobs (config and layers) transferred in this run.
    pub downloaded_blobs: u64,
    /// Bytes transferred in this run (not counting resumed prefixes).
    pub downloaded_bytes: u64,
    /// Blobs already in the store.
    pub reused_blobs: u64,
    pub reused_bytes: u64,
    /// Layers among the downloaded / reused blobs.
    pub downloaded_layers: u64,
    pub reused_layers: u64,
    /// Bytes of partial files from an earlier, interrupted run that were
    /// kept and continued with `Range`.
    pub resumed_bytes: u64,
    /// Stored blobs whose bytes no longer matched their digest when they
    /// were about to be reused (disk damage, a hand edit): removed and
    /// downloaded again (counted among the downloaded blobs).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub corrupt_replaced: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Why a blob could not be stored; every variant names the blob.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("content store {path}: {error}")]
    Io { path: PathBuf, error: io::Error },
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("blob {digest}: download from {endpoint} stopped at {have} of {size} bytes: {error} (the partial file is kept; the next run continues it)")]
    Interrupted {
        digest: Digest,
        endpoint: String,
        have: u64,
        size: u64,
        error: io::Error,
    },
    #[error("blob {digest}: {path} is locked by another download ({error})")]
    Busy {
        digest: Digest,
        path: PathBuf,
        error: io::Error,
    },
    #[error("blob {digest}: {endpoint} served more than the {size} bytes its descriptor names (partial deleted)")]
    TooLong {
        digest: Digest,
        endpoint: String,
        size: u64,
    },
    #[error("blob {digest}: {endpoint} holds {have} bytes, its descriptor names {size} (refused; a local blob does not grow)")]
    TooShort {
        digest: Digest,
        endpoint: String,
        have: u64,
        size: u64,
    },
    #[error(
        "blob {digest}: content from {endpoint} hashes to {actual} (refused; partial deleted)"
    )]
    DigestMismatch {
        digest: Digest,
        endpoint: String,
        actual: Digest,
    },
}

/// The content store.
#[derive(Clone, Debug)]
pub struct Store {
    blobs: BlobDir,
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        error: source,
    }
}

impl Store {
    /// Opens (creating) the store rooted at `dir` (which holds `sha256/`).
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        Ok(Store {
            blobs: BlobDir::create(dir)?,
        })
    }

    pub fn blobs(&self) -> &BlobDir {
        &self.blobs
    }

    /// The partial file of a blob being downloaded.
    pub fn partial_path(&self, digest: &Digest) -> PathBuf {
        self.blobs
            .root()
            .join("sha256")
            .join(format!(".partial-{}", digest.hex()))
    }

    /// Opens a stored blob (verified when it was stored).
    pub fn open_blob(&self, digest: &Digest) -> Result<File, StoreError> {
        Ok(self.blobs.open_blob(digest)?)
    }

    /// Makes sure the config and every layer of `image` are in the store.
    pub fn fetch_image(
        &self,
        source: &Source,
        image: &SelectedImage,
    ) -> Result<FetchReport, StoreError> {
        let mut report = FetchReport::default();
        self.fetch(source, &image.manifest.config, false, &mut report)?;
        for (layer, _, _) in &image.layers {
            self.fetch(source, layer, true, &mut report)?;
        }
        // The platform manifest too (already read and checked while
        // selecting: no request): it is what garbage collection reads to
        // know which blobs a slot's image needs.
        let m = &image.manifest_descriptor;
        if !self.blobs.contains(&m.digest) {
            let bytes = source.read_blob(m, kubeslot_image::layout::MAX_DOCUMENT_BYTES)?;
            self.blobs.put_bytes(&bytes)?;
        }
        Ok(report)
    }

    /// Makes sure the blob `desc` is in the store, downloading (or
    /// continuing) it when it is not.
    pub fn fetch(
        &self,
        source: &Source,
        desc: &Descriptor,
        is_layer: bool,
        report: &mut FetchReport,
    ) -> Result<(), StoreError> {
        let final_path = self.blobs.path(&desc.digest);
        match fs::symlink_metadata(&final_path) {
            Ok(m) if m.is_file() && m.len() == desc.size => {
                // Stored means verified once, not still intact: a blob is
                // hashed again before each reuse, and a damaged one is
                // replaced, never unpacked.
                if self.intact(&final_path, &desc.digest)? {
                    report.reused_blobs += 1;
                    report.reused_bytes += desc.size;
                    report.reused_layers += u64::from(is_layer);
                    return Ok(());
                }
                progress::line(|| {
                    format!(
                        "blob {}: stored bytes do not match the digest; fetching it again",
                        progress::short(&desc.digest)
                    )
                });
                report.corrupt_replaced += 1;
                fs::remove_file(&final_path).map_err(io_err(&final_path))?;
            }
            // Only verified blobs get this name; anything else here (wrong
            // size, not a file) is damage: remove it and fetch again.
            Ok(m) if m.is_dir() => fs::remove_dir_all(&final_path).map_err(io_err(&final_path))?,
            Ok(_) => fs::remove_file(&final_path).map_err(io_err(&final_path))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(&final_path)(e)),
        }
        match self.download(source, desc, report) {
            Err(StoreError::DigestMismatch { .. }) if report_resumed(report) => {
                // The kept prefix may have come from another endpoint or an
                // earlier, bad run: start over once from zero.
                report.resumed_bytes = 0;
                self.download(source, desc, report)?;
            }
            other => other?,
        }
        report.downloaded_blobs += 1;
        report.downloaded_layers += u64::from(is_layer);
        Ok(())
    }

    /// Whether the stored file at `path` still hashes to `digest`.
    fn intact(&self, path: &Path, digest: &Digest) -> Result<bool, StoreError> {
        let f = File::open(path).map_err(io_err(path))?;
        let mut reader = HashingReader::new(f);
        io::copy(&mut reader, &mut io::sink()).map_err(io_err(path))?;
        Ok(reader.finish().0 == *digest)
    }

    /// Streams `desc` into its partial file, continuing a kept prefix, and
    /// renames it into place when it checks out.
    fn download(
        &self,
        source: &Source,
        desc: &Descriptor,
        report: &mut FetchReport,
    ) -> Result<(), StoreError> {
        let digest = desc.digest;
        let size = desc.size;
        let partial = self.partial_path(&digest);
        let mut out = OpenOptions::new()
            .create(true)
            .read(true)
            .write(true)
            .truncate(false)
            .open(&partial)
            .map_err(io_err(&partial))?;
        // One writer per partial: what we hash must be what is on disk when
        // it is renamed into place. Another process downloading the same
        // blob makes this run fail instead of interleaving.
        flock(&out, FlockOperation::NonBlockingLockExclusive).map_err(|e| StoreError::Busy {
            digest,
            path: partial.clone(),
            error: e.into(),
        })?;
        let (mut have, mut hasher) = kept_prefix(&out, size, &partial)?;
        let stream = source.open_blob(desc, have)?;
        if stream.start != have {
            // The endpoint ignored Range: start from zero.
            have = 0;
            hasher = Hasher::new();
        }
        out.set_len(have).map_err(io_err(&partial))?;
        io::Seek::seek(&mut out, io::SeekFrom::Start(have)).map_err(io_err(&partial))?;
        report.resumed_bytes += have;

        let endpoint = stream.endpoint;
        let mut meter = progress::Meter::start(
            format!("blob {}", progress::short(&digest)),
            size,
            have,
            &endpoint,
        );
        let mut reader = stream.reader.take((size - have).saturating_add(1));
        let mut buf = vec![0u8; 1 << 20];
        let mut got = have;
        let interrupted = |got: u64, error: io::Error, out: &File| {
            // Keep what arrived, durably, so the next run continues it.
            let _ = out.sync_all();
            StoreError::Interrupted {
                digest,
                endpoint: endpoint.clone(),
                have: got,
                size,
                error,
            }
        };
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(interrupted(got, e, &out)),
            };
            if got + n as u64 > size {
                drop(out);
                fs::remove_file(&partial).map_err(io_err(&partial))?;
                return Err(StoreError::TooLong {
                    digest,
                    endpoint,
                    size,
                });
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n]).map_err(io_err(&partial))?;
            got += n as u64;
            report.downloaded_bytes += n as u64;
            meter.advance(got);
        }
        if got < size && !source.is_registry() {
            // A layout or archive is read whole: a short blob is a wrong
            // descriptor, not an interrupted transfer worth resuming.
            drop(out);
            fs::remove_file(&partial).map_err(io_err(&partial))?;
            return Err(StoreError::TooShort {
                digest,
                endpoint,
                have: got,
                size,
            });
        }
        if got < size {
            return Err(interrupted(
                got,
                io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed early"),
                &out,
            ));
        }
        let actual = hasher.finish();
        if actual != digest {
            drop(out);
            fs::remove_file(&partial).map_err(io_err(&partial))?;
            return Err(StoreError::DigestMismatch {
                digest,
                endpoint,
                actual,
            });
        }
        out.sync_all().map_err(io_err(&partial))?;
        drop(out);
        let final_path = self.blobs.path(&digest);
        fs::rename(&partial, &final_path).map_err(io_err(&final_path))?;
        atomic::sync_dir(&self.blobs.root().join("sha256")).map_err(LayoutError::from)?;
        meter.finish(got);
        Ok(())
    }
}

/// How much of a partial file is kept (nothing when it is longer than the
/// blob or shorter than it says), and the hash of that prefix: re-hashed,
/// since it was never trusted, only kept.
fn kept_prefix(out: &File, size: u64, partial: &Path) -> Result<(u64, Hasher), StoreError> {
    let len = out.metadata().map_err(io_err(partial))?.len();
    let have = if len <= size { len } else { 0 };
    let mut hasher = Hasher::new();
    if have == 0 {
        return Ok((0, hasher));
    }
    let mut buf = vec![0u8; 1 << 20];
    let mut reader = out.take(have);
    loop {
        let n = reader.read(&mut buf).map_err(io_err(partial))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    if hasher.len() != have {
        return Ok((0, Hasher::new()));
    }
    Ok((have, hasher))
}

fn report_resumed(report: &FetchReport) -> bool {
    report.resumed_bytes > 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeslot_image::layout::Layout;
    use kubeslot_image::oci::{Index, MEDIA_TYPE_LAYER_TAR};
    use kubeslot_image::reference::ImageSource;

    fn layout_with(blob: &[u8]) -> (tempfile::TempDir, Source, Descriptor) {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::create(dir.path().join("l")).unwrap();
        let d = layout.blobs().put_bytes(blob).unwrap();
        layout
            .write_index(&Index {
                schema_version: 2,
                media_type: None,
                manifests: vec![],
                annotations: Default::default(),
            })
            .unwrap();
        let src: ImageSource = format!("oci:{}", dir.path().join("l").display())
            .parse()
            .unwrap();
        let source = Source::open(&src, &Default::default(), dir.path()).unwrap();
        (
            dir,
            source,
            Descriptor::new(MEDIA_TYPE_LAYER_TAR, d, blob.len() as u64),
        )
    }

    #[test]
    fn downloads_then_reuses() {
        let (dir, source, desc) = layout_with(b"layer bytes");
        let store = Store::open(&dir.path().join("store")).unwrap();
        let mut r = FetchReport::default();
        store.fetch(&source, &desc, true, &mut r).unwrap();
        store.fetch(&source, &desc, true, &mut r).unwrap();
        assert_eq!((r.downloaded_layers, r.reused_layers), (1, 1));
        assert_eq!(r.downloaded_bytes, 11);
        assert!(store.blobs().contains(&desc.digest));
    }

    #[test]
    fn a_damaged_stored_blob_is_fetched_again_not_reused() {
        let (dir, source, desc) = layout_with(b"layer bytes");
        let store = Store::open(&dir.path().join("store")).unwrap();
        store
            .fetch(&source, &desc, true, &mut FetchReport::default())
            .unwrap();
        // same size, other bytes: what a size check cannot see
        let stored = store.blobs().path(&desc.digest);
        fs::write(&stored, b"LAYER BYTES").unwrap();
        let mut r = FetchReport::default();
        store.fetch(&source, &desc, true, &mut r).unwrap();
        assert_eq!(
            (r.reused_layers, r.downloaded_layers, r.corrupt_replaced),
            (0, 1, 1)
        );
        assert_eq!(fs::read(&stored).unwrap(), b"layer bytes");
        // intact now: reused
        let mut r = FetchReport::default();
        store.fetch(&source, &desc, true, &mut r).unwrap();
        assert_eq!((r.reused_layers, r.corrupt_replaced), (1, 0));
    }

    #[test]
    fn continues_a_good_partial_and_discards_a_bad_one() {
        let (dir, source, desc) = layout_with(b"0123456789abcdef");
        let store = Store::open(&dir.path().join("store")).unwrap();
        fs::write(store.partial_path(&desc.digest), b"01234567").unwrap();
        let mut r = FetchReport::default();
        store.fetch(&source, &desc, true, &mut r).unwrap();
        assert_eq!((r.resumed_bytes, r.downloaded_bytes), (8, 8));
        assert!(!store.partial_path(&desc.digest).exists());

        fs::remove_file(store.blobs().path(&desc.digest)).unwrap();
        fs::write(store.partial_path(&desc.digest), b"XXXXXXXX").unwrap();
        let mut r = FetchReport::default();
        store.fetch(&source, &desc, true, &mut r).unwrap();
        assert_eq!(
            r.downloaded_bytes,
            8 + 16,
            "bad prefix: one retry from zero"
        );
        assert_eq!(
            fs::read(store.blobs().path(&desc.digest)).unwrap(),
            b"0123456789abcdef"
        );
    }

    #[test]
    fn a_partial_being_written_elsewhere_is_not_touched() {
        let (dir, source, desc) = layout_with(b"0123456789");
        let store = Store::open(&dir.path().join("store")).unwrap();
        fs::write(store.partial_path(&desc.digest), b"0123").unwrap();
        let other = File::open(store.partial_path(&desc.digest)).unwrap();
        flock(&other, FlockOperation::LockExclusive).unwrap();
        let e = store
            .fetch(&source, &desc, true, &mut FetchReport::default())
            .unwrap_err();
        assert!(matches!(e, StoreError::Busy { .. }), "{e}");
        assert_eq!(fs::read(store.partial_path(&desc.digest)).unwrap(), b"0123");
        drop(other);
        store
            .fetch(&source, &desc, true, &mut FetchReport::default())
            .unwrap();
        assert!(store.blobs().contains(&desc.digest));
    }

    #[test]
    fn wrong_content_leaves_nothing() {
        let (dir, source, mut desc) = layout_with(b"real");
        let store = Store::open(&dir.path().join("store")).unwrap();
        // A descriptor promising other bytes under the same name.
        let evil = Digest::of(b"evil");
        let sha = dir.path().join("l/blobs/sha256");
        fs::rename(sha.join(desc.digest.hex()), sha.join(evil.hex())).unwrap();
        desc.digest = evil;
        let e = store
            .fetch(&source, &desc, true, &mut FetchReport::default())
            .unwrap_err();
        assert!(matches!(e, StoreError::DigestMismatch { .. }), "{e}");
        assert_eq!(
            fs::read_dir(dir.path().join("store/sha256"))
                .unwrap()
                .count(),
            0
        );
    }
}
