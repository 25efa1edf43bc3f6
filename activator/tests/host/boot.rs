//! Boot and reconcile: the committed slot enabled at boot and started after a
//! reboot, a committed node that does not come up, and running machines the
//! state does not account for.

use super::*;

#[test]
fn boot_follows_the_commit_and_a_reboot_starts_the_committed_node() {
    let img = images();
    let h = Host::new(&img);
    assert_eq!(h.activate().0, 0);
    assert!(h.enabled(Slot::Kube1) && !h.enabled(Slot::Kube2));
    h.set_config("v2", serde_json::json!({}));
    h.clear_calls();
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert!(h.enabled(Slot::Kube2) && !h.enabled(Slot::Kube1));
    // the old machine loses its boot link before the new one gets it
    let calls = h.calls();
    let pos = |c: &str| {
        calls
            .iter()
            .position(|x| x == c)
            .unwrap_or_else(|| panic!("{c}: {calls:?}"))
    };
    assert!(
        pos("systemctl start systemd-nspawn@kube2.service")
            < pos("systemctl disable --quiet systemd-nspawn@kube1.service")
            && pos("systemctl disable --quiet systemd-nspawn@kube1.service")
                < pos("systemctl enable --quiet systemd-nspawn@kube2.service"),
        "{calls:?}"
    );

    // power loss; at boot nothing runs (no systemd here to start the
    // enabled machine): the boot-time activate starts and gates kube2
    h.power_off();
    h.clear_calls();
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert_eq!(
        (r["outcome"].as_str(), r["slot"].as_str()),
        (Some("started"), Some("kube2"))
    );
    assert!(r["phases"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["name"] == "reconcile"));
    assert_eq!(
        starts_and_stops(&h.calls()),
        ["systemctl start systemd-nspawn@kube2.service"]
    );
    assert_eq!(h.running(), [Slot::Kube2]);
    let (_, out, _) = h.cmd(&["status"]);
    assert!(
        out.contains("active: kube2") && out.contains("exit 0, started"),
        "{out}"
    );
    // running: the next boot-time run is up to date and starts nothing
    h.clear_calls();
    let (code, r, _) = h.activate();
    assert_eq!((code, r["outcome"].as_str()), (0, Some("up-to-date")));
    assert!(starts_and_stops(&h.calls()).is_empty());

    // a lost boot link is put back; a stray one of the other slot removed
    fs::remove_file(Root::new(h.root()).machine_wants_link("kube2")).unwrap();
    std::os::unix::fs::symlink("/x", Root::new(h.root()).machine_wants_link("kube1")).unwrap();
    assert_eq!(h.activate().0, 0);
    assert!(h.enabled(Slot::Kube2) && !h.enabled(Slot::Kube1));

    // the previous node started by hand while the committed one is down:
    // refused, nothing started or stopped
    h.power_off();
    h.cmd(&["status"]);
    let out = Command::new(h.fake().join("bin/systemctl"))
        .args(["start", "systemd-nspawn@kube1.service"])
        .env("KUBESLOT_FAKE", h.fake())
        .env("KUBESLOT_FAKE_ROOT", h.root())
        .env("KUBESLOT_FAKE_PORT", h.port.to_string())
        .output()
        .unwrap();
    assert!(out.status.success());
    h.clear_calls();
    let (code, r, _) = h.activate();
    assert_eq!(code, 3, "{r:#}");
    let e = r["error"].as_str().unwrap();
    assert!(
        e.contains("machine kube1 is running, but the committed node is kube2"),
        "{e}"
    );
    assert!(starts_and_stops(&h.calls()).is_empty(), "{:?}", h.calls());
    assert_eq!(h.running(), [Slot::Kube1]);
}

#[test]
fn a_committed_node_that_does_not_come_up_never_blocks_the_way_out() {
    let img = images();
    let h = Host::new(&img);
    let root = Root::new(h.root());
    // gates that fail do not take the default 5 s each
    let config = |tag: &str| {
        let mut c = h.config(tag, serde_json::json!({}));
        c["health"]["timeout_secs"] = 2.into();
        fs::write(h.config_path(), serde_json::to_vec(&c).unwrap()).unwrap();
    };
    config("v1");
    assert_eq!(h.activate().0, 0);
    // kube1's tree is gone while the host is off: its unit cannot start
    fs::remove_dir_all(root.machine_tree("kube1")).unwrap();
    h.power_off();
    // the same image: nothing else to do, so the run says the node is down
    let (code, r, err) = h.activate();
    assert_eq!(code, 1, "{err}\n{r:#}");
    let e = r["error"].as_str().unwrap();
    assert!(
        e.contains("the committed node kube1 was not running: started it, but")
            && e.contains("activate --force"),
        "{e}"
    );
    assert!(
        r["reconcile"].as_str().unwrap().contains("unit-start"),
        "{r:#}"
    );
    // a new image flips, treating kube1 as down
    config("v2");
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert_eq!(
        (r["outcome"].as_str(), r["slot"].as_str()),
        (Some("committed"), Some("kube2"))
    );
    assert!(
        r["reconcile"]
            .as_str()
            .unwrap()
            .contains("the committed node kube1 was not running"),
        "{r:#}"
    );
    assert_eq!(h.running(), [Slot::Kube2]);
    assert!(h.enabled(Slot::Kube2) && !h.enabled(Slot::Kube1));
    let s = h.state();
    assert_eq!(s.active, Some(Slot::Kube2));
    // no tree, no rollback target
    assert_eq!(s.slot(Slot::Kube1).status, SlotStatus::Empty);
    let (code, _, err) = h.cmd(&["rollback"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("kube1 holds no committed former node"),
        "{err}"
    );

    // the committed kube2 breaks (its kubelet never answers) across a
    // power cycle: the same image is refused as not healthy, --force
    // stages it afresh into kube1 and flips
    fs::write(
        root.machine_tree("kube2").join("etc/fixture-health"),
        "never",
    )
    .unwrap();
    h.power_off();
    let (code, r, _) = h.activate();
    assert_eq!(code, 1, "{r:#}");
    assert!(
        r["error"].as_str().unwrap().contains("kubelet-healthz"),
        "{r:#}"
    );
    let (code, out, err) = h.cmd(&["activate", "--json", "--force"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let r = json(&out, &err);
    assert_eq!(
        (r["outcome"].as_str(), r["slot"].as_str()),
        (Some("committed"), Some("kube1"))
    );
    assert_eq!(h.running(), [Slot::Kube1]);
    assert_eq!(h.tree_version(Slot::Kube1), "kubelet v2\n");
    // and rollback to the broken kube2 is still possible (it fails its
    // gate and kube1 runs again; its changed health file needs --force)
    let (code, _, err) = h.cmd(&["rollback", "--force"]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(h.running(), [Slot::Kube1]);
}

#[test]
fn a_second_node_machine_beside_the_running_committed_one_is_refused() {
    let img = images();
    let h = Host::new(&img);
    assert_eq!(h.activate().0, 0);
    // kube1 committed and running; something else runs a kube2 machine
    h.foreign(Slot::Kube2, true);
    h.clear_calls();
    for args in [&["activate", "--json"][..], &["fetch", "--json"][..]] {
        let (code, out, err) = h.cmd(args);
        assert_eq!(code, 3, "{args:?}: {out}\n{err}");
        assert!(
            err.contains("machine kube2 is running, but the committed node is kube1"),
            "{args:?}: {err}"
        );
    }
    assert!(
        h.report()["error"]
            .as_str()
            .unwrap()
            .contains("machine kube2 is running"),
        "{:#}",
        h.report()
    );
    assert!(starts_and_stops(&h.calls()).is_empty(), "{:?}", h.calls());
    let (_, out, _) = h.cmd(&["status"]);
    assert!(
        out.contains("running: kube1, kube2\n")
            && out.contains("warning: machine kube2 runs but is not the committed node (kube1)"),
        "{out}"
    );
    let (_, out, err) = h.cmd(&["status", "--json"]);
    assert_eq!(
        json(&out, &err)["running"],
        serde_json::json!(["kube1", "kube2"])
    );
    // gone: up to date again
    h.foreign(Slot::Kube2, false);
    let (code, r, _) = h.activate();
    assert_eq!((code, r["outcome"].as_str()), (0, Some("up-to-date")));
    let (_, out, _) = h.cmd(&["status"]);
    assert!(
        out.contains("running: kube1\n") && !out.contains("warning:"),
        "{out}"
    );
}

#[test]
fn a_running_machine_is_never_staged_over_and_a_foreign_one_names_adopt() {
    let img = images();
    // a fresh host where machined runs a kube1 nobody recorded
    let h = Host::new(&img);
    h.foreign(Slot::Kube1, true);
    for cmd in ["activate", "fetch"] {
        let (code, out, err) = h.cmd(&[cmd, "--json"]);
        assert_eq!(code, 3, "{cmd}: {out}\n{err}");
        assert!(
            err.contains("machine kube1 is running, but kubeslot has no record")
                && err.contains("kubeslot-activator adopt"),
            "{cmd}: {err}"
        );
    }
    assert!(!Root::new(h.root()).state_file().exists());
    assert!(!h.root().join("var/lib/machines/kube1").exists());
    assert!(h.changes().is_empty(), "{:?}", h.changes());

    // unbounded-agent's applied config, its machine stopped: refused too
    h.foreign(Slot::Kube1, false);
    let applied = Root::new(h.root()).unbounded_applied_config("kube1");
    fs::create_dir_all(applied.parent().unwrap()).unwrap();
    fs::write(&applied, "{}").unwrap();
    let (code, _, err) = h.cmd(&["activate"]);
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("kube1-applied-config.json exists") && err.contains("adopt"),
        "{err}"
    );
    fs::remove_file(&applied).unwrap();

    // a managed host: kube1 committed; something runs a kube2 machine
    assert_eq!(h.activate().0, 0);
    let before = h.state();
    h.foreign(Slot::Kube2, true);
    h.set_config("v2", serde_json::json!({}));
    h.clear_calls();
    for cmd in ["activate", "fetch"] {
        let (code, _, err) = h.cmd(&[cmd]);
        assert_eq!(code, 3, "{cmd}: {err}");
        assert!(
            err.contains("machine kube2 is running, but the committed node is kube1"),
            "{cmd}: {err}"
        );
    }
    assert_eq!(h.state(), before);
    assert!(!h.root().join("var/lib/machines/kube2").exists());
    assert!(starts_and_stops(&h.calls()).is_empty(), "{:?}", h.calls());
    // and once it is gone, the flip goes ahead
    h.foreign(Slot::Kube2, false);
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert_eq!(h.running(), [Slot::Kube2]);
}
