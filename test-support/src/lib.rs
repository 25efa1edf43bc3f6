//! Test harness shared by the kubeslot crates' black-box tests: a real
//! Debian `docker-registry` on a free 127.0.0.1 port with its storage in a
//! temp dir, a check that a required tool is installed (failing, never
//! skipping, with the install command), and the machine's Debian mirror read
//! from its apt sources.
//!
//! It deliberately mocks nothing: tests get real processes and real files.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Panics with an install hint when `tool` is not on PATH. Tests call this
/// first so a missing tool is a failure that says what to do, not a skip.
pub fn require_tool(tool: &str, debian_package: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join(tool);
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!(
        "required tool `{tool}` is not installed: run `apt-get install -y {debian_package}` \
         (or `.ci/run`, which installs every tool the tests need)"
    );
}

/// A free TCP port on 127.0.0.1 (bound then released; the caller binds it
/// soon after, and other sessions on the machine pick their own).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind 127.0.0.1:0")
}

/// A running Debian `docker-registry`, killed (by PID) when dropped.
pub struct Registry {
    child: Child,
    port: u16,
    storage: PathBuf,
    log: PathBuf,
    extra: String,
    _dir: tempfile::TempDir,
}

impl Registry {
    /// Starts a registry with filesystem storage in a fresh temp dir.
    pub fn start() -> Registry {
        let bin = require_tool("docker-registry", "docker-registry");
        let dir = tempfile::tempdir().expect("temp dir");
        let storage = dir.path().join("storage");
        std::fs::create_dir_all(&storage).unwrap();
        Self::start_with_storage(bin, dir, storage, "")
    }

    /// Starts a registry whose config gets `extra` (top-level YAML sections,
    /// e.g. an `auth:` block with htpasswd or token settings) appended.
    pub fn start_with(extra: &str) -> Registry {
        let bin = require_tool("docker-registry", "docker-registry");
        let dir = tempfile::tempdir().expect("temp dir");
        let storage = dir.path().join("storage");
        std::fs::create_dir_all(&storage).unwrap();
        Self::start_with_storage(bin, dir, storage, extra)
    }

    /// Starts a registry over existing `storage` (to restart one that was
    /// killed, keeping what it had received).
    pub fn restart(mut self) -> Registry {
        self.kill();
        let dir = std::mem::replace(&mut self._dir, tempfile::tempdir().expect("temp dir"));
        let storage = self.storage.clone();
        let bin = require_tool("docker-registry", "docker-registry");
        let extra = std::mem::take(&mut self.extra);
        Self::start_with_storage(bin, dir, storage, &extra)
    }

    fn start_with_storage(
        bin: PathBuf,
        dir: tempfile::TempDir,
        storage: PathBuf,
        extra: &str,
    ) -> Registry {
        for _attempt in 0..5 {
            let port = free_port();
            let config = dir.path().join("config.yml");
            std::fs::write(
                &config,
                format!(
                    "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\n\
                     storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
                     http:\n  addr: 127.0.0.1:{port}\n{extra}",
                    storage.display()
                ),
            )
            .unwrap();
            let log = dir.path().join(format!("registry-{port}.log"));
            let log_file = std::fs::File::create(&log).unwrap();
            let mut child = Command::new(&bin)
                .arg("serve")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(log_file.try_clone().unwrap())
                .stderr(log_file)
                .spawn()
                .expect("spawn docker-registry");
            let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break; // port taken or bad config: try another port
                }
                if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                    return Registry {
                        child,
                        port,
                        storage,
                        log,
                        extra: extra.to_string(),
                        _dir: dir,
                    };
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("docker-registry did not start on 127.0.0.1 after 5 attempts");
    }

    /// `127.0.0.1:<port>`, the registry part of image references.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The registry's storage root (to tamper with blobs in tests).
    pub fn storage(&self) -> &Path {
        &self.storage
    }

    /// The registry's access and error log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kills the registry process (SIGKILL) without removing its storage.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The machine's Debian mirror (the first `http(s)` URI of a `deb` source for
/// the `debian` archive), read at run time so no host name is written in the
/// repository.
pub fn debian_mirror() -> String {
    let mut texts = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/etc/apt/sources.list.d") {
        for e in rd.flatten() {
            if let Ok(t) = std::fs::read_to_string(e.path()) {
                texts.push(t);
            }
        }
    }
    if let Ok(t) = std::fs::read_to_string("/etc/apt/sources.list") {
        texts.push(t);
    }
    for text in &texts {
        for line in BufReader::new(text.as_bytes())
            .lines()
            .map_while(Result::ok)
        {
            let line = line.trim();
            let url = if let Some(rest) = line.strip_prefix("URIs:") {
                rest.split_whitespace().next()
            } else if let Some(rest) = line.strip_prefix("deb ") {
                rest.split_whitespace().find(|w| w.starts_with("http"))
            } else {
                None
            };
            if let Some(u) = url {
                let u = u.trim_end_matches('/');
                if u.starts_with("http") && !u.contains("security") && u.ends_with("/debian") {
                    return u.to_string();
                }
            }
        }
    }
    panic!("no Debian mirror found in /etc/apt/sources.list(.d): the tests need the machine's configured Debian archive");
}

/// Path of a cached Debian bookworm rootfs tar (mmdebstrap, minbase plus
/// `packages`), built on first use by `ci/lib/debian-rootfs.sh` from the
/// machine's Debian mirror and shared by every test and benchmark after.
pub fn debian_rootfs(packages: &[&str]) -> PathBuf {
    require_tool("mmdebstrap", "mmdebstrap");
    let script = workspace_root().join("ci/lib/debian-rootfs.sh");
    let out = Command::new(&script)
        .arg(packages.join(","))
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} {} failed ({})",
        script.display(),
        packages.join(","),
        out.status
    );
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(
        path.is_file(),
        "{} printed no rootfs path",
        script.display()
    );
    path
}

/// Path of a workspace file, from a test's `CARGO_MANIFEST_DIR`.
pub fn workspace_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().expect("workspace root").to_path_buf()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_answers_v2() {
        let reg = Registry::start();
        let mut s = TcpStream::connect(("127.0.0.1", reg.port())).unwrap();
        use std::io::{Read, Write};
        write!(s, "GET /v2/ HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(
            out.starts_with("HTTP/1.0 200") || out.starts_with("HTTP/1.1 200"),
            "{out}"
        );
    }

    #[test]
    fn finds_a_debian_mirror() {
        assert!(debian_mirror().starts_with("http"));
    }
}
