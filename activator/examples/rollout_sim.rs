//! The fleet simulation (`ci/bench/rollout.sh`): N simulated nodes roll
//! one release through the real rollout code (`kubeslot_activator::rollout`:
//! admit, the lease renewer, release) and the activator's real API client,
//! against the fixture API server in this process (HTTPS, the node
//! authorizer on, `deploy/rollout.yaml`'s permissions). A node's drain,
//! flip and gate are a sleep of FLIP_MS.
//!
//!   rollout_sim NODES LIMIT FLIP_MS [--lease-s S] [--poll-ms P] [--kill K]
//!               [--outage-ms O] [--fault-every N]
//!
//! `--outage-ms O`: the nodes reach the API server through a TCP relay;
//! once half of them are done, the relay drops every connection and
//! refuses new ones for O ms (an API server restarting).
//! `--fault-every N`: the fixture answers every Nth request `429` (with
//! `Retry-After: 1`), `503` or `500` in turn, before applying it (an
//! overloaded API server); the nodes retry.
//! `--kill K`: once a quarter of the nodes are done, the next K nodes to
//! take a lease die holding it (no renewal, no release); the report says
//! how long until other nodes held those leases. Prints one `key: value`
//! line per figure; exits 1 when more than LIMIT nodes were ever in flight
//! or a live node never finished.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kubeslot_activator::cluster::{Client, Kubeconfig};
use kubeslot_activator::rollout::api::ClusterApi;
use kubeslot_activator::rollout::lease::MaxUnavailable;
use kubeslot_activator::rollout::{admit, now_us, Admission, Renewer, Settings};
use serde::Deserialize as _;
use serde_json::{json, Value};

const NS: &str = "kubeslot-system";
const DIGEST: &str = "sha256:5151515151515151515151515151515151515151515151515151515151515151";

/// The fixture's grants for deploy/rollout.yaml's bindings.
fn grants(manifest: &str) -> Vec<Value> {
    let docs: Vec<Value> = serde_yaml::Deserializer::from_str(manifest)
        .map(|d| serde_json::to_value(serde_yaml::Value::deserialize(d).unwrap()).unwrap())
        .collect();
    let mut out = Vec::new();
    for d in &docs {
        let (ns, role_kind) = match d["kind"].as_str() {
            Some("RoleBinding") => (d["metadata"]["namespace"].as_str(), "Role"),
            Some("ClusterRoleBinding") => (None, "ClusterRole"),
            _ => continue,
        };
        let role = docs
            .iter()
            .find(|r| r["kind"] == role_kind && r["metadata"]["name"] == d["roleRef"]["name"])
            .expect("the bound role is in the manifest");
        let rules: Vec<Value> = role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| json!({"verbs": r["verbs"], "api_groups": r["apiGroups"], "resources": r["resources"],
                "resource_names": r.get("resourceNames").cloned().unwrap_or(json!([]))}))
            .collect();
        let subjects: Vec<Value> = d["subjects"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| json!({"kind": s["kind"], "name": s["name"]}))
            .collect();
        out.push(json!({"subjects": subjects, "rules": rules, "namespaces": ns.map(|n| vec![n]).unwrap_or_default()}));
    }
    out
}

struct Args {
    nodes: usize,
    limit: u32,
    flip: Duration,
    lease_s: i64,
    poll: Duration,
    kill: usize,
    outage: Duration,
    fault_every: u64,
}

fn args() -> Args {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: rollout_sim NODES LIMIT FLIP_MS [--lease-s S] [--poll-ms P] [--kill K] [--outage-ms O] [--fault-every N]";
    let num = |s: &str| -> u64 {
        s.parse()
            .unwrap_or_else(|_| panic!("{usage}: {s:?} is no number"))
    };
    assert!(a.len() >= 3, "{usage}");
    let mut r = Args {
        nodes: num(&a[0]) as usize,
        limit: num(&a[1]) as u32,
        flip: Duration::from_millis(num(&a[2])),
        lease_s: 5,
        poll: Duration::from_millis(500),
        kill: 0,
        outage: Duration::ZERO,
        fault_every: 0,
    };
    let mut i = 3;
    while i + 1 < a.len() + 1 && i < a.len() {
        let v = a
            .get(i + 1)
            .map(|v| num(v))
            .unwrap_or_else(|| panic!("{usage}"));
        match a[i].as_str() {
            "--lease-s" => r.lease_s = v as i64,
            "--poll-ms" => r.poll = Duration::from_millis(v),
            "--kill" => r.kill = v as usize,
            "--outage-ms" => r.outage = Duration::from_millis(v),
            "--fault-every" => r.fault_every = v,
            other => panic!("{usage}: unknown {other}"),
        }
        i += 2;
    }
    r
}

#[derive(Default)]
struct Shared {
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    done: AtomicUsize,
    errors: AtomicU64,
    to_kill: AtomicUsize,
    killing: AtomicBool,
    /// The killed leases: (name, when killed, µs).
    killed: Mutex<Vec<(String, i64)>>,
    /// The longest time from a kill to another node holding that lease.
    recovery_us: AtomicI64,
}

/// A TCP relay to `to`; while `down` is set it cuts every connection and
/// refuses (closes) new ones.
fn relay(
    to: std::net::SocketAddr,
    down: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<std::net::TcpStream>>>,
) -> std::net::SocketAddr {
    use std::net::{Shutdown, TcpListener, TcpStream};
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(c) = c else { continue };
            if down.load(Ordering::SeqCst) {
                let _ = c.shutdown(Shutdown::Both);
                continue;
            }
            let Ok(s) = TcpStream::connect(to) else {
                continue;
            };
            open.lock().unwrap().push(c.try_clone().unwrap());
            for (mut r, mut w) in [(c.try_clone().unwrap(), s.try_clone().unwrap()), (s, c)] {
                let down = down.clone();
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut r, &mut w);
                    let _ = w.shutdown(Shutdown::Both);
                    let _ = r.shutdown(Shutdown::Both);
                    drop(down);
                });
            }
        }
    });
    addr
}

fn main() {
    let a = args();
    let dir = tempfile::tempdir().unwrap();
    let manifest = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/rollout.yaml"
    ))
    .unwrap();
    let config = json!({
        "client_certs": [{"name": "rollout", "user": "kubeslot:rollout:sim", "groups": ["kubeslot:rollout"]}],
        "grants": grants(&manifest),
        "objects": [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}],
    });
    let config = fake_apiserver::config::Config::parse(&config.to_string(), "sim").unwrap();
    let p = fake_apiserver::prepare("127.0.0.1:0", &dir.path().join("pki"), config).unwrap();
    let (srv, url) = fake_apiserver::spawn(p);
    let names: Vec<String> = (0..a.nodes).map(|i| format!("sim-{i:05}")).collect();
    for n in &names {
        fake_apiserver::create_as_admin(
            &srv,
            &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}}),
        )
        .unwrap();
    }
    let down = Arc::new(AtomicBool::new(false));
    let fixture_addr: std::net::SocketAddr = url.trim_start_matches("https://").parse().unwrap();
    let open = Arc::new(Mutex::new(Vec::new()));
    let through = relay(fixture_addr, down.clone(), open.clone());
    let mut kc = Kubeconfig::load(&dir.path().join("pki/rollout.kubeconfig"), &|p: &Path| {
        p.to_path_buf()
    })
    .unwrap();
    kc.server = format!("https://{through}");
    let api = ClusterApi::new(Client::new(&kc, Duration::from_secs(30)).unwrap(), NS);
    let mut settings = Settings::new(NS, MaxUnavailable::Count(a.limit));
    settings.lease_duration_s = a.lease_s;
    let shared = Arc::new(Shared::default());
    srv.faults.every.store(a.fault_every, Ordering::SeqCst);
    let start = Instant::now();
    if !a.outage.is_zero() {
        let (sh, half, outage) = (shared.clone(), a.nodes / 2, a.outage);
        std::thread::spawn(move || {
            while sh.done.load(Ordering::SeqCst) < half {
                std::thread::sleep(Duration::from_millis(10));
            }
            down.store(true, Ordering::SeqCst);
            for c in open.lock().unwrap().drain(..) {
                let _ = c.shutdown(std::net::Shutdown::Both);
            }
            std::thread::sleep(outage);
            down.store(false, Ordering::SeqCst);
        });
    }
    let threads: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let (n, api, s, sh) = (n.clone(), api.clone(), settings.clone(), shared.clone());
            let (flip, poll, kill, nodes) = (a.flip, a.poll, a.kill, a.nodes);
            std::thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn(move || node(i as u64, &n, api, &s, &sh, flip, poll, kill, nodes))
                .unwrap()
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let makespan = start.elapsed();
    let live = a.nodes - a.kill;
    let done = shared.done.load(Ordering::SeqCst);
    let ideal = a.flip.as_secs_f64() * (a.nodes as f64 / f64::from(a.limit)).ceil();
    let max = shared.max_in_flight.load(Ordering::SeqCst);
    println!(
        "nodes: {} limit: {} flip: {} ms lease: {} s poll: {} ms killed: {}",
        a.nodes,
        a.limit,
        a.flip.as_millis(),
        a.lease_s,
        a.poll.as_millis(),
        a.kill
    );
    println!("max in flight: {max}");
    println!("finished: {done} of {live} live nodes");
    println!(
        "makespan: {:.2} s, ideal {ideal:.2} s (nodes / limit x flip), ratio {:.3}",
        makespan.as_secs_f64(),
        makespan.as_secs_f64() / ideal
    );
    println!(
        "API requests per node: {:.1}",
        api.requests.load(Ordering::SeqCst) as f64 / a.nodes as f64
    );
    println!(
        "API errors seen (retried): {}",
        shared.errors.load(Ordering::SeqCst)
    );
    if a.fault_every > 0 {
        println!(
            "API answers injected (429/503/500, every {}th request): {}",
            a.fault_every,
            srv.faults.answered.load(Ordering::SeqCst)
        );
    }
    if !a.outage.is_zero() {
        println!(
            "API server restart: every connection cut, new ones refused for {} ms once half were done",
            a.outage.as_millis()
        );
    }
    if a.kill > 0 {
        println!(
            "recovery after killed holders: {:.2} s (lease duration {} s)",
            shared.recovery_us.load(Ordering::SeqCst) as f64 / 1e6,
            a.lease_s
        );
    }
    if max > a.limit as usize || done != live {
        eprintln!(
            "rollout_sim: FAILED: max in flight {max} (limit {}), finished {done} of {live}",
            a.limit
        );
        std::process::exit(1);
    }
}

#[allow(clippy::too_many_arguments)]
fn node(
    seed: u64,
    name: &str,
    mut api: ClusterApi,
    s: &Settings,
    sh: &Shared,
    flip: Duration,
    poll: Duration,
    kill: usize,
    nodes: usize,
) {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut jitter = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        poll / 2 + Duration::from_micros(x % (poll.as_micros() as u64 + 1))
    };
    loop {
        let lease = match admit(&mut api, s, name, DIGEST, now_us()) {
            Ok(Admission::Start(l)) => l,
            Ok(Admission::Wait(_)) => {
                std::thread::sleep(jitter());
                continue;
            }
            Err(_) => {
                sh.errors.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(jitter());
                continue;
            }
        };
        let now = now_us();
        {
            // the first holder after a killed one: the lease recovered
            let mut killed = sh.killed.lock().unwrap();
            if let Some(i) = killed
                .iter()
                .position(|(l, at)| *l == lease.name && *at < now)
            {
                let (_, at) = killed.remove(i);
                sh.recovery_us.fetch_max(now - at, Ordering::SeqCst);
            }
        }
        if kill > 0
            && sh.done.load(Ordering::SeqCst) >= nodes / 4
            && !sh.killing.swap(true, Ordering::SeqCst)
        {
            sh.to_kill.store(kill, Ordering::SeqCst);
        }
        if sh
            .to_kill
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |k| k.checked_sub(1))
            .is_ok()
        {
            // dies holding its lease: never renews, never releases
            sh.killed
                .lock()
                .unwrap()
                .push((lease.name.clone(), lease.renew_us));
            return;
        }
        let f = sh.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        sh.max_in_flight.fetch_max(f, Ordering::SeqCst);
        let limit = s.limit(name, 0);
        let renewer = Renewer::start(Box::new(api.clone()), limit.clone(), lease);
        std::thread::sleep(flip);
        // in flight while it drains, flips and gates (the sleep); the
        // release after is bookkeeping
        sh.in_flight.fetch_sub(1, Ordering::SeqCst);
        match renewer.stop() {
            Ok(l) => {
                while limit.release(&mut api, &l).is_err() {
                    sh.errors.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(jitter());
                }
            }
            Err(e) => eprintln!("{name}: {e}"),
        }
        sh.done.fetch_add(1, Ordering::SeqCst);
        return;
    }
}
