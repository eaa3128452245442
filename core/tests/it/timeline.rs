//! Timelines against a brute force: spans on whole minutes, the level read minute by minute.

use proptest::prelude::*;
use tessera_core::timeline::{Change, HOUR_MS, Span, hourly_mean, hourly_peak, in_force};

const MIN: i64 = 60_000;

fn spans() -> impl Strategy<Value = Vec<Span>> {
    proptest::collection::vec((0i64..600, 0i64..400, proptest::option::weighted(0.8, Just(())), 1u64..20_000), 0..12)
        .prop_map(|v| {
            v.into_iter()
                .map(|(from, len, ends, amount)| Span {
                    from_ms: (from - 60) * MIN,
                    to_ms: ends.map(|_| (from - 60 + len + 1) * MIN),
                    amount,
                })
                .collect()
        })
}

/// The level at each minute `[m, m + 1)`.
fn level_at(spans: &[Span], minute: i64, now: i64) -> u64 {
    let t = minute * MIN;
    spans.iter().filter(|s| s.from_ms <= t && s.to_ms.unwrap_or(now).min(now) > t).map(|s| s.amount).sum()
}

proptest! {
    #[test]
    fn hourly_figures_match_a_minute_by_minute_count(spans in spans(), now_min in 1i64..480) {
        let (start, n) = (0, 8);
        let now = now_min * MIN;
        let means = hourly_mean(&spans, start, n, now);
        let peaks = hourly_peak(&spans, start, n, now);
        for h in 0..n as i64 {
            let minutes: Vec<i64> = (h * 60..(h + 1) * 60).filter(|m| *m < now_min).collect();
            let levels: Vec<u64> = minutes.iter().map(|m| level_at(&spans, *m, now)).collect();
            let mean = if levels.is_empty() { 0.0 } else { levels.iter().sum::<u64>() as f64 / levels.len() as f64 };
            let peak = levels.iter().copied().max().unwrap_or(0);
            prop_assert!((means[h as usize] - mean).abs() < 1e-6, "hour {h}: mean {} against {mean}", means[h as usize]);
            prop_assert_eq!(peaks[h as usize], peak, "hour {}", h);
            prop_assert!(means[h as usize] <= peaks[h as usize] as f64 + 1e-6);
        }
    }

    #[test]
    fn limits_in_force_are_the_last_change_before_each_hours_end(
        times in proptest::collection::btree_set(0i64..(10 * 60), 0..6),
        values in proptest::collection::vec(proptest::option::of(0u64..100), 7),
    ) {
        // A chain of changes: values[0] -> values[1] -> ... at the given minutes.
        let times: Vec<i64> = times.into_iter().collect();
        let changes: Vec<Change> = times
            .iter()
            .enumerate()
            .map(|(i, t)| Change { at_ms: t * MIN, before: values[i], after: values[i + 1] })
            .collect();
        let now = values[times.len()];
        let got = in_force(now, &changes, 0, 10);
        for h in 0..10i64 {
            let end = (h + 1) * HOUR_MS;
            let applied = changes.iter().filter(|c| c.at_ms < end).count();
            prop_assert_eq!(got[h as usize], values[applied], "hour {}", h);
        }
    }
}
