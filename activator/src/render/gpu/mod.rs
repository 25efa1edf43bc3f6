//! GPU and device discovery: which host device nodes, device directories,
//! NVIDIA driver library directories and driver tools a node machine gets
//! bound.
//!
//! Given the root handle (devices are looked up under `<root>/dev`, library
//! and tool paths are resolved under the root, symlinks followed as if the
//! root were `/`) and the config's `gpu` setting, it reads the host once
//! per run into one [`Discovery`] (`discovery.rs`), which the render's
//! binds and the preflight's GPU checks both take. The parts live by
//! subject: `libraries.rs` (where the driver's libraries are: the loader
//! cache through `ldconfig -p`, the one process run here, or a driver tree
//! such as the GPU operator's), `tools.rs` (the driver's executables and
//! how they are bound), `pci.rs` (NVIDIA GPUs on the PCI bus, for
//! preflight). It does not link libraries or write a CDI spec (the NVIDIA
//! image's `kubeslot-nvidia-setup.service` does that inside the machine,
//! from the binds chosen here) and never runs anything from an image or
//! the driver.
//!
//! Device rule: only character devices count as devices (`/dev/dri/by-path/*`
//! are symlinks). `/dev/nvidia-caps` and `/dev/nvidia-caps-imex-channels` are
//! bound as whole directories, so nodes the driver creates after the machine
//! started are visible; the devices cgroup allows them by their device group
//! (`char-nvidia-caps`), not one by one. Tests make real character devices
//! with `mknod` (they run as root).

mod discovery;
mod libraries;
pub mod pci;
pub mod tools;

pub use discovery::Discovery;

pub use libraries::{
    library_dirs, parse_ldconfig, resolve_in_root, run_ldconfig, DriverLibraries, DriverSource,
};
pub use tools::{DriverTools, Skipped, Tool, ToolBind};

use std::io::Read as _;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use crate::config::Gpu;
use crate::paths::Root;

/// The host architectures `ldconfig -p` output is filtered for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Amd64,
    Arm64,
}

impl Arch {
    /// The architecture this binary runs on (`None` elsewhere: no GPU binds).
    pub fn host() -> Option<Arch> {
        match std::env::consts::ARCH {
            "x86_64" => Some(Arch::Amd64),
            "aarch64" => Some(Arch::Arm64),
            _ => None,
        }
    }

    /// The marker `ldconfig -p` prints inside the parentheses.
    fn ldconfig_marker(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86-64",
            Arch::Arm64 => "AArch64",
        }
    }

    /// Whether the NVIDIA driver ships 32-bit libraries for this
    /// architecture (i386 beside amd64; there is no 32-bit arm driver).
    fn has_32_bit(self) -> bool {
        self == Arch::Amd64
    }

    /// The Debian multiarch directory name (`x86_64-linux-gnu`).
    pub fn triplet(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64-linux-gnu",
            Arch::Arm64 => "aarch64-linux-gnu",
        }
    }

    /// Whether an ELF file is a native object of this architecture.
    fn is_native(self, elf: Elf) -> bool {
        const EM_X86_64: u16 = 62;
        const EM_AARCH64: u16 = 183;
        elf.bits64
            && elf.machine
                == match self {
                    Arch::Amd64 => EM_X86_64,
                    Arch::Arm64 => EM_AARCH64,
                }
    }

    /// Whether an ELF file is a 32-bit (i386) object beside this
    /// architecture's.
    fn is_i386(self, elf: Elf) -> bool {
        const EM_386: u16 = 3;
        self.has_32_bit() && !elf.bits64 && elf.machine == EM_386
    }
}

/// The parts of an ELF header discovery looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Elf {
    bits64: bool,
    machine: u16,
}

/// The ELF header of `path` (little-endian objects only: both
/// architectures are); `None` for anything else.
fn read_elf(path: &Path) -> Option<Elf> {
    let mut head = [0u8; 20];
    std::fs::File::open(path).ok()?.read_exact(&mut head).ok()?;
    if head[..4] != *b"\x7fELF" || head[5] != 1 {
        return None;
    }
    let bits64 = match head[4] {
        1 => false,
        2 => true,
        _ => return None,
    };
    Some(Elf {
        bits64,
        machine: u16::from_le_bytes([head[18], head[19]]),
    })
}

/// A device directory bound whole, allowed by its device group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceDir {
    /// Host-absolute (`/dev/nvidia-caps`).
    pub path: String,
    /// The `DeviceAllow=` group specifier (`char-nvidia-caps`): the major
    /// number `/proc/devices` gives that name.
    pub group: &'static str,
}

/// What gets bound into a machine for its GPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuBinds {
    /// Every NVIDIA and DRI character device (`/dev/nvidia0`,
    /// `/dev/nvidia-caps/nvidia-cap1`), host-absolute: the health gate
    /// expects each inside the machine. Those under a [`DeviceDir`] are bound
    /// with their directory, the others one by one.
    pub devices: Vec<String>,
    /// Device directories bound whole.
    pub device_dirs: Vec<DeviceDir>,
    /// Host-absolute directories holding native NVIDIA libraries, sorted;
    /// the i-th is bound at `/run/host-nvidia/<i>`.
    pub library_dirs: Vec<String>,
    /// The same for 32-bit (i386) libraries on amd64 hosts, bound at
    /// `/run/host-nvidia-i386/<i>`.
    pub library_dirs_32: Vec<String>,
    /// The driver's tools, bound at `/run/host-nvidia-bin`, and the files
    /// named like one that are not.
    pub tools: DriverTools,
}

impl GpuBinds {
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// The devices bound one by one (those not inside a bound directory).
    pub fn single_devices(&self) -> impl Iterator<Item = &str> {
        self.devices
            .iter()
            .map(String::as_str)
            .filter(|d| !self.device_dirs.iter().any(|dir| is_under(d, &dir.path)))
    }
}

fn is_under(path: &str, dir: &str) -> bool {
    path.strip_prefix(dir)
        .is_some_and(|rest| rest.starts_with('/'))
}

/// Why GPU discovery failed. Clone (the I/O error shared): one
/// [`Discovery`] keeps it for the render and the preflight alike.
#[derive(Clone, Debug, thiserror::Error)]
pub enum GpuError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::sync::Arc<std::io::Error>,
    },
    #[error("gpu mode is \"on\" but {dev} holds no /dev/nvidia<N> character device")]
    Required { dev: PathBuf },
    #[error("{path} -p: {reason}")]
    Ldconfig { path: PathBuf, reason: String },
    #[error("device {device}: {reason} (listed in the config's \"devices\")")]
    Device { device: String, reason: String },
}

/// Device directories bound whole, with their `DeviceAllow=` group: the
/// MIG capability nodes and the IMEX channels (multi-node NVLink), which the
/// driver may create while the machine runs.
const DEVICE_DIRS: &[(&str, &str)] = &[
    ("nvidia-caps", "char-nvidia-caps"),
    (
        "nvidia-caps-imex-channels",
        "char-nvidia-caps-imex-channels",
    ),
];

fn is_char_device(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_char_device())
}

/// Character devices in `dir` whose names pass `keep`, as host-absolute
/// paths under `/dev/<rel>`; a missing directory is empty.
fn char_devices(
    dir: &Path,
    rel: &str,
    keep: impl Fn(&str) -> bool,
) -> Result<Vec<String>, GpuError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(GpuError::Io {
                path: dir.to_path_buf(),
                source: source.into(),
            })
        }
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| GpuError::Io {
            path: dir.to_path_buf(),
            source: source.into(),
        })?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if keep(&name) && is_char_device(&entry.path()) {
            found.push(format!("/dev/{rel}{name}"));
        }
    }
    found.sort();
    Ok(found)
}

/// The NVIDIA device nodes under `<root>/dev`: `/dev/nvidia*`, those in the
/// device directories (`/dev/nvidia-caps/*`,
/// `/dev/nvidia-caps-imex-channels/*`) and `/dev/dri/*`, character devices
/// only. Empty when no `/dev/nvidia<N>` GPU node exists (a `/dev/dri` alone
/// is not an NVIDIA GPU).
pub fn discover_devices(root: &Root) -> Result<Vec<String>, GpuError> {
    let dev = root.dev();
    let nvidia = char_devices(&dev, "", |n| n.starts_with("nvidia"))?;
    let has_gpu = nvidia.iter().any(|d| {
        d.strip_prefix("/dev/nvidia")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    });
    if !has_gpu {
        return Ok(Vec::new());
    }
    let mut all = nvidia;
    for (dir, _) in DEVICE_DIRS {
        all.extend(char_devices(&dev.join(dir), &format!("{dir}/"), |_| true)?);
    }
    all.extend(char_devices(&dev.join("dri"), "dri/", |_| true)?);
    Ok(all)
}

/// The device directories present under `<root>/dev` (real directories, not
/// symlinks).
fn discover_device_dirs(root: &Root) -> Vec<DeviceDir> {
    DEVICE_DIRS
        .iter()
        .filter(|(dir, _)| {
            std::fs::symlink_metadata(root.dev().join(dir)).is_ok_and(|m| m.is_dir())
        })
        .map(|(dir, group)| DeviceDir {
            path: format!("/dev/{dir}"),
            group,
        })
        .collect()
}

/// Decides the GPU binds for the config's `gpu` setting: devices and
/// device directories from `<root>/dev`; when a GPU is present, the
/// driver's library directories (from `ldconfig`, called only for the
/// host's own driver, or from the driver tree) and its tools. One
/// [`Discovery`] read and its binds taken (for a caller that needs nothing
/// else).
pub fn discover(
    root: &Root,
    gpu: &Gpu,
    arch: Option<Arch>,
    ldconfig: impl FnOnce() -> Result<String, GpuError>,
) -> Result<GpuBinds, GpuError> {
    Discovery::read_with(root, gpu, arch, ldconfig).binds()
}

/// `/dev/kvm`, bound when the host has it as a character device (the
/// seed's `DiscoverHostDevicePaths`).
pub const KVM: &str = "/dev/kvm";

/// [`KVM`] when the host under `root` has it, else nothing.
pub fn kvm_device(root: &Root) -> Option<String> {
    is_char_device(&root.join(KVM)).then(|| KVM.to_string())
}

/// Checks the config's extra devices exist under the root as character or
/// block devices; returns them as host-absolute strings.
pub fn extra_devices(root: &Root, devices: &[PathBuf]) -> Result<Vec<String>, GpuError> {
    devices
        .iter()
        .map(|d| {
            let shown = d.to_string_lossy().into_owned();
            let meta =
                std::fs::symlink_metadata(root.join(&shown)).map_err(|e| GpuError::Device {
                    device: shown.clone(),
                    reason: format!("not found on the host: {e}"),
                })?;
            let ft = meta.file_type();
            if !(ft.is_char_device() || ft.is_block_device()) {
                return Err(GpuError::Device {
                    device: shown,
                    reason: "not a character or block device".into(),
                });
            }
            Ok(shown)
        })
        .collect()
}

/// Test helper: a file holding nothing but an ELF header of the given
/// class and machine (what discovery reads).
#[cfg(test)]
pub(crate) fn write_elf(path: &Path, bits64: bool, machine: u16) {
    let mut head = [0u8; 64];
    head[..4].copy_from_slice(b"\x7fELF");
    head[4] = if bits64 { 2 } else { 1 };
    head[5] = 1;
    head[6] = 1;
    head[16] = 3; // ET_DYN
    head[18..20].copy_from_slice(&machine.to_le_bytes());
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(path, head).unwrap();
}

/// Test helper: makes a character device node (root only).
#[doc(hidden)]
pub fn mknod_char(path: &Path, major: u32, minor: u32) -> std::io::Result<()> {
    use rustix::fs::{mknodat, FileType, Mode, CWD};
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    mknodat(
        CWD,
        path,
        FileType::CharacterDevice,
        Mode::from_raw_mode(0o666),
        rustix::fs::makedev(major, minor),
    )
    .map_err(std::io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GpuMode;

    /// A recorded `ldconfig -p` listing of `testdata/gpu`.
    pub(super) fn fixture(name: &str) -> String {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../testdata/gpu")
            .join(name);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    /// Every path a listing names, as an empty file under the root (the
    /// recorded host's driver files, without their bytes).
    pub(super) fn materialize(root: &Root, listing: &str) {
        for line in listing.lines() {
            if let Some((_, path)) = line.split_once(" => ") {
                let p = root.join(path.trim());
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                std::fs::write(p, b"").unwrap();
            }
        }
    }

    fn on() -> Gpu {
        Gpu {
            mode: GpuMode::On,
            driver_root: None,
        }
    }

    fn off() -> Gpu {
        Gpu {
            mode: GpuMode::Off,
            driver_root: None,
        }
    }

    #[test]
    fn devices_without_driver_libraries_are_still_bound() {
        // the health gate (GPU nodes present) catches a missing driver; the
        // device binds themselves do not depend on it
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        fake_dev(&root, true);
        let on = discover(&root, &on(), Some(Arch::Amd64), || {
            Ok(fixture("ldconfig-arm64.txt"))
        })
        .unwrap();
        assert!(!on.devices.is_empty() && on.library_dirs.is_empty());
    }

    fn fake_dev(root: &Root, gpu: bool) {
        let dev = root.dev();
        std::fs::create_dir_all(dev.join("dri/by-path")).unwrap();
        mknod_char(&dev.join("null"), 1, 3).unwrap();
        mknod_char(&dev.join("dri/card0"), 226, 0).unwrap();
        std::os::unix::fs::symlink("../card0", dev.join("dri/by-path/pci-card")).unwrap();
        if gpu {
            mknod_char(&dev.join("nvidia0"), 195, 0).unwrap();
            mknod_char(&dev.join("nvidiactl"), 195, 255).unwrap();
            mknod_char(&dev.join("nvidia-uvm"), 510, 0).unwrap();
            mknod_char(&dev.join("nvidia-caps/nvidia-cap1"), 511, 1).unwrap();
            mknod_char(&dev.join("nvidia-caps-imex-channels/channel0"), 234, 0).unwrap();
            mknod_char(&dev.join("dri/renderD128"), 226, 128).unwrap();
            // a regular file named like a device is not a device
            std::fs::write(dev.join("nvidia-fake"), b"").unwrap();
        }
    }

    #[test]
    fn discovers_char_devices_and_device_dirs() {
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        fake_dev(&root, true);
        materialize(&root, &fixture("ldconfig-amd64.txt"));
        let binds = discover(&root, &Gpu::default(), Some(Arch::Amd64), || {
            Ok(fixture("ldconfig-amd64.txt"))
        })
        .unwrap();
        assert_eq!(
            binds.devices,
            [
                "/dev/nvidia-uvm",
                "/dev/nvidia0",
                "/dev/nvidiactl",
                "/dev/nvidia-caps/nvidia-cap1",
                "/dev/nvidia-caps-imex-channels/channel0",
                "/dev/dri/card0",
                "/dev/dri/renderD128"
            ]
        );
        assert_eq!(
            binds.device_dirs,
            [
                DeviceDir {
                    path: "/dev/nvidia-caps".into(),
                    group: "char-nvidia-caps"
                },
                DeviceDir {
                    path: "/dev/nvidia-caps-imex-channels".into(),
                    group: "char-nvidia-caps-imex-channels"
                }
            ]
        );
        // the nodes inside the directories come with them
        assert_eq!(
            binds.single_devices().collect::<Vec<_>>(),
            [
                "/dev/nvidia-uvm",
                "/dev/nvidia0",
                "/dev/nvidiactl",
                "/dev/dri/card0",
                "/dev/dri/renderD128"
            ]
        );
        assert_eq!(binds.library_dirs.len(), 2);
        assert_eq!(binds.library_dirs_32, ["/lib/i386-linux-gnu"]);
        assert_eq!(
            binds.tools,
            DriverTools::default(),
            "no nvidia-smi on this host"
        );
        let off = discover(&root, &off(), Some(Arch::Amd64), || unreachable!()).unwrap();
        assert!(off.is_empty());
    }

    #[test]
    fn host_without_gpu() {
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        fake_dev(&root, false);
        // device directories without a GPU bind nothing
        std::fs::create_dir_all(root.dev().join("nvidia-caps")).unwrap();
        let auto = discover(&root, &Gpu::default(), Some(Arch::Amd64), || {
            panic!("ldconfig must not run without a GPU")
        })
        .unwrap();
        assert_eq!(auto, GpuBinds::default());
        // "on" looks the libraries up (the preflight checks them), and the
        // binds are refused all the same
        let e = discover(&root, &on(), Some(Arch::Amd64), || Ok(String::new()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("gpu mode is \"on\"") && e.contains("/dev"),
            "{e}"
        );
    }

    #[test]
    fn elf_headers_tell_native_from_32_bit_objects() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("obj");
        for (bits64, machine, native_amd64, i386, native_arm64) in [
            (true, 62, true, false, false),
            (false, 3, false, true, false),
            (true, 183, false, false, true),
        ] {
            write_elf(&p, bits64, machine);
            let e = read_elf(&p).unwrap();
            assert_eq!(Arch::Amd64.is_native(e), native_amd64);
            assert_eq!(Arch::Amd64.is_i386(e), i386);
            assert_eq!(Arch::Arm64.is_native(e), native_arm64);
            assert!(!Arch::Arm64.is_i386(e), "no 32-bit arm driver");
        }
        std::fs::write(&p, b"#!/bin/sh\nexec /x\n").unwrap();
        assert_eq!(read_elf(&p), None);
        std::fs::write(&p, b"\x7fELF").unwrap();
        assert_eq!(read_elf(&p), None, "a truncated header");
    }

    #[test]
    fn extra_devices_must_be_devices() {
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        mknod_char(&root.join("dev/kvm"), 10, 232).unwrap();
        std::fs::write(root.join("dev/notadev"), b"").unwrap();
        assert_eq!(
            extra_devices(&root, &[PathBuf::from("/dev/kvm")]).unwrap(),
            ["/dev/kvm"]
        );
        let e = extra_devices(&root, &[PathBuf::from("/dev/notadev")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/dev/notadev") && e.contains("not a character"),
            "{e}"
        );
        let e = extra_devices(&root, &[PathBuf::from("/dev/missing")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("/dev/missing") && e.contains("not found"), "{e}");
    }
}
