//! Fleet efficiency (`GET /api/v1/efficiency`, and the `tessera_compute_slices` gauge): MIG capacity by what it
//! can do now ([`tessera_core::efficiency`]), and what each tenant held and used over a look-back.

use std::collections::{BTreeMap, HashMap};

use tessera_core::GpuModel;
use tessera_core::defrag::{Readiness, defragment as lay_out_again, largest, readiness};
use tessera_core::efficiency::capacity;
use tessera_core::layout::{Inst, to_placed};
use tessera_core::request::SliceSpec;

use crate::app::AppState;
use crate::http::error::ApiError;
use crate::services::idle::{device_utilisation, lookback_start};
use crate::services::usage::{IdleRule, meter};
use crate::store::{LayoutChange, Node, Principal, SliceRequest, StoreError};
pub use tessera_api::efficiency::{EfficiencyReport, ModelCapacity, TenantEfficiency};
pub use tessera_api::layouts::{DefragFigures, DefragGpu, DefragQuery, DefragReport, DefragSkipped};

/// Idle below this mean utilisation (%) unless the caller says otherwise: the shipped alert's threshold.
pub const DEFAULT_EFFICIENCY_IDLE_BELOW: f64 = 20.0;
/// The look-back unless the caller says otherwise, hours.
pub const DEFAULT_EFFICIENCY_HOURS: f64 = 24.0;

/// MIG compute slices per model (by model key) and in total: allocated, placeable for the profiles the live requests
/// ask for (a model nobody asks for is judged for all its profiles, so idle capacity is not called stranded),
/// stranded, and free on cordoned GPUs.
pub async fn fleet_capacity(state: &AppState) -> Result<(Vec<ModelCapacity>, ModelCapacity), StoreError> {
    let nodes = state.store.nodes().await?;
    fleet_capacity_of(state, &nodes).await
}

/// [`fleet_capacity`] of `nodes` as already read.
pub async fn fleet_capacity_of(
    state: &AppState,
    nodes: &[Node],
) -> Result<(Vec<ModelCapacity>, ModelCapacity), StoreError> {
    let live = state.store.live_requests().await?;
    let allocations = state.store.live_allocations().await?;
    // The instances in use per GPU, and per model the profiles asked for, each worked out once.
    let mut in_use_on: HashMap<&str, Vec<(&str, u8)>> = HashMap::new();
    for a in &allocations {
        in_use_on.entry(a.gpu_id.as_str()).or_default().push((a.profile.as_str(), a.start));
    }
    let mut demanded_of: HashMap<String, Vec<usize>> = HashMap::new();
    let mut by_model: BTreeMap<String, ModelCapacity> = BTreeMap::new();
    let mut seen: HashMap<(String, Vec<Inst>, Vec<usize>), tessera_core::efficiency::Capacity> = HashMap::new();
    for g in nodes.iter().flat_map(|n| n.gpus.iter()).filter(|g| g.mig_enabled) {
        let Some((model, _)) = state.catalog.resolve(&g.model) else { continue };
        let demanded = demanded_of
            .entry(model.key.clone())
            .or_insert_with(|| {
                let d = demanded_profiles(state, &live, model);
                if d.is_empty() { (0..model.profiles.len()).collect() } else { d }
            })
            .clone();
        let mut in_use: Vec<Inst> = in_use_on
            .get(g.id.as_str())
            .map(|held| {
                held.iter()
                    .filter_map(|(p, start)| Some(Inst { profile: model.profile_index(p)?, start: *start }))
                    .collect()
            })
            .unwrap_or_default();
        in_use.sort_unstable();
        // GPUs alike (model, instances in use, profiles asked for) are judged once.
        let c =
            *seen.entry((model.key.clone(), in_use, demanded)).or_insert_with_key(|(_, i, d)| capacity(model, i, d));
        let row = by_model
            .entry(model.key.clone())
            .or_insert_with(|| ModelCapacity { model: model.key.clone(), ..ModelCapacity::default() });
        row.gpus += 1;
        row.allocated += u32::from(c.allocated);
        if g.cordoned {
            row.cordoned += u32::from(c.placeable + c.stranded);
        } else {
            row.placeable += u32::from(c.placeable);
            row.stranded += u32::from(c.stranded);
        }
    }
    let models: Vec<ModelCapacity> = by_model.into_values().collect();
    let mut total = ModelCapacity { model: "total".to_string(), ..ModelCapacity::default() };
    for m in &models {
        total.gpus += m.gpus;
        total.allocated += m.allocated;
        total.placeable += m.placeable;
        total.stranded += m.stranded;
        total.cordoned += m.cordoned;
    }
    Ok((models, total))
}

/// The profiles of `model` the live requests ask for (by name, with or without naming the model), as indices,
/// sorted.
fn demanded_profiles(state: &AppState, live: &[SliceRequest], model: &GpuModel) -> Vec<usize> {
    let mut d: Vec<usize> = live
        .iter()
        .filter_map(|r| match &r.spec {
            SliceSpec::Mig { profile, model: asked } => asked
                .as_deref()
                .is_none_or(|a| state.catalog.resolve(a).is_some_and(|(x, _)| x.key == model.key))
                .then(|| model.profile_index(profile))
                .flatten(),
            _ => None,
        })
        .collect();
    d.sort_unstable();
    d.dedup();
    d
}

/// The fleet's capacity now, and per tenant the slice-hours held over the last `hours`, how many of them were
/// measured and used, and the allocations idle over the whole look-back (below `idle_below` %).
pub async fn report(state: &AppState, hours: f64, idle_below: f64, now: i64) -> Result<EfficiencyReport, StoreError> {
    let (models, total) = fleet_capacity(state).await?;
    let from = lookback_start(now, hours).max(0);
    let metered = state.store.metered(None, from, now).await?;
    let util = if metered.iter().any(|a| a.released_at_ms.is_none() && a.device_uuid.is_some()) {
        device_utilisation(state, hours, now).await?
    } else {
        Default::default()
    };
    let usage = meter(state.catalog, &metered, from, now, now, IdleRule { below: idle_below, hours, util: &util });
    let mut tenants: BTreeMap<(String, String), TenantEfficiency> = BTreeMap::new();
    for a in &usage.allocations {
        let t = tenants.entry((a.tenant.clone(), a.tenant_id.clone())).or_insert_with(|| TenantEfficiency {
            tenant_id: a.tenant_id.clone(),
            tenant: a.tenant.clone(),
            held_slice_hours: 0.0,
            measured_slice_hours: 0.0,
            used_slice_hours: 0.0,
            efficiency: None,
            idle_allocations: Vec::new(),
        });
        let slice_hours = a.slice_seconds / 3600.0;
        t.held_slice_hours += slice_hours;
        if let Some(u) = a.util_mean {
            t.measured_slice_hours += slice_hours;
            t.used_slice_hours += slice_hours * u.clamp(0.0, 100.0) / 100.0;
        }
        if a.idle {
            t.idle_allocations.push(a.allocation.clone());
        }
    }
    let tenants = tenants
        .into_values()
        .map(|mut t| {
            t.efficiency = (t.measured_slice_hours > 0.0).then(|| t.used_slice_hours / t.measured_slice_hours);
            t
        })
        .collect();
    Ok(EfficiencyReport { from_ms: from, to_ms: now, idle_below, models, total, tenants })
}

/// GPUs considered by one defragmentation at most unless the caller says otherwise.
pub const DEFAULT_DEFRAG_MAX_GPUS: u32 = 100;
/// The most GPUs one defragmentation lists or proposes.
pub const MAX_DEFRAG_GPUS: u32 = 1000;

/// Defragmentation ([`tessera_core::defrag`]): per MIG GPU, a layout that keeps every instance held (by a reserved
/// or active allocation) and lays the free part out as instances of the profiles asked for, the target first; those
/// that gain, most first, at most `max_gpus`. With `propose`, each becomes a layout proposal (`layout.propose` in
/// the audit log) for an admin to approve like any other (platform admins).
pub async fn defragment(
    state: &AppState,
    p: &Principal,
    q: &DefragQuery,
    propose: bool,
) -> Result<DefragReport, ApiError> {
    p.require_platform_admin()?;
    let max_gpus = q.max_gpus.unwrap_or(DEFAULT_DEFRAG_MAX_GPUS);
    if !(1..=MAX_DEFRAG_GPUS).contains(&max_gpus) {
        return Err(ApiError::invalid("invalid_max_gpus", format!("`max_gpus` is from 1 to {MAX_DEFRAG_GPUS}")));
    }
    let too_long = |v: &Option<String>| v.as_ref().is_some_and(|s| s.chars().count() > 64);
    if too_long(&q.profile) || too_long(&q.model) {
        return Err(ApiError::invalid("value_too_long", "`profile` and `model` have at most 64 characters"));
    }
    let only_model = match q.model.as_deref() {
        Some(m) => Some(
            state
                .catalog
                .resolve(m)
                .map(|(x, _)| x.key.clone())
                .ok_or_else(|| ApiError::invalid("unknown_model", format!("no GPU model matches `{m}`")))?,
        ),
        None => None,
    };
    if let Some(name) = q.profile.as_deref() {
        let known = state
            .catalog
            .models
            .iter()
            .filter(|m| only_model.as_ref().is_none_or(|k| *k == m.key))
            .any(|m| m.profile_index(name).is_some());
        if !known {
            return Err(ApiError::invalid("unknown_profile", format!("no GPU model here has a profile `{name}`")));
        }
    }
    let nodes = state.store.nodes().await?;
    let live = state.store.live_requests().await?;
    let allocations = state.store.live_allocations().await?;
    let now = crate::store::now_ms();
    let ready = super::agents::ready_nodes(state, now).await?;
    let open: std::collections::HashSet<String> =
        state.store.proposals(Some("proposed")).await?.into_iter().map(|l| l.gpu_id).collect();
    let mut held_on: HashMap<&str, Vec<(&str, u8)>> = HashMap::new();
    for a in &allocations {
        held_on.entry(a.gpu_id.as_str()).or_default().push((a.profile.as_str(), a.start));
    }
    let mut targets: HashMap<String, Option<(Vec<usize>, usize)>> = HashMap::new();
    let mut before = DefragFigures::default();
    let mut stranded = 0u32;
    let mut gaining: Vec<(DefragGpu, tessera_core::defrag::Defrag)> = Vec::new();
    let mut skipped = Vec::new();
    for (node, g) in nodes.iter().flat_map(|n| n.gpus.iter().map(move |g| (n, g))).filter(|(_, g)| g.mig_enabled) {
        let Some((model, _)) = state.catalog.resolve(&g.model) else { continue };
        if only_model.as_ref().is_some_and(|k| *k != model.key) {
            continue;
        }
        let target = targets
            .entry(model.key.clone())
            .or_insert_with(|| {
                let demanded = demanded_profiles(state, &live, model);
                let target = match q.profile.as_deref() {
                    Some(name) => model.profile_index(name)?,
                    None => largest(model, &demanded)?,
                };
                Some((demanded, target))
            })
            .clone();
        let Some((demanded, target)) = target else { continue };
        // An instance or a holder of a profile the model does not have: the GPU is left as it is (a layout
        // written without it would drop it unchecked).
        let (Some(layout), Some(held)) = (
            instances(model, g.layout.iter().map(|i| (i.profile.as_str(), i.start))),
            instances(model, held_on.get(g.id.as_str()).into_iter().flatten().copied()),
        ) else {
            skipped.push(DefragSkipped { gpu: g.id.clone(), code: "layout_unreadable".to_string() });
            continue;
        };
        add(&mut before, readiness(model, &layout, &held, &demanded, target));
        stranded += u32::from(capacity(model, &held, &with(&demanded, target)).stranded);
        let Some(d) = lay_out_again(model, &layout, &held, &demanded, target) else { continue };
        let code = if g.cordoned {
            "cordoned"
        } else if !ready.get(&node.id).copied().unwrap_or(false) {
            "node_not_ready"
        } else if g.auto_layout {
            "auto_layout"
        } else if open.contains(&g.id) {
            "layout_proposal_open"
        } else {
            ""
        };
        if !code.is_empty() {
            skipped.push(DefragSkipped { gpu: g.id.clone(), code: code.to_string() });
            continue;
        }
        let placed = |v: &[Inst]| v.iter().map(|&i| to_placed(model, i)).collect::<Vec<_>>();
        let view = DefragGpu {
            gpu: g.id.clone(),
            node: node.name.clone(),
            model: model.key.clone(),
            target: model.profiles[target].name.clone(),
            base_version: g.layout_version,
            layout: placed(&d.layout),
            created: placed(&d.created),
            destroyed: placed(&d.destroyed),
            before: figures(d.before),
            after: figures(d.after),
            proposal_id: None,
        };
        gaining.push((view, d));
    }
    // Most target instances gained first, then most ready slices gained, then by GPU id.
    gaining.sort_by(|(a, x), (b, y)| {
        let gain = |d: &tessera_core::defrag::Defrag| {
            (d.after.target.saturating_sub(d.before.target), d.after.ready.saturating_sub(d.before.ready))
        };
        gain(y).cmp(&gain(x)).then_with(|| a.gpu.cmp(&b.gpu))
    });
    let over = gaining.split_off(gaining.len().min(max_gpus as usize));
    skipped.extend(over.into_iter().map(|(v, _)| DefragSkipped { gpu: v.gpu, code: "over_max_gpus".to_string() }));
    let mut gpus = Vec::with_capacity(gaining.len());
    let mut after = before;
    for (mut view, _) in gaining {
        if propose {
            let change = LayoutChange {
                gpu_id: view.gpu.clone(),
                base_version: view.base_version,
                layout: view.layout.clone(),
                created: view.created.clone(),
                destroyed: view.destroyed.clone(),
                auto_apply: false,
            };
            match state.store.propose_layout(&change, &p.actor()).await {
                Ok(made) => view.proposal_id = Some(made.id),
                Err(StoreError::Conflict { constraint }) => {
                    let code =
                        if constraint == "layout_proposals_open" { "layout_proposal_open" } else { "layout_stale" };
                    skipped.push(DefragSkipped { gpu: view.gpu, code: code.to_string() });
                    continue;
                }
                // Removed since it was read: nothing to propose there, and the proposals made stay listed.
                Err(StoreError::NotFound { .. }) => {
                    skipped.push(DefragSkipped { gpu: view.gpu, code: "gpu_gone".to_string() });
                    continue;
                }
                Err(e) => return Err(e.into()),
            }
        }
        sub(&mut after, view.before);
        add_figures(&mut after, view.after);
        gpus.push(view);
    }
    skipped.sort_by(|a, b| a.gpu.cmp(&b.gpu));
    Ok(DefragReport { gpus, before, after, stranded_slices: stranded, skipped })
}

/// `(profile name, start)` pairs as instances of `model`; `None` when one names a profile it does not have.
fn instances<'a>(model: &GpuModel, of: impl Iterator<Item = (&'a str, u8)>) -> Option<Vec<Inst>> {
    of.map(|(p, start)| Some(Inst { profile: model.profile_index(p)?, start })).collect()
}

fn with(demanded: &[usize], target: usize) -> Vec<usize> {
    let mut d = demanded.to_vec();
    if !d.contains(&target) {
        d.push(target);
        d.sort_unstable();
    }
    d
}

fn figures(r: Readiness) -> DefragFigures {
    DefragFigures {
        target_instances: u32::from(r.target),
        ready_slices: u32::from(r.ready),
        not_ready_slices: u32::from(r.not_ready),
    }
}

fn add(to: &mut DefragFigures, r: Readiness) {
    add_figures(to, figures(r));
}

fn add_figures(to: &mut DefragFigures, f: DefragFigures) {
    to.target_instances += f.target_instances;
    to.ready_slices += f.ready_slices;
    to.not_ready_slices += f.not_ready_slices;
}

fn sub(to: &mut DefragFigures, f: DefragFigures) {
    to.target_instances = to.target_instances.saturating_sub(f.target_instances);
    to.ready_slices = to.ready_slices.saturating_sub(f.ready_slices);
    to.not_ready_slices = to.not_ready_slices.saturating_sub(f.not_ready_slices);
}
