//! Layer grouping: which files of a recipe go into which layer, and the
//! base layers of a platform.
//!
//! Given a [`Plan`] and the fetched inputs of one platform, it builds the
//! base layers ([`base_layers`]: copied from a pinned base image, or one
//! re-normalised layer from a rootfs tarball or a package base's install)
//! and, per recipe layer group, the [`Tree`] of component binaries,
//! archive members, baked files and unit-enable symlinks ([`group_tree`]).
//! It does not fetch (the inputs arrive as files) or assemble manifests
//! ([`crate::assemble`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use kubeslot_image::layout::BlobDir;
use kubeslot_image::oci::{Compression, Descriptor, History, Platform};
use kubeslot_image::time;

use crate::assemble::LayerDesc;
use crate::layer_cache::{LayerCache, Miss};
use crate::pinned::PinnedImage;
use crate::plan::{DebianPlan, Plan};
use crate::progress::Progress;
use crate::recipe::{
    BaseSpec, Format, ImageSpec, Input, InputKind, Recipe, BASE_GROUP, IMAGES_DIR,
};
use crate::rootfs::{clean_path, BaseShape, Data, Entry, Kind, LayerBlob, Tree};

/// What one platform's base contributes: layers already in the staging
/// blob dir, with their history.
pub struct BaseLayers {
    pub layers: Vec<LayerDesc>,
    /// The base's directories and symlinks, when the builder wrote the base
    /// tree itself (rootfs and Debian bases; not image bases).
    pub shape: Option<BaseShape>,
}

pub fn layer_desc(
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
            created: Some(time::rfc3339_seconds(epoch)),
            created_by: Some(created_by),
            comment: Some(comment),
            empty_layer: false,
        },
        group: group.to_string(),
    }
}

/// How a platform's layers are written: where the blobs go, how they are
/// compressed (zstd on `zstd_workers` threads: the bytes are the same for
/// any count), the epoch every entry and history carries, and where their
/// progress is shown.
pub struct LayerWriter<'a> {
    /// The recipe file (named when a layer does not fit the base).
    pub recipe: &'a Path,
    /// The staging blob dir's `sha256/`.
    pub blob_dir: PathBuf,
    pub compression: Compression,
    /// zstd compressing threads ([`crate::rootfs::zstd_workers`] in a build).
    pub zstd_workers: u32,
    pub epoch: u64,
    pub progress: &'a Progress,
    pub platform: &'a Platform,
    /// `build --layer-cache`: where base layers re-normalised from a
    /// rootfs tarball are kept between builds.
    pub cache: Option<&'a LayerCache>,
}

impl LayerWriter<'_> {
    /// Writes a tree the builder made on top of the base (a recipe group's,
    /// the SBOM's) as one layer and describes it: fitted onto the base's
    /// directories and symlinks (`shape`, when the builder wrote the base),
    /// written, given its history. Every such layer takes this path.
    pub async fn layer(
        &self,
        mut tree: Tree,
        shape: Option<&BaseShape>,
        group: &str,
        created_by: String,
        comment: String,
    ) -> anyhow::Result<LayerDesc> {
        if let Some(shape) = shape {
            tree.fit_onto(shape).with_context(|| {
                format!(
                    "{}: layer {group} ({})",
                    self.recipe.display(),
                    self.platform
                )
            })?;
        }
        let blob = self.blob(tree, group).await?;
        Ok(layer_desc(&blob, group, self.epoch, created_by, comment))
    }

    /// Writes `tree` as a layer blob on a blocking thread (compression is
    /// CPU-heavy), shown as the progress task `layer GROUP PLATFORM`.
    async fn blob(&self, tree: Tree, group: &str) -> anyhow::Result<LayerBlob> {
        let task = self
            .progress
            .task("layer", &format!("{group} {}", self.platform), None);
        let (dir, compression, epoch) = (self.blob_dir.clone(), self.compression, self.epoch);
        let workers = self.zstd_workers;
        let blob = tokio::task::spawn_blocking(move || {
            tree.write_layer(&dir, compression, epoch, workers)
        })
        .await
        .expect("layer writer does not panic")
        .with_context(|| format!("layer {group} ({})", self.platform))?;
        task.finish("done");
        Ok(blob)
    }
}

/// The one place a platform's base layers come from: copied from a pinned
/// base image, or one re-normalised layer from a rootfs tarball, either
/// pinned or (a Debian package base) installed from the locked `.deb`s
/// (`debs`, fetched and checked, in lock order).
pub async fn base_layers(
    plan: &Plan,
    files: &[(Input, PathBuf)],
    debs: &[PathBuf],
    blobs: &BlobDir,
    work: &Path,
    writer: &LayerWriter<'_>,
) -> anyhow::Result<BaseLayers> {
    match &plan.recipe.file.base {
        BaseSpec::Rootfs(_) => {
            let (input, path) = files
                .iter()
                .find(|(i, _)| i.kind == InputKind::BaseRootfs)
                .expect("rootfs base has an input");
            let sha = input.pinned.sha256.hex();
            let (blob, shape) = rootfs_layer(path, &sha, work, blobs, writer).await?;
            Ok(BaseLayers {
                layers: vec![layer_desc(
                    &blob,
                    BASE_GROUP,
                    writer.epoch,
                    format!("kubeslot-builder: base rootfs {}", input.upstream),
                    format!("pinned {}", input.pinned.sha256),
                )],
                shape: Some(shape),
            })
        }
        BaseSpec::Image(_) => {
            let base = plan.base_image.as_ref().expect("resolved in the plan");
            image_base(base, writer.platform, blobs)
        }
        BaseSpec::Debian(_) => {
            let d = plan
                .debian
                .as_ref()
                .expect("the lock is loaded in the plan");
            debian_base(d, debs, blobs, work, writer).await
        }
    }
}

/// A base image's layers for one platform, each blob re-hashed on its way
/// into the output, with the image's own history.
fn image_base(
    base: &PinnedImage,
    platform: &Platform,
    blobs: &BlobDir,
) -> anyhow::Result<BaseLayers> {
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

/// A package base: the locked `.deb`s installed into a rootfs tarball (on
/// a blocking thread), re-normalised into one layer.
async fn debian_base(
    d: &DebianPlan,
    debs: &[PathBuf],
    blobs: &BlobDir,
    work: &Path,
    writer: &LayerWriter<'_>,
) -> anyhow::Result<BaseLayers> {
    let (platform, epoch) = (writer.platform, writer.epoch);
    let locked = d.lock.platform(&platform.architecture)?.clone();
    std::fs::create_dir_all(work).with_context(|| work.display().to_string())?;
    let tarball = work.join("debian-rootfs.tar");
    let task = writer
        .progress
        .task("install", &format!("debian base {platform}"), None);
    let (suite, debs_owned, out) = (d.base.base.suite.clone(), debs.to_vec(), tarball.clone());
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
    let (blob, shape) = rootfs_layer(&tarball, &sha, work, blobs, writer).await?;
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

/// Re-normalises a rootfs tarball (whose sha256 is `sha256`, hex) into one
/// layer (read on a blocking thread, written by the `writer`, or taken from
/// its layer cache); returns its shape too.
async fn rootfs_layer(
    tarball: &Path,
    sha256: &str,
    work: &Path,
    blobs: &BlobDir,
    writer: &LayerWriter<'_>,
) -> anyhow::Result<(LayerBlob, BaseShape)> {
    let task = writer
        .progress
        .task("read", &format!("base rootfs {}", writer.platform), None);
    let (t, w, epoch) = (tarball.to_path_buf(), work.to_path_buf(), writer.epoch);
    let tree = tokio::task::spawn_blocking(move || Tree::from_tarball(&t, &w, epoch))
        .await
        .expect("the tarball reader does not panic")
        .with_context(|| format!("base rootfs {}", tarball.display()))?;
    task.finish("done");
    let shape = tree.shape();
    let Some(cache) = writer.cache else {
        return Ok((writer.blob(tree, BASE_GROUP).await?, shape));
    };
    let key = cache.base_key(sha256, writer.compression, epoch);
    let task = writer
        .progress
        .task("layer", &format!("{BASE_GROUP} {}", writer.platform), None);
    let cached = tokio::task::block_in_place(|| cache.get(&key, blobs, writer.compression))
        .with_context(|| format!("layer {BASE_GROUP} ({})", writer.platform))?;
    match cached {
        Ok(blob) => {
            task.finish(&format!("cached ({})", cache.dir().display()));
            return Ok((blob, shape));
        }
        Err(Miss::Discarded(why)) => writer.progress.line(&format!(
            "layer cache: entry discarded, writing the layer anew: {why}"
        )),
        Err(Miss::Absent) => {}
    }
    task.finish("not cached");
    let blob = writer.blob(tree, BASE_GROUP).await?;
    if let Err(e) = tokio::task::block_in_place(|| cache.put(&key, &blob)) {
        writer.progress.line(&format!(
            "warning: layer cache {}: not stored: {e:#}",
            cache.dir().display()
        ));
    }
    Ok((blob, shape))
}

/// The tree of one non-base group for one platform: component binaries and
/// archive members, baked files, unit enable symlinks, and the `[[images]]`
/// archives (`archives`: written by `crate::images::archive`) with their
/// `NAME=`/`DIGEST=` files.
pub fn group_tree(
    recipe: &Recipe,
    group: &str,
    platform: &Platform,
    files: &[(Input, PathBuf)],
    archives: &[(ImageSpec, PathBuf)],
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
    for (spec, archive) in archives.iter().filter(|(s, _)| s.group == group) {
        let what = format!("image {}", spec.name);
        let stem = format!("{IMAGES_DIR}/{}", spec.slug());
        put(
            &mut tree,
            &format!("{stem}.oci.tar"),
            Entry::root(Kind::File(Data::file(archive)?), 0o644, epoch),
            &what,
        )?;
        let meta = format!(
            "# Baked by kubeslot-builder from [[images]]; the image's import unit\n\
             # loads {stem}.oci.tar into containerd (namespace k8s.io).\n\
             NAME='{}'\nDIGEST='{}'\n",
            spec.reference(),
            spec.digest
        );
        put(
            &mut tree,
            &format!("{stem}.image"),
            Entry::root(
                Kind::File(Data::Bytes(Arc::new(meta.into_bytes()))),
                0o644,
                epoch,
            ),
            &what,
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
