//! The `render` command against a temp root (a fake `systemctl` records its
//! calls): an unusable config writes nothing, rewrites and reloads only on
//! change, concurrent renders take turns, an unreadable CA, a switch of
//! credentials, the config a slot was activated with, and `diff`.

use super::*;

#[test]
fn render_with_an_unusable_config_exits_3_and_writes_nothing() {
    let host = Host::new();
    host.fake_systemctl();
    host.fake_ldconfig();
    let before = tree(host.root.dir());
    let config = host.root.default_config();

    // missing
    let o = host.render(&["kube1"]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains(&config.display().to_string()), "{e}");

    // an unknown field
    host.write_config(&CLI_CONFIG.replace("\"image\"", "\"imgae\":1,\"image\""));
    let o = host.render(&["kube2"]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stderr(&o).contains("imgae"), "{}", stderr(&o));

    // readable, but names a CA file the host does not have
    fs::remove_file(host.path("etc/kubeslot/cluster-ca.pem")).unwrap();
    host.write_config(&CLI_CONFIG.replace("LABEL", "a"));
    let o = host.render(&["kube1"]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("cluster-ca.pem"), "{e}");

    // nothing was written: the tree is what it was, less the CA and the
    // config this test removed and wrote
    fs::remove_file(&config).unwrap();
    let mut after = tree(host.root.dir());
    let mut before = before;
    before.retain(|p, _| !p.ends_with("cluster-ca.pem"));
    after.retain(|p, _| !p.ends_with("cluster-ca.pem"));
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>()
    );
    assert!(
        host.systemctl_calls().is_empty(),
        "{:?}",
        host.systemctl_calls()
    );
}

#[test]
fn render_rewrites_and_reloads_only_when_devices_change() {
    let host = Host::new();
    host.fake_systemctl();
    host.fake_ldconfig();
    host.write_config(&CLI_CONFIG.replace("LABEL", "a"));

    let out = ok(host.render(&["kube1"]));
    assert!(
        out.contains("kube1: wrote etc/systemd/nspawn/kube1.nspawn"),
        "{out}"
    );
    assert!(
        out.contains("wrote etc/systemd/system/kubeslot-render@.service"),
        "{out}"
    );
    assert_eq!(host.systemctl_calls(), ["daemon-reload"]);
    assert_eq!(
        fs::metadata(host.path("etc/kubeslot/host/kube1/bootstrap-kubeconfig"))
            .unwrap()
            .mode()
            & 0o7777,
        0o600
    );
    assert_eq!(
        fs::metadata(host.path("etc/kubeslot/host/kube1"))
            .unwrap()
            .mode()
            & 0o777,
        0o700
    );
    assert!(
        host.path("var/lib/kubeslot/node/kubelet").is_dir(),
        "Bind= sources exist"
    );
    assert!(host.path("var/lib/kubeslot/node/containerd").is_dir());
    let shipped =
        fs::read_to_string(workspace_root().join("activator/units/kubeslot-render@.service"))
            .unwrap();
    assert_eq!(
        host.read("etc/systemd/system/kubeslot-render@.service"),
        shipped
    );

    // the same devices: nothing written (same inodes), no reload
    let before = tree(&host.path("etc"));
    let out = ok(host.render(&["kube1"]));
    assert_eq!(out.trim(), "kube1: host files unchanged");
    assert_eq!(tree(&host.path("etc")), before);
    assert_eq!(host.systemctl_calls().len(), 1);

    // a reboot brings GPUs: re-rendered with the new binds, reloaded
    host.add_gpus();
    let out = ok(host.render(&["kube1"]));
    assert!(
        out.contains("wrote etc/systemd/system/systemd-nspawn@kube1.service.d/override.conf"),
        "{out}"
    );
    assert!(
        !out.contains("kubeconfig"),
        "unchanged files are not rewritten: {out}"
    );
    assert_eq!(host.systemctl_calls(), ["daemon-reload", "daemon-reload"]);
    let nspawn = host.read("etc/systemd/nspawn/kube1.nspawn");
    assert!(
        nspawn.contains("Bind=/dev/nvidia0\n") && nspawn.contains(":/run/host-nvidia/0\n"),
        "{nspawn}"
    );
    let dropin = host.read("etc/systemd/system/systemd-nspawn@kube1.service.d/override.conf");
    assert!(
        dropin.contains("DeviceAllow=/dev/nvidia0 rwm\n")
            && dropin.contains("DeviceAllow=/dev/dri/renderD128 rwm\n")
    );
    ok(host.render(&["kube1"]));
    assert_eq!(host.systemctl_calls().len(), 2);

    // and a reboot without them removes the binds again
    host.remove_gpus();
    ok(host.render(&["kube1"]));
    assert_eq!(host.systemctl_calls().len(), 3);
    assert!(!host
        .read("etc/systemd/nspawn/kube1.nspawn")
        .contains("nvidia"));

    // a drifted mode of the credential's dir is repaired, nothing rewritten
    fs::set_permissions(
        host.path("etc/kubeslot/host/kube1"),
        fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    assert_eq!(
        ok(host.render(&["kube1"])).trim(),
        "kube1: host files unchanged"
    );
    assert_eq!(
        fs::metadata(host.path("etc/kubeslot/host/kube1"))
            .unwrap()
            .mode()
            & 0o777,
        0o700
    );

    // a kubelet setting changes host files only: no reload needed
    host.write_config(&CLI_CONFIG.replace("LABEL", "b"));
    let out = ok(host.render(&["kube1"]));
    assert_eq!(
        out.trim(),
        "kube1: wrote etc/kubeslot/host/kube1/20-kubeslot.conf"
    );
    assert_eq!(host.systemctl_calls().len(), 3);
}

#[test]
fn concurrent_renders_of_one_machine_take_turns() {
    let host = Host::new();
    host.fake_systemctl();
    host.write_config(&CLI_CONFIG.replace("LABEL", "a"));
    // all start on a fresh root, so all of them write: without the lock
    // one's stale-file sweep removes another's temp file mid-write
    for round in 0..5 {
        host.write_config(&CLI_CONFIG.replace("LABEL", &format!("r{round}")));
        let path = format!(
            "{}:{}",
            host.path("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let children: Vec<_> = (0..6)
            .map(|_| {
                Command::new(BIN)
                    .args(["render", "--root"])
                    .arg(host.root.dir())
                    .arg("kube1")
                    .env("PATH", &path)
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for c in children {
            ok(c.wait_with_output().unwrap());
        }
        let dir = tree(&host.path("etc/kubeslot/host/kube1"));
        assert_eq!(dir.len(), 7, "{:?}", dir.keys().collect::<Vec<_>>());
        assert!(host
            .read("etc/kubeslot/host/kube1/20-kubeslot.conf")
            .contains(&format!("pool=r{round}")));
    }
}

#[test]
fn unreadable_ca_fails_naming_the_file_and_writes_nothing() {
    let host = Host::new();
    host.fake_systemctl();
    let missing = CLI_CONFIG.replace("cluster-ca.pem", "missing-ca.pem");

    // first render on a fresh host: nothing at all appears
    host.write_config(&missing);
    let o = host.render(&["kube1"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains(
            &host
                .path("etc/kubeslot/missing-ca.pem")
                .display()
                .to_string()
        ),
        "{e}"
    );
    assert!(e.contains("cluster CA"), "{e}");
    assert!(!host.path("etc/systemd").exists() && !host.path("etc/kubeslot/host").exists());

    // after a good render, a bad config leaves every file as it was
    host.write_config(&CLI_CONFIG.replace("LABEL", "a"));
    ok(host.render(&["kube1"]));
    let before = tree(&host.path("etc"));
    host.write_config(&missing.replace("LABEL", "changed"));
    let o = host.render(&["kube1"]);
    assert!(!o.status.success(), "{}", stdout(&o));
    let mut after = tree(&host.path("etc"));
    let config = PathBuf::from("kubeslot/activator.json");
    after.insert(config.clone(), before[&config].clone());
    assert_eq!(after, before, "nothing half-written");
    assert_eq!(host.systemctl_calls(), ["daemon-reload"]);
}

#[test]
fn switching_to_an_exec_credential_removes_the_stale_token() {
    let host = Host::new();
    host.fake_systemctl();
    host.write_config(&CLI_CONFIG.replace("LABEL", "a"));
    ok(host.render(&["kube2"]));
    assert!(host
        .path("etc/kubeslot/host/kube2/bootstrap-kubeconfig")
        .exists());
    fs::write(
        host.path("etc/kubeslot/host/kube2/.tmp-left-by-a-crash"),
        "x",
    )
    .unwrap();
    host.write_config(&CLI_CONFIG.replace("LABEL", "a").replace(
        r#""bootstrap_token":"abcdef.0123456789abcdef""#,
        r#""exec_credential":{"command":"/usr/local/bin/helper"}"#,
    ));
    let out = ok(host.render(&["kube2"]));
    assert!(
        out.contains("kube2: removed etc/kubeslot/host/kube2/bootstrap-kubeconfig"),
        "{out}"
    );
    assert!(
        out.contains("kube2: removed etc/kubeslot/host/kube2/.tmp-left-by-a-crash"),
        "{out}"
    );
    assert!(!host
        .path("etc/kubeslot/host/kube2/bootstrap-kubeconfig")
        .exists());
    assert!(host
        .read("etc/kubeslot/host/kube2/kubeconfig")
        .contains("/usr/local/bin/helper"));
    assert_eq!(host.systemctl_calls().len(), 1, "no unit changed");
    // the other machine's files are not this render's business
    assert!(!host.path("etc/kubeslot/host/kube1").exists());
}

#[test]
fn the_config_a_slot_was_activated_with_wins() {
    let host = Host::new();
    host.fake_systemctl();
    host.write_config(
        &CLI_CONFIG
            .replace("LABEL", "a")
            .replace("\"labels\"", "\"node_name\":\"current\",\"labels\""),
    );
    let mut activated = config_with("off");
    activated.kubelet.node_name = Some("activated".into());
    let saved = render::save_inputs(&host.root, Slot::Kube1, &activated).unwrap();
    assert_eq!(fs::metadata(&saved).unwrap().mode() & 0o777, 0o600);
    ok(host.render(&["kube1"]));
    assert_eq!(host.read("etc/kubeslot/host/kube1/hostname"), "activated\n");
    // an explicit --config wins over both
    let explicit = host.path("explicit.json");
    fs::write(
        &explicit,
        CLI_CONFIG
            .replace("LABEL", "a")
            .replace("\"labels\"", "\"node_name\":\"explicit\",\"labels\""),
    )
    .unwrap();
    ok(host.render(&["--config", explicit.to_str().unwrap(), "kube1"]));
    assert_eq!(host.read("etc/kubeslot/host/kube1/hostname"), "explicit\n");
    // without saved inputs the default config is used
    ok(host.render(&["kube2"]));
    assert_eq!(host.read("etc/kubeslot/host/kube2/hostname"), "current\n");
}

#[test]
fn diff_shows_what_write_would_change() {
    let host = Host::new();
    let config = config_with("off");
    let facts = render::gather(&host.root, &config).unwrap();
    let files = render::render(&config, Slot::Kube1, &facts);
    let d = render::diff(&host.root, &files);
    assert_eq!(d.len(), files.files.len());
    assert!(
        d.iter().all(|f| f.diff.starts_with("--- /dev/null\n")),
        "{d:?}"
    );
    render::write(&host.root, &files).unwrap();
    assert!(render::diff(&host.root, &files)
        .iter()
        .all(|f| f.diff.is_empty()));
    let mut c2 = config.clone();
    c2.kubelet.cluster_dns = vec!["10.96.0.10".into()];
    let files2 = render::render(&c2, Slot::Kube1, &facts);
    let changed: Vec<_> = render::diff(&host.root, &files2)
        .into_iter()
        .filter(|f| !f.diff.is_empty())
        .collect();
    assert_eq!(changed.len(), 1, "{changed:?}");
    assert!(
        changed[0].path.ends_with("kubelet-config.conf"),
        "{changed:?}"
    );
    assert!(
        changed[0].diff.contains("+  \"clusterDNS\": ["),
        "{}",
        changed[0].diff
    );
    assert!(changed[0].diff.contains("+    \"10.96.0.10\""));
    // a registry mirror shows up as new files (plan prints this diff)
    let mut c3 = config.clone();
    c3.registries.insert(
        "ghcr.io".into(),
        kubeslot_activator::config::RegistryConfig {
            mirrors: vec!["mirror.internal:5000".into()],
            ..Default::default()
        },
    );
    let files3 = render::render(&c3, Slot::Kube1, &facts);
    let d3 = render::diff(&host.root, &files3);
    let hosts = d3
        .iter()
        .find(|f| f.path.ends_with("certs.d/ghcr.io/hosts.toml"))
        .expect("hosts.toml in the plan's diff");
    assert!(hosts.diff.starts_with("--- /dev/null\n"), "{}", hosts.diff);
    assert!(hosts
        .diff
        .contains("+[host.\"https://mirror.internal:5000\"]"));
    // a wrong mode is a difference too, and write repairs it
    let kc = host.path("etc/kubeslot/host/kube1/bootstrap-kubeconfig");
    fs::set_permissions(&kc, fs::Permissions::from_mode(0o644)).unwrap();
    let d = render::diff(&host.root, &files);
    assert!(
        d.iter().any(|f| f.diff.contains("mode 0644 -> 0600")),
        "{d:?}"
    );
    let outcome = render::write(&host.root, &files).unwrap();
    assert_eq!(
        outcome.changed,
        [PathBuf::from(
            "etc/kubeslot/host/kube1/bootstrap-kubeconfig"
        )]
    );
    assert!(!outcome.dropin_changed);
    assert_eq!(fs::metadata(&kc).unwrap().mode() & 0o777, 0o600);
}
