//! What `build` does to publish: the SBOM of each platform (embedded as a
//! layer and attached as `sha256-<hex>.sbom`), the `.sig` attachments with
//! `--sign-key`, and `--push`.
//!
//! Given the recipe's pinned inputs per platform and the staged layout the
//! build assembled; it reuses [`crate::sbom`], [`crate::sign`] and
//! [`crate::transfer`] so `build --sign-key --push` and the separate
//! `sign`/`push` commands write the same bytes: [`sign_layout`] and
//! [`sign_registry`] are the `sign` command's work too. It does not build
//! layers.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context as _;
use kubeslot_image::layout::Layout;
use kubeslot_image::oci::{Descriptor, Manifest, Platform, ANNOTATION_REF_NAME};
use kubeslot_image::{Digest, ImageRef, ImageSource};
use p256::ecdsa::SigningKey;
use serde::Serialize;

use crate::assemble::PlatformImage;
use crate::output::Target;
use crate::recipe::{Input, InputKind, Recipe};
use crate::registry::{RegistryOptions, Remote};
use crate::sbom::{generate, sbom_artifact, PackageKind, SbomInput, SbomPackage};
use crate::sign::{signature_artifact, trusted};
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
        sign_layout(key, staged, Some(tag), identity)?;
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

/// What `sign` stored.
#[derive(Debug, Serialize)]
pub struct SignReport {
    pub image: String,
    pub signed: Vec<Signed>,
}

#[derive(Debug, Serialize)]
pub struct Signed {
    pub digest: Digest,
    pub tag: String,
    pub signature_manifest: Digest,
}

impl std::fmt::Display for SignReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "signed {}", self.image)?;
        for s in &self.signed {
            write!(f, "\n  {} -> {} (verified)", s.digest, s.tag)?;
        }
        Ok(())
    }
}

/// Signs an image in a registry and verifies the stored signatures.
pub async fn sign_registry(
    key: &SigningKey,
    image: &ImageRef,
    identity: Option<&str>,
    opts: &RegistryOptions,
) -> anyhow::Result<SignReport> {
    let remote = Remote::connect(image, opts, true).await?;
    let tmp = tempfile::tempdir()?;
    let layout = Layout::create(tmp.path())?;
    let root = transfer::fetch_image(&remote, &image.reference(), &layout, false).await?;
    let identity = identity.map_or_else(|| image.name(), str::to_string);
    let mut signed = Vec::new();
    for digest in transfer::manifest_digests(&layout, &root, &image.to_string())? {
        let tag = digest.attachment_tag("sig");
        let existing = match remote.pull_manifest(&tag).await? {
            Some(raw) => Some(
                serde_json::from_slice::<Manifest>(&raw.bytes)
                    .with_context(|| format!("existing signature {tag} is not a manifest"))?,
            ),
            None => None,
        };
        let artifact = signature_artifact(key, &identity, digest, existing.as_ref());
        let sig = transfer::add_artifact_to_registry(&remote, &artifact).await?;
        transfer::verify_remote(&remote, digest, &trusted(key)).await?;
        signed.push(Signed {
            digest,
            tag,
            signature_manifest: sig,
        });
    }
    Ok(SignReport {
        image: image.with_digest(root.digest).to_string(),
        signed,
    })
}

/// Signs the image tagged `tag` (or the only image) in a layout and verifies
/// the stored signatures.
pub fn sign_layout(
    key: &SigningKey,
    layout: &Layout,
    tag: Option<&str>,
    identity: &str,
) -> anyhow::Result<SignReport> {
    let name = format!("oci:{}", layout.dir().display());
    let root = transfer::select_root(&layout.index()?, tag)
        .map_err(|reason| anyhow::anyhow!("{name}: {reason}"))?;
    let digests = transfer::manifest_digests(layout, &root, &name)?;
    let mut signed = Vec::new();
    for &digest in &digests {
        let tag = digest.attachment_tag("sig");
        let index = layout.index()?;
        let existing = match index
            .manifests
            .iter()
            .find(|e| e.annotations.get(ANNOTATION_REF_NAME) == Some(&tag))
        {
            Some(e) => Some(layout.read_json::<Manifest>(&e.digest, Some(e.size))?),
            None => None,
        };
        let artifact = signature_artifact(key, identity, digest, existing.as_ref());
        transfer::add_artifact_to_layout(layout, &artifact)?;
        signed.push(Signed {
            digest,
            tag,
            signature_manifest: artifact.digest(),
        });
    }
    transfer::verify_layout(layout, &digests, &trusted(key))?;
    Ok(SignReport {
        image: format!("{name}@{}", root.digest),
        signed,
    })
}
