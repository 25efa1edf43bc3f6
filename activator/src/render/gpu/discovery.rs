//! The host's GPUs read once per run: what the render binds and what the
//! preflight checks are both taken from one [`Discovery`], so the two
//! never see two different hosts (a driver loaded between two reads) and
//! `ldconfig -p` runs at most once.
//!
//! Given the root handle and the config's `gpu` setting; reads devices,
//! device directories, sysfs, the driver's libraries and tools, nothing
//! else. What is wrong with what it found is the preflight's to say, what
//! a machine gets bound is [`Discovery::binds`].

use std::path::PathBuf;

use super::pci::{self, PciGpu};
use super::{
    discover_device_dirs, discover_devices, tools, Arch, DeviceDir, DriverLibraries, DriverSource,
    DriverTools, GpuBinds, GpuError,
};
use crate::config::{Gpu, GpuMode};
use crate::paths::Root;

/// What the host has for GPUs under the config's `gpu` setting.
#[derive(Clone, Debug)]
pub struct Discovery {
    /// The setting it was read for (`mode`, `driver_root`).
    pub setting: Gpu,
    /// This binary's architecture (`None`: no libraries or tools bound).
    pub arch: Option<Arch>,
    /// `<root>/dev`, named when `"gpu": "on"` finds no GPU there.
    pub dev: PathBuf,
    /// The NVIDIA and DRI device nodes (empty: no `/dev/nvidia<N>`), or
    /// why `/dev` could not be read.
    pub devices: Result<Vec<String>, GpuError>,
    /// The device directories present (looked at only with a GPU).
    pub device_dirs: Vec<DeviceDir>,
    /// The NVIDIA GPUs on the PCI bus.
    pub pci: Vec<PciGpu>,
    /// Where the driver's libraries are looked up.
    pub source: DriverSource,
    /// The driver's libraries, listed once for a host that has a GPU (or a
    /// GPU on the bus without its driver), or must have one; `None`
    /// otherwise and on an architecture without NVIDIA libraries.
    pub libraries: Option<Result<DriverLibraries, GpuError>>,
    /// The directories the native and the 32-bit libraries resolve to.
    pub library_dirs: Vec<String>,
    pub library_dirs_32: Vec<String>,
    /// The driver's tools beside them (with the libraries listed).
    pub tools: Option<DriverTools>,
}

impl Default for Discovery {
    /// GPUs off: nothing read, nothing bound, nothing checked.
    fn default() -> Self {
        Discovery {
            setting: Gpu {
                mode: GpuMode::Off,
                driver_root: None,
            },
            arch: None,
            dev: PathBuf::new(),
            devices: Ok(Vec::new()),
            device_dirs: Vec::new(),
            pci: Vec::new(),
            source: DriverSource::LoaderCache,
            libraries: None,
            library_dirs: Vec::new(),
            library_dirs_32: Vec::new(),
            tools: None,
        }
    }
}

impl Discovery {
    /// Reads the host under `root` for `setting` (the host's own
    /// architecture, its `ldconfig -p`).
    pub fn read(root: &Root, setting: &Gpu) -> Discovery {
        Discovery::read_with(root, setting, Arch::host(), || super::run_ldconfig(root))
    }

    /// [`Discovery::read`] with the architecture and the `ldconfig -p`
    /// listing handed in (tests give a recorded or a fake one; it is
    /// called at most once, and only when the libraries are looked up).
    pub fn read_with(
        root: &Root,
        setting: &Gpu,
        arch: Option<Arch>,
        ldconfig: impl FnOnce() -> Result<String, GpuError>,
    ) -> Discovery {
        let mut d = Discovery {
            setting: setting.clone(),
            arch,
            dev: root.dev(),
            ..Discovery::default()
        };
        if setting.mode == GpuMode::Off {
            return d;
        }
        d.devices = discover_devices(root);
        d.pci = pci::nvidia_gpus(root);
        let has_gpu = d.has_gpu();
        if has_gpu {
            d.device_dirs = discover_device_dirs(root);
        }
        d.source = DriverSource::choose(root, setting, arch);
        let wanted =
            setting.mode == GpuMode::On || has_gpu || d.pci.iter().any(|g| g.problem().is_some());
        let Some(arch) = arch.filter(|_| wanted) else {
            return d;
        };
        let libs = d.source.libraries(root, arch, ldconfig);
        if let Ok(libs) = &libs {
            d.library_dirs = d.source.library_dirs(root, &libs.native);
            d.library_dirs_32 = d.source.library_dirs(root, &libs.i386);
            let all: Vec<String> = d
                .library_dirs
                .iter()
                .chain(&d.library_dirs_32)
                .cloned()
                .collect();
            d.tools = Some(tools::find(root, &d.source, &all, arch));
        }
        d.libraries = Some(libs);
        d
    }

    /// The host has an NVIDIA GPU device node (`/dev/nvidia<N>`).
    pub fn has_gpu(&self) -> bool {
        self.devices.as_ref().is_ok_and(|d| !d.is_empty())
    }

    /// What a machine gets bound for its GPUs: nothing with `"gpu": "off"`
    /// or without a GPU (an error with `"on"`), else its devices, device
    /// directories and, on an architecture with NVIDIA libraries, the
    /// driver's library directories and tools.
    pub fn binds(&self) -> Result<GpuBinds, GpuError> {
        if self.setting.mode == GpuMode::Off {
            return Ok(GpuBinds::default());
        }
        let devices = self.devices.clone()?;
        if devices.is_empty() {
            if self.setting.mode == GpuMode::On {
                return Err(GpuError::Required {
                    dev: self.dev.clone(),
                });
            }
            return Ok(GpuBinds::default());
        }
        let mut binds = GpuBinds {
            devices,
            device_dirs: self.device_dirs.clone(),
            ..GpuBinds::default()
        };
        if let Some(libs) = &self.libraries {
            libs.as_ref().map_err(Clone::clone)?;
            binds.library_dirs = self.library_dirs.clone();
            binds.library_dirs_32 = self.library_dirs_32.clone();
            binds.tools = self.tools.clone().unwrap_or_default();
        }
        Ok(binds)
    }
}
