//! Improvement pass: when demand is left over, re-plan one GPU at a time from scratch (everything but the
//! instances in use), choosing the layout that serves the most of what it holds now plus what is unplaced.
//!
//! Greedy packing can commit a GPU to a few wide slices where several narrow ones would fit, or give a slot to a
//! slice that many GPUs could serve while a slice only this GPU can serve waits. The pass fixes both: a layout wins
//! on the number of slices it serves, then on their scarcity (a slice whose demand fewer GPUs can serve weighs
//! more). A change is applied only when it is strictly better; the slices it displaces go back to the unplaced
//! pool, where packing tries them again. The placed count never drops: a change serves at least as many slices as
//! the GPU held.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use rustc_hash::FxHashMap as HashMap;

use super::pack::{GpuPlan, Packer};
use super::problem::Problem;
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

/// Unplaced demand, indexed for the pass: per `(model, profile)`, the classes it serves in candidate order (scarcest
/// first, then as [`Problem::classes_for`] lists them) and the positions in that order of those with slices left.
struct Pool {
    /// Per catalog model and profile: classes in candidate order.
    order: Vec<Vec<Vec<usize>>>,
    /// Where each class stands in the orders: `(model, profile, position)` for class `c` at
    /// `places_at[c]..places_at[c + 1]`.
    places: Vec<(usize, ProfileIdx, u32)>,
    places_at: Vec<usize>,
    /// Per catalog model and profile: positions in `order` of classes with slices left unplaced.
    open: Vec<Vec<BTreeSet<u32>>>,
    /// Classes with slices left unplaced.
    classes_open: usize,
}

impl Pool {
    fn new(problem: &Problem<'_>, demanded: &[Vec<ProfileIdx>], reach: &[usize], unplaced: &[u32]) -> Pool {
        let models = &problem.catalog.models;
        let mut order: Vec<Vec<Vec<usize>>> = models.iter().map(|m| vec![Vec::new(); m.profiles.len()]).collect();
        let mut ranks: Vec<(usize, usize, ProfileIdx, u32)> = Vec::new();
        let mut open: Vec<Vec<BTreeSet<u32>>> =
            models.iter().map(|m| vec![BTreeSet::new(); m.profiles.len()]).collect();
        for (m, profiles) in demanded.iter().enumerate() {
            for &p in profiles {
                let mut classes = problem.classes_for(m, p).to_vec();
                // Stable: classes_for lists constrained classes first.
                classes.sort_by_key(|&c| reach[c]);
                for (r, &c) in classes.iter().enumerate() {
                    ranks.push((c, m, p, r as u32));
                    if unplaced[c] > 0 {
                        open[m][p].insert(r as u32);
                    }
                }
                order[m][p] = classes;
            }
        }
        ranks.sort_unstable();
        let places = ranks.iter().map(|&(_, m, p, r)| (m, p, r)).collect();
        let mut places_at = vec![0; problem.classes.len() + 1];
        for &(c, ..) in &ranks {
            places_at[c + 1] += 1;
        }
        for c in 0..problem.classes.len() {
            places_at[c + 1] += places_at[c];
        }
        let classes_open = unplaced.iter().filter(|&&u| u > 0).count();
        Pool { order, places, places_at, open, classes_open }
    }

    /// Records that class `c` now has slices left (`open`) or none.
    fn set_open(&mut self, c: usize, open: bool) {
        if open {
            self.classes_open += 1;
        } else {
            self.classes_open -= 1;
        }
        for &(m, p, r) in &self.places[self.places_at[c]..self.places_at[c + 1]] {
            if open {
                self.open[m][p].insert(r);
            } else {
                self.open[m][p].remove(&r);
            }
        }
    }

    /// Adds `delta` to the unplaced slices of class `c`, keeping the index in step.
    fn add(&mut self, unplaced: &mut [u32], c: usize, delta: i32) {
        let before = unplaced[c];
        unplaced[c] = before.saturating_add_signed(delta);
        if (before > 0) != (unplaced[c] > 0) {
            self.set_open(c, unplaced[c] > 0);
        }
    }

    /// The classes that could fill slots of profile `p` on a GPU of model `m` holding `held` (class, slices): in
    /// candidate order, those with slices here or unplaced, until their slices cover the profile's `max` slots.
    fn candidates(&self, m: usize, p: ProfileIdx, held: &[(usize, usize)], unplaced: &[u32], max: usize) -> Candidates {
        let order = &self.order[m][p];
        let mut here: Vec<u32> = held
            .iter()
            .filter_map(|&(c, _)| {
                let places = &self.places[self.places_at[c]..self.places_at[c + 1]];
                places.iter().find(|&&(pm, pp, _)| pm == m && pp == p).map(|&(_, _, r)| r)
            })
            .collect();
        here.sort_unstable();
        let mut open = self.open[m][p].iter().copied().peekable();
        let mut here = here.into_iter().peekable();
        let mut out = Candidates::new();
        let mut covered = 0;
        while covered < max {
            let r = match (open.peek(), here.peek()) {
                (Some(&a), Some(&b)) => {
                    if a <= b {
                        open.next();
                    }
                    if b <= a {
                        here.next();
                    }
                    a.min(b)
                }
                (Some(&a), None) => {
                    open.next();
                    a
                }
                (None, Some(&b)) => {
                    here.next();
                    b
                }
                (None, None) => break,
            };
            let c = order[r as usize];
            let on = held.iter().find(|(k, _)| *k == c).map_or(0, |&(_, n)| n);
            let pool = unplaced[c] as usize;
            if on + pool > 0 {
                covered += on + pool;
                out.push((c, on, pool));
            }
        }
        out
    }
}

/// Runs the pass over every GPU once. Returns whether anything changed.
pub(crate) fn improve(packer: &mut Packer<'_, '_, '_>, cache: &mut FrontierCache) -> bool {
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
    let mut pool = Pool::new(problem, &demanded, &reach, &packer.unplaced);

    let mut changed = false;
    for g in 0..problem.gpus.len() {
        if pool.classes_open == 0 {
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
        // Only profiles in play here: held by this GPU's plan, or wanted by unplaced demand it could serve. No layout
        // has more slots of a profile than its maximum: classes beyond those covering it can never be reached.
        let mut profiles = Vec::new();
        let mut candidates: Vec<Candidates> = Vec::new();
        for &p in &demanded[m] {
            let max = usize::from(gpu.model.profiles[p].max_instances);
            let cands = pool.candidates(m, p, &held, &packer.unplaced, max);
            if cands.is_empty() {
                continue;
            }
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
                pool.add(&mut packer.unplaced, c, 1);
            }
            for c in taken {
                pool.add(&mut packer.unplaced, c, -1);
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
    packer: &Packer<'_, '_, '_>,
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
    let mut seen: HashMap<[u8; MAX_PROFILES], Vec<Inst>> = HashMap::default();
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
    let total = |v: &[u8; MAX_PROFILES]| Reverse(v.iter().map(|&x| u32::from(x)).sum::<u32>());
    all.sort_by(|(v, l), (w, k)| (total(v), v, l).cmp(&(total(w), w, k)));
    let mut out: Vec<([u8; MAX_PROFILES], Vec<Inst>)> = Vec::new();
    for (v, l) in all {
        if !out.iter().any(|(w, _)| v.iter().zip(w).all(|(x, y)| x <= y)) {
            out.push((v, l));
        }
    }
    out.into_iter().map(|(v, l)| (v[..profiles.len()].to_vec(), l)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Catalog;
    use crate::planner::synth::{self, DemandSpec, FleetSpec, Rng};
    use crate::planner::types::PlanInput;

    /// The candidates by a scan of every class the profile serves.
    fn scan(
        problem: &Problem<'_>,
        (m, p): (usize, ProfileIdx),
        held: &[(usize, usize)],
        unplaced: &[u32],
        reach: &[usize],
        max: usize,
    ) -> Candidates {
        let on_gpu = |c: usize| held.iter().find(|(k, _)| *k == c).map_or(0, |&(_, n)| n);
        let mut cands: Candidates = problem
            .classes_for(m, p)
            .iter()
            .map(|&c| (c, on_gpu(c), unplaced[c] as usize))
            .filter(|&(_, on, pool)| on + pool > 0)
            .collect();
        cands.sort_by_key(|&(c, _, _)| reach[c]);
        let mut covered = 0;
        cands
            .into_iter()
            .take_while(|&(_, on, pool)| {
                let more = covered < max;
                covered += on + pool;
                more
            })
            .collect()
    }

    /// The pool's candidates, kept in step as slices leave and return, are what a scan of every class finds.
    #[test]
    fn pool_candidates_match_a_scan_of_the_classes() {
        let catalog = Catalog::builtin();
        for seed in 0..40 {
            let mut rng = Rng::new(seed);
            let models: Vec<String> = ["A100-40GB", "A100-80GB", "H100-80GB", "A30-24GB"].map(String::from).to_vec();
            let fleet = FleetSpec { gpus: 8, models: models.clone(), busy: 0.5, in_use: 0.5, cordoned: 0.0 };
            let gpus = synth::fleet(catalog, &mut rng, &fleet);
            let spec = DemandSpec { requests: 20 + rng.below(60), max_count: 3, constrained: 0.4 };
            let demand = synth::demand(catalog, &mut rng, &models, &spec);
            let problem = Problem::new(catalog, &PlanInput { gpus, demand }).expect("problem");
            let demanded = problem.demanded_profiles();
            let pairs: Vec<(usize, ProfileIdx)> =
                demanded.iter().enumerate().flat_map(|(m, ps)| ps.iter().map(move |&p| (m, p))).collect();
            let reach: Vec<usize> = (0..problem.classes.len()).map(|_| rng.below(5)).collect();
            let mut unplaced: Vec<u32> = (0..problem.classes.len()).map(|_| rng.below(3) as u32).collect();
            let mut pool = Pool::new(&problem, &demanded, &reach, &unplaced);
            for _ in 0..300 {
                let (m, p) = pairs[rng.below(pairs.len())];
                let held: Vec<(usize, usize)> = (0..rng.below(4))
                    .map(|_| (rng.below(problem.classes.len()), 1 + rng.below(3)))
                    .fold(Vec::new(), |mut v, (c, n)| {
                        if !v.iter().any(|&(k, _)| k == c) {
                            v.push((c, n));
                        }
                        v
                    });
                let max = 1 + rng.below(7);
                assert_eq!(
                    pool.candidates(m, p, &held, &unplaced, max),
                    scan(&problem, (m, p), &held, &unplaced, &reach, max),
                    "seed {seed}"
                );
                assert_eq!(pool.classes_open, unplaced.iter().filter(|&&u| u > 0).count());
                let c = rng.below(problem.classes.len());
                let delta = if unplaced[c] > 0 && rng.chance(0.6) { -1 } else { 1 };
                pool.add(&mut unplaced, c, delta);
            }
        }
    }
}
