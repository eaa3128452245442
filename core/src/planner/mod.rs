//! The MIG planner: binds demanded slices to existing free instances or to new instances at exact placements, and
//! says which GPUs' layouts change, what is destroyed, and what could not be placed and why.
//!
//! # Objective
//! In order: place as many demanded slices as possible; change the layout of as few GPUs as possible (a layout
//! change is disruptive); leave free capacity unfragmented, so that large profiles still fit later. Hard rules: an
//! instance in use is never destroyed or handed out; a cordoned GPU gets nothing; every resulting layout is valid.
//!
//! # Algorithm
//! 1. **Packing** ([`pack`]). Demand entries are taken in an order (see 3) and their slices placed one at a time.
//!    Each slice goes where it disturbs least: an existing free instance of its profile; else a new instance on a
//!    GPU this plan already changes; else a new instance on an untouched GPU, choosing the one that can absorb the
//!    most of the request. Within a tier the GPU left with the least uncommitted compute wins (best fit), then the
//!    one with the least stranded capacity. Where a slice lands, the
//!    GPU's new instances are re-placed together by an exhaustive search over placements ([`crate::layout::solve`]),
//!    which destroys as few free instances as possible and minimises stranded capacity; so an early choice never
//!    pins a later instance to a bad start. GPUs in the same situation share one interned state, and per demanded
//!    `(model, profile)` an ordered index keeps the best state on top, so a step costs `O(log states)`.
//! 2. **Improvement** ([`improve`]). If demand is left over, each GPU is re-planned from scratch (all but its
//!    in-use instances) over the Pareto frontier of the layouts it admits, taking the layout that serves the most
//!    of what it held plus what is unplaced, when that is strictly better: more slices, or as many and scarcer ones
//!    (demand fewer GPUs can serve). Slices it displaces are packed again with what is left.
//! 3. **Portfolio.** Steps 1-2 run twice, with demand ordered largest profile first (best at fitting everything:
//!    wide instances claim aligned blocks before narrow ones scatter) and smallest first (best at maximising the
//!    count when capacity runs short). The better plan by (placed, GPUs touched, instances destroyed, stranded
//!    capacity) is returned.
//!
//! [`optimum`] computes the exact optimum for small problems by dynamic programming over per-GPU Pareto frontiers;
//! tests and the benchmark compare the planner with it and with the [`baseline`] strategies.

pub mod baseline;
mod improve;
pub mod optimum;
mod pack;
pub mod problem;
pub mod synth;
mod types;

pub use problem::Problem;
pub use types::*;

use crate::catalog::Catalog;
use crate::layout::{Applied, Fragmentation, Inst, Occupancy, solve, to_placed};
use pack::Packer;

/// Demand orders tried by the portfolio.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Widest profiles first.
    LargestFirst,
    /// Narrowest profiles first.
    SmallestFirst,
}

/// Plans `input` against `catalog`.
pub fn plan(catalog: &Catalog, input: &PlanInput) -> Result<Plan, PlanError> {
    let problem = Problem::new(catalog, input)?;
    Ok(plan_problem(&problem))
}

/// Plans a checked problem: the better of the portfolio's runs.
pub fn plan_problem(problem: &Problem<'_>) -> Plan {
    let mut best: Option<Plan> = None;
    let mut cache = improve::FrontierCache::default();
    for order in [Order::LargestFirst, Order::SmallestFirst] {
        let plan = run(problem, order, &mut cache);
        let key = |p: &Plan| {
            let s = p.summary;
            (std::cmp::Reverse(s.placed), s.gpus_touched, s.destroyed, s.stranded_compute_slices)
        };
        if best.as_ref().is_none_or(|b| key(&plan) < key(b)) {
            best = Some(plan);
        }
        if best.as_ref().is_some_and(|b| b.summary.placed == b.summary.demanded && b.summary.gpus_touched == 0) {
            break;
        }
    }
    best.unwrap_or_else(|| plan_with(problem, Order::LargestFirst))
}

/// One run of packing and improvement with demand in `order` (one half of the portfolio).
pub fn plan_with(problem: &Problem<'_>, order: Order) -> Plan {
    run(problem, order, &mut improve::FrontierCache::default())
}

fn run(problem: &Problem<'_>, order: Order, cache: &mut improve::FrontierCache) -> Plan {
    let mut classes: Vec<usize> = (0..problem.classes.len()).collect();
    classes.sort_by_key(|&c| {
        let k = &problem.classes[c];
        let wide = (k.size, k.compute);
        let wide = match order {
            Order::LargestFirst => (u8::MAX - wide.0, u8::MAX - wide.1),
            Order::SmallestFirst => wide,
        };
        (wide, !k.constrained(), c)
    });
    let mut packer = Packer::new(problem);
    for &c in &classes {
        packer.place_class(c, problem.classes[c].count);
    }
    if packer.unplaced.iter().any(|&u| u > 0) && improve::improve(&mut packer, cache) {
        for &c in &classes {
            let n = std::mem::take(&mut packer.unplaced[c]);
            packer.place_class(c, n);
        }
    }
    finish(problem, &packer)
}

fn finish(problem: &Problem<'_>, packer: &Packer<'_, '_>) -> Plan {
    let mut placed = Vec::new();
    let mut changed_gpus = Vec::new();
    let mut destroyed_all = Vec::new();
    let mut stranded = 0u32;
    let mut lost = vec![0u32; problem.classes.len()];
    for (g, gpu) in problem.gpus.iter().enumerate() {
        let model = gpu.model;
        let Some(key) = packer.key_of(g) else {
            if !gpu.cordoned {
                let all: Vec<Inst> = [gpu.in_use.as_slice(), gpu.free.as_slice()].concat();
                stranded += u32::from(Fragmentation::of(model, &Occupancy::of(model, &all)).stranded);
            }
            continue;
        };
        let plan = &packer.plans[g];
        for &(inst, c) in &plan.bound {
            placed.push(PlacedSlice {
                demand: c,
                gpu: gpu.id.clone(),
                profile: model.profiles[inst.profile].name.clone(),
                start: inst.start,
                new: false,
            });
        }
        let Some(solution) = solve(model, &key.fixed, &key.free, &key.new) else {
            // Unreachable (packing only moves GPUs to feasible states), but never lose a slice.
            for &(_, c) in &plan.new {
                lost[c] += 1;
            }
            continue;
        };
        stranded += u32::from(solution.fragmentation.stranded);
        if key.new.is_empty() {
            continue;
        }
        // key.new is sorted by profile and solution.new follows it; hand placements out per profile in order.
        let mut by_profile: Vec<(Inst, bool)> =
            solution.new.iter().zip(&solution.reused).map(|(&i, r)| (i, r.is_none())).collect();
        for &(p, c) in &plan.new {
            if let Some(k) = by_profile.iter().position(|(i, _)| i.profile == p) {
                let (inst, created) = by_profile.remove(k);
                placed.push(PlacedSlice {
                    demand: c,
                    gpu: gpu.id.clone(),
                    profile: model.profiles[p].name.clone(),
                    start: inst.start,
                    new: created,
                });
            }
        }
        if solution.created() == 0 && solution.destroyed.is_empty() {
            continue;
        }
        let Applied { layout, created, destroyed } = solution.apply(&key.fixed, &key.free);
        for &d in &destroyed {
            destroyed_all.push(GpuInstance {
                gpu: gpu.id.clone(),
                profile: model.profiles[d.profile].name.clone(),
                start: d.start,
            });
        }
        changed_gpus.push(ChangedGpu {
            gpu: gpu.id.clone(),
            model: model.key.clone(),
            layout: layout.iter().map(|&i| to_placed(model, i)).collect(),
            created: created.iter().map(|&i| to_placed(model, i)).collect(),
            destroyed: destroyed.iter().map(|&i| to_placed(model, i)).collect(),
        });
    }
    placed.sort_by(|a, b| (a.demand, &a.gpu, a.start).cmp(&(b.demand, &b.gpu, b.start)));
    let unplaced = unplaced(problem, packer, &lost);
    let summary = PlanSummary {
        demanded: problem.demanded(),
        placed: placed.len() as u32,
        gpus_touched: changed_gpus.len() as u32,
        destroyed: destroyed_all.len() as u32,
        stranded_compute_slices: stranded,
    };
    Plan { placed, unplaced, changed_gpus, destroyed: destroyed_all, summary }
}

fn unplaced(problem: &Problem<'_>, packer: &Packer<'_, '_>, lost: &[u32]) -> Vec<Unplaced> {
    let mut out = Vec::new();
    for (c, class) in problem.classes.iter().enumerate() {
        let left = packer.unplaced[c] + lost[c];
        if left == 0 {
            continue;
        }
        let wanted = match &class.model {
            Some(m) => format!("{} on {m}", class.profile),
            None => class.profile.clone(),
        };
        let matching: Vec<_> = problem.gpus.iter().filter(|g| class.eligible[g.model_idx].is_some()).collect();
        // Each cause of a GPU taking nothing new counted apart: cordoned, or a layout change waiting for approval.
        let pending = matching.iter().filter(|g| g.layout_pending).count();
        let cordoned = matching.iter().filter(|g| g.cordoned).count() - pending;
        let usable = matching.len() - cordoned - pending;
        let gpus = |n: usize| if n == 1 { "1 GPU".to_string() } else { format!("{n} GPUs") };
        let held_back = match (cordoned, pending) {
            (0, 0) => String::new(),
            (c, 0) => format!("{} cordoned", gpus(c)),
            (0, p) => format!("{} with a layout change waiting for approval", gpus(p)),
            (c, p) => format!("{} cordoned, {} with a layout change waiting for approval", gpus(c), gpus(p)),
        };
        let (code, reason) = if matching.is_empty() {
            ("no_matching_gpu", format!("no GPU in the fleet offers {wanted}"))
        } else if cordoned == matching.len() {
            ("all_matching_gpus_cordoned", format!("every GPU that offers {wanted} is cordoned ({})", gpus(cordoned)))
        } else if usable == 0 {
            ("insufficient_capacity", format!("no GPU that offers {wanted} takes new slices now: {held_back}"))
        } else {
            (
                "insufficient_capacity",
                format!(
                    "no room for {left} more {wanted} on the {} that offer{} it: the rest is in use or taken by this \
                     plan{}",
                    gpus(usable),
                    if usable == 1 { "s" } else { "" },
                    if held_back.is_empty() { String::new() } else { format!(" ({held_back})") }
                ),
            )
        };
        out.push(Unplaced {
            demand: c,
            profile: class.profile.clone(),
            model: class.model.clone(),
            count: left,
            code: code.to_string(),
            reason,
        });
    }
    out
}
