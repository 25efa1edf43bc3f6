//! The fleet settings of the config: `source.follow` (where a host looks
//! for new releases on its own) and `rollout` (when it may take one:
//! maintenance windows). Owns their schema and the window arithmetic (pure:
//! a time in, an answer out); it reads no clock and no file.
//!
//! Windows are written with a fixed UTC offset (`"utc_offset": "+01:00"`),
//! not a time zone name: the activator carries no time zone database and
//! reads none from the host (a host's `/usr/share/zoneinfo` may be missing
//! or older than the operator's); a site that changes offsets for summer
//! time writes two windows or moves the offset with its config.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Where the host finds releases by itself (`"source": {"follow": …}`).
/// Without it, the host activates what `image` names and nothing more.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SourceSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follow: Option<Follow>,
}

impl SourceSettings {
    /// What serde cannot check: a tag that is a tag.
    pub(super) fn check(&self) -> Option<String> {
        match &self.follow {
            Some(Follow::Tag(tag)) => {
                let ok = !tag.is_empty()
                    && tag.len() <= 128
                    && tag
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
                    && !tag.starts_with(['.', '-']);
                (!ok).then(|| format!("{tag:?} is not a tag ([A-Za-z0-9_.-], at most 128 characters, not starting with '.' or '-')"))
            }
            Some(Follow::Annotation(false)) => {
                Some("annotation: false follows nothing: leave source.follow out".to_string())
            }
            _ => None,
        }
    }
}

/// What a following host follows.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum Follow {
    /// `{"tag": "stable"}`: the tag in the repository, layout directory or
    /// archive that `image` names (its own tag or digest is where the host
    /// starts); each release the tag moves to needs an unexpired release
    /// statement.
    Tag(String),
    /// `{"annotation": true}`: the Node's own `<prefix>/desired-image`
    /// annotation, read with the node's credentials.
    Annotation(bool),
}

/// When and how a host takes a release it found (`"rollout": {…}`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Rollout {
    /// Maintenance windows: an update starts only inside one. Empty: any
    /// time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<Window>,
    /// The cluster-wide limit and the halt (`"limit": {…}`). Unset: a
    /// following node starts once its wave and window are open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<FleetLimit>,
}

/// `rollout.limit`: at most `max_unavailable` nodes drain or flip at once,
/// each holding one of that many Leases in `namespace`; no new start while
/// the pause switch is set or once `halt_after` nodes rolled the digest
/// back. Spoken with the rollout identity's `kubeconfig` (a node's own
/// credentials cannot take Leases: deploy/rollout.yaml).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FleetLimit {
    /// The rollout identity's kubeconfig (group `kubeslot:rollout`).
    pub kubeconfig: std::path::PathBuf,
    /// Where the Leases and the pause switch live.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// A count of nodes (`2`) or a percentage (`"10%"`) of the nodes
    /// `node_selector` matches.
    pub max_unavailable: CountOrPercent,
    /// The label selector of the nodes a percentage counts and whose
    /// rollbacks halt (empty: all nodes).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node_selector: String,
    /// A silent holder's lease is taken over after this.
    #[serde(default = "default_lease_duration")]
    pub lease_duration_secs: u32,
    /// Rollbacks of one digest that halt new starts (0: never).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub halt_after: usize,
    /// The pause switch: a ConfigMap in `namespace` with `paused: "true"`.
    #[serde(default = "default_pause_switch")]
    pub pause_switch: String,
    /// Lease names are `<lease_prefix>-<i>`.
    #[serde(default = "default_lease_prefix")]
    pub lease_prefix: String,
}

fn default_namespace() -> String {
    "kubeslot-system".into()
}
fn default_lease_duration() -> u32 {
    60
}
fn default_pause_switch() -> String {
    "kubeslot-pause".into()
}
fn default_lease_prefix() -> String {
    "kubeslot-rollout".into()
}
fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// `max_unavailable`: `5` or `"10%"` (written back as given).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum CountOrPercent {
    Count(u32),
    Text(String),
}

impl CountOrPercent {
    /// The text form (`"5"`, `"10%"`) the rollout library parses.
    pub fn text(&self) -> String {
        match self {
            CountOrPercent::Count(c) => c.to_string(),
            CountOrPercent::Text(t) => t.clone(),
        }
    }
}

/// What serde cannot check in `source` and `rollout`: the field and why.
pub(super) fn check(source: &SourceSettings, rollout: &Rollout) -> Option<(&'static str, String)> {
    if let Some(r) = source.check() {
        return Some(("source.follow", r));
    }
    rollout.check().map(|r| ("rollout.limit", r))
}

impl Rollout {
    /// What serde cannot check: a limit that limits.
    fn check(&self) -> Option<String> {
        let l = self.limit.as_ref()?;
        let t = l.max_unavailable.text();
        let ok = match t.strip_suffix('%') {
            Some(p) => p.parse::<u32>().is_ok_and(|p| (1..=100).contains(&p)),
            None => t.parse::<u32>().is_ok_and(|c| c > 0),
        };
        if !ok {
            return Some(format!(
                "max_unavailable {t:?}: expected a count of nodes (5) or a percentage (\"10%\", 1 to 100)"
            ));
        }
        if l.lease_duration_secs < 3 {
            return Some("lease_duration_secs: at least 3 (renewed every third)".into());
        }
        if !l.kubeconfig.is_absolute() {
            return Some("kubeconfig: an absolute path".into());
        }
        None
    }
}

/// One maintenance window: on `days` (the local day it starts; empty:
/// every day) from `start` to `end` local time at `utc_offset`. An `end`
/// at or before `start` runs past midnight into the next day.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Window {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub days: Vec<Weekday>,
    pub start: ClockTime,
    pub end: ClockTime,
    #[serde(default)]
    pub utc_offset: UtcOffset,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Weekday {
    Mon,
    Tue,
    Wed,
    Thu,
    Fri,
    Sat,
    Sun,
}

impl Weekday {
    /// Monday is 0.
    fn index(self) -> i64 {
        self as i64
    }
}

/// `HH:MM`, minutes after local midnight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockTime(pub u32);

/// `+HH:MM` / `-HH:MM` (or `Z`), seconds east of UTC.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UtcOffset(pub i32);

/// Serde through `FromStr` and `Display` (parse, don't validate).
macro_rules! serde_as_text {
    ($t:ty) => {
        impl Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = String::deserialize(d)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}
serde_as_text!(ClockTime);
serde_as_text!(UtcOffset);

impl FromStr for ClockTime {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not a time of day HH:MM (00:00 to 24:00)");
        let (h, m) = s.split_once(':').ok_or_else(bad)?;
        if h.len() != 2 || m.len() != 2 {
            return Err(bad());
        }
        let h: u32 = h.parse().map_err(|_| bad())?;
        let m: u32 = m.parse().map_err(|_| bad())?;
        if m > 59 || h > 24 || (h == 24 && m != 0) {
            return Err(bad());
        }
        Ok(ClockTime(h * 60 + m))
    }
}

impl fmt::Display for ClockTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:02}:{:02}", self.0 / 60, self.0 % 60)
    }
}

impl FromStr for UtcOffset {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "Z" || s == "UTC" {
            return Ok(UtcOffset(0));
        }
        let bad = || {
            format!("{s:?} is not a UTC offset +HH:MM or -HH:MM (a fixed offset, not a zone name)")
        };
        let (sign, rest) = match s.as_bytes().first() {
            Some(b'+') => (1, &s[1..]),
            Some(b'-') => (-1, &s[1..]),
            _ => return Err(bad()),
        };
        let t: ClockTime = rest.parse().map_err(|_| bad())?;
        if t.0 > 14 * 60 {
            return Err(bad());
        }
        Ok(UtcOffset(sign * t.0 as i32 * 60))
    }
}

impl fmt::Display for UtcOffset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.0 < 0 { '-' } else { '+' };
        let m = self.0.unsigned_abs() / 60;
        write!(f, "{sign}{:02}:{:02}", m / 60, m % 60)
    }
}

/// Where `now` stands against the windows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowState {
    /// No windows configured: any time.
    Always,
    /// Inside a window that closes at this time (seconds since the epoch).
    Open { closes: i64 },
    /// Outside every window; the next opens at this time.
    Closed { opens: i64 },
}

impl Window {
    /// The window's (start, end) occurrences that begin on the local days
    /// around `now` (seconds since the epoch), in UTC.
    fn occurrences(&self, now: i64) -> impl Iterator<Item = (i64, i64)> + '_ {
        let offset = i64::from(self.utc_offset.0);
        let local_day = (now + offset).div_euclid(86_400);
        (-1..=8).filter_map(move |d| {
            let day = local_day + d;
            // 1970-01-01 was a Thursday (index 3, Monday 0).
            let weekday = (day + 3).rem_euclid(7);
            if !self.days.is_empty() && !self.days.iter().any(|w| w.index() == weekday) {
                return None;
            }
            let start = day * 86_400 + i64::from(self.start.0) * 60 - offset;
            let mut end = day * 86_400 + i64::from(self.end.0) * 60 - offset;
            if end <= start {
                end += 86_400;
            }
            Some((start, end))
        })
    }
}

impl Rollout {
    /// Whether an update may start at `now` (seconds since the epoch).
    pub fn window_state(&self, now: i64) -> WindowState {
        if self.windows.is_empty() {
            return WindowState::Always;
        }
        let occurrences = || self.windows.iter().flat_map(|w| w.occurrences(now));
        if let Some(closes) = occurrences()
            .filter(|&(s, e)| s <= now && now < e)
            .map(|(_, e)| e)
            .max()
        {
            return WindowState::Open { closes };
        }
        // Every window opens at least once a week: the scan covers 8 days.
        let opens = occurrences()
            .map(|(s, _)| s)
            .filter(|&s| s > now)
            .min()
            .unwrap_or(i64::MAX);
        WindowState::Closed { opens }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeslot_image::time::parse_rfc3339;

    fn at(t: &str) -> i64 {
        parse_rfc3339(t).unwrap()
    }

    fn rollout(json: &str) -> Rollout {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn a_weekend_night_window_at_an_offset() {
        let r = rollout(
            r#"{"windows":[{"days":["sat","sun"],"start":"02:00","end":"05:00","utc_offset":"+01:00"}]}"#,
        );
        // 2026-12-05 is a Saturday; 02:00+01:00 is 01:00Z.
        assert_eq!(
            r.window_state(at("2026-12-05T01:30:00Z")),
            WindowState::Open {
                closes: at("2026-12-05T04:00:00Z")
            }
        );
        assert_eq!(
            r.window_state(at("2026-12-05T04:00:00Z")),
            WindowState::Closed {
                opens: at("2026-12-06T01:00:00Z")
            }
        );
        // Monday: the next is Saturday's.
        assert_eq!(
            r.window_state(at("2026-12-07T12:00:00Z")),
            WindowState::Closed {
                opens: at("2026-12-12T01:00:00Z")
            }
        );
    }

    #[test]
    fn a_window_past_midnight_belongs_to_the_day_it_starts() {
        let r = rollout(r#"{"windows":[{"days":["fri"],"start":"22:00","end":"02:00"}]}"#);
        // Saturday 01:00Z is inside Friday's window.
        assert!(matches!(
            r.window_state(at("2026-12-05T01:00:00Z")),
            WindowState::Open { .. }
        ));
        assert!(matches!(
            r.window_state(at("2026-12-05T22:30:00Z")),
            WindowState::Closed { .. }
        ));
        assert_eq!(rollout("{}").window_state(0), WindowState::Always);
    }

    #[test]
    fn times_and_offsets_are_parsed_not_trusted() {
        for bad in [
            r#"{"windows":[{"start":"25:00","end":"02:00"}]}"#,
            r#"{"windows":[{"start":"2:00","end":"02:00"}]}"#,
            r#"{"windows":[{"start":"01:00","end":"02:00","utc_offset":"Europe/Berlin"}]}"#,
            r#"{"windows":[{"days":["someday"],"start":"01:00","end":"02:00"}]}"#,
        ] {
            assert!(serde_json::from_str::<Rollout>(bad).is_err(), "{bad}");
        }
        let r = rollout(r#"{"windows":[{"start":"01:00","end":"24:00","utc_offset":"-05:30"}]}"#);
        assert_eq!(r.windows[0].utc_offset, UtcOffset(-(5 * 3600 + 30 * 60)));
        assert_eq!(r.windows[0].utc_offset.to_string(), "-05:30");
        let f: SourceSettings = serde_json::from_str(r#"{"follow":{"tag":"stable"}}"#).unwrap();
        assert_eq!(f.follow, Some(Follow::Tag("stable".into())));
    }

    #[test]
    fn a_limit_must_limit() {
        let check = |limit: &str| rollout(&format!(r#"{{"limit":{limit}}}"#)).check();
        let ok = r#"{"kubeconfig":"/etc/kubeslot/rollout.kubeconfig","max_unavailable":2}"#;
        assert_eq!(check(ok), None);
        let r = rollout(&format!(r#"{{"limit":{ok}}}"#));
        let l = r.limit.unwrap();
        assert_eq!(
            (l.namespace.as_str(), l.lease_duration_secs),
            ("kubeslot-system", 60)
        );
        assert_eq!(
            check(r#"{"kubeconfig":"/k","max_unavailable":"10%","halt_after":3}"#),
            None
        );
        for bad in [
            r#"{"kubeconfig":"/k","max_unavailable":0}"#,
            r#"{"kubeconfig":"/k","max_unavailable":"150%"}"#,
            r#"{"kubeconfig":"/k","max_unavailable":"many"}"#,
            r#"{"kubeconfig":"k","max_unavailable":1}"#,
            r#"{"kubeconfig":"/k","max_unavailable":1,"lease_duration_secs":1}"#,
        ] {
            assert!(check(bad).is_some(), "{bad}");
        }
    }
}
