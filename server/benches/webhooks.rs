//! Webhook delivery benchmark: events a second from commit to receiver, commit-to-delivery latency, and what
//! delivering costs request creation.
//!
//! `cargo bench -p tessera-server --bench webhooks` (`-- --quick`: a lower rate for 2 s, as CI runs it on the test
//! build to check that every event arrives). Server, receiver and clients run in this process on loopback, so they
//! share the machine's cores, as on a single small host. SQLite, and PostgreSQL too when
//! `TESSERA_TEST_POSTGRES_URL` is set.
//!
//! 1. **Delivery:** clients create requests on a fixed schedule (open loop) at `rate` a second for the measured
//!    time; each creation commits one `request.created` event in its transaction, and a platform endpoint receives
//!    every event (a receiver that answers 204 and notes when each subject arrived). Latency is the receiver's time
//!    minus the time the creating client got its `201` (the commit came before it); throughput is events received
//!    over the time from the first creation to the last arrival. Target: 1,000 events a second with p99 under 1 s.
//! 2. **Cost to creation:** request creation throughput (closed loop, 50 clients) with no endpoint (events are
//!    written, nobody receives them) and with the endpoint receiving everything, in the same run: the ratio.

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use reqwest::Client;
use serde_json::{Value, json};
use tessera_server::http::auth::new_token_secret;
use tessera_server::serve::{Settings, prepare, serve};

type Arrivals = Arc<Mutex<HashMap<String, Instant>>>;

/// A receiver on loopback: its URL and when each subject arrived.
async fn receiver() -> (String, Arrivals) {
    let arrivals: Arrivals = Arc::default();
    let seen = arrivals.clone();
    let app = Router::new().route(
        "/hook",
        post(move |body: axum::body::Bytes| {
            let seen = seen.clone();
            async move {
                let at = Instant::now();
                if let Ok(v) = serde_json::from_slice::<Value>(&body)
                    && let Some(subject) = v["subject"].as_str()
                {
                    seen.lock().unwrap().entry(subject.to_string()).or_insert(at);
                }
                StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, arrivals)
}

struct Server {
    base: String,
    admin: String,
    tenant: String,
    client: Client,
}

impl Server {
    async fn start(url: String) -> Server {
        let admin = new_token_secret();
        let settings = Settings {
            database_url: url,
            bootstrap_token: Some(admin.clone()),
            max_connections_per_address: Some(0),
            ..Settings::default()
        };
        let (state, _) = prepare(&settings).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(serve(state, listener, std::future::pending()));
        let client = Client::builder().pool_max_idle_per_host(600).build().unwrap();
        let t: Value = client
            .post(format!("{base}/api/v1/tenants"))
            .bearer_auth(&admin)
            .json(&json!({"name": "bench"}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        Server { base, admin, tenant: t["id"].as_str().unwrap().to_string(), client }
    }

    fn create(&self) -> reqwest::RequestBuilder {
        let body = json!({"tenant": self.tenant, "spec": {"mode": "mig", "profile": "1g.10gb", "model": "H100-80GB"},
                          "count": 1});
        self.client.post(format!("{}/api/v1/requests", self.base)).bearer_auth(&self.admin).json(&body)
    }

    async fn webhook(&self, url: &str) -> String {
        let r: Value = self
            .client
            .post(format!("{}/api/v1/webhooks", self.base))
            .bearer_auth(&self.admin)
            .json(&json!({"url": url}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        r["webhook"]["id"].as_str().unwrap().to_string()
    }

    async fn delete_webhook(&self, id: &str) {
        let r = self
            .client
            .delete(format!("{}/api/v1/webhooks/{id}", self.base))
            .bearer_auth(&self.admin)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
    }
}

/// Creates requests at `rate` a second for `secs`, from 50 clients on a fixed schedule: per request id, when its
/// `201` came back; and the time of the first send.
async fn paced_creations(server: &Arc<Server>, rate: u32, secs: f64) -> (HashMap<String, Instant>, Instant) {
    let clients = 50u32;
    let interval = Duration::from_secs_f64(f64::from(clients) / f64::from(rate));
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let server = server.clone();
            tokio::spawn(async move {
                let mut due = start + interval.mul_f64(f64::from(c) / f64::from(clients));
                let mut done = Vec::new();
                while due < deadline {
                    tokio::time::sleep_until(due.into()).await;
                    let r = server.create().send().await.unwrap();
                    assert_eq!(r.status(), StatusCode::CREATED);
                    let v: Value = r.json().await.unwrap();
                    done.push((v["id"].as_str().unwrap().to_string(), Instant::now()));
                    due += interval;
                }
                done
            })
        })
        .collect();
    let mut out = HashMap::new();
    for t in tasks {
        out.extend(t.await.unwrap());
    }
    (out, start)
}

/// Closed-loop creations with 50 clients for `secs`: creations a second.
async fn creation_rate(server: &Arc<Server>, secs: f64) -> f64 {
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let server = server.clone();
            tokio::spawn(async move {
                let mut n = 0u32;
                while Instant::now() < deadline {
                    if server.create().send().await.is_ok_and(|r| r.status() == StatusCode::CREATED) {
                        n += 1;
                    }
                }
                n
            })
        })
        .collect();
    let mut total = 0u32;
    for t in tasks {
        total += t.await.unwrap();
    }
    f64::from(total) / secs
}

fn pct(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

async fn run_backend(name: &str, url: String, rate: u32, secs: f64) {
    let server = Arc::new(Server::start(url).await);
    let (hook_url, arrivals) = receiver().await;
    // 2a. Creation with no endpoint.
    let without = creation_rate(&server, secs).await;
    // 1. Delivery at `rate`.
    let hook = server.webhook(&hook_url).await;
    arrivals.lock().unwrap().clear();
    let (created, start) = paced_creations(&server, rate, secs).await;
    let drain = Instant::now() + Duration::from_secs(60);
    while Instant::now() < drain {
        let all_in = {
            let seen = arrivals.lock().unwrap();
            created.keys().all(|id| seen.contains_key(&format!("request/{id}")))
        };
        if all_in {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seen = arrivals.lock().unwrap().clone();
    let mut lat: Vec<f64> = created
        .iter()
        .filter_map(|(id, at)| {
            seen.get(&format!("request/{id}")).map(|r| r.saturating_duration_since(*at).as_secs_f64())
        })
        .collect();
    lat.sort_by(f64::total_cmp);
    let missing = created.len() - lat.len();
    let last = created.keys().filter_map(|id| seen.get(&format!("request/{id}"))).max().copied().unwrap_or(start);
    let throughput = lat.len() as f64 / last.duration_since(start).as_secs_f64().max(1e-9);
    let (p50, p99, max) =
        if lat.is_empty() { (0.0, 0.0, 0.0) } else { (pct(&lat, 0.5), pct(&lat, 0.99), lat[lat.len() - 1]) };
    println!(
        "| {name} | delivery at {rate}/s offered | {} events, {missing} missing | {throughput:.0} events/s | {:.0} ms | {:.0} ms | {:.0} ms |",
        created.len(),
        p50 * 1e3,
        p99 * 1e3,
        max * 1e3
    );
    assert_eq!(missing, 0, "{missing} events never arrived");
    let met = throughput >= 0.95 * f64::from(rate) && p99 < 1.0;
    println!("|  | target {rate}/s with p99 < 1 s | {} |  |  |  |  |", if met { "met" } else { "MISSED" });
    // 2b. Creation while the endpoint receives everything.
    let with = creation_rate(&server, secs).await;
    println!(
        "| {name} | request creation, 50 clients | no endpoint {without:.0}/s; one endpoint receiving every event {with:.0}/s | ratio {:.2} |  |  |  |",
        with / without
    );
    server.delete_webhook(&hook).await;
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (rate, secs) = if quick { (200, 2.0) } else { (1_000, 10.0) };
    println!(
        "# Tessera webhook delivery benchmark ({secs} s per measurement, server, receiver and clients on this machine)\n"
    );
    if cfg!(debug_assertions) {
        println!("Unoptimised build (`--profile dev`): a check that every event arrives, not figures to report.\n");
    }
    println!("| backend | measure | events | throughput | p50 | p99 | max |");
    println!("|---|---|---|---|---|---|---|");
    let file = std::env::temp_dir().join(format!("tessera-webhooks-{}.db", uuid::Uuid::now_v7().simple()));
    run_backend("sqlite", format!("sqlite://{}", file.display()), rate, secs).await;
    if let Ok(admin_url) = std::env::var("TESSERA_TEST_POSTGRES_URL") {
        let pool = sqlx::PgPool::connect(&admin_url).await.unwrap();
        let name = format!("tessera_webhooks_{}", uuid::Uuid::now_v7().simple());
        sqlx::query(&format!("CREATE DATABASE {name}")).execute(&pool).await.unwrap();
        let url = match admin_url.rsplit_once('/') {
            Some((base, db)) if !db.contains('@') && !base.ends_with('/') => format!("{base}/{name}"),
            _ => format!("{admin_url}/{name}"),
        };
        run_backend("postgres", url, rate, secs).await;
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).execute(&pool).await;
    } else {
        println!("\n(PostgreSQL skipped: TESSERA_TEST_POSTGRES_URL is not set)");
    }
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
}
