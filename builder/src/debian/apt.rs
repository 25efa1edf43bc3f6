//! A private apt root: its own config, sources, empty dpkg status, lists and
//! archive cache under a temp directory, selected with `APT_CONFIG` so that
//! not one setting of the build machine's `/etc/apt` leaks in. Given the
//! repositories and one architecture; it runs `apt-get` and returns its
//! output. It does not interpret packages (that is [`super::resolve`]).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use super::error::{io_err, DebianError};
use super::Repository;

pub(crate) struct AptRoot {
    root: PathBuf,
    conf: PathBuf,
    arch: String,
}

/// One `apt-get indextargets` line for a `Packages` index.
#[derive(Debug)]
pub(crate) struct PackagesTarget {
    /// Where apt stored the (uncompressed) index.
    pub filename: PathBuf,
    /// The repository URL with a trailing slash.
    pub repo_uri: String,
    /// The index's path relative to the release directory
    /// (`main/binary-amd64/Packages`).
    pub metakey: String,
}

/// One `apt-get --print-uris` line: `'URL' FILE SIZE SHA256:HEX`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct PrintedUri {
    pub url: String,
    pub size: u64,
    pub sha256: Option<String>,
}

impl AptRoot {
    /// Lays out `root` (an empty directory) for `arch` and `repos`.
    pub fn create(root: &Path, arch: &str, repos: &[Repository]) -> Result<AptRoot, DebianError> {
        for dir in [
            "etc/apt/apt.conf.d",
            "etc/apt/preferences.d",
            "etc/apt/sources.list.d",
            "etc/apt/trusted.gpg.d",
            "var/lib/apt/lists/partial",
            "var/cache/apt/archives/partial",
            "var/lib/dpkg",
            "var/log/apt",
        ] {
            std::fs::create_dir_all(root.join(dir)).map_err(io_err(root.join(dir)))?;
        }
        let status = root.join("var/lib/dpkg/status");
        std::fs::write(&status, b"").map_err(io_err(&status))?;
        let mut sources = String::new();
        for r in repos {
            if !r.keyring.is_file() {
                return Err(DebianError::Recipe {
                    path: r.keyring.clone(),
                    reason: format!(
                        "keyring of repository `{}` does not exist (it signs the InRelease that the lock pins)",
                        r.name
                    ),
                });
            }
            sources.push_str(&format!(
                "deb [signed-by={} arch={arch}] {} {} {}\n",
                r.keyring.display(),
                r.root(),
                r.suite,
                r.components.join(" ")
            ));
        }
        let list = root.join("etc/apt/sources.list");
        std::fs::write(&list, sources).map_err(io_err(&list))?;
        let r = root.display();
        // Everything apt would read from the machine is pointed into `root`;
        // `Dir::Etc::main` is /dev/null so /etc/apt/apt.conf is never read.
        let conf_text = format!(
            "Dir \"{r}/\";\n\
             Dir::Etc \"{r}/etc/apt/\";\n\
             Dir::Etc::main \"/dev/null\";\n\
             Dir::Etc::parts \"{r}/etc/apt/apt.conf.d/\";\n\
             Dir::Etc::sourcelist \"{r}/etc/apt/sources.list\";\n\
             Dir::Etc::sourceparts \"{r}/etc/apt/sources.list.d/\";\n\
             Dir::Etc::preferences \"{r}/etc/apt/preferences\";\n\
             Dir::Etc::preferencesparts \"{r}/etc/apt/preferences.d/\";\n\
             Dir::Etc::trusted \"{r}/etc/apt/trusted.gpg\";\n\
             Dir::Etc::trustedparts \"{r}/etc/apt/trusted.gpg.d/\";\n\
             Dir::State \"{r}/var/lib/apt/\";\n\
             Dir::State::status \"{r}/var/lib/dpkg/status\";\n\
             Dir::Cache \"{r}/var/cache/apt/\";\n\
             Dir::Log \"{r}/var/log/apt/\";\n\
             APT::Architecture \"{arch}\";\n\
             APT::Architectures {{ \"{arch}\"; }};\n\
             APT::Install-Recommends \"false\";\n\
             APT::Install-Suggests \"false\";\n\
             APT::Sandbox::User \"root\";\n\
             Acquire::Languages \"none\";\n\
             Acquire::GzipIndexes \"false\";\n\
             Acquire::IndexTargets::deb::Contents-deb::DefaultEnabled \"false\";\n\
             Acquire::Retries \"3\";\n\
             Debug::NoLocking \"true\";\n"
        );
        let conf = root.join("apt.conf");
        std::fs::write(&conf, conf_text).map_err(io_err(&conf))?;
        Ok(AptRoot {
            root: root.to_path_buf(),
            conf,
            arch: arch.to_string(),
        })
    }

    pub fn archives(&self) -> PathBuf {
        self.root.join("var/cache/apt/archives")
    }

    fn run(&self, args: &[&str]) -> Result<Output, DebianError> {
        let mut cmd = Command::new("apt-get");
        cmd.args(args)
            .env("APT_CONFIG", &self.conf)
            .env("LC_ALL", "C")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null());
        let out = cmd.output().map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => DebianError::ToolMissing {
                tool: "apt-get",
                package: "apt",
            },
            _ => io_err("apt-get")(e),
        })?;
        Ok(out)
    }

    fn run_ok(&self, args: &[&str]) -> Result<Output, DebianError> {
        let out = self.run(args)?;
        if !out.status.success() {
            return Err(command_failed(&format!("apt-get {}", args.join(" ")), &out));
        }
        Ok(out)
    }

    /// `apt-get update`; apt checks each InRelease against the repository's
    /// `signed-by` keyring and each index against its InRelease.
    pub fn update(&self) -> Result<(), DebianError> {
        let out = self.run_ok(&["update", "-q"])?;
        // apt-get update exits 0 on some fetch failures and reports them as
        // `W:`/`E:` lines; a lock from a partial update would be wrong.
        let stderr = String::from_utf8_lossy(&out.stderr);
        if stderr.lines().any(|l| {
            l.starts_with("E:")
                || l.starts_with("W: Failed to fetch")
                || l.starts_with("W: GPG error")
        }) {
            return Err(DebianError::Command {
                command: format!("apt-get update (arch {})", self.arch),
                status: "reported errors".into(),
                stderr: stderr.trim().to_string(),
            });
        }
        Ok(())
    }

    /// The `Packages` indexes apt knows after `update`.
    pub fn packages_targets(&self) -> Result<Vec<PackagesTarget>, DebianError> {
        let out = self.run_ok(&[
            "indextargets",
            "--format",
            "$(IDENTIFIER)\t$(FILENAME)\t$(REPO_URI)\t$(METAKEY)",
        ])?;
        let mut targets = Vec::new();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let f: Vec<&str> = line.split('\t').collect();
            if f.len() == 4 && f[0] == "Packages" {
                targets.push(PackagesTarget {
                    filename: PathBuf::from(f[1]),
                    repo_uri: f[2].to_string(),
                    metakey: f[3].to_string(),
                });
            }
        }
        Ok(targets)
    }

    /// `apt-get install --print-uris` of `names` into the empty status: every
    /// `.deb` a fresh root with these packages needs.
    pub fn print_uris(&self, names: &[String]) -> Result<Vec<PrintedUri>, DebianError> {
        let mut args = vec!["install", "--print-uris", "-y", "-q"];
        args.extend(names.iter().map(String::as_str));
        let out = self.run(&args)?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr).to_string();
            for line in stderr.lines() {
                let unknown = line
                    .strip_prefix("E: Unable to locate package ")
                    .or_else(|| {
                        line.strip_prefix("E: Package '")
                            .and_then(|r| r.split('\'').next())
                    });
                if let Some(name) = unknown {
                    return Err(DebianError::UnknownPackage {
                        name: name.trim().to_string(),
                        arch: self.arch.clone(),
                        apt: stderr.trim().to_string(),
                    });
                }
            }
            return Err(command_failed("apt-get install --print-uris", &out));
        }
        parse_print_uris(&String::from_utf8_lossy(&out.stdout)).map_err(|reason| {
            DebianError::Command {
                command: "apt-get install --print-uris".into(),
                status: "unparsable output".into(),
                stderr: reason,
            }
        })
    }

    /// `apt-get install --download-only`: apt itself fetches the `.deb`s
    /// into [`AptRoot::archives`] (checking them against the index).
    pub fn download(&self, names: &[String]) -> Result<(), DebianError> {
        let mut args = vec!["install", "--download-only", "-y", "-q"];
        args.extend(names.iter().map(String::as_str));
        self.run_ok(&args).map(drop)
    }
}

fn command_failed(command: &str, out: &Output) -> DebianError {
    DebianError::Command {
        command: command.to_string(),
        status: out.status.to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
    }
}

pub(crate) fn parse_print_uris(stdout: &str) -> Result<Vec<PrintedUri>, String> {
    let mut out = Vec::new();
    for line in stdout.lines().filter(|l| l.starts_with('\'')) {
        let mut parts = line.split_whitespace();
        let (Some(url), Some(_file), Some(size), Some(hash)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(format!("line `{line}` is not 'URL' FILE SIZE SHA256:HEX"));
        };
        // apt prints its preferred hash (often MD5Sum); only a SHA256 one
        // is cross-checked, the lock takes sha256 from the signed index.
        let sha256 = hash.strip_prefix("SHA256:").map(str::to_ascii_lowercase);
        out.push(PrintedUri {
            url: url.trim_matches('\'').to_string(),
            size: size
                .parse()
                .map_err(|e| format!("line `{line}`: size: {e}"))?,
            sha256,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_print_uris() {
        let out = "Reading package lists...\n'http://m/debian/pool/main/a/acl/libacl1_2.3.1-3_amd64.deb' libacl1_2.3.1-3_amd64.deb 30884 SHA256:ABCD\n";
        let uris = parse_print_uris(out).unwrap();
        assert_eq!(
            uris,
            vec![PrintedUri {
                url: "http://m/debian/pool/main/a/acl/libacl1_2.3.1-3_amd64.deb".into(),
                size: 30884,
                sha256: Some("abcd".into())
            }]
        );
        assert_eq!(
            parse_print_uris("'u' f 1 MD5Sum:x\n").unwrap()[0].sha256,
            None
        );
        assert!(parse_print_uris("'u' f\n").is_err());
    }
}
