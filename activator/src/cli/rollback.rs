//! `kubeslot-activator rollback`: flip back to the previous slot (see
//! [`kubeslot_activator::activate::rollback`]). Runs the real systemd tools.

use kubeslot_activator::activate::{self, RollbackOptions};
use kubeslot_activator::systemd::SystemCtl;

use super::HostArgs;

/// Flip back to the slot that ran before, without downloading anything.
///
/// The previous slot must hold a committed former node (its tree is kept
/// after every flip) or the tree `adopt` took over, and its tree must still
/// match the fingerprint (entry count and size,
/// /var/lib/kubeslot/slots/<machine>.tree) recorded when its machine was
/// stopped, and its machine must not be running: otherwise the rollback is
/// refused (exit 1, or 3 for a running machine) and nothing is stopped or
/// started. Its host files are re-rendered from the config it was activated
/// with (an adopted tree keeps the files its tool wrote), the running
/// machine is stopped, the previous one started and health-checked: on
/// success it is committed (and enabled at boot instead) and the image
/// rolled away from is marked bad (so `activate` does not bring it back);
/// on failure the machine that ran before the rollback runs again.
/// An overlay slot is mounted again first; with --clean its upper
/// directory (everything its machine wrote) is emptied instead, so it
/// starts as exactly the verified image (the fingerprint is then not
/// checked: the lowers are the layers as unpacked).
/// --config is ignored. Exit codes as `activate`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub host: HostArgs,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Overlay slots: drop everything the previous slot's machine wrote
    /// (its upper directory) before starting it.
    #[arg(long)]
    pub clean: bool,
    /// Start a copied previous slot even when files its image installed
    /// (outside /var, /tmp, /run, /root, /home) changed since; without it
    /// such a slot is refused, naming the files.
    #[arg(long)]
    pub force: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let ran = activate::rollback(
        &args.host.root(),
        &SystemCtl,
        &RollbackOptions {
            clean: args.clean,
            force: args.force,
        },
    );
    super::conclude(ran, args.json)
}
