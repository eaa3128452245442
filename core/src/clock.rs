//! Calendar arithmetic for UTC millisecond times, the one time format of the API: dates for people and ISO 8601 for
//! files. No time zones (the browser shows local times itself).

/// Now, in UTC milliseconds (native targets only: the portal in the browser reads `Date.now()`).
#[cfg(not(target_arch = "wasm32"))]
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

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

/// The day count since 1970-01-01 of a date (proleptic Gregorian); the inverse of [`civil`].
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Parses a time given by a person, relative to `now_ms`: `+90m`, `+2h`, `+1d` (from now), or UTC
/// `2026-12-01T09:00`, with optional seconds and a trailing `Z` (a space may stand for the `T`).
pub fn parse_time(text: &str, now_ms: i64) -> Option<i64> {
    let t = text.trim();
    if let Some(rel) = t.strip_prefix('+') {
        let (n, unit) = rel.split_at(rel.find(|c: char| !c.is_ascii_digit())?);
        let n: i64 = n.parse().ok()?;
        let ms = match unit {
            "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return None,
        };
        return now_ms.checked_add(n.checked_mul(ms)?);
    }
    let t = t.strip_suffix('Z').unwrap_or(t);
    let (date, time) = t.split_once(['T', ' '])?;
    let mut d = date.splitn(3, '-');
    let (y, mo, da): (i64, u32, u32) = (d.next()?.parse().ok()?, d.next()?.parse().ok()?, d.next()?.parse().ok()?);
    let mut c = time.splitn(3, ':');
    let (h, mi): (i64, i64) = (c.next()?.parse().ok()?, c.next()?.parse().ok()?);
    let s: i64 = c.next().map_or(Some(0), |s| s.parse().ok())?;
    if !(1..=12).contains(&mo)
        || !(1..=31).contains(&da)
        || !(0..24).contains(&h)
        || !(0..60).contains(&mi)
        || !(0..60).contains(&s)
    {
        return None;
    }
    if !(1970..=9999).contains(&y) {
        return None;
    }
    Some((days_from_civil(y, mo, da) * 86_400 + h * 3600 + mi * 60 + s) * 1000)
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
    fn times_people_write_parse_both_ways() {
        for days in [-1000, 0, 59, 60, 365, 20_000, 2_932_896] {
            let (y, m, d) = civil(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
        let t = parse_time("2026-12-01T09:30Z", 0).expect("present");
        assert_eq!(iso8601(t), "2026-12-01T09:30:00Z");
        assert_eq!(parse_time("2026-12-01 09:30:15", 0).map(iso8601).as_deref(), Some("2026-12-01T09:30:15Z"));
        assert_eq!(parse_time("+90m", 1000), Some(1000 + 90 * 60_000));
        assert_eq!(parse_time("+2d", 0), Some(2 * 86_400_000));
        for bad in ["", "+", "+5y", "2026-13-01T00:00", "2026-12-01", "tomorrow", "+99999999999999999d"] {
            assert_eq!(parse_time(bad, 0), None, "{bad}");
        }
    }

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
