//! Where slices are: the planner's placement for a request before it is approved, and a tenant's allocations with
//! what a workload needs to find them.

use axum::extract::{Path, State};

use tessera_core::planner::Plan;

use super::error::{ApiError, ApiJson, ApiQuery, Problem};
use crate::app::AppState;
use crate::services::fleet;
use crate::store::Principal;
pub use tessera_api::allocations::{AllocationQuery, AllocationView};

/// Where the planner would place a MIG request on the fleet as it is now: existing free instances, or new ones at
/// exact placements with the resulting layouts. Nothing is changed; approvers (platform admins) see this before
/// approving.
#[utoipa::path(get, path = "/api/v1/requests/{id}/placement", tag = "requests", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    params(("id" = String, Path)),
    responses((status = 200, body = Plan), (status = 404, body = Problem), (status = 422, body = Problem)))]
pub async fn request_placement(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
) -> Result<ApiJson<Plan>, ApiError> {
    Ok(ApiJson(fleet::placement(&state, &p, &id).await?))
}

/// A tenant's allocations (its members, or platform admins).
#[utoipa::path(get, path = "/api/v1/allocations", tag = "requests", security(("token" = ["tenant-member"]), ("session" = ["tenant-member"])), params(AllocationQuery),
    responses((status = 200, body = Vec<AllocationView>), (status = 404, body = Problem)))]
pub async fn list_allocations(
    State(state): State<AppState>,
    p: Principal,
    ApiQuery(q): ApiQuery<AllocationQuery>,
) -> Result<ApiJson<Vec<AllocationView>>, ApiError> {
    super::auth::require_visible(&p, &q.tenant, "tenant")?;
    let nodes = state.store.nodes().await?;
    let allocations = state.store.tenant_allocations(&q.tenant).await?;
    let devices = state.store.allocation_devices(&q.tenant).await?;
    let views = allocations
        .into_iter()
        .filter_map(|a| {
            let (node, gpu) = nodes.iter().find_map(|n| n.gpus.iter().find(|g| g.id == a.gpu_id).map(|g| (n, g)))?;
            let whole = !gpu.mig_enabled;
            Some(AllocationView {
                k8s_resource: if whole {
                    "nvidia.com/gpu".to_string()
                } else {
                    format!("nvidia.com/mig-{}", a.profile)
                },
                waiting_for_layout: !whole && !gpu.layout.iter().any(|i| i.profile == a.profile && i.start == a.start),
                device_uuid: devices.iter().find(|(id, _)| *id == a.id).map(|(_, d)| d.clone()),
                cuda_visible_devices: devices.iter().find(|(id, _)| *id == a.id).map(|(_, d)| d.clone()),
                id: a.id,
                request: a.request_id,
                state: a.state,
                node: node.name.clone(),
                gpu_uuid: gpu.uuid.clone(),
                gpu_index: gpu.index,
                profile: a.profile,
                start: a.start,
            })
        })
        .collect();
    Ok(ApiJson(views))
}
