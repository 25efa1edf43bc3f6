//! Resolving a package base into a [`Lock`]: per platform, in a fresh
//! private apt root, `apt-get update` (apt verifies InRelease with the
//! recipe's keyring), then `apt-get install --print-uris` of the recipe's
//! packages plus the minbase set (Essential: yes and Priority: required, as
//! mmdebstrap's minbase) into an empty dpkg status. Every `.deb` apt names is
//! matched to its stanza in the signed `Packages` index. It does not fetch
//! `.deb`s unless asked to ([`download`]), and never writes a partial lock.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::apt::{AptRoot, PackagesTarget};
use super::error::{io_err, DebianError};
use super::index::{self, IndexEntry};
use super::lock::{Lock, LockedDeb, PlatformLock, ReleaseLock, LOCK_VERSION};
use super::{RecipeBase, Repository};

/// Resolves every platform of `recipe` (with its mirrors already applied)
/// into a lock; `work` is a scratch directory for the apt roots.
pub fn resolve(recipe: &RecipeBase, work: &Path) -> Result<Lock, DebianError> {
    let mut platforms = Vec::new();
    for arch in &recipe.arches {
        let span = tracing::info_span!("resolve", arch = %arch);
        let _enter = span.enter();
        platforms.push(resolve_platform(recipe, arch, &work.join(arch))?.0);
    }
    Ok(Lock {
        version: LOCK_VERSION,
        base_sha256: recipe.base_sha256.clone(),
        platforms,
    })
}

/// Resolves one platform; also returns the apt root (to download from it).
fn resolve_platform(
    recipe: &RecipeBase,
    arch: &str,
    root: &Path,
) -> Result<(PlatformLock, AptRoot), DebianError> {
    let repos = recipe.base.repositories(arch);
    let apt = AptRoot::create(root, arch, &repos)?;
    tracing::info!("apt-get update");
    apt.update()?;
    let targets = apt.packages_targets()?;
    let mut indexes: BTreeMap<String, Vec<IndexEntry>> = BTreeMap::new();
    let mut releases = Vec::new();
    for repo in &repos {
        let mine: Vec<&PackagesTarget> = targets
            .iter()
            .filter(|t| t.repo_uri == repo.root())
            .collect();
        let mut entries = Vec::new();
        let mut inrelease: Option<PathBuf> = None;
        for t in &mine {
            if !t.filename.is_file() {
                return Err(DebianError::Index {
                    path: t.filename.clone(),
                    reason: format!(
                        "repository `{}` ({arch}) has no {} after apt-get update",
                        repo.name, t.metakey
                    ),
                });
            }
            entries.extend(index::read_packages(&t.filename)?);
            inrelease.get_or_insert_with(|| inrelease_of(t));
        }
        let expected = inrelease.unwrap_or_else(|| root.join("var/lib/apt/lists/(none)"));
        if mine.is_empty() || !expected.is_file() {
            return Err(DebianError::NoInRelease {
                repo: repo.name.clone(),
                arch: arch.to_string(),
                path: expected,
            });
        }
        let bytes = std::fs::read(&expected).map_err(io_err(&expected))?;
        releases.push(ReleaseLock {
            repository: repo.name.clone(),
            suite: repo.suite.clone(),
            inrelease_sha256: kubeslot_image::Digest::of(&bytes).hex(),
        });
        indexes.insert(repo.name.clone(), entries);
    }

    let mut names = index::minbase_names(&indexes[super::BASE_REPO]);
    names.extend(recipe.base.requested(arch));
    names.sort();
    names.dedup();
    tracing::info!(requested = names.len(), "apt-get install --print-uris");
    let uris = apt.print_uris(&names)?;
    let packages = match_uris(&repos, &indexes, &uris)?;
    Ok((
        PlatformLock {
            arch: arch.to_string(),
            releases,
            packages,
        },
        apt,
    ))
}

/// apt stores `…_dists_SUITE_main_binary-amd64_Packages` beside
/// `…_dists_SUITE_InRelease`: strip the metakey, add `InRelease`.
fn inrelease_of(t: &PackagesTarget) -> PathBuf {
    let name = t
        .filename
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let suffix = t.metakey.replace('/', "_");
    let prefix = name.strip_suffix(&suffix).unwrap_or(&name);
    t.filename.with_file_name(format!("{prefix}InRelease"))
}

fn match_uris(
    repos: &[Repository],
    indexes: &BTreeMap<String, Vec<IndexEntry>>,
    uris: &[super::apt::PrintedUri],
) -> Result<Vec<LockedDeb>, DebianError> {
    let mut out = Vec::new();
    for u in uris {
        let (repo, path) = repos
            .iter()
            .find_map(|r| u.url.strip_prefix(&r.root()).map(|p| (r, p)))
            .ok_or_else(|| DebianError::UriOutsideRepos { url: u.url.clone() })?;
        // apt percent-encodes `:` and `+` in URLs; the index does not. A
        // flat repository's index may say `./name.deb`.
        let path = percent_decode(path);
        let path = path.trim_start_matches("./");
        let entry = indexes[&repo.name]
            .iter()
            .find(|e| {
                e.filename.trim_start_matches("./") == path
                    && e.size == u.size
                    && u.sha256.as_ref().is_none_or(|h| *h == e.sha256)
            })
            .ok_or_else(|| DebianError::NotInIndex {
                url: u.url.clone(),
                repo: repo.name.clone(),
            })?;
        out.push(LockedDeb {
            name: entry.package.clone(),
            version: entry.version.clone(),
            architecture: entry.architecture.clone(),
            repository: repo.name.clone(),
            path: entry.filename.trim_start_matches("./").to_string(),
            size: entry.size,
            sha256: entry.sha256.clone(),
        });
    }
    out.sort();
    Ok(out)
}

/// Has apt itself download the locked `.deb`s of `arch` (resolving again in
/// a fresh root under `work`) and places each at `dest/<pool path>` after
/// checking it against the lock: a seed for a loopback or air-gapped mirror.
pub fn download(
    recipe: &RecipeBase,
    lock: &Lock,
    arch: &str,
    work: &Path,
    dest: &Path,
) -> Result<(), DebianError> {
    let locked = lock.platform(arch)?;
    let (again, apt) = resolve_platform(recipe, arch, work)?;
    if again.packages != locked.packages {
        return Err(DebianError::LockInvalid {
            path: "(lock)".into(),
            reason: format!("the archive now resolves {arch} differently; lock again first"),
        });
    }
    let names: Vec<String> = locked.packages.iter().map(|p| p.name.clone()).collect();
    apt.download(&names)?;
    let mut by_sha: BTreeMap<String, PathBuf> = BTreeMap::new();
    let archives = apt.archives();
    for e in std::fs::read_dir(&archives).map_err(io_err(&archives))? {
        let p = e.map_err(io_err(&archives))?.path();
        if p.extension().is_some_and(|x| x == "deb") {
            let bytes = std::fs::read(&p).map_err(io_err(&p))?;
            by_sha.insert(kubeslot_image::Digest::of(&bytes).hex(), p);
        }
    }
    for deb in &locked.packages {
        let src = by_sha.get(&deb.sha256).ok_or_else(|| DebianError::Fetch {
            package: deb.name.clone(),
            version: deb.version.clone(),
            url: deb.path.clone(),
            reason: "apt-get download produced no file with the locked sha256".into(),
        })?;
        let target = dest.join(&deb.path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(io_err(parent))?;
        }
        std::fs::copy(src, &target).map_err(io_err(&target))?;
    }
    Ok(())
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn percent_decode_handles_epoch_and_plus() {
        assert_eq!(
            super::percent_decode("pool/a_1%3a2-14%2bdeb12u1_amd64.deb%"),
            "pool/a_1:2-14+deb12u1_amd64.deb%"
        );
    }
}
