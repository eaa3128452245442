//! Greedy packing of demand, one slice at a time, onto the GPU where it disturbs least.
//!
//! Each GPU is in a *state*: its fixed instances (in use, or handed out by this plan), its remaining free
//! instances (kept unless in the way) and the profiles this plan creates on it. States are interned, so GPUs that
//! look alike share one state and every question about a state (is it feasible, what does adding a profile cost)
//! is answered once. For every demanded `(model, profile)` an ordered index holds, per state, the best action a
//! slice of that profile has there and the state's lowest GPU index; placing a slice takes the best head among the
//! class's eligible `(model, profile)` indexes, so a step costs a few ordered-set operations, not a fleet scan.
//!
//! Actions are ranked by [`Score`]: hand out an existing free instance (tier 0); create on a GPU this plan
//! already changes (tier 1, or 2 if more free instances must go); create on an untouched GPU (tier 3, or 4 if free
//! instances must go). Within a tier, the GPU left with the least uncommitted compute wins (compute not taken by
//! instances in use, handed out or created by the plan; best fit keeps whole GPUs free for large profiles), then the
//! least stranded capacity, then the most placement choices left. A GPU not yet changed is opened by how much of the
//! request it can absorb first (see [`Packer::place_class`]).

use std::cmp::Reverse;
use std::collections::BTreeSet;

use rustc_hash::FxHashMap as HashMap;

use super::problem::Problem;
use crate::catalog::ProfileIdx;
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

/// Tiers from this one on change a GPU the plan has not changed yet.
const OPENS_GPU: u8 = 3;

/// Per demanded `(model, profile)`: states ordered by their best action, then their lowest GPU index.
type Index = HashMap<(usize, ProfileIdx), BTreeSet<(Score, u32, StateId)>>;

/// The packing state of a whole fleet.
pub(crate) struct Packer<'p, 'c> {
    pub problem: &'p Problem<'c>,
    pub plans: Vec<GpuPlan>,
    /// Per GPU; `None` for cordoned GPUs.
    gpu_state: Vec<Option<StateId>>,
    keys: Vec<StateKey>,
    ids: HashMap<StateKey, StateId>,
    evals: Vec<Option<Eval>>,
    members: Vec<BTreeSet<u32>>,
    best: HashMap<(StateId, ProfileIdx), Choice>,
    /// How many more slices of a profile a state can take (memoised along its chain of best actions).
    capacity: HashMap<(StateId, ProfileIdx), u8>,
    index: Index,
    demanded: Vec<Vec<ProfileIdx>>,
    /// Slices left unplaced, per class.
    pub unplaced: Vec<u32>,
}

impl<'p, 'c> Packer<'p, 'c> {
    pub fn new(problem: &'p Problem<'c>) -> Self {
        let mut packer = Packer {
            problem,
            plans: vec![GpuPlan::default(); problem.gpus.len()],
            gpu_state: vec![None; problem.gpus.len()],
            keys: Vec::new(),
            ids: HashMap::default(),
            evals: Vec::new(),
            members: Vec::new(),
            best: HashMap::default(),
            capacity: HashMap::default(),
            index: HashMap::default(),
            demanded: problem.demanded_profiles(),
            unplaced: vec![0; problem.classes.len()],
        };
        for (g, gpu) in problem.gpus.iter().enumerate() {
            if gpu.cordoned || packer.demanded[gpu.model_idx].is_empty() {
                continue;
            }
            let key = StateKey { model: gpu.model_idx, fixed: gpu.in_use.clone(), free: gpu.free.clone(), new: vec![] };
            let s = packer.intern(key);
            packer.gpu_state[g] = Some(s);
            packer.members[s as usize].insert(g as u32);
        }
        for s in 0..packer.keys.len() as StateId {
            if let Some(&min) = packer.members[s as usize].first() {
                packer.reindex(s, None, Some(min));
            }
        }
        packer
    }

    /// The state key of a GPU, if it takes part.
    pub fn key_of(&self, g: usize) -> Option<&StateKey> {
        self.gpu_state[g].map(|s| &self.keys[s as usize])
    }

    fn intern(&mut self, key: StateKey) -> StateId {
        if let Some(&id) = self.ids.get(&key) {
            return id;
        }
        let model = &self.problem.catalog.models[key.model];
        let eval = solve(model, &key.fixed, &key.free, &key.new).map(|sol| Eval {
            destroyed: sol.destroyed.len() as u8,
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
        self.keys.push(key.clone());
        self.ids.insert(key, id);
        self.evals.push(eval);
        self.members.push(BTreeSet::new());
        id
    }

    fn best_action(&mut self, s: StateId, p: ProfileIdx) -> Choice {
        if let Some(&c) = self.best.get(&(s, p)) {
            return c;
        }
        let key = self.keys[s as usize].clone();
        let model = &self.problem.catalog.models[key.model];
        let cur = self.evals[s as usize]?;
        let mut actions: Vec<(Action, StateKey)> = Vec::new();
        let mut last = None;
        for (k, &f) in key.free.iter().enumerate() {
            if f.profile != p || last == Some(f) {
                continue;
            }
            last = Some(f);
            let mut next = key.clone();
            next.free.remove(k);
            let at = next.fixed.partition_point(|x| *x < f);
            next.fixed.insert(at, f);
            actions.push((Action::Bind(f), next));
        }
        let mut next = key.clone();
        let at = next.new.partition_point(|x| *x < p);
        next.new.insert(at, p);
        actions.push((Action::New(p), next));

        let mut choice: Choice = None;
        for (action, next_key) in actions {
            // Creating ranks below handing out (tier 1 and up against tier 0): with a free instance to hand out, the
            // new instance's layout (an exhaustive search) need not be solved.
            if matches!(action, Action::New(_)) && choice.is_some_and(|(best, _, _)| best.tier == 0) {
                continue;
            }
            let t = self.intern(next_key);
            let Some(ev) = self.evals[t as usize] else {
                continue;
            };
            let tier = match action {
                Action::Bind(_) => 0,
                Action::New(_) => (if key.new.is_empty() { 3 } else { 1 }) + u8::from(ev.destroyed > cur.destroyed),
            };
            let score = Score {
                tier,
                slack: model.compute_slices_total.saturating_sub(ev.committed),
                stranded: ev.fragmentation.stranded,
                addable: Reverse(ev.fragmentation.addable),
            };
            if choice.is_none_or(|(best, _, _)| score < best) {
                choice = Some((score, action, t));
            }
        }
        self.best.insert((s, p), choice);
        choice
    }

    fn capacity(&mut self, s: StateId, p: ProfileIdx) -> u8 {
        if let Some(&c) = self.capacity.get(&(s, p)) {
            return c;
        }
        let c = match self.best_action(s, p) {
            Some((_, _, t)) => 1 + self.capacity(t, p),
            None => 0,
        };
        self.capacity.insert((s, p), c);
        c
    }

    fn reindex(&mut self, s: StateId, old_min: Option<u32>, new_min: Option<u32>) {
        let model = self.keys[s as usize].model;
        for p in self.demanded[model].clone() {
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

    /// Places up to `n` slices of class `c`; what finds no room is added to `unplaced`.
    ///
    /// A slice takes the best head of the class's indexes. When that means changing a GPU not changed yet, the GPU
    /// chosen is the one that can take the most of the class's remaining slices (then best fit): opening the GPU
    /// that absorbs the whole class touches fewer GPUs than filling the fullest one and opening another. That scan
    /// runs at most once per GPU the plan touches.
    pub fn place_class(&mut self, c: usize, n: u32) {
        let eligible: Vec<(usize, ProfileIdx)> =
            self.problem.classes[c].eligible.iter().enumerate().filter_map(|(m, p)| p.map(|p| (m, p))).collect();
        for placed in 0..n {
            let mut pick: Option<Pick> = None;
            for &(m, p) in &eligible {
                if let Some(&(score, g, s)) = self.index.get(&(m, p)).and_then(|set| set.first())
                    && pick.is_none_or(|(bs, bg, _, _)| (score, g) < (bs, bg))
                {
                    pick = Some((score, g, s, p));
                }
            }
            if pick.is_some_and(|(score, _, _, _)| score.tier >= OPENS_GPU) {
                pick = self.pick_gpu_to_open(&eligible, n - placed);
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
        let mut candidates = Vec::new();
        for &(m, p) in eligible {
            if let Some(set) = self.index.get(&(m, p)) {
                candidates.extend(set.range(from..).map(|&(score, g, s)| (score, g, s, p)));
            }
        }
        let keyed: Vec<_> = candidates
            .into_iter()
            .map(|(score, g, s, p)| {
                let absorbs = u32::from(self.capacity(s, p)).min(remaining);
                ((score.tier, Reverse(absorbs), score, g), (score, g, s, p))
            })
            .collect();
        keyed.into_iter().min_by_key(|(key, _)| *key).map(|(_, pick)| pick)
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
        if self.evals[t as usize].is_none() {
            return false;
        }
        self.plans[g] = plan;
        self.move_gpu(g, t);
        true
    }
}
