//! Hourly timelines of a tenant's quota on one resource: the limit (and maximum) in force, what its live requests
//! held and what its running allocations used, as time-weighted means over each UTC hour, plus the peak held.
//!
//! The inputs are what the store keeps anyway: the limit's history (each change with its time, the value before
//! and after), and spans during which an amount counted (a request holds its charge from its creation until it
//! ends; an allocation uses its share of its request's charge from activation until release). Nothing is sampled,
//! so a timeline over 90 days is exact for any hour, including the hours before it was first asked for.

use crate::quota::Milli;

/// One hour, in milliseconds.
pub const HOUR_MS: i64 = 3_600_000;
/// The longest timeline, in days.
pub const MAX_DAYS: u32 = 90;

/// An amount that counted during `[from_ms, to_ms)`; `to_ms` `None`: it still counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// Start, UTC ms.
    pub from_ms: i64,
    /// End, UTC ms (`None`: still counting).
    pub to_ms: Option<i64>,
    /// Amount, in thousandths.
    pub amount: Milli,
}

/// A change of a limit: at `at_ms` it went from `before` to `after` (`None`: unlimited, or unset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change {
    /// When, UTC ms.
    pub at_ms: i64,
    /// The value before.
    pub before: Option<Milli>,
    /// The value after.
    pub after: Option<Milli>,
}

/// The hours a timeline of `days` days ending at `now_ms` covers: the start of the first hour and how many hours,
/// the last one being the hour `now_ms` is in. `days` is clamped to `1..=MAX_DAYS`.
pub fn hours(now_ms: i64, days: u32) -> (i64, usize) {
    let days = days.clamp(1, MAX_DAYS);
    let last = now_ms.div_euclid(HOUR_MS) * HOUR_MS;
    let n = days as usize * 24;
    (last - (n as i64 - 1) * HOUR_MS, n)
}

/// The time-weighted mean of the sum of `spans` over each hour from `start_ms` (`n` hours), counting only up to
/// `now_ms` (the hour `now_ms` is in is averaged over its elapsed part; later hours are 0). In thousandths.
pub fn hourly_mean(spans: &[Span], start_ms: i64, n: usize, now_ms: i64) -> Vec<f64> {
    let mut sums = vec![0f64; n];
    let end_all = start_ms + n as i64 * HOUR_MS;
    for s in spans {
        let from = s.from_ms.max(start_ms);
        let to = s.to_ms.unwrap_or(now_ms).min(now_ms).min(end_all);
        if to <= from || s.amount == 0 {
            continue;
        }
        let first = ((from - start_ms) / HOUR_MS) as usize;
        let last = ((to - 1 - start_ms) / HOUR_MS) as usize;
        for (h, sum) in sums.iter_mut().enumerate().take(last + 1).skip(first) {
            let h0 = start_ms + h as i64 * HOUR_MS;
            let overlap = to.min(h0 + HOUR_MS) - from.max(h0);
            *sum += s.amount as f64 * overlap as f64;
        }
    }
    sums.iter()
        .enumerate()
        .map(|(h, sum)| {
            let h0 = start_ms + h as i64 * HOUR_MS;
            let elapsed = (now_ms.min(h0 + HOUR_MS) - h0).max(0);
            if elapsed == 0 { 0.0 } else { sum / elapsed as f64 }
        })
        .collect()
}

/// The highest sum of `spans` at any moment of each hour from `start_ms` (`n` hours), up to `now_ms`. In
/// thousandths.
pub fn hourly_peak(spans: &[Span], start_ms: i64, n: usize, now_ms: i64) -> Vec<Milli> {
    let end_all = (start_ms + n as i64 * HOUR_MS).min(now_ms.max(start_ms));
    // Every start and end inside the window, with the level before the window opened.
    let mut level: i128 = 0;
    let mut events: Vec<(i64, i128)> = Vec::new();
    for s in spans {
        let to = s.to_ms.unwrap_or(i64::MAX);
        if to <= start_ms || s.from_ms >= end_all || to <= s.from_ms {
            continue;
        }
        if s.from_ms <= start_ms {
            level += i128::from(s.amount);
        } else {
            events.push((s.from_ms, i128::from(s.amount)));
        }
        if to < end_all {
            events.push((to, -i128::from(s.amount)));
        }
    }
    // Ends before starts at the same instant: `[a, b)` and `[b, c)` never count together.
    events.sort_by_key(|&(at, d)| (at, d > 0));
    let mut peaks = vec![0 as Milli; n];
    let mut e = 0;
    for (h, peak) in peaks.iter_mut().enumerate() {
        let h0 = start_ms + h as i64 * HOUR_MS;
        if h0 >= end_all {
            break;
        }
        let h1 = h0 + HOUR_MS;
        // What changes at the hour's very start belongs to it, before its first level is read.
        while e < events.len() && events[e].0 <= h0 {
            level += events[e].1;
            e += 1;
        }
        let mut top = level;
        while e < events.len() && events[e].0 < h1 {
            level += events[e].1;
            top = top.max(level);
            e += 1;
        }
        *peak = Milli::try_from(top.max(0)).unwrap_or(Milli::MAX);
    }
    peaks
}

/// The value in force at the end of each hour from `start_ms` (`n` hours), from the value now and the changes
/// (any order): at a time before a change, the value is that change's `before`.
pub fn in_force(now: Option<Milli>, changes: &[Change], start_ms: i64, n: usize) -> Vec<Option<Milli>> {
    let mut sorted: Vec<&Change> = changes.iter().collect();
    sorted.sort_by_key(|c| c.at_ms);
    (0..n)
        .map(|h| {
            let end = start_ms + (h as i64 + 1) * HOUR_MS;
            // The first change after the hour's end says what held before it; none: the value now.
            sorted.iter().find(|c| c.at_ms >= end).map_or(now, |c| c.before)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: i64 = HOUR_MS;

    #[test]
    fn means_weigh_by_time_and_stop_at_now() {
        // 2 units for the second half of hour 0 and all of hour 1; 4 more from 1.5 h on, still held.
        let spans = [
            Span { from_ms: H / 2, to_ms: Some(2 * H), amount: 2000 },
            Span { from_ms: 3 * H / 2, to_ms: None, amount: 4000 },
        ];
        let now = 2 * H + H / 4;
        let m = hourly_mean(&spans, 0, 4, now);
        assert_eq!(m, vec![1000.0, 4000.0, 4000.0, 0.0], "hour 2 averages its elapsed quarter only");
        let p = hourly_peak(&spans, 0, 4, now);
        assert_eq!(p, vec![2000, 6000, 4000, 0]);
    }

    #[test]
    fn a_span_ending_where_another_starts_never_counts_twice() {
        let spans = [
            Span { from_ms: 0, to_ms: Some(H / 2), amount: 3000 },
            Span { from_ms: H / 2, to_ms: Some(H), amount: 3000 },
        ];
        assert_eq!(hourly_peak(&spans, 0, 1, H), vec![3000]);
        assert_eq!(hourly_mean(&spans, 0, 1, H), vec![3000.0]);
    }

    #[test]
    fn limits_in_force_replay_the_changes_backwards() {
        let changes = [
            Change { at_ms: 5 * H + 10, before: Some(4000), after: Some(8000) },
            Change { at_ms: 2 * H, before: None, after: Some(4000) },
        ];
        let v = in_force(Some(8000), &changes, 0, 7);
        // A change at 2 h exactly takes effect in the hour that starts then.
        assert_eq!(v, vec![None, None, Some(4000), Some(4000), Some(4000), Some(8000), Some(8000)]);
    }

    #[test]
    fn the_window_ends_in_the_hour_of_now() {
        let (start, n) = hours(10 * H + 5, 1);
        assert_eq!(n, 24);
        assert_eq!(start + (n as i64 - 1) * H, 10 * H);
        assert_eq!(hours(0, 500).1, MAX_DAYS as usize * 24, "clamped");
    }
}
