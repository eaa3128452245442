//! Seeded synthetic fleets and demand for tests and benchmarks. The same seed gives the same data everywhere.

use super::types::{DemandInput, GpuInput, InstanceInput, PlanInput};
use crate::catalog::Catalog;
use crate::layout::{Inst, Occupancy};

/// SplitMix64: small, fast, and good enough for synthetic data.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

/// Shape of a synthetic fleet.
#[derive(Debug, Clone)]
pub struct FleetSpec {
    /// Number of GPUs.
    pub gpus: usize,
    /// Model keys to draw from, uniformly.
    pub models: Vec<String>,
    /// Chance that a GPU already has a layout.
    pub busy: f64,
    /// Chance that an existing instance is in use.
    pub in_use: f64,
    /// Chance that a GPU is cordoned.
    pub cordoned: f64,
}

/// Shape of synthetic demand.
#[derive(Debug, Clone)]
pub struct DemandSpec {
    /// Number of demand entries (requests).
    pub requests: usize,
    /// Each request asks for 1 to this many slices.
    pub max_count: u32,
    /// Chance that a request names a model.
    pub constrained: f64,
}

/// A random fleet. Existing layouts are random valid layouts of base profiles, built by adding random instances.
pub fn fleet(catalog: &Catalog, rng: &mut Rng, spec: &FleetSpec) -> Vec<GpuInput> {
    (0..spec.gpus)
        .map(|i| {
            let key = &spec.models[rng.below(spec.models.len())];
            let Some(model) = catalog.model(key) else {
                return GpuInput {
                    id: format!("gpu-{i}"),
                    model: key.clone(),
                    instances: vec![],
                    cordoned: false,
                    layout_pending: false,
                };
            };
            let mut instances = Vec::new();
            if rng.chance(spec.busy) {
                let mut occ = Occupancy::EMPTY;
                let base: Vec<usize> = model.base_profiles().collect();
                for _ in 0..(1 + rng.below(6)) {
                    let p = base[rng.below(base.len())];
                    let pls = &model.profiles[p].placements;
                    let inst = Inst { profile: p, start: pls[rng.below(pls.len())].start };
                    if occ.can_add(model, inst) {
                        occ.add(model, inst);
                        instances.push(InstanceInput {
                            profile: model.profiles[p].name.clone(),
                            start: inst.start,
                            in_use: rng.chance(spec.in_use),
                        });
                    }
                }
            }
            GpuInput {
                id: format!("gpu-{i}"),
                model: model.key.clone(),
                instances,
                cordoned: rng.chance(spec.cordoned),
                layout_pending: false,
            }
        })
        .collect()
}

/// Random demand over `models`, favouring small profiles as real queues do (weights 6:3:2:1:1 for 1g, 2g, 3g, 4g
/// and 7g).
pub fn demand(catalog: &Catalog, rng: &mut Rng, models: &[String], spec: &DemandSpec) -> Vec<DemandInput> {
    let mut out = Vec::with_capacity(spec.requests);
    while out.len() < spec.requests {
        let Some(model) = catalog.model(&models[rng.below(models.len())]) else {
            break;
        };
        let weighted: Vec<(usize, u32)> = model
            .base_profiles()
            .map(|p| {
                (
                    p,
                    match model.profiles[p].compute_slices {
                        1 => 6,
                        2 => 3,
                        3 => 2,
                        _ => 1,
                    },
                )
            })
            .collect();
        let total: u32 = weighted.iter().map(|w| w.1).sum();
        let mut roll = rng.below(total as usize) as u32;
        let p = weighted
            .iter()
            .find(|(_, w)| {
                if roll < *w {
                    true
                } else {
                    roll -= w;
                    false
                }
            })
            .map_or(0, |w| w.0);
        out.push(DemandInput {
            profile: model.profiles[p].name.clone(),
            count: 1 + rng.below(spec.max_count as usize) as u32,
            model: rng.chance(spec.constrained).then(|| model.key.clone()),
        });
    }
    out
}

/// Models used by [`small_problem`]: both 7-slice geometries' naming schemes, a 4-slice GPU and the 12-unit one.
pub const SMALL_PROBLEM_MODELS: [&str; 5] =
    ["A30-24GB", "A100-40GB", "A100-80GB", "H100-80GB", "RTX-PRO-6000-Blackwell-96GB"];

/// A small random problem, small enough for the exact optimum: 1-8 GPUs of mixed models (half with a layout,
/// half of those instances in use, one in ten cordoned) and 1-3 demand entries of 1-5 slices, 30% naming a model.
pub fn small_problem(catalog: &Catalog, seed: u64) -> PlanInput {
    let mut rng = Rng::new(seed);
    let models: Vec<String> = SMALL_PROBLEM_MODELS.iter().map(|m| m.to_string()).collect();
    let spec = FleetSpec { gpus: 1 + rng.below(8), models, busy: 0.5, in_use: 0.5, cordoned: 0.1 };
    let gpus = fleet(catalog, &mut rng, &spec);
    let fleet_models: Vec<String> = gpus.iter().map(|g| g.model.clone()).collect();
    let spec = DemandSpec { requests: 1 + rng.below(3), max_count: 5, constrained: 0.3 };
    let demand = demand(catalog, &mut rng, &fleet_models, &spec);
    PlanInput { gpus, demand }
}
