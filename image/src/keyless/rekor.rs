//! Rekor (v1) transparency-log entries, offline: the signed entry
//! timestamp (SET) with the log key of the trusted root, the inclusion
//! proof (RFC 6962 Merkle audit path) and its signed checkpoint, and the
//! entry body's binding to the signature being verified.
//!
//! The binding is the check whose absence was cosign's GHSA-whqx-f9j3-ch6m:
//! a valid SET proves that *some* entry was logged; only comparing the
//! entry's body with this signature, this certificate and this payload's
//! digest proves it was *this* signature. Entry kinds read: `hashedrekord`
//! and `rekord` 0.0.1 (message signatures, legacy cosign layers) and `dsse`
//! 0.0.1 (DSSE envelopes). Rekor v2 entries (`*/0.0.2`, no integrated time,
//! RFC 3161 timestamps instead) and other kinds are refused as not
//! supported yet, never skipped.

use base64::Engine as _;
use serde::Deserialize;

use super::cert::Cert;
use super::crypto::b64;
use super::crypto::sha256;
use super::root::LogKey;

/// One log entry, from a bundle or a legacy `dev.sigstore.cosign/bundle`.
#[derive(Clone, Debug)]
pub struct Entry {
    pub log_id: Vec<u8>,
    pub log_index: i64,
    pub integrated_time: i64,
    /// The canonicalized body, decoded.
    pub body: Vec<u8>,
    /// The signed entry timestamp (DER ECDSA), when present.
    pub set: Option<Vec<u8>>,
    pub proof: Option<InclusionProof>,
}

#[derive(Clone, Debug)]
pub struct InclusionProof {
    pub log_index: u64,
    pub tree_size: u64,
    pub root_hash: Vec<u8>,
    pub hashes: Vec<Vec<u8>>,
    pub checkpoint: Option<String>,
}

/// What the entry's body must record.
pub struct Expected<'a> {
    /// The signature bytes (DER).
    pub signature: &'a [u8],
    pub cert: &'a Cert,
    /// SHA-256 of what was signed: the artifact or payload (hashedrekord,
    /// rekord) or the DSSE payload (dsse).
    pub digest: [u8; 32],
}

/// The entry kinds read here, from the body itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    HashedRekord,
    Rekord,
    Dsse,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Body {
    api_version: String,
    kind: String,
    spec: serde_json::Value,
}

impl Entry {
    /// The entry's kind, or why it is not one this verifier reads.
    pub fn kind(&self) -> Result<Kind, Unsupported> {
        let body: Body = serde_json::from_slice(&self.body)
            .map_err(|e| Unsupported::Malformed(format!("log entry body is not JSON ({e})")))?;
        match (body.kind.as_str(), body.api_version.as_str()) {
            ("hashedrekord", "0.0.1") => Ok(Kind::HashedRekord),
            ("rekord", "0.0.1") => Ok(Kind::Rekord),
            ("dsse", "0.0.1") => Ok(Kind::Dsse),
            (k, "0.0.2") if k == "hashedrekord" || k == "dsse" => Err(Unsupported::Later(format!(
                "Rekor v2 log entries ({k} 0.0.2)"
            ))),
            (k, v) => Err(Unsupported::Later(format!(
                "Rekor log entries of kind {k} {v}"
            ))),
        }
    }

    /// Verifies the SET: the log's signature over the canonical JSON of
    /// `{body, integratedTime, logID, logIndex}` (keys sorted, no spaces:
    /// every value is a number or a base64/hex string, so this is the
    /// canonical form Rekor signs).
    pub fn verify_set(&self, log: &LogKey) -> Result<(), String> {
        let set = self
            .set
            .as_deref()
            .ok_or("the log entry has no signed entry timestamp")?;
        let canonical = format!(
            r#"{{"body":"{}","integratedTime":{},"logID":"{}","logIndex":{}}}"#,
            base64::engine::general_purpose::STANDARD.encode(&self.body),
            self.integrated_time,
            hex::encode(&self.log_id),
            self.log_index
        );
        if log.verify(canonical.as_bytes(), set)? {
            Ok(())
        } else {
            Err(format!(
                "the signed entry timestamp does not verify with the key of log {}",
                log.base_url
            ))
        }
    }

    /// Verifies the inclusion proof against its root hash and, when
    /// present (required by `need_checkpoint`), the checkpoint signed by
    /// the log's key that commits to that root.
    pub fn verify_inclusion(&self, log: &LogKey, need_checkpoint: bool) -> Result<(), String> {
        let p = self
            .proof
            .as_ref()
            .ok_or("the log entry has no inclusion proof")?;
        let mut leaf = vec![0u8];
        leaf.extend_from_slice(&self.body);
        let root = root_from_proof(p.log_index, p.tree_size, sha256(&leaf), &p.hashes)
            .ok_or("the inclusion proof does not fit its tree size")?;
        if root.as_slice() != p.root_hash.as_slice() {
            return Err("the inclusion proof does not lead to its root hash".into());
        }
        match &p.checkpoint {
            Some(text) => verify_checkpoint(text, log, &p.root_hash, p.tree_size),
            None if need_checkpoint => Err("the inclusion proof has no checkpoint".into()),
            None => Ok(()),
        }
    }

    /// Checks that the body records exactly this signature, certificate
    /// and digest.
    pub fn check_body(&self, kind: Kind, want: &Expected<'_>) -> Result<(), String> {
        let body: Body =
            serde_json::from_slice(&self.body).map_err(|e| format!("log entry body: {e}"))?;
        let spec = &body.spec;
        let s = |ptr: &str| spec.pointer(ptr).and_then(|v| v.as_str());
        let digest_hex = hex::encode(want.digest);
        let same_cert = |b64_pem: Option<&str>| -> bool {
            b64_pem
                .and_then(|t| b64(t).ok())
                .and_then(|pem| Cert::from_pem(&pem).ok())
                .is_some_and(|c| c.der == want.cert.der)
        };
        let same_sig = |b64_sig: Option<&str>| {
            b64_sig
                .and_then(|t| b64(t).ok())
                .is_some_and(|b| b == want.signature)
        };
        match kind {
            Kind::HashedRekord | Kind::Rekord => {
                if s("/data/hash/algorithm") != Some("sha256")
                    || s("/data/hash/value") != Some(digest_hex.as_str())
                {
                    return Err(format!(
                        "the log entry records another digest ({}), not sha256:{digest_hex}",
                        s("/data/hash/value").unwrap_or("none")
                    ));
                }
                if kind == Kind::Rekord && s("/signature/format") != Some("x509") {
                    return Err("the rekord entry's signature format is not x509".into());
                }
                if !same_sig(s("/signature/content")) {
                    return Err("the log entry records another signature".into());
                }
                if !same_cert(s("/signature/publicKey/content")) {
                    return Err("the log entry records another certificate".into());
                }
            }
            Kind::Dsse => {
                if s("/payloadHash/algorithm") != Some("sha256")
                    || s("/payloadHash/value") != Some(digest_hex.as_str())
                {
                    return Err("the log entry records another DSSE payload".into());
                }
                let sigs = spec
                    .pointer("/signatures")
                    .and_then(|v| v.as_array())
                    .ok_or("the dsse entry has no signatures")?;
                let ours = sigs.len() == 1
                    && same_sig(sigs[0].get("signature").and_then(|v| v.as_str()))
                    && same_cert(sigs[0].get("verifier").and_then(|v| v.as_str()));
                if !ours {
                    return Err(
                        "the log entry records another DSSE signature or certificate".into(),
                    );
                }
            }
        }
        Ok(())
    }
}

/// Why an entry is not read.
#[derive(Debug)]
pub enum Unsupported {
    Malformed(String),
    /// Not supported yet (fail closed): the text names what.
    Later(String),
}

/// RFC 9162 §2.1.3.2: the root an audit path leads to, or `None` when the
/// path does not fit the index and size.
fn root_from_proof(index: u64, size: u64, leaf: [u8; 32], path: &[Vec<u8>]) -> Option<[u8; 32]> {
    if index >= size {
        return None;
    }
    let node = |l: &[u8], r: &[u8]| {
        let mut b = Vec::with_capacity(65);
        b.push(1u8);
        b.extend_from_slice(l);
        b.extend_from_slice(r);
        sha256(&b)
    };
    let (mut fnode, mut snode, mut r) = (index, size - 1, leaf);
    for p in path {
        if p.len() != 32 || snode == 0 {
            return None;
        }
        if fnode & 1 == 1 || fnode == snode {
            r = node(p, &r);
            while fnode & 1 == 0 && fnode != 0 {
                fnode >>= 1;
                snode >>= 1;
            }
        } else {
            r = node(&r, p);
        }
        fnode >>= 1;
        snode >>= 1;
    }
    (snode == 0).then_some(r)
}

/// A signed note (`origin\nsize\nroot\n[...]\n\n— name base64(hint‖sig)\n`):
/// one signature line must carry the log's key hint (the first four bytes
/// of its ID) and verify with its key; the note must commit to `root` at
/// `size`.
fn verify_checkpoint(text: &str, log: &LogKey, root: &[u8], size: u64) -> Result<(), String> {
    let split = text
        .find("\n\n")
        .ok_or("the checkpoint has no signature block")?;
    let (note, sigs) = (&text[..=split], &text[split + 2..]);
    let mut lines = note.lines();
    let _origin = lines
        .next()
        .filter(|l| !l.is_empty())
        .ok_or("the checkpoint has no origin")?;
    let tree_size: u64 = lines
        .next()
        .and_then(|l| l.parse().ok())
        .ok_or("the checkpoint has no tree size")?;
    let root_hash = lines
        .next()
        .and_then(|l| b64(l).ok())
        .ok_or("the checkpoint has no root hash")?;
    let hint = log.id.get(..4).ok_or("the log ID is too short")?;
    let signed = sigs.lines().any(|line| {
        let Some(rest) = line.strip_prefix("\u{2014} ") else {
            return false;
        };
        let Some((_name, sig)) = rest.rsplit_once(' ') else {
            return false;
        };
        let Ok(sig) = b64(sig) else { return false };
        sig.len() > 4 && &sig[..4] == hint && log.verify(note.as_bytes(), &sig[4..]) == Ok(true)
    });
    if !signed {
        return Err(format!(
            "the checkpoint is not signed by the key of log {}",
            log.base_url
        ));
    }
    if tree_size != size || root_hash != root {
        return Err("the checkpoint commits to another tree than the inclusion proof".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(b: &[u8]) -> [u8; 32] {
        let mut v = vec![0u8];
        v.extend_from_slice(b);
        sha256(&v)
    }
    fn node(l: &[u8; 32], r: &[u8; 32]) -> [u8; 32] {
        let mut v = vec![1u8];
        v.extend_from_slice(l);
        v.extend_from_slice(r);
        sha256(&v)
    }

    #[test]
    fn audit_paths_of_a_five_leaf_tree() {
        let l: Vec<[u8; 32]> = (0..5u8).map(|i| leaf(&[i])).collect();
        let ab = node(&l[0], &l[1]);
        let cd = node(&l[2], &l[3]);
        let abcd = node(&ab, &cd);
        let root = node(&abcd, &l[4]);
        let path = vec![l[3].to_vec(), ab.to_vec(), l[4].to_vec()];
        assert_eq!(root_from_proof(2, 5, l[2], &path), Some(root));
        assert_eq!(root_from_proof(4, 5, l[4], &[abcd.to_vec()]), Some(root));
        // a flipped bit, a wrong index, a short path: no root
        let mut bad = path.clone();
        bad[1][0] ^= 1;
        assert_ne!(root_from_proof(2, 5, l[2], &bad), Some(root));
        assert_ne!(root_from_proof(3, 5, l[2], &path), Some(root));
        assert_eq!(root_from_proof(2, 5, l[2], &path[..2]), None);
        assert_eq!(root_from_proof(5, 5, l[2], &path), None);
    }
}
