//! The host around the node: `disk-space` for the image, and
//! `container-engine` (another engine's iptables rules or a second
//! containerd beside the node's).
//!
//! What a flip writes: the blobs the content store (`/var/lib/kubeslot`)
//! lacks, then the unpacked tree beside the slot under `/var/lib/machines`
//! (the slot's old tree goes only after the new one is in place). A flip to
//! a slot that already holds the image (staged by `fetch`) writes neither.
//! [`DiskNeed::of`] works that out: a blob in the store (or the part of
//! it a partial download has) costs nothing to fetch; a layer's unpacked
//! size is read from the gzip trailer of its stored blob where that is
//! exact (plus a tenth for filesystem blocks), else estimated as 4 × its
//! compressed size (node rootfs layers were measured at 3.0–3.6×).
//! [`disk_space`] then compares it with `statvfs` of each directory (or
//! its nearest existing parent on a fresh host): one sum when both live
//! on one filesystem, each part against its own otherwise.

use std::io::{Read as _, Seek as _, SeekFrom};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use kubeslot_image::layout::BlobDir;
use kubeslot_image::oci::Compression;
use kubeslot_image::source::SelectedImage;

use super::{read, Finding, Status};
use crate::config::SlotMode;
use crate::paths::Root;

/// Unpacked size per compressed byte, for a layer whose unpacked size is
/// not known exactly.
const UNPACK_FACTOR: u64 = 4;
/// The floor when the image is not known (`preflight` without a resolvable
/// config): a small node image unpacks to about this much.
const MIN_FREE_BYTES: u64 = 1 << 30;
/// A gzip trailer's size is the unpacked size modulo 2^32: trusted only
/// for blobs small enough that no real compression ratio wraps it.
const EXACT_GZIP_MAX: u64 = 256 << 20;

/// What the image costs on disk, as far as the preflight knows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum DiskUse {
    /// The image could not be resolved: only the floor is checked.
    #[default]
    Unknown,
    /// The target slot holds the image already: nothing is written.
    Staged,
    Needs(DiskNeed),
}

/// The bytes a flip writes for one image.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiskNeed {
    /// Blob bytes the content store lacks (config and layers).
    pub fetch: u64,
    /// The unpacked tree.
    pub tree: u64,
    /// Layers whose unpacked size was read, not estimated.
    pub exact_layers: usize,
    pub layers: usize,
}

impl DiskNeed {
    /// What staging `image` writes on the host under `root`, given what the
    /// content store holds.
    pub fn of(root: &Root, image: &SelectedImage) -> DiskNeed {
        let store = BlobDir::open(root.store());
        let missing = |digest: &kubeslot_image::Digest, size: u64| -> u64 {
            if store.contains(digest) {
                return 0;
            }
            let partial = store
                .root()
                .join("sha256")
                .join(format!(".partial-{}", digest.hex()));
            size.saturating_sub(std::fs::metadata(partial).map_or(0, |m| m.len()))
        };
        let mut need = DiskNeed {
            fetch: missing(&image.manifest.config.digest, image.manifest.config.size),
            layers: image.layers.len(),
            ..DiskNeed::default()
        };
        for (desc, compression, _) in &image.layers {
            // Saturating: sizes come from the image (u64::MAX is a refusal
            // for lack of space, never an overflow).
            need.fetch = need.fetch.saturating_add(missing(&desc.digest, desc.size));
            let exact = (*compression == Compression::Gzip && store.contains(&desc.digest))
                .then(|| gzip_unpacked(&store.path(&desc.digest), desc.size))
                .flatten();
            need.tree = need.tree.saturating_add(match exact {
                Some(bytes) => {
                    need.exact_layers += 1;
                    bytes.saturating_add(bytes / 10)
                }
                None => desc.size.saturating_mul(UNPACK_FACTOR),
            });
        }
        need
    }
}

/// The unpacked size a gzip blob's trailer (ISIZE) gives, when it can be
/// trusted: a blob under [`EXACT_GZIP_MAX`] whose ISIZE is not below its
/// compressed size (a wrapped one would be).
fn gzip_unpacked(blob: &Path, size: u64) -> Option<u64> {
    if !(18..=EXACT_GZIP_MAX).contains(&size) {
        return None;
    }
    let mut f = std::fs::File::open(blob).ok()?;
    f.seek(SeekFrom::End(-4)).ok()?;
    let mut trailer = [0u8; 4];
    f.read_exact(&mut trailer).ok()?;
    let isize = u64::from(u32::from_le_bytes(trailer));
    (isize >= size).then_some(isize)
}

pub fn checks(root: &Root, disk: &DiskUse) -> Vec<Finding> {
    vec![disk_space(root, disk), container_engine(root)]
}

fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes.div_ceil(1 << 20))
}

/// The directory itself, or its nearest existing parent (a fresh host).
fn existing(mut dir: PathBuf) -> PathBuf {
    while !dir.exists() {
        match dir.parent() {
            Some(p) => dir = p.to_path_buf(),
            None => break,
        }
    }
    dir
}

/// Free bytes for an unprivileged-or-not writer (`f_bavail`) and the
/// filesystem's device.
fn free(dir: &Path) -> Result<(u64, u64), String> {
    let s = rustix::fs::statvfs(dir).map_err(|e| format!("statvfs {}: {e}", dir.display()))?;
    let dev = std::fs::metadata(dir)
        .map_err(|e| format!("stat {}: {e}", dir.display()))?
        .dev();
    Ok((s.f_bavail.saturating_mul(s.f_frsize), dev))
}

/// The `disk-space` check (also run on its own by `fetch`).
pub fn disk_space(root: &Root, disk: &DiskUse) -> Finding {
    let machines = existing(root.machines_dir());
    let (m_free, m_dev) = match free(&machines) {
        Ok(f) => f,
        Err(e) => return Finding::new("disk-space", Status::Fail, e, "a readable filesystem"),
    };
    let seen_m = format!("{} free in {}", mib(m_free), machines.display());
    let need = match disk {
        DiskUse::Staged => {
            return Finding::new(
                "disk-space",
                Status::Pass,
                seen_m,
                "nothing: the target slot holds the image already",
            )
        }
        DiskUse::Unknown => {
            let needed = format!("{} free (image size unknown)", mib(MIN_FREE_BYTES));
            let status = if m_free >= MIN_FREE_BYTES {
                Status::Pass
            } else {
                Status::Fail
            };
            return Finding::new("disk-space", status, seen_m, needed);
        }
        DiskUse::Needs(n) => n,
    };
    let tree_how = if need.exact_layers == need.layers {
        "from the stored layers' sizes".to_string()
    } else if need.exact_layers == 0 {
        format!("{UNPACK_FACTOR} x the compressed layers")
    } else {
        format!(
            "{} of {} layers from their stored sizes, the rest {UNPACK_FACTOR} x compressed",
            need.exact_layers, need.layers
        )
    };
    let store = existing(root.store());
    let (s_free, s_dev) = match free(&store) {
        Ok(f) => f,
        Err(e) => return Finding::new("disk-space", Status::Fail, e, "a readable filesystem"),
    };
    let (ok, seen, needed) = if s_dev == m_dev {
        let total = need.fetch.saturating_add(need.tree);
        (
            m_free >= total,
            seen_m,
            format!(
                "{} free ({} of blobs to download + {} unpacked, {tree_how})",
                mib(total),
                mib(need.fetch),
                mib(need.tree)
            ),
        )
    } else {
        (
            m_free >= need.tree && s_free >= need.fetch,
            format!("{seen_m}, {} free in {}", mib(s_free), store.display()),
            format!(
                "{} free for the unpacked tree ({tree_how}), {} for blobs to download",
                mib(need.tree),
                mib(need.fetch)
            ),
        )
    };
    if ok {
        Finding::new("disk-space", Status::Pass, seen, needed)
    } else {
        Finding::new("disk-space", Status::Fail, seen, needed).hint(
            "free space under /var/lib/machines (the slot trees) and /var/lib/kubeslot (the content store) first",
        )
    }
}

fn container_engine(root: &Root) -> Finding {
    let needed = "no other container engine managing the host's iptables";
    let net = |ifname: &str| root.join("sys/class/net").join(ifname).exists();
    let docker = root.join("run/docker.sock").exists() || net("docker0");
    if docker {
        let daemon_json = root.join("etc/docker/daemon.json");
        let iptables_off = read(&daemon_json)
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .is_some_and(|v| v.get("iptables") == Some(&serde_json::Value::Bool(false)));
        if !iptables_off {
            return Finding::new(
                "container-engine",
                Status::Fail,
                "docker, managing iptables",
                needed,
            )
            .hint(
                "docker's DOCKER chains and FORWARD policy DROP cut off the node's pod traffic: \
                     stop docker, or set \"iptables\": false in /etc/docker/daemon.json",
            );
        }
    }
    let mut others = Vec::new();
    if docker {
        others.push("docker (iptables off)");
    }
    if net("cni-podman0") || net("podman0") {
        others.push("podman");
    }
    if root.join("run/containerd/containerd.sock").exists() {
        others.push("a containerd on the host");
    }
    if others.is_empty() {
        Finding::new("container-engine", Status::Pass, "none", needed)
    } else {
        Finding::new("container-engine", Status::Warn, others.join(", "), needed).hint(
            "it shares the host network with the node; its NAT and forwarding rules may \
             interfere with pod traffic",
        )
    }
}

/// `overlay-slots`: what the config's `slots.mode` gives on this host,
/// from [`crate::slots::overlay::probe`]'s result (`None`: not probed, the mode is
/// copy). The caller runs the probe (it mounts), this only judges it.
pub fn overlay_slots(mode: Option<SlotMode>, probe: Option<&Result<(), String>>) -> Finding {
    const NAME: &str = "overlay-slots";
    const NEEDED: &str = "overlayfs with whiteout devices and trusted.* xattrs on the layer store (or slots.mode = copy)";
    match (mode, probe) {
        (Some(SlotMode::Copy), _) | (_, None) => {
            Finding::new(NAME, Status::Pass, "slots.mode = copy", NEEDED)
        }
        (_, Some(Ok(()))) => Finding::new(
            NAME,
            Status::Pass,
            "overlayfs works here: slots are overlay mounts of shared layers",
            NEEDED,
        ),
        (None, Some(Err(why))) => Finding::new(NAME, Status::Warn, why.clone(), NEEDED)
            .hint("slots fall back to copy (every flip unpacks the whole image)"),
        (Some(SlotMode::Overlay), Some(Err(why))) => {
            Finding::new(NAME, Status::Fail, why.clone(), NEEDED)
                .hint("slots.mode is \"overlay\": fix the host, or set slots.mode = \"copy\"")
        }
    }
}
