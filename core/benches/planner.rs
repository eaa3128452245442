//! Planner benchmark: placement quality against what platform teams deploy today, against the exact optimum, and
//! planning time at fleet scale. Every figure is printed beside a baseline measured in the same run.
//!
//! `cargo bench -p tessera-core --bench planner` (add `-- --quick` for fewer seeds and repetitions).

#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::time::{Duration, Instant};

use tessera_core::catalog::Catalog;
use tessera_core::planner::baseline::{self, BaselineResult, StaticConfig};
use tessera_core::planner::optimum::optimum;
use tessera_core::planner::synth::{self, DemandSpec, FleetSpec, Rng};
use tessera_core::planner::{PlanInput, Problem, plan_problem};

const FLEET_MODELS: [&str; 5] = ["A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB", "A30-24GB"];

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let catalog = Catalog::builtin();
    println!("# Tessera planner benchmark{}", if quick { " (quick)" } else { "" });
    quality_vs_baselines(catalog, if quick { 2 } else { 5 });
    versus_optimum(catalog, if quick { 300 } else { 2000 });
    timing(catalog, if quick { 3 } else { 7 });
}

fn models() -> Vec<String> {
    FLEET_MODELS.iter().map(|m| m.to_string()).collect()
}

/// Sums of placed slices and GPUs touched over several seeds.
#[derive(Default, Clone, Copy)]
struct Tally {
    placed: u64,
    touched: u64,
}

impl Tally {
    fn add(&mut self, placed: u32, touched: u32) {
        self.placed += u64::from(placed);
        self.touched += u64::from(touched);
    }
    fn add_baseline(&mut self, r: BaselineResult) {
        self.add(r.placed, r.gpus_touched);
    }
}

fn quality_vs_baselines(catalog: &Catalog, seeds: u64) {
    println!("\n## Demand placed and GPUs touched, 200 GPUs of {} ({seeds} seeds summed)", FLEET_MODELS.join(", "));
    println!(
        "Load: demanded compute slices / fleet compute slices. Static configs: every GPU without an instance in use"
    );
    println!("gets the mig-parted config; first-fit: request order, first GPU with room, first free allowed start.");
    println!();
    println!(
        "| fleet | load | demanded | planner placed | planner touched | all-1g placed | all-balanced placed | first-fit placed | first-fit touched | planner / all-1g | planner / all-balanced | planner / first-fit | touched vs first-fit |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (fleet_name, busy) in [("empty", 0.0), ("busy", 0.6)] {
        for requests in [100, 200, 300, 450] {
            let (mut planner, mut all1g, mut balanced, mut first_fit) =
                (Tally::default(), Tally::default(), Tally::default(), Tally::default());
            let mut demanded = 0u64;
            let (mut demand_compute, mut fleet_compute) = (0u64, 0u64);
            for seed in 0..seeds {
                let mut rng = Rng::new(1000 + seed);
                let fleet = FleetSpec { gpus: 200, models: models(), busy, in_use: 0.7, cordoned: 0.0 };
                let gpus = synth::fleet(catalog, &mut rng, &fleet);
                let spec = DemandSpec { requests, max_count: 3, constrained: 0.3 };
                let demand = synth::demand(catalog, &mut rng, &models(), &spec);
                let input = PlanInput { gpus, demand };
                let problem = Problem::new(catalog, &input).unwrap();
                demanded += u64::from(problem.demanded());
                demand_compute +=
                    problem.classes.iter().map(|c| u64::from(c.count) * u64::from(c.compute)).sum::<u64>();
                fleet_compute += problem.gpus.iter().map(|g| u64::from(g.model.compute_slices_total)).sum::<u64>();
                let plan = plan_problem(&problem);
                planner.add(plan.summary.placed, plan.summary.gpus_touched);
                all1g.add_baseline(baseline::static_config(&problem, StaticConfig::All1g));
                balanced.add_baseline(baseline::static_config(&problem, StaticConfig::AllBalanced));
                first_fit.add_baseline(baseline::first_fit(&problem));
            }
            let ratio = |a: u64, b: u64| if b == 0 { "-".to_string() } else { format!("{:.2}", a as f64 / b as f64) };
            let load = format!("{:.0}%", 100.0 * demand_compute as f64 / fleet_compute as f64);
            println!(
                "| {fleet_name} | {load} | {demanded} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                planner.placed,
                planner.touched,
                all1g.placed,
                balanced.placed,
                first_fit.placed,
                first_fit.touched,
                ratio(planner.placed, all1g.placed),
                ratio(planner.placed, balanced.placed),
                ratio(planner.placed, first_fit.placed),
                ratio(planner.touched, first_fit.touched),
            );
        }
    }
}

fn versus_optimum(catalog: &Catalog, n: u64) {
    println!("\n## Against the exact optimum, {n} small random problems (1-8 GPUs, 1-3 demand entries)");
    let (mut opt_placed, mut planner_placed, mut ff_placed) = (0u64, 0u64, 0u64);
    let (mut planner_equal, mut ff_equal, mut planner_touched_equal) = (0u64, 0u64, 0u64);
    for seed in 0..n {
        let input = synth::small_problem(catalog, 7_000_000 + seed);
        let problem = Problem::new(catalog, &input).unwrap();
        let best = optimum(&problem).unwrap();
        let plan = plan_problem(&problem);
        let ff = baseline::first_fit(&problem);
        opt_placed += u64::from(best.placed);
        planner_placed += u64::from(plan.summary.placed);
        ff_placed += u64::from(ff.placed);
        planner_equal += u64::from(plan.summary.placed == best.placed);
        planner_touched_equal +=
            u64::from(plan.summary.placed == best.placed && plan.summary.gpus_touched == best.gpus_touched);
        ff_equal += u64::from(ff.placed == best.placed);
    }
    let pct = |a: u64| 100.0 * a as f64 / n as f64;
    println!();
    println!("| | placed / optimum (sum) | problems at the optimum count | at the optimum count and GPUs touched |");
    println!("|---|---|---|---|");
    println!(
        "| planner | {:.4} | {planner_equal}/{n} ({:.2}%) | {planner_touched_equal}/{n} ({:.2}%) |",
        planner_placed as f64 / opt_placed as f64,
        pct(planner_equal),
        pct(planner_touched_equal)
    );
    println!(
        "| first-fit | {:.4} | {ff_equal}/{n} ({:.2}%) | - |",
        ff_placed as f64 / opt_placed as f64,
        pct(ff_equal)
    );
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn timing(catalog: &Catalog, reps: usize) {
    timing_at(catalog, 1_000, 5_000, reps, 50.0);
    timing_at(catalog, 10_000, 50_000, reps, 1_000.0);
}

/// Times the input check, the planner and first-fit on a fleet of `gpus` (60% busy) and `requests` requests.
fn timing_at(catalog: &Catalog, gpus: usize, requests: usize, reps: usize, target_ms: f64) {
    println!(
        "\n## Planning time, {} GPUs x {} requests (60% of GPUs busy), median of {reps} runs",
        thousands(gpus),
        thousands(requests)
    );
    let mut rng = Rng::new(42);
    let fleet = FleetSpec { gpus, models: models(), busy: 0.6, in_use: 0.6, cordoned: 0.02 };
    let gpus = synth::fleet(catalog, &mut rng, &fleet);
    let demand = synth::demand(catalog, &mut rng, &models(), &DemandSpec { requests, max_count: 2, constrained: 0.3 });
    let input = PlanInput { gpus, demand };
    let mut planner_times = Vec::new();
    let mut ff_times = Vec::new();
    let mut check_times = Vec::new();
    let mut summary = None;
    let mut first_fit = None;
    for _ in 0..reps {
        let t = Instant::now();
        let problem = Problem::new(catalog, &input).unwrap();
        check_times.push(t.elapsed());
        let t = Instant::now();
        let plan = plan_problem(&problem);
        planner_times.push(t.elapsed());
        summary = Some(plan.summary);
        let t = Instant::now();
        first_fit = Some(std::hint::black_box(baseline::first_fit(&problem)));
        ff_times.push(t.elapsed());
    }
    let (p, f, c) = (median(planner_times), median(ff_times), median(check_times));
    let s = summary.unwrap();
    let ff = first_fit.unwrap();
    println!();
    println!("| step | median | ratio to first-fit |");
    println!("|---|---|---|");
    println!("| input check (catalog lookup, layout validation) | {:.1} ms | {:.2} |", ms(c), ms(c) / ms(f));
    println!("| planner | {:.1} ms | {:.2} |", ms(p), ms(p) / ms(f));
    println!("| first-fit baseline | {:.1} ms | 1.00 |", ms(f));
    println!();
    println!(
        "planner: {} of {} slices placed, {} GPUs touched, {} free instances destroyed, {} stranded compute slices; first-fit: {} placed, {} GPUs touched; target < {target_ms:.0} ms: {}",
        s.placed,
        s.demanded,
        s.gpus_touched,
        s.destroyed,
        s.stranded_compute_slices,
        ff.placed,
        ff.gpus_touched,
        if ms(p) + ms(c) < target_ms { "met" } else { "MISSED" }
    );
}

/// `n` with thousands separated by commas.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (k, ch) in digits.chars().enumerate() {
        if k > 0 && (digits.len() - k).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
