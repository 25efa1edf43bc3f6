//! Image sources hosts (and the builder, for base images) read from: a
//! registry with ordered mirrors, an OCI layout directory, an `oci-archive`
//! file. One enum, no trait: the three differ only in where bytes come from.
//!
//! Given an [`ImageSource`] (from the config or the command line), the
//! per-registry settings and a scratch directory (for archive extraction), a
//! [`Source`] can: resolve the reference to its top-level descriptor (a tag
//! is resolved exactly once, later reads use the digest), read a document
//! (manifest, index, config) by descriptor with its size, digest and media
//! type checked and its size capped, open a blob stream (optionally from an
//! offset, to resume), find the cosign `.sig` artifact for a digest
//! (`sha256-<hex>.sig` tag in a registry; the `index.json` entry of that name
//! in a layout or archive) and the digest's referrers (the registry's
//! referrers API, else the fallback tag `sha256-<hex>`; in a layout or
//! archive the `index.json` entry of that name). [`Source::select`] picks the manifest for a
//! platform from an index and checks the manifest and config: known media
//! types only, no foreign `urls`, one `diff_id` per layer, the config's
//! platform matches. What a registry source read once (documents, the
//! config) it keeps for the run and serves again from memory, so a host
//! asks for each blob once.
//!
//! It does not verify signatures ([`crate::verify`]), check blob digests
//! (the content store does while streaming) or write outside its scratch dir.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::archive::{self, ArchiveError};
use crate::digest::Digest;
use crate::layout::{Layout, LayoutError, MAX_DOCUMENT_BYTES};
use crate::oci::{
    Compression, Descriptor, ImageConfig, Index, Manifest, Platform, ANNOTATION_REF_NAME,
    MEDIA_TYPE_CONFIG, MEDIA_TYPE_DOCKER_CONFIG, MEDIA_TYPE_DOCKER_LIST,
    MEDIA_TYPE_DOCKER_MANIFEST, MEDIA_TYPE_INDEX, MEDIA_TYPE_MANIFEST,
};
use crate::reference::{ImageRef, ImageSource};
use crate::registry::{self, Client, Document, ProxySettings, Registries, RegistryError};
use crate::retry::Pacing;

/// Why an image could not be read; every variant names the source.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{source_name}: {error}")]
    Registry {
        source_name: String,
        error: RegistryError,
    },
    #[error("{source_name}: {error}")]
    Layout {
        source_name: String,
        error: LayoutError,
    },
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    #[error("{source_name}: {path}: {error}")]
    Io {
        source_name: String,
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{source_name}: {reason}")]
    Tag { source_name: String, reason: String },
    #[error("{source_name}: {reason}")]
    Proxy { source_name: String, reason: String },
    #[error("{source_name}: {digest}: {reason}")]
    Document {
        source_name: String,
        digest: Digest,
        reason: String,
    },
    #[error("{source_name}: index {digest} has no manifest for {platform} (it has: {available})")]
    Platform {
        source_name: String,
        digest: Digest,
        platform: String,
        available: String,
    },
}

/// Where an image is read from.
pub enum Source {
    Registry {
        client: Client,
        image: ImageRef,
        /// Documents already fetched, by digest (the tag's target is kept so
        /// the tag is never asked for again).
        cache: Mutex<HashMap<Digest, Vec<u8>>>,
    },
    Layout {
        layout: Layout,
        tag: Option<String>,
        name: String,
    },
    Archive {
        layout: Layout,
        tag: Option<String>,
        name: String,
        /// The archive file and where each blob lies in it: blobs are
        /// copied into the layout only when read ([`archive::scan`]).
        file: PathBuf,
        members: archive::Members,
        /// The archive, opened once by the scan.
        archive: Arc<File>,
        /// The private extraction dir, removed on drop.
        _dir: tempfile::TempDir,
    },
}

/// An image whose platform manifest and config were read and checked.
#[derive(Clone, Debug)]
pub struct SelectedImage {
    /// What the reference resolved to (an index or a manifest).
    pub top: Descriptor,
    /// The platform manifest (equal to `top` for a single-platform image).
    pub manifest_descriptor: Descriptor,
    pub manifest: Manifest,
    pub config: ImageConfig,
    /// One entry per layer: (descriptor, compression, diff_id).
    pub layers: Vec<(Descriptor, Compression, Digest)>,
}

impl SelectedImage {
    /// The digest the image is known by (index digest for a multi-platform
    /// image).
    pub fn image_digest(&self) -> Digest {
        self.top.digest
    }

    pub fn manifest_digest(&self) -> Digest {
        self.manifest_descriptor.digest
    }

    /// Every blob the image needs: config, then layers.
    pub fn blobs(&self) -> Vec<Descriptor> {
        let mut v = vec![self.manifest.config.clone()];
        v.extend(self.layers.iter().map(|(d, _, _)| d.clone()));
        v
    }
}

fn is_manifest_type(mt: &str) -> bool {
    mt == MEDIA_TYPE_MANIFEST || mt == MEDIA_TYPE_DOCKER_MANIFEST
}

fn is_index_type(mt: &str) -> bool {
    mt == MEDIA_TYPE_INDEX || mt == MEDIA_TYPE_DOCKER_LIST
}

/// Whether an image for `image` runs on `host`: same OS and architecture;
/// a variant only has to agree when both name one (`Platform::host()` names
/// none, and arm64 entries often say `v8`).
fn runs_on(host: &Platform, image: &Platform) -> bool {
    host.os == image.os
        && host.architecture == image.architecture
        && (host.variant.is_none() || image.variant.is_none() || host.variant == image.variant)
}

impl Source {
    /// Opens `src`. Registry sources connect lazily; an archive is extracted
    /// into a private directory under `scratch` now.
    pub fn open(
        src: &ImageSource,
        registries: &Registries,
        scratch: &Path,
    ) -> Result<Source, SourceError> {
        Source::open_paced(src, registries, scratch, Arc::new(Pacing::default()))
    }

    /// [`Source::open`] with the caller's [`Pacing`]: its deadline and
    /// backoff apply to every registry request, and its counters tell the
    /// caller what was sent and waited.
    pub fn open_paced(
        src: &ImageSource,
        registries: &Registries,
        scratch: &Path,
        pacing: Arc<Pacing>,
    ) -> Result<Source, SourceError> {
        Source::open_proxied(src, registries, None, scratch, pacing)
    }

    /// [`Source::open_paced`] with the config's egress proxy (`None`: the
    /// environment's, as ureq reads it).
    pub fn open_proxied(
        src: &ImageSource,
        registries: &Registries,
        proxy: Option<&ProxySettings>,
        scratch: &Path,
        pacing: Arc<Pacing>,
    ) -> Result<Source, SourceError> {
        let name = src.to_string();
        match src {
            ImageSource::Registry(image) => {
                let mut client = Client::new(registries).with_pacing(pacing);
                if let Some(p) = proxy {
                    client = client.with_proxy(p).map_err(|reason| SourceError::Proxy {
                        source_name: name.clone(),
                        reason,
                    })?;
                }
                Ok(Source::Registry {
                    client,
                    image: image.clone(),
                    cache: Mutex::new(HashMap::new()),
                })
            }
            ImageSource::Layout { dir, tag } => Ok(Source::Layout {
                layout: Layout::open(dir).map_err(|error| SourceError::Layout {
                    source_name: name.clone(),
                    error,
                })?,
                tag: tag.clone(),
                name,
            }),
            ImageSource::Archive { file, tag } => {
                std::fs::create_dir_all(scratch).map_err(|error| SourceError::Io {
                    source_name: name.clone(),
                    path: scratch.to_path_buf(),
                    error,
                })?;
                let dir = tempfile::Builder::new()
                    .prefix(".archive-")
                    .tempdir_in(scratch)
                    .map_err(|error| SourceError::Io {
                        source_name: name.clone(),
                        path: scratch.to_path_buf(),
                        error,
                    })?;
                let (layout, members, archive) = archive::scan(file, dir.path())?;
                Ok(Source::Archive {
                    layout,
                    tag: tag.clone(),
                    name,
                    file: file.clone(),
                    members,
                    archive,
                    _dir: dir,
                })
            }
        }
    }

    /// The source as the user wrote it (for messages and reports).
    pub fn name(&self) -> String {
        match self {
            Source::Registry { image, .. } => image.to_string(),
            Source::Layout { name, .. } | Source::Archive { name, .. } => name.clone(),
        }
    }

    /// The identity a signature payload names (`registry/repository`), when
    /// the source has one.
    pub fn identity(&self) -> Option<String> {
        match self {
            Source::Registry { image, .. } => Some(image.name()),
            _ => None,
        }
    }

    fn doc_err(&self, digest: Digest, reason: impl Into<String>) -> SourceError {
        SourceError::Document {
            source_name: self.name(),
            digest,
            reason: reason.into(),
        }
    }

    fn layout_err(&self, error: LayoutError) -> SourceError {
        SourceError::Layout {
            source_name: self.name(),
            error,
        }
    }

    fn registry_err(&self, error: RegistryError) -> SourceError {
        SourceError::Registry {
            source_name: self.name(),
            error,
        }
    }

    /// For an archive: copies blob `digest` out of the archive first (only
    /// what is read is ever written).
    fn ensure_local(&self, digest: &Digest) -> Result<(), SourceError> {
        if let Source::Archive {
            layout,
            file,
            members,
            archive,
            ..
        } = self
        {
            if let Some(at) = members.get(digest) {
                archive::extract_member(file, archive, layout.dir(), digest, *at)?;
            }
        }
        Ok(())
    }

    fn local(&self) -> Option<(&Layout, Option<&str>)> {
        match self {
            Source::Layout { layout, tag, .. } | Source::Archive { layout, tag, .. } => {
                Some((layout, tag.as_deref()))
            }
            Source::Registry { .. } => None,
        }
    }

    /// Resolves the reference to its top-level descriptor (index or
    /// manifest). For a registry tag this is the one request that names the
    /// tag; the document is kept and everything after uses its digest.
    /// Whether blobs come over the network (a short read may be resumed)
    /// rather than from a local layout or archive (read whole).
    pub fn is_registry(&self) -> bool {
        matches!(self, Source::Registry { .. })
    }

    pub fn resolve(&self) -> Result<Descriptor, SourceError> {
        match self {
            Source::Registry {
                client,
                image,
                cache,
            } => {
                let doc: Document = client
                    .manifest(image, &image.reference())
                    .map_err(|e| self.registry_err(e))?;
                let desc = Descriptor::new(&doc.media_type, doc.digest, doc.bytes.len() as u64);
                cache
                    .lock()
                    .expect("document cache")
                    .insert(doc.digest, doc.bytes);
                Ok(desc)
            }
            _ => {
                let (layout, tag) = self.local().expect("local source");
                let index = layout.index().map_err(|e| self.layout_err(e))?;
                self.find_in_index(&index, tag)
            }
        }
    }

    fn find_in_index(&self, index: &Index, tag: Option<&str>) -> Result<Descriptor, SourceError> {
        let ref_name = |d: &Descriptor| d.annotations.get(ANNOTATION_REF_NAME).cloned();
        let candidates: Vec<&Descriptor> = match tag {
            Some(t) => index
                .manifests
                .iter()
                .filter(|d| ref_name(d).as_deref() == Some(t))
                .collect(),
            None => index
                .manifests
                .iter()
                .filter(|d| {
                    ref_name(d).is_none_or(|n| {
                        Digest::parse_attachment_tag(&n).is_none()
                            && Digest::parse_referrers_tag(&n).is_none()
                    })
                })
                .collect(),
        };
        match candidates.as_slice() {
            [one] => {
                if !registry::MANIFEST_MEDIA_TYPES.contains(&one.media_type.as_str()) {
                    return Err(self.doc_err(
                        one.digest,
                        format!(
                            "media type {} is not a manifest or index type",
                            one.media_type
                        ),
                    ));
                }
                Ok((*one).clone())
            }
            [] => Err(SourceError::Tag {
                source_name: self.name(),
                reason: match tag {
                    Some(t) => format!("index.json has no entry named {t:?}"),
                    None => "index.json has no image entry".into(),
                },
            }),
            many => Err(SourceError::Tag {
                source_name: self.name(),
                reason: format!(
                    "index.json has {} image entries ({}); name one with :TAG",
                    many.len(),
                    many.iter()
                        .map(|d| ref_name(d).unwrap_or_else(|| d.digest.to_string()))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }),
        }
    }

    /// Reads a small blob (document or signature payload) of at most `limit`
    /// bytes, size and digest checked against `desc`.
    pub fn read_blob(&self, desc: &Descriptor, limit: u64) -> Result<Vec<u8>, SourceError> {
        if desc.size > limit {
            return Err(self.doc_err(
                desc.digest,
                format!("{} bytes exceeds the {limit}-byte limit", desc.size),
            ));
        }
        if !desc.urls.is_empty() {
            return Err(self.doc_err(desc.digest, "descriptors with foreign urls are refused"));
        }
        let bytes = match self {
            Source::Registry {
                client,
                image,
                cache,
            } => {
                if let Some(b) = cache.lock().expect("document cache").get(&desc.digest) {
                    b.clone()
                } else if registry::MANIFEST_MEDIA_TYPES.contains(&desc.media_type.as_str()) {
                    let doc = client
                        .manifest(image, &desc.digest.to_string())
                        .map_err(|e| self.registry_err(e))?;
                    doc.bytes
                } else {
                    let stream = client
                        .blob(image, &desc.digest, 0)
                        .map_err(|e| self.registry_err(e))?;
                    let mut bytes = Vec::new();
                    stream
                        .reader
                        .take(limit + 1)
                        .read_to_end(&mut bytes)
                        .map_err(|e| {
                            self.doc_err(
                                desc.digest,
                                format!("reading from {}: {e}", stream.endpoint),
                            )
                        })?;
                    bytes
                }
            }
            _ => {
                self.ensure_local(&desc.digest)?;
                let (layout, _) = self.local().expect("local source");
                layout
                    .blobs()
                    .read_verified(&desc.digest, Some(desc.size), limit)
                    .map_err(|e| self.layout_err(e))?
            }
        };
        if bytes.len() as u64 != desc.size {
            return Err(self.doc_err(
                desc.digest,
                format!("{} bytes, descriptor says {}", bytes.len(), desc.size),
            ));
        }
        let actual = Digest::of(&bytes);
        if actual != desc.digest {
            return Err(self.doc_err(desc.digest, format!("content hashes to {actual}")));
        }
        if let Source::Registry { cache, .. } = self {
            // The image config is read here to check it, then stored by the
            // content store: it is served from here, not asked for twice.
            cache
                .lock()
                .expect("document cache")
                .entry(desc.digest)
                .or_insert_with(|| bytes.clone());
        }
        Ok(bytes)
    }

    /// Reads and parses a JSON document (capped at [`MAX_DOCUMENT_BYTES`]).
    pub fn read_json<T: serde::de::DeserializeOwned>(
        &self,
        desc: &Descriptor,
    ) -> Result<T, SourceError> {
        let bytes = self.read_blob(desc, MAX_DOCUMENT_BYTES)?;
        serde_json::from_slice(&bytes)
            .map_err(|e| self.doc_err(desc.digest, format!("invalid {}: {e}", desc.media_type)))
    }

    /// Opens a blob for streaming from `offset` (the returned start may be 0
    /// when a registry ignores `Range`). The caller checks size and digest.
    pub fn open_blob(
        &self,
        desc: &Descriptor,
        offset: u64,
    ) -> Result<registry::BlobStream, SourceError> {
        if !desc.urls.is_empty() {
            return Err(self.doc_err(desc.digest, "descriptors with foreign urls are refused"));
        }
        match self {
            Source::Registry {
                client,
                image,
                cache,
            } => {
                let cached = cache
                    .lock()
                    .expect("document cache")
                    .get(&desc.digest)
                    .cloned();
                if let Some(bytes) = cached {
                    let start = offset.min(bytes.len() as u64);
                    let mut reader = std::io::Cursor::new(bytes);
                    reader.set_position(start);
                    return Ok(registry::BlobStream {
                        reader: Box::new(reader),
                        start,
                        endpoint: format!("{} (read earlier in this run)", self.name()),
                    });
                }
                client
                    .blob(image, &desc.digest, offset)
                    .map_err(|e| self.registry_err(e))
            }
            Source::Archive {
                members, archive, ..
            } if members.contains_key(&desc.digest) => {
                // Streamed straight from the archive (the caller checks
                // size and digest): a layer is written once, into the store.
                let (at, size) = members[&desc.digest];
                let from = offset.min(size);
                Ok(registry::BlobStream {
                    reader: Box::new(archive::ReadAt::new(
                        archive.clone(),
                        at.saturating_add(from),
                        size - from,
                    )),
                    start: offset.min(size),
                    endpoint: self.name(),
                })
            }
            _ => {
                let (layout, _) = self.local().expect("local source");
                let path = layout.blobs().path(&desc.digest);
                let io = |error| SourceError::Io {
                    source_name: self.name(),
                    path: path.clone(),
                    error,
                };
                let mut f = crate::layout::open_regular(&path).map_err(io)?;
                f.seek(SeekFrom::Start(offset)).map_err(io)?;
                Ok(registry::BlobStream {
                    reader: Box::new(f),
                    start: offset,
                    endpoint: self.name(),
                })
            }
        }
    }

    /// In a layout or archive: the document `index.json` names `tag`
    /// (an attachment's tag), if there is one.
    fn local_tagged(&self, tag: &str) -> Result<Option<Vec<u8>>, SourceError> {
        let (layout, _) = self.local().expect("local source");
        let index = layout.index().map_err(|e| self.layout_err(e))?;
        let Some(desc) = index
            .manifests
            .iter()
            .find(|d| d.annotations.get(ANNOTATION_REF_NAME).map(String::as_str) == Some(tag))
        else {
            return Ok(None);
        };
        self.read_blob(desc, MAX_DOCUMENT_BYTES).map(Some)
    }

    /// The cosign `.sig` artifact attached to `digest`, if there is one.
    pub fn signature(&self, digest: &Digest) -> Result<Option<Manifest>, SourceError> {
        self.attachment(digest, "sig")
    }

    /// The artifact tagged `sha256-<hex>.<kind>` (`sig`; `release`, a
    /// release statement), if there is one.
    pub fn attachment(&self, digest: &Digest, kind: &str) -> Result<Option<Manifest>, SourceError> {
        let tag = digest.attachment_tag(kind);
        let bytes = match self {
            Source::Registry { client, image, .. } => {
                match client
                    .manifest_or_missing(image, &tag)
                    .map_err(|e| self.registry_err(e))?
                {
                    Some(doc) => doc.bytes,
                    None => return Ok(None),
                }
            }
            _ => match self.local_tagged(&tag)? {
                Some(bytes) => bytes,
                None => return Ok(None),
            },
        };
        serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            self.doc_err(
                *digest,
                format!("{kind} artifact {tag}: invalid manifest: {e}"),
            )
        })
    }

    /// The referrers of `digest` (descriptors of manifests whose `subject`
    /// it is; the caller checks each manifest's subject): the registry's
    /// referrers API, else its fallback tag `sha256-<hex>`; in a layout or
    /// archive the `index.json` entry of that name. Empty when there are
    /// none.
    pub fn referrers(&self, digest: &Digest) -> Result<Vec<Descriptor>, SourceError> {
        let tag = digest.referrers_tag();
        let bytes = match self {
            Source::Registry { client, image, .. } => {
                let found = match client
                    .referrers(image, digest)
                    .map_err(|e| self.registry_err(e))?
                {
                    Some(doc) => Some(doc),
                    None => client
                        .manifest_or_missing(image, &tag)
                        .map_err(|e| self.registry_err(e))?,
                };
                match found {
                    Some(doc) => doc.bytes,
                    None => return Ok(Vec::new()),
                }
            }
            _ => match self.local_tagged(&tag)? {
                Some(bytes) => bytes,
                None => return Ok(Vec::new()),
            },
        };
        let index: Index = serde_json::from_slice(&bytes)
            .map_err(|e| self.doc_err(*digest, format!("referrers {tag}: invalid index: {e}")))?;
        Ok(index.manifests)
    }

    /// The platform manifest's descriptor for `platform`: `top` itself, or
    /// the matching entry of the index `top` (only the index is read, so a
    /// signature can be checked before the manifest and config are).
    pub fn select_manifest(
        &self,
        top: &Descriptor,
        platform: &Platform,
    ) -> Result<Descriptor, SourceError> {
        let manifest_descriptor = if is_index_type(&top.media_type) {
            let index: Index = self.read_json(top)?;
            let mut available = Vec::new();
            let mut chosen = None;
            for d in &index.manifests {
                let Some(p) = &d.platform else { continue };
                available.push(p.to_string());
                if chosen.is_none() && is_manifest_type(&d.media_type) && runs_on(platform, p) {
                    chosen = Some(d.clone());
                }
            }
            chosen.ok_or_else(|| SourceError::Platform {
                source_name: self.name(),
                digest: top.digest,
                platform: platform.to_string(),
                available: if available.is_empty() {
                    "no platform entries".into()
                } else {
                    available.join(", ")
                },
            })?
        } else if is_manifest_type(&top.media_type) {
            top.clone()
        } else {
            return Err(self.doc_err(
                top.digest,
                format!(
                    "media type {} is not a manifest or index type",
                    top.media_type
                ),
            ));
        };
        Ok(manifest_descriptor)
    }

    /// Picks the manifest for `platform` (from an index, or the manifest
    /// itself), reads it and its config, and checks both.
    pub fn select(
        &self,
        top: &Descriptor,
        platform: &Platform,
    ) -> Result<SelectedImage, SourceError> {
        let manifest_descriptor = self.select_manifest(top, platform)?;
        let md = manifest_descriptor.digest;
        let manifest: Manifest = self.read_json(&manifest_descriptor)?;
        let config_mt = manifest.config.media_type.as_str();
        if config_mt != MEDIA_TYPE_CONFIG && config_mt != MEDIA_TYPE_DOCKER_CONFIG {
            return Err(self.doc_err(
                md,
                format!("config media type {config_mt} is not an image config"),
            ));
        }
        let mut layers = Vec::new();
        for (i, l) in manifest.layers.iter().enumerate() {
            let Some(c) = Compression::of_layer_media_type(&l.media_type) else {
                return Err(self.doc_err(
                    md,
                    format!(
                        "layer {i} ({}): unknown layer media type {}",
                        l.digest, l.media_type
                    ),
                ));
            };
            if !l.urls.is_empty() {
                return Err(self.doc_err(
                    md,
                    format!("layer {i} ({}): foreign urls are refused", l.digest),
                ));
            }
            layers.push((l.clone(), c));
        }
        let config: ImageConfig = self.read_json(&manifest.config)?;
        let cp = Platform {
            os: config.os.clone(),
            architecture: config.architecture.clone(),
            variant: config.variant.clone(),
        };
        if !runs_on(platform, &cp) {
            return Err(self.doc_err(md, format!("image is for {cp}, this host is {platform}")));
        }
        if config.rootfs.diff_ids.len() != layers.len() {
            return Err(self.doc_err(
                md,
                format!(
                    "{} layers but the config lists {} diff_ids",
                    layers.len(),
                    config.rootfs.diff_ids.len()
                ),
            ));
        }
        let layers = layers
            .into_iter()
            .zip(config.rootfs.diff_ids.iter())
            .map(|((d, c), diff)| (d, c, *diff))
            .collect();
        Ok(SelectedImage {
            top: top.clone(),
            manifest_descriptor,
            manifest,
            config,
            layers,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn platform_variants() {
        let host = Platform::linux("arm64");
        let mut v8 = Platform::linux("arm64");
        v8.variant = Some("v8".into());
        assert!(runs_on(&host, &v8));
        assert!(!runs_on(&host, &Platform::linux("amd64")));
        let mut other = Platform::linux("arm64");
        other.os = "windows".into();
        assert!(!runs_on(&host, &other));
    }
}
