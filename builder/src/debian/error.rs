//! The one error type of the Debian package base: every variant names the
//! recipe, lock, package, URL or command it failed on and the rule broken.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum DebianError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("recipe {path}: {reason}")]
    Recipe { path: PathBuf, reason: String },
    #[error("--mirror {value}: {reason}")]
    MirrorOverride { value: String, reason: String },
    #[error("`{tool}` is not installed: run `apt-get install -y {package}`")]
    ToolMissing {
        tool: &'static str,
        package: &'static str,
    },
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
    #[error(
        "package `{name}` does not resolve for {arch} in the recipe's repositories (apt: {apt})"
    )]
    UnknownPackage {
        name: String,
        arch: String,
        apt: String,
    },
    #[error("apt index {path}: {reason}")]
    Index { path: PathBuf, reason: String },
    #[error("repository `{repo}` ({arch}): apt fetched no signed InRelease (expected {path}); the lock pins InRelease digests only")]
    NoInRelease {
        repo: String,
        arch: String,
        path: PathBuf,
    },
    #[error("apt wants {url}, which is in none of the recipe's repositories")]
    UriOutsideRepos { url: String },
    #[error("apt wants {url} but the Packages index of `{repo}` has no such file (apt and the index disagree)")]
    NotInIndex { url: String, repo: String },
    #[error("recipe {recipe} has a package base but no lock {lock}: run `kubeslot-builder lock {recipe}` and commit the lock")]
    LockMissing { recipe: PathBuf, lock: PathBuf },
    #[error("lock {lock} is stale: it was made for a [base] section with sha256 {locked}, recipe {recipe} now has {current}; run `kubeslot-builder lock {recipe}`")]
    LockStale {
        lock: PathBuf,
        recipe: PathBuf,
        locked: String,
        current: String,
    },
    #[error("lock {path}: {reason}")]
    LockInvalid { path: PathBuf, reason: String },
    #[error("lock {lock} has no packages for platform {arch}: run `kubeslot-builder lock` again")]
    LockPlatformMissing { lock: PathBuf, arch: String },
    #[error("{package} {version}: fetching {url}: {reason}")]
    Fetch {
        package: String,
        version: String,
        url: String,
        reason: String,
    },
    #[error("rootfs tar {path}: {reason}")]
    Tar { path: PathBuf, reason: String },
}

pub(crate) fn io_err(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> DebianError {
    let path = path.into();
    move |source| DebianError::Io { path, source }
}
