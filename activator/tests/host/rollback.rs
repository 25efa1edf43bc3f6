//! `rollback`: killed mid-flip and recovered, refused when the previous slot's
//! tree or image files changed, a failed rollback that keeps the previous
//! slot usable, and `plan --rollback` saying what it does.

use super::*;

#[test]
fn a_rollback_killed_mid_flip_is_recovered_by_the_next_run() {
    let img = images();
    for fp in ["after-pending", "after-stop-old", "after-start-new"] {
        let h = Host::new(&img);
        assert_eq!(h.activate().0, 0);
        h.set_config("v2", serde_json::json!({}));
        assert_eq!(h.activate().0, 0);
        let kube1 = h.slot_snapshot(Slot::Kube1);
        let kube2 = h.slot_snapshot(Slot::Kube2);

        let out = h.run(&["rollback"], Some(fp));
        assert_eq!(out.status.signal(), Some(6), "{fp}");
        assert_eq!(h.slot_snapshot(Slot::Kube2), kube2, "{fp}");
        assert_eq!(h.state().active, Some(Slot::Kube2), "{fp}");

        // the operator asks again: the dead rollback is finished or undone
        // first, then the rollback happens once
        let (code, out, err) = h.cmd(&["rollback", "--json"]);
        assert_eq!(code, 0, "{fp}: {out}\n{err}");
        let r: serde_json::Value = serde_json::from_str(&out).unwrap();
        let s = h.state();
        assert!(s.pending.is_none(), "{fp}");
        assert_eq!(h.running().len(), 1, "{fp}: {:?}", h.running());
        assert_eq!(s.active, Some(h.running()[0]), "{fp}");
        if fp == "after-start-new" {
            // kube1 was up and healthy: the dead rollback was committed,
            // and this one went back to kube2
            assert!(
                r["recovered"].as_str().unwrap().contains("committed"),
                "{r:#}"
            );
            assert_eq!(s.active, Some(Slot::Kube2), "{fp}");
        } else {
            assert_eq!(s.active, Some(Slot::Kube1), "{fp}: {r:#}");
        }
        assert_eq!(h.slot_snapshot(Slot::Kube1).len(), kube1.len(), "{fp}");
        assert_eq!(h.tree_version(Slot::Kube1), "kubelet v1\n");
        assert_eq!(h.tree_version(Slot::Kube2), "kubelet v2\n");
    }
}

#[test]
fn rollback_refuses_a_previous_slot_whose_tree_changed() {
    let img = images();
    let h = Host::new(&img);
    let root = Root::new(h.root());
    assert_eq!(h.activate().0, 0);
    h.set_config("v2", serde_json::json!({}));
    assert_eq!(h.activate().0, 0);
    let mark = root.slot_tree_mark("kube1");
    assert!(mark.is_file(), "no tree mark recorded at commit");
    let kube2 = h.slot_snapshot(Slot::Kube2);
    let state = h.state();
    let victim = root.machine_tree("kube1").join("usr/bin/kubelet-version");
    let kept = fs::read(&victim).unwrap();
    fs::remove_file(&victim).unwrap();
    h.clear_calls();

    let refused = |what: &str, needles: &[&str]| {
        let (code, out, err) = h.cmd(&["rollback", "--json"]);
        assert_eq!(code, 1, "{what}: {out}\n{err}");
        let e = json(&out, &err)["error"].as_str().unwrap().to_string();
        for n in needles {
            assert!(e.contains(n), "{what}: {e} lacks {n}");
        }
        // the running machine is untouched, nothing was started or stopped
        assert!(
            starts_and_stops(&h.calls()).is_empty(),
            "{what}: {:?}",
            h.calls()
        );
        assert_eq!(h.running(), [Slot::Kube2], "{what}");
        assert_eq!(h.slot_snapshot(Slot::Kube2), kube2, "{what}");
        assert_eq!(h.state(), state, "{what}");
    };
    refused(
        "deleted file",
        &[
            "rollback: slot kube1",
            "var/lib/machines/kube1 has",
            "kube1.tree recorded",
            "running machine is untouched",
        ],
    );
    let saved = fs::read(&mark).unwrap();
    fs::remove_file(&mark).unwrap();
    refused("missing mark", &["kube1.tree is missing"]);

    // put back what was there: the rollback goes through
    fs::write(&mark, saved).unwrap();
    fs::write(&victim, kept).unwrap();
    let (code, out, err) = h.cmd(&["rollback", "--json"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(h.running(), [Slot::Kube1]);
    // kube2 was committed away from: its mark now vouches for it
    assert!(root.slot_tree_mark("kube2").is_file());
}

#[test]
fn a_failed_rollback_keeps_the_previous_slot_usable_though_its_machine_wrote_its_tree() {
    let img = images();
    let h = Host::new(&img);
    // every start writes a file into the started tree, as a real boot does
    fs::write(h.fake().join("write-on-start"), "").unwrap();
    assert_eq!(h.activate().0, 0);
    h.set_config("v2", serde_json::json!({}));
    assert_eq!(h.activate().0, 0);
    // kube1 turns unhealthy (same size: its mark still matches)
    let health = Root::new(h.root())
        .machine_tree("kube1")
        .join("etc/fixture-health");
    fs::write(&health, "never!!").unwrap();
    // (an image file changed: the per-file check refuses it without
    // --force; this test is about the gate after it)
    let (code, out, err) = h.cmd(&["rollback", "--json"]);
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(
        err.contains("/etc/fixture-health (contents changed)"),
        "{err}"
    );
    let (code, out, err) = h.cmd(&["rollback", "--json", "--force"]);
    assert_eq!(code, 2, "{out}\n{err}");
    assert_eq!(h.running(), [Slot::Kube2]);
    // kube1 ran during the attempt and wrote its tree; once healthy again,
    // a rollback is accepted
    fs::write(&health, "healthy").unwrap();
    let (code, out, err) = h.cmd(&["rollback", "--json"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(h.running(), [Slot::Kube1]);
    assert_eq!(h.state().active, Some(Slot::Kube1));
}

/// Copy mode: `rollback` refuses a previous slot whose image-owned files
/// changed while its node ran (naming them), ignores what the node wrote
/// under /var, and `--force` starts it anyway.
#[test]
fn rollback_refuses_a_copied_slot_whose_image_files_changed() {
    let img = images();
    let h = Host::with_slots(&img, Some("copy"));
    let root = Root::new(h.root());
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    let kube1 = root.machine_tree("kube1");
    // while kube1 runs: its node writes state, and something rewrites a
    // binary of the image (same size: the cheap fingerprint cannot tell)
    fs::create_dir_all(kube1.join("var/lib/kubelet")).unwrap();
    fs::write(kube1.join("var/lib/kubelet/state"), b"node state").unwrap();
    assert_eq!(
        fs::read(kube1.join("usr/bin/kubelet-version")).unwrap(),
        b"kubelet v1\n"
    );
    fs::write(kube1.join("usr/bin/kubelet-version"), b"kubelet X1\n").unwrap();
    h.set_config("v2", serde_json::json!({}));
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");

    let (code, out, err) = h.cmd(&["rollback", "--json"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("/usr/bin/kubelet-version (contents changed)")
            && err.contains("1 change(s) to its image")
            && !err.contains("var/lib/kubelet"),
        "{err}"
    );
    assert_eq!(h.state().active, Some(Slot::Kube2), "nothing switched");
    let (code, out, err) = h.cmd(&["rollback", "--force", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(h.state().active, Some(Slot::Kube1));
}

/// `plan --rollback` says what `rollback` does, with the exit code it
/// ends with, and changes nothing: refused without a former node (1), a
/// flip back once there is one (0), refused for `--clean` of a copied tree
/// (1) and for a machine running as the previous slot (3).
#[test]
fn plan_rollback_says_what_rollback_does_with_its_exit_code() {
    let img = images();
    let h = Host::new(&img);
    assert_eq!(h.activate().0, 0);
    let (code, out, err) = h.cmd(&["plan", "--rollback"]);
    assert_eq!(code, 1, "{out}\n{err}");
    let refusal = "rollback: slot kube2 holds no committed former node (status empty)";
    assert!(out.starts_with(&format!("refused: {refusal}")), "{out}");
    assert!(err.contains("rollback would refuse (exit 1)"), "{err}");
    let (code, _, err) = h.cmd(&["rollback"]);
    assert_eq!(code, 1);
    assert!(err.contains(refusal), "{err}");

    h.set_config("v2", serde_json::json!({}));
    assert_eq!(h.activate().0, 0);
    let state = fs::read(h.root().join("var/lib/kubeslot/state.json")).unwrap();
    h.clear_calls();
    let (code, out, err) = h.cmd(&["plan", "--rollback", "--json"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let p = json(&out, &err);
    assert_eq!(
        (&p["action"], &p["from"], &p["to"], &p["exit_code"]),
        (
            &serde_json::json!("rollback"),
            &serde_json::json!("kube2"),
            &serde_json::json!("kube1"),
            &serde_json::json!(0)
        ),
        "{p:#}"
    );
    assert!(h.changes().is_empty(), "{:?}", h.changes());
    assert_eq!(
        fs::read(h.root().join("var/lib/kubeslot/state.json")).unwrap(),
        state
    );

    let (code, out, err) = h.cmd(&["plan", "--rollback", "--clean", "--json"]);
    assert_eq!(code, 1, "{out}\n{err}");
    assert_eq!(json(&out, &err)["refusal"], "clean-needs-overlay");
    let (code, _, err) = h.cmd(&["rollback", "--clean"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("kube1 is a copied tree, not an overlay slot"),
        "{err}"
    );

    h.foreign(Slot::Kube1, true);
    let (code, out, err) = h.cmd(&["plan", "--rollback"]);
    assert_eq!(code, 3, "{out}\n{err}");
    let reason = out.strip_prefix("refused: ").unwrap().trim_end();
    assert!(reason.starts_with("machine kube1 is running"), "{out}");
    let (code, _, err) = h.cmd(&["rollback"]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains(reason), "{reason}\n{err}");
    h.foreign(Slot::Kube1, false);
    assert_eq!(h.cmd(&["rollback"]).0, 0);
    assert_eq!(h.state().active, Some(Slot::Kube1));
}
