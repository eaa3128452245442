//! Quota requests and the history of limits: a tenant's admin asks, a platform admin grants (in full or in part)
//! or refuses, the tenant's admins may withdraw a pending one; temporary increases end on their date (the sweep in
//! `serve`). The rules are `tessera_core::quota_request`'s; the store runs them in the transaction that writes.

use crate::auth::Permissions;
use std::collections::BTreeMap;

use tessera_api::quotas::{GrantBody, NewQuotaRequest, QuotaRequestQuery};
use tessera_core::quota::{Milli, Resource};
use tessera_core::quota_request::amount;

use crate::app::AppState;
use crate::error::ApiError;
use tessera_store::Principal;
use tessera_store::quotas::{LimitChange, QuotaDecision, QuotaRequest, QuotaRequestFilter};

/// Most limit changes one history read returns.
pub const MAX_HISTORY: u32 = 1000;

fn parse_limits(state: &AppState, limits: &BTreeMap<String, f64>) -> Result<Vec<(Resource, Milli)>, ApiError> {
    limits
        .iter()
        .map(|(key, units)| {
            let resource = Resource::parse(state.catalog, key)
                .map_err(|e| ApiError::invalid("quota_bad_resource", e.to_string()))?;
            let m = amount(key, *units).map_err(|e| ApiError::invalid(e.code(), e.to_string()))?;
            Ok((resource, m))
        })
        .collect()
}

fn check_text(text: &str, required: bool) -> Result<(), ApiError> {
    if required && text.trim().is_empty() {
        return Err(ApiError::invalid("reason_required", "say why"));
    }
    tessera_core::text::check_reason(text).map_err(|e| ApiError::invalid("invalid_reason", e.to_string()))
}

/// Asks for new limits for the tenant `tenant` (its id or name): its admins and platform admins.
pub async fn ask(
    state: &AppState,
    p: &Principal,
    tenant: &str,
    body: &NewQuotaRequest,
) -> Result<QuotaRequest, ApiError> {
    let tenant = crate::lookup::tenant(state, p, tenant).await?;
    p.require_tenant_admin_to(&tenant.id, "ask for quota")?;
    check_text(&body.reason, true)?;
    let asked = parse_limits(state, &body.limits)?;
    Ok(state.store.create_quota_request(&tenant.id, &asked, body.reason.trim(), body.until_ms, &p.actor()).await?)
}

/// Passes a member's ask for more quota to the tenant's admins (any member; one every 10 s per member and
/// tenant): the same checks as a quota request, nothing changed but an event (`quota_request.suggested`) in the
/// inbox of the tenant's members and of platform admins, and a line in the audit log. Returns who was told: the
/// tenant's admins, or the platform admins where the tenant has none.
pub async fn suggest(
    state: &AppState,
    p: &Principal,
    tenant: &str,
    body: &NewQuotaRequest,
) -> Result<tessera_api::quotas::QuotaSuggestion, ApiError> {
    let tenant = crate::lookup::tenant(state, p, tenant).await?;
    check_text(&body.reason, true)?;
    if !(1..=32).contains(&body.limits.len()) {
        return Err(ApiError::invalid("quota_request_invalid", "ask for 1 to 32 resources"));
    }
    parse_limits(state, &body.limits)?;
    let admins: Vec<String> = state
        .store
        .members(&tenant.id)
        .await?
        .into_iter()
        .filter(|(_, role)| *role == tessera_store::Role::TenantAdmin)
        .map(|(u, _)| u.name)
        .collect();
    // Without a tenant admin, the platform admins (who read every tenant's inbox) are the ones told.
    let platform_admins: Vec<String> = if admins.is_empty() {
        state.store.users().await?.into_iter().filter(|u| u.platform_admin).map(|u| u.name).collect()
    } else {
        Vec::new()
    };
    super::notifications::throttled(state, &format!("quota-suggestion/{}/{}", p.user.id, tenant.id), "an ask")?;
    let suggestion = tessera_api::quotas::QuotaSuggestion {
        tenant: tenant.id.clone(),
        limits: body.limits.clone(),
        reason: body.reason.trim().to_string(),
        suggested_by: p.actor(),
        tenant_admins: admins,
        platform_admins,
    };
    let mut after = serde_json::to_value(&suggestion).map_err(|e| ApiError::Internal(e.to_string()))?;
    after["tenant_id"] = serde_json::Value::String(tenant.id.clone());
    state.store.suggest_quota(&tenant.id, &after.to_string(), &p.actor()).await?;
    Ok(suggestion)
}

/// A quota request the caller may see.
pub async fn get(state: &AppState, p: &Principal, id: &str) -> Result<QuotaRequest, ApiError> {
    let not_found = || ApiError::NotFound(format!("quota request {id} not found"));
    let request = state.store.quota_request(id).await.map_err(|e| match e {
        tessera_store::StoreError::NotFound { .. } => not_found(),
        e => e.into(),
    })?;
    if !p.can_see(&request.tenant_id) {
        return Err(not_found());
    }
    Ok(request)
}

/// Quota requests the caller may see, newest first: every tenant's for platform admins, their tenants' otherwise;
/// `tenant` narrows to one. Returns the page and the next cursor.
pub async fn list(
    state: &AppState,
    p: &Principal,
    q: &QuotaRequestQuery,
) -> Result<(Vec<QuotaRequest>, Option<String>), ApiError> {
    let limit = q.limit.unwrap_or(100);
    if !(1..=500).contains(&limit) {
        return Err(ApiError::invalid("invalid_limit", "limit must be between 1 and 500"));
    }
    let tenants: Option<Vec<String>> = match &q.tenant {
        Some(t) => Some(vec![crate::lookup::tenant(state, p, t).await?.id]),
        None if p.is_platform_admin() => None,
        None => Some(p.memberships.iter().map(|(t, _)| t.clone()).collect()),
    };
    let filter = QuotaRequestFilter {
        tenants: tenants.as_deref(),
        state: q.state,
        before: q.cursor.as_deref(),
        limit: limit + 1,
    };
    let mut items = state.store.list_quota_requests(filter).await?;
    let next = if items.len() > limit as usize {
        items.truncate(limit as usize);
        items.last().map(|r| r.id.clone())
    } else {
        None
    };
    Ok((items, next))
}

/// Grants a pending quota request (platform admins), in full or with the amounts in `body`; the limits change in
/// the same transaction.
pub async fn approve(
    state: &AppState,
    p: &Principal,
    id: &str,
    if_match: Option<i64>,
    body: &GrantBody,
) -> Result<QuotaRequest, ApiError> {
    p.require_platform_admin()?;
    get(state, p, id).await?;
    check_text(&body.comment, false)?;
    let granted = match &body.limits {
        Some(l) => Some(parse_limits(state, l)?.into_iter().collect::<BTreeMap<_, _>>()),
        None => None,
    };
    let decision = QuotaDecision::Grant(granted);
    Ok(state.store.decide_quota_request(id, if_match, decision, body.comment.trim(), &p.actor()).await?)
}

/// Refuses a pending quota request with a reason (platform admins).
pub async fn reject(
    state: &AppState,
    p: &Principal,
    id: &str,
    if_match: Option<i64>,
    reason: &str,
) -> Result<QuotaRequest, ApiError> {
    p.require_platform_admin()?;
    get(state, p, id).await?;
    check_text(reason, true)?;
    Ok(state.store.decide_quota_request(id, if_match, QuotaDecision::Reject, reason.trim(), &p.actor()).await?)
}

/// Withdraws a pending quota request (the tenant's admins, platform admins).
pub async fn cancel(
    state: &AppState,
    p: &Principal,
    id: &str,
    if_match: Option<i64>,
) -> Result<QuotaRequest, ApiError> {
    let request = get(state, p, id).await?;
    p.require_tenant_admin_to(&request.tenant_id, "withdraw quota requests")?;
    Ok(state.store.decide_quota_request(id, if_match, QuotaDecision::Cancel, "", &p.actor()).await?)
}

/// The changes of a tenant's limits, newest first (at most `limit`, 1 to [`MAX_HISTORY`]).
pub async fn history(state: &AppState, p: &Principal, tenant: &str, limit: u32) -> Result<Vec<LimitChange>, ApiError> {
    if !(1..=MAX_HISTORY).contains(&limit) {
        return Err(ApiError::invalid("invalid_limit", format!("limit must be between 1 and {MAX_HISTORY}")));
    }
    let tenant = crate::lookup::tenant(state, p, tenant).await?;
    Ok(state.store.limit_changes(&tenant.id, limit).await?)
}
