//! Release statements: a signed, short-lived claim that a digest is the
//! current release of a repository's tag, with the rollout schedule.
//!
//! A signature never expires, so a mirror that keeps serving the last image
//! it saw would hold a following fleet on it forever (the freeze attack).
//! The statement does expire: the publishing workflow re-issues it on a
//! schedule, and a following host takes an update only under an unexpired
//! one. Like Bottlerocket's TUF timestamp, expiry is checked when an update
//! is taken, never when a host boots, re-renders or rolls back.
//!
//! Format, beside the image as cosign stores `.sig`: the tag
//! `sha256-<hex>.release` of the image's top-level digest (in a registry;
//! the `index.json` entry of that name in a layout or archive) names an OCI
//! manifest with one layer of [`MEDIA_TYPE_STATEMENT`]: the statement's
//! JSON, signed (ECDSA P-256, base64 DER) in the
//! `dev.cosignproject.cosign/signature` annotation with the image's key.
//! Re-issuing replaces the tag (a tag, not a referrer: the newest statement
//! is the one a host reads, old ones do not pile up).
//!
//! This module parses and verifies (the builder signs); it reads no clock:
//! callers pass the time.

use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::oci::{Manifest, ANNOTATION_COSIGN_SIGNATURE};
use crate::reference::Identity as Repository;
use crate::signature::TrustedKeys;
use crate::time::{parse_rfc3339, rfc3339_seconds};

/// The statement layer's media type.
pub const MEDIA_TYPE_STATEMENT: &str = "application/vnd.kubeslot.release-statement.v1+json";
/// The attachment kind: the tag is `sha256-<hex>.release`.
pub const ATTACHMENT_KIND: &str = "release";
/// Statements larger than this are refused unread.
pub const MAX_STATEMENT_BYTES: u64 = 16 * 1024;
/// The default schedule, like Bottlerocket's default waves: hours after the
/// first issue, and the percentage of the fleet that may start from then.
pub const DEFAULT_SCHEDULE: &[(u64, u32)] = &[
    (1, 1),
    (4, 5),
    (24, 15),
    (48, 40),
    (72, 60),
    (96, 90),
    (120, 100),
];

/// The signed statement.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Statement {
    /// `registry/repository` (the identity the image's signature names).
    pub repository: String,
    pub tag: String,
    /// The image's top-level digest (index, or the manifest).
    pub digest: Digest,
    /// RFC 3339 UTC.
    pub issued: String,
    /// RFC 3339 UTC; a following host refuses the statement from then on.
    pub expires: String,
    /// Waves, in order of `start`: from `start` on, nodes whose place is
    /// below `percent`/100 may take the release.
    pub schedule: Vec<Wave>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Wave {
    pub percent: u32,
    /// RFC 3339 UTC.
    pub start: String,
}

/// Why a statement does not count; every variant names the digest.
#[derive(Debug, thiserror::Error)]
pub enum StatementError {
    #[error("image {digest}: no release statement found (tag {tag}): a following host takes only releases with one (kubeslot-builder statement issue)")]
    Missing { digest: Digest, tag: String },
    #[error("image {digest}: release statement {layer}: {reason}")]
    Malformed {
        digest: Digest,
        layer: Digest,
        reason: String,
    },
    #[error("image {digest}: release statement names digest {named}, not this image")]
    WrongDigest { digest: Digest, named: Digest },
    #[error("image {digest}: release statement is for {found}, not {expected} (trust.identity)")]
    WrongIdentity {
        digest: Digest,
        expected: String,
        found: String,
    },
    #[error("image {digest}: reading its release statement: {reason}")]
    Source { digest: Digest, reason: String },
    #[error("image {digest}: release statements are signed with keys: trust.public_keys names none (keyless statements are not supported yet)")]
    NoKeys { digest: Digest },
    #[error("image {digest}: release statement is not signed by any of the {keys} trusted key(s)")]
    Untrusted { digest: Digest, keys: usize },
    #[error("image {digest}: release statement expired at {expires} (a mirror may be frozen)")]
    Expired { digest: Digest, expires: String },
    #[error("image {digest}: release statement issued at {issued}, after this host's clock ({now}): is the clock behind?")]
    FromTheFuture {
        digest: Digest,
        issued: String,
        now: String,
    },
}

impl Statement {
    /// A statement issued at `issued` (seconds since the epoch) valid for
    /// `valid_secs`, with `schedule` ([`default_schedule`] for the usual).
    pub fn new(
        repository: &str,
        tag: &str,
        digest: Digest,
        issued: u64,
        valid_secs: u64,
        schedule: Vec<Wave>,
    ) -> Self {
        Statement {
            repository: repository.to_string(),
            tag: tag.to_string(),
            digest,
            issued: rfc3339_seconds(issued),
            expires: rfc3339_seconds(issued.saturating_add(valid_secs)),
            schedule,
        }
    }

    /// The exact bytes that get signed.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("statement serialises")
    }

    pub fn issued_secs(&self) -> i64 {
        parse_rfc3339(&self.issued).unwrap_or(i64::MAX)
    }

    pub fn expires_secs(&self) -> i64 {
        parse_rfc3339(&self.expires).unwrap_or(i64::MIN)
    }

    /// Whether the statement holds at `now` (seconds since the epoch).
    pub fn check_current(&self, now: i64) -> Result<(), StatementError> {
        if now >= self.expires_secs() {
            return Err(StatementError::Expired {
                digest: self.digest,
                expires: self.expires.clone(),
            });
        }
        // A few minutes of skew between the signer and a host are normal.
        if self.issued_secs() > now.saturating_add(300) {
            return Err(StatementError::FromTheFuture {
                digest: self.digest,
                issued: self.issued.clone(),
                now: rfc3339_seconds(now.max(0) as u64),
            });
        }
        Ok(())
    }

    /// The time (seconds since the epoch) from which a node at `place` in
    /// `[0, 1)` may start: the first wave whose percentage covers it.
    /// `None` when no wave does (a schedule that stops short of 100%).
    pub fn wave_start(&self, place: f64) -> Option<(usize, i64)> {
        self.schedule.iter().enumerate().find_map(|(i, w)| {
            (place * 100.0 < f64::from(w.percent))
                .then(|| (i, parse_rfc3339(&w.start).unwrap_or(i64::MAX)))
        })
    }

    fn check_shape(&self) -> Result<(), String> {
        for (name, t) in [("issued", &self.issued), ("expires", &self.expires)] {
            if parse_rfc3339(t).is_none() {
                return Err(format!("{name} {t:?} is not an RFC 3339 time"));
            }
        }
        let mut last = (0, i64::MIN);
        for w in &self.schedule {
            let start = parse_rfc3339(&w.start)
                .ok_or_else(|| format!("wave start {:?} is not an RFC 3339 time", w.start))?;
            if w.percent == 0 || w.percent > 100 || w.percent < last.0 || start < last.1 {
                return Err("schedule: waves must grow in percent (1 to 100) and start".into());
            }
            last = (w.percent, start);
        }
        Ok(())
    }
}

/// The default schedule from `first` (seconds since the epoch): see
/// [`DEFAULT_SCHEDULE`].
pub fn default_schedule(first: u64) -> Vec<Wave> {
    DEFAULT_SCHEDULE
        .iter()
        .map(|&(hours, percent)| Wave {
            percent,
            start: rfc3339_seconds(first + hours * 3600),
        })
        .collect()
}

/// A node's place in a release's rollout, in `[0, 1)`: a stable hash of the
/// node name and the image digest, so a node is early for one release and
/// late for another, and every node computes its own without asking anyone.
pub fn place(node_name: &str, digest: &Digest) -> f64 {
    let h = Digest::of(format!("{node_name}\n{digest}").as_bytes());
    let bytes: [u8; 8] = h.as_bytes()[..8].try_into().expect("32-byte digest");
    // 53 bits: exactly representable, strictly below 1.
    (u64::from_be_bytes(bytes) >> 11) as f64 / (1u64 << 53) as f64
}

/// Reads the `.release` artifact of `digest` from `source` and verifies it
/// ([`verify`]).
pub fn read(
    source: &crate::source::Source,
    keys: &TrustedKeys,
    identity: Option<&Repository>,
    digest: Digest,
) -> Result<Statement, StatementError> {
    if keys.is_empty() {
        return Err(StatementError::NoKeys { digest });
    }
    let err = |e: crate::source::SourceError| StatementError::Source {
        digest,
        reason: e.to_string(),
    };
    let Some(manifest) = source.attachment(&digest, ATTACHMENT_KIND).map_err(err)? else {
        return Err(StatementError::Missing {
            digest,
            tag: digest.attachment_tag(ATTACHMENT_KIND),
        });
    };
    verify(keys, digest, identity, &manifest, |layer| {
        source
            .read_blob(layer, MAX_STATEMENT_BYTES)
            .map_err(|e| std::io::Error::other(e.to_string()))
    })
}

/// Verifies the `.release` artifact `manifest` for the image `digest`:
/// the one statement layer, its bytes (read by `fetch`, digest checked here
/// too), its signature by a trusted key, its digest and, when given, its
/// repository. Does not look at the clock ([`Statement::check_current`]).
pub fn verify(
    keys: &TrustedKeys,
    digest: Digest,
    identity: Option<&Repository>,
    manifest: &Manifest,
    mut fetch: impl FnMut(&crate::oci::Descriptor) -> std::io::Result<Vec<u8>>,
) -> Result<Statement, StatementError> {
    let Some(layer) = manifest
        .layers
        .iter()
        .find(|l| l.media_type == MEDIA_TYPE_STATEMENT)
    else {
        return Err(StatementError::Missing {
            digest,
            tag: digest.attachment_tag(ATTACHMENT_KIND),
        });
    };
    let malformed = |reason: String| StatementError::Malformed {
        digest,
        layer: layer.digest,
        reason,
    };
    if layer.size > MAX_STATEMENT_BYTES {
        return Err(malformed(format!(
            "{} bytes exceed the {MAX_STATEMENT_BYTES}-byte limit",
            layer.size
        )));
    }
    let signature = layer
        .annotations
        .get(ANNOTATION_COSIGN_SIGNATURE)
        .ok_or_else(|| malformed(format!("no {ANNOTATION_COSIGN_SIGNATURE} annotation")))?;
    let bytes = fetch(layer).map_err(|e| malformed(format!("cannot read it: {e}")))?;
    if Digest::of(&bytes) != layer.digest {
        return Err(malformed("its bytes do not match the layer digest".into()));
    }
    // The signature is over the bytes as stored, checked before parsing.
    if !keys.accepts_signature(&bytes, signature) {
        return Err(StatementError::Untrusted {
            digest,
            keys: keys.len(),
        });
    }
    let statement: Statement = serde_json::from_slice(&bytes)
        .map_err(|e| malformed(format!("not a release statement: {e}")))?;
    statement.check_shape().map_err(malformed)?;
    if statement.digest != digest {
        return Err(StatementError::WrongDigest {
            digest,
            named: statement.digest,
        });
    }
    if let Some(expected) = identity {
        match Repository::of_reference(&statement.repository) {
            Ok(found) if &found == expected => {}
            _ => {
                return Err(StatementError::WrongIdentity {
                    digest,
                    expected: expected.to_string(),
                    found: statement.repository.clone(),
                })
            }
        }
    }
    Ok(statement)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_stable_spread_and_below_one() {
        let d = Digest::of(b"release");
        assert_eq!(place("node-1", &d), place("node-1", &d));
        assert_ne!(place("node-1", &d), place("node-1", &Digest::of(b"other")));
        let places: Vec<f64> = (0..1000).map(|i| place(&format!("n{i}"), &d)).collect();
        assert!(places.iter().all(|p| (0.0..1.0).contains(p)));
        let early = places.iter().filter(|&&p| p < 0.1).count();
        assert!((60..140).contains(&early), "{early} of 1000 below 0.1");
    }

    #[test]
    fn waves_open_in_order_and_statements_expire() {
        let d = Digest::of(b"release");
        let s = Statement::new(
            "r.example/node",
            "stable",
            d,
            0,
            7 * 86_400,
            default_schedule(0),
        );
        assert_eq!(s.wave_start(0.005), Some((0, 3600)));
        assert_eq!(s.wave_start(0.03), Some((1, 4 * 3600)));
        assert_eq!(s.wave_start(0.999), Some((6, 120 * 3600)));
        assert!(s.check_current(3600).is_ok());
        let e = s.check_current(7 * 86_400).unwrap_err().to_string();
        assert!(
            e.ends_with(
                "release statement expired at 1970-01-08T00:00:00Z (a mirror may be frozen)"
            ),
            "{e}"
        );
        let mut short = s.clone();
        short.schedule.truncate(2);
        assert_eq!(short.wave_start(0.5), None);
        assert!(s.check_shape().is_ok());
        short.schedule.reverse();
        assert!(short.check_shape().is_err());
    }
}
