//! What rendering refuses, naming the field and what is wrong: kubelet config
//! fields the activator owns, pod settings, anything else a config may get
//! wrong.

use super::*;

#[test]
fn kubelet_config_refuses_the_fields_the_activator_owns() {
    for (object, names) in [
        (r#"{"clusterDNS":["10.0.0.10"]}"#, "kubelet.cluster_dns"),
        (r#"{"clusterDomain":"x"}"#, "kubelet.cluster_domain"),
        (
            r#"{"serverTLSBootstrap":true}"#,
            "kubelet.server_tls_bootstrap",
        ),
        (r#"{"resolvConf":"/etc/resolv.conf"}"#, "resolv.conf"),
        (r#"{"healthzPort":10300}"#, "health.kubelet_healthz_url"),
        (r#"{"cgroupDriver":"cgroupfs"}"#, "systemd"),
        (r#"{"kind":"KubeletConfiguration"}"#, "header"),
        (
            r#"{"authentication":{"x509":{"clientCAFile":"/x"}}}"#,
            "authentication.x509.clientCAFile",
        ),
    ] {
        let json = TOKEN_CONFIG.replace("GPU", "off").replace(
            r#""bootstrap_token""#,
            &format!(r#""config":{object},"bootstrap_token""#),
        );
        let e = Config::parse(Path::new("/etc/kubeslot/activator.json"), json.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/etc/kubeslot/activator.json")
                && e.contains("kubelet.config")
                && e.contains("set by the activator")
                && e.contains(names),
            "{object}: {e}"
        );
    }
    // other authentication settings are the user's
    let json = TOKEN_CONFIG.replace("GPU", "off").replace(
        r#""bootstrap_token""#,
        r#""config":{"authentication":{"webhook":{"cacheTTL":"1m"}}},"bootstrap_token""#,
    );
    Config::parse(Path::new("c.json"), json.as_bytes()).unwrap();
}

#[test]
fn pod_settings_refusals_name_the_field() {
    let host = Host::new();
    let mut c = config_with("off");
    c.kubelet.node_ip = Some("198.51.100.1,198.51.100.2".into());
    let e = c.validate(Path::new("test.json")).unwrap_err().to_string();
    assert!(
        e.contains("kubelet.node_ip") && e.contains("198.51.100.2"),
        "{e}"
    );
    c.kubelet.node_ip = Some("node-1".into());
    assert!(c.validate(Path::new("test.json")).is_err());

    let mut c = config_with("off");
    c.kubelet.cluster_domain = "Cluster.Local".into();
    let e = c.validate(Path::new("test.json")).unwrap_err().to_string();
    assert!(e.contains("kubelet.cluster_domain"), "{e}");

    let mut c = config_with("off");
    c.containerd.registry_mirrors = Some(
        [(
            "registry.k8s.io".to_string(),
            kubeslot_activator::config::RegistryMirror {
                mirrors: vec!["mirror.internal\"\n[x]".into()],
                ..Default::default()
            },
        )]
        .into(),
    );
    let e = c.validate(Path::new("test.json")).unwrap_err().to_string();
    assert!(
        e.contains("containerd.registry_mirrors") && e.contains("is not a mirror"),
        "{e}"
    );

    // a CA file the host does not have: named, nothing rendered
    let mut c = config_with("off");
    c.containerd.registry_mirrors = Some(
        [(
            "registry.k8s.io".to_string(),
            kubeslot_activator::config::RegistryMirror {
                mirrors: vec!["mirror.internal".into()],
                ca_file: Some("/etc/kubeslot/missing-mirror-ca.pem".into()),
                ..Default::default()
            },
        )]
        .into(),
    );
    let e = render::gather(&host.root, &c).unwrap_err().to_string();
    assert!(
        e.contains("/etc/kubeslot/missing-mirror-ca.pem")
            && e.contains("registry.k8s.io")
            && e.contains("ca_file"),
        "{e}"
    );
}

#[test]
fn refusals_name_what_is_wrong() {
    let host = Host::new();
    // only the stub: no real upstream anywhere
    fs::remove_file(host.path("run/systemd/resolve/resolv.conf")).unwrap();
    let e = render::gather(&host.root, &config_with("off"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("etc/resolv.conf") && e.contains("127.0.0.53"),
        "{e}"
    );
    fs::write(host.path("etc/resolv.conf"), "nameserver 198.51.100.7\n").unwrap();
    render::gather(&host.root, &config_with("off")).unwrap();

    let mut c = config_with("off");
    c.devices = vec![PathBuf::from("/dev/kvm")];
    let e = render::gather(&host.root, &c).unwrap_err().to_string();
    assert!(e.contains("/dev/kvm") && e.contains("not found"), "{e}");

    let mut c = config_with("off");
    c.kubelet.labels.insert("role".into(), "a b".into());
    let e = c.validate(Path::new("test.json")).unwrap_err().to_string();
    // a config error (checked when the config is loaded), naming the file
    assert!(
        e.contains("test.json") && e.contains("kubelet.labels") && e.contains("\"a b\""),
        "{e}"
    );

    let mut c = config_with("off");
    c.kubelet
        .labels
        .insert("node-role.kubernetes.io/worker".into(), "".into());
    let e = c.validate(Path::new("test.json")).unwrap_err().to_string();
    assert!(
        e.contains("node-role.kubernetes.io/worker") && e.contains("may not set"),
        "{e}"
    );

    let mut c = config_with("off");
    c.kubelet.taints = vec!["dedicated=x:Sometimes".into()];
    let e = c.validate(Path::new("test.json")).unwrap_err().to_string();
    assert!(e.contains("kubelet.taints"), "{e}");

    let mut c = config_with("off");
    c.nameservers = vec!["127.0.0.53".into()];
    let e = render::gather(&host.root, &c).unwrap_err().to_string();
    assert!(e.contains("nameservers") && e.contains("loopback"), "{e}");

    fs::write(
        host.path("etc/kubeslot/cluster-ca.pem"),
        "not a certificate\n",
    )
    .unwrap();
    let e = render::gather(&host.root, &config_with("off"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("/etc/kubeslot/cluster-ca.pem") && e.contains("not a PEM"),
        "{e}"
    );
}

/// Issue 40, item 2: the host's kubelet flags are checked under the names
/// the kubelet itself reads (it turns `_` into `-`), in both the
/// `--flag=value` and `--flag value` forms, and the flags that turn off
/// part of the node's security are refused unless the config allows each
/// by name (`kubelet.allow_security_flags`).
#[test]
fn host_kubelet_flags_are_checked_under_the_kubelets_own_names() {
    let host = Host::new();
    let config = config_with("off");
    let refused = |args: &str, config: &Config| {
        fs::write(
            host.path("etc/kubeslot/default-kubelet"),
            format!("KUBELET_EXTRA_ARGS=\"{args}\"\n"),
        )
        .unwrap();
        render::gather(&host.root, config)
            .err()
            .map(|e| e.to_string())
    };
    for (args, want) in [
        (
            "--bootstrap_kubeconfig=/var/lib/kubelet/evil.conf",
            "--bootstrap-kubeconfig is set by kubeslot",
        ),
        ("--node_ip=10.9.9.9", "--node-ip is set by kubeslot"),
        (
            "--max-pods=60 --anonymous_auth=true",
            "--anonymous-auth turns off part of the node's security",
        ),
        (
            "--anonymous-auth true",
            "--anonymous-auth turns off part of the node's security",
        ),
        (
            "--authorization-mode=AlwaysAllow",
            "--authorization-mode turns off part of the node's security",
        ),
        (
            "--read_only_port 10255",
            "--read-only-port turns off part of the node's security",
        ),
        (
            "--pod-manifest-path=/etc/kubernetes/evil",
            "--pod-manifest-path turns off part of the node's security",
        ),
        ("--tls_private_key_file=/x", "--tls-private-key-file"),
        ("---node-ip=10.9.9.9", "not a --flag"),
    ] {
        let e = refused(args, &config).unwrap_or_else(|| panic!("{args}: accepted"));
        assert!(
            e.starts_with("/etc/kubeslot/default-kubelet:1: ") && e.contains(want),
            "{args}: {e}"
        );
    }
    let e = refused("--read-only-port=10255", &config).unwrap();
    assert!(e.contains("kubelet.allow_security_flags"), "{e}");
    // allowed by name in the host's config: that flag, in either spelling,
    // and no other
    let allowing = Config::parse(
        Path::new("test.json"),
        TOKEN_CONFIG
            .replace("GPU", "off")
            .replace(
                r#""bootstrap_token""#,
                r#""allow_security_flags":["read-only-port"],"bootstrap_token""#,
            )
            .as_bytes(),
    )
    .unwrap();
    for args in ["--read-only-port=10255", "--read_only_port=10255 --v=2"] {
        assert_eq!(refused(args, &allowing), None, "{args}");
    }
    assert!(refused("--anonymous-auth=true", &allowing).is_some());
    assert_eq!(refused("--max-pods=60 --v=2", &config), None);
}
