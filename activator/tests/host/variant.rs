//! The image variant (`gpu_image`): chosen by an NVIDIA GPU on the PCI bus
//! (a fake `/sys/bus/pci/devices` under the root), shown by `plan` (text
//! and `--json`), activated; `preflight` warns on a GPU host whose config
//! names only the plain image.

use super::*;

/// An NVIDIA display controller at `address`, driven by `nvidia`, as
/// sysfs shows it under the root (no `/dev/nvidia<N>`: nothing is bound).
fn nvidia_gpu(h: &Host, address: &str) {
    let dev = h.root().join("sys/bus/pci/devices").join(address);
    fs::create_dir_all(&dev).unwrap();
    fs::write(dev.join("vendor"), "0x10de\n").unwrap();
    fs::write(dev.join("class"), "0x030200\n").unwrap();
    let driver = h.root().join("sys/bus/pci/drivers/nvidia");
    fs::create_dir_all(&driver).unwrap();
    std::os::unix::fs::symlink(&driver, dev.join("driver")).unwrap();
}

/// The config for `tag`, GPUs bound when present, with `gpu_image` (a tag
/// of the same layout) when given.
fn config_with(h: &Host, tag: &str, gpu_image: Option<&str>) {
    let mut c = h.config(tag, serde_json::json!({}));
    c["gpu"] = "auto".into();
    if let Some(g) = gpu_image {
        c["gpu_image"] = format!("oci:{}:{g}", h.layout.display()).into();
    }
    fs::write(h.config_path(), serde_json::to_vec_pretty(&c).unwrap()).unwrap();
}

#[test]
fn the_gpu_image_runs_on_a_host_with_an_nvidia_gpu_and_plan_says_why() {
    let img = images();
    let h = Host::new(&img);
    // v1 plays the plain image, v2 its NVIDIA variant
    config_with(&h, "v1", Some("v2"));
    let (code, out, err) = h.cmd(&["plan"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("(image: no NVIDIA GPU on the PCI bus)")
            && out.contains(&format!("flip to kube1 ({})", img.v1)),
        "{out}"
    );

    nvidia_gpu(&h, "0000:01:00.0");
    let (code, out, err) = h.cmd(&["plan"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(":v2 (gpu_image: NVIDIA GPU 0000:01:00.0 on the PCI bus)")
            && out.contains(&format!("flip to kube1 ({})", img.v2)),
        "{out}"
    );
    let (code, out, err) = h.cmd(&["plan", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out, &err);
    assert_eq!(v["variant"]["key"], "gpu_image", "{v:#}");
    assert_eq!(
        v["variant"]["why"],
        "NVIDIA GPU 0000:01:00.0 on the PCI bus"
    );
    assert!(v["image"].as_str().unwrap().ends_with(":v2"), "{v:#}");
    assert_eq!(v["digest"], img.v2.to_string());

    // preflight passes naming the variant; activate runs it
    let (code, out, err) = h.cmd(&["preflight"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("[PASS] gpu-image: seen NVIDIA GPU 0000:01:00.0: gpu_image oci:"),
        "{out}"
    );
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert_eq!(r["digest"], img.v2.to_string());
    assert!(r["image"].as_str().unwrap().ends_with(":v2"), "{r:#}");
    assert_eq!(h.tree_version(Slot::Kube1), "kubelet v2\n");
}

#[test]
fn preflight_warns_on_a_gpu_host_configured_with_only_the_plain_image() {
    let img = images();
    let h = Host::new(&img);
    config_with(&h, "v1", None);
    // no GPU: nothing to say
    let (code, out, err) = h.cmd(&["preflight"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(!out.contains("gpu-image"), "{out}");

    nvidia_gpu(&h, "0000:41:00.0");
    let (code, out, err) = h.cmd(&["preflight"]);
    assert_eq!(code, 0, "a warning, not a failure: {out}\n{err}");
    assert!(
        out.contains(
            "[WARN] gpu-image: seen NVIDIA GPU 0000:41:00.0, no gpu_image: the plain image oci:"
        ) && out.contains("(set gpu_image to the NVIDIA variant"),
        "{out}"
    );
    // the flip's preflight says it too, and goes on
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert!(
        r["preflight"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["name"] == "gpu-image" && f["status"] == "warn"),
        "{r:#}"
    );
    assert_eq!(r["digest"], img.v1.to_string());
}
