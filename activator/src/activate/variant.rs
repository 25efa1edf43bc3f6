//! Which image a host runs: the config's `gpu_image` (the NVIDIA variant)
//! when an NVIDIA GPU is on the host's PCI bus (or `"gpu": "on"` says one
//! must be), else `image`, as the seed chose its default image by GPU
//! presence. Decided once per run, before anything resolves; `plan` shows
//! the choice and why. Reads only `/sys/bus/pci/devices` under the root.

use serde::Serialize;

use crate::config::{Config, GpuMode};
use crate::paths::Root;
use crate::render::gpu::pci;

/// The variant a config with a `gpu_image` chose on this host, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Variant {
    /// The config key whose image runs: `gpu_image` or `image`.
    pub key: &'static str,
    /// Why (the GPU's PCI address, or its absence).
    pub why: String,
}

/// `config` with `image` set to the variant this host runs, and which and
/// why when the config names a `gpu_image` (`None` otherwise: `image`
/// runs, nothing to choose).
pub fn choose(root: &Root, mut config: Config) -> (Config, Option<Variant>) {
    let Some(gpu_image) = config.gpu_image.clone() else {
        return (config, None);
    };
    let plain = |why: &str| Variant {
        key: "image",
        why: why.into(),
    };
    let why = match config.gpu.mode {
        // the node gets no GPU: the NVIDIA variant has nothing to drive
        GpuMode::Off => return (config, Some(plain("\"gpu\" is \"off\""))),
        GpuMode::On => "\"gpu\" is \"on\"".to_string(),
        GpuMode::Auto => match pci::host_gpu(root) {
            Some(g) => format!("NVIDIA GPU {} on the PCI bus", g.address),
            None => return (config, Some(plain("no NVIDIA GPU on the PCI bus"))),
        },
    };
    config.image = gpu_image;
    (
        config,
        Some(Variant {
            key: "gpu_image",
            why,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::gpu::pci::fake_pci_device;

    fn config(extra: serde_json::Value) -> Config {
        let mut v = serde_json::json!({
            "image": "ghcr.io/example/node:v1",
            "kubelet": {"api_server": "https://k8s:6443"}
        });
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_gpu_image_is_chosen_by_an_nvidia_gpu_on_the_pci_bus() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let with_gpu_image =
            config(serde_json::json!({"gpu_image": "ghcr.io/example/node-nvidia:v1"}));
        let (c, why) = choose(&root, with_gpu_image.clone());
        assert_eq!(c.image.to_string(), "ghcr.io/example/node:v1");
        assert_eq!(why.unwrap().why, "no NVIDIA GPU on the PCI bus");
        // a GPU given to a VM, another vendor's, the card's audio function
        fake_pci_device(&root, "0000:02:00.0", 0x10de, 0x030200, Some("vfio-pci"));
        fake_pci_device(&root, "0000:03:00.0", 0x1002, 0x030000, Some("amdgpu"));
        fake_pci_device(&root, "0000:01:00.1", 0x10de, 0x040300, None);
        let (c, why) = choose(&root, with_gpu_image.clone());
        assert_eq!(c.image.to_string(), "ghcr.io/example/node:v1");
        assert_eq!(why.unwrap().key, "image");
        // the host's GPU, with or without its driver
        fake_pci_device(&root, "0000:01:00.0", 0x10de, 0x030200, None);
        let (c, why) = choose(&root, with_gpu_image.clone());
        assert_eq!(c.image.to_string(), "ghcr.io/example/node-nvidia:v1");
        assert_eq!(
            why,
            Some(Variant {
                key: "gpu_image",
                why: "NVIDIA GPU 0000:01:00.0 on the PCI bus".into()
            })
        );
        // "gpu": "off": the node gets no GPU, the plain image runs
        let mut off = with_gpu_image;
        off.gpu.mode = GpuMode::Off;
        let (c, why) = choose(&root, off);
        assert_eq!(c.image.to_string(), "ghcr.io/example/node:v1");
        assert_eq!(why.unwrap().key, "image");
        // without gpu_image: nothing chosen, nothing said
        let (c, why) = choose(&root, config(serde_json::json!({})));
        assert_eq!(c.image.to_string(), "ghcr.io/example/node:v1");
        assert!(why.is_none());
    }
}
