//! Whose write goes first on SQLite: an approval's before the fleet's bulk.
//!
//! SQLite has one writer. A transaction that finds it taken sleeps before it asks again (its busy handler, up to
//! 100 ms a time), and whoever asks first once it is free gets it: under 10,000 agents a person's approval asked
//! beside the nodes' routine status reports, the heartbeats and the telemetry flush's transactions, and its commit
//! waited seconds (p95 2.7 s). The fleet's bulk writes can wait a little: a routine report changes nothing anyone
//! waits for, a heartbeat is a time a few seconds old, a minute row has its whole next minute.
//!
//! So an approval's writes (its commit and the nodes' spec bumps, `services/src/approvals.rs`) and the activation a
//! node's status report makes (`services/src/agents.rs`) hold an [`Interactive`] turn, and a bulk write first waits
//! ([`Turns::bulk`]) while any is held, at most [`BULK_WAIT`] (they never stop the fleet's writes for longer). A
//! bulk write already under way finishes first: the approval waits for at most the transactions that had begun.
//! A turn is held around writes only, never around a request's reads or planning, so that the fleet's writes
//! wait for tens of milliseconds, not for a whole request.
//!
//! PostgreSQL locks rows, not the database: its writers do not queue behind each other, and [`Turns::bulk`] returns
//! at once there.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The longest a bulk write waits for approvals' writes, each time it asks.
pub const BULK_WAIT: Duration = Duration::from_millis(1_000);

/// The turns of one store's writes (shared by its clones).
#[derive(Debug, Default)]
pub(crate) struct Turns {
    /// Interactive turns held.
    held: AtomicUsize,
    /// Told when the last one is given back.
    free: tokio::sync::Notify,
    /// Bulk writes that waited ([`Turns::bulk`] found a turn held), and those that gave up after [`BULK_WAIT`].
    waited: AtomicUsize,
    gave_up: AtomicUsize,
}

/// An approval's writes in progress: bulk writes wait while it is held (dropped: given back).
#[derive(Debug)]
#[must_use = "the turn is given back when dropped"]
pub struct Interactive {
    turns: Option<Arc<Turns>>,
}

impl Interactive {
    /// A turn that holds nothing (PostgreSQL).
    fn none() -> Self {
        Interactive { turns: None }
    }
}

impl Drop for Interactive {
    fn drop(&mut self) {
        if let Some(t) = self.turns.take()
            && t.held.fetch_sub(1, Ordering::AcqRel) == 1
        {
            t.free.notify_waiters();
        }
    }
}

impl Turns {
    fn interactive(self: &Arc<Self>) -> Interactive {
        self.held.fetch_add(1, Ordering::AcqRel);
        Interactive { turns: Some(self.clone()) }
    }

    /// Waits while an interactive turn is held, at most `limit`. Whether it waited at all.
    async fn bulk(&self, limit: Duration) -> bool {
        if self.held.load(Ordering::Acquire) == 0 {
            return false;
        }
        self.waited.fetch_add(1, Ordering::AcqRel);
        let freed = async {
            loop {
                // Registered before the count is read again, so that a release between the two is not missed.
                let notified = self.free.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if self.held.load(Ordering::Acquire) == 0 {
                    return;
                }
                notified.await;
            }
        };
        if tokio::time::timeout(limit, freed).await.is_err() {
            self.gave_up.fetch_add(1, Ordering::AcqRel);
        }
        true
    }
}

/// Counts of [`Turns::bulk`] since the store opened: bulk writes that waited for an approval's, and those of them that
/// went ahead after [`BULK_WAIT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TurnCounts {
    /// Bulk writes that found an interactive turn held.
    pub waited: usize,
    /// Of those, the ones that waited [`BULK_WAIT`] and went ahead.
    pub gave_up: usize,
}

impl super::Store {
    /// An interactive turn: until it is dropped, the fleet's bulk writes wait (SQLite; on PostgreSQL it holds
    /// nothing). Taken for an approval's writes, before their transactions begin.
    pub fn interactive(&self) -> Interactive {
        match self.db {
            super::Db::Sqlite(_) => self.turns.interactive(),
            super::Db::Postgres(_) => Interactive::none(),
        }
    }

    /// Waits, before a bulk write's transaction, while an approval's writes hold a turn (at most [`BULK_WAIT`]).
    pub(crate) async fn bulk_turn(&self) {
        if matches!(self.db, super::Db::Sqlite(_)) {
            self.turns.bulk(BULK_WAIT).await;
        }
    }

    /// How often bulk writes waited for approvals' (see [`TurnCounts`]).
    pub fn turn_counts(&self) -> TurnCounts {
        // Gave up first: every one counted there was counted as waiting before.
        let gave_up = self.turns.gave_up.load(Ordering::Acquire);
        TurnCounts { waited: self.turns.waited.load(Ordering::Acquire), gave_up }
    }
}
