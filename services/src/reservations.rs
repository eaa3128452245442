//! Reservations: booking slices for a window ahead, deciding, cancelling, previews, policies; the protection every
//! approval runs (an allocation may not leave an accepted reservation without room); and the sweep that starts
//! reservations at their lead time, turns their slices active at their start and ends them.
//!
//! The rules are `tessera_core::reservation`'s: [`Calendar`] replays the future with the planner. This module reads
//! what the calendar needs (GPUs, live allocations with their known ends, accepted reservations) and hands the
//! store what it read ([`Holdings`]) so that an acceptance commits only if nothing changed since.

use crate::auth::Permissions;
use std::collections::HashMap;
use std::sync::Arc;

use tessera_api::reservations::{NewReservationBody, ReservationPreview, ReservationQuery};
use tessera_core::quota::{Decision, Usage, charge};
use tessera_core::request::RequestState;
use tessera_core::reservation::{
    Booking, Hold, LEAD_MS, ReservationError, ReservationPolicy, ReservationState, Shortfall, check_window,
};

use crate::app::AppState;
pub use crate::calendar::{CalendarRead, keep_slices, reserved};
use crate::calendar::{MAX_BOOKINGS, kept_slices};
use crate::error::ApiError;
use crate::placement::FleetNow;
use tessera_store::reservations::{NewReservation, ReservationRecord};
use tessera_store::{Principal, SliceRequest, StoreError, Transition, now_ms};

/// The audit actor of the sweep's moves.
pub const SYSTEM: &str = "system:reservations";
/// How often an acceptance is tried again when the calendar changed under it.
const TRIES: usize = 5;
/// Most reservations one list answers.
pub const MAX_LIST: u32 = 1000;
/// A started reservation is "ending soon" within this time of its end, in milliseconds.
pub const ENDING_SOON_MS: i64 = 3_600_000;

/// The policy in force for `tenant_id`, and where it comes from (`tenant`, `global`, `default`).
pub async fn policy(state: &AppState, tenant_id: &str) -> Result<(ReservationPolicy, &'static str), ApiError> {
    if let Some(p) = state.store.reservation_policy(tenant_id).await? {
        return Ok((p, "tenant"));
    }
    if let Some(p) = state.store.reservation_policy(GLOBAL).await? {
        return Ok((p, "global"));
    }
    Ok((ReservationPolicy::default(), "default"))
}

/// The scope of the policy for every tenant.
pub const GLOBAL: &str = "*";

/// Sets or clears (`None`) the policy of a tenant (`Some(id)`) or of every tenant (platform admins).
pub async fn set_policy(
    state: &AppState,
    p: &Principal,
    tenant: Option<&str>,
    policy: Option<&ReservationPolicy>,
) -> Result<(), ApiError> {
    p.require_platform_admin()?;
    if let Some(policy) = policy {
        policy.validate().map_err(rule)?;
    }
    let scope = match tenant {
        Some(key) => crate::lookup::tenant(state, p, key).await?.id,
        None => GLOBAL.to_string(),
    };
    Ok(state.store.set_reservation_policy(&scope, policy, &p.actor()).await?)
}

fn rule(e: ReservationError) -> ApiError {
    match e {
        ReservationError::Transition { .. } => {
            ApiError::Conflict { code: "reservation_invalid_transition", detail: e.to_string(), errors: vec![] }
        }
        e => ApiError::invalid(e.code(), e.to_string()),
    }
}

fn store_rule(e: StoreError) -> ApiError {
    match e {
        StoreError::Rule { code: "invalid_transition", detail } => {
            ApiError::Conflict { code: "reservation_invalid_transition", detail, errors: vec![] }
        }
        e => e.into(),
    }
}

/// What a booking was checked against, and what it found.
struct Checked {
    charge: Usage,
    auto_approve: bool,
    policy: ReservationPolicy,
}

/// The checks every booking passes (and its preview reports): visibility, text and count bounds, the window
/// against the policy, the tenant's quota over the window.
async fn check(
    state: &AppState,
    p: &Principal,
    tenant: &tessera_store::Tenant,
    body: &NewReservationBody,
    now: i64,
) -> Result<Checked, ApiError> {
    p.require_visible(&tenant.id, "tenant")?;
    let charge = shape(state, body)?;
    let (policy, _) = policy(state, &tenant.id).await?;
    let open = state
        .store
        .reservations(
            Some(&tenant.id),
            &[
                ReservationState::Pending,
                ReservationState::Accepted,
                ReservationState::Preparing,
                ReservationState::Started,
            ],
            0,
            i64::MAX,
            MAX_BOOKINGS,
        )
        .await?;
    policy.check(now, body.start_ms, body.end_ms, open.len() as u32).map_err(rule)?;
    // Quota over the window: what the tenant's live requests will still hold, and its other reservations.
    // The limits as request creation counts them: in a cohort, the maximums where set.
    let mut limits = state.store.quotas(&tenant.id).await?;
    if tenant.cohort_id.is_some() {
        let (maximums, _) = state.store.bounds(&tenant.id).await?;
        for (r, m) in maximums {
            let l = limits.entry(r).or_default();
            *l = (*l).max(m);
        }
    }
    let windows: HashMap<String, Option<i64>> =
        state.store.request_windows().await?.into_iter().map(|(id, _, e, _)| (id, e)).collect();
    let live: Vec<(Usage, Option<i64>)> = state
        .store
        .live_requests()
        .await?
        .into_iter()
        .filter(|r| r.tenant_id == tenant.id)
        .filter_map(|r| {
            let c = tessera_core::quota::charge(state.catalog, &r.spec, r.count).ok()?;
            let until = r.expires_at_ms.or_else(|| windows.get(&r.id).copied().flatten());
            Some((c, until))
        })
        .collect();
    let charges: HashMap<String, Usage> = state.store.reservation_charges(&tenant.id).await?.into_iter().collect();
    let booked: Vec<(Usage, i64, i64)> = open
        .iter()
        .filter(|r| r.state == ReservationState::Accepted || r.state == ReservationState::Pending)
        .filter_map(|r| Some((charges.get(&r.id)?.clone(), r.start_ms, r.end_ms)))
        .collect();
    check_window(&limits, &live, &booked, body.start_ms, body.end_ms, &charge).map_err(ApiError::QuotaExceeded)?;
    let auto_approve = tenant.policy.decide(&charge) == Decision::AutoApprove;
    Ok(Checked { charge, auto_approve, policy })
}

/// Whether `body` is a booking at all: its reason, its count (1-1000) and its spec (a known model and profile,
/// replicas in range); what it charges, or a 422.
fn shape(state: &AppState, body: &NewReservationBody) -> Result<Usage, ApiError> {
    tessera_core::text::check_reason(&body.reason).map_err(|e| ApiError::invalid("invalid_reason", e.to_string()))?;
    if !(1..=super::requests::MAX_COUNT).contains(&body.count) {
        return Err(ApiError::invalid("invalid_count", "count must be between 1 and 1000"));
    }
    charge(state.catalog, &body.spec, body.count).map_err(|e| ApiError::invalid(e.code(), e.to_string()))
}

/// Whether `spec` x `count` over `[start, end)` fits the calendar as read: `409 no_room_in_window` otherwise.
async fn admit(state: &AppState, body: &NewReservationBody, id: &str) -> Result<CalendarRead, ApiError> {
    let read = CalendarRead::read(state).await?;
    let fleet = FleetNow::read(state).await?;
    let live = state.store.live_requests().await?;
    let cal = read.calendar(state, &fleet, &live);
    let new = Booking {
        id: id.to_string(),
        spec: body.spec.clone(),
        count: body.count,
        start_ms: body.start_ms,
        end_ms: body.end_ms,
    };
    // The kept simulation when it answers for this calendar (a preview just before, or the last acceptance).
    let now = now_ms();
    let fits =
        if body.start_ms > now { state.prepared.prepare(&cal, now).fits(&new) } else { cal.prepare(now).fits(&new) };
    match fits {
        Ok(()) => Ok(read),
        Err(short) => Err(no_room(&short, id)),
    }
}

fn no_room(short: &[Shortfall], id: &str) -> ApiError {
    let detail = match short.iter().find(|s| s.booking == id) {
        Some(s) => format!(
            "only {} of {} slices find room for the whole window; choose another window or fewer slices (the \
             preview says how many fit)",
            s.placed, s.wanted
        ),
        None => "booking it would leave an accepted reservation without room; choose another window".to_string(),
    };
    ApiError::Conflict { code: "no_room_in_window", detail, errors: vec![] }
}

/// Books a reservation for `tenant` (its members): accepted at once where the tenant's policy approves the slices
/// on its own, else pending for a platform admin. Refused when the window breaks the policy, the tenant's quota
/// over the window, or does not fit the calendar.
pub async fn book(
    state: &AppState,
    p: &Principal,
    tenant: &str,
    body: &NewReservationBody,
) -> Result<ReservationRecord, ApiError> {
    let tenant = crate::lookup::tenant(state, p, tenant).await?;
    let checked = check(state, p, &tenant, body, now_ms()).await?;
    let reason = body.reason.trim();
    let actor = p.actor();
    let new = NewReservation {
        tenant_id: &tenant.id,
        spec: &body.spec,
        count: body.count,
        start_ms: body.start_ms,
        end_ms: body.end_ms,
        reason,
        charge: &checked.charge,
        actor: &actor,
    };
    for _ in 0..TRIES {
        let read = admit(state, body, "new").await?;
        let accept = checked.auto_approve.then_some(&read.holdings);
        match state.store.book(new, accept, checked.policy.max_concurrent).await {
            Err(StoreError::Conflict { constraint }) if constraint == "reservation_calendar" => continue,
            Err(e) => return Err(e.into()),
            Ok(r) => {
                if r.state == ReservationState::Accepted {
                    keep_slices_after(state).await;
                }
                return Ok(r);
            }
        }
    }
    Err(busy())
}

/// [`keep_slices`] after a change that has committed: a failure is logged (the next sweep keeps them).
async fn keep_slices_after(state: &AppState) {
    if let Err(e) = keep_slices(state).await {
        tracing::warn!(error = %e, "keeping the reservations' slices failed; the next sweep tries again");
    }
}

fn busy() -> ApiError {
    ApiError::Conflict {
        code: "calendar_busy",
        detail: "the calendar kept changing while this was checked; try again".to_string(),
        errors: vec![],
    }
}

/// What booking `body` for `tenant` would do, without writing anything; and how many slices of the spec the
/// window has room for.
pub async fn preview(
    state: &AppState,
    p: &Principal,
    tenant: &str,
    body: &NewReservationBody,
) -> Result<ReservationPreview, ApiError> {
    let tenant = crate::lookup::tenant(state, p, tenant).await?;
    p.require_visible(&tenant.id, "tenant")?;
    // A body that is not a booking at all (its reason, count or spec) is a 422, as booking it would be; what
    // booking would refuse (the policy, the quota, the room) is answered in `refused`.
    shape(state, body)?;
    let (policy, _) = policy(state, &tenant.id).await?;
    let checked = check(state, p, &tenant, body, now_ms()).await;
    let read = CalendarRead::read(state).await?;
    let fleet = FleetNow::read(state).await?;
    let live = state.store.live_requests().await?;
    // One simulation of the accepted reservations (kept between previews while the calendar is unchanged); each
    // question then replays only from the window's start.
    let now = now_ms();
    let cal = read.calendar(state, &fleet, &live);
    let prepared = if body.start_ms > now { state.prepared.prepare(&cal, now) } else { Arc::new(cal.prepare(now)) };
    let asked = Booking {
        id: "preview".into(),
        spec: body.spec.clone(),
        count: body.count,
        start_ms: body.start_ms,
        end_ms: body.end_ms,
    };
    // How many fit (counted up to the limit) and whether the asked count does: one search, whose first probe is the
    // asked count.
    let limit = tessera_core::reservation::preview_limit(body.count);
    let (most, fits) = if body.end_ms > body.start_ms && charge(state.catalog, &body.spec, 1).is_ok() {
        let (most, fits) = prepared.preview(&asked);
        (most.min(super::requests::MAX_COUNT), Some(fits))
    } else {
        (0, None)
    };
    let refused = match &checked {
        Err(e) => Some(e.problem()),
        Ok(_) => fits.unwrap_or_else(|| prepared.fits(&asked)).err().map(|s| no_room(&s, "preview").problem()),
    };
    Ok(ReservationPreview {
        fits: refused.is_none(),
        auto_approve: checked.as_ref().is_ok_and(|c| c.auto_approve),
        refused,
        free_in_window: most,
        free_in_window_limit: limit,
        policy,
    })
}

/// A reservation the caller may see.
pub async fn get(state: &AppState, p: &Principal, id: &str) -> Result<ReservationRecord, ApiError> {
    let not_found = || ApiError::NotFound(format!("reservation {id} not found"));
    let r = state.store.reservation(id).await.map_err(|e| match e {
        StoreError::NotFound { .. } => not_found(),
        e => e.into(),
    })?;
    if !p.can_see(&r.tenant_id) {
        return Err(not_found());
    }
    Ok(r)
}

/// Reservations the caller may see: one tenant's, or every tenant's for platform admins.
pub async fn list(state: &AppState, p: &Principal, q: &ReservationQuery) -> Result<Vec<ReservationRecord>, ApiError> {
    let tenant = match q.tenant.as_deref() {
        Some(key) => Some(crate::lookup::tenant(state, p, key).await?.id),
        None if p.user.platform_admin => None,
        None => match p.memberships.as_slice() {
            [(one, _)] => Some(one.clone()),
            _ => return Err(ApiError::invalid("tenant_required", "name the tenant: you belong to several")),
        },
    };
    let limit = q.limit.unwrap_or(500);
    if !(1..=MAX_LIST).contains(&limit) {
        return Err(ApiError::invalid("invalid_limit", "limit must be between 1 and 1000"));
    }
    let from = q.from_ms.unwrap_or_else(|| now_ms() - 7 * 86_400_000);
    let to = q.to_ms.unwrap_or(i64::MAX);
    let states: Vec<ReservationState> = q.state.into_iter().collect();
    Ok(state.store.reservations(tenant.as_deref(), &states, from, to, limit).await?)
}

/// Accepts a pending reservation (platform admins), if it still fits its window.
pub async fn approve(
    state: &AppState,
    p: &Principal,
    id: &str,
    if_match: Option<i64>,
) -> Result<ReservationRecord, ApiError> {
    let r = get(state, p, id).await?;
    p.require_platform_admin()?;
    r.state.transition(ReservationState::Accepted).map_err(rule)?;
    let body = NewReservationBody {
        spec: r.spec.clone(),
        count: r.count,
        start_ms: r.start_ms,
        end_ms: r.end_ms,
        reason: r.reason.clone(),
    };
    if r.start_ms <= now_ms() {
        return Err(ApiError::Conflict {
            code: "reservation_started",
            detail: "its window has begun; the tenant can make a request instead".into(),
            errors: vec![],
        });
    }
    for _ in 0..TRIES {
        let read = admit(state, &body, &r.id).await?;
        match state
            .store
            .decide_reservation(&r.id, if_match, ReservationState::Accepted, None, Some(&read.holdings), &p.actor())
            .await
        {
            Err(StoreError::Conflict { constraint }) if constraint == "reservation_calendar" => continue,
            Err(e) => return Err(store_rule(e)),
            Ok(accepted) => {
                keep_slices_after(state).await;
                return Ok(accepted);
            }
        }
    }
    Err(busy())
}

/// Rejects a pending reservation with a reason (platform admins).
pub async fn reject(
    state: &AppState,
    p: &Principal,
    id: &str,
    if_match: Option<i64>,
    reason: &str,
) -> Result<ReservationRecord, ApiError> {
    let r = get(state, p, id).await?;
    p.require_platform_admin()?;
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(ApiError::invalid("reason_required", "rejecting a reservation needs a reason"));
    }
    tessera_core::text::check_reason(reason).map_err(|e| ApiError::invalid("invalid_reason", e.to_string()))?;
    state
        .store
        .decide_reservation(&r.id, if_match, ReservationState::Rejected, Some(reason), None, &p.actor())
        .await
        .map_err(store_rule)
}

/// Withdraws a pending or accepted reservation (the tenant's members, platform admins); a preparing or started one
/// releases its slices (or cancels its request) and ends.
pub async fn cancel(
    state: &AppState,
    p: &Principal,
    id: &str,
    if_match: Option<i64>,
) -> Result<ReservationRecord, ApiError> {
    let r = get(state, p, id).await?;
    if matches!(r.state, ReservationState::Preparing | ReservationState::Started) {
        if let Some(request) = &r.request_id
            && let Ok(req) = state.store.request(request).await
            && !req.state.is_terminal()
        {
            let action = if req.state == RequestState::Active {
                super::requests::Action::Release
            } else {
                super::requests::Action::Cancel
            };
            let reason = Some("its reservation was cancelled");
            super::requests::act(state, p, request, action, None, reason).await?;
        }
        return state
            .store
            .decide_reservation(&r.id, if_match, ReservationState::Ended, Some("cancelled"), None, &p.actor())
            .await
            .map_err(store_rule);
    }
    state
        .store
        .decide_reservation(&r.id, if_match, ReservationState::Cancelled, None, None, &p.actor())
        .await
        .map_err(store_rule)
}

/// What one sweep did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    /// Reservations started (their request made) at their lead time.
    pub started: usize,
    /// Requests made for reservations that turned active at their start.
    pub activated: usize,
    /// Reservations ended.
    pub ended: usize,
    /// Reservations failed (still pending at their start).
    pub failed: usize,
}

/// The reservations' clock, run by the server's sweep: pending reservations whose start came fail; accepted ones
/// within their lead time start (their request is made and placed like any approval); placed slices whose start
/// came turn active; started reservations whose window is over (or whose request ended) end, their request
/// released if it still runs.
pub async fn sweep(state: &AppState) -> Result<Swept, ApiError> {
    sweep_at(state, now_ms()).await
}

/// [`sweep`] as of `now`.
pub async fn sweep_at(state: &AppState, now: i64) -> Result<Swept, ApiError> {
    let mut done = Swept::default();
    // Where the calendar's simulations kept each accepted reservation's slices: a reservation starting now is
    // placed there when it can be (read before it starts: only accepted reservations' slices are kept).
    let kept = kept_slices(state).await?;
    let open = state
        .store
        .reservations(None, &[ReservationState::Pending, ReservationState::Accepted], 0, now + LEAD_MS, MAX_BOOKINGS)
        .await?;
    for r in open {
        match r.state {
            ReservationState::Pending if r.start_ms <= now => {
                let why = Some("nobody approved it before its start");
                if state
                    .store
                    .decide_reservation(&r.id, Some(r.version), ReservationState::Failed, why, None, SYSTEM)
                    .await
                    .is_ok()
                {
                    done.failed += 1;
                }
            }
            ReservationState::Accepted if r.start_ms - LEAD_MS <= now => {
                let (_, request_id) = match state.store.start_reservation(&r.id, SYSTEM).await {
                    Ok(started) => started,
                    Err(e) => {
                        tracing::warn!(reservation = %r.id, error = %e, "starting a reservation failed");
                        continue;
                    }
                };
                done.started += 1;
                place(state, &request_id, kept.get(&r.id).map_or(&[][..], Vec::as_slice)).await;
            }
            _ => {}
        }
    }
    // Requests made for reservations that are still pending (no room at the lead time yet): tried each sweep.
    let windows = state.store.request_windows().await?;
    for (id, starts, _, _) in &windows {
        if starts.is_some()
            && let Ok(r) = state.store.request(id).await
            && r.state == RequestState::Pending
        {
            place(state, id, &[]).await;
        }
    }
    for (id, version) in state.store.due_starts(now).await? {
        let t = Transition {
            id: &id,
            expected_version: Some(version),
            to: RequestState::Active,
            reason: None,
            actor: SYSTEM,
        };
        if state.store.transition(t).await.is_ok() {
            done.activated += 1;
        }
    }
    for (id, version) in state.store.reservations_over(now).await? {
        let Ok(r) = state.store.reservation(&id).await else { continue };
        if let Some(request) = &r.request_id
            && let Ok(req) = state.store.request(request).await
            && !req.state.is_terminal()
        {
            let to = match req.state {
                RequestState::Active => RequestState::Expired,
                RequestState::Pending => RequestState::Expired,
                _ => RequestState::Cancelled,
            };
            let reason = Some("its reservation's window is over");
            let t = Transition { id: request, expected_version: None, to, reason, actor: SYSTEM };
            if let Err(e) = state.store.transition(t).await {
                tracing::warn!(request = %request, error = %e, "ending a reservation's request failed");
                continue;
            }
            let gpus: Vec<String> = state
                .store
                .tenant_allocations(&req.tenant_id)
                .await
                .map(|all| all.into_iter().filter(|a| a.request_id == req.id).map(|a| a.gpu_id).collect())
                .unwrap_or_default();
            super::agents::refresh_gpus(state, &gpus).await;
        }
        if state.store.decide_reservation(&id, Some(version), ReservationState::Ended, None, None, SYSTEM).await.is_ok()
        {
            done.ended += 1;
        }
    }
    keep_slices_after(state).await;
    Ok(done)
}

/// Places the request made for a reservation, as an approval would, on the reservation's `kept` slices where they
/// are all free; where there is no room yet, the next sweep tries again.
async fn place(state: &AppState, request_id: &str, kept: &[Hold]) {
    let Ok(request) = state.store.request(request_id).await else { return };
    let version = request.version;
    if let Err(e) = super::approvals::approve_on(state, SYSTEM, request, Some(version), kept).await {
        tracing::info!(request = %request_id, error = %e, "a reservation's slices find no room yet");
    }
}

/// Longest range one calendar read covers: 31 days.
pub const MAX_CALENDAR_MS: i64 = 31 * 86_400_000;

/// The fleet's calendar over a range (anyone signed in): per GPU, live allocations until their known end and
/// accepted reservations where the planner would place them at their start. Tenants the caller may not see stay
/// anonymous.
pub async fn calendar(
    state: &AppState,
    p: &Principal,
    q: &tessera_api::reservations::CalendarQuery,
) -> Result<tessera_api::reservations::CalendarView, ApiError> {
    use tessera_api::reservations::{BlockKind, CalendarBlock, CalendarGpu, CalendarView};
    let now = now_ms();
    let from = q.from_ms.unwrap_or(now);
    let to = q.to_ms.unwrap_or_else(|| from.saturating_add(7 * 86_400_000));
    if to <= from || to - from > MAX_CALENDAR_MS {
        return Err(ApiError::invalid("invalid_range", "to_ms must come after from_ms, at most 31 days after it"));
    }
    let model = match &q.model {
        Some(m) => Some(
            state
                .catalog
                .resolve(m)
                .map(|(m, _)| m.key.clone())
                .ok_or_else(|| ApiError::invalid("unknown_model", format!("no GPU model `{m}` in the catalog")))?,
        ),
        None => None,
    };
    let read = CalendarRead::read(state).await?;
    let fleet = FleetNow::read(state).await?;
    let live = state.store.live_requests().await?;
    let sim = read.calendar(state, &fleet, &live).simulate(now, &[]);
    let requests: HashMap<&str, &SliceRequest> = live.iter().map(|r| (r.id.as_str(), r)).collect();
    let mut gpus = Vec::new();
    for node in &fleet.nodes {
        for g in node.gpus.iter().filter(|g| model.as_ref().is_none_or(|m| *m == g.model)) {
            let mut blocks: Vec<CalendarBlock> = Vec::new();
            for a in fleet.live.iter().filter(|a| a.gpu_id == g.id) {
                let request = requests.get(a.request_id.as_str());
                let end_ms = request.and_then(|r| r.expires_at_ms.or_else(|| read.window(&r.id).1));
                let seen = p.can_see(&a.tenant_id);
                blocks.push(CalendarBlock {
                    kind: BlockKind::Allocation,
                    start_ms: now,
                    end_ms,
                    profile: a.profile.clone(),
                    slot: a.start,
                    tenant: seen.then(|| a.tenant_id.clone()),
                    owner: seen.then(|| a.request_id.clone()),
                });
            }
            for b in &read.bookings {
                let Some(placed) = sim.placed.get(&b.id) else { continue };
                let tenant = read.owners.get(&b.id).filter(|t| p.can_see(t));
                for h in placed.iter().filter(|h| h.gpu == g.id) {
                    blocks.push(CalendarBlock {
                        kind: BlockKind::Reservation,
                        start_ms: b.start_ms,
                        end_ms: Some(b.end_ms),
                        profile: h.profile.clone(),
                        slot: h.start,
                        tenant: tenant.cloned(),
                        owner: tenant.map(|_| b.id.clone()),
                    });
                }
            }
            blocks.retain(|b| b.start_ms < to && b.end_ms.is_none_or(|e| e > from));
            blocks.sort_by_key(|b| (b.start_ms, b.slot));
            gpus.push(CalendarGpu {
                gpu: g.id.clone(),
                node: node.name.clone(),
                index: g.index,
                model: g.model.clone(),
                mig: g.mig_enabled,
                cordoned: g.cordoned,
                blocks,
            });
        }
    }
    Ok(CalendarView { from_ms: from, to_ms: to, gpus })
}
