//! `adopt`: unbounded-agent's `kube1` taken over, its identity kept, its
//! kubeconfig rebuilt from the config, no link followed out of the adopted
//! tree, and the activator config written from the applied one.

use super::*;

#[test]
fn adopt_takes_over_unbounded_agents_kube1_flips_away_and_rolls_back_to_it() {
    let img = images();
    let h = Host::new(&img);
    let root = Root::new(h.root());
    unbounded_host(&h);
    let kube1_before = h.slot_snapshot(Slot::Kube1);
    let (code, _, err) = h.cmd(&["activate"]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("adopt"), "{err}");

    // --write-config: refused without an image and key, shown by --dry-run
    let (code, _, err) = h.cmd(&["adopt", "--write-config"]);
    assert_eq!(code, 2, "{err}");
    let (code, out, err) = h.cmd(&[
        "adopt",
        "--dry-run",
        "--write-config",
        "--force",
        "--image",
        "registry.example:5000/node:v1",
        "--public-key",
        "/etc/kubeslot/trust/release.pub",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("would adopt kube1 (running)"), "{out}");
    // the config is shown without its secrets
    assert!(
        !out.contains("0123456789abcdef")
            && out.contains("\"bootstrap_token\": \"<secret: not shown>\""),
        "the token was printed: {out}"
    );
    assert!(
        out.contains(
            "carried over: api_server, ca_data, bootstrap_token, cluster_dns, labels, taints"
        ),
        "{out}"
    );
    assert!(
        out.contains("OCIImage: unbounded-agent's thin image"),
        "{out}"
    );
    assert!(!root.state_file().exists(), "dry-run wrote the state");
    // adopt for real (the test's own config stays: images here are unsigned)
    let (code, out, err) = h.cmd(&["adopt"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.starts_with("adopted kube1 (running)"), "{out}");
    let s = h.state();
    assert_eq!(s.active, Some(Slot::Kube1));
    assert!(s.slot(Slot::Kube1).adopted && s.slot(Slot::Kube1).digest.is_none());
    let (_, out, _) = h.cmd(&["status"]);
    assert!(out.contains("kube1: active (adopted"), "{out}");
    let (code, _, err) = h.cmd(&["adopt"]);
    assert_eq!(code, 1);
    assert!(err.contains("kubeslot already manages this host"), "{err}");
    assert_eq!(
        h.slot_snapshot(Slot::Kube1),
        kube1_before,
        "adopt changed kube1"
    );

    // the next activation flips into kube2; kube1 is kept as it was
    let (_, out, _) = h.cmd(&["plan"]);
    assert!(out.contains("flip kube1 (adopted tree) -> kube2"), "{out}");
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert_eq!(r["slot"], "kube2");
    assert_eq!(h.running(), [Slot::Kube2]);
    assert!(h.enabled(Slot::Kube2) && !h.enabled(Slot::Kube1));
    let s = h.state();
    assert_eq!(s.slot(Slot::Kube1).status, SlotStatus::Previous);
    assert!(s.slot(Slot::Kube1).adopted);
    // the agent's files of kube1 and its tree are untouched
    let mut after = h.slot_snapshot(Slot::Kube1);
    assert_eq!(after, kube1_before);
    after.clear();

    // rollback to the adopted kube1: nothing rendered for it
    let (code, out, err) = h.cmd(&["rollback", "--json"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(h.running(), [Slot::Kube1]);
    assert_eq!(h.tree_version(Slot::Kube1), "kubelet unbounded\n");
    assert_eq!(h.slot_snapshot(Slot::Kube1), kube1_before);
    let s = h.state();
    assert_eq!(s.active, Some(Slot::Kube1));
    assert!(s.slot(Slot::Kube1).adopted);
    assert!(s.bad.iter().any(|b| b.digest == img.v1), "{s:?}");
    // and forward again with another image
    h.set_config("v2", serde_json::json!({}));
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert_eq!(h.running(), [Slot::Kube2]);
}

/// The adopted node's kubelet identity as unbounded-agent's kubelet leaves
/// it after bootstrapping, and the agent's host units.
fn unbounded_identity_and_units(h: &Host) {
    let root = Root::new(h.root());
    let kubelet = root.machine_tree("kube1").join("var/lib/kubelet");
    let pki = kubelet.join("pki");
    fs::create_dir_all(&pki).unwrap();
    fs::write(
        pki.join("kubelet-client-2026-04-27-10-00-00.pem"),
        "CLIENT CERT AND KEY",
    )
    .unwrap();
    fs::set_permissions(
        pki.join("kubelet-client-2026-04-27-10-00-00.pem"),
        fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    std::os::unix::fs::symlink(
        "/var/lib/kubelet/pki/kubelet-client-2026-04-27-10-00-00.pem",
        pki.join("kubelet-client-current.pem"),
    )
    .unwrap();
    fs::write(pki.join("kubelet.crt"), "SERVING CERT").unwrap();
    fs::write(
        kubelet.join("kubeconfig"),
        "users:\n- name: default-auth\n  user:\n    client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem\n",
    )
    .unwrap();
    let units = root.systemd_system_dir();
    fs::create_dir_all(&units).unwrap();
    for u in ["unbounded-agent-daemon.service", "nftables-flush.service"] {
        fs::write(units.join(u), "[Service]\n").unwrap();
    }
}

#[test]
fn adopt_keeps_the_node_identity_and_deals_with_the_agents_units() {
    let img = images();
    let h = Host::new(&img);
    let root = Root::new(h.root());
    unbounded_host(&h);
    unbounded_identity_and_units(&h);
    let node_pki = root.node_state().join("kubelet/pki");
    // the agent's units are named; --dry-run copies and stops nothing
    let (code, out, err) = h.cmd(&["adopt", "--dry-run"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("would copy the kubelet's identity into /var/lib/kubeslot/node/kubelet: pki/ (kubelet-client-2026-04-27-10-00-00.pem, kubelet-client-current.pem, kubelet.crt) and kubeconfig"),
        "{out}"
    );
    for u in ["unbounded-agent-daemon.service", "nftables-flush.service"] {
        assert!(
            out.contains(&format!("warning: {u} is installed")) && out.contains("--disable-agent"),
            "{u}: {out}"
        );
    }
    assert!(!node_pki.exists());
    let (_, out, _) = h.cmd(&["adopt", "--dry-run", "--disable-agent"]);
    assert!(
        out.contains("would stop and disable unbounded-agent-daemon.service"),
        "{out}"
    );

    // dropped fields that change the node's behaviour: refused without
    // --force, before the agent's units or the identity are touched
    let applied = kubeslot_test_support::workspace_root()
        .join("testdata/adopt/later-schema/applied-config.json");
    let written = h.root().join("etc/kubeslot/adopted.json");
    let mut args = vec![
        "adopt",
        "--disable-agent",
        "--write-config",
        "--config",
        written.to_str().unwrap(),
        "--applied-config",
        applied.to_str().unwrap(),
        "--image",
        "ghcr.io/example/kubeslot-node:v1.35.1",
        "--public-key",
        "/etc/kubeslot/trust/release.pub",
    ];
    h.clear_calls();
    let (code, out, err) = h.cmd(&args);
    assert_eq!(code, 3, "{out}\n{err}");
    assert!(
        err.contains("the node would behave differently without it: FutureField.Knob, LocalDNS")
            && err.contains("--force"),
        "{err}"
    );
    assert!(h.changes().is_empty(), "{:?}", h.changes());
    assert!(!written.exists() && !root.state_file().exists() && !node_pki.exists());

    args.push("--force");
    let (code, out, err) = h.cmd(&args);
    assert_eq!(code, 0, "{out}\n{err}");
    let calls = h.changes();
    for c in [
        "systemctl stop unbounded-agent-daemon.service",
        "systemctl disable --quiet unbounded-agent-daemon.service",
        "systemctl stop nftables-flush.service",
        "systemctl disable --quiet nftables-flush.service",
    ] {
        assert!(calls.contains(&c.to_string()), "{c}: {calls:?}");
    }
    assert!(
        out.contains("stopped and disabled unbounded-agent-daemon.service"),
        "{out}"
    );
    assert!(!out.contains("0123456789abcdef"), "{out}");
    // the identity is in the node state, as the kubelet left it
    let key = node_pki.join("kubelet-client-2026-04-27-10-00-00.pem");
    assert_eq!(fs::read_to_string(&key).unwrap(), "CLIENT CERT AND KEY");
    assert_eq!(
        fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(
        fs::read_link(node_pki.join("kubelet-client-current.pem")).unwrap(),
        Path::new("/var/lib/kubelet/pki/kubelet-client-2026-04-27-10-00-00.pem")
    );
    let kubeconfig = root.node_state().join("kubelet/kubeconfig");
    assert!(fs::read_to_string(&kubeconfig)
        .unwrap()
        .contains("client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem"));
    assert_eq!(
        fs::metadata(&kubeconfig).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // the flip to kube2 keeps it (kube2 binds the node state)
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert_eq!(fs::read_to_string(&key).unwrap(), "CLIENT CERT AND KEY");
    assert!(fs::read_to_string(root.nspawn_file("kube2"))
        .unwrap()
        .contains("Bind=/var/lib/kubeslot/node/kubelet:/var/lib/kubelet"));
}

/// The `adopt` arguments that write a config from the later-schema
/// applied config (API server `10.1.0.1:6443`, a bootstrap token).
fn adopt_writing_config(h: &Host, applied: &str) -> Vec<String> {
    let applied = kubeslot_test_support::workspace_root().join(applied);
    let written = h.root().join("etc/kubeslot/adopted.json");
    [
        "adopt",
        "--write-config",
        "--config",
        written.to_str().unwrap(),
        "--applied-config",
        applied.to_str().unwrap(),
        "--image",
        "ghcr.io/example/kubeslot-node:v1.35.1",
        "--public-key",
        "/etc/kubeslot/trust/release.pub",
        "--force",
    ]
    .map(String::from)
    .to_vec()
}

/// Issue 26, finding 8: `adopt` copied the adopted node's kubeconfig, so
/// its `server`, CA and `exec` plugin (from a tree nothing verified) were
/// what every later kubelet used. It is rebuilt from the config: the
/// config's API server, the host's cluster CA, and of the adopted one only
/// the client certificate and key, each a file of the copied `pki/`.
#[test]
fn adopt_rebuilds_the_kubeconfig_from_the_config_not_the_adopted_one() {
    let img = images();
    let h = Host::new(&img);
    let root = Root::new(h.root());
    unbounded_host(&h);
    unbounded_identity_and_units(&h);
    let adopted = root
        .machine_tree("kube1")
        .join("var/lib/kubelet/kubeconfig");
    fs::write(
        &adopted,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: evil\n  cluster:\n    \
         server: https://203.0.113.66:6443\n    certificate-authority-data: RVZJTENB\n\
         users:\n- name: default-auth\n  user:\n    \
         client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem\n    \
         client-key: /var/lib/kubelet/pki/kubelet-client-current.pem\n    \
         exec:\n      command: /tmp/evil-plugin\n",
    )
    .unwrap();
    let args = adopt_writing_config(&h, "testdata/adopt/later-schema/applied-config.json");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, out, err) = h.cmd(&args);
    assert_eq!(code, 0, "{out}\n{err}");
    let kubeconfig = fs::read_to_string(root.node_state().join("kubelet/kubeconfig")).unwrap();
    let written: serde_json::Value =
        serde_json::from_slice(&fs::read(h.root().join("etc/kubeslot/adopted.json")).unwrap())
            .unwrap();
    let server = written["kubelet"]["api_server"].as_str().unwrap();
    assert!(server.contains("10.1.0.1:6443"), "{written:#}");
    assert_eq!(
        kubeconfig,
        format!(
            "# Rebuilt by kubeslot-activator adopt: the API server and CA of the config,\n\
             # the adopted kubelet's client certificate; nothing else of the adopted one.\n\
             apiVersion: v1\nkind: Config\nclusters:\n- name: kubeslot\n  cluster:\n    \
             server: \"{server}\"\n    \
             certificate-authority: /etc/kubernetes/pki/apiserver-client-ca.crt\n\
             contexts:\n- name: kubeslot\n  context:\n    cluster: kubeslot\n    \
             user: kubelet\ncurrent-context: kubeslot\nusers:\n- name: kubelet\n  user:\n    \
             client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem\n    \
             client-key: /var/lib/kubelet/pki/kubelet-client-current.pem\n"
        )
    );
}

/// Issue 26, finding 8: an adopted kubeconfig whose client certificate is
/// not a file of the copied `pki/` (here a host path) is not carried: the
/// kubelet bootstraps again with the config's token.
#[test]
fn adopt_carries_no_kubeconfig_naming_a_certificate_outside_pki() {
    let img = images();
    let h = Host::new(&img);
    let root = Root::new(h.root());
    unbounded_host(&h);
    unbounded_identity_and_units(&h);
    fs::write(
        root.machine_tree("kube1").join("var/lib/kubelet/kubeconfig"),
        "users:\n- name: x\n  user:\n    client-certificate: /var/lib/kubelet/pki/../../../../etc/kubeslot/host/kube1/bootstrap-kubeconfig\n",
    )
    .unwrap();
    let args = adopt_writing_config(&h, "testdata/adopt/later-schema/applied-config.json");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, out, err) = h.cmd(&args);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(root.node_state().join("kubelet/pki").is_dir());
    assert!(!root.node_state().join("kubelet/kubeconfig").exists());
}

/// Issue 26, finding 9: `adopt --dry-run` printed the exec credential's
/// arguments (which often carry a token or a secret's path); they are
/// shown redacted, as its environment values are.
#[test]
fn adopt_dry_run_shows_no_exec_credential_argument() {
    let img = images();
    let h = Host::new(&img);
    unbounded_host(&h);
    let mut args = adopt_writing_config(&h, "testdata/adopt/exec-credential/applied-config.json");
    args.push("--dry-run".into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, out, err) = h.cmd(&args);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("/usr/local/bin/kubelogin"), "{out}");
    for secret in ["get-token", "--login", "msi", "s3cr3t"] {
        assert!(!out.contains(secret), "{secret} shown: {out}");
    }
    assert!(
        out.contains(kubeslot_activator::host::adopt::REDACTED),
        "{out}"
    );
}

#[test]
fn adopt_never_follows_a_link_out_of_the_adopted_tree() {
    let img = images();
    let h = Host::new(&img);
    let root = Root::new(h.root());
    unbounded_host(&h);
    // the node (root in its machine) made its /var/lib/kubelet a link to
    // a host directory
    let secret = h.root().join("etc/host-secret/pki");
    fs::create_dir_all(&secret).unwrap();
    fs::write(secret.join("key.pem"), "HOST SECRET").unwrap();
    let kubelet = root.machine_tree("kube1").join("var/lib/kubelet");
    fs::create_dir_all(kubelet.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink("../../../../../../etc/host-secret", &kubelet).unwrap();
    assert!(
        kubelet.join("pki/key.pem").exists(),
        "the link must resolve"
    );
    let (code, out, err) = h.cmd(&["adopt"]);
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(
        err.contains("var/lib/kubelet/pki: a symlink on the way, or a path leading out of the tree: not followed"),
        "{err}"
    );
    assert!(!root.state_file().exists());
    assert!(!root.node_state().join("kubelet/pki").exists());
}

#[test]
fn adopt_names_the_machine_that_runs_when_told_another() {
    let img = images();
    let h = Host::new(&img);
    unbounded_host(&h);
    // a stopped kube2 tree beside the running kube1
    fs::create_dir_all(Root::new(h.root()).machine_tree("kube2").join("etc")).unwrap();
    let (code, _, err) = h.cmd(&["adopt", "--machine", "kube2"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("machine kube1 is running, not kube2: adopt the machine that runs the node (--machine kube1)"),
        "{err}"
    );
    assert!(!Root::new(h.root()).state_file().exists());
}

#[test]
fn adopt_writes_the_activator_config_from_the_applied_config() {
    let img = images();
    let h = Host::new(&img);
    unbounded_host(&h);
    let written = h.root().join("etc/kubeslot/adopted.json");
    // the agent's KUBELET_EXTRA_ARGS convention, and a variable kubeslot's
    // kubelet unit does not pass
    let defaults = Root::new(h.root())
        .machine_tree("kube1")
        .join("etc/default");
    fs::create_dir_all(&defaults).unwrap();
    fs::write(
        defaults.join("kubelet"),
        "KUBELET_EXTRA_ARGS=\"--max-pods=60 --v=2\"\nKUBELET_TUNING_ARGS=--kube-api-qps=50\n",
    )
    .unwrap();
    let args = [
        "adopt",
        "--write-config",
        "--config",
        written.to_str().unwrap(),
        "--image",
        "ghcr.io/example/kubeslot-node:v1.35.1",
        "--public-key",
        "/etc/kubeslot/trust/release.pub",
    ];
    // an applied config that does not match its sidecar: nothing changes
    let applied = Root::new(h.root()).unbounded_applied_config("kube1");
    let good = fs::read(&applied).unwrap();
    fs::write(&applied, [&good[..], b" "].concat()).unwrap();
    let (code, _, err) = h.cmd(&args);
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("kube1-applied-config.json.sha256 says"),
        "{err}"
    );
    assert!(!written.exists() && !Root::new(h.root()).state_file().exists());
    fs::write(&applied, &good).unwrap();

    // KUBELET_TUNING_ARGS is not carried over and changes the node: --force
    let (code, _, err) = h.cmd(&args);
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("/etc/default/kubelet KUBELET_TUNING_ARGS"),
        "{err}"
    );
    assert!(!Root::new(h.root()).kubelet_extra_args().exists());
    let forced: Vec<&str> = args.iter().copied().chain(["--force"]).collect();
    let (code, out, err) = h.cmd(&forced);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains(&format!("wrote {} (mode 0600)", written.display())),
        "{out}"
    );
    assert!(
        out.contains("wrote /etc/kubeslot/default-kubelet from the adopted node's /etc/default/kubelet: KUBELET_EXTRA_ARGS=\"--max-pods=60 --v=2\""),
        "{out}"
    );
    assert!(
        out.contains(
            "  /etc/default/kubelet KUBELET_TUNING_ARGS: the agent's kubelet unit passed it"
        ),
        "{out}"
    );
    // what the render reads back
    assert_eq!(
        kubeslot_activator::render::extra_args::read(&Root::new(h.root()), &[]).unwrap(),
        ["--max-pods=60", "--v=2"]
    );
    assert!(
        !out.contains("0123456789abcdef"),
        "the token was printed: {out}"
    );
    let meta = fs::metadata(&written).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let want = fs::read_to_string(
        kubeslot_test_support::workspace_root()
            .join("testdata/adopt/token-snapshot/activator.json"),
    )
    .unwrap();
    assert_eq!(fs::read_to_string(&written).unwrap(), want);
    assert!(h.state().slot(Slot::Kube1).adopted);
    // an existing config is replaced only with --force (the state is
    // recorded now, so this is refused for that reason first)
    let (code, _, err) = h.cmd(&args);
    assert_eq!(code, 1, "{err}");
}

/// Issue 40, item 2: the adopted tree is the node's, not a trusted source,
/// so the kubelet flags in its `/etc/default/kubelet` are shown in full
/// and carried over only with `--force`; flags that turn off the node's
/// security (in the kubelet's `_` spelling too) are never carried over.
#[test]
fn adopt_refuses_untrusted_kubelet_flags() {
    let img = images();
    let h = Host::new(&img);
    unbounded_host(&h);
    let root = Root::new(h.root());
    let written = h.root().join("etc/kubeslot/adopted.json");
    let defaults = root.machine_tree("kube1").join("etc/default");
    fs::create_dir_all(&defaults).unwrap();
    let args = [
        "adopt",
        "--write-config",
        "--config",
        written.to_str().unwrap(),
        "--image",
        "ghcr.io/example/kubeslot-node:v1.35.1",
        "--public-key",
        "/etc/kubeslot/trust/release.pub",
    ];
    let forced: Vec<&str> = args.iter().copied().chain(["--force"]).collect();

    // flags that turn the node's kubelet open: never carried over, --force
    // or not (the node could have written them)
    fs::write(
        defaults.join("kubelet"),
        "KUBELET_EXTRA_ARGS=\"--max-pods=60 --anonymous_auth=true --authorization-mode=AlwaysAllow --pod-manifest-path=/etc/kubernetes/evil\"\n",
    )
    .unwrap();
    let (code, _, err) = h.cmd(&args);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("--anonymous-auth"), "{err}");
    assert!(!written.exists() && !root.state_file().exists());
    assert!(!root.kubelet_extra_args().exists());
    let (code, out, err) = h.cmd(&[&forced[..], &["--dry-run"]].concat());
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("--anonymous-auth turns off part of the node's security"),
        "{out}"
    );
    assert!(
        !out.contains("would write /etc/kubeslot/default-kubelet"),
        "{out}"
    );

    // plain tuning flags: shown in full, written only with --force
    fs::write(
        defaults.join("kubelet"),
        "KUBELET_EXTRA_ARGS=\"--max-pods=60 --v=2\"\n",
    )
    .unwrap();
    let (code, _, err) = h.cmd(&args);
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("KUBELET_EXTRA_ARGS=\"--max-pods=60 --v=2\"") && err.contains("--force"),
        "{err}"
    );
    assert!(!written.exists() && !root.state_file().exists());
    assert!(!root.kubelet_extra_args().exists());
    let (code, out, err) = h.cmd(&forced);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("wrote /etc/kubeslot/default-kubelet from the adopted node's /etc/default/kubelet: KUBELET_EXTRA_ARGS=\"--max-pods=60 --v=2\""),
        "{out}"
    );
}
