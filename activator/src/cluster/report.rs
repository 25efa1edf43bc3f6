//! What the cluster and the host see of a run (issue 38): annotations on
//! the Node, Events about it (both with the node's own credentials), and a
//! Prometheus text file for node_exporter's textfile collector.
//!
//! Best effort: a report that cannot be written never changes what the
//! run did; the caller notes the error.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Value};

use super::{path, Client, Error, PatchType};

/// The phases written to `<prefix>phase`.
pub const PHASES: [&str; 5] = ["draining", "flipping", "gating", "committed", "rolled-back"];

/// Sets the annotations `<prefix><key>` on the Node (a merge patch: other
/// annotations stay).
pub fn annotate(
    client: &Client,
    node: &str,
    prefix: &str,
    values: &[(&str, String)],
) -> Result<(), Error> {
    let mut a = serde_json::Map::new();
    for (k, v) in values {
        a.insert(format!("{prefix}{k}"), Value::String(v.clone()));
    }
    client
        .patch(
            &path("v1", None, "nodes", Some(node)),
            PatchType::Merge,
            &json!({"metadata": {"annotations": a}}),
        )
        .map(|_| ())
}

/// A core/v1 Event about the Node (in `default`, as the kubelet's node
/// events): `reason` (`KubeslotDrain`, ...), `type` Normal or Warning.
pub fn event(
    client: &Client,
    node: &str,
    reason: &str,
    warning: bool,
    message: &str,
) -> Result<(), Error> {
    let now = kubeslot_image::time::now_rfc3339();
    // seconds precision, as Event timestamps are
    let ts = now.split('.').next().unwrap_or(&now).to_string() + "Z";
    let body = json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": format!("{node}.kubeslot-"), "namespace": "default"},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
        "reason": reason,
        "message": message,
        "type": if warning { "Warning" } else { "Normal" },
        "source": {"component": "kubeslot", "host": node},
        "reportingComponent": "kubeslot",
        "reportingInstance": node,
        "firstTimestamp": ts,
        "lastTimestamp": ts,
        "count": 1,
    });
    client
        .create(&path("v1", Some("default"), "events", None), &body)
        .map(|_| ())
}

/// One run's figures for the metrics file.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    /// The image running now: digest, slot, image reference.
    pub digest: Option<String>,
    pub slot: Option<String>,
    pub image: Option<String>,
    /// `committed`, `rolled-back`, `drain-blocked`, `failed`, ...
    pub result: String,
    pub finished_unix: u64,
    pub flip_downtime_ms: Option<u64>,
    pub drain_duration_ms: Option<u64>,
    pub evicted_pods: usize,
}

/// Writes the metrics file at `file` atomically: `kubeslot_image_info`,
/// `kubeslot_activations_total{result}` (counted on from the file's
/// previous values), `kubeslot_last_activation_timestamp_seconds`,
/// `kubeslot_flip_downtime_seconds`, `kubeslot_drain_duration_seconds`,
/// `kubeslot_evicted_pods`.
pub fn write_metrics(file: &Path, m: &Metrics) -> anyhow::Result<()> {
    let mut totals: BTreeMap<String, u64> = BTreeMap::new();
    if let Ok(old) = std::fs::read_to_string(file) {
        for line in old.lines() {
            if let Some(rest) = line.strip_prefix("kubeslot_activations_total{result=\"") {
                if let Some((r, n)) = rest.split_once("\"} ") {
                    totals.insert(r.to_string(), n.trim().parse().unwrap_or(0));
                }
            }
        }
    }
    *totals.entry(m.result.clone()).or_default() += 1;
    let esc = |s: &str| {
        s.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
    };
    let mut out = String::new();
    out += "# HELP kubeslot_image_info The node image this host runs (1).\n# TYPE kubeslot_image_info gauge\n";
    out += &format!(
        "kubeslot_image_info{{digest=\"{}\",slot=\"{}\",image=\"{}\"}} 1\n",
        esc(m.digest.as_deref().unwrap_or("")),
        esc(m.slot.as_deref().unwrap_or("")),
        esc(m.image.as_deref().unwrap_or(""))
    );
    out += "# HELP kubeslot_activations_total Activations by result.\n# TYPE kubeslot_activations_total counter\n";
    for (r, n) in &totals {
        out += &format!("kubeslot_activations_total{{result=\"{}\"}} {n}\n", esc(r));
    }
    out += "# HELP kubeslot_last_activation_timestamp_seconds When the last activation finished.\n# TYPE kubeslot_last_activation_timestamp_seconds gauge\n";
    out += &format!(
        "kubeslot_last_activation_timestamp_seconds {}\n",
        m.finished_unix
    );
    let secs =
        |ms: Option<u64>| ms.map_or("NaN".to_string(), |v| format!("{:.3}", v as f64 / 1000.0));
    out += "# HELP kubeslot_flip_downtime_seconds From the old machine's stop to the new kubelet healthy, last flip.\n# TYPE kubeslot_flip_downtime_seconds gauge\n";
    out += &format!(
        "kubeslot_flip_downtime_seconds {}\n",
        secs(m.flip_downtime_ms)
    );
    out += "# HELP kubeslot_drain_duration_seconds The last drain's duration.\n# TYPE kubeslot_drain_duration_seconds gauge\n";
    out += &format!(
        "kubeslot_drain_duration_seconds {}\n",
        secs(m.drain_duration_ms)
    );
    out += "# HELP kubeslot_evicted_pods Pods the last drain evicted.\n# TYPE kubeslot_evicted_pods gauge\n";
    out += &format!("kubeslot_evicted_pods {}\n", m.evicted_pods);
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| anyhow::anyhow!("metrics file {}: {e}", file.display()))?;
    }
    kubeslot_image::atomic::write_file_mode(file, out.as_bytes(), 0o644)
        .map_err(|e| anyhow::anyhow!("metrics file {}: {e}", file.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metrics_file_counts_on_and_names_the_image() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("textfile/kubeslot.prom");
        let mut m = Metrics {
            digest: Some("sha256:ab".into()),
            slot: Some("kube2".into()),
            image: Some("r/x:1".into()),
            result: "committed".into(),
            finished_unix: 7,
            drain_duration_ms: Some(1500),
            evicted_pods: 2,
            ..Metrics::default()
        };
        write_metrics(&f, &m).unwrap();
        m.result = "rolled-back".into();
        write_metrics(&f, &m).unwrap();
        write_metrics(&f, &m).unwrap();
        let t = std::fs::read_to_string(&f).unwrap();
        assert!(
            t.contains(
                "kubeslot_image_info{digest=\"sha256:ab\",slot=\"kube2\",image=\"r/x:1\"} 1\n"
            ),
            "{t}"
        );
        assert!(
            t.contains("kubeslot_activations_total{result=\"committed\"} 1\n"),
            "{t}"
        );
        assert!(
            t.contains("kubeslot_activations_total{result=\"rolled-back\"} 2\n"),
            "{t}"
        );
        assert!(t.contains("kubeslot_drain_duration_seconds 1.500\n"), "{t}");
        assert!(t.contains("kubeslot_flip_downtime_seconds NaN\n"), "{t}");
        assert!(t.contains("kubeslot_evicted_pods 2\n"), "{t}");
    }
}
