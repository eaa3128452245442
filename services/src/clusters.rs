//! Kubernetes clusters (platform admins register them and say how they are reached), the namespaces in them that
//! belong to tenants, and the nodes in each. A tenant's members read their tenant's namespaces.

use tessera_api::clusters::{ClusterNode, ClusterSync, ClusterUpdate, ClusterView, NamespaceView, NewCluster};
use tessera_core::cluster::{namespace_problem, valid_cluster_name};
use tessera_store::Principal;
use tessera_store::clusters::{Cluster, ClusterChange, GovernedNamespace};

use crate::app::AppState;
use crate::auth::Permissions;
use crate::error::ApiError;

async fn view(state: &AppState, c: Cluster) -> Result<ClusterView, ApiError> {
    let sync = state.store.cluster_sync(&c.id).await?;
    Ok(ClusterView {
        sync: ClusterSync { synced_at_ms: sync.synced_at_ms, error: sync.error, error_at_ms: sync.error_at_ms },
        credentials_problem: state.kubernetes.credentials_problem(c.kubeconfig.as_deref()),
        id: c.id,
        name: c.name,
        mode: c.mode,
        kubeconfig: c.kubeconfig,
        created_at_ms: c.created_at_ms,
        namespaces: c.namespaces.into_iter().map(namespace_view).collect(),
        nodes: c.nodes.into_iter().map(|(id, name)| ClusterNode { id, name }).collect(),
    })
}

fn namespace_view(n: GovernedNamespace) -> NamespaceView {
    NamespaceView {
        cluster: n.cluster_id,
        cluster_name: n.cluster_name,
        mode: n.mode,
        namespace: n.namespace,
        tenant: n.tenant_id,
        tenant_name: n.tenant_name,
        created_at_ms: n.created_at_ms,
    }
}

/// A kubeconfig name must be one this server's settings have: a cluster registered with one it lacks could never
/// be reached, and the mistake would only show later.
fn check_kubeconfig(state: &AppState, kubeconfig: Option<&str>) -> Result<(), ApiError> {
    match kubeconfig {
        Some(name) if !state.kubernetes.kubeconfigs.contains_key(name) => Err(ApiError::invalid(
            "unknown_kubeconfig",
            format!(
                "this server's settings have no kubeconfig named `{name}`: add it to [kubernetes.kubeconfigs] (or \
                 TESSERA_KUBECONFIGS) on every replica, or leave kubeconfig out for the in-cluster service account"
            ),
        )),
        _ => Ok(()),
    }
}

/// Registers a cluster (platform admins).
pub async fn create(state: &AppState, p: &Principal, body: &NewCluster) -> Result<ClusterView, ApiError> {
    p.require_platform_admin()?;
    if !valid_cluster_name(&body.name) {
        return Err(ApiError::invalid(
            "invalid_name",
            "a cluster name is a DNS label: 1-63 characters of a-z, 0-9 and -, beginning and ending with a letter or \
             digit",
        ));
    }
    check_kubeconfig(state, body.kubeconfig.as_deref())?;
    let c = state.store.create_cluster(&body.name, body.mode, body.kubeconfig.as_deref(), &p.actor()).await?;
    view(state, c).await
}

/// Every cluster with its namespaces and nodes (platform admins).
pub async fn list(state: &AppState, p: &Principal) -> Result<Vec<ClusterView>, ApiError> {
    p.require_platform_admin()?;
    let mut out = Vec::new();
    for c in state.store.clusters().await? {
        out.push(view(state, c).await?);
    }
    Ok(out)
}

async fn find(state: &AppState, key: &str) -> Result<Cluster, ApiError> {
    state
        .store
        .clusters()
        .await?
        .into_iter()
        .find(|c| c.id == key || c.name == key)
        .ok_or_else(|| ApiError::NotFound(format!("cluster {key} not found")))
}

/// A cluster by id or name (platform admins).
pub async fn get(state: &AppState, p: &Principal, key: &str) -> Result<ClusterView, ApiError> {
    p.require_platform_admin()?;
    view(state, find(state, key).await?).await
}

/// Changes a cluster's mode or credentials (platform admins).
pub async fn update(state: &AppState, p: &Principal, key: &str, body: &ClusterUpdate) -> Result<ClusterView, ApiError> {
    p.require_platform_admin()?;
    if let Some(k) = &body.kubeconfig {
        check_kubeconfig(state, k.as_deref())?;
    }
    let c = find(state, key).await?;
    let change = ClusterChange { mode: body.mode, kubeconfig: body.kubeconfig.clone() };
    view(state, state.store.update_cluster(&c.id, &change, &p.actor()).await?).await
}

/// Forgets a cluster (platform admins); refused while it governs namespaces.
pub async fn delete(state: &AppState, p: &Principal, key: &str) -> Result<(), ApiError> {
    p.require_platform_admin()?;
    let c = find(state, key).await?;
    state.store.delete_cluster(&c.id, &p.actor()).await?;
    Ok(())
}

/// Gives a namespace of a cluster to a tenant (platform admins). Answers the mapping and whether it is new.
pub async fn govern(
    state: &AppState,
    p: &Principal,
    cluster: &str,
    namespace: &str,
    tenant: &str,
) -> Result<(NamespaceView, bool), ApiError> {
    p.require_platform_admin()?;
    if let Some(why) = namespace_problem(namespace) {
        return Err(ApiError::invalid("invalid_namespace", why));
    }
    let c = find(state, cluster).await?;
    let t = crate::lookup::tenant(state, p, tenant).await?;
    let (n, created) = state.store.govern_namespace(&c.id, namespace, &t.id, &p.actor()).await?;
    Ok((namespace_view(n), created))
}

/// Gives a namespace up (platform admins): Tessera no longer governs it.
pub async fn release(state: &AppState, p: &Principal, cluster: &str, namespace: &str) -> Result<(), ApiError> {
    p.require_platform_admin()?;
    let c = find(state, cluster).await?;
    state.store.release_namespace(&c.id, namespace, &p.actor()).await?;
    Ok(())
}

/// Puts a node in a cluster, or in none (platform admins).
pub async fn set_node(state: &AppState, p: &Principal, node: &str, cluster: Option<&str>) -> Result<(), ApiError> {
    p.require_platform_admin()?;
    let node = state.store.node_id(node).await?;
    let cluster = match cluster {
        Some(key) => Some(find(state, key).await?.id),
        None => None,
    };
    state.store.set_node_cluster(&node, cluster.as_deref(), &p.actor()).await?;
    Ok(())
}

/// A tenant's namespaces in every cluster (its members and platform admins; at most
/// `tessera_core::cluster::MAX_NAMESPACES_PER_TENANT` per cluster).
pub async fn tenant_namespaces(state: &AppState, p: &Principal, tenant: &str) -> Result<Vec<NamespaceView>, ApiError> {
    let t = crate::lookup::tenant(state, p, tenant).await?;
    Ok(state.store.tenant_namespaces(&t.id).await?.into_iter().map(namespace_view).collect())
}
