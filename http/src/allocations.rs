//! Where slices are: the planner's placement for a request before it is approved, and a tenant's allocations with
//! what a workload needs to find them.

use crate::auth::Caller;
use axum::extract::State;

use tessera_core::planner::Plan;

use super::error::{ApiError, ApiJson, ApiPath, ApiQuery, Problem};
pub use tessera_api::allocations::{AllocationQuery, AllocationView};
pub use tessera_api::rightsize::{Replacement, RightsizeBody};
use tessera_services::app::AppState;
use tessera_services::fleet;

/// Where the planner would place a MIG request on the fleet as it is now: existing free instances, or new ones at
/// exact placements with the resulting layouts. Nothing is changed; approvers (platform admins) see this before
/// approving.
#[utoipa::path(get, path = "/api/v1/requests/{id}/placement", tag = "requests", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    params(("id" = String, Path)),
    responses((status = 200, body = Plan), (status = 404, body = Problem), (status = 422, body = Problem)))]
pub async fn request_placement(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<ApiJson<Plan>, ApiError> {
    Ok(ApiJson(fleet::placement(&state, &p, &id).await?))
}

/// A tenant's allocations (its members, or platform admins).
#[utoipa::path(get, path = "/api/v1/allocations", tag = "requests", security(("token" = ["tenant-member"]), ("session" = ["tenant-member"])), params(AllocationQuery),
    responses((status = 200, body = Vec<AllocationView>), (status = 404, body = Problem)))]
pub async fn list_allocations(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiQuery(q): ApiQuery<AllocationQuery>,
) -> Result<ApiJson<Vec<AllocationView>>, ApiError> {
    Ok(ApiJson(fleet::allocations(&state, &p, &q.tenant).await?))
}

/// Request the smaller slice: for the tenant of an active allocation, asks for as many slices of `profile` (smaller
/// than what it holds: same model and variant, no more compute or memory slices, fewer of one) as its request holds,
/// through the same quota, policy and approval as any request. When the new request turns active, the request it
/// replaces is released in that transaction (`request.released` by `system:rightsize`); until then both are held
/// and counted against the quota, and the tenant's budget policy applies as to any request. One replacement at a
/// time per request. A request of several slices is replaced whole: each of its other slices must fit the smaller
/// profile by the default right-sizing (`siblings_do_not_fit`). A platform admin shrinking a tenant they are not a
/// member of gives a `reason` (`reason_required`). What is left of a limited request's duration carries over.
#[utoipa::path(post, path = "/api/v1/allocations/{id}/rightsize", tag = "usage", security(("token" = ["tenant-member"]), ("session" = ["tenant-member"])),
    params(("id" = String, Path)), request_body = RightsizeBody,
    responses((status = 201, body = Replacement, description = "the new request, and the request it replaces"),
        (status = 400, body = Problem), (status = 401, body = Problem), (status = 404, body = Problem),
        (status = 409, body = Problem, description = "allocation_not_active, request_not_active, replacement_open, quota_exceeded or budget_exhausted"),
        (status = 422, body = Problem, description = "unknown_profile, not_smaller, shared_device, unknown_model, siblings_do_not_fit, reason_required, value_too_long, invalid_reason")))]
pub async fn rightsize_allocation(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<RightsizeBody>,
) -> Result<(axum::http::StatusCode, ApiJson<Replacement>), ApiError> {
    let (request, replaces) =
        tessera_services::rightsize::replace(&state, &p, &id, &body.profile, body.reason.as_deref()).await?;
    let view = Replacement { request: request.into(), replaces };
    Ok((axum::http::StatusCode::CREATED, ApiJson(view)))
}
