//! Which pods a drain evicts, which it leaves and why, and which budgets
//! stand in the way: the pure core of the drain (issue 38), used by the
//! drain itself and by `plan`.
//!
//! [`decide`] is `kubectl drain`'s pod selection (`k8s.io/kubectl/pkg/drain`,
//! `filters.go`, 1.36) rule for rule, with its knobs in [`DrainOptions`];
//! its default is what `kubectl drain --ignore-daemonsets
//! --delete-emptydir-data` does. The filters run in kubectl's order and the
//! first that keeps a pod decides:
//!
//! 1. `skipDeletedFilter`: a pod whose `deletionTimestamp` is more than
//!    `skip_wait_for_delete_timeout` seconds old is skipped (0, the
//!    default, skips none: a terminating pod is evicted again, which the
//!    eviction API answers without a budget check);
//! 2. `daemonSetFilter`: a running pod whose controller is an `apps/v1`
//!    DaemonSet is skipped with `--ignore-daemonsets` and refuses the drain
//!    without; when its DaemonSet is gone the pod is evicted with `--force`
//!    and refuses the drain without (kubectl's `GET` error is the message);
//! 3. `mirrorPodFilter`: a mirror (static) pod, `kubernetes.io/config.mirror`,
//!    is skipped;
//! 4. `localStorageFilter`: a running pod with an `emptyDir` volume refuses
//!    the drain unless `--delete-emptydir-data`;
//! 5. `unreplicatedFilter`: a running pod without a controller refuses the
//!    drain unless `--force`.
//!
//! A finished pod (`Succeeded`, `Failed`) passes 2, 4 and 5 whatever it is.
//! One refused pod refuses the whole drain: nothing is evicted
//! ([`Plan::refusals`]). `activator/tests/cluster/drain_selection.rs` holds this
//! against kubectl 1.36's own `drain --dry-run=client` on generated pod sets.
//!
//! [`budget_check`] is the eviction API's side (`EvictionREST.Create`,
//! `pkg/registry/core/pod/storage/eviction.go`): a pending, finished or
//! terminating pod goes without a budget check; otherwise the one budget
//! whose selector (non-empty: an empty or invalid one matches nothing there)
//! matches the pod decides, more than one is an error, and a budget with
//! no disruption allowed answers 429 unless the pod is not Ready and the
//! budget lets unhealthy pods go.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};

/// The annotation the kubelet puts on the API's copy of a static pod.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Fields Kubernetes omits when empty may also come as `null`.
fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// The few `ObjectMeta` fields the drain reads.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    #[serde(default, deserialize_with = "nullable")]
    pub namespace: String,
    #[serde(default, deserialize_with = "nullable")]
    pub uid: String,
    #[serde(default)]
    pub generation: Option<i64>,
    #[serde(default, deserialize_with = "nullable")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "nullable")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "nullable")]
    pub owner_references: Vec<OwnerReference>,
    /// RFC 3339, set once the pod is being deleted.
    #[serde(default)]
    pub deletion_timestamp: Option<String>,
}

/// `metav1.OwnerReference`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnerReference {
    #[serde(default, deserialize_with = "nullable")]
    pub api_version: String,
    #[serde(default, deserialize_with = "nullable")]
    pub kind: String,
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    #[serde(default, deserialize_with = "nullable")]
    pub uid: String,
    #[serde(default)]
    pub controller: Option<bool>,
}

/// A list answer (`PodList`, `PodDisruptionBudgetList`): its items and the
/// token of the next page.
#[derive(Debug, Clone, Deserialize)]
#[serde(bound(deserialize = "T: Deserialize<'de>"))]
pub struct List<T> {
    #[serde(default, deserialize_with = "nullable")]
    pub items: Vec<T>,
    #[serde(default)]
    pub metadata: ListMeta,
}

/// `metav1.ListMeta`: where the next page starts.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ListMeta {
    #[serde(default, rename = "continue")]
    pub continue_token: Option<String>,
}

/// `core/v1` Pod, the fields the drain reads.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Pod {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: PodSpec,
    #[serde(default)]
    pub status: PodStatus,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    #[serde(default, deserialize_with = "nullable")]
    pub node_name: String,
    #[serde(default, deserialize_with = "nullable")]
    pub volumes: Vec<Volume>,
}

/// A volume: only whether it is an `emptyDir` matters here.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Volume {
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    #[serde(default)]
    pub empty_dir: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct PodStatus {
    #[serde(default, deserialize_with = "nullable")]
    pub phase: String,
    #[serde(default, deserialize_with = "nullable")]
    pub conditions: Vec<Condition>,
}

/// A status condition (`type`, `status`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Condition {
    #[serde(rename = "type", default, deserialize_with = "nullable")]
    pub kind: String,
    #[serde(default, deserialize_with = "nullable")]
    pub status: String,
}

impl Pod {
    /// `metav1.GetControllerOf`: the first owner marked `controller: true`.
    pub fn controller(&self) -> Option<&OwnerReference> {
        self.metadata
            .owner_references
            .iter()
            .find(|o| o.controller == Some(true))
    }

    /// `Succeeded` or `Failed`.
    pub fn finished(&self) -> bool {
        matches!(self.status.phase.as_str(), "Succeeded" | "Failed")
    }

    pub fn mirror(&self) -> bool {
        self.metadata.annotations.contains_key(MIRROR_ANNOTATION)
    }

    pub fn local_storage(&self) -> bool {
        self.spec.volumes.iter().any(|v| v.empty_dir.is_some())
    }

    pub fn terminating(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }

    /// The `Ready` condition is `True`.
    pub fn ready(&self) -> bool {
        self.status
            .conditions
            .iter()
            .any(|c| c.kind == "Ready" && c.status == "True")
    }

    /// `namespace/name`, as kubectl names pods.
    pub fn key(&self) -> String {
        format!("{}/{}", self.metadata.namespace, self.metadata.name)
    }

    /// The controlling DaemonSet's name, when the controller is one
    /// (`isControllerRefDaemonSet`: kind and `apps/v1` both).
    pub fn daemonset(&self) -> Option<&str> {
        self.controller()
            .filter(|c| c.kind == "DaemonSet" && c.api_version == "apps/v1")
            .map(|c| c.name.as_str())
    }
}

/// `policy/v1` PodDisruptionBudget, the fields the eviction check reads.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct PodDisruptionBudget {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: PdbSpec,
    #[serde(default)]
    pub status: PdbStatus,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PdbSpec {
    /// `null` matches nothing.
    #[serde(default)]
    pub selector: Option<LabelSelector>,
    #[serde(default)]
    pub unhealthy_pod_eviction_policy: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PdbStatus {
    #[serde(default)]
    pub observed_generation: Option<i64>,
    #[serde(default)]
    pub disruptions_allowed: i64,
    #[serde(default)]
    pub current_healthy: i64,
    #[serde(default)]
    pub desired_healthy: i64,
    #[serde(default)]
    pub expected_pods: i64,
}

/// `metav1.LabelSelector`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    #[serde(default, deserialize_with = "nullable")]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "nullable")]
    pub match_expressions: Vec<Requirement>,
}

/// One `matchExpressions` entry.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Requirement {
    #[serde(default, deserialize_with = "nullable")]
    pub key: String,
    #[serde(default, deserialize_with = "nullable")]
    pub operator: String,
    #[serde(default, deserialize_with = "nullable")]
    pub values: Vec<String>,
}

impl LabelSelector {
    /// `metav1.LabelSelectorAsSelector(..).Matches(labels)`: every
    /// `matchLabels` pair and every expression holds. `Err` names what makes
    /// the selector invalid (an unknown operator, `In`/`NotIn` without
    /// values, `Exists`/`DoesNotExist` with values).
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> Result<bool, String> {
        let mut all = self
            .match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v));
        for r in &self.match_expressions {
            let value = labels.get(&r.key);
            let holds = match r.operator.as_str() {
                "In" | "NotIn" if r.values.is_empty() => {
                    return Err(format!(
                        "for 'in', 'notin' operators, values set can't be empty (key {:?})",
                        r.key
                    ))
                }
                "Exists" | "DoesNotExist" if !r.values.is_empty() => {
                    return Err(format!(
                        "values set must be empty for exists and does not exist (key {:?})",
                        r.key
                    ))
                }
                "In" => value.is_some_and(|v| r.values.contains(v)),
                "NotIn" => value.is_none_or(|v| !r.values.contains(v)),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                other => return Err(format!("{other:?} is not a valid label selector operator")),
            };
            all &= holds;
        }
        Ok(all)
    }

    /// No `matchLabels` and no expressions (it selects everything, which
    /// the eviction API treats as nothing).
    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.match_expressions.is_empty()
    }
}

/// The drain's knobs, as `kubectl drain`'s flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DrainOptions {
    /// `--force`: evict pods without a controller (and those of a gone
    /// DaemonSet).
    pub force: bool,
    /// `--delete-emptydir-data`: evict running pods with `emptyDir` volumes.
    pub delete_emptydir_data: bool,
    /// `--ignore-daemonsets`: skip DaemonSet pods rather than refuse.
    pub ignore_daemonsets: bool,
    /// `--skip-wait-for-delete-timeout`: skip pods whose deletion began more
    /// than this many seconds ago (0: none).
    pub skip_wait_for_delete_timeout: u64,
}

impl Default for DrainOptions {
    /// `kubectl drain --ignore-daemonsets --delete-emptydir-data`.
    fn default() -> Self {
        DrainOptions {
            force: false,
            delete_emptydir_data: true,
            ignore_daemonsets: true,
            skip_wait_for_delete_timeout: 0,
        }
    }
}

/// What becomes of one pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    Evict,
    Skip,
    /// The pod refuses the whole drain.
    Refuse,
}

/// Why, in the terms of kubectl's filters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "reason")]
pub enum Why {
    /// Evict: a controller will replace it.
    Controlled,
    /// Evict: `Succeeded` or `Failed`, whatever owns it.
    Finished,
    /// Evict with `force`; refuse without: no controller.
    Unmanaged,
    /// Evict with `delete_emptydir_data` (its `emptyDir` data is lost);
    /// refuse without.
    LocalStorage,
    /// Evict with `force`, refuse without: its DaemonSet could not be read
    /// (`message` is the API's answer, e.g. `daemonsets.apps "x" not found`).
    DaemonSetGone { daemonset: String, message: String },
    /// Skip with `ignore_daemonsets`, refuse without.
    DaemonSet { daemonset: String },
    /// Skip: the API's copy of a static pod.
    Mirror,
    /// Skip: its deletion began longer ago than `skip_wait_for_delete_timeout`.
    DeletedLongAgo,
}

/// The decision on one pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub action: Action,
    #[serde(flatten)]
    pub why: Why,
}

const DAEMONSET_FATAL: &str = "DaemonSet-managed Pods (use --ignore-daemonsets to ignore)";
const DAEMONSET_WARNING: &str = "ignoring DaemonSet-managed Pods";
const LOCAL_STORAGE_FATAL: &str =
    "Pods with local storage (use --delete-emptydir-data to override)";
const UNMANAGED_FATAL: &str = "Pods that declare no controller (use --force to override)";
const UNMANAGED_WARNING: &str = "deleting Pods that declare no controller";

impl Verdict {
    fn new(action: Action, why: Why) -> Verdict {
        Verdict { action, why }
    }

    /// kubectl's text for a refusal (`cannot delete <this>: ns/pod, ...`).
    pub fn refusal(&self) -> Option<String> {
        if self.action != Action::Refuse {
            return None;
        }
        Some(match &self.why {
            Why::DaemonSet { .. } => DAEMONSET_FATAL.into(),
            Why::DaemonSetGone { message, .. } => message.clone(),
            Why::LocalStorage => LOCAL_STORAGE_FATAL.into(),
            Why::Unmanaged => UNMANAGED_FATAL.into(),
            other => format!("{other:?}"),
        })
    }

    /// kubectl's warning for the pod, where kubectl prints one: only the
    /// deciding filter's warning survives (`filterPods` keeps the last
    /// status), so a skipped DaemonSet pod and a forced pod without a
    /// controller warn; the local-storage and gone-DaemonSet warnings are
    /// overwritten by the filters after them.
    pub fn warning(&self) -> Option<&'static str> {
        match (self.action, &self.why) {
            (Action::Skip, Why::DaemonSet { .. }) => Some(DAEMONSET_WARNING),
            (Action::Evict, Why::Unmanaged) => Some(UNMANAGED_WARNING),
            _ => None,
        }
    }
}

/// What reading a pod's DaemonSet gave: it exists, it is gone (404), or
/// the read failed otherwise (the error's text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DaemonSetLookup {
    Exists,
    NotFound,
    Failed(String),
}

/// The pods whose DaemonSet [`decide`] will ask about: `(namespace, name)`
/// of the controlling DaemonSet of each pod that is not finished and not
/// skipped as long deleted, each once.
pub fn daemonsets_to_read(pods: &[Pod], opts: &DrainOptions, now: i64) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = pods
        .iter()
        .filter(|p| !deleted_long_ago(p, opts, now) && !p.finished())
        .filter_map(|p| Some((p.metadata.namespace.clone(), p.daemonset()?.to_string())))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// `shouldSkipPod`: `int(now - deletionTimestamp)` in seconds above the
/// timeout (a timestamp that does not parse counts as not deleted).
fn deleted_long_ago(pod: &Pod, opts: &DrainOptions, now: i64) -> bool {
    let Some(at) = pod
        .metadata
        .deletion_timestamp
        .as_deref()
        .and_then(kubeslot_image::time::parse_rfc3339)
    else {
        return false;
    };
    opts.skip_wait_for_delete_timeout > 0
        && now - at > i64::try_from(opts.skip_wait_for_delete_timeout).unwrap_or(i64::MAX)
}

/// kubectl's filters on one pod (see the module). `daemonset(ns, name)`
/// reads a DaemonSet; `now` is the clock in seconds since the epoch.
pub fn decide(
    pod: &Pod,
    opts: &DrainOptions,
    now: i64,
    daemonset: &dyn Fn(&str, &str) -> DaemonSetLookup,
) -> Verdict {
    use Action::{Evict, Refuse, Skip};
    if deleted_long_ago(pod, opts, now) {
        return Verdict::new(Skip, Why::DeletedLongAgo);
    }
    let finished = pod.finished();
    let mut ds_gone = None;
    if let (Some(ds), false) = (pod.daemonset(), finished) {
        let ds = ds.to_string();
        match daemonset(&pod.metadata.namespace, &ds) {
            DaemonSetLookup::Exists if opts.ignore_daemonsets => {
                return Verdict::new(Skip, Why::DaemonSet { daemonset: ds })
            }
            DaemonSetLookup::Exists => {
                return Verdict::new(Refuse, Why::DaemonSet { daemonset: ds })
            }
            DaemonSetLookup::NotFound => {
                let gone = Why::DaemonSetGone {
                    message: format!("daemonsets.apps {ds:?} not found"),
                    daemonset: ds,
                };
                if !opts.force {
                    return Verdict::new(Refuse, gone);
                }
                ds_gone = Some(gone);
            }
            DaemonSetLookup::Failed(message) => {
                return Verdict::new(
                    Refuse,
                    Why::DaemonSetGone {
                        daemonset: ds,
                        message,
                    },
                )
            }
        }
    }
    if pod.mirror() {
        return Verdict::new(Skip, Why::Mirror);
    }
    if finished {
        return Verdict::new(Evict, Why::Finished);
    }
    let local = pod.local_storage();
    if local && !opts.delete_emptydir_data {
        return Verdict::new(Refuse, Why::LocalStorage);
    }
    if pod.controller().is_none() {
        let action = if opts.force { Evict } else { Refuse };
        return Verdict::new(action, Why::Unmanaged);
    }
    if local {
        return Verdict::new(Evict, Why::LocalStorage);
    }
    Verdict::new(Evict, ds_gone.unwrap_or(Why::Controlled))
}

/// The budget side of one eviction (see the module).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "budget")]
pub enum BudgetCheck {
    /// Pending, finished or terminating: no budget is asked.
    Unchecked,
    /// No budget selects the pod.
    None,
    /// The budget allows the eviction (disruptions left, or an unready pod
    /// the budget lets go).
    Allows { name: String },
    /// The budget allows zero disruptions now (429 until that changes).
    Blocks {
        name: String,
        desired_healthy: i64,
        current_healthy: i64,
    },
    /// The budget's status is older than its spec (429, retry after 10 s).
    Stale { name: String },
    /// More than one budget selects the pod: the eviction API refuses it
    /// (500) whatever the budgets allow.
    Several { names: Vec<String> },
}

impl BudgetCheck {
    /// The eviction would be refused now.
    pub fn blocked(&self) -> bool {
        matches!(
            self,
            BudgetCheck::Blocks { .. } | BudgetCheck::Stale { .. } | BudgetCheck::Several { .. }
        )
    }
}

/// The budgets of `pod`'s namespace whose selector, valid and non-empty,
/// selects it (`getPodDisruptionBudgets`).
pub fn budgets_of<'a>(pod: &Pod, pdbs: &'a [PodDisruptionBudget]) -> Vec<&'a PodDisruptionBudget> {
    pdbs.iter()
        .filter(|b| b.metadata.namespace == pod.metadata.namespace)
        .filter(|b| {
            b.spec
                .selector
                .as_ref()
                .is_some_and(|s| !s.is_empty() && s.matches(&pod.metadata.labels).unwrap_or(false))
        })
        .collect()
}

/// What the eviction API would answer for `pod` given `pdbs` now.
pub fn budget_check(pod: &Pod, pdbs: &[PodDisruptionBudget]) -> BudgetCheck {
    if matches!(
        pod.status.phase.as_str(),
        "Succeeded" | "Failed" | "Pending"
    ) || pod.terminating()
    {
        return BudgetCheck::Unchecked;
    }
    let budgets = budgets_of(pod, pdbs);
    let b = match budgets.as_slice() {
        [] => return BudgetCheck::None,
        [b] => *b,
        several => {
            return BudgetCheck::Several {
                names: several.iter().map(|b| b.metadata.name.clone()).collect(),
            }
        }
    };
    let name = b.metadata.name.clone();
    let st = &b.status;
    let unhealthy_ok = !pod.ready()
        && (b.spec.unhealthy_pod_eviction_policy.as_deref() == Some("AlwaysAllow")
            || (st.current_healthy >= st.desired_healthy && st.desired_healthy > 0));
    if unhealthy_ok {
        return BudgetCheck::Allows { name };
    }
    if st.observed_generation.unwrap_or(0) < b.metadata.generation.unwrap_or(0) {
        return BudgetCheck::Stale { name };
    }
    if st.disruptions_allowed <= 0 {
        return BudgetCheck::Blocks {
            name,
            desired_healthy: st.desired_healthy,
            current_healthy: st.current_healthy,
        };
    }
    BudgetCheck::Allows { name }
}

/// One pod in a [`Plan`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodPlan {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    #[serde(flatten)]
    pub verdict: Verdict,
    /// Already being deleted (its eviction is answered without a budget
    /// check and the drain waits for it).
    pub terminating: bool,
    /// For pods to evict: what their budget says now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetCheck>,
}

/// The drain of one node, decided.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    pub options: DrainOptions,
    /// Every pod on the node, in the order listed.
    pub pods: Vec<PodPlan>,
}

impl Plan {
    /// `decide` on each pod and, for those to evict, `budget_check`.
    pub fn new(
        pods: &[Pod],
        pdbs: &[PodDisruptionBudget],
        opts: &DrainOptions,
        now: i64,
        daemonset: &dyn Fn(&str, &str) -> DaemonSetLookup,
    ) -> Plan {
        let pods = pods
            .iter()
            .map(|p| {
                let verdict = decide(p, opts, now, daemonset);
                let budget = (verdict.action == Action::Evict).then(|| budget_check(p, pdbs));
                PodPlan {
                    namespace: p.metadata.namespace.clone(),
                    name: p.metadata.name.clone(),
                    uid: p.metadata.uid.clone(),
                    verdict,
                    terminating: p.terminating(),
                    budget,
                }
            })
            .collect();
        Plan {
            options: *opts,
            pods,
        }
    }

    /// The pods to evict (none when the drain is refused).
    pub fn evictions(&self) -> Vec<&PodPlan> {
        if !self.refusals().is_empty() {
            return Vec::new();
        }
        self.with(Action::Evict)
    }

    pub fn with(&self, action: Action) -> Vec<&PodPlan> {
        self.pods
            .iter()
            .filter(|p| p.verdict.action == action)
            .collect()
    }

    /// Why the drain is refused, as kubectl words it: one `cannot delete
    /// <reason>: ns/a, ns/b` per reason, in the order first met.
    pub fn refusals(&self) -> Vec<String> {
        group(&self.pods, |p| p.verdict.refusal())
            .into_iter()
            .map(|(why, pods)| format!("cannot delete {why}: {}", pods.join(", ")))
            .collect()
    }

    /// kubectl's warnings (`<warning>: ns/a, ns/b`), when not refused.
    pub fn warnings(&self) -> Vec<String> {
        group(&self.pods, |p| p.verdict.warning().map(str::to_string))
            .into_iter()
            .map(|(why, pods)| format!("{why}: {}", pods.join(", ")))
            .collect()
    }

    /// The budgets that allow zero disruptions for a pod to evict (their
    /// names, each once, in the order first met).
    pub fn blocking_budgets(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for p in self.with(Action::Evict) {
            let names = match &p.budget {
                Some(BudgetCheck::Blocks { name, .. } | BudgetCheck::Stale { name }) => {
                    vec![name.clone()]
                }
                Some(BudgetCheck::Several { names }) => names.clone(),
                _ => Vec::new(),
            };
            for n in names {
                let n = format!("{}/{n}", p.namespace);
                if !out.contains(&n) {
                    out.push(n);
                }
            }
        }
        out
    }
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Why::Controlled => write!(f, "its controller replaces it"),
            Why::Finished => write!(f, "finished"),
            Why::Unmanaged => write!(f, "no controller: nothing recreates it"),
            Why::LocalStorage => write!(f, "emptyDir: its data is deleted"),
            Why::DaemonSetGone { message, .. } => write!(f, "its DaemonSet is gone ({message})"),
            Why::DaemonSet { daemonset } => write!(f, "DaemonSet {daemonset}"),
            Why::Mirror => write!(f, "mirror pod of a static pod"),
            Why::DeletedLongAgo => write!(f, "deleted longer ago than the skip timeout"),
        }
    }
}

impl std::fmt::Display for BudgetCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BudgetCheck::Unchecked => write!(f, "no budget check (pending, finished or terminating)"),
            BudgetCheck::None => write!(f, "no budget"),
            BudgetCheck::Allows { name } => write!(f, "budget {name} allows it"),
            BudgetCheck::Blocks {
                name,
                desired_healthy,
                current_healthy,
            } => write!(
                f,
                "blocked: budget {name} allows zero disruptions (needs {desired_healthy} healthy pods, has {current_healthy})"
            ),
            BudgetCheck::Stale { name } => {
                write!(f, "blocked: budget {name} is still being processed")
            }
            BudgetCheck::Several { names } => write!(
                f,
                "blocked: several budgets select it ({}), which eviction refuses",
                names.join(", ")
            ),
        }
    }
}

impl std::fmt::Display for Plan {
    /// One line per pod (`evict`, `skip`, `refuse`, with why and, for
    /// evictions, the budget), then the refusal or the blocking budgets.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let refusals = self.refusals();
        for p in &self.pods {
            let action = match p.verdict.action {
                Action::Evict if !refusals.is_empty() => "(evict)",
                Action::Evict => "evict",
                Action::Skip => "skip",
                Action::Refuse => "refuse",
            };
            write!(
                f,
                "  {action} {}/{}: {}",
                p.namespace, p.name, p.verdict.why
            )?;
            if p.terminating {
                write!(f, ", already terminating")?;
            }
            if let Some(b) = &p.budget {
                if !matches!(b, BudgetCheck::None | BudgetCheck::Unchecked) {
                    write!(f, "; {b}")?;
                }
            }
            writeln!(f)?;
        }
        if self.pods.is_empty() {
            writeln!(f, "  no pods on the node")?;
        }
        for r in &refusals {
            writeln!(f, "  the drain is refused: {r}")?;
        }
        let blocking = self.blocking_budgets();
        if !blocking.is_empty() {
            writeln!(
                f,
                "  budgets allowing zero disruptions now: {}",
                blocking.join(", ")
            )?;
        }
        Ok(())
    }
}

/// Reads the drain of `node` from the API through `client` and decides
/// it: the Node (it must exist, as for kubectl), the pods bound to it (all namespaces, `fieldSelector
/// spec.nodeName`, as kubectl lists them), the budgets of their namespaces
/// and each DaemonSet [`decide`] asks about. Errors name the request; a
/// [`super::Error`] stays reachable by `downcast_ref` (unreachable API,
/// 403 for missing permissions).
pub fn read_plan(
    client: &super::Client,
    node: &str,
    opts: &DrainOptions,
    now: i64,
) -> anyhow::Result<Plan> {
    use anyhow::Context as _;
    client
        .get(&super::path("v1", None, "nodes", Some(node)))
        .with_context(|| format!("reading node {node}"))?;
    let field = format!("spec.nodeName={node}");
    let pods_path = super::path("v1", None, "pods", None);
    let pods: Vec<Pod> = client
        .list(&pods_path, &[("fieldSelector", &field)])
        .map_err(anyhow::Error::new)
        .and_then(|items| {
            serde_json::from_value(serde_json::Value::Array(items)).map_err(anyhow::Error::new)
        })
        .with_context(|| format!("listing the pods on node {node}"))?;
    let mut namespaces: Vec<&str> = pods.iter().map(|p| p.metadata.namespace.as_str()).collect();
    namespaces.sort_unstable();
    namespaces.dedup();
    let mut pdbs: Vec<PodDisruptionBudget> = Vec::new();
    for ns in namespaces {
        let path = super::path("policy/v1", Some(ns), "poddisruptionbudgets", None);
        let items = client
            .list(&path, &[])
            .map_err(anyhow::Error::new)
            .and_then(|items| {
                serde_json::from_value::<Vec<PodDisruptionBudget>>(serde_json::Value::Array(items))
                    .map_err(anyhow::Error::new)
            })
            .with_context(|| format!("listing the disruption budgets of namespace {ns}"))?;
        pdbs.extend(items);
    }
    let mut daemonsets = BTreeMap::new();
    for (ns, name) in daemonsets_to_read(&pods, opts, now) {
        let path = super::path("apps/v1", Some(&ns), "daemonsets", Some(&name));
        let found = match client.get(&path) {
            Ok(_) => DaemonSetLookup::Exists,
            Err(e) if e.is_not_found() => DaemonSetLookup::NotFound,
            // kubectl's message is the API's
            Err(e) => DaemonSetLookup::Failed(
                e.status()
                    .map_or_else(|| e.to_string(), |s| s.message.clone()),
            ),
        };
        daemonsets.insert((ns, name), found);
    }
    let lookup = |ns: &str, name: &str| {
        daemonsets
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
            .unwrap_or_else(|| DaemonSetLookup::Failed(format!("daemonset {ns}/{name} not read")))
    };
    Ok(Plan::new(&pods, &pdbs, opts, now, &lookup))
}

/// Pod names (`ns/name`) grouped by a text, groups in the order first met.
fn group(
    pods: &[PodPlan],
    text: impl Fn(&PodPlan) -> Option<String>,
) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for p in pods {
        if let Some(t) = text(p) {
            let key = format!("{}/{}", p.namespace, p.name);
            match out.iter_mut().find(|(k, _)| *k == t) {
                Some((_, v)) => v.push(key),
                None => out.push((t, vec![key])),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
