//! This replica's agent connections: who is connected, which spec generation each connection was told, the
//! WebSocket places each node holds, and when each node was last heard from. State only; the logic that uses it
//! lives in `agents.rs`.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::watch;

/// How often agents send a heartbeat.
pub const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(5);
/// A node not heard from for this long is not ready.
pub const NOT_READY_AFTER_MS: i64 = 20_000;

/// The live connections of this replica's agents, and when each node was last heard from.
#[derive(Debug, Default)]
pub struct Hub {
    specs: Mutex<HashMap<String, watch::Sender<i64>>>,
    /// Open WebSockets per node.
    sockets: Mutex<HashMap<String, usize>>,
    seen: Mutex<HashMap<String, i64>>,
    unsaved: Mutex<HashMap<String, i64>>,
    /// Held while this replica recomputes node specs (one refresh at a time).
    pub(crate) refresh: tokio::sync::Mutex<()>,
}

impl Hub {
    /// Generation changes for `node_id` from now on (the receiver starts at the last one this replica knows).
    pub fn subscribe(&self, node_id: &str) -> watch::Receiver<i64> {
        let mut specs = self.specs.lock().unwrap_or_else(|e| e.into_inner());
        specs.retain(|_, tx| tx.receiver_count() > 0);
        specs.entry(node_id.to_string()).or_insert_with(|| watch::channel(0).0).subscribe()
    }

    /// Wakes the connections of `node_id` when `generation` is newer than what they were told.
    pub fn notify(&self, node_id: &str, generation: i64) {
        let specs = self.specs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = specs.get(node_id) {
            tx.send_if_modified(|g| {
                let newer = generation > *g;
                if newer {
                    *g = generation;
                }
                newer
            });
        }
    }

    /// Takes one of the node's [`MAX_SOCKETS_PER_NODE`] WebSocket places on this replica, held until the slot is
    /// dropped; `None` when they are all taken.
    pub fn open_socket(self: &std::sync::Arc<Self>, node_id: &str) -> Option<SocketSlot> {
        let mut sockets = self.sockets.lock().unwrap_or_else(|e| e.into_inner());
        let open = sockets.entry(node_id.to_string()).or_insert(0);
        if *open >= MAX_SOCKETS_PER_NODE {
            return None;
        }
        *open += 1;
        Some(SocketSlot { hub: self.clone(), node_id: node_id.to_string() })
    }

    /// How many agents are connected to this replica.
    pub fn connected(&self) -> usize {
        let specs = self.specs.lock().unwrap_or_else(|e| e.into_inner());
        specs.values().map(watch::Sender::receiver_count).sum()
    }

    /// Records that `node_id` was heard from now.
    pub fn seen(&self, node_id: &str) {
        let now = tessera_store::now_ms();
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).insert(node_id.to_string(), now);
        self.unsaved.lock().unwrap_or_else(|e| e.into_inner()).insert(node_id.to_string(), now);
    }

    /// When this replica last heard from `node_id`.
    pub fn last_seen(&self, node_id: &str) -> Option<i64> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).get(node_id).copied()
    }

    /// Heartbeats not written to the store yet (taken).
    pub fn take_unsaved(&self) -> Vec<(String, i64)> {
        std::mem::take(&mut *self.unsaved.lock().unwrap_or_else(|e| e.into_inner())).into_iter().collect()
    }
}

/// Most WebSockets one node may hold open on one replica (its agent needs one; the rest cover a reconnect
/// before the server noticed the old socket is gone).
pub const MAX_SOCKETS_PER_NODE: usize = 4;

/// One of a node's WebSocket places, given back when dropped.
#[derive(Debug)]
pub struct SocketSlot {
    hub: std::sync::Arc<Hub>,
    node_id: String,
}

impl Drop for SocketSlot {
    fn drop(&mut self) {
        let mut sockets = self.hub.sockets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(open) = sockets.get_mut(&self.node_id) {
            *open = open.saturating_sub(1);
            if *open == 0 {
                sockets.remove(&self.node_id);
            }
        }
    }
}
