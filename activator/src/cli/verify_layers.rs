//! `kubeslot-activator verify-layers`: every layer directory of the layer
//! store checked against the record written when it was unpacked (see
//! [`kubeslot_activator::slots::record`]).

use kubeslot_activator::activate::report::exit;
use kubeslot_activator::slots::record;

use super::{Failed, HostArgs};

/// Check the layer store against what each layer held when it was unpacked.
///
/// Every directory under /var/lib/kubeslot/layers (the read-only lower
/// layers of overlay slots) is walked without following links and compared
/// with its record (`<diff_id>.files`, written before the layer was put in
/// place): a file changed, added or removed, a symlink retargeted, or a
/// layer without its record is reported. Exit 0 when every layer matches,
/// 1 naming each layer and entry that does not. Reads only; run it any
/// time (a running machine reads the layers, it never writes them).
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub host: HostArgs,
    /// Print {"layers": N, "mismatches": [{"layer", "path", "what"}]} as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let dir = args.host.root().layers_dir();
    let mut layers = 0;
    let mut bad = Vec::new();
    let entries = match std::fs::read_dir(&dir) {
        Ok(rd) => rd.collect::<Result<Vec<_>, _>>()?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(anyhow::anyhow!("{}: {e}", dir.display())),
    };
    for e in entries {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || !e.file_type()?.is_dir() {
            continue;
        }
        layers += 1;
        let path = e.path();
        let record = match record::load(&record::record_path(&path)) {
            Ok(r) => r,
            Err(err) => {
                bad.push(serde_json::json!({"layer": name, "path": "", "what": format!("no readable record ({err})")}));
                continue;
            }
        };
        for m in record::check(&path, &record)? {
            bad.push(serde_json::json!({"layer": name, "path": m.path, "what": m.what}));
        }
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({"layers": layers, "mismatches": bad})
            )?
        );
    } else {
        for b in &bad {
            println!(
                "layer {}: {}: {}",
                b["layer"].as_str().unwrap_or(""),
                b["path"].as_str().unwrap_or(""),
                b["what"].as_str().unwrap_or("")
            );
        }
        println!("{layers} layer(s) checked, {} mismatch(es)", bad.len());
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(Failed {
            code: exit::FAILED,
            message: format!(
                "{} entr{} of the layer store differ from what was unpacked",
                bad.len(),
                if bad.len() == 1 { "y" } else { "ies" }
            ),
        }
        .into())
    }
}
