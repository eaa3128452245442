//! Enumerating layouts: every valid layout that extends a given one, the maximal layouts of a model (those to which
//! no instance can be added), and the instances that can be added to a layout.
//!
//! Candidates are all `(profile, placement)` pairs sorted by start; a layout is visited once, as the increasing
//! sequence of its candidates, so no layout is produced twice.

use super::solve::{Inst, Occupancy};
use crate::catalog::model::{GpuModel, ProfileIdx};

/// Every instance that can be added to `layout` (which must be valid): allowed placement, free units, and room
/// under the profile's maximum and the compute total.
pub fn addable(model: &GpuModel, layout: &[Inst]) -> Vec<Inst> {
    let occ = Occupancy::of(model, layout);
    candidates(model, None).into_iter().filter(|&c| occ.can_add(model, c)).collect()
}

/// Every maximal valid layout of `model` built from `profiles` (all profiles when `None`), each sorted by start.
pub fn maximal_layouts(model: &GpuModel, profiles: Option<&[ProfileIdx]>) -> Vec<Vec<Inst>> {
    let cands = candidates(model, profiles);
    let mut out = Vec::new();
    valid_supersets_with(model, &[], &cands, &mut |layout, occ| {
        if !cands.iter().any(|&c| occ.can_add(model, c)) {
            let mut l = layout.to_vec();
            l.sort_by_key(|i| (i.start, i.profile));
            out.push(l);
        }
    });
    out
}

/// Calls `visit` with every valid layout that contains `base` (which must be valid) and adds only instances of
/// `profiles`; the slice passed holds the added instances only. `base` itself is visited first.
pub fn valid_supersets(model: &GpuModel, base: &[Inst], profiles: &[ProfileIdx], visit: &mut dyn FnMut(&[Inst])) {
    let cands = candidates(model, Some(profiles));
    valid_supersets_with(model, base, &cands, &mut |added, _| visit(added));
}

fn candidates(model: &GpuModel, profiles: Option<&[ProfileIdx]>) -> Vec<Inst> {
    let mut c: Vec<Inst> = model
        .profiles
        .iter()
        .enumerate()
        .filter(|(i, _)| profiles.is_none_or(|ps| ps.contains(i)))
        .flat_map(|(profile, p)| p.placements.iter().map(move |pl| Inst { profile, start: pl.start }))
        .collect();
    c.sort_by_key(|i| (i.start, i.profile));
    c
}

fn valid_supersets_with(model: &GpuModel, base: &[Inst], cands: &[Inst], visit: &mut dyn FnMut(&[Inst], &Occupancy)) {
    fn go(
        model: &GpuModel,
        cands: &[Inst],
        from: usize,
        occ: Occupancy,
        added: &mut Vec<Inst>,
        visit: &mut dyn FnMut(&[Inst], &Occupancy),
    ) {
        visit(added, &occ);
        for (k, &c) in cands.iter().enumerate().skip(from) {
            if occ.can_add(model, c) {
                let mut next = occ;
                next.add(model, c);
                added.push(c);
                go(model, cands, k + 1, next, added, visit);
                added.pop();
            }
        }
    }
    let occ = Occupancy::of(model, base);
    go(model, cands, 0, occ, &mut Vec::new(), visit);
}
