//! Talking to one registry repository over the distribution API (oci-client):
//! blob existence, blob upload streamed from a file, blob download streamed
//! into a [`BlobDir`] with its digest checked, and manifests pushed and
//! pulled as raw bytes with explicit media types.
//!
//! Given an [`ImageRef`] (only its registry and repository matter here) and
//! [`RegistryOptions`] (insecure hosts, a credentials file). Manifests are
//! never re-serialised: the bytes that were hashed are the bytes sent, so
//! every digest survives a copy. Plain HTTP is used only for loopback hosts
//! or hosts named with `--insecure-registry`.
//!
//! It deliberately does not decide what to push or in which order (that is
//! [`crate::transfer`]) and does not retry: a failed push is resumed by
//! running it again, which re-sends only the blobs the registry lacks.

use std::path::{Path, PathBuf};

use futures_util::StreamExt as _;
use kubeslot_image::atomic;
use kubeslot_image::digest::Hasher;
use kubeslot_image::error_chain;
use kubeslot_image::layout::{BlobDir, MAX_DOCUMENT_BYTES};
use kubeslot_image::oci::{
    MEDIA_TYPE_DOCKER_LIST, MEDIA_TYPE_DOCKER_MANIFEST, MEDIA_TYPE_INDEX, MEDIA_TYPE_MANIFEST,
};
use kubeslot_image::{Digest, ImageRef};
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::secrets::RegistryAuth;
use oci_client::{Reference, RegistryOperation};

use crate::creds::{self, Credentials, CredsError};

/// Manifest media types we ask for and accept.
const ACCEPTED_MANIFESTS: &[&str] = &[
    MEDIA_TYPE_INDEX,
    MEDIA_TYPE_MANIFEST,
    MEDIA_TYPE_DOCKER_LIST,
    MEDIA_TYPE_DOCKER_MANIFEST,
];

/// Bytes read from a file per upload chunk (one HTTP request streams all of
/// them; this only bounds memory).
const READ_CHUNK: usize = 1 << 20;

/// How to reach registries: shared by every command that talks to one.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct RegistryOptions {
    /// Allow plain HTTP to this registry host (`host:port`); loopback hosts
    /// (127.0.0.1, localhost, [::1]) always may. Repeatable.
    #[arg(long = "insecure-registry", value_name = "HOST")]
    pub insecure: Vec<String>,
    /// Registry credentials: `user:password` on one line, or a docker
    /// `config.json`. Default: $KUBESLOT_REGISTRY_USER/$KUBESLOT_REGISTRY_PASSWORD,
    /// $GITHUB_TOKEN for ghcr.io, then ~/.docker/config.json.
    #[arg(long, value_name = "FILE")]
    pub creds_file: Option<PathBuf>,
}

/// What went wrong talking to a registry; every variant names the
/// repository and the blob, manifest or tag it was about.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error(transparent)]
    Creds(#[from] CredsError),
    #[error("registry {registry}: cannot reach it: {reason}")]
    Unreachable { registry: String, reason: String },
    #[error("registry {registry}: authentication refused for {repository}: {reason}")]
    Auth {
        registry: String,
        repository: String,
        reason: String,
    },
    #[error("{repository}: upload of blob {digest} failed: {reason}")]
    Upload {
        repository: String,
        digest: Digest,
        reason: String,
    },
    #[error("{repository}: download of blob {digest} failed: {reason}")]
    Download {
        repository: String,
        digest: Digest,
        reason: String,
    },
    #[error("{repository}: blob {digest} arrived with digest {actual} ({size} bytes): the registry served other content")]
    BlobDigest {
        repository: String,
        digest: Digest,
        actual: Digest,
        size: u64,
    },
    #[error("{repository}: reading blob {digest} from {path}: {error}")]
    Local {
        repository: String,
        digest: Digest,
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{repository}: manifest {reference}: {reason}")]
    Manifest {
        repository: String,
        reference: String,
        reason: String,
    },
}

fn is_not_found(e: &OciDistributionError) -> bool {
    match e {
        OciDistributionError::RegistryError { envelope, .. } => envelope.errors.iter().any(|e| {
            matches!(
                e.code,
                OciErrorCode::ManifestUnknown | OciErrorCode::NameUnknown | OciErrorCode::NotFound
            )
        }),
        OciDistributionError::ServerError { code, .. } => *code == 404,
        OciDistributionError::ImageManifestNotFoundError(_) => true,
        _ => false,
    }
}

/// Whether plain HTTP may be used for `host` without being asked.
pub fn is_loopback(host: &str) -> bool {
    let name = match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    };
    name == "localhost" || name == "[::1]" || name.starts_with("127.")
}

/// A manifest as the registry stored it.
#[derive(Clone, Debug)]
pub struct RawManifest {
    pub bytes: Vec<u8>,
    pub media_type: String,
    pub digest: Digest,
}

/// The media type of a manifest document, from its `mediaType` field or, when
/// absent (allowed by OCI), from its shape.
pub fn manifest_media_type(bytes: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    if let Some(m) = v.get("mediaType").and_then(|m| m.as_str()) {
        return Some(m.to_string());
    }
    if v.get("manifests").is_some() {
        Some(MEDIA_TYPE_INDEX.into())
    } else if v.get("layers").is_some() {
        Some(MEDIA_TYPE_MANIFEST.into())
    } else {
        None
    }
}

/// A connection to one repository of one registry.
pub struct Remote {
    client: oci_client::Client,
    auth: RegistryAuth,
    image: ImageRef,
}

impl Remote {
    /// Connects and authenticates for pulling, or pushing as well.
    pub async fn connect(
        image: &ImageRef,
        opts: &RegistryOptions,
        push: bool,
    ) -> Result<Remote, RegistryError> {
        let mut plain = opts.insecure.clone();
        if is_loopback(&image.registry) {
            plain.push(image.registry.clone());
        }
        let config = ClientConfig {
            protocol: ClientProtocol::HttpsExcept(plain),
            // One PUT per blob streamed from disk: no per-chunk round trips,
            // and an interrupted upload leaves nothing the registry counts.
            use_monolithic_push: true,
            connect_timeout: Some(std::time::Duration::from_secs(30)),
            ..Default::default()
        };
        let client = oci_client::Client::new(config);
        let auth = match creds::lookup(&image.registry, opts.creds_file.as_deref())? {
            Credentials::Anonymous => RegistryAuth::Anonymous,
            Credentials::Basic { user, password } => RegistryAuth::Basic(user, password),
        };
        let remote = Remote {
            client,
            auth,
            image: image.clone(),
        };
        let op = if push {
            RegistryOperation::Push
        } else {
            RegistryOperation::Pull
        };
        remote
            .client
            .auth(&remote.reference("latest"), &remote.auth, op)
            .await
            .map_err(|e| match e {
                OciDistributionError::RequestError(_) => RegistryError::Unreachable {
                    registry: image.registry.clone(),
                    reason: error_chain(&e),
                },
                _ => RegistryError::Auth {
                    registry: image.registry.clone(),
                    repository: image.name(),
                    reason: error_chain(&e),
                },
            })?;
        Ok(remote)
    }

    /// A refusal (401/403) becomes [`RegistryError::Auth`], whatever the
    /// request was; anything else is built by `other`.
    fn fail(
        &self,
        e: OciDistributionError,
        other: impl FnOnce(String) -> RegistryError,
    ) -> RegistryError {
        let refused = match &e {
            OciDistributionError::UnauthorizedError { .. }
            | OciDistributionError::AuthenticationFailure(_) => true,
            OciDistributionError::RequestError(r) => {
                matches!(r.status().map(|s| s.as_u16()), Some(401 | 403))
            }
            OciDistributionError::ServerError { code, .. } => matches!(code, 401 | 403),
            OciDistributionError::RegistryError { envelope, .. } => envelope
                .errors
                .iter()
                .any(|x| matches!(x.code, OciErrorCode::Unauthorized | OciErrorCode::Denied)),
            _ => false,
        };
        if refused {
            RegistryError::Auth {
                registry: self.image.registry.clone(),
                repository: self.name(),
                reason: error_chain(&e),
            }
        } else {
            other(error_chain(&e))
        }
    }

    /// `registry/repository`.
    pub fn name(&self) -> String {
        self.image.name()
    }

    fn reference(&self, tag_or_digest: &str) -> Reference {
        if tag_or_digest.starts_with("sha256:") {
            Reference::with_digest(
                self.image.registry.clone(),
                self.image.repository.clone(),
                tag_or_digest.to_string(),
            )
        } else {
            Reference::with_tag(
                self.image.registry.clone(),
                self.image.repository.clone(),
                tag_or_digest.to_string(),
            )
        }
    }

    /// HEAD on the blob.
    pub async fn has_blob(&self, digest: &Digest) -> Result<bool, RegistryError> {
        self.client
            .blob_exists(&self.reference("latest"), &digest.to_string())
            .await
            .map_err(|e| {
                self.fail(e, |r| RegistryError::Upload {
                    repository: self.name(),
                    digest: *digest,
                    reason: format!("checking whether the registry has it: {r}"),
                })
            })
    }

    /// Uploads the file at `path` as blob `digest` (`size` bytes) in one
    /// streamed request. The registry checks the digest when the upload
    /// ends and refuses a mismatch.
    pub async fn push_blob_file(
        &self,
        digest: &Digest,
        size: u64,
        path: &Path,
    ) -> Result<(), RegistryError> {
        let file = tokio::fs::File::open(path)
            .await
            .map_err(|source| RegistryError::Local {
                repository: self.name(),
                digest: *digest,
                path: path.to_path_buf(),
                error: source,
            })?;
        let stream = futures_util::stream::unfold(file, |mut f| async move {
            use tokio::io::AsyncReadExt as _;
            let mut buf = vec![0u8; READ_CHUNK];
            match f.read(&mut buf).await {
                Ok(0) => None,
                Ok(n) => {
                    buf.truncate(n);
                    Some((Ok(bytes::Bytes::from(buf)), f))
                }
                Err(e) => Some((Err(OciDistributionError::IoError(e)), f)),
            }
        });
        self.client
            .push_blob_stream(
                &self.reference("latest"),
                stream,
                &digest.to_string(),
                Some(size),
            )
            .await
            .map_err(|e| {
                self.fail(e, |reason| RegistryError::Upload {
                    repository: self.name(),
                    digest: *digest,
                    reason,
                })
            })?;
        Ok(())
    }

    /// Uploads a small blob held in memory.
    pub async fn push_blob_bytes(&self, bytes: &[u8]) -> Result<Digest, RegistryError> {
        let digest = Digest::of(bytes);
        self.client
            .push_blob(
                &self.reference("latest"),
                bytes.to_vec(),
                &digest.to_string(),
            )
            .await
            .map_err(|e| {
                self.fail(e, |reason| RegistryError::Upload {
                    repository: self.name(),
                    digest,
                    reason,
                })
            })?;
        Ok(digest)
    }

    /// PUTs manifest `bytes` (sent exactly as given) under `reference` (a tag
    /// or the digest) with an explicit media type; returns their digest.
    pub async fn push_manifest(
        &self,
        reference: &str,
        bytes: &[u8],
        media_type: &str,
    ) -> Result<Digest, RegistryError> {
        let err = |reason: String| RegistryError::Manifest {
            repository: self.name(),
            reference: reference.to_string(),
            reason,
        };
        let content_type = media_type
            .parse()
            .map_err(|_| err(format!("media type {media_type:?} is not a header value")))?;
        self.client
            .push_manifest_raw(&self.reference(reference), bytes.to_vec(), content_type)
            .await
            .map_err(|e| self.fail(e, |r| err(format!("push refused: {r}"))))?;
        Ok(Digest::of(bytes))
    }

    /// GETs a manifest by tag or digest; `None` when the registry does not
    /// have it. The digest is computed from the bytes and, when a digest was
    /// asked for, must equal it.
    pub async fn pull_manifest(
        &self,
        reference: &str,
    ) -> Result<Option<RawManifest>, RegistryError> {
        let err = |reason: String| RegistryError::Manifest {
            repository: self.name(),
            reference: reference.to_string(),
            reason,
        };
        let result = self
            .client
            .pull_manifest_raw(&self.reference(reference), &self.auth, ACCEPTED_MANIFESTS)
            .await;
        let bytes = match result {
            Ok((bytes, _)) => bytes.to_vec(),
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(self.fail(e, err)),
        };
        if bytes.len() as u64 > MAX_DOCUMENT_BYTES {
            return Err(err(format!(
                "larger than the {MAX_DOCUMENT_BYTES}-byte limit for a manifest"
            )));
        }
        let digest = Digest::of(&bytes);
        if let Ok(wanted) = reference.parse::<Digest>() {
            if wanted != digest {
                return Err(err(format!("content hashes to {digest}")));
            }
        }
        let media_type = manifest_media_type(&bytes)
            .ok_or_else(|| err("not a JSON manifest or index".into()))?;
        Ok(Some(RawManifest {
            bytes,
            media_type,
            digest,
        }))
    }

    /// Downloads blob `digest` into `blobs`, streaming through a hash; the
    /// blob appears under its name only when size and digest match.
    pub async fn pull_blob(
        &self,
        digest: &Digest,
        size: u64,
        blobs: &BlobDir,
    ) -> Result<(), RegistryError> {
        if blobs.contains(digest) {
            return Ok(());
        }
        let download = |reason: String| RegistryError::Download {
            repository: self.name(),
            digest: *digest,
            reason,
        };
        let local = |source: std::io::Error, path: &Path| RegistryError::Local {
            repository: self.name(),
            digest: *digest,
            path: path.to_path_buf(),
            error: source,
        };
        let dir = blobs.root().join("sha256");
        let mut tmp = tempfile::Builder::new()
            .prefix(".partial-")
            // what other users may read (umask applies), not tempfile's 0600
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .tempfile_in(&dir)
            .map_err(|e| local(e, &dir))?;
        let mut stream = self
            .client
            .pull_blob_stream(&self.reference("latest"), digest.to_string().as_str())
            .await
            .map_err(|e| self.fail(e, download))?
            .stream;
        let mut hasher = Hasher::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| download(error_chain(&e)))?;
            hasher.update(&chunk);
            if hasher.len() > size {
                return Err(download(format!("more than the {size} bytes announced")));
            }
            std::io::Write::write_all(tmp.as_file_mut(), &chunk)
                .map_err(|e| local(e, tmp.path()))?;
        }
        let len = hasher.len();
        let actual = hasher.finish();
        if actual != *digest || len != size {
            return Err(RegistryError::BlobDigest {
                repository: self.name(),
                digest: *digest,
                actual,
                size: len,
            });
        }
        let dest = blobs.path(digest);
        tmp.as_file().sync_all().map_err(|e| local(e, &dest))?;
        tmp.persist(&dest).map_err(|e| local(e.error, &dest))?;
        atomic::sync_dir(&dir).map_err(|e| download(e.to_string()))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for h in ["127.0.0.1:5000", "localhost", "localhost:80", "[::1]:5000"] {
            assert!(is_loopback(h), "{h}");
        }
        for h in ["ghcr.io", "10.0.0.1:5000", "127x.example:1"] {
            assert!(!is_loopback(h), "{h}");
        }
    }

    #[test]
    fn media_type_from_shape() {
        assert_eq!(
            manifest_media_type(br#"{"schemaVersion":2,"manifests":[]}"#).as_deref(),
            Some(MEDIA_TYPE_INDEX)
        );
        assert_eq!(
            manifest_media_type(br#"{"mediaType":"x","layers":[]}"#).as_deref(),
            Some("x")
        );
        assert_eq!(manifest_media_type(b"not json"), None);
    }
}
