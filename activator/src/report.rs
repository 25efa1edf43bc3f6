//! `report.json`: what the last run did, in the spirit of
//! aks-node-controller's `provision.json` (exit code, error, image digest,
//! slot, a timestamp per phase, download counts).
//!
//! Given the root handle; written atomically at the end of every run that
//! changes state — also when the config cannot be read, so an operator (or a
//! provisioning system polling the file) always learns why. It does not
//! decide exit codes beyond the table below; the CLI maps errors onto it.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::layout::{write_atomic, LayoutError};
use crate::paths::Root;
use crate::state::Slot;

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
}

/// What a run ended in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Nothing to change; the active machine runs the desired image.
    UpToDate,
    /// A new slot was committed.
    Committed,
    /// Only staged (`fetch`); nothing was flipped.
    Staged,
    /// The new machine failed; the old one runs again.
    RolledBack,
    /// The run failed before touching any machine, or could not recover.
    Failed,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Phase {
    pub name: String,
    pub started: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished: Option<String>,
}

/// Blob transfer counts reported by staging.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Downloads {
    pub blobs_fetched: u64,
    pub bytes_fetched: u64,
    pub blobs_reused: u64,
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<Digest>,
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
            slot: None,
            previous_slot: None,
            recovered: None,
            downloads: None,
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
        });
    }

    pub fn end_phase(&mut self) {
        if let Some(p) = self.phases.last_mut() {
            if p.finished.is_none() {
                p.finished = Some(now_rfc3339());
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

    pub fn save(&self, root: &Root) -> Result<(), LayoutError> {
        let dir = root.state_dir();
        std::fs::create_dir_all(&dir).map_err(|source| LayoutError::Io {
            path: dir.clone(),
            source,
        })?;
        let mut bytes = serde_json::to_vec_pretty(self).expect("report serialises");
        bytes.push(b'\n');
        write_atomic(&root.report_file(), &bytes)
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
        if let Some(sl) = self.slot {
            s += &format!("  slot: {sl}\n");
        }
        if let Some(r) = &self.recovered {
            s += &format!("  recovered: {r}\n");
        }
        if let Some(d) = self.downloads {
            s += &format!(
                "  downloads: {} blobs fetched ({} bytes), {} reused\n",
                d.blobs_fetched, d.bytes_fetched, d.blobs_reused
            );
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

/// The current time as RFC 3339 UTC with milliseconds
/// (`2026-11-23T09:43:00.123Z`).
pub fn now_rfc3339() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    rfc3339(d.as_secs() as i64, d.subsec_millis())
}

/// Formats seconds since the epoch with milliseconds,
/// `2026-11-23T10:50:00.123Z`.
pub fn rfc3339(secs: i64, millis: u32) -> String {
    let mut s = rfc3339_seconds(secs);
    s.pop(); // the 'Z'
    format!("{s}.{millis:03}Z")
}

/// Formats seconds since the epoch, `2026-11-23T10:50:00Z` (UTC, proleptic
/// Gregorian; Howard Hinnant's civil-from-days). The builder uses it for
/// image and SBOM timestamps, the report for phases.
pub fn rfc3339_seconds(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_known_instants() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(rfc3339(1_795_426_980, 0), "2026-11-23T09:43:00.000Z");
    }

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
}
