//! Slice requests: creation against the quota (auto-approved where the tenant's policy allows), admin approval and
//! rejection, cancellation by the tenant, and the release of an active request by the tenant or, reclaiming it, by a
//! platform admin.

use tessera_core::quota::{Decision, charge};
use tessera_core::request::{RequestState, SliceSpec};

pub use super::queue::CreateQueue;
use crate::app::AppState;
use crate::error::ApiError;
use crate::store::{Created, NewRequest, Principal, SliceRequest, Transition};

/// Most slices one request may ask for.
pub const MAX_COUNT: u32 = 1000;
/// Shortest duration a request may ask for, in seconds.
pub const MIN_DURATION_S: u64 = 60;
/// Longest duration a request may ask for (90 days), in seconds.
pub const MAX_DURATION_S: u64 = 90 * 24 * 3600;
/// Longest `Idempotency-Key` accepted.
pub const MAX_IDEMPOTENCY_KEY: usize = 200;

/// What an admin or a tenant does to a request (approval, which places it, is in `approvals`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Admin: pending -> rejected, with a reason.
    Reject,
    /// Tenant: withdraw before it is active.
    Cancel,
    /// Tenant, or a platform admin reclaiming it: active -> released, giving its instances and quota back. A
    /// platform admin who is not a member of the tenant must say why.
    Release,
}

/// What a tenant asks for.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    /// Tenant id.
    pub tenant: &'a str,
    /// What one slice is.
    pub spec: &'a SliceSpec,
    /// How many slices.
    pub count: u32,
    /// Why.
    pub reason: &'a str,
    /// How long, once active, in seconds.
    pub duration_s: Option<u64>,
    /// Its priority within the tenant.
    pub priority: tessera_core::cohort::Priority,
}

/// Creates a request. Returns it and whether it was created now (`false`: an idempotent replay).
pub async fn create(
    state: &AppState,
    p: &Principal,
    ask: Ask<'_>,
    idempotency_key: Option<&str>,
) -> Result<(SliceRequest, bool), ApiError> {
    let Ask { tenant, spec, count, reason, duration_s, priority } = ask;
    if !p.can_see(tenant) {
        return Err(ApiError::NotFound(format!("tenant {tenant} not found")));
    }
    tessera_core::text::check_reason(reason).map_err(|e| ApiError::invalid("invalid_reason", e.to_string()))?;
    if !(1..=MAX_COUNT).contains(&count) {
        return Err(ApiError::invalid("invalid_count", format!("count must be between 1 and {MAX_COUNT}")));
    }
    if duration_s.is_some_and(|d| !(MIN_DURATION_S..=MAX_DURATION_S).contains(&d)) {
        let detail = format!("duration_s must be between {MIN_DURATION_S} and {MAX_DURATION_S} seconds");
        return Err(ApiError::invalid("invalid_duration", detail));
    }
    super::budgets::check(state, tenant, spec)?;
    if let Some(key) = idempotency_key
        && (key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY)
    {
        let detail = format!("Idempotency-Key must be 1-{MAX_IDEMPOTENCY_KEY} characters");
        return Err(ApiError::Invalid {
            status: axum::http::StatusCode::BAD_REQUEST,
            code: "invalid_idempotency_key",
            detail,
        });
    }
    let charge = charge(state.catalog, spec, count).map_err(|e| ApiError::invalid(e.code(), e.to_string()))?;
    let actor = p.actor();
    let new = NewRequest {
        tenant_id: tenant,
        spec,
        count,
        reason,
        charge: &charge,
        state: RequestState::Pending,
        actor: &actor,
        idempotency: idempotency_key.map(|k| (p.user.id.as_str(), k)),
        duration_s,
        priority,
    };
    let Created { request, created, tenant: tenant_row } = match state.creates.create(new).await {
        Ok(done) => done,
        // The same key raced in for another tenant: one won, this one is a reuse.
        Err(crate::store::StoreError::Conflict { constraint }) if constraint == "idempotency_keys" => {
            return Err(key_reused());
        }
        Err(e) => return Err(e.into()),
    };
    if !created && (request.tenant_id != tenant || request.spec != *spec || request.count != count) {
        return Err(key_reused());
    }
    // In a cohort, the request may be borrowed, or may need back what is lent out: the cohort is rebalanced now,
    // so holders of what is reclaimed are told at once.
    if created
        && let Some(cohort) = &tenant_row.cohort_id
        && let Err(e) = super::cohorts::rebalance(state, cohort, Some(&tenant_row.id)).await
    {
        tracing::warn!(cohort = %cohort, error = %e, "rebalancing the cohort after a request failed");
    }
    let request = if created && tenant_row.cohort_id.is_some() {
        state.store.request(&request.id).await.unwrap_or(request)
    } else {
        request
    };
    // Within the tenant's auto-approval policy, the request is approved the way an admin would approve it: placed
    // by the planner. Where it cannot be placed now (no capacity, the fleet changed), it stays pending for an admin.
    if created && tenant_row.policy.decide(&charge) == Decision::AutoApprove {
        match crate::services::approvals::approve_as(state, AUTO_APPROVER, request.clone(), Some(request.version)).await
        {
            Ok(approval) => return Ok((approval.request, true)),
            Err(e) => tracing::info!(request = %request.id, error = %e, "auto-approval left the request pending"),
        }
    }
    Ok((request, created))
}

/// The audit actor of approvals made by a tenant's policy.
pub const AUTO_APPROVER: &str = "system:auto-approve";

pub use super::lookup::get;

/// Applies `action`; `if_match` is the version the caller saw (from the `ETag`), if it sent one.
pub async fn act(
    state: &AppState,
    p: &Principal,
    id: &str,
    action: Action,
    if_match: Option<i64>,
    reason: Option<&str>,
) -> Result<SliceRequest, ApiError> {
    let request = get(state, p, id).await?;
    let to = match action {
        Action::Reject if !p.user.platform_admin => {
            return Err(ApiError::Forbidden("only platform admins approve or reject requests".to_string()));
        }
        Action::Reject => RequestState::Rejected,
        Action::Cancel => RequestState::Cancelled,
        Action::Release => RequestState::Released,
    };
    let reason = reason.map(str::trim).filter(|r| !r.is_empty());
    if let Some(r) = reason {
        tessera_core::text::check_reason(r).map_err(|e| ApiError::invalid("invalid_reason", e.to_string()))?;
    }
    let reason = match action {
        Action::Reject if reason.is_none() => {
            return Err(ApiError::invalid("reason_required", "rejecting a request needs a reason"));
        }
        Action::Release if reason.is_none() && p.role_in(&request.tenant_id).is_none() => {
            return Err(ApiError::invalid(
                "reason_required",
                "reclaiming another tenant's request needs a reason (it is shown to the tenant)",
            ));
        }
        Action::Reject | Action::Release => reason,
        Action::Cancel => None,
    };
    let actor = p.actor();
    let t = Transition { id: &request.id, expected_version: if_match, to, reason, actor: &actor };
    let gpus: Vec<String> = state
        .store
        .tenant_allocations(&request.tenant_id)
        .await?
        .into_iter()
        .filter(|a| a.request_id == request.id)
        .map(|a| a.gpu_id)
        .collect();
    let after = state.store.transition(t).await?;
    if !gpus.is_empty() {
        crate::services::agents::refresh_gpus(state, &gpus).await;
    }
    Ok(after)
}

fn key_reused() -> ApiError {
    ApiError::invalid("idempotency_key_reused", "this Idempotency-Key was used for a different request; use a new key")
}
