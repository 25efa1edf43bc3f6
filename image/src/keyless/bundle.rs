//! The two containers keyless signatures come in, parsed into the same
//! parts (certificate, log entries, what was signed):
//!
//! * a Sigstore bundle (`application/vnd.dev.sigstore.bundle…`, v0.1 to
//!   v0.3): protobuf JSON with the certificate (or a chain), the Rekor
//!   entries and either a message signature or a DSSE envelope;
//! * cosign's legacy layer annotations (`dev.sigstore.cosign/certificate`,
//!   `dev.sigstore.cosign/chain`, `dev.sigstore.cosign/bundle` beside the
//!   `dev.cosignproject.cosign/signature`), also the shape of `cosign
//!   sign-blob --bundle` files.
//!
//! Parsing checks shapes only; [`crate::keyless`] verifies.

use serde::Deserialize;

use super::cert::Cert;
use super::crypto::b64;
use super::rekor::{Entry, InclusionProof};
use super::root::{ChainJson, RawBytesJson};

/// cosign's annotation holding the PEM leaf certificate of a keyless layer.
pub const ANNOTATION_CERTIFICATE: &str = "dev.sigstore.cosign/certificate";
/// cosign's annotation holding the PEM chain (never trusted: only the
/// trusted root's CAs are).
pub const ANNOTATION_CHAIN: &str = "dev.sigstore.cosign/chain";
/// cosign's annotation holding the Rekor bundle (SET and entry).
pub const ANNOTATION_BUNDLE: &str = "dev.sigstore.cosign/bundle";
/// An annotation cosign writes for RFC 3161 timestamps (refused for now).
pub const ANNOTATION_RFC3161: &str = "dev.sigstore.cosign/rfc3161timestamp";

/// The in-toto payload type of a DSSE envelope.
pub const IN_TOTO_PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";

/// What a bundle's signature covers.
#[derive(Clone, Debug)]
pub enum Content {
    /// A signature over an artifact, with the artifact's SHA-256 as a hint.
    Message { digest: Vec<u8>, signature: Vec<u8> },
    /// A DSSE envelope with exactly one signature.
    Dsse {
        payload_type: String,
        payload: Vec<u8>,
        signature: Vec<u8>,
    },
}

/// A parsed Sigstore bundle.
#[derive(Clone, Debug)]
pub struct Bundle {
    /// The minor version: 1, 2 or 3.
    pub version: u8,
    pub leaf: Cert,
    /// Certificates after the leaf in an `x509CertificateChain`.
    pub extra: Vec<Cert>,
    pub entries: Vec<Entry>,
    pub content: Content,
    /// Whether the bundle carries RFC 3161 timestamps.
    pub timestamps: bool,
}

/// Why a bundle was not parsed: malformed, or something not supported
/// (yet), said as such.
#[derive(Debug)]
pub enum ParseError {
    Malformed(String),
    Unsupported(String),
    /// Signed with a key (`publicKey`), not keyless.
    KeyBased,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BundleJson {
    media_type: String,
    verification_material: MaterialJson,
    #[serde(default)]
    message_signature: Option<MessageJson>,
    #[serde(default)]
    dsse_envelope: Option<DsseJson>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MaterialJson {
    #[serde(default)]
    certificate: Option<RawBytesJson>,
    #[serde(default)]
    x509_certificate_chain: Option<ChainJson>,
    #[serde(default)]
    public_key: Option<serde_json::Value>,
    #[serde(default)]
    tlog_entries: Vec<EntryJson>,
    #[serde(default)]
    timestamp_verification_data: Option<TimestampsJson>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TimestampsJson {
    #[serde(default)]
    rfc3161_timestamps: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct EntryJson {
    log_index: Int,
    log_id: LogIdJson,
    #[serde(default)]
    integrated_time: Option<Int>,
    #[serde(default)]
    inclusion_promise: Option<PromiseJson>,
    #[serde(default)]
    inclusion_proof: Option<ProofJson>,
    canonicalized_body: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogIdJson {
    key_id: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PromiseJson {
    signed_entry_timestamp: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProofJson {
    log_index: Int,
    root_hash: String,
    tree_size: Int,
    #[serde(default)]
    hashes: Vec<String>,
    #[serde(default)]
    checkpoint: Option<CheckpointJson>,
}

#[derive(Deserialize)]
struct CheckpointJson {
    envelope: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MessageJson {
    message_digest: DigestJson,
    signature: String,
}

#[derive(Deserialize)]
struct DigestJson {
    algorithm: String,
    digest: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DsseJson {
    payload: String,
    payload_type: String,
    signatures: Vec<DsseSigJson>,
}

#[derive(Deserialize)]
struct DsseSigJson {
    sig: String,
}

/// An int64 as protobuf JSON writes it (a string) or as a number.
enum Int {
    Number(i64),
    Text(String),
}

impl<'de> Deserialize<'de> for Int {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Int, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Int;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an integer or a string")
            }
            fn visit_i64<E>(self, v: i64) -> Result<Int, E> {
                Ok(Int::Number(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Int, E> {
                i64::try_from(v)
                    .map(Int::Number)
                    .map_err(|_| E::custom("integer out of range"))
            }
            fn visit_str<E>(self, v: &str) -> Result<Int, E> {
                Ok(Int::Text(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

impl Int {
    fn get(&self, what: &str) -> Result<i64, ParseError> {
        match self {
            Int::Number(n) => Ok(*n),
            Int::Text(t) => t
                .parse()
                .map_err(|_| ParseError::Malformed(format!("{what} {t:?} is not an integer"))),
        }
    }
}

fn malformed(what: &str) -> impl Fn(String) -> ParseError + '_ {
    move |e| ParseError::Malformed(format!("{what}: {e}"))
}

fn non_negative(v: i64, what: &str) -> Result<i64, ParseError> {
    if v < 0 {
        return Err(ParseError::Malformed(format!("{what} {v} is negative")));
    }
    Ok(v)
}

/// The bundle media types read here, with their minor version.
fn bundle_version(media_type: &str) -> Option<u8> {
    match media_type {
        "application/vnd.dev.sigstore.bundle+json;version=0.1" => Some(1),
        "application/vnd.dev.sigstore.bundle+json;version=0.2" => Some(2),
        "application/vnd.dev.sigstore.bundle+json;version=0.3"
        | "application/vnd.dev.sigstore.bundle.v0.3+json" => Some(3),
        _ => None,
    }
}

impl Bundle {
    pub fn parse(bytes: &[u8]) -> Result<Bundle, ParseError> {
        let json: BundleJson = serde_json::from_slice(bytes)
            .map_err(|e| ParseError::Malformed(format!("not a Sigstore bundle ({e})")))?;
        let version = bundle_version(&json.media_type).ok_or_else(|| {
            ParseError::Malformed(format!(
                "media type {:?} is not a bundle version this verifier reads (v0.1 to v0.3)",
                json.media_type
            ))
        })?;
        let m = json.verification_material;
        if m.public_key.is_some() {
            return Err(ParseError::KeyBased);
        }
        let mut certs = match (m.certificate, m.x509_certificate_chain) {
            (Some(c), None) => vec![c],
            (None, Some(chain)) => chain.certificates,
            _ => {
                return Err(ParseError::Malformed(
                    "the bundle must carry exactly one of certificate and x509CertificateChain"
                        .into(),
                ))
            }
        }
        .into_iter()
        .map(|c| {
            b64(&c.raw_bytes)
                .and_then(Cert::from_der)
                .map_err(malformed("bundle certificate"))
        })
        .collect::<Result<Vec<_>, _>>()?;
        if certs.is_empty() {
            return Err(ParseError::Malformed(
                "the bundle's certificate chain is empty".into(),
            ));
        }
        let leaf = certs.remove(0);
        let mut entries = Vec::new();
        for e in m.tlog_entries {
            let proof = match e.inclusion_proof {
                None => None,
                Some(p) => Some(InclusionProof {
                    log_index: non_negative(
                        p.log_index.get("inclusion proof logIndex")?,
                        "inclusion proof logIndex",
                    )? as u64,
                    tree_size: non_negative(p.tree_size.get("treeSize")?, "treeSize")? as u64,
                    root_hash: b64(&p.root_hash).map_err(malformed("rootHash"))?,
                    hashes: p
                        .hashes
                        .iter()
                        .map(|h| b64(h).map_err(malformed("inclusion proof hash")))
                        .collect::<Result<_, _>>()?,
                    checkpoint: p.checkpoint.map(|c| c.envelope),
                }),
            };
            entries.push(Entry {
                log_id: b64(&e.log_id.key_id).map_err(malformed("logId"))?,
                log_index: non_negative(e.log_index.get("logIndex")?, "logIndex")?,
                integrated_time: match e.integrated_time {
                    Some(t) => t.get("integratedTime")?,
                    None => 0,
                },
                body: b64(&e.canonicalized_body).map_err(malformed("canonicalizedBody"))?,
                set: match e.inclusion_promise {
                    Some(p) => Some(
                        b64(&p.signed_entry_timestamp)
                            .map_err(malformed("signedEntryTimestamp"))?,
                    ),
                    None => None,
                },
                proof,
            });
        }
        let content = match (json.message_signature, json.dsse_envelope) {
            (Some(ms), None) => {
                if ms.message_digest.algorithm != "SHA2_256" {
                    return Err(ParseError::Unsupported(format!(
                        "message digest algorithm {}",
                        ms.message_digest.algorithm
                    )));
                }
                Content::Message {
                    digest: b64(&ms.message_digest.digest).map_err(malformed("messageDigest"))?,
                    signature: b64(&ms.signature).map_err(malformed("message signature"))?,
                }
            }
            (None, Some(env)) => {
                let [sig] = env.signatures.as_slice() else {
                    return Err(ParseError::Malformed(format!(
                        "the DSSE envelope has {} signatures, not one",
                        env.signatures.len()
                    )));
                };
                Content::Dsse {
                    payload_type: env.payload_type,
                    payload: b64(&env.payload).map_err(malformed("DSSE payload"))?,
                    signature: b64(&sig.sig).map_err(malformed("DSSE signature"))?,
                }
            }
            _ => {
                return Err(ParseError::Malformed(
                    "the bundle must carry exactly one of messageSignature and dsseEnvelope".into(),
                ))
            }
        };
        Ok(Bundle {
            version,
            leaf,
            extra: certs,
            entries,
            content,
            timestamps: m
                .timestamp_verification_data
                .is_some_and(|t| !t.rfc3161_timestamps.is_empty()),
        })
    }
}

/// DSSE's pre-authentication encoding: what the envelope's signature is
/// over.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut v = format!(
        "DSSEv1 {} {} {} ",
        payload_type.len(),
        payload_type,
        payload.len()
    )
    .into_bytes();
    v.extend_from_slice(payload);
    v
}

/// The Rekor bundle cosign stores in `dev.sigstore.cosign/bundle` (and in
/// `sign-blob --bundle` files as `rekorBundle`).
#[derive(Deserialize)]
struct RekorBundleJson {
    #[serde(rename = "SignedEntryTimestamp")]
    set: String,
    #[serde(rename = "Payload")]
    payload: RekorPayloadJson,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RekorPayloadJson {
    body: String,
    integrated_time: Int,
    log_index: Int,
    #[serde(rename = "logID")]
    log_id: String,
}

/// Parses cosign's Rekor bundle: an entry with a SET and no inclusion
/// proof.
pub fn parse_rekor_bundle(json: &str) -> Result<Entry, ParseError> {
    let b: RekorBundleJson = serde_json::from_str(json)
        .map_err(|e| ParseError::Malformed(format!("Rekor bundle: {e}")))?;
    Ok(Entry {
        log_id: hex::decode(&b.payload.log_id)
            .map_err(|e| malformed("Rekor bundle logID")(e.to_string()))?,
        log_index: non_negative(b.payload.log_index.get("logIndex")?, "logIndex")?,
        integrated_time: b.payload.integrated_time.get("integratedTime")?,
        body: b64(&b.payload.body).map_err(malformed("Rekor bundle body"))?,
        set: Some(b64(&b.set).map_err(malformed("SignedEntryTimestamp"))?),
        proof: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pae_matches_the_dsse_spec_example() {
        // DSSE protocol.md: PAE("http://example.com/HelloWorld", "hello world")
        assert_eq!(
            pae("http://example.com/HelloWorld", b"hello world"),
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world".to_vec()
        );
    }
}
