//! The OCI image format as kubeslot reads and writes it: media types,
//! descriptors, manifests, indexes, image configs and platforms.
//!
//! One set of types for both sides: the builder serialises these to make an
//! image and the activator parses the same types to trust one, so the two can
//! never disagree on the format. Parsing is lenient about unknown fields (the
//! spec allows them) and strict about what matters: digests are [`Digest`]s,
//! sizes are numbers, media types are checked by the caller against the
//! constants here. Field order is fixed by the struct definitions, so
//! serialising the same value always gives the same bytes.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::digest::Digest;

pub const MEDIA_TYPE_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MEDIA_TYPE_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const MEDIA_TYPE_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const MEDIA_TYPE_LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
pub const MEDIA_TYPE_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const MEDIA_TYPE_LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
pub const MEDIA_TYPE_DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const MEDIA_TYPE_DOCKER_LIST: &str =
    "application/vnd.docker.distribution.manifest.list.v2+json";
pub const MEDIA_TYPE_DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
pub const MEDIA_TYPE_DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
/// The cosign "simple signing" payload layer of a `.sig` artifact.
pub const MEDIA_TYPE_SIMPLE_SIGNING: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The SPDX document layer of a `.sbom` artifact.
pub const MEDIA_TYPE_SPDX_JSON: &str = "text/spdx+json";

/// Annotation on a layout's `index.json` entry naming its tag.
pub const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";
/// Annotation holding a cosign signature (base64) on a `.sig` layer.
pub const ANNOTATION_COSIGN_SIGNATURE: &str = "dev.cosignproject.cosign/signature";

/// How a layer blob is compressed, from its media type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

impl Compression {
    /// The compression of a layer media type, or `None` for a media type that
    /// is not a known layer type.
    pub fn of_layer_media_type(media_type: &str) -> Option<Compression> {
        match media_type {
            MEDIA_TYPE_LAYER_TAR => Some(Compression::None),
            MEDIA_TYPE_LAYER_GZIP | MEDIA_TYPE_DOCKER_LAYER_GZIP => Some(Compression::Gzip),
            MEDIA_TYPE_LAYER_ZSTD => Some(Compression::Zstd),
            _ => None,
        }
    }

    /// The OCI layer media type for this compression.
    pub fn layer_media_type(self) -> &'static str {
        match self {
            Compression::None => MEDIA_TYPE_LAYER_TAR,
            Compression::Gzip => MEDIA_TYPE_LAYER_GZIP,
            Compression::Zstd => MEDIA_TYPE_LAYER_ZSTD,
        }
    }
}

/// A content descriptor: what a manifest or index points at.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub media_type: String,
    pub digest: Digest,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Foreign layer URLs. Parsed only so the activator can refuse them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub urls: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
}

impl Descriptor {
    pub fn new(media_type: &str, digest: Digest, size: u64) -> Self {
        Descriptor {
            media_type: media_type.to_string(),
            digest,
            size,
            platform: None,
            annotations: BTreeMap::new(),
            urls: Vec::new(),
            artifact_type: None,
        }
    }
}

/// An OS/architecture pair, written `linux/amd64` in recipes and flags.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

/// Why a string is not a supported platform.
#[derive(Debug, thiserror::Error)]
#[error("platform {0:?}: expected linux/amd64 or linux/arm64")]
pub struct PlatformError(pub String);

impl Platform {
    pub fn linux(architecture: &str) -> Self {
        Platform {
            os: "linux".into(),
            architecture: architecture.into(),
            variant: None,
        }
    }

    /// The platform of the running host, as OCI names it.
    pub fn host() -> Self {
        let arch = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => other,
        };
        Platform::linux(arch)
    }

    /// Whether an index entry for `other` can run here (variant ignored when
    /// the entry does not name one).
    pub fn matches(&self, other: &Platform) -> bool {
        self.os == other.os
            && self.architecture == other.architecture
            && (other.variant.is_none() || other.variant == self.variant)
    }
}

impl FromStr for Platform {
    type Err = PlatformError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "linux/amd64" => Ok(Platform::linux("amd64")),
            "linux/arm64" | "linux/arm64/v8" => Ok(Platform::linux("arm64")),
            _ => Err(PlatformError(s.to_string())),
        }
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

/// An image manifest (OCI or Docker schema 2; the fields are the same).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// An image index (OCI or Docker manifest list), also a layout's `index.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Index {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    pub manifests: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl Index {
    /// An empty OCI index (`index.json` of a new layout).
    pub fn new(manifests: Vec<Descriptor>) -> Index {
        Index {
            schema_version: 2,
            media_type: Some(MEDIA_TYPE_INDEX.into()),
            manifests,
            annotations: BTreeMap::new(),
        }
    }

    /// The one rule for adding an entry to a layout's index, used by every
    /// writer: an entry named by a tag (`org.opencontainers.image.ref.name`)
    /// replaces the entry of that name; an untagged entry replaces an
    /// untagged entry of the same digest (so it is listed once).
    pub fn upsert(&mut self, entry: Descriptor) {
        match entry.annotations.get(ANNOTATION_REF_NAME) {
            Some(name) => self
                .manifests
                .retain(|old| old.annotations.get(ANNOTATION_REF_NAME) != Some(name)),
            None => self.manifests.retain(|old| {
                old.digest != entry.digest || old.annotations.contains_key(ANNOTATION_REF_NAME)
            }),
        }
        self.manifests.push(entry);
    }
}

/// The parts of an image config kubeslot writes and checks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<String>,
    pub architecture: String,
    pub os: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<RuntimeConfig>,
    pub rootfs: RootFs,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<History>,
}

/// The execution defaults of an image config. A node image is booted by
/// systemd-nspawn, so only labels and the environment matter here.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct RuntimeConfig {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cmd: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootFs {
    #[serde(rename = "type")]
    pub kind: String,
    /// `null` (what Go writes for an image without layers) reads as none.
    #[serde(deserialize_with = "null_as_empty")]
    pub diff_ids: Vec<Digest>,
}

fn null_as_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Digest>, D::Error> {
    Ok(Option::<Vec<Digest>>::deserialize(d)?.unwrap_or_default())
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub empty_layer: bool,
}

/// The `oci-layout` file of an image layout directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LayoutMarker {
    pub image_layout_version: String,
}

impl Default for LayoutMarker {
    fn default() -> Self {
        LayoutMarker {
            image_layout_version: "1.0.0".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_docker_manifest_list_entry() {
        let json = r#"{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.list.v2+json",
          "manifests":[{"mediaType":"application/vnd.docker.distribution.manifest.v2+json",
          "digest":"sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855","size":7,
          "platform":{"architecture":"arm64","os":"linux","variant":"v8"},"extra":1}]}"#;
        let idx: Index = serde_json::from_str(json).unwrap();
        let p = idx.manifests[0].platform.as_ref().unwrap();
        assert!(Platform::linux("arm64").matches(&Platform {
            variant: None,
            ..p.clone()
        }));
        assert_eq!(p.to_string(), "linux/arm64/v8");
    }

    #[test]
    fn serialisation_is_stable() {
        let d = Descriptor::new(MEDIA_TYPE_CONFIG, Digest::of(b"x"), 1);
        let a = serde_json::to_vec(&d).unwrap();
        let b = serde_json::to_vec(&serde_json::from_slice::<Descriptor>(&a).unwrap()).unwrap();
        assert_eq!(a, b);
        assert!(!String::from_utf8(a).unwrap().contains("urls"));
    }

    #[test]
    fn platforms_parse() {
        assert_eq!(
            "linux/amd64".parse::<Platform>().unwrap().architecture,
            "amd64"
        );
        assert!("windows/amd64".parse::<Platform>().is_err());
    }
}
