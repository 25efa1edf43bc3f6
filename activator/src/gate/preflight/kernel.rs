//! The kernel as the node machine finds it: `cgroup-v2` with the
//! controllers the kubelet needs, `kernel-module-overlay` and
//! `kernel-module-br_netfilter`, one `sysctl-<key>` per value of
//! `host_settings::SYSCTLS`, `swap` and `dev-kmsg`.
//!
//! A module counts as loaded when `/proc/modules` lists it, `/sys/module`
//! has it, or the kernel shows what it provides (built-in modules appear in
//! neither list: `overlay` in `/proc/filesystems`, `br_netfilter` as
//! `/proc/sys/net/bridge`); as loadable when `modules.dep` of the running
//! kernel names it.

use super::{is_char_device, read, Finding, Status};
use crate::paths::Root;
use crate::render::host_settings::{MODULES, SYSCTLS};

/// cgroup v2 controllers the kubelet cannot run without, and ones it uses
/// when present.
const REQUIRED_CONTROLLERS: &[&str] = &["cpu", "cpuset", "memory", "pids"];
const OPTIONAL_CONTROLLERS: &[&str] = &["io", "hugetlb"];

/// `settings_pending`: kubeslot's sysctl and modules-load drop-ins are not
/// written yet, so the sysctl failures they would fix are warnings
/// (`activate` writes and applies them before its checks).
/// `swap_allowed`: what lets the kubelet run with swap, if anything.
pub fn checks(root: &Root, settings_pending: bool, swap_allowed: Option<&str>) -> Vec<Finding> {
    let mut settings = Vec::new();
    settings.extend(MODULES.iter().map(|(m, why)| module(root, m, why)));
    settings.extend(SYSCTLS.iter().map(|s| sysctl(root, s.key, s.value, s.why)));
    if settings_pending {
        // (a module that is not even loadable stays a failure: no drop-in
        // loads it)
        for f in settings
            .iter_mut()
            .filter(|f| f.status == Status::Fail && f.name.starts_with("sysctl-"))
        {
            f.status = Status::Warn;
            f.hint = Some(format!(
                "not applied yet: `activate` writes {} and {} and applies them before its checks; \
                 this check fails there if the kernel does not take them",
                Root::host().modules_load_dropin().display(),
                Root::host().sysctl_dropin().display()
            ));
        }
    }
    let mut out = vec![cgroup_v2(root)];
    out.extend(settings);
    out.push(swap(root, swap_allowed));
    out.push(kmsg(root));
    out
}

fn cgroup_v2(root: &Root) -> Finding {
    let path = root.cgroup_fs().join("cgroup.controllers");
    let needed = format!(
        "the unified cgroup v2 hierarchy at /sys/fs/cgroup with the {} controllers",
        REQUIRED_CONTROLLERS.join(", ")
    );
    let Some(text) = read(&path) else {
        let seen = if root.cgroup_fs().join("unified").is_dir() {
            "a hybrid v1/v2 layout (v2 at /sys/fs/cgroup/unified)"
        } else {
            "no cgroup v2 at /sys/fs/cgroup"
        };
        return Finding::new("cgroup-v2", Status::Fail, seen, needed).hint(
            "boot the host with systemd.unified_cgroup_hierarchy=1: the node's kubelet and runc \
             need cgroup v2 controllers",
        );
    };
    let have: Vec<&str> = text.split_whitespace().collect();
    let missing: Vec<&str> = REQUIRED_CONTROLLERS
        .iter()
        .filter(|c| !have.contains(c))
        .copied()
        .collect();
    let seen = format!(
        "controllers: {}",
        if have.is_empty() {
            "none".into()
        } else {
            have.join(" ")
        }
    );
    if !missing.is_empty() {
        return Finding::new("cgroup-v2", Status::Fail, seen, needed)
            .hint(format!("missing controllers: {}", missing.join(", ")));
    }
    let optional: Vec<&str> = OPTIONAL_CONTROLLERS
        .iter()
        .filter(|c| !have.contains(c))
        .copied()
        .collect();
    if optional.is_empty() {
        Finding::new("cgroup-v2", Status::Pass, seen, needed)
    } else {
        Finding::new("cgroup-v2", Status::Warn, seen, needed).hint(format!(
            "without {} the kubelet cannot limit those resources",
            optional.join(", ")
        ))
    }
}

/// What shows that a module is loaded or built in.
fn loaded(root: &Root, name: &str) -> Option<&'static str> {
    if read(&root.proc("modules"))
        .is_some_and(|t| t.lines().any(|l| l.split_whitespace().next() == Some(name)))
    {
        return Some("loaded");
    }
    if root.sys_module(name).is_dir() {
        return Some("loaded (/sys/module)");
    }
    let builtin = match name {
        "overlay" => read(&root.proc("filesystems")).is_some_and(|t| {
            t.lines()
                .any(|l| l.split_whitespace().last() == Some("overlay"))
        }),
        "br_netfilter" => root.proc_sys("net.bridge").is_dir(),
        _ => false,
    };
    builtin.then_some("present in the kernel (built in)")
}

/// Whether the running kernel's `modules.dep` lists the module.
fn loadable(root: &Root, name: &str) -> bool {
    let Some(release) = read(&root.proc_sys("kernel.osrelease")) else {
        return false;
    };
    let dir = root.kernel_modules(release.trim());
    let listed = |file: &str| {
        read(&dir.join(file)).is_some_and(|t| {
            t.lines().any(|l| {
                let path = l.split(':').next().unwrap_or("");
                let base = path.rsplit('/').next().unwrap_or("");
                base.split('.').next() == Some(name) && base.contains(".ko")
            })
        })
    };
    listed("modules.dep") || listed("modules.builtin")
}

fn module(root: &Root, name: &str, why: &str) -> Finding {
    let check = format!("kernel-module-{name}");
    let needed = format!("loaded or loadable ({why})");
    if let Some(how) = loaded(root, name) {
        return Finding::new(check, Status::Pass, how, needed);
    }
    if loadable(root, name) {
        return Finding::new(check, Status::Warn, "loadable, not loaded", needed).hint(format!(
            "{} loads it at boot; `activate` loads it before a flip",
            Root::host().modules_load_dropin().display()
        ));
    }
    Finding::new(
        check,
        Status::Fail,
        "neither loaded nor in the running kernel's modules",
        needed,
    )
    .hint("install the kernel's modules package")
}

fn sysctl(root: &Root, key: &str, want: &str, why: &str) -> Finding {
    let check = format!("sysctl-{key}");
    let needed = format!("{want} ({why})");
    match read(&root.proc_sys(key)) {
        Some(v) if v.trim() == want => Finding::new(check, Status::Pass, v.trim(), needed),
        Some(v) => Finding::new(check, Status::Fail, v.trim(), needed).hint(format!(
            "{} sets it at boot and `activate` applies it; a container host or a later \
             sysctl.d file may override it",
            Root::host().sysctl_dropin().display()
        )),
        None => {
            let hint = if key.starts_with("net.bridge.") {
                "the key exists once br_netfilter is loaded"
            } else {
                "the kernel has no such parameter"
            };
            Finding::new(check, Status::Fail, "missing", needed).hint(hint)
        }
    }
}

fn swap(root: &Root, allowed: Option<&str>) -> Finding {
    let needed =
        "no active swap (the kubelet refuses to start with swap unless its config allows it)";
    let Some(text) = read(&root.proc("swaps")) else {
        return Finding::new("swap", Status::Warn, "/proc/swaps unreadable", needed);
    };
    let active: Vec<&str> = text
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    if active.is_empty() {
        Finding::new("swap", Status::Pass, "off", needed)
    } else if let Some(by) = allowed {
        Finding::new(
            "swap",
            Status::Pass,
            format!("on: {}; the kubelet allows it ({by})", active.join(", ")),
            needed,
        )
    } else {
        Finding::new(
            "swap",
            Status::Fail,
            format!("on: {}", active.join(", ")),
            needed,
        )
        .hint(
            "swapoff -a and remove swap from /etc/fstab; or let the kubelet run with swap: \
             \"kubelet\": {\"config\": {\"failSwapOn\": false}} in the config (or, when the \
             image's own kubelet config sets it, \"preflight\": {\"allow_swap\": true})",
        )
    }
}

fn kmsg(root: &Root) -> Finding {
    let path = root.dev().join("kmsg");
    let needed = "a character device (the kubelet's OOM watcher reads the kernel log)";
    if is_char_device(&path) {
        Finding::new("dev-kmsg", Status::Pass, "character device", needed)
    } else if path.exists() {
        Finding::new("dev-kmsg", Status::Fail, "not a character device", needed)
    } else {
        Finding::new("dev-kmsg", Status::Fail, "missing", needed)
            .hint("a host that is itself a container (nspawn, docker) has no /dev/kmsg")
    }
}
