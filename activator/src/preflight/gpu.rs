//! GPU checks: run when the config binds GPUs (`"gpu"` not `off`) and the
//! host has an NVIDIA GPU device node (`/dev/nvidia<N>`), or must have one
//! (`"gpu": "on"`).
//!
//! Here: `gpu-driver` (the NVIDIA kernel driver is loaded:
//! `/proc/driver/nvidia/version`) and `gpu-nvidiactl` (`/dev/nvidiactl` is a
//! character device). The place for the GPU work (issue 17) to add the
//! checks that need more than files: `libnvidia-ml` known to `ldconfig`
//! (through `gpu::run_ldconfig`) and the persistence daemon — one function
//! per check returning a [`Finding`], listed in [`checks`].

use super::{is_char_device, read, Finding, Status};
use crate::config::GpuMode;
use crate::paths::Root;

pub fn checks(root: &Root, mode: GpuMode) -> Vec<Finding> {
    let has_gpu = crate::gpu::discover_devices(root).is_ok_and(|d| !d.is_empty());
    let wanted = match mode {
        GpuMode::Off => false,
        GpuMode::On => true,
        GpuMode::Auto => has_gpu,
    };
    if !wanted {
        return Vec::new();
    }
    vec![driver(root), nvidiactl(root)]
}

fn driver(root: &Root) -> Finding {
    let needed = "the NVIDIA kernel driver loaded";
    let path = root.join("proc/driver/nvidia/version");
    match read(&path) {
        Some(text) => {
            let line = text.lines().next().unwrap_or("").trim();
            Finding::new("gpu-driver", Status::Pass, line, needed)
        }
        None => Finding::new(
            "gpu-driver",
            Status::Fail,
            "/proc/driver/nvidia/version missing",
            needed,
        )
        .hint(
            "install and load the host's NVIDIA driver (the node binds its devices and libraries)",
        ),
    }
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
