//! The drain's pod selection (`cluster::pods`) against kubectl 1.36's own
//! `drain --dry-run=client` on generated pod sets: the same pods evicted,
//! in the same order, the same refusal when kubectl refuses, the same
//! warnings. Then the budget check against the fixture's eviction API.
//!
//! Each set is one node (`n<i>`) with its own namespaces: pods owned by a
//! ReplicaSet, a StatefulSet, a Job, a live or a gone DaemonSet (and one of
//! `extensions/v1beta1`, which kubectl does not count), by no controller or
//! by a non-controlling owner; mirror pods; `emptyDir` and other volumes;
//! pending, running (Ready or not), succeeded and failed pods; pods being
//! deleted for a long while or only just; pods on another node; budgets
//! with `matchLabels`, every `matchExpressions` operator and an empty
//! selector. kubectl's flags vary per set (`--force`, and mostly but not
//! always `--ignore-daemonsets`, `--delete-emptydir-data`, and
//! `--skip-wait-for-delete-timeout`).
//!
//! The seed is fixed (`KUBESLOT_DRAIN_SEED=N` tries another); a mismatch
//! prints the set, both outcomes, kubectl's transcript and the plan.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use kubeslot_activator::cluster::pods::{
    budget_check, read_plan, Action, BudgetCheck, DrainOptions, List, Plan, Pod,
    PodDisruptionBudget,
};
use kubeslot_activator::cluster::Client;
use serde_json::{json, Value};

use fake_apiserver::{admin_request, create_as_admin};

use super::{start, Fixture, CONFIG};

const KUBECTL: &str = "/opt/kubeslot-ci/kubectl/usr/bin/kubectl";
const INSTALL: &str = "ci/lib/kube-clients.sh (or .ci/run; Debian's kubernetes-client)";

fn kubectl_bin() -> PathBuf {
    let p = PathBuf::from(std::env::var("KUBESLOT_KUBECTL").unwrap_or_else(|_| KUBECTL.into()));
    assert!(
        p.is_file(),
        "kubectl 1.36 is not installed at {}: run {INSTALL}",
        p.display()
    );
    p
}

/// kubectl as the admin: (exit code, stdout, stderr).
fn kubectl(fx: &Fixture, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(kubectl_bin())
        // a private HOME: kubectl's discovery cache stays in the test
        .env("HOME", fx.dir.path())
        .env_remove("KUBECONFIG")
        .arg("--kubeconfig")
        .arg(fx.kubeconfig("admin"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn create(fx: &Fixture, obj: &Value) -> Value {
    create_as_admin(&fx.srv, obj).unwrap_or_else(|e| panic!("{e:#}: {obj}"))
}

/// One request as the admin: (status, body).
fn request(fx: &Fixture, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let ct = if method == "PATCH" {
        "application/merge-patch+json"
    } else {
        "application/json"
    };
    admin_request(&fx.srv, method, path, ct, body)
}

fn get_ok(fx: &Fixture, path: &str) -> Value {
    let (code, v) = request(fx, "GET", path, None);
    assert_eq!(code, 200, "GET {path}: {v}");
    v
}

/// A seeded generator (splitmix64): the same seed, the same pod sets.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// 0..n
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// true with probability `percent`/100.
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

const SETS: usize = 200;
const SEED: u64 = 0x6b75_6265_736c_6f74;

/// One generated set: its node, namespaces and kubectl's flags.
struct Set {
    node: String,
    namespaces: [String; 2],
    opts: DrainOptions,
}

fn owner(kind: &str, api: &str, name: &str, controller: Option<bool>) -> Value {
    let mut o =
        json!({"apiVersion": api, "kind": kind, "name": name, "uid": format!("uid-{kind}-{name}")});
    if let Some(c) = controller {
        o["controller"] = json!(c);
    }
    o
}

/// The owner references of one generated pod.
fn owners(rng: &mut Rng) -> Value {
    match rng.below(100) {
        0..=29 => json!([owner("ReplicaSet", "apps/v1", "web", Some(true))]),
        30..=39 => json!([owner("StatefulSet", "apps/v1", "db", Some(true))]),
        40..=44 => json!([owner("Job", "batch/v1", "once", Some(true))]),
        45..=59 => json!([owner("DaemonSet", "apps/v1", "agent", Some(true))]),
        60..=64 => json!([owner("DaemonSet", "apps/v1", "gone", Some(true))]),
        65..=67 => json!([owner(
            "DaemonSet",
            "extensions/v1beta1",
            "agent",
            Some(true)
        )]),
        68..=72 => json!([owner(
            "ReplicaSet",
            "apps/v1",
            "web",
            *rng.pick(&[None, Some(false)])
        )]),
        // the controller second: GetControllerOf finds it
        73..=75 => json!([
            owner("ConfigMap", "v1", "c", None),
            owner("DaemonSet", "apps/v1", "agent", Some(true))
        ]),
        _ => json!([]),
    }
}

fn pod(rng: &mut Rng, ns: &str, name: &str, node: &str) -> Value {
    let mut meta = json!({"name": name, "namespace": ns,
        "labels": {"app": rng.pick(&["web", "db", "cache"])},
        "ownerReferences": owners(rng)});
    if rng.chance(40) {
        meta["labels"]["tier"] = json!(rng.pick(&["front", "back"]));
    }
    if rng.chance(8) {
        meta["annotations"] = json!({"kubernetes.io/config.mirror": "0123abcd"});
        meta["ownerReferences"] = json!([owner("Node", "v1", node, Some(true))]);
    }
    let mut volumes = Vec::new();
    if rng.chance(25) {
        volumes.push(json!({"name": "scratch", "emptyDir": {}}));
    }
    if rng.chance(15) {
        volumes.push(json!({"name": "cfg", "configMap": {"name": "c"}}));
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {"nodeName": node, "volumes": volumes,
            "containers": [{"name": "c", "image": "registry.example/app:1"}]}})
}

fn budget(rng: &mut Rng, ns: &str, name: &str) -> Value {
    let app = *rng.pick(&["web", "db", "cache"]);
    let selector = match rng.below(7) {
        0..=2 => json!({"matchLabels": {"app": app}}),
        3 => json!({"matchExpressions": [{"key": "app", "operator": "In", "values": [app, "db"]}]}),
        4 => json!({"matchLabels": {"app": app},
            "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["front"]}]}),
        5 => json!({"matchExpressions": [
            {"key": "tier", "operator": *rng.pick(&["Exists", "DoesNotExist"])}]}),
        _ => json!({}),
    };
    let mut spec = json!({"selector": selector});
    if rng.chance(80) {
        spec["minAvailable"] = json!(rng.below(3));
    } else {
        spec["maxUnavailable"] = json!(rng.below(2));
    }
    json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

/// Creates set `i` in the fixture; returns it and whether it deleted a
/// pod with a 1 s grace (its `deletionTimestamp` must age).
fn create_set(fx: &Fixture, rng: &mut Rng, i: usize) -> (Set, bool) {
    let node = format!("n{i}");
    let namespaces = [format!("s{i}-a"), format!("s{i}-b")];
    create(
        fx,
        &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
    );
    let mut aged = false;
    for ns in &namespaces {
        create(
            fx,
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        );
        create(
            fx,
            &json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent", "namespace": ns},
            "spec": {"selector": {"matchLabels": {"app": "agent"}}, "template": {"metadata": {"labels": {"app": "agent"}},
                "spec": {"containers": [{"name": "c", "image": "x:1"}]}}}}),
        );
        for b in 0..rng.below(3) {
            create(fx, &budget(rng, ns, &format!("pdb{b}")));
        }
    }
    let count = rng.below(9);
    for k in 0..count + rng.below(3) {
        let ns = rng.pick(&namespaces).clone();
        // the last ones live on another node: never drained here
        let on = if k < count {
            node.clone()
        } else {
            "elsewhere".into()
        };
        let name = format!("p{k}");
        create(fx, &pod(rng, &ns, &name, &on));
        let path = format!("/api/v1/namespaces/{ns}/pods/{name}");
        let phase = *rng.pick(&[
            "Pending",
            "Running",
            "Running",
            "Running",
            "Running",
            "Succeeded",
            "Failed",
        ]);
        if phase != "Pending" {
            let ready = if phase == "Running" && rng.chance(75) {
                "True"
            } else {
                "False"
            };
            let (code, v) = request(
                fx,
                "PATCH",
                &format!("{path}/status"),
                Some(&json!({"status": {"phase": phase,
                    "conditions": [{"type": "Ready", "status": ready}]}})),
            );
            assert_eq!(code, 200, "{v}");
        }
        // finished pods are removed at once (grace 0), others start terminating
        if !matches!(phase, "Succeeded" | "Failed") && rng.chance(15) {
            let grace = *rng.pick(&[1, 3600]);
            aged |= grace == 1;
            let (code, v) = request(
                fx,
                "DELETE",
                &path,
                Some(&json!({"gracePeriodSeconds": grace})),
            );
            assert_eq!(code, 200, "{v}");
        }
    }
    let opts = DrainOptions {
        force: rng.chance(50),
        delete_emptydir_data: rng.chance(85),
        ignore_daemonsets: rng.chance(85),
        skip_wait_for_delete_timeout: *rng.pick(&[0, 0, 0, 1, 100_000]),
    };
    (
        Set {
            node,
            namespaces,
            opts,
        },
        aged,
    )
}

/// What kubectl did: evicted pods (in order) or its refusal, and its
/// warnings (each `<message>: ns/a, ns/b`, sorted: kubectl groups them in a
/// Go map).
#[derive(Debug, PartialEq)]
struct Outcome {
    evicted: Vec<String>,
    refused: BTreeSet<String>,
    warnings: BTreeSet<String>,
}

fn kubectl_drain(fx: &Fixture, set: &Set) -> (Outcome, String) {
    let o = &set.opts;
    let mut args = vec![
        "drain".to_string(),
        set.node.clone(),
        "--dry-run=client".into(),
    ];
    for (on, flag) in [
        (o.force, "--force"),
        (o.ignore_daemonsets, "--ignore-daemonsets"),
        (o.delete_emptydir_data, "--delete-emptydir-data"),
    ] {
        if on {
            args.push(flag.into());
        }
    }
    if o.skip_wait_for_delete_timeout > 0 {
        args.push(format!(
            "--skip-wait-for-delete-timeout={}",
            o.skip_wait_for_delete_timeout
        ));
    }
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, out, err) = kubectl(fx, &argv);
    let transcript = format!(
        "kubectl {} -> {code}\nstdout:\n{out}stderr:\n{err}",
        args.join(" ")
    );
    let evicted = out
        .lines()
        .filter_map(|l| l.strip_prefix("evicting pod "))
        .map(|l| {
            l.strip_suffix(" (dry run)")
                .unwrap_or_else(|| panic!("{transcript}"))
                .to_string()
        })
        .collect();
    let warnings = err
        .lines()
        .filter_map(|l| l.strip_prefix("Warning: "))
        .flat_map(|l| l.split("; ").map(str::to_string))
        .collect();
    let prefix = format!(
        "error: unable to drain node \"{}\" due to error: ",
        set.node
    );
    let mut refused = BTreeSet::new();
    for l in err.lines() {
        if let Some(rest) = l.strip_prefix(&prefix) {
            let rest = rest
                .strip_suffix(", continuing command...")
                .unwrap_or_else(|| panic!("{transcript}"));
            // one error as itself, several as `[e1, e2]` (utilerrors.Aggregate)
            let rest = rest
                .strip_prefix('[')
                .and_then(|r| r.strip_suffix(']'))
                .unwrap_or(rest);
            for (n, e) in rest.split(", cannot delete ").enumerate() {
                let e = if n == 0 {
                    e.to_string()
                } else {
                    format!("cannot delete {e}")
                };
                refused.insert(e);
            }
        }
    }
    assert_eq!(
        code != 0,
        !refused.is_empty(),
        "kubectl's exit code and its refusal disagree: {transcript}"
    );
    if code == 0 {
        assert!(
            out.lines().last() == Some(&format!("node/{} drained (dry run)", set.node)),
            "{transcript}"
        );
    }
    (
        Outcome {
            evicted,
            refused,
            warnings,
        },
        transcript,
    )
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// What the API holds for the set: its node's pods (as kubectl lists
/// them) and its budgets.
fn read_set(fx: &Fixture, set: &Set) -> (Vec<Pod>, Vec<PodDisruptionBudget>) {
    let pods: List<Pod> = serde_json::from_value(get_ok(
        fx,
        &format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{}", set.node),
    ))
    .unwrap();
    let mut pdbs = Vec::new();
    for ns in &set.namespaces {
        let l: List<PodDisruptionBudget> = serde_json::from_value(get_ok(
            fx,
            &format!("/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets"),
        ))
        .unwrap();
        pdbs.extend(l.items);
    }
    (pods.items, pdbs)
}

/// The plan as the activator reads it: through its own API client with
/// the admin's kubeconfig.
fn plan_of(client: &Client, set: &Set) -> Plan {
    read_plan(client, &set.node, &set.opts, now()).unwrap()
}

fn predicted(plan: &Plan) -> Outcome {
    let refused: BTreeSet<String> = plan.refusals().into_iter().collect();
    Outcome {
        evicted: plan
            .evictions()
            .iter()
            .map(|p| format!("{}/{}", p.namespace, p.name))
            .collect(),
        warnings: if refused.is_empty() {
            plan.warnings().into_iter().collect()
        } else {
            BTreeSet::new()
        },
        refused,
    }
}

#[test]
fn drain_selection_matches_kubectl_drain_dry_run_on_generated_pod_sets() {
    let t0 = Instant::now();
    let fx = start(CONFIG);
    let mut rng = Rng(std::env::var("KUBESLOT_DRAIN_SEED").map_or(SEED, |s| s.parse().unwrap()));
    let mut sets = Vec::new();
    let mut aged_since = None;
    for i in 0..SETS {
        let (set, aged) = create_set(&fx, &mut rng, i);
        if aged {
            aged_since = Some(Instant::now());
        }
        sets.push(set);
    }
    let built = t0.elapsed();
    // a pod deleted with a 1 s grace has a deletionTimestamp 1 s ahead;
    // kubectl's `int(now - ts) > 1` holds from 3 s after the delete on
    if let Some(at) = aged_since {
        std::thread::sleep(Duration::from_millis(3200).saturating_sub(at.elapsed()));
    }
    let admin = fx.client("admin");
    let mut mismatches = Vec::new();
    let (mut refused, mut evicted, mut skipped_long) = (0, 0, 0);
    for set in &sets {
        let plan = plan_of(&admin, set);
        let ours = predicted(&plan);
        let (theirs, transcript) = kubectl_drain(&fx, set);
        if ours != theirs {
            mismatches.push(format!(
                "set {} ({:?}):\n ours:    {ours:?}\n kubectl: {theirs:?}\n{transcript}\n plan: {}",
                set.node,
                set.opts,
                serde_json::to_string(&plan).unwrap()
            ));
        }
        refused += usize::from(!theirs.refused.is_empty());
        evicted += theirs.evicted.len();
        skipped_long += plan
            .with(Action::Skip)
            .iter()
            .filter(|p| p.terminating)
            .count();
    }
    println!(
        "{SETS} sets built in {:.1} s, compared in {:.1} s in all: {refused} refused by kubectl, {evicted} pods evicted, {skipped_long} skipped as long deleted",
        built.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    assert!(
        mismatches.is_empty(),
        "{} of {SETS} sets differ from kubectl drain; the first:\n{}",
        mismatches.len(),
        mismatches[..mismatches.len().min(3)].join("\n\n")
    );
    // the generator reached every outcome
    assert!(refused > 20 && refused < SETS - 50, "{refused} refused");
    assert!(skipped_long > 0 && evicted > 200);

    budgets_match_the_eviction_api(&fx, &sets);
}

/// Each pod `plan` would evict, evicted through the fixture's
/// `pods/eviction` one after the other (the plan read anew before each, as
/// budgets change with every eviction): 429 exactly where the plan says a
/// budget allows zero disruptions (or is stale), 500 where several budgets
/// select the pod, 201 otherwise.
fn budgets_match_the_eviction_api(fx: &Fixture, sets: &[Set]) {
    let admin = fx.client("admin");
    let (mut blocked, mut allowed, mut several) = (0, 0, 0);
    for set in sets {
        let first = plan_of(&admin, set);
        for target in first.with(Action::Evict) {
            let (pods, pdbs) = read_set(fx, set);
            let Some(pod) = pods.iter().find(|p| p.metadata.uid == target.uid) else {
                continue;
            };
            let check = budget_check(pod, &pdbs);
            let (ns, name) = (&pod.metadata.namespace, &pod.metadata.name);
            let (code, v) = request(
                fx,
                "POST",
                &format!("/api/v1/namespaces/{ns}/pods/{name}/eviction"),
                Some(&json!({"apiVersion": "policy/v1", "kind": "Eviction",
                    "metadata": {"name": name, "namespace": ns}})),
            );
            let expected = match &check {
                BudgetCheck::Blocks { .. } | BudgetCheck::Stale { .. } => 429,
                BudgetCheck::Several { .. } => 500,
                _ => 201,
            };
            assert_eq!(
                code, expected,
                "evicting {ns}/{name}: the plan said {check:?}, the API answered {v}"
            );
            match code {
                429 => blocked += 1,
                500 => several += 1,
                _ => allowed += 1,
            }
        }
    }
    println!("evictions: {allowed} allowed, {blocked} blocked by a budget, {several} with several budgets");
    assert!(
        blocked > 5 && allowed > 50,
        "{blocked} blocked, {allowed} allowed"
    );
}

/// The permissions the drain's reading needs beyond the node authorizer:
/// as the node itself (`system:node:node-a`), the Node and its pods are
/// readable, the budgets are not (403, named); with a grant to list
/// `poddisruptionbudgets` and get `daemonsets` the same read succeeds.
#[test]
fn reading_the_drain_as_the_node_needs_budgets_and_daemonsets_granted() {
    let grants = |with: bool| {
        let grants = if with {
            r#"[{"subjects": [{"kind": "Group", "name": "system:nodes"}],
                "rules": [{"verbs": ["list"], "api_groups": ["policy"], "resources": ["poddisruptionbudgets"]},
                          {"verbs": ["get"], "api_groups": ["apps"], "resources": ["daemonsets"]}]}]"#
        } else {
            "[]"
        };
        CONFIG.replacen(
            "\"remove_pods_after_grace\"",
            &format!("\"grants\": {grants},\n  \"remove_pods_after_grace\""),
            1,
        )
    };
    for with in [false, true] {
        let fx = start(&grants(with));
        fx.node("node-a");
        create(
            &fx,
            &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "agent", "namespace": "default",
                "ownerReferences": [owner("DaemonSet", "apps/v1", "agent", Some(true))]},
                "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "x:1"}]}}),
        );
        let got = read_plan(
            &fx.client("node-a"),
            "node-a",
            &DrainOptions::default(),
            now(),
        );
        if with {
            let plan = got.unwrap();
            // the DaemonSet was read: gone, so the drain is refused
            assert_eq!(
                plan.refusals(),
                ["cannot delete daemonsets.apps \"agent\" not found: default/agent"]
            );
        } else {
            let e = format!("{:#}", got.unwrap_err());
            assert!(
                e.contains("listing the disruption budgets of namespace default")
                    && e.contains("403 Forbidden"),
                "{e}"
            );
        }
    }
}
