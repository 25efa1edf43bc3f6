//! `kubeslot-builder`: parse the command line, build the tokio runtime,
//! dispatch to one module per subcommand (`cmd/`), print the error chain
//! once and exit 1 on failure. The work lives in the modules below.

mod assemble;
mod build;
mod cmd;
mod creds;
mod debian;
mod diff;
mod fetch;
mod images;
mod layer_cache;
mod layers;
mod output;
mod pinned;
mod plan;
mod progress;
mod publish;
mod recipe;
mod registry;
mod rootfs;
mod sbom;
mod sign;
mod statement;
mod transfer;

use clap::{Parser, Subcommand};

/// Build, sign and publish reproducible kubeslot node images.
#[derive(Parser)]
#[command(name = "kubeslot-builder", version, about)]
struct Cli {
    #[command(flatten)]
    global: cmd::GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build a recipe into an OCI image layout or oci-archive.
    Build(cmd::build::Args),
    /// Parse and validate a recipe without touching the network.
    Check(cmd::check::Args),
    /// (benchmark) Write one deterministic layer from a directory tree.
    #[command(hide = true)]
    BenchLayer(cmd::build::BenchLayerArgs),
    /// Print the version and exit.
    Version,
    Lock(cmd::lock::LockArgs),
    Base(cmd::base::BaseArgs),
    Push(cmd::push::PushArgs),
    Keygen(cmd::keygen::KeygenArgs),
    Sign(cmd::sign::SignArgs),
    Copy(cmd::copy::CopyArgs),
    Sbom(cmd::sbom::SbomArgs),
    Diff(cmd::diff::DiffArgs),
    Statement(cmd::statement::StatementArgs),
}

fn main() {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("KUBESLOT_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,oci_client=error")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let global = cli.global.resolve();
    let result = runtime.block_on(async {
        match cli.command {
            Command::Build(args) => cmd::build::run(args, &global).await,
            Command::Check(args) => cmd::check::run(args, &global).await,
            Command::BenchLayer(args) => cmd::build::bench_layer(args, &global).await,
            Command::Lock(args) => tokio::task::block_in_place(|| cmd::lock::run(args, &global)),
            Command::Base(args) => cmd::base::run(args, &global).await,
            Command::Version => {
                println!("{}", env!("CARGO_PKG_VERSION"));
                Ok(())
            }
            Command::Push(args) => cmd::push::run(args, &global).await,
            Command::Keygen(args) => cmd::keygen::run(args, &global).await,
            Command::Sign(args) => cmd::sign::run(args, &global).await,
            Command::Copy(args) => cmd::copy::run(args, &global).await,
            Command::Sbom(args) => cmd::sbom::run(args, &global).await,
            Command::Diff(args) => cmd::diff::run(args, &global).await,
            Command::Statement(args) => cmd::statement::run(args, &global).await,
        }
    });
    if let Err(e) = result {
        eprintln!("error: {}", kubeslot_image::error_chain(e.as_ref()));
        std::process::exit(1);
    }
}
