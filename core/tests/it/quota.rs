use proptest::prelude::*;
use tessera_core::catalog::Catalog;
use tessera_core::quota::{ApprovalPolicy, Decision, MILLI, Resource, Usage, accumulate, charge, check, show};
use tessera_core::request::SliceSpec;

fn res(text: &str) -> Resource {
    Resource::parse(Catalog::builtin(), text).expect("resource")
}

fn mig(profile: &str, model: Option<&str>) -> SliceSpec {
    SliceSpec::Mig { profile: profile.into(), model: model.map(Into::into) }
}

#[test]
fn resource_keys_parse_case_insensitively_to_canonical_names() {
    assert_eq!(res("mig/h100-80gb/1g.10gb").to_string(), "mig/H100-80GB/1g.10gb");
    assert_eq!(res("gpu/NVIDIA H100 80GB HBM3").to_string(), "gpu/H100-80GB");
    assert_eq!(res("timeslice/a100-40gb").to_string(), "timeslice/A100-40GB");
    assert_eq!(res("Compute_Slices"), Resource::ComputeSlices);
    for bad in ["mig/H100-80GB/3g.20gb", "gpu/T4", "cpu", "mig/H100-80GB", ""] {
        let err = Resource::parse(Catalog::builtin(), bad).expect_err(bad);
        assert_eq!(err.code(), "quota_bad_resource", "{bad}");
    }
    let r: Resource = serde_json::from_str(r#""mps/h200-141gb""#).expect("serde");
    assert_eq!(serde_json::to_string(&r).expect("json"), r#""mps/H200-141GB""#);
}

#[test]
fn requests_charge_their_resource_and_the_weighted_aggregates() {
    let c = Catalog::builtin();
    let u = charge(c, &mig("1g.10gb", Some("H100-80GB")), 2).expect("charge");
    assert_eq!(u[&res("mig/H100-80GB/1g.10gb")], 2 * MILLI);
    assert_eq!(u[&Resource::ComputeSlices], 2 * MILLI);
    assert_eq!(u[&Resource::MemoryGib], (2 * 9984 * MILLI).div_ceil(1024), "2 x 9984 MiB");

    // A quarter of an H100 weighs 7/4 compute slices.
    let u = charge(c, &SliceSpec::Timeslice { model: "H100-80GB".into(), replicas: 4 }, 1).expect("charge");
    assert_eq!(show(u[&Resource::ComputeSlices]), "1.75");
    assert_eq!(u[&res("timeslice/H100-80GB")], MILLI);

    let u = charge(c, &SliceSpec::Exclusive { model: "A100-80GB".into() }, 3).expect("charge");
    assert_eq!(u[&res("gpu/A100-80GB")], 3 * MILLI);
    assert_eq!(u[&Resource::ComputeSlices], 21 * MILLI);
    assert_eq!(u[&Resource::MemoryGib], 3 * 80 * MILLI);

    // Without a model: the aggregates at the most expensive model offering the profile, no per-model resource.
    let u = charge(c, &mig("1g.10gb", None), 1).expect("charge");
    assert_eq!(u.len(), 2);
    assert_eq!(u[&Resource::MemoryGib], (9984 * MILLI).div_ceil(1024), "H100's 1g.10gb is the largest");

    for (spec, why) in [
        (mig("3g.20gb", Some("H100-80GB")), "no MIG profile"),
        (mig("9g.1tb", None), "no GPU model has"),
        (SliceSpec::Mps { model: "H100-80GB".into(), replicas: 49 }, "between 2 and 48"),
        (SliceSpec::Exclusive { model: "T4".into() }, "unknown GPU model"),
    ] {
        let err = charge(c, &spec, 1).expect_err(why);
        assert!(err.to_string().contains(why), "{err}");
        assert_eq!(err.code(), "request_invalid");
    }
}

#[test]
fn check_reports_every_limit_a_request_would_exceed() {
    let c = Catalog::builtin();
    let limits: Usage = [(res("mig/H100-80GB/1g.10gb"), 4 * MILLI), (Resource::ComputeSlices, 5 * MILLI)].into();
    let held = charge(c, &mig("1g.10gb", Some("H100-80GB")), 3).expect("held");
    assert!(check(&limits, &held, &charge(c, &mig("1g.10gb", Some("H100-80GB")), 1).expect("one")).is_ok());
    let errs =
        check(&limits, &held, &charge(c, &mig("1g.10gb", Some("H100-80GB")), 3).expect("three")).expect_err("over");
    assert_eq!(errs.len(), 2);
    assert_eq!(errs[0].to_string(), "mig/H100-80GB/1g.10gb: 3 held + 3 requested would exceed the limit of 4");
    assert_eq!(errs[1].code(), "quota_exceeded");
    // Resources without a limit are unlimited.
    assert!(check(&Usage::new(), &held, &held).is_ok());
}

#[test]
fn small_requests_are_auto_approved_when_the_policy_allows() {
    let c = Catalog::builtin();
    let policy = ApprovalPolicy { auto_approve: true, auto_approve_max_compute_slices: 2 };
    assert_eq!(policy.decide(&charge(c, &mig("2g.20gb", Some("H100-80GB")), 1).expect("2g")), Decision::AutoApprove);
    assert_eq!(policy.decide(&charge(c, &mig("3g.40gb", Some("H100-80GB")), 1).expect("3g")), Decision::NeedsAdmin);
    let off = ApprovalPolicy { auto_approve: false, ..policy };
    assert_eq!(off.decide(&charge(c, &mig("1g.10gb", Some("H100-80GB")), 1).expect("1g")), Decision::NeedsAdmin);
}

proptest! {
    /// Admitting requests one by one through `check` never takes any limited resource over its limit.
    #[test]
    fn admission_through_check_never_overshoots(
        limits in prop::collection::vec(0u64..20, 3),
        requests in prop::collection::vec((0usize..5, 1u32..4), 0..40),
    ) {
        let c = Catalog::builtin();
        let limit_map: Usage = [
            (res("mig/H100-80GB/1g.10gb"), limits[0] * MILLI),
            (res("timeslice/H100-80GB"), limits[1] * MILLI),
            (Resource::ComputeSlices, limits[2] * MILLI),
        ].into();
        let specs = [
            mig("1g.10gb", Some("H100-80GB")),
            mig("3g.40gb", Some("H100-80GB")),
            mig("1g.10gb", None),
            SliceSpec::Timeslice { model: "H100-80GB".into(), replicas: 3 },
            SliceSpec::Exclusive { model: "H100-80GB".into() },
        ];
        let mut held = Usage::new();
        for (k, count) in requests {
            let add = charge(c, &specs[k], count).expect("charge");
            if check(&limit_map, &held, &add).is_ok() {
                accumulate(&mut held, &add);
            }
        }
        for (r, limit) in &limit_map {
            prop_assert!(held.get(r).copied().unwrap_or(0) <= *limit, "{} over", r);
        }
    }
}
