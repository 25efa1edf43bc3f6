//! The cluster-wide limit: at most `slots` nodes drain or flip at once,
//! each holding one of `slots` `coordination.k8s.io/v1` Leases named
//! `<prefix>-0` .. `<prefix>-<slots-1>` in one namespace.
//!
//! The rules, all through the API server's optimistic concurrency (every
//! write carries the `resourceVersion` it read; a 409 means another node
//! got there first and this one looks at the next lease):
//!
//! * a lease nobody holds (missing, or `holderIdentity` empty) is taken;
//! * a lease whose holder stopped renewing (`renewTime` +
//!   `leaseDurationSeconds` in the past) is taken over, its
//!   `leaseTransitions` counted up;
//! * a lease this node already holds (a run killed mid-flip, run again) is
//!   kept: the same node never needs two;
//! * the holder renews while it works and releases (clears the holder,
//!   keeps the object) after commit or rollback.
//!
//! Each node starts its scan at a place given by its name, so a thousand
//! nodes do not all race for `<prefix>-0` first. Expiry compares the
//! holder's `renewTime` with this node's clock: clocks must agree to well
//! within a lease duration (docs/fleet.md).

use std::fmt;

use serde_json::{json, Value};

/// A Lease as read from the API server (the fields the limit uses).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub name: String,
    pub resource_version: String,
    pub holder: Option<String>,
    pub duration_s: i64,
    /// Microseconds since the epoch (`spec.renewTime`), 0 when unset.
    pub renew_us: i64,
    pub acquire_us: i64,
    pub transitions: i64,
}

/// What a lease call can fail with: a lost race, or anything else (named).
#[derive(Debug)]
pub enum LeaseError {
    /// 409: the object changed (update) or exists (create) since it was read.
    Conflict,
    /// A held lease was taken over by another node (this one was silent
    /// for longer than the lease's duration).
    Lost(String),
    /// Anything else: the API call and what the server said.
    Api(String),
}

impl fmt::Display for LeaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseError::Conflict => f.write_str("conflict (409): changed by another node"),
            LeaseError::Lost(e) | LeaseError::Api(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for LeaseError {}

/// The calls the limit needs, in one namespace: list, create, update.
pub trait LeaseApi {
    /// Every Lease in the namespace (one request: a waiting node's poll).
    fn list_leases(&mut self) -> Result<Vec<Lease>, LeaseError>;
    /// One lease as listed (after a conflict); `None` when it is gone.
    fn get_lease(&mut self, name: &str) -> Result<Option<Lease>, LeaseError> {
        Ok(self.list_leases()?.into_iter().find(|l| l.name == name))
    }
    /// POST; [`LeaseError::Conflict`] for 409 AlreadyExists.
    fn create_lease(&mut self, body: &Value) -> Result<Lease, LeaseError>;
    /// PUT with the body's `resourceVersion`; [`LeaseError::Conflict`] for 409.
    fn update_lease(&mut self, name: &str, body: &Value) -> Result<Lease, LeaseError>;
}

/// Formats microseconds since the epoch as a `MicroTime`
/// (`2026-12-05T16:20:00.123456Z`, the six digits the API server parses).
pub fn micro_time(us: i64) -> String {
    let secs = us.div_euclid(1_000_000);
    let mut s = kubeslot_image::time::rfc3339_seconds(u64::try_from(secs).unwrap_or(0));
    s.pop();
    format!("{s}.{:06}Z", us.rem_euclid(1_000_000))
}

/// Parses a `MicroTime` (or any RFC 3339 time) into microseconds.
pub fn parse_micro_time(text: &str) -> Option<i64> {
    let secs = kubeslot_image::time::parse_rfc3339(text)?;
    let frac = text
        .find('.')
        .map(|i| {
            let digits: String = text[i + 1..]
                .chars()
                .take_while(char::is_ascii_digit)
                .chain(std::iter::repeat('0'))
                .take(6)
                .collect();
            digits.parse::<i64>().unwrap_or(0)
        })
        .unwrap_or(0);
    Some(secs * 1_000_000 + frac)
}

/// Reads a Lease object.
pub fn lease_from(v: &Value) -> Lease {
    let spec = &v["spec"];
    let time = |k: &str| spec[k].as_str().and_then(parse_micro_time).unwrap_or(0);
    Lease {
        name: v["metadata"]["name"].as_str().unwrap_or("").to_string(),
        resource_version: v["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or("")
            .to_string(),
        holder: spec["holderIdentity"]
            .as_str()
            .filter(|h| !h.is_empty())
            .map(str::to_string),
        duration_s: spec["leaseDurationSeconds"].as_i64().unwrap_or(0),
        renew_us: time("renewTime"),
        acquire_us: time("acquireTime"),
        transitions: spec["leaseTransitions"].as_i64().unwrap_or(0),
    }
}

/// The limit as one node sees it.
#[derive(Clone, Debug)]
pub struct Limit {
    /// Lease names are `<prefix>-<i>`.
    pub prefix: String,
    /// How many leases (nodes at once); at least 1.
    pub slots: u32,
    /// This node's name: the holder identity.
    pub node: String,
    /// How long a silent holder keeps its lease.
    pub duration_s: i64,
}

/// Who holds a lease another node wants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub lease: String,
    pub holder: String,
    /// When it expires unless renewed (microseconds since the epoch).
    pub expires_us: i64,
}

/// The outcome of one attempt to take a lease.
#[derive(Debug, PartialEq, Eq)]
pub enum Acquired {
    /// This node holds the lease now.
    Got(Lease),
    /// Every lease is held by a live node.
    Full(Vec<Held>),
}

impl Limit {
    fn name(&self, i: u32) -> String {
        format!("{}-{i}", self.prefix)
    }

    /// Where this node starts its scan (FNV-1a of its name).
    fn start(&self) -> u32 {
        let mut h: u32 = 0x811c_9dc5;
        for b in self.node.bytes() {
            h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
        }
        h % self.slots.max(1)
    }

    fn body(
        &self,
        name: &str,
        rv: Option<&str>,
        acquire_us: i64,
        now_us: i64,
        transitions: i64,
    ) -> Value {
        let mut meta = json!({"name": name});
        if let Some(rv) = rv {
            meta["resourceVersion"] = json!(rv);
        }
        json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {
                "holderIdentity": self.node,
                "leaseDurationSeconds": self.duration_s,
                "acquireTime": micro_time(acquire_us),
                "renewTime": micro_time(now_us),
                "leaseTransitions": transitions,
            }
        })
    }

    /// Lists the leases (one request), then tries each that is not held by
    /// a live node once, from this node's place: takes the first free,
    /// expired or already its own; otherwise says who holds them.
    pub fn acquire(&self, api: &mut dyn LeaseApi, now_us: i64) -> Result<Acquired, LeaseError> {
        let n = self.slots.max(1);
        let mut listed: std::collections::BTreeMap<String, Lease> = api
            .list_leases()?
            .into_iter()
            .map(|l| (l.name.clone(), l))
            .collect();
        let mut held = Vec::new();
        for k in 0..n {
            let name = self.name((self.start() + k) % n);
            let Some(lease) = listed.remove(&name) else {
                match api.create_lease(&self.body(&name, None, now_us, now_us, 0)) {
                    Ok(l) => return Ok(Acquired::Got(l)),
                    Err(LeaseError::Conflict) => continue,
                    Err(e) => return Err(e),
                }
            };
            let expires_us = lease.renew_us + lease.duration_s * 1_000_000;
            let mine = lease.holder.as_deref() == Some(self.node.as_str());
            let (acquire_us, transitions) = match &lease.holder {
                Some(_) if mine => (lease.acquire_us, lease.transitions),
                Some(h) if expires_us > now_us => {
                    held.push(Held {
                        lease: name,
                        holder: h.clone(),
                        expires_us,
                    });
                    continue;
                }
                // free, or its holder went silent
                _ => (now_us, lease.transitions + 1),
            };
            let body = self.body(
                &name,
                Some(&lease.resource_version),
                acquire_us,
                now_us,
                transitions,
            );
            match api.update_lease(&name, &body) {
                Ok(l) => return Ok(Acquired::Got(l)),
                Err(LeaseError::Conflict) => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(Acquired::Full(held))
    }

    /// Renews a held lease; an error when another node took it over
    /// (this node was silent for longer than the duration).
    pub fn renew(
        &self,
        api: &mut dyn LeaseApi,
        lease: &Lease,
        now_us: i64,
    ) -> Result<Lease, LeaseError> {
        let mut current = lease.clone();
        for _ in 0..3 {
            if current.holder.as_deref() != Some(self.node.as_str()) {
                return Err(LeaseError::Lost(format!(
                    "lease {} was taken over by {} (not renewed within {} s)",
                    current.name,
                    current.holder.as_deref().unwrap_or("nobody"),
                    current.duration_s
                )));
            }
            let body = self.body(
                &current.name,
                Some(&current.resource_version),
                current.acquire_us,
                now_us,
                current.transitions,
            );
            match api.update_lease(&current.name, &body) {
                Ok(l) => return Ok(l),
                Err(LeaseError::Conflict) => {
                    current = api.get_lease(&current.name)?.ok_or_else(|| {
                        LeaseError::Api(format!("lease {} was deleted while held", lease.name))
                    })?;
                }
                Err(e) => return Err(e),
            }
        }
        Err(LeaseError::Api(format!(
            "lease {}: three conflicting writes while renewing",
            lease.name
        )))
    }

    /// Releases a held lease: clears the holder, keeps the object. A lease
    /// another node already took over is left alone.
    pub fn release(&self, api: &mut dyn LeaseApi, lease: &Lease) -> Result<(), LeaseError> {
        let mut current = lease.clone();
        for _ in 0..3 {
            if current.holder.as_deref() != Some(self.node.as_str()) {
                return Ok(());
            }
            let mut body = self.body(
                &current.name,
                Some(&current.resource_version),
                current.acquire_us,
                current.renew_us,
                current.transitions,
            );
            body["spec"]["holderIdentity"] = Value::Null;
            body["spec"]["acquireTime"] = Value::Null;
            match api.update_lease(&current.name, &body) {
                Ok(_) => return Ok(()),
                Err(LeaseError::Conflict) => match api.get_lease(&current.name)? {
                    Some(l) => current = l,
                    None => return Ok(()),
                },
                Err(e) => return Err(e),
            }
        }
        Err(LeaseError::Api(format!(
            "lease {}: three conflicting writes while releasing",
            lease.name
        )))
    }
}

/// How many leases a `max_unavailable` of `count` or `percent` gives for
/// `nodes` matching nodes: a percentage rounds down (as a Deployment's
/// `maxUnavailable` does), never below 1.
pub fn slots_for(max: &MaxUnavailable, nodes: usize) -> u32 {
    let n = match *max {
        MaxUnavailable::Count(c) => c,
        MaxUnavailable::Percent(p) => {
            u32::try_from(nodes.saturating_mul(p as usize) / 100).unwrap_or(u32::MAX)
        }
    };
    n.max(1)
}

/// `max_unavailable`: a count of nodes (`5`) or a percentage of the nodes
/// the selector matches (`"10%"`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MaxUnavailable {
    Count(u32),
    Percent(u32),
}

impl std::str::FromStr for MaxUnavailable {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!("max_unavailable {s:?}: expected a count of nodes (5) or a percentage (\"10%\", 1 to 100)")
        };
        if let Some(p) = s.strip_suffix('%') {
            let p: u32 = p.parse().map_err(|_| bad())?;
            if p == 0 || p > 100 {
                return Err(bad());
            }
            return Ok(MaxUnavailable::Percent(p));
        }
        match s.parse::<u32>() {
            Ok(c) if c > 0 => Ok(MaxUnavailable::Count(c)),
            _ => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micro_times_round_trip_with_six_digits() {
        let us = 1_796_000_000_123_456;
        let t = micro_time(us);
        assert_eq!(t, "2026-11-30T00:53:20.123456Z");
        assert_eq!(parse_micro_time(&t), Some(us));
        assert_eq!(
            parse_micro_time("2026-11-30T00:53:20Z"),
            Some(1_796_000_000_000_000)
        );
        assert_eq!(
            parse_micro_time("2026-11-30T00:53:20.5Z"),
            Some(1_796_000_000_500_000)
        );
    }

    #[test]
    fn max_unavailable_is_a_count_or_a_percentage_rounded_down_never_zero() {
        let p = |s: &str| s.parse::<MaxUnavailable>();
        assert_eq!(p("5"), Ok(MaxUnavailable::Count(5)));
        assert_eq!(p("10%"), Ok(MaxUnavailable::Percent(10)));
        for bad in ["0", "0%", "101%", "-1", "ten", ""] {
            let e = p(bad).unwrap_err();
            assert!(
                e.starts_with(&format!("max_unavailable {bad:?}: expected")),
                "{e}"
            );
        }
        assert_eq!(slots_for(&MaxUnavailable::Percent(10), 1000), 100);
        assert_eq!(slots_for(&MaxUnavailable::Percent(10), 19), 1);
        assert_eq!(slots_for(&MaxUnavailable::Percent(30), 3), 1);
        assert_eq!(slots_for(&MaxUnavailable::Count(7), 0), 7);
    }
}
