//! The one fake of the [`Systemd`] trait every activator test uses: the
//! unit tests (`cfg(test)`) and the integration tests (the `testing`
//! feature, which the crate's dev-dependency on itself turns on; a normal
//! build never has it).
//!
//! It records every call that changes something, keeps which units are
//! active, and acts as far as a test needs the host to change: a node
//! machine's unit started is healthy when its tree's `etc/fixture-health`
//! says `healthy` (the kubelet endpoint it serves on loopback answers
//! accordingly), a mount unit is mounted for real (the `Where=` and
//! `Options=` of the unit file the activator wrote) and unmounted on stop
//! and on drop, `enable`/`disable` make and remove the
//! `machines.target.wants` link. Failures and machines started behind
//! kubeslot's back are switches a test sets.
//!
//! The black-box tests of the binary (`tests/host.rs`) fake the tools
//! instead (`systemctl`, `machinectl`, `systemd-run` on `PATH`): they test
//! [`crate::systemd::SystemCtl`] too.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::paths::Root;
use crate::systemd::{Systemd, SystemdError};

/// The fake service manager of a host under `root`.
pub struct FakeSystemd {
    root: Root,
    calls: RefCell<Vec<String>>,
    active: RefCell<BTreeSet<String>>,
    /// What the kubelet endpoint answers: 200 while true.
    pub healthy: Arc<AtomicBool>,
    /// The loopback URL of the kubelet endpoint (`/healthz`).
    pub healthz_url: String,
    /// `stop` of a machine's unit fails.
    pub fail_stop: bool,
    /// `start` of a machine's unit fails.
    pub fail_start: bool,
    /// What a command run inside a machine answers (the GPU check).
    pub gpu_visible: bool,
    /// What `systemctl is-failed` inside a machine answers (the NVIDIA
    /// setup check); false unless a test sets it.
    pub gpu_setup_failed: bool,
    /// Machines machined knows that no unit of ours started.
    pub foreign: RefCell<BTreeSet<String>>,
    /// What a command whose output is read inside a machine (the gate's
    /// `crictl info`) prints, one answer per call, the last one repeating;
    /// an empty answer is a failed command; none at all: the fake cannot
    /// run it (`Unsupported`, as for a root that is not a live host).
    pub machine_output: Vec<String>,
    /// How many times a command's output was read inside a machine.
    pub outputs_read: std::cell::Cell<usize>,
}

/// The machine of a node machine's unit (`systemd-nspawn@kube1.service`).
fn machine_of(unit: &str) -> Option<&str> {
    unit.strip_prefix("systemd-nspawn@")?
        .strip_suffix(".service")
}

impl FakeSystemd {
    /// A fake with nothing active, its kubelet endpoint served by a thread.
    pub fn new(root: &Root) -> FakeSystemd {
        let healthy = Arc::new(AtomicBool::new(false));
        let l = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let healthz_url = format!(
            "http://{}/healthz",
            l.local_addr().expect("a bound address")
        );
        let h = healthy.clone();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { continue };
                let mut buf = [0u8; 512];
                let _ = s.read(&mut buf);
                let answer: &[u8] = if h.load(Ordering::SeqCst) {
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
                } else {
                    b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n"
                };
                let _ = s.write_all(answer);
            }
        });
        FakeSystemd {
            root: root.clone(),
            calls: RefCell::default(),
            active: RefCell::default(),
            healthy,
            healthz_url,
            fail_stop: false,
            fail_start: false,
            gpu_visible: true,
            gpu_setup_failed: false,
            foreign: RefCell::default(),
            machine_output: Vec::new(),
            outputs_read: std::cell::Cell::new(0),
        }
    }

    /// Every call that changes something, in order (`start UNIT`,
    /// `daemon-reload`, `run MACHINE ARGV`, ...).
    pub fn calls(&self) -> Vec<String> {
        self.calls.borrow().clone()
    }

    /// The units active now.
    pub fn active_units(&self) -> BTreeSet<String> {
        self.active.borrow().clone()
    }

    /// `Where=` and `Options=` of an installed mount unit.
    fn mount_of(&self, unit: &str) -> (String, String) {
        let path = self.root.systemd_system_dir().join(unit);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("mount unit {}: {e}", path.display()));
        let field = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(k))
                .unwrap_or_else(|| panic!("{k} in {}", path.display()))
                .to_string()
        };
        (field("Where="), field("Options="))
    }

    fn failed(&self, command: &str) -> SystemdError {
        SystemdError::Failed {
            command: command.into(),
            status: "exit status: 1".into(),
            stderr: "fake failure".into(),
        }
    }

    fn record(&self, call: String) {
        self.calls.borrow_mut().push(call);
    }
}

impl Drop for FakeSystemd {
    /// No overlay stays mounted in a removed temp dir.
    fn drop(&mut self) {
        for unit in self
            .active
            .borrow()
            .iter()
            .filter(|u| u.ends_with(".mount"))
        {
            let (target, _) = self.mount_of(unit);
            let _ = Command::new("umount").arg(&target).status();
        }
    }
}

impl Systemd for FakeSystemd {
    fn daemon_reload(&self) -> Result<(), SystemdError> {
        self.record("daemon-reload".into());
        Ok(())
    }

    fn start(&self, unit: &str) -> Result<(), SystemdError> {
        self.record(format!("start {unit}"));
        if unit.ends_with(".mount") {
            // A real mount of what the unit says (overlay slots).
            if !self.active.borrow().contains(unit) {
                let (target, options) = self.mount_of(unit);
                let ok = Command::new("mount")
                    .args(["-t", "overlay", "overlay", "-o", &options])
                    .arg(&target)
                    .status()
                    .is_ok_and(|s| s.success());
                assert!(ok, "mount {unit}");
                self.active.borrow_mut().insert(unit.into());
            }
            return Ok(());
        }
        if self.fail_start {
            return Err(self.failed(&format!("systemctl start {unit}")));
        }
        if let Some(machine) = machine_of(unit) {
            let health =
                std::fs::read_to_string(self.root.machine_tree(machine).join("etc/fixture-health"))
                    .unwrap_or_default();
            self.healthy.store(health == "healthy", Ordering::SeqCst);
        }
        self.active.borrow_mut().insert(unit.into());
        Ok(())
    }

    fn stop(&self, unit: &str) -> Result<(), SystemdError> {
        self.record(format!("stop {unit}"));
        if unit.ends_with(".mount") {
            if self.active.borrow_mut().remove(unit) {
                let (target, _) = self.mount_of(unit);
                let ok = Command::new("umount")
                    .arg(&target)
                    .status()
                    .is_ok_and(|s| s.success());
                assert!(ok, "umount {unit}");
            }
            return Ok(());
        }
        if self.fail_stop {
            return Err(self.failed(&format!("systemctl stop {unit}")));
        }
        if self.active.borrow_mut().remove(unit) {
            self.healthy.store(false, Ordering::SeqCst);
        }
        Ok(())
    }

    fn is_active(&self, unit: &str) -> Result<bool, SystemdError> {
        Ok(self.active.borrow().contains(unit))
    }

    /// Makes the link a real `systemctl enable` makes for a node machine's
    /// unit.
    fn enable(&self, unit: &str) -> Result<(), SystemdError> {
        self.record(format!("enable {unit}"));
        if let Some(m) = machine_of(unit) {
            let link = self.root.machine_wants_link(m);
            if let Some(dir) = link.parent() {
                std::fs::create_dir_all(dir).expect("the wants dir");
            }
            let _ = std::os::unix::fs::symlink("/lib/systemd/system/systemd-nspawn@.service", link);
        }
        Ok(())
    }

    fn disable(&self, unit: &str) -> Result<(), SystemdError> {
        self.record(format!("disable {unit}"));
        if let Some(m) = machine_of(unit) {
            let _ = std::fs::remove_file(self.root.machine_wants_link(m));
        }
        Ok(())
    }

    fn machine_registered(&self, machine: &str) -> Result<bool, SystemdError> {
        Ok(self.foreign.borrow().contains(machine)
            || self
                .active
                .borrow()
                .contains(&format!("systemd-nspawn@{machine}.service")))
    }

    fn run_in_machine(&self, machine: &str, argv: &[&str]) -> Result<bool, SystemdError> {
        self.record(format!("run {machine} {}", argv.join(" ")));
        if argv.first() == Some(&"systemctl") {
            return Ok(self.gpu_setup_failed);
        }
        Ok(self.gpu_visible)
    }

    /// A kubelet that names its bootstrap token in its last words (the
    /// report must not); containerd's journal cannot be read.
    fn machine_journal(
        &self,
        machine: &str,
        unit: &str,
        lines: usize,
    ) -> Result<Vec<String>, SystemdError> {
        self.record(format!("journal {machine} {unit} {lines}"));
        match unit {
            "kubelet" => Ok(vec![
                format!("{machine} kubelet[1]: starting"),
                format!("{machine} kubelet[1]: bootstrap token abcdef.0123456789abcdef refused"),
                format!("{machine} kubelet[1]: last words"),
            ]),
            _ => Err(self.failed(&format!("journalctl -M {machine} -u {unit}"))),
        }
    }

    fn machine_failed_units(&self, machine: &str) -> Result<Vec<String>, SystemdError> {
        self.record(format!("failed-units {machine}"));
        Ok(vec!["kubelet.service loaded failed failed kubelet".into()])
    }

    fn output_in_machine(
        &self,
        machine: &str,
        argv: &[&str],
    ) -> Result<crate::systemd::MachineOutput, SystemdError> {
        self.record(format!("output {machine} {}", argv.join(" ")));
        let n = self.outputs_read.get();
        self.outputs_read.set(n + 1);
        let last = self.machine_output.len().saturating_sub(1);
        let Some(text) = self.machine_output.get(n.min(last)) else {
            return Err(SystemdError::Unsupported {
                what: "output_in_machine",
            });
        };
        Ok(crate::systemd::MachineOutput {
            success: !text.is_empty(),
            stdout: text.clone(),
            stderr: if text.is_empty() {
                "FATA[0000] validate service connection: validate CRI v1 runtime API for endpoint \"unix:///run/containerd/containerd.sock\": rpc error: code = Unavailable desc = connection error".into()
            } else {
                String::new()
            },
        })
    }
}
