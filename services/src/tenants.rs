//! Tenants, their approval policies and their quotas: who may see and change them, and the checks a name, a
//! policy and a limit must pass before anything is written.

use crate::auth::Permissions;
use tessera_api::tenants::{QuotaLine, QuotaUpdate, QuotaView};
use tessera_core::quota::{ApprovalPolicy, MILLI, Resource};
use tessera_core::quota_request::amount;

use crate::app::AppState;
use crate::error::ApiError;
pub use crate::lookup::tenant as get;
use crate::lookup::valid_name;
use tessera_store::cohorts::Bound;
use tessera_store::{Principal, Tenant};

/// Most weighted compute slices an approval policy may name (what a 32-bit integer holds, as every release has
/// accepted).
const MAX_AUTO_APPROVE_SLICES: u32 = i32::MAX as u32;

/// The policy of a new tenant or a policy update, checked.
pub fn approval_policy(auto_approve: bool, auto_approve_max_compute_slices: u32) -> Result<ApprovalPolicy, ApiError> {
    if auto_approve_max_compute_slices > MAX_AUTO_APPROVE_SLICES {
        return Err(ApiError::invalid(
            "invalid_policy",
            format!("auto_approve_max_compute_slices is at most {MAX_AUTO_APPROVE_SLICES}"),
        ));
    }
    Ok(ApprovalPolicy { auto_approve, auto_approve_max_compute_slices })
}

/// Creates a tenant (platform admins).
pub async fn create(state: &AppState, p: &Principal, name: &str, policy: ApprovalPolicy) -> Result<Tenant, ApiError> {
    p.require_platform_admin()?;
    if !valid_name(name) {
        return Err(ApiError::invalid("invalid_name", "a tenant name is 1-63 characters of a-z, 0-9 and -"));
    }
    Ok(state.store.create_tenant(name, policy, &p.actor()).await?)
}

/// Tenants the caller may see: all of them for platform admins, their own otherwise.
pub async fn list(state: &AppState, p: &Principal) -> Result<Vec<Tenant>, ApiError> {
    Ok(state.store.tenants().await?.into_iter().filter(|t| p.can_see(&t.id)).collect())
}

/// Replaces a tenant's approval policy (platform admins).
pub async fn set_policy(state: &AppState, p: &Principal, id: &str, policy: ApprovalPolicy) -> Result<Tenant, ApiError> {
    p.require_platform_admin()?;
    Ok(state.store.set_policy(id, policy, &p.actor()).await?)
}

/// A tenant's limits and what its live requests hold, for those who may see it.
pub async fn quotas(state: &AppState, p: &Principal, id: &str) -> Result<QuotaView, ApiError> {
    let t = get(state, p, id).await?;
    quota_view(state, &t.id).await
}

/// Sets or removes limits, maximums and lending limits (platform admins): every resource key and amount is
/// checked before any is written, and all are written in one transaction; `reason` is kept in the limits' history.
/// A tenant in a cohort is rebalanced after: a lower guarantee may leave it borrowing.
pub async fn set_quotas(
    state: &AppState,
    p: &Principal,
    id: &str,
    update: &QuotaUpdate,
) -> Result<QuotaView, ApiError> {
    p.require_platform_admin()?;
    let tenant = get(state, p, id).await?;
    let id = tenant.id.as_str();
    let reason = update.reason.as_str();
    tessera_core::text::check_reason(reason).map_err(|e| ApiError::invalid("invalid_reason", e.to_string()))?;
    let parse = |key: &str, value: Option<f64>| -> Result<(Resource, Option<u64>), ApiError> {
        let resource =
            Resource::parse(state.catalog, key).map_err(|e| ApiError::invalid("quota_bad_resource", e.to_string()))?;
        let value = match value {
            Some(units) => Some(amount(key, units).map_err(|e| ApiError::invalid(e.code(), e.to_string()))?),
            None => None,
        };
        Ok((resource, value))
    };
    let mut limits = Vec::with_capacity(update.limits.len());
    for (key, limit) in &update.limits {
        limits.push(parse(key, *limit)?);
    }
    let mut bounds = Vec::new();
    for (kind, map) in [(Bound::Maximum, &update.maximums), (Bound::Lending, &update.lending_limits)] {
        for (key, value) in map {
            let (resource, value) = parse(key, *value)?;
            bounds.push((resource, kind, value));
        }
    }
    state.store.set_quota_lines(id, &limits, &bounds, &p.actor(), reason.trim()).await?;
    if let Some(cohort) = &tenant.cohort_id {
        super::cohorts::rebalance(state, cohort, None).await?;
    }
    quota_view(state, id).await
}

async fn quota_view(state: &AppState, tenant: &str) -> Result<QuotaView, ApiError> {
    let t = state.store.tenant(tenant).await?;
    let in_cohort = t.cohort_id.is_some();
    let members = match &t.cohort_id {
        Some(c) => super::cohorts::members(state, c).await?,
        None => vec![super::cohorts::member(state, &t).await?],
    };
    let who = members.iter().position(|m| m.tenant == t.id);
    let limits = state.store.quotas(tenant).await?;
    let held = state.store.held(tenant).await?;
    let (maximums, lending) = state.store.bounds(tenant).await?;
    let mut keys: Vec<&Resource> = limits.keys().chain(held.keys()).collect();
    keys.sort();
    keys.dedup();
    let units = |m: u64| m as f64 / MILLI as f64;
    let resources = keys
        .into_iter()
        .map(|r| {
            let (limit, held) = (limits.get(r).copied(), held.get(r).copied().unwrap_or(0));
            let maximum = maximums.get(r).copied();
            QuotaLine {
                resource: r.to_string(),
                limit: limit.map(units),
                held: units(held),
                over: tessera_core::cohort::over(limit, maximum, held, in_cohort) > 0,
                maximum: maximum.map(units),
                lending_limit: lending.get(r).copied().map(units),
                borrowed: units(tessera_core::cohort::reported_borrowed(limit, maximum, held, in_cohort)),
                available: who.and_then(|w| tessera_core::cohort::room(&members, w, in_cohort, r)).map(units),
            }
        })
        .collect();
    Ok(QuotaView { tenant: tenant.to_string(), resources })
}
