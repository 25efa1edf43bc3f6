//! The base-layer cache of `build --layer-cache DIR`.
//!
//! Re-normalising a rootfs tarball into the base layer is most of a build
//! (a 365 MB Debian node rootfs: ~9 s of zstd on 2 cores, the rest of the
//! build under a second), and recipes that share a base (variants of one
//! node, a CI matrix, the e2e's eight node images) write the same blob
//! every time. This module keeps that blob between builds.
//!
//! An entry is named by the sha256 of everything the blob's bytes depend
//! on: this builder's executable (so any change of code is a new key, never
//! a stale hit), the tarball's sha256 (the recipe's pin, or the rootfs a
//! package base installed), the epoch and the compression. The zstd worker
//! count is not in it: the bytes are the same for any count
//! (`rootfs::tests::zstd_layers_are_the_same_bytes_for_any_worker_count`).
//! An entry is a directory `DIR/<key>/` with the blob (`layer`) and its
//! record (`layer.json`: digest, size, diff_id, media type), written into a
//! temp dir in DIR and renamed into place, so a killed build leaves no
//! half entry. A hit copies the blob into the build's staging blob dir and
//! re-hashes it on the way: a blob that does not match its record (a
//! truncated or edited cache) is removed and the layer written anew, with a
//! line that says so. The cache never decides what an image contains: a
//! hit gives the bytes a miss would have written.
//!
//! It owns the directory's entries; nothing here prunes (a new builder
//! makes new keys: remove the directory to reclaim its space).

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use anyhow::Context;
use kubeslot_image::digest::HashingReader;
use kubeslot_image::layout::{BlobDir, LayoutError};
use kubeslot_image::oci::Compression;
use kubeslot_image::Digest;
use serde::{Deserialize, Serialize};

use crate::rootfs::LayerBlob;

/// The entries' format; a new one is a new key for every entry.
const FORMAT: &str = "kubeslot-builder layer cache 1";

/// An open layer cache: its directory and this builder's identity.
pub struct LayerCache {
    dir: PathBuf,
    builder: Digest,
}

/// `layer.json`: what the blob of an entry is.
#[derive(Serialize, Deserialize)]
struct Record {
    digest: Digest,
    size: u64,
    diff_id: Digest,
    media_type: String,
}

/// Why an entry was not used.
pub enum Miss {
    /// No entry for the key.
    Absent,
    /// An entry that does not hold what its record says; removed.
    Discarded(String),
}

impl LayerCache {
    /// Opens (creating) `dir` and hashes this builder's executable.
    pub fn open(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("--layer-cache {}: cannot create it", dir.display()))?;
        let exe = std::env::current_exe().context("--layer-cache: this builder's executable")?;
        let mut reader = HashingReader::new(
            File::open(&exe).with_context(|| format!("--layer-cache: {}", exe.display()))?,
        );
        io::copy(&mut reader, &mut io::sink())
            .with_context(|| format!("--layer-cache: {}", exe.display()))?;
        Ok(LayerCache {
            dir: dir.to_path_buf(),
            builder: reader.finish().0,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The key of the base layer re-normalised from the rootfs tarball
    /// whose sha256 is `tarball` (hex).
    pub fn base_key(&self, tarball: &str, compression: Compression, epoch: u64) -> Digest {
        let text = format!(
            "{FORMAT}\nbuilder {}\nbase-rootfs sha256:{tarball}\nepoch {epoch}\nmedia-type {}\n",
            self.builder,
            compression.layer_media_type()
        );
        Digest::of(text.as_bytes())
    }

    /// The entry `key` copied into `blobs` (re-hashed), or why not. Errors
    /// are the staging blob dir's (a full disk), not the cache's.
    pub fn get(
        &self,
        key: &Digest,
        blobs: &BlobDir,
        compression: Compression,
    ) -> anyhow::Result<Result<LayerBlob, Miss>> {
        let entry = self.dir.join(key.hex());
        let record_path = entry.join("layer.json");
        let bytes = match std::fs::read(&record_path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Err(Miss::Absent)),
            Err(e) => return Ok(Err(self.discard(&entry, format!("{e}")))),
        };
        let record: Record = match serde_json::from_slice(&bytes) {
            Ok(r) => r,
            Err(e) => return Ok(Err(self.discard(&entry, format!("layer.json: {e}")))),
        };
        let media_type = compression.layer_media_type();
        if record.media_type != media_type {
            let why = format!("layer.json names {}, not {media_type}", record.media_type);
            return Ok(Err(self.discard(&entry, why)));
        }
        let blob = match File::open(entry.join("layer")) {
            Ok(f) => f,
            Err(e) => return Ok(Err(self.discard(&entry, format!("layer: {e}")))),
        };
        match blobs.put_verified(&record.digest, Some(record.size), blob) {
            Ok(_) => Ok(Ok(LayerBlob {
                digest: record.digest,
                size: record.size,
                diff_id: record.diff_id,
                media_type,
                path: blobs.path(&record.digest),
            })),
            Err(e @ (LayoutError::DigestMismatch { .. } | LayoutError::SizeMismatch { .. })) => {
                Ok(Err(self.discard(&entry, format!("{e}"))))
            }
            Err(e) => Err(e).context("copying a cached layer into the staging dir"),
        }
    }

    /// Stores `blob` as entry `key` (a hard link when the cache is on the
    /// staging dir's filesystem, else a copy). An entry another build
    /// stored meanwhile is kept.
    pub fn put(&self, key: &Digest, blob: &LayerBlob) -> anyhow::Result<()> {
        let tmp = tempfile::Builder::new()
            .prefix(".tmp-")
            .tempdir_in(&self.dir)
            .with_context(|| self.dir.display().to_string())?;
        let layer = tmp.path().join("layer");
        if std::fs::hard_link(&blob.path, &layer).is_err() {
            std::fs::copy(&blob.path, &layer).with_context(|| layer.display().to_string())?;
        }
        let record = Record {
            digest: blob.digest,
            size: blob.size,
            diff_id: blob.diff_id,
            media_type: blob.media_type.to_string(),
        };
        let json = serde_json::to_vec_pretty(&record).expect("a record serialises");
        let record_path = tmp.path().join("layer.json");
        std::fs::write(&record_path, json).with_context(|| record_path.display().to_string())?;
        let entry = self.dir.join(key.hex());
        match std::fs::rename(tmp.path(), &entry) {
            Ok(()) => {
                // the temp dir is the entry now
                let _ = tmp.keep();
                Ok(())
            }
            Err(_) if entry.join("layer.json").is_file() => Ok(()),
            Err(e) => Err(e).with_context(|| entry.display().to_string()),
        }
    }

    fn discard(&self, entry: &Path, why: String) -> Miss {
        let _ = std::fs::remove_dir_all(entry);
        Miss::Discarded(format!("{}: {why}", entry.display()))
    }
}
