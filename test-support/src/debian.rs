//! Real Debian artifacts for tests: the machine's Debian mirror, read from
//! its apt sources at run time or given by `KUBESLOT_DEBIAN_MIRROR` (no
//! host name is written in the repository),
//! and cached bookworm rootfs tars built by `ci/lib/debian-rootfs.sh`.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::{require_tool, workspace_root};

/// The machine's Debian mirror, as `ci/lib/debian-mirror.sh` prints it (the
/// one place that reads it): `KUBESLOT_DEBIAN_MIRROR` when set, else the
/// first `http(s)` URI of a `deb` source for the `debian` archive in the
/// machine's apt sources, read at run time so no host name is written in
/// the repository.
pub fn debian_mirror() -> String {
    let script = workspace_root().join("ci/lib/debian-mirror.sh");
    let out = Command::new(&script)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} found no Debian mirror (its message is above): the tests need a Debian archive",
        script.display()
    );
    String::from_utf8(out.stdout)
        .expect("the mirror is UTF-8")
        .trim()
        .to_string()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_debian_mirror() {
        assert!(debian_mirror().starts_with("http"));
    }
}
