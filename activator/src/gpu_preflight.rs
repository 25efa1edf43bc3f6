//! The GPU checks of `preflight`: is this host's NVIDIA driver in a state a
//! GPU node machine can use (the kernel module loaded, its control device,
//! the user-space libraries known to the loader and of the module's
//! version, the persistence daemon)?
//!
//! Given the root handle (everything is read under it: `/proc`, `/dev`,
//! `/run`) and the text of `ldconfig -p` (a closure, as in [`gpu::discover`],
//! so tests hand in a recorded or a real listing). It only reads; it never
//! loads modules, creates device nodes or starts daemons, and it does not
//! decide what a failed check means for a run (the preflight command does).
//! The checks run only where a GPU is to be bound: `gpu: "off"`, or `"auto"`
//! on a host without a `/dev/nvidia<N>`, is one passing line.

use std::path::Path;

use crate::config::GpuMode;
use crate::gpu::{self, Arch, GpuError};
use crate::paths::Root;

/// How a check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Pass,
    /// Works, but not as well as it should (named in the detail).
    Warn,
    /// A GPU machine would not work.
    Fail,
}

/// One check's outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// Stable name (`gpu-driver-loaded`), for reports and scripts.
    pub name: &'static str,
    pub status: Status,
    /// What was found, and for a warning or failure what to do.
    pub detail: String,
}

fn check(name: &'static str, status: Status, detail: impl Into<String>) -> Check {
    Check {
        name,
        status,
        detail: detail.into(),
    }
}

/// `/proc/driver/nvidia/version`: present once the kernel module is loaded.
const DRIVER_VERSION: &str = "proc/driver/nvidia/version";
/// nvidia-persistenced's pid file (its default `--pid-file` dir is /var/run).
const PERSISTENCED_PID: &str = "run/nvidia-persistenced/nvidia-persistenced.pid";

/// Runs the GPU checks for `mode`, in a fixed order.
pub fn checks(
    root: &Root,
    mode: GpuMode,
    arch: Option<Arch>,
    ldconfig: impl FnOnce() -> Result<String, GpuError>,
) -> Vec<Check> {
    if mode == GpuMode::Off {
        return vec![check(
            "gpu",
            Status::Pass,
            "gpu is \"off\" in the config: no GPU is bound, nothing to check",
        )];
    }
    let gpus = match gpu::discover_devices(root) {
        Ok(d) => d,
        Err(e) => return vec![check("gpu", Status::Fail, e.to_string())],
    };
    let gpu = gpus.iter().find(|d| {
        d.strip_prefix("/dev/nvidia")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    });
    let Some(gpu) = gpu else {
        return vec![if mode == GpuMode::On {
            check(
                "gpu",
                Status::Fail,
                "gpu is \"on\" in the config but there is no /dev/nvidia<N> character device: \
                 is the NVIDIA kernel module loaded (modprobe nvidia)?",
            )
        } else {
            check(
                "gpu",
                Status::Pass,
                "no NVIDIA GPU (/dev/nvidia<N>) on this host: nothing to check",
            )
        }];
    };
    let mut out = vec![check("gpu", Status::Pass, format!("{gpu} is present"))];
    let module = driver_loaded(root);
    let module_version = module.1.clone();
    out.push(module.0);
    out.push(control_device(root));
    out.push(uvm_device(root));
    out.push(libraries(root, arch, ldconfig, module_version.as_deref()));
    out.push(persistence_daemon(root));
    out
}

/// `gpu-driver-loaded`: the kernel module answers in
/// `/proc/driver/nvidia/version`; also returns its version.
fn driver_loaded(root: &Root) -> (Check, Option<String>) {
    let path = root.join(DRIVER_VERSION);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let line = text.lines().next().unwrap_or("").trim().to_string();
            let version = module_version(&line);
            (
                check(
                    "gpu-driver-loaded",
                    Status::Pass,
                    format!("/{DRIVER_VERSION}: {line}"),
                ),
                version,
            )
        }
        Err(e) => (
            check(
                "gpu-driver-loaded",
                Status::Fail,
                format!(
                    "/{DRIVER_VERSION}: {e}: the NVIDIA kernel module is not loaded \
                     (modprobe nvidia; after a driver upgrade, reboot)"
                ),
            ),
            None,
        ),
    }
}

/// The version in `NVRM version: NVIDIA UNIX x86_64 Kernel Module
/// 550.127.05  Tue Oct 8 ...`: the first word after "Kernel Module" (or,
/// for the open modules' "Open Kernel Module for x86_64", the first word
/// that looks like a version).
fn module_version(line: &str) -> Option<String> {
    line.split_whitespace()
        .find(|w| {
            w.contains('.')
                && w.bytes().all(|b| b.is_ascii_digit() || b == b'.')
                && w.starts_with(|c: char| c.is_ascii_digit())
        })
        .map(str::to_string)
}

fn is_char_device(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt as _;
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_char_device())
}

/// `gpu-control-device`: `/dev/nvidiactl`, without which no GPU opens.
fn control_device(root: &Root) -> Check {
    if is_char_device(&root.dev().join("nvidiactl")) {
        check(
            "gpu-control-device",
            Status::Pass,
            "/dev/nvidiactl is a character device",
        )
    } else {
        check(
            "gpu-control-device",
            Status::Fail,
            "/dev/nvidiactl is missing or not a character device: the driver did not create it \
             (nvidia-modprobe -c 0, or reload the module)",
        )
    }
}

/// `gpu-uvm-device`: `/dev/nvidia-uvm`, which CUDA needs. A warning: inside
/// the machine nothing can create it later, but graphics-only use works.
fn uvm_device(root: &Root) -> Check {
    if is_char_device(&root.dev().join("nvidia-uvm")) {
        check(
            "gpu-uvm-device",
            Status::Pass,
            "/dev/nvidia-uvm is a character device",
        )
    } else {
        check(
            "gpu-uvm-device",
            Status::Warn,
            "/dev/nvidia-uvm is missing: CUDA in the node's pods will fail; load it on the host \
             (modprobe nvidia-uvm; nvidia-modprobe -u -c 0) before the machine starts",
        )
    }
}

/// `gpu-libraries`: the loader knows `libnvidia-ml.so.1` and
/// `libcuda.so.1` of the host's architecture, they resolve to files, and
/// their version is the kernel module's (a mismatch is NVML's "Driver/library
/// version mismatch", the usual state after an upgrade without a reboot).
fn libraries(
    root: &Root,
    arch: Option<Arch>,
    ldconfig: impl FnOnce() -> Result<String, GpuError>,
    module_version: Option<&str>,
) -> Check {
    const NAME: &str = "gpu-libraries";
    let Some(arch) = arch else {
        return check(
            NAME,
            Status::Fail,
            format!(
                "this architecture ({}) has no NVIDIA driver libraries kubeslot binds",
                std::env::consts::ARCH
            ),
        );
    };
    let listing = match ldconfig() {
        Ok(l) => l,
        Err(e) => return check(NAME, Status::Fail, e.to_string()),
    };
    let libs = gpu::parse_ldconfig(&listing, arch);
    let mut found = Vec::new();
    for soname in ["libnvidia-ml.so.1", "libcuda.so.1"] {
        let listed = libs
            .native
            .iter()
            .find(|p| Path::new(p).file_name().is_some_and(|n| n == soname));
        let Some(listed) = listed else {
            return check(
                NAME,
                Status::Fail,
                format!(
                    "ldconfig -p lists no {soname} for this architecture: the driver's user-space \
                     libraries are not installed (or ldconfig was not run after installing them)"
                ),
            );
        };
        let Some(file) = gpu::resolve_in_root(root, listed).filter(|f| root.join(f).is_file())
        else {
            return check(
                NAME,
                Status::Fail,
                format!("{listed} (listed by ldconfig -p) does not resolve to a file"),
            );
        };
        found.push((soname, file));
    }
    let mut detail = found
        .iter()
        .map(|(soname, file)| format!("{soname} -> {file}"))
        .collect::<Vec<_>>()
        .join(", ");
    if let Some(module) = module_version {
        let suffix = format!(".so.{module}");
        let mismatched: Vec<&str> = found
            .iter()
            .filter(|(_, file)| !file.ends_with(&suffix))
            .map(|(_, file)| file.as_str())
            .collect();
        if !mismatched.is_empty() {
            return check(
                NAME,
                Status::Fail,
                format!(
                    "{} is not of the loaded kernel module's version {module} \
                     (driver/library version mismatch: reboot after a driver upgrade)",
                    mismatched.join(", ")
                ),
            );
        }
        detail.push_str(&format!(" (version {module}, as the kernel module)"));
    }
    check(NAME, Status::Pass, detail)
}

/// `gpu-persistence-daemon`: nvidia-persistenced runs (its pid file names a
/// live `nvidia-persiste` process). A warning: without it the driver tears
/// the GPUs down whenever no process holds them, so every pod's first CUDA
/// call pays the initialisation.
fn persistence_daemon(root: &Root) -> Check {
    const NAME: &str = "gpu-persistence-daemon";
    let pid_file = root.join(PERSISTENCED_PID);
    let pid = std::fs::read_to_string(&pid_file)
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok());
    let comm = pid.and_then(|p| std::fs::read_to_string(root.join(&format!("proc/{p}/comm"))).ok());
    match (pid, comm) {
        (Some(pid), Some(comm)) if comm.trim() == "nvidia-persiste" => check(
            NAME,
            Status::Pass,
            format!("nvidia-persistenced runs (pid {pid})"),
        ),
        _ => check(
            NAME,
            Status::Warn,
            format!(
                "nvidia-persistenced is not running (no live process in /{PERSISTENCED_PID}): \
                 GPUs are re-initialised for each first use; enable it \
                 (systemctl enable --now nvidia-persistenced)"
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LISTING: &str =
        "\tlibnvidia-ml.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1\n\
        \tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1\n";

    /// A host with a loaded 550.127.05 module, its devices, libraries and
    /// a running persistence daemon: every check passes.
    fn good_host() -> (tempfile::TempDir, Root) {
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        let w = |rel: &str, text: &str| {
            let p = root.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        w(
            DRIVER_VERSION,
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.127.05  Tue Oct  8 03:22:07 UTC 2024\n\
             GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n",
        );
        for (name, major, minor) in [
            ("nvidia0", 195, 0),
            ("nvidiactl", 195, 255),
            ("nvidia-uvm", 510, 0),
        ] {
            gpu::mknod_char(&root.dev().join(name), major, minor).unwrap();
        }
        let lib = "usr/lib/x86_64-linux-gnu";
        for stem in ["libnvidia-ml", "libcuda"] {
            w(&format!("{lib}/{stem}.so.550.127.05"), "");
            std::os::unix::fs::symlink(
                format!("{stem}.so.550.127.05"),
                root.join(&format!("{lib}/{stem}.so.1")),
            )
            .unwrap();
        }
        w(PERSISTENCED_PID, "4242\n");
        w("proc/4242/comm", "nvidia-persiste\n");
        (d, root)
    }

    fn run(root: &Root, mode: GpuMode, listing: &str) -> Vec<Check> {
        let listing = listing.to_string();
        checks(root, mode, Some(Arch::Amd64), move || Ok(listing))
    }

    fn status_of(checks: &[Check], name: &str) -> (Status, String) {
        let c = checks
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no check {name}: {checks:?}"));
        (c.status, c.detail.clone())
    }

    #[test]
    fn a_good_host_passes_every_check() {
        let (_d, root) = good_host();
        let out = run(&root, GpuMode::Auto, LISTING);
        let names: Vec<_> = out.iter().map(|c| c.name).collect();
        assert_eq!(
            names,
            [
                "gpu",
                "gpu-driver-loaded",
                "gpu-control-device",
                "gpu-uvm-device",
                "gpu-libraries",
                "gpu-persistence-daemon"
            ]
        );
        assert!(out.iter().all(|c| c.status == Status::Pass), "{out:#?}");
        let (_, libs) = status_of(&out, "gpu-libraries");
        assert!(
            libs.contains(
                "libnvidia-ml.so.1 -> /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.127.05"
            ) && libs.contains("version 550.127.05"),
            "{libs}"
        );
    }

    #[test]
    fn no_gpu_is_one_line_unless_the_config_demands_one() {
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        let never = || -> Result<String, GpuError> { panic!("ldconfig must not run") };
        let auto = checks(&root, GpuMode::Auto, Some(Arch::Amd64), never);
        assert_eq!(auto.len(), 1);
        assert_eq!(auto[0].status, Status::Pass);
        let on = checks(&root, GpuMode::On, Some(Arch::Amd64), never);
        assert_eq!((on.len(), on[0].status), (1, Status::Fail));
        assert!(on[0].detail.contains("/dev/nvidia<N>"), "{on:?}");
        let (_d2, good) = good_host();
        let off = checks(&good, GpuMode::Off, Some(Arch::Amd64), never);
        assert_eq!((off.len(), off[0].status), (1, Status::Pass));
    }

    #[test]
    fn each_missing_part_is_named() {
        // module not loaded
        let (_d, root) = good_host();
        std::fs::remove_file(root.join(DRIVER_VERSION)).unwrap();
        let (s, detail) = status_of(&run(&root, GpuMode::Auto, LISTING), "gpu-driver-loaded");
        assert_eq!(s, Status::Fail);
        assert!(detail.contains("not loaded"), "{detail}");

        // control device
        let (_d, root) = good_host();
        std::fs::remove_file(root.dev().join("nvidiactl")).unwrap();
        std::fs::write(root.dev().join("nvidiactl"), b"").unwrap();
        let (s, detail) = status_of(&run(&root, GpuMode::Auto, LISTING), "gpu-control-device");
        assert_eq!(s, Status::Fail);
        assert!(detail.contains("/dev/nvidiactl"), "{detail}");

        // uvm: a warning
        let (_d, root) = good_host();
        std::fs::remove_file(root.dev().join("nvidia-uvm")).unwrap();
        let (s, detail) = status_of(&run(&root, GpuMode::Auto, LISTING), "gpu-uvm-device");
        assert_eq!(s, Status::Warn);
        assert!(detail.contains("modprobe nvidia-uvm"), "{detail}");

        // libnvidia-ml unknown to ldconfig
        let (_d, root) = good_host();
        let only_cuda: String = LISTING.lines().filter(|l| l.contains("libcuda")).collect();
        let (s, detail) = status_of(&run(&root, GpuMode::Auto, &only_cuda), "gpu-libraries");
        assert_eq!(s, Status::Fail);
        assert!(detail.contains("no libnvidia-ml.so.1"), "{detail}");

        // listed but gone (a stale cache)
        let (_d, root) = good_host();
        std::fs::remove_file(root.join("usr/lib/x86_64-linux-gnu/libcuda.so.550.127.05")).unwrap();
        let (s, detail) = status_of(&run(&root, GpuMode::Auto, LISTING), "gpu-libraries");
        assert_eq!(s, Status::Fail);
        assert!(
            detail.contains("libcuda.so.1") && detail.contains("does not resolve"),
            "{detail}"
        );

        // ldconfig itself fails
        let (_d, root) = good_host();
        let out = checks(&root, GpuMode::Auto, Some(Arch::Amd64), || {
            Err(GpuError::Ldconfig {
                path: "/sbin/ldconfig".into(),
                reason: "exited with 1".into(),
            })
        });
        let (s, detail) = status_of(&out, "gpu-libraries");
        assert_eq!(s, Status::Fail);
        assert!(detail.contains("/sbin/ldconfig"), "{detail}");

        // persistence daemon: a stale pid file is not a running daemon
        let (_d, root) = good_host();
        std::fs::remove_file(root.join("proc/4242/comm")).unwrap();
        let (s, detail) = status_of(
            &run(&root, GpuMode::Auto, LISTING),
            "gpu-persistence-daemon",
        );
        assert_eq!(s, Status::Warn);
        assert!(
            detail.contains("nvidia-persistenced is not running"),
            "{detail}"
        );
    }

    #[test]
    fn libraries_of_another_version_than_the_module_fail() {
        // upgraded on disk, the old module still loaded
        let (_d, root) = good_host();
        let lib = root.join("usr/lib/x86_64-linux-gnu");
        for stem in ["libnvidia-ml", "libcuda"] {
            std::fs::rename(
                lib.join(format!("{stem}.so.550.127.05")),
                lib.join(format!("{stem}.so.570.86.10")),
            )
            .unwrap();
            std::fs::remove_file(lib.join(format!("{stem}.so.1"))).unwrap();
            std::os::unix::fs::symlink(
                format!("{stem}.so.570.86.10"),
                lib.join(format!("{stem}.so.1")),
            )
            .unwrap();
        }
        let (s, detail) = status_of(&run(&root, GpuMode::Auto, LISTING), "gpu-libraries");
        assert_eq!(s, Status::Fail);
        assert!(
            detail.contains("570.86.10")
                && detail.contains("550.127.05")
                && detail.contains("mismatch"),
            "{detail}"
        );
    }

    #[test]
    fn module_versions_are_read_from_both_module_flavours() {
        assert_eq!(
            module_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.127.05  Tue Oct  8 03:22:07 UTC 2024").as_deref(),
            Some("550.127.05")
        );
        assert_eq!(
            module_version("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.10  Release Build  (dvs-builder@U16-I3-B03-4-3)  Thu Jan 9 2025").as_deref(),
            Some("570.86.10")
        );
        assert_eq!(module_version("garbage"), None);
    }
}
