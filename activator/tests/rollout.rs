//! The fleet rollout's limit and halt (`kubeslot_activator::rollout`)
//! against the fixture API server over HTTPS, with the node authorizer on
//! and only the permissions `deploy/rollout.yaml` grants: each node takes
//! leases with its rollout identity (group `kubeslot:rollout`), as a fleet
//! would, through the activator's own API client (`rollout::api`).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use fake_apiserver::api::Server;
use fake_apiserver::config::Config;
use fake_apiserver::{admin_request, create_as_admin};
use kubeslot_activator::cluster::{Client, Kubeconfig};
use kubeslot_activator::rollout::api::ClusterApi;
use kubeslot_activator::rollout::halt::{LAST_DIGEST, LAST_RESULT};
use kubeslot_activator::rollout::lease::{lease_from, Acquired, Lease, LeaseError, MaxUnavailable};
use kubeslot_activator::rollout::{admit, Admission, Settings, Waiting};
use serde_json::{json, Value};

const NS: &str = "kubeslot-system";
const MANIFEST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/rollout.yaml");

/// The fixture's grants for the manifest's Roles and bindings (RBAC's
/// meaning: a RoleBinding grants its Role's rules in its namespace, a
/// ClusterRoleBinding its ClusterRole's everywhere).
fn grants_of(manifest: &str) -> Vec<Value> {
    let docs: Vec<Value> = serde_yaml::Deserializer::from_str(manifest)
        .map(|d| serde_json::to_value(serde_yaml::Value::deserialize(d).unwrap()).unwrap())
        .collect();
    let role = |kind: &str, name: &str, ns: Option<&str>| {
        docs.iter()
            .find(|d| {
                d["kind"] == kind
                    && d["metadata"]["name"] == name
                    && d["metadata"]["namespace"].as_str() == ns
            })
            .unwrap_or_else(|| panic!("{MANIFEST}: {kind} {name} missing"))
            .clone()
    };
    let mut grants = Vec::new();
    for d in &docs {
        let (ns, role) = match d["kind"].as_str() {
            Some("RoleBinding") => {
                let ns = d["metadata"]["namespace"].as_str().unwrap();
                (
                    Some(ns),
                    role("Role", d["roleRef"]["name"].as_str().unwrap(), Some(ns)),
                )
            }
            Some("ClusterRoleBinding") => (
                None,
                role("ClusterRole", d["roleRef"]["name"].as_str().unwrap(), None),
            ),
            _ => continue,
        };
        let rules: Vec<Value> = role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                json!({
                    "verbs": r["verbs"],
                    "api_groups": r["apiGroups"],
                    "resources": r["resources"],
                    "resource_names": r.get("resourceNames").cloned().unwrap_or(json!([])),
                })
            })
            .collect();
        let subjects: Vec<Value> = d["subjects"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| json!({"kind": s["kind"], "name": s["name"]}))
            .collect();
        grants.push(json!({
            "subjects": subjects,
            "rules": rules,
            "namespaces": ns.map(|n| vec![n]).unwrap_or_default(),
        }));
    }
    grants
}

use serde::Deserialize as _;

pub struct Fleet {
    dir: tempfile::TempDir,
    pub srv: Arc<Server>,
}

/// A fixture with `nodes` (labelled `pool=gpu`), each with a node identity
/// (`node-<n>`) and a rollout identity (`rollout-<n>`), and `grants`.
pub fn fleet(nodes: &[String], grants: Vec<Value>) -> Fleet {
    let mut certs =
        vec![json!({"name": "admin", "user": "kubernetes-admin", "groups": ["system:masters"]})];
    for n in nodes {
        certs.push(json!({"name": format!("node-{n}"), "user": format!("system:node:{n}"), "groups": ["system:nodes"]}));
        certs.push(json!({"name": format!("rollout-{n}"), "user": format!("kubeslot:rollout:{n}"), "groups": ["kubeslot:rollout"]}));
    }
    let config = json!({
        "client_certs": certs,
        "grants": grants,
        "objects": [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}],
    });
    let dir = tempfile::tempdir().unwrap();
    let config = Config::parse(&config.to_string(), "rollout test config").unwrap();
    let p = fake_apiserver::prepare("127.0.0.1:0", &dir.path().join("pki"), config).unwrap();
    let (srv, _url) = fake_apiserver::spawn(p);
    for n in nodes {
        create_as_admin(
            &srv,
            &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n, "labels": {"pool": "gpu"}}}),
        )
        .unwrap();
    }
    Fleet { dir, srv }
}

impl Fleet {
    /// The kubeconfig of `who` (`rollout-<n>`, `node-<n>`).
    pub fn kubeconfig(&self, who: &str) -> std::path::PathBuf {
        self.dir
            .path()
            .join("pki")
            .join(format!("{who}.kubeconfig"))
    }

    /// The activator's API client as `who` (`rollout-<n>`, `node-<n>`).
    pub fn api(&self, who: &str) -> ClusterApi {
        let kc = Kubeconfig::load(&self.kubeconfig(who), &|p: &Path| p.to_path_buf()).unwrap();
        ClusterApi::new(Client::new(&kc, Duration::from_secs(10)).unwrap(), NS)
    }

    pub fn admin(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let ct = if method == "PATCH" {
            "application/merge-patch+json"
        } else {
            "application/json"
        };
        admin_request(&self.srv, method, path, ct, body)
    }

    /// Writes the annotations a node leaves after a run.
    pub fn report(&self, node: &str, digest: &str, result: &str) {
        let (code, v) = self.admin(
            "PATCH",
            &format!("/api/v1/nodes/{node}"),
            Some(&json!({"metadata": {"annotations": {LAST_DIGEST: digest, LAST_RESULT: result}}})),
        );
        assert_eq!(code, 200, "{v}");
    }

    pub fn pause(&self, paused: &str) {
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "kubeslot-pause", "namespace": NS},
            "data": {"paused": paused, "reason": "investigating INC-7"}});
        let path = format!("/api/v1/namespaces/{NS}/configmaps");
        let (code, _) = self.admin("POST", &path, Some(&cm));
        if code == 409 {
            let (code, v) = self.admin("PUT", &format!("{path}/kubeslot-pause"), Some(&cm));
            assert_eq!(code, 200, "{v}");
        }
    }

    pub fn lease(&self, name: &str) -> Value {
        self.admin(
            "GET",
            &format!("/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{name}"),
            None,
        )
        .1
    }
}

pub fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("n{i:03}")).collect()
}

pub fn manifest_grants() -> Vec<Value> {
    grants_of(&std::fs::read_to_string(Path::new(MANIFEST)).unwrap())
}

const NOW: i64 = 1_796_000_000_000_000;
const DIGEST: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

fn start(f: &Fleet, s: &Settings, node: &str, now: i64) -> Result<Admission, String> {
    admit(&mut f.api(&format!("rollout-{node}")), s, node, DIGEST, now)
}

fn lease_of(a: Admission) -> Lease {
    match a {
        Admission::Start(l) => l,
        Admission::Wait(w) => panic!("expected a lease, waiting: {w}"),
    }
}

#[test]
fn limit_admits_max_unavailable_nodes_then_the_next_after_a_release() {
    let nodes = names(4);
    let f = fleet(&nodes, manifest_grants());
    let s = Settings::new(NS, MaxUnavailable::Count(2));
    let a = lease_of(start(&f, &s, "n000", NOW).unwrap());
    let b = lease_of(start(&f, &s, "n001", NOW).unwrap());
    assert_ne!(a.name, b.name);
    let Admission::Wait(w) = start(&f, &s, "n002", NOW).unwrap() else {
        panic!("a third node started with max_unavailable 2");
    };
    let text = w.to_string();
    assert!(
        text.starts_with("waiting for a rollout lease: all 2 held (max_unavailable)"),
        "{text}"
    );
    assert!(
        text.contains("by n000 until") && text.contains("by n001 until"),
        "{text}"
    );
    // the same node asking again keeps its lease (a run killed and rerun)
    assert_eq!(
        lease_of(start(&f, &s, "n000", NOW + 1).unwrap()).name,
        a.name
    );
    s.limit("n000", 0)
        .release(&mut f.api("rollout-n000"), &a)
        .unwrap();
    assert_eq!(f.lease(&a.name)["spec"]["holderIdentity"], Value::Null);
    let c = lease_of(start(&f, &s, "n002", NOW + 2).unwrap());
    assert_eq!(c.name, a.name);
    assert_eq!(f.lease(&a.name)["spec"]["holderIdentity"], "n002");
}

/// 24 nodes race for 3 leases twice: for leases not yet created (409
/// AlreadyExists) and for released ones (409 Conflict on a stale
/// resourceVersion).
#[test]
fn racing_nodes_never_hold_more_leases_than_the_limit() {
    let nodes = names(24);
    let f = Arc::new(fleet(&nodes, manifest_grants()));
    let s = Settings::new(NS, MaxUnavailable::Count(3));
    race(&f, &s, &nodes);
    for i in 0..3 {
        let l = lease_from(&f.lease(&format!("kubeslot-rollout-{i}")));
        let holder = l.holder.clone().unwrap();
        s.limit(&holder, 0)
            .release(&mut f.api(&format!("rollout-{holder}")), &l)
            .unwrap();
    }
    race(&f, &s, &nodes);
}

fn race(f: &Arc<Fleet>, s: &Settings, nodes: &[String]) {
    let got: Vec<bool> = std::thread::scope(|scope| {
        let handles: Vec<_> = nodes
            .iter()
            .map(|n| {
                let (f, s) = (f.clone(), s.clone());
                scope.spawn(move || matches!(start(&f, &s, n, NOW).unwrap(), Admission::Start(_)))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(got.iter().filter(|g| **g).count(), 3, "{got:?}");
    let holders: Vec<Value> = (0..3)
        .map(|i| f.lease(&format!("kubeslot-rollout-{i}"))["spec"]["holderIdentity"].clone())
        .collect();
    assert!(holders.iter().all(Value::is_string), "{holders:?}");
}

#[test]
fn a_silent_holder_is_replaced_after_the_lease_expires_and_learns_it_lost() {
    let nodes = names(2);
    let f = fleet(&nodes, manifest_grants());
    let s = Settings::new(NS, MaxUnavailable::Count(1));
    let a = lease_of(start(&f, &s, "n000", NOW).unwrap());
    // within the duration: n001 waits
    assert!(matches!(
        start(&f, &s, "n001", NOW + 59_000_000).unwrap(),
        Admission::Wait(_)
    ));
    // the holder renews: the wait starts over
    let a = s
        .limit("n000", 0)
        .renew(&mut f.api("rollout-n000"), &a, NOW + 59_000_000)
        .unwrap();
    assert!(matches!(
        start(&f, &s, "n001", NOW + 100_000_000).unwrap(),
        Admission::Wait(_)
    ));
    // silent for longer than 60 s: taken over
    let b = lease_of(start(&f, &s, "n001", NOW + 120_000_000).unwrap());
    assert_eq!(b.name, a.name);
    assert_eq!(b.transitions, a.transitions + 1);
    let err = s
        .limit("n000", 0)
        .renew(&mut f.api("rollout-n000"), &a, NOW + 121_000_000)
        .unwrap_err();
    assert!(matches!(err, LeaseError::Lost(_)), "{err}");
    assert_eq!(
        err.to_string(),
        "lease kubeslot-rollout-0 was taken over by n001 (not renewed within 60 s)"
    );
    // its late release leaves the new holder alone
    s.limit("n000", 0)
        .release(&mut f.api("rollout-n000"), &a)
        .unwrap();
    assert_eq!(f.lease(&a.name)["spec"]["holderIdentity"], "n001");
}

#[test]
fn a_percentage_counts_the_nodes_the_selector_matches() {
    let nodes = names(10);
    let f = fleet(&nodes, manifest_grants());
    let mut s = Settings::new(NS, "30%".parse().unwrap());
    s.node_selector = "pool=gpu".into();
    let started = nodes
        .iter()
        .filter(|n| matches!(start(&f, &s, n, NOW).unwrap(), Admission::Start(_)))
        .count();
    assert_eq!(started, 3);
    s.node_selector = "pool=cpu".into(); // matches none: still one at a time
    assert_eq!(s.limit("n000", 0).slots, 1);
}

#[test]
fn the_pause_switch_and_rollbacks_of_the_digest_halt_new_starts() {
    let nodes = names(4);
    let f = fleet(&nodes, manifest_grants());
    let mut s = Settings::new(NS, MaxUnavailable::Count(4));
    s.halt_after = 2;
    f.pause("true");
    let Admission::Wait(w) = start(&f, &s, "n000", NOW).unwrap() else {
        panic!("started while paused");
    };
    assert_eq!(
        w.to_string(),
        "the rollout is paused (ConfigMap kubeslot-pause has paused: \"true\"): investigating INC-7"
    );
    f.pause("false");
    f.report("n001", DIGEST, "rolled-back: the health gate failed");
    f.report(
        "n002",
        "sha256:other",
        "rolled-back: the health gate failed",
    );
    f.report("n003", DIGEST, "committed");
    let l = lease_of(start(&f, &s, "n000", NOW).unwrap());
    s.limit("n000", 4)
        .release(&mut f.api("rollout-n000"), &l)
        .unwrap();
    f.report("n003", DIGEST, "rolled-back: Node not Ready");
    let Admission::Wait(Waiting::Halted(h)) = start(&f, &s, "n000", NOW).unwrap() else {
        panic!("started after two rollbacks of the digest");
    };
    assert_eq!(
        h.to_string(),
        format!("the rollout of {DIGEST} is halted: 2 node(s) rolled it back (n001, n003), halt_after is 2")
    );
    assert!(f.lease("kubeslot-rollout-0")["spec"]["holderIdentity"].is_null());
}

#[test]
fn deploy_manifest_node_credentials_cannot_take_a_rollout_lease() {
    let nodes = names(1);
    let f = fleet(&nodes, manifest_grants());
    let s = Settings::new(NS, MaxUnavailable::Count(1));
    let err = admit(&mut f.api("node-n000"), &s, "n000", DIGEST, NOW).unwrap_err();
    assert!(err.contains("403"), "{err}");
}

/// Each rule of deploy/rollout.yaml is needed: without any one verb the
/// rollout fails to take, renew or release, or to read the halt's inputs.
#[test]
fn deploy_manifest_grants_what_the_rollout_needs_and_each_rule_is_needed() {
    let full = manifest_grants();
    let run = |grants: Vec<Value>| -> Result<(), String> {
        let nodes = names(2);
        let f = fleet(&nodes, grants);
        let mut s = Settings::new(NS, "50%".parse().unwrap());
        s.halt_after = 1;
        let mut api = f.api("rollout-n000");
        let Admission::Start(l) = admit(&mut api, &s, "n000", DIGEST, NOW)? else {
            return Err("waited".into());
        };
        let limit = s.limit("n000", 2);
        let l = limit
            .renew(&mut api, &l, NOW + 1)
            .map_err(|e| e.to_string())?;
        limit.release(&mut api, &l).map_err(|e| e.to_string())?;
        // the lease exists now: taking it again reads and updates it
        let Admission::Start(_) = admit(&mut f.api("rollout-n001"), &s, "n001", DIGEST, NOW + 2)?
        else {
            return Err("n001 waited".into());
        };
        Ok(())
    };
    run(full.clone()).unwrap();
    for (g, grant) in full.iter().enumerate() {
        for (r, rule) in grant["rules"].as_array().unwrap().iter().enumerate() {
            for (v, verb) in rule["verbs"].as_array().unwrap().iter().enumerate() {
                let mut less = full.clone();
                less[g]["rules"][r]["verbs"]
                    .as_array_mut()
                    .unwrap()
                    .remove(v);
                let err = run(less).expect_err(&format!(
                    "the rollout worked without {verb} on {}",
                    rule["resources"]
                ));
                assert!(err.contains("403"), "{verb} {}: {err}", rule["resources"]);
            }
        }
    }
}

#[test]
fn acquire_tries_every_lease_once_when_all_are_held() {
    let nodes = names(3);
    let f = fleet(&nodes, manifest_grants());
    let s = Settings::new(NS, MaxUnavailable::Count(2));
    lease_of(start(&f, &s, "n000", NOW).unwrap());
    lease_of(start(&f, &s, "n001", NOW).unwrap());
    let r = s
        .limit("n002", 0)
        .acquire(&mut f.api("rollout-n002"), NOW)
        .unwrap();
    let Acquired::Full(held) = r else {
        panic!("{r:?}")
    };
    let mut who: Vec<_> = held.iter().map(|h| h.holder.clone()).collect();
    who.sort();
    assert_eq!(who, ["n000", "n001"]);
}

/// The renewer keeps a lease held past its duration while the node works,
/// and stopping it hands back the lease to release; without renewals the
/// same wait lets another node take over.
#[test]
fn the_renewer_keeps_the_lease_while_the_node_works() {
    use kubeslot_activator::rollout::{now_us, Renewer};
    let nodes = names(2);
    let f = fleet(&nodes, manifest_grants());
    let mut s = Settings::new(NS, MaxUnavailable::Count(1));
    s.lease_duration_s = 1;
    let limit = s.limit("n000", 0);
    let l = lease_of(start(&f, &s, "n000", now_us()).unwrap());
    let renewer = Renewer::start(Box::new(f.api("rollout-n000")), limit.clone(), l);
    std::thread::sleep(Duration::from_millis(1600));
    let other = start(&f, &s, "n001", now_us()).unwrap();
    assert!(matches!(other, Admission::Wait(_)), "{other:?}");
    let l = renewer.stop().unwrap();
    assert!(l.renew_us > NOW);
    // silent for longer than the duration: taken over
    std::thread::sleep(Duration::from_millis(1200));
    lease_of(start(&f, &s, "n001", now_us()).unwrap());
    limit.release(&mut f.api("rollout-n000"), &l).unwrap();
    assert_eq!(f.lease(&l.name)["spec"]["holderIdentity"], "n001");
}

/// `source.follow.annotation`: a node reads its own Node's
/// `kubeslot.io/desired-image` with its node credentials; another node's
/// Node is refused by the node authorizer.
#[test]
fn a_node_reads_its_desired_image_with_its_own_credentials() {
    use kubeslot_activator::rollout::desired::desired_image;
    let nodes = names(2);
    let f = fleet(&nodes, manifest_grants());
    let client = |who: &str| {
        let kc = f.dir.path().join("pki").join(format!("{who}.kubeconfig"));
        let kc = Kubeconfig::load(&kc, &|p: &Path| p.to_path_buf()).unwrap();
        Client::new(&kc, Duration::from_secs(10)).unwrap()
    };
    let own = client("node-n000");
    assert_eq!(desired_image(&own, "n000", "kubeslot.io/").unwrap(), None);
    let (code, v) = f.admin(
        "PATCH",
        "/api/v1/nodes/n000",
        Some(&json!({"metadata": {"annotations": {"kubeslot.io/desired-image": "ghcr.io/org/kubeslot/ubuntu2404:1.36.4"}}})),
    );
    assert_eq!(code, 200, "{v}");
    assert_eq!(
        desired_image(&own, "n000", "kubeslot.io/")
            .unwrap()
            .as_deref(),
        Some("ghcr.io/org/kubeslot/ubuntu2404:1.36.4")
    );
    let err = desired_image(&client("node-n001"), "n000", "kubeslot.io/").unwrap_err();
    assert!(
        err.starts_with("reading kubeslot.io/desired-image of Node n000: ") && err.contains("403"),
        "{err}"
    );
}
