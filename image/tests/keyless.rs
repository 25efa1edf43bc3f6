//! Keyless verification against real, public Sigstore vectors
//! (`testdata/keyless/`, origins in its README): every
//! sigstore-conformance bundle-verification case, cosign's OCI-image v0.3
//! bundle, a real `cosign sign` v3 bundle from GitHub Actions, a legacy
//! keyless `.sig` layer, and the mutations a host must refuse.

use std::path::{Path, PathBuf};

use kubeslot_image::keyless::{
    GithubRule, IdentityRule, KeylessPolicy, Rules, Target, TrustedRoot,
};
use sha2::Digest as _;

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/keyless")
}

fn read(p: impl AsRef<Path>) -> Vec<u8> {
    let p = p.as_ref();
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn production_root() -> TrustedRoot {
    TrustedRoot::parse(&read(data().join("cosign/trusted_root_pgi.json"))).unwrap()
}

fn rules(issuer: &str, identity: IdentityRule) -> Rules {
    Rules {
        issuer: issuer.into(),
        identity,
        github: GithubRule::default(),
        require_sct: true,
        accept_deprecated_issuer: false,
        allow_unnamed_subject: false,
    }
}

fn sha256(b: &[u8]) -> [u8; 32] {
    sha2::Sha256::digest(b).into()
}

const GITHUB: &str = "https://token.actions.githubusercontent.com";
const BEACON: &str = "https://github.com/sigstore-conformance/extremely-dangerous-public-oidc-beacon/.github/workflows/extremely-dangerous-oidc-beacon.yml@refs/heads/main";

#[derive(Debug, Clone, Copy)]
enum Expect {
    Pass,
    Fail,
    /// Refused as not supported (yet), with this text in the error.
    Refused(&'static str),
}

/// Every case of sigstore-conformance's `bundle-verify`, with what this
/// verifier must do. A case for something not supported yet is an
/// expected refusal (fail closed), not a skip.
const CASES: &[(&str, Expect)] = &[
    ("bundle-empty-certificate-chain_fail", Expect::Fail),
    ("bundle-from-wrong-instance_fail", Expect::Fail),
    ("bundle-invalid-base64-signature_fail", Expect::Fail),
    ("bundle-malformed-json_fail", Expect::Fail),
    ("bundle-negative-log-index_fail", Expect::Fail),
    ("bundle-unknown-version_fail", Expect::Fail),
    ("bundle-with-root-cert_fail", Expect::Fail),
    (
        "bundle-with-sct-with-extensions",
        Expect::Refused("Rekor v2 log entries"),
    ),
    ("checkpoint-bad-keyhint_fail", Expect::Fail),
    ("checkpoint-wrong-roothash_fail", Expect::Fail),
    ("dsse-invalid-sig_fail", Expect::Fail),
    ("dsse-mismatch-envelope_fail", Expect::Fail),
    ("dsse-mismatch-sig_fail", Expect::Fail),
    ("happy-path-intoto-in-dsse-v3", Expect::Pass),
    ("happy-path-v0.1", Expect::Pass),
    ("happy-path-v0.2", Expect::Pass),
    ("happy-path-v0.3-new-mediaType", Expect::Pass),
    ("happy-path-v0.3", Expect::Pass),
    ("inclusion-proof-corrupted-hash_fail", Expect::Fail),
    ("incorrect-public-key_fail", Expect::Fail),
    ("integrated-time-in-future_fail", Expect::Fail),
    (
        "intoto-expired-certificate_fail",
        Expect::Refused("intoto 0.0.2"),
    ),
    (
        "intoto-log-entry-mismatch_fail",
        Expect::Refused("intoto 0.0.2"),
    ),
    (
        "intoto-missing-inclusion-proof_fail",
        Expect::Refused("intoto 0.0.2"),
    ),
    (
        "intoto-set-outside-signing-cert-validity_fail",
        Expect::Refused("intoto 0.0.2"),
    ),
    (
        "intoto-tsa-timestamp-outside-cert-validity_fail",
        Expect::Refused("intoto 0.0.2"),
    ),
    (
        "intoto-with-custom-trust-root",
        Expect::Refused("intoto 0.0.2"),
    ),
    ("invalid-checkpoint-signature_fail", Expect::Fail),
    ("invalid-ct-key_fail", Expect::Fail),
    ("invalid-inclusion-proof_fail", Expect::Fail),
    (
        "managed-key-and-trusted-root",
        Expect::Refused("signed with a key, not keylessly"),
    ),
    (
        "managed-key-happy-path",
        Expect::Refused("signed with a key, not keylessly"),
    ),
    (
        "managed-key-no-key_fail",
        Expect::Refused("signed with a key, not keylessly"),
    ),
    (
        "managed-key-wrong-key_fail",
        Expect::Refused("signed with a key, not keylessly"),
    ),
    ("message-digest-mismatch_fail", Expect::Fail),
    (
        "rekor2-checkpoint-cosigned",
        Expect::Refused("Rekor v2 log entries"),
    ),
    (
        "rekor2-checkpoint-missing-log-signature_fail",
        Expect::Refused("Rekor v2 log entries"),
    ),
    (
        "rekor2-checkpoint-missing-origin_fail",
        Expect::Refused("Rekor v2 log entries"),
    ),
    (
        "rekor2-checkpoint-missing-root-hash_fail",
        Expect::Refused("Rekor v2 log entries"),
    ),
    (
        "rekor2-checkpoint-missing-size_fail",
        Expect::Refused("Rekor v2 log entries"),
    ),
    (
        "rekor2-checkpoint-multiple-cosigs",
        Expect::Refused("Rekor v2 log entries"),
    ),
    (
        "rekor2-checkpoint-no-matching-signature_fail",
        Expect::Refused("Rekor v2 log entries"),
    ),
    (
        "rekor2-checkpoint-origin-not-first",
        Expect::Refused("Rekor v2 log entries"),
    ),
    (
        "rekor2-checkpoint-two-sigs-cosigned",
        Expect::Refused("Rekor v2 log entries"),
    ),
    (
        "rekor2-checkpoint-two-sigs-from-origin",
        Expect::Refused("Rekor v2 log entries"),
    ),
    (
        "rekor2-dsse-happy-path",
        Expect::Refused("Rekor v2 log entries"),
    ),
    (
        "rekor2-dsse-invalid-sig_fail",
        Expect::Refused("Rekor v2 log entries"),
    ),
    (
        "rekor2-dsse-mismatch-envelope_fail",
        Expect::Refused("Rekor v2 log entries"),
    ),
    (
        "rekor2-dsse-mismatch-sig_fail",
        Expect::Refused("Rekor v2 log entries"),
    ),
    ("rekor2-happy-path", Expect::Refused("Rekor v2 log entries")),
    (
        "rekor2-no-inclusion-proof_fail",
        Expect::Refused("Rekor v2 log entries"),
    ),
    (
        "rekor2-no-timestamp_fail",
        Expect::Refused("Rekor v2 log entries"),
    ),
    (
        "rekor2-timestamp-outside-trust-root-tsa-validity_fail",
        Expect::Refused("Rekor v2 log entries"),
    ),
    (
        "rekor2-timestamp-outside-tsa-cert-validity_fail",
        Expect::Refused("Rekor v2 log entries"),
    ),
    (
        "rekor2-timestamp-payload-mismatch_fail",
        Expect::Refused("Rekor v2 log entries"),
    ),
    (
        "rekor2-timestamp-untrusted-tsa-with-embedded-cert_fail",
        Expect::Refused("Rekor v2 log entries"),
    ),
    (
        "rekor2-timestamp-untrusted-tsa-without-embedded-cert_fail",
        Expect::Refused("Rekor v2 log entries"),
    ),
    (
        "rekor2-timestamp-with-embedded-cert",
        Expect::Refused("Rekor v2 log entries"),
    ),
    (
        "rekor2-timestamp-with-expired-cert-chain",
        Expect::Refused("Rekor v2 log entries"),
    ),
    (
        "rekor2-timestamp-with-incorrect-time_fail",
        Expect::Refused("Rekor v2 log entries"),
    ),
    (
        "rekor2-timestamp-without-embedded-cert",
        Expect::Refused("Rekor v2 log entries"),
    ),
    ("set-invalid-signature_fail", Expect::Fail),
    ("signature-mismatch_fail", Expect::Fail),
    // The malformed root (no validFor start) is refused before the bundle is read.
    ("trust-root-tlog-missing-validity-start_fail", Expect::Fail),
    ("trust-root-tlog-validity-end-inclusive", Expect::Pass),
    (
        "trust-root-tsa-validity-end-inclusive",
        Expect::Refused("Rekor v2 log entries"),
    ),
    ("wrong-hashedrekord-artifact_fail", Expect::Fail),
    ("wrong-hashedrekord-cert-and-sig_fail", Expect::Fail),
    ("wrong-hashedrekord-entry_fail", Expect::Fail),
    ("wrong-material_fail", Expect::Fail),
];

/// Verifies one conformance case as the suite does: its trusted root (or
/// production's), identity and issuer (or the suite's defaults), artifact
/// (or `a.txt`), SCTs required.
fn run_case(dir: &Path) -> Result<kubeslot_image::keyless::Verified, String> {
    let opt = |name: &str| std::fs::read(dir.join(name)).ok();
    let root = match opt("trusted_root.json") {
        Some(b) => TrustedRoot::parse(&b).map_err(|e| format!("trusted root: {e}"))?,
        None => production_root(),
    };
    let text = |b: Vec<u8>| String::from_utf8(b).unwrap().trim().to_string();
    let identity = opt("identity").map(text).unwrap_or(BEACON.into());
    let issuer = opt("issuer").map(text).unwrap_or(GITHUB.into());
    let artifact = opt("artifact").unwrap_or_else(|| read(dir.join("../a.txt")));
    let policy = KeylessPolicy {
        root,
        rules: rules(&issuer, IdentityRule::Exact(identity)),
    };
    policy
        .verify_bundle(
            &read(dir.join("bundle.sigstore.json")),
            Target(sha256(&artifact)),
        )
        .map_err(|e| e.to_string())
}

#[test]
fn every_conformance_case_as_a_table() {
    let dir = data().join("conformance");
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_dir())
        .map(|e| e.file_name().into_string().unwrap())
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = CASES.iter().map(|(n, _)| n.to_string()).collect();
    listed.sort();
    assert_eq!(on_disk, listed, "every case on disk has an expectation");

    let mut wrong = Vec::new();
    for (name, expect) in CASES {
        match expect {
            Expect::Pass => assert!(!name.ends_with("_fail"), "{name} must fail"),
            Expect::Fail => assert!(name.ends_with("_fail"), "{name} must pass"),
            Expect::Refused(_) => {}
        }
        let result = run_case(&dir.join(name));
        let ok = match (expect, &result) {
            (Expect::Pass, Ok(_)) => true,
            (Expect::Fail, Err(e)) => !e.contains("not supported yet"),
            (Expect::Refused(text), Err(e)) => {
                e.contains(text) && e.contains("not supported yet")
                    || (text.contains("key") && e.contains(text))
            }
            _ => false,
        };
        if std::env::var_os("KEYLESS_SHOW").is_some() {
            eprintln!("{name}: {result:?}");
        }
        if !ok {
            wrong.push(format!("{name}: expected {expect:?}, got {result:?}"));
        }
    }
    assert!(wrong.is_empty(), "\n{}", wrong.join("\n"));
}

// ---- the image vectors and the mutations a host must refuse ----

use base64::Engine as _;
use kubeslot_image::keyless::oci::{check_referrers, check_sig_layers};
use kubeslot_image::keyless::KeylessError;
use kubeslot_image::oci::{
    Descriptor, Manifest, ANNOTATION_COSIGN_SIGNATURE, MEDIA_TYPE_CONFIG, MEDIA_TYPE_SIMPLE_SIGNING,
};
use kubeslot_image::reference::Identity;
use kubeslot_image::Digest;
use serde_json::Value;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// go-containerregistry's `empty.Image`, byte for byte: the image cosign's
/// OCI bundle vector signs (testdata/keyless/README.md).
pub const EMPTY_IMAGE_CONFIG: &str = r#"{"architecture":"","created":"0001-01-01T00:00:00Z","os":"","rootfs":{"type":"layers","diff_ids":null},"config":{}}"#;

fn empty_image_manifest() -> String {
    format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v2+json","config":{{"mediaType":"application/vnd.docker.container.image.v1+json","size":{},"digest":"{}"}},"layers":[]}}"#,
        EMPTY_IMAGE_CONFIG.len(),
        Digest::of(EMPTY_IMAGE_CONFIG.as_bytes())
    )
}

const COSIGN_SUBJECT: &str =
    "sha256:732112270d7e59418a8c080b134b24cabd67d250d0d0147a97ed95ba5c280aa4";
const KUBEWARDEN_SUBJECT: &str =
    "sha256:c811d58de79c92f03214e63aa339484e488d694ae8a6283b5f3f17a9faf50172";
const KUBEWARDEN_WORKFLOW: &str = "https://github.com/kubewarden/kubewarden-controller/.github/workflows/release.yml@refs/tags/v1.34.0";

fn cosign_policy() -> KeylessPolicy {
    KeylessPolicy {
        root: production_root(),
        rules: rules(
            "https://github.com/login/oauth",
            IdentityRule::Exact("cody@soyland.com".into()),
        ),
    }
}

fn kubewarden_policy(identity: IdentityRule) -> KeylessPolicy {
    let mut r = rules(GITHUB, identity);
    r.github = GithubRule {
        source_repository: Some("https://github.com/kubewarden/kubewarden-controller".into()),
        source_ref: Some("refs/tags/v1.34.0".into()),
        workflow: Some(KUBEWARDEN_WORKFLOW.into()),
    };
    KeylessPolicy {
        root: production_root(),
        rules: r,
    }
}

fn target(d: &str) -> Target {
    Target(*d.parse::<Digest>().unwrap().as_bytes())
}

fn json(path: &str) -> Value {
    serde_json::from_slice(&read(data().join(path))).unwrap()
}

fn refused(r: Result<kubeslot_image::keyless::Verified, KeylessError>) -> String {
    let e = r.expect_err("must be refused");
    e.to_string()
}

#[test]
fn cosign_oci_bundle_signs_the_exact_empty_image() {
    // The reconstruction is right only if it hashes to the statement's subject.
    assert_eq!(
        Digest::of(empty_image_manifest().as_bytes()).to_string(),
        COSIGN_SUBJECT
    );
    let v = cosign_policy()
        .verify_bundle(
            &read(data().join("cosign/oci-attestation.sigstore.json")),
            target(COSIGN_SUBJECT),
        )
        .unwrap();
    assert_eq!(v.san, "cody@soyland.com");
    assert_eq!(v.subject_name.as_deref(), Some("127.0.0.1:60943/repo"));
    assert_eq!(v.integrated_time, 1740770291);
}

#[test]
fn cosign_v3_sign_bundle_from_github_actions() {
    let bundle = read(data().join("sigstore-rs/bundle_v03.json"));
    let exact = kubewarden_policy(IdentityRule::Exact(KUBEWARDEN_WORKFLOW.into()));
    let v = exact
        .verify_bundle(&bundle, target(KUBEWARDEN_SUBJECT))
        .unwrap();
    assert_eq!(v.issuer, GITHUB);
    assert_eq!(v.subject_name, None, "cosign 3's sign names no repository");
    // It carries an RFC 3161 timestamp beside the SET; without the SET it
    // would have no time this verifier can check.
    let mut b = json("sigstore-rs/bundle_v03.json");
    assert!(
        b["verificationMaterial"]["timestampVerificationData"]["rfc3161Timestamps"][0].is_object()
    );
    b["verificationMaterial"]["tlogEntries"][0]
        .as_object_mut()
        .unwrap()
        .remove("inclusionPromise");
    let e =
        refused(exact.verify_bundle(&serde_json::to_vec(&b).unwrap(), target(KUBEWARDEN_SUBJECT)));
    assert!(
        e.contains(
            "RFC 3161 timestamps (without a Rekor signed entry timestamp) are not supported yet"
        ),
        "{e}"
    );
    // tag-triggered runs: a regexp over the tags of one workflow
    let tags = kubewarden_policy(
        IdentityRule::regexp(
            r"https://github\.com/kubewarden/kubewarden-controller/\.github/workflows/release\.yml@refs/tags/v.*",
        )
        .unwrap(),
    );
    tags.verify_bundle(&bundle, target(KUBEWARDEN_SUBJECT))
        .unwrap();
}

#[test]
fn an_unanchored_looking_regexp_matches_nothing_more() {
    let bundle = read(data().join("sigstore-rs/bundle_v03.json"));
    let p = kubewarden_policy(
        IdentityRule::regexp("github.com/kubewarden/kubewarden-controller").unwrap(),
    );
    let e = refused(p.verify_bundle(&bundle, target(KUBEWARDEN_SUBJECT)));
    assert!(
        e.contains(KUBEWARDEN_WORKFLOW)
            && e.contains(GITHUB)
            && e.contains("anchored at both ends"),
        "{e}"
    );
}

#[test]
fn github_claims_are_exact() {
    let bundle = read(data().join("sigstore-rs/bundle_v03.json"));
    let mut p = kubewarden_policy(IdentityRule::Exact(KUBEWARDEN_WORKFLOW.into()));
    p.rules.github.source_ref = Some("refs/tags/v1.35.0".into());
    let e = refused(p.verify_bundle(&bundle, target(KUBEWARDEN_SUBJECT)));
    assert!(
        e.contains("1.3.6.1.4.1.57264.1.14") && e.contains("refs/tags/v1.34.0"),
        "{e}"
    );
    let mut p = kubewarden_policy(IdentityRule::Exact(KUBEWARDEN_WORKFLOW.into()));
    p.rules.github.source_repository = Some("https://github.com/kubewarden/other".into());
    let e = refused(p.verify_bundle(&bundle, target(KUBEWARDEN_SUBJECT)));
    assert!(e.contains("trust.keyless.github.source_repository"), "{e}");
    let mut p = kubewarden_policy(IdentityRule::Exact(KUBEWARDEN_WORKFLOW.into()));
    p.rules.issuer = "https://accounts.google.com".into();
    let e = refused(p.verify_bundle(&bundle, target(KUBEWARDEN_SUBJECT)));
    assert!(e.contains("is not trust.keyless.issuer"), "{e}");
}

#[test]
fn another_image_digest_is_refused() {
    let other = Digest::of(b"another image").to_string();
    let e = refused(cosign_policy().verify_bundle(
        &read(data().join("cosign/oci-attestation.sigstore.json")),
        target(&other),
    ));
    assert!(
        e.contains("cody@soyland.com") && e.contains("do not include") && e.contains(&other),
        "{e}"
    );
}

fn flip_b64(text: &str, at: usize) -> String {
    let mut b = B64.decode(text).unwrap();
    b[at] ^= 1;
    B64.encode(b)
}

#[test]
fn a_flipped_set_byte_is_refused() {
    let mut b = json("cosign/oci-attestation.sigstore.json");
    let set = &mut b["verificationMaterial"]["tlogEntries"][0]["inclusionPromise"]
        ["signedEntryTimestamp"];
    *set = Value::String(flip_b64(set.as_str().unwrap(), 12));
    let e = refused(
        cosign_policy().verify_bundle(&serde_json::to_vec(&b).unwrap(), target(COSIGN_SUBJECT)),
    );
    assert!(e.contains("signed entry timestamp does not verify"), "{e}");
}

#[test]
fn a_swapped_certificate_is_refused() {
    // The kubewarden bundle's (real, Fulcio-issued) certificate in place of
    // the cosign vector's: a valid certificate, not the signer's.
    let other = json("sigstore-rs/bundle_v03.json")["verificationMaterial"]["certificate"].clone();
    let mut b = json("cosign/oci-attestation.sigstore.json");
    b["verificationMaterial"]["certificate"] = other;
    let mut p = cosign_policy();
    p.rules.identity = IdentityRule::Exact(KUBEWARDEN_WORKFLOW.into());
    p.rules.issuer = GITHUB.into();
    let e = refused(p.verify_bundle(&serde_json::to_vec(&b).unwrap(), target(COSIGN_SUBJECT)));
    assert!(e.contains(KUBEWARDEN_WORKFLOW), "{e}");
    assert!(
        e.contains("outside the certificate's validity")
            || e.contains("does not verify with the certificate's key"),
        "{e}"
    );
}

#[test]
fn a_time_outside_the_certificate_is_refused() {
    // The integrated time is signed: moving it breaks the SET...
    let mut b = json("cosign/oci-attestation.sigstore.json");
    b["verificationMaterial"]["tlogEntries"][0]["integratedTime"] =
        Value::String("1740771291".into());
    let e = refused(
        cosign_policy().verify_bundle(&serde_json::to_vec(&b).unwrap(), target(COSIGN_SUBJECT)),
    );
    assert!(e.contains("signed entry timestamp does not verify"), "{e}");
    // ...and a log that signed a time outside the certificate is refused on
    // the certificate (sigstore-conformance's real vector).
    let e = run_case(&data().join("conformance/integrated-time-in-future_fail")).unwrap_err();
    assert!(e.contains("outside the certificate's validity"), "{e}");
    // A CA of the root not valid at the log's time does not count either.
    let mut root = json("cosign/trusted_root_pgi.json");
    root["certificateAuthorities"][1]["validFor"]["end"] =
        Value::String("2024-01-01T00:00:00Z".into());
    let p = KeylessPolicy {
        root: TrustedRoot::parse(&serde_json::to_vec(&root).unwrap()).unwrap(),
        rules: cosign_policy().rules,
    };
    let e = refused(p.verify_bundle(
        &read(data().join("cosign/oci-attestation.sigstore.json")),
        target(COSIGN_SUBJECT),
    ));
    assert!(e.contains("not one valid at the log's time"), "{e}");
}

#[test]
fn a_root_supplied_by_the_bundle_is_refused() {
    let root = json("cosign/trusted_root_pgi.json");
    let chain = &root["certificateAuthorities"][1]["certChain"]["certificates"];
    let mut b = json("cosign/oci-attestation.sigstore.json");
    let leaf = b["verificationMaterial"]["certificate"].clone();
    let vm = b["verificationMaterial"].as_object_mut().unwrap();
    vm.remove("certificate");
    vm.insert(
        "x509CertificateChain".into(),
        serde_json::json!({"certificates": [leaf, chain[0], chain[1]]}),
    );
    let e = refused(
        cosign_policy().verify_bundle(&serde_json::to_vec(&b).unwrap(), target(COSIGN_SUBJECT)),
    );
    assert!(e.contains("supplies its own root certificate"), "{e}");
}

#[test]
fn the_issuer_only_in_the_deprecated_extension() {
    // cosign sign-blob --bundle from 2022 (sigstore-rs): Fulcio then wrote
    // only 1.3.6.1.4.1.57264.1.1.
    let b: Value = json("sigstore-rs/sign-blob.bundle");
    let cert_pem = B64.decode(b["cert"].as_str().unwrap()).unwrap();
    let sig = B64.decode(b["base64Signature"].as_str().unwrap()).unwrap();
    let rekor = b["rekorBundle"].to_string();
    let blob: Digest = "sha256:4bc453b53cb3d914b45f4b250294236adba2c0e09ff6f03793949e7e39fd4cc1"
        .parse()
        .unwrap();
    let mut p = KeylessPolicy {
        root: production_root(),
        rules: rules(
            "https://github.com/login/oauth",
            IdentityRule::Exact("daniel.bevenius@gmail.com".into()),
        ),
    };
    let verify = |p: &KeylessPolicy| {
        p.verify_legacy(*blob.as_bytes(), &sig, &cert_pem, None, Some(&rekor), false)
    };
    let e = refused(verify(&p));
    assert!(
        e.contains("daniel.bevenius@gmail.com")
            && e.contains("only in the deprecated extension 1.3.6.1.4.1.57264.1.1"),
        "{e}"
    );
    p.rules.accept_deprecated_issuer = true;
    let v = verify(&p).unwrap();
    assert_eq!(v.issuer, "https://github.com/login/oauth");
}

/// The sigstore-rs legacy layer as a `.sig` artifact manifest.
fn legacy_sig() -> (Manifest, Vec<u8>) {
    let dir = data().join("sigstore-rs/legacy-layer");
    let payload = read(dir.join("payload.json"));
    let annotations: std::collections::BTreeMap<String, String> =
        serde_json::from_slice(&read(dir.join("annotations.json"))).unwrap();
    let mut layer = Descriptor::new(
        MEDIA_TYPE_SIMPLE_SIGNING,
        Digest::of(&payload),
        payload.len() as u64,
    );
    layer.annotations = annotations;
    assert!(layer.annotations.contains_key(ANNOTATION_COSIGN_SIGNATURE));
    let m = Manifest {
        schema_version: 2,
        media_type: None,
        artifact_type: None,
        config: Descriptor::new(MEDIA_TYPE_CONFIG, Digest::of(b"{}"), 2),
        layers: vec![layer],
        subject: None,
        annotations: Default::default(),
    };
    (m, payload)
}

const LEGACY_IMAGE: &str =
    "sha256:5f481572d088dc4023afb35fced9530ced3d9b03bf7299c6f492163cb9f0452e";

#[test]
fn legacy_keyless_layer_through_the_sig_path() {
    let (sig, payload) = legacy_sig();
    let image: Digest = LEGACY_IMAGE.parse().unwrap();
    let identity =
        Identity::repository("registry-testing.svc.lan/kubewarden/disallow-service-nodeport")
            .unwrap();
    let mut p = KeylessPolicy {
        root: production_root(),
        rules: rules(
            "https://github.com/login/oauth",
            IdentityRule::Exact("flavio@castelli.me".into()),
        ),
    };
    // 2021: no SCT yet, and no issuer extension at all. Every cryptographic
    // check (SET, chain to the 2021 Fulcio root at the log's time, body
    // binding, signature) passes; the policy cannot be met, and says why.
    p.rules.require_sct = false;
    let e = check_sig_layers(&p, image, Some(&identity), &sig, |_| Ok(payload.clone()))
        .unwrap_err()
        .join("; ");
    assert!(
        e.contains("flavio@castelli.me") && e.contains("names no OIDC issuer"),
        "{e}"
    );
    p.rules.require_sct = true;
    let e = check_sig_layers(&p, image, Some(&identity), &sig, |_| Ok(payload.clone()))
        .unwrap_err()
        .join("; ");
    assert!(e.contains("carries no SCT"), "{e}");
}

#[test]
fn legacy_mutations() {
    let (sig, payload) = legacy_sig();
    let image: Digest = LEGACY_IMAGE.parse().unwrap();
    let mut p = KeylessPolicy {
        root: production_root(),
        rules: rules(
            "https://github.com/login/oauth",
            IdentityRule::Exact("flavio@castelli.me".into()),
        ),
    };
    p.rules.require_sct = false;
    let run = |m: &Manifest, d: Digest| {
        check_sig_layers(&p, d, None, m, |_| Ok(payload.clone()))
            .unwrap_err()
            .join("; ")
    };
    // a flipped SET byte
    let mut m = sig.clone();
    let bundle = m.layers[0]
        .annotations
        .get_mut("dev.sigstore.cosign/bundle")
        .unwrap();
    let mut v: Value = serde_json::from_str(bundle).unwrap();
    v["SignedEntryTimestamp"] =
        Value::String(flip_b64(v["SignedEntryTimestamp"].as_str().unwrap(), 10));
    *bundle = v.to_string();
    let e = run(&m, image);
    assert!(e.contains("signed entry timestamp does not verify"), "{e}");
    // a swapped certificate (the 2022 sign-blob one)
    let mut m = sig.clone();
    let other = json("sigstore-rs/sign-blob.bundle")["cert"]
        .as_str()
        .unwrap()
        .to_string();
    m.layers[0].annotations.insert(
        "dev.sigstore.cosign/certificate".into(),
        String::from_utf8(B64.decode(other).unwrap()).unwrap(),
    );
    let e = run(&m, image);
    assert!(e.contains("daniel.bevenius@gmail.com"), "{e}");
    // another image digest
    let e = run(&sig, Digest::of(b"another image"));
    assert!(
        e.contains("payload names digest") && e.contains(LEGACY_IMAGE),
        "{e}"
    );
    // a root the layer supplies itself in its chain
    let custom = json("conformance/intoto-with-custom-trust-root/trusted_root.json");
    let der = B64
        .decode(
            custom["certificateAuthorities"][0]["certChain"]["certificates"][0]["rawBytes"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
    let pem = format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        B64.encode(der)
    );
    let mut m = sig.clone();
    m.layers[0]
        .annotations
        .insert("dev.sigstore.cosign/chain".into(), pem);
    let e = run(&m, image);
    assert!(e.contains("supplies its own root certificate"), "{e}");
    // time from an RFC 3161 timestamp alone: not supported yet
    let mut m = sig.clone();
    m.layers[0].annotations.remove("dev.sigstore.cosign/bundle");
    m.layers[0]
        .annotations
        .insert("dev.sigstore.cosign/rfc3161timestamp".into(), "{}".into());
    let e = run(&m, image);
    assert!(
        e.contains("RFC 3161 timestamps (without a Rekor bundle) are not supported yet"),
        "{e}"
    );
    // no log entry at all
    m.layers[0]
        .annotations
        .remove("dev.sigstore.cosign/rfc3161timestamp");
    let e = run(&m, image);
    assert!(e.contains("no Rekor bundle"), "{e}");
}

#[test]
fn bundles_among_referrers() {
    let bundle = read(data().join("cosign/oci-attestation.sigstore.json"));
    let image: Digest = COSIGN_SUBJECT.parse().unwrap();
    let media = "application/vnd.dev.sigstore.bundle.v0.3+json";
    let layer = Descriptor::new(media, Digest::of(&bundle), bundle.len() as u64);
    let manifest = Manifest {
        schema_version: 2,
        media_type: Some("application/vnd.oci.image.manifest.v1+json".into()),
        artifact_type: Some(media.into()),
        config: Descriptor::new("application/vnd.oci.empty.v1+json", Digest::of(b"{}"), 2),
        layers: vec![layer],
        subject: Some(Descriptor::new(
            "application/vnd.docker.distribution.manifest.v2+json",
            image,
            empty_image_manifest().len() as u64,
        )),
        annotations: Default::default(),
    };
    let mut referrer = Descriptor::new(
        "application/vnd.oci.image.manifest.v1+json",
        Digest::of(b"m"),
        1,
    );
    referrer.artifact_type = Some(media.into());
    let run = |identity: Option<&Identity>, d: Digest| {
        check_referrers(
            &cosign_policy(),
            d,
            identity,
            std::slice::from_ref(&referrer),
            |_| Ok(manifest.clone()),
            |_, _| Ok(bundle.clone()),
        )
    };
    // everything checks out, but the statement is an attestation (`cosign
    // attest`'s predicate), not cosign's signature: it does not count
    let e = run(
        Some(&Identity::repository("127.0.0.1:60943/repo").unwrap()),
        image,
    )
    .unwrap_err()
    .join("; ");
    assert!(
        e.contains("predicate type \"https://cosign.sigstore.dev/attestation/v1\"")
            && e.contains("not cosign's signature"),
        "{e}"
    );
    // the statement names its repository: another one does not count
    let e = run(
        Some(&Identity::repository("ghcr.io/org/node").unwrap()),
        image,
    )
    .unwrap_err()
    .join("; ");
    assert!(
        e.contains("names repository 127.0.0.1:60943/repo, not ghcr.io/org/node"),
        "{e}"
    );
    // a referrer whose subject is another image is not this image's
    let e = run(None, Digest::of(b"other")).unwrap_err().join("; ");
    assert!(e.contains("its subject is not"), "{e}");
}

#[path = "keyless/x509.rs"]
mod x509;
