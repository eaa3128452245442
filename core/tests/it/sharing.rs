use tessera_core::catalog::Catalog;
use tessera_core::layout::PlacedInstance;
use tessera_core::sharing::{GpuSharing, InstanceSharing, Sharing, validate_gpu, validate_node};

fn h100() -> &'static tessera_core::GpuModel {
    Catalog::builtin().model("H100-80GB").expect("model")
}

fn layout() -> Vec<PlacedInstance> {
    vec![PlacedInstance { profile: "3g.40gb".into(), start: 4 }, PlacedInstance { profile: "1g.10gb".into(), start: 0 }]
}

fn on(profile: &str, start: u8, sharing: Sharing) -> InstanceSharing {
    InstanceSharing { profile: profile.into(), start, sharing }
}

fn codes(r: Result<(), Vec<tessera_core::sharing::SharingError>>) -> Vec<&'static str> {
    r.err().unwrap_or_default().iter().map(|e| e.code()).collect()
}

#[test]
fn whole_gpu_timeslice_and_mps_are_accepted_without_mig() {
    for s in [Sharing::Exclusive, Sharing::Timeslice { replicas: 4 }, Sharing::Mps { replicas: 48 }] {
        let g = GpuSharing { mig_enabled: false, gpu: s, instances: vec![] };
        assert_eq!(validate_gpu(h100(), &[], &g), Ok(()), "{s:?}");
    }
}

#[test]
fn timeslicing_inside_mig_instances_is_accepted() {
    let g = GpuSharing {
        mig_enabled: true,
        gpu: Sharing::Exclusive,
        instances: vec![on("3g.40gb", 4, Sharing::Timeslice { replicas: 3 }), on("1g.10gb", 0, Sharing::Exclusive)],
    };
    assert_eq!(validate_gpu(h100(), &layout(), &g), Ok(()));
}

#[test]
fn what_nvidias_stack_rejects_is_rejected() {
    let mig = |instances| GpuSharing { mig_enabled: true, gpu: Sharing::Exclusive, instances };
    assert_eq!(
        codes(validate_gpu(h100(), &layout(), &mig(vec![on("3g.40gb", 4, Sharing::Mps { replicas: 2 })]))),
        vec!["sharing_mps_on_mig"]
    );
    assert_eq!(
        codes(validate_gpu(
            h100(),
            &layout(),
            &GpuSharing { mig_enabled: true, gpu: Sharing::Timeslice { replicas: 2 }, instances: vec![] }
        )),
        vec!["sharing_whole_gpu_on_mig"]
    );
    assert_eq!(
        codes(validate_gpu(
            h100(),
            &[],
            &GpuSharing { mig_enabled: false, gpu: Sharing::Mps { replicas: 49 }, instances: vec![] }
        )),
        vec!["sharing_replicas_out_of_range"]
    );
    assert_eq!(
        codes(validate_gpu(
            h100(),
            &[],
            &GpuSharing { mig_enabled: false, gpu: Sharing::Timeslice { replicas: 1 }, instances: vec![] }
        )),
        vec!["sharing_replicas_out_of_range"]
    );
    assert_eq!(
        codes(validate_gpu(h100(), &layout(), &mig(vec![on("2g.20gb", 2, Sharing::Timeslice { replicas: 2 })]))),
        vec!["sharing_unknown_instance"]
    );
    assert_eq!(
        codes(validate_gpu(
            h100(),
            &layout(),
            &mig(vec![on("1g.10gb", 0, Sharing::Timeslice { replicas: 2 }), on("MIG 1g.10gb", 0, Sharing::Exclusive)])
        )),
        vec!["sharing_duplicate_instance"]
    );
    assert_eq!(
        codes(validate_gpu(
            h100(),
            &[],
            &GpuSharing {
                mig_enabled: false,
                gpu: Sharing::Exclusive,
                instances: vec![on("1g.10gb", 0, Sharing::Exclusive)]
            }
        )),
        vec!["sharing_mig_disabled"]
    );
}

#[test]
fn a_node_does_not_mix_timeslicing_and_mps() {
    let ts = GpuSharing {
        mig_enabled: true,
        gpu: Sharing::Exclusive,
        instances: vec![on("1g.10gb", 0, Sharing::Timeslice { replicas: 2 })],
    };
    let mps = GpuSharing { mig_enabled: false, gpu: Sharing::Mps { replicas: 4 }, instances: vec![] };
    let err = validate_node([("gpu0", &ts), ("gpu1", &mps)]).expect_err("mixed");
    assert_eq!(err.code(), "sharing_mixed_strategies");
    assert!(err.to_string().contains("gpu0/1g.10gb@0") && err.to_string().contains("gpu1"), "{err}");
    assert!(validate_node([("gpu0", &ts), ("gpu1", &ts)]).is_ok());
}

#[test]
fn sharing_round_trips_as_tagged_json() {
    let s: Sharing = serde_json::from_str(r#"{"mode":"timeslice","replicas":4}"#).expect("parse");
    assert_eq!(s, Sharing::Timeslice { replicas: 4 });
    assert_eq!(serde_json::to_string(&Sharing::Exclusive).expect("json"), r#"{"mode":"exclusive"}"#);
}

#[test]
fn sharing_keys_round_trip() {
    for s in [Sharing::Exclusive, Sharing::Timeslice { replicas: 4 }, Sharing::Mps { replicas: 48 }] {
        assert_eq!(Sharing::from_key(&s.key()), Some(s));
    }
    assert_eq!(Sharing::Timeslice { replicas: 4 }.key(), "timeslice:4");
    for bad in ["", "shared", "mps:", "timeslice:x", "1g.10gb"] {
        assert_eq!(Sharing::from_key(bad), None, "{bad}");
    }
}
