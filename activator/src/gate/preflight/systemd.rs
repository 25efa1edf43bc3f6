//! `systemd` and `systemd-container`: the service manager runs as the init
//! system in a version the rendered files work with, and the nspawn tools
//! and the stock `systemd-nspawn@.service` are installed.
//!
//! Versions come from the dpkg database (`/var/lib/dpkg/status`, Debian and
//! Ubuntu hosts); without it a present tool passes with a warning that its
//! version is unknown. Nothing is executed.

use super::{read, Finding, Status};
use crate::paths::Root;

/// The oldest systemd the activator supports: Debian 11 ships 247,
/// Ubuntu 22.04 249 (tested: 252). The `.nspawn` settings, drop-in keys
/// and `systemd-run -M --wait --pipe` it relies on are older than that.
const MIN_SYSTEMD: u32 = 247;

pub fn checks(root: &Root) -> Vec<Finding> {
    let dpkg = read(&root.dpkg_status());
    vec![
        systemd(root, dpkg.as_deref()),
        container(root, dpkg.as_deref()),
    ]
}

/// The version of an installed package in a dpkg status file.
pub(super) fn dpkg_version(status: &str, package: &str) -> Option<String> {
    status.split("\n\n").find_map(|stanza| {
        let mut name = None;
        let mut installed = false;
        let mut version = None;
        for line in stanza.lines() {
            if let Some(v) = line.strip_prefix("Package: ") {
                name = Some(v.trim());
            } else if let Some(v) = line.strip_prefix("Status: ") {
                installed = v.trim().ends_with(" installed");
            } else if let Some(v) = line.strip_prefix("Version: ") {
                version = Some(v.trim().to_string());
            }
        }
        (name == Some(package) && installed)
            .then_some(version)
            .flatten()
    })
}

/// `252.39-1~deb12u2` → 252 (an epoch `1:` is skipped).
fn major(version: &str) -> Option<u32> {
    let v = version.rsplit_once(':').map_or(version, |(_, v)| v);
    v.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

fn systemd(root: &Root, dpkg: Option<&str>) -> Finding {
    let needed = format!("systemd as the init system, version {MIN_SYSTEMD} or newer");
    let running = root.systemd_running_marker().is_dir();
    let version = dpkg.and_then(|s| dpkg_version(s, "systemd"));
    let seen = match (&version, running) {
        (Some(v), true) => format!("{v}, running as init"),
        (Some(v), false) => format!("{v} installed, not the init system"),
        (None, true) => "running as init, version unknown (no dpkg record)".into(),
        (None, false) => "not the init system".into(),
    };
    if !running {
        return Finding::new("systemd", Status::Fail, seen, needed).hint(format!(
            "{} is missing: node machines are systemd units",
            root.systemd_running_marker().display()
        ));
    }
    match version.as_deref().and_then(major) {
        Some(m) if m >= MIN_SYSTEMD => Finding::new("systemd", Status::Pass, seen, needed),
        Some(_) => {
            Finding::new("systemd", Status::Fail, seen, needed).hint("upgrade the host's systemd")
        }
        None => Finding::new("systemd", Status::Warn, seen, needed),
    }
}

fn container(root: &Root, dpkg: Option<&str>) -> Finding {
    let needed =
        "systemd-nspawn, machinectl and systemd-nspawn@.service (package systemd-container)";
    let tools = [
        (
            "systemd-nspawn",
            &["usr/bin/systemd-nspawn", "bin/systemd-nspawn"][..],
        ),
        ("machinectl", &["usr/bin/machinectl", "bin/machinectl"][..]),
        (
            "systemd-nspawn@.service",
            &[
                "lib/systemd/system/systemd-nspawn@.service",
                "usr/lib/systemd/system/systemd-nspawn@.service",
            ][..],
        ),
    ];
    let missing: Vec<&str> = tools
        .iter()
        .filter(|(_, paths)| !paths.iter().any(|p| root.join(p).exists()))
        .map(|(name, _)| *name)
        .collect();
    let version = dpkg.and_then(|s| dpkg_version(s, "systemd-container"));
    if !missing.is_empty() {
        return Finding::new(
            "systemd-container",
            Status::Fail,
            format!("missing: {}", missing.join(", ")),
            needed,
        )
        .hint("apt-get install systemd-container");
    }
    match version {
        Some(v) => Finding::new("systemd-container", Status::Pass, v, needed),
        None => Finding::new(
            "systemd-container",
            Status::Warn,
            "installed, version unknown (no dpkg record)",
            needed,
        ),
    }
}
