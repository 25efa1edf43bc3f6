//! Decide first, act second: what `activate`, `fetch` or `rollback` would
//! do, as a value computed from what a run knows without touching anything.
//!
//! [`decide`] is the one decision of `activate` and `fetch`: given a
//! [`Situation`] (the state after recovery, the resolved and verified image
//! with its release, the host-file inputs hash, whether the active slot's
//! files are current, which machines run, how the committed node is, the
//! flags, and once it ran the preflight) it returns a [`Decision`]: up to
//! date, a [`Flip`], or refused with a [`Reason`] (a bad image, a
//! downgrade, a committed node that does not come up, a machine kubeslot
//! does not account for, a failed preflight). `activate`, `fetch`, `plan`
//! and `--dry-run` all call it, so `plan` says what `activate` does and
//! with which exit code. [`decide_rollback`] does the same for a flip back
//! to the previous slot (`rollback` and `plan --rollback`). What the
//! decisions are made on is built in one place each
//! (`activate/begin.rs`: `situation`; `activate/rollback.rs`:
//! `situation`). This module reads no file and runs no command.

use std::fmt;
use std::path::PathBuf;

use kubeslot_image::digest::Digest;

use crate::activate::report::exit;
use crate::gate::health::Failure;
use crate::gate::preflight::Preflight;
use crate::slot::Slot;
use crate::state::{BadImage, FlipKind, Release, SlotStatus, State};

/// A switch from one slot to the other.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flip {
    pub kind: FlipKind,
    /// The slot running now (stopped during the flip), if any.
    pub from: Option<Slot>,
    pub from_digest: Option<Digest>,
    /// `from` is a tree `adopt` took over (it has no digest).
    pub from_adopted: bool,
    /// The slot switched to.
    pub to: Slot,
    pub digest: Digest,
    /// What the target slot held before (replaced by staging).
    pub replaces: Option<Digest>,
    /// The target already holds this image, staged with these inputs by a
    /// run that died before trying it: staging is skipped.
    pub reuse_staged: bool,
}

/// The image half of [`decide`]: what the state says of the desired image.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Plan {
    /// The active slot runs the desired image with current host files.
    UpToDate {
        slot: Slot,
        digest: Digest,
    },
    /// The desired image failed with these host-file inputs before; it is
    /// not retried without `--force` or new inputs.
    Refused(BadImage),
    Flip(Flip),
}

/// A flip back to the previous slot (`rollback`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rollback {
    /// The slot running now.
    pub from: Slot,
    pub from_digest: Option<Digest>,
    /// The previous slot, switched to.
    pub to: Slot,
    /// The image it holds; `None` for an adopted tree.
    pub digest: Option<Digest>,
}

/// Why `rollback` refuses, before anything changes. The messages are what
/// `rollback` reports and `plan --rollback` prints.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RollbackRefusal {
    #[error("rollback: no slot is active on this host")]
    NothingActive,
    #[error("rollback: slot {slot} holds no committed former node (status {status}); only a slot that ran before can be rolled back to")]
    NoPrevious { slot: Slot, status: SlotStatus },
    #[error("rollback: a flip to {to} of a dead run is pending; run `activate` (or `rollback`) again after it is recovered")]
    Pending { to: Slot },
    /// A machine the state does not account for ([`refuse_foreign`], the
    /// rule `activate` refuses by).
    #[error(transparent)]
    Foreign(Reason),
    #[error("rollback --clean: {slot} is a copied tree, not an overlay slot; nothing separates what its machine wrote from its image (a plain rollback keeps it)")]
    CleanNeedsOverlay { slot: Slot },
}

impl RollbackRefusal {
    /// The exit code `rollback` ends with (see [`crate::activate::report::exit`]).
    pub fn exit_code(&self) -> i32 {
        match self {
            RollbackRefusal::Foreign(reason) => reason.exit_code(),
            _ => exit::FAILED,
        }
    }

    /// The slot rolled back to, when the refusal came after it was found
    /// to hold a former node.
    pub fn target(&self) -> Option<Slot> {
        match self {
            RollbackRefusal::Foreign(Reason::MachineRunning { machine, .. }) => Some(*machine),
            RollbackRefusal::CleanNeedsOverlay { slot } => Some(*slot),
            _ => None,
        }
    }

    /// A stable name for `plan --rollback --json`.
    pub fn name(&self) -> &'static str {
        match self {
            RollbackRefusal::NothingActive => "nothing-active",
            RollbackRefusal::NoPrevious { .. } => "no-previous",
            RollbackRefusal::Pending { .. } => "pending",
            RollbackRefusal::Foreign(reason) => reason.name(),
            RollbackRefusal::CleanNeedsOverlay { .. } => "clean-needs-overlay",
        }
    }
}

/// What `activate` does to run `digest` with host-file inputs `inputs`.
///
/// `active_files_current`: the active slot's rendered files on disk equal
/// what rendering produces now (false when nothing is active).
fn activate(
    state: &State,
    digest: Digest,
    inputs: &str,
    active_files_current: bool,
    force: bool,
) -> Plan {
    if let Some(active) = state.active {
        let s = state.slot(active);
        // The files on disk decide, not the recorded inputs hash: the render
        // oneshot re-renders the active slot's device binds at every start,
        // and a GPU that appeared across a reboot is no reason to flip.
        if s.status == SlotStatus::Active
            && s.digest == Some(digest)
            && active_files_current
            && state.pending.is_none()
        {
            return Plan::UpToDate {
                slot: active,
                digest,
            };
        }
    }
    if !force {
        if let Some(bad) = state.is_bad(&digest, inputs) {
            return Plan::Refused(bad.clone());
        }
    }
    Plan::Flip(restage(state, digest, inputs))
}

/// A flip of `digest` into the slot that is not active, whatever the
/// active one runs: what [`activate`] plans for a new image, and what
/// `activate --force` does when the committed node runs the desired image
/// but does not come up (its tree or files broken): the image is staged
/// afresh beside it.
fn restage(state: &State, digest: Digest, inputs: &str) -> Flip {
    let to = state.active.map_or(Slot::Kube1, Slot::other);
    let target = state.slot(to);
    Flip {
        kind: FlipKind::Activate,
        from: state.active,
        from_digest: state.active_digest(),
        from_adopted: state.active.is_some_and(|a| state.slot(a).adopted),
        to,
        digest,
        replaces: target.digest,
        reuse_staged: target.status == SlotStatus::Staged
            && target.digest == Some(digest)
            && target.inputs.as_deref() == Some(inputs),
    }
}

/// Which command decides: `fetch` stages only (the committed node is not
/// looked at, the preflight is the disk check alone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Activate,
    Fetch,
}

/// The node machines as systemd knows them, and what another tool left.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Machines {
    /// The slots whose machine runs (its unit is active, or machined knows
    /// a machine of that name).
    pub running: Vec<Slot>,
    /// unbounded-agent's applied config of a machine, found while kubeslot
    /// has no state file on this host.
    pub unbounded: Option<(Slot, PathBuf)>,
    /// The state file (named when a machine runs that it does not record).
    pub state_file: PathBuf,
}

impl Machines {
    pub fn runs(&self, slot: Slot) -> bool {
        self.running.contains(&slot)
    }
}

/// The committed node as the run found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Committed {
    /// Nothing is committed, or its machine runs (checked by the gate when
    /// `--force` asked for it), or it was started and passed the gate.
    Up,
    /// It did not come up (or, forced, failed its gate): the gate's failure.
    Down(Failure),
    /// Not looked at: `plan` starts nothing, so it cannot know whether a
    /// stopped committed node comes up (`activate` starts and gates it
    /// first), nor, under `--force`, whether a running one passes the gate.
    Unchecked,
}

/// Everything a run knows before it acts.
#[derive(Clone, Debug)]
pub struct Situation {
    pub command: Command,
    /// The state, after recovery.
    pub state: State,
    /// The image the reference resolved to and that was verified.
    pub digest: Digest,
    /// What a commit of it records for its identity (its signed creation
    /// time); `None` when no identity applies.
    pub release: Option<Release>,
    /// The host-file inputs hash.
    pub inputs: String,
    /// The active slot's host files on disk are what rendering gives now.
    pub active_files_current: bool,
    pub machines: Machines,
    pub committed: Committed,
    /// `--force`: retry a bad image, restage a node that does not come up.
    pub force: bool,
    /// `--allow-downgrade` or `trust.allow_downgrade`.
    pub allow_downgrade: bool,
    /// The preflight of the flip, once it ran (`None` before).
    pub preflight: Option<Preflight>,
}

/// What a run does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The active slot runs the desired image with current host files.
    UpToDate {
        slot: Slot,
        digest: Digest,
    },
    Flip(Flip),
    Refused(Reason),
}

/// Why a run refuses, before anything of the slots changes. The messages
/// are what `activate` reports and `plan` prints.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Reason {
    /// The image failed with these host-file inputs before.
    #[error("image {}: failed on this host at {} ({}); not retried automatically (publish a new image, change the host settings, or pass --force)", .0.digest, .0.at, .0.reason)]
    Bad(BadImage),
    #[error("image {} of {} was created {}, before {} (created {}), the newest release this host committed: refused as a downgrade (pass --allow-downgrade or set trust.allow_downgrade to run an older release; rollback is always allowed)",
        .candidate.digest, .candidate.identity,
        if .candidate.created.is_empty() { "at no stated time" } else { .candidate.created.as_str() },
        .newest.digest, .newest.created)]
    Downgrade {
        candidate: Box<Release>,
        newest: Box<Release>,
    },
    /// The committed node runs the desired image but did not come up;
    /// nothing else to do without `--force`.
    #[error("the committed node {slot} was not running: started it, but {failure} (`kubeslot-activator activate --force` stages the image afresh into {} and flips to it; `rollback` returns to the previous slot)", slot.other())]
    NotHealthy { slot: Slot, failure: Failure },
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
    #[error("preflight: {count} check(s) failed: {summary}; nothing was staged, stopped or started (fix the host, or ignore a check with the config's \"preflight\": {{\"ignore\": [NAME]}})")]
    Preflight { count: usize, summary: String },
}

impl Reason {
    /// The exit code `activate` ends with (see [`crate::activate::report::exit`]).
    pub fn exit_code(&self) -> i32 {
        match self {
            Reason::Bad(_) | Reason::Downgrade { .. } => exit::BAD_IMAGE,
            Reason::NotHealthy { .. } => exit::FAILED,
            Reason::Unmanaged { .. }
            | Reason::Unbounded { .. }
            | Reason::MachineRunning { .. }
            | Reason::Preflight { .. } => exit::CONFIG,
        }
    }

    /// A stable name for `plan --json`.
    pub fn name(&self) -> &'static str {
        match self {
            Reason::Bad(_) => "bad-image",
            Reason::Downgrade { .. } => "downgrade",
            Reason::NotHealthy { .. } => "not-healthy",
            Reason::Unmanaged { .. } => "unmanaged-machine",
            Reason::Unbounded { .. } => "unbounded-agent",
            Reason::MachineRunning { .. } => "machine-running",
            Reason::Preflight { .. } => "preflight",
        }
    }
}

/// The one decision of `activate` and `fetch` (and so of `plan`). In
/// order: a machine the state does not account for refuses; the image
/// plan (`activate` below): up to date (unless the committed node is down:
/// refused, or with `--force` staged afresh), refused as bad, or a flip;
/// a flip to an image older than the newest committed release of its
/// identity refuses (the image the committed node runs never does); a
/// failed preflight refuses the flip.
pub fn decide(s: &Situation) -> Decision {
    if let Err(reason) = refuse_foreign(&s.state, &s.machines) {
        return Decision::Refused(reason);
    }
    let flip = match activate(
        &s.state,
        s.digest,
        &s.inputs,
        s.active_files_current,
        s.force,
    ) {
        Plan::UpToDate { slot, digest } => match (&s.committed, s.command) {
            (Committed::Down(failure), Command::Activate) if !s.force => {
                return Decision::Refused(Reason::NotHealthy {
                    slot,
                    failure: failure.clone(),
                });
            }
            // --force: the same image into the other slot, from the store
            // (or the registry), through the same preflight and gate.
            (Committed::Down(_), Command::Activate) => restage(&s.state, s.digest, &s.inputs),
            _ => return Decision::UpToDate { slot, digest },
        },
        Plan::Refused(bad) => return Decision::Refused(Reason::Bad(bad)),
        Plan::Flip(f) => f,
    };
    if let Some(r) = &s.release {
        // The image the committed node already runs is never a downgrade
        // (a forced restage of it, say).
        let running_it = s.state.active_digest() == Some(r.digest);
        if !s.allow_downgrade && !running_it {
            if let Err(reason) = refuse_downgrade(&s.state, r) {
                return Decision::Refused(reason);
            }
        }
    }
    if let Some(p) = s.preflight.as_ref().filter(|p| !p.passed()) {
        return Decision::Refused(Reason::Preflight {
            count: p.blocking().len(),
            summary: p.failure_summary(),
        });
    }
    Decision::Flip(flip)
}

/// Refuses a host whose node machines kubeslot does not account for: with
/// a committed slot, a machine running as the other one (two node machines
/// never run at once, and the other slot is where a flip stages: its tree
/// is never written under a running machine); with none, any running
/// machine, or a host that unbounded-agent provisioned (its applied config)
/// with no kubeslot state yet.
pub fn refuse_foreign(state: &State, machines: &Machines) -> Result<(), Reason> {
    if let Some(active) = state.active {
        let other = active.other();
        if machines.runs(other) {
            return Err(Reason::MachineRunning {
                machine: other,
                why: format!(
                    ", but the committed node is {active}: two node machines never run at once (they share the host network and /var/lib/kubeslot/node); stop {other} (`machinectl stop {other}`), then run this again"
                ),
            });
        }
        return Ok(());
    }
    if let Some(&machine) = machines.running.first() {
        return Err(Reason::Unmanaged {
            machine,
            state: machines.state_file.clone(),
        });
    }
    if let Some((machine, applied)) = &machines.unbounded {
        return Err(Reason::Unbounded {
            machine: *machine,
            applied: applied.clone(),
        });
    }
    Ok(())
}

/// Refuses `candidate` when it is older than the newest release committed
/// for its identity. An image whose `created` is missing or unreadable
/// cannot be shown to be newer, so it is refused too once a release is
/// recorded. The same time is not older: a rebuild of one release (or
/// images whose recipes share `source_date_epoch`) passes.
fn refuse_downgrade(state: &State, candidate: &Release) -> Result<(), Reason> {
    let Some(newest) = state.releases.get(&candidate.identity) else {
        return Ok(());
    };
    let older = match (candidate.created_secs(), newest.created_secs()) {
        (Some(c), Some(n)) => c < n,
        (None, Some(_)) => true,
        (_, None) => false,
    };
    if older {
        return Err(Reason::Downgrade {
            candidate: Box::new(candidate.clone()),
            newest: Box::new(newest.clone()),
        });
    }
    Ok(())
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Decision::UpToDate { slot, digest } => {
                write!(
                    f,
                    "up to date: {slot} runs {digest} with current host files"
                )
            }
            Decision::Flip(flip) => flip.fmt(f),
            Decision::Refused(reason) => write!(f, "refused: {reason}"),
        }
    }
}

/// Everything `rollback` knows before it acts.
#[derive(Clone, Debug)]
pub struct RollbackSituation {
    /// The state, after recovery.
    pub state: State,
    pub machines: Machines,
    /// `--clean`: the previous slot first loses what its machine wrote.
    pub clean: bool,
    /// The slot a rollback returns to (the active one's other) is an
    /// overlay slot.
    pub overlay: bool,
}

/// The one decision of `rollback` (and so of `plan --rollback`): back to
/// the slot that ran before (a committed image or an adopted tree),
/// without downloading anything. In order: a dead run's flip still
/// pending, nothing active, no former node in the other slot, a machine
/// the state does not account for ([`refuse_foreign`], as `activate`),
/// `--clean` of a copied tree. Whether the previous slot's tree is still
/// what was committed away from is checked by `rollback` as it acts (an
/// overlay slot's tree is seen only once mounted), as the gate is.
pub fn decide_rollback(s: &RollbackSituation) -> Result<Rollback, RollbackRefusal> {
    let state = &s.state;
    if let Some(p) = &state.pending {
        return Err(RollbackRefusal::Pending { to: p.to });
    }
    let from = state.active.ok_or(RollbackRefusal::NothingActive)?;
    let to = from.other();
    let target = state.slot(to);
    let rb = match (target.status, target.digest) {
        (SlotStatus::Previous, digest) if digest.is_some() || target.adopted => Rollback {
            from,
            from_digest: state.active_digest(),
            to,
            digest,
        },
        (status, _) => return Err(RollbackRefusal::NoPrevious { slot: to, status }),
    };
    refuse_foreign(state, &s.machines).map_err(RollbackRefusal::Foreign)?;
    if s.clean && !s.overlay {
        return Err(RollbackRefusal::CleanNeedsOverlay { slot: to });
    }
    Ok(rb)
}

fn short(d: &Option<Digest>) -> String {
    d.map_or_else(|| "nothing".to_string(), |d| d.to_string())
}

/// A slot's image in messages: its digest, "adopted" for a tree `adopt`
/// took over, "nothing" for an empty one.
fn image_of(d: &Option<Digest>, adopted: bool) -> String {
    match (d, adopted) {
        (Some(d), _) => d.to_string(),
        (None, true) => "adopted tree".to_string(),
        (None, false) => "nothing".to_string(),
    }
}

impl fmt::Display for Rollback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "roll back {} ({}) -> {} ({})",
            self.from,
            short(&self.from_digest),
            self.to,
            image_of(&self.digest, self.digest.is_none())
        )
    }
}

impl fmt::Display for Flip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verb = match self.kind {
            FlipKind::Activate => "flip",
            FlipKind::Rollback => "roll back",
        };
        match self.from {
            Some(from) => write!(
                f,
                "{verb} {from} ({}) -> {} ({})",
                image_of(&self.from_digest, self.from_adopted),
                self.to,
                self.digest
            )?,
            None => write!(
                f,
                "{verb} to {} ({}), nothing active yet",
                self.to, self.digest
            )?,
        }
        if self.kind == FlipKind::Activate {
            if self.reuse_staged {
                write!(f, "; {} is already staged", self.to)?;
            } else {
                write!(
                    f,
                    "; stage into {} replacing {}",
                    self.to,
                    short(&self.replaces)
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::SlotState;

    fn d(s: &str) -> Digest {
        Digest::of(s.as_bytes())
    }

    fn committed(slot: Slot, digest: Digest) -> State {
        let mut s = State {
            active: Some(slot),
            ..State::default()
        };
        *s.slot_mut(slot) = SlotState {
            status: SlotStatus::Active,
            digest: Some(digest),
            inputs: Some("in".into()),
            adopted: false,
        };
        s
    }

    #[test]
    fn first_activation_goes_to_kube1() {
        let p = activate(&State::default(), d("v1"), "in", false, false);
        let Plan::Flip(f) = p else { panic!("{p:?}") };
        assert_eq!((f.from, f.to, f.reuse_staged), (None, Slot::Kube1, false));
    }

    #[test]
    fn same_digest_and_inputs_is_up_to_date_only_when_files_are_current() {
        let s = committed(Slot::Kube1, d("v1"));
        assert_eq!(
            activate(&s, d("v1"), "in", true, false),
            Plan::UpToDate {
                slot: Slot::Kube1,
                digest: d("v1")
            }
        );
        // files edited on disk, or new inputs: flip to the other slot
        let Plan::Flip(f) = activate(&s, d("v1"), "in", false, false) else {
            panic!()
        };
        assert_eq!((f.from, f.to), (Some(Slot::Kube1), Slot::Kube2));
        // inputs that changed while the files on disk are current (devices
        // re-rendered at boot): nothing to do
        assert!(matches!(
            activate(&s, d("v1"), "other", true, false),
            Plan::UpToDate { .. }
        ));
    }

    #[test]
    fn bad_pairs_are_refused_unless_forced_or_inputs_change() {
        let mut s = committed(Slot::Kube2, d("v2"));
        s.mark_bad(d("v3"), "in".into(), "kubelet-healthz".into());
        assert!(matches!(
            activate(&s, d("v3"), "in", true, false),
            Plan::Refused(b) if b.reason == "kubelet-healthz"
        ));
        assert!(matches!(
            activate(&s, d("v3"), "in", true, true),
            Plan::Flip(_)
        ));
        assert!(matches!(
            activate(&s, d("v3"), "new", true, false),
            Plan::Flip(_)
        ));
    }

    #[test]
    fn a_staged_target_is_reused() {
        let mut s = committed(Slot::Kube1, d("v1"));
        *s.slot_mut(Slot::Kube2) = SlotState {
            status: SlotStatus::Staged,
            digest: Some(d("v2")),
            inputs: Some("in".into()),
            adopted: false,
        };
        let Plan::Flip(f) = activate(&s, d("v2"), "in", true, false) else {
            panic!()
        };
        assert!(f.reuse_staged);
        let Plan::Flip(f) = activate(&s, d("v2"), "changed", true, false) else {
            panic!()
        };
        assert!(!f.reuse_staged);
    }

    fn rollback(state: &State) -> Result<Rollback, RollbackRefusal> {
        decide_rollback(&RollbackSituation {
            state: state.clone(),
            machines: Machines::default(),
            clean: false,
            overlay: false,
        })
    }

    #[test]
    fn rollback_refuses_a_running_target_and_a_clean_copied_tree() {
        let mut s = committed(Slot::Kube2, d("v2"));
        *s.slot_mut(Slot::Kube1) = SlotState {
            status: SlotStatus::Previous,
            digest: Some(d("v1")),
            inputs: Some("in".into()),
            adopted: false,
        };
        let mut rs = RollbackSituation {
            state: s,
            machines: Machines {
                running: vec![Slot::Kube2, Slot::Kube1],
                ..Machines::default()
            },
            clean: true,
            overlay: false,
        };
        // the rule activate refuses by, with its words and exit code
        let foreign = decide_rollback(&rs).unwrap_err();
        assert!(
            matches!(
                &foreign,
                RollbackRefusal::Foreign(Reason::MachineRunning {
                    machine: Slot::Kube1,
                    ..
                })
            ),
            "{foreign}"
        );
        assert_eq!(foreign.exit_code(), exit::CONFIG);
        assert_eq!(
            foreign.to_string(),
            refuse_foreign(&rs.state, &rs.machines)
                .unwrap_err()
                .to_string()
        );
        rs.machines.running = vec![Slot::Kube2];
        assert_eq!(
            decide_rollback(&rs),
            Err(RollbackRefusal::CleanNeedsOverlay { slot: Slot::Kube1 })
        );
        assert_eq!(decide_rollback(&rs).unwrap_err().exit_code(), exit::FAILED);
        rs.overlay = true;
        assert_eq!(decide_rollback(&rs).unwrap().to, Slot::Kube1);
    }

    #[test]
    fn rollback_needs_a_previous_slot() {
        let mut s = committed(Slot::Kube2, d("v2"));
        assert!(matches!(
            rollback(&s),
            Err(RollbackRefusal::NoPrevious {
                slot: Slot::Kube1,
                ..
            })
        ));
        *s.slot_mut(Slot::Kube1) = SlotState {
            status: SlotStatus::Previous,
            digest: Some(d("v1")),
            inputs: Some("in".into()),
            adopted: false,
        };
        let f = rollback(&s).unwrap();
        assert_eq!(
            (f.from, f.to, f.digest),
            (Slot::Kube2, Slot::Kube1, Some(d("v1")))
        );
        assert_eq!(
            rollback(&State::default()),
            Err(RollbackRefusal::NothingActive)
        );
    }

    #[test]
    fn an_adopted_tree_is_flipped_away_from_and_rolled_back_to() {
        let mut s = State {
            active: Some(Slot::Kube1),
            ..State::default()
        };
        *s.slot_mut(Slot::Kube1) = SlotState {
            status: SlotStatus::Active,
            adopted: true,
            ..SlotState::default()
        };
        // never up to date (no digest): the first activation flips to kube2
        let Plan::Flip(f) = activate(&s, d("v1"), "in", true, false) else {
            panic!()
        };
        assert_eq!(
            (f.from, f.to, f.from_adopted),
            (Some(Slot::Kube1), Slot::Kube2, true)
        );
        assert!(
            f.to_string()
                .starts_with("flip kube1 (adopted tree) -> kube2"),
            "{f}"
        );
        // committed kube2; the adopted kube1 is the previous slot
        s.active = Some(Slot::Kube2);
        s.slot_mut(Slot::Kube1).status = SlotStatus::Previous;
        *s.slot_mut(Slot::Kube2) = SlotState {
            status: SlotStatus::Active,
            digest: Some(d("v1")),
            ..SlotState::default()
        };
        let r = rollback(&s).unwrap();
        assert_eq!((r.from, r.to, r.digest), (Slot::Kube2, Slot::Kube1, None));
        assert!(r.to_string().ends_with("-> kube1 (adopted tree)"), "{r}");
        // an empty previous slot without the mark is no rollback target
        s.slot_mut(Slot::Kube1).adopted = false;
        assert!(rollback(&s).is_err());
    }

    fn situation(state: State, digest: Digest) -> Situation {
        Situation {
            command: Command::Activate,
            state,
            digest,
            release: None,
            inputs: "in".into(),
            active_files_current: true,
            machines: Machines::default(),
            committed: Committed::Up,
            force: false,
            allow_downgrade: false,
            preflight: None,
        }
    }

    fn release(digest: Digest, created: &str) -> Release {
        Release {
            identity: "registry.example/node".into(),
            digest,
            created: created.into(),
        }
    }

    fn down() -> Committed {
        Committed::Down(Failure {
            machine: "kube1".into(),
            check: crate::gate::health::Check::KubeletHealthz,
            detail: "connection refused".into(),
        })
    }

    #[test]
    fn decide_refuses_foreign_machines_before_anything_else() {
        // an image marked bad, and a machine kubeslot has no record of
        let mut state = State::default();
        state.mark_bad(d("v1"), "in".into(), "kubelet-healthz".into());
        let mut s = situation(state, d("v1"));
        s.machines.running = vec![Slot::Kube2];
        let Decision::Refused(r) = decide(&s) else {
            panic!()
        };
        assert!(
            matches!(
                r,
                Reason::Unmanaged {
                    machine: Slot::Kube2,
                    ..
                }
            ),
            "{r}"
        );
        assert_eq!(r.exit_code(), exit::CONFIG);
        // with kube1 committed, kube2 running beside it (where a flip stages)
        let mut s = situation(committed(Slot::Kube1, d("v1")), d("v2"));
        s.machines.running = vec![Slot::Kube1, Slot::Kube2];
        assert!(matches!(
            decide(&s),
            Decision::Refused(Reason::MachineRunning {
                machine: Slot::Kube2,
                ..
            })
        ));
        // unbounded-agent's host
        let mut s = situation(State::default(), d("v1"));
        s.machines.unbounded = Some((Slot::Kube1, "applied.json".into()));
        assert!(matches!(
            decide(&s),
            Decision::Refused(Reason::Unbounded {
                machine: Slot::Kube1,
                ..
            })
        ));
    }

    #[test]
    fn decide_refuses_a_bad_image_unless_forced() {
        let mut state = committed(Slot::Kube1, d("v1"));
        state.mark_bad(d("v2"), "in".into(), "kubelet-healthz".into());
        let mut s = situation(state, d("v2"));
        let Decision::Refused(r) = decide(&s) else {
            panic!()
        };
        assert!(matches!(&r, Reason::Bad(b) if b.digest == d("v2")), "{r}");
        assert_eq!(r.exit_code(), exit::BAD_IMAGE);
        s.force = true;
        assert!(matches!(decide(&s), Decision::Flip(_)));
    }

    #[test]
    fn decide_refuses_a_committed_node_that_is_down_unless_forced() {
        let mut s = situation(committed(Slot::Kube1, d("v1")), d("v1"));
        s.committed = down();
        let Decision::Refused(r) = decide(&s) else {
            panic!()
        };
        assert!(
            matches!(
                r,
                Reason::NotHealthy {
                    slot: Slot::Kube1,
                    ..
                }
            ),
            "{r}"
        );
        assert_eq!(r.exit_code(), exit::FAILED);
        // forced: the same image staged afresh into kube2
        s.force = true;
        let Decision::Flip(f) = decide(&s) else {
            panic!()
        };
        assert_eq!((f.to, f.digest), (Slot::Kube2, d("v1")));
        // fetch does not look at the committed node
        s.force = false;
        s.command = Command::Fetch;
        assert!(matches!(decide(&s), Decision::UpToDate { .. }));
        // plan, which did not start it: up to date, as when it comes up
        s.command = Command::Activate;
        s.committed = Committed::Unchecked;
        assert!(matches!(decide(&s), Decision::UpToDate { .. }));
    }

    #[test]
    fn decide_refuses_a_downgrade_but_never_of_the_image_that_runs() {
        let mut state = committed(Slot::Kube1, d("v2"));
        state.record_release(release(d("v2"), "2026-11-02T00:00:00Z"));
        let mut s = situation(state, d("v1"));
        s.release = Some(release(d("v1"), "2026-11-01T00:00:00Z"));
        let Decision::Refused(r) = decide(&s) else {
            panic!()
        };
        assert!(matches!(r, Reason::Downgrade { .. }), "{r}");
        assert_eq!(r.exit_code(), exit::BAD_IMAGE);
        s.allow_downgrade = true;
        assert!(matches!(decide(&s), Decision::Flip(_)));
        // the running image restaged (forced, its node down) is no downgrade
        let mut state = committed(Slot::Kube1, d("v1"));
        state.record_release(release(d("v2"), "2026-11-02T00:00:00Z"));
        let mut s = situation(state, d("v1"));
        s.release = Some(release(d("v1"), "2026-11-01T00:00:00Z"));
        s.committed = down();
        s.force = true;
        assert!(matches!(decide(&s), Decision::Flip(_)));
    }

    #[test]
    fn decide_refuses_a_flip_whose_preflight_failed() {
        let failed = Preflight {
            checks: vec![crate::gate::preflight::Finding {
                name: "swap".into(),
                status: crate::gate::preflight::Status::Fail,
                seen: "1 swap area".into(),
                needed: "no swap".into(),
                hint: None,
                ignored: false,
            }],
        };
        let mut s = situation(committed(Slot::Kube1, d("v1")), d("v2"));
        s.preflight = Some(failed.clone());
        let Decision::Refused(r) = decide(&s) else {
            panic!()
        };
        assert!(
            matches!(&r, Reason::Preflight { count: 1, summary } if summary.starts_with("swap")),
            "{r}"
        );
        assert_eq!(r.exit_code(), exit::CONFIG);
        // nothing to flip: the preflight does not matter
        let mut s = situation(committed(Slot::Kube1, d("v1")), d("v1"));
        s.preflight = Some(failed);
        assert!(matches!(decide(&s), Decision::UpToDate { .. }));
    }
}
