//! Timestamps as RFC 3339 UTC text: the one formatter for image configs,
//! SBOMs (the builder, from `source_date_epoch`) and reports and state (the
//! activator, from the clock). No time zone database, no parsing.

use std::time::{SystemTime, UNIX_EPOCH};

/// The current time as RFC 3339 UTC with milliseconds
/// (`2026-11-23T09:43:00.123Z`).
pub fn now_rfc3339() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    rfc3339(d.as_secs(), d.subsec_millis())
}

/// Formats seconds since the epoch with milliseconds,
/// `2026-11-23T10:50:00.123Z`.
pub fn rfc3339(secs: u64, millis: u32) -> String {
    let mut s = rfc3339_seconds(secs);
    s.pop(); // the 'Z'
    format!("{s}.{millis:03}Z")
}

/// Formats seconds since the epoch, `2026-11-23T10:50:00Z` (UTC, proleptic
/// Gregorian; Howard Hinnant's civil-from-days). The builder uses it for
/// image and SBOM timestamps (`source_date_epoch`), the activator's report
/// for phases.
pub fn rfc3339_seconds(secs: u64) -> String {
    // i64 arithmetic: the civil-from-days steps go below zero for early eras
    let secs = i64::try_from(secs).unwrap_or(i64::MAX);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_known_instants() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(rfc3339(1_795_426_980, 0), "2026-11-23T09:43:00.000Z");
    }

    #[test]
    fn whole_seconds() {
        assert_eq!(rfc3339_seconds(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_seconds(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339_seconds(951_782_400), "2000-02-29T00:00:00Z");
    }
}
