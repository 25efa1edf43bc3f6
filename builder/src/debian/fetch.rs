//! Fetching exactly the locked `.deb`s of one platform into a
//! content-addressed cache (`CACHE/sha256/<hex>`): URL = the repository's
//! mirror + the lock's pool path; the size is capped and the sha256 checked
//! while streaming, and a file enters the cache only when both match (temp,
//! fsync, rename, fsync dir). A cached file is used without the network, so a
//! locked build works offline. It does not resolve anything and trusts only
//! the lock. (The builder's general `fetch::Fetcher` may take this over; the
//! cache layout is the same content-addressed one.)

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use super::error::{io_err, DebianError};
use super::lock::{LockedDeb, PlatformLock};
use super::Repository;

/// Returns the cache path of every package of `platform`, in lock order,
/// fetching what the cache lacks. Nothing is written for a mismatching file.
pub fn fetch_debs(
    repos: &[Repository],
    platform: &PlatformLock,
    cache: &Path,
) -> Result<Vec<PathBuf>, DebianError> {
    let dir = cache.join("sha256");
    std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
    let mut out = Vec::new();
    for deb in &platform.packages {
        let path = dir.join(&deb.sha256);
        let cached = std::fs::metadata(&path).is_ok_and(|m| m.len() == deb.size);
        if !cached {
            let repo = repos
                .iter()
                .find(|r| r.name == deb.repository)
                .ok_or_else(|| DebianError::LockInvalid {
                    path: "(lock)".into(),
                    reason: format!(
                        "package {} names repository `{}`, which the recipe does not have",
                        deb.name, deb.repository
                    ),
                })?;
            let url = format!("{}{}", repo.root(), deb.path);
            tracing::info!(package = %deb.name, %url, "fetch");
            fetch_one(deb, &url, &dir, &path)?;
        }
        out.push(path);
    }
    Ok(out)
}

fn fetch_one(deb: &LockedDeb, url: &str, dir: &Path, dest: &Path) -> Result<(), DebianError> {
    let fail = |reason: String| DebianError::Fetch {
        package: deb.name.clone(),
        version: deb.version.clone(),
        url: url.to_string(),
        reason,
    };
    let reader: Box<dyn Read> = if let Some(local) = url.strip_prefix("file://") {
        Box::new(std::fs::File::open(local).map_err(|e| fail(e.to_string()))?)
    } else {
        let resp = ureq::get(url).call().map_err(|e| fail(e.to_string()))?;
        Box::new(resp.into_body().into_reader())
    };
    // One byte past the pinned size is enough to know it is too long.
    let mut reader = reader.take(deb.size + 1);
    let mut tmp = tempfile::Builder::new()
        .prefix(".fetch-")
        .tempfile_in(dir)
        .map_err(io_err(dir))?;
    let mut hasher = Sha256::new();
    let mut n: u64 = 0;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let k = reader.read(&mut buf).map_err(|e| fail(e.to_string()))?;
        if k == 0 {
            break;
        }
        hasher.update(&buf[..k]);
        tmp.write_all(&buf[..k]).map_err(io_err(tmp.path()))?;
        n += k as u64;
    }
    let actual = hex::encode(hasher.finalize());
    if n != deb.size {
        return Err(DebianError::DebSize {
            package: deb.name.clone(),
            version: deb.version.clone(),
            url: url.to_string(),
            expected: deb.size,
            actual: n,
        });
    }
    if actual != deb.sha256 {
        return Err(DebianError::DebMismatch {
            package: deb.name.clone(),
            version: deb.version.clone(),
            url: url.to_string(),
            expected: deb.sha256.clone(),
            actual,
        });
    }
    tmp.as_file().sync_all().map_err(io_err(tmp.path()))?;
    tmp.persist(dest).map_err(|e| io_err(dest)(e.error))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}
