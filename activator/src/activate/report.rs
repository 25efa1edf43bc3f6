//! `report.json`: what the last run did, in the spirit of
//! aks-node-controller's `provision.json` (exit code, error, image digest,
//! slot, a timestamp per phase, download counts, the boot it ran in and
//! its datapoints: milliseconds from the unit's start to resolved,
//! verified, staged, machine started, kubelet healthy, committed), and a
//! failed machine's last journal lines.
//!
//! Given the root handle; written atomically at the end of every run that
//! changes state — also when the config cannot be read, so an operator (or a
//! provisioning system polling the file) always learns why. It does not
//! decide exit codes beyond the table below; the CLI maps errors onto it.

use kubeslot_image::atomic::{self, AtomicError};
use kubeslot_image::time::now_rfc3339;
use kubeslot_image::Digest;
use serde::{Deserialize, Serialize};

use crate::gate::diagnostics::Diagnostics;
use crate::paths::Root;
use crate::slot::Slot;
use kubeslot_image::retry::Traffic;

/// Exit codes (also in the report). Non-zero codes below 64 stay clear of
/// the shell's and systemd's reserved ranges.
pub mod exit {
    /// Committed, or nothing to change.
    pub const OK: i32 = 0;
    /// Anything else: I/O, state, staging, systemd, an unfinished recovery.
    pub const FAILED: i32 = 1;
    /// The new machine failed its health gate; the old one runs again.
    pub const ROLLED_BACK: i32 = 2;
    /// The config cannot be read or is invalid.
    pub const CONFIG: i32 = 3;
    /// The desired image failed before and is not retried automatically.
    pub const BAD_IMAGE: i32 = 4;
    /// Another run holds the lock.
    pub const BUSY: i32 = 5;
    /// The drain before the flip did not finish (a budget held a pod past
    /// `cluster.drain.timeout_secs`, a pod it may not evict, or no API
    /// with `cluster.drain.required`): no flip, the Node uncordoned.
    pub const DRAIN: i32 = 8;
}

/// The drain of a run: the Node, what it came to, which pods went, which
/// stayed and why.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainSummary {
    pub node: String,
    /// `drained`, `blocked`, `refused`, `failed`, `undrained` (no API,
    /// flipped anyway), `unavailable` (no API, flip refused).
    pub result: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evicted: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
    /// Pods still there when the drain gave up, with the budget that held
    /// each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stuck: Vec<crate::cluster::drain::Stuck>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Whether kubeslot cordoned the Node (an operator's cordon stays).
    #[serde(default)]
    pub cordoned: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl DrainSummary {
    fn to_text(&self) -> String {
        let mut s = format!("  drain of node {}: {}", self.node, self.result);
        if let Some(ms) = self.duration_ms {
            s += &format!(" in {:.1} s", ms as f64 / 1000.0);
        }
        if !self.evicted.is_empty() {
            s += &format!("; evicted {}", self.evicted.join(", "));
        }
        s.push('\n');
        for st in &self.stuck {
            s += &format!(
                "    still there: {}{}: {}\n",
                st.pod,
                st.budget
                    .as_ref()
                    .map_or(String::new(), |b| format!(" (budget {b})")),
                st.why
            );
        }
        if let Some(n) = &self.note {
            s += &format!("    {n}\n");
        }
        s
    }
}

/// What a run ended in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Nothing to change; the active machine runs the desired image.
    UpToDate,
    /// A new slot was committed.
    Committed,
    /// The committed node was not running (after a reboot, or stopped by
    /// hand); the run started it and it passed the health gate.
    Started,
    /// Only staged (`fetch`); nothing was flipped.
    Staged,
    /// The new machine failed; the old one runs again.
    RolledBack,
    /// The run failed before touching any machine, or could not recover.
    Failed,
    /// A following host found a release it may not take yet (its wave or
    /// the maintenance window is not open): `rollout` says until when.
    Waiting,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Phase {
    pub name: String,
    pub started: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished: Option<String>,
    /// Bytes the activator read during the phase (`rchar` of
    /// `/proc/self/io`: every read(2), from the page cache too): staging
    /// reads each blob once and no unpacked file again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_bytes: Option<u64>,
    /// `rchar` when the phase started; gone once it finished.
    #[serde(skip)]
    rchar_at_start: Option<u64>,
}

/// Blob transfer counts reported by staging.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Downloads {
    pub blobs_fetched: u64,
    pub bytes_fetched: u64,
    pub blobs_reused: u64,
    /// Overlay slots: layers unpacked into the layer store by this run,
    /// and layers it found there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers_unpacked: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers_reused: Option<u64>,
}

impl From<&crate::fetch::store::FetchReport> for Downloads {
    fn from(r: &crate::fetch::store::FetchReport) -> Self {
        Downloads {
            blobs_fetched: r.downloaded_blobs,
            bytes_fetched: r.downloaded_bytes,
            blobs_reused: r.reused_blobs,
            layers_unpacked: None,
            layers_reused: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub command: String,
    pub exit_code: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The image's platform manifest digest: what its signature covers for
    /// this host, and what the state, the bad list and `status` key it by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<Digest>,
    /// The digest the reference resolved to (an index), when it differs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_digest: Option<Digest>,
    /// The slot the run switched to (or staged into).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<Slot>,
    /// The slot that was active when the run started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_slot: Option<Slot>,
    /// What recovery did with a dead run's leftovers, if anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovered: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downloads: Option<Downloads>,
    /// What reconciling with systemd found wrong and the run went on
    /// with: the committed node did not come up when started (a flip to
    /// another image then proceeds with it treated as down).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconcile: Option<String>,
    /// What happened to the host settings (sysctl and modules-load
    /// drop-ins) before a flip, when anything did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_settings: Option<String>,
    /// The preflight checks before a flip that did not simply pass
    /// (failed, ignored, warned).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preflight: Vec<crate::gate::preflight::Finding>,
    /// What the health gate could not check (the kubelet answer's owner
    /// on a root whose `/proc` cannot tell), when it passed all the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<String>,
    /// The drain before the flip (issue 38), when the cluster is configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainSummary>,
    /// How the staged slot's tree was made (`overlay` or `copy`) and, when
    /// the config left it open and overlay could not be used, why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot_mode: Option<String>,
    /// Garbage collection after a committed flip (`crate::host::gc`): blobs,
    /// partials and layer dirs neither slot needs any more, removed; or why
    /// it failed (the commit stands either way).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gc: Option<String>,
    /// What the run asked its registries: requests sent (retries included),
    /// answers that were 429/503, and the time spent waiting before asking
    /// again. Absent when the run sent no request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry_requests: Option<Traffic>,
    /// A following host's gates for the image found: its release
    /// statement, the node's wave and the maintenance window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<crate::activate::follow::Admission>,
    /// The boot the run happened in (`/proc/sys/kernel/random/boot_id`):
    /// `wait --provisioned` waits for a commit of this boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// When the run got where (milliseconds from the unit's start).
    #[serde(default, skip_serializing_if = "Datapoints::is_empty")]
    pub datapoints: Datapoints,
    /// A machine that failed its gate: its kubelet's and containerd's last
    /// journal lines and failed units, secrets redacted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnostics: Option<Diagnostics>,
    pub started: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished: Option<String>,
    pub phases: Vec<Phase>,
}

impl Report {
    pub fn new(command: &str) -> Report {
        Report {
            command: command.to_string(),
            exit_code: exit::OK,
            error: None,
            outcome: None,
            image: None,
            digest: None,
            index_digest: None,
            slot: None,
            previous_slot: None,
            recovered: None,
            reconcile: None,
            downloads: None,
            host_settings: None,
            preflight: Vec::new(),
            health: None,
            drain: None,
            slot_mode: None,
            gc: None,
            registry_requests: None,
            rollout: None,
            boot_id: None,
            datapoints: Datapoints::default(),
            diagnostics: None,
            started: now_rfc3339(),
            finished: None,
            phases: Vec::new(),
        }
    }

    /// Opens a phase (closing the previous one).
    pub fn phase(&mut self, name: &str) {
        crate::progress::line(|| format!("{}: {name}", self.command));
        self.end_phase();
        self.phases.push(Phase {
            name: name.to_string(),
            started: now_rfc3339(),
            finished: None,
            read_bytes: None,
            rchar_at_start: rchar(),
        });
    }

    pub fn end_phase(&mut self) {
        if let Some(p) = self.phases.last_mut() {
            if p.finished.is_none() {
                p.finished = Some(now_rfc3339());
                if let (Some(start), Some(now)) = (p.rchar_at_start.take(), rchar()) {
                    p.read_bytes = Some(now.saturating_sub(start));
                }
            }
        }
    }

    /// Stamps the end and the outcome of the run.
    pub fn finish(&mut self, exit_code: i32, error: Option<String>) {
        self.end_phase();
        self.exit_code = exit_code;
        self.error = error;
        if self.outcome.is_none() && exit_code != exit::OK {
            self.outcome = Some(Outcome::Failed);
        }
        self.finished = Some(now_rfc3339());
    }

    /// Records when the run reached `point` (the first time only).
    pub fn mark(&mut self, point: Datapoint) {
        let Some(ms) = since_unit_start_ms() else {
            return;
        };
        let slot = self.datapoints.slot(point);
        if slot.is_none() {
            *slot = Some(ms);
        }
        if self.datapoints.unit_started_since_boot_ms.is_none() {
            self.datapoints.unit_started_since_boot_ms = process_started_since_boot_ms();
        }
    }

    /// Writes `report.json`, stamped with the boot it is written in.
    pub fn save(&self, root: &Root) -> Result<(), AtomicError> {
        let dir = root.state_dir();
        std::fs::create_dir_all(&dir).map_err(|source| AtomicError {
            path: dir.clone(),
            source,
        })?;
        let mut stamped;
        let mut report = self;
        if self.boot_id.is_none() {
            stamped = self.clone();
            stamped.boot_id = boot_id(root);
            report = &stamped;
        }
        let mut bytes = serde_json::to_vec_pretty(report).expect("report serialises");
        bytes.push(b'\n');
        atomic::write_file(&root.report_file(), &bytes)
    }

    /// The last report, if one was written.
    pub fn load(root: &Root) -> Option<Report> {
        let bytes = std::fs::read(root.report_file()).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Human-readable summary for `status` and `wait`.
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "last run: {} (exit {}, {})\n",
            self.command,
            self.exit_code,
            self.outcome
                .map(|o| crate::state::serde_name(&o))
                .unwrap_or_else(|| "unfinished".into())
        );
        if let Some(e) = &self.error {
            s += &format!("  error: {e}\n");
        }
        if let Some(i) = &self.image {
            s += &format!("  image: {i}\n");
        }
        if let Some(d) = &self.digest {
            s += &format!("  digest: {d}\n");
        }
        if let Some(d) = &self.index_digest {
            s += &format!("  index: {d}\n");
        }
        if let Some(sl) = self.slot {
            s += &format!("  slot: {sl}\n");
        }
        if let Some(r) = &self.rollout {
            s += &r.to_text();
        }
        if let Some(r) = &self.recovered {
            s += &format!("  recovered: {r}\n");
        }
        if let Some(r) = &self.reconcile {
            s += &format!("  reconcile: {r}\n");
        }
        if let Some(h) = &self.host_settings {
            s += &format!("  host settings: {h}\n");
        }
        if let Some(d) = &self.drain {
            s += &d.to_text();
        }
        for f in &self.preflight {
            s += &format!(
                "  preflight {} {}{}: seen {}; needed {}\n",
                crate::state::serde_name(&f.status),
                f.name,
                if f.ignored { " (ignored)" } else { "" },
                f.seen,
                f.needed
            );
        }
        if let Some(d) = self.downloads {
            s += &format!(
                "  downloads: {} blobs fetched ({} bytes), {} reused\n",
                d.blobs_fetched, d.bytes_fetched, d.blobs_reused
            );
        }
        if let Some(t) = self.registry_requests {
            s += &format!(
                "  registry requests: {} sent, {} answered 429/503, waited {:.1} s\n",
                t.sent,
                t.throttled,
                t.waited_ms as f64 / 1000.0
            );
        }
        if !self.datapoints.is_empty() {
            s += &format!("  datapoints: {}\n", self.datapoints.to_text());
        }
        if let Some(d) = &self.diagnostics {
            s += &d.to_text();
        }
        s += &format!(
            "  started {} finished {}\n",
            self.started,
            self.finished.as_deref().unwrap_or("-")
        );
        for p in &self.phases {
            s += &format!(
                "    {:<12} {} .. {}\n",
                p.name,
                p.started,
                p.finished.as_deref().unwrap_or("-")
            );
        }
        s
    }
}

/// The points of a run its datapoints record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Datapoint {
    Resolved,
    Verified,
    Staged,
    MachineStarted,
    KubeletHealthy,
    Committed,
}

/// Milliseconds from the unit's start (the activator process's start,
/// which is the oneshot unit's `ExecStart`) to each point a run reached,
/// and when the unit started after boot: what a provisioning pipeline
/// charts (aks-node-controller's `provision.json` has the same idea).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Datapoints {
    /// The unit's start, milliseconds after the host booted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit_started_since_boot_ms: Option<u64>,
    /// The reference resolved to a digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_ms: Option<u64>,
    /// Its signature and the trust policy checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_ms: Option<u64>,
    /// The slot's tree in place (fetched and unpacked, or reused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staged_ms: Option<u64>,
    /// The machine's unit started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_started_ms: Option<u64>,
    /// The health gate passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet_healthy_ms: Option<u64>,
    /// The flip committed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub committed_ms: Option<u64>,
}

impl Datapoints {
    pub fn is_empty(&self) -> bool {
        *self == Datapoints::default()
    }

    fn slot(&mut self, p: Datapoint) -> &mut Option<u64> {
        match p {
            Datapoint::Resolved => &mut self.resolved_ms,
            Datapoint::Verified => &mut self.verified_ms,
            Datapoint::Staged => &mut self.staged_ms,
            Datapoint::MachineStarted => &mut self.machine_started_ms,
            Datapoint::KubeletHealthy => &mut self.kubelet_healthy_ms,
            Datapoint::Committed => &mut self.committed_ms,
        }
    }

    fn to_text(&self) -> String {
        let mut parts: Vec<String> = [
            ("resolved", self.resolved_ms),
            ("verified", self.verified_ms),
            ("staged", self.staged_ms),
            ("machine started", self.machine_started_ms),
            ("kubelet healthy", self.kubelet_healthy_ms),
            ("committed", self.committed_ms),
        ]
        .iter()
        .filter_map(|(n, v)| v.map(|v| format!("{n} +{v} ms")))
        .collect();
        if let Some(b) = self.unit_started_since_boot_ms {
            parts.push(format!(
                "from the unit's start, {:.1} s after boot",
                b as f64 / 1000.0
            ));
        }
        parts.join(", ")
    }
}

/// The host's uptime (`CLOCK_BOOTTIME`, from `/proc/uptime`) in ms.
fn uptime_ms() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/uptime").ok()?;
    let secs: f64 = text.split_whitespace().next()?.parse().ok()?;
    Some((secs * 1000.0) as u64)
}

/// When this process started, ms after boot (`/proc/self/stat` field 22,
/// in the kernel's fixed 100 ticks per second).
fn process_started_since_boot_ms() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // the command name (field 2) may hold spaces: count after its ')'
    let after = stat.rsplit_once(')')?.1;
    let ticks: u64 = after.split_whitespace().nth(19)?.parse().ok()?;
    Some(ticks.saturating_mul(10))
}

fn since_unit_start_ms() -> Option<u64> {
    Some(uptime_ms()?.saturating_sub(process_started_since_boot_ms()?))
}

impl Report {
    /// Whether this report says the node is provisioned in the boot
    /// `boot_id` (the root's now): an `activate` or `rollback` of that
    /// boot ended with the committed node running (committed, started, or
    /// up to date), exit 0. What `wait --provisioned` waits for.
    pub fn provisioned_in(&self, boot_id: Option<&str>) -> bool {
        self.boot_id.as_deref() == boot_id
            && self.exit_code == exit::OK
            && matches!(self.command.as_str(), "activate" | "rollback")
            && matches!(
                self.outcome,
                Some(Outcome::Committed | Outcome::Started | Outcome::UpToDate)
            )
    }
}

/// The root's boot id, if it has one.
pub fn boot_id(root: &Root) -> Option<String> {
    std::fs::read_to_string(root.boot_id())
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// This process's `rchar` (`/proc/self/io`); `None` where the kernel
/// does not account I/O per task.
fn rchar() -> Option<u64> {
    let io = std::fs::read_to_string("/proc/self/io").ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("rchar:"))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_close_in_order_and_failures_get_an_outcome() {
        let mut r = Report::new("activate");
        r.phase("lock");
        r.phase("stage");
        r.finish(exit::CONFIG, Some("config x: bad".into()));
        assert!(r.phases.iter().all(|p| p.finished.is_some()));
        assert_eq!(r.outcome, Some(Outcome::Failed));
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        r.save(&root).unwrap();
        assert_eq!(Report::load(&root).unwrap(), r);
    }

    #[test]
    fn a_phase_counts_the_bytes_read_during_it() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, vec![7u8; 3 << 20]).unwrap();
        let mut r = Report::new("activate");
        r.phase("stage");
        assert_eq!(std::fs::read(&f).unwrap().len(), 3 << 20);
        r.phase("render");
        r.finish(exit::OK, None);
        let read = |i: usize| r.phases[i].read_bytes.unwrap();
        assert!(read(0) >= 3 << 20, "{}", read(0));
        // (other tests of this process read too: no upper bound here)
        assert!(r.phases[1].read_bytes.is_some());
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["phases"][0]["read_bytes"], read(0));
    }

    #[test]
    fn datapoints_count_from_the_process_start_and_keep_the_first_time() {
        let mut r = Report::new("activate");
        r.mark(Datapoint::Resolved);
        std::thread::sleep(std::time::Duration::from_millis(30));
        r.mark(Datapoint::Committed);
        let first = r.datapoints.resolved_ms.unwrap();
        r.mark(Datapoint::Resolved);
        assert_eq!(r.datapoints.resolved_ms, Some(first));
        let committed = r.datapoints.committed_ms.unwrap();
        assert!(committed >= first + 20, "{:?}", r.datapoints);
        // the process started after boot, and not in the future
        let boot = r.datapoints.unit_started_since_boot_ms.unwrap();
        assert!(boot > 0 && boot <= uptime_ms().unwrap());
        assert!(
            r.to_text().contains("  datapoints: resolved +"),
            "{}",
            r.to_text()
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["datapoints"]["committed_ms"], committed);
        assert!(json["datapoints"].get("staged_ms").is_none());
    }

    #[test]
    fn a_saved_report_names_the_boot_it_was_written_in() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        std::fs::create_dir_all(root.boot_id().parent().unwrap()).unwrap();
        std::fs::write(root.boot_id(), "4a1f\n").unwrap();
        let r = Report::new("activate");
        r.save(&root).unwrap();
        assert_eq!(
            Report::load(&root).unwrap().boot_id.as_deref(),
            Some("4a1f")
        );
    }
}
