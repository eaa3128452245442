//! The `tessera` process against hostile nodes and hostile clients: a node writing other nodes' telemetry or
//! flooding device names, a revoked node keeping its socket, slow clients holding connections, numbers that
//! overflow, oversized or misshapen bodies and look-alike names. Each test exceeds a bound and expects a clear
//! refusal.

use std::io::Write;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use tessera_server::http::auth::new_token_secret;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::agents::{Server, SimAgent, free_port, sqlite_url, wait_for};

const ATTACKER_GPU: &str = "GPU-aaaaaaaa-0000-4000-8000-000000000001";

/// A node that joins by hand (no agent): returns its credential.
pub(crate) async fn join_raw(server: &Server, name: &str, gpu_uuid: &str) -> String {
    let token = server.join_token(Some(name)).await;
    let inventory = json!({"hostname": name, "agent_version": "test", "backend": "sim", "gpus": [
        {"index": 0, "uuid": gpu_uuid, "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559,
         "mig_capable": true, "mig_enabled": true}]});
    let r = server
        .client
        .post(format!("{}/api/v1/agent/join", server.base))
        .json(&json!({"token": token, "inventory": inventory}))
        .send()
        .await
        .expect("join");
    assert_eq!(r.status(), StatusCode::CREATED);
    r.json::<Value>().await.expect("joined")["credential"].as_str().expect("credential").to_string()
}

async fn as_node(server: &Server, credential: &str, method: Method, path: &str, body: Value) -> (StatusCode, Value) {
    let r = server
        .client
        .request(method, format!("{}{path}", server.base))
        .bearer_auth(credential)
        .json(&body)
        .send()
        .await
        .expect("send");
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn sample(now: i64) -> Value {
    json!({"t": now, "util": 99.0, "mem_used_mib": 1.0, "mem_total_mib": 10.0})
}

pub(crate) async fn metrics(server: &Server) -> String {
    let r =
        server.client.get(format!("{}/metrics", server.base)).bearer_auth(&server.admin).send().await.expect("send");
    assert_eq!(r.status(), StatusCode::OK);
    r.text().await.expect("text")
}

pub(crate) fn metric(text: &str, line_start: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no `{line_start}` in\n{text}"))
}

/// Resident memory of a process, KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).map(str::to_string))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_cannot_write_telemetry_for_devices_it_does_not_own_nor_flood_device_names() {
    let server = Server::start(&sqlite_url(), free_port(), &new_token_secret()).await;
    let mut victim = SimAgent::new(&server.base, "victim", "H100-80GB:1", server.join_token(None).await);
    victim.sim.lock().expect("sim").idle_percent = 0;
    victim.telemetry = crate::telemetry::fast(10_000);
    victim.start();
    server.settled("victim").await;
    let (_, allocation) = crate::telemetry::active_slice(&server, "victims").await;
    let victim_mig = allocation["device_uuid"].as_str().expect("device").to_string();
    let victim_gpu = allocation["gpu_uuid"].as_str().expect("gpu").to_string();
    wait_for(Duration::from_secs(20), || async {
        metrics(&server)
            .await
            .lines()
            .any(|l| l.contains(&victim_mig) && l.contains("Hostname=\"victim\""))
            .then_some(())
    })
    .await
    .expect("the victim's instance is in /metrics");

    // The attacker claims the victim's MIG device in its own status, then sends samples for it under its own GPU,
    // under the victim's GPU, and for the victim's GPU itself.
    let attacker = join_raw(&server, "attacker", ATTACKER_GPU).await;
    let status = json!({"observed_generation": 0, "gpus": [{"uuid": ATTACKER_GPU, "mig_enabled": true,
        "instances": [{"profile": "1g.10gb", "start": 0, "uuid": victim_mig, "gi_id": 1, "ci_id": 0,
                       "device_name": "MIG 1g.10gb Device 0"}]}]});
    let (s, v) = as_node(&server, &attacker, Method::PUT, "/api/v1/agent/status", status).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let now = tessera_server::store::now_ms();
    let forged = json!({"dropped": 0, "devices": [
        {"device": victim_mig, "gpu": ATTACKER_GPU, "profile": "1g.10gb", "start": 0, "samples": [sample(now)]},
        {"device": victim_mig, "gpu": victim_gpu, "profile": "1g.10gb", "start": 0, "samples": [sample(now)]},
        {"device": victim_gpu, "gpu": victim_gpu, "samples": [sample(now)]},
        {"device": "MIG-made-up", "gpu": ATTACKER_GPU, "profile": "1g.10gb", "start": 0, "samples": [sample(now)]},
        {"device": ATTACKER_GPU, "gpu": ATTACKER_GPU, "samples": [sample(now)]}]});
    let (s, v) = as_node(&server, &attacker, Method::POST, "/api/v1/agent/telemetry", forged).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!((v["accepted"].as_u64(), v["rejected"].as_u64()), (Some(1), Some(4)), "only its own GPU: {v}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let text = metrics(&server).await;
    assert!(
        !text.lines().any(|l| l.contains(&victim_mig) && l.contains("Hostname=\"attacker\"")),
        "the victim's instance never shows under the attacker:\n{text}"
    );
    assert!(text.lines().any(|l| l.contains(&victim_mig) && l.contains("Hostname=\"victim\"")), "{text}");
    assert!(metric(&text, "tessera_telemetry_refused_series_total{reason=\"not_owned\"}") >= 4.0);
    // A drop count past 2^53 - 1 is refused, not exported.
    let (s, v) = as_node(
        &server,
        &attacker,
        Method::POST,
        "/api/v1/agent/telemetry",
        json!({"dropped": u64::MAX, "devices": []}),
    )
    .await;
    assert_eq!((s, v["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_body")), "{v}");

    // 100,000 made-up device names in one gzip batch: all refused, no series kept, memory flat.
    let pid = server.pid();
    let series_before = metric(&text, "tessera_telemetry_series ");
    let rss_before = rss_kib(pid);
    let devices: Vec<Value> = (0..100_000)
        .map(|i| {
            json!({"device": format!("MIG-flood-{i:08}"), "gpu": ATTACKER_GPU, "profile": "1g.10gb", "start": 0,
                        "samples": [sample(now)]})
        })
        .collect();
    let body = serde_json::to_vec(&json!({"dropped": 0, "devices": devices})).expect("json");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&body).expect("gzip");
    let gz = gz.finish().expect("gzip");
    let r = server
        .client
        .post(format!("{}/api/v1/agent/telemetry", server.base))
        .bearer_auth(&attacker)
        .header("content-type", "application/json")
        .header("content-encoding", "gzip")
        .body(gz.clone())
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::OK);
    let v: Value = r.json().await.expect("json");
    assert_eq!((v["accepted"].as_u64(), v["rejected"].as_u64()), (Some(0), Some(100_000)), "{v}");
    let rss_after = rss_kib(pid);
    let text = metrics(&server).await;
    assert_eq!(metric(&text, "tessera_telemetry_series "), series_before, "no series for names the node does not own");
    assert!(metric(&text, "tessera_telemetry_refused_series_total{reason=\"not_owned\"}") >= 100_004.0);
    eprintln!(
        "device flood: {} KiB gzip ({} KiB JSON), 100,000 names refused; server RSS {} MiB -> {} MiB",
        gz.len() / 1024,
        body.len() / 1024,
        rss_before / 1024,
        rss_after / 1024
    );
    assert!(rss_after < rss_before + 200 * 1024, "RSS {rss_before} KiB -> {rss_after} KiB");
    let (s, map) = (server.call(Method::GET, "/api/v1/telemetry/heatmap?step=60", None)).await;
    assert_eq!(s, StatusCode::OK);
    assert!(map["rows"].as_array().is_some_and(|rows| rows.len() <= 4), "only owned devices have rows: {map}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_cannot_send_a_gzip_bomb_or_an_oversized_status() {
    let server = Server::start(&sqlite_url(), free_port(), &new_token_secret()).await;
    let node = join_raw(&server, "bomber", ATTACKER_GPU).await;
    // 40 MiB of blanks compress to about 40 KiB: past the 32 MiB a batch may decompress to.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(b"{\"dropped\": 0, \"devices\": []").expect("gzip");
    for _ in 0..40 {
        gz.write_all(&vec![b' '; 1024 * 1024]).expect("gzip");
    }
    gz.write_all(b"}").expect("gzip");
    let bomb = gz.finish().expect("gzip");
    assert!(bomb.len() < 1024 * 1024, "{} bytes", bomb.len());
    let r = server
        .client
        .post(format!("{}/api/v1/agent/telemetry", server.base))
        .bearer_auth(&node)
        .header("content-type", "application/json")
        .header("content-encoding", "gzip")
        .body(bomb)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    assert_eq!(r.json::<Value>().await.expect("json")["code"], "batch_too_large");

    let instances: Vec<Value> = (0..17)
        .map(|i| {
            json!({"profile": "1g.10gb", "start": 0, "uuid": format!("MIG-{i}"), "gi_id": i, "ci_id": 0,
                        "device_name": "x"})
        })
        .collect();
    let status = json!({"observed_generation": 0, "gpus": [{"uuid": ATTACKER_GPU, "mig_enabled": true,
        "instances": instances}]});
    let (s, v) = as_node(&server, &node, Method::PUT, "/api/v1/agent/status", status).await;
    assert_eq!((s, v["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("too_many_instances")), "{v}");
    let long = json!({"observed_generation": 0, "gpus": [{"uuid": "G".repeat(97), "mig_enabled": false,
        "instances": []}]});
    let (s, v) = as_node(&server, &node, Method::PUT, "/api/v1/agent/status", long).await;
    assert_eq!((s, v["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_uuid")), "{v}");
}

/// Waits for the socket's close frame; returns its code.
pub(crate) async fn closed_within(
    socket: &mut tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    limit: Duration,
) -> Option<u16> {
    tokio::time::timeout(limit, async {
        while let Some(msg) = socket.next().await {
            match msg {
                Ok(Message::Close(frame)) => return Some(frame.map_or(1005, |f| u16::from(f.code))),
                Ok(_) => continue,
                Err(_) => return Some(1006),
            }
        }
        Some(1006)
    })
    .await
    .ok()
    .flatten()
}

pub(crate) async fn socket(
    server: &Server,
    credential: &str,
) -> tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>> {
    let mut request = format!("ws://127.0.0.1:{}/api/v1/agent/ws", server.port).into_client_request().expect("url");
    request.headers_mut().insert("authorization", format!("Bearer {credential}").parse().expect("header"));
    let (mut socket, _) = tokio_tungstenite::connect_async(request).await.expect("websocket");
    // The spec arrives first.
    let first = tokio::time::timeout(Duration::from_secs(5), socket.next()).await.expect("spec in time");
    assert!(matches!(first, Some(Ok(Message::Text(_)))), "{first:?}");
    socket
}

async fn revocation_closes_sockets(revoke_on: &Server, socket_on: &Server) {
    let credential = join_raw(socket_on, "revoked", ATTACKER_GPU).await;
    let mut ws = socket(socket_on, &credential).await;
    let node = socket_on.node("revoked").await.expect("node");
    let id = node["id"].as_str().expect("id");
    let (s, v) = revoke_on.call(Method::DELETE, &format!("/api/v1/nodes/{id}/credentials"), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let started = Instant::now();
    let code = closed_within(&mut ws, Duration::from_secs(3)).await;
    assert_eq!(code, Some(4401), "the socket closes at once with 4401");
    eprintln!("revoked node's socket closed after {:?}", started.elapsed());
    let (s, _) = as_node(socket_on, &credential, Method::POST, "/api/v1/agent/heartbeat", Value::Null).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "the revoked credential is refused at once");

    // Joining again under the same name replaces the credential: the old socket closes, the new one stays.
    let old = join_raw(socket_on, "rejoined", ATTACKER_GPU.replace("0001", "0002").as_str()).await;
    let mut old_ws = socket(socket_on, &old).await;
    let new = join_raw(revoke_on, "rejoined", ATTACKER_GPU.replace("0001", "0002").as_str()).await;
    assert_eq!(closed_within(&mut old_ws, Duration::from_secs(3)).await, Some(4401));
    let mut new_ws = socket(socket_on, &new).await;
    assert_eq!(
        closed_within(&mut new_ws, Duration::from_millis(1500)).await,
        None,
        "the new credential's socket stays"
    );

    // A token that names no node cannot take over an existing one by reporting its host name.
    let unnamed = revoke_on.join_token(None).await;
    let inventory = json!({"hostname": "rejoined", "agent_version": "test", "backend": "sim", "gpus": []});
    let r = revoke_on
        .client
        .post(format!("{}/api/v1/agent/join", revoke_on.base))
        .json(&json!({"token": unnamed, "inventory": inventory}))
        .send()
        .await
        .expect("join");
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert_eq!(r.json::<Value>().await.expect("json")["code"], "node_name_taken");
    assert_eq!(closed_within(&mut new_ws, Duration::from_millis(500)).await, None, "the node's socket is untouched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn revoking_a_node_credential_closes_its_sockets_at_once() {
    let server = Server::start(&sqlite_url(), free_port(), &new_token_secret()).await;
    revocation_closes_sockets(&server, &server).await;

    // A node holds at most four sockets.
    let credential = join_raw(&server, "greedy", "GPU-aaaaaaaa-0000-4000-8000-000000000003").await;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(socket(&server, &credential).await);
    }
    let r = server
        .client
        .get(format!("{}/api/v1/agent/ws", server.base))
        .bearer_auth(&credential)
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    assert_eq!(r.json::<Value>().await.expect("json")["code"], "too_many_sockets");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn revoking_on_one_replica_closes_the_socket_on_another() {
    let Some(db) = crate::harness::ScratchDb::create("the two-replica revocation test").await else { return };
    let url = db.url.clone();
    let admin = new_token_secret();
    let mut one = Server::start(&url, free_port(), &admin).await;
    let mut two = Server::start(&url, free_port(), &admin).await;
    revocation_closes_sockets(&two, &one).await;
    one.stop().await;
    two.stop().await;
    db.drop().await;
}

/// Opens a connection that sends half a request line and then nothing.
async fn slow_client(port: u16) -> tokio::net::TcpStream {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
    stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await.expect("write");
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_clients_are_cut_off_and_connections_past_the_cap_get_a_503() {
    let port = free_port();
    // No per-address caps here (as behind a proxy): this is the cap on every connection.
    let server = Server::start_with(
        &sqlite_url(),
        port,
        &new_token_secret(),
        &[("TESSERA_MAX_CONNECTIONS", "40"), ("TESSERA_MAX_CONNECTIONS_PER_ADDRESS", "0")],
    )
    .await;
    let mut slow = Vec::new();
    for _ in 0..40 {
        slow.push(slow_client(port).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Every place is held by a slow client: the next connection is told so, in a problem report.
    let mut extra = slow_client(port).await;
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(5), extra.read_to_string(&mut answer)).await.expect("answered").ok();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("application/problem+json") && answer.contains("too_many_connections"), "{answer}");

    // The server cuts the slow clients off after its header-read timeout (5 s), and serves again.
    let started = Instant::now();
    let mut cut = 0;
    for s in &mut slow {
        let mut buf = [0u8; 512];
        let left = Duration::from_secs(15).saturating_sub(started.elapsed());
        if let Ok(Ok(_)) = tokio::time::timeout(left, s.read(&mut buf)).await {
            cut += 1;
        }
    }
    eprintln!("40 slow clients cut off after {:?}", started.elapsed());
    assert_eq!(cut, 40, "every slow client was closed by the server");
    let client = Client::builder().timeout(Duration::from_secs(2)).build().expect("client");
    let t = Instant::now();
    let r = client.get(format!("{}/healthz", server.base)).send().await.expect("healthz answers");
    assert_eq!(r.status(), StatusCode::OK);
    assert!(t.elapsed() < Duration::from_secs(1));
}

/// Opens a connection from `from` (an address of the loopback range) that sends half a request line.
async fn slow_client_from(from: [u8; 4], port: u16) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.bind((std::net::Ipv4Addr::from(from), 0).into()).expect("bind");
    let mut stream = socket.connect(([127, 0, 0, 1], port).into()).await.expect("connect");
    stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await.expect("write");
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_address_cannot_fill_the_connection_cap_with_silent_sockets() {
    let port = free_port();
    // The default per-address cap: an eighth of 128 connections, at least 16 (open, and before their headers).
    let server =
        Server::start_with(&sqlite_url(), port, &new_token_secret(), &[("TESSERA_MAX_CONNECTIONS", "128")]).await;
    let mut silent = Vec::new();
    for _ in 0..16 {
        silent.push(slow_client_from([127, 0, 0, 2], port).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The address's next connection is refused at once, in a problem report.
    let mut extra = slow_client_from([127, 0, 0, 2], port).await;
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(5), extra.read_to_string(&mut answer)).await.expect("answered").ok();
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
    assert!(answer.contains("application/problem+json") && answer.contains("too_many_connections"), "{answer}");
    // Everybody else is served at once, however long the silent sockets stay.
    let client = Client::builder().timeout(Duration::from_secs(2)).build().expect("client");
    for _ in 0..20 {
        let t = Instant::now();
        let r = client.get(format!("{}/healthz", server.base)).send().await.expect("healthz answers");
        assert_eq!(r.status(), StatusCode::OK);
        assert!(t.elapsed() < Duration::from_millis(500), "{:?}", t.elapsed());
    }
    // The silent sockets are cut off after the header-read timeout (5 s): the address is served again.
    let started = Instant::now();
    for s in &mut silent {
        let mut buf = [0u8; 512];
        let left = Duration::from_secs(10).saturating_sub(started.elapsed());
        assert!(matches!(tokio::time::timeout(left, s.read(&mut buf)).await, Ok(Ok(_))), "closed by the server");
    }
    eprintln!("16 silent sockets of one address cut off after {:?}", started.elapsed());
    drop(silent);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut again = slow_client_from([127, 0, 0, 2], port).await;
    again.write_all(b"Connection: close\r\n\r\n").await.expect("finish the request");
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(5), again.read_to_string(&mut answer)).await.expect("answered").ok();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn numbers_bodies_reasons_and_names_past_their_bounds_are_clear_problems() {
    let server = Server::start(&sqlite_url(), free_port(), &new_token_secret()).await;
    let problem = |s: StatusCode, v: &Value| format!("{s} {v}");

    // Numeric query parameters that used to overflow.
    for (path, code) in [
        ("/api/v1/telemetry/heatmap?step=9223372036854774", "heatmap_step"),
        ("/api/v1/telemetry/heatmap?from=0&to=9223372036854775807", "invalid_time"),
        ("/api/v1/telemetry/heatmap?from=-9223372036854775808", "invalid_time"),
        ("/api/v1/usage?to=-9223372036854775808", "invalid_time"),
        ("/api/v1/usage?from=9223372036854775807", "invalid_time"),
        ("/api/v1/audit/entries?from=-1", "invalid_time"),
        ("/api/v1/calendar?from_ms=-1", "invalid_time"),
        ("/api/v1/calendar?from_ms=253402300800000", "invalid_time"),
        ("/api/v1/reservations?to_ms=-1", "invalid_time"),
        ("/api/v1/reservations?from_ms=9223372036854775807", "invalid_time"),
        ("/api/v1/requests?limit=4294967296", "invalid_query"),
    ] {
        let r =
            server.client.get(format!("{}{path}", server.base)).bearer_auth(&server.admin).send().await.expect("send");
        let status = r.status();
        assert_eq!(r.headers()["content-type"], "application/problem+json", "{path}");
        let v: Value = r.json().await.expect("json");
        assert!(status.is_client_error(), "{path}: {}", problem(status, &v));
        assert_eq!(v["code"], code, "{path}: {v}");
    }
    // A booking's window past the time bounds, in the booking and in its preview.
    for (start, end) in [(-1, 0), (0, 253_402_300_800_000i64), (i64::MIN, i64::MAX)] {
        for path in ["/api/v1/tenants/nobody/reservations", "/api/v1/tenants/nobody/reservations/preview"] {
            let body = json!({"spec": {"mode": "exclusive", "model": "H100-80GB"}, "count": 1, "start_ms": start, "end_ms": end});
            let (s, v) = server.call(Method::POST, path, Some(body)).await;
            assert_eq!((s, v["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_time")), "{path} {v}");
        }
    }
    let (s, v) = server.call(Method::GET, "/api/v1/telemetry/heatmap?from=0&to=253402300799999&step=60", None).await;
    assert_eq!((s, v["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("heatmap_too_large")), "{v}");

    // A body over 1 MiB: 413 problem+json, by its Content-Length or while it streams in chunks.
    let big = format!("{{\"name\": \"{}\"}}", "x".repeat(1024 * 1024 + 10));
    // The server answers from the Content-Length and closes without reading the body: a client still writing it
    // may see the connection closed before it reads the answer (a broken pipe). That is TCP timing, so the send is
    // tried again; the answer, once read, must be the 413.
    let mut answer = None;
    for _ in 0..5 {
        let sent = server
            .client
            .post(format!("{}/api/v1/tenants", server.base))
            .bearer_auth(&server.admin)
            .header("content-type", "application/json")
            .body(big.clone())
            .send()
            .await;
        match sent {
            Ok(r) => {
                answer = Some(r);
                break;
            }
            Err(e) if e.is_request() => eprintln!("the server closed while the body was sent ({e}); again"),
            Err(e) => panic!("send: {e}"),
        }
    }
    let r = answer.expect("one of five sends read the server's answer");
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    assert_eq!(r.json::<Value>().await.expect("json")["code"], "body_too_large");
    let mut raw = tokio::net::TcpStream::connect(("127.0.0.1", server.port)).await.expect("connect");
    let head = format!(
        "POST /api/v1/tenants HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
        server.admin
    );
    raw.write_all(head.as_bytes()).await.expect("head");
    for chunk in big.as_bytes().chunks(64 * 1024) {
        if raw.write_all(format!("{:x}\r\n", chunk.len()).as_bytes()).await.is_err()
            || raw.write_all(chunk).await.is_err()
            || raw.write_all(b"\r\n").await.is_err()
        {
            break;
        }
    }
    let _ = raw.write_all(b"0\r\n\r\n").await;
    let mut answer = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), raw.read_to_string(&mut answer)).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{}", &answer[..answer.len().min(400)]);
    assert!(answer.contains("application/problem+json") && answer.contains("body_too_large"), "{answer}");

    // A JSON array where an object is specified.
    let (s, v) = server.call(Method::POST, "/api/v1/join-tokens", Some(json!([null, null]))).await;
    assert_eq!((s, v["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_body")), "{v}");

    // A 500,000-character reason.
    let (_, tenant) = server.call(Method::POST, "/api/v1/tenants", Some(json!({"name": "bounds"}))).await;
    let ask = json!({"tenant": tenant["id"], "spec": {"mode": "mig", "profile": "1g.10gb", "model": "H100-80GB"},
        "count": 1, "reason": "r".repeat(500_000)});
    let (s, v) = server.call(Method::POST, "/api/v1/requests", Some(ask)).await;
    assert_eq!((s, v["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_reason")), "{v}");

    // User names with direction overrides or zero-width characters, and a case-only look-alike of `admin`.
    for name in ["ad\u{202E}nim", "ad\u{200B}min", "\u{2066}root"] {
        let (s, v) = server.call(Method::POST, "/api/v1/users", Some(json!({"name": name}))).await;
        assert_eq!((s, v["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_name")), "{name:?}: {v}");
    }
    let (s, v) = server.call(Method::POST, "/api/v1/users", Some(json!({"name": "ADMIN"}))).await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
}

fn content_type(r: &reqwest::Response) -> String {
    r.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string()
}

/// Sends `request` as it is on a fresh connection and reads the answer until the server closes it (at most 10 s).
async fn raw_exchange(port: u16, request: &[u8]) -> String {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
    stream.write_all(request).await.expect("write");
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// The problem reports in a raw answer: `(status line, content type, problem)` for each response in it.
fn raw_problems(answer: &str) -> Vec<(String, String, Value)> {
    let mut out = Vec::new();
    let mut rest = answer;
    while let Some((head, after)) = rest.split_once("\r\n\r\n") {
        let header = |name: &str| {
            head.lines()
                .find_map(|l| l.split_once(':').filter(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.trim()))
                .unwrap_or("")
                .to_string()
        };
        let length: usize = header("content-length").parse().unwrap_or(0);
        let body = &after[..length.min(after.len())];
        let status = head.lines().next().unwrap_or("").to_string();
        out.push((status, header("content-type"), serde_json::from_str(body).unwrap_or(Value::Null)));
        rest = &after[length.min(after.len())..];
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn path_ids_that_are_not_utf8_get_problem_reports() {
    let server = Server::start(&sqlite_url(), free_port(), &new_token_secret()).await;

    // A path id that is not UTF-8 once percent-decoded.
    for path in ["/api/v1/requests/%FF", "/api/v1/tenants/%C3%28/quotas", "/api/v1/reservations/a%80b"] {
        let r =
            server.client.get(format!("{}{path}", server.base)).bearer_auth(&server.admin).send().await.expect("send");
        let (status, kind) = (r.status(), content_type(&r));
        let v: Value = r.json().await.unwrap_or(Value::Null);
        assert_eq!(
            (status, kind.as_str(), v["code"].as_str()),
            (StatusCode::BAD_REQUEST, "application/problem+json", Some("invalid_path")),
            "{path}: {v}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wrong_methods_and_unknown_api_paths_get_problem_reports() {
    let server = Server::start(&sqlite_url(), free_port(), &new_token_secret()).await;

    // A path under /api that no route has, with and without credentials.
    for token in [Some(server.admin.as_str()), None] {
        let mut r = server.client.get(format!("{}/api/v1/no-such-thing", server.base));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        let r = r.send().await.expect("send");
        let (status, kind) = (r.status(), content_type(&r));
        let v: Value = r.json().await.unwrap_or(Value::Null);
        assert_eq!(
            (status, kind.as_str(), v["code"].as_str()),
            (StatusCode::NOT_FOUND, "application/problem+json", Some("not_found")),
            "{v}"
        );
    }

    // A method the path does not take: 405 with the methods it takes, as a problem report.
    for (method, path, allowed) in [
        (Method::DELETE, "/api/v1/requests", &["GET", "POST"][..]),
        (Method::PUT, "/api/v1/requests/x/approve", &["POST"][..]),
    ] {
        let r = server
            .client
            .request(method.clone(), format!("{}{path}", server.base))
            .bearer_auth(&server.admin)
            .send()
            .await
            .expect("send");
        let allow = r.headers().get("allow").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let (status, kind) = (r.status(), content_type(&r));
        let v: Value = r.json().await.unwrap_or(Value::Null);
        assert_eq!(
            (status, kind.as_str(), v["code"].as_str()),
            (StatusCode::METHOD_NOT_ALLOWED, "application/problem+json", Some("method_not_allowed")),
            "{method} {path}: {v}"
        );
        assert!(allowed.iter().all(|m| allow.contains(m)), "{method} {path}: Allow: {allow}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn headers_that_cannot_be_parsed_get_problem_reports() {
    let server = Server::start(&sqlite_url(), free_port(), &new_token_secret()).await;

    // Headers hyper cannot parse: a NUL byte or another control character in a value, a line without a colon, more
    // headers than it reads. Each is a problem report, and the server goes on serving.
    let too_many: String = (0..200).map(|i| format!("X-Filler-{i}: v\r\n")).collect();
    for (request, status, code) in [
        (
            "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Bad: a\0b\r\nConnection: close\r\n\r\n".to_string(),
            "400",
            "malformed_request",
        ),
        (
            "GET /api/v1/requests HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \0\r\n\r\n".to_string(),
            "400",
            "malformed_request",
        ),
        ("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Bad: a\x01b\r\n\r\n".to_string(), "400", "malformed_request"),
        ("GET /healthz HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n".to_string(), "400", "malformed_request"),
        (format!("GET /healthz HTTP/1.1\r\nHost: x\r\n{too_many}\r\n"), "431", "headers_too_large"),
    ] {
        let answer = raw_exchange(server.port, request.as_bytes()).await;
        let answers = raw_problems(&answer);
        assert_eq!(answers.len(), 1, "{request:?}: {answer:?}");
        let (line, content_type, problem) = &answers[0];
        assert!(line.starts_with(&format!("HTTP/1.1 {status} ")), "{request:?}: {answer:?}");
        assert_eq!(
            (content_type.as_str(), problem["code"].as_str()),
            ("application/problem+json", Some(code)),
            "{request:?}: {answer:?}"
        );
        assert_eq!(problem["status"].as_u64(), status.parse().ok(), "{answer:?}");
    }
    // After a good request on the same connection, too.
    let answer = raw_exchange(
        server.port,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\nX-Bad: \0\r\n\r\n",
    )
    .await;
    let answers = raw_problems(&answer);
    assert_eq!(answers.len(), 2, "{answer:?}");
    assert!(answers[0].0.starts_with("HTTP/1.1 200"), "{answer:?}");
    assert_eq!(
        (answers[1].1.as_str(), answers[1].2["code"].as_str()),
        ("application/problem+json", Some("malformed_request")),
        "{answer:?}"
    );
    let (s, _) = server.call(Method::GET, "/healthz", None).await;
    assert_eq!(s, StatusCode::OK);
}

/// A request still unanswered after the request timeout (30 s; here a body that never arrives) is a 408 problem
/// report.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_past_the_request_timeout_is_a_408_problem_report() {
    let server = Server::start(&sqlite_url(), free_port(), &new_token_secret()).await;
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", server.port)).await.expect("connect");
    let head = format!(
        "POST /api/v1/tenants HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\n\
         Content-Length: 100\r\n\r\n{{",
        server.admin
    );
    stream.write_all(head.as_bytes()).await.expect("write");
    let started = Instant::now();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(Ok(n @ 1..)) = tokio::time::timeout(Duration::from_secs(45), stream.read(&mut buf)).await {
        answer.extend_from_slice(&buf[..n]);
        if raw_problems(&String::from_utf8_lossy(&answer)).iter().any(|(_, _, p)| !p.is_null()) {
            break;
        }
    }
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let answers = raw_problems(&answer);
    assert!(started.elapsed() >= Duration::from_secs(29), "answered after {:?}: {answer:?}", started.elapsed());
    assert_eq!(answers.len(), 1, "{answer:?}");
    assert!(answers[0].0.starts_with("HTTP/1.1 408 "), "{answer:?}");
    assert_eq!(
        (answers[0].1.as_str(), answers[0].2["code"].as_str()),
        ("application/problem+json", Some("request_timeout")),
        "{answer:?}"
    );
}
