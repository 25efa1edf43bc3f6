//! `kubeslot-activator follow`: the timer's run for a following host
//! (`source.follow`): `activate`, whose gates (release statement, wave,
//! window) apply to any image other than the running one. Given the
//! arguments; runs the real systemd tools.

use kubeslot_activator::activate::{self, Options};
use kubeslot_activator::config::Config;
use kubeslot_activator::systemd::SystemCtl;

use super::HostArgs;

/// Look for a new release of the followed tag (source.follow) and take it.
///
/// Run by kubeslot-activator-follow.timer (hourly, randomised delay). Does
/// nothing when the config sets no source.follow. Otherwise it runs
/// `activate`: the followed tag is resolved in the repository, layout or
/// archive the config's image names (or, with {"annotation": true}, the
/// image the Node's `<prefix>desired-image` annotation names, read with the
/// node's credentials; unset: the config's image), and an image other than the running
/// one is taken only with an unexpired release statement for its digest,
/// once the node's wave has opened, inside a maintenance window
/// (rollout.windows) and, with rollout.limit, unless the rollout is paused
/// or halted by rollbacks and once one of max_unavailable Leases is free
/// (held until the commit or the rollback); until then the run ends "waiting" (exit 0) and
/// report.json (`status`) says until when. Exit codes as `activate`; an
/// expired or missing statement is exit 1 with the node untouched.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub host: HostArgs,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let path = args.host.config_path();
    // A config that does not load is activate's to report (exit 3).
    if let Ok(config) = Config::load(&path) {
        if config.source.follow.is_none() {
            println!(
                "source.follow is not set in {}: nothing to follow",
                path.display()
            );
            return Ok(());
        }
    }
    let ran = activate::activate(&args.host.root(), &path, &SystemCtl, &Options::default());
    super::conclude(ran, args.json)
}
