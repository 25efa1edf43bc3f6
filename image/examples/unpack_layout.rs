//! Drives the safe unpacker over an OCI image layout: the first manifest of
//! `index.json` (or the one tagged TAG), its layers applied in order into an
//! empty TARGET. For the unpack benchmark (`ci/bench/unpack.sh`) and manual
//! checks; it verifies no signature (the `unpack` command does).
//!
//!     cargo run --release -p kubeslot-image --example unpack_layout -- LAYOUT[:TAG] TARGET

use std::path::Path;

use anyhow::{bail, Context, Result};
use kubeslot_image::layout::Layout;
use kubeslot_image::oci::{Compression, ImageConfig, Manifest, ANNOTATION_REF_NAME};
use kubeslot_image::unpack::{Layer, Policy, Unpacker};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [src, target] = args.as_slice() else {
        bail!("usage: unpack_layout LAYOUT[:TAG] TARGET");
    };
    let (dir, tag) = match src.rsplit_once(':') {
        Some((d, t)) if Path::new(d).join("oci-layout").exists() => (d, Some(t)),
        _ => (src.as_str(), None),
    };
    let layout = Layout::open(dir)?;
    let index = layout.index()?;
    let desc = index
        .manifests
        .iter()
        .find(|m| {
            tag.is_none_or(|t| {
                m.annotations.get(ANNOTATION_REF_NAME).map(String::as_str) == Some(t)
            })
        })
        .context("no matching manifest in index.json")?;
    let manifest: Manifest = layout.read_json(&desc.digest, Some(desc.size))?;
    let config: ImageConfig =
        layout.read_json(&manifest.config.digest, Some(manifest.config.size))?;
    if config.rootfs.diff_ids.len() != manifest.layers.len() {
        bail!(
            "config has {} diff_ids for {} layers",
            config.rootfs.diff_ids.len(),
            manifest.layers.len()
        );
    }
    let mut unpacker = Unpacker::new(Path::new(target), Policy::default())?;
    for (index, (l, diff_id)) in manifest
        .layers
        .iter()
        .zip(&config.rootfs.diff_ids)
        .enumerate()
    {
        let compression = Compression::of_layer_media_type(&l.media_type)
            .with_context(|| format!("layer {index}: unknown media type {}", l.media_type))?;
        let reader = layout.blobs().open_blob(&l.digest)?;
        let stats = unpacker.apply(Layer {
            index,
            digest: l.digest,
            diff_id: *diff_id,
            compression,
            reader,
        })?;
        eprintln!(
            "layer {index}: {} entries, {} bytes",
            stats.entries, stats.bytes
        );
    }
    let stats = unpacker.finish()?;
    eprintln!(
        "{} layers, {} entries, {} bytes",
        stats.layers, stats.entries, stats.bytes
    );
    Ok(())
}
