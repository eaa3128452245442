//! Application state shared by every handler: one `Arc`, cloned per request.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tessera_core::Catalog;

use crate::auth::Auth;
use tessera_store::auth::{NodePrincipal, SessionRecord};
use tessera_store::{Principal, Store};

/// How long a resolved token is trusted without asking the database again. Revoking a token or changing a
/// membership clears this replica's cache at once; other replicas see the change within this time.
pub const PRINCIPAL_TTL: Duration = Duration::from_secs(5);
/// Most cached principals (and nodes' device lists): above a fleet's nodes and its people, so that a cache of a
/// 10,000-node fleet never fills in use; when full, expired entries go first, and the cache starts over only if
/// that frees nothing.
const PRINCIPAL_CACHE_MAX: usize = 100_000;

/// Everything a handler may need.
#[derive(Debug)]
pub struct App {
    /// The database.
    pub store: Store,
    /// The GPU catalog.
    pub catalog: &'static Catalog,
    /// Sign-in settings, the identity provider and password throttling.
    pub auth: Auth,
    /// Resolved credentials by credential hash, with when they were read.
    pub principals: PrincipalCache,
    /// Serialised request reads, by the store generation they were read at.
    pub reads: ReadCache,
    /// Request creations, written in batches.
    pub creates: crate::queue::CreateQueue,
    /// Connected agents and node heartbeats.
    pub hub: Arc<crate::hub::Hub>,
    /// Agents' telemetry: the live window and minutes not yet written.
    pub telemetry: Arc<crate::telemetry::Telemetry>,
    /// The devices each node owns (its GPUs and the MIG instances its status reports), for checking telemetry.
    pub node_gpus: NodeGpuCache,
    /// How often agents are asked to send their telemetry batches.
    pub pace: Arc<crate::state::pace::Pace>,
    /// Most connections open at once, and per client address.
    pub connections: crate::connections::Limits,
    /// The long-lived streams open on this replica, under their caps.
    pub streams: crate::streams::Streams,
    /// What tenants' budgets have spent, as the sweep last found it.
    pub budgets: crate::state::budgets::BudgetCache,
    /// The last simulation of the reservation calendar, reused while the calendar is unchanged.
    pub prepared: crate::state::prepared::PreparedCache,
    /// What wait explanations read (the fleet, the requests holding slices, the calendar), shared by the callers
    /// asking at the same time.
    pub wait_reads: crate::state::coalesced::Coalesced,
    /// The pending requests (the queue), read once per wave of callers placing requests in it.
    pub queue_reads: crate::state::coalesced::Coalesced,
    /// Webhook delivery settings.
    pub webhooks: crate::state::delivery::Delivery,
    /// The keys webhook secrets are sealed with.
    pub secrets: crate::sealed::Keyring,
    /// Webhook tests and redeliveries, one per endpoint or delivery at a time.
    pub sends: crate::throttle::Throttle,
    /// Mail settings; `None`: no mail is sent.
    pub email: Option<crate::email::EmailSettings>,
    /// What the inbox streams follow.
    pub inbox: crate::state::inbox::InboxWatch,
    /// What the server reaches Kubernetes clusters with.
    pub kubernetes: crate::state::kubernetes::KubernetesSettings,
    /// Whether this replica is shutting down (`/readyz` fails, sockets and streams end with a reconnect hint).
    pub draining: crate::state::draining::Draining,
}

/// How long a node's device list is trusted for telemetry checks while the store sees every change as it
/// commits ([`Store::sees_every_change`]): a join, an inventory or a status with other MIG instances, on any
/// replica, forgets or replaces it at once (see `agents::start_background`), so this only bounds what a lost
/// notification could leave stale. At 10,000 nodes a shorter life read every node's devices back from the store
/// every few seconds (four queries a node).
pub const NODE_GPUS_TTL: Duration = Duration::from_secs(300);
/// How long it is trusted while changes may go unseen (a PostgreSQL replica whose listener is reconnecting).
pub const NODE_GPUS_TTL_UNSURE: Duration = Duration::from_secs(10);

/// A cache of the devices each node owns.
#[derive(Debug, Default)]
pub struct NodeGpuCache(Mutex<NodeGpus>);

#[derive(Debug, Default)]
struct NodeGpus {
    entries: HashMap<String, (Instant, GpuSet)>,
    /// Moves when every node is forgotten: a list read before it moved is not kept.
    epoch: u64,
    /// Per node, moves with each change of that node (a forget, a stored status): a list of the node read before
    /// it moved may predate the change and is not kept. Per node, so that 10,000 nodes' statuses (a third of them
    /// each 10 s) do not keep every other node's read from being kept.
    node_epochs: HashMap<String, u64>,
}

/// What [`NodeGpuCache::put`] checks a read against: taken by [`NodeGpuCache::epoch`] before the read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpusEpoch(u64, u64);

/// The devices a node owns.
pub type GpuSet = Arc<crate::telemetry::Owned>;

impl NodeGpus {
    fn moved(&mut self, node_id: &str) {
        if self.node_epochs.len() >= PRINCIPAL_CACHE_MAX && !self.node_epochs.contains_key(node_id) {
            // Starting the per-node counters over: every read under way is dropped.
            self.node_epochs.clear();
            self.epoch += 1;
        }
        *self.node_epochs.entry(node_id.to_string()).or_default() += 1;
    }
}

impl NodeGpuCache {
    /// The node's devices, if read within [`NODE_GPUS_TTL`] (`sure`: the store sees every change) or
    /// [`NODE_GPUS_TTL_UNSURE`].
    pub fn get(&self, node_id: &str, sure: bool) -> Option<GpuSet> {
        let ttl = if sure { NODE_GPUS_TTL } else { NODE_GPUS_TTL_UNSURE };
        let map = self.0.lock().ok()?;
        map.entries.get(node_id).filter(|(at, _)| at.elapsed() < ttl).map(|(_, g)| g.clone())
    }

    /// What to pass to [`NodeGpuCache::put`]: take it before reading the node's devices from the store.
    pub fn epoch(&self, node_id: &str) -> GpusEpoch {
        self.0
            .lock()
            .map(|m| GpusEpoch(m.epoch, m.node_epochs.get(node_id).copied().unwrap_or(0)))
            .unwrap_or(GpusEpoch(u64::MAX, u64::MAX))
    }

    /// Remembers a node's devices, read from the store after [`NodeGpuCache::epoch`] returned `epoch`; nothing if
    /// the node's devices changed since (the read may predate the change).
    pub fn put(&self, node_id: &str, gpus: GpuSet, epoch: GpusEpoch) {
        if let Ok(mut map) = self.0.lock() {
            if GpusEpoch(map.epoch, map.node_epochs.get(node_id).copied().unwrap_or(0)) != epoch {
                return;
            }
            if map.entries.len() >= PRINCIPAL_CACHE_MAX {
                map.entries.retain(|_, (at, _)| at.elapsed() < NODE_GPUS_TTL);
            }
            if map.entries.len() >= PRINCIPAL_CACHE_MAX {
                map.entries.clear();
            }
            map.entries.insert(node_id.to_string(), (Instant::now(), gpus));
        }
    }

    /// A status this process stored for the node: its MIG instances replace the cached ones (the GPUs stay);
    /// nothing is read back from the store.
    pub fn observe_status(&self, node_id: &str, status: &tessera_core::api::NodeStatus) {
        if let Ok(mut map) = self.0.lock() {
            map.moved(node_id);
            if let Some((_, owned)) = map.entries.get_mut(node_id) {
                let now = crate::telemetry::Owned::of(owned.gpus.iter().map(String::as_str), Some(status));
                if now != **owned {
                    *owned = Arc::new(now);
                }
            }
        }
    }

    /// Forgets a node's devices (its GPUs or its MIG instances changed).
    pub fn forget(&self, node_id: &str) {
        if let Ok(mut map) = self.0.lock() {
            map.moved(node_id);
            map.entries.remove(node_id);
        }
    }

    /// Forgets every node's devices (changes were missed).
    pub fn clear(&self) {
        if let Ok(mut map) = self.0.lock() {
            map.epoch += 1;
            map.entries.clear();
        }
    }
}

/// What a credential resolved to.
#[derive(Debug, Clone)]
pub enum Resolved {
    /// A user (API token or JWT access token).
    User(Principal),
    /// A browser session and its user.
    Session(SessionRecord, Principal),
    /// A node.
    Node(NodePrincipal),
}

/// How long a resolved node credential is trusted while the store sees every change as it commits: a revocation,
/// on any replica, forgets every resolved credential at once (see `agents::start_background`). Nodes call several
/// times a minute each; at 10,000 nodes the user lifetime ([`PRINCIPAL_TTL`]) cost a query for almost every
/// telemetry batch.
pub const NODE_PRINCIPAL_TTL: Duration = Duration::from_secs(300);

/// A short-lived cache of resolved credentials (keyed by a hash of the credential), so that a busy client does not
/// cost queries on every call.
#[derive(Debug, Default)]
pub struct PrincipalCache(Mutex<Principals>);

#[derive(Debug, Default)]
struct Principals {
    entries: HashMap<String, (Instant, Resolved)>,
    /// Moves with every clear: a node read before it moved may have been revoked since and is not kept.
    epoch: u64,
}

/// How long an entry is good for.
fn lifetime(resolved: &Resolved, sure: bool) -> Duration {
    match resolved {
        Resolved::Node(_) if sure => NODE_PRINCIPAL_TTL,
        _ => PRINCIPAL_TTL,
    }
}

impl PrincipalCache {
    /// The cached resolution of a credential hash, if fresh.
    pub fn get(&self, hash: &str) -> Option<Resolved> {
        let map = self.0.lock().ok()?;
        map.entries.get(hash).filter(|(at, _)| at.elapsed() < PRINCIPAL_TTL).map(|(_, p)| p.clone())
    }

    /// The cached node a node credential's hash resolved to, if read within [`NODE_PRINCIPAL_TTL`] (`sure`: the
    /// store sees every revocation) or [`PRINCIPAL_TTL`].
    pub fn get_node(&self, hash: &str, sure: bool) -> Option<NodePrincipal> {
        let ttl = if sure { NODE_PRINCIPAL_TTL } else { PRINCIPAL_TTL };
        let map = self.0.lock().ok()?;
        match map.entries.get(hash) {
            Some((at, Resolved::Node(n))) if at.elapsed() < ttl => Some(n.clone()),
            _ => None,
        }
    }

    /// The cached resolution of a credential hash, if read within `max_age` (streams checking their right read
    /// the database more often than the cache's own lifetime).
    pub fn get_within(&self, hash: &str, max_age: Duration) -> Option<Resolved> {
        let map = self.0.lock().ok()?;
        map.entries.get(hash).filter(|(at, _)| at.elapsed() < max_age.min(PRINCIPAL_TTL)).map(|(_, p)| p.clone())
    }

    /// What to pass to [`PrincipalCache::put_node`]: take it before reading the node from the store.
    pub fn epoch(&self) -> u64 {
        self.0.lock().map(|m| m.epoch).unwrap_or(u64::MAX)
    }

    /// Remembers a resolution.
    pub fn put(&self, hash: String, resolved: Resolved) {
        if let Ok(mut map) = self.0.lock() {
            map.insert(hash, resolved);
        }
    }

    /// Remembers a node credential's node, read from the store after [`PrincipalCache::epoch`] returned `epoch`;
    /// nothing if the cache was cleared since (a revocation may have committed after the read).
    pub fn put_node(&self, hash: String, node: NodePrincipal, epoch: u64) {
        if let Ok(mut map) = self.0.lock()
            && map.epoch == epoch
        {
            map.insert(hash, Resolved::Node(node));
        }
    }

    /// Forgets one credential (a session ended).
    pub fn remove(&self, hash: &str) {
        if let Ok(mut map) = self.0.lock() {
            map.entries.remove(hash);
        }
    }

    /// Forgets everything (a token was revoked or a membership changed).
    pub fn clear(&self) {
        if let Ok(mut map) = self.0.lock() {
            map.epoch += 1;
            map.entries.clear();
        }
    }
}

impl Principals {
    fn insert(&mut self, hash: String, resolved: Resolved) {
        if self.entries.len() >= PRINCIPAL_CACHE_MAX {
            // Node entries may be kept longer than user ones; none outlives NODE_PRINCIPAL_TTL.
            self.entries.retain(|_, (at, r)| at.elapsed() < lifetime(r, true));
        }
        if self.entries.len() >= PRINCIPAL_CACHE_MAX {
            self.entries.clear();
        }
        self.entries.insert(hash, (Instant::now(), resolved));
    }
}

/// Most bytes of cached read responses; past it the cache starts over.
const READ_CACHE_BYTES: usize = 32 * 1024 * 1024;
/// Largest response worth caching (a page of 20 typical requests is about 6 KiB).
const READ_CACHE_LARGEST: usize = 256 * 1024;
/// Longest a cached response is served, however quiet the store: a bound on staleness should a change notification
/// ever go unseen without the listener noticing (a silent network partition).
pub const READ_CACHE_TTL: Duration = Duration::from_secs(5);

/// Serialised responses of request reads (list pages), each filed under the store generation it was read at
/// ([`Store::generation`]) and served only while the generation is unchanged, so a read never returns anything
/// older than the last committed change to requests. Dashboards poll the same pages over and over; between writes
/// those polls cost no query.
#[derive(Debug, Default)]
pub struct ReadCache(Mutex<ReadEntries>);

#[derive(Debug, Default)]
struct ReadEntries {
    generation: u64,
    bytes: usize,
    bodies: HashMap<String, (Instant, axum::body::Bytes)>,
}

impl ReadCache {
    /// The body filed under `key` at `generation`, if there is one and it is fresh.
    pub fn get(&self, key: &str, generation: u64) -> Option<axum::body::Bytes> {
        let entries = self.0.lock().ok()?;
        if entries.generation != generation {
            return None;
        }
        entries.bodies.get(key).filter(|(at, _)| at.elapsed() < READ_CACHE_TTL).map(|(_, body)| body.clone())
    }

    /// Files `body` under `key` at `generation` (bodies read at older generations go; one read at an older
    /// generation than the newest filed, or too large, is not kept).
    pub fn put(&self, key: String, generation: u64, body: axum::body::Bytes) {
        let Ok(mut entries) = self.0.lock() else { return };
        if generation < entries.generation || body.len() > READ_CACHE_LARGEST {
            return;
        }
        if generation > entries.generation || entries.bytes + body.len() + key.len() > READ_CACHE_BYTES {
            entries.bodies.clear();
            entries.bytes = 0;
            entries.generation = generation;
        }
        let key_len = key.len();
        entries.bytes += body.len() + key_len;
        if let Some((_, old)) = entries.bodies.insert(key, (Instant::now(), body)) {
            entries.bytes -= old.len() + key_len;
        }
    }
}

/// Handler state.
#[derive(Debug, Clone)]
pub struct AppState(pub Arc<App>);

impl std::ops::Deref for AppState {
    type Target = App;

    fn deref(&self) -> &App {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Bytes;

    use std::sync::Arc;

    use tessera_store::auth::NodePrincipal;

    use super::{NodeGpuCache, PrincipalCache, READ_CACHE_LARGEST, ReadCache};
    use crate::telemetry::Owned;

    fn status(instances: &[&str]) -> tessera_core::api::NodeStatus {
        let instances: Vec<serde_json::Value> = instances
            .iter()
            .map(|u| {
                serde_json::json!({"profile": "1g.10gb", "start": 0, "uuid": u, "gi_id": 1, "ci_id": 0,
                    "device_name": "MIG 1g.10gb Device 0"})
            })
            .collect();
        serde_json::from_value(serde_json::json!({"observed_generation": 1,
            "gpus": [{"uuid": "GPU-0", "mig_enabled": true, "instances": instances}]}))
        .expect("status")
    }

    #[test]
    fn a_node_device_list_read_before_a_change_is_not_kept_and_a_stored_status_replaces_the_instances() {
        let cache = NodeGpuCache::default();
        let read = |instances: &[&str]| Arc::new(Owned::of(["GPU-0"], Some(&status(instances))));
        let epoch = cache.epoch("n1");
        cache.put("n1", read(&[]), epoch);
        assert_eq!(cache.get("n1", true).map(|o| o.len()), Some(1), "the GPU alone");
        // A status this process stored: the cached list takes its instances without a read.
        cache.observe_status("n1", &status(&["MIG-a", "MIG-b"]));
        let now = cache.get("n1", true).expect("kept");
        assert!(
            now.owns("MIG-a", "GPU-0", true) && now.owns("MIG-b", "GPU-0", true) && now.owns("GPU-0", "GPU-0", false)
        );
        assert!(!now.owns("MIG-c", "GPU-0", true));
        // A read that started before its node changed is not kept; another node's change does not matter.
        let epoch = cache.epoch("n3");
        cache.forget("n3");
        cache.put("n3", read(&[]), epoch);
        assert!(cache.get("n3", true).is_none(), "read before a change: not kept");
        let epoch = cache.epoch("n3");
        cache.observe_status("n3", &status(&[]));
        cache.put("n3", read(&[]), epoch);
        assert!(cache.get("n3", true).is_none(), "read before a status was stored: not kept");
        let epoch = cache.epoch("n3");
        cache.observe_status("n9", &status(&[]));
        cache.forget("n2");
        cache.put("n3", read(&[]), epoch);
        assert!(cache.get("n3", true).is_some() && cache.get("n3", false).is_some(), "other nodes' changes: kept");
        let epoch = cache.epoch("n4");
        cache.clear();
        cache.put("n4", read(&[]), epoch);
        assert!(cache.get("n4", true).is_none(), "read before everything was forgotten: not kept");
        cache.put("n3", read(&[]), cache.epoch("n3"));
        cache.forget("n1");
        assert!(cache.get("n1", true).is_none());
        cache.clear();
        assert!(cache.get("n3", true).is_none());
    }

    #[test]
    fn a_node_read_before_a_revocation_is_not_kept() {
        let cache = PrincipalCache::default();
        let node = || NodePrincipal { node_id: "n1".into(), node_name: "gpu-01".into() };
        let epoch = cache.epoch();
        cache.put_node("node:h1".into(), node(), epoch);
        assert_eq!(cache.get_node("node:h1", true), Some(node()));
        assert_eq!(cache.get_node("node:h1", false), Some(node()), "fresh either way");
        assert!(cache.get_node("node:h2", true).is_none());
        // A revocation clears the cache; a read that started before it is not kept.
        let epoch = cache.epoch();
        cache.clear();
        assert!(cache.get_node("node:h1", true).is_none());
        cache.put_node("node:h1".into(), node(), epoch);
        assert!(cache.get_node("node:h1", true).is_none(), "read before the revocation: not kept");
        cache.put_node("node:h1".into(), node(), cache.epoch());
        assert!(cache.get_node("node:h1", true).is_some());
    }

    #[test]
    fn cached_reads_are_served_only_at_the_generation_they_were_read_at() {
        let cache = ReadCache::default();
        cache.put("a".into(), 2, Bytes::from_static(b"page at 2"));
        assert_eq!(cache.get("a", 2).as_deref(), Some(&b"page at 2"[..]));
        assert_eq!(cache.get("a", 3), None, "a later generation never sees an older read");
        assert_eq!(cache.get("b", 2), None);
        cache.put("a".into(), 1, Bytes::from_static(b"read before the change"));
        assert_eq!(cache.get("a", 2).as_deref(), Some(&b"page at 2"[..]), "a late, older read is not kept");
        cache.put("b".into(), 3, Bytes::from_static(b"page at 3"));
        assert_eq!(cache.get("a", 3), None, "moving on drops what was read before");
        assert_eq!(cache.get("b", 3).as_deref(), Some(&b"page at 3"[..]));
        cache.put("big".into(), 3, Bytes::from(vec![b'x'; READ_CACHE_LARGEST + 1]));
        assert_eq!(cache.get("big", 3), None, "too large to keep");
    }
}
