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
}

/// How long a node's device list is trusted for telemetry checks (a new status or inventory forgets it at once).
const NODE_GPUS_TTL: Duration = Duration::from_secs(10);

/// A short-lived cache of the devices each node owns.
#[derive(Debug, Default)]
pub struct NodeGpuCache(Mutex<HashMap<String, (Instant, GpuSet)>>);

/// The devices a node owns.
pub type GpuSet = Arc<crate::telemetry::Owned>;

impl NodeGpuCache {
    /// The node's devices, if read recently.
    pub fn get(&self, node_id: &str) -> Option<GpuSet> {
        let map = self.0.lock().ok()?;
        map.get(node_id).filter(|(at, _)| at.elapsed() < NODE_GPUS_TTL).map(|(_, g)| g.clone())
    }

    /// Remembers a node's devices.
    pub fn put(&self, node_id: &str, gpus: GpuSet) {
        if let Ok(mut map) = self.0.lock() {
            if map.len() >= PRINCIPAL_CACHE_MAX {
                map.retain(|_, (at, _)| at.elapsed() < NODE_GPUS_TTL);
            }
            if map.len() >= PRINCIPAL_CACHE_MAX {
                map.clear();
            }
            map.insert(node_id.to_string(), (Instant::now(), gpus));
        }
    }

    /// Forgets a node's devices (its status or inventory changed).
    pub fn forget(&self, node_id: &str) {
        if let Ok(mut map) = self.0.lock() {
            map.remove(node_id);
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

/// A short-lived cache of resolved credentials (keyed by a hash of the credential), so that a busy client does not
/// cost queries on every call.
#[derive(Debug, Default)]
pub struct PrincipalCache(Mutex<HashMap<String, (Instant, Resolved)>>);

impl PrincipalCache {
    /// The cached resolution of a credential hash, if fresh.
    pub fn get(&self, hash: &str) -> Option<Resolved> {
        let map = self.0.lock().ok()?;
        map.get(hash).filter(|(at, _)| at.elapsed() < PRINCIPAL_TTL).map(|(_, p)| p.clone())
    }

    /// The cached resolution of a credential hash, if read within `max_age` (streams checking their right read
    /// the database more often than the cache's own lifetime).
    pub fn get_within(&self, hash: &str, max_age: Duration) -> Option<Resolved> {
        let map = self.0.lock().ok()?;
        map.get(hash).filter(|(at, _)| at.elapsed() < max_age.min(PRINCIPAL_TTL)).map(|(_, p)| p.clone())
    }

    /// Remembers a resolution.
    pub fn put(&self, hash: String, resolved: Resolved) {
        if let Ok(mut map) = self.0.lock() {
            if map.len() >= PRINCIPAL_CACHE_MAX {
                map.retain(|_, (at, _)| at.elapsed() < PRINCIPAL_TTL);
            }
            if map.len() >= PRINCIPAL_CACHE_MAX {
                map.clear();
            }
            map.insert(hash, (Instant::now(), resolved));
        }
    }

    /// Forgets one credential (a session ended).
    pub fn remove(&self, hash: &str) {
        if let Ok(mut map) = self.0.lock() {
            map.remove(hash);
        }
    }

    /// Forgets everything (a token was revoked or a membership changed).
    pub fn clear(&self) {
        if let Ok(mut map) = self.0.lock() {
            map.clear();
        }
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

    use super::{READ_CACHE_LARGEST, ReadCache};

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
