//! Where slices go: the fleet as the planner sees it ([`FleetNow`]) and the one placement that approvals, previews,
//! reservations and wait reasons all use ([`placement`], [`placement_on`]). Reads and decisions only: committing a
//! placement is the approvals' job.

use tessera_core::planner::{DemandInput, plan};
use tessera_core::request::SliceSpec;
use tessera_core::sharing::{GpuSharing, Sharing, validate_node};

use crate::app::AppState;
use crate::error::ApiError;
use tessera_store::{LayoutChange, LayoutProposal, Reservation};

/// The fleet as the planner sees it: nodes, live allocations and undecided layout proposals, read together.
#[derive(Debug, Clone)]
pub struct FleetNow {
    /// Nodes with their GPUs.
    pub nodes: Vec<tessera_store::Node>,
    /// Reserved and active allocations.
    pub live: Vec<tessera_store::Allocation>,
    /// Layout proposals waiting for an admin.
    pub open: Vec<LayoutProposal>,
}

impl FleetNow {
    /// Reads the fleet now.
    pub async fn read(state: &AppState) -> Result<FleetNow, ApiError> {
        let (nodes, live, open) = tokio::try_join!(
            state.store.nodes(),
            state.store.live_allocations(),
            state.store.proposals(Some("proposed"))
        )?;
        Ok(FleetNow { nodes, live, open })
    }
}

/// Where `count` slices of `spec` go on `fleet`: exact instances (and the layout changes they need) for MIG, shares
/// of whole GPUs otherwise. The one placement approvals, previews and wait reasons use. `409 no_capacity` when the
/// fleet cannot take them.
pub fn placement(
    state: &AppState,
    fleet: &FleetNow,
    spec: &SliceSpec,
    count: u32,
) -> Result<(Vec<LayoutChange>, Vec<Reservation>), ApiError> {
    let SliceSpec::Mig { profile, model } = spec else {
        return Ok((Vec::new(), place_whole(state, spec, count, &fleet.nodes, &fleet.live)?));
    };
    let gpus: Vec<_> = fleet.nodes.iter().flat_map(|n| n.gpus.iter()).filter(|g| g.mig_enabled).collect();
    let demand = DemandInput { profile: profile.clone(), count, model: model.clone() };
    let input = super::fleet::planner_input(&fleet.nodes, &fleet.live, &fleet.open, demand, |_, g| g.id.clone());
    let planned = plan(state.catalog, &input).map_err(|e| ApiError::invalid(e.code(), e.to_string()))?;
    if !planned.unplaced.is_empty() {
        let detail = planned.unplaced.iter().map(|u| u.reason.clone()).collect::<Vec<_>>().join("; ");
        return Err(ApiError::Conflict { code: "no_capacity", detail, errors: vec![] });
    }
    let changes: Vec<LayoutChange> = planned
        .changed_gpus
        .iter()
        .filter_map(|c| {
            let g = gpus.iter().find(|g| g.id == c.gpu)?;
            Some(LayoutChange {
                gpu_id: g.id.clone(),
                base_version: g.layout_version,
                layout: c.layout.clone(),
                created: c.created.clone(),
                destroyed: c.destroyed.clone(),
                auto_apply: g.auto_layout,
            })
        })
        .collect();
    let reservations: Vec<Reservation> = planned
        .placed
        .iter()
        .map(|s| Reservation {
            gpu_id: s.gpu.clone(),
            profile: s.profile.clone(),
            start: s.start,
            change: if s.new { changes.iter().position(|c| c.gpu_id == s.gpu) } else { None },
        })
        .collect();
    Ok((changes, reservations))
}

/// Where `count` slices of `spec` go when they go exactly on `kept` (a reservation's slices, kept by the calendar's
/// simulations): for MIG, the layout changes that create those instances, destroying only free instances in the
/// way; for whole-GPU shares, the shares themselves ([`shares_on`]). `None` when they cannot all go there now (a GPU
/// gone, cordoned or with an open proposal, an instance or share in use in the way, another profile or count); the
/// planner then places them as any approval.
pub fn placement_on(
    state: &AppState,
    fleet: &FleetNow,
    spec: &SliceSpec,
    count: u32,
    kept: &[tessera_core::reservation::Hold],
) -> Option<(Vec<LayoutChange>, Vec<Reservation>)> {
    use tessera_core::layout::{Inst, solve_at, to_placed};
    let SliceSpec::Mig { profile, model: wanted } = spec else {
        return shares_on(state, fleet, spec, count, kept).map(|r| (vec![], r));
    };
    if kept.is_empty() || u32::try_from(kept.len()).ok()? != count || kept.iter().any(|h| h.profile != *profile) {
        return None;
    }
    let mut gpus: Vec<&str> = kept.iter().map(|h| h.gpu.as_str()).collect();
    gpus.sort_unstable();
    gpus.dedup();
    let (mut changes, mut reservations) = (Vec::new(), Vec::new());
    for gpu_id in gpus {
        let g = fleet.nodes.iter().flat_map(|n| n.gpus.iter()).find(|g| g.id == gpu_id)?;
        let model = state.catalog.model(&g.model)?;
        let wanted_ok =
            wanted.as_deref().is_none_or(|w| state.catalog.resolve(w).is_some_and(|(m, _)| m.key == model.key));
        if !g.mig_enabled || g.cordoned || !wanted_ok || fleet.open.iter().any(|o| o.gpu_id == g.id) {
            return None;
        }
        let inst = |p: &str, start: u8| Some(Inst { profile: model.profile_index(p)?, start });
        let live: Vec<&tessera_store::Allocation> = held_on(&fleet.live, &g.id).collect();
        let fixed: Vec<Inst> = live.iter().map(|a| inst(&a.profile, a.start)).collect::<Option<_>>()?;
        let optional: Vec<Inst> = g
            .layout
            .iter()
            .filter(|i| !live.iter().any(|a| a.start == i.start))
            .map(|i| inst(&i.profile, i.start))
            .collect::<Option<_>>()?;
        let new: Vec<Inst> =
            kept.iter().filter(|h| h.gpu == g.id).map(|h| inst(&h.profile, h.start)).collect::<Option<_>>()?;
        let sol = solve_at(model, &fixed, &optional, &new)?;
        let change = (sol.created() > 0 || !sol.destroyed.is_empty()).then(|| {
            let applied = sol.apply(&fixed, &optional);
            let placed = |v: Vec<Inst>| v.into_iter().map(|i| to_placed(model, i)).collect();
            changes.push(LayoutChange {
                gpu_id: g.id.clone(),
                base_version: g.layout_version,
                layout: placed(applied.layout),
                created: placed(applied.created),
                destroyed: placed(applied.destroyed),
                auto_apply: g.auto_layout,
            });
            changes.len() - 1
        });
        for (i, r) in sol.new.iter().zip(&sol.reused) {
            reservations.push(Reservation {
                gpu_id: g.id.clone(),
                profile: model.profiles[i.profile].name.clone(),
                start: i.start,
                change: if r.is_none() { change } else { None },
            });
        }
    }
    Some((changes, reservations))
}

pub use tessera_core::reservation::share_of;

/// The live allocations on one GPU.
fn held_on<'a>(
    live: &'a [tessera_store::Allocation],
    gpu: &'a str,
) -> impl Iterator<Item = &'a tessera_store::Allocation> {
    live.iter().filter(move |a| a.gpu_id == gpu)
}

/// Whole-GPU shares of `spec` exactly on `kept`, when each is free now: on a GPU of the model, not in MIG mode and not
/// cordoned, whose live shares are all of the same sharing and none at that index, on a node that core's sharing rules
/// accept with those GPUs shared so (time-slicing and MPS never share a node). The calendar kept them where later
/// reservations leave them room; placing them anywhere else could take a node another reservation needs.
fn shares_on(
    state: &AppState,
    fleet: &FleetNow,
    spec: &SliceSpec,
    count: u32,
    kept: &[tessera_core::reservation::Hold],
) -> Option<Vec<Reservation>> {
    let (model, want, per_gpu) = share_of(spec)?;
    let key = want.key();
    let model = state.catalog.resolve(model).map(|(m, _)| m.key.clone())?;
    if kept.is_empty() || u32::try_from(kept.len()).ok()? != count {
        return None;
    }
    let mut out = Vec::new();
    for (k, h) in kept.iter().enumerate() {
        let taken_twice = kept[..k].iter().any(|x| x.gpu == h.gpu && x.start == h.start);
        if h.profile != key || u32::from(h.start) >= per_gpu || taken_twice {
            return None;
        }
        let node = fleet.nodes.iter().find(|n| n.gpus.iter().any(|g| g.id == h.gpu))?;
        let g = node.gpus.iter().find(|g| g.id == h.gpu)?;
        if g.model != model || g.mig_enabled || g.cordoned {
            return None;
        }
        if held_on(&fleet.live, &g.id).any(|a| a.profile != key || a.start == h.start) {
            return None;
        }
        let trial: Vec<(&str, GpuSharing)> = node
            .gpus
            .iter()
            .filter(|x| !x.mig_enabled)
            .map(|x| {
                let gpu = if kept.iter().any(|y| y.gpu == x.id) {
                    want
                } else {
                    held_on(&fleet.live, &x.id)
                        .find_map(|a| Sharing::from_key(&a.profile))
                        .unwrap_or(Sharing::Exclusive)
                };
                (x.id.as_str(), GpuSharing { mig_enabled: false, gpu, instances: vec![] })
            })
            .collect();
        validate_node(trial.iter().map(|(id, s)| (*id, s))).ok()?;
        out.push(Reservation { gpu_id: g.id.clone(), profile: key.clone(), start: h.start, change: None });
    }
    Some(out)
}

/// Places whole-GPU slices on GPUs of the model that are not in MIG mode and not cordoned, shared the same way (or
/// not yet shared), filling GPUs already shared this way before starting new ones. A GPU qualifies only if the
/// core's sharing rules accept its node with the new sharing (time-slicing and MPS never share a node).
fn place_whole(
    state: &AppState,
    spec: &SliceSpec,
    count: u32,
    nodes: &[tessera_store::Node],
    live: &[tessera_store::Allocation],
) -> Result<Vec<Reservation>, ApiError> {
    let Some((model, want, per_gpu)) = share_of(spec) else { return Ok(vec![]) };
    let profile = want.key();
    let key = state.catalog.resolve(model).map(|(m, _)| m.key.clone()).unwrap_or_else(|| model.to_string());
    let mut candidates = Vec::new();
    for node in nodes {
        // How each whole GPU of the node is shared now (an unshared GPU counts as exclusive).
        let now: Vec<(&str, GpuSharing)> = node
            .gpus
            .iter()
            .filter(|g| !g.mig_enabled)
            .map(|g| {
                let gpu =
                    held_on(live, &g.id).find_map(|a| Sharing::from_key(&a.profile)).unwrap_or(Sharing::Exclusive);
                (g.id.as_str(), GpuSharing { mig_enabled: false, gpu, instances: vec![] })
            })
            .collect();
        for g in node.gpus.iter().filter(|g| g.model == key && !g.mig_enabled && !g.cordoned) {
            let held: Vec<u8> = held_on(live, &g.id).map(|a| a.start).collect();
            if held_on(live, &g.id).any(|a| a.profile != profile) {
                continue;
            }
            let trial = now.iter().map(|(id, s)| {
                let s = if *id == g.id { GpuSharing { gpu: want, ..s.clone() } } else { s.clone() };
                (*id, s)
            });
            let trial: Vec<(&str, GpuSharing)> = trial.collect();
            if validate_node(trial.iter().map(|(id, s)| (*id, s))).is_err() {
                continue;
            }
            let free: Vec<u8> = (0..per_gpu.min(u32::from(u8::MAX)) as u8).filter(|s| !held.contains(s)).collect();
            if !free.is_empty() {
                // Partly used GPUs first (fewest free shares), then fresh ones: sharing packs, whole GPUs stay free.
                candidates.push((held.is_empty(), free.len(), g.id.clone(), free));
            }
        }
    }
    candidates.sort();
    let reservations: Vec<Reservation> = candidates
        .into_iter()
        .flat_map(|(_, _, gpu, free)| {
            let profile = profile.clone();
            free.into_iter().map(move |start| Reservation {
                gpu_id: gpu.clone(),
                profile: profile.clone(),
                start,
                change: None,
            })
        })
        .take(count as usize)
        .collect();
    if reservations.len() < count as usize {
        let detail = format!(
            "only {} of {} {profile} slices of {key} are free: the other GPUs of that model are in MIG mode, cordoned, \
             or shared another way",
            reservations.len(),
            count
        );
        return Err(ApiError::Conflict { code: "no_capacity", detail, errors: vec![] });
    }
    Ok(reservations)
}
