//! Tenants, their approval policies and their quotas: who may see and change them, and the checks a name, a
//! policy and a limit must pass before anything is written.

use std::collections::BTreeMap;

use tessera_api::tenants::{QuotaLine, QuotaView};
use tessera_core::quota::{ApprovalPolicy, MILLI, Resource};
use tessera_core::quota_request::amount;

use crate::app::AppState;
use crate::error::ApiError;
use crate::store::{Principal, Tenant};

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

fn valid_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
}

/// Creates a tenant (platform admins).
pub async fn create(state: &AppState, p: &Principal, name: &str, policy: ApprovalPolicy) -> Result<Tenant, ApiError> {
    p.require_platform_admin()?;
    if !valid_name(name) {
        return Err(ApiError::invalid("invalid_name", "a tenant name is 1-63 characters of a-z, 0-9 and -"));
    }
    Ok(state.store.create_tenant(name, policy, &p.actor()).await?)
}

/// A tenant the caller may see.
/// A tenant the caller may see, by id or by name (ids are tried first; a tenant the caller may not see is not
/// found, whichever way it is named).
pub async fn get(state: &AppState, p: &Principal, key: &str) -> Result<Tenant, ApiError> {
    let tenant = if valid_name(key) {
        state.store.tenants().await?.into_iter().find(|t| t.id == key || t.name == key)
    } else {
        None
    };
    let tenant = match tenant {
        Some(t) => t,
        None => {
            p.require_visible(key, "tenant")?;
            state.store.tenant(key).await?
        }
    };
    p.require_visible(&tenant.id, "tenant")?;
    Ok(tenant)
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
    get(state, p, id).await?;
    quota_view(state, id).await
}

/// Sets or removes limits (platform admins): every resource key and amount is checked before any is written;
/// `reason` is kept in the limits' history.
pub async fn set_quotas(
    state: &AppState,
    p: &Principal,
    id: &str,
    limits: &BTreeMap<String, Option<f64>>,
    reason: &str,
) -> Result<QuotaView, ApiError> {
    p.require_platform_admin()?;
    state.store.tenant(id).await?;
    tessera_core::text::check_reason(reason).map_err(|e| ApiError::invalid("invalid_reason", e.to_string()))?;
    let mut parsed = Vec::with_capacity(limits.len());
    for (key, limit) in limits {
        let resource =
            Resource::parse(state.catalog, key).map_err(|e| ApiError::invalid("quota_bad_resource", e.to_string()))?;
        let limit = match *limit {
            Some(units) => Some(amount(key, units).map_err(|e| ApiError::invalid(e.code(), e.to_string()))?),
            None => None,
        };
        parsed.push((resource, limit));
    }
    state.store.set_quotas(id, &parsed, &p.actor(), reason.trim()).await?;
    quota_view(state, id).await
}

async fn quota_view(state: &AppState, tenant: &str) -> Result<QuotaView, ApiError> {
    let limits = state.store.quotas(tenant).await?;
    let held = state.store.held(tenant).await?;
    let mut keys: Vec<&Resource> = limits.keys().chain(held.keys()).collect();
    keys.sort();
    keys.dedup();
    let units = |m: u64| m as f64 / MILLI as f64;
    let resources = keys
        .into_iter()
        .map(|r| {
            let (limit, held) = (limits.get(r).copied(), held.get(r).copied().unwrap_or(0));
            QuotaLine {
                resource: r.to_string(),
                limit: limit.map(units),
                held: units(held),
                over: limit.is_some_and(|l| held > l),
            }
        })
        .collect();
    Ok(QuotaView { tenant: tenant.to_string(), resources })
}
