//! Writes an OCI image layout from tar files, one layer each, compressed
//! with gzip or zstd (or not at all), with the image crate's `layout` module.
//! For the unpack benchmark (`ci/bench/unpack.sh`) and manual checks.
//!
//!     cargo run --release -p kubeslot-image --example make_layout -- OUT TAG gzip|zstd|none TAR...

use std::fs::File;
use std::io::{self, BufReader, Write};

use anyhow::{bail, Context, Result};
use kubeslot_image::digest::HashingWriter;
use kubeslot_image::layout::Layout;
use kubeslot_image::oci::{
    Compression, Descriptor, ImageConfig, Index, Manifest, ANNOTATION_REF_NAME, MEDIA_TYPE_CONFIG,
    MEDIA_TYPE_INDEX, MEDIA_TYPE_MANIFEST,
};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [out, tag, comp, tars @ ..] = args.as_slice() else {
        bail!("usage: make_layout OUT TAG gzip|zstd|none TAR...");
    };
    let compression = match comp.as_str() {
        "gzip" => Compression::Gzip,
        "zstd" => Compression::Zstd,
        "none" => Compression::None,
        other => bail!("unknown compression {other}"),
    };
    let layout = Layout::create(out.as_str())?;
    let tmp = tempfile::tempdir_in(out)?;
    let mut layers = Vec::new();
    let mut diff_ids = Vec::new();
    for tar in tars {
        let blob_path = tmp.path().join("blob");
        let blob = HashingWriter::new(File::create(&blob_path)?);
        let mut input = BufReader::new(File::open(tar).with_context(|| tar.clone())?);
        let (diff_id, blob) = match compression {
            Compression::Gzip => {
                let mut w = HashingWriter::new(flate2::write::GzEncoder::new(
                    blob,
                    flate2::Compression::fast(),
                ));
                io::copy(&mut input, &mut w)?;
                let (enc, d, _) = w.finish();
                (d, enc.finish()?)
            }
            Compression::Zstd => {
                let mut w = HashingWriter::new(zstd::stream::write::Encoder::new(blob, 3)?);
                io::copy(&mut input, &mut w)?;
                let (enc, d, _) = w.finish();
                (d, enc.finish()?)
            }
            Compression::None => {
                let mut w = HashingWriter::new(blob);
                io::copy(&mut input, &mut w)?;
                let (blob, d, _) = w.finish();
                (d, blob)
            }
        };
        let (mut f, digest, size) = blob.finish();
        f.flush()?;
        drop(f);
        layout
            .blobs()
            .put_verified(&digest, Some(size), File::open(&blob_path)?)?;
        layers.push(Descriptor::new(
            compression.layer_media_type(),
            digest,
            size,
        ));
        diff_ids.push(diff_id);
    }
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    });
    let _: ImageConfig = serde_json::from_value(config.clone())?;
    let config_bytes = serde_json::to_vec(&config)?;
    let config_digest = layout.blobs().put_bytes(&config_bytes)?;
    let manifest = serde_json::json!({
        "schemaVersion": 2, "mediaType": MEDIA_TYPE_MANIFEST,
        "config": Descriptor::new(MEDIA_TYPE_CONFIG, config_digest, config_bytes.len() as u64),
        "layers": layers,
    });
    let _: Manifest = serde_json::from_value(manifest.clone())?;
    let manifest_bytes = serde_json::to_vec(&manifest)?;
    let manifest_digest = layout.blobs().put_bytes(&manifest_bytes)?;
    let mut desc = Descriptor::new(
        MEDIA_TYPE_MANIFEST,
        manifest_digest,
        manifest_bytes.len() as u64,
    );
    desc.annotations
        .insert(ANNOTATION_REF_NAME.into(), tag.clone());
    layout.write_index(&Index {
        schema_version: 2,
        media_type: Some(MEDIA_TYPE_INDEX.into()),
        manifests: vec![desc],
        annotations: Default::default(),
    })?;
    println!("{out}:{tag}");
    Ok(())
}
