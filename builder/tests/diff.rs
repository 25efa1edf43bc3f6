//! Black-box tests of `kubeslot-builder diff`: real images built from the
//! demo recipe (the release before: kubelet 1.36.3 and no crictl; the
//! release after: the demo as committed), read as OCI layouts, an
//! oci-archive and from a real `docker-registry`; the expected layer changes
//! are computed from the written manifests, not restated. Its `--help` is
//! snapshotted with every other one (tests/help.rs).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use kubeslot_test_support::golden;
use kubeslot_test_support::tools::{run_fails as fails, run_ok as ok};
use kubeslot_test_support::{require_tool, workspace_root, Registry};
use serde_json::Value;

const TAG: &str = "1.36.4-demo";

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kubeslot-builder"));
    c.arg("--progress").arg("quiet");
    c
}

/// The demo recipe's text with its relative paths made absolute.
fn demo_text() -> String {
    std::fs::read_to_string(workspace_root().join("testdata/recipes/demo.toml")).unwrap()
}

/// The release before the demo: kubelet 1.36.3 (its stand-in is in the demo
/// mirror) and no crictl.
fn previous_release_text() -> String {
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
    let start = text.find("[components.crictl]").expect("demo has crictl");
    let end = start + text[start..].find("[[files]]").unwrap();
    format!("{}{}", &text[..start], &text[end..])
}

/// Builds `text` as a recipe in `dir/recipes/`, beside a link `dir/demo` to
/// the demo's files, so its relative paths (`../demo/...`) resolve as in the
/// repository and the image (whose history names them) does not depend on
/// where the checkout is.
fn build(text: &str, dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir.join("recipes")).unwrap();
    std::os::unix::fs::symlink(workspace_root().join("testdata/demo"), dir.join("demo")).unwrap();
    let recipe = dir.join("recipes/recipe.toml");
    std::fs::write(&recipe, text).unwrap();
    let out = dir.join("layout");
    ok(bin()
        .arg("--cache")
        .arg(dir.join("cache"))
        .arg("build")
        .arg(&recipe)
        .arg("--output")
        .arg(format!("oci:{}", out.display())));
    out
}

/// The two releases, built once for all tests.
struct Fixture {
    _dir: tempfile::TempDir,
    old: PathBuf,
    new: PathBuf,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let old = build(&previous_release_text(), &dir.path().join("old"));
        let new = build(&demo_text(), &dir.path().join("new"));
        Fixture {
            _dir: dir,
            old,
            new,
        }
    })
}

fn oci(dir: &Path) -> String {
    format!("oci:{}:{TAG}", dir.display())
}

fn diff_json(old: &str, new: &str, extra: &[&str]) -> Value {
    let out = ok(bin()
        .arg("--json")
        .arg("diff")
        .arg(old)
        .arg(new)
        .args(extra));
    serde_json::from_str(&out).unwrap()
}

fn read_json(layout: &Path, digest: &str) -> Value {
    let hex = digest.strip_prefix("sha256:").unwrap();
    serde_json::from_slice(&std::fs::read(layout.join("blobs/sha256").join(hex)).unwrap()).unwrap()
}

/// platform → its manifest, from the layout's image index.
fn manifests(layout: &Path) -> BTreeMap<String, Value> {
    let index = read_json(layout, &index_digest(layout));
    index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let p = &m["platform"];
            (
                format!(
                    "{}/{}",
                    p["os"].as_str().unwrap(),
                    p["architecture"].as_str().unwrap()
                ),
                read_json(layout, m["digest"].as_str().unwrap()),
            )
        })
        .collect()
}

fn index_digest(layout: &Path) -> String {
    let index: Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == TAG)
        .unwrap()["digest"]
        .as_str()
        .unwrap()
        .to_string()
}

fn names(list: &Value, change: &str) -> Vec<String> {
    list.as_array()
        .unwrap()
        .iter()
        .filter(|x| x["change"] == change)
        .map(|x| x["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_kubelet_bump_and_a_new_component_show_as_versions_layers_and_packages() {
    let f = fixture();
    let d = diff_json(&oci(&f.old), &oci(&f.new), &[]);
    assert_eq!(d["identical"], false);
    assert_eq!(d["old"]["digest"], index_digest(&f.old).as_str());
    assert_eq!(d["new"]["digest"], index_digest(&f.new).as_str());
    let (old_m, new_m) = (manifests(&f.old), manifests(&f.new));
    let platforms = d["platforms"].as_array().unwrap();
    assert_eq!(platforms.len(), 2, "{d}");
    for p in platforms {
        let name = p["platform"].as_str().unwrap();
        assert_eq!(p["change"], "changed", "{name}");
        // versions: the bump, and the component that arrived
        let comps = &p["components"];
        assert_eq!(names(comps, "changed"), ["kubelet"], "{name}: {comps}");
        assert_eq!(names(comps, "added"), ["crictl"], "{name}: {comps}");
        assert_eq!(names(comps, "removed"), Vec::<String>::new());
        let kubelet = &comps.as_array().unwrap()[1];
        assert_eq!(
            (&kubelet["old"], &kubelet["new"]),
            (&"1.36.3".into(), &"1.36.4".into())
        );
        // layers: the groups those inputs live in, plus the SBOM layer
        let layers = &p["layers"];
        assert_eq!(
            names(layers, "changed"),
            ["runtime", "kubernetes", "sbom"],
            "{name}: {layers}"
        );
        assert_eq!(names(layers, "unchanged"), ["base", "config"]);
        // sizes and the download are the manifests' own numbers
        let sizes = |m: &Value| -> Vec<(String, u64)> {
            m["layers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| {
                    (
                        l["digest"].as_str().unwrap().into(),
                        l["size"].as_u64().unwrap(),
                    )
                })
                .collect()
        };
        let (before, after) = (sizes(&old_m[name]), sizes(&new_m[name]));
        let download: u64 = after
            .iter()
            .filter(|l| !before.iter().any(|b| b.0 == l.0))
            .map(|l| l.1)
            .sum();
        assert!(download > 0);
        assert_eq!(p["download_bytes"], download, "{name}");
        assert_eq!(p["old_bytes"], before.iter().map(|l| l.1).sum::<u64>());
        assert_eq!(p["new_bytes"], after.iter().map(|l| l.1).sum::<u64>());
        let runtime = layers
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == "runtime")
            .unwrap();
        assert_eq!(runtime["old"]["digest"], old_m[name]["layers"][1]["digest"]);
        assert_eq!(runtime["new"]["size"], new_m[name]["layers"][1]["size"]);
        // packages from the SBOM attachments
        let pk = &p["packages"];
        assert_eq!(pk["sbom"], "compared", "{pk}");
        assert_eq!(names(&pk["changes"], "changed"), ["kubelet"]);
        assert_eq!(names(&pk["changes"], "added"), ["crictl"]);
        assert_eq!(
            pk["new_count"].as_u64(),
            pk["old_count"].as_u64().map(|n| n + 1)
        );
    }
}

#[test]
fn text_output_snapshot() {
    let f = fixture();
    let out = ok(bin().arg("diff").arg(oci(&f.old)).arg(oci(&f.new)));
    let text = out
        .replace(&f.old.display().to_string(), "OLD")
        .replace(&f.new.display().to_string(), "NEW");
    golden::check("golden/diff-demo.txt", &text);
}

#[test]
fn layouts_archives_and_registries_give_the_same_diff() {
    require_tool("docker-registry", "docker-registry");
    let f = fixture();
    let t = tempfile::tempdir().unwrap();
    let reg = Registry::start();
    let archive = t.path().join("old.tar");
    ok(bin()
        .arg("copy")
        .arg(oci(&f.old))
        .arg(format!("oci-archive:{}:{TAG}", archive.display())));
    let pushed = format!("{}/kubeslot/node:{TAG}", reg.host());
    ok(bin().arg("push").arg(oci(&f.new)).arg(&pushed));
    let local = diff_json(&oci(&f.old), &oci(&f.new), &[]);
    let mixed = diff_json(
        &format!("oci-archive:{}:{TAG}", archive.display()),
        &pushed,
        &[],
    );
    assert_eq!(local["platforms"], mixed["platforms"]);
    assert_eq!(local["new"]["digest"], mixed["new"]["digest"]);
    // The registry was asked for documents only, never a layer blob (the
    // config blobs, which it does read, show what such a request looks like).
    let log = reg.log();
    for m in manifests(&f.new).values() {
        let config = m["config"]["digest"].as_str().unwrap();
        assert!(
            log.contains(&format!("GET /v2/kubeslot/node/blobs/{config}")),
            "no config request in the registry log:\n{log}"
        );
    }
    for m in manifests(&f.new).values() {
        for l in m["layers"].as_array().unwrap() {
            let digest = l["digest"].as_str().unwrap();
            assert!(
                !log.contains(&format!("GET /v2/kubeslot/node/blobs/{digest}")),
                "diff downloaded layer {digest}"
            );
        }
    }
}

#[test]
fn platform_filter_identical_images_and_an_added_platform() {
    let f = fixture();
    let only = diff_json(&oci(&f.old), &oci(&f.new), &["--platform", "linux/arm64"]);
    let platforms = only["platforms"].as_array().unwrap();
    assert_eq!(platforms.len(), 1);
    assert_eq!(platforms[0]["platform"], "linux/arm64");

    let same = diff_json(&oci(&f.new), &oci(&f.new), &[]);
    assert_eq!(same["identical"], true);
    for p in same["platforms"].as_array().unwrap() {
        assert_eq!(p["change"], "unchanged");
        assert_eq!(p["download_bytes"], 0);
    }
    let text = ok(bin().arg("diff").arg(oci(&f.new)).arg(oci(&f.new)));
    assert!(text.contains("identical: both are sha256:"), "{text}");

    // An amd64-only release before: arm64 arrives whole.
    let t = tempfile::tempdir().unwrap();
    let amd64 = build(
        &demo_text().replace(
            "platforms = [\"linux/amd64\", \"linux/arm64\"]",
            "platforms = [\"linux/amd64\"]",
        ),
        t.path(),
    );
    let d = diff_json(&oci(&amd64), &oci(&f.new), &[]);
    let arm = d["platforms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["platform"] == "linux/arm64")
        .unwrap();
    assert_eq!(arm["change"], "added");
    assert_eq!(arm["old_manifest"], Value::Null);
    assert_eq!(arm["download_bytes"], arm["new_bytes"]);
    assert_eq!(names(&arm["layers"], "added").len(), 5, "{arm}");
    let err = fails(
        bin()
            .arg("diff")
            .arg(oci(&amd64))
            .arg(oci(&amd64))
            .args(["--platform", "linux/arm64"]),
    );
    assert!(
        err.contains("--platform linux/arm64: neither")
            && err.contains(&amd64.display().to_string()),
        "{err}"
    );
}

#[test]
fn an_image_without_sboms_is_compared_without_packages() {
    let f = fixture();
    let t = tempfile::tempdir().unwrap();
    let bare = t.path().join("bare");
    ok(bin().arg("copy").arg(oci(&f.old)).arg(oci(&bare)));
    let index_path = bare.join("index.json");
    let mut index: Value = serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    index["manifests"].as_array_mut().unwrap().retain(|m| {
        !m["annotations"]["org.opencontainers.image.ref.name"]
            .as_str()
            .unwrap_or_default()
            .ends_with(".sbom")
    });
    std::fs::write(&index_path, serde_json::to_vec(&index).unwrap()).unwrap();
    let d = diff_json(&oci(&bare), &oci(&f.new), &[]);
    for p in d["platforms"].as_array().unwrap() {
        assert_eq!(p["packages"]["sbom"], "missing", "{p}");
        assert_eq!(p["packages"]["missing_in"], serde_json::json!(["old"]));
        // the rest is still compared
        assert_eq!(names(&p["components"], "changed"), ["kubelet"]);
    }
    let text = ok(bin().arg("diff").arg(oci(&bare)).arg(oci(&f.new)));
    assert!(
        text.contains("packages: not compared (no SBOM in old)"),
        "{text}"
    );
}

#[test]
fn unreadable_images_are_named_with_the_rule_broken() {
    let f = fixture();
    let t = tempfile::tempdir().unwrap();
    // A platform manifest whose bytes were replaced.
    let bad = t.path().join("bad");
    ok(bin().arg("copy").arg(oci(&f.old)).arg(oci(&bad)));
    let manifest = manifests(&f.old)["linux/amd64"].clone();
    let index = read_json(&f.old, &index_digest(&f.old));
    let digest = index["manifests"][0]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(index["manifests"][0]["platform"]["architecture"], "amd64");
    let mut tampered = manifest.clone();
    tampered["annotations"]["dev.kubeslot.version.kubelet"] = "9.9.9".into();
    std::fs::write(
        bad.join("blobs/sha256")
            .join(digest.strip_prefix("sha256:").unwrap()),
        serde_json::to_vec(&tampered).unwrap(),
    )
    .unwrap();
    let err = fails(bin().arg("diff").arg(oci(&bad)).arg(oci(&f.new)));
    assert!(
        err.contains(&digest) && err.contains("the old image"),
        "{err}"
    );

    // A layout that is not there, a registry that does not answer.
    let err = fails(
        bin()
            .arg("diff")
            .arg(oci(&f.old))
            .arg(oci(&t.path().join("nope"))),
    );
    assert!(
        err.contains("the new image") && err.contains("nope"),
        "{err}"
    );
    let port = kubeslot_test_support::free_port();
    let err = fails(
        bin()
            .arg("diff")
            .arg(format!("127.0.0.1:{port}/kubeslot/node:{TAG}"))
            .arg(oci(&f.new)),
    );
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
}
