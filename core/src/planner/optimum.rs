//! The exact optimum for small problems, to measure the planner against.
//!
//! For each GPU, every valid layout that keeps its in-use instances is enumerated and reduced to the Pareto frontier
//! of how many instances of each demanded profile it offers (a layout that only hands out existing free instances
//! leaves the GPU untouched; any other changes it). A dynamic program over the GPUs, keyed by the demand still
//! open, then finds the most slices that can be placed and, among plans placing that many, the fewest GPUs
//! touched. Instances serve constrained demand before unconstrained demand, which is never worse. Exponential in the
//! number of demand entries; meant for a handful of GPUs and entries.

use std::collections::HashMap;

use super::improve::frontier;
use super::problem::Problem;
use crate::layout::Inst;

/// The best any plan can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Optimum {
    /// Most slices placeable.
    pub placed: u32,
    /// Fewest GPUs touched by a plan that places that many.
    pub gpus_touched: u32,
}

/// Largest problem [`optimum`] accepts, in GPUs.
pub const MAX_GPUS: usize = 8;
/// Largest number of distinct open-demand states the dynamic program may visit per GPU.
const MAX_STATES: usize = 200_000;

/// One way a GPU can be used: how many slices of each class it serves and whether its layout changes.
#[derive(Debug, Clone)]
struct Option_ {
    /// Per `(profile)` of the GPU's model that some class wants: instances offered.
    supply: Vec<(usize, u8)>,
    touched: bool,
}

/// Computes the optimum, or `None` when the problem is too large for exhaustive search.
pub fn optimum(problem: &Problem<'_>) -> Option<Optimum> {
    if problem.gpus.len() > MAX_GPUS {
        return None;
    }
    let demanded = problem.demanded_profiles();
    let options: Vec<Vec<Option_>> = problem
        .gpus
        .iter()
        .map(|gpu| {
            let profiles = &demanded[gpu.model_idx];
            // A cordoned GPU hands out nothing, not even its free instances.
            let untouched: Vec<(usize, u8)> = profiles
                .iter()
                .map(|&p| (p, if gpu.cordoned { 0 } else { gpu.free.iter().filter(|i| i.profile == p).count() as u8 }))
                .collect();
            let mut opts = vec![Option_ { supply: untouched, touched: false }];
            if !gpu.cordoned && !profiles.is_empty() {
                for (v, added) in frontier(gpu.model, &gpu.in_use, profiles) {
                    let only_existing = added.iter().all(|i: &Inst| gpu.free.contains(i));
                    let supply = profiles.iter().copied().zip(v).collect();
                    opts.push(Option_ { supply, touched: !only_existing });
                }
            }
            opts
        })
        .collect();

    let start: Vec<u32> = problem.classes.iter().map(|c| c.count).collect();
    // layer: open demand -> (placed, touched), best so far
    let mut layer: HashMap<Vec<u32>, (u32, u32)> = HashMap::from([(start, (0, 0))]);
    for (g, gpu) in problem.gpus.iter().enumerate() {
        let mut next: HashMap<Vec<u32>, (u32, u32)> = HashMap::new();
        for (open, &(placed, touched)) in &layer {
            for opt in &options[g] {
                let mut rest = open.clone();
                let mut served = 0u32;
                for &(p, n) in &opt.supply {
                    let mut n = u32::from(n);
                    for &c in problem.classes_for(gpu.model_idx, p) {
                        let take = n.min(rest[c]);
                        rest[c] -= take;
                        n -= take;
                        served += take;
                    }
                }
                let value = (placed + served, touched + u32::from(opt.touched && served > 0));
                let better =
                    |old: &(u32, u32)| (value.0, std::cmp::Reverse(value.1)) > (old.0, std::cmp::Reverse(old.1));
                match next.get(&rest) {
                    Some(old) if !better(old) => {}
                    _ => {
                        next.insert(rest, value);
                    }
                }
            }
        }
        if next.len() > MAX_STATES {
            return None;
        }
        layer = next;
    }
    layer
        .values()
        .max_by_key(|(placed, touched)| (*placed, std::cmp::Reverse(*touched)))
        .map(|&(placed, gpus_touched)| Optimum { placed, gpus_touched })
}
