//! Which image a host runs: the config's `gpu_image` (the NVIDIA variant)
//! when an NVIDIA GPU is on the host's PCI bus, else `image`, as the seed
//! chose its default image by GPU presence. Decided once per run, before
//! anything resolves; `plan` shows the choice and why.

use crate::config::Config;
use crate::paths::Root;
use crate::render::gpu::pci;

/// `config` with `image` set to the variant this host runs, and why, when
/// the config names a `gpu_image` (nothing to say otherwise).
pub fn choose(root: &Root, mut config: Config) -> (Config, Option<String>) {
    let Some(gpu_image) = config.gpu_image.clone() else {
        return (config, None);
    };
    // a GPU given to virtual machines (vfio-pci, pci-stub) is not this host's
    let gpu = pci::nvidia_gpus(root)
        .into_iter()
        .find(|g| !matches!(g.driver.as_deref(), Some("vfio-pci" | "pci-stub")));
    match gpu {
        Some(g) => {
            config.image = gpu_image;
            (
                config,
                Some(format!("gpu_image: NVIDIA GPU {} on the PCI bus", g.address)),
            )
        }
        None => (config, Some("image: no NVIDIA GPU on the PCI bus".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gpu_image_is_chosen_by_an_nvidia_gpu_on_the_pci_bus() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let config: Config = serde_json::from_value(serde_json::json!({
            "image": "ghcr.io/example/node:v1",
            "gpu_image": "ghcr.io/example/node-nvidia:v1",
            "kubelet": {"api_server": "https://k8s:6443"}
        }))
        .unwrap();
        let (c, why) = choose(&root, config.clone());
        assert_eq!(c.image.to_string(), "ghcr.io/example/node:v1");
        assert_eq!(why.as_deref(), Some("image: no NVIDIA GPU on the PCI bus"));
        let dev = root.pci_devices().join("0000:01:00.0");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("vendor"), "0x10de\n").unwrap();
        std::fs::write(dev.join("class"), "0x030200\n").unwrap();
        let (c, why) = choose(&root, config.clone());
        assert_eq!(c.image.to_string(), "ghcr.io/example/node-nvidia:v1");
        assert_eq!(
            why.as_deref(),
            Some("gpu_image: NVIDIA GPU 0000:01:00.0 on the PCI bus")
        );
        // without gpu_image: nothing chosen, nothing said
        let mut plain = config;
        plain.gpu_image = None;
        let (c, why) = choose(&root, plain);
        assert_eq!(c.image.to_string(), "ghcr.io/example/node:v1");
        assert!(why.is_none());
    }
}
