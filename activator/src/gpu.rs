//! GPU and device discovery: which host device nodes and NVIDIA driver
//! library directories a node machine gets bound.
//!
//! Given the root handle (devices are looked up under `<root>/dev`) and the
//! text of `ldconfig -p` (a process boundary: [`parse_ldconfig`] is pure, and
//! [`run_ldconfig`] is the one place that runs `<root>/sbin/ldconfig -p`).
//! It does not link libraries or write a CDI spec (the NVIDIA image does that
//! inside the machine) and never runs anything from an image.
//!
//! Device rule: only character devices count (`/dev/nvidia-caps` is a
//! directory and `/dev/dri/by-path/*` are symlinks; neither is bound as a
//! device). Tests make real character devices with `mknod` (they run as root).

use std::collections::BTreeSet;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use crate::config::GpuMode;
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
}

/// What gets bound into a machine for its GPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuBinds {
    /// Host-absolute device paths (`/dev/nvidia0`), sorted.
    pub devices: Vec<String>,
    /// Host-absolute directories holding NVIDIA libraries, sorted; the
    /// i-th is bound at `/run/host-nvidia/<i>`.
    pub library_dirs: Vec<String>,
}

impl GpuBinds {
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("gpu mode is \"on\" but {dev} holds no /dev/nvidia<N> character device")]
    Required { dev: PathBuf },
    #[error("{path} -p: {reason}")]
    Ldconfig { path: PathBuf, reason: String },
    #[error("device {device}: {reason} (listed in the config's \"devices\")")]
    Device { device: String, reason: String },
}

/// NVIDIA driver library name prefixes (the user-space driver, CUDA, video,
/// graphics), as the NVIDIA container toolkit selects them.
const NVIDIA_LIBS: &[&str] = &[
    "libnvidia-",
    "libcuda.",
    "libcudadebugger.",
    "libnvcuvid.",
    "libnvoptix.",
    "libGLX_nvidia.",
    "libEGL_nvidia.",
    "libGLESv2_nvidia.",
    "libGLESv1_CM_nvidia.",
    "libvdpau_nvidia.",
];

/// The directories of the NVIDIA libraries in `ldconfig -p` output that match
/// `arch`, sorted and deduplicated. Pure: the caller runs ldconfig.
pub fn parse_ldconfig(output: &str, arch: Arch) -> Vec<String> {
    let mut dirs = BTreeSet::new();
    for line in output.lines() {
        // "\tlibcuda.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libcuda.so.1"
        let Some((lhs, path)) = line.split_once(" => ") else {
            continue;
        };
        let lhs = lhs.trim();
        let Some((name, flags)) = lhs.split_once(" (") else {
            continue;
        };
        // flags look like "libc6,x86-64, OS ABI: Linux 3.2.0)"; a 32-bit
        // library has no architecture marker at all.
        let matches_arch = flags
            .trim_end_matches(')')
            .split(',')
            .any(|f| f.trim() == arch.ldconfig_marker());
        if !matches_arch || !NVIDIA_LIBS.iter().any(|p| name.starts_with(p)) {
            continue;
        }
        let path = Path::new(path.trim());
        if let Some(dir) = path.parent().filter(|d| d.is_absolute()) {
            dirs.insert(dir.to_string_lossy().into_owned());
        }
    }
    dirs.into_iter().collect()
}

/// Runs `<root>/sbin/ldconfig -p` and returns its output.
pub fn run_ldconfig(root: &Root) -> Result<String, GpuError> {
    let path = root.ldconfig();
    let out = std::process::Command::new(&path)
        .arg("-p")
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| GpuError::Ldconfig {
            path: path.clone(),
            reason: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(GpuError::Ldconfig {
            path,
            reason: format!(
                "exited with {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    String::from_utf8(out.stdout).map_err(|_| GpuError::Ldconfig {
        path,
        reason: "output is not UTF-8".into(),
    })
}

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
                source,
            })
        }
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| GpuError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if keep(&name) && is_char_device(&entry.path()) {
            found.push(format!("/dev/{rel}{name}"));
        }
    }
    found.sort();
    Ok(found)
}

/// The NVIDIA device nodes under `<root>/dev`: `/dev/nvidia*`,
/// `/dev/nvidia-caps/*` and `/dev/dri/*`, character devices only. Empty when
/// no `/dev/nvidia<N>` GPU node exists (a `/dev/dri` alone is not an NVIDIA
/// GPU).
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
    all.extend(char_devices(
        &dev.join("nvidia-caps"),
        "nvidia-caps/",
        |_| true,
    )?);
    all.extend(char_devices(&dev.join("dri"), "dri/", |_| true)?);
    Ok(all)
}

/// Decides the GPU binds for `mode`: devices from `<root>/dev`, library
/// directories from `ldconfig` (called only when a GPU is present).
pub fn discover(
    root: &Root,
    mode: GpuMode,
    arch: Option<Arch>,
    ldconfig: impl FnOnce() -> Result<String, GpuError>,
) -> Result<GpuBinds, GpuError> {
    if mode == GpuMode::Off {
        return Ok(GpuBinds::default());
    }
    let devices = discover_devices(root)?;
    if devices.is_empty() {
        if mode == GpuMode::On {
            return Err(GpuError::Required { dev: root.dev() });
        }
        return Ok(GpuBinds::default());
    }
    let library_dirs = match arch {
        Some(arch) => parse_ldconfig(&ldconfig()?, arch),
        None => Vec::new(),
    };
    Ok(GpuBinds {
        devices,
        library_dirs,
    })
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

    fn fixture(name: &str) -> String {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../testdata/gpu")
            .join(name);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    #[test]
    fn amd64_ldconfig_keeps_64_bit_nvidia_dirs_only() {
        let dirs = parse_ldconfig(&fixture("ldconfig-amd64.txt"), Arch::Amd64);
        assert_eq!(
            dirs,
            vec![
                "/lib/x86_64-linux-gnu".to_string(),
                "/usr/lib/x86_64-linux-gnu/vdpau".to_string()
            ]
        );
        // the amd64 cache has no arm64 entries
        assert!(parse_ldconfig(&fixture("ldconfig-amd64.txt"), Arch::Arm64).is_empty());
    }

    #[test]
    fn the_wrong_architecture_is_excluded() {
        assert!(parse_ldconfig(&fixture("ldconfig-arm64.txt"), Arch::Amd64).is_empty());
        // one cache holding both (a multiarch host): each arch keeps its own
        let both = fixture("ldconfig-amd64.txt") + &fixture("ldconfig-arm64.txt");
        let amd = parse_ldconfig(&both, Arch::Amd64);
        let arm = parse_ldconfig(&both, Arch::Arm64);
        assert!(amd.iter().all(|d| d.contains("x86_64")), "{amd:?}");
        assert!(arm.iter().all(|d| d.contains("aarch64")), "{arm:?}");
        // 32-bit (i386) entries carry no architecture marker and never match
        assert!(!amd.iter().any(|d| d.contains("i386")), "{amd:?}");
    }

    #[test]
    fn devices_without_driver_libraries_are_still_bound() {
        // the health gate (GPU nodes present) catches a missing driver; the
        // device binds themselves do not depend on it
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        fake_dev(&root, true);
        let on = discover(&root, GpuMode::On, Some(Arch::Amd64), || {
            Ok(fixture("ldconfig-arm64.txt"))
        })
        .unwrap();
        assert!(!on.devices.is_empty() && on.library_dirs.is_empty());
    }

    #[test]
    fn arm64_ldconfig_groups_by_directory() {
        let dirs = parse_ldconfig(&fixture("ldconfig-arm64.txt"), Arch::Arm64);
        assert_eq!(
            dirs,
            vec![
                "/usr/lib/aarch64-linux-gnu".to_string(),
                "/usr/lib/aarch64-linux-gnu/nvidia".to_string()
            ]
        );
    }

    #[test]
    fn non_nvidia_and_garbage_lines_are_ignored() {
        let out = "x\n\tlibc.so.6 (libc6,x86-64) => /lib/libc.so.6\n\tlibcuda.so.1 (libc6,x86-64) => relative/libcuda.so.1\n";
        assert!(parse_ldconfig(out, Arch::Amd64).is_empty());
    }

    fn fake_dev(root: &Root, gpu: bool) {
        let dev = root.dev();
        std::fs::create_dir_all(dev.join("nvidia-caps")).unwrap();
        std::fs::create_dir_all(dev.join("dri/by-path")).unwrap();
        mknod_char(&dev.join("null"), 1, 3).unwrap();
        mknod_char(&dev.join("dri/card0"), 226, 0).unwrap();
        std::os::unix::fs::symlink("../card0", dev.join("dri/by-path/pci-card")).unwrap();
        if gpu {
            mknod_char(&dev.join("nvidia0"), 195, 0).unwrap();
            mknod_char(&dev.join("nvidiactl"), 195, 255).unwrap();
            mknod_char(&dev.join("nvidia-uvm"), 510, 0).unwrap();
            mknod_char(&dev.join("nvidia-caps/nvidia-cap1"), 511, 1).unwrap();
            mknod_char(&dev.join("dri/renderD128"), 226, 128).unwrap();
            // a regular file named like a device is not a device
            std::fs::write(dev.join("nvidia-fake"), b"").unwrap();
        }
    }

    #[test]
    fn discovers_char_devices_only() {
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        fake_dev(&root, true);
        let binds = discover(&root, GpuMode::Auto, Some(Arch::Amd64), || {
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
                "/dev/dri/card0",
                "/dev/dri/renderD128"
            ]
        );
        assert_eq!(binds.library_dirs.len(), 2);
        let off = discover(&root, GpuMode::Off, Some(Arch::Amd64), || unreachable!()).unwrap();
        assert!(off.is_empty());
    }

    #[test]
    fn host_without_gpu() {
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        fake_dev(&root, false);
        let auto = discover(&root, GpuMode::Auto, Some(Arch::Amd64), || {
            panic!("ldconfig must not run without a GPU")
        })
        .unwrap();
        assert!(auto.is_empty() && auto.library_dirs.is_empty());
        let e = discover(&root, GpuMode::On, Some(Arch::Amd64), || unreachable!())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("gpu mode is \"on\"") && e.contains("/dev"),
            "{e}"
        );
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
