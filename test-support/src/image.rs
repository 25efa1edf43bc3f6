//! OCI images written for tests with the image crate's own `layout` module:
//! layers from tars, a config and manifest per platform, an index, tags in
//! `index.json`, and cosign-format `.sig` attachments made with a P-256 key
//! from a fixed seed. What the builder writes is tested elsewhere; these are
//! the small, fully controlled images the activator's and publishing tests
//! feed to real registries and tools.

use std::fs;
use std::io::{self, Write};

use base64::Engine as _;
use kubeslot_image::digest::HashingWriter;
use kubeslot_image::layout::Layout;
use kubeslot_image::oci::{
    Descriptor, ImageConfig, Index, Manifest, Platform, RootFs, ANNOTATION_COSIGN_SIGNATURE,
    ANNOTATION_REF_NAME, MEDIA_TYPE_CONFIG, MEDIA_TYPE_INDEX, MEDIA_TYPE_LAYER_GZIP,
    MEDIA_TYPE_LAYER_TAR, MEDIA_TYPE_MANIFEST, MEDIA_TYPE_SIMPLE_SIGNING,
};
use kubeslot_image::signature::Payload;
use kubeslot_image::Digest;
use p256::ecdsa::signature::Signer as _;
use p256::ecdsa::{Signature, SigningKey};
use p256::pkcs8::{EncodePublicKey as _, LineEnding};

use crate::tar::{gzip, Noise, MTIME};

/// A layer blob already in a layout.
#[derive(Clone, Debug)]
pub struct LayerBlob {
    pub desc: Descriptor,
    pub diff_id: Digest,
}

/// Digests of a written image: its index and its (one) platform manifest.
#[derive(Clone, Copy, Debug)]
pub struct Built {
    pub index: Digest,
    pub manifest: Digest,
}

/// Opens the layout at `dir`, or creates it.
pub fn open_or_create(dir: &std::path::Path) -> Layout {
    if dir.join("oci-layout").exists() {
        Layout::open(dir).unwrap()
    } else {
        Layout::create(dir).unwrap()
    }
}

/// Stores `v` as JSON; returns its descriptor's digest and size.
pub fn put_json<T: serde::Serialize>(layout: &Layout, v: &T) -> (Digest, u64) {
    let bytes = serde_json::to_vec(v).unwrap();
    (
        layout.blobs().put_bytes(&bytes).unwrap(),
        bytes.len() as u64,
    )
}

/// Stores `tar` gzip-compressed as a layer.
pub fn gzip_layer(layout: &Layout, tar: &[u8]) -> LayerBlob {
    let blob = gzip(tar);
    let d = layout.blobs().put_bytes(&blob).unwrap();
    LayerBlob {
        desc: Descriptor::new(MEDIA_TYPE_LAYER_GZIP, d, blob.len() as u64),
        diff_id: Digest::of(tar),
    }
}

/// An uncompressed layer holding one `size`-byte file of noise, streamed
/// to disk (never held in memory).
pub fn big_layer(layout: &Layout, name: &str, size: u64) -> LayerBlob {
    let tmp = layout.dir().join("big.tmp");
    let f = fs::File::create(&tmp).unwrap();
    let mut b = ::tar::Builder::new(HashingWriter::new(io::BufWriter::new(f)));
    let mut h = ::tar::Header::new_ustar();
    h.set_path(name).unwrap();
    h.set_size(size);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(MTIME);
    h.set_cksum();
    b.append(&h, Noise::new(0x9e37_79b9, size)).unwrap();
    let (mut w, digest, len) = b.into_inner().unwrap().finish();
    w.flush().unwrap();
    drop(w);
    fs::rename(&tmp, layout.blobs().path(&digest)).unwrap();
    LayerBlob {
        desc: Descriptor::new(MEDIA_TYPE_LAYER_TAR, digest, len),
        diff_id: digest,
    }
}

/// Writes the config and manifest of one platform image; returns the
/// manifest's descriptor with its platform set (an index entry).
pub fn write_manifest(layout: &Layout, platform: &Platform, layers: &[LayerBlob]) -> Descriptor {
    let config = ImageConfig {
        created: None,
        architecture: platform.architecture.clone(),
        os: platform.os.clone(),
        variant: platform.variant.clone(),
        config: None,
        rootfs: RootFs {
            kind: "layers".into(),
            diff_ids: layers.iter().map(|l| l.diff_id).collect(),
        },
        history: vec![],
    };
    let (cd, cs) = put_json(layout, &config);
    let manifest = Manifest {
        schema_version: 2,
        media_type: Some(MEDIA_TYPE_MANIFEST.into()),
        artifact_type: None,
        config: Descriptor::new(MEDIA_TYPE_CONFIG, cd, cs),
        layers: layers.iter().map(|l| l.desc.clone()).collect(),
        subject: None,
        annotations: Default::default(),
    };
    let (md, ms) = put_json(layout, &manifest);
    let mut entry = Descriptor::new(MEDIA_TYPE_MANIFEST, md, ms);
    entry.platform = Some(platform.clone());
    entry
}

/// Writes an index of `manifests` and tags it `tag`; returns its digest.
pub fn write_index(layout: &Layout, tag: &str, manifests: Vec<Descriptor>) -> Digest {
    let (id, is) = put_json(layout, &Index::new(manifests));
    tag_entry(layout, tag, Descriptor::new(MEDIA_TYPE_INDEX, id, is));
    id
}

/// Adds (or replaces) the `index.json` entry named `tag`.
pub fn tag_entry(layout: &Layout, tag: &str, mut desc: Descriptor) {
    desc.annotations
        .insert(ANNOTATION_REF_NAME.into(), tag.into());
    layout.upsert_index([desc]).unwrap();
}

/// A one-platform image for this host (index → manifest → config + layers),
/// tagged `tag`.
pub fn write_image(layout: &Layout, tag: &str, layers: &[LayerBlob]) -> Built {
    let entry = write_manifest(layout, &Platform::host(), layers);
    let manifest = entry.digest;
    let index = write_index(layout, tag, vec![entry]);
    Built { index, manifest }
}

/// An image whose `index.json` entry `tag` names a manifest directly (no
/// index document); returns the manifest digest.
pub fn write_manifest_image(
    layout: &Layout,
    tag: &str,
    platform: &Platform,
    layers: &[LayerBlob],
) -> Digest {
    let mut entry = write_manifest(layout, platform, layers);
    entry.platform = None;
    let digest = entry.digest;
    tag_entry(layout, tag, entry);
    digest
}

/// A P-256 signing key from a fixed seed (tests need the same key twice).
pub fn key(seed: u8) -> SigningKey {
    SigningKey::from_bytes(&[seed; 32].into()).unwrap()
}

/// The public half of `key` as SPKI PEM (what a host's trust policy lists).
pub fn public_pem(key: &SigningKey) -> String {
    key.verifying_key()
        .to_public_key_pem(LineEnding::LF)
        .unwrap()
}

/// Attaches a cosign `.sig` artifact for `digest`, signed by `signer`, whose
/// payload names `identity`, as the `sha256-<hex>.sig` entry. Returns the
/// tag.
pub fn sign(layout: &Layout, digest: Digest, signer: &SigningKey, identity: &str) -> String {
    let payload = Payload::new(identity, digest).to_bytes();
    let pd = layout.blobs().put_bytes(&payload).unwrap();
    let sig: Signature = signer.sign(&payload);
    let mut layer = Descriptor::new(MEDIA_TYPE_SIMPLE_SIGNING, pd, payload.len() as u64);
    layer.annotations.insert(
        ANNOTATION_COSIGN_SIGNATURE.into(),
        base64::engine::general_purpose::STANDARD.encode(sig.to_der().as_bytes()),
    );
    let cd = layout.blobs().put_bytes(b"{}").unwrap();
    let m = Manifest {
        schema_version: 2,
        media_type: Some(MEDIA_TYPE_MANIFEST.into()),
        artifact_type: None,
        config: Descriptor::new(MEDIA_TYPE_CONFIG, cd, 2),
        layers: vec![layer],
        subject: None,
        annotations: Default::default(),
    };
    let (md, ms) = put_json(layout, &m);
    let tag = digest.attachment_tag("sig");
    tag_entry(layout, &tag, Descriptor::new(MEDIA_TYPE_MANIFEST, md, ms));
    tag
}

/// Writes the layout at `layout` as an `oci-archive` file at `out` (the
/// layout's files at the top of a tar, as skopeo and `ctr images export`
/// write one).
pub fn write_archive(layout: &std::path::Path, out: &std::path::Path) {
    let mut b = ::tar::Builder::new(fs::File::create(out).unwrap());
    b.mode(::tar::HeaderMode::Deterministic);
    b.append_dir_all(".", layout).unwrap();
    b.into_inner().unwrap().sync_all().unwrap();
}

/// A one-layer image for this host (an uncompressed layer holding
/// `/hello` = `marker`) in its own layout at `dir`, tagged with the full
/// `name` (`org.opencontainers.image.ref.name`, as `skopeo copy ...
/// oci-archive:FILE:NAME` writes it), written as an `oci-archive` at
/// `out`; returns its index digest.
pub fn bundle_archive(
    dir: &std::path::Path,
    name: &str,
    marker: &[u8],
    out: &std::path::Path,
) -> Digest {
    let layout = open_or_create(dir);
    let tar = crate::tar::tar_of(&[("hello", marker)]);
    let d = layout.blobs().put_bytes(&tar).unwrap();
    let layer = LayerBlob {
        desc: Descriptor::new(MEDIA_TYPE_LAYER_TAR, d, tar.len() as u64),
        diff_id: d,
    };
    let built = write_image(&layout, name, &[layer]);
    write_archive(dir, out);
    built.index
}

/// Stores `statement` as the `sha256-<hex>.release` entry of its digest,
/// signed by `signer`, as `kubeslot-builder statement issue` does
/// (replacing one there). Returns the tag.
pub fn issue_statement(
    layout: &Layout,
    statement: &kubeslot_image::statement::Statement,
    signer: &SigningKey,
) -> String {
    use kubeslot_image::statement::{ATTACHMENT_KIND, MEDIA_TYPE_STATEMENT};
    let bytes = statement.to_bytes();
    let pd = layout.blobs().put_bytes(&bytes).unwrap();
    let sig: Signature = signer.sign(&bytes);
    let mut layer = Descriptor::new(MEDIA_TYPE_STATEMENT, pd, bytes.len() as u64);
    layer.annotations.insert(
        ANNOTATION_COSIGN_SIGNATURE.into(),
        base64::engine::general_purpose::STANDARD.encode(sig.to_der().as_bytes()),
    );
    let cd = layout.blobs().put_bytes(b"{}").unwrap();
    let m = Manifest {
        schema_version: 2,
        media_type: Some(MEDIA_TYPE_MANIFEST.into()),
        artifact_type: None,
        config: Descriptor::new(MEDIA_TYPE_CONFIG, cd, 2),
        layers: vec![layer],
        subject: None,
        annotations: Default::default(),
    };
    let (md, ms) = put_json(layout, &m);
    let tag = statement.digest.attachment_tag(ATTACHMENT_KIND);
    tag_entry(layout, &tag, Descriptor::new(MEDIA_TYPE_MANIFEST, md, ms));
    tag
}
