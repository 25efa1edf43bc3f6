//! Sigstore's `trusted_root.json`: the only place keyless verification
//! takes keys and certificate authorities from. A bundle or a signature
//! layer never adds to it (a root or log key it carries is ignored or
//! refused, never trusted).
//!
//! Given the file's bytes, [`TrustedRoot::parse`] keeps the transparency
//! logs (Rekor), the CT logs and the Fulcio CAs, each with its validity
//! interval (closed: the end is inclusive). An entry without a `validFor`
//! start is refused: a missing bound is a malformed root, not an unbounded
//! one. Timestamp authorities are not read (RFC 3161 timestamps are refused
//! by [`crate::keyless`] until they are supported).

use serde::Deserialize;

use super::cert::Cert;
use super::crypto::{b64, Key};
use crate::time::parse_rfc3339;

/// A validity interval in Unix seconds, both ends inclusive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validity {
    pub start: i64,
    pub end: Option<i64>,
}

impl Validity {
    pub fn contains(&self, t: i64) -> bool {
        t >= self.start && self.end.is_none_or(|e| t <= e)
    }
}

/// A log's key (Rekor or CT): its ID is the SHA-256 of its DER key. A key
/// of a kind not supported (Rekor v2's Ed25519) is kept as the reason it
/// cannot verify anything: the rest of the root stays usable.
#[derive(Clone, Debug)]
pub struct LogKey {
    pub id: Vec<u8>,
    pub key: Result<Key, String>,
    pub valid: Validity,
    pub base_url: String,
}

/// A Fulcio CA: its chain, intermediate first, root last.
#[derive(Clone, Debug)]
pub struct Authority {
    pub uri: String,
    pub chain: Vec<Cert>,
    pub valid: Validity,
}

/// The parsed trusted root.
#[derive(Clone, Debug)]
pub struct TrustedRoot {
    pub tlogs: Vec<LogKey>,
    pub ctlogs: Vec<LogKey>,
    pub authorities: Vec<Authority>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RootJson {
    media_type: String,
    #[serde(default)]
    tlogs: Vec<LogJson>,
    #[serde(default)]
    ctlogs: Vec<LogJson>,
    #[serde(default)]
    certificate_authorities: Vec<CaJson>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogJson {
    #[serde(default)]
    base_url: String,
    public_key: PublicKeyJson,
    log_id: LogIdJson,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PublicKeyJson {
    #[serde(default)]
    raw_bytes: String,
    #[serde(default)]
    valid_for: Option<ValidForJson>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogIdJson {
    key_id: String,
}

#[derive(Deserialize)]
struct ValidForJson {
    #[serde(default)]
    start: Option<String>,
    #[serde(default)]
    end: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CaJson {
    #[serde(default)]
    uri: String,
    cert_chain: ChainJson,
    #[serde(default)]
    valid_for: Option<ValidForJson>,
}

#[derive(Deserialize)]
pub(crate) struct ChainJson {
    #[serde(default)]
    pub(crate) certificates: Vec<RawBytesJson>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RawBytesJson {
    pub(crate) raw_bytes: String,
}

/// The media types of the trusted roots we read.
const MEDIA_TYPES: [&str; 2] = [
    "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
    "application/vnd.dev.sigstore.trustedroot.v0.2+json",
];

fn validity(what: &str, v: Option<&ValidForJson>) -> Result<Validity, String> {
    let v = v.ok_or_else(|| format!("{what}: no validFor"))?;
    let start = v
        .start
        .as_deref()
        .ok_or_else(|| format!("{what}: validFor has no start (a missing bound is refused)"))?;
    let start = parse_rfc3339(start)
        .ok_or_else(|| format!("{what}: validFor.start {start:?} is not an RFC 3339 time"))?;
    let end = match v.end.as_deref() {
        None => None,
        Some(e) => Some(
            parse_rfc3339(e)
                .ok_or_else(|| format!("{what}: validFor.end {e:?} is not an RFC 3339 time"))?,
        ),
    };
    Ok(Validity { start, end })
}

fn log(kind: &str, l: &LogJson) -> Result<LogKey, String> {
    let what = format!("{kind} {}", l.base_url);
    let der = b64(&l.public_key.raw_bytes).map_err(|e| format!("{what}: publicKey: {e}"))?;
    let key = Key::from_spki_der(&der).map_err(|e| format!("{what}: publicKey: {e}"));
    let id = b64(&l.log_id.key_id).map_err(|e| format!("{what}: logId: {e}"))?;
    Ok(LogKey {
        id,
        key,
        valid: validity(&what, l.public_key.valid_for.as_ref())?,
        base_url: l.base_url.clone(),
    })
}

impl LogKey {
    /// Checks a signature with this log's key (SHA-256, as logs sign).
    pub fn verify(&self, message: &[u8], signature_der: &[u8]) -> Result<bool, String> {
        match &self.key {
            Ok(k) => Ok(k.verify(super::crypto::Hash::Sha256, message, signature_der)),
            Err(e) => Err(e.clone()),
        }
    }
}

impl TrustedRoot {
    /// Parses a `trusted_root.json`; the error says which entry is wrong.
    pub fn parse(bytes: &[u8]) -> Result<TrustedRoot, String> {
        let json: RootJson =
            serde_json::from_slice(bytes).map_err(|e| format!("not a trusted root: {e}"))?;
        if !MEDIA_TYPES.contains(&json.media_type.as_str()) {
            return Err(format!(
                "media type {:?} is not a trusted root this verifier reads ({})",
                json.media_type,
                MEDIA_TYPES.join(", ")
            ));
        }
        let tlogs = json
            .tlogs
            .iter()
            .map(|l| log("tlog", l))
            .collect::<Result<Vec<_>, _>>()?;
        let ctlogs = json
            .ctlogs
            .iter()
            .map(|l| log("ctlog", l))
            .collect::<Result<Vec<_>, _>>()?;
        let mut authorities = Vec::new();
        for ca in &json.certificate_authorities {
            let what = format!("certificate authority {}", ca.uri);
            let mut chain = Vec::new();
            for c in &ca.cert_chain.certificates {
                let der = b64(&c.raw_bytes).map_err(|e| format!("{what}: {e}"))?;
                chain.push(Cert::from_der(der).map_err(|e| format!("{what}: {e}"))?);
            }
            if chain.is_empty() {
                return Err(format!("{what}: empty certificate chain"));
            }
            authorities.push(Authority {
                uri: ca.uri.clone(),
                chain,
                valid: validity(&what, ca.valid_for.as_ref())?,
            });
        }
        if tlogs.is_empty() || authorities.is_empty() {
            return Err("names no transparency log or no certificate authority".into());
        }
        Ok(TrustedRoot {
            tlogs,
            ctlogs,
            authorities,
        })
    }

    /// The transparency log with this ID.
    pub fn tlog(&self, id: &[u8]) -> Option<&LogKey> {
        self.tlogs.iter().find(|l| l.id == id)
    }

    /// The CT log with this ID.
    pub fn ctlog(&self, id: &[u8]) -> Option<&LogKey> {
        self.ctlogs.iter().find(|l| l.id == id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_intervals() {
        let v = Validity {
            start: 10,
            end: Some(20),
        };
        assert!(v.contains(10) && v.contains(20) && !v.contains(9) && !v.contains(21));
        assert!(Validity {
            start: 10,
            end: None
        }
        .contains(i64::MAX));
    }
}
