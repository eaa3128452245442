use std::collections::BTreeMap;

use proptest::prelude::*;
use tessera_core::catalog::Catalog;
use tessera_core::quota::{MILLI, QuotaError, Resource, Usage};
use tessera_core::quota_request::{
    AskError, Change, MAX_LINES, MAX_TEMPORARY_MS, MIN_TEMPORARY_MS, QuotaRequestState, amount, check_ask, check_grant,
    grant_range, needed_limits, revert,
};

fn res(text: &str) -> Resource {
    Resource::parse(Catalog::builtin(), text).expect("resource")
}

const NOW: i64 = 1_800_000_000_000;

fn limits(pairs: &[(&str, u64)]) -> Usage {
    pairs.iter().map(|(r, m)| (res(r), m * MILLI)).collect()
}

#[test]
fn an_ask_names_changes_within_bounds() {
    let current = limits(&[("compute_slices", 7), ("gpu/H100-80GB", 1)]);
    let lines = check_ask(&[(Resource::ComputeSlices, 14 * MILLI)], &current, None, NOW).expect("ask");
    assert_eq!(lines[0].before, Some(7 * MILLI));
    assert_eq!(lines[0].asked, 14 * MILLI);

    assert_eq!(check_ask(&[], &current, None, NOW), Err(AskError::Empty));
    let many: Vec<(Resource, u64)> = (0..=MAX_LINES).map(|i| (Resource::ComputeSlices, i as u64)).collect();
    assert_eq!(check_ask(&many, &current, None, NOW), Err(AskError::TooMany(MAX_LINES + 1)));
    let twice = [(Resource::ComputeSlices, MILLI), (res("COMPUTE_SLICES"), 2 * MILLI)];
    assert_eq!(check_ask(&twice, &current, None, NOW).expect_err("refused").code(), "quota_request_invalid");
    let same = check_ask(&[(Resource::ComputeSlices, 7 * MILLI)], &current, None, NOW).expect_err("refused");
    assert_eq!(same.code(), "quota_unchanged");
    // A decrease, or a limit on an unlimited resource, may be asked for to keep.
    assert!(check_ask(&[(Resource::ComputeSlices, 3 * MILLI)], &current, None, NOW).is_ok());
    assert!(check_ask(&[(Resource::MemoryGib, 80 * MILLI)], &current, None, NOW).is_ok());
}

#[test]
fn a_temporary_ask_raises_an_existing_limit_and_ends_in_bounds() {
    let current = limits(&[("compute_slices", 7)]);
    let up = [(Resource::ComputeSlices, 14 * MILLI)];
    for until in [NOW + MIN_TEMPORARY_MS, NOW + MAX_TEMPORARY_MS] {
        assert!(check_ask(&up, &current, Some(until), NOW).is_ok(), "{until}");
    }
    for until in [NOW, NOW + MIN_TEMPORARY_MS - 1, NOW + MAX_TEMPORARY_MS + 1, i64::MIN, i64::MAX] {
        assert_eq!(check_ask(&up, &current, Some(until), NOW), Err(AskError::BadEnd), "{until}");
    }
    let until = Some(NOW + 86_400_000);
    let down = check_ask(&[(Resource::ComputeSlices, 3 * MILLI)], &current, until, NOW).expect_err("refused");
    assert_eq!(down.code(), "quota_temporary_not_increase");
    let unlimited = check_ask(&[(Resource::MemoryGib, 80 * MILLI)], &current, until, NOW).expect_err("refused");
    assert_eq!(unlimited.code(), "quota_temporary_not_increase");
    assert!(unlimited.to_string().contains("now unlimited"), "{unlimited}");
}

#[test]
fn amounts_are_finite_and_bounded() {
    assert_eq!(amount("compute_slices", 1.75), Ok(1750));
    assert_eq!(amount("compute_slices", 1e12), Ok(1_000_000_000_000_000));
    for bad in [-1.0, 1e12 + 1.0, f64::NAN, f64::INFINITY] {
        assert_eq!(amount("x", bad).expect_err("refused").code(), "quota_bad_limit", "{bad}");
    }
    let over = check_ask(&[(Resource::ComputeSlices, u64::MAX)], &Usage::new(), None, NOW).expect_err("refused");
    assert_eq!(over.code(), "quota_bad_limit");
}

#[test]
fn a_grant_gives_at_most_what_was_asked_and_never_takes_away() {
    let current = limits(&[("compute_slices", 7), ("gpu/H100-80GB", 1)]);
    let asked = [(Resource::ComputeSlices, 14 * MILLI), (res("gpu/H100-80GB"), 2 * MILLI)];
    let lines = check_ask(&asked, &current, None, NOW).expect("ask");

    let all = check_grant(&lines, None, &current).expect("in full");
    assert_eq!(all.len(), 2);
    assert!(all.iter().all(|c| lines.iter().any(|l| l.resource == c.resource && l.asked == c.after)));

    let part: BTreeMap<Resource, u64> = [(Resource::ComputeSlices, 10 * MILLI)].into();
    let changes = check_grant(&lines, Some(&part), &current).expect("in part");
    assert_eq!(changes.len(), 1, "the GPU line was left out, so not granted");
    assert_eq!((changes[0].before, changes[0].after), (Some(7 * MILLI), 10 * MILLI));

    for (amount, ok) in [(6, false), (7, false), (14, true), (15, false)] {
        let g: BTreeMap<Resource, u64> = [(Resource::ComputeSlices, amount * MILLI)].into();
        let got = check_grant(&lines, Some(&g), &current);
        assert_eq!(got.is_ok(), ok, "{amount}: {got:?}");
        if amount == 7 {
            assert_eq!(got, Err(AskError::Nothing), "granting the limit in force changes nothing");
        }
    }
    let other: BTreeMap<Resource, u64> = [(Resource::MemoryGib, MILLI)].into();
    assert_eq!(check_grant(&lines, Some(&other), &current), Err(AskError::NotAsked(Resource::MemoryGib)));
}

#[test]
fn the_range_follows_the_limit_in_force_at_decision_time() {
    let current = limits(&[("compute_slices", 7)]);
    let lines = check_ask(&[(Resource::ComputeSlices, 14 * MILLI)], &current, None, NOW).expect("ask");
    // An admin raised the limit to 10 meanwhile: from 10 to 14 may still be granted.
    assert_eq!(grant_range(&lines[0], Some(10 * MILLI)), Some((10 * MILLI, Some(14 * MILLI))));
    // Raised to the ask, past it, or made unlimited meanwhile: nothing is left to grant.
    for now in [Some(14 * MILLI), Some(16 * MILLI), None] {
        assert_eq!(grant_range(&lines[0], now), None, "{now:?}");
    }
}

#[test]
fn approving_never_lowers_a_limit_raised_meanwhile() {
    // The tenant at 7 asks for 10; an admin sets 12 before deciding: approving as asked would set 10.
    let lines =
        check_ask(&[(Resource::ComputeSlices, 10 * MILLI)], &limits(&[("compute_slices", 7)]), None, NOW).expect("ask");
    let raised = limits(&[("compute_slices", 12)]);
    let met = check_grant(&lines, None, &raised).expect_err("nothing to grant");
    assert_eq!(met, AskError::AlreadyMet { resource: Resource::ComputeSlices, limit: Some(12 * MILLI) });
    assert_eq!(met.code(), "quota_ask_already_met");
    assert!(met.to_string().contains("already gives what was asked"), "{met}");
    let ten: BTreeMap<Resource, u64> = [(Resource::ComputeSlices, 10 * MILLI)].into();
    assert_eq!(check_grant(&lines, Some(&ten), &raised).expect_err("refused").code(), "quota_ask_already_met");

    // Two lines, one met meanwhile: approving in full grants the other alone.
    let start = limits(&[("compute_slices", 7), ("gpu/H100-80GB", 1)]);
    let asked = [(Resource::ComputeSlices, 10 * MILLI), (res("gpu/H100-80GB"), 2 * MILLI)];
    let lines = check_ask(&asked, &start, None, NOW).expect("ask");
    let now = limits(&[("compute_slices", 12), ("gpu/H100-80GB", 1)]);
    let changes = check_grant(&lines, None, &now).expect("the GPU line");
    assert_eq!(changes, vec![Change { resource: res("gpu/H100-80GB"), before: Some(MILLI), after: 2 * MILLI }]);
}

#[test]
fn a_decrease_is_granted_downwards_only() {
    // A tenant giving back: 7 down to 4. Between 4 and the limit in force may be granted; nothing above it.
    let lines =
        check_ask(&[(Resource::ComputeSlices, 4 * MILLI)], &limits(&[("compute_slices", 7)]), None, NOW).expect("ask");
    assert_eq!(grant_range(&lines[0], Some(7 * MILLI)), Some((4 * MILLI, Some(7 * MILLI))));
    // Lowered to 3 by an admin meanwhile: already met, approving would raise it.
    assert_eq!(grant_range(&lines[0], Some(3 * MILLI)), None);
    assert_eq!(
        check_grant(&lines, None, &limits(&[("compute_slices", 3)])).expect_err("met").code(),
        "quota_ask_already_met"
    );
    // From unlimited: any limit from the amount asked up.
    let from_unlimited = check_ask(&[(Resource::ComputeSlices, 4 * MILLI)], &Usage::new(), None, NOW).expect("ask");
    assert_eq!(grant_range(&from_unlimited[0], None), Some((4 * MILLI, None)));
}

#[test]
fn ending_takes_back_exactly_the_increment() {
    // Nobody touched the limit: back to where it was.
    assert_eq!(revert(Some(14 * MILLI), Some(7 * MILLI), 14 * MILLI), Some(7 * MILLI));
    // An admin raised it by 2 meanwhile: that stays.
    assert_eq!(revert(Some(16 * MILLI), Some(7 * MILLI), 14 * MILLI), Some(9 * MILLI));
    // Lowered below the increment meanwhile: never below zero.
    assert_eq!(revert(Some(3 * MILLI), Some(7 * MILLI), 14 * MILLI), Some(0));
    // Made unlimited meanwhile: stays unlimited.
    assert_eq!(revert(None, Some(7 * MILLI), 14 * MILLI), None);
}

#[test]
fn a_quota_refusal_names_the_limits_that_would_let_it_through() {
    let errors = [
        QuotaError::Exceeded {
            resource: Resource::ComputeSlices,
            limit: 7 * MILLI,
            held: 5 * MILLI,
            requested: 3 * MILLI,
        },
        QuotaError::BadRequest("x".into()),
    ];
    let needed = needed_limits(&errors);
    assert_eq!(needed, [(Resource::ComputeSlices, 8 * MILLI)].into());
}

#[test]
fn states_move_one_way() {
    use QuotaRequestState::*;
    for s in QuotaRequestState::ALL {
        assert_eq!(QuotaRequestState::parse(s.as_str()), Some(s));
        assert!(!s.next_states().contains(&Pending), "{s}");
    }
    assert_eq!(Pending.next_states(), &[Approved, Rejected, Cancelled]);
    assert_eq!(Approved.next_states(), &[Ended]);
    assert!(Ended.next_states().is_empty());
}

proptest! {
    /// Whatever the limits, the ask and the grant: a grant's limits lie between the limit in force and the amount
    /// asked, and a temporary grant ended with nothing changed in between gives back the limit it started from.
    #[test]
    fn grants_stay_in_range_and_end_where_they_started(
        before in 0u64..1_000_000,
        asked in 0u64..1_000_000,
        meanwhile in proptest::option::of(0u64..1_000_000),
        pick in 0u64..=1000,
    ) {
        let start = limits(&[]).into_iter().chain([(Resource::ComputeSlices, before)]).collect::<Usage>();
        let Ok(lines) = check_ask(&[(Resource::ComputeSlices, asked)], &start, None, NOW) else {
            prop_assert_eq!(before, asked);
            return Ok(());
        };
        let now: Usage = match meanwhile {
            Some(m) => [(Resource::ComputeSlices, m)].into(),
            None => Usage::new(),
        };
        let in_force = now.get(&Resource::ComputeSlices).copied();
        let Some((low, high)) = grant_range(&lines[0], in_force) else {
            prop_assert_eq!(check_grant(&lines, None, &now).map_err(|e| e.code()), Err("quota_ask_already_met"));
            return Ok(());
        };
        let amount = match high { Some(h) => low + (h - low) * pick / 1000, None => low + pick };
        let g: BTreeMap<Resource, u64> = [(Resource::ComputeSlices, amount)].into();
        match check_grant(&lines, Some(&g), &now) {
            Ok(changes) => {
                let c = &changes[0];
                prop_assert!(c.after >= low && high.is_none_or(|h| c.after <= h));
                prop_assert!(c.after.min(asked) <= asked.max(c.before.unwrap_or(u64::MAX)));
                // Never against the direction asked: an increase never lowers, a decrease never raises.
                if asked > before {
                    prop_assert!(c.before.is_some_and(|b| c.after > b), "{:?}", c);
                } else {
                    prop_assert!(c.before.is_none_or(|b| c.after < b), "{:?}", c);
                }
                if c.before.is_some_and(|b| c.after > b) {
                    prop_assert_eq!(revert(Some(c.after), c.before, c.after), c.before);
                }
            }
            Err(e) => prop_assert_eq!(e, AskError::Nothing),
        }
    }
}
