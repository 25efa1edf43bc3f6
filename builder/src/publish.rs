//! What `build` does to publish: the SBOM of each platform (embedded as a
//! layer and attached as `sha256-<hex>.sbom`), the `.sig` attachments with
//! `--sign-key`, and `--push`.
//!
//! Given the recipe's pinned inputs per platform and the staged layout the
//! build assembled; it reuses [`crate::sbom`], [`crate::cmd::sign`] and
//! [`crate::transfer`] so `build --sign-key --push` and the separate
//! `sign`/`push` commands write the same bytes. It does not build layers.

use std::collections::BTreeMap;
use std::path::PathBuf;

use kubeslot_activator::layout::Layout;
use kubeslot_activator::oci::{Descriptor, Platform};
use kubeslot_activator::{Digest, ImageRef, ImageSource};
use p256::ecdsa::SigningKey;

use crate::assemble::PlatformImage;
use crate::output::Target;
use crate::recipe::{Input, InputKind, Recipe};
use crate::registry::RegistryOptions;
use crate::sbom::{generate, sbom_artifact, PackageKind, SbomInput, SbomPackage};
use crate::transfer::{self, Staged, TransferReport};

/// The SPDX document of one platform: every pinned input (components with
/// their upstream URL and sha256, the base rootfs or base image, and a
/// package base's locked `.deb`s, `base_packages`).
pub fn platform_sbom(
    recipe: &Recipe,
    tag: &str,
    base_image: Option<(String, Digest)>,
    base_packages: &[SbomPackage],
    files: &[(Input, PathBuf)],
) -> Vec<u8> {
    let mut packages = Vec::new();
    // The base is named by its digest only: the same image read from a
    // layout, an archive or a registry must give the same SBOM (and image).
    if let Some((_, digest)) = base_image {
        packages.push(SbomPackage {
            name: "base-image".into(),
            version: digest.to_string(),
            download_location: "NOASSERTION".into(),
            sha256: digest,
            kind: PackageKind::BaseImage,
            purl: None,
        });
    }
    packages.extend(base_packages.iter().cloned());
    for (input, _) in files {
        let (name, version, kind) = match &input.kind {
            InputKind::BaseRootfs => (
                "base-rootfs".to_string(),
                input.pinned.sha256.to_string(),
                PackageKind::BaseImage,
            ),
            InputKind::Component(n) => (
                n.clone(),
                recipe
                    .file
                    .components
                    .get(n)
                    .map(|c| c.version.clone())
                    .unwrap_or_default(),
                PackageKind::Component,
            ),
        };
        let purl =
            matches!(kind, PackageKind::Component).then(|| format!("pkg:generic/{name}@{version}"));
        packages.push(SbomPackage {
            name,
            version,
            download_location: input.upstream.clone(),
            sha256: input.pinned.sha256,
            kind,
            purl,
        });
    }
    generate(&SbomInput {
        name: recipe.file.name.clone(),
        version: tag.to_string(),
        created: recipe.file.source_date_epoch,
        packages,
    })
}

/// Adds each platform manifest's `.sbom` and, given a key, the `.sig` of
/// the index and of every platform manifest to the staged layout (whose
/// index.json already names the image under `tag`).
pub fn attach(
    staged: &Layout,
    tag: &str,
    manifests: &[(PlatformImage, Descriptor)],
    sboms: &BTreeMap<Platform, Vec<u8>>,
    sign: Option<(&SigningKey, &str)>,
) -> anyhow::Result<()> {
    for (image, desc) in manifests {
        if let Some(doc) = sboms.get(&image.platform) {
            transfer::add_artifact_to_layout(staged, &sbom_artifact(desc, doc))?;
        }
    }
    if let Some((key, identity)) = sign {
        crate::cmd::sign::sign_layout(key, staged, Some(tag), identity)?;
    }
    Ok(())
}

/// `build --push`: uploads the written output (image, signatures, SBOMs)
/// and, when the build signed, verifies the signatures in the registry.
pub async fn push_output(
    target: &Target,
    tag: &str,
    dest: &ImageRef,
    opts: &RegistryOptions,
    key: Option<&SigningKey>,
    progress: &crate::progress::Progress,
) -> anyhow::Result<TransferReport> {
    let src = match target {
        Target::Layout { dir, .. } => ImageSource::Layout {
            dir: dir.clone(),
            tag: Some(tag.to_string()),
        },
        Target::Archive { file, .. } => ImageSource::Archive {
            file: file.clone(),
            tag: Some(tag.to_string()),
        },
    };
    let keys = key.map(crate::sign::trusted);
    let staged = Staged::open(&src, opts).await?;
    Ok(staged
        .deliver(
            &ImageSource::Registry(dest.clone()),
            opts,
            keys.as_ref(),
            progress,
        )
        .await?)
}
