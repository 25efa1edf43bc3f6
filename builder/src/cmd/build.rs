//! `kubeslot-builder build`. (in progress)
use std::path::PathBuf;

use crate::cmd::Global;

/// Build a recipe.
#[derive(clap::Args, Debug)]
pub struct Args {
    pub recipe: PathBuf,
}

#[derive(clap::Args, Debug)]
pub struct BenchLayerArgs {
    pub dir: PathBuf,
}

pub async fn run(_args: Args, _global: &Global) -> anyhow::Result<()> {
    anyhow::bail!("build is not wired yet")
}

pub async fn bench_layer(_args: BenchLayerArgs, _global: &Global) -> anyhow::Result<()> {
    anyhow::bail!("bench-layer is not wired yet")
}
