//! Kubernetes clusters, the namespaces in them that belong to tenants, and which cluster each node is in.

use crate::auth::Caller;
use axum::extract::State;
use axum::http::StatusCode;

use super::error::{ApiError, ApiJson, ApiPath, Problem};
pub use tessera_api::clusters::{ClusterUpdate, ClusterView, GovernNamespace, NamespaceView, NewCluster, NodeCluster};
use tessera_services::app::AppState;
use tessera_services::clusters;

/// Register a cluster (platform admins): how its pods get devices, and the kubeconfig (by its name in the server's
/// settings) or in-cluster service account the server reaches it with.
#[utoipa::path(post, path = "/api/v1/clusters", tag = "clusters", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])), request_body = NewCluster,
    responses((status = 201, body = ClusterView), (status = 403, body = Problem), (status = 409, body = Problem, description = "already_exists"),
        (status = 422, body = Problem, description = "invalid_name, unknown_kubeconfig")))]
pub async fn create_cluster(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiJson(body): ApiJson<NewCluster>,
) -> Result<(StatusCode, ApiJson<ClusterView>), ApiError> {
    Ok((StatusCode::CREATED, ApiJson(clusters::create(&state, &p, &body).await?)))
}

/// Every cluster, with its tenants' namespaces and its nodes (platform admins).
#[utoipa::path(get, path = "/api/v1/clusters", tag = "clusters", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    responses((status = 200, body = Vec<ClusterView>), (status = 403, body = Problem)))]
pub async fn list_clusters(
    State(state): State<AppState>,
    Caller(p): Caller,
) -> Result<ApiJson<Vec<ClusterView>>, ApiError> {
    Ok(ApiJson(clusters::list(&state, &p).await?))
}

/// A cluster by id or name (platform admins).
#[utoipa::path(get, path = "/api/v1/clusters/{id}", tag = "clusters", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    params(("id" = String, Path, description = "The cluster's id or its name")),
    responses((status = 200, body = ClusterView), (status = 403, body = Problem), (status = 404, body = Problem)))]
pub async fn get_cluster(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<ApiJson<ClusterView>, ApiError> {
    Ok(ApiJson(clusters::get(&state, &p, &id).await?))
}

/// Change a cluster's mode or credentials (platform admins).
#[utoipa::path(patch, path = "/api/v1/clusters/{id}", tag = "clusters", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    params(("id" = String, Path, description = "The cluster's id or its name")), request_body = ClusterUpdate,
    responses((status = 200, body = ClusterView), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 422, body = Problem, description = "unknown_kubeconfig")))]
pub async fn update_cluster(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<ClusterUpdate>,
) -> Result<ApiJson<ClusterView>, ApiError> {
    Ok(ApiJson(clusters::update(&state, &p, &id, &body).await?))
}

/// Forget a cluster (platform admins); its nodes are then in none. Refused while namespaces of it belong to tenants.
#[utoipa::path(delete, path = "/api/v1/clusters/{id}", tag = "clusters", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    params(("id" = String, Path, description = "The cluster's id or its name")),
    responses((status = 204), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 409, body = Problem, description = "cluster_has_namespaces")))]
pub async fn delete_cluster(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    clusters::delete(&state, &p, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Give a namespace of a cluster to a tenant (platform admins): Tessera labels it, keeps its ResourceQuota and
/// writes the tenant's ResourceClaims in it. Giving it again to the same tenant changes nothing (200); a namespace
/// of another tenant must be given up first.
#[utoipa::path(put, path = "/api/v1/clusters/{id}/namespaces/{namespace}", tag = "clusters", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    params(("id" = String, Path, description = "The cluster's id or its name"), ("namespace" = String, Path, description = "The namespace")),
    request_body = GovernNamespace,
    responses((status = 200, body = NamespaceView, description = "Already the tenant's"), (status = 201, body = NamespaceView),
        (status = 403, body = Problem), (status = 404, body = Problem), (status = 409, body = Problem, description = "namespace_taken"),
        (status = 422, body = Problem, description = "invalid_namespace, too_many_namespaces")))]
pub async fn govern_namespace(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath((id, namespace)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<GovernNamespace>,
) -> Result<(StatusCode, ApiJson<NamespaceView>), ApiError> {
    let (view, created) = clusters::govern(&state, &p, &id, &namespace, &body.tenant).await?;
    Ok((if created { StatusCode::CREATED } else { StatusCode::OK }, ApiJson(view)))
}

/// Give a namespace up (platform admins): Tessera no longer governs it.
#[utoipa::path(delete, path = "/api/v1/clusters/{id}/namespaces/{namespace}", tag = "clusters", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    params(("id" = String, Path, description = "The cluster's id or its name"), ("namespace" = String, Path, description = "The namespace")),
    responses((status = 204), (status = 403, body = Problem), (status = 404, body = Problem)))]
pub async fn release_namespace(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath((id, namespace)): ApiPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    clusters::release(&state, &p, &id, &namespace).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Put a node in a cluster, or in none (platform admins).
#[utoipa::path(put, path = "/api/v1/nodes/{id}/cluster", tag = "clusters", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    params(("id" = String, Path, description = "The node's id or its name")), request_body = NodeCluster,
    responses((status = 204), (status = 403, body = Problem), (status = 404, body = Problem)))]
pub async fn set_node_cluster(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<NodeCluster>,
) -> Result<StatusCode, ApiError> {
    clusters::set_node(&state, &p, &id, body.cluster.as_deref()).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A tenant's namespaces in every cluster (its members; platform admins).
#[utoipa::path(get, path = "/api/v1/tenants/{id}/namespaces", tag = "clusters", security(("token" = ["tenant-member"]), ("session" = ["tenant-member"])),
    params(("id" = String, Path, description = "The tenant's id or its name")),
    responses((status = 200, body = Vec<NamespaceView>), (status = 404, body = Problem)))]
pub async fn tenant_namespaces(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<ApiJson<Vec<NamespaceView>>, ApiError> {
    Ok(ApiJson(clusters::tenant_namespaces(&state, &p, &id).await?))
}
