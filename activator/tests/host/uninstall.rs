//! `uninstall`: machines, units, files and state removed and the node's own
//! state kept, refusals, an unreadable state, an adopted machine, and the
//! network a node left (never the host's own).

use super::*;

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
    assert!(
        out.contains("kept /etc/kubeslot (config, trust keys, credentials; --purge removes it)\n"),
        "{out}"
    );
    // again: nothing left to do; --purge takes the node state and the
    // operator's config (with its bootstrap token) too, and says so
    assert_eq!(h.cmd(&["uninstall"]).0, 0);
    assert!(root.config_dir().exists());
    let (code, out, _) = h.cmd(&["uninstall", "--purge", "--dry-run"]);
    assert_eq!(code, 0);
    assert!(out.contains("would remove /etc/kubeslot\n"), "{out}");
    assert!(h.config_path().exists(), "a dry run removes nothing");
    let (code, out, _) = h.cmd(&["uninstall", "--purge"]);
    assert_eq!(code, 0);
    assert!(out.contains("removed /var/lib/kubeslot\n"), "{out}");
    assert!(out.contains("removed /etc/kubeslot\n"), "{out}");
    assert!(
        out.contains("purged: the config, trust keys and credentials under /etc/kubeslot are gone"),
        "{out}"
    );
    assert!(!out.contains("kept /etc/kubeslot"), "{out}");
    assert!(!root.state_dir().exists());
    assert!(!root.config_dir().exists(), "purge keeps no credential");
}

/// `uninstall --dry-run` prints the very list the run then works through:
/// every unit it would stop and every path it would remove, and no other,
/// on overlay slots (their mount units, uppers, bpffs mounts), with the
/// package's units, the host settings and the state (`node/` kept).
#[test]
fn uninstall_dry_run_lists_exactly_what_the_run_stops_and_removes() {
    let img = images();
    let h = Host::with_slots(&img, Some("overlay"));
    assert_eq!(h.activate().0, 0);
    h.set_config("v2", serde_json::json!({}));
    assert_eq!(h.activate().0, 0);
    let units = h.root().join("usr/lib/systemd/system");
    fs::create_dir_all(&units).unwrap();
    for u in ["kubeslot-activator.path", "kubeslot-activator.service"] {
        fs::write(units.join(u), "[Unit]\n").unwrap();
    }
    let listed = |out: &str, stop: &str, remove: &str| -> Vec<String> {
        let mut l: Vec<String> = out
            .lines()
            .filter_map(|l| {
                l.strip_prefix(stop)
                    .map(|u| format!("unit {u}"))
                    .or_else(|| l.strip_prefix(remove).map(|p| format!("path {p}")))
            })
            .collect();
        l.sort();
        l
    };
    let (code, out, err) = h.cmd(&["uninstall", "--dry-run"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let would = listed(&out, "would stop and disable ", "would remove ");
    for want in [
        "unit kubeslot-activator.path",
        "unit systemd-nspawn@kube1.service",
        "-var-lib-machines-kube2.mount",
        "path /var/lib/machines/kube2",
        "path /etc/sysctl.d/99-kubeslot.conf",
        "path /var/lib/kubeslot/state.json",
    ] {
        assert!(
            would.iter().any(|w| w.ends_with(want)),
            "{want}: {would:#?}"
        );
    }
    let (code, out, err) = h.cmd(&["uninstall"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(
        listed(&out, "stopped and disabled ", "removed "),
        would,
        "{out}"
    );
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
    let out = h.run_in(Some(&ns.0), &["uninstall", "--dry-run", "--network"], None);
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

    let out = h.run_in(Some(&ns.0), &["uninstall", "--network"], None);
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

/// Issue 40 item 7: `uninstall` removed a WireGuard link and a routing
/// rule the host made itself after the first activation (they match the
/// node's names, and the record only knows what the host had before).
/// Without `--network` it removes no link and no rule, and says what it
/// left.
#[test]
fn uninstall_leaves_the_network_alone_unless_asked() {
    let img = images();
    let h = Host::new(&img);
    let ns = NetNs::new();
    fs::create_dir_all(h.root().join("sys/class")).unwrap();
    std::os::unix::fs::symlink("/sys/class/net", h.root().join("sys/class/net")).unwrap();
    let out = h.run_in(Some(&ns.0), &["activate", "--json"], None);
    let r = json(
        &String::from_utf8_lossy(&out.stdout),
        &String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(r["outcome"], "committed", "{r:#}");
    // the host's own VPN, set up after the node first ran
    ns.inside("link add wg0 type bridge");
    ns.inside("rule add table 51821 pref 300");
    ns.inside("route add unreachable 10.8.0.0/24 table 51821");
    let before = (ns.links(), ns.inside("rule show"));
    let out = h.run_in(Some(&ns.0), &["uninstall"], None);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!((ns.links(), ns.inside("rule show")), before, "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("left link wg0: ") && l.contains("--network removes it")),
        "{text}"
    );
    assert!(!text.contains("removed the node's"), "{text}");
}
