//! Defragmentation benchmark: on the planner's synthetic fleets (random layouts, some instances in use), the free
//! compute slices a request for a demanded profile can only get after a layout change ("not ready"), and the free
//! instances of each model's largest demanded profile, before and after every GPU's defragmentation proposal. The
//! "before" column is the baseline, measured in the same run on the same fleet.
//!
//! `cargo bench -p tessera-core --bench defrag` (add `-- --quick` for a smaller fleet and fewer seeds). It panics
//! when a proposal loses a held instance, a ready slice or a target instance.

#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Instant;

use tessera_core::catalog::Catalog;
use tessera_core::defrag::{defragment, largest, readiness};
use tessera_core::efficiency::capacity;
use tessera_core::layout::Inst;
use tessera_core::planner::synth::{self, DemandSpec, FleetSpec, Rng};

const FLEET_MODELS: [&str; 5] = ["A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB", "A30-24GB"];

#[derive(Default, Clone, Copy)]
struct Sums {
    gpus: u64,
    proposals: u64,
    not_ready: [u64; 2],
    ready: [u64; 2],
    target: [u64; 2],
    /// Demand for the target profiles served by ready instances (the smaller of demand and instances, per model).
    served: [u64; 2],
    target_demand: u64,
    stranded: [u64; 2],
    created: u64,
    destroyed: u64,
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let catalog = Catalog::builtin();
    let (gpus, seeds) = if quick { (200, 2) } else { (1000, 5) };
    println!("# Tessera defragmentation benchmark{}", if quick { " (quick)" } else { "" });
    println!(
        "\n{gpus} GPUs of {} per fleet, {seeds} seeds summed. Every GPU has a layout of random base-profile instances; \
         'held' is the chance that an instance is in use. Demand: 300 synthetic requests (small profiles favoured 6:3:2:1:1); \
         each model's target is its largest demanded profile. Not ready: free compute slices in no free instance of a \
         demanded profile. Stranded: free slices no demanded instance can take beside those in use (unchanged by \
         design: only moving a holder changes it).",
        FLEET_MODELS.join(", ")
    );
    println!();
    println!(
        "| held | GPUs | proposals | not ready before | after | after / before | ready slices before | after | target instances before | after | target demand | served before | after | extra served | stranded before | after | created | destroyed | ms per GPU |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for held in [0.2, 0.5, 0.8] {
        let mut s = Sums::default();
        let mut elapsed = 0.0;
        for seed in 0..seeds {
            let mut rng = Rng::new(1000 + seed);
            let models: Vec<String> = FLEET_MODELS.iter().map(|m| m.to_string()).collect();
            let spec = FleetSpec { gpus, models: models.clone(), busy: 1.0, in_use: held, cordoned: 0.0 };
            let fleet = synth::fleet(catalog, &mut rng, &spec);
            let demand = synth::demand(
                catalog,
                &mut rng,
                &models,
                &DemandSpec { requests: 300, max_count: 4, constrained: 0.5 },
            );
            // Per model: the profiles asked for (by name, or by name and model) and how many slices of each.
            let mut demanded: BTreeMap<&str, BTreeMap<usize, u64>> = BTreeMap::new();
            for key in FLEET_MODELS {
                let m = catalog.model(key).unwrap();
                for d in &demand {
                    if d.model.as_deref().is_some_and(|x| x != key) {
                        continue;
                    }
                    if let Some(p) = m.profile_index(&d.profile) {
                        *demanded.entry(key).or_default().entry(p).or_default() += u64::from(d.count);
                    }
                }
            }
            let mut target_ready: BTreeMap<&str, [u64; 2]> = BTreeMap::new();
            for g in &fleet {
                let m = catalog.model(&g.model).unwrap();
                let Some(asked) = demanded.get(m.key.as_str()) else { continue };
                let wanted: Vec<usize> = asked.keys().copied().collect();
                let Some(target) = largest(m, &wanted) else { continue };
                let layout: Vec<Inst> = g
                    .instances
                    .iter()
                    .map(|i| Inst { profile: m.profile_index(&i.profile).unwrap(), start: i.start })
                    .collect();
                let held: Vec<Inst> =
                    g.instances.iter().zip(&layout).filter(|(i, _)| i.in_use).map(|(_, &x)| x).collect();
                let before = readiness(m, &layout, &held, &wanted, target);
                let stranded = u64::from(capacity(m, &held, &wanted).stranded);
                let t = Instant::now();
                let proposal = defragment(m, &layout, &held, &wanted, target);
                elapsed += t.elapsed().as_secs_f64();
                let after = match &proposal {
                    Some(d) => {
                        assert!(held.iter().all(|h| d.layout.contains(h)), "a held instance stays");
                        assert!(d.after.ready >= before.ready && d.after.target >= before.target);
                        s.proposals += 1;
                        s.created += d.created.len() as u64;
                        s.destroyed += d.destroyed.len() as u64;
                        d.after
                    }
                    None => before,
                };
                let after_layout = proposal.as_ref().map_or(&layout, |d| &d.layout);
                s.gpus += 1;
                s.not_ready[0] += u64::from(before.not_ready);
                s.not_ready[1] += u64::from(after.not_ready);
                s.ready[0] += u64::from(before.ready);
                s.ready[1] += u64::from(after.ready);
                s.target[0] += u64::from(before.target);
                s.target[1] += u64::from(after.target);
                s.stranded[0] += stranded;
                s.stranded[1] += u64::from(capacity(m, &held, &wanted).stranded);
                assert_eq!(after, readiness(m, after_layout, &held, &wanted, target));
                let e = target_ready.entry(m.key.as_str()).or_default();
                e[0] += u64::from(before.target);
                e[1] += u64::from(after.target);
            }
            for (key, ready) in target_ready {
                let m = catalog.model(key).unwrap();
                let asked = &demanded[key];
                let target = largest(m, &asked.keys().copied().collect::<Vec<_>>()).unwrap();
                let want = asked[&target];
                s.target_demand += want;
                s.served[0] += want.min(ready[0]);
                s.served[1] += want.min(ready[1]);
            }
        }
        let ratio = |a: u64, b: u64| if b == 0 { f64::NAN } else { a as f64 / b as f64 };
        println!(
            "| {held} | {} | {} | {} | {} | {:.3} | {} | {} | {} | {} | {} | {} | {} | +{} | {} | {} | {} | {} | {:.3} |",
            s.gpus,
            s.proposals,
            s.not_ready[0],
            s.not_ready[1],
            ratio(s.not_ready[1], s.not_ready[0]),
            s.ready[0],
            s.ready[1],
            s.target[0],
            s.target[1],
            s.target_demand,
            s.served[0],
            s.served[1],
            s.served[1] - s.served[0],
            s.stranded[0],
            s.stranded[1],
            s.created,
            s.destroyed,
            elapsed * 1000.0 / s.gpus.max(1) as f64,
        );
        assert!(s.not_ready[1] <= s.not_ready[0] && s.target[1] >= s.target[0]);
        assert_eq!(s.stranded[0], s.stranded[1]);
    }
}
