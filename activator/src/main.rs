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
    // host side: flip, fetch, follow, plan, status, rollback, wait, preflight, adopt,
    // uninstall, gc, verify-layers (about text: each Args)
    Activate(cli::activate::Args),
    Fetch(cli::fetch::Args),
    Follow(cli::follow::Args),
    Plan(cli::plan::Args),
    Status(cli::status::Args),
    Rollback(cli::rollback::Args),
    Wait(cli::wait::Args),
    Preflight(cli::preflight::Args),
    Adopt(cli::adopt::Args),
    Uninstall(cli::uninstall::Args),
    Gc(cli::gc::Args),
    VerifyLayers(cli::verify_layers::Args),
    // about text: the doc comment of `cli::render::Args`
    Render(cli::render::Args),
}

fn main() {
    let cli = Cli::parse();
    // The commands that fetch and unpack report progress on stderr.
    if matches!(
        cli,
        Cli::Unpack(_) | Cli::Activate(_) | Cli::Fetch(_) | Cli::Follow(_) | Cli::Rollback(_)
    ) {
        kubeslot_activator::progress::enable();
    }
    let result = match cli {
        Cli::Version => {
            println!("{}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Cli::Unpack(args) => cli::unpack::run(args),
        Cli::Activate(args) => cli::activate::run(args),
        Cli::Fetch(args) => cli::fetch::run(args),
        Cli::Follow(args) => cli::follow::run(args),
        Cli::Plan(args) => cli::plan::run(args),
        Cli::Status(args) => cli::status::run(args),
        Cli::Rollback(args) => cli::rollback::run(args),
        Cli::Wait(args) => cli::wait::run(args),
        Cli::Preflight(args) => cli::preflight::run(args),
        Cli::Adopt(args) => cli::adopt::run(args),
        Cli::Uninstall(args) => cli::uninstall::run(args),
        Cli::Gc(args) => cli::gc::run(args),
        Cli::VerifyLayers(args) => cli::verify_layers::run(args),
        Cli::Render(args) => cli::render::run(args),
    };
    if let Err(e) = result {
        eprintln!("error: {}", kubeslot_image::error_chain(e.as_ref()));
        // Commands that end with a specific code (rolled back, bad image,
        // busy, ...) say so; anything else is a plain failure.
        let code = e.downcast_ref::<cli::Failed>().map_or(1, |f| f.code);
        std::process::exit(code);
    }
}
