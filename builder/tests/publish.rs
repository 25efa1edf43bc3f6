//! Publishing, black box: the `kubeslot-builder` binary against a real
//! Debian `docker-registry`, checked by independent tools: `skopeo` (pull
//! back, carry signatures with `use-sigstore-attachments`), the sigstore
//! project's own Rust library (cosign module, local public key, no network)
//! and `pyspdxtools` (SPDX validation).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use kubeslot_image::layout::Layout;
use kubeslot_image::oci::{Descriptor, Index, Manifest, Platform, ANNOTATION_REF_NAME};
use kubeslot_image::Digest;
use kubeslot_test_support::image;
use kubeslot_test_support::tar::{noise, tar_of};
use kubeslot_test_support::tools::skopeo;
use kubeslot_test_support::{require_tool, Registry};

fn builder() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kubeslot-builder"))
}

fn check(what: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "{what} failed: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs the builder with `args`, expecting success; returns stdout.
fn run(args: &[&str]) -> String {
    check(
        &format!("kubeslot-builder {}", args.join(" ")),
        builder().args(args).output().unwrap(),
    )
}

/// Runs the builder with `--json`, returning the parsed report.
fn run_json(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    serde_json::from_str(run(&all).trim()).unwrap()
}

/// A tar holding one file of `len` noise bytes.
fn layer(seed: u64, len: usize) -> Vec<u8> {
    tar_of(&[(&format!("data/{seed}"), &noise(seed, len))])
}

/// Writes a two-platform image (index → amd64, arm64 manifests) tagged `tag`
/// into the layout `dir`; each platform gets `layers` layers of the given
/// sizes. Returns the index digest and the platform manifest digests.
fn write_image(dir: &Path, tag: &str, seed: u64, layers: &[usize]) -> (Digest, Vec<Digest>) {
    let layout = image::open_or_create(dir);
    let mut entries = Vec::new();
    for (p, arch) in ["amd64", "arm64"].iter().enumerate() {
        let blobs: Vec<_> = layers
            .iter()
            .enumerate()
            .map(|(i, size)| {
                image::gzip_layer(
                    &layout,
                    &layer(seed * 100 + p as u64 * 10 + i as u64, *size),
                )
            })
            .collect();
        entries.push(image::write_manifest(
            &layout,
            &Platform::linux(arch),
            &blobs,
        ));
    }
    let platforms = entries.iter().map(|e| e.digest).collect();
    (image::write_index(&layout, tag, entries), platforms)
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The sigstore project's cosign verification over a registry image
/// (`host/repo@sha256:…`) with a local public key; `Err` says why not.
fn sigstore_verify(image: &str, public_key: &Path) -> Result<(), String> {
    use sigstore::cosign::verification_constraint::{PublicKeyVerifier, VerificationConstraintVec};
    use sigstore::cosign::{ClientBuilder, CosignCapabilities as _};
    let pem = std::fs::read(public_key).unwrap();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let config = sigstore::registry::ClientConfig {
                protocol: sigstore::registry::ClientProtocol::Http,
                ..Default::default()
            };
            let mut client = ClientBuilder::default()
                .with_oci_client_config(config)
                .build()
                .map_err(|e| format!("client: {e}"))?;
            let reference: sigstore::registry::OciReference =
                image.parse().map_err(|e| format!("reference: {e:?}"))?;
            let layers = client
                .trusted_signature_layers(&sigstore::registry::Auth::Anonymous, &reference)
                .await
                .map_err(|e| format!("signature layers: {e}"))?;
            let verifier = PublicKeyVerifier::try_from(&pem).map_err(|e| format!("key: {e}"))?;
            let constraints: VerificationConstraintVec = vec![Box::new(verifier)];
            sigstore::cosign::verify_constraints(&layers, constraints.iter())
                .map_err(|e| format!("{} layer(s), unsatisfied: {e:?}", layers.len()))
        })
}

fn keygen(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let prefix = dir.join(name);
    run(&["keygen", "--out", p(&prefix)]);
    (
        dir.join(format!("{name}.key")),
        dir.join(format!("{name}.pub")),
    )
}

/// Digests of every blob file in a layout.
fn blob_set(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir.join("blobs/sha256"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn push_pull_back_sign_and_sigstore_verifies() {
    let reg = Registry::start();
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let (index, platforms) = write_image(&src, "v1", 1, &[4096, 70_000]);

    let image = format!("{}/kube/node:v1", reg.host());
    let report = run_json(&["push", &format!("oci:{}:v1", p(&src)), &image]);
    assert_eq!(report["digest"], index.to_string());
    assert_eq!(report["blobs_sent"].as_array().unwrap().len(), 6);

    // skopeo pulls it back byte for byte: same index digest, same blobs.
    let back = tmp.path().join("back");
    skopeo(&[
        "copy",
        "--all",
        "--preserve-digests",
        "--src-tls-verify=false",
        &format!("docker://{image}"),
        &format!("oci:{}:v1", p(&back)),
    ]);
    let back_index = Layout::open(&back).unwrap().index().unwrap();
    assert_eq!(back_index.manifests[0].digest, index);
    assert_eq!(blob_set(&back), blob_set(&src));

    // Sign by digest; sigstore-rs accepts the index and each platform.
    let keys = tmp.path().join("keys");
    std::fs::create_dir(&keys).unwrap();
    let (key, public) = keygen(&keys, "release");
    let (_, other_public) = keygen(&keys, "other");
    let pinned = format!("{}/kube/node@{index}", reg.host());
    let signed = run_json(&["sign", "--key", p(&key), &pinned]);
    assert_eq!(signed["signed"].as_array().unwrap().len(), 3);
    for d in std::iter::once(index).chain(platforms.iter().copied()) {
        let at = format!("{}/kube/node@{d}", reg.host());
        sigstore_verify(&at, &public).unwrap_or_else(|e| panic!("sigstore rejects {at}: {e}"));
        // ... and rejects the same signature with another key.
        let e = sigstore_verify(&at, &other_public).unwrap_err();
        assert!(e.contains("unsatisfied"), "{e}");
    }
    // Signing again is idempotent (same deterministic signature layer).
    let again = run_json(&["sign", "--key", p(&key), &pinned]);
    assert_eq!(again["signed"], signed["signed"]);

    // An unsigned image is rejected.
    let unsigned_src = tmp.path().join("unsigned");
    let (unsigned, _) = write_image(&unsigned_src, "v1", 2, &[1000]);
    run(&[
        "push",
        &format!("oci:{}", p(&unsigned_src)),
        &format!("{}/kube/unsigned:v1", reg.host()),
    ]);
    let e =
        sigstore_verify(&format!("{}/kube/unsigned@{unsigned}", reg.host()), &public).unwrap_err();
    assert!(e.contains("0 layer(s)"), "{e}");

    // A valid signature whose payload names another digest (the amd64
    // signature stored as the arm64 one) is rejected by sigstore and by us.
    run(&[
        "copy",
        &format!(
            "{}/kube/node:{}",
            reg.host(),
            platforms[0].attachment_tag("sig")
        ),
        &format!(
            "{}/kube/unsigned:{}",
            reg.host(),
            unsigned.attachment_tag("sig")
        ),
    ]);
    let e =
        sigstore_verify(&format!("{}/kube/unsigned@{unsigned}", reg.host()), &public).unwrap_err();
    assert!(e.contains("unsatisfied"), "{e}");
    let out = builder()
        .args([
            "copy",
            &format!("{}/kube/unsigned:v1", reg.host()),
            &format!("oci:{}", p(&tmp.path().join("rejected"))),
            "--verify-key",
            p(&public),
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!("signature payload names digest {}", platforms[0])),
        "{stderr}"
    );
    // A registry serving other bytes for a blob: the copy fails with one
    // line naming the blob, and writes nothing.
    let m: Manifest = Layout::open(&src)
        .unwrap()
        .read_json(&platforms[0], None)
        .unwrap();
    let victim = m.layers[1].digest;
    let hex = victim.hex();
    let data = reg
        .storage()
        .join("docker/registry/v2/blobs/sha256")
        .join(&hex[..2])
        .join(&hex)
        .join("data");
    let len = std::fs::metadata(&data).unwrap().len() as usize;
    std::fs::write(&data, noise(99, len)).unwrap();
    let dest = tmp.path().join("tampered");
    let out = builder()
        .args(["copy", &image, &format!("oci:{}", p(&dest))])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains(&format!("blob {victim}")), "{stderr}");
    assert!(!dest.exists(), "nothing is written from a bad source");
}

#[test]
fn skopeo_carries_our_signature_and_copy_through_an_archive_keeps_it() {
    let reg = Registry::start();
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let (index, platforms) = write_image(&src, "v1", 3, &[2048, 30_000]);
    let (key, public) = keygen(tmp.path(), "k");
    // Sign in the layout, then push: the .sig entries travel with the push.
    run(&["sign", "--key", p(&key), &format!("oci:{}:v1", p(&src))]);
    let pushed = run_json(&[
        "push",
        &format!("oci:{}:v1", p(&src)),
        &format!("{}/kube/node:v1", reg.host()),
        "--verify-key",
        p(&public),
    ]);
    assert_eq!(pushed["attachments"].as_array().unwrap().len(), 3);
    assert_eq!(pushed["verified"].as_array().unwrap().len(), 3);

    // skopeo with use-sigstore-attachments carries the .sig to another path.
    let regd = tmp.path().join("registries.d");
    std::fs::create_dir(&regd).unwrap();
    std::fs::write(
        regd.join("default.yaml"),
        "default-docker:\n  use-sigstore-attachments: true\n",
    )
    .unwrap();
    skopeo(&[
        "--registries.d",
        p(&regd),
        "copy",
        "--all",
        "--src-tls-verify=false",
        "--dest-tls-verify=false",
        &format!("docker://{}/kube/node:v1", reg.host()),
        &format!("docker://{}/mirror/node:v1", reg.host()),
    ]);
    for d in std::iter::once(index).chain(platforms.iter().copied()) {
        sigstore_verify(&format!("{}/mirror/node@{d}", reg.host()), &public)
            .unwrap_or_else(|e| panic!("after skopeo copy, {d}: {e}"));
    }
    // ... and our own verifier agrees, reading them back from the mirror.
    run(&[
        "copy",
        &format!("{}/mirror/node:v1", reg.host()),
        &format!("oci:{}", p(&tmp.path().join("from-mirror"))),
        "--verify-key",
        p(&public),
    ]);

    // copy registry → oci-archive → another registry path: same digest, the
    // signatures of the index and both platforms still verify.
    let archive = tmp.path().join("node.tar");
    let out = run_json(&[
        "copy",
        &format!("{}/kube/node:v1", reg.host()),
        &format!("oci-archive:{}:v1", p(&archive)),
    ]);
    assert_eq!(out["digest"], index.to_string());
    let landed = run_json(&[
        "copy",
        &format!("oci-archive:{}:v1", p(&archive)),
        &format!("{}/airgap/node:v1", reg.host()),
        "--verify-key",
        p(&public),
    ]);
    assert_eq!(landed["digest"], index.to_string());
    for d in std::iter::once(index).chain(platforms) {
        sigstore_verify(&format!("{}/airgap/node@{d}", reg.host()), &public)
            .unwrap_or_else(|e| panic!("after the archive round trip, {d}: {e}"));
    }
    let inspect = skopeo(&[
        "inspect",
        "--raw",
        "--tls-verify=false",
        &format!("docker://{}/airgap/node:v1", reg.host()),
    ]);
    assert_eq!(Digest::of(inspect.as_bytes()), index);
}

#[test]
fn sbom_validates_with_spdx_tools_and_is_attached() {
    let pyspdxtools = require_tool(
        "pyspdxtools",
        "python3-venv, then `pip install spdx-tools` (PyPI) in a venv whose bin/pyspdxtools is on PATH",
    );
    let reg = Registry::start();
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let (index, _) = write_image(&src, "v1", 4, &[1000]);
    let packages = [
        (
            "kubelet",
            "v1.35.0",
            "component",
            "pkg:generic/kubelet@v1.35.0",
        ),
        (
            "containerd",
            "1.6.20",
            "debian-package",
            "pkg:deb/debian/containerd@1.6.20?arch=amd64",
        ),
        ("base", "bookworm", "base-image", "pkg:oci/base@sha256%3A00"),
    ];
    let input = serde_json::json!({
        "name": "demo-node",
        "version": "1.0.0",
        "created": 1_700_000_000u64,
        "packages": packages.iter().map(|(n, v, k, purl)| serde_json::json!({
            "name": n, "version": v, "kind": k, "purl": purl,
            "download_location": format!("https://downloads.invalid/{n}"),
            "sha256": Digest::of(n.as_bytes()),
        })).collect::<Vec<_>>(),
    });
    let input_file = tmp.path().join("input.json");
    std::fs::write(&input_file, serde_json::to_vec(&input).unwrap()).unwrap();
    let doc = tmp.path().join("sbom.spdx.json");
    run(&[
        "sbom",
        "--input",
        p(&input_file),
        "--out",
        p(&doc),
        "--attach",
        &format!("oci:{}:v1", p(&src)),
    ]);
    check(
        "pyspdxtools",
        Command::new(pyspdxtools)
            .args(["-i", p(&doc)])
            .output()
            .unwrap(),
    );
    let spdx: serde_json::Value = serde_json::from_slice(&std::fs::read(&doc).unwrap()).unwrap();
    for (name, ..) in packages {
        let pkg = spdx["packages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(
            pkg["checksums"][0],
            serde_json::json!({"algorithm": "SHA256", "checksumValue": Digest::of(name.as_bytes()).hex()})
        );
    }
    // Deterministic: the same input gives the same bytes.
    let again = tmp.path().join("again.json");
    run(&["sbom", "--input", p(&input_file), "--out", p(&again)]);
    assert_eq!(std::fs::read(&doc).unwrap(), std::fs::read(&again).unwrap());

    // The .sbom attachment travels with a push and names the image.
    run(&[
        "push",
        &format!("oci:{}:v1", p(&src)),
        &format!("{}/kube/node:v1", reg.host()),
    ]);
    let raw = skopeo(&[
        "inspect",
        "--raw",
        "--tls-verify=false",
        &format!(
            "docker://{}/kube/node:{}",
            reg.host(),
            index.attachment_tag("sbom")
        ),
    ]);
    let m: Manifest = serde_json::from_str(&raw).unwrap();
    assert_eq!(m.subject.unwrap().digest, index);
    assert_eq!(
        m.layers[0].digest,
        Digest::of(&std::fs::read(&doc).unwrap())
    );
}

/// Lines of the registry's access log recording a finished blob upload.
fn finished_uploads(log: &str) -> usize {
    log.lines()
        .filter(|l| {
            l.contains("\"PUT /v2/") && l.contains("/blobs/uploads/") && l.contains("\" 201 ")
        })
        .count()
}

#[test]
fn push_interrupted_by_a_dead_registry_resumes_with_only_the_missing_blobs() {
    let mut reg = Registry::start();
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    // 2 platforms × 3 layers of 12 MB + 2 configs = 8 blobs.
    let (index, _) = write_image(&src, "v1", 5, &[12 << 20, 12 << 20, 12 << 20]);
    let image = format!("{}/kube/big:v1", reg.host());
    let mut child = builder()
        .args(["--json", "--progress", "quiet", "push"])
        .args([&format!("oci:{}:v1", p(&src)), &image])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Kill the registry once three blobs have landed (five still to go).
    let deadline = Instant::now() + Duration::from_secs(120);
    while finished_uploads(&reg.log()) < 3 {
        assert!(Instant::now() < deadline, "no blob upload finished");
        assert!(
            child.try_wait().unwrap().is_none(),
            "push ended before the registry was killed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    reg.kill();
    let first = child.wait_with_output().unwrap();
    assert!(
        !first.status.success(),
        "push succeeded against a dead registry"
    );
    let err = String::from_utf8_lossy(&first.stderr);
    assert_eq!(err.trim().lines().count(), 1, "one-line error: {err}");
    assert!(
        err.contains("blob sha256:") || err.contains("manifest"),
        "{err}"
    );

    // What the killed registry had completely received for the repository.
    let linked = |reg: &Registry| -> BTreeSet<String> {
        let dir = reg
            .storage()
            .join("docker/registry/v2/repositories/kube/big/_layers/sha256");
        std::fs::read_dir(dir)
            .map(|d| {
                d.map(|e| format!("sha256:{}", e.unwrap().file_name().to_string_lossy()))
                    .collect()
            })
            .unwrap_or_default()
    };
    let had = linked(&reg);
    let reg = reg.restart();
    let image = format!("{}/kube/big:v1", reg.host());
    let report = run_json(&["push", &format!("oci:{}:v1", p(&src)), &image]);
    let digests = |key: &str| -> BTreeSet<String> {
        report[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_str().unwrap().to_string())
            .collect()
    };
    let (sent, skipped) = (digests("blobs_sent"), digests("blobs_skipped"));
    eprintln!(
        "resumed push: {} blob(s) sent, {} skipped ({} already in the killed registry)",
        sent.len(),
        skipped.len(),
        had.len()
    );
    assert_eq!(sent.len() + skipped.len(), 8);
    assert!(
        !skipped.is_empty(),
        "nothing was kept from the first push: {report}"
    );
    assert!(
        !sent.is_empty(),
        "the first push was not interrupted: {report}"
    );
    // Exactly what the registry had is skipped; only the rest is sent.
    assert_eq!(skipped, had, "{report}");
    assert!(sent.is_disjoint(&had), "{report}");
    let sent = sent.len();
    // The registry saw exactly the uploads the report claims.
    assert_eq!(finished_uploads(&reg.log()), sent, "{}", reg.log());
    assert_eq!(report["digest"], index.to_string());
    let back = tmp.path().join("back");
    skopeo(&[
        "copy",
        "--all",
        "--preserve-digests",
        "--src-tls-verify=false",
        &format!("docker://{image}"),
        &format!("oci:{}:v1", p(&back)),
    ]);
    assert_eq!(blob_set(&back), blob_set(&src));
}

/// The demo recipe, built by the binary with `--sign-key --push`: the pushed
/// index is the built one, skopeo pulls back the same digests, sigstore-rs
/// accepts every signature, and the SBOM (embedded and attached) validates
/// and lists every component with its pinned sha256.
#[test]
fn demo_build_signs_pushes_and_carries_a_valid_sbom() {
    let pyspdxtools = require_tool(
        "pyspdxtools",
        "python3-venv, then `pip install spdx-tools` (PyPI) in a venv whose bin/pyspdxtools is on PATH",
    );
    let reg = Registry::start();
    let tmp = tempfile::tempdir().unwrap();
    let (key, public) = keygen(tmp.path(), "release");
    let recipe = kubeslot_test_support::workspace_root().join("testdata/recipes/demo.toml");
    let out = tmp.path().join("out");
    let image = format!("{}/kube/demo:v1", reg.host());
    let summary = run_json(&[
        "--progress",
        "quiet",
        "--cache",
        p(&tmp.path().join("cache")),
        "build",
        p(&recipe),
        "--output",
        &format!("oci:{}", p(&out)),
        "--sign-key",
        p(&key),
        "--push",
        &image,
    ]);
    let index: Digest = summary["index"].as_str().unwrap().parse().unwrap();
    assert_eq!(summary["pushed"]["digest"], index.to_string());
    // index + 2 platforms signed; each platform's .sbom attached
    assert_eq!(summary["pushed"]["verified"].as_array().unwrap().len(), 3);
    assert_eq!(
        summary["pushed"]["attachments"].as_array().unwrap().len(),
        5
    );

    let back = tmp.path().join("back");
    skopeo(&[
        "copy",
        "--all",
        "--preserve-digests",
        "--src-tls-verify=false",
        &format!("docker://{image}"),
        &format!("oci:{}:v1", p(&back)),
    ]);
    let back_layout = Layout::open(&back).unwrap();
    assert_eq!(back_layout.index().unwrap().manifests[0].digest, index);
    assert!(blob_set(&back).is_subset(&blob_set(&out)));

    let platforms: Vec<Descriptor> = back_layout
        .read_json::<Index>(&index, None)
        .unwrap()
        .manifests;
    for d in std::iter::once(index).chain(platforms.iter().map(|d| d.digest)) {
        sigstore_verify(&format!("{}/kube/demo@{d}", reg.host()), &public)
            .unwrap_or_else(|e| panic!("sigstore rejects {d}: {e}"));
    }

    // Our copy brings the .sbom attachments along; the amd64 one validates,
    // equals the file embedded in the image, and lists every component.
    let copied = tmp.path().join("copied");
    run(&["copy", &image, &format!("oci:{}", p(&copied))]);
    let copied = Layout::open(&copied).unwrap();
    let amd64 = platforms
        .iter()
        .find(|d| d.platform.as_ref().unwrap().architecture == "amd64")
        .unwrap();
    let sbom_tag = amd64.digest.attachment_tag("sbom");
    let entry = copied
        .index()
        .unwrap()
        .manifests
        .into_iter()
        .find(|e| e.annotations.get(ANNOTATION_REF_NAME) == Some(&sbom_tag))
        .expect("the .sbom attachment was copied");
    let artifact: Manifest = copied.read_json(&entry.digest, Some(entry.size)).unwrap();
    assert_eq!(artifact.subject.as_ref().unwrap().digest, amd64.digest);
    let doc_bytes = copied
        .blobs()
        .read_verified(&artifact.layers[0].digest, None, 1 << 20)
        .unwrap();
    let doc_file = tmp.path().join("amd64.spdx.json");
    std::fs::write(&doc_file, &doc_bytes).unwrap();
    check(
        "pyspdxtools",
        Command::new(pyspdxtools)
            .args(["-i", p(&doc_file)])
            .output()
            .unwrap(),
    );

    let manifest: Manifest = copied.read_json(&amd64.digest, None).unwrap();
    let last = manifest.layers.last().unwrap();
    let gz = std::fs::File::open(copied.blobs().path(&last.digest)).unwrap();
    let mut embedded = None;
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(gz));
    for e in tar.entries().unwrap() {
        let mut e = e.unwrap();
        if e.path().unwrap().to_str() == Some("usr/share/kubeslot/sbom.spdx.json") {
            let mut v = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut v).unwrap();
            embedded = Some(v);
        }
    }
    assert_eq!(
        embedded.as_deref(),
        Some(&doc_bytes[..]),
        "embedded = attached"
    );

    let spdx: serde_json::Value = serde_json::from_slice(&doc_bytes).unwrap();
    let recipe: toml::Value = toml::from_str(&std::fs::read_to_string(&recipe).unwrap()).unwrap();
    let components = recipe["components"].as_table().unwrap();
    assert!(components.len() >= 5);
    for (name, c) in components {
        let pin = c["sha256"]["amd64"].as_str().unwrap();
        let pkg = spdx["packages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name.as_str())
            .unwrap_or_else(|| panic!("component {name} missing from the SBOM"));
        assert_eq!(
            pkg["checksums"][0]["checksumValue"],
            pin.strip_prefix("sha256:").unwrap(),
            "{name}"
        );
        assert_eq!(pkg["versionInfo"], c["version"].as_str().unwrap(), "{name}");
    }
    // The base rootfs tarball is listed with its pinned sha256 too.
    let base_pin = recipe["base"]["sha256"]["amd64"].as_str().unwrap();
    let base = spdx["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "base-rootfs")
        .expect("the base rootfs is missing from the SBOM");
    assert_eq!(
        base["checksums"][0]["checksumValue"],
        base_pin.strip_prefix("sha256:").unwrap()
    );
}

#[test]
fn credentials_refused_and_accepted_from_each_source() {
    let reg = Registry::start_with_auth();
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let (index, _) = write_image(&src, "v1", 6, &[1000]);
    let image = format!("{}/kube/private:v1", reg.host());
    let push = |envs: &[(&str, &str)], extra: &[&str]| {
        let mut c = builder();
        c.env_remove("KUBESLOT_REGISTRY_USER")
            .env_remove("KUBESLOT_REGISTRY_PASSWORD")
            .env("DOCKER_CONFIG", tmp.path().join("no-docker-config"))
            .args(["push", &format!("oci:{}", p(&src)), &image])
            .args(extra);
        for (k, v) in envs {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    // Anonymous and wrong passwords are refused, in one line naming the registry.
    let wrong = tmp.path().join("wrong");
    std::fs::write(&wrong, "kubeslot:nope\n").unwrap();
    for out in [push(&[], &[]), push(&[], &["--creds-file", p(&wrong)])] {
        let err = String::from_utf8_lossy(&out.stderr);
        eprintln!("refused: {}", err.trim());
        assert!(!out.status.success(), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(&reg.host()), "{err}");
        assert!(
            err.contains(&format!("registry {}: authentication refused", reg.host())),
            "{err}"
        );
    }
    // A creds file, the environment, a docker config: each is accepted.
    let good = tmp.path().join("good");
    std::fs::write(&good, "kubeslot:s3cret\n").unwrap();
    check("creds file", push(&[], &["--creds-file", p(&good)]));
    check(
        "env",
        push(
            &[
                ("KUBESLOT_REGISTRY_USER", "kubeslot"),
                ("KUBESLOT_REGISTRY_PASSWORD", "s3cret"),
            ],
            &[],
        ),
    );
    let docker = tmp.path().join("docker");
    std::fs::create_dir(&docker).unwrap();
    std::fs::write(
        docker.join("config.json"),
        format!(
            r#"{{"auths":{{"{}":{{"auth":"a3ViZXNsb3Q6czNjcmV0"}}}}}}"#,
            reg.host()
        ),
    )
    .unwrap();
    check("docker config", push(&[("DOCKER_CONFIG", p(&docker))], &[]));
    // A --creds-file in docker config format, and one naming only another registry.
    let config = docker.join("config.json");
    check(
        "creds file (docker config)",
        push(&[], &["--creds-file", p(&config)]),
    );
    let other = tmp.path().join("other.json");
    std::fs::write(
        &other,
        r#"{"auths":{"elsewhere.example":{"auth":"a3ViZXNsb3Q6czNjcmV0"}}}"#,
    )
    .unwrap();
    let out = push(&[], &["--creds-file", p(&other)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!("no auths entry for registry {}", reg.host())),
        "{err}"
    );
    // The registry holds our index, byte for byte, behind those credentials.
    let out = Command::new("skopeo")
        .args([
            "inspect",
            "--raw",
            "--tls-verify=false",
            "--creds",
            "kubeslot:s3cret",
        ])
        .arg(format!("docker://{image}"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(Digest::of(&out.stdout), index);
}

/// `build --identity`: every signature of a layout or archive output names
/// that repository, which is what a host reading it as `oci:`/`oci-archive:`
/// checks against its `trust.identity` (with the hosts' own verifier).
#[test]
fn build_identity_is_the_repository_every_signature_names() {
    use kubeslot_image::reference::{Identity, ImageSource};
    use kubeslot_image::registry::Registries;
    use kubeslot_image::signature::TrustedKeys;
    use kubeslot_image::source::Source;
    use kubeslot_image::verify::{self, Policy, Verdict};

    let tmp = tempfile::tempdir().unwrap();
    let (key, public) = keygen(tmp.path(), "release");
    let recipe = kubeslot_test_support::workspace_root().join("testdata/recipes/demo.toml");
    let out = tmp.path().join("out");
    let cache = tmp.path().join("cache");
    run_json(&[
        "--progress",
        "quiet",
        "--cache",
        p(&cache),
        "build",
        p(&recipe),
        "--output",
        &format!("oci:{}:v1", p(&out)),
        "--sign-key",
        p(&key),
        "--identity",
        "registry.example/kube/demo",
    ]);
    let keys = TrustedKeys::from_pem_files(&[&public]).unwrap();
    let source = Source::open(
        &format!("oci:{}:v1", p(&out))
            .parse::<ImageSource>()
            .unwrap(),
        &Registries::default(),
        tmp.path(),
    )
    .unwrap();
    let top = source.resolve().unwrap();
    for arch in ["amd64", "arm64"] {
        let image = source.select(&top, &Platform::linux(arch)).unwrap();
        let ours = Policy::new(keys.clone(), false).with_identity(Some(
            Identity::repository("registry.example/kube/demo").unwrap(),
        ));
        assert!(matches!(
            verify::check(&source, &image, &ours).unwrap(),
            Verdict::Signed { .. }
        ));
        let other = Policy::new(keys.clone(), false).with_identity(Some(
            Identity::repository("registry.example/kube/demo-debug").unwrap(),
        ));
        let e = verify::check(&source, &image, &other)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("names identity registry.example/kube/demo,")
                || e.contains("names identity registry.example/kube/demo "),
            "{e}"
        );
    }
    // A tag or digest is not a repository.
    let refused = builder()
        .args(["--cache", p(&cache), "build", p(&recipe), "--output"])
        .arg(format!("oci:{}:v2", p(&out)))
        .args(["--identity", "registry.example/kube/demo:v1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        err.contains("--identity") && err.contains("no tag"),
        "{err}"
    );
}

/// Keyless material travels with the image: cosign's real v0.3 bundle,
/// attached as a referrer (fallback tag `sha256-<hex>`) to the exact image
/// it signs, is carried by `copy` layout → registry → archive → registry →
/// layout, and every copy still verifies with the hosts' code.
#[test]
fn copy_carries_referrers_bundles() {
    use kubeslot_image::keyless::{GithubRule, IdentityRule, KeylessPolicy, Rules, TrustedRoot};
    use kubeslot_image::reference::Identity;
    use kubeslot_image::registry::Registries;
    use kubeslot_image::signature::TrustedKeys;
    use kubeslot_image::source::Source;
    use kubeslot_image::verify::{self, Policy};
    use kubeslot_test_support::keyless as kl;

    let reg = Registry::start();
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let layout = Layout::create(&src).unwrap();
    let image = kl::write_empty_image(&layout, "v1");
    kl::attach_bundle(&layout, &image, &kl::cosign_bundle());

    let archive = tmp.path().join("node.tar");
    let copied = tmp.path().join("copied");
    let steps = [
        (
            format!("oci:{}:v1", p(&src)),
            format!("{}/keyless/node:v1", reg.host()),
        ),
        (
            format!("{}/keyless/node:v1", reg.host()),
            format!("oci-archive:{}:v1", p(&archive)),
        ),
        (
            format!("oci-archive:{}:v1", p(&archive)),
            format!("{}/airgap/node:v1", reg.host()),
        ),
        (
            format!("{}/airgap/node:v1", reg.host()),
            format!("oci:{}:v1", p(&copied)),
        ),
    ];
    for (from, to) in &steps {
        let out = run_json(&["copy", from, to]);
        assert_eq!(out["digest"], kl::COSIGN_SUBJECT, "{from} → {to}");
        let tags: Vec<String> = serde_json::from_value(out["attachments"].clone()).unwrap();
        assert!(
            tags.contains(&image.digest.referrers_tag()),
            "{from} → {to}: {tags:?}"
        );
    }

    let root = TrustedRoot::parse(&std::fs::read(kl::production_root()).unwrap()).unwrap();
    let policy = Policy::new(TrustedKeys::default(), false)
        .with_keyless(Some(KeylessPolicy {
            root,
            rules: Rules {
                issuer: kl::COSIGN_ISSUER.into(),
                identity: IdentityRule::Exact(kl::COSIGN_SAN.into()),
                github: GithubRule::default(),
                require_sct: true,
                accept_deprecated_issuer: false,
                allow_unnamed_subject: false,
            },
        }))
        .with_identity(Some(Identity::repository(kl::COSIGN_SUBJECT_NAME).unwrap()));
    for dst in [
        format!("{}/keyless/node:v1", reg.host()),
        format!("oci-archive:{}:v1", p(&archive)),
        format!("{}/airgap/node:v1", reg.host()),
        format!("oci:{}:v1", p(&copied)),
    ] {
        let s: kubeslot_image::ImageSource = dst.parse().unwrap();
        let source = Source::open(&s, &Registries::new(), tmp.path()).unwrap();
        let top = source.resolve().unwrap();
        // the bundle arrived whole: verified down to its statement, which
        // is `cosign attest`'s (an attestation, refused as no signature
        // since issue 40; the activator's keyless tests accept `cosign
        // sign` bundles)
        let e = verify::check_digests(&source, top.digest, top.digest, &policy)
            .map(|v| format!("{v:?}"))
            .expect_err(&dst)
            .to_string();
        assert!(
            e.contains(&format!("certificate {}", kl::COSIGN_SAN))
                && e.contains("not cosign's signature"),
            "{dst}: {e}"
        );
    }
}
