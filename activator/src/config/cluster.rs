//! The `cluster` section (issue 38): how the activator reaches the
//! Kubernetes API, the drain before a flip, the cluster gate after it and
//! what the node reports. Absent: none of it (a flip stops the running
//! machine undrained, as before). Schema and its checks only; the client
//! is `crate::cluster`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `cluster`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Cluster {
    /// A kubeconfig on the host. Unset: the node's own, the kubelet's
    /// after TLS bootstrap (`/var/lib/kubeslot/node/kubelet/kubeconfig`,
    /// kept across flips), or the rendered exec-credential kubeconfig.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<PathBuf>,
    /// Bound on each API request.
    #[serde(default = "default_request_timeout_secs")]
    pub request_timeout_secs: u64,
    /// The prefix of the Node annotations kubeslot writes (a DNS
    /// subdomain and `/`).
    #[serde(default = "default_annotation_prefix")]
    pub annotation_prefix: String,
    /// A Prometheus text file for node_exporter's textfile collector
    /// (written atomically after each run). Unset: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_file: Option<PathBuf>,
    #[serde(default)]
    pub drain: Drain,
    #[serde(default)]
    pub gate: ClusterGate,
}

/// `cluster.drain`: cordon and evict before the running machine stops.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Drain {
    /// Drain at all (`false`: the node is neither cordoned nor drained).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The whole drain (cordon, evictions, waiting for the pods to go)
    /// ends within this; then the flip does not happen.
    #[serde(default = "default_drain_timeout_secs")]
    pub timeout_secs: u64,
    /// A pod's grace period is shortened to this (`None`: each pod's own
    /// `terminationGracePeriodSeconds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_grace_cap_secs: Option<u64>,
    /// With no API reachable: `true` refuses the flip, `false` flips
    /// undrained (the report says which).
    #[serde(default)]
    pub required: bool,
    /// Evict pods with `emptyDir` volumes (their data is lost), as
    /// `kubectl drain --delete-emptydir-data`; `false`: such a pod stops
    /// the drain.
    #[serde(default = "yes")]
    pub delete_emptydir_data: bool,
    /// Evict pods no controller manages (they are not recreated), as
    /// `kubectl drain --force`; `false`: such a pod stops the drain.
    #[serde(default)]
    pub force: bool,
}

/// `cluster.gate`: after the flip, besides `/healthz` and CRI.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ClusterGate {
    /// Do not wait for the Node's `Ready` (default: wait, within
    /// `health.timeout_secs`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skip_node_ready: bool,
    /// `namespace/name` of DaemonSets whose pod on this node must be
    /// Ready (the CNI's, for one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub daemonsets: Vec<String>,
}

fn yes() -> bool {
    true
}
fn default_request_timeout_secs() -> u64 {
    30
}
fn default_annotation_prefix() -> String {
    "kubeslot.io/".into()
}
fn default_drain_timeout_secs() -> u64 {
    600
}

impl Default for Drain {
    fn default() -> Self {
        Drain {
            enabled: true,
            timeout_secs: default_drain_timeout_secs(),
            pod_grace_cap_secs: None,
            required: false,
            delete_emptydir_data: true,
            force: false,
        }
    }
}

impl Cluster {
    /// The relationships serde cannot check: `(field, reason)`.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if self.request_timeout_secs == 0 {
            return Err(("cluster.request_timeout_secs", "must be positive".into()));
        }
        if self.drain.timeout_secs == 0 {
            return Err(("cluster.drain.timeout_secs", "must be positive".into()));
        }
        if let Some(k) = &self.kubeconfig {
            if !k.is_absolute() {
                return Err((
                    "cluster.kubeconfig",
                    format!("{:?} is not an absolute host path", k.display()),
                ));
            }
        }
        if let Some(m) = &self.metrics_file {
            if !m.is_absolute() || m.file_name().is_none() {
                return Err((
                    "cluster.metrics_file",
                    format!("{:?} is not an absolute host file path", m.display()),
                ));
            }
        }
        let p = &self.annotation_prefix;
        let domain = p.strip_suffix('/').unwrap_or("");
        let dns = !domain.is_empty()
            && domain.len() <= 253
            && domain.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            });
        if !dns {
            return Err((
                "cluster.annotation_prefix",
                format!("{p:?} is not a DNS subdomain followed by `/` (as `kubeslot.io/`)"),
            ));
        }
        for d in &self.gate.daemonsets {
            let ok = d
                .split_once('/')
                .is_some_and(|(ns, n)| !ns.is_empty() && !n.is_empty() && !n.contains('/'));
            if !ok {
                return Err((
                    "cluster.gate.daemonsets",
                    format!("{d:?} is not `namespace/name`"),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: serde_json::Value) -> Cluster {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn defaults_are_kubectl_drain_s_with_a_ten_minute_timeout() {
        let c = parse(serde_json::json!({}));
        assert_eq!(c.drain, Drain::default());
        assert!(c.drain.enabled && c.drain.delete_emptydir_data && !c.drain.force);
        assert_eq!(c.drain.timeout_secs, 600);
        assert!(!c.drain.required);
        assert_eq!(c.annotation_prefix, "kubeslot.io/");
        assert!(c.check().is_ok());
    }

    #[test]
    fn checks_name_the_field() {
        let bad = [
            (
                serde_json::json!({"annotation_prefix": "kubeslot.io"}),
                "cluster.annotation_prefix",
            ),
            (
                serde_json::json!({"annotation_prefix": "Kube/"}),
                "cluster.annotation_prefix",
            ),
            (
                serde_json::json!({"drain": {"timeout_secs": 0}}),
                "cluster.drain.timeout_secs",
            ),
            (
                serde_json::json!({"gate": {"daemonsets": ["cilium"]}}),
                "cluster.gate.daemonsets",
            ),
            (
                serde_json::json!({"kubeconfig": "rel/kc"}),
                "cluster.kubeconfig",
            ),
            (
                serde_json::json!({"metrics_file": "x.prom"}),
                "cluster.metrics_file",
            ),
        ];
        for (v, field) in bad {
            let e = parse(v.clone()).check().unwrap_err();
            assert_eq!(e.0, field, "{v}: {e:?}");
        }
        assert!(
            serde_json::from_value::<Cluster>(serde_json::json!({"drain": {"timeout": 1}}))
                .is_err()
        );
    }
}
