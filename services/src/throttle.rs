//! A throttle for actions that make the server send something on a caller's word (a webhook test, a redelivery,
//! each retried for a day when the target fails): one per key per interval.
//!
//! It lives in the memory of each replica: behind a load balancer with several replicas, each allows its own one
//! per interval. That bounds the sending a caller can cause to a small multiple, which is its purpose.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long after one webhook test (per endpoint) or redelivery (per delivery) the next is refused.
pub const SEND_EVERY: Duration = Duration::from_secs(10);
/// Most keys remembered; past it, keys whose interval has passed are forgotten, and while it is still full new keys
/// are refused.
const MAX_KEYS: usize = 100_000;

/// When each key last acted.
#[derive(Debug)]
pub struct Throttle {
    every: Duration,
    last: Mutex<HashMap<String, Instant>>,
}

impl Default for Throttle {
    fn default() -> Self {
        Throttle::new(SEND_EVERY)
    }
}

impl Throttle {
    /// One action per key per `every`.
    pub fn new(every: Duration) -> Throttle {
        Throttle { every, last: Mutex::default() }
    }

    /// Takes `key`'s turn now; when it had one within the interval, how long until the next.
    pub fn take(&self, key: &str) -> Result<(), Duration> {
        let now = Instant::now();
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = last.get(key) {
            let since = now.duration_since(*at);
            if since < self.every {
                return Err(self.every - since);
            }
        }
        if last.len() >= MAX_KEYS {
            last.retain(|_, at| now.duration_since(*at) < self.every);
            if last.len() >= MAX_KEYS {
                return Err(self.every);
            }
        }
        last.insert(key.to_string(), now);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_turn_per_key_per_interval() {
        let t = Throttle::new(Duration::from_millis(200));
        assert!(t.take("a").is_ok());
        let wait = t.take("a").expect_err("too soon");
        assert!(wait > Duration::ZERO && wait <= Duration::from_millis(200), "{wait:?}");
        assert!(t.take("b").is_ok(), "each key has its own");
        std::thread::sleep(Duration::from_millis(250));
        assert!(t.take("a").is_ok(), "again after the interval");
    }
}
