//! Approving a request: the planner chooses exact instances on the fleet as it is (instances with a live
//! allocation are in use and never destroyed; GPUs with an undecided layout proposal take no new instances), and the
//! store commits the approval, the reservations and the layout changes in one transaction. Layout changes wait for
//! an admin unless the GPU has auto-layout. If the fleet changed between planning and committing, nothing is written
//! and the caller is told to approve again.

use crate::auth::Permissions;
use tessera_core::request::RequestState;

use crate::app::AppState;
use crate::calendar::CalendarRead;
use crate::error::ApiError;
use crate::placement::{FleetNow, placement, placement_on};
use tessera_core::quota::{Decision, charge};
use tessera_store::reservations::AUTO_APPROVER;
use tessera_store::{
    Guard, LayoutChange, LayoutProposal, Principal, Reservation, SliceRequest, StoreError, Transition,
};

/// What an approval did.
#[derive(Debug, Clone)]
pub struct Approval {
    /// The request, now approved.
    pub request: SliceRequest,
    /// The instances reserved for it.
    pub reservations: Vec<Reservation>,
    /// The layout changes it needs (approved already on auto-layout GPUs).
    pub proposals: Vec<LayoutProposal>,
}

const STALE: [&str; 3] = ["gpu_layout_version", "layout_proposals_open", "allocations_live_instance"];

/// Approves a pending request (platform admins), placing MIG slices through the planner.
pub async fn approve(state: &AppState, p: &Principal, id: &str, if_match: Option<i64>) -> Result<Approval, ApiError> {
    // Not visible: 404, as for every other action; visible but not an admin: 403.
    let request = super::lookup::get(state, p, id).await?;
    p.require_platform_admin()?;
    approve_as(state, &p.actor(), request, if_match).await
}

/// Approves `request` on behalf of `actor` (an admin, or `system:auto-approve` for the tenant's policy).
pub async fn approve_as(
    state: &AppState,
    actor: &str,
    request: SliceRequest,
    if_match: Option<i64>,
) -> Result<Approval, ApiError> {
    approve_on(state, actor, request, if_match, &[]).await
}

/// [`approve_as`], placing the slices on `kept` where they can all go there now ([`placement_on`]), else where the
/// planner says.
pub async fn approve_on(
    state: &AppState,
    actor: &str,
    request: SliceRequest,
    if_match: Option<i64>,
    kept: &[tessera_core::reservation::Hold],
) -> Result<Approval, ApiError> {
    let id = request.id.as_str();
    let t = Transition { id, expected_version: if_match, to: RequestState::Approved, reason: None, actor };
    // Fail fast, before planning, when the request is not pending.
    request.state.transition(RequestState::Approved).map_err(StoreError::from)?;
    let mut tries = 0;
    loop {
        // The calendar is read before the fleet: a reservation accepted after this reading fails the commit.
        let calendar = CalendarRead::read(state).await?;
        let fleet = FleetNow::read(state).await?;
        let (changes, reservations) = match placement_on(state, &fleet, &request.spec, request.count, kept) {
            Some(on_kept) => on_kept,
            None => placement(state, &fleet, &request.spec, request.count)?,
        };
        let guard = calendar.guard(state, &fleet, &request, &reservations).await?;
        match commit(state, t, &changes, reservations, guard).await {
            // A reservation was accepted meanwhile: place again against it.
            Err(ApiError::Conflict { code: "reservation_calendar", .. }) if tries < 3 => tries += 1,
            Err(ApiError::Conflict { code: "reservation_calendar", .. }) => return Err(stale()),
            other => return other,
        }
    }
}

fn stale() -> ApiError {
    ApiError::Conflict {
        code: "plan_stale",
        detail: "the fleet changed while the placement was planned; approve again".to_string(),
        errors: vec![],
    }
}

async fn commit(
    state: &AppState,
    t: Transition<'_>,
    changes: &[LayoutChange],
    reservations: Vec<Reservation>,
    guard: Guard,
) -> Result<Approval, ApiError> {
    // The approval's writes (its commit and the nodes' spec bumps) go before the fleet's bulk writes on SQLite
    // (see [`tessera_store::turns`]).
    let _turn = state.store.interactive();
    match state.store.approve_request(t, changes, &reservations, guard).await {
        Ok((request, proposals)) => {
            let gpus: Vec<String> =
                reservations.iter().map(|r| r.gpu_id.clone()).chain(changes.iter().map(|c| c.gpu_id.clone())).collect();
            crate::agents::refresh_gpus(state, &gpus).await;
            Ok(Approval { request, reservations, proposals })
        }
        Err(StoreError::Conflict { constraint }) if STALE.contains(&constraint.as_str()) => Err(stale()),
        Err(StoreError::Conflict { constraint }) if constraint == "reservation_calendar" => {
            Err(ApiError::Conflict { code: "reservation_calendar", detail: String::new(), errors: vec![] })
        }
        Err(e) => Err(e.into()),
    }
}

/// Approves or rejects a layout proposal (platform admins); rejecting needs a reason.
pub async fn decide_layout(
    state: &AppState,
    p: &Principal,
    id: &str,
    approve: bool,
    reason: &str,
) -> Result<LayoutProposal, ApiError> {
    p.require_platform_admin()?;
    if !approve && reason.trim().is_empty() {
        return Err(ApiError::invalid("reason_required", "rejecting a layout needs a reason"));
    }
    tessera_core::text::check_reason(reason.trim()).map_err(|e| ApiError::invalid("invalid_reason", e.to_string()))?;
    match state.store.decide_proposal(id, approve, reason.trim(), &p.actor()).await {
        Ok(proposal) => {
            crate::agents::refresh_gpus(state, std::slice::from_ref(&proposal.gpu_id)).await;
            Ok(proposal)
        }
        Err(StoreError::Conflict { constraint }) => {
            let (code, detail) = match constraint.as_str() {
                "gpu_layout_version" => ("layout_stale", "the GPU's layout changed since this proposal was planned"),
                "instance_in_use" => ("instance_in_use", "the proposal would destroy an instance that is in use"),
                _ => ("proposal_decided", "the proposal has already been decided"),
            };
            Err(ApiError::Conflict { code, detail: detail.to_string(), errors: vec![] })
        }
        Err(e) => Err(e.into()),
    }
}

/// Proposes a hand-edited layout for a GPU (platform admins): checked by the core's MIG rules, refused if it would
/// destroy an instance in use, and then waiting for approval like a planned change.
pub async fn propose_layout(
    state: &AppState,
    p: &Principal,
    gpu_id: &str,
    instances: &[tessera_core::layout::InstanceSpec],
) -> Result<LayoutProposal, ApiError> {
    p.require_platform_admin()?;
    let nodes = state.store.nodes().await?;
    let gpu = nodes
        .iter()
        .flat_map(|n| n.gpus.iter())
        .find(|g| g.id == gpu_id)
        .ok_or_else(|| ApiError::NotFound(format!("gpu {gpu_id} not found")))?;
    if !gpu.mig_enabled {
        return Err(ApiError::invalid("mig_disabled", "the GPU is not in MIG mode"));
    }
    let model = state
        .catalog
        .model(&gpu.model)
        .ok_or_else(|| ApiError::Internal(format!("gpu {gpu_id} has unknown model {}", gpu.model)))?;
    let layout = tessera_core::layout::validate(model, instances).map_err(|errors| {
        ApiError::invalid("mig_layout_invalid", errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))
    })?;
    let live = state.store.live_allocations().await?;
    if let Some(busy) =
        live.iter().find(|a| a.gpu_id == gpu.id && !layout.iter().any(|i| i.profile == a.profile && i.start == a.start))
    {
        let detail = format!(
            "{}@{} is in use (request {}); the new layout must keep it",
            busy.profile, busy.start, busy.request_id
        );
        return Err(ApiError::Conflict { code: "instance_in_use", detail, errors: vec![] });
    }
    let created: Vec<_> = layout.iter().filter(|i| !gpu.layout.contains(i)).cloned().collect();
    let destroyed: Vec<_> = gpu.layout.iter().filter(|i| !layout.contains(i)).cloned().collect();
    if created.is_empty() && destroyed.is_empty() {
        return Err(ApiError::invalid("layout_unchanged", "the layout is the GPU's current layout"));
    }
    let change = LayoutChange {
        gpu_id: gpu.id.clone(),
        base_version: gpu.layout_version,
        layout,
        created,
        destroyed,
        auto_apply: false,
    };
    match state.store.propose_layout(&change, &p.actor()).await {
        Ok(proposal) => Ok(proposal),
        Err(StoreError::Conflict { constraint }) if constraint == "layout_proposals_open" => Err(ApiError::Conflict {
            code: "layout_proposal_open",
            detail: "the GPU already has a layout proposal waiting; approve or reject it first".to_string(),
            errors: vec![],
        }),
        Err(StoreError::Conflict { .. }) => Err(ApiError::Conflict {
            code: "layout_stale",
            detail: "the GPU's layout changed meanwhile; edit it again".to_string(),
            errors: vec![],
        }),
        Err(e) => Err(e.into()),
    }
}

/// Layout proposals, newest first, optionally only in one state (platform admins).
pub async fn layouts(state: &AppState, p: &Principal, only: Option<&str>) -> Result<Vec<LayoutProposal>, ApiError> {
    p.require_platform_admin()?;
    if let Some(s) = only
        && !["proposed", "approved", "rejected"].contains(&s)
    {
        return Err(ApiError::invalid("invalid_state", "state is proposed, approved or rejected"));
    }
    Ok(state.store.proposals(only).await?)
}

/// [`layouts`] as views, each open one with the requests it unblocks.
pub async fn layout_views(
    state: &AppState,
    p: &Principal,
    only: Option<&str>,
) -> Result<Vec<tessera_api::layouts::LayoutView>, ApiError> {
    let proposals = layouts(state, p, only).await?;
    let needs =
        if proposals.iter().any(|l| l.state == "proposed") { state.store.proposal_needs().await? } else { vec![] };
    Ok(proposals
        .into_iter()
        .map(|l| {
            let needed_by = needs
                .iter()
                .filter(|n| n.proposal_id == l.id)
                .filter_map(|n| {
                    Some(tessera_api::layouts::LayoutNeed {
                        request: n.request_id.clone(),
                        tenant: n.tenant_id.clone(),
                        tenant_name: n.tenant_name.clone(),
                        spec: serde_json::from_str(&n.spec).ok()?,
                        count: u32::try_from(n.count).ok()?,
                        slices: u32::try_from(n.slices).ok()?,
                    })
                })
                .collect();
            tessera_api::layouts::LayoutView { needed_by, ..l.into() }
        })
        .collect())
}

/// One layout proposal (platform admins).
pub async fn layout(state: &AppState, p: &Principal, id: &str) -> Result<LayoutProposal, ApiError> {
    p.require_platform_admin()?;
    let found = state.store.proposals(None).await?.into_iter().find(|l| l.id == id);
    found.ok_or_else(|| ApiError::NotFound(format!("layout proposal {id} not found")))
}

/// Turns auto-layout on or off for a GPU (platform admins).
pub async fn set_auto_layout(
    state: &AppState,
    p: &Principal,
    gpu_id: &str,
    enabled: bool,
) -> Result<tessera_store::Gpu, ApiError> {
    p.require_platform_admin()?;
    Ok(state.store.set_auto_layout(gpu_id, enabled, &p.actor()).await?)
}

/// Most queued requests one sweep tries to place.
pub const QUEUED_PER_SWEEP: usize = 50;

/// Places pending requests that their tenant's policy approves on its own and that found no room when they were
/// made (`queued` once room appears), oldest first, at most [`QUEUED_PER_SWEEP`]; only `tenants`' when given.
/// Returns how many were placed. The server's sweep runs it, and a cohort after a reclaim.
pub async fn place_queued(state: &AppState, tenants: Option<&[String]>) -> Result<usize, ApiError> {
    let all = state.store.tenants().await?;
    let mut waiting: Vec<SliceRequest> = state
        .store
        .live_requests()
        .await?
        .into_iter()
        .filter(|r| r.state == RequestState::Pending)
        .filter(|r| tenants.is_none_or(|ts| ts.contains(&r.tenant_id)))
        .filter(|r| {
            let Some(t) = all.iter().find(|t| t.id == r.tenant_id) else { return false };
            charge(state.catalog, &r.spec, r.count).is_ok_and(|c| t.policy.decide(&c) == Decision::AutoApprove)
        })
        .collect();
    waiting.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
    let mut placed = 0;
    for r in waiting.into_iter().take(QUEUED_PER_SWEEP) {
        match approve_as(state, AUTO_APPROVER, r.clone(), Some(r.version)).await {
            Ok(_) => placed += 1,
            Err(e) => tracing::debug!(request = %r.id, error = %e, "a queued request still finds no room"),
        }
    }
    Ok(placed)
}
