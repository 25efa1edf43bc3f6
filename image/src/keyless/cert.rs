//! Fulcio certificates: parsing, issuer signatures, validity, the leaf's
//! usage and what it claims (SAN, OIDC issuer, the GitHub claims Fulcio
//! records).
//!
//! Given DER or PEM bytes, it answers "who signed this certificate", "is it
//! valid at time T" and "what does it claim". Chains to the trusted root
//! and SCTs are [`crate::keyless::chain`]; whether the claims are
//! acceptable is [`crate::keyless::policy`].

use x509_cert::der::asn1::{ObjectIdentifier, Utf8StringRef};
use x509_cert::der::{Decode as _, Encode as _, Header, Reader as _, SliceReader};
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::{BasicConstraints, ExtendedKeyUsage, KeyUsage, SubjectAltName};
use x509_cert::Certificate;

use super::crypto::{Hash, Key};

const OID_SAN: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.17");
const OID_KEY_USAGE: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.15");
const OID_EKU: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.37");
const OID_BASIC_CONSTRAINTS: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.19");
const OID_CODE_SIGNING: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.5.5.7.3.3");
/// RFC 6962 embedded SCT list.
pub const OID_SCT_LIST: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.11129.2.4.2");
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
        Cert::from_der(super::crypto::b64(&b64)?)
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

    /// The DER value of the extension `oid`, when the certificate has it.
    pub fn extension(&self, oid: ObjectIdentifier) -> Option<&[u8]> {
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
