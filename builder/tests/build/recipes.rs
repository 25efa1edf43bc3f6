//! The shipped recipes, read as TOML without building them: every one
//! validates, the NVIDIA image and its e2e variant set GPUs up alike, the
//! production containerd config keeps the unbounded agent's pull settings, and
//! no e2e file configures containerd itself.

use super::*;

#[test]
fn the_real_recipes_validate() {
    for r in ["recipes/ubuntu2404.toml", "recipes/ubuntu2404-nvidia.toml"] {
        let out = ok(bin().arg("check").arg(workspace_root().join(r)));
        assert!(
            out.contains("ok:") && out.contains("linux/amd64, linux/arm64"),
            "{out}"
        );
        assert!(out.contains("base debian noble ("), "{out}");
        let missing = workspace_root().join("recipes/no-such.toml");
        let err = fails(bin().arg("check").arg(&missing));
        assert!(
            err.contains(&format!("recipe {}: cannot read: ", missing.display())),
            "{err}"
        );
        // The NVIDIA variant's extra repository is part of its base.
        assert_eq!(
            out.contains(", 4 from nvidia-container-toolkit)"),
            r.contains("nvidia"),
            "{out}"
        );
    }
}

fn toml_file(rel: &str) -> toml::Value {
    let path = workspace_root().join(rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{rel}: {e}"));
    toml::from_str(&text).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// `a` with `b` merged over it, table by table (containerd 2.1+ merges
/// imported files so).
fn merge(a: &toml::Value, b: &toml::Value) -> toml::Value {
    match (a, b) {
        (toml::Value::Table(a), toml::Value::Table(b)) => {
            let mut out = a.clone();
            for (k, v) in b {
                let merged = match out.get(k) {
                    Some(old) => merge(old, v),
                    None => v.clone(),
                };
                out.insert(k.clone(), merged);
            }
            toml::Value::Table(out)
        }
        (_, b) => b.clone(),
    }
}

/// The `[[files]]` of a recipe as (in-image path, source, mode).
fn recipe_files(recipe: &toml::Value) -> Vec<(String, String, String)> {
    recipe["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let get = |k: &str| f.get(k).and_then(|v| v.as_str()).unwrap_or("").to_string();
            (get("path"), get("source"), get("mode"))
        })
        .collect()
}

/// The NVIDIA image's GPU setup and containerd settings, and the e2e test
/// variant (testdata/e2e/node-nvidia.toml.in) that proves them on a real
/// machine: the variant bakes the very same setup script and unit, and the
/// production containerd config and NVIDIA drop-ins themselves.
#[test]
fn the_nvidia_image_and_its_e2e_variant_configure_gpus_alike() {
    let prod = toml_file("recipes/ubuntu2404-nvidia.toml");
    let test = toml_file("testdata/e2e/node-nvidia.toml.in");
    let prod_files = recipe_files(&prod);
    let test_files = recipe_files(&test);
    for (path, source, mode) in [
        (
            "/usr/lib/kubeslot/nvidia-setup",
            "kubeslot-nvidia-setup",
            "0755",
        ),
        (
            "/etc/systemd/system/kubeslot-nvidia-setup.service",
            "kubeslot-nvidia-setup.service",
            "",
        ),
        // containerd requires the setup: a failed setup fails the gate
        (
            "/etc/systemd/system/containerd.service.d/10-kubeslot-nvidia-setup.conf",
            "containerd-requires-nvidia-setup.conf",
            "",
        ),
    ] {
        assert!(
            prod_files.iter().any(|f| f.0 == path
                && f.1 == format!("files/{source}")
                && (mode.is_empty() || f.2 == mode)),
            "{path} in the NVIDIA recipe: {prod_files:?}"
        );
        assert!(
            test_files
                .iter()
                .any(|f| f.0 == path && f.1 == format!("@RECIPE_FILES@/{source}")),
            "{path} in the e2e variant: {test_files:?}"
        );
    }
    for recipe in [&prod, &test] {
        let enabled = recipe["units"]["enable"].as_array().unwrap();
        assert!(enabled
            .iter()
            .any(|u| u["unit"].as_str() == Some("kubeslot-nvidia-setup.service")));
    }

    // containerd: the e2e variant carries the production config and both
    // NVIDIA drop-ins themselves, at the same paths (no test-only config)
    let containerd = |files: &[(String, String, String)], prefix: &str| -> Vec<(String, String)> {
        files
            .iter()
            .filter(|f| f.0.starts_with("/etc/containerd/"))
            .map(|f| (f.0.clone(), f.1.replace(prefix, "recipes/files/")))
            .collect()
    };
    let prod_containerd = containerd(&prod_files, "files/");
    assert_eq!(
        prod_containerd,
        containerd(&test_files, "@RECIPE_FILES@/"),
        "the e2e variant's containerd files are the production recipe's"
    );
    assert_eq!(
        prod_containerd
            .iter()
            .map(|(p, _)| p.as_str())
            .collect::<Vec<_>>(),
        [
            "/etc/containerd/config.toml",
            "/etc/containerd/conf.d/50-nvidia.toml",
            "/etc/containerd/conf.d/60-nvidia-default.toml"
        ]
    );
    // the drop-ins sit where the main config imports them from
    let main = toml_file("recipes/files/containerd-config.toml");
    assert_eq!(
        main["imports"],
        toml::Value::Array(vec!["/etc/containerd/conf.d/*.toml".into()])
    );
    let merged = prod_containerd[1..]
        .iter()
        .map(|(_, f)| toml_file(f))
        .reduce(|a, b| merge(&a, &b))
        .unwrap();
    assert_eq!(merged["version"].as_integer(), Some(3));
    let prod_cri = &merged["plugins"]["io.containerd.cri.v1.runtime"];
    // what they say
    assert_eq!(prod_cri["enable_cdi"].as_bool(), Some(true));
    assert_eq!(
        prod_cri["cdi_spec_dirs"],
        toml::Value::Array(vec!["/etc/cdi".into(), "/var/run/cdi".into()])
    );
    assert_eq!(
        prod_cri["containerd"]["default_runtime_name"].as_str(),
        Some("nvidia")
    );
    let nvidia = &prod_cri["containerd"]["runtimes"]["nvidia"];
    assert_eq!(
        nvidia["runtime_type"].as_str(),
        Some("io.containerd.runc.v2")
    );
    assert_eq!(
        nvidia["options"]["BinaryName"].as_str(),
        Some("/usr/bin/nvidia-container-runtime")
    );
}

/// The image's containerd keeps the unbounded agent's pull settings, and
/// the drop-in the activator renders for a host's sandbox image and
/// metrics address (its golden file) merges over it key by key.
#[test]
fn production_containerd_config_keeps_the_unbounded_agents_pull_settings() {
    let main = toml_file("recipes/files/containerd-config.toml");
    let images = &main["plugins"]["io.containerd.cri.v1.images"];
    assert_eq!(images["image_pull_progress_timeout"].as_str(), Some("30m"));
    assert_eq!(
        main["plugins"]["io.containerd.transfer.v1.local"]["max_concurrent_downloads"].as_integer(),
        Some(6)
    );
    let host =
        toml_file("testdata/render/seed-parity/files/etc/kubeslot/host/kube1/containerd.toml");
    assert_eq!(host["version"], main["version"]);
    let merged = merge(&main, &host);
    let images = &merged["plugins"]["io.containerd.cri.v1.images"];
    assert_eq!(
        images["pinned_images"]["sandbox"].as_str(),
        Some("registry.example/e2e/pause:3.10.2")
    );
    // the rest of the image's table stays
    assert_eq!(images["snapshotter"].as_str(), Some("overlayfs"));
    assert_eq!(merged["metrics"]["address"].as_str(), Some("0.0.0.0:10257"));
}

/// The e2e node images run the production containerd config: the node
/// recipe names `recipes/files/containerd-config.toml`, and no file under
/// `testdata/e2e` configures containerd.
#[test]
fn no_e2e_file_configures_containerd() {
    let node = toml_file("testdata/e2e/node.toml.in");
    let files = recipe_files(&node);
    assert!(
        files.iter().any(|f| f.0 == "/etc/containerd/config.toml"
            && f.1 == "@RECIPE_FILES@/containerd-config.toml"),
        "{files:?}"
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/e2e");
    let mut stack = vec![root];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let path = e.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                !text.contains("io.containerd.") && !text.contains("[plugins."),
                "{} configures containerd",
                path.display()
            );
        }
    }
}
