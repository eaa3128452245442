//! The portal's pages.

pub mod admin;
pub mod approvals;
pub mod audit;
pub mod fleet;
pub mod heatmap;
pub mod layout;
pub mod overview;
pub mod signin;
pub mod slots;
pub mod tenant;
pub mod tokens;
pub mod usage;

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
    fn time_left_reads_naturally() {
        assert_eq!(super::within(1_000, 5_000), "0 s");
        assert_eq!(super::within(72 * 3_600_000, 0), "72 h");
        assert_eq!(super::within(4 * 86_400_000, 0), "4 d");
        assert_eq!(super::within(90_000, 0), "1 min");
    }

    #[test]
    fn ages_read_naturally() {
        assert_eq!(super::ago(0, 12_000), "12 s ago");
        assert_eq!(super::ago(0, 240_000), "4 min ago");
        assert_eq!(super::ago(0, 3 * 3_600_000 + 5), "3 h ago");
        assert_eq!(super::ago(10, 0), "0 s ago");
    }
}
