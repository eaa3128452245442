//! Load benchmark of the REST API on loopback: throughput and p50/p99 latency of `GET /api/v1/requests` (one page
//! of 20 polled over and over, and a different page each call), a portal page rendered on the server (`GET /t/load`,
//! the tenant's page, 4 clients at most) and `POST /api/v1/requests` (quota-checked create)
//! at 50 and 500 concurrent clients, on SQLite and, when `TESSERA_TEST_POSTGRES_URL` is set, on PostgreSQL;
//! `/healthz` measured in the same run is the baseline.
//!
//! Closed loop (each client sends its next request when the last is answered) measures the most the server can
//! do; its latency is bounded below by clients / throughput (Little's law), whatever the server. Open loop (each
//! client sends on a fixed schedule, latency counted from when a request was due) measures latency at a given
//! load: 500 clients creating 4 requests a second each is 2,000 creations a second.
//!
//! `cargo bench -p tessera-server --bench load` (`-- --quick` for 1 s per measurement instead of 5 s, at 50 clients
//! only: the check CI runs on the unoptimised test build, where 500 clients' creations take minutes). The server
//! runs in this process, so server and clients share the machine's cores, as they would on a single small host.

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::{Client, Method};
use serde_json::{Value, json};
use tessera_server::http::auth::new_token_secret;
use tessera_server::serve::{Settings, prepare, serve};

struct Measured {
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: usize,
}

/// A way to build one request, shared by every client task.
type MakeRequest = Arc<dyn Fn() -> reqwest::RequestBuilder + Send + Sync>;

async fn measure(clients: usize, duration: Duration, make: MakeRequest) -> Measured {
    let deadline = Instant::now() + duration;
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let make = make.clone();
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut errors = 0;
                while Instant::now() < deadline {
                    let t = Instant::now();
                    match make().send().await {
                        Ok(r) if r.status().is_success() => {
                            let _ = r.bytes().await;
                            lat.push(t.elapsed());
                        }
                        _ => errors += 1,
                    }
                }
                (lat, errors)
            })
        })
        .collect();
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (lat, e) = t.await.unwrap();
        all.extend(lat);
        errors += e;
    }
    summarise(all, errors, duration)
}

/// Open loop: each of `clients` sends one request every `interval`, on schedule whether or not the last one has
/// been answered (so a slow server faces the same offered load instead of fewer requests). Latency is measured
/// from when each request was due, so time spent waiting behind a late request counts too.
async fn measure_open(clients: usize, duration: Duration, interval: Duration, make: MakeRequest) -> Measured {
    let start = tokio::time::Instant::now() + Duration::from_millis(50);
    let deadline = start + duration;
    let tasks: Vec<_> = (0..clients)
        .map(|i| {
            let make = make.clone();
            tokio::spawn(async move {
                // Clients start spread over one interval; each then keeps its own schedule.
                let mut due = start + interval.mul_f64(i as f64 / clients as f64);
                let mut sent = Vec::new();
                while due < deadline {
                    tokio::time::sleep_until(due).await;
                    let request = make();
                    let at = due;
                    sent.push(tokio::spawn(async move {
                        match request.send().await {
                            Ok(r) if r.status().is_success() => {
                                let _ = r.bytes().await;
                                Some((at.elapsed(), tokio::time::Instant::now()))
                            }
                            _ => None,
                        }
                    }));
                    due += interval;
                }
                let (mut lat, mut errors, mut last) = (Vec::new(), 0, start);
                for s in sent {
                    match s.await.ok().flatten() {
                        Some((l, done)) => {
                            lat.push(l);
                            last = last.max(done);
                        }
                        None => errors += 1,
                    }
                }
                (lat, errors, last)
            })
        })
        .collect();
    let (mut all, mut errors, mut last) = (Vec::new(), 0, start);
    for t in tasks {
        let (lat, e, done) = t.await.unwrap();
        all.extend(lat);
        errors += e;
        last = last.max(done);
    }
    // Throughput over the time it took to answer everything sent, so a server that falls behind shows less than
    // the offered rate.
    summarise(all, errors, last.duration_since(start).max(duration))
}

fn summarise(mut all: Vec<Duration>, errors: usize, duration: Duration) -> Measured {
    all.sort();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    Measured { rps: all.len() as f64 / duration.as_secs_f64(), p50_ms: pct(0.50), p99_ms: pct(0.99), errors }
}

async fn run_backend(name: &str, url: String, secs: u64, client_counts: &[usize]) {
    let admin = new_token_secret();
    let settings =
        // Every client connects from this host's one address; in use they come from many, so no per-address cap.
        Settings {
            database_url: url,
            bootstrap_token: Some(admin.clone()),
            demo: true,
            max_connections_per_address: Some(0),
            ..Settings::default()
        };
    let (state, _) = prepare(&settings).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(serve(state, listener, std::future::pending()));
    let client = Client::builder().pool_max_idle_per_host(600).build().unwrap();
    let tenant: Value = client
        .post(format!("{base}/api/v1/tenants"))
        .bearer_auth(&admin)
        .json(&json!({"name": "load"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let tenant = tenant["id"].as_str().unwrap().to_string();
    let body =
        json!({"tenant": tenant, "spec": {"mode": "mig", "profile": "1g.10gb", "model": "H100-80GB"}, "count": 1});
    let mut ids = Vec::new();
    for _ in 0..200 {
        let r: Value = client
            .post(format!("{base}/api/v1/requests"))
            .bearer_auth(&admin)
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        ids.push(r["id"].as_str().unwrap().to_string());
    }
    let ids = Arc::new(ids);
    let page = client.get(format!("{base}/t/load")).bearer_auth(&admin).send().await.unwrap();
    assert_eq!(page.status(), 200, "GET /t/load");
    let page = page.text().await.unwrap();
    assert!(page.contains(&ids[0][..8]) || page.contains("1g.10gb"), "the tenant page lists its requests: {page}");
    let duration = Duration::from_secs(secs);
    for &clients in client_counts {
        let (c, b) = (client.clone(), base.clone());
        let health = measure(clients, duration, Arc::new(move || c.request(Method::GET, format!("{b}/healthz")))).await;
        // The page a dashboard polls: the same query over and over, answered from the cache between writes.
        let (c, b, a, t) = (client.clone(), base.clone(), admin.clone(), tenant.clone());
        let list = measure(
            clients,
            duration,
            Arc::new(move || c.get(format!("{b}/api/v1/requests?tenant={t}&limit=20")).bearer_auth(&a)),
        )
        .await;
        // Every call a page not asked for recently (20,000 distinct cursor and size pairs in turn, more than the
        // cache keeps): what a read costs when it goes to the database.
        let (c, b, a, t, ids) = (client.clone(), base.clone(), admin.clone(), tenant.clone(), ids.clone());
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let uncached = measure(
            clients,
            duration,
            Arc::new(move || {
                let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let (cursor, limit) = (&ids[k % ids.len()], 1 + (k / ids.len()) % 100);
                c.get(format!("{b}/api/v1/requests?tenant={t}&limit={limit}&cursor={cursor}")).bearer_auth(&a)
            }),
        )
        .await;
        // A portal page rendered on the server (the tenant's page: its quotas and its 200 and more requests, read
        // through the API in process), as a browser's first load or a page without the wasm gets it.
        // People open pages, dashboards poll the API: PAGE_CLIENTS renders at a time keep both cores busy.
        let (c, b, a) = (client.clone(), base.clone(), admin.clone());
        let page_clients = clients.min(PAGE_CLIENTS);
        let page =
            measure(page_clients, duration, Arc::new(move || c.get(format!("{b}/t/load")).bearer_auth(&a))).await;
        let (c, b, a, body2) = (client.clone(), base.clone(), admin.clone(), body.clone());
        let create = measure(
            clients,
            duration,
            Arc::new(move || c.post(format!("{b}/api/v1/requests")).bearer_auth(&a).json(&body2)),
        )
        .await;
        let (c, b, a, body2) = (client.clone(), base.clone(), admin.clone(), body.clone());
        let paced = measure_open(
            clients,
            duration,
            PACE,
            Arc::new(move || c.post(format!("{b}/api/v1/requests")).bearer_auth(&a).json(&body2)),
        )
        .await;
        let page_op = format!("GET /t/load (the tenant's portal page, rendered; {page_clients} clients)");
        let paced_op = format!("POST /api/v1/requests, open loop, {} per client per s", 1000 / PACE.as_millis());
        for (op, m) in [
            ("GET /healthz", &health),
            ("GET /api/v1/requests (one page, polled)", &list),
            ("GET /api/v1/requests (a different page each call)", &uncached),
            (page_op.as_str(), &page),
            ("POST /api/v1/requests", &create),
            (paced_op.as_str(), &paced),
        ] {
            println!(
                "| {name} | {clients} | {op} | {:.0} | {:.2} | {:.2} | {:.2} | {} |",
                m.rps,
                m.p50_ms,
                m.p99_ms,
                m.rps / health.rps,
                m.errors
            );
        }
        let read_ok = list.rps >= 0.5 * health.rps;
        let target = if name == "sqlite" { 50.0 } else { 30.0 };
        let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
        if clients == 500 {
            println!(
                "|  |  | targets at 500 clients: polled reads >= 50% of /healthz: {}; create p99 < {target} ms: \
                 closed loop {}, open loop {} |  |  |  |  |  |",
                verdict(read_ok && list.errors == 0),
                verdict(create.p99_ms < target && create.errors == 0),
                verdict(paced.p99_ms < target && paced.errors == 0)
            );
        }
    }
}

/// At most this many clients load the portal page at once.
const PAGE_CLIENTS: usize = 4;

/// How often each open-loop client creates a request.
const PACE: Duration = Duration::from_millis(250);

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let secs = if quick { 1 } else { 5 };
    let client_counts: &[usize] = if quick { &[50] } else { &[50, 500] };
    println!("# Tessera API load benchmark ({secs} s per measurement, server and clients on this machine)\n");
    if cfg!(debug_assertions) {
        println!("Unoptimised build (`--profile dev`): a check that the benchmark runs, not figures to report.\n");
    }
    println!("| backend | clients | operation | req/s | p50 ms | p99 ms | throughput / healthz | errors |");
    println!("|---|---|---|---|---|---|---|---|");
    let file = std::env::temp_dir().join(format!("tessera-load-{}.db", uuid::Uuid::now_v7().simple()));
    run_backend("sqlite", format!("sqlite://{}", file.display()), secs, client_counts).await;
    if let Ok(admin_url) = std::env::var("TESSERA_TEST_POSTGRES_URL") {
        let pool = sqlx::PgPool::connect(&admin_url).await.unwrap();
        let name = format!("tessera_load_{}", uuid::Uuid::now_v7().simple());
        sqlx::query(&format!("CREATE DATABASE {name}")).execute(&pool).await.unwrap();
        let url = match admin_url.rsplit_once('/') {
            Some((base, db)) if !db.contains('@') && !base.ends_with('/') => format!("{base}/{name}"),
            _ => format!("{admin_url}/{name}"),
        };
        run_backend("postgres", url, secs, client_counts).await;
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).execute(&pool).await;
    } else {
        println!("\n(PostgreSQL skipped: TESSERA_TEST_POSTGRES_URL is not set)");
    }
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
}
