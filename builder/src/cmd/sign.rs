//! `kubeslot-builder sign --key KEY IMAGE`: sign the index digest and every
//! platform manifest digest of an image, in a registry or an OCI layout.
//!
//! Given the private key, the image (registry reference or `oci:DIR[:TAG]`)
//! and registry options; the work is [`crate::publish::sign_registry`] and
//! [`crate::publish::sign_layout`] (shared with `build --sign-key`), which
//! store each `.sig` under `sha256-<hex>.sig` and re-read and verify it
//! before reporting success. It does not upload the image itself.

use std::path::PathBuf;

use anyhow::{bail, Context as _};
use kubeslot_image::layout::Layout;
use kubeslot_image::ImageSource;

use super::Global;
use crate::publish::{sign_layout, sign_registry};
use crate::registry::RegistryOptions;

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
