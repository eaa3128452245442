//! What platform teams do today, as baselines for the planner:
//! - static homogeneous configs, as mig-parted users deploy them: every GPU gets `all-1g.*` (as many of the
//!   smallest 1-slice profile as fit) or `all-balanced` (2 x 1g + 1 x 2g + 1 x 3g on 7-slice GPUs, 2 x 1g + 1 x 2g
//!   on 4-slice ones), and demand is served from those instances;
//! - first-fit in creation order: each slice, in request order, goes to the first GPU with a free instance of the
//!   profile or room for a new one at the first free allowed start, as `nvidia-smi mig -cgi` does without a
//!   placement.
//!
//! GPUs holding an instance in use keep their layout under a static config (mig-parted cannot apply one without
//! destroying it) and offer their free instances.

use super::problem::Problem;
use crate::catalog::GpuModel;
use crate::layout::{Inst, InstanceSpec, Occupancy, validate};

/// A homogeneous config as mig-parted names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StaticConfig {
    /// `all-1g.*`: the smallest 1-slice profile, as many as fit.
    All1g,
    /// `all-balanced`.
    AllBalanced,
}

/// How a baseline did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BaselineResult {
    /// Slices placed.
    pub placed: u32,
    /// GPUs whose layout changed.
    pub gpus_touched: u32,
}

/// The layout a static config gives a model.
pub fn static_layout(model: &GpuModel, config: StaticConfig) -> Vec<Inst> {
    let smallest = |c: u8| {
        model
            .base_profiles()
            .filter(|&p| model.profiles[p].compute_slices == c)
            .min_by_key(|&p| model.profiles[p].memory_slices)
    };
    let mut wanted = Vec::new();
    match config {
        StaticConfig::All1g => {
            if let Some(p) = smallest(1) {
                wanted.extend(std::iter::repeat_n(p, usize::from(model.profiles[p].max_instances)));
            }
        }
        StaticConfig::AllBalanced => {
            let big = if model.compute_slices_total >= 7 { smallest(3) } else { None };
            wanted.extend([smallest(1), smallest(1), smallest(2), big].into_iter().flatten());
        }
    }
    let specs: Vec<InstanceSpec> =
        wanted.iter().map(|&p| InstanceSpec { profile: model.profiles[p].name.clone(), start: None }).collect();
    validate(model, &specs)
        .map(|placed| {
            placed
                .iter()
                .filter_map(|i| model.profile_index(&i.profile).map(|profile| Inst { profile, start: i.start }))
                .collect()
        })
        .unwrap_or_default()
}

/// Serves demand from a static config applied to every schedulable GPU.
pub fn static_config(problem: &Problem<'_>, config: StaticConfig) -> BaselineResult {
    let mut open: Vec<u32> = problem.classes.iter().map(|c| c.count).collect();
    let mut placed = 0;
    let mut touched = 0;
    for gpu in &problem.gpus {
        if gpu.cordoned {
            continue;
        }
        let offered = if gpu.in_use.is_empty() {
            let target = static_layout(gpu.model, config);
            let mut current = gpu.free.clone();
            current.sort();
            let mut t = target.clone();
            t.sort();
            touched += u32::from(current != t);
            target
        } else {
            gpu.free.clone()
        };
        for inst in offered {
            if let Some(c) = problem.classes_for(gpu.model_idx, inst.profile).iter().copied().find(|&c| open[c] > 0) {
                open[c] -= 1;
                placed += 1;
            }
        }
    }
    BaselineResult { placed, gpus_touched: touched }
}

/// First-fit in request order.
pub fn first_fit(problem: &Problem<'_>) -> BaselineResult {
    let mut occ: Vec<Occupancy> = problem
        .gpus
        .iter()
        .map(|g| Occupancy::of(g.model, &[g.in_use.as_slice(), g.free.as_slice()].concat()))
        .collect();
    let mut free: Vec<Vec<Inst>> = problem.gpus.iter().map(|g| g.free.clone()).collect();
    let mut touched = vec![false; problem.gpus.len()];
    let mut placed = 0;
    for class in &problem.classes {
        'slice: for _ in 0..class.count {
            for (g, gpu) in problem.gpus.iter().enumerate() {
                let Some(p) = class.eligible[gpu.model_idx] else {
                    continue;
                };
                if gpu.cordoned {
                    continue;
                }
                if let Some(k) = free[g].iter().position(|i| i.profile == p) {
                    free[g].remove(k);
                    placed += 1;
                    continue 'slice;
                }
                let profile = &gpu.model.profiles[p];
                if let Some(pl) =
                    profile.placements.iter().find(|pl| occ[g].can_add(gpu.model, Inst { profile: p, start: pl.start }))
                {
                    occ[g].add(gpu.model, Inst { profile: p, start: pl.start });
                    touched[g] = true;
                    placed += 1;
                    continue 'slice;
                }
            }
        }
    }
    BaselineResult { placed, gpus_touched: touched.iter().filter(|&&t| t).count() as u32 }
}
