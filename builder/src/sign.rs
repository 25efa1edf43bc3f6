//! Signing keys and cosign "simple signing" signatures.
//!
//! Owns key generation (`PREFIX.key`, PKCS#8 PEM, mode 0600, never
//! overwritten; `PREFIX.pub`, SPKI PEM), loading a private key, and building
//! the `.sig` artifact for a manifest digest: the payload from
//! [`kubeslot_image::signature::Payload`] (one format for signer and
//! verifier), an ECDSA P-256 SHA-256 signature (RFC 6979, so signing the same
//! digest twice gives the same bytes), DER, base64 in the
//! `dev.cosignproject.cosign/signature` annotation, in an OCI manifest with an
//! empty `{}` config, as cosign writes it.
//!
//! It deliberately does not verify (that is
//! [`kubeslot_image::signature::verify`], run by the callers over what
//! they published) and does not know where the artifact goes (registry or
//! layout: [`crate::transfer`]).

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use base64::Engine as _;
use kubeslot_image::oci::{
    Descriptor, Manifest, ANNOTATION_COSIGN_SIGNATURE, MEDIA_TYPE_CONFIG, MEDIA_TYPE_MANIFEST,
    MEDIA_TYPE_SIMPLE_SIGNING,
};
use kubeslot_image::signature::{Payload, TrustedKeys};
use kubeslot_image::Digest;
use p256::ecdsa::signature::Signer as _;
use p256::ecdsa::{Signature, SigningKey};
use p256::pkcs8::{DecodePrivateKey as _, EncodePrivateKey as _, EncodePublicKey as _, LineEnding};

/// The config blob of a signature artifact (cosign writes `{}` too).
pub const EMPTY_CONFIG: &[u8] = b"{}";

/// Why a key could not be written or read; names the file.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("key file {path} already exists: refusing to overwrite a key")]
    Exists { path: PathBuf },
    #[error("key file {path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("key file {path}: not a PKCS#8 PEM ECDSA P-256 private key ({reason})")]
    Parse { path: PathBuf, reason: String },
}

/// The two files `keygen` wrote.
#[derive(Debug, serde::Serialize)]
pub struct KeyPair {
    pub private_key: PathBuf,
    pub public_key: PathBuf,
}

/// Generates a P-256 key pair at `PREFIX.key` and `PREFIX.pub`. Neither file
/// may exist; each is written to a temp file (the private key 0600, the
/// public key 0644: it is meant to be handed out), fsynced and linked into
/// place without replacing anything, then the directory is fsynced.
pub fn keygen(prefix: &Path) -> Result<KeyPair, KeyError> {
    let private_key = with_suffix(prefix, "key");
    let public_key = with_suffix(prefix, "pub");
    for p in [&private_key, &public_key] {
        if p.symlink_metadata().is_ok() {
            return Err(KeyError::Exists { path: p.clone() });
        }
    }
    if let Some(dir) = private_key.parent().filter(|d| !d.as_os_str().is_empty()) {
        // A fresh key directory is private: only the owner lists it.
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|error| KeyError::Io {
                path: dir.to_path_buf(),
                error,
            })?;
    }
    let key = SigningKey::random(&mut rand_core::OsRng);
    let pem = key
        .to_pkcs8_pem(LineEnding::LF)
        .expect("a fresh P-256 key encodes as PKCS#8");
    let public = key
        .verifying_key()
        .to_public_key_pem(LineEnding::LF)
        .expect("a P-256 public key encodes as SPKI");
    write_new(&private_key, pem.as_bytes(), 0o600)?;
    if let Err(e) = write_new(&public_key, public.as_bytes(), 0o644) {
        // Leave no half pair behind: a lone private key would block a retry.
        let _ = std::fs::remove_file(&private_key);
        return Err(e);
    }
    Ok(KeyPair {
        private_key,
        public_key,
    })
}

fn with_suffix(prefix: &Path, ext: &str) -> PathBuf {
    let mut s = prefix.as_os_str().to_owned();
    s.push(".");
    s.push(ext);
    PathBuf::from(s)
}

/// Writes a new file with `mode` atomically and never over an existing one
/// (the temp file is created 0600 by `tempfile` and chmodded before it is
/// linked; `persist_noclobber` links it in place only if the name is free).
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), KeyError> {
    let io = |source| KeyError::Io {
        path: path.to_path_buf(),
        error: source,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".tmp-key-")
        .tempfile_in(dir)
        .map_err(io)?;
    tmp.write_all(bytes).map_err(io)?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(io)?;
    tmp.as_file().sync_all().map_err(io)?;
    tmp.persist_noclobber(path).map_err(|e| {
        if e.error.kind() == std::io::ErrorKind::AlreadyExists {
            KeyError::Exists {
                path: path.to_path_buf(),
            }
        } else {
            io(e.error)
        }
    })?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io)?;
    Ok(())
}

/// Reads a PKCS#8 PEM P-256 private key.
pub fn load_key(path: &Path) -> Result<SigningKey, KeyError> {
    let pem = std::fs::read_to_string(path).map_err(|source| KeyError::Io {
        path: path.to_path_buf(),
        error: source,
    })?;
    SigningKey::from_pkcs8_pem(&pem).map_err(|e| KeyError::Parse {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// The trust set holding only this key's public half (to verify what we
/// just signed with the one verifier the hosts run).
pub fn trusted(key: &SigningKey) -> TrustedKeys {
    TrustedKeys::from_keys(vec![*key.verifying_key()])
}

/// A `.sig` artifact ready to store: its tag, manifest bytes and the blobs
/// the manifest names (config and payload).
#[derive(Clone, Debug)]
pub struct Artifact {
    /// `sha256-<hex>.sig` / `.sbom` of the subject.
    pub tag: String,
    pub manifest: Vec<u8>,
    pub media_type: String,
    /// Blobs the manifest references that the caller must store first.
    pub blobs: Vec<Vec<u8>>,
}

impl Artifact {
    pub fn digest(&self) -> Digest {
        Digest::of(&self.manifest)
    }
}

/// One signature layer: payload for `identity` and `digest`, signed.
pub fn signature_layer(key: &SigningKey, identity: &str, digest: Digest) -> (Descriptor, Vec<u8>) {
    let payload = Payload::new(identity, digest).to_bytes();
    let sig: Signature = key.sign(&payload);
    let mut layer = Descriptor::new(
        MEDIA_TYPE_SIMPLE_SIGNING,
        Digest::of(&payload),
        payload.len() as u64,
    );
    layer.annotations.insert(
        ANNOTATION_COSIGN_SIGNATURE.into(),
        base64::engine::general_purpose::STANDARD.encode(sig.to_der().as_bytes()),
    );
    (layer, payload)
}

/// The `.sig` artifact for `digest`. When the registry or layout already has
/// a `.sig` manifest (`existing`), its layers are kept and ours is added
/// unless an identical one is there (re-signing is idempotent); the caller
/// still holds the blobs of the kept layers.
pub fn signature_artifact(
    key: &SigningKey,
    identity: &str,
    digest: Digest,
    existing: Option<&Manifest>,
) -> Artifact {
    let (layer, payload) = signature_layer(key, identity, digest);
    let mut layers: Vec<Descriptor> = existing
        .map(|m| {
            m.layers
                .iter()
                .filter(|l| l.media_type == MEDIA_TYPE_SIMPLE_SIGNING)
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    if !layers.contains(&layer) {
        layers.push(layer);
    }
    let manifest = Manifest {
        schema_version: 2,
        media_type: Some(MEDIA_TYPE_MANIFEST.into()),
        artifact_type: None,
        config: Descriptor::new(
            MEDIA_TYPE_CONFIG,
            Digest::of(EMPTY_CONFIG),
            EMPTY_CONFIG.len() as u64,
        ),
        layers,
        subject: None,
        annotations: Default::default(),
    };
    Artifact {
        tag: digest.attachment_tag("sig"),
        manifest: serde_json::to_vec(&manifest).expect("manifest serialises"),
        media_type: MEDIA_TYPE_MANIFEST.into(),
        blobs: vec![EMPTY_CONFIG.to_vec(), payload],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keygen_writes_0600_and_never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let prefix = dir.path().join("keys/release");
        let pair = keygen(&prefix).unwrap();
        let mode = std::fs::metadata(&pair.private_key)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let public_mode = std::fs::metadata(&pair.public_key)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(
            public_mode & 0o777,
            0o644,
            "the public key is for handing out"
        );
        let before = std::fs::read(&pair.private_key).unwrap();
        let e = keygen(&prefix).unwrap_err();
        assert!(matches!(e, KeyError::Exists { .. }), "{e}");
        assert_eq!(std::fs::read(&pair.private_key).unwrap(), before);
        let key = load_key(&pair.private_key).unwrap();
        let pem = std::fs::read_to_string(&pair.public_key).unwrap();
        assert_eq!(
            TrustedKeys::parse(&pem).unwrap(),
            *key.verifying_key(),
            "public file holds the private key's public half"
        );
    }

    #[test]
    fn artifact_verifies_with_the_one_verifier_and_is_idempotent() {
        let key = SigningKey::from_bytes(&[3u8; 32].into()).unwrap();
        let image = Digest::of(b"image manifest");
        let a = signature_artifact(&key, "127.0.0.1:5000/node", image, None);
        let m: Manifest = serde_json::from_slice(&a.manifest).unwrap();
        let payload = a.blobs[1].clone();
        let identity = kubeslot_image::reference::Identity::repository("127.0.0.1:5000/node").ok();
        kubeslot_image::signature::verify(&trusted(&key), image, identity.as_ref(), &m, |_| {
            Ok(payload.clone())
        })
        .unwrap();
        let again = signature_artifact(&key, "127.0.0.1:5000/node", image, Some(&m));
        assert_eq!(again.manifest, a.manifest);
        let other = SigningKey::from_bytes(&[4u8; 32].into()).unwrap();
        let both = signature_artifact(&other, "127.0.0.1:5000/node", image, Some(&m));
        let both: Manifest = serde_json::from_slice(&both.manifest).unwrap();
        assert_eq!(both.layers.len(), 2);
        assert_eq!(a.tag, image.attachment_tag("sig"));
    }
}
