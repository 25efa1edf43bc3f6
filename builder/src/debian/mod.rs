//! Debian-family package bases (Debian, Ubuntu): the recipe section that
//! names a suite, mirror, keyring and package set, the lock that pins every
//! resolved `.deb` by sha256, and building a base rootfs from exactly those
//! files. (owner: debian-base; the recipe module only embeds [`DebianBase`].)

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

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
    pub mirror: String,
    /// Keyring that signs the archive's InRelease (a file on the build machine,
    /// or relative to the recipe).
    pub keyring: PathBuf,
    /// Package names installed on every platform.
    pub packages: Vec<String>,
    /// Extra package names per architecture (`amd64`, `arm64`).
    #[serde(default)]
    pub arch_packages: BTreeMap<String, Vec<String>>,
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
    /// Repository URL.
    pub url: String,
    /// Suite, e.g. `noble` or `/` for a flat repository.
    pub suite: String,
    #[serde(default)]
    pub components: Vec<String>,
    pub keyring: PathBuf,
    /// Package names taken from this repository.
    pub packages: Vec<String>,
}
