//! `kubeslot-activator wait`: block until no activation runs, then print
//! the last report; with `--provisioned`, until a run of this boot left
//! the committed node running.

use std::time::{Duration, Instant};

use kubeslot_activator::activate::report::{self, exit, Report};
use kubeslot_activator::lock::Lock;

use super::HostArgs;

/// Wait until a running activate/fetch/rollback ends, then print its report.
///
/// Returns at once when none runs. Exits with the report's exit code, so a
/// provisioning script can `kubeslot-activator wait` after starting the
/// unit; 1 when there is no report yet.
///
/// With --provisioned it waits instead until an activate or rollback of
/// this boot (the report's boot id is the host's) has ended with the
/// committed node running (outcome committed, started or up-to-date, exit
/// 0): what a provisioning pipeline waits on after the host booted. Failed
/// runs do not end the wait (the next one may succeed); after --timeout
/// seconds it exits 1 naming the last report.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub host: HostArgs,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Wait for the first commit (or start) of this boot, not only for the
    /// running activation.
    #[arg(long)]
    pub provisioned: bool,
    /// With --provisioned: give up after this many seconds (exit 1).
    #[arg(long, value_name = "SECS", default_value_t = 1800)]
    pub timeout: u64,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.provisioned {
        return provisioned(&args);
    }
    let root = args.host.root();
    let _shared = Lock::wait_shared(&root)?;
    let Some(report) = Report::load(&root) else {
        anyhow::bail!("{}: no report yet", root.report_file().display());
    };
    print(&report, args.json)?;
    match &report.error {
        Some(e) if report.exit_code != 0 => Err(super::Failed {
            code: report.exit_code,
            message: format!("the last run failed: {e}"),
        }
        .into()),
        _ => Ok(()),
    }
}

fn print(report: &Report, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        print!("{}", report.to_text());
    }
    Ok(())
}

fn provisioned(args: &Args) -> anyhow::Result<()> {
    let root = args.host.root();
    let boot = report::boot_id(&root);
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    loop {
        // a report is read only between runs, never half through one
        let last = match Lock::try_shared(&root)? {
            Some(_shared) => Report::load(&root),
            None => None,
        };
        if let Some(r) = last.as_ref().filter(|r| r.provisioned_in(boot.as_deref())) {
            return print(r, args.json);
        }
        if Instant::now() >= deadline {
            let why = match Report::load(&root) {
                None => "no report yet".to_string(),
                Some(r) if r.boot_id.as_deref() != boot.as_deref() => {
                    format!(
                        "the last report ({}, {}) is from another boot",
                        r.command, r.started
                    )
                }
                Some(r) => format!(
                    "the last run ({}, exit {}) ended {}",
                    r.command,
                    r.exit_code,
                    r.error.as_deref().unwrap_or("without the node committed")
                ),
            };
            return Err(super::Failed {
                code: exit::FAILED,
                message: format!("not provisioned after {} s: {why}", args.timeout),
            }
            .into());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}
