use tessera_core::catalog::Catalog;
use tessera_core::layout::{self, InstanceSpec, LayoutError, addable, maximal_layouts, validate};

use crate::support::specs;

fn model(key: &str) -> &'static tessera_core::GpuModel {
    Catalog::builtin().model(key).expect("model in catalog")
}

#[test]
fn valid_layouts_are_returned_placed_in_input_order() {
    let m = model("H100-80GB");
    let out = validate(m, &specs("3g.40gb@4 1g.10gb@0 2g.20gb@2")).expect("valid");
    let got: Vec<(String, u8)> = out.into_iter().map(|i| (i.profile, i.start)).collect();
    assert_eq!(got, vec![("3g.40gb".into(), 4), ("1g.10gb".into(), 0), ("2g.20gb".into(), 2)]);
}

#[test]
fn every_problem_is_reported_at_once() {
    let m = model("H100-80GB");
    let errs = validate(m, &specs("7g.80gb@0 1g.10gb@0 3g.40gb@2 9g.90gb 1g.10gb+me 1g.10gb+me")).expect_err("invalid");
    let codes: Vec<&str> = errs.iter().map(LayoutError::code).collect();
    assert_eq!(
        codes,
        vec![
            "mig_unknown_profile",
            "mig_placement_not_allowed",
            "mig_overlap",
            "mig_too_many_instances",
            "mig_compute_slices_exceeded"
        ],
        "{errs:#?}"
    );
    let text: Vec<String> = errs.iter().map(ToString::to_string).collect();
    assert!(text[0].contains("9g.90gb is not a MIG profile of H100-80GB"), "{}", text[0]);
    assert!(
        text[1].contains("3g.40gb cannot start at unit 2") && text[1].contains("allowed starts are 0, 4"),
        "{}",
        text[1]
    );
    assert_eq!(text[2], "instance 1 (7g.80gb@0) overlaps instance 2 (1g.10gb@0) on unit 0");
    assert_eq!(text[3], "2 instances of 1g.10gb+me, but H100-80GB holds at most 1");
    assert!(text[4].contains("need 13 compute slices") && text[4].contains("has 7"), "{}", text[4]);
}

#[test]
fn overlap_names_the_units_shared() {
    let errs = validate(model("A100-40GB"), &specs("4g.20gb@0 2g.10gb@2")).expect_err("overlap");
    match &errs[..] {
        [LayoutError::Overlap { a, b, units }] => {
            assert_eq!((a.index, b.index, units.clone()), (0, 1, vec![2, 3]));
            assert!(errs[0].to_string().ends_with("on units 2-3"), "{}", errs[0]);
        }
        other => panic!("expected one overlap, got {other:?}"),
    }
}

#[test]
fn unplaced_instances_get_placements_when_any_exist() {
    let m = model("A100-40GB");
    // The MIG guide's 3-2-1-1 example: creation order matters for the driver's default placement, not for us.
    for order in ["1g.5gb 1g.5gb 2g.10gb 3g.20gb", "3g.20gb 2g.10gb 1g.5gb 1g.5gb"] {
        let placed = validate(m, &specs(order)).expect("placeable");
        let as_specs: Vec<InstanceSpec> =
            placed.iter().map(|i| InstanceSpec { profile: i.profile.clone(), start: Some(i.start) }).collect();
        validate(m, &as_specs).expect("assigned placements are valid");
    }
    // Placed ones stay where they are; the free block is used whole.
    let placed = validate(m, &specs("1g.5gb@6 4g.20gb")).expect("placeable");
    assert_eq!(placed[1].start, 0);
    // Fill 1g instances away from the aligned blocks: one 1g leaves room for a 4g.
    let placed = validate(m, &specs("1g.5gb")).expect("placeable");
    assert_eq!(placed[0].start, 6, "a lone 1g should not block the 4g/3g blocks");
}

#[test]
fn unplaceable_instances_are_reported_with_the_free_units() {
    let errs = validate(model("H100-80GB"), &specs("3g.40gb@0 4g.40gb")).expect_err("no room");
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].code(), "mig_no_placement");
    assert!(errs[0].to_string().contains("free units: 4, 5, 6, 7"), "{}", errs[0]);
}

#[test]
fn combination_examples_from_the_reference_data_hold() {
    let data: serde_json::Value = serde_json::from_str(tessera_core::catalog::CATALOG_JSON).expect("json");
    let mut checked = 0;
    for (key, examples) in data["combination_examples"].as_object().expect("object") {
        let m = model(key);
        for ex in examples.as_array().expect("array") {
            let Some(gis) = ex["gis"].as_array() else {
                continue;
            };
            let names: Vec<&str> = gis.iter().filter_map(|g| g.as_str()).collect();
            let unplaced: Vec<InstanceSpec> =
                names.iter().map(|n| InstanceSpec { profile: (*n).to_string(), start: None }).collect();
            let valid = ex["valid"].as_bool().expect("valid flag");
            assert_eq!(validate(m, &unplaced).is_ok(), valid, "{key} {names:?}");
            // Where the data gives placements per profile, they must validate as given.
            if let Some(per_profile) = ex["placements"].as_object() {
                let mut placed = Vec::new();
                for (profile, pls) in per_profile {
                    for pl in pls.as_array().expect("list") {
                        let start = pl[0].as_u64().expect("start") as u8;
                        placed.push(InstanceSpec { profile: profile.clone(), start: Some(start) });
                    }
                }
                assert!(validate(m, &placed).is_ok(), "{key} {placed:?}");
            }
            checked += 1;
        }
    }
    assert!(checked >= 18, "only {checked} examples checked");
}

#[test]
fn maximal_layouts_are_valid_maximal_and_distinct() {
    for key in ["A30-24GB", "A100-40GB", "H100-80GB", "RTX-PRO-6000-Blackwell-96GB"] {
        let m = model(key);
        let base: Vec<usize> = m.base_profiles().collect();
        let all = maximal_layouts(m, Some(&base));
        assert!(!all.is_empty());
        let mut seen = std::collections::HashSet::new();
        for l in &all {
            let specs: Vec<InstanceSpec> = l
                .iter()
                .map(|&i| InstanceSpec { profile: m.profiles[i.profile].name.clone(), start: Some(i.start) })
                .collect();
            validate(m, &specs).unwrap_or_else(|e| panic!("{key}: {specs:?} invalid: {e:?}"));
            let base_addable = addable(m, l).into_iter().filter(|i| base.contains(&i.profile)).count();
            assert_eq!(base_addable, 0, "{key}: {specs:?} is not maximal");
            assert!(seen.insert(l.clone()), "{key}: duplicate {specs:?}");
        }
    }
    // A100-40GB and H100-80GB share one geometry, so they have the same number of maximal layouts.
    let a = model("A100-40GB");
    let h = model("H100-80GB");
    assert_eq!(maximal_layouts(a, None).len(), maximal_layouts(h, None).len());
    // A30: 4 units, 1g/2g/4g base profiles: {4g}, {2g,2g}, {2g,1g,1g} x2 positions, {1g x4} -> 5.
    let a30 = model("A30-24GB");
    let base: Vec<usize> = a30.base_profiles().collect();
    assert_eq!(maximal_layouts(a30, Some(&base)).len(), 5);
}

#[test]
fn instance_specs_parse_and_reject_garbage() {
    assert_eq!("3g.40gb@4".parse::<InstanceSpec>(), Ok(InstanceSpec { profile: "3g.40gb".into(), start: Some(4) }));
    assert_eq!("1g.10gb".parse::<InstanceSpec>(), Ok(InstanceSpec { profile: "1g.10gb".into(), start: None }));
    assert!("3g.40gb@x".parse::<InstanceSpec>().is_err());
    assert!("@4".parse::<InstanceSpec>().is_err());
    assert!("".parse::<InstanceSpec>().is_err());
}

#[test]
fn units_of_lists_set_bits() {
    assert_eq!(layout::units_of(0b1011_0000), vec![4, 5, 7]);
}

mod properties {
    use proptest::prelude::*;
    use tessera_core::catalog::Catalog;
    use tessera_core::layout::{InstanceSpec, validate};

    /// Any model, any mix of real and made-up profile names, any starts (or none).
    fn any_layout() -> impl Strategy<Value = (usize, Vec<(usize, Option<u8>)>)> {
        let models = Catalog::builtin().models.len();
        (0..models, prop::collection::vec((0usize..20, prop::option::of(0u8..20)), 0..10))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, .. ProptestConfig::default() })]

        /// Validation never panics; what it accepts is fully placed, valid as placed, and keeps given starts.
        #[test]
        fn validation_is_total_and_consistent((m, items) in any_layout()) {
            let model = &Catalog::builtin().models[m];
            let specs: Vec<InstanceSpec> = items
                .iter()
                .map(|&(p, start)| InstanceSpec {
                    profile: model.profiles.get(p).map_or_else(|| format!("{p}g.bogus"), |p| p.name.clone()),
                    start,
                })
                .collect();
            match validate(model, &specs) {
                Ok(placed) => {
                    prop_assert_eq!(placed.len(), specs.len());
                    for (spec, inst) in specs.iter().zip(&placed) {
                        prop_assert_eq!(&spec.profile, &inst.profile);
                        if let Some(s) = spec.start {
                            prop_assert_eq!(s, inst.start);
                        }
                    }
                    let again: Vec<InstanceSpec> =
                        placed.iter().map(|i| InstanceSpec { profile: i.profile.clone(), start: Some(i.start) }).collect();
                    prop_assert!(validate(model, &again).is_ok());
                }
                Err(errors) => prop_assert!(!errors.is_empty()),
            }
        }
    }
}

#[test]
fn instances_cannot_own_more_engines_than_the_gpu_has() {
    // A30 has one OFA and one JPEG engine; each +me variant takes them.
    let errs = validate(model("A30-24GB"), &specs("1g.6gb+me@0 2g.12gb+me@2")).expect_err("two +me");
    let codes: Vec<&str> = errs.iter().map(LayoutError::code).collect();
    assert_eq!(codes, vec!["mig_engines_exceeded", "mig_engines_exceeded"], "{errs:?}");
    assert!(errs.iter().any(|e| e.to_string().contains("need 2 ofa engines, but A30-24GB has 1")), "{errs:?}");
    // +me.all takes every decoder of an RTX PRO 6000: a base 1g beside it has none left; a -me 1g is fine.
    let rtx = model("RTX-PRO-6000-Blackwell-96GB");
    assert!(validate(rtx, &specs("1g.24gb+me.all@0 1g.24gb@3")).is_err());
    assert!(validate(rtx, &specs("1g.24gb+me.all@0 1g.24gb-me@3 2g.48gb-me@6")).is_ok());
    // What the data shows as valid stays valid: seven 1g on H100, the 1g+me beside six plain 1g.
    assert!(validate(model("H100-80GB"), &specs("1g.10gb+me 1g.10gb 1g.10gb 1g.10gb 1g.10gb 1g.10gb 1g.10gb")).is_ok());
}

#[test]
fn engine_limits_are_enforced_only_where_the_catalog_is_consistent() {
    let c = Catalog::builtin();
    let ofa = tessera_core::catalog::ENGINES.iter().position(|e| *e == "ofa").expect("ofa");
    let nvdec = tessera_core::catalog::ENGINES.iter().position(|e| *e == "nvdec").expect("nvdec");
    assert_eq!(model("A100-40GB").engine_limits[ofa], Some(1));
    assert_eq!(model("H100-80GB").engine_limits[nvdec], Some(7));
    // B200's data gives the whole GPU one NVDEC but each 1g one too: seven 1g must stay valid, so no NVDEC limit.
    assert_eq!(model("B200-180GB").engine_limits[nvdec], None);
    assert!(validate(model("B200-180GB"), &specs("1g.23gb 1g.23gb 1g.23gb 1g.23gb 1g.23gb 1g.23gb 1g.23gb")).is_ok());
    // Every maximal base layout of every model passes validation.
    for m in &c.models {
        let base: Vec<usize> = m.base_profiles().collect();
        for l in maximal_layouts(m, Some(&base)) {
            let s: Vec<InstanceSpec> = l
                .iter()
                .map(|&i| InstanceSpec { profile: m.profiles[i.profile].name.clone(), start: Some(i.start) })
                .collect();
            assert!(validate(m, &s).is_ok(), "{}: {s:?}", m.key);
        }
    }
}

#[test]
fn overlaps_are_reported_once_per_instance() {
    let many = vec!["1g.10gb@0"; 500].join(" ");
    let errs = validate(model("H100-80GB"), &specs(&many)).expect_err("overlaps");
    let overlaps = errs.iter().filter(|e| e.code() == "mig_overlap").count();
    assert_eq!(overlaps, 499);
}

#[test]
fn stranded_compute_is_what_no_added_instance_can_reach() {
    let h100 = model("H100-80GB");
    let placed = |text: &str| validate(h100, &specs(text)).expect("valid");
    // Two 3g.40gb take all 8 memory slices and 6 of 7 compute slices: the 7th is out of reach.
    assert_eq!(layout::stranded_compute(h100, &placed("3g.40gb@0 3g.40gb@4")), 1);
    // An empty GPU and one with room for 1g instances strand nothing.
    assert_eq!(layout::stranded_compute(h100, &[]), 0);
    assert_eq!(layout::stranded_compute(h100, &placed("3g.40gb@4")), 0);
    assert_eq!(layout::stranded_compute(h100, &placed("4g.40gb@0 3g.40gb@4")), 0, "a full GPU has nothing free");
    let a30 = model("A30-24GB");
    assert_eq!(layout::stranded_compute(a30, &[]), 0);
}

#[test]
fn room_for_counts_what_fits_beside_the_instances_in_use() {
    let h100 = model("H100-80GB");
    let placed = |text: &str| validate(h100, &specs(text)).expect("valid");
    assert_eq!(layout::room_for(h100, &[], "1g.10gb"), 7);
    assert_eq!(layout::room_for(h100, &[], "3g.40gb"), 2);
    assert_eq!(layout::room_for(h100, &[], "7g.80gb"), 1);
    // A 1g in use at slot 0 leaves room for one 3g (at 4) but no 7g.
    assert_eq!(layout::room_for(h100, &placed("1g.10gb@0"), "3g.40gb"), 1);
    assert_eq!(layout::room_for(h100, &placed("1g.10gb@0"), "7g.80gb"), 0);
    assert_eq!(layout::room_for(h100, &placed("1g.10gb@0"), "1g.10gb"), 6);
    assert_eq!(layout::room_for(h100, &placed("3g.40gb@0 3g.40gb@4"), "1g.10gb"), 0, "no memory left");
    assert_eq!(layout::room_for(h100, &[], "9g.99gb"), 0, "no such profile");
}
