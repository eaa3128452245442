//! Cohort benchmark: one simulated week of bursty GPU demand, served under today's hard limits and under cohorts
//! (borrowing with reclaim), on the same demand trace. It also checks the rules: it panics when an invariant breaks.
//!
//! `cargo bench -p tessera-core --bench cohorts` (add `-- --quick` for one seed).
//!
//! # Model
//! - **Fleet**: 24 H100-80GB GPUs in MIG mode, 168 compute slices. A request asks for one MIG instance and runs only
//!   once [`tessera_core::planner::plan`] places it: free instances may be re-laid, instances in use never move.
//! - **Tenants**: 20 in 3 cohorts (7/7/6); their guarantees (compute slices) add up to the fleet, their maximum is
//!   twice the guarantee, no lending limit, weight = guarantee.
//! - **Demand** (seeded, the same for both policies): per tenant a two-state on/off Markov chain (mean 8 h on,
//!   14 h off) with a diurnal factor; while on, Poisson arrivals sized so that the tenant offers about 70 % of its
//!   guarantee on average. Jobs ask for 1g/2g/3g/7g (weights 6:3:2:1; tenants whose guarantee is below 7 slices never
//!   ask for a whole GPU, which hard limits could never grant), last 30 min to 12 h (bounded Pareto) and are mostly
//!   normal priority (10 % low, 10 % high).
//! - **Each minute**: finished jobs release; arrivals and waiting users retry admission (a refused user retries every
//!   minute); under cohorts the cohort is rebalanced as the server does (`services/cohorts.rs` and
//!   `store/cohorts.rs`): borrowed requests are marked; [`cohort::choose_reclaim`] picks what covers the quota
//!   deficit (*quota picks*); for each pending request that is not borrowed (oldest first, at most [`ROOM_TRIES`])
//!   and that the planner cannot place now, [`cohort::choose_for_placement`] picks, among the cohort's borrowed
//!   requests that run, what frees room for it (*room picks*; `fits` asks [`tessera_core::planner::plan`] with the
//!   picks' instances counted free); the union is what is told: new picks are told (deadline: now + grace), due picks
//!   are released (or cancelled when not running) and resubmitted by their owner for the remaining duration, notices
//!   no longer chosen by either are withdrawn; then the admitted requests that are not running are planned, within
//!   guarantee first (by priority, then age), borrowed ones on what is left.
//! - **Hard limits**: [`quota::check`] against the guarantee. **Cohorts**: [`cohort::admit`] (checked against
//!   [`cohort::room`]).
//!
//! A request is *within its guarantee* when, at arrival, its tenant's holding (pending included) plus its charge stays
//! within the guarantee; such a request should run within the grace period (10 minutes). `-- --trace` prints, for
//! each one under cohorts that does not, what the room search did for it.

#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tessera_core::catalog::{Catalog, GpuModel};
use tessera_core::cohort::{self, Candidate, Held, Member, Priority};
use tessera_core::planner::synth::Rng;
use tessera_core::planner::{DemandInput, GpuInput, InstanceInput, PlanInput, plan};
use tessera_core::quota::{self, MILLI, Resource, Usage};
use tessera_core::request::SliceSpec;

const MODEL: &str = "H100-80GB";
const GPUS: usize = 24;
/// Guarantees in compute slices, per cohort; they add up to the fleet's 168.
const COHORTS: [&[u64]; 3] = [&[14, 10, 8, 8, 6, 6, 4], &[16, 12, 8, 6, 6, 4, 4], &[14, 12, 10, 8, 8, 4]];
const MAX_FACTOR: u64 = 2;
/// Profiles and their weights in demand.
const PROFILES: [(&str, u32); 4] = [("1g.10gb", 6), ("2g.20gb", 3), ("3g.40gb", 2), ("7g.80gb", 1)];
const TARGET_LOAD: f64 = 0.7;
const MEAN_ON_MIN: f64 = 8.0 * 60.0;
const MEAN_OFF_MIN: f64 = 14.0 * 60.0;
/// Bounded Pareto durations: shortest, longest (minutes), shape.
const DURATION: (f64, f64, f64) = (30.0, 720.0, 0.7);
const GRACE_MIN: u32 = cohort::DEFAULT_GRACE_S / 60;
const DAY_MIN: u32 = 24 * 60;
/// Most waiting requests a rebalance makes room for, oldest first (the server's `services::cohorts::ROOM_TRIES`).
const ROOM_TRIES: usize = 4;

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let tracing = std::env::args().any(|a| a == "--trace");
    let (seeds, days): (Vec<u64>, u32) = if quick { (vec![1], 7) } else { ((1..=10).collect(), 7) };
    let catalog = Catalog::builtin();
    let world = World::new(catalog);
    let traces: Vec<Vec<Job>> = seeds.iter().map(|&s| demand(&world, s, days * DAY_MIN)).collect();
    let loads: Vec<(f64, f64, f64)> = traces.iter().map(|t| offered(&world, t, days * DAY_MIN)).collect();
    let mean_load = loads.iter().map(|l| l.0).sum::<f64>() / loads.len() as f64;
    println!("# Tessera cohort benchmark{}", if quick { " (quick)" } else { "" });
    println!(
        "Setup: seeds {seeds:?}; {GPUS} x {MODEL} ({} compute slices); {} tenants in {} cohorts ({}), guarantees \
         summing to the fleet, maximum {MAX_FACTOR}x guarantee, no lending limit; {days} days in 1-minute steps; grace \
         {GRACE_MIN} min; offered load {:.0} % of the fleet on average (peak minute {:.0} %; tenant-minutes above \
         guarantee {:.0} %).",
        world.fleet_slices(),
        world.tenants.len(),
        COHORTS.len(),
        COHORTS.iter().map(|c| c.len().to_string()).collect::<Vec<_>>().join("/"),
        100.0 * mean_load,
        100.0 * loads.iter().map(|l| l.1).fold(0.0, f64::max),
        100.0 * loads.iter().map(|l| l.2).sum::<f64>() / loads.len() as f64,
    );
    let (mut all_hard, mut all_cohorts) = (Stats::default(), Stats::default());
    for ((seed, trace), load) in seeds.iter().zip(&traces).zip(&loads) {
        let hard = Sim::new(&world, Policy::Hard, tracing).run(trace, days * DAY_MIN);
        let cohorts = Sim::new(&world, Policy::Cohorts, tracing).run(trace, days * DAY_MIN);
        println!(
            "\n## Seed {seed}: {} jobs, offered load {:.0} %, peak {:.0} %",
            trace.len(),
            100.0 * load.0,
            100.0 * load.1
        );
        table(&hard, &cohorts);
        all_hard.merge(hard);
        all_cohorts.merge(cohorts);
    }
    if seeds.len() > 1 {
        println!("\n## All {} seeds (counts summed, utilisation and waits pooled)", seeds.len());
        table(&all_hard, &all_cohorts);
    }
    println!("\n## Within-guarantee requests not running within {GRACE_MIN} min, by profile (all seeds)\n");
    println!("| profile | hard limits | cohorts |\n|---|---|---|");
    for (p, _) in PROFILES {
        let n = |s: &Stats| s.missed_by_profile.get(p).copied().unwrap_or(0);
        println!("| {p} | {} | {} |", n(&all_hard), n(&all_cohorts));
    }
    assert!(all_cohorts.n.reclaimed_running + all_cohorts.n.reclaimed_pending > 0, "the run must exercise reclaim");
    assert!(all_cohorts.n.room_searches > 0, "the run must exercise reclaim for room");
}

/// The fixed setup: the catalog, the tenants and what each profile charges.
struct World<'c> {
    catalog: &'c Catalog,
    model: &'c GpuModel,
    tenants: Vec<Tenant>,
    /// Per profile: its charge and its compute slices.
    charges: Vec<(Usage, u64)>,
}

struct Tenant {
    cohort: usize,
    /// Its index among the cohort's members.
    index: usize,
    guarantee: Usage,
    maximum: Usage,
}

impl<'c> World<'c> {
    fn new(catalog: &'c Catalog) -> World<'c> {
        let slices = |n: u64| Usage::from([(Resource::ComputeSlices, n * MILLI)]);
        let mut tenants = Vec::new();
        for (c, guarantees) in COHORTS.iter().enumerate() {
            for (index, &g) in guarantees.iter().enumerate() {
                tenants.push(Tenant { cohort: c, index, guarantee: slices(g), maximum: slices(MAX_FACTOR * g) });
            }
        }
        let charges = PROFILES
            .iter()
            .map(|(p, _)| {
                let spec = SliceSpec::Mig { profile: p.to_string(), model: Some(MODEL.to_string()) };
                let charge = quota::charge(catalog, &spec, 1).unwrap();
                let compute = charge[&Resource::ComputeSlices] / MILLI;
                (charge, compute)
            })
            .collect();
        let w = World { catalog, model: catalog.model(MODEL).unwrap(), tenants, charges };
        assert_eq!(COHORTS.iter().flat_map(|c| c.iter()).sum::<u64>(), w.fleet_slices(), "guarantees = the fleet");
        w
    }

    fn fleet_slices(&self) -> u64 {
        GPUS as u64 * u64::from(self.model.compute_slices_total)
    }

    fn guarantee(&self, t: usize) -> u64 {
        self.tenants[t].guarantee[&Resource::ComputeSlices] / MILLI
    }

    /// Profiles tenant `t` asks for: none larger than its guarantee.
    fn profiles_for(&self, t: usize) -> impl Iterator<Item = (usize, u32)> + '_ {
        let g = self.guarantee(t);
        PROFILES.iter().enumerate().filter(move |(p, _)| self.charges[*p].1 <= g).map(|(p, (_, w))| (p, *w))
    }
}

/// One job of the demand trace.
#[derive(Clone)]
struct Job {
    at: u32,
    tenant: usize,
    profile: usize,
    minutes: u32,
    priority: Priority,
}

fn unit(rng: &mut Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// The seeded demand trace over `horizon` minutes, in arrival order.
fn demand(world: &World<'_>, seed: u64, horizon: u32) -> Vec<Job> {
    let mut rng = Rng::new(0xC0_4017 ^ seed.wrapping_mul(0x9E37_79B9));
    let p_on = MEAN_ON_MIN / (MEAN_ON_MIN + MEAN_OFF_MIN);
    let (lo, hi, a) = DURATION;
    let mean_minutes = a * lo.powf(a) / (1.0 - (lo / hi).powf(a)) * (hi.powf(1.0 - a) - lo.powf(1.0 - a)) / (1.0 - a);
    let rates: Vec<f64> = (0..world.tenants.len())
        .map(|t| {
            let (weight, slices) = world
                .profiles_for(t)
                .fold((0.0, 0.0), |(w, s), (p, pw)| (w + f64::from(pw), s + f64::from(pw) * world.charges[p].1 as f64));
            TARGET_LOAD * world.guarantee(t) as f64 / (p_on * slices / weight * mean_minutes)
        })
        .collect();
    let mut on: Vec<bool> = rates.iter().map(|_| rng.chance(p_on)).collect();
    let mut jobs = Vec::new();
    for at in 0..horizon {
        // Busiest mid-afternoon, quietest at night; mean 1.
        let day = f64::from(at % DAY_MIN) / f64::from(DAY_MIN);
        let diurnal = 1.0 - 0.6 * (2.0 * std::f64::consts::PI * (day - 0.125)).cos();
        for t in 0..rates.len() {
            if rng.chance(1.0 / if on[t] { MEAN_ON_MIN } else { MEAN_OFF_MIN }) {
                on[t] = !on[t];
            }
            if !on[t] {
                continue;
            }
            // Poisson arrivals (Knuth).
            let (limit, mut p) = ((-rates[t] * diurnal).exp(), unit(&mut rng));
            while p > limit {
                let profiles: Vec<(usize, u32)> = world.profiles_for(t).collect();
                let mut roll = rng.below(profiles.iter().map(|w| w.1 as usize).sum()) as u32;
                let mut profile = profiles[0].0;
                for &(p, w) in &profiles {
                    if roll < w {
                        profile = p;
                        break;
                    }
                    roll -= w;
                }
                let u = unit(&mut rng);
                let minutes = (lo * (1.0 - u * (1.0 - (lo / hi).powf(a))).powf(-1.0 / a)).round() as u32;
                let priority = match rng.below(10) {
                    0 => Priority::Low,
                    1 => Priority::High,
                    _ => Priority::Normal,
                };
                jobs.push(Job { at, tenant: t, profile, minutes, priority });
                p *= unit(&mut rng);
            }
        }
    }
    jobs
}

/// Offered load of a trace within the horizon: (mean share of the fleet, peak minute's share, share of
/// tenant-minutes in which a tenant offers more than its guarantee).
fn offered(world: &World<'_>, jobs: &[Job], horizon: u32) -> (f64, f64, f64) {
    let mut per = vec![vec![0u64; horizon as usize]; world.tenants.len()];
    for j in jobs {
        for m in j.at..(j.at + j.minutes).min(horizon) {
            per[j.tenant][m as usize] += world.charges[j.profile].1;
        }
    }
    let cap = world.fleet_slices() as f64;
    let fleet: Vec<u64> = (0..horizon as usize).map(|m| per.iter().map(|t| t[m]).sum()).collect();
    let over: usize = per.iter().enumerate().map(|(t, v)| v.iter().filter(|&&s| s > world.guarantee(t)).count()).sum();
    (
        fleet.iter().sum::<u64>() as f64 / (cap * f64::from(horizon)),
        *fleet.iter().max().unwrap_or(&0) as f64 / cap,
        over as f64 / (per.len() as f64 * f64::from(horizon)),
    )
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Policy {
    Hard,
    Cohorts,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// Refused by quota; the user retries every minute.
    Waiting,
    /// Admitted (holds quota), not placed yet.
    Pending,
    Running {
        gpu: usize,
        start: u8,
        end: u32,
    },
    Done,
}

struct Req {
    tenant: usize,
    profile: usize,
    minutes: u32,
    priority: Priority,
    arrival: u32,
    state: State,
    /// When it is released, once its holder was told it is reclaimed.
    reclaim_at: Option<u32>,
    within: bool,
    /// Judged against the grace period already (served or missed).
    judged: bool,
    /// The admission epoch of its group at its last refusal: retried only once something was released.
    tried: Option<u64>,
    /// Waiting for room: the minute a room pick was first made for it, if any.
    room_picked: Option<u32>,
    /// Waiting for room: a room pick made for it was released.
    room_released: bool,
    /// Waiting for room: what its last room search found ([`cohort::choose_for_placement`]'s answer was `Some`).
    room_found: Option<bool>,
    /// What happened to it, with `--trace`.
    log: Vec<String>,
}

/// One MIG instance on a GPU, and the request it runs (if any).
struct Slot {
    profile: String,
    start: u8,
    compute: u64,
    owner: Option<usize>,
}

/// Counters of one run, summed over seeds.
macro_rules! counters {
    ($($name:ident),* $(,)?) => {
        #[derive(Default, Clone, Copy)]
        struct Counts { $($name: u64,)* }
        impl Counts {
            fn add(&mut self, o: Counts) { $(self.$name += o.$name;)* }
        }
    };
}

counters!(
    capacity,
    running_slice_minutes,
    submitted,
    resubmitted,
    guaranteed_served,
    missed_fragmented,
    missed_full,
    missed_reclaimed,
    missed_reclaimable,
    missed_now_borrowed,
    missed_room_taken,
    missed_room_late,
    missed_room_none,
    missed_room_untried,
    reclaimed_running,
    reclaimed_quota_only,
    reclaimed_pending,
    reclaimed_for_room,
    reclaimed_slice_minutes,
    notices,
    notices_for_room,
    withdrawn,
    room_searches,
    room_found,
    room_spare,
    waiting_at_end,
    plans,
    room_plans,
);

#[derive(Default)]
struct Stats {
    n: Counts,
    /// Minutes from arrival to running, per request that ran.
    waits: Vec<u32>,
    missed_by_profile: BTreeMap<&'static str, u64>,
    wall: Duration,
}

impl Stats {
    fn merge(&mut self, o: Stats) {
        self.n.add(o.n);
        self.waits.extend(o.waits);
        for (p, n) in o.missed_by_profile {
            *self.missed_by_profile.entry(p).or_default() += n;
        }
        self.wall += o.wall;
    }

    fn missed(&self) -> u64 {
        self.n.missed_fragmented + self.n.missed_full + self.n.missed_reclaimed
    }
}

struct Sim<'w, 'c> {
    world: &'w World<'c>,
    policy: Policy,
    reqs: Vec<Req>,
    /// Per tenant: its live (pending or running) requests.
    live: Vec<Vec<usize>>,
    waiting: Vec<usize>,
    /// Per admission group (the tenant under hard limits, the cohort under cohorts): bumped on every release.
    epoch: Vec<u64>,
    gpus: Vec<Vec<Slot>>,
    /// Reclaimed work its owners resubmit the next minute.
    resubmit: Vec<Job>,
    /// Something changed since the last plan.
    dirty: bool,
    stats: Stats,
    /// Print what happened to within-guarantee requests that miss the grace period.
    trace: bool,
}

impl<'w, 'c> Sim<'w, 'c> {
    fn new(world: &'w World<'c>, policy: Policy, trace: bool) -> Self {
        let n = world.tenants.len();
        let groups = if policy == Policy::Hard { n } else { COHORTS.len() };
        Sim {
            world,
            policy,
            reqs: Vec::new(),
            live: vec![Vec::new(); n],
            waiting: Vec::new(),
            epoch: vec![0; groups],
            gpus: (0..GPUS).map(|_| Vec::new()).collect(),
            resubmit: Vec::new(),
            dirty: false,
            stats: Stats::default(),
            trace,
        }
    }

    fn run(mut self, trace: &[Job], horizon: u32) -> Stats {
        let started = Instant::now();
        let mut next = 0;
        for t in 0..horizon {
            self.finish_due(t);
            self.waiting.retain(|&r| self.reqs[r].state == State::Waiting);
            for r in self.waiting.clone() {
                self.try_admit(r);
            }
            for j in std::mem::take(&mut self.resubmit) {
                self.submit(j.tenant, j.profile, j.minutes, j.priority, t, true);
            }
            while next < trace.len() && trace[next].at == t {
                let j = &trace[next];
                self.submit(j.tenant, j.profile, j.minutes, j.priority, t, false);
                next += 1;
            }
            if self.policy == Policy::Cohorts {
                (0..COHORTS.len()).for_each(|c| self.rebalance(c, t));
            }
            if self.dirty {
                self.place(t);
            }
            self.account(t);
        }
        let left = |s: &State| matches!(s, State::Waiting | State::Pending);
        self.stats.n.waiting_at_end = self.reqs.iter().filter(|r| left(&r.state)).count() as u64;
        self.stats.n.capacity = self.world.fleet_slices() * u64::from(horizon);
        self.stats.wall = started.elapsed();
        self.stats
    }

    fn group(&self, tenant: usize) -> usize {
        if self.policy == Policy::Hard { tenant } else { self.world.tenants[tenant].cohort }
    }

    fn charge(&self, r: usize) -> &'w Usage {
        &self.world.charges[self.reqs[r].profile].0
    }

    /// What tenant `t`'s live requests that `keep` accepts hold.
    fn held(&self, t: usize, keep: impl Fn(&Req) -> bool) -> Usage {
        let mut held = Usage::new();
        (self.live[t].iter().filter(|&&r| keep(&self.reqs[r])))
            .for_each(|&r| quota::accumulate(&mut held, self.charge(r)));
        held
    }

    /// The members of cohort `c`, holding what their live requests that `keep` accepts hold.
    fn members(&self, c: usize, keep: impl Fn(&Req) -> bool + Copy) -> Vec<Member> {
        (self.tenants_of(c).into_iter())
            .map(|t| {
                let w = &self.world.tenants[t];
                Member {
                    tenant: format!("t{t}"),
                    guaranteed: w.guarantee.clone(),
                    maximum: w.maximum.clone(),
                    lending: Usage::new(),
                    held: self.held(t, keep),
                    weight: self.world.guarantee(t) as u32,
                }
            })
            .collect()
    }

    fn tenants_of(&self, c: usize) -> Vec<usize> {
        (0..self.world.tenants.len()).filter(|&t| self.world.tenants[t].cohort == c).collect()
    }

    fn submit(&mut self, tenant: usize, profile: usize, minutes: u32, priority: Priority, t: u32, again: bool) {
        let (g, charge) = (&self.world.tenants[tenant].guarantee, &self.world.charges[profile].0);
        let within = quota::check(g, &self.held(tenant, |_| true), charge).is_ok();
        let (state, reclaim_at, judged, tried) = (State::Waiting, None, false, None);
        let (room_picked, room_released, room_found, log) = (None, false, None, Vec::new());
        let req = Req {
            tenant,
            profile,
            minutes,
            priority,
            arrival: t,
            state,
            reclaim_at,
            within,
            judged,
            tried,
            room_picked,
            room_released,
            room_found,
            log,
        };
        self.reqs.push(req);
        self.stats.n.submitted += 1;
        self.stats.n.resubmitted += u64::from(again);
        let r = self.reqs.len() - 1;
        self.waiting.push(r);
        assert!(self.try_admit(r) || !within, "a request within its guarantee is always admitted");
    }

    fn try_admit(&mut self, r: usize) -> bool {
        let tenant = self.reqs[r].tenant;
        let group = self.group(tenant);
        if self.reqs[r].tried == Some(self.epoch[group]) {
            return false;
        }
        let w = &self.world.tenants[tenant];
        let charge = self.charge(r);
        let ok = match self.policy {
            Policy::Hard => quota::check(&w.guarantee, &self.held(tenant, |_| true), charge).is_ok(),
            Policy::Cohorts => {
                let members = self.members(w.cohort, |_| true);
                let admitted = cohort::admit(&members, w.index, true, charge).is_ok();
                let room = cohort::room(&members, w.index, true, &Resource::ComputeSlices).unwrap();
                assert_eq!(admitted, charge[&Resource::ComputeSlices] <= room, "admit and room agree");
                admitted
            }
        };
        if ok {
            self.reqs[r].state = State::Pending;
            self.live[tenant].push(r);
            self.dirty = true;
        } else {
            self.reqs[r].tried = Some(self.epoch[group]);
        }
        ok
    }

    /// Releases request `r`: its instance stays on the GPU, free.
    fn release(&mut self, r: usize) {
        if let State::Running { gpu, start, .. } = self.reqs[r].state {
            let slot = self.gpus[gpu].iter_mut().find(|s| s.start == start).unwrap();
            assert_eq!(slot.owner, Some(r));
            slot.owner = None;
        }
        let tenant = self.reqs[r].tenant;
        self.reqs[r].state = State::Done;
        self.live[tenant].retain(|&q| q != r);
        let g = self.group(tenant);
        self.epoch[g] += 1;
        self.dirty = true;
    }

    fn finish_due(&mut self, t: u32) {
        let due: Vec<usize> = (self.live.iter().flatten())
            .copied()
            .filter(|&r| matches!(self.reqs[r].state, State::Running { end, .. } if end <= t))
            .collect();
        due.into_iter().for_each(|r| self.release(r));
    }

    /// Per live request of tenant `t`: whether it is borrowed ([`cohort::mark_borrowed`]).
    fn borrowed(&self, t: usize) -> Vec<(usize, bool)> {
        let held: Vec<Held<'_>> = (self.live[t].iter())
            .map(|&r| Held {
                priority: self.reqs[r].priority,
                created_at_ms: i64::from(self.reqs[r].arrival) * 60_000,
                charge: self.charge(r),
            })
            .collect();
        self.live[t].iter().copied().zip(cohort::mark_borrowed(&self.world.tenants[t].guarantee, &held)).collect()
    }

    /// Rebalances cohort `c` as the server does: quota picks ([`cohort::choose_reclaim`]) and room picks
    /// ([`Sim::room_picks`]) are told, due ones released, notices chosen by neither withdrawn.
    fn rebalance(&mut self, c: usize, t: u32) {
        let members = self.members(c, |_| true);
        let tenants = self.tenants_of(c);
        let marks: Vec<(usize, bool)> = tenants.iter().flat_map(|&x| self.borrowed(x)).collect();
        let ids: Vec<usize> = marks.iter().filter(|(_, b)| *b).map(|&(r, _)| r).collect();
        let candidates: Vec<Candidate> = ids.iter().map(|&r| self.candidate(r)).collect();
        let quota: Vec<usize> = cohort::choose_reclaim(&members, &candidates).into_iter().map(|k| ids[k]).collect();
        let room = self.room_picks(&members, &marks, t);
        // Room picks of requests that are no longer borrowed are ignored (here they are chosen among borrowed ones).
        let room: Vec<(usize, usize)> = room.into_iter().filter(|(r, _)| ids.contains(r)).collect();
        for &(_, w) in &room {
            self.reqs[w].room_picked.get_or_insert(t);
        }
        for r in marks.into_iter().map(|(r, _)| r) {
            let for_quota = quota.contains(&r);
            let for_room = room.iter().any(|(q, _)| *q == r);
            match (for_quota || for_room, self.reqs[r].reclaim_at) {
                (true, Some(at)) if at <= t => {
                    self.stats.n.reclaimed_for_room += u64::from(!for_quota);
                    let what = format!("{t}: released {} (quota pick: {for_quota})", self.describe(r));
                    for &(_, w) in room.iter().filter(|(q, _)| *q == r) {
                        self.reqs[w].room_released = true;
                        if self.trace {
                            self.reqs[w].log.push(what.clone());
                        }
                    }
                    self.reclaim(r, t);
                }
                (true, None) => {
                    self.reqs[r].reclaim_at = Some(t + GRACE_MIN);
                    self.stats.n.notices += 1;
                    self.stats.n.notices_for_room += u64::from(!for_quota);
                    self.dirty = true;
                }
                (false, Some(_)) => {
                    self.reqs[r].reclaim_at = None;
                    self.stats.n.withdrawn += 1;
                    self.dirty = true;
                }
                _ => {}
            }
        }
        let untold = self.members(c, |q| q.reclaim_at.is_none());
        assert!(cohort::deficits(&untold).is_empty(), "cohort {c} at minute {t}: told requests must cover the deficit");
    }

    fn candidate(&self, r: usize) -> Candidate {
        let q = &self.reqs[r];
        Candidate {
            id: r.to_string(),
            member: self.world.tenants[q.tenant].index,
            priority: q.priority,
            created_at_ms: i64::from(q.arrival) * 60_000,
            running: matches!(q.state, State::Running { .. }),
            charge: self.charge(r).clone(),
            reclaim_at_ms: q.reclaim_at.map(|m| i64::from(m) * 60_000),
        }
    }

    /// Room picks, as the server's `room_picks`: for each pending request of the cohort that is not borrowed (`marks`:
    /// the cohort's live requests and whether each is borrowed), oldest first, at most [`ROOM_TRIES`], that the planner
    /// cannot place now, [`cohort::choose_for_placement`] over the cohort's borrowed requests that hold instances, with
    /// `fits` asking the planner whether it is placed once theirs are freed. Returns `(request to reclaim, request it
    /// makes room for)`.
    fn room_picks(&mut self, members: &[Member], marks: &[(usize, bool)], t: u32) -> Vec<(usize, usize)> {
        let mut waiting: Vec<usize> =
            marks.iter().filter(|&&(r, b)| !b && self.reqs[r].state == State::Pending).map(|&(r, _)| r).collect();
        if waiting.is_empty() {
            return Vec::new();
        }
        waiting.sort_by_key(|&r| (self.reqs[r].arrival, r));
        if self.trace {
            let what = format!("{t}: not among the oldest {ROOM_TRIES} waiting requests of the cohort");
            waiting.iter().skip(ROOM_TRIES).for_each(|&w| self.reqs[w].log.push(what.clone()));
        }
        waiting.truncate(ROOM_TRIES);
        let ids: Vec<usize> = (marks.iter())
            .filter(|&&(r, b)| b && matches!(self.reqs[r].state, State::Running { .. }))
            .map(|&(r, _)| r)
            .collect();
        let candidates: Vec<Candidate> = ids.iter().map(|&r| self.candidate(r)).collect();
        let mut picks: Vec<(usize, usize)> = Vec::new();
        for w in waiting {
            let mut calls = 0;
            let mut fits = |picked: &[usize]| {
                calls += 1;
                let freed: Vec<usize> = picked.iter().map(|&i| ids[i]).collect();
                plan(self.world.catalog, &self.input(&[w], &freed)).unwrap().unplaced.is_empty()
            };
            if fits(&[]) {
                self.stats.n.room_plans += calls;
                if self.trace {
                    self.reqs[w].log.push(format!("{t}: the planner places it on its own"));
                }
                continue;
            }
            let chosen = cohort::choose_for_placement(members, &candidates, &mut fits);
            self.stats.n.room_plans += calls;
            self.check_room_pick(w, &ids, chosen.as_deref());
            self.stats.n.room_searches += 1;
            self.stats.n.room_found += u64::from(chosen.is_some());
            self.reqs[w].room_found = Some(chosen.is_some());
            if self.trace {
                let what = match &chosen {
                    None => format!("none of {} running borrowed requests makes room", ids.len()),
                    Some(p) => format!("picks {:?}", p.iter().map(|&i| self.describe(ids[i])).collect::<Vec<_>>()),
                };
                self.reqs[w].log.push(format!("{t}: room search ({calls} planner calls): {what}"));
            }
            // Every pair is kept (the server keeps the first request each pick makes room for, only to name it).
            picks.extend(chosen.into_iter().flatten().map(|i| (ids[i], w)));
        }
        picks
    }

    /// Checks what [`cohort::choose_for_placement`] answered for `w` against its documentation: `Some(picks)`:
    /// distinct candidates with which `w` is placed, none of which it is placed without (counted when not); `None`:
    /// `w` is not placed even with every candidate freed.
    fn check_room_pick(&mut self, w: usize, ids: &[usize], chosen: Option<&[usize]>) {
        let fits = |freed: &[usize]| plan(self.world.catalog, &self.input(&[w], freed)).unwrap().unplaced.is_empty();
        let Some(picked) = chosen else {
            assert!(!fits(ids), "choose_for_placement gave up on #{w} though freeing every candidate makes room");
            return;
        };
        let freed: Vec<usize> = picked.iter().map(|&i| ids[i]).collect();
        assert!(!freed.is_empty() && freed.iter().all(|r| ids.contains(r)), "picks are candidates");
        assert!(freed.iter().enumerate().all(|(k, r)| !freed[..k].contains(r)), "picks are distinct");
        assert!(fits(&freed), "choose_for_placement picked {freed:?} for #{w}, which do not make room");
        let spare = (0..freed.len()).any(|k| {
            let without: Vec<usize> = freed.iter().enumerate().filter(|(j, _)| *j != k).map(|(_, &r)| r).collect();
            fits(&without)
        });
        self.stats.n.room_spare += u64::from(spare);
    }

    /// A request in a trace: id, tenant, profile, where it runs, its notice.
    fn describe(&self, r: usize) -> String {
        let q = &self.reqs[r];
        let at = match q.state {
            State::Running { gpu, start, .. } => format!(" on gpu {gpu}@{start}"),
            _ => String::new(),
        };
        let told = q.reclaim_at.map(|m| format!(" told, due {m}")).unwrap_or_default();
        format!("#{r} t{} {}{at}{told}", q.tenant, PROFILES[q.profile].0)
    }

    /// A due reclaim: released (or cancelled, if not running) and resubmitted for what is left of it.
    fn reclaim(&mut self, r: usize, t: u32) {
        let q = &self.reqs[r];
        let (tenant, profile, priority) = (q.tenant, q.profile, q.priority);
        let left = match q.state {
            State::Running { end, .. } => {
                self.stats.n.reclaimed_running += 1;
                // Did the lender still wait for hardware, or did its request already run on capacity that was free?
                let c = self.world.tenants[tenant].cohort;
                let waiting = (self.tenants_of(c).into_iter())
                    .any(|x| self.borrowed(x).iter().any(|&(q, b)| !b && self.reqs[q].state == State::Pending));
                self.stats.n.reclaimed_quota_only += u64::from(!waiting);
                end - t
            }
            _ => {
                self.stats.n.reclaimed_pending += 1;
                if q.within && !q.judged {
                    self.miss(r, Miss::Reclaimed);
                }
                self.reqs[r].minutes
            }
        };
        self.stats.n.reclaimed_slice_minutes += self.world.charges[profile].1 * u64::from(left);
        self.release(r);
        // Its owner resubmits it the next minute, for what is left.
        self.resubmit.push(Job { at: t + 1, tenant, profile, minutes: left, priority });
    }

    /// Plans the admitted requests that are not running (and not told to go), within guarantee first.
    fn place(&mut self, t: u32) {
        let mut passes: [Vec<usize>; 2] = [Vec::new(), Vec::new()];
        for tenant in 0..self.world.tenants.len() {
            for (r, borrowed) in self.borrowed(tenant) {
                if self.reqs[r].state == State::Pending && self.reqs[r].reclaim_at.is_none() {
                    passes[usize::from(borrowed)].push(r);
                }
            }
        }
        for mut list in passes.into_iter().filter(|l| !l.is_empty()) {
            list.sort_by_key(|&r| (Reverse(self.reqs[r].priority), self.reqs[r].arrival, r));
            self.plan_once(&list, t);
        }
        self.dirty = false;
    }

    /// The planner's input: the fleet as it is (the instances of `freed` counted free) and `list` as demand.
    fn input(&self, list: &[usize], freed: &[usize]) -> PlanInput {
        let in_use = |s: &Slot| s.owner.is_some_and(|r| !freed.contains(&r));
        let gpus = (self.gpus.iter().enumerate())
            .map(|(g, slots)| GpuInput {
                id: g.to_string(),
                model: MODEL.to_string(),
                instances: (slots.iter())
                    .map(|s| InstanceInput { profile: s.profile.clone(), start: s.start, in_use: in_use(s) })
                    .collect(),
                cordoned: false,
                layout_pending: false,
            })
            .collect();
        let demand = (list.iter())
            .map(|&r| DemandInput {
                profile: PROFILES[self.reqs[r].profile].0.to_string(),
                count: 1,
                model: Some(MODEL.to_string()),
            })
            .collect();
        PlanInput { gpus, demand }
    }

    fn plan_once(&mut self, list: &[usize], t: u32) {
        let plan = plan(self.world.catalog, &self.input(list, &[])).unwrap();
        self.stats.n.plans += 1;
        for changed in &plan.changed_gpus {
            let g: usize = changed.gpu.parse().unwrap();
            let old = std::mem::take(&mut self.gpus[g]);
            self.gpus[g] = (changed.layout.iter())
                .map(|i| {
                    let was = old.iter().find(|s| s.start == i.start && s.profile == i.profile);
                    let compute = u64::from(self.world.model.profile(&i.profile).unwrap().compute_slices);
                    Slot { profile: i.profile.clone(), start: i.start, compute, owner: was.and_then(|s| s.owner) }
                })
                .collect();
            for s in old.iter().filter(|s| s.owner.is_some()) {
                let kept =
                    self.gpus[g].iter().any(|n| n.start == s.start && n.profile == s.profile && n.owner == s.owner);
                assert!(kept, "gpu {g}: an instance in use moved");
            }
        }
        for p in &plan.placed {
            let (r, g) = (list[p.demand], p.gpu.parse::<usize>().unwrap());
            let slot = self.gpus[g].iter_mut().find(|s| s.start == p.start && s.profile == p.profile).unwrap();
            assert_eq!(slot.owner, None, "gpu {g}: an instance in use handed out again");
            slot.owner = Some(r);
            let q = &mut self.reqs[r];
            q.state = State::Running { gpu: g, start: p.start, end: t + q.minutes };
            self.stats.waits.push(t - q.arrival);
            if q.within && !q.judged {
                q.judged = true;
                self.stats.n.guaranteed_served += 1;
            }
        }
    }

    /// Whether the planner would place `r` had its cohort reclaimed every borrowed request running now: what a reclaim
    /// that looks at placement could have done, where [`cohort::choose_reclaim`] only covers the quota deficit.
    fn placeable_after_reclaim(&self, r: usize) -> bool {
        let c = self.world.tenants[self.reqs[r].tenant].cohort;
        let borrowed: Vec<usize> = (self.tenants_of(c).into_iter())
            .flat_map(|x| self.borrowed(x))
            .filter(|&(q, b)| b && matches!(self.reqs[q].state, State::Running { .. }))
            .map(|(q, _)| q)
            .collect();
        !borrowed.is_empty() && plan(self.world.catalog, &self.input(&[r], &borrowed)).unwrap().summary.placed == 1
    }

    fn miss(&mut self, r: usize, why: Miss) {
        self.reqs[r].judged = true;
        match why {
            Miss::Fragmented => self.stats.n.missed_fragmented += 1,
            Miss::Full => self.stats.n.missed_full += 1,
            Miss::Reclaimed => self.stats.n.missed_reclaimed += 1,
        }
        *self.stats.missed_by_profile.entry(PROFILES[self.reqs[r].profile].0).or_default() += 1;
    }

    /// Utilisation, invariants, and within-guarantee requests whose grace period ran out this minute.
    fn account(&mut self, t: u32) {
        let running: u64 = self.gpus.iter().flatten().filter(|s| s.owner.is_some()).map(|s| s.compute).sum();
        let free = self.world.fleet_slices().checked_sub(running).expect("running slices exceed the fleet");
        self.stats.n.running_slice_minutes += running;
        for (x, w) in self.world.tenants.iter().enumerate() {
            let member = Member { guaranteed: w.guarantee.clone(), maximum: w.maximum.clone(), ..Member::default() };
            let ceiling = member.ceiling(&Resource::ComputeSlices, self.policy == Policy::Cohorts).unwrap();
            let held = self.held(x, |_| true).get(&Resource::ComputeSlices).copied().unwrap_or(0);
            assert!(held <= ceiling, "{:?}: tenant {x} holds {held} over its ceiling {ceiling} at {t}", self.policy);
        }
        let late: Vec<usize> = (self.live.iter().flatten().copied())
            .filter(|&r| {
                let q = &self.reqs[r];
                q.within && !q.judged && q.state == State::Pending && t >= q.arrival + GRACE_MIN
            })
            .collect();
        for r in late {
            let why = if free >= self.world.charges[self.reqs[r].profile].1 { Miss::Fragmented } else { Miss::Full };
            if self.policy == Policy::Cohorts {
                self.stats.n.missed_reclaimable += u64::from(self.placeable_after_reclaim(r));
                let now_borrowed = self.borrowed(self.reqs[r].tenant).contains(&(r, true));
                let q = &self.reqs[r];
                match (q.room_picked, q.room_found) {
                    _ if now_borrowed => self.stats.n.missed_now_borrowed += 1,
                    _ if q.room_released => self.stats.n.missed_room_taken += 1,
                    (Some(_), _) => self.stats.n.missed_room_late += 1,
                    (None, Some(false)) => self.stats.n.missed_room_none += 1,
                    _ => self.stats.n.missed_room_untried += 1,
                }
                if self.trace {
                    self.print_miss(r, t, free);
                }
            }
            self.miss(r, why);
        }
    }
}

impl Sim<'_, '_> {
    /// With `--trace`: what happened to within-guarantee request `r`, late at minute `t`.
    fn print_miss(&self, r: usize, t: u32, free: u64) {
        let q = &self.reqs[r];
        let c = self.world.tenants[q.tenant].cohort;
        println!(
            "\nmiss at {t}: {} (arrived {}, priority {}), cohort {c}, {free} slices free",
            self.describe(r),
            q.arrival,
            q.priority
        );
        for line in &q.log {
            println!("  {line}");
        }
        let layout = |slots: &Vec<Slot>| {
            let mut v: Vec<String> = (slots.iter())
                .map(|s| format!("{}@{}{}", s.profile, s.start, s.owner.map(|o| format!("=#{o}")).unwrap_or_default()))
                .collect();
            v.sort();
            v.join(" ")
        };
        let marks: BTreeMap<usize, bool> = (self.tenants_of(c).into_iter()).flat_map(|x| self.borrowed(x)).collect();
        for (g, slots) in self.gpus.iter().enumerate() {
            let owners: Vec<String> = (slots.iter().filter_map(|s| s.owner))
                .map(|o| {
                    let whose = match marks.get(&o) {
                        Some(true) => "borrowed in cohort",
                        Some(false) => "guaranteed in cohort",
                        None => "other cohort",
                    };
                    format!("#{o} {whose}")
                })
                .collect();
            println!("  gpu {g}: {} ({})", layout(slots), owners.join(", "));
        }
        let pending: Vec<String> = (self.live.iter().flatten().copied())
            .filter(|&p| p != r && self.reqs[p].state == State::Pending && marks.get(&p) == Some(&false))
            .map(|p| format!("{} arrived {}", self.describe(p), self.reqs[p].arrival))
            .collect();
        println!("  other pending within-guarantee requests of the cohort: {pending:?}");
    }
}

enum Miss {
    /// The fleet had enough free compute slices, but no valid placement for the profile.
    Fragmented,
    /// Not enough free compute slices: held by other requests (e.g. borrowed ones within their grace period).
    Full,
    /// Reclaimed before it ran (a higher-priority request of its own tenant pushed it into borrowing).
    Reclaimed,
}

fn table(h: &Stats, c: &Stats) {
    let util = |s: &Stats| s.n.running_slice_minutes as f64 / s.n.capacity as f64;
    let pct = |x: f64| format!("{:.1} %", 100.0 * x);
    let ratio = |a: f64, b: f64| if a == 0.0 { "-".to_string() } else { format!("{:.2}", b / a) };
    let served = |s: &Stats| {
        let n = s.n.guaranteed_served + s.missed();
        format!("{}/{n} ({})", s.n.guaranteed_served, pct(s.n.guaranteed_served as f64 / n.max(1) as f64))
    };
    let mean = |s: &Stats| s.waits.iter().map(|&w| f64::from(w)).sum::<f64>() / s.waits.len().max(1) as f64;
    let p95 = |s: &Stats| {
        let mut w = s.waits.clone();
        w.sort_unstable();
        f64::from(w.get(w.len() * 95 / 100).copied().unwrap_or(0))
    };
    let hours = |s: &Stats| s.n.reclaimed_slice_minutes as f64 / 60.0;
    println!("\n| metric | hard limits | cohorts | cohorts / hard |\n|---|---|---|---|");
    let row = |name: &str, a: String, b: String, r: String| println!("| {name} | {a} | {b} | {r} |");
    row("fleet utilisation (running slice-hours / capacity)", pct(util(h)), pct(util(c)), ratio(util(h), util(c)));
    let g = |s: &Stats| s.n.guaranteed_served as f64 / (s.n.guaranteed_served + s.missed()).max(1) as f64;
    row(&format!("within-guarantee requests running within {GRACE_MIN} min"), served(h), served(c), ratio(g(h), g(c)));
    let count = |name: &str, f: &dyn Fn(&Stats) -> u64| {
        row(name, f(h).to_string(), f(c).to_string(), ratio(f(h) as f64, f(c) as f64));
    };
    count("- missed: fragmentation (enough free slices, no valid placement)", &|s| s.n.missed_fragmented);
    count("- missed: fleet full (slices held by others)", &|s| s.n.missed_full);
    count("- missed: reclaimed before running", &|s| s.n.missed_reclaimed);
    count(
        "- fragmentation or full: borrowed by then (its tenant's higher-priority requests fill the guarantee)",
        &|s| s.n.missed_now_borrowed,
    );
    count("- fragmentation or full: room picks for it released in time, the room went to another request", &|s| {
        s.n.missed_room_taken
    });
    count("- fragmentation or full: room picks for it not released in time (told late, or withdrawn)", &|s| {
        s.n.missed_room_late
    });
    count("- fragmentation or full: no set of the cohort's running borrowed requests makes room", &|s| {
        s.n.missed_room_none
    });
    count("- fragmentation or full: never searched for room (placeable on its own, or not among the oldest 4)", &|s| {
        s.n.missed_room_untried
    });
    count("- fragmentation or full: placeable had the cohort reclaimed all its running borrowed requests", &|s| {
        s.n.missed_reclaimable
    });
    count("reclaims for quota (`choose_reclaim`: the cohort's quota was short)", &|s| {
        s.n.reclaimed_running + s.n.reclaimed_pending - s.n.reclaimed_for_room
    });
    count("- of running requests", &|s| s.n.reclaimed_running - s.n.reclaimed_for_room);
    count("- of requests not yet running (cancelled)", &|s| s.n.reclaimed_pending);
    count("reclaims for room only (`choose_for_placement`; running requests)", &|s| s.n.reclaimed_for_room);
    count("reclaims of running requests while no request within guarantee in the cohort waited for hardware", &|s| {
        s.n.reclaimed_quota_only
    });
    row(
        "work reclaimed (slice-hours, resubmitted)",
        format!("{:.0}", hours(h)),
        format!("{:.0}", hours(c)),
        "-".into(),
    );
    count("reclaim notices sent", &|s| s.n.notices);
    count("- for room only (no quota pick when told)", &|s| s.n.notices_for_room);
    count("- withdrawn before due (no longer chosen)", &|s| s.n.withdrawn);
    count("room searches (within guarantee, admitted, planner finds no room)", &|s| s.n.room_searches);
    count("- that found borrowed requests to free", &|s| s.n.room_found);
    count("- whose picks included one the request fits without", &|s| s.n.room_spare);
    count("requests submitted (incl. resubmissions)", &|s| s.n.submitted);
    count("- resubmissions after a reclaim", &|s| s.n.resubmitted);
    row("mean wait to running (min)", format!("{:.1}", mean(h)), format!("{:.1}", mean(c)), ratio(mean(h), mean(c)));
    row("p95 wait to running (min)", format!("{:.0}", p95(h)), format!("{:.0}", p95(c)), ratio(p95(h), p95(c)));
    count("requests still waiting at the end", &|s| s.n.waiting_at_end);
    count("planner calls (placing)", &|s| s.n.plans);
    count("planner calls (room checks: `fits`)", &|s| s.n.room_plans);
    let secs = |s: &Stats| s.wall.as_secs_f64();
    row("simulation wall time", format!("{:.2} s", secs(h)), format!("{:.2} s", secs(c)), ratio(secs(h), secs(c)));
}
