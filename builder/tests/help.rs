//! What users read: `kubeslot-builder --help` and every subcommand's
//! `--help`, compared with `testdata/help/builder*.txt`
//! (`KUBESLOT_UPDATE_GOLDEN=1` rewrites them). A new subcommand fails here
//! until its help is snapshotted.

#[test]
fn every_help_text_matches_its_snapshot() {
    kubeslot_test_support::golden::help_snapshots(
        std::path::Path::new(env!("CARGO_BIN_EXE_kubeslot-builder")),
        "builder",
    );
}
