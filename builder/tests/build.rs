//! Black-box tests of `kubeslot-builder build` and `check`: the real binary
//! on the offline demo recipe, read back with real `skopeo` and `umoci`.
//! The shipped recipes' own checks (read, not built) are in `recipes`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kubeslot_test_support::golden;
use kubeslot_test_support::tar::sha256_hex;
use kubeslot_test_support::{require_tool, workspace_root};

mod recipes;

const TAG: &str = "1.36.4-demo";

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kubeslot-builder"));
    c.arg("--progress").arg("quiet");
    c
}

fn demo() -> PathBuf {
    workspace_root().join("testdata/recipes/demo.toml")
}

/// The demo recipe's text with its relative paths made absolute, so a
/// variant can be written anywhere.
fn demo_text() -> String {
    let demo_dir = workspace_root().join("testdata/demo");
    std::fs::read_to_string(demo())
        .unwrap()
        .replace("\"../demo/", &format!("\"{}/", demo_dir.display()))
}

fn write_recipe(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("recipe.toml");
    std::fs::write(&p, text).unwrap();
    p
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("run kubeslot-builder")
}

fn ok(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "command failed: {cmd:?}\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn fails(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(!out.status.success(), "command succeeded: {cmd:?}");
    String::from_utf8(out.stderr).unwrap()
}

fn last_line(s: &str) -> String {
    s.lines().last().unwrap_or_default().to_string()
}

/// Builds `recipe` into `oci:<dir>/out` with its own cache; returns the index digest.
fn build(recipe: &Path, dir: &Path, extra: &[&str]) -> String {
    let out = ok(bin()
        .arg("--cache")
        .arg(dir.join("cache"))
        .arg("build")
        .arg(recipe)
        .arg("--output")
        .arg(format!("oci:{}", dir.join("out").display()))
        .args(extra));
    let digest = last_line(&out);
    assert!(digest.starts_with("sha256:") && digest.len() == 71, "{out}");
    digest
}

fn json_summary(recipe: &Path, dir: &Path) -> serde_json::Value {
    let out = ok(bin()
        .arg("--json")
        .arg("--cache")
        .arg(dir.join("cache"))
        .arg("build")
        .arg(recipe)
        .arg("--output")
        .arg(format!("oci:{}", dir.join("out").display())));
    serde_json::from_str(&out).unwrap()
}

/// A file the recipe bakes below a path the base has as a symlink (the
/// demo base's `/bin -> usr/bin`) would replace the symlink with a
/// directory: the build refuses, naming the recipe, the layer, the platform
/// and the entry, and writes no output.
#[test]
fn a_file_below_a_base_symlink_is_refused_naming_recipe_layer_and_entry() {
    let t = tempfile::tempdir().unwrap();
    let text = demo_text().replace(
        "[[files]]\npath = \"/etc/modules-load.d/kubernetes.conf\"",
        "[[files]]\npath = \"/bin/kubeslot-extra\"\ncontent = \"x\"\ngroup = \"config\"\n\n\
         [[files]]\npath = \"/etc/modules-load.d/kubernetes.conf\"",
    );
    assert!(text.contains("/bin/kubeslot-extra"), "demo recipe changed");
    let recipe = write_recipe(t.path(), &text);
    let out = t.path().join("out");
    let err = fails(
        bin()
            .arg("--cache")
            .arg(t.path().join("cache"))
            .arg("build")
            .arg(&recipe)
            .arg("--output")
            .arg(format!("oci:{}", out.display())),
    );
    for want in [
        format!("{}: layer config (linux/", recipe.display()),
        "/bin/kubeslot-extra".to_string(),
        "/bin is a symlink in the base".to_string(),
    ] {
        assert!(err.contains(&want), "no {want:?} in:\n{err}");
    }
    assert!(!out.exists(), "output written after a refused build");
}

#[test]
fn demo_builds_are_reproducible_across_dirs_caches_and_outputs() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let da = build(&demo(), a.path(), &[]);
    let db = build(&demo(), b.path(), &[]);
    assert_eq!(da, db, "two builds of the demo differ");
    // An oci-archive holds the same image, byte for byte.
    let archive = b.path().join("demo.tar");
    let out = ok(bin()
        .arg("--cache")
        .arg(a.path().join("cache"))
        .arg("build")
        .arg(demo())
        .arg("--output")
        .arg(format!("oci-archive:{}", archive.display())));
    assert_eq!(last_line(&out), da);
    require_tool("skopeo", "skopeo");
    let inspect = Command::new("skopeo")
        .arg("inspect")
        .arg("--raw")
        .arg(format!("oci-archive:{}:{TAG}", archive.display()))
        .output()
        .unwrap();
    assert!(
        inspect.status.success(),
        "{}",
        String::from_utf8_lossy(&inspect.stderr)
    );
    let raw: serde_json::Value = serde_json::from_slice(&inspect.stdout).unwrap();
    assert_eq!(raw["mediaType"], "application/vnd.oci.image.index.v1+json");
    assert_eq!(raw["manifests"].as_array().unwrap().len(), 2);
    // The output's tag names the image; it is not part of it: the same
    // recipe written as `:v1` is the same image, found under that tag.
    let tagged = b.path().join("tagged.tar");
    let out = ok(bin()
        .arg("--cache")
        .arg(a.path().join("cache"))
        .arg("build")
        .arg(demo())
        .arg("--output")
        .arg(format!("oci-archive:{}:v1", tagged.display())));
    assert_eq!(last_line(&out), da, "the output tag changed the image");
    let inspect = Command::new("skopeo")
        .arg("inspect")
        .arg("--raw")
        .arg(format!("oci-archive:{}:v1", tagged.display()))
        .output()
        .unwrap();
    assert!(
        inspect.status.success(),
        "{}",
        String::from_utf8_lossy(&inspect.stderr)
    );
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&inspect.stdout).unwrap(),
        raw
    );
}

#[test]
fn umoci_unpacks_the_expected_tree_and_skopeo_reads_it() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    require_tool("skopeo", "skopeo");
    require_tool("umoci", "umoci");
    let t = tempfile::tempdir().unwrap();
    let index = build(&demo(), t.path(), &[]);
    let layout = t.path().join("out");

    let inspect = Command::new("skopeo")
        .arg("inspect")
        .arg(format!("oci:{}:{TAG}", layout.display()))
        .output()
        .unwrap();
    assert!(
        inspect.status.success(),
        "{}",
        String::from_utf8_lossy(&inspect.stderr)
    );
    let info: serde_json::Value = serde_json::from_slice(&inspect.stdout).unwrap();
    // base, kubernetes, runtime, config + the SBOM layer (publishing)
    assert_eq!(info["Layers"].as_array().unwrap().len(), 5, "{info}");
    assert_eq!(info["Created"], "2023-11-14T22:13:20Z");
    let raw = Command::new("skopeo")
        .arg("inspect")
        .arg("--raw")
        .arg(format!("oci:{}:{TAG}", layout.display()))
        .output()
        .unwrap();
    let raw_digest = format!("sha256:{}", sha256_hex(&raw.stdout));
    assert_eq!(
        raw_digest, index,
        "skopeo sees the index the builder reported"
    );

    // umoci 0.4 cannot unpack through an index: skopeo picks this host's
    // manifest into a single-image layout first (blobs are copied as-is).
    let single = t.path().join("single");
    let copy = Command::new("skopeo")
        .arg("copy")
        .arg("-q")
        .arg(format!("oci:{}:{TAG}", layout.display()))
        .arg(format!("oci:{}:node", single.display()))
        .output()
        .unwrap();
    assert!(
        copy.status.success(),
        "{}",
        String::from_utf8_lossy(&copy.stderr)
    );
    let bundle = t.path().join("bundle");
    let unpack = Command::new("umoci")
        .arg("unpack")
        .arg("--image")
        .arg(format!("{}:node", single.display()))
        .arg(&bundle)
        .output()
        .unwrap();
    assert!(
        unpack.status.success(),
        "{}",
        String::from_utf8_lossy(&unpack.stderr)
    );
    let root = bundle.join("rootfs");
    let mode = |p: &str| {
        std::fs::symlink_metadata(root.join(p))
            .unwrap_or_else(|e| panic!("{p}: {e}"))
            .permissions()
            .mode()
            & 0o7777
    };
    for exe in [
        "usr/local/bin/kubelet",
        "usr/local/bin/kubectl",
        "usr/local/bin/containerd",
        "usr/local/bin/containerd-shim-runc-v2",
        "usr/local/bin/ctr",
        "usr/local/bin/crictl",
        "usr/local/sbin/runc",
        "opt/cni/bin/bridge",
        "opt/cni/bin/host-local",
        "opt/cni/bin/loopback",
    ] {
        assert_eq!(mode(exe), 0o755, "{exe}");
    }
    let kubelet = std::fs::read_to_string(root.join("usr/local/bin/kubelet")).unwrap();
    assert!(kubelet.contains("kubelet version v1.36.4"), "{kubelet}");
    assert_eq!(mode("usr/bin/su"), 0o4755, "setuid bit survives");
    assert_eq!(mode("tmp"), 0o1777, "sticky bit survives");
    assert_eq!(mode("etc/containerd/config.toml"), 0o644);
    assert_eq!(
        std::fs::read_to_string(root.join("etc/modules-load.d/kubernetes.conf")).unwrap(),
        "overlay\nbr_netfilter\n"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("etc/systemd/system/containerd.service")).unwrap(),
        std::fs::read_to_string(workspace_root().join("testdata/demo/files/containerd.service"))
            .unwrap()
    );
    for unit in ["containerd.service", "kubelet.service"] {
        let link = root
            .join("etc/systemd/system/multi-user.target.wants")
            .join(unit);
        assert_eq!(
            std::fs::read_link(&link).unwrap(),
            PathBuf::from(format!("/etc/systemd/system/{unit}"))
        );
    }
    assert_eq!(
        std::fs::read_link(root.join("bin")).unwrap(),
        PathBuf::from("usr/bin")
    );
    let sh = std::fs::metadata(root.join("usr/bin/sh")).unwrap();
    let dash = std::fs::metadata(root.join("usr/bin/dash")).unwrap();
    assert_eq!(sh.ino(), dash.ino(), "hard link kept");
    assert_eq!(
        std::fs::metadata(root.join("etc/passwd")).unwrap().mtime(),
        1_700_000_000,
        "mtime clamped to source_date_epoch"
    );
}

#[test]
fn tampered_artifact_fails_naming_url_and_digests_and_writes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let mirror = t.path().join("mirror");
    copy_dir(&workspace_root().join("testdata/demo/mirror"), &mirror);
    let kubelet = mirror.join("release/v1.36.4/bin/linux/arm64/kubelet");
    std::fs::write(&kubelet, b"#!/bin/sh\necho evil\n").unwrap();
    let err = fails(
        bin()
            .arg("--cache")
            .arg(t.path().join("cache"))
            .arg("build")
            .arg(demo())
            .arg("--output")
            .arg(format!("oci:{}", t.path().join("out").display()))
            .arg("--download-base")
            .arg(format!("file://{}", mirror.display())),
    );
    assert!(err.contains("sha256 mismatch"), "{err}");
    assert!(
        err.contains(&format!("file://{}", kubelet.display())),
        "{err}"
    );
    assert!(
        err.contains("sha256:1cb573244372b2d895f644791bac484f81ef978cc900fb1593c66cfa8b2b3cd4"),
        "expected digest named: {err}"
    );
    assert!(
        err.contains(&format!("sha256:{}", sha256_hex(b"#!/bin/sh\necho evil\n"))),
        "actual digest named: {err}"
    );
    assert_no_output(t.path());
    // The bad download is not in the cache.
    let cached: Vec<_> = std::fs::read_dir(t.path().join("cache/sha256"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        !cached.iter().any(|n| n.starts_with('.')),
        "partial files left: {cached:?}"
    );
    assert!(!cached.contains(&sha256_hex(b"#!/bin/sh\necho evil\n")));
}

fn assert_no_output(dir: &Path) {
    let names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != "cache" && n != "mirror" && n != "recipe.toml")
        .collect();
    assert!(names.is_empty(), "output or staging left behind: {names:?}");
}

fn copy_dir(from: &Path, to: &Path) {
    let st = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(st.success());
}

#[test]
fn missing_pin_is_refused_before_any_download() {
    let t = tempfile::tempdir().unwrap();
    let text = demo_text().replace(
        "sha256 = { amd64 = \"sha256:35c00e04e2a23baaf9e44b68efd4f97d4b3cd57b219fd924174c13321472e135\", arm64 = \"sha256:1cb573244372b2d895f644791bac484f81ef978cc900fb1593c66cfa8b2b3cd4\" }",
        "sha256 = { amd64 = \"sha256:35c00e04e2a23baaf9e44b68efd4f97d4b3cd57b219fd924174c13321472e135\" }",
    );
    assert_ne!(
        text,
        demo_text(),
        "the kubelet pins line changed; update this test"
    );
    let recipe = write_recipe(t.path(), &text);
    let check = fails(bin().arg("check").arg(&recipe));
    let dry = fails(
        bin()
            .arg("--cache")
            .arg(t.path().join("cache"))
            .arg("build")
            .arg(&recipe)
            .arg("--dry-run"),
    );
    for err in [check, dry] {
        assert!(err.contains("components.kubelet.sha256.arm64"), "{err}");
        assert!(err.contains(&recipe.display().to_string()), "{err}");
        assert!(err.contains("linux/arm64"), "{err}");
    }
    let err = fails(
        bin()
            .arg("--cache")
            .arg(t.path().join("cache"))
            .arg("build")
            .arg(&recipe)
            .arg("--output")
            .arg(format!("oci:{}", t.path().join("out").display())),
    );
    assert!(err.contains("components.kubelet.sha256.arm64"), "{err}");
    assert!(
        !t.path().join("cache").exists(),
        "nothing may be downloaded"
    );
    assert_no_output(t.path());
}

#[test]
fn unknown_field_names_file_line_and_field() {
    let t = tempfile::tempdir().unwrap();
    let text = demo_text().replace(
        "[components.runc]\n",
        "[components.runc]\ncolour = \"red\"\n",
    );
    let recipe = write_recipe(t.path(), &text);
    let line = text.lines().position(|l| l.starts_with("colour")).unwrap() + 1;
    let err = fails(bin().arg("check").arg(&recipe));
    assert!(err.contains(&recipe.display().to_string()), "{err}");
    assert!(err.contains("colour"), "{err}");
    assert!(err.contains(&format!("line {line}")), "{err}");
    let err = fails(
        bin()
            .arg("--cache")
            .arg(t.path().join("cache"))
            .arg("build")
            .arg(&recipe)
            .arg("--output")
            .arg(format!("oci:{}", t.path().join("out").display())),
    );
    assert!(err.contains("colour"), "{err}");
    assert_no_output(t.path());
}

#[test]
fn image_base_is_checked_against_its_pinned_digest() {
    let t = tempfile::tempdir().unwrap();
    let base_index = build(&demo(), t.path(), &[]);
    let base_layout = t.path().join("out");
    let derived =
        |digest: &str| derived_recipe(&format!("oci:{}:{TAG}", base_layout.display()), digest);
    let wrong = "sha256:0000000000000000000000000000000000000000000000000000000000000001";
    let w = tempfile::tempdir().unwrap();
    let recipe = write_recipe(w.path(), &derived(wrong));
    let err = fails(
        bin()
            .arg("--cache")
            .arg(w.path().join("cache"))
            .arg("build")
            .arg(&recipe)
            .arg("--output")
            .arg(format!("oci:{}", w.path().join("out").display())),
    );
    assert!(err.contains("digest mismatch"), "{err}");
    assert!(err.contains(wrong) && err.contains(&base_index), "{err}");
    assert!(err.contains(&base_layout.display().to_string()), "{err}");
    assert_no_output(w.path());

    let recipe = write_recipe(w.path(), &derived(&base_index));
    let summary = json_summary(&recipe, w.path());
    let amd = &summary["manifests"][0]["layers"];
    assert_eq!(
        amd.as_array().unwrap().len(),
        7,
        "5 base layers (4 + the base's SBOM) + 1 + this image's SBOM: {summary}"
    );
    let base = json_summary(&demo(), t.path());
    for i in 0..4 {
        assert_eq!(
            amd[i]["digest"],
            base["manifests"][0]["layers"][i]["digest"]
        );
    }
}

#[test]
fn kubelet_bump_changes_only_the_kubernetes_layer() {
    let t = tempfile::tempdir().unwrap();
    let before = json_summary(&demo(), t.path());
    let text = demo_text()
        .replace(
            "[components.kubelet]\nversion = \"1.36.4\"",
            "[components.kubelet]\nversion = \"1.36.3\"",
        )
        .replace(
            "sha256:35c00e04e2a23baaf9e44b68efd4f97d4b3cd57b219fd924174c13321472e135",
            "sha256:915cea692b750b3cc38146217b51ac1215e7cf68dd42f2e4a1827ecbef65b0c7",
        )
        .replace(
            "sha256:1cb573244372b2d895f644791bac484f81ef978cc900fb1593c66cfa8b2b3cd4",
            "sha256:b53b05ac54ebfe546d6e4c53962344f3bfca99e066db913c9a9a65f8cd52476b",
        );
    let b = tempfile::tempdir().unwrap();
    let recipe = write_recipe(b.path(), &text);
    let after = json_summary(&recipe, b.path());
    assert_ne!(before["index"], after["index"]);
    for m in 0..2 {
        let (l0, l1) = (
            &before["manifests"][m]["layers"],
            &after["manifests"][m]["layers"],
        );
        let groups = |l: &serde_json::Value| -> Vec<String> {
            l.as_array()
                .unwrap()
                .iter()
                .map(|x| x["group"].as_str().unwrap().to_string())
                .collect()
        };
        // every layer is compared: the recipe's groups, then the SBOM
        assert_eq!(
            groups(l0),
            ["base", "runtime", "kubernetes", "config", "sbom"],
            "{l0}"
        );
        assert_eq!(groups(l0), groups(l1));
        for (i, group) in groups(l0).iter().enumerate() {
            // the SBOM names kubelet's version and sha256, so it changes
            // with it (docs/decisions/builder.md: the SBOM is its own last layer)
            if group == "kubernetes" || group == "sbom" {
                assert_ne!(
                    l0[i]["digest"], l1[i]["digest"],
                    "{group} layer must change"
                );
            } else {
                assert_eq!(l0[i]["digest"], l1[i]["digest"], "{group} layer changed");
            }
        }
    }
}

#[test]
fn dry_run_prints_the_plan_and_writes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let out = ok(bin()
        .arg("--cache")
        .arg(t.path().join("cache"))
        .arg("build")
        .arg(demo())
        .arg("--output")
        .arg(format!("oci:{}", t.path().join("out").display()))
        .arg("--dry-run"));
    assert!(
        out.contains("upstream https://dl.k8s.io/release/v1.36.4/bin/linux/arm64/kubelet"),
        "{out}"
    );
    assert!(
        out.contains("sha256:1cb573244372b2d895f644791bac484f81ef978cc900fb1593c66cfa8b2b3cd4"),
        "{out}"
    );
    assert!(
        out.contains("layer kubernetes: kubectl 1.36.4, kubelet 1.36.4"),
        "{out}"
    );
    assert_eq!(last_line(&out), "dry run: nothing downloaded or written");
    assert!(std::fs::read_dir(t.path()).unwrap().next().is_none());
}

#[test]
fn an_existing_layout_gets_the_image_added() {
    let t = tempfile::tempdir().unwrap();
    let first = build(&demo(), t.path(), &[]);
    let layout = t.path().join("out");
    let out = ok(bin()
        .arg("--cache")
        .arg(t.path().join("cache"))
        .arg("build")
        .arg(demo())
        .arg("--output")
        .arg(format!("oci:{}:second", layout.display()))
        .arg("--annotation")
        .arg("org.opencontainers.image.revision=abc123"));
    let second = last_line(&out);
    assert_ne!(
        first, second,
        "a different tag and annotation make a different index"
    );
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let refs: Vec<(String, String)> = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        // the `sha256-<hex>.sbom` attachments (publishing) are not images
        .filter(|m| {
            !m["annotations"]["org.opencontainers.image.ref.name"]
                .as_str()
                .unwrap()
                .starts_with("sha256-")
        })
        .map(|m| {
            (
                m["annotations"]["org.opencontainers.image.ref.name"]
                    .as_str()
                    .unwrap()
                    .to_string(),
                m["digest"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        refs,
        vec![(TAG.to_string(), first), ("second".to_string(), second)]
    );
}

#[test]
fn a_local_http_mirror_serves_the_same_pinned_bytes() {
    let python = require_tool("python3", "python3");
    let t = tempfile::tempdir().unwrap();
    let port = kubeslot_test_support::free_port();
    let mut server = Command::new(python)
        .args(["-m", "http.server", "--bind", "127.0.0.1"])
        .arg(port.to_string())
        .arg("--directory")
        .arg(workspace_root().join("testdata/demo/mirror"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait for the port (not a timed assertion: the build below fails
    // clearly if the server never came up).
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let from_http = build(
        &demo(),
        t.path(),
        &["--download-base", &format!("http://127.0.0.1:{port}")],
    );
    // A missing file is reported with its URL and status, not retried
    // forever. (A fresh cache: the pinned kubelet is already in the other
    // one, and a cached input is never fetched again.)
    let missing = format!("http://127.0.0.1:{port}/no/such/kubelet");
    let err = fails(
        bin()
            .arg("--cache")
            .arg(t.path().join("cache-empty"))
            .arg("build")
            .arg(demo())
            .arg("--output")
            .arg(format!("oci:{}", t.path().join("out2").display()))
            .arg("--download-override")
            .arg(format!("kubelet={missing}")),
    );
    assert!(err.contains(&missing) && err.contains("404"), "{err}");
    assert!(!t.path().join("out2").exists());
    let _ = server.kill();
    let _ = server.wait();
    let f = tempfile::tempdir().unwrap();
    assert_eq!(from_http, build(&demo(), f.path(), &[]));
}

/// A derived recipe on top of `image` pinned at `digest`: one file layer.
fn derived_recipe(image: &str, digest: &str) -> String {
    format!(
        r#"name = "derived"
tag = "1"
platforms = ["linux/amd64", "linux/arm64"]
source_date_epoch = 1700000000
[base]
kind = "image"
image = "{image}"
digest = "{digest}"
[[files]]
path = "/etc/derived"
content = "yes\n"
group = "extra"
[[layers]]
group = "base"
[[layers]]
group = "extra"
"#
    )
}

#[test]
fn image_bases_from_an_archive_and_a_registry_give_the_same_image() {
    require_tool("skopeo", "skopeo");
    let t = tempfile::tempdir().unwrap();
    let base_index = build(&demo(), t.path(), &[]);
    let layout = t.path().join("out");
    let from_layout = {
        let w = tempfile::tempdir().unwrap();
        let r = write_recipe(
            w.path(),
            &derived_recipe(&format!("oci:{}:{TAG}", layout.display()), &base_index),
        );
        build(&r, w.path(), &[])
    };

    let archive = t.path().join("base.tar");
    ok(bin()
        .arg("--cache")
        .arg(t.path().join("cache"))
        .arg("build")
        .arg(demo())
        .arg("--output")
        .arg(format!("oci-archive:{}", archive.display())));
    let w = tempfile::tempdir().unwrap();
    let r = write_recipe(
        w.path(),
        &derived_recipe(
            &format!("oci-archive:{}:{TAG}", archive.display()),
            &base_index,
        ),
    );
    assert_eq!(build(&r, w.path(), &[]), from_layout);

    let registry = kubeslot_test_support::Registry::start();
    let push = Command::new("skopeo")
        .args([
            "copy",
            "-q",
            "--all",
            "--preserve-digests",
            "--dest-tls-verify=false",
        ])
        .arg(format!("oci:{}:{TAG}", layout.display()))
        .arg(format!("docker://{}/kubeslot/demo:{TAG}", registry.host()))
        .output()
        .unwrap();
    assert!(
        push.status.success(),
        "{}",
        String::from_utf8_lossy(&push.stderr)
    );
    let w = tempfile::tempdir().unwrap();
    let r = write_recipe(
        w.path(),
        &derived_recipe(
            &format!("{}/kubeslot/demo:{TAG}", registry.host()),
            &base_index,
        ),
    );
    assert_eq!(build(&r, w.path(), &[]), from_layout);

    // The same registry image pinned at another digest is refused.
    let wrong = "sha256:0000000000000000000000000000000000000000000000000000000000000002";
    let r = write_recipe(
        w.path(),
        &derived_recipe(&format!("{}/kubeslot/demo:{TAG}", registry.host()), wrong),
    );
    let err = fails(
        bin()
            .arg("--cache")
            .arg(w.path().join("cache2"))
            .arg("build")
            .arg(&r)
            .arg("--output")
            .arg(format!("oci:{}", w.path().join("out2").display())),
    );
    assert!(err.contains(wrong), "{err}");
    assert!(!w.path().join("out2").exists());
}

/// What the world sees of the demo: its amd64 manifest and config, pretty-printed.
#[test]
fn demo_documents_snapshot() {
    let t = tempfile::tempdir().unwrap();
    let summary = json_summary(&demo(), t.path());
    let blobs = t.path().join("out/blobs/sha256");
    let read = |digest: &str| -> serde_json::Value {
        let hex = digest.strip_prefix("sha256:").unwrap();
        serde_json::from_slice(&std::fs::read(blobs.join(hex)).unwrap()).unwrap()
    };
    let manifest = read(summary["manifests"][0]["digest"].as_str().unwrap());
    let config = read(manifest["config"]["digest"].as_str().unwrap());
    golden::check(
        "golden/demo-amd64-manifest.json",
        &(serde_json::to_string_pretty(&manifest).unwrap() + "\n"),
    );
    golden::check(
        "golden/demo-amd64-config.json",
        &(serde_json::to_string_pretty(&config).unwrap() + "\n"),
    );
}

#[test]
fn an_empty_output_directory_is_filled_and_a_foreign_one_refused() {
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir(t.path().join("out")).unwrap();
    let digest = build(&demo(), t.path(), &[]);
    assert!(t.path().join("out/index.json").is_file(), "{digest}");

    let foreign = t.path().join("foreign");
    std::fs::create_dir(&foreign).unwrap();
    std::fs::write(foreign.join("notes.txt"), "keep me").unwrap();
    let err = fails(
        bin()
            .arg("--cache")
            .arg(t.path().join("cache"))
            .arg("build")
            .arg(demo())
            .arg("--output")
            .arg(format!("oci:{}", foreign.display())),
    );
    assert!(err.contains("not an OCI image layout"), "{err}");
    let left: Vec<_> = std::fs::read_dir(&foreign)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("notes.txt")]);
    let stray: Vec<String> = std::fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(stray.is_empty(), "staging left behind: {stray:?}");
}

#[test]
fn zstd_layers_are_reproducible_and_readable_by_skopeo() {
    require_tool("skopeo", "skopeo");
    let text = demo_text().replace("compression = \"gzip\"", "compression = \"zstd\"");
    assert_ne!(text, demo_text());
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let ra = write_recipe(a.path(), &text);
    let rb = write_recipe(b.path(), &text);
    let sa = json_summary(&ra, a.path());
    let sb = json_summary(&rb, b.path());
    assert_eq!(sa["index"], sb["index"]);
    let gzip = json_summary(&demo(), tempfile::tempdir().unwrap().path());
    for i in 0..4 {
        let (z, g) = (
            &sa["manifests"][0]["layers"][i],
            &gzip["manifests"][0]["layers"][i],
        );
        assert_eq!(
            z["media_type"],
            "application/vnd.oci.image.layer.v1.tar+zstd"
        );
        assert_eq!(
            z["diff_id"], g["diff_id"],
            "same tar under both compressions"
        );
    }
    let inspect = Command::new("skopeo")
        .arg("inspect")
        .arg(format!("oci:{}:{TAG}", a.path().join("out").display()))
        .output()
        .unwrap();
    assert!(
        inspect.status.success(),
        "{}",
        String::from_utf8_lossy(&inspect.stderr)
    );
}

#[test]
fn leftovers_of_a_killed_build_are_swept_and_live_ones_kept() {
    let t = tempfile::tempdir().unwrap();
    // A pid that certainly ran and is gone, and one that runs.
    let mut dead = Command::new("true").spawn().unwrap();
    dead.wait().unwrap();
    let mut live = Command::new("sleep").arg("60").spawn().unwrap();
    let stale_dir = t
        .path()
        .join(format!(".node.kubeslot-{}-AbC123", dead.id()));
    let stale_tmp = t
        .path()
        .join(format!(".node.tar.kubeslot-{}-XyZ789", dead.id()));
    let busy_dir = t
        .path()
        .join(format!(".node.kubeslot-{}-Busy00", live.id()));
    let other = t
        .path()
        .join(format!(".other.kubeslot-{}-AbC123", dead.id()));
    for d in [&stale_dir, &busy_dir, &other] {
        std::fs::create_dir_all(d.join("blobs/sha256")).unwrap();
        std::fs::write(d.join("blobs/sha256/partial"), b"half a layer").unwrap();
    }
    std::fs::write(&stale_tmp, b"half an archive").unwrap();

    let out = run(bin()
        .arg("--cache")
        .arg(t.path().join("cache"))
        .arg("build")
        .arg(demo())
        .arg("--output")
        .arg(format!("oci:{}", t.path().join("node").display())));
    let _ = live.kill();
    let _ = live.wait();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stale_dir.exists(), "stale staging dir kept: {stderr}");
    assert!(
        stderr.contains(&format!(
            "{}: left by a build (pid {})",
            stale_dir.display(),
            dead.id()
        )),
        "{stderr}"
    );
    assert!(busy_dir.exists(), "a live build's staging dir was removed");
    assert!(other.exists(), "another output's staging dir was removed");
    // The archive's temp file is swept by a build that writes that archive.
    assert!(stale_tmp.exists());
    ok(bin()
        .arg("--cache")
        .arg(t.path().join("cache"))
        .arg("build")
        .arg(demo())
        .arg("--output")
        .arg(format!(
            "oci-archive:{}",
            t.path().join("node.tar").display()
        )));
    assert!(!stale_tmp.exists(), "stale archive temp file kept");
}

/// Without a terminal (CI logs) progress is one plain line per finished task
/// on stderr: each download (then `cached` on a rebuild) and each layer, per
/// platform; stdout stays the report whose last line is the index digest.
#[test]
fn progress_is_plain_lines_on_stderr_without_a_terminal() {
    let t = tempfile::tempdir().unwrap();
    let run_build = |out: &str| {
        // no `--progress`: `auto`, and stderr is a pipe here
        let o = run(Command::new(env!("CARGO_BIN_EXE_kubeslot-builder"))
            .arg("--cache")
            .arg(t.path().join("cache"))
            .arg("build")
            .arg(demo())
            .arg("--output")
            .arg(format!("oci:{}", t.path().join(out).display())));
        assert!(o.status.success(), "{o:?}");
        (
            String::from_utf8(o.stdout).unwrap(),
            String::from_utf8(o.stderr).unwrap(),
        )
    };
    let (stdout, stderr) = run_build("a");
    for platform in ["linux/amd64", "linux/arm64"] {
        for line in [
            format!("fetch kubelet 1.36.4 {platform}: done ("),
            format!("fetch containerd 2.3.4 {platform}: done ("),
            format!("fetch base rootfs {platform}: done ("),
            format!("layer kubernetes {platform}: done ("),
            format!("layer base {platform}: done ("),
        ] {
            assert!(
                stderr.lines().any(|l| l.starts_with(&line)),
                "no `{line}` line on stderr:\n{stderr}"
            );
        }
    }
    assert!(
        !stderr.contains('\r') && !stderr.contains('\x1b'),
        "{stderr:?}"
    );
    assert!(
        !stdout.contains(": done ("),
        "progress on stdout:\n{stdout}"
    );
    let digest = last_line(&stdout);
    assert!(
        digest.starts_with("sha256:") && digest.len() == 71,
        "{stdout}"
    );
    // A rebuild with the same cache downloads nothing and says so.
    let (stdout2, stderr2) = run_build("b");
    assert_eq!(last_line(&stdout2), digest);
    assert!(
        stderr2
            .lines()
            .any(|l| l.starts_with("cached kubelet 1.36.4 linux/amd64: cached")),
        "{stderr2}"
    );
    assert!(!stderr2.contains("fetch "), "{stderr2}");
}

/// What a build writes is for others to read (a web server serving the
/// layout, a host handed the archive): files get 0644 under umask 022, like
/// any other tool's output, not the 0600 of a private temp file.
#[test]
fn outputs_are_readable_by_other_users() {
    use std::os::unix::fs::PermissionsExt as _;
    let t = tempfile::tempdir().unwrap();
    let archive = t.path().join("node.tar");
    for output in [
        format!("oci:{}", t.path().join("out").display()),
        format!("oci-archive:{}", archive.display()),
    ] {
        // the umask this test runs under is not ours to assume
        ok(Command::new("sh")
            .arg("-c")
            .arg("umask 022 && exec \"$@\"")
            .arg("sh")
            .arg(env!("CARGO_BIN_EXE_kubeslot-builder"))
            .args(["--progress", "quiet", "--cache"])
            .arg(t.path().join("cache"))
            .arg("build")
            .arg(demo())
            .arg("--output")
            .arg(output));
    }
    let mut files = vec![archive];
    let layout = t.path().join("out");
    files.push(layout.join("index.json"));
    files.push(layout.join("oci-layout"));
    for e in std::fs::read_dir(layout.join("blobs/sha256")).unwrap() {
        files.push(e.unwrap().path());
    }
    assert!(files.len() > 10, "{files:?}");
    for f in files {
        let mode = std::fs::metadata(&f).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644, "{}", f.display());
    }
}

/// The members of the layers of `tag`'s `arch` manifest in the layout at
/// `dir`, by path (later layers win), as bytes.
fn layer_files(dir: &Path, tag: &str, arch: &str) -> std::collections::BTreeMap<String, Vec<u8>> {
    use std::io::Read as _;
    let blob = |d: &str| {
        dir.join("blobs/sha256")
            .join(d.trim_start_matches("sha256:"))
    };
    let json = |d: &str| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(blob(d)).unwrap()).unwrap()
    };
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("index.json")).unwrap()).unwrap();
    let top = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .expect("tag in index.json");
    let image_index = json(top["digest"].as_str().unwrap());
    let manifest = image_index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["platform"]["architecture"] == arch)
        .unwrap();
    let manifest = json(manifest["digest"].as_str().unwrap());
    let mut out = std::collections::BTreeMap::new();
    for l in manifest["layers"].as_array().unwrap() {
        let f = std::fs::File::open(blob(l["digest"].as_str().unwrap())).unwrap();
        let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(f));
        for e in ar.entries().unwrap() {
            let mut e = e.unwrap();
            let path = e.path().unwrap().to_string_lossy().into_owned();
            let mut bytes = Vec::new();
            e.read_to_end(&mut bytes).unwrap();
            out.insert(path, bytes);
        }
    }
    out
}

/// `[[images]]`: the pinned image (here the two-platform demo image, from
/// a layout and from a registry) is baked per platform as an OCI archive
/// holding that platform's blobs only, named for containerd, next to the
/// `NAME=`/`DIGEST=` file the import unit reads; the same pin from either
/// source gives the same node image; a wrong pin is refused before anything
/// is written.
#[test]
fn images_are_baked_as_per_platform_archives_named_for_containerd() {
    require_tool("skopeo", "skopeo");
    let t = tempfile::tempdir().unwrap();
    let pinned = build(&demo(), t.path(), &[]);
    let layout = t.path().join("out");
    let recipe = |source: &str, digest: &str| {
        derived_recipe(&format!("oci:{}:{TAG}", layout.display()), &pinned)
            + &format!(
                "[[images]]\nname = \"registry.k8s.io/pause:3.10.2\"\nsource = \"{source}\"\ndigest = \"{digest}\"\ngroup = \"extra\"\n"
            )
    };
    let w = tempfile::tempdir().unwrap();
    let r = write_recipe(
        w.path(),
        &recipe(&format!("oci:{}:{TAG}", layout.display()), &pinned),
    );
    let plan = ok(bin().arg("build").arg(&r).arg("--dry-run"));
    assert!(
        plan.contains(&format!("image registry.k8s.io/pause:3.10.2: {pinned}")),
        "{plan}"
    );
    let from_layout = build(&r, w.path(), &[]);

    let stem = "usr/lib/kubeslot/images/registry.k8s.io_pause_3.10.2";
    for arch in ["amd64", "arm64"] {
        let files = layer_files(&w.path().join("out"), "1", arch);
        let meta = String::from_utf8(files[&format!("{stem}.image")].clone()).unwrap();
        assert!(
            meta.contains("NAME='registry.k8s.io/pause:3.10.2'\n")
                && meta.contains(&format!("DIGEST='{pinned}'\n")),
            "{meta}"
        );
        // the archive: skopeo reads it as the pinned image
        let archive = w.path().join(format!("pause-{arch}.tar"));
        std::fs::write(&archive, &files[&format!("{stem}.oci.tar")]).unwrap();
        let raw = Command::new("skopeo")
            .args(["inspect", "--raw"])
            .arg(format!("oci-archive:{}", archive.display()))
            .output()
            .unwrap();
        assert!(
            raw.status.success(),
            "{}",
            String::from_utf8_lossy(&raw.stderr)
        );
        assert_eq!(format!("sha256:{}", sha256_hex(&raw.stdout)), pinned);
        let mut ar = tar::Archive::new(std::fs::File::open(&archive).unwrap());
        let mut names = Vec::new();
        let mut index = Vec::new();
        for e in ar.entries().unwrap() {
            let mut e = e.unwrap();
            let name = e.path().unwrap().to_string_lossy().into_owned();
            if name == "index.json" {
                std::io::Read::read_to_end(&mut e, &mut index).unwrap();
            }
            names.push(name);
        }
        let index: serde_json::Value = serde_json::from_slice(&index).unwrap();
        let entry = &index["manifests"][0];
        assert_eq!(entry["digest"], pinned.as_str());
        assert_eq!(
            entry["annotations"]["io.containerd.image.name"],
            "registry.k8s.io/pause:3.10.2"
        );
        assert_eq!(
            entry["annotations"]["org.opencontainers.image.ref.name"],
            "3.10.2"
        );
        // this platform's blobs only: the index, its manifest, config and
        // layers; not the other platform's manifest
        let demo_index: serde_json::Value = serde_json::from_slice(
            &std::fs::read(
                layout
                    .join("blobs/sha256")
                    .join(pinned.trim_start_matches("sha256:")),
            )
            .unwrap(),
        )
        .unwrap();
        for m in demo_index["manifests"].as_array().unwrap() {
            let digest = m["digest"].as_str().unwrap().trim_start_matches("sha256:");
            let present = names.contains(&format!("blobs/sha256/{digest}"));
            assert_eq!(
                present,
                m["platform"]["architecture"] == arch,
                "{m} in {names:?}"
            );
        }
        let own = layer_files(&layout, TAG, arch);
        assert!(!own.is_empty());
        let blobs = names
            .iter()
            .filter(|n| n.starts_with("blobs/sha256/") && n.len() > 20)
            .count();
        let own_manifest = demo_index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["platform"]["architecture"] == arch)
            .unwrap()["digest"]
            .as_str()
            .unwrap()
            .trim_start_matches("sha256:")
            .to_string();
        let manifest: serde_json::Value = serde_json::from_slice(
            &std::fs::read(layout.join("blobs/sha256").join(&own_manifest)).unwrap(),
        )
        .unwrap();
        let layers = manifest["layers"].as_array().unwrap().len();
        assert_eq!(
            blobs,
            3 + layers,
            "index, manifest, config, layers: {names:?}"
        );
    }

    // the same pin from a registry: the same node image
    let registry = kubeslot_test_support::Registry::start();
    let push = Command::new("skopeo")
        .args([
            "copy",
            "-q",
            "--all",
            "--preserve-digests",
            "--dest-tls-verify=false",
        ])
        .arg(format!("oci:{}:{TAG}", layout.display()))
        .arg(format!("docker://{}/e2e/pause:3.10.2", registry.host()))
        .output()
        .unwrap();
    assert!(
        push.status.success(),
        "{}",
        String::from_utf8_lossy(&push.stderr)
    );
    let w2 = tempfile::tempdir().unwrap();
    let r = write_recipe(
        w2.path(),
        &recipe(&format!("{}/e2e/pause:3.10.2", registry.host()), &pinned),
    );
    assert_eq!(build(&r, w2.path(), &[]), from_layout);

    // a wrong pin: refused, naming it, nothing written
    let wrong = "sha256:0000000000000000000000000000000000000000000000000000000000000003";
    let r = write_recipe(
        w2.path(),
        &recipe(&format!("{}/e2e/pause:3.10.2", registry.host()), wrong),
    );
    let err = fails(
        bin()
            .arg("--cache")
            .arg(w2.path().join("cache"))
            .arg("build")
            .arg(&r)
            .arg("--output")
            .arg(format!("oci:{}", w2.path().join("out2").display())),
    );
    assert!(
        err.contains(wrong) && err.contains("images registry.k8s.io/pause:3.10.2"),
        "{err}"
    );
    assert!(!w2.path().join("out2").exists());

    // names need a tag; a group must be listed
    let text = recipe(&format!("oci:{}:{TAG}", layout.display()), &pinned);
    let last_group = text.rfind("group = \"extra\"").unwrap();
    for (bad, says) in [
        (
            text.replace(
                "name = \"registry.k8s.io/pause:3.10.2\"",
                "name = \"registry.k8s.io/pause\"",
            ),
            "with a tag",
        ),
        (
            format!(
                "{}group = \"nope\"{}",
                &text[..last_group],
                &text[last_group + 15..]
            ),
            "not listed in [[layers]]",
        ),
    ] {
        let r = write_recipe(w2.path(), &bad);
        let err = fails(bin().arg("check").arg(&r));
        assert!(
            err.contains("images[0]") && err.contains(says),
            "{says}: {err}"
        );
    }
}

/// `build --layer-cache DIR`: the base layer re-normalised from a rootfs
/// tarball is kept per platform and taken from there by the next build of
/// the same base; the image is the same bytes with or without the cache,
/// an entry whose blob was damaged is named, dropped and written anew, and
/// another epoch (or compression, or builder) is another entry.
#[test]
fn the_layer_cache_gives_the_same_image_and_replaces_a_damaged_entry() {
    let t = tempfile::tempdir().unwrap();
    let cache = t.path().join("layers");
    let build_with = |recipe: &Path, out: &str, layer_cache: bool| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_kubeslot-builder"));
        c.arg("--progress")
            .arg("plain")
            .arg("--cache")
            .arg(t.path().join("cache"))
            .arg("build")
            .arg(recipe)
            .arg("--output")
            .arg(format!("oci:{}", t.path().join(out).display()));
        if layer_cache {
            c.arg("--layer-cache").arg(&cache);
        }
        let o = run(&mut c);
        assert!(o.status.success(), "{o:?}");
        let stderr = String::from_utf8(o.stderr).unwrap();
        (last_line(&String::from_utf8(o.stdout).unwrap()), stderr)
    };
    let platforms = ["linux/amd64", "linux/arm64"];
    let says = |stderr: &str, outcome: &str| {
        for p in platforms {
            let line = format!("layer base {p}: {outcome}");
            assert!(
                stderr.lines().any(|l| l.starts_with(&line)),
                "no `{line}` line:\n{stderr}"
            );
        }
    };
    let entries = || -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(&cache)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        v.sort();
        v
    };

    let (plain, _) = build_with(&demo(), "plain", false);
    let (first, stderr) = build_with(&demo(), "first", true);
    assert_eq!(first, plain, "the first build with a layer cache differs");
    says(&stderr, "not cached");
    says(&stderr, "done (");
    let stored = entries();
    assert_eq!(stored.len(), 2, "one entry per platform: {stored:?}");
    for e in &stored {
        assert!(
            e.join("layer").is_file() && e.join("layer.json").is_file(),
            "{e:?}"
        );
    }

    let (second, stderr) = build_with(&demo(), "second", true);
    assert_eq!(second, plain, "a build from the layer cache differs");
    says(&stderr, "cached (");
    assert_eq!(
        layer_files(&t.path().join("second"), TAG, "amd64"),
        layer_files(&t.path().join("plain"), TAG, "amd64")
    );

    // One byte of one entry's blob changed: found when it is copied out,
    // the entry dropped and stored again from the layer written anew.
    let damaged = stored[0].join("layer");
    let mut bytes = std::fs::read(&damaged).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    // (a new file: the entry's blob may be a hard link of an output's)
    std::fs::remove_file(&damaged).unwrap();
    std::fs::write(&damaged, bytes).unwrap();
    let (third, stderr) = build_with(&demo(), "third", true);
    assert_eq!(third, plain, "a damaged entry changed the image");
    let named = stderr
        .lines()
        .find(|l| l.starts_with("layer cache: entry discarded"))
        .unwrap_or_else(|| panic!("no line about the damaged entry:\n{stderr}"));
    assert!(
        named.contains(&stored[0].display().to_string()) && named.contains("hashes to"),
        "{named}"
    );
    assert_eq!(entries(), stored, "the entry was not stored again");
    let (_, stderr) = build_with(&demo(), "fourth", true);
    says(&stderr, "cached (");

    // Another epoch: other bytes, so another entry.
    let recipe = write_recipe(
        t.path(),
        &demo_text().replace(
            "source_date_epoch = 1700000000",
            "source_date_epoch = 1700000001",
        ),
    );
    let (other, stderr) = build_with(&recipe, "other", true);
    assert_ne!(other, plain);
    says(&stderr, "not cached");
    assert_eq!(entries().len(), 4);
}
