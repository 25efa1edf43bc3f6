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
use std::net::{TcpStream, ToSocketAddrs as _};
use std::time::{Duration, Instant};

use std::path::{Path, PathBuf};

use crate::config::Health;
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
    /// The API server does not see the Node `Ready` with a heartbeat newer
    /// than the flip (the cluster gate, issue 38).
    NodeReady,
    /// A DaemonSet named in `cluster.gate.daemonsets` has no Ready pod on
    /// the node.
    DaemonSetReady,
}

impl Check {
    pub fn name(self) -> &'static str {
        match self {
            Check::UnitStart => "unit-start",
            Check::UnitActive => "unit-active",
            Check::KubeletHealthz => "kubelet-healthz",
            Check::CriStatus => "cri-status",
            Check::CriRuntimeReady => "cri-runtime-ready",
            Check::CriNetworkReady => "cri-network-ready",
            Check::GpuDevices => "gpu-devices",
            Check::NodeReady => "node-ready",
            Check::DaemonSetReady => "daemonset-ready",
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
        let port = loopback_port(&self.url)?;
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

/// Who listens on a loopback TCP port, as `/proc` tells it.
#[derive(Debug, PartialEq, Eq)]
pub enum Listener {
    /// Every process holding the listening socket is in the machine.
    InMachine,
    /// A process outside the machine holds it: pid and its cgroup.
    Outside { pid: u32, cgroup: String },
    /// No listening socket for the port, or none held by a visible process.
    Nobody,
    /// `/proc/net/tcp` is not there (a test root): nothing to check.
    Unknown,
}

/// Whether the TCP listener on `port` belongs to `machine`: its socket
/// inode from `proc/net/tcp{,6}`, the processes holding it from
/// `proc/<pid>/fd`, and each one's cgroup from `proc/<pid>/cgroup`, which
/// for a machine's processes lies under `systemd-nspawn@<machine>.service`.
pub fn listener(proc_dir: &Path, port: u16, machine: &str) -> Listener {
    let mut inodes = std::collections::BTreeSet::new();
    let mut any_table = false;
    for table in ["net/tcp", "net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(proc_dir.join(table)) else {
            continue;
        };
        any_table = true;
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            if f.len() < 10 || f[3] != "0A" {
                continue;
            }
            let local_port = f[1]
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            if local_port == Some(port) {
                if let Ok(inode) = f[9].parse::<u64>() {
                    if inode != 0 {
                        inodes.insert(inode);
                    }
                }
            }
        }
    }
    if !any_table {
        return Listener::Unknown;
    }
    if inodes.is_empty() {
        return Listener::Nobody;
    }
    let mut owners = 0;
    let Ok(procs) = std::fs::read_dir(proc_dir) else {
        return Listener::Unknown;
    };
    for p in procs.flatten() {
        let name = p.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|t| {
                t.to_str()
                    .and_then(|t| t.strip_prefix("socket:["))
                    .and_then(|t| t.strip_suffix(']'))
                    .and_then(|i| i.parse::<u64>().ok())
                    .is_some_and(|i| inodes.contains(&i))
            })
        });
        if !holds {
            continue;
        }
        owners += 1;
        let cgroup = std::fs::read_to_string(p.path().join("cgroup")).unwrap_or_default();
        if !in_machine(&cgroup, machine) {
            return Listener::Outside {
                pid,
                cgroup: cgroup.trim().to_string(),
            };
        }
    }
    if owners == 0 {
        Listener::Nobody
    } else {
        Listener::InMachine
    }
}

/// The path of a process's cgroup in systemd's hierarchy, from
/// `/proc/<pid>/cgroup`: the cgroup v2 line (`0::<path>`), else the v1
/// `name=systemd` one. Controller hierarchies are not systemd's naming.
fn systemd_cgroup(text: &str) -> Option<&str> {
    let line = |want: &str| {
        text.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
            (controllers == want).then_some(path)
        })
    };
    line("").or_else(|| line("name=systemd"))
}

/// Whether a process whose `/proc/<pid>/cgroup` reads `text` runs in
/// `machine`: its systemd cgroup is the machine's unit under
/// `machine.slice` or below it, exactly, from the top of the hierarchy
/// (a cgroup that only ends in the unit's name, under a user's slice, is
/// not the machine).
fn in_machine(text: &str, machine: &str) -> bool {
    let unit = format!("/machine.slice/systemd-nspawn@{machine}.service");
    systemd_cgroup(text).is_some_and(|p| {
        p.strip_prefix(unit.as_str())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    })
}

/// The port of a loopback `http://` URL (`None` for another host: nothing
/// on this host to tie it to).
fn loopback_port(url: &str) -> Option<u16> {
    let rest = url.strip_prefix("http://")?;
    let authority = rest.split('/').next()?;
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !authority.ends_with(']') => (h, p.parse().ok()?),
        _ => (authority, 80),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    loopback.then_some(port)
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
            match answered_by_machine(gate, &machine) {
                Ok(()) if !gate.runtime => break,
                // the kubelet stays healthy meanwhile: the streak holds and
                // the runtime is asked again after the next probe
                Ok(()) => match runtime_ready(systemd, &machine) {
                    Ok(()) => break,
                    Err(why) => last = why,
                },
                Err(e) => {
                    streak = 0;
                    last = (Check::KubeletHealthz, e);
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
    Ok(())
}

/// After a healthy answer from a loopback URL: the listener must be a
/// process of `machine`, not something else on the host (an old kubelet,
/// anything that bound the port).
fn answered_by_machine(gate: &Gate, machine: &str) -> Result<(), String> {
    let (Some(proc_dir), Some(port)) = (&gate.proc_dir, loopback_port(&gate.url)) else {
        return Ok(());
    };
    match listener(proc_dir, port, machine) {
        Listener::InMachine => Ok(()),
        Listener::Unknown if !gate.require_owner => Ok(()),
        Listener::Unknown => Err(format!(
            "{} answered, but who listens on port {port} cannot be read from {} (net/tcp, the processes' fds and cgroups): ownership not checked, so the answer does not count",
            gate.url,
            proc_dir.display()
        )),
        Listener::Outside { pid, cgroup } => Err(format!(
            "{} answered, but port {port} is held by pid {pid} outside machine {machine} (cgroup {cgroup})",
            gate.url
        )),
        Listener::Nobody => Err(format!(
            "{} answered, but no process of this host listens on port {port}",
            gate.url
        )),
    }
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

    /// A fake `/proc`: `net/tcp` with one listener on `port` (socket
    /// `inode`), and pid 100 holding it in `cgroup`.
    fn fake_proc(port: u16, inode: u64, cgroup: &str) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        std::fs::create_dir_all(p.join("net")).unwrap();
        std::fs::write(
            p.join("net/tcp"),
            format!(
                "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
                 \x20  0: 0100007F:{port:04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 {inode} 1 0 100 0 0 10 0\n\
                 \x20  1: 0100007F:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 777 1 0 100 0 0 10 0\n"
            ),
        )
        .unwrap();
        std::fs::create_dir_all(p.join("100/fd")).unwrap();
        std::os::unix::fs::symlink(format!("socket:[{inode}]"), p.join("100/fd/3")).unwrap();
        std::os::unix::fs::symlink("/dev/null", p.join("100/fd/0")).unwrap();
        std::fs::write(p.join("100/cgroup"), format!("0::{cgroup}\n")).unwrap();
        std::fs::create_dir_all(p.join("self")).unwrap();
        d
    }

    #[test]
    fn the_listener_must_be_a_process_of_the_new_machine() {
        let kubelet =
            "/machine.slice/systemd-nspawn@kube2.service/payload/system.slice/kubelet.service";
        let proc = fake_proc(10248, 4242, kubelet);
        assert_eq!(listener(proc.path(), 10248, "kube2"), Listener::InMachine);
        // the same process seen from the other machine's gate
        assert!(matches!(
            listener(proc.path(), 10248, "kube1"),
            Listener::Outside { pid: 100, .. }
        ));
        // a host process (say an old kubelet left running on the host)
        let host = fake_proc(10248, 4242, "/system.slice/kubelet.service");
        assert!(matches!(
            listener(host.path(), 10248, "kube2"),
            Listener::Outside { pid: 100, .. }
        ));
        // a user's cgroup named like the machine's unit (systemd-run
        // --user --unit=systemd-nspawn@kube2.service makes one)
        let user = fake_proc(
            10248,
            4242,
            "/user.slice/user-1000.slice/user@1000.service/app.slice/systemd-nspawn@kube2.service",
        );
        assert!(matches!(
            listener(user.path(), 10248, "kube2"),
            Listener::Outside { pid: 100, .. }
        ));
        // nobody listens on the port; and a test root without /proc
        assert_eq!(listener(proc.path(), 10250, "kube2"), Listener::Nobody);
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(listener(empty.path(), 10248, "kube2"), Listener::Unknown);
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
        assert_eq!(e.check, Check::KubeletHealthz);
        assert!(
            e.detail.contains("outside machine kube2")
                && e.detail.contains(&format!("pid {}", std::process::id())),
            "{e}"
        );
    }

    #[test]
    fn only_the_machines_unit_in_systemds_hierarchy_is_the_machine() {
        let v2 =
            "0::/machine.slice/systemd-nspawn@kube2.service/payload/system.slice/kubelet.service\n";
        assert!(in_machine(v2, "kube2"));
        assert!(!in_machine(v2, "kube1"));
        assert!(in_machine(
            "0::/machine.slice/systemd-nspawn@kube2.service\n",
            "kube2"
        ));
        assert!(!in_machine(
            "0::/machine.slice/systemd-nspawn@kube2.service2/x\n",
            "kube2"
        ));
        // v1 (hybrid hosts have both; a pure v1 host only name=systemd)
        let v1 = "4:memory:/user.slice\n1:name=systemd:/machine.slice/systemd-nspawn@kube2.service/payload\n";
        assert!(in_machine(v1, "kube2"));
        // the name anywhere else, in any hierarchy, is not the machine
        for fake in [
            "0::/user.slice/user-1000.slice/user@1000.service/app.slice/systemd-nspawn@kube2.service\n",
            "0::/x/machine.slice/systemd-nspawn@kube2.service\n",
            "4:memory:/machine.slice/systemd-nspawn@kube2.service\n",
            "",
        ] {
            assert!(!in_machine(fake, "kube2"), "{fake:?}");
        }
    }

    #[test]
    fn an_answer_whose_owner_cannot_be_read_fails_on_the_hosts_root() {
        let url = server(vec![OK; 8]);
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
        assert_eq!(loopback_port("http://127.0.0.1:10248/healthz"), Some(10248));
        assert_eq!(loopback_port("http://localhost/healthz"), Some(80));
        assert_eq!(loopback_port("http://[::1]:10248/healthz"), Some(10248));
        assert_eq!(loopback_port("http://10.0.0.5:10248/healthz"), None);
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
        wait_healthy(&up(true), Slot::Kube2, &g, &devices).unwrap();
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
