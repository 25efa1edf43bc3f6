//! The drain around a flip (issue 38): before the running machine stops,
//! the Node is cordoned (recorded in the state first, so that a run killed
//! at any point leaves the next run, or the boot's, a record to uncordon
//! from) and its pods evicted; after the commit or the rollback, or when
//! the drain gives up, it is uncordoned and the record cleared.

use std::path::PathBuf;
use std::time::Duration;

use crate::activate::report::{DrainSummary, Report};
use crate::cluster::drain::{self, DrainError};
use crate::cluster::report as cluster_report;
use crate::cluster::{node, pods, Client};
use crate::config::{Cluster, Config};
use crate::failpoint;
use crate::gate::cluster::{self as gate_cluster, ClusterGate};
use crate::gate::health::Failure;
use crate::progress;
use crate::slot::Slot;
use crate::state::{Cordoned, State};

use super::{ActivateError, Run};

/// The cluster as one run sees it (from the config the run flips with).
#[derive(Clone, Debug)]
pub(super) struct ClusterRun {
    pub cfg: Cluster,
    pub node: String,
    pub kubeconfig: PathBuf,
    /// The machine whose host files the kubeconfig's paths name.
    pub machine: String,
    /// The kubelet version the image flipped to carries (the cluster gate
    /// checks the Node reports it); `None`: not known, not checked.
    pub kubelet_version: Option<String>,
}

impl ClusterRun {
    /// `None` when the config has no `cluster` section.
    pub(super) fn of(
        run: &Run<'_>,
        config: &Config,
        machine: Slot,
    ) -> Result<Option<ClusterRun>, ActivateError> {
        let Some(cfg) = config.cluster.clone() else {
            return Ok(None);
        };
        let node = crate::render::node_name_of(run.root, config)?;
        let kubeconfig = node::kubeconfig_path(
            run.root,
            &cfg,
            config.kubelet.exec_credential.is_some(),
            machine.machine(),
        );
        Ok(Some(ClusterRun {
            cfg,
            node,
            kubeconfig,
            machine: machine.machine().to_string(),
            kubelet_version: None,
        }))
    }

    fn client(&self, run: &Run<'_>) -> anyhow::Result<Client> {
        node::client(
            run.root,
            &self.machine,
            &self.kubeconfig,
            Duration::from_secs(self.cfg.request_timeout_secs),
        )
    }
}

impl Run<'_> {
    /// Before the running machine stops: cordon and evict. `Ok` lets the
    /// flip go on (drained, or undrained where the config allows it, the
    /// report says which); an error ends the run before anything stopped,
    /// the Node uncordoned.
    pub(super) fn drain_before_stop(
        &self,
        state: &mut State,
        report: &mut Report,
    ) -> Result<(), ActivateError> {
        let Some(c) = self.cluster.get().cloned().flatten() else {
            return Ok(());
        };
        self.drain_node(&c, state, report)
    }

    /// A reconcile about to stop the machine of a dead run's try that runs
    /// (recovery's rollback of a machine that failed its gate now, which
    /// the Node's pods may be on): drained first, with the `cluster`
    /// section of that slot's config. The line for `recovered`, `None`
    /// when nothing was to drain. A drain that does not finish is said
    /// there and the machine is stopped all the same: it failed its gate,
    /// and keeping it up would keep the node on an image never committed.
    pub(super) fn drain_before_recovery_stop(
        &self,
        state: &mut State,
        to: Slot,
    ) -> Result<Option<String>, ActivateError> {
        let Ok(config) = super::load_slot_config(self.root, to) else {
            return Ok(None);
        };
        // (systemd is asked only with a cluster to drain)
        let Some(c) = ClusterRun::of(self, &config, to)? else {
            return Ok(None);
        };
        if !self.running(to)? {
            return Ok(None);
        }
        let mut scratch = Report::new("recover");
        let done = self.drain_node(&c, state, &mut scratch);
        let Some(d) = scratch.drain else {
            return Ok(None);
        };
        let evicted = if d.evicted.is_empty() {
            "no pods".to_string()
        } else {
            d.evicted.join(", ")
        };
        Ok(Some(match done {
            Ok(()) => format!(
                "drained node {} before stopping {to} ({}: evicted {evicted})",
                d.node, d.result
            ),
            Err(e) => format!("stopping {to} undrained: {e}"),
        }))
    }

    /// Cordons the Node and evicts its pods as `c` says (see
    /// [`Run::drain_before_stop`]); `report.drain` tells how it went.
    fn drain_node(
        &self,
        c: &ClusterRun,
        state: &mut State,
        report: &mut Report,
    ) -> Result<(), ActivateError> {
        if !c.cfg.drain.enabled {
            return Ok(());
        }
        report.phase("drain");
        let mut summary = DrainSummary {
            node: c.node.clone(),
            ..DrainSummary::default()
        };
        let no_api =
            |summary: &mut DrainSummary, why: String| no_api(c.cfg.drain.required, summary, why);
        let client = match c.client(self) {
            Ok(cl) => cl,
            Err(e) => {
                let r = no_api(&mut summary, kubeslot_image::error_chain(&*e));
                report.drain = Some(summary);
                return r;
            }
        };
        // recorded before the cordon: a run killed after it leaves the
        // record (an extra uncordon of a Node nobody cordoned is harmless
        // only when kubeslot cordoned it: so the record is dropped again
        // when the Node was cordoned already, unless a dead run's record
        // says the cordon is kubeslot's)
        let ours_already = state.cordoned.as_ref().is_some_and(|r| r.node == c.node);
        state.cordoned = Some(Cordoned {
            node: c.node.clone(),
            kubeconfig: c.kubeconfig.clone(),
            machine: c.machine.clone(),
            request_timeout_secs: c.cfg.request_timeout_secs,
        });
        self.save(state)?;
        match drain::cordon(&client, &c.node) {
            Ok(ours) => {
                let ours = ours || ours_already;
                summary.cordoned = ours;
                if !ours {
                    state.cordoned = None;
                    self.save(state)?;
                }
            }
            Err(e) => {
                state.cordoned = None;
                self.save(state)?;
                let r = if e.is_unreachable() {
                    no_api(&mut summary, e.to_string())
                } else {
                    summary.result = "failed".into();
                    Err(ActivateError::Drain(format!(
                        "cordoning node {}: {e}",
                        c.node
                    )))
                };
                report.drain = Some(summary);
                return r;
            }
        }
        progress::line(|| format!("drain: node {} cordoned", c.node));
        self.tell(Tell {
            phase: "draining",
            annotations: Vec::new(),
            event: None,
        });
        failpoint::hit("after-cordon");
        let settings = node::drain_settings(&c.cfg);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let result = pods::read_plan(&client, &c.node, &settings.options, now)
            .map_err(|e| DrainError::Read {
                node: c.node.clone(),
                message: kubeslot_image::error_chain(&*e),
            })
            .and_then(|plan| {
                drain::evict(&client, &c.node, &plan, &settings, &|l| {
                    progress::line(|| format!("drain: {l}"))
                })
            });
        match result {
            Ok(d) => {
                summary.result = "drained".into();
                summary.evicted = d.evicted;
                summary.skipped = d.skipped;
                summary.duration_ms = Some(d.duration_ms);
                self.tell(drained_tell(&summary));
                report.drain = Some(summary);
                failpoint::hit("after-drain");
                Ok(())
            }
            Err(e) => {
                summary.result = match &e {
                    DrainError::Blocked { stuck, .. } => {
                        summary.stuck = stuck.clone();
                        "blocked"
                    }
                    DrainError::Refused { .. } => "refused",
                    _ => "failed",
                }
                .into();
                report.drain = Some(summary);
                // no flip: the Node takes pods again
                let line = self.uncordon_recorded(state);
                note(report, line);
                Err(ActivateError::Drain(e.to_string()))
            }
        }
    }

    /// The cluster gate after `/healthz` and CRI passed (none without a
    /// `cluster` section), until `deadline`: the health gate's timeout.
    pub(super) fn cluster_gate(
        &self,
        slot: Slot,
        flip_at: i64,
        deadline: std::time::Instant,
        interval: Duration,
        report: &mut Report,
    ) -> Result<(), Failure> {
        let Some(c) = self.cluster.get().cloned().flatten() else {
            return Ok(());
        };
        if c.cfg.gate.skip_node_ready && c.cfg.gate.daemonsets.is_empty() {
            return Ok(());
        }
        report.phase("cluster-gate");
        self.tell(Tell {
            phase: "gating",
            annotations: Vec::new(),
            event: None,
        });
        let make = || c.client(self);
        let g = ClusterGate {
            node: c.node.clone(),
            node_ready: !c.cfg.gate.skip_node_ready,
            kubelet_version: c.kubelet_version.clone(),
            daemonsets: c.cfg.gate.daemonsets.clone(),
            required: c.cfg.drain.required,
            client: &make,
        };
        let note = gate_cluster::wait(&g, slot.machine(), flip_at, deadline, interval)?;
        let line = note
            .unwrap_or_else(|| format!("the API server sees node {} Ready after the flip", c.node));
        report.health = Some(match report.health.take() {
            Some(h) => format!("{h}; {line}"),
            None => line,
        });
        Ok(())
    }

    /// Uncordons the Node the state records as kubeslot's and clears the
    /// record; a failure is the report's note and the record stays for the
    /// next run. Returns what it did, for recovery's line.
    pub(super) fn uncordon_recorded(&self, state: &mut State) -> Option<String> {
        let rec = state.cordoned.clone()?;
        let done = node::client(
            self.root,
            &rec.machine,
            &rec.kubeconfig,
            Duration::from_secs(rec.request_timeout_secs),
        )
        .and_then(|cl| drain::uncordon(&cl, &rec.node).map_err(anyhow::Error::new));
        let line = match done {
            Ok(()) => {
                state.cordoned = None;
                if let Err(e) = self.save(state) {
                    format!(
                        "uncordoned node {}, but the state could not be saved: {e}",
                        rec.node
                    )
                } else {
                    format!("uncordoned node {}", rec.node)
                }
            }
            Err(e) => format!(
                "node {} is still cordoned (kubeslot's cordon; the next run uncordons it): {}",
                rec.node,
                kubeslot_image::error_chain(&*e)
            ),
        };
        progress::line(|| format!("drain: {line}"));
        Some(line)
    }
}

/// What one step tells the cluster: the phase annotation, more
/// annotations, and an Event (`reason`, warning, message).
pub(super) struct Tell<'a> {
    pub phase: &'static str,
    pub annotations: Vec<(&'a str, String)>,
    pub event: Option<(&'static str, bool, String)>,
}

impl Run<'_> {
    /// Annotates the Node and writes the Event, with the node's own
    /// credentials; best effort (a failure is a progress line).
    pub(super) fn tell(&self, t: Tell<'_>) {
        let Some(c) = self.cluster.get().cloned().flatten() else {
            return;
        };
        let client = match c.client(self) {
            Ok(cl) => cl,
            Err(e) => {
                progress::line(|| format!("cluster: not told ({}): {e}", t.phase));
                return;
            }
        };
        let mut values = vec![("phase", t.phase.to_string())];
        values.extend(t.annotations);
        if let Err(e) =
            cluster_report::annotate(&client, &c.node, &c.cfg.annotation_prefix, &values)
        {
            progress::line(|| format!("cluster: annotating node {}: {e}", c.node));
        }
        if let Some((reason, warning, message)) = t.event {
            if let Err(e) = cluster_report::event(&client, &c.node, reason, warning, &message) {
                progress::line(|| format!("cluster: event {reason}: {e}"));
            }
        }
    }

    /// The run's end as the cluster and the host see it: annotations and
    /// an Event for the commit or the rollback, the metrics file.
    pub(super) fn tell_result(
        &self,
        report: &Report,
        to: Slot,
        result: &Result<(), ActivateError>,
    ) {
        let Some(c) = self.cluster.get().cloned().flatten() else {
            return;
        };
        let image = report.image.clone().unwrap_or_default();
        let digest = report.digest.map(|d| d.to_string()).unwrap_or_default();
        let (phase, res, reason, event) = match result {
            Ok(()) => (
                "committed",
                "committed",
                String::new(),
                (
                    "KubeslotCommit",
                    false,
                    format!("committed {image} ({digest}) in {to}"),
                ),
            ),
            Err(e @ ActivateError::RolledBack { .. }) => (
                "rolled-back",
                "rolled-back",
                e.to_string(),
                (
                    "KubeslotRollback",
                    true,
                    format!("rolled back from {image} ({digest}): {e}"),
                ),
            ),
            Err(e @ ActivateError::Drain(_)) => (
                "committed",
                "drain-blocked",
                e.to_string(),
                ("KubeslotDrainBlocked", true, e.to_string()),
            ),
            Err(e) => (
                "committed",
                "failed",
                e.to_string(),
                ("KubeslotRollback", true, e.to_string()),
            ),
        };
        // last-digest: what this run moved to or tried, committed or not
        // (the fleet's halt counts the rollbacks of a digest by it)
        let mut annotations = vec![
            ("last-result", res.to_string()),
            ("last-reason", reason),
            ("last-digest", digest.clone()),
        ];
        if result.is_ok() {
            annotations.extend([
                ("image", image.clone()),
                ("digest", digest.clone()),
                ("slot", to.to_string()),
            ]);
        }
        self.tell(Tell {
            phase,
            annotations,
            event: Some(event),
        });
        if let Some(file) = &c.cfg.metrics_file {
            let running = result.is_ok();
            let m = cluster_report::Metrics {
                digest: running.then(|| digest.clone()),
                slot: Some(if running {
                    to.to_string()
                } else {
                    c.machine.clone()
                }),
                image: running.then(|| image.clone()),
                result: res.to_string(),
                finished_unix: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
                flip_downtime_ms: report
                    .datapoints
                    .kubelet_healthy_ms
                    .zip(report.datapoints.staged_ms)
                    .map(|(h, s)| h.saturating_sub(s)),
                drain_duration_ms: report.drain.as_ref().and_then(|d| d.duration_ms),
                evicted_pods: report.drain.as_ref().map_or(0, |d| d.evicted.len()),
            };
            let path = self.root.join(&file.to_string_lossy());
            if let Err(e) = cluster_report::write_metrics(&path, &m) {
                progress::line(|| format!("cluster: {e}"));
            }
        }
    }
}

/// No API: `required` refuses the flip, else it goes on undrained.
fn no_api(required: bool, summary: &mut DrainSummary, why: String) -> Result<(), ActivateError> {
    if required {
        summary.result = "unavailable".into();
        summary.note = Some(format!(
            "no flip: the API is not reachable and cluster.drain.required is set: {why}"
        ));
        Err(ActivateError::Drain(why))
    } else {
        summary.result = "undrained".into();
        summary.note = Some(format!(
            "flipping undrained: the API is not reachable: {why}"
        ));
        Ok(())
    }
}

/// The Event of a finished drain.
fn drained_tell(summary: &DrainSummary) -> Tell<'static> {
    let evicted = if summary.evicted.is_empty() {
        "no pods".to_string()
    } else {
        summary.evicted.join(", ")
    };
    Tell {
        phase: "flipping",
        annotations: Vec::new(),
        event: Some((
            "KubeslotDrain",
            false,
            format!(
                "drained in {:.1} s: evicted {evicted}",
                summary.duration_ms.unwrap_or(0) as f64 / 1000.0
            ),
        )),
    }
}

/// Adds `line` to the report's drain note.
pub(super) fn note(report: &mut Report, line: Option<String>) {
    let (Some(line), Some(d)) = (line, report.drain.as_mut()) else {
        return;
    };
    d.note = Some(match d.note.take() {
        Some(n) => format!("{n}; {line}"),
        None => line,
    });
}

#[cfg(test)]
mod tests;
