//! The config's `registries` and `trust` sections: where images come
//! from (mirrors, credentials, a private CA) and which signatures a host
//! accepts (keys, keyless identities, the repository they must name,
//! downgrades). Only the schema and the keyless rules' parsing; the files
//! they name are read by `crate::fetch::access`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RegistryConfig {
    /// Mirrors tried in order before the registry itself (`host[:port]`).
    /// A URL with user info is refused while the config is read, by every
    /// command that reads `registries` (`unpack --config` included).
    #[serde(default, deserialize_with = "super::mirror_urls")]
    pub mirrors: Vec<String>,
    /// Plain HTTP. Loopback hosts may always use it; others only when set.
    #[serde(default)]
    pub insecure: bool,
    #[serde(default)]
    pub credentials: Option<Credentials>,
    /// PEM CA certificate(s) (a host path) this registry's or mirror's TLS
    /// certificate must chain to: a private CA, e.g. an air-gapped site
    /// mirror. Implies HTTPS (loopback too).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Credentials {
    pub username: String,
    /// A file holding the password or token (kept out of the config itself).
    pub password_file: PathBuf,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Trust {
    /// PEM ECDSA P-256 public keys; a signature by any of them is accepted.
    #[serde(default)]
    pub public_keys: Vec<PathBuf>,
    /// Accept images without a valid signature. Off unless set; no flag
    /// overrides it.
    #[serde(default)]
    pub allow_unsigned: bool,
    /// The repository signatures must name (`critical.identity.docker-reference`),
    /// e.g. `ghcr.io/org/node`: no tag, no digest. Default: the repository
    /// of a registry `image`; required for `oci:`/`oci-archive:` images
    /// unless `allow_unsigned`. Mirrors never change it.
    #[serde(default)]
    pub identity: Option<String>,
    /// Accept an image older than the newest one this host committed for
    /// the identity (`activate --allow-downgrade` for one run).
    #[serde(default)]
    pub allow_downgrade: bool,
    /// Keyless (Sigstore) signatures, verified offline against a trusted
    /// root; beside `public_keys`, either kind of signature is enough.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyless: Option<Keyless>,
}

/// `trust.keyless`: which Fulcio certificates a host accepts.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Keyless {
    /// Sigstore's `trusted_root.json` (a host path), shipped with the
    /// config and refreshed out of band: the only source of CAs and log
    /// keys.
    pub trusted_root: PathBuf,
    /// The OIDC issuer, exactly (GitHub Actions:
    /// `https://token.actions.githubusercontent.com`).
    pub issuer: String,
    /// The certificate identity (SAN), exactly.
    #[serde(default)]
    pub identity: Option<String>,
    /// A regular expression the whole identity must match (anchored at
    /// both ends whether or not it says so).
    #[serde(default)]
    pub identity_regexp: Option<String>,
    /// Optional exact matches on Fulcio's GitHub claims.
    #[serde(default)]
    pub github: KeylessGithub,
    /// Require an SCT from a CT log of the trusted root (default true).
    #[serde(default = "default_true")]
    pub require_sct: bool,
    /// Accept a Sigstore bundle that names no repository (cosign 3's
    /// `sign` writes none): the certificate identity alone must then tell
    /// the images apart, e.g. one workflow per variant. Off: such a bundle
    /// does not count (the `.sig` layer's payload or a named statement
    /// must name `trust.identity`).
    #[serde(default)]
    pub allow_unnamed_subject: bool,
    /// Accept a certificate that names its issuer only in the deprecated
    /// 1.3.6.1.4.1.57264.1.1 extension (Fulcio before late 2022).
    #[serde(default)]
    pub accept_deprecated_issuer_extension: bool,
}

/// `trust.keyless.github`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct KeylessGithub {
    /// Source Repository URI, e.g. `https://github.com/org/repo`.
    #[serde(default)]
    pub source_repository: Option<String>,
    /// Source Repository Ref, e.g. `refs/tags/v1.2.3`.
    #[serde(default, rename = "ref")]
    pub source_ref: Option<String>,
    /// Build Config URI: the workflow that ran, e.g.
    /// `https://github.com/org/repo/.github/workflows/publish.yml@refs/tags/v1.2.3`.
    #[serde(default)]
    pub workflow: Option<String>,
}

fn default_true() -> bool {
    true
}

impl Keyless {
    /// The certificate rules, or what is wrong with the section.
    pub fn rules(&self) -> Result<kubeslot_image::keyless::Rules, String> {
        use kubeslot_image::keyless::{GithubRule, IdentityRule, Rules};
        if self.issuer.is_empty() {
            return Err("issuer is empty".into());
        }
        let identity = match (&self.identity, &self.identity_regexp) {
            (Some(id), None) if !id.is_empty() => IdentityRule::Exact(id.clone()),
            (None, Some(re)) if !re.is_empty() => IdentityRule::regexp(re)?,
            _ => return Err("name exactly one of identity and identity_regexp".into()),
        };
        Ok(Rules {
            issuer: self.issuer.clone(),
            identity,
            github: GithubRule {
                source_repository: self.github.source_repository.clone(),
                source_ref: self.github.source_ref.clone(),
                workflow: self.github.workflow.clone(),
            },
            require_sct: self.require_sct,
            accept_deprecated_issuer: self.accept_deprecated_issuer_extension,
            allow_unnamed_subject: self.allow_unnamed_subject,
        })
    }
}
