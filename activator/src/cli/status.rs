//! `kubeslot-activator status`: the slot state, which node machines run
//! (asked of systemd and machined), the cluster's view (the metrics file
//! of the config's `cluster` section) and the last report, read without
//! the lock and without writing.

use kubeslot_activator::activate::report::Report;
use kubeslot_activator::cluster::report::{read_metrics, View};
use kubeslot_activator::config::Config;
use kubeslot_activator::slot::Slot;
use kubeslot_activator::state::State;
use kubeslot_activator::systemd::{SystemCtl, Systemd};

use super::HostArgs;

/// Show the active slot, each slot's image digest and status, which node
/// machines run, a pending flip, the images marked bad, and the last run's
/// report.
///
/// A machine that runs but is not the committed node (started by hand or
/// by another tool) is flagged: `activate` and `fetch` refuse until it is
/// stopped. Writes nothing: a state whose save died between its writes
/// (state written, sidecar not) is shown with the repair the next
/// activate/fetch/rollback makes.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub host: HostArgs,
    /// Print {"state": ..., "running": [...], "cluster": ..., "report": ...,
    /// "repair": ...} as JSON ("repair" only when the sidecar awaits one;
    /// "running" is replaced by "running_error" when systemd cannot be
    /// asked; "cluster", what the metrics file says, only with
    /// `cluster.metrics_file` in the config).
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let root = args.host.root();
    let report = Report::load(&root);
    // A state that cannot be trusted is an error, but the last report still
    // tells the operator what happened. A save that died between its two
    // writes is shown with the repair the next locked run makes (status
    // writes nothing).
    let (state, repair) = match State::load_torn(&root) {
        Ok(s) => s,
        Err(e) => {
            if let Some(r) = &report {
                eprint!("{}", r.to_text());
            }
            return Err(e.into());
        }
    };
    let running = running_machines(&SystemCtl);
    let cluster = cluster_view(&args.host);
    if args.json {
        let mut v = serde_json::json!({ "state": state, "report": report });
        if let Some(r) = &repair {
            v["repair"] = r.clone().into();
        }
        if let Some(c) = &cluster {
            v["cluster"] = c.clone();
        }
        match &running {
            Ok(r) => v["running"] = serde_json::json!(r),
            Err(e) => v["running_error"] = e.clone().into(),
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    if let Some(r) = &repair {
        println!("repair pending: {r}");
    }
    match state.active {
        Some(a) => println!("active: {a}"),
        None => println!("active: none"),
    }
    for slot in Slot::ALL {
        let s = state.slot(slot);
        println!(
            "  {slot}: {}{}{}",
            s.status,
            s.digest.map_or(String::new(), |d| format!(" {d}")),
            if s.adopted {
                " (adopted: set up by another tool, not verified)"
            } else {
                ""
            }
        );
    }
    match &running {
        Ok(r) if r.is_empty() => println!("running: none"),
        Ok(r) => {
            let names: Vec<String> = r.iter().map(Slot::to_string).collect();
            println!("running: {}", names.join(", "));
            for m in r.iter().filter(|m| Some(**m) != state.active) {
                println!(
                    "warning: machine {m} runs but is not the committed node ({}): activate and fetch refuse until it is stopped",
                    state.active.map_or("none".to_string(), |a| a.to_string())
                );
            }
        }
        Err(e) => println!("running: unknown ({e})"),
    }
    if let Some(p) = &state.pending {
        println!(
            "pending: {} {} to {} ({})",
            p.kind,
            p.phase,
            p.to,
            p.digest
                .map_or_else(|| "adopted tree".to_string(), |d| d.to_string())
        );
    }
    for b in &state.bad {
        println!("bad: {} at {}: {}", b.digest, b.at, b.reason);
    }
    for r in state.releases.values() {
        println!(
            "newest release of {}: {} (created {}; older images are refused)",
            r.identity, r.digest, r.created
        );
    }
    if let Some(c) = &cluster {
        let file = c["metrics_file"].as_str().unwrap_or("");
        match (c.get("error"), serde_json::from_value::<View>(c.clone())) {
            (Some(e), _) => println!("cluster view ({file}): {}", e.as_str().unwrap_or("")),
            (None, Ok(v)) => println!("cluster view ({file}): {}", v.to_line()),
            (None, Err(e)) => println!("cluster view ({file}): {e}"),
        }
    }
    match report {
        Some(r) => print!("{}", r.to_text()),
        None => println!("no report yet"),
    }
    Ok(())
}

/// What the config's `cluster.metrics_file` says: the [`View`] with
/// `metrics_file`, or `error` when it cannot be read (none yet, for one).
/// `None` without a readable config or without a metrics file in it.
fn cluster_view(host: &HostArgs) -> Option<serde_json::Value> {
    let config = Config::load(&host.config_path()).ok()?;
    let file = config.cluster?.metrics_file?;
    let path = host.root().join(&file.to_string_lossy());
    let mut v = match std::fs::read_to_string(&path) {
        Ok(t) => serde_json::to_value(read_metrics(&t)).ok()?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            serde_json::json!({"error": "no metrics file yet (no activation since the cluster section was set)"})
        }
        Err(e) => serde_json::json!({"error": format!("{}: {e}", path.display())}),
    };
    v["metrics_file"] = file.display().to_string().into();
    Some(v)
}

/// The node machines that run: their unit is active or machined knows them.
fn running_machines(systemd: &dyn Systemd) -> Result<Vec<Slot>, String> {
    let mut out = Vec::new();
    for slot in Slot::ALL {
        let up = systemd
            .is_active(&slot.unit())
            .and_then(|a| Ok(a || systemd.machine_registered(slot.machine())?))
            .map_err(|e| kubeslot_image::error_chain(&e))?;
        if up {
            out.push(slot);
        }
    }
    Ok(out)
}
