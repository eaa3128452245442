//! Placement search on one GPU: where to put new instances next to the ones that must stay, which free instances
//! to destroy to make room (as few as possible), and how fragmented the result is.
//!
//! MIG geometry is tiny (at most 16 placement units, a handful of placements per profile), so the search is an
//! exhaustive depth-first search over placements with symmetry breaking (instances of one profile are placed in
//! increasing start order) and the widest, most constrained instances first. Among all complete placements it keeps
//! the one that destroys the fewest existing instances, then leaves the least stranded capacity
//! ([`Fragmentation`]).

use crate::catalog::model::{ENGINES, GpuModel, ProfileIdx, UnitMask};

pub use crate::catalog::model::MAX_PROFILES;

/// A MIG instance by profile index and start unit: the compact form the engine works on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Inst {
    /// Index into the model's profiles.
    pub profile: ProfileIdx,
    /// First placement unit.
    pub start: u8,
}

impl Inst {
    /// The units this instance covers on `model`.
    pub fn mask(self, model: &GpuModel) -> UnitMask {
        crate::catalog::model::units_mask(self.start, model.profiles[self.profile].size())
    }
}

/// What a set of instances occupies on a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Occupancy {
    /// Covered placement units.
    pub mask: UnitMask,
    /// Compute slices in use.
    pub compute: u8,
    /// Instances per profile index.
    pub counts: [u8; MAX_PROFILES],
    /// Engines owned, per kind of [`crate::catalog::model::ENGINES`].
    pub engines: [u8; ENGINES.len()],
}

impl Occupancy {
    /// Nothing placed.
    pub const EMPTY: Occupancy =
        Occupancy { mask: 0, compute: 0, counts: [0; MAX_PROFILES], engines: [0; ENGINES.len()] };

    /// The occupancy of `insts` (assumed not to overlap).
    pub fn of(model: &GpuModel, insts: &[Inst]) -> Occupancy {
        let mut occ = Occupancy::EMPTY;
        for &i in insts {
            occ.add(model, i);
        }
        occ
    }

    /// Adds an instance (no checks).
    pub fn add(&mut self, model: &GpuModel, inst: Inst) {
        let p = &model.profiles[inst.profile];
        self.mask |= inst.mask(model);
        self.compute = self.compute.saturating_add(p.compute_slices);
        self.counts[inst.profile] = self.counts[inst.profile].saturating_add(1);
        for (e, n) in self.engines.iter_mut().zip(p.engine_needs) {
            *e = e.saturating_add(n);
        }
    }

    /// Whether the instances fit the GPU's engines (where the catalog lets them be checked).
    pub fn engines_fit(&self, model: &GpuModel) -> bool {
        self.engines.iter().zip(model.engine_limits).all(|(&used, limit)| limit.is_none_or(|l| used <= l))
    }

    /// Whether adding a `profile` keeps within the profile's maximum, the compute slices and the engines.
    pub fn has_room_for(&self, model: &GpuModel, profile: ProfileIdx) -> bool {
        let p = &model.profiles[profile];
        self.counts[profile] < p.max_instances
            && self.compute + p.compute_slices <= model.compute_slices_total
            && self
                .engines
                .iter()
                .zip(p.engine_needs)
                .zip(model.engine_limits)
                .all(|((&used, need), limit)| limit.is_none_or(|l| u16::from(used) + u16::from(need) <= u16::from(l)))
    }

    /// Whether `inst` can be added: its placement is allowed, its units are free, and neither the profile's maximum
    /// nor the compute slices are exceeded.
    pub fn can_add(&self, model: &GpuModel, inst: Inst) -> bool {
        model.profiles[inst.profile].placement_at(inst.start).is_some()
            && self.mask & inst.mask(model) == 0
            && self.has_room_for(model, inst.profile)
    }

    /// Whether some placement of `profile` can be added.
    pub fn can_add_profile(&self, model: &GpuModel, profile: ProfileIdx) -> bool {
        model.profiles[profile].placements.iter().any(|pl| self.can_add(model, Inst { profile, start: pl.start }))
    }

    /// Compute slices still free.
    pub fn free_compute(&self, model: &GpuModel) -> u8 {
        model.compute_slices_total.saturating_sub(self.compute)
    }
}

/// How badly a GPU's free capacity is cut up. Smaller is better; compare with [`Fragmentation::key`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Fragmentation {
    /// Free compute slices that even the largest profile still creatable cannot use: 0 when the free space is one
    /// block that the largest fitting profile fills.
    pub stranded: u8,
    /// How many `(profile, start)` pairs could still be added; more means more choice later.
    pub addable: u16,
}

impl Fragmentation {
    /// Of a GPU with this occupancy.
    pub fn of(model: &GpuModel, occ: &Occupancy) -> Fragmentation {
        let mut largest = 0u8;
        let mut addable = 0u16;
        for (profile, p) in model.profiles.iter().enumerate() {
            for pl in &p.placements {
                if occ.can_add(model, Inst { profile, start: pl.start }) {
                    addable += 1;
                    largest = largest.max(p.compute_slices);
                }
            }
        }
        Fragmentation { stranded: occ.free_compute(model) - largest.min(occ.free_compute(model)), addable }
    }

    /// Sort key: smaller is better.
    pub fn key(&self) -> (u8, std::cmp::Reverse<u16>) {
        (self.stranded, std::cmp::Reverse(self.addable))
    }
}

/// Where new instances go and what must be destroyed for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Solution {
    /// Placements of the new instances, in the order they were asked for.
    pub new: Vec<Inst>,
    /// Indexes (into `optional`) of existing instances to destroy.
    pub destroyed: Vec<usize>,
    /// Per new instance: the index (into `optional`) of the existing instance it is, when it sits exactly where an
    /// existing free instance of its profile sits (that instance is handed out, not destroyed and re-created).
    pub reused: Vec<Option<usize>>,
    /// Fragmentation of the resulting layout.
    pub fragmentation: Fragmentation,
}

/// A solution applied to its GPU: the complete new layout and the instances created (both by start), and those
/// destroyed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The complete new layout.
    pub layout: Vec<Inst>,
    /// Instances to create.
    pub created: Vec<Inst>,
    /// Instances to destroy.
    pub destroyed: Vec<Inst>,
}

impl Solution {
    /// Instances this solution creates.
    pub fn created(&self) -> usize {
        self.reused.iter().filter(|r| r.is_none()).count()
    }

    /// What it does to the GPU it was solved for, holding `fixed` and the free instances `optional` (the same
    /// slices passed to [`solve`] or [`solve_at`]).
    pub fn apply(&self, fixed: &[Inst], optional: &[Inst]) -> Applied {
        let mut created: Vec<Inst> =
            self.new.iter().zip(&self.reused).filter(|(_, r)| r.is_none()).map(|(&i, _)| i).collect();
        let destroyed: Vec<Inst> = self.destroyed.iter().map(|&k| optional[k]).collect();
        let reused: Vec<Inst> = self.reused.iter().flatten().map(|&k| optional[k]).collect();
        let mut layout: Vec<Inst> = fixed
            .iter()
            .copied()
            .chain(optional.iter().copied().filter(|f| !destroyed.contains(f) && !reused.contains(f)))
            .chain(self.new.iter().copied())
            .collect();
        layout.sort_by_key(|i| (i.start, i.profile));
        created.sort_by_key(|i| (i.start, i.profile));
        Applied { layout, created, destroyed }
    }

    fn key(&self) -> (usize, usize, u8, std::cmp::Reverse<u16>) {
        let (s, a) = self.fragmentation.key();
        (self.destroyed.len(), self.created(), s, a)
    }
}

/// Places `new` profiles on a GPU that holds `fixed` instances (never moved or destroyed) and `optional` ones
/// (existing free instances: kept unless they are in the way). Returns the best solution, or `None` when no
/// placement exists even after destroying every optional instance.
///
/// `fixed` and `optional` together must form a valid layout.
pub fn solve(model: &GpuModel, fixed: &[Inst], optional: &[Inst], new: &[ProfileIdx]) -> Option<Solution> {
    let fixed_occ = Occupancy::of(model, fixed);
    // Counts, compute and engines do not depend on where instances sit: check them before searching placements.
    let mut need = fixed_occ;
    for &p in new {
        need.add(model, Inst { profile: p, start: model.profiles[p].placements[0].start });
    }
    if need.compute > model.compute_slices_total
        || new.iter().any(|&p| need.counts[p] > model.profiles[p].max_instances)
        || !need.engines_fit(model)
    {
        return None;
    }
    // Widest first, then the fewest placement choices, then by profile so equal profiles are adjacent.
    let mut order: Vec<usize> = (0..new.len()).collect();
    order.sort_by_key(|&i| {
        let p = &model.profiles[new[i]];
        (std::cmp::Reverse(p.size()), p.placements.len(), new[i])
    });
    let mut search =
        Search { model, fixed_occ, optional, new, order: &order, chosen: vec![0u8; new.len()], best: None };
    search.dfs(0, fixed_occ.mask, 0);
    search.best
}

struct Search<'a> {
    model: &'a GpuModel,
    fixed_occ: Occupancy,
    optional: &'a [Inst],
    new: &'a [ProfileIdx],
    order: &'a [usize],
    /// Start chosen for each position of `order`.
    chosen: Vec<u8>,
    best: Option<Solution>,
}

impl Search<'_> {
    fn dfs(&mut self, depth: usize, used: UnitMask, new_mask: UnitMask) {
        if depth == self.order.len() {
            self.leaf(new_mask);
            return;
        }
        let profile = self.new[self.order[depth]];
        let min_start = match depth.checked_sub(1) {
            Some(prev) if self.new[self.order[prev]] == profile => Some(self.chosen[prev]),
            _ => None,
        };
        for pl in &self.model.profiles[profile].placements {
            if min_start.is_some_and(|m| pl.start <= m) {
                continue;
            }
            let m = pl.mask();
            if used & m != 0 {
                continue;
            }
            self.chosen[depth] = pl.start;
            self.dfs(depth + 1, used | m, new_mask | m);
        }
    }

    fn leaf(&mut self, new_mask: UnitMask) {
        let model = self.model;
        let mut new = vec![Inst { profile: 0, start: 0 }; self.new.len()];
        for (pos, &i) in self.order.iter().enumerate() {
            new[i] = Inst { profile: self.new[i], start: self.chosen[pos] };
        }
        let candidate = finish(model, self.fixed_occ, self.optional, new, new_mask);
        if self.best.as_ref().is_none_or(|b| candidate.key() < b.key()) {
            self.best = Some(candidate);
        }
    }
}

/// Puts `new` exactly where they are given, beside `fixed` (never moved or destroyed) and `optional` (existing free
/// instances: kept unless in the way). `None` when `fixed` and `new` together are not a valid layout (a placement
/// not allowed, an overlap, a maximum, the compute slices or the engines).
pub fn solve_at(model: &GpuModel, fixed: &[Inst], optional: &[Inst], new: &[Inst]) -> Option<Solution> {
    let fixed_occ = Occupancy::of(model, fixed);
    let mut occ = fixed_occ;
    let mut new_mask: UnitMask = 0;
    for &i in new {
        if i.profile >= model.profiles.len() || !occ.can_add(model, i) {
            return None;
        }
        occ.add(model, i);
        new_mask |= i.mask(model);
    }
    if !occ.engines_fit(model) {
        return None;
    }
    Some(finish(model, fixed_occ, optional, new.to_vec(), new_mask))
}

/// The solution with `new` placed: which optional instances it hands out, keeps and destroys.
fn finish(model: &GpuModel, fixed_occ: Occupancy, optional: &[Inst], new: Vec<Inst>, new_mask: UnitMask) -> Solution {
    let mut occ = fixed_occ;
    for &inst in &new {
        occ.add(model, inst);
    }
    let mut reused: Vec<Option<usize>> = vec![None; new.len()];
    for (i, inst) in new.iter().enumerate() {
        reused[i] = optional.iter().position(|o| o == inst);
    }
    // Keep every other optional instance not in the way, unless it breaks a maximum or the compute total:
    // keeping the smallest first destroys as few as possible.
    let mut kept: Vec<usize> = (0..optional.len())
        .filter(|k| !reused.contains(&Some(*k)) && optional[*k].mask(model) & new_mask == 0)
        .collect();
    kept.sort_by_key(|&i| model.profiles[optional[i].profile].compute_slices);
    let mut keep = Vec::with_capacity(kept.len());
    for i in kept {
        let inst = optional[i];
        if occ.has_room_for(model, inst.profile) {
            occ.add(model, inst);
            keep.push(i);
        }
    }
    let destroyed: Vec<usize> =
        (0..optional.len()).filter(|i| !keep.contains(i) && !reused.contains(&Some(*i))).collect();
    Solution { new, destroyed, reused, fragmentation: Fragmentation::of(model, &occ) }
}
