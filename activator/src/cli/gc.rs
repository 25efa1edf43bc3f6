//! `kubeslot-activator gc`: garbage collection of the content store and the
//! layer store (see [`kubeslot_activator::host::gc`]), under the run lock.

use kubeslot_activator::activate::report::exit;
use kubeslot_activator::host::gc;
use kubeslot_activator::lock::Lock;
use kubeslot_activator::state::State;

use super::{Failed, HostArgs};

/// Remove the blobs, partial downloads, layer directories and offline
/// bundle copies neither slot needs.
///
/// Keeps every blob the two slots' images (and a pending flip's) reference
/// — their platform manifests, configs and layers, read from the store —
/// and the layer directories either slot's mount unit names (and the
/// bundle copies in /var/lib/kubeslot/bundles either slot's .nspawn file
/// binds); removes the rest and partial downloads no running fetch holds. When a slot's image
/// cannot be read from the store, every blob is kept (and the output says
/// why). `activate` runs the same collection after each commit. Takes the
/// run lock: exit 5 while another run holds it.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub host: HostArgs,
    /// Only list what would be removed; remove nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print what was (or would be) removed and kept as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let root = args.host.root();
    let _lock = Lock::try_exclusive(&root).map_err(|e| Failed {
        code: exit::BUSY,
        message: e.to_string(),
    })?;
    let state = State::load_repairing(&root)?;
    let report = gc::collect(&root, &state, args.dry_run)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for d in &report.removed_blobs {
            println!("blob {d}");
        }
        for p in report
            .removed_partials
            .iter()
            .chain(&report.removed_layers)
            .chain(&report.removed_bundles)
        {
            println!("{}", p.display());
        }
        println!("{}", report.summary());
    }
    Ok(())
}
