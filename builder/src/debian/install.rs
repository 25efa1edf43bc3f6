//! Building one platform's base rootfs from its lock: given the locked
//! `.deb`s already fetched and checked by the builder's `fetch::Fetcher`
//! (see [`super::pinned`]), make a flat local repository of exactly those
//! files (`apt-ftparchive`), install them with `mmdebstrap --variant=essential
//! --include=<every locked package>` from that `file://` repository only
//! (`SOURCE_DATE_EPOCH` from the recipe, in a network namespace without
//! network when run as root), then normalise the tar ([`super::normalize`]).
//! Given the suite, the platform's lock, the fetched files and the output
//! path; it writes the output only when everything succeeded. It does not
//! fetch, compress or assemble layers.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::error::{io_err, DebianError};
use super::lock::PlatformLock;
use super::normalize;

/// What a base build needs besides the platform's lock.
pub struct BuildBase<'a> {
    /// The recipe's suite (the local repository's Release names it, so
    /// mmdebstrap picks the suite's Essential set).
    pub suite: &'a str,
    /// The fetched file of every package of the platform, in lock order,
    /// each already checked against the lock's sha256.
    pub debs: &'a [PathBuf],
    /// The normalised rootfs tar to write.
    pub output: &'a Path,
    pub source_date_epoch: i64,
}

/// Builds the rootfs tar of `platform`; returns the sha256 (hex) of the
/// written tar.
pub fn build_rootfs(platform: &PlatformLock, opts: &BuildBase<'_>) -> Result<String, DebianError> {
    let debs = opts.debs;
    if debs.len() != platform.packages.len() {
        return Err(DebianError::LockInvalid {
            path: "(lock)".into(),
            reason: format!(
                "{} packages locked for {}, {} files given",
                platform.packages.len(),
                platform.arch,
                debs.len()
            ),
        });
    }

    let work = tempfile::tempdir().map_err(io_err(std::env::temp_dir()))?;
    let repo = work.path().join("repo");
    std::fs::create_dir_all(&repo).map_err(io_err(&repo))?;
    for (deb, cached) in platform.packages.iter().zip(debs) {
        let name = repo.join(format!("{}_{}.deb", deb.name, deb.architecture));
        if std::fs::hard_link(cached, &name).is_err() {
            std::fs::copy(cached, &name).map_err(io_err(&name))?;
        }
    }
    let packages = run_capture(
        Command::new("apt-ftparchive")
            .args(["packages", "."])
            .current_dir(&repo),
        "apt-ftparchive",
        "apt-utils",
    )?;
    std::fs::write(repo.join("Packages"), packages).map_err(io_err(repo.join("Packages")))?;
    // mmdebstrap picks the Essential set of the release named like the
    // suite, so the local Release carries the recipe's suite and codename.
    let suite = opts.suite;
    let release = run_capture(
        Command::new("apt-ftparchive")
            .arg(format!("-oAPT::FTPArchive::Release::Suite={suite}"))
            .arg(format!("-oAPT::FTPArchive::Release::Codename={suite}"))
            .args(["release", "."])
            .current_dir(&repo),
        "apt-ftparchive",
        "apt-utils",
    )?;
    std::fs::write(repo.join("Release"), release).map_err(io_err(repo.join("Release")))?;

    let raw = work.path().join("raw.tar");
    let names: Vec<&str> = platform.packages.iter().map(|p| p.name.as_str()).collect();
    let root = is_root();
    let mut cmd = if root {
        // Install with no network at all: the local repository is all there is.
        let mut c = Command::new("unshare");
        c.args(["--net", "--", "mmdebstrap"]);
        c
    } else {
        Command::new("mmdebstrap")
    };
    cmd.env("SOURCE_DATE_EPOCH", opts.source_date_epoch.to_string())
        .env("LC_ALL", "C.UTF-8")
        .args([
            "--quiet",
            "--variant=essential",
            &format!("--architectures={}", platform.arch),
            &format!("--include={}", names.join(",")),
            "--aptopt=APT::Install-Recommends \"false\"",
            "--aptopt=Acquire::Languages \"none\"",
            // No fsync per file: the tar is what persists (about 25% faster).
            "--dpkgopt=force-unsafe-io",
            "--format=tar",
            suite,
        ])
        .arg(&raw)
        // copy:// (not file://): apt copies the .debs into the chroot's
        // cache, where dpkg inside the chroot can read them.
        .arg(format!("deb [trusted=yes] copy://{} ./", repo.display()));
    run_capture(&mut cmd, "mmdebstrap", "mmdebstrap")?;
    normalize::normalize_tar(&raw, opts.output, opts.source_date_epoch)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn run_capture(
    cmd: &mut Command,
    tool: &'static str,
    package: &'static str,
) -> Result<Vec<u8>, DebianError> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => DebianError::ToolMissing { tool, package },
            _ => io_err(tool)(e),
        })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(30).collect();
        return Err(DebianError::Command {
            command: format!("{cmd:?}"),
            status: out.status.to_string(),
            stderr: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
        });
    }
    Ok(out.stdout)
}
