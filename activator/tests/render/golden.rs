//! Golden files per scenario (`testdata/render/<scenario>/`) without a GPU:
//! extra devices, bootstrap tokens and exec credentials, pod settings, the
//! seed's parity, registry mirrors, `/lib/modules`, and the files checked by
//! systemd's own parsers.

use super::*;

#[test]
fn no_golden_binds_a_system_program_directory() {
    let mut seen = 0;
    for scenario in fs::read_dir(testdata("render")).unwrap() {
        let nspawn_dir = scenario.unwrap().path().join("files/etc/systemd/nspawn");
        for f in fs::read_dir(&nspawn_dir).unwrap() {
            let text = fs::read_to_string(f.unwrap().path()).unwrap();
            assert_eq!(
                system_bin_binds(&text),
                Vec::<&str>::new(),
                "{}",
                nspawn_dir.display()
            );
            seen += 1;
        }
    }
    assert_eq!(seen, 14);
    // the check itself finds what issue 25's host was given
    assert_eq!(
        system_bin_binds("BindReadOnly=/usr/bin:/run/host-nvidia-bin\nBind=/usr/local/bin/\nBindReadOnly=/run/nvidia/driver/usr/bin:/x\nBindReadOnly=/usr/local/nvidia/bin:/y\n"),
        ["/usr/bin", "/usr/local/bin", "/run/nvidia/driver/usr/bin"]
    );
}

#[test]
fn golden_no_gpu() {
    let host = Host::new();
    let config = load_scenario("no-gpu");
    // gpu "auto" on a host without GPUs: the real gather, nothing bound
    let facts = render::gather(&host.root, &config).unwrap();
    assert!(facts.gpu.devices.is_empty());
    let files = render::render(&config, Slot::Kube1, &facts);
    check_invariants(&files, "kube1");
    assert!(!file(&files, ".nspawn").contains("/dev/"));
    assert_eq!(file(&files, "kube1/hostname"), "node-a\n");
    assert_eq!(
        file(&files, "resolv.conf")
            .lines()
            .filter(|l| l.starts_with("nameserver"))
            .collect::<Vec<_>>(),
        ["nameserver 192.0.2.1", "nameserver 192.0.2.2"]
    );
    // systemd-resolved's upstream list carries the host's search domains
    assert!(file(&files, "resolv.conf").contains("\nsearch example.internal\n"));
    check_golden("no-gpu", &files);
}

#[test]
fn resolv_conf_keeps_search_and_options() {
    let host = Host::new();
    // a host without systemd-resolved: /etc/resolv.conf is the real list
    fs::remove_file(host.path("run/systemd/resolve/resolv.conf")).unwrap();
    fs::write(
        host.path("etc/resolv.conf"),
        "# a corporate host\ndomain old.example\nnameserver 192.0.2.9\n\
         search corp.example lab.corp.example\noptions ndots:2\noptions timeout:1 rotate\n",
    )
    .unwrap();
    let config = load_scenario("no-gpu");
    let facts = render::gather(&host.root, &config).unwrap();
    let files = render::render(&config, Slot::Kube1, &facts);
    assert_eq!(
        file(&files, "resolv.conf"),
        "# Rendered by kubeslot-activator: the host's upstream servers, not its local stub.\n\
         nameserver 192.0.2.9\nsearch corp.example lab.corp.example\n\
         options ndots:2 timeout:1 rotate\n"
    );
    // configured servers still take the host's search domains and options
    let mut configured = config.clone();
    configured.nameservers = vec!["198.51.100.7".into()];
    let facts = render::gather(&host.root, &configured).unwrap();
    let text = file(
        &render::render(&configured, Slot::Kube1, &facts),
        "resolv.conf",
    )
    .to_string();
    assert!(text.contains("nameserver 198.51.100.7\nsearch corp.example lab.corp.example\n"));
    // a word that would turn into a comment in the machine's file is refused
    fs::write(
        host.path("etc/resolv.conf"),
        "nameserver 192.0.2.9\nsearch a#b\n",
    )
    .unwrap();
    let err = render::gather(&host.root, &config).unwrap_err().to_string();
    assert!(
        err.contains("etc/resolv.conf") && err.contains("search a#b"),
        "{err}"
    );
}

#[test]
fn golden_extra_kvm() {
    let host = Host::new();
    gpu::mknod_char(&host.path("dev/kvm"), 10, 232).unwrap();
    let config = load_scenario("extra-kvm");
    let facts = render::gather(&host.root, &config).unwrap();
    assert_eq!(facts.devices, ["/dev/kvm"]);
    let files = render::render(&config, Slot::Kube1, &facts);
    check_invariants(&files, "kube1");
    // the seed bound /dev/kvm but forgot to allow it in the device cgroup
    assert!(file(&files, "override.conf").contains("DeviceAllow=/dev/kvm rwm\n"));
    assert!(file(&files, ".nspawn").contains("VirtualEthernet=yes\n"));
    check_golden("extra-kvm", &files);
}

/// The seed bound `/dev/kvm` whenever the host had it (nodes that run VMs:
/// KubeVirt, Kata): so does the render, with its `DeviceAllow=`, unless the
/// config says `"kvm": false`; a host without it binds nothing.
#[test]
fn golden_kvm_present() {
    let host = Host::new();
    let config = load_scenario("kvm-present");
    assert!(config.kvm, "bound by default");
    let facts = render::gather(&host.root, &config).unwrap();
    assert!(facts.devices.is_empty(), "no /dev/kvm on this host");
    gpu::mknod_char(&host.path("dev/kvm"), 10, 232).unwrap();
    let facts = render::gather(&host.root, &config).unwrap();
    assert_eq!(facts.devices, ["/dev/kvm"]);
    let files = render::render(&config, Slot::Kube1, &facts);
    check_invariants(&files, "kube1");
    assert!(file(&files, ".nspawn").contains("\nBind=/dev/kvm\n"));
    assert!(file(&files, "override.conf").contains("DeviceAllow=/dev/kvm rwm\n"));
    check_golden("kvm-present", &files);
    // "kvm": false: not bound, though the host has it
    let mut off = config.clone();
    off.kvm = false;
    let facts = render::gather(&host.root, &off).unwrap();
    assert!(facts.devices.is_empty());
    let files = render::render(&off, Slot::Kube1, &facts);
    assert!(!file(&files, ".nspawn").contains("/dev/kvm"));
    assert!(!file(&files, "override.conf").contains("/dev/kvm"));
    // named in "devices" as well: bound once
    let mut both = config.clone();
    both.devices = vec!["/dev/kvm".into()];
    let facts = render::gather(&host.root, &both).unwrap();
    assert_eq!(facts.devices, ["/dev/kvm"]);
    // "kvm": false is written back (the default is not)
    let text = serde_json::to_string(&off).unwrap();
    assert!(text.contains("\"kvm\":false"), "{text}");
    assert!(!serde_json::to_string(&config).unwrap().contains("kvm"));
}

/// The egress proxy (issue 42): one drop-in bound onto containerd.service
/// and kubelet.service with the proxy variables (loopback and the API
/// server in NO_PROXY), and the proxy's CA for SSL_CERT_DIR.
#[test]
fn golden_proxy() {
    let host = Host::new();
    let config = load_scenario("proxy");
    // the CA is read from the host
    let err = render::gather(&host.root, &config).unwrap_err().to_string();
    assert!(err.contains("proxy.ca"), "{err}");
    fs::write(host.path("etc/kubeslot/proxy-ca.pem"), CA).unwrap();
    let facts = render::gather(&host.root, &config).unwrap();
    let files = render::render(&config, Slot::Kube1, &facts);
    check_invariants(&files, "kube1");
    let nspawn = file(&files, ".nspawn");
    for at in [
        "/etc/systemd/system/containerd.service.d/50-kubeslot-proxy.conf",
        "/etc/systemd/system/kubelet.service.d/50-kubeslot-proxy.conf",
    ] {
        assert!(
            nspawn.contains(&format!(
                "BindReadOnly=/etc/kubeslot/host/kube1/proxy.conf:{at}\n"
            )),
            "{nspawn}"
        );
    }
    let dropin = file(&files, "kube1/proxy.conf");
    assert!(dropin.contains(
        "Environment=\"HTTPS_PROXY=http://proxy.corp.example:3128\" \"https_proxy=http://proxy.corp.example:3128\"\n"
    ));
    assert!(
        dropin.contains(
            "Environment=\"NO_PROXY=localhost,127.0.0.1,::1,10.0.0.1,.corp.example,10.0.0.0/8\""
        ),
        "{dropin}"
    );
    assert!(dropin
        .contains("Environment=\"SSL_CERT_DIR=/etc/ssl/certs:/etc/kubeslot/host/proxy-ca\"\n"));
    assert_eq!(file(&files, "kube1/proxy-ca/ca.crt"), CA);
    check_golden("proxy", &files);
    // without a proxy, nothing of it
    let files = render::render(&load_scenario("no-gpu"), Slot::Kube1, &facts);
    assert!(!file(&files, ".nspawn").contains("proxy"));
}

#[test]
fn golden_bootstrap_token() {
    let host = Host::new();
    let config = load_scenario("bootstrap-token");
    let facts = render::gather(&host.root, &config).unwrap();
    assert_eq!(
        facts.ca_pem, CA,
        "the CA comes from the ca_file under the root"
    );
    let files = render::render(&config, Slot::Kube1, &facts);
    check_invariants(&files, "kube1");
    assert!(file(&files, "bootstrap-kubeconfig").contains("token: \"07401b.f395accd246ae52d\"\n"));
    assert!(!files.files.iter().any(|f| f.path.ends_with("kubeconfig")));
    let kubelet = file(&files, "20-kubeslot.conf");
    for arg in [
        "--hostname-override=worker-7",
        "--node-labels=node.kubernetes.io/pool=general,topology.kubernetes.io/zone=zone-a",
        "--register-with-taints=dedicated=batch:NoSchedule,spot:PreferNoSchedule",
        "--bootstrap-kubeconfig=/etc/kubeslot/host/bootstrap-kubeconfig",
        "--kubeconfig=/var/lib/kubelet/kubeconfig",
    ] {
        assert!(kubelet.contains(arg), "{arg}: {kubelet}");
    }
    // settings with a KubeletConfiguration field are in the config drop-in,
    // not deprecated flags
    assert!(!kubelet.contains("--cluster-dns") && !kubelet.contains("--resolv-conf"));
    let kc = kubelet_config_json(&files);
    assert_eq!(kc["clusterDNS"], serde_json::json!(["10.96.0.10"]));
    assert_eq!(kc["clusterDomain"], "cluster.local");
    assert_eq!(kc["resolvConf"], "/etc/kubeslot/host/resolv.conf");
    assert_eq!(kc["serverTLSBootstrap"], false, "off unless asked for");
    // configured nameservers win over the host's
    assert!(file(&files, "resolv.conf").contains("nameserver 2001:db8::53\n"));
    check_golden("bootstrap-token", &files);
}

#[test]
fn golden_exec_credential() {
    let host = Host::new();
    let config = load_scenario("exec-credential");
    let facts = render::gather(&host.root, &config).unwrap();
    let files = render::render(&config, Slot::Kube1, &facts);
    check_invariants(&files, "kube1");
    let kc = file(&files, "kube1/kubeconfig");
    assert!(kc.contains("command: \"/usr/local/bin/cloud-credential-helper\"\n"));
    assert!(
        kc.contains("- \"prod \\\"eu\\\"\"\n"),
        "quoted for YAML: {kc}"
    );
    assert!(!kc.contains("token:"));
    assert!(!files
        .files
        .iter()
        .any(|f| f.path.ends_with("bootstrap-kubeconfig")));
    assert!(file(&files, "20-kubeslot.conf").contains("--kubeconfig=/etc/kubeslot/host/kubeconfig"));
    check_golden("exec-credential", &files);
}

#[test]
fn golden_pod_settings() {
    let host = Host::new();
    fs::write(
        host.path("etc/kubeslot/mirror-ca.pem"),
        CA.replace("Kubeslot", "Mirror"),
    )
    .unwrap();
    let config = load_scenario("pod-settings");
    let facts = render::gather(&host.root, &config).unwrap();
    let files = render::render(&config, Slot::Kube1, &facts);
    check_invariants(&files, "kube1");
    let kubelet = file(&files, "20-kubeslot.conf");
    assert!(
        kubelet.contains(" --node-ip=198.51.100.10,2001:db8::10"),
        "{kubelet}"
    );
    let kc = kubelet_config_json(&files);
    assert_eq!(kc["apiVersion"], "kubelet.config.k8s.io/v1beta1");
    assert_eq!(kc["kind"], "KubeletConfiguration");
    assert_eq!(kc["clusterDomain"], "k8s.example");
    assert_eq!(
        kc["clusterDNS"],
        serde_json::json!(["10.96.0.10", "fd00::a"])
    );
    assert_eq!(kc["serverTLSBootstrap"], true);
    // kubelet.config merged in as given
    assert_eq!(kc["maxPods"], 50);
    assert_eq!(kc["failSwapOn"], false);
    assert_eq!(kc["evictionHard"]["memory.available"], "200Mi");
    assert_eq!(kc["authentication"]["webhook"]["cacheTTL"], "30s");

    let nspawn = file(&files, ".nspawn");
    for bind in [
        "BindReadOnly=/etc/kubeslot/host/kube1/kubelet-config.conf:/etc/kubernetes/kubelet/config.d/50-kubeslot.conf",
        "BindReadOnly=/etc/kubeslot/host/kube1/certs.d:/etc/containerd/certs.d",
    ] {
        assert!(nspawn.lines().any(|l| l == bind), "{bind}:\n{nspawn}");
    }
    let hosts = hosts_tomls(&files);
    assert_eq!(
        hosts.keys().collect::<Vec<_>>(),
        ["docker.io", "registry.internal_5000_", "registry.k8s.io"]
    );
    let k8s = &hosts["registry.k8s.io"];
    assert_eq!(k8s["server"].as_str(), Some("https://registry.k8s.io"));
    let mirrors = k8s["host"].as_table().unwrap();
    assert_eq!(
        mirrors.keys().collect::<Vec<_>>(),
        [
            "https://backup.internal/k8s",
            "https://mirror.internal:5000"
        ]
    );
    let ca = "/etc/containerd/certs.d/registry.k8s.io/ca.crt";
    for (_, m) in mirrors {
        assert_eq!(m["capabilities"].as_array().unwrap().len(), 2);
        assert_eq!(m["ca"].as_str(), Some(ca));
    }
    // the order containerd tries them in is the config's
    let text = file(&files, "registry.k8s.io/hosts.toml");
    assert!(text.find("mirror.internal:5000").unwrap() < text.find("backup.internal").unwrap());
    assert!(file(&files, "registry.k8s.io/ca.crt").contains("MirrorTestCA"));
    // insecure: plain HTTP to the mirror; a loopback mirror is HTTP anyway
    assert!(hosts["registry.internal_5000_"]["host"]
        .as_table()
        .unwrap()
        .contains_key("http://10.0.0.7:5000"));
    assert_eq!(
        hosts["docker.io"]["server"].as_str(),
        Some("https://registry-1.docker.io")
    );
    assert!(hosts["docker.io"]["host"]
        .as_table()
        .unwrap()
        .contains_key("http://127.0.0.1:5001"));
    check_golden("pod-settings", &files);
}

/// The unbounded agent's node settings kubeslot now renders (issue 28):
/// extra host mounts, the host's kubelet extra arguments, containerd's
/// sandbox image and metrics address, an offline image bundle (verified,
/// its private copy bound read-only, listed for the import unit).
#[test]
fn golden_seed_parity() {
    let host = Host::new();
    for d in ["srv/models", "var/log/node-audit", "srv/bundle"] {
        fs::create_dir_all(host.path(d)).unwrap();
    }
    fs::write(
        host.path("etc/kubeslot/default-kubelet"),
        "# carried over from the agent's /etc/default/kubelet\nKUBELET_EXTRA_ARGS=\"--max-pods=60 --v=2\"\n",
    )
    .unwrap();
    let work = tempfile::tempdir().unwrap();
    let digest = kubeslot_test_support::image::bundle_archive(
        &work.path().join("layout"),
        "registry.example/e2e/pause:3.10.2",
        b"pause",
        &host.path("srv/bundle/pause.oci.tar"),
    );
    let text = fs::read_to_string(testdata("render/seed-parity/config.json"))
        .unwrap()
        .replace("@PAUSE_DIGEST@", &digest.to_string());
    let config = Config::parse(Path::new("config.json"), text.as_bytes()).unwrap();
    let facts = render::gather(&host.root, &config).unwrap();
    assert_eq!(facts.kubelet_extra_args, ["--max-pods=60", "--v=2"]);
    let files = render::render(&config, Slot::Kube1, &facts);
    check_invariants(&files, "kube1");
    let nspawn = file(&files, ".nspawn");
    let copy = render::bundle::Copy::of(&config.images).unwrap();
    for line in [
        "BindReadOnly=/srv/models:/var/lib/models",
        "Bind=/var/log/node-audit:/var/log/audit",
        // the verified private copy, not bundle_dir
        &format!(
            "BindReadOnly=/var/lib/kubeslot/bundles/{}:/etc/kubeslot/bundle",
            copy.key
        ),
        "BindReadOnly=/etc/kubeslot/host/kube1/containerd.toml:/etc/containerd/conf.d/50-kubeslot.toml",
    ] {
        assert!(nspawn.lines().any(|l| l == line), "{line}:\n{nspawn}");
    }
    assert!(
        file(&files, "default-kubelet").contains("KUBELET_EXTRA_ARGS=\"--max-pods=60 --v=2\"\n")
    );
    let toml: toml::Table = file(&files, "containerd.toml").parse().unwrap();
    assert_eq!(toml["version"].as_integer(), Some(3));
    assert_eq!(
        toml["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"].as_str(),
        Some("registry.example/e2e/pause:3.10.2")
    );
    assert_eq!(toml["metrics"]["address"].as_str(), Some("0.0.0.0:10257"));
    assert!(file(&files, "bundle-images").ends_with(&format!(
        "\nregistry.example/e2e/pause:3.10.2 {digest} pause.oci.tar\n"
    )));
    check_golden("seed-parity", &files);

    // what the host lacks or breaks is named, before anything is written
    let gather_err = |h: &Host| render::gather(&h.root, &config).unwrap_err().to_string();
    fs::remove_dir(host.path("var/log/node-audit")).unwrap();
    let e = gather_err(&host);
    assert!(
        e.starts_with("extra_mounts: host path /var/log/node-audit (for /var/log/audit): No such file or directory"),
        "{e}"
    );
    fs::create_dir_all(host.path("var/log/node-audit")).unwrap();
    fs::write(
        host.path("etc/kubeslot/default-kubelet"),
        "KUBELET_EXTRA_ARGS=\"--hostname-override=x\"\n",
    )
    .unwrap();
    let e = gather_err(&host);
    assert!(
        e.starts_with("/etc/kubeslot/default-kubelet:1: --hostname-override is set by kubeslot (use kubelet.node_name)"),
        "{e}"
    );
    fs::remove_file(host.path("etc/kubeslot/default-kubelet")).unwrap();
    let facts = render::gather(&host.root, &config).unwrap();
    assert!(facts.kubelet_extra_args.is_empty());
    fs::write(host.path("srv/bundle/pause.oci.tar"), b"not an archive").unwrap();
    let e = gather_err(&host);
    assert!(
        e.starts_with("images.bundle /srv/bundle/pause.oci.tar (registry.example/e2e/pause:3.10.2): oci-archive"),
        "{e}"
    );
}

/// Issue 40 item 3: the bundle was verified at render time but the node
/// imported later from the live `bundle_dir`. Now the render copies each
/// archive into `/var/lib/kubeslot/bundles/<key>` (root only), verifies
/// the copy and binds it: an archive swapped after the render is not what
/// the node imports, at this start or the next render's.
#[test]
fn an_archive_swapped_after_the_render_is_not_what_the_node_imports() {
    use std::os::unix::fs::PermissionsExt as _;
    let host = Host::new();
    for d in ["srv/models", "var/log/node-audit", "srv/bundle"] {
        fs::create_dir_all(host.path(d)).unwrap();
    }
    let work = tempfile::tempdir().unwrap();
    let name = "registry.example/e2e/pause:3.10.2";
    let archive = host.path("srv/bundle/pause.oci.tar");
    let digest = kubeslot_test_support::image::bundle_archive(
        &work.path().join("layout"),
        name,
        b"pause",
        &archive,
    );
    let verified = fs::read(&archive).unwrap();
    let text = fs::read_to_string(testdata("render/seed-parity/config.json"))
        .unwrap()
        .replace("@PAUSE_DIGEST@", &digest.to_string());
    let config = Config::parse(Path::new("config.json"), text.as_bytes()).unwrap();
    let render_and_write = || {
        let facts = render::gather(&host.root, &config)?;
        let files = render::render(&config, Slot::Kube1, &facts);
        render::write(&host.root, &files)?;
        Ok::<_, render::RenderError>(files)
    };
    let files = render_and_write().unwrap();
    // what the node gets: the bound directory, as the .nspawn file names it
    let nspawn = file(&files, ".nspawn");
    let bound = nspawn
        .lines()
        .find_map(|l| l.strip_suffix(":/etc/kubeslot/bundle"))
        .and_then(|l| l.strip_prefix("BindReadOnly="))
        .unwrap_or_else(|| panic!("no bundle bind:\n{nspawn}"));
    assert!(bound.starts_with("/var/lib/kubeslot/bundles/"), "{bound}");
    let imported = || fs::read(host.path(&format!("{bound}/pause.oci.tar"))).unwrap();
    assert_eq!(imported(), verified);
    let mode = |p: &str| fs::metadata(host.path(p)).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode("var/lib/kubeslot/bundles"), 0o700);
    let leftovers = |dir: &str| -> Vec<String> {
        fs::read_dir(host.path(dir))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    assert_eq!(leftovers("var/lib/kubeslot/bundles").len(), 1);

    // swapped after the render: another image under the same name
    kubeslot_test_support::image::bundle_archive(
        &work.path().join("other"),
        name,
        b"PAYLOAD",
        &archive,
    );
    assert_ne!(fs::read(&archive).unwrap(), verified);
    // the next start's render keeps the verified copy; the node imports it
    let again = render_and_write().unwrap();
    assert_eq!(file(&again, ".nspawn"), nspawn);
    assert_eq!(imported(), verified);

    // without the copy the original is copied and verified again: refused
    fs::remove_dir_all(host.path(bound)).unwrap();
    let e = render_and_write().unwrap_err().to_string();
    assert!(
        e.starts_with(&format!("images.bundle /srv/bundle/pause.oci.tar ({name}): index.json names no image of digest {digest}")),
        "{e}"
    );
    // a damaged copy is replaced by a verified one, nothing half-written
    // stays beside it
    kubeslot_test_support::image::bundle_archive(
        &work.path().join("again"),
        name,
        b"pause",
        &archive,
    );
    render_and_write().unwrap();
    fs::write(host.path(&format!("{bound}/pause.oci.tar")), b"damaged").unwrap();
    render_and_write().unwrap();
    assert_eq!(imported(), verified);
    assert_eq!(leftovers("var/lib/kubeslot/bundles").len(), 1);

    // gc removes the copies no slot binds, keeps kube1's
    fs::create_dir_all(host.path("var/lib/kubeslot/bundles/0123abcd")).unwrap();
    let removed = render::bundle::prune(&host.root, false).unwrap();
    assert_eq!(
        removed,
        [Path::new("/var/lib/kubeslot/bundles/0123abcd")],
        "{removed:?}"
    );
    assert_eq!(imported(), verified);
}

#[test]
fn golden_mirrors_from_registries() {
    let host = Host::new();
    let config = load_scenario("mirrors-from-registries");
    let facts = render::gather(&host.root, &config).unwrap();
    let files = render::render(&config, Slot::Kube1, &facts);
    check_invariants(&files, "kube1");
    // the activator's own mirrors for the node image, nothing else
    let hosts = hosts_tomls(&files);
    assert_eq!(
        hosts.keys().collect::<Vec<_>>(),
        ["registry.internal_5000_"]
    );
    let h = &hosts["registry.internal_5000_"];
    assert_eq!(h["server"].as_str(), Some("https://registry.internal:5000"));
    let text = file(&files, "hosts.toml");
    let order: Vec<usize> = [
        "https://mirror-a.internal:5000",
        "http://127.0.0.1:5001",
        "http://mirror-b.internal",
    ]
    .iter()
    .map(|m| {
        text.find(&format!("[host.\"{m}\"]"))
            .unwrap_or_else(|| panic!("{m}: {text}"))
    })
    .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{text}");
    assert!(!text.contains("ca ="));
    check_golden("mirrors-from-registries", &files);

    // an explicit empty map turns the default off: no certs.d, no bind
    let mut none = config.clone();
    none.containerd.registry_mirrors = Some(Default::default());
    let files = render::render(&none, Slot::Kube1, &facts);
    assert!(hosts_tomls(&files).is_empty());
    assert!(!file(&files, ".nspawn").contains("certs.d"));
}

#[test]
fn a_dropped_registry_loses_its_certs_d_files() {
    let host = Host::new();
    host.fake_systemctl();
    fs::write(host.path("etc/kubeslot/mirror-ca.pem"), CA).unwrap();
    let with = CLI_CONFIG.replace("LABEL", "a").replace(
        r#""image""#,
        r#""containerd":{"registry_mirrors":{"registry.k8s.io":{"mirrors":["mirror.internal"],"ca_file":"/etc/kubeslot/mirror-ca.pem"},"quay.io":{"mirrors":["mirror.internal"]}}},"image""#,
    );
    host.write_config(&with);
    ok(host.render(&["kube1"]));
    let certs = host.path("etc/kubeslot/host/kube1/certs.d");
    assert!(certs.join("registry.k8s.io/ca.crt").is_file());
    assert!(certs.join("quay.io/hosts.toml").is_file());
    host.write_config(&with.replace(r#","quay.io":{"mirrors":["mirror.internal"]}"#, ""));
    let out = ok(host.render(&["kube1"]));
    assert!(
        out.contains("removed etc/kubeslot/host/kube1/certs.d/quay.io/hosts.toml"),
        "{out}"
    );
    assert!(
        !certs.join("quay.io").exists(),
        "the registry's dir goes too"
    );
    assert!(certs.join("registry.k8s.io/hosts.toml").is_file());
    assert_eq!(
        host.systemctl_calls().len(),
        1,
        "no unit changed, no reload"
    );
}

#[test]
fn lib_modules_is_bound_only_when_the_host_has_it() {
    let host = Host::new();
    let config = config_with("off");
    let with = render::gather(&host.root, &config).unwrap();
    assert!(with.lib_modules);
    let nspawn = render::render(&config, Slot::Kube1, &with);
    assert!(file(&nspawn, ".nspawn").contains("\nBindReadOnly=/lib/modules\n"));
    fs::remove_dir_all(host.path("lib/modules")).unwrap();
    let without = render::gather(&host.root, &config).unwrap();
    assert!(!without.lib_modules);
    let files = render::render(&config, Slot::Kube1, &without);
    assert!(!file(&files, ".nspawn").contains("/lib/modules"));
}

/// Every golden scenario's `.nspawn` file goes through `systemd-nspawn`'s
/// settings parser (a settings file beside an empty directory: nspawn parses
/// it, then refuses the directory), and its drop-in and render unit through
/// `systemd-analyze verify` on the stock `systemd-nspawn@.service`. Any
/// unknown key, wrong section or malformed bind is a warning line: none may
/// appear. The golden files equal the rendered output (the tests above), so
/// this checks what `render` writes.
#[test]
fn golden_files_pass_systemds_own_parsers() {
    let nspawn = kubeslot_test_support::require_tool("systemd-nspawn", "systemd-container");
    let analyze = kubeslot_test_support::require_tool("systemd-analyze", "systemd");
    let stock = Path::new("/lib/systemd/system/systemd-nspawn@.service");
    assert!(
        stock.exists(),
        "{} is missing: install it with `apt-get install systemd-container`",
        stock.display()
    );
    let mut checked = 0;
    for scenario in fs::read_dir(testdata("render")).unwrap() {
        let files = scenario.unwrap().path().join("files");
        let machine = if files.join("etc/systemd/nspawn/kube2.nspawn").exists() {
            "kube2"
        } else {
            "kube1"
        };
        let work = tempfile::tempdir().unwrap();

        // the .nspawn file
        fs::create_dir(work.path().join(machine)).unwrap();
        fs::copy(
            files.join(format!("etc/systemd/nspawn/{machine}.nspawn")),
            work.path().join(format!("{machine}.nspawn")),
        )
        .unwrap();
        let out = Command::new(&nspawn)
            .args([
                "--settings=trusted",
                "--register=no",
                "--keep-unit",
                "-q",
                "-D",
            ])
            .arg(work.path().join(machine))
            .arg("/bin/true")
            .output()
            .unwrap();
        let err = stderr(&out);
        assert!(!out.status.success());
        let complaints: Vec<&str> = err
            .lines()
            .filter(|l| !l.contains("doesn't look like it has an OS tree"))
            .collect();
        assert!(
            complaints.is_empty() && err.contains("doesn't look like it has an OS tree"),
            "{}: systemd-nspawn complains about the settings file:\n{err}",
            files.display()
        );

        // the drop-in on the stock unit, and the render unit
        let units = work.path().join("units");
        let dropin_dir = format!("systemd-nspawn@{machine}.service.d");
        fs::create_dir_all(units.join(&dropin_dir)).unwrap();
        fs::copy(
            stock,
            units.join(format!("systemd-nspawn@{machine}.service")),
        )
        .unwrap();
        fs::copy(
            files
                .join("etc/systemd/system")
                .join(&dropin_dir)
                .join("override.conf"),
            units.join(&dropin_dir).join("override.conf"),
        )
        .unwrap();
        // the installed binary path does not exist here; verify checks it
        let render_unit =
            fs::read_to_string(files.join("etc/systemd/system/kubeslot-render@.service"))
                .unwrap()
                .replace("/usr/bin/kubeslot-activator", BIN);
        fs::write(
            units.join(format!("kubeslot-render@{machine}.service")),
            render_unit,
        )
        .unwrap();
        // the private BPF filesystem's mount unit the drop-in requires
        let bpffs = format!("run-bpffs-{machine}.mount");
        fs::copy(
            files.join("etc/systemd/system").join(&bpffs),
            units.join(&bpffs),
        )
        .unwrap();
        let out = Command::new(&analyze)
            .arg("verify")
            .arg(units.join(format!("systemd-nspawn@{machine}.service")))
            .arg(units.join(format!("kubeslot-render@{machine}.service")))
            .arg(units.join(&bpffs))
            .output()
            .unwrap();
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "{}: systemd-analyze verify: {}\n{}",
            files.display(),
            out.status,
            stderr(&out)
        );

        // the kubelet drop-in on the image's kubelet.service (its binary
        // swapped for one that exists here)
        let kubelet = work.path().join("kubelet");
        fs::create_dir_all(kubelet.join("kubelet.service.d")).unwrap();
        let unit = fs::read_to_string(workspace_root().join("recipes/files/kubelet.service"))
            .unwrap()
            .replace("/usr/local/bin/kubelet", "/bin/true");
        fs::write(kubelet.join("kubelet.service"), unit).unwrap();
        fs::copy(
            files.join(format!("etc/kubeslot/host/{machine}/20-kubeslot.conf")),
            kubelet.join("kubelet.service.d/20-kubeslot.conf"),
        )
        .unwrap();
        let out = Command::new(&analyze)
            .arg("verify")
            .arg(kubelet.join("kubelet.service"))
            .output()
            .unwrap();
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "{}: systemd-analyze verify kubelet.service: {}\n{}",
            files.display(),
            out.status,
            stderr(&out)
        );
        checked += 1;
    }
    assert_eq!(checked, 14, "one check per golden scenario");
}
