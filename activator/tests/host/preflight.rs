//! The checks before a flip as `activate` and `fetch` run them: a failed
//! preflight refuses before anything changes, the host settings kubeslot
//! writes, the disk check, swap.

use super::*;

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
