//! `kubeslot-builder build RECIPE --output oci:DIR[:TAG] | oci-archive:FILE[:TAG]`.
//!
//! Decide first, act second: the flags become a [`BuildRequest`], which
//! [`Plan::make`] turns into the plan that `--dry-run` prints; then
//! [`execute`] applies it and, with `--push`, [`crate::publish::push_output`]
//! uploads the result. The work lives in `crate::plan`, `crate::layers`,
//! `crate::build` and `crate::publish`; this file only maps flags and
//! prints.

use std::path::PathBuf;

use anyhow::anyhow;
use kubeslot_image::oci::Compression;

use crate::build::execute;
use crate::cmd::Global;
use crate::layer_cache::LayerCache;
use crate::plan::{BuildRequest, Plan};
use crate::rootfs::Tree;

/// Build a recipe into an OCI image layout or an oci-archive.
///
/// Every input is fetched by its pinned sha256 (through the cache), each
/// layer group becomes one reproducible layer, and the result is re-read and
/// verified before it is moved into place. The last line of the output is
/// the index digest.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The recipe TOML file.
    pub recipe: PathBuf,
    /// Where to write: `oci:DIR[:TAG]` (an existing layout gets the image
    /// added) or `oci-archive:FILE[:TAG]`. TAG defaults to the recipe's tag.
    #[arg(long, short)]
    pub output: Option<String>,
    /// Print the plan (inputs with pins and sources, layers) and stop:
    /// nothing is downloaded or written.
    #[arg(long)]
    pub dry_run: bool,
    /// Fetch every http(s) input from this base instead of upstream: the
    /// upstream scheme and host are replaced, the path is kept
    /// (`https://dl.k8s.io/release/…` → `URL/release/…`). `file://` URLs and
    /// plain directories work too. Pins are checked all the same.
    #[arg(long, value_name = "URL")]
    pub download_base: Option<String>,
    /// Fetch one input (a component name, or `base`) from URL (`{version}`,
    /// `{arch}` are filled in). Repeatable.
    #[arg(long, value_name = "NAME=URL")]
    pub download_override: Vec<String>,
    /// For a package base (`[base] kind = "debian"`): fetch the locked
    /// .debs from URL instead of the recipe's mirror, or `NAME=URL` for its
    /// extra repository NAME (the lock names pool paths only). Repeatable.
    #[arg(long, value_name = "URL|NAME=URL")]
    pub mirror: Vec<String>,
    /// Extra manifest annotation (e.g.
    /// `org.opencontainers.image.revision=$GITHUB_SHA`). Repeatable.
    #[arg(long, value_name = "KEY=VALUE")]
    pub annotation: Vec<String>,
    /// Sign the index and every platform manifest with this private key
    /// (PKCS#8 PEM from `keygen`); the signatures travel in the output.
    #[arg(long, value_name = "KEY")]
    pub sign_key: Option<PathBuf>,
    /// Then push the output, with its signatures and SBOMs, to this registry
    /// reference (`registry/repository[:tag]`).
    #[arg(long, value_name = "REF")]
    pub push: Option<kubeslot_image::ImageRef>,
    /// The repository the signatures name (`critical.identity.docker-reference`,
    /// e.g. `ghcr.io/example-org/kubeslot/ubuntu2404`): what hosts check as
    /// their `trust.identity`. Default: the `--push` repository, else the recipe's name. Set it when
    /// building an `oci:`/`oci-archive:` output that hosts will read as such.
    #[arg(long, value_name = "REPOSITORY")]
    pub identity: Option<String>,
    /// Keep the base layer re-normalised from a rootfs tarball (a
    /// `rootfs` or `debian` base) in DIR and take it from there when a
    /// later build has the same tarball, epoch, compression and builder:
    /// recipes that share a base skip its compression (most of a build).
    /// A hit is re-hashed; the image is the same bytes either way.
    #[arg(long, value_name = "DIR")]
    pub layer_cache: Option<PathBuf>,
    #[command(flatten)]
    pub registry: crate::registry::RegistryOptions,
}

/// Arguments of the hidden `bench-layer` subcommand.
#[derive(clap::Args, Debug)]
pub struct BenchLayerArgs {
    /// The directory tree to write as a layer.
    pub dir: PathBuf,
    /// Directory the layer blob is written into.
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long, value_enum, default_value = "gzip")]
    pub compression: BenchCompression,
    #[arg(long, default_value_t = 1_700_000_000)]
    pub epoch: u64,
    /// zstd compressing threads (default: one per CPU; the bytes are the
    /// same for any count).
    #[arg(long)]
    pub zstd_workers: Option<u32>,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum BenchCompression {
    Gzip,
    Zstd,
}

pub async fn run(args: Args, global: &Global) -> anyhow::Result<()> {
    let request = BuildRequest {
        recipe: args.recipe.clone(),
        output: args.output.clone(),
        download_base: args.download_base.clone(),
        download_override: args.download_override.clone(),
        mirror: args.mirror.clone(),
        annotation: args.annotation.clone(),
        sign_key: args.sign_key.clone(),
        push: args.push.clone(),
        identity: args.identity.clone(),
        cache: global.cache.clone(),
    };
    // Planning may read a base image with the blocking registry client.
    let plan = tokio::task::block_in_place(|| Plan::make(&request))?;
    if args.dry_run {
        for line in plan.describe() {
            println!("{line}");
        }
        println!("dry run: nothing downloaded or written");
        return Ok(());
    }
    let target = plan
        .target
        .clone()
        .ok_or_else(|| anyhow!("--output is required (oci:DIR[:TAG] or oci-archive:FILE[:TAG])"))?;
    let layer_cache = match &args.layer_cache {
        Some(dir) => Some(tokio::task::block_in_place(|| LayerCache::open(dir))?),
        None => None,
    };
    let mut summary = execute(
        &plan,
        &target,
        &global.cache,
        layer_cache.as_ref(),
        &global.progress,
    )
    .await?;
    if let Some(dest) = &args.push {
        let pushed = crate::publish::push_output(
            &target,
            &plan.tag,
            dest,
            &args.registry,
            plan.sign_key.as_ref(),
            &global.progress,
        )
        .await?;
        summary.lines.push(format!("pushed {pushed}"));
        summary.json["pushed"] = serde_json::to_value(&pushed)?;
    }
    if global.json {
        println!("{}", serde_json::to_string_pretty(&summary.json)?);
    } else {
        for line in &summary.lines {
            println!("{line}");
        }
        println!("{}", summary.index);
    }
    Ok(())
}

/// `bench-layer DIR --out OUT`: one layer from a directory, timed by the
/// caller (`ci/bench/build.sh`). Prints the blob digest and size.
pub async fn bench_layer(args: BenchLayerArgs, _global: &Global) -> anyhow::Result<()> {
    let compression = match args.compression {
        BenchCompression::Gzip => Compression::Gzip,
        BenchCompression::Zstd => Compression::Zstd,
    };
    let blob = tokio::task::spawn_blocking(move || {
        let tree = Tree::from_dir(&args.dir, args.epoch)?;
        let workers = args
            .zstd_workers
            .unwrap_or_else(crate::rootfs::zstd_workers);
        tree.write_layer(&args.out, compression, args.epoch, workers)
    })
    .await
    .expect("layer writer does not panic")?;
    println!("{} {} {}", blob.digest, blob.size, blob.path.display());
    Ok(())
}
