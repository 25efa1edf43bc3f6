//! The config values that end up in a node's rendered files (the kubelet's
//! flags, labels and taints, its config drop-in, containerd's registry
//! mirror files), checked when the config is validated: a label the
//! kubelet may not set, a taint or a mirror that would break the file it
//! lands in is a config error, before any host fact is read.
//!
//! Given the parsed [`Config`]; reads nothing. `render` uses
//! [`registry_mirrors`] and [`check_node_name`] (for the host name, a fact).

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::{Config, RegistryMirror};

/// A value refused, with the field it came from and the rule it broke.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    pub field: &'static str,
    pub value: String,
    pub reason: String,
}

fn invalid(field: &'static str, value: &str, reason: &str) -> Invalid {
    Invalid {
        field,
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

/// The registry mirrors containerd gets: `containerd.registry_mirrors` when
/// set, else every `registries` entry with mirrors (what the activator
/// itself uses for the node image), each mirror speaking plain HTTP when the
/// activator would (its own `registries` entry says `insecure`, or it is a
/// loopback address).
pub fn registry_mirrors(config: &Config) -> BTreeMap<String, RegistryMirror> {
    if let Some(m) = &config.containerd.registry_mirrors {
        return m.clone();
    }
    config
        .registries
        .iter()
        .filter(|(_, r)| !r.mirrors.is_empty())
        .map(|(host, r)| {
            let mirrors = r
                .mirrors
                .iter()
                .map(|m| {
                    if m.contains("://") {
                        return m.clone();
                    }
                    let name = m.split('/').next().unwrap_or(m);
                    let plain = kubeslot_image::registry::is_loopback(name)
                        || config.registries.get(name).is_some_and(|r| r.insecure);
                    format!("{}://{m}", if plain { "http" } else { "https" })
                })
                .collect();
            (
                host.clone(),
                RegistryMirror {
                    mirrors,
                    insecure: false,
                    ca_file: None,
                },
            )
        })
        .collect()
}

/// Node name rule: a lowercase DNS subdomain (what the API server accepts).
pub fn check_node_name(field: &'static str, name: &str) -> Result<(), Invalid> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(invalid(
            field,
            name,
            "is not a lowercase DNS name (a-z, 0-9, '-', '.')",
        ))
    }
}

/// Label keys/values and taint parts end up in a systemd `Environment=`
/// line, so they are held to the Kubernetes character set (no spaces,
/// quotes, `%` or `$`).
pub(crate) fn is_label_text(s: &str, allow_slash: bool) -> bool {
    s.len() <= 316
        && s.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || b == b'-'
                || b == b'_'
                || b == b'.'
                || (allow_slash && b == b'/')
        })
}

/// Labels in the `kubernetes.io`/`k8s.io` namespaces that a kubelet may set
/// on its own node (`k8s.io/kubelet/pkg/apis`, `IsKubeletLabel`); any other
/// label there makes the kubelet refuse to start, which would only show as a
/// failed health gate.
const KUBELET_LABELS: &[&str] = &[
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
];
const KUBELET_LABEL_NAMESPACES: &[&str] = &["kubelet.kubernetes.io", "node.kubernetes.io"];

fn kubelet_may_set(key: &str) -> bool {
    let Some((ns, _)) = key.split_once('/') else {
        return true;
    };
    let in_ns = |n: &str| ns == n || ns.ends_with(&format!(".{n}"));
    if !in_ns("kubernetes.io") && !in_ns("k8s.io") {
        return true;
    }
    KUBELET_LABELS.contains(&key) || KUBELET_LABEL_NAMESPACES.iter().any(|n| in_ns(n))
}

/// Checks the config values that end up in rendered files: the kubelet's
/// node name, labels, taints, cluster DNS and domain, node IP, and the
/// registry and mirror names of containerd's `certs.d` files.
pub fn check(config: &Config) -> Result<(), Invalid> {
    let k = &config.kubelet;
    if let Some(name) = &k.node_name {
        check_node_name("kubelet.node_name", name)?;
    }
    for (key, value) in &k.labels {
        if key.is_empty() || !is_label_text(key, true) {
            return Err(invalid(
                "kubelet.labels",
                key,
                "is not a label key (a-z, A-Z, 0-9, '-', '_', '.', '/')",
            ));
        }
        if !kubelet_may_set(key) {
            return Err(invalid(
                "kubelet.labels",
                key,
                "is in the kubernetes.io/k8s.io namespace, which a kubelet may not set on its node \
                 (allowed there: node.kubernetes.io/*, kubelet.kubernetes.io/*, topology.kubernetes.io/zone|region, ...)",
            ));
        }
        if !is_label_text(value, false) {
            return Err(invalid(
                "kubelet.labels",
                value,
                "is not a label value (a-z, A-Z, 0-9, '-', '_', '.')",
            ));
        }
    }
    for taint in &k.taints {
        let ok = taint.rsplit_once(':').is_some_and(|(kv, effect)| {
            let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
            matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute")
                && !key.is_empty()
                && is_label_text(key, true)
                && is_label_text(value, false)
        });
        if !ok {
            return Err(invalid(
                "kubelet.taints",
                taint,
                "is not key[=value]:NoSchedule|PreferNoSchedule|NoExecute",
            ));
        }
    }
    for dns in &k.cluster_dns {
        if dns.parse::<IpAddr>().is_err() {
            return Err(invalid("kubelet.cluster_dns", dns, "is not an IP address"));
        }
    }
    check_node_name("kubelet.cluster_domain", &k.cluster_domain)?;
    if let Some(ips) = &k.node_ip {
        let parsed: Vec<Option<IpAddr>> = ips.split(',').map(|ip| ip.parse().ok()).collect();
        let ok = match parsed[..] {
            [Some(_)] => true,
            [Some(a), Some(b)] => a.is_ipv4() != b.is_ipv4(),
            _ => false,
        };
        if !ok {
            return Err(invalid(
                "kubelet.node_ip",
                ips,
                "is not an IP address, or an IPv4 and an IPv6 address separated by a comma",
            ));
        }
    }
    check_extra_mounts(config)?;
    check_containerd(config)?;
    check_bundle(config)?;
    for (registry, m) in registry_mirrors(config) {
        // registry and mirror names end up in TOML strings and directory names
        let host_ok = |h: &str| {
            !h.is_empty()
                && h.bytes().all(|b| {
                    b.is_ascii_alphanumeric()
                        || matches!(b, b'.' | b'-' | b':' | b'_' | b'[' | b']')
                })
        };
        if !host_ok(&registry) {
            return Err(invalid(
                "containerd.registry_mirrors",
                &registry,
                "is not a registry host[:port]",
            ));
        }
        for mirror in &m.mirrors {
            let rest = mirror
                .strip_prefix("https://")
                .or_else(|| mirror.strip_prefix("http://"))
                .unwrap_or(mirror);
            let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
            let path_ok = path
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'.' | b'-' | b'_'));
            if !host_ok(host) || !path_ok || (mirror.contains("://") && !mirror.starts_with("http"))
            {
                return Err(invalid(
                    "containerd.registry_mirrors",
                    mirror,
                    "is not a mirror: host[:port][/path] or an http:// or https:// URL",
                ));
            }
        }
    }
    Ok(())
}

/// Paths go into `Bind=` lines unquoted: absolute, no `..`, and only
/// characters that need no escaping there (no `:`, the bind separator).
pub fn is_bind_path(path: &str) -> bool {
    path.starts_with('/')
        && path
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'-' | b'_' | b'.' | b'+'))
        && !path.split('/').any(|c| c == "..")
}

/// Paths inside a machine the activator or nspawn binds itself: an extra
/// mount may be none of them, under none and above none (it would hide
/// them or be hidden).
const RESERVED_MACHINE_PATHS: &[&str] = &[
    "/proc",
    "/sys",
    "/dev",
    "/run/host-nvidia",
    "/run/host-nvidia-i386",
    "/run/host-nvidia-bin",
    "/lib/modules",
    "/usr/lib/modules",
    "/etc/kubeslot",
    "/etc/resolv.conf",
    "/etc/hostname",
    "/etc/default/kubelet",
    "/etc/kubernetes/pki",
    "/etc/kubernetes/kubelet",
    "/etc/systemd/system/kubelet.service.d",
    "/etc/containerd",
    "/var/lib/kubelet",
    "/var/lib/containerd",
];

/// Host paths kubeslot owns: never handed to a node (the content store,
/// the state, the slot trees, the config and keys).
const RESERVED_HOST_PATHS: &[&str] = &["/var/lib/kubeslot", "/var/lib/machines", "/etc/kubeslot"];

/// `a` is `b` or lies below it.
fn within(a: &str, b: &str) -> bool {
    let (a, b) = (a.trim_end_matches('/'), b.trim_end_matches('/'));
    a == b || a.strip_prefix(b).is_some_and(|rest| rest.starts_with('/')) || b.is_empty()
}

fn check_extra_mounts(config: &Config) -> Result<(), Invalid> {
    const FIELD: &str = "extra_mounts";
    let mut seen = Vec::new();
    for m in &config.extra_mounts {
        let host = m.host_path.to_string_lossy();
        let inside = m.machine_path.to_string_lossy();
        for p in [&host, &inside] {
            if !is_bind_path(p) || p.trim_end_matches('/').is_empty() {
                return Err(invalid(
                    FIELD,
                    p,
                    "is not an absolute path of a-z, A-Z, 0-9, '/', '-', '_', '.', '+' (no '..', not /)",
                ));
            }
        }
        if let Some(r) = RESERVED_HOST_PATHS
            .iter()
            .find(|r| within(&host, r) || within(r, &host))
        {
            return Err(invalid(
                FIELD,
                &host,
                &format!("overlaps {r}, which is kubeslot's own (state, slot trees, config and keys) and never bound into a node"),
            ));
        }
        if let Some(r) = RESERVED_MACHINE_PATHS
            .iter()
            .find(|r| within(&inside, r) || within(r, &inside))
        {
            return Err(invalid(
                FIELD,
                &inside,
                &format!(
                    "overlaps {r} inside the machine, which nspawn or the activator binds itself"
                ),
            ));
        }
        if let Some(other) = seen
            .iter()
            .find(|o: &&String| within(&inside, o) || within(o, &inside))
        {
            return Err(invalid(
                FIELD,
                &inside,
                &format!("overlaps another extra mount's machine_path {other}"),
            ));
        }
        seen.push(inside.trim_end_matches('/').to_string());
    }
    Ok(())
}

/// An image reference as it lands in a TOML string (registry, path, tag or
/// digest): the distribution reference character set, no quotes.
fn is_image_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 255
        && s.contains('/')
        && s.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b'/' | b':' | b'@')
        })
}

/// The registry host of an image name (`docker.io` when the first part
/// names none), as containerd's `certs.d` keys it.
fn registry_of(name: &str) -> String {
    match name.split_once('/') {
        Some((first, _)) if first.contains('.') || first.contains(':') || first == "localhost" => {
            first.to_string()
        }
        _ => "docker.io".to_string(),
    }
}

fn check_containerd(config: &Config) -> Result<(), Invalid> {
    let c = &config.containerd;
    if let Some(addr) = &c.metrics_address {
        if addr.parse::<std::net::SocketAddr>().is_err() {
            return Err(invalid(
                "containerd.metrics_address",
                addr,
                "is not an address:port (e.g. 127.0.0.1:10257, or 0.0.0.0:10257 as the unbounded agent)",
            ));
        }
    }
    let Some(image) = &c.sandbox_image else {
        return Ok(());
    };
    if !is_image_name(image) {
        return Err(invalid(
            "containerd.sandbox_image",
            image,
            "is not an image reference (registry/repository:tag or @sha256:...)",
        ));
    }
    let preloaded = config.images.bundle.iter().any(|b| &b.name == image);
    let registry = registry_of(image);
    let mirrored = registry_mirrors(config)
        .get(&registry)
        .is_some_and(|m| !m.mirrors.is_empty());
    if preloaded || mirrored {
        return Ok(());
    }
    Err(invalid(
        "containerd.sandbox_image",
        image,
        &format!(
            "is neither preloaded (no images.bundle entry has this name) nor reachable through a mirror (containerd.registry_mirrors has no mirror for {registry}): every pod would wait on a registry the node may not reach; add it to the bundle or give {registry} a mirror"
        ),
    ))
}

fn check_bundle(config: &Config) -> Result<(), Invalid> {
    let i = &config.images;
    if let Some(dir) = &i.bundle_dir {
        let d = dir.to_string_lossy();
        if !is_bind_path(&d) || d.trim_end_matches('/').is_empty() {
            return Err(invalid(
                "images.bundle_dir",
                &d,
                "is not an absolute path of a-z, A-Z, 0-9, '/', '-', '_', '.', '+' (no '..', not /)",
            ));
        }
        if let Some(r) = RESERVED_HOST_PATHS
            .iter()
            .find(|r| within(&d, r) || within(r, &d))
        {
            return Err(invalid(
                "images.bundle_dir",
                &d,
                &format!("overlaps {r}, which is kubeslot's own"),
            ));
        }
    } else if !i.bundle.is_empty() {
        return Err(invalid(
            "images.bundle",
            &i.bundle[0].file,
            "needs images.bundle_dir (the host directory the archives are in)",
        ));
    }
    let mut names = std::collections::BTreeSet::new();
    for b in &i.bundle {
        let file_ok = !b.file.starts_with('.')
            && b.file
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b'_' | b'+'));
        if b.file.is_empty() || !file_ok {
            return Err(invalid(
                "images.bundle",
                &b.file,
                "is not a file name in images.bundle_dir (a-z, A-Z, 0-9, '.', '-', '_', '+'; no '/', not hidden)",
            ));
        }
        if !is_image_name(&b.name) {
            return Err(invalid(
                "images.bundle",
                &b.name,
                "is not an image reference (registry/repository:tag)",
            ));
        }
        if !names.insert(b.name.as_str()) {
            return Err(invalid("images.bundle", &b.name, "is listed twice"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{parse, with_top};

    #[test]
    fn extra_mounts_are_absolute_and_stay_clear_of_what_kubeslot_binds() {
        let with = |m: &str| {
            parse(&with_top(
                "ghcr.io/org/node:v1",
                &format!(r#","extra_mounts":[{m}]"#),
            ))
        };
        let c = with(
            r#"{"host_path":"/srv/models","machine_path":"/var/lib/models","read_only":true}"#,
        )
        .unwrap();
        assert!(c.extra_mounts[0].read_only);
        for (m, want) in [
            (
                r#"{"host_path":"srv","machine_path":"/x"}"#,
                "\"srv\" is not an absolute path",
            ),
            (
                r#"{"host_path":"/srv/a:b","machine_path":"/x"}"#,
                "\"/srv/a:b\" is not an absolute path",
            ),
            (
                r#"{"host_path":"/srv/../etc","machine_path":"/x"}"#,
                "is not an absolute path",
            ),
            (
                r#"{"host_path":"/srv","machine_path":"/"}"#,
                "\"/\" is not an absolute path",
            ),
            (
                r#"{"host_path":"/var/lib/kubeslot/blobs","machine_path":"/x"}"#,
                "overlaps /var/lib/kubeslot, which is kubeslot's own",
            ),
            (
                r#"{"host_path":"/var","machine_path":"/x"}"#,
                "overlaps /var/lib/kubeslot",
            ),
            (
                r#"{"host_path":"/srv","machine_path":"/var/lib/kubelet/plugins"}"#,
                "overlaps /var/lib/kubelet inside the machine",
            ),
            (
                r#"{"host_path":"/srv","machine_path":"/etc"}"#,
                "overlaps /etc/kubeslot inside the machine",
            ),
            (
                r#"{"host_path":"/srv","machine_path":"/sys/fs/bpf"}"#,
                "overlaps /sys inside the machine",
            ),
            (
                r#"{"host_path":"/srv","machine_path":"/opt/a"},{"host_path":"/srv2","machine_path":"/opt/a/b"}"#,
                "overlaps another extra mount's machine_path /opt/a",
            ),
            (
                r#"{"host_path":"/srv","machine_path":"/x","rw":true}"#,
                "unknown field `rw`",
            ),
        ] {
            let e = with(m).unwrap_err().to_string();
            assert!(e.contains(want), "{m}: {e}");
            assert!(e.contains("activator.json"), "{e}");
        }
    }

    #[test]
    fn a_sandbox_image_must_be_preloaded_or_mirrored() {
        let top = |extra: &str| {
            parse(&with_top(
                "ghcr.io/org/node:v1",
                &format!(
                    r#","containerd":{{"sandbox_image":"registry.example/pause:3.9"{extra}}}"#
                ),
            ))
        };
        let e = top("").unwrap_err().to_string();
        assert!(
            e.contains("containerd.sandbox_image: \"registry.example/pause:3.9\" is neither preloaded (no images.bundle entry has this name) nor reachable through a mirror (containerd.registry_mirrors has no mirror for registry.example)"),
            "{e}"
        );
        top(r#","registry_mirrors":{"registry.example":{"mirrors":["mirror.internal"]}}"#).unwrap();
        // a CA alone is no mirror
        assert!(top(r#","registry_mirrors":{"registry.example":{"ca_file":"/ca.pem"}}"#).is_err());
        let bundled = parse(&with_top(
            "ghcr.io/org/node:v1",
            &format!(
                r#","containerd":{{"sandbox_image":"registry.example/pause:3.9"}},"images":{{"bundle_dir":"/srv/bundle","bundle":[{{"file":"pause.tar","name":"registry.example/pause:3.9","digest":"{}"}}]}}"#,
                kubeslot_image::Digest::of(b"x")
            ),
        ));
        let c = bundled.unwrap();
        assert!(c.containerd.has_dropin());
        // Docker Hub short names are docker.io's
        assert_eq!(registry_of("library/pause:3"), "docker.io");
        assert_eq!(registry_of("localhost:5000/p:1"), "localhost:5000");
        let e = parse(&with_top(
            "ghcr.io/org/node:v1",
            r#","containerd":{"metrics_address":"everywhere"}"#,
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("containerd.metrics_address: \"everywhere\" is not an address:port"),
            "{e}"
        );
    }

    #[test]
    fn bundle_entries_are_file_names_with_a_directory() {
        let d = kubeslot_image::Digest::of(b"x");
        let with = |images: String| {
            parse(&with_top(
                "ghcr.io/org/node:v1",
                &format!(r#","images":{images}"#),
            ))
        };
        with(format!(r#"{{"bundle_dir":"/srv/bundle","bundle":[{{"file":"a.tar","name":"r.example/a:1","digest":"{d}"}}]}}"#)).unwrap();
        for (images, want) in [
            (format!(r#"{{"bundle":[{{"file":"a.tar","name":"r.example/a:1","digest":"{d}"}}]}}"#), "needs images.bundle_dir"),
            (format!(r#"{{"bundle_dir":"/srv/bundle","bundle":[{{"file":"../a.tar","name":"r.example/a:1","digest":"{d}"}}]}}"#), "is not a file name"),
            (format!(r#"{{"bundle_dir":"/var/lib/kubeslot/b","bundle":[{{"file":"a.tar","name":"r.example/a:1","digest":"{d}"}}]}}"#), "overlaps /var/lib/kubeslot"),
            (format!(r#"{{"bundle_dir":"/srv/bundle","bundle":[{{"file":"a.tar","name":"a b","digest":"{d}"}}]}}"#), "is not an image reference"),
            (format!(r#"{{"bundle_dir":"/srv/bundle","bundle":[{{"file":"a.tar","name":"r.example/a:1","digest":"{d}"}},{{"file":"b.tar","name":"r.example/a:1","digest":"{d}"}}]}}"#), "is listed twice"),
            (r#"{"bundle_dir":"/srv/bundle","bundle":[{"file":"a.tar","name":"r.example/a:1","digest":"sha256:12"}]}"#.to_string(), "digest"),
        ] {
            let e = with(images.clone()).unwrap_err().to_string();
            assert!(e.contains(want), "{images}: {e}");
        }
    }

    #[test]
    fn label_and_taint_syntax() {
        assert!(is_label_text("node.kubernetes.io/role", true));
        assert!(!is_label_text("a b", true));
        assert!(!is_label_text("50%", false));
        assert!(check_node_name("n", "Node-1").is_err());
        assert!(check_node_name("n", "node-1.example").is_ok());
    }

    #[test]
    fn kubelet_restricted_labels() {
        for ok in [
            "pool",
            "example.com/team",
            "node.kubernetes.io/pool",
            "topology.kubernetes.io/zone",
            "kubelet.kubernetes.io/x",
            "sub.node.kubernetes.io/y",
        ] {
            assert!(kubelet_may_set(ok), "{ok}");
        }
        for refused in [
            "node-role.kubernetes.io/worker",
            "kubernetes.io/role",
            "k8s.io/x",
            "foo.k8s.io/y",
        ] {
            assert!(!kubelet_may_set(refused), "{refused}");
        }
    }
}
