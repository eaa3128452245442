//! Greedy packing of demand, one slice at a time, onto the GPU where it disturbs least.
//!
//! Each GPU is in a *state*: its fixed instances (in use, or handed out by this plan), its remaining free
//! instances (kept unless in the way) and the profiles this plan creates on it. States are interned, so GPUs that
//! look alike share one state and every question about a state (is it feasible, what does adding a profile cost)
//! is answered once, for all runs of a planning call. For every demanded `(model, profile)` an ordered index holds,
//! per state, the best action a slice of that profile has there and the state's lowest GPU index; placing a slice
//! takes the best head among the class's eligible `(model, profile)` indexes, so a step costs a few ordered-set
//! operations, not a fleet scan. An index is kept only while demand still to be placed in the current pass can use
//! it: built when the first such class comes, dropped after the last, so states a GPU only passes through are not
//! evaluated for profiles nobody asks for at that time.
//!
//! Actions are ranked by [`Score`]: hand out an existing free instance (tier 0); create on a GPU this plan
//! already changes (tier 1, or 2 if more free instances must go); create on an untouched GPU (tier 3, or 4 if free
//! instances must go). Within a tier, the GPU left with the least uncommitted compute wins (compute not taken by
//! instances in use, handed out or created by the plan; best fit keeps whole GPUs free for large profiles), then the
//! least stranded capacity, then the most placement choices left. A GPU not yet changed is opened by how much of the
//! request it can absorb first (see [`Packer::place_classes`]).

use std::cmp::Reverse;
use std::collections::BTreeSet;
use std::rc::Rc;

use rustc_hash::FxHashMap as HashMap;

use super::problem::Problem;
use crate::catalog::{Catalog, ProfileIdx};
use crate::layout::{Fragmentation, Inst, solve};

/// Interned state id.
pub(crate) type StateId = u32;

/// What a GPU looks like part-way through planning. Lists are sorted, so equal GPUs have equal keys.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct StateKey {
    pub model: usize,
    pub fixed: Vec<Inst>,
    pub free: Vec<Inst>,
    pub new: Vec<ProfileIdx>,
}

/// What the best layout of a state costs.
#[derive(Debug, Clone, Copy)]
struct Eval {
    destroyed: u8,
    /// New instances that do not sit exactly where a free instance of their profile sits.
    created: u8,
    fragmentation: Fragmentation,
    /// Compute slices of fixed and new instances.
    committed: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Action {
    Bind(Inst),
    New(ProfileIdx),
}

/// Preference of an action; smaller is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Score {
    tier: u8,
    slack: u8,
    stranded: u8,
    addable: Reverse<u16>,
}

/// What the plan does on one GPU: existing instances handed out and profiles created, each with the demand class
/// it serves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct GpuPlan {
    pub bound: Vec<(Inst, usize)>,
    pub new: Vec<(ProfileIdx, usize)>,
}

type Choice = Option<(Score, Action, StateId)>;

/// A slice's destination: score, lowest GPU index of the state, the state, the profile used.
type Pick = (Score, u32, StateId, ProfileIdx);

/// How a GPU to open is chosen, smallest first: tier, slices of the request it absorbs (most first), score, GPU.
type OpenKey = (u8, Reverse<u8>, Score, u32);

/// Tiers from this one on change a GPU the plan has not changed yet.
const OPENS_GPU: u8 = 3;

/// Per demanded `(model, profile)`: states ordered by their best action, then their lowest GPU index.
type Index = HashMap<(usize, ProfileIdx), BTreeSet<(Score, u32, StateId)>>;

/// What is known about states: their keys, best layouts, best actions and capacities. None of it depends on the
/// order demand is placed in, so the runs of one planning call share it.
#[derive(Debug, Default)]
pub(crate) struct States {
    keys: Vec<Rc<StateKey>>,
    ids: HashMap<Rc<StateKey>, StateId>,
    evals: Vec<Option<Eval>>,
    best: HashMap<(StateId, ProfileIdx), Choice>,
    /// How many more slices of a profile a state can take along its chain of best actions, and whether that is
    /// exact (else it is a lower bound: the chain was followed only so far).
    capacity: HashMap<(StateId, ProfileIdx), (u8, bool)>,
}

/// What a run of packing leaves: per GPU its state (`None` if it takes no part) and what the plan does on it, and
/// the slices left unplaced per class.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    pub gpu_state: Vec<Option<StateId>>,
    pub plans: Vec<GpuPlan>,
    pub unplaced: Vec<u32>,
}

/// Totals of an outcome over the GPUs taking part, read from their states' best layouts.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Totals {
    /// Slices placed.
    pub placed: u32,
    /// GPUs whose layout changes.
    pub touched: u32,
    /// Free instances destroyed.
    pub destroyed: u32,
    /// Stranded compute slices.
    pub stranded: u32,
}

impl States {
    /// The key of a state.
    pub fn key(&self, s: StateId) -> &StateKey {
        &self.keys[s as usize]
    }

    /// Totals of `outcome`, as its plan will show them.
    pub fn totals(&self, outcome: &Outcome) -> Totals {
        let mut t = Totals::default();
        for (s, plan) in outcome.gpu_state.iter().zip(&outcome.plans) {
            let Some(s) = s else { continue };
            t.placed += plan.bound.len() as u32;
            let Some(eval) = self.evals[*s as usize] else { continue };
            t.placed += plan.new.len() as u32;
            t.touched += u32::from(eval.created > 0 || eval.destroyed > 0);
            t.destroyed += u32::from(eval.destroyed);
            t.stranded += u32::from(eval.fragmentation.stranded);
        }
        t
    }

    fn intern(&mut self, catalog: &Catalog, key: &StateKey) -> StateId {
        if let Some(&id) = self.ids.get(key) {
            return id;
        }
        let model = &catalog.models[key.model];
        let eval = solve(model, &key.fixed, &key.free, &key.new).map(|sol| Eval {
            destroyed: sol.destroyed.len() as u8,
            created: sol.created() as u8,
            fragmentation: sol.fragmentation,
            committed: key
                .fixed
                .iter()
                .map(|i| i.profile)
                .chain(key.new.iter().copied())
                .map(|p| model.profiles[p].compute_slices)
                .sum(),
        });
        let id = self.keys.len() as StateId;
        let key = Rc::new(key.clone());
        self.keys.push(Rc::clone(&key));
        self.ids.insert(key, id);
        self.evals.push(eval);
        id
    }

    fn best_action(&mut self, catalog: &Catalog, s: StateId, p: ProfileIdx) -> Choice {
        if let Some(&c) = self.best.get(&(s, p)) {
            return c;
        }
        let key = Rc::clone(&self.keys[s as usize]);
        let cur = self.evals[s as usize]?;
        let mut next = StateKey {
            model: key.model,
            fixed: Vec::with_capacity(key.fixed.len() + 1),
            free: Vec::with_capacity(key.free.len()),
            new: Vec::with_capacity(key.new.len() + 1),
        };
        let mut choice: Choice = None;
        let mut last = None;
        for (k, &f) in key.free.iter().enumerate() {
            if f.profile != p || last == Some(f) {
                continue;
            }
            last = Some(f);
            next.fixed.clone_from(&key.fixed);
            let at = next.fixed.partition_point(|x| *x < f);
            next.fixed.insert(at, f);
            next.free.clone_from(&key.free);
            next.free.remove(k);
            next.new.clone_from(&key.new);
            self.consider(catalog, &key, cur, &next, Action::Bind(f), &mut choice);
        }
        // Creating ranks below handing out (tier 1 and up against tier 0): with a free instance to hand out, the new
        // instance's layout (an exhaustive search) need not be solved.
        if choice.is_none_or(|(best, _, _)| best.tier != 0) {
            next.fixed.clone_from(&key.fixed);
            next.free.clone_from(&key.free);
            next.new.clone_from(&key.new);
            let at = next.new.partition_point(|x| *x < p);
            next.new.insert(at, p);
            self.consider(catalog, &key, cur, &next, Action::New(p), &mut choice);
        }
        self.best.insert((s, p), choice);
        choice
    }

    /// Scores `action`, which takes a GPU from state `key` (best layout `cur`) to `next`, and keeps it in `choice`
    /// if it is better.
    fn consider(
        &mut self,
        catalog: &Catalog,
        key: &StateKey,
        cur: Eval,
        next: &StateKey,
        action: Action,
        choice: &mut Choice,
    ) {
        let t = self.intern(catalog, next);
        let Some(ev) = self.evals[t as usize] else {
            return;
        };
        let tier = match action {
            Action::Bind(_) => 0,
            Action::New(_) => (if key.new.is_empty() { 3 } else { 1 }) + u8::from(ev.destroyed > cur.destroyed),
        };
        let score = Score {
            tier,
            slack: catalog.models[key.model].compute_slices_total.saturating_sub(ev.committed),
            stranded: ev.fragmentation.stranded,
            addable: Reverse(ev.fragmentation.addable),
        };
        if choice.is_none_or(|(best, _, _)| score < best) {
            *choice = Some((score, action, t));
        }
    }

    /// How many more slices of `p` state `s` can take along its chain of best actions, counted up to `limit`.
    fn absorbs(&mut self, catalog: &Catalog, s: StateId, p: ProfileIdx, limit: u8) -> u8 {
        if limit == 0 {
            return 0;
        }
        if let Some(&(n, exact)) = self.capacity.get(&(s, p))
            && (exact || n >= limit)
        {
            return n.min(limit);
        }
        let n = match self.best_action(catalog, s, p) {
            Some((_, _, t)) => 1 + self.absorbs(catalog, t, p, limit - 1),
            None => 0,
        };
        // Short of the limit, the chain ended: the count is exact; at the limit it is a lower bound.
        self.capacity.insert((s, p), (n, n < limit));
        n
    }
}

/// The packing state of a whole fleet.
pub(crate) struct Packer<'p, 'c, 's> {
    pub problem: &'p Problem<'c>,
    pub plans: Vec<GpuPlan>,
    /// Per GPU; `None` for cordoned GPUs.
    gpu_state: Vec<Option<StateId>>,
    states: &'s mut States,
    /// Per state: the GPUs in it.
    members: Vec<BTreeSet<u32>>,
    index: Index,
    /// Per catalog model and profile: whether its index is kept now.
    live: Vec<Vec<bool>>,
    demanded: Vec<Vec<ProfileIdx>>,
    /// The `(model, profile)` pairs that can serve each class: those of class `c` at `pairs_at[c]..pairs_at[c + 1]`.
    pairs: Vec<(usize, ProfileIdx)>,
    pairs_at: Vec<usize>,
    /// Per catalog model: the GPUs taking part.
    gpus_of: Vec<Vec<u32>>,
    /// Slices left unplaced, per class.
    pub unplaced: Vec<u32>,
    /// Before each step, check the kept indexes and the choice of a GPU to open against a scan of the fleet.
    #[cfg(test)]
    check: bool,
}

impl<'p, 'c, 's> Packer<'p, 'c, 's> {
    pub fn new(problem: &'p Problem<'c>, states: &'s mut States) -> Self {
        let mut pairs = Vec::new();
        let mut pairs_at = vec![0];
        for k in &problem.classes {
            pairs.extend(k.eligible.iter().enumerate().filter_map(|(m, p)| p.map(|p| (m, p))));
            pairs_at.push(pairs.len());
        }
        let mut packer = Packer {
            problem,
            plans: vec![GpuPlan::default(); problem.gpus.len()],
            gpu_state: vec![None; problem.gpus.len()],
            states,
            members: Vec::new(),
            index: HashMap::default(),
            live: problem.catalog.models.iter().map(|m| vec![false; m.profiles.len()]).collect(),
            demanded: problem.demanded_profiles(),
            pairs,
            pairs_at,
            gpus_of: vec![Vec::new(); problem.catalog.models.len()],
            unplaced: vec![0; problem.classes.len()],
            #[cfg(test)]
            check: false,
        };
        for (g, gpu) in problem.gpus.iter().enumerate() {
            if gpu.cordoned || packer.demanded[gpu.model_idx].is_empty() {
                continue;
            }
            let key = StateKey { model: gpu.model_idx, fixed: gpu.in_use.clone(), free: gpu.free.clone(), new: vec![] };
            let s = packer.intern(key);
            packer.gpu_state[g] = Some(s);
            packer.members[s as usize].insert(g as u32);
            packer.gpus_of[gpu.model_idx].push(g as u32);
        }
        packer
    }

    /// What the run leaves.
    pub fn into_outcome(self) -> Outcome {
        Outcome { gpu_state: self.gpu_state, plans: self.plans, unplaced: self.unplaced }
    }

    /// The state key of a GPU, if it takes part.
    pub fn key_of(&self, g: usize) -> Option<&StateKey> {
        self.gpu_state[g].map(|s| self.states.key(s))
    }

    fn intern(&mut self, key: StateKey) -> StateId {
        let s = self.states.intern(self.problem.catalog, &key);
        if self.members.len() <= s as usize {
            self.members.resize_with(s as usize + 1, BTreeSet::new);
        }
        s
    }

    fn best_action(&mut self, s: StateId, p: ProfileIdx) -> Choice {
        self.states.best_action(self.problem.catalog, s, p)
    }

    fn reindex(&mut self, s: StateId, old_min: Option<u32>, new_min: Option<u32>) {
        let model = self.states.keys[s as usize].model;
        for k in 0..self.demanded[model].len() {
            let p = self.demanded[model][k];
            if !self.live[model][p] {
                continue;
            }
            if let Some((score, _, _)) = self.best_action(s, p) {
                let set = self.index.entry((model, p)).or_default();
                if let Some(o) = old_min {
                    set.remove(&(score, o, s));
                }
                if let Some(n) = new_min {
                    set.insert((score, n, s));
                }
            }
        }
    }

    fn move_gpu(&mut self, g: usize, t: StateId) {
        let Some(s) = self.gpu_state[g] else { return };
        if s == t {
            return;
        }
        if self.members.len() <= t as usize {
            self.members.resize_with(t as usize + 1, BTreeSet::new);
        }
        let old = self.members[s as usize].first().copied();
        self.members[s as usize].remove(&(g as u32));
        let new = self.members[s as usize].first().copied();
        if old != new {
            self.reindex(s, old, new);
        }
        let old = self.members[t as usize].first().copied();
        self.members[t as usize].insert(g as u32);
        let new = self.members[t as usize].first().copied();
        if old != new {
            self.reindex(t, old, new);
        }
        self.gpu_state[g] = Some(t);
    }

    /// Builds the index of `(m, p)` from the states GPUs are in now, and keeps it from then on.
    fn make_live(&mut self, m: usize, p: ProfileIdx) {
        if self.live[m][p] {
            return;
        }
        self.live[m][p] = true;
        let mut set = BTreeSet::new();
        for k in 0..self.gpus_of[m].len() {
            let g = self.gpus_of[m][k];
            let Some(s) = self.gpu_state[g as usize] else { continue };
            // Once per state: at its lowest GPU.
            if self.members[s as usize].first() != Some(&g) {
                continue;
            }
            if let Some((score, _, _)) = self.best_action(s, p) {
                set.insert((score, g, s));
            }
        }
        self.index.insert((m, p), set);
    }

    /// Places, in the order given, up to `n` slices of each class `c` in `todo`; what finds no room is added to
    /// `unplaced`. Each `(model, profile)` index is kept from the first class of `todo` that can use it to the last.
    pub fn place_classes(&mut self, todo: &[(usize, u32)]) {
        let mut last: HashMap<(usize, ProfileIdx), usize> = HashMap::default();
        for (k, &(c, n)) in todo.iter().enumerate() {
            if n > 0 {
                for &pair in &self.pairs[self.pairs_at[c]..self.pairs_at[c + 1]] {
                    last.insert(pair, k);
                }
            }
        }
        let mut ending: Vec<Vec<(usize, ProfileIdx)>> = vec![Vec::new(); todo.len()];
        let mut pairs: Vec<_> = last.into_iter().collect();
        pairs.sort_unstable();
        for (pair, k) in pairs {
            ending[k].push(pair);
        }
        let mut eligible = Vec::new();
        for (k, &(c, n)) in todo.iter().enumerate() {
            if n == 0 {
                continue;
            }
            eligible.clear();
            eligible.extend_from_slice(&self.pairs[self.pairs_at[c]..self.pairs_at[c + 1]]);
            for &(m, p) in &eligible {
                self.make_live(m, p);
            }
            self.place_class(c, n, &eligible);
            for &(m, p) in &ending[k] {
                self.live[m][p] = false;
                self.index.remove(&(m, p));
            }
        }
    }

    /// Places up to `n` slices of class `c` (whose `(model, profile)` pairs are `eligible`, their indexes kept);
    /// what finds no room is added to `unplaced`.
    ///
    /// A slice takes the best head of the class's indexes. When that means changing a GPU not changed yet, the GPU
    /// chosen is the one that can take the most of the class's remaining slices (then best fit): opening the GPU
    /// that absorbs the whole class touches fewer GPUs than filling the fullest one and opening another. That scan
    /// runs at most once per GPU the plan touches.
    fn place_class(&mut self, c: usize, n: u32, eligible: &[(usize, ProfileIdx)]) {
        for placed in 0..n {
            #[cfg(test)]
            if self.check {
                self.check_in_step(eligible, n - placed);
            }
            let mut pick: Option<Pick> = None;
            for &(m, p) in eligible {
                if let Some(&(score, g, s)) = self.index.get(&(m, p)).and_then(|set| set.first())
                    && pick.is_none_or(|(bs, bg, _, _)| (score, g) < (bs, bg))
                {
                    pick = Some((score, g, s, p));
                }
            }
            if pick.is_some_and(|(score, _, _, _)| score.tier >= OPENS_GPU) {
                pick = self.pick_gpu_to_open(eligible, n - placed);
            }
            let Some((_, g, s, p)) = pick else {
                self.unplaced[c] += n - placed;
                return;
            };
            let Some((_, action, t)) = self.best_action(s, p) else {
                // Unreachable (the index only holds states with an action), but never lose a slice.
                self.unplaced[c] += 1;
                continue;
            };
            let g = g as usize;
            match action {
                Action::Bind(inst) => self.plans[g].bound.push((inst, c)),
                Action::New(p) => self.plans[g].new.push((p, c)),
            }
            self.move_gpu(g, t);
        }
    }

    /// Among states whose best action changes an untouched GPU: the one taking the most of `remaining` slices, then
    /// the best by score.
    fn pick_gpu_to_open(&mut self, eligible: &[(usize, ProfileIdx)], remaining: u32) -> Option<Pick> {
        let from = (Score { tier: OPENS_GPU, slack: 0, stranded: 0, addable: Reverse(u16::MAX) }, 0, 0);
        let limit = u8::try_from(remaining).unwrap_or(u8::MAX);
        let catalog = self.problem.catalog;
        let states = &mut *self.states;
        let mut heads: Vec<_> = eligible
            .iter()
            .filter_map(|&(m, p)| self.index.get(&(m, p)).map(|set| (set.range(from..).peekable(), p)))
            .collect();
        // Candidates come merged in (score, GPU) order, so tiers never decrease: once a candidate absorbs all that
        // is left, no later one beats it.
        let mut best: Option<(OpenKey, Pick)> = None;
        loop {
            let next = heads
                .iter_mut()
                .enumerate()
                .filter_map(|(k, (it, _))| it.peek().map(|&&(score, g, _)| ((score, g), k)))
                .min();
            let Some((_, k)) = next else { break };
            let (it, p) = &mut heads[k];
            let p = *p;
            let Some(&(score, g, s)) = it.next() else { break };
            if best.is_some_and(|((tier, Reverse(absorbs), _, _), _)| score.tier > tier || absorbs == limit) {
                break;
            }
            let absorbs = states.absorbs(catalog, s, p, limit);
            let key = (score.tier, Reverse(absorbs), score, g);
            if best.is_none_or(|(b, _)| key < b) {
                best = Some((key, (score, g, s, p)));
            }
        }
        best.map(|(_, pick)| pick)
    }

    /// Replaces what the plan does on GPU `g` (used by the improvement pass). The new plan must be feasible.
    pub fn set_plan(&mut self, g: usize, plan: GpuPlan) -> bool {
        let gpu = &self.problem.gpus[g];
        let mut fixed = gpu.in_use.clone();
        fixed.extend(plan.bound.iter().map(|&(i, _)| i));
        fixed.sort();
        let free: Vec<Inst> = gpu.free.iter().copied().filter(|f| !plan.bound.iter().any(|(b, _)| b == f)).collect();
        let mut new: Vec<ProfileIdx> = plan.new.iter().map(|&(p, _)| p).collect();
        new.sort_unstable();
        let t = self.intern(StateKey { model: gpu.model_idx, fixed, free, new });
        if self.states.evals[t as usize].is_none() {
            return false;
        }
        self.plans[g] = plan;
        self.move_gpu(g, t);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::synth::{self, DemandSpec, FleetSpec, Rng};
    use crate::planner::types::PlanInput;

    impl Packer<'_, '_, '_> {
        /// The index of `(m, p)` built by scanning every GPU: each state GPUs are in, once, at its lowest GPU.
        fn scan(&mut self, m: usize, p: ProfileIdx) -> BTreeSet<(Score, u32, StateId)> {
            let mut set = BTreeSet::new();
            for g in 0..self.gpu_state.len() {
                let Some(s) = self.gpu_state[g] else { continue };
                let lowest = self.gpu_state.iter().position(|&t| t == Some(s));
                if self.states.keys[s as usize].model != m || lowest != Some(g) {
                    continue;
                }
                if let Some((score, _, _)) = self.best_action(s, p) {
                    set.insert((score, g as u32, s));
                }
            }
            set
        }

        /// Slices of `p` a state takes along its chain of best actions, followed to the end.
        fn full_capacity(&mut self, mut s: StateId, p: ProfileIdx) -> u32 {
            let mut n = 0;
            while let Some((_, _, t)) = self.best_action(s, p) {
                n += 1;
                s = t;
            }
            n
        }

        pub(super) fn check_in_step(&mut self, eligible: &[(usize, ProfileIdx)], remaining: u32) {
            let mut candidates = Vec::new();
            for m in 0..self.live.len() {
                for p in 0..self.live[m].len() {
                    if !self.live[m][p] {
                        assert!(!self.index.contains_key(&(m, p)), "index of ({m}, {p}) kept while not live");
                        continue;
                    }
                    let scanned = self.scan(m, p);
                    assert_eq!(self.index.get(&(m, p)), Some(&scanned), "index of ({m}, {p}) out of step");
                    if eligible.contains(&(m, p)) {
                        candidates.extend(scanned.into_iter().map(|(score, g, s)| (score, g, s, p)));
                    }
                }
            }
            let mut best = None;
            for (score, g, s, p) in candidates.into_iter().filter(|c| c.0.tier >= OPENS_GPU) {
                let absorbs = self.full_capacity(s, p).min(remaining);
                let key = (score.tier, Reverse(absorbs), score, g);
                if best.is_none_or(|(b, _)| key < b) {
                    best = Some((key, (score, g, s, p)));
                }
            }
            assert_eq!(self.pick_gpu_to_open(eligible, remaining), best.map(|(_, pick)| pick));
        }
    }

    fn input(seed: u64) -> PlanInput {
        let catalog = Catalog::builtin();
        let mut rng = Rng::new(seed);
        let models: Vec<String> = ["A100-40GB", "A100-80GB", "H100-80GB", "A30-24GB"].map(String::from).to_vec();
        let busy = [0.0, 0.6][rng.below(2)];
        let fleet = FleetSpec { gpus: 10 + rng.below(30), models: models.clone(), busy, in_use: 0.5, cordoned: 0.05 };
        let gpus = synth::fleet(catalog, &mut rng, &fleet);
        let spec = DemandSpec { requests: 5 + rng.below(40), max_count: 4, constrained: 0.3 };
        let demand = synth::demand(catalog, &mut rng, &models, &spec);
        PlanInput { gpus, demand }
    }

    /// Indexes built when first needed and kept in step from then on hold what a scan of the fleet finds, and the
    /// GPU opened with the capacity counted only up to what is left is the one a full count picks; over two passes
    /// in different orders sharing one set of states, with the second placing what the first left.
    #[test]
    fn kept_indexes_and_opened_gpus_match_a_scan_of_the_fleet() {
        for seed in 0..60 {
            let input = input(seed);
            let problem = Problem::new(Catalog::builtin(), &input).expect("problem");
            let mut states = States::default();
            for reversed in [false, true] {
                let mut packer = Packer::new(&problem, &mut states);
                packer.check = true;
                let mut classes: Vec<usize> = (0..problem.classes.len()).collect();
                if reversed {
                    classes.reverse();
                }
                let todo: Vec<(usize, u32)> = classes.iter().map(|&c| (c, problem.classes[c].count)).collect();
                packer.place_classes(&todo);
                assert!(packer.index.is_empty(), "indexes kept after the last class that uses them");
                // Free half the GPUs' plans, as the improvement pass may, and place what that returns.
                for g in (0..problem.gpus.len()).step_by(2) {
                    let plan = std::mem::take(&mut packer.plans[g]);
                    for &(_, c) in &plan.bound {
                        packer.unplaced[c] += 1;
                    }
                    for &(_, c) in &plan.new {
                        packer.unplaced[c] += 1;
                    }
                    assert!(packer.set_plan(g, GpuPlan::default()));
                }
                let todo: Vec<(usize, u32)> =
                    classes.iter().map(|&c| (c, std::mem::take(&mut packer.unplaced[c]))).collect();
                packer.place_classes(&todo);
            }
        }
    }
}
