//! What a signature binds: the repository it names. Images are written and
//! signed here (test-support's cosign-format signer), pushed with the real
//! `skopeo` into real `docker-registry`s, and read by the
//! `kubeslot-activator unpack` binary, which checks the signature the way
//! every activation does.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kubeslot_image::layout::Layout;
use kubeslot_image::oci::ANNOTATION_REF_NAME;
use kubeslot_test_support::image::{gzip_layer, key, sign, write_image, Built};
use kubeslot_test_support::tar::tar_of;
use kubeslot_test_support::tools::skopeo_push;
use kubeslot_test_support::{free_port, Registry};
use p256::ecdsa::SigningKey;
use p256::pkcs8::{EncodePublicKey as _, LineEnding};

const BIN: &str = env!("CARGO_BIN_EXE_kubeslot-activator");

struct Host {
    dir: tempfile::TempDir,
    root: PathBuf,
}

impl Host {
    fn new(k: &SigningKey) -> Host {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        fs::create_dir_all(root.join("etc/kubeslot/keys")).unwrap();
        let pem = k.verifying_key().to_public_key_pem(LineEnding::LF).unwrap();
        fs::write(root.join("etc/kubeslot/keys/k.pem"), pem).unwrap();
        Host { dir, root }
    }

    /// `unpack --json IMAGE` with `trust` (keys added) and `registries`.
    fn unpack(
        &self,
        image: &str,
        mut trust: serde_json::Value,
        registries: serde_json::Value,
    ) -> Output {
        trust["public_keys"] = serde_json::json!(["/etc/kubeslot/keys/k.pem"]);
        let config = self.dir.path().join("activator.json");
        let cfg = serde_json::json!({"registries": registries, "trust": trust});
        fs::write(&config, serde_json::to_vec(&cfg).unwrap()).unwrap();
        let target = self.root.join("unpacked");
        let _ = fs::remove_dir_all(&target);
        Command::new(BIN)
            .args(["unpack", "--json", "--config"])
            .arg(&config)
            .arg("--root")
            .arg(&self.root)
            .arg(image)
            .arg(&target)
            .output()
            .unwrap()
    }
}

fn signed_image(dir: &Path, k: &SigningKey, identity: &str) -> (Layout, Built) {
    let layout = Layout::create(dir).unwrap();
    let layer = gzip_layer(&layout, &tar_of(&[("etc/os-release", b"ID=test\n")]));
    let built = write_image(&layout, "v1", &[layer]);
    sign(&layout, built.index, k, identity);
    (layout, built)
}

fn push(layout: &Layout, dest: &str) {
    for d in &layout.index().unwrap().manifests {
        skopeo_push(layout.dir(), &d.annotations[ANNOTATION_REF_NAME], dest);
    }
}

fn ok(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "unpack failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn refused(out: &Output) -> String {
    assert!(!out.status.success(), "unpack was expected to refuse");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn default_identity_is_the_configured_registry_repository() {
    let reg = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let k = key(1);
    let repo = format!("{}/org/node", reg.host());
    let (layout, built) = signed_image(&work.path().join("l"), &k, &repo);
    push(&layout, &repo);
    let host = Host::new(&k);
    let out = ok(&host.unpack(
        &format!("{repo}:v1"),
        serde_json::json!({}),
        serde_json::json!({}),
    ));
    assert_eq!(out["verdict"]["kind"], "signed");
    assert_eq!(out["manifest_digest"], built.manifest.to_string());
}

#[test]
fn a_signature_for_another_repository_is_refused_naming_both() {
    let reg = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let k = key(2);
    // Signed by the trusted key, but for the debug variant's repository,
    // then written under our tag (as anyone who can push a tag can).
    let debug = format!("{}/org/node-debug", reg.host());
    let ours = format!("{}/org/node", reg.host());
    let (layout, _) = signed_image(&work.path().join("l"), &k, &debug);
    push(&layout, &ours);
    let host = Host::new(&k);
    let err = refused(&host.unpack(
        &format!("{ours}:v1"),
        serde_json::json!({}),
        serde_json::json!({}),
    ));
    assert!(
        err.contains(&format!("names identity {debug}")) && err.contains(&format!("not {ours}")),
        "{err}"
    );
    assert!(!host.root.join("unpacked/etc/os-release").exists());
    // An explicit trust.identity is what counts, not the location.
    let out = ok(&host.unpack(
        &format!("{ours}:v1"),
        serde_json::json!({"identity": debug}),
        serde_json::json!({}),
    ));
    assert_eq!(out["verdict"]["kind"], "signed");
}

#[test]
fn a_mirror_serves_the_image_without_changing_its_identity() {
    let mirror = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let k = key(3);
    // The origin (down here) is where the image was published and signed;
    // the site mirror holds a copy with the same signature.
    let origin = format!("127.0.0.1:{}", free_port());
    let identity = format!("{origin}/org/node");
    let (layout, built) = signed_image(&work.path().join("l"), &k, &identity);
    push(&layout, &format!("{}/org/node", mirror.host()));
    let host = Host::new(&k);
    let registries = serde_json::json!({ origin.clone(): {"mirrors": [mirror.host()]} });
    let out = ok(&host.unpack(&format!("{identity}:v1"), serde_json::json!({}), registries));
    assert_eq!(out["manifest_digest"], built.manifest.to_string());
    // Read from the mirror's own name, the same signature names another
    // repository than the one asked for: refused.
    let direct = format!("{}/org/node", mirror.host());
    let err = refused(&host.unpack(
        &format!("{direct}:v1"),
        serde_json::json!({}),
        serde_json::json!({}),
    ));
    assert!(err.contains(&identity) && err.contains(&direct), "{err}");
}

#[test]
fn a_layout_is_checked_against_the_configured_identity() {
    let work = tempfile::tempdir().unwrap();
    let k = key(4);
    let (layout, _) = signed_image(&work.path().join("l"), &k, "registry.example/org/node");
    let host = Host::new(&k);
    let image = format!("oci:{}:v1", layout.dir().display());
    ok(&host.unpack(
        &image,
        serde_json::json!({"identity": "registry.example/org/node"}),
        serde_json::json!({}),
    ));
    let err = refused(&host.unpack(
        &image,
        serde_json::json!({"identity": "registry.example/org/other"}),
        serde_json::json!({}),
    ));
    assert!(err.contains("registry.example/org/other"), "{err}");
    let err = refused(&host.unpack(
        &image,
        serde_json::json!({"identity": "registry.example/org/node:v1"}),
        serde_json::json!({}),
    ));
    assert!(
        err.contains("trust.identity") || err.contains("no tag"),
        "{err}"
    );
}
