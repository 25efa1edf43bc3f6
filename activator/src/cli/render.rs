//! `kubeslot-activator render [--root DIR] [--config FILE] <machine>`: gather
//! the host facts, render a node machine's host files, write what changed and
//! `daemon-reload` when a unit file or drop-in changed.
//!
//! Run by `kubeslot-render@<machine>.service` before every start of the
//! machine (device lists change across reboots). Given the arguments, it
//! calls [`kubeslot_activator::render`] and the systemd boundary. It fetches
//! nothing, takes no run lock (an activation holding the lock waits for this unit)
//! and never touches the slot tree or the state.

use std::path::PathBuf;

use anyhow::Context as _;
use kubeslot_activator::activate::report::exit;
use kubeslot_activator::config::Config;
use kubeslot_activator::paths::Root;
use kubeslot_activator::render;
use kubeslot_activator::slot::Slot;
use kubeslot_activator::systemd::{SystemCtl, Systemd};
use kubeslot_image::error_chain;

use super::Failed;

/// Re-render a node machine's host files and reload systemd if a unit changed.
///
/// Writes /etc/systemd/nspawn/<machine>.nspawn, the drop-in
/// /etc/systemd/system/systemd-nspawn@<machine>.service.d/override.conf, the
/// render unit, and the kubelet files in /etc/kubeslot/host/<machine>/
/// (kubeconfig, cluster CA, kubelet drop-in, resolv.conf, hostname), binding
/// every GPU device and extra device present now. Only files whose content
/// or mode differ are rewritten (each atomically); stale files of the
/// machine's host-files dir are removed; `systemctl daemon-reload` runs only
/// when a unit file or drop-in changed. Nothing is downloaded and the slot
/// tree is not touched. The systemd unit kubeslot-render@<machine>.service
/// runs this before every start of the machine.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Make every host path relative to DIR (devices, CA file, resolv.conf,
    /// the files written). `systemctl` is still the one on PATH.
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub root: PathBuf,
    /// Activator config (JSON). Default: the config the machine was last
    /// activated with (DIR/var/lib/kubeslot/slots/<machine>.json) when it
    /// exists, else DIR/etc/kubeslot/activator.json.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The node machine: kube1 or kube2.
    pub machine: Slot,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let root = Root::new(&args.root);
    let slot = args.machine;
    let machine = slot.machine();
    let config_path = match args.config {
        Some(p) => p,
        None => {
            let inputs = root.slot_inputs(machine);
            if inputs.exists() {
                inputs
            } else {
                root.default_config()
            }
        }
    };
    // A config that cannot be read, or names host facts that cannot be
    // gathered, is exit 3 as for `activate`: the unit fails with a code
    // that says "fix the config or the host", not "retry".
    let unusable = |e: String| Failed {
        code: exit::CONFIG,
        message: format!("render {machine}: {e}"),
    };
    let config = Config::load(&config_path).map_err(|e| unusable(error_chain(&e)))?;
    let facts = render::gather(&root, &config).map_err(|e| {
        unusable(format!(
            "config {}: gathering host facts: {}",
            config_path.display(),
            error_chain(&e)
        ))
    })?;
    let files = render::render(&config, slot, &facts);
    let outcome =
        render::write(&root, &files).with_context(|| format!("render {machine}: writing"))?;
    if outcome.changed.is_empty() {
        println!("{machine}: host files unchanged");
    }
    for p in &outcome.changed {
        let verb = if root.dir().join(p).exists() {
            "wrote"
        } else {
            "removed"
        };
        println!("{machine}: {verb} {}", p.display());
    }
    if outcome.dropin_changed {
        SystemCtl
            .daemon_reload()
            .with_context(|| format!("render {machine}: a unit file changed"))?;
        println!("{machine}: systemctl daemon-reload (a unit file or drop-in changed)");
    }
    Ok(())
}
