//! A fake host tree for the activator's preflight and host-settings tests:
//! the files its checks read under a root (`/proc`, `/sys`, `/dev`, the
//! dpkg database), as a Debian bookworm host that can run node machines
//! has them, and stand-ins for `systemd-sysctl` and `systemd-modules-load`
//! under the root's `/lib/systemd` that do what the real ones do with the
//! files they are given (the activator runs the root's tools).
//!
//! Given a directory used as the root; writes only below it (`/dev/kmsg`
//! is a real character device made with `mknod`: the tests run as root).

use std::path::Path;
use std::process::Command;

/// The kernel parameters of a typical host as booted (the kernel's own
/// defaults), before kubeslot's sysctl drop-in is applied.
pub const BOOT_SYSCTLS: &[(&str, &str)] = &[
    ("vm.overcommit_memory", "0"),
    ("vm.panic_on_oom", "0"),
    ("kernel.panic", "0"),
    ("kernel.panic_on_oops", "0"),
    ("kernel.keys.root_maxkeys", "1000000"),
    ("kernel.keys.root_maxbytes", "25000000"),
    ("net.ipv4.ip_forward", "0"),
    ("net.bridge.bridge-nf-call-iptables", "1"),
    ("net.bridge.bridge-nf-call-ip6tables", "1"),
    ("net.ipv4.conf.all.src_valid_mark", "0"),
    ("net.ipv4.conf.default.src_valid_mark", "0"),
    // Ubuntu's sysctl.d default (loose reverse-path filtering)
    ("net.ipv4.conf.all.rp_filter", "2"),
    ("net.ipv4.conf.default.rp_filter", "2"),
    ("kernel.osrelease", "6.1.0-kubeslot-test"),
];

/// Writes, under `root`, the files the activator's preflight reads on a
/// Debian bookworm host that can run node machines, as booted: systemd 252
/// as init, systemd-container, unified cgroup v2 with the usual
/// controllers, `overlay` and `br_netfilter` loaded, the kernel's default
/// sysctls ([`BOOT_SYSCTLS`]: kubeslot's drop-in not applied yet), no swap,
/// `/dev/kmsg` (a real character device: needs root). Tests then change
/// what their scenario needs.
pub fn fake_host(root: &Path) {
    let write = |rel: &str, text: &str| {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    std::fs::create_dir_all(root.join("run/systemd/system")).unwrap();
    write(
        "var/lib/dpkg/status",
        "Package: systemd\nStatus: install ok installed\nVersion: 252.39-1~deb12u1\n\n\
         Package: systemd-container\nStatus: install ok installed\nVersion: 252.39-1~deb12u1\n",
    );
    for f in ["usr/bin/systemd-nspawn", "usr/bin/machinectl"] {
        write(f, "");
    }
    write("lib/systemd/system/systemd-nspawn@.service", "[Service]\n");
    write(
        "sys/fs/cgroup/cgroup.controllers",
        "cpuset cpu io memory hugetlb pids rdma misc\n",
    );
    write(
        "proc/modules",
        "br_netfilter 32768 0 - Live 0x0000000000000000\noverlay 163840 0 - Live 0x0000000000000000\n",
    );
    write("proc/filesystems", "nodev\tsysfs\nnodev\toverlay\n");
    write(
        "proc/swaps",
        "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n",
    );
    for (key, value) in BOOT_SYSCTLS {
        write(
            &format!("proc/sys/{}", key.replace('.', "/")),
            &format!("{value}\n"),
        );
    }
    for (name, text) in [
        ("lib/systemd/systemd-sysctl", FAKE_SYSTEMD_SYSCTL),
        (
            "lib/systemd/systemd-modules-load",
            FAKE_SYSTEMD_MODULES_LOAD,
        ),
    ] {
        write(name, text);
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(root.join(name), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let kmsg = root.join("dev/kmsg");
    std::fs::create_dir_all(kmsg.parent().unwrap()).unwrap();
    let _ = std::fs::remove_file(&kmsg);
    let status = Command::new("mknod")
        .arg(&kmsg)
        .args(["c", "1", "11"])
        .status()
        .expect("run mknod");
    assert!(
        status.success(),
        "mknod {} c 1 11 failed (tests run as root)",
        kmsg.display()
    );
}

/// Where the stand-in tools of [`fake_host`] log their command lines
/// (relative to the root).
pub const FAKE_TOOLS_LOG: &str = "var/log/kubeslot-fake-tools.log";

/// `systemd-sysctl [FILE...]` on a [`fake_host`]: every `key = value` line
/// of the files given (without arguments, as at boot, of every
/// `etc/sysctl.d/*.conf` in name order) written to the root's
/// `proc/sys/<key>` (existing keys only, as the kernel). With
/// `proc/sys/.read-only` present it fails as on a container host.
const FAKE_SYSTEMD_SYSCTL: &str = r#"#!/bin/sh
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$root/var/log" && echo "systemd-sysctl $*" >>"$root/var/log/kubeslot-fake-tools.log"
if [ -e "$root/proc/sys/.read-only" ]; then
  echo "Couldn't write '1' to 'net/ipv4/ip_forward': Read-only file system" >&2
  exit 1
fi
[ $# -gt 0 ] || set -- $(ls "$root"/etc/sysctl.d/*.conf 2>/dev/null | sort)
for f in "$@"; do
  while IFS= read -r line; do
    case $line in ''|'#'*|';'*) continue ;; esac
    k=$(echo "${line%%=*}" | tr -d ' 	')
    v=$(echo "${line#*=}" | sed 's/^[ 	]*//; s/[ 	]*$//')
    p="$root/proc/sys/$(echo "$k" | tr . /)"
    if [ -f "$p" ]; then echo "$v" >"$p"; fi
  done <"$f"
done
"#;

/// `systemd-modules-load [FILE...]` on a [`fake_host`]: the modules are
/// loaded already (`proc/modules`); it only logs its command line.
const FAKE_SYSTEMD_MODULES_LOAD: &str = r#"#!/bin/sh
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$root/var/log" && echo "systemd-modules-load $*" >>"$root/var/log/kubeslot-fake-tools.log"
"#;

/// A directory chain `depth` levels deep under `dir` (`d/d/d/…`, one empty
/// file `f` per level): what a node may write, deeper than a process's
/// open-file limit. Built by path (about 2 bytes per level, within
/// `PATH_MAX` for the depths tests use).
pub fn deep_tree(dir: &Path, depth: usize) {
    std::fs::create_dir_all(dir).unwrap();
    let mut p = dir.to_path_buf();
    for _ in 0..depth {
        std::fs::write(p.join("f"), b"").unwrap();
        p.push("d");
        std::fs::create_dir(&p).unwrap();
    }
}
