//! The systemd boundary: the few things the activator asks of the host's
//! service manager, as one small trait, and the real implementation that runs
//! `systemctl`, `machinectl`, `systemd-run -M` and `journalctl -M` found
//! on `PATH` (also to run a command inside a machine and read what it
//! printed).
//!
//! Given unit and machine names (never paths). It does not decide when to
//! start or stop anything (that is `activate`), and it does not parse unit
//! files. Tests of the library use a recording fake (`activate`'s unit
//! tests); black-box tests of the binary put fake `systemctl`/`systemd-run`
//! scripts first on `PATH`, so this real code runs against them.

use std::process::{Command, Stdio};

/// What the activator needs from systemd.
pub trait Systemd {
    fn daemon_reload(&self) -> Result<(), SystemdError>;
    /// Starts a unit and waits for the start job to finish.
    fn start(&self, unit: &str) -> Result<(), SystemdError>;
    /// Stops a unit (a no-op when it is not running).
    fn stop(&self, unit: &str) -> Result<(), SystemdError>;
    fn is_active(&self, unit: &str) -> Result<bool, SystemdError>;
    /// Creates the unit's `[Install]` links (`systemctl enable`), so it
    /// starts at boot; a no-op when they exist.
    fn enable(&self, unit: &str) -> Result<(), SystemdError>;
    /// Removes the unit's `[Install]` links; a no-op when there are none.
    fn disable(&self, unit: &str) -> Result<(), SystemdError>;
    /// Whether machined knows a machine of that name (`machinectl show`):
    /// also one started outside its `systemd-nspawn@` unit.
    fn machine_registered(&self, machine: &str) -> Result<bool, SystemdError>;
    /// Runs a command inside a running machine; `Ok(true)` when it exited 0.
    fn run_in_machine(&self, machine: &str, argv: &[&str]) -> Result<bool, SystemdError>;
    /// The last `lines` journal lines of a unit inside a running machine
    /// (`journalctl -M <machine> -n <lines>` of the unit's own lines,
    /// systemd's about it, and its syslog identifier's), oldest first: what
    /// a report shows when the machine failed.
    fn machine_journal(
        &self,
        machine: &str,
        unit: &str,
        lines: usize,
    ) -> Result<Vec<String>, SystemdError>;
    /// The failed units inside a running machine (`systemctl -M <machine>
    /// --failed`), one line each.
    fn machine_failed_units(&self, machine: &str) -> Result<Vec<String>, SystemdError>;
    /// Runs a command inside a running machine and returns what it printed.
    /// Provided for implementations that only model exit codes (the
    /// library's unit-test fakes, which run no machine): they answer
    /// [`SystemdError::Unsupported`]. [`SystemCtl`] captures the output.
    fn output_in_machine(
        &self,
        machine: &str,
        argv: &[&str],
    ) -> Result<MachineOutput, SystemdError> {
        let _ = (machine, argv);
        Err(SystemdError::Unsupported {
            what: "output_in_machine",
        })
    }
}

/// What a command run inside a machine printed, and whether it exited 0.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachineOutput {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

#[derive(Debug, thiserror::Error)]
pub enum SystemdError {
    #[error("{command}: cannot run: {source} (is systemd installed and on PATH?)")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("this systemd boundary cannot {what}")]
    Unsupported { what: &'static str },
    #[error("{command}: exited with {status}: {stderr}")]
    Failed {
        command: String,
        status: String,
        stderr: String,
    },
}

/// The host's systemd, through its command-line tools.
#[derive(Clone, Debug, Default)]
pub struct SystemCtl;

fn run(program: &str, args: &[&str]) -> Result<std::process::Output, SystemdError> {
    let command = std::iter::once(program)
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ");
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| SystemdError::Spawn {
            command: command.clone(),
            source,
        })
}

/// The lines a command printed, when it succeeded.
fn run_lines(program: &str, args: &[&str]) -> Result<Vec<String>, SystemdError> {
    let out = run(program, args)?;
    if !out.status.success() {
        return Err(SystemdError::Failed {
            command: std::iter::once(program)
                .chain(args.iter().copied())
                .collect::<Vec<_>>()
                .join(" "),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect())
}

fn run_ok(program: &str, args: &[&str]) -> Result<(), SystemdError> {
    run_lines(program, args).map(|_| ())
}

impl Systemd for SystemCtl {
    fn daemon_reload(&self) -> Result<(), SystemdError> {
        run_ok("systemctl", &["daemon-reload"])
    }

    fn start(&self, unit: &str) -> Result<(), SystemdError> {
        run_ok("systemctl", &["start", unit])
    }

    fn stop(&self, unit: &str) -> Result<(), SystemdError> {
        run_ok("systemctl", &["stop", unit])
    }

    fn enable(&self, unit: &str) -> Result<(), SystemdError> {
        run_ok("systemctl", &["enable", "--quiet", unit])
    }

    fn disable(&self, unit: &str) -> Result<(), SystemdError> {
        run_ok("systemctl", &["disable", "--quiet", unit])
    }

    fn machine_registered(&self, machine: &str) -> Result<bool, SystemdError> {
        // exit 0 with the machine's properties, non-zero ("No machine
        // 'kube1' known") otherwise
        Ok(run("machinectl", &["show", "--property=Name", machine])?
            .status
            .success())
    }

    fn is_active(&self, unit: &str) -> Result<bool, SystemdError> {
        // `is-active` answers through its exit code; any non-zero is "not
        // active" (inactive, failed, activating, unknown unit).
        Ok(run("systemctl", &["is-active", "--quiet", unit])?
            .status
            .success())
    }

    fn run_in_machine(&self, machine: &str, argv: &[&str]) -> Result<bool, SystemdError> {
        let mut args = vec!["-M", machine, "--wait", "--pipe", "--quiet", "--"];
        args.extend_from_slice(argv);
        Ok(run("systemd-run", &args)?.status.success())
    }

    fn machine_journal(
        &self,
        machine: &str,
        unit: &str,
        lines: usize,
    ) -> Result<Vec<String>, SystemdError> {
        let n = lines.to_string();
        let name = unit.strip_suffix(".service").unwrap_or(unit);
        // What `-u` matches, or'ed with the syslog identifier: a stdout
        // line journald could not tie to the unit's cgroup still carries
        // the identifier systemd gave the stream.
        let (by_unit, by_systemd, by_ident) = (
            format!("_SYSTEMD_UNIT={name}.service"),
            format!("UNIT={name}.service"),
            format!("SYSLOG_IDENTIFIER={name}"),
        );
        run_lines(
            "journalctl",
            &[
                "-M",
                machine,
                "-n",
                &n,
                "--no-pager",
                "-q",
                "-o",
                "short-iso",
                &by_unit,
                "+",
                &by_systemd,
                "+",
                &by_ident,
            ],
        )
    }

    fn machine_failed_units(&self, machine: &str) -> Result<Vec<String>, SystemdError> {
        run_lines(
            "systemctl",
            &[
                "-M",
                machine,
                "--failed",
                "--no-legend",
                "--plain",
                "--no-pager",
            ],
        )
    }

    fn output_in_machine(
        &self,
        machine: &str,
        argv: &[&str],
    ) -> Result<MachineOutput, SystemdError> {
        let mut args = vec!["-M", machine, "--wait", "--pipe", "--quiet", "--"];
        args.extend_from_slice(argv);
        let out = run("systemd-run", &args)?;
        Ok(MachineOutput {
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}
