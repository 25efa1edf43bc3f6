//! Decide first, act second: what `activate` or `rollback` would do, as a
//! value computed from the state and the desired image without touching
//! anything.
//!
//! Given the [`State`], the digest the configured reference resolved to and
//! the hash of the host-file inputs, [`activate`] returns a [`Plan`]: nothing
//! to do, refused (the pair failed before), or a [`Flip`] naming the slot
//! switched from and to and the digests involved. [`rollback`] does the same
//! for a flip back to the previous slot. `plan`/`--dry-run` print these
//! values; `activate` applies them. This module reads no file and runs no
//! command.

use std::fmt;

use kubeslot_image::digest::Digest;

use crate::slot::Slot;
use crate::state::{BadImage, FlipKind, SlotStatus, State};

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

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
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

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("rollback: no slot is active on this host")]
    NothingActive,
    #[error("rollback: slot {slot} holds no committed former node (status {status}); only a slot that ran before can be rolled back to")]
    NoPrevious { slot: Slot, status: SlotStatus },
    #[error("rollback: a flip to {to} of a dead run is pending; run `activate` (or `rollback`) again after it is recovered")]
    Pending { to: Slot },
}

/// What `activate` does to run `digest` with host-file inputs `inputs`.
///
/// `active_files_current`: the active slot's rendered files on disk equal
/// what rendering produces now (false when nothing is active).
pub fn activate(
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
pub fn restage(state: &State, digest: Digest, inputs: &str) -> Flip {
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

/// What `rollback` does: back to the slot that ran before (a committed
/// image or an adopted tree), without downloading anything.
pub fn rollback(state: &State) -> Result<Rollback, PlanError> {
    if let Some(p) = &state.pending {
        return Err(PlanError::Pending { to: p.to });
    }
    let from = state.active.ok_or(PlanError::NothingActive)?;
    let to = from.other();
    let target = state.slot(to);
    match (target.status, target.digest) {
        (SlotStatus::Previous, digest) if digest.is_some() || target.adopted => Ok(Rollback {
            from,
            from_digest: state.active_digest(),
            to,
            digest,
        }),
        (status, _) => Err(PlanError::NoPrevious { slot: to, status }),
    }
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

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Plan::UpToDate { slot, digest } => {
                write!(f, "up to date: {slot} runs {digest} with current host files")
            }
            Plan::Refused(bad) => write!(
                f,
                "refused: {} failed on this host at {} ({}); not retried without --force or changed host settings",
                bad.digest, bad.at, bad.reason
            ),
            Plan::Flip(flip) => flip.fmt(f),
        }
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

    #[test]
    fn rollback_needs_a_previous_slot() {
        let mut s = committed(Slot::Kube2, d("v2"));
        assert!(matches!(
            rollback(&s),
            Err(PlanError::NoPrevious {
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
        assert_eq!(rollback(&State::default()), Err(PlanError::NothingActive));
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
}
