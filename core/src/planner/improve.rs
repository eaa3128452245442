//! Improvement pass: when demand is left over, re-plan one GPU at a time from scratch (everything but the
//! instances in use), choosing the layout that serves the most of what it holds now plus what is unplaced.
//!
//! Greedy packing can commit a GPU to a few wide slices where several narrow ones would fit; this pass trades them
//! when that places more slices in total. It never touches a GPU the plan did not already change unless that GPU
//! can take unplaced demand, and it only applies a change that strictly increases the placed count.

use std::collections::HashMap;

use super::pack::{GpuPlan, Packer};
use crate::catalog::ProfileIdx;
use crate::layout::{Inst, MAX_PROFILES, Occupancy, valid_supersets};

/// Layouts worth considering for a GPU: for each distinct vector of demanded-profile counts that no other vector
/// dominates, one witness layout (the instances added to those in use).
type Frontier = Vec<(Vec<u8>, Vec<Inst>)>;

/// Frontiers already computed, by model, occupancy of the in-use instances and the profiles considered. Shared by
/// the runs of one planning call: GPUs in the same situation share one entry.
#[derive(Debug, Default)]
pub(crate) struct FrontierCache(HashMap<(usize, Occupancy, Vec<ProfileIdx>), Frontier>);

/// Runs the pass over every GPU once. Returns whether anything changed.
pub(crate) fn improve(packer: &mut Packer<'_, '_>, cache: &mut FrontierCache) -> bool {
    let problem = packer.problem;
    let demanded = problem.demanded_profiles();
    let mut changed = false;
    for g in 0..problem.gpus.len() {
        if packer.unplaced.iter().all(|&u| u == 0) {
            break;
        }
        if packer.key_of(g).is_none() {
            continue;
        }
        let gpu = &problem.gpus[g];
        let m = gpu.model_idx;
        let profiles = &demanded[m];
        let classes: Vec<&[usize]> = profiles.iter().map(|&p| problem.classes_for(m, p)).collect();
        let current = &packer.plans[g];
        let on_gpu = |class: usize| {
            current.bound.iter().filter(|(_, c)| *c == class).count()
                + current.new.iter().filter(|(_, c)| *c == class).count()
        };
        let pool: Vec<usize> = classes.iter().map(|cs| cs.iter().map(|&c| packer.unplaced[c] as usize).sum()).collect();
        if pool.iter().all(|&n| n == 0) {
            continue;
        }
        let avail: Vec<usize> =
            classes.iter().zip(&pool).map(|(cs, pool)| pool + cs.iter().map(|&c| on_gpu(c)).sum::<usize>()).collect();
        let occupancy = Occupancy::of(gpu.model, &gpu.in_use);
        let frontier = cache
            .0
            .entry((m, occupancy, profiles.clone()))
            .or_insert_with(|| frontier(gpu.model, &gpu.in_use, profiles));
        let value = |v: &[u8]| v.iter().zip(&avail).map(|(&v, &a)| usize::from(v).min(a)).sum::<usize>();
        let Some((best_v, best_l)) = frontier.iter().max_by_key(|(v, _)| value(v)) else {
            continue;
        };
        let now = current.bound.len() + current.new.len();
        if value(best_v) <= now {
            continue;
        }
        let (best_v, best_l) = (best_v.clone(), best_l.clone());
        let plan = reassign(packer, g, profiles, &classes, &best_v, &best_l);
        if packer.set_plan(g, plan) {
            changed = true;
        }
    }
    changed
}

/// Fills the chosen layout's slots with slices: those already on the GPU first, then unplaced ones, constrained
/// classes before unconstrained; existing free instances are handed out before new ones are created. Updates the
/// unplaced counts.
fn reassign(
    packer: &mut Packer<'_, '_>,
    g: usize,
    profiles: &[ProfileIdx],
    classes: &[&[usize]],
    counts: &[u8],
    added: &[Inst],
) -> GpuPlan {
    let gpu = &packer.problem.gpus[g];
    let old = std::mem::take(&mut packer.plans[g]);
    let mut on_gpu: HashMap<usize, usize> = HashMap::new();
    for c in old.bound.iter().map(|&(_, c)| c).chain(old.new.iter().map(|&(_, c)| c)) {
        *on_gpu.entry(c).or_default() += 1;
    }
    let mut plan = GpuPlan::default();
    for (k, &p) in profiles.iter().enumerate() {
        let mut slots: Vec<Inst> = added.iter().copied().filter(|i| i.profile == p).collect();
        slots.sort_by_key(|i| !gpu.free.contains(i));
        let mut slots = slots.into_iter().take(usize::from(counts[k]));
        'fill: for &c in classes[k] {
            loop {
                let from_gpu = on_gpu.get(&c).copied().unwrap_or(0) > 0;
                if !from_gpu && packer.unplaced[c] == 0 {
                    break;
                }
                let Some(slot) = slots.next() else {
                    break 'fill;
                };
                if from_gpu {
                    *on_gpu.entry(c).or_default() -= 1;
                } else {
                    packer.unplaced[c] -= 1;
                }
                if gpu.free.contains(&slot) {
                    plan.bound.push((slot, c));
                } else {
                    plan.new.push((p, c));
                }
            }
        }
    }
    for (c, left) in on_gpu {
        packer.unplaced[c] += left as u32;
    }
    plan
}

/// The Pareto frontier of counts of `profiles` over every valid layout containing `in_use`.
pub(crate) fn frontier(model: &crate::catalog::GpuModel, in_use: &[Inst], profiles: &[ProfileIdx]) -> Frontier {
    let mut seen: HashMap<[u8; MAX_PROFILES], Vec<Inst>> = HashMap::new();
    valid_supersets(model, in_use, profiles, &mut |added| {
        let mut v = [0u8; MAX_PROFILES];
        for i in added {
            if let Some(k) = profiles.iter().position(|&p| p == i.profile) {
                v[k] += 1;
            }
        }
        seen.entry(v).or_insert_with(|| added.to_vec());
    });
    // Largest totals first: a vector can only be dominated by one with a larger total, already kept or dropped.
    let mut all: Vec<([u8; MAX_PROFILES], Vec<Inst>)> = seen.into_iter().collect();
    all.sort_by_key(|(v, l)| (std::cmp::Reverse(v.iter().map(|&x| u32::from(x)).sum::<u32>()), *v, l.clone()));
    let mut out: Vec<([u8; MAX_PROFILES], Vec<Inst>)> = Vec::new();
    for (v, l) in all {
        if !out.iter().any(|(w, _)| v.iter().zip(w).all(|(x, y)| x <= y)) {
            out.push((v, l));
        }
    }
    out.into_iter().map(|(v, l)| (v[..profiles.len()].to_vec(), l)).collect()
}
