//! Overlay slots: a slot's tree as an overlayfs mount of its image's layer
//! directories (read-only lowers, top layer first) and the slot's own
//! `upper`/`work` directories, as a rendered systemd mount unit.
//!
//! Given the root handle, a [`Systemd`] and the layer directories
//! ([`crate::slots::overlay::layers`]), it renders `<escaped machine tree>.mount`
//! (`var-lib-machines-kube1.mount` on a host: What=overlay,
//! Where=/var/lib/machines/kube1), installs it ([`install`]: the slot's old
//! mount stopped, the mount point emptied, a fresh upper, the unit written,
//! daemon-reload, started), removes it for a copy slot ([`remove`]) and
//! empties the upper of a stopped slot ([`clean`], `rollback --clean`).
//! `systemd-nspawn@.service` has `RequiresMountsFor=/var/lib/machines/%i`,
//! so starting (and, enabled, booting) the machine mounts its slot first;
//! the unit needs no `[Install]` of its own.
//!
//! The lowers are never written: overlayfs writes only the upper, and
//! nothing here opens a layer directory. It does not unpack layers, choose
//! the slot or the mode, or record state.

pub mod dirattrs;
pub mod layers;
pub mod metalayer;

use std::fs;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use kubeslot_image::atomic;
use kubeslot_image::digest::Digest;

use crate::paths::Root;
use crate::slot::Slot;
use crate::systemd::{Systemd, SystemdError};

/// The longest mount option string the kernel takes: the mount data is one
/// page (4096 bytes on x86_64 and most arm64 kernels), NUL included.
pub const OPTIONS_MAX: usize = 4095;

/// Why an overlay slot could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum OverlayError {
    #[error(
        "overlay slot {slot}: the mount options are {len} bytes, more than the kernel's {max} \
         ({layers} layers of {per} bytes each: layer store {store}); use an image with fewer \
         layers or slots.mode = \"copy\""
    )]
    OptionsTooLong {
        slot: Slot,
        len: usize,
        max: usize,
        layers: usize,
        per: usize,
        store: PathBuf,
    },
    #[error("overlay slot {slot}: path {path} holds a character overlayfs options cannot carry (',', ':', '\\\\', '%' or whitespace)")]
    BadPath { slot: Slot, path: PathBuf },
    #[error("overlay slot {slot}: {path} is still a mount point after its unit {unit} stopped; refusing to touch it")]
    StillMounted {
        slot: Slot,
        path: PathBuf,
        unit: String,
    },
    #[error("overlay slot {slot}: {path}: {error}")]
    Io {
        slot: Slot,
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(transparent)]
    Systemd(#[from] SystemdError),
}

fn io_err(slot: Slot, path: &Path) -> impl FnOnce(std::io::Error) -> OverlayError + '_ {
    move |error| OverlayError::Io {
        slot,
        path: path.to_path_buf(),
        error,
    }
}

/// `slot`'s upper directory (what its machine wrote).
pub fn upper_dir(root: &Root, slot: Slot) -> PathBuf {
    root.slot_overlay_dir(slot.machine()).join("upper")
}

/// `slot`'s overlayfs work directory.
fn work_dir(root: &Root, slot: Slot) -> PathBuf {
    root.slot_overlay_dir(slot.machine()).join("work")
}

/// The lower directories `slot`'s mount unit names, top first as in its
/// `Options=` (none when it has no unit): every one of them, whatever made
/// it, is a lower the slot's tree is made of.
pub fn lowers(root: &Root, slot: Slot) -> std::io::Result<Vec<PathBuf>> {
    let text = match fs::read_to_string(root.mount_unit_file(slot.machine())) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    Ok(text
        .lines()
        .filter_map(|l| l.strip_prefix("Options="))
        .flat_map(|o| o.split(','))
        .filter_map(|o| o.strip_prefix("lowerdir="))
        .flat_map(|l| l.split(':').map(PathBuf::from))
        .collect())
}

/// Whether `slot` is an overlay slot (its mount unit is installed).
pub fn is_overlay(root: &Root, slot: Slot) -> bool {
    root.mount_unit_file(slot.machine()).is_file()
}

fn check_path(slot: Slot, p: &Path) -> Result<String, OverlayError> {
    let s = p.to_str().unwrap_or(",");
    if s.chars()
        .any(|c| matches!(c, ',' | ':' | '\\' | '%') || c.is_whitespace())
    {
        return Err(OverlayError::BadPath {
            slot,
            path: p.to_path_buf(),
        });
    }
    Ok(s.to_string())
}

/// The overlayfs options of `slot` over `layers` (bottom first, as the
/// manifest lists them; overlayfs wants the top first), refused when
/// longer than [`OPTIONS_MAX`].
pub fn mount_options(root: &Root, slot: Slot, layers: &[PathBuf]) -> Result<String, OverlayError> {
    let lowers = layers
        .iter()
        .rev()
        .map(|l| check_path(slot, l))
        .collect::<Result<Vec<_>, _>>()?;
    let upper = check_path(slot, &upper_dir(root, slot))?;
    let work = check_path(slot, &work_dir(root, slot))?;
    let options = format!(
        "lowerdir={},upperdir={upper},workdir={work}",
        lowers.join(":")
    );
    if options.len() > OPTIONS_MAX {
        return Err(OverlayError::OptionsTooLong {
            slot,
            len: options.len(),
            max: OPTIONS_MAX,
            layers: layers.len(),
            per: lowers.first().map_or(0, |l| l.len() + 1),
            store: root.layers_dir(),
        });
    }
    Ok(options)
}

/// The mount unit of `slot` for image `digest` with `options`.
pub fn render_unit(root: &Root, slot: Slot, digest: Option<Digest>, options: &str) -> String {
    let image = digest.map_or_else(|| "unknown image".to_string(), |d| d.to_string());
    format!(
        "# Rendered by kubeslot-activator: overlay slot {machine} ({image}).\n\
         # systemd-nspawn@{machine}.service mounts it (RequiresMountsFor).\n\
         [Unit]\n\
         Description=kubeslot overlay slot {machine}\n\
         Before=systemd-nspawn@{machine}.service\n\
         \n\
         [Mount]\n\
         What=overlay\n\
         Where={where_}\n\
         Type=overlay\n\
         Options={options}\n",
        machine = slot.machine(),
        where_ = root.machine_tree(slot.machine()).display(),
    )
}

/// Stops `slot`'s mount unit when one is installed and checks that its
/// tree is no longer a mount point.
fn unmount(root: &Root, systemd: &dyn Systemd, slot: Slot) -> Result<(), OverlayError> {
    let unit = root.mount_unit(slot.machine());
    if is_overlay(root, slot) {
        systemd.stop(&unit)?;
    }
    let tree = root.machine_tree(slot.machine());
    if let (Ok(t), Some(parent)) = (fs::symlink_metadata(&tree), tree.parent()) {
        let p = fs::metadata(parent).map_err(io_err(slot, parent))?;
        if t.dev() != p.dev() {
            return Err(OverlayError::StillMounted {
                slot,
                path: tree,
                unit,
            });
        }
    }
    Ok(())
}

/// Makes `dir` a fresh empty directory (0755), removing what was there.
fn fresh_dir(slot: Slot, dir: &Path) -> Result<(), OverlayError> {
    match fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => {
            crate::remove::remove_tree(dir).map_err(|e| io_err(slot, dir)(e.into_io()))?
        }
        Ok(_) => fs::remove_file(dir).map_err(io_err(slot, dir))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(slot, dir)(e)),
    }
    fs::create_dir_all(dir).map_err(io_err(slot, dir))?;
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).map_err(io_err(slot, dir))
}

/// The merged root's attributes are the upper root's (it always holds the
/// root): it gets the owner, mode, `user.*` xattrs and times of the topmost lower's
/// root, the image's metadata layer ([`crate::slots::overlay::metalayer`]), which has the
/// root the image defines.
fn upper_root_like(root: &Root, slot: Slot, top: Option<&PathBuf>) -> Result<(), OverlayError> {
    let Some(top) = top else {
        return Ok(());
    };
    let upper = upper_dir(root, slot);
    crate::slots::overlay::dirattrs::copy_attrs(top, &upper).map_err(io_err(slot, &upper))?;
    crate::slots::overlay::dirattrs::copy_times(top, &upper).map_err(io_err(slot, &upper))
}

/// The topmost lower of `slot`'s installed mount unit (the first in its
/// `lowerdir=`).
fn top_lower(root: &Root, slot: Slot) -> Result<Option<PathBuf>, OverlayError> {
    let unit = root.mount_unit_file(slot.machine());
    let text = fs::read_to_string(&unit).map_err(io_err(slot, &unit))?;
    Ok(text
        .lines()
        .filter_map(|l| l.strip_prefix("Options="))
        .flat_map(|o| o.split(','))
        .find_map(|o| o.strip_prefix("lowerdir="))
        .and_then(|l| l.split(':').next())
        .map(PathBuf::from))
}

fn private(slot: Slot, dir: &Path) -> Result<(), OverlayError> {
    crate::paths::private_dir(dir).map_err(|e| OverlayError::Io {
        slot,
        path: e.path,
        error: e.source,
    })
}

/// Makes `slot` an overlay of `layers` (bottom first) for image `digest`:
/// the old mount stopped, the tree an empty mount point, a fresh upper and
/// work dir, the unit written, daemon-reload, the mount started. Only for
/// a slot whose machine is not running.
pub fn install(
    root: &Root,
    systemd: &dyn Systemd,
    slot: Slot,
    digest: Option<Digest>,
    layers: &[PathBuf],
) -> Result<(), OverlayError> {
    let options = mount_options(root, slot, layers)?;
    unmount(root, systemd, slot)?;
    private(slot, &root.machines_dir())?;
    fresh_dir(slot, &root.machine_tree(slot.machine()))?;
    // The upper's root is the tree's root (0755); its parent keeps every
    // other user out of what the machine writes.
    fresh_dir(slot, &root.slot_overlay_dir(slot.machine()))?;
    private(slot, &root.slot_overlay_dir(slot.machine()))?;
    fresh_dir(slot, &upper_dir(root, slot))?;
    upper_root_like(root, slot, layers.last())?;
    fresh_dir(slot, &work_dir(root, slot))?;
    let unit = root.mount_unit_file(slot.machine());
    let units = root.systemd_system_dir();
    fs::create_dir_all(&units).map_err(io_err(slot, &units))?;
    atomic::write_file(&unit, render_unit(root, slot, digest, &options).as_bytes()).map_err(
        |e| OverlayError::Io {
            slot,
            path: e.path,
            error: e.source,
        },
    )?;
    systemd.daemon_reload()?;
    systemd.start(&root.mount_unit(slot.machine()))?;
    Ok(())
}

/// Undoes [`install`] for a slot about to hold a copied tree: the mount
/// stopped, its unit removed, the upper and work dirs deleted. Nothing
/// when the slot is not an overlay slot.
pub fn remove(root: &Root, systemd: &dyn Systemd, slot: Slot) -> Result<(), OverlayError> {
    if !is_overlay(root, slot) {
        return Ok(());
    }
    unmount(root, systemd, slot)?;
    let unit = root.mount_unit_file(slot.machine());
    fs::remove_file(&unit).map_err(io_err(slot, &unit))?;
    systemd.daemon_reload()?;
    let dir = root.slot_overlay_dir(slot.machine());
    if dir.exists() {
        crate::remove::remove_tree(&dir).map_err(|e| io_err(slot, &dir)(e.into_io()))?;
    }
    Ok(())
}

/// `rollback --clean`: everything `slot`'s machine wrote is dropped (a
/// fresh upper and work dir), so the slot is exactly its verified layers
/// again; the mount is started again. Only for a stopped machine.
pub fn clean(root: &Root, systemd: &dyn Systemd, slot: Slot) -> Result<(), OverlayError> {
    unmount(root, systemd, slot)?;
    fresh_dir(slot, &upper_dir(root, slot))?;
    upper_root_like(root, slot, top_lower(root, slot)?.as_ref())?;
    fresh_dir(slot, &work_dir(root, slot))?;
    systemd.start(&root.mount_unit(slot.machine()))?;
    Ok(())
}

/// Whether overlay slots work on this host, tried for real in a scratch
/// directory of the layer store (the filesystem the lowers live on): a
/// lower layer with an overlayfs whiteout (0:0 character device) and an
/// opaque directory (`trusted.overlay.opaque`), an upper and work dir
/// beside them (the slots' filesystem), mounted, read, written, unmounted
/// and removed. `Err` says which step failed (no overlayfs, trusted xattrs
/// or device nodes refused, overlay over an overlay refused, ...).
pub fn probe(root: &Root) -> Result<(), String> {
    let base = root.layers_dir();
    crate::paths::private_dir(&base).map_err(|e| format!("{}: {}", e.path.display(), e.source))?;
    let dir = tempfile::Builder::new()
        .prefix(".probe-")
        .tempdir_in(&base)
        .map_err(|e| format!("{}: {e}", base.display()))?;
    let result = probe_in(dir.path());
    // Whatever happened, nothing stays mounted before the dir goes.
    let _ = rustix::mount::unmount(dir.path().join("m"), rustix::mount::UnmountFlags::DETACH);
    result
}

fn probe_in(d: &Path) -> Result<(), String> {
    use rustix::fs::{self as rfs, FileType, Mode};
    let step = |what: &str, e: &dyn std::fmt::Display| format!("{what}: {e}");
    for sub in ["low/gone", "low/opq", "top/opq", "u", "w", "m"] {
        fs::create_dir_all(d.join(sub)).map_err(|e| step("create the scratch dirs", &e))?;
    }
    fs::write(d.join("low/opq/hidden"), b"").map_err(|e| step("write a lower file", &e))?;
    rfs::mknodat(
        rfs::CWD,
        d.join("top/gone"),
        FileType::CharacterDevice,
        Mode::empty(),
        rfs::makedev(0, 0),
    )
    .map_err(|e| {
        step(
            "create a whiteout device (mknod 0:0) in the layer store",
            &e,
        )
    })?;
    rfs::setxattr(
        d.join("top/opq"),
        kubeslot_image::unpack::OVERLAY_OPAQUE,
        b"y",
        rfs::XattrFlags::empty(),
    )
    .map_err(|e| step("set trusted.overlay.opaque in the layer store", &e))?;
    let options = format!(
        "lowerdir={}:{},upperdir={},workdir={}",
        d.join("top").display(),
        d.join("low").display(),
        d.join("u").display(),
        d.join("w").display()
    );
    let m = d.join("m");
    let data = std::ffi::CString::new(options).map_err(|e| step("mount options", &e))?;
    rustix::mount::mount(
        "overlay",
        &m,
        "overlay",
        rustix::mount::MountFlags::empty(),
        Some(data.as_c_str()),
    )
    .map_err(|e| step("mount -t overlay", &e))?;
    let checks = (|| {
        if m.join("gone").symlink_metadata().is_ok() {
            return Err("a whiteout device did not hide the lower directory".to_string());
        }
        if m.join("opq/hidden").symlink_metadata().is_ok() {
            return Err("an opaque directory did not hide the lower entries".to_string());
        }
        fs::write(m.join("written"), b"").map_err(|e| step("write through the mount", &e))?;
        if !d.join("u/written").is_file() {
            return Err("a write did not land in the upper directory".to_string());
        }
        Ok(())
    })();
    rustix::mount::unmount(&m, rustix::mount::UnmountFlags::empty())
        .map_err(|e| step("unmount", &e))?;
    checks
}
