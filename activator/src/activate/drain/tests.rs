//! The drain around a flip against the fixture API server (in-process),
//! with the node's own kubeconfig as the kubelet leaves it after TLS
//! bootstrap, and the fake systemd.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use base64::Engine as _;
use fake_apiserver::{admin_request, config::Config as FixtureConfig, create_as_admin};
use serde_json::{json, Value};

use crate::activate::fixture::*;
use crate::activate::*;

struct Api {
    srv: Arc<fake_apiserver::api::Server>,
    _dir: tempfile::TempDir,
    stop: Arc<AtomicBool>,
    /// What the kubelet played by the test reports: Ready or not.
    ready: Arc<AtomicBool>,
}

impl Drop for Api {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The fixture's config: node-a's certificate, and as grants exactly the
/// ClusterRole `deploy/kubeslot-node.yaml` ships, bound as it binds it
/// (the node authorizer and NodeRestriction do the rest).
fn fixture_config() -> FixtureConfig {
    let manifest = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubeslot-node.yaml"),
    )
    .unwrap();
    let docs: Vec<Value> = manifest
        .split("\n---\n")
        .map(|d| crate::cluster::kubeconfig::parse(d).unwrap())
        .collect();
    let role = docs.iter().find(|d| d["kind"] == "ClusterRole").unwrap();
    let binding = docs
        .iter()
        .find(|d| d["kind"] == "ClusterRoleBinding")
        .unwrap();
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    let rules: Vec<Value> = role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| json!({"verbs": r["verbs"], "api_groups": r["apiGroups"], "resources": r["resources"]}))
        .collect();
    let subjects: Vec<Value> = binding["subjects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| json!({"kind": s["kind"], "name": s["name"]}))
        .collect();
    let config = json!({
        "client_certs": [{"name": "node-a", "user": "system:node:node-a", "groups": ["system:nodes"]}],
        "grants": [{"subjects": subjects, "rules": rules}],
        "remove_pods_after_grace": false,
    });
    FixtureConfig::parse(&config.to_string(), "fixture").unwrap()
}

/// The fixture with Node `node-a`, the node's kubeconfig where the kubelet
/// leaves it (`/var/lib/kubelet` is the node state on the host), and a
/// thread playing the kubelet: it confirms each deletion (grace 0).
fn api(s: &Setup) -> Api {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    let p = fake_apiserver::prepare("127.0.0.1:0", &pki, fixture_config()).unwrap();
    let (srv, url) = fake_apiserver::spawn(p);
    let node_state = s.root.node_state().join("kubelet");
    std::fs::create_dir_all(node_state.join("pki")).unwrap();
    let read = |n: &str| std::fs::read_to_string(pki.join(n)).unwrap();
    std::fs::write(
        node_state.join("pki/kubelet-client-current.pem"),
        read("node-a.crt") + &read("node-a.key"),
    )
    .unwrap();
    let ca = base64::engine::general_purpose::STANDARD.encode(read("ca.crt"));
    std::fs::write(
        node_state.join("kubeconfig"),
        format!("apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: {ca}\n    server: {url}\n  name: default-cluster\ncontexts:\n- context:\n    cluster: default-cluster\n    namespace: default\n    user: default-auth\n  name: default-context\ncurrent-context: default-context\nkind: Config\npreferences: {{}}\nusers:\n- name: default-auth\n  user:\n    client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem\n    client-key: /var/lib/kubelet/pki/kubelet-client-current.pem\n"),
    )
    .unwrap();
    create_as_admin(
        &srv,
        &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
    )
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(AtomicBool::new(true));
    let (srv2, stop2, ready2) = (srv.clone(), stop.clone(), ready.clone());
    std::thread::spawn(move || {
        while !stop2.load(Ordering::Relaxed) {
            // the node's heartbeat, as a kubelet posts its status
            let status = if ready2.load(Ordering::Relaxed) {
                "True"
            } else {
                "False"
            };
            admin_request(
                &srv2,
                "PATCH",
                "/api/v1/nodes/node-a/status",
                "application/strategic-merge-patch+json",
                Some(
                    &json!({"status": {"conditions": [{"type": "Ready", "status": status,
                    "reason": if status == "True" { "KubeletReady" } else { "KubeletNotReady" },
                    "lastHeartbeatTime": kubeslot_image::time::now_rfc3339()}]}}),
                ),
            );
            let (_, pods) = admin_request(&srv2, "GET", "/api/v1/pods", "", None);
            for p in pods["items"].as_array().into_iter().flatten() {
                if p["metadata"]["deletionTimestamp"].is_string() {
                    let path = format!(
                        "/api/v1/namespaces/{}/pods/{}",
                        p["metadata"]["namespace"].as_str().unwrap(),
                        p["metadata"]["name"].as_str().unwrap()
                    );
                    admin_request(
                        &srv2,
                        "DELETE",
                        &path,
                        "application/json",
                        Some(&json!({"gracePeriodSeconds": 0})),
                    );
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    });
    Api {
        srv,
        _dir: dir,
        stop,
        ready,
    }
}

impl Api {
    fn create(&self, obj: Value) -> Value {
        create_as_admin(&self.srv, &obj).unwrap()
    }
    fn get(&self, path: &str) -> (u16, Value) {
        admin_request(&self.srv, "GET", path, "", None)
    }
    fn unschedulable(&self) -> bool {
        self.get("/api/v1/nodes/node-a").1["spec"]["unschedulable"] == json!(true)
    }
    fn cordon(&self) {
        let (code, v) = admin_request(
            &self.srv,
            "PATCH",
            "/api/v1/nodes/node-a",
            "application/merge-patch+json",
            Some(&json!({"spec": {"unschedulable": true}})),
        );
        assert_eq!(code, 200, "{v}");
    }
    /// A ReplicaSet `web` with Ready pod `web-1` on node-a, a DaemonSet
    /// `agent` with its pod, and a mirror pod.
    fn workload(&self) {
        let rs = self.create(json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "web", "namespace": "default"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}}, "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "x:1"}]}}}}));
        let ds = self.create(json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "agent"}}, "template": {"metadata": {"labels": {"app": "agent"}}, "spec": {"containers": [{"name": "c", "image": "x:1"}]}}}}));
        let owner = |kind: &str, o: &Value| json!([{"apiVersion": "apps/v1", "kind": kind, "name": o["metadata"]["name"], "uid": o["metadata"]["uid"], "controller": true}]);
        for (name, labels, owners, annotations) in [
            (
                "web-1",
                json!({"app": "web"}),
                owner("ReplicaSet", &rs),
                json!({}),
            ),
            (
                "agent-x",
                json!({"app": "agent"}),
                owner("DaemonSet", &ds),
                json!({}),
            ),
            (
                "static-node-a",
                json!({}),
                json!([]),
                json!({"kubernetes.io/config.mirror": "abc"}),
            ),
        ] {
            self.create(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "default", "labels": labels, "ownerReferences": owners, "annotations": annotations},
                "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "x:1"}]}}));
            let (code, v) = admin_request(
                &self.srv,
                "PATCH",
                &format!("/api/v1/namespaces/default/pods/{name}/status"),
                "application/merge-patch+json",
                Some(
                    &json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}),
                ),
            );
            assert_eq!(code, 200, "{v}");
        }
    }
}

/// The config with a `cluster` section and a label that changes the
/// rendered inputs (so the next run flips).
fn with_cluster(s: &Setup, cluster: Value, label: &str) {
    let mut c: Value = serde_json::from_slice(&std::fs::read(&s.config).unwrap()).unwrap();
    c["cluster"] = cluster;
    c["kubelet"]["labels"] = json!({"pool": label});
    std::fs::write(&s.config, serde_json::to_vec(&c).unwrap()).unwrap();
}

/// The Events about node-a: `(reason, message)`.
fn events(api: &Api) -> Vec<(String, String)> {
    let (_, list) = api.get("/api/v1/namespaces/default/events");
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["involvedObject"]["name"] == "node-a")
        .map(|e| {
            (
                e["reason"].as_str().unwrap().to_string(),
                e["message"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn pod_exists(api: &Api, name: &str) -> bool {
    api.get(&format!("/api/v1/namespaces/default/pods/{name}"))
        .0
        == 200
}

#[test]
fn a_flip_drains_first_and_uncordons_after_the_commit() {
    let (s, fake, _) = setup("healthy", None, "off");
    assert_eq!(run(&s, &fake).outcome, Some(Outcome::Committed));
    let api = api(&s);
    api.workload();
    with_cluster(
        &s,
        json!({"metrics_file": "/var/lib/node_exporter/textfile/kubeslot.prom"}),
        "b",
    );
    let r = run(&s, &fake);
    assert_eq!(r.outcome, Some(Outcome::Committed), "{r:?}");
    // what the cluster sees
    let a = api.get("/api/v1/nodes/node-a").1["metadata"]["annotations"].clone();
    assert_eq!(a["kubeslot.io/phase"], "committed", "{a}");
    assert_eq!(a["kubeslot.io/slot"], "kube2");
    assert_eq!(a["kubeslot.io/last-result"], "committed");
    assert_eq!(a["kubeslot.io/digest"], r.digest.unwrap().to_string());
    assert_eq!(a["kubeslot.io/image"], r.image.clone().unwrap());
    let mut reasons: Vec<String> = events(&api).into_iter().map(|e| e.0).collect();
    reasons.sort();
    assert_eq!(reasons, ["KubeslotCommit", "KubeslotDrain", "KubeslotFlip"]);
    // and the host
    let m = std::fs::read_to_string(s.root.join("var/lib/node_exporter/textfile/kubeslot.prom"))
        .unwrap();
    assert!(
        m.contains(&format!(
            "kubeslot_image_info{{digest=\"{}\",slot=\"kube2\"",
            r.digest.unwrap()
        )),
        "{m}"
    );
    assert!(
        m.contains("kubeslot_activations_total{result=\"committed\"} 1\n"),
        "{m}"
    );
    assert!(m.contains("kubeslot_evicted_pods 1\n"), "{m}");
    let d = r.drain.as_ref().expect("a drain");
    assert_eq!(d.result, "drained", "{d:?}");
    assert_eq!(d.evicted, ["default/web-1"]);
    assert!(d.cordoned);
    assert_eq!(d.skipped.len(), 2, "{d:?}");
    assert!(!pod_exists(&api, "web-1"));
    assert!(pod_exists(&api, "agent-x") && pod_exists(&api, "static-node-a"));
    assert!(!api.unschedulable());
    let st = State::load(&s.root).unwrap();
    assert_eq!((st.active, st.cordoned), (Some(Slot::Kube2), None));
    assert!(
        r.to_text().contains("drain of node node-a: drained"),
        "{}",
        r.to_text()
    );
}

#[test]
fn a_budget_that_holds_past_the_timeout_means_no_flip_and_an_uncordoned_node() {
    let (s, fake, _) = setup("healthy", None, "off");
    assert_eq!(run(&s, &fake).outcome, Some(Outcome::Committed));
    let api = api(&s);
    api.workload();
    api.create(json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web", "namespace": "default"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "web"}}}}));
    with_cluster(&s, json!({"drain": {"timeout_secs": 2}}), "b");
    let calls = fake.calls().len();
    let r = run(&s, &fake);
    assert_eq!(r.exit_code, exit::DRAIN, "{r:?}");
    let d = r.drain.as_ref().unwrap();
    assert_eq!(d.result, "blocked");
    assert_eq!(d.stuck.len(), 1, "{d:?}");
    assert_eq!(d.stuck[0].pod, "default/web-1");
    assert_eq!(d.stuck[0].budget.as_deref(), Some("default/web"));
    let e = r.error.as_deref().unwrap();
    assert!(
        e.contains("default/web-1 (budget default/web") && e.contains("not flipped"),
        "{e}"
    );
    // nothing stopped, the pod is there, the Node takes pods again
    assert!(
        !fake.calls()[calls..].iter().any(|c| c.starts_with("stop ")),
        "{:?}",
        fake.calls()
    );
    assert!(pod_exists(&api, "web-1"));
    assert!(!api.unschedulable());
    let ev = events(&api);
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0].0, "KubeslotDrainBlocked");
    assert!(
        ev[0].1.contains("default/web-1 (budget default/web"),
        "{ev:?}"
    );
    let a = api.get("/api/v1/nodes/node-a").1["metadata"]["annotations"].clone();
    assert_eq!(a["kubeslot.io/last-result"], "drain-blocked", "{a}");
    let st = State::load(&s.root).unwrap();
    assert_eq!(
        (st.active, st.pending.is_none(), st.cordoned),
        (Some(Slot::Kube1), true, None)
    );
}

#[test]
fn an_operator_s_cordon_stays_after_the_flip() {
    let (s, fake, _) = setup("healthy", None, "off");
    assert_eq!(run(&s, &fake).outcome, Some(Outcome::Committed));
    let api = api(&s);
    api.cordon();
    with_cluster(&s, json!({}), "b");
    let r = run(&s, &fake);
    assert_eq!(r.outcome, Some(Outcome::Committed), "{r:?}");
    assert!(!r.drain.as_ref().unwrap().cordoned);
    assert!(
        api.unschedulable(),
        "kubeslot uncordoned an operator's cordon"
    );
}

#[test]
fn a_dead_run_s_cordon_is_undone_by_the_next_run() {
    let (s, fake, _) = setup("healthy", None, "off");
    assert_eq!(run(&s, &fake).outcome, Some(Outcome::Committed));
    let api = api(&s);
    // what a run killed right after its cordon leaves
    api.cordon();
    let mut st = State::load(&s.root).unwrap();
    st.cordoned = Some(crate::state::Cordoned {
        node: "node-a".into(),
        kubeconfig: s.root.node_state().join("kubelet/kubeconfig"),
        machine: "kube1".into(),
        request_timeout_secs: 5,
    });
    st.save(&s.root).unwrap();
    let r = run(&s, &fake);
    assert_eq!(r.outcome, Some(Outcome::UpToDate), "{r:?}");
    assert!(
        r.recovered
            .as_deref()
            .unwrap()
            .contains("uncordoned node node-a"),
        "{r:?}"
    );
    assert!(!api.unschedulable());
    assert_eq!(State::load(&s.root).unwrap().cordoned, None);
}

#[test]
fn no_api_refuses_the_flip_only_when_the_drain_is_required() {
    let (s, fake, _) = setup("healthy", None, "off");
    assert_eq!(run(&s, &fake).outcome, Some(Outcome::Committed));
    // no kubeconfig at all: the node never bootstrapped
    with_cluster(&s, json!({"drain": {"required": true}}), "b");
    let r = run(&s, &fake);
    assert_eq!(r.exit_code, exit::DRAIN, "{r:?}");
    assert_eq!(r.drain.as_ref().unwrap().result, "unavailable");
    assert_eq!(State::load(&s.root).unwrap().active, Some(Slot::Kube1));
    with_cluster(&s, json!({"drain": {"required": false}}), "b");
    let r = run(&s, &fake);
    assert_eq!(r.outcome, Some(Outcome::Committed), "{r:?}");
    let d = r.drain.as_ref().unwrap();
    assert_eq!(d.result, "undrained");
    assert!(
        d.note.as_deref().unwrap().contains("flipping undrained"),
        "{d:?}"
    );
}

#[test]
fn a_node_the_api_server_never_sees_ready_rolls_back_and_is_uncordoned() {
    let (s, fake, _) = setup("healthy", None, "off");
    assert_eq!(run(&s, &fake).outcome, Some(Outcome::Committed));
    let api = api(&s);
    with_cluster(&s, json!({}), "b");
    api.ready.store(false, Ordering::Relaxed);
    // the heartbeat is second-granular, as a kubelet's: the run starts
    // once the API server has the NotReady heartbeat, not an older Ready
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while api.get("/api/v1/nodes/node-a").1["status"]["conditions"][0]["status"] != "False" {
        assert!(
            std::time::Instant::now() < deadline,
            "no NotReady heartbeat"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let r = run(&s, &fake);
    assert_eq!(r.exit_code, exit::ROLLED_BACK, "{r:?}");
    let e = r.error.as_deref().unwrap();
    assert!(
        e.contains("health check node-ready failed") && e.contains("KubeletNotReady"),
        "{e}"
    );
    let st = State::load(&s.root).unwrap();
    assert_eq!((st.active, st.cordoned), (Some(Slot::Kube1), None));
    assert_eq!(
        fake.active_units().into_iter().collect::<Vec<_>>(),
        ["systemd-nspawn@kube1.service"]
    );
    assert!(!api.unschedulable());
    let a = api.get("/api/v1/nodes/node-a").1["metadata"]["annotations"].clone();
    assert_eq!(a["kubeslot.io/phase"], "rolled-back", "{a}");
    assert!(
        a["kubeslot.io/last-reason"]
            .as_str()
            .unwrap()
            .contains("node-ready"),
        "{a}"
    );
    // what the fleet's halt reads: this node rolled this digest back
    let node = crate::rollout::halt::NodeInfo {
        name: "node-a".into(),
        annotations: serde_json::from_value(a.clone()).unwrap(),
    };
    let digest = r.digest.unwrap().to_string();
    assert_eq!(a[crate::rollout::halt::LAST_DIGEST], digest.as_str(), "{a}");
    assert!(
        crate::rollout::halt::rolled_back(&[node], &digest).contains(&"node-a".to_string()),
        "{a}"
    );
    let mut reasons: Vec<String> = events(&api).into_iter().map(|e| e.0).collect();
    reasons.sort();
    assert_eq!(
        reasons,
        ["KubeslotDrain", "KubeslotFlip", "KubeslotRollback"]
    );
    // Ready again: the next try (forced: the image is marked bad) commits
    api.ready.store(true, Ordering::Relaxed);
    let r = run_opts(
        &s,
        &fake,
        Options {
            force: true,
            ..Options::default()
        },
    );
    assert_eq!(r.outcome, Some(Outcome::Committed), "{r:?}");
    assert!(
        r.health
            .as_deref()
            .unwrap()
            .contains("sees node node-a Ready"),
        "{r:?}"
    );
}

#[test]
fn the_cluster_gate_wants_the_kubelet_the_image_carries() {
    let (s, fake, _) = setup("healthy", None, "off");
    assert_eq!(run(&s, &fake).outcome, Some(Outcome::Committed));
    let api = api(&s);
    let (code, v) = admin_request(
        &api.srv,
        "PATCH",
        "/api/v1/nodes/node-a/status",
        "application/strategic-merge-patch+json",
        Some(&json!({"status": {"nodeInfo": {"kubeletVersion": "v1.36.0"}}})),
    );
    assert_eq!(code, 200, "{v}");
    // the image says 1.36.1, the Node keeps reporting v1.36.0: rolled back
    image_kubelet(&img_dir(&s), "healthy", "1.36.1");
    with_cluster(&s, json!({}), "b");
    let r = run(&s, &fake);
    assert_eq!(r.exit_code, exit::ROLLED_BACK, "{r:?}");
    let e = r.error.as_deref().unwrap();
    assert!(
        e.contains("health check kubelet-version failed: node node-a reports kubelet \"v1.36.0\", the image carries kubelet \"1.36.1\" (its dev.kubeslot.version.kubelet annotation)"),
        "{e}"
    );
    assert_eq!(State::load(&s.root).unwrap().active, Some(Slot::Kube1));
    assert!(!api.unschedulable());
    // an image carrying the kubelet the Node reports (a leading v aside)
    image_kubelet(&img_dir(&s), "healthy", "1.36.0");
    with_cluster(&s, json!({}), "c");
    let r = run(&s, &fake);
    assert_eq!(r.outcome, Some(Outcome::Committed), "{r:?}");
}
