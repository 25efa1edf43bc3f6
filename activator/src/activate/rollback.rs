//! `rollback`: back to the previous slot through the same gate, without
//! downloading; refused when that slot's tree is not what was committed
//! away from (its fingerprint) or not its image (a copied tree against its
//! record, an overlay slot's layers against theirs and its upper against
//! the node's own paths: [`crate::slots::rollback_target`]).

use crate::activate::plan::{self, Reason};
use crate::activate::report::{Outcome, Report};
use crate::failpoint;
use crate::gate::health::Gate;
use crate::lock::Lock;
use crate::paths::Root;
use crate::render;
use crate::slot::Slot;
use crate::slots::fingerprint;
use crate::slots::overlay;
use crate::slots::rollback_target;
use crate::state::{FlipKind, Pending, PendingPhase, State};
use crate::systemd::Systemd;

use super::{busy, fallback_health, finish, load_slot_config, ActivateError, Ran, Run};

/// Flags of `rollback`.
#[derive(Clone, Debug, Default)]
pub struct RollbackOptions {
    /// The previous slot (an overlay slot) first loses everything its
    /// machine wrote (a fresh upper dir), so it starts as exactly its
    /// verified image.
    pub clean: bool,
    /// A copied previous slot whose image-owned files changed is started
    /// anyway.
    pub force: bool,
}

/// `rollback`: back to the previous slot, without downloading, through the
/// same gate; the image rolled away from is marked bad.
pub fn rollback(root: &Root, systemd: &dyn Systemd, opts: &RollbackOptions) -> Ran {
    let mut report = Report::new("rollback");
    let lock = match Lock::try_exclusive(root) {
        Ok(l) => l,
        Err(e) => return busy(report, e),
    };
    failpoint::hit("after-lock");
    let result = run_rollback(root, systemd, opts, &mut report);
    finish(root, report, result, lock)
}

pub(super) fn run_rollback(
    root: &Root,
    systemd: &dyn Systemd,
    opts: &RollbackOptions,
    report: &mut Report,
) -> Result<(), ActivateError> {
    let RollbackOptions { clean, force } = *opts;
    let run = Run::new(root, systemd);
    report.phase("recover");
    let mut state = State::load_repairing(root)?;
    report.previous_slot = state.active;
    report.recovered = run.recover(&mut state)?;
    failpoint::hit("after-recover");
    run.ensure_enabled(state.active)?;

    report.phase("plan");
    let rb = plan::rollback(&state)?;
    report.slot = Some(rb.to);
    report.digest = rb.digest;
    if run.running(rb.to)? {
        return Err(Reason::MachineRunning {
            machine: rb.to,
            why: format!(" beside the committed node {}", rb.from),
        }
        .into());
    }
    let overlay = overlay::is_overlay(root, rb.to);
    // The layers first: --clean drops only the upper, so a lower that is
    // not what was unpacked refuses before anything is dropped.
    let lowers = if overlay {
        checked_lowers(root, rb.to, force)?
    } else {
        Vec::new()
    };
    if overlay {
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
        // And entry by entry: what the node wrote outside its own paths
        // is a change to the image (the node is not trusted).
        if !force {
            image_intact(root, rb.to, overlay, &lowers)?;
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
        run.write_files(&files)?;
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
    run.try_flip(&mut state, &gate, &gpu, report)?;
    report.outcome = Some(Outcome::Committed);
    Ok(())
}

fn not_intact(slot: Slot, e: std::io::Error) -> ActivateError {
    ActivateError::NotIntact {
        slot,
        reason: format!("checking it: {e}; the running machine is untouched"),
    }
}

/// An overlay slot's lowers, each checked against its record (unless
/// `force`): their records, top first.
fn checked_lowers(
    root: &Root,
    slot: Slot,
    force: bool,
) -> Result<Vec<crate::slots::record::Record>, ActivateError> {
    let (records, changes) =
        rollback_target::overlay_lowers(root, slot).map_err(|e| not_intact(slot, e))?;
    if force || changes.is_empty() {
        return Ok(records);
    }
    Err(ActivateError::NotIntact {
        slot,
        reason: format!(
            "refusing to start it: {} entr{} of its layers differ from what was unpacked: {}; the running machine is untouched (rollback --force starts it anyway; --clean does not repair a layer)",
            changes.len(),
            if changes.len() == 1 { "y" } else { "ies" },
            rollback_target::shown(&changes)
        ),
    })
}

/// The slot's tree is its image, but for what its node wrote in its own
/// paths ([`rollback_target`]): a copied tree per its record (none: an adopted
/// tree, nothing to check), an overlay slot's upper over `lowers`.
pub(super) fn image_intact(
    root: &Root,
    slot: Slot,
    overlay: bool,
    lowers: &[crate::slots::record::Record],
) -> Result<(), ActivateError> {
    let changes = if overlay {
        rollback_target::overlay_upper(root, slot, lowers).map_err(|e| not_intact(slot, e))?
    } else {
        match rollback_target::copy_slot(root, slot).map_err(|e| not_intact(slot, e))? {
            Some(c) => c,
            None => return Ok(()),
        }
    };
    if changes.is_empty() {
        return Ok(());
    }
    Err(ActivateError::NotIntact {
        slot,
        reason: format!(
            "refusing to start it: {} change(s) to its image since it was installed: {}; the running machine is untouched (rollback --force starts it anyway{})",
            changes.len(),
            rollback_target::shown(&changes),
            if overlay { ", --clean drops what its node wrote" } else { "" }
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::activate::fixture::*;

    #[test]
    fn rollback_to_an_older_release_is_always_allowed() {
        let (s, fake, _) = setup("healthy", None, "off");
        with_identity(&s);
        let old = image_created(&img_dir(&s), "healthy", "1", Some("2026-11-01T00:00:00Z"));
        assert_eq!(run(&s, &fake).outcome, Some(Outcome::Committed));
        let new = image_created(&img_dir(&s), "healthy", "2", Some("2026-11-02T00:00:00Z"));
        assert_eq!(run(&s, &fake).outcome, Some(Outcome::Committed));
        let ran = rollback(&s.root, &fake, &RollbackOptions::default());
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
}
