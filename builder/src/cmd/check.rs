//! `kubeslot-builder check RECIPE`: parse and validate a recipe (schema,
//! pins for every platform, groups, baked files present, units baked) and
//! print a one-line summary. It never touches the network or the cache.

use std::path::PathBuf;

use crate::cmd::Global;
use crate::recipe::{BaseSpec, Recipe};

/// Validate a recipe without downloading anything.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The recipe TOML file.
    pub recipe: PathBuf,
}

pub async fn run(args: Args, global: &Global) -> anyhow::Result<()> {
    let recipe = Recipe::load(&args.recipe)?;
    let f = &recipe.file;
    let base = match &f.base {
        BaseSpec::Image(i) => format!("image {}@{}", i.image, i.digest),
        BaseSpec::Rootfs(_) => "rootfs tarball".to_string(),
        BaseSpec::Debian(d) => {
            let mut s = format!("debian {} ({} packages", d.suite, d.packages.len());
            for r in &d.extra_repositories {
                s += &format!(", {} from {}", r.packages.len(), r.name);
            }
            s + ")"
        }
    };
    let platforms: Vec<String> = recipe.platforms.iter().map(|p| p.to_string()).collect();
    if global.json {
        let v = serde_json::json!({
            "recipe": args.recipe,
            "name": f.name,
            "tag": f.tag,
            "platforms": platforms,
            "base": base,
            "components": recipe.versions(),
            "layers": f.layers.iter().map(|l| &l.group).collect::<Vec<_>>(),
            "valid": true,
        });
        println!("{v}");
    } else {
        println!(
            "{}: ok: {}:{} for {}, base {base}, {} components, {} files, layers {}",
            args.recipe.display(),
            f.name,
            f.tag,
            platforms.join(", "),
            f.components.len(),
            f.files.len(),
            f.layers
                .iter()
                .map(|l| l.group.as_str())
                .collect::<Vec<_>>()
                .join(" → ")
        );
    }
    Ok(())
}
