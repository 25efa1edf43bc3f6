//! `rollback`: back to the previous slot through the same gate, without
//! downloading; refused when that slot's tree is not what was committed
//! away from (its fingerprint) or not its image (a copied tree against its
//! record, an overlay slot's layers against theirs and its upper against
//! the node's own paths: [`crate::slots::rollback_target`]). What it does
//! is decided by [`plan::decide_rollback`], on the situation built here
//! once for it and for `plan --rollback` ([`preview_rollback`]).

use crate::activate::plan::{self, Rollback, RollbackRefusal, RollbackSituation};
use crate::activate::report::{exit, Outcome, Report};
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

use super::recover::as_recovered;
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
    let decided = plan::decide_rollback(&situation(root, &run, state.clone(), clean)?);
    // refused past the check of the previous slot: the report names it
    if let Some(slot) = decided.as_ref().err().and_then(RollbackRefusal::target) {
        report.slot = Some(slot);
        report.digest = state.slot(slot).digest;
    }
    let rb = decided?;
    report.slot = Some(rb.to);
    report.digest = rb.digest;
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
    // the drain's settings: the host's config (the one an operator edits),
    // else the config the running slot was activated with
    let cluster_config = crate::config::Config::load(&root.default_config())
        .ok()
        .or_else(|| load_slot_config(root, rb.from).ok());
    if let Some(c) = cluster_config {
        let _ = run
            .cluster
            .set(super::drain::ClusterRun::of(&run, &c, rb.from)?);
    }
    run.try_flip(&mut state, &gate, &gpu, report)?;
    report.outcome = Some(Outcome::Committed);
    Ok(())
}

/// The one constructor of the [`RollbackSituation`] `rollback` and
/// `plan --rollback` decide on: `state` after recovery (as `plan` takes it:
/// `as_recovered`), which machines run, the flag, the slot's mode.
fn situation(
    root: &Root,
    run: &Run<'_>,
    state: State,
    clean: bool,
) -> Result<RollbackSituation, ActivateError> {
    Ok(RollbackSituation {
        overlay: state
            .active
            .is_some_and(|a| overlay::is_overlay(root, a.other())),
        machines: run.machines()?,
        clean,
        state,
    })
}

/// What `plan --rollback` shows.
pub struct RollbackPreview {
    /// The state as read (a dead run's pending flip as it was left).
    pub state: State,
    /// What `rollback` would do, or why it refuses.
    pub decision: Result<Rollback, RollbackRefusal>,
}

impl RollbackPreview {
    /// The exit code class `rollback` would end with: 0 for a flip back
    /// (the gate then decides between 0, 1 and 2), a refusal's code.
    pub fn exit_code(&self) -> i32 {
        self.decision
            .as_ref()
            .map_or_else(|r| r.exit_code(), |_| exit::OK)
    }
}

/// Decides what `rollback` with `opts` would do, by the same
/// [`plan::decide_rollback`] on the same situation, without the lock and
/// without writing or starting anything (asking `systemd` which machines
/// run).
pub fn preview_rollback(
    root: &Root,
    systemd: &dyn Systemd,
    opts: &RollbackOptions,
) -> Result<RollbackPreview, ActivateError> {
    let (state, _repair) = State::load_torn(root)?;
    let run = Run::new(root, systemd);
    let situation = situation(root, &run, as_recovered(&state), opts.clean)?;
    Ok(RollbackPreview {
        decision: plan::decide_rollback(&situation),
        state,
    })
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
    //! `rollback` itself, then `plan --rollback` and `rollback` agreeing
    //! on generated hosts (fresh, one activation, two, a former node
    //! replaced by a fetch; copy or overlay slots; a machine running as
    //! the previous slot; `--clean`, `--force`), each set up for real.

    use proptest::prelude::*;

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

    /// One generated host for `rollback` and `plan --rollback`.
    #[derive(Clone, Debug)]
    struct Case {
        /// 0: a fresh host; 1: one activation; 2: two (kube1 is the
        /// previous slot); 3: two, then a third image fetched into kube1
        /// (the former node replaced).
        history: u8,
        overlay: bool,
        /// The previous slot's machine runs (started by hand).
        foreign: bool,
        clean: bool,
        force: bool,
    }

    fn cases() -> impl Strategy<Value = Case> {
        // Mostly hosts with a former node, most of them without a stray
        // machine: where the flip back and the flag checks happen.
        let history = prop_oneof![1 => Just(0u8), 1 => Just(1), 5 => Just(2), 1 => Just(3)];
        let foreign = proptest::bool::weighted(0.25);
        (
            history,
            any::<bool>(),
            foreign,
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(|(history, overlay, foreign, clean, force)| Case {
                history,
                overlay,
                foreign,
                clean,
                force,
            })
    }

    /// Sets `case` up for real (activations and a fetch against the fake
    /// systemd), previews the rollback (read-only: the state file's bytes
    /// unchanged), then rolls back: both agree on the flip back (its slot
    /// and image, committed: every image here passes its gate) or the
    /// refusal (its words and exit code).
    fn plan_and_rollback_agree(case: Case) {
        let (s, fake, _) = setup("healthy", None, "off");
        if case.overlay {
            let mut c: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&s.config).unwrap()).unwrap();
            c["slots"] = serde_json::json!({"mode": "overlay"});
            std::fs::write(&s.config, serde_json::to_vec(&c).unwrap()).unwrap();
        }
        for version in ["", "2"].iter().take(usize::from(case.history.min(2))) {
            image_with(&img_dir(&s), "healthy", version);
            assert_eq!(run(&s, &fake).outcome, Some(Outcome::Committed));
        }
        if case.history == 3 {
            image_with(&img_dir(&s), "healthy", "3");
            let ran = crate::activate::fetch(&s.root, &s.config, &fake, &Default::default());
            assert_eq!(ran.report.exit_code, exit::OK, "{:?}", ran.report);
        }
        if case.foreign {
            let active = State::load_torn(&s.root).map(|(st, _)| st.active).unwrap();
            let previous = active.map_or(Slot::Kube1, Slot::other);
            fake.foreign
                .borrow_mut()
                .insert(previous.machine().to_string());
        }
        let opts = RollbackOptions {
            clean: case.clean,
            force: case.force,
        };
        let state_before = std::fs::read(s.root.state_file()).ok();
        let p = preview_rollback(&s.root, &fake, &opts).unwrap();
        assert_eq!(std::fs::read(s.root.state_file()).ok(), state_before);
        let r = rollback(&s.root, &fake, &opts).report;
        assert_eq!(p.exit_code(), r.exit_code, "{:?}\n{r:?}", p.decision);
        match &p.decision {
            Ok(rb) => {
                assert_eq!(r.outcome, Some(Outcome::Committed), "{rb}: {r:?}");
                assert_eq!((r.slot, r.digest), (Some(rb.to), rb.digest), "{r:?}");
            }
            Err(refusal) => {
                let e = r.error.as_deref().unwrap_or_default();
                assert!(e.contains(&refusal.to_string()), "{refusal}\nrollback: {e}");
                assert_ne!(r.outcome, Some(Outcome::Committed), "{r:?}");
            }
        }
    }

    proptest! {
        // A case is up to two activations and a fetch: enough cases to
        // meet every refusal and both slot modes.
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        #[test]
        fn plan_and_rollback_agree_on_every_situation(case in cases()) {
            plan_and_rollback_agree(case);
        }
    }
}
