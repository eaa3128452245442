//! Node-agent benchmarks against the `tessera` server as a separate process (so its memory can be read), over
//! real HTTP on loopback, on this machine's cores shared by server and load:
//!
//! - `ingest`: telemetry samples per second the server takes from many nodes sending gzip batches, against a
//!   baseline from the same run: the same samples sent one per request, uncompressed (what an agent without
//!   batching would do).
//! - `push`: latency from a request's approval to its MIG instance existing on the simulated GPU (plan, commit,
//!   spec generation, WebSocket push, apply, all included) with 1 agent connected (the baseline) and then with N
//!   (default 1,000) agents connected, each sampling and sending telemetry every second; and the server's resident
//!   memory idle, with 1 agent, and with N.
//! - `live` (part of `push`): the live stream a heatmap follows (`/api/v1/telemetry/live`), read for a while with
//!   1 agent and with N: per sample, the time from its taking on the agent to its arrival in the stream's reader
//!   (sample -> browser; drawing adds one animation frame), and the share of each device's seconds that arrived
//!   (a column of the 1 s heatmap without a sample is an empty column).
//!
//! `cargo bench -p tessera-server --bench agents [-- ingest|push] [--agents N] [--quick]`.

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use tessera_agent::agent::{self, Config};
use tessera_agent::backend::sim::{SimBackend, SimHandle, SimNode, parse_gpus};
use tessera_core::api::{DeviceSeries, GpuInventory, Inventory, Joined, Sample, TelemetryBatch};
use tessera_server::http::auth::new_token_secret;

struct Server {
    child: std::process::Child,
    base: String,
    admin: String,
    client: Client,
    dir: std::path::PathBuf,
}

impl Server {
    fn start(join_tokens: &[String]) -> Server {
        let dir = std::env::temp_dir().join(format!("tessera-bench-{}", uuid::Uuid::now_v7().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let admin = new_token_secret();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--database-url")
            .arg(format!("sqlite://{}", dir.join("bench.db").display()))
            .env("TESSERA_BOOTSTRAP_TOKEN", &admin)
            .env("TESSERA_BOOTSTRAP_JOIN_TOKENS", join_tokens.join(","))
            // Every simulated agent connects from this host's one address; a fleet's come from their own.
            .env("TESSERA_MAX_CONNECTIONS_PER_ADDRESS", "0")
            .env("RUST_LOG", "error")
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("start tessera serve");
        let server = Server { child, base: format!("http://127.0.0.1:{port}"), admin, client: Client::new(), dir };
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            assert!(Instant::now() < until, "the server did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    /// Resident memory of the server process, MiB (current, peak).
    fn rss_mib(&self) -> (f64, f64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<f64>().ok())
                .map_or(0.0, |kib| kib / 1024.0)
        };
        (field("VmRSS:"), field("VmHWM:"))
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut r = self.client.request(method, format!("{}{path}", self.base)).bearer_auth(&self.admin);
        if let Some(b) = body {
            r = r.json(&b);
        }
        let r = r.send().await.expect("send");
        let status = r.status();
        (status, r.json().await.unwrap_or(Value::Null))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn join_token() -> String {
    format!("tsj_{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

fn now_ms() -> i64 {
    tessera_server::store::now_ms()
}

// ---------------------------------------------------------------------------------------------------------------
// Ingest

/// A node of 8 H100s in MIG mode with 7 instances each: 64 devices.
fn inventory(name: &str) -> (Inventory, Vec<(String, String, Option<String>)>) {
    let mut gpus = Vec::new();
    let mut devices = Vec::new();
    for i in 0..8u32 {
        let uuid = format!("GPU-{}", uuid::Uuid::new_v4());
        devices.push((uuid.clone(), uuid.clone(), None));
        for s in 0..7 {
            devices.push((format!("MIG-{}", uuid::Uuid::new_v4()), uuid.clone(), Some(format!("1g.10gb@{s}"))));
        }
        gpus.push(GpuInventory {
            index: i,
            uuid,
            name: "NVIDIA H100 80GB HBM3".into(),
            pci_device_id: None,
            memory_mib: 81_559,
            mig_capable: true,
            mig_enabled: true,
            mig_pending: None,
            instances: Vec::new(),
        });
    }
    let inv = Inventory {
        hostname: name.into(),
        agent_version: "bench".into(),
        backend: "sim".into(),
        driver_version: None,
        cuda_version: None,
        gpus,
    };
    (inv, devices)
}

/// One batch: `per_device` samples of each device, ending now.
fn batch(devices: &[(String, String, Option<String>)], per_device: usize, t_end: i64) -> TelemetryBatch {
    TelemetryBatch {
        dropped: 0,
        devices: devices
            .iter()
            .map(|(device, gpu, profile)| DeviceSeries {
                device: device.clone(),
                gpu: gpu.clone(),
                profile: profile.as_ref().map(|p| p.split('@').next().unwrap().to_string()),
                start: profile.as_ref().map(|p| p.split('@').nth(1).unwrap().parse().unwrap()),
                samples: (0..per_device)
                    .map(|k| Sample {
                        t: t_end - ((per_device - k) as i64) * 1000,
                        util: (k * 7 % 100) as f32,
                        mem_used_mib: 4096.0,
                        mem_total_mib: 9984.0,
                        power_w: profile.is_none().then_some(350.0),
                        temp_c: profile.is_none().then_some(55.0),
                    })
                    .collect(),
            })
            .collect(),
    }
}

fn gzip(batch: &TelemetryBatch) -> Vec<u8> {
    tessera_agent::telemetry::encode(batch)
}

/// Sends `bodies` round-robin from `clients` tasks for `duration`; returns samples accepted per second.
async fn blast(
    server: &Server,
    creds: &[String],
    bodies: Arc<Vec<Vec<Vec<u8>>>>,
    gzip: bool,
    clients: usize,
    duration: Duration,
) -> (f64, f64) {
    let accepted = Arc::new(AtomicU64::new(0));
    let requests = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + duration;
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let client = Client::new();
            let url = format!("{}/api/v1/agent/telemetry", server.base);
            let cred = creds[c % creds.len()].clone();
            let bodies = bodies.clone();
            let accepted = accepted.clone();
            let requests = requests.clone();
            tokio::spawn(async move {
                let mine = &bodies[c % bodies.len()];
                let mut i = 0;
                while Instant::now() < deadline {
                    let mut r = client
                        .post(&url)
                        .bearer_auth(&cred)
                        .header("content-type", "application/json")
                        .body(mine[i % mine.len()].clone());
                    if gzip {
                        r = r.header("content-encoding", "gzip");
                    }
                    i += 1;
                    let r = r.send().await.expect("send");
                    assert!(r.status().is_success(), "{}", r.status());
                    let v: Value = r.json().await.expect("json");
                    assert_eq!(v["rejected"].as_u64(), Some(0), "every sample is the node's own: {v}");
                    accepted.fetch_add(v["accepted"].as_u64().unwrap_or(0), Ordering::Relaxed);
                    requests.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let secs = started.elapsed().as_secs_f64();
    (accepted.load(Ordering::Relaxed) as f64 / secs, requests.load(Ordering::Relaxed) as f64 / secs)
}

async fn ingest(quick: bool) {
    let nodes = 16;
    let tokens: Vec<String> = (0..nodes).map(|_| join_token()).collect();
    let server = Server::start(&tokens);
    let mut creds = Vec::new();
    let mut all_devices = Vec::new();
    for (i, token) in tokens.iter().enumerate() {
        let (inv, devices) = inventory(&format!("ingest-{i}"));
        let r = server
            .client
            .post(format!("{}/api/v1/agent/join", server.base))
            .json(&json!({"token": token, "inventory": inv}))
            .send()
            .await
            .expect("join");
        assert!(r.status().is_success(), "join: {}", r.status());
        let joined: Joined = r.json().await.expect("joined");
        // The node reports its instances, as an agent does after applying its layout: only then are its MIG
        // devices its own, and their telemetry taken.
        let gpus: Vec<Value> = inv
            .gpus
            .iter()
            .map(|g| {
                let instances: Vec<Value> = devices
                    .iter()
                    .filter(|(_, gpu, profile)| *gpu == g.uuid && profile.is_some())
                    .enumerate()
                    .map(|(k, (device, _, _))| {
                        json!({"profile": "1g.10gb", "start": k, "uuid": device, "gi_id": k + 1, "ci_id": 0,
                               "device_name": format!("MIG 1g.10gb Device {k}")})
                    })
                    .collect();
                json!({"uuid": g.uuid, "mig_enabled": true, "instances": instances})
            })
            .collect();
        let r = server
            .client
            .put(format!("{}/api/v1/agent/status", server.base))
            .bearer_auth(&joined.credential)
            .json(&json!({"observed_generation": 0, "gpus": gpus}))
            .send()
            .await
            .expect("status");
        assert!(r.status().is_success(), "status: {}", r.status());
        creds.push(joined.credential);
        all_devices.push(devices);
    }
    let duration = Duration::from_secs(if quick { 2 } else { 10 });
    let now = now_ms();
    // Batched: what an agent of 64 devices sends every 2 s (2 samples each), and a backlog after an outage
    // (30 samples each). Each node's batches move forward in time, so minutes are finished and queued as in use.
    let make = |per_device: usize| -> Arc<Vec<Vec<Vec<u8>>>> {
        Arc::new(
            all_devices
                .iter()
                .map(|devices| (0..20).map(|k| gzip(&batch(devices, per_device, now - 60_000 + k * 3000))).collect())
                .collect(),
        )
    };
    // Baseline: one sample per request, uncompressed JSON.
    let single: Arc<Vec<Vec<Vec<u8>>>> = Arc::new(
        all_devices
            .iter()
            .map(|devices| {
                devices
                    .iter()
                    .take(16)
                    .map(|d| serde_json::to_vec(&batch(std::slice::from_ref(d), 1, now)).unwrap())
                    .collect()
            })
            .collect(),
    );
    let live = make(2);
    let backlog = make(30);
    let raw_size = serde_json::to_vec(&batch(&all_devices[0], 2, now)).unwrap().len();
    println!(
        "ingest: {nodes} nodes x 64 devices (8 H100 x (GPU + 7 MIG)); live batch 128 samples = {} B gzip ({raw_size} B JSON)",
        live[0][0].len()
    );
    let clients = 16;
    let (base_sps, base_rps) = blast(&server, &creds, single, false, clients, duration).await;
    println!("  baseline: 1 sample per request, JSON     {base_sps:>10.0} samples/s  ({base_rps:.0} req/s)");
    let (live_sps, live_rps) = blast(&server, &creds, live, true, clients, duration).await;
    println!(
        "  batched: 128 samples per request, gzip  {live_sps:>10.0} samples/s  ({live_rps:.0} req/s)  {:.1}x baseline",
        live_sps / base_sps
    );
    let (back_sps, back_rps) = blast(&server, &creds, backlog, true, clients, duration).await;
    println!(
        "  backlog: 1920 samples per request, gzip {back_sps:>10.0} samples/s  ({back_rps:.0} req/s)  {:.1}x baseline",
        back_sps / base_sps
    );
    let (rss, peak) = server.rss_mib();
    println!("  server RSS after ingest: {rss:.0} MiB (peak {peak:.0} MiB)");
}

// ---------------------------------------------------------------------------------------------------------------
// Push latency and memory with many agents

struct Agents {
    handles: Vec<(String, SimHandle)>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    dirs: Vec<std::path::PathBuf>,
}

impl Agents {
    fn start(&mut self, base: &str, name: &str, gpus: &str, token: String) {
        let dir = std::env::temp_dir().join(format!("tessera-bench-agent-{}", uuid::Uuid::now_v7().simple()));
        let mut node = SimNode::new(name, &parse_gpus(gpus).unwrap());
        node.seed = self.handles.len() as u64;
        let sim = SimBackend::new(Arc::new(std::sync::Mutex::new(node)));
        self.handles.push((name.to_string(), sim.handle()));
        let config = Config::new(base, Some(token), dir.clone());
        self.dirs.push(dir);
        self.tasks.push(tokio::spawn(async move {
            if let Err(e) = agent::run(config, Box::new(sim)).await {
                println!("agent stopped: {e}");
            }
        }));
    }

    fn instance_at(&self, node: &str, gpu_uuid: &str, start: u8) -> bool {
        let Some((_, h)) = self.handles.iter().find(|(n, _)| n == node) else { return false };
        let sim = h.lock().unwrap();
        sim.gpus.iter().any(|g| g.uuid == gpu_uuid && g.instances.iter().any(|i| i.start == start))
    }
}

impl Drop for Agents {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        for d in &self.dirs {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// Waits until `n` nodes are ready and have applied their spec.
async fn all_ready(server: &Server, n: usize, limit: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let (_, nodes) = server.call(reqwest::Method::GET, "/api/v1/nodes", None).await;
        let ready = nodes.as_array().map_or(0, |a| a.iter().filter(|x| x["state"] == "ready").count());
        if ready >= n {
            return started.elapsed();
        }
        assert!(started.elapsed() < limit, "only {ready} of {n} nodes ready after {limit:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Approves `k` one-slice requests one after another; per request, the time from sending the approval to the
/// instance existing on its simulated GPU.
async fn latencies(server: &Server, agents: &Agents, tenant: &str, k: usize) -> Vec<Duration> {
    let (_, nodes) = server.call(reqwest::Method::GET, "/api/v1/nodes", None).await;
    let nodes = nodes.as_array().cloned().unwrap_or_default();
    let mut out = Vec::new();
    for _ in 0..k {
        let ask =
            json!({"tenant": tenant, "spec": {"mode": "mig", "profile": "1g.10gb", "model": "H100-80GB"}, "count": 1});
        let (s, request) = server.call(reqwest::Method::POST, "/api/v1/requests", Some(ask)).await;
        assert_eq!(s, StatusCode::CREATED, "{request}");
        let id = request["id"].as_str().unwrap();
        let t0 = Instant::now();
        let (s, approval) = server.call(reqwest::Method::POST, &format!("/api/v1/requests/{id}/approve"), None).await;
        assert_eq!(s, StatusCode::OK, "{approval}");
        let placed = &approval["reservations"][0];
        let gpu_id = placed["gpu_id"].as_str().or_else(|| placed["gpu"].as_str()).unwrap_or_default();
        let start = placed["start"].as_u64().unwrap() as u8;
        let (node, uuid) = nodes
            .iter()
            .find_map(|n| {
                n["gpus"]
                    .as_array()?
                    .iter()
                    .find(|g| g["id"] == gpu_id)
                    .map(|g| (n["name"].as_str().unwrap().to_string(), g["uuid"].as_str().unwrap().to_string()))
            })
            .unwrap_or_else(|| panic!("reservation on an unknown GPU: {approval}"));
        loop {
            if agents.instance_at(&node, &uuid, start) {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "not applied within 60 s: {approval}");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        out.push(t0.elapsed());
    }
    out
}

/// What a live-stream reader saw: per sample, arrival minus sample time (ms); seconds that arrived out of those
/// expected (every device, every whole second between the first and last second read).
struct Live {
    lags_ms: Vec<f64>,
    seconds_seen: usize,
    seconds_expected: usize,
    devices: usize,
}

/// Reads the live stream for `secs` seconds.
async fn live_stream(server: &Server, secs: u64) -> Live {
    let mut r = server
        .client
        .get(format!("{}/api/v1/telemetry/live", server.base))
        .bearer_auth(&server.admin)
        .send()
        .await
        .expect("live stream");
    assert_eq!(r.status(), StatusCode::OK);
    let started = now_ms();
    let until = Instant::now() + Duration::from_secs(secs);
    let mut text = String::new();
    let mut lags_ms = Vec::new();
    let mut seen: std::collections::HashMap<String, std::collections::BTreeSet<i64>> = Default::default();
    while let Ok(Ok(Some(chunk))) = tokio::time::timeout_at(until.into(), r.chunk()).await {
        let arrived = now_ms();
        text.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = text.find("\n\n") {
            let event: String = text.drain(..end + 2).collect();
            for line in event.lines().filter_map(|l| l.strip_prefix("data:")) {
                let samples: Vec<Value> = serde_json::from_str(line.trim()).unwrap_or_default();
                for s in samples {
                    let t = s["sample"]["t"].as_i64().unwrap_or(0);
                    // The first event also carries what was already there: only samples taken since we listen.
                    if t >= started {
                        lags_ms.push((arrived - t) as f64);
                    }
                    seen.entry(s["device"].as_str().unwrap_or_default().to_string()).or_default().insert(t / 1000);
                }
            }
        }
    }
    // Whole seconds from one after the start to two before the end (the last may still be on its way).
    let (first, last) = (started / 1000 + 1, now_ms() / 1000 - 2);
    let expected = usize::try_from((last - first + 1).max(0)).unwrap_or(0);
    let seconds_seen = seen.values().map(|s| s.range(first..=last).count()).sum();
    Live { lags_ms, seconds_seen, seconds_expected: expected * seen.len(), devices: seen.len() }
}

fn live_summary(label: &str, l: &mut Live) -> f64 {
    l.lags_ms.sort_by(f64::total_cmp);
    let p = |q: f64| {
        let i = ((l.lags_ms.len() as f64 * q).ceil() as usize).clamp(1, l.lags_ms.len().max(1)) - 1;
        l.lags_ms.get(i).copied().unwrap_or(f64::NAN)
    };
    let p95 = p(0.95);
    println!(
        "  {label:<24} sample -> stream p50 {:>7.1} ms  p95 {p95:>7.1} ms  max {:>7.1} ms  ({} samples); \
         {} of {} device-seconds arrived ({:.2} %, {} devices)",
        p(0.5),
        l.lags_ms.last().copied().unwrap_or(f64::NAN),
        l.lags_ms.len(),
        l.seconds_seen,
        l.seconds_expected,
        l.seconds_seen as f64 * 100.0 / l.seconds_expected.max(1) as f64,
        l.devices
    );
    p95
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1000.0
}

fn summary(mut l: Vec<Duration>) -> (f64, f64, f64) {
    l.sort();
    (pct(&l, 0.5), pct(&l, 0.95), l.last().unwrap().as_secs_f64() * 1000.0)
}

async fn push(n: usize, quick: bool) {
    let tokens: Vec<String> = (0..=n).map(|_| join_token()).collect();
    let server = Server::start(&tokens);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (idle_rss, _) = server.rss_mib();
    let (_, tenant) = server.call(reqwest::Method::POST, "/api/v1/tenants", Some(json!({"name": "bench"}))).await;
    let tenant = tenant["id"].as_str().unwrap().to_string();
    let (s, _) = server
        .call(
            reqwest::Method::PUT,
            &format!("/api/v1/tenants/{tenant}/quotas"),
            Some(json!({"limits": {"compute_slices": 100_000}})),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let mut agents = Agents { handles: Vec::new(), tasks: Vec::new(), dirs: Vec::new() };
    let k = if quick { 10 } else { 40 };
    // Baseline: one agent (8 H100s), nothing else connected.
    agents.start(&server.base, "base-0", "H100-80GB:8", tokens[0].clone());
    all_ready(&server, 1, Duration::from_secs(30)).await;
    auto_layout(&server).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (one_rss, _) = server.rss_mib();
    let base = summary(latencies(&server, &agents, &tenant, k).await);
    let live_secs = if quick { 8 } else { 30 };
    let mut live_base = live_stream(&server, live_secs).await;
    // Take the baseline node out of the planner's reach: the rest land on the N agents.
    cordon_all(&server).await;
    let joining = Instant::now();
    for (i, token) in tokens.iter().enumerate().skip(1) {
        agents.start(&server.base, &format!("node-{i:04}"), "H100-80GB:1", token.clone());
        if i % 50 == 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let took = all_ready(&server, n + 1, Duration::from_secs(600)).await;
    let joined_in = joining.elapsed();
    auto_layout(&server).await;
    // Let telemetry and heartbeats reach a steady state.
    tokio::time::sleep(Duration::from_secs(if quick { 5 } else { 20 })).await;
    let (many_rss, _) = server.rss_mib();
    let many = summary(latencies(&server, &agents, &tenant, k).await);
    let mut live_many = live_stream(&server, live_secs).await;
    let (after_rss, peak) = server.rss_mib();
    let metrics = server.client.get(format!("{}/metrics", server.base)).bearer_auth(&server.admin).send().await;
    let metrics = metrics.expect("metrics").text().await.unwrap_or_default();
    let connected =
        metrics.lines().find_map(|l| l.strip_prefix("tessera_agents_connected ")).unwrap_or("?").to_string();
    let samples =
        metrics.lines().find_map(|l| l.strip_prefix("tessera_telemetry_samples_total ")).unwrap_or("?").to_string();
    println!("push: approval -> instance applied on the simulated GPU, {k} approvals one after another");
    println!("  1 agent (baseline):      p50 {:>7.1} ms  p95 {:>7.1} ms  max {:>7.1} ms", base.0, base.1, base.2);
    println!(
        "  {n} agents connected:  p50 {:>7.1} ms  p95 {:>7.1} ms  max {:>7.1} ms  (p95 {:.2}x baseline)",
        many.0,
        many.1,
        many.2,
        many.1 / base.1
    );
    println!(
        "  {n} agents joined and ready in {:.1} s ({:.1} s after the last started)",
        joined_in.as_secs_f64(),
        took.as_secs_f64()
    );
    println!("  agents connected (WebSocket): {connected}; telemetry samples taken so far: {samples}");
    println!(
        "  server RSS: idle {idle_rss:.0} MiB, 1 agent {one_rss:.0} MiB, {n} agents {many_rss:.0} MiB \
         (after the approvals {after_rss:.0} MiB, peak {peak:.0} MiB); {:.1}x the 1-agent figure",
        after_rss / one_rss
    );
    println!("live: the heatmap's event stream read for {live_secs} s");
    let base_p95 = live_summary("1 agent (baseline):", &mut live_base);
    let many_p95 = live_summary(&format!("{n} agents connected:"), &mut live_many);
    println!("  p95 {:.2}x baseline", many_p95 / base_p95);
}

async fn auto_layout(server: &Server) {
    let (_, nodes) = server.call(reqwest::Method::GET, "/api/v1/nodes", None).await;
    for g in nodes.as_array().into_iter().flatten().flat_map(|n| n["gpus"].as_array().cloned().unwrap_or_default()) {
        if g["auto_layout"] != true {
            let id = g["id"].as_str().unwrap();
            let (s, v) = server
                .call(reqwest::Method::PUT, &format!("/api/v1/gpus/{id}/auto-layout"), Some(json!({"enabled": true})))
                .await;
            assert!(s.is_success(), "{v}");
        }
    }
}

async fn cordon_all(server: &Server) {
    let (_, nodes) = server.call(reqwest::Method::GET, "/api/v1/nodes", None).await;
    for g in nodes.as_array().into_iter().flatten().flat_map(|n| n["gpus"].as_array().cloned().unwrap_or_default()) {
        let id = g["id"].as_str().unwrap();
        let (s, v) = server.call(reqwest::Method::POST, &format!("/api/v1/gpus/{id}/cordon"), None).await;
        assert!(s.is_success(), "{v}");
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let n = args
        .iter()
        .position(|a| a == "--agents")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 100 } else { 1000 });
    let only = args.iter().find(|a| *a == "ingest" || *a == "push").cloned();
    if cfg!(debug_assertions) {
        println!("Unoptimised build (`--profile dev`): a check that the benchmark runs, not figures to report.");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        if only.as_deref() != Some("push") {
            ingest(quick).await;
        }
        if only.as_deref() != Some("ingest") {
            push(n, quick).await;
        }
    });
}
