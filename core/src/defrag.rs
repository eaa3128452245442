//! Defragmentation of MIG layouts.
//!
//! A request is placed at once on a free instance of its profile; anything else needs a layout change, which waits
//! for an admin unless the GPU has auto-layout. A GPU whose free units are cut into instances nobody asks for (or
//! not laid out at all) makes every request wait for that change. [`defragment`] lays the free part out again: it
//! keeps every instance held (in use, or kept for an approved request), touches only free instances and free
//! units, and chooses, over every valid layout, the one with the most free instances of the *target* profile (the
//! largest profile people ask for, unless an admin names one), then the most compute slices in free instances of
//! the demanded profiles, then the fewest instances created or destroyed. It never leaves fewer target instances
//! or fewer ready slices than the GPU has now, and proposes nothing unless one of them grows.
//!
//! Slices held by instances in use stay where they are, so the capacity [`crate::efficiency`] calls stranded
//! (free slices no demanded instance can take beside those in use) is the same before and after: only moving a
//! holder changes it.

use crate::catalog::GpuModel;
use crate::layout::{Inst, Occupancy, valid_supersets};

/// What a GPU's layout has ready for the profiles people ask for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Readiness {
    /// Free instances of the target profile: requests for it are placed on them at once.
    pub target: u8,
    /// Compute slices in free instances of the demanded profiles (the target included).
    pub ready: u8,
    /// Free compute slices in no such instance: a request gets them only after a layout change.
    pub not_ready: u8,
}

/// A new layout for one GPU and what it changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Defrag {
    /// The complete new layout, sorted by start then profile.
    pub layout: Vec<Inst>,
    /// Instances it creates.
    pub created: Vec<Inst>,
    /// Free instances it destroys.
    pub destroyed: Vec<Inst>,
    /// The GPU as it is.
    pub before: Readiness,
    /// The GPU laid out again.
    pub after: Readiness,
}

/// The largest of `demanded` (indices into `model.profiles`): the most compute slices, then the most memory, then
/// the lowest index. `None` when nothing valid is asked for.
pub fn largest(model: &GpuModel, demanded: &[usize]) -> Option<usize> {
    demanded.iter().copied().filter(|&p| p < model.profiles.len()).max_by(|&a, &b| {
        let (pa, pb) = (&model.profiles[a], &model.profiles[b]);
        (pa.compute_slices, pa.memory_slices).cmp(&(pb.compute_slices, pb.memory_slices)).then(b.cmp(&a))
    })
}

/// What `layout` (the GPU's instances) has ready, given the instances `held` (each also in `layout`, or about to
/// be created for an approved request), the `demanded` profiles and the `target` profile.
pub fn readiness(model: &GpuModel, layout: &[Inst], held: &[Inst], demanded: &[usize], target: usize) -> Readiness {
    let free = free_instances(layout, held);
    measure(model, &free, held, demanded, target)
}

/// The layout that readies the most instances of `target`, then the most slices for `demanded`, then changes
/// least; `None` when no valid layout beats `layout` on either without losing on the other, when `held` is not a
/// valid set of instances, or when `target` is not a profile of `model`.
pub fn defragment(
    model: &GpuModel,
    layout: &[Inst],
    held: &[Inst],
    demanded: &[usize],
    target: usize,
) -> Option<Defrag> {
    if target >= model.profiles.len() {
        return None;
    }
    let mut base: Vec<Inst> = held.to_vec();
    base.sort_unstable();
    base.dedup();
    let mut occ = Occupancy::EMPTY;
    for &i in &base {
        if i.profile >= model.profiles.len() || !occ.can_add(model, i) {
            return None;
        }
        occ.add(model, i);
    }
    let old_free = free_instances(layout, &base);
    let before = measure(model, &old_free, &base, demanded, target);
    // Candidates: the demanded profiles, the target, and those of the free instances (kept when nothing is gained
    // by destroying them).
    let mut profiles: Vec<usize> = demanded.iter().copied().filter(|&p| p < model.profiles.len()).collect();
    profiles.push(target);
    profiles.extend(old_free.iter().map(|i| i.profile));
    profiles.sort_unstable();
    profiles.dedup();
    let wanted = |p: usize| p == target || demanded.contains(&p);
    // (target instances, ready slices, fewer changes) and the instances added.
    type Scored = ((u8, u8, std::cmp::Reverse<usize>), Vec<Inst>);
    let mut best: Option<Scored> = None;
    valid_supersets(model, &base, &profiles, &mut |added| {
        let target_n = added.iter().filter(|i| i.profile == target).count();
        let ready: u32 = added
            .iter()
            .filter(|i| wanted(i.profile))
            .map(|i| u32::from(model.profiles[i.profile].compute_slices))
            .sum();
        let (target_n, ready) = (u8::try_from(target_n).unwrap_or(u8::MAX), u8::try_from(ready).unwrap_or(u8::MAX));
        if target_n < before.target || ready < before.ready {
            return;
        }
        let kept = added.iter().filter(|i| old_free.contains(i)).count();
        let changes = (added.len() - kept) + (old_free.len() - kept);
        let key = (target_n, ready, std::cmp::Reverse(changes));
        if best.as_ref().is_none_or(|(k, _)| key > *k) {
            best = Some((key, added.to_vec()));
        }
    });
    let ((target_n, ready, _), added) = best?;
    if (target_n, ready) == (before.target, before.ready) {
        return None;
    }
    let mut new: Vec<Inst> = base.iter().chain(added.iter()).copied().collect();
    new.sort_by_key(|i| (i.start, i.profile));
    let created: Vec<Inst> = new.iter().filter(|i| !layout.contains(i)).copied().collect();
    let destroyed: Vec<Inst> = layout.iter().filter(|i| !new.contains(i)).copied().collect();
    let after = measure(model, &added, &base, demanded, target);
    Some(Defrag { layout: new, created, destroyed, before, after })
}

/// The instances of `layout` not in `held` (each held instance matches one instance of the layout at most).
fn free_instances(layout: &[Inst], held: &[Inst]) -> Vec<Inst> {
    let mut left: Vec<Inst> = held.to_vec();
    layout
        .iter()
        .filter(|i| match left.iter().position(|h| h == *i) {
            Some(k) => {
                left.swap_remove(k);
                false
            }
            None => true,
        })
        .copied()
        .collect()
}

fn measure(model: &GpuModel, free: &[Inst], held: &[Inst], demanded: &[usize], target: usize) -> Readiness {
    let slices = |i: &Inst| u32::from(model.profiles.get(i.profile).map_or(0, |p| p.compute_slices));
    let held_slices: u32 = held.iter().map(slices).sum();
    let wanted = |p: usize| p == target || demanded.contains(&p);
    let ready: u32 = free.iter().filter(|i| wanted(i.profile)).map(slices).sum();
    let free_slices = u32::from(model.compute_slices_total).saturating_sub(held_slices);
    let clamp = |v: u32| u8::try_from(v).unwrap_or(u8::MAX);
    Readiness {
        target: clamp(u32::try_from(free.iter().filter(|i| i.profile == target).count()).unwrap_or(u32::MAX)),
        ready: clamp(ready.min(free_slices)),
        not_ready: clamp(free_slices.saturating_sub(ready)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Catalog;
    use crate::layout::{InstanceSpec, validate};
    use crate::planner::synth::Rng;

    fn h100() -> &'static GpuModel {
        Catalog::builtin().model("H100-80GB").expect("H100")
    }

    fn inst(m: &GpuModel, profile: &str, start: u8) -> Inst {
        Inst { profile: m.profile_index(profile).expect("profile"), start }
    }

    fn specs_of(m: &GpuModel, layout: &[Inst]) -> Vec<InstanceSpec> {
        layout
            .iter()
            .map(|i| InstanceSpec { profile: m.profiles[i.profile].name.clone(), start: Some(i.start) })
            .collect()
    }

    fn p(m: &GpuModel, profile: &str) -> usize {
        m.profile_index(profile).expect("profile")
    }

    #[test]
    fn free_small_instances_become_the_large_profile_asked_for() {
        let m = h100();
        // Free 1g instances at units 0-2, a held one at 6. 3g and 1g are asked for.
        let layout = [inst(m, "1g.10gb", 0), inst(m, "1g.10gb", 1), inst(m, "1g.10gb", 2), inst(m, "1g.10gb", 6)];
        let held = [inst(m, "1g.10gb", 6)];
        let demanded = [p(m, "1g.10gb"), p(m, "3g.40gb")];
        let target = largest(m, &demanded).expect("largest");
        assert_eq!(target, p(m, "3g.40gb"));
        let d = defragment(m, &layout, &held, &demanded, target).expect("a better layout");
        assert_eq!(d.before, Readiness { target: 0, ready: 3, not_ready: 3 });
        // A 3g on units 0-3, 1g instances on the units left beside the held one. Its memory units 0-3 leave one
        // compute slice that nothing can take.
        assert_eq!(d.after, Readiness { target: 1, ready: 5, not_ready: 1 });
        assert_eq!(d.created, vec![inst(m, "3g.40gb", 0), inst(m, "1g.10gb", 4), inst(m, "1g.10gb", 5)]);
        assert_eq!(d.destroyed, layout[..3].to_vec());
        assert!(d.layout.contains(&inst(m, "1g.10gb", 6)), "the held instance stays");
        validate(m, &specs_of(m, &d.layout)).expect("valid");
    }

    #[test]
    fn ready_slices_are_never_traded_for_a_larger_instance() {
        let m = h100();
        // Seven 1g instances, the one at 6 held: a 3g on units 0-3 would take the place of four ready slices with
        // three.
        let layout: Vec<Inst> = (0..7).map(|u| inst(m, "1g.10gb", u)).collect();
        let demanded = [p(m, "1g.10gb"), p(m, "3g.40gb")];
        assert_eq!(defragment(m, &layout, &layout[6..], &demanded, p(m, "3g.40gb")), None);
        // Nothing held, no 1g asked for: one 7g beats seven instances nobody wants.
        let d = defragment(m, &layout, &[], &[p(m, "7g.80gb")], p(m, "7g.80gb")).expect("better");
        assert_eq!((d.before, d.after.target, d.after.ready), (Readiness { target: 0, ready: 0, not_ready: 7 }, 1, 7));
        assert_eq!(d.destroyed.len(), 7);
    }

    #[test]
    fn a_layout_already_best_is_left_alone() {
        let m = h100();
        let layout = [inst(m, "7g.80gb", 0)];
        let demanded = [p(m, "7g.80gb")];
        assert_eq!(defragment(m, &layout, &[], &demanded, demanded[0]), None);
        // Held whole: nothing free to lay out.
        assert_eq!(defragment(m, &layout, &layout, &demanded, demanded[0]), None);
    }

    #[test]
    fn free_units_outside_any_instance_are_laid_out() {
        let m = h100();
        let held = [inst(m, "3g.40gb", 4)];
        let demanded = [p(m, "3g.40gb"), p(m, "1g.10gb")];
        let d = defragment(m, &held, &held, &demanded, p(m, "3g.40gb")).expect("better");
        assert_eq!(d.before, Readiness { target: 0, ready: 0, not_ready: 4 });
        assert_eq!((d.after.target, d.after.ready), (1, 3), "{d:?}");
        assert!(d.destroyed.is_empty());
    }

    /// Random layouts with random holders: the result is valid, keeps every holder, loses nothing, gains
    /// something, and the capacity stranded by holders is unchanged.
    #[test]
    fn defragmentation_keeps_holders_and_never_loses() {
        let catalog = Catalog::builtin();
        let mut rng = Rng::new(21);
        let mut improved = 0;
        for round in 0..400 {
            let keys = ["H100-80GB", "A100-40GB", "A30-24GB", "H200-141GB"];
            let m = catalog.model(keys[round % keys.len()]).expect("model");
            let mut occ = Occupancy::EMPTY;
            let mut layout = Vec::new();
            for _ in 0..(1 + rng.below(7)) {
                let prof = rng.below(m.profiles.len());
                let pls = &m.profiles[prof].placements;
                let i = Inst { profile: prof, start: pls[rng.below(pls.len())].start };
                if occ.can_add(m, i) {
                    occ.add(m, i);
                    layout.push(i);
                }
            }
            let held: Vec<Inst> = layout.iter().copied().filter(|_| rng.chance(0.4)).collect();
            let demanded: Vec<usize> = (0..m.profiles.len()).filter(|_| rng.chance(0.4)).collect();
            let Some(target) = largest(m, &demanded) else { continue };
            let before = readiness(m, &layout, &held, &demanded, target);
            let stranded_before = crate::efficiency::capacity(m, &held, &demanded);
            let Some(d) = defragment(m, &layout, &held, &demanded, target) else { continue };
            improved += 1;
            assert_eq!(d.before, before);
            let specs = specs_of(m, &d.layout);
            validate(m, &specs).unwrap_or_else(|e| panic!("{}: {d:?}: {e:?}", m.key));
            assert!(held.iter().all(|h| d.layout.contains(h)), "holders stay: {d:?}");
            assert!(d.destroyed.iter().all(|x| !held.contains(x)));
            assert!(d.after.target >= before.target && d.after.ready >= before.ready, "{d:?}");
            assert!((d.after.target, d.after.ready) > (before.target, before.ready), "{d:?}");
            assert_eq!(d.after.ready + d.after.not_ready, before.ready + before.not_ready, "free slices are the same");
            assert!(d.after.not_ready <= before.not_ready, "{d:?}");
            assert_eq!(d.after, readiness(m, &d.layout, &held, &demanded, target));
            assert_eq!(crate::efficiency::capacity(m, &held, &demanded), stranded_before);
        }
        assert!(improved > 50, "the rounds exercise the search: {improved}");
    }
}
