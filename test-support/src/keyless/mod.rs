//! The real keyless (Sigstore) vectors of `testdata/keyless/` placed where
//! hosts look for them: cosign's OCI-image v0.3 bundle attached, as OCI
//! referrers do it, to the exact bytes of the image it signs
//! (go-containerregistry's `empty.Image`), in a layout (`index.json` entry
//! `sha256-<hex>`, the referrers fallback tag) and pushed byte for byte to a
//! registry; and the mutations of that material a host must refuse.
//! Nothing here signs: every signature, certificate and log entry is the
//! vector's own (testdata/keyless/README.md says where each comes from).
//!
//! What the vectors cannot give (a keylessly signed image for this host)
//! comes from a test-only Sigstore instance, [`sigstore::TestSigstore`],
//! with its own DER writer ([`der`]).

pub mod der;
pub mod sigstore;

pub use sigstore::{
    image_subjects, LeafSpec, Material, SignSpec, TestSigstore, Workflow, GITHUB_ISSUER,
};

use std::path::{Path, PathBuf};

use base64::Engine as _;
use kubeslot_image::layout::Layout;
use kubeslot_image::oci::{
    Descriptor, Index, ANNOTATION_REF_NAME, MEDIA_TYPE_INDEX, MEDIA_TYPE_MANIFEST,
};
use kubeslot_image::Digest;
use serde_json::Value;

use crate::image::tag_entry;

/// `testdata/keyless/`.
pub fn vectors() -> PathBuf {
    crate::workspace_root().join("testdata/keyless")
}

/// The production trusted root the vectors verify with.
pub fn production_root() -> PathBuf {
    vectors().join("cosign/trusted_root_pgi.json")
}

/// go-containerregistry's `empty.Image` config, byte for byte.
pub const EMPTY_IMAGE_CONFIG: &str = r#"{"architecture":"","created":"0001-01-01T00:00:00Z","os":"","rootfs":{"type":"layers","diff_ids":null},"config":{}}"#;
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// The digest cosign's bundle's statement names.
pub const COSIGN_SUBJECT: &str =
    "sha256:732112270d7e59418a8c080b134b24cabd67d250d0d0147a97ed95ba5c280aa4";
/// The repository the statement's subject names.
pub const COSIGN_SUBJECT_NAME: &str = "127.0.0.1:60943/repo";
/// The certificate's identity and issuer.
pub const COSIGN_SAN: &str = "cody@soyland.com";
pub const COSIGN_ISSUER: &str = "https://github.com/login/oauth";
pub const BUNDLE_MEDIA_TYPE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";

/// The empty image's manifest, byte for byte.
pub fn empty_image_manifest() -> String {
    format!(
        r#"{{"schemaVersion":2,"mediaType":"{DOCKER_MANIFEST}","config":{{"mediaType":"application/vnd.docker.container.image.v1+json","size":{},"digest":"{}"}},"layers":[]}}"#,
        EMPTY_IMAGE_CONFIG.len(),
        Digest::of(EMPTY_IMAGE_CONFIG.as_bytes())
    )
}

/// cosign's bundle as published.
pub fn cosign_bundle() -> Value {
    let p = vectors().join("cosign/oci-attestation.sigstore.json");
    serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap()
}

/// A change to the bundle a host must refuse, and what its refusal says.
pub struct Mutation {
    pub name: &'static str,
    pub bundle: Value,
    /// Text the refusal must contain.
    pub says: &'static str,
}

fn flip_b64(v: &mut Value, at: usize) {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut bytes = b64.decode(v.as_str().unwrap()).unwrap();
    bytes[at] ^= 1;
    *v = Value::String(b64.encode(bytes));
}

/// The mutations of cosign's bundle: a flipped SET byte, a swapped
/// certificate (the real one of sigstore-rs's GitHub Actions bundle), a
/// time outside the certificate, a root supplied by the bundle itself. (An
/// image digest the statement does not name is a different image: the
/// callers serve the bundle on another image for that.)
pub fn mutations() -> Vec<Mutation> {
    let mut out = Vec::new();
    let mut b = cosign_bundle();
    flip_b64(
        &mut b["verificationMaterial"]["tlogEntries"][0]["inclusionPromise"]
            ["signedEntryTimestamp"],
        12,
    );
    out.push(Mutation {
        name: "flipped-set-byte",
        bundle: b,
        says: "signed entry timestamp does not verify",
    });
    let other: Value = serde_json::from_slice(
        &std::fs::read(vectors().join("sigstore-rs/bundle_v03.json")).unwrap(),
    )
    .unwrap();
    let mut b = cosign_bundle();
    b["verificationMaterial"]["certificate"] = other["verificationMaterial"]["certificate"].clone();
    out.push(Mutation {
        name: "swapped-certificate",
        bundle: b,
        says: "kubewarden-controller",
    });
    let mut b = cosign_bundle();
    // an hour after the certificate expired: the SET no longer covers it
    b["verificationMaterial"]["tlogEntries"][0]["integratedTime"] =
        Value::String("1740774491".into());
    out.push(Mutation {
        name: "time-outside-certificate",
        bundle: b,
        says: "signed entry timestamp does not verify",
    });
    let root: Value = serde_json::from_slice(&std::fs::read(production_root()).unwrap()).unwrap();
    let chain = root["certificateAuthorities"][1]["certChain"]["certificates"].clone();
    let mut b = cosign_bundle();
    let leaf = b["verificationMaterial"]["certificate"].clone();
    let vm = b["verificationMaterial"].as_object_mut().unwrap();
    vm.remove("certificate");
    vm.insert(
        "x509CertificateChain".into(),
        serde_json::json!({"certificates": [leaf, chain[0], chain[1]]}),
    );
    out.push(Mutation {
        name: "root-in-bundle",
        bundle: b,
        says: "supplies its own root certificate",
    });
    out
}

/// Writes the empty image into `layout`, tagged `tag`; returns its
/// manifest descriptor.
pub fn write_empty_image(layout: &Layout, tag: &str) -> Descriptor {
    let manifest = empty_image_manifest();
    layout
        .blobs()
        .put_bytes(EMPTY_IMAGE_CONFIG.as_bytes())
        .unwrap();
    let digest = layout.blobs().put_bytes(manifest.as_bytes()).unwrap();
    let desc = Descriptor::new(DOCKER_MANIFEST, digest, manifest.len() as u64);
    tag_entry(layout, tag, desc.clone());
    desc
}

/// Attaches `bundle` to `subject` as cosign does (a referrer manifest:
/// artifact type the bundle media type, empty config, the bundle as its one
/// layer), listed in the referrers fallback index `sha256-<hex>` of the
/// subject (added to an existing one).
pub fn attach_bundle(layout: &Layout, subject: &Descriptor, bundle: &Value) {
    let bytes = serde_json::to_vec(bundle).unwrap();
    let bundle_digest = layout.blobs().put_bytes(&bytes).unwrap();
    let empty = layout.blobs().put_bytes(b"{}").unwrap();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_TYPE_MANIFEST,
        "artifactType": BUNDLE_MEDIA_TYPE,
        "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": empty, "size": 2},
        "layers": [{"mediaType": BUNDLE_MEDIA_TYPE, "digest": bundle_digest, "size": bytes.len()}],
        "subject": {"mediaType": subject.media_type, "digest": subject.digest, "size": subject.size},
        "annotations": {"dev.sigstore.bundle.content": "dsse-envelope"}
    });
    let mbytes = serde_json::to_vec(&manifest).unwrap();
    let mdigest = layout.blobs().put_bytes(&mbytes).unwrap();
    let mut entry = Descriptor::new(MEDIA_TYPE_MANIFEST, mdigest, mbytes.len() as u64);
    entry.artifact_type = Some(BUNDLE_MEDIA_TYPE.into());
    let tag = subject.digest.referrers_tag();
    let mut referrers = tagged(layout, &tag)
        .map(|d| {
            layout
                .read_json::<Index>(&d.digest, Some(d.size))
                .unwrap()
                .manifests
        })
        .unwrap_or_default();
    referrers.push(entry);
    let ibytes = serde_json::to_vec(&Index::new(referrers)).unwrap();
    let idigest = layout.blobs().put_bytes(&ibytes).unwrap();
    tag_entry(
        layout,
        &tag,
        Descriptor::new(MEDIA_TYPE_INDEX, idigest, ibytes.len() as u64),
    );
}

/// The `index.json` entry of `layout` named `tag`.
pub fn tagged(layout: &Layout, tag: &str) -> Option<Descriptor> {
    layout
        .index()
        .unwrap()
        .manifests
        .into_iter()
        .find(|d| d.annotations.get(ANNOTATION_REF_NAME).map(String::as_str) == Some(tag))
}

/// Pushes the `index.json` entry `tag` of `layout` (and everything it
/// references) to `host/repo:tag` with plain distribution-API requests,
/// byte for byte.
pub fn push_raw(layout: &Path, tag: &str, host: &str, repo: &str) {
    let layout = Layout::open(layout).unwrap();
    let entry = tagged(&layout, tag).unwrap_or_else(|| panic!("no index.json entry {tag}"));
    let agent = ureq::Agent::new_with_defaults();
    push_doc(&agent, &layout, &entry, tag, host, repo);
}

fn push_doc(
    agent: &ureq::Agent,
    layout: &Layout,
    d: &Descriptor,
    reference: &str,
    host: &str,
    repo: &str,
) {
    let bytes = std::fs::read(layout.blobs().path(&d.digest)).unwrap();
    let doc: Value = serde_json::from_slice(&bytes).unwrap();
    if let Some(children) = doc["manifests"].as_array() {
        for c in children {
            let c: Descriptor = serde_json::from_value(c.clone()).unwrap();
            push_doc(agent, layout, &c, &c.digest.to_string(), host, repo);
        }
    }
    let mut blobs: Vec<Digest> = Vec::new();
    if let Some(c) = doc["config"]["digest"].as_str() {
        blobs.push(c.parse().unwrap());
    }
    for l in doc["layers"].as_array().into_iter().flatten() {
        blobs.push(l["digest"].as_str().unwrap().parse().unwrap());
    }
    for b in blobs {
        let data = std::fs::read(layout.blobs().path(&b)).unwrap();
        let resp = agent
            .post(format!("http://{host}/v2/{repo}/blobs/uploads/"))
            .send_empty()
            .unwrap();
        let location = resp
            .headers()
            .get("location")
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        let url = if location.starts_with("http") {
            location
        } else {
            format!("http://{host}{location}")
        };
        let sep = if url.contains('?') { '&' } else { '?' };
        agent
            .put(format!("{url}{sep}digest={b}"))
            .header("Content-Type", "application/octet-stream")
            .send(&data[..])
            .unwrap();
    }
    agent
        .put(format!("http://{host}/v2/{repo}/manifests/{reference}"))
        .header("Content-Type", d.media_type.as_str())
        .send(&bytes[..])
        .unwrap();
}
