//! A replica stopped the way Kubernetes, Docker and systemd stop it (SIGTERM), on both backends: `/readyz` fails at
//! once while requests are still served for the shutdown delay, agents' sockets close with 1012 (service restart)
//! and live streams end, long polls answer at once, the process exits 0 after writing the telemetry minutes it
//! held, and its agent is back once a replica serves again.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::Value;
use tessera_server::http::auth::new_token_secret;

use crate::agents::{Server, SimAgent, free_port, sqlite_url, wait_for};

/// What the test waits for after the signal: the delay the server is started with.
const DELAY: Duration = Duration::from_secs(3);

/// Whether samples of node `name` reach `server`'s live window within `limit`.
async fn live_samples(server: &Server, name: &str, limit: Duration) -> bool {
    let path = format!("/api/v1/telemetry/heatmap?node={name}&step=1");
    let found = wait_for(limit, || async {
        let (_, map) = server.call(Method::GET, &path, None).await;
        let values = map["rows"][0]["values"].as_array().cloned().unwrap_or_default();
        values.iter().any(|v| !v.is_null()).then_some(())
    })
    .await;
    found.is_some()
}

async fn sigterm_drains_then_exits_0_with_every_minute_written(url: &str) {
    let admin = new_token_secret();
    let port = free_port();
    let delay = DELAY.as_secs().to_string();
    let env = [("TESSERA_SHUTDOWN_DELAY_S", delay.as_str())];
    let mut server = Server::start_with(url, port, &admin, &env).await;
    let mut agent = SimAgent::new(&server.base, "stays", "H100-80GB:1", server.join_token(None).await);
    agent.telemetry = crate::telemetry::fast(10_000);
    agent.start();
    let node = server.settled("stays").await;
    let node_id = node["id"].as_str().expect("node id").to_string();
    // A node's socket to watch the close code on, a long poll in flight, and a live stream.
    let credential = crate::hostile::join_raw(&server, "watcher", "GPU-aaaaaaaa-0000-4000-8000-0000000000d1").await;
    let mut socket = crate::hostile::socket(&server, &credential).await;
    let (_, spec) = server.call(Method::GET, "/api/v1/nodes", None).await;
    let watcher = spec.as_array().into_iter().flatten().find(|n| n["name"] == "watcher").expect("watcher").clone();
    let generation = watcher["generation"].as_i64().expect("generation");
    let poll = server
        .client
        .get(format!("{}/api/v1/agent/spec?after={generation}&wait_s=60", server.base))
        .bearer_auth(&credential)
        .send();
    let poll = tokio::spawn(poll);
    let mut stream = server
        .client
        .get(format!("{}/api/v1/inbox/stream", server.base))
        .bearer_auth(&admin)
        .send()
        .await
        .expect("stream");
    assert_eq!(stream.status(), StatusCode::OK);
    assert!(stream.chunk().await.expect("read").is_some(), "the stream's first event");
    // The agent's samples reach the server.
    assert!(live_samples(&server, "stays", Duration::from_secs(10)).await, "the agent's telemetry arrives");

    server.terminate();
    let signalled = Instant::now();
    let signalled_ms = tessera_server::store::now_ms();
    let readyz = || async {
        let r = server.client.get(format!("{}/readyz", server.base)).send().await.ok()?;
        let status = r.status();
        Some((status, r.json::<Value>().await.unwrap_or_default()))
    };
    let failing = wait_for(Duration::from_secs(1), || async {
        readyz().await.filter(|(s, v)| *s == StatusCode::SERVICE_UNAVAILABLE && v["code"] == "shutting_down")
    })
    .await;
    assert!(failing.is_some(), "/readyz fails within a second of SIGTERM: {:?}", readyz().await);
    let (s, _) = server.call(Method::GET, "/healthz", None).await;
    assert_eq!(s, StatusCode::OK, "alive while it drains");
    let (s, nodes) = server.call(Method::GET, "/api/v1/nodes", None).await;
    assert_eq!(s, StatusCode::OK, "requests are served during the delay: {nodes}");
    let code = crate::hostile::closed_within(&mut socket, Duration::from_secs(2)).await;
    assert_eq!(code, Some(1012), "the agent's socket closes with 'service restart'");
    let polled = tokio::time::timeout(Duration::from_secs(2), poll).await.expect("the long poll answers at once");
    assert_eq!(polled.expect("task").expect("poll").status(), StatusCode::NO_CONTENT);
    let ended = tokio::time::timeout(Duration::from_secs(2), async { while let Ok(Some(_)) = stream.chunk().await {} });
    assert!(ended.await.is_ok(), "the live stream ends within 2 s");
    assert!(signalled.elapsed() < DELAY, "all of that within the delay");

    let exit = server.exited(DELAY + Duration::from_secs(20)).await.expect("the server exits");
    let took = signalled.elapsed();
    assert_eq!(exit.code(), Some(0), "{exit:?}");
    assert!(took >= DELAY, "the listener stayed open for the delay: exited after {took:?}");
    eprintln!("exited {took:?} after SIGTERM");

    // The minutes held in memory were written on the way out: the one of the last samples before the signal too.
    let store = tessera_server::store::Store::connect(url).await.expect("store");
    let minutes = store.minutes(Some(&node_id), signalled_ms - 600_000, signalled_ms + 60_000).await.expect("read");
    let last = minutes.iter().map(|m| m.minute_ms).max().expect("minutes written");
    let sampled_minute = (signalled_ms - 1_000) / 60_000 * 60_000;
    assert!(last >= sampled_minute, "the last minute written is {last}, the last sampled {sampled_minute}");
    store.close().await;

    // A replica serving again: the agent is back on its own.
    let restarted = Instant::now();
    let mut server = Server::start_with(url, port, &admin, &env).await;
    // The new process's live window holds only what reached it.
    let back = live_samples(&server, "stays", Duration::from_secs(15)).await;
    assert!(back, "the agent reconnects: {:?}", server.node("stays").await);
    eprintln!("agent back {:?} after the restart began", restarted.elapsed());
    agent.kill();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_drains_then_exits_0_with_every_minute_written_on_sqlite() {
    sigterm_drains_then_exits_0_with_every_minute_written(&sqlite_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_drains_then_exits_0_with_every_minute_written_on_postgres() {
    let Some(db) = crate::harness::ScratchDb::create("sigterm_drains_then_exits_0_on_postgres").await else {
        return;
    };
    sigterm_drains_then_exits_0_with_every_minute_written(&db.url).await;
    db.drop().await;
}
