//! Fulcio certificates: parsing, issuer signatures, validity, the leaf's
//! usage and what it claims (SAN, OIDC issuer, the GitHub claims Fulcio
//! records).
//!
//! Given DER or PEM bytes, it answers "who signed this certificate", "is it
//! valid at time T" and "what does it claim". Chains to the trusted root
//! and SCTs are [`crate::keyless::chain`]; whether the claims are
//! acceptable is [`crate::keyless::policy`].
//!
//! The DER is walked by hand (a strict TLV reader: one-byte tags, definite
//! minimal lengths, nothing after the certificate), reading only the
//! fields verification needs: a general X.509 crate put the activator over
//! its size budget (ARCHITECTURE.md, "Keyless verification").

use std::ops::Range;

use p256::pkcs8::der::asn1::ObjectIdentifier;

use super::crypto::{Hash, Key};

const OID_SAN: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.17");
const OID_KEY_USAGE: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.15");
const OID_EKU: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.37");
const OID_BASIC_CONSTRAINTS: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.19");
const OID_CODE_SIGNING: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.5.5.7.3.3");
const OID_COMMON_NAME: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.4.3");
const OID_ORGANIZATION: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.4.10");
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

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const INTEGER: u8 = 0x02;
const BIT_STRING: u8 = 0x03;
const OCTET_STRING: u8 = 0x04;
const OID: u8 = 0x06;
const BOOLEAN: u8 = 0x01;
const UTF8_STRING: u8 = 0x0c;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// One TLV: its tag, and where its content and the whole TLV lie in the
/// buffer it was read from.
#[derive(Clone, Debug)]
struct Tlv {
    tag: u8,
    content: Range<usize>,
    whole: Range<usize>,
}

/// A strict DER reader over `buf[pos..end]`: one-byte tags, definite
/// minimal lengths.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    end: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8], within: Range<usize>) -> Reader<'a> {
        Reader {
            buf,
            pos: within.start,
            end: within.end,
        }
    }

    fn done(&self) -> bool {
        self.pos >= self.end
    }

    fn next(&mut self) -> Option<Tlv> {
        let start = self.pos;
        let tag = *self.buf.get(self.pos)?;
        if tag & 0x1f == 0x1f {
            return None; // multi-byte tags: not in certificates we read
        }
        let first = *self.buf.get(self.pos + 1)?;
        let mut at = self.pos + 2;
        let len = if first < 0x80 {
            usize::from(first)
        } else {
            let n = usize::from(first & 0x7f);
            if n == 0 || n > 4 {
                return None;
            }
            let bytes = self.buf.get(at..at + n)?;
            at += n;
            let len = bytes.iter().fold(0usize, |l, b| (l << 8) | usize::from(*b));
            if len < 0x80 || bytes[0] == 0 {
                return None; // not minimal
            }
            len
        };
        let content_end = at.checked_add(len)?;
        if content_end > self.end {
            return None;
        }
        self.pos = content_end;
        Some(Tlv {
            tag,
            content: at..content_end,
            whole: start..content_end,
        })
    }

    fn expect(&mut self, tag: u8) -> Option<Tlv> {
        self.next().filter(|t| t.tag == tag)
    }
}

/// DER length octets for `len`.
fn length(len: usize) -> Vec<u8> {
    if len < 0x80 {
        return vec![len as u8];
    }
    let bytes: Vec<u8> = len
        .to_be_bytes()
        .into_iter()
        .skip_while(|b| *b == 0)
        .collect();
    let mut v = vec![0x80 | bytes.len() as u8];
    v.extend(bytes);
    v
}

fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut v = vec![tag];
    v.extend(length(content.len()));
    v.extend_from_slice(content);
    v
}

/// `YYMMDDHHMMSSZ` or `YYYYMMDDHHMMSSZ` as Unix seconds.
fn time(t: &Tlv, der: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(&der[t.content.clone()]).ok()?;
    let full = match (t.tag, s.len()) {
        (UTC_TIME, 13) => {
            let yy: u32 = s.get(..2)?.parse().ok()?;
            format!("{}{}", if yy < 50 { 2000 + yy } else { 1900 + yy }, &s[2..])
        }
        (GENERALIZED_TIME, 15) => s.to_string(),
        _ => return None,
    };
    let b = full.as_bytes();
    if b.last() != Some(&b'Z') {
        return None;
    }
    let rfc = format!(
        "{}-{}-{}T{}:{}:{}Z",
        full.get(0..4)?,
        full.get(4..6)?,
        full.get(6..8)?,
        full.get(8..10)?,
        full.get(10..12)?,
        full.get(12..14)?
    );
    crate::time::parse_rfc3339(&rfc)
}

/// One extension: its OID's DER content, its value, the whole TLV.
#[derive(Clone, Debug)]
struct Extension {
    oid: Vec<u8>,
    value: Range<usize>,
    whole: Range<usize>,
}

/// A parsed certificate with its exact DER bytes.
#[derive(Clone, Debug)]
pub struct Cert {
    pub der: Vec<u8>,
    tbs: Range<usize>,
    /// The TBS fields before the extensions (content bytes).
    tbs_head: Range<usize>,
    sig_alg: Vec<u8>,
    signature: Vec<u8>,
    issuer: Range<usize>,
    subject: Range<usize>,
    spki: Range<usize>,
    not_before: i64,
    not_after: i64,
    extensions: Vec<Extension>,
}

/// The OIDC issuer a certificate names, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issuer {
    /// The 1.3.6.1.4.1.57264.1.8 value.
    pub v2: Option<String>,
    /// The deprecated 1.3.6.1.4.1.57264.1.1 value.
    pub v1: Option<String>,
}

fn parse(der: &[u8]) -> Option<Cert> {
    let mut outer = Reader::new(der, 0..der.len());
    let cert = outer.expect(SEQUENCE)?;
    if !outer.done() {
        return None;
    }
    let mut c = Reader::new(der, cert.content);
    let tbs = c.expect(SEQUENCE)?;
    let alg = c.expect(SEQUENCE)?;
    let sig = c.expect(BIT_STRING)?;
    if !c.done() {
        return None;
    }
    let sig_alg = Reader::new(der, alg.content).expect(OID)?;
    let sig_bytes = der.get(sig.content.clone())?;
    if sig_bytes.first() != Some(&0) {
        return None;
    }
    let mut t = Reader::new(der, tbs.content.clone());
    let mut field = t.next()?;
    if field.tag == 0xa0 {
        field = t.next()?; // version
    }
    if field.tag != INTEGER {
        return None; // serial
    }
    t.expect(SEQUENCE)?; // signature algorithm
    let issuer = t.expect(SEQUENCE)?;
    let validity = t.expect(SEQUENCE)?;
    let subject = t.expect(SEQUENCE)?;
    let spki = t.expect(SEQUENCE)?;
    let mut v = Reader::new(der, validity.content);
    let not_before = time(&v.next()?, der)?;
    let not_after = time(&v.next()?, der)?;
    let mut tbs_head = tbs.content.start..tbs.content.end;
    let mut extensions = Vec::new();
    while !t.done() {
        let f = t.next()?;
        if f.tag != 0xa3 {
            continue; // issuer/subject unique IDs
        }
        tbs_head.end = f.whole.start;
        let mut list = Reader::new(der, f.content);
        let seq = list.expect(SEQUENCE)?;
        let mut exts = Reader::new(der, seq.content);
        while !exts.done() {
            let e = exts.expect(SEQUENCE)?;
            let mut r = Reader::new(der, e.content.clone());
            let oid = r.expect(OID)?;
            let mut value = r.next()?;
            if value.tag == BOOLEAN {
                value = r.next()?;
            }
            if value.tag != OCTET_STRING {
                return None;
            }
            extensions.push(Extension {
                oid: der[oid.content].to_vec(),
                value: value.content,
                whole: e.whole,
            });
        }
    }
    Some(Cert {
        der: der.to_vec(),
        tbs: tbs.whole,
        tbs_head,
        sig_alg: der[sig_alg.content].to_vec(),
        signature: sig_bytes[1..].to_vec(),
        issuer: issuer.whole,
        subject: subject.whole,
        spki: spki.whole,
        not_before,
        not_after,
        extensions,
    })
}

impl Cert {
    pub fn from_der(der: Vec<u8>) -> Result<Cert, String> {
        parse(&der).ok_or_else(|| "not a DER X.509 certificate this verifier reads".to_string())
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

    /// The DER `SubjectPublicKeyInfo`.
    pub fn spki_der(&self) -> &[u8] {
        &self.der[self.spki.clone()]
    }

    pub fn key(&self) -> Result<Key, String> {
        Key::from_spki_der(self.spki_der())
    }

    /// `(not_before, not_after)` in Unix seconds.
    pub fn validity(&self) -> (i64, i64) {
        (self.not_before, self.not_after)
    }

    pub fn valid_at(&self, t: i64) -> bool {
        t >= self.not_before && t <= self.not_after
    }

    /// Whether `issuer`'s key made this certificate's signature.
    pub fn issued_by(&self, issuer: &Cert) -> bool {
        if self.der[self.issuer.clone()] != issuer.der[issuer.subject.clone()] {
            return false;
        }
        let alg = ObjectIdentifier::from_bytes(&self.sig_alg).ok();
        let Some(hash) = alg.as_ref().and_then(Hash::of_algorithm) else {
            return false;
        };
        let Ok(key) = issuer.key() else {
            return false;
        };
        key.verify(hash, &self.der[self.tbs.clone()], &self.signature)
    }

    /// Subject equals issuer: a root (whoever signed it).
    pub fn is_self_issued(&self) -> bool {
        self.der[self.subject.clone()] == self.der[self.issuer.clone()]
    }

    /// The subject's common name and organisation, for messages.
    pub fn subject_summary(&self) -> String {
        let mut parts = Vec::new();
        let mut rdns = Reader::new(&self.der, self.subject.start..self.subject.end);
        let Some(name) = rdns.expect(SEQUENCE) else {
            return "(unreadable subject)".into();
        };
        let mut sets = Reader::new(&self.der, name.content);
        while let Some(set) = sets.expect(SET) {
            let mut atvs = Reader::new(&self.der, set.content);
            while let Some(atv) = atvs.expect(SEQUENCE) {
                let mut r = Reader::new(&self.der, atv.content);
                let (Some(oid), Some(value)) = (r.expect(OID), r.next()) else {
                    continue;
                };
                let label = match &self.der[oid.content] {
                    o if o == OID_COMMON_NAME.as_bytes() => "CN",
                    o if o == OID_ORGANIZATION.as_bytes() => "O",
                    _ => continue,
                };
                let text = String::from_utf8_lossy(&self.der[value.content]);
                parts.push(format!("{label}={text}"));
            }
        }
        parts.join(",")
    }

    /// The DER value of the extension `oid`, when the certificate has it.
    pub fn extension(&self, oid: ObjectIdentifier) -> Option<&[u8]> {
        self.extensions
            .iter()
            .find(|e| e.oid == oid.as_bytes())
            .map(|e| &self.der[e.value.clone()])
    }

    /// The precertificate TBS a CT log signed: this TBS without the SCT
    /// list extension (RFC 6962 §3.2).
    pub fn precert_tbs(&self) -> Vec<u8> {
        let mut exts = Vec::new();
        for e in &self.extensions {
            if e.oid != OID_SCT_LIST.as_bytes() {
                exts.extend_from_slice(&self.der[e.whole.clone()]);
            }
        }
        let mut content = self.der[self.tbs_head.clone()].to_vec();
        content.extend(tlv(0xa3, &tlv(SEQUENCE, &exts)));
        tlv(SEQUENCE, &content)
    }

    /// The identity Fulcio put in the SAN: a URI (workflows), an e-mail
    /// address, or an other-name's UTF-8 value (usernames).
    pub fn san(&self) -> Option<String> {
        let value = self.extension(OID_SAN)?;
        let mut r = Reader::new(value, 0..value.len());
        let seq = r.expect(SEQUENCE)?;
        let mut names = Reader::new(value, seq.content);
        while let Some(n) = names.next() {
            match n.tag {
                0x81 | 0x86 => return String::from_utf8(value[n.content].to_vec()).ok(),
                0xa0 => {
                    let mut o = Reader::new(value, n.content);
                    o.expect(OID)?;
                    let explicit = o.expect(0xa0)?;
                    let s = Reader::new(value, explicit.content).expect(UTF8_STRING)?;
                    return String::from_utf8(value[s.content].to_vec()).ok();
                }
                _ => {}
            }
        }
        None
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
        let mut r = Reader::new(bytes, 0..bytes.len());
        let s = r.expect(UTF8_STRING)?;
        if !r.done() {
            return None;
        }
        String::from_utf8(bytes[s.content].to_vec()).ok()
    }

    /// A code-signing leaf: not a CA, digital signature usage, the
    /// code-signing extended key usage.
    pub fn check_leaf_usage(&self) -> Result<(), String> {
        if let Some(b) = self.extension(OID_BASIC_CONSTRAINTS) {
            let mut r = Reader::new(b, 0..b.len());
            let seq = r.expect(SEQUENCE).ok_or("basic constraints: malformed")?;
            let mut fields = Reader::new(b, seq.content);
            if let Some(f) = fields.next() {
                if f.tag == BOOLEAN && b[f.content].iter().any(|x| *x != 0) {
                    return Err("the signing certificate is a CA certificate".into());
                }
            }
        }
        let ku = self
            .extension(OID_KEY_USAGE)
            .ok_or("the certificate has no key usage")?;
        let bits = Reader::new(ku, 0..ku.len())
            .expect(BIT_STRING)
            .map(|t| &ku[t.content])
            .ok_or("key usage: malformed")?;
        if bits.get(1).is_none_or(|b| b & 0x80 == 0) {
            return Err("the certificate's key usage lacks digital signature".into());
        }
        let eku = self
            .extension(OID_EKU)
            .ok_or("the certificate has no extended key usage (code signing required)")?;
        let seq = Reader::new(eku, 0..eku.len())
            .expect(SEQUENCE)
            .ok_or("extended key usage: malformed")?;
        let mut oids = Reader::new(eku, seq.content);
        let mut code_signing = false;
        while let Some(o) = oids.next() {
            code_signing |= o.tag == OID && eku[o.content] == *OID_CODE_SIGNING.as_bytes();
        }
        if !code_signing {
            return Err("the certificate's extended key usage lacks code signing".into());
        }
        Ok(())
    }
}

/// The content of a DER OCTET STRING.
pub fn octet_string(der: &[u8]) -> Option<&[u8]> {
    let mut r = Reader::new(der, 0..der.len());
    let t = r.expect(OCTET_STRING)?;
    r.done().then(|| &der[t.content])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_minimal_and_bounded() {
        assert_eq!(length(5), vec![5]);
        assert_eq!(length(200), vec![0x81, 200]);
        assert_eq!(length(300), vec![0x82, 1, 44]);
        // a long form for a short length, a length past the end: refused
        let mut r = Reader::new(&[0x04, 0x81, 0x05, 1, 2, 3, 4, 5], 0..8);
        assert!(r.next().is_none());
        let mut r = Reader::new(&[0x04, 0x05, 1, 2], 0..4);
        assert!(r.next().is_none());
        assert!(Cert::from_der(vec![0x30, 0x00]).is_err());
    }

    #[test]
    fn times() {
        let der = b"\x17\x0d211020072516Z".to_vec();
        let t = Reader::new(&der, 0..der.len()).next().unwrap();
        assert_eq!(time(&t, &der), Some(1_634_714_716));
        let der = b"\x18\x0f20211020072516Z".to_vec();
        let t = Reader::new(&der, 0..der.len()).next().unwrap();
        assert_eq!(time(&t, &der), Some(1_634_714_716));
    }
}
