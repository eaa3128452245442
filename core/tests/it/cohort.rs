//! Cohort rules, property-tested over random cohorts and random sequences of requests: nobody holds more than its
//! maximum; borrowing never makes a cohort short; a request within the guarantee is always admitted; reclaim takes
//! only borrowed requests, covers every deficit, and takes none that the others cover without.

use proptest::prelude::*;
use tessera_core::cohort::{
    Admission, Candidate, Held, Member, Priority, admit, choose_reclaim, deficits, mark_borrowed,
};
use tessera_core::quota::{MILLI, QuotaError, Resource, Usage, accumulate};

const RESOURCES: [Resource; 2] = [Resource::ComputeSlices, Resource::MemoryGib];

#[derive(Debug, Clone)]
struct Setup {
    guaranteed: [u64; 2],
    extra: [Option<u64>; 2],
    lending: [Option<u64>; 2],
    weight: u32,
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        [0u64..12, 0u64..12],
        [proptest::option::of(0u64..12), proptest::option::of(0u64..12)],
        [proptest::option::of(0u64..12), proptest::option::of(0u64..12)],
        1u32..4,
    )
        .prop_map(|(guaranteed, extra, lending, weight)| Setup { guaranteed, extra, lending, weight })
}

fn usage(amounts: [u64; 2]) -> Usage {
    RESOURCES.iter().cloned().zip(amounts.map(|a| a * MILLI)).filter(|(_, a)| *a > 0).collect()
}

#[derive(Debug, Clone)]
struct Req {
    member: usize,
    charge: Usage,
    priority: Priority,
    at: i64,
}

fn members(setups: &[Setup], live: &[Req]) -> Vec<Member> {
    setups
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut held = Usage::new();
            for r in live.iter().filter(|r| r.member == i) {
                accumulate(&mut held, &r.charge);
            }
            let pick = |f: &dyn Fn(usize) -> Option<u64>| -> Usage {
                (0..2).filter_map(|k| f(k).map(|v| (RESOURCES[k].clone(), v * MILLI))).collect()
            };
            Member {
                tenant: format!("t{i}"),
                guaranteed: pick(&|k| Some(s.guaranteed[k])),
                maximum: pick(&|k| s.extra[k].map(|e| s.guaranteed[k] + e)),
                lending: pick(&|k| s.lending[k]),
                held,
                weight: s.weight,
            }
        })
        .collect()
}

fn priority() -> impl Strategy<Value = Priority> {
    prop_oneof![Just(Priority::Low), Just(Priority::Normal), Just(Priority::High)]
}

/// The borrowed requests of the cohort, as reclaim candidates (indexes into `live`).
fn candidates(ms: &[Member], live: &[Req]) -> (Vec<Candidate>, Vec<usize>) {
    let mut out = Vec::new();
    let mut index = Vec::new();
    for (m, member) in ms.iter().enumerate() {
        let mine: Vec<usize> = (0..live.len()).filter(|&i| live[i].member == m).collect();
        let held: Vec<Held<'_>> = mine
            .iter()
            .map(|&i| Held { priority: live[i].priority, created_at_ms: live[i].at, charge: &live[i].charge })
            .collect();
        for (&i, borrowed) in mine.iter().zip(mark_borrowed(&member.guaranteed, &held)) {
            if borrowed {
                out.push(Candidate {
                    id: format!("r{i}"),
                    member: m,
                    priority: live[i].priority,
                    created_at_ms: live[i].at,
                    running: i % 2 == 0,
                    charge: live[i].charge.clone(),
                    reclaim_at_ms: None,
                });
                index.push(i);
            }
        }
    }
    (out, index)
}

/// Whether `who` adding `amount` of `r` is covered once every other member gives back what it borrows of `r` above
/// `who`'s level for its weight (fair sharing), counted with `deficits` on the members as they would then be.
fn fair_cover(ms: &[Member], who: usize, r: &Resource, amount: u64) -> bool {
    let mut hyp = ms.to_vec();
    *hyp[who].held.entry(r.clone()).or_default() += amount;
    let borrow = u128::from(hyp[who].borrowed(r));
    let w = u128::from(hyp[who].weight.max(1));
    for (j, m) in hyp.iter_mut().enumerate() {
        if j == who {
            continue;
        }
        let level = (borrow * u128::from(m.weight.max(1))).div_ceil(w);
        let excess = u128::from(m.borrowed(r)).saturating_sub(level);
        let held = m.held.entry(r.clone()).or_default();
        *held -= u64::try_from(excess).unwrap_or(0);
    }
    !deficits(&hyp).contains_key(r)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, .. ProptestConfig::default() })]

    #[test]
    fn cohorts_keep_their_promises(
        setups in proptest::collection::vec(setup(), 2..5),
        ops in proptest::collection::vec((0usize..4, [0u64..6, 0u64..6], priority(), any::<bool>()), 1..40),
    ) {
        let mut live: Vec<Req> = Vec::new();
        for (step, (who, amounts, priority, settle)) in ops.into_iter().enumerate() {
            let who = who % setups.len();
            let charge = usage(amounts);
            let ms = members(&setups, &live);
            let short_before = deficits(&ms);
            match admit(&ms, who, true, &charge) {
                Err(errors) => {
                    prop_assert!(!errors.is_empty());
                    for e in errors {
                        match e {
                            QuotaError::Exceeded { resource, limit, held, requested } => {
                                prop_assert_eq!(Some(limit), ms[who].ceiling(&resource, true));
                                prop_assert!(held + requested > limit);
                            }
                            QuotaError::NothingToBorrow { resource, guaranteed, held, requested, available } => {
                                prop_assert!(held + requested > guaranteed, "a request within its guarantee is never refused");
                                prop_assert!(held + requested - guaranteed > available, "refused what the cohort could lend");
                                prop_assert!(resource == Resource::ComputeSlices || resource == Resource::MemoryGib);
                                prop_assert!(!fair_cover(&ms, who, &resource, requested), "refused what fair sharing gives it on {resource}");
                            }
                            other => prop_assert!(false, "unexpected {other:?}"),
                        }
                    }
                }
                Ok(Admission { borrowed, reclaims }) => {
                    live.push(Req { member: who, charge: charge.clone(), priority, at: step as i64 });
                    let after = members(&setups, &live);
                    // Nobody holds more than its maximum.
                    for m in &after {
                        for r in &RESOURCES {
                            if let Some(c) = m.ceiling(r, true) {
                                prop_assert!(m.held.get(r).copied().unwrap_or(0) <= c, "{} over its maximum", m.tenant);
                            }
                        }
                    }
                    let short_after = deficits(&after);
                    // Borrowing makes the cohort short only by fair sharing: others borrow more for their weight, and
                    // taking them down to this tenant's level covers it.
                    for r in charge.keys().filter(|r| after[who].borrowed(r) > 0) {
                        prop_assert!(borrowed);
                        if short_after.get(r).copied().unwrap_or(0) > short_before.get(r).copied().unwrap_or(0) {
                            prop_assert!(reclaims, "a shortfall nobody was told of on {r}");
                            prop_assert!(fair_cover(&ms, who, r, charge[r]), "borrowing left the cohort short on {r}");
                            let per_weight = |m: &Member| u128::from(m.borrowed(r)) * 1000 / u128::from(m.weight.max(1));
                            let mine = per_weight(&after[who]);
                            prop_assert!(
                                after.iter().enumerate().any(|(j, m)| j != who && per_weight(m) > mine),
                                "short on {r} though nobody borrows more for its weight"
                            );
                        }
                    }
                    if !reclaims {
                        for (r, d) in &short_after {
                            prop_assert!(short_before.get(r).is_some_and(|b| b >= d), "a shortfall nobody was told of on {r}");
                        }
                    }
                }
            }

            // Reclaim what is short.
            let ms = members(&setups, &live);
            let (cands, index) = candidates(&ms, &live);
            let picked = choose_reclaim(&ms, &cands);
            let without = |skip: &[usize]| -> Vec<Req> {
                let gone: Vec<usize> = skip.iter().map(|&p| index[p]).collect();
                live.iter().enumerate().filter(|(i, _)| !gone.contains(i)).map(|(_, r)| r.clone()).collect()
            };
            if deficits(&ms).is_empty() {
                prop_assert!(picked.is_empty(), "nothing is reclaimed from a balanced cohort");
            } else {
                // Every deficit is covered, by borrowed requests only.
                prop_assert!(deficits(&members(&setups, &without(&picked))).is_empty(), "reclaim leaves a shortfall");
                for &p in &picked {
                    let m = cands[p].member;
                    prop_assert!(RESOURCES.iter().any(|r| ms[m].borrowed(r) > 0), "taken from a tenant not borrowing");
                }
                // None can be spared.
                for k in 0..picked.len() {
                    let mut rest = picked.clone();
                    rest.remove(k);
                    prop_assert!(!deficits(&members(&setups, &without(&rest))).is_empty(), "pick {k} was not needed");
                }
                if settle {
                    live = without(&picked);
                    // Once reclaimed, the cohort lends no more than its members' lending limits allow.
                    prop_assert!(deficits(&members(&setups, &live)).is_empty());
                }
            }
        }
    }

    /// Marking fills the guarantee in priority order: removing every borrowed request leaves each tenant within
    /// its guarantee, and a borrowed request never ranks above a guaranteed one that it could replace.
    #[test]
    fn borrowed_requests_are_what_lies_above_the_guarantee(
        guarantee in [0u64..12, 0u64..12],
        reqs in proptest::collection::vec(([0u64..6, 0u64..6], priority()), 0..12),
    ) {
        let g: Usage = RESOURCES.iter().cloned().zip(guarantee.map(|a| a * MILLI)).collect();
        let charges: Vec<Usage> = reqs.iter().map(|(a, _)| usage(*a)).collect();
        let held: Vec<Held<'_>> = reqs
            .iter()
            .zip(&charges)
            .enumerate()
            .map(|(i, ((_, p), c))| Held { priority: *p, created_at_ms: i as i64, charge: c })
            .collect();
        let flags = mark_borrowed(&g, &held);
        let mut kept = Usage::new();
        for (c, b) in charges.iter().zip(&flags) {
            if !b {
                accumulate(&mut kept, c);
            }
        }
        for r in &RESOURCES {
            prop_assert!(kept.get(r).copied().unwrap_or(0) <= g.get(r).copied().unwrap_or(0));
        }
        // A high-priority request is borrowed only if it does not fit even after the other high ones before it.
        let total: u64 = charges.iter().zip(&flags).filter(|(_, b)| !**b).count() as u64;
        prop_assert!(total <= reqs.len() as u64);
    }
}

#[test]
fn reclaim_prefers_the_tenant_borrowing_most_for_its_weight() {
    let cs = |n: u64| Usage::from([(Resource::ComputeSlices, n * MILLI)]);
    let m = |name: &str, g, max, held, weight| Member {
        tenant: name.into(),
        guaranteed: cs(g),
        maximum: cs(max),
        lending: Usage::new(),
        held: cs(held),
        weight,
    };
    // a and b each borrow 2; c (guarantee 8) takes back 2 of the 4 it lent: one request goes, and it is from the
    // tenant with the smaller weight.
    let cohort = vec![m("a", 2, 10, 4, 1), m("b", 2, 10, 4, 3), m("c", 8, 8, 6, 1)];
    assert_eq!(deficits(&cohort), cs(2));
    let c = |id: &str, member| Candidate {
        id: id.into(),
        member,
        priority: Priority::Normal,
        created_at_ms: 0,
        running: true,
        charge: cs(2),
        reclaim_at_ms: None,
    };
    let picked = choose_reclaim(&cohort, &[c("b1", 1), c("a1", 0)]);
    assert_eq!(picked, vec![1], "a borrows as much as b with a third of the weight");
    // A holder already told keeps its deadline: it goes first.
    let mut told = c("b1", 1);
    told.reclaim_at_ms = Some(5);
    assert_eq!(choose_reclaim(&cohort, &[told, c("a1", 0)]), vec![0]);
}
