//! How long stored telemetry is kept, and at what resolution.
//!
//! Every device's samples are stored three times, each finer series kept for less time: one row per minute for
//! [`Tier::Minute`]'s retention (48 hours: the last two days at full resolution, what idle detection and a day's
//! heatmap read), one per 10 minutes for 35 days (a week's right-sizing or a month's heatmap and report at
//! 10-minute columns), and one per hour for 400 days (a year of chargeback with a month to spare). A device stores
//! at most 2,880 + 5,040 + 9,600 rows, whatever the history's length. A read picks the finest series whose
//! retention still covers the start of its range, and no finer one than its columns need ([`Tier::for_read`]), so
//! the rows it reads are bounded by its answer: a week's heatmap at 20-minute columns reads 1,008 rows a device, not
//! 10,080.

/// One stored series of telemetry: its bucket and how long its rows are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    /// One row per device and minute.
    Minute,
    /// One row per device and 10 minutes.
    TenMinutes,
    /// One row per device and hour.
    Hour,
}

const MINUTE_MS: i64 = 60_000;
const HOUR_MS: i64 = 3_600_000;
const DAY_MS: i64 = 86_400_000;

impl Tier {
    /// Every tier, finest first.
    pub const ALL: [Tier; 3] = [Tier::Minute, Tier::TenMinutes, Tier::Hour];

    /// The length of one row, ms.
    pub const fn bucket_ms(self) -> i64 {
        match self {
            Tier::Minute => MINUTE_MS,
            Tier::TenMinutes => 10 * MINUTE_MS,
            Tier::Hour => HOUR_MS,
        }
    }

    /// How long its rows are kept, ms.
    pub const fn retention_ms(self) -> i64 {
        match self {
            Tier::Minute => 48 * HOUR_MS,
            Tier::TenMinutes => 35 * DAY_MS,
            Tier::Hour => 400 * DAY_MS,
        }
    }

    /// The start of the bucket `t_ms` falls in.
    pub const fn bucket_of(self, t_ms: i64) -> i64 {
        t_ms - t_ms.rem_euclid(self.bucket_ms())
    }

    /// Minutes one row covers.
    pub const fn minutes(self) -> i64 {
        self.bucket_ms() / MINUTE_MS
    }

    /// The name a reader is told (`source` of a heatmap).
    pub const fn name(self) -> &'static str {
        match self {
            Tier::Minute => "minutes",
            Tier::TenMinutes => "ten_minutes",
            Tier::Hour => "hours",
        }
    }

    /// The oldest time whose rows are still kept at `now_ms`: rows of buckets starting before it may be gone.
    pub const fn kept_from(self, now_ms: i64) -> i64 {
        self.bucket_of(now_ms - self.retention_ms())
    }

    /// The series a read of `[from_ms, …)` at columns of `step_ms` takes at `now_ms`: the coarsest whose bucket is
    /// no longer than the step (finer rows would only be summed again), but never one whose retention no longer
    /// covers `from_ms` (its oldest rows would be missing); the hour series when none covers it.
    pub fn for_read(from_ms: i64, step_ms: i64, now_ms: i64) -> Tier {
        let covering = Tier::ALL.into_iter().find(|t| from_ms >= t.kept_from(now_ms)).unwrap_or(Tier::Hour);
        let by_step = Tier::ALL.into_iter().rev().find(|t| t.bucket_ms() <= step_ms).unwrap_or(Tier::Minute);
        covering.max(by_step)
    }

    /// The series a distribution over `[from_ms, …)` reads at `now_ms` (right-sizing's percentiles): the finest
    /// that still covers `from_ms`.
    pub fn for_span(from_ms: i64, now_ms: i64) -> Tier {
        Tier::for_read(from_ms, MINUTE_MS, now_ms)
    }
}

/// The rows whose sum is a device's mean over `[s, e)` at `now_ms`: per series, the bucket starts `[lo, hi)` to
/// sum, every minute of the window in exactly one of them. Whole hours inside the window make its middle, whole
/// 10-minute buckets the rest of it, and the minutes its edges, where they are still kept (a minute the window
/// starts in counts whole, as a minute is the finest there is); before the oldest kept minute a 10-minute bucket an
/// edge falls in counts whole, and an edge older than the 10-minute series' retention is left out. So a mean sums at
/// most the window's whole hours and 30 rows more (at each end at most 6 10-minute rows and 10 minutes: a day is at
/// most 54 rows, where the minutes alone were 1,440), its edges exact to the minute within the minutes' retention.
pub fn mean_parts(s: i64, e: i64, now_ms: i64) -> Vec<(Tier, i64, i64)> {
    let mut parts = Vec::new();
    if e <= s {
        return parts;
    }
    let hour = Tier::Hour.bucket_ms();
    let (a, b) = (Tier::Hour.bucket_of(s + hour - 1), Tier::Hour.bucket_of(e));
    if a < b {
        parts.push((Tier::Hour, a, b));
        tens_and_minutes(s, a, now_ms, &mut parts);
        tens_and_minutes(b, e, now_ms, &mut parts);
    } else {
        tens_and_minutes(s, e, now_ms, &mut parts);
    }
    parts
}

/// [`mean_parts`] of `[s, e)` from the 10-minute series and the minutes: whole 10-minute buckets inside it, minutes
/// at its edges from the first 10-minute boundary at or after the oldest kept minute (no stretch is read from
/// both), and before that boundary the 10-minute buckets the window falls in, whole.
fn tens_and_minutes(s: i64, e: i64, now_ms: i64, parts: &mut Vec<(Tier, i64, i64)>) {
    if e <= s {
        return;
    }
    let ten = Tier::TenMinutes;
    let split = ten.bucket_of(Tier::Minute.kept_from(now_ms) + ten.bucket_ms() - 1);
    let old_to = e.min(split);
    if s < old_to {
        parts.push((ten, ten.bucket_of(s), old_to));
    }
    let s = s.max(split);
    if e <= s {
        return;
    }
    let (a, b) = (ten.bucket_of(s + ten.bucket_ms() - 1), ten.bucket_of(e));
    if a < b {
        parts.push((ten, a, b));
        for (lo, hi) in [(s, a), (b, e)] {
            if lo < hi {
                parts.push((Tier::Minute, Tier::Minute.bucket_of(lo), hi));
            }
        }
    } else {
        parts.push((Tier::Minute, Tier::Minute.bucket_of(s), e));
    }
}

/// How long after an hour ends an allocation's use of it is kept (see [`kept_cover`]): telemetry of an hour that
/// arrives later than this makes the hours from it on be worked out again.
pub const KEEP_SETTLE_MS: i64 = 15 * MINUTE_MS;

/// How much earlier than [`KEEP_SETTLE_MS`] a write counts its telemetry as late: room for the write's own
/// transaction (it may wait for the database's write lock) and for replicas' clocks that differ, so that no minute
/// a keeper may not have read is taken as on time.
pub const LATE_MARGIN_MS: i64 = 5 * MINUTE_MS;

/// Whether telemetry of the minute `minute_ms` written at `now_ms` is late for the kept hours: its hour may have
/// been kept already, or be being kept ([`LATE_MARGIN_MS`] before it settles).
pub const fn late_for_kept_hours(minute_ms: i64, now_ms: i64) -> bool {
    Tier::Hour.bucket_of(minute_ms) + HOUR_MS + KEEP_SETTLE_MS - LATE_MARGIN_MS <= now_ms
}

/// How an allocation's mean over part of its use is summed when some of its hours are kept (each kept hour holds
/// its device's sums over the allocation's part of that hour: from its activation or the hour's start to its
/// release or the hour's end).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptCover {
    /// The kept hours to sum: those starting in `[lo, hi)`; `None` when none lies within the span.
    pub hours: Option<(i64, i64)>,
    /// The rest of the span, read from the stored series ([`mean_parts`] of each).
    pub rest: Vec<(i64, i64)>,
}

/// [`KeptCover`] of the allocation's use over `[s, e)`, where it was active from `activated` to `released`
/// (`None`: still held) and the hours starting in `[kept_from, kept_to)` are kept. A kept hour is summed only when
/// the allocation's part of it lies inside the span: inside it whole, or cut at an end that is the activation or
/// the release itself. Every moment of `[s, e)` is then summed once, from a kept hour or from the rest.
/// The span lies within the allocation's use: `activated <= s` and `e <= released`.
pub fn kept_cover(s: i64, e: i64, activated: i64, released: Option<i64>, kept_from: i64, kept_to: i64) -> KeptCover {
    debug_assert!(activated <= s && released.is_none_or(|r| e <= r), "a span outside the use: {s}-{e}");
    if e <= s {
        return KeptCover { hours: None, rest: Vec::new() };
    }
    let hour = Tier::Hour;
    let first = if s <= activated { hour.bucket_of(activated) } else { hour.bucket_of(s + HOUR_MS - 1) };
    let end = if released.is_some_and(|r| e >= r) { hour.bucket_of(e + HOUR_MS - 1) } else { hour.bucket_of(e) };
    let (lo, hi) = (first.max(kept_from), end.min(kept_to));
    if lo >= hi {
        return KeptCover { hours: None, rest: vec![(s, e)] };
    }
    let (covered_from, covered_to) = (s.max(lo), e.min(hi));
    let rest = [(s, covered_from), (covered_to, e)].into_iter().filter(|(a, b)| a < b).collect();
    KeptCover { hours: Some((lo, hi)), rest }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000_000;

    #[test]
    fn buckets_are_aligned_to_the_epoch_and_nest() {
        for t in Tier::ALL {
            assert_eq!(t.bucket_of(NOW + 1).rem_euclid(t.bucket_ms()), 0);
            assert!(t.bucket_of(NOW + 1) <= NOW + 1 && NOW + 1 < t.bucket_of(NOW + 1) + t.bucket_ms());
        }
        // A coarser bucket is a whole number of finer ones, so a finer row belongs to one coarser row.
        assert_eq!(Tier::TenMinutes.bucket_ms() % Tier::Minute.bucket_ms(), 0);
        assert_eq!(Tier::Hour.bucket_ms() % Tier::TenMinutes.bucket_ms(), 0);
        assert_eq!(Tier::Minute.bucket_of(-1), -MINUTE_MS);
    }

    #[test]
    fn a_read_takes_the_coarsest_series_its_step_allows_that_still_covers_its_start() {
        // The last hour at 1-minute columns: the minutes.
        assert_eq!(Tier::for_read(NOW - HOUR_MS, MINUTE_MS, NOW), Tier::Minute);
        // The last day at 2-minute columns: still the minutes (10-minute rows cannot make 2-minute columns).
        assert_eq!(Tier::for_read(NOW - DAY_MS, 2 * MINUTE_MS, NOW), Tier::Minute);
        // A week at 20-minute columns: the 10-minute series.
        assert_eq!(Tier::for_read(NOW - 7 * DAY_MS, 20 * MINUTE_MS, NOW), Tier::TenMinutes);
        // Three days at 1-minute columns: the minutes are gone that far back.
        assert_eq!(Tier::for_read(NOW - 3 * DAY_MS, MINUTE_MS, NOW), Tier::TenMinutes);
        // Ninety days: only the hours cover it.
        assert_eq!(Tier::for_read(NOW - 90 * DAY_MS, 10 * MINUTE_MS, NOW), Tier::Hour);
        // A day at 2-hour columns: the hours.
        assert_eq!(Tier::for_read(NOW - DAY_MS, 2 * HOUR_MS, NOW), Tier::Hour);
        // Older than every retention: the hours (nothing is there, and the read says so by being empty).
        assert_eq!(Tier::for_read(NOW - 900 * DAY_MS, MINUTE_MS, NOW), Tier::Hour);
        assert_eq!(Tier::for_span(NOW - 2 * HOUR_MS, NOW), Tier::Minute);
        assert_eq!(Tier::for_span(NOW - 7 * DAY_MS, NOW), Tier::TenMinutes);
    }

    #[test]
    fn the_edge_of_a_retention_is_covered_by_its_series() {
        for t in Tier::ALL {
            let edge = t.kept_from(NOW);
            assert_eq!(Tier::for_span(edge, NOW), t);
            assert!(edge <= NOW - t.retention_ms());
        }
        assert_eq!(Tier::for_span(Tier::Minute.kept_from(NOW) - 1, NOW), Tier::TenMinutes);
    }

    #[test]
    fn a_mean_sums_whole_hours_inside_whole_ten_minutes_beside_them_and_minutes_at_its_edges() {
        let now = NOW - NOW.rem_euclid(DAY_MS) + 12 * HOUR_MS;
        // A recent window of 3 h 25 min: two hours inside, then 10-minute rows, then minutes at both edges.
        let s = now - 5 * HOUR_MS + 20 * MINUTE_MS + 30_000;
        let e = now - 2 * HOUR_MS + 45 * MINUTE_MS;
        assert_eq!(
            mean_parts(s, e, now),
            vec![
                (Tier::Hour, now - 4 * HOUR_MS, now - 2 * HOUR_MS),
                (Tier::TenMinutes, now - 5 * HOUR_MS + 30 * MINUTE_MS, now - 4 * HOUR_MS),
                (Tier::Minute, s - 30_000, now - 5 * HOUR_MS + 30 * MINUTE_MS),
                (Tier::TenMinutes, now - 2 * HOUR_MS, now - 2 * HOUR_MS + 40 * MINUTE_MS),
                (Tier::Minute, now - 2 * HOUR_MS + 40 * MINUTE_MS, e),
            ]
        );
        // Within one 10-minute bucket: the minutes only.
        let short = mean_parts(now - 9 * MINUTE_MS, now - 2 * MINUTE_MS, now);
        assert_eq!(short, vec![(Tier::Minute, now - 9 * MINUTE_MS, now - 2 * MINUTE_MS)]);
        // Older than the minutes: the edges from 10-minute rows, the bucket an edge falls in whole.
        let s = now - 10 * DAY_MS + 5 * MINUTE_MS;
        let e = now - 9 * DAY_MS + 15 * MINUTE_MS;
        assert_eq!(
            mean_parts(s, e, now),
            vec![
                (Tier::Hour, now - 10 * DAY_MS + HOUR_MS, now - 9 * DAY_MS),
                (Tier::TenMinutes, now - 10 * DAY_MS, now - 10 * DAY_MS + HOUR_MS),
                (Tier::TenMinutes, now - 9 * DAY_MS, e),
            ]
        );
        assert!(mean_parts(e, s, now).is_empty());
    }

    #[test]
    fn every_minute_of_a_window_is_summed_once_from_few_rows() {
        let now = NOW - NOW.rem_euclid(DAY_MS) + 12 * HOUR_MS + 17 * MINUTE_MS + 4_000;
        let split = Tier::TenMinutes.bucket_of(Tier::Minute.kept_from(now) + 10 * MINUTE_MS - 1);
        let mut x: u64 = 3;
        let mut next = |n: i64| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            i64::try_from((x >> 33) % u64::try_from(n).unwrap_or(1)).unwrap_or(0)
        };
        for _ in 0..400 {
            // Windows from seconds to ten days long, ending anywhere in the last forty days.
            let e = now - next(40 * DAY_MS);
            let longest = [10 * MINUTE_MS, 3 * HOUR_MS, 10 * DAY_MS][usize::try_from(next(3)).unwrap_or(0)];
            let s = e - 1 - next(longest);
            let parts = mean_parts(s, e, now);
            let rows: i64 = parts.iter().map(|(t, lo, hi)| (hi - lo + t.bucket_ms() - 1) / t.bucket_ms()).sum();
            let hours = (e - s) / HOUR_MS;
            assert!(rows <= hours + 30, "{rows} rows for {hours} h: {parts:?}");
            // Each minute the window touches is in exactly one part (before the oldest kept minute, through its
            // 10-minute bucket).
            let mut m = Tier::Minute.bucket_of(s);
            while m < e {
                let covering = parts
                    .iter()
                    .filter(|(t, lo, hi)| {
                        let b = t.bucket_of(m);
                        *lo <= b && b < *hi && (*t != Tier::Minute || m >= split)
                    })
                    .count();
                assert_eq!(covering, 1, "minute {m} of [{s}, {e}): {parts:?}");
                m += MINUTE_MS;
            }
        }
    }

    /// The allocation's part of the hour starting at `h`, as kept.
    fn part(h: i64, activated: i64, released: Option<i64>) -> (i64, i64) {
        (h.max(activated), (h + HOUR_MS).min(released.unwrap_or(i64::MAX)))
    }

    #[test]
    fn kept_hours_cover_whole_hours_and_the_ends_that_are_the_allocations_own() {
        let h = |n: i64| n * HOUR_MS;
        let m = |n: i64| n * MINUTE_MS;
        // Held from 10:20 to 14:40, the hours 0-24 kept: its whole use from the kept hours 10-14, nothing else.
        let c = kept_cover(h(10) + m(20), h(14) + m(40), h(10) + m(20), Some(h(14) + m(40)), 0, h(24));
        assert_eq!(c, KeptCover { hours: Some((h(10), h(15))), rest: vec![] });
        // The same use within a period from 11:05: the hour 11 is cut by the period, not by the activation.
        let c = kept_cover(h(11) + m(5), h(14) + m(40), h(10) + m(20), Some(h(14) + m(40)), 0, h(24));
        assert_eq!(c, KeptCover { hours: Some((h(12), h(15))), rest: vec![(h(11) + m(5), h(12))] });
        // Still held, the period ending at 13:30: the hour 13 is the period's to cut.
        let c = kept_cover(h(10) + m(20), h(13) + m(30), h(10) + m(20), None, 0, h(24));
        assert_eq!(c, KeptCover { hours: Some((h(10), h(13))), rest: vec![(h(13), h(13) + m(30))] });
        // Only the hours up to 12 kept: the rest from the series.
        let c = kept_cover(h(10) + m(20), h(14) + m(40), h(10) + m(20), Some(h(14) + m(40)), 0, h(12));
        assert_eq!(c, KeptCover { hours: Some((h(10), h(12))), rest: vec![(h(12), h(14) + m(40))] });
        // Nothing kept in the span: all of it from the series.
        let c = kept_cover(h(10) + m(20), h(10) + m(50), h(10) + m(20), Some(h(10) + m(50)), h(11), h(20));
        assert_eq!(c, KeptCover { hours: None, rest: vec![(h(10) + m(20), h(10) + m(50))] });
        // Within one hour, cut by the period on both sides.
        let c = kept_cover(h(10) + m(25), h(10) + m(35), h(10) + m(20), Some(h(10) + m(50)), 0, h(20));
        assert_eq!(c, KeptCover { hours: None, rest: vec![(h(10) + m(25), h(10) + m(35))] });
    }

    #[test]
    fn every_minute_of_a_span_is_summed_once_from_kept_hours_or_the_series() {
        let mut seed = 0x5eed_u64;
        let mut next = |n: i64| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            i64::try_from((seed >> 33) % u64::try_from(n).unwrap_or(1)).unwrap_or(0)
        };
        for _ in 0..2_000 {
            let activated = next(48 * 60) * MINUTE_MS;
            let released = (next(4) > 0).then(|| activated + (1 + next(30 * 60)) * MINUTE_MS);
            let held_to = released.unwrap_or(80 * HOUR_MS);
            let s = activated + next(3).min(1) * next(40 * 60) * MINUTE_MS;
            let e = if next(2) == 0 { held_to } else { s + next(30 * 60) * MINUTE_MS };
            let (s, e) = (s.min(held_to), e.min(held_to));
            let kept_from = next(40) * HOUR_MS;
            let kept_to = kept_from + next(60) * HOUR_MS;
            let c = kept_cover(s, e, activated, released, kept_from, kept_to);
            let mut counted = vec![0_u8; usize::try_from((e - s).max(0) / MINUTE_MS).unwrap_or(0)];
            let mut count = |a: i64, b: i64| {
                for t in (a..b).step_by(usize::try_from(MINUTE_MS).unwrap_or(1)) {
                    let i = usize::try_from((t - s) / MINUTE_MS).ok().filter(|_| t >= s && t < e);
                    let i = i.unwrap_or_else(|| panic!("minute {t} outside [{s}, {e}): {c:?}"));
                    counted[i] += 1;
                }
            };
            if let Some((lo, hi)) = c.hours {
                assert!(kept_from <= lo && hi <= kept_to, "{c:?}");
                for h in (lo..hi).step_by(usize::try_from(HOUR_MS).unwrap_or(1)) {
                    let (a, b) = part(h, activated, released);
                    count(a, b.min(held_to));
                }
            }
            for &(a, b) in &c.rest {
                count(a, b);
            }
            assert!(counted.iter().all(|&n| n == 1), "s {s} e {e} act {activated} rel {released:?}: {c:?}");
        }
    }
}
