//! Moving whole images between registries, OCI layouts and `oci-archive`
//! files, with their `.sig` and `.sbom` attachments, byte for byte.
//!
//! Every transfer stages the image in a local layout first (the source
//! layout itself, an extracted archive, or blobs pulled from a registry with
//! their digests checked), walks it from the root (index → platform
//! manifests → configs and layers), then delivers it: to a registry (blobs
//! the registry lacks, then manifests children first, the root under its tag,
//! then the attachment tags), to a layout (blobs copied through a digest
//! check, `index.json` updated last), or to an archive (a layout in a temp
//! dir, tarred, renamed into place). Attachments are found the cosign way:
//! the tag `sha256-<hex>.sig` / `.sbom` of every manifest in the image, which
//! in layouts is an `index.json` entry's `org.opencontainers.image.ref.name`;
//! and the referrers (Sigstore bundles, …) the OCI way, through the
//! referrers fallback tag `sha256-<hex>` (an index of referrer manifests,
//! carried whole: the index, each manifest, their blobs).
//!
//! It deliberately never parses and re-serialises a manifest it carries (the
//! digests would change) and never retries on its own: running the same
//! transfer again resumes, since existing blobs are skipped.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use kubeslot_image::layout::{BlobDir, Layout, LayoutError, MAX_DOCUMENT_BYTES};
use kubeslot_image::oci::{
    Descriptor, Index, Manifest, ANNOTATION_REF_NAME, MEDIA_TYPE_DOCKER_LIST, MEDIA_TYPE_INDEX,
    MEDIA_TYPE_SIMPLE_SIGNING,
};
use kubeslot_image::signature::{self, SignatureError, TrustedKeys, MAX_PAYLOAD_BYTES};
use kubeslot_image::{Digest, ImageRef, ImageSource};
use serde::Serialize;

use crate::progress::Progress;
use crate::registry::{RegistryError, RegistryOptions, Remote};
use crate::sign::Artifact;

/// The attachment kinds carried along with an image.
pub const ATTACHMENT_KINDS: &[&str] = &["sig", "sbom", "release"];

/// Why a transfer failed; every variant names the image, path or digest.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("{source_name}: {reason}")]
    Source { source_name: String, reason: String },
    #[error("{manifest} in {source_name}: {reason}")]
    Manifest {
        source_name: String,
        manifest: Digest,
        reason: String,
    },
    #[error("archive {path}: {reason}")]
    Archive { path: PathBuf, reason: String },
    #[error(transparent)]
    ReadArchive(#[from] kubeslot_image::archive::ArchiveError),
    #[error(transparent)]
    WriteArchive(#[from] crate::output::OutputError),
    #[error("{destination}: after pushing, tag {tag} resolves to {actual}, not {expected}")]
    Readback {
        destination: String,
        tag: String,
        expected: Digest,
        actual: String,
    },
    #[error("{destination}: {error}")]
    Signature {
        destination: String,
        error: SignatureError,
    },
}

fn is_index(media_type: &str) -> bool {
    media_type == MEDIA_TYPE_INDEX || media_type == MEDIA_TYPE_DOCKER_LIST
}

/// An image staged in a local layout: where its blobs are and which entry is
/// the root.
pub struct Staged {
    layout: Layout,
    root: Descriptor,
    tag: Option<String>,
    name: String,
    _tmp: Option<tempfile::TempDir>,
}

/// The closure of an image in a layout.
#[derive(Debug, Default)]
pub struct Graph {
    /// Every manifest and index, children before parents, the root last.
    pub manifests: Vec<Descriptor>,
    /// Configs and layers, each once.
    pub blobs: Vec<Descriptor>,
}

impl Graph {
    /// The digests that get signed: the root and every manifest below it.
    pub fn manifest_digests(&self) -> Vec<Digest> {
        self.manifests.iter().map(|d| d.digest).collect()
    }
}

/// An attachment found in a layout: its tag and manifest descriptor (an
/// index for referrers), the manifests below it (children first) and every
/// blob.
#[derive(Clone, Debug)]
pub struct Attachment {
    pub tag: String,
    pub manifest: Descriptor,
    pub children: Vec<Descriptor>,
    pub blobs: Vec<Descriptor>,
}

/// The tags attached to `digest`: `.sig`, `.sbom`, and the referrers
/// fallback tag.
fn attachment_tags(digest: &Digest) -> Vec<String> {
    let mut tags: Vec<String> = ATTACHMENT_KINDS
        .iter()
        .map(|k| digest.attachment_tag(k))
        .collect();
    tags.push(digest.referrers_tag());
    tags
}

/// What a transfer did, for humans (`Display`) and pipelines (`--json`).
#[derive(Debug, Default, Serialize)]
pub struct TransferReport {
    pub destination: String,
    pub digest: Option<Digest>,
    pub manifests: usize,
    pub blobs_sent: Vec<Digest>,
    pub blobs_skipped: Vec<Digest>,
    pub bytes_sent: u64,
    pub attachments: Vec<String>,
    /// Digests whose signature was re-read at the destination and verified.
    pub verified: Vec<Digest>,
}

impl std::fmt::Display for TransferReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let digest = self.digest.map(|d| d.to_string()).unwrap_or_default();
        writeln!(f, "{}@{digest}", self.destination)?;
        write!(
            f,
            "  {} manifest(s), {} blob(s) sent ({} bytes), {} already present, {} attachment(s)",
            self.manifests,
            self.blobs_sent.len(),
            self.bytes_sent,
            self.blobs_skipped.len(),
            self.attachments.len()
        )?;
        if !self.verified.is_empty() {
            write!(
                f,
                ", signature verified for {} digest(s)",
                self.verified.len()
            )?;
        }
        Ok(())
    }
}

impl Staged {
    /// Opens an image source (`oci:DIR[:TAG]`, `oci-archive:FILE[:TAG]`, or a
    /// registry reference) as a staged image.
    pub async fn open(src: &ImageSource, opts: &RegistryOptions) -> Result<Staged, TransferError> {
        match src {
            ImageSource::Layout { dir, tag } => {
                let layout = Layout::open(dir)?;
                Self::from_layout(layout, tag.clone(), src.to_string(), None)
            }
            ImageSource::Archive { file, tag } => {
                let tmp = tempfile::tempdir().map_err(|e| TransferError::Archive {
                    path: file.clone(),
                    reason: format!("cannot create a temp dir: {e}"),
                })?;
                // kubeslot-image's reader: the same checks a host runs.
                let layout = kubeslot_image::archive::extract(file, tmp.path())?;
                Self::from_layout(layout, tag.clone(), src.to_string(), Some(tmp))
            }
            ImageSource::Registry(image) => {
                let remote = Remote::connect(image, opts, false).await?;
                Self::from_registry(&remote, image).await
            }
        }
    }

    fn from_layout(
        layout: Layout,
        tag: Option<String>,
        name: String,
        tmp: Option<tempfile::TempDir>,
    ) -> Result<Staged, TransferError> {
        let index = layout.index()?;
        let root = select_root(&index, tag.as_deref()).map_err(|reason| TransferError::Source {
            source_name: name.clone(),
            reason,
        })?;
        let tag = tag.or_else(|| root.annotations.get(ANNOTATION_REF_NAME).cloned());
        Ok(Staged {
            layout,
            root: plain(&root),
            tag,
            name,
            _tmp: tmp,
        })
    }

    async fn from_registry(remote: &Remote, image: &ImageRef) -> Result<Staged, TransferError> {
        let tmp = tempfile::tempdir().map_err(|e| TransferError::Source {
            source_name: image.to_string(),
            reason: format!("cannot create a temp dir: {e}"),
        })?;
        let layout = Layout::create(tmp.path())?;
        let reference = image.reference();
        let root = fetch_image(remote, &reference, &layout, true).await?;
        let staged = Staged {
            layout,
            root: root.clone(),
            tag: if image.digest.is_some() {
                None
            } else {
                image.tag.clone()
            },
            name: image.to_string(),
            _tmp: Some(tmp),
        };
        // Attachments of every manifest in the image, where the registry has them.
        let graph = staged.graph()?;
        let mut entries = vec![staged.root_entry()];
        for digest in graph.manifest_digests() {
            for tag in attachment_tags(&digest) {
                if let Some(mut d) = fetch_attachment(remote, &tag, &staged.layout).await? {
                    d.annotations.insert(ANNOTATION_REF_NAME.into(), tag);
                    entries.push(d);
                }
            }
        }
        staged.layout.write_index(&Index::new(entries))?;
        Ok(staged)
    }

    fn root_entry(&self) -> Descriptor {
        let mut d = self.root.clone();
        if let Some(t) = &self.tag {
            d.annotations.insert(ANNOTATION_REF_NAME.into(), t.clone());
        }
        d
    }

    /// Walks the image from its root.
    pub fn graph(&self) -> Result<Graph, TransferError> {
        let mut g = Graph::default();
        let mut seen = BTreeSet::new();
        walk(&self.layout, &self.root, &self.name, &mut g, &mut seen)?;
        Ok(g)
    }

    /// The `.sig`/`.sbom` attachments of the image's manifests present in the
    /// layout.
    pub fn attachments(&self, graph: &Graph) -> Result<Vec<Attachment>, TransferError> {
        let index = self.layout.index()?;
        let mut out = Vec::new();
        for digest in graph.manifest_digests() {
            for tag in attachment_tags(&digest) {
                let Some(entry) = index
                    .manifests
                    .iter()
                    .find(|e| e.annotations.get(ANNOTATION_REF_NAME) == Some(&tag))
                else {
                    continue;
                };
                let mut g = Graph::default();
                walk(
                    &self.layout,
                    &plain(entry),
                    &self.name,
                    &mut g,
                    &mut BTreeSet::new(),
                )?;
                let manifest = g.manifests.pop().expect("the walk records its root");
                out.push(Attachment {
                    tag,
                    manifest,
                    children: g.manifests,
                    blobs: g.blobs,
                });
            }
        }
        Ok(out)
    }

    fn read(&self, d: &Descriptor) -> Result<Vec<u8>, TransferError> {
        Ok(self
            .layout
            .blobs()
            .read_verified(&d.digest, Some(d.size), MAX_DOCUMENT_BYTES)?)
    }

    /// Delivers the image and its attachments to `dst`. `tag` overrides the
    /// destination tag (else the destination's own, else the source's).
    pub async fn deliver(
        &self,
        dst: &ImageSource,
        opts: &RegistryOptions,
        verify_keys: Option<&TrustedKeys>,
        progress: &Progress,
    ) -> Result<TransferReport, TransferError> {
        match dst {
            ImageSource::Registry(image) => {
                let remote = Remote::connect(image, opts, true).await?;
                self.push(&remote, image, verify_keys, progress).await
            }
            ImageSource::Layout { dir, tag } => {
                let tag = tag.clone().or_else(|| self.tag.clone());
                let mut report = self.write_layout(dir, tag.as_deref())?;
                report.destination = dst.to_string();
                if let Some(keys) = verify_keys {
                    let layout = Layout::open(dir)?;
                    report.verified =
                        verify_layout(&layout, &self.graph()?.manifest_digests(), keys).map_err(
                            |source| TransferError::Signature {
                                destination: dst.to_string(),
                                error: source,
                            },
                        )?;
                }
                Ok(report)
            }
            ImageSource::Archive { file, tag } => {
                let tag = tag.clone().or_else(|| self.tag.clone());
                let dir = file.parent().filter(|p| !p.as_os_str().is_empty());
                let tmp = tempfile::Builder::new()
                    .prefix(".kubeslot-archive-")
                    .tempdir_in(dir.unwrap_or(Path::new(".")))
                    .map_err(|e| TransferError::Archive {
                        path: file.clone(),
                        reason: format!("cannot create a temp dir beside it: {e}"),
                    })?;
                let mut report = self.write_layout(tmp.path(), tag.as_deref())?;
                if let Some(keys) = verify_keys {
                    let layout = Layout::open(tmp.path())?;
                    report.verified =
                        verify_layout(&layout, &self.graph()?.manifest_digests(), keys).map_err(
                            |source| TransferError::Signature {
                                destination: dst.to_string(),
                                error: source,
                            },
                        )?;
                }
                crate::output::write_archive(tmp.path(), file)?;
                report.destination = dst.to_string();
                Ok(report)
            }
        }
    }

    /// Pushes to a registry: blobs it lacks, manifests children first, the
    /// root under the tag, the attachments; then reads the tag back and,
    /// given keys, verifies every signature there.
    pub async fn push(
        &self,
        remote: &Remote,
        image: &ImageRef,
        verify_keys: Option<&TrustedKeys>,
        progress: &Progress,
    ) -> Result<TransferReport, TransferError> {
        let graph = self.graph()?;
        let attachments = self.attachments(&graph)?;
        let mut report = TransferReport {
            destination: image.name(),
            digest: Some(self.root.digest),
            manifests: graph.manifests.len(),
            ..Default::default()
        };
        let mut blobs: Vec<&Descriptor> = graph.blobs.iter().collect();
        blobs.extend(attachments.iter().flat_map(|a| a.blobs.iter()));
        let mut done = BTreeSet::new();
        for blob in blobs {
            if !done.insert(blob.digest) {
                continue;
            }
            if remote.has_blob(&blob.digest).await? {
                report.blobs_skipped.push(blob.digest);
                continue;
            }
            let path = self.layout.blobs().path(&blob.digest);
            let mut task = progress.task(
                "upload",
                &format!("{} {}", remote.name(), blob.digest),
                Some(blob.size),
            );
            remote
                .push_blob_file(&blob.digest, blob.size, &path)
                .await?;
            task.inc(blob.size);
            task.finish("sent");
            report.blobs_sent.push(blob.digest);
            report.bytes_sent += blob.size;
        }
        for m in &graph.manifests[..graph.manifests.len() - 1] {
            let bytes = self.read(m)?;
            remote
                .push_manifest(&m.digest.to_string(), &bytes, &m.media_type)
                .await?;
        }
        // A reference pinned by digest pushes by digest; otherwise by its tag
        // (`latest` when none was written, as every registry client does).
        let root_ref = match (&image.digest, &image.tag) {
            (None, Some(tag)) => tag.clone(),
            _ => self.root.digest.to_string(),
        };
        let root_bytes = self.read(&self.root)?;
        remote
            .push_manifest(&root_ref, &root_bytes, &self.root.media_type)
            .await?;
        for a in &attachments {
            for c in &a.children {
                let bytes = self.read(c)?;
                remote
                    .push_manifest(&c.digest.to_string(), &bytes, &c.media_type)
                    .await?;
            }
            let bytes = self.read(&a.manifest)?;
            remote
                .push_manifest(&a.tag, &bytes, &a.manifest.media_type)
                .await?;
            report.attachments.push(a.tag.clone());
        }
        // Read back what a puller will see under the tag.
        let back = remote.pull_manifest(&root_ref).await?;
        let actual = back.as_ref().map(|m| m.digest);
        if actual != Some(self.root.digest) {
            return Err(TransferError::Readback {
                destination: image.name(),
                tag: root_ref,
                expected: self.root.digest,
                actual: actual.map_or("nothing".into(), |d| d.to_string()),
            });
        }
        if let Some(keys) = verify_keys {
            // The root first: its error names the image the user asked for.
            for d in graph.manifest_digests().into_iter().rev() {
                verify_remote(remote, d, keys).await?;
                report.verified.push(d);
            }
        }
        Ok(report)
    }

    /// Writes the image and its attachments into the layout at `dir`
    /// (created if needed), keeping its other entries; `index.json` last.
    pub fn write_layout(
        &self,
        dir: &Path,
        tag: Option<&str>,
    ) -> Result<TransferReport, TransferError> {
        let graph = self.graph()?;
        let attachments = self.attachments(&graph)?;
        let dest = Layout::create(dir)?;
        let mut report = TransferReport {
            destination: format!("oci:{}", dir.display()),
            digest: Some(self.root.digest),
            manifests: graph.manifests.len(),
            ..Default::default()
        };
        let mut all: Vec<&Descriptor> = graph.manifests.iter().chain(&graph.blobs).collect();
        for a in &attachments {
            all.push(&a.manifest);
            all.extend(a.children.iter());
            all.extend(a.blobs.iter());
        }
        let mut done = BTreeSet::new();
        for d in all {
            if !done.insert(d.digest) {
                continue;
            }
            if dest.blobs().contains(&d.digest) {
                report.blobs_skipped.push(d.digest);
                continue;
            }
            copy_blob(self.layout.blobs(), dest.blobs(), d)?;
            report.blobs_sent.push(d.digest);
            report.bytes_sent += d.size;
        }
        let mut root = self.root.clone();
        if let Some(t) = tag {
            root.annotations
                .insert(ANNOTATION_REF_NAME.into(), t.into());
        }
        let mut entries = vec![root];
        for a in &attachments {
            let mut d = a.manifest.clone();
            d.annotations
                .insert(ANNOTATION_REF_NAME.into(), a.tag.clone());
            entries.push(d);
            report.attachments.push(a.tag.clone());
        }
        dest.upsert_index(entries)?;
        Ok(report)
    }
}

/// A descriptor without the layout-only annotations and platform.
fn plain(d: &Descriptor) -> Descriptor {
    Descriptor::new(&d.media_type, d.digest, d.size)
}

/// Stores an artifact (its blobs, then its manifest, then its tag) in a
/// layout.
pub fn add_artifact_to_layout(layout: &Layout, artifact: &Artifact) -> Result<(), LayoutError> {
    for b in &artifact.blobs {
        layout.blobs().put_bytes(b)?;
    }
    let digest = layout.blobs().put_bytes(&artifact.manifest)?;
    let mut d = Descriptor::new(&artifact.media_type, digest, artifact.manifest.len() as u64);
    d.annotations
        .insert(ANNOTATION_REF_NAME.into(), artifact.tag.clone());
    layout.upsert_index([d])
}

/// Stores an artifact in a registry: blobs it lacks, then the manifest
/// under the artifact's tag.
pub async fn add_artifact_to_registry(
    remote: &Remote,
    artifact: &Artifact,
) -> Result<Digest, RegistryError> {
    for b in &artifact.blobs {
        if !remote.has_blob(&Digest::of(b)).await? {
            remote.push_blob_bytes(b).await?;
        }
    }
    remote
        .push_manifest(&artifact.tag, &artifact.manifest, &artifact.media_type)
        .await
}

fn copy_blob(from: &BlobDir, to: &BlobDir, d: &Descriptor) -> Result<(), LayoutError> {
    let f = from.open_blob(&d.digest)?;
    to.put_verified(&d.digest, Some(d.size), f)?;
    Ok(())
}

/// The entry `tag` names, or the only entry that is not an attachment.
pub fn select_root(index: &Index, tag: Option<&str>) -> Result<Descriptor, String> {
    if let Some(tag) = tag {
        return index
            .manifests
            .iter()
            .find(|e| e.annotations.get(ANNOTATION_REF_NAME).map(String::as_str) == Some(tag))
            .cloned()
            .ok_or_else(|| format!("no index.json entry is tagged {tag:?}"));
    }
    let images: Vec<&Descriptor> = index
        .manifests
        .iter()
        .filter(|e| {
            !e.annotations
                .get(ANNOTATION_REF_NAME)
                .is_some_and(|t| is_attachment_tag(t))
        })
        .collect();
    match images.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err("index.json names no image".into()),
        many => Err(format!(
            "index.json names {} images; say which with :TAG ({})",
            many.len(),
            many.iter()
                .filter_map(|e| e.annotations.get(ANNOTATION_REF_NAME).cloned())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// `sha256-<64 hex>.<kind>` for a kind this tool carries (`.sig`, `.sbom`),
/// or the referrers fallback tag `sha256-<64 hex>`.
pub fn is_attachment_tag(tag: &str) -> bool {
    Digest::parse_attachment_tag(tag).is_some_and(|(_, kind)| ATTACHMENT_KINDS.contains(&kind))
        || Digest::parse_referrers_tag(tag).is_some()
}

fn walk(
    layout: &Layout,
    d: &Descriptor,
    name: &str,
    g: &mut Graph,
    seen: &mut BTreeSet<Digest>,
) -> Result<(), TransferError> {
    if !seen.insert(d.digest) {
        return Ok(());
    }
    let bad = |reason: String| TransferError::Manifest {
        source_name: name.to_string(),
        manifest: d.digest,
        reason,
    };
    let bytes = layout
        .blobs()
        .read_verified(&d.digest, Some(d.size), MAX_DOCUMENT_BYTES)?;
    if is_index(&d.media_type) {
        let index: Index =
            serde_json::from_slice(&bytes).map_err(|e| bad(format!("not an index: {e}")))?;
        for child in &index.manifests {
            walk(layout, &plain(child), name, g, seen)?;
        }
    } else {
        let m: Manifest =
            serde_json::from_slice(&bytes).map_err(|e| bad(format!("not a manifest: {e}")))?;
        for b in std::iter::once(&m.config).chain(&m.layers) {
            if !b.urls.is_empty() {
                return Err(bad(format!(
                    "blob {} is a foreign layer (urls): refused",
                    b.digest
                )));
            }
            if !g.blobs.iter().any(|x| x.digest == b.digest) {
                g.blobs.push(plain(b));
            }
        }
    }
    g.manifests.push(d.clone());
    Ok(())
}

/// The digests of `root` and every manifest below it in `layout`, children
/// first (what `sign` signs).
pub fn manifest_digests(
    layout: &Layout,
    root: &Descriptor,
    name: &str,
) -> Result<Vec<Digest>, TransferError> {
    let mut g = Graph::default();
    walk(layout, &plain(root), name, &mut g, &mut BTreeSet::new())?;
    Ok(g.manifest_digests())
}

/// Pulls a manifest (and, recursively, everything below it) into `layout`.
/// `with_blobs` false fetches manifests only (enough to sign).
pub async fn fetch_image(
    remote: &Remote,
    reference: &str,
    layout: &Layout,
    with_blobs: bool,
) -> Result<Descriptor, TransferError> {
    let raw = remote
        .pull_manifest(reference)
        .await?
        .ok_or_else(|| TransferError::Source {
            source_name: format!("{}:{reference}", remote.name()),
            reason: "the registry has no such manifest".into(),
        })?;
    let root = Descriptor::new(&raw.media_type, raw.digest, raw.bytes.len() as u64);
    let mut stack = vec![(root.clone(), raw.bytes)];
    while let Some((d, bytes)) = stack.pop() {
        layout.blobs().put_bytes(&bytes)?;
        let bad = |reason: String| TransferError::Manifest {
            source_name: remote.name(),
            manifest: d.digest,
            reason,
        };
        if is_index(&d.media_type) {
            let index: Index =
                serde_json::from_slice(&bytes).map_err(|e| bad(format!("not an index: {e}")))?;
            for child in &index.manifests {
                let raw = remote
                    .pull_manifest(&child.digest.to_string())
                    .await?
                    .ok_or_else(|| {
                        bad(format!("names {} which the registry lacks", child.digest))
                    })?;
                let cd = Descriptor::new(&child.media_type, raw.digest, raw.bytes.len() as u64);
                stack.push((cd, raw.bytes));
            }
        } else if with_blobs {
            let m: Manifest =
                serde_json::from_slice(&bytes).map_err(|e| bad(format!("not a manifest: {e}")))?;
            for b in std::iter::once(&m.config).chain(&m.layers) {
                remote.pull_blob(&b.digest, b.size, layout.blobs()).await?;
            }
        }
    }
    Ok(root)
}

/// Pulls an attachment manifest and its blobs if the registry has the tag.
async fn fetch_attachment(
    remote: &Remote,
    tag: &str,
    layout: &Layout,
) -> Result<Option<Descriptor>, TransferError> {
    if remote.pull_manifest(tag).await?.is_none() {
        return Ok(None);
    }
    fetch_image(remote, tag, layout, true).await.map(Some)
}

/// Verifies the `.sig` of `digest` in a layout with the one verifier.
pub fn verify_layout(
    layout: &Layout,
    digests: &[Digest],
    keys: &TrustedKeys,
) -> Result<Vec<Digest>, SignatureError> {
    let index = layout.index().map_err(|e| SignatureError::Key {
        path: layout.dir().join("index.json"),
        reason: e.to_string(),
    })?;
    // The root (last) first: its error names the image the user asked for.
    for &digest in digests.iter().rev() {
        let tag = digest.attachment_tag("sig");
        let sig = index
            .manifests
            .iter()
            .find(|e| e.annotations.get(ANNOTATION_REF_NAME) == Some(&tag));
        let manifest: Manifest = match sig.map(|e| layout.read_json(&e.digest, Some(e.size))) {
            Some(Ok(m)) => m,
            Some(Err(e)) => {
                return Err(SignatureError::Malformed {
                    digest,
                    layer: sig.map(|e| e.digest).unwrap_or(digest),
                    reason: e.to_string(),
                })
            }
            None => return Err(SignatureError::Missing { digest }),
        };
        signature::verify(keys, digest, None, &manifest, |l| {
            layout
                .blobs()
                .read_verified(&l.digest, Some(l.size), MAX_PAYLOAD_BYTES)
                .map_err(std::io::Error::other)
        })?;
    }
    Ok(digests.to_vec())
}

/// Verifies the `.sig` of `digest` as a registry serves it now.
pub async fn verify_remote(
    remote: &Remote,
    digest: Digest,
    keys: &TrustedKeys,
) -> Result<(), TransferError> {
    let tag = digest.attachment_tag("sig");
    let sig_err = |source| TransferError::Signature {
        destination: remote.name(),
        error: source,
    };
    let Some(raw) = remote.pull_manifest(&tag).await? else {
        return Err(sig_err(SignatureError::Missing { digest }));
    };
    let manifest: Manifest =
        serde_json::from_slice(&raw.bytes).map_err(|e| TransferError::Manifest {
            source_name: format!("{}:{tag}", remote.name()),
            manifest: raw.digest,
            reason: format!("not a manifest: {e}"),
        })?;
    let tmp = tempfile::tempdir().map_err(|e| TransferError::Source {
        source_name: remote.name(),
        reason: format!("cannot create a temp dir: {e}"),
    })?;
    let blobs = BlobDir::create(tmp.path())?;
    for l in &manifest.layers {
        if l.media_type == MEDIA_TYPE_SIMPLE_SIGNING && l.size <= MAX_PAYLOAD_BYTES {
            remote.pull_blob(&l.digest, l.size, &blobs).await?;
        }
    }
    signature::verify(keys, digest, None, &manifest, |l| {
        blobs
            .read_verified(&l.digest, Some(l.size), MAX_PAYLOAD_BYTES)
            .map_err(std::io::Error::other)
    })
    .map_err(sig_err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attachment_tags() {
        let d = Digest::of(b"x");
        assert!(is_attachment_tag(&d.attachment_tag("sig")));
        assert!(is_attachment_tag(&d.attachment_tag("sbom")));
        assert!(!is_attachment_tag(&d.attachment_tag("att")));
        assert!(is_attachment_tag(&d.referrers_tag()));
        assert!(!is_attachment_tag("v1"));
    }
}
