//! The activator's one input: `/etc/kubeslot/activator.json` (path
//! overridable). This module owns the schema and its validation; it reads no
//! other file and touches no host state.
//!
//! Unknown fields are refused (a typo must not silently turn a setting off).
//! Relationships serde cannot express (exactly one kubelet credential, an
//! https API server) are checked in [`Config::validate`], and every error
//! names the file and the field; the values that end up in rendered files
//! (labels, taints, node name, mirrors) by [`node::check`].

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use kubeslot_image::reference::ImageSource;
use serde::{Deserialize, Serialize};

mod cluster;
pub mod node;
mod pods;
mod proxy;
mod registries;
mod rollout;

pub use cluster::{Cluster, ClusterGate, Drain};
pub use pods::{BundleImage, Containerd, ExtraMount, Images, RegistryMirror};
pub use proxy::ProxyConfig;
pub use registries::{Credentials, Keyless, KeylessGithub, RegistryConfig, Trust};
pub use rollout::{
    ClockTime, CountOrPercent, FleetLimit, Follow, Rollout, SourceSettings, UtcOffset, Weekday,
    Window, WindowState,
};

/// The default config path on a host (relative to the root handle).
pub const DEFAULT_PATH: &str = "etc/kubeslot/activator.json";
/// Config files larger than this are refused unread.
pub const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The desired image: a registry reference (tag or digest), `oci:DIR` or
    /// `oci-archive:FILE`.
    pub image: ImageSource,
    /// The NVIDIA variant of `image`, run instead of it on a host with an
    /// NVIDIA GPU on its PCI bus (`activate::variant`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_image: Option<ImageSource>,
    /// Per-registry settings, keyed by registry host as written in `image`.
    #[serde(default)]
    pub registries: BTreeMap<String, RegistryConfig>,
    /// Which signatures the host accepts.
    #[serde(default)]
    pub trust: Trust,
    /// Node settings rendered into the kubelet's host-side files.
    pub kubelet: Kubelet,
    /// GPU binding: a mode (`"gpu": "auto"`), or a mode and where the
    /// host's driver lives (`"gpu": {"mode": "auto", "driver_root":
    /// "/run/nvidia/driver"}`).
    #[serde(default)]
    pub gpu: Gpu,
    /// Extra host devices bound into the machine (e.g. `/dev/fuse`).
    #[serde(default)]
    pub devices: Vec<PathBuf>,
    /// Bind the host's `/dev/kvm` when it is there (nodes that run VMs:
    /// KubeVirt, Kata), as the seed did; `false` never binds it.
    #[serde(default = "default_kvm", skip_serializing_if = "is_default_kvm")]
    pub kvm: bool,
    /// Extra host directories or files bound into the machine (the
    /// unbounded agent's `AdditionalHostMounts`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_mounts: Vec<ExtraMount>,
    /// Container images for the node's containerd that come from the host
    /// (an air-gapped site's bundle), not from a registry.
    #[serde(default, skip_serializing_if = "Images::is_empty")]
    pub images: Images,
    /// The machine's network: the host's (production) or a private veth.
    #[serde(default)]
    pub network: NetworkMode,
    /// Upstream DNS servers for the machine's resolv.conf; empty means "read
    /// the host's real upstreams" (never the 127.0.0.53 stub).
    #[serde(default)]
    pub nameservers: Vec<String>,
    /// Health gate tuning.
    #[serde(default)]
    pub health: Health,
    /// What the safe unpacker allows beyond its defaults.
    #[serde(default)]
    pub unpack: UnpackSettings,
    /// Host checks run before every flip.
    #[serde(default)]
    pub preflight: PreflightSettings,
    /// How long a run may spend on registries.
    #[serde(default)]
    pub download: Download,
    /// The node's containerd: registry mirrors for pod images.
    #[serde(default)]
    pub containerd: Containerd,
    /// How a slot's tree is made (overlay of shared layers, or a copy).
    #[serde(default)]
    pub slots: Slots,
    /// The egress proxy: the activator's registry requests go through it,
    /// and the node's containerd and kubelet get it as their environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ProxyConfig>,
    /// The Kubernetes API: drain before a flip, the cluster gate after
    /// it, what the node reports (unset: none of it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<Cluster>,
    /// Where the host finds releases by itself (`source.follow`).
    #[serde(default, skip_serializing_if = "is_default")]
    pub source: SourceSettings,
    /// When a found release may start: maintenance windows.
    #[serde(default, skip_serializing_if = "is_default")]
    pub rollout: Rollout,
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

fn default_kvm() -> bool {
    true
}

fn is_default_kvm(kvm: &bool) -> bool {
    *kvm
}

/// How slot trees are made.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Slots {
    /// `overlay`: an overlayfs mount of the image's layers from the layer
    /// store (each layer unpacked once, shared by both slots) plus the
    /// slot's own upper dir; `copy`: every layer applied into one tree per
    /// slot. Unset: overlay when the host can (checked before staging),
    /// copy otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<SlotMode>,
}

/// A slot's tree: see [`Slots::mode`].
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SlotMode {
    Overlay,
    Copy,
}

impl SlotMode {
    pub fn name(self) -> &'static str {
        match self {
            SlotMode::Overlay => "overlay",
            SlotMode::Copy => "copy",
        }
    }
}

/// Preflight settings (see the `preflight` module).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PreflightSettings {
    /// Checks whose failure does not stop a flip: names (`dev-kmsg`),
    /// prefixes ending in `*` (`sysctl-*`) or `all`. Each should carry the
    /// reason in the operator's own records: an ignored check is a node
    /// that may fail in the way the check describes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ignore: Vec<String>,
    /// The node's kubelet runs with swap on: its KubeletConfiguration (the
    /// image's) sets `failSwapOn: false`. The `swap` check then passes
    /// with active swap, naming this setting.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_swap: bool,
}

impl Config {
    /// What says the node's kubelet runs with swap, when something does
    /// (for the `swap` preflight check).
    pub fn kubelet_allows_swap(&self) -> Option<String> {
        if self.kubelet.config.get("failSwapOn") == Some(&serde_json::Value::Bool(false)) {
            return Some("kubelet.config.failSwapOn: false".to_string());
        }
        self.preflight
            .allow_swap
            .then(|| "preflight.allow_swap: the image's kubelet sets failSwapOn: false".to_string())
    }
}

/// Bounds on a run's registry work (owner: fleet). A registry that answers
/// 429 or 503 is asked again after a wait (its `Retry-After`, plus a random
/// share of a growing backoff); the deadline bounds all of it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Download {
    /// Every request of one run (resolve, signatures, blobs, retries and
    /// waits) ends within this many seconds of the first one; the run then
    /// fails, keeping partial blobs for the next run to continue. The
    /// default (20 minutes) ends a run, report written, before the unit's
    /// 30-minute start timeout kills it.
    #[serde(default = "default_deadline_secs")]
    pub deadline_secs: u64,
}

fn default_deadline_secs() -> u64 {
    1200
}

impl Default for Download {
    fn default() -> Self {
        Download {
            deadline_secs: default_deadline_secs(),
        }
    }
}

/// Top-level `kubelet.config` keys the activator renders itself (or the
/// image's contract with its containerd fixes), refused in the object so
/// that a setting has exactly one place.
pub const KUBELET_OWNED_FIELDS: &[(&str, &str)] = &[
    ("apiVersion", "the drop-in's own header"),
    ("kind", "the drop-in's own header"),
    ("clusterDNS", "use kubelet.cluster_dns"),
    ("clusterDomain", "use kubelet.cluster_domain"),
    (
        "resolvConf",
        "the activator renders the machine's resolv.conf",
    ),
    ("serverTLSBootstrap", "use kubelet.server_tls_bootstrap"),
    (
        "healthzBindAddress",
        "the health gate probes health.kubelet_healthz_url",
    ),
    (
        "healthzPort",
        "the health gate probes health.kubelet_healthz_url",
    ),
    (
        "containerRuntimeEndpoint",
        "fixed by the image (its containerd's socket)",
    ),
    (
        "cgroupDriver",
        "fixed by the image (systemd, as its containerd)",
    ),
];

/// Unpack policy settings (owner: activator-core). Every field only widens
/// or narrows the unpacker's safe defaults explicitly; an empty section
/// means the defaults.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct UnpackSettings {
    /// Absolute in-image paths allowed to keep setuid/setgid bits, added to
    /// the built-in list of the usual Debian/Ubuntu ones.
    #[serde(default)]
    pub setuid_allowlist: Vec<String>,
    /// Create FIFOs and sockets found in layers (refused by default).
    #[serde(default)]
    pub allow_fifos_and_sockets: bool,
    /// Uncompressed bytes of all layers together (default: the unpacker's).
    #[serde(default)]
    pub max_total_bytes: Option<u64>,
    /// Uncompressed bytes of one layer (default: the unpacker's).
    #[serde(default)]
    pub max_layer_bytes: Option<u64>,
    /// Tar entries of the whole image (default: the unpacker's).
    #[serde(default)]
    pub max_entries: Option<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Kubelet {
    /// `https://host:port` of the API server.
    pub api_server: String,
    /// The cluster CA certificate, PEM text.
    #[serde(default)]
    pub ca_data: Option<String>,
    /// The cluster CA certificate, a PEM file on the host.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    #[serde(default)]
    pub bootstrap_token: Option<String>,
    #[serde(default)]
    pub exec_credential: Option<ExecCredential>,
    #[serde(default)]
    pub cluster_dns: Vec<String>,
    /// Defaults to the host name.
    #[serde(default)]
    pub node_name: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// `key=value:Effect` strings, as `kubelet --register-with-taints`.
    #[serde(default)]
    pub taints: Vec<String>,
    /// The cluster's DNS domain (`clusterDomain`).
    #[serde(default = "default_cluster_domain")]
    pub cluster_domain: String,
    /// `--node-ip`: one address, or an IPv4 and an IPv6 one comma-separated.
    #[serde(default)]
    pub node_ip: Option<String>,
    /// `serverTLSBootstrap`: the kubelet asks the cluster for a serving
    /// certificate, which someone must approve; off by default (a
    /// self-signed one, as without it).
    #[serde(default)]
    pub server_tls_bootstrap: bool,
    /// More KubeletConfiguration fields, merged over the image's config as a
    /// drop-in (`--config-dir`); fields the activator renders are refused.
    #[serde(default)]
    pub config: serde_json::Map<String, serde_json::Value>,
    /// Kubelet flags that turn off part of the node's security
    /// (`--anonymous-auth`, `--read-only-port`, ...: the render's list)
    /// that the host's `/etc/kubeslot/default-kubelet` may set, each by
    /// name; none by default.
    #[serde(default)]
    pub allow_security_flags: Vec<String>,
}

fn default_cluster_domain() -> String {
    "cluster.local".into()
}

/// A client-go exec credential plugin.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ExecCredential {
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default = "default_exec_api_version")]
    pub api_version: String,
}

fn default_exec_api_version() -> String {
    "client.authentication.k8s.io/v1".into()
}

/// The `"gpu"` setting. Written as a mode alone (`"auto"`, the form every
/// earlier config uses, and the one it is written back in when no driver
/// root is set) or as an object with the mode and the driver root.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gpu {
    pub mode: GpuMode,
    /// The root of the tree that holds the host's NVIDIA driver, when it is
    /// not the host's own (the NVIDIA GPU operator's driver container is
    /// mounted at `/run/nvidia/driver`): its libraries are found there,
    /// not through the host's loader cache. `/` means the host's own driver
    /// (and turns the detection of `/run/nvidia/driver` off). Unset: the
    /// operator's root when it holds a driver, else the host's own.
    pub driver_root: Option<PathBuf>,
}

/// The object form of [`Gpu`].
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct GpuTable {
    #[serde(default)]
    mode: GpuMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    driver_root: Option<PathBuf>,
}

impl Serialize for Gpu {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match &self.driver_root {
            None => self.mode.serialize(s),
            Some(root) => GpuTable {
                mode: self.mode,
                driver_root: Some(root.clone()),
            }
            .serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Gpu {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Gpu, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Gpu;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(r#""auto", "on", "off" or {"mode": ..., "driver_root": ...}"#)
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Gpu, E> {
                let mode = GpuMode::deserialize(serde::de::value::StrDeserializer::<E>::new(v))?;
                Ok(Gpu {
                    mode,
                    driver_root: None,
                })
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Gpu, A::Error> {
                let t = GpuTable::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(Gpu {
                    mode: t.mode,
                    driver_root: t.driver_root,
                })
            }
        }
        d.deserialize_any(Visitor)
    }
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum GpuMode {
    /// Bind GPUs when the host has them.
    #[default]
    Auto,
    /// Require GPUs: activation fails on a host without them.
    On,
    /// Never bind GPUs.
    Off,
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// `VirtualEthernet=no`: the node uses the host network (production).
    #[default]
    Host,
    /// `VirtualEthernet=yes`: a private veth (tests keep CNI bridges away
    /// from the test machine's network).
    Veth,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Health {
    /// How long the new machine has to become healthy.
    #[serde(default = "default_health_timeout")]
    pub timeout_secs: u64,
    /// Consecutive healthy kubelet probes required.
    #[serde(default = "default_health_successes")]
    pub successes: u32,
    /// The kubelet health endpoint probed from the host.
    #[serde(default = "default_healthz_url")]
    pub kubelet_healthz_url: String,
    /// Pause between probes.
    #[serde(default = "default_health_interval_ms")]
    pub interval_ms: u64,
}

fn default_healthz_url() -> String {
    "http://127.0.0.1:10248/healthz".into()
}
fn default_health_interval_ms() -> u64 {
    2000
}

fn default_health_timeout() -> u64 {
    120
}
fn default_health_successes() -> u32 {
    3
}

impl Default for Health {
    fn default() -> Self {
        Health {
            timeout_secs: default_health_timeout(),
            successes: default_health_successes(),
            kubelet_healthz_url: default_healthz_url(),
            interval_ms: default_health_interval_ms(),
        }
    }
}

/// Why a config cannot be used; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config {path}: larger than {MAX_CONFIG_BYTES} bytes")]
    TooLarge { path: PathBuf },
    #[error("config {path}: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("config {path}: {field}: {reason}")]
    Invalid {
        path: PathBuf,
        field: &'static str,
        reason: String,
    },
    #[error("config {0}")]
    Untrusted(#[from] crate::trusted::Untrusted),
}

impl Config {
    /// Reads, parses and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        use std::io::Read as _;
        // whoever may write it decides what runs as root
        crate::trusted::check_file(path, "the config")?;
        let f = std::fs::File::open(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut bytes = Vec::new();
        f.take(MAX_CONFIG_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|source| ConfigError::Read {
                path: path.to_path_buf(),
                source,
            })?;
        if bytes.len() as u64 > MAX_CONFIG_BYTES {
            return Err(ConfigError::TooLarge {
                path: path.to_path_buf(),
            });
        }
        Self::parse(path, &bytes)
    }

    /// Parses and validates config bytes; `path` is only used in errors.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<Config, ConfigError> {
        let config: Config =
            serde_json::from_slice(bytes).map_err(|source| ConfigError::Parse {
                path: path.to_path_buf(),
                source,
            })?;
        config.validate(path)?;
        Ok(config.following())
    }

    /// The config with `image` naming the followed tag (`source.follow`
    /// by tag): in the same repository, layout or archive.
    fn following(mut self) -> Config {
        if let Some(Follow::Tag(tag)) = &self.source.follow {
            let tagged = |image: ImageSource| -> ImageSource {
                match image {
                    ImageSource::Registry(r) => ImageSource::Registry(r.with_tag(tag)),
                    ImageSource::Layout { dir, .. } => ImageSource::Layout {
                        dir,
                        tag: Some(tag.clone()),
                    },
                    ImageSource::Archive { file, .. } => ImageSource::Archive {
                        file,
                        tag: Some(tag.clone()),
                    },
                }
            };
            self.gpu_image = self.gpu_image.map(tagged);
            self.image = tagged(self.image);
        }
        self
    }

    /// `trust.identity`: a repository, required for a local image (`image`
    /// or `gpu_image`) unless unsigned images are allowed.
    fn validate_identity(&self) -> Result<(), String> {
        if let Some(identity) = &self.trust.identity {
            if let Err(e) = kubeslot_image::reference::Identity::repository(identity) {
                return Err(e.reason.to_string());
            }
        } else if !self.trust.allow_unsigned
            && std::iter::once(&self.image)
                .chain(&self.gpu_image)
                .any(|i| !matches!(i, ImageSource::Registry(_)))
        {
            return Err("required for an oci: or oci-archive: image (the repository its signatures name, e.g. ghcr.io/example-org/kubeslot/ubuntu2404), unless trust.allow_unsigned".into());
        }
        Ok(())
    }

    /// Checks what serde cannot.
    pub fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let invalid = |field, reason: &str| ConfigError::Invalid {
            path: path.to_path_buf(),
            field,
            reason: reason.to_string(),
        };
        self.validate_kubelet(path)?;
        if let Some(p) = &self.proxy {
            p.check().map_err(|(field, reason)| ConfigError::Invalid {
                path: path.to_path_buf(),
                field,
                reason,
            })?;
        }
        if let Some((field, reason)) = rollout::check(&self.source, &self.rollout) {
            return Err(invalid(field, &reason));
        }
        if let Some(root) = &self.gpu.driver_root {
            let plain = root.is_absolute()
                && root
                    .components()
                    .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
            if !plain {
                return Err(invalid(
                    "gpu.driver_root",
                    "must be an absolute path without '.' or '..' (the directory the driver's tree is mounted at, e.g. /run/nvidia/driver)",
                ));
            }
        }
        if let Some(k) = &self.trust.keyless {
            if let Err(reason) = k.rules() {
                return Err(ConfigError::Invalid {
                    path: path.to_path_buf(),
                    field: "trust.keyless",
                    reason,
                });
            }
        }
        self.validate_identity()
            .map_err(|reason| invalid("trust.identity", &reason))?;
        if let Some(m) = &self.containerd.registry_mirrors {
            for (host, mirror) in m {
                if let Some(i) = mirror.mirrors.iter().position(|u| has_user_info(u)) {
                    return Err(ConfigError::Invalid {
                        path: path.to_path_buf(),
                        field: "containerd.registry_mirrors",
                        reason: format!("{host:?} mirror {}: {USER_INFO_REFUSED}", i + 1),
                    });
                }
                if host.is_empty() || host.contains('/') || host.contains("://") {
                    return Err(ConfigError::Invalid {
                        path: path.to_path_buf(),
                        field: "containerd.registry_mirrors",
                        reason: format!("{host:?} is not a registry host[:port]"),
                    });
                }
                if mirror.mirrors.is_empty() && mirror.ca_file.is_none() {
                    return Err(ConfigError::Invalid {
                        path: path.to_path_buf(),
                        field: "containerd.registry_mirrors",
                        reason: format!("{host:?}: neither mirrors nor a ca_file"),
                    });
                }
            }
        }
        for d in &self.devices {
            if !d.starts_with("/dev/") {
                return Err(invalid(
                    "devices",
                    &format!("{} is not under /dev/", d.display()),
                ));
            }
        }
        for p in &self.unpack.setuid_allowlist {
            if !p.starts_with('/') || p.split('/').any(|c| c == "..") {
                return Err(invalid(
                    "unpack.setuid_allowlist",
                    &format!("{p:?} is not an absolute in-image path"),
                ));
            }
        }
        if let Err(reason) = literal_loopback(&self.health.kubelet_healthz_url) {
            return Err(ConfigError::Invalid {
                path: path.to_path_buf(),
                field: "health.kubelet_healthz_url",
                reason,
            });
        }
        if self.health.successes == 0 || self.health.timeout_secs == 0 {
            return Err(invalid(
                "health",
                "timeout_secs and successes must be positive",
            ));
        }
        if self.download.deadline_secs == 0 {
            return Err(invalid("download.deadline_secs", "must be positive"));
        }
        if let Some(c) = &self.cluster {
            c.check().map_err(|(field, reason)| ConfigError::Invalid {
                path: path.to_path_buf(),
                field,
                reason,
            })?;
        }
        node::check(self).map_err(|e| ConfigError::Invalid {
            path: path.to_path_buf(),
            field: e.field,
            reason: format!("{:?} {}", e.value, e.reason),
        })
    }

    /// The kubelet's API server, cluster CA and credential (exactly one
    /// each), and no `kubelet.config` field the activator sets itself.
    fn validate_kubelet(&self, path: &Path) -> Result<(), ConfigError> {
        let invalid = |field, reason: &str| ConfigError::Invalid {
            path: path.to_path_buf(),
            field,
            reason: reason.to_string(),
        };
        let k = &self.kubelet;
        if !k.api_server.starts_with("https://") || k.api_server.len() <= "https://".len() {
            return Err(invalid("kubelet.api_server", "must be an https:// URL"));
        }
        match (&k.ca_data, &k.ca_file) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "kubelet.ca_data",
                    "set ca_data or ca_file, not both",
                ))
            }
            (None, None) => {
                return Err(invalid(
                    "kubelet.ca_data",
                    "the cluster CA is required (ca_data or ca_file)",
                ))
            }
            (Some(pem), None) if !pem.contains("-----BEGIN CERTIFICATE-----") => {
                return Err(invalid("kubelet.ca_data", "not a PEM certificate"))
            }
            _ => {}
        }
        match (&k.bootstrap_token, &k.exec_credential) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "kubelet.bootstrap_token",
                    "set bootstrap_token or exec_credential, not both",
                ))
            }
            (None, None) => {
                return Err(invalid(
                    "kubelet.bootstrap_token",
                    "a credential is required (bootstrap_token or exec_credential)",
                ))
            }
            _ => {}
        }
        for (key, value) in &k.config {
            if let Some((_, why)) = KUBELET_OWNED_FIELDS.iter().find(|(f, _)| f == key) {
                return Err(ConfigError::Invalid {
                    path: path.to_path_buf(),
                    field: "kubelet.config",
                    reason: format!("{key:?} is set by the activator ({why})"),
                });
            }
            let ca = value
                .pointer("/x509/clientCAFile")
                .filter(|_| key == "authentication");
            if ca.is_some() {
                return Err(invalid(
                    "kubelet.config",
                    "\"authentication.x509.clientCAFile\" is set by the activator (the cluster CA of kubelet.ca_data/ca_file)",
                ));
            }
        }
        Ok(())
    }
}

/// Why a mirror URL with `user:pass@` is refused (the URL is not echoed:
/// it holds the password).
const USER_INFO_REFUSED: &str = "a URL with user info (user:password@) is refused: it would show the password in plans, reports and logs; use registries.<host>.credentials with a password_file";

/// `registries.<host>.mirrors`, none with user info (the error names the
/// mirror by its position, never its text).
fn mirror_urls<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let urls = Vec::<String>::deserialize(d)?;
    if let Some(i) = urls.iter().position(|u| has_user_info(u)) {
        return Err(serde::de::Error::custom(format!(
            "registries: mirror {}: {USER_INFO_REFUSED}",
            i + 1
        )));
    }
    Ok(urls)
}

/// Whether `url`'s authority (before the first `/` after any scheme)
/// carries `user[:password]@`.
fn has_user_info(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    authority.contains('@')
}

/// The address of a loopback `http://` URL whose host is a literal
/// loopback IP (`127.0.0.1`, `[::1]`); `None` for anything else: a name
/// (`localhost`), a short form (`127.1`), a wildcard (`0.0.0.0`) or another
/// host, which nothing on this host can be tied to (the config refuses
/// them: [`literal_loopback`]).
pub fn loopback_addr(url: &str) -> Option<std::net::SocketAddr> {
    let rest = url.strip_prefix("http://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !authority.ends_with(']') => (h, p.parse().ok()?),
        _ => (authority, 80),
    };
    let ip = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => std::net::IpAddr::V6(v6.parse().ok()?),
        None => std::net::IpAddr::V4(host.parse().ok()?),
    };
    ip.is_loopback()
        .then_some(std::net::SocketAddr::new(ip, port))
}

/// Why `url` is no health URL the gate can tie to a machine: it must be
/// `http://` to a literal loopback address (`http://127.0.0.1:10248/healthz`
/// or `http://[::1]:10248/healthz`). Checked when the config is read.
pub fn literal_loopback(url: &str) -> Result<(), String> {
    if loopback_addr(url).is_some() {
        return Ok(());
    }
    Err(format!(
        "{url:?} is not http:// to a literal loopback address (127.0.0.1 or [::1], written out in full; not a name, a short form like 127.1 or a wildcard like 0.0.0.0): only a loopback answer can be tied to the machine's own kubelet"
    ))
}

#[cfg(test)]
mod tests;
