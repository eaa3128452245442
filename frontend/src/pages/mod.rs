//! The portal's pages, and the counts and times they all show. What else one page takes from another lives in
//! [`shared`], which imports no page.

pub mod admin;
pub mod approvals;
pub mod audit;
pub mod clusters;
pub mod cohorts;
pub mod fleet;
pub mod governance;
pub mod heatmap;
pub mod inbox;
pub mod layout;
pub mod overview;
pub mod quotas;
pub mod shared;
pub mod signin;
pub mod slots;
pub mod tenant;
pub mod tokens;
pub mod usage;
pub mod webhooks;

/// `1 allocation`, `3 allocations`: a count with its noun (English plural by `s`).
pub fn count(n: impl Into<u64>, noun: &str) -> String {
    match n.into() {
        1 => format!("1 {noun}"),
        n => format!("{n} {noun}s"),
    }
}

/// `12 s ago`, `4 min ago`, `3 h ago` from a UTC-millisecond time and now.
pub fn ago(then_ms: i64, now_ms: i64) -> String {
    let s = ((now_ms - then_ms) / 1000).max(0);
    match s {
        0..=59 => format!("{s} s ago"),
        60..=3599 => format!("{} min ago", s / 60),
        3600..=172_799 => format!("{} h ago", s / 3600),
        _ => format!("{} d ago", s / 86_400),
    }
}

/// `40 s`, `12 min`, `71 h`, `3 d` from now until a UTC-millisecond time (`0 s` once it has passed).
pub fn within(until_ms: i64, now_ms: i64) -> String {
    let s = ((until_ms - now_ms) / 1000).max(0);
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 => format!("{} min", s / 60),
        3600..=259_200 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86_400),
    }
}

/// `14:05` (24-hour clock) for a UTC-millisecond time: the viewer's local time in the browser, UTC when rendered
/// on the server.
pub fn clock(ms: i64) -> String {
    #[cfg(feature = "hydrate")]
    {
        let d = js_sys::Date::new(&wasm_bindgen::JsValue::from_f64(ms as f64));
        format!("{:02}:{:02}", d.get_hours(), d.get_minutes())
    }
    #[cfg(not(feature = "hydrate"))]
    {
        let m = ms.div_euclid(60_000);
        format!("{:02}:{:02}", m.div_euclid(60).rem_euclid(24), m.rem_euclid(60))
    }
}

/// `2026-11-25 14:05` for a UTC-millisecond time: the viewer's local time in the browser, UTC when rendered on the
/// server.
pub fn datetime(ms: i64) -> String {
    #[cfg(feature = "hydrate")]
    {
        let d = js_sys::Date::new(&wasm_bindgen::JsValue::from_f64(ms as f64));
        format!(
            "{:04}-{:02}-{:02} {:02}:{:02}",
            d.get_full_year(),
            d.get_month() + 1,
            d.get_date(),
            d.get_hours(),
            d.get_minutes()
        )
    }
    #[cfg(not(feature = "hydrate"))]
    {
        tessera_core::clock::utc_minute(ms)
    }
}

/// A time as `<input type="datetime-local">` holds it, `2026-11-25T14:05`: the viewer's local time in the browser,
/// UTC when rendered on the server.
pub fn local_input(ms: i64) -> String {
    datetime(ms).replacen(' ', "T", 1)
}

/// The UTC-millisecond time a `datetime-local` value names (the viewer's local time in the browser, UTC on the
/// server); `None` for anything else.
pub fn from_local_input(text: &str) -> Option<i64> {
    let t = text.trim();
    let (date, time) = t.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, mo, da) = (d.next()??, d.next()??, d.next()??);
    let mut h = time.splitn(3, ':').map(|p| p.parse::<f64>().ok());
    let (hh, mi) = (h.next()??, h.next()??);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&da) || !(0.0..24.0).contains(&hh) || !(0.0..60.0).contains(&mi) {
        return None;
    }
    #[cfg(feature = "hydrate")]
    {
        let d = js_sys::Date::new_with_year_month_day_hr_min(y as u32, mo as i32 - 1, da as i32, hh as i32, mi as i32);
        let ms = d.get_time();
        (!ms.is_nan()).then_some(ms as i64)
    }
    #[cfg(not(feature = "hydrate"))]
    {
        let days = tessera_core::clock::days_from_civil(y, mo as u32, da as u32);
        Some(days * 86_400_000 + (hh as i64) * 3_600_000 + (mi as i64) * 60_000)
    }
}

/// A countdown to a UTC-millisecond time: `3 d 4 h`, `2 h 05 min`, `12 min 09 s`, `40 s` (`0 s` once passed).
pub fn countdown(until_ms: i64, now_ms: i64) -> String {
    let s = ((until_ms - now_ms) / 1000).max(0);
    let (d, h, m, sec) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    match s {
        0..=59 => format!("{sec} s"),
        60..=3599 => format!("{m} min {sec:02} s"),
        3600..=86_399 => format!("{h} h {m:02} min"),
        _ => format!("{d} d {h} h"),
    }
}

/// The portal's own address (`https://host:port`), to make links people copy; empty when rendered on the server.
pub fn origin() -> String {
    #[cfg(feature = "hydrate")]
    {
        web_sys::window().and_then(|w| w.location().origin().ok()).unwrap_or_default()
    }
    #[cfg(not(feature = "hydrate"))]
    {
        String::new()
    }
}

/// Now, UTC milliseconds, on either side.
pub fn now_ms() -> i64 {
    #[cfg(feature = "hydrate")]
    {
        js_sys::Date::now() as i64
    }
    #[cfg(not(feature = "hydrate"))]
    {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn date_time_inputs_read_back_what_they_show() {
        let t = 1_795_773_900_000; // 2026-11-27 10:05 UTC
        assert_eq!(super::local_input(t), "2026-11-27T10:05");
        assert_eq!(super::from_local_input("2026-11-27T10:05"), Some(t));
        assert_eq!(super::from_local_input(" 2026-11-27T10:05:00 "), Some(t));
        for bad in ["", "2026-11-27", "2026-13-01T10:00", "2026-11-27T25:00", "tomorrow"] {
            assert_eq!(super::from_local_input(bad), None, "{bad}");
        }
    }

    #[test]
    fn time_left_reads_naturally() {
        assert_eq!(super::within(1_000, 5_000), "0 s");
        assert_eq!(super::within(72 * 3_600_000, 0), "72 h");
        assert_eq!(super::within(4 * 86_400_000, 0), "4 d");
        assert_eq!(super::within(90_000, 0), "1 min");
    }

    #[test]
    fn dates_and_countdowns_read_naturally() {
        assert_eq!(super::datetime(1_764_000_000_000), "2025-11-24 16:00");
        assert_eq!(super::countdown(45_000, 0), "45 s");
        assert_eq!(super::countdown(12 * 60_000 + 9_000, 0), "12 min 09 s");
        assert_eq!(super::countdown(2 * 3_600_000 + 5 * 60_000, 0), "2 h 05 min");
        assert_eq!(super::countdown(3 * 86_400_000 + 4 * 3_600_000, 0), "3 d 4 h");
        assert_eq!(super::countdown(0, 5_000), "0 s");
    }

    #[test]
    fn clock_times_are_hours_and_minutes() {
        assert_eq!(super::clock(0), "00:00");
        assert_eq!(super::clock((14 * 60 + 5) * 60_000 + 59_999), "14:05");
        assert_eq!(super::clock(86_400_000 + 61_000), "00:01");
    }

    #[test]
    fn ages_read_naturally() {
        assert_eq!(super::ago(0, 12_000), "12 s ago");
        assert_eq!(super::ago(0, 240_000), "4 min ago");
        assert_eq!(super::ago(0, 3 * 3_600_000 + 5), "3 h ago");
        assert_eq!(super::ago(10, 0), "0 s ago");
    }
}
