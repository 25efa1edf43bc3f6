//! One module per subcommand of `kubeslot-activator`: an args struct and `run`.
//! The work lives in the library; these modules only turn arguments into a
//! library call and print its result.

pub mod unpack;
