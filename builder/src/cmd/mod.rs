//! One module per subcommand of `kubeslot-builder`: an args struct and `run`.

pub mod copy;
pub mod keygen;
pub mod push;
pub mod sbom;
pub mod sign;

/// Options every subcommand shares.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct Global {
    /// Print the result as one JSON object on stdout (for pipelines).
    #[arg(long, global = true)]
    pub json: bool,
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
