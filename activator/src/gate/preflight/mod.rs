//! Preflight: does this host have what a node machine needs, before the
//! activator stages an image and stops the running node for it.
//!
//! Each check has a stable kebab-case name (kubeadm style; `--ignore NAME`
//! and the config's `"preflight": {"ignore": [...]}` use it), a verdict
//! (pass, warn, fail), the value seen and the value needed. [`run`] runs
//! them all and returns a [`Preflight`]; `activate` runs it before every
//! flip (a first activation included) and refuses with exit 3 when an
//! un-ignored check fails, before anything is fetched or stopped; the
//! `preflight` command prints it.
//!
//! Everything is read through the root handle (`/proc`, `/sys`, `/dev`,
//! `/var/lib/dpkg/status`, `/etc/docker`, ...), so tests give it fake trees;
//! no process is run and nothing is written. The checks live by subject:
//!
//! * `systemd.rs` — `systemd` (init system, version) and `systemd-container`;
//! * `kernel.rs` — `cgroup-v2`, `kernel-module-*`, `sysctl-*`, `swap`,
//!   `dev-kmsg` (the values come from `host_settings`, the one table the
//!   rendered sysctl file is made from);
//! * `host.rs` — `disk-space` (what staging the image writes, from what the
//!   content store holds), `container-engine`;
//! * `gpu.rs` — the GPU checks, run when the config binds GPUs and the host
//!   has (or must have) them, or has an NVIDIA GPU without its driver:
//!   `gpu-pci`, `gpu-driver`, `gpu-nvidiactl`, `gpu-nvidia-uvm`,
//!   `gpu-libraries` (the one check that runs a process: `ldconfig -p`,
//!   through `gpu::run_ldconfig`, as the render does), `gpu-tools` and
//!   `gpu-persistenced`.
//!
//! It does not fix anything: the settings the activator can make itself
//! (sysctls, module loading) are written and applied by `host_settings`
//! before `activate` runs the checks, so these see their effect.

mod gpu;
mod host;
mod kernel;
mod systemd;

pub use host::{overlay_slots, DiskNeed, DiskUse};

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::paths::Root;
use crate::render::gpu::Discovery;

/// A check's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    /// Not blocking: the node may still work (a version nobody tested, a
    /// module that is loadable but not loaded yet).
    Warn,
    /// The node cannot work as the host is: the flip is refused.
    Fail,
}

/// The result of one check.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// The check's stable name (`sysctl-net.ipv4.ip_forward`).
    pub name: String,
    pub status: Status,
    /// What the host has.
    pub seen: String,
    /// What the node needs.
    pub needed: String,
    /// How to fix a failure (or why a warning matters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    /// A failure the operator chose to ignore (`--ignore`, the config).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ignored: bool,
}

impl Finding {
    fn new(
        name: impl Into<String>,
        status: Status,
        seen: impl Into<String>,
        needed: impl Into<String>,
    ) -> Finding {
        Finding {
            name: name.into(),
            status,
            seen: seen.into(),
            needed: needed.into(),
            hint: None,
            ignored: false,
        }
    }

    fn hint(mut self, hint: impl Into<String>) -> Finding {
        self.hint = Some(hint.into());
        self
    }

    /// A failure that blocks (not ignored).
    pub fn blocks(&self) -> bool {
        self.status == Status::Fail && !self.ignored
    }
}

/// What the checks need besides the host's files.
#[derive(Clone, Debug, Default)]
pub struct Inputs {
    /// The host's GPUs as the run read them for the config's setting
    /// (GPU checks run unless its mode is `off`); the render binds from
    /// the same value.
    pub gpu: Discovery,
    /// Names of checks whose failure does not block: exact names, `all`,
    /// or a prefix ending in `*` (`sysctl-*`).
    pub ignore: Vec<String>,
    /// What staging the image writes (unknown when the image could not be
    /// resolved; nothing when the target slot holds it already).
    pub disk: DiskUse,
    /// What lets the node's kubelet run with swap, when the config says so
    /// ([`crate::config::Config::kubelet_allows_swap`]): active swap then
    /// passes the `swap` check.
    pub swap_allowed: Option<String>,
    /// kubeslot's host settings (sysctl, modules-load drop-ins) are not
    /// written as rendered yet: a sysctl or module the next `activate`
    /// writes and applies before its own checks is a warning here, not a
    /// failure (the standalone `preflight` command, which changes nothing).
    pub settings_pending: bool,
    /// The image the config runs and whether it names a `gpu_image` (the
    /// NVIDIA variant), for the `gpu-image` check; `None` without a config.
    pub image: Option<ImageChoice>,
}

/// The image a config runs (after the variant was chosen).
#[derive(Clone, Debug, Default)]
pub struct ImageChoice {
    /// The image that runs (`gpu_image` when it was chosen).
    pub image: String,
    /// The config names a `gpu_image`.
    pub gpu_image: bool,
}

impl ImageChoice {
    /// What `config` (its variant chosen) runs.
    pub fn of(config: &crate::config::Config) -> ImageChoice {
        ImageChoice {
            image: config.image.to_string(),
            gpu_image: config.gpu_image.is_some(),
        }
    }
}

/// Every finding of one preflight run, in check order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preflight {
    pub checks: Vec<Finding>,
}

impl Preflight {
    /// The failures that block a flip.
    pub fn blocking(&self) -> Vec<&Finding> {
        self.checks.iter().filter(|f| f.blocks()).collect()
    }

    pub fn passed(&self) -> bool {
        self.blocking().is_empty()
    }

    /// The findings that are not a plain pass (for the report).
    pub fn notable(&self) -> Vec<Finding> {
        self.checks
            .iter()
            .filter(|f| f.status != Status::Pass)
            .cloned()
            .collect()
    }

    /// One line naming each blocking failure with what was seen and
    /// needed, for the error of a refused flip.
    pub fn failure_summary(&self) -> String {
        self.blocking()
            .iter()
            .map(|f| format!("{} (seen: {}; needed: {})", f.name, f.seen, f.needed))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Whether `name` matches one of the ignore patterns.
pub fn is_ignored(name: &str, ignore: &[String]) -> bool {
    ignore.iter().any(|p| {
        p == "all"
            || p == name
            || p.strip_suffix('*')
                .is_some_and(|prefix| name.starts_with(prefix))
    })
}

/// The `disk-space` check alone (what `fetch` runs before it stages).
pub fn disk_only(root: &Root, inputs: &Inputs) -> Preflight {
    let mut f = host::disk_space(root, &inputs.disk);
    f.ignored = f.status == Status::Fail && is_ignored(&f.name, &inputs.ignore);
    Preflight { checks: vec![f] }
}

/// Runs every check against the host under `root`.
pub fn run(root: &Root, inputs: &Inputs) -> Preflight {
    let mut checks = Vec::new();
    checks.extend(systemd::checks(root));
    checks.extend(kernel::checks(
        root,
        inputs.settings_pending,
        inputs.swap_allowed.as_deref(),
    ));
    checks.extend(host::checks(root, &inputs.disk));
    checks.extend(gpu::checks(root, &inputs.gpu));
    checks.extend(gpu::image(root, &inputs.gpu, inputs.image.as_ref()));
    for f in &mut checks {
        f.ignored = f.status == Status::Fail && is_ignored(&f.name, &inputs.ignore);
    }
    Preflight { checks }
}

impl fmt::Display for Preflight {
    /// kubeadm-style lines, one per check, then a verdict line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in &self.checks {
            let tag = match (c.status, c.ignored) {
                (Status::Fail, true) => "IGNORED",
                (Status::Fail, false) => "FAIL",
                (Status::Warn, _) => "WARN",
                (Status::Pass, _) => "PASS",
            };
            write!(
                f,
                "[{tag}] {}: seen {}; needed {}",
                c.name, c.seen, c.needed
            )?;
            if let (Some(h), true) = (&c.hint, c.status != Status::Pass) {
                write!(f, " ({h})")?;
            }
            writeln!(f)?;
        }
        let blocking = self.blocking();
        if blocking.is_empty() {
            writeln!(f, "[preflight] passed")
        } else {
            writeln!(
                f,
                "[preflight] {} check(s) failed: {}; fix the host, or ignore a check with --ignore NAME or the config's \"preflight\": {{\"ignore\": [NAME]}}",
                blocking.len(),
                blocking.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", ")
            )
        }
    }
}

/// Reads a small text file under the root; `None` when it cannot be read.
fn read(path: &std::path::Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// Whether `path` is a character device (not following a symlink's
/// target is deliberate only for trees we unpack; device nodes under /dev
/// may be links, e.g. /dev/kmsg on some hosts, so this follows them).
fn is_char_device(path: &std::path::Path) -> bool {
    use std::os::unix::fs::FileTypeExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_char_device())
}

#[cfg(test)]
mod tests;
