//! `kubeslot-activator plan` (and `activate --dry-run`): what `activate`
//! would do, decided by [`kubeslot_activator::activate::preview`] with the
//! same decision function as `activate`, without the lock and without
//! writing anything (it reads the image source to resolve the reference,
//! and asks systemd which machines run). With `--rollback`, what
//! `rollback` would do ([`kubeslot_activator::activate::preview_rollback`],
//! the same decision as `rollback`'s).

use kubeslot_activator::activate::plan::{Decision, Reason};
use std::path::PathBuf;

use kubeslot_activator::activate::{
    self, DrainPreview, Options, Preview, RollbackOptions, RollbackPreview,
};
use kubeslot_activator::systemd::SystemCtl;

use super::HostArgs;

/// Show what `activate` would change: the slot flipped from and to, the
/// digests, a diff of the host files it would write, and of the host
/// settings (sysctl.d, modules-load.d) it writes before a flip.
///
/// Decides as `activate` does (the same checks: a bad image, a downgrade, a
/// machine kubeslot has no record of, the preflight): a refusal is shown
/// with the exit code `activate` would end with. A committed node that is
/// not running is started and checked by `activate` first; the plan says
/// so. With a "gpu_image" in the config, names the variant this host runs
/// (the NVIDIA one where an NVIDIA GPU is on the PCI bus) and why.
/// Resolves and verifies the configured image (fetching no layer),
/// reads the state and asks systemd which machines run; writes nothing,
/// starts nothing and does not take the run lock. Exit code 0 whatever the
/// plan is, 1 or 3 when it cannot be computed.
///
/// With --rollback: what `rollback` would do instead (the slot flipped back
/// to, or why it refuses), decided as `rollback` decides; the exit code is
/// the one `rollback` would end with when it refuses (1, or 3 for a machine
/// kubeslot has no record of), else 0. The checks of the previous slot's
/// tree and its health gate are `rollback`'s to run.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub host: HostArgs,
    /// Print the plan as JSON.
    #[arg(long)]
    pub json: bool,
    /// Plan as `activate --force` would (ignore earlier failures).
    #[arg(long, conflicts_with = "rollback")]
    pub force: bool,
    /// Plan a `rollback` (back to the previous slot) instead of `activate`.
    #[arg(long)]
    pub rollback: bool,
    /// With --rollback: plan as `rollback --clean` would.
    #[arg(long, requires = "rollback")]
    pub clean: bool,
    /// Show the drain the flip does first, read from the cluster with this
    /// kubeconfig (default: the config's cluster.kubeconfig): the pods it
    /// would evict, those it skips and why (as `kubectl drain
    /// --ignore-daemonsets --delete-emptydir-data`, with cluster.drain's
    /// knobs), and the disruption budgets that allow zero disruptions now.
    /// Reads the Node, pods, budgets and DaemonSets; changes nothing.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// With --kubeconfig: the Node to drain. Default: the config's
    /// kubelet.node_name, else the host name.
    #[arg(long, value_name = "NAME", requires = "kubeconfig")]
    pub node: Option<String>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let drain = activate::preview_drain(
        &args.host.root(),
        &args.host.config_path(),
        args.kubeconfig.as_deref(),
        args.node.as_deref(),
    )
    .map_err(|e| super::Failed {
        code: 1,
        message: format!("{e:#}"),
    })?;
    if args.rollback {
        let opts = RollbackOptions {
            clean: args.clean,
            force: false,
        };
        return show_rollback(&args.host, &opts, args.json, drain.as_ref());
    }
    let opts = Options {
        force: args.force,
        ..Options::default()
    };
    show_with(&args.host, &opts, args.json, drain.as_ref())
}

pub fn show(host: &HostArgs, opts: &Options, json: bool) -> anyhow::Result<()> {
    show_with(host, opts, json, None)
}

fn show_with(
    host: &HostArgs,
    opts: &Options,
    json: bool,
    drain: Option<&DrainPreview>,
) -> anyhow::Result<()> {
    let p =
        activate::preview(&host.root(), &host.config_path(), &SystemCtl, opts).map_err(|e| {
            let code = e.exit_code();
            super::Failed {
                code,
                message: kubeslot_image::error_chain(&e),
            }
        })?;
    let flips = matches!(p.decision, Decision::Flip(_));
    if json {
        let mut v = to_json(&p);
        if let Some(d) = drain {
            v["drain"] = drain_json(d, flips);
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", to_text(&p));
        if let Some(d) = drain {
            print!("{}", drain_text(d, flips.then_some("flip")));
        }
    }
    Ok(())
}

fn show_rollback(
    host: &HostArgs,
    opts: &RollbackOptions,
    json: bool,
    drain: Option<&DrainPreview>,
) -> anyhow::Result<()> {
    let p = activate::preview_rollback(&host.root(), &SystemCtl, opts).map_err(|e| {
        let code = e.exit_code();
        super::Failed {
            code,
            message: kubeslot_image::error_chain(&e),
        }
    })?;
    let flips = p.decision.is_ok();
    if json {
        let mut v = rollback_json(&p);
        if let Some(d) = drain {
            v["drain"] = drain_json(d, flips);
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", rollback_text(&p));
        if let Some(d) = drain {
            print!("{}", drain_text(d, flips.then_some("rollback")));
        }
    }
    match p.exit_code() {
        0 => Ok(()),
        code => Err(super::Failed {
            code,
            message: format!("rollback would refuse (exit {code})"),
        }
        .into()),
    }
}

fn rollback_json(p: &RollbackPreview) -> serde_json::Value {
    let mut v = serde_json::json!({
        "active": p.state.active,
        "pending": p.state.pending,
        "exit_code": p.exit_code(),
    });
    match &p.decision {
        Ok(rb) => {
            v["action"] = "rollback".into();
            v["summary"] = rb.to_string().into();
            v["from"] = serde_json::json!(rb.from);
            v["from_digest"] = serde_json::json!(rb.from_digest);
            v["to"] = serde_json::json!(rb.to);
            v["digest"] = serde_json::json!(rb.digest);
        }
        Err(refusal) => {
            v["action"] = "refused".into();
            v["summary"] = format!("refused: {refusal}").into();
            v["refusal"] = refusal.name().into();
            v["reason"] = refusal.to_string().into();
        }
    }
    v
}

fn rollback_text(p: &RollbackPreview) -> String {
    let mut s = match &p.decision {
        Ok(rb) => format!(
            "{rb}\nnote: rollback checks that {} is still the tree committed away from (and its image files, unless --force) before it stops {}\n",
            rb.to, rb.from
        ),
        Err(refusal) => format!("refused: {refusal}\n"),
    };
    if let Some(pending) = &p.state.pending {
        s += &format!(
            "note: a dead run left a {} flip to {} pending; rollback recovers it first\n",
            pending.phase, pending.to
        );
    }
    s
}

fn to_json(p: &Preview) -> serde_json::Value {
    let mut v = serde_json::json!({
        "image": p.image,
        "variant": p.variant,
        "active": p.state.active,
        "pending": p.state.pending,
        "summary": p.decision.to_string(),
        "if_down": p.if_down.as_ref().map(ToString::to_string),
        "files": p.diffs.iter().map(|d| serde_json::json!({"path": d.path, "diff": d.diff})).collect::<Vec<_>>(),
        "host_settings": p.host_settings.iter().map(|d| serde_json::json!({"path": d.path, "diff": d.diff})).collect::<Vec<_>>(),
    });
    match &p.rollout {
        Some(Ok(a)) => v["rollout"] = serde_json::json!(a),
        Some(Err(e)) => v["rollout"] = serde_json::json!({ "refused": e }),
        None => {}
    }
    match &p.decision {
        Decision::UpToDate { slot, digest } => {
            v["action"] = "none".into();
            v["slot"] = serde_json::json!(slot);
            v["digest"] = serde_json::json!(digest);
        }
        Decision::Refused(reason) => {
            v["action"] = "refused".into();
            v["refusal"] = reason.name().into();
            v["exit_code"] = reason.exit_code().into();
            if let Reason::Bad(bad) = reason {
                v["digest"] = serde_json::json!(bad.digest);
                v["reason"] = bad.reason.clone().into();
            } else {
                v["digest"] = serde_json::json!(p.situation.as_ref().map(|s| s.digest));
                v["reason"] = reason.to_string().into();
            }
        }
        Decision::Flip(f) => {
            v["action"] = "flip".into();
            v["from"] = serde_json::json!(f.from);
            v["from_digest"] = serde_json::json!(f.from_digest);
            v["to"] = serde_json::json!(f.to);
            v["digest"] = serde_json::json!(f.digest);
            v["stage"] = (!f.reuse_staged).into();
        }
    }
    v
}

fn to_text(p: &Preview) -> String {
    let mut s = match &p.image {
        Some(image) => match &p.variant {
            Some(v) => format!("image {image} ({}: {})\n{}\n", v.key, v.why, p.decision),
            None => format!("image {image}\n{}\n", p.decision),
        },
        None => format!("{}\n", p.decision),
    };
    if let Decision::Refused(reason) = &p.decision {
        s += &format!("activate would exit {}\n", reason.exit_code());
    }
    match &p.rollout {
        Some(Ok(a)) => s += &a.to_text(),
        Some(Err(e)) => s += &format!("  refused by source.follow: {e}\n"),
        None => {}
    }
    if let Some(note) = unchecked_note(p) {
        s += &note;
    }
    if let Some(pending) = &p.state.pending {
        s += &format!(
            "note: a dead run left a {} flip to {} pending; activate recovers it first\n",
            pending.phase, pending.to
        );
    }
    for d in &p.diffs {
        s += &format!("--- {}\n{}", d.path.display(), d.diff);
        if !d.diff.ends_with('\n') {
            s.push('\n');
        }
    }
    if !p.host_settings.is_empty() {
        s += "host settings, written and applied before the next flip:\n";
        for d in &p.host_settings {
            s += &d.diff;
        }
    }
    s
}

/// What `plan` cannot know, said: `activate` starts (or, forced, gates) the
/// committed node first; what it does when the node does not come up.
fn unchecked_note(p: &Preview) -> Option<String> {
    let s = p.situation.as_ref()?;
    let if_down = p.if_down.as_ref()?;
    let active = s.state.active?;
    let first = if s.machines.runs(active) {
        format!("note: --force: activate checks the running committed node {active} first")
    } else {
        format!(
            "note: the committed node {active} is not running: activate starts it and checks it first"
        )
    };
    let then = match if_down {
        Decision::Refused(Reason::NotHealthy { slot, .. }) => format!(
            "activate exits 1 (`activate --force` stages the image afresh into {})",
            slot.other()
        ),
        Decision::Refused(reason) => format!(
            "activate refuses to stage the image afresh (exit {}): {reason}",
            reason.exit_code()
        ),
        other => format!("{other}"),
    };
    Some(format!("{first}; if it does not come up: {then}\n"))
}

/// The drain as text: a header naming the node and whether the planned
/// run drains (`run`: "flip", "rollback"), then a line per pod (or why the
/// cluster could not be read, and what `activate` then does).
fn drain_text(d: &DrainPreview, run: Option<&str>) -> String {
    let when = match run {
        Some(run) => format!("before the {run}"),
        None => "if a flip ran now (none is planned)".into(),
    };
    let head = format!(
        "drain of node {} {when} (kubeconfig {})",
        d.node,
        d.kubeconfig.display()
    );
    match &d.plan {
        Ok(plan) => format!(
            "{head}, as kubectl drain --ignore-daemonsets --delete-emptydir-data{}{}:\n{plan}",
            if plan.options.force { " --force" } else { "" },
            if plan.options.delete_emptydir_data {
                ""
            } else {
                " without --delete-emptydir-data"
            },
        ),
        Err(e) => format!(
            "{head}: the cluster cannot be read now: {e}\n  {}\n",
            if d.required {
                "activate would refuse the flip (cluster.drain.required)"
            } else {
                "activate would flip undrained (cluster.drain.required is false)"
            }
        ),
    }
}

fn drain_json(d: &DrainPreview, planned: bool) -> serde_json::Value {
    let mut v = serde_json::json!({
        "node": d.node,
        "kubeconfig": d.kubeconfig,
        "planned": planned,
        "required": d.required,
    });
    match &d.plan {
        Ok(plan) => {
            v["options"] = serde_json::json!(plan.options);
            v["evict"] = serde_json::json!(plan
                .evictions()
                .iter()
                .map(|p| format!("{}/{}", p.namespace, p.name))
                .collect::<Vec<_>>());
            v["refusals"] = serde_json::json!(plan.refusals());
            v["warnings"] = serde_json::json!(plan.warnings());
            v["blocking_budgets"] = serde_json::json!(plan.blocking_budgets());
            v["pods"] = serde_json::json!(plan.pods);
        }
        Err(e) => v["error"] = e.clone().into(),
    }
    v
}
