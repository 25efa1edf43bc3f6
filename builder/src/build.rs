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
use kubeslot_image::oci::{Compression, Index, Platform, ANNOTATION_REF_NAME};
use kubeslot_image::{time, Digest};
use serde_json::json;

use crate::assemble::{assemble, ImageMeta, PlatformImage};
use crate::fetch::Fetcher;
use crate::layers::{base_layers, group_tree, layer_desc};
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
    progress: &Progress,
) -> anyhow::Result<Summary> {
    let recipe = &plan.recipe;
    let epoch = recipe.file.source_date_epoch;
    let compression = match recipe.file.compression {
        LayerCompression::Gzip => Compression::Gzip,
        LayerCompression::Zstd => Compression::Zstd,
    };
    let fetcher = Fetcher::new(cache, progress.clone())?;
    let all: Vec<_> = plan
        .inputs
        .iter()
        .flat_map(|(_, ins)| ins.iter().map(|i| i.pinned.clone()))
        .collect();
    let paths = fetcher.fetch_all(&all).await?;
    let mut fetched = paths.into_iter();
    // A package base: every locked `.deb` of every platform, by sha256.
    let mut debs: BTreeMap<Platform, Vec<PathBuf>> = BTreeMap::new();
    if let Some(d) = &plan.debian {
        for (platform, _) in &plan.inputs {
            let locked = d.lock.platform(&platform.architecture)?;
            let pins = crate::debian::pinned(&d.base.base, locked)?;
            debs.insert(platform.clone(), fetcher.fetch_all(&pins).await?);
        }
    }

    // The staging dir sits beside the output (same filesystem) and is
    // removed on every exit path by its guard.
    let staging = output::staging_dir(target.path())?;
    let blobs = BlobDir::create(staging.path().join("blobs"))?;
    let blob_dir = blobs.root().join("sha256");
    let work = staging.path().join("work");

    // Platforms are built concurrently (each layer is compressed on a
    // blocking thread); identical blobs of two platforms land under the
    // same name by atomic rename, so the race is harmless.
    let mut per_platform = Vec::new();
    for (platform, inputs) in &plan.inputs {
        let files: Vec<(Input, PathBuf)> = inputs
            .iter()
            .map(|i| (i.clone(), fetched.next().expect("one path per input")))
            .collect();
        per_platform.push((platform, files));
    }
    let images =
        futures_util::future::try_join_all(per_platform.into_iter().map(|(platform, files)| {
            let work = work.join(&platform.architecture);
            let (blobs, blob_dir) = (&blobs, &blob_dir);
            let debs = debs.get(platform).cloned().unwrap_or_default();
            async move {
                let base = base_layers(
                    plan,
                    platform,
                    &files,
                    &debs,
                    blobs,
                    &work,
                    compression,
                    progress,
                )
                .await?;
                let mut layers = base.layers;
                // `[[images]]` archives (blocking reads through the source)
                let archives = tokio::task::block_in_place(|| {
                    plan.images
                        .iter()
                        .map(|i| Ok((i.spec.clone(), crate::images::archive(i, platform, &work)?)))
                        .collect::<anyhow::Result<Vec<_>>>()
                })?;
                for l in recipe.file.layers.iter().filter(|l| l.group != BASE_GROUP) {
                    let mut tree =
                        group_tree(recipe, &l.group, platform, &files, &archives, &work)?;
                    if let Some(shape) = &base.shape {
                        tree.fit_onto(shape).with_context(|| {
                            format!("{}: layer {}", recipe.path.display(), l.group)
                        })?;
                    }
                    let task = progress.task("layer", &format!("{} {platform}", l.group), None);
                    let dir = blob_dir.clone();
                    let blob = tokio::task::spawn_blocking(move || {
                        tree.write_layer(&dir, compression, epoch)
                    })
                    .await
                    .expect("layer writer does not panic")
                    .with_context(|| format!("layer {} ({platform})", l.group))?;
                    task.finish("done");
                    let comment = l
                        .description
                        .clone()
                        .unwrap_or_else(|| recipe.layer_contents(&l.group).join(", "));
                    layers.push(layer_desc(
                        &blob,
                        &l.group,
                        epoch,
                        format!("kubeslot-builder: layer {}", l.group),
                        comment,
                    ));
                }
                // Publishing: this platform's SBOM, embedded as its own layer.
                let sbom = crate::publish::platform_sbom(
                    recipe,
                    &recipe.file.tag,
                    plan.base_pin(platform),
                    &plan.base_packages(platform)?,
                    &files,
                );
                let mut tree = Tree::new();
                tree.insert(
                    &format!("/{}", crate::sbom::IMAGE_PATH),
                    Entry::root(
                        Kind::File(Data::Bytes(Arc::new(sbom.clone()))),
                        0o644,
                        epoch,
                    ),
                )?;
                if let Some(shape) = &base.shape {
                    tree.fit_onto(shape)?;
                }
                let dir = blob_dir.clone();
                let blob =
                    tokio::task::spawn_blocking(move || tree.write_layer(&dir, compression, epoch))
                        .await
                        .expect("layer writer does not panic")
                        .with_context(|| format!("layer sbom ({platform})"))?;
                layers.push(layer_desc(
                    &blob,
                    "sbom",
                    epoch,
                    "kubeslot-builder: sbom".into(),
                    format!("SPDX 2.3 SBOM at /{}", crate::sbom::IMAGE_PATH),
                ));
                anyhow::Ok((
                    PlatformImage {
                        platform: platform.clone(),
                        layers,
                    },
                    sbom,
                ))
            }
        }))
        .await?;
    let (images, sboms): (Vec<_>, Vec<_>) = images.into_iter().unzip();
    let sboms: BTreeMap<Platform, Vec<u8>> = images
        .iter()
        .map(|i| i.platform.clone())
        .zip(sboms)
        .collect();

    let meta = ImageMeta {
        created: time::rfc3339_seconds(epoch),
        annotations: plan.annotations.clone(),
    };
    let assembled = assemble(&blobs, &meta, images)?;
    let index = assembled.index.digest;
    let mut entry = assembled.index.clone();
    entry
        .annotations
        .insert(ANNOTATION_REF_NAME.into(), plan.tag.clone());

    // Verify the staged image with the hosts' reader (kubeslot-image) before it moves.
    let staged = Layout::create(staging.path())?;
    staged.write_index(&Index::new(vec![entry.clone()]))?;
    let _ = std::fs::remove_dir_all(&work);
    // Publishing: `.sbom` (and with --sign-key `.sig`) attachments.
    crate::publish::attach(
        &staged,
        &plan.tag,
        &assembled.manifests,
        &sboms,
        plan.sign_key.as_ref().map(|k| (k, plan.identity.as_str())),
    )?;
    let entries = staged.index()?.manifests;
    output::verify_layout(&staged, Some(&plan.tag), &index)?;

    match target {
        Target::Layout { dir, .. } => {
            output::write_layout(&blobs, &entries, dir)?;
            output::verify_layout(&Layout::open(dir)?, Some(&plan.tag), &index)
                .with_context(|| format!("re-reading {}", dir.display()))?;
        }
        Target::Archive { file, .. } => {
            output::write_archive(staging.path(), file)?;
            let check = output::staging_dir(file)?;
            // Read back with the hosts' own archive reader (kubeslot-image).
            let layout = kubeslot_image::archive::extract(file, check.path())?;
            output::verify_layout(&layout, Some(&plan.tag), &index)
                .with_context(|| format!("re-reading {}", file.display()))?;
        }
    }
    drop(staging);

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
    Ok(Summary { index, lines, json })
}
