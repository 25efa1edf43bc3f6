//! `kubeslot-builder diff OLD NEW`: what an update from one image to another
//! changes, per platform: layers with sizes (and what a host downloads),
//! component versions and packages from the SBOMs, as text or `--json`.
//!
//! Given two image sources, an optional platform filter and the registry
//! options; the reading and comparing live in [`crate::diff`]. It verifies
//! no signature and reads no layer.

use anyhow::Context as _;
use kubeslot_image::oci::Platform;
use kubeslot_image::ImageSource;

use super::Global;
use crate::diff;
use crate::registry::RegistryOptions;

/// Show what an update from image OLD to image NEW changes: layers, component
/// versions and packages, per platform
///
/// Layers are changed, added or removed (named by the recipe group that made
/// them), with sizes and the bytes an update downloads; component versions
/// come from the dev.kubeslot.version.* annotations; packages from each
/// platform's .sbom attachment (components and, for a package base, every
/// .deb: the difference between the two locks). Reads documents only, never
/// layers; checks no signature (push, copy and hosts do).
#[derive(Clone, Debug, clap::Args)]
pub struct DiffArgs {
    /// The image before: `registry/repo[:tag|@digest]`, `oci:DIR[:TAG]` or
    /// `oci-archive:FILE[:TAG]`.
    #[arg(value_name = "OLD")]
    pub old: ImageSource,
    /// The image after, in the same forms.
    #[arg(value_name = "NEW")]
    pub new: ImageSource,
    /// Compare only this platform (`linux/amd64`, `linux/arm64`).
    /// Repeatable; default: every platform either image has.
    #[arg(long, value_name = "PLATFORM")]
    pub platform: Vec<Platform>,
    #[command(flatten)]
    pub registry: RegistryOptions,
}

pub async fn run(args: DiffArgs, global: &Global) -> anyhow::Result<()> {
    let old = diff::read(&args.old, &args.registry)
        .await
        .context("diff: the old image")?;
    let new = diff::read(&args.new, &args.registry)
        .await
        .context("diff: the new image")?;
    let report = diff::compare(&old, &new, &args.platform).context("diff")?;
    super::print(global, &report);
    Ok(())
}
