//! The start of every `activate` and `fetch` (steps 2 to 4): recover,
//! refuse what the state does not account for, reconcile the committed
//! node with systemd, read the config and the host facts, resolve and
//! verify once, then [`plan::decide`]; and the preflight before a flip,
//! whose result is decided on again.
//!
//! Given the run context (`Run`); returns a [`Begun`] that staging and
//! the flip carry on with. Writes nothing of the slots.

use std::path::Path;
use std::sync::Arc;

use kubeslot_image::source::Source;

use crate::activate::plan::{self, Command, Committed, Decision, Flip, Machines, Situation};
use crate::activate::report::{Datapoint, Outcome, Report};
use crate::config::Config;
use crate::failpoint;
use crate::gate::health::{self, Check, Failure, Gate};
use crate::gate::preflight;
use crate::paths::Root;
use crate::render::gpu::Discovery;
use crate::render::host_settings;
use crate::render::{self, HostFacts};
use crate::slot::Slot;
use crate::slots::stage::{self, Verified};
use crate::state::{Release, State};

use super::{
    fallback_health, load_slot_config, resolve::open_verified_marked, ActivateError, Options,
    Rendered, Resolved, Run,
};

/// Steps 2 to 4, shared by `activate` and `fetch`: what a run found and
/// decided before it writes anything of its own.
pub(super) struct Begun {
    /// What the flip was decided on (the preflight, once run, is decided
    /// on again).
    pub(super) situation: Situation,
    /// The state the run goes on with (the situation's, then changed and
    /// saved step by step).
    pub(super) state: State,
    pub(super) config: Config,
    pub(super) facts: HostFacts,
    /// The host's GPUs, read once: `facts` binds from them, the flip's
    /// preflight checks them.
    pub(super) gpus: Discovery,
    /// Taken by staging (absent when the plan reuses a staged slot, it is
    /// dropped at the end of the run).
    pub(super) source: Option<Source>,
    pub(super) verified: Verified,
    /// Both slots' host files, rendered once.
    pub(super) files: Rendered,
    pub(super) flip: Flip,
}

impl Begun {
    /// The host-file inputs hash.
    pub(super) fn inputs(&self) -> &str {
        &self.situation.inputs
    }

    /// What a commit of this flip records as its identity's release.
    pub(super) fn release(&self) -> Option<Release> {
        self.situation.release.clone()
    }

    /// Decides again with `preflight` (the flip's checks): refused when a
    /// check failed.
    pub(super) fn decide_with(
        &mut self,
        preflight: preflight::Preflight,
    ) -> Result<(), ActivateError> {
        self.situation.preflight = Some(preflight);
        match plan::decide(&self.situation) {
            Decision::Refused(reason) => Err(reason.into()),
            // a preflight only ever refuses: the flip stands
            Decision::Flip(_) | Decision::UpToDate { .. } => Ok(()),
        }
    }
}

/// Recover, refuse foreign machines, reconcile (`activate`: the committed
/// node started and gated when it does not run), read the config, gather
/// the facts, resolve once, decide. `None` when there is nothing to do (the
/// report says why).
pub(super) fn begin(
    run: &Run<'_>,
    config_path: &Path,
    opts: &Options,
    command: Command,
    report: &mut Report,
) -> Result<Option<Begun>, ActivateError> {
    let root = run.root;
    report.phase("recover");
    let mut state = State::load_repairing(root)?;
    report.previous_slot = state.active;
    report.recovered = run.recover(&mut state)?;
    failpoint::hit("after-recover");
    // Before the committed node is started, and before the config is read
    // (a broken config cannot keep a node down, nor a foreign one hide).
    plan::refuse_foreign(&state, &run.machines()?)?;
    // A committed node that does not come up is noted, not the end of the
    // run: a flip to another image (or, forced, the same image staged
    // afresh) is the way out of a broken tree, so the decision says.
    let committed = match command {
        Command::Activate => run.reconcile(&state, opts.force, report)?,
        Command::Fetch => Committed::Up,
    };

    report.phase("config");
    let (config, _) = super::variant::choose(root, Config::load(config_path)?);
    let config = super::follow::desired(root, config, state.active.unwrap_or(Slot::Kube1))?;
    report.image = Some(config.image.to_string());
    let (facts, gpus) = gather(root, config_path, &config)?;

    report.phase("resolve");
    // The lock is held: an extraction left by a killed run is nobody's.
    stage::remove_stale_extractions(root)?;
    // The deadline counts from here: every request of the run shares it.
    let pacing = run
        .pacing
        .get_or_init(|| Arc::new(crate::fetch::access::pacing(&config.download)));
    let resolved = open_verified_marked(root, &config, pacing.clone(), report)?;
    let digest = resolved.digest();
    report.digest = Some(digest);
    report.index_digest = Some(resolved.index_digest()).filter(|d| *d != digest);
    let files = Rendered::new(&config, &facts);
    let situation = situation(
        root,
        command,
        opts,
        state.clone(),
        // Asked again: a machine started meanwhile is refused too.
        run.machines()?,
        committed,
        Candidate {
            config: &config,
            resolved: &resolved,
            files: &files,
        },
    );
    let flip = match plan::decide(&situation) {
        Decision::UpToDate { slot, .. } => {
            if state.slot(slot).inputs.as_deref() != Some(situation.inputs.as_str()) {
                // host facts changed and the render oneshot already applied
                // them: record what the slot now runs with
                state.slot_mut(slot).inputs = Some(situation.inputs.clone());
                state.save(root)?;
            }
            report.slot = Some(slot);
            // `started` (by reconcile) says more than "up to date"
            report.outcome.get_or_insert(Outcome::UpToDate);
            return Ok(None);
        }
        Decision::Refused(reason) => {
            report.slot = refused_slot(&state, &reason);
            return Err(reason.into());
        }
        Decision::Flip(f) => f,
    };
    // A following host takes another image only through the gates; the
    // running image (a re-render) never meets them.
    if config.source.follow.is_some() && state.active_digest() != Some(digest) {
        let admission = super::follow::admit(
            root,
            &config,
            &resolved,
            &super::follow::node_name(&config, &facts.hostname),
        )?;
        let waiting = admission.waiting.is_some();
        report.rollout = Some(admission);
        if waiting {
            report.slot = state.active;
            report.outcome = Some(Outcome::Waiting);
            return Ok(None);
        }
    }
    report.slot = Some(flip.to);
    Ok(Some(Begun {
        situation,
        state,
        config,
        facts,
        gpus,
        source: Some(resolved.source),
        verified: resolved.verified,
        files,
        flip,
    }))
}

/// The image a run decides on: resolved and verified once, with both
/// slots' host files rendered from the config and the host facts.
pub(super) struct Candidate<'a> {
    pub(super) config: &'a Config,
    pub(super) resolved: &'a Resolved,
    pub(super) files: &'a Rendered,
}

/// The one constructor of the [`Situation`] every run decides on:
/// `activate` and `fetch` ([`begin`]), `plan` and `--dry-run`
/// (`preview`), so what they decide on cannot drift apart. `state` is
/// the state after recovery (as `preview` takes it: `as_recovered`),
/// `committed` what the run found of the committed node. The preflight is
/// not run yet.
pub(super) fn situation(
    root: &Root,
    command: Command,
    opts: &Options,
    state: State,
    machines: Machines,
    committed: Committed,
    image: Candidate<'_>,
) -> Situation {
    let Candidate {
        config,
        resolved,
        files,
    } = image;
    Situation {
        command,
        digest: resolved.digest(),
        release: release_of(config, &resolved.verified),
        inputs: files.inputs_hash(),
        active_files_current: state.active.is_some_and(|a| files.current(root, a)),
        machines,
        committed,
        force: opts.force,
        allow_downgrade: opts.allow_downgrade || config.trust.allow_downgrade,
        preflight: None,
        state,
    }
}

/// The slot a refusal's report names: the node that did not come up, the
/// active slot for a bad image, the target of a refused flip.
fn refused_slot(state: &State, reason: &plan::Reason) -> Option<Slot> {
    match reason {
        plan::Reason::NotHealthy { slot, .. } => Some(*slot),
        plan::Reason::Bad(_) => state.active,
        plan::Reason::Downgrade { .. } | plan::Reason::Preflight { .. } => {
            Some(state.active.map_or(Slot::Kube1, Slot::other))
        }
        _ => None,
    }
}

/// The release a commit of `verified` records: its identity (see
/// [`crate::fetch::access::identity`]) and the signed config's `created`. `None`
/// when no identity applies (an unsigned layout allowed by
/// `allow_unsigned`): nothing orders such images.
fn release_of(config: &Config, verified: &Verified) -> Option<Release> {
    let identity = crate::fetch::access::identity(&config.trust, &config.image)?;
    Some(Release {
        identity: identity.to_string(),
        digest: verified.image.manifest_digest(),
        created: verified.image.config.created.clone().unwrap_or_default(),
    })
}

/// The host facts a run renders from, with the host's GPUs read once
/// (the preflight of the flip checks the same [`Discovery`]).
pub(super) fn gather(
    root: &Root,
    config_path: &Path,
    config: &Config,
) -> Result<(HostFacts, Discovery), ActivateError> {
    // The keys are host facts too: checked here, before anything is
    // resolved, so the error names the config and exits 3.
    crate::fetch::access::policy(&config.trust, &config.image, root).map_err(|source| {
        ActivateError::Trust {
            config: config_path.to_path_buf(),
            source,
        }
    })?;
    let gpus = Discovery::read(root, &config.gpu);
    let facts =
        render::gather_with(root, config, &gpus).map_err(|source| ActivateError::Facts {
            config: config_path.to_path_buf(),
            source,
        })?;
    Ok((facts, gpus))
}

/// What a planned flip writes: nothing when it reuses a staged slot.
pub(super) fn flip_disk_use(root: &Root, flip: &Flip, verified: &Verified) -> preflight::DiskUse {
    if flip.reuse_staged {
        preflight::DiskUse::Staged
    } else {
        preflight::DiskUse::Needs(preflight::DiskNeed::of(root, &verified.image))
    }
}

/// The preflight of a flip with `config` on the GPUs the run read:
/// `settings_pending` when kubeslot's host settings are not written yet
/// (`plan`, which writes nothing; `activate` writes and applies them
/// first).
pub(super) fn preflight_inputs(
    config: &Config,
    gpus: &Discovery,
    disk: preflight::DiskUse,
    settings_pending: bool,
) -> preflight::Inputs {
    preflight::Inputs {
        gpu: gpus.clone(),
        ignore: config.preflight.ignore.clone(),
        disk,
        swap_allowed: config.kubelet_allows_swap(),
        settings_pending,
        image: Some(preflight::ImageChoice::of(config)),
    }
}

impl Run<'_> {
    /// Which node machines run, and whether unbounded-agent provisioned a
    /// host kubeslot has no state on.
    pub(super) fn machines(&self) -> Result<Machines, ActivateError> {
        let mut running = Vec::new();
        for slot in Slot::ALL {
            if self.running(slot)? {
                running.push(slot);
            }
        }
        let state_file = self.root.state_file();
        let unbounded = if state_file.exists() {
            None
        } else {
            Slot::ALL.into_iter().find_map(|slot| {
                let applied = self.root.unbounded_applied_config(slot.machine());
                applied.exists().then_some((slot, applied))
            })
        };
        Ok(Machines {
            running,
            unbounded,
            state_file,
        })
    }

    /// `activate`'s reconcile: the committed slot is enabled at boot and
    /// runs; when it does not (a host reboot that lost it, a machine that
    /// was stopped by hand) it is started and gated, and the report's
    /// outcome says `started`. A run never starts it beside the other slot's
    /// running machine ([`plan::refuse_foreign`] refused that before).
    ///
    /// Returns [`Committed::Down`] with the gate's failure when the
    /// committed node did not come up (also noted in the report's
    /// `reconcile`): the decision says whether that ends the run.
    ///
    /// With `force` a running committed node is gated too (`activate
    /// --force` re-stages an image whose node runs but is not healthy).
    pub(super) fn reconcile(
        &self,
        state: &State,
        force: bool,
        report: &mut Report,
    ) -> Result<Committed, ActivateError> {
        let Some(active) = state.active else {
            return Ok(Committed::Up);
        };
        self.ensure_enabled(Some(active))?;
        let running = self.running(active)?;
        if running && !force {
            return Ok(Committed::Up);
        }
        report.phase("reconcile");
        let (gate, gpu) = self.gate_of(active);
        let verdict = if running {
            health::wait_healthy(self.systemd, active, &gate, &gpu)
        } else {
            match self.systemd.start(&active.unit()) {
                Err(e) => Err(Failure {
                    machine: active.machine().to_string(),
                    check: Check::UnitStart,
                    detail: e.to_string(),
                }),
                Ok(()) => {
                    report.mark(Datapoint::MachineStarted);
                    health::wait_healthy(self.systemd, active, &gate, &gpu)
                }
            }
        };
        report.slot = Some(active);
        match verdict {
            Ok(()) => {
                if !running {
                    report.outcome = Some(Outcome::Started);
                    report.mark(Datapoint::KubeletHealthy);
                }
                Ok(Committed::Up)
            }
            Err(failure) => {
                self.diagnose(active, report);
                report.reconcile = Some(if running {
                    format!("the committed node {active} runs, but {failure}")
                } else {
                    format!(
                        "the committed node {active} was not running: started it, but {failure}"
                    )
                });
                Ok(Committed::Down(failure))
            }
        }
    }

    /// The gate of `slot`'s machine and the GPU devices it must see: from
    /// the config it was activated with; an adopted tree (no slot config)
    /// gets the fallback health settings and no GPU check.
    pub(super) fn gate_of(&self, slot: Slot) -> (Gate, Vec<String>) {
        match load_slot_config(self.root, slot) {
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
        }
    }

    /// Before a flip: the host settings written and applied, then every
    /// preflight check, decided on: a blocking failure refuses the flip
    /// before anything of the slots changes.
    pub(super) fn preflight(
        &self,
        b: &mut Begun,
        report: &mut Report,
    ) -> Result<(), ActivateError> {
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
        // what the host's network had before its first node: `uninstall`
        // removes only what a node added
        match crate::host::network::record_if_missing(self.root) {
            Ok(Some(note)) => notes.push(note),
            Ok(None) => {}
            Err(e) => notes.push(format!(
                "recording the host's network: {}",
                kubeslot_image::error_chain(&e)
            )),
        }
        if !notes.is_empty() {
            report.host_settings = Some(notes.join("; "));
        }
        let disk = flip_disk_use(self.root, &b.flip, &b.verified);
        let result = preflight::run(
            self.root,
            &preflight_inputs(&b.config, &b.gpus, disk, false),
        );
        report.preflight = result.notable();
        b.decide_with(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::activate::fixture::*;
    use crate::activate::*;

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

    /// The host's GPUs are read once per run: the render's binds and the
    /// flip's preflight take one discovery (one `ldconfig -p`), and a
    /// run that stages without a preflight of the GPUs reads them once too.
    #[test]
    fn a_run_reads_the_gpus_once_for_the_render_and_the_preflight() {
        let (s, fake, _) = setup("healthy", None, "on");
        gpu_host(&s);
        let r = run(&s, &fake);
        assert_eq!(r.outcome, Some(Outcome::Committed), "{r:?}");
        assert!(
            r.preflight
                .iter()
                .all(|f| !f.name.starts_with("gpu-libraries")),
            "{r:?}"
        );
        assert_eq!(ldconfig_calls(&s), 1);
        image_with(&img_dir(&s), "healthy", "2");
        let ran = crate::activate::fetch(&s.root, &s.config, &fake, &Options::default());
        assert_eq!(ran.report.exit_code, exit::OK, "{:?}", ran.report);
        assert_eq!(ldconfig_calls(&s), 2);
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
