//! `[[images]]`: container images baked into the node image for its
//! containerd.
//!
//! Given the recipe's entries, [`resolve`] opens each source as every
//! pinned image is opened ([`crate::pinned::open`]: a registry asked for the
//! pinned digest, never the tag; an `oci:` layout; an `oci-archive:`; the
//! top-level digest checked against the pin and the manifest of every
//! platform the recipe builds selected); that happens while planning, so a wrong pin
//! refuses the build before anything is written. [`archive`] then writes,
//! for one platform, a deterministic OCI archive of the pinned image holding
//! only that platform's blobs (each checked against its digest on the way)
//! with an `index.json` that names it for containerd
//! (`io.containerd.image.name`). Where the archives go in the image and what
//! imports them is the recipe's contract ([`crate::recipe::IMAGES_DIR`]).
//!
//! It does not decide layers or write the image; `crate::layers` places the
//! archives in their group's tree.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};
use kubeslot_image::layout::{Layout, MAX_DOCUMENT_BYTES};
use kubeslot_image::oci::{Descriptor, Index, Platform, ANNOTATION_REF_NAME, MEDIA_TYPE_INDEX};

use crate::output;
use crate::pinned::{self, PinnedImage};
use crate::recipe::{ImageSpec, Recipe};

/// The annotation containerd's importer names an image by.
const ANNOTATION_CONTAINERD_NAME: &str = "io.containerd.image.name";

/// An `[[images]]` entry, opened, its top-level digest checked against the
/// pin, its manifest selected (and checked) for every platform.
pub struct ResolvedImage {
    pub spec: ImageSpec,
    pub image: PinnedImage,
}

/// Opens `spec`'s source, checks its digest against the pin and selects its
/// manifest for every platform of `recipe` (blocking, like a base image).
pub fn resolve(recipe: &Recipe, spec: &ImageSpec, scratch: &Path) -> anyhow::Result<ResolvedImage> {
    let written = spec.source.as_deref().unwrap_or(&spec.name);
    let at = || {
        format!(
            "{}: images {} (from {written})",
            recipe.path.display(),
            spec.name
        )
    };
    let parsed = spec.source().map_err(|e| anyhow!(e)).with_context(at)?;
    Ok(ResolvedImage {
        spec: spec.clone(),
        image: pinned::open(recipe, written, parsed, spec.digest, scratch, at)?,
    })
}

/// Writes `img`'s OCI archive for `platform` under `work` and returns its
/// path: the pinned top document (index or manifest) and this platform's
/// manifest, config and layers, and an `index.json` whose one entry is the
/// pinned image named `io.containerd.image.name=<name>` and
/// `org.opencontainers.image.ref.name=<tag>`. Sorted entries and zero
/// mtimes (`output::write_archive`), so the layer holding it is
/// reproducible. Blocking.
pub fn archive(img: &ResolvedImage, platform: &Platform, work: &Path) -> anyhow::Result<PathBuf> {
    let (spec, img) = (&img.spec, &img.image);
    let at = || format!("images {} ({platform})", img.name);
    let selected = &img.selected[platform];
    let dir = work.join("images").join(spec.slug());
    let _ = std::fs::remove_dir_all(&dir);
    let layout = Layout::create(&dir).with_context(at)?;
    let mut docs = vec![img.top.clone()];
    if selected.manifest_descriptor.digest != img.top.digest {
        docs.push(selected.manifest_descriptor.clone());
    }
    for d in &docs {
        let bytes = img
            .source
            .read_blob(d, MAX_DOCUMENT_BYTES)
            .with_context(at)?;
        layout.blobs().put_bytes(&bytes).with_context(at)?;
    }
    let mut blobs = vec![selected.manifest.config.clone()];
    blobs.extend(selected.layers.iter().map(|(d, _, _)| d.clone()));
    for d in &blobs {
        if layout.blobs().contains(&d.digest) {
            continue;
        }
        let stream = img.source.open_blob(d, 0).with_context(at)?;
        layout
            .blobs()
            .put_verified(&d.digest, Some(d.size), stream.reader)
            .with_context(|| format!("{}: blob {}", at(), d.digest))?;
    }
    let name = spec.reference();
    let mut entry = Descriptor::new(&img.top.media_type, img.top.digest, img.top.size);
    entry
        .annotations
        .insert(ANNOTATION_CONTAINERD_NAME.into(), name.to_string());
    entry.annotations.insert(
        ANNOTATION_REF_NAME.into(),
        name.tag.clone().expect("validated: a tag"),
    );
    layout
        .write_index(&Index {
            schema_version: 2,
            media_type: Some(MEDIA_TYPE_INDEX.into()),
            manifests: vec![entry],
            annotations: Default::default(),
        })
        .with_context(at)?;
    let file = work.join("images").join(format!("{}.oci.tar", spec.slug()));
    output::write_archive(&dir, &file).with_context(at)?;
    std::fs::remove_dir_all(&dir).with_context(|| dir.display().to_string())?;
    Ok(file)
}
