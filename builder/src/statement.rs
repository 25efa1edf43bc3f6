//! Release statements ([`kubeslot_image::statement`]): issuing one for the
//! image a tag names, in a registry or an OCI layout, and reading one back.
//!
//! Given the signing key (the image's), the image and the validity; the
//! statement is stored under `sha256-<hex>.release` of the image's
//! top-level digest, replacing the one there, and read back and verified
//! with the one verifier hosts run before success is reported. A renewal
//! (the publishing workflow's scheduled job) keeps the schedule of the
//! statement it replaces, so waves keep counting from the release's first
//! statement, not from each renewal. It does not sign images (`sign`).

use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _};
use base64::Engine as _;
use kubeslot_image::layout::{BlobDir, Layout};
use kubeslot_image::oci::{
    Descriptor, Manifest, ANNOTATION_COSIGN_SIGNATURE, ANNOTATION_REF_NAME, MEDIA_TYPE_CONFIG,
    MEDIA_TYPE_MANIFEST,
};
use kubeslot_image::reference::Identity;
use kubeslot_image::signature::TrustedKeys;
use kubeslot_image::statement::{
    self, default_schedule, Statement, StatementError, Wave, ATTACHMENT_KIND, MAX_STATEMENT_BYTES,
    MEDIA_TYPE_STATEMENT,
};
use kubeslot_image::{Digest, ImageRef};
use p256::ecdsa::signature::Signer as _;
use p256::ecdsa::{Signature, SigningKey};
use serde::Serialize;

use crate::registry::{RegistryOptions, Remote};
use crate::sign::{trusted, Artifact, EMPTY_CONFIG};
use crate::transfer;

/// What to issue: the validity and, for a first statement, the schedule.
#[derive(Clone, Debug)]
pub struct Issue {
    /// Seconds the statement is valid from now.
    pub valid_secs: u64,
    /// Start a new schedule even when a statement for the digest exists.
    pub new_schedule: bool,
    /// The schedule as (hours after now, percent); `None`: the default.
    pub schedule: Option<Vec<(u64, u32)>>,
}

/// What `statement issue` stored (or `statement verify` read).
#[derive(Debug, Serialize)]
pub struct Issued {
    pub image: String,
    pub tag: String,
    pub statement: Statement,
    /// The schedule was kept from the statement this one replaced.
    pub renewed: bool,
}

impl std::fmt::Display for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.statement;
        write!(
            f,
            "release statement {} for {}:{} ({})\n  issued {}, expires {}{}",
            self.tag,
            s.repository,
            s.tag,
            s.digest,
            s.issued,
            s.expires,
            if self.renewed {
                " (renewed: schedule kept)"
            } else {
                ""
            }
        )?;
        for w in &s.schedule {
            write!(f, "\n  {:>3}% from {}", w.percent, w.start)?;
        }
        Ok(())
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The signed `.release` artifact of `statement`.
pub fn statement_artifact(key: &SigningKey, statement: &Statement) -> Artifact {
    let bytes = statement.to_bytes();
    let sig: Signature = key.sign(&bytes);
    let mut layer = Descriptor::new(MEDIA_TYPE_STATEMENT, Digest::of(&bytes), bytes.len() as u64);
    layer.annotations.insert(
        ANNOTATION_COSIGN_SIGNATURE.into(),
        base64::engine::general_purpose::STANDARD.encode(sig.to_der().as_bytes()),
    );
    let manifest = Manifest {
        schema_version: 2,
        media_type: Some(MEDIA_TYPE_MANIFEST.into()),
        artifact_type: None,
        config: Descriptor::new(
            MEDIA_TYPE_CONFIG,
            Digest::of(EMPTY_CONFIG),
            EMPTY_CONFIG.len() as u64,
        ),
        layers: vec![layer],
        subject: None,
        annotations: Default::default(),
    };
    Artifact {
        tag: statement.digest.attachment_tag(ATTACHMENT_KIND),
        manifest: serde_json::to_vec(&manifest).expect("manifest serialises"),
        media_type: MEDIA_TYPE_MANIFEST.into(),
        blobs: vec![EMPTY_CONFIG.to_vec(), bytes],
    }
}

/// The statement to store now for `digest`: the previous one's schedule
/// when it verifies with this key and a new schedule was not asked for.
fn compose(
    repository: &str,
    tag: &str,
    digest: Digest,
    previous: Option<Statement>,
    issue: &Issue,
) -> (Statement, bool) {
    let now = now();
    let kept = previous
        .filter(|_| !issue.new_schedule && issue.schedule.is_none())
        .map(|p| p.schedule);
    let renewed = kept.is_some();
    let schedule = kept.unwrap_or_else(|| match &issue.schedule {
        None => default_schedule(now),
        Some(waves) => waves
            .iter()
            .map(|&(hours, percent)| Wave {
                percent,
                start: kubeslot_image::time::rfc3339_seconds(now + hours * 3600),
            })
            .collect(),
    });
    (
        Statement::new(repository, tag, digest, now, issue.valid_secs, schedule),
        renewed,
    )
}

/// Issues a statement for the image `image` (a tag) in a registry.
pub async fn issue_registry(
    key: &SigningKey,
    image: &ImageRef,
    identity: Option<&str>,
    issue: &Issue,
    opts: &RegistryOptions,
) -> anyhow::Result<Issued> {
    let Some(tag) = image.tag.clone() else {
        bail!("{image}: a release statement is for a tag: name the image by its tag");
    };
    let remote = Remote::connect(image, opts, true).await?;
    let top = remote
        .pull_manifest(&tag)
        .await?
        .with_context(|| format!("{image}: the registry has no tag {tag:?}"))?;
    let repository = identity.map_or_else(|| image.name(), str::to_string);
    let previous = read_registry(&remote, &trusted(key), None, top.digest)
        .await
        .ok();
    let (statement, renewed) = compose(&repository, &tag, top.digest, previous, issue);
    let artifact = statement_artifact(key, &statement);
    transfer::add_artifact_to_registry(&remote, &artifact).await?;
    let back = read_registry(&remote, &trusted(key), None, top.digest).await?;
    if back != statement {
        bail!("{image}: the registry serves another statement than the one just stored");
    }
    Ok(Issued {
        image: image.with_digest(top.digest).to_string(),
        tag: artifact.tag,
        statement,
        renewed,
    })
}

/// Reads and verifies the statement of `digest` in a registry.
pub async fn read_registry(
    remote: &Remote,
    keys: &TrustedKeys,
    identity: Option<&Identity>,
    digest: Digest,
) -> anyhow::Result<Statement> {
    let tag = digest.attachment_tag(ATTACHMENT_KIND);
    let Some(raw) = remote.pull_manifest(&tag).await? else {
        return Err(StatementError::Missing { digest, tag }.into());
    };
    let manifest: Manifest = serde_json::from_slice(&raw.bytes)
        .with_context(|| format!("release statement {tag} is not a manifest"))?;
    let tmp = tempfile::tempdir()?;
    let blobs = BlobDir::create(tmp.path())?;
    for l in &manifest.layers {
        if l.media_type == MEDIA_TYPE_STATEMENT && l.size <= MAX_STATEMENT_BYTES {
            remote.pull_blob(&l.digest, l.size, &blobs).await?;
        }
    }
    Ok(statement::verify(keys, digest, identity, &manifest, |l| {
        blobs
            .read_verified(&l.digest, Some(l.size), MAX_STATEMENT_BYTES)
            .map_err(|e| std::io::Error::other(e.to_string()))
    })?)
}

/// Issues a statement for the image tagged `tag` in a layout.
pub fn issue_layout(
    key: &SigningKey,
    layout: &Layout,
    tag: &str,
    repository: &str,
    issue: &Issue,
) -> anyhow::Result<Issued> {
    let name = format!("oci:{}", layout.dir().display());
    let root = transfer::select_root(&layout.index()?, Some(tag))
        .map_err(|reason| anyhow::anyhow!("{name}: {reason}"))?;
    let previous = read_layout(layout, &trusted(key), None, root.digest).ok();
    let (statement, renewed) = compose(repository, tag, root.digest, previous, issue);
    let artifact = statement_artifact(key, &statement);
    transfer::add_artifact_to_layout(layout, &artifact)?;
    let back = read_layout(layout, &trusted(key), None, root.digest)?;
    if back != statement {
        bail!("{name}: the layout holds another statement than the one just stored");
    }
    Ok(Issued {
        image: format!("{name}@{}", root.digest),
        tag: artifact.tag,
        statement,
        renewed,
    })
}

/// Reads and verifies the statement of `digest` in a layout.
pub fn read_layout(
    layout: &Layout,
    keys: &TrustedKeys,
    identity: Option<&Identity>,
    digest: Digest,
) -> anyhow::Result<Statement> {
    let tag = digest.attachment_tag(ATTACHMENT_KIND);
    let index = layout.index()?;
    let Some(entry) = index
        .manifests
        .iter()
        .find(|e| e.annotations.get(ANNOTATION_REF_NAME) == Some(&tag))
    else {
        return Err(StatementError::Missing { digest, tag }.into());
    };
    let manifest: Manifest = layout.read_json(&entry.digest, Some(entry.size))?;
    Ok(statement::verify(keys, digest, identity, &manifest, |l| {
        layout
            .blobs()
            .read_verified(&l.digest, Some(l.size), MAX_STATEMENT_BYTES)
            .map_err(|e| std::io::Error::other(e.to_string()))
    })?)
}

/// Parses a schedule `HOURS:PERCENT,…` (`1:1,4:5,24:15,…`).
pub fn parse_schedule(text: &str) -> Result<Vec<(u64, u32)>, String> {
    let mut waves = Vec::new();
    for part in text.split(',') {
        let bad = || format!("schedule {text:?}: {part:?} is not HOURS:PERCENT");
        let (h, p) = part.trim().split_once(':').ok_or_else(bad)?;
        let wave: (u64, u32) = (h.parse().map_err(|_| bad())?, p.parse().map_err(|_| bad())?);
        if wave.1 == 0
            || wave.1 > 100
            || waves
                .last()
                .is_some_and(|l: &(u64, u32)| l.0 > wave.0 || l.1 > wave.1)
        {
            return Err(format!(
                "schedule {text:?}: waves must grow in hours and percent (1 to 100)"
            ));
        }
        waves.push(wave);
    }
    Ok(waves)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_issued_statement_verifies_and_a_renewal_keeps_its_schedule() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::create(dir.path()).unwrap();
        let image = layout.blobs().put_bytes(b"{\"schemaVersion\":2}").unwrap();
        let mut d = Descriptor::new(MEDIA_TYPE_MANIFEST, image, 19);
        d.annotations
            .insert(ANNOTATION_REF_NAME.into(), "stable".into());
        layout.upsert_index([d]).unwrap();
        let key = SigningKey::from_bytes(&[3u8; 32].into()).unwrap();
        let issue = Issue {
            valid_secs: 3600,
            new_schedule: false,
            schedule: Some(vec![(0, 50), (1, 100)]),
        };
        let first = issue_layout(&key, &layout, "stable", "r.example/node", &issue).unwrap();
        assert!(!first.renewed);
        assert_eq!(first.statement.schedule.len(), 2);
        let renew = Issue {
            schedule: None,
            ..issue
        };
        let again = issue_layout(&key, &layout, "stable", "r.example/node", &renew).unwrap();
        assert!(again.renewed);
        assert_eq!(again.statement.schedule, first.statement.schedule);
        let other = SigningKey::from_bytes(&[4u8; 32].into()).unwrap();
        let e = read_layout(&layout, &trusted(&other), None, image)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not signed by any of the 1 trusted key"), "{e}");
        assert!(parse_schedule("1:1,4:5,24:100").is_ok());
        assert!(parse_schedule("4:5,1:1").is_err());
    }
}
