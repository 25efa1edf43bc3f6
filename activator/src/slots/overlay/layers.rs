//! The layer store of overlay slots: each verified layer unpacked once, by
//! the safe unpacker, into `/var/lib/kubeslot/layers/<diff_id hex>`.
//!
//! Given the root handle, the content store (blobs already verified) and a
//! verified image, [`ensure`] makes every layer directory the image needs:
//! a missing one is unpacked alone into `layers/.staging-<hex>-<random>`
//! ([`Unpacker::new_overlay_layer`]: whiteouts recorded as overlayfs
//! whiteouts, never applied), synced, and renamed into place (no replace);
//! a present one is reused only when it still matches its record
//! ([`crate::slots::record`]) and was unpacked under the same unpack policy
//! ([`policy_hash`]), never unpacked again otherwise. One that does not
//! (a file changed, added or chmod-ed in the store, another policy, a
//! record of an earlier version) is never mounted again: it is removed and
//! unpacked afresh, or, while a slot's mount unit still names it, unpacked
//! afresh beside it (`<diff_id hex>-p<policy hash>`) and left to GC. A
//! directory appears under its name only complete, so a crash leaves
//! staging garbage (removed by the next run, which holds the host lock),
//! never a half layer. The store is root's alone (0700, narrowed when an
//! earlier version made it wider): a layer may hold setuid programs and
//! world-writable directories no other user may reach.
//!
//! Nothing here writes into a layer directory once it is in place: overlay
//! mounts use them as read-only lowers. It does not mount, choose slots or
//! remove layers (the overlay and GC code do).

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use kubeslot_image::atomic;
use kubeslot_image::digest::Digest;
use kubeslot_image::source::{SelectedImage, Source};
use kubeslot_image::unpack::{self, Layer, UnpackError, Unpacker};
use rustix::fs::{renameat_with, RenameFlags, CWD};

use crate::fetch::parallel;
use crate::fetch::store::{FetchReport, Store, StoreError};
use crate::paths::Root;
use crate::progress;

/// Why a layer could not be put in the store.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error("unpacking layer {layer} (diff_id {diff_id}) into the layer store: {error}")]
    Unpack {
        layer: Digest,
        diff_id: Digest,
        error: Box<UnpackError>,
    },
    #[error(transparent)]
    Store(#[from] Box<StoreError>),
    #[error("layer {diff_id}: {why}; a slot's mount unit still names {dir}, and so does the other slot's for {alternate}: refusing to reuse or replace them (`verify-layers` names the entries; `rollback --clean` or staging the other slot frees one)")]
    Unusable {
        diff_id: Digest,
        dir: PathBuf,
        alternate: PathBuf,
        why: String,
    },
    #[error("layer store {path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> LayerError + '_ {
    move |error| LayerError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// The layer directories of one image and what it took to have them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ensured {
    /// One directory per layer, in manifest order (bottom layer first).
    pub dirs: Vec<PathBuf>,
    /// Layers unpacked by this call.
    pub unpacked: usize,
    /// Layers already in the store.
    pub reused: usize,
    /// Uncompressed tar bytes of the layers unpacked by this call.
    pub bytes_unpacked: u64,
    /// Layers found in the store but not reused, and why (each was
    /// unpacked again).
    pub replaced: Vec<String>,
}

/// The directory of the layer with `diff_id`.
pub fn layer_dir(root: &Root, diff_id: &Digest) -> PathBuf {
    root.layers_dir().join(diff_id.hex())
}

/// Where a layer is unpacked when its own directory cannot be replaced
/// (a slot's mount unit names it): beside it, named by the policy too.
fn alternate_dir(root: &Root, diff_id: &Digest, policy: &str) -> PathBuf {
    root.layers_dir()
        .join(format!("{}-p{}", diff_id.hex(), &policy[..16]))
}

/// The sha256 of everything in `policy` that decides what a layer may
/// hold, as a record stores it: a layer unpacked under another policy (an
/// allowlisted setuid path removed since, a limit lowered) is unpacked
/// again, under this one, before it is reused.
pub fn policy_hash(policy: &unpack::Policy) -> String {
    // Destructured, so a new field cannot be left out of the hash.
    let unpack::Policy {
        limits,
        allow_fifos_and_sockets,
        setuid_allowlist,
    } = policy;
    let unpack::Limits {
        max_layer_bytes,
        max_total_bytes,
        max_entries,
        max_path_bytes,
        max_depth,
    } = limits;
    let mut allow = setuid_allowlist.clone();
    allow.sort();
    allow.dedup();
    let canonical = serde_json::json!({
        "record": crate::slots::record::VERSION,
        "limits": [max_layer_bytes, max_total_bytes, max_entries, max_path_bytes, max_depth],
        "allow_fifos_and_sockets": allow_fifos_and_sockets,
        "setuid_allowlist": allow,
    });
    Digest::of(canonical.to_string().as_bytes()).hex()
}

/// Why the layer directory `dir` may not be reused under `policy`, if so.
pub fn unusable(dir: &Path, policy: &str) -> Option<String> {
    let record = match crate::slots::record::load(&crate::slots::record::record_path(dir)) {
        Ok(r) => r,
        Err(e) => return Some(format!("its record cannot be used ({e})")),
    };
    if record.policy.as_deref() != Some(policy) {
        return Some("it was unpacked under another unpack policy".into());
    }
    match crate::slots::record::check(dir, &record) {
        Ok(m) if m.is_empty() => None,
        Ok(m) => Some(format!(
            "{} entr{} differ from its record ({})",
            m.len(),
            if m.len() == 1 { "y" } else { "ies" },
            m.iter()
                .take(3)
                .map(|m| format!("/{}: {}", m.path, m.what))
                .collect::<Vec<_>>()
                .join("; ")
        )),
        Err(e) => Some(format!("checking it against its record: {e}")),
    }
}

/// Where a layer (or the metadata layer) comes from: a directory to reuse,
/// or one to unpack into (`replace`: what is there goes first, and why).
pub enum Place {
    Reuse(PathBuf),
    Unpack {
        dest: PathBuf,
        replace: Option<String>,
    },
}

/// Of a layer's own directory and its alternate: the one that matches its
/// record under `policy`; else where to unpack it, never over a directory
/// a slot's mount unit (`keep`) names. `Err(why)` when both are unusable
/// and named by a unit.
pub fn place_in(
    own: &Path,
    alternate: &Path,
    policy: &str,
    keep: &std::collections::BTreeSet<PathBuf>,
) -> Result<Place, String> {
    let mut why = None;
    for dir in [own, alternate] {
        if fs::symlink_metadata(dir).is_ok() {
            match unusable(dir, policy) {
                None => return Ok(Place::Reuse(dir.to_path_buf())),
                Some(w) => why = why.or(Some(w)),
            }
        }
    }
    for dir in [own, alternate] {
        let there = fs::symlink_metadata(dir).is_ok();
        if !there || !keep.contains(dir) {
            return Ok(Place::Unpack {
                dest: dir.to_path_buf(),
                replace: if there { why } else { None },
            });
        }
    }
    Err(why.unwrap_or_default())
}

/// [`place_in`] for layer `diff_id`.
fn place(
    root: &Root,
    diff_id: &Digest,
    policy: &str,
    keep: &std::collections::BTreeSet<PathBuf>,
) -> Result<Place, LayerError> {
    let own = layer_dir(root, diff_id);
    let alternate = alternate_dir(root, diff_id, policy);
    place_in(&own, &alternate, policy, keep).map_err(|why| LayerError::Unusable {
        diff_id: *diff_id,
        dir: own.clone(),
        alternate: alternate.clone(),
        why,
    })
}

/// The directories `image`'s layers are (or would be) in, bottom first.
pub fn dirs_of(root: &Root, image: &SelectedImage) -> Vec<PathBuf> {
    image
        .layers
        .iter()
        .map(|(_, _, diff_id)| layer_dir(root, diff_id))
        .collect()
}

/// Removes the staging directories a killed run left in the layer store.
/// Only for a caller holding the host lock.
pub fn remove_stale(root: &Root) -> Result<(), LayerError> {
    let dir = root.layers_dir();
    let rd = match fs::read_dir(&dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err(&dir)(e)),
    };
    for entry in rd.flatten() {
        if entry.file_name().to_string_lossy().starts_with(".staging-") {
            let p = entry.path();
            crate::remove::remove_tree(&p).map_err(|e| io_err(&p)(e.into_io()))?;
        }
    }
    Ok(())
}

/// Makes sure every layer of `image` (its blobs in `store`) has its
/// directory in the layer store, unpacking only the missing ones.
pub fn ensure(
    root: &Root,
    store: &Store,
    image: &SelectedImage,
    policy: &unpack::Policy,
) -> Result<Ensured, LayerError> {
    ensure_from(
        root,
        store,
        None,
        image,
        policy,
        &mut FetchReport::default(),
    )
}

/// What to do for one layer of the image.
enum Job {
    /// Its directory is there as recorded: only its blob is made sure of.
    Reuse,
    /// Unpack it into `dest`.
    Unpack(PathBuf),
    /// The same `diff_id` as an earlier layer of the image (its directory
    /// is that one's): only its blob, after the others.
    Again,
}

/// [`ensure`], with the blobs fetched from `source` when given (counted in
/// `report`): a missing layer is unpacked while it downloads
/// ([`Store::fetch_streaming`]), up to [`parallel::LAYERS_AT_ONCE`] layers
/// at once, each into its own staging directory, renamed into place only
/// once its digest checked out; one already in the content store is
/// unpacked from there. Without `source` every blob must be in `store`.
pub fn ensure_from(
    root: &Root,
    store: &Store,
    source: Option<&Source>,
    image: &SelectedImage,
    policy: &unpack::Policy,
    report: &mut FetchReport,
) -> Result<Ensured, LayerError> {
    let base = root.layers_dir();
    crate::paths::private_dir(&base).map_err(|e| LayerError::Io {
        path: e.path,
        error: e.source,
    })?;
    remove_stale(root)?;
    let keep = referenced(root)?;
    let policy_hash = policy_hash(policy);
    let count = image.layers.len();
    let mut out = Ensured::default();
    let mut jobs = Vec::with_capacity(count);
    for (index, (desc, _, diff_id)) in image.layers.iter().enumerate() {
        if let Some(i) = image.layers[..index].iter().position(|l| l.2 == *diff_id) {
            out.dirs.push(out.dirs[i].clone());
            out.reused += 1;
            jobs.push(Job::Again);
            continue;
        }
        match place(root, diff_id, &policy_hash, &keep)? {
            Place::Reuse(dir) => {
                progress::line(|| {
                    format!(
                        "layer {}/{count} {}: in the layer store, as recorded",
                        index + 1,
                        progress::short(&desc.digest)
                    )
                });
                out.dirs.push(dir);
                out.reused += 1;
                jobs.push(Job::Reuse);
            }
            Place::Unpack { dest, replace } => {
                if let Some(why) = replace {
                    // Never mounted again; no slot's unit names it.
                    progress::line(|| {
                        format!("layer {}: {why}: unpacking it again", dest.display())
                    });
                    remove_recorded(&dest)?;
                    out.replaced.push(format!("{diff_id}: {why}"));
                }
                out.dirs.push(dest.clone());
                jobs.push(Job::Unpack(dest));
            }
        }
    }
    let done = parallel::each(count, parallel::LAYERS_AT_ONCE, |index| {
        let mut report = FetchReport::default();
        let desc = &image.layers[index].0;
        let bytes = match (&jobs[index], source) {
            (Job::Unpack(dest), _) => {
                let one = One {
                    base: &base,
                    store,
                    source,
                    image,
                    index,
                    policy,
                    policy_hash: &policy_hash,
                };
                Some(one.unpack(dest, &mut report)?)
            }
            (Job::Reuse, Some(source)) => {
                store
                    .fetch(source, desc, true, &mut report)
                    .map_err(Box::new)?;
                None
            }
            _ => None,
        };
        Ok::<_, LayerError>((bytes, report))
    })?;
    for (bytes, r) in done {
        report.add(&r);
        if let Some(bytes) = bytes {
            out.unpacked += 1;
            out.bytes_unpacked += bytes;
        }
    }
    if let Some(source) = source {
        for (index, (desc, _, _)) in image.layers.iter().enumerate() {
            if matches!(jobs[index], Job::Again) {
                store.fetch(source, desc, true, report).map_err(Box::new)?;
            }
        }
    }
    Ok(out)
}

/// One layer to unpack into the layer store.
struct One<'a> {
    base: &'a Path,
    store: &'a Store,
    source: Option<&'a Source>,
    image: &'a SelectedImage,
    index: usize,
    policy: &'a unpack::Policy,
    policy_hash: &'a str,
}

impl One<'_> {
    /// Unpacks the layer into a staging directory (while it downloads, when
    /// it is not in the store yet) and renames that to `dest` once the
    /// blob checked out; returns its uncompressed bytes. On any error the
    /// staging directory is removed: nothing of the layer is kept.
    fn unpack(&self, dest: &Path, report: &mut FetchReport) -> Result<u64, LayerError> {
        let (desc, compression, diff_id) = &self.image.layers[self.index];
        let count = self.image.layers.len();
        progress::line(|| {
            format!(
                "layer {}/{count} {}: unpacking {} into the layer store",
                self.index + 1,
                progress::short(&desc.digest),
                progress::human(desc.size)
            )
        });
        let base = self.base;
        let staging = tempfile::Builder::new()
            .prefix(&format!(".staging-{}-", diff_id.hex()))
            .tempdir_in(base)
            .map_err(io_err(base))?;
        {
            // tempdir makes 0700; a layer's root is 0755 unless it says otherwise.
            use std::os::unix::fs::PermissionsExt as _;
            fs::set_permissions(staging.path(), fs::Permissions::from_mode(0o755))
                .map_err(io_err(staging.path()))?;
        }
        let apply = |reader: &mut dyn Read| -> Result<_, UnpackError> {
            let mut unpacker = Unpacker::new_overlay_layer(staging.path(), self.policy.clone())?;
            unpacker.hash_files();
            let stats = unpacker.apply(Layer {
                index: self.index,
                digest: desc.digest,
                diff_id: *diff_id,
                compression: *compression,
                reader,
            })?;
            let hashes = unpacker.take_file_hashes();
            unpacker.finish()?;
            Ok((stats, hashes))
        };
        let streamed = match self.source {
            Some(source) => self
                .store
                .fetch_streaming(source, desc, report, apply)
                .map_err(Box::new)?,
            None => None,
        };
        let applied = match streamed {
            Some(applied) => applied,
            None => apply(&mut self.store.open_blob(&desc.digest).map_err(Box::new)?),
        };
        let (stats, hashes) = applied.map_err(|error| LayerError::Unpack {
            layer: desc.digest,
            diff_id: *diff_id,
            error: Box::new(error),
        })?;
        place_recorded(staging, dest, self.policy_hash, &hashes)?;
        Ok(stats.bytes)
    }
}

/// Records the tree in `staging` (made under `policy_hash`; the files'
/// hashes from `known`, the unpacker's, where it has them) and renames it
/// to `dest` in the same directory, never over anything there. The record
/// first: a layer directory never exists without it (`verify-layers`
/// checks the layer against it).
pub fn place_recorded(
    staging: tempfile::TempDir,
    dest: &Path,
    policy_hash: &str,
    known: &unpack::FileHashes,
) -> Result<(), LayerError> {
    let (record, _) =
        crate::slots::record::record_known(staging.path(), Some(policy_hash.to_string()), known)
            .map_err(io_err(staging.path()))?;
    let record_path = crate::slots::record::record_path(dest);
    crate::slots::record::save(&record_path, &record).map_err(io_err(&record_path))?;
    renameat_with(CWD, staging.path(), CWD, dest, RenameFlags::NOREPLACE)
        .map_err(|e| io_err(dest)(std::io::Error::from(e)))?;
    // Renamed away: the TempDir's drop finds nothing to delete.
    drop(staging);
    let parent = dest.parent().unwrap_or(Path::new("/"));
    atomic::sync_dir(parent).map_err(|e| LayerError::Io {
        path: e.path,
        error: e.source,
    })
}

/// The layer directories the installed overlay slots mount (both slots'
/// mount units, read from their `Options=` lowerdir lists).
pub fn referenced(root: &Root) -> Result<std::collections::BTreeSet<PathBuf>, LayerError> {
    let mut keep = std::collections::BTreeSet::new();
    for slot in crate::slot::Slot::ALL {
        let lowers = crate::slots::overlay::lowers(root, slot)
            .map_err(|e| io_err(&root.mount_unit_file(slot.machine()))(e))?;
        keep.extend(lowers);
    }
    Ok(keep)
}

/// The entries of the layer store neither slot's mount unit references
/// (layer dirs, staging dirs, probes), records aside; sorted.
pub fn unreferenced(root: &Root) -> Result<Vec<PathBuf>, LayerError> {
    let keep = referenced(root)?;
    let dir = root.layers_dir();
    let rd = match fs::read_dir(&dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(&dir)(e)),
    };
    let mut out = Vec::new();
    for entry in rd {
        let p = entry.map_err(io_err(&dir))?.path();
        if !keep.contains(&p) && !is_record(&p) {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

fn is_record(p: &Path) -> bool {
    p.to_str().is_some_and(|s| s.ends_with(".files"))
}

/// Removes a layer directory that will not be reused, and its record
/// (never one a slot's unit names: [`place_in`] gave it to be replaced).
pub fn remove_recorded(dir: &Path) -> Result<(), LayerError> {
    crate::remove::remove_tree(dir).map_err(|e| io_err(dir)(e.into_io()))?;
    remove_file_if_there(&crate::slots::record::record_path(dir))
}

/// Removes file `p`; a missing one is no error.
fn remove_file_if_there(p: &Path) -> Result<(), LayerError> {
    match fs::remove_file(p) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_err(p)(e)),
        _ => Ok(()),
    }
}

/// Removes what [`unreferenced`] lists, each layer with its record, and
/// records whose layer is gone (a crash between the two removals); returns
/// what it removed. Only for a caller holding the host lock (no staging is
/// under way); never follows a symlink.
pub fn sweep(root: &Root) -> Result<Vec<PathBuf>, LayerError> {
    let removed = unreferenced(root)?;
    for p in &removed {
        // Staging dirs and probes go too: nothing else runs under the lock.
        match fs::symlink_metadata(p).map_err(io_err(p))?.file_type() {
            t if t.is_dir() => {
                crate::remove::remove_tree(p).map_err(|e| io_err(p)(e.into_io()))?;
                remove_file_if_there(&crate::slots::record::record_path(p))?;
            }
            _ => fs::remove_file(p).map_err(io_err(p))?,
        }
    }
    let dir = root.layers_dir();
    if let Ok(rd) = fs::read_dir(&dir) {
        for entry in rd {
            let p = entry.map_err(io_err(&dir))?.path();
            let layer = p.to_str().and_then(|s| s.strip_suffix(".files"));
            if layer.is_some_and(|l| !Path::new(l).exists()) {
                remove_file_if_there(&p)?;
            }
        }
    }
    Ok(removed)
}
