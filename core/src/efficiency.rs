//! How much of a MIG GPU's capacity is allocated, free and placeable, or stranded.
//!
//! A GPU's compute slices are *allocated* when instances in use hold them. The rest are free; of those, the
//! *placeable* ones are the most that instances of the profiles people ask for could take beside the instances in
//! use (free instances can be destroyed and others created: only what is in use is fixed), given the legal
//! placements, the profiles' maxima and the engines. The free slices no such set of instances can take are
//! *stranded*: capacity that exists and that nobody can be given without moving someone.

use crate::catalog::GpuModel;
use crate::layout::{Inst, Occupancy};

/// A MIG GPU's compute slices by what they can do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capacity {
    /// Held by instances in use.
    pub allocated: u8,
    /// Free, and usable by instances of the demanded profiles.
    pub placeable: u8,
    /// Free, and usable by no set of instances of the demanded profiles.
    pub stranded: u8,
}

/// The capacity of a GPU of `model` whose instances in use are `in_use`, for the profiles `demanded` (indices into
/// `model.profiles`; an empty list leaves every free slice stranded).
pub fn capacity(model: &GpuModel, in_use: &[Inst], demanded: &[usize]) -> Capacity {
    let occ = Occupancy::of(model, in_use);
    let free = occ.free_compute(model);
    let pairs: Vec<Inst> = demanded
        .iter()
        .filter(|&&p| p < model.profiles.len())
        .flat_map(|&p| model.profiles[p].placements.iter().map(move |pl| Inst { profile: p, start: pl.start }))
        .collect();
    let placeable = most_compute(model, occ, &pairs).min(free);
    Capacity { allocated: occ.compute, placeable, stranded: free - placeable }
}

/// The most compute slices instances from `pairs` (each placement at most once) can add to `occ`: an exhaustive
/// search over the sets of non-overlapping placements, which on the catalog's models is a few hundred at most (the
/// server judges GPUs alike once).
fn most_compute(model: &GpuModel, occ: Occupancy, pairs: &[Inst]) -> u8 {
    let mut best = 0u8;
    for (k, &inst) in pairs.iter().enumerate() {
        if occ.can_add(model, inst) {
            let mut next = occ;
            next.add(model, inst);
            let gain = model.profiles[inst.profile].compute_slices + most_compute(model, next, &pairs[k + 1..]);
            best = best.max(gain);
            if best == occ.free_compute(model) {
                break;
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Catalog;

    fn h100() -> &'static GpuModel {
        Catalog::builtin().model("H100-80GB").expect("H100")
    }

    fn inst(m: &GpuModel, profile: &str, start: u8) -> Inst {
        Inst { profile: m.profile_index(profile).expect("profile"), start }
    }

    #[test]
    fn an_empty_gpu_is_all_placeable_for_a_profile_that_tiles_it() {
        let m = h100();
        let c = capacity(m, &[], &[m.profile_index("1g.10gb").expect("1g")]);
        assert_eq!(c, Capacity { allocated: 0, placeable: 7, stranded: 0 });
    }

    #[test]
    fn free_slices_that_no_demanded_profile_fits_are_stranded() {
        let m = h100();
        // A 1g instance in use at unit 0 and another at unit 4: no 4g (units 0-3) and no 7g fit.
        let used = [inst(m, "1g.10gb", 0), inst(m, "1g.10gb", 4)];
        let four = m.profile_index("4g.40gb").expect("4g");
        let c = capacity(m, &used, &[four]);
        assert_eq!((c.allocated, c.placeable, c.stranded), (2, 0, 5));
        // A 3g starts at unit 0 or 4, both taken.
        let three = m.profile_index("3g.40gb").expect("3g");
        assert_eq!(capacity(m, &used, &[four, three]).placeable, 0);
        // A 2g starts at unit 0, 2 or 4: only the one at 2 fits, and the other three free slices are stranded.
        let two = m.profile_index("2g.20gb").expect("2g");
        let c = capacity(m, &used, &[two]);
        assert_eq!((c.placeable, c.stranded), (2, 3));
        // 1g instances take every free slice.
        let one = m.profile_index("1g.10gb").expect("1g");
        assert_eq!(capacity(m, &used, &[two, one]).stranded, 0);
        // Nothing asked for: every free slice is stranded.
        assert_eq!(capacity(m, &used, &[]).stranded, 5);
    }

    #[test]
    fn a_full_gpu_has_nothing_free() {
        let m = h100();
        let c = capacity(m, &[inst(m, "7g.80gb", 0)], &[m.profile_index("1g.10gb").expect("1g")]);
        assert_eq!(c, Capacity { allocated: 7, placeable: 0, stranded: 0 });
    }
}
