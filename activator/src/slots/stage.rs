//! Staging an image: resolve → verify → fetch into the content store →
//! unpack into a private directory → swap it into place.
//!
//! Given the root handle and the config (image, registries, trust), [`stage`]
//! produces a verified tree at `<machines>/<slot>`: the tag is resolved once,
//! the signature is checked before any layer is fetched
//! ([`kubeslot_image::verify`]), blobs land in the content store only after their
//! digest checked out ([`crate::fetch::store`]), and the layers are applied by the
//! safe unpacker ([`kubeslot_image::unpack`]) into `<machines>/.staging-<slot>-<random>`
//! (same filesystem), synced, and exchanged with the old tree in one
//! `renameat2(RENAME_EXCHANGE)`; the old tree is deleted only after that. On
//! any error the staging directory is removed and the old tree is untouched.
//! [`resolve_and_verify`] is the first half on its own, for the builder to
//! check what it published and for the host side to resolve once per run;
//! [`stage_resolved`] is the second half for such a pinned, verified image
//! (no second resolve, no second archive extraction), split in
//! [`prepare_resolved`] (fetched and unpacked beside the slot, the slot
//! untouched) and [`Prepared::install`] (the exchange), and [`unpack_to`]
//! serves the `unpack` command.
//!
//! It does not choose the slot, record state, render host files or flip
//! machines (the host-side modules do), and it never runs anything from the
//! image.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;

use kubeslot_image::atomic;
use kubeslot_image::digest::Digest;
use kubeslot_image::oci::{ImageConfig, Platform};
use kubeslot_image::reference::ImageSource;
use kubeslot_image::retry::Pacing;
use kubeslot_image::source::{SelectedImage, Source, SourceError};
use kubeslot_image::unpack::{self, Layer, UnpackError, Unpacker};
use kubeslot_image::verify::{self, Policy, Verdict, VerifyError};
use rustix::fs::{renameat_with, RenameFlags, CWD};

use crate::config::{Config, ProxyConfig, RegistryConfig, Trust, UnpackSettings};
use crate::fetch::store::{FetchReport, Store, StoreError};
use crate::fetch::{access, parallel};
use crate::paths::Root;
use crate::progress;
use crate::slots::overlay::metalayer;

/// Why staging failed; the variants carry the module errors, which name
/// the digest, entry, endpoint or path.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error(transparent)]
    Verify(#[from] VerifyError),
    #[error(transparent)]
    Source(#[from] Box<SourceError>),
    #[error(transparent)]
    Store(#[from] Box<StoreError>),
    #[error("unpacking image {image}: {error}")]
    Unpack {
        image: Digest,
        error: Box<UnpackError>,
    },
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("slot directory {name:?}: must be a plain directory name")]
    Slot { name: String },
    #[error("target {path}: must be missing or an empty directory")]
    TargetNotEmpty { path: PathBuf },
    #[error(transparent)]
    Layers(#[from] crate::slots::overlay::layers::LayerError),
}

impl From<SourceError> for StageError {
    fn from(e: SourceError) -> Self {
        StageError::Source(Box::new(e))
    }
}

impl From<StoreError> for StageError {
    fn from(e: StoreError) -> Self {
        StageError::Store(Box::new(e))
    }
}

impl From<kubeslot_image::atomic::AtomicError> for StageError {
    fn from(e: kubeslot_image::atomic::AtomicError) -> Self {
        StageError::Io {
            path: e.path,
            error: e.source,
        }
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> StageError + '_ {
    move |source| StageError::Io {
        path: path.to_path_buf(),
        error: source,
    }
}

/// An image that was resolved, read and passed the trust policy.
#[derive(Clone, Debug)]
pub struct Verified {
    pub image: SelectedImage,
    pub verdict: Verdict,
}

/// What [`stage`] put in place.
#[derive(Clone, Debug)]
pub struct Staged {
    /// What the reference resolved to (index digest for a multi-platform
    /// image).
    pub image_digest: Digest,
    /// The platform manifest that was unpacked.
    pub manifest_digest: Digest,
    pub config: ImageConfig,
    pub verdict: Verdict,
    /// Blobs downloaded vs reused.
    pub report: FetchReport,
    pub unpack: unpack::Stats,
    /// Size and sha256 of each file unpacked, by inode (computed as the
    /// unpacker wrote them): the slot's record needs no second read.
    pub file_hashes: unpack::FileHashes,
    /// The tree that now holds the image.
    pub tree: PathBuf,
}

/// Resolves `source` once, picks the manifest for `platform`, checks the
/// trust policy, then reads and checks the manifest and its config
/// (nothing signed by nobody is parsed beyond the index). Fetches no layer.
pub fn resolve_and_verify(
    source: &Source,
    policy: &Policy,
    platform: &Platform,
) -> Result<Verified, StageError> {
    resolve_and_verify_with(source, policy, platform, &mut || {})
}

/// [`resolve_and_verify`], calling `resolved` once the reference named a
/// digest (a run's `resolved` datapoint).
pub fn resolve_and_verify_with(
    source: &Source,
    policy: &Policy,
    platform: &Platform,
    resolved: &mut dyn FnMut(),
) -> Result<Verified, StageError> {
    let top = source.resolve()?;
    resolved();
    let manifest = source.select_manifest(&top, platform)?;
    let verdict = verify::check_digests(source, top.digest, manifest.digest, policy)?;
    let image = source.select(&top, platform)?;
    Ok(Verified { image, verdict })
}

/// The unpacker's policy: its safe defaults, adjusted by the config.
fn unpack_policy(settings: &UnpackSettings) -> unpack::Policy {
    let mut p = unpack::Policy::default();
    p.setuid_allowlist
        .extend(settings.setuid_allowlist.iter().cloned());
    p.allow_fifos_and_sockets |= settings.allow_fifos_and_sockets;
    if let Some(v) = settings.max_total_bytes {
        p.limits.max_total_bytes = v;
    }
    if let Some(v) = settings.max_layer_bytes {
        p.limits.max_layer_bytes = v;
    }
    if let Some(v) = settings.max_entries {
        p.limits.max_entries = v;
    }
    p
}

/// Applies the layers of `image` (all in `store`) into `target`, an empty
/// directory, under `policy`; returns the totals and, with `hash`, the
/// hashes of the files written ([`unpack::FileHashes`], for a slot's
/// record; empty without).
pub fn unpack_layers(
    store: &Store,
    image: &SelectedImage,
    target: &Path,
    policy: unpack::Policy,
    hash: bool,
) -> Result<(unpack::Stats, unpack::FileHashes), StageError> {
    let mut report = FetchReport::default();
    unpack_layers_from(store, None, image, target, policy, hash, &mut report)
}

/// [`unpack_layers`], the layers fetched from `source` when given (counted
/// in `report`). The layers go into one tree, in order: the one being
/// applied is unpacked while it downloads ([`Store::fetch_streaming`]),
/// and up to [`parallel::LAYERS_AT_ONCE`]` - 1` threads download the next
/// ones into the store meanwhile, in order; a layer one of them took is
/// applied from the store once it is there. A layer whose digest does not
/// check out fails the whole: the caller throws `target` away.
pub fn unpack_layers_from(
    store: &Store,
    source: Option<&Source>,
    image: &SelectedImage,
    target: &Path,
    policy: unpack::Policy,
    hash: bool,
    report: &mut FetchReport,
) -> Result<(unpack::Stats, unpack::FileHashes), StageError> {
    let wrap = |error: UnpackError| StageError::Unpack {
        image: image.image_digest(),
        error: Box::new(error),
    };
    let mut unpacker = Unpacker::new(target, policy).map_err(wrap)?;
    if hash {
        unpacker.hash_files();
    }
    let count = image.layers.len();
    let claimed: Vec<AtomicBool> = (0..count).map(|_| AtomicBool::new(false)).collect();
    let stop = AtomicBool::new(false);
    let (tx, rx) = mpsc::channel();
    thread::scope(|s| {
        if let Some(source) = source {
            for _ in 1..parallel::LAYERS_AT_ONCE.min(count) {
                let (tx, claimed, stop) = (tx.clone(), &claimed, &stop);
                s.spawn(move || prefetch(store, source, image, claimed, stop, tx));
            }
        }
        drop(tx);
        let mut ahead = Ahead {
            rx,
            done: BTreeMap::new(),
        };
        let applied = (0..count).try_for_each(|index| {
            progress::line(|| {
                let (desc, ..) = &image.layers[index];
                format!(
                    "layer {}/{count} {}: unpacking {}",
                    index + 1,
                    progress::short(&desc.digest),
                    progress::human(desc.size)
                )
            });
            let desc = &image.layers[index].0;
            let layer = |reader| layer_of(image, index, reader);
            let streamed = match source {
                Some(source) if !claimed[index].swap(true, Ordering::AcqRel) => store
                    .fetch_streaming(source, desc, report, |r| {
                        unpacker.apply(layer_of(image, index, r))
                    })?,
                Some(source) => {
                    report.add(&ahead.wait(index, store, source, desc)?);
                    None
                }
                None => None,
            };
            match streamed {
                Some(applied) => applied.map_err(wrap)?,
                None => unpacker
                    .apply(layer(store.open_blob(&desc.digest)?))
                    .map_err(wrap)?,
            };
            Ok::<_, StageError>(())
        });
        // The threads take no new layer; the scope waits for the ones
        // under way.
        stop.store(true, Ordering::Release);
        applied
    })?;
    let hashes = unpacker.take_file_hashes();
    let stats = unpacker.finish().map_err(wrap)?;
    progress::line(|| {
        format!(
            "unpacked {} layer{}: {} entries, {}",
            stats.layers,
            if stats.layers == 1 { "" } else { "s" },
            stats.entries,
            progress::human(stats.bytes)
        )
    });
    Ok((stats, hashes))
}

/// Layer `index` of `image`, read from `reader`.
fn layer_of<R>(image: &SelectedImage, index: usize, reader: R) -> Layer<R> {
    let (desc, compression, diff_id) = &image.layers[index];
    Layer {
        index,
        digest: desc.digest,
        diff_id: *diff_id,
        compression: *compression,
        reader,
    }
}

/// One download thread of [`unpack_layers_from`]: takes the next layer no
/// one took, in order from the second, fetches it into the store and says so, until none
/// is left or the unpacking stopped.
fn prefetch(
    store: &Store,
    source: &Source,
    image: &SelectedImage,
    claimed: &[AtomicBool],
    stop: &AtomicBool,
    tx: mpsc::Sender<(usize, Result<FetchReport, StoreError>)>,
) {
    // (the first layer is the unpacker's: it is streamed)
    for (index, (desc, ..)) in image.layers.iter().enumerate().skip(1) {
        if stop.load(Ordering::Acquire) {
            return;
        }
        if claimed[index].swap(true, Ordering::AcqRel) {
            continue;
        }
        let mut report = FetchReport::default();
        let fetched = store
            .fetch(source, desc, true, &mut report)
            .map(|()| report);
        if tx.send((index, fetched)).is_err() {
            return;
        }
    }
}

/// The layers the download threads fetched, as they report them.
struct Ahead {
    rx: mpsc::Receiver<(usize, Result<FetchReport, StoreError>)>,
    done: BTreeMap<usize, Result<FetchReport, StoreError>>,
}

impl Ahead {
    /// Waits until layer `index`, which a download thread took, is in the
    /// store; what fetching it did.
    fn wait(
        &mut self,
        index: usize,
        store: &Store,
        source: &Source,
        desc: &kubeslot_image::oci::Descriptor,
    ) -> Result<FetchReport, StoreError> {
        loop {
            if let Some(r) = self.done.remove(&index) {
                return r;
            }
            match self.rx.recv() {
                Ok((i, r)) => {
                    self.done.insert(i, r);
                }
                // Every thread is gone without a word on it (one
                // panicked): fetch it here.
                Err(_) => {
                    let mut report = FetchReport::default();
                    store.fetch(source, desc, true, &mut report)?;
                    return Ok(report);
                }
            }
        }
    }
}

/// The directory holding `path` (`.` for a bare name).
fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// What to stage and where; shared by [`stage`] and [`unpack_to`].
struct Job<'a> {
    root: &'a Root,
    image: &'a ImageSource,
    registries: &'a BTreeMap<String, RegistryConfig>,
    /// The config's egress proxy.
    proxy: Option<&'a ProxyConfig>,
    trust: &'a Trust,
    unpack: &'a UnpackSettings,
    store_dir: &'a Path,
    /// The final tree; its parent holds the staging directory.
    dest: &'a Path,
    staging_prefix: String,
    /// Backoff and deadline of the registry requests.
    pacing: Pacing,
}

fn run(job: Job<'_>) -> Result<Staged, StageError> {
    let policy = access::policy(job.trust, job.image, job.root)?;
    let parent = parent_of(job.dest);
    fs::create_dir_all(parent).map_err(io_err(parent))?;
    // Archives are extracted next to the staging dir: same filesystem as the
    // store, not a possibly small /tmp.
    let registries = access::registries(job.registries, job.root);
    let proxy = access::proxy(job.proxy, job.root);
    let source = Source::open_proxied(
        job.image,
        &registries,
        proxy.as_ref(),
        parent,
        Arc::new(job.pacing),
    )?;
    let verified = resolve_and_verify(&source, &policy, &Platform::host())?;
    prepare(
        source,
        &verified,
        job.store_dir,
        job.dest,
        &job.staging_prefix,
        job.unpack,
        false,
    )?
    .install()
}

/// Fetches the blobs of `verified` into the store, drops the source (an
/// archive's extraction goes before the tree takes its space) and unpacks
/// into a private staging dir beside `dest`. `dest` is not touched: a
/// refused blob or layer leaves it as it was. Never resolves anything.
/// `hash`: hash the files as they are written (a slot's tree, which is
/// recorded; not the `unpack` command's).
fn prepare(
    source: Source,
    verified: &Verified,
    store_dir: &Path,
    dest: &Path,
    staging_prefix: &str,
    unpack: &UnpackSettings,
    hash: bool,
) -> Result<Prepared, StageError> {
    let parent = parent_of(dest);
    fs::create_dir_all(parent).map_err(io_err(parent))?;
    let store = Store::open(store_dir)?;
    let image = &verified.image;
    // From a registry the layers are unpacked while they download; a
    // layout or archive is read whole first and the source dropped (an
    // archive's extraction goes before the tree takes its space).
    let (mut report, source) = if source.is_registry() {
        let mut report = FetchReport::default();
        store.fetch(&source, &image.manifest.config, false, &mut report)?;
        (report, Some(source))
    } else {
        (store.fetch_image(&source, image)?, None)
    };

    remove_stale(parent, staging_prefix)?;
    let staging = tempfile::Builder::new()
        .prefix(staging_prefix)
        .tempdir_in(parent)
        .map_err(io_err(parent))?;
    // tempdir makes 0700; a machine root is 0755 unless a layer says otherwise.
    {
        use std::os::unix::fs::PermissionsExt as _;
        fs::set_permissions(staging.path(), fs::Permissions::from_mode(0o755))
            .map_err(io_err(staging.path()))?;
    }
    let (stats, file_hashes) = unpack_layers_from(
        &store,
        source.as_ref(),
        image,
        staging.path(),
        unpack_policy(unpack),
        hash,
        &mut report,
    )?;
    if let Some(source) = source {
        store.store_manifest(&source, image)?;
    }
    Ok(Prepared {
        staging,
        staged: Staged {
            image_digest: verified.image.image_digest(),
            manifest_digest: verified.image.manifest_digest(),
            config: verified.image.config.clone(),
            verdict: verified.verdict.clone(),
            report,
            unpack: stats,
            file_hashes,
            tree: dest.to_path_buf(),
        },
    })
}

/// A verified tree fully unpacked in its private staging directory, not
/// yet in place: the slot still holds what it held before. Dropping it
/// deletes the staging tree.
#[derive(Debug)]
pub struct Prepared {
    staging: tempfile::TempDir,
    staged: Staged,
}

impl Prepared {
    /// What [`Prepared::install`] will put in place.
    pub fn staged(&self) -> &Staged {
        &self.staged
    }

    /// Swaps the tree into place (the only step that changes the target).
    pub fn install(self) -> Result<Staged, StageError> {
        install(self.staging, &self.staged.tree)?;
        Ok(self.staged)
    }
}

/// Removes what a killed earlier run left in `parent` under `prefix`
/// (staging trees, archive extractions): never anything that was put in
/// place.
fn remove_stale(parent: &Path, prefix: &str) -> Result<(), StageError> {
    let rd = fs::read_dir(parent).map_err(io_err(parent))?;
    for entry in rd.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(prefix) {
            let p = entry.path();
            match entry.file_type() {
                Ok(t) if t.is_dir() => {
                    crate::remove::remove_tree(&p).map_err(|e| io_err(&p)(e.into_io()))?
                }
                _ => fs::remove_file(&p).map_err(io_err(&p))?,
            }
        }
    }
    Ok(())
}

/// Puts the finished staging tree at `dest`: an atomic exchange with the
/// old tree (or an empty target) when there is one, a rename otherwise; the
/// directory is fsynced before the old tree is deleted.
fn install(staging: tempfile::TempDir, dest: &Path) -> Result<(), StageError> {
    let parent = parent_of(dest);
    let exists = match fs::symlink_metadata(dest) {
        Ok(m) if m.is_dir() => true,
        Ok(_) => return Err(StageError::TargetNotEmpty { path: dest.into() }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(io_err(dest)(e)),
    };
    let flags = if exists {
        RenameFlags::EXCHANGE
    } else {
        RenameFlags::NOREPLACE
    };
    renameat_with(CWD, staging.path(), CWD, dest, flags)
        .map_err(|e| io_err(dest)(std::io::Error::from(e)))?;
    atomic::sync_dir(parent).map_err(|e| StageError::Io {
        path: e.path,
        error: e.source,
    })?;
    // After an exchange the staging path holds the old tree: removed with
    // bounded descriptors (a node may have written it arbitrarily deep),
    // and a failure is the run's error (the next run's sweep of stale
    // staging dirs retries it). After a plain rename nothing is left.
    let old = staging.keep();
    crate::remove::remove_tree(&old).map_err(|e| io_err(&old)(e.into_io()))?;
    Ok(())
}

fn check_slot_dir(slot_dir: &str) -> Result<(), StageError> {
    if slot_dir.is_empty()
        || slot_dir.starts_with('.')
        || slot_dir.contains('/')
        || slot_dir.contains('\0')
    {
        return Err(StageError::Slot {
            name: slot_dir.to_string(),
        });
    }
    Ok(())
}

/// Removes the archive extractions a killed run left in the machines dir.
/// Only for a caller holding the host lock (no other run can be using one)
/// and before it opens its own source.
pub fn remove_stale_extractions(root: &Root) -> Result<(), StageError> {
    let machines = root.machines_dir();
    // The slot trees live here: root's alone (an overlay slot's mounted
    // tree, a copied one, setuid programs and world-writable dirs included).
    crate::paths::private_dir(&machines)?;
    remove_stale(&machines, ".archive-")
}

/// Stages `config.image` into `<machines>/<slot_dir>` under `root`, using
/// the root's content store: resolves, verifies, fetches and unpacks.
pub fn stage(root: &Root, config: &Config, slot_dir: &str) -> Result<Staged, StageError> {
    check_slot_dir(slot_dir)?;
    let dest = root.machine_tree(slot_dir);
    // The host lock (held by the caller) makes this the only run: archive
    // extractions of a killed run can go too.
    remove_stale_extractions(root)?;
    run(Job {
        root,
        image: &config.image,
        registries: &config.registries,
        proxy: config.proxy.as_ref(),
        trust: &config.trust,
        unpack: &config.unpack,
        store_dir: &root.store(),
        dest: &dest,
        staging_prefix: format!(".staging-{slot_dir}-"),
        pacing: access::pacing(&config.download),
    })
}

/// Stages the image `verified` (resolved once from `source` at the start
/// of the run and checked against the trust policy) into
/// `<machines>/<slot_dir>`: [`prepare_resolved`], then [`Prepared::install`].
pub fn stage_resolved(
    root: &Root,
    source: Source,
    verified: &Verified,
    unpack: &UnpackSettings,
    slot_dir: &str,
) -> Result<Staged, StageError> {
    prepare_resolved(root, source, verified, unpack, slot_dir)?.install()
}

/// Everything of staging `verified` into `<machines>/<slot_dir>` except
/// putting it in place: the digest is pinned, so a tag that moved since
/// cannot change what is staged, and an archive source is not extracted a
/// second time. Fetches into the root's content store, drops the source
/// (an archive's extraction is removed before unpacking) and unpacks into
/// a staging directory; the slot's tree is untouched until
/// [`Prepared::install`], so a caller records the slot as being replaced
/// only once the image passed every check.
pub fn prepare_resolved(
    root: &Root,
    source: Source,
    verified: &Verified,
    unpack: &UnpackSettings,
    slot_dir: &str,
) -> Result<Prepared, StageError> {
    check_slot_dir(slot_dir)?;
    crate::paths::private_dir(&root.machines_dir())?;
    prepare(
        source,
        verified,
        &root.store(),
        &root.machine_tree(slot_dir),
        &format!(".staging-{slot_dir}-"),
        unpack,
        true,
    )
}

/// The overlay half of staging `verified`: fetched into the root's
/// content store (the source dropped after), each layer the layer store
/// lacks unpacked into it ([`crate::slots::overlay::layers::ensure`]). No slot is touched.
pub fn prepare_layers(
    root: &Root,
    source: Source,
    verified: &Verified,
    unpack: &UnpackSettings,
) -> Result<(FetchReport, crate::slots::overlay::layers::Ensured), StageError> {
    let store = Store::open(&root.store())?;
    let image = &verified.image;
    if !source.is_registry() {
        // A layout or archive is read whole, the source dropped (an
        // archive's extraction removed) before anything is unpacked.
        let report = store.fetch_image(&source, image)?;
        drop(source);
        let ensured = metalayer::ensure_slot_lowers(root, &store, image, &unpack_policy(unpack))?;
        return Ok((report, ensured));
    }
    // From a registry each missing layer is unpacked while it downloads;
    // the manifest is stored last, as by `fetch_image`.
    let mut report = FetchReport::default();
    store.fetch(&source, &image.manifest.config, false, &mut report)?;
    let ensured = metalayer::ensure_slot_lowers_from(
        root,
        &store,
        Some(&source),
        image,
        &unpack_policy(unpack),
        &mut report,
    )?;
    store.store_manifest(&source, image)?;
    Ok((report, ensured))
}

/// How `unpack` reaches registries: the config's `registries` and `proxy`.
#[derive(Clone, Copy)]
pub struct Reach<'a> {
    pub registries: &'a BTreeMap<String, RegistryConfig>,
    pub proxy: Option<&'a ProxyConfig>,
}

/// Verifies and unpacks `image` into `target` (missing or an empty
/// directory), with blobs in `store_dir`: the `unpack` command.
pub fn unpack_to(
    root: &Root,
    image: &ImageSource,
    reach: Reach<'_>,
    trust: &Trust,
    unpack: &UnpackSettings,
    store_dir: &Path,
    target: &Path,
) -> Result<Staged, StageError> {
    if let Ok(mut rd) = fs::read_dir(target) {
        if rd.next().is_some() {
            return Err(StageError::TargetNotEmpty {
                path: target.into(),
            });
        }
    } else if target.exists() {
        return Err(StageError::TargetNotEmpty {
            path: target.into(),
        });
    }
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "target".into());
    run(Job {
        root,
        image,
        registries: reach.registries,
        proxy: reach.proxy,
        trust,
        unpack,
        store_dir,
        dest: target,
        staging_prefix: format!(".staging-{name}-"),
        // No config section here: the default deadline; waits are shown.
        pacing: Pacing::default().with_notice(|line| progress::line(|| line.to_string())),
    })
}
