//! Scale benchmark: a fleet of 10,000 GPUs (1,250 nodes of 8), 100,000 slice requests and 30 days of telemetry in
//! every stored series, on SQLite and, when `TESSERA_TEST_POSTGRES_URL` is set, on PostgreSQL; then every GET of
//! the OpenAPI document a platform admin and a tenant member may call (what each portal page reads, and more), with
//! its default parameters, timed as p50/p95 over several calls, and the server's periodic work: the 15 s sweep, the
//! 10-minute efficiency sample and the idle sweep. Each goal is printed beside its measured value; `/healthz`,
//! measured in the same run, is the baseline.
//!
//! The history is written as the server would have written it (requests and their allocations through the store,
//! telemetry rows of every series by SQL, as the rollups of the same minutes, each allocation's hours kept by the
//! sweep's own code), and `whole-GPU` allocations on a
//! share of the fleet are active, so that a member's reads have something to find.
//!
//! `cargo bench -p tessera-server --bench scale` (`-- --quick` for 96 GPUs, 1,000 requests and 2 days: the check
//! CI runs on the unoptimised test build, that every route answers without a server error; `--gpus N`,
//! `--requests N`, `--days N`, `--active N`, `--calls N` to choose the size; `--keep` leaves the databases;
//! `--only A,B` times only the GETs whose path contains one of them).

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use reqwest::Client;
use serde_json::Value;
use tessera_core::quota::{ApprovalPolicy, Resource};
use tessera_core::request::SliceSpec;
use tessera_server::http::auth::new_token_secret;
use tessera_server::serve::{Settings, prepare, serve, sweep};
use tessera_server::services::auth::secrets::token_hash;
use tessera_server::services::requests::Ask;
use tessera_server::store::history::PastAllocation;
use tessera_server::store::{NewGpu, Role, Store};

/// The GPU models of the fleet, in turn.
const MODELS: [&str; 4] = ["H100-80GB", "A100-80GB", "H200-141GB", "A100-40GB"];
/// Tenants the requests are spread over.
const TENANTS: usize = 20;
/// What every portal page's API call should answer within, at p95 (the goal).
const PAGE_GOAL_MS: f64 = 300.0;
/// What the sweep and the efficiency sample should each finish within.
const SWEEP_GOAL_MS: f64 = 2_000.0;

#[derive(Debug, Clone, Copy)]
struct Size {
    gpus: usize,
    requests: usize,
    days: i64,
    active: usize,
    calls: usize,
}

fn arg(name: &str) -> Option<usize> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok())
}

/// A deterministic sequence for the seeding.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n.max(1)
    }
}

struct Seeded {
    admin: String,
    member: String,
    member_tenant: String,
    member_id: String,
    node_id: String,
    request_id: String,
}

async fn seed(store: &Store, state: &tessera_server::services::app::AppState, size: Size, admin: &str) -> Seeded {
    let started = Instant::now();
    let now = tessera_server::store::now_ms();
    let mut rng = Lcg(7);
    // Tenants with room for what they hold, auto-approved.
    let mut tenants = Vec::new();
    for k in 0..TENANTS {
        let policy = ApprovalPolicy { auto_approve: true, auto_approve_max_compute_slices: 1_000 };
        let t = store.create_tenant(&format!("team-{k:02}"), policy, "bench").await.unwrap();
        store.set_quotas(&t.id, &[(Resource::ComputeSlices, Some(10_000_000))], "bench", "bench").await.unwrap();
        tenants.push(t.id);
    }
    let member = store.create_user("member", false, "bench").await.unwrap();
    store.set_membership(&member.id, &tenants[0], Role::Member, "bench").await.unwrap();
    let member_token = new_token_secret();
    store.create_token(&member.id, "bench", &token_hash(&member_token), "bench").await.unwrap();
    // Nodes of 8 GPUs, every other node in MIG mode (no instances yet).
    let nodes = size.gpus.div_ceil(8);
    for n in 0..nodes {
        let gpus: Vec<NewGpu> = (0..8u32)
            .map(|i| NewGpu {
                index: i,
                uuid: format!("GPU-{n:08x}-0000-4000-8000-{i:012x}"),
                model: MODELS[(n + i as usize) % MODELS.len()].to_string(),
                mig_enabled: n % 2 == 0,
                layout: Vec::new(),
            })
            .collect();
        store.register_node(&format!("gpu-node-{n:05}"), &gpus, "bench").await.unwrap();
    }
    let fleet = store.nodes().await.unwrap();
    println!("- {} nodes, {} GPUs registered ({:.1?})", fleet.len(), fleet.len() * 8, started.elapsed());
    // Active whole GPUs, through the service an API call goes through, then activated as a node's status does.
    let t = Instant::now();
    let admin_user = store.user_by_name(tessera_server::services::auth::BOOTSTRAP_ADMIN).await.unwrap();
    let admin_principal = store.principal(&admin_user.id).await.unwrap();
    let mut request_id = String::new();
    for k in 0..size.active {
        let spec = SliceSpec::Exclusive { model: MODELS[k % MODELS.len()].to_string() };
        let ask = Ask {
            tenant: &tenants[k % TENANTS],
            spec: &spec,
            count: 1,
            reason: "bench",
            duration_s: None,
            priority: Default::default(),
        };
        let (r, _) = tessera_server::services::requests::create(state, &admin_principal, ask, None).await.unwrap();
        if request_id.is_empty() {
            request_id = r.id.clone();
        }
    }
    let uuids: std::collections::HashMap<&str, &str> =
        fleet.iter().flat_map(|n| n.gpus.iter().map(|g| (g.id.as_str(), g.uuid.as_str()))).collect();
    let live = store.live_allocations().await.unwrap();
    let found: Vec<(String, String)> =
        live.iter().filter_map(|a| Some((a.id.clone(), uuids.get(a.gpu_id.as_str())?.to_string()))).collect();
    store.activate_allocations(&found, "bench").await.unwrap();
    println!("- {} whole GPUs requested and active ({:.1?})", found.len(), t.elapsed());
    // The history: released requests of the last days, an allocation each.
    let t = Instant::now();
    let all_gpus: Vec<(&str, &str, &str)> =
        fleet.iter().flat_map(|n| n.gpus.iter().map(|g| (g.id.as_str(), g.uuid.as_str(), g.model.as_str()))).collect();
    let past_count = size.requests.saturating_sub(size.active);
    let span = size.days * 86_400_000;
    let mut past = Vec::with_capacity(5_000);
    for k in 0..past_count {
        let (gpu_id, uuid, model) = all_gpus[rng.next(all_gpus.len() as u64) as usize];
        let activated = now - 3_600_000 - rng.next(span as u64) as i64;
        // Up to two days, ending a minute before now at the latest: drawn within what is left, so that the
        // releases spread over the days as a fleet's do (cut at now, a sixth of them ended in the last hour).
        let room = (now - 60_000 - activated).clamp(60_001, 48 * 3_600_000);
        let held = 60_000 + rng.next((room - 60_000) as u64) as i64;
        past.push(PastAllocation {
            tenant_id: tenants[k % TENANTS].clone(),
            spec: SliceSpec::Exclusive { model: model.to_string() },
            reason: "bench history".into(),
            gpu_id: gpu_id.to_string(),
            profile: "exclusive".into(),
            start: 0,
            device_uuid: uuid.to_string(),
            activated_at_ms: activated,
            released_at_ms: (activated + held).min(now - 60_000).max(activated + 1),
        });
        if past.len() == 5_000 || k + 1 == past_count {
            store.record_history(&past, "bench").await.unwrap();
            past.clear();
        }
    }
    println!("- {past_count} released requests with their allocations ({:.1?})", t.elapsed());
    drop(fleet);
    Seeded {
        admin: admin.to_string(),
        member: member_token,
        member_tenant: tenants[0].clone(),
        member_id: member.id,
        node_id: String::new(),
        request_id,
    }
}

/// Telemetry of every GPU: each series' rows over its retention within `days`, as the server's rollups of the
/// same minutes would be (values vary by device and time).
async fn seed_telemetry(url: &str, size: Size) {
    let t = Instant::now();
    let now = tessera_server::store::now_ms();
    let mut total = 0u64;
    for (table, bucket_ms, keep_days) in [
        ("telemetry_minutes", 60_000i64, 2i64),
        ("telemetry_tenminutes", 600_000, 35),
        ("telemetry_hours", 3_600_000, 400),
    ] {
        let days = size.days.min(keep_days);
        let buckets = days * 86_400_000 / bucket_ms;
        let first = (now - days * 86_400_000) / bucket_ms * bucket_ms;
        let minutes = bucket_ms / 60_000;
        let sqlite = url.starts_with("sqlite:");
        let series = if sqlite {
            "WITH RECURSIVE m(j) AS (SELECT 0 UNION ALL SELECT j + 1 FROM m WHERE j < $1 - 1) "
        } else {
            ""
        };
        // Each device's rows one after another, in the primary key's order.
        let from = if sqlite {
            "FROM (SELECT uuid, node_id FROM gpus ORDER BY uuid) g, m"
        } else {
            "FROM (SELECT uuid, node_id FROM gpus ORDER BY uuid) g, generate_series(0, $1 - 1) AS m(j)"
        };
        let sql = format!(
            "{series}INSERT INTO {table} (device, minute_ms, node_id, gpu, profile, start, samples, util_avg, util_max, \
             mem_used_avg, mem_total, power_avg, temp_max, mem_used_max, minutes) \
             SELECT g.uuid, $2 + j * {bucket_ms}, g.node_id, g.uuid, NULL, NULL, {samples}, \
             (LENGTH(g.uuid) * 7 + j) % 100, 100, 1000, 81920, 300, 70, 2000, {minutes} {from}",
            samples = 60 * minutes
        );
        let took = Instant::now();
        macro_rules! run {
            ($pool:expr) => {{
                let pool = $pool;
                sqlx::query(&sql).bind(buckets).bind(first).execute(&pool).await.unwrap();
                pool.close().await;
            }};
        }
        if sqlite {
            // A page cache for the tens of millions of rows' indexes (the default 2 MB spilled and read back the
            // same pages: 30 days at 10,000 GPUs had not finished the 10-minute rows in 15 minutes).
            let options = <sqlx::sqlite::SqliteConnectOptions as std::str::FromStr>::from_str(url)
                .unwrap()
                .pragma("cache_size", "-4000000");
            run!(sqlx::SqlitePool::connect_with(options).await.unwrap());
        } else {
            run!(sqlx::PgPool::connect(url).await.unwrap());
        }
        let rows = buckets as u64 * size.gpus as u64;
        total += rows;
        println!("- {table}: {rows} rows, {days} days ({:.1?})", took.elapsed());
    }
    println!("- telemetry: {total} rows in all ({:.1?})", t.elapsed());
}

/// Every GET of the document that `scopes` allows, its path filled in, default parameters.
fn gets(document: &Value, scopes: &[&str], seeded: &Seeded) -> Vec<String> {
    let mut out = Vec::new();
    for (path, item) in document["paths"].as_object().unwrap() {
        let Some(op) = item.get("get") else { continue };
        let allowed: Vec<&str> = op["security"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|s| s.as_object().into_iter().flatten())
            .flat_map(|(_, v)| v.as_array().into_iter().flatten())
            .filter_map(Value::as_str)
            .collect();
        let stream = op["responses"]["200"]["content"].get("text/event-stream").is_some();
        if stream || !allowed.iter().any(|s| scopes.contains(s)) || path.contains("/agent/") {
            continue;
        }
        let mut filled = path
            .replace("/tenants/{id}", &format!("/tenants/{}", seeded.member_tenant))
            .replace("/requests/{id}", &format!("/requests/{}", seeded.request_id))
            .replace("/nodes/{id}", &format!("/nodes/{}", seeded.node_id))
            .replace("{user}", &seeded.member_id);
        while let Some(start) = filled.find('{') {
            let end = filled[start..].find('}').map_or(filled.len(), |e| start + e + 1);
            filled.replace_range(start..end, "0190f000-0000-7000-8000-000000000000");
        }
        out.push(filled);
    }
    // The portal's own reads where they differ from the defaults: the usage page's first rows (7 days), and the
    // overview's and tenant page's sums alone.
    let week_ago = tessera_server::store::now_ms() - 7 * 86_400_000;
    out.push(format!("/api/v1/usage?from={week_ago}&limit=25"));
    out.push("/api/v1/usage?limit=0".to_string());
    // `--only A,B`: the calls whose path contains one of them (to measure a few routes again at size).
    if let Some(only) = std::env::args().skip_while(|a| a != "--only").nth(1) {
        out.retain(|c| only.split(',').any(|o| c.contains(o)));
    }
    out
}

struct Timed {
    call: String,
    status: u16,
    bytes: usize,
    p50_ms: f64,
    p95_ms: f64,
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted
        .get(((sorted.len() as f64 * p).ceil() as usize).saturating_sub(1).min(sorted.len().saturating_sub(1)))
        .copied()
        .unwrap_or(0.0)
}

async fn time_calls(client: &Client, base: &str, token: &str, calls: &[String], n: usize) -> Vec<Timed> {
    let mut out = Vec::new();
    for call in calls {
        let mut took = Vec::new();
        let (mut status, mut bytes) = (0, 0);
        for _ in 0..n {
            let t = Instant::now();
            let r = client.get(format!("{base}{call}")).bearer_auth(token).send().await.unwrap();
            status = r.status().as_u16();
            bytes = r.bytes().await.unwrap().len();
            took.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        took.sort_by(f64::total_cmp);
        out.push(Timed { call: call.clone(), status, bytes, p50_ms: pct(&took, 0.5), p95_ms: pct(&took, 0.95) });
    }
    out
}

async fn run_backend(name: &str, url: String, size: Size) {
    println!("\n## {name}: {} GPUs, {} requests, {} days of telemetry\n", size.gpus, size.requests, size.days);
    let admin = new_token_secret();
    let settings = Settings {
        database_url: url.clone(),
        bootstrap_token: Some(admin.clone()),
        max_connections_per_address: Some(0),
        ..Settings::default()
    };
    let (state, _) = prepare(&settings).await.unwrap();
    let mut seeded = seed(&state.store, &state, size, &admin).await;
    // The partitions the server makes at start (PostgreSQL), so that the rows land where they will be kept.
    state.store.keep_telemetry(tessera_server::store::now_ms()).await.unwrap();
    seed_telemetry(&url, size).await;
    // Each allocation's hours, kept as the server's sweep keeps them as each hour ends.
    let t = Instant::now();
    let mut kept = tessera_server::services::use_hours::Kept::default();
    loop {
        let now = tessera_server::store::now_ms();
        let k = tessera_server::services::use_hours::keep(&state.store, now, Duration::from_secs(3600)).await.unwrap();
        (kept.hours, kept.rows) = (kept.hours + k.hours, kept.rows + k.rows);
        if k.behind == 0 {
            break;
        }
    }
    let with_use = (size.days * 24).min(i64::from(kept.hours)).max(1);
    println!(
        "- allocation hours: {} hours kept, {} rows ({:.1?}; {:.1} ms for each of the {with_use} hours with use: the \
         sweep's work as each hour ends)",
        kept.hours,
        kept.rows,
        t.elapsed(),
        t.elapsed().as_secs_f64() * 1000.0 / with_use as f64
    );
    // PostgreSQL's statistics of the history just written, as its autovacuum daemon gathers them within a minute of
    // such writes on a running server (a server with autovacuum off, as some test machines run, would plan every
    // join on the empty tables' estimates).
    if url.starts_with("postgres") {
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        sqlx::query("ANALYZE").execute(&pool).await.unwrap();
        pool.close().await;
    }
    // The quota standing's ended hours, worked out and kept as the server's sweep does when it first starts on a
    // database without them (30 days of requests and allocations, once); every standing after reads them.
    let t = Instant::now();
    tessera_server::services::governance::keep_hours(&state, tessera_server::store::now_ms()).await.unwrap();
    println!("- quota standing: 30 days of hours kept in {:.1?} (once, on a database without them)", t.elapsed());
    let nodes = state.store.nodes().await.unwrap();
    seeded.node_id = nodes[nodes.len() / 2].id.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let serving = state.clone();
    tokio::spawn(serve(serving, listener, std::future::pending()));
    let client = Client::builder().timeout(Duration::from_secs(120)).build().unwrap();
    let document: Value = serde_json::from_str(include_str!("../../openapi/openapi.json")).unwrap();

    let health = time_calls(&client, &base, &admin, &["/healthz".to_string()], size.calls.max(20)).await;
    println!("\nBaseline: `/healthz` p50 {:.2} ms, p95 {:.2} ms.\n", health[0].p50_ms, health[0].p95_ms);
    println!("| caller | GET | status | bytes | p50 ms | p95 ms | p95 / healthz |");
    println!("|---|---|---|---|---|---|---|");
    let mut over = Vec::new();
    let mut errors = Vec::new();
    let mut count = 0;
    for (caller, token, scopes) in [
        ("platform admin", seeded.admin.as_str(), &["platform-admin", "user", "tenant-member", "tenant-admin"][..]),
        ("tenant member", seeded.member.as_str(), &["user", "tenant-member"][..]),
    ] {
        let calls = gets(&document, scopes, &seeded);
        let mut timed = time_calls(&client, &base, token, &calls, size.calls).await;
        timed.sort_by(|a, b| b.p95_ms.total_cmp(&a.p95_ms));
        for t in &timed {
            count += 1;
            println!(
                "| {caller} | `{}` | {} | {} | {:.1} | {:.1} | {:.0} |",
                t.call,
                t.status,
                t.bytes,
                t.p50_ms,
                t.p95_ms,
                t.p95_ms / health[0].p95_ms.max(1e-3)
            );
            if t.p95_ms > PAGE_GOAL_MS {
                over.push(format!("{caller} {} ({:.0} ms)", t.call, t.p95_ms));
            }
            if t.status >= 500 {
                errors.push(format!("{caller} {}: {}", t.call, t.status));
            }
        }
    }
    // The periodic work, as the server's loops run it.
    let times = |label: &'static str| (label, Vec::<f64>::new());
    let (mut sweeps, mut samples, mut idles) = (times("15 s sweep"), times("efficiency sample"), times("idle sweep"));
    let mut standing = times("quota standing's hours kept (hourly)");
    for _ in 0..3 {
        let now = tessera_server::store::now_ms();
        let t = Instant::now();
        sweep(&state, now, Duration::from_secs(3600)).await;
        sweeps.1.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = Instant::now();
        tessera_server::services::efficiency::record(&state, now).await.unwrap();
        samples.1.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = Instant::now();
        tessera_server::services::notifications::warn_idle(&state, now).await.unwrap();
        idles.1.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = Instant::now();
        tessera_server::services::governance::keep_hours(&state, now).await.unwrap();
        standing.1.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    println!("\n| periodic work | runs | max ms | goal |");
    println!("|---|---|---|---|");
    let mut slow_work = Vec::new();
    for (label, ms) in [sweeps, samples, idles, standing] {
        let max = ms.iter().copied().fold(0.0, f64::max);
        println!("| {label} | {} | {max:.0} | < {SWEEP_GOAL_MS:.0} ms |", ms.len());
        if max > SWEEP_GOAL_MS {
            slow_work.push(format!("{label} ({max:.0} ms)"));
        }
    }
    let verdict = |v: &[String]| if v.is_empty() { "met".to_string() } else { format!("MISSED: {}", v.join("; ")) };
    println!("\nGoals ({name}):");
    println!(
        "- every API call of the portal's pages and every other GET, p95 < {PAGE_GOAL_MS} ms ({count} calls): {}",
        verdict(&over)
    );
    println!(
        "- the sweep, the efficiency sample and the idle sweep each < {SWEEP_GOAL_MS} ms: {}",
        verdict(&slow_work)
    );
    assert!(errors.is_empty(), "server errors: {errors:?}");
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let full = Size { gpus: 10_000, requests: 100_000, days: 30, active: 4_000, calls: 20 };
    let small = Size { gpus: 96, requests: 1_000, days: 2, active: 24, calls: 1 };
    let base = if quick { small } else { full };
    let size = Size {
        gpus: arg("--gpus").unwrap_or(base.gpus),
        requests: arg("--requests").unwrap_or(base.requests),
        days: arg("--days").map_or(base.days, |d| d as i64),
        active: arg("--active").unwrap_or(base.active),
        calls: arg("--calls").unwrap_or(base.calls),
    };
    println!("# Tessera scale benchmark{}\n", if quick { " (quick)" } else { "" });
    if cfg!(debug_assertions) {
        println!("Unoptimised build (`--profile dev`): a check that every route answers, not figures to report.\n");
    }
    let file = std::env::temp_dir().join(format!("tessera-scale-{}.db", uuid::Uuid::now_v7().simple()));
    run_backend("sqlite", format!("sqlite://{}", file.display()), size).await;
    // `--keep` leaves the databases for a look at their query plans (docs/scale.md).
    let keep = std::env::args().any(|a| a == "--keep");
    if keep {
        println!("\n(kept: {})", file.display());
    } else {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
        }
    }
    if let Ok(admin_url) = std::env::var("TESSERA_TEST_POSTGRES_URL") {
        let pool = sqlx::PgPool::connect(&admin_url).await.unwrap();
        let name = format!("tessera_scale_{}", uuid::Uuid::now_v7().simple());
        sqlx::query(&format!("CREATE DATABASE {name}")).execute(&pool).await.unwrap();
        let url = match admin_url.rsplit_once('/') {
            Some((base, db)) if !db.contains('@') && !base.ends_with('/') => format!("{base}/{name}"),
            _ => format!("{admin_url}/{name}"),
        };
        run_backend("postgres", url, size).await;
        if keep {
            println!("(kept: database {name})");
        } else {
            let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).execute(&pool).await;
        }
    } else {
        println!("\n(PostgreSQL skipped: TESSERA_TEST_POSTGRES_URL is not set)");
    }
}
