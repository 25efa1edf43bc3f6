//! `follow` (`source.follow` by tag): a new release is taken only under an
//! unexpired release statement for its digest, once the node's wave has
//! opened and inside a maintenance window; an expired statement leaves the
//! node untouched while a reboot and a rollback still work.

use kubeslot_image::statement::{Statement, Wave};
use kubeslot_image::time::rfc3339_seconds;

use super::*;

const IDENTITY: &str = "registry.example/kubeslot/node";

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Signs the tags of `images` and trusts the key; `follow` the tag
/// `stable` when `follow`.
fn signed_host(img: &Images) -> Host {
    let layout = image::open_or_create(&img.layout);
    for d in [img.v1, img.v2] {
        image::sign(&layout, d, &image::key(7), IDENTITY);
    }
    let h = Host::new(img);
    fs::write(
        h.root().join("etc/kubeslot/release.pub"),
        image::public_pem(&image::key(7)),
    )
    .unwrap();
    h
}

fn set_config(h: &Host, follow: bool, rollout: serde_json::Value) {
    let mut c = h.config("v1", serde_json::json!({}));
    c["trust"] = serde_json::json!({
        "public_keys": ["/etc/kubeslot/release.pub"],
        "identity": IDENTITY,
    });
    if follow {
        c["source"] = serde_json::json!({"follow": {"tag": "stable"}});
        c["rollout"] = rollout;
    }
    fs::write(h.config_path(), serde_json::to_vec_pretty(&c).unwrap()).unwrap();
}

/// Moves the tag `stable` to `digest` (an image of the layout).
fn tag_stable(img: &Images, digest: Digest) {
    let layout = image::open_or_create(&img.layout);
    let index = layout.index().unwrap();
    let entry = index
        .manifests
        .iter()
        .find(|e| e.digest == digest)
        .expect("the image is in the layout");
    let plain = kubeslot_image::oci::Descriptor::new(&entry.media_type, entry.digest, entry.size);
    image::tag_entry(&layout, "stable", plain);
}

/// A statement for `digest` issued `issued_ago` seconds ago, valid for
/// `valid` seconds, all nodes from `open_in` seconds from now (negative:
/// already open).
fn statement(img: &Images, digest: Digest, issued_ago: u64, valid: u64, open_in: i64) {
    let issued = now() - issued_ago;
    let start = (now() as i64 + open_in) as u64;
    let s = Statement::new(
        IDENTITY,
        "stable",
        digest,
        issued,
        valid,
        vec![Wave {
            percent: 100,
            start: rfc3339_seconds(start),
        }],
    );
    image::issue_statement(&image::open_or_create(&img.layout), &s, &image::key(7));
}

fn follow(h: &Host) -> (i32, serde_json::Value, String) {
    let (code, out, err) = h.cmd(&["follow", "--json"]);
    let report = serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("report on stdout: {e}\n{out}\n{err}"));
    (code, report, err)
}

/// v1 committed by a plain activate, then the host follows `stable` -> v2.
fn following(img: &Images, rollout: serde_json::Value) -> Host {
    let h = signed_host(img);
    set_config(&h, false, serde_json::json!({}));
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{r:#}\n{err}");
    tag_stable(img, img.v2);
    set_config(&h, true, rollout);
    h.clear_calls();
    h
}

#[test]
fn without_source_follow_the_timer_run_does_nothing() {
    let img = images();
    let h = signed_host(&img);
    set_config(&h, false, serde_json::json!({}));
    let (code, out, err) = h.cmd(&["follow"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("source.follow is not set"), "{out}");
    assert!(h.state().active.is_none());
    assert!(h.calls().is_empty(), "{:?}", h.calls());
}

#[test]
fn a_release_is_taken_only_under_an_unexpired_statement() {
    let img = images();
    let h = following(&img, serde_json::json!({}));
    // no statement at all
    let (code, r, _) = follow(&h);
    assert_eq!(code, 1, "{r:#}");
    assert!(
        r["error"]
            .as_str()
            .unwrap()
            .contains("no release statement found"),
        "{r:#}"
    );
    // an expired one: refused, the node untouched
    statement(&img, img.v2, 7200, 3600, -7200);
    let before = h.slot_snapshot(Slot::Kube2);
    let (code, r, _) = follow(&h);
    assert_eq!(code, 1, "{r:#}");
    let e = r["error"].as_str().unwrap();
    assert!(
        e.contains("release statement expired at") && e.contains("(a mirror may be frozen)"),
        "{e}"
    );
    assert_eq!(h.state().active, Some(Slot::Kube1));
    assert_eq!(h.state().active_digest(), Some(img.v1));
    assert_eq!(
        h.slot_snapshot(Slot::Kube2),
        before,
        "the other slot untouched"
    );
    assert!(
        starts_and_stops(&h.changes()).is_empty(),
        "{:?}",
        h.changes()
    );
    // a reboot: the committed node comes up whatever the statement says
    h.power_off();
    let (code, r, _) = follow(&h);
    assert_eq!(code, 1, "{r:#}");
    assert_eq!(h.running(), vec![Slot::Kube1], "{r:#}");
    // plan says why
    let (_, out, _) = h.cmd(&["plan"]);
    assert!(
        out.contains("refused by source.follow") && out.contains("expired at"),
        "{out}"
    );
    // renewed: taken
    statement(&img, img.v2, 60, 3600, -60);
    let (code, r, err) = follow(&h);
    assert_eq!(code, 0, "{r:#}\n{err}");
    assert_eq!(r["outcome"], "committed", "{r:#}");
    assert_eq!(h.state().active_digest(), Some(img.v2));
    assert_eq!(r["rollout"]["window"], "any time", "{r:#}");
    // expired again later: a rollback does not look at it
    statement(&img, img.v2, 7200, 3600, -7200);
    let (code, out, err) = h.cmd(&["rollback"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(h.state().active_digest(), Some(img.v1));
}

#[test]
fn a_node_waits_for_its_wave_and_for_a_window() {
    let img = images();
    // the wave opens in an hour
    let h = following(&img, serde_json::json!({}));
    statement(&img, img.v2, 60, 86_400, 3600);
    let (code, r, err) = follow(&h);
    assert_eq!(code, 0, "{r:#}\n{err}");
    assert_eq!(r["outcome"], "waiting", "{r:#}");
    let waiting = r["rollout"]["waiting"].as_str().unwrap();
    assert!(
        waiting.contains("is in wave 1 (100%), which opens at"),
        "{waiting}"
    );
    assert!(
        starts_and_stops(&h.changes()).is_empty(),
        "{:?}",
        h.changes()
    );
    let (_, out, _) = h.cmd(&["plan"]);
    assert!(
        out.contains("rollout: place 0.") && out.contains("wave opens"),
        "{out}"
    );
    let (_, out, _) = h.cmd(&["status"]);
    assert!(out.contains("waiting: node node-a"), "{out}");

    // the wave is open, the window is not: it opens in two hours
    let open = (now() + 7200) / 60 % 1440;
    let close = (open + 60) % 1440;
    let window = serde_json::json!({"windows": [{
        "start": format!("{:02}:{:02}", open / 60, open % 60),
        "end": format!("{:02}:{:02}", close / 60, close % 60),
    }]});
    set_config(&h, true, window);
    statement(&img, img.v2, 60, 86_400, -60);
    let (code, r, _) = follow(&h);
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(r["outcome"], "waiting", "{r:#}");
    assert!(
        r["rollout"]["waiting"]
            .as_str()
            .unwrap()
            .contains("outside the maintenance windows"),
        "{r:#}"
    );
    assert_eq!(h.state().active_digest(), Some(img.v1));
    // the window now
    let open = now() / 60 % 1440;
    let close = (open + 120) % 1440;
    set_config(
        &h,
        true,
        serde_json::json!({"windows": [{
            "start": format!("{:02}:{:02}", open / 60, open % 60),
            "end": format!("{:02}:{:02}", close / 60, close % 60),
        }]}),
    );
    let (code, r, err) = follow(&h);
    assert_eq!(code, 0, "{r:#}\n{err}");
    assert_eq!(r["outcome"], "committed", "{r:#}");
}

/// `rollout.limit` on a following node, against the fixture API server
/// with the node authorizer on and only `deploy/rollout.yaml`'s grants:
/// the only lease held by another node, the pause switch and a rollback of
/// the digest elsewhere each make the run wait (nothing staged or stopped, `status`
/// and `plan` say why); once free, the node takes the lease, flips and
/// releases it.
#[test]
fn a_following_node_waits_for_the_limit_and_the_halt() {
    use crate::rollout::{fleet, manifest_grants};
    let img = images();
    let f = fleet(&["node-a".into(), "node-b".into()], manifest_grants());
    let limit = serde_json::json!({"limit": {
        "kubeconfig": f.kubeconfig("rollout-node-a"),
        "max_unavailable": 1,
        "lease_duration_secs": 30,
        "halt_after": 1,
    }});
    let h = following(&img, limit);
    statement(&img, img.v2, 60, 3600, -60);
    let leases = "/apis/coordination.k8s.io/v1/namespaces/kubeslot-system/leases";
    let renew = rfc3339_seconds(now()).replace('Z', ".000000Z");
    let held = serde_json::json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "kubeslot-rollout-0", "namespace": "kubeslot-system"},
        "spec": {"holderIdentity": "node-z", "leaseDurationSeconds": 30,
            "acquireTime": renew, "renewTime": renew}});
    let (code, v) = f.admin("POST", leases, Some(&held));
    assert_eq!(code, 201, "{v}");
    let waits = |h: &Host, why: &str| {
        let idle = h.slot_snapshot(Slot::Kube2);
        let (code, r, err) = follow(h);
        assert_eq!(code, 0, "{r:#}\n{err}");
        assert_eq!(r["outcome"], "waiting", "{r:#}");
        let w = r["rollout"]["waiting"].as_str().unwrap_or_default();
        assert!(w.contains(why), "{why}: {r:#}");
        assert_eq!(h.state().active_digest(), Some(img.v1));
        assert_eq!(h.slot_snapshot(Slot::Kube2), idle, "nothing staged");
        assert!(
            starts_and_stops(&h.changes()).is_empty(),
            "{:?}",
            h.changes()
        );
    };
    waits(&h, "waiting for a rollout lease: all 1 held");
    let (_, out, _) = h.cmd(&["status"]);
    assert!(out.contains("kubeslot-rollout-0 by node-z"), "{out}");
    let (_, out, _) = h.cmd(&["plan"]);
    assert!(out.contains("kubeslot-rollout-0 by node-z"), "{out}");
    // released by its holder; then the pause switch
    let (code, v) = f.admin("DELETE", &format!("{leases}/kubeslot-rollout-0"), None);
    assert_eq!(code, 200, "{v}");
    f.pause("true");
    waits(&h, "the rollout is paused");
    f.pause("false");
    // another node rolled this digest back: halt_after 1
    let digest = img.v2.to_string();
    f.report("node-b", &digest, "rolled-back: gate failed");
    waits(&h, "is halted: 1 node(s) rolled it back (node-b)");
    f.report("node-b", &digest, "committed");
    // free: taken, flipped, released
    let (code, r, err) = follow(&h);
    assert_eq!(code, 0, "{r:#}\n{err}");
    assert_eq!(r["outcome"], "committed", "{r:#}");
    assert_eq!(h.state().active_digest(), Some(img.v2));
    let lease = f.lease("kubeslot-rollout-0");
    assert!(
        lease["spec"]["holderIdentity"].is_null(),
        "released: {lease:#}"
    );
}

/// `source.follow: {"annotation": true}`: the image the Node's own
/// `kubeslot.io/desired-image` annotation names, read with the node's
/// credentials (the node authorizer on): unset, the node stays; set, it
/// moves there under the release statement's gates.
#[test]
fn a_node_follows_its_desired_image_annotation() {
    use crate::rollout::{fleet, manifest_grants};
    let img = images();
    let f = fleet(&["node-a".into()], manifest_grants());
    let h = following(&img, serde_json::json!({}));
    // the node's kubeconfig and its files where the host reads them
    let kc = f.kubeconfig("node-node-a");
    let pki = kc.parent().unwrap();
    for name in [
        "ca.crt",
        "node-node-a.crt",
        "node-node-a.key",
        "node-node-a.kubeconfig",
    ] {
        let to = h.root().join(pki.strip_prefix("/").unwrap()).join(name);
        fs::create_dir_all(to.parent().unwrap()).unwrap();
        fs::copy(pki.join(name), to).unwrap();
    }
    let mut c: serde_json::Value =
        serde_json::from_slice(&fs::read(h.config_path()).unwrap()).unwrap();
    c["source"] = serde_json::json!({"follow": {"annotation": true}});
    c["cluster"] = serde_json::json!({"kubeconfig": kc, "drain": {"enabled": false},
        "gate": {"skip_node_ready": true}});
    fs::write(h.config_path(), serde_json::to_vec_pretty(&c).unwrap()).unwrap();
    statement(&img, img.v2, 60, 3600, -60);
    let (code, r, err) = follow(&h);
    assert_eq!(code, 0, "{r:#}\n{err}");
    assert_eq!(
        h.state().active_digest(),
        Some(img.v1),
        "no annotation: {r:#}"
    );
    let v2 = format!("oci:{}:v2", img.layout.display());
    let (code, v) = f.admin(
        "PATCH",
        "/api/v1/nodes/node-a",
        Some(&serde_json::json!({"metadata": {"annotations": {"kubeslot.io/desired-image": v2}}})),
    );
    assert_eq!(code, 200, "{v}");
    let (code, r, err) = follow(&h);
    assert_eq!(code, 0, "{r:#}\n{err}");
    assert_eq!(r["outcome"], "committed", "{r:#}");
    assert_eq!(h.state().active_digest(), Some(img.v2));
    assert_eq!(r["image"], v2, "{r:#}");
}
