//! `kubeslot-activator uninstall`: take kubeslot off the host (see
//! [`kubeslot_activator::uninstall`]). Runs the real systemd tools.

use kubeslot_activator::lock::LockError;
use kubeslot_activator::report::exit;
use kubeslot_activator::systemd::SystemCtl;
use kubeslot_activator::uninstall::{self, UninstallError};
use kubeslot_image::error_chain;

use super::{Failed, HostArgs};

/// Stop and remove the node machines and everything the activator wrote.
///
/// Stops and disables kubeslot-activator.path and .service, stops and
/// disables systemd-nspawn@kube1 and @kube2, removes both slot trees, their
/// .nspawn files, drop-ins and boot links, the render unit, the host files
/// (/etc/kubeslot/host), the host settings (/etc/sysctl.d/99-kubeslot.conf,
/// /etc/modules-load.d/kubeslot.conf; the kernel keeps the values until the
/// next boot), runs daemon-reload, then removes /var/lib/kubeslot (content
/// store, state, reports) except /var/lib/kubeslot/node (the kubelet's
/// identity and containerd's image cache) unless --purge. The binary, the
/// packaged unit files and /etc/kubeslot (config, keys) are left to the
/// package manager and the operator. Safe to run again after an
/// interruption. --config is ignored.
///
/// Exit codes: 0 done; 1 error (what was removed so far stays removed; run
/// it again); 5 another run holds the lock.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub host: HostArgs,
    /// Also remove /var/lib/kubeslot/node: the node gets a new identity
    /// (client certificate) and pulls its pod images again.
    #[arg(long)]
    pub purge: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let done = uninstall::uninstall(&args.host.root(), &SystemCtl, args.purge).map_err(|e| {
        let code = match e {
            UninstallError::Lock(LockError::Busy { .. }) => exit::BUSY,
            _ => exit::FAILED,
        };
        Failed {
            code,
            message: error_chain(&e),
        }
    })?;
    for u in &done.units {
        println!("stopped and disabled {u}");
    }
    for p in &done.removed {
        println!("removed {}", p.display());
    }
    if let Some(k) = &done.kept {
        println!(
            "kept {} (node identity, image cache; --purge removes it)",
            k.display()
        );
    }
    Ok(())
}
