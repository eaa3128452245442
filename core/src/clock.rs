//! Calendar arithmetic for UTC millisecond times, the one time format of the API: dates for people and ISO 8601 for
//! files. No time zones (the browser shows local times itself).

/// The date of a day count since 1970-01-01 (proleptic Gregorian): (year, month 1-12, day 1-31).
pub fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// `2026-11-25T14:05:09Z`: ISO 8601 in UTC, to the second.
pub fn iso8601(ms: i64) -> String {
    let (y, mo, d) = civil(ms.div_euclid(86_400_000));
    let s = ms.div_euclid(1000).rem_euclid(86_400);
    format!("{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}Z", s / 3600, s / 60 % 60, s % 60)
}

/// `2026-11-25 14:05` in UTC.
pub fn utc_minute(ms: i64) -> String {
    let iso = iso8601(ms);
    format!("{} {}", &iso[..10], &iso[11..16])
}

/// `v` with at most `places` decimals and no trailing zeros (`1998.0479999999998` -> `1998.048` at 3 places,
/// `2.50` -> `2.5`, `3.0` -> `3`).
pub fn rounded(v: f64, places: usize) -> String {
    let s = format!("{v:.places$}");
    let s = if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s };
    if s == "-0" { "0".to_string() } else { s }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_follow_the_gregorian_calendar() {
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(11_016), (2000, 2, 29));
        assert_eq!(civil(20_517), (2026, 3, 5));
        assert_eq!(civil(-1), (1969, 12, 31));
        assert_eq!(iso8601(1_764_000_000_123), "2025-11-24T16:00:00Z");
        assert_eq!(iso8601(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_minute(1_764_000_000_000 + 61_000), "2025-11-24 16:01");
    }

    #[test]
    fn numbers_are_rounded_without_noise() {
        assert_eq!(rounded(1_998.047_999_999_999_8, 3), "1998.048");
        assert_eq!(rounded(2.5, 2), "2.5");
        assert_eq!(rounded(3.0, 4), "3");
        assert_eq!(rounded(-0.0001, 2), "0");
        assert_eq!(rounded(120.0, 0), "120");
    }
}
