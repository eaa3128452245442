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
    Booking, CalGpu, Calendar, Hold, LEAD_MS, Prepared, ReservationError, ReservationPolicy, ReservationState,
    Shortfall, check_window,
};

use super::approvals::FleetNow;
use crate::app::AppState;
use crate::error::ApiError;
use tessera_store::reservations::{Holdings, NewReservation, ReservationRecord};
use tessera_store::{Guard, Principal, Reservation, SliceRequest, StoreError, Transition, now_ms};

/// The audit actor of the sweep's moves.
pub const SYSTEM: &str = "system:reservations";
/// How often an acceptance is tried again when the calendar changed under it.
const TRIES: usize = 5;
/// Most reservations one list answers.
pub const MAX_LIST: u32 = 1000;
/// Accepted reservations a calendar reads at most.
const MAX_BOOKINGS: u32 = 100_000;
/// A started reservation is "ending soon" within this time of its end, in milliseconds.
pub const ENDING_SOON_MS: i64 = 3_600_000;

/// What a calendar is built from, read together (the holdings first: anything written after them is caught).
#[derive(Debug, Clone)]
pub struct CalendarRead {
    /// The calendar's version and the live allocations, as read.
    pub holdings: Holdings,
    /// Accepted reservations that have not ended.
    pub bookings: Vec<Booking>,
    /// Request id -> (starts_at_ms, ends_by_ms) for live requests bounded in time.
    windows: HashMap<String, (Option<i64>, Option<i64>)>,
    /// Request id -> the reservation it was made for.
    made_for: HashMap<String, String>,
    /// Accepted reservation id -> its tenant's id.
    owners: HashMap<String, String>,
    /// Accepted reservation id -> the slices the last simulation placed it on.
    hints: HashMap<String, Vec<Hold>>,
}

impl CalendarRead {
    /// Reads the calendar's version, accepted reservations and bounded requests.
    pub async fn read(state: &AppState) -> Result<CalendarRead, ApiError> {
        let holdings = state.store.holdings().await?;
        let now = now_ms();
        let accepted =
            state.store.reservations(None, &[ReservationState::Accepted], now, i64::MAX, MAX_BOOKINGS).await?;
        let owners = accepted.iter().map(|r| (r.id.clone(), r.tenant_id.clone())).collect();
        let bookings = accepted.into_iter().map(booking).collect();
        let rows = state.store.request_windows().await?;
        let made_for = rows.iter().filter_map(|(id, _, _, r)| Some((id.clone(), r.clone()?))).collect();
        let windows = rows.into_iter().map(|(id, s, e, _)| (id, (s, e))).collect();
        let hints = kept_slices(state).await?;
        Ok(CalendarRead { holdings, bookings, windows, made_for, owners, hints })
    }

    /// When request `id` may start and must end by, if bounded.
    pub fn window(&self, id: &str) -> (Option<i64>, Option<i64>) {
        self.windows.get(id).copied().unwrap_or((None, None))
    }

    /// The calendar of `fleet`, whose live allocations belong to `live` requests: each held until its request
    /// expires or must end, else for ever.
    pub fn calendar(&self, state: &AppState, fleet: &FleetNow, live: &[SliceRequest]) -> Calendar<'static> {
        let ends: HashMap<&str, Option<i64>> =
            live.iter().map(|r| (r.id.as_str(), r.expires_at_ms.or_else(|| self.window(&r.id).1))).collect();
        let holds = fleet
            .live
            .iter()
            .map(|a| Hold {
                gpu: a.gpu_id.clone(),
                profile: a.profile.clone(),
                start: a.start,
                until_ms: ends.get(a.request_id.as_str()).copied().flatten(),
            })
            .collect();
        Calendar::new(state.catalog, gpus(fleet), holds, self.bookings.clone()).with_hints(self.hints.clone())
    }

    /// Whether placing `request`'s slices at `placed` leaves every accepted reservation its room: the guard its
    /// approval commits with (and the time it must end by, when a duration lets it end before a reservation that
    /// needs its room), or `409 reserved`.
    pub async fn guard(
        &self,
        state: &AppState,
        fleet: &FleetNow,
        request: &SliceRequest,
        placed: &[Reservation],
    ) -> Result<Guard, ApiError> {
        let free = Guard { bookings_version: self.holdings.bookings_version, ends_by_ms: None };
        if !self.any_ahead() || placed.is_empty() {
            return Ok(free);
        }
        let live = state.store.live_requests().await?;
        let bounded = self.window(&request.id).1.or(request.expires_at_ms);
        match self.protect(state, fleet, &live, bounded, request.duration_s.is_some(), placed) {
            Ok(ends_by_ms) => Ok(Guard { ends_by_ms, ..free }),
            Err(s) => Err(reserved(&s)),
        }
    }

    /// The id of the tenant that made the accepted reservation `id`.
    pub fn owner(&self, id: &str) -> Option<&str> {
        self.owners.get(id).map(String::as_str)
    }

    /// Whether any accepted reservation has not ended.
    pub fn any_ahead(&self) -> bool {
        let now = now_ms();
        self.bookings.iter().any(|b| b.end_ms > now)
    }

    /// [`CalendarRead::guard`]'s decision on `live` requests for slices at `placed` held until `bounded` (`None`:
    /// not known): `Ok(None)` when they may stay as long as they like, `Ok(Some(t))` when they must end by `t` (only
    /// for a request with a duration), or the reservation they would leave short.
    pub fn protect(
        &self,
        state: &AppState,
        fleet: &FleetNow,
        live: &[SliceRequest],
        bounded: Option<i64>,
        has_duration: bool,
        placed: &[Reservation],
    ) -> Result<Option<i64>, Shortfall> {
        let now = now_ms();
        let cal = self.calendar(state, fleet, live);
        let holds = |until_ms: Option<i64>| -> Vec<Hold> {
            placed
                .iter()
                .map(|r| Hold { gpu: r.gpu_id.clone(), profile: r.profile.clone(), start: r.start, until_ms })
                .collect()
        };
        if placed.is_empty() || cal.bookings().iter().all(|b| b.end_ms <= now) {
            return Ok(None);
        }
        let prepared = state.prepared.prepare(&cal, now);
        let forever = match prepared.protects(&holds(bounded)) {
            Ok(()) => return Ok(None),
            Err(s) => s,
        };
        if bounded.is_none() && has_duration && prepared.protects(&holds(Some(forever.start_ms))).is_ok() {
            return Ok(Some(forever.start_ms));
        }
        Err(forever)
    }

    /// The reservation request `id` was made for, and its start, if the start is still ahead.
    pub fn not_before(&self, id: &str) -> Option<(String, i64)> {
        let (starts, _) = self.window(id);
        let reservation = self.made_for.get(id)?;
        starts.filter(|s| *s > now_ms()).map(|s| (reservation.clone(), s))
    }
}

/// The last simulation of the calendar ([`Prepared`]), kept for the questions that follow: a preview typed
/// character by character, the protection check of every approval and of every waiting request explained. It is
/// reused only for the very same calendar (GPUs, holds, reservations and kept slices compared whole) when nothing
/// happened since it was made ([`Prepared::answers_for`]), and for at most [`PREPARED_REUSE_MS`]; so a reused
/// simulation answers exactly as a new one would.
#[derive(Debug, Default)]
pub struct PreparedCache(std::sync::Mutex<Option<Arc<Prepared<'static>>>>);

/// Longest a prepared simulation is reused.
pub const PREPARED_REUSE_MS: i64 = 30_000;

impl PreparedCache {
    /// A simulation of `cal` from `now`: the kept one when it answers for `cal` now, else a new one (kept for the
    /// next question).
    pub fn prepare(&self, cal: &Calendar<'static>, now: i64) -> Arc<Prepared<'static>> {
        let kept = self.0.lock().ok().and_then(|k| k.clone());
        if let Some(p) = kept.filter(|p| now - p.from_ms() <= PREPARED_REUSE_MS && p.answers_for(cal, now)) {
            return p;
        }
        self.keep(Arc::new(cal.prepare(now)))
    }

    /// The simulation of `cal` from `now`, as [`PreparedCache::prepare`] answers it; when `cal` is the kept
    /// simulation's calendar with one reservation more (one just accepted), the kept one accepts it and keeps its
    /// slices ([`Prepared::accept_and_keep`]), replaying only from its start: the same simulation as a new one.
    pub fn simulate(&self, cal: &Calendar<'static>, now: i64) -> tessera_core::reservation::Simulation {
        let kept = self.0.lock().ok().and_then(|k| k.clone()).filter(|p| now - p.from_ms() <= PREPARED_REUSE_MS);
        if let Some(p) = &kept {
            if p.answers_for(cal, now) {
                return p.simulation();
            }
            if let Some(b) = p.one_more(cal, now) {
                let mut more = Prepared::clone(p);
                if more.accept_and_keep(b.clone()).is_ok() {
                    return self.keep(Arc::new(more)).simulation();
                }
            }
        }
        self.prepare(cal, now).simulation()
    }

    fn keep(&self, p: Arc<Prepared<'static>>) -> Arc<Prepared<'static>> {
        if let Ok(mut k) = self.0.lock() {
            *k = Some(p.clone());
        }
        p
    }
}

/// `409 reserved`: the capacity is booked by an accepted reservation from `s.start_ms`.
pub fn reserved(s: &Shortfall) -> ApiError {
    ApiError::Conflict {
        code: "reserved",
        detail: format!(
            "reservation {} needs this capacity from {}; ask for a duration that ends before then, or wait until it \
             ends",
            s.booking,
            tessera_core::clock::utc_minute(s.start_ms)
        ),
        errors: vec![],
    }
}

/// A reservation's kept slices as stored: `[[gpu, profile or sharing key, start], ...]`.
fn slices_to_json(slices: &[Hold]) -> String {
    let rows: Vec<(&str, &str, u8)> = slices.iter().map(|h| (h.gpu.as_str(), h.profile.as_str(), h.start)).collect();
    serde_json::to_string(&rows).unwrap_or_else(|_| "[]".to_string())
}

/// [`slices_to_json`]'s form read back (`None` when it is not that form: the reservation is then planned anew).
fn slices_from_json(json: &str) -> Option<Vec<Hold>> {
    let rows: Vec<(String, String, u8)> = serde_json::from_str(json).ok()?;
    Some(rows.into_iter().map(|(gpu, profile, start)| Hold { gpu, profile, start, until_ms: None }).collect())
}

/// Where the calendar's simulations kept each accepted reservation's slices, by reservation id.
async fn kept_slices(state: &AppState) -> Result<HashMap<String, Vec<Hold>>, ApiError> {
    Ok(state
        .store
        .reservation_slices()
        .await?
        .into_iter()
        .filter_map(|(id, json)| Some((id, slices_from_json(&json)?)))
        .collect())
}

/// Simulates the calendar as it is and keeps where each accepted reservation's slices went, for the reservations
/// whose placement changed: the next simulation keeps them there while those slices are free (see
/// [`Calendar::with_hints`]). Run after every acceptance and by the sweep (a cancellation only frees room, so the
/// kept slices stay free).
pub async fn keep_slices(state: &AppState) -> Result<(), ApiError> {
    let read = CalendarRead::read(state).await?;
    if read.bookings.is_empty() {
        return Ok(());
    }
    let fleet = FleetNow::read(state).await?;
    let live = state.store.live_requests().await?;
    let sim = state.prepared.simulate(&read.calendar(state, &fleet, &live), now_ms());
    let changed: Vec<(String, String)> = sim
        .placed
        .into_iter()
        .filter(|(id, slices)| {
            let same = |kept: &Vec<Hold>| {
                kept.len() == slices.len()
                    && kept
                        .iter()
                        .zip(slices)
                        .all(|(a, b)| (&a.gpu, &a.profile, a.start) == (&b.gpu, &b.profile, b.start))
            };
            !slices.is_empty() && !read.hints.get(id).is_some_and(same)
        })
        .map(|(id, slices)| (id, slices_to_json(&slices)))
        .collect();
    Ok(state.store.set_reservation_slices(&changed).await?)
}

fn booking(r: ReservationRecord) -> Booking {
    Booking { id: r.id, spec: r.spec, count: r.count, start_ms: r.start_ms, end_ms: r.end_ms }
}

/// The calendar's GPUs from the fleet as read.
fn gpus(fleet: &FleetNow) -> Vec<CalGpu> {
    fleet
        .nodes
        .iter()
        .flat_map(|n| n.gpus.iter())
        .map(|g| CalGpu {
            id: g.id.clone(),
            node: g.node_id.clone(),
            model: g.model.clone(),
            mig: g.mig_enabled,
            cordoned: g.cordoned,
            layout: g.layout.iter().map(|i| (i.profile.clone(), i.start)).collect(),
        })
        .collect()
}

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
        Some(key) => super::tenants::get(state, p, key).await?.id,
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
            &[ReservationState::Pending, ReservationState::Accepted, ReservationState::Started],
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
    let tenant = super::tenants::get(state, p, tenant).await?;
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
    let tenant = super::tenants::get(state, p, tenant).await?;
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
        Some(key) => Some(super::tenants::get(state, p, key).await?.id),
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

/// Withdraws a pending or accepted reservation (the tenant's members, platform admins); a started one releases its
/// slices (or cancels its request) and ends.
pub async fn cancel(
    state: &AppState,
    p: &Principal,
    id: &str,
    if_match: Option<i64>,
) -> Result<ReservationRecord, ApiError> {
    let r = get(state, p, id).await?;
    if r.state == ReservationState::Started {
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
