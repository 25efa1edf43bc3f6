//! A fleet that rolls itself (issue 39): what lets a node start an update
//! the cluster's other nodes also want to start.
//!
//! * [`lease`] — the cluster-wide limit: at most `max_unavailable` nodes
//!   drain or flip at once, each holding one of that many Leases;
//! * [`halt`] — the halt: no new start once `halt_after` nodes rolled the
//!   same digest back, or while the pause switch is set.
//!
//! It speaks to the API server through the small traits here
//! ([`lease::LeaseApi`], [`halt::FleetApi`]); what a node may do there is
//! `deploy/rollout.yaml` (docs/fleet.md).

pub mod api;
pub mod desired;
pub mod halt;
pub mod lease;

use std::fmt;
use std::sync::mpsc;
use std::time::Duration;

use halt::{FleetApi, Halted};
use lease::{Acquired, Held, Lease, LeaseApi, LeaseError, Limit, MaxUnavailable};

/// The fleet settings a node's start depends on.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Where the leases and the pause switch live.
    pub namespace: String,
    /// Lease names are `<lease_prefix>-<i>`.
    pub lease_prefix: String,
    pub max_unavailable: MaxUnavailable,
    /// Which nodes a percentage counts, and whose rollbacks halt.
    pub node_selector: String,
    pub lease_duration_s: i64,
    /// Rollbacks of one digest that halt new starts (0: never).
    pub halt_after: usize,
    /// The pause switch: a ConfigMap's name in `namespace`.
    pub pause_switch: String,
}

impl Settings {
    /// The defaults for `namespace` (`kubeslot-system` in deploy/).
    pub fn new(namespace: &str, max_unavailable: MaxUnavailable) -> Settings {
        Settings {
            namespace: namespace.to_string(),
            lease_prefix: "kubeslot-rollout".into(),
            max_unavailable,
            node_selector: String::new(),
            lease_duration_s: 60,
            halt_after: 0,
            pause_switch: "kubeslot-pause".into(),
        }
    }
}

/// Why a node does not start now (what `status` prints).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Waiting {
    Halted(Halted),
    /// Every lease is held.
    Full {
        slots: u32,
        held: Vec<Held>,
    },
}

impl fmt::Display for Waiting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Waiting::Halted(h) => h.fmt(f),
            Waiting::Full { slots, held } => {
                write!(
                    f,
                    "waiting for a rollout lease: all {slots} held (max_unavailable)"
                )?;
                for h in held.iter().take(5) {
                    write!(
                        f,
                        "; {} by {} until {}",
                        h.lease,
                        h.holder,
                        lease::micro_time(h.expires_us)
                    )?;
                }
                if held.len() > 5 {
                    write!(f, "; and {} more", held.len() - 5)?;
                }
                Ok(())
            }
        }
    }
}

/// The outcome of one try to start.
#[derive(Debug)]
pub enum Admission {
    /// This node holds a lease: drain and flip, renewing it, then release.
    Start(Lease),
    Wait(Waiting),
}

/// One try: the pause switch, the rollbacks of `digest`, then a lease.
pub fn admit<A: LeaseApi + FleetApi>(
    api: &mut A,
    s: &Settings,
    node: &str,
    digest: &str,
    now_us: i64,
) -> Result<Admission, String> {
    let ns = &s.namespace;
    if let Some(h) = halt::paused(api, &s.pause_switch)
        .map_err(|e| format!("reading the pause switch {ns}/{}: {e}", s.pause_switch))?
    {
        return Ok(Admission::Wait(Waiting::Halted(h)));
    }
    let percent = matches!(s.max_unavailable, MaxUnavailable::Percent(_));
    let nodes = if percent || s.halt_after > 0 {
        api.list_nodes(&s.node_selector)
            .map_err(|e| format!("listing nodes (selector {:?}): {e}", s.node_selector))?
    } else {
        Vec::new()
    };
    if let Some(h) = halt::by_rollbacks(&nodes, digest, s.halt_after) {
        return Ok(Admission::Wait(Waiting::Halted(h)));
    }
    let limit = s.limit(node, nodes.len());
    match limit
        .acquire(api, now_us)
        .map_err(|e| format!("taking a lease in {ns}: {e}"))?
    {
        Acquired::Got(l) => Ok(Admission::Start(l)),
        Acquired::Full(held) => Ok(Admission::Wait(Waiting::Full {
            slots: limit.slots,
            held,
        })),
    }
}

/// [`admit`] read only (for `plan`): why `node` would wait now, `None`
/// when a lease is free (or already its own); writes nothing.
pub fn would_wait<A: LeaseApi + FleetApi>(
    api: &mut A,
    s: &Settings,
    node: &str,
    digest: &str,
    now_us: i64,
) -> Result<Option<String>, String> {
    if let Some(h) =
        halt::paused(api, &s.pause_switch).map_err(|e| format!("reading the pause switch: {e}"))?
    {
        return Ok(Some(h.to_string()));
    }
    let percent = matches!(s.max_unavailable, MaxUnavailable::Percent(_));
    let nodes = if percent || s.halt_after > 0 {
        api.list_nodes(&s.node_selector)?
    } else {
        Vec::new()
    };
    if let Some(h) = halt::by_rollbacks(&nodes, digest, s.halt_after) {
        return Ok(Some(h.to_string()));
    }
    let limit = s.limit(node, nodes.len());
    let names: Vec<String> = (0..limit.slots)
        .map(|i| format!("{}-{i}", s.lease_prefix))
        .collect();
    let mut held = Vec::new();
    for l in api.list_leases().map_err(|e| e.to_string())? {
        let expires_us = l.renew_us + l.duration_s * 1_000_000;
        match &l.holder {
            Some(h) if h == node => return Ok(None),
            Some(h) if names.contains(&l.name) && expires_us > now_us => held.push(Held {
                lease: l.name.clone(),
                holder: h.clone(),
                expires_us,
            }),
            _ => {}
        }
    }
    Ok((held.len() >= names.len()).then(|| {
        Waiting::Full {
            slots: limit.slots,
            held,
        }
        .to_string()
    }))
}

impl Settings {
    /// The limit for `node` when `matching` nodes match the selector.
    pub fn limit(&self, node: &str, matching: usize) -> Limit {
        Limit {
            prefix: self.lease_prefix.clone(),
            slots: lease::slots_for(&self.max_unavailable, matching),
            node: node.to_string(),
            duration_s: self.lease_duration_s,
        }
    }
}

/// Microseconds since the epoch by this host's clock.
pub fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Renews a held lease on a thread of its own every third of its duration
/// while the node drains, flips and gates; [`Renewer::stop`] returns the
/// lease as last written (to release it) or why it was lost.
pub struct Renewer {
    stop: mpsc::Sender<()>,
    thread: std::thread::JoinHandle<Result<Lease, String>>,
}

impl Renewer {
    pub fn start(mut api: Box<dyn LeaseApi + Send>, limit: Limit, lease: Lease) -> Renewer {
        let (stop, stopped) = mpsc::channel::<()>();
        let every =
            Duration::from_millis(u64::try_from(lease.duration_s.max(1)).unwrap_or(1) * 1000 / 3);
        let thread = std::thread::spawn(move || {
            let mut lease = lease;
            let mut last_error = None;
            while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                match limit.renew(api.as_mut(), &lease, now_us()) {
                    Ok(l) => {
                        lease = l;
                        last_error = None;
                    }
                    // taken over: working on is no longer covered
                    Err(LeaseError::Lost(e)) => return Err(e),
                    // the API server away for a moment: try again next round
                    Err(e) => last_error = Some(e.to_string()),
                }
            }
            match last_error {
                Some(e) if lease.renew_us + lease.duration_s * 1_000_000 < now_us() => {
                    Err(format!(
                        "lease {} expired while held: the last renewal failed: {e}",
                        lease.name
                    ))
                }
                _ => Ok(lease),
            }
        });
        Renewer { stop, thread }
    }

    /// Stops renewing; the lease as last renewed.
    pub fn stop(self) -> Result<Lease, String> {
        let _ = self.stop.send(());
        self.thread
            .join()
            .unwrap_or_else(|_| Err("the lease renewal thread panicked".into()))
    }
}
