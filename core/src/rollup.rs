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

/// About the most rows of one device a mean reads ([`Tier::for_mean`]).
pub const MEAN_ROWS: i64 = 144;

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

    /// The series a mean over `[from_ms, to_ms)` reads at `now_ms`: as a read with [`MEAN_ROWS`] columns, so that a
    /// device's mean sums at most about that many rows (a bucket the span starts or ends in counts whole: the
    /// error is at most one bucket at each end, under 1/[`MEAN_ROWS`] of the span once it is past a minute's
    /// resolution).
    pub fn for_mean(from_ms: i64, to_ms: i64, now_ms: i64) -> Tier {
        Tier::for_read(from_ms, (to_ms - from_ms) / MEAN_ROWS, now_ms)
    }
}

/// The rows whose sum is a device's mean over `[s, e)`, in a read whose whole buckets come from `coarse` at
/// `now_ms`: per series, the bucket starts `[lo, hi)` to sum. Whole buckets of `coarse` inside the window make its
/// middle; its edges come from the minutes where they are still kept (a minute the window starts in counts whole,
/// as a minute is the finest there is), and from the 10-minute series before that (a 10-minute bucket an edge falls
/// in counts whole). So a long window sums few rows and its edges take in at most a minute (10 minutes, past 48
/// hours) of another holder's use of the device; an edge older than the 10-minute series' retention is left out.
pub fn mean_parts(s: i64, e: i64, coarse: Tier, now_ms: i64) -> Vec<(Tier, i64, i64)> {
    if e <= s {
        return Vec::new();
    }
    if coarse == Tier::Minute {
        return vec![(Tier::Minute, Tier::Minute.bucket_of(s), e)];
    }
    let c = coarse.bucket_ms();
    let (a, b) = (coarse.bucket_of(s + c - 1), coarse.bucket_of(e));
    let mut parts = Vec::new();
    let (x, y) = if a < b {
        parts.push((coarse, a, b));
        (a, b)
    } else {
        (e, e)
    };
    // Minutes are read from the first 10-minute boundary at or after the oldest kept minute, 10-minute rows before
    // it: no stretch is read from both.
    let ten = Tier::TenMinutes;
    let split = ten.bucket_of(Tier::Minute.kept_from(now_ms) + ten.bucket_ms() - 1);
    for (lo, hi) in [(s, x), (y, e)] {
        if lo >= hi {
            continue;
        }
        let minutes_from = lo.max(split);
        if minutes_from < hi {
            parts.push((Tier::Minute, Tier::Minute.bucket_of(minutes_from).max(split), hi));
        }
        let tens_to = hi.min(split);
        if lo < tens_to {
            parts.push((ten, ten.bucket_of(lo), tens_to));
        }
    }
    parts
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
        // Means: two hours of minutes, a day of 10 minutes, a week of hours.
        assert_eq!(Tier::for_mean(NOW - 2 * HOUR_MS, NOW, NOW), Tier::Minute);
        assert_eq!(Tier::for_mean(NOW - DAY_MS, NOW, NOW), Tier::TenMinutes);
        assert_eq!(Tier::for_mean(NOW - 7 * DAY_MS, NOW, NOW), Tier::Hour);
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
    fn a_mean_sums_whole_coarse_buckets_inside_and_fine_rows_at_its_edges() {
        let now = NOW - NOW.rem_euclid(DAY_MS) + 12 * HOUR_MS;
        // A recent window of 3 h 25 min, read at hours: hours inside, minutes at both edges.
        let s = now - 5 * HOUR_MS + 20 * MINUTE_MS + 30_000;
        let e = now - 2 * HOUR_MS + 45 * MINUTE_MS;
        let parts = mean_parts(s, e, Tier::Hour, now);
        assert_eq!(
            parts,
            vec![
                (Tier::Hour, now - 4 * HOUR_MS, now - 2 * HOUR_MS),
                (Tier::Minute, s - 30_000, now - 4 * HOUR_MS),
                (Tier::Minute, now - 2 * HOUR_MS, e),
            ]
        );
        // Every minute of the window is in exactly one part (the one it starts in counts whole).
        let mut m = Tier::Minute.bucket_of(s);
        while m < e {
            let covering = parts.iter().filter(|(t, lo, hi)| {
                let b = t.bucket_of(m);
                *lo <= b && b < *hi
            });
            assert_eq!(covering.count(), 1, "minute {m}");
            m += MINUTE_MS;
        }
        // Within one hour: no middle, the minutes only.
        let short = mean_parts(now - 50 * MINUTE_MS, now - 10 * MINUTE_MS, Tier::Hour, now);
        assert_eq!(short, vec![(Tier::Minute, now - 50 * MINUTE_MS, now - 10 * MINUTE_MS)]);
        // Older than the minutes: the edges from 10-minute rows, the bucket an edge falls in whole.
        let s = now - 10 * DAY_MS + 5 * MINUTE_MS;
        let e = now - 9 * DAY_MS + 15 * MINUTE_MS;
        let parts = mean_parts(s, e, Tier::Hour, now);
        assert_eq!(
            parts,
            vec![
                (Tier::Hour, now - 10 * DAY_MS + HOUR_MS, now - 9 * DAY_MS),
                (Tier::TenMinutes, now - 10 * DAY_MS, now - 10 * DAY_MS + HOUR_MS),
                (Tier::TenMinutes, now - 9 * DAY_MS, e),
            ]
        );
        // A window across the oldest kept minute: 10-minute rows before the split, minutes after it.
        let split = Tier::Minute.kept_from(now);
        let parts = mean_parts(split - 25 * MINUTE_MS, split + 25 * MINUTE_MS, Tier::TenMinutes, now);
        let tens: i64 = parts.iter().filter(|p| p.0 == Tier::TenMinutes).map(|p| (p.2 - p.1) / (10 * MINUTE_MS)).sum();
        assert!(parts.iter().all(|p| p.0 != Tier::Minute || p.1 >= split), "{parts:?}");
        assert!(tens >= 2, "{parts:?}");
        // Minute reads sum the minutes of the window.
        assert_eq!(mean_parts(s, e, Tier::Minute, now), vec![(Tier::Minute, s, e)]);
        assert!(mean_parts(e, s, Tier::Hour, now).is_empty());
    }
}
