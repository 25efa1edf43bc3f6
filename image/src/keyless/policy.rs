//! What a host requires of a keyless signature's certificate: the OIDC
//! issuer (exact), the identity in the SAN (exact, or a regular expression
//! always anchored at both ends), optional exact GitHub claims, and whether
//! an SCT is required. Given the certificate's claims, [`Rules::check`]
//! names the first rule they break.
//!
//! The issuer is read from Fulcio's 1.3.6.1.4.1.57264.1.8 extension; the
//! deprecated 1.3.6.1.4.1.57264.1.1 (a raw string, written alone by Fulcio
//! before late 2022) counts only when the policy accepts it, and a
//! certificate whose two issuer extensions disagree is refused.

use super::cert::{Cert, OID_BUILD_CONFIG, OID_SOURCE_REF, OID_SOURCE_REPOSITORY};

/// How the SAN must match.
#[derive(Clone, Debug)]
pub enum IdentityRule {
    Exact(String),
    /// Matched against the whole SAN: `^(?:PATTERN)$`.
    Regexp {
        pattern: String,
        regex: regex_lite::Regex,
    },
}

impl IdentityRule {
    /// A regular expression, anchored at both ends whatever it says, so
    /// that `github.com/org/repo` can never match
    /// `https://github.com/org/repo-evil/...`.
    pub fn regexp(pattern: &str) -> Result<IdentityRule, String> {
        let regex = regex_lite::Regex::new(&format!("^(?:{pattern})$"))
            .map_err(|e| format!("invalid regular expression {pattern:?}: {e}"))?;
        Ok(IdentityRule::Regexp {
            pattern: pattern.to_string(),
            regex,
        })
    }

    fn matches(&self, san: &str) -> bool {
        match self {
            IdentityRule::Exact(s) => s == san,
            IdentityRule::Regexp { regex, .. } => regex.is_match(san),
        }
    }

    fn describe(&self) -> String {
        match self {
            IdentityRule::Exact(s) => format!("trust.keyless.identity {s:?}"),
            IdentityRule::Regexp { pattern, .. } => format!(
                "trust.keyless.identity_regexp {pattern:?} (matched against the whole identity: anchored at both ends)"
            ),
        }
    }
}

/// Optional exact matches on Fulcio's GitHub claims.
#[derive(Clone, Debug, Default)]
pub struct GithubRule {
    /// Source Repository URI (1.3.6.1.4.1.57264.1.12), e.g.
    /// `https://github.com/org/repo`.
    pub source_repository: Option<String>,
    /// Source Repository Ref (…1.14), e.g. `refs/tags/v1.2.3`.
    pub source_ref: Option<String>,
    /// Build Config URI (…1.18): the workflow file that ran, at its ref.
    pub workflow: Option<String>,
}

/// The certificate rules of a keyless policy.
#[derive(Clone, Debug)]
pub struct Rules {
    pub issuer: String,
    pub identity: IdentityRule,
    pub github: GithubRule,
    pub require_sct: bool,
    /// Accept the issuer from the deprecated 1.3.6.1.4.1.57264.1.1 alone.
    pub accept_deprecated_issuer: bool,
    /// Accept a bundle that names no repository (a message signature, or
    /// cosign 3's `sign` statement, whose subject has no name): then the
    /// certificate identity alone says which image it is, and one identity
    /// that signs several images (`ubuntu2404`, `ubuntu2404-nvidia`) vouches
    /// for each as any other. Off: such a bundle does not count where
    /// `trust.identity` is to be checked.
    pub allow_unnamed_subject: bool,
}

/// The certificate's identity as errors show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claims {
    pub san: String,
    /// The issuer the certificate names (from either extension), or
    /// "none".
    pub issuer: String,
}

/// Reads the SAN and issuer for messages, before anything is verified.
pub fn claims(cert: &Cert) -> Claims {
    let i = cert.issuer();
    Claims {
        san: cert.san().unwrap_or_else(|_| "(no SAN identity)".into()),
        issuer: i.v2.or(i.v1).unwrap_or_else(|| "none".into()),
    }
}

impl Rules {
    /// The first rule the certificate breaks, or `Ok`.
    pub fn check(&self, cert: &Cert) -> Result<(), String> {
        let i = cert.issuer();
        let issuer = match (&i.v2, &i.v1) {
            (Some(v2), Some(v1)) if v1 != v2 => {
                return Err(format!(
                    "its issuer extensions disagree (1.3.6.1.4.1.57264.1.8 {v2:?}, deprecated 1.3.6.1.4.1.57264.1.1 {v1:?})"
                ))
            }
            (Some(v2), _) => v2,
            (None, Some(v1)) if self.accept_deprecated_issuer => v1,
            (None, Some(v1)) => {
                return Err(format!(
                    "it names its issuer {v1:?} only in the deprecated extension 1.3.6.1.4.1.57264.1.1; the policy requires 1.3.6.1.4.1.57264.1.8 (trust.keyless.accept_deprecated_issuer_extension accepts the old one)"
                ))
            }
            (None, None) => return Err("it names no OIDC issuer (no 1.3.6.1.4.1.57264.1.8 extension)".into()),
        };
        if *issuer != self.issuer {
            return Err(format!(
                "issuer {issuer:?} is not trust.keyless.issuer {:?}",
                self.issuer
            ));
        }
        let san = cert.san()?;
        if !self.identity.matches(&san) {
            return Err(format!(
                "identity {san:?} does not match {}",
                self.identity.describe()
            ));
        }
        let github = [
            (
                "source_repository",
                "1.3.6.1.4.1.57264.1.12",
                &self.github.source_repository,
                OID_SOURCE_REPOSITORY,
            ),
            (
                "ref",
                "1.3.6.1.4.1.57264.1.14",
                &self.github.source_ref,
                OID_SOURCE_REF,
            ),
            (
                "workflow",
                "1.3.6.1.4.1.57264.1.18",
                &self.github.workflow,
                OID_BUILD_CONFIG,
            ),
        ];
        for (field, oid, want, ext) in github {
            let Some(want) = want else { continue };
            match cert.utf8_extension(ext) {
                Some(found) if &found == want => {}
                Some(found) => {
                    return Err(format!(
                        "{oid} is {found:?}, not trust.keyless.github.{field} {want:?}"
                    ))
                }
                None => {
                    return Err(format!(
                        "it has no {oid} extension (trust.keyless.github.{field} {want:?})"
                    ))
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regexps_are_anchored_at_both_ends() {
        let r = IdentityRule::regexp("https://github.com/org/repo/.*").unwrap();
        assert!(r.matches("https://github.com/org/repo/.github/workflows/p.yml@refs/tags/v1"));
        assert!(!r.matches("https://github.com/org/repo-evil/x"));
        let r = IdentityRule::regexp("github.com/org/repo").unwrap();
        assert!(!r.matches("https://github.com/org/repo/.github/workflows/p.yml@refs/heads/main"));
        // an alternation cannot escape the anchors
        let r = IdentityRule::regexp("a|b").unwrap();
        assert!(!r.matches("xa") && r.matches("a") && r.matches("b"));
        assert!(IdentityRule::regexp("(").is_err());
    }
}
