//! Making room by moving instances in use: when a GPU's free compute slices would hold more instances of a profile
//! but the instances in use sit where no placement of it is left (`fragmented`), which of them to move, and where,
//! so that the profile fits. Every instance in use keeps its profile; only its start changes. The fewest moves win:
//! each one restarts its holder's work.
//!
//! [`fleet_room`] answers for a group of GPUs of one model: which GPUs to re-lay out, moving as little as it can,
//! so that `count` instances of the profile fit among them.

use super::solve::{Inst, Occupancy, solve};
use crate::catalog::model::{GpuModel, ProfileIdx};

/// One GPU laid out again to make room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relayout {
    /// Instances in use that move: `(index into in_use, where it goes)`; the start always changes.
    pub moves: Vec<(usize, Inst)>,
    /// Where the instances of the profile go (as many as were asked for this GPU).
    pub new: Vec<Inst>,
}

/// Most instances in use on one GPU that [`make_room`] considers moving (subsets of them are searched).
pub const MAX_IN_USE: usize = 12;

/// Most GPUs [`fleet_room`] re-lays out in one answer.
pub const MAX_GPUS: usize = 64;

/// The fewest moves of instances in `in_use` (a valid layout) after which `want` instances of `profile` fit beside
/// them. `Some` with no moves when they fit as the GPU stands; `None` when no layout of the GPU holds them all (the
/// compute slices, the profile's maximum or the engines do not allow it), or `in_use` holds more than
/// [`MAX_IN_USE`] instances.
pub fn make_room(model: &GpuModel, in_use: &[Inst], profile: ProfileIdx, want: u8) -> Option<Relayout> {
    if in_use.len() > MAX_IN_USE || profile >= model.profiles.len() {
        return None;
    }
    let asked = vec![profile; usize::from(want)];
    // Moving everything is the most freedom there is: when that fails, nothing smaller succeeds.
    let everything: Vec<ProfileIdx> = in_use.iter().map(|i| i.profile).chain(asked.iter().copied()).collect();
    solve(model, &[], &[], &everything)?;
    let n = in_use.len();
    for size in 0..=n {
        for subset in (0u32..(1 << n)).filter(|s| s.count_ones() as usize == size) {
            let moved: Vec<usize> = (0..n).filter(|i| subset & (1 << i) != 0).collect();
            let fixed: Vec<Inst> = (0..n).filter(|i| subset & (1 << i) == 0).map(|i| in_use[i]).collect();
            let new: Vec<ProfileIdx> = moved.iter().map(|&i| in_use[i].profile).chain(asked.iter().copied()).collect();
            if let Some(sol) = solve(model, &fixed, &[], &new) {
                let moves =
                    moved.iter().zip(&sol.new).filter(|(i, to)| in_use[**i] != **to).map(|(i, to)| (*i, *to)).collect();
                return Some(Relayout { moves, new: sol.new[moved.len()..].to_vec() });
            }
        }
    }
    None
}

/// The most instances of `profile` that fit beside `in_use` where it stands (nothing moved).
pub fn fits_now(model: &GpuModel, in_use: &[Inst], profile: ProfileIdx) -> u8 {
    let mut most = 0u8;
    super::valid_supersets(model, in_use, &[profile], &mut |added| {
        most = most.max(u8::try_from(added.len()).unwrap_or(u8::MAX));
    });
    most
}

/// The most instances of `profile` that fit beside `in_use` once every instance in use may move.
pub fn fits_moved(model: &GpuModel, in_use: &[Inst], profile: ProfileIdx) -> u8 {
    let Some(p) = model.profiles.get(profile) else { return 0 };
    let occ = Occupancy::of(model, in_use);
    let by_compute = occ.free_compute(model) / p.compute_slices.max(1);
    let by_max = p.max_instances.saturating_sub(occ.counts[profile]);
    let mut k = by_compute.min(by_max);
    while k > 0 {
        let all: Vec<ProfileIdx> =
            in_use.iter().map(|i| i.profile).chain(std::iter::repeat_n(profile, k.into())).collect();
        if solve(model, &[], &[], &all).is_some() {
            return k;
        }
        k -= 1;
    }
    0
}

/// Which of `gpus` (each given by the instances in use on it, all of `model`) to lay out again, moving as few
/// instances in use as it can, so that `count` instances of `profile` fit among them, counting what fits without a
/// move. Each answer is `(index into gpus, its relayout)`, only for GPUs with moves, the GPUs that gain the most
/// first (among the first GPUs found whose gains cover the need: at most `4 * MAX_GPUS` are asked). `None` when
/// moving instances cannot make room for `count` within [`MAX_GPUS`] re-laid-out GPUs, or when nothing needs to
/// move.
pub fn fleet_room(
    model: &GpuModel,
    gpus: &[Vec<Inst>],
    profile: ProfileIdx,
    count: u32,
) -> Option<Vec<(usize, Relayout)>> {
    let p = model.profiles.get(profile)?;
    // What fits as the fleet stands, on the GPUs with compute slices enough for one more.
    let mut now = 0u32;
    let mut candidates: Vec<(usize, u8)> = Vec::new(); // (index, fits now)
    for (i, in_use) in gpus.iter().enumerate() {
        if in_use.len() > MAX_IN_USE || Occupancy::of(model, in_use).free_compute(model) < p.compute_slices {
            continue;
        }
        let fits = fits_now(model, in_use, profile);
        now += u32::from(fits);
        candidates.push((i, fits));
    }
    if now >= count {
        return None;
    }
    let need = count - now;
    // What moving would gain, asked of GPUs in order until the gains cover the need (the costly part is bounded).
    let mut gains: Vec<(u8, usize, u8)> = Vec::new(); // (gain, index, fits now)
    let mut covered = 0u32;
    for &(i, fits) in candidates.iter().take(MAX_GPUS * 4) {
        let moved = fits_moved(model, &gpus[i], profile);
        if moved > fits {
            gains.push((moved - fits, i, fits));
            covered += u32::from(moved - fits);
            if covered >= need {
                break;
            }
        }
    }
    if covered < need {
        return None;
    }
    gains.sort_by_key(|&(gain, i, _)| (std::cmp::Reverse(gain), i));
    let mut need = need;
    let mut out = Vec::new();
    for (gain, i, fits) in gains.into_iter().take(MAX_GPUS) {
        let extra = gain.min(u8::try_from(need).unwrap_or(u8::MAX));
        let relayout = make_room(model, &gpus[i], profile, fits + extra)?;
        need -= u32::from(extra);
        out.push((i, relayout));
        if need == 0 {
            return Some(out);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Catalog;

    fn inst(model: &GpuModel, profile: &str, start: u8) -> Inst {
        Inst { profile: model.profile_index(profile).expect("profile"), start }
    }

    #[test]
    fn a_scattered_gpu_moves_one_instance_to_make_room() {
        let catalog = Catalog::builtin();
        let h100 = catalog.model("H100-80GB").expect("H100");
        // 1g at units 0 and 4: five compute slices free, but both 3g placements (0 and 4) and the 4g (0) are cut.
        let in_use = [inst(h100, "1g.10gb", 0), inst(h100, "1g.10gb", 4)];
        let g3 = h100.profile_index("3g.40gb").expect("3g");
        assert_eq!(fits_now(h100, &in_use, g3), 0);
        assert_eq!(fits_moved(h100, &in_use, g3), 1);
        let r = make_room(h100, &in_use, g3, 1).expect("room");
        assert_eq!(r.moves.len(), 1, "{r:?}");
        let (moved, to) = r.moves[0];
        let mut after: Vec<Inst> = in_use.to_vec();
        after[moved] = to;
        after.extend(&r.new);
        assert_eq!(after.len(), 3);
        let occ = Occupancy::of(h100, &after);
        assert_eq!(
            after.iter().map(|i| i.mask(h100).count_ones()).sum::<u32>(),
            occ.mask.count_ones(),
            "no overlap: {after:?}"
        );
        assert!(after.iter().all(|i| h100.profiles[i.profile].placement_at(i.start).is_some()), "{after:?}");
    }

    #[test]
    fn nothing_moves_when_it_fits_and_nothing_helps_when_compute_is_short() {
        let catalog = Catalog::builtin();
        let h100 = catalog.model("H100-80GB").expect("H100");
        let g3 = h100.profile_index("3g.40gb").expect("3g");
        let in_use = [inst(h100, "1g.10gb", 0)];
        assert_eq!(make_room(h100, &in_use, g3, 1).expect("fits").moves, vec![]);
        let full = [inst(h100, "4g.40gb", 0), inst(h100, "2g.20gb", 4)];
        assert_eq!(make_room(h100, &full, g3, 1), None, "one compute slice is free");
        assert_eq!(fleet_room(h100, &[full.to_vec()], g3, 1), None);
    }

    #[test]
    fn instances_placed_exactly_reuse_free_ones_and_destroy_only_what_is_in_the_way() {
        use crate::layout::solve_at;
        let catalog = Catalog::builtin();
        let h100 = catalog.model("H100-80GB").expect("H100");
        let fixed = [inst(h100, "1g.10gb", 6)];
        let optional = [inst(h100, "2g.20gb", 0), inst(h100, "1g.10gb", 2), inst(h100, "1g.10gb", 4)];
        // A 1g at 4 is the free one there; a 1g at 0 sits inside the free 2g, which goes.
        let sol =
            solve_at(h100, &fixed, &optional, &[inst(h100, "1g.10gb", 4), inst(h100, "1g.10gb", 0)]).expect("valid");
        assert_eq!((sol.created(), sol.reused, sol.destroyed), (1, vec![Some(2), None], vec![0]));
        assert_eq!(solve_at(h100, &fixed, &optional, &[inst(h100, "1g.10gb", 6)]), None, "in use");
        assert_eq!(solve_at(h100, &fixed, &[], &[inst(h100, "3g.40gb", 1)]), None, "no such placement");
    }

    #[test]
    fn the_fleet_re_lays_out_only_what_the_count_needs() {
        let catalog = Catalog::builtin();
        let h100 = catalog.model("H100-80GB").expect("H100");
        let g3 = h100.profile_index("3g.40gb").expect("3g");
        let scattered = vec![inst(h100, "1g.10gb", 0), inst(h100, "1g.10gb", 4)];
        let empty = Vec::new();
        let gpus = vec![scattered.clone(), empty, scattered.clone()];
        // Two fit on the empty GPU; the third needs one scattered GPU re-laid out, not both.
        let answer = fleet_room(h100, &gpus, g3, 3).expect("room");
        assert_eq!(answer.len(), 1, "{answer:?}");
        assert_eq!(answer[0].1.new.len(), 1);
        assert_eq!(fleet_room(h100, &gpus, g3, 2), None, "fits now");
        assert_eq!(fleet_room(h100, &gpus, g3, 5), None, "four at most, even after moves");
        assert_eq!(fleet_room(h100, &gpus, g3, 4).map(|a| a.len()), Some(2));
    }
}
