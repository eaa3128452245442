//! Tenants, their approval policies and their quotas.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use tessera_core::quota::{ApprovalPolicy, MILLI, Resource};

use super::auth::{require_platform_admin, require_visible};
use super::error::{ApiError, ApiJson, Problem};
use crate::app::AppState;
use crate::store::{Principal, Tenant};
pub use tessera_api::tenants::{NewTenant, PolicyUpdate, QuotaLine, QuotaUpdate, QuotaView, TenantView};

/// Most weighted compute slices an approval policy may name (what a 32-bit integer holds, as every release has
/// accepted).
const MAX_AUTO_APPROVE_SLICES: u32 = i32::MAX as u32;

/// The policy of a new tenant or a policy update, checked.
fn approval_policy(auto_approve: bool, auto_approve_max_compute_slices: u32) -> Result<ApprovalPolicy, ApiError> {
    if auto_approve_max_compute_slices > MAX_AUTO_APPROVE_SLICES {
        return Err(ApiError::invalid(
            "invalid_policy",
            format!("auto_approve_max_compute_slices is at most {MAX_AUTO_APPROVE_SLICES}"),
        ));
    }
    Ok(ApprovalPolicy { auto_approve, auto_approve_max_compute_slices })
}

impl From<Tenant> for TenantView {
    fn from(t: Tenant) -> Self {
        TenantView {
            id: t.id,
            name: t.name,
            auto_approve: t.policy.auto_approve,
            auto_approve_max_compute_slices: t.policy.auto_approve_max_compute_slices,
            created_at_ms: t.created_at_ms,
        }
    }
}

fn valid_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
}

/// Create a tenant (platform admins).
#[utoipa::path(post, path = "/api/v1/tenants", tag = "tenants", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])), request_body = NewTenant,
    responses((status = 201, body = TenantView), (status = 403, body = Problem), (status = 409, body = Problem),
        (status = 422, body = Problem)))]
pub async fn create_tenant(
    State(state): State<AppState>,
    p: Principal,
    ApiJson(body): ApiJson<NewTenant>,
) -> Result<(StatusCode, ApiJson<TenantView>), ApiError> {
    require_platform_admin(&p)?;
    if !valid_name(&body.name) {
        return Err(ApiError::invalid("invalid_name", "a tenant name is 1-63 characters of a-z, 0-9 and -"));
    }
    let policy = approval_policy(body.auto_approve, body.auto_approve_max_compute_slices)?;
    let tenant = state.store.create_tenant(&body.name, policy, &p.actor()).await?;
    Ok((StatusCode::CREATED, ApiJson(tenant.into())))
}

/// A tenant (members see their own; others get 404).
#[utoipa::path(get, path = "/api/v1/tenants/{id}", tag = "tenants", security(("token" = ["tenant-member"]), ("session" = ["tenant-member"])),
    params(("id" = String, Path)), responses((status = 200, body = TenantView), (status = 404, body = Problem)))]
pub async fn get_tenant(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
) -> Result<ApiJson<TenantView>, ApiError> {
    require_visible(&p, &id, "tenant")?;
    Ok(ApiJson(state.store.tenant(&id).await?.into()))
}

/// Replace a tenant's approval policy (platform admins): requests created from now on are decided by it.
#[utoipa::path(put, path = "/api/v1/tenants/{id}/policy", tag = "tenants", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    params(("id" = String, Path)), request_body = PolicyUpdate,
    responses((status = 200, body = TenantView), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 422, body = Problem, description = "invalid_policy")))]
pub async fn set_policy(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<PolicyUpdate>,
) -> Result<ApiJson<TenantView>, ApiError> {
    require_platform_admin(&p)?;
    let policy = approval_policy(body.auto_approve, body.auto_approve_max_compute_slices)?;
    Ok(ApiJson(state.store.set_policy(&id, policy, &p.actor()).await?.into()))
}

async fn quota_view(state: &AppState, tenant: &str) -> Result<QuotaView, ApiError> {
    let limits = state.store.quotas(tenant).await?;
    let held = state.store.held(tenant).await?;
    let mut keys: Vec<&Resource> = limits.keys().chain(held.keys()).collect();
    keys.sort();
    keys.dedup();
    let amount = |m: u64| m as f64 / MILLI as f64;
    let resources = keys
        .into_iter()
        .map(|r| QuotaLine {
            resource: r.to_string(),
            limit: limits.get(r).map(|&m| amount(m)),
            held: amount(held.get(r).copied().unwrap_or(0)),
        })
        .collect();
    Ok(QuotaView { tenant: tenant.to_string(), resources })
}

/// A tenant's limits and what its live requests hold.
#[utoipa::path(get, path = "/api/v1/tenants/{id}/quotas", tag = "tenants", security(("token" = ["tenant-member"]), ("session" = ["tenant-member"])),
    params(("id" = String, Path)), responses((status = 200, body = QuotaView), (status = 404, body = Problem)))]
pub async fn get_quotas(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
) -> Result<ApiJson<QuotaView>, ApiError> {
    require_visible(&p, &id, "tenant")?;
    state.store.tenant(&id).await?;
    Ok(ApiJson(quota_view(&state, &id).await?))
}

/// Set or remove limits (platform admins). Every resource key and amount is checked before any is written.
#[utoipa::path(put, path = "/api/v1/tenants/{id}/quotas", tag = "tenants", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    params(("id" = String, Path)), request_body = QuotaUpdate,
    responses((status = 200, body = QuotaView), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 422, body = Problem)))]
pub async fn set_quotas(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<QuotaUpdate>,
) -> Result<ApiJson<QuotaView>, ApiError> {
    require_platform_admin(&p)?;
    state.store.tenant(&id).await?;
    let mut parsed = Vec::with_capacity(body.limits.len());
    for (key, limit) in &body.limits {
        let resource =
            Resource::parse(state.catalog, key).map_err(|e| ApiError::invalid("quota_bad_resource", e.to_string()))?;
        let Some(limit) = *limit else {
            parsed.push((resource, None));
            continue;
        };
        if !limit.is_finite() || !(0.0..=1e12).contains(&limit) {
            return Err(ApiError::invalid("quota_bad_limit", format!("{key}: a limit is a number from 0 to 1e12")));
        }
        parsed.push((resource, Some((limit * MILLI as f64).round() as u64)));
    }
    state.store.set_quotas(&id, &parsed, &p.actor()).await?;
    Ok(ApiJson(quota_view(&state, &id).await?))
}

/// Tenants you may see: all of them for platform admins, your own otherwise.
#[utoipa::path(get, path = "/api/v1/tenants", tag = "tenants", security(("token" = ["user"]), ("session" = ["user"])),
    responses((status = 200, body = Vec<TenantView>)))]
pub async fn list_tenants(State(state): State<AppState>, p: Principal) -> Result<ApiJson<Vec<TenantView>>, ApiError> {
    let tenants = state.store.tenants().await?;
    Ok(ApiJson(tenants.into_iter().filter(|t| p.can_see(&t.id)).map(Into::into).collect()))
}
