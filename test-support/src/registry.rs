//! A real Debian `docker-registry` on a free 127.0.0.1 port, with its
//! storage in a temp dir and its access log readable by the test; optional
//! htpasswd auth. Killed by PID when dropped.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{free_port, require_tool, workspace_root};

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

impl Registry {
    /// A registry with htpasswd (basic) auth for user `kubeslot`, password
    /// `s3cret` (`testdata/registry-auth/htpasswd`).
    pub fn start_with_auth() -> Registry {
        let htpasswd = workspace_root().join("testdata/registry-auth/htpasswd");
        Registry::start_with(&format!(
            "auth:\n  htpasswd:\n    realm: kubeslot-test\n    path: {}\n",
            htpasswd.display()
        ))
    }
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
}
