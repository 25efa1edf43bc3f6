//! `kubeslot-activator`: parse the command line, dispatch to one module per
//! subcommand (`cli/`), print the error chain once and exit with a code
//! systemd can act on.

mod cli;

use clap::Parser;

/// Verify a signed kubeslot node image and activate it in a systemd-nspawn slot.
#[derive(Parser)]
#[command(name = "kubeslot-activator", version, about)]
enum Cli {
    /// Print the version and exit.
    Version,
    // about text: the doc comment of `cli::unpack::Args`
    Unpack(cli::unpack::Args),
}

fn main() {
    let result = match Cli::parse() {
        Cli::Version => {
            println!("{}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Cli::Unpack(args) => cli::unpack::run(args),
    };
    if let Err(e) = result {
        eprintln!("error: {}", kubeslot_activator::error_chain(e.as_ref()));
        std::process::exit(1);
    }
}
