//! The last simulation of the reservation calendar, kept between questions.

use std::sync::Arc;

use tessera_core::reservation::{Calendar, Prepared};

/// The last simulation of the calendar ([`Prepared`]), kept for the questions that follow: a preview typed
/// character by character, the protection check of every approval and of every waiting request explained. It is
/// reused only for the very same calendar (GPUs, holds, reservations and kept slices compared whole) when nothing
/// happened since it was made ([`Prepared::answers_for`]), and for at most [`PREPARED_REUSE_MS`]; so a reused
/// simulation answers exactly as a new one would.
#[derive(Debug, Default)]
pub struct PreparedCache(std::sync::Mutex<Option<Arc<Prepared<'static>>>>);

/// Longest a prepared simulation is reused.
pub const PREPARED_REUSE_MS: i64 = 30_000;

impl PreparedCache {
    /// A simulation of `cal` from `now`: the kept one when it answers for `cal` now, else a new one (kept for the
    /// next question).
    pub fn prepare(&self, cal: &Calendar<'static>, now: i64) -> Arc<Prepared<'static>> {
        let kept = self.0.lock().ok().and_then(|k| k.clone());
        if let Some(p) = kept.filter(|p| now - p.from_ms() <= PREPARED_REUSE_MS && p.answers_for(cal, now)) {
            return p;
        }
        self.keep(Arc::new(cal.prepare(now)))
    }

    /// The simulation of `cal` from `now`, as [`PreparedCache::prepare`] answers it; when `cal` is the kept
    /// simulation's calendar with one reservation more (one just accepted), the kept one accepts it and keeps its
    /// slices ([`Prepared::accept_and_keep`]), replaying only from its start: the same simulation as a new one.
    pub fn simulate(&self, cal: &Calendar<'static>, now: i64) -> tessera_core::reservation::Simulation {
        let kept = self.0.lock().ok().and_then(|k| k.clone()).filter(|p| now - p.from_ms() <= PREPARED_REUSE_MS);
        if let Some(p) = &kept {
            if p.answers_for(cal, now) {
                return p.simulation();
            }
            if let Some(b) = p.one_more(cal, now) {
                let mut more = Prepared::clone(p);
                if more.accept_and_keep(b.clone()).is_ok() {
                    return self.keep(Arc::new(more)).simulation();
                }
            }
        }
        self.prepare(cal, now).simulation()
    }

    fn keep(&self, p: Arc<Prepared<'static>>) -> Arc<Prepared<'static>> {
        if let Ok(mut k) = self.0.lock() {
            *k = Some(p.clone());
        }
        p
    }
}
