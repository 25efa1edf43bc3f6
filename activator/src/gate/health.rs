//! The health gate a freshly started node machine must pass before a flip is
//! committed: its unit is active, the kubelet's `/healthz` answers 200 a
//! number of times in a row, the node's container runtime reports
//! `RuntimeReady` and `NetworkReady` over CRI (what a Ready node needs: the
//! kubelet's `/healthz` is its own liveness and stays ok without them), all
//! before one deadline; and, when GPUs are bound, the GPU device nodes are
//! visible inside the machine.
//!
//! Given a [`Systemd`] (unit state, commands in the machine), the config's
//! [`Health`] settings and the devices expected in the machine. The kubelet
//! probe is a plain HTTP/1.1 GET over `std::net::TcpStream` with connect and
//! read timeouts: no HTTP crate, because the activator stays small and the
//! endpoint is a loopback plain-text `ok`. A loopback answer counts only
//! when the listening socket belongs to a process of the new machine
//! (`/proc/net/tcp` → socket inode → `/proc/<pid>/fd` → the pid's cgroup in
//! systemd's hierarchy (the v2 `0::` line, else v1 `name=systemd`) exactly
//! at or below `/machine.slice/systemd-nspawn@<machine>.service`): an old
//! kubelet, or any user's process in a cgroup merely named like the unit
//! (`systemd-run --user --unit=systemd-nspawn@kube2` makes one under
//! `user.slice`), answering on the port does not pass. Where `/proc` cannot
//! tell (a test root without it) the answer's ownership is not checked and
//! [`Gate::ownership_note`] says so; on the host's own `/` that fails the
//! gate. The runtime is asked the way an operator asks it: the image's
//! `crictl info --quiet` run inside the machine (`systemd-run -M`, through
//! [`Systemd`]), its JSON read for `status.conditions` (cri-tools'
//! `cmd/crictl/info.go` prints the CRI `Status` answer there); production
//! images ship crictl, and nothing of the image runs on the host. It does
//! not start or stop anything and does not decide what a failure means (that
//! is `activate`).

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs as _};
use std::time::{Duration, Instant};

use std::path::{Path, PathBuf};

use crate::config::{literal_loopback, loopback_addr, Health};
pub use crate::gate::listener::{listener, Listener};
use crate::paths::Root;
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
    /// The endpoint answered 200, but the socket that answered is not held
    /// by a process of the machine (another user's listener, an old
    /// kubelet): says nothing about the image, which is never marked bad
    /// for it.
    KubeletListener,
    /// The runtime could not be asked (`crictl info` failed or printed
    /// something else than crictl's JSON).
    CriStatus,
    /// CRI `Status`: `RuntimeReady` is not true.
    CriRuntimeReady,
    /// CRI `Status`: `NetworkReady` is not true (no pod network: no CNI
    /// config, or its plugins missing).
    CriNetworkReady,
    /// A bound GPU device is not visible inside the machine.
    GpuDevices,
    /// The NVIDIA image's `kubeslot-nvidia-setup.service` failed inside a
    /// machine with GPUs bound (libraries not linked, no CDI spec).
    GpuSetup,
    /// The API server does not see the Node `Ready` with a heartbeat newer
    /// than the flip (the cluster gate, issue 38).
    NodeReady,
    /// A DaemonSet named in `cluster.gate.daemonsets` has no Ready pod on
    /// the node.
    DaemonSetReady,
    /// The Node's `status.nodeInfo.kubeletVersion` is not the kubelet
    /// version the image carries (its `dev.kubeslot.version.kubelet`).
    KubeletVersion,
}

impl Check {
    pub fn name(self) -> &'static str {
        match self {
            Check::UnitStart => "unit-start",
            Check::UnitActive => "unit-active",
            Check::KubeletHealthz => "kubelet-healthz",
            Check::KubeletListener => "kubelet-listener",
            Check::CriStatus => "cri-status",
            Check::CriRuntimeReady => "cri-runtime-ready",
            Check::CriNetworkReady => "cri-network-ready",
            Check::GpuDevices => "gpu-devices",
            Check::GpuSetup => "gpu-setup",
            Check::NodeReady => "node-ready",
            Check::DaemonSetReady => "daemonset-ready",
            Check::KubeletVersion => "kubelet-version",
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
    /// The host's `/proc` (under the root): a loopback answer must come
    /// from a socket a process of the machine listens on. `None`: not
    /// checked.
    pub proc_dir: Option<PathBuf>,
    /// A loopback answer whose listener `proc_dir` cannot name fails the
    /// gate (the host's `/`), instead of passing unchecked (a test root).
    pub require_owner: bool,
    /// Whether the machine's container runtime is asked over CRI. Only a
    /// live host runs machines to ask ([`Gate::on_host`]).
    pub runtime: bool,
}

impl From<&Health> for Gate {
    fn from(h: &Health) -> Gate {
        Gate {
            url: h.kubelet_healthz_url.clone(),
            successes: h.successes,
            timeout: Duration::from_secs(h.timeout_secs),
            interval: Duration::from_millis(h.interval_ms),
            proc_dir: None,
            require_owner: false,
            runtime: false,
        }
    }
}

impl Gate {
    /// The gate for a machine on the host at `root`: answers are tied to
    /// the machine through `<root>/proc` (a root without `/proc/net/tcp`,
    /// a test root, cannot tie them and is not checked), and the machine's
    /// runtime is asked over CRI where the root is a live host (its
    /// `/proc/1` exists; a test root runs no machine).
    pub fn on_host(h: &Health, root: &Root) -> Gate {
        Gate {
            proc_dir: Some(root.dir().join("proc")),
            require_owner: root.dir() == Path::new("/"),
            runtime: root.dir().join("proc/1").is_dir(),
            ..Gate::from(h)
        }
    }

    /// What the report says when a passed gate could not tie the kubelet's
    /// loopback answer to the machine (a root whose `/proc` cannot tell).
    pub fn ownership_note(&self) -> Option<String> {
        let port = loopback_addr(&self.url)?.port();
        let tables = match &self.proc_dir {
            None => {
                return Some(format!(
                    "ownership of the answer on port {port} not checked (no /proc given)"
                ))
            }
            Some(p) => p.join("net/tcp"),
        };
        (!self.require_owner && std::fs::metadata(&tables).is_err()).then(|| {
            format!(
                "ownership of the answer on port {port} not checked: {} cannot be read",
                tables.display()
            )
        })
    }
}

/// The CRI endpoint of the image's kubelet and containerd (the image's
/// `containerRuntimeEndpoint`; `kubelet.config` may not change it).
const CRI_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";

/// What the gate runs inside the machine to ask the runtime: crictl's
/// non-verbose `info` (CRI `Status`), JSON on stdout.
const CRICTL_INFO: &[&str] = &[
    "crictl",
    "--runtime-endpoint",
    CRI_ENDPOINT,
    "info",
    "--quiet",
];

/// The CRI conditions a Ready node needs, with the check each one fails.
const CRI_CONDITIONS: &[(&str, Check)] = &[
    ("RuntimeReady", Check::CriRuntimeReady),
    ("NetworkReady", Check::CriNetworkReady),
];

/// Reads `crictl info`'s JSON: `Ok` when both conditions are true, else
/// the first that is not, with its reason and message.
fn runtime_conditions(info: &str) -> Result<(), (Check, String)> {
    let v: serde_json::Value = serde_json::from_str(info).map_err(|e| {
        (
            Check::CriStatus,
            format!("crictl info printed no JSON ({e}): {:?}", clip(info)),
        )
    })?;
    let conditions = v["status"]["conditions"].as_array().ok_or_else(|| {
        (
            Check::CriStatus,
            format!("crictl info has no status.conditions: {:?}", clip(info)),
        )
    })?;
    for (kind, check) in CRI_CONDITIONS {
        let c = conditions.iter().find(|c| c["type"] == *kind);
        match c {
            Some(c) if c["status"] == true => {}
            Some(c) => {
                return Err((
                    *check,
                    format!(
                        "{kind} is false (reason {:?}, message {:?})",
                        c["reason"].as_str().unwrap_or(""),
                        c["message"].as_str().unwrap_or("")
                    ),
                ))
            }
            None => return Err((*check, format!("the runtime reports no {kind} condition"))),
        }
    }
    Ok(())
}

fn clip(s: &str) -> String {
    s.trim().chars().take(200).collect()
}

/// Asks `machine`'s runtime (`crictl info` inside it).
fn runtime_ready(systemd: &dyn Systemd, machine: &str) -> Result<(), (Check, String)> {
    let out = systemd
        .output_in_machine(machine, CRICTL_INFO)
        .map_err(|e| (Check::CriStatus, e.to_string()))?;
    if !out.success {
        return Err((
            Check::CriStatus,
            format!(
                "'{}' in the machine failed: {}",
                CRICTL_INFO.join(" "),
                clip(&out.stderr)
            ),
        ));
    }
    runtime_conditions(&out.stdout)
}

/// Waits until `slot`'s machine is healthy or the gate's deadline passes.
///
/// The unit must be active and the kubelet healthy `successes` times in a
/// row (a failed probe or an inactive unit resets the count), and then
/// (with [`Gate::runtime`]) the runtime's `RuntimeReady` and `NetworkReady`
/// true, asked again on every probe until they are. Then each of
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
                    // a failed GPU setup keeps containerd, and with it the
                    // kubelet, down for good: said at once, naming the unit
                    gpu_setup_ok(systemd, &machine, gpu_devices)?;
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
            // Who answers is asked once the streak is complete (a /proc walk
            // per probe would be the gate's hot path); an answer from outside
            // the machine starts the streak over.
            match answered_by_machine(gate, &machine, remaining(deadline)) {
                Ok(()) if !gate.runtime => break,
                // the kubelet stays healthy meanwhile: the streak holds and
                // the runtime is asked again after the next probe
                Ok(()) => match runtime_ready(systemd, &machine) {
                    Ok(()) => break,
                    // a failed GPU setup keeps containerd down for good:
                    // said at once, naming the unit
                    Err(why) => {
                        gpu_setup_ok(systemd, &machine, gpu_devices)?;
                        last = why;
                    }
                },
                Err(why) => {
                    streak = 0;
                    last = why;
                }
            }
        }
        if Instant::now() + gate.interval >= deadline {
            let (check, why) = last;
            return Err(fail(
                check,
                format!(
                    "{why} ({} of {} consecutive healthy probes of {} within {:?})",
                    streak.min(gate.successes),
                    gate.successes,
                    gate.url,
                    gate.timeout
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
    gpu_setup_ok(systemd, &machine, gpu_devices)
}

/// With GPUs bound, the NVIDIA image's setup must not have failed (an
/// image without the unit: `is-failed` says no).
fn gpu_setup_ok(
    systemd: &dyn Systemd,
    machine: &str,
    gpu_devices: &[String],
) -> Result<(), Failure> {
    if gpu_devices.is_empty() {
        return Ok(());
    }
    let fail = |detail: String| Failure {
        machine: machine.to_string(),
        check: Check::GpuSetup,
        detail,
    };
    let failed = systemd
        .run_in_machine(
            machine,
            &["systemctl", "is-failed", "--quiet", GPU_SETUP_UNIT],
        )
        .map_err(|e| fail(format!("{GPU_SETUP_UNIT}: {e}")))?;
    if failed {
        return Err(fail(format!(
            "{GPU_SETUP_UNIT} failed inside the machine, so containerd (which requires it) did not start with the GPUs: `journalctl -M {machine} -u {GPU_SETUP_UNIT}` says why"
        )));
    }
    Ok(())
}

/// The NVIDIA image's setup unit (links the driver's libraries, writes the
/// CDI spec); containerd requires it where GPUs are bound.
pub const GPU_SETUP_UNIT: &str = "kubeslot-nvidia-setup.service";

/// After a streak of healthy answers from a loopback URL: one more probe,
/// and while its connection is open, the socket that answered it (its
/// 4-tuple) must be held by a process of `machine`, not by something else
/// on the host (an old kubelet, another user's listener on the port).
fn answered_by_machine(
    gate: &Gate,
    machine: &str,
    timeout: Duration,
) -> Result<(), (Check, String)> {
    let Some(proc_dir) = &gate.proc_dir else {
        return Ok(());
    };
    if loopback_addr(&gate.url).is_none() {
        return if gate.require_owner {
            Err((
                Check::KubeletListener,
                literal_loopback(&gate.url).unwrap_err(),
            ))
        } else {
            Ok(())
        };
    }
    let mut seen = Listener::Unknown;
    probe_with(&gate.url, timeout, |server, client| {
        seen = listener(proc_dir, server, Some(client), machine);
    })
    .map_err(|e| (Check::KubeletHealthz, e))?;
    let url = &gate.url;
    let why = match seen {
        Listener::InMachine => return Ok(()),
        Listener::Unknown if !gate.require_owner => return Ok(()),
        Listener::Unknown => format!(
            "{url} answered, but who answered cannot be read from {} (net/tcp, the processes' fds and cgroups): ownership not checked, so the answer does not count",
            proc_dir.display()
        ),
        Listener::Outside { pid, cgroup } => format!(
            "{url} answered, but the socket that answered is held by pid {pid} outside machine {machine} (cgroup {cgroup})"
        ),
        Listener::Nobody => format!(
            "{url} answered, but no process of this host holds the socket that answered"
        ),
    };
    Err((Check::KubeletListener, why))
}

fn remaining(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .clamp(Duration::from_millis(100), PROBE_TIMEOUT)
}

/// One GET of `url` (`http://host[:port]/path`); `Ok` on status 200.
pub fn probe(url: &str, timeout: Duration) -> Result<(), String> {
    probe_with(url, timeout, |_, _| {})
}

/// One GET of `url`; on status 200, `answered` is called with the server's
/// and the client's address of the connection while it is still open (the
/// request does not ask the server to close it, and only the status line
/// is read), so the server's socket can still be found.
fn probe_with(
    url: &str,
    timeout: Duration,
    answered: impl FnOnce(SocketAddr, SocketAddr),
) -> Result<(), String> {
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
    let request = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("{url}: send: {e}"))?;
    // Up to the end of the status line: a read timeout after it arrived
    // still lets us judge it.
    let mut response = Vec::new();
    let mut buf = [0u8; 1024];
    let read = loop {
        match stream.read(&mut buf) {
            Ok(0) => break Ok(()),
            Ok(n) => {
                response.extend_from_slice(&buf[..n]);
                if response.contains(&b'\n') || response.len() as u64 >= MAX_RESPONSE {
                    break Ok(());
                }
            }
            Err(e) => break Err(e),
        }
    };
    let text = String::from_utf8_lossy(&response);
    let status_line = text.lines().next().unwrap_or("");
    let status = status_line.split_whitespace().nth(1);
    match status {
        Some("200") => {
            if let (Ok(server), Ok(client)) = (stream.peer_addr(), stream.local_addr()) {
                answered(server, client);
            }
            Ok(())
        }
        Some(code) => Err(format!("{url}: status {code}")),
        None => Err(match read {
            Err(e) => format!("{url}: receive: {e}"),
            Ok(()) => format!("{url}: no HTTP status line in the response"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    use crate::testing::FakeSystemd;

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

    /// The shared fake with both machines running; `in_machine` answers
    /// every command run inside them.
    fn up(in_machine: bool) -> FakeSystemd {
        let mut fake = FakeSystemd::new(&crate::paths::Root::new("/nonexistent"));
        for slot in Slot::ALL {
            fake.start(&slot.unit()).unwrap();
        }
        fake.gpu_visible = in_machine;
        fake
    }

    const OK: &str = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";

    fn gate(url: String, successes: u32) -> Gate {
        Gate {
            url,
            successes,
            timeout: Duration::from_secs(60),
            interval: Duration::from_millis(1),
            proc_dir: None,
            require_owner: false,
            runtime: false,
        }
    }

    #[test]
    fn a_healthy_answer_from_outside_the_machine_does_not_pass_the_gate() {
        // A real listener in this test process (not in any machine),
        // checked through the real /proc.
        let url = server(vec![OK; 8]);
        let mut g = gate(url.clone(), 2);
        g.timeout = Duration::from_millis(400);
        g.interval = Duration::from_millis(150);
        g.proc_dir = Some(PathBuf::from("/proc"));
        let e = wait_healthy(&up(true), Slot::Kube2, &g, &[]).unwrap_err();
        assert_eq!(e.check, Check::KubeletListener);
        assert!(
            e.detail.contains("outside machine kube2")
                && e.detail.contains(&format!("pid {}", std::process::id())),
            "{e}"
        );
    }

    #[test]
    fn an_answer_whose_owner_cannot_be_read_fails_on_the_hosts_root() {
        // (each pass of the streak probes once more, checking who answers)
        let url = server(vec![OK; 64]);
        let empty = tempfile::tempdir().unwrap();
        let mut g = gate(url, 1);
        g.timeout = Duration::from_millis(300);
        g.interval = Duration::from_millis(50);
        g.proc_dir = Some(empty.path().to_path_buf());
        // a test root: passes, and says the answer was not checked
        wait_healthy(&up(true), Slot::Kube2, &g, &[]).unwrap();
        assert!(
            g.ownership_note()
                .is_some_and(|n| n.contains("not checked")),
            "{:?}",
            g.ownership_note()
        );
        // the host's /: the same answer does not count
        g.require_owner = true;
        let e = wait_healthy(&up(true), Slot::Kube2, &g, &[]).unwrap_err();
        assert!(e.detail.contains("ownership not checked"), "{e}");
        assert_eq!(g.ownership_note(), None);
        assert!(Gate::on_host(&Health::default(), &Root::host()).require_owner);
    }

    #[test]
    fn only_loopback_urls_are_tied_to_a_process() {
        assert_eq!(
            loopback_addr("http://127.0.0.1:10248/healthz"),
            Some(SocketAddr::from(([127, 0, 0, 1], 10248)))
        );
        assert_eq!(
            loopback_addr("http://[::1]:10248/healthz"),
            Some("[::1]:10248".parse().unwrap())
        );
        assert_eq!(
            loopback_addr("http://127.0.0.1/healthz"),
            Some(SocketAddr::from(([127, 0, 0, 1], 80)))
        );
        // names, short forms, wildcards and other hosts are tied to nothing
        // (and the config refuses them)
        for url in [
            "http://localhost/healthz",
            "http://127.1:10248/healthz",
            "http://0.0.0.0:10248/healthz",
            "http://[::]:10248/healthz",
            "http://10.0.0.5:10248/healthz",
            "http://2130706433:10248/healthz",
        ] {
            assert_eq!(loopback_addr(url), None, "{url}");
            assert!(literal_loopback(url).is_err(), "{url}");
        }
    }

    #[test]
    fn a_failed_probe_resets_the_streak() {
        let url = server(vec![OK, OK, "HTTP/1.1 500 Oops\r\n\r\n", OK, OK, OK]);
        let g = gate(url, 3);
        wait_healthy(&up(true), Slot::Kube1, &g, &[]).unwrap();
        // The gate needed all six answers: had the 500 not reset the count
        // it would have passed at the fourth, leaving two for this probe.
        assert!(probe(&g.url, Duration::from_millis(500)).is_err());
    }

    #[test]
    fn gpu_devices_are_checked_inside_the_machine_after_the_kubelet() {
        let g = gate(server(vec![OK]), 1);
        let devices = ["/dev/nvidia0".to_string()];
        let e = wait_healthy(&up(false), Slot::Kube2, &g, &devices).unwrap_err();
        assert_eq!(e.check, Check::GpuDevices);
        assert_eq!(e.machine, "kube2");
        assert!(e.detail.contains("/dev/nvidia0"), "{}", e.detail);
        let g = gate(server(vec![OK]), 1);
        let fake = up(true);
        wait_healthy(&fake, Slot::Kube2, &g, &devices).unwrap();
        assert!(fake.calls().contains(
            &"run kube2 systemctl is-failed --quiet kubeslot-nvidia-setup.service".to_string()
        ));
        // the setup failed: the gate fails, naming the unit
        let g = gate(server(vec![OK]), 1);
        let mut fake = up(true);
        fake.gpu_setup_failed = true;
        let e = wait_healthy(&fake, Slot::Kube2, &g, &devices).unwrap_err();
        assert_eq!(e.check, Check::GpuSetup);
        assert!(
            e.detail.contains("kubeslot-nvidia-setup.service failed"),
            "{}",
            e.detail
        );
        // no GPU bound: not asked
        let g = gate(server(vec![OK]), 1);
        wait_healthy(&fake, Slot::Kube2, &g, &[]).unwrap();
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

    /// `crictl info --quiet` as crictl 1.36 prints it for containerd 2.1
    /// (keys sorted by Go's JSON encoder), with NetworkReady `net`.
    fn crictl_info(net: bool) -> String {
        let (reason, message) = if net {
            ("", "")
        } else {
            (
                "NetworkPluginNotReady",
                "Network plugin returns error: cni plugin not initialized",
            )
        };
        format!(
            r#"{{
  "runtimeHandlers": [{{"features": {{"recursive_read_only_mounts": true, "user_namespaces": true}}, "name": "runc"}}],
  "status": {{
    "conditions": [
      {{"message": "", "reason": "", "status": true, "type": "RuntimeReady"}},
      {{"message": "{message}", "reason": "{reason}", "status": {net}, "type": "NetworkReady"}},
      {{"message": "", "reason": "", "status": true, "type": "ContainerdHasNoDeprecationWarnings"}}
    ]
  }}
}}"#
        )
    }

    #[test]
    fn crictl_info_is_read_for_both_conditions() {
        assert_eq!(runtime_conditions(&crictl_info(true)), Ok(()));
        let (check, why) = runtime_conditions(&crictl_info(false)).unwrap_err();
        assert_eq!(check, Check::CriNetworkReady);
        assert!(
            why.contains("NetworkReady is false")
                && why.contains("NetworkPluginNotReady")
                && why.contains("cni plugin not initialized"),
            "{why}"
        );
        let no_runtime = crictl_info(true).replace(
            r#""status": true, "type": "RuntimeReady""#,
            r#""status": false, "type": "RuntimeReady""#,
        );
        assert_eq!(
            runtime_conditions(&no_runtime).unwrap_err().0,
            Check::CriRuntimeReady
        );
        let (check, why) = runtime_conditions(r#"{"status": {"conditions": []}}"#).unwrap_err();
        assert_eq!(check, Check::CriRuntimeReady);
        assert!(why.contains("no RuntimeReady condition"), "{why}");
        assert_eq!(
            runtime_conditions("FATA[0000] nope").unwrap_err().0,
            Check::CriStatus
        );
        assert_eq!(
            runtime_conditions(r#"{"config": {}}"#).unwrap_err().0,
            Check::CriStatus
        );
    }

    #[test]
    fn the_gate_waits_for_the_runtime_and_names_the_condition() {
        // the network turns ready on the third answer: the gate passes
        let mut sd = up(true);
        sd.machine_output = vec![crictl_info(false), crictl_info(false), crictl_info(true)];
        let mut g = gate(server(vec![OK; 8]), 1);
        g.runtime = true;
        wait_healthy(&sd, Slot::Kube2, &g, &[]).unwrap();
        assert_eq!(sd.outputs_read.get(), 3);

        // never ready: the deadline passes naming NetworkReady
        let mut sd = up(true);
        sd.machine_output = vec![crictl_info(false)];
        let mut g = gate(server(vec![OK; 64]), 1);
        g.runtime = true;
        g.timeout = Duration::from_millis(300);
        g.interval = Duration::from_millis(20);
        let e = wait_healthy(&sd, Slot::Kube2, &g, &[]).unwrap_err();
        assert_eq!(e.check, Check::CriNetworkReady);
        assert!(
            e.to_string()
                .contains("health check cri-network-ready failed: NetworkReady is false"),
            "{e}"
        );

        // crictl itself fails (no runtime socket): named as the status check
        let mut sd = up(true);
        sd.machine_output = vec![String::new()];
        let mut g = gate(server(vec![OK; 64]), 1);
        g.runtime = true;
        g.timeout = Duration::from_millis(200);
        g.interval = Duration::from_millis(20);
        let e = wait_healthy(&sd, Slot::Kube2, &g, &[]).unwrap_err();
        assert_eq!(e.check, Check::CriStatus);
        assert!(e.detail.contains("validate CRI v1 runtime API"), "{e}");

        // a gate that does not ask (a test root) never runs crictl
        let sd = up(true);
        wait_healthy(&sd, Slot::Kube2, &gate(server(vec![OK]), 1), &[]).unwrap();
        assert_eq!(sd.outputs_read.get(), 0);
    }

    #[test]
    fn only_a_live_root_asks_the_runtime() {
        let h = Health::default();
        assert!(Gate::on_host(&h, &Root::new("/")).runtime);
        let tmp = tempfile::tempdir().unwrap();
        assert!(!Gate::on_host(&h, &Root::new(tmp.path())).runtime);
    }
}
