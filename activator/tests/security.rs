//! The host's other users and the node itself as attackers (issue 26): each
//! test plays one of them against the real activator on a scratch root,
//! with real overlay mounts for layers (the fake systemd mounts the slots'
//! units for real), a real unprivileged uid (`setpriv` to `nobody`) for
//! another user, and the real binary where what the world sees (its
//! output, `report.json`) is the point.

use std::fs;
use std::os::unix::fs::{chown, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use kubeslot_activator::activate::report::{exit, Outcome, Report};
use kubeslot_activator::activate::{self, Options, RollbackOptions};
use kubeslot_activator::gate::health::{self, Gate};
use kubeslot_activator::paths::Root;
use kubeslot_activator::slot::Slot;
use kubeslot_activator::slots::overlay;
use kubeslot_activator::slots::record;
use kubeslot_activator::testing::FakeSystemd;
use kubeslot_image::digest::Digest;
use kubeslot_image::oci::Platform;
use kubeslot_test_support::image;
use kubeslot_test_support::require_tool;

const BIN: &str = env!("CARGO_BIN_EXE_kubeslot-activator");
const NOBODY: u32 = 65534;

/// Runs `sh -c script` as `nobody` (uid and gid 65534, no groups) through
/// the real `setpriv`: whether it succeeded, and what it said.
fn as_nobody(script: &str) -> (bool, String) {
    let setpriv = require_tool("setpriv", "util-linux");
    let out = Command::new(setpriv)
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sh",
            "-c",
            script,
        ])
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Asserts `nobody` cannot do `what` (`script`).
fn nobody_cannot(what: &str, script: &str) {
    let (ok, err) = as_nobody(script);
    assert!(!ok, "nobody could {what} ({script})");
    assert!(
        err.contains("Permission denied"),
        "{what}: refused for another reason: {err}"
    );
}

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

/// A tar entry of a test layer, with its mode.
enum E<'a> {
    Dir(&'a str, u32),
    File(&'a str, u32, &'a [u8]),
}

fn tar(entries: &[E]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let (kind, name, mode, data): (_, _, _, &[u8]) = match e {
            E::Dir(n, m) => (tar::EntryType::Directory, *n, *m, b""),
            E::File(n, m, d) => (tar::EntryType::Regular, *n, *m, d),
        };
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(data.len() as u64);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        b.append_data(&mut h, name, data).unwrap();
    }
    b.into_inner().unwrap()
}

/// The layer every test image shares: a healthy node with a world-writable
/// `/tmp`, a setuid `su`, and a kubelet.
fn base_layer() -> Vec<u8> {
    tar(&[
        E::Dir("etc/", 0o755),
        E::Dir("etc/systemd/", 0o755),
        E::Dir("etc/systemd/system/", 0o755),
        E::Dir("tmp/", 0o1777),
        E::Dir("usr/", 0o755),
        E::Dir("usr/bin/", 0o755),
        E::Dir("var/", 0o755),
        E::Dir("var/lib/", 0o755),
        E::File("etc/fixture-health", 0o644, b"healthy"),
        E::File("usr/bin/su", 0o4755, b"#!/bin/true\n"),
    ])
}

/// The layer that makes version `v`: its kubelet.
fn kubelet_layer(v: &str) -> Vec<u8> {
    let kubelet = format!("kubelet {v}\n");
    tar(&[
        E::Dir("usr/", 0o755),
        E::Dir("usr/local/", 0o755),
        E::Dir("usr/local/bin/", 0o755),
        E::File("usr/local/bin/kubelet", 0o755, kubelet.as_bytes()),
        E::File("etc/version", 0o644, v.as_bytes()),
    ])
}

/// A host under a scratch root, reachable for `nobody` down to the root
/// (so only the activator's own modes keep it out), with a config for the
/// image in a local layout and the shared fake systemd.
struct Node {
    // dropped first: it unmounts the slots before the dir goes
    fake: FakeSystemd,
    root: Root,
    config: PathBuf,
    dir: tempfile::TempDir,
}

impl Node {
    fn new(slots: &str) -> Node {
        let dir = tempfile::tempdir().unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let root = Root::new(dir.path().join("root"));
        kubeslot_test_support::fake_host(root.dir());
        let fake = FakeSystemd::new(&root);
        let config = dir.path().join("activator.json");
        let n = Node {
            dir,
            root,
            config,
            fake,
        };
        let cfg = serde_json::json!({
            "image": format!("oci:{}:v1", n.layout().display()),
            "trust": {"allow_unsigned": true},
            "kubelet": {
                "api_server": "https://10.0.0.1:6443",
                "ca_data": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
                "bootstrap_token": "abcdef.0123456789abcdef",
                "node_name": "node-a",
            },
            "gpu": "off",
            "nameservers": ["192.0.2.53"],
            "health": {"timeout_secs": 1, "successes": 2, "interval_ms": 20,
                       "kubelet_healthz_url": n.fake.healthz_url},
            "slots": {"mode": slots},
        });
        fs::write(&n.config, serde_json::to_vec(&cfg).unwrap()).unwrap();
        n
    }

    fn layout(&self) -> PathBuf {
        self.dir.path().join("layout")
    }

    /// Writes image `tag` of `layers` and points the config at it.
    fn image(&self, tag: &str, layers: &[Vec<u8>]) -> Digest {
        let layout = image::open_or_create(&self.layout());
        let blobs: Vec<_> = layers
            .iter()
            .map(|t| image::gzip_layer(&layout, t))
            .collect();
        let d = image::write_manifest_image(&layout, tag, &Platform::host(), &blobs);
        self.set(
            "/image",
            format!("oci:{}:{tag}", self.layout().display()).into(),
        );
        d
    }

    /// Image `v` of the base layer and its kubelet layer.
    fn version(&self, v: &str) -> Digest {
        self.image(v, &[base_layer(), kubelet_layer(v)])
    }

    /// Sets the config value at `pointer` (its parent object exists).
    fn set(&self, pointer: &str, value: serde_json::Value) {
        let mut c: serde_json::Value =
            serde_json::from_slice(&fs::read(&self.config).unwrap()).unwrap();
        let (parent, key) = pointer.rsplit_once('/').unwrap();
        c.pointer_mut(parent)
            .and_then(serde_json::Value::as_object_mut)
            .unwrap_or_else(|| panic!("{pointer}"))
            .insert(key.to_string(), value);
        fs::write(&self.config, serde_json::to_vec(&c).unwrap()).unwrap();
    }

    fn activate(&self) -> Report {
        activate::activate(&self.root, &self.config, &self.fake, &Options::default()).report
    }

    fn rollback(&self, clean: bool, force: bool) -> Report {
        activate::rollback(&self.root, &self.fake, &RollbackOptions { clean, force }).report
    }

    fn tree(&self, slot: Slot) -> PathBuf {
        self.root.machine_tree(slot.machine())
    }

    fn running(&self) -> Vec<String> {
        self.fake
            .active_units()
            .into_iter()
            .filter(|u| u.starts_with("systemd-nspawn@"))
            .collect()
    }

    /// The layer dir of layer `index` of the image `slot` mounts.
    /// The image's layer `index_from_top` of `slot` (the per-image
    /// metadata layer, mounted topmost, left out).
    fn lower(&self, slot: Slot, index_from_top: usize) -> PathBuf {
        overlay::lowers(&self.root, slot)
            .unwrap()
            .into_iter()
            .filter(|l| {
                !l.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("meta-"))
            })
            .nth(index_from_top)
            .unwrap()
    }

    /// v1 committed in kube1, then v2 in kube2: kube1 is the rollback target.
    fn v1_then_v2(&self) {
        self.version("v1");
        let r = self.activate();
        assert_eq!(r.outcome, Some(Outcome::Committed), "{r:?}");
        self.node_writes_its_own_paths(Slot::Kube1);
        self.version("v2");
        let r = self.activate();
        assert_eq!(
            (r.outcome, r.slot),
            (Some(Outcome::Committed), Some(Slot::Kube2)),
            "{r:?}"
        );
    }

    /// What a node writes by design: its state, the machine id, the mount
    /// points nspawn makes.
    fn node_writes_its_own_paths(&self, slot: Slot) {
        let t = self.tree(slot);
        fs::create_dir_all(t.join("var/lib/kubelet/pods")).unwrap();
        fs::write(t.join("var/lib/kubelet/pods/x"), b"state").unwrap();
        fs::write(
            t.join("etc/machine-id"),
            b"0123456789abcdef0123456789abcdef\n",
        )
        .unwrap();
        fs::create_dir_all(t.join("etc/kubeslot/host")).unwrap();
        fs::create_dir_all(t.join("etc/cni/net.d")).unwrap();
    }
}

/// A run refused before any machine changed: its error.
fn not_run(r: &Report) -> String {
    assert_ne!(r.exit_code, exit::OK, "{r:?}");
    assert!(r.slot.is_none(), "{r:?}");
    r.error.clone().unwrap()
}

fn refused(r: &Report) -> String {
    assert_eq!(r.exit_code, exit::FAILED, "{r:?}");
    r.error.clone().unwrap()
}

// ------------------------------------------------------------ other users

/// Finding 2: the state dir and the lock were world-readable and the lock
/// world-lockable (any user could keep every run out, `wait` and the
/// package's prerm with them). The modes an earlier version left are
/// narrowed by the next run.
#[test]
fn another_user_can_neither_read_nor_lock_the_state() {
    let n = Node::new("copy");
    let state = n.root.state_dir();
    let lock = n.root.lock_file();
    // as an earlier version made them
    fs::create_dir_all(&state).unwrap();
    fs::set_permissions(&state, fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(&lock, b"").unwrap();
    fs::set_permissions(&lock, fs::Permissions::from_mode(0o644)).unwrap();
    // the root itself is reachable: only the state's own modes keep out
    let (ok, err) = as_nobody(&format!("ls {}", n.root.dir().display()));
    assert!(ok, "nobody cannot even list the scratch root: {err}");

    n.version("v1");
    assert_eq!(n.activate().outcome, Some(Outcome::Committed));
    assert_eq!((mode(&state), mode(&lock)), (0o700, 0o600));
    let flock = require_tool("flock", "util-linux");
    nobody_cannot(
        "take the run lock",
        &format!("{} -n {} true", flock.display(), lock.display()),
    );
    nobody_cannot("list the state dir", &format!("ls {}", state.display()));
    nobody_cannot(
        "read the report",
        &format!("cat {}", n.root.report_file().display()),
    );

    // the lock file is never followed through a link
    fs::remove_file(&lock).unwrap();
    let elsewhere = n.dir.path().join("elsewhere");
    std::os::unix::fs::symlink(&elsewhere, &lock).unwrap();
    let r = n.activate();
    assert_eq!(r.exit_code, exit::FAILED, "{r:?}");
    assert!(!elsewhere.exists(), "the lock followed a link");
}

/// Issue 40 item 5: a descriptor `nobody` opened while the lock file was
/// 0644 (as an earlier version made it) kept working after the next run
/// narrowed the file with a chmod: `nobody` could still `flock` it and
/// keep every run out. The run replaces such a file (and one that is not
/// root's), so the old descriptor locks a file nobody else opens.
#[test]
fn a_descriptor_opened_while_the_lock_was_wide_locks_nothing_after_a_run() {
    use kubeslot_activator::lock::Lock;
    use std::io::{BufRead as _, Write as _};
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let root = Root::new(dir.path().join("root"));
    let state = root.state_dir();
    let lock = root.lock_file();
    fs::create_dir_all(&state).unwrap();
    for d in [dir.path().join("root"), state.clone()] {
        fs::set_permissions(d, fs::Permissions::from_mode(0o755)).unwrap();
    }
    fs::write(&lock, b"").unwrap();
    fs::set_permissions(&lock, fs::Permissions::from_mode(0o644)).unwrap();

    let setpriv = require_tool("setpriv", "util-linux");
    let flock = require_tool("flock", "util-linux");
    let script = format!(
        "exec 9<{lock} || exit 1; echo opened; read go; {flock} -n 9 || exit 2; echo held; sleep 30",
        lock = lock.display(),
        flock = flock.display()
    );
    let mut child = Command::new(setpriv)
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args(["sh", "-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "opened\n", "nobody could not open the 0644 lock");

    // a run (activate, gc, fetch) takes the lock and lets it go
    drop(Lock::try_exclusive(&root).unwrap());
    assert_eq!(mode(&lock), 0o600);
    writeln!(child.stdin.as_mut().unwrap(), "go").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    let held = line == "held\n";
    let next = Lock::try_exclusive(&root);
    let _ = child.kill();
    let _ = child.wait();
    assert!(held, "nobody's flock on its old descriptor failed");
    next.expect("nobody's old descriptor still holds the run lock");

    // a 0600 lock file that is not root's is replaced too
    chown(&lock, Some(NOBODY), Some(NOBODY)).unwrap();
    drop(Lock::try_exclusive(&root).unwrap());
    assert_eq!(fs::metadata(&lock).unwrap().uid(), 0);

    // and a wide one `nobody` holds locked while the run starts (a root
    // holder, an earlier version's run, is waited for instead: the
    // prerm test below)
    fs::set_permissions(&state, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(&lock, fs::Permissions::from_mode(0o644)).unwrap();
    let mut holder = Command::new(require_tool("setpriv", "util-linux"))
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&flock)
        .arg(&lock)
        .args(["sh", "-c", "echo held; sleep 30"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let run = Lock::try_exclusive(&root);
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(line, "held\n");
    run.expect("a lock file nobody holds keeps every run out");
}

/// Issue 40 item 5: `preflight` on a fresh root made `/var/lib/kubeslot`
/// 0755 on the way to the layer store (only `layers/` was 0700): every
/// directory kubeslot makes there is private from the start.
#[test]
fn preflight_on_a_fresh_root_makes_only_private_dirs() {
    let n = Node::new("overlay");
    let state = n.root.state_dir();
    assert!(!state.exists());
    let out = Command::new(BIN)
        .args(["preflight", "--root"])
        .arg(n.root.dir())
        .arg("--config")
        .arg(&n.config)
        .output()
        .unwrap();
    assert!(
        state.is_dir(),
        "preflight made no state dir: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for d in [state.clone(), n.root.layers_dir()] {
        assert_eq!(mode(&d), 0o700, "{}", d.display());
    }
}

/// Finding 2: the package's prerm waited for the run lock without a limit
/// (with the lock open to every user, forever). It waits at most
/// KUBESLOT_PRERM_WAIT_SECS, then fails saying why.
#[test]
fn prerm_waits_for_a_held_lock_only_as_long_as_its_limit() {
    let flock = require_tool("flock", "util-linux");
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("usr/bin/kubeslot-activator");
    fs::create_dir_all(bin.parent().unwrap()).unwrap();
    fs::copy(BIN, &bin).unwrap();
    let root = Root::new(dir.path());
    fs::create_dir_all(root.state_dir()).unwrap();
    fs::write(root.lock_file(), b"").unwrap();
    let prerm = kubeslot_test_support::workspace_root().join("ci/deb/prerm");
    let run = || {
        let t0 = Instant::now();
        let out = Command::new("timeout")
            .arg("60")
            .arg("sh")
            .arg(&prerm)
            .arg("remove")
            .env("DPKG_ROOT", dir.path())
            .env("KUBESLOT_PRERM_WAIT_SECS", "2")
            .output()
            .unwrap();
        (out, t0.elapsed())
    };
    // held by this process (an open file description of its own, closed
    // on exec: no child keeps it)
    let holder = fs::File::open(root.lock_file()).unwrap();
    rustix::fs::flock(&holder, rustix::fs::FlockOperation::LockExclusive).unwrap();
    // the holder has it once a non-blocking try fails
    let deadline = Instant::now() + Duration::from_secs(10);
    while Command::new(&flock)
        .args(["-n", "-s"])
        .arg(root.lock_file())
        .arg("true")
        .status()
        .unwrap()
        .success()
    {
        assert!(Instant::now() < deadline, "the holder never took the lock");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (out, took) = run();
    drop(holder);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(took < Duration::from_secs(30), "waited {took:?}");
    assert!(
        err.contains("waiting for it to end") && err.contains("still held after 2 s"),
        "{err}"
    );
    // nobody holds it: the package goes
    let (out, _) = run();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Finding 3: the layer store (setuid programs, a layer's 1777 `/tmp`), the
/// slot dirs and `/var/lib/machines` (a mounted slot's `/tmp`) were open
/// to every user, who could write into a layer every slot mounts.
#[test]
fn other_users_reach_neither_the_layer_store_nor_a_mounted_slot() {
    let n = Node::new("overlay");
    // as an earlier version (the overlay probe) left them
    for d in [n.root.layers_dir(), n.root.machines_dir()] {
        fs::create_dir_all(&d).unwrap();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
    }
    n.version("v1");
    let r = n.activate();
    assert_eq!(r.outcome, Some(Outcome::Committed), "{r:?}");
    let base = n.lower(Slot::Kube1, 1);
    let tree = n.tree(Slot::Kube1);
    assert!(base.join("usr/bin/su").is_file() && tree.join("tmp").is_dir());
    let (ok, err) = as_nobody(&format!("ls {}", n.root.dir().display()));
    assert!(ok, "nobody cannot even list the scratch root: {err}");
    let upper = overlay::upper_dir(&n.root, Slot::Kube1);
    for (what, script) in [
        (
            "list the layer store",
            format!("ls {}", n.root.layers_dir().display()),
        ),
        (
            "reach a setuid program in a layer",
            format!("stat {}", base.join("usr/bin/su").display()),
        ),
        (
            "write into a layer's /tmp",
            format!("echo x > {}", base.join("tmp/evil").display()),
        ),
        (
            "write into the mounted slot's /tmp",
            format!("echo x > {}", tree.join("tmp/evil").display()),
        ),
        ("list the slot's upper", format!("ls {}", upper.display())),
    ] {
        nobody_cannot(what, &script);
    }
    for d in [
        n.root.layers_dir(),
        n.root.machines_dir(),
        n.root.slot_overlay_dir("kube1"),
    ] {
        assert_eq!(mode(&d), 0o700, "{}", d.display());
    }
    // the machine's own root stays 0755 (non-root users inside it)
    assert_eq!(mode(&tree), 0o755);
}

// ------------------------------------------------------------ the node

/// Findings 3 and 5: a layer that changed in the store after it was
/// unpacked (a file added to a layer every slot mounts) was reused as it
/// was. It is checked against its record first: the next image that needs
/// it gets it unpacked afresh (beside it: the other slot's unit still
/// names it), and `verify-layers` names the change.
#[test]
fn a_layer_changed_in_the_store_is_never_mounted_again() {
    let n = Node::new("overlay");
    n.version("v1");
    assert_eq!(n.activate().outcome, Some(Outcome::Committed));
    let base = n.lower(Slot::Kube1, 1);
    fs::write(base.join("tmp/evil"), b"in every slot").unwrap();
    assert!(n.tree(Slot::Kube1).join("tmp/evil").exists());

    let out = Command::new(BIN)
        .args(["verify-layers", "--root"])
        .arg(n.root.dir())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(exit::FAILED), "{text}");
    assert!(text.contains("tmp/evil: added"), "{text}");

    n.version("v2");
    let r = n.activate();
    assert_eq!(
        (r.outcome, r.slot),
        (Some(Outcome::Committed), Some(Slot::Kube2)),
        "{r:?}"
    );
    let tree = n.tree(Slot::Kube2);
    assert!(tree.join("usr/bin/su").is_file());
    assert!(
        !tree.join("tmp/evil").exists(),
        "the changed layer was mounted again"
    );
    let kube2_base = n.lower(Slot::Kube2, 1);
    assert_ne!(kube2_base, base);
    assert!(record::check(
        &kube2_base,
        &record::load(&record::record_path(&kube2_base)).unwrap()
    )
    .unwrap()
    .is_empty());
}

/// Finding 5: a layer is reused only under the unpack policy it was made
/// under: one a removed allowlist entry would refuse is checked again.
#[test]
fn a_layer_unpacked_under_another_policy_is_unpacked_again_under_this_one() {
    let n = Node::new("overlay");
    let tool = tar(&[
        E::Dir("opt/", 0o755),
        E::File("opt/tool", 0o4755, b"#!/bin/true\n"),
    ]);
    n.set(
        "/unpack",
        serde_json::json!({"setuid_allowlist": ["/opt/tool"]}),
    );
    n.image("v1", &[base_layer(), tool.clone(), kubelet_layer("v1")]);
    let r = n.activate();
    assert_eq!(r.outcome, Some(Outcome::Committed), "{r:?}");
    // the allowlist entry is withdrawn; v2 shares the layer
    n.set("/unpack", serde_json::json!({}));
    n.image("v2", &[base_layer(), tool, kubelet_layer("v2")]);
    let r = n.activate();
    let e = refused(&r);
    assert!(e.contains("/opt/tool") && e.contains("setuid"), "{e}");
    assert_eq!(n.running(), ["systemd-nspawn@kube1.service"]);
}

/// Finding 4: an overlay rollback checked only an entry count, so a node
/// that replaced its kubelet with a file of the same size and added a unit
/// was started again after a flip away from it. Every upper entry outside
/// the node's paths is a change now: refused (named), `--force` starts it,
/// `--clean` drops what the node wrote.
#[test]
fn overlay_rollback_refuses_what_the_node_changed_in_its_image() {
    let n = Node::new("overlay");
    n.version("v1");
    assert_eq!(n.activate().outcome, Some(Outcome::Committed));
    let t = n.tree(Slot::Kube1);
    fs::write(t.join("usr/local/bin/kubelet"), b"kubelet EVIL\n").unwrap();
    fs::write(
        t.join("etc/systemd/system/persist.service"),
        b"[Service]\nExecStart=/evil\n",
    )
    .unwrap();
    n.node_writes_its_own_paths(Slot::Kube1);
    // what a booting node writes that is no change: systemd's /etc stamp,
    // and a file written again exactly as the image has it (ldconfig's
    // cache at first boot); the copy-up lands in the upper all the same
    fs::write(t.join("etc/.updated"), b"# stamp\n").unwrap();
    fs::write(t.join("etc/fixture-health"), b"healthy").unwrap();
    assert!(overlay::upper_dir(&n.root, Slot::Kube1)
        .join("etc/fixture-health")
        .exists());
    n.version("v2");
    assert_eq!(n.activate().slot, Some(Slot::Kube2));

    let e = refused(&n.rollback(false, false));
    assert!(
        !e.contains("fixture-health") && !e.contains(".updated"),
        "{e}"
    );
    assert!(
        e.contains("/usr/local/bin/kubelet (changed by the node)")
            && e.contains("/etc/systemd/system/persist.service (added by the node)"),
        "{e}"
    );
    for allowed in [
        "/var/lib/kubelet",
        "/etc/machine-id",
        "/etc/kubeslot",
        "/etc/cni",
    ] {
        assert!(!e.contains(allowed), "{allowed}: {e}");
    }
    assert!(e.contains("--force") && e.contains("--clean"), "{e}");
    assert_eq!(n.running(), ["systemd-nspawn@kube2.service"]);

    // --clean: the node's writes go, the verified layers stay
    let r = n.rollback(true, false);
    assert_eq!(
        (r.outcome, r.slot),
        (Some(Outcome::Committed), Some(Slot::Kube1)),
        "{r:?}"
    );
    assert_eq!(
        fs::read(t.join("usr/local/bin/kubelet")).unwrap(),
        b"kubelet v1\n"
    );
    assert!(!t.join("etc/systemd/system/persist.service").exists());
}

/// Finding 4: with `--force` the node's changes are started anyway (the
/// operator's call), and a lower that differs from its record refuses
/// even `--clean` (which only drops the upper) before anything is dropped.
#[test]
fn overlay_rollback_refuses_a_layer_changed_in_the_store_even_with_clean() {
    let n = Node::new("overlay");
    n.version("v1");
    assert_eq!(n.activate().outcome, Some(Outcome::Committed));
    fs::write(n.tree(Slot::Kube1).join("etc/node-note"), b"x").unwrap();
    n.version("v2");
    assert_eq!(n.activate().slot, Some(Slot::Kube2));
    // the kubelet of kube1's image, same size, in the layer store
    let layer = n.lower(Slot::Kube1, 0);
    fs::write(layer.join("usr/local/bin/kubelet"), b"kubelet vX\n").unwrap();
    for clean in [true, false] {
        let e = refused(&n.rollback(clean, false));
        assert!(
            e.contains(&format!(
                "layer {}: /usr/local/bin/kubelet (contents changed)",
                layer.display()
            )),
            "{e}"
        );
        assert!(
            overlay::upper_dir(&n.root, Slot::Kube1)
                .join("etc/node-note")
                .exists(),
            "--clean dropped the upper before refusing"
        );
        assert_eq!(n.running(), ["systemd-nspawn@kube2.service"]);
    }
    let r = n.rollback(false, true);
    assert_eq!(r.slot, Some(Slot::Kube1), "{r:?}");
    assert_eq!(r.outcome, Some(Outcome::Committed), "{r:?}");
}

/// Finding 5: a copied slot's record ignored added entries and recorded
/// no mode or owner, so an added unit and a setuid kubelet owned by nobody
/// passed a rollback.
#[test]
fn copy_rollback_refuses_added_files_and_changed_modes_and_owners() {
    let n = Node::new("copy");
    n.version("v1");
    assert_eq!(n.activate().outcome, Some(Outcome::Committed));
    let t = n.tree(Slot::Kube1);
    fs::write(
        t.join("etc/systemd/system/persist.service"),
        b"[Service]\nExecStart=/evil\n",
    )
    .unwrap();
    let kubelet = t.join("usr/local/bin/kubelet");
    chown(&kubelet, Some(NOBODY), Some(NOBODY)).unwrap();
    fs::set_permissions(&kubelet, fs::Permissions::from_mode(0o4755)).unwrap();
    n.node_writes_its_own_paths(Slot::Kube1);
    n.version("v2");
    assert_eq!(n.activate().slot, Some(Slot::Kube2));

    let e = refused(&n.rollback(false, false));
    assert!(
        e.contains("/etc/systemd/system/persist.service (added)")
            && e.contains("/usr/local/bin/kubelet (mode 0755 -> 4755, owner 0:0 -> 65534:65534)"),
        "{e}"
    );
    for allowed in [
        "/var/lib/kubelet",
        "/etc/machine-id",
        "/etc/kubeslot",
        "/etc/cni",
    ] {
        assert!(!e.contains(allowed), "{allowed}: {e}");
    }
    assert_eq!(n.running(), ["systemd-nspawn@kube2.service"]);
    let r = n.rollback(false, true);
    assert_eq!(r.outcome, Some(Outcome::Committed), "{r:?}");
}

/// The image's CNI plugins and configs, and root's profile: image files in
/// the places a node also writes by design.
fn cni_layer() -> Vec<u8> {
    tar(&[
        E::Dir("etc/", 0o755),
        E::Dir("etc/cni/", 0o755),
        E::Dir("etc/cni/net.d/", 0o755),
        E::File(
            "etc/cni/net.d/10-bridge.conflist",
            0o644,
            b"{\"type\":\"bridge\"}",
        ),
        E::Dir("opt/", 0o755),
        E::Dir("opt/cni/", 0o755),
        E::Dir("opt/cni/bin/", 0o755),
        E::File("opt/cni/bin/bridge", 0o755, b"bridge plugin\n"),
        E::File("opt/cni/bin/loopback", 0o755, b"loopback plugin\n"),
        E::Dir("root/", 0o700),
        E::File("root/.profile", 0o644, b"# root's profile\n"),
        E::Dir("var/log/", 0o755),
        E::File("var/log/wtmp", 0o644, b""),
        E::File("var/lib/shells.state", 0o644, b"/bin/sh\n"),
    ])
}

/// Issue 40, item 1: the CNI plugin dirs, `/var` and `/root` were excused
/// wholesale, image files included: a node that replaced the image's
/// `bridge` plugin (containerd runs it as root for every sandbox) with a
/// setuid payload was started again by `rollback`. Every entry the
/// image holds is compared wherever it lies now; under the node's own
/// state only additions, removals and a directory's mode, owner and
/// xattrs (systemd-tmpfiles adjusts them at boot) are the node's.
#[test]
fn rollback_refuses_a_changed_cni_plugin_in_either_slot_mode() {
    for (slots, attack) in [
        ("copy", true),
        ("copy", false),
        ("overlay", true),
        ("overlay", false),
    ] {
        let n = Node::new(slots);
        n.image("v1", &[base_layer(), kubelet_layer("v1"), cni_layer()]);
        assert_eq!(n.activate().outcome, Some(Outcome::Committed), "{slots}");
        let t = n.tree(Slot::Kube1);
        n.node_writes_its_own_paths(Slot::Kube1);
        // the node's own: a cluster CNI's plugin and config added, a
        // plugin removed, a directory's mode adjusted
        fs::write(t.join("opt/cni/bin/calico"), b"calico plugin\n").unwrap();
        fs::write(t.join("etc/cni/net.d/10-calico.conflist"), b"{}").unwrap();
        fs::remove_file(t.join("opt/cni/bin/loopback")).unwrap();
        fs::set_permissions(t.join("var/lib"), fs::Permissions::from_mode(0o711)).unwrap();
        // data it rewrites: a log and a state file the image ships
        fs::write(t.join("var/log/wtmp"), b"boot record").unwrap();
        fs::set_permissions(t.join("var/log/wtmp"), fs::Permissions::from_mode(0o664)).unwrap();
        fs::write(t.join("var/lib/shells.state"), b"/bin/sh\n/bin/bash\n").unwrap();
        if attack {
            // the image's plugin replaced by a setuid payload, and root's
            // profile (run by every root login shell) changed
            let bridge = t.join("opt/cni/bin/bridge");
            fs::write(&bridge, b"#!/bin/sh\nid >/x\n").unwrap();
            fs::set_permissions(&bridge, fs::Permissions::from_mode(0o4755)).unwrap();
            fs::write(t.join("root/.profile"), b"/evil &\n").unwrap();
            // an image file in its data made setuid: its mode is the image's
            let state = t.join("var/lib/shells.state");
            fs::set_permissions(&state, fs::Permissions::from_mode(0o4755)).unwrap();
        }
        n.image("v2", &[base_layer(), kubelet_layer("v2"), cni_layer()]);
        assert_eq!(n.activate().slot, Some(Slot::Kube2), "{slots}");

        let r = n.rollback(false, false);
        if !attack {
            // the node's own changes pass
            assert_eq!(
                (r.outcome, r.slot),
                (Some(Outcome::Committed), Some(Slot::Kube1)),
                "{slots}: {r:?}"
            );
            assert!(t.join("opt/cni/bin/calico").exists());
            continue;
        }
        let e = refused(&r);
        assert!(
            e.contains("/opt/cni/bin/bridge (")
                && e.contains("/root/.profile (")
                && e.contains("/var/lib/shells.state ("),
            "{slots}: {e}"
        );
        for allowed in [
            "calico",
            "loopback",
            "/var/lib (",
            "wtmp",
            "/etc/cni/net.d/10-bridge",
        ] {
            assert!(!e.contains(allowed), "{slots}: {allowed}: {e}");
        }
        assert_eq!(n.running(), ["systemd-nspawn@kube2.service"], "{slots}");
    }
}

/// Finding 5: `verify-layers` reported "0 mismatches" for a layer's
/// kubelet made setuid and given to nobody.
#[test]
fn verify_layers_reports_a_chmod_and_a_chown_in_a_layer() {
    let n = Node::new("overlay");
    n.version("v1");
    assert_eq!(n.activate().outcome, Some(Outcome::Committed));
    let kubelet = n.lower(Slot::Kube1, 0).join("usr/local/bin/kubelet");
    chown(&kubelet, Some(NOBODY), Some(NOBODY)).unwrap();
    fs::set_permissions(&kubelet, fs::Permissions::from_mode(0o4755)).unwrap();
    let out = Command::new(BIN)
        .args(["verify-layers", "--json", "--root"])
        .arg(n.root.dir())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(exit::FAILED));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["mismatches"].as_array().unwrap().len(), 1, "{v:#}");
    assert_eq!(v["mismatches"][0]["path"], "usr/local/bin/kubelet");
    assert_eq!(
        v["mismatches"][0]["what"],
        "mode 0755 -> 4755, owner 0:0 -> 65534:65534"
    );
}

/// 25 directories of 200-byte names under `dir`: 5,024 bytes of path,
/// past PATH_MAX; made one level at a time from an open descriptor.
fn past_path_max(dir: &Path) {
    use rustix::fs::{mkdirat, openat, Mode, OFlags, CWD};
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let mut fd = openat(CWD, dir, flags, Mode::empty()).unwrap();
    let name = "n".repeat(200);
    for _ in 0..25 {
        mkdirat(&fd, name.as_str(), Mode::from_raw_mode(0o755)).unwrap();
        fd = openat(&fd, name.as_str(), flags, Mode::empty()).unwrap();
    }
    rustix::fs::openat(
        &fd,
        "leaf",
        OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )
    .unwrap();
}

/// Finding 6: the fingerprint walker died on a tree past PATH_MAX that the
/// node wrote under /var: the commit dropped the slot's rollback mark, and
/// the slot could never be rolled back to.
#[test]
fn a_node_that_writes_past_path_max_keeps_its_rollback() {
    let n = Node::new("copy");
    n.version("v1");
    assert_eq!(n.activate().outcome, Some(Outcome::Committed));
    let deep = n.tree(Slot::Kube1).join("var/lib/deep");
    fs::create_dir_all(&deep).unwrap();
    past_path_max(&deep);
    n.version("v2");
    assert_eq!(n.activate().slot, Some(Slot::Kube2));
    assert!(
        n.root.slot_tree_mark("kube1").exists(),
        "the commit dropped kube1's mark"
    );
    let r = n.rollback(false, false);
    assert_eq!(
        (r.outcome, r.slot),
        (Some(Outcome::Committed), Some(Slot::Kube1)),
        "{r:?}"
    );
}

/// Finding 6: `verify-layers` aborted with "File name too long" on a layer
/// holding a tree past PATH_MAX; it reports what was added instead.
#[test]
fn verify_layers_checks_a_layer_past_path_max() {
    let n = Node::new("overlay");
    n.version("v1");
    assert_eq!(n.activate().outcome, Some(Outcome::Committed));
    past_path_max(&n.lower(Slot::Kube1, 1).join("var/lib"));
    let out = Command::new(BIN)
        .args(["verify-layers", "--json", "--root"])
        .arg(n.root.dir())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(exit::FAILED), "{err}");
    assert!(!err.contains("too long"), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let m = v["mismatches"].as_array().unwrap();
    assert_eq!(m.len(), 26, "{v:#}");
    assert!(m.iter().all(|m| m["what"] == "added"), "{v:#}");
    assert!(m
        .iter()
        .any(|m| m["path"].as_str().unwrap().ends_with("/leaf")));
}

/// Finding 6: a failed rollback flip whose target's tree could not be
/// counted again returned before the machine that ran before was started
/// again, leaving the node down. Now it is restarted whatever happens to
/// the mark, and the report says the mark went.
#[test]
fn a_failed_rollback_restarts_the_old_machine_even_when_the_mark_cannot_be_taken() {
    let n = Node::new("copy");
    n.v1_then_v2();
    // kube1 will not come up again (an operator's --force)
    // (same size: the fingerprint still matches)
    fs::write(n.tree(Slot::Kube1).join("etc/fixture-health"), b"sickly!").unwrap();
    // and while its gate runs, its tree goes: it cannot be counted after
    let tree = n.tree(Slot::Kube1);
    let state = n.root.state_file();
    let swapper = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if fs::read_to_string(&state).is_ok_and(|s| s.contains("\"trying\"")) {
                fs::rename(&tree, tree.with_extension("gone")).unwrap();
                fs::write(&tree, b"not a tree").unwrap();
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    });
    let r = n.rollback(false, true);
    assert!(swapper.join().unwrap(), "the rollback never tried kube1");
    assert_eq!(r.exit_code, exit::ROLLED_BACK, "{r:?}");
    assert_eq!(n.running(), ["systemd-nspawn@kube2.service"], "{r:?}");
    let e = r.error.unwrap();
    assert!(e.contains("tree mark could not be taken again"), "{e}");
    assert!(!n.root.slot_tree_mark("kube1").exists());
}

// ------------------------------------------------------------ the gate

/// Where the cgroup v2 hierarchy is mounted on this machine.
fn cgroup2_mount() -> PathBuf {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines()
        .find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let mount = pre.split_whitespace().nth(4)?;
            (post.split_whitespace().next() == Some("cgroup2")).then(|| PathBuf::from(mount))
        })
        .expect("a cgroup2 mount (unified or hybrid hierarchy): the gate's test needs one")
}

/// A loopback HTTP server answering 200 to everything, run by `nobody`:
/// its process and the port it listens on.
fn nobody_listener() -> (std::process::Child, u16) {
    http_listener(true, "127.0.0.1", 0)
}

/// A loopback HTTP server answering 200 to everything on `host:port` (0:
/// any free port), run by `nobody` or by root: its process and its port.
fn http_listener(nobody: bool, host: &str, port: u16) -> (std::process::Child, u16) {
    use std::io::BufRead as _;
    let setpriv = require_tool("setpriv", "util-linux");
    // the system's, which nobody can run (not a shim under /root)
    let python = Path::new("/usr/bin/python3");
    assert!(
        python.is_file(),
        "/usr/bin/python3 is missing: run `apt-get install -y python3`"
    );
    let script = "import http.server, sys\n\
                  class H(http.server.BaseHTTPRequestHandler):\n\
                  \x20   def do_GET(self):\n\
                  \x20       self.send_response(200); self.end_headers(); self.wfile.write(b'ok')\n\
                  \x20   def log_message(self, *a): pass\n\
                  s = http.server.HTTPServer((sys.argv[1], int(sys.argv[2])), H)\n\
                  print(s.server_address[1], flush=True)\n\
                  s.serve_forever()\n";
    let who: &[&str] = if nobody {
        &["--reuid=65534", "--regid=65534", "--clear-groups"]
    } else {
        &[]
    };
    let mut child = Command::new(setpriv)
        .args(who)
        .arg(python)
        .args(["-c", script, host, &port.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (child, line.trim().parse().expect("the listener's port"))
}

/// Finding 1: the gate took a listener for the machine's when its cgroup
/// path merely contained `systemd-nspawn@kube2.service`: any user with a
/// systemd user manager can make one under `user.slice`
/// (`systemd-run --user --unit=...`), listen on the healthz port and pass
/// the gate. Here a real process of `nobody`, answering 200 on loopback,
/// sits in a real cgroup of that shape (there is no user manager on the
/// test machine: the cgroup is made by hand where the manager would make
/// it); the gate, reading the real `/proc`, refuses its answers.
#[test]
fn a_users_listener_in_a_cgroup_named_like_the_machine_does_not_pass_the_gate() {
    let base = cgroup2_mount().join(format!("kubeslot-test-{}", std::process::id()));
    let leaf = base.join(
        "user.slice/user-65534.slice/user@65534.service/app.slice/systemd-nspawn@kube2.service",
    );
    fs::create_dir_all(&leaf).unwrap();
    let (mut child, port) = nobody_listener();
    fs::write(leaf.join("cgroup.procs"), child.id().to_string()).unwrap();
    let cgroup = fs::read_to_string(format!("/proc/{}/cgroup", child.id())).unwrap();
    let gate = Gate {
        url: format!("http://127.0.0.1:{port}/healthz"),
        successes: 2,
        timeout: Duration::from_millis(1500),
        interval: Duration::from_millis(100),
        proc_dir: Some(PathBuf::from("/proc")),
        require_owner: true,
        runtime: false,
    };
    let fake = FakeSystemd::new(&Root::new("/nonexistent"));
    use kubeslot_activator::systemd::Systemd as _;
    fake.start(&Slot::Kube2.unit()).unwrap();
    let verdict = health::wait_healthy(&fake, Slot::Kube2, &gate, &[]);
    let _ = child.kill();
    let _ = child.wait();
    // leaf first: a cgroup goes only once it is empty and has no children
    let mut dir = leaf.as_path();
    while dir.starts_with(&base) {
        let _ = fs::remove_dir(dir);
        dir = dir.parent().unwrap();
    }
    assert!(
        cgroup.contains("/app.slice/systemd-nspawn@kube2.service"),
        "the listener is not where a user's manager puts it: {cgroup}"
    );
    let e = verdict.expect_err("a user's listener passed the gate");
    assert!(
        e.detail.contains("outside machine kube2") && e.detail.contains("user.slice"),
        "{e}"
    );
}

/// Issue 40 item 4: any listener on the healthz port counted: `nobody`
/// listening on `127.0.0.2:<port>` made a healthy flip fail (and the image
/// was marked bad). Only the socket that answered the probe counts now:
/// here the machine's kubelet (a real root process in a real cgroup where
/// machined puts `kube2`) answers on `127.0.0.1:<port>` while `nobody`
/// listens on `127.0.0.2:<port>`, and the gate, reading the real `/proc`,
/// passes.
#[test]
fn a_users_listener_on_another_address_of_the_port_does_not_fail_the_gate() {
    let base = cgroup2_mount().join("machine.slice");
    let leaf = base.join("systemd-nspawn@kube2.service");
    fs::create_dir_all(&leaf).unwrap();
    let (mut kubelet, port) = http_listener(false, "127.0.0.1", 0);
    fs::write(leaf.join("cgroup.procs"), kubelet.id().to_string()).unwrap();
    let (mut other, _) = http_listener(true, "127.0.0.2", port);
    let gate = Gate {
        url: format!("http://127.0.0.1:{port}/healthz"),
        successes: 2,
        timeout: Duration::from_millis(3000),
        interval: Duration::from_millis(100),
        proc_dir: Some(PathBuf::from("/proc")),
        require_owner: true,
        runtime: false,
    };
    let fake = FakeSystemd::new(&Root::new("/nonexistent"));
    use kubeslot_activator::systemd::Systemd as _;
    fake.start(&Slot::Kube2.unit()).unwrap();
    let verdict = health::wait_healthy(&fake, Slot::Kube2, &gate, &[]);
    // and nobody's listener is what a probe of 127.0.0.2 reaches
    let gate2 = Gate {
        url: format!("http://127.0.0.2:{port}/healthz"),
        ..gate.clone()
    };
    let verdict2 = health::wait_healthy(&fake, Slot::Kube2, &gate2, &[]);
    for c in [&mut kubelet, &mut other] {
        let _ = c.kill();
        let _ = c.wait();
    }
    let _ = fs::remove_dir(&leaf);
    let _ = fs::remove_dir(&base);
    verdict.expect("a listener on another address of the port failed the gate");
    let e = verdict2.expect_err("nobody's listener passed the gate");
    assert!(e.detail.contains("outside machine kube2"), "{e}");
}

/// Issue 40 item 4: a flip that failed because someone else held the
/// healthz port marked the image bad (the next `activate` refused it,
/// exit 4). Who listens says nothing about the image: the flip is rolled
/// back, the image is not marked bad and the next run tries it again.
/// The root's `/proc` names the fake kubelet's socket as held by a
/// process of `nobody`'s.
#[test]
fn a_flip_failed_by_a_foreign_listener_never_marks_the_image_bad() {
    let n = Node::new("copy");
    let port = n
        .fake
        .healthz_url
        .rsplit_once(':')
        .and_then(|(_, p)| p.split('/').next()?.parse::<u16>().ok())
        .unwrap();
    let proc = n.root.dir().join("proc");
    fs::create_dir_all(proc.join("net")).unwrap();
    fs::write(
        proc.join("net/tcp"),
        format!(
            "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
             \x20  0: 0100007F:{port:04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000 65534        0 4242 1 0 100 0 0 10 0\n"
        ),
    )
    .unwrap();
    fs::create_dir_all(proc.join("100/fd")).unwrap();
    std::os::unix::fs::symlink("socket:[4242]", proc.join("100/fd/3")).unwrap();
    fs::write(proc.join("100/cgroup"), "0::/user.slice/user-65534.slice\n").unwrap();

    let v1 = n.version("v1");
    let r = n.activate();
    assert_eq!(r.outcome, Some(Outcome::RolledBack), "{r:?}");
    let e = r.error.clone().unwrap();
    assert!(
        e.contains("kubelet-listener") && e.contains("outside machine kube1"),
        "{e}"
    );
    let s = kubeslot_activator::state::State::load(&n.root).unwrap();
    assert!(
        s.bad.is_empty(),
        "marked bad for a foreign listener: {:?}",
        s.bad
    );

    // a root that cannot tell (a test root) again: the same image commits
    fs::remove_dir_all(proc.join("100")).unwrap();
    fs::remove_file(proc.join("net/tcp")).unwrap();
    let r = n.activate();
    assert_eq!(r.outcome, Some(Outcome::Committed), "{r:?}");
    assert_eq!(r.digest, Some(v1), "{r:?}");
}

/// Issue 40 item 4: a healthz URL whose host is not a literal loopback
/// address (`127.1`, `0.0.0.0`, a name) skipped the ownership check
/// silently; the config is refused now, naming the field.
#[test]
fn a_healthz_url_that_is_no_literal_loopback_address_is_refused() {
    let n = Node::new("copy");
    n.version("v1");
    for host in ["127.1", "0.0.0.0", "localhost", "[::]", "10.0.0.5"] {
        n.set(
            "/health/kubelet_healthz_url",
            format!("http://{host}:10248/healthz").into(),
        );
        let r = n.activate();
        let e = r.error.clone().unwrap_or_default();
        assert!(
            r.exit_code != exit::OK
                && e.contains("health.kubelet_healthz_url")
                && e.contains("literal loopback address"),
            "{host}: {r:?}"
        );
    }
    assert!(n.running().is_empty());
}

// ------------------------------------------------------------ paths and files we trust

/// Issue 40 item 6: `extra_mounts` and `images.bundle_dir` were checked as
/// strings: `/srv/models` as a link to `../var/lib/kubeslot` was accepted
/// (nspawn follows it; the node would see kubeslot's state). A bind source
/// is walked without following links, and every directory on its way must
/// be root's and not writable by others.
#[test]
fn a_bind_source_through_a_link_or_another_users_dir_is_refused() {
    let n = Node::new("copy");
    n.version("v1");
    let srv = n.root.dir().join("srv");
    fs::create_dir_all(&srv).unwrap();
    std::os::unix::fs::symlink("../var/lib/kubeslot", srv.join("models")).unwrap();
    n.set(
        "/extra_mounts",
        serde_json::json!([{"host_path": "/srv/models", "machine_path": "/models"}]),
    );
    let e = not_run(&n.activate());
    assert!(
        e.contains("/srv/models") && e.contains("symbolic link") && e.contains("extra_mounts"),
        "{e}"
    );
    assert!(n.running().is_empty());

    // a real directory below a directory another user owns (who could
    // swap it for a link at any time)
    fs::remove_file(srv.join("models")).unwrap();
    fs::create_dir_all(srv.join("data/models")).unwrap();
    chown(srv.join("data"), Some(NOBODY), Some(NOBODY)).unwrap();
    n.set(
        "/extra_mounts",
        serde_json::json!([{"host_path": "/srv/data/models", "machine_path": "/models"}]),
    );
    let e = not_run(&n.activate());
    assert!(
        e.contains("/srv/data") && e.contains("uid 65534") && e.contains("chown root:root"),
        "{e}"
    );

    // the bundle's directory the same way
    n.set("/extra_mounts", serde_json::json!([]));
    std::os::unix::fs::symlink("../var/lib/kubeslot", srv.join("bundle")).unwrap();
    let digest = format!("sha256:{}", "a".repeat(64));
    n.set(
        "/images",
        serde_json::json!({"bundle_dir": "/srv/bundle",
                           "bundle": [{"file": "pause.tar", "name": "registry.example/pause:3.10", "digest": digest}]}),
    );
    let e = not_run(&n.activate());
    assert!(
        e.contains("/srv/bundle") && e.contains("symbolic link") && e.contains("images.bundle_dir"),
        "{e}"
    );
    assert!(n.running().is_empty());
}

/// Issue 40 item 6: a 0666, `nobody`-owned `activator.json`,
/// `default-kubelet` and trusted key were all used. Files that decide what
/// runs as root must be root's and writable by nobody else, and so must
/// their directories; the error names the file and the fix.
#[test]
fn config_key_and_kubelet_args_another_user_may_write_are_refused() {
    let n = Node::new("copy");
    n.version("v1");
    let check = |what: &str, path: &Path, fix: &str| {
        let r = n.activate();
        let e = r.error.clone().unwrap_or_default();
        assert!(
            r.exit_code != exit::OK && e.contains(&path.display().to_string()) && e.contains(fix),
            "{what}: {r:?}"
        );
        assert!(n.running().is_empty(), "{what}: a machine runs");
    };
    // the config: world-writable, then another user's, then in a
    // group-writable directory
    fs::set_permissions(&n.config, fs::Permissions::from_mode(0o666)).unwrap();
    check("a 0666 config", &n.config, "chmod go-w");
    fs::set_permissions(&n.config, fs::Permissions::from_mode(0o644)).unwrap();
    chown(&n.config, Some(NOBODY), Some(NOBODY)).unwrap();
    check("nobody's config", &n.config, "chown root:root");
    chown(&n.config, Some(0), Some(0)).unwrap();
    fs::set_permissions(n.dir.path(), fs::Permissions::from_mode(0o775)).unwrap();
    check(
        "a config in a group-writable dir",
        n.dir.path(),
        "chmod go-w",
    );
    fs::set_permissions(n.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();

    // the kubelet's extra arguments
    let args = n.root.kubelet_extra_args();
    fs::create_dir_all(args.parent().unwrap()).unwrap();
    fs::write(&args, "KUBELET_EXTRA_ARGS=\"--v=2\"\n").unwrap();
    fs::set_permissions(&args, fs::Permissions::from_mode(0o666)).unwrap();
    check("a 0666 default-kubelet", &args, "chmod go-w");
    chown(&args, Some(NOBODY), Some(NOBODY)).unwrap();
    fs::set_permissions(&args, fs::Permissions::from_mode(0o644)).unwrap();
    check("nobody's default-kubelet", &args, "chown root:root");
    fs::remove_file(&args).unwrap();

    // a trusted key
    let key = n.root.dir().join("etc/kubeslot/keys/k.pem");
    fs::create_dir_all(key.parent().unwrap()).unwrap();
    fs::write(&key, image::public_pem(&image::key(7))).unwrap();
    fs::set_permissions(&key, fs::Permissions::from_mode(0o666)).unwrap();
    n.set(
        "/trust/public_keys",
        serde_json::json!(["/etc/kubeslot/keys/k.pem"]),
    );
    check("a 0666 key", &key, "chmod go-w");
    fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).unwrap();
    chown(key.parent().unwrap(), Some(NOBODY), Some(NOBODY)).unwrap();
    check(
        "a key in nobody's dir",
        key.parent().unwrap(),
        "chown root:root",
    );
    chown(key.parent().unwrap(), Some(0), Some(0)).unwrap();

    // all root's and narrow: the same config commits
    let r = n.activate();
    assert_eq!(r.outcome, Some(Outcome::Committed), "{r:?}");
}

/// Issue 40 item 7: a CA file holding a private key beside the certificate
/// was copied verbatim into the node's CA bundle. Only its `CERTIFICATE`
/// blocks reach the node.
#[test]
fn only_certificates_of_a_ca_file_reach_the_node() {
    let n = Node::new("copy");
    n.version("v1");
    let ca = n.root.dir().join("etc/kubeslot/ca.pem");
    fs::create_dir_all(ca.parent().unwrap()).unwrap();
    let key = "-----BEGIN PRIVATE KEY-----\nTUlJRXZRSUJBREFOQmdrcWhraUc5dzBC\n-----END PRIVATE KEY-----\n";
    let cert = "-----BEGIN CERTIFICATE-----\nMIIBkTCB+wIJAKHHIG\n-----END CERTIFICATE-----\n";
    fs::write(&ca, format!("# the site's CA\n{key}{cert}")).unwrap();
    n.set("/kubelet/ca_data", serde_json::Value::Null);
    n.set("/kubelet/ca_file", "/etc/kubeslot/ca.pem".into());
    let r = n.activate();
    assert_eq!(r.outcome, Some(Outcome::Committed), "{r:?}");
    let dir = n.root.host_files(Slot::Kube1.machine());
    let bundle = fs::read_to_string(dir.join("apiserver-client-ca.crt")).unwrap();
    assert_eq!(bundle, cert);
    for e in fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            let text = fs::read_to_string(&p).unwrap_or_default();
            assert!(!text.contains("PRIVATE KEY"), "{}: {text}", p.display());
        }
    }
}

mod mirrors;
