//! What a node's pod network leaves in the host's network namespace (the
//! machine shares it): links a CNI creates (`cni0`, `cbr0`, `flannel.*`,
//! `cilium_*`, `vxlan0`, `geneve0`, `wg*`) and the policy routing rules and
//! tables 51820-51899 of WireGuard-based networks (unbounded-net's). The
//! unbounded agent's reset deletes them; `uninstall` does too, but never one
//! the host had before its first node ran.
//!
//! Owns the record of what the host had ([`record_if_missing`], at the
//! first activation: `/var/lib/kubeslot/host-network.json`, link names and
//! the tables in the range that held rules or routes), what `uninstall`
//! would remove given it ([`leftovers`]: nothing without a record) and the
//! removal ([`remove`]). Links are read from the root's `/sys/class/net`;
//! rules and routes are read and changed with `ip` (on `PATH`, like the
//! systemd tools), in the namespace the activator runs in. Tests run it in
//! a network namespace they create, never the machine's own.

use std::collections::BTreeSet;
use std::ops::RangeInclusive;
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

use crate::paths::Root;

/// Links a node's pod network creates in the host's namespace (`*`: any
/// suffix).
pub const LINK_PATTERNS: &[&str] = &[
    "cni0",
    "cbr0",
    "flannel.*",
    "cilium_*",
    "vxlan0",
    "geneve0",
    "wg*",
];

/// The routing tables of WireGuard-based pod networks.
pub const TABLES: RangeInclusive<u32> = 51820..=51899;

/// What the host had before its first node: never removed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// When it was taken (RFC 3339).
    pub recorded: String,
    /// Every link of the namespace.
    pub links: Vec<String>,
    /// The tables of [`TABLES`] that held rules or routes.
    pub tables: Vec<u32>,
}

/// What `uninstall` removes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// Links matching [`LINK_PATTERNS`] the host did not have.
    pub links: Vec<String>,
    /// Tables of [`TABLES`] the host did not have that hold rules or
    /// routes, with what they hold (as `ip` shows it).
    pub tables: Vec<(u32, Vec<String>)>,
    /// Why nothing is removed (no record), when so.
    pub unrecorded: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    #[error("{path}: {reason}")]
    Record {
        path: std::path::PathBuf,
        reason: String,
    },
    #[error("{command}: {reason}")]
    Ip { command: String, reason: String },
}

/// Whether `name` matches one of [`LINK_PATTERNS`].
fn is_node_link(name: &str) -> bool {
    LINK_PATTERNS.iter().any(|p| match p.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix) && name.len() > prefix.len(),
        None => name == *p,
    })
}

/// The links of the namespace (the root's `/sys/class/net`), sorted.
pub fn links(root: &Root) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root.net_links())
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn ip(args: &[&str]) -> Result<String, NetworkError> {
    let command = format!("ip {}", args.join(" "));
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| NetworkError::Ip {
            command: command.clone(),
            reason: format!("cannot run: {e} (is iproute2 installed?)"),
        })?;
    if !out.status.success() {
        return Err(NetworkError::Ip {
            command,
            reason: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `ip FAMILY ARGS...`; for IPv6 a host without it answers nothing.
fn ip_family(family: &str, args: &[&str]) -> Result<String, NetworkError> {
    let mut all = vec![family];
    all.extend_from_slice(args);
    match ip(&all) {
        Err(_) if family == "-6" => Ok(String::new()),
        other => other,
    }
}

/// The table a rule or route line names (`lookup N` / `table N`), if in
/// [`TABLES`].
fn table_of(line: &str) -> Option<u32> {
    line.split_whitespace()
        .skip_while(|w| *w != "lookup" && *w != "table")
        .nth(1)
        .and_then(|t| t.parse::<u32>().ok())
        .filter(|t| TABLES.contains(t))
}

/// The rules (`ip -4/-6 rule`) and routes (`ip -4/-6 route show table
/// all`) of each table of [`TABLES`] that holds any, by table.
fn tables() -> Result<Vec<(u32, Vec<String>)>, NetworkError> {
    let mut out: std::collections::BTreeMap<u32, Vec<String>> = Default::default();
    for family in ["-4", "-6"] {
        for line in ip_family(family, &["rule", "show"])?.lines() {
            if let Some(t) = table_of(line) {
                out.entry(t)
                    .or_default()
                    .push(format!("rule {}", line.trim()));
            }
        }
        for line in ip_family(family, &["route", "show", "table", "all"])?.lines() {
            if let Some(t) = table_of(line) {
                out.entry(t)
                    .or_default()
                    .push(format!("route {}", line.trim()));
            }
        }
    }
    Ok(out.into_iter().collect())
}

/// Whether the root's `/sys/class/net` is the namespace the activator
/// runs in (the root is `/`, or shows it): only then are its links and
/// `ip`'s rules and routes the same network. A root prepared elsewhere
/// (`--root DIR`) never has the running namespace recorded or changed.
pub fn live(root: &Root) -> bool {
    std::fs::canonicalize(root.net_links())
        .is_ok_and(|p| p == std::path::Path::new("/sys/class/net"))
}

/// At the first activation (no record yet): records the host's links and
/// the tables of [`TABLES`] in use; `Some(note)` when it wrote one.
pub fn record_if_missing(root: &Root) -> Result<Option<String>, NetworkError> {
    let path = root.host_network_record();
    if path.exists() || !live(root) {
        return Ok(None);
    }
    let record = Record {
        recorded: kubeslot_image::time::now_rfc3339(),
        links: links(root),
        tables: tables()?.into_iter().map(|(t, _)| t).collect(),
    };
    let mut bytes = serde_json::to_vec_pretty(&record).expect("a record serialises");
    bytes.push(b'\n');
    if let Some(dir) = path.parent() {
        kubeslot_image::atomic::create_dir(dir, 0o700).map_err(|e| NetworkError::Record {
            path: path.clone(),
            reason: kubeslot_image::error_chain(&e),
        })?;
    }
    kubeslot_image::atomic::write_file_mode(&path, &bytes, 0o600).map_err(|e| {
        NetworkError::Record {
            path: path.clone(),
            reason: kubeslot_image::error_chain(&e),
        }
    })?;
    Ok(Some(format!(
        "recorded the host's network before its first node ({} links, tables {:?} in use): uninstall never removes them",
        record.links.len(),
        record.tables
    )))
}

/// What `uninstall` removes (see the module doc).
pub fn leftovers(root: &Root) -> Result<Leftovers, NetworkError> {
    let path = root.host_network_record();
    if !live(root) {
        return Ok(Leftovers {
            unrecorded: Some(format!(
                "{} is not the network namespace this runs in: no link, rule or route is touched",
                root.net_links().display()
            )),
            ..Leftovers::default()
        });
    }
    let record: Record = match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| NetworkError::Record {
            path: path.clone(),
            reason: e.to_string(),
        })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Leftovers {
                unrecorded: Some(format!(
                    "{} does not exist (the first activation records what the host had): no link, rule or route is removed",
                    Root::host().host_network_record().display()
                )),
                ..Leftovers::default()
            })
        }
        Err(e) => {
            return Err(NetworkError::Record {
                path,
                reason: e.to_string(),
            })
        }
    };
    let had: BTreeSet<&str> = record.links.iter().map(String::as_str).collect();
    let links = links(root)
        .into_iter()
        .filter(|l| is_node_link(l) && !had.contains(l.as_str()))
        .collect();
    let tables = tables()?
        .into_iter()
        .filter(|(t, _)| !record.tables.contains(t))
        .collect();
    Ok(Leftovers {
        links,
        tables,
        unrecorded: None,
    })
}

/// Removes `l`: each link still there (`ip link delete`; a veth's peer
/// goes with it), each table's rules (`ip rule del table N` until none is
/// left) and routes (`ip route flush table N`), both families. Returns
/// what it removed, as lines.
pub fn remove(root: &Root, l: &Leftovers) -> Result<Vec<String>, NetworkError> {
    let mut done = Vec::new();
    for link in &l.links {
        if !links(root).contains(link) {
            continue;
        }
        ip(&["link", "delete", "dev", link])?;
        done.push(format!("link {link}"));
    }
    for (table, _) in &l.tables {
        let t = table.to_string();
        for family in ["-4", "-6"] {
            // `rule del` removes one rule per call
            let mut left = 1000;
            while left > 0
                && ip_family(family, &["rule", "show"])?
                    .lines()
                    .any(|l| table_of(l) == Some(*table))
            {
                ip_family(family, &["rule", "del", "table", &t])?;
                left -= 1;
            }
            // a table only a rule named has no routes: `ip` says it does
            // not exist
            let routes = match ip_family(family, &["route", "show", "table", &t]) {
                Err(NetworkError::Ip { reason, .. }) if reason.contains("does not exist") => {
                    String::new()
                }
                other => other?,
            };
            if !routes.trim().is_empty() {
                ip_family(family, &["route", "flush", "table", &t])?;
            }
        }
        done.push(format!("routing table {t} (rules and routes)"));
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_links_by_name() {
        for yes in [
            "cni0",
            "cbr0",
            "flannel.1",
            "cilium_host",
            "vxlan0",
            "geneve0",
            "wg0",
            "wg-mesh",
        ] {
            assert!(is_node_link(yes), "{yes}");
        }
        for no in [
            "eth0", "lo", "cni1", "flannel", "wg", "cilium", "vxlan1", "docker0",
        ] {
            assert!(!is_node_link(no), "{no}");
        }
    }
}
