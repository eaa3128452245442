//! Telemetry kept at three resolutions, on both backends: the 10-minute and hour series are what folding the minutes
//! gives, whatever order and parts the minutes arrive in; a heatmap read from a rollup is the one the minutes give;
//! each series is kept within its retention (PostgreSQL: partitions made ahead and dropped behind); and the bytes a
//! device costs a day, and at the steady state, stay within their bound.

use std::collections::BTreeMap;

use tessera_core::rollup::Tier;
use tessera_server::services::telemetry::{Metric, cell_rows};
use tessera_server::store::Store;
use tessera_server::store::telemetry::MinuteRow;

use crate::harness::on_both_backends;

on_both_backends!(
    |db| &db.store;
    rollups_are_the_minutes_folded_and_read_as_the_minutes_read,
    each_series_is_kept_within_its_retention,
    a_device_costs_a_bounded_number_of_bytes,
    a_fleet_minute_is_written_whole_in_several_transactions,
    windowed_reads_scan_each_windows_range_of_its_device_whatever_their_number,
);

const MINUTE: i64 = 60_000;
const HOUR: i64 = 3_600_000;
const DAY: i64 = 86_400_000;

/// A minute of `device` with values that vary by minute and device.
fn minute(device: &str, node: &str, t: i64, samples: i64, k: i64) -> MinuteRow {
    MinuteRow {
        device: device.into(),
        minute_ms: t,
        node_id: node.into(),
        gpu: device.into(),
        profile: None,
        start: None,
        samples,
        util_avg: ((k * 37) % 101) as f64,
        util_max: ((k * 37) % 101) as f64 + 1.0,
        mem_used_avg: 1000.0 + ((k * 13) % 50) as f64,
        mem_used_max: Some(2000.0 + ((k * 17) % 90) as f64),
        mem_total: 81_920.0,
        // One device reports power, the other none (a MIG instance has no power reading of its own).
        power_avg: (k < 1000).then_some(100.0 + (k % 7) as f64),
        temp_max: Some(40.0 + (k % 11) as f64),
    }
}

/// What a bucket of `tier` should hold, folded here from the minutes written.
#[derive(Debug, Default)]
struct Expected {
    samples: i64,
    util: f64,
    util_max: f64,
    mem: f64,
    power: (f64, f64),
    temp_max: f64,
    mem_max: f64,
    minutes: std::collections::BTreeSet<i64>,
}

async fn rollups_are_the_minutes_folded_and_read_as_the_minutes_read(store: &Store) {
    // Three hours of two devices on two nodes; every minute written in two parts (a backlog, another replica), the
    // second part in a later write, some of them out of order.
    let t0 = (tessera_server::store::now_ms() - 4 * HOUR) / HOUR * HOUR;
    let mut written = Vec::new();
    for (d, device) in ["GPU-a", "GPU-b"].into_iter().enumerate() {
        for m in 0..180 {
            let k = m + 1000 * d as i64;
            written.push(minute(device, if d == 0 { "n1" } else { "n2" }, t0 + m * MINUTE, 40, k));
            written.push(minute(device, if d == 0 { "n1" } else { "n2" }, t0 + m * MINUTE, 20, k + 5));
        }
    }
    let (first, second): (Vec<_>, Vec<_>) = written.iter().cloned().enumerate().partition(|(i, _)| i % 2 == 0);
    let mut second: Vec<MinuteRow> = second.into_iter().map(|(_, r)| r).collect();
    second.reverse();
    for part in [first.into_iter().map(|(_, r)| r).collect::<Vec<_>>(), second] {
        for chunk in part.chunks(97) {
            store.write_minutes(chunk).await.expect("write");
        }
    }
    for tier in Tier::ALL {
        let mut expected: BTreeMap<(String, i64), Expected> = BTreeMap::new();
        for r in &written {
            let e = expected.entry((r.device.clone(), tier.bucket_of(r.minute_ms))).or_default();
            let w = r.samples as f64;
            e.samples += r.samples;
            e.util += r.util_avg * w;
            e.util_max = e.util_max.max(r.util_max);
            e.mem += r.mem_used_avg * w;
            if let Some(p) = r.power_avg {
                e.power.0 += p * w;
                e.power.1 += w;
            }
            e.temp_max = e.temp_max.max(r.temp_max.unwrap_or(0.0));
            e.mem_max = e.mem_max.max(r.mem_used_max.unwrap_or(0.0));
            e.minutes.insert(r.minute_ms);
        }
        let stored = store.series(tier, None, t0, t0 + 4 * HOUR).await.expect("series");
        assert_eq!(stored.len(), expected.len(), "{tier:?}");
        for r in &stored {
            let e = &expected[&(r.device.clone(), r.minute_ms)];
            let w = e.samples as f64;
            let close = |a: f64, b: f64| (a - b).abs() < 1e-6;
            assert_eq!(r.samples, e.samples, "{tier:?} {} {}", r.device, r.minute_ms);
            assert!(close(r.util_avg, e.util / w), "{tier:?}: {} against {}", r.util_avg, e.util / w);
            assert!(close(r.mem_used_avg, e.mem / w));
            assert!(close(r.util_max, e.util_max) && close(r.temp_max.unwrap_or(0.0), e.temp_max));
            assert!(close(r.mem_used_max.unwrap_or(0.0), e.mem_max));
            let power = (e.power.1 > 0.0).then(|| e.power.0 / e.power.1);
            assert_eq!(r.power_avg.is_some(), power.is_some(), "{tier:?} {}", r.device);
            assert!(close(r.power_avg.unwrap_or(0.0), power.unwrap_or(0.0)), "{tier:?} power");
        }
        // Right-sizing's reading counts the minutes with telemetry, once each, whatever the series.
        let used = store.device_use(tier, "GPU-a", t0, t0 + 3 * HOUR).await.expect("use");
        assert_eq!(used.minutes, 180, "{tier:?}");
        assert_eq!(used.util_minutes.iter().sum::<u64>(), 180);
        // Many windows at once read what each read alone reads, in the order asked, an unknown device empty.
        let windows: Vec<(String, i64)> =
            [("GPU-a", t0), ("GPU-b", t0 + 30 * MINUTE), ("GPU-a", t0 + 2 * HOUR), ("GPU-z", t0)]
                .into_iter()
                .map(|(d, f)| (d.to_string(), f))
                .collect();
        let together = store.devices_use(tier, &windows, t0 + 3 * HOUR).await.expect("use");
        assert_eq!(together.len(), windows.len());
        for ((device, from), got) in windows.iter().zip(&together) {
            let alone = store.device_use(tier, device, *from, t0 + 3 * HOUR).await.expect("use");
            assert_eq!(got, &alone, "{tier:?} {device} from {from}");
        }
        assert_eq!(together[3].minutes, 0);
    }
    // A heatmap at 20-minute and 1-hour columns reads the same from a rollup as from the minutes, every metric,
    // fleet-wide and of one node.
    for metric in [Metric::Util, Metric::MemUsed, Metric::MemPct, Metric::Power, Metric::Temp] {
        for (tier, step) in [(Tier::TenMinutes, 20 * MINUTE), (Tier::Hour, HOUR), (Tier::TenMinutes, HOUR)] {
            for node in [None, Some("n2")] {
                let cells = |t: Tier| store.minute_cells(t, None, node, metric, t0, step, 9, t0 + 3 * HOUR, 1000);
                let rolled = cell_rows(cells(tier).await.expect("cells"), 9);
                let minutes = cell_rows(cells(Tier::Minute).await.expect("cells"), 9);
                assert_eq!(rolled.len(), minutes.len(), "{metric:?} {tier:?}");
                for ((rk, rv), (mk, mv)) in rolled.iter().zip(&minutes) {
                    assert_eq!(rk, mk);
                    let close = rv.iter().zip(mv).all(|(a, b)| match (a, b) {
                        (Some(a), Some(b)) => (a - b).abs() < 1e-3,
                        (a, b) => a == b,
                    });
                    assert!(close, "{metric:?} {tier:?} {step}: {rv:?} against {mv:?}");
                }
            }
        }
    }
    // Sums for idle detection agree too.
    let sums = |t: Tier| store.util_sums(t, t0, t0 + 3 * HOUR);
    let (a, b) = (sums(Tier::Minute).await.expect("sums"), sums(Tier::Hour).await.expect("sums"));
    assert_eq!(a.len(), 2);
    for ((da, wa, sa), (db, wb, sb)) in a.iter().zip(&b) {
        assert_eq!((da, sa), (db, sb));
        assert!((wa - wb).abs() < 1e-3 * wa.abs().max(1.0));
    }
}

async fn each_series_is_kept_within_its_retention(store: &Store) {
    let now = tessera_server::store::now_ms();
    let t0 = now / HOUR * HOUR - HOUR;
    let rows: Vec<MinuteRow> = (0..30).map(|m| minute("GPU-k", "n1", t0 + m * MINUTE, 60, m)).collect();
    store.write_minutes(&rows).await.expect("write");
    let count = |tier: Tier| async move { store.series(tier, None, 0, i64::MAX).await.expect("series").len() };
    assert_eq!((count(Tier::Minute).await, count(Tier::TenMinutes).await, count(Tier::Hour).await), (30, 3, 1));

    let kept = store.keep_telemetry(now).await.expect("keep");
    assert_eq!(kept.rows_deleted, 0, "nothing is past its retention yet");
    let postgres = store.backend() == "postgres";
    if postgres {
        // From each retention's start to two partitions ahead: 3 + 2 days of minutes, 5 + 2 weeks of 10 minutes,
        // 14 + 2 months of hours, give or take the one the edge falls in.
        assert!((20..=32).contains(&kept.partitions_made), "{kept:?}");
        assert_eq!(store.keep_telemetry(now).await.expect("keep").partitions_made, 0, "made once");
    }
    // Past 48 hours the minutes go, the rollups stay; past 35 days the 10 minutes go; past 400 days all.
    let steps = [(now + 49 * HOUR, (0, 3, 1)), (now + 36 * DAY, (0, 0, 1)), (now + 401 * DAY, (0, 0, 0))];
    for (later, counts) in steps {
        let kept = store.keep_telemetry(later).await.expect("keep");
        assert_eq!((count(Tier::Minute).await, count(Tier::TenMinutes).await, count(Tier::Hour).await), counts);
        if postgres {
            assert!(kept.partitions_dropped > 0, "whole partitions past the retention are dropped: {kept:?}");
        }
    }
    // New minutes after the partitions moved on are still written and read.
    let late = now + 401 * DAY;
    store.write_minutes(&[minute("GPU-k", "n1", late / MINUTE * MINUTE, 60, 1)]).await.expect("write");
    assert_eq!(count(Tier::Hour).await, 1);
}

async fn a_device_costs_a_bounded_number_of_bytes(store: &Store) {
    // A day of minutes of 20 devices, written as the server writes them: every 10 s, the minutes just finished.
    const DEVICES: i64 = 20;
    let day = (tessera_server::store::now_ms() - DAY) / DAY * DAY;
    store.keep_telemetry(day + DAY).await.expect("partitions");
    let before = store.telemetry_footprint().await.expect("footprint");
    for m in 0..1440 {
        let rows: Vec<MinuteRow> = (0..DEVICES)
            .map(|d| {
                let device = format!("GPU-{:08x}-1111-2222-3333-{d:012x}", d * 7919);
                minute(&device, "0190f000-0000-7000-8000-00000000000a", day + m * MINUTE, 60, m + d)
            })
            .collect();
        store.write_minutes(&rows).await.expect("write");
        // What PostgreSQL's autovacuum does in time: the versions each merge left behind are freed for reuse by
        // the rows that come after them.
        if m % 60 == 59 {
            store.vacuum_telemetry().await.expect("vacuum");
        }
    }
    let after = store.telemetry_footprint().await.expect("footprint");
    let mut steady = 0.0;
    for (b, a) in before.iter().zip(&after) {
        let per_day = (a.bytes - b.bytes) as f64 / DEVICES as f64;
        let rows = (a.rows - b.rows) / DEVICES;
        assert_eq!(rows, 1440 / a.tier.minutes(), "{:?}", a.tier);
        let days_kept = a.tier.retention_ms() as f64 / DAY as f64;
        steady += per_day * days_kept;
        eprintln!(
            "{} ({}): {rows} rows, {:.0} bytes a device and day ({:.0} a row); kept {days_kept} days",
            a.tier.name(),
            store.backend(),
            per_day,
            per_day / rows as f64
        );
    }
    eprintln!("steady state: {:.2} MiB a device", steady / 1_048_576.0);
    // What the docs state (docs/operations.md, "Data kept and for how long"), with room for the page slack of a
    // small table and, on PostgreSQL, for the row versions merges leave until a vacuum gets to them (more when
    // other work holds it back): SQLite at most 500 bytes a stored row and 8 MiB a device at the steady state,
    // PostgreSQL at most 2,000 and 24 MiB.
    let (row_bound, device_bound) = if store.backend() == "sqlite" { (500, 8.0) } else { (2_000, 24.0) };
    for (b, a) in before.iter().zip(&after) {
        let rows = (a.rows - b.rows).max(1);
        let per_row = (a.bytes - b.bytes) / rows;
        assert!(per_row <= row_bound, "{:?}: {per_row} bytes a row", a.tier);
    }
    assert!(steady <= device_bound * 1_048_576.0, "{steady} bytes a device");
}

/// A minute of 5,000 devices is written a part at a time (other writes go between the parts), and whole: every
/// device's minute and its rollups, once.
async fn a_fleet_minute_is_written_whole_in_several_transactions(store: &Store) {
    use tessera_core::api::{DeviceSeries, Sample, TelemetryBatch};
    use tessera_server::services::telemetry::{FLUSH_ROWS, Owned, Telemetry, flush};
    const NODES: usize = 5;
    const GPUS: usize = 1000;
    const { assert!(NODES * GPUS > 2 * FLUSH_ROWS, "more than two transactions' worth") };
    let now = tessera_server::store::now_ms();
    let m = now / MINUTE * MINUTE - 3 * MINUTE;
    let telemetry = Telemetry::new(900, 100_000);
    for n in 0..NODES {
        let gpus: Vec<String> = (0..GPUS).map(|g| format!("GPU-{n:02}-{g:05}")).collect();
        let owned = Owned::of(gpus.iter().map(String::as_str), None);
        let sample =
            |t: i64, util: f32| Sample { t, util, mem_used_mib: 1.0, mem_total_mib: 10.0, power_w: None, temp_c: None };
        let devices = gpus
            .iter()
            .enumerate()
            .map(|(g, uuid)| DeviceSeries {
                device: uuid.clone(),
                gpu: uuid.clone(),
                profile: None,
                start: None,
                samples: vec![sample(m + 1_000, (g % 100) as f32), sample(m + 31_000, 50.0)],
            })
            .collect();
        let taken = telemetry.ingest(&format!("node-{n}"), &owned, TelemetryBatch { dropped: 0, devices }, m + 40_000);
        assert_eq!(taken.accepted, 2 * GPUS as u64);
    }
    let written = flush(store, &telemetry, m + 2 * MINUTE).await.expect("flush");
    assert_eq!(written, NODES * GPUS);
    assert_eq!(flush(store, &telemetry, m + 3 * MINUTE).await.expect("again"), 0, "nothing is written twice");
    for tier in Tier::ALL {
        let rows = store.series(tier, None, m - DAY, m + MINUTE).await.expect("series");
        let devices: std::collections::BTreeSet<&str> = rows.iter().map(|r| r.device.as_str()).collect();
        assert_eq!((rows.len(), devices.len()), (NODES * GPUS, NODES * GPUS), "{tier:?}");
        assert!(rows.iter().all(|r| r.samples == 2), "{tier:?}: each device's two samples, once");
        let g7 = rows.iter().find(|r| r.device == "GPU-03-00007").expect("a device");
        assert!((g7.util_avg - (7.0 + 50.0) / 2.0).abs() < 1e-6, "{tier:?}: {g7:?}");
    }
}

/// Means and right-sizing read many windows (device, range) a statement: each must be one range scan of that
/// device's rows, never a scan of the series with the windows looked up (which SQLite's planner chooses once a
/// statement has a few hundred windows unless the join order is fixed, and which cost right-sizing 3 s at 1,000
/// GPUs); and windows past one statement's share are answered as the rest.
async fn windowed_reads_scan_each_windows_range_of_its_device_whatever_their_number(store: &Store) {
    for tier in Tier::ALL {
        let table = match tier {
            Tier::Minute => "telemetry_minutes",
            Tier::TenMinutes => "telemetry_tenminutes",
            Tier::Hour => "telemetry_hours",
        };
        for n in [1, 40, 300] {
            let plans = store.window_read_plans(tier, n).await.expect("plans");
            for (k, plan) in plans.iter().enumerate() {
                if store.backend() == "postgres" {
                    let scans = !plan.contains("Seq Scan") && (k == 2 || !plan.contains("Hash"));
                    // Windows sharing one range: PostgreSQL may scan the range for every device (bounded by the
                    // range, not the series) or each device's part of it, as its statistics say.
                    let indexed = plan.contains("Index Cond: ((device = ")
                        || (k == 2 && plan.contains("Index Cond: ((minute_ms >= "));
                    assert!(scans && indexed, "{tier:?} x{n}:\n{plan}");
                } else {
                    let by_device =
                        format!("SEARCH m USING INDEX sqlite_autoindex_{table}_1 (device=? AND minute_ms>? AND");
                    assert!(plan.contains(&by_device), "{tier:?} x{n}:\n{plan}");
                    assert!(!plan.contains(&format!("{table}_minute")), "{tier:?} x{n}:\n{plan}");
                }
            }
        }
    }
    // 650 windows (three statements) over three devices' minutes: each window's sums are its rows'.
    let t0 = (tessera_server::store::now_ms() - 2 * HOUR) / HOUR * HOUR;
    let devices = ["GPU-w0", "GPU-w1", "GPU-w2"];
    let mut rows = Vec::new();
    for (d, device) in devices.iter().enumerate() {
        for m in 0..90 {
            rows.push(minute(device, "n1", t0 + m * MINUTE, 30 + d as i64, m * 3 + d as i64));
        }
    }
    store.write_minutes(&rows).await.expect("write");
    let windows: Vec<(String, i64, i64)> = (0..650)
        .map(|k: i64| {
            let lo = t0 + (k % 80) * MINUTE;
            (devices[(k % 3) as usize].to_string(), lo, lo + (1 + k % 13) * MINUTE)
        })
        .collect();
    // And windows that share their range, some with others of the same device: read as one range of their keys
    // when a range has 8 or more (the first two ranges), one window each when fewer (the third).
    let mut windows = windows;
    for (r, count) in [(0, 12), (1, 30), (2, 5)] {
        let lo = t0 + (7 + r * 11) * MINUTE + r * 1_000;
        for k in 0..count {
            windows.push((devices[(k % 3) as usize].to_string(), lo, lo + (20 + r) * MINUTE));
        }
    }
    windows.push(("GPU-none".to_string(), t0, t0 + 30 * MINUTE));
    let sums = store.window_sums(Tier::Minute, &windows).await.expect("sums");
    assert_eq!(sums.len(), windows.len());
    for ((device, lo, hi), (weighted, samples)) in windows.iter().zip(&sums) {
        let mine = rows.iter().filter(|r| &r.device == device && r.minute_ms >= *lo && r.minute_ms < *hi);
        let (w, n) = mine.fold((0.0, 0), |(w, n), r| (w + r.util_avg * r.samples as f64, n + r.samples));
        assert_eq!(*samples, n, "{device} [{lo}, {hi})");
        assert!((weighted - w).abs() < 1e-6 * w.max(1.0), "{device} [{lo}, {hi}): {weighted} against {w}");
    }
}
