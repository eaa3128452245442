//! Whether this replica is shutting down. From the first signal on, `/readyz` answers 503 (`shutting_down`) so
//! that a load balancer or Kubernetes moves new work to the other replicas, and every long-lived connection ends
//! with a reconnect hint: agents' sockets close with code 1012 (service restart) and live streams end after their
//! `retry` hint, so their clients open them again at once, on a replica that stays. Requests keep being served
//! for the delay (`TESSERA_SHUTDOWN_DELAY_S`), then the listener closes and what is in flight finishes.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

/// The longest delay between the signal and closing the listener (`TESSERA_SHUTDOWN_DELAY_S`).
pub const MAX_DELAY: Duration = Duration::from_secs(300);

/// Set once, when the replica begins to shut down; cloned everywhere it is watched.
#[derive(Debug, Clone)]
pub struct Draining {
    sender: Arc<watch::Sender<bool>>,
    delay: Duration,
}

impl Default for Draining {
    fn default() -> Self {
        Draining::new(Duration::ZERO)
    }
}

impl Draining {
    /// Not draining; once it begins, requests are served for `delay` more before the listener closes.
    pub fn new(delay: Duration) -> Self {
        Draining { sender: Arc::new(watch::channel(false).0), delay: delay.min(MAX_DELAY) }
    }

    /// How long requests are still served after the signal.
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// Begins draining (again: no change).
    pub fn begin(&self) {
        self.sender.send_if_modified(|draining| !std::mem::replace(draining, true));
    }

    /// Whether draining has begun.
    pub fn is_draining(&self) -> bool {
        *self.sender.borrow()
    }

    /// Completes once draining has begun (at once if it has).
    pub async fn begun(&self) {
        let mut receiver = self.sender.subscribe();
        // The sender lives as long as `self`: `wait_for` ends only when draining begins.
        let _ = receiver.wait_for(|draining| *draining).await;
    }
}

#[cfg(test)]
mod tests {
    use super::Draining;

    #[tokio::test]
    async fn every_watcher_sees_the_beginning_once_and_for_good() {
        let draining = Draining::new(std::time::Duration::from_secs(1000));
        assert_eq!(draining.delay(), super::MAX_DELAY, "the delay is bounded");
        assert!(!draining.is_draining());
        let watcher = draining.clone();
        let waiting = tokio::spawn(async move { watcher.begun().await });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "nothing began yet");
        draining.begin();
        draining.begin();
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting).await.expect("woken").expect("task");
        assert!(draining.is_draining());
        // A watcher that comes later sees it at once.
        tokio::time::timeout(std::time::Duration::from_secs(1), draining.begun()).await.expect("at once");
    }
}
