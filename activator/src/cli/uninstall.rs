//! `kubeslot-activator uninstall`: take kubeslot off the host (see
//! [`kubeslot_activator::host::uninstall`]). Runs the real systemd tools.

use kubeslot_activator::activate::report::exit;
use kubeslot_activator::host::uninstall::{self, Options, UninstallError};
use kubeslot_activator::lock::LockError;
use kubeslot_activator::systemd::SystemCtl;
use kubeslot_image::error_chain;

use super::{Failed, HostArgs};

/// Stop and remove kubeslot's node machines and everything the activator
/// wrote.
///
/// Stops and disables kubeslot-activator.path and .service, stops and
/// disables kubeslot's node machines (systemd-nspawn@kube1/@kube2 as
/// state.json records them), removes their trees, .nspawn files, drop-ins
/// and boot links (an overlay slot: its mount unit stopped and removed, its
/// upper dir), the layer store (/var/lib/kubeslot/layers), the render unit, the host files (/etc/kubeslot/host),
/// the host settings (/etc/sysctl.d/99-kubeslot.conf,
/// /etc/modules-load.d/kubeslot.conf; the kernel keeps the values until the
/// next boot), runs daemon-reload, then removes /var/lib/kubeslot (content
/// store, state, reports) except /var/lib/kubeslot/node (the kubelet's
/// identity and containerd's image cache) unless --purge; --purge then
/// removes /etc/kubeslot too (the config, trust keys and the bootstrap
/// token or exec credential), and says so.
///
/// A machine `adopt` took over is left as it is (tree, .nspawn, drop-in,
/// running or not) unless --remove-adopted. A kube1/kube2 machine the
/// state has no record of (another tool's node) refuses the uninstall,
/// naming it, before anything changes, unless --remove-unmanaged.
///
/// The binary and the packaged unit files are left to the package
/// manager; without --purge /etc/kubeslot is kept. The packaged units
/// stay disabled, also across a reinstall of the package without purge:
/// `systemctl enable --now kubeslot-activator.path
/// kubeslot-activator.service` turns them on again. Safe to run again
/// after an interruption. --config is ignored.
///
/// With --network it also removes what the node's pod network left in the
/// host's network namespace (the machine shares it): links named cni0,
/// cbr0, flannel.*, cilium_*, vxlan0, geneve0 or wg*, and the policy
/// routing rules and routes of tables 51820-51899, except those the host
/// had at kubeslot's first activation (recorded in
/// /var/lib/kubeslot/host-network.json; without that record none is
/// removed). Without --network it only lists them: a link or rule the host
/// made itself after the first activation looks the same.
///
/// --dry-run lists the units it would stop and the paths, links and
/// routing tables it would remove, and changes nothing.
///
/// Exit codes: 0 done; 1 error (what was removed so far stays removed; run
/// it again); 3 a machine is not kubeslot's (nothing was changed); 5
/// another run holds the lock.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub host: HostArgs,
    /// Also remove /var/lib/kubeslot/node (the node gets a new identity
    /// and pulls its pod images again) and /etc/kubeslot (config, trust
    /// keys, credentials).
    #[arg(long)]
    pub purge: bool,
    /// Also stop and remove machines `adopt` took over: their trees and
    /// the other tool's .nspawn files and drop-ins.
    #[arg(long)]
    pub remove_adopted: bool,
    /// Also stop and remove kube1/kube2 machines kubeslot has no record of
    /// (another tool's nodes), instead of refusing.
    #[arg(long)]
    pub remove_unmanaged: bool,
    /// Say what would be stopped and removed; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Also remove the node's network leftovers (links, WireGuard routing
    /// tables) the host did not have at the first activation.
    #[arg(long)]
    pub network: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let opts = Options {
        purge: args.purge,
        remove_adopted: args.remove_adopted,
        remove_unmanaged: args.remove_unmanaged,
        dry_run: args.dry_run,
        network: args.network,
    };
    let done = uninstall::uninstall(&args.host.root(), &SystemCtl, &opts).map_err(|e| {
        let code = match e {
            UninstallError::Lock(LockError::Busy { .. }) => exit::BUSY,
            UninstallError::Unmanaged { .. } => exit::CONFIG,
            _ => exit::FAILED,
        };
        Failed {
            code,
            message: error_chain(&e),
        }
    })?;
    if let Some(why) = &done.state_unreadable {
        println!(
            "warning: the state cannot be read ({why}): kubeslot's machines were told apart by their rendered files"
        );
    }
    if done.dry_run {
        for u in &done.units {
            println!("would stop and disable {u}");
        }
        for p in &done.removed {
            println!("would remove {}", p.display());
        }
        for n in &done.network {
            println!("would remove the node's {n}");
        }
        print_network_left(&done);
        if let Some(why) = &done.network_note {
            println!("network: {why}");
        }
        println!("dry run: nothing was changed");
        return Ok(());
    }
    for u in &done.units {
        println!("stopped and disabled {u}");
    }
    for p in &done.removed {
        println!("removed {}", p.display());
    }
    if args.purge && done.kept_config.is_none() {
        println!("purged: the config, trust keys and credentials under /etc/kubeslot are gone");
    }
    for n in &done.network {
        println!("removed the node's {n}");
    }
    print_network_left(&done);
    if let Some(why) = &done.network_note {
        println!("network: {why}");
    }
    for (m, running) in &done.kept_adopted {
        println!(
            "kept the adopted machine {m} ({}; its tree, .nspawn file and drop-in are the other tool's; --remove-adopted removes it)",
            if *running {
                "running".to_string()
            } else {
                format!("not running: `machinectl enable --now {m}` starts it again")
            }
        );
    }
    if let Some(k) = &done.kept {
        println!(
            "kept {} (node identity, image cache; --purge removes it)",
            k.display()
        );
    }
    if let Some(k) = &done.kept_config {
        println!(
            "kept {} (config, trust keys, credentials; --purge removes it)",
            k.display()
        );
    }
    if done
        .units
        .iter()
        .any(|u| u.starts_with("kubeslot-activator"))
    {
        println!(
            "the packaged units stay disabled, also across a reinstall without purge: `systemctl enable --now kubeslot-activator.path kubeslot-activator.service` turns them on again"
        );
    }
    Ok(())
}

/// What the node's network may have left, kept without `--network`.
fn print_network_left(done: &uninstall::Uninstalled) {
    for n in &done.network_left {
        println!(
            "left {n}: the node's pod network may have made it, or the host after the first activation (--network removes it)"
        );
    }
}
