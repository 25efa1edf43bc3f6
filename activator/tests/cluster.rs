//! The cluster side of a flip (issue 38) against the fixture API server
//! (`fixtures/fake-apiserver`, in-process on a free port) and against
//! clients nobody here wrote: kubectl 1.36 (`ci/lib/kube-clients.sh`
//! installs it; a test fails naming that command when it is missing).
//!
//! This file is the harness ([`Fixture`], a seeded generator); the tests
//! sit in `drain_selection` (the drain's pod selection against `kubectl
//! drain --dry-run=client`).

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use fake_apiserver::api::Server;
use fake_apiserver::{admin_request, config::Config, create_as_admin};
use serde_json::Value;

mod drain_selection;

const KUBECTL: &str = "/opt/kubeslot-ci/kubectl/usr/bin/kubectl";
const INSTALL: &str = "ci/lib/kube-clients.sh (or .ci/run; Debian's kubernetes-client)";

fn kubectl_bin() -> PathBuf {
    let p = PathBuf::from(std::env::var("KUBESLOT_KUBECTL").unwrap_or_else(|_| KUBECTL.into()));
    assert!(
        p.is_file(),
        "kubectl 1.36 is not installed at {}: run {INSTALL}",
        p.display()
    );
    p
}

const CONFIG: &str = r#"{
  "client_certs": [
    {"name": "admin", "user": "kubernetes-admin", "groups": ["system:masters"]}
  ],
  "remove_pods_after_grace": false
}"#;

/// An in-process fixture API server and its PKI (kubeconfigs).
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub srv: Arc<Server>,
}

impl Fixture {
    pub fn start() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::parse(CONFIG, "test config").unwrap();
        let p = fake_apiserver::prepare("127.0.0.1:0", &dir.path().join("pki"), config).unwrap();
        let (srv, _url) = fake_apiserver::spawn(p);
        Fixture { dir, srv }
    }

    pub fn kubeconfig(&self, who: &str) -> PathBuf {
        self.dir
            .path()
            .join("pki")
            .join(format!("{who}.kubeconfig"))
    }

    /// kubectl as the admin: (exit code, stdout, stderr).
    pub fn kubectl(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(kubectl_bin())
            // a private HOME: kubectl's discovery cache stays in the test
            .env("HOME", self.dir.path())
            .env_remove("KUBECONFIG")
            .arg("--kubeconfig")
            .arg(self.kubeconfig("admin"))
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    pub fn create(&self, obj: &Value) -> Value {
        create_as_admin(&self.srv, obj).unwrap_or_else(|e| panic!("{e:#}: {obj}"))
    }

    /// One request as the admin: (status, body).
    pub fn request(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let ct = if method == "PATCH" {
            "application/merge-patch+json"
        } else {
            "application/json"
        };
        admin_request(&self.srv, method, path, ct, body)
    }

    pub fn get(&self, path: &str) -> Value {
        let (code, v) = self.request("GET", path, None);
        assert_eq!(code, 200, "GET {path}: {v}");
        v
    }
}

/// A seeded generator (splitmix64): the same seed, the same pod sets.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// 0..n
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// true with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}
