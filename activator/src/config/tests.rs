//! The config schema's validation: what is refused, naming the file and
//! the field.
#[test]
fn swap_is_allowed_by_the_kubelet_config_or_the_preflight_knob() {
    let base = serde_json::json!({
        "image": "ghcr.io/o/node:v1",
        "kubelet": {"api_server": "https://10.0.0.1:6443", "bootstrap_token": "abcdef.0123456789abcdef"}
    });
    let parse = |v: serde_json::Value| -> Config { serde_json::from_value(v).unwrap() };
    assert_eq!(parse(base.clone()).kubelet_allows_swap(), None);
    let mut c = base.clone();
    c["kubelet"]["config"] = serde_json::json!({"failSwapOn": false});
    assert_eq!(
        parse(c).kubelet_allows_swap().as_deref(),
        Some("kubelet.config.failSwapOn: false")
    );
    let mut c = base.clone();
    c["kubelet"]["config"] = serde_json::json!({"failSwapOn": true});
    assert_eq!(parse(c).kubelet_allows_swap(), None);
    let mut c = base;
    c["preflight"] = serde_json::json!({"allow_swap": true});
    assert!(parse(c).kubelet_allows_swap().is_some());
}

use super::*;

const CA: &str = "-----BEGIN CERTIFICATE-----\\nMIIB\\n-----END CERTIFICATE-----\\n";

pub(super) fn parse(json: &str) -> Result<Config, ConfigError> {
    Config::parse(Path::new("/etc/kubeslot/activator.json"), json.as_bytes())
}

fn minimal(extra: &str) -> String {
    format!(
        r#"{{"image":"ghcr.io/org/node:v1","kubelet":{{"api_server":"https://10.0.0.1:6443",
        "ca_data":"{CA}","bootstrap_token":"abcdef.0123456789abcdef"{extra}}}}}"#
    )
}

#[test]
fn minimal_config_parses_with_defaults() {
    let c = parse(&minimal("")).unwrap();
    assert_eq!(c.gpu, Gpu::default());
    assert_eq!(c.gpu.mode, GpuMode::Auto);
    assert!(!c.trust.allow_unsigned);
    assert_eq!(c.network, NetworkMode::Host);
    assert_eq!(c.download.deadline_secs, 1200);
}

#[test]
fn the_download_deadline_is_positive() {
    let c =
        parse(&minimal("").replace(r#"{"image""#, r#"{"download":{"deadline_secs":90},"image""#))
            .unwrap();
    assert_eq!(c.download.deadline_secs, 90);
    let e =
        parse(&minimal("").replace(r#"{"image""#, r#"{"download":{"deadline_secs":0},"image""#))
            .unwrap_err()
            .to_string();
    assert!(
        e.contains("download.deadline_secs: must be positive"),
        "{e}"
    );
}

#[test]
fn gpu_is_a_mode_or_a_mode_and_a_driver_root() {
    let with = |gpu: &str| minimal("").replace(r#"{"image""#, &format!(r#"{{"gpu":{gpu},"image""#));
    // the string form every earlier config uses
    let c = parse(&with(r#""on""#)).unwrap();
    assert_eq!(
        c.gpu,
        Gpu {
            mode: GpuMode::On,
            driver_root: None
        }
    );
    // and it is written back as it was read
    assert_eq!(
        serde_json::to_value(&c.gpu).unwrap(),
        serde_json::json!("on")
    );
    let c = parse(&with(r#"{"driver_root":"/run/nvidia/driver"}"#)).unwrap();
    assert_eq!(c.gpu.mode, GpuMode::Auto);
    assert_eq!(
        c.gpu.driver_root.as_deref(),
        Some(Path::new("/run/nvidia/driver"))
    );
    assert_eq!(
        serde_json::to_value(&c.gpu).unwrap(),
        serde_json::json!({"mode": "auto", "driver_root": "/run/nvidia/driver"})
    );
    let c = parse(&with(r#"{"mode":"off"}"#)).unwrap();
    assert_eq!(
        serde_json::to_value(&c.gpu).unwrap(),
        serde_json::json!("off")
    );
    for (gpu, want) in [
        (r#""sometimes""#, "unknown variant `sometimes`"),
        (r#"{"mode":"on","root":"/x"}"#, "unknown field `root`"),
        (r#"1"#, r#"expected "auto", "on", "off" or {"mode""#),
        (
            r#"{"driver_root":"run/nvidia/driver"}"#,
            "gpu.driver_root: must be an absolute path",
        ),
        (
            r#"{"driver_root":"/run/../etc"}"#,
            "gpu.driver_root: must be an absolute path",
        ),
    ] {
        let e = parse(&with(gpu)).unwrap_err().to_string();
        assert!(
            e.contains(want) && e.contains("activator.json"),
            "{gpu}: {e}"
        );
    }
}

#[test]
fn bad_configs_name_the_problem() {
    let e = parse(&minimal(r#","typo":1"#)).unwrap_err().to_string();
    assert!(
        e.contains("unknown field `typo`") && e.contains("activator.json"),
        "{e}"
    );
    let e = parse(&minimal(r#","exec_credential":{"command":"x"}"#))
        .unwrap_err()
        .to_string();
    assert!(e.contains("not both"), "{e}");
    let e = parse(r#"{"image":"x","kubelet":{"ca_data":"y"}}"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("api_server"), "{e}");
}

pub(super) fn with_top(image: &str, top: &str) -> String {
    format!(
        r#"{{"image":"{image}","kubelet":{{"api_server":"https://10.0.0.1:6443",
        "ca_data":"{CA}","bootstrap_token":"abcdef.0123456789abcdef"}}{top}}}"#
    )
}

#[test]
fn mirror_urls_with_user_info_are_refused_without_echoing_them() {
    let e = parse(&with_top(
        "ghcr.io/org/node:v1",
        r#","registries":{"ghcr.io":{"mirrors":["https://bob:hunter2@mirror.example"]}}"#,
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("user info") && e.contains("mirror 1"), "{e}");
    assert!(!e.contains("hunter2"), "{e}");
    let e = parse(&with_top(
        "ghcr.io/org/node:v1",
        r#","containerd":{"registry_mirrors":{"docker.io":{"mirrors":["http://mirror.example","https://u:pw-9@m2.example/v2"]}}}"#,
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("mirror 2") && !e.contains("pw-9"), "{e}");
    // An '@' in a path is not user info.
    assert!(!has_user_info("https://mirror.example/a@b"));
}

#[test]
fn keyless_needs_one_identity_rule_and_a_valid_regexp() {
    let keyless = |k: &str| {
        with_top(
            "ghcr.io/org/node:v1",
            &format!(
                r#","trust":{{"keyless":{{"trusted_root":"/etc/kubeslot/root.json","issuer":"https://token.actions.githubusercontent.com"{k}}}}}"#
            ),
        )
    };
    let c = parse(&keyless(
        r#","identity":"https://github.com/org/node/.github/workflows/p.yml@refs/heads/main""#,
    ))
    .unwrap();
    let k = c.trust.keyless.unwrap();
    assert!(
        k.require_sct,
        "SCTs are required unless the config says otherwise"
    );
    assert!(!k.accept_deprecated_issuer_extension);
    for (bad, says) in [
        ("", "exactly one of identity and identity_regexp"),
        (r#","identity":"a","identity_regexp":"b""#, "exactly one"),
        (
            r#","identity_regexp":"(unclosed""#,
            "invalid regular expression",
        ),
    ] {
        let e = parse(&keyless(bad)).unwrap_err().to_string();
        assert!(
            e.contains("trust.keyless") && e.contains(says),
            "{bad}: {e}"
        );
    }
    let e = parse(&keyless(r#","identity":"x","github":{"branch":"main"}"#))
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown field") && e.contains("branch"), "{e}");
}

#[test]
fn a_layout_image_needs_an_identity_unless_unsigned_is_allowed() {
    let layout = |trust: &str| with_top("oci:/srv/node:v1", &format!(r#","trust":{trust}"#));
    let e = parse(&layout(r#"{"public_keys":["/k.pem"]}"#))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("trust.identity") && e.contains("required"),
        "{e}"
    );
    parse(&layout(
        r#"{"public_keys":["/k.pem"],"identity":"ghcr.io/org/node"}"#,
    ))
    .unwrap();
    parse(&layout(r#"{"allow_unsigned":true}"#)).unwrap();
    let e = parse(&layout(
        r#"{"public_keys":["/k.pem"],"identity":"ghcr.io/org/node:v1"}"#,
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("trust.identity") && e.contains("no tag"), "{e}");
}
