//! `kubeslot-builder build RECIPE --output oci:DIR[:TAG] | oci-archive:FILE[:TAG]`.
//!
//! Decide first, act second: the recipe is loaded and validated, every
//! input of every platform is resolved to a pinned URL and the base image
//! (if any) is checked against its pinned digest, which is the plan that
//! `--dry-run` prints. Then the inputs are fetched, each layer group is
//! written as one deterministic layer, the documents are assembled in a
//! staging directory beside the output, re-read and verified with the
//! activator library, and only then moved into place. A failure at any step
//! leaves the output as it was.
//!
//! Publishing hooks in at three marked places (see `crate::publish`):
//! each platform gets an SBOM layer, the staged layout gets the `.sbom` and,
//! with `--sign-key`, `.sig` attachments, and `--push` uploads the output.
//! A Debian package base (`kind = "debian"`) is planned from its lock (a
//! missing or stale lock refuses the build before anything is fetched), its
//! `.deb`s are fetched by the lock's sha256 through the same cache, and
//! `crate::debian` installs and normalises them into the rootfs tarball that
//! [`base_layers`] (the one place a platform's base comes from) turns into
//! the base layer; every locked package goes into the SBOM.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use kubeslot_activator::layout::{BlobDir, Layout};
use kubeslot_activator::oci::{
    Compression, Descriptor, History, Index, Platform, ANNOTATION_REF_NAME, MEDIA_TYPE_INDEX,
};
use kubeslot_activator::paths::Root;
use kubeslot_activator::source::{SelectedImage, Source};
use kubeslot_activator::{Digest, ImageSource};
use serde_json::json;

use crate::assemble::{assemble, rfc3339, ImageMeta, LayerDesc, PlatformImage};
use crate::cmd::Global;
use crate::fetch::Fetcher;
use crate::output::{self, Target};
use crate::recipe::{
    BaseSpec, CliDownloads, Format, ImageBase, Input, InputKind, LayerCompression, Recipe,
    BASE_GROUP,
};
use crate::rootfs::{clean_path, BaseShape, Data, Entry, Kind, LayerBlob, Tree};

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
    pub push: Option<kubeslot_activator::ImageRef>,
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
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum BenchCompression {
    Gzip,
    Zstd,
}

/// What one platform's base contributes: layers already in the staging
/// blob dir, with their history.
pub struct BaseLayers {
    pub layers: Vec<LayerDesc>,
    /// The base's directories and symlinks, when the builder wrote the base
    /// tree itself (rootfs and Debian bases; not image bases).
    pub shape: Option<BaseShape>,
}

/// The plan: everything decided before anything is fetched or written.
struct Plan {
    recipe: Recipe,
    target: Option<Target>,
    tag: String,
    inputs: Vec<(Platform, Vec<Input>)>,
    base_image: Option<ResolvedBaseImage>,
    /// A package base's lock, checked against the recipe while planning.
    debian: Option<DebianPlan>,
    annotations: BTreeMap<String, String>,
    /// `--sign-key`, loaded while planning so a bad key fails first.
    sign_key: Option<p256::ecdsa::SigningKey>,
    /// What the signatures name (`--push` repository, else the recipe name).
    identity: String,
}

/// A Debian package base: the `[base]` section (mirrors overridden by
/// `--mirror`) and the lock made from it.
struct DebianPlan {
    base: crate::debian::RecipeBase,
    lock: crate::debian::lock::Lock,
}

/// A base image read through the activator's `Source` (layout, archive or
/// registry), its top-level digest checked against the pin.
struct ResolvedBaseImage {
    source: Source,
    /// `IMAGE@DIGEST` for messages and history.
    name: String,
    /// Per platform: the manifest, config and layers, checked by `select`.
    selected: BTreeMap<Platform, SelectedImage>,
}

pub async fn run(args: Args, global: &Global) -> anyhow::Result<()> {
    // Planning may read a base image with the blocking activator reader.
    let plan = tokio::task::block_in_place(|| make_plan(&args, global))?;
    if args.dry_run {
        print_plan(&plan);
        return Ok(());
    }
    let target = plan
        .target
        .clone()
        .ok_or_else(|| anyhow!("--output is required (oci:DIR[:TAG] or oci-archive:FILE[:TAG])"))?;
    let mut summary = execute(&plan, &target, global).await?;
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

fn make_plan(args: &Args, global: &Global) -> anyhow::Result<Plan> {
    let recipe = Recipe::load(&args.recipe)?;
    let target = args.output.as_deref().map(Target::parse).transpose()?;
    // An existing output must be a layout we can add to: find out now,
    // before anything is downloaded.
    if let Some(Target::Layout { dir, .. }) = &target {
        let empty = std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none());
        if dir.exists() && !empty {
            Layout::open(dir).context("--output")?;
        }
    }
    let tag = target
        .as_ref()
        .and_then(|t| t.tag().map(str::to_string))
        .unwrap_or_else(|| recipe.file.tag.clone());
    // Paths given on the command line are relative to the working
    // directory (the recipe's own are relative to the recipe).
    let cwd_url = |s: &str| -> anyhow::Result<String> {
        if s.contains("://") {
            return Ok(s.to_string());
        }
        let abs = std::path::absolute(s).with_context(|| format!("path {s}"))?;
        Ok(format!(
            "{}{}",
            abs.display(),
            if s.ends_with('/') { "/" } else { "" }
        ))
    };
    let mut cli = CliDownloads {
        base_url: args.download_base.as_deref().map(cwd_url).transpose()?,
        ..Default::default()
    };
    for o in &args.download_override {
        let (name, url) = o
            .split_once('=')
            .ok_or_else(|| anyhow!("--download-override {o:?}: expected NAME=URL"))?;
        if name != "base" && !recipe.file.components.contains_key(name) {
            bail!(
                "--download-override {o:?}: {name:?} is no component of {} (nor base)",
                recipe.path.display()
            );
        }
        cli.overrides.insert(name.to_string(), cwd_url(url)?);
    }
    // Every input of every platform is resolved (and its pin checked)
    // before anything is downloaded.
    let mut inputs = Vec::new();
    for p in &recipe.platforms {
        inputs.push((p.clone(), recipe.inputs(p, &cli)?));
    }
    let base_image = match &recipe.file.base {
        BaseSpec::Image(b) => Some(resolve_base_image(&recipe, b, &global.cache.join("tmp"))?),
        BaseSpec::Rootfs(_) => None,
        BaseSpec::Debian(_) => None,
    };
    // A package base builds from its lock only: none, or one made from
    // another `[base]` section, refuses the build here, before any fetch.
    let debian = match &recipe.file.base {
        BaseSpec::Debian(_) => {
            let mut base = crate::debian::RecipeBase::load(&recipe.path)?;
            let lock = crate::debian::lock::Lock::load_for(&base)?;
            base.base.apply_mirrors(&args.mirror)?;
            Some(DebianPlan { base, lock })
        }
        _ if !args.mirror.is_empty() => bail!(
            "--mirror: {} has no package base (kind = \"debian\"); use --download-base",
            recipe.path.display()
        ),
        _ => None,
    };
    let mut annotations = BTreeMap::new();
    let f = &recipe.file;
    annotations.insert("org.opencontainers.image.title".into(), f.name.clone());
    // The recipe's tag, not the output's: naming the output differently
    // (`oci-archive:FILE:v1`) must not change the image's digest.
    annotations.insert("org.opencontainers.image.version".into(), f.tag.clone());
    annotations.insert(
        "org.opencontainers.image.created".into(),
        rfc3339(f.source_date_epoch),
    );
    if let Some(d) = &f.description {
        annotations.insert("org.opencontainers.image.description".into(), d.clone());
    }
    for (name, version) in recipe.versions() {
        annotations.insert(format!("dev.kubeslot.version.{name}"), version);
    }
    annotations.extend(f.annotations.clone());
    for a in &args.annotation {
        let (k, v) = a
            .split_once('=')
            .ok_or_else(|| anyhow!("--annotation {a:?}: expected KEY=VALUE"))?;
        annotations.insert(k.to_string(), v.to_string());
    }
    let sign_key = args
        .sign_key
        .as_deref()
        .map(crate::sign::load_key)
        .transpose()?;
    let identity = match &args.push {
        Some(r) => r.name(),
        None => recipe.file.name.clone(),
    };
    Ok(Plan {
        recipe,
        target,
        tag,
        inputs,
        base_image,
        debian,
        annotations,
        sign_key,
        identity,
    })
}

/// Opens the base image with the activator's reader, checks that it is the
/// pinned digest, and selects (and checks) its manifest for every platform.
/// Blocking (local files or the activator's blocking registry client).
fn resolve_base_image(
    recipe: &Recipe,
    b: &ImageBase,
    scratch: &Path,
) -> anyhow::Result<ResolvedBaseImage> {
    let at = || format!("{}: base.image {}", recipe.path.display(), b.image);
    let parsed: ImageSource = b.image.parse().with_context(at)?;
    // Local paths in a recipe are relative to the recipe; a registry
    // reference is asked for the pinned digest itself (never a tag).
    let src = match parsed {
        ImageSource::Layout { dir, tag } => ImageSource::Layout {
            dir: recipe.dir.join(dir),
            tag,
        },
        ImageSource::Archive { file, tag } => ImageSource::Archive {
            file: recipe.dir.join(file),
            tag,
        },
        ImageSource::Registry(r) => ImageSource::Registry(r.with_digest(b.digest)),
    };
    std::fs::create_dir_all(scratch).with_context(|| scratch.display().to_string())?;
    let source = Source::open(&src, &BTreeMap::new(), &Root::host(), scratch).with_context(at)?;
    let top = source.resolve().with_context(at)?;
    if top.digest != b.digest {
        bail!(
            "{}: digest mismatch: the recipe pins {}, {src} is {}",
            at(),
            b.digest,
            top.digest
        );
    }
    let mut selected = BTreeMap::new();
    for p in &recipe.platforms {
        let image = source.select(&top, p).with_context(at)?;
        selected.insert(p.clone(), image);
    }
    Ok(ResolvedBaseImage {
        source,
        name: format!("{}@{}", b.image, b.digest),
        selected,
    })
}

fn print_plan(plan: &Plan) {
    let f = &plan.recipe.file;
    let platforms: Vec<String> = plan
        .recipe
        .platforms
        .iter()
        .map(|p| p.to_string())
        .collect();
    println!("plan: {}:{} for {}", f.name, plan.tag, platforms.join(", "));
    match &plan.target {
        Some(t) => println!("output: {}", t.path().display()),
        None => println!("output: (none given)"),
    }
    if let Some(b) = &plan.base_image {
        println!("base: image {}", b.name);
    }
    if let Some(d) = &plan.debian {
        println!(
            "base: debian {} from {} (lock {})",
            d.base.base.suite,
            d.base.base.mirror,
            d.base.lock_path().display()
        );
        for p in &d.lock.platforms {
            let bytes: u64 = p.packages.iter().map(|x| x.size).sum();
            println!(
                "    {}: {} locked .debs, {bytes} bytes",
                p.arch,
                p.packages.len()
            );
        }
    }
    for (platform, inputs) in &plan.inputs {
        for i in inputs {
            println!("input {platform}: {} {}", i.pinned.label, i.pinned.sha256);
            println!("    from {}", i.pinned.url);
            if i.pinned.url != i.upstream {
                println!("    upstream {}", i.upstream);
            }
        }
    }
    for l in &f.layers {
        println!(
            "layer {}: {}",
            l.group,
            layer_contents(&plan.recipe, &l.group).join(", ")
        );
    }
    println!("dry run: nothing downloaded or written");
}

/// Human list of what goes into a group.
fn layer_contents(recipe: &Recipe, group: &str) -> Vec<String> {
    let f = &recipe.file;
    if group == BASE_GROUP {
        return vec![match &f.base {
            BaseSpec::Image(i) => format!("image {}@{}", i.image, i.digest),
            BaseSpec::Rootfs(r) => format!("rootfs {}", r.url),
            BaseSpec::Debian(d) => format!("debian {}", d.suite),
        }];
    }
    let mut out: Vec<String> = f
        .components
        .iter()
        .filter(|(_, c)| c.group == group)
        .map(|(n, c)| format!("{n} {}", c.version))
        .collect();
    out.extend(
        f.files
            .iter()
            .filter(|x| x.group == group)
            .map(|x| x.path.clone()),
    );
    for u in &f.units.enable {
        if recipe.unit_file(&u.unit).is_some_and(|x| x.group == group) {
            out.push(format!("enable {} (wanted by {})", u.unit, u.wanted_by));
        }
    }
    out
}

struct Summary {
    index: Digest,
    lines: Vec<String>,
    json: serde_json::Value,
}

async fn execute(plan: &Plan, target: &Target, global: &Global) -> anyhow::Result<Summary> {
    let recipe = &plan.recipe;
    let epoch = recipe.file.source_date_epoch;
    let compression = match recipe.file.compression {
        LayerCompression::Gzip => Compression::Gzip,
        LayerCompression::Zstd => Compression::Zstd,
    };
    let fetcher = Fetcher::new(&global.cache, global.progress.clone())?;
    let all: Vec<_> = plan
        .inputs
        .iter()
        .flat_map(|(_, ins)| ins.iter().map(|i| i.pinned.clone()))
        .collect();
    let paths = fetcher.fetch_all(&all).await?;
    let mut fetched = paths.into_iter();
    // A package base: every locked `.deb` of every platform, by sha256.
    let mut debs: BTreeMap<Platform, Vec<PathBuf>> = BTreeMap::new();
    if let Some(d) = &plan.debian {
        for (platform, _) in &plan.inputs {
            let locked = d.lock.platform(&platform.architecture)?;
            let pins = crate::debian::pinned(&d.base.base, locked)?;
            debs.insert(platform.clone(), fetcher.fetch_all(&pins).await?);
        }
    }

    // The staging dir sits beside the output (same filesystem) and is
    // removed on every exit path by its guard.
    let staging = output::staging_dir(target.path())?;
    let blobs = BlobDir::create(staging.path().join("blobs"))?;
    let blob_dir = blobs.root().join("sha256");
    let work = staging.path().join("work");

    // Platforms are built concurrently (each layer is compressed on a
    // blocking thread); identical blobs of two platforms land under the
    // same name by atomic rename, so the race is harmless.
    let mut per_platform = Vec::new();
    for (platform, inputs) in &plan.inputs {
        let files: Vec<(Input, PathBuf)> = inputs
            .iter()
            .map(|i| (i.clone(), fetched.next().expect("one path per input")))
            .collect();
        per_platform.push((platform, files));
    }
    let images =
        futures_util::future::try_join_all(per_platform.into_iter().map(|(platform, files)| {
            let work = work.join(&platform.architecture);
            let (blobs, blob_dir) = (&blobs, &blob_dir);
            let debs = debs.get(platform).cloned().unwrap_or_default();
            async move {
                let base = base_layers(
                    plan,
                    platform,
                    &files,
                    &debs,
                    blobs,
                    &work,
                    compression,
                    global,
                )
                .await?;
                let mut layers = base.layers;
                for l in recipe.file.layers.iter().filter(|l| l.group != BASE_GROUP) {
                    let mut tree = group_tree(recipe, &l.group, platform, &files, &work)?;
                    if let Some(shape) = &base.shape {
                        tree.fit_onto(shape).with_context(|| {
                            format!("{}: layer {}", recipe.path.display(), l.group)
                        })?;
                    }
                    let task =
                        global
                            .progress
                            .task("layer", &format!("{} {platform}", l.group), None);
                    let dir = blob_dir.clone();
                    let blob = tokio::task::spawn_blocking(move || {
                        tree.write_layer(&dir, compression, epoch)
                    })
                    .await
                    .expect("layer writer does not panic")
                    .with_context(|| format!("layer {} ({platform})", l.group))?;
                    task.finish("done");
                    let comment = l
                        .description
                        .clone()
                        .unwrap_or_else(|| layer_contents(recipe, &l.group).join(", "));
                    layers.push(layer_desc(
                        &blob,
                        &l.group,
                        epoch,
                        format!("kubeslot-builder: layer {}", l.group),
                        comment,
                    ));
                }
                // Publishing: this platform's SBOM, embedded as its own layer.
                let sbom = crate::publish::platform_sbom(
                    recipe,
                    &recipe.file.tag,
                    base_pin(plan, platform),
                    &base_packages(plan, platform)?,
                    &files,
                );
                let mut tree = Tree::new();
                tree.insert(
                    &format!("/{}", crate::sbom::IMAGE_PATH),
                    Entry::root(
                        Kind::File(Data::Bytes(Arc::new(sbom.clone()))),
                        0o644,
                        epoch,
                    ),
                )?;
                if let Some(shape) = &base.shape {
                    tree.fit_onto(shape)?;
                }
                let dir = blob_dir.clone();
                let blob =
                    tokio::task::spawn_blocking(move || tree.write_layer(&dir, compression, epoch))
                        .await
                        .expect("layer writer does not panic")
                        .with_context(|| format!("layer sbom ({platform})"))?;
                layers.push(layer_desc(
                    &blob,
                    "sbom",
                    epoch,
                    "kubeslot-builder: sbom".into(),
                    format!("SPDX 2.3 SBOM at /{}", crate::sbom::IMAGE_PATH),
                ));
                anyhow::Ok((
                    PlatformImage {
                        platform: platform.clone(),
                        layers,
                    },
                    sbom,
                ))
            }
        }))
        .await?;
    let (images, sboms): (Vec<_>, Vec<_>) = images.into_iter().unzip();
    let sboms: BTreeMap<Platform, Vec<u8>> = images
        .iter()
        .map(|i| i.platform.clone())
        .zip(sboms)
        .collect();

    let meta = ImageMeta {
        created: rfc3339(epoch),
        annotations: plan.annotations.clone(),
    };
    let assembled = assemble(&blobs, &meta, images)?;
    let index = assembled.index.digest;
    let mut entry = assembled.index.clone();
    entry
        .annotations
        .insert(ANNOTATION_REF_NAME.into(), plan.tag.clone());

    // Verify the staged image with the activator's reader before it moves.
    let staged = Layout::create(staging.path())?;
    staged.write_index(&Index {
        schema_version: 2,
        media_type: Some(MEDIA_TYPE_INDEX.into()),
        manifests: vec![entry.clone()],
        annotations: Default::default(),
    })?;
    let _ = std::fs::remove_dir_all(&work);
    // Publishing: `.sbom` (and with --sign-key `.sig`) attachments.
    crate::publish::attach(
        &staged,
        &plan.tag,
        &assembled.manifests,
        &sboms,
        plan.sign_key.as_ref().map(|k| (k, plan.identity.as_str())),
    )?;
    let entries = staged.index()?.manifests;
    output::verify_layout(&staged, Some(&plan.tag), &index)?;

    match target {
        Target::Layout { dir, .. } => {
            output::write_layout(&blobs, &entries, dir)?;
            output::verify_layout(&Layout::open(dir)?, Some(&plan.tag), &index)
                .with_context(|| format!("re-reading {}", dir.display()))?;
        }
        Target::Archive { file, .. } => {
            output::write_archive(staging.path(), file)?;
            let check = output::staging_dir(file)?;
            // Read back with the activator's own archive reader.
            let layout = kubeslot_activator::archive::extract(file, check.path())?;
            output::verify_layout(&layout, Some(&plan.tag), &index)
                .with_context(|| format!("re-reading {}", file.display()))?;
        }
    }
    drop(staging);

    let mut lines = Vec::new();
    let mut manifests_json = Vec::new();
    for (image, desc) in &assembled.manifests {
        lines.push(format!("manifest {}: {}", image.platform, desc.digest));
        let mut layers_json = Vec::new();
        for l in &image.layers {
            lines.push(format!(
                "  layer {:<12} {} ({} bytes)",
                l.group, l.descriptor.digest, l.descriptor.size
            ));
            layers_json.push(json!({
                "group": l.group,
                "digest": l.descriptor.digest,
                "size": l.descriptor.size,
                "diff_id": l.diff_id,
                "media_type": l.descriptor.media_type,
            }));
        }
        manifests_json.push(json!({
            "platform": image.platform.to_string(),
            "digest": desc.digest,
            "size": desc.size,
            "layers": layers_json,
        }));
    }
    lines.push(format!(
        "wrote {} ({}:{})",
        target.path().display(),
        recipe.file.name,
        plan.tag
    ));
    let json = json!({
        "name": recipe.file.name,
        "tag": plan.tag,
        "output": target.path(),
        "index": index,
        "index_size": assembled.index.size,
        "manifests": manifests_json,
    });
    Ok(Summary { index, lines, json })
}

/// Every locked package of a platform's package base, for the SBOM.
fn base_packages(
    plan: &Plan,
    platform: &Platform,
) -> anyhow::Result<Vec<crate::sbom::SbomPackage>> {
    let Some(d) = &plan.debian else {
        return Ok(Vec::new());
    };
    Ok(crate::debian::sbom_packages(
        &d.base.base,
        d.lock.platform(&platform.architecture)?,
    )?)
}

/// The pinned base image of a platform, for the SBOM.
fn base_pin(plan: &Plan, platform: &Platform) -> Option<(String, Digest)> {
    let b = plan.base_image.as_ref()?;
    b.selected.get(platform)?;
    match &plan.recipe.file.base {
        BaseSpec::Image(i) => Some((i.image.clone(), i.digest)),
        _ => None,
    }
}

fn layer_desc(
    blob: &LayerBlob,
    group: &str,
    epoch: u64,
    created_by: String,
    comment: String,
) -> LayerDesc {
    LayerDesc {
        descriptor: Descriptor::new(blob.media_type, blob.digest, blob.size),
        diff_id: blob.diff_id,
        history: History {
            created: Some(rfc3339(epoch)),
            created_by: Some(created_by),
            comment: Some(comment),
            empty_layer: false,
        },
        group: group.to_string(),
    }
}

/// The one place a platform's base layers come from: copied from a pinned
/// base image, or one re-normalised layer from a rootfs tarball, either
/// pinned or (a Debian package base) installed from the locked `.deb`s
/// (`debs`, fetched and checked, in lock order).
#[allow(clippy::too_many_arguments)]
async fn base_layers(
    plan: &Plan,
    platform: &Platform,
    files: &[(Input, PathBuf)],
    debs: &[PathBuf],
    blobs: &BlobDir,
    work: &Path,
    compression: Compression,
    global: &Global,
) -> anyhow::Result<BaseLayers> {
    let epoch = plan.recipe.file.source_date_epoch;
    match &plan.recipe.file.base {
        BaseSpec::Rootfs(_) => {
            let (input, path) = files
                .iter()
                .find(|(i, _)| i.kind == InputKind::BaseRootfs)
                .expect("rootfs base has an input");
            let (blob, shape) = rootfs_layer(
                path,
                work,
                &blobs.root().join("sha256"),
                compression,
                epoch,
                global,
                platform,
            )
            .await?;
            Ok(BaseLayers {
                layers: vec![layer_desc(
                    &blob,
                    BASE_GROUP,
                    epoch,
                    format!("kubeslot-builder: base rootfs {}", input.upstream),
                    format!("pinned {}", input.pinned.sha256),
                )],
                shape: Some(shape),
            })
        }
        BaseSpec::Image(_) => {
            let base = plan.base_image.as_ref().expect("resolved in the plan");
            let image = &base.selected[platform];
            let history: Vec<History> = image
                .config
                .history
                .iter()
                .filter(|h| !h.empty_layer)
                .cloned()
                .collect();
            let mut layers = Vec::new();
            for (i, (l, _, diff_id)) in image.layers.iter().enumerate() {
                // Every base blob is re-hashed on its way into the output.
                tokio::task::block_in_place(|| -> anyhow::Result<()> {
                    if blobs.contains(&l.digest) {
                        return Ok(());
                    }
                    let stream = base.source.open_blob(l, 0)?;
                    blobs
                        .put_verified(&l.digest, Some(l.size), stream.reader)
                        .with_context(|| format!("base.image {}: layer {}", base.name, l.digest))?;
                    Ok(())
                })?;
                let mut d = Descriptor::new(&l.media_type, l.digest, l.size);
                d.annotations = l.annotations.clone();
                layers.push(LayerDesc {
                    descriptor: d,
                    diff_id: *diff_id,
                    history: history.get(i).cloned().unwrap_or_else(|| History {
                        created_by: Some(format!("base image {}", base.name)),
                        ..Default::default()
                    }),
                    group: BASE_GROUP.into(),
                });
            }
            Ok(BaseLayers {
                layers,
                shape: None,
            })
        }
        BaseSpec::Debian(_) => {
            let d = plan
                .debian
                .as_ref()
                .expect("the lock is loaded in the plan");
            let locked = d.lock.platform(&platform.architecture)?.clone();
            std::fs::create_dir_all(work).with_context(|| work.display().to_string())?;
            let tarball = work.join("debian-rootfs.tar");
            let task = global
                .progress
                .task("install", &format!("debian base {platform}"), None);
            let (suite, debs_owned, out) =
                (d.base.base.suite.clone(), debs.to_vec(), tarball.clone());
            let n = locked.packages.len();
            let sha = tokio::task::spawn_blocking(move || {
                crate::debian::install::build_rootfs(
                    &locked,
                    &crate::debian::install::BuildBase {
                        suite: &suite,
                        debs: &debs_owned,
                        output: &out,
                        source_date_epoch: epoch as i64,
                    },
                )
            })
            .await
            .expect("the installer does not panic")
            .with_context(|| format!("debian base ({platform})"))?;
            task.finish("done");
            let (blob, shape) = rootfs_layer(
                &tarball,
                work,
                &blobs.root().join("sha256"),
                compression,
                epoch,
                global,
                platform,
            )
            .await?;
            let _ = std::fs::remove_file(&tarball);
            // No mirror in the history: one lock from any mirror is one image.
            Ok(BaseLayers {
                layers: vec![layer_desc(
                    &blob,
                    BASE_GROUP,
                    epoch,
                    format!(
                        "kubeslot-builder: debian {} base, {n} locked packages",
                        d.base.base.suite
                    ),
                    format!(
                        "lock of [base] sha256:{}, rootfs tar sha256:{sha}",
                        d.lock.base_sha256
                    ),
                )],
                shape: Some(shape),
            })
        }
    }
}

/// Re-normalises a rootfs tarball into one layer (blocking work off the runtime).
async fn rootfs_layer(
    tarball: &Path,
    work: &Path,
    blob_dir: &Path,
    compression: Compression,
    epoch: u64,
    global: &Global,
    platform: &Platform,
) -> anyhow::Result<(LayerBlob, BaseShape)> {
    let task = global
        .progress
        .task("layer", &format!("base {platform}"), None);
    let (t, w, d) = (
        tarball.to_path_buf(),
        work.to_path_buf(),
        blob_dir.to_path_buf(),
    );
    let blob = tokio::task::spawn_blocking(move || {
        let tree = Tree::from_tarball(&t, &w, epoch)?;
        let shape = tree.shape();
        Ok::<_, crate::rootfs::RootfsError>((tree.write_layer(&d, compression, epoch)?, shape))
    })
    .await
    .expect("layer writer does not panic")
    .with_context(|| format!("base rootfs {}", tarball.display()))?;
    task.finish("done");
    Ok(blob)
}

/// The tree of one non-base group for one platform: component binaries and
/// archive members, baked files, unit enable symlinks.
fn group_tree(
    recipe: &Recipe,
    group: &str,
    platform: &Platform,
    files: &[(Input, PathBuf)],
    work: &Path,
) -> anyhow::Result<Tree> {
    let epoch = recipe.file.source_date_epoch;
    let mut tree = Tree::new();
    let put = |tree: &mut Tree, path: &str, entry: Entry, what: &str| -> anyhow::Result<()> {
        let key = clean_path(path)
            .map_err(|r| anyhow!("{what}: {path}: {r}"))?
            .unwrap_or_default();
        if tree.get(&key).is_some() {
            bail!(
                "{}: {what}: {path} is already written by another entry of layer {group}",
                recipe.path.display()
            );
        }
        tree.insert(path, entry)?;
        Ok(())
    };
    for (name, c) in recipe
        .file
        .components
        .iter()
        .filter(|(_, c)| c.group == group)
    {
        let (input, path) = files
            .iter()
            .find(|(i, _)| i.kind == InputKind::Component(name.clone()))
            .expect("every component has an input");
        let what = format!("component {name} ({platform})");
        match c.format {
            Format::Binary => {
                let dest = c.dest.as_deref().expect("validated");
                let mode = c.mode.map_or(0o755, |m| m.0);
                put(
                    &mut tree,
                    dest,
                    Entry::root(Kind::File(Data::file(path)?), mode, epoch),
                    &what,
                )?;
            }
            Format::TarGz => {
                let dir = work.join("components").join(name);
                for (dest, data, mode) in extract_members(c, path, &dir, &input.pinned.url)
                    .with_context(|| what.clone())?
                {
                    put(
                        &mut tree,
                        &dest,
                        Entry::root(Kind::File(data), mode, epoch),
                        &what,
                    )?;
                }
            }
        }
    }
    for f in recipe.file.files.iter().filter(|f| f.group == group) {
        let data = match (&f.source, &f.content) {
            (Some(src), _) => Data::file(&recipe.dir.join(src))?,
            (None, Some(text)) => Data::Bytes(Arc::new(text.clone().into_bytes())),
            (None, None) => unreachable!("validated"),
        };
        let mode = f.mode.map_or(0o644, |m| m.0);
        put(
            &mut tree,
            &f.path,
            Entry::root(Kind::File(data), mode, epoch),
            "file",
        )?;
    }
    for u in &recipe.file.units.enable {
        let Some(unit) = recipe.unit_file(&u.unit).filter(|x| x.group == group) else {
            continue;
        };
        let link = format!("/etc/systemd/system/{}.wants/{}", u.wanted_by, u.unit);
        put(
            &mut tree,
            &link,
            Entry::root(Kind::Symlink(unit.path.clone()), 0o777, epoch),
            "unit",
        )?;
    }
    Ok(tree)
}

/// Extracts the members of a component archive that its rules select into
/// files under `dir`; returns (in-image path, data, mode) per member.
fn extract_members(
    c: &crate::recipe::ComponentSpec,
    archive: &Path,
    dir: &Path,
    url: &str,
) -> anyhow::Result<Vec<(String, Data, u32)>> {
    std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
    let f = std::fs::File::open(archive).with_context(|| archive.display().to_string())?;
    let mut ar = tar::Archive::new(flate2::read::MultiGzDecoder::new(std::io::BufReader::new(
        f,
    )));
    let mut out = Vec::new();
    let mut hits = vec![0usize; c.extract.len()];
    for (n, e) in ar
        .entries()
        .with_context(|| format!("{url}: not a tar.gz"))?
        .enumerate()
    {
        let mut e = e.with_context(|| format!("{url}: reading archive"))?;
        if e.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        let raw = String::from_utf8_lossy(&e.path_bytes()).into_owned();
        let Ok(Some(member)) = clean_path(&raw) else {
            continue;
        };
        let Some(ri) = c
            .extract
            .iter()
            .position(|x| glob_match(x.from.trim_start_matches("./"), &member))
        else {
            continue;
        };
        let rule = &c.extract[ri];
        hits[ri] += 1;
        let base = member.rsplit('/').next().unwrap_or(&member);
        let dest = if rule.to.ends_with('/') {
            format!("{}{base}", rule.to)
        } else {
            rule.to.clone()
        };
        let mode = rule
            .mode
            .map_or(e.header().mode().unwrap_or(0o755) & 0o7777, |m| m.0);
        let file = dir.join(format!("{n}"));
        let mut w = std::fs::File::create(&file).with_context(|| file.display().to_string())?;
        std::io::copy(&mut e, &mut w).with_context(|| format!("{url}: member {member}"))?;
        out.push((dest, Data::file(&file)?, mode));
    }
    for (rule, n) in c.extract.iter().zip(hits) {
        if n == 0 {
            bail!(
                "{url}: extract rule from = {:?} matched no regular file in the archive",
                rule.from
            );
        }
    }
    Ok(out)
}

/// `*` matches any run of characters within one path segment.
fn glob_match(pattern: &str, name: &str) -> bool {
    let (ps, ns): (Vec<&str>, Vec<&str>) =
        (pattern.split('/').collect(), name.split('/').collect());
    ps.len() == ns.len()
        && ps
            .iter()
            .zip(&ns)
            .all(|(p, n)| segment_match(p.as_bytes(), n.as_bytes()))
}

fn segment_match(p: &[u8], n: &[u8]) -> bool {
    match p.split_first() {
        None => n.is_empty(),
        Some((b'*', rest)) => (0..=n.len()).any(|i| segment_match(rest, &n[i..])),
        Some((c, rest)) => n.first() == Some(c) && segment_match(rest, &n[1..]),
    }
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
        tree.write_layer(&args.out, compression, args.epoch)
    })
    .await
    .expect("layer writer does not panic")?;
    println!("{} {} {}", blob.digest, blob.size, blob.path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("bin/*", "bin/containerd"));
        assert!(!glob_match("bin/*", "bin/x/y"));
        assert!(glob_match("*", "bridge"));
        assert!(glob_match("crictl", "crictl"));
        assert!(glob_match("bin/ctr*", "bin/ctr"));
        assert!(!glob_match("bin/*", "sbin/x"));
    }
}
