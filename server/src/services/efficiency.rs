//! Fleet efficiency (`GET /api/v1/efficiency`, and the `tessera_compute_slices` gauge): MIG capacity by what it
//! can do now ([`tessera_core::efficiency`]), and what each tenant held and used over a look-back.

use std::collections::{BTreeMap, HashMap};

use tessera_core::efficiency::capacity;
use tessera_core::layout::Inst;
use tessera_core::request::SliceSpec;

use crate::app::AppState;
use crate::services::idle::{device_utilisation, lookback_start};
use crate::services::usage::{IdleRule, meter};
use crate::store::{Node, StoreError};
pub use tessera_api::efficiency::{EfficiencyReport, ModelCapacity, TenantEfficiency};

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
                if d.is_empty() {
                    d = (0..model.profiles.len()).collect();
                }
                d.sort_unstable();
                d.dedup();
                d
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
