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
}

fn main() {
    match Cli::parse() {
        Cli::Version => println!("{}", env!("CARGO_PKG_VERSION")),
    }
}
