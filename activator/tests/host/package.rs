//! What is shipped: the units run the installed binary and pass `systemd-
//! analyze`, the Debian package is byte-identical under any umask and depends
//! on the glibc that loads the binary, the packaged example config loads.

use super::*;

#[test]
fn shipped_units_run_the_installed_binary_and_pass_systemd_analyze() {
    let analyze = require_tool("systemd-analyze", "systemd");
    let units = Path::new(env!("CARGO_MANIFEST_DIR")).join("units");
    let service = fs::read_to_string(units.join("kubeslot-activator.service")).unwrap();
    let path_unit = fs::read_to_string(units.join("kubeslot-activator.path")).unwrap();
    let bin = kubeslot_activator::paths::host::ACTIVATOR_BIN;
    assert!(
        service.contains(&format!("ExecStart={bin} activate\n")),
        "{service}"
    );
    assert!(service.contains("Type=oneshot") && !service.contains("\nRestart="));
    let config = format!("/{}", kubeslot_activator::config::DEFAULT_PATH);
    assert!(
        path_unit.contains(&format!("PathChanged={config}\n")),
        "{path_unit}"
    );
    assert!(path_unit.contains("Unit=kubeslot-activator.service"));
    // systemd's own parser, with the binary at a path that exists here
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("kubeslot-activator.service"),
        service.replace(bin, env!("CARGO_BIN_EXE_kubeslot-activator")),
    )
    .unwrap();
    fs::write(dir.path().join("kubeslot-activator.path"), &path_unit).unwrap();
    let out = Command::new(&analyze)
        .arg("verify")
        .arg(dir.path().join("kubeslot-activator.service"))
        .arg(dir.path().join("kubeslot-activator.path"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(!text.contains("kubeslot-activator.service:"), "{text}");

    // the follow timer: `follow` at a random moment of each hour
    let follow = fs::read_to_string(units.join("kubeslot-activator-follow.service")).unwrap();
    let timer = fs::read_to_string(units.join("kubeslot-activator-follow.timer")).unwrap();
    assert!(
        follow.contains(&format!("ExecStart={bin} follow\n")),
        "{follow}"
    );
    assert!(timer.contains("RandomizedDelaySec="), "{timer}");
    fs::write(
        dir.path().join("kubeslot-activator-follow.service"),
        follow.replace(bin, env!("CARGO_BIN_EXE_kubeslot-activator")),
    )
    .unwrap();
    fs::write(dir.path().join("kubeslot-activator-follow.timer"), &timer).unwrap();
    let out = Command::new(analyze)
        .arg("verify")
        .arg(dir.path().join("kubeslot-activator-follow.service"))
        .arg(dir.path().join("kubeslot-activator-follow.timer"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(!text.contains("kubeslot-activator-follow"), "{text}");
}

/// What `ci/deb/build.sh` runs.
fn require_deb_tools() {
    for (tool, pkg) in [
        ("dpkg-deb", "dpkg"),
        ("objdump", "binutils"),
        ("git", "git"),
    ] {
        require_tool(tool, pkg);
    }
}

#[test]
fn the_debian_package_is_byte_identical_under_any_umask() {
    require_deb_tools();
    let dir = tempfile::tempdir().unwrap();
    let script = kubeslot_test_support::workspace_root().join("ci/deb/build.sh");
    // any small executable: the package's layout, not the binary, is at
    // stake (the activator's debug build takes seconds to compress)
    let binary = dir.path().join("kubeslot-activator");
    fs::copy("/bin/true", &binary).unwrap();
    let build = |umask: &str| {
        let out = dir.path().join(format!("umask-{umask}.deb"));
        let run = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "umask {umask} && exec \"$0\" --binary \"$1\" --compress gzip --out \"$2\""
            ))
            .arg(&script)
            .arg(&binary)
            .arg(&out)
            .env("SOURCE_DATE_EPOCH", "1700000000")
            .output()
            .unwrap();
        assert!(
            run.status.success(),
            "umask {umask}: {}",
            String::from_utf8_lossy(&run.stderr)
        );
        fs::read(out).unwrap()
    };
    let usual = build("022");
    for umask in ["077", "002"] {
        assert!(build(umask) == usual, "umask {umask} built another package");
    }
}

/// The activator's relocations are packed (DT_RELR, activator/build.rs: a
/// smaller binary), which needs glibc 2.36: the package says so even when
/// no symbol the binary uses is that new.
#[test]
fn the_package_of_a_packed_binary_depends_on_the_glibc_that_loads_it() {
    require_deb_tools();
    let binary = env!("CARGO_BIN_EXE_kubeslot-activator");
    let headers = Command::new("objdump")
        .args(["-p", binary])
        .output()
        .unwrap();
    let headers = String::from_utf8_lossy(&headers.stdout);
    assert!(
        headers.contains("RELR ") && headers.contains("GLIBC_ABI_DT_RELR"),
        "{binary} has no packed relocations:\n{headers}"
    );
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("a.deb");
    let script = kubeslot_test_support::workspace_root().join("ci/deb/build.sh");
    let run = Command::new(&script)
        .args(["--binary", binary, "--compress", "gzip", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let depends = Command::new("dpkg-deb")
        .arg("-f")
        .arg(&out)
        .arg("Depends")
        .output()
        .unwrap();
    let depends = String::from_utf8_lossy(&depends.stdout);
    assert!(depends.contains("libc6 (>= 2.36)"), "Depends: {depends}");
}

/// The example config the Debian package ships loads as a real one does.
#[test]
fn the_packaged_example_config_loads() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("dist/activator.example.json");
    let c = kubeslot_activator::config::Config::load(&path).unwrap();
    assert_eq!(c.trust.public_keys.len(), 1);
    assert!(c.kubelet.ca_file.is_some() && c.kubelet.bootstrap_token.is_some());
}

/// The package's purge removes /etc/kubeslot (the config with its
/// bootstrap token, the trust keys, the rendered host files) and says so;
/// a plain remove keeps it. Run under DPKG_ROOT with a stand-in
/// `deb-systemd-helper` first on PATH, so nothing of this machine changes.
#[test]
fn the_packages_purge_removes_etc_kubeslot_and_a_remove_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = Root::new(dir.path().join("root"));
    let config = root.default_config();
    fs::create_dir_all(root.host_files("kube1")).unwrap();
    fs::create_dir_all(root.config_dir().join("trust")).unwrap();
    fs::write(
        &config,
        r#"{"kubelet":{"bootstrap_token":"07401b.f395accd246ae52d"}}"#,
    )
    .unwrap();
    fs::write(
        root.host_files("kube1").join("bootstrap-kubeconfig"),
        "token",
    )
    .unwrap();
    let bin = dir.path().join("bin");
    fs::create_dir_all(&bin).unwrap();
    let helper = bin.join("deb-systemd-helper");
    fs::write(
        &helper,
        format!(
            "#!/bin/sh\necho \"$*\" >> '{}'\n",
            dir.path().join("calls").display()
        ),
    )
    .unwrap();
    fs::set_permissions(&helper, fs::Permissions::from_mode(0o755)).unwrap();
    let postrm = kubeslot_test_support::workspace_root().join("ci/deb/postrm");
    let run = |action: &str| {
        let out = Command::new("sh")
            .arg(&postrm)
            .arg(action)
            .env("DPKG_ROOT", root.dir())
            .env(
                "PATH",
                format!("{}:{}", bin.display(), std::env::var("PATH").unwrap()),
            )
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run("remove");
    assert!(config.exists(), "a plain remove keeps the config: {err}");
    assert!(!err.contains("purged"), "{err}");
    let err = run("purge");
    assert!(
        !root.config_dir().exists(),
        "the purge kept {}",
        root.config_dir().display()
    );
    assert!(
        err.contains("purged /etc/kubeslot (the config, trust keys and credentials)"),
        "{err}"
    );
    // a second purge (nothing left) says nothing of it
    assert!(!run("purge").contains("purged"));
}
