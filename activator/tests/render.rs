//! Black-box tests of a node machine's host files: golden files per scenario
//! (`testdata/render/<scenario>/`: the input `config.json`, the expected
//! `files/` tree and `modes.txt`), GPU discovery on fixture `/dev` trees
//! (real character devices made with mknod: the tests run as root), and the
//! `render` command run against a temp root with a fake `systemctl` first on
//! `PATH` that records its calls.
//!
//! This file is the harness (a temp host, the scenarios, the golden and
//! invariant checks); the tests sit in `golden` (no GPU), `gpus` (fixture
//! devices and drivers), `refusals` and `command` (the `render` binary).
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

mod command;
mod golden;
mod gpus;
mod refusals;

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

fn load_scenario(name: &str) -> Config {
    Config::load(&testdata("render").join(name).join("config.json")).unwrap()
}

// ---------------------------------------------------------------------------
// a fake driver root: real ELF objects and the real ldconfig

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

// ---------------------------------------------------------------------------
// the `render` command

const CLI_CONFIG: &str = r#"{"image":"ghcr.io/example/node:v1","kubelet":{
    "api_server":"https://10.0.0.1:6443","ca_file":"/etc/kubeslot/cluster-ca.pem",
    "bootstrap_token":"abcdef.0123456789abcdef","labels":{"pool":"LABEL"}}}"#;

// ---------------------------------------------------------------------------
// systemd's own parsers accept the golden files
