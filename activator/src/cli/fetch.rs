//! `kubeslot-activator fetch`: stage the configured image into the inactive
//! slot without flipping (see [`kubeslot_activator::activate::fetch`]).
//! Given the arguments; runs the real systemd tools (only to recover a run
//! that died mid-flip).

use kubeslot_activator::activate::{self, Options};
use kubeslot_activator::systemd::SystemCtl;

use super::HostArgs;

/// Stage the configured image into the inactive slot, without flipping.
///
/// Resolves the reference once, verifies it against the trust policy,
/// downloads the blobs the content store lacks and unpacks them into the
/// inactive slot (kube1/kube2), recorded dirty first and staged (with its
/// digest and host-file inputs) once the tree is in place. Renders no host
/// file, stops and starts no machine: the running node is untouched. A
/// later `activate` of the same image with the same host settings reuses
/// the staged slot (no download, no unpack) and only flips. Staging over
/// the inactive slot replaces the node kept for `rollback`. A run that
/// finds the leftovers of a run that died finishes or undoes them first.
/// Writes report.json (outcome "staged", or "up-to-date" when the active
/// slot already runs the image).
///
/// A registry or mirror answering 429 or 503 is asked again after the
/// Retry-After it names plus a random share of a growing backoff (a mirror
/// three times, then the next endpoint); every request of the run ends
/// within download.deadline_secs (default 1200). report.json's
/// registry_requests counts the requests sent, the 429/503 answers and the
/// time waited.
///
/// Exit codes: 0 staged or up to date; 1 error; 3 the config cannot be
/// read, is invalid, or names what this host lacks, the inactive slot's
/// machine is running, or a machine runs that kubeslot has no record of
/// (see `adopt`); 4 the image failed on this host before (see --force); 5
/// another run holds the lock.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub host: HostArgs,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Stage the image even if it failed its health gate on this host
    /// before with the same host settings.
    #[arg(long)]
    pub force: bool,
    /// Stage an image older than the newest release committed here for
    /// its identity (as `activate --allow-downgrade`).
    #[arg(long)]
    pub allow_downgrade: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let ran = activate::fetch(
        &args.host.root(),
        &args.host.config_path(),
        &SystemCtl,
        &Options {
            force: args.force,
            allow_downgrade: args.allow_downgrade,
        },
    );
    super::conclude(ran, args.json)
}
