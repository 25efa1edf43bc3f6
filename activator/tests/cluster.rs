//! The cluster client (`kubeslot_activator::cluster`) against the fixture
//! API server (in-process, a free port): kubeconfigs as the fixture writes
//! them, the verbs, and the errors callers tell apart.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fake_apiserver::api::Server;
use fake_apiserver::{admin_request, config::Config, create_as_admin};
use kubeslot_activator::cluster::{path, Client, Kubeconfig, PatchType};
use serde_json::{json, Value};

mod drain_selection;

pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub srv: Arc<Server>,
    pub url: String,
}

pub const CONFIG: &str = r#"{
  "client_certs": [
    {"name": "admin", "user": "kubernetes-admin", "groups": ["system:masters"]},
    {"name": "node-a", "user": "system:node:node-a", "groups": ["system:nodes"]}
  ],
  "static_tokens": [{"token": "t0k3n", "user": "deployer", "groups": ["ops"]}],
  "remove_pods_after_grace": false
}"#;

pub fn start(config: &str) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let config = Config::parse(config, "test config").unwrap();
    let p = fake_apiserver::prepare("127.0.0.1:0", &dir.path().join("pki"), config).unwrap();
    let (srv, url) = fake_apiserver::spawn(p);
    Fixture { dir, srv, url }
}

impl Fixture {
    pub fn kubeconfig(&self, name: &str) -> PathBuf {
        self.dir
            .path()
            .join("pki")
            .join(format!("{name}.kubeconfig"))
    }

    pub fn client(&self, name: &str) -> Client {
        let kc = Kubeconfig::load(&self.kubeconfig(name), &|p: &Path| p.to_path_buf()).unwrap();
        Client::new(&kc, Duration::from_secs(10)).unwrap()
    }

    pub fn create(&self, obj: Value) -> Value {
        create_as_admin(&self.srv, &obj).unwrap()
    }

    pub fn get(&self, path: &str) -> (u16, Value) {
        admin_request(&self.srv, "GET", path, "", None)
    }

    pub fn node(&self, name: &str) {
        self.create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                "nodeInfo": {"kubeletVersion": "v1.36.0"}}}));
    }

    pub fn pod(&self, name: &str, node: &str, labels: Value) {
        self.create(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "registry.example/app:1"}]}}));
    }

    pub fn set_ready(&self, name: &str) {
        let (code, v) = admin_request(
            &self.srv,
            "PATCH",
            &format!("/api/v1/namespaces/default/pods/{name}/status"),
            "application/merge-patch+json",
            Some(
                &json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "c", "ready": true, "restartCount": 0, "image": "registry.example/app:1", "imageID": "", "state": {"running": {}}}]}}),
            ),
        );
        assert_eq!(code, 200, "{v}");
    }
}

#[test]
fn verbs_and_the_errors_callers_tell_apart() {
    let fx = start(CONFIG);
    let admin = fx.client("admin");
    assert_eq!(admin.server(), fx.url);
    let cms = path("v1", Some("default"), "configmaps", None);
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "c1", "labels": {"app": "x"}}, "data": {"a": "1"}});
    let made = admin.create(&cms, &cm).unwrap();
    assert!(made["metadata"]["uid"].is_string(), "{made}");
    // AlreadyExists is a 409 with its reason
    let e = admin.create(&cms, &cm).unwrap_err();
    assert!(e.is_conflict(), "{e}");
    assert_eq!(e.status().unwrap().reason, "AlreadyExists");
    assert_eq!(
        e.to_string(),
        format!("POST {cms}: 409 AlreadyExists: configmaps \"c1\" already exists")
    );
    for i in 2..=5 {
        admin
            .create(
                &cms,
                &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("c{i}"), "labels": {"app": if i % 2 == 0 { "y" } else { "x" }}}}),
            )
            .unwrap();
    }
    // selectors are encoded; lists are followed page by page
    let names = |items: Vec<Value>| -> Vec<String> {
        items
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        names(
            admin
                .list(&cms, &[("labelSelector", "app in (x)")])
                .unwrap()
        ),
        ["c1", "c3", "c5"]
    );
    let one = path("v1", Some("default"), "configmaps", Some("c1"));
    let merged = admin
        .patch(&one, PatchType::Merge, &json!({"data": {"b": "2"}}))
        .unwrap();
    assert_eq!(merged["data"], json!({"a": "1", "b": "2"}));
    let strategic = admin
        .patch(
            &one,
            PatchType::Strategic,
            &json!({"metadata": {"annotations": {"k": "v"}}}),
        )
        .unwrap();
    assert_eq!(strategic["metadata"]["annotations"]["k"], "v");
    // a stale resourceVersion in a patch: 409 Conflict
    let e = admin
        .patch(
            &one,
            PatchType::Merge,
            &json!({"metadata": {"resourceVersion": "1"}, "data": {"c": "3"}}),
        )
        .unwrap_err();
    assert!(e.is_conflict(), "{e}");
    assert_eq!(e.status().unwrap().reason, "Conflict");
    admin.delete(&one, None).unwrap();
    let e = admin.get(&one).unwrap_err();
    assert!(e.is_not_found() && !e.is_unreachable(), "{e}");
    assert_eq!(e.status().unwrap().details["name"], "c1");
    assert_eq!(e.status().unwrap().message, "configmaps \"c1\" not found");
}

#[test]
fn the_node_s_own_certificate_and_its_authorizer() {
    let fx = start(CONFIG);
    fx.node("node-a");
    fx.node("node-b");
    let node = fx.client("node-a");
    let me = node
        .get(&path("v1", None, "nodes", Some("node-a")))
        .unwrap();
    assert_eq!(me["metadata"]["name"], "node-a");
    let e = node
        .get(&path("v1", None, "nodes", Some("node-b")))
        .unwrap_err();
    assert!(e.is_forbidden(), "{e}");
    assert_eq!(e.status().unwrap().reason, "Forbidden");
    assert!(e.to_string().contains("system:node:node-a"), "{e}");
}

#[test]
fn a_budget_s_429_and_a_gone_pod_s_404() {
    let fx = start(CONFIG);
    fx.node("node-a");
    fx.pod("web-1", "node-a", json!({"app": "web"}));
    fx.set_ready("web-1");
    fx.create(json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web", "namespace": "default"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "web"}}}}));
    let node = fx.client("node-a");
    let eviction = |name: &str| {
        json!({"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": name, "namespace": "default"}})
    };
    let pods = path("v1", Some("default"), "pods", None);
    let e = node
        .create(&format!("{pods}/web-1/eviction"), &eviction("web-1"))
        .unwrap_err();
    assert!(e.is_too_many_requests(), "{e}");
    let s = e.status().unwrap();
    assert_eq!(s.reason, "TooManyRequests");
    assert_eq!(
        s.message,
        "Cannot evict pod as it would violate the pod's disruption budget."
    );
    assert!(
        s.details["causes"][0]["message"]
            .as_str()
            .unwrap()
            .starts_with("The disruption budget web needs "),
        "{}",
        s.details
    );
    // the budget held: the pod is there and not terminating
    let (code, p) = fx.get(&format!("{pods}/web-1"));
    assert_eq!(code, 200);
    assert!(p["metadata"]["deletionTimestamp"].is_null(), "{p}");
    let e = node
        .create(&format!("{pods}/gone/eviction"), &eviction("gone"))
        .unwrap_err();
    assert!(e.is_not_found(), "{e}");
    // the node lists its own pods with the field selector it is allowed
    let mine = node
        .list(
            &pods.replace("/namespaces/default", ""),
            &[("fieldSelector", "spec.nodeName=node-a")],
        )
        .unwrap();
    assert_eq!(mine.len(), 1);
}

#[test]
fn a_bearer_token_from_an_exec_plugin() {
    let fx = start(CONFIG);
    let dir = fx.dir.path();
    let plugin = dir.join("cred.sh");
    std::fs::write(
        &plugin,
        "#!/bin/sh\necho \"$KUBERNETES_EXEC_INFO\" | grep -q ExecCredential || exit 3\nprintf '{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{\"token\":\"%s\"}}' \"$TOKEN\"\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let kc = dir.join("exec.kubeconfig");
    std::fs::write(
        &kc,
        format!(
            "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority: pki/ca.crt\n    server: {}\n  name: c\ncontexts:\n- context:\n    cluster: c\n    user: u\n  name: x\ncurrent-context: x\nusers:\n- name: u\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: {}\n      env:\n      - name: TOKEN\n        value: t0k3n\n",
            fx.url,
            plugin.display()
        ),
    )
    .unwrap();
    let k = Kubeconfig::load(&kc, &|p: &Path| p.to_path_buf()).unwrap();
    let c = Client::new(&k, Duration::from_secs(10)).unwrap();
    let who = c
        .create(
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}),
        )
        .unwrap();
    assert_eq!(who["status"]["userInfo"]["username"], "deployer");
}

#[test]
fn no_api_is_a_transport_error_and_a_wrong_ca_too() {
    let fx = start(CONFIG);
    // a port nobody listens on
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    let mut k = Kubeconfig::load(&fx.kubeconfig("admin"), &|p: &Path| p.to_path_buf()).unwrap();
    k.server = format!("https://127.0.0.1:{port}");
    let c = Client::new(&k, Duration::from_secs(5)).unwrap();
    let e = c.get("/api/v1/nodes").unwrap_err();
    assert!(e.is_unreachable() && e.code().is_none(), "{e}");
    // the public roots do not vouch for the fixture's CA
    let mut k = Kubeconfig::load(&fx.kubeconfig("admin"), &|p: &Path| p.to_path_buf()).unwrap();
    k.ca_pem = None;
    let e = Client::new(&k, Duration::from_secs(5))
        .unwrap()
        .get("/api/v1/nodes")
        .unwrap_err();
    assert!(e.is_unreachable(), "{e}");
}
