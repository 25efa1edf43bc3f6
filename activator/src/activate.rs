//! The flip engine: `activate`, `fetch` and `rollback` as library calls, each
//! ending in a [`Report`] that is written to `report.json` while the run lock
//! is still held.
//!
//! Given the root handle, the config path and a [`Systemd`]. The order
//! (DESIGN.md §4), and why each step is where it is:
//!
//! 1. lock (`lock`): two runs never interleave;
//! 2. load the state, repairing a save that died between its writes, and
//!    recover a dead run ([`recover`]): a flip "prepared" but not tried is
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
//! 4. [`plan::activate`]: up to date (no machine is touched), refused (the
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
//! 6. stop the old machine, start the new one, health gate ([`health`]);
//! 7. commit (the old slot is kept as `previous` for `rollback`; the old
//!    machine disabled at boot, then the new one enabled, then the commit
//!    saved: a crash or power loss in between boots the old node, or none,
//!    never both, and the next run's recovery decides) or roll back (stop the
//!    new machine, start the old one, check it, mark the image bad with the
//!    name of the failed check).
//!
//! [`fetch`] runs steps 1 to 4 and stages the slot (recorded staged, no host
//! files rendered, no machine touched); the next `activate` reuses it.
//! A commit records the fingerprint of the slot it leaves ([`fingerprint`]);
//! [`rollback`] refuses a previous slot whose tree no longer matches it.
//!
//! Every state change is one atomic [`State::save`]; the active slot's tree
//! and host files are never written by a flip (only the inactive slot's), so
//! the old machine stays bootable whatever point a crash hits. The failpoint
//! boundaries are listed in [`crate::failpoint`].
//!
//! It does not parse arguments or print (the `cli` modules do), and it runs
//! nothing from an image.

use std::cell::OnceCell;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kubeslot_image::atomic::AtomicError;
use kubeslot_image::digest::Digest;
use kubeslot_image::oci::Platform;
use kubeslot_image::retry::Pacing;
use kubeslot_image::source::{Source, SourceError};
use kubeslot_image::verify::VerifyError;

use crate::config::{Config, ConfigError, Health, SlotMode};
use crate::failpoint;
use crate::fingerprint::{self, FingerprintError};
use crate::health::{self, Check, Failure, Gate};
use crate::host_settings;
use crate::lock::{Lock, LockError};
use crate::overlay::{self, OverlayError};
use crate::paths::Root;
use crate::plan::{self, Flip, Plan, PlanError};
use crate::preflight;
use crate::progress;
use crate::render::{self, HostFacts, HostFiles, RenderError};
use crate::report::{exit, Downloads, Outcome, Report};
use crate::slot::Slot;
use crate::stage::{self, StageError, Verified};
use crate::state::{
    FlipKind, Pending, PendingPhase, Release, SlotState, SlotStatus, State, StateError,
};
use crate::systemd::{Systemd, SystemdError};

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
    #[error(transparent)]
    Stage(#[from] StageError),
    #[error(transparent)]
    Verify(#[from] VerifyError),
    #[error(transparent)]
    Source(#[from] Box<SourceError>),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Systemd(#[from] SystemdError),
    #[error(transparent)]
    Fingerprint(#[from] FingerprintError),
    #[error("slot config {path}: {reason}")]
    SlotConfig { path: PathBuf, reason: String },
    #[error(transparent)]
    Overlay(#[from] OverlayError),
    #[error("rollback --clean: {slot} is a copied tree, not an overlay slot; nothing separates what its machine wrote from its image (a plain rollback keeps it)")]
    CleanNeedsOverlay { slot: Slot },
    /// `slots.mode = "overlay"` on a host that cannot mount one.
    #[error("slots.mode is \"overlay\" but overlay slots do not work on this host: {reason} (set slots.mode = \"copy\", or leave it unset to fall back)")]
    OverlayUnsupported { reason: String },
    #[error("image {digest}: failed on this host at {at} ({reason}); not retried automatically (publish a new image, change the host settings, or pass --force)")]
    Bad {
        digest: Digest,
        reason: String,
        at: String,
    },
    #[error("image {} of {} was created {}, before {} (created {}), the newest release this host committed: refused as a downgrade (pass --allow-downgrade or set trust.allow_downgrade to run an older release; rollback is always allowed)",
        .candidate.digest, .candidate.identity,
        if .candidate.created.is_empty() { "at no stated time" } else { .candidate.created.as_str() },
        .newest.digest, .newest.created)]
    Downgrade {
        candidate: Box<Release>,
        newest: Box<Release>,
    },
    #[error("staged {got} into {slot}, but the reference resolved to {want} at the start of this run (it moved); the slot stays unused")]
    Moved {
        slot: Slot,
        want: Digest,
        got: Digest,
    },
    #[error("rollback: slot {slot}: {reason}")]
    NotIntact { slot: Slot, reason: String },
    /// A node machine runs that the state does not account for.
    #[error("machine {machine} is running, but kubeslot has no record of a node on this host ({state} has no committed slot): it was set up by another tool (unbounded-agent names its machine kube1); take it over with `kubeslot-activator adopt`, or stop it; nothing was changed")]
    Unmanaged { machine: Slot, state: PathBuf },
    /// unbounded-agent provisioned this host (its applied config is there)
    /// and kubeslot has no state yet.
    #[error("{applied} exists and kubeslot has no state on this host: machine {machine} belongs to unbounded-agent; take it over with `kubeslot-activator adopt`; nothing was changed")]
    Unbounded { machine: Slot, applied: PathBuf },
    /// A machine runs where the run would write or start.
    #[error("machine {machine} is running{why}; its tree is never touched while it runs: nothing was changed")]
    MachineRunning { machine: Slot, why: String },
    #[error("host settings: {reason}")]
    HostSettings { reason: String },
    #[error("preflight: {count} check(s) failed: {summary}; nothing was staged, stopped or started (fix the host, or ignore a check with the config's \"preflight\": {{\"ignore\": [NAME]}})")]
    Preflight { count: usize, summary: String },
    /// The committed node runs the desired image but did not come up when
    /// started; nothing else to do without `--force`.
    #[error("the committed node {slot} was not running: started it, but {failure} (`kubeslot-activator activate --force` stages the image afresh into {} and flips to it; `rollback` returns to the previous slot)", slot.other())]
    NotHealthy { slot: Slot, failure: Failure },
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
    /// The process exit code (see [`crate::report::exit`]).
    pub fn exit_code(&self) -> i32 {
        match self {
            ActivateError::Config(_)
            | ActivateError::Facts { .. }
            | ActivateError::Trust { .. }
            | ActivateError::Unmanaged { .. }
            | ActivateError::Unbounded { .. }
            | ActivateError::MachineRunning { .. }
            | ActivateError::Preflight { .. }
            | ActivateError::OverlayUnsupported { .. } => exit::CONFIG,
            ActivateError::Lock(LockError::Busy { .. }) => exit::BUSY,
            ActivateError::Bad { .. } | ActivateError::Downgrade { .. } => exit::BAD_IMAGE,
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
    let host = Host::new(root, systemd);
    let result = run_activate(&host, config_path, opts, &mut report);
    host.record_traffic(&mut report);
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
    let host = Host::new(root, systemd);
    let result = run_fetch(&host, config_path, opts, &mut report);
    host.record_traffic(&mut report);
    finish(root, report, result, lock)
}

/// `rollback`: back to the previous slot, without downloading, through the
/// same gate; the image rolled away from is marked bad.
pub fn rollback(root: &Root, systemd: &dyn Systemd) -> Ran {
    rollback_with(root, systemd, false)
}

/// [`rollback`]; with `clean`, the previous slot (an overlay slot) first
/// loses everything its machine wrote (a fresh upper dir), so it starts as
/// exactly its verified image.
pub fn rollback_with(root: &Root, systemd: &dyn Systemd, clean: bool) -> Ran {
    rollback_opts(root, systemd, clean, false)
}

/// [`rollback_with`]; with `force`, a copied previous slot whose
/// image-owned files changed is started anyway.
pub fn rollback_opts(root: &Root, systemd: &dyn Systemd, clean: bool, force: bool) -> Ran {
    let mut report = Report::new("rollback");
    let lock = match Lock::try_exclusive(root) {
        Ok(l) => l,
        Err(e) => return busy(report, e),
    };
    failpoint::hit("after-lock");
    let result = run_rollback(root, systemd, clean, force, &mut report);
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
struct Host<'a> {
    root: &'a Root,
    systemd: &'a dyn Systemd,
    pacing: OnceCell<Arc<Pacing>>,
}

impl<'a> Host<'a> {
    fn new(root: &'a Root, systemd: &'a dyn Systemd) -> Host<'a> {
        Host {
            root,
            systemd,
            pacing: OnceCell::new(),
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

/// Steps 2 to 4, shared by `activate` and `fetch`: what a run found and
/// decided before it writes anything of its own.
struct Begun {
    state: State,
    config: Config,
    facts: HostFacts,
    /// Taken by staging (absent when the plan reuses a staged slot, it is
    /// dropped at the end of the run).
    source: Option<Source>,
    verified: Verified,
    inputs: String,
    flip: Flip,
    /// What a commit of this flip records as its identity's release.
    release: Option<Release>,
}

/// What a run reconciles with systemd after recovery.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reconcile {
    /// `activate`: refuse foreign machines, enable the committed slot at
    /// boot, start it when it is not running.
    StartCommitted,
    /// `fetch`: only refuse foreign machines (it starts and enables nothing).
    RefuseForeign,
}

/// Recover, reconcile, read the config, gather the facts, resolve once,
/// plan. `None` when the plan says there is nothing to do (the report says
/// why).
fn begin(
    host: &Host<'_>,
    config_path: &Path,
    opts: &Options,
    reconcile: Reconcile,
    report: &mut Report,
) -> Result<Option<Begun>, ActivateError> {
    let root = host.root;
    report.phase("recover");
    let mut state = State::load_repairing(root)?;
    report.previous_slot = state.active;
    report.recovered = host.recover(&mut state)?;
    failpoint::hit("after-recover");
    host.refuse_foreign(&state)?;
    // A committed node that does not come up is noted, not the end of the
    // run: a flip to another image (or, forced, the same image staged
    // afresh) is the way out of a broken tree, so the plan decides.
    let down = match reconcile {
        Reconcile::StartCommitted => host.reconcile(&state, opts.force, report)?,
        Reconcile::RefuseForeign => None,
    };

    report.phase("config");
    let config = Config::load(config_path)?;
    report.image = Some(config.image.to_string());
    let facts = gather(root, config_path, &config)?;

    report.phase("resolve");
    // The lock is held: an extraction left by a killed run is nobody's.
    stage::remove_stale_extractions(root)?;
    // The deadline counts from here: every request of the run shares it.
    let pacing = host
        .pacing
        .get_or_init(|| Arc::new(crate::trust::pacing(&config.download)));
    let resolved = open_verified_paced(root, &config, pacing.clone())?;
    let digest = resolved.digest();
    report.digest = Some(digest);
    report.index_digest = Some(resolved.index_digest()).filter(|d| *d != digest);
    let inputs = inputs_hash(&config, &facts);
    let current = state
        .active
        .is_some_and(|a| files_current(root, &config, a, &facts));
    let flip = match plan::activate(&state, digest, &inputs, current, opts.force) {
        Plan::UpToDate { slot, .. } if down.is_some() => {
            let failure = down.expect("checked");
            if !opts.force {
                report.slot = Some(slot);
                return Err(ActivateError::NotHealthy { slot, failure });
            }
            // --force: the same image into the other slot, from the store
            // (or the registry), through the same preflight and gate.
            plan::restage(&state, digest, &inputs)
        }
        Plan::UpToDate { slot, .. } => {
            if state.slot(slot).inputs.as_deref() != Some(inputs.as_str()) {
                // host facts changed and the render oneshot already applied
                // them: record what the slot now runs with
                state.slot_mut(slot).inputs = Some(inputs);
                state.save(root)?;
            }
            report.slot = Some(slot);
            // `started` (by reconcile) says more than "up to date"
            report.outcome.get_or_insert(Outcome::UpToDate);
            return Ok(None);
        }
        Plan::Refused(bad) => {
            report.slot = state.active;
            return Err(ActivateError::Bad {
                digest: bad.digest,
                reason: bad.reason,
                at: bad.at,
            });
        }
        Plan::Flip(f) => f,
    };
    report.slot = Some(flip.to);
    let release = release_of(&config, &resolved.verified);
    let allow_downgrade = opts.allow_downgrade || config.trust.allow_downgrade;
    if let Some(r) = &release {
        // The image the committed node already runs is never a downgrade
        // (a forced restage of it, say).
        let running_it = state.active.and_then(|a| state.slot(a).digest) == Some(r.digest);
        if !allow_downgrade && !running_it {
            refuse_downgrade(&state, r)?;
        }
    }
    // The target's tree is replaced (or its unit started): never under a
    // machine that runs (started by hand, or by another tool).
    if host.running(flip.to)? {
        return Err(ActivateError::MachineRunning {
            machine: flip.to,
            why: format!(
                ", but it is the slot this run would stage into{}",
                flip.from
                    .map_or(String::new(), |f| format!(" (the committed node is {f})"))
            ),
        });
    }
    Ok(Some(Begun {
        state,
        config,
        facts,
        source: Some(resolved.source),
        verified: resolved.verified,
        inputs,
        flip,
        release,
    }))
}

/// The release a commit of `verified` records: its identity (see
/// [`crate::trust::identity`]) and the signed config's `created`. `None`
/// when no identity applies (an unsigned layout allowed by
/// `allow_unsigned`): nothing orders such images.
fn release_of(config: &Config, verified: &Verified) -> Option<Release> {
    let identity = crate::trust::identity(&config.trust, &config.image)?;
    Some(Release {
        identity: identity.to_string(),
        digest: verified.image.manifest_digest(),
        created: verified.image.config.created.clone().unwrap_or_default(),
    })
}

/// Refuses `candidate` when it is older than the newest release committed
/// for its identity. An image whose `created` is missing or unreadable
/// cannot be shown to be newer, so it is refused too once a release is
/// recorded. The same time is not older: a rebuild of one release (or
/// images whose recipes share `source_date_epoch`) passes.
fn refuse_downgrade(state: &State, candidate: &Release) -> Result<(), ActivateError> {
    let Some(newest) = state.releases.get(&candidate.identity) else {
        return Ok(());
    };
    let older = match (candidate.created_secs(), newest.created_secs()) {
        (Some(c), Some(n)) => c < n,
        (None, Some(_)) => true,
        (_, None) => false,
    };
    if older {
        return Err(ActivateError::Downgrade {
            candidate: Box::new(candidate.clone()),
            newest: Box::new(newest.clone()),
        });
    }
    Ok(())
}

fn run_activate(
    host: &Host<'_>,
    config_path: &Path,
    opts: &Options,
    report: &mut Report,
) -> Result<(), ActivateError> {
    let Some(mut b) = begin(host, config_path, opts, Reconcile::StartCommitted, report)? else {
        return Ok(());
    };
    host.preflight(&b, report)?;
    host.prepare(&mut b, report)?;
    // An archive's extraction (when staging did not take it) is not needed.
    drop(b.source.take());
    let gate = Gate::on_host(&b.config.health, host.root);
    host.try_flip(&mut b.state, &gate, &b.facts.gpu.devices, report)?;
    report.outcome = Some(Outcome::Committed);
    // GC: what neither slot needs any more goes (the commit stands whatever
    // happens here; a failure is the report's note).
    report.gc = Some(match crate::gc::collect(host.root, &b.state, false) {
        Ok(g) => g.summary(),
        Err(e) => format!("gc failed: {}", kubeslot_image::error_chain(&e)),
    });
    Ok(())
}

fn run_fetch(
    host: &Host<'_>,
    config_path: &Path,
    opts: &Options,
    report: &mut Report,
) -> Result<(), ActivateError> {
    let Some(mut b) = begin(host, config_path, opts, Reconcile::RefuseForeign, report)? else {
        return Ok(());
    };
    report.phase("stage");
    if !b.flip.reuse_staged {
        // The one check that concerns what fetch writes: room for it.
        let disk = preflight::disk_only(
            host.root,
            &preflight::Inputs {
                ignore: b.config.preflight.ignore.clone(),
                disk: flip_disk_use(host.root, &b),
                ..preflight::Inputs::default()
            },
        );
        report.preflight = disk.notable();
        if !disk.passed() {
            return Err(ActivateError::Preflight {
                count: 1,
                summary: disk.failure_summary(),
            });
        }
        let source = b.source.take().expect("opened in begin");
        host.stage_slot(
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
            inputs: Some(b.inputs.clone()),
            adopted: false,
        };
        host.save(&b.state)?;
        failpoint::hit("after-staged");
    }
    report.outcome = Some(Outcome::Staged);
    Ok(())
}

fn run_rollback(
    root: &Root,
    systemd: &dyn Systemd,
    clean: bool,
    force: bool,
    report: &mut Report,
) -> Result<(), ActivateError> {
    let host = Host::new(root, systemd);
    report.phase("recover");
    let mut state = State::load_repairing(root)?;
    report.previous_slot = state.active;
    report.recovered = host.recover(&mut state)?;
    failpoint::hit("after-recover");
    host.ensure_enabled(state.active)?;

    report.phase("plan");
    let rb = plan::rollback(&state)?;
    report.slot = Some(rb.to);
    report.digest = rb.digest;
    if host.running(rb.to)? {
        return Err(ActivateError::MachineRunning {
            machine: rb.to,
            why: format!(" beside the committed node {}", rb.from),
        });
    }
    if overlay::is_overlay(root, rb.to) {
        if clean {
            // Only the upper goes: the lowers are the verified layers.
            overlay::clean(root, systemd, rb.to)?;
        } else {
            // Mounted again (a reboot leaves an unused slot unmounted).
            systemd.start(&root.mount_unit(rb.to.machine()))?;
        }
    } else if clean {
        return Err(ActivateError::CleanNeedsOverlay { slot: rb.to });
    }
    if !clean {
        // The tree must still be what it was when its machine was stopped
        // and committed away from: nothing is downloaded to repair it.
        fingerprint::check(root, rb.to.machine(), rb.digest).map_err(|e| {
            ActivateError::NotIntact {
                slot: rb.to,
                reason: format!(
                    "refusing to start it: {}; the running machine is untouched",
                    kubeslot_image::error_chain(&e)
                ),
            }
        })?;
        // And file by file (copied slots): what the image installed is
        // still what it installed, outside the paths a node writes.
        if !force && !overlay::is_overlay(root, rb.to) {
            image_files_intact(root, rb.to)?;
        }
    }
    let adopted = state.slot(rb.to).adopted;
    let (gate, gpu) = if adopted {
        // The tree and its host files are the other tool's, kept as they
        // were: nothing is rendered.
        (Gate::on_host(&fallback_health(root), root), Vec::new())
    } else {
        // The slot runs with the config it was activated with; only the
        // device binds may differ, so its files are re-rendered from it.
        report.phase("render");
        let config = load_slot_config(root, rb.to)?;
        report.image = Some(config.image.to_string());
        let facts = render::gather(root, &config)?;
        let files = render::render(&config, rb.to, &facts);
        host.write_files(&files)?;
        (Gate::on_host(&config.health, root), facts.gpu.devices)
    };
    state.pending = Some(Pending {
        kind: FlipKind::Rollback,
        phase: PendingPhase::Prepared,
        to: rb.to,
        digest: rb.digest,
        from: Some(rb.from),
        inputs: state.slot(rb.to).inputs.clone().unwrap_or_default(),
        release: None,
    });
    state.save(root)?;
    failpoint::hit("after-pending");
    host.try_flip(&mut state, &gate, &gpu, report)?;
    report.outcome = Some(Outcome::Committed);
    Ok(())
}

fn gather(root: &Root, config_path: &Path, config: &Config) -> Result<HostFacts, ActivateError> {
    // The keys are host facts too: checked here, before anything is
    // resolved, so the error names the config and exits 3.
    crate::trust::policy(&config.trust, &config.image, root).map_err(|source| {
        ActivateError::Trust {
            config: config_path.to_path_buf(),
            source,
        }
    })?;
    render::gather(root, config).map_err(|source| ActivateError::Facts {
        config: config_path.to_path_buf(),
        source,
    })
}

/// The image a run works on, resolved once at its start: the open source
/// (an `oci-archive` extracted once, into the machines dir) and the verified
/// selection. Staging consumes the source and uses the selection, so every
/// source kind is resolved exactly once per run and a tag that moves
/// meanwhile changes nothing.
pub struct Resolved {
    pub source: Source,
    pub verified: Verified,
}

impl Resolved {
    /// The digest this host keys the image by: its platform manifest, what
    /// the signature covers for this host (directly, or through a signed
    /// index that names it). A signed manifest re-wrapped in another index
    /// is the same image.
    pub fn digest(&self) -> Digest {
        self.verified.image.manifest_digest()
    }

    /// The top-level digest the reference resolved to (the index, or the
    /// manifest itself for a single-platform image), shown beside it.
    pub fn index_digest(&self) -> Digest {
        self.verified.image.image_digest()
    }
}

/// Opens the configured source, resolves the reference once and checks the
/// trust policy (fail closed), for a look at the image (`plan`,
/// `preflight`): registries get [`crate::trust::INSPECT_DEADLINE`] at most,
/// not the download deadline of a run. Fetches no layer.
pub fn open_verified(root: &Root, config: &Config) -> Result<Resolved, ActivateError> {
    open_verified_paced(
        root,
        config,
        Arc::new(crate::trust::inspect_pacing(&config.download)),
    )
}

/// [`open_verified`] whose registry requests (and the staging that takes
/// the source) go through `pacing`.
pub fn open_verified_paced(
    root: &Root,
    config: &Config,
    pacing: Arc<Pacing>,
) -> Result<Resolved, ActivateError> {
    let policy = crate::trust::policy(&config.trust, &config.image, root)?;
    let scratch = root.machines_dir();
    let registries = crate::trust::registries(&config.registries, root);
    let source = Source::open_paced(&config.image, &registries, &scratch, pacing)?;
    let verified = stage::resolve_and_verify(&source, &policy, &Platform::host())?;
    Ok(Resolved { source, verified })
}

/// Resolves the configured reference once and checks the trust policy.
pub fn resolve(root: &Root, config: &Config) -> Result<Digest, ActivateError> {
    Ok(open_verified(root, config)?.digest())
}

/// What activating the configured image would write on this host
/// (resolved and verified, no layer fetched; the state read, not
/// repaired): nothing when the slot the next flip uses holds it already,
/// else what the content store lacks plus the unpacked tree. For the
/// `preflight` command.
pub fn disk_use(root: &Root, config: &Config) -> Result<preflight::DiskUse, ActivateError> {
    let r = open_verified(root, config)?;
    let (state, _repair) = State::load_torn(root)?;
    let digest = r.digest();
    let target = state.slot(state.active.map_or(Slot::Kube1, Slot::other));
    if target.status == SlotStatus::Staged && target.digest == Some(digest) {
        return Ok(preflight::DiskUse::Staged);
    }
    Ok(preflight::DiskUse::Needs(preflight::DiskNeed::of(
        root,
        &r.verified.image,
    )))
}

/// What a planned flip writes: nothing when it reuses a staged slot.
fn flip_disk_use(root: &Root, b: &Begun) -> preflight::DiskUse {
    if b.flip.reuse_staged {
        preflight::DiskUse::Staged
    } else {
        preflight::DiskUse::Needs(preflight::DiskNeed::of(root, &b.verified.image))
    }
}

/// The hash that names a set of host-file inputs (the files rendered for
/// kube1, so the value does not depend on the slot): what a bad mark and a
/// slot record.
pub fn inputs_hash(config: &Config, facts: &HostFacts) -> String {
    hash_files(&render::render(config, Slot::Kube1, facts))
}

fn hash_files(files: &HostFiles) -> String {
    let mut text = String::new();
    for f in &files.files {
        text += &format!(
            "{}\0{:o}\0{}\0{}\0",
            f.path.display(),
            f.mode,
            f.contents.len(),
            f.contents
        );
    }
    Digest::of(text.as_bytes()).hex()
}

/// Whether `slot`'s host files on disk are what rendering gives now.
pub fn files_current(root: &Root, config: &Config, slot: Slot, facts: &HostFacts) -> bool {
    render::diff(root, &render::render(config, slot, facts))
        .iter()
        .all(|d| d.diff.is_empty())
}

/// Where a node writes: changes there are its state, not the image's.
const NODE_WRITES: [&str; 5] = ["var", "tmp", "run", "root", "home"];
/// Image files a booting node rewrites by design: systemd writes the
/// machine id at first boot.
const NODE_REWRITES: [&str; 1] = ["etc/machine-id"];

/// A copied slot's image-owned files (outside [`NODE_WRITES`]) are what
/// was installed, per its record; no record (an adopted tree, a slot from
/// an earlier version) is nothing to check.
fn image_files_intact(root: &Root, slot: Slot) -> Result<(), ActivateError> {
    let Ok(record) = crate::integrity::load(&root.slot_files_record(slot.machine())) else {
        return Ok(());
    };
    let tree = root.machine_tree(slot.machine());
    let changed: Vec<_> = crate::integrity::check(&tree, &record)
        .map_err(|e| ActivateError::NotIntact {
            slot,
            reason: format!("checking its files: {e}"),
        })?
        .into_iter()
        // Entries the image did not have (nspawn's bind mount points, what
        // the node created) are not image files; changed and missing ones are.
        .filter(|m| m.what != "added")
        .filter(|m| !NODE_WRITES.contains(&m.path.split('/').next().unwrap_or("")))
        .filter(|m| !NODE_REWRITES.contains(&m.path.as_str()))
        .collect();
    if changed.is_empty() {
        return Ok(());
    }
    let shown: Vec<String> = changed
        .iter()
        .take(10)
        .map(|m| format!("/{} ({})", m.path, m.what))
        .collect();
    Err(ActivateError::NotIntact {
        slot,
        reason: format!(
            "refusing to start it: {} image file(s) changed since it was installed: {}{}; the running machine is untouched (rollback --force starts it anyway)",
            changed.len(),
            shown.join(", "),
            if changed.len() > 10 { ", ..." } else { "" }
        ),
    })
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

impl Host<'_> {
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

    /// Stages the image resolved at the start of the run into `flip.to`
    /// (the digest pinned, nothing resolved again). The slot is marked
    /// dirty only once the image is fetched and unpacked beside it: a
    /// refused blob or layer leaves the slot and its record as they were
    /// (a rollback target stays one).
    fn stage_slot(
        &self,
        state: &mut State,
        flip: &Flip,
        source: Source,
        verified: &Verified,
        config: &Config,
        report: &mut Report,
    ) -> Result<(), ActivateError> {
        let to = flip.to;
        let mode = self.slot_mode(config, report)?;
        let (downloads, digest) = match mode {
            SlotMode::Overlay => {
                let (fetched, layers) =
                    stage::prepare_layers(self.root, source, verified, &config.unpack)?;
                failpoint::hit("after-unpack");
                self.mark_dirty(state, to)?;
                overlay::install(
                    self.root,
                    self.systemd,
                    to,
                    Some(verified.image.manifest_digest()),
                    &layers.dirs,
                )?;
                let mut d = Downloads::from(&fetched);
                d.layers_unpacked = Some(layers.unpacked as u64);
                d.layers_reused = Some(layers.reused as u64);
                (d, verified.image.manifest_digest())
            }
            SlotMode::Copy => {
                let prepared = stage::prepare_resolved(
                    self.root,
                    source,
                    verified,
                    &config.unpack,
                    to.machine(),
                )?;
                failpoint::hit("after-unpack");
                self.mark_dirty(state, to)?;
                // A slot that was an overlay becomes a plain tree.
                overlay::remove(self.root, self.systemd, to)?;
                let staged = prepared.install()?;
                // What the image put there, file by file: `rollback` refuses
                // a tree whose image-owned files changed since.
                let tree = self.root.machine_tree(to.machine());
                let record_path = self.root.slot_files_record(to.machine());
                crate::integrity::record(&tree)
                    .and_then(|r| {
                        if let Some(dir) = record_path.parent() {
                            std::fs::create_dir_all(dir)?;
                        }
                        crate::integrity::save(&record_path, &r)
                    })
                    .map_err(|e| ActivateError::NotIntact {
                        slot: to,
                        reason: format!("recording its files in {}: {e}", record_path.display()),
                    })?;
                (Downloads::from(&staged.report), staged.manifest_digest)
            }
        };
        failpoint::hit("after-stage");
        report.downloads = Some(downloads);
        if digest != flip.digest {
            return Err(ActivateError::Moved {
                slot: to,
                want: flip.digest,
                got: digest,
            });
        }
        Ok(())
    }

    /// Dirty before the tree changes: a crash from here on leaves a slot
    /// recovery empties, never one that could be started half-written or
    /// under a record that no longer matches its tree.
    fn mark_dirty(&self, state: &mut State, to: Slot) -> Result<(), ActivateError> {
        *state.slot_mut(to) = SlotState {
            status: SlotStatus::Dirty,
            ..SlotState::default()
        };
        self.save(state)?;
        failpoint::hit("after-mark-dirty");
        Ok(())
    }

    /// The slot mode of this staging: the config's, or (unset) overlay
    /// when the root is the host's `/` and [`overlay::probe`] passes there,
    /// copy otherwise (the report says why): a mount unit is mounted by the
    /// host's systemd, which a tree prepared under another `--root` is not
    /// managed by. An explicit overlay the host cannot do refuses.
    fn slot_mode(&self, config: &Config, report: &mut Report) -> Result<SlotMode, ActivateError> {
        let mode = match config.slots.mode {
            Some(SlotMode::Copy) => SlotMode::Copy,
            Some(SlotMode::Overlay) => {
                overlay::probe(self.root)
                    .map_err(|reason| ActivateError::OverlayUnsupported { reason })?;
                SlotMode::Overlay
            }
            None if self.root.dir() != Path::new("/") => {
                report.slot_mode = Some(format!(
                    "copy (the root {} is not the host's /: overlay slots are mounted by the host's systemd)",
                    self.root.dir().display()
                ));
                return Ok(SlotMode::Copy);
            }
            None => match overlay::probe(self.root) {
                Ok(()) => SlotMode::Overlay,
                Err(why) => {
                    report.slot_mode = Some(format!("copy (overlay not usable here: {why})"));
                    return Ok(SlotMode::Copy);
                }
            },
        };
        report.slot_mode = Some(mode.name().to_string());
        Ok(mode)
    }

    /// Step 5: the target slot staged and rendered, "pending, prepared".
    fn prepare(&self, b: &mut Begun, report: &mut Report) -> Result<(), ActivateError> {
        let (flip, config, state) = (&b.flip, &b.config, &mut b.state);
        let to = flip.to;
        report.phase("stage");
        if !flip.reuse_staged {
            let source = b.source.take().expect("opened in begin");
            self.stage_slot(state, flip, source, &b.verified, config, report)?;
        }
        report.phase("render");
        render::save_inputs(self.root, to, config)?;
        self.write_files(&render::render(config, to, &b.facts))?;
        failpoint::hit("after-render");
        *state.slot_mut(to) = SlotState {
            status: SlotStatus::Staged,
            digest: Some(flip.digest),
            inputs: Some(b.inputs.clone()),
            adopted: false,
        };
        self.save(state)?;
        failpoint::hit("after-staged");
        state.pending = Some(Pending {
            kind: FlipKind::Activate,
            phase: PendingPhase::Prepared,
            to,
            digest: Some(flip.digest),
            from: flip.from,
            inputs: b.inputs.clone(),
            release: b.release.clone(),
        });
        self.save(state)?;
        failpoint::hit("after-pending");
        Ok(())
    }

    /// Steps 6 and 7 for the pending flip in `state`.
    fn try_flip(
        &self,
        state: &mut State,
        gate: &Gate,
        gpu_devices: &[String],
        report: &mut Report,
    ) -> Result<(), ActivateError> {
        let mut pending = state.pending.clone().expect("a prepared flip");
        pending.phase = PendingPhase::Trying;
        state.pending = Some(pending.clone());
        self.save(state)?;
        failpoint::hit("after-trying");

        report.phase("stop");
        if let Some(from) = pending.from {
            if let Err(e) = self.systemd.stop(&from.unit()) {
                // Nothing was started: the try is not used up. The old
                // machine may still run; the target stays staged.
                state.pending = None;
                self.save(state)?;
                return Err(e.into());
            }
        }
        failpoint::hit("after-stop-old");

        report.phase("start");
        let started = self.systemd.start(&pending.to.unit());
        failpoint::hit("after-start-new");

        report.phase("health");
        let verdict = match started {
            Err(e) => Err(Failure {
                machine: pending.to.machine().to_string(),
                check: Check::UnitStart,
                detail: e.to_string(),
            }),
            Ok(()) => health::wait_healthy(self.systemd, pending.to, gate, gpu_devices),
        };
        match verdict {
            Ok(()) => {
                failpoint::hit("after-health");
                report.phase("commit");
                self.commit(state, &pending)
            }
            Err(failure) => {
                report.phase("rollback");
                self.roll_back(state, &pending, failure)
            }
        }
    }

    fn commit(&self, state: &mut State, p: &Pending) -> Result<(), ActivateError> {
        // The slot left behind holds no tree (it was removed while its
        // node was down, which is why the flip went ahead): it is empty,
        // not a rollback target.
        let mut from_gone = false;
        if let Some(from) = p.from {
            // Its machine is stopped: the tree is frozen until a rollback
            // starts it again, which checks this mark first.
            let old = state.slot(from);
            if !self.root.machine_tree(from.machine()).is_dir() {
                from_gone = true;
                remove_mark(self.root, from)?;
            } else if (old.digest.is_some() || old.adopted)
                && fingerprint::record(self.root, from.machine(), old.digest).is_err()
            {
                // A tree that cannot be counted cannot be checked either:
                // without a mark `rollback` refuses it (and says why); the
                // commit itself stands.
                remove_mark(self.root, from)?;
            }
        }
        // Boot follows the commit: the old machine no longer starts at boot,
        // then the new one does. Disabling first means a crash in between
        // boots no node rather than two (they share the network and the
        // node state); the saved commit below is what the next run
        // reconciles the links with.
        self.switch_enabled(p.from, p.to)?;
        failpoint::hit("after-enable");
        if let Some(from) = p.from {
            let old = state.slot_mut(from);
            old.status = SlotStatus::Previous;
            if p.kind == FlipKind::Rollback {
                // The operator rolled away from this image: do not bring it
                // back automatically.
                let (digest, inputs) = (old.digest, old.inputs.clone().unwrap_or_default());
                if let Some(d) = digest {
                    state.mark_bad(d, inputs, "rolled back by the operator".into());
                }
            }
            if from_gone {
                *state.slot_mut(from) = SlotState::default();
            }
        }
        let new = state.slot_mut(p.to);
        new.status = SlotStatus::Active;
        state.active = Some(p.to);
        if let Some(r) = &p.release {
            state.record_release(r.clone());
        }
        state.pending = None;
        self.save(state)?;
        failpoint::hit("after-commit");
        Ok(())
    }

    /// The new machine failed: stop it, start the old one again, check it,
    /// and record the failure.
    fn roll_back(
        &self,
        state: &mut State,
        p: &Pending,
        failure: Failure,
    ) -> Result<(), ActivateError> {
        // Never start the old machine while the new one may still run: they
        // share the host network and the node state.
        self.systemd.stop(&p.to.unit())?;
        if p.kind == FlipKind::Rollback {
            // The previous slot ran during the attempt and wrote its own
            // tree; it stays the previous slot, so its mark follows what
            // the tree holds now that its machine is stopped again.
            fingerprint::record(self.root, p.to.machine(), p.digest)?;
        }
        failpoint::hit("after-rollback-stop");
        let mut old_failure = None;
        if let Some(from) = p.from {
            let gate = load_slot_config(self.root, from)
                .map(|c| Gate::on_host(&c.health, self.root))
                .unwrap_or_else(|_| Gate::on_host(&fallback_health(self.root), self.root));
            old_failure = match self.systemd.start(&from.unit()) {
                Err(e) => Some(Failure {
                    machine: from.machine().to_string(),
                    check: Check::UnitStart,
                    detail: e.to_string(),
                }),
                Ok(()) => {
                    failpoint::hit("after-rollback-start");
                    health::wait_healthy(self.systemd, from, &gate, &[]).err()
                }
            };
        }
        match p.kind {
            FlipKind::Activate => {
                if let Some(d) = p.digest {
                    state.mark_bad(
                        d,
                        p.inputs.clone(),
                        format!("{}: {}", failure.check.name(), failure.detail),
                    );
                }
                // The tree is complete and verified, just not wanted.
                state.slot_mut(p.to).status = SlotStatus::Staged;
            }
            FlipKind::Rollback => {}
        }
        state.pending = None;
        self.save(state)?;
        Err(ActivateError::RolledBack {
            failure,
            from: p.from,
            old_failure,
        })
    }

    /// Finishes or undoes what a dead run left; returns what it did.
    fn recover(&self, state: &mut State) -> Result<Option<String>, ActivateError> {
        let mut done = Vec::new();
        if let Some(p) = state.pending.clone() {
            match p.phase {
                PendingPhase::Prepared => {
                    // No machine was touched: set it aside. The slot stays
                    // staged and the plan reuses it.
                    state.pending = None;
                    self.save(state)?;
                    done.push(format!(
                        "set aside a prepared flip to {} ({}) of a dead run",
                        p.to,
                        image_name(p.digest)
                    ));
                }
                PendingPhase::Trying => done.push(self.recover_try(state, &p)?),
            }
        }
        for slot in Slot::ALL {
            if state.slot(slot).status == SlotStatus::Dirty {
                *state.slot_mut(slot) = SlotState::default();
                self.save(state)?;
                done.push(format!(
                    "{slot} was left dirty by a dead run; emptied (restaged when needed)"
                ));
            }
        }
        Ok((!done.is_empty()).then(|| done.join("; ")))
    }

    /// A dead run was trying `p`: commit it when its machine is up and
    /// healthy now, otherwise roll back (the try is used up).
    fn recover_try(&self, state: &mut State, p: &Pending) -> Result<String, ActivateError> {
        let (gate, gpu) = match load_slot_config(self.root, p.to) {
            Ok(c) => {
                let gpu = render::gather(self.root, &c)
                    .map(|f| f.gpu.devices)
                    .unwrap_or_default();
                (Gate::on_host(&c.health, self.root), gpu)
            }
            Err(_) => (
                Gate::on_host(&fallback_health(self.root), self.root),
                Vec::new(),
            ),
        };
        let verdict = if self.systemd.is_active(&p.to.unit())? {
            health::wait_healthy(self.systemd, p.to, &gate, &gpu)
        } else {
            Err(Failure {
                machine: p.to.machine().to_string(),
                check: Check::UnitActive,
                detail: "not running after the run trying it died".into(),
            })
        };
        match verdict {
            Ok(()) => {
                self.commit(state, p)?;
                Ok(format!(
                    "finished a dead run's flip to {} ({}): healthy, committed",
                    p.to,
                    image_name(p.digest)
                ))
            }
            Err(failure) => {
                let what = format!(
                    "rolled back a dead run's flip to {} ({}): {failure}",
                    p.to,
                    image_name(p.digest)
                );
                match self.roll_back(state, p, failure) {
                    Err(ActivateError::RolledBack {
                        old_failure: Some(f),
                        ..
                    }) => Ok(format!("{what}; the old machine is not healthy: {f}")),
                    Err(ActivateError::RolledBack { .. }) => Ok(what),
                    Err(e) => Err(e),
                    Ok(()) => Ok(what),
                }
            }
        }
    }
}

/// Removes `slot`'s tree mark (a missing one is fine): `rollback` then
/// refuses the slot, naming the missing mark.
fn remove_mark(root: &Root, slot: Slot) -> Result<(), ActivateError> {
    let path = root.slot_tree_mark(slot.machine());
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(FingerprintError::Walk { path, source }.into()),
    }
}

/// A pending flip's image in messages (a rollback to an adopted tree has
/// none).
fn image_name(digest: Option<Digest>) -> String {
    digest.map_or_else(|| "adopted tree".to_string(), |d| d.to_string())
}

/// The target that pulls the machines enabled at boot in.
pub const MACHINES_TARGET: &str = "machines.target";

/// Reconciling the state with systemd, boot enablement, preflight.
impl Host<'_> {
    /// Whether `slot`'s machine runs: its unit is active, or machined
    /// knows a machine of that name (started some other way).
    fn running(&self, slot: Slot) -> Result<bool, ActivateError> {
        Ok(self.systemd.is_active(&slot.unit())?
            || self.systemd.machine_registered(slot.machine())?)
    }

    /// Whether `slot`'s machine starts at boot (its `machines.target.wants`
    /// link, made by `systemctl enable` or `machinectl enable`).
    fn enabled(&self, slot: Slot) -> bool {
        std::fs::symlink_metadata(self.root.machine_wants_link(slot.machine())).is_ok()
    }

    fn enable(&self, slot: Slot) -> Result<(), ActivateError> {
        if !self.enabled(slot) {
            // machinectl enable does both: the target may be off on a
            // host that never ran a machine at boot
            self.systemd.enable(MACHINES_TARGET)?;
            self.systemd.enable(&slot.unit())?;
        }
        Ok(())
    }

    /// The committed slot (if any) starts at boot and no other does.
    fn ensure_enabled(&self, active: Option<Slot>) -> Result<(), ActivateError> {
        for slot in Slot::ALL {
            if Some(slot) != active && self.enabled(slot) {
                self.systemd.disable(&slot.unit())?;
            }
        }
        match active {
            Some(a) => self.enable(a),
            None => Ok(()),
        }
    }

    /// A commit's boot switch: `from` disabled first, then `to` enabled.
    fn switch_enabled(&self, from: Option<Slot>, to: Slot) -> Result<(), ActivateError> {
        if let Some(from) = from.filter(|f| self.enabled(*f)) {
            self.systemd.disable(&from.unit())?;
        }
        self.enable(to)
    }

    /// Refuses a host whose node machines kubeslot does not account for: a
    /// machine running while no slot is committed, or a host that
    /// unbounded-agent provisioned (its applied config) with no kubeslot
    /// state yet.
    fn refuse_foreign(&self, state: &State) -> Result<(), ActivateError> {
        if let Some(active) = state.active {
            // Whatever the committed node does, nothing else may run as
            // the other slot's machine: they share the host network and
            // the node state, and a flip would stage under it.
            let other = active.other();
            if self.running(other)? {
                return Err(ActivateError::MachineRunning {
                    machine: other,
                    why: format!(
                        ", but the committed node is {active}: two node machines never run at once (they share the host network and /var/lib/kubeslot/node); stop {other} (`machinectl stop {other}`), then run this again"
                    ),
                });
            }
            return Ok(());
        }
        for slot in Slot::ALL {
            if self.running(slot)? {
                return Err(ActivateError::Unmanaged {
                    machine: slot,
                    state: self.root.state_file(),
                });
            }
        }
        if !self.root.state_file().exists() {
            for slot in Slot::ALL {
                let applied = self.root.unbounded_applied_config(slot.machine());
                if applied.exists() {
                    return Err(ActivateError::Unbounded {
                        machine: slot,
                        applied,
                    });
                }
            }
        }
        Ok(())
    }

    /// `activate`'s reconcile: the committed slot is enabled at boot and
    /// runs; when it does not (a host reboot that lost it, a machine that
    /// was stopped by hand) it is started and gated, and the report's
    /// outcome says `started`. A run never starts it beside the other slot's
    /// running machine ([`Host::refuse_foreign`] refused that before).
    ///
    /// Returns the gate's failure when the committed node did not come up
    /// (also noted in the report's `reconcile`): the caller decides with
    /// the plan whether that ends the run.
    ///
    /// With `force` a running committed node is gated too (`activate
    /// --force` re-stages an image whose node runs but is not healthy).
    fn reconcile(
        &self,
        state: &State,
        force: bool,
        report: &mut Report,
    ) -> Result<Option<Failure>, ActivateError> {
        let Some(active) = state.active else {
            return Ok(None);
        };
        self.ensure_enabled(Some(active))?;
        let running = self.running(active)?;
        if running && !force {
            return Ok(None);
        }
        report.phase("reconcile");
        let (gate, gpu) = match load_slot_config(self.root, active) {
            Ok(c) => {
                let gpu = render::gather(self.root, &c)
                    .map(|f| f.gpu.devices)
                    .unwrap_or_default();
                (Gate::on_host(&c.health, self.root), gpu)
            }
            // an adopted tree has no slot config
            Err(_) => (
                Gate::on_host(&fallback_health(self.root), self.root),
                Vec::new(),
            ),
        };
        let verdict = if running {
            health::wait_healthy(self.systemd, active, &gate, &gpu)
        } else {
            match self.systemd.start(&active.unit()) {
                Err(e) => Err(Failure {
                    machine: active.machine().to_string(),
                    check: Check::UnitStart,
                    detail: e.to_string(),
                }),
                Ok(()) => health::wait_healthy(self.systemd, active, &gate, &gpu),
            }
        };
        report.slot = Some(active);
        match verdict {
            Ok(()) => {
                if !running {
                    report.outcome = Some(Outcome::Started);
                }
                Ok(None)
            }
            Err(failure) => {
                report.reconcile = Some(if running {
                    format!("the committed node {active} runs, but {failure}")
                } else {
                    format!(
                        "the committed node {active} was not running: started it, but {failure}"
                    )
                });
                Ok(Some(failure))
            }
        }
    }

    /// Before a flip: the host settings written and applied, then every
    /// preflight check; a blocking failure refuses the flip before
    /// anything of the slots changes.
    fn preflight(&self, b: &Begun, report: &mut Report) -> Result<(), ActivateError> {
        report.phase("preflight");
        let written = host_settings::write(self.root).map_err(|e| ActivateError::HostSettings {
            reason: kubeslot_image::error_chain(&e),
        })?;
        let mut notes: Vec<String> = written
            .iter()
            .map(|p| format!("wrote /{}", p.display()))
            .collect();
        if !written.is_empty() || !host_settings::sysctls_hold(self.root) {
            let failed = host_settings::apply(self.root);
            notes.push(if failed.is_empty() {
                format!("applied ({})", host_settings::APPLIERS.join(", "))
            } else {
                format!("applying: {}", failed.join("; "))
            });
        }
        if !notes.is_empty() {
            report.host_settings = Some(notes.join("; "));
        }
        let result = preflight::run(
            self.root,
            &preflight::Inputs {
                gpu: b.config.gpu.clone(),
                ignore: b.config.preflight.ignore.clone(),
                disk: flip_disk_use(self.root, b),
                swap_allowed: b.config.kubelet_allows_swap(),
                settings_pending: false,
            },
        );
        report.preflight = result.notable();
        if result.passed() {
            return Ok(());
        }
        Err(ActivateError::Preflight {
            count: result.blocking().len(),
            summary: result.failure_summary(),
        })
    }
}

/// What `plan` and `activate --dry-run` show, computed without the lock and
/// without writing anything.
pub struct Preview {
    pub state: State,
    pub image: String,
    pub plan: Plan,
    /// Diffs of the target slot's host files (empty when up to date).
    pub diffs: Vec<render::FileDiff>,
    /// Diffs of the host settings (sysctl, modules-load drop-ins) the next
    /// flip writes and applies (empty when they are current).
    pub host_settings: Vec<render::FileDiff>,
}

pub fn preview(root: &Root, config_path: &Path, force: bool) -> Result<Preview, ActivateError> {
    // read-only: a save that died between its writes is taken as the
    // next locked run will repair it
    let (state, _repair) = State::load_torn(root)?;
    let config = Config::load(config_path)?;
    let facts = gather(root, config_path, &config)?;
    let digest = resolve(root, &config)?;
    let inputs = inputs_hash(&config, &facts);
    let current = state
        .active
        .is_some_and(|a| files_current(root, &config, a, &facts));
    let plan = plan::activate(&state, digest, &inputs, current, force);
    let diffs = match &plan {
        Plan::Flip(f) => render::diff(root, &render::render(&config, f.to, &facts))
            .into_iter()
            .filter(|d| !d.diff.is_empty())
            .collect(),
        _ => Vec::new(),
    };
    Ok(Preview {
        state,
        image: config.image.to_string(),
        plan,
        diffs,
        host_settings: host_settings::diff(root),
    })
}

#[cfg(test)]
mod tests {
    //! The flip engine against a recording fake of the systemd trait; the
    //! black-box tests (`tests/host.rs`) run the binary with fake tools.

    use super::*;
    use std::cell::RefCell;
    use std::collections::{BTreeMap, BTreeSet};
    use std::io::{Read as _, Write as _};
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use kubeslot_image::layout::Layout;
    use kubeslot_image::oci::{
        Compression, Descriptor, Index, ANNOTATION_REF_NAME, MEDIA_TYPE_CONFIG, MEDIA_TYPE_INDEX,
        MEDIA_TYPE_MANIFEST,
    };

    /// Records every call; a started machine is healthy unless its tree's
    /// `etc/fixture-health` says otherwise; the kubelet endpoint is served
    /// by a thread answering from `healthy`.
    struct Fake {
        root: Root,
        calls: RefCell<Vec<String>>,
        active: RefCell<BTreeSet<String>>,
        healthy: Arc<AtomicBool>,
        fail_stop: bool,
        fail_start: bool,
        gpu_visible: bool,
        /// Machines machined knows that no unit of ours started.
        foreign: RefCell<BTreeSet<String>>,
    }

    fn machine_of(unit: &str) -> Option<&str> {
        unit.strip_prefix("systemd-nspawn@")?
            .strip_suffix(".service")
    }

    impl Fake {
        fn new(root: &Root) -> (Fake, String) {
            let healthy = Arc::new(AtomicBool::new(false));
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let url = format!("http://{}/healthz", l.local_addr().unwrap());
            let h = healthy.clone();
            std::thread::spawn(move || {
                for s in l.incoming() {
                    let Ok(mut s) = s else { continue };
                    let mut buf = [0u8; 512];
                    let _ = s.read(&mut buf);
                    let answer: &[u8] = if h.load(Ordering::SeqCst) {
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
                    } else {
                        b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n"
                    };
                    let _ = s.write_all(answer);
                }
            });
            let fake = Fake {
                root: root.clone(),
                calls: RefCell::default(),
                active: RefCell::default(),
                healthy,
                fail_stop: false,
                fail_start: false,
                gpu_visible: true,
                foreign: RefCell::default(),
            };
            (fake, url)
        }

        fn calls(&self) -> Vec<String> {
            self.calls.borrow().clone()
        }

        /// `Where=` and `Options=` of an installed mount unit.
        fn mount_of(&self, unit: &str) -> (String, String) {
            let text = std::fs::read_to_string(self.root.systemd_system_dir().join(unit)).unwrap();
            let field = |k: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(k))
                    .unwrap()
                    .to_string()
            };
            (field("Where="), field("Options="))
        }

        fn failed(&self, command: &str) -> SystemdError {
            SystemdError::Failed {
                command: command.into(),
                status: "exit status: 1".into(),
                stderr: "fake failure".into(),
            }
        }
    }

    impl Drop for Fake {
        /// No overlay stays mounted in a removed temp dir.
        fn drop(&mut self) {
            for unit in self
                .active
                .borrow()
                .iter()
                .filter(|u| u.ends_with(".mount"))
            {
                let (target, _) = self.mount_of(unit);
                let _ = std::process::Command::new("umount").arg(&target).status();
            }
        }
    }

    impl Systemd for Fake {
        fn daemon_reload(&self) -> Result<(), SystemdError> {
            self.calls.borrow_mut().push("daemon-reload".into());
            Ok(())
        }

        fn start(&self, unit: &str) -> Result<(), SystemdError> {
            self.calls.borrow_mut().push(format!("start {unit}"));
            if unit.ends_with(".mount") {
                // A real mount of what the unit says (overlay slots).
                let (target, options) = self.mount_of(unit);
                if !self.active.borrow().contains(unit) {
                    let ok = std::process::Command::new("mount")
                        .args(["-t", "overlay", "overlay", "-o", &options])
                        .arg(&target)
                        .status()
                        .unwrap()
                        .success();
                    assert!(ok, "mount {unit}");
                    self.active.borrow_mut().insert(unit.into());
                }
                return Ok(());
            }
            if self.fail_start {
                return Err(self.failed(&format!("systemctl start {unit}")));
            }
            let machine = unit
                .trim_start_matches("systemd-nspawn@")
                .trim_end_matches(".service");
            let health =
                std::fs::read_to_string(self.root.machine_tree(machine).join("etc/fixture-health"))
                    .unwrap_or_default();
            self.healthy.store(health == "healthy", Ordering::SeqCst);
            self.active.borrow_mut().insert(unit.into());
            Ok(())
        }

        fn stop(&self, unit: &str) -> Result<(), SystemdError> {
            self.calls.borrow_mut().push(format!("stop {unit}"));
            if unit.ends_with(".mount") {
                if self.active.borrow_mut().remove(unit) {
                    let (target, _) = self.mount_of(unit);
                    let ok = std::process::Command::new("umount")
                        .arg(&target)
                        .status()
                        .unwrap()
                        .success();
                    assert!(ok, "umount {unit}");
                }
                return Ok(());
            }
            if self.fail_stop {
                return Err(self.failed(&format!("systemctl stop {unit}")));
            }
            if self.active.borrow_mut().remove(unit) {
                self.healthy.store(false, Ordering::SeqCst);
            }
            Ok(())
        }

        fn is_active(&self, unit: &str) -> Result<bool, SystemdError> {
            Ok(self.active.borrow().contains(unit))
        }

        /// Makes (removes) the link a real `systemctl enable` makes for a
        /// node machine's unit.
        fn enable(&self, unit: &str) -> Result<(), SystemdError> {
            self.calls.borrow_mut().push(format!("enable {unit}"));
            if let Some(m) = machine_of(unit) {
                let link = self.root.machine_wants_link(m);
                std::fs::create_dir_all(link.parent().unwrap()).unwrap();
                let _ =
                    std::os::unix::fs::symlink("/lib/systemd/system/systemd-nspawn@.service", link);
            }
            Ok(())
        }

        fn disable(&self, unit: &str) -> Result<(), SystemdError> {
            self.calls.borrow_mut().push(format!("disable {unit}"));
            if let Some(m) = machine_of(unit) {
                let _ = std::fs::remove_file(self.root.machine_wants_link(m));
            }
            Ok(())
        }

        fn machine_registered(&self, machine: &str) -> Result<bool, SystemdError> {
            Ok(self.foreign.borrow().contains(machine)
                || self
                    .active
                    .borrow()
                    .contains(&format!("systemd-nspawn@{machine}.service")))
        }

        fn run_in_machine(&self, machine: &str, argv: &[&str]) -> Result<bool, SystemdError> {
            self.calls
                .borrow_mut()
                .push(format!("run {machine} {}", argv.join(" ")));
            Ok(self.gpu_visible)
        }
    }

    fn tar_gz(files: &[(&str, &[u8])]) -> (Vec<u8>, Digest) {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in files {
            let mut h = tar::Header::new_ustar();
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(0o644);
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(0);
            h.set_size(data.len() as u64);
            b.append_data(&mut h, name, *data).unwrap();
        }
        let tar = b.into_inner().unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&tar).unwrap();
        (gz.finish().unwrap(), Digest::of(&tar))
    }

    /// A one-layer image tagged `t` in the layout at `dir` (created, or
    /// retagged when it exists); its machine is `health`.
    fn image(dir: &Path, health: &str) -> Digest {
        image_with(dir, health, "")
    }

    /// [`image`] with `etc/version` holding `version` (a distinct image
    /// with the same health).
    fn image_with(dir: &Path, health: &str, version: &str) -> Digest {
        image_created(dir, health, version, None)
    }

    /// [`image_with`] whose config says it was `created` then.
    fn image_created(dir: &Path, health: &str, version: &str, created: Option<&str>) -> Digest {
        let layout = if dir.join("index.json").exists() {
            Layout::open(dir).unwrap()
        } else {
            Layout::create(dir).unwrap()
        };
        let (blob, diff_id) = tar_gz(&[
            ("etc/fixture-health", health.as_bytes()),
            ("etc/version", version.as_bytes()),
        ]);
        let layer = layout.blobs().put_bytes(&blob).unwrap();
        let mut config = serde_json::json!({
            "architecture": Platform::host().architecture, "os": "linux", "config": {},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        });
        if let Some(c) = created {
            config["created"] = c.into();
        }
        let config = serde_json::to_vec(&config).unwrap();
        let cd = layout.blobs().put_bytes(&config).unwrap();
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2, "mediaType": MEDIA_TYPE_MANIFEST,
            "config": Descriptor::new(MEDIA_TYPE_CONFIG, cd, config.len() as u64),
            "layers": [Descriptor::new(Compression::Gzip.layer_media_type(), layer, blob.len() as u64)],
        }))
        .unwrap();
        let md = layout.blobs().put_bytes(&manifest).unwrap();
        let mut desc = Descriptor::new(MEDIA_TYPE_MANIFEST, md, manifest.len() as u64);
        desc.annotations
            .insert(ANNOTATION_REF_NAME.into(), "t".into());
        layout
            .write_index(&Index {
                schema_version: 2,
                media_type: Some(MEDIA_TYPE_INDEX.into()),
                manifests: vec![desc],
                annotations: Default::default(),
            })
            .unwrap();
        md
    }

    struct Setup {
        _dir: tempfile::TempDir,
        root: Root,
        config: PathBuf,
    }

    fn setup(health: &str, url: Option<&str>, gpu: &str) -> (Setup, Fake, Digest) {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path().join("root"));
        // a host preflight passes once the sysctl drop-in is applied
        kubeslot_test_support::fake_host(root.dir());
        let digest = image(&dir.path().join("img"), health);
        let (fake, served) = Fake::new(&root);
        let config = dir.path().join("activator.json");
        std::fs::write(
            &config,
            serde_json::to_vec(&serde_json::json!({
                "image": format!("oci:{}", dir.path().join("img").display()),
                "trust": {"allow_unsigned": true},
                "kubelet": {
                    "api_server": "https://10.0.0.1:6443",
                    "ca_data": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
                    "bootstrap_token": "abcdef.0123456789abcdef",
                    "node_name": "node-a",
                },
                "gpu": gpu,
                "nameservers": ["192.0.2.53"],
                "health": {"timeout_secs": 1, "successes": 2, "interval_ms": 20,
                           "kubelet_healthz_url": url.unwrap_or(&served)},
            }))
            .unwrap(),
        )
        .unwrap();
        (
            Setup {
                _dir: dir,
                root,
                config,
            },
            fake,
            digest,
        )
    }

    fn run(s: &Setup, fake: &Fake) -> Report {
        run_opts(s, fake, Options::default())
    }

    fn run_opts(s: &Setup, fake: &Fake, opts: Options) -> Report {
        let ran = activate(&s.root, &s.config, fake, &opts);
        ran.saved.unwrap();
        ran.report
    }

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
        assert!(files_current(
            &s.root,
            &load_slot_config(&s.root, Slot::Kube1).unwrap(),
            Slot::Kube1,
            &render::gather(&s.root, &Config::load(&s.config).unwrap()).unwrap()
        ));
        // again: nothing to do, nothing called
        let r = run(&s, &fake);
        assert_eq!(r.outcome, Some(Outcome::UpToDate));
        assert_eq!(fake.calls().len(), 4);
    }

    #[test]
    fn a_failed_start_rolls_back_with_the_check_named() {
        let (s, mut fake, digest) = setup("healthy", None, "off");
        fake.fail_start = true;
        let r = run(&s, &fake);
        assert_eq!(r.exit_code, exit::ROLLED_BACK);
        assert!(r.error.as_deref().unwrap().contains("unit-start"), "{r:?}");
        let st = State::load(&s.root).unwrap();
        assert_eq!(st.active, None);
        assert!(st.bad[0].reason.starts_with("unit-start"));
        assert_eq!(st.bad[0].digest, digest);
        // --force tries it again
        fake.fail_start = false;
        let r = run_opts(
            &s,
            &fake,
            Options {
                force: true,
                ..Options::default()
            },
        );
        assert_eq!(r.outcome, Some(Outcome::Committed), "{r:?}");
    }

    #[test]
    fn a_failed_stop_of_the_old_machine_does_not_use_up_the_try() {
        let (s, mut fake, digest) = setup("healthy", None, "off");
        assert_eq!(run(&s, &fake).exit_code, 0);
        // new host settings (a label) make a flip with the same image
        let mut c: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&s.config).unwrap()).unwrap();
        c["kubelet"]["labels"] = serde_json::json!({"pool": "b"});
        std::fs::write(&s.config, serde_json::to_vec(&c).unwrap()).unwrap();
        fake.fail_stop = true;
        let r = run(&s, &fake);
        assert_eq!(r.exit_code, exit::FAILED);
        assert!(r
            .error
            .as_deref()
            .unwrap()
            .contains("systemctl stop systemd-nspawn@kube1.service"));
        let st = State::load(&s.root).unwrap();
        assert!(st.pending.is_none() && st.bad.is_empty(), "{st:?}");
        assert_eq!(st.active, Some(Slot::Kube1));
        assert_eq!(st.slot(Slot::Kube2).status, SlotStatus::Staged);
        // the next run reuses the staged slot: no download, no restage
        fake.fail_stop = false;
        let r = run(&s, &fake);
        assert_eq!(r.outcome, Some(Outcome::Committed), "{r:?}");
        assert!(r.downloads.is_none());
        assert_eq!(
            State::load(&s.root).unwrap().slot(Slot::Kube2).digest,
            Some(digest)
        );
    }

    #[test]
    fn bound_gpus_must_be_visible_inside_the_machine() {
        let (s, mut fake, _) = setup("healthy", None, "on");
        crate::gpu::mknod_char(&s.root.dev().join("nvidia0"), 195, 0).unwrap();
        crate::gpu::mknod_char(&s.root.dev().join("nvidiactl"), 195, 255).unwrap();
        // the driver preflight wants
        let version = s.root.join("proc/driver/nvidia/version");
        std::fs::create_dir_all(version.parent().unwrap()).unwrap();
        std::fs::write(
            &version,
            "NVRM version: NVIDIA UNIX Kernel Module 550.54.15\n",
        )
        .unwrap();
        let ldconfig = s.root.ldconfig();
        std::fs::create_dir_all(ldconfig.parent().unwrap()).unwrap();
        let marker = match std::env::consts::ARCH {
            "aarch64" => "AArch64",
            _ => "x86-64",
        };
        std::fs::write(
            &ldconfig,
            format!("#!/bin/sh\nprintf '2 libs found in cache\\n\\tlibcuda.so.1 (libc6,{marker}) => /usr/lib/nvidia/libcuda.so.1\\n\\tlibnvidia-ml.so.1 (libc6,{marker}) => /usr/lib/nvidia/libnvidia-ml.so.1\\n'\n"),
        )
        .unwrap();
        // the libraries it lists, of the module's version (preflight's
        // gpu-libraries)
        let libs = s.root.join("usr/lib/nvidia");
        std::fs::create_dir_all(&libs).unwrap();
        for stem in ["libcuda", "libnvidia-ml"] {
            std::fs::write(libs.join(format!("{stem}.so.550.54.15")), b"").unwrap();
            std::os::unix::fs::symlink(
                format!("{stem}.so.550.54.15"),
                libs.join(format!("{stem}.so.1")),
            )
            .unwrap();
        }
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&ldconfig, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        fake.gpu_visible = false;
        let r = run(&s, &fake);
        assert_eq!(r.exit_code, exit::ROLLED_BACK, "{r:?}");
        assert!(r.error.as_deref().unwrap().contains("gpu-devices"), "{r:?}");
        assert!(fake
            .calls()
            .contains(&"run kube1 test -c /dev/nvidia0".to_string()));

        fake.gpu_visible = true;
        let r = run_opts(
            &s,
            &fake,
            Options {
                force: true,
                ..Options::default()
            },
        );
        assert_eq!(r.outcome, Some(Outcome::Committed), "{r:?}");
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

    #[test]
    fn an_unhealthy_first_machine_leaves_nothing_running() {
        let (s, fake, _) = setup("never", None, "off");
        let r = run(&s, &fake);
        assert_eq!(r.exit_code, exit::ROLLED_BACK);
        let e = r.error.unwrap();
        assert!(
            e.contains("kubelet-healthz") && e.contains("no machine"),
            "{e}"
        );
        assert!(fake.active.borrow().is_empty());
    }

    #[test]
    fn a_tag_moved_between_resolve_and_stage_cannot_change_what_is_staged() {
        let (s, _fake, first) = setup("healthy", None, "off");
        let config = Config::load(&s.config).unwrap();
        let resolved = open_verified(&s.root, &config).unwrap();
        assert_eq!(resolved.digest(), first);
        // the tag now names another image
        let kubeslot_image::reference::ImageSource::Layout { dir, .. } = &config.image else {
            panic!("layout source expected");
        };
        let moved = image(dir, "moved");
        assert_ne!(moved, first);
        assert_eq!(resolve(&s.root, &config).unwrap(), moved);

        let staged = stage::stage_resolved(
            &s.root,
            resolved.source,
            &resolved.verified,
            &config.unpack,
            "kube1",
        )
        .unwrap();
        assert_eq!(staged.manifest_digest, first);
        let tree = s.root.machine_tree("kube1");
        assert_eq!(
            std::fs::read_to_string(tree.join("etc/fixture-health")).unwrap(),
            "healthy"
        );
    }

    /// Watches `path` for opens (inotify); [`opens`] counts them.
    fn watch_opens(path: &Path) -> rustix::fd::OwnedFd {
        use rustix::fs::inotify;
        let fd =
            inotify::init(inotify::CreateFlags::NONBLOCK | inotify::CreateFlags::CLOEXEC).unwrap();
        // Close events too: the kernel merges identical consecutive unread
        // events, so two opens in a row would count as one.
        inotify::add_watch(
            &fd,
            path,
            inotify::WatchFlags::OPEN | inotify::WatchFlags::CLOSE_NOWRITE,
        )
        .unwrap();
        fd
    }

    fn opens(fd: &rustix::fd::OwnedFd) -> usize {
        use rustix::fs::inotify;
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
        let mut reader = inotify::Reader::new(fd, &mut buf);
        let mut n = 0;
        while let Ok(e) = reader.next() {
            if e.events().contains(inotify::ReadFlags::OPEN) {
                n += 1;
            }
        }
        n
    }

    fn archive_of(layout: &Path) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        b.append_dir_all(".", layout).unwrap();
        b.into_inner().unwrap()
    }

    #[test]
    fn an_archive_source_is_extracted_once_per_run() {
        let (s, fake, digest) = setup("healthy", None, "off");
        let dir = s.config.parent().unwrap().to_path_buf();
        let archive = dir.join("image.oci.tar");
        std::fs::write(&archive, archive_of(&dir.join("img"))).unwrap();
        let watch = watch_opens(&archive);
        let mut c: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&s.config).unwrap()).unwrap();
        c["image"] = format!("oci-archive:{}:t", archive.display()).into();
        std::fs::write(&s.config, serde_json::to_vec(&c).unwrap()).unwrap();

        let r = run(&s, &fake);
        assert_eq!(r.outcome, Some(Outcome::Committed), "{r:?}");
        assert_eq!(r.digest, Some(digest));
        assert_eq!(opens(&watch), 1, "the archive was not read exactly once");
        // an up-to-date run resolves (and so extracts) once too
        assert_eq!(run(&s, &fake).outcome, Some(Outcome::UpToDate));
        assert_eq!(opens(&watch), 1);
        // nothing of the extraction is left
        let left: Vec<_> = std::fs::read_dir(s.root.machines_dir())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .filter(|n| n.to_string_lossy().starts_with(".archive-"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn the_disk_need_counts_what_the_store_lacks_and_reads_stored_layer_sizes() {
        let (s, fake, _) = setup("healthy", None, "off");
        let config = Config::load(&s.config).unwrap();
        let image = open_verified(&s.root, &config).unwrap().verified.image;
        let blobs: u64 =
            image.manifest.config.size + image.layers.iter().map(|(d, _, _)| d.size).sum::<u64>();
        // an empty store: everything to fetch, the tree estimated
        let need = preflight::DiskNeed::of(&s.root, &image);
        assert_eq!(
            (need.fetch, need.exact_layers, need.layers),
            (blobs, 0, 1),
            "{need:?}"
        );
        assert_eq!(need.tree, image.layers[0].0.size * 4);
        // once stored: nothing to fetch, the tree from the gzip trailer
        // plus a tenth (the layer's tar is 2560 bytes: a header and a data
        // block for etc/fixture-health, a header for the empty
        // etc/version, the two end blocks)
        assert_eq!(run(&s, &fake).outcome, Some(Outcome::Committed));
        let need = preflight::DiskNeed::of(&s.root, &image);
        assert_eq!((need.fetch, need.exact_layers), (0, 1), "{need:?}");
        assert_eq!(need.tree, 2560 + 256);
    }

    #[test]
    fn fetch_stages_without_touching_machines_and_activate_reuses_the_slot() {
        let (s, fake, first) = setup("healthy", None, "off");
        assert_eq!(run(&s, &fake).outcome, Some(Outcome::Committed));
        let config = Config::load(&s.config).unwrap();
        let kubeslot_image::reference::ImageSource::Layout { dir, .. } = &config.image else {
            panic!("layout source expected");
        };
        let second = image_with(dir, "healthy", "2");
        let calls = fake.calls().len();

        let r = fetch(&s.root, &s.config, &fake, &Options::default()).report;
        assert_eq!(
            (r.exit_code, r.outcome, r.slot, r.digest),
            (0, Some(Outcome::Staged), Some(Slot::Kube2), Some(second)),
            "{r:?}"
        );
        assert!(r.downloads.unwrap().blobs_fetched > 0, "{r:?}");
        assert_eq!(fake.calls().len(), calls, "fetch called systemd");
        let st = State::load(&s.root).unwrap();
        assert_eq!(st.active, Some(Slot::Kube1));
        assert_eq!(st.slot(Slot::Kube1).digest, Some(first));
        assert_eq!(st.slot(Slot::Kube2).status, SlotStatus::Staged);
        assert_eq!(st.slot(Slot::Kube2).digest, Some(second));
        assert!(!s.root.nspawn_file("kube2").exists());

        let r = activate(&s.root, &s.config, &fake, &Options::default()).report;
        assert_eq!(r.outcome, Some(Outcome::Committed), "{r:?}");
        assert!(r.downloads.is_none(), "restaged: {r:?}");
        assert_eq!(State::load(&s.root).unwrap().active, Some(Slot::Kube2));
    }

    /// The tree of `machine` as path -> contents (files only).
    fn files_of(root: &Path) -> BTreeMap<String, Vec<u8>> {
        let mut out = BTreeMap::new();
        let mut stack = vec![root.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    let rel = p.strip_prefix(root).unwrap().display().to_string();
                    out.insert(rel, std::fs::read(&p).unwrap());
                }
            }
        }
        out
    }

    #[test]
    fn overlay_slots_share_layers_and_rollback_clean_is_the_verified_image() {
        let (s, fake, first) = setup("healthy", None, "off");
        let mut c: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&s.config).unwrap()).unwrap();
        c["slots"] = serde_json::json!({"mode": "overlay"});
        std::fs::write(&s.config, serde_json::to_vec(&c).unwrap()).unwrap();

        let r = run(&s, &fake);
        assert_eq!(r.outcome, Some(Outcome::Committed), "{r:?}");
        assert_eq!(r.slot_mode.as_deref(), Some("overlay"));
        let d = r.downloads.unwrap();
        assert_eq!((d.layers_unpacked, d.layers_reused), (Some(1), Some(0)));
        let unit = s.root.mount_unit("kube1");
        let calls = fake.calls();
        let mounted = calls.iter().position(|c| *c == format!("start {unit}"));
        let started = calls
            .iter()
            .position(|c| c == "start systemd-nspawn@kube1.service");
        assert!(mounted < started && mounted.is_some(), "{calls:?}");
        let kube1 = s.root.machine_tree("kube1");
        let verified = files_of(&kube1);
        assert_eq!(verified["etc/fixture-health"], b"healthy");

        // The node writes into its tree: only its upper changes.
        std::fs::write(kube1.join("etc/written-by-node"), b"x").unwrap();
        std::fs::write(kube1.join("etc/version"), b"changed by the node").unwrap();
        let layers_before = files_of(&s.root.layers_dir());

        let config = Config::load(&s.config).unwrap();
        let kubeslot_image::reference::ImageSource::Layout { dir, .. } = &config.image else {
            panic!("layout source expected");
        };
        let second = image_with(dir, "healthy", "2");
        let r = run(&s, &fake);
        assert_eq!(
            (r.outcome, r.slot),
            (Some(Outcome::Committed), Some(Slot::Kube2)),
            "{r:?}"
        );
        let d = r.downloads.unwrap();
        assert_eq!((d.layers_unpacked, d.layers_reused), (Some(1), Some(0)));
        assert_eq!(
            State::load(&s.root).unwrap().slot(Slot::Kube2).digest,
            Some(second)
        );
        // kube1's layer is untouched by the node's writes and by the flip.
        let layers_after = files_of(&s.root.layers_dir());
        for (k, v) in &layers_before {
            assert_eq!(layers_after.get(k), Some(v), "{k}");
        }

        let r = rollback_with(&s.root, &fake, true).report;
        assert_eq!(
            (r.outcome, r.slot),
            (Some(Outcome::Committed), Some(Slot::Kube1)),
            "{r:?}"
        );
        assert_eq!(
            State::load(&s.root).unwrap().slot(Slot::Kube1).digest,
            Some(first)
        );
        assert_eq!(files_of(&kube1), verified, "kube1 after rollback --clean");

        // v3 replaces v2 in kube2: v2's layer is mounted by no slot and goes.
        let v2_layers = crate::layers::referenced(&s.root).unwrap();
        let third = image_with(dir, "healthy", "3");
        let r = run_opts(
            &s,
            &fake,
            Options {
                force: true,
                ..Options::default()
            },
        );
        assert_eq!(
            (r.outcome, r.slot),
            (Some(Outcome::Committed), Some(Slot::Kube2)),
            "{r:?}"
        );
        assert_eq!(
            State::load(&s.root).unwrap().slot(Slot::Kube2).digest,
            Some(third)
        );
        assert!(
            r.gc.as_deref().unwrap().contains(", 1 layer dir(s);"),
            "{r:?}"
        );
        let now = crate::layers::referenced(&s.root).unwrap();
        let gone: Vec<_> = v2_layers.difference(&now).collect();
        assert_eq!(gone.len(), 1);
        assert!(!gone[0].exists(), "{}", gone[0].display());
        assert!(!crate::integrity::record_path(gone[0]).exists());
        // two layer dirs and their records
        assert_eq!(std::fs::read_dir(s.root.layers_dir()).unwrap().count(), 4);
    }

    /// Sets `trust.identity` in the setup's config: its images have an
    /// identity, so commits record releases.
    fn with_identity(s: &Setup) {
        let mut c: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&s.config).unwrap()).unwrap();
        c["trust"]["identity"] = "registry.example/org/node".into();
        std::fs::write(&s.config, serde_json::to_vec(&c).unwrap()).unwrap();
    }

    fn img_dir(s: &Setup) -> PathBuf {
        s._dir.path().join("img")
    }

    fn activate_with(s: &Setup, fake: &Fake, allow_downgrade: bool) -> Report {
        run_opts(
            s,
            fake,
            Options {
                allow_downgrade,
                ..Options::default()
            },
        )
    }

    #[test]
    fn an_older_release_is_refused_unless_a_downgrade_is_allowed() {
        let (s, fake, _) = setup("healthy", None, "off");
        with_identity(&s);
        let new = image_created(&img_dir(&s), "healthy", "2", Some("2026-11-02T00:00:00Z"));
        assert_eq!(run(&s, &fake).outcome, Some(Outcome::Committed));
        let state = State::load(&s.root).unwrap();
        assert_eq!(state.releases["registry.example/org/node"].digest, new);

        let old = image_created(&img_dir(&s), "healthy", "1", Some("2026-11-01T00:00:00Z"));
        let before = State::load(&s.root).unwrap();
        let r = run(&s, &fake);
        assert_eq!(r.exit_code, exit::BAD_IMAGE, "{r:?}");
        let e = r.error.unwrap();
        assert!(
            e.contains(&old.to_string())
                && e.contains(&new.to_string())
                && e.contains("2026-11-01T00:00:00Z")
                && e.contains("2026-11-02T00:00:00Z")
                && e.contains("downgrade"),
            "{e}"
        );
        assert_eq!(State::load(&s.root).unwrap(), before, "nothing changed");

        // Allowed for one run: committed, and the floor stays the newest.
        let r = activate_with(&s, &fake, true);
        assert_eq!(r.outcome, Some(Outcome::Committed), "{r:?}");
        let state = State::load(&s.root).unwrap();
        assert_eq!(state.slot(state.active.unwrap()).digest, Some(old));
        assert_eq!(state.releases["registry.example/org/node"].digest, new);
        // Running it is not a downgrade: the next plain run is up to date.
        assert_eq!(run(&s, &fake).outcome, Some(Outcome::UpToDate));

        // An image that states no creation time cannot be shown newer.
        let undated = image_created(&img_dir(&s), "healthy", "3", None);
        let r = run(&s, &fake);
        assert_eq!(r.exit_code, exit::BAD_IMAGE, "{r:?}");
        assert!(r.error.unwrap().contains(&undated.to_string()));
        // trust.allow_downgrade in the config does what the flag does.
        let mut c: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&s.config).unwrap()).unwrap();
        c["trust"]["allow_downgrade"] = true.into();
        std::fs::write(&s.config, serde_json::to_vec(&c).unwrap()).unwrap();
        assert_eq!(run(&s, &fake).outcome, Some(Outcome::Committed));
    }

    #[test]
    fn rollback_to_an_older_release_is_always_allowed() {
        let (s, fake, _) = setup("healthy", None, "off");
        with_identity(&s);
        let old = image_created(&img_dir(&s), "healthy", "1", Some("2026-11-01T00:00:00Z"));
        assert_eq!(run(&s, &fake).outcome, Some(Outcome::Committed));
        let new = image_created(&img_dir(&s), "healthy", "2", Some("2026-11-02T00:00:00Z"));
        assert_eq!(run(&s, &fake).outcome, Some(Outcome::Committed));
        let ran = rollback(&s.root, &fake);
        assert_eq!(
            ran.report.outcome,
            Some(Outcome::Committed),
            "{:?}",
            ran.report
        );
        let state = State::load(&s.root).unwrap();
        assert_eq!(state.slot(state.active.unwrap()).digest, Some(old));
        assert_eq!(state.releases["registry.example/org/node"].digest, new);
    }

    /// Re-tags the layout's `t` as a new index that wraps the manifest `t`
    /// names now (a different top-level digest, the same signed manifest).
    fn rewrap_in_index(dir: &Path, note: &str) -> Digest {
        let layout = Layout::open(dir).unwrap();
        let mut index = layout.index().unwrap();
        let mut manifest = index.manifests[0].clone();
        manifest.annotations.clear();
        manifest.platform = Some(Platform::host());
        let mut inner = serde_json::json!({
            "schemaVersion": 2, "mediaType": MEDIA_TYPE_INDEX, "manifests": [manifest],
        });
        inner["annotations"] = serde_json::json!({ "note": note });
        let bytes = serde_json::to_vec(&inner).unwrap();
        let digest = layout.blobs().put_bytes(&bytes).unwrap();
        let mut desc = Descriptor::new(MEDIA_TYPE_INDEX, digest, bytes.len() as u64);
        desc.annotations
            .insert(ANNOTATION_REF_NAME.into(), "t".into());
        index.manifests = vec![desc];
        layout.write_index(&index).unwrap();
        digest
    }

    #[test]
    fn a_manifest_rewrapped_in_a_new_index_is_the_same_image() {
        let (s, fake, manifest) = setup("healthy", None, "off");
        assert_eq!(run(&s, &fake).outcome, Some(Outcome::Committed));
        let index = rewrap_in_index(&img_dir(&s), "a new wrapper");
        let r = run(&s, &fake);
        assert_eq!(r.outcome, Some(Outcome::UpToDate), "{r:?}");
        assert_eq!((r.digest, r.index_digest), (Some(manifest), Some(index)));
    }

    #[test]
    fn a_bad_image_rewrapped_in_a_new_index_is_still_bad() {
        let (s, fake, _) = setup("healthy", None, "off");
        assert_eq!(run(&s, &fake).outcome, Some(Outcome::Committed));
        let bad = image_with(&img_dir(&s), "unhealthy", "2");
        assert_eq!(run(&s, &fake).exit_code, exit::ROLLED_BACK);
        rewrap_in_index(&img_dir(&s), "retry me");
        let r = run(&s, &fake);
        assert_eq!(r.exit_code, exit::BAD_IMAGE, "{r:?}");
        assert!(r.error.unwrap().contains(&bad.to_string()));
        assert!(State::load(&s.root)
            .unwrap()
            .bad
            .iter()
            .any(|b| b.digest == bad));
    }
}
