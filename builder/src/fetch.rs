//! Pinned downloads into a content-addressed cache.
//!
//! Owns `<cache>/sha256/<hex>`: a file appears there only after its bytes,
//! streamed from the source, hashed to the pinned sha256 (and matched the
//! pinned size when one is given), were fsynced and renamed into place.
//! Sources are `http://`, `https://` and `file://` URLs; where a URL came from
//! (upstream, a mirror, an override) is decided by the recipe, not here.
//! Downloads run in parallel with retries and exponential backoff for
//! transient failures; a digest or size mismatch is never retried, the
//! partial file is removed and the error names the URL and both digests.
//! Cached files are re-hashed before use, so a damaged cache heals itself.
//!
//! It deliberately does not know about recipes, platforms or layers: callers
//! hand it a list of [`Pinned`] items and get paths back, in the same order.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use kubeslot_image::digest::{Hasher, HashingReader};
use kubeslot_image::Digest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::progress::{Progress, Task};

/// Nothing larger than this is downloaded unless the caller raises it.
pub const DEFAULT_MAX_SIZE: u64 = 2 * 1024 * 1024 * 1024;

/// One input pinned by sha256.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pinned {
    /// Where to get it (`http://`, `https://` or `file://`).
    pub url: String,
    /// What it must hash to.
    pub sha256: Digest,
    /// Its exact size, when known (checked, and used as the read cap).
    pub size: Option<u64>,
    /// A short human name for progress and errors (`kubelet linux/amd64`).
    pub label: String,
}

/// Why an input could not be fetched; every variant names the URL.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{label}: {url}: sha256 mismatch: expected {expected}, got {actual} (the download was deleted)")]
    Mismatch {
        label: String,
        url: String,
        expected: Digest,
        actual: Digest,
    },
    #[error("{label}: {url}: {actual} bytes, the pin says {expected} (the download was deleted)")]
    Size {
        label: String,
        url: String,
        expected: u64,
        actual: u64,
    },
    #[error("{label}: {url}: larger than the {limit}-byte download limit")]
    TooLarge {
        label: String,
        url: String,
        limit: u64,
    },
    #[error("{label}: {url}: server answered {status}")]
    Status {
        label: String,
        url: String,
        status: u16,
    },
    #[error("{label}: {url}: {source}")]
    Http {
        label: String,
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{label}: {url}: unsupported URL ({reason})")]
    BadUrl {
        label: String,
        url: String,
        reason: String,
    },
    #[error("{label}: {path}: {source}")]
    Io {
        label: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl FetchError {
    /// Whether trying again may help (network trouble, server errors).
    fn transient(&self) -> bool {
        match self {
            FetchError::Http { .. } => true,
            FetchError::Status { status, .. } => *status >= 500 || *status == 429,
            _ => false,
        }
    }
}

/// Fetches pinned inputs into the cache.
#[derive(Clone)]
pub struct Fetcher {
    dir: PathBuf,
    client: reqwest::Client,
    progress: Progress,
    max_size: u64,
    attempts: u32,
    parallel: usize,
    backoff: Duration,
}

// `cached`, `with_max_size` and `with_parallelism` are API for the Debian
// base module (it fetches `.deb`s through this cache) and for tests.
#[allow(dead_code)]
impl Fetcher {
    /// A fetcher whose cache is `<cache_dir>/sha256/` (created on first use).
    pub fn new(cache_dir: impl Into<PathBuf>, progress: Progress) -> Result<Self, FetchError> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(30))
            .read_timeout(Duration::from_secs(60))
            .user_agent(concat!("kubeslot-builder/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|source| FetchError::Http {
                label: "http client".into(),
                url: String::new(),
                source,
            })?;
        Ok(Fetcher {
            dir: cache_dir.into().join("sha256"),
            client,
            progress,
            max_size: DEFAULT_MAX_SIZE,
            attempts: 4,
            parallel: 4,
            backoff: Duration::from_millis(500),
        })
    }

    /// Caps every download (bytes) that has no pinned size.
    pub fn with_max_size(mut self, max_size: u64) -> Self {
        self.max_size = max_size;
        self
    }

    /// How many downloads run at once.
    pub fn with_parallelism(mut self, n: usize) -> Self {
        self.parallel = n.max(1);
        self
    }

    /// The cache path of `sha` when it is present (not re-hashed here).
    pub fn cached(&self, sha: &Digest) -> Option<PathBuf> {
        let p = self.path(sha);
        p.is_file().then_some(p)
    }

    fn path(&self, sha: &Digest) -> PathBuf {
        self.dir.join(sha.hex())
    }

    /// Fetches every item (in parallel) and returns their cache paths in
    /// the same order. The first error wins; items already fetched stay in
    /// the cache, where they are valid.
    pub async fn fetch_all(&self, items: &[Pinned]) -> Result<Vec<PathBuf>, FetchError> {
        tokio::fs::create_dir_all(&self.dir)
            .await
            .map_err(|source| FetchError::Io {
                label: "cache".into(),
                path: self.dir.clone(),
                source,
            })?;
        // The same bytes may be pinned twice (an `Architecture: all` package
        // of two platforms): fetch each digest once.
        let mut unique: Vec<&Pinned> = Vec::new();
        for item in items {
            if !unique.iter().any(|u| u.sha256 == item.sha256) {
                unique.push(item);
            }
        }
        let paths: Vec<PathBuf> =
            futures_util::stream::iter(unique.iter().map(|item| self.fetch_one(item)))
                .buffered(self.parallel)
                .try_collect()
                .await?;
        Ok(items
            .iter()
            .map(|item| {
                let i = unique
                    .iter()
                    .position(|u| u.sha256 == item.sha256)
                    .expect("every digest was fetched");
                paths[i].clone()
            })
            .collect())
    }

    /// Fetches one item, retrying transient failures with backoff.
    pub async fn fetch_one(&self, item: &Pinned) -> Result<PathBuf, FetchError> {
        let dest = self.path(&item.sha256);
        if dest.is_file() && self.cache_entry_valid(item, &dest).await? {
            let task = self.progress.task("cached", &item.label, None);
            task.finish("cached");
            return Ok(dest);
        }
        let mut task = self.progress.task("fetch", &item.label, item.size);
        if let (None, Ok(md)) = (item.size, std::fs::metadata(local_path(&item.url))) {
            task.set_total(md.len());
        }
        let mut delay = self.backoff;
        let mut attempt = 1;
        loop {
            match self.download(item, &dest, &mut task).await {
                Ok(()) => {
                    task.finish("done");
                    return Ok(dest);
                }
                Err(e) if e.transient() && attempt < self.attempts => {
                    self.progress.line(&format!(
                        "fetch {}: attempt {attempt} failed ({e}), retrying in {:.1} s",
                        item.label,
                        delay.as_secs_f64()
                    ));
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                    attempt += 1;
                    task.reset();
                }
                Err(e) => {
                    task.finish("failed");
                    return Err(e);
                }
            }
        }
    }

    /// Re-hashes a cache entry; removes it when it is damaged.
    async fn cache_entry_valid(&self, item: &Pinned, path: &Path) -> Result<bool, FetchError> {
        let p = path.to_path_buf();
        let io = |source| FetchError::Io {
            label: item.label.clone(),
            path: path.to_path_buf(),
            source,
        };
        let (actual, len) = tokio::task::spawn_blocking(move || {
            let f = std::fs::File::open(&p)?;
            let mut r = HashingReader::new(std::io::BufReader::with_capacity(1 << 20, f));
            std::io::copy(&mut r, &mut std::io::sink())?;
            Ok::<_, std::io::Error>(r.finish())
        })
        .await
        .expect("hashing task does not panic")
        .map_err(io)?;
        if actual == item.sha256 && item.size.is_none_or(|s| s == len) {
            return Ok(true);
        }
        tracing::warn!(path = %path.display(), "damaged cache entry removed");
        tokio::fs::remove_file(path).await.map_err(io)?;
        Ok(false)
    }

    async fn download(
        &self,
        item: &Pinned,
        dest: &Path,
        task: &mut Task,
    ) -> Result<(), FetchError> {
        let io_at = |path: &Path| {
            let path = path.to_path_buf();
            let label = item.label.clone();
            move |source| FetchError::Io {
                label,
                path,
                source,
            }
        };
        tokio::fs::create_dir_all(&self.dir)
            .await
            .map_err(io_at(&self.dir))?;
        // The partial file lives beside its final name (same filesystem, so
        // the rename is atomic) and is deleted on drop unless persisted.
        let tmp = tempfile::Builder::new()
            .prefix(".partial-")
            .tempfile_in(&self.dir)
            .map_err(io_at(&self.dir))?;
        let (std_file, tmp_path) = tmp.into_parts();
        let mut file = tokio::fs::File::from_std(std_file);
        let limit = item.size.unwrap_or(self.max_size);
        let mut hasher = Hasher::new();

        let url = reqwest::Url::parse(&item.url).map_err(|e| FetchError::BadUrl {
            label: item.label.clone(),
            url: item.url.clone(),
            reason: e.to_string(),
        })?;
        let write = |bytes: &[u8], hasher: &mut Hasher, task: &mut Task| {
            hasher.update(bytes);
            task.inc(bytes.len() as u64);
            if hasher.len() > limit {
                return Err(self.too_big(item, limit));
            }
            Ok(())
        };
        match url.scheme() {
            "file" => {
                let path = url.to_file_path().map_err(|()| FetchError::BadUrl {
                    label: item.label.clone(),
                    url: item.url.clone(),
                    reason: "not a local file path".into(),
                })?;
                let mut src = tokio::fs::File::open(&path).await.map_err(io_at(&path))?;
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    let n = src.read(&mut buf).await.map_err(io_at(&path))?;
                    if n == 0 {
                        break;
                    }
                    write(&buf[..n], &mut hasher, task)?;
                    file.write_all(&buf[..n]).await.map_err(io_at(&tmp_path))?;
                }
            }
            "http" | "https" => {
                let resp = self
                    .client
                    .get(url)
                    .send()
                    .await
                    .map_err(|source| self.http(item, source))?;
                if !resp.status().is_success() {
                    return Err(FetchError::Status {
                        label: item.label.clone(),
                        url: item.url.clone(),
                        status: resp.status().as_u16(),
                    });
                }
                if let Some(len) = resp.content_length() {
                    if len > limit {
                        return Err(self.too_big(item, limit));
                    }
                    task.set_total(len);
                }
                let mut stream = resp.bytes_stream();
                while let Some(chunk) = stream.next().await {
                    let chunk = chunk.map_err(|source| self.http(item, source))?;
                    write(&chunk, &mut hasher, task)?;
                    file.write_all(&chunk).await.map_err(io_at(&tmp_path))?;
                }
            }
            other => {
                return Err(FetchError::BadUrl {
                    label: item.label.clone(),
                    url: item.url.clone(),
                    reason: format!("scheme {other:?}; use http, https or file"),
                })
            }
        }
        check_pin(item, hasher)?;
        file.flush().await.map_err(io_at(&tmp_path))?;
        file.sync_all().await.map_err(io_at(&tmp_path))?;
        drop(file);
        tmp_path.persist(dest).map_err(|e| io_at(dest)(e.error))?;
        kubeslot_image::atomic::sync_dir(&self.dir).map_err(|e| FetchError::Io {
            label: item.label.clone(),
            path: e.path,
            source: e.source,
        })?;
        Ok(())
    }

    fn http(&self, item: &Pinned, source: reqwest::Error) -> FetchError {
        FetchError::Http {
            label: item.label.clone(),
            url: item.url.clone(),
            source,
        }
    }

    fn too_big(&self, item: &Pinned, limit: u64) -> FetchError {
        FetchError::TooLarge {
            label: item.label.clone(),
            url: item.url.clone(),
            limit,
        }
    }
}

/// The downloaded bytes against the pin: the size (when pinned), then the
/// sha256.
fn check_pin(item: &Pinned, hasher: Hasher) -> Result<(), FetchError> {
    let len = hasher.len();
    let actual = hasher.finish();
    if let Some(expected) = item.size {
        if expected != len {
            return Err(FetchError::Size {
                label: item.label.clone(),
                url: item.url.clone(),
                expected,
                actual: len,
            });
        }
    }
    if actual != item.sha256 {
        return Err(FetchError::Mismatch {
            label: item.label.clone(),
            url: item.url.clone(),
            expected: item.sha256,
            actual,
        });
    }
    Ok(())
}

/// The local path of a `file://` URL (empty for anything else), for sizing
/// the progress bar only.
fn local_path(url: &str) -> PathBuf {
    reqwest::Url::parse(url)
        .ok()
        .filter(|u| u.scheme() == "file")
        .and_then(|u| u.to_file_path().ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pinned(url: String, bytes: &[u8], label: &str) -> Pinned {
        Pinned {
            url,
            sha256: Digest::of(bytes),
            size: None,
            label: label.into(),
        }
    }

    #[tokio::test]
    async fn fetches_file_urls_and_rejects_mismatches() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("a.bin");
        std::fs::write(&src, b"hello").unwrap();
        let url = reqwest::Url::from_file_path(&src).unwrap().to_string();
        let f = Fetcher::new(tmp.path().join("cache"), Progress::quiet()).unwrap();

        let good = pinned(url.clone(), b"hello", "a");
        let paths = f.fetch_all(std::slice::from_ref(&good)).await.unwrap();
        assert_eq!(std::fs::read(&paths[0]).unwrap(), b"hello");
        assert_eq!(f.cached(&good.sha256), Some(paths[0].clone()));

        let bad = pinned(url.clone(), b"other", "b");
        let e = f.fetch_all(&[bad]).await.unwrap_err().to_string();
        assert!(e.contains(&url) && e.contains("mismatch"), "{e}");
        assert!(e.contains(&Digest::of(b"hello").to_string()), "{e}");
        // only the good entry is in the cache: no partial file survives
        let names: Vec<_> = std::fs::read_dir(tmp.path().join("cache/sha256"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(good.sha256.hex())]);

        let capped = f.clone().with_max_size(3);
        let big = pinned(url, b"hellox", "c");
        let e = capped.fetch_all(&[big]).await.unwrap_err();
        assert!(matches!(e, FetchError::TooLarge { .. }), "{e}");
    }

    #[tokio::test]
    async fn the_same_digest_is_fetched_once_and_returned_for_each_item() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("a.bin");
        std::fs::write(&src, b"same").unwrap();
        let url = reqwest::Url::from_file_path(&src).unwrap().to_string();
        let f = Fetcher::new(tmp.path().join("cache"), Progress::quiet()).unwrap();
        let items = [
            pinned(url.clone(), b"same", "x amd64"),
            pinned(url, b"same", "x arm64"),
        ];
        let paths = f.fetch_all(&items).await.unwrap();
        assert_eq!(paths.len(), 2);
        assert_eq!(paths[0], paths[1]);
    }

    /// A loopback HTTP server that answers 503 to the first request and
    /// `body` to the next ones; returns its URL and a request counter.
    async fn flaky_server(
        body: &'static [u8],
    ) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::Ordering;
        use tokio::io::AsyncReadExt as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = hits.clone();
        tokio::spawn(async move {
            loop {
                let (mut sock, _) = listener.accept().await.unwrap();
                let mut buf = vec![0u8; 4096];
                let _ = sock.read(&mut buf).await;
                let n = counter.fetch_add(1, Ordering::SeqCst);
                let resp = if n == 0 {
                    b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_vec()
                } else {
                    let mut r = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    )
                    .into_bytes();
                    r.extend_from_slice(body);
                    r
                };
                let _ = sock.write_all(&resp).await;
                let _ = sock.shutdown().await;
            }
        });
        (format!("http://{addr}/blob"), hits)
    }

    #[tokio::test]
    async fn transient_http_errors_are_retried() {
        let tmp = tempfile::tempdir().unwrap();
        let (url, hits) = flaky_server(b"served").await;
        let mut f = Fetcher::new(tmp.path().join("cache"), Progress::quiet()).unwrap();
        f.backoff = Duration::from_millis(10);
        let p = f.fetch_one(&pinned(url, b"served", "flaky")).await.unwrap();
        assert_eq!(std::fs::read(p).unwrap(), b"served");
        assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    /// Downloads run at once, up to the parallelism: a loopback server
    /// holds every answer until that many requests are open together (or
    /// gives up waiting after a while and answers anyway, so a serial
    /// fetcher fails the count instead of hanging).
    #[tokio::test]
    async fn downloads_run_in_parallel_up_to_the_limit() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        use tokio::io::AsyncReadExt as _;
        const N: usize = 3;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (open_tx, open_rx) = tokio::sync::watch::channel((0usize, false));
        let most = Arc::new(AtomicUsize::new(0));
        let seen = most.clone();
        tokio::spawn(async move {
            loop {
                let (mut sock, _) = listener.accept().await.unwrap();
                let mut rx = open_rx.clone();
                let open_tx = open_tx.clone();
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let n = sock.read(&mut buf).await.unwrap();
                    let req = String::from_utf8_lossy(&buf[..n]).to_string();
                    let path = req.split(' ').nth(1).unwrap_or("/").to_string();
                    // (open now, N were open together once)
                    open_tx.send_modify(|(open, go)| {
                        *open += 1;
                        *go |= *open >= N;
                    });
                    seen.fetch_max(open_tx.borrow().0, Ordering::SeqCst);
                    let _ =
                        tokio::time::timeout(Duration::from_secs(20), rx.wait_for(|s| s.1)).await;
                    let body = format!("body of {path}");
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    // closed before the client can see the answer and open the next
                    open_tx.send_modify(|(open, _)| *open -= 1);
                    let _ = sock.write_all(resp.as_bytes()).await;
                    let _ = sock.shutdown().await;
                });
            }
        });
        let tmp = tempfile::tempdir().unwrap();
        let f = Fetcher::new(tmp.path().join("cache"), Progress::quiet())
            .unwrap()
            .with_parallelism(N);
        let items: Vec<Pinned> = (0..N + 2)
            .map(|i| {
                let body = format!("body of /{i}");
                pinned(format!("http://{addr}/{i}"), body.as_bytes(), "p")
            })
            .collect();
        let paths = f.fetch_all(&items).await.unwrap();
        for (i, p) in paths.iter().enumerate() {
            assert_eq!(
                std::fs::read(p).unwrap(),
                format!("body of /{i}").into_bytes()
            );
        }
        assert_eq!(most.load(Ordering::SeqCst), N, "requests open at once");
    }

    #[tokio::test]
    async fn damaged_cache_entries_are_refetched() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("a.bin");
        std::fs::write(&src, b"payload").unwrap();
        let url = reqwest::Url::from_file_path(&src).unwrap().to_string();
        let f = Fetcher::new(tmp.path().join("cache"), Progress::quiet()).unwrap();
        let item = pinned(url, b"payload", "a");
        let p = f.fetch_one(&item).await.unwrap();
        std::fs::write(&p, b"corrupt").unwrap();
        let p2 = f.fetch_one(&item).await.unwrap();
        assert_eq!(std::fs::read(p2).unwrap(), b"payload");
    }
}
