//! Black-box tests of a node machine's host files: golden files per scenario
//! (`testdata/render/<scenario>/`: the input `config.json`, the expected
//! `files/` tree and `modes.txt`), GPU discovery on fixture `/dev` trees
//! (real character devices made with mknod: the tests run as root), and the
//! `render` command run against a temp root with a fake `systemctl` first on
//! `PATH` that records its calls.
//!
//! `KUBESLOT_UPDATE_GOLDEN=1` rewrites the golden files; without it any
//! difference fails the test and prints the diff.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kubeslot_activator::config::{Config, GpuMode};
use kubeslot_activator::paths::Root;
use kubeslot_activator::render::gpu::{self, Arch};
use kubeslot_activator::render::{self, HostFacts, HostFiles};
use kubeslot_activator::slot::Slot;
use kubeslot_test_support::workspace_root;

const BIN: &str = env!("CARGO_BIN_EXE_kubeslot-activator");

use kubeslot_test_support::golden::{testdata, updating as update_golden};

const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIBdzCCAR2gAwIBAgIUKubeslotTestCAfilexxxxxxxxxxwCgYIKoZIzj0EAwIw\n-----END CERTIFICATE-----\n";

/// A fake host under a temp dir: host name, systemd-resolved's upstream
/// list (and the stub in /etc/resolv.conf that must never be used), a CA
/// file, `/dev/null`, and a `bin/` for fake tools.
struct Host {
    _dir: tempfile::TempDir,
    root: Root,
}

impl Host {
    fn new() -> Host {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let w = |rel: &str, text: &str| {
            let p = root.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, text).unwrap();
        };
        w("etc/hostname", "Node-A\n");
        w(
            "run/systemd/resolve/resolv.conf",
            "# This is /run/systemd/resolve/resolv.conf managed by man:systemd-resolved(8).\n\
             nameserver 192.0.2.1\nnameserver 127.0.0.53\nnameserver 192.0.2.2\nsearch example.internal\n",
        );
        w(
            "etc/resolv.conf",
            "nameserver 127.0.0.53\noptions edns0 trust-ad\n",
        );
        w("etc/kubeslot/cluster-ca.pem", CA);
        fs::create_dir_all(root.lib_modules().join("6.1.0-28-amd64")).unwrap();
        gpu::mknod_char(&root.join("dev/null"), 1, 3).unwrap();
        fs::create_dir_all(root.join("bin")).unwrap();
        Host { _dir: dir, root }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    fn read(&self, rel: &str) -> String {
        fs::read_to_string(self.path(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
    }

    fn add_gpus(&self) {
        let dev = self.root.dev();
        for (name, major, minor) in [
            ("nvidia0", 195, 0),
            ("nvidia1", 195, 1),
            ("nvidiactl", 195, 255),
            ("nvidia-modeset", 195, 254),
            ("nvidia-uvm", 510, 0),
            ("nvidia-uvm-tools", 510, 1),
            ("nvidia-caps/nvidia-cap1", 511, 1),
            ("nvidia-caps/nvidia-cap2", 511, 2),
            ("nvidia-caps-imex-channels/channel0", 234, 0),
            ("dri/card1", 226, 1),
            ("dri/renderD128", 226, 128),
        ] {
            gpu::mknod_char(&dev.join(name), major, minor).unwrap();
        }
        // neither a directory nor a symlink is a device
        fs::create_dir_all(dev.join("nvidia-dir-not-a-device")).unwrap();
        fs::create_dir_all(dev.join("dri/by-path")).unwrap();
        std::os::unix::fs::symlink("../card1", dev.join("dri/by-path/pci-0000:01:00.0-card"))
            .unwrap();
    }

    fn remove_gpus(&self) {
        let dev = self.root.dev();
        for e in fs::read_dir(&dev).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("nvidia") || name == "dri" {
                let p = e.path();
                if p.is_dir() {
                    fs::remove_dir_all(p).unwrap();
                } else {
                    fs::remove_file(p).unwrap();
                }
            }
        }
    }

    /// `<root>/sbin/ldconfig` printing the recorded cache of this machine's
    /// architecture (the binary picks the host architecture).
    fn fake_ldconfig(&self) {
        let fixture = match std::env::consts::ARCH {
            "aarch64" => "gpu/ldconfig-arm64.txt",
            _ => "gpu/ldconfig-amd64.txt",
        };
        let p = self.path("sbin/ldconfig");
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(
            &p,
            format!("#!/bin/sh\ncat '{}'\n", testdata(fixture).display()),
        )
        .unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        self.materialize(fixture);
    }

    /// Every library a recorded `ldconfig -p` listing names, as an empty
    /// file under the root: the activator binds only directories whose
    /// libraries exist on the host.
    fn materialize(&self, fixture: &str) {
        for line in fs::read_to_string(testdata(fixture)).unwrap().lines() {
            if let Some((_, path)) = line.split_once(" => ") {
                let p = self.path(path.trim());
                fs::create_dir_all(p.parent().unwrap()).unwrap();
                fs::write(p, b"").unwrap();
            }
        }
    }

    /// A fake `systemctl` first on PATH that appends its arguments to
    /// `<root>/systemctl.calls`.
    fn fake_systemctl(&self) {
        let p = self.path("bin/systemctl");
        fs::write(
            &p,
            format!(
                "#!/bin/sh\necho \"$*\" >> '{}'\n",
                self.path("systemctl.calls").display()
            ),
        )
        .unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn systemctl_calls(&self) -> Vec<String> {
        fs::read_to_string(self.path("systemctl.calls"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn write_config(&self, json: &str) {
        let p = self.root.default_config();
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, json).unwrap();
    }

    fn render(&self, args: &[&str]) -> Output {
        let path = format!(
            "{}:{}",
            self.path("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        Command::new(BIN)
            .arg("render")
            .arg("--root")
            .arg(self.root.dir())
            .args(args)
            .env("PATH", path)
            .output()
            .unwrap()
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn ok(o: Output) -> String {
    assert!(
        o.status.success(),
        "render failed: {}\n{}",
        stderr(&o),
        stdout(&o)
    );
    stdout(&o)
}

/// Every regular file under `dir` (relative path → mode, inode, bytes).
fn tree(dir: &Path) -> BTreeMap<PathBuf, (u32, u64, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries {
            let p = e.unwrap().path();
            let m = fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                stack.push(p);
            } else if m.is_file() {
                out.insert(
                    p.strip_prefix(dir).unwrap().to_path_buf(),
                    (m.mode() & 0o7777, m.ino(), fs::read(&p).unwrap()),
                );
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------
// golden files

/// The facts of a scenario: gathered from a fake host (CA, DNS, host name,
/// extra devices) with GPU discovery pinned to the scenario's architecture
/// so the golden files do not depend on the machine running the test.
fn scenario_facts(host: &Host, config: &Config, gpu_arch: Option<Arch>) -> HostFacts {
    let mut no_gpu = config.clone();
    no_gpu.gpu.mode = GpuMode::Off;
    let mut facts = render::gather(&host.root, &no_gpu).unwrap();
    if let Some(arch) = gpu_arch {
        let fixture = match arch {
            Arch::Amd64 => "gpu/ldconfig-amd64.txt",
            Arch::Arm64 => "gpu/ldconfig-arm64.txt",
        };
        host.materialize(fixture);
        facts.gpu = gpu::discover(&host.root, &config.gpu, Some(arch), || {
            Ok(fs::read_to_string(testdata(fixture)).unwrap())
        })
        .unwrap();
    }
    facts
}

fn check_golden(scenario: &str, files: &HostFiles) {
    let base = testdata("render").join(scenario);
    let dir = base.join("files");
    let modes: String = files
        .files
        .iter()
        .map(|f| format!("{:04o} {}\n", f.mode, f.path.display()))
        .collect();
    if update_golden() {
        let _ = fs::remove_dir_all(&dir);
        for f in &files.files {
            let p = dir.join(&f.path);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, &f.contents).unwrap();
        }
        fs::write(base.join("modes.txt"), &modes).unwrap();
    }
    let mut problems = String::new();
    let golden = tree(&dir);
    for f in &files.files {
        match golden.get(&f.path) {
            None => problems += &format!("{}: rendered, but no golden file\n", f.path.display()),
            Some((_, _, want)) => {
                let want = String::from_utf8_lossy(want);
                let shown = f.path.display();
                problems += &render::unified(
                    &want,
                    &f.contents,
                    &format!("golden/{shown}"),
                    &format!("rendered/{shown}"),
                );
            }
        }
    }
    for p in golden.keys() {
        if !files.files.iter().any(|f| &f.path == p) {
            problems += &format!("{}: golden file not rendered\n", p.display());
        }
    }
    let want_modes = fs::read_to_string(base.join("modes.txt")).unwrap_or_default();
    problems += &render::unified(
        &want_modes,
        &modes,
        "golden/modes.txt",
        "rendered/modes.txt",
    );
    assert!(
        problems.is_empty(),
        "scenario {scenario} differs from testdata/render/{scenario} \
         (KUBESLOT_UPDATE_GOLDEN=1 accepts the new output):\n{problems}"
    );
}

fn file<'a>(files: &'a HostFiles, suffix: &str) -> &'a str {
    &files
        .files
        .iter()
        .find(|f| f.path.to_string_lossy().ends_with(suffix))
        .unwrap_or_else(|| panic!("no rendered file ending in {suffix}"))
        .contents
}

/// Invariants every scenario keeps, beyond matching its golden files.
fn check_invariants(files: &HostFiles, machine: &str) {
    let nspawn = file(files, &format!("{machine}.nspawn"));
    let dropin = file(files, "override.conf");
    // DeviceAllow= for every bound device, and no other; a bound device
    // directory is allowed by its group (char-<directory name>)
    let (dirs, bound): (Vec<&str>, Vec<&str>) = nspawn
        .lines()
        .filter_map(|l| l.strip_prefix("Bind=/dev/"))
        .partition(|d| d.starts_with("nvidia-caps") && !d.contains('/'));
    let allowed: Vec<&str> = dropin
        .lines()
        .filter_map(|l| l.strip_prefix("DeviceAllow=/dev/"))
        .map(|l| l.strip_suffix(" rwm").expect("rwm"))
        .collect();
    assert_eq!(bound, allowed, "{nspawn}\n{dropin}");
    let groups: Vec<&str> = dropin
        .lines()
        .filter_map(|l| l.strip_prefix("DeviceAllow=char-"))
        .map(|l| l.strip_suffix(" rwm").expect("rwm"))
        // every machine may use the tap devices a CNI makes for pods
        .filter(|g| !["ipvtap", "macvtap"].contains(g))
        .collect();
    for tap in ["ipvtap", "macvtap"] {
        assert!(
            dropin.contains(&format!("\nDeviceAllow=char-{tap} rwm\n")),
            "{dropin}"
        );
    }
    // the private BPF filesystem: mounted before the machine starts (the
    // drop-in requires its mount unit), bound at /sys/fs/bpf
    assert!(
        nspawn.contains(&format!("\nBind=/run/bpffs/{machine}:/sys/fs/bpf\n")),
        "{nspawn}"
    );
    assert!(
        dropin.contains(&format!("\nRequiresMountsFor=/run/bpffs/{machine}\n")),
        "{dropin}"
    );
    let mount = file(files, &format!("run-bpffs-{machine}.mount"));
    assert!(
        mount.contains(&format!(
            "\nWhat=bpf\nWhere=/run/bpffs/{machine}\nType=bpf\n"
        )),
        "{mount}"
    );
    // the kubelet's environment file is always bound: nothing the image
    // or the node puts there is read
    assert!(
        nspawn.contains(&format!(
            "\nBindReadOnly=/etc/kubeslot/host/{machine}/default-kubelet:/etc/default/kubelet\n"
        )),
        "{nspawn}"
    );
    assert!(!file(files, "default-kubelet").contains("KUBELET_ARGS="));
    assert_eq!(dirs, groups, "{nspawn}\n{dropin}");
    // nothing inside a bound directory is bound again
    for d in &dirs {
        assert!(
            !bound.iter().any(|b| b.starts_with(&format!("{d}/"))),
            "{nspawn}"
        );
    }
    for key in [
        "Boot=yes",
        "Capability=all",
        "PrivateUsers=no",
        "SystemCallFilter=@keyring bpf perf_event_open",
        "Bind=/var/lib/kubeslot/node/kubelet:/var/lib/kubelet",
        "Bind=/var/lib/kubeslot/node/containerd:/var/lib/containerd",
        &format!("BindReadOnly=/etc/kubeslot/host/{machine}:/etc/kubeslot/host"),
    ] {
        assert!(nspawn.lines().any(|l| l == key), "{key} missing:\n{nspawn}");
    }
    assert_eq!(system_bin_binds(nspawn), Vec::<&str>::new(), "{nspawn}");
    let unit_section = dropin.split("[Service]").next().unwrap();
    assert!(
        unit_section.contains("StartLimitIntervalSec=0\n"),
        "{dropin}"
    );
    assert!(unit_section.contains(&format!("Requires=kubeslot-render@{machine}.service\n")));
    assert!(dropin.contains(&format!(
        "ExecStartPre=-/usr/bin/machinectl terminate {machine}\n"
    )));
    assert!(!file(files, "resolv.conf").contains("127.0.0.53"));
    // the credential is root-only; nothing else is secret
    for f in &files.files {
        let secret = f.path.ends_with("bootstrap-kubeconfig") || f.path.ends_with("kubeconfig");
        assert_eq!(
            f.mode,
            if secret { 0o600 } else { 0o644 },
            "{}",
            f.path.display()
        );
    }
    let paths: Vec<_> = files.files.iter().map(|f| f.path.clone()).collect();
    let mut sorted = paths.clone();
    sorted.sort();
    assert_eq!(paths, sorted);
}

/// The bind sources in a `.nspawn` file that are a system program
/// directory (of the host or of a driver tree): the node would get every
/// program in it.
fn system_bin_binds(nspawn: &str) -> Vec<&str> {
    nspawn
        .lines()
        .filter_map(|l| {
            l.strip_prefix("BindReadOnly=")
                .or_else(|| l.strip_prefix("Bind="))
        })
        .map(|l| l.split(':').next().unwrap().trim_end_matches('/'))
        .filter(|src| {
            kubeslot_activator::paths::host::SYSTEM_BIN_DIRS
                .iter()
                .any(|d| *src == *d || (d.starts_with("/usr/") && src.ends_with(d)))
        })
        .collect()
}

#[test]
fn no_golden_binds_a_system_program_directory() {
    let mut seen = 0;
    for scenario in fs::read_dir(testdata("render")).unwrap() {
        let nspawn_dir = scenario.unwrap().path().join("files/etc/systemd/nspawn");
        for f in fs::read_dir(&nspawn_dir).unwrap() {
            let text = fs::read_to_string(f.unwrap().path()).unwrap();
            assert_eq!(
                system_bin_binds(&text),
                Vec::<&str>::new(),
                "{}",
                nspawn_dir.display()
            );
            seen += 1;
        }
    }
    assert_eq!(seen, 12);
    // the check itself finds what issue 25's host was given
    assert_eq!(
        system_bin_binds("BindReadOnly=/usr/bin:/run/host-nvidia-bin\nBind=/usr/local/bin/\nBindReadOnly=/run/nvidia/driver/usr/bin:/x\nBindReadOnly=/usr/local/nvidia/bin:/y\n"),
        ["/usr/bin", "/usr/local/bin", "/run/nvidia/driver/usr/bin"]
    );
}

fn load_scenario(name: &str) -> Config {
    Config::load(&testdata("render").join(name).join("config.json")).unwrap()
}

#[test]
fn golden_no_gpu() {
    let host = Host::new();
    let config = load_scenario("no-gpu");
    // gpu "auto" on a host without GPUs: the real gather, nothing bound
    let facts = render::gather(&host.root, &config).unwrap();
    assert!(facts.gpu.devices.is_empty());
    let files = render::render(&config, Slot::Kube1, &facts);
    check_invariants(&files, "kube1");
    assert!(!file(&files, ".nspawn").contains("/dev/"));
    assert_eq!(file(&files, "kube1/hostname"), "node-a\n");
    assert_eq!(
        file(&files, "resolv.conf")
            .lines()
            .filter(|l| l.starts_with("nameserver"))
            .collect::<Vec<_>>(),
        ["nameserver 192.0.2.1", "nameserver 192.0.2.2"]
    );
    check_golden("no-gpu", &files);
}

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

// ---------------------------------------------------------------------------
// a fake driver root: real ELF objects and the real ldconfig

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
fn golden_extra_kvm() {
    let host = Host::new();
    gpu::mknod_char(&host.path("dev/kvm"), 10, 232).unwrap();
    let config = load_scenario("extra-kvm");
    let facts = render::gather(&host.root, &config).unwrap();
    assert_eq!(facts.devices, ["/dev/kvm"]);
    let files = render::render(&config, Slot::Kube1, &facts);
    check_invariants(&files, "kube1");
    // the seed bound /dev/kvm but forgot to allow it in the device cgroup
    assert!(file(&files, "override.conf").contains("DeviceAllow=/dev/kvm rwm\n"));
    assert!(file(&files, ".nspawn").contains("VirtualEthernet=yes\n"));
    check_golden("extra-kvm", &files);
}

#[test]
fn golden_bootstrap_token() {
    let host = Host::new();
    let config = load_scenario("bootstrap-token");
    let facts = render::gather(&host.root, &config).unwrap();
    assert_eq!(
        facts.ca_pem, CA,
        "the CA comes from the ca_file under the root"
    );
    let files = render::render(&config, Slot::Kube1, &facts);
    check_invariants(&files, "kube1");
    assert!(file(&files, "bootstrap-kubeconfig").contains("token: \"07401b.f395accd246ae52d\"\n"));
    assert!(!files.files.iter().any(|f| f.path.ends_with("kubeconfig")));
    let kubelet = file(&files, "20-kubeslot.conf");
    for arg in [
        "--hostname-override=worker-7",
        "--node-labels=node.kubernetes.io/pool=general,topology.kubernetes.io/zone=zone-a",
        "--register-with-taints=dedicated=batch:NoSchedule,spot:PreferNoSchedule",
        "--bootstrap-kubeconfig=/etc/kubeslot/host/bootstrap-kubeconfig",
        "--kubeconfig=/var/lib/kubelet/kubeconfig",
    ] {
        assert!(kubelet.contains(arg), "{arg}: {kubelet}");
    }
    // settings with a KubeletConfiguration field are in the config drop-in,
    // not deprecated flags
    assert!(!kubelet.contains("--cluster-dns") && !kubelet.contains("--resolv-conf"));
    let kc = kubelet_config_json(&files);
    assert_eq!(kc["clusterDNS"], serde_json::json!(["10.96.0.10"]));
    assert_eq!(kc["clusterDomain"], "cluster.local");
    assert_eq!(kc["resolvConf"], "/etc/kubeslot/host/resolv.conf");
    assert_eq!(kc["serverTLSBootstrap"], false, "off unless asked for");
    // configured nameservers win over the host's
    assert!(file(&files, "resolv.conf").contains("nameserver 2001:db8::53\n"));
    check_golden("bootstrap-token", &files);
}

#[test]
fn golden_exec_credential() {
    let host = Host::new();
    let config = load_scenario("exec-credential");
    let facts = render::gather(&host.root, &config).unwrap();
    let files = render::render(&config, Slot::Kube1, &facts);
    check_invariants(&files, "kube1");
    let kc = file(&files, "kube1/kubeconfig");
    assert!(kc.contains("command: \"/usr/local/bin/cloud-credential-helper\"\n"));
    assert!(
        kc.contains("- \"prod \\\"eu\\\"\"\n"),
        "quoted for YAML: {kc}"
    );
    assert!(!kc.contains("token:"));
    assert!(!files
        .files
        .iter()
        .any(|f| f.path.ends_with("bootstrap-kubeconfig")));
    assert!(file(&files, "20-kubeslot.conf").contains("--kubeconfig=/etc/kubeslot/host/kubeconfig"));
    check_golden("exec-credential", &files);
}

/// The kubelet config drop-in as JSON (its comment lines stripped).
fn kubelet_config_json(files: &HostFiles) -> serde_json::Value {
    let text = file(files, "kubelet-config.conf");
    let json: String = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    serde_json::from_str(&json).unwrap_or_else(|e| panic!("not JSON: {e}\n{text}"))
}

/// Every rendered `hosts.toml`, parsed.
fn hosts_tomls(files: &HostFiles) -> BTreeMap<String, toml::Table> {
    files
        .files
        .iter()
        .filter(|f| f.path.ends_with("hosts.toml"))
        .map(|f| {
            let dir = f.path.parent().unwrap().file_name().unwrap();
            let table: toml::Table = f
                .contents
                .parse()
                .unwrap_or_else(|e| panic!("{}: not TOML: {e}", f.path.display()));
            (dir.to_string_lossy().into_owned(), table)
        })
        .collect()
}

#[test]
fn golden_pod_settings() {
    let host = Host::new();
    fs::write(
        host.path("etc/kubeslot/mirror-ca.pem"),
        CA.replace("Kubeslot", "Mirror"),
    )
    .unwrap();
    let config = load_scenario("pod-settings");
    let facts = render::gather(&host.root, &config).unwrap();
    let files = render::render(&config, Slot::Kube1, &facts);
    check_invariants(&files, "kube1");
    let kubelet = file(&files, "20-kubeslot.conf");
    assert!(
        kubelet.contains(" --node-ip=198.51.100.10,2001:db8::10"),
        "{kubelet}"
    );
    let kc = kubelet_config_json(&files);
    assert_eq!(kc["apiVersion"], "kubelet.config.k8s.io/v1beta1");
    assert_eq!(kc["kind"], "KubeletConfiguration");
    assert_eq!(kc["clusterDomain"], "k8s.example");
    assert_eq!(
        kc["clusterDNS"],
        serde_json::json!(["10.96.0.10", "fd00::a"])
    );
    assert_eq!(kc["serverTLSBootstrap"], true);
    // kubelet.config merged in as given
    assert_eq!(kc["maxPods"], 50);
    assert_eq!(kc["failSwapOn"], false);
    assert_eq!(kc["evictionHard"]["memory.available"], "200Mi");
    assert_eq!(kc["authentication"]["webhook"]["cacheTTL"], "30s");

    let nspawn = file(&files, ".nspawn");
    for bind in [
        "BindReadOnly=/etc/kubeslot/host/kube1/kubelet-config.conf:/etc/kubernetes/kubelet/config.d/50-kubeslot.conf",
        "BindReadOnly=/etc/kubeslot/host/kube1/certs.d:/etc/containerd/certs.d",
    ] {
        assert!(nspawn.lines().any(|l| l == bind), "{bind}:\n{nspawn}");
    }
    let hosts = hosts_tomls(&files);
    assert_eq!(
        hosts.keys().collect::<Vec<_>>(),
        ["docker.io", "registry.internal_5000_", "registry.k8s.io"]
    );
    let k8s = &hosts["registry.k8s.io"];
    assert_eq!(k8s["server"].as_str(), Some("https://registry.k8s.io"));
    let mirrors = k8s["host"].as_table().unwrap();
    assert_eq!(
        mirrors.keys().collect::<Vec<_>>(),
        [
            "https://backup.internal/k8s",
            "https://mirror.internal:5000"
        ]
    );
    let ca = "/etc/containerd/certs.d/registry.k8s.io/ca.crt";
    for (_, m) in mirrors {
        assert_eq!(m["capabilities"].as_array().unwrap().len(), 2);
        assert_eq!(m["ca"].as_str(), Some(ca));
    }
    // the order containerd tries them in is the config's
    let text = file(&files, "registry.k8s.io/hosts.toml");
    assert!(text.find("mirror.internal:5000").unwrap() < text.find("backup.internal").unwrap());
    assert!(file(&files, "registry.k8s.io/ca.crt").contains("MirrorTestCA"));
    // insecure: plain HTTP to the mirror; a loopback mirror is HTTP anyway
    assert!(hosts["registry.internal_5000_"]["host"]
        .as_table()
        .unwrap()
        .contains_key("http://10.0.0.7:5000"));
    assert_eq!(
        hosts["docker.io"]["server"].as_str(),
        Some("https://registry-1.docker.io")
    );
    assert!(hosts["docker.io"]["host"]
        .as_table()
        .unwrap()
        .contains_key("http://127.0.0.1:5001"));
    check_golden("pod-settings", &files);
}

/// The unbounded agent's node settings kubeslot now renders (issue 28):
/// extra host mounts, the host's kubelet extra arguments, containerd's
/// sandbox image and metrics address, an offline image bundle (verified,
/// bound read-only, listed for the import unit).
#[test]
fn golden_seed_parity() {
    let host = Host::new();
    for d in ["srv/models", "var/log/node-audit", "srv/bundle"] {
        fs::create_dir_all(host.path(d)).unwrap();
    }
    fs::write(
        host.path("etc/kubeslot/default-kubelet"),
        "# carried over from the agent's /etc/default/kubelet\nKUBELET_EXTRA_ARGS=\"--max-pods=60 --v=2\"\n",
    )
    .unwrap();
    let work = tempfile::tempdir().unwrap();
    let digest = kubeslot_test_support::image::bundle_archive(
        &work.path().join("layout"),
        "registry.example/e2e/pause:3.10.2",
        b"pause",
        &host.path("srv/bundle/pause.oci.tar"),
    );
    let text = fs::read_to_string(testdata("render/seed-parity/config.json"))
        .unwrap()
        .replace("@PAUSE_DIGEST@", &digest.to_string());
    let config = Config::parse(Path::new("config.json"), text.as_bytes()).unwrap();
    let facts = render::gather(&host.root, &config).unwrap();
    assert_eq!(facts.kubelet_extra_args, ["--max-pods=60", "--v=2"]);
    let files = render::render(&config, Slot::Kube1, &facts);
    check_invariants(&files, "kube1");
    let nspawn = file(&files, ".nspawn");
    for line in [
        "BindReadOnly=/srv/models:/var/lib/models",
        "Bind=/var/log/node-audit:/var/log/audit",
        "BindReadOnly=/srv/bundle:/etc/kubeslot/bundle",
        "BindReadOnly=/etc/kubeslot/host/kube1/containerd.toml:/etc/containerd/conf.d/50-kubeslot.toml",
    ] {
        assert!(nspawn.lines().any(|l| l == line), "{line}:\n{nspawn}");
    }
    assert!(
        file(&files, "default-kubelet").contains("KUBELET_EXTRA_ARGS=\"--max-pods=60 --v=2\"\n")
    );
    let toml: toml::Table = file(&files, "containerd.toml").parse().unwrap();
    assert_eq!(toml["version"].as_integer(), Some(3));
    assert_eq!(
        toml["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"].as_str(),
        Some("registry.example/e2e/pause:3.10.2")
    );
    assert_eq!(toml["metrics"]["address"].as_str(), Some("0.0.0.0:10257"));
    assert!(file(&files, "bundle-images").ends_with(&format!(
        "\nregistry.example/e2e/pause:3.10.2 {digest} pause.oci.tar\n"
    )));
    check_golden("seed-parity", &files);

    // what the host lacks or breaks is named, before anything is written
    let gather_err = |h: &Host| render::gather(&h.root, &config).unwrap_err().to_string();
    fs::remove_dir(host.path("var/log/node-audit")).unwrap();
    let e = gather_err(&host);
    assert!(
        e.starts_with("extra_mounts: host path /var/log/node-audit (for /var/log/audit): No such file or directory"),
        "{e}"
    );
    fs::create_dir_all(host.path("var/log/node-audit")).unwrap();
    fs::write(
        host.path("etc/kubeslot/default-kubelet"),
        "KUBELET_EXTRA_ARGS=\"--hostname-override=x\"\n",
    )
    .unwrap();
    let e = gather_err(&host);
    assert!(
        e.starts_with("/etc/kubeslot/default-kubelet:1: --hostname-override is set by kubeslot (use kubelet.node_name)"),
        "{e}"
    );
    fs::remove_file(host.path("etc/kubeslot/default-kubelet")).unwrap();
    let facts = render::gather(&host.root, &config).unwrap();
    assert!(facts.kubelet_extra_args.is_empty());
    fs::write(host.path("srv/bundle/pause.oci.tar"), b"not an archive").unwrap();
    let e = gather_err(&host);
    assert!(
        e.starts_with("images.bundle /srv/bundle/pause.oci.tar (registry.example/e2e/pause:3.10.2): oci-archive"),
        "{e}"
    );
}

#[test]
fn golden_mirrors_from_registries() {
    let host = Host::new();
    let config = load_scenario("mirrors-from-registries");
    let facts = render::gather(&host.root, &config).unwrap();
    let files = render::render(&config, Slot::Kube1, &facts);
    check_invariants(&files, "kube1");
    // the activator's own mirrors for the node image, nothing else
    let hosts = hosts_tomls(&files);
    assert_eq!(
        hosts.keys().collect::<Vec<_>>(),
        ["registry.internal_5000_"]
    );
    let h = &hosts["registry.internal_5000_"];
    assert_eq!(h["server"].as_str(), Some("https://registry.internal:5000"));
    let text = file(&files, "hosts.toml");
    let order: Vec<usize> = [
        "https://mirror-a.internal:5000",
        "http://127.0.0.1:5001",
        "http://mirror-b.internal",
    ]
    .iter()
    .map(|m| {
        text.find(&format!("[host.\"{m}\"]"))
            .unwrap_or_else(|| panic!("{m}: {text}"))
    })
    .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{text}");
    assert!(!text.contains("ca ="));
    check_golden("mirrors-from-registries", &files);

    // an explicit empty map turns the default off: no certs.d, no bind
    let mut none = config.clone();
    none.containerd.registry_mirrors = Some(Default::default());
    let files = render::render(&none, Slot::Kube1, &facts);
    assert!(hosts_tomls(&files).is_empty());
    assert!(!file(&files, ".nspawn").contains("certs.d"));
}

#[test]
fn kubelet_config_refuses_the_fields_the_activator_owns() {
    for (object, names) in [
        (r#"{"clusterDNS":["10.0.0.10"]}"#, "kubelet.cluster_dns"),
        (r#"{"clusterDomain":"x"}"#, "kubelet.cluster_domain"),
        (
            r#"{"serverTLSBootstrap":true}"#,
            "kubelet.server_tls_bootstrap",
        ),
        (r#"{"resolvConf":"/etc/resolv.conf"}"#, "resolv.conf"),
        (r#"{"healthzPort":10300}"#, "health.kubelet_healthz_url"),
        (r#"{"cgroupDriver":"cgroupfs"}"#, "systemd"),
        (r#"{"kind":"KubeletConfiguration"}"#, "header"),
        (
            r#"{"authentication":{"x509":{"clientCAFile":"/x"}}}"#,
            "authentication.x509.clientCAFile",
        ),
    ] {
        let json = TOKEN_CONFIG.replace("GPU", "off").replace(
            r#""bootstrap_token""#,
            &format!(r#""config":{object},"bootstrap_token""#),
        );
        let e = Config::parse(Path::new("/etc/kubeslot/activator.json"), json.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/etc/kubeslot/activator.json")
                && e.contains("kubelet.config")
                && e.contains("set by the activator")
                && e.contains(names),
            "{object}: {e}"
        );
    }
    // other authentication settings are the user's
    let json = TOKEN_CONFIG.replace("GPU", "off").replace(
        r#""bootstrap_token""#,
        r#""config":{"authentication":{"webhook":{"cacheTTL":"1m"}}},"bootstrap_token""#,
    );
    Config::parse(Path::new("c.json"), json.as_bytes()).unwrap();
}

#[test]
fn pod_settings_refusals_name_the_field() {
    let host = Host::new();
    let mut c = config_with("off");
    c.kubelet.node_ip = Some("198.51.100.1,198.51.100.2".into());
    let e = c.validate(Path::new("test.json")).unwrap_err().to_string();
    assert!(
        e.contains("kubelet.node_ip") && e.contains("198.51.100.2"),
        "{e}"
    );
    c.kubelet.node_ip = Some("node-1".into());
    assert!(c.validate(Path::new("test.json")).is_err());

    let mut c = config_with("off");
    c.kubelet.cluster_domain = "Cluster.Local".into();
    let e = c.validate(Path::new("test.json")).unwrap_err().to_string();
    assert!(e.contains("kubelet.cluster_domain"), "{e}");

    let mut c = config_with("off");
    c.containerd.registry_mirrors = Some(
        [(
            "registry.k8s.io".to_string(),
            kubeslot_activator::config::RegistryMirror {
                mirrors: vec!["mirror.internal\"\n[x]".into()],
                ..Default::default()
            },
        )]
        .into(),
    );
    let e = c.validate(Path::new("test.json")).unwrap_err().to_string();
    assert!(
        e.contains("containerd.registry_mirrors") && e.contains("is not a mirror"),
        "{e}"
    );

    // a CA file the host does not have: named, nothing rendered
    let mut c = config_with("off");
    c.containerd.registry_mirrors = Some(
        [(
            "registry.k8s.io".to_string(),
            kubeslot_activator::config::RegistryMirror {
                mirrors: vec!["mirror.internal".into()],
                ca_file: Some("/etc/kubeslot/missing-mirror-ca.pem".into()),
                ..Default::default()
            },
        )]
        .into(),
    );
    let e = render::gather(&host.root, &c).unwrap_err().to_string();
    assert!(
        e.contains("/etc/kubeslot/missing-mirror-ca.pem")
            && e.contains("registry.k8s.io")
            && e.contains("ca_file"),
        "{e}"
    );
}

#[test]
fn a_dropped_registry_loses_its_certs_d_files() {
    let host = Host::new();
    host.fake_systemctl();
    fs::write(host.path("etc/kubeslot/mirror-ca.pem"), CA).unwrap();
    let with = CLI_CONFIG.replace("LABEL", "a").replace(
        r#""image""#,
        r#""containerd":{"registry_mirrors":{"registry.k8s.io":{"mirrors":["mirror.internal"],"ca_file":"/etc/kubeslot/mirror-ca.pem"},"quay.io":{"mirrors":["mirror.internal"]}}},"image""#,
    );
    host.write_config(&with);
    ok(host.render(&["kube1"]));
    let certs = host.path("etc/kubeslot/host/kube1/certs.d");
    assert!(certs.join("registry.k8s.io/ca.crt").is_file());
    assert!(certs.join("quay.io/hosts.toml").is_file());
    host.write_config(&with.replace(r#","quay.io":{"mirrors":["mirror.internal"]}"#, ""));
    let out = ok(host.render(&["kube1"]));
    assert!(
        out.contains("removed etc/kubeslot/host/kube1/certs.d/quay.io/hosts.toml"),
        "{out}"
    );
    assert!(
        !certs.join("quay.io").exists(),
        "the registry's dir goes too"
    );
    assert!(certs.join("registry.k8s.io/hosts.toml").is_file());
    assert_eq!(
        host.systemctl_calls().len(),
        1,
        "no unit changed, no reload"
    );
}

// ---------------------------------------------------------------------------
// gather: GPU modes and refusals

const TOKEN_CONFIG: &str = r#"{"image":"ghcr.io/example/node:v1","gpu":"GPU","kubelet":{
    "api_server":"https://10.0.0.1:6443","ca_file":"/etc/kubeslot/cluster-ca.pem",
    "bootstrap_token":"abcdef.0123456789abcdef"}}"#;

fn config_with(gpu: &str) -> Config {
    Config::parse(
        Path::new("test.json"),
        TOKEN_CONFIG.replace("GPU", gpu).as_bytes(),
    )
    .unwrap()
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

#[test]
fn lib_modules_is_bound_only_when_the_host_has_it() {
    let host = Host::new();
    let config = config_with("off");
    let with = render::gather(&host.root, &config).unwrap();
    assert!(with.lib_modules);
    let nspawn = render::render(&config, Slot::Kube1, &with);
    assert!(file(&nspawn, ".nspawn").contains("\nBindReadOnly=/lib/modules\n"));
    fs::remove_dir_all(host.path("lib/modules")).unwrap();
    let without = render::gather(&host.root, &config).unwrap();
    assert!(!without.lib_modules);
    let files = render::render(&config, Slot::Kube1, &without);
    assert!(!file(&files, ".nspawn").contains("/lib/modules"));
}

#[test]
fn refusals_name_what_is_wrong() {
    let host = Host::new();
    // only the stub: no real upstream anywhere
    fs::remove_file(host.path("run/systemd/resolve/resolv.conf")).unwrap();
    let e = render::gather(&host.root, &config_with("off"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("etc/resolv.conf") && e.contains("127.0.0.53"),
        "{e}"
    );
    fs::write(host.path("etc/resolv.conf"), "nameserver 198.51.100.7\n").unwrap();
    render::gather(&host.root, &config_with("off")).unwrap();

    let mut c = config_with("off");
    c.devices = vec![PathBuf::from("/dev/kvm")];
    let e = render::gather(&host.root, &c).unwrap_err().to_string();
    assert!(e.contains("/dev/kvm") && e.contains("not found"), "{e}");

    let mut c = config_with("off");
    c.kubelet.labels.insert("role".into(), "a b".into());
    let e = c.validate(Path::new("test.json")).unwrap_err().to_string();
    // a config error (checked when the config is loaded), naming the file
    assert!(
        e.contains("test.json") && e.contains("kubelet.labels") && e.contains("\"a b\""),
        "{e}"
    );

    let mut c = config_with("off");
    c.kubelet
        .labels
        .insert("node-role.kubernetes.io/worker".into(), "".into());
    let e = c.validate(Path::new("test.json")).unwrap_err().to_string();
    assert!(
        e.contains("node-role.kubernetes.io/worker") && e.contains("may not set"),
        "{e}"
    );

    let mut c = config_with("off");
    c.kubelet.taints = vec!["dedicated=x:Sometimes".into()];
    let e = c.validate(Path::new("test.json")).unwrap_err().to_string();
    assert!(e.contains("kubelet.taints"), "{e}");

    let mut c = config_with("off");
    c.nameservers = vec!["127.0.0.53".into()];
    let e = render::gather(&host.root, &c).unwrap_err().to_string();
    assert!(e.contains("nameservers") && e.contains("loopback"), "{e}");

    fs::write(
        host.path("etc/kubeslot/cluster-ca.pem"),
        "not a certificate\n",
    )
    .unwrap();
    let e = render::gather(&host.root, &config_with("off"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("/etc/kubeslot/cluster-ca.pem") && e.contains("not a PEM"),
        "{e}"
    );
}

// ---------------------------------------------------------------------------
// the `render` command

const CLI_CONFIG: &str = r#"{"image":"ghcr.io/example/node:v1","kubelet":{
    "api_server":"https://10.0.0.1:6443","ca_file":"/etc/kubeslot/cluster-ca.pem",
    "bootstrap_token":"abcdef.0123456789abcdef","labels":{"pool":"LABEL"}}}"#;

#[test]
fn render_with_an_unusable_config_exits_3_and_writes_nothing() {
    let host = Host::new();
    host.fake_systemctl();
    host.fake_ldconfig();
    let before = tree(host.root.dir());
    let config = host.root.default_config();

    // missing
    let o = host.render(&["kube1"]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains(&config.display().to_string()), "{e}");

    // an unknown field
    host.write_config(&CLI_CONFIG.replace("\"image\"", "\"imgae\":1,\"image\""));
    let o = host.render(&["kube2"]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stderr(&o).contains("imgae"), "{}", stderr(&o));

    // readable, but names a CA file the host does not have
    fs::remove_file(host.path("etc/kubeslot/cluster-ca.pem")).unwrap();
    host.write_config(&CLI_CONFIG.replace("LABEL", "a"));
    let o = host.render(&["kube1"]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("cluster-ca.pem"), "{e}");

    // nothing was written: the tree is what it was, less the CA and the
    // config this test removed and wrote
    fs::remove_file(&config).unwrap();
    let mut after = tree(host.root.dir());
    let mut before = before;
    before.retain(|p, _| !p.ends_with("cluster-ca.pem"));
    after.retain(|p, _| !p.ends_with("cluster-ca.pem"));
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>()
    );
    assert!(
        host.systemctl_calls().is_empty(),
        "{:?}",
        host.systemctl_calls()
    );
}

#[test]
fn render_rewrites_and_reloads_only_when_devices_change() {
    let host = Host::new();
    host.fake_systemctl();
    host.fake_ldconfig();
    host.write_config(&CLI_CONFIG.replace("LABEL", "a"));

    let out = ok(host.render(&["kube1"]));
    assert!(
        out.contains("kube1: wrote etc/systemd/nspawn/kube1.nspawn"),
        "{out}"
    );
    assert!(
        out.contains("wrote etc/systemd/system/kubeslot-render@.service"),
        "{out}"
    );
    assert_eq!(host.systemctl_calls(), ["daemon-reload"]);
    assert_eq!(
        fs::metadata(host.path("etc/kubeslot/host/kube1/bootstrap-kubeconfig"))
            .unwrap()
            .mode()
            & 0o7777,
        0o600
    );
    assert_eq!(
        fs::metadata(host.path("etc/kubeslot/host/kube1"))
            .unwrap()
            .mode()
            & 0o777,
        0o700
    );
    assert!(
        host.path("var/lib/kubeslot/node/kubelet").is_dir(),
        "Bind= sources exist"
    );
    assert!(host.path("var/lib/kubeslot/node/containerd").is_dir());
    let shipped =
        fs::read_to_string(workspace_root().join("activator/units/kubeslot-render@.service"))
            .unwrap();
    assert_eq!(
        host.read("etc/systemd/system/kubeslot-render@.service"),
        shipped
    );

    // the same devices: nothing written (same inodes), no reload
    let before = tree(&host.path("etc"));
    let out = ok(host.render(&["kube1"]));
    assert_eq!(out.trim(), "kube1: host files unchanged");
    assert_eq!(tree(&host.path("etc")), before);
    assert_eq!(host.systemctl_calls().len(), 1);

    // a reboot brings GPUs: re-rendered with the new binds, reloaded
    host.add_gpus();
    let out = ok(host.render(&["kube1"]));
    assert!(
        out.contains("wrote etc/systemd/system/systemd-nspawn@kube1.service.d/override.conf"),
        "{out}"
    );
    assert!(
        !out.contains("kubeconfig"),
        "unchanged files are not rewritten: {out}"
    );
    assert_eq!(host.systemctl_calls(), ["daemon-reload", "daemon-reload"]);
    let nspawn = host.read("etc/systemd/nspawn/kube1.nspawn");
    assert!(
        nspawn.contains("Bind=/dev/nvidia0\n") && nspawn.contains(":/run/host-nvidia/0\n"),
        "{nspawn}"
    );
    let dropin = host.read("etc/systemd/system/systemd-nspawn@kube1.service.d/override.conf");
    assert!(
        dropin.contains("DeviceAllow=/dev/nvidia0 rwm\n")
            && dropin.contains("DeviceAllow=/dev/dri/renderD128 rwm\n")
    );
    ok(host.render(&["kube1"]));
    assert_eq!(host.systemctl_calls().len(), 2);

    // and a reboot without them removes the binds again
    host.remove_gpus();
    ok(host.render(&["kube1"]));
    assert_eq!(host.systemctl_calls().len(), 3);
    assert!(!host
        .read("etc/systemd/nspawn/kube1.nspawn")
        .contains("nvidia"));

    // a drifted mode of the credential's dir is repaired, nothing rewritten
    fs::set_permissions(
        host.path("etc/kubeslot/host/kube1"),
        fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    assert_eq!(
        ok(host.render(&["kube1"])).trim(),
        "kube1: host files unchanged"
    );
    assert_eq!(
        fs::metadata(host.path("etc/kubeslot/host/kube1"))
            .unwrap()
            .mode()
            & 0o777,
        0o700
    );

    // a kubelet setting changes host files only: no reload needed
    host.write_config(&CLI_CONFIG.replace("LABEL", "b"));
    let out = ok(host.render(&["kube1"]));
    assert_eq!(
        out.trim(),
        "kube1: wrote etc/kubeslot/host/kube1/20-kubeslot.conf"
    );
    assert_eq!(host.systemctl_calls().len(), 3);
}

#[test]
fn concurrent_renders_of_one_machine_take_turns() {
    let host = Host::new();
    host.fake_systemctl();
    host.write_config(&CLI_CONFIG.replace("LABEL", "a"));
    // all start on a fresh root, so all of them write: without the lock
    // one's stale-file sweep removes another's temp file mid-write
    for round in 0..5 {
        host.write_config(&CLI_CONFIG.replace("LABEL", &format!("r{round}")));
        let path = format!(
            "{}:{}",
            host.path("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let children: Vec<_> = (0..6)
            .map(|_| {
                Command::new(BIN)
                    .args(["render", "--root"])
                    .arg(host.root.dir())
                    .arg("kube1")
                    .env("PATH", &path)
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for c in children {
            ok(c.wait_with_output().unwrap());
        }
        let dir = tree(&host.path("etc/kubeslot/host/kube1"));
        assert_eq!(dir.len(), 7, "{:?}", dir.keys().collect::<Vec<_>>());
        assert!(host
            .read("etc/kubeslot/host/kube1/20-kubeslot.conf")
            .contains(&format!("pool=r{round}")));
    }
}

#[test]
fn unreadable_ca_fails_naming_the_file_and_writes_nothing() {
    let host = Host::new();
    host.fake_systemctl();
    let missing = CLI_CONFIG.replace("cluster-ca.pem", "missing-ca.pem");

    // first render on a fresh host: nothing at all appears
    host.write_config(&missing);
    let o = host.render(&["kube1"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains(
            &host
                .path("etc/kubeslot/missing-ca.pem")
                .display()
                .to_string()
        ),
        "{e}"
    );
    assert!(e.contains("cluster CA"), "{e}");
    assert!(!host.path("etc/systemd").exists() && !host.path("etc/kubeslot/host").exists());

    // after a good render, a bad config leaves every file as it was
    host.write_config(&CLI_CONFIG.replace("LABEL", "a"));
    ok(host.render(&["kube1"]));
    let before = tree(&host.path("etc"));
    host.write_config(&missing.replace("LABEL", "changed"));
    let o = host.render(&["kube1"]);
    assert!(!o.status.success(), "{}", stdout(&o));
    let mut after = tree(&host.path("etc"));
    let config = PathBuf::from("kubeslot/activator.json");
    after.insert(config.clone(), before[&config].clone());
    assert_eq!(after, before, "nothing half-written");
    assert_eq!(host.systemctl_calls(), ["daemon-reload"]);
}

#[test]
fn switching_to_an_exec_credential_removes_the_stale_token() {
    let host = Host::new();
    host.fake_systemctl();
    host.write_config(&CLI_CONFIG.replace("LABEL", "a"));
    ok(host.render(&["kube2"]));
    assert!(host
        .path("etc/kubeslot/host/kube2/bootstrap-kubeconfig")
        .exists());
    fs::write(
        host.path("etc/kubeslot/host/kube2/.tmp-left-by-a-crash"),
        "x",
    )
    .unwrap();
    host.write_config(&CLI_CONFIG.replace("LABEL", "a").replace(
        r#""bootstrap_token":"abcdef.0123456789abcdef""#,
        r#""exec_credential":{"command":"/usr/local/bin/helper"}"#,
    ));
    let out = ok(host.render(&["kube2"]));
    assert!(
        out.contains("kube2: removed etc/kubeslot/host/kube2/bootstrap-kubeconfig"),
        "{out}"
    );
    assert!(
        out.contains("kube2: removed etc/kubeslot/host/kube2/.tmp-left-by-a-crash"),
        "{out}"
    );
    assert!(!host
        .path("etc/kubeslot/host/kube2/bootstrap-kubeconfig")
        .exists());
    assert!(host
        .read("etc/kubeslot/host/kube2/kubeconfig")
        .contains("/usr/local/bin/helper"));
    assert_eq!(host.systemctl_calls().len(), 1, "no unit changed");
    // the other machine's files are not this render's business
    assert!(!host.path("etc/kubeslot/host/kube1").exists());
}

#[test]
fn the_config_a_slot_was_activated_with_wins() {
    let host = Host::new();
    host.fake_systemctl();
    host.write_config(
        &CLI_CONFIG
            .replace("LABEL", "a")
            .replace("\"labels\"", "\"node_name\":\"current\",\"labels\""),
    );
    let mut activated = config_with("off");
    activated.kubelet.node_name = Some("activated".into());
    let saved = render::save_inputs(&host.root, Slot::Kube1, &activated).unwrap();
    assert_eq!(fs::metadata(&saved).unwrap().mode() & 0o777, 0o600);
    ok(host.render(&["kube1"]));
    assert_eq!(host.read("etc/kubeslot/host/kube1/hostname"), "activated\n");
    // an explicit --config wins over both
    let explicit = host.path("explicit.json");
    fs::write(
        &explicit,
        CLI_CONFIG
            .replace("LABEL", "a")
            .replace("\"labels\"", "\"node_name\":\"explicit\",\"labels\""),
    )
    .unwrap();
    ok(host.render(&["--config", explicit.to_str().unwrap(), "kube1"]));
    assert_eq!(host.read("etc/kubeslot/host/kube1/hostname"), "explicit\n");
    // without saved inputs the default config is used
    ok(host.render(&["kube2"]));
    assert_eq!(host.read("etc/kubeslot/host/kube2/hostname"), "current\n");
}

#[test]
fn diff_shows_what_write_would_change() {
    let host = Host::new();
    let config = config_with("off");
    let facts = render::gather(&host.root, &config).unwrap();
    let files = render::render(&config, Slot::Kube1, &facts);
    let d = render::diff(&host.root, &files);
    assert_eq!(d.len(), files.files.len());
    assert!(
        d.iter().all(|f| f.diff.starts_with("--- /dev/null\n")),
        "{d:?}"
    );
    render::write(&host.root, &files).unwrap();
    assert!(render::diff(&host.root, &files)
        .iter()
        .all(|f| f.diff.is_empty()));
    let mut c2 = config.clone();
    c2.kubelet.cluster_dns = vec!["10.96.0.10".into()];
    let files2 = render::render(&c2, Slot::Kube1, &facts);
    let changed: Vec<_> = render::diff(&host.root, &files2)
        .into_iter()
        .filter(|f| !f.diff.is_empty())
        .collect();
    assert_eq!(changed.len(), 1, "{changed:?}");
    assert!(
        changed[0].path.ends_with("kubelet-config.conf"),
        "{changed:?}"
    );
    assert!(
        changed[0].diff.contains("+  \"clusterDNS\": ["),
        "{}",
        changed[0].diff
    );
    assert!(changed[0].diff.contains("+    \"10.96.0.10\""));
    // a registry mirror shows up as new files (plan prints this diff)
    let mut c3 = config.clone();
    c3.registries.insert(
        "ghcr.io".into(),
        kubeslot_activator::config::RegistryConfig {
            mirrors: vec!["mirror.internal:5000".into()],
            ..Default::default()
        },
    );
    let files3 = render::render(&c3, Slot::Kube1, &facts);
    let d3 = render::diff(&host.root, &files3);
    let hosts = d3
        .iter()
        .find(|f| f.path.ends_with("certs.d/ghcr.io/hosts.toml"))
        .expect("hosts.toml in the plan's diff");
    assert!(hosts.diff.starts_with("--- /dev/null\n"), "{}", hosts.diff);
    assert!(hosts
        .diff
        .contains("+[host.\"https://mirror.internal:5000\"]"));
    // a wrong mode is a difference too, and write repairs it
    let kc = host.path("etc/kubeslot/host/kube1/bootstrap-kubeconfig");
    fs::set_permissions(&kc, fs::Permissions::from_mode(0o644)).unwrap();
    let d = render::diff(&host.root, &files);
    assert!(
        d.iter().any(|f| f.diff.contains("mode 0644 -> 0600")),
        "{d:?}"
    );
    let outcome = render::write(&host.root, &files).unwrap();
    assert_eq!(
        outcome.changed,
        [PathBuf::from(
            "etc/kubeslot/host/kube1/bootstrap-kubeconfig"
        )]
    );
    assert!(!outcome.dropin_changed);
    assert_eq!(fs::metadata(&kc).unwrap().mode() & 0o777, 0o600);
}

// ---------------------------------------------------------------------------
// systemd's own parsers accept the golden files

/// Every golden scenario's `.nspawn` file goes through `systemd-nspawn`'s
/// settings parser (a settings file beside an empty directory: nspawn parses
/// it, then refuses the directory), and its drop-in and render unit through
/// `systemd-analyze verify` on the stock `systemd-nspawn@.service`. Any
/// unknown key, wrong section or malformed bind is a warning line: none may
/// appear. The golden files equal the rendered output (the tests above), so
/// this checks what `render` writes.
#[test]
fn golden_files_pass_systemds_own_parsers() {
    let nspawn = kubeslot_test_support::require_tool("systemd-nspawn", "systemd-container");
    let analyze = kubeslot_test_support::require_tool("systemd-analyze", "systemd");
    let stock = Path::new("/lib/systemd/system/systemd-nspawn@.service");
    assert!(
        stock.exists(),
        "{} is missing: install it with `apt-get install systemd-container`",
        stock.display()
    );
    let mut checked = 0;
    for scenario in fs::read_dir(testdata("render")).unwrap() {
        let files = scenario.unwrap().path().join("files");
        let machine = if files.join("etc/systemd/nspawn/kube2.nspawn").exists() {
            "kube2"
        } else {
            "kube1"
        };
        let work = tempfile::tempdir().unwrap();

        // the .nspawn file
        fs::create_dir(work.path().join(machine)).unwrap();
        fs::copy(
            files.join(format!("etc/systemd/nspawn/{machine}.nspawn")),
            work.path().join(format!("{machine}.nspawn")),
        )
        .unwrap();
        let out = Command::new(&nspawn)
            .args([
                "--settings=trusted",
                "--register=no",
                "--keep-unit",
                "-q",
                "-D",
            ])
            .arg(work.path().join(machine))
            .arg("/bin/true")
            .output()
            .unwrap();
        let err = stderr(&out);
        assert!(!out.status.success());
        let complaints: Vec<&str> = err
            .lines()
            .filter(|l| !l.contains("doesn't look like it has an OS tree"))
            .collect();
        assert!(
            complaints.is_empty() && err.contains("doesn't look like it has an OS tree"),
            "{}: systemd-nspawn complains about the settings file:\n{err}",
            files.display()
        );

        // the drop-in on the stock unit, and the render unit
        let units = work.path().join("units");
        let dropin_dir = format!("systemd-nspawn@{machine}.service.d");
        fs::create_dir_all(units.join(&dropin_dir)).unwrap();
        fs::copy(
            stock,
            units.join(format!("systemd-nspawn@{machine}.service")),
        )
        .unwrap();
        fs::copy(
            files
                .join("etc/systemd/system")
                .join(&dropin_dir)
                .join("override.conf"),
            units.join(&dropin_dir).join("override.conf"),
        )
        .unwrap();
        // the installed binary path does not exist here; verify checks it
        let render_unit =
            fs::read_to_string(files.join("etc/systemd/system/kubeslot-render@.service"))
                .unwrap()
                .replace("/usr/bin/kubeslot-activator", BIN);
        fs::write(
            units.join(format!("kubeslot-render@{machine}.service")),
            render_unit,
        )
        .unwrap();
        // the private BPF filesystem's mount unit the drop-in requires
        let bpffs = format!("run-bpffs-{machine}.mount");
        fs::copy(
            files.join("etc/systemd/system").join(&bpffs),
            units.join(&bpffs),
        )
        .unwrap();
        let out = Command::new(&analyze)
            .arg("verify")
            .arg(units.join(format!("systemd-nspawn@{machine}.service")))
            .arg(units.join(format!("kubeslot-render@{machine}.service")))
            .arg(units.join(&bpffs))
            .output()
            .unwrap();
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "{}: systemd-analyze verify: {}\n{}",
            files.display(),
            out.status,
            stderr(&out)
        );

        // the kubelet drop-in on the image's kubelet.service (its binary
        // swapped for one that exists here)
        let kubelet = work.path().join("kubelet");
        fs::create_dir_all(kubelet.join("kubelet.service.d")).unwrap();
        let unit = fs::read_to_string(workspace_root().join("recipes/files/kubelet.service"))
            .unwrap()
            .replace("/usr/local/bin/kubelet", "/bin/true");
        fs::write(kubelet.join("kubelet.service"), unit).unwrap();
        fs::copy(
            files.join(format!("etc/kubeslot/host/{machine}/20-kubeslot.conf")),
            kubelet.join("kubelet.service.d/20-kubeslot.conf"),
        )
        .unwrap();
        let out = Command::new(&analyze)
            .arg("verify")
            .arg(kubelet.join("kubelet.service"))
            .output()
            .unwrap();
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "{}: systemd-analyze verify kubelet.service: {}\n{}",
            files.display(),
            out.status,
            stderr(&out)
        );
        checked += 1;
    }
    assert_eq!(checked, 12, "one check per golden scenario");
}
