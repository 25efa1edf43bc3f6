//! NVIDIA GPUs on the PCI bus, as sysfs shows them under the root
//! (`/sys/bus/pci/devices/<address>/{vendor,class,driver}`): what preflight
//! tells "no GPU here" from "a GPU whose driver is not loaded" by, before
//! any `/dev/nvidia<N>` exists. Reads only; a missing or unreadable sysfs
//! shows no GPU.

use crate::paths::Root;

/// NVIDIA's PCI vendor id.
const NVIDIA_VENDOR: u32 = 0x10de;
/// The PCI base class of display controllers (VGA 0x0300, 3D 0x0302): a
/// GPU, not the audio or USB function on the same card.
const DISPLAY_CLASS: u32 = 0x03;

/// One NVIDIA display controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciGpu {
    /// The PCI address (`0000:01:00.0`).
    pub address: String,
    /// The kernel driver bound to it (`nvidia`, `nouveau`, `vfio-pci`), if
    /// any.
    pub driver: Option<String>,
}

impl PciGpu {
    /// What is wrong with it for a node machine, if anything: a GPU
    /// without the `nvidia` driver (none, or `nouveau`); one given to
    /// virtual machines (`vfio-pci`, `pci-stub`) is not this host's to
    /// bind.
    pub fn problem(&self) -> Option<String> {
        match self.driver.as_deref() {
            Some("nvidia") => None,
            Some("vfio-pci" | "pci-stub") => None,
            Some(other) => Some(format!("{} is driven by {other}, not nvidia", self.address)),
            None => Some(format!("{} has no driver loaded", self.address)),
        }
    }
}

fn read_hex(path: &std::path::Path) -> Option<u32> {
    let text = std::fs::read_to_string(path).ok()?;
    u32::from_str_radix(text.trim().trim_start_matches("0x"), 16).ok()
}

/// The NVIDIA display controllers under `<root>/sys/bus/pci/devices`,
/// sorted by address.
pub fn nvidia_gpus(root: &Root) -> Vec<PciGpu> {
    let Ok(entries) = std::fs::read_dir(root.pci_devices()) else {
        return Vec::new();
    };
    let mut gpus: Vec<PciGpu> = entries
        .filter_map(Result::ok)
        .filter(|e| {
            let dev = e.path();
            read_hex(&dev.join("vendor")) == Some(NVIDIA_VENDOR)
                && read_hex(&dev.join("class")).is_some_and(|c| c >> 16 == DISPLAY_CLASS)
        })
        .map(|e| PciGpu {
            address: e.file_name().to_string_lossy().into_owned(),
            driver: std::fs::read_link(e.path().join("driver"))
                .ok()
                .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned())),
        })
        .collect();
    gpus.sort_by(|a, b| a.address.cmp(&b.address));
    gpus
}

/// The first NVIDIA GPU on the PCI bus that is this host's (one given to
/// virtual machines, `vfio-pci` or `pci-stub`, is not): what chooses the
/// `gpu_image` variant and the `gpu-image` preflight check.
pub fn host_gpu(root: &Root) -> Option<PciGpu> {
    nvidia_gpus(root)
        .into_iter()
        .find(|g| !matches!(g.driver.as_deref(), Some("vfio-pci" | "pci-stub")))
}

/// Test helper: a PCI device under `<root>/sys/bus/pci/devices/<address>`
/// as sysfs shows it (vendor, class, and the driver link when bound).
#[cfg(test)]
pub(crate) fn fake_pci_device(
    root: &Root,
    address: &str,
    vendor: u32,
    class: u32,
    driver: Option<&str>,
) {
    let dev = root.pci_devices().join(address);
    std::fs::create_dir_all(&dev).unwrap();
    std::fs::write(dev.join("vendor"), format!("0x{vendor:04x}\n")).unwrap();
    std::fs::write(dev.join("class"), format!("0x{class:06x}\n")).unwrap();
    if let Some(d) = driver {
        let drivers = root.join("sys/bus/pci/drivers").join(d);
        std::fs::create_dir_all(&drivers).unwrap();
        std::os::unix::fs::symlink(&drivers, dev.join("driver")).unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_nvidia_display_controllers_count() {
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        assert!(nvidia_gpus(&root).is_empty(), "no sysfs: no GPU");
        fake_pci_device(&root, "0000:41:00.0", 0x10de, 0x030200, Some("nvidia"));
        fake_pci_device(&root, "0000:01:00.0", 0x10de, 0x030000, None);
        // the card's audio function, another vendor's GPU
        fake_pci_device(
            &root,
            "0000:01:00.1",
            0x10de,
            0x040300,
            Some("snd_hda_intel"),
        );
        fake_pci_device(&root, "0000:02:00.0", 0x1002, 0x030000, Some("amdgpu"));
        assert_eq!(
            nvidia_gpus(&root),
            [
                PciGpu {
                    address: "0000:01:00.0".into(),
                    driver: None
                },
                PciGpu {
                    address: "0000:41:00.0".into(),
                    driver: Some("nvidia".into())
                }
            ]
        );
    }
}
