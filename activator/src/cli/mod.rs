//! One module per subcommand of `kubeslot-activator`: an args struct and `run`.
//! The work lives in the library; these modules only turn arguments into a
//! library call and print its result.

pub mod activate;
pub mod adopt;
pub mod fetch;
pub mod follow;
pub mod gc;
pub mod plan;
pub mod preflight;
pub mod render;
pub mod rollback;
pub mod status;
pub mod uninstall;
pub mod unpack;
pub mod verify_layers;
pub mod wait;

use std::path::PathBuf;

use kubeslot_activator::paths::Root;

/// A run that ended with a specific exit code (see the exit code table in
/// `kubeslot_activator::activate::report::exit`); `main` exits with it.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Failed {
    pub code: i32,
    pub message: String,
}

/// `--root` and `--config` as the host commands share them.
#[derive(clap::Args, Debug, Clone)]
pub struct HostArgs {
    /// The host root all well-known paths are relative to (state, slots,
    /// host files, devices); "/" on a real host, a scratch directory to
    /// prepare or test one.
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub root: PathBuf,
    /// The activator config. Default: <ROOT>/etc/kubeslot/activator.json.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

impl HostArgs {
    pub fn root(&self) -> Root {
        Root::new(&self.root)
    }

    pub fn config_path(&self) -> PathBuf {
        self.config
            .clone()
            .unwrap_or_else(|| self.root().default_config())
    }
}

/// Prints a finished run's report and turns a failure into its exit code.
pub fn conclude(ran: kubeslot_activator::activate::Ran, json: bool) -> anyhow::Result<()> {
    let r = &ran.report;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(r).expect("report serialises")
        );
    } else if r.exit_code == 0 {
        print!("{}", r.to_text());
    }
    if let Err(e) = ran.saved {
        anyhow::bail!(
            "{}writing the report failed: {e}",
            r.error
                .as_deref()
                .map_or(String::new(), |m| format!("{m}; "))
        );
    }
    match &r.error {
        None => Ok(()),
        Some(message) => Err(Failed {
            code: r.exit_code,
            message: message.clone(),
        }
        .into()),
    }
}
