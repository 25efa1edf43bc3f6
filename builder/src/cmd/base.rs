//! `kubeslot-builder base`: build one platform's base rootfs tar of a recipe
//! with a Debian-family package base, from its lock only. `build` runs the
//! same steps for its base layer; this command exposes that step alone (CI
//! caches, debugging, tests). Given the recipe, platform, mirror overrides
//! and output (the cache is the global `--cache`); it refuses a missing or
//! stale lock and does not write layers.

use std::path::PathBuf;

use anyhow::Context;

use crate::cmd::Global;
use crate::debian::{self, install, lock::Lock, RecipeBase};
use crate::fetch::Fetcher;

/// Build a recipe's package base (`[base] kind = "debian"`) for one platform
/// from its lock, as a normalised rootfs tar.
///
/// Every .deb is fetched from the mirror + the lock's pool path into the
/// content-addressed cache (sha256 and size checked while streaming; a
/// cached file needs no network), put into a local repository, and installed
/// with mmdebstrap from that repository only, with the recipe's
/// SOURCE_DATE_EPOCH. Logs, caches, machine-id, resolv.conf, hostname and
/// device nodes are removed, entries sorted and mtimes clamped, so two
/// builds write the same bytes. Prints `sha256:<hex> OUTPUT`.
#[derive(clap::Args, Debug)]
pub struct BaseArgs {
    /// The recipe (TOML); its lock is `RECIPE` with the extension `.lock`.
    pub recipe: PathBuf,
    /// Debian architecture to build (`amd64`, `arm64`; a foreign one needs
    /// qemu-user-static and binfmt).
    #[arg(long, default_value = "amd64")]
    pub platform: String,
    /// Fetch from URL instead of the recipe's mirror; or `NAME=URL` for the
    /// extra repository NAME. Repeatable.
    #[arg(long, value_name = "URL|NAME=URL")]
    pub mirror: Vec<String>,
    /// The rootfs tar to write (written only on success).
    #[arg(long, short)]
    pub output: PathBuf,
}

pub async fn run(args: BaseArgs, global: &Global) -> anyhow::Result<()> {
    let mut recipe = RecipeBase::load(&args.recipe)?;
    let lock = Lock::load_for(&recipe)?;
    recipe.base.apply_mirrors(&args.mirror)?;
    let epoch = recipe.source_date_epoch.with_context(|| {
        format!(
            "recipe {} has no source_date_epoch: a reproducible base needs one",
            args.recipe.display()
        )
    })?;
    let platform = lock.platform(&args.platform)?;
    let fetcher = Fetcher::new(&global.cache, global.progress.clone())?;
    let debs = fetcher
        .fetch_all(&debian::pinned(&recipe.base, platform)?)
        .await?;
    let sha = tokio::task::block_in_place(|| {
        install::build_rootfs(
            platform,
            &install::BuildBase {
                suite: &recipe.base.suite,
                debs: &debs,
                output: &args.output,
                source_date_epoch: epoch,
            },
        )
    })?;
    if global.json {
        println!(
            "{}",
            serde_json::json!({"output": args.output, "sha256": format!("sha256:{sha}")})
        );
    } else {
        println!("sha256:{sha} {}", args.output.display());
    }
    Ok(())
}
