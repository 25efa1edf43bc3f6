//! What an update from one image to another changes, per platform: the
//! layers (named by their recipe group, with sizes and the bytes a host
//! downloads), the component versions (`dev.kubeslot.version.*`
//! annotations) and the packages (each platform manifest's `.sbom`
//! attachment: components, and for a package base every locked `.deb`).
//!
//! Given two [`ImageSource`]s and the registry options, [`read`] loads each
//! image's documents only: index, platform manifests, configs and SBOM
//! attachments, never a layer. Local images are read with `kubeslot_image`'s
//! [`Source`] (the checks a host runs: digests, sizes, media types, the
//! config's platform); a registry image is first staged document by document
//! into a private layout with the builder's own registry client (so the
//! same credential sources as `push`/`copy` apply), then read the same way.
//! [`compare`] is pure: two [`ImageInfo`]s in, a [`Diff`] out, printed as
//! text (`Display`) or JSON.
//!
//! It deliberately does not verify signatures (`push`/`copy --verify-key`
//! and the hosts do that) and does not read layer contents: a layer is the
//! same when its digest is.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use kubeslot_image::layout::{Layout, LayoutError, MAX_DOCUMENT_BYTES};
use kubeslot_image::oci::{
    Descriptor, ImageConfig, Index, Manifest, Platform, ANNOTATION_REF_NAME,
    MEDIA_TYPE_DOCKER_LIST, MEDIA_TYPE_INDEX, MEDIA_TYPE_SPDX_JSON,
};
use kubeslot_image::source::{SelectedImage, Source, SourceError};
use kubeslot_image::{Digest, ImageRef, ImageSource};
use serde::Serialize;

use crate::registry::{RegistryError, RegistryOptions, Remote};
use crate::transfer::{self, TransferError};

/// The annotation prefix `build` writes a component's version under.
pub const VERSION_ANNOTATION: &str = "dev.kubeslot.version.";
/// SBOM documents larger than this are refused (a package base's SPDX
/// document is a few hundred KiB).
pub const MAX_SBOM_BYTES: u64 = 32 * 1024 * 1024;
/// The tag a staged registry image gets in its private layout.
const STAGED_TAG: &str = "diff";

/// Why an image could not be read for a diff; every variant names it.
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    /// A local image (`oci:`, `oci-archive:`): the error names it.
    #[error(transparent)]
    Local(Box<SourceError>),
    /// A registry image, read from its staged copy: named by its reference.
    #[error("{image}: {error}")]
    Source {
        image: String,
        error: Box<SourceError>,
    },
    #[error("{image}: {error}")]
    Registry { image: String, error: RegistryError },
    /// Staging a registry image (the error names it).
    #[error(transparent)]
    Stage(Box<TransferError>),
    #[error("{image}: {error}")]
    Layout { image: String, error: LayoutError },
    #[error("{image}: {path}: {error}")]
    Io {
        image: String,
        path: String,
        error: std::io::Error,
    },
    #[error("{image}: {what} {digest}: {reason}")]
    Document {
        image: String,
        what: String,
        digest: Digest,
        reason: String,
    },
    #[error("--platform {platform}: neither {old} nor {new} has it")]
    NoSuchPlatform {
        platform: String,
        old: String,
        new: String,
    },
}

impl From<SourceError> for DiffError {
    fn from(e: SourceError) -> Self {
        DiffError::Local(Box::new(e))
    }
}

/// Package name → (version, sha256), from one SBOM.
pub type Packages = BTreeMap<String, (String, String)>;

/// One image's documents, as the diff sees them.
#[derive(Clone, Debug)]
pub struct ImageInfo {
    /// The source as the user wrote it.
    pub name: String,
    /// What it resolved to (index or manifest).
    pub digest: Digest,
    pub platforms: Vec<PlatformInfo>,
}

/// One platform of an image.
#[derive(Clone, Debug)]
pub struct PlatformInfo {
    pub platform: Platform,
    pub manifest: Digest,
    /// Component → version, from the `dev.kubeslot.version.*` annotations.
    pub versions: BTreeMap<String, String>,
    /// Base first, as in the manifest.
    pub layers: Vec<LayerInfo>,
    /// Package name → (version, sha256) from its SBOM; `None` without one.
    pub packages: Option<Packages>,
}

/// A layer: its name (the recipe group that made it, or `#<position>`),
/// digest and compressed size.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LayerInfo {
    pub name: String,
    pub digest: Digest,
    pub size: u64,
}

/// The name of a layer from its history entry: the builder writes
/// `kubeslot-builder: layer <group>`, `… base rootfs …`, `… debian <suite>
/// base …` and `… sbom`; layers of other images (and of a base image) are
/// named by position.
fn layer_name(created_by: Option<&str>, position: usize) -> String {
    match created_by.and_then(|c| c.strip_prefix("kubeslot-builder: ")) {
        Some(rest) if rest.starts_with("layer ") => rest["layer ".len()..].to_string(),
        Some(rest) if rest.starts_with("base ") || rest.starts_with("debian ") => {
            "base".to_string()
        }
        Some("sbom") => "sbom".to_string(),
        _ => format!("#{position}"),
    }
}

/// An opened image: the reader and whatever private directory it needs.
struct Opened {
    source: Source,
    _dir: tempfile::TempDir,
}

/// Reads `src`'s documents (never its layers).
pub async fn read(src: &ImageSource, opts: &RegistryOptions) -> Result<ImageInfo, DiffError> {
    let name = src.to_string();
    let opened = open(src, opts).await?;
    tokio::task::block_in_place(|| describe(&name, &opened.source)).map_err(|e| match (e, src) {
        // The staged copy's errors name its private directory: name the
        // registry image instead.
        (DiffError::Local(error), ImageSource::Registry(_)) => {
            DiffError::Source { image: name, error }
        }
        (e, _) => e,
    })
}

async fn open(src: &ImageSource, opts: &RegistryOptions) -> Result<Opened, DiffError> {
    let image = src.to_string();
    let dir = tempfile::tempdir().map_err(|error| DiffError::Io {
        image: image.clone(),
        path: std::env::temp_dir().display().to_string(),
        error,
    })?;
    let local = match src {
        ImageSource::Registry(r) => {
            stage_registry(r, opts, dir.path()).await?;
            ImageSource::Layout {
                dir: dir.path().join("layout"),
                tag: Some(STAGED_TAG.into()),
            }
        }
        other => other.clone(),
    };
    // An archive is extracted under `dir` too, and removed with it.
    let source = Source::open(&local, &BTreeMap::new(), dir.path())?;
    Ok(Opened { source, _dir: dir })
}

fn is_index(media_type: &str) -> bool {
    media_type == MEDIA_TYPE_INDEX || media_type == MEDIA_TYPE_DOCKER_LIST
}

/// Copies what [`describe`] reads from a registry into `dir/layout`: the
/// index and manifests (digests checked by the client), each config and
/// each platform manifest's `.sbom` artifact with its document, under
/// their tags like a layout written by `copy`.
async fn stage_registry(
    image: &ImageRef,
    opts: &RegistryOptions,
    dir: &Path,
) -> Result<(), DiffError> {
    let name = image.to_string();
    let reg = |error| DiffError::Registry {
        image: name.clone(),
        error,
    };
    let lay = |error| DiffError::Layout {
        image: name.clone(),
        error,
    };
    let too_big = |what: &str, d: &Descriptor, limit: u64| DiffError::Document {
        image: name.clone(),
        what: what.into(),
        digest: d.digest,
        reason: format!("{} bytes exceeds the {limit}-byte limit", d.size),
    };
    let remote = Remote::connect(image, opts, false).await.map_err(reg)?;
    let layout = Layout::create(dir.join("layout")).map_err(lay)?;
    let root = transfer::fetch_image(&remote, &image.reference(), &layout, false)
        .await
        .map_err(|e| DiffError::Stage(Box::new(e)))?;
    let manifests: Vec<Descriptor> = if is_index(&root.media_type) {
        let index: Index = layout
            .read_json(&root.digest, Some(root.size))
            .map_err(lay)?;
        index.manifests
    } else {
        vec![root.clone()]
    };
    let mut root_entry = root.clone();
    root_entry
        .annotations
        .insert(ANNOTATION_REF_NAME.into(), STAGED_TAG.into());
    let mut entries = vec![root_entry];
    for m in &manifests {
        if is_index(&m.media_type) || !layout.blobs().contains(&m.digest) {
            continue; // nested indexes are not images Source::select picks
        }
        let manifest: Manifest = layout.read_json(&m.digest, Some(m.size)).map_err(lay)?;
        if manifest.config.size > MAX_DOCUMENT_BYTES {
            return Err(too_big("config", &manifest.config, MAX_DOCUMENT_BYTES));
        }
        remote
            .pull_blob(
                &manifest.config.digest,
                manifest.config.size,
                layout.blobs(),
            )
            .await
            .map_err(reg)?;
        let tag = m.digest.attachment_tag("sbom");
        let Some(raw) = remote.pull_manifest(&tag).await.map_err(reg)? else {
            continue;
        };
        layout.blobs().put_bytes(&raw.bytes).map_err(lay)?;
        let sbom: Manifest = layout
            .read_json(&raw.digest, Some(raw.bytes.len() as u64))
            .map_err(lay)?;
        for l in sbom
            .layers
            .iter()
            .filter(|l| l.media_type == MEDIA_TYPE_SPDX_JSON)
        {
            if l.size > MAX_SBOM_BYTES {
                return Err(too_big("sbom document", l, MAX_SBOM_BYTES));
            }
            remote
                .pull_blob(&l.digest, l.size, layout.blobs())
                .await
                .map_err(reg)?;
        }
        let mut d = Descriptor::new(&raw.media_type, raw.digest, raw.bytes.len() as u64);
        d.annotations.insert(ANNOTATION_REF_NAME.into(), tag);
        entries.push(d);
    }
    layout.upsert_index(entries).map_err(lay)
}

/// Reads every platform of an opened image.
fn describe(name: &str, source: &Source) -> Result<ImageInfo, DiffError> {
    let top = source.resolve()?;
    let mut platforms = Vec::new();
    if is_index(&top.media_type) {
        let index: Index = source.read_json(&top)?;
        for entry in &index.manifests {
            // Entries without a platform (attestations, nested indexes) are
            // not node images.
            let Some(p) = &entry.platform else { continue };
            let selected = source.select(&top, p)?;
            platforms.push(platform_info(name, source, &selected, Some(&index))?);
        }
    } else {
        let manifest: Manifest = source.read_json(&top)?;
        let config: ImageConfig = source.read_json(&manifest.config)?;
        let p = Platform {
            os: config.os,
            architecture: config.architecture,
            variant: config.variant,
        };
        let selected = source.select(&top, &p)?;
        platforms.push(platform_info(name, source, &selected, None)?);
    }
    platforms.sort_by(|a, b| a.platform.cmp(&b.platform));
    Ok(ImageInfo {
        name: name.to_string(),
        digest: top.digest,
        platforms,
    })
}

fn platform_info(
    name: &str,
    source: &Source,
    image: &SelectedImage,
    index: Option<&Index>,
) -> Result<PlatformInfo, DiffError> {
    let platform = Platform {
        os: image.config.os.clone(),
        architecture: image.config.architecture.clone(),
        variant: image.config.variant.clone(),
    };
    // Versions as the manifest says them; the index's when it says none.
    let mut versions = versions_of(&image.manifest.annotations);
    if versions.is_empty() {
        if let Some(i) = index {
            versions = versions_of(&i.annotations);
        }
    }
    let history: Vec<Option<&str>> = image
        .config
        .history
        .iter()
        .filter(|h| !h.empty_layer)
        .map(|h| h.created_by.as_deref())
        .collect();
    let layers = image
        .layers
        .iter()
        .enumerate()
        .map(|(i, (d, _, _))| LayerInfo {
            name: layer_name(history.get(i).copied().flatten(), i),
            digest: d.digest,
            size: d.size,
        })
        .collect();
    Ok(PlatformInfo {
        platform,
        manifest: image.manifest_digest(),
        versions,
        layers,
        packages: sbom_packages(name, source, image.manifest_digest())?,
    })
}

fn versions_of(annotations: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    annotations
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(VERSION_ANNOTATION)?.to_string(), v.clone())))
        .collect()
}

/// The packages of `manifest`'s `.sbom` attachment, if the image has one.
fn sbom_packages(
    name: &str,
    source: &Source,
    manifest: Digest,
) -> Result<Option<Packages>, DiffError> {
    let layout = match source {
        Source::Layout { layout, .. } | Source::Archive { layout, .. } => layout,
        Source::Registry { .. } => unreachable!("registry images are staged into a layout"),
    };
    let tag = manifest.attachment_tag("sbom");
    let index = layout.index().map_err(|error| DiffError::Layout {
        image: name.to_string(),
        error,
    })?;
    let Some(entry) = index
        .manifests
        .iter()
        .find(|e| e.annotations.get(ANNOTATION_REF_NAME) == Some(&tag))
    else {
        return Ok(None);
    };
    let bad = |digest: Digest, reason: String| DiffError::Document {
        image: name.to_string(),
        what: format!("sbom {tag}"),
        digest,
        reason,
    };
    let artifact: Manifest = source.read_json(entry)?;
    if artifact.subject.as_ref().map(|s| s.digest) != Some(manifest) {
        return Err(bad(
            entry.digest,
            format!("its subject is not the manifest {manifest}"),
        ));
    }
    let doc = artifact
        .layers
        .iter()
        .find(|l| l.media_type == MEDIA_TYPE_SPDX_JSON)
        .ok_or_else(|| bad(entry.digest, format!("no {MEDIA_TYPE_SPDX_JSON} layer")))?;
    let bytes = source.read_blob(doc, MAX_SBOM_BYTES)?;
    let spdx: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| bad(doc.digest, format!("not JSON: {e}")))?;
    let packages = spdx["packages"]
        .as_array()
        .ok_or_else(|| bad(doc.digest, "no \"packages\" array".into()))?;
    let mut listed: Vec<(String, String, String, String)> = Vec::new();
    for p in packages {
        // The image itself is the document's root package, not an input.
        if p["SPDXID"] == "SPDXRef-Image" {
            continue;
        }
        let field = |k: &str| p[k].as_str().unwrap_or_default().to_string();
        let sha = p["checksums"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["algorithm"] == "SHA256"))
            .and_then(|c| c["checksumValue"].as_str())
            .unwrap_or_default()
            .to_string();
        let purl = p["externalRefs"]
            .as_array()
            .and_then(|r| r.iter().find(|r| r["referenceType"] == "purl"))
            .and_then(|r| r["referenceLocator"].as_str())
            .unwrap_or_default()
            .to_string();
        let name = field("name");
        if name.is_empty() {
            return Err(bad(doc.digest, "a package without a name".into()));
        }
        listed.push((name, field("versionInfo"), sha, purl));
    }
    // A name listed twice (one package for two architectures) is told
    // apart by its purl.
    let mut out = BTreeMap::new();
    for (name, version, sha, purl) in &listed {
        let twice = listed.iter().filter(|l| &l.0 == name).count() > 1;
        let key = if twice && !purl.is_empty() {
            format!("{name} ({purl})")
        } else {
            name.clone()
        };
        out.insert(key, (version.clone(), sha.clone()));
    }
    Ok(Some(out))
}

/// An image as the diff names it.
#[derive(Clone, Debug, Serialize)]
pub struct ImageId {
    pub image: String,
    pub digest: Digest,
}

/// What changes from `old` to `new`.
#[derive(Clone, Debug, Serialize)]
pub struct Diff {
    pub old: ImageId,
    pub new: ImageId,
    /// Both resolve to the same digest.
    pub identical: bool,
    pub platforms: Vec<PlatformDiff>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Unchanged,
    Changed,
    Added,
    Removed,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Unchanged => "unchanged",
            Status::Changed => "changed",
            Status::Added => "added",
            Status::Removed => "removed",
        })
    }
}

/// A named value that changed: a component version or a package.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Change {
    pub name: String,
    pub change: Status,
    pub old: Option<String>,
    pub new: Option<String>,
    /// Set when the version stayed but the content did not (a package
    /// rebuilt under the same version).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// One layer position of the comparison.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LayerChange {
    pub name: String,
    pub change: Status,
    pub old: Option<LayerInfo>,
    pub new: Option<LayerInfo>,
}

/// Packages from the SBOMs, or why they could not be compared.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "sbom", rename_all = "kebab-case")]
pub enum PackageDiff {
    Compared {
        old_count: usize,
        new_count: usize,
        changes: Vec<Change>,
    },
    /// One side (or both) carries no `.sbom` attachment for this platform.
    Missing { missing_in: Vec<String> },
}

/// One platform of the comparison.
#[derive(Clone, Debug, Serialize)]
pub struct PlatformDiff {
    pub platform: String,
    pub change: Status,
    pub old_manifest: Option<Digest>,
    pub new_manifest: Option<Digest>,
    /// Component versions that differ (none when equal).
    pub components: Vec<Change>,
    /// Every layer of either side: the new image's in order, then the old
    /// image's layers that are gone.
    pub layers: Vec<LayerChange>,
    /// Compressed bytes of the new layers the old image lacks: what a host
    /// running the old image downloads.
    pub download_bytes: u64,
    pub old_bytes: u64,
    pub new_bytes: u64,
    pub packages: PackageDiff,
}

fn changes<'a>(
    old: impl IntoIterator<Item = (&'a String, &'a (String, String))>,
    new: impl IntoIterator<Item = (&'a String, &'a (String, String))>,
) -> Vec<Change> {
    let old: BTreeMap<&String, &(String, String)> = old.into_iter().collect();
    let new: BTreeMap<&String, &(String, String)> = new.into_iter().collect();
    let names: BTreeSet<&&String> = old.keys().chain(new.keys()).collect();
    let mut out = Vec::new();
    for name in names {
        let (a, b) = (old.get(*name), new.get(*name));
        let change = match (a, b) {
            (Some(a), Some(b)) if a == b => continue,
            (Some(_), Some(_)) => Status::Changed,
            (None, Some(_)) => Status::Added,
            (Some(_), None) => Status::Removed,
            (None, None) => continue,
        };
        let note = match (a, b) {
            (Some(a), Some(b)) if a.0 == b.0 => Some("same version, other sha256".to_string()),
            _ => None,
        };
        out.push(Change {
            name: (*name).clone(),
            change,
            old: a.map(|v| v.0.clone()),
            new: b.map(|v| v.0.clone()),
            note,
        });
    }
    out
}

fn compare_layers(old: &[LayerInfo], new: &[LayerInfo]) -> Vec<LayerChange> {
    let old_digests: BTreeSet<Digest> = old.iter().map(|l| l.digest).collect();
    let new_digests: BTreeSet<Digest> = new.iter().map(|l| l.digest).collect();
    // Old layers the new image lacks, by name: a new layer with the same
    // name replaces one of them ("changed"), the rest are "removed".
    let mut gone: Vec<&LayerInfo> = old
        .iter()
        .filter(|l| !new_digests.contains(&l.digest))
        .collect();
    let mut out = Vec::new();
    for l in new {
        if old_digests.contains(&l.digest) {
            let before = old.iter().find(|o| o.digest == l.digest).cloned();
            out.push(LayerChange {
                name: l.name.clone(),
                change: Status::Unchanged,
                old: before,
                new: Some(l.clone()),
            });
        } else if let Some(i) = gone.iter().position(|o| o.name == l.name) {
            let before = gone.remove(i);
            out.push(LayerChange {
                name: l.name.clone(),
                change: Status::Changed,
                old: Some(before.clone()),
                new: Some(l.clone()),
            });
        } else {
            out.push(LayerChange {
                name: l.name.clone(),
                change: Status::Added,
                old: None,
                new: Some(l.clone()),
            });
        }
    }
    out.extend(gone.into_iter().map(|o| LayerChange {
        name: o.name.clone(),
        change: Status::Removed,
        old: Some(o.clone()),
        new: None,
    }));
    out
}

fn compare_platform(
    name: String,
    old: Option<&PlatformInfo>,
    new: Option<&PlatformInfo>,
) -> PlatformDiff {
    let no_layers = Vec::new();
    let no_versions = BTreeMap::new();
    let old_layers = old.map_or(&no_layers, |p| &p.layers);
    let new_layers = new.map_or(&no_layers, |p| &p.layers);
    let layers = compare_layers(old_layers, new_layers);
    let old_digests: BTreeSet<Digest> = old_layers.iter().map(|l| l.digest).collect();
    let download_bytes = new_layers
        .iter()
        .filter(|l| !old_digests.contains(&l.digest))
        .map(|l| l.size)
        .sum();
    let pairs = |v: &BTreeMap<String, String>| -> BTreeMap<String, (String, String)> {
        v.iter()
            .map(|(k, v)| (k.clone(), (v.clone(), String::new())))
            .collect()
    };
    let old_versions = pairs(old.map_or(&no_versions, |p| &p.versions));
    let new_versions = pairs(new.map_or(&no_versions, |p| &p.versions));
    let components = changes(&old_versions, &new_versions);
    let empty = Some(BTreeMap::new());
    let old_packages = old.map_or(&empty, |p| &p.packages);
    let new_packages = new.map_or(&empty, |p| &p.packages);
    let packages = match (old_packages, new_packages) {
        (Some(a), Some(b)) => PackageDiff::Compared {
            old_count: a.len(),
            new_count: b.len(),
            changes: changes(a, b),
        },
        (a, b) => PackageDiff::Missing {
            missing_in: [("old", a.is_none()), ("new", b.is_none())]
                .into_iter()
                .filter(|(_, missing)| *missing)
                .map(|(side, _)| side.to_string())
                .collect(),
        },
    };
    let change = match (old, new) {
        (None, _) => Status::Added,
        (_, None) => Status::Removed,
        (Some(a), Some(b)) if a.manifest == b.manifest => Status::Unchanged,
        _ => Status::Changed,
    };
    PlatformDiff {
        platform: name,
        change,
        old_manifest: old.map(|p| p.manifest),
        new_manifest: new.map(|p| p.manifest),
        components,
        layers,
        download_bytes,
        old_bytes: old_layers.iter().map(|l| l.size).sum(),
        new_bytes: new_layers.iter().map(|l| l.size).sum(),
        packages,
    }
}

/// Compares two images, for every platform either has or only the given
/// ones (a platform neither has is an error).
pub fn compare(old: &ImageInfo, new: &ImageInfo, only: &[Platform]) -> Result<Diff, DiffError> {
    let mut names: Vec<Platform> = old
        .platforms
        .iter()
        .chain(&new.platforms)
        .map(|p| p.platform.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    for p in only {
        if !names.contains(p) {
            return Err(DiffError::NoSuchPlatform {
                platform: p.to_string(),
                old: old.name.clone(),
                new: new.name.clone(),
            });
        }
    }
    if !only.is_empty() {
        names.retain(|p| only.contains(p));
    }
    let platforms = names
        .iter()
        .map(|p| compare_platform(p.to_string(), find(old, p), find(new, p)))
        .collect();
    Ok(Diff {
        old: ImageId {
            image: old.name.clone(),
            digest: old.digest,
        },
        new: ImageId {
            image: new.name.clone(),
            digest: new.digest,
        },
        identical: old.digest == new.digest,
        platforms,
    })
}

fn find<'a>(image: &'a ImageInfo, p: &Platform) -> Option<&'a PlatformInfo> {
    image.platforms.iter().find(|x| &x.platform == p)
}

/// `1.7 kB`, `345.2 MB`: decimal units, as the activator's progress lines.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["kB", "MB", "GB", "TB"];
    if n < 1000 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1000.0;
    let mut unit = 0;
    while v >= 1000.0 && unit < UNITS.len() - 1 {
        v /= 1000.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// `sha256:` and the first 12 hex digits, for tables (JSON has them in full).
fn short(d: &Digest) -> String {
    let s = d.to_string();
    s[..s.len().min("sha256:".len() + 12)].to_string()
}

#[cfg(test)]
fn value(v: &Option<String>) -> &str {
    v.as_deref().unwrap_or("-")
}

/// The values of a change, without its name: `1.36.3 -> 1.36.4`,
/// `1.36.0 (added)`, `1.0 (removed)`.
impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.old, &self.new) {
            (Some(a), Some(b)) => write!(f, "{a} -> {b}")?,
            (None, Some(b)) => write!(f, "{b} (added)")?,
            (Some(a), None) => write!(f, "{a} (removed)")?,
            (None, None) => {}
        }
        if let Some(note) = &self.note {
            write!(f, " ({note})")?;
        }
        Ok(())
    }
}

impl fmt::Display for Diff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "old: {} ({})", self.old.image, self.old.digest)?;
        writeln!(f, "new: {} ({})", self.new.image, self.new.digest)?;
        if self.identical {
            write!(f, "identical: both are {}", self.new.digest)?;
            return Ok(());
        }
        for (i, p) in self.platforms.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{}", p)?;
        }
        Ok(())
    }
}

impl fmt::Display for PlatformDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let manifest = |d: &Option<Digest>| d.map_or("-".to_string(), |d| d.to_string());
        write!(f, "{}: {}", self.platform, self.change)?;
        match self.change {
            Status::Unchanged => {
                return write!(f, " (manifest {})", manifest(&self.new_manifest));
            }
            _ => writeln!(
                f,
                " (manifest {} -> {})",
                manifest(&self.old_manifest),
                manifest(&self.new_manifest)
            )?,
        }
        write!(f, "  components:")?;
        if self.components.is_empty() {
            writeln!(f, " unchanged")?;
        } else {
            writeln!(f)?;
            let w = self
                .components
                .iter()
                .map(|c| c.name.len())
                .max()
                .unwrap_or(0);
            for c in &self.components {
                writeln!(f, "    {:w$}  {c}", c.name)?;
            }
        }
        let count = |s: Status| self.layers.iter().filter(|l| l.change == s).count();
        writeln!(
            f,
            "  layers: {} changed, {} added, {} removed, {} unchanged; an update downloads {} ({} -> {} in all)",
            count(Status::Changed),
            count(Status::Added),
            count(Status::Removed),
            count(Status::Unchanged),
            human_bytes(self.download_bytes),
            human_bytes(self.old_bytes),
            human_bytes(self.new_bytes),
        )?;
        let w = self.layers.iter().map(|l| l.name.len()).max().unwrap_or(0);
        for l in self.layers.iter().filter(|l| l.change != Status::Unchanged) {
            let side = |x: &Option<LayerInfo>| {
                x.as_ref().map_or("-".to_string(), |x| {
                    format!("{} {}", short(&x.digest), human_bytes(x.size))
                })
            };
            writeln!(
                f,
                "    {:9} {:w$}  {} -> {}",
                l.change.to_string(),
                l.name,
                side(&l.old),
                side(&l.new)
            )?;
        }
        match &self.packages {
            PackageDiff::Missing { missing_in } => {
                write!(
                    f,
                    "  packages: not compared (no SBOM in {})",
                    missing_in.join(" and ")
                )
            }
            PackageDiff::Compared {
                old_count,
                new_count,
                changes,
            } => {
                let n = |s: Status| changes.iter().filter(|c| c.change == s).count();
                write!(
                    f,
                    "  packages (SBOM): {} changed, {} added, {} removed ({old_count} -> {new_count})",
                    n(Status::Changed),
                    n(Status::Added),
                    n(Status::Removed)
                )?;
                let w = changes.iter().map(|c| c.name.len()).max().unwrap_or(0);
                for c in changes {
                    write!(f, "\n    {:w$}  {c}", c.name)?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(name: &str, byte: u8, size: u64) -> LayerInfo {
        LayerInfo {
            name: name.into(),
            digest: Digest::of(&[byte]),
            size,
        }
    }

    #[test]
    fn layers_pair_by_name_and_count_the_download() {
        let old = [
            layer("base", 1, 100),
            layer("kubernetes", 2, 20),
            layer("gone", 3, 5),
        ];
        let new = [
            layer("base", 1, 100),
            layer("kubernetes", 4, 30),
            layer("extra", 5, 7),
        ];
        let got = compare_layers(&old, &new);
        let summary: Vec<(&str, Status)> =
            got.iter().map(|l| (l.name.as_str(), l.change)).collect();
        assert_eq!(
            summary,
            [
                ("base", Status::Unchanged),
                ("kubernetes", Status::Changed),
                ("extra", Status::Added),
                ("gone", Status::Removed)
            ]
        );
        let p = |layers: &[LayerInfo]| PlatformInfo {
            platform: Platform::linux("amd64"),
            manifest: Digest::of(&[layers.len() as u8, layers[1].digest.hex().as_bytes()[0]]),
            versions: BTreeMap::new(),
            layers: layers.to_vec(),
            packages: None,
        };
        let d = compare_platform("linux/amd64".into(), Some(&p(&old)), Some(&p(&new)));
        assert_eq!(d.download_bytes, 37);
        assert_eq!((d.old_bytes, d.new_bytes), (125, 137));
        assert_eq!(
            d.packages,
            PackageDiff::Missing {
                missing_in: vec!["old".into(), "new".into()]
            }
        );
    }

    #[test]
    fn package_changes_name_version_and_rebuilds() {
        let v = |pairs: &[(&str, &str, &str)]| -> BTreeMap<String, (String, String)> {
            pairs
                .iter()
                .map(|(n, v, s)| (n.to_string(), (v.to_string(), s.to_string())))
                .collect()
        };
        let old = v(&[
            ("libc6", "2.36-9", "a"),
            ("gone", "1", "b"),
            ("same", "1", "c"),
            ("rebuilt", "1", "d"),
        ]);
        let new = v(&[
            ("libc6", "2.36-10", "e"),
            ("new", "2", "f"),
            ("same", "1", "c"),
            ("rebuilt", "1", "g"),
        ]);
        let got = changes(&old, &new);
        let view: Vec<(&str, Status, &str, &str, bool)> = got
            .iter()
            .map(|c| {
                (
                    c.name.as_str(),
                    c.change,
                    value(&c.old),
                    value(&c.new),
                    c.note.is_some(),
                )
            })
            .collect();
        assert_eq!(
            view,
            [
                ("gone", Status::Removed, "1", "-", false),
                ("libc6", Status::Changed, "2.36-9", "2.36-10", false),
                ("new", Status::Added, "-", "2", false),
                ("rebuilt", Status::Changed, "1", "1", true),
            ]
        );
    }

    #[test]
    fn layer_names_come_from_the_builders_history() {
        assert_eq!(
            layer_name(Some("kubeslot-builder: layer kubernetes"), 2),
            "kubernetes"
        );
        assert_eq!(
            layer_name(Some("kubeslot-builder: base rootfs x.tar"), 0),
            "base"
        );
        assert_eq!(
            layer_name(
                Some("kubeslot-builder: debian bookworm base, 136 locked packages"),
                0
            ),
            "base"
        );
        assert_eq!(layer_name(Some("kubeslot-builder: sbom"), 4), "sbom");
        assert_eq!(layer_name(Some("/bin/sh -c apt-get install"), 3), "#3");
        assert_eq!(layer_name(None, 1), "#1");
    }

    #[test]
    fn sizes_read_like_the_progress_lines() {
        assert_eq!(human_bytes(999), "999 B");
        assert_eq!(human_bytes(1_700), "1.7 kB");
        assert_eq!(human_bytes(345_200_000), "345.2 MB");
    }
}
