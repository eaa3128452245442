//! Cohorts: creating them, putting tenants in them, what each member guarantees, holds, borrows and lends, and
//! rebalancing (marking borrowed requests, telling holders what a lender needs back, releasing it after the grace
//! period, then placing the lenders' waiting requests their policy approves).

use crate::auth::Permissions;
use std::collections::BTreeMap;

use tessera_api::cohorts::{CohortLine, CohortMember, CohortView};
use tessera_core::cohort::{DEFAULT_GRACE_S, MAX_GRACE_S, MAX_WEIGHT, Member, deficits};
use tessera_core::quota::{Decision, MILLI, Milli};
use tessera_core::request::RequestState;

use crate::app::AppState;
use crate::error::ApiError;
use tessera_store::cohorts::{Cohort, Rebalanced};
use tessera_store::{Principal, Tenant};

fn valid_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
}

fn check_grace(grace_s: u32) -> Result<u32, ApiError> {
    if grace_s > MAX_GRACE_S {
        return Err(ApiError::invalid("invalid_grace", format!("grace_s is at most {MAX_GRACE_S} (7 days)")));
    }
    Ok(grace_s)
}

/// Creates a cohort (platform admins).
pub async fn create(state: &AppState, p: &Principal, name: &str, grace_s: Option<u32>) -> Result<CohortView, ApiError> {
    p.require_platform_admin()?;
    if !valid_name(name) {
        return Err(ApiError::invalid("invalid_name", "a cohort name is 1-63 characters of a-z, 0-9 and -"));
    }
    let grace_s = check_grace(grace_s.unwrap_or(DEFAULT_GRACE_S))?;
    let c = state.store.create_cohort(name, grace_s, &p.actor()).await?;
    view(state, c).await
}

/// Every cohort with its members (platform admins: members' holdings are other tenants' business).
pub async fn list(state: &AppState, p: &Principal) -> Result<Vec<CohortView>, ApiError> {
    p.require_platform_admin()?;
    let mut out = Vec::new();
    for c in state.store.cohorts().await? {
        out.push(view(state, c).await?);
    }
    Ok(out)
}

/// A cohort by id or name (platform admins).
pub async fn get(state: &AppState, p: &Principal, key: &str) -> Result<CohortView, ApiError> {
    p.require_platform_admin()?;
    let c = find(state, key).await?;
    view(state, c).await
}

async fn find(state: &AppState, key: &str) -> Result<Cohort, ApiError> {
    state
        .store
        .cohorts()
        .await?
        .into_iter()
        .find(|c| c.id == key || c.name == key)
        .ok_or_else(|| ApiError::NotFound(format!("cohort {key} not found")))
}

/// Changes a cohort's grace period (platform admins).
pub async fn set_grace(state: &AppState, p: &Principal, key: &str, grace_s: u32) -> Result<CohortView, ApiError> {
    p.require_platform_admin()?;
    let grace_s = check_grace(grace_s)?;
    let c = find(state, key).await?;
    let c = state.store.set_cohort_grace(&c.id, grace_s, &p.actor()).await?;
    view(state, c).await
}

/// Puts a tenant in a cohort, or takes it out (platform admins), then rebalances the cohorts it left and joined.
pub async fn set_membership(
    state: &AppState,
    p: &Principal,
    tenant: &str,
    cohort: Option<&str>,
    weight: Option<u32>,
) -> Result<Tenant, ApiError> {
    p.require_platform_admin()?;
    let before = crate::lookup::tenant(state, p, tenant).await?;
    let weight = weight.unwrap_or(before.weight);
    if !(1..=MAX_WEIGHT).contains(&weight) {
        return Err(ApiError::invalid("invalid_weight", format!("weight is between 1 and {MAX_WEIGHT}")));
    }
    let cohort = match cohort {
        Some(key) => Some(find(state, key).await?.id),
        None => None,
    };
    let after = state.store.set_cohort(&before.id, cohort.as_deref(), weight, &p.actor()).await?;
    for c in [before.cohort_id.as_deref(), after.cohort_id.as_deref()].into_iter().flatten() {
        rebalance(state, c, None).await?;
    }
    if before.cohort_id.is_some() && after.cohort_id.is_none() {
        // Out of every cohort: nothing of its is borrowed any more.
        clear_marks(state, &after.id).await?;
    }
    Ok(after)
}

async fn clear_marks(state: &AppState, tenant: &str) -> Result<(), ApiError> {
    // A tenant outside a cohort cannot hold more than its guarantee, so its flags only need resetting; the next
    // admission or sweep never sets them again.
    state.store.clear_borrowed(tenant).await?;
    Ok(())
}

/// Rebalances one cohort now and acts on the outcome: agents of GPUs whose slices were released get their new
/// spec, and waiting requests of the cohort's members that their policy approves are placed.
pub async fn rebalance(state: &AppState, cohort: &str, cause: Option<&str>) -> Result<Rebalanced, ApiError> {
    let for_room = match room_picks(state, cohort).await {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(cohort, error = %e, "choosing what to reclaim for room failed");
            Vec::new()
        }
    };
    let done = state.store.rebalance(cohort, tessera_store::now_ms(), cause, &for_room).await?;
    after_rebalance(state, cohort, &done).await;
    Ok(done)
}

/// Most waiting requests a rebalance makes room for (oldest first).
pub const ROOM_TRIES: usize = 4;

/// Borrowed requests to reclaim so that waiting requests within their guarantee can be placed: the quota admits
/// them, but the planner finds no room (the free slices are scattered). For each pending MIG request of the
/// cohort's members that is not borrowed and that its tenant's policy approves, oldest first (at most
/// [`ROOM_TRIES`]), which the planner cannot place now: `tessera_core::cohort::choose_for_placement` over the
/// cohort's borrowed requests holding instances, asking the planner whether the request fits once theirs are freed.
/// Returns `(request to reclaim, tenant it makes room for)`.
async fn room_picks(state: &AppState, cohort: &str) -> Result<Vec<(String, String)>, ApiError> {
    use tessera_core::cohort::{Candidate, choose_for_placement};
    use tessera_core::planner::{DemandInput, plan};
    use tessera_core::request::SliceSpec;
    let tenants: Vec<Tenant> =
        state.store.tenants().await?.into_iter().filter(|t| t.cohort_id.as_deref() == Some(cohort)).collect();
    let ids: Vec<&str> = tenants.iter().map(|t| t.id.as_str()).collect();
    let requests: Vec<_> =
        state.store.live_requests().await?.into_iter().filter(|r| ids.contains(&r.tenant_id.as_str())).collect();
    let waiting: Vec<_> = requests
        .iter()
        .filter(|r| r.state == RequestState::Pending && !r.borrowed && matches!(r.spec, SliceSpec::Mig { .. }))
        .filter(|r| {
            let t = tenants.iter().find(|t| t.id == r.tenant_id);
            let charge = tessera_core::quota::charge(state.catalog, &r.spec, r.count).unwrap_or_default();
            t.is_some_and(|t| t.policy.decide(&charge) == Decision::AutoApprove)
        })
        .take(ROOM_TRIES)
        .collect();
    if waiting.is_empty() {
        return Ok(Vec::new());
    }
    let nodes = state.store.nodes().await?;
    let live = state.store.live_allocations().await?;
    let open = state.store.proposals(Some("proposed")).await?;
    let mut members = Vec::new();
    for t in &tenants {
        members.push(member(state, t).await?);
    }
    // Borrowed requests that hold instances: what reclaim can free.
    let candidates: Vec<Candidate> = requests
        .iter()
        .filter(|r| r.borrowed && live.iter().any(|a| a.request_id == r.id))
        .filter_map(|r| {
            Some(Candidate {
                id: r.id.clone(),
                member: members.iter().position(|m| m.tenant == r.tenant_id)?,
                priority: r.priority,
                created_at_ms: r.created_at_ms,
                running: matches!(r.state, RequestState::Active | RequestState::Provisioning),
                charge: tessera_core::quota::charge(state.catalog, &r.spec, r.count).unwrap_or_default(),
                reclaim_at_ms: r.reclaim_at_ms,
            })
        })
        .collect();
    let mut picks: Vec<(String, String)> = Vec::new();
    for w in waiting {
        let SliceSpec::Mig { profile, model } = &w.spec else { continue };
        let demand = DemandInput { profile: profile.clone(), count: w.count, model: model.clone() };
        let fits = |freed: &[usize]| {
            let gone: Vec<&str> = freed.iter().map(|&i| candidates[i].id.as_str()).collect();
            let kept: Vec<tessera_store::Allocation> =
                live.iter().filter(|a| !gone.contains(&a.request_id.as_str())).cloned().collect();
            let input = super::fleet::planner_input(&nodes, &kept, &open, demand.clone(), |_, g| g.id.clone());
            plan(state.catalog, &input).is_ok_and(|p| p.unplaced.is_empty())
        };
        if fits(&[]) {
            continue;
        }
        if let Some(chosen) = choose_for_placement(&members, &candidates, fits) {
            for i in chosen {
                if !picks.iter().any(|(id, _)| *id == candidates[i].id) {
                    picks.push((candidates[i].id.clone(), w.tenant_id.clone()));
                }
            }
        }
    }
    Ok(picks)
}

async fn after_rebalance(state: &AppState, cohort: &str, done: &Rebalanced) {
    if !done.told.is_empty() {
        tracing::info!(cohort, told = done.told.len(), "borrowed requests to be reclaimed");
    }
    if done.released.is_empty() {
        return;
    }
    tracing::info!(cohort, released = done.released.len(), "borrowed requests reclaimed");
    crate::agents::refresh_gpus(state, &done.gpus).await;
    if let Err(e) = place_waiting(state, cohort).await {
        tracing::warn!(cohort, error = %e, "placing waiting requests after a reclaim failed");
    }
}

/// Approves, oldest first, the pending requests of the cohort's members that their policy approves, now that
/// capacity came back.
async fn place_waiting(state: &AppState, cohort: &str) -> Result<(), ApiError> {
    let members: Vec<String> = state
        .store
        .tenants()
        .await?
        .into_iter()
        .filter(|t| t.cohort_id.as_deref() == Some(cohort))
        .map(|t| t.id)
        .collect();
    crate::approvals::place_queued(state, Some(&members)).await?;
    Ok(())
}

/// Rebalances every cohort (the server's sweep).
pub async fn sweep(state: &AppState) -> Result<usize, ApiError> {
    let mut released = 0;
    for c in state.store.cohorts().await? {
        released += rebalance(state, &c.id, None).await?.released.len();
    }
    Ok(released)
}

fn units(m: Milli) -> f64 {
    m as f64 / MILLI as f64
}

/// A tenant as its cohort sees it.
pub async fn member(state: &AppState, t: &Tenant) -> Result<Member, ApiError> {
    let (maximum, lending) = state.store.bounds(&t.id).await?;
    Ok(Member {
        tenant: t.id.clone(),
        guaranteed: state.store.quotas(&t.id).await?,
        maximum,
        lending,
        held: state.store.held(&t.id).await?,
        weight: t.weight,
    })
}

/// A cohort's members, by name.
pub async fn members(state: &AppState, cohort: &str) -> Result<Vec<Member>, ApiError> {
    let mut out = Vec::new();
    for t in state.store.tenants().await?.iter().filter(|t| t.cohort_id.as_deref() == Some(cohort)) {
        out.push(member(state, t).await?);
    }
    Ok(out)
}

async fn view(state: &AppState, c: Cohort) -> Result<CohortView, ApiError> {
    let tenants = state.store.tenants().await?;
    let mut members = Vec::new();
    let mut lines = Vec::new();
    for id in &c.members {
        let Some(t) = tenants.iter().find(|t| &t.id == id) else { continue };
        members.push(member(state, t).await?);
        lines.push(t.name.clone());
    }
    let deficits: BTreeMap<String, f64> =
        deficits(&members).into_iter().map(|(r, m)| (r.to_string(), units(m))).collect();
    let members = members
        .iter()
        .zip(lines)
        .map(|(m, name)| CohortMember {
            tenant: m.tenant.clone(),
            name,
            weight: m.weight,
            resources: m
                .guaranteed
                .iter()
                .map(|(r, g)| CohortLine {
                    resource: r.to_string(),
                    guaranteed: units(*g),
                    maximum: units(m.ceiling(r, true).unwrap_or(*g)),
                    held: units(m.held.get(r).copied().unwrap_or(0)),
                    borrowed: units(m.borrowed(r)),
                    lendable: units(m.lendable(r)),
                })
                .collect(),
        })
        .collect();
    Ok(CohortView { id: c.id, name: c.name, grace_s: c.grace_s, created_at_ms: c.created_at_ms, members, deficits })
}
