//! GPU checks: run when the config binds GPUs (`"gpu"` not `off`) and the
//! host has an NVIDIA GPU device node (`/dev/nvidia<N>`) or an NVIDIA GPU
//! on the PCI bus without its driver, or must have one (`"gpu": "on"`).
//! Is the host's NVIDIA driver in a state a GPU node machine can use?
//!
//! * `gpu-pci`: every NVIDIA display controller under `/sys/bus/pci/devices`
//!   is driven by `nvidia` (one with no driver, or `nouveau`, fails naming
//!   its PCI address, `"gpu": "auto"` included: the node would come up
//!   without the GPU the host has; one given to `vfio-pci` for virtual
//!   machines does not count);
//! * `gpu-driver`: the kernel module is loaded (`/proc/driver/nvidia/version`);
//! * `gpu-nvidiactl`: `/dev/nvidiactl` is a character device;
//! * `gpu-nvidia-uvm`: `/dev/nvidia-uvm` is one (a warning: CUDA needs it,
//!   nothing inside the machine can create it later);
//! * `gpu-libraries`: `libnvidia-ml.so.1` and `libcuda.so.1` of the host's
//!   architecture are where the render finds the driver (`ldconfig -p`
//!   through `gpu::run_ldconfig`, or the driver tree: `gpu.driver_root`, the
//!   GPU operator's `/run/nvidia/driver`), resolve to files under the root,
//!   and are of the loaded module's version (else NVML's "Driver/library
//!   version mismatch", the usual state after an upgrade without a reboot);
//! * `gpu-tools`: the driver's `nvidia-smi` (and its other tools) is an
//!   executable the render binds (a warning, naming each file named like a
//!   tool that is left out and why, e.g. a wrapper script whose target is
//!   not found);
//! * `gpu-persistenced`: nvidia-persistenced runs (a warning: without it the
//!   driver tears the GPUs down whenever no process holds them, and every
//!   first use pays the initialisation).
//!
//! Devices, the PCI bus, the driver's libraries and tools are as the run's
//! one [`Discovery`] found them (the render binds from the same value);
//! the module version, `/dev/nvidiactl`, `/dev/nvidia-uvm` and the
//! persistence daemon are read here, under the root. Nothing is loaded,
//! created or started.

use std::path::Path;

use super::{is_char_device, read, Finding, ImageChoice, Status};
use crate::config::GpuMode;
use crate::paths::{host, Root};
use crate::render::gpu::pci::PciGpu;
use crate::render::gpu::{Discovery, DriverSource, DriverTools, ToolBind};

/// `/proc/driver/nvidia/version`: present once the kernel module is loaded.
const DRIVER_VERSION: &str = "proc/driver/nvidia/version";
/// nvidia-persistenced's pid file (its default `--pid-file` dir is /var/run).
const PERSISTENCED_PID: &str = "run/nvidia-persistenced/nvidia-persistenced.pid";

/// The GPU checks of the host as `gpus` found it (the run's one
/// [`Discovery`], which the render binds from too).
pub fn checks(root: &Root, gpus: &Discovery) -> Vec<Finding> {
    let mode = gpus.setting.mode;
    if mode == GpuMode::Off {
        return Vec::new();
    }
    let without_driver = gpus.pci.iter().any(|g| g.problem().is_some());
    if !(mode == GpuMode::On || gpus.has_gpu() || without_driver) {
        return Vec::new();
    }
    let mut out = Vec::new();
    if !gpus.pci.is_empty() {
        out.push(pci_devices(&gpus.pci));
    }
    let (driver, module_version) = driver(root);
    out.push(driver);
    out.push(nvidiactl(root));
    out.push(nvidia_uvm(root));
    out.push(libraries(root, gpus, module_version.as_deref()));
    if let Some(found) = &gpus.tools {
        out.push(driver_tools(&gpus.source, found));
    }
    out.push(persistenced(root));
    out
}

/// `gpu-image`, on a host with an NVIDIA GPU of its own (on the PCI bus,
/// not given to virtual machines, or a `/dev/nvidia<N>`) whose config binds
/// GPUs: a warning when the config names no `gpu_image`, so the plain
/// `image` runs (no NVIDIA container toolkit: pods cannot use the GPU the
/// node is given). Nothing without a config or a GPU.
pub fn image(root: &Root, gpus: &Discovery, image: Option<&ImageChoice>) -> Option<Finding> {
    let image = image?;
    if gpus.setting.mode == GpuMode::Off {
        return None;
    }
    let gpu = match crate::render::gpu::pci::host_gpu(root) {
        Some(g) => format!("NVIDIA GPU {}", g.address),
        None if gpus.has_gpu() => "an NVIDIA GPU device node".to_string(),
        None => return None,
    };
    let needed = "the NVIDIA variant on a GPU host (gpu_image)";
    if image.gpu_image {
        let seen = format!("{gpu}: gpu_image {}", image.image);
        return Some(Finding::new("gpu-image", Status::Pass, seen, needed));
    }
    let seen = format!("{gpu}, no gpu_image: the plain image {} runs", image.image);
    Some(Finding::new("gpu-image", Status::Warn, seen, needed).hint(
        "set gpu_image to the NVIDIA variant (the ubuntu2404-nvidia recipe's image); \
             where image is that variant already, name it as gpu_image too",
    ))
}

/// `gpu-pci`.
fn pci_devices(gpus: &[PciGpu]) -> Finding {
    let needed = "every NVIDIA GPU on the PCI bus driven by the nvidia kernel driver";
    let problems: Vec<String> = gpus.iter().filter_map(PciGpu::problem).collect();
    if problems.is_empty() {
        let seen = gpus
            .iter()
            .map(|g| format!("{} ({})", g.address, g.driver.as_deref().unwrap_or("none")))
            .collect::<Vec<_>>()
            .join(", ");
        return Finding::new("gpu-pci", Status::Pass, seen, needed);
    }
    Finding::new("gpu-pci", Status::Fail, problems.join(", "), needed).hint(
        "install the NVIDIA driver for this kernel and load it (modprobe nvidia; blacklist nouveau), \
         or set \"gpu\": \"off\" to run the node without the GPU",
    )
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

/// `gpu-libraries`: the driver's libraries as the discovery listed them.
fn libraries(root: &Root, gpus: &Discovery, module_version: Option<&str>) -> Finding {
    const NAME: &str = "gpu-libraries";
    let source = &gpus.source;
    let wanted = REQUIRED_LIBRARIES.join(" and ");
    let needed = match module_version {
        Some(v) => format!(
            "{wanted} in {}, of the kernel module's version {v}",
            source.describe()
        ),
        None => format!("{wanted} in {}", source.describe()),
    };
    let fail = |seen: String| Finding::new(NAME, Status::Fail, seen, needed.clone());
    let libs = match &gpus.libraries {
        Some(Ok(l)) => l,
        Some(Err(e)) => return fail(e.to_string()),
        None => {
            return fail(format!(
                "an architecture ({}) without NVIDIA driver libraries kubeslot binds",
                std::env::consts::ARCH
            ))
        }
    };
    let mut found = Vec::new();
    for soname in REQUIRED_LIBRARIES {
        let listed = libs
            .native
            .iter()
            .find(|p| Path::new(p).file_name().is_some_and(|n| n == *soname));
        let Some(listed) = listed else {
            let hint = match source {
                DriverSource::LoaderCache => "install the driver's user-space libraries (the package matching the kernel module) and run ldconfig",
                DriverSource::Tree { .. } => "the driver tree is incomplete, or not mounted yet (the GPU operator's driver container mounts it when it runs)",
            };
            return fail(format!("no {soname} for this architecture")).hint(hint);
        };
        let Some(file) = source.resolve_file(root, listed) else {
            return fail(format!("{listed} does not resolve to a file"))
                .hint("the linker cache is stale: run ldconfig");
        };
        found.push(format!("{soname} -> {file}"));
    }
    if let Some(v) = module_version {
        let suffix = format!(".so.{v}");
        let other: Vec<&String> = found.iter().filter(|f| !f.ends_with(&suffix)).collect();
        if !other.is_empty() {
            let f = fail(
                other
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            )
            .hint("driver/library version mismatch: the libraries were upgraded without the module; reboot (or reload the module)");
            return f;
        }
    }
    Finding::new(NAME, Status::Pass, found.join(", "), needed)
}

/// `gpu-tools`: what the render binds at `/run/host-nvidia-bin`.
fn driver_tools(source: &DriverSource, found: &DriverTools) -> Finding {
    const NAME: &str = "gpu-tools";
    let needed = format!(
        "nvidia-smi (and the driver's other tools) as executables beside the driver's libraries or in {}",
        source.outer(host::DISTRO_BIN)
    );
    let mut seen = match &found.bind {
        ToolBind::None => "no driver tool".to_string(),
        ToolBind::Dir(d) => format!(
            "{} from {d} (bound whole)",
            found
                .tools
                .iter()
                .map(|t| t.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        ToolBind::Files(tools) => format!(
            "{} (bound one by one)",
            tools
                .iter()
                .map(|t| format!("{} ({})", t.name, t.file))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    for s in &found.skipped {
        seen += &format!("; not bound: {} {}", s.path, s.reason);
    }
    let has_smi = found.tools.iter().any(|t| t.name == "nvidia-smi");
    if has_smi && found.skipped.is_empty() {
        return Finding::new(NAME, Status::Pass, seen, needed);
    }
    Finding::new(NAME, Status::Warn, seen, needed).hint(
        "the node and its containers get no nvidia-smi, or not every driver tool: \
         install the driver's tools beside its libraries, or point a wrapper at them",
    )
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
    use crate::config::Gpu;
    use crate::render::gpu::{self, pci, Arch, GpuError};

    /// The checks of the host as one discovery with this architecture and
    /// `ldconfig -p` listing finds it.
    fn checks_with(
        root: &Root,
        setting: &Gpu,
        arch: Option<Arch>,
        ldconfig: impl FnOnce() -> Result<String, GpuError>,
    ) -> Vec<Finding> {
        checks(root, &Discovery::read_with(root, setting, arch, ldconfig))
    }

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
        tool(&root, "usr/bin/nvidia-smi");
        pci::fake_pci_device(&root, "0000:41:00.0", 0x10de, 0x030200, Some("nvidia"));
        (d, root)
    }

    /// An executable ELF file (its header: what discovery reads).
    fn tool(root: &Root, rel: &str) {
        let p = root.join(rel);
        gpu::write_elf(&p, true, 62);
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }

    fn mode(mode: GpuMode) -> Gpu {
        Gpu {
            mode,
            driver_root: None,
        }
    }

    fn run(root: &Root, listing: &str) -> Vec<Finding> {
        let listing = listing.to_string();
        checks_with(root, &Gpu::default(), Some(Arch::Amd64), move || {
            Ok(listing)
        })
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
                "gpu-pci",
                "gpu-driver",
                "gpu-nvidiactl",
                "gpu-nvidia-uvm",
                "gpu-libraries",
                "gpu-tools",
                "gpu-persistenced"
            ]
        );
        assert!(out.iter().all(|c| c.status == Status::Pass), "{out:#?}");
        assert_eq!(finding(&out, "gpu-pci").seen, "0000:41:00.0 (nvidia)");
        assert_eq!(
            finding(&out, "gpu-tools").seen,
            "nvidia-smi (/usr/bin/nvidia-smi) (bound one by one)"
        );
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
        assert!(checks_with(&root, &Gpu::default(), Some(Arch::Amd64), never).is_empty());
        let (_d2, good) = good_host();
        assert!(checks_with(&good, &mode(GpuMode::Off), Some(Arch::Amd64), never).is_empty());
        // a GPU given to virtual machines is not this host's
        pci::fake_pci_device(&root, "0000:01:00.0", 0x10de, 0x030200, Some("vfio-pci"));
        assert!(checks_with(&root, &Gpu::default(), Some(Arch::Amd64), never).is_empty());
    }

    #[test]
    fn a_gpu_without_its_driver_fails_auto_and_on_naming_its_pci_address() {
        // a fresh host: the card is on the bus, no driver, no /dev/nvidia*
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        pci::fake_pci_device(&root, "0000:17:00.0", 0x10de, 0x030200, None);
        // its audio function and another vendor's card do not count
        pci::fake_pci_device(&root, "0000:17:00.1", 0x10de, 0x040300, None);
        pci::fake_pci_device(&root, "0000:03:00.0", 0x1a03, 0x030000, Some("ast"));
        for m in [GpuMode::Auto, GpuMode::On] {
            let out = checks_with(&root, &mode(m), Some(Arch::Amd64), || Ok(String::new()));
            let f = finding(&out, "gpu-pci");
            assert_eq!(
                (f.status, f.seen.as_str()),
                (Status::Fail, "0000:17:00.0 has no driver loaded"),
                "{m:?}"
            );
            assert!(f.hint.unwrap().contains("modprobe nvidia"));
            assert_eq!(finding(&out, "gpu-driver").status, Status::Fail);
        }
        // nouveau drives it: no nvidia device node will ever appear
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        pci::fake_pci_device(&root, "0000:65:00.0", 0x10de, 0x030000, Some("nouveau"));
        let out = checks_with(&root, &Gpu::default(), Some(Arch::Amd64), || {
            Ok(String::new())
        });
        let f = finding(&out, "gpu-pci");
        assert_eq!(f.status, Status::Fail);
        assert_eq!(f.seen, "0000:65:00.0 is driven by nouveau, not nvidia");
    }

    /// The GPU operator's layout: the driver container's tree mounted at
    /// /run/nvidia/driver, nothing of the driver in the host's own dirs.
    fn operator_host() -> (tempfile::TempDir, Root) {
        let (d, root) = good_host();
        let lib = root.join("usr/lib/x86_64-linux-gnu");
        std::fs::remove_dir_all(&lib).unwrap();
        std::fs::remove_file(root.join("usr/bin/nvidia-smi")).unwrap();
        let tree = "run/nvidia/driver";
        for stem in ["libnvidia-ml", "libcuda"] {
            let file = root.join(&format!(
                "{tree}/usr/lib/x86_64-linux-gnu/{stem}.so.550.127.05"
            ));
            gpu::write_elf(&file, true, 62);
            std::os::unix::fs::symlink(
                format!("{stem}.so.550.127.05"),
                file.with_file_name(format!("{stem}.so.1")),
            )
            .unwrap();
        }
        tool(&root, &format!("{tree}/usr/bin/nvidia-smi"));
        (d, root)
    }

    #[test]
    fn the_operator_driver_root_is_found_without_the_loader_cache() {
        let (_d, root) = operator_host();
        let never = || -> Result<String, GpuError> { panic!("ldconfig must not run") };
        let out = checks_with(&root, &Gpu::default(), Some(Arch::Amd64), never);
        let libs = finding(&out, "gpu-libraries");
        assert_eq!(libs.status, Status::Pass, "{libs:?}");
        assert_eq!(
            libs.seen,
            "libnvidia-ml.so.1 -> /run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.127.05, \
             libcuda.so.1 -> /run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.550.127.05"
        );
        assert!(libs
            .needed
            .contains("/run/nvidia/driver (the GPU operator's, detected)"));
        let tools = finding(&out, "gpu-tools");
        assert_eq!(
            (tools.status, tools.seen.as_str()),
            (
                Status::Pass,
                "nvidia-smi (/run/nvidia/driver/usr/bin/nvidia-smi) (bound one by one)"
            )
        );
        // configured as "/": the host's own driver (the cache, which has none)
        let host_only = Gpu {
            mode: GpuMode::Auto,
            driver_root: Some("/".into()),
        };
        let out = checks_with(&root, &host_only, Some(Arch::Amd64), || Ok(String::new()));
        let libs = finding(&out, "gpu-libraries");
        assert_eq!(libs.status, Status::Fail);
        assert_eq!(libs.seen, "no libnvidia-ml.so.1 for this architecture");
        // a configured root elsewhere is searched the same way
        std::fs::create_dir_all(root.join("opt")).unwrap();
        std::fs::rename(root.join("run/nvidia/driver"), root.join("opt/driver")).unwrap();
        let configured = Gpu {
            mode: GpuMode::On,
            driver_root: Some("/opt/driver".into()),
        };
        let out = checks_with(&root, &configured, Some(Arch::Amd64), never);
        let libs = finding(&out, "gpu-libraries");
        assert_eq!(libs.status, Status::Pass, "{libs:?}");
        assert!(
            libs.needed.contains("/opt/driver (gpu.driver_root)"),
            "{libs:?}"
        );
        // an empty operator mount point (its driver container not running)
        std::fs::create_dir_all(root.join("run/nvidia/driver")).unwrap();
        let out = checks_with(&root, &Gpu::default(), Some(Arch::Amd64), || {
            Ok(String::new())
        });
        assert!(finding(&out, "gpu-libraries")
            .needed
            .contains("in ldconfig -p"));
    }

    #[test]
    fn a_wrapper_whose_target_is_not_a_driver_tool_is_a_warning() {
        let (_d, root) = good_host();
        std::fs::write(
            root.join("usr/bin/nvidia-smi"),
            "#!/bin/sh\nexec /opt/vendor/bin/nvidia-smi \"$@\"\n",
        )
        .unwrap();
        let f = finding(&run(&root, LISTING), "gpu-tools");
        assert_eq!(f.status, Status::Warn);
        assert_eq!(
            f.seen,
            "no driver tool; not bound: /usr/bin/nvidia-smi is a script that runs \
             /opt/vendor/bin/nvidia-smi, which is not a driver tool beside the driver's \
             libraries or in /usr/bin"
        );
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
        let out = checks_with(&root, &Gpu::default(), Some(Arch::Amd64), || {
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
