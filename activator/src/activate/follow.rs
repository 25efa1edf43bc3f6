//! The gates a following host (`source.follow`) puts before an update: the
//! release statement (signed, unexpired, for this digest), the node's wave
//! and the maintenance windows. Decided once the image is resolved and
//! verified and the plan is a flip to another image; a re-render of the
//! running image, a boot and a rollback never come here, so a host
//! switched off for a month still comes up and still rolls back.
//!
//! Given the root (for the clock file), the config, the resolved image and
//! the node name; writes only the clock file
//! (`/var/lib/kubeslot/clock`: the latest time this host has seen, from its
//! clock or a statement's `issued`, so a clock set backwards cannot make an
//! expired statement current again). It does not flip, drain or talk to
//! the cluster.

use serde::{Deserialize, Serialize};

use kubeslot_image::statement::{self, Statement};
use kubeslot_image::time::rfc3339_seconds;

use crate::config::{Config, WindowState};
use crate::paths::Root;

use super::resolve::Resolved;
use super::ActivateError;

/// What the gates found, for the report, `plan` and `status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Admission {
    /// Until when the release statement holds.
    pub statement_expires: String,
    /// The node's place in this release's rollout, in `[0, 1)`.
    pub place: String,
    /// When the node's wave opens (`None`: no wave of the schedule covers
    /// the node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wave_opens: Option<String>,
    /// The maintenance window: `any time`, `open until T`, `closed until T`.
    pub window: String,
    /// Why the update waits; `None`: it may start now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
    /// The host's clock was behind the latest time it had seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock: Option<String>,
}

/// The node's name as the kubelet registers it: `kubelet.node_name`, else
/// the host name in lower case (what a wave's place is hashed from).
pub fn node_name(config: &Config, hostname: &str) -> String {
    config
        .kubelet
        .node_name
        .clone()
        .unwrap_or_else(|| hostname.to_lowercase())
}

/// `source.follow: {"annotation": true}`: the config with `image` the
/// reference in the Node's own `<prefix>desired-image` annotation, read
/// with the node's credentials (`cluster`, as the drain reads them, the
/// kubeconfig's paths those of `machine`'s host files). Unset or empty:
/// the config's own `image` (where the host starts). Any other config is
/// returned as it is.
pub fn desired(
    root: &Root,
    mut config: Config,
    machine: crate::slot::Slot,
) -> Result<Config, ActivateError> {
    if config.source.follow != Some(crate::config::Follow::Annotation(true)) {
        return Ok(config);
    }
    let fail = |reason: String| ActivateError::Desired(reason);
    let Some(cluster) = config.cluster.clone() else {
        return Err(fail(
            "needs the `cluster` section (the Node is read with the node's credentials)".into(),
        ));
    };
    let node = crate::render::node_name_of(root, &config)?;
    let kubeconfig = crate::cluster::node::kubeconfig_path(
        root,
        &cluster,
        config.kubelet.exec_credential.is_some(),
        machine.machine(),
    );
    let client = crate::cluster::node::client(
        root,
        machine.machine(),
        &kubeconfig,
        std::time::Duration::from_secs(cluster.request_timeout_secs),
    )
    .map_err(|e| fail(format!("{e:#}")))?;
    let found = crate::rollout::desired::desired_image(&client, &node, &cluster.annotation_prefix)
        .map_err(fail)?;
    if let Some(r) = found {
        config.image = r.parse().map_err(|e| {
            fail(format!(
                "{}{} of Node {node}: {r:?}: {e}",
                cluster.annotation_prefix, "desired-image"
            ))
        })?;
    }
    Ok(config)
}

/// The clock file's name under the state dir.
const CLOCK_FILE: &str = "clock";
/// Clock skew tolerated before a backwards clock is reported.
const CLOCK_SLACK_SECS: i64 = 300;

/// The host's time, never before the latest time it recorded; and a note
/// when its clock is behind that.
fn now(root: &Root) -> (i64, Option<String>) {
    let clock = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    now_at(root, clock)
}

/// [`now`] given the clock's reading.
fn now_at(root: &Root, clock: i64) -> (i64, Option<String>) {
    let seen = std::fs::read_to_string(root.state_dir().join(CLOCK_FILE))
        .ok()
        .and_then(|t| t.trim().parse::<i64>().ok())
        .unwrap_or(i64::MIN);
    if clock.saturating_add(CLOCK_SLACK_SECS) < seen {
        let note = format!(
            "the host's clock ({}) is behind the latest time it has seen ({}): that time is used",
            rfc3339_seconds(clock.max(0) as u64),
            rfc3339_seconds(seen.max(0) as u64)
        );
        return (seen, Some(note));
    }
    (clock.max(seen), None)
}

fn record(root: &Root, time: i64) {
    // Best effort: losing it costs only the backwards-clock check.
    let path = root.state_dir().join(CLOCK_FILE);
    let _ = kubeslot_image::atomic::write_file(&path, time.to_string().as_bytes());
}

/// Reads and verifies the statement of the resolved image and decides the
/// wave and the window. An expired or missing statement is an error (the
/// node is untouched); a closed wave or window is an [`Admission`] with
/// `waiting` set.
pub fn admit(
    root: &Root,
    config: &Config,
    resolved: &Resolved,
    node_name: &str,
) -> Result<Admission, ActivateError> {
    let found = read(root, config, resolved)?;
    let (now, clock) = now(root);
    // A statement issued later than the clock says is proof of the time
    // too (bounded: a statement from far ahead is refused below anyway).
    record(root, now.max(found.issued_secs().min(now + 3600)));
    found.check_current(now)?;
    Ok(decide(config, &found, node_name, now, clock))
}

/// [`admit`] for `plan`: the same decision, the clock file not written.
pub fn preview(
    root: &Root,
    config: &Config,
    resolved: &Resolved,
    node_name: &str,
) -> Result<Admission, ActivateError> {
    let found = read(root, config, resolved)?;
    let (now, clock) = now(root);
    found.check_current(now)?;
    Ok(decide(config, &found, node_name, now, clock))
}

fn read(root: &Root, config: &Config, resolved: &Resolved) -> Result<Statement, ActivateError> {
    let policy = crate::fetch::access::policy(&config.trust, &config.image, root)?;
    let top = resolved.index_digest();
    Ok(statement::read(
        &resolved.source,
        policy.keys(),
        policy.identity(),
        top,
    )?)
}

/// The pure part of [`admit`]: wave and window at `now`.
pub fn decide(
    config: &Config,
    found: &Statement,
    node_name: &str,
    now: i64,
    clock: Option<String>,
) -> Admission {
    let t = |s: i64| rfc3339_seconds(s.max(0) as u64);
    let place = statement::place(node_name, &found.digest);
    let wave = found.wave_start(place);
    let window = config.rollout.window_state(now);
    let waiting = match (wave, window) {
        (None, _) => Some(format!(
            "node {node_name} (place {place:.4}) is in no wave of the release's schedule"
        )),
        (Some((i, opens)), _) if opens > now => Some(format!(
            "node {node_name} (place {place:.4}) is in wave {} ({}%), which opens at {}",
            i + 1,
            found.schedule[i].percent,
            t(opens)
        )),
        (_, WindowState::Closed { opens }) => Some(format!(
            "outside the maintenance windows (rollout.windows): the next opens at {}",
            t(opens)
        )),
        _ => None,
    };
    Admission {
        statement_expires: found.expires.clone(),
        place: format!("{place:.4}"),
        wave_opens: wave.map(|(_, s)| t(s)),
        window: match window {
            WindowState::Always => "any time".into(),
            WindowState::Open { closes } => format!("open until {}", t(closes)),
            WindowState::Closed { opens } => format!("closed until {}", t(opens)),
        },
        waiting,
        clock,
    }
}

impl Admission {
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "  release statement: expires {}\n  rollout: place {}, wave opens {}, window {}\n",
            self.statement_expires,
            self.place,
            self.wave_opens.as_deref().unwrap_or("never"),
            self.window
        );
        if let Some(w) = &self.waiting {
            s += &format!("  waiting: {w}\n");
        }
        if let Some(c) = &self.clock {
            s += &format!("  clock: {c}\n");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_set_backwards_is_noticed_and_not_believed() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        std::fs::create_dir_all(root.state_dir()).unwrap();
        assert_eq!(now_at(&root, 1_000_000), (1_000_000, None));
        record(&root, 2_000_000);
        let (now, note) = now_at(&root, 1_000_000);
        assert_eq!(now, 2_000_000);
        assert!(note.unwrap().contains("behind the latest time it has seen"));
        // a few minutes behind is skew, not a clock set back
        assert_eq!(now_at(&root, 1_999_900), (2_000_000, None));
    }
}
