//! Waiting on a registry that says "not now": `429 Too Many Requests` and
//! `503 Service Unavailable`, with or without `Retry-After`, within one
//! deadline for the whole run.
//!
//! Given the answer (its status and `Retry-After` value), the attempt number
//! and whether another endpoint is left to try, [`Pacing::decide`] says how
//! long to wait before asking the same endpoint again, or that it should
//! move on (a mirror that keeps refusing) or give up (the deadline). The
//! wait honours `Retry-After` (delay-seconds or an HTTP-date) as a floor and
//! adds a random share of an exponentially growing backoff, so hosts that
//! were refused together do not come back together. [`Pacing`] also counts
//! what a run sent, how often it was refused and how long it waited: the
//! run's report and progress lines show it.
//!
//! It does not send requests or sleep (the registry client does) and it
//! retries nothing else: a refused connection, another 5xx or a bad digest
//! move on to the next endpoint at once, as before.

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// The statuses that mean "ask again later".
pub fn is_throttled(status: u16) -> bool {
    status == 429 || status == 503
}

/// How a client backs off. The defaults suit a fleet: a refused host waits
/// at least half a second, at most a minute between tries (plus what
/// `Retry-After` asks for), a mirror gets three tries before the next
/// endpoint is asked, and nothing is asked 20 minutes after the start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// The backoff of the first retry; it doubles with each one.
    pub base: Duration,
    /// The backoff stops growing here.
    pub cap: Duration,
    /// Tries per request at an endpoint that is not the last one (a mirror)
    /// before moving on; the last endpoint is asked until the deadline.
    pub mirror_attempts: u32,
    /// The end of the run's registry work: no wait ends past it, and every
    /// request is cut off at it.
    pub deadline: Option<Duration>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(60),
            mirror_attempts: 3,
            deadline: Some(Duration::from_secs(1200)),
        }
    }
}

/// What a run's requests amounted to (the report's `registry_requests`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Traffic {
    /// Requests sent, retries included.
    pub sent: u64,
    /// Answers that were 429 or 503.
    pub throttled: u64,
    /// Time spent waiting before asking again, in milliseconds.
    pub waited_ms: u64,
}

/// What to do after a 429/503.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Ask the same endpoint again after this long.
    Wait(Duration),
    /// Stop asking this endpoint; the reason goes into the error.
    Stop(String),
}

/// Where a client says that it waits (the activator's progress lines).
type Notice = Box<dyn Fn(&str) + Send + Sync>;

/// One run's backoff state: the policy, the deadline as an instant, the
/// counters, the jitter source and where waits are announced.
pub struct Pacing {
    policy: Policy,
    deadline: Option<Instant>,
    traffic: Mutex<Traffic>,
    rng: Mutex<u64>,
    notice: Option<Notice>,
}

impl Default for Pacing {
    fn default() -> Self {
        Pacing::new(Policy::default())
    }
}

impl Pacing {
    /// Starts the clock: the deadline counts from now.
    pub fn new(policy: Policy) -> Pacing {
        let deadline = policy.deadline.map(|d| Instant::now() + d);
        Pacing {
            policy,
            deadline,
            traffic: Mutex::new(Traffic::default()),
            rng: Mutex::new(seed()),
            notice: None,
        }
    }

    /// Announces every wait through `f` (one line, no newline).
    pub fn with_notice(mut self, f: impl Fn(&str) + Send + Sync + 'static) -> Pacing {
        self.notice = Some(Box::new(f));
        self
    }

    /// Passes a line to the notice hook, if there is one.
    pub fn notice(&self, line: &str) {
        if let Some(f) = &self.notice {
            f(line);
        }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Time left before the deadline (`None`: no deadline).
    pub fn remaining(&self) -> Option<Duration> {
        self.deadline
            .map(|d| d.saturating_duration_since(Instant::now()))
    }

    /// An error message when the deadline has passed.
    pub fn check_deadline(&self) -> Result<(), String> {
        match (self.remaining(), self.policy.deadline) {
            (Some(left), Some(total)) if left.is_zero() => {
                Err(format!("download deadline of {} s passed", total.as_secs()))
            }
            _ => Ok(()),
        }
    }

    /// Counts a request about to be sent.
    pub fn sent(&self) {
        self.traffic.lock().expect("traffic").sent += 1;
    }

    /// Counts a 429/503 answer.
    pub fn throttled(&self) {
        self.traffic.lock().expect("traffic").throttled += 1;
    }

    /// Counts time waited.
    pub fn waited(&self, d: Duration) {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let mut t = self.traffic.lock().expect("traffic");
        t.waited_ms = t.waited_ms.saturating_add(ms);
    }

    pub fn traffic(&self) -> Traffic {
        *self.traffic.lock().expect("traffic")
    }

    /// After the `attempt`-th (1-based) answer of 429/503 from an
    /// endpoint: wait and ask it again, or stop asking it. `retry_after` is
    /// the parsed header; `more_endpoints` says whether another endpoint
    /// (the next mirror or the registry) is left to try.
    pub fn decide(
        &self,
        attempt: u32,
        retry_after: Option<Duration>,
        more_endpoints: bool,
    ) -> Decision {
        if more_endpoints && attempt >= self.policy.mirror_attempts {
            return Decision::Stop(format!("still refused after {attempt} tries, moving on"));
        }
        let wait = self.backoff(attempt, retry_after);
        if let Some(left) = self.remaining() {
            let total = self.policy.deadline.unwrap_or_default().as_secs();
            if let Some(r) = retry_after.filter(|r| *r > left) {
                return Decision::Stop(format!(
                    "Retry-After of {} s reaches past the download deadline ({} s left of {total} s)",
                    r.as_secs(),
                    left.as_secs()
                ));
            }
            if wait >= left {
                // The floor still fits: a last try just before the end.
                let floor = retry_after.unwrap_or_default();
                if left <= floor || left.is_zero() {
                    return Decision::Stop(format!(
                        "download deadline of {total} s reached while backing off"
                    ));
                }
                // One jittered wait within what is left: hosts refused at
                // the same moment do not all come back at the same instant.
                return Decision::Wait(floor + (left - floor).mul_f64(self.unit()));
            }
        }
        Decision::Wait(wait)
    }

    /// `max(Retry-After, d/2) + random(0..d/2)` with `d` the exponential
    /// backoff of this attempt: the server's floor is kept, the spread
    /// grows while the refusals go on.
    fn backoff(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        let exp = 2u32.saturating_pow(attempt.saturating_sub(1).min(20));
        let d = self.policy.base.saturating_mul(exp).min(self.policy.cap);
        let half = d / 2;
        let floor = retry_after.unwrap_or_default().max(half);
        // Saturating: a Retry-After of u64::MAX seconds must not panic
        // here (the deadline check then refuses it).
        floor.saturating_add(half.mul_f64(self.unit()))
    }

    /// A number in [0, 1) (xorshift64*; jitter needs no better).
    fn unit(&self) -> f64 {
        let mut s = self.rng.lock().expect("rng");
        let mut x = *s;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        *s = x;
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A per-process seed: std's randomly keyed hasher, no extra crate.
fn seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish() | 1
}

/// Parses a `Retry-After` value: delay-seconds (`120`) or an HTTP-date in
/// any of the three forms RFC 9110 §5.6.7 says a recipient accepts
/// (`Sun, 06 Nov 1994 08:49:37 GMT`, `Sunday, 06-Nov-94 08:49:37 GMT`,
/// `Sun Nov  6 08:49:37 1994`). A date in the past is a zero wait; anything
/// else unreadable is `None` (the backoff alone applies).
pub fn retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let v = value.trim();
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        // Absurdly long numbers saturate; the deadline check refuses them.
        return Some(Duration::from_secs(v.parse().unwrap_or(u64::MAX)));
    }
    let at = http_date(v)?;
    let now = now.duration_since(UNIX_EPOCH).ok()?.as_secs();
    Some(Duration::from_secs(at.saturating_sub(now)))
}

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// Seconds since the epoch of an HTTP-date (GMT).
fn http_date(v: &str) -> Option<u64> {
    let parts: Vec<&str> = v.split_whitespace().collect();
    let (day, month, year, time) = match parts.as_slice() {
        // IMF-fixdate: Sun, 06 Nov 1994 08:49:37 GMT
        [wd, d, m, y, t, "GMT"] if wd.ends_with(',') => (*d, *m, y.parse::<u64>().ok()?, *t),
        // RFC 850: Sunday, 06-Nov-94 08:49:37 GMT
        [wd, dmy, t, "GMT"] if wd.ends_with(',') => {
            let mut it = dmy.split('-');
            let (d, m, y) = (it.next()?, it.next()?, it.next()?);
            if it.next().is_some() || y.len() != 2 {
                return None;
            }
            let y: u64 = y.parse().ok()?;
            // RFC 9110: a two-digit year more than 50 years ahead is in
            // the past century; this code runs well after 2000.
            (d, m, if y < 70 { 2000 + y } else { 1900 + y }, *t)
        }
        // asctime: Sun Nov  6 08:49:37 1994
        [_, m, d, t, y] => (*d, *m, y.parse::<u64>().ok()?, *t),
        _ => return None,
    };
    let day: u64 = day.parse().ok()?;
    let month = MONTHS.iter().position(|m| *m == month)? as u64 + 1;
    let mut hms = time.split(':').map(|p| p.parse::<u64>().ok());
    let (h, mi, s) = (hms.next()??, hms.next()??, hms.next()??);
    if hms.next().is_some() || !(1..=31).contains(&day) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    // Years past 9999 are not HTTP-dates (and would overflow the day count).
    if !(1970..=9999).contains(&year) {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + h * 3600 + mi * 60 + s)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// algorithm), for years from 1970.
fn days_from_civil(y: u64, m: u64, d: u64) -> u64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn retry_after_reads_seconds_and_every_http_date_form() {
        let now = at(784_111_777); // Sun, 06 Nov 1994 08:49:37 GMT
        assert_eq!(retry_after("120", now), Some(Duration::from_secs(120)));
        assert_eq!(retry_after(" 0 ", now), Some(Duration::ZERO));
        for form in [
            "Sun, 06 Nov 1994 08:50:07 GMT",
            "Sunday, 06-Nov-94 08:50:07 GMT",
            "Sun Nov  6 08:50:07 1994",
        ] {
            assert_eq!(
                retry_after(form, now),
                Some(Duration::from_secs(30)),
                "{form}"
            );
        }
        // In the past: ask now.
        assert_eq!(
            retry_after("Sun, 06 Nov 1994 08:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(
            http_date("Thu, 01 Jan 1970 00:00:00 GMT"),
            Some(0),
            "the epoch"
        );
        assert_eq!(
            http_date("Tue, 29 Feb 2028 23:59:59 GMT"),
            Some(1_835_481_599),
            "a leap day"
        );
        for bad in [
            "",
            "-1",
            "1.5",
            "soon",
            "Sun, 06 Nov 1994 08:49:37 UTC",
            "Sun, 32 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nob 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 24:00:00 GMT",
            "Sun, 06 Nov 1994 08:49 GMT",
        ] {
            assert_eq!(retry_after(bad, now), None, "{bad:?}");
        }
    }

    fn policy(deadline: Option<u64>) -> Policy {
        Policy {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(8),
            mirror_attempts: 3,
            deadline: deadline.map(Duration::from_secs),
        }
    }

    #[test]
    fn the_wait_keeps_retry_after_as_a_floor_and_spreads_above_it() {
        let p = Pacing::new(policy(None));
        let mut seen = Vec::new();
        for attempt in 1..=6 {
            for _ in 0..200 {
                let Decision::Wait(w) = p.decide(attempt, Some(Duration::from_secs(2)), false)
                else {
                    panic!("the last endpoint is asked again")
                };
                let d = Duration::from_secs(1 << (attempt - 1)).min(Duration::from_secs(8));
                let floor = Duration::from_secs(2).max(d / 2);
                assert!(
                    w >= floor && w < floor + d / 2 + Duration::from_millis(1),
                    "{attempt}: {w:?}"
                );
                seen.push(w);
            }
        }
        seen.sort();
        seen.dedup();
        assert!(
            seen.len() > 100,
            "jittered, not fixed: {} distinct waits",
            seen.len()
        );
        // Without Retry-After the backoff alone: half of 1 s to 1 s first.
        let Decision::Wait(w) = p.decide(1, None, false) else {
            panic!()
        };
        assert!(
            w >= Duration::from_millis(500) && w < Duration::from_secs(1),
            "{w:?}"
        );
    }

    #[test]
    fn a_mirror_gets_a_few_tries_then_the_next_endpoint_is_asked() {
        let p = Pacing::new(policy(None));
        assert!(matches!(p.decide(2, None, true), Decision::Wait(_)));
        let Decision::Stop(why) = p.decide(3, None, true) else {
            panic!()
        };
        assert!(why.contains("after 3 tries"), "{why}");
        assert!(matches!(p.decide(30, None, false), Decision::Wait(_)));
    }

    #[test]
    fn nothing_waits_past_the_deadline() {
        let p = Pacing::new(policy(Some(5)));
        let Decision::Stop(why) = p.decide(1, Some(Duration::from_secs(3600)), false) else {
            panic!()
        };
        assert!(
            why.contains("Retry-After of 3600 s") && why.contains("deadline"),
            "{why}"
        );
        // A backoff longer than what is left shrinks to fit before the end.
        let Decision::Wait(w) = p.decide(10, Some(Duration::from_secs(1)), false) else {
            panic!()
        };
        assert!(
            w >= Duration::from_secs(1) && w < Duration::from_secs(5),
            "{w:?}"
        );
        let done = Pacing::new(policy(Some(0)));
        assert!(done
            .check_deadline()
            .unwrap_err()
            .contains("deadline of 0 s"));
        assert!(matches!(done.decide(1, None, false), Decision::Stop(_)));
    }

    #[test]
    fn traffic_adds_up() {
        let p = Pacing::default();
        p.sent();
        p.sent();
        p.throttled();
        p.waited(Duration::from_millis(1500));
        assert_eq!(
            p.traffic(),
            Traffic {
                sent: 2,
                throttled: 1,
                waited_ms: 1500
            }
        );
    }

    #[test]
    fn absurd_retry_after_values_never_panic() {
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let huge = "9".repeat(40);
        for v in [
            huge.as_str(),
            "18446744073709551615",
            "Sun, 06 Nov 99999999999 08:49:37 GMT",
            "Sun Nov  6 08:49:37 18446744073709551615",
            "Fri, 31 Dec 9999 23:59:59 GMT",
        ] {
            let r = retry_after(v, now);
            for deadline in [None, Some(30)] {
                let p = Pacing::new(policy(deadline));
                for attempt in [1, 2, 40, u32::MAX] {
                    // decides without panicking; with a deadline, a wait
                    // past it stops
                    match p.decide(attempt, r, false) {
                        Decision::Wait(w) if deadline.is_some() => {
                            assert!(w <= Duration::from_secs(30), "{v}: {w:?}")
                        }
                        _ => {}
                    }
                }
            }
        }
        assert_eq!(retry_after("Sun, 06 Nov 10000 08:49:37 GMT", now), None);
    }

    #[test]
    fn waits_near_the_deadline_are_jittered() {
        let p = Pacing::new(policy(Some(5)));
        let waits: std::collections::BTreeSet<u128> = (0..20)
            .filter_map(
                |_| match p.decide(10, Some(Duration::from_secs(1)), false) {
                    Decision::Wait(w) => Some(w.as_millis()),
                    Decision::Stop(_) => None,
                },
            )
            .collect();
        assert!(waits.len() > 10, "{waits:?}");
        assert!(waits.iter().all(|w| (1000..5000).contains(w)), "{waits:?}");
    }
}
