//! `kubeslot-builder lock`: resolve a recipe's Debian-family package base
//! into `<recipe-stem>.lock` beside it, or (`--check`) verify that the lock
//! still matches the recipe. Given the recipe path and mirror overrides; the
//! work is in [`crate::debian`]. It never touches the machine's apt state.

use std::path::PathBuf;

use anyhow::Context;

use crate::cmd::Global;
use crate::debian::{self, lock::Lock, RecipeBase};

/// Resolve a recipe's package base (`[base] kind = "debian"`) with apt into a
/// lock that pins every .deb by sha256.
///
/// Per platform (amd64, arm64) apt runs in a private root: `apt-get update`
/// against the recipe's repositories (InRelease checked with the recipe's
/// keyring), then `apt-get install --print-uris` of the recipe's packages
/// plus every Essential and Priority: required package (a minbase). The lock
/// (`RECIPE` with the extension `.lock`) records each InRelease's sha256 and
/// every .deb's name, version, architecture, pool path, size and sha256, and
/// the sha256 of the recipe's `[base]` section. It names no mirror host.
#[derive(clap::Args, Debug)]
pub struct LockArgs {
    /// The recipe (TOML) whose `[base]` to lock.
    pub recipe: PathBuf,
    /// Resolve against URL instead of the recipe's `[base] mirror`; or
    /// `NAME=URL` for the extra repository NAME. Repeatable.
    #[arg(long, value_name = "URL|NAME=URL")]
    pub mirror: Vec<String>,
    /// Do not resolve: fail unless the existing lock was made from the
    /// recipe's current `[base]` section and covers its platforms.
    #[arg(long)]
    pub check: bool,
    /// After locking, have apt download every locked .deb into
    /// DIR/<pool path> (to seed a mirror or an air-gapped archive).
    #[arg(long, value_name = "DIR", conflicts_with = "check")]
    pub download: Option<PathBuf>,
}

/// `{"lock": PATH, "base_sha256": HEX, "platforms": {ARCH: N}}` for `--json`.
fn summary(path: &std::path::Path, lock: &Lock) -> serde_json::Value {
    let platforms: serde_json::Map<String, serde_json::Value> = lock
        .platforms
        .iter()
        .map(|p| (p.arch.clone(), p.packages.len().into()))
        .collect();
    serde_json::json!({
        "lock": path,
        "base_sha256": lock.base_sha256,
        "platforms": platforms,
    })
}

pub fn run(args: LockArgs, global: &Global) -> anyhow::Result<()> {
    let mut recipe = RecipeBase::load(&args.recipe)?;
    if args.check {
        let lock = Lock::load_for(&recipe)?;
        let path = recipe.lock_path();
        if global.json {
            println!("{}", summary(&path, &lock));
            return Ok(());
        }
        let n: usize = lock.platforms.iter().map(|p| p.packages.len()).sum();
        println!(
            "{}: up to date ({} platforms, {n} packages)",
            path.display(),
            lock.platforms.len()
        );
        return Ok(());
    }
    recipe.base.apply_mirrors(&args.mirror)?;
    let work = tempfile::tempdir().context("creating a scratch directory for apt")?;
    let lock = debian::resolve::resolve(&recipe, work.path())?;
    let path = recipe.lock_path();
    lock.write(&path)?;
    if !global.json {
        for p in &lock.platforms {
            println!(
                "{}: {} packages for {}",
                path.display(),
                p.packages.len(),
                p.arch
            );
        }
    }
    if let Some(dest) = &args.download {
        for arch in &recipe.arches {
            debian::resolve::download(
                &recipe,
                &lock,
                arch,
                &work.path().join("dl").join(arch),
                dest,
            )?;
        }
        if !global.json {
            println!("downloaded every locked .deb into {}", dest.display());
        }
    }
    if global.json {
        println!("{}", summary(&path, &lock));
    }
    Ok(())
}
