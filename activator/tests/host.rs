//! Black-box tests of the host commands (`activate`, `fetch`, `plan`,
//! `status`, `rollback`, `wait`): the real binary against a temporary `--root`, with
//! fake `systemctl`, `machinectl` and `systemd-run` scripts first on `PATH`
//! (the process boundary the real `SystemCtl` crosses).
//!
//! The fake `systemctl start systemd-nspawn@kubeN.service` launches a small
//! python3 HTTP server on the port the config's health URL names; it answers
//! `/healthz` with 200 or 500 as the started tree's `etc/fixture-health`
//! says, so an image decides whether its machine is healthy. `stop` kills it.
//! Images are OCI layouts written with the activator's `layout` module.
//!
//! This file is the harness (the fakes, [`Host`], the images); the tests
//! sit in one module per phase: `activate`, `preflight`, `fetch` (with
//! `gc` and `verify-layers`), `rollback`, `status` (with `wait` and
//! `plan`), `boot`, `adopt`, `uninstall`, `package` (the shipped units and
//! the `.deb`).

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kubeslot_activator::failpoint;
use kubeslot_activator::paths::Root;
use kubeslot_activator::slot::Slot;
use kubeslot_activator::state::{SlotStatus, State};
use kubeslot_image::digest::Digest;
use kubeslot_image::oci::Platform;
use kubeslot_test_support::image;
use kubeslot_test_support::tar::tar_with_dirs;
use kubeslot_test_support::{free_port, require_tool};

mod activate;
mod adopt;
mod boot;
mod fetch;
mod follow;
mod package;
mod plan_drain;
mod preflight;
mod rollback;
mod status;
mod stripped;
mod uninstall;
mod variant;

const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIBdummy\n-----END CERTIFICATE-----\n";

const SYSTEMCTL: &str = r#"#!/bin/bash
# fake systemctl: records calls, keeps unit state in files
F="$KUBESLOT_FAKE"
echo "systemctl $*" >> "$F/calls.log"
cmd=$1; shift
case "$cmd" in
  -M)
    # inside a machine: only `--failed` is asked (a failed gate's report)
    [ "$2" = --failed ] || { echo "fake systemctl: unexpected -M $*" >&2; exit 1; }
    echo "kubelet.service loaded failed failed kubelet: the kubeslot test node" ;;
  daemon-reload) exit 0 ;;
  is-active)
    [ "$1" = --quiet ] && shift
    [ "$(cat "$F/units/$1" 2>/dev/null)" = active ] ;;
  start)
    unit=$1
    case $unit in *.mount)
      # an overlay slot's mount unit: mounted for real, as systemd would
      f="$KUBESLOT_FAKE_ROOT/etc/systemd/system/$unit"
      where=$(sed -n 's/^Where=//p' "$f"); opts=$(sed -n 's/^Options=//p' "$f")
      mountpoint -q "$where" || mount -t overlay overlay -o "$opts" "$where" || exit 1
      echo active > "$F/units/$unit"; exit 0 ;;
    esac
    m=${unit#systemd-nspawn@}; m=${m%.service}
    tree="$KUBESLOT_FAKE_ROOT/var/lib/machines/$m"
    [ -d "$tree" ] || { echo "fake systemctl: no tree $tree" >&2; exit 1; }
    [ "$(cat "$F/units/$unit" 2>/dev/null)" = active ] && exit 0
    mode=$(cat "$tree/etc/fixture-health" 2>/dev/null || echo healthy)
    # a booting machine writes its own tree (journal, machine-id) when asked
    if [ -e "$F/write-on-start" ]; then
      mkdir -p "$tree/var/log" && date +%s%N > "$tree/var/log/boot-$(date +%s%N)"
    fi
    python3 "$F/healthz.py" "$KUBESLOT_FAKE_PORT" "$mode" </dev/null >>"$F/server.log" 2>&1 &
    echo $! > "$F/pids/$unit"
    echo active > "$F/units/$unit" ;;
  stop)
    unit=$1
    case $unit in *.mount)
      where=$(sed -n 's/^Where=//p' "$KUBESLOT_FAKE_ROOT/etc/systemd/system/$unit")
      ! mountpoint -q "$where" || umount "$where" || exit 1
      echo inactive > "$F/units/$unit"; exit 0 ;;
    esac
    if [ -f "$F/pids/$unit" ]; then
      pid=$(cat "$F/pids/$unit")
      kill "$pid" 2>/dev/null
      # wait until it is gone or a zombie (nobody may reap it)
      while [ -e "/proc/$pid" ] && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null; do sleep 0.01; done
      rm -f "$F/pids/$unit"
    fi
    echo inactive > "$F/units/$unit" ;;
  enable|disable)
    [ "$1" = --quiet ] && shift
    unit=$1
    case $unit in
      systemd-nspawn@*)
        link="$KUBESLOT_FAKE_ROOT/etc/systemd/system/machines.target.wants/$unit"
        if [ "$cmd" = enable ]; then
          mkdir -p "${link%/*}" && ln -sfn /lib/systemd/system/systemd-nspawn@.service "$link"
        else
          rm -f "$link"
        fi ;;
    esac ;;
  *) echo "fake systemctl: unexpected $cmd" >&2; exit 1 ;;
esac
"#;

/// machined: `show` knows a machine whose unit runs, or one started
/// outside kubeslot's units (a file in `foreign/`).
const MACHINECTL: &str = r#"#!/bin/bash
F="$KUBESLOT_FAKE"
echo "machinectl $*" >> "$F/calls.log"
if [ "$1" = show ]; then
  m=${!#}
  [ -e "$F/foreign/$m" ] || [ "$(cat "$F/units/systemd-nspawn@$m.service" 2>/dev/null)" = active ]
  exit $?
fi
"#;

/// `journalctl -M MACHINE -n N ... _SYSTEMD_UNIT=UNIT.service + ...`: the
/// unit's last words, as the started tree's `etc/fixture-health` decides
/// them (the token of the config in one line, which a report must not
/// show).
const JOURNALCTL: &str = r#"#!/bin/bash
F="$KUBESLOT_FAKE"
echo "journalctl $*" >> "$F/calls.log"
[ "$1" = -M ] && [ "$3" = -n ] || { echo "fake journalctl: unexpected $*" >&2; exit 1; }
m=$2 unit=
for a in "$@"; do
  case $a in _SYSTEMD_UNIT=*.service) unit=${a#_SYSTEMD_UNIT=}; unit=${unit%.service} ;; esac
done
[ -n "$unit" ] || { echo "fake journalctl: no _SYSTEMD_UNIT= match in $*" >&2; exit 1; }
[ "$(cat "$F/units/systemd-nspawn@$m.service" 2>/dev/null)" = active ] || { echo "No machine '$m' known" >&2; exit 1; }
mode=$(cat "$KUBESLOT_FAKE_ROOT/var/lib/machines/$m/etc/fixture-health" 2>/dev/null || echo healthy)
echo "$m $unit[7]: started with bootstrap token abcdef.0123456789abcdef"
echo "$m $unit[7]: /healthz answers as $mode"
"#;

const OTHER: &str = r#"#!/bin/bash
echo "$(basename "$0") $*" >> "$KUBESLOT_FAKE/calls.log"
# `systemctl is-failed` inside a machine (the gate's GPU setup check): failed
# only when a test made the NVIDIA setup fail
case " $* " in
  *" is-failed "*) [ -e "$KUBESLOT_FAKE/gpu-setup-failed" ]; exit $? ;;
esac
"#;

const HEALTHZ: &str = r#"
import sys, http.server
port, mode = int(sys.argv[1]), sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = mode == "healthy" and self.path == "/healthz"
        body = b"ok" if ok else b"unhealthy"
        self.send_response(200 if ok else 500)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"#;

/// Writes a one-layer image tagged `tag` into the layout at `dir`; returns
/// its manifest digest. `health` goes to `etc/fixture-health`.
fn add_image(dir: &Path, tag: &str, health: &str) -> Digest {
    add_image_with(dir, tag, health, None)
}

/// [`add_image`] whose config names `diff_id` (when given) instead of the
/// layer's real uncompressed digest.
fn add_image_with(dir: &Path, tag: &str, health: &str, diff_id: Option<Digest>) -> Digest {
    let layout = image::open_or_create(dir);
    let version = format!("kubelet {tag}\n");
    let tar = tar_with_dirs(
        &["etc/", "usr/", "usr/bin/"],
        &[
            ("etc/fixture-health", health.as_bytes()),
            ("etc/os-release", b"ID=kubeslot-test\n"),
            ("usr/bin/kubelet-version", version.as_bytes()),
        ],
    );
    let mut layer = image::gzip_layer(&layout, &tar);
    if let Some(d) = diff_id {
        layer.diff_id = d;
    }
    image::write_manifest_image(&layout, tag, &Platform::host(), &[layer])
}

/// Four images in one layout: v1, v2 and v4 healthy, v3 never healthy.
struct Images {
    _dir: tempfile::TempDir,
    layout: PathBuf,
    v1: Digest,
    v2: Digest,
    v3: Digest,
    v4: Digest,
}

fn images() -> Images {
    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("layout");
    let v1 = add_image(&layout, "v1", "healthy");
    let v2 = add_image(&layout, "v2", "healthy");
    let v3 = add_image(&layout, "v3", "never");
    let v4 = add_image(&layout, "v4", "healthy");
    Images {
        _dir: dir,
        layout,
        v1,
        v2,
        v3,
        v4,
    }
}

/// A temporary host: root, fake systemd, config.
struct Host {
    dir: tempfile::TempDir,
    port: u16,
    layout: PathBuf,
    /// The config's `slots.mode` (`None`: unset, which is copy under a
    /// temporary root).
    slots: Option<&'static str>,
}

impl Host {
    fn new(images: &Images) -> Host {
        Host::with_slots(images, None)
    }

    fn with_slots(images: &Images, slots: Option<&'static str>) -> Host {
        require_tool("python3", "python3");
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("fake");
        for d in ["bin", "units", "pids", "foreign"] {
            fs::create_dir_all(fake.join(d)).unwrap();
        }
        for (name, text) in [
            ("systemctl", SYSTEMCTL),
            ("machinectl", MACHINECTL),
            ("journalctl", JOURNALCTL),
            ("systemd-run", OTHER),
        ] {
            let p = fake.join("bin").join(name);
            fs::write(&p, text).unwrap();
            fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        }
        fs::write(fake.join("healthz.py"), HEALTHZ).unwrap();
        fs::write(fake.join("calls.log"), "").unwrap();
        let h = Host {
            dir,
            port: free_port(),
            layout: images.layout.clone(),
            slots,
        };
        fs::create_dir_all(h.root().join("etc/kubeslot")).unwrap();
        // a host the preflight passes once kubeslot's sysctls are applied
        kubeslot_test_support::fake_host(&h.root());
        h.set_config("v1", serde_json::json!({}));
        h
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    fn fake(&self) -> PathBuf {
        self.dir.path().join("fake")
    }

    fn config_path(&self) -> PathBuf {
        self.root().join("etc/kubeslot/activator.json")
    }

    /// A config for image `tag`, with `kubelet` fields merged from `extra`.
    fn config(&self, tag: &str, extra: serde_json::Value) -> serde_json::Value {
        let mut kubelet = serde_json::json!({
            "api_server": "https://10.0.0.1:6443",
            "ca_data": CA,
            "bootstrap_token": "abcdef.0123456789abcdef",
            "node_name": "node-a",
            "labels": {"pool": "test"},
        });
        if let serde_json::Value::Object(m) = extra {
            for (k, v) in m {
                kubelet[k] = v;
            }
        }
        serde_json::json!({
            "image": format!("oci:{}:{tag}", self.layout.display()),
            "trust": {"allow_unsigned": true},
            "kubelet": kubelet,
            "gpu": "off",
            "nameservers": ["192.0.2.53"],
            "health": {
                "timeout_secs": 5,
                "successes": 2,
                "interval_ms": 50,
                "kubelet_healthz_url": format!("http://127.0.0.1:{}/healthz", self.port),
            },
            "slots": self.slots.map_or(serde_json::json!({}), |m| serde_json::json!({"mode": m})),
        })
    }

    fn set_config(&self, tag: &str, extra: serde_json::Value) {
        fs::write(
            self.config_path(),
            serde_json::to_vec_pretty(&self.config(tag, extra)).unwrap(),
        )
        .unwrap();
    }

    fn run(&self, args: &[&str], failpoint: Option<&str>) -> Output {
        self.run_in(None, args, failpoint)
    }

    /// [`Host::run`] inside the network namespace `netns` (`ip netns exec`).
    fn run_in(&self, netns: Option<&str>, args: &[&str], failpoint: Option<&str>) -> Output {
        let path = format!(
            "{}:{}",
            self.fake().join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let bin = env!("CARGO_BIN_EXE_kubeslot-activator");
        let mut cmd = match netns {
            None => Command::new(bin),
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, bin]);
                c
            }
        };
        cmd.args(args)
            .arg("--root")
            .arg(self.root())
            .env("PATH", path)
            .env("KUBESLOT_FAKE", self.fake())
            .env("KUBESLOT_FAKE_ROOT", self.root())
            .env("KUBESLOT_FAKE_PORT", self.port.to_string())
            .env_remove(failpoint::ENV);
        if let Some(f) = failpoint {
            cmd.env(failpoint::ENV, f);
        }
        cmd.output().unwrap()
    }

    /// Runs a command; returns (exit code, stdout, stderr).
    fn cmd(&self, args: &[&str]) -> (i32, String, String) {
        let out = self.run(args, None);
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn activate(&self) -> (i32, serde_json::Value, String) {
        let (code, out, err) = self.cmd(&["activate", "--json"]);
        let report = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("report on stdout: {e}\n{out}\n{err}"));
        (code, report, err)
    }

    fn state(&self) -> State {
        State::load_repairing(&Root::new(self.root())).unwrap()
    }

    fn report(&self) -> serde_json::Value {
        serde_json::from_slice(&fs::read(self.root().join("var/lib/kubeslot/report.json")).unwrap())
            .unwrap()
    }

    fn calls(&self) -> Vec<String> {
        fs::read_to_string(self.fake().join("calls.log"))
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// The calls that change something (not the `is-active` and
    /// `machinectl show` queries).
    fn changes(&self) -> Vec<String> {
        self.calls()
            .into_iter()
            .filter(|c| !c.starts_with("systemctl is-active") && !c.starts_with("machinectl show"))
            .collect()
    }

    fn clear_calls(&self) {
        fs::write(self.fake().join("calls.log"), "").unwrap();
    }

    fn unit_active(&self, slot: Slot) -> bool {
        fs::read_to_string(self.fake().join("units").join(slot.unit()))
            .is_ok_and(|s| s.trim() == "active")
    }

    fn running(&self) -> Vec<Slot> {
        Slot::ALL
            .into_iter()
            .filter(|s| self.unit_active(*s))
            .collect()
    }

    /// What a slot's tree and host files hold (path → mode and content
    /// hash), to prove a flip never touched the old slot.
    fn slot_snapshot(&self, slot: Slot) -> BTreeMap<String, String> {
        let m = slot.machine();
        let mut out = BTreeMap::new();
        let root = self.root();
        for base in [
            format!("var/lib/machines/{m}"),
            format!("etc/kubeslot/host/{m}"),
            format!("etc/systemd/nspawn/{m}.nspawn"),
            format!("etc/systemd/system/systemd-nspawn@{m}.service.d"),
        ] {
            walk(&root, &root.join(&base), &mut out);
        }
        out
    }

    fn tree_version(&self, slot: Slot) -> String {
        fs::read_to_string(
            self.root()
                .join("var/lib/machines")
                .join(slot.machine())
                .join("usr/bin/kubelet-version"),
        )
        .unwrap_or_default()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // no overlay slot stays mounted in a removed temp dir
        for slot in Slot::ALL {
            let _ = Command::new("umount")
                .arg(self.root().join("var/lib/machines").join(slot.machine()))
                .stderr(std::process::Stdio::null())
                .status();
        }
        // stop every fixture server this host started
        if let Ok(rd) = fs::read_dir(self.fake().join("pids")) {
            for e in rd.flatten() {
                if let Ok(pid) = fs::read_to_string(e.path()) {
                    let _ = Command::new("kill").arg(pid.trim()).status();
                }
            }
        }
    }
}

fn walk(root: &Path, p: &Path, out: &mut BTreeMap<String, String>) {
    let Ok(meta) = fs::symlink_metadata(p) else {
        return;
    };
    let rel = p.strip_prefix(root).unwrap().display().to_string();
    if meta.is_dir() {
        out.insert(rel, format!("dir {:o}", meta.permissions().mode()));
        let mut names: Vec<_> = fs::read_dir(p)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        names.sort();
        for n in names {
            walk(root, &n, out);
        }
    } else if meta.file_type().is_symlink() {
        out.insert(rel, format!("link {}", fs::read_link(p).unwrap().display()));
    } else {
        out.insert(
            rel,
            format!(
                "file {:o} {}",
                meta.permissions().mode(),
                Digest::of(&fs::read(p).unwrap())
            ),
        );
    }
}

fn starts_and_stops(calls: &[String]) -> Vec<&String> {
    calls
        .iter()
        .filter(|c| c.starts_with("systemctl start") || c.starts_with("systemctl stop"))
        .collect()
}

fn json(out: &str, err: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("json on stdout: {e}\n{out}\n{err}"))
}

fn inode(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    fs::symlink_metadata(p).unwrap().ino()
}

// ---------------------------------------------------------------------------
// The host's whole life: boot enablement, reconcile, foreign machines,
// preflight, adopt, uninstall.

impl Host {
    /// The host loses power: every machine is gone, unit state reset.
    fn power_off(&self) {
        if let Ok(rd) = fs::read_dir(self.fake().join("pids")) {
            for e in rd.flatten() {
                if let Ok(pid) = fs::read_to_string(e.path()) {
                    let _ = Command::new("kill").arg(pid.trim()).status();
                }
                let _ = fs::remove_file(e.path());
            }
        }
        for slot in Slot::ALL {
            let _ = fs::write(self.fake().join("units").join(slot.unit()), "inactive\n");
        }
        // wait for the servers to free the port
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// machined knows `slot`'s machine, started outside kubeslot's units.
    fn foreign(&self, slot: Slot, running: bool) {
        let p = self.fake().join("foreign").join(slot.machine());
        if running {
            fs::write(p, "").unwrap();
        } else {
            let _ = fs::remove_file(p);
        }
    }

    /// `slot`'s machine starts at boot (its machines.target.wants link).
    fn enabled(&self, slot: Slot) -> bool {
        Root::new(self.root())
            .machine_wants_link(slot.machine())
            .is_symlink()
    }
}

/// An unbounded-agent host: kube1's tree, the agent's `.nspawn` file and
/// drop-in, its boot link, its applied config with the sidecar; kube1
/// running (the fake's healthy server).
fn unbounded_host(h: &Host) {
    let root = Root::new(h.root());
    let tree = root.machine_tree("kube1");
    fs::create_dir_all(tree.join("etc")).unwrap();
    fs::create_dir_all(tree.join("usr/bin")).unwrap();
    fs::write(tree.join("etc/fixture-health"), "healthy").unwrap();
    fs::write(tree.join("usr/bin/kubelet-version"), "kubelet unbounded\n").unwrap();
    for (p, text) in [
        (
            root.nspawn_file("kube1"),
            "# unbounded-agent\n[Exec]\nCapability=all\n",
        ),
        (
            root.dropin_file("kube1"),
            "# unbounded-agent\n[Service]\nRestart=on-failure\n",
        ),
    ] {
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    }
    let link = root.machine_wants_link("kube1");
    fs::create_dir_all(link.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink("/lib/systemd/system/systemd-nspawn@.service", link).unwrap();
    let applied = root.unbounded_applied_config("kube1");
    fs::create_dir_all(applied.parent().unwrap()).unwrap();
    let bytes = fs::read(
        kubeslot_test_support::workspace_root()
            .join("testdata/adopt/token-snapshot/applied-config.json"),
    )
    .unwrap();
    fs::write(&applied, &bytes).unwrap();
    fs::write(
        format!("{}.sha256", applied.display()),
        format!("{}\n", Digest::of(&bytes).hex()),
    )
    .unwrap();
    let out = Command::new(h.fake().join("bin/systemctl"))
        .args(["start", "systemd-nspawn@kube1.service"])
        .env("KUBESLOT_FAKE", h.fake())
        .env("KUBESLOT_FAKE_ROOT", h.root())
        .env("KUBESLOT_FAKE_PORT", h.port.to_string())
        .output()
        .unwrap();
    assert!(out.status.success());
}
