//! The calendar engine: [`Calendar`] (the fleet's future) and [`Prepared`], its reservations simulated once so
//! that a question about a change replays only from the change's start. Where a moment's reservations go is
//! `place`'s part; the search for the most that fit is `search`'s.

use std::collections::{BTreeMap, HashMap};

use super::rules::{Booking, CalGpu, Hold, Shortfall};
use super::search::{preview_limit, search_most};
use crate::catalog::{Catalog, GpuModel};
use crate::layout::{Inst, Occupancy};

/// The fleet's future: GPUs, what is held on them and until when, and the accepted reservations.
#[derive(Debug, Clone)]
pub struct Calendar<'a> {
    pub(super) catalog: &'a Catalog,
    pub(super) gpus: Vec<CalGpu>,
    pub(super) holds: Vec<Hold>,
    pub(super) bookings: Vec<Booking>,
    /// Per reservation id, the slices an earlier simulation placed it on (see [`Calendar::with_hints`]).
    pub(super) hints: HashMap<String, Vec<Hold>>,
}

/// What a simulation found: where each reservation's slices go, and which found no room.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Simulation {
    /// Per reservation id, the slices placed for it (held until its end).
    pub placed: BTreeMap<String, Vec<Hold>>,
    /// Reservations short of room at their start, in time order.
    pub short: Vec<Shortfall>,
}

impl<'a> Calendar<'a> {
    /// A calendar of `gpus` with `holds` and accepted `bookings`.
    pub fn new(catalog: &'a Catalog, gpus: Vec<CalGpu>, holds: Vec<Hold>, bookings: Vec<Booking>) -> Self {
        Calendar { catalog, gpus, holds, bookings, hints: HashMap::new() }
    }

    /// The same calendar where each reservation keeps the slices an earlier simulation placed it on (`hints`, by
    /// reservation id) whenever they are still free at its start; the others are planned around them. With the
    /// last simulation's placements as hints, releasing anything (a cancelled reservation, an allocation ending
    /// early) never leaves an accepted reservation short: every hint stays free, since less is held at every
    /// moment. Without hints, a replay plans every reservation anew, and a heuristic planner may then place an
    /// earlier reservation where a later one needed room.
    pub fn with_hints(mut self, hints: HashMap<String, Vec<Hold>>) -> Self {
        self.hints = hints;
        self
    }

    /// The accepted reservations.
    pub fn bookings(&self) -> &[Booking] {
        &self.bookings
    }

    /// Whether `other` is the same calendar: the same GPUs, holds, reservations and kept slices (a simulation of one
    /// answers for the other).
    pub fn same_inputs(&self, other: &Calendar<'_>) -> bool {
        self.same_fleet(other)
            && (self.bookings == other.bookings
                || self.bookings.len() == other.bookings.len() && {
                    let (mut mine, mut theirs): (Vec<&Booking>, Vec<&Booking>) =
                        (self.bookings.iter().collect(), other.bookings.iter().collect());
                    mine.sort_by(|a, b| a.id.cmp(&b.id));
                    theirs.sort_by(|a, b| a.id.cmp(&b.id));
                    mine == theirs
                })
    }

    /// Whether `other` has the same GPUs, holds and kept slices (its reservations aside).
    fn same_fleet(&self, other: &Calendar<'_>) -> bool {
        std::ptr::eq(self.catalog, other.catalog)
            && self.gpus == other.gpus
            && self.holds == other.holds
            && self.hints == other.hints
    }

    /// Whether nothing happens in `(from_ms, to_ms]`: no hold ends and no reservation starts or ends. A simulation
    /// prepared at `from_ms` then answers exactly as one prepared at `to_ms` (the fleet is the same at `to_ms`, and
    /// reservations starting before the simulation's start are placed as of it, in the same order).
    pub fn quiet_between(&self, from_ms: i64, to_ms: i64) -> bool {
        let inside = |t: i64| from_ms < t && t <= to_ms;
        !self.holds.iter().any(|h| h.until_ms.is_some_and(inside))
            && !self.bookings.iter().any(|b| inside(b.start_ms) || inside(b.end_ms))
    }

    /// The same calendar with `b` accepted too.
    pub fn with_booking(mut self, b: Booking) -> Self {
        self.bookings.push(b);
        self
    }

    /// Replays the reservations that end after `from_ms`, in start order (ties by id), with `extra` holds added
    /// (slices an approval would place now). A reservation starting before `from_ms` is placed as of `from_ms`.
    pub fn simulate(&self, from_ms: i64, extra: &[Hold]) -> Simulation {
        if extra.is_empty() {
            return Prepared::new(self.clone(), from_ms).simulation();
        }
        let mut with = self.clone();
        with.holds.extend(extra.iter().cloned());
        Prepared::new(with, from_ms).simulation()
    }

    /// Simulates the accepted reservations once from `now_ms`, so that many questions (admissions, previews,
    /// protection) replay only what each changes.
    pub fn prepare(&self, now_ms: i64) -> Prepared<'a> {
        Prepared::new(self.clone(), now_ms)
    }

    /// Whether `new` fits: the simulation with it added leaves every reservation (it included) its room. Returns
    /// the shortfalls otherwise.
    pub fn admit(&self, new: &Booking, now_ms: i64) -> Result<Simulation, Vec<Shortfall>> {
        let mut p = self.prepare(now_ms);
        p.accept(new.clone())?;
        Ok(p.simulation())
    }

    /// The most slices of `b`'s spec that fit its window (`b.count` is ignored), at most 1000.
    pub fn most_that_fit(&self, b: &Booking, now_ms: i64) -> u32 {
        self.prepare(now_ms).most_that_fit(b)
    }

    /// Whether holding `extra` leaves every accepted reservation its room; else the first reservation it would
    /// leave short (an allocation ending before that reservation's start would fit).
    pub fn protects(&self, extra: &[Hold], now_ms: i64) -> Result<(), Shortfall> {
        if extra.is_empty() || self.bookings.iter().all(|b| b.end_ms <= now_ms) {
            return Ok(());
        }
        self.prepare(now_ms).protects(extra)
    }
}

/// A calendar whose accepted reservations are simulated once. A question about a change (a new reservation, holds
/// added now) replays only from the change's start, and stops as soon as every slice the change moved has ended:
/// from then on the fleet is as the prepared simulation has it, so the rest of the future is the same. Answers are
/// those of a whole replay.
#[derive(Debug, Clone)]
pub struct Prepared<'a> {
    pub(super) cal: Calendar<'a>,
    pub(super) from_ms: i64,
    /// The GPUs' models, as the catalog resolves them.
    pub(super) models: Vec<Option<&'a GpuModel>>,
    /// GPU id -> index in `cal.gpus`.
    pub(super) index: HashMap<String, usize>,
    /// The fleet's distinct models, and per GPU the index of its model among them.
    pub(super) distinct: Vec<&'a GpuModel>,
    pub(super) slot: Vec<Option<usize>>,
    /// Per GPU (index in `cal.gpus`), the indices of the calendar's holds on it.
    holds_on: Vec<Vec<usize>>,
    /// Per GPU, the other GPUs of its node (indices in `cal.gpus`).
    pub(super) peers: Vec<Vec<usize>>,
    /// Per GPU, its model's index in the catalog and its MIG layout as instances (the layout `None` when it is not a
    /// valid one of the model: the planner is then shown only what is held there).
    pub(super) planned: Vec<Option<(usize, Option<Vec<Inst>>)>>,
    /// Indices of the bookings that end after `from_ms`, in start order (ties by id).
    pub(super) order: Vec<usize>,
    /// The moments at which bookings start, with their range in `order`.
    groups: Vec<Group>,
    /// Per booking, the slices placed for it.
    pub(super) placed: Vec<Vec<Hold>>,
    /// Per booking, how short of room it was.
    short: Vec<Option<Shortfall>>,
}

/// Bookings starting at one moment (placed together, so that the planner sees all their demand).
#[derive(Debug, Clone, Copy)]
struct Group {
    t: i64,
    first: usize,
    end: usize,
}

/// Who a replayed placement is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Member {
    Booked(usize),
    New,
}

/// What a replay with a change found.
#[derive(Debug, Default)]
struct Replay {
    /// Slices placed in the replay, in order.
    fresh: Vec<Hold>,
    /// Per member replayed: its slices (a range of `fresh`) and its shortfall.
    members: Vec<(Member, std::ops::Range<usize>, Option<Shortfall>)>,
}

impl Replay {
    fn short_of(&self, m: Member) -> Option<&Option<Shortfall>> {
        self.members.iter().find(|x| x.0 == m).map(|x| &x.2)
    }
}

impl<'a> Prepared<'a> {
    fn new(cal: Calendar<'a>, from_ms: i64) -> Self {
        let models: Vec<Option<&GpuModel>> =
            cal.gpus.iter().map(|g| cal.catalog.resolve(&g.model).map(|(m, _)| m)).collect();
        let index: HashMap<String, usize> = cal.gpus.iter().enumerate().map(|(i, g)| (g.id.clone(), i)).collect();
        let mut distinct: Vec<&GpuModel> = Vec::new();
        let slot = models
            .iter()
            .map(|m: &Option<&GpuModel>| {
                let m = (*m)?;
                Some(distinct.iter().position(|d| std::ptr::eq(*d, m)).unwrap_or_else(|| {
                    distinct.push(m);
                    distinct.len() - 1
                }))
            })
            .collect();
        let n = cal.bookings.len();
        let mut holds_on: Vec<Vec<usize>> = vec![Vec::new(); cal.gpus.len()];
        for (k, h) in cal.holds.iter().enumerate() {
            if let Some(&g) = index.get(&h.gpu) {
                holds_on[g].push(k);
            }
        }
        let mut by_node: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, g) in cal.gpus.iter().enumerate() {
            by_node.entry(g.node.as_str()).or_default().push(i);
        }
        let peers = cal
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| by_node[g.node.as_str()].iter().copied().filter(|&j| j != i).collect())
            .collect();
        let planned = cal
            .gpus
            .iter()
            .zip(&models)
            .map(|(g, m)| {
                let m = (*m)?;
                let layout = g
                    .layout
                    .iter()
                    .map(|(p, start)| Some(Inst { profile: m.profile_index(p)?, start: *start }))
                    .collect::<Option<Vec<Inst>>>()
                    .filter(|l| a_layout(m, l));
                Some((cal.catalog.models.iter().position(|x| std::ptr::eq(x, m))?, layout))
            })
            .collect();
        let mut p = Prepared {
            cal,
            from_ms,
            planned,
            models,
            index,
            distinct,
            slot,
            holds_on,
            peers,
            order: vec![],
            groups: vec![],
            placed: vec![vec![]; n],
            short: vec![None; n],
        };
        p.regroup();
        let replay = p.replay_from(0, None, &[], false, false);
        p.absorb(replay);
        p
    }

    /// The calendar it simulates.
    pub fn calendar(&self) -> &Calendar<'a> {
        &self.cal
    }

    /// When the simulation starts, UTC milliseconds.
    pub fn from_ms(&self) -> i64 {
        self.from_ms
    }

    /// Whether this simulation answers for `cal` at `now_ms` exactly as a new one would, about reservations that
    /// start after `now_ms` and slices held from `now_ms`: the same calendar, and nothing happening between the
    /// simulation's start and `now_ms` (see [`Calendar::quiet_between`]). (A reservation starting exactly at a
    /// simulation's start is placed together with those that started before it, so one starting at `now_ms` is
    /// not answered for.)
    pub fn answers_for(&self, cal: &Calendar<'_>, now_ms: i64) -> bool {
        now_ms >= self.from_ms && self.cal.same_inputs(cal) && cal.quiet_between(self.from_ms, now_ms)
    }

    /// When `cal` is this simulation's calendar with one reservation more, starting after `now_ms`, and nothing
    /// happened between the simulation's start and `now_ms` (as [`Prepared::answers_for`] asks): that reservation.
    /// Accepting it here ([`Prepared::accept_and_keep`]) then simulates `cal` as a new simulation would, replaying
    /// only from its start.
    pub fn one_more<'c>(&self, cal: &'c Calendar<'_>, now_ms: i64) -> Option<&'c Booking> {
        if now_ms < self.from_ms || cal.bookings.len() != self.cal.bookings.len() + 1 || !self.cal.same_fleet(cal) {
            return None;
        }
        let known: HashMap<&str, &Booking> = self.cal.bookings.iter().map(|b| (b.id.as_str(), b)).collect();
        let mut more = None;
        for b in &cal.bookings {
            match known.get(b.id.as_str()) {
                Some(k) if *k == b => {}
                None if more.is_none() => more = Some(b),
                _ => return None,
            }
        }
        more.filter(|b| b.start_ms > now_ms && cal.quiet_between(self.from_ms, now_ms))
    }

    /// The whole simulation.
    pub fn simulation(&self) -> Simulation {
        let mut sim = Simulation::default();
        for &i in &self.order {
            sim.placed.insert(self.cal.bookings[i].id.clone(), self.placed[i].clone());
            sim.short.extend(self.short[i].clone());
        }
        sim
    }

    /// Whether `new` would fit with every accepted reservation keeping its room; the shortfalls otherwise.
    pub fn fits(&self, new: &Booking) -> Result<(), Vec<Shortfall>> {
        let replay = self.replay_new(new, false);
        let short = self.shortfalls(&replay);
        if short.is_empty() { Ok(()) } else { Err(short) }
    }

    /// Whether `new` would fit, as [`Prepared::fits`]; when it would not, the shortfalls up to the first that the
    /// change causes (the replay stops there), which always include `new`'s own at its start. Enough for a search.
    fn fits_until_short(&self, new: &Booking) -> Result<(), Vec<Shortfall>> {
        let replay = self.replay_new(new, true);
        let short = self.shortfalls(&replay);
        if short.is_empty() { Ok(()) } else { Err(short) }
    }

    /// Accepts `new` if it fits (see [`Prepared::fits`]); the simulation then includes it.
    pub fn accept(&mut self, new: Booking) -> Result<(), Vec<Shortfall>> {
        self.accept_with(new, false)
    }

    /// Accepts `new` as [`Prepared::accept`] does, then keeps each reservation the change placed (`new` included)
    /// on its slices for the replays that follow, as the server keeps them after each acceptance
    /// ([`Calendar::with_hints`]): a later change then moves only what it must, and its replay stops sooner.
    pub fn accept_and_keep(&mut self, new: Booking) -> Result<(), Vec<Shortfall>> {
        self.accept_with(new, true)
    }

    fn accept_with(&mut self, new: Booking, keep: bool) -> Result<(), Vec<Shortfall>> {
        let replay = self.replay_new(&new, false);
        let short = self.shortfalls(&replay);
        if !short.is_empty() {
            return Err(short);
        }
        self.cal.bookings.push(new);
        self.placed.push(vec![]);
        self.short.push(None);
        let n = self.cal.bookings.len() - 1;
        let replay = Replay {
            members: replay
                .members
                .into_iter()
                .map(|(m, r, s)| (if m == Member::New { Member::Booked(n) } else { m }, r, s))
                .collect(),
            ..replay
        };
        if keep {
            for (m, range, _) in &replay.members {
                if let Member::Booked(i) = m
                    && !range.is_empty()
                {
                    // As the server stores them: where, not until when (a kept slice is held to its reservation's end).
                    let slices = replay.fresh[range.clone()].iter().map(|h| Hold { until_ms: None, ..h.clone() });
                    self.cal.hints.insert(self.cal.bookings[*i].id.clone(), slices.collect());
                }
            }
        }
        self.absorb(replay);
        self.regroup();
        Ok(())
    }

    /// The most slices of `b`'s spec that fit its window (`b.count` is ignored), at most 1000: [`search_most`] over
    /// [`Prepared::fits`], bounded by what the fleet has room for at the window's start ([`Prepared::search_bound`]).
    /// The count it answers always fits; the planner is a heuristic, so on rare fleets a larger count that the search
    /// skipped could fit too.
    pub fn most_that_fit(&self, b: &Booking) -> u32 {
        search_most(0, self.search_bound(b), &b.id, |n| self.fits_until_short(&Booking { count: n, ..b.clone() }))
    }

    /// What a preview of booking `b` asks: how many slices of its spec fit its window, counted up to
    /// [`preview_limit`] (`b.count` or [`PREVIEW_COUNT`], whichever is larger; an answer equal to it means that many
    /// or more), and whether `b.count` fits (as [`Prepared::fits`]). The asked count is the search's first probe, so
    /// the two answers cost one search. Counting further would probe counts of hundreds of slices, each placed by
    /// the planner and moving later reservations off their kept slices, for a figure the asker does not need.
    ///
    /// [`PREVIEW_COUNT`]: super::search::PREVIEW_COUNT
    pub fn preview(&self, b: &Booking) -> (u32, Result<(), Vec<Shortfall>>) {
        let bound = self.search_bound(b).min(preview_limit(b.count));
        let mut asked = None;
        let most = search_most(b.count, bound, &b.id, |n| {
            let probe = Booking { count: n, ..b.clone() };
            if n == b.count {
                let r = self.fits(&probe);
                asked = Some(r.clone());
                r
            } else {
                self.fits_until_short(&probe)
            }
        });
        (most, asked.unwrap_or_else(|| self.fits(b)))
    }

    /// Whether holding `extra` from now leaves every accepted reservation its room; else the first reservation it
    /// would leave short that was not short already.
    pub fn protects(&self, extra: &[Hold]) -> Result<(), Shortfall> {
        if extra.is_empty() || self.order.is_empty() {
            return Ok(());
        }
        let replay = self.replay_from(0, None, extra, true, false);
        self.shortfalls(&replay)
            .into_iter()
            .find(|s| {
                self.cal.bookings.iter().zip(&self.short).all(|(b, before)| b.id != s.booking || before.is_none())
            })
            .map_or(Ok(()), Err)
    }

    /// Where [`Prepared::most_that_fit`]'s search starts: no more than 1000, than the fleet could ever hold
    /// ([`Prepared::capacity`]), nor than [`Prepared::room_at`] the window's start.
    pub fn search_bound(&self, b: &Booking) -> u32 {
        self.capacity(&b.spec).min(self.room_at(&b.spec, b.start_ms.max(self.from_ms))).min(1000)
    }
    /// Rebuilds the start order and the groups after the bookings changed.
    fn regroup(&mut self) {
        let bookings = &self.cal.bookings;
        let mut order: Vec<usize> = (0..bookings.len()).filter(|&i| bookings[i].end_ms > self.from_ms).collect();
        order.sort_by(|&a, &b| (bookings[a].start_ms, &bookings[a].id).cmp(&(bookings[b].start_ms, &bookings[b].id)));
        let mut groups: Vec<Group> = Vec::new();
        for (k, &i) in order.iter().enumerate() {
            let t = bookings[i].start_ms.max(self.from_ms);
            match groups.last_mut() {
                Some(g) if g.t == t => g.end = k + 1,
                _ => groups.push(Group { t, first: k, end: k + 1 }),
            }
        }
        self.order = order;
        self.groups = groups;
    }

    /// Takes a replay's placements as the prepared simulation's.
    fn absorb(&mut self, replay: Replay) {
        for (m, range, short) in replay.members {
            if let Member::Booked(i) = m {
                self.placed[i] = replay.fresh[range].to_vec();
                self.short[i] = short;
            }
        }
    }

    /// Every shortfall with `replay`'s changes, in time order.
    fn shortfalls(&self, replay: &Replay) -> Vec<Shortfall> {
        let replayed: HashMap<usize, &Option<Shortfall>> = replay
            .members
            .iter()
            .filter_map(|(m, _, s)| match m {
                Member::Booked(i) => Some((*i, s)),
                Member::New => None,
            })
            .collect();
        let mut out: Vec<Shortfall> = Vec::new();
        for &i in &self.order {
            match replayed.get(&i) {
                Some(s) => out.extend((*s).clone()),
                None => out.extend(self.short[i].clone()),
            }
        }
        if let Some(Some(s)) = replay.short_of(Member::New) {
            let at = out.partition_point(|x| (x.start_ms, &x.booking) <= (s.start_ms, &s.booking));
            out.insert(at, s.clone());
        }
        out
    }

    /// The replay with `new` added, from the first moment at or after its start.
    fn replay_new(&self, new: &Booking, until_short: bool) -> Replay {
        if new.end_ms <= self.from_ms {
            return Replay::default();
        }
        let t = new.start_ms.max(self.from_ms);
        let first = self.groups.partition_point(|g| g.t < t);
        self.replay_from(first, Some(new), &[], false, until_short)
    }

    /// Replays the groups from `first` with `new` added and `extra` held from now. With `stop_early`, or with a new
    /// booking, it stops at the first moment by which every slice that differs from the prepared simulation has
    /// ended; from `first = 0` without changes it is the whole simulation.
    fn replay_from(
        &self,
        first: usize,
        new: Option<&Booking>,
        extra: &[Hold],
        stop_early: bool,
        until_short: bool,
    ) -> Replay {
        let bookings = &self.cal.bookings;
        let tag = |h: &Hold| self.index.get(&h.gpu).copied();
        // What is held besides the calendar's holds before the first group replayed, by GPU: `extra`, then the
        // slices placed for the groups before it. The replay's own slices are kept by GPU in `fresh_on`.
        let mut early: Vec<Vec<&Hold>> = vec![Vec::new(); self.cal.gpus.len()];
        let placed_before = self.groups[..first].iter().flat_map(|g| self.order[g.first..g.end].iter());
        for h in extra.iter().chain(placed_before.flat_map(|&i| self.placed[i].iter())) {
            if let Some(g) = tag(h) {
                early[g].push(h);
            }
        }
        let mut fresh_on: Vec<Vec<usize>> = vec![Vec::new(); self.cal.gpus.len()];
        let stop_early = stop_early || new.is_some();
        // Every slice that differs from the prepared simulation has ended by `horizon`.
        let mut horizon = extra.iter().map(|h| h.until_ms.unwrap_or(i64::MAX)).max().unwrap_or(i64::MIN);
        if let Some(b) = new {
            horizon = horizon.max(b.end_ms);
        }
        let mut pending = new.map(|b| (b, b.start_ms.max(self.from_ms)));
        let mut replay = Replay::default();
        let mut g = first;
        loop {
            let next = self.groups.get(g);
            let (t, mut members): (i64, Vec<Member>) = match (pending, next) {
                (Some((_, nt)), Some(grp)) if nt < grp.t => (nt, vec![Member::New]),
                (Some((b, nt)), Some(grp)) if nt == grp.t => {
                    let mut m: Vec<Member> =
                        self.order[grp.first..grp.end].iter().map(|&i| Member::Booked(i)).collect();
                    let at = self.order[grp.first..grp.end]
                        .partition_point(|&i| (bookings[i].start_ms, &bookings[i].id) < (b.start_ms, &b.id));
                    m.insert(at, Member::New);
                    g += 1;
                    (grp.t, m)
                }
                (Some((_, nt)), None) => (nt, vec![Member::New]),
                (None, Some(grp)) => {
                    if stop_early && grp.t >= horizon {
                        break;
                    }
                    g += 1;
                    (grp.t, self.order[grp.first..grp.end].iter().map(|&i| Member::Booked(i)).collect())
                }
                (None, None) => break,
                (Some(_), Some(_)) => unreachable!("the guards above cover every order"),
            };
            if members.contains(&Member::New) {
                pending = None;
            }
            let group: Vec<&Booking> = members
                .iter()
                .map(|m| match m {
                    Member::Booked(i) => &bookings[*i],
                    Member::New => new.unwrap_or_else(|| unreachable!("a new member comes with a booking")),
                })
                .collect();
            let held = Held { prep: self, early: &early, fresh: &replay.fresh, fresh_on: &fresh_on, t };
            let placed = self.place_at(&held, &group);
            for ((m, b), slices) in members.drain(..).zip(&group).zip(placed) {
                let changed = match m {
                    Member::Booked(i) => self.placed[i] != slices,
                    Member::New => true,
                };
                // A reservation placed otherwise than in the prepared simulation (with fewer slices too: holding less
                // changes what the planner does later) differs until its end.
                if changed {
                    horizon = horizon.max(b.end_ms);
                }
                let short = ((slices.len() as u32) < b.count).then(|| Shortfall {
                    booking: b.id.clone(),
                    start_ms: b.start_ms,
                    wanted: b.count,
                    placed: slices.len() as u32,
                });
                let range = replay.fresh.len()..replay.fresh.len() + slices.len();
                for (k, h) in range.clone().zip(&slices) {
                    if let Some(g) = tag(h) {
                        fresh_on[g].push(k);
                    }
                }
                replay.fresh.extend(slices);
                replay.members.push((m, range, short));
            }
            // A shortfall the change caused (one the prepared simulation does not have) settles the question.
            let caused = |(m, _, s): &(Member, std::ops::Range<usize>, Option<Shortfall>)| {
                s.is_some() && !matches!(m, Member::Booked(i) if self.short[*i].is_some())
            };
            if until_short && replay.members.iter().rev().take(group.len()).any(caused) {
                break;
            }
        }
        replay
    }
}

/// What is held at one moment of a replay, by GPU: the calendar's holds, what was held before the replay's first
/// moment (`early`, per GPU), and the replay's own slices (`fresh`, indexed per GPU by `fresh_on`), each when held at
/// `t`. A view: nothing is copied or sorted per moment.
pub(super) struct Held<'x> {
    prep: &'x Prepared<'x>,
    early: &'x [Vec<&'x Hold>],
    fresh: &'x [Hold],
    fresh_on: &'x [Vec<usize>],
    t: i64,
}

impl<'x> Held<'x> {
    /// What is held on GPU `gpu` (an index in the calendar's GPUs) at the moment.
    pub(super) fn on(&self, gpu: usize) -> impl Iterator<Item = &'x Hold> + use<'x> {
        let (holds, t) = (&self.prep.cal.holds, self.t);
        let fresh = self.fresh;
        self.prep.holds_on[gpu]
            .iter()
            .map(move |&k| &holds[k])
            .chain(self.early[gpu].iter().copied())
            .chain(self.fresh_on[gpu].iter().map(move |&k| &fresh[k]))
            .filter(move |h| h.at(t))
    }
}

/// Whether `insts` form a valid layout of `model`: each at a placement of its profile, none overlapping, no profile
/// past its most instances.
pub(super) fn a_layout(model: &GpuModel, insts: &[Inst]) -> bool {
    let mut occ = Occupancy::EMPTY;
    insts.iter().all(|&i| {
        let fits = occ.can_add(model, i);
        if fits {
            occ.add(model, i);
        }
        fits
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::SliceSpec;
    use crate::reservation::search::PREVIEW_COUNT;
    use crate::sharing::Sharing;
    use proptest::prelude::*;

    fn catalog() -> &'static Catalog {
        Catalog::builtin()
    }

    fn mig_gpu(id: &str) -> CalGpu {
        CalGpu {
            id: id.into(),
            node: "n-mig".into(),
            model: "H100-80GB".into(),
            mig: true,
            cordoned: false,
            layout: vec![],
        }
    }

    /// A whole GPU on node `n-whole` (whole GPUs share a node unless moved).
    fn whole_gpu(id: &str) -> CalGpu {
        CalGpu {
            id: id.into(),
            node: "n-whole".into(),
            model: "H100-80GB".into(),
            mig: false,
            cordoned: false,
            layout: vec![],
        }
    }

    /// The GPUs of the property tests: two MIG GPUs on one node, two whole GPUs on another.
    fn test_fleet() -> Vec<CalGpu> {
        vec![mig_gpu("g0"), mig_gpu("g1"), whole_gpu("w0"), whole_gpu("w1")]
    }

    fn mig(profile: &str, count: u32, id: &str, start_ms: i64, end_ms: i64) -> Booking {
        let spec = SliceSpec::Mig { profile: profile.into(), model: None };
        Booking { id: id.into(), spec, count, start_ms, end_ms }
    }
    #[test]
    fn a_preview_counts_to_its_limit_and_answers_the_asked_count() {
        // Ten empty H100s: seventy 1g slices, of which five are booked 10-20.
        let gpus: Vec<CalGpu> = (0..10).map(|i| mig_gpu(&format!("g{i}"))).collect();
        let cal = Calendar::new(catalog(), gpus, vec![], vec![mig("1g.10gb", 5, "a", 10, 20)]);
        let p = cal.prepare(0);
        // A few asked: counted up to 64, which means 64 or more.
        let (most, fits) = p.preview(&mig("1g.10gb", 2, "x", 15, 25));
        assert_eq!((most, fits.is_ok()), (PREVIEW_COUNT, true));
        assert_eq!(p.most_that_fit(&mig("1g.10gb", 2, "x", 15, 25)), 65);
        // More asked than the limit: counted up to the asked count, exactly.
        let (most, fits) = p.preview(&mig("1g.10gb", 66, "x", 15, 25));
        assert_eq!(most, 65);
        let short = fits.expect_err("66 do not fit");
        assert_eq!((short[0].booking.as_str(), short[0].wanted, short[0].placed), ("x", 66, 65));
        assert_eq!(p.preview(&mig("1g.10gb", 65, "x", 15, 25)), (65, Ok(())));
        // After the booked window every slice is free.
        assert_eq!(p.preview(&mig("1g.10gb", 70, "x", 20, 25)), (70, Ok(())));
    }
    #[test]
    fn a_full_window_refuses_and_a_later_one_fits() {
        // One H100: seven 1g slices. Five booked 10-20, three more 15-25 overlap them; 20-30 is free again.
        let cal = Calendar::new(catalog(), vec![mig_gpu("g")], vec![], vec![mig("1g.10gb", 5, "a", 10, 20)]);
        let short = cal.admit(&mig("1g.10gb", 3, "b", 15, 25), 0).expect_err("refused");
        assert_eq!(short[0].booking, "b");
        assert_eq!((short[0].wanted, short[0].placed), (3, 2));
        assert!(cal.admit(&mig("1g.10gb", 2, "b", 15, 25), 0).is_ok());
        assert!(cal.admit(&mig("1g.10gb", 7, "c", 20, 30), 0).is_ok());
    }

    #[test]
    fn allocations_count_until_their_known_end() {
        let hold =
            |start: u8, until_ms: Option<i64>| Hold { gpu: "g".into(), profile: "1g.10gb".into(), start, until_ms };
        let holds = vec![hold(0, Some(50)), hold(1, None)];
        let layout = (0..7).map(|s| ("1g.10gb".to_string(), s)).collect();
        let g = CalGpu { layout, ..mig_gpu("g") };
        let cal = Calendar::new(catalog(), vec![g], holds, vec![]);
        assert!(cal.admit(&mig("1g.10gb", 6, "x", 40, 60), 0).is_err());
        assert!(cal.admit(&mig("1g.10gb", 6, "x", 50, 60), 0).is_ok());
        assert!(cal.admit(&mig("1g.10gb", 7, "x", 50, 60), 0).is_err());
    }

    #[test]
    fn protection_names_the_reservation_an_allocation_would_starve() {
        let cal = Calendar::new(catalog(), vec![mig_gpu("g")], vec![], vec![mig("7g.80gb", 1, "big", 100, 200)]);
        let slice = |until_ms| vec![Hold { gpu: "g".into(), profile: "1g.10gb".into(), start: 0, until_ms }];
        assert_eq!(cal.protects(&slice(None), 0).expect_err("refused").booking, "big");
        assert_eq!(cal.protects(&slice(Some(150)), 0).expect_err("refused").start_ms, 100);
        assert!(cal.protects(&slice(Some(100)), 0).is_ok());
    }
    fn arb_booking(i: usize) -> impl Strategy<Value = Booking> {
        let profiles = prop::sample::select(vec!["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb", "1g.20gb"]);
        (profiles, 1u32..4, 0i64..20, 1i64..8, 0u8..6).prop_map(move |(p, count, start, len, kind)| {
            let spec = match kind {
                4 => SliceSpec::Timeslice { model: "H100-80GB".into(), replicas: 2 },
                5 => SliceSpec::Mps { model: "H100-80GB".into(), replicas: 2 },
                _ => SliceSpec::Mig { profile: p.into(), model: None },
            };
            Booking { id: format!("b{i:03}"), spec, count, start_ms: start * 10, end_ms: (start + len) * 10 }
        })
    }

    /// A step of a random history: book, cancel one, or place an allocation now.
    #[derive(Debug, Clone)]
    enum Step {
        Book(Booking),
        Cancel(usize),
        Hold(usize, Option<i64>),
    }

    fn arb_steps() -> impl Strategy<Value = Vec<Step>> {
        prop::collection::vec(
            prop_oneof![
                4 => (0usize..1000).prop_flat_map(arb_booking).prop_map(Step::Book),
                1 => (0usize..50).prop_map(Step::Cancel),
                2 => (0usize..7, prop::option::of(1i64..200)).prop_map(|(s, u)| Step::Hold(s, u)),
            ],
            1..25,
        )
    }

    /// What is held at `t` (holds and the simulation's placements) is a valid set on every GPU: each MIG GPU's
    /// instances form a valid layout (no two overlap, each at a legal start), each whole GPU is shared one way with
    /// distinct shares within its replicas, and no node has time-slicing beside MPS.
    fn valid_at(gpus: &[CalGpu], held: &[&Hold]) -> bool {
        let kinds = |node: &str| -> Vec<Sharing> {
            let on_node = |h: &&&Hold| gpus.iter().any(|g| g.id == h.gpu && g.node == node);
            held.iter().filter(on_node).filter_map(|h| Sharing::from_key(&h.profile)).collect()
        };
        let mixed = gpus.iter().any(|g| {
            let k = kinds(&g.node);
            k.iter().any(|a| k.iter().any(|b| a.clashes_with(*b)))
        });
        !mixed
            && gpus.iter().all(|g| {
                let on: Vec<&&Hold> = held.iter().filter(|h| h.gpu == g.id).collect();
                if g.mig {
                    let model = catalog().model(&g.model).expect("present");
                    let specs: Vec<crate::layout::InstanceSpec> = on
                        .iter()
                        .map(|h| crate::layout::InstanceSpec { profile: h.profile.clone(), start: Some(h.start) })
                        .collect();
                    crate::layout::validate(model, &specs).is_ok()
                } else {
                    let mut starts: Vec<u8> = on.iter().map(|h| h.start).collect();
                    let n = starts.len();
                    starts.sort_unstable();
                    starts.dedup();
                    let per = on.first().and_then(|h| Sharing::from_key(&h.profile)).map_or(1, |s| match s {
                        Sharing::Exclusive => 1,
                        Sharing::Timeslice { replicas } | Sharing::Mps { replicas } => replicas,
                    });
                    starts.len() == n && on.iter().all(|h| h.profile == on[0].profile && u32::from(h.start) < per)
                }
            })
    }

    /// 1g.10gb slices held `(GPU g0 or g1, start, until)`, each kept only if it is valid beside those before it.
    fn valid_holds(gpus: &[CalGpu], held: Vec<(usize, u8, Option<i64>)>) -> Vec<Hold> {
        let mut holds: Vec<Hold> = vec![];
        for (g, start, until_ms) in held {
            let h = Hold { gpu: format!("g{g}"), profile: "1g.10gb".into(), start, until_ms };
            let mut all: Vec<&Hold> = holds.iter().collect();
            all.push(&h);
            if valid_at(gpus, &all) {
                holds.push(h);
            }
        }
        holds
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

        /// Accepting and keeping each acceptance's slices (as the server keeps them) answers as a whole replay of the
        /// calendar with those kept slices, and the simulation kept is that replay's.
        #[test]
        fn accepting_and_keeping_matches_whole_replays_with_the_kept_slices(
            books in prop::collection::vec((0usize..1000).prop_flat_map(arb_booking), 1..30),
            held in prop::collection::vec((0usize..2, 0u8..7, prop::option::of(1i64..150)), 0..6),
        ) {
            let gpus = test_fleet();
            let holds = valid_holds(&gpus, held);
            let mut kept = Calendar::new(catalog(), gpus.clone(), holds.clone(), vec![]).prepare(0);
            // What the server stores after each acceptance: every reservation's slices, where and not until when.
            let mut stored: HashMap<String, Vec<Hold>> = HashMap::new();
            for b in books {
                if kept.calendar().bookings().iter().any(|x| x.id == b.id) {
                    continue;
                }
                let whole = kept.calendar().clone().with_booking(b.clone()).simulate(0, &[]);
                let fits = kept.fits(&b);
                prop_assert_eq!(fits.clone().err(), (!whole.short.is_empty()).then(|| whole.short.clone()));
                if fits.is_ok() {
                    // The calendar with `b` is recognised as this one with one reservation more (when it starts
                    // after the question's moment).
                    let with_b = kept.calendar().clone().with_booking(b.clone());
                    prop_assert_eq!(kept.one_more(&with_b, 0), (b.start_ms > 0).then_some(&b));
                    let mut reordered = with_b.clone();
                    reordered.bookings.reverse();
                    prop_assert_eq!(kept.one_more(&reordered, 0), (b.start_ms > 0).then_some(&b));
                    prop_assert_eq!(kept.one_more(kept.calendar(), 0), None);
                    kept.accept_and_keep(b).expect("fits");
                    prop_assert_eq!(kept.simulation(), whole.clone());
                    // The calendar read back with what was stored is the one kept (in another order): the server's
                    // cache answers for it.
                    for (id, slices) in kept.simulation().placed.into_iter().filter(|(_, s)| !s.is_empty()) {
                        stored.insert(id, slices.into_iter().map(|h| Hold { until_ms: None, ..h }).collect());
                    }
                    let mut read_back: Vec<Booking> = kept.calendar().bookings().to_vec();
                    read_back.reverse();
                    let read_back = Calendar::new(catalog(), gpus.clone(), holds.clone(), read_back).with_hints(stored.clone());
                    prop_assert!(kept.answers_for(&read_back, 0));
                    prop_assert_eq!(kept.simulation(), kept.calendar().simulate(0, &[]));
                }
            }
        }

        /// A prepared calendar replays only from a change's start and stops once the change's slices have ended:
        /// its admissions, simulations after accepting, previews' counts and protection answer exactly as whole
        /// replays do.
        #[test]
        fn prepared_answers_match_whole_replays(
            books in prop::collection::vec((0usize..1000).prop_flat_map(arb_booking), 1..30),
            held in prop::collection::vec((0usize..2, 0u8..7, prop::option::of(1i64..150)), 0..6),
            probe in (5000usize..6000).prop_flat_map(arb_booking),
            extra in (0u8..7, prop::option::of(1i64..200)),
            hinted in any::<bool>(),
        ) {
            let gpus = test_fleet();
            let holds = valid_holds(&gpus, held);
            let mut prepared = Calendar::new(catalog(), gpus.clone(), holds.clone(), vec![]).prepare(0);
            let mut accepted: Vec<Booking> = vec![];
            let mut hints: HashMap<String, Vec<Hold>> = HashMap::new();
            for b in books {
                if accepted.iter().any(|x| x.id == b.id) {
                    continue;
                }
                let whole = Calendar::new(catalog(), gpus.clone(), holds.clone(), accepted.clone())
                    .with_hints(hints.clone())
                    .with_booking(b.clone())
                    .simulate(0, &[]);
                let fits = prepared.fits(&b);
                prop_assert_eq!(fits.clone().err(), (!whole.short.is_empty()).then(|| whole.short.clone()));
                if fits.is_ok() {
                    prepared.accept(b.clone()).expect("fits");
                    accepted.push(b);
                    prop_assert_eq!(prepared.simulation(), whole.clone());
                    if hinted {
                        hints = whole.placed.into_iter().collect();
                        prepared = Calendar::new(catalog(), gpus.clone(), holds.clone(), accepted.clone())
                            .with_hints(hints.clone())
                            .prepare(0);
                    }
                }
            }
            let cal = Calendar::new(catalog(), gpus.clone(), holds.clone(), accepted.clone()).with_hints(hints.clone());
            // The same binary search over whole replays (the planner does not promise that fitting is monotone
            // in the count, so the search is compared step for step).
            let fits_whole = |n: u32| {
                cal.clone().with_booking(Booking { count: n, ..probe.clone() }).simulate(0, &[]).short.is_empty()
            };
            // The search's bound holds: one slice more than it does not fit (when it is below the fleet's capacity).
            let bound = prepared.search_bound(&probe);
            if bound < prepared.capacity(&probe.spec).min(1000) {
                prop_assert!(!fits_whole(bound + 1), "{} slices fit above the bound {}", bound + 1, bound);
            }
            let short_whole = |n: u32| {
                let short = cal.clone().with_booking(Booking { count: n, ..probe.clone() }).simulate(0, &[]).short;
                if short.is_empty() { Ok(()) } else { Err(short) }
            };
            let lo = search_most(0, bound, &probe.id, short_whole);
            prop_assert_eq!(prepared.most_that_fit(&probe), lo);
            let asked = Booking { count: 1 + lo % 3, ..probe.clone() };
            let (most, fits) = prepared.preview(&asked);
            let limited = bound.min(preview_limit(asked.count));
            prop_assert_eq!(most, search_most(asked.count, limited, &probe.id, short_whole));
            prop_assert_eq!(fits, short_whole(asked.count));
            prop_assert!(lo == 0 || fits_whole(lo));
            // Protection: the first reservation the extra slice leaves short that was not short before.
            let h = Hold { gpu: "g0".into(), profile: "1g.10gb".into(), start: extra.0, until_ms: extra.1 };
            let before = cal.simulate(0, &[]);
            let after = cal.simulate(0, std::slice::from_ref(&h));
            let expected = after.short.into_iter().find(|s| !before.short.iter().any(|b| b.booking == s.booking));
            prop_assert_eq!(prepared.protects(std::slice::from_ref(&h)).err(), expected);
        }

        /// A simulation prepared earlier answers for the same calendar later, when nothing happened in between
        /// (no hold ended, no reservation started or ended), exactly as one prepared then, for reservations
        /// starting after then and slices held from then: what the server's cache of prepared simulations relies
        /// on.
        #[test]
        fn a_quiet_prepared_simulation_answers_as_a_new_one(
            books in prop::collection::vec((0usize..1000).prop_flat_map(arb_booking), 1..20),
            held in prop::collection::vec((0usize..2, 0u8..7, prop::option::of(1i64..150)), 0..6),
            probe in (5000usize..6000).prop_flat_map(arb_booking),
            extra in (0u8..7, prop::option::of(1i64..200)),
            t0 in 0i64..120,
            wait in 0i64..40,
        ) {
            let gpus = test_fleet();
            let holds = valid_holds(&gpus, held);
            let mut cal = Calendar::new(catalog(), gpus.clone(), holds.clone(), vec![]);
            for b in books {
                if cal.bookings().iter().all(|x| x.id != b.id) && cal.admit(&b, 0).is_ok() {
                    cal = cal.with_booking(b);
                }
            }
            let t1 = t0 + wait;
            let early = cal.prepare(t0);
            prop_assert_eq!(early.answers_for(&cal, t1), cal.quiet_between(t0, t1));
            prop_assume!(cal.quiet_between(t0, t1));
            let late = cal.prepare(t1);
            let probe = Booking { start_ms: probe.start_ms.max(t1 + 1), end_ms: probe.end_ms.max(t1 + 11), ..probe };
            prop_assert_eq!(early.simulation(), late.simulation());
            prop_assert_eq!(early.fits(&probe), late.fits(&probe));
            prop_assert_eq!(early.most_that_fit(&probe), late.most_that_fit(&probe));
            let h = Hold { gpu: "g0".into(), profile: "1g.10gb".into(), start: extra.0, until_ms: extra.1.map(|u| u + t1) };
            prop_assert_eq!(early.protects(std::slice::from_ref(&h)), late.protects(std::slice::from_ref(&h)));
            // Another calendar (one more hold) is not answered for.
            let mut other = cal.clone();
            other.holds.push(Hold { gpu: "w0".into(), profile: "exclusive".into(), start: 0, until_ms: None });
            prop_assert!(!early.answers_for(&other, t1));
        }

        /// Replays random reservations, cancellations and allocations made now (a reservation only if admitted,
        /// an allocation only if it protects the accepted reservations), each calendar hinted with the last
        /// simulation's placements as the server keeps them: at every moment, every accepted reservation in its
        /// window has all its slices, and what is held then is valid on every GPU.
        #[test]
        fn accepted_reservations_never_over_commit(steps in arb_steps()) {
            let gpus = test_fleet();
            let mut bookings: Vec<Booking> = vec![];
            let mut holds: Vec<Hold> = vec![];
            let mut hints: HashMap<String, Vec<Hold>> = HashMap::new();
            for step in steps {
                let cal = Calendar::new(catalog(), gpus.clone(), holds.clone(), bookings.clone()).with_hints(hints.clone());
                match step {
                    Step::Book(b) => {
                        if bookings.iter().all(|x| x.id != b.id) && cal.admit(&b, 0).is_ok() {
                            bookings.push(b);
                        }
                    }
                    Step::Cancel(i) => {
                        if !bookings.is_empty() {
                            bookings.remove(i % bookings.len());
                        }
                    }
                    Step::Hold(start, until_ms) => {
                        // A 1g slice at `start` on g0, made now, when that unit is free now.
                        let h = Hold { gpu: "g0".into(), profile: "1g.10gb".into(), start: start as u8, until_ms };
                        let mut all: Vec<&Hold> = holds.iter().collect();
                        all.push(&h);
                        if valid_at(&gpus, &all) && cal.protects(std::slice::from_ref(&h), 0).is_ok() {
                            holds.push(h);
                        }
                    }
                }
                let cal = Calendar::new(catalog(), gpus.clone(), holds.clone(), bookings.clone()).with_hints(hints.clone());
                let sim = cal.simulate(0, &[]);
                prop_assert!(sim.short.is_empty(), "accepted set short: {:?}", sim.short);
                hints = sim.placed.clone().into_iter().collect();
                let mut moments: Vec<i64> = bookings.iter().flat_map(|b| [b.start_ms, b.end_ms - 1]).collect();
                moments.extend(holds.iter().filter_map(|h| h.until_ms));
                moments.push(0);
                for t in moments {
                    let mut at: Vec<&Hold> = holds.iter().filter(|h| h.at(t)).collect();
                    for b in bookings.iter().filter(|b| b.at(t)) {
                        prop_assert_eq!(sim.placed[&b.id].len() as u32, b.count);
                        at.extend(sim.placed[&b.id].iter());
                    }
                    prop_assert!(valid_at(&gpus, &at), "over-committed at {}", t);
                }
            }
        }
    }
}
