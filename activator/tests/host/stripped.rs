//! What a host installs: the Debian package `ci/deb/build.sh` makes, taken
//! apart with `dpkg-deb -x` (its binary carries no symbol table and still
//! runs), and the release profile that makes the binary it ships stripped
//! in the first place. Does not install the package: the e2e's
//! `deb_install` does that in a booted systemd host.

use std::path::Path;
use std::process::Command;

use kubeslot_test_support::{require_tool, workspace_root};

const ACTIVATOR: &str = env!("CARGO_BIN_EXE_kubeslot-activator");

/// The section names of an ELF file, as `readelf -S -W` lists them.
fn sections(file: &Path) -> Vec<String> {
    let out = Command::new("readelf")
        .args(["-S", "-W"])
        .arg(file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "readelf -S {}: {out:?}",
        file.display()
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| {
            // "  [33] .symtab  SYMTAB ..."
            let rest = l.trim_start().strip_prefix('[')?;
            let (_, rest) = rest.split_once(']')?;
            rest.split_whitespace()
                .next()
                .filter(|n| n.starts_with('.'))
                .map(str::to_string)
        })
        .collect()
}

#[test]
fn the_package_ships_the_binary_without_its_symbol_table() {
    for (tool, package) in [
        ("dpkg-deb", "dpkg"),
        ("readelf", "binutils"),
        ("strip", "binutils"),
    ] {
        require_tool(tool, package);
    }
    // The test build's binary has every table a debug build has: the
    // package must still come out without them.
    let given = sections(Path::new(ACTIVATOR));
    assert!(
        given.iter().any(|s| s == ".symtab"),
        "the debug binary handed in has no .symtab, so this test would prove nothing: {given:?}"
    );
    let t = tempfile::tempdir().unwrap();
    let deb = t.path().join("kubeslot-activator.deb");
    let out = Command::new(workspace_root().join("ci/deb/build.sh"))
        .arg("--binary")
        .arg(ACTIVATOR)
        .args(["--compress", "gzip", "--out"])
        .arg(&deb)
        .output()
        .unwrap();
    assert!(out.status.success(), "ci/deb/build.sh: {out:?}");
    let root = t.path().join("root");
    let out = Command::new("dpkg-deb")
        .arg("-x")
        .arg(&deb)
        .arg(&root)
        .output()
        .unwrap();
    assert!(out.status.success(), "dpkg-deb -x: {out:?}");

    let shipped = root.join("usr/bin/kubeslot-activator");
    let names = sections(&shipped);
    for table in [".symtab", ".strtab"] {
        assert!(
            !names.iter().any(|s| s == table),
            "the packaged binary has {table}: {names:?}"
        );
    }
    // (.debug_gdb_scripts is loaded with the program: not debug data)
    assert!(
        !names
            .iter()
            .any(|s| s.starts_with(".debug") && s != ".debug_gdb_scripts"),
        "the packaged binary has debug sections: {names:?}"
    );
    // Stripped, it is still the program: it starts and says its version.
    let out = Command::new(&shipped).arg("version").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        env!("CARGO_PKG_VERSION")
    );
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&shipped).unwrap().permissions(),
    );
    assert_eq!(mode & 0o7777, 0o755, "{}", shipped.display());
}

/// Cargo gives a package with a `[profile.release.package.NAME]` override
/// that override's `strip`, and one that leaves it unset cargo's default
/// (strip debuginfo only), whatever `[profile.release]` says. So each
/// workspace package with a binary and an override must repeat the
/// profile's `strip = "symbols"`, or its release binary keeps its symbol
/// table (the activator's did: 4,574,592 bytes as built, 3,862,792
/// stripped).
#[test]
fn every_binary_packages_release_override_keeps_strip_symbols() {
    let text = std::fs::read_to_string(workspace_root().join("Cargo.toml")).unwrap();
    let manifest: toml::Value = toml::from_str(&text).unwrap();
    let release = &manifest["profile"]["release"];
    assert_eq!(
        release["strip"].as_str(),
        Some("symbols"),
        "[profile.release] strip"
    );
    let overrides = release
        .get("package")
        .and_then(|p| p.as_table())
        .cloned()
        .unwrap_or_default();
    let mut checked = Vec::new();
    for member in manifest["workspace"]["members"].as_array().unwrap() {
        let dir = workspace_root().join(member.as_str().unwrap());
        let crate_toml: toml::Value =
            toml::from_str(&std::fs::read_to_string(dir.join("Cargo.toml")).unwrap()).unwrap();
        let name = crate_toml["package"]["name"].as_str().unwrap().to_string();
        let has_bin = crate_toml.get("bin").is_some() || dir.join("src/main.rs").is_file();
        let Some(o) = overrides.get(&name) else {
            continue;
        };
        if has_bin {
            assert_eq!(
                o.get("strip").and_then(|s| s.as_str()),
                Some("symbols"),
                "[profile.release.package.{name}] overrides the release profile for a binary \
                 package but does not say strip = \"symbols\": cargo then strips only debuginfo \
                 and the binary keeps its symbol table"
            );
            checked.push(name);
        }
    }
    assert!(
        checked.contains(&"kubeslot-activator".to_string()),
        "the activator's override was not checked: {checked:?}"
    );
}
