//! One cluster's worker: connect, watch what Tessera wrote, and reconcile when Tessera's records change, when the
//! cluster changes Tessera's objects, and every resync; back off on failures.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tessera_core::Catalog;
use tessera_kubernetes::desired::{self, Active, Governed, NamespaceObjects};
use tessera_store::{Store, StoreError};

use crate::Settings;
use crate::kube_io::{self, KubeError};

/// Why a reconcile did not complete.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error(transparent)]
    Kube(#[from] KubeError),
    #[error("reading Tessera's records: {0}")]
    Store(#[from] StoreError),
}

/// What Tessera's records say the cluster's governed namespaces should hold; `None` once the cluster is gone.
pub async fn desired(
    store: &Store,
    catalog: &Catalog,
    cluster_id: &str,
) -> Result<Option<Vec<NamespaceObjects>>, StoreError> {
    let cluster = match store.cluster(cluster_id).await {
        Ok(c) => c,
        Err(StoreError::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    let allocations = store.cluster_allocations(cluster_id).await?;
    let governed: Vec<Governed<'_>> = cluster
        .namespaces
        .iter()
        .map(|n| Governed { namespace: &n.namespace, tenant_id: &n.tenant_id, tenant: &n.tenant_name })
        .collect();
    let active: Vec<Active<'_>> = allocations
        .iter()
        .map(|a| Active {
            allocation: &a.id,
            request: &a.request_id,
            tenant_id: &a.tenant_id,
            profile: &a.profile,
            device_uuid: &a.device_uuid,
        })
        .collect();
    let profiles: BTreeSet<&str> =
        catalog.models.iter().flat_map(|m| m.profiles.iter().map(|p| p.name.as_str())).collect();
    let profiles: Vec<&str> = profiles.into_iter().collect();
    Ok(Some(desired::desired(&cluster.id, cluster.mode, &governed, &active, &profiles)))
}

/// Runs the worker of `cluster_id` until the cluster is gone (or the task is aborted).
pub async fn run(store: Store, catalog: &'static Catalog, settings: Settings, cluster_id: String) {
    let mut backoff = Duration::from_secs(1);
    // Kept across reconnects: a refusal's clock does not restart with each failure.
    let mut refusals = kube_io::Refusals::default();
    loop {
        match serve(&store, catalog, &settings, &cluster_id, &mut backoff, &mut refusals).await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(cluster = %cluster_id, error = %e, retry_in_s = backoff.as_secs_f64(), "Kubernetes reconcile failed");
                if let Err(s) = store.record_sync_error(&cluster_id, &e.to_string()).await {
                    tracing::warn!(cluster = %cluster_id, error = %s, "cannot record the failure");
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(settings.max_backoff);
            }
        }
    }
}

/// Connects and reconciles until a failure (returned, for the caller's backoff) or until the cluster is gone.
async fn serve(
    store: &Store,
    catalog: &Catalog,
    settings: &Settings,
    cluster_id: &str,
    backoff: &mut Duration,
    refusals: &mut kube_io::Refusals,
) -> Result<(), Failure> {
    let cluster = match store.cluster(cluster_id).await {
        Ok(c) => c,
        Err(StoreError::NotFound { .. }) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let path = match &cluster.kubeconfig {
        Some(name) => Some((
            name.as_str(),
            settings.kubeconfigs.get(name).cloned().ok_or_else(|| {
                KubeError::Config(format!("this server's settings have no kubeconfig named `{name}`"))
            })?,
        )),
        None if !settings.in_cluster => {
            return Err(
                KubeError::Config("this server runs in no pod: it has no in-cluster service account".into()).into()
            );
        }
        None => None,
    };
    let client = kube_io::connect(path.as_ref().map(|(name, p)| (*name, p.as_path()))).await?;
    // A change to what Tessera wrote, by anybody, wakes the worker.
    let changed = Arc::new(tokio::sync::Notify::new());
    let config = watcher::Config::default().labels(&desired::selector(cluster_id));
    let claims = watch_task(Api::<ResourceClaim>::all(client.clone()), config.clone(), changed.clone());
    let quotas = watch_task(Api::<ResourceQuota>::all(client.clone()), config, changed.clone());
    let _stop = AbortOnDrop(vec![claims, quotas]);
    let mut last: Option<Vec<NamespaceObjects>> = None;
    let mut synced = Instant::now();
    let mut woken = true;
    loop {
        let Some(want) = desired(store, catalog, cluster_id).await? else { return Ok(()) };
        let due = woken || last.as_ref() != Some(&want) || synced.elapsed() >= settings.resync;
        if due {
            reconcile(store, settings, &client, cluster_id, &want, refusals).await?;
            *backoff = Duration::from_secs(1);
            last = Some(want);
            synced = Instant::now();
        }
        woken = tokio::select! {
            _ = changed.notified() => true,
            _ = tokio::time::sleep(settings.tick) => false,
        };
    }
}

/// Reads the cluster back, carries out the plan, and records the outcome with the claims as they are after it.
async fn reconcile(
    store: &Store,
    settings: &Settings,
    client: &kube::Client,
    cluster_id: &str,
    want: &[NamespaceObjects],
    refusals: &mut kube_io::Refusals,
) -> Result<(), Failure> {
    let namespaces: Vec<&str> = want.iter().map(|d| d.namespace.as_str()).collect();
    let (observed, missing) = kube_io::observe(client, cluster_id, &namespaces).await?;
    let present: Vec<NamespaceObjects> = want.iter().filter(|d| !missing.contains(&d.namespace)).cloned().collect();
    let actions = desired::plan(&present, &observed);
    if !actions.is_empty() {
        tracing::info!(cluster = %cluster_id, changes = actions.len(), "reconciling Kubernetes objects");
    }
    let evictions =
        kube_io::Evictions { grace_s: settings.eviction_grace_s, refused_for: settings.eviction_refused_for };
    kube_io::execute(client, &actions, &evictions, refusals).await?;
    let after = if actions.is_empty() { observed.claims } else { kube_io::claims(client, cluster_id).await? };
    let mut status = kube_io::claim_status(&present, &after, tessera_store::now_ms());
    for s in &mut status {
        s.cluster_id = cluster_id.to_string();
    }
    store.record_sync(cluster_id, &status).await?;
    if !missing.is_empty() {
        let error = format!(
            "namespace(s) {} do not exist in the cluster: Tessera governs namespaces, it does not create them",
            missing.join(", ")
        );
        store.record_sync_error(cluster_id, &error).await?;
    }
    Ok(())
}

/// Follows `api`'s objects matching `config` and wakes `changed` on every event.
fn watch_task<K>(api: Api<K>, config: watcher::Config, changed: Arc<tokio::sync::Notify>) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    tokio::spawn(async move {
        let mut events = watcher(api, config).default_backoff().boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(_) => changed.notify_one(),
                Err(e) => tracing::debug!(error = %e, "watch interrupted; it resumes"),
            }
        }
    })
}

/// Aborts its tasks when dropped.
struct AbortOnDrop(Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}
