//! Who answered the health gate's probe, as `/proc` tells it: the socket
//! that answered a connection (its 4-tuple in `/proc/net/tcp{,6}`, else the
//! listener the kernel hands such a connection to), the processes holding
//! it (`/proc/<pid>/fd`) and whether each runs in the machine (its cgroup
//! in systemd's hierarchy, `/proc/<pid>/cgroup`). Reads `/proc` under the
//! given directory and nothing else.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;

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

/// One line of `/proc/net/tcp{,6}`: local and remote address, state,
/// socket inode.
struct TcpEntry {
    local: SocketAddr,
    remote: SocketAddr,
    listening: bool,
    inode: u64,
}

/// An address as `/proc/net/tcp{,6}` prints it (`0100007F:2838`: each
/// 32-bit word of the address in the kernel's byte order, the port in
/// hex), a v4-mapped IPv6 address as the IPv4 one.
fn proc_addr(text: &str) -> Option<SocketAddr> {
    let (addr, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let mut bytes = Vec::with_capacity(16);
    for i in (0..addr.len()).step_by(8) {
        let word = u32::from_str_radix(addr.get(i..i + 8)?, 16).ok()?;
        bytes.extend_from_slice(&word.to_ne_bytes());
    }
    let ip = match bytes.len() {
        4 => IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?),
        16 => IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?),
        _ => return None,
    };
    Some(SocketAddr::new(plain(ip), port))
}

/// `::ffff:a.b.c.d` as `a.b.c.d` (how a v6 socket sees a v4 peer).
fn plain(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn tcp_entries(proc_dir: &Path) -> Option<Vec<TcpEntry>> {
    let mut entries = Vec::new();
    let mut any_table = false;
    for table in ["net/tcp", "net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(proc_dir.join(table)) else {
            continue;
        };
        any_table = true;
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            if f.len() < 10 {
                continue;
            }
            let (Some(local), Some(remote), Ok(inode)) =
                (proc_addr(f[1]), proc_addr(f[2]), f[9].parse::<u64>())
            else {
                continue;
            };
            entries.push(TcpEntry {
                local,
                remote,
                listening: f[3] == "0A",
                inode,
            });
        }
    }
    any_table.then_some(entries)
}

/// The sockets that can have answered a connection to `server` from
/// `client`: the connection's own socket on the server's side while its
/// holder still has it open (its 4-tuple); else the listener the kernel
/// hands such a connection to, one bound to exactly `server`'s address,
/// or, when there is none, a wildcard one on its port. A listener on
/// another address of the port (`127.0.0.2`) never answered it.
fn answering_sockets(
    entries: &[TcpEntry],
    server: SocketAddr,
    client: Option<SocketAddr>,
) -> std::collections::BTreeSet<u64> {
    let server = SocketAddr::new(plain(server.ip()), server.port());
    if let Some(client) = client.map(|c| SocketAddr::new(plain(c.ip()), c.port())) {
        if let Some(e) = entries
            .iter()
            .find(|e| e.local == server && e.remote == client && e.inode != 0)
        {
            return [e.inode].into();
        }
    }
    let listeners = || {
        entries
            .iter()
            .filter(|e| e.listening && e.inode != 0 && e.local.port() == server.port())
    };
    let exact: std::collections::BTreeSet<u64> = listeners()
        .filter(|e| e.local.ip() == server.ip())
        .map(|e| e.inode)
        .collect();
    if !exact.is_empty() {
        return exact;
    }
    listeners()
        .filter(|e| e.local.ip().is_unspecified() && (e.local.is_ipv6() || server.is_ipv4()))
        .map(|e| e.inode)
        .collect()
}

/// Whether the socket that answered a connection to `server` (from
/// `client`, when known) belongs to `machine`: the socket from
/// `proc/net/tcp{,6}` ([`answering_sockets`]), the processes holding it
/// from `proc/<pid>/fd`, and each one's cgroup from `proc/<pid>/cgroup`,
/// which for a machine's processes lies under
/// `systemd-nspawn@<machine>.service`.
pub fn listener(
    proc_dir: &Path,
    server: SocketAddr,
    client: Option<SocketAddr>,
    machine: &str,
) -> Listener {
    match holders(proc_dir, server, client, machine) {
        // the answering process closed the connection between the read of
        // `net/tcp` and the scan of the fds (an HTTP/1.0 server closes
        // right after its answer): ask about the listener that accepted it
        Listener::Nobody if client.is_some() => holders(proc_dir, server, None, machine),
        seen => seen,
    }
}

fn holders(
    proc_dir: &Path,
    server: SocketAddr,
    client: Option<SocketAddr>,
    machine: &str,
) -> Listener {
    let Some(entries) = tcp_entries(proc_dir) else {
        return Listener::Unknown;
    };
    let inodes = answering_sockets(&entries, server, client);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn lo(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
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
        assert_eq!(
            listener(proc.path(), lo(10248), None, "kube2"),
            Listener::InMachine
        );
        // the same process seen from the other machine's gate
        assert!(matches!(
            listener(proc.path(), lo(10248), None, "kube1"),
            Listener::Outside { pid: 100, .. }
        ));
        // a host process (say an old kubelet left running on the host)
        let host = fake_proc(10248, 4242, "/system.slice/kubelet.service");
        assert!(matches!(
            listener(host.path(), lo(10248), None, "kube2"),
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
            listener(user.path(), lo(10248), None, "kube2"),
            Listener::Outside { pid: 100, .. }
        ));
        // nobody listens on the port; and a test root without /proc
        assert_eq!(
            listener(proc.path(), lo(10250), None, "kube2"),
            Listener::Nobody
        );
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(
            listener(empty.path(), lo(10248), None, "kube2"),
            Listener::Unknown
        );
    }

    /// Issue 40 item 4: a listener on another address of the port
    /// (`127.0.0.2`) never answered a probe of `127.0.0.1`; the connection's
    /// own socket, while its holder has it open, decides over listeners.
    #[test]
    fn only_the_socket_that_answered_counts() {
        let kubelet = "/machine.slice/systemd-nspawn@kube2.service/payload";
        let proc = fake_proc(10248, 4242, kubelet);
        let p = proc.path();
        // nobody's listener on 127.0.0.2:10248 (pid 200), and the accepted
        // connection 127.0.0.1:10248 <- 127.0.0.1:40000 held by pid 300
        let mut tcp = std::fs::read_to_string(p.join("net/tcp")).unwrap();
        tcp.push_str(
            "   2: 0200007F:2808 00000000:0000 0A 00000000:00000000 00:00000000 00000000 65534        0 5555 1 0 100 0 0 10 0\n\
             \x20  3: 0100007F:2808 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 6666 1 0 100 0 0 10 0\n",
        );
        std::fs::write(p.join("net/tcp"), tcp).unwrap();
        for (pid, inode, cgroup) in [
            (200, 5555, "/user.slice/user-65534.slice"),
            (300, 6666, "/system.slice/old-kubelet.service"),
        ] {
            std::fs::create_dir_all(p.join(format!("{pid}/fd"))).unwrap();
            std::os::unix::fs::symlink(format!("socket:[{inode}]"), p.join(format!("{pid}/fd/4")))
                .unwrap();
            std::fs::write(p.join(format!("{pid}/cgroup")), format!("0::{cgroup}\n")).unwrap();
        }
        assert_eq!(listener(p, lo(10248), None, "kube2"), Listener::InMachine);
        // another client's connection: the listener that accepts it
        assert_eq!(
            listener(p, lo(10248), Some(lo(40001)), "kube2"),
            Listener::InMachine
        );
        // the connection itself is held outside: that is who answered
        assert!(matches!(
            listener(p, lo(10248), Some(lo(40000)), "kube2"),
            Listener::Outside { pid: 300, .. }
        ));
        // a probe of 127.0.0.2 reaches nobody's listener
        assert!(matches!(
            listener(p, SocketAddr::from(([127, 0, 0, 2], 10248)), None, "kube2"),
            Listener::Outside { pid: 200, .. }
        ));
    }

    #[test]
    fn proc_addresses_are_read_in_the_kernels_byte_order() {
        assert_eq!(proc_addr("0100007F:2838"), Some(lo(10296)));
        assert_eq!(
            proc_addr("00000000000000000000000001000000:2838"),
            Some("[::1]:10296".parse().unwrap())
        );
        // a v4 peer of a v6 socket is the v4 address
        assert_eq!(
            proc_addr("0000000000000000FFFF00000100007F:2838"),
            Some(lo(10296))
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
}
