//! Steps 6 and 7: the pending flip tried (stop the old machine, start the
//! new one, the health gate), then committed or rolled back (the image
//! marked bad with the failed check).
//!
//! Given a state whose `pending` is prepared; every change of it is one
//! save, so recovery can finish or undo what a dead run left.

use kubeslot_image::digest::Digest;

use crate::activate::report::{Datapoint, Report};
use crate::failpoint;
use crate::gate::diagnostics;
use crate::gate::health::{self, Check, Failure, Gate};
use crate::paths::Root;
use crate::slot::Slot;
use crate::slots::fingerprint::{self, FingerprintError};
use crate::state::{FlipKind, Pending, PendingPhase, SlotState, SlotStatus, State};

use super::{fallback_health, load_slot_config, ActivateError, Run};

impl Run<'_> {
    /// Steps 6 and 7 for the pending flip in `state`, drained first when
    /// a machine runs and the cluster is configured; the Node kubeslot
    /// cordoned is uncordoned after the commit or the rollback.
    pub(super) fn try_flip(
        &self,
        state: &mut State,
        gate: &Gate,
        gpu_devices: &[String],
        report: &mut Report,
    ) -> Result<(), ActivateError> {
        let from = state.pending.as_ref().and_then(|p| p.from);
        if let Some(from) = from {
            if self.running(from)? {
                if let Err(e) = self.drain_before_stop(state, report) {
                    let failed = Err(e);
                    if let Some(p) = &state.pending {
                        self.tell_result(report, p.to, &failed);
                    }
                    let Err(e) = failed else { unreachable!() };
                    // nothing was stopped: the try is not used up, the
                    // target stays staged
                    state.pending = None;
                    self.save(state)?;
                    return Err(e);
                }
            }
        }
        let to = state.pending.as_ref().map(|p| p.to);
        if let (Some(from), Some(to)) = (from, to) {
            self.tell(super::drain::Tell {
                phase: "flipping",
                annotations: Vec::new(),
                event: Some((
                    "KubeslotFlip",
                    false,
                    format!("stopping {from}, starting {to}"),
                )),
            });
        }
        let result = self.flip_drained(state, gate, gpu_devices, report);
        if let Some(to) = to {
            self.tell_result(report, to, &result);
        }
        if state.cordoned.is_some() {
            let line = self.uncordon_recorded(state);
            super::drain::note(report, line);
        }
        result
    }

    fn flip_drained(
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
        let flip_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let gate_deadline = std::time::Instant::now() + gate.timeout;
        let started = self.systemd.start(&pending.to.unit());
        failpoint::hit("after-start-new");
        if started.is_ok() {
            report.mark(Datapoint::MachineStarted);
        }

        report.phase("health");
        let verdict = match started {
            Err(e) => Err(Failure {
                machine: pending.to.machine().to_string(),
                check: Check::UnitStart,
                detail: e.to_string(),
            }),
            Ok(()) => health::wait_healthy(self.systemd, pending.to, gate, gpu_devices),
        };
        let verdict = match verdict {
            Ok(()) => self.cluster_gate(pending.to, flip_at, gate_deadline, gate.interval, report),
            failed => failed,
        };
        match verdict {
            Ok(()) => {
                // the cluster gate's line (when it ran) after the ownership note
                let cluster = report.health.take();
                report.health = match (gate.ownership_note(), cluster) {
                    (Some(a), Some(b)) => Some(format!("{a}; {b}")),
                    (a, b) => a.or(b),
                };
                report.mark(Datapoint::KubeletHealthy);
                failpoint::hit("after-health");
                report.phase("commit");
                self.commit(state, &pending)?;
                report.mark(Datapoint::Committed);
                Ok(())
            }
            Err(failure) => {
                // while it still runs: its journals say why
                self.diagnose(pending.to, report);
                report.phase("rollback");
                self.roll_back(state, &pending, failure)
            }
        }
    }

    /// A failed machine's kubelet and containerd journals and failed units
    /// into the report (secrets of the config it ran with redacted).
    pub(super) fn diagnose(&self, slot: Slot, report: &mut Report) {
        let secrets = load_slot_config(self.root, slot)
            .map(|c| diagnostics::secrets(&c))
            .unwrap_or_default();
        report.diagnostics = Some(diagnostics::collect(self.systemd, slot.machine(), &secrets));
    }

    pub(super) fn commit(&self, state: &mut State, p: &Pending) -> Result<(), ActivateError> {
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
        let (digest, inputs) = (new.digest, new.inputs.clone().unwrap_or_default());
        state.active = Some(p.to);
        // An image brought back on purpose (`--force`, a second `rollback`)
        // that passed the gate is no longer one to keep away from.
        if let Some(d) = digest {
            state.unmark_bad(&d, &inputs);
        }
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
    pub(super) fn roll_back(
        &self,
        state: &mut State,
        p: &Pending,
        failure: Failure,
    ) -> Result<(), ActivateError> {
        // Never start the old machine while the new one may still run: they
        // share the host network and the node state.
        self.systemd.stop(&p.to.unit())?;
        let mut mark_failed = None;
        if p.kind == FlipKind::Rollback {
            // The previous slot ran during the attempt and wrote its own
            // tree; it stays the previous slot, so its mark follows what
            // the tree holds now that its machine is stopped again. A tree
            // that cannot be counted loses its mark (`rollback` then
            // refuses it, naming the missing mark): never a reason to leave
            // the machine that ran before down.
            if let Err(e) = fingerprint::record(self.root, p.to.machine(), p.digest) {
                // (a mark that cannot be removed either no longer matches
                // what the tree holds: `rollback` refuses it all the same)
                let _ = remove_mark(self.root, p.to);
                mark_failed = Some(kubeslot_image::error_chain(&e));
            }
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
            // Who held the healthz port says nothing about the image (any
            // user can listen there): the try is not used up.
            FlipKind::Activate if failure.check == Check::KubeletListener => {
                state.slot_mut(p.to).status = SlotStatus::Staged;
            }
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
        let mut failure = failure;
        if let Some(why) = mark_failed {
            failure.detail = format!(
                "{} (and {}'s tree mark could not be taken again: {why}; it is no rollback target until it is staged again)",
                failure.detail, p.to
            );
        }
        Err(ActivateError::RolledBack {
            failure,
            from: p.from,
            old_failure,
        })
    }
}

/// Removes `slot`'s tree mark (a missing one is fine): `rollback` then
/// refuses the slot, naming the missing mark.
pub(super) fn remove_mark(root: &Root, slot: Slot) -> Result<(), ActivateError> {
    let path = root.slot_tree_mark(slot.machine());
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(FingerprintError::Walk { path, source }.into()),
    }
}

/// A pending flip's image in messages (a rollback to an adopted tree has
/// none).
pub(super) fn image_name(digest: Option<Digest>) -> String {
    digest.map_or_else(|| "adopted tree".to_string(), |d| d.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::activate::fixture::*;
    use crate::activate::*;

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
        gpu_host(&s);
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
    fn an_unhealthy_first_machine_leaves_nothing_running() {
        let (s, fake, _) = setup("never", None, "off");
        let r = run(&s, &fake);
        assert_eq!(r.exit_code, exit::ROLLED_BACK);
        let e = r.error.unwrap();
        assert!(
            e.contains("kubelet-healthz") && e.contains("no machine"),
            "{e}"
        );
        assert!(fake.active_units().is_empty());
    }

    #[test]
    fn a_failed_gate_reports_the_machines_journals_read_before_it_stopped() {
        let (s, fake, _) = setup("never", None, "off");
        let r = run(&s, &fake);
        assert_eq!(r.exit_code, exit::ROLLED_BACK);
        let d = r.diagnostics.as_ref().expect("diagnostics");
        assert_eq!(d.machine, "kube1");
        assert_eq!(d.kubelet.last().unwrap(), "kube1 kubelet[1]: last words");
        assert!(
            d.kubelet[1].contains("bootstrap token <redacted> refused"),
            "{d:?}"
        );
        assert_eq!(
            d.failed_units,
            ["kubelet.service loaded failed failed kubelet"]
        );
        assert!(d.containerd.is_empty());
        assert!(
            d.errors[0].starts_with("containerd journal: journalctl -M kube1 -u containerd"),
            "{d:?}"
        );
        // read while the machine ran: before the rollback stopped it
        let calls = fake.calls();
        let pos = |c: &str| calls.iter().position(|x| x == c).unwrap();
        assert!(
            pos("journal kube1 kubelet 50") < pos("stop systemd-nspawn@kube1.service"),
            "{calls:?}"
        );
        let text = r.to_text();
        assert!(!text.contains("0123456789abcdef"), "{text}");
        assert!(text.contains("kube1 kubelet[1]: last words"), "{text}");
        let json = serde_json::to_string(&r).unwrap();
        assert!(!json.contains("0123456789abcdef"), "{json}");
    }

    #[test]
    fn a_commit_records_its_datapoints_in_order() {
        let (s, fake, _) = setup("healthy", None, "off");
        let r = run(&s, &fake);
        assert_eq!(r.outcome, Some(Outcome::Committed), "{r:?}");
        assert!(r.diagnostics.is_none());
        let d = &r.datapoints;
        let points = [
            d.resolved_ms,
            d.verified_ms,
            d.staged_ms,
            d.machine_started_ms,
            d.kubelet_healthy_ms,
            d.committed_ms,
        ];
        assert!(points.iter().all(Option::is_some), "{d:?}");
        assert!(points.windows(2).all(|w| w[0] <= w[1]), "{d:?}");
        assert!(d.unit_started_since_boot_ms.is_some());
    }
}
