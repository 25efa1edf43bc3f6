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

#[test]
fn first_activation_flip_failed_gate_bad_image_rollback_and_idempotence() {
    let img = images();
    let h = Host::new(&img);
    let root = Root::new(h.root());

    // nothing yet
    let (code, out, _) = h.cmd(&["status"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("active: none") && out.contains("no report yet"),
        "{out}"
    );

    // plan shows what the first activation would do, and writes nothing
    let (code, out, err) = h.cmd(&["plan"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("flip to kube1 ({})", img.v1)),
        "{out}"
    );
    assert!(out.contains("etc/systemd/nspawn/kube1.nspawn"), "{out}");
    assert!(!root.state_file().exists());
    assert!(!h.root().join("etc/systemd/nspawn/kube1.nspawn").exists());

    // 1. first activation: kube1 committed and running
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert_eq!(r["outcome"], "committed");
    assert_eq!(r["slot"], "kube1");
    assert_eq!(r["digest"], img.v1.to_string());
    assert_eq!(r["downloads"]["blobs_fetched"], 2);
    let names: Vec<_> = r["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        names,
        [
            "recover",
            "config",
            "resolve",
            "preflight",
            "stage",
            "render",
            "stop",
            "start",
            "health",
            "commit"
        ]
    );
    let s = h.state();
    assert_eq!(s.active, Some(Slot::Kube1));
    assert_eq!(s.slot(Slot::Kube1).status, SlotStatus::Active);
    assert_eq!(s.slot(Slot::Kube1).digest, Some(img.v1));
    assert_eq!(h.running(), [Slot::Kube1]);
    assert!(h.calls().contains(&"systemctl daemon-reload".to_string()));
    assert_eq!(h.tree_version(Slot::Kube1), "kubelet v1\n");
    assert!(h.root().join("etc/systemd/nspawn/kube1.nspawn").is_file());
    assert_eq!(h.report(), r);
    // progress on stderr (the report alone on stdout): each phase, each
    // blob fetched, the layer unpacked
    for want in [
        "activate: resolve\n",
        "activate: stage\n",
        "activate: health\n",
        "layer 1/1 sha256:",
        "unpacked 1 layer: ",
    ] {
        assert!(err.contains(want), "{want:?} not in stderr:\n{err}");
    }
    assert_eq!(err.matches(": fetched ").count(), 2, "{err}");

    // 2. idempotent re-run: no machine touched
    h.clear_calls();
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}");
    assert_eq!(r["outcome"], "up-to-date");
    assert!(starts_and_stops(&h.calls()).is_empty(), "{:?}", h.calls());
    let (_, out, _) = h.cmd(&["plan"]);
    assert!(out.contains("up to date: kube1"), "{out}");

    // 3. flip to v2: kube2, kube1's tree kept as previous
    let kube1_before = h.slot_snapshot(Slot::Kube1);
    h.set_config("v2", serde_json::json!({}));
    let (_, out, _) = h.cmd(&["plan"]);
    assert!(
        out.contains(&format!("flip kube1 ({}) -> kube2 ({})", img.v1, img.v2)),
        "{out}"
    );
    h.clear_calls();
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert_eq!(
        (r["slot"].as_str(), r["previous_slot"].as_str()),
        (Some("kube2"), Some("kube1"))
    );
    assert_eq!(
        starts_and_stops(&h.calls()),
        [
            "systemctl stop systemd-nspawn@kube1.service",
            "systemctl start systemd-nspawn@kube2.service"
        ]
    );
    let s = h.state();
    assert_eq!(s.active, Some(Slot::Kube2));
    assert_eq!(s.slot(Slot::Kube1).status, SlotStatus::Previous);
    assert_eq!(s.slot(Slot::Kube1).digest, Some(img.v1));
    assert_eq!(h.running(), [Slot::Kube2]);
    assert_eq!(h.slot_snapshot(Slot::Kube1), kube1_before);
    assert_eq!(h.tree_version(Slot::Kube2), "kubelet v2\n");

    // 4. v3 never becomes healthy: rolled back to kube2, v3 marked bad
    let kube2_before = h.slot_snapshot(Slot::Kube2);
    h.set_config("v3", serde_json::json!({}));
    h.clear_calls();
    let (code, r, err) = h.activate();
    assert_eq!(code, 2, "{err}\n{r:#}");
    assert_eq!(r["outcome"], "rolled-back");
    let e = r["error"].as_str().unwrap();
    assert!(
        e.contains("machine kube1: health check kubelet-healthz failed")
            && e.contains("rolled back to kube2"),
        "{e}"
    );
    assert!(err.contains("kubelet-healthz"), "{err}");
    assert_eq!(
        starts_and_stops(&h.calls()),
        [
            "systemctl stop systemd-nspawn@kube2.service",
            "systemctl start systemd-nspawn@kube1.service",
            "systemctl stop systemd-nspawn@kube1.service",
            "systemctl start systemd-nspawn@kube2.service",
        ]
    );
    let s = h.state();
    assert_eq!(s.active, Some(Slot::Kube2));
    assert_eq!(s.slot(Slot::Kube2).status, SlotStatus::Active);
    assert!(s.pending.is_none());
    assert_eq!(s.bad.len(), 1);
    assert_eq!(s.bad[0].digest, img.v3);
    assert!(
        s.bad[0].reason.starts_with("kubelet-healthz"),
        "{}",
        s.bad[0].reason
    );
    assert_eq!(h.running(), [Slot::Kube2]);
    assert_eq!(h.slot_snapshot(Slot::Kube2), kube2_before);
    // the failed machine's last words, read before the rollback stopped it
    let d = &r["diagnostics"];
    assert_eq!(d["machine"], "kube1");
    assert_eq!(
        d["kubelet"].as_array().unwrap().last().unwrap(),
        "kube1 kubelet[7]: /healthz answers as never"
    );
    assert_eq!(
        d["containerd"][0],
        "kube1 containerd[7]: started with bootstrap token <redacted>"
    );
    assert_eq!(
        d["failed_units"][0],
        "kubelet.service loaded failed failed kubelet: the kubeslot test node"
    );
    let calls = h.calls();
    let pos = |c: &str| calls.iter().position(|x| x.starts_with(c)).unwrap();
    assert!(
        calls
            .iter()
            .position(|x| x.starts_with("journalctl -M kube1 -n 50")
                && x.contains("_SYSTEMD_UNIT=kubelet.service"))
            .unwrap()
            < pos("systemctl stop systemd-nspawn@kube1"),
        "{calls:?}"
    );
    let (_, out, _) = h.cmd(&["status"]);
    assert!(
        out.contains("  diagnostics of kube1:\n")
            && out.contains("      kube1 kubelet[7]: /healthz answers as never\n"),
        "{out}"
    );
    assert!(!out.contains("0123456789abcdef"), "{out}");
    let (_, out, _) = h.cmd(&["status", "--json"]);
    assert!(!out.contains("0123456789abcdef"), "{out}");

    // 5. v3 is not retried on the next run
    h.clear_calls();
    let (code, r, _) = h.activate();
    assert_eq!(code, 4, "{r:#}");
    assert!(r["error"]
        .as_str()
        .unwrap()
        .contains("not retried automatically"));
    assert!(starts_and_stops(&h.calls()).is_empty(), "{:?}", h.calls());
    let (_, out, _) = h.cmd(&["status"]);
    assert!(
        out.contains("active: kube2") && out.contains(&format!("bad: {}", img.v3)),
        "{out}"
    );
    // the text speaks the words of state.json and report.json
    assert!(
        out.contains(&format!("  kube2: active {}", img.v2))
            && out.contains(&format!("  kube1: staged {}", img.v3))
            && out.contains("last run: activate (exit 4, failed)"),
        "{out}"
    );
    let (code, out, _) = h.cmd(&["wait", "--json"]);
    assert_eq!(code, 4);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out).unwrap(),
        h.report()
    );

    // 6. manual rollback: the failed v3 was staged over kube1's v1, so
    // there is no former node to go back to; refused, nothing touched
    h.clear_calls();
    let (code, _, err) = h.cmd(&["rollback"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("slot kube1 holds no committed former node"),
        "{err}"
    );
    assert!(starts_and_stops(&h.calls()).is_empty(), "{:?}", h.calls());

    // back to v1 by config: kube1 restaged (blobs reused), kube2 kept
    h.set_config("v1", serde_json::json!({}));
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert_eq!(r["slot"], "kube1");
    assert_eq!(r["downloads"]["blobs_fetched"], 0);
    assert_eq!(h.tree_version(Slot::Kube1), "kubelet v1\n");

    // now a manual rollback to kube2 (v2): no download, v1 marked bad
    h.clear_calls();
    let (code, out, err) = h.cmd(&["rollback", "--json"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (r["slot"].as_str(), r["outcome"].as_str()),
        (Some("kube2"), Some("committed"))
    );
    assert!(r.get("downloads").is_none());
    assert_eq!(
        starts_and_stops(&h.calls()),
        [
            "systemctl stop systemd-nspawn@kube1.service",
            "systemctl start systemd-nspawn@kube2.service"
        ]
    );
    let s = h.state();
    assert_eq!(s.active, Some(Slot::Kube2));
    assert_eq!(s.slot(Slot::Kube1).status, SlotStatus::Previous);
    assert!(s
        .bad
        .iter()
        .any(|b| b.digest == img.v1 && b.reason.contains("operator")));
    assert_eq!(h.running(), [Slot::Kube2]);
    assert_eq!(h.tree_version(Slot::Kube2), "kubelet v2\n");

    // the image rolled away from is not brought back by the next activate
    h.clear_calls();
    let (code, _, _) = h.activate();
    assert_eq!(code, 4);
    assert!(starts_and_stops(&h.calls()).is_empty(), "{:?}", h.calls());

    // a second rollback goes back to kube1 the same way
    let (code, _, err) = h.cmd(&["rollback"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(h.state().active, Some(Slot::Kube1));
    assert_eq!(h.running(), [Slot::Kube1]);
}

#[test]
fn crash_at_every_failpoint_keeps_the_old_slot_and_the_next_run_converges() {
    let img = images();
    // Each failpoint and the image whose activation passes it: the rollback
    // boundaries are only reached by an image that fails its gate.
    let mut cases: Vec<(&str, &str)> = failpoint::ALL
        .iter()
        .map(|f| match *f {
            "after-rollback-stop" | "after-rollback-start" => (*f, "v3"),
            _ => (*f, "v4"),
        })
        .collect();
    // A dead run's try of an unhealthy image must be rolled back by the
    // next run, not committed because its machine happens to be up.
    cases.extend([
        ("after-trying", "v3"),
        ("after-stop-old", "v3"),
        ("after-start-new", "v3"),
    ]);
    // Four at a time (the runs mostly wait on health gates): each host is
    // independent (own root, port, fake).
    for chunk in cases.chunks(4) {
        std::thread::scope(|scope| {
            for (fp, tag) in chunk {
                let img = &img;
                scope.spawn(move || crash_case(img, fp, tag, None));
            }
        });
    }
}

/// The same on overlay slots (the fake systemctl mounts their units):
/// the boundaries of staging (layer store, mount unit) and the flip.
#[test]
fn crash_at_every_failpoint_on_overlay_slots_keeps_the_old_slot_and_the_next_run_converges() {
    let img = images();
    let cases: Vec<&str> = failpoint::ALL
        .iter()
        .copied()
        .filter(|f| !f.starts_with("after-rollback"))
        .collect();
    for chunk in cases.chunks(4) {
        std::thread::scope(|scope| {
            for fp in chunk {
                let img = &img;
                scope.spawn(move || crash_case(img, fp, "v4", Some("overlay")));
            }
        });
    }
}

fn crash_case(img: &Images, fp: &str, tag: &str, slots: Option<&'static str>) {
    // kube2 runs v2, kube1 keeps v1 as the previous node: the crashing run
    // stages over a slot the state vouches for, so a state that says more
    // than the tree holds would show.
    let h = Host::with_slots(img, slots);
    let (code, _, err) = h.activate();
    assert_eq!(code, 0, "{fp}: setup: {err}");
    h.set_config("v2", serde_json::json!({}));
    let (code, _, err) = h.activate();
    assert_eq!(code, 0, "{fp}: setup: {err}");
    let (old, new) = (Slot::Kube2, Slot::Kube1);
    if slots == Some("overlay") {
        let unit = Root::new(h.root()).mount_unit_file(old.machine());
        assert!(unit.is_file(), "{fp}: {old} is no overlay slot");
    }
    let old_files = h.slot_snapshot(old);
    let want = if tag == "v4" { img.v4 } else { img.v3 };

    h.set_config(tag, serde_json::json!({}));
    let out = h.run(&["activate"], Some(fp));
    assert_eq!(
        out.status.signal(),
        Some(6),
        "{fp}: the run did not abort at the failpoint: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The old slot's tree and files are untouched whatever was hit; the
    // state names it active, unless the new slot was already committed.
    assert_eq!(h.slot_snapshot(old), old_files, "{fp}: old slot changed");
    let s = h.state();
    assert_eq!(s.slot(old).digest, Some(img.v2), "{fp}");
    match s.active {
        Some(a) if a == old => assert_eq!(s.slot(old).status, SlotStatus::Active, "{fp}"),
        Some(_) => {
            assert_eq!(fp, "after-commit", "{fp}: committed too early");
            assert_eq!(s.slot(old).status, SlotStatus::Previous);
        }
        None => panic!("{fp}: no active slot"),
    }
    // The state never claims more than the new slot's tree holds.
    let claimed = match s.slot(new).digest {
        Some(d) if d == img.v1 => Some("kubelet v1\n"),
        Some(d) if d == want => Some(if tag == "v4" {
            "kubelet v4\n"
        } else {
            "kubelet v3\n"
        }),
        Some(d) => panic!("{fp}: {new} claims {d}"),
        None => None,
    };
    if let Some(v) = claimed {
        assert_eq!(
            h.tree_version(new),
            v,
            "{fp}: {new} holds something else than {s:?}"
        );
    }

    // The next run (same config) converges.
    let (code, r, err) = h.activate();
    let s = h.state();
    assert!(s.pending.is_none(), "{fp}: {s:?}");
    assert!(
        Slot::ALL
            .iter()
            .all(|x| s.slot(*x).status != SlotStatus::Dirty),
        "{fp}: {s:?}"
    );
    let running = h.running();
    assert_eq!(running.len(), 1, "{fp}: running {running:?}");
    assert_eq!(s.active, Some(running[0]), "{fp}");
    if s.active == Some(new) {
        // committed: the new image runs, the old slot is kept
        assert_eq!(code, 0, "{fp}: {err}\n{r:#}");
        assert_eq!(s.slot(new).digest, Some(want), "{fp}");
        assert_eq!(tag, "v4", "{fp}: the unhealthy image was committed");
        assert_eq!(h.tree_version(new), "kubelet v4\n", "{fp}");
        assert_eq!(s.slot(old).status, SlotStatus::Previous, "{fp}");
        assert_eq!(h.slot_snapshot(old), old_files, "{fp}");
    } else {
        // cleanly rolled back: the old machine runs, the image is bad
        assert_eq!(s.active, Some(old), "{fp}");
        assert!(s.bad.iter().any(|b| b.digest == want), "{fp}: {s:?}");
        assert!([2, 4].contains(&code), "{fp}: exit {code}: {err}\n{r:#}");
        assert_eq!(h.slot_snapshot(old), old_files, "{fp}");
    }
    // Boundaries that leave a pending flip or a dirty slot are recovered
    // (and the report says how) before anything else.
    let leaves_work = [
        "after-mark-dirty",
        "after-stage",
        "after-render",
        "after-pending",
        "after-trying",
        "after-stop-old",
        "after-start-new",
        "after-health",
        "after-rollback-stop",
        "after-rollback-start",
        "state-between-writes",
    ];
    if leaves_work.contains(&fp) {
        assert!(
            r["recovered"].as_str().is_some_and(|t| !t.is_empty()),
            "{fp}: {r:#}"
        );
    }
}

#[test]
fn bad_configs_name_the_file_and_field_and_touch_nothing_else() {
    let img = images();
    let h = Host::new(&img);
    let root = Root::new(h.root());
    let cfg = h.config_path().display().to_string();
    let cases: Vec<(&str, serde_json::Value, &[&str])> = vec![
        (
            "unknown field",
            {
                let mut c = h.config("v1", serde_json::json!({}));
                c["imgae"] = "typo".into();
                c
            },
            &["unknown field `imgae`"],
        ),
        (
            "missing api server",
            {
                let mut c = h.config("v1", serde_json::json!({}));
                c["kubelet"].as_object_mut().unwrap().remove("api_server");
                c
            },
            &["missing field `api_server`"],
        ),
        (
            "unreadable ca",
            {
                let mut c = h.config(
                    "v1",
                    serde_json::json!({"ca_file": "/etc/kubeslot/missing-ca.crt"}),
                );
                c["kubelet"].as_object_mut().unwrap().remove("ca_data");
                c
            },
            &["kubelet.ca_file", "missing-ca.crt"],
        ),
        (
            "token and exec credential",
            h.config(
                "v1",
                serde_json::json!({"exec_credential": {"command": "/bin/get-token"}}),
            ),
            &["kubelet.bootstrap_token", "not both"],
        ),
        (
            "trusted key file missing",
            {
                let mut c = h.config("v1", serde_json::json!({}));
                c["trust"] = serde_json::json!({"public_keys": ["/etc/kubeslot/missing.pub"], "identity": "registry.example/org/node"});
                c
            },
            &["trust policy", "missing.pub"],
        ),
        (
            "a policy that accepts nothing",
            {
                let mut c = h.config("v1", serde_json::json!({}));
                c["trust"] = serde_json::json!({"identity": "registry.example/org/node"});
                c
            },
            &[
                "trust.public_keys is empty",
                "trust.allow_unsigned is false",
            ],
        ),
    ];
    for (name, config, needles) in cases {
        fs::write(h.config_path(), serde_json::to_vec(&config).unwrap()).unwrap();
        let (code, r, err) = h.activate();
        assert_eq!(code, 3, "{name}: {err}");
        let e = r["error"].as_str().unwrap();
        assert!(
            e.contains(&cfg),
            "{name}: the error does not name {cfg}: {e}"
        );
        for n in needles {
            assert!(e.contains(n), "{name}: {e} lacks {n}");
        }
        assert!(err.contains(e), "{name}: stderr {err}");
        assert_eq!(h.report(), r, "{name}");
        assert_eq!(r["outcome"], "failed");
        // nothing but the state dir's lock and report exists
        assert!(!root.machines_dir().exists(), "{name}");
        assert!(!h.root().join("etc/systemd").exists(), "{name}");
        assert!(!root.state_file().exists(), "{name}");
        assert!(h.changes().is_empty(), "{name}: {:?}", h.changes());
    }
    // a config file that does not exist at all
    fs::remove_file(h.config_path()).unwrap();
    let (code, r, _) = h.activate();
    assert_eq!(code, 3);
    assert!(r["error"].as_str().unwrap().contains(&cfg));
}

#[test]
fn host_commands_have_useful_help() {
    for (cmd, needle) in [
        ("activate", "Exit codes"),
        ("fetch", "without flipping"),
        ("plan", "writes nothing"),
        ("status", "images marked bad"),
        ("rollback", "without downloading"),
        ("wait", "Wait until a running activate"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_kubeslot-activator"))
            .args([cmd, "--help"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains(needle),
            "{cmd}: {text}"
        );
        assert!(text.contains("--root <DIR>"), "{cmd}: {text}");
    }
}

#[test]
fn an_image_that_fails_verification_changes_nothing() {
    let img = images();
    let h = Host::new(&img);
    // a trusted key that never signed the image: refused before any layer
    use p256::pkcs8::{EncodePublicKey as _, LineEnding};
    let key = p256::ecdsa::SigningKey::from_bytes(&[7u8; 32].into()).unwrap();
    let pem = key
        .verifying_key()
        .to_public_key_pem(LineEnding::LF)
        .unwrap();
    fs::write(h.root().join("etc/kubeslot/release.pub"), pem).unwrap();
    let mut c = h.config("v1", serde_json::json!({}));
    c["trust"] = serde_json::json!({"public_keys": ["/etc/kubeslot/release.pub"], "identity": "registry.example/org/node"});
    fs::write(h.config_path(), serde_json::to_vec(&c).unwrap()).unwrap();
    let (code, r, err) = h.activate();
    assert_eq!(code, 1, "{err}");
    let e = r["error"].as_str().unwrap();
    assert!(e.contains(&img.v1.to_string()), "{e}");
    assert_eq!(
        r["phases"].as_array().unwrap().last().unwrap()["name"],
        "resolve"
    );
    assert!(!Root::new(h.root()).state_file().exists());
    assert!(!h.root().join("var/lib/machines/kube1").exists());
    assert!(h.changes().is_empty(), "{:?}", h.changes());
}

/// Flips the last byte of the (only) layer blob of `manifest` in the
/// layout at `dir`: the bytes no longer match the digest that names them.
fn tamper_layer(dir: &Path, manifest: Digest) -> Digest {
    let blob = |d: &Digest| dir.join("blobs/sha256").join(d.hex());
    let m: serde_json::Value = serde_json::from_slice(&fs::read(blob(&manifest)).unwrap()).unwrap();
    let layer: Digest = m["layers"][0]["digest"].as_str().unwrap().parse().unwrap();
    let mut bytes = fs::read(blob(&layer)).unwrap();
    *bytes.last_mut().unwrap() ^= 0xff;
    fs::write(blob(&layer), bytes).unwrap();
    layer
}

#[test]
fn a_refused_blob_or_layer_leaves_the_idle_slot_and_its_rollback_alone() {
    let img = images();
    // v5: a layer blob whose bytes differ from its digest; v6: a layer
    // whose content differs from the config's diff_id
    let v5 = add_image(&img.layout, "v5", "healthy");
    let tampered = tamper_layer(&img.layout, v5);
    let v6 = add_image_with(
        &img.layout,
        "v6",
        "healthy",
        Some(Digest::of(b"another tree")),
    );
    let h = Host::new(&img);
    assert_eq!(h.activate().0, 0);
    h.set_config("v2", serde_json::json!({}));
    assert_eq!(h.activate().0, 0);
    // kube2 runs v2; kube1 keeps v1 as the rollback target
    let state = h.state();
    assert_eq!(state.slot(Slot::Kube1).status, SlotStatus::Previous);
    let kube1 = h.slot_snapshot(Slot::Kube1);
    let machines = h.root().join("var/lib/machines");

    for (tag, digest, names) in [
        ("v5", v5, vec![tampered.to_string(), "hashes to".into()]),
        ("v6", v6, vec!["diff-id".into(), "layer 0".into()]),
    ] {
        h.set_config(tag, serde_json::json!({}));
        h.clear_calls();
        let (code, r, err) = h.activate();
        assert_eq!(code, 1, "{tag}: {err}\n{r:#}");
        assert_eq!(r["digest"], digest.to_string(), "{tag}: {r:#}");
        let e = r["error"].as_str().unwrap();
        for n in &names {
            assert!(e.contains(n.as_str()), "{tag}: {n:?} not in {e}");
        }
        assert!(
            starts_and_stops(&h.calls()).is_empty(),
            "{tag}: {:?}",
            h.calls()
        );
        assert_eq!(h.state(), state, "{tag}: the state changed");
        assert_eq!(
            h.slot_snapshot(Slot::Kube1),
            kube1,
            "{tag}: kube1's tree changed"
        );
        assert_eq!(h.running(), [Slot::Kube2], "{tag}");
        let left: Vec<_> = fs::read_dir(&machines)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(
            left.is_empty(),
            "{tag}: left in {}: {left:?}",
            machines.display()
        );
    }

    // the next run has nothing to recover, and the rollback target is
    // still one
    let (code, out, err) = h.cmd(&["rollback", "--json"]);
    assert_eq!(code, 0, "{err}");
    let r = json(&out, &err);
    assert!(r.get("recovered").is_none(), "{r:#}");
    assert!(r.get("downloads").is_none(), "{r:#}");
    assert_eq!(h.running(), [Slot::Kube1]);
    assert_eq!(h.tree_version(Slot::Kube1), "kubelet v1\n");
}

#[test]
fn dry_run_writes_nothing_and_wait_blocks_on_a_running_activation() {
    let img = images();
    let h = Host::new(&img);
    let root = Root::new(h.root());
    let (code, out, err) = h.cmd(&["activate", "--dry-run", "--json"]);
    assert_eq!(code, 0, "{err}");
    let plan: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(plan["action"], "flip");
    assert_eq!(plan["to"], "kube1");
    assert_eq!(plan["digest"], img.v1.to_string());
    assert!(plan["files"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["path"] == "etc/systemd/nspawn/kube1.nspawn"));
    assert!(!root.state_file().exists() && !root.report_file().exists());
    assert!(!root.machines_dir().join("kube1").exists());

    // `wait` blocks while a run holds the lock, then prints its report
    let (code, _, _) = h.cmd(&["activate"]);
    assert_eq!(code, 0);
    let held = kubeslot_activator::lock::Lock::try_exclusive(&root).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kubeslot-activator"))
        .args(["wait", "--json", "--root"])
        .arg(h.root())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    // (a `wait` that did not block would have exited by now; one that
    // blocks can never make this fail)
    assert!(
        child.try_wait().unwrap().is_none(),
        "wait returned while the lock was held"
    );
    drop(held);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report, h.report());
    assert_eq!(report["outcome"], "committed");
}

/// `wait --provisioned`: a commit of this boot ends it (datapoints in the
/// report, shown by `status --json`); before one, or when the report is
/// from another boot, it times out with exit 1 naming why.
#[test]
fn wait_provisioned_ends_at_the_first_commit_of_this_boot() {
    let img = images();
    let h = Host::new(&img);
    let boot = h.root().join("proc/sys/kernel/random/boot_id");
    fs::create_dir_all(boot.parent().unwrap()).unwrap();
    fs::write(&boot, "boot-1\n").unwrap();
    let (code, _, err) = h.cmd(&["wait", "--provisioned", "--timeout", "1"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("not provisioned after 1 s: no report yet"),
        "{err}"
    );

    // started before the run: it waits until the commit
    let child = Command::new(env!("CARGO_BIN_EXE_kubeslot-activator"))
        .args([
            "wait",
            "--provisioned",
            "--json",
            "--timeout",
            "60",
            "--root",
        ])
        .arg(h.root())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}");
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let waited: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(waited["outcome"], "committed");
    assert_eq!(waited["boot_id"], "boot-1");
    assert_eq!(r["boot_id"], serde_json::Value::Null, "stamped when saved");
    // the run's datapoints, in order, and status shows them
    let (_, out, err) = h.cmd(&["status", "--json"]);
    let status = json(&out, &err);
    let d = &status["report"]["datapoints"];
    let points: Vec<u64> = [
        "resolved_ms",
        "verified_ms",
        "staged_ms",
        "machine_started_ms",
        "kubelet_healthy_ms",
        "committed_ms",
    ]
    .iter()
    .map(|k| d[k].as_u64().unwrap_or_else(|| panic!("{k}: {d}")))
    .collect();
    assert!(points.windows(2).all(|w| w[0] <= w[1]), "{d}");
    assert!(d["unit_started_since_boot_ms"].as_u64().is_some(), "{d}");
    let (_, out, _) = h.cmd(&["status"]);
    assert!(out.contains("  datapoints: resolved +"), "{out}");

    // after a reboot the old commit does not count
    fs::write(&boot, "boot-2\n").unwrap();
    let (code, _, err) = h.cmd(&["wait", "--provisioned", "--timeout", "1"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("is from another boot"), "{err}");
    // the boot-time run (up to date: the node runs) provisions this boot
    let (code, r, err) = h.activate();
    assert_eq!(
        (code, r["outcome"].as_str()),
        (0, Some("up-to-date")),
        "{err}"
    );
    let (code, out, err) = h.cmd(&["wait", "--provisioned", "--timeout", "5"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("last run: activate (exit 0, up-to-date)"),
        "{out}"
    );
}

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
    let out = Command::new(analyze)
        .arg("verify")
        .arg(dir.path().join("kubeslot-activator.service"))
        .arg(dir.path().join("kubeslot-activator.path"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(!text.contains("kubeslot-activator.service:"), "{text}");
}

#[test]
fn a_gpu_bound_by_the_render_oneshot_after_a_reboot_is_no_reason_to_flip() {
    let img = images();
    let h = Host::new(&img);
    let mut c = h.config("v1", serde_json::json!({}));
    c["gpu"] = "auto".into();
    fs::write(h.config_path(), serde_json::to_vec(&c).unwrap()).unwrap();
    let ldconfig = h.root().join("sbin/ldconfig");
    fs::create_dir_all(ldconfig.parent().unwrap()).unwrap();
    let marker = match std::env::consts::ARCH {
        "aarch64" => "AArch64",
        _ => "x86-64",
    };
    fs::write(
        &ldconfig,
        format!("#!/bin/sh\nprintf '1 libs found\\n\\tlibcuda.so.1 (libc6,{marker}) => /usr/lib/nvidia/libcuda.so.1\\n'\n"),
    )
    .unwrap();
    fs::set_permissions(&ldconfig, fs::Permissions::from_mode(0o755)).unwrap();
    let (code, _, err) = h.activate();
    assert_eq!(code, 0, "{err}");
    let before = h.state().slot(Slot::Kube1).inputs.clone();

    // "reboot": a GPU appeared, and the render oneshot of the machine's
    // start bound it
    kubeslot_activator::render::gpu::mknod_char(&h.root().join("dev/nvidia0"), 195, 0).unwrap();
    let (code, out, err) = h.cmd(&["render", "kube1"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("kube1.nspawn"), "{out}");
    let nspawn = fs::read_to_string(h.root().join("etc/systemd/nspawn/kube1.nspawn")).unwrap();
    assert!(nspawn.contains("Bind=/dev/nvidia0"), "{nspawn}");

    h.clear_calls();
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}");
    assert_eq!(r["outcome"], "up-to-date");
    assert!(starts_and_stops(&h.calls()).is_empty(), "{:?}", h.calls());
    assert_ne!(h.state().slot(Slot::Kube1).inputs, before);
}

#[test]
fn a_rollback_killed_mid_flip_is_recovered_by_the_next_run() {
    let img = images();
    for fp in ["after-pending", "after-stop-old", "after-start-new"] {
        let h = Host::new(&img);
        assert_eq!(h.activate().0, 0);
        h.set_config("v2", serde_json::json!({}));
        assert_eq!(h.activate().0, 0);
        let kube1 = h.slot_snapshot(Slot::Kube1);
        let kube2 = h.slot_snapshot(Slot::Kube2);

        let out = h.run(&["rollback"], Some(fp));
        assert_eq!(out.status.signal(), Some(6), "{fp}");
        assert_eq!(h.slot_snapshot(Slot::Kube2), kube2, "{fp}");
        assert_eq!(h.state().active, Some(Slot::Kube2), "{fp}");

        // the operator asks again: the dead rollback is finished or undone
        // first, then the rollback happens once
        let (code, out, err) = h.cmd(&["rollback", "--json"]);
        assert_eq!(code, 0, "{fp}: {out}\n{err}");
        let r: serde_json::Value = serde_json::from_str(&out).unwrap();
        let s = h.state();
        assert!(s.pending.is_none(), "{fp}");
        assert_eq!(h.running().len(), 1, "{fp}: {:?}", h.running());
        assert_eq!(s.active, Some(h.running()[0]), "{fp}");
        if fp == "after-start-new" {
            // kube1 was up and healthy: the dead rollback was committed,
            // and this one went back to kube2
            assert!(
                r["recovered"].as_str().unwrap().contains("committed"),
                "{r:#}"
            );
            assert_eq!(s.active, Some(Slot::Kube2), "{fp}");
        } else {
            assert_eq!(s.active, Some(Slot::Kube1), "{fp}: {r:#}");
        }
        assert_eq!(h.slot_snapshot(Slot::Kube1).len(), kube1.len(), "{fp}");
        assert_eq!(h.tree_version(Slot::Kube1), "kubelet v1\n");
        assert_eq!(h.tree_version(Slot::Kube2), "kubelet v2\n");
    }
}

fn json(out: &str, err: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("json on stdout: {e}\n{out}\n{err}"))
}

fn inode(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    fs::symlink_metadata(p).unwrap().ino()
}

#[test]
fn fetch_stages_the_inactive_slot_without_touching_the_running_machine() {
    let img = images();
    let h = Host::new(&img);
    let root = Root::new(h.root());
    assert_eq!(h.activate().0, 0);
    h.set_config("v2", serde_json::json!({}));
    let kube1 = h.slot_snapshot(Slot::Kube1);
    h.clear_calls();

    let (code, out, err) = h.cmd(&["fetch", "--json"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let r = json(&out, &err);
    assert_eq!(r["command"], "fetch");
    assert_eq!(r["outcome"], "staged", "{r:#}");
    assert_eq!(r["slot"], "kube2");
    assert_eq!(r["digest"], img.v2.to_string());
    assert!(
        r["downloads"]["blobs_fetched"].as_u64().unwrap() >= 1,
        "{r:#}"
    );
    assert_eq!(h.report(), r);
    // nothing a running machine uses was touched, nothing was called
    assert!(h.changes().is_empty(), "{:?}", h.changes());
    assert_eq!(h.running(), [Slot::Kube1]);
    assert_eq!(h.slot_snapshot(Slot::Kube1), kube1);
    assert!(!root.nspawn_file("kube2").exists());
    let s = h.state();
    assert_eq!(s.active, Some(Slot::Kube1));
    assert_eq!(s.slot(Slot::Kube2).status, SlotStatus::Staged);
    assert_eq!(s.slot(Slot::Kube2).digest, Some(img.v2));
    assert_eq!(h.tree_version(Slot::Kube2), "kubelet v2\n");
    let tree = root.machine_tree("kube2");
    let staged_inode = inode(&tree);

    // again: already staged, nothing downloaded or unpacked
    let (code, out, err) = h.cmd(&["fetch", "--json"]);
    assert_eq!(code, 0, "{err}");
    let r = json(&out, &err);
    assert_eq!(r["outcome"], "staged");
    assert!(r.get("downloads").is_none(), "{r:#}");
    assert_eq!(inode(&tree), staged_inode);

    // the fetch replaced what a rollback would have used (here: nothing
    // committed before kube1 yet), so rollback is refused, nothing touched
    let (code, _, err) = h.cmd(&["rollback"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("kube2") && err.contains("(status staged)"),
        "{err}"
    );
    assert!(starts_and_stops(&h.calls()).is_empty(), "{:?}", h.calls());

    // activate flips to the staged slot without staging it again
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert_eq!(r["outcome"], "committed");
    assert!(r.get("downloads").is_none(), "restaged: {r:#}");
    assert_eq!(inode(&tree), staged_inode, "the slot tree was replaced");
    assert_eq!(h.running(), [Slot::Kube2]);
    assert_eq!(h.state().slot(Slot::Kube2).digest, Some(img.v2));

    // the active slot runs the image: nothing to fetch
    let (code, out, err) = h.cmd(&["fetch", "--json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out, &err)["outcome"], "up-to-date");
}

#[test]
fn a_fetch_killed_at_any_step_leaves_the_running_machine_alone_and_the_next_run_converges() {
    let img = images();
    let cases = [
        "after-lock",
        "after-recover",
        "after-unpack",
        "after-mark-dirty",
        "after-stage",
        "after-staged",
        "state-between-writes",
    ];
    for chunk in cases.chunks(3) {
        std::thread::scope(|scope| {
            for fp in chunk {
                let img = &img;
                scope.spawn(move || fetch_crash_case(img, fp));
            }
        });
    }
}

fn fetch_crash_case(img: &Images, fp: &str) {
    // kube2 runs v2, kube1 keeps v1 for rollback; the fetch stages v4
    // over kube1
    let h = Host::new(img);
    assert_eq!(h.activate().0, 0, "{fp}");
    h.set_config("v2", serde_json::json!({}));
    assert_eq!(h.activate().0, 0, "{fp}");
    h.set_config("v4", serde_json::json!({}));
    let active = h.slot_snapshot(Slot::Kube2);
    h.clear_calls();

    let out = h.run(&["fetch"], Some(fp));
    assert_eq!(
        out.status.signal(),
        Some(6),
        "{fp}: no abort: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(h.slot_snapshot(Slot::Kube2), active, "{fp}");
    assert_eq!(h.running(), [Slot::Kube2], "{fp}");
    assert!(h.changes().is_empty(), "{fp}: {:?}", h.changes());
    let s = h.state();
    assert_eq!(s.active, Some(Slot::Kube2), "{fp}");
    assert_eq!(s.slot(Slot::Kube2).status, SlotStatus::Active, "{fp}");
    // the state never claims more than kube1's tree holds
    match (s.slot(Slot::Kube1).status, s.slot(Slot::Kube1).digest) {
        (SlotStatus::Previous, Some(d)) => {
            assert_eq!(d, img.v1, "{fp}");
            assert_eq!(h.tree_version(Slot::Kube1), "kubelet v1\n", "{fp}");
        }
        (SlotStatus::Staged, Some(d)) => {
            assert_eq!(d, img.v4, "{fp}");
            assert_eq!(h.tree_version(Slot::Kube1), "kubelet v4\n", "{fp}");
        }
        (SlotStatus::Dirty, None) => {}
        other => panic!("{fp}: kube1 is {other:?}"),
    }

    // the next fetch converges without touching the running machine
    let (code, out, err) = h.cmd(&["fetch", "--json"]);
    assert_eq!(code, 0, "{fp}: {out}\n{err}");
    assert_eq!(json(&out, &err)["outcome"], "staged", "{fp}");
    let s = h.state();
    assert_eq!(s.slot(Slot::Kube1).status, SlotStatus::Staged, "{fp}");
    assert_eq!(s.slot(Slot::Kube1).digest, Some(img.v4), "{fp}");
    assert_eq!(h.tree_version(Slot::Kube1), "kubelet v4\n", "{fp}");
    assert!(h.changes().is_empty(), "{fp}: {:?}", h.changes());
    assert_eq!(h.slot_snapshot(Slot::Kube2), active, "{fp}");

    // and activate only flips
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{fp}: {err}\n{r:#}");
    assert!(r.get("downloads").is_none(), "{fp}: {r:#}");
    assert_eq!(h.running(), [Slot::Kube1], "{fp}");
}

#[test]
fn rollback_refuses_a_previous_slot_whose_tree_changed() {
    let img = images();
    let h = Host::new(&img);
    let root = Root::new(h.root());
    assert_eq!(h.activate().0, 0);
    h.set_config("v2", serde_json::json!({}));
    assert_eq!(h.activate().0, 0);
    let mark = root.slot_tree_mark("kube1");
    assert!(mark.is_file(), "no tree mark recorded at commit");
    let kube2 = h.slot_snapshot(Slot::Kube2);
    let state = h.state();
    let victim = root.machine_tree("kube1").join("usr/bin/kubelet-version");
    let kept = fs::read(&victim).unwrap();
    fs::remove_file(&victim).unwrap();
    h.clear_calls();

    let refused = |what: &str, needles: &[&str]| {
        let (code, out, err) = h.cmd(&["rollback", "--json"]);
        assert_eq!(code, 1, "{what}: {out}\n{err}");
        let e = json(&out, &err)["error"].as_str().unwrap().to_string();
        for n in needles {
            assert!(e.contains(n), "{what}: {e} lacks {n}");
        }
        // the running machine is untouched, nothing was started or stopped
        assert!(
            starts_and_stops(&h.calls()).is_empty(),
            "{what}: {:?}",
            h.calls()
        );
        assert_eq!(h.running(), [Slot::Kube2], "{what}");
        assert_eq!(h.slot_snapshot(Slot::Kube2), kube2, "{what}");
        assert_eq!(h.state(), state, "{what}");
    };
    refused(
        "deleted file",
        &[
            "rollback: slot kube1",
            "var/lib/machines/kube1 has",
            "kube1.tree recorded",
            "running machine is untouched",
        ],
    );
    let saved = fs::read(&mark).unwrap();
    fs::remove_file(&mark).unwrap();
    refused("missing mark", &["kube1.tree is missing"]);

    // put back what was there: the rollback goes through
    fs::write(&mark, saved).unwrap();
    fs::write(&victim, kept).unwrap();
    let (code, out, err) = h.cmd(&["rollback", "--json"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(h.running(), [Slot::Kube1]);
    // kube2 was committed away from: its mark now vouches for it
    assert!(root.slot_tree_mark("kube2").is_file());
}

#[test]
fn status_shows_a_torn_state_and_its_repair_without_writing() {
    let img = images();
    let h = Host::new(&img);
    let root = Root::new(h.root());
    assert_eq!(h.activate().0, 0);
    h.set_config("v2", serde_json::json!({}));
    let out = h.run(&["activate"], Some("state-between-writes"));
    assert_eq!(out.status.signal(), Some(6));
    let sidecar = h.root().join("var/lib/kubeslot/state.json.sha256");
    let before = fs::read(&sidecar).unwrap();
    assert!(State::load(&root).is_err(), "the state is not torn");

    let (code, out, err) = h.cmd(&["status", "--json"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let v = json(&out, &err);
    let repair = v["repair"].as_str().unwrap();
    assert!(
        repair.contains("state.json.sha256") && repair.contains("next activate"),
        "{repair}"
    );
    assert_eq!(v["state"]["active"], "kube1");
    assert_eq!(v["state"]["slots"]["kube2"]["status"], "dirty");
    let (code, text, err) = h.cmd(&["status"]);
    assert_eq!(code, 0, "{err}");
    assert!(text.contains("repair pending: "), "{text}");
    // plan reads it the same way
    let (code, text, err) = h.cmd(&["plan"]);
    assert_eq!(code, 0, "{text}\n{err}");
    assert!(text.contains("kube2"), "{text}");
    // read-only: the sidecar still awaits its repair
    assert_eq!(fs::read(&sidecar).unwrap(), before);
    assert!(State::load(&root).is_err());

    // a healthy state has no repair
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    let (_, out, err) = h.cmd(&["status", "--json"]);
    assert!(json(&out, &err).get("repair").is_none());
}

#[test]
fn a_failed_rollback_keeps_the_previous_slot_usable_though_its_machine_wrote_its_tree() {
    let img = images();
    let h = Host::new(&img);
    // every start writes a file into the started tree, as a real boot does
    fs::write(h.fake().join("write-on-start"), "").unwrap();
    assert_eq!(h.activate().0, 0);
    h.set_config("v2", serde_json::json!({}));
    assert_eq!(h.activate().0, 0);
    // kube1 turns unhealthy (same size: its mark still matches)
    let health = Root::new(h.root())
        .machine_tree("kube1")
        .join("etc/fixture-health");
    fs::write(&health, "never!!").unwrap();
    // (an image file changed: the per-file check refuses it without
    // --force; this test is about the gate after it)
    let (code, out, err) = h.cmd(&["rollback", "--json"]);
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(
        err.contains("/etc/fixture-health (contents changed)"),
        "{err}"
    );
    let (code, out, err) = h.cmd(&["rollback", "--json", "--force"]);
    assert_eq!(code, 2, "{out}\n{err}");
    assert_eq!(h.running(), [Slot::Kube2]);
    // kube1 ran during the attempt and wrote its tree; once healthy again,
    // a rollback is accepted
    fs::write(&health, "healthy").unwrap();
    let (code, out, err) = h.cmd(&["rollback", "--json"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(h.running(), [Slot::Kube1]);
    assert_eq!(h.state().active, Some(Slot::Kube1));
}

#[test]
fn the_first_save_ever_killed_between_its_writes_is_repaired() {
    // no sidecar at all yet: only `.next` vouches for the state
    let img = images();
    let h = Host::new(&img);
    let out = h.run(&["activate"], Some("state-between-writes"));
    assert_eq!(out.status.signal(), Some(6));
    let sidecar = h.root().join("var/lib/kubeslot/state.json.sha256");
    assert!(!sidecar.exists());
    let (code, out, err) = h.cmd(&["status", "--json"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(json(&out, &err)["repair"]
        .as_str()
        .unwrap()
        .contains("missing"));
    assert!(!sidecar.exists(), "status wrote the sidecar");
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert_eq!(h.state().active, Some(Slot::Kube1));
    assert_eq!(h.running(), [Slot::Kube1]);
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

#[test]
fn boot_follows_the_commit_and_a_reboot_starts_the_committed_node() {
    let img = images();
    let h = Host::new(&img);
    assert_eq!(h.activate().0, 0);
    assert!(h.enabled(Slot::Kube1) && !h.enabled(Slot::Kube2));
    h.set_config("v2", serde_json::json!({}));
    h.clear_calls();
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert!(h.enabled(Slot::Kube2) && !h.enabled(Slot::Kube1));
    // the old machine loses its boot link before the new one gets it
    let calls = h.calls();
    let pos = |c: &str| {
        calls
            .iter()
            .position(|x| x == c)
            .unwrap_or_else(|| panic!("{c}: {calls:?}"))
    };
    assert!(
        pos("systemctl start systemd-nspawn@kube2.service")
            < pos("systemctl disable --quiet systemd-nspawn@kube1.service")
            && pos("systemctl disable --quiet systemd-nspawn@kube1.service")
                < pos("systemctl enable --quiet systemd-nspawn@kube2.service"),
        "{calls:?}"
    );

    // power loss; at boot nothing runs (no systemd here to start the
    // enabled machine): the boot-time activate starts and gates kube2
    h.power_off();
    h.clear_calls();
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert_eq!(
        (r["outcome"].as_str(), r["slot"].as_str()),
        (Some("started"), Some("kube2"))
    );
    assert!(r["phases"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["name"] == "reconcile"));
    assert_eq!(
        starts_and_stops(&h.calls()),
        ["systemctl start systemd-nspawn@kube2.service"]
    );
    assert_eq!(h.running(), [Slot::Kube2]);
    let (_, out, _) = h.cmd(&["status"]);
    assert!(
        out.contains("active: kube2") && out.contains("exit 0, started"),
        "{out}"
    );
    // running: the next boot-time run is up to date and starts nothing
    h.clear_calls();
    let (code, r, _) = h.activate();
    assert_eq!((code, r["outcome"].as_str()), (0, Some("up-to-date")));
    assert!(starts_and_stops(&h.calls()).is_empty());

    // a lost boot link is put back; a stray one of the other slot removed
    fs::remove_file(Root::new(h.root()).machine_wants_link("kube2")).unwrap();
    std::os::unix::fs::symlink("/x", Root::new(h.root()).machine_wants_link("kube1")).unwrap();
    assert_eq!(h.activate().0, 0);
    assert!(h.enabled(Slot::Kube2) && !h.enabled(Slot::Kube1));

    // the previous node started by hand while the committed one is down:
    // refused, nothing started or stopped
    h.power_off();
    h.cmd(&["status"]);
    let out = Command::new(h.fake().join("bin/systemctl"))
        .args(["start", "systemd-nspawn@kube1.service"])
        .env("KUBESLOT_FAKE", h.fake())
        .env("KUBESLOT_FAKE_ROOT", h.root())
        .env("KUBESLOT_FAKE_PORT", h.port.to_string())
        .output()
        .unwrap();
    assert!(out.status.success());
    h.clear_calls();
    let (code, r, _) = h.activate();
    assert_eq!(code, 3, "{r:#}");
    let e = r["error"].as_str().unwrap();
    assert!(
        e.contains("machine kube1 is running, but the committed node is kube2"),
        "{e}"
    );
    assert!(starts_and_stops(&h.calls()).is_empty(), "{:?}", h.calls());
    assert_eq!(h.running(), [Slot::Kube1]);
}

#[test]
fn a_committed_node_that_does_not_come_up_never_blocks_the_way_out() {
    let img = images();
    let h = Host::new(&img);
    let root = Root::new(h.root());
    // gates that fail do not take the default 5 s each
    let config = |tag: &str| {
        let mut c = h.config(tag, serde_json::json!({}));
        c["health"]["timeout_secs"] = 2.into();
        fs::write(h.config_path(), serde_json::to_vec(&c).unwrap()).unwrap();
    };
    config("v1");
    assert_eq!(h.activate().0, 0);
    // kube1's tree is gone while the host is off: its unit cannot start
    fs::remove_dir_all(root.machine_tree("kube1")).unwrap();
    h.power_off();
    // the same image: nothing else to do, so the run says the node is down
    let (code, r, err) = h.activate();
    assert_eq!(code, 1, "{err}\n{r:#}");
    let e = r["error"].as_str().unwrap();
    assert!(
        e.contains("the committed node kube1 was not running: started it, but")
            && e.contains("activate --force"),
        "{e}"
    );
    assert!(
        r["reconcile"].as_str().unwrap().contains("unit-start"),
        "{r:#}"
    );
    // a new image flips, treating kube1 as down
    config("v2");
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert_eq!(
        (r["outcome"].as_str(), r["slot"].as_str()),
        (Some("committed"), Some("kube2"))
    );
    assert!(
        r["reconcile"]
            .as_str()
            .unwrap()
            .contains("the committed node kube1 was not running"),
        "{r:#}"
    );
    assert_eq!(h.running(), [Slot::Kube2]);
    assert!(h.enabled(Slot::Kube2) && !h.enabled(Slot::Kube1));
    let s = h.state();
    assert_eq!(s.active, Some(Slot::Kube2));
    // no tree, no rollback target
    assert_eq!(s.slot(Slot::Kube1).status, SlotStatus::Empty);
    let (code, _, err) = h.cmd(&["rollback"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("kube1 holds no committed former node"),
        "{err}"
    );

    // the committed kube2 breaks (its kubelet never answers) across a
    // power cycle: the same image is refused as not healthy, --force
    // stages it afresh into kube1 and flips
    fs::write(
        root.machine_tree("kube2").join("etc/fixture-health"),
        "never",
    )
    .unwrap();
    h.power_off();
    let (code, r, _) = h.activate();
    assert_eq!(code, 1, "{r:#}");
    assert!(
        r["error"].as_str().unwrap().contains("kubelet-healthz"),
        "{r:#}"
    );
    let (code, out, err) = h.cmd(&["activate", "--json", "--force"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let r = json(&out, &err);
    assert_eq!(
        (r["outcome"].as_str(), r["slot"].as_str()),
        (Some("committed"), Some("kube1"))
    );
    assert_eq!(h.running(), [Slot::Kube1]);
    assert_eq!(h.tree_version(Slot::Kube1), "kubelet v2\n");
    // and rollback to the broken kube2 is still possible (it fails its
    // gate and kube1 runs again; its changed health file needs --force)
    let (code, _, err) = h.cmd(&["rollback", "--force"]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(h.running(), [Slot::Kube1]);
}

#[test]
fn a_second_node_machine_beside_the_running_committed_one_is_refused() {
    let img = images();
    let h = Host::new(&img);
    assert_eq!(h.activate().0, 0);
    // kube1 committed and running; something else runs a kube2 machine
    h.foreign(Slot::Kube2, true);
    h.clear_calls();
    for args in [&["activate", "--json"][..], &["fetch", "--json"][..]] {
        let (code, out, err) = h.cmd(args);
        assert_eq!(code, 3, "{args:?}: {out}\n{err}");
        assert!(
            err.contains("machine kube2 is running, but the committed node is kube1"),
            "{args:?}: {err}"
        );
    }
    assert!(
        h.report()["error"]
            .as_str()
            .unwrap()
            .contains("machine kube2 is running"),
        "{:#}",
        h.report()
    );
    assert!(starts_and_stops(&h.calls()).is_empty(), "{:?}", h.calls());
    let (_, out, _) = h.cmd(&["status"]);
    assert!(
        out.contains("running: kube1, kube2\n")
            && out.contains("warning: machine kube2 runs but is not the committed node (kube1)"),
        "{out}"
    );
    let (_, out, err) = h.cmd(&["status", "--json"]);
    assert_eq!(
        json(&out, &err)["running"],
        serde_json::json!(["kube1", "kube2"])
    );
    // gone: up to date again
    h.foreign(Slot::Kube2, false);
    let (code, r, _) = h.activate();
    assert_eq!((code, r["outcome"].as_str()), (0, Some("up-to-date")));
    let (_, out, _) = h.cmd(&["status"]);
    assert!(
        out.contains("running: kube1\n") && !out.contains("warning:"),
        "{out}"
    );
}

#[test]
fn a_running_machine_is_never_staged_over_and_a_foreign_one_names_adopt() {
    let img = images();
    // a fresh host where machined runs a kube1 nobody recorded
    let h = Host::new(&img);
    h.foreign(Slot::Kube1, true);
    for cmd in ["activate", "fetch"] {
        let (code, out, err) = h.cmd(&[cmd, "--json"]);
        assert_eq!(code, 3, "{cmd}: {out}\n{err}");
        assert!(
            err.contains("machine kube1 is running, but kubeslot has no record")
                && err.contains("kubeslot-activator adopt"),
            "{cmd}: {err}"
        );
    }
    assert!(!Root::new(h.root()).state_file().exists());
    assert!(!h.root().join("var/lib/machines/kube1").exists());
    assert!(h.changes().is_empty(), "{:?}", h.changes());

    // unbounded-agent's applied config, its machine stopped: refused too
    h.foreign(Slot::Kube1, false);
    let applied = Root::new(h.root()).unbounded_applied_config("kube1");
    fs::create_dir_all(applied.parent().unwrap()).unwrap();
    fs::write(&applied, "{}").unwrap();
    let (code, _, err) = h.cmd(&["activate"]);
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("kube1-applied-config.json exists") && err.contains("adopt"),
        "{err}"
    );
    fs::remove_file(&applied).unwrap();

    // a managed host: kube1 committed; something runs a kube2 machine
    assert_eq!(h.activate().0, 0);
    let before = h.state();
    h.foreign(Slot::Kube2, true);
    h.set_config("v2", serde_json::json!({}));
    h.clear_calls();
    for cmd in ["activate", "fetch"] {
        let (code, _, err) = h.cmd(&[cmd]);
        assert_eq!(code, 3, "{cmd}: {err}");
        assert!(
            err.contains("machine kube2 is running, but the committed node is kube1"),
            "{cmd}: {err}"
        );
    }
    assert_eq!(h.state(), before);
    assert!(!h.root().join("var/lib/machines/kube2").exists());
    assert!(starts_and_stops(&h.calls()).is_empty(), "{:?}", h.calls());
    // and once it is gone, the flip goes ahead
    h.foreign(Slot::Kube2, false);
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert_eq!(h.running(), [Slot::Kube2]);
}

#[test]
fn a_failed_preflight_refuses_the_flip_before_anything_changes() {
    let img = images();
    let h = Host::new(&img);
    let root = Root::new(h.root());
    // before the first activation: plan shows the host settings it writes,
    // the preflight command warns about what activate applies first
    let (_, out, _) = h.cmd(&["plan"]);
    assert!(
        out.contains("host settings, written and applied before the next flip:")
            && out.contains("+net.ipv4.ip_forward = 1"),
        "{out}"
    );
    let (code, out, err) = h.cmd(&["preflight"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("[WARN] sysctl-net.ipv4.ip_forward: seen 0; needed 1"),
        "{out}"
    );
    assert!(
        out.contains("[PASS] disk-space") && out.ends_with("[preflight] passed\n"),
        "{out}"
    );

    // swap on: the activation is refused, the report names the check
    let swaps = h.root().join("proc/swaps");
    fs::write(
        &swaps,
        "Filename Type Size Used Priority\n/swapfile file 1024 0 -2\n",
    )
    .unwrap();
    let (code, r, err) = h.activate();
    assert_eq!(code, 3, "{err}\n{r:#}");
    let e = r["error"].as_str().unwrap();
    assert!(
        e.starts_with("preflight: 1 check(s) failed: swap (seen: on: /swapfile"),
        "{e}"
    );
    assert_eq!(r["preflight"][0]["name"], "swap");
    assert_eq!(r["preflight"][0]["status"], "fail");
    assert!(!root.state_file().exists());
    assert!(!h.root().join("var/lib/machines/kube1").exists());
    assert!(h.running().is_empty() && starts_and_stops(&h.calls()).is_empty());
    // the host settings were written and applied first (they are the
    // host's, whatever image runs): the sysctls now hold
    assert!(root.sysctl_dropin().is_file() && root.modules_load_dropin().is_file());
    assert_eq!(
        fs::read_to_string(root.proc_sys("kernel.panic")).unwrap(),
        "10\n"
    );
    let (code, out, _) = h.cmd(&["preflight"]);
    assert_eq!(code, 3);
    assert!(out.contains("[FAIL] swap: seen on: /swapfile"), "{out}");
    let (code, out, err) = h.cmd(&["preflight", "--json", "--ignore", "swap"]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out, &err);
    assert_eq!(v["passed"], true);
    assert!(v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["name"] == "swap" && c["ignored"] == true));

    // a host whose /proc/sys does not take the settings (a container host)
    fs::write(&swaps, "Filename Type Size Used Priority\n").unwrap();
    fs::write(h.root().join("proc/sys/.read-only"), "").unwrap();
    fs::write(root.proc_sys("vm.overcommit_memory"), "0\n").unwrap();
    let (code, r, _) = h.activate();
    assert_eq!(code, 3, "{r:#}");
    assert!(
        r["error"]
            .as_str()
            .unwrap()
            .contains("sysctl-vm.overcommit_memory (seen: 0; needed: 1"),
        "{r:#}"
    );
    // said as it happened: systemd-sysctl could not write /proc/sys
    assert!(
        r["host_settings"]
            .as_str()
            .unwrap()
            .contains("systemd-sysctl")
            && r["host_settings"]
                .as_str()
                .unwrap()
                .contains("Read-only file system"),
        "{r:#}"
    );
    // ignored in the config (with the reason in the operator's records)
    let mut c = h.config("v1", serde_json::json!({}));
    c["preflight"] = serde_json::json!({"ignore": ["sysctl-*"]});
    fs::write(h.config_path(), serde_json::to_vec(&c).unwrap()).unwrap();
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert_eq!(r["preflight"][0]["ignored"], true);
    assert_eq!(h.running(), [Slot::Kube1]);
}

#[test]
fn the_host_settings_apply_kubeslots_files_and_no_other() {
    let img = images();
    let h = Host::new(&img);
    let root = Root::new(h.root());
    // Ubuntu's strict reverse-path filter, and a file an operator keeps
    // for the next boot: neither may change under a running node
    fs::create_dir_all(h.root().join("etc/sysctl.d")).unwrap();
    fs::write(
        h.root().join("etc/sysctl.d/10-network-security.conf"),
        "net.ipv4.conf.all.rp_filter = 2\n",
    )
    .unwrap();
    let rp_filter = root.proc_sys("net.ipv4.conf.all.rp_filter");
    fs::create_dir_all(rp_filter.parent().unwrap()).unwrap();
    fs::write(&rp_filter, "0\n").unwrap();
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert!(
        r["host_settings"]
            .as_str()
            .unwrap()
            .contains("applied (/lib/systemd/systemd-modules-load, /lib/systemd/systemd-sysctl)"),
        "{r:#}"
    );
    // ours took effect, the other file did not
    assert_eq!(
        fs::read_to_string(root.proc_sys("kernel.panic")).unwrap(),
        "10\n"
    );
    assert_eq!(fs::read_to_string(&rp_filter).unwrap(), "0\n");
    let log = fs::read_to_string(h.root().join(kubeslot_test_support::FAKE_TOOLS_LOG)).unwrap();
    assert_eq!(
        log,
        format!(
            "systemd-modules-load {}\nsystemd-sysctl {}\n",
            root.modules_load_dropin().display(),
            root.sysctl_dropin().display()
        )
    );
    assert!(
        !h.calls().iter().any(|c| c.contains("restart")),
        "{:?}",
        h.calls()
    );
}

impl Host {
    /// Runs `commands` (activator arguments, each with a name for its
    /// output files) one after the other in a private mount namespace whose
    /// `/var/lib/machines` is a fresh tmpfs of `mib` MiB (the content store
    /// stays on the test's filesystem); returns each one's exit code and
    /// stderr.
    fn in_small_machines_fs(&self, mib: u32, commands: &[(&str, &[&str])]) -> Vec<(i32, String)> {
        require_tool("unshare", "util-linux");
        let out = self.dir.path().join("small-fs");
        fs::create_dir_all(&out).unwrap();
        fs::create_dir_all(self.root().join("var/lib/machines")).unwrap();
        let mut script = format!(
            "mount -t tmpfs -o size={mib}m kubeslot-test \"$ROOT/var/lib/machines\" || exit 99\n"
        );
        for (name, args) in commands {
            let args: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
            script += &format!(
                "\"$ACT\" {} --root \"$ROOT\" >\"$OUT/{name}.out\" 2>\"$OUT/{name}.err\"; echo $? >\"$OUT/{name}.rc\"\n",
                args.join(" ")
            );
        }
        let path = format!(
            "{}:{}",
            self.fake().join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let status = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .env("ACT", env!("CARGO_BIN_EXE_kubeslot-activator"))
            .env("ROOT", self.root())
            .env("OUT", &out)
            .env("PATH", path)
            .env("KUBESLOT_FAKE", self.fake())
            .env("KUBESLOT_FAKE_ROOT", self.root())
            .env("KUBESLOT_FAKE_PORT", self.port.to_string())
            .env_remove(failpoint::ENV)
            .status()
            .unwrap();
        assert!(status.success(), "unshare/mount failed: {status}");
        commands
            .iter()
            .map(|(name, _)| {
                let rc = fs::read_to_string(out.join(format!("{name}.rc"))).unwrap();
                (
                    rc.trim().parse().unwrap(),
                    fs::read_to_string(out.join(format!("{name}.err"))).unwrap(),
                )
            })
            .collect()
    }
}

#[test]
fn the_disk_check_counts_what_a_flip_writes_and_fetch_checks_it_too() {
    let img = images();
    // an image whose layer (4 MiB of noise) does not fit 8 MiB unpacked
    // at the estimate for a layer not in the store yet (4 x compressed)
    let layout = image::open_or_create(&img.layout);
    let noise = kubeslot_test_support::tar::noise(7, 4 << 20);
    let tar = tar_with_dirs(
        &["etc/", "usr/", "usr/bin/"],
        &[
            ("etc/fixture-health", b"healthy"),
            ("usr/bin/kubelet-version", b"kubelet big\n"),
            ("usr/bin/noise", &noise),
        ],
    );
    let layer = image::gzip_layer(&layout, &tar);
    image::write_manifest_image(&layout, "big", &Platform::host(), &[layer]);
    let h = Host::new(&img);
    for (name, tag) in [("v2.json", "v2"), ("big.json", "big")] {
        fs::write(
            h.root().join("etc/kubeslot").join(name),
            serde_json::to_vec_pretty(&h.config(tag, serde_json::json!({}))).unwrap(),
        )
        .unwrap();
    }
    let v2 = h.root().join("etc/kubeslot/v2.json");
    let big = h.root().join("etc/kubeslot/big.json");
    let (v2, big) = (v2.to_str().unwrap(), big.to_str().unwrap());
    let ran = h.in_small_machines_fs(
        8,
        &[
            // a small image needs what it writes (no 1 GiB floor)
            ("activate-v1", &["activate"]),
            // fetch checks the space before it stages
            ("fetch-big", &["fetch", "--config", big]),
            ("fetch-v2", &["fetch", "--config", v2]),
            // the staged slot is reused: nothing to write
            ("activate-v2", &["activate", "--config", v2]),
        ],
    );
    assert_eq!(ran[0].0, 0, "activate v1: {}", ran[0].1);
    assert_eq!(ran[1].0, 3, "fetch big: {}", ran[1].1);
    assert!(
        ran[1]
            .1
            .contains("preflight: 1 check(s) failed: disk-space (seen: ")
            && ran[1]
                .1
                .contains("MiB free for the unpacked tree (4 x the compressed layers)"),
        "{}",
        ran[1].1
    );
    assert_eq!(ran[2].0, 0, "fetch v2: {}", ran[2].1);
    assert_eq!(ran[3].0, 0, "activate v2: {}", ran[3].1);
    let report = h.report();
    assert_eq!(report["outcome"], "committed", "{report:#}");
    assert!(report.get("downloads").is_none(), "restaged: {report:#}");
    assert!(report.get("preflight").is_none(), "{report:#}");
    assert_eq!(h.state().active, Some(Slot::Kube2));
}

#[test]
fn swap_passes_when_the_config_says_the_kubelet_runs_with_it() {
    let img = images();
    let h = Host::new(&img);
    fs::write(
        h.root().join("proc/swaps"),
        "Filename Type Size Used Priority\n/swapfile file 1024 0 -2\n",
    )
    .unwrap();
    let (code, r, _) = h.activate();
    assert_eq!(code, 3, "{r:#}");
    let mut c = h.config("v1", serde_json::json!({}));
    c["preflight"] = serde_json::json!({"allow_swap": true});
    fs::write(h.config_path(), serde_json::to_vec(&c).unwrap()).unwrap();
    let (code, out, err) = h.cmd(&["preflight"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("[PASS] swap: seen on: /swapfile; the kubelet allows it (preflight.allow_swap: the image's kubelet sets failSwapOn: false)"),
        "{out}"
    );
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert_eq!(h.running(), [Slot::Kube1]);
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

#[test]
fn adopt_takes_over_unbounded_agents_kube1_flips_away_and_rolls_back_to_it() {
    let img = images();
    let h = Host::new(&img);
    let root = Root::new(h.root());
    unbounded_host(&h);
    let kube1_before = h.slot_snapshot(Slot::Kube1);
    let (code, _, err) = h.cmd(&["activate"]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("adopt"), "{err}");

    // --write-config: refused without an image and key, shown by --dry-run
    let (code, _, err) = h.cmd(&["adopt", "--write-config"]);
    assert_eq!(code, 2, "{err}");
    let (code, out, err) = h.cmd(&[
        "adopt",
        "--dry-run",
        "--write-config",
        "--force",
        "--image",
        "registry.example:5000/node:v1",
        "--public-key",
        "/etc/kubeslot/trust/release.pub",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("would adopt kube1 (running)"), "{out}");
    // the config is shown without its secrets
    assert!(
        !out.contains("0123456789abcdef")
            && out.contains("\"bootstrap_token\": \"<secret: not shown>\""),
        "the token was printed: {out}"
    );
    assert!(
        out.contains(
            "carried over: api_server, ca_data, bootstrap_token, cluster_dns, labels, taints"
        ),
        "{out}"
    );
    assert!(
        out.contains("OCIImage: unbounded-agent's thin image"),
        "{out}"
    );
    assert!(!root.state_file().exists(), "dry-run wrote the state");
    // adopt for real (the test's own config stays: images here are unsigned)
    let (code, out, err) = h.cmd(&["adopt"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.starts_with("adopted kube1 (running)"), "{out}");
    let s = h.state();
    assert_eq!(s.active, Some(Slot::Kube1));
    assert!(s.slot(Slot::Kube1).adopted && s.slot(Slot::Kube1).digest.is_none());
    let (_, out, _) = h.cmd(&["status"]);
    assert!(out.contains("kube1: active (adopted"), "{out}");
    let (code, _, err) = h.cmd(&["adopt"]);
    assert_eq!(code, 1);
    assert!(err.contains("kubeslot already manages this host"), "{err}");
    assert_eq!(
        h.slot_snapshot(Slot::Kube1),
        kube1_before,
        "adopt changed kube1"
    );

    // the next activation flips into kube2; kube1 is kept as it was
    let (_, out, _) = h.cmd(&["plan"]);
    assert!(out.contains("flip kube1 (adopted tree) -> kube2"), "{out}");
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert_eq!(r["slot"], "kube2");
    assert_eq!(h.running(), [Slot::Kube2]);
    assert!(h.enabled(Slot::Kube2) && !h.enabled(Slot::Kube1));
    let s = h.state();
    assert_eq!(s.slot(Slot::Kube1).status, SlotStatus::Previous);
    assert!(s.slot(Slot::Kube1).adopted);
    // the agent's files of kube1 and its tree are untouched
    let mut after = h.slot_snapshot(Slot::Kube1);
    assert_eq!(after, kube1_before);
    after.clear();

    // rollback to the adopted kube1: nothing rendered for it
    let (code, out, err) = h.cmd(&["rollback", "--json"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(h.running(), [Slot::Kube1]);
    assert_eq!(h.tree_version(Slot::Kube1), "kubelet unbounded\n");
    assert_eq!(h.slot_snapshot(Slot::Kube1), kube1_before);
    let s = h.state();
    assert_eq!(s.active, Some(Slot::Kube1));
    assert!(s.slot(Slot::Kube1).adopted);
    assert!(s.bad.iter().any(|b| b.digest == img.v1), "{s:?}");
    // and forward again with another image
    h.set_config("v2", serde_json::json!({}));
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert_eq!(h.running(), [Slot::Kube2]);
}

/// The adopted node's kubelet identity as unbounded-agent's kubelet leaves
/// it after bootstrapping, and the agent's host units.
fn unbounded_identity_and_units(h: &Host) {
    let root = Root::new(h.root());
    let kubelet = root.machine_tree("kube1").join("var/lib/kubelet");
    let pki = kubelet.join("pki");
    fs::create_dir_all(&pki).unwrap();
    fs::write(
        pki.join("kubelet-client-2026-04-27-10-00-00.pem"),
        "CLIENT CERT AND KEY",
    )
    .unwrap();
    fs::set_permissions(
        pki.join("kubelet-client-2026-04-27-10-00-00.pem"),
        fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    std::os::unix::fs::symlink(
        "/var/lib/kubelet/pki/kubelet-client-2026-04-27-10-00-00.pem",
        pki.join("kubelet-client-current.pem"),
    )
    .unwrap();
    fs::write(pki.join("kubelet.crt"), "SERVING CERT").unwrap();
    fs::write(
        kubelet.join("kubeconfig"),
        "users:\n- name: default-auth\n  user:\n    client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem\n",
    )
    .unwrap();
    let units = root.systemd_system_dir();
    fs::create_dir_all(&units).unwrap();
    for u in ["unbounded-agent-daemon.service", "nftables-flush.service"] {
        fs::write(units.join(u), "[Service]\n").unwrap();
    }
}

#[test]
fn adopt_keeps_the_node_identity_and_deals_with_the_agents_units() {
    let img = images();
    let h = Host::new(&img);
    let root = Root::new(h.root());
    unbounded_host(&h);
    unbounded_identity_and_units(&h);
    let node_pki = root.node_state().join("kubelet/pki");
    // the agent's units are named; --dry-run copies and stops nothing
    let (code, out, err) = h.cmd(&["adopt", "--dry-run"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("would copy the kubelet's identity into /var/lib/kubeslot/node/kubelet: pki/ (kubelet-client-2026-04-27-10-00-00.pem, kubelet-client-current.pem, kubelet.crt) and kubeconfig"),
        "{out}"
    );
    for u in ["unbounded-agent-daemon.service", "nftables-flush.service"] {
        assert!(
            out.contains(&format!("warning: {u} is installed")) && out.contains("--disable-agent"),
            "{u}: {out}"
        );
    }
    assert!(!node_pki.exists());
    let (_, out, _) = h.cmd(&["adopt", "--dry-run", "--disable-agent"]);
    assert!(
        out.contains("would stop and disable unbounded-agent-daemon.service"),
        "{out}"
    );

    // dropped fields that change the node's behaviour: refused without
    // --force, before the agent's units or the identity are touched
    let applied = kubeslot_test_support::workspace_root()
        .join("testdata/adopt/later-schema/applied-config.json");
    let written = h.root().join("etc/kubeslot/adopted.json");
    let mut args = vec![
        "adopt",
        "--disable-agent",
        "--write-config",
        "--config",
        written.to_str().unwrap(),
        "--applied-config",
        applied.to_str().unwrap(),
        "--image",
        "ghcr.io/example/kubeslot-node:v1.35.1",
        "--public-key",
        "/etc/kubeslot/trust/release.pub",
    ];
    h.clear_calls();
    let (code, out, err) = h.cmd(&args);
    assert_eq!(code, 3, "{out}\n{err}");
    assert!(
        err.contains("the node would behave differently without it: FutureField.Knob, LocalDNS")
            && err.contains("--force"),
        "{err}"
    );
    assert!(h.changes().is_empty(), "{:?}", h.changes());
    assert!(!written.exists() && !root.state_file().exists() && !node_pki.exists());

    args.push("--force");
    let (code, out, err) = h.cmd(&args);
    assert_eq!(code, 0, "{out}\n{err}");
    let calls = h.changes();
    for c in [
        "systemctl stop unbounded-agent-daemon.service",
        "systemctl disable --quiet unbounded-agent-daemon.service",
        "systemctl stop nftables-flush.service",
        "systemctl disable --quiet nftables-flush.service",
    ] {
        assert!(calls.contains(&c.to_string()), "{c}: {calls:?}");
    }
    assert!(
        out.contains("stopped and disabled unbounded-agent-daemon.service"),
        "{out}"
    );
    assert!(!out.contains("0123456789abcdef"), "{out}");
    // the identity is in the node state, as the kubelet left it
    let key = node_pki.join("kubelet-client-2026-04-27-10-00-00.pem");
    assert_eq!(fs::read_to_string(&key).unwrap(), "CLIENT CERT AND KEY");
    assert_eq!(
        fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(
        fs::read_link(node_pki.join("kubelet-client-current.pem")).unwrap(),
        Path::new("/var/lib/kubelet/pki/kubelet-client-2026-04-27-10-00-00.pem")
    );
    let kubeconfig = root.node_state().join("kubelet/kubeconfig");
    assert!(fs::read_to_string(&kubeconfig)
        .unwrap()
        .contains("client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem"));
    assert_eq!(
        fs::metadata(&kubeconfig).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // the flip to kube2 keeps it (kube2 binds the node state)
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert_eq!(fs::read_to_string(&key).unwrap(), "CLIENT CERT AND KEY");
    assert!(fs::read_to_string(root.nspawn_file("kube2"))
        .unwrap()
        .contains("Bind=/var/lib/kubeslot/node/kubelet:/var/lib/kubelet"));
}

/// The `adopt` arguments that write a config from the later-schema
/// applied config (API server `10.1.0.1:6443`, a bootstrap token).
fn adopt_writing_config(h: &Host, applied: &str) -> Vec<String> {
    let applied = kubeslot_test_support::workspace_root().join(applied);
    let written = h.root().join("etc/kubeslot/adopted.json");
    [
        "adopt",
        "--write-config",
        "--config",
        written.to_str().unwrap(),
        "--applied-config",
        applied.to_str().unwrap(),
        "--image",
        "ghcr.io/example/kubeslot-node:v1.35.1",
        "--public-key",
        "/etc/kubeslot/trust/release.pub",
        "--force",
    ]
    .map(String::from)
    .to_vec()
}

/// Issue 26, finding 8: `adopt` copied the adopted node's kubeconfig, so
/// its `server`, CA and `exec` plugin (from a tree nothing verified) were
/// what every later kubelet used. It is rebuilt from the config: the
/// config's API server, the host's cluster CA, and of the adopted one only
/// the client certificate and key, each a file of the copied `pki/`.
#[test]
fn adopt_rebuilds_the_kubeconfig_from_the_config_not_the_adopted_one() {
    let img = images();
    let h = Host::new(&img);
    let root = Root::new(h.root());
    unbounded_host(&h);
    unbounded_identity_and_units(&h);
    let adopted = root
        .machine_tree("kube1")
        .join("var/lib/kubelet/kubeconfig");
    fs::write(
        &adopted,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: evil\n  cluster:\n    \
         server: https://203.0.113.66:6443\n    certificate-authority-data: RVZJTENB\n\
         users:\n- name: default-auth\n  user:\n    \
         client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem\n    \
         client-key: /var/lib/kubelet/pki/kubelet-client-current.pem\n    \
         exec:\n      command: /tmp/evil-plugin\n",
    )
    .unwrap();
    let args = adopt_writing_config(&h, "testdata/adopt/later-schema/applied-config.json");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, out, err) = h.cmd(&args);
    assert_eq!(code, 0, "{out}\n{err}");
    let kubeconfig = fs::read_to_string(root.node_state().join("kubelet/kubeconfig")).unwrap();
    let written: serde_json::Value =
        serde_json::from_slice(&fs::read(h.root().join("etc/kubeslot/adopted.json")).unwrap())
            .unwrap();
    let server = written["kubelet"]["api_server"].as_str().unwrap();
    assert!(server.contains("10.1.0.1:6443"), "{written:#}");
    assert_eq!(
        kubeconfig,
        format!(
            "# Rebuilt by kubeslot-activator adopt: the API server and CA of the config,\n\
             # the adopted kubelet's client certificate; nothing else of the adopted one.\n\
             apiVersion: v1\nkind: Config\nclusters:\n- name: kubeslot\n  cluster:\n    \
             server: \"{server}\"\n    \
             certificate-authority: /etc/kubernetes/pki/apiserver-client-ca.crt\n\
             contexts:\n- name: kubeslot\n  context:\n    cluster: kubeslot\n    \
             user: kubelet\ncurrent-context: kubeslot\nusers:\n- name: kubelet\n  user:\n    \
             client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem\n    \
             client-key: /var/lib/kubelet/pki/kubelet-client-current.pem\n"
        )
    );
}

/// Issue 26, finding 8: an adopted kubeconfig whose client certificate is
/// not a file of the copied `pki/` (here a host path) is not carried: the
/// kubelet bootstraps again with the config's token.
#[test]
fn adopt_carries_no_kubeconfig_naming_a_certificate_outside_pki() {
    let img = images();
    let h = Host::new(&img);
    let root = Root::new(h.root());
    unbounded_host(&h);
    unbounded_identity_and_units(&h);
    fs::write(
        root.machine_tree("kube1").join("var/lib/kubelet/kubeconfig"),
        "users:\n- name: x\n  user:\n    client-certificate: /var/lib/kubelet/pki/../../../../etc/kubeslot/host/kube1/bootstrap-kubeconfig\n",
    )
    .unwrap();
    let args = adopt_writing_config(&h, "testdata/adopt/later-schema/applied-config.json");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, out, err) = h.cmd(&args);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(root.node_state().join("kubelet/pki").is_dir());
    assert!(!root.node_state().join("kubelet/kubeconfig").exists());
}

/// Issue 26, finding 9: `adopt --dry-run` printed the exec credential's
/// arguments (which often carry a token or a secret's path); they are
/// shown redacted, as its environment values are.
#[test]
fn adopt_dry_run_shows_no_exec_credential_argument() {
    let img = images();
    let h = Host::new(&img);
    unbounded_host(&h);
    let mut args = adopt_writing_config(&h, "testdata/adopt/exec-credential/applied-config.json");
    args.push("--dry-run".into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, out, err) = h.cmd(&args);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("/usr/local/bin/kubelogin"), "{out}");
    for secret in ["get-token", "--login", "msi", "s3cr3t"] {
        assert!(!out.contains(secret), "{secret} shown: {out}");
    }
    assert!(
        out.contains(kubeslot_activator::host::adopt::REDACTED),
        "{out}"
    );
}

#[test]
fn adopt_never_follows_a_link_out_of_the_adopted_tree() {
    let img = images();
    let h = Host::new(&img);
    let root = Root::new(h.root());
    unbounded_host(&h);
    // the node (root in its machine) made its /var/lib/kubelet a link to
    // a host directory
    let secret = h.root().join("etc/host-secret/pki");
    fs::create_dir_all(&secret).unwrap();
    fs::write(secret.join("key.pem"), "HOST SECRET").unwrap();
    let kubelet = root.machine_tree("kube1").join("var/lib/kubelet");
    fs::create_dir_all(kubelet.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink("../../../../../../etc/host-secret", &kubelet).unwrap();
    assert!(
        kubelet.join("pki/key.pem").exists(),
        "the link must resolve"
    );
    let (code, out, err) = h.cmd(&["adopt"]);
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(
        err.contains("var/lib/kubelet/pki: a symlink on the way, or a path leading out of the tree: not followed"),
        "{err}"
    );
    assert!(!root.state_file().exists());
    assert!(!root.node_state().join("kubelet/pki").exists());
}

#[test]
fn adopt_names_the_machine_that_runs_when_told_another() {
    let img = images();
    let h = Host::new(&img);
    unbounded_host(&h);
    // a stopped kube2 tree beside the running kube1
    fs::create_dir_all(Root::new(h.root()).machine_tree("kube2").join("etc")).unwrap();
    let (code, _, err) = h.cmd(&["adopt", "--machine", "kube2"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("machine kube1 is running, not kube2: adopt the machine that runs the node (--machine kube1)"),
        "{err}"
    );
    assert!(!Root::new(h.root()).state_file().exists());
}

#[test]
fn adopt_writes_the_activator_config_from_the_applied_config() {
    let img = images();
    let h = Host::new(&img);
    unbounded_host(&h);
    let written = h.root().join("etc/kubeslot/adopted.json");
    // the agent's KUBELET_EXTRA_ARGS convention, and a variable kubeslot's
    // kubelet unit does not pass
    let defaults = Root::new(h.root())
        .machine_tree("kube1")
        .join("etc/default");
    fs::create_dir_all(&defaults).unwrap();
    fs::write(
        defaults.join("kubelet"),
        "KUBELET_EXTRA_ARGS=\"--max-pods=60 --v=2\"\nKUBELET_TUNING_ARGS=--kube-api-qps=50\n",
    )
    .unwrap();
    let args = [
        "adopt",
        "--write-config",
        "--config",
        written.to_str().unwrap(),
        "--image",
        "ghcr.io/example/kubeslot-node:v1.35.1",
        "--public-key",
        "/etc/kubeslot/trust/release.pub",
    ];
    // an applied config that does not match its sidecar: nothing changes
    let applied = Root::new(h.root()).unbounded_applied_config("kube1");
    let good = fs::read(&applied).unwrap();
    fs::write(&applied, [&good[..], b" "].concat()).unwrap();
    let (code, _, err) = h.cmd(&args);
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("kube1-applied-config.json.sha256 says"),
        "{err}"
    );
    assert!(!written.exists() && !Root::new(h.root()).state_file().exists());
    fs::write(&applied, &good).unwrap();

    // KUBELET_TUNING_ARGS is not carried over and changes the node: --force
    let (code, _, err) = h.cmd(&args);
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("/etc/default/kubelet KUBELET_TUNING_ARGS"),
        "{err}"
    );
    assert!(!Root::new(h.root()).kubelet_extra_args().exists());
    let forced: Vec<&str> = args.iter().copied().chain(["--force"]).collect();
    let (code, out, err) = h.cmd(&forced);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains(&format!("wrote {} (mode 0600)", written.display())),
        "{out}"
    );
    assert!(
        out.contains("wrote /etc/kubeslot/default-kubelet from the adopted node's /etc/default/kubelet: KUBELET_EXTRA_ARGS=\"--max-pods=60 --v=2\""),
        "{out}"
    );
    assert!(
        out.contains(
            "  /etc/default/kubelet KUBELET_TUNING_ARGS: the agent's kubelet unit passed it"
        ),
        "{out}"
    );
    // what the render reads back
    assert_eq!(
        kubeslot_activator::render::extra_args::read(&Root::new(h.root())).unwrap(),
        ["--max-pods=60", "--v=2"]
    );
    assert!(
        !out.contains("0123456789abcdef"),
        "the token was printed: {out}"
    );
    let meta = fs::metadata(&written).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let want = fs::read_to_string(
        kubeslot_test_support::workspace_root()
            .join("testdata/adopt/token-snapshot/activator.json"),
    )
    .unwrap();
    assert_eq!(fs::read_to_string(&written).unwrap(), want);
    assert!(h.state().slot(Slot::Kube1).adopted);
    // an existing config is replaced only with --force (the state is
    // recorded now, so this is refused for that reason first)
    let (code, _, err) = h.cmd(&args);
    assert_eq!(code, 1, "{err}");
}

#[test]
fn uninstall_removes_machines_units_files_and_state_and_keeps_node_state() {
    let img = images();
    let h = Host::new(&img);
    let root = Root::new(h.root());
    assert_eq!(h.activate().0, 0);
    h.set_config("v2", serde_json::json!({}));
    assert_eq!(h.activate().0, 0);
    fs::write(root.node_state().join("kubelet/identity"), "node-a").unwrap();
    // the package's units (a host without them skips them)
    let units = h.root().join("usr/lib/systemd/system");
    fs::create_dir_all(&units).unwrap();
    for u in ["kubeslot-activator.path", "kubeslot-activator.service"] {
        fs::write(units.join(u), "[Unit]\n").unwrap();
    }
    h.clear_calls();
    let (code, out, err) = h.cmd(&["uninstall"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let calls = h.changes();
    for c in [
        "systemctl stop kubeslot-activator.path",
        "systemctl disable --quiet kubeslot-activator.path",
        "systemctl stop systemd-nspawn@kube2.service",
        "systemctl disable --quiet systemd-nspawn@kube2.service",
        "systemctl daemon-reload",
    ] {
        assert!(calls.contains(&c.to_string()), "{c}: {calls:?}");
    }
    assert!(h.running().is_empty());
    for gone in [
        root.machine_tree("kube1"),
        root.machine_tree("kube2"),
        root.nspawn_file("kube1"),
        root.dropin_file("kube2").parent().unwrap().to_path_buf(),
        root.machine_wants_link("kube2"),
        root.render_unit(),
        root.host_files("kube1"),
        root.sysctl_dropin(),
        root.modules_load_dropin(),
        root.state_file(),
        root.store(),
    ] {
        assert!(
            fs::symlink_metadata(&gone).is_err(),
            "{} is still there",
            gone.display()
        );
    }
    assert!(out.contains("removed /var/lib/machines/kube2\n"), "{out}");
    assert!(
        out.contains("the packaged units stay disabled, also across a reinstall without purge"),
        "{out}"
    );
    let left: Vec<_> = fs::read_dir(root.state_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left, ["node"]);
    assert_eq!(
        fs::read_to_string(root.node_state().join("kubelet/identity")).unwrap(),
        "node-a"
    );
    assert!(h.config_path().exists(), "the operator's config is kept");
    // again: nothing left to do; --purge takes the node state too
    assert_eq!(h.cmd(&["uninstall"]).0, 0);
    let (code, out, _) = h.cmd(&["uninstall", "--purge"]);
    assert_eq!(code, 0);
    assert!(out.contains("removed /var/lib/kubeslot\n"), "{out}");
    assert!(!root.state_dir().exists());
}

#[test]
fn uninstall_refuses_a_machine_kubeslot_has_no_record_of_and_changes_nothing() {
    let img = images();
    let h = Host::new(&img);
    let root = Root::new(h.root());
    // unbounded-agent's kube1, running, never adopted
    unbounded_host(&h);
    let kube1_before = h.slot_snapshot(Slot::Kube1);
    h.clear_calls();
    let (code, out, err) = h.cmd(&["uninstall"]);
    assert_eq!(code, 3, "{out}\n{err}");
    assert!(
        err.contains("machine kube1 is not kubeslot's")
            && err.contains("the machine is running")
            && err.contains("/var/lib/machines/kube1")
            && err.contains("/etc/systemd/nspawn/kube1.nspawn")
            && err.contains("--remove-unmanaged"),
        "{err}"
    );
    assert!(h.changes().is_empty(), "{:?}", h.changes());
    assert_eq!(h.running(), [Slot::Kube1]);
    assert_eq!(h.slot_snapshot(Slot::Kube1), kube1_before);
    assert!(h.enabled(Slot::Kube1));
    // asked for explicitly, it goes
    let (code, out, err) = h.cmd(&["uninstall", "--remove-unmanaged"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(h.running().is_empty());
    assert!(!root.machine_tree("kube1").exists() && !root.nspawn_file("kube1").exists());
}

#[test]
fn uninstall_with_an_unreadable_state_tells_kubeslots_machines_by_their_files() {
    let img = images();
    let h = Host::new(&img);
    let root = Root::new(h.root());
    assert_eq!(h.activate().0, 0);
    fs::write(root.state_file(), "{ not json").unwrap();
    let (code, out, err) = h.cmd(&["uninstall"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("warning: the state cannot be read (")
            && out.contains("removed /var/lib/machines/kube1\n"),
        "{out}"
    );
    assert!(h.running().is_empty());
    assert!(!root.machine_tree("kube1").exists() && !root.state_file().exists());
}

#[test]
fn uninstall_keeps_an_adopted_machine_unless_asked() {
    let img = images();
    let h = Host::new(&img);
    let root = Root::new(h.root());
    unbounded_host(&h);
    let kube1_before = h.slot_snapshot(Slot::Kube1);
    assert_eq!(h.cmd(&["adopt"]).0, 0);
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert_eq!(h.running(), [Slot::Kube2]);
    h.clear_calls();
    let (code, out, err) = h.cmd(&["uninstall"]);
    assert_eq!(code, 0, "{out}\n{err}");
    // kubeslot's kube2 is gone, the adopted kube1 is as it was
    assert!(!root.machine_tree("kube2").exists() && !root.nspawn_file("kube2").exists());
    assert_eq!(h.slot_snapshot(Slot::Kube1), kube1_before);
    assert!(
        !h.changes().iter().any(|c| c.contains("kube1")),
        "{:?}",
        h.changes()
    );
    assert!(
        out.contains("kept the adopted machine kube1 (not running: `machinectl enable --now kube1` starts it again"),
        "{out}"
    );
    // without kubeslot's record, kube1 is another tool's machine again:
    // adopt it again, then remove it with --remove-adopted
    let (code, _, err) = h.cmd(&["uninstall"]);
    assert_eq!(code, 3, "{err}");
    assert_eq!(h.cmd(&["adopt"]).0, 0);
    let (code, out, err) = h.cmd(&["uninstall", "--remove-adopted"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("removed /var/lib/machines/kube1\n"), "{out}");
    assert!(!root.machine_tree("kube1").exists() && !root.nspawn_file("kube1").exists());
    assert!(!root.dropin_file("kube1").exists());
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

/// `plan`, `plan --json`, `activate --dry-run [--json]`, the run's output,
/// its report and `status` never carry the bootstrap token or an exec
/// credential's env value: a credential file shows only as "secret changed".
#[test]
fn plans_reports_and_status_never_show_a_credential() {
    const TOKEN: &str = "zq9x1k.tokenSECRETvalue1";
    const ENV_SECRET: &str = "env-SECRET-value-7731";
    let img = images();
    let h = Host::new(&img);
    h.set_config("v1", serde_json::json!({ "bootstrap_token": TOKEN }));
    let mut seen: Vec<(String, String)> = Vec::new();
    let look = |h: &Host, what: &str, seen: &mut Vec<(String, String)>| {
        for args in [
            &["plan"][..],
            &["plan", "--json"],
            &["activate", "--dry-run"],
            &["activate", "--dry-run", "--json"],
            &["status"],
            &["status", "--json"],
        ] {
            let (_, out, err) = h.cmd(args);
            seen.push((format!("{what}: {}", args.join(" ")), out + &err));
        }
    };
    look(&h, "first", &mut seen);
    let plan = &seen[0].1;
    assert!(plan.contains("secret changed"), "{plan}");
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}");
    seen.push(("activate".into(), format!("{r}\n{err}")));
    seen.push((
        "report.json".into(),
        fs::read_to_string(h.root().join("var/lib/kubeslot/report.json")).unwrap(),
    ));
    // A new credential: the plan says it changes, and still not what it is.
    h.set_config(
        "v1",
        serde_json::json!({
            "bootstrap_token": null,
            "exec_credential": {"command": "/usr/bin/get-token", "env": {"TOKEN": ENV_SECRET}},
        }),
    );
    look(&h, "changed", &mut seen);
    let (_, plan, _) = h.cmd(&["plan"]);
    assert!(plan.contains("secret changed"), "{plan}");
    for (what, text) in &seen {
        assert!(
            !text.contains(TOKEN) && !text.contains(ENV_SECRET),
            "{what} shows a credential:\n{text}"
        );
    }
}

/// A node that wrote a tree deeper than the activator's open-file limit
/// into each slot: two flips (one into each slot), run under
/// `RLIMIT_NOFILE` 1024, still succeed, and leave no staging directory.
#[test]
fn flips_succeed_over_trees_deeper_than_the_fd_limit() {
    require_tool("prlimit", "util-linux");
    let img = images();
    for mode in ["copy", "overlay"] {
        let h = Host::with_slots(&img, Some(mode));
        let root = Root::new(h.root());
        for v in ["v1", "v2"] {
            h.set_config(v, serde_json::json!({}));
            let (code, r, err) = h.activate();
            assert_eq!(code, 0, "{mode} {v}: {err}\n{r:#}");
        }
        for slot in [Slot::Kube1, Slot::Kube2] {
            // what the node wrote: its tree (copy) or its upper dir (overlay)
            let written = match mode {
                "copy" => root.machine_tree(slot.machine()).join("var/lib/deep"),
                _ => {
                    kubeslot_activator::slots::overlay::upper_dir(&root, slot).join("var/lib/deep")
                }
            };
            kubeslot_test_support::host::deep_tree(&written, 1100);
        }
        for v in ["v4", "v1"] {
            h.set_config(v, serde_json::json!({}));
            let out = Command::new("prlimit")
                .args([
                    "--nofile=1024:1024",
                    "--",
                    env!("CARGO_BIN_EXE_kubeslot-activator"),
                ])
                .args(["activate", "--json", "--force", "--root"])
                .arg(h.root())
                .env(
                    "PATH",
                    format!(
                        "{}:{}",
                        h.fake().join("bin").display(),
                        std::env::var("PATH").unwrap_or_default()
                    ),
                )
                .env("KUBESLOT_FAKE", h.fake())
                .env("KUBESLOT_FAKE_ROOT", h.root())
                .env("KUBESLOT_FAKE_PORT", h.port.to_string())
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{mode} {v} under 1024 fds: {}\n{}",
                String::from_utf8_lossy(&out.stderr),
                String::from_utf8_lossy(&out.stdout)
            );
        }
        let leftovers: Vec<_> = fs::read_dir(root.machines_dir())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(leftovers.is_empty(), "{mode}: {leftovers:?}");
    }
}

/// The blobs image `m` (a manifest in the test layout) is made of: the
/// manifest, its config and its layers, as the layout (not the store) says.
fn blobs_of(layout: &Path, m: Digest) -> std::collections::BTreeSet<String> {
    let l = kubeslot_image::layout::Layout::open(layout).unwrap();
    let man: kubeslot_image::oci::Manifest = l.read_json(&m, None).unwrap();
    std::iter::once(m)
        .chain(std::iter::once(man.config.digest))
        .chain(man.layers.iter().map(|d| d.digest))
        .map(|d| d.hex())
        .collect()
}

fn store_listing(h: &Host) -> std::collections::BTreeSet<String> {
    fs::read_dir(h.root().join("var/lib/kubeslot/blobs/sha256"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// `gc` keeps what the two slots' images need and removes the rest: an
/// orphan blob and a stale partial go (bytes freed counted), `--dry-run`
/// removes nothing, a partial a live fetch holds stays; after a third
/// release the post-commit collection leaves only the two slots' blobs.
#[test]
fn gc_keeps_the_two_slots_images_and_removes_the_rest() {
    use std::collections::BTreeSet;
    let img = images();
    let h = Host::new(&img);
    for v in ["v1", "v2"] {
        h.set_config(v, serde_json::json!({}));
        let (code, r, err) = h.activate();
        assert_eq!(code, 0, "{v}: {err}\n{r:#}");
    }
    let both: BTreeSet<String> = blobs_of(&img.layout, img.v1)
        .union(&blobs_of(&img.layout, img.v2))
        .cloned()
        .collect();
    assert_eq!(store_listing(&h), both);

    let store = h.root().join("var/lib/kubeslot/blobs/sha256");
    let orphan = b"a blob no image names";
    let orphan_digest = Digest::of(orphan);
    fs::write(store.join(orphan_digest.hex()), orphan).unwrap();
    let stale = store.join(format!(".partial-{}", "a".repeat(64)));
    fs::write(&stale, b"half a download").unwrap();
    let held = store.join(format!(".partial-{}", "b".repeat(64)));
    fs::write(&held, b"being downloaded").unwrap();
    let held_file = fs::File::open(&held).unwrap();
    rustix::fs::flock(&held_file, rustix::fs::FlockOperation::LockExclusive).unwrap();

    let before = store_listing(&h);
    let (code, out, err) = h.cmd(&["gc", "--dry-run", "--json"]);
    assert_eq!(code, 0, "{err}");
    let dry: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        dry["removed_blobs"],
        serde_json::json!([orphan_digest.to_string()])
    );
    assert_eq!(store_listing(&h), before, "--dry-run removed something");

    let (code, out, err) = h.cmd(&["gc", "--json"]);
    assert_eq!(code, 0, "{err}");
    let done: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(done["removed_blobs"], dry["removed_blobs"]);
    assert_eq!(
        done["removed_partials"],
        serde_json::json!([stale.display().to_string()])
    );
    assert_eq!(
        done["bytes_freed"],
        (orphan.len() + b"half a download".len()) as u64
    );
    assert_eq!(done["kept_blobs"], both.len());
    assert!(held.exists(), "a partial a live fetch holds was removed");
    assert!(!stale.exists());
    drop(held_file);
    fs::remove_file(&held).unwrap();

    // A third release: the commit's collection leaves kube1 (v4) and kube2 (v2).
    h.set_config("v4", serde_json::json!({}));
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert!(r["gc"].as_str().unwrap().starts_with("removed "), "{r:#}");
    let want: BTreeSet<String> = blobs_of(&img.layout, img.v2)
        .union(&blobs_of(&img.layout, img.v4))
        .cloned()
        .collect();
    assert_eq!(store_listing(&h), want);
}

/// `verify-layers`: an intact layer store passes; a file of a lower layer
/// changed behind the activator's back is named, and so is a file added.
#[test]
fn verify_layers_names_a_tampered_layer_file() {
    let img = images();
    let h = Host::with_slots(&img, Some("overlay"));
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert_eq!(r["slot_mode"], "overlay", "{r:#}");
    let (code, out, err) = h.cmd(&["verify-layers", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    // the image's layer and its metadata layer (`meta-<chain id>`)
    assert_eq!(v["layers"], 2);
    assert_eq!(v["mismatches"], serde_json::json!([]));
    let layers = h.root().join("var/lib/kubeslot/layers");
    let layer = fs::read_dir(&layers)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            p.is_dir() && !name.starts_with('.') && !name.starts_with("meta-")
        })
        .unwrap();
    fs::write(layer.join("usr/bin/kubelet-version"), b"kubelet evil\n").unwrap();
    fs::write(layer.join("etc/added"), b"x").unwrap();
    let (code, out, err) = h.cmd(&["verify-layers"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("usr/bin/kubelet-version: contents changed")
            && out.contains("etc/added: added"),
        "{out}"
    );
    assert!(err.contains("differ from what was unpacked"), "{err}");
}

/// Copy mode: `rollback` refuses a previous slot whose image-owned files
/// changed while its node ran (naming them), ignores what the node wrote
/// under /var, and `--force` starts it anyway.
#[test]
fn rollback_refuses_a_copied_slot_whose_image_files_changed() {
    let img = images();
    let h = Host::with_slots(&img, Some("copy"));
    let root = Root::new(h.root());
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");
    let kube1 = root.machine_tree("kube1");
    // while kube1 runs: its node writes state, and something rewrites a
    // binary of the image (same size: the cheap fingerprint cannot tell)
    fs::create_dir_all(kube1.join("var/lib/kubelet")).unwrap();
    fs::write(kube1.join("var/lib/kubelet/state"), b"node state").unwrap();
    assert_eq!(
        fs::read(kube1.join("usr/bin/kubelet-version")).unwrap(),
        b"kubelet v1\n"
    );
    fs::write(kube1.join("usr/bin/kubelet-version"), b"kubelet X1\n").unwrap();
    h.set_config("v2", serde_json::json!({}));
    let (code, r, err) = h.activate();
    assert_eq!(code, 0, "{err}\n{r:#}");

    let (code, out, err) = h.cmd(&["rollback", "--json"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("/usr/bin/kubelet-version (contents changed)")
            && err.contains("1 change(s) to its image")
            && !err.contains("var/lib/kubelet"),
        "{err}"
    );
    assert_eq!(h.state().active, Some(Slot::Kube2), "nothing switched");
    let (code, out, err) = h.cmd(&["rollback", "--force", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(h.state().active, Some(Slot::Kube1));
}

/// A network namespace made for one test (removed when dropped): the
/// node's network leftovers are made and removed there, never in this
/// machine's own namespace.
struct NetNs(String);

impl NetNs {
    fn new() -> NetNs {
        require_tool("ip", "iproute2");
        let name = format!("kubeslot-test-{}-{}", std::process::id(), free_port());
        let ns = NetNs(name);
        ns.ip(&["netns", "add", &ns.0]);
        // the health gate and the fake kubelet talk over its loopback
        ns.ip(&["-n", &ns.0, "link", "set", "lo", "up"]);
        ns
    }

    fn ip(&self, args: &[&str]) -> String {
        let out = Command::new("ip").args(args).output().unwrap();
        assert!(
            out.status.success(),
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `ip -n NS ARGS...`.
    fn inside(&self, args: &str) -> String {
        let mut all = vec!["-n", self.0.as_str()];
        all.extend(args.split_whitespace());
        self.ip(&all)
    }

    fn links(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .inside("-o link show")
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap().to_string())
            .collect();
        v.sort();
        v
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// `uninstall` removes what the node's pod network left in the host's
/// namespace (links by name, the WireGuard routing tables), never what the
/// host had at the first activation; `--dry-run` lists it first and
/// changes nothing. Run in a namespace of its own, with real links.
#[test]
fn uninstall_removes_the_network_a_node_left_but_never_the_hosts_own() {
    let img = images();
    let h = Host::new(&img);
    let ns = NetNs::new();
    // the root shows the namespace the activator runs in
    fs::create_dir_all(h.root().join("sys/class")).unwrap();
    std::os::unix::fs::symlink("/sys/class/net", h.root().join("sys/class/net")).unwrap();
    // the host's own: a WireGuard-named link and a table in the range
    ns.inside("link add wg9 type bridge");
    ns.inside("rule add table 51830 pref 200");
    let out = h.run_in(Some(&ns.0), &["activate", "--json"], None);
    let r = json(
        &String::from_utf8_lossy(&out.stdout),
        &String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(r["outcome"], "committed", "{r:#}");
    assert!(
        r["host_settings"].as_str().unwrap().contains(
            "recorded the host's network before its first node (2 links, tables [51830] in use)"
        ),
        "{r:#}"
    );
    // what a node's pod network makes
    for add in [
        "link add cni0 type bridge",
        "link add cbr0 type bridge",
        "link add geneve0 type bridge",
        "link add wg0 type bridge",
        "link add flannel.1 type vxlan id 1 dstport 8472",
        "link add vxlan0 type vxlan id 2 dstport 4789",
        "link add cilium_host type veth peer name cilium_net",
        "link add eth-keep type bridge",
        "rule add table 51820 pref 100",
        "rule add fwmark 0x1 table 51820 pref 101",
        "route add unreachable 10.9.0.0/24 table 51820",
    ] {
        ns.inside(add);
    }
    let before = ns.links();
    let out = h.run_in(Some(&ns.0), &["uninstall", "--dry-run"], None);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "would stop and disable systemd-nspawn@kube1.service",
        "would remove the node's link cbr0",
        "would remove the node's link cilium_host",
        "would remove the node's link cilium_net",
        "would remove the node's link cni0",
        "would remove the node's link flannel.1",
        "would remove the node's link geneve0",
        "would remove the node's link vxlan0",
        "would remove the node's link wg0",
        "would remove the node's routing table 51820 (rule 100:\tfrom all lookup 51820; rule 101:\tfrom all fwmark 0x1 lookup 51820; route unreachable 10.9.0.0/24 table 51820)",
        "dry run: nothing was changed",
    ] {
        assert!(text.lines().any(|l| l == want), "{want}:\n{text}");
    }
    for kept in ["wg9", "eth-keep", "51830", "link lo"] {
        assert!(!text.contains(kept), "{kept}:\n{text}");
    }
    assert_eq!(ns.links(), before);
    assert!(h.root().join("var/lib/machines/kube1").exists());

    let out = h.run_in(Some(&ns.0), &["uninstall"], None);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("removed the node's link cni0\n"), "{text}");
    assert!(
        text.contains("removed the node's routing table 51820 (rules and routes)\n"),
        "{text}"
    );
    assert_eq!(ns.links(), ["eth-keep", "lo", "wg9"]);
    let rules = ns.inside("rule show");
    assert!(
        !rules.contains("51820") && rules.contains("lookup 51830"),
        "{rules}"
    );
    assert!(ns.inside("route show table 51820").trim().is_empty());
}
