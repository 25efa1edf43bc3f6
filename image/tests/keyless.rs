//! Keyless verification against real, public Sigstore vectors
//! (`testdata/keyless/`, origins in its README): every
//! sigstore-conformance bundle-verification case, cosign's OCI-image v0.3
//! bundle, a real `cosign sign` v3 bundle from GitHub Actions, a legacy
//! keyless `.sig` layer, and the mutations a host must refuse.

use std::path::{Path, PathBuf};

use kubeslot_image::keyless::{GithubRule, IdentityRule, KeylessPolicy, Rules, Target, TrustedRoot};
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
    ("bundle-with-sct-with-extensions", Expect::Refused("Rekor v2 log entries")),
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
    ("intoto-expired-certificate_fail", Expect::Refused("intoto 0.0.2")),
    ("intoto-log-entry-mismatch_fail", Expect::Refused("intoto 0.0.2")),
    ("intoto-missing-inclusion-proof_fail", Expect::Refused("intoto 0.0.2")),
    ("intoto-set-outside-signing-cert-validity_fail", Expect::Refused("intoto 0.0.2")),
    ("intoto-tsa-timestamp-outside-cert-validity_fail", Expect::Refused("intoto 0.0.2")),
    ("intoto-with-custom-trust-root", Expect::Refused("intoto 0.0.2")),
    ("invalid-checkpoint-signature_fail", Expect::Fail),
    ("invalid-ct-key_fail", Expect::Fail),
    ("invalid-inclusion-proof_fail", Expect::Fail),
    ("managed-key-and-trusted-root", Expect::Refused("signed with a key, not keylessly")),
    ("managed-key-happy-path", Expect::Refused("signed with a key, not keylessly")),
    ("managed-key-no-key_fail", Expect::Refused("signed with a key, not keylessly")),
    ("managed-key-wrong-key_fail", Expect::Refused("signed with a key, not keylessly")),
    ("message-digest-mismatch_fail", Expect::Fail),
    ("rekor2-checkpoint-cosigned", Expect::Refused("Rekor v2 log entries")),
    ("rekor2-checkpoint-missing-log-signature_fail", Expect::Refused("Rekor v2 log entries")),
    ("rekor2-checkpoint-missing-origin_fail", Expect::Refused("Rekor v2 log entries")),
    ("rekor2-checkpoint-missing-root-hash_fail", Expect::Refused("Rekor v2 log entries")),
    ("rekor2-checkpoint-missing-size_fail", Expect::Refused("Rekor v2 log entries")),
    ("rekor2-checkpoint-multiple-cosigs", Expect::Refused("Rekor v2 log entries")),
    ("rekor2-checkpoint-no-matching-signature_fail", Expect::Refused("Rekor v2 log entries")),
    ("rekor2-checkpoint-origin-not-first", Expect::Refused("Rekor v2 log entries")),
    ("rekor2-checkpoint-two-sigs-cosigned", Expect::Refused("Rekor v2 log entries")),
    ("rekor2-checkpoint-two-sigs-from-origin", Expect::Refused("Rekor v2 log entries")),
    ("rekor2-dsse-happy-path", Expect::Refused("Rekor v2 log entries")),
    ("rekor2-dsse-invalid-sig_fail", Expect::Refused("Rekor v2 log entries")),
    ("rekor2-dsse-mismatch-envelope_fail", Expect::Refused("Rekor v2 log entries")),
    ("rekor2-dsse-mismatch-sig_fail", Expect::Refused("Rekor v2 log entries")),
    ("rekor2-happy-path", Expect::Refused("Rekor v2 log entries")),
    ("rekor2-no-inclusion-proof_fail", Expect::Refused("Rekor v2 log entries")),
    ("rekor2-no-timestamp_fail", Expect::Refused("Rekor v2 log entries")),
    ("rekor2-timestamp-outside-trust-root-tsa-validity_fail", Expect::Refused("Rekor v2 log entries")),
    ("rekor2-timestamp-outside-tsa-cert-validity_fail", Expect::Refused("Rekor v2 log entries")),
    ("rekor2-timestamp-payload-mismatch_fail", Expect::Refused("Rekor v2 log entries")),
    ("rekor2-timestamp-untrusted-tsa-with-embedded-cert_fail", Expect::Refused("Rekor v2 log entries")),
    ("rekor2-timestamp-untrusted-tsa-without-embedded-cert_fail", Expect::Refused("Rekor v2 log entries")),
    ("rekor2-timestamp-with-embedded-cert", Expect::Refused("Rekor v2 log entries")),
    ("rekor2-timestamp-with-expired-cert-chain", Expect::Refused("Rekor v2 log entries")),
    ("rekor2-timestamp-with-incorrect-time_fail", Expect::Refused("Rekor v2 log entries")),
    ("rekor2-timestamp-without-embedded-cert", Expect::Refused("Rekor v2 log entries")),
    ("set-invalid-signature_fail", Expect::Fail),
    ("signature-mismatch_fail", Expect::Fail),
    // The malformed root (no validFor start) is refused before the bundle is read.
    ("trust-root-tlog-missing-validity-start_fail", Expect::Fail),
    ("trust-root-tlog-validity-end-inclusive", Expect::Pass),
    ("trust-root-tsa-validity-end-inclusive", Expect::Refused("Rekor v2 log entries")),
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
        .verify_bundle(&read(dir.join("bundle.sigstore.json")), Target(sha256(&artifact)))
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
            (Expect::Refused(text), Err(e)) => e.contains(text) && e.contains("not supported yet")
                || (text.contains("key") && e.contains(text)),
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
