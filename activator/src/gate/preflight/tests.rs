//! Every check against fake `/proc`, `/sys`, `/dev` trees
//! (`kubeslot_test_support::fake_host`): a host that passes, then one
//! defect at a time, each failing (or warning) the check named for it.

use std::fs;

use super::*;
use crate::config::{Gpu, GpuMode};
use crate::render::host_settings::SYSCTLS;

struct Fake {
    _dir: tempfile::TempDir,
    root: Root,
}

impl Fake {
    /// A host that passes every check: the fake host as booted, with
    /// kubeslot's sysctls applied.
    fn healthy() -> Fake {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        kubeslot_test_support::fake_host(dir.path());
        for s in SYSCTLS {
            fs::write(root.proc_sys(s.key), format!("{}\n", s.value)).unwrap();
        }
        Fake { _dir: dir, root }
    }

    fn write(&self, rel: &str, text: &str) {
        let p = self.root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    }

    fn run(&self) -> Preflight {
        run(&self.root, &Inputs::default())
    }

    fn finding(&self, name: &str) -> Finding {
        let p = self.run();
        p.checks
            .into_iter()
            .find(|f| f.name == name)
            .unwrap_or_else(|| panic!("no check {name}"))
    }
}

fn names(p: &Preflight) -> Vec<&str> {
    p.checks.iter().map(|f| f.name.as_str()).collect()
}

#[test]
fn a_healthy_host_passes_every_check() {
    let h = Fake::healthy();
    let p = h.run();
    let not_passed: Vec<_> = p
        .checks
        .iter()
        .filter(|f| f.status != Status::Pass)
        .collect();
    assert!(not_passed.is_empty(), "{not_passed:#?}");
    assert!(p.passed());
    let n = names(&p);
    for want in [
        "systemd",
        "systemd-container",
        "cgroup-v2",
        "kernel-module-overlay",
        "kernel-module-br_netfilter",
        "sysctl-vm.overcommit_memory",
        "sysctl-kernel.panic",
        "sysctl-kernel.panic_on_oops",
        "sysctl-kernel.keys.root_maxkeys",
        "sysctl-kernel.keys.root_maxbytes",
        "sysctl-net.ipv4.ip_forward",
        "sysctl-net.bridge.bridge-nf-call-iptables",
        "sysctl-net.ipv4.conf.all.src_valid_mark",
        "sysctl-net.ipv4.conf.default.rp_filter",
        "swap",
        "disk-space",
        "dev-kmsg",
        "container-engine",
    ] {
        assert!(n.contains(&want), "{want} not in {n:?}");
    }
    // no GPU on the host, gpu "auto": no GPU checks
    assert!(!n.iter().any(|n| n.starts_with("gpu-")), "{n:?}");
    assert!(p.to_string().ends_with("[preflight] passed\n"), "{p}");
}

#[test]
fn a_freshly_booted_host_fails_the_sysctls_kubelet_protects() {
    let dir = tempfile::tempdir().unwrap();
    kubeslot_test_support::fake_host(dir.path());
    let p = run(&Root::new(dir.path()), &Inputs::default());
    let failed: Vec<&str> = p.blocking().iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        failed,
        [
            "sysctl-vm.overcommit_memory",
            "sysctl-kernel.panic",
            "sysctl-kernel.panic_on_oops",
            "sysctl-net.ipv4.ip_forward",
            "sysctl-net.ipv4.conf.all.src_valid_mark",
            "sysctl-net.ipv4.conf.default.src_valid_mark",
            "sysctl-net.ipv4.conf.all.rp_filter",
            "sysctl-net.ipv4.conf.default.rp_filter"
        ]
    );
    let f = &p.blocking()[0];
    assert_eq!(
        (f.seen.as_str(), f.needed.starts_with("1 (kubelet")),
        ("0", true),
        "{f:?}"
    );
    let summary = p.failure_summary();
    assert!(
        summary.contains("sysctl-kernel.panic (seen: 0; needed: 10"),
        "{summary}"
    );
}

#[test]
fn systemd_checks_read_the_dpkg_database_and_the_init_marker() {
    let h = Fake::healthy();
    assert_eq!(
        h.finding("systemd").seen,
        "252.39-1~deb12u1, running as init"
    );
    h.write(
        "var/lib/dpkg/status",
        "Package: systemd\nStatus: install ok installed\nVersion: 245.4-4ubuntu3\n\n\
         Package: systemd-container\nStatus: deinstall ok config-files\nVersion: 245.4-4ubuntu3\n",
    );
    let f = h.finding("systemd");
    assert_eq!(f.status, Status::Fail, "{f:?}");
    assert!(f.needed.contains("247 or newer"), "{f:?}");
    // config files only is not installed, but the tools are there: unknown version
    assert_eq!(h.finding("systemd-container").status, Status::Warn);
    fs::remove_file(h.root.join("var/lib/dpkg/status")).unwrap();
    assert_eq!(h.finding("systemd").status, Status::Warn);
    fs::remove_dir(h.root.join("run/systemd/system")).unwrap();
    let f = h.finding("systemd");
    assert_eq!(
        (f.status, f.seen.as_str()),
        (Status::Fail, "not the init system")
    );
    fs::remove_file(h.root.join("usr/bin/machinectl")).unwrap();
    let f = h.finding("systemd-container");
    assert_eq!(
        (f.status, f.seen.as_str()),
        (Status::Fail, "missing: machinectl"),
        "{f:?}"
    );
    assert_eq!(f.hint.as_deref(), Some("apt-get install systemd-container"));
}

#[test]
fn cgroup_v2_needs_the_unified_hierarchy_and_its_controllers() {
    let h = Fake::healthy();
    h.write("sys/fs/cgroup/cgroup.controllers", "cpu memory pids\n");
    let f = h.finding("cgroup-v2");
    assert_eq!(f.status, Status::Fail);
    assert_eq!(f.hint.as_deref(), Some("missing controllers: cpuset"));
    h.write(
        "sys/fs/cgroup/cgroup.controllers",
        "cpu cpuset memory pids\n",
    );
    let f = h.finding("cgroup-v2");
    assert_eq!(f.status, Status::Warn, "io and hugetlb are optional: {f:?}");
    // this CI machine's layout: v1 controllers plus v2 at .../unified
    fs::remove_file(h.root.join("sys/fs/cgroup/cgroup.controllers")).unwrap();
    fs::create_dir_all(h.root.join("sys/fs/cgroup/unified")).unwrap();
    let f = h.finding("cgroup-v2");
    assert_eq!(f.status, Status::Fail);
    assert!(f.seen.contains("hybrid"), "{f:?}");
}

#[test]
fn modules_count_when_loaded_built_in_or_loadable() {
    let h = Fake::healthy();
    assert_eq!(h.finding("kernel-module-overlay").seen, "loaded");
    // not loaded, not built in, not in the kernel's modules: fail
    h.write("proc/modules", "");
    h.write("proc/filesystems", "nodev\tsysfs\n");
    fs::remove_dir_all(h.root.join("proc/sys/net/bridge")).unwrap();
    for m in ["overlay", "br_netfilter"] {
        let f = h.finding(&format!("kernel-module-{m}"));
        assert_eq!(f.status, Status::Fail, "{f:?}");
    }
    // and without br_netfilter its sysctls do not exist
    let f = h.finding("sysctl-net.bridge.bridge-nf-call-iptables");
    assert_eq!((f.status, f.seen.as_str()), (Status::Fail, "missing"));
    assert!(f.hint.unwrap().contains("br_netfilter"));
    // loadable: listed in the running kernel's modules.dep
    h.write(
        "lib/modules/6.1.0-kubeslot-test/modules.dep",
        "kernel/fs/overlayfs/overlay.ko.xz:\nkernel/net/bridge/br_netfilter.ko.xz: kernel/net/bridge/bridge.ko.xz\n",
    );
    let f = h.finding("kernel-module-br_netfilter");
    assert_eq!(
        (f.status, f.seen.as_str()),
        (Status::Warn, "loadable, not loaded")
    );
    // built in (this CI machine's kernel: no /proc/modules at all)
    fs::remove_file(h.root.join("proc/modules")).unwrap();
    h.write("proc/filesystems", "nodev\tsysfs\nnodev\toverlay\n");
    fs::create_dir_all(h.root.join("proc/sys/net/bridge")).unwrap();
    for m in ["overlay", "br_netfilter"] {
        let f = h.finding(&format!("kernel-module-{m}"));
        assert_eq!(
            (f.status, f.seen.as_str()),
            (Status::Pass, "present in the kernel (built in)")
        );
    }
}

#[test]
fn swap_kmsg_and_other_engines_are_found() {
    let h = Fake::healthy();
    h.write(
        "proc/swaps",
        "Filename\tType\tSize\tUsed\tPriority\n/swapfile file 2097148 0 -2\n",
    );
    let f = h.finding("swap");
    assert_eq!((f.status, f.seen.as_str()), (Status::Fail, "on: /swapfile"));
    // a kubelet configured to run with swap
    let p = run(
        &h.root,
        &Inputs {
            swap_allowed: Some("failSwapOn: false".into()),
            ..Inputs::default()
        },
    );
    let f = p.checks.iter().find(|f| f.name == "swap").unwrap();
    assert_eq!(
        (f.status, f.seen.as_str()),
        (
            Status::Pass,
            "on: /swapfile; the kubelet allows it (failSwapOn: false)"
        )
    );

    fs::remove_file(h.root.join("dev/kmsg")).unwrap();
    let f = h.finding("dev-kmsg");
    assert_eq!((f.status, f.seen.as_str()), (Status::Fail, "missing"));
    h.write("dev/kmsg", "a regular file");
    assert_eq!(h.finding("dev-kmsg").seen, "not a character device");

    fs::create_dir_all(h.root.join("sys/class/net/docker0")).unwrap();
    let f = h.finding("container-engine");
    assert_eq!(
        (f.status, f.seen.as_str()),
        (Status::Fail, "docker, managing iptables")
    );
    h.write(
        "etc/docker/daemon.json",
        r#"{"iptables": false, "log-driver": "journald"}"#,
    );
    let f = h.finding("container-engine");
    assert_eq!(
        (f.status, f.seen.as_str()),
        (Status::Warn, "docker (iptables off)")
    );
}

#[test]
fn disk_space_is_estimated_from_the_image() {
    let h = Fake::healthy();
    let f = h.finding("disk-space");
    assert!(f.needed.contains("image size unknown"), "{f:?}");
    // more than any disk has: 1 EiB of tree
    let check = |disk: DiskUse| {
        run(
            &h.root,
            &Inputs {
                disk,
                ..Inputs::default()
            },
        )
        .checks
        .into_iter()
        .find(|f| f.name == "disk-space")
        .unwrap()
    };
    let f = check(DiskUse::Needs(DiskNeed {
        fetch: 1 << 20,
        tree: 1 << 60,
        exact_layers: 1,
        layers: 2,
    }));
    assert_eq!(f.status, Status::Fail, "{f:?}");
    assert!(
        f.needed.contains("1 MiB of blobs to download")
            && f.needed
                .contains("1 of 2 layers from their stored sizes, the rest 4 x compressed"),
        "{f:?}"
    );
    // the nearest existing parent of /var/lib/machines is measured
    assert!(
        f.seen.contains(&h.root.dir().display().to_string()),
        "{f:?}"
    );
    // a small image needs what it writes, not a floor of 1 GiB
    let f = check(DiskUse::Needs(DiskNeed {
        fetch: 3 << 20,
        tree: 10 << 20,
        exact_layers: 2,
        layers: 2,
    }));
    assert_eq!(f.status, Status::Pass, "{f:?}");
    assert!(f.needed.starts_with("13 MiB free"), "{f:?}");
    // a slot that holds the image already: nothing to write
    let f = check(DiskUse::Staged);
    assert_eq!(
        (f.status, f.needed.as_str()),
        (
            Status::Pass,
            "nothing: the target slot holds the image already"
        )
    );
}

#[test]
fn gpu_checks_run_when_gpus_are_bound() {
    let h = Fake::healthy();
    let gpu = |mode| {
        run(
            &h.root,
            &Inputs {
                gpu: Discovery::read(
                    &h.root,
                    &Gpu {
                        mode,
                        driver_root: None,
                    },
                ),
                ..Inputs::default()
            },
        )
    };
    assert!(!names(&gpu(GpuMode::Auto)).contains(&"gpu-driver"));
    // "on" without a driver: the driver, its control device and its
    // libraries fail (this root has no ldconfig at all)
    let p = gpu(GpuMode::On);
    let failed: Vec<&str> = p.blocking().iter().map(|f| f.name.as_str()).collect();
    assert_eq!(failed, ["gpu-driver", "gpu-nvidiactl", "gpu-libraries"]);
    // a GPU and its driver: auto runs and passes them (the libraries come
    // from <root>/sbin/ldconfig, run as on a host)
    crate::render::gpu::mknod_char(&h.root.dev().join("nvidia0"), 195, 0).unwrap();
    crate::render::gpu::mknod_char(&h.root.dev().join("nvidiactl"), 195, 255).unwrap();
    h.write(
        "proc/driver/nvidia/version",
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15\nGCC version: gcc 12\n",
    );
    let lib = match std::env::consts::ARCH {
        "aarch64" => ("aarch64-linux-gnu", "AArch64"),
        _ => ("x86_64-linux-gnu", "x86-64"),
    };
    let mut listing = String::new();
    for stem in ["libnvidia-ml", "libcuda"] {
        let soname = format!("{stem}.so.1");
        h.write(&format!("usr/lib/{}/{stem}.so.550.54.15", lib.0), "");
        std::os::unix::fs::symlink(
            format!("{stem}.so.550.54.15"),
            h.root.join(&format!("usr/lib/{}/{soname}", lib.0)),
        )
        .unwrap();
        listing += &format!(
            "\t{soname} (libc6,{}) => /usr/lib/{}/{soname}\n",
            lib.1, lib.0
        );
    }
    h.write("listing", &listing);
    h.write(
        "sbin/ldconfig",
        &format!("#!/bin/sh\ncat '{}'\n", h.root.join("listing").display()),
    );
    fs::set_permissions(
        h.root.join("sbin/ldconfig"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let p = gpu(GpuMode::Auto);
    assert!(p.passed(), "{p}");
    // what a GPU host without uvm, nvidia-smi and the persistence daemon
    // is told
    let warned: Vec<&str> = p
        .checks
        .iter()
        .filter(|f| f.status == Status::Warn)
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(warned, ["gpu-nvidia-uvm", "gpu-tools", "gpu-persistenced"]);
    assert!(p
        .checks
        .iter()
        .any(|f| f.name == "gpu-driver" && f.seen.contains("550.54.15")));
    assert!(!names(&gpu(GpuMode::Off)).contains(&"gpu-driver"));
}

#[test]
fn ignored_failures_do_not_block_and_are_shown_as_ignored() {
    let dir = tempfile::tempdir().unwrap();
    kubeslot_test_support::fake_host(dir.path());
    let root = Root::new(dir.path());
    let with = |ignore: &[&str]| {
        run(
            &root,
            &Inputs {
                ignore: ignore.iter().map(|s| s.to_string()).collect(),
                ..Inputs::default()
            },
        )
    };
    assert!(!with(&["sysctl-kernel.panic"]).passed());
    let p = with(&["sysctl-*"]);
    assert!(p.passed(), "{p}");
    assert!(
        p.to_string()
            .contains("[IGNORED] sysctl-kernel.panic: seen 0; needed 10"),
        "{p}"
    );
    assert!(with(&["all"]).passed());
    // an ignore never hides a pass or turns a warning into anything else
    assert!(with(&["all"])
        .checks
        .iter()
        .all(|f| !f.ignored || f.status == Status::Fail));
    // unknown names ignore nothing
    assert!(!with(&["sysctl-kernel.pani"]).passed());
    let text = with(&[]).to_string();
    assert!(
        text.contains("[FAIL] sysctl-net.ipv4.ip_forward: seen 0; needed 1")
            && text.contains("[preflight] 8 check(s) failed: sysctl-vm.overcommit_memory, "),
        "{text}"
    );
}

#[test]
fn dpkg_versions_and_majors() {
    let s = "Package: a\nStatus: install ok installed\nVersion: 1:2.3\n\nPackage: systemd\nVersion: 255.4-1ubuntu8\nStatus: install ok installed\n";
    assert_eq!(
        systemd::dpkg_version(s, "systemd").as_deref(),
        Some("255.4-1ubuntu8")
    );
    assert_eq!(systemd::dpkg_version(s, "b"), None);
}
