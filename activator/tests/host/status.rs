//! What a host tells without changing anything: `status`, `wait` (and `wait
//! --provisioned`), `plan` and `--dry-run`, a torn state shown and repaired,
//! no credential in any of them, and the commands' help.

use super::*;

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

/// `status` and `status --json` show the cluster's view the host keeps:
/// what the metrics file of the config's `cluster` section says (none yet
/// before an activation; then the image, its slot and the activations by
/// result, the same facts node_exporter exports).
#[test]
fn status_shows_the_cluster_view_of_the_metrics_file() {
    let img = images();
    let h = Host::new(&img);
    let mut c = h.config("v1", serde_json::json!({}));
    // no API here: the drain goes undrained, the Ready wait is left out
    c["cluster"] = serde_json::json!({
        "metrics_file": "/var/lib/kubeslot/kubeslot.prom",
        "gate": {"skip_node_ready": true},
    });
    fs::write(h.config_path(), serde_json::to_vec_pretty(&c).unwrap()).unwrap();
    let (code, out, err) = h.cmd(&["status"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("cluster view (/var/lib/kubeslot/kubeslot.prom): no metrics file yet"),
        "{out}"
    );
    let (code, _, err) = h.cmd(&["activate"]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = h.cmd(&["status", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let view = &v["cluster"];
    assert_eq!(
        view["metrics_file"], "/var/lib/kubeslot/kubeslot.prom",
        "{out}"
    );
    assert_eq!(view["slot"], "kube1", "{out}");
    assert_eq!(view["digest"], img.v1.to_string(), "{out}");
    assert_eq!(
        view["activations"],
        serde_json::json!({"committed": 1}),
        "{out}"
    );
    assert!(
        view["last_activation_unix"].as_u64().unwrap() > 1_700_000_000,
        "{out}"
    );
    let (code, out, err) = h.cmd(&["status"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!(
            "cluster view (/var/lib/kubeslot/kubeslot.prom): oci:{}:v1 ({}) in kube1; activations: committed 1; last at ",
            h.layout.display(),
            img.v1
        )),
        "{out}"
    );
}
