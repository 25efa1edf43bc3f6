//! Keyless (Sigstore) signature verification, offline: what GitHub
//! Actions + cosign publish, checked against a `trusted_root.json` the host
//! was given, with no network and no clock.
//!
//! Given a [`KeylessPolicy`] (the trusted root and the certificate
//! [`Rules`]) and signature material (a Sigstore bundle, or a legacy
//! cosign layer's certificate, signature and Rekor bundle), it checks, for
//! one log entry:
//!
//! 1. nothing it cannot check yet: Rekor v2 entries, and material whose
//!    only time is an RFC 3161 timestamp, are refused as not supported yet
//!    (fail closed); RFC 3161 timestamps beside a Rekor SET (what cosign 3
//!    writes) are neither checked nor used: the SET's time decides;
//! 2. the Rekor SET with the key of a transparency log of the trusted root,
//!    valid at the entry's integrated time; the inclusion proof and its
//!    signed checkpoint (required from bundle v0.2 on);
//! 3. the certificate chain to a Fulcio CA of the trusted root valid at the
//!    integrated time (the host clock is never read: a ten-minute
//!    certificate is judged at the moment the log saw the signature), the
//!    code-signing usage, and an embedded SCT from a CT log of the root when
//!    the policy requires one; a root certificate the material supplies
//!    itself is refused, never trusted;
//! 4. the signature with the certificate's key, and the log entry's body
//!    bound to this signature, certificate and payload digest
//!    (GHSA-whqx-f9j3-ch6m);
//! 5. the certificate's issuer, identity and GitHub claims against the
//!    policy;
//! 6. what was signed: the artifact digest of a message signature, or the
//!    subjects of a DSSE in-toto statement.
//!
//! Every refusal after the certificate is read names its SAN and issuer
//! and the rule that failed. [`oci`] finds the material for an image (the
//! `.sig` artifact's layers, bundles among the referrers) and applies
//! `trust.identity`; [`crate::verify`] calls it.

pub mod bundle;
pub mod cert;
pub mod chain;
pub mod crypto;
pub mod oci;
pub mod policy;
pub mod rekor;
pub mod root;

use serde::Deserialize;

use self::bundle::{Bundle, Content, ParseError, IN_TOTO_PAYLOAD_TYPE};
use self::cert::Cert;
use self::policy::claims;
pub use self::policy::{GithubRule, IdentityRule, Rules};
use self::rekor::{Entry, Expected, Kind, Unsupported};
pub use self::root::TrustedRoot;

/// A host's keyless policy: the trusted root and the certificate rules.
#[derive(Clone, Debug)]
pub struct KeylessPolicy {
    pub root: TrustedRoot,
    pub rules: Rules,
}

/// What a verified keyless signature says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    /// The certificate's identity (SAN).
    pub san: String,
    /// The OIDC issuer.
    pub issuer: String,
    /// When the log recorded it (Unix seconds).
    pub integrated_time: i64,
    pub log_index: i64,
    /// For a DSSE statement: the `name` of the subject that matched, when
    /// it has one.
    pub subject_name: Option<String>,
    /// For a DSSE statement: its predicate type (a signature is
    /// [`COSIGN_SIGN_PREDICATE`]; [`oci`] refuses anything else).
    pub predicate_type: Option<String>,
}

/// Why keyless material was refused.
#[derive(Debug, thiserror::Error)]
pub enum KeylessError {
    #[error("{0}")]
    Malformed(String),
    #[error("{what} are not supported yet: refused (fail closed)")]
    Unsupported { what: String },
    #[error("signed with a key, not keylessly (the bundle carries a public key hint, no certificate): trust.keyless does not apply")]
    KeyBased,
    #[error("certificate {san} (issuer {issuer}): {rule}")]
    Refused {
        san: String,
        issuer: String,
        rule: String,
    },
}

/// What the signature must cover: the SHA-256 of an artifact (a message
/// signature's artifact, a DSSE statement's subject; for images, the
/// manifest digest).
#[derive(Clone, Copy, Debug)]
pub struct Target(pub [u8; 32]);

/// What the certificate's key signed.
enum Signed<'a> {
    /// A SHA-256 digest (a message signature, a legacy payload).
    Prehashed([u8; 32]),
    /// DSSE's pre-authentication encoding.
    Pae(&'a [u8]),
}

/// One signature's material, whichever container it came in.
struct Material<'a> {
    leaf: &'a Cert,
    extra: &'a [Cert],
    entries: &'a [Entry],
    signature: &'a [u8],
    signed: Signed<'a>,
    /// SHA-256 of what the log entry must record.
    body_digest: [u8; 32],
    need_proof: bool,
    timestamps: bool,
    /// Which entry kinds fit the content.
    kinds: &'a [Kind],
}

impl KeylessPolicy {
    fn refused(&self, cert: &Cert, rule: impl Into<String>) -> KeylessError {
        let c = claims(cert);
        KeylessError::Refused {
            san: c.san,
            issuer: c.issuer,
            rule: rule.into(),
        }
    }

    /// Steps 1 to 5 of the module docs for one signature.
    fn verify_material(&self, m: &Material<'_>) -> Result<Verified, KeylessError> {
        let refuse = |rule: String| self.refused(m.leaf, rule);
        let [entry] = m.entries else {
            return Err(refuse(format!(
                "{} transparency log entries, not one",
                m.entries.len()
            )));
        };
        let kind = entry.kind().map_err(|u| match u {
            Unsupported::Malformed(why) => refuse(why),
            Unsupported::Later(what) => KeylessError::Unsupported { what },
        })?;
        // The SET's integrated time is the time every check uses. A bundle
        // whose only time is an RFC 3161 timestamp cannot be checked yet;
        // one that also has a SET is judged on the SET alone (its
        // timestamps are neither checked nor used).
        if m.timestamps && entry.set.is_none() {
            return Err(KeylessError::Unsupported {
                what: "RFC 3161 timestamps (without a Rekor signed entry timestamp)".into(),
            });
        }
        if let Some(root) = m.extra.iter().find(|c| c.is_self_issued()) {
            return Err(refuse(format!(
                "the signature material supplies its own root certificate ({}): only the CAs of trust.keyless.trusted_root are trusted",
                root.subject_summary()
            )));
        }
        if !m.kinds.contains(&kind) {
            return Err(refuse(format!(
                "a {kind:?} log entry does not record this kind of signature"
            )));
        }
        let log = self.root.tlog(&entry.log_id).ok_or_else(|| {
            refuse(format!(
                "the log entry is from log {}, not a transparency log of the trusted root",
                hex::encode(&entry.log_id)
            ))
        })?;
        let t = entry.integrated_time;
        if !log.valid.contains(t) {
            return Err(refuse(format!(
                "the key of log {} was not valid at the entry's time {}",
                log.base_url,
                crate::time::rfc3339_seconds(t.max(0) as u64)
            )));
        }
        entry.verify_set(log).map_err(refuse)?;
        if m.need_proof || entry.proof.is_some() {
            entry.verify_inclusion(log, m.need_proof).map_err(refuse)?;
        }
        let issuer = chain::verify_chain(m.leaf, &self.root, t).map_err(refuse)?;
        m.leaf.check_leaf_usage().map_err(refuse)?;
        if self.rules.require_sct {
            chain::verify_sct(m.leaf, issuer, &self.root).map_err(refuse)?;
        }
        let key = m.leaf.key().map_err(refuse)?;
        let valid = match &m.signed {
            Signed::Prehashed(d) => key.verify_prehashed(d, m.signature),
            Signed::Pae(pae) => key.verify(key.default_hash(), pae, m.signature),
        };
        if !valid {
            return Err(refuse(
                "the signature does not verify with the certificate's key".into(),
            ));
        }
        entry
            .check_body(
                kind,
                &Expected {
                    signature: m.signature,
                    cert: m.leaf,
                    digest: m.body_digest,
                },
            )
            .map_err(|why| refuse(format!("{why} (the entry is not this signature's)")))?;
        self.rules.check(m.leaf).map_err(refuse)?;
        let c = claims(m.leaf);
        Ok(Verified {
            san: c.san,
            issuer: c.issuer,
            integrated_time: t,
            log_index: entry.log_index,
            subject_name: None,
            predicate_type: None,
        })
    }

    /// Verifies a Sigstore bundle (v0.1 to v0.3) covering `target`.
    pub fn verify_bundle(&self, bytes: &[u8], target: Target) -> Result<Verified, KeylessError> {
        let b = Bundle::parse(bytes).map_err(|e| match e {
            ParseError::Malformed(why) => KeylessError::Malformed(format!("bundle: {why}")),
            ParseError::Unsupported(what) => KeylessError::Unsupported { what },
            ParseError::KeyBased => KeylessError::KeyBased,
        })?;
        let need_proof = b.version >= 2;
        match &b.content {
            Content::Message { digest, signature } => {
                // The digest is a hint; the artifact's own hash is what the
                // log entry and the signature must cover.
                if digest.as_slice() != target.0 {
                    return Err(self.refused(
                        &b.leaf,
                        format!(
                            "the bundle's message digest {} is not the artifact's sha256:{}",
                            hex::encode(digest),
                            hex::encode(target.0)
                        ),
                    ));
                }
                self.verify_material(&Material {
                    leaf: &b.leaf,
                    extra: &b.extra,
                    entries: &b.entries,
                    signature,
                    signed: Signed::Prehashed(target.0),
                    body_digest: target.0,
                    need_proof,
                    timestamps: b.timestamps,
                    kinds: &[Kind::HashedRekord],
                })
            }
            Content::Dsse {
                payload_type,
                payload,
                signature,
            } => {
                let pae = bundle::pae(payload_type, payload);
                let mut verified = self.verify_material(&Material {
                    leaf: &b.leaf,
                    extra: &b.extra,
                    entries: &b.entries,
                    signature,
                    signed: Signed::Pae(&pae),
                    body_digest: crypto::sha256(payload),
                    need_proof,
                    timestamps: b.timestamps,
                    kinds: &[Kind::Dsse],
                })?;
                if payload_type != IN_TOTO_PAYLOAD_TYPE {
                    return Err(self.refused(
                        &b.leaf,
                        format!(
                            "the DSSE payload type {payload_type:?} is not an in-toto statement"
                        ),
                    ));
                }
                let (name, predicate) =
                    statement_subject(payload, target).map_err(|why| self.refused(&b.leaf, why))?;
                verified.subject_name = name;
                verified.predicate_type = Some(predicate);
                Ok(verified)
            }
        }
    }

    /// Verifies a legacy cosign signature: `signature` (DER) over content
    /// whose SHA-256 is `digest`, made by the PEM certificate `cert_pem`
    /// and logged in the Rekor bundle `rekor_bundle` (cosign's
    /// `dev.sigstore.cosign/bundle`). `chain_pem` (cosign's
    /// `dev.sigstore.cosign/chain`) is only checked for a root the material
    /// supplies itself; chains are built from the trusted root alone.
    pub fn verify_legacy(
        &self,
        digest: [u8; 32],
        signature: &[u8],
        cert_pem: &[u8],
        chain_pem: Option<&[u8]>,
        rekor_bundle: Option<&str>,
        timestamps: bool,
    ) -> Result<Verified, KeylessError> {
        let leaf = Cert::from_pem(cert_pem)
            .map_err(|e| KeylessError::Malformed(format!("signing certificate: {e}")))?;
        let extra = match chain_pem {
            Some(pem) => Cert::all_from_pem(pem)
                .map_err(|e| KeylessError::Malformed(format!("certificate chain: {e}")))?,
            None => Vec::new(),
        };
        // cosign writes the Fulcio intermediate and root into the chain
        // annotation; the root there is harmless only if it is one of the
        // trusted root's own CAs.
        let extra: Vec<Cert> = extra
            .into_iter()
            .filter(|c| {
                !self
                    .root
                    .authorities
                    .iter()
                    .any(|a| a.chain.iter().any(|t| t.der == c.der))
            })
            .collect();
        let Some(rekor_bundle) = rekor_bundle else {
            if timestamps {
                return Err(KeylessError::Unsupported {
                    what: "RFC 3161 timestamps (without a Rekor bundle)".into(),
                });
            }
            return Err(self.refused(
                &leaf,
                "no Rekor bundle (dev.sigstore.cosign/bundle): an unlogged keyless signature cannot be checked offline",
            ));
        };
        let entry = bundle::parse_rekor_bundle(rekor_bundle).map_err(|e| match e {
            ParseError::Malformed(why) | ParseError::Unsupported(why) => self.refused(&leaf, why),
            ParseError::KeyBased => KeylessError::KeyBased,
        })?;
        self.verify_material(&Material {
            leaf: &leaf,
            extra: &extra,
            entries: std::slice::from_ref(&entry),
            signature,
            signed: Signed::Prehashed(digest),
            body_digest: digest,
            need_proof: false,
            timestamps,
            kinds: &[Kind::HashedRekord, Kind::Rekord],
        })
    }
}

/// cosign's signature predicate: what `cosign sign` (v3, bundle format)
/// puts in its statement. An attestation (provenance, an SBOM, `cosign
/// attest`'s predicates) by the same identity names the digest too, but it
/// is no signature: it is refused.
pub const COSIGN_SIGN_PREDICATE: &str = "https://sigstore.dev/cosign/sign/v1";

#[derive(Deserialize)]
struct Statement {
    #[serde(rename = "_type")]
    kind: String,
    subject: Vec<Subject>,
    #[serde(rename = "predicateType", default)]
    predicate_type: String,
}

#[derive(Deserialize)]
struct Subject {
    #[serde(default)]
    name: String,
    #[serde(default)]
    digest: std::collections::BTreeMap<String, String>,
}

/// The in-toto statement's subject for `target`: its name, when it has one,
/// and the statement's predicate type.
fn statement_subject(payload: &[u8], target: Target) -> Result<(Option<String>, String), String> {
    let s: Statement = serde_json::from_slice(payload)
        .map_err(|e| format!("the DSSE payload is not an in-toto statement ({e})"))?;
    if !s.kind.starts_with("https://in-toto.io/Statement/") {
        return Err(format!("the statement type {:?} is not in-toto's", s.kind));
    }
    let want = hex::encode(target.0);
    let found = s.subject.iter().find(|sub| {
        sub.digest
            .get("sha256")
            .is_some_and(|d| d.eq_ignore_ascii_case(&want))
    });
    match found {
        Some(sub) => Ok((
            (!sub.name.is_empty()).then(|| sub.name.clone()),
            s.predicate_type,
        )),
        None => Err(format!(
            "the statement's subjects ({}) do not include sha256:{want}",
            s.subject
                .iter()
                .map(|sub| sub
                    .digest
                    .get("sha256")
                    .map_or("no sha256".to_string(), |d| format!("sha256:{d}")))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}
