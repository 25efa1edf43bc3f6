//! `kubeslot-builder sign --key KEY IMAGE`: sign the index digest and every
//! platform manifest digest of an image, in a registry or an OCI layout.
//!
//! Given the private key, the image (registry reference or `oci:DIR[:TAG]`)
//! and registry options. Builds each `.sig` artifact with [`crate::sign`],
//! stores it under `sha256-<hex>.sig` (registry tag or layout `index.json`
//! entry), then re-reads what it stored and checks it with the activator's
//! verifier before reporting success. It does not upload the image itself.

use std::path::PathBuf;

use anyhow::{bail, Context as _};
use kubeslot_activator::layout::Layout;
use kubeslot_activator::oci::{Manifest, ANNOTATION_REF_NAME};
use kubeslot_activator::{Digest, ImageRef, ImageSource};
use p256::ecdsa::SigningKey;
use serde::Serialize;

use super::Global;
use crate::registry::{RegistryOptions, Remote};
use crate::sign::{signature_artifact, trusted};
use crate::transfer;

/// Sign an image: the manifest digest of the index and of each platform
/// image, as cosign simple-signing signatures stored under the
/// `sha256-<hex>.sig` tag (in a registry, or as index.json entries of an OCI
/// layout). Verifies what it stored before reporting success.
#[derive(Clone, Debug, clap::Args)]
pub struct SignArgs {
    /// The private key (PKCS#8 PEM, from `keygen`).
    #[arg(long, value_name = "KEY")]
    pub key: PathBuf,
    /// The image: `registry/repo@sha256:…` (or `:tag`, resolved once) or
    /// `oci:DIR[:TAG]`.
    #[arg(value_name = "IMAGE")]
    pub image: ImageSource,
    /// The `critical.identity.docker-reference` to sign (default: the
    /// registry/repository, or the layout's tag).
    #[arg(long, value_name = "NAME")]
    pub identity: Option<String>,
    #[command(flatten)]
    pub registry: RegistryOptions,
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

pub async fn run(args: SignArgs, global: &Global) -> anyhow::Result<()> {
    let key = crate::sign::load_key(&args.key)?;
    let report = match &args.image {
        ImageSource::Registry(image) => {
            sign_registry(&key, image, args.identity.as_deref(), &args.registry).await
        }
        ImageSource::Layout { dir, tag } => {
            let identity = args.identity.clone().unwrap_or_else(|| {
                tag.clone().unwrap_or_else(|| {
                    dir.file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_else(|| "image".into())
                })
            });
            sign_layout(&key, &Layout::open(dir)?, tag.as_deref(), &identity)
        }
        ImageSource::Archive { .. } => bail!(
            "sign {}: sign the layout before archiving it, or copy the archive to oci:DIR first",
            args.image
        ),
    }
    .with_context(|| format!("sign {}", args.image))?;
    super::print(global, &report);
    Ok(())
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
