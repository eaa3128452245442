//! Placing the reservations that start at one moment on the fleet as it is then: MIG slices with the planner,
//! whole-GPU shares packed, kept slices first; and the bounds on how many slices of a spec there is room for.

use super::calendar::{Held, Prepared, a_layout};
use super::rules::{Booking, Hold, share_of};
use crate::catalog::GpuModel;
use crate::layout::{Inst, Occupancy};
use crate::planner::{DemandInput, Problem, plan_problem, problem};
use crate::request::SliceSpec;
use crate::sharing::Sharing;

impl<'a> Prepared<'a> {
    /// An upper bound on the slices of `spec` that can start at `t`, from what is held then: live slices, and those
    /// of reservations placed before `t` (a new reservation starting at `t` changes nothing before it). Per MIG GPU
    /// that can take the profile, the least of what the profile's maximum, the free compute slices and its free
    /// placements allow; per whole GPU, its shares. Reservations starting at `t` itself are not counted, which only
    /// loosens the bound.
    pub(super) fn room_at(&self, spec: &SliceSpec, t: i64) -> u32 {
        let SliceSpec::Mig { profile, .. } = spec else { return self.capacity(spec) };
        let mut held: Vec<Vec<&Hold>> = vec![Vec::new(); self.cal.gpus.len()];
        let before = self.order.iter().filter(|&&i| self.cal.bookings[i].start_ms.max(self.from_ms) < t);
        let placed = before.flat_map(|&i| self.placed[i].iter());
        for h in self.cal.holds.iter().chain(placed).filter(|h| h.at(t)) {
            if let Some(&g) = self.index.get(&h.gpu) {
                held[g].push(h);
            }
        }
        let mut total = 0u32;
        for ((g, m), on) in self.cal.gpus.iter().zip(&self.models).zip(&held) {
            let Some(m) = m.filter(|m| g.mig && !g.cordoned && self.eligible(spec, m)) else { continue };
            let Some(p) = m.profile_index(profile) else { continue };
            let insts: Vec<Inst> = on
                .iter()
                .filter_map(|h| Some(Inst { profile: m.profile_index(&h.profile)?, start: h.start }))
                .collect();
            let occ = Occupancy::of(m, &insts);
            let prof = &m.profiles[p];
            let by_max = prof.max_instances.saturating_sub(occ.counts[p]);
            let by_compute = occ.free_compute(m) / prof.compute_slices.max(1);
            let free_placements = prof.placements.iter().filter(|pl| pl.mask() & occ.mask == 0).count();
            let n = usize::from(by_max.min(by_compute)).min(free_placements);
            total = total.saturating_add(u32::try_from(n).unwrap_or(u32::MAX));
        }
        total
    }

    /// Most slices of `spec` the fleet could hold at once, ignoring everything held: an upper bound for searches.
    pub(super) fn capacity(&self, spec: &SliceSpec) -> u32 {
        let total: usize = self
            .cal
            .gpus
            .iter()
            .zip(&self.models)
            .filter(|(g, _)| !g.cordoned)
            .map(|(g, m)| match (spec, m) {
                (SliceSpec::Mig { profile, .. }, Some(m)) if g.mig && self.eligible(spec, m) => {
                    m.profile(profile).map_or(0, |p| p.placements.len())
                }
                (_, Some(m)) if !g.mig && self.eligible(spec, m) => {
                    share_of(spec).map_or(0, |(_, _, per)| per as usize)
                }
                _ => 0,
            })
            .sum();
        u32::try_from(total).unwrap_or(u32::MAX)
    }

    /// Whether a GPU of model `m` can take a slice of `spec`.
    fn eligible(&self, spec: &SliceSpec, m: &GpuModel) -> bool {
        let named = |model: &str| self.cal.catalog.resolve(model).is_some_and(|(x, _)| x.key == m.key);
        match spec {
            SliceSpec::Mig { profile, model } => {
                m.profile_index(profile).is_some() && model.as_deref().is_none_or(named)
            }
            other => share_of(other).is_some_and(|(model, _, _)| named(model)),
        }
    }
    /// Places the `group` of reservations starting at one moment on the fleet as it is then (`live`: what is held at
    /// that moment). Returns each reservation's slices.
    pub(super) fn place_at(&self, live: &Held<'_>, group: &[&Booking]) -> Vec<Vec<Hold>> {
        let mut out: Vec<Vec<Hold>> = vec![Vec::new(); group.len()];
        // Reservations whose hinted slices are still free keep them.
        let mut hinted: Vec<Hold> = Vec::new();
        let mut keeps = vec![false; group.len()];
        for (i, b) in group.iter().enumerate() {
            if let Some(hint) = self.cal.hints.get(&b.id)
                && hint.len() == b.count as usize
                && self.hint_free(b, hint, live, &hinted)
            {
                out[i] = hint.iter().map(|h| Hold { until_ms: Some(b.end_ms), ..h.clone() }).collect();
                hinted.extend(out[i].iter().cloned());
                keeps[i] = true;
            }
        }
        // What is held on a GPU: what was live, then what this moment's reservations kept.
        let hinted_on: Vec<(usize, &Hold)> =
            hinted.iter().filter_map(|h| self.index.get(&h.gpu).map(|&i| (i, h))).collect();
        let on = |gpu: usize| -> Vec<&Hold> {
            live.on(gpu).chain(hinted_on.iter().filter(|(i, _)| *i == gpu).map(|(_, h)| *h)).collect()
        };
        // MIG: one planner run for every MIG reservation of the group, on the GPUs that could take any of them.
        let mig: Vec<usize> =
            (0..group.len()).filter(|&i| !keeps[i] && matches!(group[i].spec, SliceSpec::Mig { .. })).collect();
        if !mig.is_empty() {
            // A GPU where no demanded profile fits beside the instances held there (nor a cordoned one) could take
            // nothing: the planner is not shown it.
            // Per model of the fleet, the profiles demanded that it can take.
            let wanted: Vec<Vec<usize>> = self
                .distinct
                .iter()
                .map(|m| {
                    mig.iter()
                        .filter(|&&d| self.eligible(&group[d].spec, m))
                        .filter_map(|&d| match &group[d].spec {
                            SliceSpec::Mig { profile, .. } => m.profile_index(profile),
                            _ => None,
                        })
                        .collect()
                })
                .collect();
            let gpus: Vec<problem::Gpu<'a>> = self
                .cal
                .gpus
                .iter()
                .enumerate()
                .filter(|(_, g)| g.mig && !g.cordoned)
                .filter_map(|(i, _)| {
                    let (m, slot) = (self.models[i]?, self.slot[i]?);
                    let wanted = &wanted[slot];
                    if wanted.is_empty() {
                        return None;
                    }
                    let held = on(i);
                    let mut occ = Occupancy::EMPTY;
                    for h in &held {
                        if let Some(p) = m.profile_index(&h.profile) {
                            occ.add(m, Inst { profile: p, start: h.start });
                        }
                    }
                    if !wanted.iter().any(|&p| occ.can_add_profile(m, p)) {
                        return None;
                    }
                    self.planner_gpu(i, &held)
                })
                .collect();
            let demand: Vec<DemandInput> = mig
                .iter()
                .filter_map(|&i| match &group[i].spec {
                    SliceSpec::Mig { profile, model } => {
                        Some(DemandInput { profile: profile.clone(), count: group[i].count, model: model.clone() })
                    }
                    _ => None,
                })
                .collect();
            if !gpus.is_empty()
                && let Ok(mut problem) = Problem::of_gpus(self.cal.catalog, gpus, &demand)
            {
                // Only the placements are kept: a lone reservation served by free instances needs no other GPU.
                problem.without_gpus_it_cannot_use();
                let planned = plan_problem(&problem);
                for s in planned.placed {
                    let i = mig[s.demand];
                    let until_ms = Some(group[i].end_ms);
                    out[i].push(Hold { gpu: s.gpu, profile: s.profile, start: s.start, until_ms });
                }
            }
        }
        // Whole GPUs and shares: packed one reservation after another.
        let mut added: Vec<Hold> = Vec::new();
        for (i, b) in group.iter().enumerate() {
            if keeps[i] || matches!(b.spec, SliceSpec::Mig { .. }) {
                continue;
            }
            let slices = self.place_shares(&on, &added, b);
            added.extend(slices.iter().cloned());
            out[i] = slices;
        }
        out
    }

    /// The planner's view of MIG GPU `i` at a moment, given what is held on it then (`mine`): that is in use; the
    /// rest of its layout is free. When a held instance is missing from the layout (created by a layout change still
    /// to apply), or the layout is not a valid one of the model, only the held instances are there. `None` when what
    /// is held is not a valid layout either.
    fn planner_gpu(&self, i: usize, mine: &[&Hold]) -> Option<problem::Gpu<'a>> {
        let (g, model) = (&self.cal.gpus[i], self.models[i]?);
        let (model_idx, layout) = self.planned[i].as_ref()?;
        let held: Vec<Inst> = mine
            .iter()
            .map(|h| Some(Inst { profile: model.profile_index(&h.profile)?, start: h.start }))
            .collect::<Option<_>>()?;
        let (mut in_use, mut free): (Vec<Inst>, Vec<Inst>) = if let Some(layout) = layout
            && held.iter().all(|h| layout.contains(h))
        {
            layout.iter().partition(|l| held.contains(l))
        } else {
            if !a_layout(model, &held) {
                return None;
            }
            (held, vec![])
        };
        in_use.sort();
        free.sort();
        Some(problem::Gpu {
            id: g.id.clone(),
            model_idx: *model_idx,
            model,
            in_use,
            free,
            cordoned: g.cordoned,
            layout_pending: false,
        })
    }

    /// Whether `hint`'s slices can hold `b` beside what is `live` and the slices `hinted` at the same moment: each
    /// on a GPU that takes `b`'s spec and is not cordoned, a MIG instance that fits beside the instances held there,
    /// or a share that is free on a GPU shared the same way.
    fn hint_free(&self, b: &Booking, hint: &[Hold], live: &Held<'_>, hinted: &[Hold]) -> bool {
        let mut seen: Vec<&str> = Vec::new();
        for h in hint {
            if seen.contains(&h.gpu.as_str()) {
                continue;
            }
            seen.push(&h.gpu);
            let Some(&gi) = self.index.get(&h.gpu) else { return false };
            let (g, Some(model)) = (&self.cal.gpus[gi], self.models[gi]) else { return false };
            if g.cordoned || !self.eligible(&b.spec, model) {
                return false;
            }
            let held: Vec<&Hold> = live.on(gi).chain(hinted.iter().filter(|x| x.gpu == h.gpu)).collect();
            let mine: Vec<&Hold> = hint.iter().filter(|x| x.gpu == h.gpu).collect();
            let free = match &b.spec {
                SliceSpec::Mig { profile, .. } => {
                    g.mig && {
                        let mut occ = Occupancy::EMPTY;
                        let inst =
                            |x: &Hold| model.profile_index(&x.profile).map(|p| Inst { profile: p, start: x.start });
                        for x in &held {
                            if let Some(i) = inst(x) {
                                occ.add(model, i);
                            }
                        }
                        mine.iter().all(|x| match inst(x) {
                            Some(i) if model.profile_index(profile) == Some(i.profile) && occ.can_add(model, i) => {
                                occ.add(model, i);
                                true
                            }
                            _ => false,
                        })
                    }
                }
                spec => match share_of(spec) {
                    Some((_, sharing, per_gpu)) => {
                        let key = sharing.key();
                        let on_peer = |j: usize| -> Vec<&Hold> {
                            let id = &self.cal.gpus[j].id;
                            live.on(j).chain(hinted.iter().filter(|x| x.gpu == *id)).collect()
                        };
                        !g.mig
                            && !self.node_clash(gi, sharing, on_peer)
                            && held.iter().all(|x| x.profile == key)
                            && mine.iter().enumerate().all(|(k, x)| {
                                x.profile == key
                                    && u32::from(x.start) < per_gpu
                                    && !held.iter().any(|y| y.start == x.start)
                                    && !mine[..k].iter().any(|y| y.start == x.start)
                            })
                    }
                    None => false,
                },
            };
            if !free {
                return false;
            }
        }
        true
    }

    /// Whether a share of `sharing` on GPU `gpu` would sit on a node where another GPU holds (`on`, at the moment) a
    /// share of the other way: time-slicing and MPS never share a node.
    fn node_clash<'h>(&self, gpu: usize, sharing: Sharing, on: impl Fn(usize) -> Vec<&'h Hold>) -> bool {
        matches!(sharing, Sharing::Timeslice { .. } | Sharing::Mps { .. })
            && self.peers[gpu]
                .iter()
                .any(|&j| on(j).iter().any(|h| Sharing::from_key(&h.profile).is_some_and(|s| s.clashes_with(sharing))))
    }

    /// Shares for `b` on whole GPUs of its model (`on` gives what is held on a GPU, `added` what this moment placed
    /// already): GPUs already shared the same way first (fewest free shares), then unused ones, as approvals place
    /// them.
    fn place_shares<'h>(&self, on: &dyn Fn(usize) -> Vec<&'h Hold>, added: &[Hold], b: &Booking) -> Vec<Hold> {
        let Some((_, sharing, per_gpu)) = share_of(&b.spec) else { return vec![] };
        let key = sharing.key();
        let mut candidates: Vec<(bool, usize, &str, Vec<u8>)> = Vec::new();
        for (i, g) in self.cal.gpus.iter().enumerate() {
            if g.mig || g.cordoned || !self.models[i].is_some_and(|m| self.eligible(&b.spec, m)) {
                continue;
            }
            let taken_on = |j: usize| -> Vec<&Hold> {
                let id = &self.cal.gpus[j].id;
                on(j).into_iter().chain(added.iter().filter(|h| h.gpu == *id)).collect()
            };
            let taken = taken_on(i);
            if taken.iter().any(|h| h.profile != key) || self.node_clash(i, sharing, taken_on) {
                continue;
            }
            let free: Vec<u8> =
                (0..per_gpu.min(u32::from(u8::MAX)) as u8).filter(|s| !taken.iter().any(|h| h.start == *s)).collect();
            if !free.is_empty() {
                candidates.push((taken.is_empty(), free.len(), g.id.as_str(), free));
            }
        }
        candidates.sort();
        candidates
            .into_iter()
            .flat_map(|(_, _, gpu, free)| {
                let key = key.clone();
                free.into_iter().map(move |start| Hold {
                    gpu: gpu.to_string(),
                    profile: key.clone(),
                    start,
                    until_ms: Some(b.end_ms),
                })
            })
            .take(b.count as usize)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Catalog;
    use crate::reservation::calendar::Calendar;
    use crate::reservation::rules::CalGpu;

    fn catalog() -> &'static Catalog {
        Catalog::builtin()
    }

    /// A whole GPU on node `n-whole` (whole GPUs share a node unless moved).
    fn whole_gpu(id: &str) -> CalGpu {
        CalGpu {
            id: id.into(),
            node: "n-whole".into(),
            model: "H100-80GB".into(),
            mig: false,
            cordoned: false,
            layout: vec![],
        }
    }

    #[test]
    fn time_slicing_and_mps_never_share_a_node_at_one_moment() {
        let ts = SliceSpec::Timeslice { model: "H100-80GB".into(), replicas: 4 };
        let mps = SliceSpec::Mps { model: "H100-80GB".into(), replicas: 4 };
        let book = |id: &str, spec: &SliceSpec, start_ms, end_ms| Booking {
            id: id.into(),
            spec: spec.clone(),
            count: 1,
            start_ms,
            end_ms,
        };
        // Two whole GPUs on one node: time-sliced on one, the other cannot take MPS while it lasts.
        let one_node = vec![whole_gpu("a"), whole_gpu("b")];
        let cal = Calendar::new(catalog(), one_node.clone(), vec![], vec![book("ts", &ts, 0, 100)]);
        assert!(cal.admit(&book("mps", &mps, 50, 150), 0).is_err());
        assert!(cal.admit(&book("mps", &mps, 100, 150), 0).is_ok(), "after it ends the node may turn to MPS");
        assert!(cal.admit(&book("ts2", &ts, 50, 150), 0).is_ok(), "more time-slicing fits beside it");
        // A GPU on another node takes it.
        let other = CalGpu { node: "n-2".into(), ..whole_gpu("c") };
        let two_nodes = [one_node.clone(), vec![other]].concat();
        let cal = Calendar::new(catalog(), two_nodes, vec![], vec![book("ts", &ts, 0, 100)]);
        let sim = cal.admit(&book("mps", &mps, 50, 150), 0).expect("room on the other node");
        assert_eq!(sim.placed["mps"][0].gpu, "c");
        // A live time-sliced allocation on the node: an MPS reservation is short, and protection refuses a
        // time-sliced allocation that would leave an accepted MPS reservation short.
        let live = vec![Hold { gpu: "a".into(), profile: ts_key(), start: 0, until_ms: Some(80) }];
        let cal = Calendar::new(catalog(), one_node.clone(), live, vec![]);
        assert!(cal.admit(&book("mps", &mps, 50, 150), 0).is_err());
        assert!(cal.admit(&book("mps", &mps, 80, 150), 0).is_ok());
        let cal = Calendar::new(catalog(), one_node, vec![], vec![book("mps", &mps, 50, 150)]);
        let sim = cal.simulate(0, &[]);
        let taken = &sim.placed["mps"][0].gpu;
        let free = if taken == "a" { "b" } else { "a" };
        let slice = |until_ms| vec![Hold { gpu: free.into(), profile: ts_key(), start: 0, until_ms }];
        assert_eq!(cal.protects(&slice(None), 0).expect_err("refused").booking, "mps");
        assert!(cal.protects(&slice(Some(50)), 0).is_ok());
    }

    fn ts_key() -> String {
        Sharing::Timeslice { replicas: 4 }.key()
    }

    #[test]
    fn shares_pack_before_taking_whole_gpus() {
        let spec = SliceSpec::Timeslice { model: "H100-80GB".into(), replicas: 4 };
        let ts = |id: &str, count| Booking { id: id.into(), spec: spec.clone(), count, start_ms: 0, end_ms: 10 };
        let gpus = vec![whole_gpu("a"), whole_gpu("b")];
        let cal = Calendar::new(catalog(), gpus, vec![], vec![ts("one", 3)]);
        let sim = cal.admit(&ts("two", 5), 0).expect("present");
        assert_eq!(sim.placed["two"].iter().filter(|h| h.gpu == sim.placed["one"][0].gpu).count(), 1);
        assert!(cal.admit(&ts("three", 6), 0).is_err());
        let excl = Booking {
            id: "x".into(),
            spec: SliceSpec::Exclusive { model: "H100-80GB".into() },
            count: 1,
            start_ms: 5,
            end_ms: 9,
        };
        assert!(cal.admit(&excl, 0).is_ok());
        let cal2 =
            Calendar::new(catalog(), vec![whole_gpu("a"), whole_gpu("b")], vec![], vec![ts("one", 3), ts("four", 4)]);
        assert!(cal2.admit(&excl, 0).is_err());
    }
}
