//! Telemetry and usage end to end: a simulated agent samples its GPU and MIG instances, sends gzip batches to the
//! `tessera` server process, and the samples show up in the live heatmap, the event stream, `/metrics` with tenant
//! labels, and usage metering; a tenant sees only its own devices; an agent cut off from the server buffers, drops
//! the oldest samples when its buffer is full, delivers the rest when the server is back, and reports the drops.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tessera_agent::telemetry::TelemetryConfig;
use tessera_server::http::auth::new_token_secret;
use tessera_server::store::{Role, Store};

use crate::agents::{Server, SimAgent, first_allocation_active, free_port, sqlite_url, wait_for};
use crate::harness::user_with_token;

pub(crate) fn fast(buffer: usize) -> Option<TelemetryConfig> {
    Some(TelemetryConfig {
        every: Duration::from_millis(250),
        batch_every: Duration::from_millis(500),
        offset: None,
        buffer,
        max_batch: 1000,
    })
}

/// A tenant with quota, and a 1g.10gb slice of it active on the agent's GPU; returns (tenant id, allocation).
pub(crate) async fn active_slice(server: &Server, tenant_name: &str) -> (String, Value) {
    let (_, tenant) = server.call(Method::POST, "/api/v1/tenants", Some(json!({ "name": tenant_name }))).await;
    let tenant = tenant["id"].as_str().expect("tenant").to_string();
    let (s, _) = server
        .call(Method::PUT, &format!("/api/v1/tenants/{tenant}/quotas"), Some(json!({"limits": {"compute_slices": 20}})))
        .await;
    assert_eq!(s, StatusCode::OK);
    let ask =
        json!({"tenant": tenant, "spec": {"mode": "mig", "profile": "1g.10gb", "model": "H100-80GB"}, "count": 1});
    let (s, request) = server.call(Method::POST, "/api/v1/requests", Some(ask)).await;
    assert_eq!(s, StatusCode::CREATED, "{request}");
    let id = request["id"].as_str().expect("id").to_string();
    let (s, approval) = server.call(Method::POST, &format!("/api/v1/requests/{id}/approve"), None).await;
    assert_eq!(s, StatusCode::OK, "{approval}");
    for proposal in approval["layout_proposals"].as_array().into_iter().flatten() {
        let pid = proposal["id"].as_str().expect("proposal");
        let (s, v) = server.call(Method::POST, &format!("/api/v1/layouts/{pid}/approve"), None).await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }
    let active = first_allocation_active(server, &tenant).await;
    (tenant, active)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn samples_reach_heatmaps_the_live_stream_metrics_and_usage_and_tenants_see_only_their_own() {
    let server = Server::start(&sqlite_url(), free_port(), &new_token_secret()).await;
    let mut agent = SimAgent::new(&server.base, "tele", "H100-80GB:1", server.join_token(None).await);
    agent.sim.lock().expect("sim").idle_percent = 0;
    agent.telemetry = fast(10_000);
    agent.start();
    server.settled("tele").await;
    let (tenant, allocation) = active_slice(&server, "vision").await;
    let device = allocation["device_uuid"].as_str().expect("device").to_string();
    let alloc_id = allocation["id"].as_str().expect("id").to_string();

    // The live heatmap: a row for the GPU and one for the instance, labelled with the allocation, with load.
    let map = wait_for(Duration::from_secs(20), || async {
        let (s, map) = server.call(Method::GET, "/api/v1/telemetry/heatmap?node=tele&step=1", None).await;
        assert_eq!(s, StatusCode::OK, "{map}");
        let row = map["rows"].as_array()?.iter().find(|r| r["device"] == device.as_str())?.clone();
        let busy = row["values"].as_array()?.iter().filter_map(Value::as_f64).filter(|v| *v > 0.0).count();
        (busy >= 3).then_some(map)
    })
    .await
    .expect("the instance's samples show in the heatmap");
    assert_eq!(map["source"], "live");
    assert_eq!(map["step_ms"], 1000);
    assert_eq!(map["unit"], "%");
    let rows = map["rows"].as_array().expect("rows");
    assert_eq!(rows[0]["kind"], "gpu", "the GPU row comes first: {map}");
    assert_eq!(rows[0]["model"], "H100-80GB");
    let row = rows.iter().find(|r| r["device"] == device.as_str()).expect("instance row");
    assert_eq!(row["kind"], "mig");
    assert_eq!(row["profile"], "1g.10gb");
    assert_eq!(row["allocations"][0]["allocation"], alloc_id.as_str());
    assert_eq!(row["allocations"][0]["tenant"], "vision");
    assert_eq!(row["values"].as_array().map(Vec::len), map["columns"].as_u64().map(|c| c as usize));
    // The fleet page's "now": the GPU's own latest sample, fresh.
    let (s, nodes) = server.call(Method::GET, "/api/v1/nodes", None).await;
    assert_eq!(s, StatusCode::OK, "{nodes}");
    let gpu = nodes.as_array().expect("nodes").iter().find(|n| n["name"] == "tele").expect("tele")["gpus"][0].clone();
    let now = &gpu["now"];
    let at = now["at_ms"].as_i64().expect("a sample time");
    assert!((tessera_server::store::now_ms() - at) < 60_000, "{gpu}");
    assert!(now["util_pct"].as_f64().is_some_and(|u| (0.0..=100.0).contains(&u)), "{gpu}");
    assert!(now["mem_total_mib"].as_f64().is_some_and(|m| m > 70_000.0), "an H100's 80 GB: {gpu}");
    assert!(now["mem_used_mib"].as_f64().is_some_and(|m| m >= 0.0), "{gpu}");
    let (s, mem) = server.call(Method::GET, "/api/v1/telemetry/heatmap?node=tele&metric=mem_pct&step=5", None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(mem["step_ms"], 5000);
    let pct: Vec<f64> =
        mem["rows"].as_array().expect("rows").iter().find(|r| r["device"] == device.as_str()).expect("row")["values"]
            .as_array()
            .expect("values")
            .iter()
            .filter_map(Value::as_f64)
            .collect();
    assert!(!pct.is_empty() && pct.iter().all(|v| (0.0..=100.0).contains(v)), "{pct:?}");

    // Bad queries get problems with stable codes.
    for (query, code) in [
        ("from=2000&to=1000", "heatmap_range"),
        ("step=0", "heatmap_step"),
        ("from=0&to=86400000000&step=60", "heatmap_too_large"),
        ("metric=fan", "invalid_query"),
    ] {
        let (s, v) = server.call(Method::GET, &format!("/api/v1/telemetry/heatmap?{query}"), None).await;
        assert!(s.is_client_error(), "{query}: {s}");
        assert_eq!(v["code"], code, "{query}: {v}");
    }
    let (s, v) = server.call(Method::GET, "/api/v1/telemetry/heatmap?node=nope", None).await;
    assert_eq!((s, v["code"].as_str()), (StatusCode::NOT_FOUND, Some("not_found")));

    // Prometheus exposition: DCGM names, the tenant and allocation on the instance's series.
    let r =
        server.client.get(format!("{}/metrics", server.base)).bearer_auth(&server.admin).send().await.expect("send");
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers()["content-type"].to_str().expect("type").starts_with("text/plain; version=0.0.4"));
    let text = r.text().await.expect("text");
    let line = text
        .lines()
        .find(|l| l.starts_with("DCGM_FI_PROF_GR_ENGINE_ACTIVE{") && l.contains(&device))
        .unwrap_or_else(|| panic!("no engine-active series for the instance:\n{text}"));
    assert!(line.contains("tenant=\"vision\"") && line.contains(&format!("allocation=\"{alloc_id}\"")), "{line}");
    assert!(line.contains("GPU_I_PROFILE=\"1g.10gb\"") && line.contains("Hostname=\"tele\""), "{line}");
    let ratio: f64 = line.split_whitespace().nth(1).expect("value").parse().expect("number");
    assert!((0.0..=1.0).contains(&ratio), "{line}");
    for name in ["DCGM_FI_DEV_GPU_UTIL{", "DCGM_FI_DEV_POWER_USAGE{", "DCGM_FI_DEV_GPU_TEMP{", "DCGM_FI_DEV_FB_FREE{"] {
        assert!(text.lines().any(|l| l.starts_with(name)), "no {name} in\n{text}");
    }
    let samples: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("tessera_telemetry_samples_total "))
        .and_then(|v| v.parse().ok())
        .expect("samples counter");
    assert!(samples > 0);

    // The live stream: an event with the newest samples.
    let r = server
        .client
        .get(format!("{}/api/v1/telemetry/live?node=tele", server.base))
        .bearer_auth(&server.admin)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::OK);
    let mut r = r;
    let mut seen = String::new();
    let got = tokio::time::timeout(Duration::from_secs(10), async {
        while let Ok(Some(chunk)) = r.chunk().await {
            seen.push_str(&String::from_utf8_lossy(&chunk));
            if seen.contains("event: samples") && seen.contains(&device) && seen.contains("\n\n") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(got, Ok(true), "{seen}");
    let data = seen.lines().find_map(|l| l.strip_prefix("data: ")).expect("data line");
    let events: Vec<Value> = serde_json::from_str(data).expect("json array");
    assert!(events.iter().all(|e| e["sample"]["t"].is_i64() && e["node_id"].is_string()), "{data}");

    // With `since`, the first event brings what came before the stream opened; then every second of the
    // instance arrives, none skipped. (The instance has been sampled for a few seconds first, so there is a
    // past to back-fill.)
    tokio::time::sleep(Duration::from_secs(3)).await;
    let opened = tessera_server::store::now_ms();
    let mut r = server
        .client
        .get(format!("{}/api/v1/telemetry/live?node=tele&since={}", server.base, opened - 4000))
        .bearer_auth(&server.admin)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::OK);
    let mut text = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(4), async {
        while let Ok(Some(chunk)) = r.chunk().await {
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await;
    let mut times: Vec<i64> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .flat_map(|d| serde_json::from_str::<Vec<Value>>(d).expect("json array"))
        .filter(|e| e["device"] == device.as_str())
        .map(|e| e["sample"]["t"].as_i64().expect("t"))
        .collect();
    assert!(times.windows(2).all(|w| w[0] < w[1]), "each sample once, in order: {times:?}");
    assert!(times.first().is_some_and(|&t| t < opened - 2000), "back-filled from `since`: {times:?} (opened {opened})");
    times.dedup_by_key(|t| *t / 1000);
    let seconds: Vec<i64> = times.iter().map(|t| t / 1000).collect();
    assert!(seconds.windows(2).all(|w| w[1] == w[0] + 1), "no second skipped: {seconds:?}");
    assert!(seconds.len() >= 6, "about 4 s back and 4 s live: {seconds:?}");
    let (s, v) = server.call(Method::GET, "/api/v1/telemetry/live?since=-5", None).await;
    assert_eq!((s, v["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_time")), "{v}");

    // Usage: slice-seconds of the 1g slice (weight 1) since it became active.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (s, usage) = server.call(Method::GET, &format!("/api/v1/usage?tenant={tenant}"), None).await;
    assert_eq!(s, StatusCode::OK, "{usage}");
    let row = &usage["allocations"][0];
    assert_eq!(row["allocation"], alloc_id.as_str());
    assert_eq!(row["weight"], 1.0);
    assert!(row["seconds"].as_f64().expect("seconds") >= 1.0, "{usage}");
    assert_eq!(row["slice_seconds"], row["seconds"]);
    assert_eq!(usage["tenants"][0]["tenant"], "vision");
    let (s, v) = server.call(Method::GET, "/api/v1/usage?from=10&to=5", None).await;
    assert_eq!((s, v["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("usage_range")));

    // Another tenant's member sees neither the devices nor the usage of this one.
    let store = Store::connect(&server.database_url).await.expect("store");
    let (_, other) = server.call(Method::POST, "/api/v1/tenants", Some(json!({"name": "other"}))).await;
    let other = other["id"].as_str().expect("id").to_string();
    let (_, secret) = user_with_token(&store, "outsider", &[(&other, Role::Member)]).await;
    let as_outsider = |path: &str| {
        let url = format!("{}{path}", server.base);
        let client = server.client.clone();
        let secret = secret.clone();
        async move {
            let r = client.get(url).bearer_auth(secret).send().await.expect("send");
            (r.status(), r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (s, map) = as_outsider("/api/v1/telemetry/heatmap").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(map["rows"], json!([]), "{map}");
    let (s, usage) = as_outsider("/api/v1/usage").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(usage["allocations"], json!([]));
    let (s, _) = as_outsider(&format!("/api/v1/usage?tenant={tenant}")).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = as_outsider("/metrics").await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    // The holder's tenant sees its instance, not the whole GPU.
    let (_, secret) = user_with_token(&store, "insider", &[(&tenant, Role::Member)]).await;
    let r = server
        .client
        .get(format!("{}/api/v1/telemetry/heatmap", server.base))
        .bearer_auth(&secret)
        .send()
        .await
        .expect("send");
    let map: Value = r.json().await.expect("json");
    let devices: Vec<&str> =
        map["rows"].as_array().expect("rows").iter().filter_map(|r| r["device"].as_str()).collect();
    assert_eq!(devices, [device.as_str()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_cut_off_buffers_drops_the_oldest_past_its_bound_and_delivers_the_rest() {
    let mut server = Server::start(&sqlite_url(), free_port(), &new_token_secret()).await;
    let mut agent = SimAgent::new(&server.base, "cut", "A100-40GB:1", server.join_token(None).await);
    // One GPU, 4 samples a second: a buffer of 16 holds 4 seconds.
    agent.telemetry = fast(16);
    agent.start();
    server.settled("cut").await;
    wait_for(Duration::from_secs(10), || async {
        let (_, map) = server.call(Method::GET, "/api/v1/telemetry/heatmap?node=cut&step=1", None).await;
        map["rows"].as_array().is_some_and(|r| !r.is_empty()).then_some(())
    })
    .await
    .expect("samples arrive");
    server.stop().await;
    let down_at = tessera_server::store::now_ms();
    tokio::time::sleep(Duration::from_secs(9)).await;
    server.restart().await;
    let back_at = tessera_server::store::now_ms();
    // Seconds sampled while the server was away: the oldest were dropped (the buffer holds 4 s), the newest are
    // delivered from the buffer once it is back.
    let from = down_at - down_at.rem_euclid(1000) + 1000;
    let map = wait_for(Duration::from_secs(15), || async {
        let (_, map) = server
            .call(Method::GET, &format!("/api/v1/telemetry/heatmap?node=cut&step=1&from={from}&to={back_at}"), None)
            .await;
        let values = map["rows"][0]["values"].as_array()?;
        let delivered = values.iter().take(values.len().saturating_sub(1)).any(|v| !v.is_null());
        delivered.then_some(map)
    })
    .await
    .expect("samples taken while the server was away are delivered");
    let values = map["rows"][0]["values"].as_array().expect("values");
    let lost = ((back_at - 5000 - from) / 1000).max(0) as usize;
    assert!(lost >= 2, "the server was away long enough ({lost})");
    assert!(values[..lost].iter().all(Value::is_null), "the oldest samples were dropped: {values:?}");
    let text = wait_for(Duration::from_secs(10), || async {
        let r = server.client.get(format!("{}/metrics", server.base)).bearer_auth(&server.admin).send().await.ok()?;
        let text = r.text().await.ok()?;
        let dropped: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix("tessera_telemetry_agent_dropped_samples{Hostname=\"cut\"} "))?
            .parse()
            .ok()?;
        (dropped >= 10).then_some(text)
    })
    .await;
    assert!(text.is_some(), "the agent reports what it dropped");
    server.stop().await;
}

/// A server whose floor is 2 s asks for it in every answer, and an agent that would batch every 500 ms sends a batch
/// about every 2 s instead, its samples still taken every 250 ms and all delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_sends_its_batches_no_more_often_than_the_server_asks() {
    use crate::hostile::{metric, metrics};
    let mut server = Server::start_with(
        &sqlite_url(),
        free_port(),
        &new_token_secret(),
        &[("TESSERA_TELEMETRY_BATCH_FLOOR_MS", "2000")],
    )
    .await;
    let mut agent = SimAgent::new(&server.base, "paced", "A100-40GB:1", server.join_token(None).await);
    agent.telemetry = fast(10_000);
    agent.start();
    server.settled("paced").await;
    let counts = |text: String| {
        (metric(&text, "tessera_telemetry_batches_total"), metric(&text, "tessera_telemetry_samples_total"))
    };
    wait_for(Duration::from_secs(10), || async { (counts(metrics(&server).await).0 >= 1.0).then_some(()) })
        .await
        .expect("a first batch");
    let text = metrics(&server).await;
    assert_eq!(metric(&text, "tessera_telemetry_batch_interval_seconds"), 2.0, "the floor, on time");
    let (b0, s0) = counts(text);
    tokio::time::sleep(Duration::from_secs(8)).await;
    let (b1, s1) = counts(metrics(&server).await);
    let (batches, samples) = (b1 - b0, s1 - s0);
    // 8 s at one batch every 2 s: 4 (give or take one at each end); at its own 500 ms it would have sent 16.
    assert!((3.0..=5.0).contains(&batches), "{batches} batches in 8 s");
    // 4 samples a second of one GPU, all delivered: 32, give or take a batch (8) at each end.
    assert!((24.0..=40.0).contains(&samples), "{samples} samples in 8 s");

    // The answer says so.
    let cred = std::fs::read_to_string(agent.dir.join("credential.json")).expect("credential");
    let cred: Value = serde_json::from_str(&cred).expect("json");
    let r = server
        .client
        .post(format!("{}/api/v1/agent/telemetry", server.base))
        .bearer_auth(cred["credential"].as_str().expect("credential"))
        .json(&json!({"devices": []}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::OK);
    let answer: Value = r.json().await.expect("json");
    assert_eq!(answer, json!({"accepted": 0, "rejected": 0, "next_batch_ms": 2000}));
    agent.kill();
    server.stop().await;
}
