//! `plan` and `activate --dry-run`: what a run would do, decided by the same
//! [`plan::decide`] as `activate`, on what can be known without the lock,
//! without starting anything and without writing anything.
//!
//! What it cannot know it says: a committed node that is not running is
//! decided on as up (`activate` starts and gates it first, and refuses
//! when it does not come up); a flip a dead run was trying is recovered
//! by `activate` first. The preflight runs read-only: the host settings
//! the flip writes and applies first count as applied.

use std::path::Path;

use crate::config::Config;
use crate::host_settings;
use crate::paths::Root;
use crate::plan::{self, Command, Committed, Decision, Situation};
use crate::preflight;
use crate::render;
use crate::state::State;
use crate::systemd::Systemd;

use super::begin::{flip_disk_use, gather, preflight_inputs, release_of};
use super::recover::as_recovered;
use super::{open_verified, ActivateError, Options, Rendered, Run};

/// What `plan` and `activate --dry-run` show.
pub struct Preview {
    /// The state as read (a dead run's pending flip as it was left).
    pub state: State,
    /// The configured image; `None` when `activate` refuses before it
    /// reads the config (a machine it does not account for runs).
    pub image: Option<String>,
    /// What the decision was made on (`None` in that case too).
    pub situation: Option<Situation>,
    /// What `activate` would do, with its exit code on a refusal.
    pub decision: Decision,
    /// Diffs of the target slot's host files (empty unless a flip).
    pub diffs: Vec<render::FileDiff>,
    /// Diffs of the host settings (sysctl, modules-load drop-ins) the next
    /// flip writes and applies (empty when they are current).
    pub host_settings: Vec<render::FileDiff>,
}

/// Decides what `activate` with `opts` would do (asking `systemd` which
/// machines run, starting none).
pub fn preview(
    root: &Root,
    config_path: &Path,
    systemd: &dyn Systemd,
    opts: &Options,
) -> Result<Preview, ActivateError> {
    // read-only: a save that died between its writes is taken as the
    // next locked run will repair it
    let (state, _repair) = State::load_torn(root)?;
    let run = Run::new(root, systemd);
    let recovered = as_recovered(&state);
    let machines = run.machines()?;
    let host_settings = host_settings::diff(root);
    if let Err(reason) = plan::refuse_foreign(&recovered, &machines) {
        // refused as activate refuses it: before the config is read
        return Ok(Preview {
            state,
            image: None,
            situation: None,
            decision: Decision::Refused(reason),
            diffs: Vec::new(),
            host_settings,
        });
    }
    let config = Config::load(config_path)?;
    let facts = gather(root, config_path, &config)?;
    let resolved = open_verified(root, &config)?;
    let files = Rendered::new(&config, &facts);
    let committed = match recovered.active {
        Some(a) if !machines.runs(a) || opts.force => Committed::Unchecked,
        _ => Committed::Up,
    };
    let mut situation = Situation {
        command: Command::Activate,
        digest: resolved.digest(),
        release: release_of(&config, &resolved.verified),
        inputs: files.inputs_hash(),
        active_files_current: recovered.active.is_some_and(|a| files.current(root, a)),
        machines,
        committed,
        force: opts.force,
        allow_downgrade: opts.allow_downgrade || config.trust.allow_downgrade,
        preflight: None,
        state: recovered,
    };
    let mut decision = plan::decide(&situation);
    let mut diffs = Vec::new();
    if let Decision::Flip(flip) = &decision {
        let disk = flip_disk_use(root, flip, &resolved.verified);
        let inputs = preflight_inputs(&config, disk, !host_settings.is_empty());
        situation.preflight = Some(preflight::run(root, &inputs));
        diffs = render::diff(root, files.slot(flip.to))
            .into_iter()
            .filter(|d| !d.diff.is_empty())
            .collect();
        decision = plan::decide(&situation);
    }
    Ok(Preview {
        state,
        image: Some(config.image.to_string()),
        situation: Some(situation),
        decision,
        diffs,
        host_settings,
    })
}

