//! The drain itself (issue 38): cordon, evict through `policy/v1`
//! Eviction what [`super::pods`] selects, wait until each pod is gone,
//! uncordon. Blocking, within one deadline; what the caller records
//! (that kubeslot cordoned the Node) is the caller's.
//!
//! * A 429 (a budget, or one still being processed) is asked again after
//!   its `Retry-After` or 5 s, as kubectl does; the last answer is kept to
//!   name the budget when the deadline passes.
//! * A 404 is a pod already gone.
//! * A pod is gone when its UID is no longer among the node's pods (a
//!   StatefulSet's replacement of the same name is not the pod evicted;
//!   and a node may not read a pod no longer bound to it: 403, not 404).
//! * Any other answer (403: a permission missing; 500: several budgets)
//!   ends the drain with that answer.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::pods::{self, DrainOptions, Plan};
use super::{path, Client, Error, PatchType};

/// How a drain is run.
#[derive(Clone, Debug)]
pub struct Settings {
    pub options: DrainOptions,
    /// The whole drain, from the first eviction.
    pub timeout: Duration,
    /// Evictions shorten each pod's grace to this.
    pub grace_cap_secs: Option<u64>,
    /// Between reads of a pod that is going, and the least wait after a 429.
    pub poll: Duration,
}

/// A pod the drain could not remove in time.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Stuck {
    /// `namespace/name`.
    pub pod: String,
    /// `namespace/budget` when a budget refused its eviction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<String>,
    /// The API's last word on it (the 429's cause), or "terminating".
    pub why: String,
}

/// A finished drain.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Drained {
    /// `namespace/name` of each pod evicted (or found gone).
    pub evicted: Vec<String>,
    /// `namespace/name: why` of each pod left on the node.
    pub skipped: Vec<String>,
    pub duration_ms: u64,
}

/// Why a drain did not finish.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    /// kubectl's refusal: a pod the options do not let go (nothing evicted).
    #[error("drain of node {node} refused: {}", refusals.join("; "))]
    Refused { node: String, refusals: Vec<String> },
    /// The deadline passed with pods still on the node.
    #[error("drain of node {node} timed out after {}s: {}", timeout.as_secs(), describe(stuck))]
    Blocked {
        node: String,
        timeout: Duration,
        stuck: Vec<Stuck>,
    },
    /// An API answer the drain cannot go on after (or no answer).
    #[error("drain of node {node}: {what}: {source}")]
    Api {
        node: String,
        what: String,
        #[source]
        source: Error,
    },
    /// Reading the plan failed (its own message names the request).
    #[error("drain of node {node}: {message}")]
    Read { node: String, message: String },
}

fn describe(stuck: &[Stuck]) -> String {
    stuck
        .iter()
        .map(|s| match &s.budget {
            Some(b) => format!("{} (budget {b}: {})", s.pod, s.why),
            None => format!("{} ({})", s.pod, s.why),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

impl DrainError {
    /// No answer from the API (the drain never got to act).
    pub fn unreachable(&self) -> bool {
        matches!(self, DrainError::Api { source, .. } if source.is_unreachable())
    }
}

/// Sets `spec.unschedulable`. Returns whether this call changed it: a
/// Node cordoned already (by an operator) is not kubeslot's to uncordon.
pub fn cordon(client: &Client, node: &str) -> Result<bool, Error> {
    let p = path("v1", None, "nodes", Some(node));
    let n = client.get(&p)?;
    if n["spec"]["unschedulable"] == Value::Bool(true) {
        return Ok(false);
    }
    client.patch(
        &p,
        PatchType::Strategic,
        &json!({"spec": {"unschedulable": true}}),
    )?;
    Ok(true)
}

/// Clears `spec.unschedulable` (as `kubectl uncordon`).
pub fn uncordon(client: &Client, node: &str) -> Result<(), Error> {
    let p = path("v1", None, "nodes", Some(node));
    client
        .patch(
            &p,
            PatchType::Strategic,
            &json!({"spec": {"unschedulable": null}}),
        )
        .map(|_| ())
}

/// One pod on its way out.
struct Going {
    namespace: String,
    name: String,
    uid: String,
    evicted: bool,
    last: Option<(Option<String>, String)>,
    retry_at: Instant,
}

/// Evicts what `plan` selects and waits until every one is gone, within
/// `settings.timeout` from now. `progress` is told each step.
pub fn evict(
    client: &Client,
    node: &str,
    plan: &Plan,
    settings: &Settings,
    progress: &dyn Fn(&str),
) -> Result<Drained, DrainError> {
    let start = Instant::now();
    let deadline = start + settings.timeout;
    let refusals = plan.refusals();
    if !refusals.is_empty() {
        return Err(DrainError::Refused {
            node: node.to_string(),
            refusals,
        });
    }
    let mut going: Vec<Going> = plan
        .evictions()
        .into_iter()
        .map(|p| Going {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            uid: p.uid.clone(),
            evicted: false,
            last: None,
            retry_at: start,
        })
        .collect();
    let mut drained = Drained {
        skipped: plan
            .with(pods::Action::Skip)
            .iter()
            .map(|p| format!("{}/{}: {}", p.namespace, p.name, p.verdict.why))
            .collect(),
        ..Drained::default()
    };
    let api = |what: String, source: Error| DrainError::Api {
        node: node.to_string(),
        what,
        source,
    };
    let on_node = path("v1", None, "pods", None);
    let field = format!("spec.nodeName={node}");
    loop {
        let now = Instant::now();
        // what is on the node now, by UID: a node may read only the pods
        // bound to it (a gone pod's read is a 403 to it, not a 404)
        let present: std::collections::BTreeSet<String> = if going.iter().any(|g| g.evicted) {
            client
                .list(&on_node, &[("fieldSelector", &field)])
                .map_err(|e| api(format!("listing the pods on node {node}"), e))?
                .iter()
                .filter_map(|p| p["metadata"]["uid"].as_str().map(str::to_string))
                .collect()
        } else {
            Default::default()
        };
        let mut left = Vec::new();
        for mut g in going {
            let key = format!("{}/{}", g.namespace, g.name);
            let pod_path = path("v1", Some(&g.namespace), "pods", Some(&g.name));
            // `present` was listed before this pass's evictions: a pod
            // evicted now is looked for in the next pass's list
            let mut just_evicted = false;
            if !g.evicted && Instant::now() >= g.retry_at {
                match client.create(&format!("{pod_path}/eviction"), &eviction(&g, settings)) {
                    Ok(_) => {
                        progress(&format!("evicting {key}"));
                        g.evicted = true;
                        just_evicted = true;
                    }
                    Err(e) if e.is_not_found() => {
                        drained.evicted.push(key);
                        continue;
                    }
                    Err(e) if e.is_too_many_requests() => {
                        let wait = e.retry_after().unwrap_or(Duration::from_secs(5));
                        let (budget, why) = blocked_by(&e, &g.namespace);
                        if g.last.as_ref().map(|l| &l.1) != Some(&why) {
                            progress(&format!("{key}: {why} (asking again)"));
                        }
                        g.last = Some((budget, why));
                        g.retry_at = Instant::now() + wait.max(settings.poll);
                    }
                    Err(e) => return Err(api(format!("evicting {key}"), e)),
                }
            }
            if g.evicted {
                if !just_evicted && !present.contains(&g.uid) {
                    drained.evicted.push(key);
                    continue;
                }
                g.last = Some((None, "terminating".into()));
            }
            left.push(g);
        }
        going = left;
        if going.is_empty() {
            drained.duration_ms = start.elapsed().as_millis() as u64;
            return Ok(drained);
        }
        if now >= deadline {
            return Err(DrainError::Blocked {
                node: node.to_string(),
                timeout: settings.timeout,
                stuck: going.into_iter().map(stuck).collect(),
            });
        }
        std::thread::sleep(
            settings
                .poll
                .min(deadline.saturating_duration_since(Instant::now())),
        );
    }
}

/// A pod still there at the deadline, with the last word on it.
fn stuck(g: Going) -> Stuck {
    let (budget, why) = g.last.unwrap_or((None, "not evicted yet".to_string()));
    Stuck {
        pod: format!("{}/{}", g.namespace, g.name),
        budget,
        why,
    }
}

/// The Eviction for `g`: its UID as a precondition (never a replacement of
/// the same name), the grace cap when set.
fn eviction(g: &Going, settings: &Settings) -> Value {
    let mut options = json!({"preconditions": {"uid": g.uid}});
    if let Some(cap) = settings.grace_cap_secs {
        options["gracePeriodSeconds"] = json!(cap);
    }
    json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": g.name, "namespace": g.namespace},
        "deleteOptions": options,
    })
}

/// The budget a 429 names (its `DisruptionBudget` cause: "The disruption
/// budget NAME needs ...") and the words to report.
fn blocked_by(e: &Error, namespace: &str) -> (Option<String>, String) {
    let Some(s) = e.status() else {
        return (None, e.to_string());
    };
    let cause = s.details["causes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["reason"] == "DisruptionBudget")
        .and_then(|c| c["message"].as_str());
    let budget = cause
        .and_then(|m| m.strip_prefix("The disruption budget "))
        .and_then(|m| m.split_whitespace().next())
        .map(|b| format!("{namespace}/{b}"));
    let why = match cause {
        Some(c) => format!("{} {c}", s.message),
        None => s.message.clone(),
    };
    (budget, why)
}
