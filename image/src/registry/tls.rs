//! The TLS the registry client offers: rustls on *ring*, limited to what
//! registries and their CDNs speak, so that the activator links no cipher,
//! curve or key format it never uses.
//!
//! * Cipher suites: AES-GCM only, TLS 1.3 and TLS 1.2 (ECDHE with ECDSA or
//!   RSA certificates). ChaCha20-Poly1305 exists for CPUs without AES
//!   instructions; every x86-64 and arm64 server a node runs on has them.
//! * Key exchange: the NIST curves P-256 and P-384 (whose code the ECDSA
//!   checks link anyway). X25519 is not offered: a TLS 1.3 server that
//!   prefers it asks again for P-256 (HelloRetryRequest), which every
//!   registry's TLS stack answers.
//! * Certificate signatures: ECDSA P-256/P-384 and RSA (PKCS#1 v1.5 and
//!   PSS, 2048 to 8192 bits), what public and private CAs issue. Ed25519 is
//!   not accepted (no public CA issues it).
//! * No client certificates: a private key is never loaded.
//!
//! Measured by `ci/bench/activator-size.sh`: Curve25519 (X25519, Ed25519)
//! and ChaCha20-Poly1305 are about 200 KiB of the binary when linked.

use std::sync::Arc;

use rustls::crypto::ring::{cipher_suite as suite, kx_group};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::crypto::{CryptoProvider, GetRandomFailed, KeyProvider, SecureRandom};
use rustls::pki_types::PrivateKeyDer;
use rustls::sign::SigningKey;
use rustls::SignatureScheme;
use webpki::ring as alg;

/// The provider every registry agent uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(CryptoProvider {
        cipher_suites: vec![
            suite::TLS13_AES_128_GCM_SHA256,
            suite::TLS13_AES_256_GCM_SHA384,
            suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
            suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
            suite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
            suite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        ],
        kx_groups: vec![kx_group::SECP256R1, kx_group::SECP384R1],
        signature_verification_algorithms: SIGNATURES,
        secure_random: &Random,
        key_provider: &NoKeys,
    })
}

static SIGNATURES: WebPkiSupportedAlgorithms = WebPkiSupportedAlgorithms {
    all: &[
        alg::ECDSA_P256_SHA256,
        alg::ECDSA_P256_SHA384,
        alg::ECDSA_P384_SHA256,
        alg::ECDSA_P384_SHA384,
        alg::RSA_PSS_2048_8192_SHA256_LEGACY_KEY,
        alg::RSA_PSS_2048_8192_SHA384_LEGACY_KEY,
        alg::RSA_PSS_2048_8192_SHA512_LEGACY_KEY,
        alg::RSA_PKCS1_2048_8192_SHA256,
        alg::RSA_PKCS1_2048_8192_SHA384,
        alg::RSA_PKCS1_2048_8192_SHA512,
        alg::RSA_PKCS1_2048_8192_SHA256_ABSENT_PARAMS,
        alg::RSA_PKCS1_2048_8192_SHA384_ABSENT_PARAMS,
        alg::RSA_PKCS1_2048_8192_SHA512_ABSENT_PARAMS,
    ],
    // For TLS 1.2 the scheme does not fix the curve; for TLS 1.3 it does
    // (rustls checks that itself).
    mapping: &[
        (
            SignatureScheme::ECDSA_NISTP384_SHA384,
            &[alg::ECDSA_P384_SHA384, alg::ECDSA_P256_SHA384],
        ),
        (
            SignatureScheme::ECDSA_NISTP256_SHA256,
            &[alg::ECDSA_P256_SHA256, alg::ECDSA_P384_SHA256],
        ),
        (
            SignatureScheme::RSA_PSS_SHA512,
            &[alg::RSA_PSS_2048_8192_SHA512_LEGACY_KEY],
        ),
        (
            SignatureScheme::RSA_PSS_SHA384,
            &[alg::RSA_PSS_2048_8192_SHA384_LEGACY_KEY],
        ),
        (
            SignatureScheme::RSA_PSS_SHA256,
            &[alg::RSA_PSS_2048_8192_SHA256_LEGACY_KEY],
        ),
        (
            SignatureScheme::RSA_PKCS1_SHA512,
            &[alg::RSA_PKCS1_2048_8192_SHA512],
        ),
        (
            SignatureScheme::RSA_PKCS1_SHA384,
            &[alg::RSA_PKCS1_2048_8192_SHA384],
        ),
        (
            SignatureScheme::RSA_PKCS1_SHA256,
            &[alg::RSA_PKCS1_2048_8192_SHA256],
        ),
    ],
};

/// The kernel's random numbers, through *ring*.
#[derive(Debug)]
struct Random;

impl SecureRandom for Random {
    fn fill(&self, buf: &mut [u8]) -> Result<(), GetRandomFailed> {
        use ring::rand::SecureRandom as _;
        ring::rand::SystemRandom::new()
            .fill(buf)
            .map_err(|_| GetRandomFailed)
    }
}

/// Refuses every private key: the client never authenticates with one.
#[derive(Debug)]
struct NoKeys;

impl KeyProvider for NoKeys {
    fn load_private_key(
        &self,
        _key: PrivateKeyDer<'static>,
    ) -> Result<Arc<dyn SigningKey>, rustls::Error> {
        Err(rustls::Error::General(
            "kubeslot's registry client uses no client certificates".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_provider_is_complete_and_offers_neither_chacha_nor_curve25519() {
        let p = provider();
        // rustls refuses a provider it cannot use (no suites, no groups, a
        // suite without a group)
        rustls::ClientConfig::builder_with_provider(p.clone())
            .with_safe_default_protocol_versions()
            .expect("rustls accepts the provider");
        let names: Vec<String> = p
            .cipher_suites
            .iter()
            .map(|s| format!("{:?}", s.suite()))
            .collect();
        assert!(names.iter().all(|n| n.contains("AES")), "{names:?}");
        let groups: Vec<String> = p
            .kx_groups
            .iter()
            .map(|g| format!("{:?}", g.name()))
            .collect();
        assert_eq!(groups, ["secp256r1", "secp384r1"]);
        assert!(!SIGNATURES
            .mapping
            .iter()
            .any(|(s, _)| *s == SignatureScheme::ED25519));
    }
}
