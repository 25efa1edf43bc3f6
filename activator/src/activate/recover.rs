//! Recovery of what a dead run left: a prepared flip set aside, a trying
//! flip committed when its machine passes the gate now (else rolled back:
//! the one try was used), a dirty slot emptied.

use crate::gate::health::{self, Check, Failure};
use crate::slot::Slot;
use crate::state::{Pending, PendingPhase, SlotState, SlotStatus, State};

use super::flip::image_name;
use super::{ActivateError, Run};

/// The state as recovery leaves it where no machine needs asking: a
/// prepared flip set aside, dirty slots emptied. `plan` decides on this
/// (it recovers nothing); a trying flip stays, since only its machine's
/// gate tells whether recovery commits or rolls it back.
pub(super) fn as_recovered(state: &State) -> State {
    let mut s = state.clone();
    if s.pending.as_ref().map(|p| p.phase) == Some(PendingPhase::Prepared) {
        s.pending = None;
    }
    for slot in Slot::ALL {
        if s.slot(slot).status == SlotStatus::Dirty {
            *s.slot_mut(slot) = SlotState::default();
        }
    }
    s
}

impl Run<'_> {
    /// Finishes or undoes what a dead run left; returns what it did.
    pub(super) fn recover(&self, state: &mut State) -> Result<Option<String>, ActivateError> {
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
        // last: after the dead run's flip is finished or undone, the Node
        // a dead run cordoned takes pods again
        if state.cordoned.is_some() {
            done.extend(
                self.uncordon_recorded(state)
                    .map(|l| format!("a dead run's drain: {l}")),
            );
        }
        Ok((!done.is_empty()).then(|| done.join("; ")))
    }

    /// A dead run was trying `p`: commit it when its machine is up and
    /// healthy now, otherwise roll back (the try is used up).
    pub(super) fn recover_try(
        &self,
        state: &mut State,
        p: &Pending,
    ) -> Result<String, ActivateError> {
        let (gate, gpu) = self.gate_of(p.to);
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
                let mut what = format!(
                    "rolled back a dead run's flip to {} ({}): {failure}",
                    p.to,
                    image_name(p.digest)
                );
                // the machine about to be stopped may run, with the Node's
                // pods: drained first, as a flip drains
                if let Some(line) = self.drain_before_recovery_stop(state, p.to)? {
                    what = format!("{what}; {line}");
                }
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
