//! The public-key operations keyless verification needs (and base64), nothing else:
//! ECDSA over P-256 and P-384 with SHA-256 or SHA-384 (what Fulcio, Rekor
//! and the CT log of Sigstore's public instance use), keys given as DER
//! `SubjectPublicKeyInfo`. Any other algorithm is refused by name, never
//! treated as a pass.

use p256::ecdsa::signature::hazmat::PrehashVerifier as _;
use p256::pkcs8::der::asn1::ObjectIdentifier;
use p256::pkcs8::DecodePublicKey as _;
use sha2::{Digest as _, Sha256, Sha384};

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
            Hash::Sha384 => Sha384::digest(message).to_vec(),
        }
    }
}

/// A public key keyless verification can use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Key {
    P256(p256::ecdsa::VerifyingKey),
    P384(p384::ecdsa::VerifyingKey),
}

impl Key {
    /// Parses a DER `SubjectPublicKeyInfo`.
    pub fn from_spki_der(der: &[u8]) -> Result<Key, String> {
        if let Ok(k) = p256::ecdsa::VerifyingKey::from_public_key_der(der) {
            return Ok(Key::P256(k));
        }
        if let Ok(k) = p384::ecdsa::VerifyingKey::from_public_key_der(der) {
            return Ok(Key::P384(k));
        }
        Err("not an ECDSA P-256 or P-384 public key (the only kinds supported)".into())
    }

    /// The hash this key's signatures use when the format does not say
    /// (Rekor and CT log keys, Fulcio leaf keys).
    pub fn default_hash(&self) -> Hash {
        match self {
            Key::P256(_) => Hash::Sha256,
            Key::P384(_) => Hash::Sha384,
        }
    }

    /// Checks a DER ECDSA signature over `message` hashed with `hash`.
    pub fn verify(&self, hash: Hash, message: &[u8], signature_der: &[u8]) -> bool {
        self.verify_prehashed(&hash.digest(message), signature_der)
    }

    /// Checks a DER ECDSA signature over an already computed digest.
    pub fn verify_prehashed(&self, digest: &[u8], signature_der: &[u8]) -> bool {
        match self {
            Key::P256(k) => p256::ecdsa::Signature::from_der(signature_der)
                .is_ok_and(|s| k.verify_prehash(digest, &s).is_ok()),
            Key::P384(k) => p384::ecdsa::Signature::from_der(signature_der)
                .is_ok_and(|s| k.verify_prehash(digest, &s).is_ok()),
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
}
