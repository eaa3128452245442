//! Idle allocations: the mean utilisation of each device over a look-back (the last `idle_hours`), so that usage
//! reports can flag allocations that hold a slice without using it.
//!
//! The look-back is read from two sources, never both for the same time: the stored series for its older part
//! (whole hours, 10-minute rows beside them and minutes at its edges, [`tessera_core::rollup::mean_parts`]) and
//! this replica's in-memory window (1 s samples) for the rest. They meet at the *split*: the later of the
//! look-back's start and the window's start, aligned down to a whole minute, so that no stored row straddles it.
//! Stored rows count with their sample counts; each second of the window counts as one sample. Devices whose
//! agents send their telemetry to another replica have no window here: their mean is the stored part's alone.

use std::collections::HashMap;
use std::ops::RangeInclusive;

use tessera_core::rollup::{Tier, mean_parts};

use crate::app::AppState;
use crate::telemetry::{DeviceKey, Metric};
use tessera_store::StoreError;

/// Utilisation (%) below which an allocation counts as idle, unless the caller says otherwise.
pub const DEFAULT_IDLE_BELOW: f64 = 5.0;
/// How far back idleness is judged, in hours, unless the caller says otherwise.
pub const DEFAULT_IDLE_HOURS: f64 = 2.0;
/// The threshold callers may give, %.
pub const IDLE_BELOW: RangeInclusive<f64> = 0.0..=100.0;
/// The look-backs callers may give, hours (18 seconds to 30 days, the minute series' retention).
pub const IDLE_HOURS: RangeInclusive<f64> = 0.005..=720.0;

/// The look-back ending now, and where it switches from the stored minutes to the live window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lookback {
    /// Start, UTC ms.
    pub from_ms: i64,
    /// Stored minutes cover `[from_ms, split_ms)`, the live window `[split_ms, now_ms)`.
    pub split_ms: i64,
    /// End, UTC ms.
    pub now_ms: i64,
}

/// The start of the look-back of `hours` ending at `now_ms`, UTC ms.
pub fn lookback_start(now_ms: i64, hours: f64) -> i64 {
    now_ms - (hours * 3_600_000.0).round() as i64
}

impl Lookback {
    /// The last `hours` before `now_ms`, with a live window of `window_ms`.
    pub fn new(now_ms: i64, hours: f64, window_ms: i64) -> Lookback {
        let from_ms = lookback_start(now_ms, hours);
        let split = from_ms.max(now_ms - window_ms);
        Lookback { from_ms, split_ms: split - split.rem_euclid(60_000), now_ms }
    }

    /// One-second columns from `split_ms` that cover the window's part, for [`Telemetry::window_rows`]
    /// (each non-empty column is one sample).
    ///
    /// [`Telemetry::window_rows`]: crate::telemetry::Telemetry::window_rows
    pub fn window_columns(&self) -> usize {
        usize::try_from((self.now_ms - self.split_ms + 999) / 1000).unwrap_or(0)
    }
}

/// A sum of utilisation samples.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct UtilSum {
    /// Sum of the samples' utilisation, %.
    pub total: f64,
    /// How many samples.
    pub samples: f64,
}

impl UtilSum {
    /// The mean, when there was any sample.
    pub fn mean(&self) -> Option<f64> {
        (self.samples > 0.0).then(|| self.total / self.samples)
    }
}

/// Mean utilisation per device from `stored` (per device, the sums of the minute rows before the split) and
/// `window` (per device, one-second columns from the split: each value is one sample). Devices with no sample in
/// either have no mean.
pub fn util_means(
    stored: impl IntoIterator<Item = (String, UtilSum)>,
    window: &[(DeviceKey, Vec<Option<f32>>)],
) -> HashMap<String, f64> {
    let mut sums: HashMap<String, UtilSum> = stored.into_iter().collect();
    for (key, values) in window {
        let sum = sums.entry(key.device.clone()).or_default();
        for v in values.iter().flatten() {
            sum.total += f64::from(*v);
            sum.samples += 1.0;
        }
    }
    sums.into_iter().filter_map(|(device, sum)| Some((device, sum.mean()?))).collect()
}

/// Mean utilisation per device over the last `hours` before `now_ms`: of every device (`None`, a grouped read of
/// the fleet per part of the look-back) or of the devices named (a range scan each per part: a member's usage costs
/// what their allocations hold, not what the fleet holds).
pub async fn device_utilisation(
    state: &AppState,
    hours: f64,
    now_ms: i64,
    devices: Option<&std::collections::BTreeSet<String>>,
) -> Result<HashMap<String, f64>, StoreError> {
    let look = Lookback::new(now_ms, hours, state.telemetry.window_ms());
    // The rows a mean of the look-back's stored part reads (whole hours, 10-minute rows beside them, minutes at
    // its edges: [`mean_parts`]), the same for every device.
    let parts = mean_parts(look.from_ms, look.split_ms, now_ms);
    let mut read: Vec<(String, f64, i64)> = Vec::new();
    match devices {
        None => {
            for (tier, lo, hi) in parts {
                read.extend(state.store.util_sums(tier, lo, hi).await?);
            }
        }
        Some(devices) => {
            let mut by_tier: std::collections::BTreeMap<Tier, Vec<(String, i64, i64)>> = Default::default();
            for (tier, lo, hi) in parts {
                by_tier.entry(tier).or_default().extend(devices.iter().map(|d| (d.clone(), lo, hi)));
            }
            for (tier, windows) in by_tier {
                let sums = state.store.window_sums(tier, &windows).await?;
                read.extend(windows.into_iter().zip(sums).map(|((device, _, _), (w, n))| (device, w, n)));
            }
        }
    }
    let mut sums: HashMap<String, (f64, i64)> = HashMap::new();
    for (device, weighted, samples) in read.into_iter().filter(|r| r.2 > 0) {
        let sum = sums.entry(device).or_default();
        sum.0 += weighted;
        sum.1 += samples;
    }
    let stored =
        sums.into_iter().map(|(device, (total, samples))| (device, UtilSum { total, samples: samples as f64 }));
    let wanted = |d: &str, _: &str| devices.is_none_or(|set| set.contains(d));
    let window = state.telemetry.window_rows(None, wanted, Metric::Util, look.split_ms, 1000, look.window_columns());
    Ok(util_means(stored, &window))
}

/// Whether an allocation is idle: still active, active for at least the whole look-back, and used less than
/// `below` % on average over it (no samples at all is not idle: nothing is known).
pub fn is_idle(active: bool, activated_at_ms: i64, look_from_ms: i64, util_mean: Option<f64>, below: f64) -> bool {
    active && activated_at_ms <= look_from_ms && util_mean.is_some_and(|u| u < below)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000;

    fn key(device: &str) -> DeviceKey {
        DeviceKey { node_id: "n".into(), device: device.into(), gpu: "GPU-1".into(), profile: None, start: None }
    }

    #[test]
    fn the_split_is_the_later_start_aligned_down_to_a_minute() {
        let now = 1_000 * MIN + 30_000;
        // Two hours back, a 15-minute window: the window's start decides, aligned down.
        let look = Lookback::new(now, 2.0, 15 * MIN);
        assert_eq!(look.from_ms, now - 120 * MIN);
        assert_eq!(look.split_ms, 985 * MIN);
        assert_eq!(look.window_columns(), 15 * 60 + 30);
        // A look-back shorter than the window: its own start decides, and nothing is read from the store.
        let look = Lookback::new(now, 0.005, 15 * MIN);
        assert_eq!(look.from_ms, now - 18_000);
        assert_eq!(look.split_ms, 1_000 * MIN);
        assert!(look.split_ms <= look.from_ms);
        assert_eq!(look.window_columns(), 30);
    }

    #[test]
    fn stored_minutes_weigh_by_samples_and_each_window_second_is_one_sample() {
        let stored = vec![
            // 120 samples at 2 % over two minutes, one sample at 50 %.
            ("MIG-a".to_string(), UtilSum { total: 2.0 * 120.0 + 50.0, samples: 121.0 }),
            ("MIG-stored-only".to_string(), UtilSum { total: 300.0, samples: 10.0 }),
            ("MIG-nothing".to_string(), UtilSum::default()),
        ];
        let window = vec![
            (key("MIG-a"), vec![Some(10.0), None, Some(20.0)]),
            (key("MIG-window-only"), vec![None, Some(80.0), Some(90.0)]),
            (key("MIG-empty"), vec![None, None]),
        ];
        let means = util_means(stored, &window);
        let a = means["MIG-a"];
        assert!((a - (240.0 + 50.0 + 30.0) / 123.0).abs() < 1e-9, "{a}");
        assert_eq!(means["MIG-stored-only"], 30.0);
        assert_eq!(means["MIG-window-only"], 85.0);
        assert!(!means.contains_key("MIG-nothing") && !means.contains_key("MIG-empty"));
    }

    #[test]
    fn idle_needs_an_active_allocation_older_than_the_look_back_and_a_low_mean() {
        assert!(is_idle(true, 100, 100, Some(4.9), 5.0));
        assert!(!is_idle(true, 100, 100, Some(5.0), 5.0), "at the threshold is not below it");
        assert!(!is_idle(true, 101, 100, Some(0.0), 5.0), "activated within the look-back");
        assert!(!is_idle(false, 0, 100, Some(0.0), 5.0), "released");
        assert!(!is_idle(true, 0, 100, None, 5.0), "no samples");
    }
}
