//! One module per subcommand of `kubeslot-builder`: an args struct and `run`.

pub mod base;
pub mod lock;
