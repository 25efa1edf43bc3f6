//! The cluster-wide limit and the halt for a following host
//! (`rollout.limit`, issue 39): before the drain, a run that takes another
//! image checks the pause switch and the rollbacks of the digest, then
//! takes one of `max_unavailable` Leases; it renews the lease while it
//! drains, flips and gates, and releases it after commit or rollback.
//! Until it may start, the run ends "waiting" (exit 0, nothing touched)
//! and the report (`status`) says why.
//!
//! Given the config and the node's name; speaks to the API server with
//! the rollout identity's kubeconfig (`rollout.limit.kubeconfig`), through
//! [`crate::rollout`]. Without `rollout.limit` it does nothing.

use std::time::Duration;

use crate::cluster::{Client, Kubeconfig};
use crate::config::FleetLimit;
use crate::rollout::api::ClusterApi;
use crate::rollout::lease::{Lease, Limit, MaxUnavailable};
use crate::rollout::{self, Admission, Renewer, Settings};

/// A lease this run holds, renewed on a thread until [`Held::release`].
pub(super) struct Held {
    renewer: Renewer,
    limit: Limit,
    api: ClusterApi,
}

/// What [`start`] decided.
pub(super) enum Start {
    /// Go on: the lease is held (dropped by [`Held::release`]).
    Go(Box<Held>),
    /// Do not start now: why (the report's `rollout.waiting`).
    Wait(String),
}

/// The library's settings from the config.
pub fn settings(l: &FleetLimit) -> Result<Settings, String> {
    let max: MaxUnavailable = l.max_unavailable.text().parse()?;
    let mut s = Settings::new(&l.namespace, max);
    s.lease_prefix = l.lease_prefix.clone();
    s.node_selector = l.node_selector.clone();
    s.lease_duration_s = i64::from(l.lease_duration_secs);
    s.halt_after = l.halt_after;
    s.pause_switch = l.pause_switch.clone();
    Ok(s)
}

/// The rollout identity's API client (its kubeconfig's paths are the
/// host's own).
pub fn api(l: &FleetLimit, timeout: Duration) -> Result<ClusterApi, String> {
    let kc = Kubeconfig::load(&l.kubeconfig, &|p| p.to_path_buf())
        .map_err(|e| format!("rollout.limit.kubeconfig: {e:#}"))?;
    let client = Client::new(&kc, timeout).map_err(|e| format!("{e:#}"))?;
    Ok(ClusterApi::new(client, &l.namespace))
}

/// One try to start `node`'s update to `digest`: the pause switch, the
/// rollbacks, then a lease. An API server out of reach is a wait too (the
/// next timer run tries again; nothing was touched).
pub(super) fn start(l: &FleetLimit, timeout: Duration, node: &str, digest: &str) -> Start {
    let tried = (|| {
        let s = settings(l)?;
        let mut api = api(l, timeout)?;
        match rollout::admit(&mut api, &s, node, digest, rollout::now_us())? {
            Admission::Wait(w) => Ok(Start::Wait(w.to_string())),
            Admission::Start(lease) => {
                let limit = s.limit(node, 0);
                // the slots only name the lease taken: renewing it needs none
                let renewer = Renewer::start(Box::new(api.clone()), limit.clone(), lease);
                Ok(Start::Go(Box::new(Held {
                    renewer,
                    limit,
                    api,
                })))
            }
        }
    })();
    tried.unwrap_or_else(|e: String| {
        Start::Wait(format!("cannot take a rollout lease (rollout.limit): {e}"))
    })
}

/// What [`start`] would decide, read only (for `plan`): the pause switch,
/// the rollbacks and whether a lease is free now; nothing is written.
pub fn preview(l: &FleetLimit, timeout: Duration, node: &str, digest: &str) -> Option<String> {
    let tried = (|| {
        let s = settings(l)?;
        let mut api = api(l, timeout)?;
        rollout::would_wait(&mut api, &s, node, digest, rollout::now_us())
    })();
    tried.unwrap_or_else(|e| {
        Some(format!(
            "cannot read the rollout leases (rollout.limit): {e}"
        ))
    })
}

impl Held {
    /// Stops renewing and releases the lease; what went wrong, if anything
    /// (the lease then expires by itself).
    pub(super) fn release(self) -> Option<String> {
        let Held {
            renewer,
            limit,
            mut api,
        } = self;
        let lease: Lease = match renewer.stop() {
            Ok(l) => l,
            Err(e) => return Some(e),
        };
        limit
            .release(&mut api, &lease)
            .err()
            .map(|e| format!("releasing lease {}: {e} (it expires by itself)", lease.name))
    }
}
