//! Fulcio certificates: parsing, issuer signatures, validity, the leaf's
//! usage and what it claims (SAN, OIDC issuer, the GitHub claims Fulcio
//! records).
//!
//! Given DER or PEM bytes, it answers "who signed this certificate", "is it
//! valid at time T", "may it sign certificates or code" and "what does it
//! claim". Chains to the trusted root and SCTs are
//! [`crate::keyless::chain`]; whether the claims are acceptable is
//! [`crate::keyless::policy`].
//!
//! The DER is walked by hand: a general X.509 crate put the activator over
//! its size budget (docs/decisions/trust.md, "Keyless verification is ours"). The walker
//! is strict, so that what it reads is what every other X.509 reader reads:
//! one-byte tags checked at every step; definite, minimal lengths; nothing
//! after a value or the certificate; certificates of at most
//! [`MAX_CERT_BYTES`]; X.509 v3 only; minimal, positive serials of at most
//! 20 octets; the inner and outer signature algorithms identical; names,
//! times (UTCTime through 2049, GeneralizedTime from 2050, as RFC 5280
//! §4.1.2.5 says), OIDs, booleans (DER TRUE only; a FALSE default is never
//! encoded) and bit strings in their DER form; each extension at most once;
//! an unknown critical extension refuses the certificate (RFC 5280 §4.2).
//! The extensions verification uses (basic constraints, key usage,
//! extended key usage, SAN) are decoded, and so checked, when the
//! certificate is parsed. No recursion: the structure is read at fixed
//! depth.

use std::ops::Range;

use p256::pkcs8::der::asn1::ObjectIdentifier;

use super::crypto::{Hash, Key};

const OID_SAN: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.17");
const OID_KEY_USAGE: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.15");
const OID_EKU: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.37");
const OID_BASIC_CONSTRAINTS: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.19");
/// The extended key usage a signing leaf must have (and a CA that
/// restricts its extended key usage must allow).
pub const OID_CODE_SIGNING: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.5.5.7.3.3");
/// anyExtendedKeyUsage.
pub const OID_ANY_EKU: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.37.0");
const OID_COMMON_NAME: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.4.3");
const OID_ORGANIZATION: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.4.10");
/// RFC 6962 embedded SCT list.
pub const OID_SCT_LIST: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.11129.2.4.2");
/// Fulcio's OIDC issuer, deprecated form: the raw string, not DER.
pub const OID_ISSUER_V1: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.57264.1.1");
/// Fulcio's OIDC issuer, a DER UTF8String.
pub const OID_ISSUER_V2: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.57264.1.8");
/// Fulcio's SAN other-name for usernames (a UTF8String).
pub const OID_FULCIO_USERNAME: ObjectIdentifier =
    ObjectIdentifier::new_unwrap("1.3.6.1.4.1.57264.1.7");
/// Source Repository URI (e.g. `https://github.com/org/repo`).
pub const OID_SOURCE_REPOSITORY: ObjectIdentifier =
    ObjectIdentifier::new_unwrap("1.3.6.1.4.1.57264.1.12");
/// Source Repository Ref (e.g. `refs/tags/v1.2.3`).
pub const OID_SOURCE_REF: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.57264.1.14");
/// Build Config URI: the workflow file that ran, at its ref.
pub const OID_BUILD_CONFIG: ObjectIdentifier =
    ObjectIdentifier::new_unwrap("1.3.6.1.4.1.57264.1.18");

/// Certificates larger than this are refused unread (Fulcio's leaves are
/// about 2 KB, its CA certificates under 1 KB).
pub const MAX_CERT_BYTES: usize = 32 * 1024;

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
/// `[0] EXPLICIT` (version; other-name value), `[3] EXPLICIT` (extensions).
const CONTEXT_0: u8 = 0xa0;
const CONTEXT_3: u8 = 0xa3;
/// `[1] IMPLICIT`/`[2] IMPLICIT` BIT STRING: the unique identifiers.
const ISSUER_UID: u8 = 0x81;
const SUBJECT_UID: u8 = 0x82;

/// Key usage bits (RFC 5280 §4.2.1.3): bit `n` of the BIT STRING is
/// `1 << n` here.
pub const KU_DIGITAL_SIGNATURE: u16 = 1 << 0;
pub const KU_KEY_CERT_SIGN: u16 = 1 << 5;

/// One TLV: its tag, and where its content and the whole TLV lie in the
/// buffer it was read from.
#[derive(Clone, Debug)]
struct Tlv {
    tag: u8,
    content: Range<usize>,
    whole: Range<usize>,
}

/// A strict DER reader over `buf[pos..end]`: one-byte tags, definite
/// minimal lengths of at most four octets, nothing past `end`.
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
            end: within.end.min(buf.len()),
        }
    }

    fn done(&self) -> bool {
        self.pos >= self.end
    }

    /// The tag of the next TLV, without reading it.
    fn peek(&self) -> Option<u8> {
        if self.done() {
            return None;
        }
        self.buf.get(self.pos).copied()
    }

    fn next(&mut self) -> Option<Tlv> {
        if self.done() {
            return None;
        }
        let start = self.pos;
        let tag = *self.buf.get(start)?;
        if tag & 0x1f == 0x1f {
            return None; // multi-byte tags: not in certificates
        }
        let first = *self.buf.get(start + 1)?;
        let mut at = start + 2;
        let len = if first < 0x80 {
            usize::from(first)
        } else {
            // 0x80 (indefinite) and 0xff (reserved) are refused here
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

/// The one TLV `bytes` holds, of type `tag`, with nothing after it.
fn only(bytes: &[u8], tag: u8) -> Option<Tlv> {
    let mut r = Reader::new(bytes, 0..bytes.len());
    let t = r.expect(tag)?;
    r.done().then_some(t)
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

/// A DER INTEGER's content: non-empty and minimal (no leading 0x00 before a
/// clear high bit, no leading 0xff before a set one).
fn integer_ok(c: &[u8]) -> bool {
    match c {
        [] => false,
        [0x00, next, ..] => next & 0x80 != 0,
        [0xff, next, ..] => next & 0x80 == 0,
        _ => true,
    }
}

/// A non-negative DER INTEGER that fits a `u32`.
fn small_uint(c: &[u8]) -> Option<u32> {
    if !integer_ok(c) || c[0] & 0x80 != 0 || c.len() > 5 {
        return None;
    }
    let v = c.iter().fold(0u64, |v, b| (v << 8) | u64::from(*b));
    u32::try_from(v).ok()
}

/// An OID's content: non-empty, every arc minimal (no 0x80 lead octet),
/// the last octet ending an arc.
fn oid_ok(c: &[u8]) -> bool {
    let Some(last) = c.last() else {
        return false;
    };
    if last & 0x80 != 0 || c.len() > 64 {
        return false;
    }
    let mut arc_start = true;
    for b in c {
        if arc_start && *b == 0x80 {
            return false;
        }
        arc_start = b & 0x80 == 0;
    }
    true
}

/// An OID's dotted form, for messages.
fn dotted(oid: &[u8]) -> String {
    ObjectIdentifier::from_bytes(oid)
        .map_or_else(|_| format!("(OID {})", hex::encode(oid)), |o| o.to_string())
}

/// A DER BOOLEAN TRUE (`0xff`); DER never encodes a FALSE default.
fn true_ok(c: &[u8]) -> bool {
    c == [0xff]
}

/// A named-bit BIT STRING in DER (RFC 5280 key usage): at least one bit,
/// trailing zero bits removed, unused bits zero. Bit `n` is `1 << n`.
fn named_bits(c: &[u8]) -> Option<u16> {
    let (&unused, data) = c.split_first()?;
    let &last = data.last()?;
    // the lowest used bit is set (trailing zeros removed), the unused ones clear
    if unused > 7 || data.len() > 2 || (last >> unused) & 1 != 1 || last & ((1 << unused) - 1) != 0
    {
        return None;
    }
    let mut bits = 0u16;
    for (i, byte) in data.iter().enumerate() {
        for j in 0..8 {
            if byte & (0x80 >> j) != 0 {
                bits |= 1 << (i * 8 + j);
            }
        }
    }
    Some(bits)
}

/// `YYMMDDHHMMSSZ` (1950–2049) or `YYYYMMDDHHMMSSZ` (2050 on) as Unix
/// seconds.
fn time(t: &Tlv, der: &[u8]) -> Option<i64> {
    let b = der.get(t.content.clone())?;
    let (z, digits) = b.split_last()?;
    if *z != b'Z' || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let s = std::str::from_utf8(digits).ok()?;
    let full = match (t.tag, s.len()) {
        (UTC_TIME, 12) => {
            let yy: u32 = s[..2].parse().ok()?;
            format!("{}{}", if yy < 50 { 2000 + yy } else { 1900 + yy }, &s[2..])
        }
        (GENERALIZED_TIME, 14) if &s[..4] >= "2050" => s.to_string(),
        _ => return None,
    };
    let rfc = format!(
        "{}-{}-{}T{}:{}:{}Z",
        &full[0..4],
        &full[4..6],
        &full[6..8],
        &full[8..10],
        &full[10..12],
        &full[12..14]
    );
    crate::time::parse_rfc3339(&rfc)
}

/// A Name: a SEQUENCE of non-empty SETs of `{OID, value}` pairs.
fn name_ok(der: &[u8], name: &Tlv) -> bool {
    let mut rdns = Reader::new(der, name.content.clone());
    while !rdns.done() {
        let Some(set) = rdns.expect(SET) else {
            return false;
        };
        let mut atvs = Reader::new(der, set.content.clone());
        if atvs.done() {
            return false;
        }
        while !atvs.done() {
            let Some(atv) = atvs.expect(SEQUENCE) else {
                return false;
            };
            let mut r = Reader::new(der, atv.content);
            let oid_good = r.expect(OID).is_some_and(|o| oid_ok(&der[o.content]));
            if !oid_good || r.next().is_none() || !r.done() {
                return false;
            }
        }
    }
    true
}

/// An AlgorithmIdentifier: its OID and whether it has parameters.
fn algorithm(der: &[u8], alg: &Tlv) -> Option<(Vec<u8>, bool)> {
    let mut r = Reader::new(der, alg.content.clone());
    let oid = r.expect(OID)?;
    if !oid_ok(&der[oid.content.clone()]) {
        return None;
    }
    let params = r.next().is_some();
    r.done().then(|| (der[oid.content].to_vec(), params))
}

/// Basic constraints (RFC 5280 §4.2.1.9).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BasicConstraints {
    pub ca: bool,
    pub path_len: Option<u32>,
}

/// One name of a subject alternative name extension.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GeneralName {
    Email(String),
    Dns(String),
    Uri(String),
    /// Fulcio's username other-name.
    Username(String),
    /// Any other kind, by its tag (an IP address, a directory name...).
    Other(u8),
}

/// One extension: its OID's DER content, criticality, value, the whole TLV.
#[derive(Clone, Debug)]
struct Extension {
    oid: Vec<u8>,
    critical: bool,
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
    serial: Range<usize>,
    sig_alg: Vec<u8>,
    sig_params: bool,
    signature: Vec<u8>,
    issuer: Range<usize>,
    subject: Range<usize>,
    spki: Range<usize>,
    not_before: i64,
    not_after: i64,
    extensions: Vec<Extension>,
    basic_constraints: Option<BasicConstraints>,
    key_usage: Option<u16>,
    eku: Option<Vec<Vec<u8>>>,
    san: Option<Vec<GeneralName>>,
}

/// The OIDC issuer a certificate names, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issuer {
    /// The 1.3.6.1.4.1.57264.1.8 value.
    pub v2: Option<String>,
    /// The deprecated 1.3.6.1.4.1.57264.1.1 value.
    pub v1: Option<String>,
}

fn need<T>(v: Option<T>, what: &str) -> Result<T, String> {
    v.ok_or_else(|| format!("{what}: not DER"))
}

fn check(ok: bool, why: &str) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(why.to_string())
    }
}

fn parse(der: &[u8]) -> Result<Cert, String> {
    if der.len() > MAX_CERT_BYTES {
        return Err(format!("larger than {MAX_CERT_BYTES} bytes"));
    }
    let cert = need(only(der, SEQUENCE), "the certificate")?;
    let mut c = Reader::new(der, cert.content);
    let tbs = need(c.expect(SEQUENCE), "the TBS certificate")?;
    let alg = need(c.expect(SEQUENCE), "the signature algorithm")?;
    let sig = need(c.expect(BIT_STRING), "the signature")?;
    check(c.done(), "data after the signature")?;
    let (sig_alg, sig_params) = need(algorithm(der, &alg), "the signature algorithm")?;
    let sig_bytes = &der[sig.content.clone()];
    check(
        sig_bytes.len() > 1 && sig_bytes[0] == 0,
        "the signature is not a whole-byte BIT STRING",
    )?;

    let mut t = Reader::new(der, tbs.content.clone());
    let version = need(t.expect(CONTEXT_0), "the version (only X.509 v3 is read)")?;
    check(
        der[version.content] == [INTEGER, 1, 2],
        "not an X.509 v3 certificate",
    )?;
    let serial = need(t.expect(INTEGER), "the serial number")?;
    let s = &der[serial.content.clone()];
    check(
        integer_ok(s) && s[0] & 0x80 == 0 && s.iter().any(|b| *b != 0),
        "the serial number is not a minimal positive INTEGER",
    )?;
    check(
        s.len() <= 20 || (s.len() == 21 && s[0] == 0),
        "the serial number is longer than 20 octets",
    )?;
    let inner_alg = need(t.expect(SEQUENCE), "the TBS signature algorithm")?;
    check(
        der[inner_alg.whole] == der[alg.whole.clone()],
        "the TBS signature algorithm differs from the certificate's",
    )?;
    let issuer = need(t.expect(SEQUENCE), "the issuer")?;
    check(
        name_ok(der, &issuer) && !issuer.content.is_empty(),
        "the issuer is not a non-empty DER Name",
    )?;
    let validity = need(t.expect(SEQUENCE), "the validity")?;
    let subject = need(t.expect(SEQUENCE), "the subject")?;
    check(name_ok(der, &subject), "the subject is not a DER Name")?;
    let spki = need(t.expect(SEQUENCE), "the subject public key info")?;
    let mut k = Reader::new(der, spki.content.clone());
    let key_alg = need(k.expect(SEQUENCE), "the public key algorithm")?;
    need(algorithm(der, &key_alg), "the public key algorithm")?;
    need(k.expect(BIT_STRING), "the public key")?;
    check(k.done(), "data after the public key")?;

    let mut v = Reader::new(der, validity.content);
    let not_before = need(v.next().and_then(|t| time(&t, der)), "notBefore")?;
    let not_after = need(v.next().and_then(|t| time(&t, der)), "notAfter")?;
    check(v.done(), "data after notAfter")?;

    // [1] issuerUniqueID, [2] subjectUniqueID, [3] extensions: each at
    // most once, in that order, and nothing else.
    let mut tbs_head = tbs.content.clone();
    let mut extensions = Vec::new();
    for tag in [ISSUER_UID, SUBJECT_UID, CONTEXT_3] {
        if t.peek() != Some(tag) {
            continue;
        }
        let f = need(t.next(), "the TBS certificate")?;
        if tag != CONTEXT_3 {
            let bits = &der[f.content];
            check(
                bits.first().is_some_and(|u| *u <= 7),
                "a unique identifier is not a BIT STRING",
            )?;
            continue;
        }
        tbs_head.end = f.whole.start;
        let mut wrapper = Reader::new(der, f.content);
        let list = need(wrapper.expect(SEQUENCE), "the extensions")?;
        check(wrapper.done(), "data after the extensions")?;
        let mut exts = Reader::new(der, list.content);
        check(!exts.done(), "an empty extensions list")?;
        while !exts.done() {
            let e = need(exts.expect(SEQUENCE), "an extension")?;
            let ext = extension(der, e)?;
            if extensions.iter().any(|x: &Extension| x.oid == ext.oid) {
                return Err(format!("extension {} appears twice", dotted(&ext.oid)));
            }
            extensions.push(ext);
        }
    }
    check(
        t.done(),
        "unexpected data after the subject public key info",
    )?;

    let mut cert = Cert {
        der: der.to_vec(),
        tbs: tbs.whole,
        tbs_head,
        serial: serial.content,
        sig_alg,
        sig_params,
        signature: sig_bytes[1..].to_vec(),
        issuer: issuer.whole,
        subject: subject.whole,
        spki: spki.whole,
        not_before,
        not_after,
        extensions,
        basic_constraints: None,
        key_usage: None,
        eku: None,
        san: None,
    };
    cert.decode_extensions()?;
    Ok(cert)
}

/// One Extension: `{OID, critical BOOLEAN DEFAULT FALSE, OCTET STRING}`.
fn extension(der: &[u8], e: Tlv) -> Result<Extension, String> {
    let mut r = Reader::new(der, e.content.clone());
    let oid = need(r.expect(OID), "an extension's OID")?;
    check(
        oid_ok(&der[oid.content.clone()]),
        "an extension's OID is not DER",
    )?;
    let oid = der[oid.content].to_vec();
    let mut value = need(r.next(), "an extension")?;
    let mut critical = false;
    if value.tag == BOOLEAN {
        if !true_ok(&der[value.content.clone()]) {
            return Err(format!(
                "extension {}: its critical flag is not DER TRUE (FALSE is the default, never encoded)",
                dotted(&oid)
            ));
        }
        critical = true;
        value = need(r.next(), "an extension")?;
    }
    if value.tag != OCTET_STRING || !r.done() {
        return Err(format!("extension {}: not DER", dotted(&oid)));
    }
    Ok(Extension {
        oid,
        critical,
        value: value.content,
        whole: e.whole,
    })
}

fn basic_constraints(v: &[u8]) -> Option<BasicConstraints> {
    let seq = only(v, SEQUENCE)?;
    let mut f = Reader::new(v, seq.content);
    let mut bc = BasicConstraints {
        ca: false,
        path_len: None,
    };
    if f.peek() == Some(BOOLEAN) {
        let t = f.next()?;
        if !true_ok(&v[t.content]) {
            return None;
        }
        bc.ca = true;
    }
    if !f.done() {
        let t = f.expect(INTEGER)?;
        bc.path_len = Some(small_uint(&v[t.content])?);
    }
    // a path length belongs to CAs only (RFC 5280 §4.2.1.9)
    (f.done() && (bc.ca || bc.path_len.is_none())).then_some(bc)
}

fn extended_key_usage(v: &[u8]) -> Option<Vec<Vec<u8>>> {
    let seq = only(v, SEQUENCE)?;
    let mut r = Reader::new(v, seq.content);
    let mut oids = Vec::new();
    while !r.done() {
        let o = r.expect(OID)?;
        let o = &v[o.content];
        if !oid_ok(o) {
            return None;
        }
        oids.push(o.to_vec());
    }
    (!oids.is_empty()).then_some(oids)
}

fn ia5(b: &[u8]) -> Option<String> {
    (!b.is_empty() && b.is_ascii()).then(|| String::from_utf8_lossy(b).into_owned())
}

fn general_names(v: &[u8]) -> Option<Vec<GeneralName>> {
    let seq = only(v, SEQUENCE)?;
    let mut r = Reader::new(v, seq.content);
    let mut names = Vec::new();
    while !r.done() {
        let n = r.next()?;
        let b = &v[n.content.clone()];
        names.push(match n.tag {
            0x81 => GeneralName::Email(ia5(b)?),
            0x82 => GeneralName::Dns(ia5(b)?),
            0x86 => GeneralName::Uri(ia5(b)?),
            0xa0 => {
                let mut o = Reader::new(v, n.content);
                let oid = o.expect(OID)?;
                let explicit = o.expect(CONTEXT_0)?;
                if !o.done() || !oid_ok(&v[oid.content.clone()]) {
                    return None;
                }
                let inner = &v[explicit.content];
                if v[oid.content] == *OID_FULCIO_USERNAME.as_bytes() {
                    let s = only(inner, UTF8_STRING)?;
                    GeneralName::Username(String::from_utf8(inner[s.content].to_vec()).ok()?)
                } else {
                    let mut value = Reader::new(inner, 0..inner.len());
                    value.next()?;
                    if !value.done() {
                        return None;
                    }
                    GeneralName::Other(0xa0)
                }
            }
            0x87 if b.len() == 4 || b.len() == 16 => GeneralName::Other(n.tag),
            0x88 if oid_ok(b) => GeneralName::Other(n.tag),
            // x400Address, directoryName, ediPartyName
            0xa3..=0xa5 => GeneralName::Other(n.tag),
            _ => return None,
        });
    }
    (!names.is_empty()).then_some(names)
}

impl Cert {
    pub fn from_der(der: Vec<u8>) -> Result<Cert, String> {
        parse(&der)
            .map_err(|why| format!("not a DER X.509 certificate this verifier reads ({why})"))
    }

    /// Decodes the extensions verification uses; refuses a malformed one
    /// and any critical one it does not know (RFC 5280 §4.2).
    fn decode_extensions(&mut self) -> Result<(), String> {
        for e in &self.extensions {
            let v = &self.der[e.value.clone()];
            let bad = || format!("extension {}: malformed", dotted(&e.oid));
            match e.oid.as_slice() {
                o if o == OID_BASIC_CONSTRAINTS.as_bytes() => {
                    self.basic_constraints = Some(basic_constraints(v).ok_or_else(bad)?);
                }
                o if o == OID_KEY_USAGE.as_bytes() => {
                    let bits = only(v, BIT_STRING).and_then(|t| named_bits(&v[t.content]));
                    self.key_usage = Some(bits.ok_or_else(bad)?);
                }
                o if o == OID_EKU.as_bytes() => {
                    self.eku = Some(extended_key_usage(v).ok_or_else(bad)?);
                }
                o if o == OID_SAN.as_bytes() => {
                    self.san = Some(general_names(v).ok_or_else(bad)?);
                }
                _ if e.critical => {
                    return Err(format!(
                        "unknown critical extension {} (RFC 5280: refused)",
                        dotted(&e.oid)
                    ))
                }
                _ => {}
            }
        }
        Ok(())
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

    /// The DER `TBSCertificate`: what the issuer signed.
    pub fn tbs_der(&self) -> &[u8] {
        &self.der[self.tbs.clone()]
    }

    /// The serial number's content octets.
    pub fn serial(&self) -> &[u8] {
        &self.der[self.serial.clone()]
    }

    /// The signature algorithm (dotted OID): ECDSA with SHA-256 or SHA-384
    /// is what [`Cert::issued_by`] verifies, anything else is refused.
    pub fn signature_algorithm(&self) -> String {
        dotted(&self.sig_alg)
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

    /// Basic constraints, when the certificate has them.
    pub fn basic_constraints(&self) -> Option<BasicConstraints> {
        self.basic_constraints
    }

    /// The key usage bits ([`KU_DIGITAL_SIGNATURE`], ...), when the
    /// certificate has the extension.
    pub fn key_usage(&self) -> Option<u16> {
        self.key_usage
    }

    /// The extended key usages (dotted OIDs), when the certificate has the
    /// extension.
    pub fn extended_key_usage(&self) -> Option<Vec<String>> {
        self.eku
            .as_ref()
            .map(|v| v.iter().map(|o| dotted(o)).collect())
    }

    fn has_eku(&self, oid: ObjectIdentifier) -> bool {
        self.eku
            .as_ref()
            .is_some_and(|v| v.iter().any(|o| o == oid.as_bytes()))
    }

    /// The subject alternative names, when the certificate has them.
    pub fn subject_alt_names(&self) -> Option<&[GeneralName]> {
        self.san.as_deref()
    }

    /// Every extension: dotted OID and criticality, in order.
    pub fn extension_list(&self) -> Vec<(String, bool)> {
        self.extensions
            .iter()
            .map(|e| (dotted(&e.oid), e.critical))
            .collect()
    }

    /// Whether `issuer`'s key made this certificate's signature.
    pub fn issued_by(&self, issuer: &Cert) -> bool {
        if self.der[self.issuer.clone()] != issuer.der[issuer.subject.clone()] {
            return false;
        }
        // ECDSA's AlgorithmIdentifier has no parameters (RFC 5758 §3.2)
        let alg = ObjectIdentifier::from_bytes(&self.sig_alg).ok();
        let Some(hash) = alg.as_ref().and_then(Hash::of_algorithm) else {
            return false;
        };
        if self.sig_params {
            return false;
        }
        let Ok(key) = issuer.key() else {
            return false;
        };
        key.verify(hash, self.tbs_der(), &self.signature)
    }

    /// Subject equals issuer: a root (whoever signed it).
    pub fn is_self_issued(&self) -> bool {
        self.der[self.subject.clone()] == self.der[self.issuer.clone()]
    }

    /// The subject's common name and organisation, for messages.
    pub fn subject_summary(&self) -> String {
        let mut parts = Vec::new();
        let mut rdns = Reader::new(&self.der, self.subject.clone());
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
        if parts.is_empty() {
            return "(empty subject)".into();
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
    /// list extension (RFC 6962 §3.2), the other extensions in order.
    pub fn precert_tbs(&self) -> Vec<u8> {
        let mut exts = Vec::new();
        for e in &self.extensions {
            if e.oid != OID_SCT_LIST.as_bytes() {
                exts.extend_from_slice(&self.der[e.whole.clone()]);
            }
        }
        let mut content = self.der[self.tbs_head.clone()].to_vec();
        if !exts.is_empty() {
            content.extend(tlv(CONTEXT_3, &tlv(SEQUENCE, &exts)));
        }
        tlv(SEQUENCE, &content)
    }

    /// The identity Fulcio put in the SAN: a URI (workflows), an e-mail
    /// address, or a username other-name. Fulcio writes exactly one name;
    /// a SAN with more (or another kind) names no identity this verifier
    /// will pick from.
    pub fn san(&self) -> Result<String, String> {
        let names = self
            .san
            .as_deref()
            .ok_or("it has no subject alternative name")?;
        match names {
            [GeneralName::Uri(s) | GeneralName::Email(s) | GeneralName::Username(s)] => {
                Ok(s.clone())
            }
            [_] => Err(
                "its subject alternative name is not a URI, an e-mail address or a Fulcio username"
                    .into(),
            ),
            _ => Err(format!(
                "its subject alternative name lists {} names, not the one identity Fulcio writes",
                names.len()
            )),
        }
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
        let s = only(bytes, UTF8_STRING)?;
        String::from_utf8(bytes[s.content].to_vec()).ok()
    }

    /// A code-signing leaf: not a CA, digital signature usage, the
    /// code-signing extended key usage.
    pub fn check_leaf_usage(&self) -> Result<(), String> {
        if self.basic_constraints.is_some_and(|bc| bc.ca) {
            return Err("the signing certificate is a CA certificate".into());
        }
        let ku = self.key_usage.ok_or("the certificate has no key usage")?;
        if ku & KU_DIGITAL_SIGNATURE == 0 {
            return Err("the certificate's key usage lacks digital signature".into());
        }
        if self.eku.is_none() {
            return Err("the certificate has no extended key usage (code signing required)".into());
        }
        if !self.has_eku(OID_CODE_SIGNING) {
            return Err("the certificate's extended key usage lacks code signing".into());
        }
        Ok(())
    }

    /// May this certificate issue the certificates below it, `below` of
    /// them not self-issued CAs (RFC 5280 §6.1.4: a CA by basic
    /// constraints, within its path length, with certificate signing in
    /// its key usage when it has one; and, as Go's verifier checks for
    /// cosign, an extended key usage that allows code signing when it
    /// restricts it).
    pub fn check_ca_usage(&self, below: usize) -> Result<(), String> {
        let who = self.subject_summary();
        let bc = self
            .basic_constraints
            .filter(|bc| bc.ca)
            .ok_or_else(|| format!("CA certificate {who} is not a CA (basic constraints)"))?;
        if let Some(limit) = bc.path_len {
            if below > limit as usize {
                return Err(format!(
                    "CA certificate {who} allows {limit} intermediate CAs below it, the chain has {below}"
                ));
            }
        }
        if self.key_usage.is_some_and(|ku| ku & KU_KEY_CERT_SIGN == 0) {
            return Err(format!(
                "CA certificate {who}: its key usage lacks certificate signing"
            ));
        }
        if self.eku.is_some() && !self.has_eku(OID_CODE_SIGNING) && !self.has_eku(OID_ANY_EKU) {
            return Err(format!(
                "CA certificate {who}: its extended key usage does not allow code signing"
            ));
        }
        Ok(())
    }
}

/// The content of a DER OCTET STRING.
pub fn octet_string(der: &[u8]) -> Option<&[u8]> {
    only(der, OCTET_STRING).map(|t| &der[t.content])
}

#[cfg(test)]
mod tests;
