//! Layout proposals: what approvals need changed on a GPU, for an admin to approve or reject; and per-GPU
//! auto-layout.

use crate::auth::Caller;
use axum::extract::State;

use super::error::{ApiError, ApiJson, ApiPath, ApiQuery, Problem};
pub use tessera_api::layouts::{DefragQuery, DefragReport, LayoutEdit, LayoutQuery, LayoutView, RejectLayout};
use tessera_services::app::AppState;
use tessera_services::{approvals, efficiency};

/// Layout proposals, newest first (platform admins); each open one names the requests whose slices wait for it
/// (`needed_by`).
#[utoipa::path(get, path = "/api/v1/layouts", tag = "layouts", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])), params(LayoutQuery),
    responses((status = 200, body = Vec<LayoutView>), (status = 403, body = Problem), (status = 422, body = Problem)))]
pub async fn list_layouts(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiQuery(q): ApiQuery<LayoutQuery>,
) -> Result<ApiJson<Vec<LayoutView>>, ApiError> {
    Ok(ApiJson(approvals::layout_views(&state, &p, q.state.as_deref()).await?))
}

/// Approve a layout proposal: the GPU's layout changes (platform admins).
#[utoipa::path(post, path = "/api/v1/layouts/{id}/approve", tag = "layouts", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    params(("id" = String, Path)),
    responses((status = 200, body = LayoutView), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 409, body = Problem, description = "layout_stale, instance_in_use or proposal_decided")))]
pub async fn approve_layout(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<ApiJson<LayoutView>, ApiError> {
    Ok(ApiJson(approvals::decide_layout(&state, &p, &id, true, "").await?.into()))
}

/// Reject a layout proposal with a reason; requests waiting for it fail (platform admins).
#[utoipa::path(post, path = "/api/v1/layouts/{id}/reject", tag = "layouts", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    params(("id" = String, Path)), request_body = RejectLayout,
    responses((status = 200, body = LayoutView), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 409, body = Problem), (status = 422, body = Problem)))]
pub async fn reject_layout(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<RejectLayout>,
) -> Result<ApiJson<LayoutView>, ApiError> {
    Ok(ApiJson(approvals::decide_layout(&state, &p, &id, false, &body.reason).await?.into()))
}

/// Propose a new layout for a GPU by hand (platform admins). It is checked against the MIG rules and must keep
/// every instance in use; it then waits for approval.
#[utoipa::path(put, path = "/api/v1/gpus/{id}/layout", tag = "layouts", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    params(("id" = String, Path)), request_body = LayoutEdit,
    responses((status = 201, body = LayoutView), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 409, body = Problem, description = "instance_in_use, layout_proposal_open or layout_stale"),
        (status = 422, body = Problem, description = "mig_layout_invalid, mig_disabled or layout_unchanged")))]
pub async fn edit_layout(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<LayoutEdit>,
) -> Result<(axum::http::StatusCode, ApiJson<LayoutView>), ApiError> {
    if body.instances.len() > 64 {
        return Err(ApiError::invalid("too_many_instances", "a layout has at most 64 instances"));
    }
    let proposal = approvals::propose_layout(&state, &p, &id, &body.instances).await?;
    Ok((axum::http::StatusCode::CREATED, ApiJson(proposal.into())))
}

/// One layout proposal (platform admins).
#[utoipa::path(get, path = "/api/v1/layouts/{id}", tag = "layouts", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    params(("id" = String, Path)), responses((status = 200, body = LayoutView), (status = 404, body = Problem)))]
pub async fn get_layout(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<ApiJson<LayoutView>, ApiError> {
    Ok(ApiJson(approvals::layout(&state, &p, &id).await?.into()))
}

/// Defragmentation, without writing anything (platform admins): per MIG GPU, a layout that keeps every instance
/// held and lays the free instances and free units out again as instances of the profiles asked for, the target
/// profile first (the largest asked for on each model, or `profile`). Only GPUs that gain are listed, those that
/// gain most first, with before and after figures; ready slices and target instances never go down.
#[utoipa::path(get, path = "/api/v1/defragmentation", tag = "layouts", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    params(DefragQuery),
    responses((status = 200, body = DefragReport), (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 422, body = Problem, description = "invalid_max_gpus, unknown_model, unknown_profile or value_too_long")))]
pub async fn preview_defragmentation(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiQuery(q): ApiQuery<DefragQuery>,
) -> Result<ApiJson<DefragReport>, ApiError> {
    Ok(ApiJson(efficiency::defragment(&state, &p, &q, false).await?))
}

/// Defragmentation, proposed (platform admins): what `GET /api/v1/defragmentation` lists becomes one layout proposal
/// per GPU (`proposal_id`), approved or rejected like any other. A GPU whose layout changed meanwhile, or that got a
/// proposal meanwhile, is listed in `skipped`.
#[utoipa::path(post, path = "/api/v1/defragmentation", tag = "layouts", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    request_body = DefragQuery,
    responses((status = 200, body = DefragReport), (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 422, body = Problem, description = "invalid_max_gpus, unknown_model, unknown_profile or value_too_long")))]
pub async fn propose_defragmentation(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiJson(q): ApiJson<DefragQuery>,
) -> Result<ApiJson<DefragReport>, ApiError> {
    Ok(ApiJson(efficiency::defragment(&state, &p, &q, true).await?))
}
