//! `plan` and `activate --dry-run`: what a run would do, computed without
//! the lock and without writing anything.

use std::path::Path;

use crate::config::Config;
use crate::host_settings;
use crate::paths::Root;
use crate::plan::{self, Plan};
use crate::render;
use crate::state::State;

use super::begin::gather;
use super::{resolve, ActivateError, Rendered};

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
    let files = Rendered::new(&config, &facts);
    let inputs = files.inputs_hash();
    let current = state.active.is_some_and(|a| files.current(root, a));
    let plan = plan::activate(&state, digest, &inputs, current, force);
    let diffs = match &plan {
        Plan::Flip(f) => render::diff(root, files.slot(f.to))
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
