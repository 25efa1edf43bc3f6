//! GPU discovery on fixture `/dev` trees and fake NVIDIA drivers (real
//! character devices and ELF files: the tests run as root): the golden files
//! of amd64 and arm64 hosts, of driver trees (distro, `/usr/local/nvidia`, the
//! GPU operator's), a driver upgraded under a node, and `gpu` on or off.

use super::*;

#[test]
fn golden_gpu_amd64() {
    let host = Host::new();
    host.add_gpus();
    let config = load_scenario("gpu-amd64");
    let facts = scenario_facts(&host, &config, Some(Arch::Amd64));
    let files = render::render(&config, Slot::Kube1, &facts);
    check_invariants(&files, "kube1");
    let nspawn = file(&files, ".nspawn");
    assert!(
        nspawn.contains("Bind=/dev/nvidia0\n")
            && nspawn.contains("Bind=/dev/nvidia-caps\n")
            && nspawn.contains("Bind=/dev/nvidia-caps-imex-channels\n")
    );
    assert!(!nspawn.contains("Bind=/dev/nvidia-caps/"), "{nspawn}");
    let dropin = file(&files, "override.conf");
    assert!(
        dropin.contains("DeviceAllow=char-nvidia-caps rwm\n")
            && dropin.contains("DeviceAllow=char-nvidia-caps-imex-channels rwm\n"),
        "{dropin}"
    );
    assert!(
        nspawn.contains("BindReadOnly=/lib/x86_64-linux-gnu:/run/host-nvidia/0\n"),
        "{nspawn}"
    );
    // the 32-bit libraries get their own mount points
    assert!(
        nspawn.contains("BindReadOnly=/lib/i386-linux-gnu:/run/host-nvidia-i386/0\n"),
        "{nspawn}"
    );
    assert!(!nspawn.contains("aarch64") && !nspawn.contains("by-path"));
    assert!(!nspawn.contains("nvidia-dir-not-a-device"));
    check_golden("gpu-amd64", &files);
}

#[test]
fn golden_gpu_arm64() {
    let host = Host::new();
    host.add_gpus();
    let config = load_scenario("gpu-arm64");
    let facts = scenario_facts(&host, &config, Some(Arch::Arm64));
    let files = render::render(&config, Slot::Kube2, &facts);
    check_invariants(&files, "kube2");
    let nspawn = file(&files, ".nspawn");
    assert!(
        nspawn.contains("BindReadOnly=/usr/lib/aarch64-linux-gnu/nvidia:/run/host-nvidia/1\n"),
        "{nspawn}"
    );
    assert!(!nspawn.contains("x86_64") && !nspawn.contains("host-nvidia-i386"));
    assert_eq!(file(&files, "kube2/hostname"), "grace-01\n");
    check_golden("gpu-arm64", &files);
}

/// The NVIDIA libraries the fake driver installs: (file stem, soname
/// suffix). `libcuda` becomes `libcuda.so.<version>` with the soname
/// `libcuda.so.1`, as the driver ships them.
const FAKE_DRIVER_LIBS: &[(&str, &str)] = &[
    ("libcuda", "1"),
    ("libnvidia-ml", "1"),
    ("libnvidia-ptxjitcompiler", "1"),
    ("libnvidia-encode", "1"),
];

/// Builds one shared object with `cc`: native, or 32-bit (i386) without a
/// C library (this machine has no multilib one), linked against a stub
/// `libc.so.6` so that ldconfig files it as `libc6` like the real driver's.
fn build_so(work: &Path, out: &Path, soname: &str, bits32: bool) {
    let cc = kubeslot_test_support::require_tool("cc", "gcc");
    let src = work.join("lib.c");
    fs::write(
        &src,
        format!(
            "int kubeslot_fake_{}(void) {{ return 1; }}\n",
            soname.replace(['.', '-'], "_")
        ),
    )
    .unwrap();
    let mut cmd = Command::new(&cc);
    cmd.args(["-shared", "-fPIC"])
        .arg(format!("-Wl,-soname,{soname}"))
        .arg("-o")
        .arg(out)
        .arg(&src);
    if bits32 {
        let stub = work.join("libc.so.6");
        if !stub.exists() {
            let stub_src = work.join("stub.c");
            fs::write(&stub_src, "int kubeslot_stub(void) { return 0; }\n").unwrap();
            let o = Command::new(&cc)
                .args([
                    "-m32",
                    "-shared",
                    "-nostdlib",
                    "-fPIC",
                    "-Wl,-soname,libc.so.6",
                    "-o",
                ])
                .arg(&stub)
                .arg(&stub_src)
                .output()
                .unwrap();
            assert!(o.status.success(), "cc -m32 (stub libc): {}", stderr(&o));
        }
        cmd.args(["-m32", "-nostdlib", "-Wl,--no-as-needed"])
            .arg(&stub);
    }
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "cc {}: {}", out.display(), stderr(&o));
}

/// How a host carries its NVIDIA driver.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// The `.run` installer and Ubuntu's packages: the multiarch library
    /// dirs, `vdpau/` beside, 32-bit libraries in `i386-linux-gnu`, ELF
    /// tools in `/usr/bin`.
    Distro,
    /// Debian's packages: files in `nvidia/current/`, reached through
    /// `/etc/alternatives`.
    DebianPackaged,
    /// The GPU host of issue 25 (a read-only `/usr/local/nvidia` image):
    /// `lib64` named in `/etc/ld.so.conf.d`, the tools in
    /// `/usr/local/nvidia/bin`, and `/usr/bin/nvidia-smi` a shell wrapper
    /// that execs the real one.
    UsrLocalNvidia,
    /// The NVIDIA GPU operator: the driver container's tree mounted at
    /// `/run/nvidia/driver` (its own distro layout and loader cache),
    /// nothing of the driver in the host's loader cache.
    Operator,
}

/// An executable `cc` makes that prints `text` (a driver tool stand-in: a
/// real ELF file, as the driver's are).
fn build_exe(work: &Path, out: &Path, text: &str) {
    let cc = kubeslot_test_support::require_tool("cc", "gcc");
    let src = work.join("tool.c");
    fs::write(
        &src,
        format!("#include <stdio.h>\nint main(void) {{ puts({text:?}); return 0; }}\n"),
    )
    .unwrap();
    fs::create_dir_all(out.parent().unwrap()).unwrap();
    let o = Command::new(&cc)
        .arg("-o")
        .arg(out)
        .arg(&src)
        .output()
        .unwrap();
    assert!(o.status.success(), "cc {}: {}", out.display(), stderr(&o));
}

/// A fake NVIDIA driver of `version` under the host root in `layout`, its
/// libraries real ELF objects made by `cc`, its tools real executables.
/// The real `ldconfig -r <root>` then makes the soname links and the cache
/// (for the operator layout: the driver tree's own), and
/// `<root>/sbin/ldconfig` runs it against the root, so the activator
/// parses what the real tool prints for real ELF objects.
fn install_fake_driver(host: &Host, version: &str, layout: Layout) {
    let work = tempfile::tempdir().unwrap();
    // (64-bit library dir, 32-bit library dir, vdpau) relative to the root
    let (lib64, lib32, vdpau) = match layout {
        Layout::Distro => (
            "usr/lib/x86_64-linux-gnu",
            Some("usr/lib/i386-linux-gnu"),
            true,
        ),
        Layout::DebianPackaged => ("usr/lib/x86_64-linux-gnu/nvidia/current", None, false),
        Layout::UsrLocalNvidia => ("usr/local/nvidia/lib64", None, false),
        Layout::Operator => ("run/nvidia/driver/usr/lib/x86_64-linux-gnu", None, false),
    };
    for (stem, so) in FAKE_DRIVER_LIBS {
        let file = format!("{stem}.so.{version}");
        let soname = format!("{stem}.so.{so}");
        let dir = host.path(lib64);
        fs::create_dir_all(&dir).unwrap();
        build_so(work.path(), &dir.join(&file), &soname, false);
        if layout == Layout::DebianPackaged {
            // libcuda.so.1 -> /etc/alternatives/... -> nvidia/current/libcuda.so.1
            let alt = format!("etc/alternatives/nvidia--{soname}-x86_64-linux-gnu");
            fs::create_dir_all(host.path("etc/alternatives")).unwrap();
            let _ = fs::remove_file(host.path(&alt));
            std::os::unix::fs::symlink(format!("/{lib64}/{soname}"), host.path(&alt)).unwrap();
            let link = host.path(&format!("usr/lib/x86_64-linux-gnu/{soname}"));
            let _ = fs::remove_file(&link);
            std::os::unix::fs::symlink(format!("/{alt}"), link).unwrap();
        }
        if let Some(lib32) = lib32 {
            let dir32 = host.path(lib32);
            fs::create_dir_all(&dir32).unwrap();
            build_so(work.path(), &dir32.join(&file), &soname, true);
        }
    }
    if vdpau {
        let vdpau = host.path(&format!("{lib64}/vdpau"));
        fs::create_dir_all(&vdpau).unwrap();
        let file = format!("libvdpau_nvidia.so.{version}");
        build_so(
            work.path(),
            &vdpau.join(&file),
            "libvdpau_nvidia.so.1",
            false,
        );
    }
    let tool = |rel: &str| {
        let _ = fs::remove_file(host.path(rel));
        build_exe(
            work.path(),
            &host.path(rel),
            &format!("GPU 0: Fake {version}"),
        );
    };
    match layout {
        Layout::Distro => tool("usr/bin/nvidia-smi"),
        Layout::DebianPackaged => {
            tool("usr/lib/nvidia/current/nvidia-smi");
            fs::create_dir_all(host.path("usr/bin")).unwrap();
            let _ = fs::remove_file(host.path("usr/bin/nvidia-smi"));
            std::os::unix::fs::symlink(
                "/usr/lib/nvidia/current/nvidia-smi",
                host.path("usr/bin/nvidia-smi"),
            )
            .unwrap();
        }
        Layout::UsrLocalNvidia => {
            for name in [
                "nvidia-smi",
                "nvidia-debugdump",
                "nvidia-persistenced",
                "nvidia-cuda-mps-control",
                "nvidia-cuda-mps-server",
            ] {
                tool(&format!("usr/local/nvidia/bin/{name}"));
            }
            fs::create_dir_all(host.path("etc/ld.so.conf.d")).unwrap();
            fs::write(
                host.path("etc/ld.so.conf.d/000_nvidia.conf"),
                "/usr/local/nvidia/lib64\n",
            )
            .unwrap();
            let wrapper = |name: &str, target: &str| {
                let p = host.path(&format!("usr/bin/{name}"));
                fs::create_dir_all(p.parent().unwrap()).unwrap();
                fs::write(&p, format!("#!/bin/sh\nexec {target} \"$@\"\n")).unwrap();
                fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
            };
            wrapper("nvidia-smi", "/usr/local/nvidia/bin/nvidia-smi");
            // a wrapper an older install left, pointing at nothing
            wrapper("nvidia-imex", "/opt/nvidia-imex/bin/nvidia-imex");
        }
        Layout::Operator => {
            tool("run/nvidia/driver/usr/bin/nvidia-smi");
            // the driver container's own programs beside it
            build_exe(
                work.path(),
                &host.path("run/nvidia/driver/usr/bin/sh"),
                "not a driver tool",
            );
            // its own loader cache, made by its ldconfig
            let ldconfig = kubeslot_test_support::require_tool("ldconfig", "libc-bin");
            let tree = host.path("run/nvidia/driver");
            fs::create_dir_all(tree.join("etc")).unwrap();
            fs::write(tree.join("etc/ld.so.conf"), "/usr/lib/x86_64-linux-gnu\n").unwrap();
            let o = Command::new(&ldconfig)
                .arg("-r")
                .arg(&tree)
                .output()
                .unwrap();
            assert!(
                o.status.success(),
                "ldconfig -r (driver tree): {}",
                stderr(&o)
            );
        }
    }
    host_ldconfig(host);
}

/// Removes the driver files of `install_fake_driver(_, version, Distro)`.
fn remove_fake_driver(host: &Host, version: &str) {
    for dir in [
        "usr/lib/x86_64-linux-gnu",
        "usr/lib/i386-linux-gnu",
        "usr/lib/x86_64-linux-gnu/vdpau",
    ] {
        for e in fs::read_dir(host.path(dir)).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if name.ends_with(&format!(".so.{version}")) {
                fs::remove_file(p).unwrap();
            }
        }
    }
    fs::remove_file(host.path("usr/bin/nvidia-smi")).unwrap();
    host_ldconfig(host);
}

/// The real ldconfig on the host root: `<root>/etc/ld.so.conf` lists the
/// multiarch dirs and includes `ld.so.conf.d`, `ldconfig -r` makes soname
/// links and the cache, and `<root>/sbin/ldconfig` (what the activator
/// runs) reads that cache.
fn host_ldconfig(host: &Host) {
    let ldconfig = kubeslot_test_support::require_tool("ldconfig", "libc-bin");
    fs::write(
        host.path("etc/ld.so.conf"),
        "include /etc/ld.so.conf.d/*.conf\n/usr/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu/vdpau\n\
         /usr/lib/x86_64-linux-gnu/nvidia/current\n/usr/lib/i386-linux-gnu\n",
    )
    .unwrap();
    let o = Command::new(&ldconfig)
        .arg("-r")
        .arg(host.root.dir())
        .output()
        .unwrap();
    assert!(o.status.success(), "ldconfig -r: {}", stderr(&o));
    let wrapper = host.path("sbin/ldconfig");
    fs::create_dir_all(wrapper.parent().unwrap()).unwrap();
    fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec '{}' -r '{}' \"$@\"\n",
            ldconfig.display(),
            host.root.dir().display()
        ),
    )
    .unwrap();
    fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755)).unwrap();
}

/// What `<root>/sbin/ldconfig -p` lists.
fn host_cache(host: &Host) -> String {
    let out = Command::new(host.path("sbin/ldconfig"))
        .arg("-p")
        .output()
        .unwrap();
    assert!(out.status.success(), "ldconfig -p: {}", stderr(&out));
    stdout(&out)
}

fn require_x86_64() {
    assert_eq!(
        std::env::consts::ARCH,
        "x86_64",
        "the fake driver root is built with this machine's cc and its golden \
         files are recorded for x86_64 (the CI machines): run this test there"
    );
}

/// The `.nspawn` lines that bind the driver (libraries and tools), and
/// the comments on what was left out.
fn driver_lines(nspawn: &str) -> Vec<&str> {
    nspawn
        .lines()
        .filter(|l| l.contains(":/run/host-nvidia") || l.starts_with("# not bound"))
        .collect()
}

/// Renders `scenario` on a host with GPUs and the fake driver installed:
/// the invariants, the driver's lines in the `.nspawn` file (`want`) and
/// the golden files; returns the facts.
fn driver_layout_golden(host: &Host, scenario: &str, want: &[&str]) -> HostFacts {
    let config = load_scenario(scenario);
    let facts = render::gather(&host.root, &config).unwrap();
    let files = render::render(&config, Slot::Kube1, &facts);
    check_invariants(&files, "kube1");
    let nspawn = file(&files, ".nspawn");
    assert_eq!(driver_lines(nspawn), want, "{nspawn}");
    for line in [
        "Bind=/dev/nvidia-caps",
        "Bind=/dev/nvidia-caps-imex-channels",
    ] {
        assert!(nspawn.lines().any(|l| l == line), "{line}:\n{nspawn}");
    }
    check_golden(scenario, &files);
    facts
}

#[test]
fn golden_gpu_driver_distro() {
    require_x86_64();
    let host = Host::new();
    host.add_gpus();
    install_fake_driver(&host, "550.127.05", Layout::Distro);
    let listing = host_cache(&host);
    // what the real tool says about the objects cc made
    assert!(
        listing.contains("libcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1")
            && listing
                .contains("libnvidia-ml.so.1 (libc6) => /usr/lib/i386-linux-gnu/libnvidia-ml.so.1"),
        "{listing}"
    );
    // /usr/bin is the host's: only the driver's tool in it is bound
    driver_layout_golden(
        &host,
        "gpu-driver-distro",
        &[
            "BindReadOnly=/usr/lib/x86_64-linux-gnu:/run/host-nvidia/0",
            "BindReadOnly=/usr/lib/x86_64-linux-gnu/vdpau:/run/host-nvidia/1",
            "BindReadOnly=/usr/lib/i386-linux-gnu:/run/host-nvidia-i386/0",
            "BindReadOnly=/usr/bin/nvidia-smi:/run/host-nvidia-bin/nvidia-smi",
        ],
    );
}

#[test]
fn golden_gpu_driver_usr_local_nvidia() {
    require_x86_64();
    let host = Host::new();
    host.add_gpus();
    install_fake_driver(&host, "580.159.04", Layout::UsrLocalNvidia);
    assert!(
        host_cache(&host)
            .contains("libcuda.so.1 (libc6,x86-64) => /usr/local/nvidia/lib64/libcuda.so.1"),
        "lib64 is in the loader cache through ld.so.conf.d"
    );
    // the driver's own bin holds only its tools: bound whole, so the
    // wrapper's target is what the node runs; the stale wrapper is named
    driver_layout_golden(
        &host,
        "gpu-driver-usr-local-nvidia",
        &[
            "BindReadOnly=/usr/local/nvidia/lib64:/run/host-nvidia/0",
            "BindReadOnly=/usr/local/nvidia/bin:/run/host-nvidia-bin",
            "# not bound: \"/usr/bin/nvidia-imex\" is a script that runs \
             /opt/nvidia-imex/bin/nvidia-imex, which is not a driver tool beside the \
             driver's libraries or in /usr/bin",
        ],
    );
}

#[test]
fn golden_gpu_driver_operator() {
    require_x86_64();
    let host = Host::new();
    host.add_gpus();
    install_fake_driver(&host, "570.172.08", Layout::Operator);
    assert!(
        !host_cache(&host).contains("libcuda"),
        "the host's loader cache knows nothing of the driver container's libraries"
    );
    // the config names the driver root (the object form of "gpu"); the
    // container's /usr/bin is a system dir too: each tool alone
    let config = load_scenario("gpu-driver-operator");
    assert_eq!(
        config.gpu.driver_root.as_deref(),
        Some(Path::new("/run/nvidia/driver"))
    );
    let facts = driver_layout_golden(
        &host,
        "gpu-driver-operator",
        &[
            "BindReadOnly=/run/nvidia/driver/usr/lib/x86_64-linux-gnu:/run/host-nvidia/0",
            "BindReadOnly=/run/nvidia/driver/usr/bin/nvidia-smi:/run/host-nvidia-bin/nvidia-smi",
        ],
    );
    // without gpu.driver_root the same driver is found: the operator's
    // root holds one
    let mut detected = config.clone();
    detected.gpu.driver_root = None;
    let again = render::gather(&host.root, &detected).unwrap();
    assert_eq!(again.gpu, facts.gpu);
    // an empty mount point (the driver container not running) holds none
    fs::remove_dir_all(host.path("run/nvidia/driver")).unwrap();
    fs::create_dir_all(host.path("run/nvidia/driver")).unwrap();
    let none = render::gather(&host.root, &detected).unwrap();
    assert!(none.gpu.library_dirs.is_empty() && none.gpu.tools.tools.is_empty());
}

/// The host files are rendered again before every start of the machine
/// (the render oneshot), so a driver upgraded under the node is bound at the
/// next start: an upgrade in place keeps the bound directories (the machine
/// sees the new files there; its setup unit links them), and a driver that
/// moves (here: to Debian's packaged layout behind `/etc/alternatives`) is
/// bound from its new directories.
#[test]
fn a_driver_upgraded_under_the_node_is_bound_at_the_next_start() {
    require_x86_64();
    let host = Host::new();
    host.fake_systemctl();
    host.add_gpus();
    host.write_config(&CLI_CONFIG.replace("LABEL", "a"));
    install_fake_driver(&host, "550.127.05", Layout::Distro);
    ok(host.render(&["kube1"]));
    assert_eq!(host.systemctl_calls(), ["daemon-reload"]);
    let before = host.read("etc/systemd/nspawn/kube1.nspawn");
    assert!(
        before.contains("BindReadOnly=/usr/lib/x86_64-linux-gnu:/run/host-nvidia/0\n")
            && before
                .contains("BindReadOnly=/usr/bin/nvidia-smi:/run/host-nvidia-bin/nvidia-smi\n"),
        "{before}"
    );

    // 550 -> 570 in place: the same directories, nothing to rewrite
    remove_fake_driver(&host, "550.127.05");
    install_fake_driver(&host, "570.86.10", Layout::Distro);
    // ldconfig moved the soname link to the new file
    assert_eq!(
        fs::read_link(host.path("usr/lib/x86_64-linux-gnu/libcuda.so.1")).unwrap(),
        Path::new("libcuda.so.570.86.10")
    );
    assert_eq!(
        ok(host.render(&["kube1"])).trim(),
        "kube1: host files unchanged"
    );
    assert_eq!(host.systemctl_calls().len(), 1);

    // 570 -> 580 from the distribution's packages: other directories
    remove_fake_driver(&host, "570.86.10");
    for dir in ["usr/lib/i386-linux-gnu", "usr/lib/x86_64-linux-gnu/vdpau"] {
        fs::remove_dir_all(host.path(dir)).unwrap();
    }
    install_fake_driver(&host, "580.65.06", Layout::DebianPackaged);
    let out = ok(host.render(&["kube1"]));
    assert!(
        out.contains("wrote etc/systemd/nspawn/kube1.nspawn"),
        "{out}"
    );
    // nspawn reads its settings file at the start: no unit changed, no reload
    assert_eq!(host.systemctl_calls(), ["daemon-reload"]);
    let after = host.read("etc/systemd/nspawn/kube1.nspawn");
    assert!(
        after
            .contains("BindReadOnly=/usr/lib/x86_64-linux-gnu/nvidia/current:/run/host-nvidia/0\n")
            && after.contains(
                "BindReadOnly=/usr/lib/nvidia/current/nvidia-smi:/run/host-nvidia-bin/nvidia-smi\n"
            ),
        "{after}"
    );
    assert!(
        !after.contains("host-nvidia-i386") && !after.contains("vdpau"),
        "{after}"
    );
}

#[test]
fn gpu_on_without_gpus_is_an_error_and_gpu_off_binds_nothing() {
    let host = Host::new();
    host.fake_ldconfig();
    let e = render::gather(&host.root, &config_with("on"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("gpu mode is \"on\"") && e.contains("/dev"),
        "{e}"
    );
    host.add_gpus();
    let on = render::gather(&host.root, &config_with("on")).unwrap();
    assert!(on.gpu.devices.contains(&"/dev/nvidia1".to_string()));
    assert!(
        !on.gpu.library_dirs.is_empty(),
        "libraries from <root>/sbin/ldconfig"
    );
    let off = render::gather(&host.root, &config_with("off")).unwrap();
    assert!(off.gpu.devices.is_empty() && off.gpu.library_dirs.is_empty());
    let files = render::render(&config_with("off"), Slot::Kube1, &off);
    assert!(!file(&files, ".nspawn").contains("nvidia"));
}
