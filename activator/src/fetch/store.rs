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

impl FetchReport {
    /// Adds what another fetch (of other blobs) did.
    pub fn add(&mut self, other: &FetchReport) {
        self.downloaded_blobs += other.downloaded_blobs;
        self.downloaded_bytes += other.downloaded_bytes;
        self.reused_blobs += other.reused_blobs;
        self.reused_bytes += other.reused_bytes;
        self.downloaded_layers += other.downloaded_layers;
        self.reused_layers += other.reused_layers;
        self.resumed_bytes += other.resumed_bytes;
        self.corrupt_replaced += other.corrupt_replaced;
    }
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
        self.store_manifest(source, image)?;
        Ok(report)
    }

    /// Stores the platform manifest of `image` (already read and checked
    /// while selecting: no request), once its config and layers are in:
    /// it is what garbage collection reads to know which blobs a slot's
    /// image needs.
    pub fn store_manifest(&self, source: &Source, image: &SelectedImage) -> Result<(), StoreError> {
        let m = &image.manifest_descriptor;
        if !self.blobs.contains(&m.digest) {
            let bytes = source.read_blob(m, kubeslot_image::layout::MAX_DOCUMENT_BYTES)?;
            self.blobs.put_bytes(&bytes)?;
        }
        Ok(())
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
        if self.reuse(desc, is_layer, report)? {
            return Ok(());
        }
        self.fetch_missing(source, desc, is_layer, report)
    }

    /// Makes sure layer `desc` is in the store as [`Store::fetch`] does,
    /// and when it is downloaded from its first byte, hands `consume` a
    /// reader of the bytes as they arrive (each written to the partial file
    /// and hashed before `consume` sees it): the layer is unpacked while it
    /// downloads. The digest is checked at the end, after `consume`
    /// returned and what it left unread was read: on any error (a digest
    /// that does not match, a cut connection) the caller must throw away
    /// what `consume` made. `Ok(None)`: nothing was streamed, the blob is in
    /// the store (it was there, was continued from a kept partial, or came
    /// from a layout or archive, read whole as before): read it from there.
    pub fn fetch_streaming<T>(
        &self,
        source: &Source,
        desc: &Descriptor,
        report: &mut FetchReport,
        consume: impl FnOnce(&mut dyn Read) -> T,
    ) -> Result<Option<T>, StoreError> {
        if self.reuse(desc, true, report)? {
            return Ok(None);
        }
        let partial = self.partial_path(&desc.digest);
        let kept = fs::symlink_metadata(&partial).is_ok_and(|m| m.len() > 0);
        if kept || !source.is_registry() {
            self.fetch_missing(source, desc, true, report)?;
            return Ok(None);
        }
        let consumed = self.transfer(source, desc, false, report, consume)?;
        report.downloaded_blobs += 1;
        report.downloaded_layers += 1;
        Ok(Some(consumed))
    }

    /// Whether `desc` is stored and intact (counted as reused); a damaged
    /// stored blob is removed (counted) so that it is downloaded again.
    fn reuse(
        &self,
        desc: &Descriptor,
        is_layer: bool,
        report: &mut FetchReport,
    ) -> Result<bool, StoreError> {
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
                    return Ok(true);
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
        Ok(false)
    }

    /// Downloads `desc`, not in the store, continuing a kept partial.
    fn fetch_missing(
        &self,
        source: &Source,
        desc: &Descriptor,
        is_layer: bool,
        report: &mut FetchReport,
    ) -> Result<(), StoreError> {
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
        // Every byte goes through the tee; a failure is the tee's own.
        self.transfer(source, desc, true, report, drain)
    }

    /// Downloads `desc` into its partial file (continuing a kept prefix
    /// when `resume`, else from zero) while `consume` reads the same bytes
    /// in order, then reads what `consume` left, and renames the partial
    /// into place only when size and digest match. `consume`'s result is
    /// returned whatever the store decided: the caller keeps it only on
    /// `Ok`. `consume` sees an error from the reader when the transfer
    /// fails (the network, more bytes than the descriptor names, a write of
    /// the partial); the store's error, not `consume`'s, names it.
    fn transfer<T>(
        &self,
        source: &Source,
        desc: &Descriptor,
        resume: bool,
        report: &mut FetchReport,
        consume: impl FnOnce(&mut dyn Read) -> T,
    ) -> Result<T, StoreError> {
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
        let (mut have, mut hasher) = if resume {
            kept_prefix(&out, size, &partial)?
        } else {
            (0, Hasher::new())
        };
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
        let meter = progress::Meter::start(
            format!("blob {}", progress::short(&digest)),
            size,
            have,
            &endpoint,
        );
        let mut tee = Tee {
            reader: stream.reader.take((size - have).saturating_add(1)),
            out,
            hasher,
            got: have,
            size,
            meter,
            fail: None,
        };
        let consumed = consume(&mut tee);
        if tee.fail.is_none() {
            // What `consume` did not need (a tar's padding, a compressed
            // trailer, or everything after its refusal) is still the blob.
            drain(&mut tee);
        }
        report.downloaded_bytes += tee.got - have;
        self.settle(source, desc, &endpoint, tee)?;
        Ok(consumed)
    }

    /// What a transfer's [`Tee`] read, judged: the partial renamed into
    /// place when it is the blob; else the error, the partial kept when a
    /// later run can continue it, deleted when its bytes are wrong.
    fn settle(
        &self,
        source: &Source,
        desc: &Descriptor,
        endpoint: &str,
        tee: Tee,
    ) -> Result<(), StoreError> {
        let (digest, size) = (desc.digest, desc.size);
        let endpoint = endpoint.to_string();
        let partial = self.partial_path(&digest);
        let Tee {
            out,
            hasher,
            got,
            meter,
            fail,
            ..
        } = tee;
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
        let remove_partial = |out: File| {
            drop(out);
            fs::remove_file(&partial).map_err(io_err(&partial))
        };
        match fail {
            Some(TeeFail::Read(e)) => return Err(interrupted(got, e, &out)),
            Some(TeeFail::Write(e)) => return Err(io_err(&partial)(e)),
            Some(TeeFail::TooLong) => {
                remove_partial(out)?;
                return Err(StoreError::TooLong {
                    digest,
                    endpoint,
                    size,
                });
            }
            None => {}
        }
        if got < size && !source.is_registry() {
            // A layout or archive is read whole: a short blob is a wrong
            // descriptor, not an interrupted transfer worth resuming.
            remove_partial(out)?;
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
            remove_partial(out)?;
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

/// Reads `r` to its end or its first error (which the reader keeps), 1 MiB
/// at a time.
fn drain(r: &mut dyn Read) {
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match r.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// Why a [`Tee`] stopped: kept, and read again by every later call.
enum TeeFail {
    /// The endpoint's stream failed (the partial is kept).
    Read(io::Error),
    /// The partial file could not be written.
    Write(io::Error),
    /// The endpoint sent more than the descriptor's size.
    TooLong,
}

/// The reader a transfer's consumer gets: the endpoint's bytes, each
/// hashed and written to the partial file before it is handed on.
struct Tee {
    reader: io::Take<Box<dyn Read + Send>>,
    out: File,
    hasher: Hasher,
    got: u64,
    size: u64,
    meter: progress::Meter,
    fail: Option<TeeFail>,
}

impl Read for Tee {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let failed = |f: &TeeFail| match f {
            TeeFail::Read(e) | TeeFail::Write(e) => io::Error::new(e.kind(), e.to_string()),
            TeeFail::TooLong => io::Error::other("the blob is longer than its descriptor says"),
        };
        if let Some(f) = &self.fail {
            return Err(failed(f));
        }
        let n = loop {
            match self.reader.read(buf) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let err = failed(&TeeFail::Read(io::Error::new(e.kind(), e.to_string())));
                    self.fail = Some(TeeFail::Read(e));
                    return Err(err);
                }
            }
        };
        if self.got + n as u64 > self.size {
            self.fail = Some(TeeFail::TooLong);
            return Err(failed(&TeeFail::TooLong));
        }
        if let Err(e) = self.out.write_all(&buf[..n]) {
            let err = failed(&TeeFail::Write(io::Error::new(e.kind(), e.to_string())));
            self.fail = Some(TeeFail::Write(e));
            return Err(err);
        }
        self.hasher.update(&buf[..n]);
        self.got += n as u64;
        self.meter.advance(self.got);
        Ok(n)
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
