//! The host settings a node machine needs but cannot make itself: kernel
//! parameters (`/proc/sys` is read-only inside the machine, and a real
//! kubelet refuses to start when the ones it protects differ) and kernel
//! modules (the machine binds `/lib/modules` read-only and loads nothing).
//!
//! Owns the one table of those settings ([`SYSCTLS`], [`MODULES`]): the
//! rendered `/etc/sysctl.d/99-kubeslot.conf` and
//! `/etc/modules-load.d/kubeslot.conf` come from it, and `preflight` checks
//! the running kernel against it. Given the root handle: [`render`] is pure
//! (golden-tested), [`write`] puts the two files in place atomically when
//! they differ, [`apply`] runs systemd's own appliers on those two files
//! alone, `systemd-modules-load` then `systemd-sysctl` (modules first,
//! since the `net.bridge.*` keys exist only once `br_netfilter` is
//! loaded), [`diff`] shows what `write` would change (`plan`); `uninstall`
//! removes the files [`render`] names.
//!
//! Why not restart `systemd-sysctl.service`: that re-applies every
//! `sysctl.d` file of the host under the running node (Ubuntu's
//! `rp_filter = 2`, an operator's file meant for the next boot), and
//! `systemd-modules-load.service` loads every `modules-load.d` entry.
//! Given a file, both tools apply that file and nothing else.
//!
//! It does not judge whether the settings took effect (that is
//! `preflight`, which reads the kernel's values), and it never writes
//! `/proc/sys` itself.

use std::path::PathBuf;

use kubeslot_image::atomic::{self, AtomicError};

use crate::paths::Root;
use crate::render::{unified, FileDiff};

/// One kernel parameter the node needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sysctl {
    pub key: &'static str,
    pub value: &'static str,
    /// Who needs it and why (the comment in the rendered file).
    pub why: &'static str,
}

/// The kernel parameters of the node, in the rendered file's order.
pub const SYSCTLS: &[Sysctl] = &[
    Sysctl {
        key: "vm.overcommit_memory",
        value: "1",
        why: "kubelet (protectKernelDefaults)",
    },
    Sysctl {
        key: "vm.panic_on_oom",
        value: "0",
        why: "kubelet (protectKernelDefaults)",
    },
    Sysctl {
        key: "kernel.panic",
        value: "10",
        why: "kubelet (protectKernelDefaults)",
    },
    Sysctl {
        key: "kernel.panic_on_oops",
        value: "1",
        why: "kubelet (protectKernelDefaults)",
    },
    Sysctl {
        key: "kernel.keys.root_maxkeys",
        value: "1000000",
        why: "kubelet (protectKernelDefaults)",
    },
    Sysctl {
        key: "kernel.keys.root_maxbytes",
        value: "25000000",
        why: "kubelet (protectKernelDefaults)",
    },
    Sysctl {
        key: "net.ipv4.ip_forward",
        value: "1",
        why: "pod traffic is routed by the host's kernel",
    },
    Sysctl {
        key: "net.bridge.bridge-nf-call-iptables",
        value: "1",
        why: "bridged pod traffic passes kube-proxy's iptables rules (needs br_netfilter)",
    },
    Sysctl {
        key: "net.bridge.bridge-nf-call-ip6tables",
        value: "1",
        why: "the same for IPv6 (needs br_netfilter)",
    },
    Sysctl {
        key: "net.ipv4.conf.all.src_valid_mark",
        value: "1",
        why: "WireGuard pod networks route by firewall mark (reverse-path checks honour it)",
    },
    Sysctl {
        key: "net.ipv4.conf.default.src_valid_mark",
        value: "1",
        why: "the same for links created later (the pod network's)",
    },
    Sysctl {
        key: "net.ipv4.conf.all.rp_filter",
        value: "0",
        why: "pod networks answer from other links than they were reached on (Ubuntu's default 2 drops it)",
    },
    Sysctl {
        key: "net.ipv4.conf.default.rp_filter",
        value: "0",
        why: "the same for links created later (the pod network's)",
    },
];

/// The kernel modules of the node and why.
pub const MODULES: &[(&str, &str)] = &[
    ("overlay", "containerd's overlayfs snapshotter"),
    (
        "br_netfilter",
        "bridged pod traffic through iptables; the net.bridge.* sysctls",
    ),
];

/// The tools that apply the two files, in order (as host paths).
pub const APPLIERS: [&str; 2] = [
    "/lib/systemd/systemd-modules-load",
    "/lib/systemd/systemd-sysctl",
];

/// One rendered settings file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SettingsFile {
    pub path: PathBuf,
    pub contents: String,
}

#[derive(Debug, thiserror::Error)]
pub enum HostSettingsError {
    #[error("host settings: {0}")]
    Write(#[from] AtomicError),
    #[error("host settings: {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

const HEADER: &str = "# Written by kubeslot-activator: what the node machine needs from the host\n\
# kernel (it cannot change these itself). Removed by `kubeslot-activator uninstall`.\n";

/// The two files, relative to an empty root (pure).
pub fn render() -> Vec<SettingsFile> {
    let rel = Root::new("");
    let mut modules = String::from(HEADER);
    for (name, why) in MODULES {
        modules += &format!("# {why}\n{name}\n");
    }
    let mut sysctl = String::from(HEADER);
    for s in SYSCTLS {
        sysctl += &format!("# {}\n{} = {}\n", s.why, s.key, s.value);
    }
    vec![
        SettingsFile {
            path: rel.modules_load_dropin(),
            contents: modules,
        },
        SettingsFile {
            path: rel.sysctl_dropin(),
            contents: sysctl,
        },
    ]
}

/// Writes the files that differ from the rendered ones (each atomically,
/// 0644); returns the paths written, relative to the root.
pub fn write(root: &Root) -> Result<Vec<PathBuf>, HostSettingsError> {
    let mut written = Vec::new();
    for f in render() {
        let path = root.dir().join(&f.path);
        if std::fs::read(&path).is_ok_and(|b| b == f.contents.as_bytes()) {
            continue;
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| HostSettingsError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        atomic::write_file(&path, f.contents.as_bytes())?;
        written.push(f.path);
    }
    Ok(written)
}

/// Whether the kernel already holds every value of [`SYSCTLS`] (read
/// through the root's `/proc/sys`).
pub fn sysctls_hold(root: &Root) -> bool {
    SYSCTLS
        .iter()
        .all(|s| std::fs::read_to_string(root.proc_sys(s.key)).is_ok_and(|v| v.trim() == s.value))
}

/// Applies the two files, and only them: `systemd-modules-load FILE`, then
/// `systemd-sysctl FILE` (the root's programs, given the root's files).
/// Returns what went wrong, as text, for the report: a tool that fails
/// here (a kernel without loadable modules, a read-only `/proc/sys` in a
/// container host) is not the verdict; `preflight` then reads whether the
/// kernel has what the node needs.
pub fn apply(root: &Root) -> Vec<String> {
    [
        (root.systemd_modules_load(), root.modules_load_dropin()),
        (root.systemd_sysctl(), root.sysctl_dropin()),
    ]
    .iter()
    .filter_map(|(tool, file)| {
        let shown = format!("{} {}", tool.display(), file.display());
        match std::process::Command::new(tool)
            .arg(file)
            .stdin(std::process::Stdio::null())
            .output()
        {
            Err(e) => Some(format!("{shown}: cannot run: {e}")),
            Ok(out) if out.status.success() => None,
            Ok(out) => Some(format!(
                "{shown}: {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )),
        }
    })
    .collect()
}

/// What [`write`] would change (empty diffs left out).
pub fn diff(root: &Root) -> Vec<FileDiff> {
    render()
        .into_iter()
        .filter_map(|f| {
            let shown = f.path.display().to_string();
            let d = match std::fs::read_to_string(root.dir().join(&f.path)) {
                Ok(old) => unified(
                    &old,
                    &f.contents,
                    &format!("a/{shown}"),
                    &format!("b/{shown}"),
                ),
                Err(_) => unified("", &f.contents, "/dev/null", &format!("b/{shown}")),
            };
            (!d.is_empty()).then_some(FileDiff {
                path: f.path,
                diff: d,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sysctl_and_module_is_rendered_once() {
        let files = render();
        let sysctl = &files[1].contents;
        for s in SYSCTLS {
            assert_eq!(
                sysctl
                    .matches(&format!("\n{} = {}\n", s.key, s.value))
                    .count(),
                1,
                "{}",
                s.key
            );
        }
        for (m, _) in MODULES {
            assert!(files[0].contents.contains(&format!("\n{m}\n")), "{m}");
        }
    }

    /// The rendered files, as the golden files under
    /// `testdata/host-settings/` say (`KUBESLOT_UPDATE_GOLDEN=1` rewrites
    /// them).
    #[test]
    fn rendered_files_match_the_golden_files() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/host-settings");
        for f in render() {
            let golden = dir.join(&f.path);
            if std::env::var_os("KUBESLOT_UPDATE_GOLDEN").is_some() {
                std::fs::create_dir_all(golden.parent().unwrap()).unwrap();
                std::fs::write(&golden, &f.contents).unwrap();
            }
            let want = std::fs::read_to_string(&golden).unwrap_or_else(|e| {
                panic!(
                    "{}: {e} (KUBESLOT_UPDATE_GOLDEN=1 writes it)",
                    golden.display()
                )
            });
            assert_eq!(f.contents, want, "{}", golden.display());
        }
    }

    #[test]
    fn write_is_idempotent_and_writes_the_files_render_names() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        assert_eq!(diff(&root).len(), 2);
        assert_eq!(write(&root).unwrap().len(), 2);
        assert!(write(&root).unwrap().is_empty());
        assert!(diff(&root).is_empty());
        std::fs::write(root.sysctl_dropin(), "edited\n").unwrap();
        assert_eq!(diff(&root).len(), 1);
        assert_eq!(write(&root).unwrap(), [Root::new("").sysctl_dropin()]);
        // what uninstall removes: the files render names, and no other
        let named: Vec<_> = render().into_iter().map(|f| f.path).collect();
        assert_eq!(
            named,
            [
                Root::new("").modules_load_dropin(),
                Root::new("").sysctl_dropin()
            ]
        );
    }
}
