//! The lock file of a Debian-family base: per platform, the sha256 of each
//! repository's InRelease and every `.deb` (package, version, architecture,
//! repository, pool path, size, sha256), plus the sha256 of the recipe's
//! `[base]` section it was made from. It is TOML, written deterministically
//! (sorted, no timestamps) and atomically. It deliberately names no mirror
//! host: URLs are built at fetch time from the recipe (or `--mirror`) and the
//! pool path.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::error::{io_err, DebianError};
use super::RecipeBase;

/// The lock format version this builder reads and writes.
pub const LOCK_VERSION: u32 = 1;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lock {
    pub version: u32,
    /// sha256 of the recipe's `[base]` section ([`super::DebianBase::sha256`]).
    pub base_sha256: String,
    #[serde(rename = "platform")]
    pub platforms: Vec<PlatformLock>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlatformLock {
    /// Debian architecture (`amd64`, `arm64`).
    pub arch: String,
    #[serde(rename = "release")]
    pub releases: Vec<ReleaseLock>,
    #[serde(rename = "package")]
    pub packages: Vec<LockedDeb>,
}

/// The InRelease a platform's resolution was made from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseLock {
    /// `base` or an extra repository's name.
    pub repository: String,
    pub suite: String,
    pub inrelease_sha256: String,
}

/// One pinned `.deb`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockedDeb {
    pub name: String,
    pub version: String,
    pub architecture: String,
    pub repository: String,
    /// Relative to the repository root (`pool/main/a/acl/...deb`).
    pub path: String,
    pub size: u64,
    pub sha256: String,
}

impl LockedDeb {
    /// `pkg:deb/VENDOR/NAME@VERSION?arch=ARCH` (the purl an SBOM lists;
    /// VENDOR is `debian` or `ubuntu`, see [`super::DebianBase::vendor`]).
    pub fn purl(&self, vendor: &str) -> String {
        format!(
            "pkg:deb/{vendor}/{}@{}?arch={}",
            self.name,
            purl_escape(&self.version),
            self.architecture
        )
    }
}

fn purl_escape(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            ':' => "%3A".to_string(),
            '+' => "%2B".to_string(),
            c => c.to_string(),
        })
        .collect()
}

impl Lock {
    /// The TOML text, with a header saying what made it.
    pub fn to_toml(&self) -> String {
        let body = toml::to_string(self).expect("lock serialises");
        format!(
            "# kubeslot package-base lock, written by `kubeslot-builder lock`; do not edit.\n\
             # It names no mirror: URLs are the recipe's mirror (or --mirror) + path.\n\n{body}"
        )
    }

    /// Writes the lock atomically (temp, fsync, rename, fsync dir).
    pub fn write(&self, path: &Path) -> Result<(), DebianError> {
        kubeslot_image::atomic::write_file(path, self.to_toml().as_bytes()).map_err(|e| {
            DebianError::LockInvalid {
                path: path.to_path_buf(),
                reason: format!("writing: {e}"),
            }
        })
    }

    pub fn read(path: &Path) -> Result<Lock, DebianError> {
        let text = std::fs::read_to_string(path).map_err(io_err(path))?;
        let lock: Lock = toml::from_str(&text).map_err(|e| DebianError::LockInvalid {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        if lock.version != LOCK_VERSION {
            return Err(DebianError::LockInvalid {
                path: path.to_path_buf(),
                reason: format!(
                    "format version {} (this builder reads {LOCK_VERSION})",
                    lock.version
                ),
            });
        }
        Ok(lock)
    }

    /// The recipe's lock, checked against it: present, same `[base]`
    /// digest, every platform covered. What `lock --check` and `build` run.
    pub fn load_for(recipe: &RecipeBase) -> Result<Lock, DebianError> {
        let path = recipe.lock_path();
        if !path.exists() {
            return Err(DebianError::LockMissing {
                recipe: recipe.recipe.clone(),
                lock: path,
            });
        }
        let lock = Lock::read(&path)?;
        if lock.base_sha256 != recipe.base_sha256 {
            return Err(DebianError::LockStale {
                lock: path,
                recipe: recipe.recipe.clone(),
                locked: lock.base_sha256,
                current: recipe.base_sha256.clone(),
            });
        }
        for arch in &recipe.arches {
            lock.platform(arch)
                .map_err(|_| DebianError::LockPlatformMissing {
                    lock: path.clone(),
                    arch: arch.clone(),
                })?;
        }
        Ok(lock)
    }

    pub fn platform(&self, arch: &str) -> Result<&PlatformLock, DebianError> {
        self.platforms
            .iter()
            .find(|p| p.arch == arch)
            .ok_or_else(|| DebianError::LockPlatformMissing {
                lock: "(lock)".into(),
                arch: arch.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Lock {
        Lock {
            version: LOCK_VERSION,
            base_sha256: "ab".repeat(32),
            platforms: vec![PlatformLock {
                arch: "amd64".into(),
                releases: vec![ReleaseLock {
                    repository: "base".into(),
                    suite: "bookworm".into(),
                    inrelease_sha256: "cd".repeat(32),
                }],
                packages: vec![LockedDeb {
                    name: "libacl1".into(),
                    version: "1:2.3.1-3+b1".into(),
                    architecture: "amd64".into(),
                    repository: "base".into(),
                    path: "pool/main/a/acl/libacl1_2.3.1-3_amd64.deb".into(),
                    size: 30884,
                    sha256: "ef".repeat(32),
                }],
            }],
        }
    }

    #[test]
    fn round_trips_byte_for_byte() {
        let text = sample().to_toml();
        let back: Lock = toml::from_str(&text).unwrap();
        assert_eq!(back, sample());
        assert_eq!(back.to_toml(), text);
        assert!(text.contains("[[platform.package]]"), "{text}");
    }

    #[test]
    fn purl_escapes_epoch_and_plus() {
        let p = &sample().platforms[0].packages[0];
        assert_eq!(
            p.purl("debian"),
            "pkg:deb/debian/libacl1@1%3A2.3.1-3%2Bb1?arch=amd64"
        );
    }
}
