//! Why requests wait, where they stand in the queue and when they could start, from the fleet, the quotas, the
//! reclaim notices and the approval policies as they are now (`tessera_core::pending` decides). Read on demand,
//! so always current: a request's reason changes as soon as what it waits for does.
//!
//! The placement asked of the planner is the one approvals use ([`crate::placement::placement`]); the earliest start
//! asks it again with the slices of known end released, in the order they end.
//!
//! An explanation is read for a caller: ids of other tenants' objects it would name (the requests whose instances
//! would move to make room, the reservation that booked the room) are left out unless the caller may see that
//! tenant, as the calendar does.

use std::collections::HashMap;

use tessera_api::requests::Waiting;
use tessera_core::catalog::model::GpuModel;
use tessera_core::pending::{
    Facts, HeldBack, InstanceMove, ModelRoom, Room, RoomChange, SliceFacts, WaitReason, earliest_start, fragmented,
    reason,
};
use tessera_core::quota::{Decision, MILLI, Resource, Usage};
use tessera_core::request::{RequestState, SliceSpec};

use crate::app::AppState;
use crate::error::ApiError;
use crate::placement::{FleetNow, placement};
use tessera_store::{Principal, SliceRequest, Tenant, now_ms};

/// Most requests explained in one answer (a tenant's waiting list, the metrics).
pub const MAX_EXPLAINED: usize = 500;

/// Whose object ids an explanation may name.
#[derive(Debug, Clone)]
enum Audience {
    /// Every tenant's: a platform admin, or counts that never leave the server.
    All,
    /// Only these tenants' (the caller's memberships).
    Tenants(Vec<String>),
}

impl Audience {
    /// What `p` may be told: every id for a platform admin, else their tenants' ids.
    fn of(p: &Principal) -> Audience {
        if p.user.platform_admin {
            Audience::All
        } else {
            Audience::Tenants(p.memberships.iter().map(|(t, _)| t.clone()).collect())
        }
    }

    fn sees(&self, tenant_id: &str) -> bool {
        match self {
            Audience::All => true,
            Audience::Tenants(ids) => ids.iter().any(|t| t == tenant_id),
        }
    }
}

/// What every explanation reads, whoever asks: read once per wave of callers ([`crate::state::coalesced`]), each
/// getting a reading begun after its call.
#[derive(Debug)]
pub struct Shared {
    fleet: FleetNow,
    tenants: Vec<Tenant>,
    admins: Vec<String>,
    /// The live requests that hold slices or are about to (approved, provisioning, active): bounded by the fleet,
    /// whatever the length of the queue. The queue itself is read only to place a request in it ([`Context::queue`]).
    placed: Vec<SliceRequest>,
    /// Node id -> ready.
    ready: HashMap<String, bool>,
    /// Accepted reservations and requests bounded in time.
    calendar: crate::calendar::CalendarRead,
    now: i64,
    /// Whether the planner places `count` slices of a spec on this reading's fleet, as asked so far: the callers
    /// of a wave that ask for the same (a burst of one script's requests) ask the planner once.
    placeable: std::sync::Mutex<HashMap<(SliceSpec, u32), bool>>,
}

impl Shared {
    async fn read(state: &AppState) -> Result<Shared, ApiError> {
        let now = now_ms();
        // Independent reads, at once: a caller waits for the longest, not for their sum.
        let (calendar, fleet, ready, users, tenants, placed) = tokio::try_join!(
            crate::calendar::CalendarRead::read(state),
            FleetNow::read(state),
            async { Ok::<_, ApiError>(super::agents::ready_nodes(state, now).await?) },
            async { Ok::<_, ApiError>(state.store.users().await?) },
            async { Ok::<_, ApiError>(state.store.tenants().await?) },
            async { Ok::<_, ApiError>(state.store.placed_requests().await?) },
        )?;
        let admins = users.into_iter().filter(|u| u.platform_admin).map(|u| u.name).collect();
        Ok(Shared { fleet, tenants, admins, placed, ready, calendar, now, placeable: std::sync::Mutex::default() })
    }
}

/// What every explanation for one caller shares: the [`Shared`] reading, what the caller may be told, and the
/// quotas read so far.
#[derive(Debug)]
pub struct Context {
    shared: std::sync::Arc<Shared>,
    audience: Audience,
    /// Tenant id -> (limits or maximums in force, held).
    quotas: HashMap<String, (Usage, Usage)>,
    /// The pending requests, by id, once read (only to say where a request stands in the queue).
    queue: Option<std::sync::Arc<Vec<SliceRequest>>>,
}

impl std::ops::Deref for Context {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.shared
    }
}

impl Context {
    /// Reads what explanations for `p` need: they name other tenants' objects only where `p` may see them. The
    /// reading began after this call (shared with the callers asking at the same time).
    pub async fn read(state: &AppState, p: &Principal) -> Result<Context, ApiError> {
        Self::read_for(state, Audience::of(p)).await
    }

    async fn read_for(state: &AppState, audience: Audience) -> Result<Context, ApiError> {
        let shared = state.wait_reads.read(|| Shared::read(state)).await?;
        Ok(Context { shared, audience, quotas: HashMap::new(), queue: None })
    }

    /// The fleet as it was read.
    pub fn fleet(&self) -> &FleetNow {
        &self.fleet
    }

    /// Who can approve requests: the platform admins' names.
    pub fn approvers(&self) -> Vec<String> {
        self.admins.clone()
    }

    /// What the planner says of `count` slices of `spec` on the fleet now.
    pub fn room(&self, state: &AppState, spec: &SliceSpec, count: u32) -> Room {
        room(state, self, spec, count)
    }

    /// The accepted reservation that placing `count` slices of `spec` now (for as long as `duration_s`, or for
    /// ever) would leave without room, and its start (its id only where the caller may see its tenant).
    pub fn reserved_for(
        &self,
        state: &AppState,
        spec: &SliceSpec,
        count: u32,
        duration_s: Option<u64>,
    ) -> Option<(Option<String>, i64)> {
        if !self.calendar.any_ahead() {
            return None;
        }
        let (_, placed) = placement(state, &self.fleet, spec, count).ok()?;
        let s = self.calendar.protect(state, &self.fleet, &self.placed, None, duration_s.is_some(), &placed).err()?;
        Some((self.nameable_booking(s.booking), s.start_ms))
    }

    /// The accepted reservation that placing `request` now would leave without room, and its start (its id only
    /// where the caller may see its tenant).
    pub fn reserved_by(&self, state: &AppState, request: &SliceRequest) -> Option<(Option<String>, i64)> {
        if !self.calendar.any_ahead() {
            return None;
        }
        let (_, placed) = placement(state, &self.fleet, &request.spec, request.count).ok()?;
        let bounded = self.calendar.window(&request.id).1.or(request.expires_at_ms);
        let has_duration = request.duration_s.is_some();
        let s = self.calendar.protect(state, &self.fleet, &self.placed, bounded, has_duration, &placed).err()?;
        Some((self.nameable_booking(s.booking), s.start_ms))
    }

    /// `booking`'s id where the caller may see the tenant that made it.
    fn nameable_booking(&self, booking: String) -> Option<String> {
        self.calendar.owner(&booking).is_some_and(|t| self.audience.sees(t)).then_some(booking)
    }

    /// When `count` slices of `spec` could start (see [`start`]).
    pub fn start(&self, state: &AppState, spec: &SliceSpec, count: u32, room: &Room) -> Option<i64> {
        start(state, self, spec, count, room)
    }

    /// The pending requests (every tenant's), by id: read once per context, and shared with the callers asking at
    /// the same time.
    async fn queue(&mut self, state: &AppState) -> Result<std::sync::Arc<Vec<SliceRequest>>, ApiError> {
        if let Some(q) = &self.queue {
            return Ok(q.clone());
        }
        let q = read_queue(state).await?;
        self.queue = Some(q.clone());
        Ok(q)
    }

    /// The limits in force (in a cohort, the maximums where set) and what is held, for `tenant`.
    async fn quota(&mut self, state: &AppState, tenant: &Tenant) -> Result<(Usage, Usage), ApiError> {
        if let Some(q) = self.quotas.get(&tenant.id) {
            return Ok(q.clone());
        }
        let mut limits = state.store.quotas(&tenant.id).await?;
        if tenant.cohort_id.is_some() {
            let (maximums, _) = state.store.bounds(&tenant.id).await?;
            for (r, m) in maximums {
                let l = limits.entry(r).or_default();
                *l = (*l).max(m);
            }
        }
        let held = state.store.held(&tenant.id).await?;
        self.quotas.insert(tenant.id.clone(), (limits.clone(), held.clone()));
        Ok((limits, held))
    }
}

/// The pending requests (every tenant's), by id, from a reading begun after this call (shared per wave).
async fn read_queue(state: &AppState) -> Result<std::sync::Arc<Vec<SliceRequest>>, ApiError> {
    state.queue_reads.read(|| async { Ok::<_, ApiError>(state.store.pending_requests(None).await?) }).await
}

fn units(m: u64) -> f64 {
    m as f64 / MILLI as f64
}

/// How much of an explanation to give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Detail {
    /// The reason, the place in the queue and the earliest start (`GET` of a request, a tenant's waiting list).
    Full,
    /// For a request just created within its quota (creation checked the quota in its transaction): the reason
    /// and the earliest start, without reading the queue.
    Created,
    /// The answer to a creation retried with its `Idempotency-Key` (the request may be old, its quota lowered
    /// since): the reason and the earliest start, without reading the queue.
    Replayed,
    /// The reason only (the counts in `/metrics`).
    Reason,
}

/// Why `r` waits, its place in the queue and its earliest start; `None` when it does not wait.
pub async fn explain(state: &AppState, ctx: &mut Context, r: &SliceRequest) -> Result<Option<Waiting>, ApiError> {
    explain_as(state, ctx, r, Detail::Full).await
}

/// Why `r`, the answer to a creation (`created`: made by it, else an earlier request with the same
/// `Idempotency-Key`), waits: as [`explain`] says, from the same reading, without its place in the queue
/// (`queue_position` is null: reading the queue would cost each creation as much as the queue is long). A request
/// just made is not checked against its quota again: creation refused it had it been over.
pub async fn explain_created(
    state: &AppState,
    p: &Principal,
    r: &SliceRequest,
    created: bool,
) -> Result<Option<Waiting>, ApiError> {
    if !waits(r) {
        return Ok(None);
    }
    let mut ctx = Context::read(state, p).await?;
    explain_as(state, &mut ctx, r, if created { Detail::Created } else { Detail::Replayed }).await
}

/// Whether a request in `r`'s state may wait (pending, approved or provisioning).
fn waits(r: &SliceRequest) -> bool {
    matches!(r.state, RequestState::Pending | RequestState::Approved | RequestState::Provisioning)
}

/// [`explain`], with as much as `detail` asks.
async fn explain_as(
    state: &AppState,
    ctx: &mut Context,
    r: &SliceRequest,
    detail: Detail,
) -> Result<Option<Waiting>, ApiError> {
    if !waits(r) {
        return Ok(None);
    }
    let Some(tenant) = ctx.tenants.iter().find(|t| t.id == r.tenant_id).cloned() else { return Ok(None) };
    let charge = tessera_core::quota::charge(state.catalog, &r.spec, r.count)
        .map_err(|e| ApiError::invalid(e.code(), e.to_string()))?;
    let over_quota = if detail == Detail::Created {
        None
    } else {
        let (limits, held) = ctx.quota(state, &tenant).await?;
        charge.iter().find_map(|(res, amount)| {
            let (l, h) = (*limits.get(res)?, held.get(res).copied().unwrap_or(0));
            (h > l).then(|| (res.to_string(), units(h), units(*amount), units(l)))
        })
    };
    // Room made by taking back a borrowed request's slices (a pending request being taken back holds none).
    let reclaim_until = ctx
        .placed
        .iter()
        .filter(|x| x.reclaim_for.as_deref() == Some(tenant.name.as_str()))
        .filter_map(|x| x.reclaim_at_ms)
        .max();
    let room = if r.state == RequestState::Pending { room(state, ctx, &r.spec, r.count) } else { Room::Placeable };
    let slices = ctx
        .fleet
        .live
        .iter()
        .filter(|a| a.request_id == r.id)
        .filter_map(|a| {
            let node = ctx.fleet.nodes.iter().find(|n| n.gpus.iter().any(|g| g.id == a.gpu_id))?;
            let gpu = node.gpus.iter().find(|g| g.id == a.gpu_id)?;
            let proposal = a.proposal_id.clone().filter(|p| ctx.fleet.open.iter().any(|o| &o.id == p));
            Some(SliceFacts {
                proposal,
                gpu: gpu.id.clone(),
                cordoned: gpu.cordoned,
                node: node.name.clone(),
                node_ready: ctx.ready.get(&node.id).copied().unwrap_or(false),
            })
        })
        .collect();
    let facts = Facts {
        state: r.state,
        over_quota,
        reclaim_until,
        auto_approves: tenant.policy.decide(&charge) == Decision::AutoApprove,
        room: room.clone(),
        approvers: ctx.admins.clone(),
        slices,
        reserved: if r.state == RequestState::Pending && room == Room::Placeable {
            ctx.reserved_by(state, r)
        } else {
            None
        },
        not_before: ctx.calendar.not_before(&r.id),
    };
    let Some(why) = reason(&facts) else { return Ok(None) };
    let pending = r.state == RequestState::Pending;
    let queue_position = if pending && detail == Detail::Full { Some(position(state, ctx, r).await?) } else { None };
    let earliest_start_ms =
        if pending && detail != Detail::Reason { start(state, ctx, &r.spec, r.count, &room) } else { None };
    Ok(Some(Waiting {
        request: r.id.clone(),
        sentence: why.sentence(),
        reason: why,
        queue_position,
        earliest_start_ms,
    }))
}

/// What the planner says of `count` slices of `spec` on the fleet now.
fn room(state: &AppState, ctx: &Context, spec: &SliceSpec, count: u32) -> Room {
    let key = (spec.clone(), count);
    let known = ctx.placeable.lock().ok().and_then(|m| m.get(&key).copied());
    let placeable = known.unwrap_or_else(|| {
        let placeable = placement(state, &ctx.fleet, spec, count).is_ok();
        if let Ok(mut m) = ctx.placeable.lock() {
            m.insert(key, placeable);
        }
        placeable
    });
    if placeable {
        return Room::Placeable;
    }
    Room::Unplaceable(models_room(state, ctx, spec, count))
}

/// Per GPU model the request may use: compute slices free on its GPUs that take new work, and what it needs.
fn models_room(state: &AppState, ctx: &Context, spec: &SliceSpec, count: u32) -> Vec<ModelRoom> {
    let (profile, wanted) = match spec {
        SliceSpec::Mig { profile, model } => (Some(profile.as_str()), model.clone()),
        SliceSpec::Exclusive { model } | SliceSpec::Timeslice { model, .. } | SliceSpec::Mps { model, .. } => {
            (None, Some(model.clone()))
        }
    };
    let wanted = wanted.and_then(|m| state.catalog.resolve(&m).map(|(m, _)| m.key.clone()));
    let mut out: Vec<ModelRoom> = Vec::new();
    for model in &state.catalog.models {
        if wanted.as_ref().is_some_and(|w| *w != model.key) {
            continue;
        }
        let needed = match profile {
            Some(p) => match model.profile(p) {
                Some(p) => f64::from(p.compute_slices) * f64::from(count),
                None => continue,
            },
            None => {
                let charge = tessera_core::quota::charge(state.catalog, spec, count).unwrap_or_default();
                units(charge.get(&Resource::ComputeSlices).copied().unwrap_or(0))
            }
        };
        let mut free = 0.0;
        let mut gpus = 0;
        let mut usable = Vec::new();
        let mut held_back = HeldBack::default();
        for node in &ctx.fleet.nodes {
            let ready = ctx.ready.get(&node.id).copied().unwrap_or(false);
            for g in node.gpus.iter().filter(|g| g.model == model.key && g.mig_enabled == profile.is_some()) {
                gpus += 1;
                let total = f64::from(model.compute_slices_total);
                let held: f64 = ctx
                    .fleet
                    .live
                    .iter()
                    .filter(|a| a.gpu_id == g.id)
                    .map(|a| tessera_core::quota::weight(model, &a.profile).unwrap_or(total))
                    .sum();
                let gpu_free = (total - held).max(0.0);
                // Each GPU that takes no new work counted once, under its first cause.
                if g.cordoned {
                    held_back.cordoned += 1;
                } else if !ready {
                    held_back.node_not_ready += 1;
                } else if ctx.fleet.open.iter().any(|o| o.gpu_id == g.id) {
                    held_back.layout_pending += 1;
                } else {
                    usable.push((node, g));
                    free += gpu_free;
                    continue;
                }
                held_back.free_slices += gpu_free;
            }
        }
        if gpus == 0 {
            continue;
        }
        let fragmented = profile.is_some() && fragmented(free, needed);
        let make_room = match profile {
            Some(p) if fragmented => room_changes(ctx, model, &usable, p, count),
            _ => Vec::new(),
        };
        out.push(ModelRoom {
            model: model.key.clone(),
            free_slices: free,
            needed_slices: needed,
            fragmented,
            make_room,
            held_back,
        });
    }
    out
}

/// The GPUs of `model` (those in `usable`) to lay out again, moving instances in use, so that `count` instances of
/// `profile` fit (`tessera_core::layout::fleet_room` decides); empty when moving cannot make room.
fn room_changes(
    ctx: &Context,
    model: &GpuModel,
    usable: &[(&tessera_store::Node, &tessera_store::Gpu)],
    profile: &str,
    count: u32,
) -> Vec<RoomChange> {
    use tessera_core::layout::{Inst, fleet_room, to_placed};
    let Some(p) = model.profile_index(profile) else { return Vec::new() };
    // Each GPU's instances in use, with the request each serves where the caller may see its tenant.
    let held: Vec<Vec<(Inst, Option<&str>)>> = usable
        .iter()
        .map(|(_, g)| {
            ctx.fleet
                .live
                .iter()
                .filter(|a| a.gpu_id == g.id)
                .filter_map(|a| {
                    let request = ctx.audience.sees(&a.tenant_id).then_some(a.request_id.as_str());
                    Some((Inst { profile: model.profile_index(&a.profile)?, start: a.start }, request))
                })
                .collect()
        })
        .collect();
    let gpus: Vec<Vec<Inst>> = held.iter().map(|h| h.iter().map(|(i, _)| *i).collect()).collect();
    let Some(answer) = fleet_room(model, &gpus, p, count) else { return Vec::new() };
    answer
        .into_iter()
        .map(|(i, relayout)| {
            let (node, gpu) = usable[i];
            let mut after = gpus[i].clone();
            for &(k, to) in &relayout.moves {
                after[k] = to;
            }
            after.extend(&relayout.new);
            after.sort_by_key(|x| x.start);
            RoomChange {
                gpu: gpu.id.clone(),
                index: gpu.index,
                node: node.name.clone(),
                moves: relayout
                    .moves
                    .iter()
                    .map(|&(k, to)| InstanceMove {
                        request: held[i][k].1.map(str::to_string),
                        profile: model.profiles[to.profile].name.clone(),
                        from: gpus[i][k].start,
                        to: to.start,
                    })
                    .collect(),
                fits: u32::try_from(relayout.new.len()).unwrap_or(u32::MAX),
                layout: after.into_iter().map(|x| to_placed(model, x)).collect(),
            }
        })
        .collect()
}

/// Whether two specs compete for the same slices: the same MIG profile on a model both may use, or whole GPUs of
/// the same model.
fn competes(state: &AppState, a: &SliceSpec, b: &SliceSpec) -> bool {
    let key = |m: &str| state.catalog.resolve(m).map(|(m, _)| m.key.clone());
    match (a, b) {
        (SliceSpec::Mig { profile: p, model: m }, SliceSpec::Mig { profile: q, model: n }) => {
            p == q && (m.is_none() || n.is_none() || m.as_deref().and_then(key) == n.as_deref().and_then(key))
        }
        (SliceSpec::Mig { .. }, _) | (_, SliceSpec::Mig { .. }) => false,
        _ => {
            let model = |s: &SliceSpec| match s {
                SliceSpec::Exclusive { model } | SliceSpec::Timeslice { model, .. } | SliceSpec::Mps { model, .. } => {
                    key(model)
                }
                SliceSpec::Mig { .. } => None,
            };
            model(a) == model(b)
        }
    }
}

/// 1 + the pending requests made before `r` that compete for the same slices.
async fn position(state: &AppState, ctx: &mut Context, r: &SliceRequest) -> Result<u32, ApiError> {
    let queue = ctx.queue(state).await?;
    let ahead = queue
        .iter()
        .filter(|x| x.state == RequestState::Pending && x.id != r.id)
        .filter(|x| (x.created_at_ms, &x.id) < (r.created_at_ms, &r.id))
        .filter(|x| competes(state, &x.spec, &r.spec))
        .count();
    Ok(u32::try_from(ahead + 1).unwrap_or(u32::MAX))
}

/// When `count` slices of `spec` could start: now when there is room; else the first known end (an expiry, or a
/// reclaim deadline) after which the planner finds room, releasing what ends in order; `None` when nothing known
/// frees enough.
fn start(state: &AppState, ctx: &Context, spec: &SliceSpec, count: u32, room: &Room) -> Option<i64> {
    if *room == Room::Placeable {
        return Some(ctx.now);
    }
    let mut ends: Vec<(i64, &str)> = ctx
        .placed
        .iter()
        .filter_map(|x| x.reclaim_at_ms.or(x.expires_at_ms).map(|at| (at, x.id.as_str())))
        .filter(|(_, id)| ctx.fleet.live.iter().any(|a| a.request_id == *id))
        .collect();
    ends.sort();
    let times: Vec<i64> = ends.iter().map(|(at, _)| *at).collect();
    earliest_start(ctx.now, &times, |k| {
        let gone: Vec<&str> = ends[..k].iter().map(|(_, id)| *id).collect();
        let fleet = FleetNow {
            nodes: ctx.fleet.nodes.clone(),
            live: ctx.fleet.live.iter().filter(|a| !gone.contains(&a.request_id.as_str())).cloned().collect(),
            open: ctx.fleet.open.clone(),
        };
        placement(state, &fleet, spec, count).is_ok()
    })
}

/// Why each waiting request of `tenant` (or every tenant) waits, oldest first, at most [`MAX_EXPLAINED`], as told
/// to `p`.
pub async fn waiting(
    state: &AppState,
    p: &Principal,
    tenant: Option<&str>,
) -> Result<Vec<(SliceRequest, Waiting)>, ApiError> {
    waiting_as(state, Audience::of(p), tenant, Detail::Full).await
}

async fn waiting_as(
    state: &AppState,
    audience: Audience,
    tenant: Option<&str>,
    detail: Detail,
) -> Result<Vec<(SliceRequest, Waiting)>, ApiError> {
    // The queue first, then the rest: a request approved in between is in both readings and is kept as placed,
    // never in neither.
    let queue = read_queue(state).await?;
    let mut ctx = Context::read_for(state, audience).await?;
    ctx.queue = Some(queue.clone());
    let placed: Vec<&SliceRequest> = ctx
        .placed
        .iter()
        .filter(|r| tenant.is_none_or(|t| r.tenant_id == t))
        .filter(|r| matches!(r.state, RequestState::Approved | RequestState::Provisioning))
        .collect();
    let moved: std::collections::HashSet<&str> = ctx.placed.iter().map(|r| r.id.as_str()).collect();
    let mut requests: Vec<SliceRequest> = queue
        .iter()
        .filter(|r| tenant.is_none_or(|t| r.tenant_id == t) && !moved.contains(r.id.as_str()))
        .cloned()
        .collect();
    requests.extend(placed.into_iter().cloned());
    requests.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
    requests.truncate(MAX_EXPLAINED);
    let mut out = Vec::with_capacity(requests.len());
    for r in requests {
        if let Some(w) = explain_as(state, &mut ctx, &r, detail).await? {
            out.push((r, w));
        }
    }
    Ok(out)
}

/// How many waiting requests wait for each reason (every code, 0 included), for `tessera_pending_requests`.
pub async fn counts(state: &AppState) -> Result<Vec<(&'static str, usize)>, ApiError> {
    // Only the codes are counted: no id leaves the server.
    let all = waiting_as(state, Audience::All, None, Detail::Reason).await?;
    Ok(WaitReason::CODES.iter().map(|c| (*c, all.iter().filter(|(_, w)| w.reason.code() == *c).count())).collect())
}
