//! Reservation benchmark: the calendar's cost on a large fleet, measured the way the server spends it.
//!
//! `cargo bench -p tessera-core --bench reservations` (add `-- --quick` for a smaller run that CI uses to check that
//! it runs and that both paths agree; `-- --previews-only` stops before the admission of the offers).
//!
//! # Model
//! - **Fleet** (seeded): 1,000 GPUs, 8 per node: 900 in MIG mode (H100-80GB, A100-40GB, A100-80GB drawn
//!   uniformly) with random valid layouts of base profiles, 100 whole H100-80GB GPUs shared by time-slicing (8
//!   replicas).
//! - **Live allocations**: 5,000 of the fleet's instances and shares are held; 80 % end at a known time within the
//!   month (uniform), 20 % have no known end (held for ever, as the calendar counts them).
//! - **Reservations**: offered one after another, starting uniformly within the next 30 days, lasting 1 h to 3 days
//!   (log-uniform), 1-4 slices: 80 % a MIG profile of a named model (small profiles favoured, as in real queues), 10 %
//!   a MIG profile of any model, 10 % time-sliced shares. A reservation is accepted when [`Calendar::admit`] says it
//!   fits; the calendar is built that way up to 500 accepted reservations.
//! - **Preview**: what `POST /tenants/{id}/reservations/preview` asks of the calendar: the most slices of the spec
//!   that fit the window and whether the asked count fits ([`Prepared::preview`](tessera_core::reservation::Prepared::preview), one [`search_most`] of admissions).
//!   The calendar keeps each accepted reservation's slices from its last simulation, as the server keeps them.
//! - **Request preview**: what `POST /requests/preview` and approvals ask: whether a free slice held from now for ever
//!   leaves every accepted reservation its room ([`Prepared::protects`](tessera_core::reservation::Prepared::protects)).
//!
//! # Measures
//! - Preview latency (p50, p99) against 500 accepted reservations, with the prepared calendar (one simulation of the
//!   accepted reservations, then each probe replays only from the new window's start until the replay agrees with
//!   the prepared one again) against the baseline (each probe replays the whole future, as before), on the same
//!   previews; the two must give the same answers. Two prepared paths: simulated for each preview, and kept
//!   between previews as the server's cache keeps it while the calendar is unchanged (the time then includes
//!   comparing the calendar read with the kept one).
//! - Admission of 10,000 offered reservations over a month-long calendar, each admitted against everything accepted
//!   before it: total time and per-admission p50/p99, and the baseline's per-admission time on the first offers.

#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tessera_core::catalog::Catalog;
use tessera_core::layout::{Inst, Occupancy};
use tessera_core::planner::synth::Rng;
use tessera_core::request::SliceSpec;
use tessera_core::reservation::{Booking, CalGpu, Calendar, Hold, preview_limit, search_most};

const NOW: i64 = 1_800_000_000_000;
const HOUR: i64 = 3_600_000;
const DAY: i64 = 24 * HOUR;
const MIG_MODELS: [&str; 3] = ["H100-80GB", "A100-40GB", "A100-80GB"];
const SHARED_MODEL: &str = "H100-80GB";
const REPLICAS: u32 = 8;

struct Setup {
    gpus: usize,
    allocations: usize,
    accepted: usize,
    previews: usize,
    offers: usize,
    plain_offers: usize,
    baseline_offers: usize,
    baseline_previews: usize,
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let setup = if quick {
        Setup {
            gpus: 200,
            allocations: 1_000,
            accepted: 100,
            previews: 20,
            offers: 1_000,
            plain_offers: 1_000,
            baseline_offers: 100,
            baseline_previews: 20,
        }
    } else {
        Setup {
            gpus: 1_000,
            allocations: 5_000,
            accepted: 500,
            previews: 200,
            offers: 10_000,
            plain_offers: 1_000,
            baseline_offers: 300,
            baseline_previews: 30,
        }
    };
    let catalog = Catalog::builtin();
    let mut rng = Rng::new(7);
    let (gpus, holds) = fleet(catalog, &mut rng, &setup);
    let mig = gpus.iter().filter(|g| g.mig).count();
    let forever = holds.iter().filter(|h| h.until_ms.is_none()).count();
    println!("# Tessera reservation benchmark{}", if quick { " (quick)" } else { "" });
    println!(
        "Setup: {} GPUs ({mig} MIG, {} time-sliced x{REPLICAS}); {} live allocations ({forever} without a known end); \
         reservations 1 h - 3 d within 30 days, 1-4 slices.",
        gpus.len(),
        gpus.len() - mig,
        holds.len()
    );

    // The calendar of `setup.accepted` reservations, built by admission.
    // Admitted as the server admits (a prepared calendar; the property tests show it answers as whole replays).
    let mut accepted: Vec<Booking> = Vec::new();
    let mut offered = 0;
    let mut building = Calendar::new(catalog, gpus.clone(), holds.clone(), Vec::new()).prepare(NOW);
    while accepted.len() < setup.accepted {
        let b = offer(catalog, &mut rng, offered);
        offered += 1;
        if building.accept(b.clone()).is_ok() {
            accepted.push(b);
        }
        assert!(offered < setup.accepted * 20, "the fleet stopped accepting reservations");
    }
    drop(building);
    println!("Calendar: {} accepted of {offered} offered.", accepted.len());

    // Previews. The server keeps where the last simulation placed each accepted reservation (its kept slices,
    // written after every acceptance and every 15 s) and simulates with them as hints; so does the bench.
    let bare = Calendar::new(catalog, gpus.clone(), holds.clone(), accepted.clone());
    let hints: HashMap<String, Vec<Hold>> = bare
        .simulate(NOW, &[])
        .placed
        .into_iter()
        .filter(|(_, s)| !s.is_empty())
        .map(|(id, s)| (id, s.into_iter().map(|h| Hold { until_ms: None, ..h }).collect()))
        .collect();
    let cal = bare.with_hints(hints);
    let asks: Vec<Booking> = (0..setup.previews).map(|i| offer(catalog, &mut rng, 1_000_000 + i)).collect();
    let mut fast = Vec::new();
    let mut answers = Vec::new();
    for b in &asks {
        // As the server's preview: one simulation, the most that fit, and the asked count.
        let t = Instant::now();
        let prepared = cal.prepare(NOW);
        let (most, fits) = prepared.preview(b);
        let fits = fits.is_ok();
        fast.push(t.elapsed());
        answers.push((most, fits));
    }
    // As the server's preview when its cache holds the simulation (the calendar read again and found unchanged):
    // the calendars compared, the most that fit, and the asked count.
    let kept = cal.prepare(NOW);
    let mut cached = Vec::new();
    for (b, answer) in asks.iter().zip(&answers) {
        let read = cal.clone();
        let t = Instant::now();
        assert!(kept.answers_for(&read, NOW), "the kept simulation answers for the same calendar");
        let (most, fits) = kept.preview(b);
        let fits = fits.is_ok();
        cached.push(t.elapsed());
        assert_eq!((most, fits), *answer, "the kept simulation disagrees on {b:?}");
    }
    // The search the preview used before: halving from the bound (to the same limit), then the asked count.
    let mut halving = Vec::new();
    for (b, answer) in asks.iter().zip(&answers) {
        let t = Instant::now();
        let (mut lo, mut hi) = (0u32, kept.search_bound(b).min(preview_limit(b.count)));
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if kept.fits(&Booking { count: mid, ..b.clone() }).is_ok() { lo = mid } else { hi = mid - 1 }
        }
        let fits = kept.fits(b).is_ok();
        halving.push(t.elapsed());
        assert_eq!(fits, answer.1);
        if lo != answer.0 {
            eprintln!("halving found {lo} where the gallop found {} for {b:?}", answer.0);
        }
    }
    // Counting as far as the fleet allows (up to 1000), as the preview did before it counted to 64.
    let mut uncapped = Vec::new();
    for (b, answer) in asks.iter().zip(&answers) {
        let t = Instant::now();
        let most = kept.most_that_fit(b);
        let fits = kept.fits(b).is_ok();
        uncapped.push(t.elapsed());
        assert_eq!(fits, answer.1);
        if most < answer.0 {
            eprintln!("counting further found fewer: {most} < {} for {b:?}", answer.0);
        }
    }
    let mut slow = Vec::new();
    for (b, answer) in asks.iter().zip(&answers).take(setup.baseline_previews) {
        // The same search, from the same bound (what the window's start has room for).
        let bound = kept.search_bound(b).min(preview_limit(b.count));
        let t = Instant::now();
        let (most, fits) = baseline_preview(&cal, b, bound);
        slow.push(t.elapsed());
        assert_eq!((most, fits), *answer, "the prepared calendar and the full replay disagree on {b:?}");
    }
    let fits = answers.iter().filter(|a| a.1).count();
    println!();
    println!(
        "## Preview against {} accepted reservations ({} previews, {fits} fit; baseline on the first {})",
        accepted.len(),
        asks.len(),
        slow.len()
    );
    println!("| path | p50 | p99 | max |");
    println!("|---|---|---|---|");
    row("prepared calendar kept between previews (the server's cache)", &mut cached);
    row("prepared calendar, simulated for this preview", &mut fast);
    row("prepared calendar kept, searched by halving from the bound (the previous search)", &mut halving);
    row("prepared calendar kept, counting up to 1000 instead of 64", &mut uncapped);
    row("baseline: full replay per probe", &mut slow);
    let p50 = |d: &[Duration]| quantile(&mut d.to_vec(), 0.5).as_secs_f64();
    println!(
        "p50 speed-up over the baseline: {:.1}x simulated per preview, {:.0}x kept (target: p99 < 20 ms{})",
        p50(&slow) / p50(&fast),
        p50(&slow) / p50(&cached),
        if quick { "; quick mode is smaller" } else { "" }
    );

    // Request previews (`POST /requests/preview`) and approvals: whether slices placed now, held for ever (no
    // duration), leave every accepted reservation its room.
    let free_now = free_slices(&gpus, &holds, NOW);
    let before: Vec<String> = kept.simulation().short.into_iter().map(|s| s.booking).collect();
    let mut guard = Vec::new();
    let mut guard_slow = Vec::new();
    let mut refused = 0;
    for i in 0..setup.previews.min(free_now.len()) {
        let extra = vec![free_now[rng.below(free_now.len())].clone()];
        let read = cal.clone();
        let t = Instant::now();
        assert!(kept.answers_for(&read, NOW));
        let answer = kept.protects(&extra).err().map(|s| s.booking);
        guard.push(t.elapsed());
        refused += usize::from(answer.is_some());
        if i < setup.baseline_previews {
            let t = Instant::now();
            let full = cal.simulate(NOW, &extra).short.into_iter().map(|s| s.booking).find(|b| !before.contains(b));
            guard_slow.push(t.elapsed());
            assert_eq!(answer, full, "the prepared calendar and the full replay disagree on {extra:?}");
        }
    }
    println!();
    println!(
        "## Request preview: one free slice held from now for ever ({} previews, {refused} would leave a reservation \
         short; baseline on the first {})",
        guard.len(),
        guard_slow.len()
    );
    println!("| path | p50 | p99 | max |");
    println!("|---|---|---|---|");
    row("prepared calendar kept between previews (the server's cache)", &mut guard);
    row("baseline: full replay", &mut guard_slow);

    if std::env::args().any(|a| a == "--previews-only") {
        return;
    }
    // Admission of many offers over a month, as the server admits: each accepted reservation's slices are kept for
    // the replays that follow (`accept_and_keep`). The same offers without kept slices (`accept`, the previous
    // path) on the first `plain_offers`, and whole replays of the calendar with its kept slices on the first
    // `baseline_offers`, which must agree.
    let mut rng = Rng::new(11);
    let offers: Vec<Booking> = (0..setup.offers).map(|i| offer(catalog, &mut rng, 2_000_000 + i)).collect();
    let empty = Calendar::new(catalog, gpus.clone(), holds.clone(), Vec::new());
    let mut kept = empty.prepare(NOW);
    let mut plain = empty.prepare(NOW);
    let (mut times, mut plain_times, mut slow) = (Vec::new(), Vec::new(), Vec::new());
    let (mut taken, mut plain_taken) = (0, 0);
    for (i, b) in offers.iter().enumerate() {
        if i < setup.baseline_offers {
            let t = Instant::now();
            let full = baseline_admit(kept.calendar(), b);
            slow.push(t.elapsed());
            assert_eq!(kept.fits(b).is_ok(), full, "the prepared calendar and the full replay disagree on offer {i}");
        }
        let t = Instant::now();
        let ok = kept.accept_and_keep(b.clone()).is_ok();
        times.push(t.elapsed());
        taken += usize::from(ok);
        if i < setup.plain_offers {
            let t = Instant::now();
            plain_taken += usize::from(plain.accept(b.clone()).is_ok());
            plain_times.push(t.elapsed());
        }
        if !quick && (i + 1) % 1_000 == 0 {
            let spent: f64 = times.iter().map(Duration::as_secs_f64).sum();
            eprintln!("admission: {} offers, {taken} accepted, {spent:.1} s", i + 1);
        }
    }
    let total = |v: &[Duration]| v.iter().map(Duration::as_secs_f64).sum::<f64>();
    println!();
    println!(
        "## Admission of {} offers over 30 days ({taken} accepted with kept slices; without them {plain_taken} of the \
         first {}; whole replays on the first {})",
        offers.len(),
        plain_times.len(),
        slow.len()
    );
    println!(
        "Total {:.1} s with kept slices; the first {} offers: {:.1} s with kept slices, {:.1} s without ({:.1}x).",
        total(&times),
        plain_times.len(),
        total(&times[..plain_times.len()]),
        total(&plain_times),
        total(&plain_times) / total(&times[..plain_times.len()]).max(1e-9)
    );
    println!("| path | p50 | p99 | max |");
    println!("|---|---|---|---|");
    let mut first: Vec<Duration> = times[..slow.len()].to_vec();
    row(&format!("kept slices, first {}", slow.len()), &mut first);
    row("baseline: full replay with the kept slices, same offers", &mut slow);
    let mut first_plain: Vec<Duration> = times[..plain_times.len()].to_vec();
    row(&format!("kept slices, first {}", plain_times.len()), &mut first_plain);
    row(&format!("without kept slices, first {}", plain_times.len()), &mut plain_times);
    row(&format!("kept slices, all {}", times.len()), &mut times);
}

/// Admission as the calendar did it before it was prepared: the whole future replayed with `b` added.
fn baseline_admit(cal: &Calendar<'_>, b: &Booking) -> bool {
    cal.clone().with_booking(b.clone()).simulate(NOW, &[]).short.is_empty()
}

/// The preview's search, each probe a full replay: the most that fit, and whether the asked count does.
fn baseline_preview(cal: &Calendar<'_>, b: &Booking, bound: u32) -> (u32, bool) {
    let probe = |n: u32| {
        let short = cal.clone().with_booking(Booking { count: n, ..b.clone() }).simulate(NOW, &[]).short;
        if short.is_empty() { Ok(()) } else { Err(short) }
    };
    let mut asked = None;
    let most = search_most(b.count, bound, &b.id, |n| {
        let r = probe(n);
        if n == b.count {
            asked = Some(r.is_ok());
        }
        r
    });
    (most, asked.unwrap_or_else(|| probe(b.count).is_ok()))
}

fn row(name: &str, d: &mut [Duration]) {
    if d.is_empty() {
        return;
    }
    let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1e3);
    let max = *d.iter().max().unwrap();
    println!("| {name} | {} | {} | {} |", ms(quantile(d, 0.5)), ms(quantile(d, 0.99)), ms(max));
}

fn quantile(d: &mut [Duration], q: f64) -> Duration {
    d.sort();
    d[((d.len() as f64 - 1.0) * q).round() as usize]
}

/// The fleet and its live allocations.
fn fleet(catalog: &Catalog, rng: &mut Rng, setup: &Setup) -> (Vec<CalGpu>, Vec<Hold>) {
    let shared = setup.gpus / 10;
    let mut gpus = Vec::new();
    let mut candidates: Vec<Hold> = Vec::new();
    for i in 0..setup.gpus - shared {
        let model = catalog.model(MIG_MODELS[rng.below(MIG_MODELS.len())]).unwrap();
        let mut occ = Occupancy::EMPTY;
        let base: Vec<usize> = model.base_profiles().collect();
        let mut layout = Vec::new();
        for _ in 0..20 {
            // Small profiles favoured: layouts as busy fleets have them.
            let p = base[rng.below(base.len()).min(rng.below(base.len())).min(rng.below(base.len()))];
            let pls = &model.profiles[p].placements;
            let inst = Inst { profile: p, start: pls[rng.below(pls.len())].start };
            if occ.can_add(model, inst) {
                occ.add(model, inst);
                layout.push((model.profiles[p].name.clone(), inst.start));
            }
        }
        // The rest of the GPU in its smallest profile, as a fully laid-out fleet has it.
        let small = base[0];
        for pl in &model.profiles[small].placements {
            let inst = Inst { profile: small, start: pl.start };
            if occ.can_add(model, inst) {
                occ.add(model, inst);
                layout.push((model.profiles[small].name.clone(), inst.start));
            }
        }
        let id = format!("gpu-{i}");
        candidates.extend(layout.iter().map(|(p, s)| Hold {
            gpu: id.clone(),
            profile: p.clone(),
            start: *s,
            until_ms: None,
        }));
        gpus.push(CalGpu {
            id,
            node: format!("node-{}", i / 8),
            model: model.key.clone(),
            mig: true,
            cordoned: false,
            layout,
        });
    }
    for i in 0..shared {
        let id = format!("shared-{i}");
        for s in 0..REPLICAS {
            candidates.push(Hold {
                gpu: id.clone(),
                profile: format!("timeslice:{REPLICAS}"),
                start: s as u8,
                until_ms: None,
            });
        }
        let node = format!("shared-node-{}", i / 8);
        gpus.push(CalGpu { id, node, model: SHARED_MODEL.into(), mig: false, cordoned: false, layout: vec![] });
    }
    // Hold `allocations` of the candidates, chosen at random.
    for i in (1..candidates.len()).rev() {
        candidates.swap(i, rng.below(i + 1));
    }
    assert!(candidates.len() >= setup.allocations, "the fleet has {} slices", candidates.len());
    candidates.truncate(setup.allocations);
    for h in &mut candidates {
        h.until_ms = rng.chance(0.8).then(|| NOW + 1 + rng.below((30 * DAY) as usize) as i64);
    }
    (gpus, candidates)
}

/// A reservation to offer.
fn offer(catalog: &Catalog, rng: &mut Rng, i: usize) -> Booking {
    let start = NOW + 10 * 60_000 + rng.below((30 * DAY) as usize) as i64;
    // Log-uniform from 1 h to 3 days.
    let len = (HOUR as f64 * (72f64.ln() * (rng.below(1_000_000) as f64 / 1e6)).exp()) as i64;
    let count = 1 + rng.below(4) as u32;
    let roll = rng.below(10);
    let spec = if roll < 9 {
        let model = catalog.model(MIG_MODELS[rng.below(MIG_MODELS.len())]).unwrap();
        let base: Vec<usize> = model.base_profiles().collect();
        let p = base[rng.below(base.len()).min(rng.below(base.len()))];
        let named = roll < 8;
        SliceSpec::Mig { profile: model.profiles[p].name.clone(), model: named.then(|| model.key.clone()) }
    } else {
        SliceSpec::Timeslice { model: SHARED_MODEL.into(), replicas: REPLICAS }
    };
    Booking { id: format!("r{i:07}"), spec, count, start_ms: start, end_ms: start + len }
}

/// The instances of the fleet's layouts, and the shares of its whole GPUs, that nothing holds at `t`.
fn free_slices(gpus: &[CalGpu], holds: &[Hold], t: i64) -> Vec<Hold> {
    let held = |gpu: &str, profile: &str, start: u8| {
        holds.iter().any(|h| h.at(t) && h.gpu == gpu && h.profile == profile && h.start == start)
    };
    let mut out = Vec::new();
    for g in gpus {
        if g.mig {
            for (p, s) in &g.layout {
                if !held(&g.id, p, *s) {
                    out.push(Hold { gpu: g.id.clone(), profile: p.clone(), start: *s, until_ms: None });
                }
            }
        } else {
            let key = format!("timeslice:{REPLICAS}");
            for s in 0..REPLICAS as u8 {
                if !held(&g.id, &key, s) {
                    out.push(Hold { gpu: g.id.clone(), profile: key.clone(), start: s, until_ms: None });
                }
            }
        }
    }
    out
}
