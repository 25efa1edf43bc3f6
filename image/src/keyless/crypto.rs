//! The public-key operations keyless verification needs (and base64),
//! nothing else: ECDSA over P-256 and P-384 with SHA-256 or SHA-384 (what
//! Fulcio, Rekor and the CT log of Sigstore's public instance use), keys
//! given as DER `SubjectPublicKeyInfo`. Any other algorithm is refused by
//! name, never treated as a pass.
//!
//! P-256 goes through `p256` (the crate key-based signatures use), P-384
//! and SHA-384 through `ring` (already linked for TLS): no curve or hash
//! code is added to the activator for keyless verification.

use p256::ecdsa::signature::hazmat::PrehashVerifier as _;
use p256::pkcs8::der::asn1::ObjectIdentifier;
use p256::pkcs8::DecodePublicKey as _;
use sha2::{Digest as _, Sha256};

/// ecdsa-with-SHA256 (RFC 5758).
pub const ECDSA_SHA256: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.4.3.2");
/// ecdsa-with-SHA384 (RFC 5758).
pub const ECDSA_SHA384: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.4.3.3");

/// The hash a signature was made over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hash {
    Sha256,
    Sha384,
}

impl Hash {
    /// The hash of an X.509 signature algorithm, when it is one we verify.
    pub fn of_algorithm(oid: &ObjectIdentifier) -> Option<Hash> {
        if *oid == ECDSA_SHA256 {
            Some(Hash::Sha256)
        } else if *oid == ECDSA_SHA384 {
            Some(Hash::Sha384)
        } else {
            None
        }
    }

    pub fn digest(self, message: &[u8]) -> Vec<u8> {
        match self {
            Hash::Sha256 => Sha256::digest(message).to_vec(),
            Hash::Sha384 => ring::digest::digest(&ring::digest::SHA384, message)
                .as_ref()
                .to_vec(),
        }
    }
}

/// A public key keyless verification can use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Key {
    P256(p256::ecdsa::VerifyingKey),
    /// The uncompressed point of a P-384 key.
    P384(Vec<u8>),
}

/// id-ecPublicKey and the P-384 curve.
const EC_PUBLIC_KEY: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");
const SECP384R1: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.132.0.34");

/// The point of a P-384 `SubjectPublicKeyInfo`.
fn p384_point(der: &[u8]) -> Option<Vec<u8>> {
    use p256::pkcs8::der::Decode as _;
    let spki = p256::pkcs8::spki::SubjectPublicKeyInfoRef::from_der(der).ok()?;
    let curve: ObjectIdentifier = spki.algorithm.parameters?.decode_as().ok()?;
    if spki.algorithm.oid != EC_PUBLIC_KEY || curve != SECP384R1 {
        return None;
    }
    let point = spki.subject_public_key.as_bytes()?;
    (point.len() == 97 && point[0] == 4).then(|| point.to_vec())
}

impl Key {
    /// Parses a DER `SubjectPublicKeyInfo`.
    pub fn from_spki_der(der: &[u8]) -> Result<Key, String> {
        if let Ok(k) = p256::ecdsa::VerifyingKey::from_public_key_der(der) {
            return Ok(Key::P256(k));
        }
        if let Some(point) = p384_point(der) {
            return Ok(Key::P384(point));
        }
        Err("not an ECDSA P-256 or P-384 public key (the only kinds supported)".into())
    }

    /// The hash this key's signatures use when the format does not say
    /// (DSSE envelopes).
    pub fn default_hash(&self) -> Hash {
        match self {
            Key::P256(_) => Hash::Sha256,
            Key::P384(_) => Hash::Sha384,
        }
    }

    /// Checks a DER ECDSA signature over `message` hashed with `hash`.
    pub fn verify(&self, hash: Hash, message: &[u8], signature_der: &[u8]) -> bool {
        match self {
            Key::P256(_) => self.verify_prehashed(&hash.digest(message), signature_der),
            Key::P384(point) => {
                let alg = match hash {
                    Hash::Sha256 => &ring::signature::ECDSA_P384_SHA256_ASN1,
                    Hash::Sha384 => &ring::signature::ECDSA_P384_SHA384_ASN1,
                };
                ring::signature::UnparsedPublicKey::new(alg, point)
                    .verify(message, signature_der)
                    .is_ok()
            }
        }
    }

    /// Checks a DER ECDSA signature over an already computed digest (P-256
    /// keys: what Fulcio issues to signers; a P-384 key's signature is
    /// checked over its message only).
    pub fn verify_prehashed(&self, digest: &[u8], signature_der: &[u8]) -> bool {
        match self {
            Key::P256(k) => p256::ecdsa::Signature::from_der(signature_der)
                .is_ok_and(|s| k.verify_prehash(digest, &s).is_ok()),
            Key::P384(_) => false,
        }
    }
}

/// Standard base64 (what Sigstore's JSON and cosign's annotations use).
pub fn b64(text: &str) -> Result<Vec<u8>, String> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| format!("invalid base64 ({e})"))
}

/// SHA-256, the hash of log IDs, Merkle trees and payload digests.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use p256::ecdsa::signature::Signer as _;
    use p256::pkcs8::EncodePublicKey as _;

    #[test]
    fn verifies_p256_and_refuses_a_flipped_byte() {
        let sk = p256::ecdsa::SigningKey::from_bytes(&[7u8; 32].into()).unwrap();
        let der = sk.verifying_key().to_public_key_der().unwrap();
        let key = Key::from_spki_der(der.as_bytes()).unwrap();
        let sig: p256::ecdsa::Signature = sk.sign(b"message");
        let sig = sig.to_der();
        assert!(key.verify(Hash::Sha256, b"message", sig.as_bytes()));
        assert!(!key.verify(Hash::Sha256, b"messagf", sig.as_bytes()));
        let mut bad = sig.as_bytes().to_vec();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert!(!key.verify(Hash::Sha256, b"message", &bad));
        assert!(Key::from_spki_der(b"junk").is_err());
    }

    #[test]
    fn sha384_is_sha384() {
        assert_eq!(
            hex::encode(Hash::Sha384.digest(b"abc")),
            "cb00753f45a35e8bb5a03d699ac65007272c32ab0eded1631a8b605a43ff5bed8086072ba1e7cc2358baeca134c825a7"
        );
    }
}
