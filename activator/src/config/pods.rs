//! The config sections of what the host hands the node's containerd and
//! pods (config `containerd`, `extra_mounts`, `images`): registry mirrors,
//! the sandbox image and metrics address, host paths bound into the
//! machine, the offline image bundle. Schema only; the values are checked
//! by [`super::node`] and rendered by `render`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Settings rendered for the containerd inside the node machine.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Containerd {
    /// Per registry host (`host[:port]`, as pod images name it): mirrors,
    /// rendered as `/etc/containerd/certs.d/<host>/hosts.toml`. Unset: the
    /// mirrors of `registries` (those the activator uses for the node image);
    /// `{}`: none.
    #[serde(default)]
    pub registry_mirrors: Option<BTreeMap<String, RegistryMirror>>,
    /// The pod sandbox (pause) image instead of the one the image pins
    /// (`pinned_images.sandbox`). Refused unless `images.bundle` carries it
    /// or `registry_mirrors` has a mirror for its registry: a node must
    /// never wait on a registry it cannot reach for its first pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_image: Option<String>,
    /// `host:port` containerd serves its Prometheus metrics on (`[metrics]
    /// address`; the unbounded agent's is `0.0.0.0:10257`). Unset: none
    /// (the endpoint has no authentication and the node uses the host's
    /// network).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_address: Option<String>,
}

impl Containerd {
    /// Whether anything is rendered into containerd's drop-in.
    pub fn has_dropin(&self) -> bool {
        self.sandbox_image.is_some() || self.metrics_address.is_some()
    }
}

/// A host path bound into the machine.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ExtraMount {
    /// An absolute path on the host (it must exist when the machine starts).
    pub host_path: PathBuf,
    /// Where it appears inside the machine (absolute).
    pub machine_path: PathBuf,
    /// `BindReadOnly=` instead of `Bind=`.
    #[serde(default)]
    pub read_only: bool,
}

/// Container images the host hands the node (config `images`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Images {
    /// A host directory of OCI archives (`oci-archive` tars), bound
    /// read-only into the machine; only the files `bundle` lists are used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle_dir: Option<PathBuf>,
    /// The images of `bundle_dir`: each archive is verified against its
    /// digest before the machine starts, and imported into containerd's
    /// `k8s.io` namespace before the kubelet starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bundle: Vec<BundleImage>,
}

impl Images {
    pub fn is_empty(&self) -> bool {
        self.bundle_dir.is_none() && self.bundle.is_empty()
    }
}

/// One image of the offline bundle.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BundleImage {
    /// The archive's file name in `images.bundle_dir`.
    pub file: String,
    /// The name pods use (`registry.k8s.io/kube-proxy:v1.36.4`); the
    /// archive's `index.json` must name the image so
    /// (`io.containerd.image.name`, or `org.opencontainers.image.ref.name`
    /// as a full reference), which is how containerd names what it imports.
    pub name: String,
    /// The image's digest (its manifest or index): the `index.json` entry
    /// of that name must point at it, and every blob of the archive must
    /// hash to its name.
    pub digest: kubeslot_image::Digest,
}

/// One registry's mirrors for containerd.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RegistryMirror {
    /// Tried in order, then the registry itself: `host[:port][/path]`
    /// (https, or http when `insecure` or loopback) or a full
    /// `http://`/`https://` URL.
    #[serde(default)]
    pub mirrors: Vec<String>,
    /// Mirrors without a scheme speak plain HTTP.
    #[serde(default)]
    pub insecure: bool,
    /// A PEM CA on the host that signs the mirrors' (and the registry's)
    /// certificates; copied into the host files and named in `hosts.toml`.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
}
