//! Talking to one cluster: connecting with its credentials, reading back what Tessera wrote there, and carrying
//! out a plan (server-side apply, evictions, deletions).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod, ResourceQuota};
use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ObjectMeta};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use tessera_kubernetes::desired::{self, Action, NamespaceObjects, Observed, ObservedClaim};
use tessera_kubernetes::names;
use tessera_store::controller::AllocationClaim;

/// A failure reaching or changing the cluster.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// The credentials do not give a client.
    #[error("cannot reach the cluster with its credentials: {0}")]
    Config(String),
    /// Several changes failed.
    #[error("{0} changes failed: {1}")]
    Several(usize, String),
    /// The API server refused or did not answer.
    #[error("{what}: {error}")]
    Api {
        /// What was being done.
        what: String,
        /// The API's answer.
        error: kube::Error,
    },
}

fn api_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> KubeError {
    let what = what.into();
    move |error| KubeError::Api { what, error }
}

/// A client for a cluster reached with the kubeconfig at `kubeconfig`, or with the in-cluster service account.
pub async fn connect(kubeconfig: Option<(&str, &Path)>) -> Result<kube::Client, KubeError> {
    let config = match kubeconfig {
        // Errors name the kubeconfig by its name in the settings, never by its path (they reach the API).
        Some((name, path)) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .map_err(|_| KubeError::Config(format!("kubeconfig `{name}` cannot be read or parsed")))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| KubeError::Config(format!("kubeconfig `{name}`: {e}")))?
        }
        None => kube::Config::incluster().map_err(|e| KubeError::Config(e.to_string()))?,
    };
    let mut config = config;
    // The worker retries with its own backoff and records each failure on the cluster; kube-rs's own retries (429,
    // 503, 504; up to 15 times, waits growing to minutes) would hold one call for as long as an outage lasts, and
    // nobody would see why.
    config.default_retry = false;
    config.connect_timeout = Some(std::time::Duration::from_secs(10));
    kube::Client::try_from(config).map_err(|e| KubeError::Config(e.to_string()))
}

/// What the cluster holds of Tessera's in `namespaces`, and which of them do not exist.
pub async fn observe(
    client: &kube::Client,
    cluster: &str,
    namespaces: &[&str],
) -> Result<(Observed, Vec<String>), KubeError> {
    let mut observed = Observed::default();
    let mut missing = Vec::new();
    let all: Api<Namespace> = Api::all(client.clone());
    for ns in namespaces {
        match all.get_opt(ns).await.map_err(api_error(format!("reading namespace {ns}")))? {
            Some(n) => {
                observed.namespaces.insert((*ns).to_string(), n);
            }
            None => missing.push((*ns).to_string()),
        }
    }
    let selector = ListParams::default().labels(&desired::selector(cluster));
    // Namespaces Tessera labelled: those no longer governed lose the labels.
    for n in all.list(&selector).await.map_err(api_error("listing the namespaces Tessera labelled"))? {
        if let Some(name) = n.metadata.name.clone() {
            observed.namespaces.entry(name).or_insert(n);
        }
    }
    let quotas: Api<ResourceQuota> = Api::all(client.clone());
    for q in quotas.list(&selector).await.map_err(api_error("listing Tessera's ResourceQuotas"))? {
        if q.metadata.name.as_deref() == Some(names::QUOTA_NAME)
            && let Some(ns) = q.metadata.namespace.clone()
        {
            observed.quotas.insert(ns, q);
        }
    }
    observed.claims = claims(client, cluster).await?;
    Ok((observed, missing))
}

/// Tessera's claims in the whole cluster.
pub async fn claims(client: &kube::Client, cluster: &str) -> Result<Vec<ObservedClaim>, KubeError> {
    let api: Api<ResourceClaim> = Api::all(client.clone());
    let list = api.list(&ListParams::default().labels(&desired::selector(cluster))).await;
    Ok(list
        .map_err(api_error("listing Tessera's ResourceClaims"))?
        .items
        .into_iter()
        .map(|claim| ObservedClaim { claim })
        .collect())
}

/// How pods are asked to leave a claim that ends.
#[derive(Debug, Clone, Copy)]
pub struct Evictions {
    /// The grace period, in seconds.
    pub grace_s: i64,
    /// How long evictions may be refused before the pod is deleted (with the grace period).
    pub refused_for: Duration,
}

/// Since when each pod's eviction has been refused (`namespace`, `pod`). A pod not refused again in a pass is
/// forgotten (it left, or its claim is no longer deleted), so a later pod of the same name starts afresh.
#[derive(Debug, Default)]
pub struct Refusals {
    since: HashMap<(String, String), Instant>,
    refused_now: std::collections::HashSet<(String, String)>,
}

/// Carries out `actions` in order. One that fails does not stop the others (a pod whose disruption budget refuses
/// its eviction holds up only its own claim): the failures are answered together, and tried again at the next
/// reconcile. A claim whose pods cannot all be evicted is not deleted yet; a pod whose eviction has been refused
/// (429, its PodDisruptionBudget) for `evictions.refused_for` is deleted with the grace period, so that a budget
/// cannot hold an ended allocation's device for ever.
pub async fn execute(
    client: &kube::Client,
    actions: &[Action],
    evictions: &Evictions,
    refusals: &mut Refusals,
) -> Result<(), KubeError> {
    let mut failures: Vec<KubeError> = Vec::new();
    refusals.refused_now.clear();
    for action in actions {
        if let Err(e) = execute_one(client, action, evictions, refusals).await {
            failures.push(e);
        }
    }
    let Refusals { since, refused_now } = refusals;
    since.retain(|k, _| refused_now.contains(k));
    match failures.len() {
        0 => Ok(()),
        1 => Err(failures.remove(0)),
        n => Err(KubeError::Several(n, failures.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))),
    }
}

async fn execute_one(
    client: &kube::Client,
    action: &Action,
    evictions: &Evictions,
    refusals: &mut Refusals,
) -> Result<(), KubeError> {
    let eviction_grace_s = evictions.grace_s;
    let apply = PatchParams::apply(names::FIELD_MANAGER).force();
    {
        match action {
            Action::LabelNamespace(n) => {
                let name = n.metadata.name.clone().unwrap_or_default();
                let api: Api<Namespace> = Api::all(client.clone());
                api.patch(&name, &apply, &Patch::Apply(n))
                    .await
                    .map_err(api_error(format!("labelling namespace {name}")))?;
            }
            Action::ApplyQuota(q) => {
                let ns = q.metadata.namespace.clone().unwrap_or_default();
                let api: Api<ResourceQuota> = Api::namespaced(client.clone(), &ns);
                api.patch(names::QUOTA_NAME, &apply, &Patch::Apply(q))
                    .await
                    .map_err(api_error(format!("applying the ResourceQuota of {ns}")))?;
            }
            Action::ApplyClaim(c) => {
                let ns = c.metadata.namespace.clone().unwrap_or_default();
                let name = c.metadata.name.clone().unwrap_or_default();
                let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns);
                api.patch(&name, &apply, &Patch::Apply(c.as_ref()))
                    .await
                    .map_err(api_error(format!("applying ResourceClaim {ns}/{name}")))?;
            }
            Action::DeleteQuota { namespace } => {
                let api: Api<ResourceQuota> = Api::namespaced(client.clone(), namespace);
                match api.delete(names::QUOTA_NAME, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(api_error(format!("deleting the ResourceQuota of {namespace}"))(e)),
                }
            }
            Action::UnlabelNamespace(name) => {
                let api: Api<Namespace> = Api::all(client.clone());
                let bare = Namespace {
                    metadata: ObjectMeta { name: Some(name.clone()), ..ObjectMeta::default() },
                    ..Namespace::default()
                };
                match api.patch(name, &apply, &Patch::Apply(&bare)).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(api_error(format!("taking Tessera's labels off namespace {name}"))(e)),
                }
            }
            Action::DeleteClaim { namespace, name, evict } => {
                let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
                // Every pod is asked, whatever another answers; the claim goes only once none is left refusing.
                let mut refused: Vec<KubeError> = Vec::new();
                for pod in evict {
                    // A typed policy/v1 Eviction, posted as it is: kube-rs's `Api::evict` writes its delete options
                    // as `delete_options`, a field the API server does not know, so the grace period would be lost.
                    let eviction = Eviction {
                        metadata: ObjectMeta {
                            name: Some(pod.clone()),
                            namespace: Some(namespace.clone()),
                            ..ObjectMeta::default()
                        },
                        delete_options: Some(DeleteOptions {
                            grace_period_seconds: Some(eviction_grace_s.max(0)),
                            ..DeleteOptions::default()
                        }),
                    };
                    let sent: Result<kube::core::Status, kube::Error> =
                        pods.create_subresource("eviction", pod, &PostParams::default(), &eviction).await;
                    let key = (namespace.clone(), pod.clone());
                    match sent {
                        Ok(_) => {
                            refusals.since.remove(&key);
                            tracing::info!(
                                namespace,
                                pod,
                                claim = name,
                                "asked the pod to leave: its claim's allocation ended"
                            );
                        }
                        // Already gone.
                        Err(kube::Error::Api(s)) if s.code == 404 => {
                            refusals.since.remove(&key);
                        }
                        // Refused by its disruption budget: tried again, and after `refused_for` deleted.
                        Err(kube::Error::Api(s)) if s.code == 429 => {
                            let since = *refusals.since.entry(key.clone()).or_insert_with(Instant::now);
                            let waited = since.elapsed();
                            if waited < evictions.refused_for {
                                refusals.refused_now.insert(key);
                                refused.push(KubeError::Api {
                                    what: format!(
                                        "evicting pod {namespace}/{pod} (refused for {} s; deleted with its grace \
                                         period after {} s)",
                                        waited.as_secs(),
                                        evictions.refused_for.as_secs()
                                    ),
                                    error: kube::Error::Api(s),
                                });
                                continue;
                            }
                            let grace = u32::try_from(eviction_grace_s.max(0)).unwrap_or(u32::MAX);
                            let params = DeleteParams { grace_period_seconds: Some(grace), ..DeleteParams::default() };
                            match pods.delete(pod, &params).await {
                                Ok(_) => {}
                                Err(kube::Error::Api(s)) if s.code == 404 => {}
                                Err(e) => {
                                    refusals.refused_now.insert(key);
                                    refused.push(api_error(format!("deleting pod {namespace}/{pod}"))(e));
                                    continue;
                                }
                            }
                            refusals.since.remove(&key);
                            tracing::warn!(
                                namespace,
                                pod,
                                claim = name,
                                refused_s = waited.as_secs(),
                                grace_s = grace,
                                "deleted the pod: its eviction was refused (PodDisruptionBudget) past the limit, and \
                                 its claim's allocation ended"
                            );
                        }
                        Err(e) => {
                            // Keeps a refusal's clock running through a passing error.
                            refusals.refused_now.insert(key);
                            refused.push(api_error(format!("evicting pod {namespace}/{pod}"))(e));
                        }
                    }
                }
                match refused.len() {
                    0 => {}
                    1 => return Err(refused.remove(0)),
                    n => {
                        let all = refused.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
                        return Err(KubeError::Several(n, all));
                    }
                }
                let api: Api<ResourceClaim> = Api::namespaced(client.clone(), namespace);
                match api.delete(name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(api_error(format!("deleting ResourceClaim {namespace}/{name}"))(e)),
                }
            }
        }
    }
    Ok(())
}

/// Each claim of an allocation that `desired` names, as `claims` show it.
pub fn claim_status(desired: &[NamespaceObjects], claims: &[ObservedClaim], now_ms: i64) -> Vec<AllocationClaim> {
    let wanted: BTreeMap<(&str, &str), &str> = desired
        .iter()
        .flat_map(|d| {
            d.claims.iter().filter_map(move |(k, c)| {
                let allocation = c.metadata.labels.as_ref()?.get(names::ALLOCATION)?;
                Some(((d.namespace.as_str(), k.as_str()), allocation.as_str()))
            })
        })
        .collect();
    claims
        .iter()
        .filter_map(|o| {
            let meta = &o.claim.metadata;
            let (ns, name) = (meta.namespace.as_deref()?, meta.name.as_deref()?);
            // The allocation is the one Tessera wrote the claim for (its own map), not what the cluster's label says.
            let allocation = wanted.get(&(ns, name))?.to_string();
            Some(AllocationClaim {
                allocation_id: allocation,
                cluster_id: String::new(),
                namespace: ns.to_string(),
                claim: name.to_string(),
                allocated: o.allocated(),
                pods: serde_json::to_string(&o.pods()).unwrap_or_else(|_| "[]".into()),
                observed_at_ms: now_ms,
                cluster_name: String::new(),
            })
        })
        .collect()
}
