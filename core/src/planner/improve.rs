//! Improvement pass: when demand is left over, re-plan one GPU at a time from scratch (everything but the
//! instances in use), choosing the layout that serves the most of what it holds now plus what is unplaced.
//!
//! Greedy packing can commit a GPU to a few wide slices where several narrow ones would fit, or give a slot to a
//! slice that many GPUs could serve while a slice only this GPU can serve waits. The pass fixes both: a layout wins
//! on the number of slices it serves, then on their scarcity (a slice whose demand fewer GPUs can serve weighs
//! more). A change is applied only when it is strictly better; the slices it displaces go back to the unplaced
//! pool, where packing tries them again. The placed count never drops: a change serves at least as many slices as
//! the GPU held.

use std::collections::HashMap;

use super::pack::{GpuPlan, Packer};
use crate::catalog::ProfileIdx;
use crate::layout::{Inst, MAX_PROFILES, Occupancy, valid_supersets};

/// Layouts worth considering for a GPU: for each distinct vector of counts (of the profiles considered) that no
/// other vector dominates, one witness layout (the instances added to those in use).
type Frontier = Vec<(Vec<u8>, Vec<Inst>)>;

/// Frontiers already computed, by model, occupancy of the in-use instances and the profiles considered. Shared by
/// the runs of one planning call: GPUs in the same situation share one entry.
#[derive(Debug, Default)]
pub(crate) struct FrontierCache(HashMap<(usize, Occupancy, Vec<ProfileIdx>), Frontier>);

/// Slices that could fill one profile's slots on a GPU, scarcest class first: `(class, on this GPU now, unplaced)`.
type Candidates = Vec<(usize, usize, usize)>;

/// Runs the pass over every GPU once. Returns whether anything changed.
pub(crate) fn improve(packer: &mut Packer<'_, '_>, cache: &mut FrontierCache) -> bool {
    let problem = packer.problem;
    let demanded = problem.demanded_profiles();
    // How many GPUs taking part could serve each class; fewer means scarcer.
    let mut per_model = vec![0usize; problem.catalog.models.len()];
    for (g, gpu) in problem.gpus.iter().enumerate() {
        per_model[gpu.model_idx] += usize::from(packer.key_of(g).is_some());
    }
    let reach: Vec<usize> = problem
        .classes
        .iter()
        .map(|c| c.eligible.iter().zip(&per_model).filter(|(e, _)| e.is_some()).map(|(_, n)| n).sum())
        .collect();
    let weight = |c: usize| (problem.gpus.len() + 1 - reach[c]) as u64;

    let mut changed = false;
    for g in 0..problem.gpus.len() {
        if packer.unplaced.iter().all(|&u| u == 0) {
            break;
        }
        // A GPU the plan left alone could not take one more slice of any unplaced class when packing ended (else
        // packing would have put it there), and re-planning it from scratch cannot change that.
        if packer.key_of(g).is_none() || (packer.plans[g].bound.is_empty() && packer.plans[g].new.is_empty()) {
            continue;
        }
        let gpu = &problem.gpus[g];
        let m = gpu.model_idx;
        let current = &packer.plans[g];
        let mut held: Vec<(usize, usize)> = Vec::new(); // (class, slices on this GPU)
        for c in current.bound.iter().map(|&(_, c)| c).chain(current.new.iter().map(|&(_, c)| c)) {
            match held.iter_mut().find(|(k, _)| *k == c) {
                Some((_, n)) => *n += 1,
                None => held.push((c, 1)),
            }
        }
        let on_gpu = |c: usize| held.iter().find(|(k, _)| *k == c).map_or(0, |&(_, n)| n);
        // Only profiles in play here: held by this GPU's plan, or wanted by unplaced demand it could serve.
        let mut profiles = Vec::new();
        let mut candidates: Vec<Candidates> = Vec::new();
        for &p in &demanded[m] {
            let mut cands: Candidates = problem
                .classes_for(m, p)
                .iter()
                .map(|&c| (c, on_gpu(c), packer.unplaced[c] as usize))
                .filter(|&(_, on, pool)| on + pool > 0)
                .collect();
            if cands.is_empty() {
                continue;
            }
            // Scarcest first; classes_for already lists constrained classes first, and the sort is stable.
            cands.sort_by_key(|&(c, _, _)| reach[c]);
            // No layout has more slots of a profile than its maximum: the rest of the list can never be reached.
            let max = usize::from(gpu.model.profiles[p].max_instances);
            let mut covered = 0;
            let keep = cands.iter().take_while(|&&(_, on, pool)| {
                let more = covered < max;
                covered += on + pool;
                more
            });
            let cands: Candidates = keep.copied().collect();
            profiles.push(p);
            candidates.push(cands);
        }
        if candidates.iter().all(|cs| cs.iter().all(|&(_, _, pool)| pool == 0)) {
            continue;
        }
        // (slices served, their total weight) if the layout offers `v[k]` slots of profiles[k].
        let value = |v: &[u8]| {
            let mut served = 0usize;
            let mut weighed = 0u64;
            for (cands, &slots) in candidates.iter().zip(v) {
                let mut left = usize::from(slots);
                for &(c, on, pool) in cands {
                    if left == 0 {
                        break;
                    }
                    let take = left.min(on + pool);
                    served += take;
                    weighed += weight(c) * take as u64;
                    left -= take;
                }
            }
            (served, weighed)
        };
        let held = current.bound.iter().map(|&(_, c)| c).chain(current.new.iter().map(|&(_, c)| c));
        let now = (current.bound.len() + current.new.len(), held.map(weight).sum::<u64>());
        let occupancy = Occupancy::of(gpu.model, &gpu.in_use);
        let frontier = cache
            .0
            .entry((m, occupancy, profiles.clone()))
            .or_insert_with(|| frontier(gpu.model, &gpu.in_use, &profiles));
        let Some((best_v, best_l)) = frontier.iter().max_by_key(|(v, _)| value(v)) else {
            continue;
        };
        if value(best_v) <= now {
            continue;
        }
        let (plan, taken) = reassign(packer, g, &profiles, &candidates, best_v, best_l);
        let returned: Vec<usize> =
            current.bound.iter().map(|&(_, c)| c).chain(current.new.iter().map(|&(_, c)| c)).collect();
        // set_plan refuses an infeasible plan without changing anything; only then is the pool updated.
        if packer.set_plan(g, plan) {
            for c in returned {
                packer.unplaced[c] += 1;
            }
            for c in taken {
                packer.unplaced[c] -= 1;
            }
            changed = true;
        }
    }
    changed
}

/// Fills the chosen layout's slots with slices in candidate order (scarcest class first); existing free instances
/// are handed out before new ones are created. Slices of one class are interchangeable, so the GPU's current slices
/// count as returned to the pool and the slots are filled from it. Returns the plan and the class of each slice it
/// takes; nothing is changed until the caller applies both.
fn reassign(
    packer: &Packer<'_, '_>,
    g: usize,
    profiles: &[ProfileIdx],
    candidates: &[Candidates],
    counts: &[u8],
    added: &[Inst],
) -> (GpuPlan, Vec<usize>) {
    let gpu = &packer.problem.gpus[g];
    let mut plan = GpuPlan::default();
    let mut taken = Vec::new();
    for ((&p, cands), &count) in profiles.iter().zip(candidates).zip(counts) {
        let mut slots: Vec<Inst> = added.iter().copied().filter(|i| i.profile == p).collect();
        slots.sort_by_key(|i| !gpu.free.contains(i));
        let mut slots = slots.into_iter().take(usize::from(count));
        'fill: for &(c, on, pool) in cands {
            for _ in 0..on + pool {
                let Some(slot) = slots.next() else { break 'fill };
                taken.push(c);
                if gpu.free.contains(&slot) {
                    plan.bound.push((slot, c));
                } else {
                    plan.new.push((p, c));
                }
            }
        }
    }
    (plan, taken)
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
