//! Telemetry from the agents: a rolling in-memory window at full resolution (1 s by default, 15 min), minute
//! aggregates persisted for 30 days, heatmaps over either, the latest values for live views, and Prometheus
//! exposition.
//!
//! Ingest takes one lock per batch and writes fixed-size points into per-device rings (no allocation per sample
//! once a device is known). Each device also accumulates its current minute; a finished minute is queued and the
//! background task writes the queue in one transaction every few seconds. A minute that reaches the store in parts
//! (a backlog after a reconnect, or an agent that moved to another replica) is merged there, not duplicated.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use tessera_core::api::{Sample, TelemetryAccepted, TelemetryBatch};

pub use tessera_api::telemetry::{Latest, Metric};
use tessera_store::heatmap::MinuteCell;
use tessera_store::telemetry::MinuteRow;
use tessera_store::{Store, StoreError};

/// How long minute aggregates are kept by default.
pub const RETENTION_MS: i64 = 30 * 24 * 3600 * 1000;
/// Samples further in the future than this (agent clock ahead) are refused.
const MAX_AHEAD_MS: i64 = 5 * 60 * 1000;
/// Most minute rows waiting for the store (about 75 MB); past it new ones are dropped and counted (the store has
/// been away for minutes at a large fleet's rate, or hours at a small one's).
const MAX_PENDING_ROWS: usize = 300_000;
/// Longest device or GPU UUID accepted.
const MAX_ID_LEN: usize = 96;
/// Most columns a heatmap has.
pub const MAX_COLUMNS: i64 = 3600;
/// Default for the most device series kept in memory, all nodes together (each costs about 15 KiB with the
/// default 15-minute window: 16,384 series take about 240 MiB).
pub const DEFAULT_MAX_SERIES: usize = 16_384;
/// How long a series keeps its node: another node's samples for the same device are refused while the owner's are
/// this fresh (a GPU that really moved is taken over once its old node went quiet).
const OWNER_FRESH_MS: i64 = 60_000;

/// The devices a node owns: the only ones whose telemetry it may send.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Owned {
    /// Its registered GPUs' UUIDs.
    pub gpus: HashSet<String>,
    /// MIG device UUID -> the UUID of its GPU, for the instances its last status reports on its own GPUs.
    pub mig: HashMap<String, String>,
}

impl Owned {
    /// What a node with these registered GPUs owns, given its last status (whose GPUs that are not registered to
    /// it are ignored).
    pub fn of<'a>(gpus: impl IntoIterator<Item = &'a str>, status: Option<&tessera_core::api::NodeStatus>) -> Owned {
        let gpus: HashSet<String> = gpus.into_iter().map(str::to_string).collect();
        let mut mig = HashMap::new();
        for g in status.map(|s| s.gpus.as_slice()).unwrap_or_default() {
            if gpus.contains(&g.uuid) {
                for i in &g.instances {
                    mig.insert(i.uuid.clone(), g.uuid.clone());
                }
            }
        }
        Owned { gpus, mig }
    }

    /// Whether a series of `device` on `gpu` (a MIG instance when `mig`) is this node's.
    pub fn owns(&self, device: &str, gpu: &str, mig: bool) -> bool {
        self.gpus.contains(gpu) && if mig { self.mig.get(device).is_some_and(|g| g == gpu) } else { device == gpu }
    }

    /// How many series the node may have.
    pub fn len(&self) -> usize {
        self.gpus.len() + self.mig.len()
    }

    /// Whether it owns nothing.
    pub fn is_empty(&self) -> bool {
        self.gpus.is_empty()
    }
}

/// One sample in a ring, packed into 16 bytes.
#[derive(Debug, Clone, Copy, Default)]
struct Point {
    /// Seconds since the epoch (0: empty).
    t_s: u32,
    /// Milliseconds into that second.
    t_ms: u16,
    /// Utilisation in hundredths of a percent.
    util_c: u16,
    /// Power in tenths of a watt (`u16::MAX`: none).
    power_dw: u16,
    /// Temperature in tenths of a degree (`i16::MIN`: none).
    temp_dc: i16,
    /// Memory used, MiB.
    mem_used: f32,
}

impl Point {
    fn of(s: &Sample) -> Point {
        Point {
            t_s: u32::try_from(s.t.max(0) / 1000).unwrap_or(u32::MAX),
            t_ms: u16::try_from(s.t.max(0) % 1000).unwrap_or(0),
            util_c: (s.util.clamp(0.0, 100.0) * 100.0).round() as u16,
            power_dw: s.power_w.map_or(u16::MAX, |p| (p.clamp(0.0, 6553.0) * 10.0).round() as u16),
            temp_dc: s.temp_c.map_or(i16::MIN, |t| (t.clamp(-100.0, 3000.0) * 10.0).round() as i16),
            mem_used: s.mem_used_mib.max(0.0),
        }
    }

    /// The sample back (memory total from the series: the ring does not keep it).
    fn sample(&self, mem_total: f32) -> Sample {
        Sample {
            t: i64::from(self.t_s) * 1000 + i64::from(self.t_ms),
            util: f32::from(self.util_c) / 100.0,
            mem_used_mib: self.mem_used,
            mem_total_mib: mem_total,
            power_w: (self.power_dw != u16::MAX).then(|| f32::from(self.power_dw) / 10.0),
            temp_c: (self.temp_dc != i16::MIN).then(|| f32::from(self.temp_dc) / 10.0),
        }
    }

    fn value(&self, metric: Metric, mem_total: f32) -> Option<f64> {
        match metric {
            Metric::Util => Some(f64::from(self.util_c) / 100.0),
            Metric::MemUsed => Some(f64::from(self.mem_used)),
            Metric::MemPct => (mem_total > 0.0).then(|| f64::from(self.mem_used) * 100.0 / f64::from(mem_total)),
            Metric::Power => (self.power_dw != u16::MAX).then(|| f64::from(self.power_dw) / 10.0),
            Metric::Temp => (self.temp_dc != i16::MIN).then(|| f64::from(self.temp_dc) / 10.0),
        }
    }
}

/// A metric's value in a stored minute.
fn of_minute(metric: Metric, r: &MinuteRow) -> Option<f64> {
    match metric {
        Metric::Util => Some(r.util_avg),
        Metric::MemUsed => Some(r.mem_used_avg),
        Metric::MemPct => (r.mem_total > 0.0).then(|| r.mem_used_avg * 100.0 / r.mem_total),
        Metric::Power => r.power_avg,
        Metric::Temp => r.temp_max,
    }
}

/// The current minute of one device.
#[derive(Debug, Clone)]
struct MinuteAcc {
    minute_ms: i64,
    samples: i64,
    util_sum: f64,
    util_max: f64,
    mem_sum: f64,
    mem_max: f64,
    mem_total: f64,
    power_sum: f64,
    power_n: i64,
    temp_max: Option<f64>,
}

impl MinuteAcc {
    fn new(minute_ms: i64) -> MinuteAcc {
        MinuteAcc {
            minute_ms,
            samples: 0,
            util_sum: 0.0,
            util_max: 0.0,
            mem_sum: 0.0,
            mem_max: 0.0,
            mem_total: 0.0,
            power_sum: 0.0,
            power_n: 0,
            temp_max: None,
        }
    }

    fn add(&mut self, s: &Sample) {
        let util = f64::from(s.util.clamp(0.0, 100.0));
        self.samples += 1;
        self.util_sum += util;
        self.util_max = self.util_max.max(util);
        self.mem_sum += f64::from(s.mem_used_mib.max(0.0));
        self.mem_max = self.mem_max.max(f64::from(s.mem_used_mib.max(0.0)));
        self.mem_total = f64::from(s.mem_total_mib.max(0.0));
        if let Some(p) = s.power_w {
            self.power_sum += f64::from(p);
            self.power_n += 1;
        }
        if let Some(t) = s.temp_c {
            self.temp_max = Some(self.temp_max.map_or(f64::from(t), |m| m.max(f64::from(t))));
        }
    }

    fn row(&self, device: &str, series: &Series) -> MinuteRow {
        let n = self.samples.max(1) as f64;
        MinuteRow {
            device: device.to_string(),
            minute_ms: self.minute_ms,
            node_id: series.node_id.to_string(),
            gpu: series.gpu.clone(),
            profile: series.profile.clone(),
            start: series.start,
            samples: self.samples,
            util_avg: self.util_sum / n,
            util_max: self.util_max,
            mem_used_avg: self.mem_sum / n,
            mem_used_max: Some(self.mem_max),
            mem_total: self.mem_total,
            power_avg: (self.power_n > 0).then(|| self.power_sum / self.power_n as f64),
            temp_max: self.temp_max,
        }
    }
}

/// A group's part of the window ([`Telemetry::window_groups`]).
#[derive(Debug, Clone, PartialEq)]
pub struct WindowGroup {
    /// Devices with a sample in the range.
    pub devices: u32,
    /// Per column, the mean of the devices' bucket means (for temperature, the highest) and how many had one.
    pub columns: Vec<(Option<f64>, u32)>,
}

/// One device's window.
#[derive(Debug)]
struct Series {
    node_id: Arc<str>,
    gpu: String,
    profile: Option<String>,
    start: Option<u8>,
    ring: Box<[Point]>,
    mem_total: f32,
    latest: Option<Sample>,
    minute: Option<MinuteAcc>,
}

#[derive(Debug, Default)]
struct Inner {
    devices: HashMap<String, Series>,
    /// Running drop counts the agents reported, per node.
    dropped: HashMap<String, u64>,
    /// Finished minutes not written yet, one per device and minute (parts of a minute are merged here first).
    done: Pending,
}

/// Minute rows waiting for the store, by (device, minute).
#[derive(Debug, Default)]
struct Pending {
    rows: HashMap<(String, i64), MinuteRow>,
    /// Rows refused because the queue was full (the store has been away for long).
    lost: u64,
}

impl Pending {
    /// Adds a row, merging it into the one of the same device and minute (as the store does).
    fn push(&mut self, row: MinuteRow) {
        let len = self.rows.len();
        match self.rows.entry((row.device.clone(), row.minute_ms)) {
            std::collections::hash_map::Entry::Occupied(mut e) => merge(e.get_mut(), &row),
            std::collections::hash_map::Entry::Vacant(e) => {
                if len >= MAX_PENDING_ROWS {
                    self.lost += 1;
                } else {
                    e.insert(row);
                }
            }
        }
    }
}

/// Merges `add` into `into` (same device and minute): sample-weighted means, maxima kept.
fn merge(into: &mut MinuteRow, add: &MinuteRow) {
    let (a, b) = (into.samples as f64, add.samples as f64);
    let n = (a + b).max(1.0);
    into.util_avg = (into.util_avg * a + add.util_avg * b) / n;
    into.util_max = into.util_max.max(add.util_max);
    into.mem_used_avg = (into.mem_used_avg * a + add.mem_used_avg * b) / n;
    into.mem_used_max = match (into.mem_used_max, add.mem_used_max) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, y) => x.or(y),
    };
    into.mem_total = add.mem_total;
    into.power_avg = match (into.power_avg, add.power_avg) {
        (Some(x), Some(y)) => Some((x * a + y * b) / n),
        (x, y) => x.or(y),
    };
    into.temp_max = match (into.temp_max, add.temp_max) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, y) => x.or(y),
    };
    into.samples += add.samples;
}

/// The telemetry of this replica's agents.
#[derive(Debug)]
pub struct Telemetry {
    window_s: usize,
    max_series: usize,
    inner: Mutex<Inner>,
    /// Series refused since start because the node does not own the device (or another node does).
    pub refused_not_owned: AtomicU64,
    /// Series refused since start because the replica holds its most series.
    pub refused_series_limit: AtomicU64,
    /// Samples accepted since start.
    pub accepted: AtomicU64,
    /// Samples refused since start.
    pub rejected: AtomicU64,
    /// Batches received since start.
    pub batches: AtomicU64,
    /// Counts batches that brought samples, for the live streams to wait on.
    changed: tokio::sync::watch::Sender<u64>,
}

/// A window of `window_s` seconds at 1 s (at least one minute).
impl Telemetry {
    /// An empty window of `window_s` seconds, holding at most `max_series` device series.
    pub fn new(window_s: u32, max_series: usize) -> Telemetry {
        Telemetry {
            window_s: usize::try_from(window_s.max(60)).unwrap_or(900),
            max_series,
            inner: Mutex::new(Inner::default()),
            refused_not_owned: AtomicU64::new(0),
            refused_series_limit: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            changed: tokio::sync::watch::Sender::new(0),
        }
    }

    /// A receiver that sees a change whenever a batch brought samples.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The window's length, ms.
    pub fn window_ms(&self) -> i64 {
        self.window_s as i64 * 1000
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a batch from `node_id`, which owns `owned`. Refused and counted: series of devices the node does not
    /// own (or that another node has reported within the last minute), new series past the series limit, and
    /// samples from the future or older than the retention. A node can so never write another node's series, and
    /// holds at most one series per device it owns.
    pub fn ingest(&self, node_id: &str, owned: &Owned, batch: TelemetryBatch, now_ms: i64) -> TelemetryAccepted {
        let (mut accepted, mut rejected) = (0u64, 0u64);
        let (mut not_owned, mut over_limit) = (0u64, 0u64);
        let oldest_ms = now_ms - RETENTION_MS;
        let window_start_s = (now_ms / 1000) - self.window_s as i64;
        let node: Arc<str> = Arc::from(node_id);
        let w = self.window_s;
        let mut inner = self.lock();
        inner.dropped.insert(node_id.to_string(), batch.dropped);
        let Inner { devices, done, .. } = &mut *inner;
        for ds in batch.devices {
            let valid_ids = !ds.device.is_empty()
                && ds.device.len() <= MAX_ID_LEN
                && ds.gpu.len() <= MAX_ID_LEN
                && owned.owns(&ds.device, &ds.gpu, ds.profile.is_some());
            let taken = devices
                .get(&ds.device)
                .is_some_and(|s| *s.node_id != *node_id && s.latest.is_some_and(|l| l.t > now_ms - OWNER_FRESH_MS));
            if !valid_ids || taken {
                rejected += ds.samples.len() as u64;
                not_owned += 1;
                continue;
            }
            if !devices.contains_key(&ds.device) && devices.len() >= self.max_series {
                rejected += ds.samples.len() as u64;
                over_limit += 1;
                continue;
            }
            let series = devices.entry(ds.device.clone()).or_insert_with(|| Series {
                node_id: node.clone(),
                gpu: ds.gpu.clone(),
                profile: ds.profile.clone(),
                start: ds.start,
                ring: vec![Point::default(); w].into_boxed_slice(),
                mem_total: 0.0,
                latest: None,
                minute: None,
            });
            if *series.node_id != *node_id || series.gpu != ds.gpu {
                // The GPU moved to this node (it is registered here now, and its old node went quiet): the series
                // follows it.
                series.node_id = node.clone();
                series.gpu = ds.gpu.clone();
            }
            series.profile = ds.profile;
            series.start = ds.start;
            for s in &ds.samples {
                let finite = s.util.is_finite() && s.mem_used_mib.is_finite() && s.mem_total_mib.is_finite();
                if !finite || s.t > now_ms + MAX_AHEAD_MS || s.t < oldest_ms {
                    rejected += 1;
                    continue;
                }
                accepted += 1;
                let t_s = s.t / 1000;
                if t_s > window_start_s {
                    let slot = &mut series.ring[(t_s as usize) % w];
                    if i64::from(slot.t_s) <= t_s {
                        *slot = Point::of(s);
                    }
                }
                if series.latest.is_none_or(|l| l.t <= s.t) {
                    series.latest = Some(*s);
                    series.mem_total = s.mem_total_mib;
                }
                let minute_ms = s.t - s.t.rem_euclid(60_000);
                match &mut series.minute {
                    Some(acc) if acc.minute_ms == minute_ms => acc.add(s),
                    Some(acc) if acc.minute_ms > minute_ms => {
                        // A late sample of a minute already finished: its own row, merged in the store.
                        let mut late = MinuteAcc::new(minute_ms);
                        late.add(s);
                        done.push(late.row(&ds.device, series));
                    }
                    slot => {
                        if let Some(finished) = slot.take() {
                            done.push(finished.row(&ds.device, series));
                        }
                        let mut acc = MinuteAcc::new(minute_ms);
                        acc.add(s);
                        series.minute = Some(acc);
                    }
                }
            }
        }
        drop(inner);
        self.refused_not_owned.fetch_add(not_owned, Ordering::Relaxed);
        self.refused_series_limit.fetch_add(over_limit, Ordering::Relaxed);
        self.accepted.fetch_add(accepted, Ordering::Relaxed);
        self.rejected.fetch_add(rejected, Ordering::Relaxed);
        self.batches.fetch_add(1, Ordering::Relaxed);
        if accepted > 0 {
            self.changed.send_modify(|n| *n = n.wrapping_add(1));
        }
        TelemetryAccepted { accepted, rejected, next_batch_ms: None }
    }

    /// Finishes the minutes that ended more than `grace_ms` before `now_ms`, forgets devices not heard from for a
    /// whole window, and takes every finished minute (to be written).
    pub fn take_finished(&self, now_ms: i64, grace_ms: i64) -> Vec<MinuteRow> {
        let cutoff = now_ms - grace_ms - 60_000;
        let forget_before = now_ms - self.window_ms();
        let mut inner = self.lock();
        let Inner { devices, done, .. } = &mut *inner;
        devices.retain(|device, series| {
            if series.minute.as_ref().is_some_and(|acc| acc.minute_ms <= cutoff)
                && let Some(acc) = series.minute.take()
            {
                done.push(acc.row(device, series));
            }
            series.minute.is_some() || series.latest.is_some_and(|l| l.t >= forget_before)
        });
        std::mem::take(&mut done.rows).into_values().collect()
    }

    /// Puts rows the store did not take back in the queue.
    pub fn requeue(&self, rows: Vec<MinuteRow>) {
        let mut inner = self.lock();
        for row in rows {
            inner.done.push(row);
        }
    }

    /// Minute rows dropped because the queue for the store was full.
    pub fn lost_rows(&self) -> u64 {
        self.lock().done.lost
    }

    /// The latest sample of every device (of `node_id` only, when given).
    pub fn latest(&self, node_id: Option<&str>) -> Vec<Latest> {
        let inner = self.lock();
        let mut out: Vec<Latest> = inner
            .devices
            .iter()
            .filter(|(_, s)| node_id.is_none_or(|n| *s.node_id == *n))
            .filter_map(|(device, s)| {
                Some(Latest {
                    node_id: s.node_id.to_string(),
                    device: device.clone(),
                    gpu: s.gpu.clone(),
                    profile: s.profile.clone(),
                    start: s.start,
                    sample: s.latest?,
                })
            })
            .collect();
        out.sort_by(|a, b| (&a.node_id, &a.gpu, a.start, &a.device).cmp(&(&b.node_id, &b.gpu, b.start, &b.device)));
        out
    }

    /// Every sample in the window newer than the cursor, oldest first per device, for devices (of `node_id` only,
    /// when given) that `show` lets through; moves the cursor on. `after` holds, per device, the time of the last
    /// sample handed out (ms); a device without an entry gets its samples after `first_after_ms`. Entries of devices
    /// no longer in the window are dropped, so the cursor holds at most one entry per series.
    pub fn newer(
        &self,
        node_id: Option<&str>,
        show: impl Fn(&str) -> bool,
        after: &mut HashMap<String, i64>,
        first_after_ms: i64,
    ) -> Vec<Latest> {
        let inner = self.lock();
        let w = self.window_s;
        after.retain(|device, _| inner.devices.contains_key(device));
        let mut out = Vec::new();
        for (device, s) in &inner.devices {
            if node_id.is_some_and(|n| *s.node_id != *n) || !show(device) {
                continue;
            }
            let Some(latest) = s.latest else { continue };
            let since = after.get(device).copied().unwrap_or(first_after_ms);
            if latest.t <= since {
                continue;
            }
            // Seconds from the one after the cursor's to the newest, at most the window: one ring slot each.
            let newest_s = latest.t.div_euclid(1000);
            let first_s = since.div_euclid(1000).max(newest_s - w as i64 + 1);
            for t_s in first_s..=newest_s {
                let p = &s.ring[(t_s.rem_euclid(w as i64)) as usize];
                if i64::from(p.t_s) != t_s {
                    continue;
                }
                let sample = p.sample(s.mem_total);
                if sample.t <= since {
                    continue;
                }
                out.push(Latest {
                    node_id: s.node_id.to_string(),
                    device: device.clone(),
                    gpu: s.gpu.clone(),
                    profile: s.profile.clone(),
                    start: s.start,
                    sample,
                });
            }
            after.insert(device.clone(), latest.t);
        }
        out.sort_by(|a, b| {
            (&a.node_id, &a.gpu, a.start, &a.device, a.sample.t)
                .cmp(&(&b.node_id, &b.gpu, b.start, &b.device, b.sample.t))
        });
        out
    }

    /// The running drop counts agents reported, per node.
    pub fn agent_drops(&self) -> Vec<(String, u64)> {
        let inner = self.lock();
        let mut out: Vec<(String, u64)> = inner.dropped.iter().map(|(k, v)| (k.clone(), *v)).collect();
        out.sort();
        out
    }

    /// Devices in the window.
    pub fn series_count(&self) -> usize {
        self.lock().devices.len()
    }

    /// Per device, `columns` bucket means of `metric` from the in-memory window: bucket `i` covers
    /// `[from_ms + i·step_ms, from_ms + (i+1)·step_ms)`. `visible` takes a device and its GPU.
    pub fn window_rows(
        &self,
        node_id: Option<&str>,
        visible: impl Fn(&str, &str) -> bool,
        metric: Metric,
        from_ms: i64,
        step_ms: i64,
        columns: usize,
    ) -> Vec<(DeviceKey, Vec<Option<f32>>)> {
        let mut out = Vec::new();
        self.each_window(node_id, visible, metric, from_ms, step_ms, columns, |device, s, sums| {
            let key = DeviceKey {
                node_id: s.node_id.to_string(),
                device: device.to_string(),
                gpu: s.gpu.clone(),
                profile: s.profile.clone(),
                start: s.start,
            };
            out.push((key, sums.iter().map(|&(sum, n)| (n > 0).then(|| (sum / f64::from(n)) as f32)).collect()));
        });
        out
    }

    /// How many devices of the window [`Telemetry::window_rows`] would answer (without reading their samples).
    pub fn window_devices(&self, node_id: Option<&str>, visible: impl Fn(&str, &str) -> bool) -> usize {
        let inner = self.lock();
        inner
            .devices
            .iter()
            .filter(|(device, s)| node_id.is_none_or(|n| *s.node_id == *n) && visible(device, &s.gpu))
            .count()
    }

    /// [`Telemetry::window_rows`] summed per group: `group_of(node_id, device, gpu, is_instance)` names a device's
    /// group (`None`: left out); each group's columns hold the mean of its devices' bucket means (for `temp`, the
    /// highest) and how many devices had one, with the devices that had any. The window's devices are read once,
    /// without a row per device.
    #[allow(clippy::too_many_arguments)]
    pub fn window_groups(
        &self,
        node_id: Option<&str>,
        visible: impl Fn(&str, &str) -> bool,
        group_of: impl Fn(&str, &str, &str, bool) -> Option<String>,
        metric: Metric,
        from_ms: i64,
        step_ms: i64,
        columns: usize,
    ) -> std::collections::BTreeMap<String, WindowGroup> {
        let mut out: std::collections::BTreeMap<String, WindowGroup> = std::collections::BTreeMap::new();
        self.each_window(node_id, visible, metric, from_ms, step_ms, columns, |device, s, sums| {
            if sums.iter().all(|&(_, n)| n == 0) {
                return;
            }
            let Some(key) = group_of(&s.node_id, device, &s.gpu, s.profile.is_some()) else { return };
            let g = out.entry(key).or_insert_with(|| WindowGroup { devices: 0, columns: vec![(None, 0); columns] });
            g.devices += 1;
            for (cell, &(sum, n)) in g.columns.iter_mut().zip(sums) {
                if n == 0 {
                    continue;
                }
                let v = sum / f64::from(n);
                cell.0 = Some(match (cell.0, metric) {
                    (None, _) => v,
                    (Some(m), Metric::Temp) => m.max(v),
                    (Some(total), _) => total + v,
                });
                cell.1 += 1;
            }
        });
        if metric != Metric::Temp {
            for g in out.values_mut() {
                for cell in &mut g.columns {
                    cell.0 = cell.0.map(|total| total / f64::from(cell.1.max(1)));
                }
            }
        }
        out
    }

    /// Calls `f` with each visible device of the window, its series and its `columns` buckets (sum and count of
    /// `metric`), reading only the ring slots of the seconds in the range.
    #[allow(clippy::too_many_arguments)]
    fn each_window(
        &self,
        node_id: Option<&str>,
        visible: impl Fn(&str, &str) -> bool,
        metric: Metric,
        from_ms: i64,
        step_ms: i64,
        columns: usize,
        mut f: impl FnMut(&str, &Series, &[(f64, u32)]),
    ) {
        let to_ms = from_ms + step_ms * columns as i64;
        let w = self.window_s as i64;
        // Seconds whose sample falls in `[from_ms, to_ms)`; the ring holds one slot a second of the last `w`.
        let first_s = (from_ms + 999).div_euclid(1000);
        let end_s = (to_ms + 999).div_euclid(1000);
        let inner = self.lock();
        let mut sums = vec![(0.0f64, 0u32); columns];
        for (device, s) in &inner.devices {
            if node_id.is_some_and(|n| *s.node_id != *n) || !visible(device, &s.gpu) {
                continue;
            }
            sums.iter_mut().for_each(|b| *b = (0.0, 0));
            let newest_s = s.latest.map_or(end_s - 1, |l| l.t.div_euclid(1000));
            for t_s in first_s.max(newest_s - w + 1)..end_s.min(newest_s + 1) {
                let p = &s.ring[t_s.rem_euclid(w) as usize];
                if p.t_s == 0 || i64::from(p.t_s) != t_s {
                    continue;
                }
                if let Some(v) = p.value(metric, s.mem_total) {
                    let b = &mut sums[((t_s * 1000 - from_ms) / step_ms) as usize];
                    b.0 += v;
                    b.1 += 1;
                }
            }
            f(device, s, &sums);
        }
    }
}

/// Which device a heatmap row is.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceKey {
    /// Node id.
    pub node_id: String,
    /// `GPU-...` or `MIG-...`.
    pub device: String,
    /// The GPU's UUID.
    pub gpu: String,
    /// MIG profile.
    pub profile: Option<String>,
    /// MIG start unit.
    pub start: Option<u8>,
}

/// Heatmap rows from the cells the store grouped ([`tessera_store::Store::minute_cells`], ordered by device and
/// column): one row per device, `None` where a column has no value.
pub fn cell_rows(cells: Vec<MinuteCell>, columns: usize) -> Vec<(DeviceKey, Vec<Option<f32>>)> {
    let mut out: Vec<(DeviceKey, Vec<Option<f32>>)> = Vec::new();
    for c in cells {
        if out.last().is_none_or(|(k, _)| k.device != c.device) {
            let key = DeviceKey {
                node_id: c.node_id,
                device: c.device,
                gpu: c.gpu,
                profile: c.profile,
                start: c.start.and_then(|s| u8::try_from(s).ok()),
            };
            out.push((key, vec![None; columns]));
        }
        if let (Some((_, values)), Ok(col)) = (out.last_mut(), usize::try_from(c.col))
            && col < columns
        {
            values[col] = c.value.map(|v| v as f32);
        }
    }
    out
}

/// Per device, bucket means (sample-weighted) of `metric` from minute rows; `step_ms` is a multiple of a minute.
pub fn minute_rows(
    rows: &[MinuteRow],
    metric: Metric,
    from_ms: i64,
    step_ms: i64,
    columns: usize,
) -> Vec<(DeviceKey, Vec<Option<f32>>)> {
    // Per device: its key, and per column (weighted sum, weight).
    type Cells = (DeviceKey, Vec<(f64, f64)>);
    let mut by_device: HashMap<&str, Cells> = HashMap::new();
    for r in rows {
        let Some(v) = of_minute(metric, r) else { continue };
        if r.minute_ms < from_ms {
            continue;
        }
        let b = ((r.minute_ms - from_ms) / step_ms) as usize;
        if b >= columns {
            continue;
        }
        let entry = by_device.entry(r.device.as_str()).or_insert_with(|| {
            (
                DeviceKey {
                    node_id: r.node_id.clone(),
                    device: r.device.clone(),
                    gpu: r.gpu.clone(),
                    profile: r.profile.clone(),
                    start: r.start,
                },
                vec![(0.0, 0.0); columns],
            )
        });
        let w = r.samples.max(1) as f64;
        if metric == Metric::Temp {
            // The minute series keeps the maximum temperature: a bucket shows the highest.
            let cell = &mut entry.1[b];
            cell.0 = if cell.1 > 0.0 { cell.0.max(v) } else { v };
            cell.1 = 1.0;
        } else {
            entry.1[b].0 += v * w;
            entry.1[b].1 += w;
        }
    }
    by_device
        .into_values()
        .map(|(key, cells)| {
            let values = cells
                .into_iter()
                .map(|(sum, w)| (w > 0.0).then(|| if metric == Metric::Temp { sum as f32 } else { (sum / w) as f32 }))
                .collect();
            (key, values)
        })
        .collect()
}

/// Writes finished minutes every `every` and keeps each stored series within its retention once an hour
/// ([`tessera_store::Store::keep_telemetry`]: partitions made ahead and dropped behind on PostgreSQL), until the
/// store is dropped.
pub fn start_background(
    store: Store,
    telemetry: Arc<Telemetry>,
    every: std::time::Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_kept = 0i64;
        loop {
            tick.tick().await;
            let now = tessera_store::now_ms();
            if now - last_kept > 3_600_000 {
                last_kept = now;
                match store.keep_telemetry(now).await {
                    Ok(k) if k == tessera_store::telemetry::Kept::default() => {}
                    Ok(k) => tracing::info!(
                        rows = k.rows_deleted,
                        partitions_made = k.partitions_made,
                        partitions_dropped = k.partitions_dropped,
                        "telemetry kept within its retention"
                    ),
                    Err(e) => tracing::warn!(error = %e, "cannot keep telemetry within its retention"),
                }
            }
            if let Err(e) = flush(&store, &telemetry, now).await {
                tracing::warn!(error = %e, "cannot write telemetry minutes; kept for the next try");
            }
        }
    })
}

/// Minute rows written in one transaction at most. A fleet's minute is one row per device, each folded into three
/// series: 80,000 devices in one transaction held SQLite's only writer for seconds, and joins, statuses and
/// approvals waited behind it.
pub const FLUSH_ROWS: usize = 2_000;

/// The pause between two of a flush's transactions on SQLite. Its one writer is taken by whoever asks first
/// once it is free, and a write that found it taken polls again only after a sleep (up to 100 ms): a flush going
/// straight on to its next transaction takes it again before them, and an approval waited behind a fleet minute's
/// 40 transactions (p95 2.7 s at 10,000 agents).
pub const FLUSH_GAP: std::time::Duration = std::time::Duration::from_millis(60);

/// Writes the minutes finished by `now_ms` (a 5 s grace lets late batches in), [`FLUSH_ROWS`] to a transaction so
/// that other writes go between them (on SQLite with [`FLUSH_GAP`] between); on failure, or when the flush is
/// dropped part way (its task aborted at shutdown), the rows not written are queued again. The rollups merge
/// additively, so a device's minutes may land in any transactions, in any order.
pub async fn flush(store: &Store, telemetry: &Telemetry, now_ms: i64) -> Result<usize, StoreError> {
    let gap = if store.backend() == "sqlite" { FLUSH_GAP } else { std::time::Duration::ZERO };
    flush_with(store, telemetry, now_ms, gap).await
}

/// [`flush`] without pauses: the last flush at shutdown, which nothing else waits behind.
pub async fn flush_all(store: &Store, telemetry: &Telemetry) -> Result<usize, StoreError> {
    flush_with(store, telemetry, i64::MAX / 2, std::time::Duration::ZERO).await
}

/// Rows taken from the window and not written yet: queued again when dropped.
struct Unwritten<'a> {
    telemetry: &'a Telemetry,
    rows: Vec<MinuteRow>,
}

impl Drop for Unwritten<'_> {
    fn drop(&mut self) {
        if !self.rows.is_empty() {
            self.telemetry.requeue(std::mem::take(&mut self.rows));
        }
    }
}

async fn flush_with(
    store: &Store,
    telemetry: &Telemetry,
    now_ms: i64,
    gap: std::time::Duration,
) -> Result<usize, StoreError> {
    let mut left = Unwritten { telemetry, rows: telemetry.take_finished(now_ms, 5_000) };
    let n = left.rows.len();
    while !left.rows.is_empty() {
        let k = left.rows.len().min(FLUSH_ROWS);
        store.write_minutes(&left.rows[..k]).await?;
        left.rows.drain(..k);
        if left.rows.is_empty() {
            break;
        }
        if gap.is_zero() {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(gap).await;
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use tessera_core::api::{DeviceSeries, GpuStatus, NodeStatus, ObservedInstance, Sample, TelemetryBatch};

    use super::{Owned, Telemetry};

    fn series(device: &str, gpu: &str, mig: bool, t: i64) -> DeviceSeries {
        DeviceSeries {
            device: device.into(),
            gpu: gpu.into(),
            profile: mig.then(|| "1g.10gb".to_string()),
            start: mig.then_some(0),
            samples: vec![Sample {
                t,
                util: 50.0,
                mem_used_mib: 1.0,
                mem_total_mib: 10.0,
                power_w: None,
                temp_c: None,
            }],
        }
    }

    fn instance(uuid: &str) -> ObservedInstance {
        ObservedInstance {
            profile: "1g.10gb".into(),
            start: 0,
            uuid: uuid.into(),
            gi_id: 1,
            ci_id: 0,
            device_name: "MIG 1g.10gb Device 0".into(),
            processes: vec![],
        }
    }

    #[test]
    fn a_node_owns_its_gpus_and_the_instances_its_status_shows_on_them() {
        let status = NodeStatus {
            observed_generation: 1,
            applying: false,
            gpus: vec![
                GpuStatus {
                    uuid: "GPU-a".into(),
                    mig_enabled: true,
                    instances: vec![instance("MIG-1")],
                    sharing: None,
                    errors: vec![],
                    health: None,
                    processes: vec![],
                },
                // A GPU that is not registered to the node: its instances are not the node's.
                GpuStatus {
                    uuid: "GPU-x".into(),
                    mig_enabled: true,
                    instances: vec![instance("MIG-2")],
                    sharing: None,
                    errors: vec![],
                    health: None,
                    processes: vec![],
                },
            ],
            errors: vec![],
        };
        let owned = Owned::of(["GPU-a"], Some(&status));
        assert!(owned.owns("GPU-a", "GPU-a", false));
        assert!(owned.owns("MIG-1", "GPU-a", true));
        assert!(!owned.owns("MIG-1", "GPU-x", true), "its instance under another GPU");
        assert!(!owned.owns("MIG-2", "GPU-x", true), "an unregistered GPU's instance");
        assert!(!owned.owns("GPU-x", "GPU-x", false));
        assert!(!owned.owns("MIG-1", "GPU-a", false), "a MIG device sent as a GPU");
        assert_eq!(owned.len(), 2);
    }

    #[test]
    fn new_series_past_the_limit_are_refused_and_counted_and_another_nodes_live_series_is_never_taken() {
        let now = 1_800_000_000_000;
        let telemetry = Telemetry::new(900, 2);
        let mut owned = Owned::default();
        for g in ["GPU-1", "GPU-2", "GPU-3"] {
            owned.gpus.insert(g.to_string());
        }
        let batch = |devices| TelemetryBatch { dropped: 0, devices };
        let got = telemetry.ingest(
            "n1",
            &owned,
            batch(vec![
                series("GPU-1", "GPU-1", false, now),
                series("GPU-2", "GPU-2", false, now),
                series("GPU-3", "GPU-3", false, now),
            ]),
            now,
        );
        assert_eq!((got.accepted, got.rejected), (2, 1));
        assert_eq!(telemetry.series_count(), 2);
        assert_eq!(telemetry.refused_series_limit.load(std::sync::atomic::Ordering::Relaxed), 1);
        // Known series still take samples at the limit.
        let got = telemetry.ingest("n1", &owned, batch(vec![series("GPU-1", "GPU-1", false, now + 1000)]), now + 1000);
        assert_eq!((got.accepted, got.rejected), (1, 0));
        // Another node that (wrongly) owns the same GPU cannot write its live series.
        let got = telemetry.ingest("n2", &owned, batch(vec![series("GPU-1", "GPU-1", false, now + 2000)]), now + 2000);
        assert_eq!((got.accepted, got.rejected), (0, 1));
        assert_eq!(telemetry.latest(None).iter().filter(|l| l.node_id == "n2").count(), 0);
        // Once the first node went quiet for a minute, the series follows the GPU to its new node.
        let later = now + 120_000;
        let got = telemetry.ingest("n2", &owned, batch(vec![series("GPU-1", "GPU-1", false, later)]), later);
        assert_eq!((got.accepted, got.rejected), (1, 0));
    }

    #[test]
    fn the_live_cursor_hands_out_every_sample_once_in_order_and_wakes_its_readers() {
        let now = 1_800_000_000_000;
        let telemetry = Telemetry::new(900, 100);
        let mut owned = Owned::default();
        owned.gpus.extend(["GPU-1".to_string(), "GPU-2".to_string()]);
        let mut changes = telemetry.subscribe();
        let batch = |device: &str, ts: &[i64]| TelemetryBatch {
            dropped: 0,
            devices: vec![DeviceSeries {
                samples: ts.iter().flat_map(|t| series(device, device, false, *t).samples).collect(),
                ..series(device, device, false, 0)
            }],
        };
        // Five seconds of GPU-1 in one batch (an agent's backlog), at 400 ms into each second.
        let ts: Vec<i64> = (0..5).map(|i| now + i * 1000 + 400).collect();
        telemetry.ingest("n1", &owned, batch("GPU-1", &ts), now + 5000);
        assert!(changes.has_changed().expect("open"), "a batch with samples wakes the live streams");
        changes.borrow_and_update();
        let mut cursor = std::collections::HashMap::new();
        // A first reader asking for what came after the second sample gets the other three, oldest first, with
        // their exact times.
        let got = telemetry.newer(None, |_| true, &mut cursor, now + 1400);
        assert_eq!(got.iter().map(|l| l.sample.t).collect::<Vec<_>>(), ts[2..].to_vec());
        assert!(telemetry.newer(None, |_| true, &mut cursor, now).is_empty(), "nothing twice");
        // The next batch: only the new sample; another node's device and a hidden one are left out.
        telemetry.ingest("n1", &owned, batch("GPU-1", &[now + 5400]), now + 6000);
        telemetry.ingest("n2", &owned, batch("GPU-2", &[now + 5500]), now + 6000);
        let got = telemetry.newer(Some("n1"), |_| true, &mut cursor, now);
        assert_eq!(got.iter().map(|l| (l.device.as_str(), l.sample.t)).collect::<Vec<_>>(), [("GPU-1", now + 5400)]);
        assert!(telemetry.newer(None, |d| d != "GPU-2", &mut cursor, now).is_empty());
        // A device first seen by this reader starts after `first_after`.
        let got = telemetry.newer(None, |_| true, &mut cursor, now);
        assert_eq!(got.iter().map(|l| (l.device.as_str(), l.sample.t)).collect::<Vec<_>>(), [("GPU-2", now + 5500)]);
        // Devices that left the window leave the cursor.
        telemetry.take_finished(now + 3_600_000, 0);
        telemetry.newer(None, |_| true, &mut cursor, now);
        assert!(cursor.is_empty(), "{cursor:?}");
        // A batch with nothing accepted wakes nobody.
        changes.borrow_and_update();
        telemetry.ingest("n1", &owned, batch("GPU-9", &[now]), now);
        assert!(!changes.has_changed().expect("open"));
    }
}
