//! Helpers shared by the test modules.

use tessera_core::layout::InstanceSpec;

/// Parses `"3g.40gb@4 1g.10gb"` into specs.
pub fn specs(text: &str) -> Vec<InstanceSpec> {
    text.split_whitespace().map(|s| s.parse().expect("spec")).collect()
}

use std::collections::HashMap;

use tessera_core::catalog::Catalog;
use tessera_core::layout::validate;
use tessera_core::planner::{Plan, PlanInput};

/// Parses plan input JSON.
pub fn input(json: serde_json::Value) -> PlanInput {
    serde_json::from_value(json).expect("plan input")
}

/// Checks every rule a plan must keep, panicking with the reason when one is broken:
/// resulting layouts are valid; nothing in use is destroyed or handed out; cordoned GPUs are untouched; each placed
/// slice sits on its own instance of the right profile, on a model its demand allows; counts add up.
pub fn check_plan(input: &PlanInput, plan: &Plan) {
    let catalog = Catalog::builtin();
    let mut placed_per_demand = vec![0u32; input.demand.len()];
    let mut used: HashMap<(String, u8), ()> = HashMap::new();
    for gpu in &input.gpus {
        let model = catalog.resolve(&gpu.model).expect("model").0;
        let changed = plan.changed_gpus.iter().find(|c| c.gpu == gpu.id);
        let destroyed: Vec<_> = plan.destroyed.iter().filter(|d| d.gpu == gpu.id).collect();
        if gpu.cordoned {
            assert!(changed.is_none(), "cordoned {} changed", gpu.id);
        }
        for d in &destroyed {
            let inst = gpu.instances.iter().find(|i| i.profile == d.profile && i.start == d.start);
            let inst =
                inst.unwrap_or_else(|| panic!("{} destroys {}@{} which does not exist", gpu.id, d.profile, d.start));
            assert!(!inst.in_use, "{} destroys in-use {}@{}", gpu.id, d.profile, d.start);
        }
        let layout: Vec<(String, u8)> = match changed {
            Some(c) => {
                assert!(
                    !c.created.is_empty() || !c.destroyed.is_empty(),
                    "{} listed as changed without change",
                    gpu.id
                );
                c.layout.iter().map(|i| (i.profile.clone(), i.start)).collect()
            }
            None => {
                assert!(destroyed.is_empty(), "{} destroys without being changed", gpu.id);
                gpu.instances.iter().map(|i| (i.profile.clone(), i.start)).collect()
            }
        };
        let specs: Vec<_> = layout
            .iter()
            .map(|(p, s)| tessera_core::layout::InstanceSpec { profile: p.clone(), start: Some(*s) })
            .collect();
        validate(model, &specs).unwrap_or_else(|e| panic!("{}: planned layout {layout:?} invalid: {e:?}", gpu.id));
        for i in gpu.instances.iter().filter(|i| i.in_use) {
            assert!(
                layout.contains(&(i.profile.clone(), i.start)),
                "{}: in-use {}@{} gone",
                gpu.id,
                i.profile,
                i.start
            );
        }
        for s in plan.placed.iter().filter(|s| s.gpu == gpu.id) {
            assert!(!gpu.cordoned, "slice placed on cordoned {}", gpu.id);
            assert!(
                layout.contains(&(s.profile.clone(), s.start)),
                "{}: slice on missing {}@{}",
                gpu.id,
                s.profile,
                s.start
            );
            assert!(
                used.insert((gpu.id.clone() + "/" + &s.profile, s.start), ()).is_none(),
                "{}: {}@{} handed out twice",
                gpu.id,
                s.profile,
                s.start
            );
            let existing = gpu.instances.iter().find(|i| i.profile == s.profile && i.start == s.start);
            match existing {
                Some(i) => {
                    assert!(!s.new, "{}: {}@{} exists but is marked new", gpu.id, s.profile, s.start);
                    assert!(!i.in_use, "{}: in-use {}@{} handed out", gpu.id, s.profile, s.start);
                }
                None => assert!(s.new, "{}: {}@{} is new but marked existing", gpu.id, s.profile, s.start),
            }
            let d = &input.demand[s.demand];
            assert!(d.profile.eq_ignore_ascii_case(&s.profile), "slice for {} placed as {}", d.profile, s.profile);
            if let Some(m) = &d.model {
                assert_eq!(catalog.resolve(m).expect("model").0.key, model.key, "constraint {m} broken");
            }
            placed_per_demand[s.demand] += 1;
        }
    }
    for (k, d) in input.demand.iter().enumerate() {
        let unplaced: u32 = plan.unplaced.iter().filter(|u| u.demand == k).map(|u| u.count).sum();
        assert_eq!(placed_per_demand[k] + unplaced, d.count, "demand {k}: placed + unplaced != count");
    }
    assert_eq!(plan.summary.placed as usize, plan.placed.len());
    assert_eq!(plan.summary.gpus_touched as usize, plan.changed_gpus.len());
}
