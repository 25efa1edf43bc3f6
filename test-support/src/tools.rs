//! Running programs in tests: a command that must succeed (its stdout back,
//! both streams in the failure message), one that must fail (its stderr
//! back), and `skopeo` (required, with its install hint).

use std::path::Path;
use std::process::{Command, Output};

use crate::require_tool;

fn shown(out: &Output) -> String {
    format!(
        "{}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `cmd`, which must succeed; returns its stdout.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: cannot run: {e}"));
    assert!(out.status.success(), "{cmd:?} failed: {}", shown(&out));
    String::from_utf8(out.stdout).expect("stdout is UTF-8")
}

/// Runs `cmd`, which must fail; returns its stderr.
pub fn run_fails(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: cannot run: {e}"));
    assert!(!out.status.success(), "{cmd:?} succeeded: {}", shown(&out));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs `skopeo ARGS`, which must succeed; returns its stdout.
pub fn skopeo(args: &[&str]) -> String {
    run_ok(Command::new(require_tool("skopeo", "skopeo")).args(args))
}

/// Copies the image tagged `tag` in the layout at `layout` to the registry
/// repository `dest` (`host/repo`) under the same tag, every platform and
/// digest kept, over plain HTTP.
pub fn skopeo_push(layout: &Path, tag: &str, dest: &str) {
    skopeo_push_with(layout, tag, dest, &["--dest-tls-verify=false"]);
}

/// [`skopeo_push`] with other destination options (`--dest-creds U:P`,
/// `--dest-cert-dir DIR`, ...) instead of plain HTTP.
pub fn skopeo_push_with(layout: &Path, tag: &str, dest: &str, dest_opts: &[&str]) {
    let src = format!("oci:{}:{tag}", layout.display());
    let dst = format!("docker://{dest}:{tag}");
    let mut args = vec!["copy", "--all", "--preserve-digests", "-q"];
    args.extend_from_slice(dest_opts);
    args.extend([src.as_str(), dst.as_str()]);
    skopeo(&args);
}
