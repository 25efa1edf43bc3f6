//! `kubeslot-builder`: parse the command line, dispatch to one module per
//! subcommand (`cmd/`), print the error chain once.

mod assemble;
mod cmd;
mod debian;
mod fetch;
mod output;
mod recipe;
mod registry;
mod rootfs;
mod sbom;
mod sign;

use clap::Parser;

/// Build, sign and publish reproducible kubeslot node images.
#[derive(Parser)]
#[command(name = "kubeslot-builder", version, about)]
enum Cli {
    /// Print the version and exit.
    Version,
    Lock(cmd::lock::LockArgs),
    Base(cmd::base::BaseArgs),
}

fn main() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let result = match Cli::parse() {
        Cli::Version => {
            println!("{}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Cli::Lock(args) => cmd::lock::run(args),
        Cli::Base(args) => cmd::base::run(args),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
