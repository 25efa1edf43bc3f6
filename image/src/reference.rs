//! Image references and image sources: `ghcr.io/org/node:v1`,
//! `registry:5000/node@sha256:…`, `oci:DIR[:TAG]`, `oci-archive:FILE[:TAG]`.
//!
//! Parsing normalises the usual way (`ubuntu` → `docker.io/library/ubuntu:latest`)
//! so that mirrors, credentials and signatures always see one spelling. A
//! reference either pins a digest or carries a tag that the resolver turns into
//! a digest exactly once; this module only parses, it never resolves.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::digest::Digest;

/// The registry Docker Hub references normalise to.
pub const DOCKER_HUB: &str = "docker.io";
/// The API host for `docker.io`.
pub const DOCKER_HUB_API: &str = "registry-1.docker.io";

/// A registry image reference, normalised.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ImageRef {
    /// Host and optional port, e.g. `ghcr.io`, `127.0.0.1:5000`.
    pub registry: String,
    /// Path inside the registry, e.g. `library/ubuntu`.
    pub repository: String,
    /// The tag, when the reference names one.
    pub tag: Option<String>,
    /// The pinned digest, when the reference names one.
    pub digest: Option<Digest>,
}

/// Why a string is not an image reference.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("image reference {input:?}: {reason}")]
pub struct RefError {
    pub input: String,
    pub reason: &'static str,
}

impl ImageRef {
    /// The same repository pinned to `digest` (tag dropped).
    pub fn with_digest(&self, digest: Digest) -> ImageRef {
        ImageRef {
            tag: None,
            digest: Some(digest),
            ..self.clone()
        }
    }

    /// The same repository with another tag (digest dropped): used for the
    /// cosign `sha256-<hex>.sig` attachment tags.
    pub fn with_tag(&self, tag: &str) -> ImageRef {
        ImageRef {
            tag: Some(tag.to_string()),
            digest: None,
            ..self.clone()
        }
    }

    /// What to ask the registry for: the digest if pinned, else the tag.
    pub fn reference(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => d.to_string(),
            (None, Some(t)) => t.clone(),
            (None, None) => "latest".into(),
        }
    }

    /// The host to connect to (`docker.io` is served by `registry-1.docker.io`).
    pub fn api_host(&self) -> &str {
        if self.registry == DOCKER_HUB {
            DOCKER_HUB_API
        } else {
            &self.registry
        }
    }

    /// `registry/repository`, the identity cosign signs (`critical.identity`).
    pub fn name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }
}

/// A signing identity: the repository a signature's
/// `critical.identity.docker-reference` names, normalised
/// (`registry/repository`, as [`ImageRef::name`]).
///
/// [`repository`](Identity::repository) takes a configured identity (a
/// repository, no tag or digest); [`of_reference`](Identity::of_reference)
/// takes what a signature names (a tag or digest there is dropped: the
/// digest is checked separately, and cosign writes the repository or the
/// tagged name depending on how it was called).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identity(String);

impl Identity {
    /// A configured identity: `registry/repository` (Docker Hub names
    /// normalised), refused with a tag or a digest.
    pub fn repository(input: &str) -> Result<Identity, RefError> {
        let parsed: ImageRef = input.parse()?;
        let last = input.rsplit('/').next().unwrap_or(input);
        if parsed.digest.is_some() || last.contains(':') {
            return Err(RefError {
                input: input.to_string(),
                reason: "a signing identity is a repository: no tag and no digest",
            });
        }
        Ok(Identity(parsed.name()))
    }

    /// The repository a signature payload's `docker-reference` names.
    pub fn of_reference(input: &str) -> Result<Identity, RefError> {
        Ok(Identity(input.parse::<ImageRef>()?.name()))
    }

    /// The repository of a registry reference.
    pub fn of_image(image: &ImageRef) -> Identity {
        Identity(image.name())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for Identity {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

fn valid_repository(repo: &str) -> bool {
    !repo.is_empty()
        && repo.split('/').all(|c| {
            !c.is_empty()
                && c.bytes()
                    .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-'))
                && c.as_bytes()[0].is_ascii_alphanumeric()
                && c.as_bytes()[c.len() - 1].is_ascii_alphanumeric()
        })
        && repo.len() <= 255
}

fn valid_tag(tag: &str) -> bool {
    !tag.is_empty()
        && tag.len() <= 128
        && (tag.as_bytes()[0].is_ascii_alphanumeric() || tag.as_bytes()[0] == b'_')
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

fn valid_registry(host: &str) -> bool {
    !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'))
}

impl FromStr for ImageRef {
    type Err = RefError;
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = |reason| RefError {
            input: input.to_string(),
            reason,
        };
        if input.is_empty() || input.len() > 512 || input.contains(char::is_whitespace) {
            return Err(err("empty, too long or contains white space"));
        }
        let (rest, digest) = match input.split_once('@') {
            Some((rest, d)) => (
                rest,
                Some(
                    d.parse::<Digest>()
                        .map_err(|_| err("the part after @ is not a sha256 digest"))?,
                ),
            ),
            None => (input, None),
        };
        // A tag is after the last ':' that comes after the last '/'.
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
            None => (rest, None),
        };
        if let Some(t) = tag {
            if !valid_tag(t) {
                return Err(err("invalid tag"));
            }
        }
        let (registry, repository) = match name.split_once('/') {
            Some((first, path))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first.to_string(), path.to_string())
            }
            _ => (DOCKER_HUB.to_string(), name.to_string()),
        };
        if !valid_registry(&registry) {
            return Err(err("invalid registry host"));
        }
        let repository = if registry == DOCKER_HUB && !repository.contains('/') {
            format!("library/{repository}")
        } else {
            repository
        };
        if !valid_repository(&repository) {
            return Err(err(
                "invalid repository path (lower-case letters, digits, . _ - and /)",
            ));
        }
        let tag = match (tag, &digest) {
            (Some(t), _) => Some(t.to_string()),
            (None, None) => Some("latest".to_string()),
            (None, Some(_)) => None,
        };
        Ok(ImageRef {
            registry,
            repository,
            tag,
            digest,
        })
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Serialize for ImageRef {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ImageRef {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// Where an image comes from: a registry, an OCI layout directory, or an
/// `oci-archive` file (a tar of a layout), each with an optional tag for the
/// local forms (`oci:DIR:TAG`, as skopeo spells it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImageSource {
    Registry(ImageRef),
    Layout { dir: PathBuf, tag: Option<String> },
    Archive { file: PathBuf, tag: Option<String> },
}

/// Splits `PATH[:TAG]`: the tag is what follows the last ':' when it is a
/// valid tag and the path part is not empty.
fn split_path_tag(s: &str) -> (PathBuf, Option<String>) {
    if let Some((path, tag)) = s.rsplit_once(':') {
        if !path.is_empty() && valid_tag(tag) && !tag.contains('/') {
            return (PathBuf::from(path), Some(tag.to_string()));
        }
    }
    (PathBuf::from(s), None)
}

impl FromStr for ImageSource {
    type Err = RefError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let no_path = |reason| RefError {
            input: s.to_string(),
            reason,
        };
        if let Some(rest) = s.strip_prefix("oci-archive:") {
            let (file, tag) = split_path_tag(rest);
            if file.as_os_str().is_empty() {
                return Err(no_path(
                    "no file after oci-archive: (oci-archive:FILE[:TAG])",
                ));
            }
            return Ok(ImageSource::Archive { file, tag });
        }
        if let Some(rest) = s.strip_prefix("oci:") {
            let (dir, tag) = split_path_tag(rest);
            if dir.as_os_str().is_empty() {
                return Err(no_path("no directory after oci: (oci:DIR[:TAG])"));
            }
            return Ok(ImageSource::Layout { dir, tag });
        }
        let r = s.strip_prefix("docker://").unwrap_or(s);
        r.parse().map(ImageSource::Registry)
    }
}

impl fmt::Display for ImageSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImageSource::Registry(r) => write!(f, "{r}"),
            ImageSource::Layout { dir, tag } => {
                write!(f, "oci:{}", dir.display())?;
                tag.iter().try_for_each(|t| write!(f, ":{t}"))
            }
            ImageSource::Archive { file, tag } => {
                write!(f, "oci-archive:{}", file.display())?;
                tag.iter().try_for_each(|t| write!(f, ":{t}"))
            }
        }
    }
}

impl Serialize for ImageSource {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ImageSource {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(s: &str) -> ImageRef {
        s.parse().unwrap()
    }

    #[test]
    fn normalises_docker_hub() {
        assert_eq!(r("ubuntu").to_string(), "docker.io/library/ubuntu:latest");
        assert_eq!(r("org/img:1").to_string(), "docker.io/org/img:1");
        assert_eq!(r("ubuntu").api_host(), DOCKER_HUB_API);
    }

    #[test]
    fn registry_with_port_and_digest() {
        let d = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        let x = r(&format!("127.0.0.1:5000/kube/node@{d}"));
        assert_eq!(x.registry, "127.0.0.1:5000");
        assert_eq!(x.repository, "kube/node");
        assert_eq!(x.tag, None);
        assert_eq!(x.reference(), d);
        let y = r(&format!("ghcr.io/a/b:v1@{d}"));
        assert_eq!(y.tag.as_deref(), Some("v1"));
        assert_eq!(y.to_string(), format!("ghcr.io/a/b:v1@{d}"));
        assert_eq!(r("localhost/x").registry, "localhost");
    }

    #[test]
    fn rejects_bad_references() {
        for bad in [
            "",
            "UPPER/case",
            "a b",
            "x@sha256:12",
            "x:",
            "ghcr.io/a/../b",
            "x:-bad",
        ] {
            assert!(bad.parse::<ImageRef>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn sources() {
        assert_eq!(
            "oci:/tmp/x:v1".parse::<ImageSource>().unwrap(),
            ImageSource::Layout {
                dir: "/tmp/x".into(),
                tag: Some("v1".into())
            }
        );
        assert_eq!(
            "oci-archive:/tmp/x.tar".parse::<ImageSource>().unwrap(),
            ImageSource::Archive {
                file: "/tmp/x.tar".into(),
                tag: None
            }
        );
        assert!(matches!(
            "docker://ghcr.io/a/b:1".parse::<ImageSource>().unwrap(),
            ImageSource::Registry(_)
        ));
        for empty in ["oci:", "oci-archive:"] {
            let e = empty.parse::<ImageSource>().unwrap_err().to_string();
            assert!(
                e.contains(&format!("{empty:?}")) && e.contains("no "),
                "{e}"
            );
        }
    }
}
