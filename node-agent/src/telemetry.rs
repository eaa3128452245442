//! Telemetry: a sample of every GPU and MIG instance each `every` (1 s by default), kept in a bounded buffer and
//! sent in gzip-compressed JSON batches. While the server cannot be reached the buffer fills; when it is full the
//! oldest samples make way and are counted, and the running count travels with every batch so the server can
//! report the loss.

use std::collections::VecDeque;
use std::io::Write;
use std::time::Duration;

use tessera_core::api::{DeviceSeries, TelemetryBatch};

use crate::backend::Reading;

/// Telemetry settings.
#[derive(Debug, Clone, Copy)]
pub struct TelemetryConfig {
    /// How often every device is sampled. Samples are taken at a fixed offset into each period of the wall clock
    /// (see [`TelemetryConfig::offset`]), so that each lands in its own second of the server's 1 s window.
    pub every: Duration,
    /// How often a batch is sent at most; a batch goes right after the sample that makes it due (with the default
    /// 1 s, every sample is sent as soon as it is taken).
    pub batch_every: Duration,
    /// Where in each period samples are taken; `None`: a random point in its middle 80 % (so that the nodes of a
    /// fleet do not all send at the same instant, and clock jitter never moves a sample into the next second).
    pub offset: Option<Duration>,
    /// Most readings kept while the server cannot be reached.
    pub buffer: usize,
    /// Most readings in one batch (a backlog goes in several).
    pub max_batch: usize,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            every: Duration::from_secs(1),
            batch_every: Duration::from_secs(1),
            offset: None,
            buffer: 200_000,
            max_batch: 20_000,
        }
    }
}

impl TelemetryConfig {
    /// The sampling period and this agent's offset into it, ms (the period at least 1 ms, the offset below it).
    pub fn schedule_ms(&self) -> (i64, i64) {
        let every = i64::try_from(self.every.as_millis()).unwrap_or(i64::MAX).max(1);
        let offset = match self.offset {
            Some(o) => i64::try_from(o.as_millis()).unwrap_or(0),
            None => {
                use std::hash::BuildHasher;
                let r = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
                every / 10 + i64::try_from(r % (every as u64 * 8 / 10).max(1)).unwrap_or(0)
            }
        };
        (every, offset.rem_euclid(every))
    }
}

/// How long to wait from `now_ms` (wall clock) to the next sampling instant: the next time whose remainder modulo
/// `every` is `offset` (a whole period when `now_ms` is one). Following the wall clock each time keeps the samples
/// at their offset however the monotonic clock and the wall clock drift apart.
pub fn until_next(now_ms: i64, every: i64, offset: i64) -> Duration {
    let every = every.max(1);
    let mut next = now_ms - now_ms.rem_euclid(every) + offset.rem_euclid(every);
    if next <= now_ms {
        next += every;
    }
    Duration::from_millis(u64::try_from(next - now_ms).unwrap_or(0))
}

/// Readings waiting to be sent, oldest first, at most `cap` of them.
#[derive(Debug)]
pub struct Buffer {
    readings: VecDeque<Reading>,
    cap: usize,
    dropped: u64,
}

impl Buffer {
    /// An empty buffer holding at most `cap` readings.
    pub fn new(cap: usize) -> Buffer {
        Buffer { readings: VecDeque::new(), cap: cap.max(1), dropped: 0 }
    }

    /// Adds new readings; when full, the oldest are dropped (and counted).
    pub fn push(&mut self, readings: impl IntoIterator<Item = Reading>) {
        for r in readings {
            if self.readings.len() >= self.cap {
                self.readings.pop_front();
                self.dropped += 1;
            }
            self.readings.push_back(r);
        }
    }

    /// Takes up to `max` of the oldest readings.
    pub fn take(&mut self, max: usize) -> Vec<Reading> {
        let n = max.min(self.readings.len());
        self.readings.drain(..n).collect()
    }

    /// Puts readings that could not be delivered back in front, keeping the cap (what no longer fits is the
    /// oldest, dropped and counted).
    pub fn put_back(&mut self, readings: Vec<Reading>) {
        let room = self.cap - self.readings.len().min(self.cap);
        let skip = readings.len().saturating_sub(room);
        self.dropped += skip as u64;
        for r in readings.into_iter().skip(skip).rev() {
            self.readings.push_front(r);
        }
    }

    /// Counts `n` readings the server refused as dropped.
    pub fn discard(&mut self, n: usize) {
        self.dropped += n as u64;
    }

    /// Readings waiting.
    pub fn len(&self) -> usize {
        self.readings.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.readings.is_empty()
    }

    /// Readings dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

/// Groups readings into a batch (one series per device, samples in the order given).
pub fn batch(readings: &[Reading], dropped: u64) -> TelemetryBatch {
    let mut devices: Vec<DeviceSeries> = Vec::new();
    let mut index: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for r in readings {
        let i = *index.entry(r.device.as_str()).or_insert_with(|| {
            devices.push(DeviceSeries {
                device: r.device.clone(),
                gpu: r.gpu.clone(),
                profile: r.profile.clone(),
                start: r.start,
                samples: Vec::new(),
            });
            devices.len() - 1
        });
        devices[i].samples.push(r.sample);
    }
    TelemetryBatch { dropped, devices }
}

/// A batch as sent: gzip-compressed JSON.
pub fn encode(batch: &TelemetryBatch) -> Vec<u8> {
    let json = serde_json::to_vec(batch).unwrap_or_default();
    let mut gz = flate2::write::GzEncoder::new(Vec::with_capacity(json.len() / 4), flate2::Compression::fast());
    // Writing to a Vec cannot fail.
    let _ = gz.write_all(&json);
    gz.finish().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_core::api::Sample;

    fn reading(device: &str, t: i64) -> Reading {
        Reading {
            device: device.to_string(),
            gpu: "GPU-1".to_string(),
            profile: None,
            start: None,
            sample: Sample { t, util: 1.0, mem_used_mib: 0.0, mem_total_mib: 1.0, power_w: None, temp_c: None },
        }
    }

    #[test]
    fn samples_are_taken_at_the_agents_offset_into_each_second() {
        assert_eq!(until_next(10_000, 1000, 300), Duration::from_millis(300));
        assert_eq!(until_next(10_299, 1000, 300), Duration::from_millis(1));
        // At the instant itself, the next one is a whole period away; past it, the next second's.
        assert_eq!(until_next(10_300, 1000, 300), Duration::from_millis(1000));
        assert_eq!(until_next(10_900, 1000, 300), Duration::from_millis(400));
        // A random offset stays in the middle 80 % of the period, clear of the seconds' edges.
        for _ in 0..50 {
            let (every, offset) = TelemetryConfig::default().schedule_ms();
            assert_eq!(every, 1000);
            assert!((100..900).contains(&offset), "{offset}");
        }
        let fixed = TelemetryConfig { offset: Some(Duration::from_millis(2500)), ..TelemetryConfig::default() };
        assert_eq!(fixed.schedule_ms(), (1000, 500));
    }

    #[test]
    fn a_full_buffer_drops_the_oldest_and_counts_them() {
        let mut b = Buffer::new(3);
        b.push((0..5).map(|t| reading("GPU-1", t)));
        assert_eq!(b.len(), 3);
        assert_eq!(b.dropped(), 2);
        let taken = b.take(10);
        assert_eq!(taken.iter().map(|r| r.sample.t).collect::<Vec<_>>(), vec![2, 3, 4]);
    }

    #[test]
    fn undelivered_readings_go_back_in_front_within_the_cap() {
        let mut b = Buffer::new(4);
        b.push((0..4).map(|t| reading("GPU-1", t)));
        let sent = b.take(3);
        b.push((4..6).map(|t| reading("GPU-1", t)));
        // 3 come back, room for 1: the two oldest are dropped.
        b.put_back(sent);
        assert_eq!(b.dropped(), 2);
        assert_eq!(b.take(10).iter().map(|r| r.sample.t).collect::<Vec<_>>(), vec![2, 3, 4, 5]);
    }

    #[test]
    fn batches_group_by_device_and_round_trip_through_gzip() {
        let readings = vec![reading("GPU-1", 1), reading("MIG-2", 1), reading("GPU-1", 2)];
        let b = batch(&readings, 7);
        assert_eq!(b.devices.len(), 2);
        assert_eq!(b.devices[0].samples.len(), 2);
        let bytes = encode(&b);
        assert_eq!(&bytes[..2], &[0x1f, 0x8b]);
        let mut json = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut json).expect("gunzip");
        let back: TelemetryBatch = serde_json::from_slice(&json).expect("json");
        assert_eq!(back, b);
    }
}
