//! `kubeslot-builder`: parse the command line, dispatch to one module per
//! subcommand (`cmd/`), print the error chain once.

mod assemble;
mod cmd;
mod creds;
mod debian;
mod fetch;
mod output;
mod recipe;
mod registry;
mod rootfs;
mod sbom;
mod sign;
mod transfer;

use clap::Parser;

/// Build, sign and publish reproducible kubeslot node images.
#[derive(Parser)]
#[command(name = "kubeslot-builder", version, about)]
struct Cli {
    #[command(flatten)]
    global: cmd::Global,
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Print the version and exit.
    Version,
    Push(cmd::push::PushArgs),
    Keygen(cmd::keygen::KeygenArgs),
    Sign(cmd::sign::SignArgs),
    Copy(cmd::copy::CopyArgs),
    Sbom(cmd::sbom::SbomArgs),
}

async fn dispatch(cli: Cli) -> anyhow::Result<()> {
    let g = &cli.global;
    match cli.command {
        Command::Version => {
            println!("{}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Command::Push(a) => cmd::push::run(a, g).await,
        Command::Keygen(a) => cmd::keygen::run(a, g).await,
        Command::Sign(a) => cmd::sign::run(a, g).await,
        Command::Copy(a) => cmd::copy::run(a, g).await,
        Command::Sbom(a) => cmd::sbom::run(a, g).await,
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("KUBESLOT_LOG").unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("error,kubeslot_builder=warn")
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime starts");
    match runtime.block_on(dispatch(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
