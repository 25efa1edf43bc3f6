//! A pinned image, opened: the one way the builder reads an image a recipe
//! names by digest (a base image, each `[[images]]` entry).
//!
//! Given the recipe, the source as the recipe wrote it (parsed), the pinned
//! digest and scratch space, [`open`] opens the source with the hosts'
//! reader (kubeslot-image's `Source`: a layout or archive path relative to
//! the recipe, a registry asked for the pinned digest, never the tag),
//! checks the top-level digest against the pin and selects (and checks)
//! the manifest of every platform the recipe builds. Blocking.
//!
//! It reads documents only; what is copied out of the image, and where, is
//! the caller's (`crate::layers` for a base, `crate::images` for archives).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context};
use kubeslot_image::oci::{Descriptor, Platform};
use kubeslot_image::source::{SelectedImage, Source};
use kubeslot_image::{Digest, ImageSource};

use crate::recipe::Recipe;

/// An image opened from its source, its top-level digest checked against
/// the pin, its manifest selected (and checked) for every platform.
pub struct PinnedImage {
    pub source: Source,
    /// The pinned top-level document (an index or a manifest).
    pub top: Descriptor,
    /// `SOURCE@DIGEST` for messages, the plan and history.
    pub name: String,
    /// Per platform: the manifest, config and layers, checked by `select`.
    pub selected: BTreeMap<Platform, SelectedImage>,
}

/// Opens `parsed` (written `written` in the recipe) and checks it is
/// `digest`; `at` names the recipe entry in errors.
pub fn open(
    recipe: &Recipe,
    written: &str,
    parsed: ImageSource,
    digest: Digest,
    scratch: &Path,
    at: impl Fn() -> String,
) -> anyhow::Result<PinnedImage> {
    // Local paths in a recipe are relative to the recipe; a registry
    // reference is asked for the pinned digest itself (never a tag).
    let src = match parsed {
        ImageSource::Layout { dir, tag } => ImageSource::Layout {
            dir: recipe.dir.join(dir),
            tag,
        },
        ImageSource::Archive { file, tag } => ImageSource::Archive {
            file: recipe.dir.join(file),
            tag,
        },
        ImageSource::Registry(r) => ImageSource::Registry(r.with_digest(digest)),
    };
    std::fs::create_dir_all(scratch).with_context(|| scratch.display().to_string())?;
    let source = Source::open(&src, &BTreeMap::new(), scratch).with_context(&at)?;
    let top = source.resolve().with_context(&at)?;
    if top.digest != digest {
        bail!(
            "{}: digest mismatch: the recipe pins {digest}, {src} is {}",
            at(),
            top.digest
        );
    }
    let mut selected = BTreeMap::new();
    for p in &recipe.platforms {
        selected.insert(p.clone(), source.select(&top, p).with_context(&at)?);
    }
    Ok(PinnedImage {
        source,
        top,
        name: format!("{written}@{digest}"),
        selected,
    })
}
