//! Progress lines on stderr for the long steps of a run: each phase as it
//! starts, each blob download (size, source, then every few seconds bytes,
//! percent and rate, then the total), each layer as it is unpacked. What a
//! person at a terminal, or the journal of `kubeslot-activator.service`,
//! sees while a node image comes in.
//!
//! Off unless the binary calls [`enable`]: the library stays quiet for tests
//! and other callers, and stdout (where `--json` reports go) is never used.
//! Plain lines, no terminal control codes (the journal is the main reader).
//! Digests are shortened to 12 hex digits here; errors name them in full.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kubeslot_image::digest::Digest;

static ENABLED: AtomicBool = AtomicBool::new(false);

/// How often a running download reports.
const EVERY: Duration = Duration::from_secs(5);

/// Transfers smaller than this get no start line, only their end line.
const QUIET_BELOW: u64 = 1 << 20;

/// Turns progress lines on for this process.
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Prints `text()` on stderr when progress is on (the text is only built
/// then).
pub fn line(text: impl FnOnce() -> String) {
    if enabled() {
        eprintln!("{}", text());
    }
}

/// `sha256:` and the first 12 hex digits: enough to tell blobs apart in a
/// progress line.
pub fn short(d: &Digest) -> String {
    format!("sha256:{}", &d.hex()[..12])
}

/// Bytes for people: `512 B`, `3.4 KB`, `137.2 MB`, `1.3 GB` (powers of 1000).
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KB", "MB", "GB", "TB"];
    if bytes < 1000 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1000.0;
    let mut unit = 0;
    while v >= 1000.0 && unit + 1 < UNITS.len() {
        v /= 1000.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// The progress of one transfer of `size` bytes, `have` of them already
/// on disk when it started.
pub struct Meter {
    what: String,
    size: u64,
    have: u64,
    started: Instant,
    last: Instant,
}

impl Meter {
    /// Starts the clock; prints a start line for a transfer big enough to
    /// take a while (every transfer gets its end line, [`Meter::finish`]).
    pub fn start(what: String, size: u64, have: u64, from: &str) -> Meter {
        if size.saturating_sub(have) >= QUIET_BELOW {
            line(|| {
                let resumed = if have > 0 {
                    format!(", continuing after {}", human(have))
                } else {
                    String::new()
                };
                format!("{what}: fetching {} from {from}{resumed}", human(size))
            });
        }
        let now = Instant::now();
        Meter {
            what,
            size,
            have,
            started: now,
            last: now,
        }
    }

    /// `got` bytes are on disk now; prints a line when the last one is
    /// [`EVERY`] old.
    pub fn advance(&mut self, got: u64) {
        if !enabled() || self.last.elapsed() < EVERY {
            return;
        }
        self.last = Instant::now();
        let pct = got
            .saturating_mul(100)
            .checked_div(self.size)
            .unwrap_or(100);
        eprintln!(
            "{}: {} of {} ({pct}%), {}/s",
            self.what,
            human(got),
            human(self.size),
            human(self.rate(got))
        );
    }

    /// Prints the end line: bytes moved, time, rate.
    pub fn finish(&self, got: u64) {
        line(|| {
            format!(
                "{}: fetched {} in {:.1} s ({}/s)",
                self.what,
                human(got - self.have.min(got)),
                self.started.elapsed().as_secs_f64(),
                human(self.rate(got))
            )
        });
    }

    fn rate(&self, got: u64) -> u64 {
        let secs = self.started.elapsed().as_secs_f64().max(0.001);
        ((got - self.have.min(got)) as f64 / secs) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_sizes() {
        assert_eq!(human(0), "0 B");
        assert_eq!(human(999), "999 B");
        assert_eq!(human(1000), "1.0 KB");
        assert_eq!(human(137_200_000), "137.2 MB");
        assert_eq!(human(1_300_000_000), "1.3 GB");
        assert_eq!(human(u64::MAX), "18446744.1 TB");
    }

    #[test]
    fn short_digests() {
        let d = Digest::of(b"x");
        let s = short(&d);
        assert_eq!(s.len(), "sha256:".len() + 12);
        assert!(d.to_string().starts_with(&s));
    }
}
