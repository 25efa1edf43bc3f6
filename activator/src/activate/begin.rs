//! The start of every `activate` and `fetch` (steps 2 to 4): recover,
//! refuse what the state does not account for, reconcile the committed
//! node with systemd, read the config and the host facts, resolve and
//! verify once, plan; and the preflight before a flip.
//!
//! Given the run context ([`Run`]); returns a [`Begun`] that staging and
//! the flip carry on with. Writes nothing of the slots.

use std::path::Path;
use std::sync::Arc;

use kubeslot_image::source::Source;

use crate::config::Config;
use crate::failpoint;
use crate::health::{self, Check, Failure, Gate};
use crate::host_settings;
use crate::paths::Root;
use crate::plan::{self, Flip, Plan};
use crate::preflight;
use crate::render::{self, HostFacts};
use crate::report::{Datapoint, Outcome, Report};
use crate::slot::Slot;
use crate::stage::{self, Verified};
use crate::state::{Release, State};

use super::{
    fallback_health, load_slot_config, resolve::open_verified_marked, ActivateError, Options,
    Rendered, Run,
};

/// Steps 2 to 4, shared by `activate` and `fetch`: what a run found and
/// decided before it writes anything of its own.
pub(super) struct Begun {
    pub(super) state: State,
    pub(super) config: Config,
    pub(super) facts: HostFacts,
    /// Taken by staging (absent when the plan reuses a staged slot, it is
    /// dropped at the end of the run).
    pub(super) source: Option<Source>,
    pub(super) verified: Verified,
    /// Both slots' host files, rendered once.
    pub(super) files: Rendered,
    /// Their inputs hash.
    pub(super) inputs: String,
    pub(super) flip: Flip,
    /// What a commit of this flip records as its identity's release.
    pub(super) release: Option<Release>,
}

/// What a run reconciles with systemd after recovery.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Reconcile {
    /// `activate`: refuse foreign machines, enable the committed slot at
    /// boot, start it when it is not running.
    StartCommitted,
    /// `fetch`: only refuse foreign machines (it starts and enables nothing).
    RefuseForeign,
}

/// Recover, reconcile, read the config, gather the facts, resolve once,
/// plan. `None` when the plan says there is nothing to do (the report says
/// why).
pub(super) fn begin(
    run: &Run<'_>,
    config_path: &Path,
    opts: &Options,
    reconcile: Reconcile,
    report: &mut Report,
) -> Result<Option<Begun>, ActivateError> {
    let root = run.root;
    report.phase("recover");
    let mut state = State::load_repairing(root)?;
    report.previous_slot = state.active;
    report.recovered = run.recover(&mut state)?;
    failpoint::hit("after-recover");
    run.refuse_foreign(&state)?;
    // A committed node that does not come up is noted, not the end of the
    // run: a flip to another image (or, forced, the same image staged
    // afresh) is the way out of a broken tree, so the plan decides.
    let down = match reconcile {
        Reconcile::StartCommitted => run.reconcile(&state, opts.force, report)?,
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
    let pacing = run
        .pacing
        .get_or_init(|| Arc::new(crate::trust::pacing(&config.download)));
    let resolved = open_verified_marked(root, &config, pacing.clone(), report)?;
    let digest = resolved.digest();
    report.digest = Some(digest);
    report.index_digest = Some(resolved.index_digest()).filter(|d| *d != digest);
    let files = Rendered::new(&config, &facts);
    let inputs = files.inputs_hash();
    let current = state.active.is_some_and(|a| files.current(root, a));
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
    if run.running(flip.to)? {
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
        files,
        inputs,
        flip,
        release,
    }))
}

/// The release a commit of `verified` records: its identity (see
/// [`crate::trust::identity`]) and the signed config's `created`. `None`
/// when no identity applies (an unsigned layout allowed by
/// `allow_unsigned`): nothing orders such images.
pub(super) fn release_of(config: &Config, verified: &Verified) -> Option<Release> {
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
pub(super) fn refuse_downgrade(state: &State, candidate: &Release) -> Result<(), ActivateError> {
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

pub(super) fn gather(
    root: &Root,
    config_path: &Path,
    config: &Config,
) -> Result<HostFacts, ActivateError> {
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

/// What a planned flip writes: nothing when it reuses a staged slot.
pub(super) fn flip_disk_use(root: &Root, b: &Begun) -> preflight::DiskUse {
    if b.flip.reuse_staged {
        preflight::DiskUse::Staged
    } else {
        preflight::DiskUse::Needs(preflight::DiskNeed::of(root, &b.verified.image))
    }
}

impl Run<'_> {
    /// Refuses a host whose node machines kubeslot does not account for: a
    /// machine running while no slot is committed, or a host that
    /// unbounded-agent provisioned (its applied config) with no kubeslot
    /// state yet.
    pub(super) fn refuse_foreign(&self, state: &State) -> Result<(), ActivateError> {
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
    /// running machine ([`Run::refuse_foreign`] refused that before).
    ///
    /// Returns the gate's failure when the committed node did not come up
    /// (also noted in the report's `reconcile`): the caller decides with
    /// the plan whether that ends the run.
    ///
    /// With `force` a running committed node is gated too (`activate
    /// --force` re-stages an image whose node runs but is not healthy).
    pub(super) fn reconcile(
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
                Ok(None)
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
                Ok(Some(failure))
            }
        }
    }

    /// Before a flip: the host settings written and applied, then every
    /// preflight check; a blocking failure refuses the flip before
    /// anything of the slots changes.
    pub(super) fn preflight(&self, b: &Begun, report: &mut Report) -> Result<(), ActivateError> {
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
        match crate::host_network::record_if_missing(self.root) {
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
        let result = preflight::run(
            self.root,
            &preflight::Inputs {
                gpu: b.config.gpu,
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
