//! Where slices are: the planner's placement for a request before it is approved, and a tenant's allocations with
//! what a workload needs to find them.

use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use tessera_core::planner::Plan;

use super::error::{ApiError, ApiJson, ApiQuery, Problem};
use crate::app::AppState;
use crate::services::fleet;
use crate::store::Principal;

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

/// A slice in a tenant's hands, with what a workload needs to find it.
#[derive(Debug, Serialize, ToSchema)]
pub struct AllocationView {
    /// Id.
    pub id: String,
    /// The request it serves.
    pub request: String,
    /// `reserved` (approved, the instance may still be waiting for its layout) or `active`.
    pub state: String,
    /// Node name.
    pub node: String,
    /// GPU UUID.
    pub gpu_uuid: String,
    /// GPU index on the node.
    pub gpu_index: u32,
    /// MIG profile, or how a whole GPU is shared (`exclusive`, `timeslice:<n>`, `mps:<n>`).
    pub profile: String,
    /// Start unit of the MIG instance, or the share's index on a whole GPU.
    pub start: u8,
    /// Kubernetes extended resource: `nvidia.com/mig-<profile>` (mixed strategy) or `nvidia.com/gpu`.
    pub k8s_resource: String,
    /// Whether the instance waits for a layout change to be approved and applied.
    pub waiting_for_layout: bool,
    /// The device serving it once active: the MIG device UUID (`MIG-...`) or the GPU UUID.
    pub device_uuid: Option<String>,
    /// What a workload on the node sets `CUDA_VISIBLE_DEVICES` to (once active).
    pub cuda_visible_devices: Option<String>,
}

/// Query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AllocationQuery {
    /// Tenant id.
    pub tenant: String,
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
