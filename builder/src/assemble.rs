//! Image documents: the config (with `diff_ids` and history), one manifest
//! per platform and the OCI index over them, serialised with kubeslot-image's
//! `oci` types and stored as blobs.
//!
//! Given the layers of each platform (already written as blobs) and the
//! image metadata, it writes the JSON blobs and returns their descriptors.
//! Everything it puts in a document comes from the recipe (epoch, pins,
//! versions), never from the machine or the time of the build, so the bytes
//! repeat. It deliberately does not write layers or layout files.

use std::collections::BTreeMap;

use kubeslot_image::layout::{BlobDir, LayoutError};
use kubeslot_image::oci::{
    Descriptor, History, ImageConfig, Index, Manifest, Platform, RootFs, MEDIA_TYPE_CONFIG,
    MEDIA_TYPE_INDEX, MEDIA_TYPE_MANIFEST,
};
use kubeslot_image::Digest;

/// One layer of an image, as the manifest and config see it.
#[derive(Clone, Debug)]
pub struct LayerDesc {
    pub descriptor: Descriptor,
    pub diff_id: Digest,
    pub history: History,
    /// The recipe group it belongs to (`base` for every base layer).
    pub group: String,
}

/// The layers of one platform, base first.
#[derive(Clone, Debug)]
pub struct PlatformImage {
    pub platform: Platform,
    pub layers: Vec<LayerDesc>,
}

/// What the index and manifests are annotated with.
#[derive(Clone, Debug)]
pub struct ImageMeta {
    /// RFC 3339, from `source_date_epoch`.
    pub created: String,
    pub annotations: BTreeMap<String, String>,
}

/// The written documents.
#[derive(Clone, Debug)]
pub struct Assembled {
    pub index: Descriptor,
    pub manifests: Vec<(PlatformImage, Descriptor)>,
}

/// Writes config, manifest (per platform) and index blobs into `blobs`.
pub fn assemble(
    blobs: &BlobDir,
    meta: &ImageMeta,
    images: Vec<PlatformImage>,
) -> Result<Assembled, LayoutError> {
    let mut manifests = Vec::new();
    let mut entries = Vec::new();
    for image in images {
        let config = ImageConfig {
            created: Some(meta.created.clone()),
            architecture: image.platform.architecture.clone(),
            os: image.platform.os.clone(),
            variant: image.platform.variant.clone(),
            config: None,
            rootfs: RootFs {
                kind: "layers".into(),
                diff_ids: image.layers.iter().map(|l| l.diff_id).collect(),
            },
            history: image.layers.iter().map(|l| l.history.clone()).collect(),
        };
        let config_bytes = serde_json::to_vec(&config).expect("config serialises");
        let config_digest = blobs.put_bytes(&config_bytes)?;
        let manifest = Manifest {
            schema_version: 2,
            media_type: Some(MEDIA_TYPE_MANIFEST.into()),
            artifact_type: None,
            config: Descriptor::new(MEDIA_TYPE_CONFIG, config_digest, config_bytes.len() as u64),
            layers: image.layers.iter().map(|l| l.descriptor.clone()).collect(),
            subject: None,
            annotations: meta.annotations.clone(),
        };
        let bytes = serde_json::to_vec(&manifest).expect("manifest serialises");
        let digest = blobs.put_bytes(&bytes)?;
        let mut d = Descriptor::new(MEDIA_TYPE_MANIFEST, digest, bytes.len() as u64);
        d.platform = Some(image.platform.clone());
        entries.push(d.clone());
        manifests.push((image, d));
    }
    let index = Index {
        schema_version: 2,
        media_type: Some(MEDIA_TYPE_INDEX.into()),
        manifests: entries,
        annotations: meta.annotations.clone(),
    };
    let bytes = serde_json::to_vec(&index).expect("index serialises");
    let digest = blobs.put_bytes(&bytes)?;
    Ok(Assembled {
        index: Descriptor::new(MEDIA_TYPE_INDEX, digest, bytes.len() as u64),
        manifests,
    })
}
