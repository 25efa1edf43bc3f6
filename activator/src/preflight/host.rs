//! The host around the node: `disk-space` under `/var/lib/machines` for
//! the image, and `container-engine` (another engine's iptables rules or a
//! second containerd beside the node's).
//!
//! Free space is `statvfs` of `/var/lib/machines` (or its nearest existing
//! parent on a fresh host). What an image needs is estimated from its
//! compressed layers: a node rootfs unpacks to about 3× its gzip or zstd
//! size (measured: 3.0–3.6×), and the old tree of the slot is removed only
//! after the new one is in place.

use super::{read, Finding, Status};
use crate::paths::Root;

/// Unpacked size per compressed byte, the estimate's factor.
pub const UNPACK_FACTOR: u64 = 3;
/// The floor when the image is not known yet (`preflight` without a
/// resolvable config): a small node image unpacks to about this much.
pub const MIN_FREE_BYTES: u64 = 1 << 30;

pub fn checks(root: &Root, image_bytes: Option<u64>) -> Vec<Finding> {
    vec![disk_space(root, image_bytes), container_engine(root)]
}

fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes / (1 << 20))
}

fn disk_space(root: &Root, image_bytes: Option<u64>) -> Finding {
    let (need, needed) = match image_bytes {
        Some(b) => {
            let need = b.saturating_mul(UNPACK_FACTOR).max(MIN_FREE_BYTES);
            (
                need,
                format!(
                    "{} free ({UNPACK_FACTOR} x the image's {} of compressed layers, at least {})",
                    mib(need),
                    mib(b),
                    mib(MIN_FREE_BYTES)
                ),
            )
        }
        None => (
            MIN_FREE_BYTES,
            format!("{} free (image size unknown)", mib(MIN_FREE_BYTES)),
        ),
    };
    let mut dir = root.machines_dir();
    while !dir.exists() {
        match dir.parent() {
            Some(p) => dir = p.to_path_buf(),
            None => break,
        }
    }
    match rustix::fs::statvfs(&dir) {
        Err(e) => Finding::new(
            "disk-space",
            Status::Fail,
            format!("statvfs {}: {e}", dir.display()),
            needed,
        ),
        Ok(s) => {
            let free = s.f_bavail.saturating_mul(s.f_frsize);
            let seen = format!("{} free in {}", mib(free), dir.display());
            if free >= need {
                Finding::new("disk-space", Status::Pass, seen, needed)
            } else {
                Finding::new("disk-space", Status::Fail, seen, needed)
                    .hint("free space under /var/lib/machines (the slot trees) first")
            }
        }
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
