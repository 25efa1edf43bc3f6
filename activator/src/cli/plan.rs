//! `kubeslot-activator plan` (and `activate --dry-run`): what `activate`
//! would change, computed by [`kubeslot_activator::activate::preview`]
//! without the lock and without writing anything (it does read the image
//! source to resolve the reference).

use kubeslot_activator::activate::{self, Preview};
use kubeslot_activator::plan::Plan;

use super::HostArgs;

/// Show what `activate` would change: the slot flipped from and to, the
/// digests, a diff of the host files it would write, and of the host
/// settings (sysctl.d, modules-load.d) it writes before a flip.
///
/// Resolves and verifies the configured image (fetching no layer) and reads
/// the state; writes nothing and does not take the run lock. Exit code 0
/// whatever the plan is, 1 or 3 when it cannot be computed.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub host: HostArgs,
    /// Print the plan as JSON.
    #[arg(long)]
    pub json: bool,
    /// Plan as `activate --force` would (ignore earlier failures).
    #[arg(long)]
    pub force: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    show(&args.host, args.force, args.json)
}

pub fn show(host: &HostArgs, force: bool, json: bool) -> anyhow::Result<()> {
    let p = activate::preview(&host.root(), &host.config_path(), force).map_err(|e| {
        let code = e.exit_code();
        super::Failed {
            code,
            message: kubeslot_image::error_chain(&e),
        }
    })?;
    if json {
        println!("{}", serde_json::to_string_pretty(&to_json(&p))?);
    } else {
        print!("{}", to_text(&p));
    }
    Ok(())
}

fn to_json(p: &Preview) -> serde_json::Value {
    let mut v = serde_json::json!({
        "image": p.image,
        "active": p.state.active,
        "pending": p.state.pending,
        "summary": p.plan.to_string(),
        "files": p.diffs.iter().map(|d| serde_json::json!({"path": d.path, "diff": d.diff})).collect::<Vec<_>>(),
        "host_settings": p.host_settings.iter().map(|d| serde_json::json!({"path": d.path, "diff": d.diff})).collect::<Vec<_>>(),
    });
    match &p.plan {
        Plan::UpToDate { slot, digest } => {
            v["action"] = "none".into();
            v["slot"] = serde_json::json!(slot);
            v["digest"] = serde_json::json!(digest);
        }
        Plan::Refused(bad) => {
            v["action"] = "refused".into();
            v["digest"] = serde_json::json!(bad.digest);
            v["reason"] = bad.reason.clone().into();
        }
        Plan::Flip(f) => {
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
    let mut s = format!("image {}\n{}\n", p.image, p.plan);
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
