//! Cohorts: guarantees, borrowing, lending limits and reclaim.
//!
//! A tenant's limit on a resource is its **guarantee**. It may also have a **maximum** above the guarantee and a
//! **lending limit** below it. Tenants of one cohort lend each other what they guarantee but do not hold:
//!
//! - a member *borrows* on a resource what it holds above its guarantee: `borrowed = held - guaranteed`;
//! - a member *can lend* what it guarantees but does not hold, up to its lending limit (none: all of it):
//!   `lendable = min(lending, guaranteed - held)`;
//! - a cohort is *balanced* on a resource when its members borrow no more than they can lend:
//!   `Σ borrowed <= Σ lendable`. What is missing is the resource's *deficit*.
//!
//! Rules ([`admit`]):
//! - nobody holds more than its maximum (a tenant outside any cohort: more than its guarantee);
//! - a request within the tenant's guarantee is always admitted, even when what it needs is lent out: the cohort
//!   then has a deficit, and borrowed requests are reclaimed ([`choose_reclaim`]) to cover it;
//! - a request that borrows is admitted when the cohort stays balanced with it, or when the tenants that borrow
//!   more for their weight than this one would (fair sharing) can give back what is missing: the
//!   cohort then has a deficit, reclaimed from them. Otherwise borrowing never creates a deficit, and a cohort never
//!   lends more than its members' lending limits allow once its deficits are reclaimed.
//!
//! Which of a tenant's requests are *borrowed* ([`mark_borrowed`]): its live requests fill its guarantee in order
//! of priority (high first), then age (oldest first); a request that does not fit beside the ones before it is
//! borrowed. Removing every borrowed request therefore leaves each tenant within its guarantee, so every deficit
//! can be covered without touching a guaranteed request.
//!
//! Reclaim ([`choose_reclaim`]) picks among borrowed requests only: those already told first (their deadline
//! stands), then, one request at a time, from the tenant borrowing most of what is short for its weight, and within
//! that tenant its lowest priority, then a request not yet running, then its newest. It stops as soon as every
//! deficit is covered, then gives back any pick the others cover without: no pick can be spared.

use std::cmp::Reverse;

use serde::{Deserialize, Serialize};

use crate::quota::{Milli, QuotaError, Resource, Usage};

/// Default grace period between telling a holder its borrowed request is reclaimed and releasing it (10 min).
pub const DEFAULT_GRACE_S: u32 = 600;
/// Longest grace period a cohort may have (7 days).
pub const MAX_GRACE_S: u32 = 7 * 24 * 3600;
/// Largest weight of a tenant.
pub const MAX_WEIGHT: u32 = 1000;

/// A request's priority within its tenant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    /// Reclaimed first; fills the guarantee last.
    Low,
    /// The default.
    #[default]
    Normal,
    /// Fills the guarantee first; reclaimed last.
    High,
}

impl Priority {
    /// Every priority, lowest first.
    pub const ALL: [Priority; 3] = [Priority::Low, Priority::Normal, Priority::High];

    /// The name on the wire and in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Low => "low",
            Priority::Normal => "normal",
            Priority::High => "high",
        }
    }

    /// Parses a stored or typed name.
    pub fn parse(text: &str) -> Option<Priority> {
        Priority::ALL.into_iter().find(|p| p.as_str().eq_ignore_ascii_case(text.trim()))
    }
}

impl std::fmt::Display for Priority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One tenant as its cohort sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Member {
    /// Tenant id.
    pub tenant: String,
    /// Guarantees (the limits); a resource without one is unlimited and takes no part in the cohort.
    pub guaranteed: Usage,
    /// Maximums above the guarantee (none: the guarantee).
    pub maximum: Usage,
    /// Lending limits (none: everything not held).
    pub lending: Usage,
    /// What the tenant's live requests hold.
    pub held: Usage,
    /// Its weight in sharing borrowed capacity (at least 1).
    pub weight: u32,
}

impl Member {
    /// The most the tenant may hold of `r` (`None`: unlimited). Outside a cohort, its guarantee.
    pub fn ceiling(&self, r: &Resource, in_cohort: bool) -> Option<Milli> {
        let g = *self.guaranteed.get(r)?;
        Some(ceiling(g, self.maximum.get(r).copied(), in_cohort))
    }

    /// What the tenant holds of `r` above its guarantee.
    pub fn borrowed(&self, r: &Resource) -> Milli {
        self.guaranteed.get(r).map_or(0, |g| self.held_of(r).saturating_sub(*g))
    }

    /// What the tenant guarantees of `r` but does not hold, up to its lending limit.
    pub fn lendable(&self, r: &Resource) -> Milli {
        let Some(g) = self.guaranteed.get(r) else { return 0 };
        let unused = g.saturating_sub(self.held_of(r));
        self.lending.get(r).map_or(unused, |l| unused.min(*l))
    }

    fn held_of(&self, r: &Resource) -> Milli {
        self.held.get(r).copied().unwrap_or(0)
    }
}

/// What a tenant is said to borrow of a resource, for its quota line and the quota standing: in a cohort, what it
/// holds above its guarantee (`limit`) up to its maximum (the rest is over its ceiling, not lent by anyone);
/// outside a cohort nothing, since nobody lends to it: a tenant holding more than a lowered limit, or than a
/// temporary increase that ended, is over its limit, not borrowing. An unlimited resource borrows nothing.
pub fn reported_borrowed(limit: Option<Milli>, maximum: Option<Milli>, held: Milli, in_cohort: bool) -> Milli {
    match limit {
        Some(l) if in_cohort => held.min(ceiling(l, maximum, true)).saturating_sub(l),
        _ => 0,
    }
}

/// What a tenant holds of a resource above the most it may hold: its limit outside a cohort, its maximum (at least
/// the limit) in one. An unlimited resource is never over.
pub fn over(limit: Option<Milli>, maximum: Option<Milli>, held: Milli, in_cohort: bool) -> Milli {
    limit.map_or(0, |l| held.saturating_sub(ceiling(l, maximum, in_cohort)))
}

/// The most a tenant may hold of a resource whose limit is `limit`: in a cohort its maximum when higher.
pub fn ceiling(limit: Milli, maximum: Option<Milli>, in_cohort: bool) -> Milli {
    if in_cohort { maximum.unwrap_or(limit).max(limit) } else { limit }
}

/// What a cohort can still lend on `r`, counting every member but `except`: what they can lend less what they
/// borrow (negative: a deficit).
fn balance(members: &[Member], r: &Resource, except: Option<usize>) -> i128 {
    members
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != except)
        .map(|(_, m)| i128::from(m.lendable(r)) - i128::from(m.borrowed(r)))
        .sum()
}

/// Every resource on which the cohort's members borrow more than they can lend, with the amount missing.
pub fn deficits(members: &[Member]) -> Usage {
    let resources: std::collections::BTreeSet<&Resource> = members.iter().flat_map(|m| m.guaranteed.keys()).collect();
    resources
        .into_iter()
        .filter_map(|r| {
            let b = balance(members, r, None);
            (b < 0).then(|| (r.clone(), Milli::try_from(-b).unwrap_or(Milli::MAX)))
        })
        .collect()
}

/// An admitted request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    /// It holds more than the tenant's guarantee on some resource.
    pub borrowed: bool,
    /// It takes capacity that is lent out: borrowed requests must be reclaimed.
    pub reclaims: bool,
}

/// Whether member `who` may add `charge` to what it holds. `members` is its cohort (`in_cohort`), or the tenant
/// alone. On refusal, every limit it would pass: [`QuotaError::Exceeded`] for a maximum (or a guarantee outside a
/// cohort), [`QuotaError::NothingToBorrow`] where the cohort has too little to lend.
pub fn admit(members: &[Member], who: usize, in_cohort: bool, charge: &Usage) -> Result<Admission, Vec<QuotaError>> {
    let me = &members[who];
    let mut errors = Vec::new();
    let mut admission = Admission { borrowed: false, reclaims: false };
    for (r, &amount) in charge.iter().filter(|(_, a)| **a > 0) {
        let (Some(ceiling), Some(&g)) = (me.ceiling(r, in_cohort), me.guaranteed.get(r)) else { continue };
        let held = me.held_of(r);
        let after = held.saturating_add(amount);
        if after > ceiling {
            errors.push(QuotaError::Exceeded { resource: r.clone(), limit: ceiling, held, requested: amount });
            continue;
        }
        if after <= g {
            // Within the guarantee: admitted, taking back what is lent out where the cohort falls short.
            let mine = Member { held: with(&me.held, r, after), ..me.clone() };
            admission.reclaims |= balance(members, r, Some(who)) + i128::from(mine.lendable(r)) < 0;
            continue;
        }
        // Borrowing: the others must be able to lend what this member would borrow, counting what the tenants that
        // borrow more for their weight than this one would give back (fair sharing).
        let others = balance(members, r, Some(who));
        let pool = others.max(0);
        let borrow = i128::from(after - g);
        if borrow > pool && others + over_share(members, who, r, after - g) >= borrow {
            admission.borrowed = true;
            admission.reclaims = true;
            continue;
        }
        if borrow > pool {
            let available = Milli::try_from(pool).unwrap_or(Milli::MAX);
            errors.push(QuotaError::NothingToBorrow {
                resource: r.clone(),
                guaranteed: g,
                held,
                requested: amount,
                available,
            });
            continue;
        }
        admission.borrowed = true;
    }
    if errors.is_empty() { Ok(admission) } else { Err(errors) }
}

/// What the members other than `who` borrow of `r` above the level at which their borrowing per unit of weight
/// equals `who`'s if it borrowed `borrow`: what fair sharing lets `who` take back from them.
fn over_share(members: &[Member], who: usize, r: &Resource, borrow: Milli) -> i128 {
    let w = i128::from(members[who].weight.max(1));
    members
        .iter()
        .enumerate()
        .filter(|(j, _)| *j != who)
        .map(|(_, m)| {
            // Level for m: borrow * weight_m / weight_who, rounded up (m keeps at least its fair share).
            let level = (i128::from(borrow) * i128::from(m.weight.max(1)) + w - 1) / w;
            (i128::from(m.borrowed(r)) - level).max(0)
        })
        .sum()
}

/// How much more of `r` member `who` may take now, borrowing included (`None`: unlimited): exactly what [`admit`]
/// would let through: up to its maximum (outside a cohort, its guarantee), and above its guarantee what the others
/// can lend or, by fair sharing, give back.
pub fn room(members: &[Member], who: usize, in_cohort: bool, r: &Resource) -> Option<Milli> {
    let me = members.get(who)?;
    let ceiling = me.ceiling(r, in_cohort)?;
    let g = me.guaranteed.get(r).copied().unwrap_or(0);
    if !in_cohort {
        return Some(ceiling.saturating_sub(me.held_of(r)));
    }
    let others = balance(members, r, Some(who));
    // Whether borrowing `b` in all is admitted; true up to some amount, false past it (what fair sharing gives back
    // shrinks as `b` grows).
    let fits = |b: Milli| i128::from(b) <= others.max(0) || others + over_share(members, who, r, b) >= i128::from(b);
    let (mut lo, mut hi) = (0, ceiling.saturating_sub(g));
    if fits(hi) {
        lo = hi;
    }
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid) { lo = mid } else { hi = mid - 1 }
    }
    Some(g.saturating_add(lo).min(ceiling).saturating_sub(me.held_of(r)))
}

fn with(usage: &Usage, r: &Resource, amount: Milli) -> Usage {
    let mut u = usage.clone();
    u.insert(r.clone(), amount);
    u
}

/// A tenant's live request, for [`mark_borrowed`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held<'a> {
    /// Its priority.
    pub priority: Priority,
    /// When it was created, UTC ms.
    pub created_at_ms: i64,
    /// What it charges.
    pub charge: &'a Usage,
}

/// Which of a tenant's live requests are borrowed under `guaranteed`: in order of priority (high first) then age
/// (oldest first, then position), each request that fits beside the guaranteed ones before it is guaranteed, the
/// others are borrowed. Returns one flag per request, in the order given.
pub fn mark_borrowed(guaranteed: &Usage, requests: &[Held<'_>]) -> Vec<bool> {
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by_key(|&i| (Reverse(requests[i].priority), requests[i].created_at_ms, i));
    let mut filled = Usage::new();
    let mut borrowed = vec![false; requests.len()];
    for i in order {
        let fits = requests[i].charge.iter().all(|(r, a)| {
            guaranteed.get(r).is_none_or(|g| filled.get(r).copied().unwrap_or(0).saturating_add(*a) <= *g)
        });
        if fits {
            crate::quota::accumulate(&mut filled, requests[i].charge);
        } else {
            borrowed[i] = true;
        }
    }
    borrowed
}

/// A borrowed request that may be reclaimed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Request id.
    pub id: String,
    /// Its tenant: an index into the cohort's members.
    pub member: usize,
    /// Its priority.
    pub priority: Priority,
    /// UTC ms.
    pub created_at_ms: i64,
    /// It runs (active or being provisioned), rather than waiting.
    pub running: bool,
    /// What it charges.
    pub charge: Usage,
    /// When it is released, if its holder was already told.
    pub reclaim_at_ms: Option<i64>,
}

/// Which `candidates` (indexes) to reclaim so that the cohort has no deficit: none when it has none. Candidates
/// must be borrowed requests ([`mark_borrowed`]); a candidate that charges no resource in deficit is never picked.
///
/// Those already told go first (their deadline stands). Then, one at a time, a request of the tenant borrowing the
/// most of what is short for its weight (fair sharing: what is left borrowed evens out by weight), and within that
/// tenant its lowest priority, then one not yet running, then its newest. It stops as soon as every deficit is
/// covered, then gives back any pick the others cover without.
pub fn choose_reclaim(members: &[Member], candidates: &[Candidate]) -> Vec<usize> {
    let mut state = members.to_vec();
    let needed = deficits(&state);
    if needed.is_empty() {
        return Vec::new();
    }
    let resources: Vec<&Resource> = needed.keys().collect();
    let mut left: Vec<usize> = (0..candidates.len())
        .filter(|&i| candidates[i].member < members.len())
        .filter(|&i| candidates[i].charge.iter().any(|(r, a)| *a > 0 && needed.contains_key(r)))
        .collect();
    let remove = |state: &mut [Member], c: &Candidate, sign: i8| {
        let held = &mut state[c.member].held;
        for (r, a) in &c.charge {
            let e = held.entry(r.clone()).or_default();
            *e = if sign < 0 { e.saturating_sub(*a) } else { e.saturating_add(*a) };
        }
    };
    let mut picked = Vec::new();
    while !left.is_empty() && !deficits(&state).is_empty() {
        let told = left
            .iter()
            .copied()
            .filter(|&i| candidates[i].reclaim_at_ms.is_some())
            .min_by_key(|&i| (candidates[i].reclaim_at_ms, i));
        let next = told.or_else(|| {
            let most = left
                .iter()
                .map(|&i| candidates[i].member)
                .max_by_key(|&m| (share(&state[m], &resources), Reverse(m)))?;
            left.iter()
                .copied()
                .filter(|&i| candidates[i].member == most)
                .min_by_key(|&i| (within_tenant(&candidates[i]), i))
        });
        let Some(i) = next else { break };
        left.retain(|&j| j != i);
        remove(&mut state, &candidates[i], -1);
        picked.push(i);
    }
    // Give back any pick the others cover without.
    for k in (0..picked.len()).rev() {
        let c = &candidates[picked[k]];
        remove(&mut state, c, 1);
        if deficits(&state).is_empty() {
            picked.remove(k);
        } else {
            remove(&mut state, c, -1);
        }
    }
    picked
}

/// What a member borrows of `resources` per unit of weight (thousandths).
fn share(m: &Member, resources: &[&Resource]) -> u128 {
    let borrowed: u128 = resources.iter().map(|r| u128::from(m.borrowed(r))).sum();
    borrowed * 1000 / u128::from(m.weight.max(1))
}

/// The order of a tenant's own candidates: lowest priority first, then those not yet running, then the newest.
fn within_tenant(c: &Candidate) -> (Priority, bool, Reverse<i64>) {
    (c.priority, c.running, Reverse(c.created_at_ms))
}

/// The order room reclaim tries candidates in: those already told first, then the tenant borrowing most for its
/// weight, then [`within_tenant`].
fn reclaim_order(members: &[Member], candidates: &[Candidate], resources: &[&Resource]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..candidates.len()).filter(|&i| candidates[i].member < members.len()).collect();
    order.sort_by_key(|&i| {
        let c = &candidates[i];
        (
            c.reclaim_at_ms.is_none(),
            c.reclaim_at_ms.unwrap_or(0),
            Reverse(share(&members[c.member], resources)),
            c.member,
            within_tenant(c),
            i,
        )
    });
    order
}

/// Which borrowed candidates to reclaim so that a request within its guarantee, which the quota admits but the
/// fleet cannot place, can be placed: `fits(picked)` says whether it can with the instances of `picked` freed (the
/// caller asks the planner). Candidates are added in reclaim order until it fits, then any pick it fits without is
/// given back. `Some` of nothing when it fits as things are; `None` when even all of them would not make room.
/// Candidates must hold instances (a request that holds none frees no room) and be borrowed ([`mark_borrowed`]).
pub fn choose_for_placement(
    members: &[Member],
    candidates: &[Candidate],
    mut fits: impl FnMut(&[usize]) -> bool,
) -> Option<Vec<usize>> {
    if fits(&[]) {
        return Some(Vec::new());
    }
    let resources: std::collections::BTreeSet<&Resource> = members.iter().flat_map(|m| m.guaranteed.keys()).collect();
    let resources: Vec<&Resource> = resources.into_iter().collect();
    let mut picked = Vec::new();
    for i in reclaim_order(members, candidates, &resources) {
        picked.push(i);
        if fits(&picked) {
            // Give back any pick the request fits without.
            for k in (0..picked.len()).rev() {
                let without: Vec<usize> = picked.iter().enumerate().filter(|(j, _)| *j != k).map(|(_, &p)| p).collect();
                if fits(&without) {
                    picked = without;
                }
            }
            return Some(picked);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::MILLI;

    fn usage(n: u64) -> Usage {
        Usage::from([(Resource::ComputeSlices, n * MILLI)])
    }

    fn member(name: &str, g: u64, max: u64, held: u64) -> Member {
        Member {
            tenant: name.to_string(),
            guaranteed: usage(g),
            maximum: usage(max),
            lending: Usage::new(),
            held: usage(held),
            weight: 1,
        }
    }

    #[test]
    fn borrowing_takes_what_others_do_not_use_and_a_return_reclaims_it() {
        let mut cohort = vec![member("a", 7, 14, 0), member("b", 7, 14, 0)];
        // a borrows 5 above its 7 from b's unused 7.
        let a = admit(&cohort, 0, true, &usage(12)).expect("within a's maximum and b's unused");
        assert_eq!(a, Admission { borrowed: true, reclaims: false });
        cohort[0].held = usage(12);
        // a cannot pass its maximum, nor borrow past what b lends.
        let err = admit(&cohort, 0, true, &usage(3)).expect_err("past the maximum");
        assert!(matches!(err[0], QuotaError::Exceeded { limit: 14_000, .. }), "{err:?}");
        cohort[1].lending = usage(5);
        let err = admit(&cohort, 0, true, &usage(1)).expect_err("past what b lends");
        assert!(matches!(err[0], QuotaError::NothingToBorrow { available: 5_000, .. }), "{err:?}");
        cohort[1].lending = Usage::new();
        // b, within its guarantee, takes 4 back: admitted, with a reclaim of 2.
        let b = admit(&cohort, 1, true, &usage(4)).expect("b is within its guarantee");
        assert_eq!(b, Admission { borrowed: false, reclaims: true });
        assert_eq!(room(&cohort, 0, true, &Resource::ComputeSlices), Some(2_000), "7 + 7 lendable, 12 held");
        assert_eq!(room(&cohort, 1, true, &Resource::ComputeSlices), Some(7_000), "its whole guarantee");
        cohort[1].held = usage(4);
        assert_eq!(deficits(&cohort), usage(2));
        assert_eq!(room(&cohort, 0, true, &Resource::ComputeSlices), Some(0));
        assert_eq!(room(&cohort, 0, false, &Resource::ComputeSlices), Some(0));
        assert_eq!(room(&cohort, 1, true, &Resource::MemoryGib), None, "unlimited");
        // Outside a cohort, the guarantee is the limit.
        assert!(admit(&[member("c", 7, 14, 0)], 0, false, &usage(8)).is_err());
    }

    #[test]
    fn reclaim_picks_low_priority_newest_and_no_more_than_needed() {
        let charge = |n| usage(n);
        let mut cohort = vec![member("a", 7, 14, 12), member("b", 7, 14, 4)];
        cohort[0].weight = 1;
        let c = |id: &str, p, at, n| Candidate {
            id: id.to_string(),
            member: 0,
            priority: p,
            created_at_ms: at,
            running: true,
            charge: charge(n),
            reclaim_at_ms: None,
        };
        let candidates =
            vec![c("old", Priority::Normal, 1, 3), c("new", Priority::Normal, 2, 2), c("low", Priority::Low, 0, 3)];
        // Deficit 2: the low-priority request (3) covers it alone.
        assert_eq!(choose_reclaim(&cohort, &candidates), vec![2]);
        cohort[1].held = usage(7);
        // Deficit 5: low (3) then new (2).
        let mut picked = choose_reclaim(&cohort, &candidates);
        picked.sort_unstable();
        assert_eq!(picked, vec![1, 2]);
    }

    #[test]
    fn two_borrowers_share_what_is_lent_by_weight() {
        // a and b are guaranteed 2 and may hold 20; l lends its 10. a borrowed all 10 first.
        let mut cohort = vec![member("a", 2, 20, 12), member("b", 2, 20, 2), member("l", 10, 10, 0)];
        // b asks to borrow 4: nothing is left to lend, but a borrows 10 for its weight against b's 4: admitted, and a
        // gives back what is missing.
        let got = admit(&cohort, 1, true, &usage(4)).expect("fair sharing");
        assert_eq!(got, Admission { borrowed: true, reclaims: true });
        cohort[1].held = usage(6);
        assert_eq!(deficits(&cohort), usage(4));
        let c = |id: &str, member, n, at| Candidate {
            id: id.to_string(),
            member,
            priority: Priority::Normal,
            created_at_ms: at,
            running: true,
            charge: usage(n),
            reclaim_at_ms: None,
        };
        // a's requests (2 each) and b's new one (4, low priority, the newest): a gives back, b keeps its own.
        let mut b_new = c("b-new", 1, 4, 9);
        b_new.priority = Priority::Low;
        let candidates =
            vec![c("a1", 0, 2, 1), c("a2", 0, 2, 2), c("a3", 0, 2, 3), c("a4", 0, 2, 4), c("a5", 0, 2, 5), b_new];
        let mut picked = choose_reclaim(&cohort, &candidates);
        picked.sort_unstable();
        assert_eq!(picked, vec![3, 4], "a's two newest");
        // Past an even split it is refused: b borrowing 6 more (10) against a's 10 leaves a nothing above b.
        cohort[0].held = usage(8);
        cohort[1].held = usage(6);
        assert!(admit(&cohort, 1, true, &usage(6)).is_err(), "b would borrow more than a for the same weight");
        // With three times a's weight, b may go further.
        cohort[1].weight = 3;
        assert_eq!(admit(&cohort, 1, true, &usage(2)).map(|a| a.reclaims), Ok(true));
    }

    #[test]
    fn placement_reclaim_takes_what_makes_room_and_nothing_more() {
        let cohort = vec![member("a", 7, 14, 12), member("b", 7, 14, 4)];
        let c = |id: &str, p, at| Candidate {
            id: id.to_string(),
            member: 0,
            priority: p,
            created_at_ms: at,
            running: true,
            charge: usage(1),
            reclaim_at_ms: None,
        };
        let candidates = vec![c("x", Priority::Normal, 1), c("y", Priority::Low, 2), c("z", Priority::Normal, 3)];
        // Room appears when x is freed (say x and z share the GPU the request needs, and x alone is enough).
        let fits = |picked: &[usize]| picked.contains(&0);
        // Tried in order y (low), z (newest), x: all three are picked, then y and z are given back.
        assert_eq!(choose_for_placement(&cohort, &candidates, fits), Some(vec![0]));
        assert_eq!(choose_for_placement(&cohort, &candidates, |_| false), None, "nothing makes room");
        assert_eq!(choose_for_placement(&cohort, &candidates, |_| true), Some(vec![]), "it fits as things are");
        assert_eq!(choose_for_placement(&cohort, &candidates, |p: &[usize]| p.len() >= 2).map(|p| p.len()), Some(2));
    }
}
