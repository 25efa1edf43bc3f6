//! Golden files: what the world sees (every `--help`, emitted documents,
//! rendered host files) compared with a file under `testdata/`. One
//! variable refreshes them all: `KUBESLOT_UPDATE_GOLDEN=1` writes the
//! actual output instead of failing; review the diff before committing it.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::tools::run_ok;
use crate::workspace_root;

/// The one switch: refresh golden files instead of comparing.
pub const UPDATE_VAR: &str = "KUBESLOT_UPDATE_GOLDEN";

/// Whether this run refreshes golden files.
pub fn updating() -> bool {
    std::env::var_os(UPDATE_VAR).is_some()
}

/// `testdata/<rel>` in the workspace.
pub fn testdata(rel: &str) -> PathBuf {
    workspace_root().join("testdata").join(rel)
}

/// Compares `actual` with `testdata/<rel>` (or writes it when updating).
pub fn check(rel: &str, actual: &str) {
    check_path(&testdata(rel), actual);
}

/// Compares `actual` with the file at `path` (or writes it when updating).
pub fn check_path(path: &Path, actual: &str) {
    if updating() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, actual).unwrap();
    }
    let want = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e} ({UPDATE_VAR}=1 creates it)", path.display()));
    if actual != want {
        panic!(
            "{} differs from the output ({UPDATE_VAR}=1 accepts the new output):\n{}",
            path.display(),
            line_diff(&want, actual)
        );
    }
}

/// The lines only one side has, `-` golden, `+` actual (enough to see what
/// changed; a test that needs a real diff renders its own).
fn line_diff(want: &str, actual: &str) -> String {
    let w: Vec<&str> = want.lines().collect();
    let a: Vec<&str> = actual.lines().collect();
    let mut out = String::new();
    for l in &w {
        if !a.contains(l) {
            out += &format!("-{l}\n");
        }
    }
    for l in &a {
        if !w.contains(l) {
            out += &format!("+{l}\n");
        }
    }
    if out.is_empty() {
        out = "(same lines, other order or whitespace)\n".into();
    }
    out
}

/// Snapshots every `--help` of a program: `BIN --help` as
/// `testdata/help/<name>.txt` and, for each subcommand clap lists (but
/// `help`), `BIN SUB --help` as `testdata/help/<name>-<sub>.txt`, at a fixed
/// width. A new subcommand without a golden file fails until it has one.
pub fn help_snapshots(bin: &Path, name: &str) {
    let help = |args: &[&str]| run_ok(Command::new(bin).args(args).env("COLUMNS", "100"));
    let top = help(&["--help"]);
    check(&format!("help/{name}.txt"), &top);
    let subcommands = subcommands(&top);
    assert!(
        !subcommands.is_empty(),
        "{name} --help lists no subcommands:\n{top}"
    );
    for sub in subcommands {
        check(
            &format!("help/{name}-{sub}.txt"),
            &help(&[sub.as_str(), "--help"]),
        );
    }
}

/// The names in clap's `Commands:` section.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter(|l| !l.starts_with("   ")) // a wrapped description
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != "help")
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subcommands_are_read_from_clap_help() {
        let help = "Usage: x\n\nCommands:\n  build  Build a thing\n         more words\n  check  Check\n  help   Print this\n\nOptions:\n  -h\n";
        assert_eq!(subcommands(help), ["build", "check"]);
    }
}
