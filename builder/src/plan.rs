//! The build plan: everything `build` decides before it fetches or writes
//! anything, and what `--dry-run` prints.
//!
//! Given a [`BuildRequest`] (plain values, not command-line structs), it
//! loads and validates the recipe, resolves every input of every platform
//! to a pinned URL (download overrides applied), opens a base image and
//! checks it against its pinned digest, opens every `[[images]]` source
//! and checks it against its pin, loads a package base's lock (a
//! missing or stale one refuses the build), computes the annotations and
//! loads the signing key. It downloads nothing but a base image's
//! documents and writes nothing; [`crate::build`] applies a plan.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use kubeslot_image::layout::Layout;
use kubeslot_image::oci::Platform;
use kubeslot_image::{time, Digest, ImageRef, ImageSource};

use crate::output::Target;
use crate::pinned::PinnedImage;
use crate::recipe::{BaseSpec, CliDownloads, ImageBase, Input, Recipe};

/// What to build and how, as plain values (the `build` command's flags, or
/// any other caller's).
#[derive(Clone, Debug, Default)]
pub struct BuildRequest {
    /// The recipe TOML file.
    pub recipe: PathBuf,
    /// `oci:DIR[:TAG]` or `oci-archive:FILE[:TAG]`; none for a dry run.
    pub output: Option<String>,
    /// `--download-base URL`.
    pub download_base: Option<String>,
    /// `--download-override NAME=URL`, in order.
    pub download_override: Vec<String>,
    /// `--mirror URL|NAME=URL` for a package base.
    pub mirror: Vec<String>,
    /// Extra `KEY=VALUE` manifest annotations.
    pub annotation: Vec<String>,
    /// The private key to sign with.
    pub sign_key: Option<PathBuf>,
    /// The registry reference the image will be pushed to (names the
    /// signature identity).
    pub push: Option<ImageRef>,
    /// The signing identity (`--identity`), a repository.
    pub identity: Option<String>,
    /// The download cache (its `tmp/` holds base-image scratch space).
    pub cache: PathBuf,
}

/// The plan: everything decided before anything is fetched or written.
pub struct Plan {
    pub recipe: Recipe,
    pub target: Option<Target>,
    pub tag: String,
    pub inputs: Vec<(Platform, Vec<Input>)>,
    pub base_image: Option<PinnedImage>,
    /// `[[images]]`, each resolved and checked against its pin.
    pub images: Vec<crate::images::ResolvedImage>,
    /// A package base's lock, checked against the recipe while planning.
    pub debian: Option<DebianPlan>,
    pub annotations: BTreeMap<String, String>,
    /// `--sign-key`, loaded while planning so a bad key fails first.
    pub sign_key: Option<p256::ecdsa::SigningKey>,
    /// What the signatures name (`--push` repository, else the recipe name).
    pub identity: String,
}

/// A Debian package base: the `[base]` section (mirrors overridden by
/// `--mirror`) and the lock made from it.
pub struct DebianPlan {
    pub base: crate::debian::RecipeBase,
    pub lock: crate::debian::lock::Lock,
}

impl Plan {
    /// Loads and validates the recipe, resolves every input of every platform
    /// to a pinned URL, checks a base image against its pin and a package
    /// base against its lock, and loads the signing key: everything that can
    /// refuse the build does so here, before anything is fetched or written.
    pub fn make(req: &BuildRequest) -> anyhow::Result<Plan> {
        let recipe = Recipe::load(&req.recipe)?;
        let target = req.output.as_deref().map(Target::parse).transpose()?;
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
        let cli = cli_downloads(&recipe, req)?;
        // Every input of every platform is resolved (and its pin checked)
        // before anything is downloaded.
        let mut inputs = Vec::new();
        for p in &recipe.platforms {
            inputs.push((p.clone(), recipe.inputs(p, &cli)?));
        }
        let images = recipe
            .file
            .images
            .iter()
            .map(|i| crate::images::resolve(&recipe, i, &req.cache.join("tmp")))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let base_image = match &recipe.file.base {
            BaseSpec::Image(b) => Some(resolve_base_image(&recipe, b, &req.cache.join("tmp"))?),
            BaseSpec::Rootfs(_) => None,
            BaseSpec::Debian(_) => None,
        };
        // A package base builds from its lock only: none, or one made from
        // another `[base]` section, refuses the build here, before any fetch.
        let debian = match &recipe.file.base {
            BaseSpec::Debian(_) => {
                let mut base = crate::debian::RecipeBase::load(&recipe.path)?;
                let lock = crate::debian::lock::Lock::load_for(&base)?;
                base.base.apply_mirrors(&req.mirror)?;
                Some(DebianPlan { base, lock })
            }
            _ if !req.mirror.is_empty() => bail!(
                "--mirror: {} has no package base (kind = \"debian\"); use --download-base",
                recipe.path.display()
            ),
            _ => None,
        };
        let annotations = annotations(&recipe, &req.annotation)?;
        let sign_key = req
            .sign_key
            .as_deref()
            .map(crate::sign::load_key)
            .transpose()?;
        let identity = match (&req.identity, &req.push) {
            (Some(id), _) => kubeslot_image::reference::Identity::repository(id)
                .map_err(|e| anyhow!("--identity {id:?}: {}", e.reason))?
                .to_string(),
            (None, Some(r)) => r.name(),
            (None, None) => recipe.file.name.clone(),
        };
        Ok(Plan {
            recipe,
            target,
            tag,
            inputs,
            base_image,
            images,
            debian,
            annotations,
            sign_key,
            identity,
        })
    }
}

/// `--download-base` and `--download-override NAME=URL`, paths made
/// absolute: given on the command line, they are relative to the working
/// directory (the recipe's own are relative to the recipe).
fn cli_downloads(recipe: &Recipe, req: &BuildRequest) -> anyhow::Result<CliDownloads> {
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
        base_url: req.download_base.as_deref().map(cwd_url).transpose()?,
        ..Default::default()
    };
    for o in &req.download_override {
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
    Ok(cli)
}

/// The manifest annotations: title, version (the recipe's tag), created,
/// description, component versions, the recipe's own, then `--annotation
/// KEY=VALUE` (`extra`), later ones winning.
fn annotations(recipe: &Recipe, extra: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    let mut annotations = BTreeMap::new();
    let f = &recipe.file;
    annotations.insert("org.opencontainers.image.title".into(), f.name.clone());
    // The recipe's tag, not the output's: naming the output differently
    // (`oci-archive:FILE:v1`) must not change the image's digest.
    annotations.insert("org.opencontainers.image.version".into(), f.tag.clone());
    annotations.insert(
        "org.opencontainers.image.created".into(),
        time::rfc3339_seconds(f.source_date_epoch),
    );
    if let Some(d) = &f.description {
        annotations.insert("org.opencontainers.image.description".into(), d.clone());
    }
    for (name, version) in recipe.versions() {
        annotations.insert(format!("dev.kubeslot.version.{name}"), version);
    }
    annotations.extend(f.annotations.clone());
    for a in extra {
        let (k, v) = a
            .split_once('=')
            .ok_or_else(|| anyhow!("--annotation {a:?}: expected KEY=VALUE"))?;
        annotations.insert(k.to_string(), v.to_string());
    }
    Ok(annotations)
}

/// Opens the base image (as every pinned image: [`crate::pinned::open`]).
pub fn resolve_base_image(
    recipe: &Recipe,
    b: &ImageBase,
    scratch: &Path,
) -> anyhow::Result<PinnedImage> {
    let at = || format!("{}: base.image {}", recipe.path.display(), b.image);
    let parsed: ImageSource = b.image.parse().with_context(at)?;
    crate::pinned::open(recipe, &b.image, parsed, b.digest, scratch, at)
}

impl Plan {
    /// What `--dry-run` prints: inputs with pins and sources, the layers.
    pub fn describe(&self) -> Vec<String> {
        let mut out = Vec::new();
        let f = &self.recipe.file;
        let platforms: Vec<String> = self
            .recipe
            .platforms
            .iter()
            .map(|p| p.to_string())
            .collect();
        out.push(format!(
            "plan: {}:{} for {}",
            f.name,
            self.tag,
            platforms.join(", ")
        ));
        match &self.target {
            Some(t) => out.push(format!("output: {}", t.path().display())),
            None => out.push("output: (none given)".into()),
        }
        if let Some(b) = &self.base_image {
            out.push(format!("base: image {}", b.name));
        }
        if let Some(d) = &self.debian {
            out.push(format!(
                "base: debian {} from {} (lock {})",
                d.base.base.suite,
                d.base.base.mirror,
                d.base.lock_path().display()
            ));
            for p in &d.lock.platforms {
                let bytes: u64 = p.packages.iter().map(|x| x.size).sum();
                out.push(format!(
                    "    {}: {} locked .debs, {bytes} bytes",
                    p.arch,
                    p.packages.len()
                ));
            }
        }
        for i in &self.images {
            out.push(format!("image {}: {}", i.spec.name, i.spec.digest));
            out.push(format!("    from {}", i.image.name));
        }
        for (platform, inputs) in &self.inputs {
            for i in inputs {
                out.push(format!(
                    "input {platform}: {} {}",
                    i.pinned.label, i.pinned.sha256
                ));
                out.push(format!("    from {}", i.pinned.url));
                if i.pinned.url != i.upstream {
                    out.push(format!("    upstream {}", i.upstream));
                }
            }
        }
        for l in &f.layers {
            out.push(format!(
                "layer {}: {}",
                l.group,
                self.recipe.layer_contents(&l.group).join(", ")
            ));
        }
        out
    }
}

impl Plan {
    /// The pinned base image of a platform, for the SBOM.
    pub fn base_pin(&self, platform: &Platform) -> Option<(String, Digest)> {
        let b = self.base_image.as_ref()?;
        b.selected.get(platform)?;
        match &self.recipe.file.base {
            BaseSpec::Image(i) => Some((i.image.clone(), i.digest)),
            _ => None,
        }
    }

    /// Every locked package of a platform's package base, for the SBOM.
    pub fn base_packages(
        &self,
        platform: &Platform,
    ) -> anyhow::Result<Vec<crate::sbom::SbomPackage>> {
        let Some(d) = &self.debian else {
            return Ok(Vec::new());
        };
        Ok(crate::debian::sbom_packages(
            &d.base.base,
            d.lock.platform(&platform.architecture)?,
        )?)
    }
}
