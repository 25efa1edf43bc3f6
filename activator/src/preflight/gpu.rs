//! GPU checks: run when the config binds GPUs (`"gpu"` not `off`) and the
//! host has an NVIDIA GPU device node (`/dev/nvidia<N>`), or must have one
//! (`"gpu": "on"`). Is the host's NVIDIA driver in a state a GPU node
//! machine can use?
//!
//! * `gpu-driver`: the kernel module is loaded (`/proc/driver/nvidia/version`);
//! * `gpu-nvidiactl`: `/dev/nvidiactl` is a character device;
//! * `gpu-nvidia-uvm`: `/dev/nvidia-uvm` is one (a warning: CUDA needs it,
//!   nothing inside the machine can create it later);
//! * `gpu-libraries`: `libnvidia-ml.so.1` and `libcuda.so.1` of the host's
//!   architecture are in `ldconfig -p` (the process boundary
//!   `gpu::run_ldconfig`, the same listing the render binds the library
//!   directories from), resolve to files under the root, and are of the
//!   loaded module's version (else NVML's "Driver/library version mismatch",
//!   the usual state after an upgrade without a reboot);
//! * `gpu-persistenced`: nvidia-persistenced runs (a warning: without it the
//!   driver tears the GPUs down whenever no process holds them, and every
//!   first use pays the initialisation).
//!
//! Everything but `ldconfig -p` is read under the root; nothing is loaded,
//! created or started.

use std::path::Path;

use super::{is_char_device, read, Finding, Status};
use crate::config::GpuMode;
use crate::gpu::{self, Arch, GpuError};
use crate::paths::Root;

/// `/proc/driver/nvidia/version`: present once the kernel module is loaded.
const DRIVER_VERSION: &str = "proc/driver/nvidia/version";
/// nvidia-persistenced's pid file (its default `--pid-file` dir is /var/run).
const PERSISTENCED_PID: &str = "run/nvidia-persistenced/nvidia-persistenced.pid";

pub fn checks(root: &Root, mode: GpuMode) -> Vec<Finding> {
    checks_with(root, mode, Arch::host(), || gpu::run_ldconfig(root))
}

/// [`checks`] with the architecture and the `ldconfig -p` listing handed in
/// (tests give a recorded or a fake one).
pub fn checks_with(
    root: &Root,
    mode: GpuMode,
    arch: Option<Arch>,
    ldconfig: impl FnOnce() -> Result<String, GpuError>,
) -> Vec<Finding> {
    let has_gpu = gpu::discover_devices(root).is_ok_and(|d| !d.is_empty());
    let wanted = match mode {
        GpuMode::Off => false,
        GpuMode::On => true,
        GpuMode::Auto => has_gpu,
    };
    if !wanted {
        return Vec::new();
    }
    let (driver, module_version) = driver(root);
    vec![
        driver,
        nvidiactl(root),
        nvidia_uvm(root),
        libraries(root, arch, ldconfig, module_version.as_deref()),
        persistenced(root),
    ]
}

/// `gpu-driver`, and the loaded module's version.
fn driver(root: &Root) -> (Finding, Option<String>) {
    let needed = "the NVIDIA kernel driver loaded";
    match read(&root.join(DRIVER_VERSION)) {
        Some(text) => {
            let line = text.lines().next().unwrap_or("").trim();
            (
                Finding::new("gpu-driver", Status::Pass, line, needed),
                module_version(line),
            )
        }
        None => (
            Finding::new(
                "gpu-driver",
                Status::Fail,
                "/proc/driver/nvidia/version missing",
                needed,
            )
            .hint(
                "install and load the host's NVIDIA driver (the node binds its devices and libraries)",
            ),
            None,
        ),
    }
}

/// The version in `NVRM version: NVIDIA UNIX x86_64 Kernel Module
/// 550.127.05  Tue Oct 8 ...` (or `... Open Kernel Module for x86_64
/// 570.86.10 ...`): the first word made of digits and dots.
fn module_version(line: &str) -> Option<String> {
    line.split_whitespace()
        .find(|w| {
            w.contains('.')
                && w.starts_with(|c: char| c.is_ascii_digit())
                && w.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        })
        .map(str::to_string)
}

fn nvidiactl(root: &Root) -> Finding {
    let needed = "/dev/nvidiactl, a character device";
    if is_char_device(&root.dev().join("nvidiactl")) {
        Finding::new("gpu-nvidiactl", Status::Pass, "character device", needed)
    } else {
        Finding::new("gpu-nvidiactl", Status::Fail, "missing", needed)
            .hint("the driver creates it when loaded (nvidia-modprobe or the persistence daemon)")
    }
}

fn nvidia_uvm(root: &Root) -> Finding {
    let needed = "/dev/nvidia-uvm, a character device (CUDA)";
    if is_char_device(&root.dev().join("nvidia-uvm")) {
        Finding::new("gpu-nvidia-uvm", Status::Pass, "character device", needed)
    } else {
        Finding::new("gpu-nvidia-uvm", Status::Warn, "missing", needed).hint(
            "CUDA in the node's pods fails without it, and nothing in the machine can create it: \
             load it on the host before the machine starts (modprobe nvidia-uvm; nvidia-modprobe -u -c 0)",
        )
    }
}

/// The sonames a GPU node cannot work without (NVML for the device plugin
/// and nvidia-smi, the CUDA driver API).
const REQUIRED_LIBRARIES: &[&str] = &["libnvidia-ml.so.1", "libcuda.so.1"];

fn libraries(
    root: &Root,
    arch: Option<Arch>,
    ldconfig: impl FnOnce() -> Result<String, GpuError>,
    module_version: Option<&str>,
) -> Finding {
    const NAME: &str = "gpu-libraries";
    let needed = match module_version {
        Some(v) => format!(
            "{} in ldconfig -p, of the kernel module's version {v}",
            REQUIRED_LIBRARIES.join(" and ")
        ),
        None => format!("{} in ldconfig -p", REQUIRED_LIBRARIES.join(" and ")),
    };
    let fail = |seen: String| Finding::new(NAME, Status::Fail, seen, needed.clone());
    let Some(arch) = arch else {
        return fail(format!(
            "an architecture ({}) without NVIDIA driver libraries kubeslot binds",
            std::env::consts::ARCH
        ));
    };
    let listing = match ldconfig() {
        Ok(l) => l,
        Err(e) => return fail(e.to_string()),
    };
    let libs = gpu::parse_ldconfig(&listing, arch);
    let mut found = Vec::new();
    for soname in REQUIRED_LIBRARIES {
        let listed = libs
            .native
            .iter()
            .find(|p| Path::new(p).file_name().is_some_and(|n| n == *soname));
        let Some(listed) = listed else {
            return fail(format!("no {soname} for this architecture")).hint(
                "install the driver's user-space libraries (the package matching the kernel module) and run ldconfig",
            );
        };
        let Some(file) = gpu::resolve_in_root(root, listed).filter(|f| root.join(f).is_file())
        else {
            return fail(format!("{listed} does not resolve to a file"))
                .hint("the linker cache is stale: run ldconfig");
        };
        found.push(format!("{soname} -> {file}"));
    }
    if let Some(v) = module_version {
        let suffix = format!(".so.{v}");
        let other: Vec<&String> = found.iter().filter(|f| !f.ends_with(&suffix)).collect();
        if !other.is_empty() {
            return fail(
                other
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            )
            .hint("driver/library version mismatch: the libraries were upgraded without the module; reboot (or reload the module)");
        }
    }
    Finding::new(NAME, Status::Pass, found.join(", "), needed)
}

fn persistenced(root: &Root) -> Finding {
    let needed = "nvidia-persistenced running";
    let pid = read(&root.join(PERSISTENCED_PID)).and_then(|s| s.trim().parse::<u32>().ok());
    // /proc/<pid>/comm holds the first 15 bytes of the name
    let comm = pid.and_then(|p| read(&root.join(&format!("proc/{p}/comm"))));
    match (pid, comm) {
        (Some(pid), Some(comm)) if comm.trim() == "nvidia-persiste" => Finding::new(
            "gpu-persistenced",
            Status::Pass,
            format!("running (pid {pid})"),
            needed,
        ),
        _ => Finding::new(
            "gpu-persistenced",
            Status::Warn,
            format!("no live process in /{PERSISTENCED_PID}"),
            needed,
        )
        .hint(
            "without it the GPUs are set up again at each first use (slow pod starts): \
             systemctl enable --now nvidia-persistenced",
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
    /// a running persistence daemon: every GPU check passes.
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

    fn run(root: &Root, listing: &str) -> Vec<Finding> {
        let listing = listing.to_string();
        checks_with(root, GpuMode::Auto, Some(Arch::Amd64), move || Ok(listing))
    }

    fn finding(findings: &[Finding], name: &str) -> Finding {
        findings
            .iter()
            .find(|f| f.name == name)
            .unwrap_or_else(|| panic!("no check {name}: {findings:?}"))
            .clone()
    }

    #[test]
    fn a_good_gpu_host_passes_every_gpu_check() {
        let (_d, root) = good_host();
        let out = run(&root, LISTING);
        let names: Vec<_> = out.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "gpu-driver",
                "gpu-nvidiactl",
                "gpu-nvidia-uvm",
                "gpu-libraries",
                "gpu-persistenced"
            ]
        );
        assert!(out.iter().all(|c| c.status == Status::Pass), "{out:#?}");
        let libs = finding(&out, "gpu-libraries");
        assert_eq!(
            libs.seen,
            "libnvidia-ml.so.1 -> /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.127.05, \
             libcuda.so.1 -> /usr/lib/x86_64-linux-gnu/libcuda.so.550.127.05"
        );
        assert!(libs.needed.contains("version 550.127.05"), "{libs:?}");
    }

    #[test]
    fn no_gpu_and_gpu_off_run_no_check() {
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        let never = || -> Result<String, GpuError> { panic!("ldconfig must not run") };
        assert!(checks_with(&root, GpuMode::Auto, Some(Arch::Amd64), never).is_empty());
        let (_d2, good) = good_host();
        assert!(checks_with(&good, GpuMode::Off, Some(Arch::Amd64), never).is_empty());
    }

    #[test]
    fn each_missing_part_is_named() {
        // uvm: a warning
        let (_d, root) = good_host();
        std::fs::remove_file(root.dev().join("nvidia-uvm")).unwrap();
        let f = finding(&run(&root, LISTING), "gpu-nvidia-uvm");
        assert_eq!((f.status, f.seen.as_str()), (Status::Warn, "missing"));
        assert!(f.hint.unwrap().contains("modprobe nvidia-uvm"));

        // libnvidia-ml unknown to ldconfig
        let (_d, root) = good_host();
        let only_cuda: String = LISTING.lines().filter(|l| l.contains("libcuda")).collect();
        let f = finding(&run(&root, &only_cuda), "gpu-libraries");
        assert_eq!(f.status, Status::Fail);
        assert_eq!(f.seen, "no libnvidia-ml.so.1 for this architecture");

        // a 32-bit one alone does not count
        let i386 = "\tlibnvidia-ml.so.1 (libc6) => /usr/lib/i386-linux-gnu/libnvidia-ml.so.1\n";
        let f = finding(&run(&root, &format!("{i386}{only_cuda}")), "gpu-libraries");
        assert_eq!(f.seen, "no libnvidia-ml.so.1 for this architecture");

        // listed but gone (a stale cache)
        let (_d, root) = good_host();
        std::fs::remove_file(root.join("usr/lib/x86_64-linux-gnu/libcuda.so.550.127.05")).unwrap();
        let f = finding(&run(&root, LISTING), "gpu-libraries");
        assert_eq!(f.status, Status::Fail);
        assert_eq!(
            f.seen,
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1 does not resolve to a file"
        );

        // ldconfig itself fails
        let (_d, root) = good_host();
        let out = checks_with(&root, GpuMode::Auto, Some(Arch::Amd64), || {
            Err(GpuError::Ldconfig {
                path: "/sbin/ldconfig".into(),
                reason: "exited with 1".into(),
            })
        });
        let f = finding(&out, "gpu-libraries");
        assert_eq!(f.status, Status::Fail);
        assert!(f.seen.contains("/sbin/ldconfig"), "{f:?}");

        // persistence daemon: a stale pid file is not a running daemon
        let (_d, root) = good_host();
        std::fs::remove_file(root.join("proc/4242/comm")).unwrap();
        let f = finding(&run(&root, LISTING), "gpu-persistenced");
        assert_eq!(f.status, Status::Warn);
        assert!(f.seen.contains("no live process"), "{f:?}");
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
        let f = finding(&run(&root, LISTING), "gpu-libraries");
        assert_eq!(f.status, Status::Fail);
        assert!(
            f.seen.contains("libcuda.so.570.86.10") && f.needed.contains("550.127.05"),
            "{f:?}"
        );
        assert!(f.hint.unwrap().contains("mismatch"));
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
