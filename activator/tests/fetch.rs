//! Resolve, verify, fetch and unpack against real Debian `docker-registry`s:
//! images are written with the activator's `layout` module, signed with a
//! P-256 key made here, pushed with the real `skopeo`, and read back by the
//! `kubeslot-activator unpack` binary (or the library, where the test needs
//! to act between two steps). Registry authentication and TLS are in
//! `auth`.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read as _, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use kubeslot_activator::fetch::store::Store;
use kubeslot_activator::paths::Root;
use kubeslot_image::layout::Layout;
use kubeslot_image::oci::{Descriptor, Platform, ANNOTATION_REF_NAME, MEDIA_TYPE_MANIFEST};
use kubeslot_image::source::Source;
use kubeslot_image::Digest;
use kubeslot_test_support::image::{
    big_layer, gzip_layer, key, sign, tag_entry, write_image, Built,
};
use kubeslot_test_support::tar::tar_of;
use kubeslot_test_support::tools::skopeo_push_with;
use kubeslot_test_support::{free_port, require_tool, Registry};
use p256::ecdsa::signature::Signer as _;
use p256::ecdsa::{Signature, SigningKey};
use p256::pkcs8::{EncodePublicKey as _, LineEnding};

mod auth;
mod proxy;
mod streaming;

const BIN: &str = env!("CARGO_BIN_EXE_kubeslot-activator");

/// The identity the test images are signed for (what a host that reads
/// them from the test registries expects).
const IDENTITY: &str = "127.0.0.1/test/node";

/// A test host root with trusted keys and a config; returns the root and
/// the config path.
struct Host {
    _dir: tempfile::TempDir,
    root: PathBuf,
    config: PathBuf,
}

impl Host {
    fn new(keys: &[&SigningKey], allow_unsigned: bool, registries: serde_json::Value) -> Host {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        fs::create_dir_all(root.join("etc/kubeslot/keys")).unwrap();
        let mut paths = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            let pem = k.verifying_key().to_public_key_pem(LineEnding::LF).unwrap();
            let rel = format!("/etc/kubeslot/keys/k{i}.pem");
            fs::write(root.join(&rel[1..]), pem).unwrap();
            paths.push(rel);
        }
        let config = dir.path().join("activator.json");
        let cfg = serde_json::json!({
            "registries": registries,
            // The images here are signed for IDENTITY whichever registry
            // or layout serves them (identity.rs tests the defaults).
            "trust": {"public_keys": paths, "allow_unsigned": allow_unsigned, "identity": IDENTITY},
        });
        fs::write(&config, serde_json::to_vec_pretty(&cfg).unwrap()).unwrap();
        Host {
            _dir: dir,
            root,
            config,
        }
    }

    fn target(&self, name: &str) -> PathBuf {
        self.root.join("unpacked").join(name)
    }

    fn store(&self) -> PathBuf {
        self.root.join("var/lib/kubeslot/blobs/sha256")
    }

    /// Runs `unpack --json`; returns the output.
    fn unpack(&self, image: &str, target: &Path) -> Output {
        Command::new(BIN)
            .arg("unpack")
            .arg("--json")
            .arg("--config")
            .arg(&self.config)
            .arg("--root")
            .arg(&self.root)
            .arg(image)
            .arg(target)
            .output()
            .unwrap()
    }

    fn unpack_ok(&self, image: &str, target: &Path) -> serde_json::Value {
        let out = self.unpack(image, target);
        assert!(
            out.status.success(),
            "unpack {image} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    fn unpack_err(&self, image: &str, target: &Path) -> String {
        let out = self.unpack(image, target);
        assert!(
            !out.status.success(),
            "unpack {image} succeeded: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(
            !target.exists(),
            "a refused image left {}",
            target.display()
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// Names in the content store that are not verified blobs (partials,
    /// temp files), and the verified ones.
    fn store_names(&self) -> (Vec<String>, Vec<String>) {
        let mut partial = Vec::new();
        let mut good = Vec::new();
        if let Ok(rd) = fs::read_dir(self.store()) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.starts_with('.') {
                    partial.push(n);
                } else {
                    good.push(n);
                }
            }
        }
        (partial, good)
    }

    /// Every verified blob's content hashes to its name.
    fn assert_store_sound(&self) {
        for name in self.store_names().1 {
            let bytes = fs::read(self.store().join(&name)).unwrap();
            assert_eq!(
                Digest::of(&bytes).hex(),
                name,
                "store blob {name} is not what its name says"
            );
        }
    }
}

fn no_registries() -> serde_json::Value {
    serde_json::json!({})
}

/// A small two-layer signed image in a fresh layout.
fn small_image(dir: &Path, tag: &str, app: &[u8], signer: Option<&SigningKey>) -> (Layout, Built) {
    let layout = Layout::create(dir).unwrap();
    let base = gzip_layer(
        &layout,
        &tar_of(&[
            ("etc/os-release", b"ID=test\n"),
            ("usr/bin/tool", b"#!/bin/sh\n"),
        ]),
    );
    let app = gzip_layer(&layout, &tar_of(&[("opt/app/version", app)]));
    let built = write_image(&layout, tag, &[base, app]);
    if let Some(k) = signer {
        sign(&layout, built.index, k, IDENTITY);
    }
    (layout, built)
}

fn push_all(layout: &Layout, reg: &Registry, repo: &str) {
    push_all_with(
        layout,
        &format!("{}/{repo}", reg.host()),
        &["--dest-tls-verify=false"],
    );
}

/// Every tag of `layout` to the repository `dest` (`host/repo`), with
/// skopeo's destination options `opts` (credentials, TLS).
fn push_all_with(layout: &Layout, dest: &str, opts: &[&str]) {
    for d in &layout.index().unwrap().manifests {
        let tag = &d.annotations[ANNOTATION_REF_NAME];
        skopeo_push_with(layout.dir(), tag, dest, opts);
    }
}

#[test]
fn signed_image_from_a_registry_is_unpacked_and_reused() {
    let reg = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let k = key(1);
    let (layout, v1) = small_image(&work.path().join("v1"), "v1", b"1\n", Some(&k));
    push_all(&layout, &reg, "test/node");

    let host = Host::new(&[&k], false, no_registries());
    let image = format!("{}/test/node:v1", reg.host());
    let t1 = host.target("a");
    let out = host.unpack_ok(&image, &t1);
    assert_eq!(out["image_digest"], v1.index.to_string());
    assert_eq!(out["manifest_digest"], v1.manifest.to_string());
    assert_eq!(out["verdict"]["kind"], "signed");
    assert_eq!(out["fetch"]["downloaded_layers"], 2);
    assert_eq!(fs::read(t1.join("opt/app/version")).unwrap(), b"1\n");
    assert_eq!(fs::read(t1.join("etc/os-release")).unwrap(), b"ID=test\n");
    host.assert_store_sound();

    // v2 changes only the app layer: exactly one layer is downloaded.
    let (layout2, v2) = small_image(&work.path().join("v1"), "v2", b"2\n", Some(&k));
    push_all(&layout2, &reg, "test/node");
    let t2 = host.target("b");
    let out = host.unpack_ok(&format!("{}/test/node:v2", reg.host()), &t2);
    assert_eq!(out["image_digest"], v2.index.to_string());
    assert_eq!(out["fetch"]["downloaded_layers"], 1, "{out}");
    assert_eq!(out["fetch"]["reused_layers"], 1, "{out}");
    assert_eq!(fs::read(t2.join("opt/app/version")).unwrap(), b"2\n");
    let (partial, _) = host.store_names();
    assert!(partial.is_empty(), "{partial:?}");
}

#[test]
fn tampered_blob_in_the_registry_is_refused_and_not_stored() {
    let reg = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let k = key(1);
    let layout = Layout::create(work.path().join("l")).unwrap();
    let base = gzip_layer(&layout, &tar_of(&[("etc/os-release", b"ID=test\n")]));
    let payload = vec![b'x'; 4096];
    let evil = gzip_layer(&layout, &tar_of(&[("opt/data", &payload)]));
    let built = write_image(&layout, "v1", &[base, evil.clone()]);
    sign(&layout, built.index, &k, IDENTITY);
    push_all(&layout, &reg, "test/node");

    // Flip one byte of the layer in the registry's own storage.
    let hex = evil.desc.digest.hex();
    let data = reg
        .storage()
        .join("docker/registry/v2/blobs/sha256")
        .join(&hex[..2])
        .join(&hex)
        .join("data");
    let mut bytes = fs::read(&data).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    fs::write(&data, &bytes).unwrap();

    let host = Host::new(&[&k], false, no_registries());
    let err = host.unpack_err(&format!("{}/test/node:v1", reg.host()), &host.target("t"));
    assert!(err.contains(&hex) && err.contains("hashes to"), "{err}");
    let (partial, good) = host.store_names();
    assert!(partial.is_empty(), "partial left: {partial:?}");
    assert!(!good.contains(&hex), "tampered blob stored as good");
    host.assert_store_sound();
    // No staging directory is left behind either.
    let leftovers: Vec<_> = fs::read_dir(host.root.join("unpacked"))
        .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn wrong_key_unsigned_and_allow_unsigned() {
    let reg = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let (signed, _) = small_image(&work.path().join("s"), "signed", b"s\n", Some(&key(1)));
    push_all(&signed, &reg, "test/node");
    let (unsigned, _) = small_image(&work.path().join("u"), "unsigned", b"u\n", None);
    push_all(&unsigned, &reg, "test/node");
    let signed_ref = format!("{}/test/node:signed", reg.host());
    let unsigned_ref = format!("{}/test/node:unsigned", reg.host());

    // Signed by key 1, host trusts key 2 only.
    let other = Host::new(&[&key(2)], false, no_registries());
    let err = other.unpack_err(&signed_ref, &other.target("t"));
    assert!(err.contains("none verifies"), "{err}");
    assert!(
        other.store_names().1.is_empty(),
        "layers fetched before verification"
    );

    // Unsigned image, host trusts a key: refused, no layer fetched.
    let err = other.unpack_err(&unsigned_ref, &other.target("t"));
    assert!(err.contains("no signature"), "{err}");
    assert!(
        other.store_names().1.is_empty(),
        "layers fetched before verification"
    );

    // No config at all: the default policy refuses everything.
    let t = work.path().join("noconfig");
    let out = Command::new(BIN)
        .args(["unpack", &unsigned_ref])
        .arg(&t)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("allow_unsigned is false"), "{err}");
    assert!(!t.exists());

    // allow_unsigned accepts it, and says so.
    let lax = Host::new(&[], true, no_registries());
    let t = lax.target("t");
    let out = lax.unpack_ok(&unsigned_ref, &t);
    assert_eq!(out["verdict"]["kind"], "allowed_unsigned");
    assert_eq!(fs::read(t.join("opt/app/version")).unwrap(), b"u\n");
    // A wrongly signed image too (the policy says "no signature needed").
    let out = lax.unpack_ok(&signed_ref, &lax.target("t2"));
    assert_eq!(out["verdict"]["kind"], "allowed_unsigned");
}

#[test]
fn mirror_down_falls_back_and_every_endpoint_is_named() {
    let reg = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let k = key(1);
    let (layout, v1) = small_image(&work.path().join("l"), "v1", b"m\n", Some(&k));
    push_all(&layout, &reg, "test/node");
    let closed = format!("127.0.0.1:{}", free_port());
    let host = Host::new(
        &[&k],
        false,
        serde_json::json!({ reg.host(): {"mirrors": [closed.clone()]} }),
    );
    let out = host.unpack_ok(&format!("{}/test/node:v1", reg.host()), &host.target("t"));
    assert_eq!(out["image_digest"], v1.index.to_string());

    // The registry as a mirror of a registry that is down: served by the mirror.
    let down = format!("127.0.0.1:{}", free_port());
    let host = Host::new(
        &[&k],
        false,
        serde_json::json!({ down.clone(): {"mirrors": [closed.clone(), reg.host()]} }),
    );
    let out = host.unpack_ok(&format!("{down}/test/node:v1"), &host.target("t"));
    assert_eq!(out["manifest_digest"], v1.manifest.to_string());

    // Nothing up: the error lists each endpoint and why.
    let host = Host::new(
        &[&k],
        false,
        serde_json::json!({ down.clone(): {"mirrors": [closed.clone()]} }),
    );
    let err = host.unpack_err(&format!("{down}/test/node:v1"), &host.target("t"));
    assert!(
        err.contains(&format!("mirror http://{closed}"))
            && err.contains(&format!("registry http://{down}")),
        "{err}"
    );
}

#[test]
fn registry_killed_mid_blob_then_the_next_run_continues() {
    let mut reg = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let k = key(1);
    let layout = Layout::create(work.path().join("l")).unwrap();
    let size = 192 * 1024 * 1024;
    let big = big_layer(&layout, "opt/big.bin", size);
    let built = write_image(&layout, "v1", std::slice::from_ref(&big));
    sign(&layout, built.index, &k, IDENTITY);
    push_all(&layout, &reg, "test/node");
    drop(layout);
    fs::remove_dir_all(work.path().join("l")).unwrap();

    let host = Host::new(&[&k], false, no_registries());
    let target = host.target("t");
    let image = format!("{}/test/node@{}", reg.host(), built.index);
    let mut child = Command::new(BIN)
        .arg("unpack")
        .arg("--json")
        .arg("--config")
        .arg(&host.config)
        .arg("--root")
        .arg(&host.root)
        .arg(&image)
        .arg(&target)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let partial = host
        .store()
        .join(format!(".partial-{}", big.desc.digest.hex()));
    // Wait (without a time assertion: the deadline only stops a hung test)
    // until the download is under way, then kill the registry under it.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if fs::metadata(&partial).is_ok_and(|m| m.len() > 0) {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "unpack ended before the registry was killed"
        );
        assert!(Instant::now() < deadline, "download never started");
        std::thread::sleep(Duration::from_millis(1));
    }
    reg.kill();
    let out = child.wait_with_output().unwrap();
    assert!(
        !out.status.success(),
        "the download survived a killed registry?"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&big.desc.digest.to_string()), "{err}");
    let kept = fs::metadata(&partial).unwrap().len();
    assert!(kept > 0 && kept < big.desc.size);
    assert!(
        !host.store().join(big.desc.digest.hex()).exists(),
        "partial counted as good"
    );
    assert!(!target.exists());

    // Same storage, new port: the next run continues the partial blob.
    let reg = reg.restart();
    let image = format!("{}/test/node@{}", reg.host(), built.index);
    let out = host.unpack_ok(&image, &target);
    let resumed = out["fetch"]["resumed_bytes"].as_u64().unwrap();
    assert!(resumed > 0 && resumed <= kept, "{out}");
    // The config came in the first run; this run fetched only the rest.
    assert_eq!(
        out["fetch"]["downloaded_bytes"].as_u64().unwrap(),
        big.desc.size - resumed,
        "{out}"
    );
    assert_eq!(
        fs::metadata(target.join("opt/big.bin")).unwrap().len(),
        size
    );
    host.assert_store_sound();
    assert!(!partial.exists());
}

#[test]
fn tag_is_resolved_once() {
    let reg = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let k = key(1);
    let (layout, first) = small_image(&work.path().join("a"), "moving", b"first\n", Some(&k));
    push_all(&layout, &reg, "test/node");

    let root = Root::new(work.path().join("root"));
    let image = format!("{}/test/node:moving", reg.host()).parse().unwrap();
    let source = Source::open(&image, &BTreeMap::new(), work.path()).unwrap();
    let top = source.resolve().unwrap();
    assert_eq!(top.digest, first.index);

    // The tag moves between resolve and fetch.
    let (layout2, second) = small_image(&work.path().join("b"), "moving", b"second\n", Some(&k));
    push_all(&layout2, &reg, "test/node");
    let again = Source::open(&image, &BTreeMap::new(), work.path()).unwrap();
    assert_eq!(
        again.resolve().unwrap().digest,
        second.index,
        "the tag did move"
    );

    let trusted = kubeslot_image::signature::TrustedKeys::from_keys(vec![*k.verifying_key()]);
    let policy = kubeslot_image::verify::Policy::new(trusted, false);
    let image = source.select(&top, &Platform::host()).unwrap();
    assert_eq!(image.manifest_digest(), first.manifest);
    let verdict = kubeslot_image::verify::check(&source, &image, &policy).unwrap();
    let store = Store::open(&root.store()).unwrap();
    store.fetch_image(&source, &image).unwrap();
    let target = work.path().join("tree");
    fs::create_dir(&target).unwrap();
    kubeslot_activator::slots::stage::unpack_layers(
        &store,
        &image,
        &target,
        Default::default(),
        false,
    )
    .unwrap();
    assert_eq!(
        fs::read(target.join("opt/app/version")).unwrap(),
        b"first\n"
    );

    // The host side's slot staging takes the image resolved before the
    // move and never asks for the tag again.
    let verified = kubeslot_activator::slots::stage::Verified { image, verdict };
    let staged = kubeslot_activator::slots::stage::stage_resolved(
        &root,
        source,
        &verified,
        &Default::default(),
        "kube1",
    )
    .unwrap();
    assert_eq!(staged.image_digest, first.index);
    assert_eq!(
        fs::read(root.machine_tree("kube1").join("opt/app/version")).unwrap(),
        b"first\n"
    );
}

#[test]
fn layout_and_archive_sources() {
    require_tool("tar", "tar");
    let work = tempfile::tempdir().unwrap();
    let k = key(3);
    let layout = Layout::create(work.path().join("layout")).unwrap();
    let base = gzip_layer(&layout, &tar_of(&[("etc/os-release", b"ID=layout\n")]));
    let built = write_image(&layout, "v1", &[base]);
    // Sign only the platform manifest digest: accepted as well.
    sign(&layout, built.manifest, &k, IDENTITY);
    let host = Host::new(&[&k], false, no_registries());

    let out = host.unpack_ok(
        &format!("oci:{}:v1", layout.dir().display()),
        &host.target("l"),
    );
    assert_eq!(out["verdict"]["digest"], built.manifest.to_string());
    assert_eq!(
        fs::read(host.target("l").join("etc/os-release")).unwrap(),
        b"ID=layout\n"
    );
    // Without a tag the one image entry is taken (the .sig entry is not an image).
    host.unpack_ok(
        &format!("oci:{}", layout.dir().display()),
        &host.target("l2"),
    );

    // The same layout as an oci-archive made by the real tar.
    let archive = work.path().join("node.tar");
    let st = Command::new("tar")
        .arg("-C")
        .arg(layout.dir())
        .arg("-cf")
        .arg(&archive)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success());
    let out = host.unpack_ok(
        &format!("oci-archive:{}:v1", archive.display()),
        &host.target("a"),
    );
    assert_eq!(out["image_digest"], built.index.to_string());
    assert_eq!(
        out["fetch"]["reused_layers"], 1,
        "same blobs as the layout run: {out}"
    );
    assert_eq!(
        fs::read(host.target("a").join("etc/os-release")).unwrap(),
        b"ID=layout\n"
    );

    // An archive with something that is not part of a layout is refused.
    fs::write(layout.dir().join("evil.sh"), b"#!/bin/sh\n").unwrap();
    let bad = work.path().join("bad.tar");
    let st = Command::new("tar")
        .arg("-C")
        .arg(layout.dir())
        .arg("-cf")
        .arg(&bad)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success());
    let err = host.unpack_err(
        &format!("oci-archive:{}:v1", bad.display()),
        &host.target("b"),
    );
    assert!(
        err.contains("evil.sh") && err.contains("not part of an OCI layout"),
        "{err}"
    );
}

/// A full activator config for `stage`, reading `image` and trusting `key_path`.
fn stage_config(image: &str, key_path: &str) -> kubeslot_activator::config::Config {
    let json = serde_json::json!({
        "image": image,
        "trust": {"public_keys": [key_path], "identity": IDENTITY},
        "kubelet": {
            "api_server": "https://10.0.0.1:6443",
            "ca_data": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
            "bootstrap_token": "abcdef.0123456789abcdef"
        }
    });
    kubeslot_activator::config::Config::parse(
        Path::new("activator.json"),
        &serde_json::to_vec(&json).unwrap(),
    )
    .unwrap()
}

#[test]
fn stage_replaces_the_slot_tree_only_after_success() {
    use kubeslot_activator::slots::stage::stage;
    let work = tempfile::tempdir().unwrap();
    let k = key(4);
    let host = Host::new(&[&k], false, no_registries());
    let root = Root::new(&host.root);
    let key_path = "/etc/kubeslot/keys/k0.pem";

    let (v1_layout, v1) = small_image(&work.path().join("v1"), "v1", b"one\n", Some(&k));
    // A stale staging tree from a killed run is cleaned up.
    let stale = root.machines_dir().join(".staging-kube2-stale");
    fs::create_dir_all(stale.join("etc")).unwrap();
    let cfg = stage_config(&format!("oci:{}:v1", v1_layout.dir().display()), key_path);
    let s = stage(&root, &cfg, "kube2").unwrap();
    assert_eq!(s.image_digest, v1.index);
    assert_eq!(s.tree, root.machine_tree("kube2"));
    assert_eq!(
        fs::read(root.machine_tree("kube2").join("opt/app/version")).unwrap(),
        b"one\n"
    );
    assert!(!stale.exists());

    // An unsigned image is refused and the slot keeps the old tree.
    let (bad_layout, _) = small_image(&work.path().join("bad"), "bad", b"bad\n", None);
    let cfg = stage_config(&format!("oci:{}:bad", bad_layout.dir().display()), key_path);
    let e = stage(&root, &cfg, "kube2").unwrap_err().to_string();
    assert!(e.contains("no signature"), "{e}");
    assert_eq!(
        fs::read(root.machine_tree("kube2").join("opt/app/version")).unwrap(),
        b"one\n"
    );

    // v2 replaces it; one layer downloaded, nothing left beside the slot.
    let (v2_layout, v2) = small_image(&work.path().join("v1"), "v2", b"two\n", Some(&k));
    let cfg = stage_config(&format!("oci:{}:v2", v2_layout.dir().display()), key_path);
    let s = stage(&root, &cfg, "kube2").unwrap();
    assert_eq!(s.manifest_digest, v2.manifest);
    assert_eq!((s.report.downloaded_layers, s.report.reused_layers), (1, 1));
    assert_eq!(
        fs::read(root.machine_tree("kube2").join("opt/app/version")).unwrap(),
        b"two\n"
    );
    let names: Vec<String> = fs::read_dir(root.machines_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["kube2"]);
    assert!(stage(&root, &cfg, "../etc").is_err());
}

#[test]
fn hostile_manifests_are_refused_before_any_layer() {
    let work = tempfile::tempdir().unwrap();
    let layout = Layout::create(work.path().join("l")).unwrap();
    let good = gzip_layer(&layout, &tar_of(&[("etc/os-release", b"ID=x\n")]));

    let mut unknown = good.clone();
    unknown.desc.media_type = "application/vnd.example.exe".into();
    write_image(&layout, "unknown-type", &[unknown]);

    let mut foreign = good.clone();
    foreign.desc.urls = vec!["https://example.invalid/layer".into()];
    write_image(&layout, "foreign-urls", &[foreign]);

    let mut short = good.clone();
    short.desc.size -= 1;
    write_image(&layout, "wrong-size", &[short]);

    // A size no blob can have: refused, never an arithmetic overflow.
    let mut huge = good.clone();
    huge.desc.size = u64::MAX;
    write_image(&layout, "size-u64-max", &[huge]);

    let mut wrong_diff = good.clone();
    wrong_diff.diff_id = Digest::of(b"not this layer");
    write_image(&layout, "wrong-diff-id", &[wrong_diff]);

    // A manifest that claims far more than the document cap.
    let big = vec![b' '; 5 * 1024 * 1024];
    let bd = layout.blobs().put_bytes(&big).unwrap();
    let mut entry = Descriptor::new(MEDIA_TYPE_MANIFEST, bd, big.len() as u64);
    entry.platform = Some(Platform::host());
    tag_entry(&layout, "huge-manifest", entry);

    let cases = [
        ("unknown-type", "unknown layer media type"),
        ("foreign-urls", "foreign urls are refused"),
        ("wrong-size", "bytes"),
        ("size-u64-max", "bytes"),
        ("wrong-diff-id", "diff"),
        ("huge-manifest", "limit"),
    ];
    for (tag, why) in cases {
        // allow_unsigned: the structural checks hold even when signatures
        // do not; a fresh host each time so its store shows what this case fetched.
        let host = Host::new(&[], true, no_registries());
        let err = host.unpack_err(
            &format!("oci:{}:{tag}", layout.dir().display()),
            &host.target(tag),
        );
        assert!(err.contains(why), "{tag}: {err}");
        if !["wrong-size", "size-u64-max", "wrong-diff-id"].contains(&tag) {
            assert!(
                host.store_names().1.is_empty(),
                "{tag}: fetched before refusing"
            );
        }
        assert!(host.store_names().0.is_empty(), "{tag}: partial left");
        host.assert_store_sound();
    }
}

#[test]
fn unpack_without_root_uses_a_temporary_store() {
    let work = tempfile::tempdir().unwrap();
    let k = key(6);
    let (layout, built) = small_image(&work.path().join("l"), "v1", b"tmp\n", Some(&k));
    let pem = work.path().join("trusted.pem");
    fs::write(
        &pem,
        k.verifying_key().to_public_key_pem(LineEnding::LF).unwrap(),
    )
    .unwrap();
    let config = work.path().join("cfg.json");
    fs::write(
        &config,
        serde_json::to_vec(
            &serde_json::json!({"trust": {"public_keys": [pem], "identity": IDENTITY}}),
        )
        .unwrap(),
    )
    .unwrap();
    let out_dir = work.path().join("out");
    let target = out_dir.join("tree");
    let out = Command::new(BIN)
        .arg("unpack")
        .arg("--config")
        .arg(&config)
        .arg(format!("oci:{}:v1", layout.dir().display()))
        .arg(&target)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&built.index.to_string()) && text.contains("signature valid"),
        "{text}"
    );
    assert_eq!(fs::read(target.join("opt/app/version")).unwrap(), b"tmp\n");
    let names: Vec<_> = fs::read_dir(&out_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(names, ["tree"], "temporary store or staging left behind");

    // A non-empty target is refused before anything is fetched.
    let out = Command::new(BIN)
        .arg("unpack")
        .arg("--config")
        .arg(&config)
        .arg(format!("oci:{}:v1", layout.dir().display()))
        .arg(&target)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("must be missing or an empty directory"));
}

/// A policy that can accept nothing is refused up front, naming where it
/// came from (the config file, or the default when there is none) and the
/// rule; nothing is unpacked.
#[test]
fn unpack_with_a_policy_that_accepts_nothing_names_the_config() {
    let work = tempfile::tempdir().unwrap();
    let k = key(7);
    let (layout, _) = small_image(&work.path().join("l"), "v1", b"x\n", Some(&k));
    let config = work.path().join("cfg.json");
    fs::write(&config, br#"{"trust": {"public_keys": []}}"#).unwrap();
    let image = format!("oci:{}:v1", layout.dir().display());
    let target = work.path().join("tree");
    for with_config in [true, false] {
        let mut cmd = Command::new(BIN);
        cmd.arg("unpack");
        if with_config {
            cmd.arg("--config").arg(&config);
        }
        let out = cmd.arg(&image).arg(&target).output().unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        if with_config {
            assert!(
                err.contains(&format!("config {}", config.display()))
                    && err.contains("trust.public_keys is empty"),
                "{err}"
            );
        } else {
            assert!(
                err.contains("no --config") && err.contains("trust.public_keys"),
                "{err}"
            );
        }
        assert!(!target.exists(), "{err}");
    }
}

/// Runs `cmd` under python's `os.wait4`; returns (exit code or -signal,
/// stderr, the child's peak RSS in KiB).
fn run_measured(cmd: &mut Command) -> (i32, String, u64) {
    let python = require_tool("python3", "python3");
    let script = "import os,subprocess,sys\n\
                  p=subprocess.Popen(sys.argv[1:],stdout=subprocess.DEVNULL,stderr=subprocess.PIPE)\n\
                  err=p.stderr.read()\n\
                  _,st,ru=os.wait4(p.pid,0)\n\
                  sys.stderr.buffer.write(err)\n\
                  print(os.waitstatus_to_exitcode(st), ru.ru_maxrss)\n";
    let mut argv = vec![cmd.get_program().to_owned()];
    argv.extend(cmd.get_args().map(|a| a.to_owned()));
    let out = Command::new(python)
        .arg("-c")
        .arg(script)
        .args(argv)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut it = text.split_whitespace();
    let code = it.next().unwrap().parse().unwrap();
    let rss = it.next().unwrap().parse().unwrap();
    (code, String::from_utf8_lossy(&out.stderr).into_owned(), rss)
}

/// An `oci-archive` whose first member is a GNU long-name header declaring
/// 3 GiB (a sparse file: nothing real is read): refused naming the entry
/// and the cap, in bounded memory, nothing extracted.
#[test]
fn a_3_gib_long_name_header_in_an_archive_is_refused_in_bounded_memory() {
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("hostile.tar");
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::GNULongName);
    h.set_size(3 << 30);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.as_gnu_mut().unwrap().name[..13].copy_from_slice(b"././@LongLink");
    h.set_cksum();
    let f = fs::File::create(&file).unwrap();
    (&f).write_all(h.as_bytes()).unwrap();
    f.set_len(512 + (3 << 30) + 1024).unwrap();
    drop(f);
    let host = Host::new(&[], true, no_registries());
    let target = host.target("t");
    let (code, err, rss_kib) = run_measured(
        Command::new(BIN)
            .args(["unpack", "--config"])
            .arg(&host.config)
            .arg("--root")
            .arg(&host.root)
            .arg(format!("oci-archive:{}", file.display()))
            .arg(&target),
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("entry 0") && err.contains("more than the 4096 allowed"),
        "{err}"
    );
    assert!(rss_kib < 64 * 1024, "peak RSS {rss_kib} KiB");
    eprintln!("peak RSS refusing a 3 GiB long-name header: {rss_kib} KiB");
    assert!(!target.exists() || fs::read_dir(&target).unwrap().next().is_none());
    let leftovers: Vec<_> = fs::read_dir(&host.root)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(
        !leftovers
            .iter()
            .any(|n| n.to_string_lossy().contains("archive")),
        "{leftovers:?}"
    );
}

/// A CA and a server certificate for 127.0.0.1 made with the openssl CLI;
/// returns (ca.crt, server.crt, server.key).
pub(crate) fn test_ca(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let openssl = require_tool("openssl", "openssl");
    let run = |args: &[&str]| {
        let out = Command::new(&openssl)
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-new",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=kubeslot test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
    ]);
    run(&[
        "req",
        "-new",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]);
    fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
        "-out",
        "server.crt",
    ]);
    (
        dir.join("ca.crt"),
        dir.join("server.crt"),
        dir.join("server.key"),
    )
}

/// An `oci-archive` is read in place: opening it writes only `oci-layout`
/// and `index.json`; resolving and checking the signature copies out only
/// documents; a layer is streamed from the archive (never written to the
/// scratch directory), and a tampered layer in the archive is refused by
/// the store's digest check.
#[test]
fn an_archive_is_read_in_place_and_no_layer_is_written_before_the_signature_check() {
    use kubeslot_image::registry::Registries;
    use kubeslot_image::signature::TrustedKeys;
    use kubeslot_image::verify::{self, Policy, Verdict};
    let work = tempfile::tempdir().unwrap();
    let k = key(11);
    let (layout, built) = small_image(&work.path().join("l"), "v1", b"in place\n", Some(&k));
    let file = work.path().join("node.tar");
    let st = Command::new("tar")
        .arg("-C")
        .arg(layout.dir())
        .arg("-cf")
        .arg(&file)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success());
    let scratch = work.path().join("scratch");
    let source = Source::open(
        &format!("oci-archive:{}:v1", file.display())
            .parse()
            .unwrap(),
        &Registries::default(),
        &scratch,
    )
    .unwrap();
    let written = || -> Vec<String> {
        let mut v: Vec<String> = walk_files(&scratch);
        v.sort();
        v
    };
    assert!(
        written()
            .iter()
            .all(|p| p.ends_with("oci-layout") || p.ends_with("index.json")),
        "{:?}",
        written()
    );
    let top = source.resolve().unwrap();
    let image = source.select(&top, &Platform::host()).unwrap();
    let keys = TrustedKeys::from_keys(vec![*k.verifying_key()]);
    let policy = Policy::new(keys, false).with_identity(Some(
        kubeslot_image::reference::Identity::repository(IDENTITY).unwrap(),
    ));
    assert!(matches!(
        verify::check(&source, &image, &policy).unwrap(),
        Verdict::Signed { .. }
    ));
    let layers: Vec<String> = image
        .layers
        .iter()
        .map(|(d, _, _)| d.digest.hex())
        .collect();
    assert!(
        !written()
            .iter()
            .any(|p| layers.iter().any(|l| p.ends_with(l))),
        "a layer was written before or by the signature check: {:?}",
        written()
    );
    // The store takes the layers straight from the archive.
    let store = Store::open(&work.path().join("store")).unwrap();
    store.fetch_image(&source, &image).unwrap();
    assert!(!written()
        .iter()
        .any(|p| layers.iter().any(|l| p.ends_with(l))));
    assert_eq!(image.manifest_digest(), built.manifest);
}

fn walk_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(rd) = fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk_files(&p));
        } else {
            out.push(p.display().to_string());
        }
    }
    out
}

/// An `oci:` layout is input: a blob that is a symlink (to the real bytes,
/// elsewhere on the host) is refused, never followed, and a blob that is a
/// FIFO is refused at once, not read (the run would block forever).
#[test]
fn layout_blobs_that_are_symlinks_or_fifos_are_refused() {
    let work = tempfile::tempdir().unwrap();
    for kind in ["symlink", "fifo"] {
        let (layout, built) = small_image(&work.path().join(kind), "v1", b"links\n", None);
        let m: kubeslot_image::oci::Manifest = layout.read_json(&built.manifest, None).unwrap();
        let blob = layout.blobs().path(&m.layers[0].digest);
        let elsewhere = work.path().join(format!("{kind}-real-blob"));
        fs::rename(&blob, &elsewhere).unwrap();
        match kind {
            "symlink" => std::os::unix::fs::symlink(&elsewhere, &blob).unwrap(),
            _ => {
                let st = Command::new("mkfifo").arg(&blob).status().unwrap();
                assert!(st.success());
            }
        }
        let host = Host::new(&[], true, no_registries());
        let mut child = Command::new(BIN)
            .args(["unpack", "--config"])
            .arg(&host.config)
            .arg("--root")
            .arg(&host.root)
            .arg(format!("oci:{}:v1", layout.dir().display()))
            .arg(host.target(kind))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let start = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if start.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                panic!("{kind}: unpack hung on the blob");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(!status.success(), "{kind}: accepted");
        let why = if kind == "symlink" {
            "symlink"
        } else {
            "not a regular file"
        };
        assert!(err.contains(why), "{kind}: {err}");
        assert!(!host.target(kind).join("opt/app/version").exists());
    }
}
