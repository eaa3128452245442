//! What a tenant member's reads cost on a large history: the `tessera` binary on a database (SQLite, and
//! PostgreSQL when `TESSERA_TEST_POSTGRES_URL` is set) seeded with a
//! million telemetry minutes (and their rollups) of devices the member never held and 100,000 slice requests, 100,000 events and
//! 100,000 audit entries across ten tenants. Every GET in the OpenAPI document that a tenant's admin may call is called with its widest parameters;
//! each answers within [`CALL_BOUND`] and the server's memory peak stays within [`MEMORY_BOUND_KIB`] of where it
//! started, and 20 seven-day heatmaps at once leave `/healthz` answering within 50 ms at p99. A route added to the
//! document joins the walk by itself.

use std::time::{Duration, Instant};

use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use tessera_server::http::auth::new_token_secret;
use tessera_server::store::Role;

use crate::agents::{Server, free_port, sqlite_url};

/// The longest one answer may take (a debug build on a busy 2-core machine; an unscoped read of the seeded
/// history takes tens of seconds there).
const CALL_BOUND: Duration = Duration::from_secs(3);
/// How far the server's resident memory may grow past what it held before the walk (an unscoped heatmap of the
/// seeded history grew it by over 300 MiB).
const MEMORY_BOUND_KIB: u64 = 128 * 1024;
/// Devices and minutes of seeded telemetry: 100 × 10,000 = 1,000,000 rows.
const DEVICES: i64 = 100;
const MINUTES: i64 = 10_000;
/// Seeded events and audit entries, each.
const HISTORY: i64 = 100_000;

/// A line of `/proc/PID/status`, in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Seeds the history straight into the server's database (the running server reads it at once).
async fn seed(database_url: &str, tenants: &[String], now: i64) {
    let member_tenant = &tenants[0];
    let started = Instant::now();
    let first_minute = (now - MINUTES * 60_000) / 60_000 * 60_000;
    // The same rows on both backends: SQLite counts with a recursive query, PostgreSQL with generate_series.
    let (devices, minutes, history) = if database_url.starts_with("sqlite:") {
        (
            "WITH RECURSIVE d(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM d WHERE i < $1 - 1), \
             m(j) AS (SELECT 0 UNION ALL SELECT j + 1 FROM m WHERE j < $2 - 1)",
            "FROM d, m",
            "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < $1 - 1)",
        )
    } else {
        ("", "FROM generate_series(0, $1 - 1) AS d(i), generate_series(0, $2 - 1) AS m(j)", "")
    };
    let series = |from: &str| {
        if from.is_empty() { "FROM generate_series(0, $1 - 1) AS n(i)".to_string() } else { "FROM n".to_string() }
    };
    let history_from = series(history);
    let statements = [
        format!(
            "{devices} INSERT INTO telemetry_minutes (device, minute_ms, node_id, gpu, profile, start, samples, \
             util_avg, util_max, mem_used_avg, mem_total, power_avg, temp_max, mem_used_max) \
             SELECT 'GPU-seeded-' || i, $3 + j * 60000, 'seeded-node', 'GPU-seeded-' || i, NULL, NULL, 60, \
             (i * 7 + j) % 100, 100, 1000, 81920, 300, 70, 2000 {minutes}"
        ),
        // Ten tenants' events, one in ten of them the member's tenant's.
        format!(
            "{history} INSERT INTO events (id, type, tenant_id, subject, at_ms, data, webhook_id, dispatched) \
             SELECT 'seeded-' || i, 'request.created', CASE WHEN i % 10 = 0 THEN $2 ELSE 'other-' || (i % 10) END, \
             'request/seeded-' || i, $3 - i * 1000, '{{\"request_id\": \"seeded\"}}', NULL, 1 {history_from}"
        ),
        // Released requests, a tenth of them each tenant's.
        format!(
            "{history} INSERT INTO slice_requests (id, tenant_id, spec, count, state, reason, version, created_at_ms, \
             updated_at_ms) SELECT 'seeded-' || i, CASE i % 10 {}END, '{{\"mode\": \"mig\", \"profile\": \
             \"1g.10gb\"}}', 1, 'released', 'seeded', 4, $12 - i * 1000, $12 - i * 1000 + 500 {history_from}",
            (0..10).map(|k| format!("WHEN {k} THEN ${} ", k + 2)).collect::<String>()
        ),
        format!(
            "{history} INSERT INTO audit_log (at_ms, actor, action, object, before_json, after_json) \
             SELECT $2 - i * 1000, 'user:seeded', 'request.create', 'request/seeded-' || i, NULL, '{{}}' \
             {history_from}"
        ),
    ];
    macro_rules! run {
        ($pool:expr) => {{
            let pool = $pool;
            sqlx::query(&statements[0])
                .bind(DEVICES)
                .bind(MINUTES)
                .bind(first_minute)
                .execute(&pool)
                .await
                .expect("seed telemetry");
            // The rollups the server writes with each minute, made from the seeded minutes.
            for (table, ms) in [("telemetry_tenminutes", 600_000), ("telemetry_hours", 3_600_000)] {
                sqlx::query(&format!(
                    "INSERT INTO {table} (device, minute_ms, node_id, gpu, profile, start, samples, util_avg, \
                     util_max, mem_used_avg, mem_total, power_avg, temp_max, mem_used_max, minutes) \
                     SELECT device, minute_ms - (minute_ms % {ms}), MAX(node_id), MAX(gpu), MAX(profile), \
                     MAX(start), SUM(samples), SUM(util_avg * samples) / SUM(samples), MAX(util_max), \
                     SUM(mem_used_avg * samples) / SUM(samples), MAX(mem_total), SUM(power_avg * samples) \
                     / NULLIF(SUM(samples), 0), MAX(temp_max), MAX(mem_used_max), COUNT(*) FROM telemetry_minutes \
                     GROUP BY device, minute_ms - (minute_ms % {ms})"
                ))
                .execute(&pool)
                .await
                .expect("seed rollups");
            }
            sqlx::query(&statements[1])
                .bind(HISTORY)
                .bind(member_tenant)
                .bind(now)
                .execute(&pool)
                .await
                .expect("seed events");
            let mut requests = sqlx::query(&statements[2]).bind(HISTORY);
            for t in tenants {
                requests = requests.bind(t.as_str());
            }
            requests.bind(now).execute(&pool).await.expect("seed requests");
            sqlx::query(&statements[3]).bind(HISTORY).bind(now).execute(&pool).await.expect("seed audit");
            pool.close().await;
        }};
    }
    if database_url.starts_with("sqlite:") {
        run!(sqlx::SqlitePool::connect(database_url).await.expect("open the database"));
    } else {
        run!(sqlx::PgPool::connect(database_url).await.expect("open the database"));
    }
    eprintln!(
        "seeded {} telemetry rows and {} requests, events and audit entries in {:?}",
        DEVICES * MINUTES,
        3 * HISTORY,
        started.elapsed()
    );
}

/// The widest value of a query parameter, or `None` to leave it out.
fn widest(name: &str, schema: &Value, now: i64) -> Option<String> {
    let max = schema["maximum"].as_i64();
    match name {
        "from" | "from_ms" => Some("0".into()),
        "to" | "to_ms" => Some(now.to_string()),
        "limit" | "days" => Some(max.unwrap_or(1000).to_string()),
        _ => None,
    }
}

/// Every GET a tenant's admin may call with a JSON answer, with its path filled in and its widest parameters.
fn member_gets(document: &Value, tenant: &str, user: &str, now: i64) -> Vec<String> {
    let member_scopes = ["user", "tenant-member", "tenant-admin"];
    let mut out = Vec::new();
    for (path, item) in document["paths"].as_object().expect("paths") {
        let Some(op) = item.get("get") else { continue };
        let scopes: Vec<&str> = op["security"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|s| s.as_object().into_iter().flatten())
            .flat_map(|(_, v)| v.as_array().into_iter().flatten())
            .filter_map(Value::as_str)
            .collect();
        let event_stream = op["responses"]["200"]["content"].get("text/event-stream").is_some();
        if event_stream || !scopes.iter().any(|s| member_scopes.contains(s)) {
            continue;
        }
        let mut filled = path.replace("/tenants/{id}", &format!("/tenants/{tenant}")).replace("{user}", user);
        // Other objects' ids: one that does not exist (a lookup by id is bounded by its key).
        while let Some(start) = filled.find('{') {
            let end = filled[start..].find('}').map_or(filled.len(), |e| start + e + 1);
            filled.replace_range(start..end, "0190f000-0000-7000-8000-000000000000");
        }
        let query: Vec<String> = op["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["in"] == "query")
            .filter_map(|p| {
                let name = p["name"].as_str()?;
                widest(name, &p["schema"], now).map(|v| format!("{name}={v}"))
            })
            .collect();
        if !query.is_empty() {
            filled = format!("{filled}?{}", query.join("&"));
        }
        out.push(filled);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_get_a_member_may_call_is_bounded_by_its_answer_on_a_large_history() {
    bounded_on_a_large_history(&sqlite_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_get_a_member_may_call_is_bounded_by_its_answer_on_a_large_history_on_postgres() {
    let Some(db) = crate::harness::ScratchDb::create("the PostgreSQL cost test").await else { return };
    bounded_on_a_large_history(&db.url).await;
    db.drop().await;
}

async fn bounded_on_a_large_history(url: &str) {
    let url = url.to_string();
    let admin = new_token_secret();
    let server = Server::start(&url, free_port(), &admin).await;
    let (s, t) = server.call(reqwest::Method::POST, "/api/v1/tenants", Some(json!({"name": "vision"}))).await;
    assert_eq!(s, StatusCode::CREATED, "{t}");
    let tenant = t["id"].as_str().expect("id").to_string();
    let store = tessera_server::store::Store::connect(&url).await.expect("store");
    let (user, token) = crate::harness::user_with_token(&store, "lead", &[(&tenant, Role::TenantAdmin)]).await;
    store.close().await;
    let now = tessera_server::store::now_ms();
    let mut tenants = vec![tenant.clone()];
    for k in 1..10 {
        let (s, t) =
            server.call(reqwest::Method::POST, "/api/v1/tenants", Some(json!({"name": format!("other-{k}")}))).await;
        assert_eq!(s, StatusCode::CREATED, "{t}");
        tenants.push(t["id"].as_str().expect("id").to_string());
    }
    seed(&url, &tenants, now).await;

    let pid = server.pid();
    let client = Client::builder().timeout(Duration::from_secs(60)).build().expect("client");
    let document: Value =
        serde_json::from_str(include_str!("../../../openapi/openapi.json")).expect("the OpenAPI document");
    let mut calls = member_gets(&document, &tenant, &user, now);
    let week = now - 7 * 24 * 3600 * 1000;
    calls.push(format!("/api/v1/telemetry/heatmap?from={week}&to={now}"));
    calls.push(format!("/api/v1/telemetry/heatmap?from={}&to={now}&step=60", now - 3600 * 60_000));
    calls.push(format!("/api/v1/telemetry/heatmap?from={week}&to={now}&metric=temp"));
    assert!(calls.len() >= 30, "the walk found {} routes: {calls:?}", calls.len());
    let before = status_kib(pid, "VmRSS:");
    let mut slowest = (Duration::ZERO, String::new());
    for call in &calls {
        let t = Instant::now();
        let r = client.get(format!("{}{call}", server.base)).bearer_auth(&token).send().await.expect("send");
        let status = r.status();
        let body = r.bytes().await.expect("body");
        let took = t.elapsed();
        assert!(!status.is_server_error(), "{call}: {status} {}", String::from_utf8_lossy(&body));
        assert!(took < CALL_BOUND, "{call} took {took:?} ({status}, {} bytes)", body.len());
        if took > slowest.0 {
            slowest = (took, call.clone());
        }
    }
    let peak = status_kib(pid, "VmHWM:");
    eprintln!(
        "{} member GETs: slowest {:?} ({}); resident memory {} KiB before, peak {} KiB",
        calls.len(),
        slowest.0,
        slowest.1,
        before,
        peak
    );
    assert!(peak.saturating_sub(before) < MEMORY_BOUND_KIB, "memory grew from {before} KiB to a peak of {peak} KiB");

    // 20 seven-day heatmaps at once, while /healthz is asked every 10 ms.
    let heatmap = format!("{}/api/v1/telemetry/heatmap?from={week}&to={now}", server.base);
    let load = (0..20).map(|_| {
        let (client, heatmap, token) = (client.clone(), heatmap.clone(), token.clone());
        tokio::spawn(async move {
            let t = Instant::now();
            let r = client.get(&heatmap).bearer_auth(&token).send().await.expect("send");
            assert_eq!(r.status(), StatusCode::OK);
            r.bytes().await.expect("body");
            t.elapsed()
        })
    });
    let load: Vec<_> = load.collect();
    let mut health = Vec::new();
    let health_client = Client::builder().timeout(Duration::from_secs(5)).build().expect("client");
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(2) || !load.iter().all(|h| h.is_finished()) {
        let t = Instant::now();
        let r = health_client.get(format!("{}/healthz", server.base)).send().await.expect("healthz");
        assert_eq!(r.status(), StatusCode::OK);
        health.push(t.elapsed());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut longest = Duration::ZERO;
    for h in load {
        longest = longest.max(h.await.expect("heatmap"));
    }
    health.sort();
    let p99 = health[(health.len() * 99 / 100).min(health.len() - 1)];
    eprintln!("20 heatmaps at once: the longest took {longest:?}; /healthz p99 {p99:?} over {} calls", health.len());
    assert!(longest < CALL_BOUND * 2, "20 heatmaps at once: the longest took {longest:?}");
    assert!(p99 < Duration::from_millis(50), "/healthz p99 {p99:?} while 20 heatmaps ran");
}
