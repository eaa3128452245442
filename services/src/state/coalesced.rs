//! A read shared by the callers that want it at the same time.

use std::any::Any;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// What one read of the store found, shared by every caller that asked for it while it was under way: each caller
/// gets a reading that *began after it asked*, so it sees everything committed before its call, exactly as a read of
/// its own would; callers that arrive while a reading runs wait for the next one and share it. Under load one
/// reading serves every caller of a wave; alone, a caller reads for itself. Nothing is reused across time: a caller
/// never gets a reading older than its call.
#[derive(Default)]
pub struct Coalesced {
    latest: Mutex<Option<(Instant, Arc<dyn Any + Send + Sync>)>>,
    reading: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Coalesced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coalesced").finish_non_exhaustive()
    }
}

impl Coalesced {
    /// A reading of `T` that began after this call did: one under way or done since, else `read`'s. One kind of
    /// `T` per `Coalesced`: a kept reading of another type is never answered.
    pub async fn read<T, E, F, Fut>(&self, read: F) -> Result<Arc<T>, E>
    where
        T: Any + Send + Sync,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let asked = Instant::now();
        if let Some(v) = self.since::<T>(asked) {
            return Ok(v);
        }
        // One reading at a time: who waited here while one ran gets the next (or this, if it began after them).
        let _one = self.reading.lock().await;
        if let Some(v) = self.since::<T>(asked) {
            return Ok(v);
        }
        let began = Instant::now();
        let v = Arc::new(read().await?);
        if let Ok(mut latest) = self.latest.lock() {
            *latest = Some((began, v.clone() as Arc<dyn Any + Send + Sync>));
        }
        Ok(v)
    }

    /// The kept reading when it began at or after `asked`.
    fn since<T: Any + Send + Sync>(&self, asked: Instant) -> Option<Arc<T>> {
        let latest = self.latest.lock().ok()?;
        let (began, v) = latest.as_ref()?;
        (*began >= asked).then(|| v.clone().downcast::<T>().ok()).flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Callers that ask while a reading runs share the next one; a caller after it reads again; nobody gets a
    /// reading that began before it asked.
    #[tokio::test]
    async fn callers_at_once_share_a_reading_that_began_after_they_asked() {
        let shared = Arc::new(Coalesced::default());
        let reads = Arc::new(AtomicUsize::new(0));
        let slow = |reads: Arc<AtomicUsize>| async move {
            let n = reads.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            Ok::<_, ()>((n, Instant::now()))
        };
        // The first caller reads; ten arriving while it runs share one more reading, begun after they asked.
        let first = {
            let (s, r) = (shared.clone(), reads.clone());
            tokio::spawn(async move { s.read(|| slow(r)).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        let asked = Instant::now();
        let wave: Vec<_> = (0..10)
            .map(|_| {
                let (s, r) = (shared.clone(), reads.clone());
                tokio::spawn(async move { s.read(|| slow(r)).await })
            })
            .collect();
        assert_eq!(first.await.expect("first").expect("read").0, 1);
        for w in wave {
            let (n, done) = *w.await.expect("caller").expect("read");
            assert_eq!(n, 2, "the wave shares the second reading");
            assert!(done > asked);
        }
        // Alone, later: a reading of its own.
        assert_eq!(shared.read(|| slow(reads.clone())).await.expect("read").0, 3);
        assert_eq!(reads.load(Ordering::SeqCst), 3);
    }
}
