//! The per-image metadata layer of overlay slots: the directory attributes
//! that depend on what lies below a layer, fixed per image.
//!
//! overlayfs takes a directory's mode, owner and xattrs from the topmost
//! layer that holds it; image-spec `layer.md` changes them only where a
//! layer has an entry for the directory. A layer that needs a parent it
//! does not list (or whites out something in it) holds that parent as the
//! unpacker made it (0755 root:root), so shared, per-`diff_id` layer
//! directories alone cannot give the tree the spec defines. Given the root
//! handle, the content store (blobs verified), the image and its layer
//! directories ([`crate::slots::overlay::layers::ensure`]), [`ensure_slot_lowers`] adds
//! one more lower, `layers/meta-<chain id hex>` (the image's chain of
//! `diff_id`s, image-spec `config.md`), mounted topmost: the image's
//! layers applied with the copy mode's semantics into a scratch skeleton
//! (`Unpacker::new_skeleton`: files empty; on a private tmpfs where the
//! host can), every directory whose
//! attributes there (mode, owner, xattrs and modification time: a layer
//! directory made for an entry below it, or changed by a later layer's
//! entries, has the time of its unpack, not the image's) differ from the topmost layer directory holding it
//! copied into the metadata layer (with its ancestors, which keep theirs),
//! and the root always. It is made while the slot is staged, through a
//! staging dir and a no-replace rename, its record written first (like a
//! layer: `verify-layers`, GC), and reused by the next image with the same
//! chain only as a layer is: made under the same unpack policy and still
//! matching its record (else built again, beside it while a slot mounts it). The overlay code gives the slot's upper root the metadata
//! layer's root attributes ([`crate::slots::overlay`]).
//!
//! It does not unpack layers into the store, mount, or remove anything
//! beyond its scratch skeleton (GC removes a metadata layer no slot
//! mounts, like any layer).

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use kubeslot_image::digest::Digest;
use kubeslot_image::source::{SelectedImage, Source};
use kubeslot_image::unpack::{self, Layer, UnpackError, Unpacker};

use crate::fetch::store::{FetchReport, Store};
use crate::paths::Root;
use crate::progress;
use crate::slots::overlay::layers::{self, Ensured, LayerError};

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> LayerError + '_ {
    move |error| LayerError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// The chain ID of `diff_ids` (bottom first), image-spec `config.md`:
/// `ChainID(L0) = DiffID(L0)`, `ChainID(L0..n) = SHA256(ChainID(L0..n-1) + " " + DiffID(Ln))`.
fn chain_id<'a>(diff_ids: impl IntoIterator<Item = &'a Digest>) -> Option<Digest> {
    diff_ids.into_iter().fold(None, |chain, d| {
        Some(match chain {
            None => *d,
            Some(c) => Digest::of(format!("{c} {d}").as_bytes()),
        })
    })
}

/// The metadata layer directory of `image`.
pub fn meta_dir(root: &Root, image: &SelectedImage) -> PathBuf {
    let chain = chain_id(image.layers.iter().map(|(_, _, d)| d))
        .map_or_else(|| "empty".to_string(), |c| c.hex().to_string());
    root.layers_dir().join(format!("meta-{chain}"))
}

/// The lowers of an overlay slot for `image`, bottom first: its layer
/// directories ([`layers::ensure`]), then its metadata layer (made here
/// when missing).
pub fn ensure_slot_lowers(
    root: &Root,
    store: &Store,
    image: &SelectedImage,
    policy: &unpack::Policy,
) -> Result<Ensured, LayerError> {
    ensure_slot_lowers_from(
        root,
        store,
        None,
        image,
        policy,
        &mut FetchReport::default(),
    )
}

/// [`ensure_slot_lowers`], the layers fetched from `source` when given
/// (unpacked while they download: [`layers::ensure_from`]; counted in
/// `report`).
pub fn ensure_slot_lowers_from(
    root: &Root,
    store: &Store,
    source: Option<&Source>,
    image: &SelectedImage,
    policy: &unpack::Policy,
    report: &mut FetchReport,
) -> Result<Ensured, LayerError> {
    let mut ensured = layers::ensure_from(root, store, source, image, policy, report)?;
    let meta = ensure_meta(root, store, image, policy, &ensured.dirs)?;
    ensured.dirs.push(meta);
    Ok(ensured)
}

fn ensure_meta(
    root: &Root,
    store: &Store,
    image: &SelectedImage,
    policy: &unpack::Policy,
    lowers: &[PathBuf],
) -> Result<PathBuf, LayerError> {
    let policy_hash = policy_hash(policy);
    // Like a layer: `meta-<chain>` (or, when a slot mounts that one and it
    // is unusable, `meta-<chain>-p<policy>`) is reused only as recorded
    // under this policy; otherwise removed (never while a slot's unit names
    // it) and built again.
    let own = meta_dir(root, image);
    let name = own
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let alternate = own.with_file_name(format!("{name}-p{}", &policy_hash[..16]));
    let keep = layers::referenced(root)?;
    let dest = match layers::place_in(&own, &alternate, &policy_hash, &keep) {
        Ok(layers::Place::Reuse(dir)) => {
            progress::line(|| "metadata layer: in the layer store, as recorded".to_string());
            return Ok(dir);
        }
        Ok(layers::Place::Unpack { dest, replace }) => {
            if let Some(why) = replace {
                progress::line(|| format!("metadata layer {}: {why}: building it again", dest.display()));
                layers::remove_recorded(&dest)?;
            }
            dest
        }
        Err(why) => {
            return Err(LayerError::Io {
                path: own.clone(),
                error: std::io::Error::other(format!(
                    "metadata layer: {why}; a slot's mount unit still names it, and so does the other slot's for {}: refusing to reuse or replace them (`rollback --clean` or staging the other slot frees one)",
                    alternate.display()
                )),
            })
        }
    };
    progress::line(|| "metadata layer: the image's directory attributes".to_string());
    let base = root.layers_dir();
    let skeleton = scratch(&base, ".staging-skeleton-")?;
    let built = (|| {
        skeleton_in_memory(store, image, policy, skeleton.path())?;
        let name = dest
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let staging = scratch(&base, &format!(".staging-{name}-"))?;
        build(skeleton.path(), lowers, staging.path())?;
        Ok::<_, LayerError>(staging)
    })();
    // Whatever happened, nothing stays mounted before the dir goes.
    let _ = rustix::mount::unmount(skeleton.path(), rustix::mount::UnmountFlags::DETACH);
    let skel_path = skeleton.keep();
    crate::remove::remove_tree(&skel_path).map_err(|e| io_err(&skel_path)(e.into_io()))?;
    // Its files are empty: nothing to read, nothing to hash.
    layers::place_recorded(built?, &dest, &policy_hash, &Default::default())?;
    Ok(dest)
}

/// The metadata layer's format: 2 keeps directories' modification times.
const META_FORMAT: &str = "meta-format-2";

/// What a metadata layer's record says it was made under: the unpack
/// policy ([`layers::policy_hash`]) and the layer's own format, so that one
/// made before directory times were kept is made again, not reused.
pub fn policy_hash(policy: &unpack::Policy) -> String {
    Digest::of(format!("{META_FORMAT} {}", layers::policy_hash(policy)).as_bytes())
        .hex()
        .to_string()
}

/// A 0755 scratch directory in the layer store (`.staging-*`: a killed
/// run's is removed by the next one).
fn scratch(base: &Path, prefix: &str) -> Result<tempfile::TempDir, LayerError> {
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(base)
        .map_err(io_err(base))?;
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755))
        .map_err(io_err(dir.path()))?;
    Ok(dir)
}

/// The skeleton on a private tmpfs mounted on `target` (its directories
/// and inodes then cost no disk writes: on ext4 every directory is a 4 KiB
/// block); on the disk when tmpfs cannot be mounted or takes no `user.*`
/// xattrs (kernels before 6.6): the skeleton applied again there.
fn skeleton_in_memory(
    store: &Store,
    image: &SelectedImage,
    policy: &unpack::Policy,
    target: &Path,
) -> Result<(), LayerError> {
    let data = c"mode=0755";
    let mounted = rustix::mount::mount(
        "tmpfs",
        target,
        "tmpfs",
        rustix::mount::MountFlags::NOSUID | rustix::mount::MountFlags::NODEV,
        Some(data),
    )
    .is_ok();
    if mounted {
        if apply_skeleton(store, image, policy, target).is_ok() {
            return Ok(());
        }
        rustix::mount::unmount(target, rustix::mount::UnmountFlags::DETACH)
            .map_err(|e| io_err(target)(std::io::Error::from(e)))?;
    }
    apply_skeleton(store, image, policy, target)
}

/// The image's layers applied into `target` with the copy mode's semantics,
/// files empty.
fn apply_skeleton(
    store: &Store,
    image: &SelectedImage,
    policy: &unpack::Policy,
    target: &Path,
) -> Result<(), LayerError> {
    let mut unpacker = None;
    for (index, (desc, compression, diff_id)) in image.layers.iter().enumerate() {
        let wrap = |error: UnpackError| LayerError::Unpack {
            layer: desc.digest,
            diff_id: *diff_id,
            error: Box::new(error),
        };
        let u = match &mut unpacker {
            Some(u) => u,
            None => unpacker.insert(Unpacker::new_skeleton(target, policy.clone()).map_err(wrap)?),
        };
        let reader = store.open_blob(&desc.digest).map_err(Box::new)?;
        u.apply(Layer {
            index,
            digest: desc.digest,
            diff_id: *diff_id,
            compression: *compression,
            reader,
        })
        .map_err(wrap)?;
    }
    Ok(())
}

/// What overlayfs takes from the topmost layer holding a directory.
#[derive(PartialEq, Eq)]
struct Attrs {
    mode: u32,
    uid: u32,
    gid: u32,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// Modification time (seconds, nanoseconds).
    mtime: (i64, i64),
}

fn attrs(p: &Path) -> std::io::Result<Option<Attrs>> {
    let m = match fs::symlink_metadata(p) {
        Ok(m) => m,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    if !m.is_dir() {
        return Ok(None);
    }
    Ok(Some(Attrs {
        mode: m.mode() & 0o7777,
        uid: m.uid(),
        gid: m.gid(),
        xattrs: crate::slots::overlay::dirattrs::user_xattrs(p)?,
        mtime: (m.mtime(), m.mtime_nsec()),
    }))
}

/// The directories of `skeleton` (relative, the root as ""), parents first.
fn skeleton_dirs(skeleton: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = vec![PathBuf::new()];
    let mut i = 0;
    while i < out.len() {
        let rel = out[i].clone();
        let mut children = Vec::new();
        for entry in fs::read_dir(skeleton.join(&rel))? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                children.push(rel.join(entry.file_name()));
            }
        }
        children.sort();
        out.extend(children);
        i += 1;
    }
    Ok(out)
}

/// Fills `out` (an empty 0755 directory) with the directories of
/// `skeleton` whose attributes the topmost of `lowers` holding them does
/// not have, their ancestors, and the root, each with the skeleton's mode,
/// owner, `user.*` xattrs and times.
fn build(skeleton: &Path, lowers: &[PathBuf], out: &Path) -> Result<(), LayerError> {
    let dirs = skeleton_dirs(skeleton).map_err(io_err(skeleton))?;
    let mut keep: BTreeSet<PathBuf> = BTreeSet::from([PathBuf::new()]);
    for rel in &dirs {
        let p = skeleton.join(rel);
        let want = attrs(&p).map_err(io_err(&p))?;
        let mut top = None;
        for l in lowers.iter().rev() {
            let q = l.join(rel);
            if fs::symlink_metadata(&q).is_ok() {
                top = attrs(&q).map_err(io_err(&q))?;
                break;
            }
        }
        if want != top {
            keep.extend(rel.ancestors().map(Path::to_path_buf));
        }
    }
    for rel in &keep {
        let (from, to) = (skeleton.join(rel), out.join(rel));
        if !rel.as_os_str().is_empty() {
            fs::create_dir(&to).map_err(io_err(&to))?;
        }
        crate::slots::overlay::dirattrs::copy_attrs(&from, &to).map_err(io_err(&to))?;
    }
    // Times last, children first: creating a child changes its parent's.
    for rel in keep.iter().rev() {
        let (from, to) = (skeleton.join(rel), out.join(rel));
        crate::slots::overlay::dirattrs::copy_times(&from, &to).map_err(io_err(&to))?;
    }
    Ok(())
}
