//! `kubeslot-builder push SRC REF`: upload an image from an OCI layout or
//! `oci-archive` to a registry, with its `.sig`/`.sbom` attachments.
//!
//! Given the source, the destination reference and registry options; uses
//! [`crate::transfer`]. Blobs the registry has are skipped, so re-running an
//! interrupted push sends only what is missing. It does not sign (see
//! `sign`) and does not pull from registries (see `copy`).

use std::path::PathBuf;

use anyhow::{bail, Context as _};
use kubeslot_image::signature::TrustedKeys;
use kubeslot_image::{ImageRef, ImageSource};

use super::Global;
use crate::registry::RegistryOptions;
use crate::transfer::Staged;

/// Upload an image (an OCI layout or oci-archive) to a registry: the blobs it
/// lacks, the manifests, the index, the tag, and the image's .sig/.sbom
/// attachments; prints the pushed digest. Re-run after a failure to resume.
#[derive(Clone, Debug, clap::Args)]
pub struct PushArgs {
    /// The image to upload: `oci:DIR[:TAG]` or `oci-archive:FILE[:TAG]`.
    #[arg(value_name = "SRC")]
    pub source: ImageSource,
    /// Where to: `registry/repository[:tag]` (tag `latest` when omitted).
    #[arg(value_name = "REF")]
    pub destination: ImageRef,
    /// After pushing, re-read and verify the signature of every manifest
    /// with this public key (PEM). Repeatable.
    #[arg(long, value_name = "PUBKEY")]
    pub verify_key: Vec<PathBuf>,
    #[command(flatten)]
    pub registry: RegistryOptions,
}

pub async fn run(args: PushArgs, global: &Global) -> anyhow::Result<()> {
    if matches!(args.source, ImageSource::Registry(_)) {
        bail!(
            "push {}: the source must be oci:DIR or oci-archive:FILE (use `copy` between registries)",
            args.source
        );
    }
    let keys = load_keys(&args.verify_key)?;
    let staged = Staged::open(&args.source, &args.registry)
        .await
        .with_context(|| format!("push {}", args.source))?;
    let report = staged
        .deliver(
            &ImageSource::Registry(args.destination.clone()),
            &args.registry,
            keys.as_ref(),
            &global.progress,
        )
        .await
        .with_context(|| format!("push {} to {}", args.source, args.destination))?;
    super::print(global, &report);
    Ok(())
}

/// The trusted keys named on the command line, if any.
pub fn load_keys(paths: &[PathBuf]) -> anyhow::Result<Option<TrustedKeys>> {
    if paths.is_empty() {
        return Ok(None);
    }
    Ok(Some(TrustedKeys::from_pem_files(paths)?))
}
