//! `kubeslot-builder base`: build one platform's base rootfs tar of a recipe
//! with a Debian-family package base, from its lock only. `build` runs the
//! same [`crate::debian::install::build_rootfs`] for its base layer; this
//! command exposes that step alone (CI caches, debugging, tests). Given the
//! recipe, platform, cache and output; it refuses a missing or stale lock.

use std::path::PathBuf;

use anyhow::Context;

use crate::debian::{install, lock::Lock, RecipeBase};

/// Build a recipe's package base (`[base] kind = "debian"`) for one platform
/// from its lock, as a normalised rootfs tar.
///
/// Every .deb is fetched from the mirror + the lock's pool path into a
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
    /// Content-addressed .deb cache (`DIR/sha256/<hex>`).
    #[arg(long, value_name = "DIR", default_value = ".kubeslot-cache")]
    pub cache: PathBuf,
    /// The rootfs tar to write (written only on success).
    #[arg(long, short)]
    pub output: PathBuf,
}

pub fn run(args: BaseArgs) -> anyhow::Result<()> {
    let mut recipe = RecipeBase::load(&args.recipe)?;
    let lock = Lock::load_for(&recipe)?;
    recipe.base.apply_mirrors(&args.mirror)?;
    let epoch = recipe.source_date_epoch.with_context(|| {
        format!(
            "recipe {} has no source_date_epoch: a reproducible base needs one",
            args.recipe.display()
        )
    })?;
    let sha = install::build_rootfs(
        &recipe,
        &lock,
        &install::BuildBase {
            arch: &args.platform,
            cache: &args.cache,
            output: &args.output,
            source_date_epoch: epoch,
        },
    )?;
    println!("sha256:{sha} {}", args.output.display());
    Ok(())
}
