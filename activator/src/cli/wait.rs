//! `kubeslot-activator wait`: block until no activation runs, then print
//! the last report.

use kubeslot_activator::lock::Lock;
use kubeslot_activator::report::Report;

use super::HostArgs;

/// Wait until a running activate/rollback ends, then print its report.
///
/// Returns at once when none runs. Exits with the report's exit code, so a
/// provisioning script can `kubeslot-activator wait` after starting the
/// unit; 1 when there is no report yet.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub host: HostArgs,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let root = args.host.root();
    let _shared = Lock::wait_shared(&root)?;
    let Some(report) = Report::load(&root) else {
        anyhow::bail!("{}: no report yet", root.report_file().display());
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.to_text());
    }
    match &report.error {
        Some(e) if report.exit_code != 0 => Err(super::Failed {
            code: report.exit_code,
            message: format!("the last run failed: {e}"),
        }
        .into()),
        _ => Ok(()),
    }
}
