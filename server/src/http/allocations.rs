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
    Ok(ApiJson(fleet::allocations(&state, &p, &q.tenant).await?))
}
