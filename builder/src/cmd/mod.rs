//! One module per subcommand of `kubeslot-builder`, each an args struct and
//! an `async fn run(args, &Global)`; plus the options every subcommand shares
//! (`--cache`, `--json`, `--progress`), resolved once into [`Global`].
//! Nothing here does work of its own.

pub mod base;
pub mod build;
pub mod check;
pub mod copy;
pub mod diff;
pub mod keygen;
pub mod lock;
pub mod push;
pub mod sbom;
pub mod sign;
pub mod statement;

use std::path::PathBuf;

use crate::progress::{Progress, ProgressMode};

/// Options shared by every subcommand.
#[derive(clap::Args, Debug)]
pub struct GlobalArgs {
    /// Download cache (content-addressed by sha256). Default:
    /// `$XDG_CACHE_HOME/kubeslot`, else `~/.cache/kubeslot`.
    #[arg(long, global = true, value_name = "DIR")]
    pub cache: Option<PathBuf>,
    /// Print a machine-readable JSON summary on stdout instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    /// How to show progress on stderr.
    #[arg(long, global = true, value_enum, default_value = "auto")]
    pub progress: ProgressMode,
}

/// The shared options, resolved.
#[derive(Clone)]
pub struct Global {
    pub cache: PathBuf,
    pub json: bool,
    pub progress: Progress,
}

impl GlobalArgs {
    pub fn resolve(self) -> Global {
        let cache = self.cache.unwrap_or_else(default_cache);
        Global {
            cache,
            json: self.json,
            progress: Progress::new(self.progress),
        }
    }
}

fn default_cache() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(x).join("kubeslot");
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    PathBuf::from(home).join(".cache").join("kubeslot")
}

/// Prints a command's result: JSON with `--json`, else its `Display`.
pub fn print<T: serde::Serialize + std::fmt::Display>(global: &Global, value: &T) {
    if global.json {
        println!(
            "{}",
            serde_json::to_string(value).expect("reports serialise")
        );
    } else {
        println!("{value}");
    }
}
