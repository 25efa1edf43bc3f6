//! A small DER writer for the test Sigstore instance: the TLVs X.509
//! certificates are made of, and the signers (P-384 through `ring`, as
//! Fulcio's CAs; P-256 through `p256`, as Fulcio's leaves and the Rekor and
//! CT logs). It only writes; the product's walker
//! (`kubeslot_image::keyless::cert`) is what reads, so the two are
//! independent implementations of the same encoding, and `openssl` checks
//! what this one writes (test-support's `tests/test_sigstore.rs`).

use p256::ecdsa::signature::Signer as _;
use p256::pkcs8::EncodePublicKey as _;
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, KeyPair as _, ECDSA_P384_SHA384_ASN1_SIGNING};

pub const SEQUENCE: u8 = 0x30;
pub const SET: u8 = 0x31;
pub const INTEGER: u8 = 0x02;
pub const BIT_STRING: u8 = 0x03;
pub const OCTET_STRING: u8 = 0x04;
pub const OID: u8 = 0x06;
pub const BOOLEAN: u8 = 0x01;
pub const UTF8_STRING: u8 = 0x0c;
pub const PRINTABLE_STRING: u8 = 0x13;

pub const ECDSA_SHA256: &str = "1.2.840.10045.4.3.2";
pub const ECDSA_SHA384: &str = "1.2.840.10045.4.3.3";

/// Length octets, minimal.
pub fn length(len: usize) -> Vec<u8> {
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

pub fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut v = vec![tag];
    v.extend(length(content.len()));
    v.extend_from_slice(content);
    v
}

/// A SEQUENCE of already encoded parts.
pub fn seq(parts: &[Vec<u8>]) -> Vec<u8> {
    tlv(SEQUENCE, &parts.concat())
}

/// An OBJECT IDENTIFIER from its dotted form.
pub fn oid(dotted: &str) -> Vec<u8> {
    let arcs: Vec<u64> = dotted.split('.').map(|a| a.parse().unwrap()).collect();
    let mut content = Vec::new();
    let mut push = |mut v: u64| {
        let mut groups = vec![(v & 0x7f) as u8];
        v >>= 7;
        while v > 0 {
            groups.push((v & 0x7f) as u8 | 0x80);
            v >>= 7;
        }
        groups.reverse();
        content.extend(groups);
    };
    push(arcs[0] * 40 + arcs[1]);
    for a in &arcs[2..] {
        push(*a);
    }
    tlv(OID, &content)
}

/// A non-negative INTEGER from big-endian magnitude bytes.
pub fn uint(magnitude: &[u8]) -> Vec<u8> {
    let mut m: Vec<u8> = magnitude.iter().copied().skip_while(|b| *b == 0).collect();
    if m.first().is_none_or(|b| b & 0x80 != 0) {
        m.insert(0, 0);
    }
    tlv(INTEGER, &m)
}

pub fn bit_string(bytes: &[u8]) -> Vec<u8> {
    let mut c = vec![0u8];
    c.extend_from_slice(bytes);
    tlv(BIT_STRING, &c)
}

pub fn octets(bytes: &[u8]) -> Vec<u8> {
    tlv(OCTET_STRING, bytes)
}

pub fn utf8(s: &str) -> Vec<u8> {
    tlv(UTF8_STRING, s.as_bytes())
}

/// UTCTime through 2049, GeneralizedTime from 2050 (RFC 5280 §4.1.2.5).
pub fn time(unix: i64) -> Vec<u8> {
    let t = kubeslot_image::time::rfc3339_seconds(unix as u64);
    let digits: String = t.chars().filter(char::is_ascii_digit).collect();
    if &digits[..4] < "2050" {
        tlv(0x17, format!("{}Z", &digits[2..]).as_bytes())
    } else {
        tlv(0x18, format!("{digits}Z").as_bytes())
    }
}

/// A Name of `O=org, CN=cn` (what Fulcio's CAs are named like); an empty
/// Name when both are empty (Fulcio's leaves).
pub fn name(org: &str, cn: &str) -> Vec<u8> {
    let mut rdns = Vec::new();
    if !org.is_empty() {
        rdns.push(tlv(
            SET,
            &seq(&[oid("2.5.4.10"), tlv(PRINTABLE_STRING, org.as_bytes())]),
        ));
    }
    if !cn.is_empty() {
        rdns.push(tlv(
            SET,
            &seq(&[oid("2.5.4.3"), tlv(PRINTABLE_STRING, cn.as_bytes())]),
        ));
    }
    seq(&rdns)
}

/// One extension, `critical` encoded as DER does (TRUE only).
pub fn extension(oid_dotted: &str, critical: bool, value: &[u8]) -> Vec<u8> {
    let mut parts = vec![oid(oid_dotted)];
    if critical {
        parts.push(tlv(BOOLEAN, &[0xff]));
    }
    parts.push(octets(value));
    seq(&parts)
}

/// A signing key: P-384 (`ring`, random) or P-256 (`p256`, from a seed).
pub enum Signer {
    P384(EcdsaKeyPair),
    P256(p256::ecdsa::SigningKey),
}

impl Signer {
    /// A fresh random P-384 key.
    pub fn p384() -> Signer {
        let rng = SystemRandom::new();
        let doc = EcdsaKeyPair::generate_pkcs8(&ECDSA_P384_SHA384_ASN1_SIGNING, &rng).unwrap();
        Signer::P384(
            EcdsaKeyPair::from_pkcs8(&ECDSA_P384_SHA384_ASN1_SIGNING, doc.as_ref(), &rng).unwrap(),
        )
    }

    /// A P-256 key from 32 seed bytes.
    pub fn p256(seed: [u8; 32]) -> Signer {
        Signer::P256(p256::ecdsa::SigningKey::from_bytes(&seed.into()).unwrap())
    }

    /// The DER SubjectPublicKeyInfo.
    pub fn spki(&self) -> Vec<u8> {
        match self {
            Signer::P384(k) => seq(&[
                seq(&[oid("1.2.840.10045.2.1"), oid("1.3.132.0.34")]),
                bit_string(k.public_key().as_ref()),
            ]),
            Signer::P256(k) => k
                .verifying_key()
                .to_public_key_der()
                .unwrap()
                .as_bytes()
                .to_vec(),
        }
    }

    /// The X.509 signature algorithm this key signs with.
    pub fn algorithm(&self) -> &'static str {
        match self {
            Signer::P384(_) => ECDSA_SHA384,
            Signer::P256(_) => ECDSA_SHA256,
        }
    }

    /// A DER ECDSA signature over `message` (SHA-384 or SHA-256).
    pub fn sign(&self, message: &[u8]) -> Vec<u8> {
        match self {
            Signer::P384(k) => k
                .sign(&SystemRandom::new(), message)
                .unwrap()
                .as_ref()
                .to_vec(),
            Signer::P256(k) => {
                let s: p256::ecdsa::Signature = k.sign(message);
                s.to_der().as_bytes().to_vec()
            }
        }
    }
}

/// The parts of a certificate, encoded.
pub struct TbsSpec<'a> {
    pub serial: &'a [u8],
    pub issuer: &'a [u8],
    pub subject: &'a [u8],
    pub not_before: i64,
    pub not_after: i64,
    pub spki: &'a [u8],
    /// Encoded extensions, in order.
    pub extensions: &'a [Vec<u8>],
}

/// The TBSCertificate of `spec`, to be signed by a key of `algorithm`.
pub fn tbs(spec: &TbsSpec<'_>, algorithm: &str) -> Vec<u8> {
    let mut parts = vec![
        tlv(0xa0, &uint(&[2])),
        uint(spec.serial),
        seq(&[oid(algorithm)]),
        spec.issuer.to_vec(),
        seq(&[time(spec.not_before), time(spec.not_after)]),
        spec.subject.to_vec(),
        spec.spki.to_vec(),
    ];
    if !spec.extensions.is_empty() {
        parts.push(tlv(0xa3, &seq(spec.extensions)));
    }
    seq(&parts)
}

/// The certificate: `tbs` signed by `issuer`.
pub fn certificate(tbs: Vec<u8>, issuer: &Signer) -> Vec<u8> {
    let signature = issuer.sign(&tbs);
    seq(&[tbs, seq(&[oid(issuer.algorithm())]), bit_string(&signature)])
}

/// PEM of a DER certificate.
pub fn pem(der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).unwrap());
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings() {
        assert_eq!(oid("2.5.29.17"), vec![0x06, 0x03, 0x55, 0x1d, 0x11]);
        assert_eq!(
            oid("1.3.6.1.4.1.57264.1.8"),
            vec![0x06, 0x0a, 0x2b, 0x06, 0x01, 0x04, 0x01, 0x83, 0xbf, 0x30, 0x01, 0x08]
        );
        assert_eq!(uint(&[0x80]), vec![0x02, 0x02, 0x00, 0x80]);
        assert_eq!(uint(&[0, 0, 5]), vec![0x02, 0x01, 0x05]);
        assert_eq!(length(300), vec![0x82, 1, 44]);
        assert_eq!(time(1_634_714_716), b"\x17\x0d211020072516Z".to_vec());
        assert_eq!(time(2_556_144_000), b"\x18\x0f20510101000000Z".to_vec());
    }
}
