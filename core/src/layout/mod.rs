//! A GPU's MIG layout: a list of instances `(profile, start)`, and the rules that decide whether the driver
//! accepts it.
//!
//! A layout is valid when every profile exists on the model, every instance sits at one of its profile's allowed
//! placements, no two instances cover the same placement unit, no profile appears more often than its maximum, the
//! compute slices add up to at most the GPU's, and the instances own no more media/copy engines than the GPU has
//! (e.g. one OFA on A100/H100: two `+me` variants cannot coexist). Mixed profiles on one GPU are fine. [`validate`] reports every
//! problem at once, and gives instances written without a start the best placement that exists.

mod enumerate;
mod error;
mod relayout;
mod solve;

pub use enumerate::{addable, maximal_layouts, valid_supersets};
pub use error::{InstanceRef, LayoutError, Problem};
pub use relayout::{MAX_GPUS, MAX_IN_USE, Relayout, fits_moved, fits_now, fleet_room, make_room};
pub use solve::{Applied, Fragmentation, Inst, MAX_PROFILES, Occupancy, Solution, solve, solve_at};

use serde::{Deserialize, Serialize};

use crate::catalog::model::{ENGINES, GpuModel};

/// An instance as written by a person or a client: a profile and, optionally, where it starts.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InstanceSpec {
    /// Profile name, e.g. `3g.40gb`.
    pub profile: String,
    /// Start unit; `None` lets validation choose.
    pub start: Option<u8>,
}

/// A placed instance in wire form.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PlacedInstance {
    /// Profile name, e.g. `3g.40gb`.
    pub profile: String,
    /// Start unit.
    pub start: u8,
}

impl std::str::FromStr for InstanceSpec {
    type Err = String;

    /// Parses `PROFILE` or `PROFILE@START`, e.g. `3g.40gb@4`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        match s.split_once('@') {
            None if !s.is_empty() => Ok(InstanceSpec { profile: s.to_string(), start: None }),
            Some((p, start)) if !p.is_empty() => match start.parse::<u8>() {
                Ok(start) => Ok(InstanceSpec { profile: p.to_string(), start: Some(start) }),
                Err(_) => Err(format!("`{s}`: the start after `@` must be a unit number, e.g. 3g.40gb@4")),
            },
            _ => Err(format!("`{s}`: expected PROFILE or PROFILE@START, e.g. 3g.40gb@4")),
        }
    }
}

impl std::fmt::Display for InstanceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.start {
            Some(s) => write!(f, "{}@{s}", self.profile),
            None => f.write_str(&self.profile),
        }
    }
}

/// Checks a layout on `model` and returns it fully placed (input order kept), or every problem found.
///
/// Instances without a start get the placement that destroys nothing and leaves the least stranded capacity, if
/// any placement exists. Overlaps are only reported between instances whose own placement is allowed, so a wrong
/// start is reported once, as a wrong start.
pub fn validate(model: &GpuModel, specs: &[InstanceSpec]) -> Result<Vec<PlacedInstance>, Vec<LayoutError>> {
    let mut errors = Vec::new();
    let mut known = Vec::new(); // (input index, profile index, start)
    for (index, spec) in specs.iter().enumerate() {
        match model.profile_index(&spec.profile) {
            Some(p) => known.push((index, p, spec.start)),
            None => errors.push(LayoutError::UnknownProfile {
                index,
                profile: spec.profile.clone(),
                model: model.key.clone(),
                known: model.profile_names(),
            }),
        }
    }
    let mut placed: Vec<(usize, Inst)> = Vec::new();
    for &(index, p, start) in &known {
        let Some(start) = start else { continue };
        let profile = &model.profiles[p];
        if profile.placement_at(start).is_some() {
            placed.push((index, Inst { profile: p, start }));
        } else {
            errors.push(LayoutError::PlacementNotAllowed {
                index,
                profile: profile.name.clone(),
                start,
                model: model.key.clone(),
                allowed: profile.allowed_starts(),
            });
        }
    }
    // Each instance's overlap is reported once, against the first earlier instance it overlaps, so the number of
    // errors stays linear in the input.
    for (j, &(ib, b)) in placed.iter().enumerate() {
        if let Some(&(ia, a)) = placed[..j].iter().find(|(_, a)| a.mask(model) & b.mask(model) != 0) {
            errors.push(LayoutError::Overlap {
                a: instance_ref(model, ia, a),
                b: instance_ref(model, ib, b),
                units: units_of(a.mask(model) & b.mask(model)),
            });
        }
    }
    let mut counts = [0usize; MAX_PROFILES];
    let mut compute = 0u32;
    for &(_, p, _) in &known {
        counts[p] += 1;
        compute += u32::from(model.profiles[p].compute_slices);
    }
    for (p, profile) in model.profiles.iter().enumerate() {
        if counts[p] > usize::from(profile.max_instances) {
            errors.push(LayoutError::TooManyInstances {
                profile: profile.name.clone(),
                model: model.key.clone(),
                count: counts[p],
                max: profile.max_instances,
            });
        }
    }
    if compute > u32::from(model.compute_slices_total) {
        errors.push(LayoutError::ComputeSlicesExceeded {
            model: model.key.clone(),
            used: compute,
            total: model.compute_slices_total,
        });
    }
    // Over the compute slices, the engines are over for the same reason: report them only when compute fits.
    let compute_fits = compute <= u32::from(model.compute_slices_total);
    for (k, engine) in ENGINES.iter().enumerate().filter(|_| compute_fits) {
        let Some(total) = model.engine_limits[k] else { continue };
        let needs = |p: usize| u32::from(model.profiles[p].engine_needs[k]);
        let used: u32 = known.iter().map(|&(_, p, _)| needs(p)).sum();
        if used > u32::from(total) {
            let mut holders: Vec<String> = known
                .iter()
                .filter(|&&(_, p, _)| needs(p) > 0)
                .map(|&(_, p, _)| model.profiles[p].name.clone())
                .collect();
            holders.dedup();
            errors.push(LayoutError::EnginesExceeded { engine, model: model.key.clone(), used, total, holders });
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }

    let unplaced: Vec<(usize, usize)> =
        known.iter().filter(|(_, _, s)| s.is_none()).map(|&(index, p, _)| (index, p)).collect();
    let mut out: Vec<Option<Inst>> = vec![None; specs.len()];
    for &(index, inst) in &placed {
        out[index] = Some(inst);
    }
    if !unplaced.is_empty() {
        let fixed: Vec<Inst> = placed.iter().map(|&(_, i)| i).collect();
        let new: Vec<usize> = unplaced.iter().map(|&(_, p)| p).collect();
        match solve(model, &fixed, &[], &new) {
            Some(solution) => {
                for (&(index, _), inst) in unplaced.iter().zip(solution.new) {
                    out[index] = Some(inst);
                }
            }
            None => {
                let used = Occupancy::of(model, &fixed).mask;
                return Err(vec![LayoutError::NoPlacement {
                    profiles: new.iter().map(|&p| model.profiles[p].name.clone()).collect(),
                    model: model.key.clone(),
                    free_units: units_of(model.all_units() & !used),
                }]);
            }
        }
    }
    Ok(out.into_iter().flatten().map(|i| to_placed(model, i)).collect())
}

/// Free compute slices of a GPU laid out as `layout` that no instance added to it can use: the placement and
/// memory rules leave them out of reach (an H100 with `3g.40gb@0` and `3g.40gb@4` has 1 compute slice free and
/// no memory for it). Counted exactly, over every valid way to add instances. Instances of profiles the model
/// does not have are left out.
pub fn stranded_compute(model: &GpuModel, layout: &[PlacedInstance]) -> u8 {
    let base: Vec<Inst> = layout
        .iter()
        .filter_map(|i| model.profile_index(&i.profile).map(|profile| Inst { profile, start: i.start }))
        .collect();
    let free = Occupancy::of(model, &base).free_compute(model);
    let profiles: Vec<usize> = (0..model.profiles.len()).collect();
    let mut reachable = 0u8;
    valid_supersets(model, &base, &profiles, &mut |added| {
        let more: u8 = added.iter().map(|i| model.profiles[i.profile].compute_slices).sum();
        reachable = reachable.max(more);
    });
    free.saturating_sub(reachable)
}

/// The most instances of `profile` a GPU can take beside the instances in `in_use`, which stay where they are
/// (free instances of its layout may be laid out again). 0 when the model has no such profile. Counted exactly, over
/// every valid way to add instances of it.
pub fn room_for(model: &GpuModel, in_use: &[PlacedInstance], profile: &str) -> u8 {
    let Some(p) = model.profile_index(profile) else { return 0 };
    let base: Vec<Inst> = in_use
        .iter()
        .filter_map(|i| model.profile_index(&i.profile).map(|profile| Inst { profile, start: i.start }))
        .collect();
    fits_now(model, &base, p)
}

/// Converts the compact form to wire form.
pub fn to_placed(model: &GpuModel, inst: Inst) -> PlacedInstance {
    PlacedInstance { profile: model.profiles[inst.profile].name.clone(), start: inst.start }
}

fn instance_ref(model: &GpuModel, index: usize, inst: Inst) -> InstanceRef {
    InstanceRef { index, profile: model.profiles[inst.profile].name.clone(), start: inst.start }
}

/// The unit numbers set in a mask, ascending.
pub fn units_of(mask: crate::catalog::model::UnitMask) -> Vec<u8> {
    (0..16u8).filter(|u| mask & (1 << u) != 0).collect()
}
