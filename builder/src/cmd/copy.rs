//! `kubeslot-builder copy SRC DST`: copy an image between registries, OCI
//! layouts and `oci-archive` files, keeping every digest and carrying the
//! `.sig`/`.sbom` attachments of the index and of each platform manifest.
//!
//! Given two image sources and registry options; uses [`crate::transfer`].
//! The archive form is what an air-gapped site imports into its mirror or
//! hands to the activator. It never re-serialises a manifest.

use std::path::PathBuf;

use anyhow::Context as _;
use kubeslot_image::ImageSource;

use super::Global;
use crate::registry::RegistryOptions;
use crate::transfer::Staged;

/// Copy an image with its signatures and SBOM between a registry
/// (`registry/repo[:tag|@digest]`), an OCI layout (`oci:DIR[:TAG]`) and an
/// oci-archive (`oci-archive:FILE[:TAG]`), byte for byte.
#[derive(Clone, Debug, clap::Args)]
pub struct CopyArgs {
    /// Where from.
    #[arg(value_name = "SRC")]
    pub source: ImageSource,
    /// Where to.
    #[arg(value_name = "DST")]
    pub destination: ImageSource,
    /// After copying, verify the signature of every manifest at the
    /// destination with this public key (PEM). Repeatable.
    #[arg(long, value_name = "PUBKEY")]
    pub verify_key: Vec<PathBuf>,
    #[command(flatten)]
    pub registry: RegistryOptions,
}

pub async fn run(args: CopyArgs, global: &Global) -> anyhow::Result<()> {
    let keys = super::push::load_keys(&args.verify_key)?;
    let staged = Staged::open(&args.source, &args.registry)
        .await
        .with_context(|| format!("copy from {}", args.source))?;
    let report = staged
        .deliver(
            &args.destination,
            &args.registry,
            keys.as_ref(),
            &global.progress,
        )
        .await
        .with_context(|| format!("copy {} to {}", args.source, args.destination))?;
    super::print(global, &report);
    Ok(())
}
