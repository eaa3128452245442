use serde_json::json;
use tessera_core::catalog::Catalog;
use tessera_core::planner::{Plan, plan};

use crate::support::{check_plan, input};

fn run(j: serde_json::Value) -> Plan {
    let i = input(j);
    let p = plan(Catalog::builtin(), &i).expect("plan");
    check_plan(&i, &p);
    p
}

#[test]
fn existing_free_instances_are_handed_out_before_anything_changes() {
    let p = run(json!({
        "gpus": [
            {"id": "a", "model": "H100-80GB"},
            {"id": "b", "model": "H100-80GB", "instances": [{"profile": "1g.10gb", "start": 6}, {"profile": "3g.40gb", "start": 0, "in_use": true}]}
        ],
        "demand": [{"profile": "1g.10gb", "count": 1}]
    }));
    assert_eq!(p.placed.len(), 1);
    assert_eq!((p.placed[0].gpu.as_str(), p.placed[0].start, p.placed[0].new), ("b", 6, false));
    assert!(p.changed_gpus.is_empty());
}

#[test]
fn in_use_instances_are_never_destroyed_and_the_reason_is_given() {
    let p = run(json!({
        "gpus": [{"id": "a", "model": "H100-80GB", "instances": [{"profile": "1g.10gb", "start": 6, "in_use": true}]}],
        "demand": [{"profile": "7g.80gb", "count": 1}, {"profile": "4g.40gb", "count": 1}]
    }));
    assert_eq!(p.placed.len(), 1, "4g fits beside the in-use 1g");
    assert_eq!(p.unplaced.len(), 1);
    assert_eq!(p.unplaced[0].profile, "7g.80gb");
    assert_eq!(p.unplaced[0].code, "insufficient_capacity");
    assert!(p.destroyed.is_empty());
}

#[test]
fn free_instances_in_the_way_are_destroyed_and_listed() {
    let p = run(json!({
        "gpus": [{"id": "a", "model": "A100-40GB", "instances": [{"profile": "1g.5gb", "start": 3}]}],
        "demand": [{"profile": "7g.40gb", "count": 1}]
    }));
    assert_eq!(p.placed.len(), 1);
    assert_eq!(p.destroyed.len(), 1);
    assert_eq!((p.destroyed[0].profile.as_str(), p.destroyed[0].start), ("1g.5gb", 3));
    assert_eq!(p.changed_gpus[0].layout.len(), 1);
}

#[test]
fn cordoned_gpus_get_nothing() {
    let p = run(json!({
        "gpus": [{"id": "a", "model": "H100-80GB", "cordoned": true, "instances": [{"profile": "1g.10gb", "start": 0}]}],
        "demand": [{"profile": "1g.10gb", "count": 2}]
    }));
    assert!(p.placed.is_empty());
    assert_eq!(p.unplaced[0].code, "all_matching_gpus_cordoned");
    assert_eq!(p.unplaced[0].count, 2);
}

#[test]
fn model_constraints_are_kept() {
    let p = run(json!({
        "gpus": [{"id": "h", "model": "H100-80GB"}, {"id": "a", "model": "NVIDIA A100-SXM4-80GB"}],
        "demand": [{"profile": "1g.10gb", "count": 2, "model": "A100-80GB"}, {"profile": "3g.71gb", "count": 1, "model": "H200-141GB"}]
    }));
    assert!(p.placed.iter().all(|s| s.gpu == "a"));
    assert_eq!(p.unplaced[0].code, "no_matching_gpu");
    assert!(
        p.unplaced[0].reason.contains("no GPU in the fleet offers 3g.71gb on H200-141GB"),
        "{}",
        p.unplaced[0].reason
    );
}

#[test]
fn demand_goes_to_as_few_gpus_as_possible() {
    let gpus: Vec<_> = (0..4).map(|i| json!({"id": format!("g{i}"), "model": "H100-80GB"})).collect();
    let p =
        run(json!({"gpus": gpus, "demand": [{"profile": "1g.10gb", "count": 3}, {"profile": "2g.20gb", "count": 2}]}));
    assert_eq!(p.summary.placed, 5);
    assert_eq!(p.summary.gpus_touched, 1, "{p:#?}");
    assert_eq!(p.summary.stranded_compute_slices, 0);
}

#[test]
fn wide_and_narrow_demand_share_gpus_when_that_places_everything() {
    // Narrow-first would put six 1g on one GPU and strand a 4g; the planner places all eight.
    let p = run(json!({
        "gpus": [{"id": "a", "model": "H100-80GB"}, {"id": "b", "model": "H100-80GB"}],
        "demand": [{"profile": "1g.10gb", "count": 6}, {"profile": "4g.40gb", "count": 2}]
    }));
    assert_eq!(p.summary.placed, 8, "{p:#?}");
}

#[test]
fn when_capacity_is_short_more_slices_beat_wider_ones() {
    let p = run(json!({
        "gpus": [{"id": "a", "model": "A100-40GB"}],
        "demand": [{"profile": "7g.40gb", "count": 1}, {"profile": "1g.5gb", "count": 7}]
    }));
    assert_eq!(p.summary.placed, 7);
    assert_eq!(p.unplaced[0].profile, "7g.40gb");
}

#[test]
fn new_instances_sit_at_exact_placements_that_keep_large_blocks_free() {
    let p = run(json!({"gpus": [{"id": "a", "model": "H100-80GB"}], "demand": [{"profile": "1g.10gb", "count": 1}]}));
    // At unit 6 the 1g leaves 0-3 for a 4g and 4-5 for a 2g; at unit 0 it would strand a slice.
    assert_eq!(p.placed[0].start, 6);
    assert!(p.placed[0].new);
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let catalog = Catalog::builtin();
    let cases = [
        (json!({"gpus": [{"id": "a", "model": "T4"}], "demand": []}), "unknown_gpu_model"),
        (
            json!({"gpus": [{"id": "a", "model": "H100-80GB"}], "demand": [{"profile": "3g.99gb", "count": 1}]}),
            "mig_unknown_profile",
        ),
        (
            json!({"gpus": [], "demand": [{"profile": "1g.10gb", "count": 1, "model": "A30-24GB"}]}),
            "mig_unknown_profile",
        ),
        (
            json!({"gpus": [{"id": "a", "model": "H100-80GB"}, {"id": "a", "model": "H100-80GB"}], "demand": []}),
            "plan_duplicate_gpu",
        ),
        (json!({"gpus": [], "demand": [{"profile": "1g.10gb", "count": 0}]}), "plan_bad_count"),
        (
            json!({"gpus": [{"id": "a", "model": "H100-80GB", "instances": [{"profile": "3g.40gb", "start": 2}]}], "demand": []}),
            "mig_layout_invalid",
        ),
    ];
    for (j, code) in cases {
        let err = plan(catalog, &input(j.clone())).expect_err("must fail");
        assert_eq!(err.code(), code, "{j}: {err}");
    }
    assert!(
        serde_json::from_value::<tessera_core::planner::PlanInput>(json!({"gpus": [], "demand": [], "extra": 1}))
            .is_err()
    );
}

#[test]
fn a_new_gpu_is_opened_where_the_whole_request_fits() {
    // The A100 has room for two 1g.10gb beside its in-use instances; the empty H100 takes all five. Filling the
    // A100 first would change two GPUs.
    let p = run(json!({
        "gpus": [
            {"id": "a100", "model": "A100-40GB", "instances": [{"profile": "2g.10gb", "start": 2, "in_use": true}, {"profile": "1g.10gb", "start": 4, "in_use": true}]},
            {"id": "h100", "model": "H100-80GB"}
        ],
        "demand": [{"profile": "1g.10gb", "count": 5}]
    }));
    assert_eq!(p.summary.placed, 5);
    assert_eq!(p.summary.gpus_touched, 1, "{p:#?}");
    assert!(p.placed.iter().all(|s| s.gpu == "h100"));
}
