//! The `tessera` binary as people run it: default logging (no `TESSERA_LOG`), log lines written from the runtime's
//! worker threads while requests come in. Every request must be answered and `/healthz` must stay fast while
//! auto-approval, the agent handlers and the expiry sweeper write their lines.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::SinkExt;
use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use tessera_server::http::auth::new_token_secret;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::agents::{Server, SimAgent, free_port, gpu_id, sqlite_url, wait_for};

/// Polls `/healthz` every 100 ms until stopped; counts answers slower than `slow` or missing.
struct Prober {
    stop: Arc<AtomicBool>,
    worst_ms: Arc<AtomicU64>,
    failures: Arc<AtomicU64>,
    answered: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Prober {
    fn start(base: &str) -> Prober {
        let (stop, worst_ms, failures, answered) = Default::default();
        let (s, w, f, a): (Arc<AtomicBool>, Arc<AtomicU64>, Arc<AtomicU64>, Arc<AtomicU64>) =
            (Arc::clone(&stop), Arc::clone(&worst_ms), Arc::clone(&failures), Arc::clone(&answered));
        let client = Client::builder().timeout(Duration::from_secs(5)).build().expect("client");
        let url = format!("{base}/healthz");
        let task = tokio::spawn(async move {
            while !s.load(Ordering::SeqCst) {
                let started = Instant::now();
                match client.get(&url).send().await {
                    Ok(r) if r.status() == StatusCode::OK => {
                        a.fetch_add(1, Ordering::SeqCst);
                        w.fetch_max(started.elapsed().as_millis() as u64, Ordering::SeqCst);
                    }
                    _ => {
                        f.fetch_add(1, Ordering::SeqCst);
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Prober { stop, worst_ms, failures, answered, task }
    }

    async fn finish(self) -> (u64, u64, u64) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.task.await;
        (
            self.answered.load(Ordering::SeqCst),
            self.failures.load(Ordering::SeqCst),
            self.worst_ms.load(Ordering::SeqCst),
        )
    }
}

/// A call that must be answered within 10 s.
async fn answered(
    client: &Client,
    admin: &str,
    method: Method,
    url: String,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut r = client.request(method, &url).bearer_auth(admin);
    if let Some(b) = body {
        r = r.json(&b);
    }
    let r = r.send().await.unwrap_or_else(|e| panic!("{url} was not answered within 10 s: {e}"));
    let status = r.status();
    let text = r.text().await.expect("body");
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_default_logging_the_server_answers_while_its_workers_log() {
    let admin = new_token_secret();
    let log_path = std::env::temp_dir().join(format!("tessera-log-{}.txt", uuid::Uuid::now_v7().simple()));
    let log_file = std::fs::File::create(&log_path).expect("log file");
    let server = Server::start_logging(&sqlite_url(), free_port(), &admin, &[], log_file.into()).await;
    let base = server.base.clone();
    let client = Client::builder().timeout(Duration::from_secs(10)).build().expect("client");
    let prober = Prober::start(&base);

    // Auto-approval that cannot place (no GPU of that model anywhere): logged from a worker, five at once.
    let (s, tenant) = answered(
        &client,
        &admin,
        Method::POST,
        format!("{base}/api/v1/tenants"),
        Some(json!({"name": "logs", "auto_approve": true, "auto_approve_max_compute_slices": 7})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{tenant}");
    let tenant_id = tenant["id"].as_str().expect("tenant id").to_string();
    let unplaceable = json!({"tenant": tenant_id, "spec": {"mode": "mig", "profile": "1g.5gb", "model": "A100-40GB"},
        "count": 1, "reason": "nothing can hold this"});
    let calls = (0..5)
        .map(|_| answered(&client, &admin, Method::POST, format!("{base}/api/v1/requests"), Some(unplaceable.clone())));
    for (s, v) in futures_util::future::join_all(calls).await {
        assert_eq!(s, StatusCode::CREATED, "{v}");
        assert_eq!(v["state"], "pending", "{v}");
    }

    // An agent error: a node joins and sends its socket something unreadable; another reports a GPU model that
    // is not in the catalog.
    let (s, v) = answered(&client, &admin, Method::POST, format!("{base}/api/v1/join-tokens"), Some(json!({}))).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let inventory = json!({"hostname": "odd-node", "agent_version": "test", "backend": "sim", "gpus": [
        {"index": 0, "uuid": "GPU-11111111-2222-4333-8444-555555555555", "name": "NVIDIA Quantum Widget",
         "memory_mib": 1024, "mig_capable": false, "mig_enabled": false}]});
    let (s, joined) = answered(
        &client,
        &admin,
        Method::POST,
        format!("{base}/api/v1/agent/join"),
        Some(json!({"token": v["token"], "inventory": inventory})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{joined}");
    let credential = joined["credential"].as_str().expect("credential");
    let mut request = format!("ws://127.0.0.1:{}/api/v1/agent/ws", server.port).into_client_request().expect("url");
    request.headers_mut().insert("authorization", format!("Bearer {credential}").parse().expect("header"));
    let (mut socket, _) = tokio_tungstenite::connect_async(request).await.expect("websocket");
    socket.send(Message::Text("this is not an agent message".into())).await.expect("send");

    // An expiry: a one-minute request on a simulated agent's GPU turns active, then the sweeper expires it.
    let mut agent = SimAgent::new(&base, "logs-node", "H100-80GB:1", server.join_token(None).await);
    agent.start();
    let node = server.settled("logs-node").await;
    server.set_layout(&gpu_id(&node, 0), json!([{"profile": "1g.10gb", "start": 0}])).await;
    server.settled("logs-node").await;
    let (s, short) = answered(
        &client,
        &admin,
        Method::POST,
        format!("{base}/api/v1/requests"),
        Some(json!({"tenant": tenant_id, "spec": {"mode": "mig", "profile": "1g.10gb", "model": "H100-80GB"},
            "count": 1, "reason": "one minute", "duration_s": 60})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{short}");
    let id = short["id"].as_str().expect("id").to_string();
    let expired = wait_for(Duration::from_secs(120), || async {
        let (s, v) = answered(&client, &admin, Method::GET, format!("{base}/api/v1/requests/{id}"), None).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        (v["state"] == "expired").then_some(())
    })
    .await;
    assert!(expired.is_some(), "the one-minute request expired");

    let (probes, failures, worst_ms) = prober.finish().await;
    let _ = socket.close(None).await;
    drop(agent);
    let log = std::fs::read_to_string(&log_path).expect("log");
    let _ = std::fs::remove_file(&log_path);
    for line in [
        "auto-approval left the request pending",
        "unreadable agent message",
        "GPU model not in the catalog",
        "requests expired",
    ] {
        assert!(log.contains(line), "the server logged `{line}` with its default settings; its log:\n{log}");
    }
    eprintln!("/healthz: {probes} answers, {failures} failures, slowest {worst_ms} ms");
    assert!(probes > 100, "/healthz was probed throughout ({probes})");
    assert_eq!(failures, 0, "/healthz always answered");
    assert!(worst_ms < 2_000, "/healthz stayed fast (slowest {worst_ms} ms)");
}
