//! `plan --kubeconfig`: the drain the flip does first, read from the
//! fixture API server with the admin's kubeconfig: evicted, skipped and
//! refusing pods with why, the budget that allows zero disruptions, in
//! text and JSON; a refused drain; a missing Node.

use std::path::Path;

use serde_json::json;

use super::*;
use crate::cluster::{start, CONFIG};

#[test]
fn plan_shows_the_drain_its_skips_and_the_blocking_budget() {
    let img = images();
    let h = Host::new(&img);
    let fx = start(CONFIG);
    fx.node("node-a");
    let owner = |kind: &str, name: &str| json!([{"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": format!("u-{name}"), "controller": true}]);
    for (name, owners, annotations) in [
        ("web-1", owner("ReplicaSet", "web"), json!({})),
        ("agent-1", owner("DaemonSet", "agent"), json!({})),
        (
            "static-1",
            json!([]),
            json!({"kubernetes.io/config.mirror": "abc"}),
        ),
    ] {
        fx.create(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {"app": name},
                "ownerReferences": owners, "annotations": annotations},
            "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "x:1"}]}}));
    }
    fx.create(json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "agent-1"}}, "template": {"metadata": {"labels": {"app": "agent-1"}},
            "spec": {"containers": [{"name": "c", "image": "x:1"}]}}}}));
    fx.set_ready("web-1");
    fx.create(
        json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web-1"}}}}),
    );
    let kc = fx.kubeconfig("admin");
    let kc = kc.to_str().unwrap();

    let (code, out, err) = h.cmd(&["plan", "--kubeconfig", kc]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("flip to kube1 ({})", img.v1)),
        "{out}"
    );
    let drain = out
        .split_once("drain of node node-a before the flip")
        .unwrap_or_else(|| panic!("{out}"))
        .1;
    let lines: Vec<&str> = drain.lines().skip(1).collect();
    assert_eq!(
        lines,
        [
            "  skip default/agent-1: DaemonSet agent",
            "  skip default/static-1: mirror pod of a static pod",
            "  evict default/web-1: its controller replaces it; blocked: budget web allows zero disruptions (needs 1 healthy pods, has 1)",
            "  budgets allowing zero disruptions now: default/web",
        ],
        "{out}"
    );

    let (code, out, err) = h.cmd(&["plan", "--kubeconfig", kc, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let d = &v["drain"];
    assert_eq!(d["node"], "node-a");
    assert_eq!(d["planned"], true);
    assert_eq!(d["evict"], json!(["default/web-1"]));
    assert_eq!(d["blocking_budgets"], json!(["default/web"]));
    assert_eq!(d["refusals"], json!([]));
    assert_eq!(
        d["warnings"],
        json!(["ignoring DaemonSet-managed Pods: default/agent-1"])
    );
    let reasons: Vec<(String, String)> = d["pods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["action"].as_str().unwrap().to_string(),
                p["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        reasons,
        [
            ("skip".to_string(), "daemon-set".to_string()),
            ("skip".into(), "mirror".into()),
            ("evict".into(), "controlled".into())
        ]
    );
    assert_eq!(d["pods"][2]["budget"]["budget"], "blocks");

    // a pod without a controller refuses the whole drain, as kubectl does
    fx.pod("bare", "node-a", json!({}));
    let (code, out, err) = h.cmd(&["plan", "--kubeconfig", kc]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("  refuse default/bare: no controller: nothing recreates it\n"),
        "{out}"
    );
    assert!(out.contains("  (evict) default/web-1"), "{out}");
    assert!(
        out.contains("  the drain is refused: cannot delete Pods that declare no controller (use --force to override): default/bare\n"),
        "{out}"
    );

    // a Node the cluster does not have: plan fails naming it
    let (code, _, err) = h.cmd(&["plan", "--kubeconfig", kc, "--node", "node-x"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("the drain of node node-x") && err.contains("nodes \"node-x\" not found"),
        "{err}"
    );

    // no flag: the config's cluster.kubeconfig (a host file naming host
    // files) and its drain knobs (force: the bare pod is evicted)
    let pki = h.root().join("etc/kubeslot/pki");
    fs::create_dir_all(&pki).unwrap();
    for f in ["ca.crt", "admin.crt", "admin.key"] {
        fs::copy(fx.dir.path().join("pki").join(f), pki.join(f)).unwrap();
    }
    let write_kubeconfig = |name: &str, url: &str| {
        let text = fake_apiserver::kubeconfig(
            url,
            Path::new("/etc/kubeslot/pki/ca.crt"),
            Path::new("/etc/kubeslot/pki/admin.crt"),
            Path::new("/etc/kubeslot/pki/admin.key"),
            "kubernetes-admin",
        );
        fs::write(h.root().join("etc/kubeslot").join(name), text).unwrap();
    };
    write_kubeconfig("cluster.kubeconfig", &fx.url);
    write_kubeconfig("gone.kubeconfig", "https://127.0.0.1:1");
    let set_cluster = |cluster: serde_json::Value| {
        let mut c = h.config("v1", json!({}));
        c["cluster"] = cluster;
        fs::write(h.config_path(), serde_json::to_vec_pretty(&c).unwrap()).unwrap();
    };
    set_cluster(
        json!({"kubeconfig": "/etc/kubeslot/cluster.kubeconfig", "drain": {"force": true}}),
    );
    let (code, out, err) = h.cmd(&["plan"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("drain of node node-a before the flip (kubeconfig ")
            && out
                .contains("as kubectl drain --ignore-daemonsets --delete-emptydir-data --force:\n"),
        "{out}"
    );
    assert!(
        out.contains("  evict default/bare: no controller: nothing recreates it\n"),
        "{out}"
    );
    assert!(!out.contains("refused"), "{out}");

    // a configured cluster that cannot be read: the plan says what
    // activate then does, and exits 0
    set_cluster(
        json!({"kubeconfig": "/etc/kubeslot/gone.kubeconfig", "drain": {"required": true}}),
    );
    let (code, out, err) = h.cmd(&["plan"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("the cluster cannot be read now: the drain of node node-a")
            && out.contains("  activate would refuse the flip (cluster.drain.required)\n"),
        "{out}"
    );
    let (_, out, _) = h.cmd(&["plan", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["drain"]["required"], true);
    assert!(
        v["drain"]["error"].as_str().unwrap().contains("no answer"),
        "{v}"
    );

    // drain disabled: no drain shown
    set_cluster(
        json!({"kubeconfig": "/etc/kubeslot/cluster.kubeconfig", "drain": {"enabled": false}}),
    );
    let (_, out, _) = h.cmd(&["plan"]);
    assert!(!out.contains("drain of node"), "{out}");
}

/// A reconcile that stops the running machine drains it first: a run
/// killed once its new machine (v3, never healthy) started leaves that
/// machine running, the Node cordoned by kubeslot (its record in the
/// state), and a pod the scheduler bound meanwhile; the next run rolls the
/// dead run's try back, evicting that pod before it stops the machine, and
/// then uncordons the Node.
#[test]
fn a_dead_run_s_running_machine_is_drained_before_recovery_stops_it() {
    use std::os::unix::process::ExitStatusExt;
    let img = images();
    let h = Host::new(&img);
    let fx = start(
        r#"{"client_certs": [{"name": "admin", "user": "kubernetes-admin", "groups": ["system:masters"]}],
            "remove_pods_after_grace": true}"#,
    );
    fx.node("node-a");
    let (code, _, err) = h.cmd(&["activate"]);
    assert_eq!(code, 0, "{err}");
    // the admin's kubeconfig as a host file naming host files
    let pki = h.root().join("etc/kubeslot/pki");
    fs::create_dir_all(&pki).unwrap();
    for f in ["ca.crt", "admin.crt", "admin.key"] {
        fs::copy(fx.dir.path().join("pki").join(f), pki.join(f)).unwrap();
    }
    let text = fake_apiserver::kubeconfig(
        &fx.url,
        Path::new("/etc/kubeslot/pki/ca.crt"),
        Path::new("/etc/kubeslot/pki/admin.crt"),
        Path::new("/etc/kubeslot/pki/admin.key"),
        "kubernetes-admin",
    );
    fs::write(h.root().join("etc/kubeslot/admin.kubeconfig"), text).unwrap();
    let mut c = h.config("v3", json!({}));
    c["cluster"] = json!({"kubeconfig": "/etc/kubeslot/admin.kubeconfig",
        "drain": {"timeout_secs": 30, "pod_grace_cap_secs": 1},
        "gate": {"skip_node_ready": true}});
    fs::write(h.config_path(), serde_json::to_vec_pretty(&c).unwrap()).unwrap();
    let out = h.run(&["activate"], Some("after-start-new"));
    assert_eq!(
        out.status.signal(),
        Some(6),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let node = || fx.get("/api/v1/nodes/node-a").1;
    assert_eq!(
        node()["spec"]["unschedulable"],
        true,
        "the dead run's cordon"
    );
    // bound to the node while kube2 ran
    fx.create(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-2", "namespace": "default",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "u-web", "controller": true}]},
        "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "x:1"}]}}));

    let (code, _, err) = h.cmd(&["activate"]);
    assert_ne!(code, 0, "v3 is bad after its rollback: {err}");
    let r = h.report();
    let recovered = r["recovered"].as_str().unwrap_or_else(|| panic!("{r}"));
    assert!(
        recovered.contains("rolled back a dead run's flip to kube2")
            && recovered.contains(
                "drained node node-a before stopping kube2 (drained: evicted default/web-2)"
            )
            && recovered.contains("a dead run's drain: uncordoned node node-a"),
        "{recovered}"
    );
    let pod = fx.get("/api/v1/namespaces/default/pods/web-2");
    assert_eq!(pod.0, 404, "{recovered}: {}", pod.1);
    assert_eq!(node()["spec"]["unschedulable"], serde_json::Value::Null);
    let st = h.state();
    assert_eq!((st.active, st.cordoned), (Some(Slot::Kube1), None));
}
