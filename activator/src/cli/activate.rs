//! `kubeslot-activator activate`: the whole flow (see
//! [`kubeslot_activator::activate`]), or with `--dry-run` only its plan.
//! Given the arguments; runs the real systemd tools.

use kubeslot_activator::activate::{self, Options};
use kubeslot_activator::systemd::SystemCtl;

use super::HostArgs;

/// Flip the node machine to the configured image, with a health gate.
///
/// Resolves and verifies the image, stages it into the inactive slot
/// (kube1/kube2), renders its host files, stops the running machine, starts
/// the new one and waits for it to be healthy (unit active, kubelet
/// /healthz, GPU devices): then commits (the new machine is the one enabled
/// at boot), or starts the old machine again and marks the image bad. A run
/// that finds the leftovers of a run that died finishes or undoes them
/// first, then reconciles with systemd: the committed machine not running
/// (after a reboot) is started and gated (outcome "started"); when it does
/// not come up the run goes on: a new image is flipped to with the old node
/// treated as down (the report's "reconcile" says what happened). Before a
/// flip it writes and applies the host settings (sysctl.d, modules-load.d)
/// and runs the preflight checks. Writes report.json in every case.
///
/// Exit codes: 0 committed, already up to date, or the committed node
/// started; 1 error (nothing was flipped, or recovery could not finish, or
/// the old machine did not pass its gate either after a rollback, or the
/// committed node runs the configured image but did not come up: see
/// --force); 2 the
/// new machine failed its health gate and the old one runs again; 3 the
/// config cannot be read, is invalid, or names what this host lacks (CA
/// file, trusted key, device), a preflight check failed, the target
/// slot's machine is running, or a machine runs that kubeslot has no
/// record of (see `adopt`) or beside the committed one: nothing was
/// changed; 4 the image failed on this host before and is not retried (see
/// --force), or it is older than the newest release this host committed for
/// its signing identity (see --allow-downgrade); 5 another run holds the
/// lock.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub host: HostArgs,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Only print what would change (as `plan`); touch nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Try the image even if it failed its health gate on this host before
    /// with the same host settings; and when the committed node runs the
    /// configured image but fails its health gate (or does not start),
    /// stage that image afresh into the other slot and flip to it.
    #[arg(long)]
    pub force: bool,
    /// Accept an image older (by its signed creation time) than the newest
    /// release this host committed for the same identity; without it such
    /// an image is refused with exit 4. `rollback` needs no flag.
    #[arg(long)]
    pub allow_downgrade: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let opts = Options {
        force: args.force,
        allow_downgrade: args.allow_downgrade,
    };
    if args.dry_run {
        return super::plan::show(&args.host, &opts, args.json);
    }
    let ran = activate::activate(
        &args.host.root(),
        &args.host.config_path(),
        &SystemCtl,
        &opts,
    );
    super::conclude(ran, args.json)
}
