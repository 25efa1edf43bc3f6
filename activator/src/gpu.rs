//! GPU and device discovery: which host device nodes, device directories,
//! NVIDIA driver library directories and driver binary directory a node
//! machine gets bound.
//!
//! Given the root handle (devices are looked up under `<root>/dev`, library
//! and binary paths are resolved under the root, symlinks followed as if the
//! root were `/`) and the text of `ldconfig -p` (a process boundary:
//! [`parse_ldconfig`] is pure, and [`run_ldconfig`] is the one place that
//! runs `<root>/sbin/ldconfig -p`). It does not link libraries or write a CDI
//! spec (the NVIDIA image's `kubeslot-nvidia-setup.service` does that inside
//! the machine, from the binds chosen here) and never runs anything from an
//! image.
//!
//! Device rule: only character devices count as devices (`/dev/dri/by-path/*`
//! are symlinks). `/dev/nvidia-caps` and `/dev/nvidia-caps-imex-channels` are
//! bound as whole directories, so nodes the driver creates after the machine
//! started are visible; the devices cgroup allows them by their device group
//! (`char-nvidia-caps`), not one by one. Tests make real character devices
//! with `mknod` (they run as root).
//!
//! Library rule: a library `ldconfig -p` lists is resolved on the host (the
//! Debian driver packages reach the files through `/etc/alternatives`), and
//! the directory of the file itself is bound; a listed library that does not
//! resolve to a file is left out (a stale cache entry must not stop the
//! machine: nspawn refuses a bind whose source is missing).

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::FileTypeExt;
use std::path::{Component, Path, PathBuf};

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

    /// Whether the NVIDIA driver ships 32-bit libraries for this
    /// architecture (i386 beside amd64; there is no 32-bit arm driver).
    fn has_32_bit(self) -> bool {
        self == Arch::Amd64
    }
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
    /// The directory of the host's `nvidia-smi` (and the driver's other
    /// tools beside it), bound at `/run/host-nvidia-bin`.
    pub bin_dir: Option<String>,
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
/// graphics), as the NVIDIA container toolkit selects them. The image's
/// `kubeslot-nvidia-setup` links the same names.
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

/// Where the host's `nvidia-smi` is looked for (the driver installers and
/// the distribution packages put it in one of these).
const NVIDIA_SMI: &[&str] = &["/usr/bin/nvidia-smi", "/usr/local/bin/nvidia-smi"];

/// The NVIDIA libraries of one `ldconfig -p` listing for one architecture,
/// as the host paths it names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DriverLibraries {
    /// Native (64-bit) libraries.
    pub native: Vec<String>,
    /// 32-bit (i386) libraries beside amd64 ones.
    pub i386: Vec<String>,
}

/// The NVIDIA libraries in `ldconfig -p` output, split into the native ones
/// of `arch` and (amd64 only) the 32-bit ones, in listing order. Pure: the
/// caller runs ldconfig.
pub fn parse_ldconfig(output: &str, arch: Arch) -> DriverLibraries {
    let mut libs = DriverLibraries::default();
    for line in output.lines() {
        // "\tlibcuda.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libcuda.so.1"
        let Some((lhs, path)) = line.split_once(" => ") else {
            continue;
        };
        let lhs = lhs.trim();
        let Some((name, flags)) = lhs.split_once(" (") else {
            continue;
        };
        let path = path.trim();
        if !path.starts_with('/') || !NVIDIA_LIBS.iter().any(|p| name.starts_with(p)) {
            continue;
        }
        // flags look like "libc6,x86-64, OS ABI: Linux 3.2.0)"; a 32-bit
        // i386 library says "libc6" and nothing else
        let flags: Vec<&str> = flags
            .trim_end_matches(')')
            .split(',')
            .map(str::trim)
            .filter(|f| !f.starts_with("OS ABI:"))
            .collect();
        if flags.contains(&arch.ldconfig_marker()) {
            libs.native.push(path.to_string());
        } else if arch.has_32_bit() && flags == ["libc6"] {
            libs.i386.push(path.to_string());
        }
    }
    libs
}

/// Resolves a host-absolute `path` under the root as the kernel would if the
/// root were `/`: symlinks are followed (absolute targets start again at the
/// root, `..` never climbs above it), at most 40 of them. `None` when the
/// path does not exist or loops.
pub fn resolve_in_root(root: &Root, path: &str) -> Option<String> {
    let mut pending: Vec<OsString> = components(Path::new(path));
    pending.reverse();
    let mut resolved: Vec<OsString> = Vec::new();
    let mut links = 0;
    while let Some(c) = pending.pop() {
        if c == ".." {
            resolved.pop();
            continue;
        }
        resolved.push(c);
        let here = root.dir().join(resolved.iter().collect::<PathBuf>());
        let meta = std::fs::symlink_metadata(&here).ok()?;
        if !meta.file_type().is_symlink() {
            continue;
        }
        links += 1;
        if links > 40 {
            return None;
        }
        let target = std::fs::read_link(&here).ok()?;
        resolved.pop();
        if target.is_absolute() {
            resolved.clear();
        }
        let mut more = components(&target);
        more.reverse();
        pending.extend(more);
    }
    let mut out = String::new();
    for c in &resolved {
        out.push('/');
        out.push_str(&String::from_utf8_lossy(c.as_bytes()));
    }
    if out.is_empty() {
        out.push('/');
    }
    Some(out)
}

/// The normal and `..` components of a path (`/` and `.` dropped).
fn components(path: &Path) -> Vec<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect()
}

/// The directories of the files `libraries` resolve to under the root,
/// sorted and deduplicated; a library that does not resolve to a file is
/// left out.
pub fn library_dirs(root: &Root, libraries: &[String]) -> Vec<String> {
    let mut dirs = BTreeSet::new();
    for lib in libraries {
        let Some(file) = resolve_in_root(root, lib) else {
            continue;
        };
        if !root.join(&file).is_file() {
            continue;
        }
        if let Some(dir) = Path::new(&file).parent() {
            dirs.insert(dir.to_string_lossy().into_owned());
        }
    }
    dirs.into_iter().collect()
}

/// The directory of the host's `nvidia-smi` (the file it resolves to), if
/// the host has one.
pub fn nvidia_smi_dir(root: &Root) -> Option<String> {
    NVIDIA_SMI.iter().find_map(|p| {
        let file = resolve_in_root(root, p)?;
        if !root.join(&file).is_file() {
            return None;
        }
        Path::new(&file)
            .parent()
            .map(|d| d.to_string_lossy().into_owned())
    })
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

/// Decides the GPU binds for `mode`: devices and device directories from
/// `<root>/dev`, library directories from `ldconfig` (called only when a GPU
/// is present), the directory of `nvidia-smi`.
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
    let libs = match arch {
        Some(arch) => parse_ldconfig(&ldconfig()?, arch),
        None => DriverLibraries::default(),
    };
    Ok(GpuBinds {
        devices,
        device_dirs: discover_device_dirs(root),
        library_dirs: library_dirs(root, &libs.native),
        library_dirs_32: library_dirs(root, &libs.i386),
        bin_dir: nvidia_smi_dir(root),
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

    /// Every path a listing names, as an empty file under the root (the
    /// recorded host's driver files, without their bytes).
    fn materialize(root: &Root, listing: &str) {
        for line in listing.lines() {
            if let Some((_, path)) = line.split_once(" => ") {
                let p = root.join(path.trim());
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                std::fs::write(p, b"").unwrap();
            }
        }
    }

    fn dirs_of(listing: &str, arch: Arch) -> (Vec<String>, Vec<String>) {
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        materialize(&root, listing);
        let libs = parse_ldconfig(listing, arch);
        (
            library_dirs(&root, &libs.native),
            library_dirs(&root, &libs.i386),
        )
    }

    #[test]
    fn amd64_ldconfig_splits_native_and_32_bit_nvidia_libraries() {
        let libs = parse_ldconfig(&fixture("ldconfig-amd64.txt"), Arch::Amd64);
        assert!(libs
            .native
            .contains(&"/lib/x86_64-linux-gnu/libnvidia-ml.so.1".to_string()));
        assert_eq!(
            libs.i386,
            [
                "/lib/i386-linux-gnu/libnvidia-ml.so.1",
                "/lib/i386-linux-gnu/libnvidia-encode.so.1",
                "/lib/i386-linux-gnu/libcuda.so.1"
            ]
        );
        assert!(!libs.native.iter().any(|l| l.contains("libc.so")));
        let (native, i386) = dirs_of(&fixture("ldconfig-amd64.txt"), Arch::Amd64);
        assert_eq!(
            native,
            ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu/vdpau"]
        );
        assert_eq!(i386, ["/lib/i386-linux-gnu"]);
        // the amd64 cache has no arm64 entries
        let arm = parse_ldconfig(&fixture("ldconfig-amd64.txt"), Arch::Arm64);
        assert!(arm.native.is_empty() && arm.i386.is_empty(), "{arm:?}");
    }

    #[test]
    fn the_wrong_architecture_is_excluded() {
        let libs = parse_ldconfig(&fixture("ldconfig-arm64.txt"), Arch::Amd64);
        assert!(libs.native.is_empty() && libs.i386.is_empty(), "{libs:?}");
        // one cache holding both (a multiarch host): each arch keeps its own
        let both = fixture("ldconfig-amd64.txt") + &fixture("ldconfig-arm64.txt");
        let amd = parse_ldconfig(&both, Arch::Amd64);
        let arm = parse_ldconfig(&both, Arch::Arm64);
        assert!(amd.native.iter().all(|d| d.contains("x86_64")), "{amd:?}");
        assert!(arm.native.iter().all(|d| d.contains("aarch64")), "{arm:?}");
        // there is no 32-bit arm driver: i386 entries never count for arm64
        assert!(arm.i386.is_empty(), "{arm:?}");
        // x32 entries are neither native nor i386
        let x32 = "\tlibcuda.so.1 (libc6,x32) => /usr/libx32/libcuda.so.1\n";
        assert_eq!(parse_ldconfig(x32, Arch::Amd64), DriverLibraries::default());
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
        let (native, i386) = dirs_of(&fixture("ldconfig-arm64.txt"), Arch::Arm64);
        assert_eq!(
            native,
            [
                "/usr/lib/aarch64-linux-gnu",
                "/usr/lib/aarch64-linux-gnu/nvidia"
            ]
        );
        assert!(i386.is_empty());
    }

    #[test]
    fn non_nvidia_and_garbage_lines_are_ignored() {
        let out = "x\n\tlibc.so.6 (libc6,x86-64) => /lib/libc.so.6\n\tlibcuda.so.1 (libc6,x86-64) => relative/libcuda.so.1\n";
        assert_eq!(parse_ldconfig(out, Arch::Amd64), DriverLibraries::default());
    }

    #[test]
    fn listed_libraries_that_do_not_resolve_are_left_out() {
        // a stale cache entry: binding a missing directory would stop nspawn
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        let listing = "\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1\n";
        let libs = parse_ldconfig(listing, Arch::Amd64);
        assert!(library_dirs(&root, &libs.native).is_empty());
        // a dangling link is no library either
        let dir = root.join("usr/lib/x86_64-linux-gnu");
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink("libcuda.so.550.1", dir.join("libcuda.so.1")).unwrap();
        assert!(library_dirs(&root, &libs.native).is_empty());
        std::fs::write(dir.join("libcuda.so.550.1"), b"").unwrap();
        assert_eq!(
            library_dirs(&root, &libs.native),
            ["/usr/lib/x86_64-linux-gnu"]
        );
    }

    #[test]
    fn alternatives_links_resolve_under_the_root() {
        // Debian's driver packages: /usr/lib/x86_64-linux-gnu/libcuda.so.1
        // -> /etc/alternatives/... -> nvidia/current/libcuda.so.1 ->
        // libcuda.so.535.1; the directory of the file is bound
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        let current = root.join("usr/lib/x86_64-linux-gnu/nvidia/current");
        std::fs::create_dir_all(&current).unwrap();
        std::fs::write(current.join("libcuda.so.535.1"), b"").unwrap();
        std::os::unix::fs::symlink("libcuda.so.535.1", current.join("libcuda.so.1")).unwrap();
        std::fs::create_dir_all(root.join("etc/alternatives")).unwrap();
        std::os::unix::fs::symlink(
            "/usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.1",
            root.join("etc/alternatives/nvidia--libcuda.so.1-x86_64-linux-gnu"),
        )
        .unwrap();
        std::os::unix::fs::symlink(
            "/etc/alternatives/nvidia--libcuda.so.1-x86_64-linux-gnu",
            root.join("usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        )
        .unwrap();
        // and usrmerge: /lib -> usr/lib
        std::os::unix::fs::symlink("usr/lib", root.join("lib")).unwrap();
        assert_eq!(
            resolve_in_root(&root, "/lib/x86_64-linux-gnu/libcuda.so.1").as_deref(),
            Some("/usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.535.1")
        );
        assert_eq!(
            library_dirs(&root, &["/lib/x86_64-linux-gnu/libcuda.so.1".into()]),
            ["/usr/lib/x86_64-linux-gnu/nvidia/current"]
        );
        // an absolute link never leaves the root, nor does ..
        std::os::unix::fs::symlink("/../../../etc", root.join("up")).unwrap();
        assert_eq!(resolve_in_root(&root, "/up").as_deref(), Some("/etc"));
        // a loop resolves to nothing
        std::os::unix::fs::symlink("loop", root.join("loop")).unwrap();
        assert_eq!(resolve_in_root(&root, "/loop"), None);
        // nvidia-smi through an alternative: its directory is the file's
        std::fs::create_dir_all(root.join("usr/lib/nvidia/current")).unwrap();
        std::fs::write(root.join("usr/lib/nvidia/current/nvidia-smi"), b"").unwrap();
        std::os::unix::fs::symlink(
            "/usr/lib/nvidia/current/nvidia-smi",
            root.join("etc/alternatives/nvidia--nvidia-smi"),
        )
        .unwrap();
        assert_eq!(nvidia_smi_dir(&root), None, "no /usr/bin/nvidia-smi yet");
        std::fs::create_dir_all(root.join("usr/bin")).unwrap();
        std::os::unix::fs::symlink(
            "/etc/alternatives/nvidia--nvidia-smi",
            root.join("usr/bin/nvidia-smi"),
        )
        .unwrap();
        assert_eq!(
            nvidia_smi_dir(&root).as_deref(),
            Some("/usr/lib/nvidia/current")
        );
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
        assert_eq!(binds.bin_dir, None, "no nvidia-smi on this host");
        let off = discover(&root, GpuMode::Off, Some(Arch::Amd64), || unreachable!()).unwrap();
        assert!(off.is_empty());
    }

    #[test]
    fn host_without_gpu() {
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        fake_dev(&root, false);
        // device directories without a GPU bind nothing
        std::fs::create_dir_all(root.dev().join("nvidia-caps")).unwrap();
        let auto = discover(&root, GpuMode::Auto, Some(Arch::Amd64), || {
            panic!("ldconfig must not run without a GPU")
        })
        .unwrap();
        assert_eq!(auto, GpuBinds::default());
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
