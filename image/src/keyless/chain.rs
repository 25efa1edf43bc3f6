//! The certificate chain to a Fulcio CA of the trusted root, and the
//! leaf's embedded SCTs from a CT log of the trusted root.
//!
//! Given a leaf [`Cert`], the [`TrustedRoot`] and a time, it answers "was
//! this leaf issued by a Fulcio CA we trust, valid at that time" and "did a
//! CT log we trust see it". Time always comes from the caller (the log's
//! integrated time), never from the host clock: a Fulcio certificate lives
//! ten minutes, the log's signed time is what proves the signature was made
//! inside them.

use super::cert::{octet_string, Cert, OID_SCT_LIST};
use super::crypto::{sha256, Hash};
use super::root::TrustedRoot;

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
    let mut unfit = Vec::new();
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
        if let Err(why) = check_ca_chain(&ca.chain) {
            unfit.push(why);
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
    } else if !unfit.is_empty() {
        format!(
            "the certificate was issued by a Fulcio CA of the trusted root that may not issue it: {}",
            unfit.join("; ")
        )
    } else {
        "the certificate does not chain to a Fulcio CA of the trusted root".into()
    })
}

/// Each CA certificate of a chain (issuer of the leaf first) may issue
/// what is below it: a CA, within its path length (counting the
/// intermediates below it that are not self-issued), allowed to sign
/// certificates and code ([`Cert::check_ca_usage`]).
fn check_ca_chain(chain: &[Cert]) -> Result<(), String> {
    for (i, ca) in chain.iter().enumerate() {
        let below = chain[..i].iter().filter(|c| !c.is_self_issued()).count();
        ca.check_ca_usage(below)?;
    }
    Ok(())
}

/// Verifies the leaf's embedded SCTs: at least one must be signed by a CT
/// log of the trusted root valid at the SCT's time, over the precertificate
/// (the leaf without its SCT list) and the issuer's key hash (RFC 6962 §3.2).
pub fn verify_sct(leaf: &Cert, issuer: &Cert, root: &TrustedRoot) -> Result<(), String> {
    let ext = leaf
        .extension(OID_SCT_LIST)
        .ok_or("the certificate carries no SCT (trust.keyless.require_sct)")?;
    let list = octet_string(ext).ok_or("SCT list: not an OCTET STRING")?;
    let scts = parse_sct_list(list).ok_or("SCT list: malformed")?;
    let precert = leaf.precert_tbs();
    let key_hash = sha256(issuer.spki_der());
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

/// Parses a TLS-encoded `SignedCertificateTimestampList` (RFC 6962
/// §3.3): a non-empty list of non-empty serialized SCTs, each read to its
/// end. SCTs of a version other than v1 are skipped, as the RFC says.
fn parse_sct_list(bytes: &[u8]) -> Option<Vec<Sct>> {
    let mut r = Tls(bytes);
    let mut list = Tls(r.vec16()?);
    if !r.0.is_empty() || list.0.is_empty() {
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
        // ECDSA (3): the only signature the logs of a trusted root make here
        if s.take(1)? != [3] {
            return None;
        }
        let signature = s.vec16()?.to_vec();
        if !s.0.is_empty() {
            return None;
        }
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
        // an empty list (RFC 6962: at least one SCT)
        assert!(parse_sct_list(&[0, 0]).is_none());
        let sct = |sig_alg: u8, trailing: &[u8]| {
            let mut s = vec![0u8];
            s.extend([7u8; 32]);
            s.extend(1_700_000_000_000u64.to_be_bytes());
            s.extend([0, 0, 4, sig_alg, 0, 2, 0x30, 0x00]);
            s.extend_from_slice(trailing);
            let mut one = (s.len() as u16).to_be_bytes().to_vec();
            one.extend(s);
            let mut list = (one.len() as u16).to_be_bytes().to_vec();
            list.extend(one);
            list
        };
        assert_eq!(parse_sct_list(&sct(3, &[])).map(|v| v.len()), Some(1));
        // RSA (1) or anonymous (0) signatures, bytes after the signature
        assert!(parse_sct_list(&sct(1, &[])).is_none());
        assert!(parse_sct_list(&sct(0, &[])).is_none());
        assert!(parse_sct_list(&sct(3, &[0])).is_none());
    }
}
