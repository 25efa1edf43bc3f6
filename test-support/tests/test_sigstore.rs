//! The test Sigstore instance checked by others than the product: `openssl`
//! reads its certificates as Fulcio's (chain to the root at the signing
//! time under `-x509_strict`, the extensions, the embedded SCT), the
//! product's trusted-root reader takes its `trusted_root.json`, and its
//! command (`kubeslot-test-sigstore`, what the e2e scenario
//! `keyless_verified_offline` runs) signs a layout that the product's
//! verifier accepts, and mutates one that it refuses.

use std::path::Path;
use std::process::Command;

use kubeslot_image::keyless::{GithubRule, IdentityRule, KeylessPolicy, Rules, TrustedRoot};
use kubeslot_image::layout::Layout;
use kubeslot_image::oci::Platform;
use kubeslot_image::reference::{Identity, ImageSource};
use kubeslot_image::registry::Registries;
use kubeslot_image::source::Source;
use kubeslot_image::verify::{self, Policy, Verdict};
use kubeslot_test_support::image::{gzip_layer, write_image};
use kubeslot_test_support::keyless::der::pem;
use kubeslot_test_support::keyless::sigstore::Mutation;
use kubeslot_test_support::keyless::{LeafSpec, TestSigstore, Workflow, GITHUB_ISSUER};
use kubeslot_test_support::require_tool;
use kubeslot_test_support::tar::tar_of;

const BIN: &str = env!("CARGO_BIN_EXE_kubeslot-test-sigstore");
const REPOSITORY: &str = "registry.example/kubeslot/node";

fn openssl(args: &[&str], dir: &Path) -> String {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn openssl_reads_its_certificates_as_fulcio_s() {
    require_tool("openssl", "openssl");
    let s = TestSigstore::new();
    let leaf = s.issue(&LeafSpec::github(Workflow::example()));
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("root.pem"), pem(&s.root_der)).unwrap();
    std::fs::write(d.join("intermediate.pem"), pem(&s.intermediate_der)).unwrap();
    std::fs::write(d.join("leaf.pem"), pem(&leaf.der)).unwrap();
    let at = (leaf.not_before + 10).to_string();
    let verified = openssl(
        &[
            "verify",
            "-x509_strict",
            "-attime",
            &at,
            "-CAfile",
            "root.pem",
            "-untrusted",
            "intermediate.pem",
            "leaf.pem",
        ],
        d,
    );
    assert_eq!(verified.trim(), "leaf.pem: OK");
    // outside the ten minutes: expired
    let late = (leaf.not_after + 1).to_string();
    let out = Command::new("openssl")
        .args([
            "verify",
            "-attime",
            &late,
            "-CAfile",
            "root.pem",
            "-untrusted",
            "intermediate.pem",
            "leaf.pem",
        ])
        .current_dir(d)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text = openssl(&["x509", "-in", "leaf.pem", "-noout", "-text"], d);
    for want in [
        "Signature Algorithm: ecdsa-with-SHA384",
        "X509v3 Key Usage: critical\n                Digital Signature",
        "X509v3 Extended Key Usage: \n                Code Signing",
        "X509v3 Subject Alternative Name: critical\n                URI:https://github.com/kubeslot-test/node/.github/workflows/publish.yml@refs/tags/v1.0.0",
        "1.3.6.1.4.1.57264.1.1: \n                https://token.actions.githubusercontent.com",
        "1.3.6.1.4.1.57264.1.8: ",
        "CT Precertificate SCTs: \n                Signed Certificate Timestamp:\n                    Version   : v1 (0x0)",
        "Signature : ecdsa-with-SHA256",
        "NIST CURVE: P-256",
    ] {
        assert!(text.contains(want), "{want:?} not in\n{text}");
    }
    let ca = openssl(&["x509", "-in", "intermediate.pem", "-noout", "-text"], d);
    assert!(
        ca.contains("CA:TRUE, pathlen:0") && ca.contains("NIST CURVE: P-384"),
        "{ca}"
    );
}

fn policy(root: &Path) -> Policy {
    let root = TrustedRoot::parse(&std::fs::read(root).unwrap()).unwrap();
    let w = Workflow::example();
    let keyless = KeylessPolicy {
        root,
        rules: Rules {
            issuer: GITHUB_ISSUER.into(),
            identity: IdentityRule::Exact(w.identity()),
            github: GithubRule {
                source_repository: Some(w.repository.clone()),
                source_ref: Some(w.git_ref.clone()),
                workflow: Some(w.identity()),
            },
            require_sct: true,
            accept_deprecated_issuer: false,
            allow_unnamed_subject: false,
        },
    };
    Policy::usable_with(Default::default(), Some(keyless), false)
        .unwrap()
        .with_identity(Some(Identity::repository(REPOSITORY).unwrap()))
}

fn check(dir: &Path, policy: &Policy) -> Result<Verdict, String> {
    let src: ImageSource = format!("oci:{}:v1", dir.display()).parse().unwrap();
    let work = tempfile::tempdir().unwrap();
    let source = Source::open(&src, &Registries::new(), work.path()).unwrap();
    let top = source.resolve().unwrap();
    let manifest = source
        .select_manifest(&top, &Platform::host())
        .map(|d| d.digest)
        .unwrap_or(top.digest);
    verify::check_digests(&source, top.digest, manifest, policy).map_err(|e| e.to_string())
}

#[test]
fn its_command_signs_a_layout_the_verifier_accepts() {
    let work = tempfile::tempdir().unwrap();
    let good = work.path().join("good");
    let bad = work.path().join("bad");
    for dir in [&good, &bad] {
        let layout = Layout::create(dir).unwrap();
        let layer = gzip_layer(&layout, &tar_of(&[("etc/hello", b"hello\n")]));
        write_image(&layout, "v1", &[layer]);
    }
    let root = work.path().join("trusted_root.json");
    let out = Command::new(BIN)
        .arg("--trusted-root")
        .arg(&root)
        .args([
            "--repository",
            REPOSITORY,
            "--tag",
            "v1",
            "--mutation",
            "flipped-set-byte",
        ])
        .arg("--layout")
        .arg(&good)
        .arg("--mutated-layout")
        .arg(&bad)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(said["identity"], Workflow::example().identity());
    assert_eq!(
        said["signed"].as_array().unwrap().len(),
        2,
        "index and manifest"
    );
    let p = policy(&root);
    match check(&good, &p) {
        Ok(Verdict::Keyless { san, issuer, .. }) => {
            assert_eq!(
                (san, issuer),
                (Workflow::example().identity(), GITHUB_ISSUER.to_string())
            );
        }
        other => panic!("{other:?}"),
    }
    let e = check(&bad, &p).unwrap_err();
    assert!(e.contains(Mutation::FlippedSet.says()[0]), "{e}");
    // another instance's root does not know this signature
    let other = work.path().join("other_root.json");
    TestSigstore::new().write_trusted_root(&other);
    let e = check(&good, &policy(&other)).unwrap_err();
    assert!(
        e.contains("not a transparency log of the trusted root"),
        "{e}"
    );
}
