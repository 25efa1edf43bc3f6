//! Debian-family package bases (Debian, Ubuntu): the recipe section that
//! names a suite, mirror, keyring and package set, the lock that pins every
//! resolved `.deb` by sha256, and building a base rootfs from exactly those
//! files. (owner: debian-base; the recipe module only embeds [`DebianBase`].)
//!
//! Given a recipe's `[base]` section (and mirror overrides), it resolves the
//! package set with apt itself in a private apt root ([`resolve`]), writes and
//! checks the lock ([`lock`]), names exactly the locked `.deb`s for the
//! builder's fetcher ([`pinned`]), installs them with mmdebstrap from a local
//! repository ([`install`]) and normalises the tar ([`normalize`]). It
//! deliberately does not download, compress, sign or assemble layers: it
//! hands the builder one deterministic rootfs tar per platform, and the SBOM
//! its package list ([`sbom_packages`]). It never reads or changes the build
//! machine's own apt state.

mod apt;
mod error;
pub mod index;
pub mod install;
pub mod lock;
pub mod normalize;
pub mod resolve;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use error::io_err;
pub use error::DebianError;
use lock::PlatformLock;
use serde::{Deserialize, Serialize};

use crate::fetch::Pinned;
use crate::sbom::{PackageKind, SbomPackage};

/// The name of the recipe's main archive in the lock and in `--mirror`.
pub const BASE_REPO: &str = "base";

/// `[base]` with `kind = "debian"` in a recipe.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DebianBase {
    /// Distribution suite, e.g. `noble`, `bookworm`.
    pub suite: String,
    /// Archive components, e.g. `["main", "universe"]`.
    pub components: Vec<String>,
    /// The archive URL (for Ubuntu a `snapshot.ubuntu.com` timestamp URL).
    /// `lock --mirror` / `build --mirror` replace it; the lock never names it.
    /// `$(ARCH)` is replaced by the Debian architecture (as apt does).
    pub mirror: String,
    /// The archive URL of one architecture where it differs from `mirror`
    /// (Ubuntu's arm64 lives in `ubuntu-ports`), e.g.
    /// `arch_mirrors.arm64 = "https://…/ubuntu-ports/…"`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub arch_mirrors: BTreeMap<String, String>,
    /// Keyring that signs the archive's InRelease (a file on the build machine,
    /// or relative to the recipe).
    pub keyring: PathBuf,
    /// Package names installed on every platform.
    pub packages: Vec<String>,
    /// Extra package names per architecture (`amd64`, `arm64`).
    #[serde(default)]
    pub arch_packages: BTreeMap<String, Vec<String>>,
    /// The distribution, for package URLs in the SBOM
    /// (`pkg:deb/VENDOR/…`): `debian` (the default) or `ubuntu`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor: Option<String>,
    /// Additional apt repositories (e.g. NVIDIA's), pinned by the same lock.
    #[serde(default)]
    pub extra_repositories: Vec<ExtraRepository>,
}

/// An additional apt repository of a Debian-family base.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtraRepository {
    /// A short name, used in the lock and in `--mirror NAME=URL` overrides.
    pub name: String,
    /// Repository URL (`$(ARCH)` is replaced by the architecture, as apt
    /// does in sources.list).
    pub url: String,
    /// Suite, e.g. `noble` or `/` for a flat repository.
    pub suite: String,
    #[serde(default)]
    pub components: Vec<String>,
    pub keyring: PathBuf,
    /// Package names taken from this repository.
    pub packages: Vec<String>,
}

impl DebianBase {
    /// sha256 (hex) of the section as the lock saw it: canonical JSON of the
    /// parsed struct (fields in declaration order, maps sorted), so comments
    /// and formatting do not matter but every value does.
    pub fn sha256(&self) -> String {
        let json = serde_json::to_vec(self).expect("DebianBase serialises");
        kubeslot_image::Digest::of(&json).hex()
    }

    /// The repositories apt resolves against for `arch` (URLs with
    /// `$(ARCH)` filled in): the main archive first.
    pub fn repositories(&self, arch: &str) -> Vec<Repository> {
        let mirror = self.arch_mirrors.get(arch).unwrap_or(&self.mirror);
        let mut out = vec![Repository {
            name: BASE_REPO.to_string(),
            url: mirror.replace("$(ARCH)", arch),
            suite: self.suite.clone(),
            components: self.components.clone(),
            keyring: self.keyring.clone(),
        }];
        out.extend(self.extra_repositories.iter().map(|r| Repository {
            name: r.name.clone(),
            url: r.url.replace("$(ARCH)", arch),
            suite: r.suite.clone(),
            components: r.components.clone(),
            keyring: r.keyring.clone(),
        }));
        out
    }

    /// Every package name the recipe asks for on `arch`, sorted and unique.
    pub fn requested(&self, arch: &str) -> Vec<String> {
        let mut names: Vec<String> = self.packages.clone();
        names.extend(self.arch_packages.get(arch).into_iter().flatten().cloned());
        for r in &self.extra_repositories {
            names.extend(r.packages.iter().cloned());
        }
        names.sort();
        names.dedup();
        names
    }

    fn validate(&self, path: &Path) -> Result<(), DebianError> {
        self.check().map_err(|reason| DebianError::Recipe {
            path: path.to_path_buf(),
            reason,
        })
    }

    /// The rules of the section beyond its schema (what `check` reports).
    pub fn check(&self) -> Result<(), String> {
        let bad = |reason: String| reason;
        if self.suite.is_empty() {
            return Err(bad("[base] suite is empty".into()));
        }
        if self.packages.is_empty() {
            return Err(bad("[base] packages is empty".into()));
        }
        if let Some(v) = &self.vendor {
            if !matches!(v.as_str(), "debian" | "ubuntu") {
                return Err(bad(format!(
                    "[base] vendor is `{v}`; known: debian, ubuntu"
                )));
            }
        }
        let mut seen = vec![BASE_REPO];
        for r in &self.extra_repositories {
            if seen.contains(&r.name.as_str()) || r.name.is_empty() {
                return Err(bad(format!(
                    "extra repository name `{}` is empty, repeated or `{BASE_REPO}`",
                    r.name
                )));
            }
            seen.push(&r.name);
        }
        for (table, arch) in self
            .arch_packages
            .keys()
            .map(|a| ("arch_packages", a))
            .chain(self.arch_mirrors.keys().map(|a| ("arch_mirrors", a)))
        {
            if !SUPPORTED_ARCHES.contains(&arch.as_str()) {
                return Err(bad(format!(
                    "[base.{table}] names `{arch}`; supported: {}",
                    SUPPORTED_ARCHES.join(", ")
                )));
            }
        }
        Ok(())
    }

    /// Applies `--mirror URL` (the main archive, every architecture),
    /// `--mirror base.ARCH=URL` (the main archive of one architecture) and
    /// `--mirror NAME=URL` (an extra repository) overrides; the lock does
    /// not change, since it names pool paths only.
    pub fn apply_mirrors(&mut self, overrides: &[String]) -> Result<(), DebianError> {
        for value in overrides {
            let bad = |reason: &str| DebianError::MirrorOverride {
                value: value.clone(),
                reason: reason.to_string(),
            };
            let (name, url) = match value.split_once('=') {
                Some((name, url)) if !name.contains(':') && !name.contains('/') => (name, url),
                _ => (BASE_REPO, value.as_str()),
            };
            if !(url.starts_with("http://")
                || url.starts_with("https://")
                || url.starts_with("file:/"))
            {
                return Err(bad("a mirror is an http(s):// or file:/ URL"));
            }
            if name == BASE_REPO {
                self.mirror = url.to_string();
                self.arch_mirrors.clear();
            } else if let Some(arch) = name.strip_prefix("base.") {
                if !SUPPORTED_ARCHES.contains(&arch) {
                    return Err(bad("base.ARCH names amd64 or arm64"));
                }
                self.arch_mirrors.insert(arch.to_string(), url.to_string());
            } else if let Some(r) = self.extra_repositories.iter_mut().find(|r| r.name == name) {
                r.url = url.to_string();
            } else {
                return Err(bad("no extra repository has this name"));
            }
        }
        Ok(())
    }
}

/// One apt repository as resolution and fetching see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Repository {
    pub name: String,
    pub url: String,
    pub suite: String,
    pub components: Vec<String>,
    pub keyring: PathBuf,
}

impl Repository {
    /// The URL with exactly one trailing slash, as apt prints it.
    pub fn root(&self) -> String {
        format!("{}/", self.url.trim_end_matches('/'))
    }
}

/// Debian architecture names the builder supports (OCI `linux/amd64`,
/// `linux/arm64`).
pub const SUPPORTED_ARCHES: &[&str] = &["amd64", "arm64"];

/// What a recipe file holds for a Debian-family base: the `[base]` section
/// (keyring paths made absolute against the recipe's directory), its
/// platforms and `source_date_epoch`. The full recipe schema belongs to the
/// recipe module; this reads only what the package base needs.
#[derive(Clone, Debug)]
pub struct RecipeBase {
    pub recipe: PathBuf,
    pub base: DebianBase,
    /// Debian architectures, from `platforms = ["linux/amd64", ...]`
    /// (both supported ones when absent).
    pub arches: Vec<String>,
    pub source_date_epoch: Option<i64>,
    /// [`DebianBase::sha256`] of the section as written (before keyring
    /// paths are made absolute or mirrors overridden), so the digest does not
    /// depend on where the recipe is checked out.
    pub base_sha256: String,
}

impl RecipeBase {
    /// Reads `path` and its `[base]` section, which must have `kind = "debian"`.
    pub fn load(path: &Path) -> Result<RecipeBase, DebianError> {
        let bad = |reason: String| DebianError::Recipe {
            path: path.to_path_buf(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(io_err(path))?;
        let mut table: toml::Table = toml::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let Some(toml::Value::Table(mut base)) = table.remove("base") else {
            return Err(bad("has no [base] section".into()));
        };
        match base.remove("kind") {
            Some(toml::Value::String(k)) if k == "debian" => {}
            other => {
                return Err(bad(format!(
                    "[base] kind is {other:?}; a package base has kind = \"debian\""
                )))
            }
        }
        let mut base: DebianBase = toml::Value::Table(base)
            .try_into()
            .map_err(|e: toml::de::Error| bad(format!("[base]: {e}")))?;
        base.validate(path)?;
        let base_sha256 = base.sha256();
        let dir = path.parent().unwrap_or(Path::new("."));
        let absolute = |k: &Path| {
            if k.is_absolute() {
                k.to_path_buf()
            } else {
                dir.join(k)
            }
        };
        base.keyring = absolute(&base.keyring);
        for r in &mut base.extra_repositories {
            r.keyring = absolute(&r.keyring);
        }
        let arches = match table.get("platforms") {
            None => SUPPORTED_ARCHES.iter().map(|a| a.to_string()).collect(),
            Some(toml::Value::Array(list)) => {
                let mut arches = Vec::new();
                for p in list {
                    let arch = p
                        .as_str()
                        .and_then(|p| p.strip_prefix("linux/"))
                        .filter(|a| SUPPORTED_ARCHES.contains(a))
                        .ok_or_else(|| {
                            bad(format!("platform {p} is not linux/amd64 or linux/arm64"))
                        })?;
                    arches.push(arch.to_string());
                }
                arches
            }
            Some(other) => return Err(bad(format!("platforms is {other}, not a list"))),
        };
        let source_date_epoch = table
            .get("source_date_epoch")
            .map(|v| {
                v.as_integer()
                    .ok_or_else(|| bad("source_date_epoch is not an integer".into()))
            })
            .transpose()?;
        Ok(RecipeBase {
            recipe: path.to_path_buf(),
            base,
            arches,
            source_date_epoch,
            base_sha256,
        })
    }

    /// `<dir>/<stem>.lock` next to the recipe.
    pub fn lock_path(&self) -> PathBuf {
        lock_path_for(&self.recipe)
    }
}

/// The lock file of `recipe`: `<recipe-stem>.lock` beside it.
pub fn lock_path_for(recipe: &Path) -> PathBuf {
    // `r.toml` → `./r.lock`: an empty parent is the working directory.
    match recipe.parent() {
        Some(p) if p.as_os_str().is_empty() => Path::new(".").join(recipe.with_extension("lock")),
        _ => recipe.with_extension("lock"),
    }
}

/// The builder fetcher's pins of every locked `.deb` of `platform`, in lock
/// order: URL = the repository's mirror (the recipe's, or `--mirror`) + the
/// lock's pool path; sha256 and size from the lock. The label names the
/// package, so a mismatch reads `deb dbus 1.14.10-1~deb12u1 (amd64): URL:
/// sha256 mismatch: expected …, got …`.
pub fn pinned(base: &DebianBase, platform: &PlatformLock) -> Result<Vec<Pinned>, DebianError> {
    let repos = base.repositories(&platform.arch);
    platform
        .packages
        .iter()
        .map(|deb| {
            let invalid = |reason: String| DebianError::LockInvalid {
                path: "(lock)".into(),
                reason,
            };
            let repo = repos
                .iter()
                .find(|r| r.name == deb.repository)
                .ok_or_else(|| {
                    invalid(format!(
                        "package {} names repository `{}`, which the recipe does not have",
                        deb.name, deb.repository
                    ))
                })?;
            let sha256 = kubeslot_image::Digest::from_hex(&deb.sha256)
                .map_err(|e| invalid(format!("package {}: sha256: {e}", deb.name)))?;
            Ok(Pinned {
                url: format!("{}{}", repo.root(), deb.path),
                sha256,
                size: Some(deb.size),
                label: format!("deb {} {} ({})", deb.name, deb.version, deb.architecture),
            })
        })
        .collect()
}

/// The SBOM entries of one platform's package base: every locked `.deb`
/// with its version, sha256, `pkg:deb/VENDOR/NAME@VERSION?arch=ARCH` purl
/// and its pool path (the lock names no mirror, so neither does the SBOM:
/// the same lock from any mirror gives the same image).
pub fn sbom_packages(
    base: &DebianBase,
    platform: &PlatformLock,
) -> Result<Vec<SbomPackage>, DebianError> {
    let vendor = base.vendor.as_deref().unwrap_or("debian");
    platform
        .packages
        .iter()
        .map(|deb| {
            let sha256 = kubeslot_image::Digest::from_hex(&deb.sha256).map_err(|e| {
                DebianError::LockInvalid {
                    path: "(lock)".into(),
                    reason: format!("package {}: sha256: {e}", deb.name),
                }
            })?;
            Ok(SbomPackage {
                name: deb.name.clone(),
                version: deb.version.clone(),
                download_location: "NOASSERTION".into(),
                sha256,
                kind: PackageKind::DebianPackage,
                purl: Some(deb.purl(vendor)),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> DebianBase {
        toml::from_str(
            r#"
suite = "noble"
components = ["main"]
mirror = "https://archive.invalid/ubuntu/20261101T000000Z"
keyring = "k.gpg"
packages = ["systemd"]
vendor = "ubuntu"
arch_mirrors.arm64 = "https://archive.invalid/ubuntu-ports/20261101T000000Z"
[[extra_repositories]]
name = "nvidia"
url = "https://nvidia.invalid/stable/deb/$(ARCH)"
suite = "/"
keyring = "n.gpg"
packages = ["nvidia-container-toolkit"]
"#,
        )
        .unwrap()
    }

    #[test]
    fn repositories_are_per_architecture() {
        let b = base();
        let urls =
            |arch: &str| -> Vec<String> { b.repositories(arch).iter().map(|r| r.root()).collect() };
        assert_eq!(
            urls("amd64"),
            [
                "https://archive.invalid/ubuntu/20261101T000000Z/",
                "https://nvidia.invalid/stable/deb/amd64/"
            ]
        );
        assert_eq!(
            urls("arm64"),
            [
                "https://archive.invalid/ubuntu-ports/20261101T000000Z/",
                "https://nvidia.invalid/stable/deb/arm64/"
            ]
        );
        assert_eq!(
            b.requested("amd64"),
            ["nvidia-container-toolkit", "systemd"]
        );
    }

    #[test]
    fn mirror_overrides() {
        let mut b = base();
        b.apply_mirrors(&["base.arm64=http://127.0.0.1:9/ports".into()])
            .unwrap();
        assert_eq!(b.repositories("arm64")[0].url, "http://127.0.0.1:9/ports");
        b.apply_mirrors(&[
            "http://127.0.0.1:9/all".into(),
            "nvidia=file:///srv/nv/$(ARCH)".into(),
        ])
        .unwrap();
        assert_eq!(b.repositories("arm64")[0].url, "http://127.0.0.1:9/all");
        assert_eq!(b.repositories("arm64")[1].url, "file:///srv/nv/arm64");
        let err = b.apply_mirrors(&["other=http://x/".into()]).unwrap_err();
        assert!(err.to_string().contains("no extra repository"), "{err}");
        let err = b
            .apply_mirrors(&["base.s390x=http://x/".into()])
            .unwrap_err();
        assert!(err.to_string().contains("amd64 or arm64"), "{err}");
        assert!(b.apply_mirrors(&["ftp://x/".into()]).is_err());
    }

    #[test]
    fn pins_are_mirror_plus_pool_path_per_architecture() {
        let deb = |repo: &str, path: &str| lock::LockedDeb {
            name: "p".into(),
            version: "1:2+b1".into(),
            architecture: "arm64".into(),
            repository: repo.into(),
            path: path.into(),
            size: 3,
            sha256: "ab".repeat(32),
        };
        let platform = PlatformLock {
            arch: "arm64".into(),
            releases: vec![],
            packages: vec![
                deb("base", "pool/main/p/p/p_2_arm64.deb"),
                deb("nvidia", "p_2_arm64.deb"),
            ],
        };
        let pins = pinned(&base(), &platform).unwrap();
        assert_eq!(
            pins[0].url,
            "https://archive.invalid/ubuntu-ports/20261101T000000Z/pool/main/p/p/p_2_arm64.deb"
        );
        assert_eq!(
            pins[1].url,
            "https://nvidia.invalid/stable/deb/arm64/p_2_arm64.deb"
        );
        assert_eq!(pins[0].size, Some(3));
        assert_eq!(pins[0].label, "deb p 1:2+b1 (arm64)");
        let sbom = sbom_packages(&base(), &platform).unwrap();
        assert_eq!(
            sbom[0].purl.as_deref(),
            Some("pkg:deb/ubuntu/p@1%3A2%2Bb1?arch=arm64")
        );
        assert_eq!(sbom[0].kind, PackageKind::DebianPackage);

        let mut stray = platform.clone();
        stray.packages[1].repository = "gone".into();
        let err = pinned(&base(), &stray).unwrap_err().to_string();
        assert!(err.contains("repository `gone`"), "{err}");
    }

    #[test]
    fn a_relative_recipe_has_its_lock_beside_it() {
        assert_eq!(lock_path_for(Path::new("r.toml")), Path::new("./r.lock"));
        assert_eq!(lock_path_for(Path::new("a/r.toml")), Path::new("a/r.lock"));
    }

    #[test]
    fn the_base_digest_ignores_formatting_but_not_values() {
        let a = base();
        let mut b = base();
        assert_eq!(a.sha256(), b.sha256());
        b.packages.push("dbus".into());
        assert_ne!(a.sha256(), b.sha256());
    }
}
