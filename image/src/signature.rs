//! Signature verification: the cosign / containers "simple signing" payload
//! over a manifest digest, signed with an ECDSA P-256 key.
//!
//! This is the one implementation of "is this image signed by a key we
//! trust": the activator runs it before fetching layers and the builder runs
//! it over what it just published. Signing itself lives in the builder; this
//! module only ever holds public keys.
//!
//! The format follows cosign: a `.sig` artifact (tag `sha256-<hex>.sig`) is an
//! OCI manifest whose layers each carry one payload
//! ([`crate::oci::MEDIA_TYPE_SIMPLE_SIGNING`]) with the base64 DER signature in
//! the `dev.cosignproject.cosign/signature` annotation. A signature counts
//! only when the payload bytes hash to the layer digest, the payload names
//! exactly the manifest digest being verified, its type is the cosign type,
//! and the signature checks against one of the trusted keys. When the caller
//! names an expected [`Identity`] (the activator always does), the payload's
//! `critical.identity.docker-reference` must name that repository: a
//! signature made for another repository (the other variant, a debug build)
//! does not count. The identity is compared with what the host expects, never
//! with where the image was found: mirrors and air-gapped copies change the
//! location, not the identity. A `.sig` artifact with more than
//! [`MAX_SIGNATURE_LAYERS`] signature layers is refused unread.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use p256::ecdsa::signature::Verifier as _;
use p256::ecdsa::{DerSignature, VerifyingKey};
use p256::pkcs8::DecodePublicKey as _;
use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::oci::{Manifest, ANNOTATION_COSIGN_SIGNATURE, MEDIA_TYPE_SIMPLE_SIGNING};
use crate::reference::Identity as Repository;

/// The `critical.type` cosign writes and checks.
pub const COSIGN_TYPE: &str = "cosign container image signature";
/// Payloads larger than this are refused unread (cosign's are ~250 bytes).
pub const MAX_PAYLOAD_BYTES: u64 = 64 * 1024;
/// A `.sig` artifact with more layers than this is refused before any
/// payload is read (cosign appends one layer per signing; a release is
/// signed once or twice).
pub const MAX_SIGNATURE_LAYERS: usize = 16;

/// The simple-signing payload.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Payload {
    pub critical: Critical,
    #[serde(default)]
    pub optional: Option<serde_json::Map<String, serde_json::Value>>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Critical {
    pub identity: Identity,
    pub image: ImageClaim,
    #[serde(rename = "type")]
    pub kind: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Identity {
    #[serde(rename = "docker-reference")]
    pub docker_reference: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ImageClaim {
    #[serde(rename = "docker-manifest-digest")]
    pub docker_manifest_digest: Digest,
}

impl Payload {
    /// The payload cosign writes for `identity` (`registry/repository`) and
    /// `digest`.
    pub fn new(identity: &str, digest: Digest) -> Self {
        Payload {
            critical: Critical {
                identity: Identity {
                    docker_reference: identity.to_string(),
                },
                image: ImageClaim {
                    docker_manifest_digest: digest,
                },
                kind: COSIGN_TYPE.to_string(),
            },
            optional: None,
        }
    }

    /// The exact bytes that get signed.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("payload serialises")
    }
}

/// Why an image's signatures were not accepted. Every variant names the
/// manifest digest it was about.
#[derive(Debug, thiserror::Error)]
pub enum SignatureError {
    #[error("public key {path}: {reason}")]
    Key { path: PathBuf, reason: String },
    #[error("image {digest}: no signature found (policy requires one; set trust.allow_unsigned to accept unsigned images)")]
    Missing { digest: Digest },
    #[error("image {digest}: signature layer {layer}: {reason}")]
    Malformed {
        digest: Digest,
        layer: Digest,
        reason: String,
    },
    #[error("image {digest}: signature payload names digest {named}, not this image")]
    WrongDigest { digest: Digest, named: Digest },
    #[error("image {digest}: signature names identity {found}, not {expected} (trust.identity): a signature for another repository does not count")]
    WrongIdentity {
        digest: Digest,
        expected: String,
        found: String,
    },
    #[error("image {digest}: its .sig artifact has {count} layers, more than the {max} allowed")]
    TooManyLayers {
        digest: Digest,
        count: usize,
        max: usize,
    },
    #[error(
        "image {digest}: {count} signature(s) found, none verifies with the {keys} trusted key(s)"
    )]
    Untrusted {
        digest: Digest,
        count: usize,
        keys: usize,
    },
}

/// The public keys a host trusts.
#[derive(Clone, Debug, Default)]
pub struct TrustedKeys {
    keys: Vec<VerifyingKey>,
}

impl TrustedKeys {
    /// Parses PEM (`-----BEGIN PUBLIC KEY-----`, SPKI) P-256 keys.
    pub fn from_pem_files(paths: &[impl AsRef<Path>]) -> Result<Self, SignatureError> {
        let mut keys = Vec::new();
        for p in paths {
            let p = p.as_ref();
            let text = std::fs::read_to_string(p).map_err(|e| SignatureError::Key {
                path: p.to_path_buf(),
                reason: e.to_string(),
            })?;
            keys.push(Self::parse(&text).map_err(|reason| SignatureError::Key {
                path: p.to_path_buf(),
                reason,
            })?);
        }
        Ok(TrustedKeys { keys })
    }

    /// Parses one PEM public key.
    pub fn parse(pem: &str) -> Result<VerifyingKey, String> {
        VerifyingKey::from_public_key_pem(pem)
            .map_err(|e| format!("not a PEM ECDSA P-256 public key ({e})"))
    }

    pub fn from_keys(keys: Vec<VerifyingKey>) -> Self {
        TrustedKeys { keys }
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Whether one signature (base64 DER) over `bytes` is by a trusted key
    /// (for other signed documents: release statements).
    pub fn accepts_signature(&self, bytes: &[u8], signature_b64: &str) -> bool {
        self.accepts(bytes, signature_b64)
    }

    /// Checks one signature (base64 DER) over `payload` bytes.
    fn accepts(&self, payload: &[u8], signature_b64: &str) -> bool {
        let Ok(der) = base64::engine::general_purpose::STANDARD.decode(signature_b64.trim()) else {
            return false;
        };
        let Ok(sig) = DerSignature::try_from(der.as_slice()) else {
            return false;
        };
        self.keys.iter().any(|k| k.verify(payload, &sig).is_ok())
    }
}

/// Verifies the `.sig` artifact `sig_manifest` for the image `digest`.
/// `fetch_payload` returns the bytes of a payload layer (already checked
/// against its descriptor digest and capped at [`MAX_PAYLOAD_BYTES`] by the
/// caller's blob reader; checked again here). Succeeds when at least one layer
/// is a valid signature by a trusted key over exactly `digest` and, when
/// `identity` is given, naming that repository.
pub fn verify(
    keys: &TrustedKeys,
    digest: Digest,
    identity: Option<&Repository>,
    sig_manifest: &Manifest,
    mut fetch_payload: impl FnMut(&crate::oci::Descriptor) -> std::io::Result<Vec<u8>>,
) -> Result<(), SignatureError> {
    if sig_manifest.layers.len() > MAX_SIGNATURE_LAYERS {
        return Err(SignatureError::TooManyLayers {
            digest,
            count: sig_manifest.layers.len(),
            max: MAX_SIGNATURE_LAYERS,
        });
    }
    let mut count = 0;
    let mut first_error = None;
    for layer in &sig_manifest.layers {
        if layer.media_type != MEDIA_TYPE_SIMPLE_SIGNING {
            continue;
        }
        let Some(sig) = layer.annotations.get(ANNOTATION_COSIGN_SIGNATURE) else {
            continue;
        };
        count += 1;
        let malformed = |reason: String| SignatureError::Malformed {
            digest,
            layer: layer.digest,
            reason,
        };
        if layer.size > MAX_PAYLOAD_BYTES {
            first_error.get_or_insert(malformed(format!(
                "payload of {} bytes exceeds the {MAX_PAYLOAD_BYTES}-byte limit",
                layer.size
            )));
            continue;
        }
        let bytes = match fetch_payload(layer) {
            Ok(b) => b,
            Err(e) => {
                first_error.get_or_insert(malformed(format!("cannot read payload: {e}")));
                continue;
            }
        };
        if Digest::of(&bytes) != layer.digest {
            first_error.get_or_insert(malformed(
                "payload bytes do not match the layer digest".into(),
            ));
            continue;
        }
        let payload: Payload = match serde_json::from_slice(&bytes) {
            Ok(p) => p,
            Err(e) => {
                first_error.get_or_insert(malformed(format!(
                    "payload is not simple signing JSON: {e}"
                )));
                continue;
            }
        };
        if payload.critical.kind != COSIGN_TYPE {
            first_error.get_or_insert(malformed(format!(
                "payload type {:?} is not {COSIGN_TYPE:?}",
                payload.critical.kind
            )));
            continue;
        }
        if payload.critical.image.docker_manifest_digest != digest {
            first_error.get_or_insert(SignatureError::WrongDigest {
                digest,
                named: payload.critical.image.docker_manifest_digest,
            });
            continue;
        }
        // The signature is over the payload bytes as stored, not a re-encoding.
        if !keys.accepts(&bytes, sig) {
            continue;
        }
        if let Some(expected) = identity {
            let named = &payload.critical.identity.docker_reference;
            match Repository::of_reference(named) {
                Ok(found) if &found == expected => {}
                found => {
                    // A trusted signature for another image says more than
                    // any other reason: it replaces an earlier one.
                    first_error = Some(SignatureError::WrongIdentity {
                        digest,
                        expected: expected.to_string(),
                        found: found.map_or_else(|_| format!("{named:?}"), |f| f.to_string()),
                    });
                    continue;
                }
            }
        }
        return Ok(());
    }
    Err(match (count, first_error) {
        (0, _) => SignatureError::Missing { digest },
        // A specific reason (tampered payload, other digest) says more than
        // "untrusted"; a well-formed signature by an unknown key falls through.
        (_, Some(e)) => e,
        (count, _) => SignatureError::Untrusted {
            digest,
            count,
            keys: keys.len(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oci::{Descriptor, MEDIA_TYPE_CONFIG};
    use p256::ecdsa::signature::Signer as _;
    use p256::ecdsa::{Signature, SigningKey};

    fn key(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32].into()).unwrap()
    }

    fn sig_manifest(payload: &[u8], signing: &SigningKey) -> Manifest {
        let sig: Signature = signing.sign(payload);
        let mut layer = Descriptor::new(
            MEDIA_TYPE_SIMPLE_SIGNING,
            Digest::of(payload),
            payload.len() as u64,
        );
        layer.annotations.insert(
            ANNOTATION_COSIGN_SIGNATURE.into(),
            base64::engine::general_purpose::STANDARD.encode(sig.to_der().as_bytes()),
        );
        Manifest {
            schema_version: 2,
            media_type: None,
            artifact_type: None,
            config: Descriptor::new(MEDIA_TYPE_CONFIG, Digest::of(b"{}"), 2),
            layers: vec![layer],
            subject: None,
            annotations: Default::default(),
        }
    }

    #[test]
    fn accepts_trusted_rejects_others() {
        let image = Digest::of(b"manifest");
        let payload = Payload::new("127.0.0.1:5000/node", image).to_bytes();
        let m = sig_manifest(&payload, &key(1));
        let fetch = |_: &Descriptor| Ok(payload.clone());
        let trusted = TrustedKeys::from_keys(vec![*key(1).verifying_key()]);
        verify(&trusted, image, None, &m, fetch).unwrap();

        let other = TrustedKeys::from_keys(vec![*key(2).verifying_key()]);
        assert!(matches!(
            verify(&other, image, None, &m, fetch),
            Err(SignatureError::Untrusted { .. })
        ));

        let elsewhere = Digest::of(b"other manifest");
        assert!(matches!(
            verify(&trusted, elsewhere, None, &m, fetch),
            Err(SignatureError::WrongDigest { .. })
        ));
    }

    #[test]
    fn tampered_payload_and_missing_signature() {
        let image = Digest::of(b"manifest");
        let payload = Payload::new("x/y", image).to_bytes();
        let m = sig_manifest(&payload, &key(1));
        let trusted = TrustedKeys::from_keys(vec![*key(1).verifying_key()]);
        let mut tampered = payload.clone();
        tampered[10] ^= 1;
        let e = verify(&trusted, image, None, &m, |_| Ok(tampered.clone())).unwrap_err();
        assert!(
            e.to_string().contains("do not match the layer digest"),
            "{e}"
        );

        let mut empty = m.clone();
        empty.layers.clear();
        assert!(matches!(
            verify(&trusted, image, None, &empty, |_| Ok(vec![])),
            Err(SignatureError::Missing { .. })
        ));
    }

    #[test]
    fn signature_for_another_repository_does_not_count() {
        let image = Digest::of(b"manifest");
        let payload = Payload::new("ghcr.io/org/node-debug:v1", image).to_bytes();
        let m = sig_manifest(&payload, &key(1));
        let fetch = |_: &Descriptor| Ok(payload.clone());
        let trusted = TrustedKeys::from_keys(vec![*key(1).verifying_key()]);
        let expected = Repository::repository("ghcr.io/org/node").unwrap();
        let e = verify(&trusted, image, Some(&expected), &m, fetch).unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, SignatureError::WrongIdentity { .. }), "{text}");
        assert!(
            text.contains("ghcr.io/org/node-debug") && text.contains("not ghcr.io/org/node "),
            "{text}"
        );
        // The same repository named with a tag counts.
        let same = Repository::repository("ghcr.io/org/node-debug").unwrap();
        verify(&trusted, image, Some(&same), &m, fetch).unwrap();
    }

    #[test]
    fn docker_hub_names_compare_normalised() {
        let image = Digest::of(b"manifest");
        let payload = Payload::new("org/node", image).to_bytes();
        let m = sig_manifest(&payload, &key(1));
        let trusted = TrustedKeys::from_keys(vec![*key(1).verifying_key()]);
        let expected = Repository::repository("docker.io/org/node").unwrap();
        verify(
            &trusted,
            image,
            Some(&expected),
            &m,
            |_| Ok(payload.clone()),
        )
        .unwrap();
    }

    #[test]
    fn too_many_signature_layers_refused_unread() {
        let image = Digest::of(b"manifest");
        let payload = Payload::new("x/y", image).to_bytes();
        let mut m = sig_manifest(&payload, &key(1));
        let layer = m.layers[0].clone();
        m.layers = vec![layer; MAX_SIGNATURE_LAYERS + 1];
        let trusted = TrustedKeys::from_keys(vec![*key(1).verifying_key()]);
        let e = verify(&trusted, image, None, &m, |_| panic!("a payload was read")).unwrap_err();
        assert!(
            matches!(
                e,
                SignatureError::TooManyLayers {
                    count: 17,
                    max: 16,
                    ..
                }
            ),
            "{e}"
        );
    }
}
