//! The NVIDIA driver's user-space libraries: where they are looked up
//! ([`DriverSource`]: the host's loader cache, or a driver tree such as the
//! GPU operator's `/run/nvidia/driver`), which of them belong to the host's
//! architecture, and which host directories hold them.
//!
//! Given the root handle and, for the loader cache, the text of
//! `ldconfig -p` ([`parse_ldconfig`] is pure; [`run_ldconfig`] is the one
//! place that runs `<root>/sbin/ldconfig -p`). A driver tree is searched
//! directly (its libraries are in no cache of the host's): the usual
//! library directories under it, each file named like a driver library
//! sorted by its ELF header into native and 32-bit, symlinks followed
//! inside the tree (an absolute link in the driver container's tree points
//! into that tree, not the host's).
//!
//! Library rule: a library is followed to its file (Debian's packages reach
//! it through `/etc/alternatives`), and the directory of the file itself is
//! bound; a library that does not resolve to a file is left out (a stale
//! cache entry must not stop the machine: nspawn refuses a bind whose
//! source is missing).

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Component, Path, PathBuf};

use super::{read_elf, Arch, GpuError};
use crate::config::Gpu;
use crate::paths::{host, Root};

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

fn is_driver_library(name: &str) -> bool {
    NVIDIA_LIBS.iter().any(|p| name.starts_with(p)) && name.contains(".so")
}

/// The library directories searched in a driver tree, relative to it
/// (`{triplet}` is the architecture's multiarch name), each with its
/// `vdpau/` beside: where Debian/Ubuntu, RHEL-family and the `.run`
/// installer put the driver.
const TREE_LIBRARY_DIRS: &[&str] = &[
    "usr/lib/{triplet}",
    "usr/lib64",
    "usr/lib",
    "usr/lib/i386-linux-gnu",
    "usr/lib32",
    "lib/{triplet}",
    "lib64",
    "lib",
    "lib/i386-linux-gnu",
    "lib32",
];

/// Where the driver's libraries (and tools) are looked up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DriverSource {
    /// The host's own driver: libraries from the host's loader cache
    /// (`ldconfig -p`), paths resolved under the root.
    LoaderCache,
    /// A driver tree mounted at `dir` (host-absolute, not `/`): searched
    /// directly, its symlinks resolved inside it.
    Tree {
        dir: String,
        /// Found at the GPU operator's driver root, not configured.
        detected: bool,
    },
}

impl DriverSource {
    /// The source for the config's `gpu` setting: a configured driver root
    /// (`/` is the host's own driver), else the GPU operator's driver root
    /// when it holds a driver for `arch`, else the loader cache.
    pub fn choose(root: &Root, gpu: &Gpu, arch: Option<Arch>) -> DriverSource {
        match &gpu.driver_root {
            Some(dir) if dir == Path::new("/") => DriverSource::LoaderCache,
            Some(dir) => DriverSource::Tree {
                dir: dir.to_string_lossy().trim_end_matches('/').to_string(),
                detected: false,
            },
            None => {
                let operator = DriverSource::Tree {
                    dir: host::OPERATOR_DRIVER_ROOT.to_string(),
                    detected: true,
                };
                let holds = arch.is_some_and(|arch| {
                    let libs = operator.scan(root, arch);
                    libs.native.iter().any(|l| {
                        ["libnvidia-ml.so.1", "libcuda.so.1"]
                            .iter()
                            .any(|soname| l.ends_with(&format!("/{soname}")))
                    })
                });
                if holds {
                    operator
                } else {
                    DriverSource::LoaderCache
                }
            }
        }
    }

    /// How the libraries were found, for messages.
    pub fn describe(&self) -> String {
        match self {
            DriverSource::LoaderCache => "ldconfig -p".to_string(),
            DriverSource::Tree {
                dir,
                detected: true,
            } => format!("the driver root {dir} (the GPU operator's, detected)"),
            DriverSource::Tree {
                dir,
                detected: false,
            } => format!("the driver root {dir} (gpu.driver_root)"),
        }
    }

    /// The root of the driver's tree, host-absolute (`/` for the host's).
    pub fn tree(&self) -> &str {
        match self {
            DriverSource::LoaderCache => "/",
            DriverSource::Tree { dir, .. } => dir,
        }
    }

    /// `path` (host-absolute) as seen from the driver's tree: `/x` for
    /// `<tree>/x`; `None` outside the tree.
    fn inner<'a>(&self, path: &'a str) -> Option<&'a str> {
        match self {
            DriverSource::LoaderCache => Some(path),
            DriverSource::Tree { dir, .. } => path
                .strip_prefix(dir.as_str())
                .filter(|rest| rest.is_empty() || rest.starts_with('/')),
        }
    }

    /// A path the driver's tree names (a wrapper script's target), as a
    /// host path.
    pub fn outer(&self, inner: &str) -> String {
        match self {
            DriverSource::LoaderCache => inner.to_string(),
            DriverSource::Tree { dir, .. } => format!("{dir}{inner}"),
        }
    }

    /// Resolves a host-absolute `path` inside the driver's tree (symlinks
    /// followed as if the tree were `/`), to a host-absolute path; `None`
    /// when it does not exist, loops or is outside the tree.
    pub fn resolve(&self, root: &Root, path: &str) -> Option<String> {
        let inner = self.inner(path)?;
        match self {
            DriverSource::LoaderCache => resolve_in_root(root, inner),
            DriverSource::Tree { dir, .. } => {
                let tree = Root::new(root.join(dir));
                let resolved = resolve_in_root(&tree, if inner.is_empty() { "/" } else { inner })?;
                Some(if resolved == "/" {
                    dir.clone()
                } else {
                    format!("{dir}{resolved}")
                })
            }
        }
    }

    /// [`DriverSource::resolve`], kept only when the result is a file.
    pub fn resolve_file(&self, root: &Root, path: &str) -> Option<String> {
        self.resolve(root, path).filter(|f| root.join(f).is_file())
    }

    /// The driver libraries in the tree's library directories, split by
    /// their ELF headers into `arch`'s and (amd64) 32-bit ones, as the
    /// host paths they were found at (links included), in search order.
    /// Empty for the loader cache.
    pub fn scan(&self, root: &Root, arch: Arch) -> DriverLibraries {
        let mut libs = DriverLibraries::default();
        let DriverSource::Tree { dir, .. } = self else {
            return libs;
        };
        let mut seen = BTreeSet::new();
        for rel in TREE_LIBRARY_DIRS {
            let rel = rel.replace("{triplet}", arch.triplet());
            for sub in [rel.clone(), format!("{rel}/vdpau")] {
                let listed_dir = format!("{dir}/{sub}");
                // lib -> usr/lib: one directory reached twice is read once
                let Some(real_dir) = self.resolve(root, &listed_dir) else {
                    continue;
                };
                if !seen.insert(real_dir) {
                    continue;
                }
                let Ok(entries) = std::fs::read_dir(root.join(&listed_dir)) else {
                    continue;
                };
                let mut names: Vec<String> = entries
                    .filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| is_driver_library(n))
                    .collect();
                names.sort();
                for name in names {
                    let listed = format!("{listed_dir}/{name}");
                    let Some(file) = self.resolve_file(root, &listed) else {
                        continue;
                    };
                    match read_elf(&root.join(&file)) {
                        Some(e) if arch.is_native(e) => libs.native.push(listed),
                        Some(e) if arch.is_i386(e) => libs.i386.push(listed),
                        _ => {}
                    }
                }
            }
        }
        libs
    }

    /// The driver's libraries of `arch`: from `ldconfig` (called only for
    /// the loader cache) or the tree's scan.
    pub fn libraries(
        &self,
        root: &Root,
        arch: Arch,
        ldconfig: impl FnOnce() -> Result<String, GpuError>,
    ) -> Result<DriverLibraries, GpuError> {
        match self {
            DriverSource::LoaderCache => Ok(parse_ldconfig(&ldconfig()?, arch)),
            DriverSource::Tree { .. } => Ok(self.scan(root, arch)),
        }
    }

    /// The directories of the files `libraries` resolve to, sorted and
    /// deduplicated; a library that does not resolve to a file is left
    /// out.
    pub fn library_dirs(&self, root: &Root, libraries: &[String]) -> Vec<String> {
        let mut dirs = BTreeSet::new();
        for lib in libraries {
            let Some(file) = self.resolve_file(root, lib) else {
                continue;
            };
            if let Some(dir) = Path::new(&file).parent() {
                dirs.insert(dir.to_string_lossy().into_owned());
            }
        }
        dirs.into_iter().collect()
    }
}

/// The NVIDIA libraries of one listing for one architecture, as the host
/// paths it names.
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

/// The directories of the files `libraries` (from the loader cache)
/// resolve to under the root, sorted and deduplicated.
pub fn library_dirs(root: &Root, libraries: &[String]) -> Vec<String> {
    DriverSource::LoaderCache.library_dirs(root, libraries)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::gpu::tests::{fixture, materialize};

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
    }

    fn gpu(driver_root: Option<&str>) -> Gpu {
        Gpu {
            mode: crate::config::GpuMode::Auto,
            driver_root: driver_root.map(Into::into),
        }
    }

    #[test]
    fn a_driver_tree_is_searched_and_its_objects_sorted_by_elf_header() {
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        // nothing mounted at the operator's root: the loader cache
        assert_eq!(
            DriverSource::choose(&root, &gpu(None), Some(Arch::Amd64)),
            DriverSource::LoaderCache
        );
        let tree = root.join("run/nvidia/driver");
        let lib = tree.join("usr/lib/x86_64-linux-gnu");
        crate::render::gpu::write_elf(&lib.join("libcuda.so.580.1"), true, 62);
        crate::render::gpu::write_elf(&lib.join("libnvidia-ml.so.580.1"), true, 62);
        crate::render::gpu::write_elf(&lib.join("vdpau/libvdpau_nvidia.so.580.1"), true, 62);
        crate::render::gpu::write_elf(
            &tree.join("usr/lib/i386-linux-gnu/libcuda.so.580.1"),
            false,
            3,
        );
        // an arm64 object, a non-ELF file and a non-driver library: none
        crate::render::gpu::write_elf(&lib.join("libnvidia-tls.so.580.1"), true, 183);
        std::fs::write(lib.join("libnvidia-fake.so.1"), b"text").unwrap();
        crate::render::gpu::write_elf(&lib.join("libc.so.6"), true, 62);
        // the soname link is absolute: it means the tree's file
        std::os::unix::fs::symlink(
            "/usr/lib/x86_64-linux-gnu/libcuda.so.580.1",
            lib.join("libcuda.so.1"),
        )
        .unwrap();
        // usrmerge: lib -> usr/lib is read once
        std::os::unix::fs::symlink("usr/lib", tree.join("lib")).unwrap();
        let source = DriverSource::choose(&root, &gpu(None), Some(Arch::Amd64));
        assert_eq!(
            source,
            DriverSource::Tree {
                dir: "/run/nvidia/driver".into(),
                detected: true
            }
        );
        let libs = source.scan(&root, Arch::Amd64);
        let l = "/run/nvidia/driver/usr/lib/x86_64-linux-gnu";
        assert_eq!(
            libs.native,
            [
                format!("{l}/libcuda.so.1"),
                format!("{l}/libcuda.so.580.1"),
                format!("{l}/libnvidia-ml.so.580.1"),
                format!("{l}/vdpau/libvdpau_nvidia.so.580.1"),
            ]
        );
        assert_eq!(
            libs.i386,
            ["/run/nvidia/driver/usr/lib/i386-linux-gnu/libcuda.so.580.1"]
        );
        assert_eq!(
            source
                .resolve_file(&root, &format!("{l}/libcuda.so.1"))
                .as_deref(),
            Some("/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.580.1")
        );
        assert_eq!(
            source.library_dirs(&root, &libs.native),
            [l.to_string(), format!("{l}/vdpau")]
        );
        // a path outside the tree is not the tree's
        assert_eq!(source.resolve(&root, "/usr/lib/x86_64-linux-gnu"), None);
        // "/" is the host's own driver whatever is mounted there
        assert_eq!(
            DriverSource::choose(&root, &gpu(Some("/")), Some(Arch::Amd64)),
            DriverSource::LoaderCache
        );
        // a configured root is used as it is (and is not "detected")
        assert_eq!(
            DriverSource::choose(&root, &gpu(Some("/opt/driver/")), Some(Arch::Amd64)),
            DriverSource::Tree {
                dir: "/opt/driver".into(),
                detected: false
            }
        );
        // an arm64 host finds no driver of its own there
        assert_eq!(
            DriverSource::choose(&root, &gpu(None), Some(Arch::Arm64)),
            DriverSource::LoaderCache
        );
    }
}
