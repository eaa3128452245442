//! Tessera's Kubernetes controller: keeps every governed namespace of every registered cluster holding what its
//! tenant was granted — its labels, its ResourceQuota and, on a DRA cluster, a ResourceClaim per active allocation
//! pinned to exactly its device (the objects and the plan are `tessera_kubernetes::desired`'s).
//!
//! - **One leader.** Every replica runs [`spawn`]; the one holding the store lease [`LEASE`] (renewed every third
//!   of its lifetime) runs a worker per cluster. When it stops or stalls, the lease expires and another replica
//!   takes over; server-side apply makes redoing a half-finished reconcile harmless.
//! - **Each worker** ([`worker`]) connects with the cluster's credentials, watches Tessera's claims and quotas
//!   (kube-rs runtime `watcher`), and reconciles when Tessera's records change (compared every `tick`), when the
//!   cluster changes what Tessera wrote (a watch event), and every `resync` in any case. A failure is recorded on
//!   the cluster and retried with a doubling backoff up to `max_backoff`; the first reconcile that completes
//!   catches up on everything.
//! - **Server-side apply** with field manager `tessera` ([`tessera_kubernetes::names::FIELD_MANAGER`]), forced:
//!   Tessera owns the fields it sets and leaves others' alone. Claims no allocation needs are deleted after the
//!   pods reserved for them are asked to leave through the Eviction API with `eviction_grace_s`; a pod whose
//!   eviction is refused (its PodDisruptionBudget) for `eviction_refused_for` is deleted with that grace period.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use tessera_core::Catalog;
use tessera_store::Store;

pub mod kube_io;
pub mod worker;

/// The store lease the leader holds.
pub const LEASE: &str = "kubernetes-controller";

/// How the controller runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Kubeconfig files by the name clusters refer to them with.
    pub kubeconfigs: BTreeMap<String, PathBuf>,
    /// The server runs in a pod: a cluster without a kubeconfig is reached with the in-cluster service account.
    pub in_cluster: bool,
    /// This replica, as the lease names its holder.
    pub holder: String,
    /// How often Tessera's records are compared with what was last applied.
    pub tick: Duration,
    /// How often every cluster is reconciled whatever happened.
    pub resync: Duration,
    /// How long the lease lasts unless renewed.
    pub lease_ttl: Duration,
    /// The longest wait between two tries after a failure.
    pub max_backoff: Duration,
    /// The grace period of evictions, in seconds.
    pub eviction_grace_s: i64,
    /// How long a pod's eviction may be refused (a PodDisruptionBudget) before the pod is deleted, with the grace
    /// period, so that the device of an ended allocation is not held for ever.
    pub eviction_refused_for: Duration,
}

impl Settings {
    /// The defaults: compare every second, resync every 5 minutes, a 15 s lease, back off up to 30 s, evict with 30 s
    /// (Kubernetes' default termination grace), delete a pod whose eviction was refused for 5 minutes.
    pub fn new(kubeconfigs: BTreeMap<String, PathBuf>, in_cluster: bool, holder: String) -> Settings {
        Settings {
            kubeconfigs,
            in_cluster,
            holder,
            tick: Duration::from_secs(1),
            resync: Duration::from_secs(300),
            lease_ttl: Duration::from_secs(15),
            max_backoff: Duration::from_secs(30),
            eviction_grace_s: 30,
            eviction_refused_for: Duration::from_secs(300),
        }
    }
}

/// A worker's task, aborted when dropped: when the controller's own task is aborted (as when its process dies),
/// its workers stop with it.
#[derive(Debug)]
struct Worker(tokio::task::JoinHandle<()>);

impl Drop for Worker {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What a worker was started for: a change restarts it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct WorkerKey {
    kubeconfig: Option<String>,
}

/// Runs the controller until `stop` turns true (or its sender is dropped): leader election, and while leader a
/// worker per registered cluster. Gives the lease up when it stops.
pub async fn run(
    store: Store,
    catalog: &'static Catalog,
    settings: Settings,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut workers: HashMap<String, (WorkerKey, Worker)> = HashMap::new();
    let ttl_ms = i64::try_from(settings.lease_ttl.as_millis()).unwrap_or(i64::MAX);
    let mut was_leader = false;
    loop {
        // Without clusters there is nothing to lead: no lease is written.
        let any = match store.clusters().await {
            Ok(c) => !c.is_empty(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the clusters");
                was_leader
            }
        };
        let leader = if !any && !was_leader {
            false
        } else {
            // A renewal that does not answer within a third of the lease stands the workers down: by the time the
            // lease could have passed to another replica, this one no longer acts on its own.
            match tokio::time::timeout(settings.lease_ttl / 3, store.hold_lease(LEASE, &settings.holder, ttl_ms)).await
            {
                Ok(Ok(l)) => l,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "cannot renew the controller's lease; standing down");
                    false
                }
                Err(_) => {
                    tracing::warn!("the controller's lease was not renewed in time; standing down");
                    false
                }
            }
        };
        if leader != was_leader {
            tracing::info!(holder = %settings.holder, leader, "Kubernetes controller leadership");
            was_leader = leader;
        }
        if leader {
            match store.clusters().await {
                Ok(clusters) => {
                    workers.retain(|id, (_, worker)| clusters.iter().any(|c| &c.id == id) && !worker.0.is_finished());
                    for c in clusters {
                        let key = WorkerKey { kubeconfig: c.kubeconfig.clone() };
                        if workers.get(&c.id).is_some_and(|(k, _)| *k == key) {
                            continue;
                        }
                        // Replacing the entry drops (aborts) a worker started with other credentials.
                        let handle = tokio::spawn(worker::run(store.clone(), catalog, settings.clone(), c.id.clone()));
                        workers.insert(c.id, (key, Worker(handle)));
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot read the clusters"),
            }
        } else {
            workers.clear();
        }
        tokio::select! {
            _ = tokio::time::sleep(settings.lease_ttl / 3) => {}
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    break;
                }
            }
        }
    }
    workers.clear();
    if let Err(e) = store.drop_lease(LEASE, &settings.holder).await {
        tracing::warn!(error = %e, "cannot give the controller's lease up");
    }
}
