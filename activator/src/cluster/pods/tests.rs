//! `decide` rule by rule, selectors and the budget check, the plan's text.

use super::*;
use serde_json::json;

fn pod(v: serde_json::Value) -> Pod {
    serde_json::from_value(v).unwrap()
}

fn exists(_: &str, _: &str) -> DaemonSetLookup {
    DaemonSetLookup::Exists
}

fn gone(_: &str, _: &str) -> DaemonSetLookup {
    DaemonSetLookup::NotFound
}

const NOW: i64 = 1_800_000_000;

fn ds_owner() -> serde_json::Value {
    json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "cni", "uid": "u", "controller": true}])
}

#[test]
fn kubectl_defaults_skip_daemonsets_and_mirrors_and_evict_emptydir() {
    let o = DrainOptions::default();
    let ds = pod(json!({"metadata": {"name": "a", "ownerReferences": ds_owner()}}));
    assert_eq!(
        decide(&ds, &o, NOW, &exists),
        Verdict::new(
            Action::Skip,
            Why::DaemonSet {
                daemonset: "cni".into()
            }
        )
    );
    let mirror = pod(json!({"metadata": {"name": "m", "annotations": {MIRROR_ANNOTATION: "x"}}}));
    assert_eq!(decide(&mirror, &o, NOW, &exists).action, Action::Skip);
    let rs = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "r", "uid": "u", "controller": true}]);
    let local = pod(json!({"metadata": {"name": "l", "ownerReferences": rs},
        "spec": {"volumes": [{"name": "v", "emptyDir": {}}]}}));
    assert_eq!(
        decide(&local, &o, NOW, &exists),
        Verdict::new(Action::Evict, Why::LocalStorage)
    );
    let strict = DrainOptions {
        delete_emptydir_data: false,
        ..o
    };
    assert_eq!(decide(&local, &strict, NOW, &exists).action, Action::Refuse);
}

#[test]
fn unmanaged_pods_need_force_unless_finished() {
    let o = DrainOptions::default();
    let bare = pod(json!({"metadata": {"name": "b", "ownerReferences": null}}));
    assert_eq!(
        decide(&bare, &o, NOW, &exists),
        Verdict::new(Action::Refuse, Why::Unmanaged)
    );
    let forced = DrainOptions { force: true, ..o };
    assert_eq!(decide(&bare, &forced, NOW, &exists).action, Action::Evict);
    // an owner that is not the controller is no controller
    let owned = pod(json!({"metadata": {"name": "b", "ownerReferences":
        [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "r", "uid": "u"}]}}));
    assert_eq!(decide(&owned, &o, NOW, &exists).action, Action::Refuse);
    let done = pod(
        json!({"metadata": {"name": "b"}, "status": {"phase": "Failed"},
        "spec": {"volumes": [{"name": "v", "emptyDir": {}}]}}),
    );
    assert_eq!(
        decide(
            &done,
            &DrainOptions {
                delete_emptydir_data: false,
                ..o
            },
            NOW,
            &exists
        ),
        Verdict::new(Action::Evict, Why::Finished)
    );
}

#[test]
fn daemonset_pods_by_their_daemonset() {
    let o = DrainOptions::default();
    let p = pod(json!({"metadata": {"name": "a", "ownerReferences": ds_owner()}}));
    let v = decide(&p, &o, NOW, &gone);
    assert_eq!(v.action, Action::Refuse);
    assert_eq!(v.refusal().unwrap(), "daemonsets.apps \"cni\" not found");
    let forced = DrainOptions { force: true, ..o };
    assert_eq!(decide(&p, &forced, NOW, &gone).action, Action::Evict);
    let strict = DrainOptions {
        ignore_daemonsets: false,
        ..o
    };
    assert_eq!(
        decide(&p, &strict, NOW, &exists).refusal().unwrap(),
        DAEMONSET_FATAL
    );
    // a finished DaemonSet pod goes, its DaemonSet unread
    let done = pod(
        json!({"metadata": {"name": "a", "ownerReferences": ds_owner()},
        "status": {"phase": "Succeeded"}}),
    );
    assert_eq!(
        decide(&done, &strict, NOW, &|_, _| unreachable!()).action,
        Action::Evict
    );
    // extensions/v1beta1 is not a DaemonSet to kubectl
    let old = pod(json!({"metadata": {"name": "a", "ownerReferences":
        [{"apiVersion": "extensions/v1beta1", "kind": "DaemonSet", "name": "x", "uid": "u", "controller": true}]}}));
    assert_eq!(
        decide(&old, &strict, NOW, &|_, _| unreachable!()),
        Verdict::new(Action::Evict, Why::Controlled)
    );
}

#[test]
fn long_deleted_pods_are_skipped_only_with_the_timeout() {
    let p = pod(json!({"metadata": {"name": "t", "ownerReferences": null,
        "deletionTimestamp": kubeslot_image::time::rfc3339_seconds(NOW as u64 - 10)}}));
    let o = DrainOptions::default();
    assert_eq!(decide(&p, &o, NOW, &exists).action, Action::Refuse);
    let skip = DrainOptions {
        skip_wait_for_delete_timeout: 9,
        ..o
    };
    assert_eq!(decide(&p, &skip, NOW, &exists).action, Action::Skip);
    let skip = DrainOptions {
        skip_wait_for_delete_timeout: 10,
        ..o
    };
    assert_eq!(decide(&p, &skip, NOW, &exists).action, Action::Refuse);
}

#[test]
fn selectors_and_budgets() {
    let sel: LabelSelector = serde_json::from_value(json!({"matchLabels": {"app": "web"},
        "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]},
                             {"key": "canary", "operator": "DoesNotExist"}]}))
    .unwrap();
    let l = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert_eq!(sel.matches(&l(&[("app", "web")])), Ok(true));
    assert_eq!(
        sel.matches(&l(&[("app", "web"), ("tier", "db")])),
        Ok(false)
    );
    assert_eq!(
        sel.matches(&l(&[("app", "web"), ("canary", "")])),
        Ok(false)
    );
    let bad: LabelSelector =
        serde_json::from_value(json!({"matchExpressions": [{"key": "a", "operator": "In"}]}))
            .unwrap();
    assert!(bad.matches(&l(&[])).is_err());

    let pdb = |name: &str, sel: serde_json::Value, allowed: i64| -> PodDisruptionBudget {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "d"},
            "spec": {"selector": sel}, "status": {"disruptionsAllowed": allowed,
            "desiredHealthy": 1, "currentHealthy": 1}}))
        .unwrap()
    };
    let running = pod(
        json!({"metadata": {"name": "w", "namespace": "d", "labels": {"app": "web"}},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}),
    );
    let zero = pdb("z", json!({"matchLabels": {"app": "web"}}), 0);
    let everything = pdb("all", json!({}), 0);
    assert_eq!(
        budget_check(&running, &[zero.clone(), everything.clone()]),
        BudgetCheck::Blocks {
            name: "z".into(),
            desired_healthy: 1,
            current_healthy: 1
        }
    );
    assert_eq!(budget_check(&running, &[everything]), BudgetCheck::None);
    let two = pdb(
        "two",
        json!({"matchExpressions": [{"key": "app", "operator": "Exists"}]}),
        3,
    );
    assert!(matches!(
        budget_check(&running, &[zero.clone(), two]),
        BudgetCheck::Several { .. }
    ));
    let mut pending = running.clone();
    pending.status.phase = "Pending".into();
    assert_eq!(budget_check(&pending, &[zero]), BudgetCheck::Unchecked);
}

#[test]
fn the_plan_as_text_names_each_pod_and_the_blocking_budget() {
    let rs = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "r", "uid": "u", "controller": true}]);
    let pods = [
        pod(
            json!({"metadata": {"name": "web", "namespace": "d", "labels": {"app": "web"}, "ownerReferences": rs},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}),
        ),
        pod(
            json!({"metadata": {"name": "agent", "namespace": "d", "ownerReferences": ds_owner()}}),
        ),
    ];
    let pdbs: Vec<PodDisruptionBudget> = vec![serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "d"}, "spec": {"selector": {"matchLabels": {"app": "web"}}},
        "status": {"disruptionsAllowed": 0, "desiredHealthy": 1, "currentHealthy": 1}}))
    .unwrap()];
    let plan = Plan::new(&pods, &pdbs, &DrainOptions::default(), NOW, &exists);
    assert_eq!(
        plan.to_string(),
        "  evict d/web: its controller replaces it; blocked: budget web allows zero disruptions (needs 1 healthy pods, has 1)\n  \
         skip d/agent: DaemonSet cni\n  \
         budgets allowing zero disruptions now: d/web\n"
    );
    let strict = DrainOptions {
        ignore_daemonsets: false,
        ..DrainOptions::default()
    };
    let plan = Plan::new(&pods, &pdbs, &strict, NOW, &exists);
    assert!(plan.evictions().is_empty());
    assert!(plan.to_string().contains("  (evict) d/web"));
    assert!(plan.to_string().contains(
        "  the drain is refused: cannot delete DaemonSet-managed Pods (use --ignore-daemonsets to ignore): d/agent\n"
    ));
}
