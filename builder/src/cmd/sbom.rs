//! `kubeslot-builder sbom`: write the SPDX 2.3 SBOM of an image from a JSON
//! list of its inputs, and attach it to an image as `sha256-<hex>.sbom`.
//!
//! Given the input file ([`crate::sbom::SbomInput`] as JSON), an output path
//! and/or an image to attach to. `build` embeds the same document in the
//! image itself; this command serves pipelines that assemble the input list
//! themselves. It does not check the SPDX schema (`pyspdxtools` does).

use std::path::PathBuf;

use anyhow::{bail, Context as _};
use kubeslot_image::atomic;
use kubeslot_image::layout::Layout;
use kubeslot_image::oci::Descriptor;
use kubeslot_image::{Digest, ImageSource};
use serde::Serialize;

use super::Global;
use crate::registry::{RegistryOptions, Remote};
use crate::sbom::{generate, sbom_artifact, SbomInput, IMAGE_PATH};
use crate::transfer;

/// Write an SPDX 2.3 JSON SBOM (deterministic) from a JSON description of an
/// image's inputs, and/or attach it to an image under the
/// `sha256-<hex>.sbom` tag (registry or OCI layout).
///
/// The input: {"name", "version", "created" (SOURCE_DATE_EPOCH), "packages":
/// [{"name", "version", "download_location", "sha256": "sha256:…", "kind":
/// "component"|"debian-package"|"base-image", "purl"}]}.
#[derive(Clone, Debug, clap::Args)]
pub struct SbomArgs {
    /// The JSON input file.
    #[arg(long, value_name = "FILE")]
    pub input: PathBuf,
    /// Write the SPDX document here.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Attach the document to this image: `registry/repo[:tag|@digest]` or
    /// `oci:DIR[:TAG]`.
    #[arg(long, value_name = "IMAGE")]
    pub attach: Option<ImageSource>,
    #[command(flatten)]
    pub registry: RegistryOptions,
}

/// What `sbom` wrote.
#[derive(Debug, Serialize)]
pub struct SbomReport {
    pub digest: Digest,
    pub packages: usize,
    pub out: Option<PathBuf>,
    pub attached: Option<String>,
}

impl std::fmt::Display for SbomReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sbom {} ({} packages)", self.digest, self.packages)?;
        if let Some(o) = &self.out {
            write!(f, "\n  written to {}", o.display())?;
        }
        if let Some(a) = &self.attached {
            write!(f, "\n  attached as {a}")?;
        }
        write!(f, "\n  images embed it at /{IMAGE_PATH}")
    }
}

pub async fn run(args: SbomArgs, global: &Global) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.input)
        .with_context(|| format!("sbom input {}", args.input.display()))?;
    let input: SbomInput = serde_json::from_str(&text)
        .with_context(|| format!("sbom input {}", args.input.display()))?;
    let doc = generate(&input);
    if let Some(out) = &args.out {
        atomic::write_file(out, &doc)?;
    }
    let attached = match &args.attach {
        None => None,
        Some(ImageSource::Registry(image)) => {
            let remote = Remote::connect(image, &args.registry, true).await?;
            let raw = remote
                .pull_manifest(&image.reference())
                .await?
                .with_context(|| format!("sbom --attach {image}: no such image"))?;
            let subject = Descriptor::new(&raw.media_type, raw.digest, raw.bytes.len() as u64);
            let artifact = sbom_artifact(&subject, &doc);
            transfer::add_artifact_to_registry(&remote, &artifact).await?;
            Some(format!("{}:{}", image.name(), artifact.tag))
        }
        Some(ImageSource::Layout { dir, tag }) => {
            let layout = Layout::open(dir)?;
            let root = transfer::select_root(&layout.index()?, tag.as_deref())
                .map_err(|r| anyhow::anyhow!("oci:{}: {r}", dir.display()))?;
            let subject = Descriptor::new(&root.media_type, root.digest, root.size);
            let artifact = sbom_artifact(&subject, &doc);
            transfer::add_artifact_to_layout(&layout, &artifact)?;
            Some(format!("oci:{}:{}", dir.display(), artifact.tag))
        }
        Some(other) => bail!("sbom --attach {other}: attach to a registry image or an oci: layout"),
    };
    super::print(
        global,
        &SbomReport {
            digest: Digest::of(&doc),
            packages: input.packages.len(),
            out: args.out,
            attached,
        },
    );
    Ok(())
}
