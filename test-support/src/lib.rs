//! Test harness shared by the kubeslot crates' black-box tests, so no test
//! binary keeps its own copy: a real Debian `docker-registry` ([`registry`]),
//! real Debian artifacts ([`debian`]), tar and gzip builders ([`tar`]), OCI
//! image writers and a cosign-format test signer ([`image`]), `skopeo` and
//! command helpers ([`tools`]), a relay in front of a registry that scripts
//! refusals such as 429 ([`relay`]), golden-file comparison with one
//! variable to refresh every golden file, `KUBESLOT_UPDATE_GOLDEN=1`
//! ([`golden`]), and a fake host tree for preflight checks ([`host`]).
//! A missing tool fails the test with the install command, never skips it.
//!
//! It deliberately mocks nothing: tests get real processes and real files.

pub mod debian;
pub mod golden;
pub mod host;
pub mod image;
pub mod keyless;
pub mod registry;
pub mod relay;
pub mod tar;
pub mod tools;

use std::net::TcpListener;
use std::path::PathBuf;

pub use debian::{debian_mirror, debian_rootfs};
pub use host::{fake_host, BOOT_SYSCTLS, FAKE_TOOLS_LOG};
pub use registry::Registry;

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
         (or `ci/setup.sh` as root, which installs every tool the tests need)"
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

/// Path of a workspace file, from a test's `CARGO_MANIFEST_DIR`.
pub fn workspace_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().expect("workspace root").to_path_buf()
}
