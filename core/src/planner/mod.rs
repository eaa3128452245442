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
//!    capacity) is returned. What does not depend on the order (interned states with their best layouts and
//!    actions, layout frontiers) is shared by the runs, and only the winner's plan is built.
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

use rustc_hash::FxHashMap as HashMap;

use crate::catalog::Catalog;
use crate::layout::{Applied, Fragmentation, Inst, Occupancy, Solution, solve, to_placed};
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
    let mut caches = Caches::default();
    let mut best: Option<(PlanSummary, pack::Outcome)> = None;
    for order in [Order::LargestFirst, Order::SmallestFirst] {
        let outcome = run(problem, order, &mut caches);
        let summary = summary(problem, &caches.states, &outcome);
        let key =
            |s: &PlanSummary| (std::cmp::Reverse(s.placed), s.gpus_touched, s.destroyed, s.stranded_compute_slices);
        if best.as_ref().is_none_or(|(b, _)| key(&summary) < key(b)) {
            best = Some((summary, outcome));
        }
        if best.as_ref().is_some_and(|(b, _)| b.placed == b.demanded && b.gpus_touched == 0) {
            break;
        }
    }
    let outcome = match best {
        Some((_, outcome)) => outcome,
        None => run(problem, Order::LargestFirst, &mut caches),
    };
    let plan = finish(problem, &caches.states, &outcome);
    debug_assert_eq!(plan.summary, summary(problem, &caches.states, &outcome));
    plan
}

/// One run of packing and improvement with demand in `order` (one half of the portfolio).
pub fn plan_with(problem: &Problem<'_>, order: Order) -> Plan {
    let mut caches = Caches::default();
    let outcome = run(problem, order, &mut caches);
    finish(problem, &caches.states, &outcome)
}

/// What the runs of one planning call share: facts about GPU states and layout frontiers, which do not depend on
/// the order demand is placed in.
#[derive(Debug, Default)]
struct Caches {
    states: pack::States,
    frontiers: improve::FrontierCache,
}

fn run(problem: &Problem<'_>, order: Order, caches: &mut Caches) -> pack::Outcome {
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
    let mut packer = Packer::new(problem, &mut caches.states);
    let todo: Vec<(usize, u32)> = classes.iter().map(|&c| (c, problem.classes[c].count)).collect();
    packer.place_classes(&todo);
    if packer.unplaced.iter().any(|&u| u > 0) && improve::improve(&mut packer, &mut caches.frontiers) {
        let todo: Vec<(usize, u32)> = classes.iter().map(|&c| (c, std::mem::take(&mut packer.unplaced[c]))).collect();
        packer.place_classes(&todo);
    }
    packer.into_outcome()
}

/// The summary the plan of `outcome` will have, without building the plan.
fn summary(problem: &Problem<'_>, states: &pack::States, outcome: &pack::Outcome) -> PlanSummary {
    let totals = states.totals(outcome);
    let mut stranded = totals.stranded;
    for (g, gpu) in problem.gpus.iter().enumerate() {
        if outcome.gpu_state[g].is_none() && !gpu.cordoned {
            stranded += u32::from(untouched_stranded(gpu));
        }
    }
    PlanSummary {
        demanded: problem.demanded(),
        placed: totals.placed,
        gpus_touched: totals.touched,
        destroyed: totals.destroyed,
        stranded_compute_slices: stranded,
    }
}

/// Stranded compute slices of a GPU the plan leaves as it is.
fn untouched_stranded(gpu: &problem::Gpu<'_>) -> u8 {
    let all: Vec<Inst> = [gpu.in_use.as_slice(), gpu.free.as_slice()].concat();
    Fragmentation::of(gpu.model, &Occupancy::of(gpu.model, &all)).stranded
}

fn finish(problem: &Problem<'_>, states: &pack::States, outcome: &pack::Outcome) -> Plan {
    let mut placed = Vec::new();
    let mut changed_gpus = Vec::new();
    let mut destroyed_all = Vec::new();
    let mut stranded = 0u32;
    let mut lost = vec![0u32; problem.classes.len()];
    // GPUs in the same state share its best layout.
    let mut solutions: HashMap<pack::StateId, Option<Solution>> = HashMap::default();
    for (g, gpu) in problem.gpus.iter().enumerate() {
        let model = gpu.model;
        let Some(state) = outcome.gpu_state[g] else {
            if !gpu.cordoned {
                stranded += u32::from(untouched_stranded(gpu));
            }
            continue;
        };
        let key = states.key(state);
        let plan = &outcome.plans[g];
        for &(inst, c) in &plan.bound {
            placed.push(PlacedSlice {
                demand: c,
                gpu: gpu.id.clone(),
                profile: model.profiles[inst.profile].name.clone(),
                start: inst.start,
                new: false,
            });
        }
        let solution = solutions.entry(state).or_insert_with(|| solve(model, &key.fixed, &key.free, &key.new));
        let Some(solution) = solution.as_ref() else {
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
    let unplaced = unplaced(problem, outcome, &lost);
    let summary = PlanSummary {
        demanded: problem.demanded(),
        placed: placed.len() as u32,
        gpus_touched: changed_gpus.len() as u32,
        destroyed: destroyed_all.len() as u32,
        stranded_compute_slices: stranded,
    };
    Plan { placed, unplaced, changed_gpus, destroyed: destroyed_all, summary }
}

fn unplaced(problem: &Problem<'_>, outcome: &pack::Outcome, lost: &[u32]) -> Vec<Unplaced> {
    let mut out = Vec::new();
    // Per catalog model: (GPUs, cordoned or pending, pending). Each cause of a GPU taking nothing new is counted
    // apart: cordoned, or a layout change waiting for approval.
    let mut per_model = vec![(0usize, 0usize, 0usize); problem.catalog.models.len()];
    for g in &problem.gpus {
        let n = &mut per_model[g.model_idx];
        n.0 += 1;
        n.1 += usize::from(g.cordoned);
        n.2 += usize::from(g.layout_pending);
    }
    for (c, class) in problem.classes.iter().enumerate() {
        let left = outcome.unplaced[c] + lost[c];
        if left == 0 {
            continue;
        }
        let wanted = match &class.model {
            Some(m) => format!("{} on {m}", class.profile),
            None => class.profile.clone(),
        };
        let (matching, blocked, pending) = class
            .eligible
            .iter()
            .zip(&per_model)
            .filter(|(e, _)| e.is_some())
            .fold((0, 0, 0), |(a, b, c), (_, n)| (a + n.0, b + n.1, c + n.2));
        let cordoned = blocked - pending;
        let usable = matching - cordoned - pending;
        let gpus = |n: usize| if n == 1 { "1 GPU".to_string() } else { format!("{n} GPUs") };
        let held_back = match (cordoned, pending) {
            (0, 0) => String::new(),
            (c, 0) => format!("{} cordoned", gpus(c)),
            (0, p) => format!("{} with a layout change waiting for approval", gpus(p)),
            (c, p) => format!("{} cordoned, {} with a layout change waiting for approval", gpus(c), gpus(p)),
        };
        let (code, reason) = if matching == 0 {
            ("no_matching_gpu", format!("no GPU in the fleet offers {wanted}"))
        } else if cordoned == matching {
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
