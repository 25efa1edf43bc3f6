//! Garbage collection of the content store and the layer store: keep what
//! the two slots' images reference, remove the rest.
//!
//! The keep-set comes from the state: for every slot (and a pending flip)
//! that records an image, its platform manifest as stored beside the blobs
//! ([`crate::fetch::store`] stores it) and the config and layers it names. A
//! recorded image whose manifest is not in the store (a store from an
//! earlier version, or damage) makes the blob sweep keep everything: an
//! incomplete keep-set never removes a blob a slot may need. Partial
//! downloads (`.partial-<hex>`) go unless a live fetch holds their lock.
//! Layer directories go when neither slot's mount unit names them
//! ([`crate::slots::overlay::layers::referenced`]). The caller holds the run lock.
//!
//! It runs after every commit (`activate`; a failure there is a note in the
//! report, the commit stands) and as `kubeslot-activator gc [--dry-run]`.

use std::collections::BTreeSet;
use std::fs::{self, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use kubeslot_image::digest::Digest;
use kubeslot_image::oci::Manifest;
use rustix::fs::{flock, FlockOperation};
use serde::Serialize;

use crate::paths::Root;
use crate::slots::overlay::layers;
use crate::state::State;

/// What a collection removed (or, dry, would remove).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GcReport {
    pub dry_run: bool,
    /// Blobs kept because a slot's image references them.
    pub kept_blobs: usize,
    /// Blob digests removed.
    pub removed_blobs: Vec<Digest>,
    /// Stale partial downloads removed.
    pub removed_partials: Vec<PathBuf>,
    /// Layer directories removed.
    pub removed_layers: Vec<PathBuf>,
    /// Offline bundle copies neither slot's `.nspawn` file binds (host
    /// paths, `/var/lib/kubeslot/bundles/<key>`).
    pub removed_bundles: Vec<PathBuf>,
    /// Bytes freed by the removed blobs and partials (layer directories'
    /// bytes are not counted).
    pub bytes_freed: u64,
    /// Why blobs were kept wholesale, when the keep-set was incomplete.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept_all_because: Option<String>,
}

impl GcReport {
    /// One line for the report and the command's text output.
    pub fn summary(&self) -> String {
        format!(
            "{}{} blob(s), {} partial(s), {} layer dir(s){}; {} bytes freed; {} blob(s) kept{}",
            if self.dry_run {
                "would remove "
            } else {
                "removed "
            },
            self.removed_blobs.len(),
            self.removed_partials.len(),
            self.removed_layers.len(),
            match self.removed_bundles.len() {
                0 => String::new(),
                n => format!(", {n} bundle copy(ies)"),
            },
            self.bytes_freed,
            self.kept_blobs,
            self.kept_all_because
                .as_ref()
                .map_or(String::new(), |w| format!(" (every blob kept: {w})"))
        )
    }
}

/// Why a collection stopped: the path and the error.
#[derive(Debug, thiserror::Error)]
pub enum GcError {
    #[error("gc: {path}: {error}")]
    Io { path: PathBuf, error: io::Error },
    #[error("gc: {0}")]
    Layers(#[from] layers::LayerError),
    #[error("gc: {0}")]
    Bundles(#[from] crate::render::bundle::BundleError),
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> GcError + '_ {
    move |error| GcError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// The blobs the slots' images need, or why that cannot be known.
fn keep_set(root: &Root, state: &State) -> Result<BTreeSet<Digest>, String> {
    let store = root.store().join("sha256");
    let mut images: Vec<Digest> = state.slots.values().filter_map(|s| s.digest).collect();
    images.extend(state.pending.as_ref().and_then(|p| p.digest));
    let mut keep = BTreeSet::new();
    for d in images {
        let bytes = fs::read(store.join(d.hex()))
            .map_err(|e| format!("the manifest {d} of a slot's image is not in the store ({e})"))?;
        if Digest::of(&bytes) != d {
            return Err(format!("the stored manifest {d} does not match its digest"));
        }
        let m: Manifest = serde_json::from_slice(&bytes)
            .map_err(|e| format!("the stored manifest {d} does not parse ({e})"))?;
        keep.insert(d);
        keep.insert(m.config.digest);
        keep.extend(m.layers.iter().map(|l| l.digest));
    }
    Ok(keep)
}

/// Collects (or, with `dry_run`, lists) what no slot references.
pub fn collect(root: &Root, state: &State, dry_run: bool) -> Result<GcReport, GcError> {
    let mut report = GcReport {
        dry_run,
        ..GcReport::default()
    };
    let dir = root.store().join("sha256");
    let keep = keep_set(root, state);
    if let Err(why) = &keep {
        report.kept_all_because = Some(why.clone());
    }
    let entries = match fs::read_dir(&dir) {
        Ok(rd) => rd.collect::<Result<Vec<_>, _>>().map_err(io_err(&dir))?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io_err(&dir)(e)),
    };
    for entry in entries {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let meta = entry.metadata().map_err(io_err(&path))?;
        if let Some(hex) = name.strip_prefix(".partial-") {
            if hex.len() != 64 || !meta.is_file() {
                continue;
            }
            // A live fetch holds the partial's lock: not ours to remove.
            let f = OpenOptions::new()
                .read(true)
                .open(&path)
                .map_err(io_err(&path))?;
            if flock(&f, FlockOperation::NonBlockingLockExclusive).is_err() {
                continue;
            }
            if !dry_run {
                fs::remove_file(&path).map_err(io_err(&path))?;
            }
            report.bytes_freed += meta.len();
            report.removed_partials.push(path);
            continue;
        }
        let Ok(digest) = Digest::from_hex(&name) else {
            continue;
        };
        match &keep {
            Ok(keep) if !keep.contains(&digest) => {
                if !dry_run {
                    fs::remove_file(&path).map_err(io_err(&path))?;
                }
                report.bytes_freed += meta.len();
                report.removed_blobs.push(digest);
            }
            _ => report.kept_blobs += 1,
        }
    }
    report.removed_blobs.sort();
    report.removed_partials.sort();
    report.removed_layers = if dry_run {
        layers::unreferenced(root)?
    } else {
        layers::sweep(root)?
    };
    report.removed_bundles = crate::render::bundle::prune(root, dry_run)?;
    Ok(report)
}
