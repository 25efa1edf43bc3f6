//! `kubeslot-activator preflight`: the checks `activate` runs before every
//! flip, printed (kubeadm style or `--json`), changing nothing. Given the
//! arguments; calls [`kubeslot_activator::gate::preflight::run`].

use kubeslot_activator::activate;
use kubeslot_activator::activate::report::exit;
use kubeslot_activator::config::{Config, Gpu, SlotMode};
use kubeslot_activator::gate::preflight::{self, Inputs};
use kubeslot_activator::render::gpu::Discovery;
use kubeslot_activator::render::host_settings;
use kubeslot_activator::slots::overlay;
use kubeslot_image::error_chain;

use super::{Failed, HostArgs};

/// Check that this host can run node machines, changing nothing.
///
/// Runs the checks `activate` runs before every flip and prints each with
/// its verdict (PASS, WARN, FAIL or IGNORED), the value seen and the value
/// needed: systemd and systemd-container, cgroup v2 and its controllers,
/// the overlay and br_netfilter modules, the kernel parameters the kubelet
/// needs (sysctl-*), swap, free space under /var/lib/machines, /dev/kmsg,
/// other container engines, and with GPUs the NVIDIA driver (and a warning,
/// gpu-image, when the config names no "gpu_image" on a GPU host). Reads /proc,
/// /sys and /dev under --root. overlay-slots (unless slots.mode is "copy")
/// mounts a scratch overlay in /var/lib/kubeslot/layers and removes it: a
/// whiteout device, an opaque dir and a write through the mount must work
/// (it warns when slots would fall back to copy, fails for an explicit
/// "overlay"). With a readable config, its
/// "preflight.ignore" list applies and the image is resolved (no layer is
/// fetched; registries get 30 s) to work out the space it needs: the blobs
/// the content store lacks plus the unpacked tree, nothing when the slot
/// the next flip uses holds the image already. Before the first `activate`
/// the kernel parameters it sets are not applied yet: those checks warn
/// instead of failing.
///
/// Exit codes: 0 nothing failed (or every failure is ignored); 3 a check
/// failed; 1 the config cannot be read.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub host: HostArgs,
    /// Print {"passed": bool, "checks": [{name, status, seen, needed, hint,
    /// ignored}]} as JSON.
    #[arg(long)]
    pub json: bool,
    /// Do not fail on this check (repeatable): a name, a prefix ending in
    /// '*' (sysctl-*) or "all". Added to the config's "preflight.ignore".
    #[arg(long, value_name = "NAME")]
    pub ignore: Vec<String>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let root = args.host.root();
    let path = args.host.config_path();
    let mut inputs = Inputs {
        gpu: Default::default(),
        ignore: args.ignore.clone(),
        disk: Default::default(),
        swap_allowed: None,
        settings_pending: !host_settings::diff(&root).is_empty(),
        image: None,
    };
    let mut gpu = Gpu::default();
    let mut slot_mode = None;
    if path.exists() {
        let config = Config::load(&path).map_err(|e| Failed {
            code: exit::CONFIG,
            message: error_chain(&e),
        })?;
        // the variant this host runs (gpu_image on a GPU host)
        let (config, _) = activate::variant::choose(&root, config);
        inputs.image = Some(preflight::ImageChoice::of(&config));
        gpu = config.gpu.clone();
        inputs.swap_allowed = config.kubelet_allows_swap();
        slot_mode = config.slots.mode;
        inputs
            .ignore
            .extend(config.preflight.ignore.iter().cloned());
        match activate::disk_use(&root, &config) {
            Ok(disk) => inputs.disk = disk,
            // the disk-space check then says the size is unknown
            Err(e) => eprintln!("preflight: image size unknown: {}", error_chain(&e)),
        }
    }
    // the GPUs read once, for the config's setting (auto without one)
    inputs.gpu = Discovery::read(&root, &gpu);
    let mut result = preflight::run(&root, &inputs);
    // The one check that writes and mounts (a scratch overlay in the layer
    // store, removed): not for a copy-mode config.
    let probe = (slot_mode != Some(SlotMode::Copy)).then(|| overlay::probe(&root));
    let mut slots = preflight::overlay_slots(slot_mode, probe.as_ref());
    slots.ignored = slots.status == preflight::Status::Fail
        && preflight::is_ignored(&slots.name, &inputs.ignore);
    result.checks.push(slots);
    if args.json {
        let v = serde_json::json!({"passed": result.passed(), "checks": result.checks});
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{result}");
    }
    if result.passed() {
        return Ok(());
    }
    Err(Failed {
        code: exit::CONFIG,
        message: format!(
            "preflight: {} check(s) failed: {}",
            result.blocking().len(),
            result.failure_summary()
        ),
    }
    .into())
}
