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
//! With a keyless policy ([`crate::keyless`]), the same two digests are also
//! checked for keyless signatures: the `.sig` artifact's keyless layers and
//! the Sigstore bundles among the digest's referrers
//! ([`Source::referrers`]). Key-based and keyless signatures are
//! alternatives: either kind, valid, is enough.
//!
//! Unsigned or wrongly signed images are refused unless `allow_unsigned` is
//! true in the config; there is deliberately no command-line bypass. With
//! `allow_unsigned`, the outcome says why the image was accepted anyway.
//!
//! It does not fetch layers or decide where images come from.

use std::sync::Arc;

use serde::Serialize;

use crate::digest::Digest;
use crate::keyless::{self, KeylessPolicy};
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
    keyless: Option<Arc<KeylessPolicy>>,
}

/// Why an image was refused or the policy could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("trust policy: {0}")]
    Key(SignatureError),
    #[error("trust policy: no trusted keys (trust.public_keys is empty), no trust.keyless and trust.allow_unsigned is false: no image can be accepted")]
    NoKeys,
    #[error("trust.keyless: {0}")]
    Keyless(String),
    #[error("trust.identity {identity:?}: {reason}")]
    BadIdentity { identity: String, reason: String },
    #[error("trust.identity is required for an oci: or oci-archive: image unless trust.allow_unsigned: set it to the repository the image's signatures name (e.g. ghcr.io/example-org/kubeslot/ubuntu2404)")]
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
    /// A keyless signature on `digest` by the certificate identity `san`
    /// of `issuer`, logged at `integrated_time` (Unix seconds).
    Keyless {
        digest: Digest,
        san: String,
        issuer: String,
        integrated_time: i64,
    },
    /// No valid signature, accepted because `trust.allow_unsigned` is true.
    AllowedUnsigned { reasons: Vec<String> },
}

impl Policy {
    /// A policy from loaded keys. With no keys and `allow_unsigned` false it
    /// is refused (no image could ever pass): decided here, before anything
    /// is resolved or fetched.
    pub fn usable(keys: TrustedKeys, allow_unsigned: bool) -> Result<Policy, VerifyError> {
        Policy::usable_with(keys, None, allow_unsigned)
    }

    /// [`Policy::usable`] with an optional keyless policy beside the keys.
    pub fn usable_with(
        keys: TrustedKeys,
        keyless: Option<KeylessPolicy>,
        allow_unsigned: bool,
    ) -> Result<Policy, VerifyError> {
        if keys.is_empty() && keyless.is_none() && !allow_unsigned {
            return Err(VerifyError::NoKeys);
        }
        Ok(Policy::new(keys, allow_unsigned).with_keyless(keyless))
    }

    /// The same policy, also accepting keyless signatures that `keyless`
    /// accepts.
    pub fn with_keyless(mut self, keyless: Option<KeylessPolicy>) -> Policy {
        self.keyless = keyless.map(Arc::new);
        self
    }

    /// A policy from keys already in memory (the builder checks its output
    /// with the public half of the key it signed with).
    pub fn new(keys: TrustedKeys, allow_unsigned: bool) -> Policy {
        Policy {
            keys,
            allow_unsigned,
            identity: None,
            keyless: None,
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
    /// The trusted public keys (release statements are checked with them).
    pub fn keys(&self) -> &TrustedKeys {
        &self.keys
    }

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
    check_digests(
        source,
        image.image_digest(),
        image.manifest_digest(),
        policy,
    )
}

/// [`check`] given the two digests alone (`top`, what the reference
/// resolved to, and the platform `manifest`), so that a host decides trust
/// before it reads the manifest's config.
pub fn check_digests(
    source: &Source,
    top: Digest,
    manifest: Digest,
    policy: &Policy,
) -> Result<Verdict, VerifyError> {
    if policy.keys.is_empty() && policy.keyless.is_none() && !policy.allow_unsigned {
        return Err(VerifyError::NoKeys);
    }
    let mut digests = vec![top];
    if manifest != top {
        digests.push(manifest);
    }
    let mut reasons = Vec::new();
    for digest in digests {
        let sig = source
            .signature(&digest)
            .map_err(|error| VerifyError::Source {
                image: top,
                error: Box::new(error),
            })?;
        let read_payload = |layer: &crate::oci::Descriptor| {
            source
                .read_blob(layer, MAX_PAYLOAD_BYTES.min(MAX_DOCUMENT_BYTES))
                .map_err(|e| std::io::Error::other(e.to_string()))
        };
        match &sig {
            None if policy.keyless.is_none() => reasons.push(format!("no signature on {digest}")),
            None => {}
            Some(sig) if !policy.keys.is_empty() => {
                let result = signature::verify(
                    &policy.keys,
                    digest,
                    policy.identity.as_ref(),
                    sig,
                    read_payload,
                );
                match result {
                    Ok(()) => return Ok(Verdict::Signed { digest }),
                    // keyless layers are reported by the keyless check
                    Err(SignatureError::Missing { .. }) if policy.keyless.is_some() => {}
                    Err(e) => reasons.push(e.to_string()),
                }
            }
            Some(_) => {}
        }
        if let Some(k) = &policy.keyless {
            match check_keyless(
                source,
                k,
                policy.identity.as_ref(),
                digest,
                sig.as_ref(),
                top,
            )? {
                Ok(v) => {
                    return Ok(Verdict::Keyless {
                        digest,
                        san: v.san,
                        issuer: v.issuer,
                        integrated_time: v.integrated_time,
                    })
                }
                Err(why) => reasons.extend(why),
            }
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

/// The keyless signatures of `digest`: the `.sig` artifact's keyless
/// layers, then the bundles among its referrers. The outer error is a
/// source that could not be read (not "unsigned"); the inner one the
/// reasons nothing verified.
fn check_keyless(
    source: &Source,
    policy: &KeylessPolicy,
    identity: Option<&Identity>,
    digest: Digest,
    sig: Option<&crate::oci::Manifest>,
    top: Digest,
) -> Result<Result<keyless::Verified, Vec<String>>, VerifyError> {
    let source_err = |error| VerifyError::Source {
        image: top,
        error: Box::new(error),
    };
    let mut reasons = Vec::new();
    if let Some(sig) = sig {
        let read = |layer: &crate::oci::Descriptor| {
            source
                .read_blob(layer, MAX_PAYLOAD_BYTES.min(MAX_DOCUMENT_BYTES))
                .map_err(|e| e.to_string())
        };
        match keyless::oci::check_sig_layers(policy, digest, identity, sig, read) {
            Ok(v) => return Ok(Ok(v)),
            Err(why) => reasons.extend(why),
        }
    }
    let referrers = source.referrers(&digest).map_err(source_err)?;
    let result = keyless::oci::check_referrers(
        policy,
        digest,
        identity,
        &referrers,
        |d| source.read_json(d).map_err(|e| e.to_string()),
        |d, limit| source.read_blob(d, limit).map_err(|e| e.to_string()),
    );
    match result {
        Ok(v) => Ok(Ok(v)),
        Err(why) => {
            reasons.extend(why);
            Ok(Err(reasons))
        }
    }
}
