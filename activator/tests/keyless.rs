//! Keyless signatures end to end without systemd: real Sigstore vectors
//! (testdata/keyless) served from a real `docker-registry` (through the
//! referrers fallback tag: Debian's 2.8 has no referrers API), an OCI
//! layout and an `oci-archive`, read by the activator's own config loading
//! (`trust.keyless`) and by the `kubeslot-activator unpack` binary.
//!
//! What is real and what is not: cosign's bundle, its certificate, Rekor
//! entry and the production trusted root are real; the image it signs is
//! go-containerregistry's empty image, rebuilt byte for byte (its digest is
//! the statement's subject). That image names no OS or architecture, so
//! `unpack` verifies its signature (the host decides trust before it reads
//! the config) and then refuses it as not an image for this host: a refusal
//! that comes only after the signature was accepted. Each mutation is
//! refused at the signature, naming why.
//!
//! The second part activates real node images for this host, signed by the
//! test Sigstore instance (test-support's `keyless::TestSigstore`), with
//! real flips under the fake systemd; each mutation of that material is
//! refused naming why, with nothing staged.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kubeslot_activator::config::Trust;
use kubeslot_activator::paths::Root;
use kubeslot_image::layout::Layout;
use kubeslot_image::oci::Descriptor;
use kubeslot_image::registry::Registries;
use kubeslot_image::source::Source;
use kubeslot_image::verify::{self, Verdict};
use kubeslot_image::{Digest, ImageSource};
use kubeslot_test_support::keyless::{
    attach_bundle, cosign_bundle, mutations, production_root, push_raw, write_empty_image,
    COSIGN_ISSUER, COSIGN_SAN, COSIGN_SUBJECT, COSIGN_SUBJECT_NAME, DOCKER_MANIFEST,
};
use kubeslot_test_support::Registry;
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_kubeslot-activator");

struct Host {
    dir: tempfile::TempDir,
    root: PathBuf,
}

impl Host {
    fn new() -> Host {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        fs::create_dir_all(root.join("etc/kubeslot")).unwrap();
        fs::copy(
            production_root(),
            root.join("etc/kubeslot/trusted_root.json"),
        )
        .unwrap();
        Host { dir, root }
    }

    fn trust(&self, keyless: Value) -> Value {
        let mut k = json!({
            "trusted_root": "/etc/kubeslot/trusted_root.json",
            "issuer": COSIGN_ISSUER,
            "identity": COSIGN_SAN,
        });
        for (key, v) in keyless.as_object().unwrap() {
            if v.is_null() {
                k.as_object_mut().unwrap().remove(key);
            } else {
                k[key] = v.clone();
            }
        }
        json!({"identity": COSIGN_SUBJECT_NAME, "keyless": k})
    }

    fn unpack(&self, image: &str, trust: &Value) -> Output {
        let config = self.dir.path().join("activator.json");
        fs::write(
            &config,
            serde_json::to_vec(&json!({"trust": trust})).unwrap(),
        )
        .unwrap();
        let target = self.root.join("unpacked");
        let _ = fs::remove_dir_all(&target);
        let out = Command::new(BIN)
            .args(["unpack", "--json", "--config"])
            .arg(&config)
            .arg("--root")
            .arg(&self.root)
            .arg(image)
            .arg(&target)
            .output()
            .unwrap();
        assert!(!target.exists(), "{image}: nothing may be unpacked");
        out
    }

    /// The verdict of the activator's own policy (config → `trust::policy`)
    /// over `image`'s single manifest.
    fn verdict(&self, image: &str, trust: &Value) -> Result<Verdict, String> {
        let trust: Trust = serde_json::from_value(trust.clone()).unwrap();
        let src: ImageSource = image.parse().unwrap();
        let policy =
            kubeslot_activator::fetch::access::policy(&trust, &src, &Root::new(&self.root))
                .map_err(|e| e.to_string())?;
        let source = Source::open(&src, &Registries::new(), self.dir.path()).unwrap();
        let top = source.resolve().unwrap();
        verify::check_digests(&source, top.digest, top.digest, &policy).map_err(|e| e.to_string())
    }
}

fn stderr(o: &Output) -> String {
    assert!(!o.status.success(), "unpack succeeded");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A layout with the empty image (tag v1) and `bundle` attached to it.
fn layout_with(dir: &Path, bundle: &Value) -> Descriptor {
    let layout = Layout::create(dir).unwrap();
    let image = write_empty_image(&layout, "v1");
    attach_bundle(&layout, &image, bundle);
    image
}

/// The three places a host reads an image from, for one layout: a
/// registry repository it is pushed to, the layout, an archive of it.
fn sources(reg: &Registry, dir: &Path, repo: &str, image: &Descriptor) -> Vec<String> {
    push_raw(dir, "v1", &reg.host(), repo);
    push_raw(dir, &image.digest.referrers_tag(), &reg.host(), repo);
    let archive = dir.with_extension("tar");
    let st = Command::new("tar")
        .arg("-C")
        .arg(dir)
        .arg("-cf")
        .arg(&archive)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success());
    vec![
        format!("{}/{repo}:v1", reg.host()),
        format!("oci:{}:v1", dir.display()),
        format!("oci-archive:{}:v1", archive.display()),
    ]
}

/// The real `cosign attest` bundle (predicate
/// `https://cosign.sigstore.dev/attestation/v1`) verifies in every other
/// respect from a registry, a layout and an archive: its certificate,
/// log entry and subject; it is refused as what it is, an attestation, not
/// a signature (issue 40 item 7). The test instance's `cosign sign`
/// bundles are accepted from the same three sources
/// (`a_keylessly_signed_image_is_activated_from_a_registry_a_layout_and_an_archive`).
#[test]
fn cosign_bundle_from_a_registry_a_layout_and_an_archive() {
    let reg = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let host = Host::new();
    let dir = work.path().join("pristine");
    let image = layout_with(&dir, &cosign_bundle());
    assert_eq!(image.digest.to_string(), COSIGN_SUBJECT);
    let trust = host.trust(json!({}));
    for src in sources(&reg, &dir, "keyless/pristine", &image) {
        let e = host.verdict(&src, &trust).expect_err(&src);
        assert!(
            e.contains(&format!(
                "certificate {COSIGN_SAN} (issuer {COSIGN_ISSUER})"
            )) && e.contains("predicate type \"https://cosign.sigstore.dev/attestation/v1\"")
                && e.contains("not cosign's signature"),
            "{src}: {e}"
        );
        let e = stderr(&host.unpack(&src, &trust));
        assert!(
            e.contains("refused by the trust policy") && e.contains("not cosign's signature"),
            "{src}: {e}"
        );
        // Without the keyless policy the same image is refused as unsigned.
        let e = stderr(&host.unpack(&src, &json!({"identity": COSIGN_SUBJECT_NAME})));
        assert!(e.contains("there is no trust.keyless"), "{src}: {e}");
    }
}

#[test]
fn each_mutation_is_refused_naming_why() {
    let reg = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let host = Host::new();
    let trust = host.trust(json!({}));
    for m in mutations() {
        let dir = work.path().join(m.name);
        let image = layout_with(&dir, &m.bundle);
        for src in sources(&reg, &dir, &format!("keyless/{}", m.name), &image) {
            let e = stderr(&host.unpack(&src, &trust));
            assert!(
                e.contains("refused by the trust policy") && e.contains(m.says),
                "{}: {src}: {e}",
                m.name
            );
            assert!(
                e.contains("issuer https://"),
                "{}: names the issuer: {e}",
                m.name
            );
        }
    }

    // Another image digest: the real bundle attached to another image.
    let dir = work.path().join("other-image");
    let layout = Layout::create(&dir).unwrap();
    let config =
        br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#;
    let cd = layout.blobs().put_bytes(config).unwrap();
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"{DOCKER_MANIFEST}","config":{{"mediaType":"application/vnd.docker.container.image.v1+json","size":{},"digest":"{cd}"}},"layers":[]}}"#,
        config.len()
    );
    let md = layout.blobs().put_bytes(manifest.as_bytes()).unwrap();
    let other = Descriptor::new(DOCKER_MANIFEST, md, manifest.len() as u64);
    kubeslot_test_support::image::tag_entry(&layout, "v1", other.clone());
    attach_bundle(&layout, &other, &cosign_bundle());
    for src in sources(&reg, &dir, "keyless/other-image", &other) {
        let e = stderr(&host.unpack(&src, &trust));
        assert!(
            e.contains(COSIGN_SAN) && e.contains("do not include") && e.contains(&md.to_string()),
            "{src}: {e}"
        );
    }

    // The policy's own mutations, on the pristine material.
    let dir = work.path().join("pristine");
    let image = layout_with(&dir, &cosign_bundle());
    let srcs = sources(&reg, &dir, "keyless/policy", &image);
    // an unanchored-looking regexp matches only the whole identity
    let regexp = host.trust(json!({"identity": null, "identity_regexp": "soyland.com"}));
    // the statement names its repository: another trust.identity refuses
    let mut other_repo = host.trust(json!({}));
    other_repo["identity"] = json!("ghcr.io/org/node");
    // another issuer
    let issuer = host.trust(json!({"issuer": "https://token.actions.githubusercontent.com"}));
    for src in &srcs {
        let e = stderr(&host.unpack(src, &regexp));
        assert!(
            e.contains("anchored at both ends") && e.contains(COSIGN_SAN),
            "{src}: {e}"
        );
        let e = stderr(&host.unpack(src, &other_repo));
        assert!(
            e.contains("names repository 127.0.0.1:60943/repo, not ghcr.io/org/node"),
            "{src}: {e}"
        );
        let e = stderr(&host.unpack(src, &issuer));
        assert!(e.contains("is not trust.keyless.issuer"), "{src}: {e}");
    }
    // A trusted root the host does not have is a config error, found first.
    let missing = host.trust(json!({"trusted_root": "/etc/kubeslot/missing.json"}));
    let e = stderr(&host.unpack(&srcs[0], &missing));
    assert!(
        e.contains("trust.keyless") && e.contains("missing.json"),
        "{e}"
    );
}

/// The sigstore-rs legacy keyless layer as a `.sig` artifact, for the image
/// digest its payload names (the image itself is not public).
#[test]
fn legacy_sig_layer_from_a_registry_a_layout_and_an_archive() {
    let data = kubeslot_test_support::keyless::vectors().join("sigstore-rs/legacy-layer");
    let payload = fs::read(data.join("payload.json")).unwrap();
    let annotations: std::collections::BTreeMap<String, String> =
        serde_json::from_slice(&fs::read(data.join("annotations.json")).unwrap()).unwrap();
    let image: Digest = "sha256:5f481572d088dc4023afb35fced9530ced3d9b03bf7299c6f492163cb9f0452e"
        .parse()
        .unwrap();
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("legacy");
    let layout = Layout::create(&dir).unwrap();
    let pd = layout.blobs().put_bytes(&payload).unwrap();
    let cd = layout.blobs().put_bytes(b"{}").unwrap();
    let mut layer = Descriptor::new(
        kubeslot_image::oci::MEDIA_TYPE_SIMPLE_SIGNING,
        pd,
        payload.len() as u64,
    );
    layer.annotations = annotations;
    let manifest = kubeslot_image::oci::Manifest {
        schema_version: 2,
        media_type: Some(kubeslot_image::oci::MEDIA_TYPE_MANIFEST.into()),
        artifact_type: None,
        config: Descriptor::new(kubeslot_image::oci::MEDIA_TYPE_CONFIG, cd, 2),
        layers: vec![layer],
        subject: None,
        annotations: Default::default(),
    };
    let bytes = serde_json::to_vec(&manifest).unwrap();
    let md = layout.blobs().put_bytes(&bytes).unwrap();
    let tag = image.attachment_tag("sig");
    kubeslot_test_support::image::tag_entry(
        &layout,
        &tag,
        Descriptor::new(
            kubeslot_image::oci::MEDIA_TYPE_MANIFEST,
            md,
            bytes.len() as u64,
        ),
    );
    let reg = Registry::start();
    push_raw(
        &dir,
        &tag,
        &reg.host(),
        "kubewarden/disallow-service-nodeport",
    );
    let archive = work.path().join("legacy.tar");
    assert!(Command::new("tar")
        .arg("-C")
        .arg(&dir)
        .arg("-cf")
        .arg(&archive)
        .arg(".")
        .status()
        .unwrap()
        .success());
    let host = Host::new();
    let trust: Trust = serde_json::from_value(json!({
        "identity": "registry-testing.svc.lan/kubewarden/disallow-service-nodeport",
        "keyless": {
            "trusted_root": "/etc/kubeslot/trusted_root.json",
            "issuer": COSIGN_ISSUER,
            "identity": "flavio@castelli.me",
            "require_sct": false
        }
    }))
    .unwrap();
    for src in [
        format!("{}/kubewarden/disallow-service-nodeport:any", reg.host()),
        format!("oci:{}", dir.display()),
        format!("oci-archive:{}", archive.display()),
    ] {
        let s: ImageSource = src.parse().unwrap();
        let policy =
            kubeslot_activator::fetch::access::policy(&trust, &s, &Root::new(&host.root)).unwrap();
        let source = Source::open(&s, &Registries::new(), host.dir.path()).unwrap();
        // Read from the .sig tag, checked through SET, chain (the 2021
        // Fulcio root, at the log's time) and the entry's body; the 2021
        // certificate names no issuer, which the policy refuses by name.
        let e = verify::check_digests(&source, image, image, &policy)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("certificate flavio@castelli.me (issuer none)")
                && e.contains("names no OIDC issuer"),
            "{src}: {e}"
        );
    }
}

// ---- A keylessly signed image for this host, activated ----
//
// No public vector signs an image for this host, so these tests sign real
// node images with the test Sigstore instance
// (`kubeslot_test_support::keyless::TestSigstore`: its own Fulcio CAs,
// Rekor and CT keys and trusted_root.json). The activator knows nothing of
// it: `activate` reads the instance's root as `trust.keyless.trusted_root`
// and checks its material exactly as it checks the public vectors. systemd
// is the shared fake; the flips are real (trees, host files, state).

use kubeslot_activator::activate::report::{Outcome, Report};
use kubeslot_activator::activate::{activate, Options};
use kubeslot_activator::testing::FakeSystemd;
use kubeslot_test_support::image::{gzip_layer, write_image};
use kubeslot_test_support::keyless::sigstore::Mutation;
use kubeslot_test_support::keyless::{
    image_subjects, Material, SignSpec, TestSigstore, Workflow, GITHUB_ISSUER,
};
use kubeslot_test_support::tar::tar_with_dirs;

/// The repository the signatures name (under the test registry's host).
const NODE_REPO: &str = "kubeslot/keyless-node";

/// A node image for this host, tagged `v1` in a new layout at `dir`, whose
/// machine turns healthy under the fake systemd; `version` makes it
/// distinct. Returns its subjects (index, platform manifest) and layer.
fn node_image(dir: &Path, version: &str) -> (Vec<Descriptor>, Digest) {
    let layout = Layout::create(dir).unwrap();
    let layer = gzip_layer(
        &layout,
        &tar_with_dirs(
            &["etc/"],
            &[
                ("etc/fixture-health", b"healthy"),
                ("etc/version", version.as_bytes()),
            ],
        ),
    );
    let digest = layer.desc.digest;
    write_image(&layout, "v1", &[layer]);
    (image_subjects(&layout, "v1"), digest)
}

/// A host whose config trusts the test Sigstore's root and nothing else.
struct KeylessHost {
    _dir: tempfile::TempDir,
    root: Root,
    config: PathBuf,
    fake: FakeSystemd,
}

impl KeylessHost {
    fn new(sigstore: &TestSigstore) -> KeylessHost {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path().join("root"));
        kubeslot_test_support::fake_host(root.dir());
        fs::create_dir_all(root.join("etc/kubeslot")).unwrap();
        sigstore.write_trusted_root(&root.join("etc/kubeslot/test-trusted-root.json"));
        let fake = FakeSystemd::new(&root);
        let config = dir.path().join("activator.json");
        KeylessHost {
            _dir: dir,
            root,
            config,
            fake,
        }
    }

    /// Writes the config: `image`, signatures naming `repository`, the
    /// workflow's identity and GitHub claims (`keyless` entries replace
    /// or, when null, remove them).
    fn configure(&self, image: &str, repository: &str, keyless: Value) {
        let w = Workflow::example();
        let mut k = json!({
            "trusted_root": "/etc/kubeslot/test-trusted-root.json",
            "issuer": GITHUB_ISSUER,
            "identity": w.identity(),
            "github": {"source_repository": w.repository, "ref": w.git_ref, "workflow": w.identity()},
            "require_sct": true,
        });
        for (key, v) in keyless.as_object().unwrap() {
            if v.is_null() {
                k.as_object_mut().unwrap().remove(key);
            } else {
                k[key] = v.clone();
            }
        }
        let config = json!({
            "image": image,
            "trust": {"identity": repository, "keyless": k},
            "kubelet": {
                "api_server": "https://10.0.0.1:6443",
                "ca_data": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
                "bootstrap_token": "abcdef.0123456789abcdef",
                "node_name": "node-a",
            },
            "gpu": "off",
            "nameservers": ["192.0.2.53"],
            "health": {"timeout_secs": 1, "successes": 2, "interval_ms": 20,
                       "kubelet_healthz_url": self.fake.healthz_url},
        });
        fs::write(&self.config, serde_json::to_vec(&config).unwrap()).unwrap();
    }

    fn activate(&self) -> Report {
        let ran = activate(&self.root, &self.config, &self.fake, &Options::default());
        ran.saved.unwrap();
        ran.report
    }

    /// Nothing of a refused image on the host: no machine tree, no staging
    /// dir, none of its layers in the store.
    fn assert_nothing_staged(&self, layer: &Digest, what: &str) {
        let machines = self.root.machines_dir();
        let entries: Vec<_> = fs::read_dir(&machines)
            .map(|d| d.map(|e| e.unwrap().file_name()).collect())
            .unwrap_or_default();
        assert!(
            entries.is_empty(),
            "{what}: {entries:?} in {}",
            machines.display()
        );
        let blob = self.root.store().join("sha256").join(layer.hex());
        assert!(!blob.exists(), "{what}: layer {layer} stored");
    }
}

/// `material` attached to the image in `dir` and served the three ways a
/// host reads an image: pushed to `reg` as `repo`, the layout, an archive.
fn serve(reg: &Registry, dir: &Path, repo: &str, material: &Material) -> Vec<String> {
    let layout = Layout::open(dir).unwrap();
    material.attach(&layout);
    push_raw(dir, "v1", &reg.host(), repo);
    for tag in material.tags() {
        push_raw(dir, &tag, &reg.host(), repo);
    }
    let archive = dir.with_extension("tar");
    assert!(Command::new("tar")
        .arg("-C")
        .arg(dir)
        .arg("-cf")
        .arg(&archive)
        .arg(".")
        .status()
        .unwrap()
        .success());
    vec![
        format!("{}/{repo}:v1", reg.host()),
        format!("oci:{}:v1", dir.display()),
        format!("oci-archive:{}:v1", archive.display()),
    ]
}

#[test]
fn a_keylessly_signed_image_is_activated_from_a_registry_a_layout_and_an_archive() {
    let sigstore = TestSigstore::new();
    let reg = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let host = KeylessHost::new(&sigstore);
    let repository = format!("{}/{NODE_REPO}", reg.host());
    // three images (one per source), each signed both ways
    let mut machine = "kube2";
    for (i, how) in ["registry", "layout", "archive"].into_iter().enumerate() {
        let dir = work.path().join(how);
        let (subjects, _) = node_image(&dir, how);
        let material = sigstore.sign(&subjects, &SignSpec::new(Workflow::example(), &repository));
        assert_eq!((material.legacy.len(), material.bundles.len()), (2, 2));
        let src = serve(&reg, &dir, NODE_REPO, &material).remove(i);
        host.configure(&src, &repository, json!({}));
        let r = host.activate();
        assert_eq!(r.outcome, Some(Outcome::Committed), "{src}: {r:?}");
        assert_eq!(r.digest, Some(subjects[1].digest), "{src}");
        machine = if machine == "kube1" { "kube2" } else { "kube1" };
        assert_eq!(
            fs::read_to_string(host.root.machine_tree(machine).join("etc/version")).unwrap(),
            how,
            "{src}: {machine} runs it"
        );
        assert!(host
            .fake
            .active_units()
            .contains(&format!("systemd-nspawn@{machine}.service")));
    }
}

#[test]
fn either_format_alone_is_enough() {
    let sigstore = TestSigstore::new();
    let work = tempfile::tempdir().unwrap();
    let host = KeylessHost::new(&sigstore);
    let repository = "registry.example/kubeslot/keyless-node";
    for (legacy, bundle) in [(true, false), (false, true)] {
        let dir = work.path().join(format!("legacy-{legacy}"));
        let (subjects, _) = node_image(&dir, &format!("legacy-{legacy}"));
        let mut spec = SignSpec::new(Workflow::example(), repository);
        (spec.legacy, spec.bundle) = (legacy, bundle);
        // only the platform manifest signed, as cosign signs one digest
        sigstore
            .sign(&subjects[1..], &spec)
            .attach(&Layout::open(&dir).unwrap());
        host.configure(&format!("oci:{}:v1", dir.display()), repository, json!({}));
        let r = host.activate();
        assert_eq!(
            r.outcome,
            Some(Outcome::Committed),
            "legacy {legacy}: {r:?}"
        );
    }
}

#[test]
fn each_mutation_of_the_test_instance_s_material_is_refused_naming_why() {
    let sigstore = TestSigstore::new();
    let reg = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let host = KeylessHost::new(&sigstore);
    let repository = format!("{}/{NODE_REPO}", reg.host());
    let spec = SignSpec::new(Workflow::example(), &repository);
    let identity = Workflow::example().identity();
    let refused = |src: &str, layer: &Digest, says: &[&str], what: &str| {
        let r = host.activate();
        let e = r.error.clone().unwrap_or_default();
        assert_eq!(r.outcome, Some(Outcome::Failed), "{what}: {src}: {r:?}");
        assert!(
            e.contains("refused by the trust policy"),
            "{what}: {src}: {e}"
        );
        for s in says {
            assert!(e.contains(s), "{what}: {src}: {s:?} not in {e}");
        }
        host.assert_nothing_staged(layer, &format!("{what}: {src}"));
    };
    for m in Mutation::ALL {
        let dir = work.path().join(m.name());
        let (subjects, layer) = node_image(&dir, m.name());
        let material = sigstore.sign_mutated(&subjects, &spec, m);
        for src in serve(&reg, &dir, &format!("keyless/{}", m.name()), &material) {
            host.configure(&src, &repository, json!({}));
            refused(&src, &layer, m.says(), m.name());
            // the refusal names the certificate (the other instance's leaf
            // names the same workflow) and its issuer
            let e = host.activate().error.unwrap_or_default();
            assert!(
                e.contains(&format!("certificate {identity} (issuer {GITHUB_ISSUER})")),
                "{}: {src}: {e}",
                m.name()
            );
        }
    }
    // The pristine material and an unanchored-looking regexp: matched
    // against the whole identity, a part of it matches nothing.
    let dir = work.path().join("pristine");
    let (subjects, layer) = node_image(&dir, "pristine");
    let material = sigstore.sign(&subjects, &spec);
    for src in serve(&reg, &dir, "keyless/pristine", &material) {
        host.configure(
            &src,
            &repository,
            json!({"identity": null, "identity_regexp": "github.com/kubeslot-test/node"}),
        );
        refused(
            &src,
            &layer,
            &["anchored at both ends", &identity],
            "regexp",
        );
    }
    // With SCTs not required, the leaf without one is accepted on the
    // rest: the policy, not a broken leaf, decided its refusal above.
    let dir = work.path().join("no-sct");
    let (subjects, _) = node_image(&dir, "no-sct");
    let material = sigstore.sign_mutated(&subjects, &spec, Mutation::MissingSct);
    let src = serve(&reg, &dir, "keyless/no-sct", &material).remove(1);
    host.configure(&src, &repository, json!({"require_sct": false}));
    let r = host.activate();
    assert_eq!(r.outcome, Some(Outcome::Committed), "{r:?}");
}

/// Issue 40 item 7: keyless verification accepted any in-toto statement
/// of the trusted identity that named the digest: an attestation (say a
/// provenance the same workflow made) counted as a signature. Only
/// cosign's signature predicate does.
#[test]
fn an_attestation_of_the_trusted_identity_is_no_signature() {
    let sigstore = TestSigstore::new();
    let work = tempfile::tempdir().unwrap();
    let host = KeylessHost::new(&sigstore);
    let repository = "registry.example/kubeslot/ubuntu2404";
    let dir = work.path().join("attested");
    let (subjects, layer) = node_image(&dir, "attested");
    let mut spec = SignSpec::new(Workflow::example(), repository);
    (spec.legacy, spec.predicate_type) = (false, "https://slsa.dev/provenance/v1".into());
    sigstore
        .sign(&subjects[1..], &spec)
        .attach(&Layout::open(&dir).unwrap());
    host.configure(&format!("oci:{}:v1", dir.display()), repository, json!({}));
    let r = host.activate();
    let e = r.error.clone().unwrap_or_default();
    assert_eq!(r.outcome, Some(Outcome::Failed), "{r:?}");
    assert!(
        e.contains("https://slsa.dev/provenance/v1") && e.contains("not cosign's signature"),
        "{e}"
    );
    host.assert_nothing_staged(&layer, "an attestation");
}

/// Issue 40 item 7: a bundle whose statement names no repository (cosign
/// 3's `sign`) bound the signature to the identity alone: the workflow
/// that signs `ubuntu2404-nvidia` signs `ubuntu2404` too, so a host of one
/// variant accepted the other. Such a bundle counts only where the config
/// says the identity alone tells the variants apart.
#[test]
fn a_bundle_naming_no_repository_does_not_bind_the_variant() {
    let sigstore = TestSigstore::new();
    let work = tempfile::tempdir().unwrap();
    let host = KeylessHost::new(&sigstore);
    let dir = work.path().join("nvidia");
    let (subjects, layer) = node_image(&dir, "nvidia");
    let mut spec = SignSpec::new(
        Workflow::example(),
        "registry.example/kubeslot/ubuntu2404-nvidia",
    );
    (spec.legacy, spec.subject_named) = (false, false);
    sigstore
        .sign(&subjects[1..], &spec)
        .attach(&Layout::open(&dir).unwrap());
    let src = format!("oci:{}:v1", dir.display());
    host.configure(&src, "registry.example/kubeslot/ubuntu2404", json!({}));
    let r = host.activate();
    let e = r.error.clone().unwrap_or_default();
    assert_eq!(r.outcome, Some(Outcome::Failed), "{r:?}");
    assert!(
        e.contains("names no repository")
            && e.contains("registry.example/kubeslot/ubuntu2404 (trust.identity)")
            && e.contains("allow_unnamed_subject"),
        "{e}"
    );
    host.assert_nothing_staged(&layer, "an unnamed subject");
    // where the operator says the identity alone tells them apart
    host.configure(
        &src,
        "registry.example/kubeslot/ubuntu2404",
        json!({"allow_unnamed_subject": true}),
    );
    let r = host.activate();
    assert_eq!(r.outcome, Some(Outcome::Committed), "{r:?}");
}
