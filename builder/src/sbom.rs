//! SPDX 2.3 JSON software bills of materials.
//!
//! Given a neutral [`SbomInput`] (the builder's recipe components and the
//! Debian base's lock both map into it), it writes a deterministic document:
//! packages in input order, `created` from `SOURCE_DATE_EPOCH`, and a
//! `documentNamespace` derived from the document's own content digest rather
//! than a random UUID, so the same inputs always give the same bytes (the
//! SBOM is embedded in the image, whose digest must be reproducible). It
//! also builds the `.sbom` attachment artifact (an OCI manifest with one
//! `text/spdx+json` layer and the image as `subject`).
//!
//! It deliberately does not read recipes or locks (callers convert) and does
//! not validate against the SPDX schema (the tests run `pyspdxtools`).

use kubeslot_image::oci::{
    Descriptor, Manifest, MEDIA_TYPE_CONFIG, MEDIA_TYPE_MANIFEST, MEDIA_TYPE_SPDX_JSON,
};
use kubeslot_image::time;
use kubeslot_image::Digest;
use serde_json::{json, Value};

use crate::sign::{Artifact, EMPTY_CONFIG};

/// Where the SBOM lives inside the image.
pub const IMAGE_PATH: &str = "usr/share/kubeslot/sbom.spdx.json";
/// Namespace prefix; `.invalid` is reserved and never resolves, which is the
/// point: SPDX wants a unique URI, not a fetchable one.
const NAMESPACE_PREFIX: &str = "https://kubeslot.invalid/spdx/";

/// What an SBOM describes: one image and its inputs. Also the JSON that
/// `kubeslot-builder sbom --input` reads.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct SbomInput {
    /// The image name, e.g. `ubuntu2404-node`.
    pub name: String,
    pub version: String,
    /// `SOURCE_DATE_EPOCH` of the build (seconds).
    pub created: u64,
    pub packages: Vec<SbomPackage>,
}

/// One input of the image.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct SbomPackage {
    pub name: String,
    pub version: String,
    /// The pinned URL it was fetched from (or `NOASSERTION`).
    pub download_location: String,
    /// sha256 of the fetched artifact (tarball, binary, `.deb`, base image
    /// manifest).
    pub sha256: Digest,
    pub kind: PackageKind,
    /// Package URL (`pkg:deb/…`, `pkg:oci/…`, `pkg:generic/…`), when known.
    #[serde(default)]
    pub purl: Option<String>,
}

/// What sort of input a package is (SPDX `primaryPackagePurpose`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PackageKind {
    /// A downloaded binary or tarball (kubelet, containerd, …).
    Component,
    /// A `.deb` of the Debian-family base.
    DebianPackage,
    /// A base image pinned by digest.
    BaseImage,
}

impl PackageKind {
    fn purpose(self) -> &'static str {
        match self {
            PackageKind::Component => "APPLICATION",
            PackageKind::DebianPackage => "LIBRARY",
            PackageKind::BaseImage => "CONTAINER",
        }
    }
}

/// An SPDX identifier from free text: `SPDXRef-` + `[A-Za-z0-9.-]`.
fn spdx_id(index: usize, name: &str) -> String {
    let clean: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!("SPDXRef-Package-{index}-{clean}")
}

/// The SPDX 2.3 JSON document for `input`, as bytes (pretty, stable order).
pub fn generate(input: &SbomInput) -> Vec<u8> {
    let image_id = "SPDXRef-Image";
    let mut packages = vec![json!({
        "SPDXID": image_id,
        "name": input.name,
        "versionInfo": input.version,
        "downloadLocation": "NOASSERTION",
        "filesAnalyzed": false,
        "licenseConcluded": "NOASSERTION",
        "licenseDeclared": "NOASSERTION",
        "copyrightText": "NOASSERTION",
        "primaryPackagePurpose": "CONTAINER",
    })];
    let mut relationships = vec![json!({
        "spdxElementId": "SPDXRef-DOCUMENT",
        "relationshipType": "DESCRIBES",
        "relatedSpdxElement": image_id,
    })];
    for (i, p) in input.packages.iter().enumerate() {
        let id = spdx_id(i + 1, &p.name);
        let mut pkg = json!({
            "SPDXID": id,
            "name": p.name,
            "versionInfo": p.version,
            "downloadLocation": download_location(&p.download_location),
            "filesAnalyzed": false,
            "checksums": [{ "algorithm": "SHA256", "checksumValue": p.sha256.hex() }],
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": "NOASSERTION",
            "copyrightText": "NOASSERTION",
            "primaryPackagePurpose": p.kind.purpose(),
        });
        if let Some(purl) = &p.purl {
            pkg["externalRefs"] = json!([{
                "referenceCategory": "PACKAGE-MANAGER",
                "referenceType": "purl",
                "referenceLocator": purl,
            }]);
        }
        packages.push(pkg);
        relationships.push(json!({
            "spdxElementId": image_id,
            "relationshipType": "CONTAINS",
            "relatedSpdxElement": id,
        }));
    }
    let mut doc = json!({
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": format!("{}-{}", input.name, input.version),
        "documentNamespace": "",
        "creationInfo": {
            "created": time::rfc3339_seconds(input.created),
            "creators": [format!("Tool: kubeslot-builder-{}", env!("CARGO_PKG_VERSION"))],
        },
        "packages": packages,
        "relationships": relationships,
    });
    // The namespace names the content: hash the document without it, then
    // fill it in. Same inputs, same namespace, same bytes.
    let content = Digest::of(&to_bytes(&doc));
    doc["documentNamespace"] = Value::String(format!(
        "{NAMESPACE_PREFIX}{}-{}-{}",
        sanitise(&input.name),
        sanitise(&input.version),
        content.hex()
    ));
    to_bytes(&doc)
}

/// SPDX wants a URL (or NONE/NOASSERTION): a local or relative path (a
/// recipe's `../demo/base.tar.gz`) says nothing to a reader elsewhere.
fn download_location(s: &str) -> &str {
    let scheme = s.split_once("://").map(|(scheme, _)| scheme);
    match scheme {
        Some("http" | "https" | "ftp" | "git+https") => s,
        _ => "NOASSERTION",
    }
}

fn sanitise(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect()
}

fn to_bytes(v: &Value) -> Vec<u8> {
    let mut out = serde_json::to_vec_pretty(v).expect("json serialises");
    out.push(b'\n');
    out
}

/// The `.sbom` attachment for the image `subject`: an OCI manifest with one
/// `text/spdx+json` layer, the empty config, and the image as `subject`.
pub fn sbom_artifact(subject: &Descriptor, document: &[u8]) -> Artifact {
    let subject = Descriptor {
        platform: None,
        annotations: Default::default(),
        ..subject.clone()
    };
    let layer = Descriptor::new(
        MEDIA_TYPE_SPDX_JSON,
        Digest::of(document),
        document.len() as u64,
    );
    let manifest = Manifest {
        schema_version: 2,
        media_type: Some(MEDIA_TYPE_MANIFEST.into()),
        artifact_type: Some(MEDIA_TYPE_SPDX_JSON.into()),
        config: Descriptor::new(
            MEDIA_TYPE_CONFIG,
            Digest::of(EMPTY_CONFIG),
            EMPTY_CONFIG.len() as u64,
        ),
        layers: vec![layer],
        subject: Some(subject.clone()),
        annotations: Default::default(),
    };
    Artifact {
        tag: subject.digest.attachment_tag("sbom"),
        manifest: serde_json::to_vec(&manifest).expect("manifest serialises"),
        media_type: MEDIA_TYPE_MANIFEST.into(),
        blobs: vec![EMPTY_CONFIG.to_vec(), document.to_vec()],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input() -> SbomInput {
        SbomInput {
            name: "demo node".into(),
            version: "1.0".into(),
            created: 1_700_000_000,
            packages: vec![SbomPackage {
                name: "kubelet".into(),
                version: "v1.35.0".into(),
                download_location: "https://example.invalid/kubelet".into(),
                sha256: Digest::of(b"kubelet"),
                kind: PackageKind::Component,
                purl: Some("pkg:generic/kubelet@v1.35.0".into()),
            }],
        }
    }

    #[test]
    fn deterministic_and_content_named() {
        let a = generate(&input());
        assert_eq!(a, generate(&input()));
        let mut other = input();
        other.packages[0].sha256 = Digest::of(b"other");
        let b = generate(&other);
        let ns = |d: &[u8]| {
            serde_json::from_slice::<Value>(d).unwrap()["documentNamespace"]
                .as_str()
                .unwrap()
                .to_string()
        };
        assert_ne!(ns(&a), ns(&b));
        let v: Value = serde_json::from_slice(&a).unwrap();
        assert_eq!(v["packages"][1]["SPDXID"], "SPDXRef-Package-1-kubelet");
        assert_eq!(
            v["packages"][1]["checksums"][0]["checksumValue"],
            Digest::of(b"kubelet").hex()
        );
    }
}
