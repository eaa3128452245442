//! Fleet efficiency (`GET /api/v1/efficiency`, and the `tessera_compute_slices` gauge): MIG capacity by what it
//! can do now ([`tessera_core::efficiency`]), and what each tenant held and used over a look-back.

use crate::auth::Permissions;
use std::collections::{BTreeMap, HashMap};

use tessera_core::GpuModel;
use tessera_core::defrag::{Readiness, defragment as lay_out_again, largest, readiness};
use tessera_core::efficiency::capacity;
use tessera_core::layout::{Inst, to_placed};
use tessera_core::request::SliceSpec;

use crate::app::AppState;
use crate::error::ApiError;
use crate::idle::{Lookback, is_idle, lookback_start};
use crate::telemetry::Metric;
use crate::usage::{IdleRule, meter};
pub use tessera_api::efficiency::{
    EfficiencyDay, EfficiencyHistory, EfficiencyReport, HistoryQuery, ModelCapacity, ModelPrice, Prices, PricesBody,
    TenantEfficiency,
};
pub use tessera_api::layouts::{DefragFigures, DefragGpu, DefragQuery, DefragReport, DefragSkipped};
use tessera_store::efficiency::{CapacitySample, DayUse};
use tessera_store::telemetry::Metered;
use tessera_store::{LayoutChange, Node, Principal, SliceRequest, StoreError};

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
    let usage = measured(state, &metered, from, now, now, idle_below).await?;
    let prices = price_map(state).await?;
    let mut tenants: BTreeMap<(String, String), (TenantEfficiency, Cost)> = BTreeMap::new();
    for a in &usage.allocations {
        let (t, cost) = tenants.entry((a.tenant.clone(), a.tenant_id.clone())).or_insert_with(|| {
            (
                TenantEfficiency {
                    tenant_id: a.tenant_id.clone(),
                    tenant: a.tenant.clone(),
                    held_slice_hours: 0.0,
                    measured_slice_hours: 0.0,
                    used_slice_hours: 0.0,
                    efficiency: None,
                    idle_allocations: Vec::new(),
                    held_gpu_hours: 0.0,
                    wasted_gpu_hours: 0.0,
                    held_cost: None,
                    waste_cost: None,
                    unpriced_gpu_hours: 0.0,
                },
                Cost::default(),
            )
        });
        let u = Use::of(a);
        t.held_slice_hours += u.held_slice_hours;
        t.measured_slice_hours += u.measured_slice_hours;
        t.used_slice_hours += u.used_slice_hours;
        t.held_gpu_hours += u.held_gpu_hours;
        t.wasted_gpu_hours += u.wasted_gpu_hours;
        match prices.per_gpu_hour.get(&a.model) {
            Some(price) => cost.add(u.held_gpu_hours * price, u.wasted_gpu_hours * price),
            None => t.unpriced_gpu_hours += a.gpu_hours,
        }
        if a.idle {
            t.idle_allocations.push(a.allocation.clone());
        }
    }
    let mut waste_cost = Cost::default();
    let tenants: Vec<TenantEfficiency> = tenants
        .into_values()
        .map(|(mut t, cost)| {
            t.efficiency = (t.measured_slice_hours > 0.0).then(|| t.used_slice_hours / t.measured_slice_hours);
            (t.held_cost, t.waste_cost) = cost.figures();
            if cost.priced {
                waste_cost.add(cost.held, cost.wasted);
            }
            t
        })
        .collect();
    let currency = prices.currency;
    let waste_cost = currency.as_ref().map(|_| waste_cost.wasted);
    let unpriced_gpu_hours = tenants.iter().map(|t| t.unpriced_gpu_hours).sum();
    Ok(EfficiencyReport {
        from_ms: from,
        to_ms: now,
        idle_below,
        models,
        total,
        tenants,
        currency,
        waste_cost,
        unpriced_gpu_hours,
    })
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
    let only_model = model_key(state, q.model.as_deref())?;
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
    let now = tessera_store::now_ms();
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

/// The catalog key of the model named `name` (a key or a name), `None` for none; `unknown_model` when the catalog
/// has no such model.
fn model_key(state: &AppState, name: Option<&str>) -> Result<Option<String>, ApiError> {
    name.map(|m| {
        state
            .catalog
            .resolve(m)
            .map(|(x, _)| x.key.clone())
            .ok_or_else(|| ApiError::invalid("unknown_model", format!("no GPU model matches `{m}`")))
    })
    .transpose()
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

/// Costs summed over GPU-hours of priced models.
#[derive(Debug, Clone, Copy, Default)]
struct Cost {
    priced: bool,
    held: f64,
    wasted: f64,
}

impl Cost {
    fn add(&mut self, held: f64, wasted: f64) {
        self.priced = true;
        self.held += held;
        self.wasted += wasted;
    }

    /// `(held, wasted)`, both `None` when nothing priced was added.
    fn figures(self) -> (Option<f64>, Option<f64>) {
        if self.priced { (Some(self.held), Some(self.wasted)) } else { (None, None) }
    }
}

/// The price list as used: the currency (`None` when no price is set) and the price per GPU-hour by model key.
#[derive(Debug, Clone, Default)]
pub struct PriceMap {
    /// ISO 4217 code.
    pub currency: Option<String>,
    /// Per GPU-hour, by catalog model key.
    pub per_gpu_hour: HashMap<String, f64>,
}

/// The stored price list as a [`PriceMap`].
pub async fn price_map(state: &AppState) -> Result<PriceMap, StoreError> {
    let rows = state.store.prices().await?;
    Ok(PriceMap {
        currency: rows.first().map(|r| r.1.clone()),
        per_gpu_hour: rows.into_iter().map(|(model, _, price, _, _)| (model, price)).collect(),
    })
}

/// The most a GPU-hour may be priced at.
pub const MAX_PRICE_PER_GPU_HOUR: f64 = 1_000_000.0;

/// The price list (any signed-in user: what their slices cost is no secret).
pub async fn prices(state: &AppState) -> Result<Prices, StoreError> {
    let rows = state.store.prices().await?;
    Ok(Prices {
        currency: rows.first().map(|r| r.1.clone()),
        updated_at_ms: rows.iter().map(|r| r.3).max(),
        updated_by: rows.first().map(|r| r.4.clone()),
        models: rows.into_iter().map(|(model, _, per_gpu_hour, _, _)| ModelPrice { model, per_gpu_hour }).collect(),
    })
}

/// Replaces the price list (platform admins): a three-letter capital currency code (`invalid_currency`), models
/// the catalog knows (`unknown_model`, stored by key), each once (`duplicate_model`), prices from 0 to
/// [`MAX_PRICE_PER_GPU_HOUR`] (`invalid_price`). The list as stored.
pub async fn set_prices(state: &AppState, p: &Principal, body: &PricesBody) -> Result<Prices, ApiError> {
    p.require_platform_admin()?;
    if body.currency.len() != 3 || !body.currency.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(ApiError::invalid("invalid_currency", "`currency` is an ISO 4217 code: three capital letters"));
    }
    if body.models.len() > state.catalog.models.len() {
        return Err(ApiError::invalid("duplicate_model", "at most one price per model of the catalog"));
    }
    let mut list: Vec<(String, f64)> = Vec::with_capacity(body.models.len());
    for m in &body.models {
        if m.model.chars().count() > 64 {
            return Err(ApiError::invalid("value_too_long", "`model` has at most 64 characters"));
        }
        let Some((model, _)) = state.catalog.resolve(&m.model) else {
            return Err(ApiError::invalid("unknown_model", format!("no GPU model matches `{}`", m.model)));
        };
        if !(0.0..=MAX_PRICE_PER_GPU_HOUR).contains(&m.per_gpu_hour) {
            return Err(ApiError::invalid(
                "invalid_price",
                format!("`per_gpu_hour` is from 0 to {MAX_PRICE_PER_GPU_HOUR}"),
            ));
        }
        if list.iter().any(|(k, _)| *k == model.key) {
            return Err(ApiError::invalid("duplicate_model", format!("`{}` is priced twice", model.key)));
        }
        list.push((model.key.clone(), m.per_gpu_hour));
    }
    state.store.set_prices(&body.currency, &list, &p.actor()).await?;
    Ok(prices(state).await?)
}

/// Minutes between two capacity samples of the history.
pub const SAMPLE_MINUTES: u32 = 10;
/// Days of history kept and shown at most.
pub const HISTORY_DAYS: u32 = 90;
const DAY_MS: i64 = 86_400_000;

/// Records the history at `now_ms`: the fleet's capacity per model in the current sampling slot (once per slot:
/// a later sample of the slot, from this or another replica, replaces it), the use per model of the day so far and,
/// until it has been written after its end, of the whole day before; and drops what is older than [`HISTORY_DAYS`]. Called by the server's sweep.
pub async fn record(state: &AppState, now_ms: i64) -> Result<(), StoreError> {
    let slot_ms = i64::from(SAMPLE_MINUTES) * 60_000;
    let slot = now_ms - now_ms.rem_euclid(slot_ms);
    let (models, _) = fleet_capacity(state).await?;
    let samples: Vec<(String, CapacitySample)> = models
        .iter()
        .map(|m| {
            let c = CapacitySample {
                gpus: m.gpus,
                allocated: m.allocated,
                placeable: m.placeable,
                stranded: m.stranded,
                cordoned: m.cordoned,
            };
            (m.model.clone(), c)
        })
        .collect();
    state.store.record_capacity(slot, &samples).await?;
    let today = now_ms - now_ms.rem_euclid(DAY_MS);
    // The day before, whole, once it has ended: until a write after its end is recorded (a server down at
    // midnight closes it when it is back, within the 90 days).
    if state.store.day_use_written(today - DAY_MS).await?.is_none_or(|at| at < today) {
        let rows = day_use(state, today - DAY_MS, today, now_ms).await?;
        state.store.record_day_use(today - DAY_MS, &rows).await?;
    }
    let rows = day_use(state, today, now_ms, now_ms).await?;
    state.store.record_day_use(today, &rows).await?;
    state.store.prune_efficiency(today - i64::from(HISTORY_DAYS - 1) * DAY_MS).await?;
    Ok(())
}

/// Per model, what was held, measured, used and wasted in `[from_ms, to_ms)`; each allocation measured over its
/// own use in that span (as in [`report`]).
async fn day_use(state: &AppState, from_ms: i64, to_ms: i64, now_ms: i64) -> Result<Vec<DayUse>, StoreError> {
    let mut metered = state.store.metered(None, from_ms, to_ms).await?;
    if metered.is_empty() {
        return Ok(Vec::new());
    }
    // Released after the span ends: active throughout it, and measured as an active allocation is.
    for a in &mut metered {
        if a.released_at_ms.is_some_and(|r| r >= to_ms) {
            a.released_at_ms = None;
        }
    }
    let usage = measured(state, &metered, from_ms, to_ms, now_ms, DEFAULT_EFFICIENCY_IDLE_BELOW).await?;
    let mut by_model: BTreeMap<String, DayUse> = BTreeMap::new();
    for a in &usage.allocations {
        let d = by_model.entry(a.model.clone()).or_insert_with(|| DayUse {
            day_ms: from_ms,
            model: a.model.clone(),
            ..DayUse::default()
        });
        let u = Use::of(a);
        d.held_slice_hours += u.held_slice_hours;
        d.measured_slice_hours += u.measured_slice_hours;
        d.used_slice_hours += u.used_slice_hours;
        d.held_gpu_hours += u.held_gpu_hours;
        d.wasted_gpu_hours += u.wasted_gpu_hours;
    }
    Ok(by_model.into_values().collect())
}

/// `metered` metered over `[from_ms, to_ms)`, each allocation measured by the mean utilisation of its device over
/// its own use in the span ([`held_means`]): an allocation active at `to_ms` has it as `util_mean` and is idle when
/// it held its device the whole span below `idle_below` %; a released one has it as `util_in_period`.
async fn measured(
    state: &AppState,
    metered: &[Metered],
    from_ms: i64,
    to_ms: i64,
    now_ms: i64,
    idle_below: f64,
) -> Result<crate::usage::UsageReport, StoreError> {
    let hours = (to_ms - from_ms).max(1) as f64 / 3_600_000.0;
    let nothing = HashMap::new();
    let mut usage =
        meter(state.catalog, metered, from_ms, to_ms, to_ms, IdleRule { below: idle_below, hours, util: &nothing });
    let means = held_means(state, metered, from_ms, to_ms, now_ms).await?;
    let by_id: HashMap<&str, &Metered> = metered.iter().map(|m| (m.id.as_str(), m)).collect();
    for a in &mut usage.allocations {
        let Some(m) = by_id.get(a.allocation.as_str()) else { continue };
        let mean = means.get(a.allocation.as_str()).copied();
        if m.released_at_ms.is_none() {
            a.util_mean = mean;
            a.idle = is_idle(true, m.activated_at_ms, from_ms, mean, idle_below);
        } else {
            a.util_in_period = mean;
        }
    }
    usage.idle_count = usage.allocations.iter().filter(|a| a.idle).count();
    Ok(usage)
}

/// Per allocation of `metered` with a device (by id), the mean utilisation of its device over its own use in
/// `[from_ms, to_ms)` (from its activation, to its release or `to_ms`): its kept hours and the stored series
/// ([`crate::use_hours::use_sums`]) and, for one still active when `to_ms` is now, this replica's live window from
/// the split on ([`Lookback`]: the window's 1 s samples, where the series has the same minutes only once each has
/// ended); a device this replica has no window for (its agent sends to another replica, or this one just started)
/// is read from the series there too. What it reads follows the span's allocations, not the fleet's devices.
pub async fn held_means(
    state: &AppState,
    metered: &[Metered],
    from_ms: i64,
    to_ms: i64,
    now_ms: i64,
) -> Result<HashMap<String, f64>, StoreError> {
    let live = to_ms >= now_ms;
    let split = if live {
        Lookback::new(to_ms, (to_ms - from_ms) as f64 / 3_600_000.0, state.telemetry.window_ms()).split_ms
    } else {
        to_ms
    };
    let mut of: Vec<(usize, &str, i64, i64)> = Vec::new();
    // Per device, the active allocations on it (a time-sliced GPU has several) and where each one's use starts.
    let mut in_window: HashMap<&str, Vec<(usize, i64)>> = HashMap::new();
    for (i, a) in metered.iter().enumerate() {
        let Some(device) = a.device_uuid.as_deref() else { continue };
        let s = a.activated_at_ms.max(from_ms);
        let e = a.released_at_ms.unwrap_or(to_ms).min(to_ms);
        if e <= s {
            continue;
        }
        if live && a.released_at_ms.is_none() {
            if s < split {
                of.push((i, a.id.as_str(), s, split));
            }
            in_window.entry(device).or_default().push((i, s.max(split)));
        } else {
            of.push((i, a.id.as_str(), s, e));
        }
    }
    let mut sums = crate::use_hours::use_sums(&state.store, metered, &of, now_ms).await?;
    if !in_window.is_empty() {
        let columns = usize::try_from((to_ms - split + 999) / 1000).unwrap_or(0);
        let rows =
            state.telemetry.window_rows(None, |d, _| in_window.contains_key(d), Metric::Util, split, 1000, columns);
        let seen: std::collections::HashSet<&str> = rows.iter().map(|(key, _)| key.device.as_str()).collect();
        let unseen: Vec<(usize, &str, i64, i64)> = in_window
            .iter()
            .filter(|(device, _)| !seen.contains(**device))
            .flat_map(|(_, held)| held.iter().map(|&(i, since)| (i, metered[i].id.as_str(), since, to_ms)))
            .filter(|(_, _, since, to)| since < to)
            .collect();
        for (i, (weighted, samples)) in crate::use_hours::use_sums(&state.store, metered, &unseen, now_ms).await? {
            let sum = sums.entry(i).or_default();
            sum.0 += weighted;
            sum.1 += samples;
        }
        for (key, values) in rows {
            for &(i, since) in in_window.get(key.device.as_str()).into_iter().flatten() {
                let sum = sums.entry(i).or_default();
                for (c, v) in values.iter().enumerate() {
                    if let Some(v) = v.filter(|_| split + c as i64 * 1000 >= since) {
                        sum.0 += f64::from(v);
                        sum.1 += 1;
                    }
                }
            }
        }
    }
    Ok(sums
        .into_iter()
        .filter(|(_, (_, samples))| *samples > 0)
        .map(|(i, (weighted, samples))| (metered[i].id.clone(), weighted / samples as f64))
        .collect())
}

/// What one metered allocation held, and of it what was measured, used and wasted: the figures the report and
/// the history sum.
#[derive(Debug, Clone, Copy)]
struct Use {
    held_slice_hours: f64,
    measured_slice_hours: f64,
    used_slice_hours: f64,
    held_gpu_hours: f64,
    wasted_gpu_hours: f64,
}

impl Use {
    /// Measured when its device's mean utilisation over its own use in the span is known ([`held_means`]): used
    /// is that share of it, wasted the rest.
    fn of(a: &crate::usage::AllocationUsage) -> Use {
        let held = a.slice_seconds / 3600.0;
        let util = a.util_mean.or(a.util_in_period).map(|u| u.clamp(0.0, 100.0) / 100.0);
        Use {
            held_slice_hours: held,
            measured_slice_hours: if util.is_some() { held } else { 0.0 },
            used_slice_hours: util.map_or(0.0, |u| held * u),
            held_gpu_hours: a.gpu_hours,
            wasted_gpu_hours: util.map_or(0.0, |u| a.gpu_hours * (1.0 - u)),
        }
    }
}

/// The efficiency history of the last `days` UTC days (today included), of one model or the whole fleet, costed
/// at today's prices (platform admins). `invalid_days` outside 1-[`HISTORY_DAYS`], `unknown_model`.
pub async fn history(
    state: &AppState,
    p: &Principal,
    q: &HistoryQuery,
    now_ms: i64,
) -> Result<EfficiencyHistory, ApiError> {
    p.require_platform_admin()?;
    let days = q.days.unwrap_or(HISTORY_DAYS);
    if !(1..=HISTORY_DAYS).contains(&days) {
        return Err(ApiError::invalid("invalid_days", format!("`days` is from 1 to {HISTORY_DAYS}")));
    }
    if q.model.as_ref().is_some_and(|m| m.chars().count() > 64) {
        return Err(ApiError::invalid("value_too_long", "`model` has at most 64 characters"));
    }
    let model = model_key(state, q.model.as_deref())?;
    let today = now_ms - now_ms.rem_euclid(DAY_MS);
    let from_ms = today - i64::from(days - 1) * DAY_MS;
    let (capacity, used) = state.store.efficiency_history(from_ms).await?;
    let prices = price_map(state).await?;
    let wanted = |m: &str| model.as_deref().is_none_or(|k| k == m);
    let mut out: BTreeMap<i64, (EfficiencyDay, Cost)> = BTreeMap::new();
    let blank = |day_ms: i64| {
        let (y, m, d) = tessera_core::clock::civil(day_ms.div_euclid(DAY_MS));
        EfficiencyDay {
            day: format!("{y:04}-{m:02}-{d:02}"),
            day_ms,
            samples: 0,
            gpus: 0.0,
            allocated: 0.0,
            placeable: 0.0,
            stranded: 0.0,
            cordoned: 0.0,
            held_slice_hours: 0.0,
            measured_slice_hours: 0.0,
            used_slice_hours: 0.0,
            efficiency: None,
            held_gpu_hours: 0.0,
            wasted_gpu_hours: 0.0,
            held_cost: None,
            waste_cost: None,
            unpriced_gpu_hours: 0.0,
        }
    };
    let samples: HashMap<i64, i64> = capacity.iter().map(|c| (c.day_ms, c.samples)).collect();
    for c in capacity.iter().filter(|c| wanted(&c.model)) {
        let n = c.samples.max(1);
        let (d, _) = out.entry(c.day_ms).or_insert_with(|| (blank(c.day_ms), Cost::default()));
        d.samples = u32::try_from(n).unwrap_or(u32::MAX);
        let mean = |x: i64| x as f64 / n as f64;
        d.gpus += mean(c.gpus);
        d.allocated += mean(c.allocated);
        d.placeable += mean(c.placeable);
        d.stranded += mean(c.stranded);
        d.cordoned += mean(c.cordoned);
    }
    for u in used.iter().filter(|u| wanted(&u.model)) {
        let (d, cost) = out.entry(u.day_ms).or_insert_with(|| (blank(u.day_ms), Cost::default()));
        d.samples = u32::try_from(samples.get(&u.day_ms).copied().unwrap_or(0)).unwrap_or(u32::MAX);
        d.held_slice_hours += u.held_slice_hours;
        d.measured_slice_hours += u.measured_slice_hours;
        d.used_slice_hours += u.used_slice_hours;
        d.held_gpu_hours += u.held_gpu_hours;
        d.wasted_gpu_hours += u.wasted_gpu_hours;
        match prices.per_gpu_hour.get(&u.model) {
            Some(price) => cost.add(u.held_gpu_hours * price, u.wasted_gpu_hours * price),
            None => d.unpriced_gpu_hours += u.held_gpu_hours,
        }
    }
    let days = out
        .into_values()
        .map(|(mut d, cost)| {
            d.efficiency = (d.measured_slice_hours > 0.0).then(|| d.used_slice_hours / d.measured_slice_hours);
            (d.held_cost, d.waste_cost) = cost.figures();
            d
        })
        .collect();
    Ok(EfficiencyHistory { from_ms, model, currency: prices.currency, sample_minutes: SAMPLE_MINUTES, days })
}
