use proptest::prelude::*;
use tessera_core::request::{ALL_STATES, RequestState, SliceSpec};

#[test]
fn the_life_of_a_request_follows_the_documented_moves() {
    use RequestState::*;
    let allowed = [
        (Pending, Approved),
        (Pending, Rejected),
        (Pending, Cancelled),
        (Pending, Expired),
        (Approved, Provisioning),
        (Approved, Cancelled),
        (Approved, Failed),
        (Approved, Expired),
        (Provisioning, Active),
        (Provisioning, Cancelled),
        (Provisioning, Failed),
        (Active, Released),
        (Active, Expired),
        (Active, Failed),
    ];
    for from in ALL_STATES {
        for to in ALL_STATES {
            let ok = allowed.contains(&(from, to));
            assert_eq!(from.transition(to).is_ok(), ok, "{from} -> {to}");
        }
    }
}

#[test]
fn refused_moves_say_what_is_possible() {
    let err = RequestState::Active.transition(RequestState::Approved).expect_err("refused");
    assert_eq!(err.code(), "request_invalid_transition");
    assert_eq!(
        err.to_string(),
        "a request that is active cannot become approved (from active it can become released, expired, failed)"
    );
    let err = RequestState::Released.transition(RequestState::Active).expect_err("final");
    assert!(err.to_string().ends_with("(released is final)"), "{err}");
}

#[test]
fn quota_is_held_exactly_by_live_requests() {
    let holding: Vec<RequestState> = ALL_STATES.into_iter().filter(|s| s.holds_quota()).collect();
    use RequestState::*;
    assert_eq!(holding, vec![Pending, Approved, Provisioning, Active]);
    for s in ALL_STATES {
        assert_eq!(s.is_terminal(), s.next_states().is_empty(), "{s}");
        assert_eq!(s.as_str().parse::<RequestState>(), Ok(s));
    }
    assert!("done".parse::<RequestState>().is_err());
}

#[test]
fn slice_specs_are_tagged_by_mode() {
    let s: SliceSpec = serde_json::from_str(r#"{"mode": "mig", "profile": "1g.10gb"}"#).expect("mig");
    assert_eq!(s, SliceSpec::Mig { profile: "1g.10gb".into(), model: None });
    let s: SliceSpec =
        serde_json::from_str(r#"{"mode": "timeslice", "model": "H100-80GB", "replicas": 4}"#).expect("ts");
    assert_eq!(s, SliceSpec::Timeslice { model: "H100-80GB".into(), replicas: 4 });
    assert!(serde_json::from_str::<SliceSpec>(r#"{"mode": "exclusive"}"#).is_err(), "exclusive needs a model");
    assert!(serde_json::from_str::<SliceSpec>(r#"{"mode": "mig", "profile": "1g.10gb", "count": 2}"#).is_err());
}

proptest! {
    /// Whatever is attempted, a request only moves along allowed edges and never leaves a final state.
    #[test]
    fn attempted_moves_never_break_the_life_cycle(attempts in prop::collection::vec(0usize..9, 0..30)) {
        let mut state = RequestState::Pending;
        for a in attempts {
            let to = ALL_STATES[a];
            match state.transition(to) {
                Ok(next) => {
                    prop_assert!(state.next_states().contains(&next));
                    prop_assert!(!state.is_terminal());
                    state = next;
                }
                Err(e) => prop_assert_eq!((e.from, e.to), (state, to)),
            }
        }
    }
}

#[test]
fn a_drain_ends_only_what_holds_slices_and_only_by_a_move_its_life_allows() {
    for state in ALL_STATES {
        match state.ended_by_drain() {
            Some(to) => {
                assert_eq!(state.transition(to), Ok(to), "{state} -> {to}");
                assert!(to.is_terminal(), "{state} ends for good, not {to}");
            }
            None => assert!(
                matches!(state, RequestState::Pending) || state.is_terminal(),
                "{state} holds slices and must end"
            ),
        }
    }
    assert_eq!(RequestState::Active.ended_by_drain(), Some(RequestState::Released));
    assert_eq!(RequestState::Provisioning.ended_by_drain(), Some(RequestState::Cancelled));
}
