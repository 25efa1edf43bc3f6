//! The host files of a node machine: the `.nspawn` file, the
//! `systemd-nspawn@<machine>.service.d/override.conf` drop-in, the render
//! oneshot unit, and the kubelet per-host files (kubeconfig, cluster CA,
//! kubelet unit drop-in, kubelet config drop-in, resolv.conf, hostname, the
//! kubelet's environment file with the host's extra arguments) and
//! containerd's registry mirror files (`certs.d/<host>/hosts.toml`, with
//! their CA) and drop-in bound read-only into the machine; the machine's
//! private BPF filesystem (a mount unit its drop-in requires), extra host
//! mounts and the offline image bundle's list.
//!
//! Three steps, each separately testable: [`gather`] (`facts.rs`) reads
//! everything the files depend on from the host once (through the root
//! handle: CA file,
//! upstream DNS servers, host name, GPU and extra devices, extra mount
//! sources, the kubelet's extra arguments, the offline bundle's archives,
//! each verified); [`render`] is a
//! pure function of the config, the slot and those facts (golden-file
//! tested); [`write`] puts the files in place, each atomically (temp, fsync,
//! rename, fsync dir), rewriting only what changed and removing stale files of
//! the machine's host-files dir. [`diff`] shows what `write` would change;
//! both live in `render/write.rs`.
//!
//! It never touches a slot tree (the kubelet files are bound in, not written
//! into the verified tree), never fetches anything, never runs image content,
//! and does not talk to systemd: callers `daemon-reload` when
//! [`WriteOutcome::dropin_changed`] says so. It does not take the run lock: the render
//! oneshot runs while `activate` (which holds the lock) starts a machine;
//! two writes of one machine take turns on an flock of its host-files dir.
//!
//! The folder holds what the files are made of, too: [`gpu`] (the GPU
//! discovery, read once per run into a [`gpu::Discovery`] the preflight
//! shares), [`extra_args`] (the host's `/etc/kubeslot/default-kubelet`),
//! [`bundle`] (the offline image bundle) and [`host_settings`] (the
//! sysctls and modules a node needs, written to the host itself before a
//! flip).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::PathBuf;

use crate::config::{Config, ExecCredential, NetworkMode, RegistryMirror};
use crate::paths::{self, host, host_files, machine as inside, Root};
use crate::slot::Slot;
use bundle::BundleError;
use extra_args::ExtraArgsError;
use gpu::{GpuError, ToolBind};

pub mod bundle;
pub mod extra_args;
mod facts;
pub mod gpu;
pub mod host_settings;
pub mod proxy;
mod write;

pub use crate::config::node::registry_mirrors;
pub use facts::{gather, gather_with, node_name_of, HostFacts};
pub use write::{diff, save_inputs, unified, write, SECRET_CHANGED};

/// The render oneshot template unit, installed by [`render`] so the drop-in
/// never requires a unit that does not exist.
const RENDER_UNIT_FILE: &str = include_str!("../../units/kubeslot-render@.service");

/// resolv.conf resolvers beyond this many are ignored by glibc (MAXNS).
const MAX_NAMESERVERS: usize = 3;

/// One rendered file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderedFile {
    /// Relative to the root, e.g. `etc/systemd/nspawn/kube1.nspawn`.
    pub path: PathBuf,
    pub contents: String,
    pub mode: u32,
}

/// All host files of one machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostFiles {
    /// Sorted by path.
    pub files: Vec<RenderedFile>,
    /// The offline bundle's private copy the `.nspawn` file binds: made
    /// (and verified) by [`write`] before it writes the files.
    pub bundle: Option<bundle::Copy>,
}

/// What [`write`] changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteOutcome {
    /// Paths relative to the root that were written or removed.
    pub changed: Vec<PathBuf>,
    /// A unit file or drop-in changed: systemd needs a `daemon-reload`.
    pub dropin_changed: bool,
}

/// The difference between a rendered file and the one on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileDiff {
    pub path: PathBuf,
    /// Unified-style, `""` when equal.
    pub diff: String,
}

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("cluster CA {path} (kubelet.ca_file): cannot read: {source}")]
    CaRead {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cluster CA {origin}: not a PEM certificate (no \"-----BEGIN CERTIFICATE-----\")")]
    CaNotPem { origin: String },
    #[error("registry CA {path} (containerd.registry_mirrors.\"{registry}\".ca_file): cannot read: {source}")]
    RegistryCaRead {
        registry: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("registry CA {path} (containerd.registry_mirrors.\"{registry}\".ca_file): not a PEM certificate")]
    RegistryCaNotPem { registry: String, path: PathBuf },
    #[error("proxy CA {path} (proxy.ca): {source}")]
    ProxyCaRead {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("proxy CA {path} (proxy.ca): not a PEM certificate")]
    ProxyCaNotPem { path: PathBuf },
    #[error("node name: kubelet.node_name is unset and no host name was found in {tried}")]
    NoHostname { tried: String },
    #[error("{field}: {value:?} {reason}")]
    Invalid {
        field: &'static str,
        value: String,
        reason: String,
    },
    #[error("{path}: cannot read the host's DNS servers: {source}")]
    ResolvRead {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: the resolver line {line:?} holds a word that cannot be copied into the machine's resolv.conf (a comment or control character)")]
    ResolvWord { path: PathBuf, line: String },
    #[error("no upstream DNS server in {path} (found: {found}; loopback resolvers such as the 127.0.0.53 stub are unreachable from pods): set \"nameservers\" in the config")]
    OnlyStub { path: PathBuf, found: String },
    #[error("no upstream DNS server: neither {upstream} nor {etc} exists; set \"nameservers\" in the config")]
    NoResolv { upstream: PathBuf, etc: PathBuf },
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error(transparent)]
    ExtraArgs(#[from] ExtraArgsError),
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error(transparent)]
    Untrusted(#[from] crate::trusted::Untrusted),
    #[error("extra_mounts: host path {path} (for {machine_path}): {reason}: nspawn refuses a bind whose source is missing")]
    MountSource {
        path: PathBuf,
        machine_path: PathBuf,
        reason: String,
    },
    #[error("{path}: cannot write: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

// ---------------------------------------------------------------------------
// render

/// Renders every host file of `slot`'s machine. Pure: same inputs, same bytes.
pub fn render(config: &Config, slot: Slot, facts: &HostFacts) -> HostFiles {
    let machine = slot.machine();
    let rel = Root::new("");
    let dir = rel.host_files(machine);
    let node_name = node_name(config, facts);
    let mut files = vec![
        RenderedFile {
            path: rel.nspawn_file(machine),
            contents: nspawn_file(config, machine, facts),
            mode: 0o644,
        },
        RenderedFile {
            path: rel.dropin_file(machine),
            contents: dropin_file(machine, &devices(facts), facts),
            mode: 0o644,
        },
        RenderedFile {
            path: rel.render_unit(),
            contents: RENDER_UNIT_FILE.to_string(),
            mode: 0o644,
        },
        RenderedFile {
            path: dir.join(host_files::CLIENT_CA),
            contents: ensure_newline(facts.ca_pem.clone()),
            mode: 0o644,
        },
        RenderedFile {
            path: dir.join(host_files::KUBELET_DROPIN),
            contents: kubelet_dropin(config, &node_name),
            mode: 0o644,
        },
        RenderedFile {
            path: dir.join(host_files::KUBELET_CONFIG),
            contents: kubelet_config(config),
            mode: 0o644,
        },
        RenderedFile {
            path: dir.join(host_files::RESOLV_CONF),
            contents: resolv_conf(facts),
            mode: 0o644,
        },
        RenderedFile {
            path: dir.join(host_files::HOSTNAME),
            contents: format!("{node_name}\n"),
            mode: 0o644,
        },
        RenderedFile {
            path: dir.join(host_files::KUBELET_DEFAULTS),
            contents: extra_args::render(&facts.kubelet_extra_args),
            mode: 0o644,
        },
        RenderedFile {
            path: rel.bpffs_mount_unit_file(machine),
            contents: bpffs_mount_unit(machine),
            mode: 0o644,
        },
    ];
    if config.containerd.has_dropin() {
        files.push(RenderedFile {
            path: dir.join(host_files::CONTAINERD_DROPIN),
            contents: containerd_dropin(config),
            mode: 0o644,
        });
    }
    files.extend(proxy::files(config, facts, &dir, HEADER));
    if !config.images.bundle.is_empty() {
        files.push(RenderedFile {
            path: dir.join(host_files::BUNDLE_LIST),
            contents: bundle::list(&config.images),
            mode: 0o644,
        });
    }
    let (name, contents) = match (
        &config.kubelet.bootstrap_token,
        &config.kubelet.exec_credential,
    ) {
        (_, Some(exec)) => (
            host_files::EXEC_KUBECONFIG,
            kubeconfig(&config.kubelet.api_server, User::Exec(exec)),
        ),
        (token, None) => (
            host_files::BOOTSTRAP_KUBECONFIG,
            kubeconfig(
                &config.kubelet.api_server,
                User::Token(token.as_deref().unwrap_or_default()),
            ),
        ),
    };
    // the credential: readable by root only
    files.push(RenderedFile {
        path: dir.join(name),
        contents,
        mode: 0o600,
    });
    for (registry, m) in registry_mirrors(config) {
        let host_dir = dir
            .join(host_files::CERTS_D)
            .join(certs_dir_name(&registry));
        let ca = facts.registry_cas.get(&registry);
        files.push(RenderedFile {
            path: host_dir.join("hosts.toml"),
            contents: hosts_toml(config, &registry, &m, ca.is_some()),
            mode: 0o644,
        });
        if let Some(pem) = ca {
            files.push(RenderedFile {
                path: host_dir.join("ca.crt"),
                contents: pem.clone(),
                mode: 0o644,
            });
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    HostFiles {
        files,
        bundle: bundle::Copy::of(&config.images),
    }
}

fn node_name(config: &Config, facts: &HostFacts) -> String {
    config
        .kubelet
        .node_name
        .clone()
        .unwrap_or_else(|| facts.hostname.to_lowercase())
}

/// The devices bound one by one: GPU devices outside a bound device
/// directory, then extra devices, each once.
fn devices(facts: &HostFacts) -> Vec<&str> {
    let mut seen = BTreeSet::new();
    facts
        .gpu
        .single_devices()
        .chain(facts.devices.iter().map(String::as_str))
        .filter(|d| seen.insert(*d))
        .collect()
}

const HEADER: &str =
    "# Rendered by kubeslot-activator before every start of the machine; edits are overwritten.\n";

/// Whether a `.nspawn` file or drop-in was rendered by kubeslot (its first
/// line), not written by another tool: what `uninstall` tells a slot
/// kubeslot left behind from another tool's machine by.
pub fn rendered_by_kubeslot(text: &str) -> bool {
    text.starts_with(HEADER)
}

fn nspawn_file(config: &Config, machine: &str, facts: &HostFacts) -> String {
    let mut s = String::from(HEADER);
    s.push_str("[Exec]\nBoot=yes\nCapability=all\nPrivateUsers=no\n");
    s.push_str("SystemCallFilter=@keyring bpf perf_event_open\n");
    // resolv.conf is ours (bound below); nspawn must not copy the host's stub over it
    s.push_str("ResolvConf=off\n");
    s.push_str("\n[Network]\n");
    s.push_str(match config.network {
        NetworkMode::Host => "VirtualEthernet=no\n",
        NetworkMode::Veth => "VirtualEthernet=yes\n",
    });
    s.push_str("\n[Files]\n");
    if facts.lib_modules {
        let _ = writeln!(s, "BindReadOnly={}", host::LIB_MODULES);
    }
    for d in devices(facts) {
        let _ = writeln!(s, "Bind={d}");
    }
    // whole directories: nodes the driver creates later appear inside too
    for d in &facts.gpu.device_dirs {
        let _ = writeln!(s, "Bind={}", d.path);
    }
    for (i, lib) in facts.gpu.library_dirs.iter().enumerate() {
        let _ = writeln!(s, "BindReadOnly={lib}:{}/{i}", inside::HOST_NVIDIA);
    }
    for (i, lib) in facts.gpu.library_dirs_32.iter().enumerate() {
        let _ = writeln!(s, "BindReadOnly={lib}:{}/{i}", inside::HOST_NVIDIA_I386);
    }
    match &facts.gpu.tools.bind {
        ToolBind::None => {}
        ToolBind::Dir(bin) => {
            let _ = writeln!(s, "BindReadOnly={bin}:{}", inside::HOST_NVIDIA_BIN);
        }
        ToolBind::Files(tools) => {
            for t in tools {
                let _ = writeln!(
                    s,
                    "BindReadOnly={}:{}/{}",
                    t.file,
                    inside::HOST_NVIDIA_BIN,
                    t.name
                );
            }
        }
    }
    // what looked like a driver tool but is not bound, and why (plan shows
    // it); quoted, as a path may hold anything
    for skipped in &facts.gpu.tools.skipped {
        let _ = writeln!(
            s,
            "# not bound: {:?} {}",
            skipped.path,
            skipped
                .reason
                .chars()
                .map(|c| if c.is_control() { '?' } else { c })
                .collect::<String>()
        );
    }
    host_binds(config, machine, &mut s);
    s
}

/// The `.nspawn` binds of what the host hands the machine: its host-files
/// dir and files, the node state, the private bpffs, extra mounts, the
/// offline bundle.
fn host_binds(config: &Config, machine: &str, s: &mut String) {
    let dir = Root::host().host_files(machine);
    let d = dir.display();
    let _ = writeln!(s, "BindReadOnly={d}:{}", inside::HOST_FILES);
    // (file in the host-files dir, where the machine sees it, bound at all);
    // the kubelet defaults go over the image's (and anything the node
    // writes there): the kubelet unit's environment holds only the host's
    // extra arguments
    let files = [
        (host_files::CLIENT_CA, inside::CLIENT_CA, true),
        (host_files::KUBELET_DROPIN, inside::KUBELET_DROPIN, true),
        (
            host_files::KUBELET_CONFIG,
            inside::KUBELET_CONFIG_DROPIN,
            true,
        ),
        (host_files::KUBELET_DEFAULTS, inside::KUBELET_DEFAULTS, true),
        (
            host_files::CONTAINERD_DROPIN,
            inside::CONTAINERD_DROPIN,
            config.containerd.has_dropin(),
        ),
        (
            host_files::CERTS_D,
            inside::CERTS_D,
            !registry_mirrors(config).is_empty(),
        ),
        (host_files::RESOLV_CONF, inside::RESOLV_CONF, true),
        (host_files::HOSTNAME, inside::HOSTNAME, true),
    ];
    for (file, at, bound) in files {
        if bound {
            let _ = writeln!(s, "BindReadOnly={d}/{file}:{at}");
        }
    }
    if config.proxy.is_some() {
        for at in proxy::BOUND_AT {
            let _ = writeln!(s, "BindReadOnly={d}/{}:{at}", host_files::PROXY_DROPIN);
        }
    }
    let _ = writeln!(s, "Bind={}:{}", host::NODE_KUBELET, inside::KUBELET_STATE);
    let _ = writeln!(
        s,
        "Bind={}:{}",
        host::NODE_CONTAINERD,
        inside::CONTAINERD_STATE
    );
    // eBPF CNIs (Cilium) pin their maps here; mounted by the unit the
    // drop-in requires, one instance per machine
    let _ = writeln!(s, "Bind={}:{}", paths::bpffs_dir(machine), inside::BPFFS);
    for m in &config.extra_mounts {
        let _ = writeln!(
            s,
            "{}={}:{}",
            if m.read_only { "BindReadOnly" } else { "Bind" },
            m.host_path.display(),
            m.machine_path.display()
        );
    }
    // the verified private copy, never the live bundle_dir
    if let Some(copy) = bundle::Copy::of(&config.images) {
        let _ = writeln!(
            s,
            "BindReadOnly={}:{}",
            copy.host_dir().display(),
            inside::BUNDLE_DIR
        );
    }
}

/// The machine's private BPF filesystem (`bpf` mounted at
/// `/run/bpffs/<machine>`): a mount unit rather than a mount the render
/// makes, so systemd mounts it before every start of the machine (boot
/// included: the drop-in's `RequiresMountsFor=`), creates the directory
/// and owns the mount; a new `bpf` mount is a new instance, so each
/// machine pins its maps apart from the host's and the other slot's.
fn bpffs_mount_unit(machine: &str) -> String {
    let mut s = String::from(HEADER);
    s.push_str("[Unit]\n");
    let _ = writeln!(
        s,
        "Description=Private BPF filesystem of node machine {machine}"
    );
    s.push_str("\n[Mount]\nWhat=bpf\n");
    let _ = writeln!(s, "Where={}", paths::bpffs_dir(machine));
    s.push_str("Type=bpf\nOptions=mode=0700\n");
    s
}

/// containerd's drop-in for the host's settings (`version = 3`, merged key
/// by key into the image's config).
fn containerd_dropin(config: &Config) -> String {
    let c = &config.containerd;
    let mut s = String::from(
        "# Rendered by kubeslot-activator on the host and bound read-only into\n\
         # /etc/containerd/conf.d: merged over the image's config.toml.\n\
         version = 3\n",
    );
    if let Some(image) = &c.sandbox_image {
        s.push_str("\n[plugins.\"io.containerd.cri.v1.images\".pinned_images]\n");
        let _ = writeln!(s, "  sandbox = {}", q(image));
    }
    if let Some(addr) = &c.metrics_address {
        s.push_str("\n[metrics]\n");
        let _ = writeln!(s, "  address = {}", q(addr));
    }
    s
}

fn dropin_file(machine: &str, devices: &[&str], facts: &HostFacts) -> String {
    let render_unit = paths::render_unit_instance(machine);
    let mut s = String::from(HEADER);
    s.push_str("[Unit]\n");
    // StartLimitIntervalSec= is a [Unit] setting; in [Service] systemd
    // ignores it with a warning and the restart loop hits the start limit
    s.push_str("StartLimitIntervalSec=0\n");
    let _ = writeln!(s, "Requires={render_unit}");
    let _ = writeln!(s, "After={render_unit}");
    let _ = writeln!(s, "RequiresMountsFor={}", paths::bpffs_dir(machine));
    s.push_str("\n[Service]\nRestart=on-failure\nRestartSec=10s\n");
    let _ = writeln!(s, "ExecStartPre=-{} terminate {machine}", host::MACHINECTL);
    s.push_str("Environment=SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1\n");
    s.push_str("Environment=SYSTEMD_NSPAWN_API_VFS_WRITABLE=network\n");
    for d in devices {
        let _ = writeln!(s, "DeviceAllow={d} rwm");
    }
    // a bound device directory is allowed by its major number, which the
    // group names in /proc/devices: its nodes may appear after the start
    for d in &facts.gpu.device_dirs {
        let _ = writeln!(s, "DeviceAllow={} rwm", d.group);
    }
    // macvtap/ipvtap devices a CNI creates for pods (KubeVirt, Multus)
    s.push_str("DeviceAllow=char-ipvtap rwm\nDeviceAllow=char-macvtap rwm\n");
    s
}

fn kubelet_dropin(config: &Config, node_name: &str) -> String {
    let k = &config.kubelet;
    let host_dir = inside::HOST_FILES;
    let mut args = vec![format!("--hostname-override={node_name}")];
    if k.exec_credential.is_some() {
        args.push(format!(
            "--kubeconfig={host_dir}/{}",
            host_files::EXEC_KUBECONFIG
        ));
    } else {
        args.push(format!(
            "--bootstrap-kubeconfig={host_dir}/{}",
            host_files::BOOTSTRAP_KUBECONFIG
        ));
        args.push(format!("--kubeconfig={}", inside::KUBELET_KUBECONFIG));
    }
    if !k.labels.is_empty() {
        let labels: Vec<String> = k.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        args.push(format!("--node-labels={}", labels.join(",")));
    }
    if !k.taints.is_empty() {
        args.push(format!("--register-with-taints={}", k.taints.join(",")));
    }
    if let Some(ips) = &k.node_ip {
        args.push(format!("--node-ip={ips}"));
    }
    let mut s = String::from(
        "# Rendered by kubeslot-activator on the host and bound read-only; the\n\
         # image's kubelet.service passes $KUBELET_ARGS to the kubelet. Settings\n\
         # that have a KubeletConfiguration field are in its config drop-in.\n",
    );
    s.push_str("[Service]\n");
    // every value was checked against a character set without quotes, '%',
    // '$', '\\' or spaces, so no systemd escaping is needed
    let _ = writeln!(s, "Environment=\"KUBELET_ARGS={}\"", args.join(" "));
    s
}

/// The kubelet config drop-in: the fields the activator owns, then
/// `kubelet.config` (the config refuses owned fields there). JSON is YAML,
/// which the kubelet reads drop-ins as; keys sorted, so the bytes are stable.
fn kubelet_config(config: &Config) -> String {
    let k = &config.kubelet;
    let mut m = k.config.clone();
    m.insert("apiVersion".into(), "kubelet.config.k8s.io/v1beta1".into());
    m.insert("kind".into(), "KubeletConfiguration".into());
    m.insert("clusterDomain".into(), k.cluster_domain.clone().into());
    if !k.cluster_dns.is_empty() {
        m.insert("clusterDNS".into(), k.cluster_dns.clone().into());
    }
    // pods get the file we rendered, whatever the image does with its own
    // /etc/resolv.conf (often a symlink to systemd-resolved's stub)
    m.insert(
        "resolvConf".into(),
        format!("{}/{}", inside::HOST_FILES, host_files::RESOLV_CONF).into(),
    );
    m.insert("serverTLSBootstrap".into(), k.server_tls_bootstrap.into());
    let mut s = String::from(
        "# Rendered by kubeslot-activator on the host and bound read-only into the\n\
         # kubelet's --config-dir: merged over the image's kubelet config.\n",
    );
    s.push_str(&serde_json::to_string_pretty(&m).expect("JSON values serialise"));
    s.push('\n');
    s
}

/// containerd's directory name for a registry host: `host_port_` for
/// `host:port` (what containerd looks for first; `:` would also break the
/// nspawn bind syntax).
fn certs_dir_name(registry: &str) -> String {
    match registry.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && !port.contains(']') => format!("{host}_{port}_"),
        _ => registry.to_string(),
    }
}

/// `hosts.toml` for one registry: its mirrors in order (pull and resolve),
/// then the registry itself as the `server` containerd falls back to.
fn hosts_toml(config: &Config, registry: &str, m: &RegistryMirror, with_ca: bool) -> String {
    let plain_server = kubeslot_image::registry::is_loopback(registry)
        || config.registries.get(registry).is_some_and(|r| r.insecure);
    let server_host = if registry == "docker.io" {
        "registry-1.docker.io"
    } else {
        registry
    };
    let ca = format!("{}/{}/ca.crt", inside::CERTS_D, certs_dir_name(registry));
    let mut s = String::from(
        "# Rendered by kubeslot-activator on the host and bound read-only: the\n\
         # mirrors containerd pulls this registry's images from, in order, then\n\
         # the registry itself.\n",
    );
    let _ = writeln!(
        s,
        "server = {}",
        q(&format!(
            "{}://{server_host}",
            if plain_server { "http" } else { "https" }
        ))
    );
    if with_ca {
        let _ = writeln!(s, "ca = {}", q(&ca));
    }
    for mirror in &m.mirrors {
        let url = if mirror.contains("://") {
            mirror.clone()
        } else {
            let host = mirror.split('/').next().unwrap_or(mirror);
            let plain = m.insecure || kubeslot_image::registry::is_loopback(host);
            format!("{}://{mirror}", if plain { "http" } else { "https" })
        };
        let _ = writeln!(s, "\n[host.{}]", q(url.trim_end_matches('/')));
        s.push_str("  capabilities = [\"pull\", \"resolve\"]\n");
        if with_ca {
            let _ = writeln!(s, "  ca = {}", q(&ca));
        }
    }
    s
}

/// The host's upstream servers (never its local stub), then its search
/// domains and resolver options, so short names resolve in the node and its
/// `dnsPolicy: Default` pods as they do on the host.
fn resolv_conf(facts: &HostFacts) -> String {
    let mut s = String::from(
        "# Rendered by kubeslot-activator: the host's upstream servers, not its local stub.\n",
    );
    for ns in facts.nameservers.iter().take(MAX_NAMESERVERS) {
        let _ = writeln!(s, "nameserver {ns}");
    }
    if !facts.dns_search.is_empty() {
        let _ = writeln!(s, "search {}", facts.dns_search.join(" "));
    }
    if !facts.dns_options.is_empty() {
        let _ = writeln!(s, "options {}", facts.dns_options.join(" "));
    }
    s
}

enum User<'a> {
    Token(&'a str),
    Exec(&'a ExecCredential),
}

/// YAML double-quoted scalar: JSON string syntax is a subset of it.
fn q(s: &str) -> String {
    serde_json::to_string(s).expect("a string serialises")
}

fn kubeconfig(server: &str, user: User<'_>) -> String {
    let user_name = match user {
        User::Token(_) => "kubelet-bootstrap",
        User::Exec(_) => "kubelet",
    };
    let mut s = String::from("# Rendered by kubeslot-activator; secret, mode 0600.\n");
    s.push_str("apiVersion: v1\nkind: Config\nclusters:\n- name: kubeslot\n  cluster:\n");
    let _ = writeln!(s, "    server: {}", q(server));
    let _ = writeln!(s, "    certificate-authority: {}", q(inside::CLIENT_CA));
    s.push_str("contexts:\n- name: kubeslot\n  context:\n    cluster: kubeslot\n");
    let _ = writeln!(s, "    user: {user_name}");
    s.push_str("current-context: kubeslot\nusers:\n");
    let _ = writeln!(s, "- name: {user_name}\n  user:");
    match user {
        User::Token(token) => {
            let _ = writeln!(s, "    token: {}", q(token));
        }
        User::Exec(e) => {
            s.push_str("    exec:\n");
            let _ = writeln!(s, "      apiVersion: {}", q(&e.api_version));
            let _ = writeln!(s, "      command: {}", q(&e.command));
            if !e.args.is_empty() {
                s.push_str("      args:\n");
                for a in &e.args {
                    let _ = writeln!(s, "      - {}", q(a));
                }
            }
            if !e.env.is_empty() {
                s.push_str("      env:\n");
                for (k, v) in &e.env {
                    let _ = writeln!(s, "      - name: {}\n        value: {}", q(k), q(v));
                }
            }
            s.push_str("      interactiveMode: Never\n      provideClusterInfo: false\n");
        }
    }
    s
}

fn ensure_newline(mut s: String) -> String {
    if !s.ends_with('\n') {
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_unit_runs_the_installed_binary() {
        assert!(
            RENDER_UNIT_FILE.contains(&format!("ExecStart={} render %i\n", host::ACTIVATOR_BIN))
        );
        // it must run again before every start
        assert!(!RENDER_UNIT_FILE
            .lines()
            .any(|l| l.starts_with("RemainAfterExit")));
    }
}
