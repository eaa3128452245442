//! What the inbox streams follow: the newest event, and reads made on this replica.

use std::sync::Arc;
use std::time::Duration;

use tessera_store::Store;

/// How often the newest event is looked up while somebody follows the inbox: the longest a new event waits before
/// the streams are told (events written by any replica are seen, since the database is asked).
pub const INBOX_POLL: Duration = Duration::from_secs(1);

/// What inbox streams follow: a counter that moves when a new event is written (by any replica: while a stream
/// is open, one task asks for the newest event's `seq` every [`INBOX_POLL`]) or when an inbox is read here.
/// Streams then count their caller's unread events again. Nothing is asked while no stream is open.
#[derive(Debug)]
pub struct InboxWatch {
    tx: Arc<tokio::sync::watch::Sender<u64>>,
    started: std::sync::OnceLock<()>,
    /// Per user with a stream open on this replica: a counter that moves when that user's inbox is read here.
    reads: std::sync::Mutex<std::collections::HashMap<String, tokio::sync::watch::Sender<u64>>>,
}

impl Default for InboxWatch {
    fn default() -> Self {
        Self {
            tx: Arc::new(tokio::sync::watch::Sender::new(0)),
            started: std::sync::OnceLock::new(),
            reads: std::sync::Mutex::default(),
        }
    }
}

/// Users with a reads counter past which counters nobody follows any more are dropped.
const READS_PRUNE_AT: usize = 1024;

impl InboxWatch {
    /// Follows `user`'s inbox reads on this replica.
    pub fn subscribe_reads(&self, user: &str) -> tokio::sync::watch::Receiver<u64> {
        let mut reads = self.reads.lock().unwrap_or_else(|e| e.into_inner());
        if reads.len() >= READS_PRUNE_AT {
            reads.retain(|_, tx| tx.receiver_count() > 0);
        }
        reads.entry(user.to_string()).or_insert_with(|| tokio::sync::watch::Sender::new(0)).subscribe()
    }

    /// Tells `user`'s streams on this replica to count again (their inbox was read); nobody else's count again.
    pub fn bump_reads(&self, user: &str) {
        let reads = self.reads.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = reads.get(user) {
            tx.send_modify(|n| *n += 1);
        }
    }

    /// Follows the counter; the first call starts the task that looks for new events (it ends with the state).
    pub fn subscribe(&self, store: &Store) -> tokio::sync::watch::Receiver<u64> {
        self.started.get_or_init(|| {
            let tx = Arc::downgrade(&self.tx);
            let store = store.clone();
            tokio::spawn(async move {
                let mut latest = None;
                loop {
                    tokio::time::sleep(INBOX_POLL).await;
                    let Some(tx) = tx.upgrade() else { return };
                    if tx.receiver_count() == 0 {
                        continue;
                    }
                    match store.latest_event_seq().await {
                        // The first look also tells: an event may have come between a stream's first count
                        // and it (a needless count again costs one query per stream, once).
                        Ok(seq) if latest != Some(seq) => {
                            tx.send_modify(|n| *n += 1);
                            latest = Some(seq);
                        }
                        Ok(_) => {}
                        Err(e) => tracing::debug!(error = %e, "inbox watch: newest event not read"),
                    }
                }
            });
        });
        self.tx.subscribe()
    }
}
