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
    fn ages_read_naturally() {
        assert_eq!(super::ago(0, 12_000), "12 s ago");
        assert_eq!(super::ago(0, 240_000), "4 min ago");
        assert_eq!(super::ago(0, 3 * 3_600_000 + 5), "3 h ago");
        assert_eq!(super::ago(10, 0), "0 s ago");
    }
}
