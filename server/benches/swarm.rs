//! A swarm of simulated node agents against one `tessera` server process, started cold, on this machine's cores
//! shared by server and swarm. Each simulated node is a few cheap tasks of this process speaking the agent
//! protocol as `tessera-agent` does: it joins with its join token (retrying with the agent's backoff on 5xx, 429
//! and network errors), holds its WebSocket with a heartbeat every 5 s, answers every pushed spec with a status
//! (`PUT /api/v1/agent/status`) that reports it applied, reports its status again every 30 s, and samples its 8
//! whole GPUs once a second, sending each second's samples as one gzip JSON `TelemetryBatch` (samples a refused
//! or failed batch held are sent again with the next one, as the agent's buffer does). All nodes share one HTTP
//! client (at most `--in-flight` requests at a time), so the server sees far fewer TCP connections than a fleet's
//! two per agent; the requests, WebSocket messages and database work are the fleet's.
//!
//! Measured:
//!
//! 1. **Join**: from the server's spawn (cold: empty SQLite database) to every node joined, connected and its
//!    first spec applied; joins refused, retried, WebSocket connects that failed.
//! 2. **Approval -> applied**: whole-GPU requests created and approved as admin one after another while the swarm
//!    runs; per request the time from sending the approval to the node's status answer saying its allocation
//!    turned active (the node saw the spec on its WebSocket, reported it applied), and to the spec's arrival;
//!    every request is then read back `active`.
//! 3. **Sustained**: telemetry, heartbeats and status from every node for `--seconds`: the server's CPU
//!    (`/proc/PID/stat` utime + stime over the window, in cores), its resident memory (`VmRSS`, peak `VmHWM`),
//!    samples taken, accepted, refused and not delivered, the server's own counters (`/metrics`, read once after
//!    the window), batch round trips, errors, and the swarm's own CPU.
//!
//! Replicas: with `--postgres URL` (a PostgreSQL server's URL; a fresh database is made there and dropped after)
//! the server runs on PostgreSQL, and with `--replicas N` as N processes on that database, node `i` speaking to
//! replica `i % N` as a load balancer spreading agents would; CPU and memory are then the replicas' together, and
//! PostgreSQL's own processes are measured beside them.
//!
//! `cargo bench -p tessera-server --bench swarm [-- --agents N] [--seconds S] [--approvals M] [--in-flight K]
//! [--status-s S] [--join-limit-s S] [--batch-s S] [--server PATH] [--postgres URL [--replicas N]] [--quick]`
//! (`--server`: another `tessera`
//! binary, e.g. a release build, than the one built with the benchmark; `--join-limit-s`: how long to wait for
//! every node to be ready before the window starts anyway, default 600; `--batch-s`: seconds of samples a batch
//! carries, as the agent's `--telemetry-batch-ms`, default 1). Default 10,000 agents (80,000 devices) for 600 s;
//! `--quick`: 300 agents for 20 s, asserting that every node joined, every approval was applied and every sample
//! was accepted (no timings asserted).

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use tessera_api::agents::StatusOutcome;
use tessera_core::api::{
    AgentMessage, DeviceSeries, GpuInventory, GpuStatus, Inventory, JoinRequest, Joined, NodeSpec, NodeStatus, Sample,
    ServerMessage, TelemetryAccepted, TelemetryBatch,
};
use tessera_server::http::auth::new_token_secret;
use tokio::sync::Semaphore;
use tokio_tungstenite::tungstenite;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// GPUs per simulated node.
const GPUS: usize = 8;
/// Samples a node keeps for sending again while batches fail (10 minutes of its GPUs).
const BUFFER: usize = 600 * GPUS;

struct Args {
    agents: usize,
    seconds: u64,
    approvals: usize,
    in_flight: usize,
    status_s: u64,
    /// How long the swarm waits for every node to be ready before its window starts anyway.
    join_limit_s: Option<u64>,
    /// Seconds of samples in one telemetry batch (the agent's `--telemetry-batch-ms` / 1000).
    batch_s: u64,
    quick: bool,
    server: Option<String>,
    /// A PostgreSQL server to run on (its URL; a database of the run's own is made there).
    postgres: Option<String>,
    /// Server processes on that database.
    replicas: usize,
}

impl Args {
    fn parse() -> Args {
        let args: Vec<String> = std::env::args().collect();
        let quick = args.iter().any(|a| a == "--quick");
        let value = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)?.parse().ok());
        Args {
            agents: value("--agents").map_or(if quick { 300 } else { 10_000 }, |v: u64| v as usize),
            seconds: value("--seconds").unwrap_or(if quick { 20 } else { 600 }),
            approvals: value("--approvals").map_or(if quick { 10 } else { 100 }, |v: u64| v as usize),
            in_flight: value("--in-flight").map_or(1000, |v: u64| v as usize),
            status_s: value("--status-s").unwrap_or(30),
            join_limit_s: value("--join-limit-s"),
            batch_s: value("--batch-s").unwrap_or(1).max(1),
            quick,
            server: args.iter().position(|a| a == "--server").and_then(|i| args.get(i + 1)).cloned(),
            postgres: args.iter().position(|a| a == "--postgres").and_then(|i| args.get(i + 1)).cloned(),
            replicas: value("--replicas").map_or(1, |v: u64| v.max(1) as usize),
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The server process

struct Server {
    child: std::process::Child,
    base: String,
    admin: String,
    client: Client,
    dir: std::path::PathBuf,
    log: String,
    last: bool,
    spawned: Instant,
    listening: Duration,
}

impl Server {
    /// Starts the server on `database` (made at its first start), logging to `log` in `dir`, the bootstrap admin's
    /// token `admin`; the folder is removed with the last server started with `last`.
    fn start(
        binary: &str,
        dir: &std::path::Path,
        database: &str,
        log: &str,
        admin: &str,
        max_connections: usize,
        last: bool,
    ) -> Server {
        // Every device of the swarm is a series the server keeps in memory: its cap (16,384 by default) raised
        // to the swarm's, as an operator of such a fleet sets it.
        let max_series = max_connections * GPUS + 1024;
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let log_file = std::fs::File::create(dir.join(log)).unwrap();
        let spawned = Instant::now();
        let child = std::process::Command::new(binary)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--database-url")
            .arg(database)
            .env("TESSERA_BOOTSTRAP_TOKEN", admin)
            // Every simulated agent connects from this host's one address; a fleet's come from their own.
            .env("TESSERA_MAX_CONNECTIONS_PER_ADDRESS", "0")
            .env("TESSERA_MAX_CONNECTIONS", max_connections.to_string())
            .env("TESSERA_TELEMETRY_MAX_SERIES", max_series.to_string())
            .env("RUST_LOG", "warn")
            .env("NO_COLOR", "1")
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .spawn()
            .expect("start tessera serve");
        let until = Instant::now() + Duration::from_secs(120);
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            assert!(Instant::now() < until, "the server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        let listening = spawned.elapsed();
        Server {
            child,
            base: format!("http://127.0.0.1:{port}"),
            admin: admin.to_string(),
            client: Client::builder().timeout(Duration::from_secs(120)).build().unwrap(),
            dir: dir.to_path_buf(),
            log: log.to_string(),
            last,
            spawned,
            listening,
        }
    }

    /// Stops the server as a service manager does (SIGTERM), and waits for it to end.
    fn stop(mut self) {
        let _ = std::process::Command::new("kill").args(["-TERM", &self.pid().to_string()]).status();
        let until = Instant::now() + Duration::from_secs(60);
        while Instant::now() < until {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        println!("  the server did not stop within 60 s of SIGTERM; killed");
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut r = self.client.request(method, format!("{}{path}", self.base)).bearer_auth(&self.admin);
        if let Some(b) = body {
            r = r.json(&b);
        }
        match r.send().await {
            Ok(r) => {
                let status = r.status();
                (status, r.json().await.unwrap_or(Value::Null))
            }
            Err(e) => {
                println!("  {path}: {e}");
                (StatusCode::GATEWAY_TIMEOUT, Value::Null)
            }
        }
    }

    /// The server's warnings and errors: how many, and the first few different ones.
    fn log_summary(&self) -> (usize, Vec<String>) {
        let text = std::fs::read_to_string(self.dir.join(&self.log)).unwrap_or_default();
        let mut count = 0;
        let mut first: Vec<String> = Vec::new();
        for line in text.lines().filter(|l| l.contains("WARN") || l.contains("ERROR")) {
            count += 1;
            // Without its timestamp, to tell different messages apart.
            let message: String = line.split_once(' ').map_or(line, |(_, rest)| rest).chars().take(220).collect();
            let key: String = message.chars().take(80).collect();
            if first.len() < 6 && !first.iter().any(|f| f.starts_with(&key)) {
                first.push(message);
            }
        }
        (count, first)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if self.last {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Clock ticks a second, as `/proc/PID/stat` counts CPU time.
fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// CPU time (user + system) a process has used, in clock ticks.
fn cpu_ticks(pids: &str) -> u64 {
    pids.split(',').map(cpu_ticks_of).sum()
}

/// CPU ticks of one process (utime + stime).
fn cpu_ticks_of(pid: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name (which may hold spaces) in parentheses; utime and stime are the 14th and
    // 15th fields, so the 12th and 13th after it.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    field(11) + field(12)
}

/// Resident memory of processes (comma-separated pids) together, MiB (current, peak).
fn rss_mib(pids: &str) -> (f64, f64) {
    pids.split(',').map(rss_mib_of).fold((0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1))
}

/// PostgreSQL's processes on this machine, comma-separated (empty when none).
fn postgres_pids() -> String {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if name.chars().all(|c| c.is_ascii_digit())
            && std::fs::read_to_string(entry.path().join("comm")).is_ok_and(|c| c.trim() == "postgres")
        {
            out.push(name);
        }
    }
    out.join(",")
}

/// Resident memory of one process, MiB (current, peak).
fn rss_mib_of(pid: &str) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
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

/// Creates `n` join tokens as an admin does (`POST /api/v1/join-tokens`), 32 at a time.
async fn join_tokens(server: &Server, n: usize) -> Vec<String> {
    let tasks: Vec<_> = (0..32)
        .map(|k| {
            let (client, base, admin) = (server.client.clone(), server.base.clone(), server.admin.clone());
            tokio::spawn(async move {
                let mut out = Vec::new();
                for _ in (k..n).step_by(32) {
                    let r = client
                        .post(format!("{base}/api/v1/join-tokens"))
                        .bearer_auth(&admin)
                        .json(&json!({"ttl_s": 604_800}))
                        .send()
                        .await
                        .expect("create a join token");
                    assert_eq!(r.status(), StatusCode::CREATED, "join token");
                    let v: Value = r.json().await.expect("join token");
                    out.push(v["token"].as_str().expect("the token's secret").to_string());
                }
                out
            })
        })
        .collect();
    let mut tokens = Vec::with_capacity(n);
    for t in tasks {
        tokens.extend(t.await.unwrap());
    }
    tokens
}

fn now_ms() -> i64 {
    tessera_core::clock::now_ms()
}

/// A number from 0 to `n - 1` spread evenly over seeds (SplitMix64).
fn spread(seed: u64, n: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) % n.max(1)
}

/// A PostgreSQL database of the run's own, made on the server at `--postgres` and dropped after the run.
struct ScratchDb {
    admin: String,
    name: String,
    url: String,
}

impl ScratchDb {
    async fn create(admin: &str) -> ScratchDb {
        let pool = sqlx::PgPool::connect(admin).await.expect("--postgres: cannot connect");
        let name = format!("tessera_swarm_{}", uuid::Uuid::now_v7().simple());
        sqlx::query(&format!("CREATE DATABASE {name}")).execute(&pool).await.expect("create the run's database");
        pool.close().await;
        // The admin URL with the database's name in place of its own.
        let (base, query) = admin.split_once('?').map_or((admin, None), |(b, q)| (b, Some(q)));
        let scheme_end = base.find("://").map_or(0, |i| i + 3);
        let base = base[scheme_end..].find('/').map_or(base, |slash| &base[..scheme_end + slash]);
        let url = match query {
            Some(q) => format!("{base}/{name}?{q}"),
            None => format!("{base}/{name}"),
        };
        ScratchDb { admin: admin.to_string(), name, url }
    }

    async fn drop(self) {
        if let Ok(pool) = sqlx::PgPool::connect(&self.admin).await {
            let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name)).execute(&pool).await;
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The swarm

/// Counters of the whole swarm.
#[derive(Default)]
struct Stats {
    joined: AtomicU64,
    join_retries: AtomicU64,
    /// Join attempts not answered within the agent's 40 s (the server may still have taken them).
    join_timeouts: AtomicU64,
    join_refused: AtomicU64,
    ready: AtomicU64,
    ws_connects: AtomicU64,
    ws_failed: AtomicU64,
    ws_closed: AtomicU64,
    heartbeats: AtomicU64,
    specs: AtomicU64,
    statuses: AtomicU64,
    status_errors: AtomicU64,
    /// Failed batches and statuses by what failed them (an HTTP status, or the kind of network error).
    failures: Mutex<std::collections::BTreeMap<String, u64>>,
    batches: AtomicU64,
    batch_errors: AtomicU64,
    taken: AtomicU64,
    accepted: AtomicU64,
    rejected: AtomicU64,
    dropped: AtomicU64,
    pending: AtomicU64,
    /// The longest batch interval the server asked for (`next_batch_ms`) since it was last read.
    asked_max_ms: AtomicU64,
}

impl Stats {
    /// Counts a failed batch or status (`what`) by its HTTP status or the kind of network error.
    fn failed(&self, what: &str, answer: &Result<reqwest::Response, reqwest::Error>) {
        let why = match answer {
            Ok(r) => format!("HTTP {}", r.status().as_u16()),
            Err(e) if e.is_timeout() => "timed out".to_string(),
            Err(e) if e.is_connect() => "connect failed".to_string(),
            Err(e) if e.is_request() => "request failed (connection closed or reset)".to_string(),
            Err(_) => "other network error".to_string(),
        };
        *self.failures.lock().unwrap().entry(format!("{what}: {why}")).or_default() += 1;
    }
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// What the swarm's nodes share.
struct Swarm {
    http: Client,
    slots: Semaphore,
    stats: Stats,
    stop: AtomicBool,
    /// Per node, ms from the server's spawn to its first spec applied (its status stored).
    ready_ms: Mutex<Vec<u64>>,
    /// Per node, ms from the server's spawn to its join answered.
    joined_ms: Mutex<Vec<u64>>,
    /// Per GPU UUID, when a spec with a new allocation on it arrived, and when the status reporting it applied was
    /// answered with an allocation activated.
    arrivals: Mutex<HashMap<String, Instant>>,
    /// Seconds of samples a telemetry batch carries.
    batch_s: u64,
    applied: Mutex<Vec<(String, String, Instant)>>,
    /// Batch round trips in the sustained window, µs (from waiting for a slot to the answer).
    rtts: Mutex<Vec<u32>>,
    record_rtts: AtomicBool,
    spawned: Instant,
    heartbeat: tungstenite::Message,
    status_every: Option<Duration>,
}

struct Node {
    index: usize,
    /// The replica it speaks to.
    base: String,
    name: String,
    token: String,
    gpus: Vec<String>,
}

impl Node {
    fn inventory(&self) -> Inventory {
        Inventory {
            hostname: self.name.clone(),
            agent_version: "bench-swarm".into(),
            backend: "sim".into(),
            driver_version: Some("570.00".into()),
            cuda_version: Some("12.8".into()),
            gpus: self
                .gpus
                .iter()
                .enumerate()
                .map(|(i, uuid)| GpuInventory {
                    index: i as u32,
                    uuid: uuid.clone(),
                    name: "NVIDIA H100 80GB HBM3".into(),
                    pci_device_id: None,
                    memory_mib: 81_559,
                    mig_capable: true,
                    mig_enabled: false,
                    mig_pending: None,
                    instances: Vec::new(),
                })
                .collect(),
        }
    }

    /// The status of a node that applied `spec` (whole GPUs: nothing to create, the sharing taken as given).
    fn status(&self, generation: i64, spec: Option<&NodeSpec>) -> NodeStatus {
        NodeStatus {
            observed_generation: generation,
            applying: false,
            errors: Vec::new(),
            gpus: self
                .gpus
                .iter()
                .map(|uuid| GpuStatus {
                    uuid: uuid.clone(),
                    mig_enabled: false,
                    instances: Vec::new(),
                    sharing: spec.and_then(|s| s.gpus.iter().find(|g| g.uuid == *uuid)).map(|g| g.sharing.clone()),
                    errors: Vec::new(),
                    health: None,
                    processes: Vec::new(),
                })
                .collect(),
        }
    }
}

/// Whether an answer or failure is one the agent sends again after a while.
fn retryable(status: StatusCode) -> bool {
    status.is_server_error() || matches!(status.as_u16(), 401 | 403 | 408 | 429)
}

/// Joins, retrying as the agent does; the credential, or `None` when refused.
async fn join(swarm: &Swarm, node: &Node) -> Option<String> {
    // The credential proposed, as the agent does: a join whose answer is lost is sent again and answered alike.
    let credential = format!("tsn_{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
    let body = serde_json::to_vec(&JoinRequest {
        token: node.token.clone(),
        inventory: node.inventory(),
        credential: Some(credential),
    })
    .unwrap();
    let mut attempt = 0;
    loop {
        let answer = {
            let _slot = swarm.slots.acquire().await.unwrap();
            swarm
                .http
                .post(format!("{}/api/v1/agent/join", node.base))
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await
        };
        match answer {
            Ok(r) if r.status().is_success() => match r.json::<Joined>().await {
                Ok(joined) => return Some(joined.credential),
                Err(_) => add(&swarm.stats.join_retries, 1),
            },
            Ok(r) if r.status().is_server_error() || matches!(r.status().as_u16(), 408 | 429) => {
                add(&swarm.stats.join_retries, 1);
            }
            Ok(r) => {
                let status = r.status();
                // The first few only: a join storm may have many.
                if swarm.stats.join_refused.fetch_add(1, Ordering::Relaxed) < 5 {
                    let retried = if attempt > 0 { format!(" (attempt {})", attempt + 1) } else { String::new() };
                    println!(
                        "  join of {} refused{retried}: {status} {}",
                        node.name,
                        r.text().await.unwrap_or_default()
                    );
                }
                return None;
            }
            Err(e) => {
                add(&swarm.stats.join_retries, 1);
                if e.is_timeout() {
                    add(&swarm.stats.join_timeouts, 1);
                }
            }
        }
        tokio::time::sleep(tessera_agent::agent::backoff(attempt)).await;
        attempt += 1;
    }
}

/// Sends a status; the server's answer.
async fn send_status(swarm: &Swarm, base: &str, credential: &str, status: &NodeStatus) -> Option<StatusOutcome> {
    let answer = {
        let _slot = swarm.slots.acquire().await.unwrap();
        swarm.http.put(format!("{base}/api/v1/agent/status")).bearer_auth(credential).json(status).send().await
    };
    add(&swarm.stats.statuses, 1);
    match answer {
        Ok(r) if r.status().is_success() => r.json().await.ok(),
        other => {
            add(&swarm.stats.status_errors, 1);
            swarm.stats.failed("status", &other);
            None
        }
    }
}

/// One simulated node: join, then the push channel (and the telemetry beside it), until the swarm stops.
async fn run_node(swarm: Arc<Swarm>, node: Node) {
    let Some(credential) = join(&swarm, &node).await else { return };
    add(&swarm.stats.joined, 1);
    swarm.joined_ms.lock().unwrap().push(swarm.spawned.elapsed().as_millis() as u64);
    let node = Arc::new(node);
    let telemetry = tokio::spawn(telemetry(swarm.clone(), node.clone(), credential.clone()));
    let mut attempt = 0;
    let mut applied: Option<NodeSpec> = None;
    let mut ready = false;
    while !swarm.stop.load(Ordering::Relaxed) {
        if push_channel(&swarm, &node, &credential, &mut applied, &mut ready).await {
            attempt = 0;
        } else {
            tokio::time::sleep(tessera_agent::agent::backoff(attempt)).await;
            attempt += 1;
        }
    }
    let _ = telemetry.await;
}

/// One WebSocket session; whether it was up.
async fn push_channel(
    swarm: &Swarm,
    node: &Node,
    credential: &str,
    applied: &mut Option<NodeSpec>,
    ready: &mut bool,
) -> bool {
    let url = format!("{}/api/v1/agent/ws", node.base.replacen("http", "ws", 1));
    let mut request = url.as_str().into_client_request().unwrap();
    request.headers_mut().insert("authorization", format!("Bearer {credential}").parse().unwrap());
    // Small buffers (they grow for a larger message): ten thousand sockets stay cheap.
    let config = tungstenite::protocol::WebSocketConfig::default().read_buffer_size(4096).write_buffer_size(0);
    let connected = {
        let _slot = swarm.slots.acquire().await.unwrap();
        tokio::time::timeout(
            Duration::from_secs(10),
            tokio_tungstenite::connect_async_with_config(request, Some(config), true),
        )
        .await
    };
    let mut socket = match connected {
        Ok(Ok((socket, _))) => socket,
        _ => {
            add(&swarm.stats.ws_failed, 1);
            return false;
        }
    };
    add(&swarm.stats.ws_connects, 1);
    // Heartbeats at the agent's interval, each node at its own point of it.
    let every = Duration::from_secs(5);
    let first = tokio::time::Instant::now() + Duration::from_millis(spread(node.index as u64 ^ 0x5eed, 5000));
    let mut beat = tokio::time::interval_at(first, every);
    let status_every = swarm.status_every.unwrap_or(Duration::from_secs(3600 * 24 * 365));
    let mut report = tokio::time::interval_at(
        tokio::time::Instant::now() + Duration::from_millis(spread(node.index as u64 ^ 0x57a7, 30_000)) + status_every,
        status_every,
    );
    let mut stop_check = tokio::time::interval(Duration::from_millis(500));
    let silent_limit = every * 3 + Duration::from_secs(30);
    loop {
        tokio::select! {
            _ = beat.tick() => {
                if socket.send(swarm.heartbeat.clone()).await.is_err() {
                    add(&swarm.stats.ws_closed, 1);
                    return true;
                }
                add(&swarm.stats.heartbeats, 1);
            }
            _ = report.tick(), if swarm.status_every.is_some() => {
                let generation = applied.as_ref().map_or(0, |s| s.generation);
                send_status(swarm, &node.base, credential, &node.status(generation, applied.as_ref())).await;
            }
            _ = stop_check.tick() => {
                if swarm.stop.load(Ordering::Relaxed) {
                    let _ = socket.close(None).await;
                    return true;
                }
            }
            got = tokio::time::timeout(silent_limit, socket.next()) => match got {
                Ok(Some(Ok(tungstenite::Message::Text(text)))) => {
                    let Ok(ServerMessage::Spec { spec }) = serde_json::from_str::<ServerMessage>(&text) else {
                        continue;
                    };
                    if applied.as_ref().is_some_and(|a| a.generation >= spec.generation) {
                        continue;
                    }
                    add(&swarm.stats.specs, 1);
                    let arrived = Instant::now();
                    // GPUs with an allocation this node has not seen before.
                    let fresh: Vec<String> = spec
                        .gpus
                        .iter()
                        .filter(|g| {
                            g.allocations.iter().any(|a| {
                                !applied.as_ref().is_some_and(|old| {
                                    old.gpus.iter().any(|o| o.allocations.iter().any(|x| x.allocation == a.allocation))
                                })
                            })
                        })
                        .map(|g| g.uuid.clone())
                        .collect();
                    if !fresh.is_empty() {
                        let mut arrivals = swarm.arrivals.lock().unwrap();
                        for uuid in &fresh {
                            arrivals.entry(uuid.clone()).or_insert(arrived);
                        }
                    }
                    let outcome = send_status(swarm, &node.base, credential, &node.status(spec.generation, Some(&spec))).await;
                    *applied = Some(spec);
                    if let Some(outcome) = outcome {
                        if outcome.stored && !*ready {
                            *ready = true;
                            add(&swarm.stats.ready, 1);
                            swarm.ready_ms.lock().unwrap().push(swarm.spawned.elapsed().as_millis() as u64);
                        }
                        if outcome.activated > 0 {
                            let now = Instant::now();
                            let mut done = swarm.applied.lock().unwrap();
                            for uuid in fresh {
                                done.push((uuid, node.name.clone(), now));
                            }
                        }
                    }
                }
                Ok(Some(Ok(tungstenite::Message::Close(_))) | None | Some(Err(_))) | Err(_) => {
                    add(&swarm.stats.ws_closed, 1);
                    return true;
                }
                Ok(Some(Ok(_))) => {}
            },
        }
    }
}

/// Samples the node's GPUs once a second at its own offset into the second and sends each second's batch, as the
/// agent does by default; a batch that fails is kept and sent again with the next (up to [`BUFFER`] samples).
async fn telemetry(swarm: Arc<Swarm>, node: Arc<Node>, credential: String) {
    let offset = 100 + spread(node.index as u64, 800) as i64;
    let mut pending: Vec<Vec<Sample>> = vec![Vec::new(); node.gpus.len()];
    let url = format!("{}/api/v1/agent/telemetry", node.base);
    let mut dropped = 0u64;
    let mut tick = 0u64;
    // The first batch at this node's own second of the `--batch-s` period.
    let mut due = (swarm.batch_s - node.index as u64 % swarm.batch_s) % swarm.batch_s;
    let mut every = swarm.batch_s;
    while !swarm.stop.load(Ordering::Relaxed) {
        tokio::time::sleep(tessera_agent::telemetry::until_next(now_ms(), 1000, offset)).await;
        if swarm.stop.load(Ordering::Relaxed) {
            break;
        }
        let t = now_ms();
        for (k, samples) in pending.iter_mut().enumerate() {
            if samples.len() >= BUFFER / GPUS {
                samples.remove(0);
                dropped += 1;
                add(&swarm.stats.dropped, 1);
            }
            let util = spread(node.index as u64 * 131 + k as u64 * 7 + (t / 1000) as u64 / 5, 101) as f32;
            samples.push(Sample {
                t,
                util,
                mem_used_mib: 400.0 + util * 700.0,
                mem_total_mib: 81_559.0,
                power_w: Some(70.0 + util * 6.3),
                temp_c: Some(35.0 + util / 4.0),
            });
        }
        add(&swarm.stats.taken, node.gpus.len() as u64);
        // A batch every `--batch-s` seconds (the agent's `--telemetry-batch-ms`), each node at its own second, or
        // less often when the server's last answer asked for it (`next_batch_ms`), as the agent does.
        tick += 1;
        if tick < due {
            continue;
        }
        let batch = TelemetryBatch {
            dropped,
            devices: node
                .gpus
                .iter()
                .zip(&pending)
                .map(|(uuid, samples)| DeviceSeries {
                    device: uuid.clone(),
                    gpu: uuid.clone(),
                    profile: None,
                    start: None,
                    samples: samples.clone(),
                })
                .collect(),
        };
        let count: u64 = pending.iter().map(|s| s.len() as u64).sum();
        let body = tessera_agent::telemetry::encode(&batch);
        let started = Instant::now();
        let answer = {
            let _slot = swarm.slots.acquire().await.unwrap();
            swarm
                .http
                .post(&url)
                .bearer_auth(&credential)
                .header("content-type", "application/json")
                .header("content-encoding", "gzip")
                .body(body)
                .send()
                .await
        };
        add(&swarm.stats.batches, 1);
        if !answer.as_ref().is_ok_and(|r| r.status().is_success()) {
            swarm.stats.failed("batch", &answer);
        }
        let outcome = match answer {
            Ok(r) if r.status().is_success() => r.json::<TelemetryAccepted>().await.map_err(|_| true),
            Ok(r) => Err(retryable(r.status())),
            Err(_) => Err(true),
        };
        if swarm.record_rtts.load(Ordering::Relaxed) {
            let us = u32::try_from(started.elapsed().as_micros()).unwrap_or(u32::MAX);
            swarm.rtts.lock().unwrap().push(us);
        }
        match outcome {
            Ok(a) => {
                add(&swarm.stats.accepted, a.accepted);
                add(&swarm.stats.rejected, a.rejected);
                swarm.stats.asked_max_ms.fetch_max(a.next_batch_ms.unwrap_or(0), Ordering::Relaxed);
                let asked = tessera_agent::agent::paced(Duration::from_secs(swarm.batch_s), a.next_batch_ms);
                every = asked.as_secs_f64().round().max(1.0) as u64;
                pending.iter_mut().for_each(Vec::clear);
            }
            Err(again) => {
                add(&swarm.stats.batch_errors, 1);
                if !again {
                    add(&swarm.stats.dropped, count);
                    dropped += count;
                    pending.iter_mut().for_each(Vec::clear);
                }
            }
        }
        due = tick + every;
    }
    add(&swarm.stats.pending, pending.iter().map(|s| s.len() as u64).sum());
}

// ---------------------------------------------------------------------------------------------------------------
// Approvals

struct Approvals {
    applied_ms: Vec<f64>,
    arrived_ms: Vec<f64>,
    /// From sending the approval to its answer.
    answered_ms: Vec<f64>,
    not_applied: usize,
    not_active: usize,
    /// Creations or approvals that failed (not answered within 120 s, or refused).
    failed: usize,
    nodes: usize,
}

/// Creates and approves `m` whole-GPU requests one after another; per request, from sending the approval to the
/// node's status answer saying its allocation turned active (and to the spec's arrival on the node's socket).
async fn approvals(server: &Server, swarm: &Swarm, m: usize) -> Approvals {
    let mut out = Approvals {
        applied_ms: Vec::new(),
        arrived_ms: Vec::new(),
        answered_ms: Vec::new(),
        not_applied: 0,
        not_active: 0,
        failed: 0,
        nodes: 0,
    };
    if m == 0 {
        return out;
    }
    let (s, tenant) = server.call(reqwest::Method::POST, "/api/v1/tenants", Some(json!({"name": "swarm"}))).await;
    assert!(s.is_success(), "{tenant}");
    let tenant = tenant["id"].as_str().unwrap().to_string();
    let (s, v) = server
        .call(
            reqwest::Method::PUT,
            &format!("/api/v1/tenants/{tenant}/quotas"),
            Some(json!({"limits": {"compute_slices": 10_000_000}})),
        )
        .await;
    assert!(s.is_success(), "{v}");
    let mut ids = Vec::new();
    let mut nodes = std::collections::HashSet::new();
    for _ in 0..m {
        let ask = json!({"tenant": tenant, "spec": {"mode": "exclusive", "model": "H100-80GB"}, "count": 1});
        let (s, request) = server.call(reqwest::Method::POST, "/api/v1/requests", Some(ask)).await;
        if s != StatusCode::CREATED {
            println!("  request not created: {s} {request}");
            out.failed += 1;
            continue;
        }
        let id = request["id"].as_str().unwrap().to_string();
        // One approval at a time: the next allocation a node reports applied is this one's.
        let seen = swarm.applied.lock().unwrap().len();
        let t0 = Instant::now();
        let (s, approval) = server.call(reqwest::Method::POST, &format!("/api/v1/requests/{id}/approve"), None).await;
        out.answered_ms.push(t0.elapsed().as_secs_f64() * 1000.0);
        if s != StatusCode::OK {
            println!("  request not approved: {s} {approval}");
            out.failed += 1;
            continue;
        }
        let limit = Duration::from_secs(30);
        let applied = loop {
            if let Some((uuid, node, at)) = swarm.applied.lock().unwrap().get(seen).cloned() {
                nodes.insert(node);
                break Some((uuid, at));
            }
            if t0.elapsed() > limit {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        match applied {
            Some((uuid, at)) => {
                out.applied_ms.push(at.saturating_duration_since(t0).as_secs_f64() * 1000.0);
                if let Some(at) = swarm.arrivals.lock().unwrap().get(&uuid) {
                    out.arrived_ms.push(at.saturating_duration_since(t0).as_secs_f64() * 1000.0);
                }
            }
            None => out.not_applied += 1,
        }
        ids.push(id);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for id in ids {
        let (_, r) = server.call(reqwest::Method::GET, &format!("/api/v1/requests/{id}"), None).await;
        if r["state"] != "active" {
            println!("  request {id} is {} after the run", r["state"]);
            out.not_active += 1;
        }
    }
    out.nodes = nodes.len();
    out
}

// ---------------------------------------------------------------------------------------------------------------
// The run

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

async fn run(args: Args) {
    let n = args.agents;
    // Each agent holds a WebSocket; the swarm's HTTP requests share at most `in_flight` more connections.
    let max_connections = n + args.in_flight + 512;
    let ticks = clock_ticks();
    let binary = args.server.clone().unwrap_or_else(|| env!("CARGO_BIN_EXE_tessera").to_string());
    let dir = std::env::temp_dir().join(format!("tessera-bench-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let admin = new_token_secret();
    // The join tokens are made through the API by a first run of the server on the same database (ten thousand do
    // not fit in `TESSERA_BOOTSTRAP_JOIN_TOKENS`: one environment variable holds at most 128 KiB); the measured
    // start is the server's next, with an empty fleet.
    let scratch = match &args.postgres {
        Some(url) => Some(ScratchDb::create(url).await),
        None => None,
    };
    let database =
        scratch.as_ref().map_or_else(|| format!("sqlite://{}", dir.join("bench.db").display()), |s| s.url.clone());
    let made = Instant::now();
    let first = Server::start(&binary, &dir, &database, "first.log", &admin, max_connections, false);
    let tokens = join_tokens(&first, n).await;
    first.stop();
    let made = made.elapsed();
    let replicas: Vec<Server> = (0..args.replicas)
        .map(|r| {
            let log = format!("server-{r}.log");
            Server::start(&binary, &dir, &database, &log, &admin, max_connections, r == 0)
        })
        .collect();
    let server = &replicas[0];
    let pid = replicas.iter().map(|s| s.pid().to_string()).collect::<Vec<_>>().join(",");
    let postgres = if scratch.is_some() { postgres_pids() } else { String::new() };
    let me = std::process::id().to_string();
    let http = Client::builder()
        .timeout(Duration::from_secs(40))
        .connect_timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(args.in_flight)
        .tcp_nodelay(true)
        .build()
        .unwrap();
    let heartbeat = tungstenite::Message::Text(serde_json::to_string(&AgentMessage::Heartbeat).unwrap().into());
    let swarm = Arc::new(Swarm {
        http,
        slots: Semaphore::new(args.in_flight),
        stats: Stats::default(),
        stop: AtomicBool::new(false),
        ready_ms: Mutex::new(Vec::with_capacity(n)),
        joined_ms: Mutex::new(Vec::with_capacity(n)),
        arrivals: Mutex::default(),
        applied: Mutex::default(),
        rtts: Mutex::default(),
        record_rtts: AtomicBool::new(false),
        spawned: server.spawned,
        heartbeat,
        status_every: (args.status_s > 0).then(|| Duration::from_secs(args.status_s)),
        batch_s: args.batch_s,
    });
    println!(
        "swarm: {n} simulated agents x {GPUS} whole H100s = {} devices; {}, {} cores here, shared by server and \
         swarm; at most {} swarm requests in flight; a telemetry batch every {} s",
        n * GPUS,
        match (&args.postgres, args.replicas) {
            (None, _) => "one server process (SQLite)".to_string(),
            (Some(_), 1) => "one server process (PostgreSQL on this machine)".to_string(),
            (Some(_), r) =>
                format!("{r} server processes on one PostgreSQL database (on this machine), node i on replica i % {r}"),
        },
        std::thread::available_parallelism().map_or(0, |p| p.get()),
        args.in_flight,
        args.batch_s
    );
    println!(
        "  {n} join tokens made by an admin in a first run of the server ({:.1} s); the server started again on \
         that database: listening {:.2} s after its spawn",
        made.as_secs_f64(),
        server.listening.as_secs_f64()
    );

    // The server's resident memory every 250 ms, for the peak and when it came (the minute samples and VmHWM tell
    // neither).
    let rss_peak = Arc::new(Mutex::new((0.0f64, 0.0f64)));
    let rss_sampler = {
        let (pid, peak, spawned) = (pid.clone(), rss_peak.clone(), server.spawned);
        tokio::spawn(async move {
            loop {
                let (rss, _) = rss_mib(&pid);
                {
                    let mut p = peak.lock().unwrap();
                    if rss > p.0 {
                        *p = (rss, spawned.elapsed().as_secs_f64());
                    }
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };

    // 1. Join from a cold start: every agent at once, as a fleet that waited for its server.
    let cpu0 = cpu_ticks(&pid);
    let mut tasks = Vec::with_capacity(n);
    for (i, token) in tokens.into_iter().enumerate() {
        let node = Node {
            index: i,
            name: format!("swarm-{i:05}"),
            token,
            base: replicas[i % replicas.len()].base.clone(),
            gpus: (0..GPUS).map(|_| format!("GPU-{}", uuid::Uuid::new_v4())).collect(),
        };
        tasks.push(tokio::spawn(run_node(swarm.clone(), node)));
    }
    let join_limit = Duration::from_secs(args.join_limit_s.unwrap_or(if args.quick { 120 } else { 600 }));
    let join_started = Instant::now();
    let mut last_print = Instant::now();
    loop {
        let (ready, joined) = (get(&swarm.stats.ready), get(&swarm.stats.joined));
        if ready as usize + get(&swarm.stats.join_refused) as usize >= n {
            break;
        }
        if join_started.elapsed() > join_limit {
            println!("  only {joined} joined and {ready} ready after {join_limit:?}");
            break;
        }
        if last_print.elapsed() > Duration::from_secs(10) {
            last_print = Instant::now();
            println!(
                "  ... {:.0} s: {joined} joined, {ready} ready, {} join retries, server RSS {:.0} MiB",
                server.spawned.elapsed().as_secs_f64(),
                get(&swarm.stats.join_retries),
                rss_mib(&pid).0
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let join_cpu = (cpu_ticks(&pid) - cpu0) as f64 / ticks;
    let join_ended_s = server.spawned.elapsed().as_secs_f64();
    let join_wall = join_started.elapsed().as_secs_f64();
    let joined_ms = sorted(swarm.joined_ms.lock().unwrap().iter().map(|&v| v as f64 / 1000.0).collect());
    let ready_ms = sorted(swarm.ready_ms.lock().unwrap().iter().map(|&v| v as f64 / 1000.0).collect());
    let (join_rss, _) = rss_mib(&pid);

    // Let the join's wave settle (every node's telemetry going) before the window.
    tokio::time::sleep(Duration::from_secs(if args.quick { 3 } else { 10 })).await;

    // 2 and 3. The sustained window, with the approvals in its first part.
    let window = Duration::from_secs(args.seconds);
    let stats = &swarm.stats;
    let before = (get(&stats.taken), get(&stats.accepted), get(&stats.rejected), get(&stats.batch_errors));
    let (hb0, st0, ste0, b0) =
        (get(&stats.heartbeats), get(&stats.statuses), get(&stats.status_errors), get(&stats.batches));
    let (ws_closed0, ws_failed0) = (get(&stats.ws_closed), get(&stats.ws_failed));
    let (server_cpu0, my_cpu0) = (cpu_ticks(&pid), cpu_ticks(&me));
    // PostgreSQL's processes as they are at the window's start (a backend started later is not counted).
    let postgres_cpu0 = if postgres.is_empty() { 0 } else { cpu_ticks(&postgres) };
    let started = Instant::now();
    swarm.record_rtts.store(true, Ordering::Relaxed);
    let approving = approvals(server, &swarm, args.approvals);
    let sampling = async {
        let mut peak_rss: f64 = 0.0;
        let mut rows = Vec::new();
        let step = Duration::from_secs((args.seconds / 10).max(5));
        let (mut last_cpu, mut last_t, mut last_acc) = (cpu_ticks(&pid), Instant::now(), get(&stats.accepted));
        while started.elapsed() < window {
            tokio::time::sleep(step.min(window.saturating_sub(started.elapsed())).max(Duration::from_millis(10))).await;
            let (rss, _) = rss_mib(&pid);
            peak_rss = peak_rss.max(rss);
            let (cpu, acc) = (cpu_ticks(&pid), get(&stats.accepted));
            let secs = last_t.elapsed().as_secs_f64();
            // The longest batch interval the server asked of its agents meanwhile.
            let pace = match stats.asked_max_ms.swap(0, Ordering::Relaxed) {
                0 => String::new(),
                ms => format!("  asked a batch every {:.1} s at most", ms as f64 / 1000.0),
            };
            rows.push(format!(
                "  {:>5.0} s  server {:.2} cores  RSS {rss:.0} MiB  accepted {:.0} samples/s  batch errors {}{pace}",
                started.elapsed().as_secs_f64(),
                (cpu - last_cpu) as f64 / ticks / secs,
                (acc - last_acc) as f64 / secs,
                get(&stats.batch_errors) - before.3
            ));
            println!("{}", rows.last().unwrap());
            (last_cpu, last_t, last_acc) = (cpu, Instant::now(), acc);
        }
        peak_rss
    };
    let (approved, peak_rss) = tokio::join!(approving, sampling);
    let secs = started.elapsed().as_secs_f64();
    swarm.record_rtts.store(false, Ordering::Relaxed);
    let server_cores = (cpu_ticks(&pid) - server_cpu0) as f64 / ticks / secs;
    let postgres_cores = if postgres.is_empty() {
        None
    } else {
        Some(cpu_ticks(&postgres).saturating_sub(postgres_cpu0) as f64 / ticks / secs)
    };
    let my_cores = (cpu_ticks(&me) - my_cpu0) as f64 / ticks / secs;
    let after = (get(&stats.taken), get(&stats.accepted), get(&stats.rejected), get(&stats.batch_errors));
    let (rss, hwm) = rss_mib(&pid);
    let (my_rss, _) = rss_mib(&me);
    let window_from = server.spawned.elapsed().as_secs_f64() - secs;
    let heartbeats = get(&stats.heartbeats) - hb0;
    let statuses = get(&stats.statuses) - st0;
    let status_errors = get(&stats.status_errors) - ste0;
    let batches = get(&stats.batches) - b0;
    let (ws_closed, ws_failed) = (get(&stats.ws_closed) - ws_closed0, get(&stats.ws_failed) - ws_failed0);
    let connected_before_stop = get(&stats.ws_connects) - get(&stats.ws_closed);

    // Stop the swarm: every node sends its last batch and closes its socket; then the server's own counters.
    swarm.stop.store(true, Ordering::Relaxed);
    let drain = Instant::now();
    for t in tasks {
        if tokio::time::timeout(Duration::from_secs(60).saturating_sub(drain.elapsed()), t).await.is_err() {
            println!("  a node did not stop within 60 s");
            break;
        }
    }
    rss_sampler.abort();
    let (peak_at_mib, peak_at_s) = *rss_peak.lock().unwrap();
    // Each replica's own counters, summed.
    let mut texts = Vec::new();
    for (r, replica) in replicas.iter().enumerate() {
        let asked = Instant::now();
        let metrics = replica.client.get(format!("{}/metrics", replica.base)).bearer_auth(&replica.admin).send().await;
        let metrics = match metrics {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(e) => {
                println!("  /metrics: {e}");
                String::new()
            }
        };
        println!(
            "  /metrics of replica {r} (every series of the fleet) answered in {:.0} ms, {:.1} MB; it ran {} ms late \
             at most in the last second",
            asked.elapsed().as_secs_f64() * 1000.0,
            metrics.len() as f64 / 1e6,
            metric(&metrics, "tessera_runtime_lateness_seconds").map_or("?".to_string(), |s| format!("{:.0}", s * 1e3))
        );
        texts.push(metrics);
    }
    let summed = |name: &str| {
        texts.iter().filter_map(|t| metric(t, name)).fold(None, |sum: Option<f64>, v| Some(sum.unwrap_or(0.0) + v))
    };
    let server_accepted = summed("tessera_telemetry_samples_total");
    let server_rejected = summed("tessera_telemetry_rejected_samples_total");
    let series_limit = summed("tessera_telemetry_refused_series_total{reason=\"series_limit\"}");
    let not_owned = summed("tessera_telemetry_refused_series_total{reason=\"not_owned\"}");
    let series = summed("tessera_telemetry_series");
    let lost_rows = summed("tessera_telemetry_lost_minute_rows_total");
    let (taken, accepted, rejected) = (get(&stats.taken), get(&stats.accepted), get(&stats.rejected));
    let (pending, dropped) = (get(&stats.pending), get(&stats.dropped));
    let (mut log_lines, mut log_first) = (0, Vec::new());
    for replica in &replicas {
        let (lines, first) = replica.log_summary();
        log_lines += lines;
        log_first.extend(first.into_iter().take(6usize.saturating_sub(log_first.len())));
    }

    // The report.
    let fmt = |v: Option<f64>| v.map_or("?".to_string(), |v| format!("{v:.0}"));
    let q = |v: &[f64], p: f64| quantile(v, p);
    let applied_ms = sorted(approved.applied_ms.clone());
    let arrived_ms = sorted(approved.arrived_ms.clone());
    let answered_ms = sorted(approved.answered_ms.clone());
    let rtts = sorted(swarm.rtts.lock().unwrap().iter().map(|&us| f64::from(us) / 1000.0).collect());
    let window_taken = after.0 - before.0;
    let window_accepted = after.1 - before.1;
    println!();
    println!("| goal | measured |");
    println!("|---|---|");
    println!(
        "| {n} agents join within 2 min of a cold start, none refused | last join answered {:.1} s after the \
         server's spawn (p50 {:.1} s), last node connected with its first spec applied {:.1} s after it (p50 \
         {:.1} s, p95 {:.1} s); {} of {n} joined, {} ready; {} refused, {} join attempts retried (5xx, 429, \
         network; {} of them not answered within 40 s), {} WebSocket connects failed; server CPU {:.1} s over the \
         {:.1} s, RSS {join_rss:.0} MiB after |",
        q(&joined_ms, 1.0),
        q(&joined_ms, 0.5),
        q(&ready_ms, 1.0),
        q(&ready_ms, 0.5),
        q(&ready_ms, 0.95),
        joined_ms.len(),
        ready_ms.len(),
        get(&stats.join_refused),
        get(&stats.join_retries),
        get(&stats.join_timeouts),
        get(&stats.ws_failed),
        join_cpu,
        join_wall + server.listening.as_secs_f64(),
    );
    println!(
        "| approval -> applied p95 < 1 s | {} whole-GPU approvals one after another on {} nodes: p50 {:.0} ms, \
         p95 {:.0} ms, max {:.0} ms (the approval answered p50 {:.0} ms, p95 {:.0} ms; the spec on the node's \
         socket p50 {:.0} ms, p95 {:.0} ms); {} not applied within 30 s, {} not `active` when read back, {} \
         creations or approvals failed |",
        args.approvals,
        approved.nodes,
        q(&applied_ms, 0.5),
        q(&applied_ms, 0.95),
        q(&applied_ms, 1.0),
        q(&answered_ms, 0.5),
        q(&answered_ms, 0.95),
        q(&arrived_ms, 0.5),
        q(&arrived_ms, 0.95),
        approved.not_applied,
        approved.not_active,
        approved.failed,
    );
    println!(
        "| {} devices' heartbeats and 1 Hz telemetry for 10 min, server < 1.5 cores | {:.0} s window: server \
         {server_cores:.2} cores (utime + stime){}; {batches} batches ({:.0}/s), {heartbeats} heartbeats, {statuses} \
         status reports ({status_errors} failed); batch round trip p50 {:.1} ms, p95 {:.1} ms, max {:.0} ms |",
        n * GPUS,
        secs,
        postgres_cores.map_or(String::new(), |c| format!(", PostgreSQL {c:.2} cores beside it")),
        batches as f64 / secs,
        q(&rtts, 0.5),
        q(&rtts, 0.95),
        q(&rtts, 1.0),
    );
    println!(
        "| server RSS < 2 GB | {rss:.0} MiB at the window's end, {peak_rss:.0} MiB the most sampled in it, \
         peak {hwm:.0} MiB (VmHWM, the join included); sampled every 250 ms from the spawn to the stop: \
         {peak_at_mib:.0} MiB at most, {peak_at_s:.1} s after the spawn (the join ended at {:.1} s, the window ran \
         from {window_from:.1} s to {:.1} s) |",
        join_ended_s,
        window_from + secs
    );
    println!(
        "| no sample lost while the server is up | in the window {window_taken} taken, {window_accepted} accepted \
         ({:.0}/s of {} expected), {} refused, {} batches failed; whole run: {taken} taken, {accepted} accepted, \
         {rejected} refused by the server, {pending} not delivered at the stop, {dropped} dropped; server counted \
         {} accepted, {} refused, {} series in its window, series refused: {} over its series limit, {} not \
         owned; minute rows lost {} |",
        window_accepted as f64 / secs,
        n * GPUS,
        after.2 - before.2,
        after.3 - before.3,
        fmt(server_accepted),
        fmt(server_rejected),
        fmt(series),
        fmt(series_limit),
        fmt(not_owned),
        fmt(lost_rows),
    );
    println!(
        "| (the swarm) | {my_cores:.2} cores, RSS {my_rss:.0} MiB for {n} agents; {} WebSockets up at the end, {ws_closed} \
         closed and {ws_failed} connects failed in the window |",
        connected_before_stop
    );
    println!(
        "server log: {log_lines} warnings and errors{}",
        if log_first.is_empty() { String::new() } else { format!(", first kinds:\n  {}", log_first.join("\n  ")) }
    );
    let failures = stats.failures.lock().unwrap().clone();
    if !failures.is_empty() {
        let list: Vec<String> = failures.iter().map(|(why, n)| format!("{n} {why}")).collect();
        println!("failed batches and statuses, whole run: {}", list.join(", "));
    }
    let total = std::thread::available_parallelism().map_or(2.0, |p| p.get() as f64);
    if server_cores + my_cores > total * 0.9 {
        println!(
            "note: server and swarm together used {:.2} of this machine's {total:.0} cores: the machine was the \
             limit, so latencies include waiting for a core, and the server's CPU is what it used when it could \
             run.",
            server_cores + my_cores
        );
    }

    if args.quick {
        assert_eq!(get(&stats.join_refused), 0, "no join refused");
        assert_eq!(ready_ms.len(), n, "every node joined and applied its first spec");
        assert_eq!(approved.not_applied, 0, "every approval applied");
        assert_eq!(approved.not_active, 0, "every approved request active");
        assert_eq!(approved.failed, 0, "every request created and approved");
        assert_eq!(rejected, 0, "no sample refused");
        assert_eq!(dropped, 0, "no sample dropped");
        assert_eq!(pending, 0, "every sample delivered");
        assert_eq!(accepted, taken, "every sample taken was accepted");
        assert_eq!(server_accepted, Some(accepted as f64), "the server counted what it answered");
    }
    drop(replicas);
    if let Some(db) = scratch {
        db.drop().await;
    }
}

fn main() {
    let args = Args::parse();
    if cfg!(debug_assertions) {
        println!("Unoptimised build (`--profile dev`): the server's CPU and latencies are an unoptimised server's.");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(run(args));
}
