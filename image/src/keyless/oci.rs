//! Keyless material of an OCI image: where it lies and what it must say
//! about the image.
//!
//! * Legacy cosign layers in the `.sig` artifact: a simple-signing payload
//!   naming the digest (and, with `trust.identity`, the repository), with
//!   the certificate, chain and Rekor bundle annotations.
//! * Sigstore bundles (v0.3) among the image's referrers: manifests whose
//!   artifact type is the bundle media type, whose `subject` is the image,
//!   whose one layer is the bundle; found through the referrers API or its
//!   fallback tag `sha256-<hex>` ([`crate::source::Source::referrers`]).
//!   The bundle's DSSE statement must list the digest as a subject; a
//!   subject with a `name` must name `trust.identity` (cosign 3's `sign`
//!   writes no name: the certificate identity alone then vouches for the
//!   repository).
//!
//! Given the descriptors and a way to read them, it reads at most
//! [`MAX_REFERRERS`] bundles of at most [`MAX_BUNDLE_BYTES`] each, and
//! returns the first signature that verifies or every reason none did.

use base64::Engine as _;

use super::bundle::{
    ANNOTATION_BUNDLE, ANNOTATION_CERTIFICATE, ANNOTATION_CHAIN, ANNOTATION_RFC3161,
};
use super::{KeylessPolicy, Target, Verified};
use crate::digest::Digest;
use crate::oci::{Descriptor, Manifest, ANNOTATION_COSIGN_SIGNATURE, MEDIA_TYPE_SIMPLE_SIGNING};
use crate::reference::Identity;
use crate::signature::{Payload, COSIGN_TYPE, MAX_PAYLOAD_BYTES, MAX_SIGNATURE_LAYERS};

/// The artifact (and layer) media types of a bundle referrer.
pub const BUNDLE_MEDIA_TYPES: [&str; 2] = [
    "application/vnd.dev.sigstore.bundle.v0.3+json",
    "application/vnd.dev.sigstore.bundle+json;version=0.3",
];
/// Bundles larger than this are refused unread (real ones are 5–15 KB).
pub const MAX_BUNDLE_BYTES: u64 = 256 * 1024;
/// At most this many referrers are looked at.
pub const MAX_REFERRERS: usize = 16;

fn repository_check(expected: Option<&Identity>, named: &str) -> Result<(), String> {
    let Some(expected) = expected else {
        return Ok(());
    };
    match Identity::of_reference(named) {
        Ok(found) if &found == expected => Ok(()),
        Ok(found) => Err(format!(
            "it names repository {found}, not {expected} (trust.identity): a signature for another repository does not count"
        )),
        Err(_) => Err(format!(
            "it names {named:?}, not repository {expected} (trust.identity)"
        )),
    }
}

/// Verifies the keyless layers (those with a certificate annotation) of a
/// `.sig` artifact for `digest`. `fetch_payload` returns a layer's bytes.
pub fn check_sig_layers(
    policy: &KeylessPolicy,
    digest: Digest,
    identity: Option<&Identity>,
    sig: &Manifest,
    mut fetch_payload: impl FnMut(&Descriptor) -> Result<Vec<u8>, String>,
) -> Result<Verified, Vec<String>> {
    let mut reasons = Vec::new();
    let keyless: Vec<&Descriptor> = sig
        .layers
        .iter()
        .filter(|l| l.annotations.contains_key(ANNOTATION_CERTIFICATE))
        .collect();
    if keyless.is_empty() {
        return Err(vec![format!(
            "no keyless signature layer in {}",
            digest.attachment_tag("sig")
        )]);
    }
    if sig.layers.len() > MAX_SIGNATURE_LAYERS {
        return Err(vec![format!(
            "its .sig artifact has {} layers, more than the {MAX_SIGNATURE_LAYERS} allowed",
            sig.layers.len()
        )]);
    }
    for layer in keyless {
        let at = format!("keyless signature layer {}", layer.digest);
        let mut fail = |why: String| reasons.push(format!("{at}: {why}"));
        if layer.media_type != MEDIA_TYPE_SIMPLE_SIGNING || layer.size > MAX_PAYLOAD_BYTES {
            fail(format!(
                "not a simple-signing payload of at most {MAX_PAYLOAD_BYTES} bytes"
            ));
            continue;
        }
        let payload = match fetch_payload(layer) {
            Ok(p) if Digest::of(&p) == layer.digest => p,
            Ok(_) => {
                fail("payload bytes do not match the layer digest".into());
                continue;
            }
            Err(e) => {
                fail(format!("cannot read payload: {e}"));
                continue;
            }
        };
        let parsed: Payload = match serde_json::from_slice(&payload) {
            Ok(p) => p,
            Err(e) => {
                fail(format!("payload is not simple signing JSON: {e}"));
                continue;
            }
        };
        if parsed.critical.kind != COSIGN_TYPE {
            fail(format!(
                "payload type {:?} is not {COSIGN_TYPE:?}",
                parsed.critical.kind
            ));
            continue;
        }
        if parsed.critical.image.docker_manifest_digest != digest {
            fail(format!(
                "payload names digest {}, not this image",
                parsed.critical.image.docker_manifest_digest
            ));
            continue;
        }
        let get = |k: &str| layer.annotations.get(k).map(String::as_str);
        let Some(signature) = get(ANNOTATION_COSIGN_SIGNATURE).and_then(|s| {
            base64::engine::general_purpose::STANDARD
                .decode(s.trim())
                .ok()
        }) else {
            fail("no base64 signature annotation".into());
            continue;
        };
        let result = policy.verify_legacy(
            *Digest::of(&payload).as_bytes(),
            &signature,
            get(ANNOTATION_CERTIFICATE).unwrap_or_default().as_bytes(),
            get(ANNOTATION_CHAIN).map(str::as_bytes),
            get(ANNOTATION_BUNDLE),
            get(ANNOTATION_RFC3161).is_some(),
        );
        let verified = match result {
            Ok(v) => v,
            Err(e) => {
                fail(e.to_string());
                continue;
            }
        };
        if let Err(why) = repository_check(identity, &parsed.critical.identity.docker_reference) {
            fail(format!(
                "certificate {} (issuer {}): {why}",
                verified.san, verified.issuer
            ));
            continue;
        }
        return Ok(verified);
    }
    Err(reasons)
}

/// Verifies the bundles among `referrers` (the referrers index of
/// `digest`). `read_manifest` reads a referrer manifest, `read_blob` a
/// bundle (size-capped by the caller with the given limit).
pub fn check_referrers(
    policy: &KeylessPolicy,
    digest: Digest,
    identity: Option<&Identity>,
    referrers: &[Descriptor],
    mut read_manifest: impl FnMut(&Descriptor) -> Result<Manifest, String>,
    mut read_blob: impl FnMut(&Descriptor, u64) -> Result<Vec<u8>, String>,
) -> Result<Verified, Vec<String>> {
    let mut reasons = Vec::new();
    let bundles: Vec<&Descriptor> = referrers
        .iter()
        .filter(|d| {
            d.artifact_type
                .as_deref()
                .is_none_or(|t| BUNDLE_MEDIA_TYPES.contains(&t))
        })
        .take(MAX_REFERRERS)
        .collect();
    if bundles.is_empty() {
        return Err(vec![format!(
            "no Sigstore bundle among the referrers of {digest}"
        )]);
    }
    for d in bundles {
        let at = format!("bundle referrer {}", d.digest);
        let manifest = match read_manifest(d) {
            Ok(m) => m,
            Err(e) => {
                reasons.push(format!("{at}: {e}"));
                continue;
            }
        };
        let artifact = manifest
            .artifact_type
            .as_deref()
            .unwrap_or(manifest.config.media_type.as_str());
        if !BUNDLE_MEDIA_TYPES.contains(&artifact) {
            continue; // another kind of referrer (an SBOM, a signature of another tool)
        }
        if manifest.subject.as_ref().map(|s| s.digest) != Some(digest) {
            reasons.push(format!("{at}: its subject is not {digest}"));
            continue;
        }
        let Some(layer) = manifest
            .layers
            .iter()
            .find(|l| BUNDLE_MEDIA_TYPES.contains(&l.media_type.as_str()))
        else {
            reasons.push(format!("{at}: no bundle layer"));
            continue;
        };
        if layer.size > MAX_BUNDLE_BYTES {
            reasons.push(format!(
                "{at}: bundle of {} bytes exceeds the {MAX_BUNDLE_BYTES}-byte limit",
                layer.size
            ));
            continue;
        }
        let bytes = match read_blob(layer, MAX_BUNDLE_BYTES) {
            Ok(b) => b,
            Err(e) => {
                reasons.push(format!("{at}: {e}"));
                continue;
            }
        };
        let verified = match policy.verify_bundle(&bytes, Target(*digest.as_bytes())) {
            Ok(v) => v,
            Err(e) => {
                reasons.push(format!("{at}: {e}"));
                continue;
            }
        };
        match (&verified.subject_name, identity) {
            (Some(name), _) => {
                if let Err(why) = repository_check(identity, name) {
                    reasons.push(format!(
                        "{at}: certificate {} (issuer {}): the statement's subject {why}",
                        verified.san, verified.issuer
                    ));
                    continue;
                }
            }
            (None, Some(expected)) if !policy.rules.allow_unnamed_subject => {
                reasons.push(format!(
                    "{at}: certificate {} (issuer {}): the bundle names no repository, so nothing binds it to {expected} (trust.identity): one identity may sign several images (ubuntu2404, ubuntu2404-nvidia); set trust.keyless.allow_unnamed_subject only where the certificate identity alone tells them apart",
                    verified.san, verified.issuer
                ));
                continue;
            }
            (None, _) => {}
        }
        if let Some(p) = verified
            .predicate_type
            .as_deref()
            .filter(|p| *p != super::COSIGN_SIGN_PREDICATE)
        {
            reasons.push(format!(
                "{at}: certificate {} (issuer {}): the statement's predicate type {p:?} is not cosign's signature ({}): an attestation of the same identity is not a signature",
                verified.san,
                verified.issuer,
                super::COSIGN_SIGN_PREDICATE
            ));
            continue;
        }
        return Ok(verified);
    }
    if reasons.is_empty() {
        reasons.push(format!(
            "no Sigstore bundle among the referrers of {digest}"
        ));
    }
    Err(reasons)
}
