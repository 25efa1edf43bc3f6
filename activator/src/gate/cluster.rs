//! The cluster gate (issue 38): after the machine passed `/healthz` and
//! CRI, the API server must see the Node `Ready` with a heartbeat no older
//! than the flip and the kubelet version the image carries, and each named
//! DaemonSet's pod on this node Ready, within the health gate's timeout.
//!
//! The client is made at each try until one works: on a first activation
//! the kubelet writes its kubeconfig (TLS bootstrap) while the gate waits.
//! An API that never answers fails the gate only when the drain is
//! required (`cluster.drain.required`); otherwise the gate passes with a
//! note, as a flip without an API is undrained.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::cluster::{path, Client};

use super::health::{Check, Failure};

/// The manifest annotation that says which kubelet an image carries
/// (`kubeslot-builder` writes one per component).
pub const KUBELET_VERSION_ANNOTATION: &str = "dev.kubeslot.version.kubelet";

/// What the cluster gate asks.
pub struct ClusterGate<'a> {
    pub node: String,
    /// Wait for the Node's `Ready`.
    pub node_ready: bool,
    /// The kubelet version the image carries: with `node_ready`, the
    /// Node's `status.nodeInfo.kubeletVersion` must be it (a leading `v`
    /// aside).
    pub kubelet_version: Option<String>,
    /// `namespace/name` of DaemonSets whose pod on the node must be Ready.
    pub daemonsets: Vec<String>,
    /// An API that never answers fails the gate.
    pub required: bool,
    /// Makes a client (the kubeconfig may appear while the gate waits).
    pub client: &'a dyn Fn() -> anyhow::Result<Client>,
}

/// Waits until the gate passes or `deadline`; `flip_at` is the flip's
/// start (seconds since the epoch). `Ok(Some(note))` passes with a note.
pub fn wait(
    g: &ClusterGate,
    machine: &str,
    flip_at: i64,
    deadline: Instant,
    interval: Duration,
) -> Result<Option<String>, Failure> {
    let mut client = None;
    let mut answered = false;
    let mut last = (Check::NodeReady, "not asked".to_string());
    loop {
        if client.is_none() {
            match (g.client)() {
                Ok(c) => client = Some(c),
                Err(e) => last = (Check::NodeReady, kubeslot_image::error_chain(&*e)),
            }
        }
        if let Some(c) = &client {
            match check(c, g, flip_at) {
                Ok(()) => return Ok(None),
                Err((check, why, api_answered)) => {
                    answered |= api_answered;
                    last = (check, why);
                }
            }
        }
        if Instant::now() >= deadline {
            if !answered && !g.required {
                return Ok(Some(format!(
                    "cluster gate skipped: the API did not answer ({})",
                    last.1
                )));
            }
            return Err(Failure {
                machine: machine.to_string(),
                check: last.0,
                detail: last.1,
            });
        }
        std::thread::sleep(interval.min(deadline.saturating_duration_since(Instant::now())));
    }
}

/// One look: `Err((check, why, whether the API answered))`.
fn check(c: &Client, g: &ClusterGate, flip_at: i64) -> Result<(), (Check, String, bool)> {
    let node_path = path("v1", None, "nodes", Some(&g.node));
    if g.node_ready {
        let n = c
            .get(&node_path)
            .map_err(|e| (Check::NodeReady, e.to_string(), !e.is_unreachable()))?;
        let ready = n["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Ready");
        let Some(r) = ready else {
            return Err((
                Check::NodeReady,
                format!("node {} has no Ready condition", g.node),
                true,
            ));
        };
        if r["status"] != "True" {
            return Err((
                Check::NodeReady,
                format!(
                    "node {} is not Ready: {} {}",
                    g.node,
                    r["reason"].as_str().unwrap_or(""),
                    r["message"].as_str().unwrap_or("")
                ),
                true,
            ));
        }
        let beat = r["lastHeartbeatTime"]
            .as_str()
            .and_then(kubeslot_image::time::parse_rfc3339);
        if beat.is_none_or(|b| b < flip_at) {
            return Err((
                Check::NodeReady,
                format!(
                    "node {} is Ready, but its last heartbeat ({}) is older than the flip: not the new kubelet yet",
                    g.node,
                    r["lastHeartbeatTime"].as_str().unwrap_or("none")
                ),
                true,
            ));
        }
        if let Some(want) = &g.kubelet_version {
            let got = n["status"]["nodeInfo"]["kubeletVersion"]
                .as_str()
                .unwrap_or("");
            if got.trim_start_matches('v') != want.trim_start_matches('v') {
                return Err((
                    Check::KubeletVersion,
                    format!(
                        "node {} reports kubelet {:?}, the image carries kubelet {want:?} (its {KUBELET_VERSION_ANNOTATION} annotation)",
                        g.node, got
                    ),
                    true,
                ));
            }
        }
    }
    if g.daemonsets.is_empty() {
        return Ok(());
    }
    let field = format!("spec.nodeName={}", g.node);
    let pods = c
        .list(
            &path("v1", None, "pods", None),
            &[("fieldSelector", &field)],
        )
        .map_err(|e| (Check::DaemonSetReady, e.to_string(), !e.is_unreachable()))?;
    for d in &g.daemonsets {
        let (ns, name) = d.split_once('/').unwrap_or(("", d));
        let ds = c
            .get(&path("apps/v1", Some(ns), "daemonsets", Some(name)))
            .map_err(|e| {
                (
                    Check::DaemonSetReady,
                    format!("daemonset {d}: {e}"),
                    !e.is_unreachable(),
                )
            })?;
        let uid = ds["metadata"]["uid"].as_str().unwrap_or("");
        let ready = pods.iter().any(|p| owned_by(p, uid) && pod_ready(p));
        if !ready {
            return Err((
                Check::DaemonSetReady,
                format!("daemonset {d} has no Ready pod on node {}", g.node),
                true,
            ));
        }
    }
    Ok(())
}

fn owned_by(p: &Value, uid: &str) -> bool {
    p["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|o| o["uid"] == uid && o["controller"] == Value::Bool(true))
}

fn pod_ready(p: &Value) -> bool {
    p["metadata"]["deletionTimestamp"].is_null()
        && p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
}
