//! A counter of committed changes, so that readers can cache what they read from the store and know when it went
//! stale.
//!
//! Every store method that writes requests bumps the counter after its transaction commits (or when its caller stops
//! waiting, since the commit may have happened anyway). A reader takes
//! [`Changes::current`] *before* it queries and files what it read under that generation; the entry is good for as
//! long as the generation has not moved. A write that commits during the query bumps the counter past the entry's
//! generation, so nothing older than the last commit is ever served.
//!
//! With PostgreSQL other server replicas write too. A trigger on `slice_requests` notifies the `tessera_changes`
//! channel on every statement that changes requests, and a listener bumps the counter when a notification
//! arrives (so other replicas' writes are seen within the notification's delivery time, typically well under a
//! millisecond on one network). While the listener is not connected, [`Changes::current`] is `None`: nothing may
//! be cached, because notifications sent meanwhile are lost.

use std::sync::Weak;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgListener;

/// The channel the PostgreSQL trigger notifies (migration `0007_change_notify.sql`).
pub const CHANNEL: &str = "tessera_changes";
/// The channel node spec changes are notified on, with `<node id>:<generation>` (migration `0009_agents.sql`).
pub const NODE_SPEC_CHANNEL: &str = "tessera_node_spec";
/// The channel revoked node credentials are notified on, with the node's id (migration
/// `0013_node_credential_notify.sql`).
pub const NODE_CREDENTIALS_CHANNEL: &str = "tessera_node_credentials";
/// The channel a change of the devices a node may send telemetry for is notified on, with the node's id: a GPU
/// registered to it, or another set of MIG instances in its stored status (migration
/// `0032_node_devices_notify.sql`).
pub const NODE_DEVICES_CHANNEL: &str = "tessera_node_devices";

/// The node id announced on the node credential and device channels when announcements may have been missed (the
/// PostgreSQL listener lost or regained its connection): every node, as if each had changed.
pub const EVERY_NODE: &str = "";

/// The change counter (see the module docs).
#[derive(Debug)]
pub struct Changes {
    generation: AtomicU64,
    /// Whether every committed change is seen (always for SQLite, whose only writer is this process; for
    /// PostgreSQL, while the listener is connected).
    complete: AtomicBool,
    /// Node spec changes `(node id, generation)`, from this process and (PostgreSQL) from every other writer.
    node_specs: tokio::sync::broadcast::Sender<(String, i64)>,
    /// Nodes whose credentials were revoked, from this process and (PostgreSQL) from every other writer.
    node_credentials: tokio::sync::broadcast::Sender<String>,
    /// Nodes whose devices changed (see [`NODE_DEVICES_CHANNEL`]): from this process for GPUs registered by a join
    /// or an inventory, and (PostgreSQL) from every writer for those and for statuses.
    node_devices: tokio::sync::broadcast::Sender<String>,
}

impl Changes {
    /// A counter that sees every change from the start (SQLite).
    pub(super) fn local() -> Changes {
        Changes {
            generation: AtomicU64::new(1),
            complete: AtomicBool::new(true),
            node_specs: tokio::sync::broadcast::channel(4096).0,
            node_credentials: tokio::sync::broadcast::channel(1024).0,
            node_devices: tokio::sync::broadcast::channel(4096).0,
        }
    }

    /// A counter that sees other writers' changes only once [`follow`] is listening (PostgreSQL).
    pub(super) fn shared() -> Changes {
        Changes {
            generation: AtomicU64::new(1),
            complete: AtomicBool::new(false),
            node_specs: tokio::sync::broadcast::channel(4096).0,
            node_credentials: tokio::sync::broadcast::channel(1024).0,
            node_devices: tokio::sync::broadcast::channel(4096).0,
        }
    }

    /// Records that a change committed.
    pub(super) fn bump(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// The current generation, or `None` while changes may go unseen (then nothing may be cached).
    pub fn current(&self) -> Option<u64> {
        let generation = self.generation.load(Ordering::SeqCst);
        self.complete.load(Ordering::SeqCst).then_some(generation)
    }

    /// Announces that a node's spec moved to `generation`.
    pub(super) fn node_spec(&self, node_id: &str, generation: i64) {
        let _ = self.node_specs.send((node_id.to_string(), generation));
    }

    /// Node spec changes from now on.
    pub fn node_specs(&self) -> tokio::sync::broadcast::Receiver<(String, i64)> {
        self.node_specs.subscribe()
    }

    /// Announces that a node's credentials were revoked.
    pub(super) fn node_credentials_revoked(&self, node_id: &str) {
        let _ = self.node_credentials.send(node_id.to_string());
    }

    /// Nodes whose credentials are revoked from now on.
    pub fn node_credential_revocations(&self) -> tokio::sync::broadcast::Receiver<String> {
        self.node_credentials.subscribe()
    }

    /// Announces that the devices a node may send telemetry for changed.
    pub(super) fn node_devices_changed(&self, node_id: &str) {
        let _ = self.node_devices.send(node_id.to_string());
    }

    /// Nodes whose devices change from now on.
    pub fn node_device_changes(&self) -> tokio::sync::broadcast::Receiver<String> {
        self.node_devices.subscribe()
    }

    fn set_complete(&self, complete: bool) {
        // Bumped either way: what was read before the listener (re)connected may have missed a change.
        self.bump();
        self.complete.store(complete, Ordering::SeqCst);
        self.bump();
        // Likewise for what is cached of nodes: every node, as if each had changed.
        self.node_credentials_revoked(EVERY_NODE);
        self.node_devices_changed(EVERY_NODE);
    }
}

/// Counts a change when dropped (see `Store::changing`).
pub(super) struct Changing<'a>(pub(super) &'a Changes);

impl Drop for Changing<'_> {
    fn drop(&mut self) {
        self.0.bump();
    }
}

/// Listens for change notifications from every writer of `pool`'s database and bumps `changes` for each, until the
/// pool is closed or the store dropped. Reconnects after a lost connection; while disconnected, the counter reports
/// itself incomplete.
pub(super) async fn follow(pool: PgPool, changes: Weak<Changes>) {
    loop {
        if pool.is_closed() {
            return;
        }
        match listen(&pool).await {
            Ok(mut listener) => {
                match changes.upgrade() {
                    Some(c) => c.set_complete(true),
                    None => return,
                }
                loop {
                    let got = listener.try_recv().await;
                    let Some(c) = changes.upgrade() else { return };
                    match got {
                        Ok(Some(n)) if n.channel() == NODE_SPEC_CHANNEL => {
                            if let Some((node, generation)) = n.payload().rsplit_once(':')
                                && let Ok(generation) = generation.parse()
                            {
                                c.node_spec(node, generation);
                            }
                        }
                        Ok(Some(n)) if n.channel() == NODE_CREDENTIALS_CHANNEL => {
                            c.node_credentials_revoked(n.payload());
                        }
                        Ok(Some(n)) if n.channel() == NODE_DEVICES_CHANNEL => {
                            c.node_devices_changed(n.payload());
                        }
                        Ok(Some(_)) => c.bump(),
                        // Lost the connection (`None`), or the pool is closing: notifications may be missed.
                        Ok(None) | Err(_) => {
                            c.set_complete(false);
                            break;
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot listen for change notifications; retrying"),
        }
        if changes.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn listen(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen_all([CHANNEL, NODE_SPEC_CHANNEL, NODE_CREDENTIALS_CHANNEL, NODE_DEVICES_CHANNEL]).await?;
    Ok(listener)
}
