//! Timestamps as RFC 3339 UTC text: the one formatter for image configs,
//! SBOMs (the builder, from `source_date_epoch`) and reports and state (the
//! activator, from the clock), and the one parser ([`parse_rfc3339`]: the
//! activator orders releases by their image config's `created`). No time
//! zone database.

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

/// Parses RFC 3339 (`2026-11-23T10:50:00Z`, fractional seconds and a
/// `±HH:MM` offset allowed; `t`/`z` and a space separator too) into seconds
/// since the epoch (negative before 1970). `None` for anything else,
/// including years outside 0000–9999: text from an image never panics or
/// overflows here.
pub fn parse_rfc3339(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    if b.len() < 20 || b.len() > 64 {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = b.get(r)?;
        if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(part).ok()?.parse().ok()
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    if b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let mut i = 19;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == start {
            return None;
        }
    }
    let offset = match b.get(i..)? {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let digits = [*h1, *h2, *m1, *m2];
            if !digits.iter().all(u8::is_ascii_digit) {
                return None;
            }
            let v = |a: u8, b: u8| i64::from(a - b'0') * 10 + i64::from(b - b'0');
            let (oh, om) = (v(*h1, *h2), v(*m1, *m2));
            if oh > 23 || om > 59 {
                return None;
            }
            let o = oh * 3600 + om * 60;
            if *sign == b'-' {
                -o
            } else {
                o
            }
        }
        _ => return None,
    };
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let days_in = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in[usize::try_from(month - 1).ok()?]
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    // Howard Hinnant's days-from-civil; every value is small (years < 10^4).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hour * 3600 + minute * 60 + second - offset)
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

    #[test]
    fn parse_rfc3339_round_trips_and_refuses_junk() {
        for secs in [
            0u64,
            951_782_400,
            1_700_000_000,
            1_795_426_980,
            253_402_300_799,
        ] {
            assert_eq!(parse_rfc3339(&rfc3339_seconds(secs)), Some(secs as i64));
            assert_eq!(parse_rfc3339(&rfc3339(secs, 123)), Some(secs as i64));
        }
        assert_eq!(
            parse_rfc3339("2026-11-23T11:50:00+01:00"),
            Some(1_795_431_000)
        );
        assert_eq!(parse_rfc3339("1969-12-31T23:59:59Z"), Some(-1));
        for junk in [
            "",
            "2026-11-23",
            "2026-13-01T00:00:00Z",
            "2026-02-30T00:00:00Z",
            "2026-11-23T24:00:00Z",
            "99999-11-23T00:00:00Z",
            "2026-11-23T00:00:00",
            "2026-11-23T00:00:00.Z",
            "2026-11-23T00:00:00+25:00",
            "２026-11-23T00:00:00Z",
        ] {
            assert_eq!(parse_rfc3339(junk), None, "{junk:?}");
        }
    }
}
