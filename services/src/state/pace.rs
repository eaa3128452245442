//! Telemetry pacing: how often this replica asks agents to send their telemetry batches.
//!
//! An agent samples its GPUs every second and sends what it buffered every `--telemetry-batch-ms` (1 s by
//! default). Ten thousand agents at 1 s offer more batches than one server process answers on a few cores: the
//! batches queue with every other request, and an approval then waited 8 to 24 s behind them before its spec
//! reached the node (docs/benchmarks.md). So each replica measures how late its runtime runs (a timer due every
//! [`TICK`]: its lateness is how long a task that is ready waits for a thread, which every request waits too) and
//! answers every batch with the interval it asks for ([`tessera_core::api::TelemetryAccepted::next_batch_ms`]):
//! a quarter longer each second while the worst lateness of the second is above [`LATE`], a tenth shorter each
//! second while it is below [`ON_TIME`], never below the floor the operator set (`TESSERA_TELEMETRY_BATCH_FLOOR_MS`,
//! 1 s by default) nor above [`MAX_INTERVAL_MS`]. Agents keep sampling every second and send what they buffered:
//! no sample is lost, the batches are fewer and larger, and the server keeps the room to answer everything else.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often the lateness is measured.
pub const TICK: Duration = Duration::from_millis(250);
/// Lateness past which agents are asked to batch less often.
pub const LATE: Duration = Duration::from_millis(100);
/// Lateness under which agents are asked to batch more often again (down to the floor).
pub const ON_TIME: Duration = Duration::from_millis(25);
/// The longest interval asked for: an agent's buffer holds far more, and the live views show a node's samples at
/// most this late.
pub const MAX_INTERVAL_MS: u64 = 30_000;
/// The floor unless the operator sets another.
pub const DEFAULT_FLOOR_MS: u64 = 1_000;

/// The interval asked of agents, and the lateness it was set from.
#[derive(Debug)]
pub struct Pace {
    floor_ms: u64,
    interval_ms: AtomicU64,
    /// The worst lateness of the last second, in microseconds.
    late_us: AtomicU64,
}

impl Pace {
    /// Asks for `floor_ms` (clamped to 1 ms..[`MAX_INTERVAL_MS`]) until the runtime runs late.
    pub fn new(floor_ms: u64) -> Pace {
        let floor_ms = floor_ms.clamp(1, MAX_INTERVAL_MS);
        Pace { floor_ms, interval_ms: AtomicU64::new(floor_ms), late_us: AtomicU64::new(0) }
    }

    /// The interval agents are asked to send their batches at, in milliseconds.
    pub fn next_batch_ms(&self) -> u64 {
        self.interval_ms.load(Ordering::Relaxed)
    }

    /// The floor (what is asked while the runtime runs on time).
    pub fn floor_ms(&self) -> u64 {
        self.floor_ms
    }

    /// The worst lateness of the runtime over the last second.
    pub fn late(&self) -> Duration {
        Duration::from_micros(self.late_us.load(Ordering::Relaxed))
    }

    /// Takes one second's worst lateness: the next interval.
    pub fn observe(&self, late: Duration) -> u64 {
        self.late_us.store(u64::try_from(late.as_micros()).unwrap_or(u64::MAX), Ordering::Relaxed);
        let next = step(self.next_batch_ms(), late, self.floor_ms);
        self.interval_ms.store(next, Ordering::Relaxed);
        next
    }
}

/// The interval after one second with `late` as its worst lateness (see the module docs).
pub fn step(interval_ms: u64, late: Duration, floor_ms: u64) -> u64 {
    let next = if late > LATE {
        interval_ms.saturating_add((interval_ms / 4).max(1))
    } else if late < ON_TIME {
        interval_ms.saturating_sub((interval_ms / 10).max(1))
    } else {
        interval_ms
    };
    next.clamp(floor_ms.min(MAX_INTERVAL_MS), MAX_INTERVAL_MS)
}

/// Measures the runtime's lateness every [`TICK`] and sets the pace every second, until aborted.
pub fn start_background(pace: Arc<Pace>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let per_second = (Duration::from_secs(1).as_millis() / TICK.as_millis()).max(1);
        loop {
            let mut worst = Duration::ZERO;
            for _ in 0..per_second {
                let due = Instant::now() + TICK;
                tokio::time::sleep(TICK).await;
                worst = worst.max(Instant::now().saturating_duration_since(due));
            }
            let before = pace.next_batch_ms();
            let after = pace.observe(worst);
            if (before <= pace.floor_ms()) != (after <= pace.floor_ms()) {
                tracing::info!(
                    late_ms = worst.as_millis() as u64,
                    next_batch_ms = after,
                    "telemetry pace: {}",
                    if after > pace.floor_ms() { "asking agents to batch less often" } else { "back to the floor" }
                );
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{MAX_INTERVAL_MS, Pace, step};

    #[test]
    fn the_interval_grows_while_the_runtime_runs_late_and_comes_back_to_the_floor_once_it_is_on_time() {
        let pace = Pace::new(1_000);
        assert_eq!(pace.next_batch_ms(), 1_000, "the floor while nothing is measured");
        let late = Duration::from_millis(400);
        let grown: Vec<u64> = (0..5).map(|_| pace.observe(late)).collect();
        assert_eq!(grown, [1_250, 1_562, 1_952, 2_440, 3_050], "a quarter more each late second");
        assert_eq!(pace.late(), late);
        // Between on time and late: held.
        assert_eq!(pace.observe(Duration::from_millis(60)), 3_050);
        // On time: a tenth less each second, down to the floor and not below.
        let mut last = 3_050;
        for _ in 0..100 {
            let next = pace.observe(Duration::from_millis(2));
            assert!(next <= last && next >= 1_000, "{next} after {last}");
            last = next;
        }
        assert_eq!(last, 1_000);
        // Never past the longest interval, however late.
        let mut at = 1_000;
        for _ in 0..100 {
            at = step(at, Duration::from_secs(5), 1_000);
        }
        assert_eq!(at, MAX_INTERVAL_MS);
        // An operator's floor is what is asked on time, and it is held against the ceiling.
        assert_eq!(step(2_000, Duration::ZERO, 5_000), 5_000);
        assert_eq!(Pace::new(600_000).next_batch_ms(), MAX_INTERVAL_MS);
    }
}
