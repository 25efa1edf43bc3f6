//! Applying a build plan: fetch, write layers, assemble, attach, verify,
//! move into place.
//!
//! Given a [`Plan`], the output [`Target`], the download cache and the
//! progress sink, it fetches every pinned input through the cache, writes
//! each layer group as one deterministic layer (platforms concurrently),
//! assembles config, manifests and index in a staging dir beside the
//! output, adds the SBOM and signature attachments ([`crate::publish`]),
//! re-reads and verifies the staged image with `kubeslot_image`, then moves
//! it into place and verifies the result again. A failure at any step
//! leaves the output as it was. It does not push (`build --push` is
//! [`crate::publish::push_output`] afterwards).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use kubeslot_image::layout::{BlobDir, Layout};
use kubeslot_image::oci::{Compression, Descriptor, Index, Platform, ANNOTATION_REF_NAME};
use kubeslot_image::{time, Digest};
use serde_json::json;

use crate::assemble::{assemble, Assembled, ImageMeta, PlatformImage};
use crate::fetch::Fetcher;
use crate::layer_cache::LayerCache;
use crate::layers::{base_layers, group_tree, LayerWriter};
use crate::output::{self, Target};
use crate::plan::Plan;
use crate::progress::Progress;
use crate::recipe::{Input, LayerCompression, BASE_GROUP};
use crate::rootfs::{Data, Entry, Kind, Tree};

/// What a build wrote: the index digest, the text lines and the JSON
/// report of the command.
pub struct Summary {
    pub index: Digest,
    pub lines: Vec<String>,
    pub json: serde_json::Value,
}

/// Applies `plan`: fetches every input, writes the layers and documents
/// into a staging dir beside `target`, attaches SBOMs and signatures,
/// verifies the staged image and then the written output.
pub async fn execute(
    plan: &Plan,
    target: &Target,
    cache: &Path,
    layer_cache: Option<&LayerCache>,
    progress: &Progress,
) -> anyhow::Result<Summary> {
    let inputs = fetch(plan, cache, progress).await?;
    // The staging dir sits beside the output (same filesystem) and is
    // removed on every exit path by its guard.
    let staging = output::staging_dir(target.path())?;
    let blobs = BlobDir::create(staging.path().join("blobs"))?;
    let work = staging.path().join("work");
    // Platforms are built concurrently (each layer is compressed on a
    // blocking thread); identical blobs of two platforms land under the
    // same name by atomic rename, so the race is harmless.
    let built = futures_util::future::try_join_all(
        inputs
            .iter()
            .map(|i| build_platform(plan, i, &blobs, &work, layer_cache, progress)),
    )
    .await?;
    let staged = stage(plan, built, &blobs, staging.path(), &work)?;
    write(plan, target, &blobs, staging.path(), &staged)?;
    drop(staging);
    Ok(summary(plan, target, &staged))
}

/// One platform's fetched inputs: the recipe's (as files, in input order)
/// and, for a package base, its locked `.deb`s (in lock order).
struct PlatformInputs<'p> {
    platform: &'p Platform,
    files: Vec<(Input, PathBuf)>,
    debs: Vec<PathBuf>,
}

/// Fetches every input of every platform through the cache (one batch),
/// then each platform's locked `.deb`s (by sha256).
async fn fetch<'p>(
    plan: &'p Plan,
    cache: &Path,
    progress: &Progress,
) -> anyhow::Result<Vec<PlatformInputs<'p>>> {
    let fetcher = Fetcher::new(cache, progress.clone())?;
    let all: Vec<_> = plan
        .inputs
        .iter()
        .flat_map(|(_, ins)| ins.iter().map(|i| i.pinned.clone()))
        .collect();
    let mut fetched = fetcher.fetch_all(&all).await?.into_iter();
    let mut out = Vec::new();
    for (platform, inputs) in &plan.inputs {
        let files = inputs
            .iter()
            .map(|i| (i.clone(), fetched.next().expect("one path per input")))
            .collect();
        let debs = match &plan.debian {
            Some(d) => {
                let locked = d.lock.platform(&platform.architecture)?;
                let pins = crate::debian::pinned(&d.base.base, locked)?;
                fetcher.fetch_all(&pins).await?
            }
            None => Vec::new(),
        };
        out.push(PlatformInputs {
            platform,
            files,
            debs,
        });
    }
    Ok(out)
}

/// One platform's image: its base layers, one layer per recipe group, and
/// its SBOM as a layer of its own; returns the SBOM too (it is also
/// attached as `.sbom`).
async fn build_platform(
    plan: &Plan,
    input: &PlatformInputs<'_>,
    blobs: &BlobDir,
    work: &Path,
    layer_cache: Option<&LayerCache>,
    progress: &Progress,
) -> anyhow::Result<(PlatformImage, Vec<u8>)> {
    let recipe = &plan.recipe;
    let platform = input.platform;
    let work = work.join(&platform.architecture);
    let writer = LayerWriter {
        recipe: &recipe.path,
        blob_dir: blobs.root().join("sha256"),
        compression: match recipe.file.compression {
            LayerCompression::Gzip => Compression::Gzip,
            LayerCompression::Zstd => Compression::Zstd,
        },
        zstd_workers: crate::rootfs::zstd_workers(),
        epoch: recipe.file.source_date_epoch,
        progress,
        platform,
        cache: layer_cache,
    };
    let base = base_layers(plan, &input.files, &input.debs, blobs, &work, &writer).await?;
    let shape = base.shape.as_ref();
    let mut layers = base.layers;
    // `[[images]]` archives (blocking reads through the source)
    let archives = tokio::task::block_in_place(|| {
        plan.images
            .iter()
            .map(|i| Ok((i.spec.clone(), crate::images::archive(i, platform, &work)?)))
            .collect::<anyhow::Result<Vec<_>>>()
    })?;
    for l in recipe.file.layers.iter().filter(|l| l.group != BASE_GROUP) {
        let tree = group_tree(recipe, &l.group, platform, &input.files, &archives, &work)?;
        let comment = l
            .description
            .clone()
            .unwrap_or_else(|| recipe.layer_contents(&l.group).join(", "));
        let created_by = format!("kubeslot-builder: layer {}", l.group);
        layers.push(
            writer
                .layer(tree, shape, &l.group, created_by, comment)
                .await?,
        );
    }
    // Publishing: this platform's SBOM, embedded as its own layer.
    let sbom = crate::publish::platform_sbom(
        recipe,
        &recipe.file.tag,
        plan.base_pin(platform),
        &plan.base_packages(platform)?,
        &input.files,
    );
    let mut tree = Tree::new();
    tree.insert(
        &format!("/{}", crate::sbom::IMAGE_PATH),
        Entry::root(
            Kind::File(Data::Bytes(Arc::new(sbom.clone()))),
            0o644,
            writer.epoch,
        ),
    )?;
    let comment = format!("SPDX 2.3 SBOM at /{}", crate::sbom::IMAGE_PATH);
    let created_by = "kubeslot-builder: sbom".to_string();
    layers.push(
        writer
            .layer(tree, shape, "sbom", created_by, comment)
            .await?,
    );
    let image = PlatformImage {
        platform: platform.clone(),
        layers,
    };
    Ok((image, sbom))
}

/// The image assembled in the staging dir, with its attachments, verified.
struct Staged {
    assembled: Assembled,
    /// The digest of the image's index.
    index: Digest,
    /// The staging layout's `index.json` entries (the image, `.sbom`, `.sig`).
    entries: Vec<Descriptor>,
}

/// Assembles config, manifests and index in the staging layout, adds the
/// `.sbom` (and with a key `.sig`) attachments, and verifies the staged
/// image with the hosts' reader (kubeslot-image) before it moves.
fn stage(
    plan: &Plan,
    built: Vec<(PlatformImage, Vec<u8>)>,
    blobs: &BlobDir,
    staging: &Path,
    work: &Path,
) -> anyhow::Result<Staged> {
    let (images, sboms): (Vec<_>, Vec<_>) = built.into_iter().unzip();
    let sboms: BTreeMap<Platform, Vec<u8>> = images
        .iter()
        .map(|i| i.platform.clone())
        .zip(sboms)
        .collect();
    let meta = ImageMeta {
        created: time::rfc3339_seconds(plan.recipe.file.source_date_epoch),
        annotations: plan.annotations.clone(),
    };
    let assembled = assemble(blobs, &meta, images)?;
    let index = assembled.index.digest;
    let mut entry = assembled.index.clone();
    entry
        .annotations
        .insert(ANNOTATION_REF_NAME.into(), plan.tag.clone());
    let staged = Layout::create(staging)?;
    staged.write_index(&Index::new(vec![entry]))?;
    let _ = std::fs::remove_dir_all(work);
    crate::publish::attach(
        &staged,
        &plan.tag,
        &assembled.manifests,
        &sboms,
        plan.sign_key.as_ref().map(|k| (k, plan.identity.as_str())),
    )?;
    let entries = staged.index()?.manifests;
    output::verify_layout(&staged, Some(&plan.tag), &index)?;
    Ok(Staged {
        assembled,
        index,
        entries,
    })
}

/// Moves the staged image into place (a layout gains its blobs and index
/// entries; an archive is written whole) and reads the result back.
fn write(
    plan: &Plan,
    target: &Target,
    blobs: &BlobDir,
    staging: &Path,
    staged: &Staged,
) -> anyhow::Result<()> {
    match target {
        Target::Layout { dir, .. } => {
            output::write_layout(blobs, &staged.entries, dir)?;
            output::verify_layout(&Layout::open(dir)?, Some(&plan.tag), &staged.index)
                .with_context(|| format!("re-reading {}", dir.display()))?;
        }
        Target::Archive { file, .. } => {
            output::write_archive(staging, file)?;
            let check = output::staging_dir(file)?;
            // Read back with the hosts' own archive reader (kubeslot-image).
            let layout = kubeslot_image::archive::extract(file, check.path())?;
            output::verify_layout(&layout, Some(&plan.tag), &staged.index)
                .with_context(|| format!("re-reading {}", file.display()))?;
        }
    }
    Ok(())
}

/// The command's text lines and JSON report.
fn summary(plan: &Plan, target: &Target, staged: &Staged) -> Summary {
    let recipe = &plan.recipe;
    let assembled = &staged.assembled;
    let index = staged.index;
    let mut lines = Vec::new();
    let mut manifests_json = Vec::new();
    for (image, desc) in &assembled.manifests {
        lines.push(format!("manifest {}: {}", image.platform, desc.digest));
        let mut layers_json = Vec::new();
        for l in &image.layers {
            lines.push(format!(
                "  layer {:<12} {} ({} bytes)",
                l.group, l.descriptor.digest, l.descriptor.size
            ));
            layers_json.push(json!({
                "group": l.group,
                "digest": l.descriptor.digest,
                "size": l.descriptor.size,
                "diff_id": l.diff_id,
                "media_type": l.descriptor.media_type,
            }));
        }
        manifests_json.push(json!({
            "platform": image.platform.to_string(),
            "digest": desc.digest,
            "size": desc.size,
            "layers": layers_json,
        }));
    }
    lines.push(format!(
        "wrote {} ({}:{})",
        target.path().display(),
        recipe.file.name,
        plan.tag
    ));
    let json = json!({
        "name": recipe.file.name,
        "tag": plan.tag,
        "output": target.path(),
        "index": index,
        "index_size": assembled.index.size,
        "manifests": manifests_json,
    });
    Summary { index, lines, json }
}
