//! Cohorts: tenants that lend each other what they guarantee but do not use, and a tenant's place in one.

use crate::auth::Caller;
use axum::extract::State;
use axum::http::StatusCode;

use super::error::{ApiError, ApiJson, ApiPath, Problem};
pub use tessera_api::cohorts::{CohortMembership, CohortUpdate, CohortView, NewCohort};
use tessera_api::tenants::TenantView;
use tessera_services::app::AppState;
use tessera_services::cohorts;

/// Create a cohort (platform admins).
#[utoipa::path(post, path = "/api/v1/cohorts", tag = "tenants", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])), request_body = NewCohort,
    responses((status = 201, body = CohortView), (status = 403, body = Problem), (status = 409, body = Problem),
        (status = 422, body = Problem, description = "invalid_name, invalid_grace")))]
pub async fn create_cohort(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiJson(body): ApiJson<NewCohort>,
) -> Result<(StatusCode, ApiJson<CohortView>), ApiError> {
    Ok((StatusCode::CREATED, ApiJson(cohorts::create(&state, &p, &body.name, body.grace_s).await?)))
}

/// Every cohort, with what each member guarantees, holds, borrows and can lend (platform admins).
#[utoipa::path(get, path = "/api/v1/cohorts", tag = "tenants", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    responses((status = 200, body = Vec<CohortView>), (status = 403, body = Problem)))]
pub async fn list_cohorts(
    State(state): State<AppState>,
    Caller(p): Caller,
) -> Result<ApiJson<Vec<CohortView>>, ApiError> {
    Ok(ApiJson(cohorts::list(&state, &p).await?))
}

/// A cohort by id or name (platform admins).
#[utoipa::path(get, path = "/api/v1/cohorts/{id}", tag = "tenants", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    params(("id" = String, Path, description = "The cohort's id or its name")),
    responses((status = 200, body = CohortView), (status = 403, body = Problem), (status = 404, body = Problem)))]
pub async fn get_cohort(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<ApiJson<CohortView>, ApiError> {
    Ok(ApiJson(cohorts::get(&state, &p, &id).await?))
}

/// Change a cohort's grace period (platform admins); deadlines already given stand.
#[utoipa::path(patch, path = "/api/v1/cohorts/{id}", tag = "tenants", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    params(("id" = String, Path, description = "The cohort's id or its name")), request_body = CohortUpdate,
    responses((status = 200, body = CohortView), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 422, body = Problem, description = "invalid_grace")))]
pub async fn update_cohort(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<CohortUpdate>,
) -> Result<ApiJson<CohortView>, ApiError> {
    Ok(ApiJson(cohorts::set_grace(&state, &p, &id, body.grace_s).await?))
}

/// Put a tenant in a cohort, or take it out, with its weight (platform admins). The cohorts it left and joined are
/// rebalanced at once.
#[utoipa::path(put, path = "/api/v1/tenants/{id}/cohort", tag = "tenants", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    params(("id" = String, Path, description = "The tenant's id or its name")), request_body = CohortMembership,
    responses((status = 200, body = TenantView), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 422, body = Problem, description = "invalid_weight")))]
pub async fn set_membership(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<CohortMembership>,
) -> Result<ApiJson<TenantView>, ApiError> {
    let tenant = cohorts::set_membership(&state, &p, &id, body.cohort.as_deref(), body.weight).await?;
    Ok(ApiJson(tenant.into()))
}
