//! One module per subcommand of `kubeslot-activator`: an args struct and `run`.
