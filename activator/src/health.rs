//! The health gate a freshly started node machine must pass before a flip is
//! committed: its unit is active, the kubelet's `/healthz` answers 200 a
//! number of times in a row before a deadline, and, when GPUs are bound, the
//! GPU device nodes are visible inside the machine.
//!
//! Given a [`Systemd`] (unit state, commands in the machine), the config's
//! [`Health`] settings and the devices expected in the machine. The kubelet
//! probe is a plain HTTP/1.1 GET over `std::net::TcpStream` with connect and
//! read timeouts: no HTTP crate, because the activator stays small and the
//! endpoint is a loopback plain-text `ok`. It does not start or stop
//! anything and does not decide what a failure means (that is `activate`).

use std::io::{Read as _, Write as _};
use std::net::{TcpStream, ToSocketAddrs as _};
use std::time::{Duration, Instant};

use crate::config::Health;
use crate::slot::Slot;
use crate::systemd::Systemd;

/// Each probe's connect and read timeout (also capped by the deadline).
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// At most this much of a health response is read.
const MAX_RESPONSE: u64 = 64 * 1024;

/// The checks of the gate, by the name the report and the bad-image record
/// use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// `systemctl start` of the machine's unit failed.
    UnitStart,
    /// The unit is not active.
    UnitActive,
    /// The kubelet health endpoint did not answer 200 often enough.
    KubeletHealthz,
    /// A bound GPU device is not visible inside the machine.
    GpuDevices,
}

impl Check {
    pub fn name(self) -> &'static str {
        match self {
            Check::UnitStart => "unit-start",
            Check::UnitActive => "unit-active",
            Check::KubeletHealthz => "kubelet-healthz",
            Check::GpuDevices => "gpu-devices",
        }
    }
}

/// Why a machine did not pass the gate.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("machine {machine}: health check {} failed: {detail}", check.name())]
pub struct Failure {
    pub machine: String,
    pub check: Check,
    pub detail: String,
}

/// The gate's settings, from the config's `health` section.
#[derive(Clone, Debug)]
pub struct Gate {
    pub url: String,
    pub successes: u32,
    pub timeout: Duration,
    pub interval: Duration,
}

impl From<&Health> for Gate {
    fn from(h: &Health) -> Gate {
        Gate {
            url: h.kubelet_healthz_url.clone(),
            successes: h.successes,
            timeout: Duration::from_secs(h.timeout_secs),
            interval: Duration::from_millis(h.interval_ms),
        }
    }
}

/// Waits until `slot`'s machine is healthy or the gate's deadline passes.
///
/// The unit must be active and the kubelet healthy `successes` times in a
/// row; a failed probe or an inactive unit resets the count. Then each of
/// `gpu_devices` must be a character device inside the machine.
pub fn wait_healthy(
    systemd: &dyn Systemd,
    slot: Slot,
    gate: &Gate,
    gpu_devices: &[String],
) -> Result<(), Failure> {
    let machine = slot.machine().to_string();
    let fail = |check, detail: String| Failure {
        machine: machine.clone(),
        check,
        detail,
    };
    let deadline = Instant::now() + gate.timeout;
    let mut streak = 0u32;
    let mut last = (Check::UnitActive, "not checked yet".to_string());
    loop {
        match systemd.is_active(&slot.unit()) {
            Ok(true) => match probe(&gate.url, remaining(deadline)) {
                Ok(()) => streak += 1,
                Err(e) => {
                    streak = 0;
                    last = (Check::KubeletHealthz, e);
                }
            },
            Ok(false) => {
                streak = 0;
                last = (Check::UnitActive, format!("{} is not active", slot.unit()));
            }
            Err(e) => {
                streak = 0;
                last = (Check::UnitActive, e.to_string());
            }
        }
        if streak >= gate.successes {
            break;
        }
        if Instant::now() + gate.interval >= deadline {
            let (check, why) = last;
            return Err(fail(
                check,
                format!(
                    "{why} ({streak} of {} consecutive healthy probes of {} within {:?})",
                    gate.successes, gate.url, gate.timeout
                ),
            ));
        }
        std::thread::sleep(gate.interval);
    }
    for dev in gpu_devices {
        match systemd.run_in_machine(&machine, &["test", "-c", dev]) {
            Ok(true) => {}
            Ok(false) => {
                return Err(fail(
                    Check::GpuDevices,
                    format!("{dev} is not a character device inside the machine"),
                ))
            }
            Err(e) => return Err(fail(Check::GpuDevices, format!("{dev}: {e}"))),
        }
    }
    Ok(())
}

fn remaining(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .clamp(Duration::from_millis(100), PROBE_TIMEOUT)
}

/// One GET of `url` (`http://host[:port]/path`); `Ok` on status 200.
pub fn probe(url: &str, timeout: Duration) -> Result<(), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url}: only http:// health URLs are supported"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let addr_text = if authority.contains(':') && !authority.ends_with(']') {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    let addr = addr_text
        .to_socket_addrs()
        .map_err(|e| format!("{url}: {e}"))?
        .next()
        .ok_or_else(|| format!("{url}: {authority} resolves to no address"))?;
    let mut stream =
        TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("{url}: connect: {e}"))?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| format!("{url}: {e}"))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("{url}: send: {e}"))?;
    let mut response = Vec::new();
    // A read timeout after the status line arrived still lets us judge it.
    let read = (&mut stream).take(MAX_RESPONSE).read_to_end(&mut response);
    let text = String::from_utf8_lossy(&response);
    let status_line = text.lines().next().unwrap_or("");
    let status = status_line.split_whitespace().nth(1);
    match status {
        Some("200") => Ok(()),
        Some(code) => Err(format!("{url}: status {code}")),
        None => Err(match read {
            Err(e) => format!("{url}: receive: {e}"),
            Ok(_) => format!("{url}: no HTTP status line in the response"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// Serves `answers` (one per connection) on a free loopback port.
    fn server(answers: Vec<&'static str>) -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/healthz", l.local_addr().unwrap());
        std::thread::spawn(move || {
            for a in answers {
                let (mut s, _) = l.accept().unwrap();
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf);
                let _ = s.write_all(a.as_bytes());
            }
        });
        url
    }

    #[test]
    fn probe_reads_the_status() {
        let url = server(vec![
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
            "HTTP/1.1 500 Internal Server Error\r\n\r\n",
            "garbage",
        ]);
        let t = Duration::from_secs(2);
        assert_eq!(probe(&url, t), Ok(()));
        assert!(probe(&url, t).unwrap_err().contains("status 500"));
        assert!(probe(&url, t).unwrap_err().contains("no HTTP status line"));
        assert!(probe("https://x/healthz", t)
            .unwrap_err()
            .contains("only http://"));
    }

    /// A machine whose unit is always active; `in_machine` answers every
    /// command run inside it.
    struct Up {
        in_machine: bool,
    }

    impl Systemd for Up {
        fn daemon_reload(&self) -> Result<(), crate::systemd::SystemdError> {
            Ok(())
        }
        fn start(&self, _: &str) -> Result<(), crate::systemd::SystemdError> {
            Ok(())
        }
        fn stop(&self, _: &str) -> Result<(), crate::systemd::SystemdError> {
            Ok(())
        }
        fn is_active(&self, _: &str) -> Result<bool, crate::systemd::SystemdError> {
            Ok(true)
        }
        fn enable(&self, _: &str) -> Result<(), crate::systemd::SystemdError> {
            Ok(())
        }
        fn disable(&self, _: &str) -> Result<(), crate::systemd::SystemdError> {
            Ok(())
        }
        fn machine_registered(&self, _: &str) -> Result<bool, crate::systemd::SystemdError> {
            Ok(true)
        }
        fn run_in_machine(
            &self,
            _: &str,
            _: &[&str],
        ) -> Result<bool, crate::systemd::SystemdError> {
            Ok(self.in_machine)
        }
    }

    const OK: &str = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";

    fn gate(url: String, successes: u32) -> Gate {
        Gate {
            url,
            successes,
            timeout: Duration::from_secs(60),
            interval: Duration::from_millis(1),
        }
    }

    #[test]
    fn a_failed_probe_resets_the_streak() {
        let url = server(vec![OK, OK, "HTTP/1.1 500 Oops\r\n\r\n", OK, OK, OK]);
        let g = gate(url, 3);
        wait_healthy(&Up { in_machine: true }, Slot::Kube1, &g, &[]).unwrap();
        // The gate needed all six answers: had the 500 not reset the count
        // it would have passed at the fourth, leaving two for this probe.
        assert!(probe(&g.url, Duration::from_millis(500)).is_err());
    }

    #[test]
    fn gpu_devices_are_checked_inside_the_machine_after_the_kubelet() {
        let g = gate(server(vec![OK]), 1);
        let devices = ["/dev/nvidia0".to_string()];
        let e = wait_healthy(&Up { in_machine: false }, Slot::Kube2, &g, &devices).unwrap_err();
        assert_eq!(e.check, Check::GpuDevices);
        assert_eq!(e.machine, "kube2");
        assert!(e.detail.contains("/dev/nvidia0"), "{}", e.detail);
        let g = gate(server(vec![OK]), 1);
        wait_healthy(&Up { in_machine: true }, Slot::Kube2, &g, &devices).unwrap();
    }

    #[test]
    fn probe_of_a_closed_port_names_the_url() {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("http://127.0.0.1:{port}/healthz");
        let e = probe(&url, Duration::from_secs(1)).unwrap_err();
        assert!(e.contains(&url) && e.contains("connect"), "{e}");
    }
}
