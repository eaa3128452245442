//! The planning problem in internal form: input checked against the catalog, instances as profile indexes, demand
//! entries as classes that know which `(model, profile)` pairs can serve them.

use std::collections::HashSet;

use super::types::{DemandInput, PlanError, PlanInput};
use crate::catalog::{Catalog, GpuModel, ProfileIdx};
use crate::layout::{self, Inst, InstanceSpec};

/// Largest count one demand entry may ask for.
pub const MAX_DEMAND_COUNT: u32 = 1_000_000;
/// Largest number of slices all demand entries together may ask for.
pub const MAX_TOTAL_DEMAND: u64 = 10_000_000;

/// A checked planning problem.
#[derive(Debug, Clone)]
pub struct Problem<'c> {
    /// The catalog models refer to.
    pub catalog: &'c Catalog,
    /// GPUs, in input order.
    pub gpus: Vec<Gpu<'c>>,
    /// Demand entries, in input order.
    pub classes: Vec<Class>,
    /// Per catalog model and profile index: the classes it serves, constrained first.
    serving: Vec<Vec<Vec<usize>>>,
}

/// One GPU, checked.
#[derive(Debug, Clone)]
pub struct Gpu<'c> {
    /// Id from the input.
    pub id: String,
    /// Index of the model in the catalog.
    pub model_idx: usize,
    /// The model.
    pub model: &'c GpuModel,
    /// Instances holding an active allocation: never destroyed, never handed out.
    pub in_use: Vec<Inst>,
    /// Existing free instances: can be handed out, or destroyed to make room.
    pub free: Vec<Inst>,
    /// Gets nothing new (cordoned, or a layout change for it waits).
    pub cordoned: bool,
    /// Gets nothing new because a layout change for it waits for approval, not because it is cordoned.
    pub layout_pending: bool,
}

/// One demand entry: `count` slices that any `(model, profile)` in `eligible` can serve.
#[derive(Debug, Clone)]
pub struct Class {
    /// Profile name as given.
    pub profile: String,
    /// Model constraint as given.
    pub model: Option<String>,
    /// Slices wanted.
    pub count: u32,
    /// Per catalog model: the profile index that serves this class on it, if any.
    pub eligible: Vec<Option<ProfileIdx>>,
    /// Compute slices of the profile (the largest over eligible models), used to order demand.
    pub compute: u8,
    /// Placement units of the profile (the largest over eligible models).
    pub size: u8,
}

impl Class {
    /// Whether a constraint names one model.
    pub fn constrained(&self) -> bool {
        self.model.is_some()
    }
}

impl<'c> Problem<'c> {
    /// Checks input against the catalog.
    pub fn new(catalog: &'c Catalog, input: &PlanInput) -> Result<Problem<'c>, PlanError> {
        let known = || catalog.keys().join(", ");
        let mut seen = HashSet::new();
        let mut gpus = Vec::with_capacity(input.gpus.len());
        for g in &input.gpus {
            if !seen.insert(g.id.as_str()) {
                return Err(PlanError::DuplicateGpu { id: g.id.clone() });
            }
            let (model, _) = catalog.resolve(&g.model).ok_or_else(|| PlanError::UnknownModel {
                context: format!("gpu `{}`", g.id),
                model: g.model.clone(),
                known: known(),
            })?;
            let model_idx = catalog.models.iter().position(|m| std::ptr::eq(m, model)).unwrap_or(0);
            let specs: Vec<InstanceSpec> =
                g.instances.iter().map(|i| InstanceSpec { profile: i.profile.clone(), start: Some(i.start) }).collect();
            layout::validate(model, &specs).map_err(|errors| PlanError::InvalidLayout { gpu: g.id.clone(), errors })?;
            let mut in_use = Vec::new();
            let mut free = Vec::new();
            for i in &g.instances {
                let profile = model.profile_index(&i.profile).unwrap_or(0);
                let inst = Inst { profile, start: i.start };
                if i.in_use { in_use.push(inst) } else { free.push(inst) }
            }
            in_use.sort();
            free.sort();
            gpus.push(Gpu {
                id: g.id.clone(),
                model_idx,
                model,
                in_use,
                free,
                cordoned: g.cordoned || g.layout_pending,
                layout_pending: g.layout_pending && !g.cordoned,
            });
        }
        Problem::of_gpus(catalog, gpus, &input.demand)
    }

    /// A problem of GPUs already in internal form (each `model` a model of `catalog` at `model_idx`, its instances a
    /// valid layout, `in_use` and `free` sorted, ids unique: what [`Problem::new`] checks), with `demand` checked.
    /// For callers that plan the same fleet many times and keep it in that form.
    pub fn of_gpus(catalog: &'c Catalog, gpus: Vec<Gpu<'c>>, demand: &[DemandInput]) -> Result<Problem<'c>, PlanError> {
        let known = || catalog.keys().join(", ");
        let total: u64 = demand.iter().map(|d| u64::from(d.count)).sum();
        if total > MAX_TOTAL_DEMAND {
            return Err(PlanError::TooMuchDemand { total, max: MAX_TOTAL_DEMAND });
        }
        let mut classes = Vec::with_capacity(demand.len());
        for (index, d) in demand.iter().enumerate() {
            if d.count == 0 || d.count > MAX_DEMAND_COUNT {
                return Err(PlanError::BadCount { index, count: d.count, max: MAX_DEMAND_COUNT });
            }
            let context = format!("demand {index}");
            let only = match &d.model {
                Some(m) => Some(
                    catalog
                        .resolve(m)
                        .ok_or_else(|| PlanError::UnknownModel {
                            context: context.clone(),
                            model: m.clone(),
                            known: known(),
                        })?
                        .0,
                ),
                None => None,
            };
            let eligible: Vec<Option<ProfileIdx>> = catalog
                .models
                .iter()
                .map(|m| match only {
                    Some(o) if !std::ptr::eq(o, m) => None,
                    _ => m.profile_index(&d.profile),
                })
                .collect();
            if eligible.iter().all(Option::is_none) {
                return Err(PlanError::UnknownProfile {
                    context,
                    profile: d.profile.clone(),
                    model: only.map(|m| m.key.clone()),
                });
            }
            let profiles = catalog.models.iter().zip(&eligible).filter_map(|(m, p)| p.map(|p| &m.profiles[p]));
            let (compute, size) = profiles.fold((0, 0), |(c, s), p| (p.compute_slices.max(c), p.size().max(s)));
            classes.push(Class {
                profile: d.profile.clone(),
                model: d.model.clone(),
                count: d.count,
                eligible,
                compute,
                size,
            });
        }
        let mut serving: Vec<Vec<Vec<usize>>> =
            catalog.models.iter().map(|m| vec![Vec::new(); m.profiles.len()]).collect();
        // Constrained classes first: serving them first is never worse, an unconstrained class can go elsewhere.
        for constrained in [true, false] {
            for (c, class) in classes.iter().enumerate().filter(|(_, k)| k.constrained() == constrained) {
                for (m, p) in class.eligible.iter().enumerate() {
                    if let Some(p) = p {
                        serving[m][*p].push(c);
                    }
                }
            }
        }
        Ok(Problem { catalog, gpus, classes, serving })
    }

    /// When the problem is one demand entry that the existing free instances of its profile can serve whole, drops
    /// the GPUs without such an instance and returns how many it dropped. Packing hands out an existing free instance
    /// before it creates anything (tier 0), choosing among them by each GPU's own state and then by GPU order, so the
    /// plan places every slice exactly where it would with those GPUs shown; only its summary (stranded capacity,
    /// counted over every GPU shown) differs. For callers that want the placements of many plans on a large fleet.
    pub fn without_gpus_it_cannot_use(&mut self) -> usize {
        let [class] = self.classes.as_slice() else { return 0 };
        let frees = |g: &Gpu<'_>| {
            let p = if g.cordoned { None } else { class.eligible[g.model_idx] };
            p.map_or(0, |p| g.free.iter().filter(|f| f.profile == p).count())
        };
        let free: usize = self.gpus.iter().map(frees).sum();
        if free < class.count as usize {
            return 0;
        }
        let before = self.gpus.len();
        self.gpus.retain(|g| frees(g) > 0);
        before - self.gpus.len()
    }

    /// Slices demanded in total.
    pub fn demanded(&self) -> u32 {
        self.classes.iter().map(|c| c.count).sum()
    }

    /// Per catalog model, the profiles some class asks for (sorted, deduplicated).
    pub fn demanded_profiles(&self) -> Vec<Vec<ProfileIdx>> {
        let mut out = vec![Vec::new(); self.catalog.models.len()];
        for c in &self.classes {
            for (m, p) in c.eligible.iter().enumerate() {
                if let Some(p) = p
                    && !out[m].contains(p)
                {
                    out[m].push(*p);
                }
            }
        }
        for v in &mut out {
            v.sort_unstable();
        }
        out
    }

    /// The classes a `(model, profile)` instance can serve, constrained classes first (serving them first is never
    /// worse: an unconstrained class can be served elsewhere).
    pub fn classes_for(&self, model_idx: usize, profile: ProfileIdx) -> &[usize] {
        &self.serving[model_idx][profile]
    }
}
