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

/// What a metrics file says (`status` shows it): the image, activations
/// by result and the last run's figures. `NaN` and absent figures are
/// `None`.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct View {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    pub activations: BTreeMap<String, u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_activation_unix: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flip_downtime_seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drain_duration_seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evicted_pods: Option<u64>,
}

/// Reads back what [`write_metrics`] wrote (other lines are ignored).
pub fn read_metrics(text: &str) -> View {
    let mut v = View::default();
    let num = |s: &str| s.trim().parse::<f64>().ok().filter(|f| f.is_finite());
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (name, rest) = match line.split_once('{') {
            Some((n, r)) => (n, r),
            None => (line.split(' ').next().unwrap_or(""), ""),
        };
        let (labels, value) = match rest.rsplit_once("} ") {
            Some((l, val)) => (labels_of(l), val),
            None => (BTreeMap::new(), line.split_once(' ').map_or("", |x| x.1)),
        };
        let some = |k: &str| labels.get(k).filter(|s| !s.is_empty()).cloned();
        match name {
            "kubeslot_image_info" => {
                v.digest = some("digest");
                v.slot = some("slot");
                v.image = some("image");
            }
            "kubeslot_activations_total" => {
                if let (Some(r), Some(n)) = (labels.get("result"), num(value)) {
                    v.activations.insert(r.clone(), n as u64);
                }
            }
            "kubeslot_last_activation_timestamp_seconds" => {
                v.last_activation_unix = num(value).map(|f| f as u64)
            }
            "kubeslot_flip_downtime_seconds" => v.flip_downtime_seconds = num(value),
            "kubeslot_drain_duration_seconds" => v.drain_duration_seconds = num(value),
            "kubeslot_evicted_pods" => v.evicted_pods = num(value).map(|f| f as u64),
            _ => {}
        }
    }
    v
}

/// `k="v",...` with the text format's escapes (`\\`, `\"`, `\n`).
fn labels_of(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut chars = s.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() || chars.next() != Some('"') {
            return out;
        }
        let mut val = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => match chars.next() {
                    Some('n') => val.push('\n'),
                    Some(o) => val.push(o),
                    None => break,
                },
                o => val.push(o),
            }
        }
        out.insert(key.trim_start_matches(',').to_string(), val);
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
}

impl View {
    /// One line for `status`.
    pub fn to_line(&self) -> String {
        let image = match (&self.image, &self.digest, &self.slot) {
            (Some(i), Some(d), Some(s)) => format!("{i} ({d}) in {s}"),
            (_, _, Some(s)) => format!("the image in {s}"),
            _ => "no image".to_string(),
        };
        let acts: Vec<String> = self
            .activations
            .iter()
            .map(|(r, n)| format!("{r} {n}"))
            .collect();
        let mut line = format!(
            "{image}; activations: {}",
            if acts.is_empty() {
                "none".to_string()
            } else {
                acts.join(", ")
            }
        );
        if let Some(t) = self.last_activation_unix {
            line += &format!("; last at {t} (unix)");
        }
        if let Some(d) = self.flip_downtime_seconds {
            line += &format!("; flip downtime {d:.3} s");
        }
        if let Some(d) = self.drain_duration_seconds {
            line += &format!("; drain {d:.3} s");
        }
        if let Some(n) = self.evicted_pods {
            line += &format!(", {n} pods evicted");
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metrics_file_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("kubeslot.prom");
        let m = Metrics {
            digest: Some("sha256:ab".into()),
            slot: Some("kube1".into()),
            image: Some("r/x:1 \"q\"".into()),
            result: "committed".into(),
            finished_unix: 1700000000,
            flip_downtime_ms: Some(2250),
            drain_duration_ms: None,
            evicted_pods: 3,
        };
        write_metrics(&f, &m).unwrap();
        write_metrics(
            &f,
            &Metrics {
                result: "drain-blocked".into(),
                ..m.clone()
            },
        )
        .unwrap();
        let v = read_metrics(&std::fs::read_to_string(&f).unwrap());
        assert_eq!(v.digest.as_deref(), Some("sha256:ab"));
        assert_eq!(v.slot.as_deref(), Some("kube1"));
        assert_eq!(v.image.as_deref(), Some("r/x:1 \"q\""));
        assert_eq!(
            v.activations,
            BTreeMap::from([("committed".into(), 1), ("drain-blocked".into(), 1)])
        );
        assert_eq!(v.last_activation_unix, Some(1700000000));
        assert_eq!(v.flip_downtime_seconds, Some(2.25));
        assert_eq!(v.drain_duration_seconds, None, "NaN is no figure");
        assert_eq!(v.evicted_pods, Some(3));
        assert_eq!(
            v.to_line(),
            "r/x:1 \"q\" (sha256:ab) in kube1; activations: committed 1, drain-blocked 1; last at 1700000000 (unix); flip downtime 2.250 s, 3 pods evicted"
        );
        // a rollback's file names the slot only
        let v = read_metrics("kubeslot_image_info{digest=\"\",slot=\"kube2\",image=\"\"} 1\n");
        assert_eq!((v.digest, v.slot.as_deref()), (None, Some("kube2")));
    }

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
