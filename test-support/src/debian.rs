//! Real Debian artifacts for tests: the machine's Debian mirror, read from
//! its apt sources at run time (no host name is written in the repository),
//! and cached bookworm rootfs tars built by `ci/lib/debian-rootfs.sh`.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::{require_tool, workspace_root};

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_debian_mirror() {
        assert!(debian_mirror().starts_with("http"));
    }
}
