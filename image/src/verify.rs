//! Trust policy: an image's signature is checked before any layer is
//! fetched, and an image that fails the policy is refused (fail closed).
//!
//! Given a [`Policy`] (trusted public keys, `allow_unsigned`; the activator
//! loads it from its config, the builder from the key it signed with), a
//! [`Source`] and a [`SelectedImage`], [`check`]
//! looks for the cosign `.sig` artifact of the index digest and then of the
//! platform manifest digest, and runs [`crate::signature::verify`] (the one
//! implementation of signature checking) on each. The builder signs both, so
//! a valid signature by a trusted key on EITHER digest is accepted: the index
//! digest binds every platform manifest by digest, and the manifest digest
//! binds the config and every layer, so either one pins the bytes we unpack.
//!
//! With an identity in the policy, a signature counts only when its
//! `docker-reference` names that repository ([`crate::signature`]).
//!
//! Unsigned or wrongly signed images are refused unless `allow_unsigned` is
//! true in the config; there is deliberately no command-line bypass. With
//! `allow_unsigned`, the outcome says why the image was accepted anyway.
//!
//! It does not fetch layers or decide where images come from.

use serde::Serialize;

use crate::digest::Digest;
use crate::layout::MAX_DOCUMENT_BYTES;
use crate::reference::Identity;
use crate::signature::{self, SignatureError, TrustedKeys, MAX_PAYLOAD_BYTES};
use crate::source::{SelectedImage, Source, SourceError};

/// The host's trust policy, keys loaded.
#[derive(Clone, Debug)]
pub struct Policy {
    keys: TrustedKeys,
    allow_unsigned: bool,
    identity: Option<Identity>,
}

/// Why an image was refused or the policy could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("trust policy: {0}")]
    Key(SignatureError),
    #[error("trust policy: no trusted keys (trust.public_keys is empty) and trust.allow_unsigned is false: no image can be accepted")]
    NoKeys,
    #[error("trust.identity {identity:?}: {reason}")]
    BadIdentity { identity: String, reason: String },
    #[error("trust.identity is required for an oci: or oci-archive: image unless trust.allow_unsigned: set it to the repository the image's signatures name (e.g. ghcr.io/org/node)")]
    NoIdentity,
    #[error("image {image}: refused by the trust policy: {}", .reasons.join("; "))]
    Refused { image: Digest, reasons: Vec<String> },
    #[error("image {image}: reading signatures: {error}")]
    Source {
        image: Digest,
        error: Box<SourceError>,
    },
}

/// How an image passed the policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Verdict {
    /// A trusted key signed `digest` (the index or the platform manifest).
    Signed { digest: Digest },
    /// No valid signature, accepted because `trust.allow_unsigned` is true.
    AllowedUnsigned { reasons: Vec<String> },
}

impl Policy {
    /// A policy from loaded keys. With no keys and `allow_unsigned` false it
    /// is refused (no image could ever pass): decided here, before anything
    /// is resolved or fetched.
    pub fn usable(keys: TrustedKeys, allow_unsigned: bool) -> Result<Policy, VerifyError> {
        if keys.is_empty() && !allow_unsigned {
            return Err(VerifyError::NoKeys);
        }
        Ok(Policy::new(keys, allow_unsigned))
    }

    /// A policy from keys already in memory (the builder checks its output
    /// with the public half of the key it signed with).
    pub fn new(keys: TrustedKeys, allow_unsigned: bool) -> Policy {
        Policy {
            keys,
            allow_unsigned,
            identity: None,
        }
    }

    /// The same policy, accepting only signatures whose
    /// `docker-reference` names `identity` (the activator always sets it; a
    /// `None` accepts any identity, as the builder does when it checks a
    /// signature it just made).
    pub fn with_identity(mut self, identity: Option<Identity>) -> Policy {
        self.identity = identity;
        self
    }

    /// The identity signatures must name, when one is required.
    pub fn identity(&self) -> Option<&Identity> {
        self.identity.as_ref()
    }

    /// The default policy: no keys, unsigned refused. Accepts nothing.
    pub fn refuse_all() -> Policy {
        Policy::new(TrustedKeys::default(), false)
    }
}

/// Checks `image` against `policy`. Reads only the `.sig` artifacts and
/// their payloads, never a layer.
pub fn check(
    source: &Source,
    image: &SelectedImage,
    policy: &Policy,
) -> Result<Verdict, VerifyError> {
    let top = image.image_digest();
    if policy.keys.is_empty() && !policy.allow_unsigned {
        return Err(VerifyError::NoKeys);
    }
    let mut digests = vec![top];
    if image.manifest_digest() != top {
        digests.push(image.manifest_digest());
    }
    let mut reasons = Vec::new();
    for digest in digests {
        let sig = source
            .signature(&digest)
            .map_err(|error| VerifyError::Source {
                image: top,
                error: Box::new(error),
            })?;
        let Some(sig) = sig else {
            reasons.push(format!("no signature on {digest}"));
            continue;
        };
        let result = signature::verify(
            &policy.keys,
            digest,
            policy.identity.as_ref(),
            &sig,
            |layer| {
                source
                    .read_blob(layer, MAX_PAYLOAD_BYTES.min(MAX_DOCUMENT_BYTES))
                    .map_err(|e| std::io::Error::other(e.to_string()))
            },
        );
        match result {
            Ok(()) => return Ok(Verdict::Signed { digest }),
            Err(e) => reasons.push(e.to_string()),
        }
    }
    if policy.allow_unsigned {
        return Ok(Verdict::AllowedUnsigned { reasons });
    }
    Err(VerifyError::Refused {
        image: top,
        reasons,
    })
}
