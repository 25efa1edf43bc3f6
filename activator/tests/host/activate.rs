//! `activate` end to end: the first activation, a flip, a failed gate and its
//! bad mark, idempotence, a crash at every failpoint (copy and overlay slots),
//! refused configs and images, and flips over trees deeper than the fd limit.

use super::*;

#[test]
fn first_activation_flip_failed_gate_bad_image_rollback_and_idempotence() {
    let img = images();
    let h = Host::new(&img);
    let root = Root::new(h.root());

    // nothing yet
    let (code, out, _) = h.cmd(&["status"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("active: none") && out.contains("no report yet"),
        "{out}"
    );

    // plan shows what the first activation would do, and writes nothing
    let (code, out, err) = h.cmd(&["plan"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("flip to kube1 ({})", img.v1)),
        "{out}"
    );
    assert!(out.contains("etc/systemd/nspawn/kube1.nspawn"), "{out}");
    assert!(!root.state_file().exists());
    assert!(!h.root().join("etc/systemd/nspawn/kube1.nspawn").exists());

    // 1. first activation: kube1 committed and running
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert_eq!(r["outcome"], "committed");
    assert_eq!(r["slot"], "kube1");
    assert_eq!(r["digest"], img.v1.to_string());
    assert_eq!(r["downloads"]["blobs_fetched"], 2);
    let names: Vec<_> = r["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        names,
        [
            "recover",
            "config",
            "resolve",
            "preflight",
            "stage",
            "render",
            "stop",
            "start",
            "health",
            "commit"
        ]
    );
    let s = h.state();
    assert_eq!(s.active, Some(Slot::Kube1));
    assert_eq!(s.slot(Slot::Kube1).status, SlotStatus::Active);
    assert_eq!(s.slot(Slot::Kube1).digest, Some(img.v1));
    assert_eq!(h.running(), [Slot::Kube1]);
    assert!(h.calls().contains(&"systemctl daemon-reload".to_string()));
    assert_eq!(h.tree_version(Slot::Kube1), "kubelet v1\n");
    assert!(h.root().join("etc/systemd/nspawn/kube1.nspawn").is_file());
    assert_eq!(h.report(), r);
    // progress on stderr (the report alone on stdout): each phase, each
    // blob fetched, the layer unpacked
    for want in [
        "activate: resolve\n",
        "activate: stage\n",
        "activate: health\n",
        "layer 1/1 sha256:",
        "unpacked 1 layer: ",
    ] {
        assert!(err.contains(want), "{want:?} not in stderr:\n{err}");
    }
    assert_eq!(err.matches(": fetched ").count(), 2, "{err}");

    // 2. idempotent re-run: no machine touched
    h.clear_calls();
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}");
    assert_eq!(r["outcome"], "up-to-date");
    assert!(starts_and_stops(&h.calls()).is_empty(), "{:?}", h.calls());
    let (_, out, _) = h.cmd(&["plan"]);
    assert!(out.contains("up to date: kube1"), "{out}");

    // 3. flip to v2: kube2, kube1's tree kept as previous
    let kube1_before = h.slot_snapshot(Slot::Kube1);
    h.set_config("v2", serde_json::json!({}));
    let (_, out, _) = h.cmd(&["plan"]);
    assert!(
        out.contains(&format!("flip kube1 ({}) -> kube2 ({})", img.v1, img.v2)),
        "{out}"
    );
    h.clear_calls();
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert_eq!(
        (r["slot"].as_str(), r["previous_slot"].as_str()),
        (Some("kube2"), Some("kube1"))
    );
    assert_eq!(
        starts_and_stops(&h.calls()),
        [
            "systemctl stop systemd-nspawn@kube1.service",
            "systemctl start systemd-nspawn@kube2.service"
        ]
    );
    let s = h.state();
    assert_eq!(s.active, Some(Slot::Kube2));
    assert_eq!(s.slot(Slot::Kube1).status, SlotStatus::Previous);
    assert_eq!(s.slot(Slot::Kube1).digest, Some(img.v1));
    assert_eq!(h.running(), [Slot::Kube2]);
    assert_eq!(h.slot_snapshot(Slot::Kube1), kube1_before);
    assert_eq!(h.tree_version(Slot::Kube2), "kubelet v2\n");

    // 4. v3 never becomes healthy: rolled back to kube2, v3 marked bad
    let kube2_before = h.slot_snapshot(Slot::Kube2);
    h.set_config("v3", serde_json::json!({}));
    h.clear_calls();
    let (code, r, err) = h.activate();
    assert_eq!(code, 2, "{err}\n{r:#}");
    assert_eq!(r["outcome"], "rolled-back");
    let e = r["error"].as_str().unwrap();
    assert!(
        e.contains("machine kube1: health check kubelet-healthz failed")
            && e.contains("rolled back to kube2"),
        "{e}"
    );
    assert!(err.contains("kubelet-healthz"), "{err}");
    assert_eq!(
        starts_and_stops(&h.calls()),
        [
            "systemctl stop systemd-nspawn@kube2.service",
            "systemctl start systemd-nspawn@kube1.service",
            "systemctl stop systemd-nspawn@kube1.service",
            "systemctl start systemd-nspawn@kube2.service",
        ]
    );
    let s = h.state();
    assert_eq!(s.active, Some(Slot::Kube2));
    assert_eq!(s.slot(Slot::Kube2).status, SlotStatus::Active);
    assert!(s.pending.is_none());
    assert_eq!(s.bad.len(), 1);
    assert_eq!(s.bad[0].digest, img.v3);
    assert!(
        s.bad[0].reason.starts_with("kubelet-healthz"),
        "{}",
        s.bad[0].reason
    );
    assert_eq!(h.running(), [Slot::Kube2]);
    assert_eq!(h.slot_snapshot(Slot::Kube2), kube2_before);
    // the failed machine's last words, read before the rollback stopped it
    let d = &r["diagnostics"];
    assert_eq!(d["machine"], "kube1");
    assert_eq!(
        d["kubelet"].as_array().unwrap().last().unwrap(),
        "kube1 kubelet[7]: /healthz answers as never"
    );
    assert_eq!(
        d["containerd"][0],
        "kube1 containerd[7]: started with bootstrap token <redacted>"
    );
    assert_eq!(
        d["failed_units"][0],
        "kubelet.service loaded failed failed kubelet: the kubeslot test node"
    );
    let calls = h.calls();
    let pos = |c: &str| calls.iter().position(|x| x.starts_with(c)).unwrap();
    assert!(
        calls
            .iter()
            .position(|x| x.starts_with("journalctl -M kube1 -n 50")
                && x.contains("_SYSTEMD_UNIT=kubelet.service"))
            .unwrap()
            < pos("systemctl stop systemd-nspawn@kube1"),
        "{calls:?}"
    );
    let (_, out, _) = h.cmd(&["status"]);
    assert!(
        out.contains("  diagnostics of kube1:\n")
            && out.contains("      kube1 kubelet[7]: /healthz answers as never\n"),
        "{out}"
    );
    assert!(!out.contains("0123456789abcdef"), "{out}");
    let (_, out, _) = h.cmd(&["status", "--json"]);
    assert!(!out.contains("0123456789abcdef"), "{out}");

    // 5. v3 is not retried on the next run
    h.clear_calls();
    let (code, r, _) = h.activate();
    assert_eq!(code, 4, "{r:#}");
    assert!(r["error"]
        .as_str()
        .unwrap()
        .contains("not retried automatically"));
    assert!(starts_and_stops(&h.calls()).is_empty(), "{:?}", h.calls());
    let (_, out, _) = h.cmd(&["status"]);
    assert!(
        out.contains("active: kube2") && out.contains(&format!("bad: {}", img.v3)),
        "{out}"
    );
    // the text speaks the words of state.json and report.json
    assert!(
        out.contains(&format!("  kube2: active {}", img.v2))
            && out.contains(&format!("  kube1: staged {}", img.v3))
            && out.contains("last run: activate (exit 4, failed)"),
        "{out}"
    );
    let (code, out, _) = h.cmd(&["wait", "--json"]);
    assert_eq!(code, 4);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out).unwrap(),
        h.report()
    );

    // 6. manual rollback: the failed v3 was staged over kube1's v1, so
    // there is no former node to go back to; refused, nothing touched
    h.clear_calls();
    let (code, _, err) = h.cmd(&["rollback"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("slot kube1 holds no committed former node"),
        "{err}"
    );
    assert!(starts_and_stops(&h.calls()).is_empty(), "{:?}", h.calls());

    // back to v1 by config: kube1 restaged (blobs reused), kube2 kept
    h.set_config("v1", serde_json::json!({}));
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert_eq!(r["slot"], "kube1");
    assert_eq!(r["downloads"]["blobs_fetched"], 0);
    assert_eq!(h.tree_version(Slot::Kube1), "kubelet v1\n");

    // now a manual rollback to kube2 (v2): no download, v1 marked bad
    h.clear_calls();
    let (code, out, err) = h.cmd(&["rollback", "--json"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (r["slot"].as_str(), r["outcome"].as_str()),
        (Some("kube2"), Some("committed"))
    );
    assert!(r.get("downloads").is_none());
    assert_eq!(
        starts_and_stops(&h.calls()),
        [
            "systemctl stop systemd-nspawn@kube1.service",
            "systemctl start systemd-nspawn@kube2.service"
        ]
    );
    let s = h.state();
    assert_eq!(s.active, Some(Slot::Kube2));
    assert_eq!(s.slot(Slot::Kube1).status, SlotStatus::Previous);
    assert!(s
        .bad
        .iter()
        .any(|b| b.digest == img.v1 && b.reason.contains("operator")));
    assert_eq!(h.running(), [Slot::Kube2]);
    assert_eq!(h.tree_version(Slot::Kube2), "kubelet v2\n");

    // the image rolled away from is not brought back by the next activate
    h.clear_calls();
    let (code, _, _) = h.activate();
    assert_eq!(code, 4);
    assert!(starts_and_stops(&h.calls()).is_empty(), "{:?}", h.calls());

    // a second rollback goes back to kube1 the same way: v2 is marked now,
    // and v1, brought back on purpose and healthy, no longer is (v3 failed
    // its gate: still marked)
    let (code, _, err) = h.cmd(&["rollback"]);
    assert_eq!(code, 0, "{err}");
    let s = h.state();
    assert_eq!(s.active, Some(Slot::Kube1));
    assert_eq!(h.running(), [Slot::Kube1]);
    let marked: Vec<_> = s.bad.iter().map(|b| b.digest).collect();
    assert_eq!(marked, [img.v3, img.v2], "{s:?}");
}

#[test]
fn crash_at_every_failpoint_keeps_the_old_slot_and_the_next_run_converges() {
    let img = images();
    // Each failpoint and the image whose activation passes it: the rollback
    // boundaries are only reached by an image that fails its gate.
    let mut cases: Vec<(&str, &str)> = failpoint::ALL
        .iter()
        .map(|f| match *f {
            "after-rollback-stop" | "after-rollback-start" => (*f, "v3"),
            _ => (*f, "v4"),
        })
        .collect();
    // A dead run's try of an unhealthy image must be rolled back by the
    // next run, not committed because its machine happens to be up.
    cases.extend([
        ("after-trying", "v3"),
        ("after-stop-old", "v3"),
        ("after-start-new", "v3"),
    ]);
    // Four at a time (the runs mostly wait on health gates): each host is
    // independent (own root, port, fake).
    for chunk in cases.chunks(4) {
        std::thread::scope(|scope| {
            for (fp, tag) in chunk {
                let img = &img;
                scope.spawn(move || crash_case(img, fp, tag, None));
            }
        });
    }
}

/// The same on overlay slots (the fake systemctl mounts their units):
/// the boundaries of staging (layer store, mount unit) and the flip.
#[test]
fn crash_at_every_failpoint_on_overlay_slots_keeps_the_old_slot_and_the_next_run_converges() {
    let img = images();
    let cases: Vec<&str> = failpoint::ALL
        .iter()
        .copied()
        .filter(|f| !f.starts_with("after-rollback"))
        .collect();
    for chunk in cases.chunks(4) {
        std::thread::scope(|scope| {
            for fp in chunk {
                let img = &img;
                scope.spawn(move || crash_case(img, fp, "v4", Some("overlay")));
            }
        });
    }
}

fn crash_case(img: &Images, fp: &str, tag: &str, slots: Option<&'static str>) {
    // kube2 runs v2, kube1 keeps v1 as the previous node: the crashing run
    // stages over a slot the state vouches for, so a state that says more
    // than the tree holds would show.
    let h = Host::with_slots(img, slots);
    let (code, _, err) = h.activate();
    assert_eq!(code, 0, "{fp}: setup: {err}");
    h.set_config("v2", serde_json::json!({}));
    let (code, _, err) = h.activate();
    assert_eq!(code, 0, "{fp}: setup: {err}");
    let (old, new) = (Slot::Kube2, Slot::Kube1);
    if slots == Some("overlay") {
        let unit = Root::new(h.root()).mount_unit_file(old.machine());
        assert!(unit.is_file(), "{fp}: {old} is no overlay slot");
    }
    let old_files = h.slot_snapshot(old);
    let want = if tag == "v4" { img.v4 } else { img.v3 };

    h.set_config(tag, serde_json::json!({}));
    let out = h.run(&["activate"], Some(fp));
    assert_eq!(
        out.status.signal(),
        Some(6),
        "{fp}: the run did not abort at the failpoint: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The old slot's tree and files are untouched whatever was hit; the
    // state names it active, unless the new slot was already committed.
    assert_eq!(h.slot_snapshot(old), old_files, "{fp}: old slot changed");
    let s = h.state();
    assert_eq!(s.slot(old).digest, Some(img.v2), "{fp}");
    match s.active {
        Some(a) if a == old => assert_eq!(s.slot(old).status, SlotStatus::Active, "{fp}"),
        Some(_) => {
            assert_eq!(fp, "after-commit", "{fp}: committed too early");
            assert_eq!(s.slot(old).status, SlotStatus::Previous);
        }
        None => panic!("{fp}: no active slot"),
    }
    // The state never claims more than the new slot's tree holds.
    let claimed = match s.slot(new).digest {
        Some(d) if d == img.v1 => Some("kubelet v1\n"),
        Some(d) if d == want => Some(if tag == "v4" {
            "kubelet v4\n"
        } else {
            "kubelet v3\n"
        }),
        Some(d) => panic!("{fp}: {new} claims {d}"),
        None => None,
    };
    if let Some(v) = claimed {
        assert_eq!(
            h.tree_version(new),
            v,
            "{fp}: {new} holds something else than {s:?}"
        );
    }

    // The next run (same config) converges.
    let (code, r, err) = h.activate();
    let s = h.state();
    assert!(s.pending.is_none(), "{fp}: {s:?}");
    assert!(
        Slot::ALL
            .iter()
            .all(|x| s.slot(*x).status != SlotStatus::Dirty),
        "{fp}: {s:?}"
    );
    let running = h.running();
    assert_eq!(running.len(), 1, "{fp}: running {running:?}");
    assert_eq!(s.active, Some(running[0]), "{fp}");
    if s.active == Some(new) {
        // committed: the new image runs, the old slot is kept
        assert_eq!(code, 0, "{fp}: {err}\n{r:#}");
        assert_eq!(s.slot(new).digest, Some(want), "{fp}");
        assert_eq!(tag, "v4", "{fp}: the unhealthy image was committed");
        assert_eq!(h.tree_version(new), "kubelet v4\n", "{fp}");
        assert_eq!(s.slot(old).status, SlotStatus::Previous, "{fp}");
        assert_eq!(h.slot_snapshot(old), old_files, "{fp}");
    } else {
        // cleanly rolled back: the old machine runs, the image is bad
        assert_eq!(s.active, Some(old), "{fp}");
        assert!(s.bad.iter().any(|b| b.digest == want), "{fp}: {s:?}");
        assert!([2, 4].contains(&code), "{fp}: exit {code}: {err}\n{r:#}");
        assert_eq!(h.slot_snapshot(old), old_files, "{fp}");
    }
    // Boundaries that leave a pending flip or a dirty slot are recovered
    // (and the report says how) before anything else.
    let leaves_work = [
        "after-mark-dirty",
        "after-stage",
        "after-render",
        "after-pending",
        "after-trying",
        "after-stop-old",
        "after-start-new",
        "after-health",
        "after-rollback-stop",
        "after-rollback-start",
        "state-between-writes",
    ];
    if leaves_work.contains(&fp) {
        assert!(
            r["recovered"].as_str().is_some_and(|t| !t.is_empty()),
            "{fp}: {r:#}"
        );
    }
}

#[test]
fn bad_configs_name_the_file_and_field_and_touch_nothing_else() {
    let img = images();
    let h = Host::new(&img);
    let root = Root::new(h.root());
    let cfg = h.config_path().display().to_string();
    let cases: Vec<(&str, serde_json::Value, &[&str])> = vec![
        (
            "unknown field",
            {
                let mut c = h.config("v1", serde_json::json!({}));
                c["imgae"] = "typo".into();
                c
            },
            &["unknown field `imgae`"],
        ),
        (
            "missing api server",
            {
                let mut c = h.config("v1", serde_json::json!({}));
                c["kubelet"].as_object_mut().unwrap().remove("api_server");
                c
            },
            &["missing field `api_server`"],
        ),
        (
            "unreadable ca",
            {
                let mut c = h.config(
                    "v1",
                    serde_json::json!({"ca_file": "/etc/kubeslot/missing-ca.crt"}),
                );
                c["kubelet"].as_object_mut().unwrap().remove("ca_data");
                c
            },
            &["kubelet.ca_file", "missing-ca.crt"],
        ),
        (
            "token and exec credential",
            h.config(
                "v1",
                serde_json::json!({"exec_credential": {"command": "/bin/get-token"}}),
            ),
            &["kubelet.bootstrap_token", "not both"],
        ),
        (
            "trusted key file missing",
            {
                let mut c = h.config("v1", serde_json::json!({}));
                c["trust"] = serde_json::json!({"public_keys": ["/etc/kubeslot/missing.pub"], "identity": "registry.example/org/node"});
                c
            },
            &["trust policy", "missing.pub"],
        ),
        (
            "a policy that accepts nothing",
            {
                let mut c = h.config("v1", serde_json::json!({}));
                c["trust"] = serde_json::json!({"identity": "registry.example/org/node"});
                c
            },
            &[
                "trust.public_keys is empty",
                "trust.allow_unsigned is false",
            ],
        ),
    ];
    for (name, config, needles) in cases {
        fs::write(h.config_path(), serde_json::to_vec(&config).unwrap()).unwrap();
        let (code, r, err) = h.activate();
        assert_eq!(code, 3, "{name}: {err}");
        let e = r["error"].as_str().unwrap();
        assert!(
            e.contains(&cfg),
            "{name}: the error does not name {cfg}: {e}"
        );
        for n in needles {
            assert!(e.contains(n), "{name}: {e} lacks {n}");
        }
        assert!(err.contains(e), "{name}: stderr {err}");
        assert_eq!(h.report(), r, "{name}");
        assert_eq!(r["outcome"], "failed");
        // nothing but the state dir's lock and report exists
        assert!(!root.machines_dir().exists(), "{name}");
        assert!(!h.root().join("etc/systemd").exists(), "{name}");
        assert!(!root.state_file().exists(), "{name}");
        assert!(h.changes().is_empty(), "{name}: {:?}", h.changes());
    }
    // a config file that does not exist at all
    fs::remove_file(h.config_path()).unwrap();
    let (code, r, _) = h.activate();
    assert_eq!(code, 3);
    assert!(r["error"].as_str().unwrap().contains(&cfg));
}

#[test]
fn an_image_that_fails_verification_changes_nothing() {
    let img = images();
    let h = Host::new(&img);
    // a trusted key that never signed the image: refused before any layer
    use p256::pkcs8::{EncodePublicKey as _, LineEnding};
    let key = p256::ecdsa::SigningKey::from_bytes(&[7u8; 32].into()).unwrap();
    let pem = key
        .verifying_key()
        .to_public_key_pem(LineEnding::LF)
        .unwrap();
    fs::write(h.root().join("etc/kubeslot/release.pub"), pem).unwrap();
    let mut c = h.config("v1", serde_json::json!({}));
    c["trust"] = serde_json::json!({"public_keys": ["/etc/kubeslot/release.pub"], "identity": "registry.example/org/node"});
    fs::write(h.config_path(), serde_json::to_vec(&c).unwrap()).unwrap();
    let (code, r, err) = h.activate();
    assert_eq!(code, 1, "{err}");
    let e = r["error"].as_str().unwrap();
    assert!(e.contains(&img.v1.to_string()), "{e}");
    assert_eq!(
        r["phases"].as_array().unwrap().last().unwrap()["name"],
        "resolve"
    );
    assert!(!Root::new(h.root()).state_file().exists());
    assert!(!h.root().join("var/lib/machines/kube1").exists());
    assert!(h.changes().is_empty(), "{:?}", h.changes());
}

/// Flips the last byte of the (only) layer blob of `manifest` in the
/// layout at `dir`: the bytes no longer match the digest that names them.
fn tamper_layer(dir: &Path, manifest: Digest) -> Digest {
    let blob = |d: &Digest| dir.join("blobs/sha256").join(d.hex());
    let m: serde_json::Value = serde_json::from_slice(&fs::read(blob(&manifest)).unwrap()).unwrap();
    let layer: Digest = m["layers"][0]["digest"].as_str().unwrap().parse().unwrap();
    let mut bytes = fs::read(blob(&layer)).unwrap();
    *bytes.last_mut().unwrap() ^= 0xff;
    fs::write(blob(&layer), bytes).unwrap();
    layer
}

#[test]
fn a_refused_blob_or_layer_leaves_the_idle_slot_and_its_rollback_alone() {
    let img = images();
    // v5: a layer blob whose bytes differ from its digest; v6: a layer
    // whose content differs from the config's diff_id
    let v5 = add_image(&img.layout, "v5", "healthy");
    let tampered = tamper_layer(&img.layout, v5);
    let v6 = add_image_with(
        &img.layout,
        "v6",
        "healthy",
        Some(Digest::of(b"another tree")),
    );
    let h = Host::new(&img);
    assert_eq!(h.activate().0, 0);
    h.set_config("v2", serde_json::json!({}));
    assert_eq!(h.activate().0, 0);
    // kube2 runs v2; kube1 keeps v1 as the rollback target
    let state = h.state();
    assert_eq!(state.slot(Slot::Kube1).status, SlotStatus::Previous);
    let kube1 = h.slot_snapshot(Slot::Kube1);
    let machines = h.root().join("var/lib/machines");

    for (tag, digest, names) in [
        ("v5", v5, vec![tampered.to_string(), "hashes to".into()]),
        ("v6", v6, vec!["diff-id".into(), "layer 0".into()]),
    ] {
        h.set_config(tag, serde_json::json!({}));
        h.clear_calls();
        let (code, r, err) = h.activate();
        assert_eq!(code, 1, "{tag}: {err}\n{r:#}");
        assert_eq!(r["digest"], digest.to_string(), "{tag}: {r:#}");
        let e = r["error"].as_str().unwrap();
        for n in &names {
            assert!(e.contains(n.as_str()), "{tag}: {n:?} not in {e}");
        }
        assert!(
            starts_and_stops(&h.calls()).is_empty(),
            "{tag}: {:?}",
            h.calls()
        );
        assert_eq!(h.state(), state, "{tag}: the state changed");
        assert_eq!(
            h.slot_snapshot(Slot::Kube1),
            kube1,
            "{tag}: kube1's tree changed"
        );
        assert_eq!(h.running(), [Slot::Kube2], "{tag}");
        let left: Vec<_> = fs::read_dir(&machines)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(
            left.is_empty(),
            "{tag}: left in {}: {left:?}",
            machines.display()
        );
    }

    // the next run has nothing to recover, and the rollback target is
    // still one
    let (code, out, err) = h.cmd(&["rollback", "--json"]);
    assert_eq!(code, 0, "{err}");
    let r = json(&out, &err);
    assert!(r.get("recovered").is_none(), "{r:#}");
    assert!(r.get("downloads").is_none(), "{r:#}");
    assert_eq!(h.running(), [Slot::Kube1]);
    assert_eq!(h.tree_version(Slot::Kube1), "kubelet v1\n");
}

#[test]
fn a_gpu_bound_by_the_render_oneshot_after_a_reboot_is_no_reason_to_flip() {
    let img = images();
    let h = Host::new(&img);
    let mut c = h.config("v1", serde_json::json!({}));
    c["gpu"] = "auto".into();
    fs::write(h.config_path(), serde_json::to_vec(&c).unwrap()).unwrap();
    let ldconfig = h.root().join("sbin/ldconfig");
    fs::create_dir_all(ldconfig.parent().unwrap()).unwrap();
    let marker = match std::env::consts::ARCH {
        "aarch64" => "AArch64",
        _ => "x86-64",
    };
    fs::write(
        &ldconfig,
        format!("#!/bin/sh\nprintf '1 libs found\\n\\tlibcuda.so.1 (libc6,{marker}) => /usr/lib/nvidia/libcuda.so.1\\n'\n"),
    )
    .unwrap();
    fs::set_permissions(&ldconfig, fs::Permissions::from_mode(0o755)).unwrap();
    let (code, _, err) = h.activate();
    assert_eq!(code, 0, "{err}");
    let before = h.state().slot(Slot::Kube1).inputs.clone();

    // "reboot": a GPU appeared, and the render oneshot of the machine's
    // start bound it
    kubeslot_activator::render::gpu::mknod_char(&h.root().join("dev/nvidia0"), 195, 0).unwrap();
    let (code, out, err) = h.cmd(&["render", "kube1"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("kube1.nspawn"), "{out}");
    let nspawn = fs::read_to_string(h.root().join("etc/systemd/nspawn/kube1.nspawn")).unwrap();
    assert!(nspawn.contains("Bind=/dev/nvidia0"), "{nspawn}");

    h.clear_calls();
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}");
    assert_eq!(r["outcome"], "up-to-date");
    assert!(starts_and_stops(&h.calls()).is_empty(), "{:?}", h.calls());
    assert_ne!(h.state().slot(Slot::Kube1).inputs, before);
}

/// Issue 42: a GPU host whose NVIDIA setup fails in the new machine (the
/// image's containerd requires it) fails the gate by check `gpu-setup`,
/// naming the unit; the old machine runs again, the report says why.
#[test]
fn a_failed_gpu_setup_fails_the_gate_and_rolls_back() {
    let img = images();
    let h = Host::new(&img);
    let mut c = h.config("v1", serde_json::json!({}));
    // a fake driver: no kernel module, no libraries
    let gpu_config = |c: &mut serde_json::Value| {
        c["gpu"] = "auto".into();
        let mut ignore = c["preflight"]["ignore"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        ignore.push("gpu-*".into());
        c["preflight"]["ignore"] = ignore.into();
    };
    gpu_config(&mut c);
    fs::write(h.config_path(), serde_json::to_vec(&c).unwrap()).unwrap();
    let ldconfig = h.root().join("sbin/ldconfig");
    fs::create_dir_all(ldconfig.parent().unwrap()).unwrap();
    fs::write(&ldconfig, "#!/bin/sh\nprintf '0 libs found\\n'\n").unwrap();
    fs::set_permissions(&ldconfig, fs::Permissions::from_mode(0o755)).unwrap();
    kubeslot_activator::render::gpu::mknod_char(&h.root().join("dev/nvidia0"), 195, 0).unwrap();
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert!(h
        .calls()
        .iter()
        .any(|c| c.contains("systemctl is-failed --quiet kubeslot-nvidia-setup.service")));

    fs::write(h.fake().join("gpu-setup-failed"), "").unwrap();
    let mut c = h.config("v2", serde_json::json!({}));
    gpu_config(&mut c);
    fs::write(h.config_path(), serde_json::to_vec(&c).unwrap()).unwrap();
    let (code, r, err) = h.activate();
    assert_eq!(code, 2, "{err}\n{r:#}");
    assert_eq!(r["outcome"], "rolled-back");
    let e = r["error"].as_str().unwrap();
    assert!(
        e.contains("machine kube2: health check gpu-setup failed")
            && e.contains("kubeslot-nvidia-setup.service failed inside the machine")
            && e.contains("rolled back to kube1"),
        "{e}"
    );
    assert_eq!(h.running(), [Slot::Kube1]);
}

/// A node that wrote a tree deeper than the activator's open-file limit
/// into each slot: two flips (one into each slot), run under
/// `RLIMIT_NOFILE` 1024, still succeed, and leave no staging directory.
#[test]
fn flips_succeed_over_trees_deeper_than_the_fd_limit() {
    require_tool("prlimit", "util-linux");
    let img = images();
    for mode in ["copy", "overlay"] {
        let h = Host::with_slots(&img, Some(mode));
        let root = Root::new(h.root());
        for v in ["v1", "v2"] {
            h.set_config(v, serde_json::json!({}));
            let (code, r, err) = h.activate();
            assert_eq!(code, 0, "{mode} {v}: {err}\n{r:#}");
        }
        for slot in [Slot::Kube1, Slot::Kube2] {
            // what the node wrote: its tree (copy) or its upper dir (overlay)
            let written = match mode {
                "copy" => root.machine_tree(slot.machine()).join("var/lib/deep"),
                _ => {
                    kubeslot_activator::slots::overlay::upper_dir(&root, slot).join("var/lib/deep")
                }
            };
            kubeslot_test_support::host::deep_tree(&written, 1100);
        }
        for v in ["v4", "v1"] {
            h.set_config(v, serde_json::json!({}));
            let out = Command::new("prlimit")
                .args([
                    "--nofile=1024:1024",
                    "--",
                    env!("CARGO_BIN_EXE_kubeslot-activator"),
                ])
                .args(["activate", "--json", "--force", "--root"])
                .arg(h.root())
                .env(
                    "PATH",
                    format!(
                        "{}:{}",
                        h.fake().join("bin").display(),
                        std::env::var("PATH").unwrap_or_default()
                    ),
                )
                .env("KUBESLOT_FAKE", h.fake())
                .env("KUBESLOT_FAKE_ROOT", h.root())
                .env("KUBESLOT_FAKE_PORT", h.port.to_string())
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{mode} {v} under 1024 fds: {}\n{}",
                String::from_utf8_lossy(&out.stderr),
                String::from_utf8_lossy(&out.stdout)
            );
        }
        let leftovers: Vec<_> = fs::read_dir(root.machines_dir())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(leftovers.is_empty(), "{mode}: {leftovers:?}");
    }
}
