//! Fulcio certificates: parsing, the chain to a CA of the trusted root at
//! a given time, the leaf's usage, its identity (SAN, OIDC issuer, the
//! GitHub claims Fulcio records) and its embedded SCTs.
//!
//! Given DER bytes and a [`TrustedRoot`], it answers "was this leaf issued
//! by a Fulcio CA we trust, valid at time T" and "what does it claim".
//! Time always comes from the caller (the log's integrated time), never
//! from the host clock: a Fulcio certificate lives ten minutes, the log's
//! signed time is what proves the signature was made inside them.
//! It does not decide whether the claims are acceptable
//! ([`crate::keyless::policy`]).

use x509_cert::der::asn1::{ObjectIdentifier, OctetString, Utf8StringRef};
use x509_cert::der::{Decode as _, Encode as _, Header, Reader as _, SliceReader};
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::{BasicConstraints, ExtendedKeyUsage, KeyUsage, SubjectAltName};
use x509_cert::Certificate;

use super::crypto::{sha256, Hash, Key};
use super::root::TrustedRoot;

const OID_SAN: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.17");
const OID_KEY_USAGE: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.15");
const OID_EKU: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.37");
const OID_BASIC_CONSTRAINTS: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.19");
const OID_CODE_SIGNING: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.5.5.7.3.3");
/// RFC 6962 embedded SCT list.
const OID_SCT_LIST: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.11129.2.4.2");
/// Fulcio's OIDC issuer, deprecated form: the raw string, not DER.
pub const OID_ISSUER_V1: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.57264.1.1");
/// Fulcio's OIDC issuer, a DER UTF8String.
pub const OID_ISSUER_V2: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.57264.1.8");
/// Source Repository URI (e.g. `https://github.com/org/repo`).
pub const OID_SOURCE_REPOSITORY: ObjectIdentifier =
    ObjectIdentifier::new_unwrap("1.3.6.1.4.1.57264.1.12");
/// Source Repository Ref (e.g. `refs/tags/v1.2.3`).
pub const OID_SOURCE_REF: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.57264.1.14");
/// Build Config URI: the workflow file that ran, at its ref.
pub const OID_BUILD_CONFIG: ObjectIdentifier =
    ObjectIdentifier::new_unwrap("1.3.6.1.4.1.57264.1.18");

/// A parsed certificate with its exact DER bytes.
#[derive(Clone, Debug)]
pub struct Cert {
    pub der: Vec<u8>,
    pub parsed: Certificate,
}

/// The OIDC issuer a certificate names, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issuer {
    /// The 1.3.6.1.4.1.57264.1.8 value.
    pub v2: Option<String>,
    /// The deprecated 1.3.6.1.4.1.57264.1.1 value.
    pub v1: Option<String>,
}

impl Cert {
    pub fn from_der(der: Vec<u8>) -> Result<Cert, String> {
        let parsed =
            Certificate::from_der(&der).map_err(|e| format!("not a DER certificate ({e})"))?;
        Ok(Cert { der, parsed })
    }

    /// The first certificate of a PEM text.
    pub fn from_pem(pem: &[u8]) -> Result<Cert, String> {
        let text = std::str::from_utf8(pem).map_err(|_| "PEM is not UTF-8".to_string())?;
        let begin = "-----BEGIN CERTIFICATE-----";
        let end = "-----END CERTIFICATE-----";
        let start = text
            .find(begin)
            .ok_or_else(|| "no PEM certificate".to_string())?;
        let rest = &text[start + begin.len()..];
        let stop = rest
            .find(end)
            .ok_or_else(|| "unterminated PEM certificate".to_string())?;
        let b64: String = rest[..stop].split_whitespace().collect();
        Cert::from_der(super::root::b64(&b64)?)
    }

    /// Every certificate of a PEM text (a cosign chain annotation).
    pub fn all_from_pem(pem: &[u8]) -> Result<Vec<Cert>, String> {
        let text = std::str::from_utf8(pem).map_err(|_| "PEM is not UTF-8".to_string())?;
        let end = "-----END CERTIFICATE-----";
        text.split_inclusive(end)
            .filter(|part| part.contains("-----BEGIN CERTIFICATE-----"))
            .map(|part| Cert::from_pem(part.as_bytes()))
            .collect()
    }

    /// The DER `TBSCertificate` exactly as signed (taken from the input, not
    /// re-encoded).
    fn tbs_der(&self) -> Result<&[u8], String> {
        let mut r = SliceReader::new(&self.der).map_err(|e| e.to_string())?;
        Header::decode(&mut r).map_err(|e| e.to_string())?;
        r.tlv_bytes().map_err(|e| e.to_string())
    }

    pub fn key(&self) -> Result<Key, String> {
        let spki = self
            .parsed
            .tbs_certificate
            .subject_public_key_info
            .to_der()
            .map_err(|e| e.to_string())?;
        Key::from_spki_der(&spki)
    }

    /// `(not_before, not_after)` in Unix seconds.
    pub fn validity(&self) -> (i64, i64) {
        let v = &self.parsed.tbs_certificate.validity;
        let secs = |t: x509_cert::time::Time| {
            i64::try_from(t.to_unix_duration().as_secs()).unwrap_or(i64::MAX)
        };
        (secs(v.not_before), secs(v.not_after))
    }

    pub fn valid_at(&self, t: i64) -> bool {
        let (from, to) = self.validity();
        t >= from && t <= to
    }

    /// Whether `issuer`'s key made this certificate's signature.
    pub fn issued_by(&self, issuer: &Cert) -> bool {
        if self.parsed.tbs_certificate.issuer != issuer.parsed.tbs_certificate.subject {
            return false;
        }
        let Some(hash) = Hash::of_algorithm(&self.parsed.signature_algorithm.oid) else {
            return false;
        };
        let (Ok(tbs), Ok(key), Some(sig)) = (
            self.tbs_der(),
            issuer.key(),
            self.parsed.signature.as_bytes(),
        ) else {
            return false;
        };
        key.verify(hash, tbs, sig)
    }

    /// Subject equals issuer: a root (whoever signed it).
    pub fn is_self_issued(&self) -> bool {
        self.parsed.tbs_certificate.subject == self.parsed.tbs_certificate.issuer
    }

    fn extension(&self, oid: ObjectIdentifier) -> Option<&[u8]> {
        self.parsed
            .tbs_certificate
            .extensions
            .as_ref()?
            .iter()
            .find(|e| e.extn_id == oid)
            .map(|e| e.extn_value.as_bytes())
    }

    /// The identity Fulcio put in the SAN: a URI (workflows), an e-mail
    /// address, or an other-name's UTF-8 value (usernames).
    pub fn san(&self) -> Option<String> {
        let san = SubjectAltName::from_der(self.extension(OID_SAN)?).ok()?;
        san.0.iter().find_map(|n| match n {
            GeneralName::UniformResourceIdentifier(s) | GeneralName::Rfc822Name(s) => {
                Some(s.to_string())
            }
            GeneralName::OtherName(o) => o
                .value
                .decode_as::<Utf8StringRef<'_>>()
                .ok()
                .map(|s| s.to_string()),
            _ => None,
        })
    }

    /// The OIDC issuer extensions.
    pub fn issuer(&self) -> Issuer {
        Issuer {
            v2: self.utf8_extension(OID_ISSUER_V2),
            v1: self
                .extension(OID_ISSUER_V1)
                .and_then(|b| std::str::from_utf8(b).ok())
                .map(str::to_string),
        }
    }

    /// A Fulcio v2 extension (a DER UTF8String).
    pub fn utf8_extension(&self, oid: ObjectIdentifier) -> Option<String> {
        let bytes = self.extension(oid)?;
        Utf8StringRef::from_der(bytes).ok().map(|s| s.to_string())
    }

    /// A code-signing leaf: not a CA, digital signature usage, the
    /// code-signing extended key usage.
    pub fn check_leaf_usage(&self) -> Result<(), String> {
        if let Some(b) = self.extension(OID_BASIC_CONSTRAINTS) {
            let bc =
                BasicConstraints::from_der(b).map_err(|e| format!("basic constraints: {e}"))?;
            if bc.ca {
                return Err("the signing certificate is a CA certificate".into());
            }
        }
        let ku = self
            .extension(OID_KEY_USAGE)
            .ok_or("the certificate has no key usage")?;
        let ku = KeyUsage::from_der(ku).map_err(|e| format!("key usage: {e}"))?;
        if !ku.digital_signature() {
            return Err("the certificate's key usage lacks digital signature".into());
        }
        let eku = self
            .extension(OID_EKU)
            .ok_or("the certificate has no extended key usage (code signing required)")?;
        let eku =
            ExtendedKeyUsage::from_der(eku).map_err(|e| format!("extended key usage: {e}"))?;
        if !eku.0.contains(&OID_CODE_SIGNING) {
            return Err("the certificate's extended key usage lacks code signing".into());
        }
        Ok(())
    }
}

/// Verifies that `leaf` chains to a certificate authority of `root` that
/// was valid at `t`, every certificate of the chain valid at `t`. Returns
/// the certificate that issued the leaf (its key is what SCTs commit to).
pub fn verify_chain<'r>(leaf: &Cert, root: &'r TrustedRoot, t: i64) -> Result<&'r Cert, String> {
    let (from, to) = leaf.validity();
    if !leaf.valid_at(t) {
        return Err(format!(
            "the log's time {} is outside the certificate's validity ({} to {})",
            crate::time::rfc3339_seconds(t.max(0) as u64),
            crate::time::rfc3339_seconds(from.max(0) as u64),
            crate::time::rfc3339_seconds(to.max(0) as u64)
        ));
    }
    let mut issued_at_other_time = false;
    for ca in &root.authorities {
        let Some(first) = ca.chain.first() else {
            continue;
        };
        if !leaf.issued_by(first) {
            continue;
        }
        let links_hold = ca.chain.windows(2).all(|w| w[0].issued_by(&w[1]));
        let last = ca.chain.last().expect("non-empty chain");
        if !(links_hold && last.is_self_issued() && last.issued_by(last)) {
            continue;
        }
        if !ca.valid.contains(t) || !ca.chain.iter().all(|c| c.valid_at(t)) {
            issued_at_other_time = true;
            continue;
        }
        return Ok(first);
    }
    Err(if issued_at_other_time {
        "the certificate was issued by a Fulcio CA of the trusted root, but not one valid at the log's time".into()
    } else {
        "the certificate does not chain to a Fulcio CA of the trusted root".into()
    })
}

/// Verifies the leaf's embedded SCTs: at least one must be signed by a CT
/// log of the trusted root valid at the SCT's time, over the precertificate
/// (the leaf without its SCT list) and the issuer's key hash (RFC 6962 §3.2).
pub fn verify_sct(leaf: &Cert, issuer: &Cert, root: &TrustedRoot) -> Result<(), String> {
    let ext = leaf
        .extension(OID_SCT_LIST)
        .ok_or("the certificate carries no SCT (trust.keyless.require_sct)")?;
    let list = OctetString::from_der(ext).map_err(|e| format!("SCT list: {e}"))?;
    let scts = parse_sct_list(list.as_bytes()).ok_or("SCT list: malformed")?;
    let mut tbs = leaf.parsed.tbs_certificate.clone();
    if let Some(exts) = tbs.extensions.as_mut() {
        exts.retain(|e| e.extn_id != OID_SCT_LIST);
    }
    let precert = tbs.to_der().map_err(|e| format!("precertificate: {e}"))?;
    let issuer_spki = issuer
        .parsed
        .tbs_certificate
        .subject_public_key_info
        .to_der()
        .map_err(|e| e.to_string())?;
    let key_hash = sha256(&issuer_spki);
    let mut reasons = Vec::new();
    for sct in &scts {
        let Some(log) = root.ctlog(&sct.log_id) else {
            reasons.push("an SCT from a CT log not in the trusted root".to_string());
            continue;
        };
        let secs = i64::try_from(sct.timestamp_ms / 1000).unwrap_or(i64::MAX);
        if !log.valid.contains(secs) {
            reasons.push(format!(
                "an SCT from CT log {} outside its validity",
                log.base_url
            ));
            continue;
        }
        let hash = match sct.hash {
            4 => Hash::Sha256,
            5 => Hash::Sha384,
            other => {
                reasons.push(format!("an SCT with hash algorithm {other}"));
                continue;
            }
        };
        let mut signed = vec![0u8, 0u8];
        signed.extend_from_slice(&sct.timestamp_ms.to_be_bytes());
        signed.extend_from_slice(&[0, 1]);
        signed.extend_from_slice(&key_hash);
        let len = u32::try_from(precert.len()).unwrap_or(u32::MAX);
        signed.extend_from_slice(&len.to_be_bytes()[1..]);
        signed.extend_from_slice(&precert);
        let ext_len = u16::try_from(sct.extensions.len()).unwrap_or(u16::MAX);
        signed.extend_from_slice(&ext_len.to_be_bytes());
        signed.extend_from_slice(&sct.extensions);
        let valid = match &log.key {
            Ok(k) => k.verify(hash, &signed, &sct.signature),
            Err(e) => {
                reasons.push(format!("CT log {}: {e}", log.base_url));
                continue;
            }
        };
        if valid {
            return Ok(());
        }
        reasons.push(format!(
            "an SCT that does not verify with CT log {}",
            log.base_url
        ));
    }
    Err(format!("no valid SCT ({})", reasons.join("; ")))
}

struct Sct {
    log_id: Vec<u8>,
    timestamp_ms: u64,
    extensions: Vec<u8>,
    hash: u8,
    signature: Vec<u8>,
}

/// Parses a TLS-encoded `SignedCertificateTimestampList`.
fn parse_sct_list(bytes: &[u8]) -> Option<Vec<Sct>> {
    let mut r = Tls(bytes);
    let mut list = Tls(r.vec16()?);
    if !r.0.is_empty() {
        return None;
    }
    let mut out = Vec::new();
    while !list.0.is_empty() {
        let mut s = Tls(list.vec16()?);
        if s.take(1)? != [0] {
            continue; // only v1 SCTs exist
        }
        let log_id = s.take(32)?.to_vec();
        let timestamp_ms = u64::from_be_bytes(s.take(8)?.try_into().ok()?);
        let extensions = s.vec16()?.to_vec();
        let hash = s.take(1)?[0];
        let _sig_alg = s.take(1)?[0];
        let signature = s.vec16()?.to_vec();
        out.push(Sct {
            log_id,
            timestamp_ms,
            extensions,
            hash,
            signature,
        });
    }
    Some(out)
}

struct Tls<'a>(&'a [u8]);

impl<'a> Tls<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }

    fn vec16(&mut self) -> Option<&'a [u8]> {
        let len = u16::from_be_bytes(self.take(2)?.try_into().ok()?);
        self.take(usize::from(len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sct_list_parser_refuses_truncation() {
        assert!(parse_sct_list(&[0, 5, 0]).is_none());
        assert!(parse_sct_list(&[]).is_none());
        assert_eq!(parse_sct_list(&[0, 0]).map(|v| v.len()), Some(0));
    }
}
