//! The flip engine: `activate`, `fetch` and `rollback` as library calls, each
//! ending in a [`Report`] that is written to `report.json` while the run lock
//! is still held.
//!
//! Given the root handle, the config path and a [`Systemd`]. The order, and
//! why each step is where it is:
//!
//! 1. lock (`lock`): two runs never interleave;
//! 2. load the state, repairing a save that died between its writes, and
//!    recover a dead run (`recover.rs`): a flip "prepared" but not tried is
//!    set aside (its slot stays staged), a flip "trying" is finished when its
//!    machine is up and passes the gate, otherwise rolled back and its image
//!    marked bad (the one try was used); a slot left dirty is emptied. This
//!    uses the config each slot was activated with (saved beside the state),
//!    so a broken new config cannot block recovery; then reconcile the state
//!    with systemd: a running machine the state does not account for
//!    (unbounded-agent's `kube1`, or anything running as the slot that is
//!    not committed) is refused with exit 3 (`adopt` takes a foreign node
//!    over), the committed slot is the one enabled at boot, and when it is
//!    not running it is started and gated (outcome `started`; also before
//!    the config is read, so a broken config cannot keep the node down
//!    after a reboot). A committed node that does not come up is noted in
//!    the report (`reconcile`) and the run goes on: an up-to-date plan then
//!    ends not-healthy (exit 1; `--force` stages the image afresh into the
//!    other slot), a flip to another image proceeds with the old node
//!    treated as down, so a broken tree never wedges the host;
//! 3. read the config, gather the host facts, open the source and resolve
//!    the reference once and verify it (fail closed): [`open_verified`]
//!    keeps the source open (an archive extracted once) for staging;
//! 4. [`plan::decide`]: up to date (no machine is touched), refused (the
//!    image failed with these host-file inputs before), or a flip, whose
//!    target slot must not be running (its tree is never touched under a
//!    machine); before a flip the host settings are written and applied
//!    and the preflight checks run (a failure refuses with exit 3, nothing
//!    of the slots changed);
//! 5. fetch and unpack beside the inactive slot (the image resolved and
//!    verified in 3, nothing resolved again; a refused blob or layer leaves
//!    the slot as it was), mark the slot dirty, swap the tree in, render and write its host files (a
//!    daemon-reload when its drop-in changed), record it staged, record
//!    "pending, prepared", then "pending, trying": from here the try counts;
//! 6. stop the old machine, start the new one, health gate ([`crate::gate::health`]);
//! 7. commit (the old slot is kept as `previous` for `rollback`; the old
//!    machine disabled at boot, then the new one enabled, then the commit
//!    saved: a crash or power loss in between boots the old node, or none,
//!    never both, and the next run's recovery decides) or roll back (stop the
//!    new machine, start the old one, check it, mark the image bad with the
//!    name of the failed check).
//!
//! [`fetch`] runs steps 1 to 4 and stages the slot (recorded staged, no host
//! files rendered, no machine touched); the next `activate` reuses it.
//! A commit records the fingerprint of the slot it leaves ([`crate::slots::fingerprint`]);
//! [`rollback`] refuses a previous slot whose tree no longer matches it.
//!
//! Every state change is one atomic [`State::save`]; the active slot's tree
//! and host files are never written by a flip (only the inactive slot's), so
//! the old machine stays bootable whatever point a crash hits. The failpoint
//! boundaries are listed in [`crate::failpoint`].
//!
//! One file per phase: `begin.rs` (steps 2 to 4, reconcile, preflight),
//! `resolve.rs` (the image opened and verified once, the inputs hash),
//! `prepare.rs` (step 5: the flip prepared in the target slot), `flip.rs`
//! (steps 6 and 7), `recover.rs`, `boot.rs` (boot enablement),
//! `rollback.rs`, `preview.rs` (`plan` and `--dry-run`: the run's start
//! without the lock and without acting). [`plan`] is the one decision all
//! of them take (pure: a situation in, a decision out); [`report`] is what
//! a run leaves in `report.json`. This file holds the entry points, the run
//! context `Run` and the error.
//!
//! It does not parse arguments or print (the `cli` modules do), and it runs
//! nothing from an image.

mod begin;
mod boot;
mod drain;
#[cfg(test)]
mod fixture;
mod fleet;
mod flip;
pub mod follow;
pub mod plan;
mod prepare;
mod preview;
mod recover;
pub mod report;
mod resolve;
mod rollback;
pub mod variant;

pub use boot::MACHINES_TARGET;
pub use preview::{preview, preview_drain, DrainPreview, Preview};
pub use resolve::{disk_use, open_verified, open_verified_paced, resolve, Rendered, Resolved};
pub use rollback::{preview_rollback, rollback, RollbackOptions, RollbackPreview};

use std::cell::OnceCell;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kubeslot_image::atomic::AtomicError;
use kubeslot_image::digest::Digest;
use kubeslot_image::retry::Pacing;
use kubeslot_image::source::SourceError;
use kubeslot_image::verify::VerifyError;

use crate::activate::plan::{Command, Reason, RollbackRefusal};
use crate::activate::report::{exit, Outcome, Report};
use crate::config::{Config, ConfigError, Health};
use crate::failpoint;
use crate::gate::health::Failure;
use crate::gate::preflight;
use crate::lock::{Lock, LockError};
use crate::paths::Root;
use crate::progress;
use crate::render::{self, HostFiles, RenderError};
use crate::slot::Slot;
use crate::slots::fingerprint::FingerprintError;
use crate::slots::overlay::OverlayError;
use crate::slots::stage::StageError;
use crate::state::{SlotState, SlotStatus, State, StateError};
use crate::systemd::{Systemd, SystemdError};

use crate::gate::health::Gate;
use begin::{begin, flip_disk_use};

/// Why a run did not end with the desired slot committed.
#[derive(Debug, thiserror::Error)]
pub enum ActivateError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Render(#[from] RenderError),
    /// The config names host facts that cannot be gathered (CA file,
    /// devices, DNS, GPUs).
    #[error("config {config}: {source}")]
    Facts {
        config: PathBuf,
        #[source]
        source: RenderError,
    },
    /// The trust policy cannot be used: a key file that is missing or not
    /// a P-256 key, or a policy that accepts nothing.
    #[error("config {config}: {source}")]
    Trust {
        config: PathBuf,
        #[source]
        source: VerifyError,
    },
    /// Refused before anything of the slots changed (see
    /// [`crate::activate::plan::decide`]).
    #[error(transparent)]
    Refused(#[from] Reason),
    #[error(transparent)]
    Stage(#[from] StageError),
    #[error(transparent)]
    Verify(#[from] VerifyError),
    /// A following host's release statement is missing, expired or not
    /// trusted: the update stops, the node untouched.
    #[error(transparent)]
    Statement(#[from] kubeslot_image::statement::StatementError),
    #[error(transparent)]
    Source(#[from] Box<SourceError>),
    /// `rollback` refused before anything changed (see
    /// [`crate::activate::plan::decide_rollback`]).
    #[error(transparent)]
    Rollback(#[from] RollbackRefusal),
    #[error(transparent)]
    Systemd(#[from] SystemdError),
    #[error(transparent)]
    Fingerprint(#[from] FingerprintError),
    #[error("slot config {path}: {reason}")]
    SlotConfig { path: PathBuf, reason: String },
    #[error(transparent)]
    Overlay(#[from] OverlayError),
    /// `slots.mode = "overlay"` on a host that cannot mount one.
    #[error("slots.mode is \"overlay\" but overlay slots do not work on this host: {reason} (set slots.mode = \"copy\", or leave it unset to fall back)")]
    OverlayUnsupported { reason: String },
    #[error("staged {got} into {slot}, but the reference resolved to {want} at the start of this run (it moved); the slot stays unused")]
    Moved {
        slot: Slot,
        want: Digest,
        got: Digest,
    },
    #[error("rollback: slot {slot}: {reason}")]
    NotIntact { slot: Slot, reason: String },
    #[error("host settings: {reason}")]
    HostSettings { reason: String },
    /// The drain before the flip did not finish: nothing was stopped.
    #[error("{0}; not flipped, the running machine is untouched")]
    Drain(String),
    /// `source.follow.annotation`: the Node's desired image not read.
    #[error("source.follow.annotation: {0}")]
    Desired(String),
    /// The new machine failed its gate; the old one runs again (or, with
    /// `old_failure`, was started but is not healthy either).
    #[error("{failure}; rolled back to {}{}", from.map_or("no machine (nothing ran before)".to_string(), |s| s.to_string()), old_failure.as_ref().map_or(String::new(), |f| format!(", which is not healthy either: {f}")))]
    RolledBack {
        failure: Failure,
        from: Option<Slot>,
        old_failure: Option<Failure>,
    },
}

impl From<SourceError> for ActivateError {
    fn from(e: SourceError) -> Self {
        ActivateError::Source(Box::new(e))
    }
}

impl ActivateError {
    /// The process exit code (see [`crate::activate::report::exit`]).
    pub fn exit_code(&self) -> i32 {
        match self {
            ActivateError::Config(_)
            | ActivateError::Facts { .. }
            | ActivateError::Trust { .. }
            | ActivateError::OverlayUnsupported { .. } => exit::CONFIG,
            ActivateError::Refused(reason) => reason.exit_code(),
            ActivateError::Rollback(refusal) => refusal.exit_code(),
            ActivateError::Lock(LockError::Busy { .. }) => exit::BUSY,
            ActivateError::Drain(_) => exit::DRAIN,
            ActivateError::RolledBack {
                old_failure: None, ..
            } => exit::ROLLED_BACK,
            _ => exit::FAILED,
        }
    }
}

/// Flags of `activate`.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Try an image even when it failed with the same inputs before.
    pub force: bool,
    /// Accept an image older than the newest committed release of its
    /// identity (`--allow-downgrade`; also `trust.allow_downgrade`).
    pub allow_downgrade: bool,
}

/// What a run left: its report, and whether `report.json` could be written.
#[derive(Debug)]
pub struct Ran {
    pub report: Report,
    pub saved: Result<(), AtomicError>,
}

/// The whole `activate` flow. Never fails as a function: the outcome, the
/// error and its exit code are in the report.
pub fn activate(root: &Root, config_path: &Path, systemd: &dyn Systemd, opts: &Options) -> Ran {
    let mut report = Report::new("activate");
    let lock = match Lock::try_exclusive(root) {
        Ok(l) => l,
        // The report belongs to the run holding the lock; do not clobber it.
        Err(e) => return busy(report, e),
    };
    failpoint::hit("after-lock");
    let run = Run::new(root, systemd);
    let result = run_activate(&run, config_path, opts, &mut report);
    run.record_traffic(&mut report);
    finish(root, report, result, lock)
}

/// `fetch`: the first half of `activate` (recover, resolve once, verify,
/// stage into the inactive slot, record it staged with its digest and
/// host-file inputs) without rendering, stopping or starting anything. A
/// following `activate` of the same image with the same inputs reuses the
/// slot (no download, no unpack) and flips.
pub fn fetch(root: &Root, config_path: &Path, systemd: &dyn Systemd, opts: &Options) -> Ran {
    let mut report = Report::new("fetch");
    let lock = match Lock::try_exclusive(root) {
        Ok(l) => l,
        Err(e) => return busy(report, e),
    };
    failpoint::hit("after-lock");
    let run = Run::new(root, systemd);
    let result = run_fetch(&run, config_path, opts, &mut report);
    run.record_traffic(&mut report);
    finish(root, report, result, lock)
}

fn busy(mut report: Report, e: LockError) -> Ran {
    let e = ActivateError::from(e);
    report.finish(e.exit_code(), Some(e.to_string()));
    Ran {
        report,
        saved: Ok(()),
    }
}

fn finish(root: &Root, mut report: Report, result: Result<(), ActivateError>, lock: Lock) -> Ran {
    match result {
        Ok(()) => report.finish(exit::OK, None),
        Err(e) => {
            if matches!(e, ActivateError::RolledBack { .. }) {
                report.outcome = Some(Outcome::RolledBack);
            }
            report.finish(e.exit_code(), Some(kubeslot_image::error_chain(&e)));
        }
    }
    let saved = report.save(root);
    drop(lock);
    Ran { report, saved }
}

/// What a run acts on: the root and the service manager; and, once the
/// config is read, the pacing of its registry requests (their deadline,
/// and what was sent and waited, for the report).
struct Run<'a> {
    root: &'a Root,
    systemd: &'a dyn Systemd,
    pacing: OnceCell<Arc<Pacing>>,
    /// The cluster, once the config the run flips with is read (`None`:
    /// no `cluster` section).
    cluster: OnceCell<Option<drain::ClusterRun>>,
}

impl<'a> Run<'a> {
    fn new(root: &'a Root, systemd: &'a dyn Systemd) -> Run<'a> {
        Run {
            root,
            systemd,
            pacing: OnceCell::new(),
            cluster: OnceCell::new(),
        }
    }

    /// The report's `registry_requests` (when anything was sent), and a
    /// progress line when the run had to wait for a registry.
    fn record_traffic(&self, report: &mut Report) {
        let Some(t) = self.pacing.get().map(|p| p.traffic()) else {
            return;
        };
        if t.sent == 0 {
            return;
        }
        if t.throttled > 0 {
            progress::line(|| {
                format!(
                    "registry requests: {} sent, {} answered 429/503, waited {:.1} s in all",
                    t.sent,
                    t.throttled,
                    t.waited_ms as f64 / 1000.0
                )
            });
        }
        report.registry_requests = Some(t);
    }
}

fn run_activate(
    run: &Run<'_>,
    config_path: &Path,
    opts: &Options,
    report: &mut Report,
) -> Result<(), ActivateError> {
    let Some(mut b) = begin(run, config_path, opts, Command::Activate, report)? else {
        return Ok(());
    };
    run.preflight(&mut b, report)?;
    // the cluster-wide limit and the halt before anything is staged: a
    // waiting run touches no slot
    let Some(lease) = take_lease(&b, report) else {
        return Ok(());
    };
    let flipped = stage_and_flip(run, &mut b, report);
    if let Some(note) = lease.and_then(fleet::Held::release) {
        progress::line(|| format!("rollout lease: {note}"));
    }
    flipped?;
    report.outcome = Some(Outcome::Committed);
    // GC: what neither slot needs any more goes (the commit stands whatever
    // happens here; a failure is the report's note).
    report.gc = Some(match crate::host::gc::collect(run.root, &b.state, false) {
        Ok(g) => g.summary(),
        Err(e) => format!("gc failed: {}", kubeslot_image::error_chain(&e)),
    });
    Ok(())
}

/// Stages (or reuses) the slot, then drains, flips and gates.
fn stage_and_flip(
    run: &Run<'_>,
    b: &mut begin::Begun,
    report: &mut Report,
) -> Result<(), ActivateError> {
    run.prepare(b, report)?;
    // An archive's extraction (when staging did not take it) is not needed.
    drop(b.source.take());
    let gate = Gate::on_host(&b.config.health, run.root);
    let machine = b.state.active.unwrap_or(b.flip.to);
    // the kubelet the image says it carries, for the cluster gate
    let kubelet = b
        .verified
        .image
        .manifest
        .annotations
        .get(crate::gate::cluster::KUBELET_VERSION_ANNOTATION)
        .cloned();
    let _ = run
        .cluster
        .set(
            drain::ClusterRun::of(run, &b.config, machine)?.map(|c| drain::ClusterRun {
                kubelet_version: kubelet,
                ..c
            }),
        );
    run.try_flip(&mut b.state, &gate, &b.facts.gpu.devices, report)
}

/// Before the staging and the drain of a following host's update (`rollout.limit`): a
/// lease, `Some(None)` when no limit applies; `None` when the run waits
/// (the report says why, nothing was touched).
fn take_lease(b: &begin::Begun, report: &mut Report) -> Option<Option<fleet::Held>> {
    let (Some(limit), Some(admission)) = (&b.config.rollout.limit, report.rollout.as_mut()) else {
        return Some(None);
    };
    if b.config.source.follow.is_none() {
        return Some(None);
    }
    let timeout = Duration::from_secs(
        b.config
            .cluster
            .as_ref()
            .map_or(10, |c| c.request_timeout_secs),
    );
    let node = follow::node_name(&b.config, &b.facts.hostname);
    match fleet::start(limit, timeout, &node, &b.flip.digest.to_string()) {
        fleet::Start::Go(held) => Some(Some(*held)),
        fleet::Start::Wait(why) => {
            admission.waiting = Some(why);
            report.slot = b.state.active;
            report.outcome = Some(Outcome::Waiting);
            None
        }
    }
}

fn run_fetch(
    run: &Run<'_>,
    config_path: &Path,
    opts: &Options,
    report: &mut Report,
) -> Result<(), ActivateError> {
    let Some(mut b) = begin(run, config_path, opts, Command::Fetch, report)? else {
        return Ok(());
    };
    report.phase("stage");
    if !b.flip.reuse_staged {
        // The one check that concerns what fetch writes: room for it.
        let disk = preflight::disk_only(
            run.root,
            &preflight::Inputs {
                ignore: b.config.preflight.ignore.clone(),
                disk: flip_disk_use(run.root, &b.flip, &b.verified),
                ..preflight::Inputs::default()
            },
        );
        report.preflight = disk.notable();
        b.decide_with(disk)?;
        let source = b.source.take().expect("opened in begin");
        run.stage_slot(
            &mut b.state,
            &b.flip,
            source,
            &b.verified,
            &b.config,
            report,
        )?;
        // Staged: the tree is complete and verified. Its host files are
        // rendered by the `activate` that flips to it (from the facts of
        // that moment); nothing a running machine uses is written here.
        *b.state.slot_mut(b.flip.to) = SlotState {
            status: SlotStatus::Staged,
            digest: Some(b.flip.digest),
            inputs: Some(b.inputs().to_string()),
            adopted: false,
        };
        run.save(&b.state)?;
        failpoint::hit("after-staged");
        report.mark(crate::activate::report::Datapoint::Staged);
    }
    report.outcome = Some(Outcome::Staged);
    Ok(())
}

/// The gate settings for a slot without a saved config (an adopted tree,
/// or a saved config that no longer loads): the host's current config's,
/// else the defaults.
fn fallback_health(root: &Root) -> Health {
    Config::load(&root.default_config())
        .map(|c| c.health)
        .unwrap_or_default()
}

/// The config `slot` was last activated with (`render <machine>` and
/// `rollback` use it, never the possibly newer one).
pub fn load_slot_config(root: &Root, slot: Slot) -> Result<Config, ActivateError> {
    let path = root.slot_inputs(slot.machine());
    Config::load(&path).map_err(|e| ActivateError::SlotConfig {
        path,
        reason: kubeslot_image::error_chain(&e),
    })
}

impl Run<'_> {
    fn save(&self, state: &State) -> Result<(), ActivateError> {
        Ok(state.save(self.root)?)
    }

    /// Writes rendered files; a changed drop-in needs a daemon-reload
    /// before the unit starts.
    fn write_files(&self, files: &HostFiles) -> Result<(), ActivateError> {
        let outcome = render::write(self.root, files)?;
        if outcome.dropin_changed {
            self.systemd.daemon_reload()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::activate::fixture::*;

    #[test]
    fn first_activation_commits_and_records_every_step() {
        let (s, fake, digest) = setup("healthy", None, "off");
        let r = run(&s, &fake);
        assert_eq!(
            (r.exit_code, r.outcome),
            (0, Some(Outcome::Committed)),
            "{r:?}"
        );
        assert_eq!(
            fake.calls(),
            [
                "daemon-reload",
                "start systemd-nspawn@kube1.service",
                // committed: kube1 starts at boot
                "enable machines.target",
                "enable systemd-nspawn@kube1.service",
            ]
        );
        assert!(s.root.machine_wants_link("kube1").is_symlink());
        let st = State::load(&s.root).unwrap();
        assert_eq!(st.active, Some(Slot::Kube1));
        assert_eq!(st.slot(Slot::Kube1).digest, Some(digest));
        let config = load_slot_config(&s.root, Slot::Kube1).unwrap();
        let facts = render::gather(&s.root, &Config::load(&s.config).unwrap()).unwrap();
        assert!(Rendered::new(&config, &facts).current(&s.root, Slot::Kube1));
        // again: nothing to do, nothing called
        let r = run(&s, &fake);
        assert_eq!(r.outcome, Some(Outcome::UpToDate));
        assert_eq!(fake.calls().len(), 4);
    }

    #[test]
    fn a_second_run_is_refused_while_one_holds_the_lock() {
        let (s, fake, _) = setup("healthy", None, "off");
        let held = Lock::try_exclusive(&s.root).unwrap();
        let ran = activate(&s.root, &s.config, &fake, &Options::default());
        assert_eq!(ran.report.exit_code, exit::BUSY);
        assert!(!s.root.report_file().exists());
        assert!(fake.calls().is_empty());
        drop(held);
    }
}
