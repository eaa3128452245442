//! Tenants, their approval policies and their quotas.

use crate::auth::Caller;
use axum::extract::State;
use axum::http::StatusCode;

use super::error::{ApiError, ApiJson, ApiPath, Problem};
pub use tessera_api::tenants::{NewTenant, PolicyUpdate, QuotaUpdate, QuotaView, TenantView};
use tessera_services::app::AppState;
use tessera_services::tenants;

/// Create a tenant (platform admins).
#[utoipa::path(post, path = "/api/v1/tenants", tag = "tenants", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])), request_body = NewTenant,
    responses((status = 201, body = TenantView), (status = 403, body = Problem), (status = 409, body = Problem),
        (status = 422, body = Problem)))]
pub async fn create_tenant(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiJson(body): ApiJson<NewTenant>,
) -> Result<(StatusCode, ApiJson<TenantView>), ApiError> {
    let policy = tenants::approval_policy(body.auto_approve, body.auto_approve_max_compute_slices)?;
    let tenant = tenants::create(&state, &p, &body.name, policy).await?;
    Ok((StatusCode::CREATED, ApiJson(tenant.into())))
}

/// A tenant, by id or name (members see their own; others get 404).
#[utoipa::path(get, path = "/api/v1/tenants/{id}", tag = "tenants", security(("token" = ["tenant-member"]), ("session" = ["tenant-member"])),
    params(("id" = String, Path, description = "The tenant's id or its name")), responses((status = 200, body = TenantView), (status = 404, body = Problem)))]
pub async fn get_tenant(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<ApiJson<TenantView>, ApiError> {
    Ok(ApiJson(tenants::get(&state, &p, &id).await?.into()))
}

/// Replace a tenant's approval policy (platform admins): requests created from now on are decided by it.
#[utoipa::path(put, path = "/api/v1/tenants/{id}/policy", tag = "tenants", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    params(("id" = String, Path)), request_body = PolicyUpdate,
    responses((status = 200, body = TenantView), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 422, body = Problem, description = "invalid_policy")))]
pub async fn set_policy(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<PolicyUpdate>,
) -> Result<ApiJson<TenantView>, ApiError> {
    let policy = tenants::approval_policy(body.auto_approve, body.auto_approve_max_compute_slices)?;
    Ok(ApiJson(tenants::set_policy(&state, &p, &id, policy).await?.into()))
}

/// A tenant's limits and what its live requests hold.
#[utoipa::path(get, path = "/api/v1/tenants/{id}/quotas", tag = "tenants", security(("token" = ["tenant-member"]), ("session" = ["tenant-member"])),
    params(("id" = String, Path)), responses((status = 200, body = QuotaView), (status = 404, body = Problem)))]
pub async fn get_quotas(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<ApiJson<QuotaView>, ApiError> {
    Ok(ApiJson(tenants::quotas(&state, &p, &id).await?))
}

/// Set or remove limits, and the maximums and lending limits beside them (platform admins). Every resource key and
/// amount is checked, and all of them are written in one transaction or none is.
#[utoipa::path(put, path = "/api/v1/tenants/{id}/quotas", tag = "tenants", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    params(("id" = String, Path)), request_body = QuotaUpdate,
    responses((status = 200, body = QuotaView), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 422, body = Problem)))]
pub async fn set_quotas(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<QuotaUpdate>,
) -> Result<ApiJson<QuotaView>, ApiError> {
    Ok(ApiJson(tenants::set_quotas(&state, &p, &id, &body).await?))
}

/// Tenants you may see: all of them for platform admins, your own otherwise.
#[utoipa::path(get, path = "/api/v1/tenants", tag = "tenants", security(("token" = ["user"]), ("session" = ["user"])),
    responses((status = 200, body = Vec<TenantView>)))]
pub async fn list_tenants(
    State(state): State<AppState>,
    Caller(p): Caller,
) -> Result<ApiJson<Vec<TenantView>>, ApiError> {
    Ok(ApiJson(tenants::list(&state, &p).await?.into_iter().map(Into::into).collect()))
}
