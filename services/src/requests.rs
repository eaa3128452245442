//! Slice requests: creation against the quota (auto-approved where the tenant's policy allows), admin approval and
//! rejection, cancellation by the tenant, and the release of an active request by the tenant or, reclaiming it, by a
//! platform admin.

use tessera_core::quota::{Decision, charge};
use tessera_core::request::{RequestState, SliceSpec};

pub use super::queue::CreateQueue;
use crate::app::AppState;
use crate::error::ApiError;
pub use tessera_api::requests::RequestPreview;
use tessera_store::{Created, NewRequest, Principal, SliceRequest, Transition};

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

/// The checks every request passes before the quota (creation and preview run them alike): the tenant is
/// visible, the reason, count and duration are within bounds, and no spent budget refuses it.
fn check(state: &AppState, p: &Principal, ask: &Ask<'_>) -> Result<(), ApiError> {
    check_bounds(p, ask)?;
    super::budgets::check(state, ask.tenant, ask.spec)
}

/// The checks of [`check`] but the budget's.
fn check_bounds(p: &Principal, ask: &Ask<'_>) -> Result<(), ApiError> {
    if !p.can_see(ask.tenant) {
        return Err(ApiError::NotFound(format!("tenant {} not found", ask.tenant)));
    }
    tessera_core::text::check_reason(ask.reason).map_err(|e| ApiError::invalid("invalid_reason", e.to_string()))?;
    if !(1..=MAX_COUNT).contains(&ask.count) {
        return Err(ApiError::invalid("invalid_count", format!("count must be between 1 and {MAX_COUNT}")));
    }
    if ask.duration_s.is_some_and(|d| !(MIN_DURATION_S..=MAX_DURATION_S).contains(&d)) {
        let detail = format!("duration_s must be between {MIN_DURATION_S} and {MAX_DURATION_S} seconds");
        return Err(ApiError::invalid("invalid_duration", detail));
    }
    Ok(())
}

/// What creating `ask` would do now, without writing anything: the same checks, the same quota rule on the quota
/// as it is ([`tessera_core::cohort::admit`]), the tenant's policy, and the placement an approval would choose
/// ([`crate::placement::placement`]); if it would wait, why, and its earliest start. A preview that says "approved
/// now" and a creation a moment later with nothing changed in between agree.
pub async fn preview(state: &AppState, p: &Principal, ask: Ask<'_>) -> Result<RequestPreview, ApiError> {
    use tessera_api::requests::{PreviewLine, PreviewOutcome, PreviewSlice};
    use tessera_core::pending::Room;
    check_bounds(p, &ask)?;
    let tenant = state.store.tenant(ask.tenant).await?;
    let budget = super::budgets::check(state, ask.tenant, ask.spec);
    let charge = charge(state.catalog, ask.spec, ask.count).map_err(|e| ApiError::invalid(e.code(), e.to_string()))?;
    let (members, who, in_cohort) = state.store.quota_group(&tenant.id).await?;
    let units = |m: u64| m as f64 / tessera_core::quota::MILLI as f64;
    let me = &members[who];
    let quota: Vec<PreviewLine> = charge
        .iter()
        .map(|(r, amount)| {
            let held = me.held.get(r).copied().unwrap_or(0);
            PreviewLine {
                resource: r.to_string(),
                charge: units(*amount),
                held: units(held),
                limit: me.guaranteed.get(r).copied().map(units),
                maximum: if in_cohort { me.ceiling(r, true).map(units) } else { None },
                after: units(held.saturating_add(*amount)),
            }
        })
        .collect();
    let refusal = match budget {
        Err(e) => Some(e),
        Ok(()) => tessera_core::cohort::admit(&members, who, in_cohort, &charge).err().map(ApiError::QuotaExceeded),
    };
    let admission = tessera_core::cohort::admit(&members, who, in_cohort, &charge).ok();
    let auto_approve = tenant.policy.decide(&charge) == Decision::AutoApprove;
    let ctx = super::waits::Context::read(state, p).await?;
    let fleet = ctx.fleet();
    let placed = crate::placement::placement(state, fleet, ask.spec, ask.count).ok();
    let slices: Vec<PreviewSlice> = placed
        .as_ref()
        .map(|(changes, reservations)| {
            reservations
                .iter()
                .filter_map(|res| {
                    let node = fleet.nodes.iter().find(|n| n.gpus.iter().any(|g| g.id == res.gpu_id))?;
                    let gpu = node.gpus.iter().find(|g| g.id == res.gpu_id)?;
                    let change = res.change.and_then(|i| changes.get(i));
                    Some(PreviewSlice {
                        node: node.name.clone(),
                        gpu: gpu.id.clone(),
                        gpu_index: gpu.index,
                        model: gpu.model.clone(),
                        profile: res.profile.clone(),
                        start: res.start,
                        new_instance: change.is_some(),
                        layout_change_needs_admin: change.is_some_and(|c| !c.auto_apply),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    // Room booked by an accepted reservation: the request would wait for it (or, with a duration, be placed limited
    // to end before it).
    let reserved = ctx.reserved_for(state, ask.spec, ask.count, ask.duration_s);
    let outcome = match (&refusal, auto_approve, placed.is_some() && reserved.is_none()) {
        (Some(_), _, _) => PreviewOutcome::Refused,
        (None, true, true) if slices.iter().all(|s| !s.layout_change_needs_admin) => PreviewOutcome::ApprovedNow,
        (None, true, true) => PreviewOutcome::ApprovedWaitingForLayout,
        (None, _, _) => PreviewOutcome::Pending,
    };
    // Why it would wait, as the request it would be (pending, holding what it charges).
    let (waiting, sentence, earliest_start_ms) = if outcome == PreviewOutcome::Pending {
        // Taking back what it needs would start with its creation: the deadline is a grace period away.
        let grace_ms = match (&tenant.cohort_id, admission.as_ref().is_some_and(|a| a.reclaims)) {
            (Some(c), true) => Some(i64::from(state.store.cohort(c).await?.grace_s) * 1000),
            _ => None,
        };
        let room = if placed.is_some() { Room::Placeable } else { ctx.room(state, ask.spec, ask.count) };
        let facts = tessera_core::pending::Facts {
            state: RequestState::Pending,
            over_quota: None,
            reclaim_until: grace_ms.map(|g| tessera_store::now_ms() + g),
            auto_approves: auto_approve,
            room: room.clone(),
            approvers: ctx.approvers(),
            slices: vec![],
            reserved: reserved.clone(),
            not_before: None,
        };
        let why = tessera_core::pending::reason(&facts);
        let start = ctx.start(state, ask.spec, ask.count, &room);
        (why.clone(), why.map(|w| w.sentence()), start)
    } else {
        (None, None, None)
    };
    Ok(RequestPreview {
        tenant: tenant.id.clone(),
        outcome,
        refused: refusal.map(|e| e.problem()),
        quota,
        borrowed: admission.as_ref().is_some_and(|a| a.borrowed),
        reclaims: admission.as_ref().is_some_and(|a| a.reclaims),
        auto_approve,
        slices,
        waiting,
        sentence,
        earliest_start_ms,
    })
}

/// Creates a request. Returns it and whether it was created now (`false`: an idempotent replay).
pub async fn create(
    state: &AppState,
    p: &Principal,
    ask: Ask<'_>,
    idempotency_key: Option<&str>,
) -> Result<(SliceRequest, bool), ApiError> {
    create_replacing(state, p, ask, idempotency_key, None).await
}

/// [`create`], for a request that replaces the active request `replaces` of the same tenant once it is active
/// itself (the caller has checked that it may).
pub async fn create_replacing(
    state: &AppState,
    p: &Principal,
    ask: Ask<'_>,
    idempotency_key: Option<&str>,
    replaces: Option<&str>,
) -> Result<(SliceRequest, bool), ApiError> {
    let Ask { tenant, spec, count, reason, duration_s, priority } = ask;
    check(state, p, &ask)?;
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
        replaces,
    };
    let Created { request, created, tenant: tenant_row } = match state.creates.create(new).await {
        Ok(done) => done,
        // The same key raced in for another tenant: one won, this one is a reuse.
        Err(tessera_store::StoreError::Conflict { constraint }) if constraint == "idempotency_keys" => {
            return Err(key_reused());
        }
        Err(tessera_store::StoreError::Conflict { constraint }) if constraint == "replacement_open" => {
            let detail = format!("another request already replaces request {}", replaces.unwrap_or_default());
            return Err(ApiError::conflict("replacement_open", detail));
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
        match crate::approvals::approve_as(state, AUTO_APPROVER, request.clone(), Some(request.version)).await {
            Ok(approval) => return Ok((approval.request, true)),
            // The sweep that places queued requests ([`place_queued`]) moved it meanwhile: answer with what it
            // is now.
            Err(ApiError::Conflict { code: "version_conflict", .. }) => {
                return Ok((state.store.request(&request.id).await?, true));
            }
            Err(e) => tracing::info!(request = %request.id, error = %e, "auto-approval left the request pending"),
        }
    }
    Ok((request, created))
}

/// The audit actor of approvals made by a tenant's policy.
pub use tessera_store::reservations::AUTO_APPROVER;

pub use super::lookup::get;
pub use crate::approvals::{QUEUED_PER_SWEEP, place_queued};

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
        crate::agents::refresh_gpus(state, &gpus).await;
    }
    Ok(after)
}

fn key_reused() -> ApiError {
    ApiError::invalid("idempotency_key_reused", "this Idempotency-Key was used for a different request; use a new key")
}
