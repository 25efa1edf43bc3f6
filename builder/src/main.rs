//! `kubeslot-builder`: parse the command line, dispatch to one module per
//! subcommand, print the error chain once.

use clap::Parser;

/// Build, sign and publish reproducible kubeslot node images.
#[derive(Parser)]
#[command(name = "kubeslot-builder", version, about)]
enum Cli {
    /// Print the version and exit (commands land with their issues).
    Version,
}

fn main() {
    match Cli::parse() {
        Cli::Version => println!("{}", env!("CARGO_PKG_VERSION")),
    }
}
