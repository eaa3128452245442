//! The agent's life: join (a join token exchanged once for a node credential, kept in the state directory) or
//! report the inventory again, then keep a push channel open — a WebSocket on which the server sends every new spec,
//! or HTTP long-polls where a WebSocket cannot be had — with heartbeats, and reconnects after jittered exponential
//! backoff. A separate task applies the newest spec and reports status after every apply, every
//! `status_every`, and again while some step still fails (e.g. an instance stays busy).
//!
//! The agent never acts on a spec older than the last one it applied (the applied generation is kept in the state
//! directory, so this holds across restarts too).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use tessera_core::api::{
    AgentMessage, Inventory, JoinRequest, Joined, NODE_CREDENTIAL_PREFIX, NodeSpec, NodeStatus, ServerMessage,
    node_credential_well_formed,
};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::backend::{Backend, GpuBackend, with_backend};
use crate::reconcile;

/// How the agent receives specs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// A WebSocket, falling back to long-polls when the server or a proxy refuses the upgrade.
    Auto,
    /// HTTP long-polls only.
    LongPoll,
}

/// Agent settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// The server's base URL, e.g. `https://tessera.example.com`.
    pub server: String,
    /// A join token, needed when the state directory has no credential yet.
    pub join_token: Option<String>,
    /// Where the credential and the applied generation are kept.
    pub state_dir: PathBuf,
    /// How specs arrive.
    pub transport: Transport,
    /// Heartbeat interval.
    pub heartbeat: Duration,
    /// Status is reported at least this often.
    pub status_every: Duration,
    /// A spec whose apply left errors is applied again after this long.
    pub retry_every: Duration,
    /// How often the GPUs' health is read between status reports; a change (a new XID, or a GPU judged otherwise)
    /// is reported at once.
    pub health_every: Duration,
    /// Telemetry sampling and sending; `None` sends none.
    pub telemetry: Option<crate::telemetry::TelemetryConfig>,
    /// `--kube` mode: the layout and sharing are put in effect through GPU Operator, the backend is only read.
    pub kube: Option<crate::kube::KubeApplier>,
    /// Where who runs each process is read, for a backend whose pids are the host's (NVML); `None` reports the
    /// processes as the backend gives them.
    pub attribution: Option<crate::attribution::Identifier>,
}

impl Config {
    /// Settings with the usual intervals.
    pub fn new(server: &str, join_token: Option<String>, state_dir: PathBuf) -> Config {
        Config {
            server: server.trim_end_matches('/').to_string(),
            join_token,
            state_dir,
            transport: Transport::Auto,
            heartbeat: Duration::from_secs(5),
            status_every: Duration::from_secs(30),
            retry_every: Duration::from_secs(5),
            health_every: Duration::from_secs(5),
            telemetry: Some(crate::telemetry::TelemetryConfig::default()),
            kube: None,
            attribution: None,
        }
    }
}

/// Why the agent stopped.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// No credential in the state directory and no join token given.
    #[error("no node credential in {0} and no join token: pass --join-token (an admin creates one)")]
    NotJoined(String),
    /// The server refused the join token or the credential.
    #[error("the server refused: {0}")]
    Refused(String),
    /// The state directory cannot be used.
    #[error("state directory: {0}")]
    State(String),
    /// The backend cannot read the GPUs.
    #[error("GPU backend: {0}")]
    Backend(String),
    /// An injected crash.
    #[error(transparent)]
    Crashed(#[from] reconcile::Crashed),
}

/// What the state directory keeps of the node's identity.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Credential {
    server: String,
    node_id: String,
    node_name: String,
    credential: String,
}

/// Runs the agent until it fails (it does not return otherwise).
pub async fn run(config: Config, backend: Box<dyn GpuBackend>) -> Result<(), AgentError> {
    std::fs::create_dir_all(&config.state_dir).map_err(|e| AgentError::State(e.to_string()))?;
    let backend: Backend = Arc::new(Mutex::new(backend));
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(40))
        .connect_timeout(Duration::from_secs(5))
        .pool_idle_timeout(tessera_core::api::CLIENT_IDLE_KEEP)
        .build()
        .map_err(|e| AgentError::State(e.to_string()))?;
    let cred = sign_in(&config, &http, &backend).await?;
    tracing::info!(node = %cred.node_name, id = %cred.node_id, "joined");
    let applied = read_applied(&config.state_dir);
    let (specs_tx, specs_rx) = watch::channel::<Option<NodeSpec>>(None);
    let known = Arc::new(std::sync::atomic::AtomicI64::new(applied));
    let telemetry = telemetry_loop(config.clone(), http.clone(), cred.clone(), backend.clone(), specs_rx.clone());
    let apply = apply_loop(config.clone(), http.clone(), cred.clone(), backend.clone(), specs_rx, known.clone());
    let receive = receive_loop(config.clone(), http.clone(), cred.clone(), specs_tx, known);
    tokio::select! {
        r = apply => r,
        r = receive => r,
        r = telemetry => r,
    }
}

/// Samples every device each `every`, at this agent's offset into the period of the wall clock, and sends what the
/// buffer holds right after the sample that makes a batch due (at most every `batch_every`, or the longer interval
/// the server's last answer asked for; a backlog goes in several batches, oldest first). Samples that cannot be
/// delivered stay in the bounded buffer.
async fn telemetry_loop(
    config: Config,
    http: reqwest::Client,
    cred: Credential,
    backend: Backend,
    specs: watch::Receiver<Option<NodeSpec>>,
) -> Result<(), AgentError> {
    let Some(tc) = config.telemetry else { return std::future::pending().await };
    let mut buffer = crate::telemetry::Buffer::new(tc.buffer);
    let (every_ms, offset_ms) = tc.schedule_ms();
    let mut sent_at: Option<tokio::time::Instant> = None;
    // What the server asked for last (never shorter than this agent's own interval).
    let mut batch_every = tc.batch_every;
    let mut warned = false;
    loop {
        tokio::time::sleep(crate::telemetry::until_next(now_ms(), every_ms, offset_ms)).await;
        let gpus = specs.borrow().as_ref().map(|s| s.gpus.clone()).unwrap_or_default();
        let now = now_ms();
        match with_backend(&backend, move |b| b.sample(now, &gpus)).await {
            Ok(readings) => buffer.push(readings),
            Err(e) => tracing::warn!(error = %e, "cannot sample the GPUs"),
        }
        // Due when the last batch went at least `batch_every` ago, give or take half a sampling period.
        if sent_at.is_some_and(|at| at.elapsed() + tc.every / 2 < batch_every) {
            continue;
        }
        sent_at = Some(tokio::time::Instant::now());
        while !buffer.is_empty() {
            let readings = buffer.take(tc.max_batch);
            let body = crate::telemetry::encode(&crate::telemetry::batch(&readings, buffer.dropped()));
            match send_telemetry(&config, &http, &cred, body).await {
                Ok(asked) => {
                    warned = false;
                    batch_every = paced(tc.batch_every, asked);
                }
                Err((false, e)) => {
                    tracing::warn!(error = %e, samples = readings.len(), "telemetry batch refused; dropped");
                    buffer.discard(readings.len());
                }
                Err((true, e)) => {
                    if !warned {
                        tracing::warn!(error = %e, waiting = buffer.len() + readings.len(), "telemetry not delivered; buffering");
                        warned = true;
                    }
                    buffer.put_back(readings);
                    break;
                }
            }
        }
    }
}

/// Now, in ms since the Unix epoch.
pub use tessera_core::clock::now_ms;

/// The interval to send batches at: the agent's own, or the longer one the server asked for (at most
/// [`MAX_PACED`]).
pub fn paced(own: Duration, asked_ms: Option<u64>) -> Duration {
    asked_ms.map_or(own, |ms| own.max(Duration::from_millis(ms).min(MAX_PACED)))
}

/// The longest interval a server's answer may set (a server asks for 30 s at most).
pub const MAX_PACED: Duration = Duration::from_secs(60);

/// Sends one batch; the interval the server asks for next, or an error that says whether sending it again may
/// succeed.
async fn send_telemetry(
    config: &Config,
    http: &reqwest::Client,
    cred: &Credential,
    body: Vec<u8>,
) -> Result<Option<u64>, (bool, String)> {
    let response = http
        .post(format!("{}/api/v1/agent/telemetry", config.server))
        .bearer_auth(&cred.credential)
        .header("content-type", "application/json")
        .header("content-encoding", "gzip")
        .body(body)
        .send()
        .await
        .map_err(|e| (true, e.to_string()))?;
    let status = response.status();
    if status.is_success() {
        let answer = response.json::<tessera_core::api::TelemetryAccepted>().await.ok();
        return Ok(answer.and_then(|a| a.next_batch_ms));
    }
    let again = status.is_server_error() || matches!(status.as_u16(), 401 | 403 | 408 | 429);
    Err((again, format!("HTTP {status}")))
}

fn credential_path(dir: &Path) -> PathBuf {
    dir.join("credential.json")
}

fn join_credential_path(dir: &Path) -> PathBuf {
    dir.join("join-credential")
}

/// The credential this node proposes when it joins: made once and kept in the state directory until a join is
/// answered, so that a join sent again (its answer lost, or the agent restarted meanwhile) is the same join and
/// the server answers it as it did the first time.
fn join_credential(dir: &Path) -> Result<String, AgentError> {
    let path = join_credential_path(dir);
    let kept = std::fs::read_to_string(&path).ok().map(|t| t.trim().to_string());
    if let Some(kept) = kept.filter(|k| node_credential_well_formed(k)) {
        return Ok(kept);
    }
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| AgentError::State(format!("no randomness: {e}")))?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let credential = format!("{NODE_CREDENTIAL_PREFIX}{hex}");
    write_secret(dir, &path, &credential)?;
    Ok(credential)
}

/// Writes a secret file readable by its owner only, whole or not at all.
fn write_secret(dir: &Path, path: &Path, text: &str) -> Result<(), AgentError> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("secret");
    let tmp = dir.join(format!("{name}.tmp"));
    std::fs::write(&tmp, text).map_err(|e| AgentError::State(e.to_string()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| AgentError::State(e.to_string()))?;
    }
    std::fs::rename(&tmp, path).map_err(|e| AgentError::State(e.to_string()))
}

fn read_applied(dir: &Path) -> i64 {
    std::fs::read_to_string(dir.join("applied-generation")).ok().and_then(|t| t.trim().parse().ok()).unwrap_or(0)
}

fn write_applied(dir: &Path, generation: i64) -> Result<(), AgentError> {
    let tmp = dir.join("applied-generation.tmp");
    std::fs::write(&tmp, generation.to_string())
        .and_then(|()| std::fs::rename(&tmp, dir.join("applied-generation")))
        .map_err(|e| AgentError::State(e.to_string()))
}

fn write_credential(dir: &Path, cred: &Credential) -> Result<(), AgentError> {
    let text = serde_json::to_string_pretty(cred).map_err(|e| AgentError::State(e.to_string()))?;
    write_secret(dir, &credential_path(dir), &text)
}

/// The delay before reconnect attempt `attempt` (0-based): exponential from 0.5 s up to 30 s, with "equal
/// jitter" (half fixed, half random) so that agents that lost the server together do not return together.
pub fn backoff(attempt: u32) -> Duration {
    let cap_ms = (500u64 << attempt.min(6)).min(30_000);
    Duration::from_millis(cap_ms / 2 + fastrand::u64(0..=cap_ms / 2))
}

/// Joins with the join token, or reports the inventory under the stored credential (joining again when the
/// credential was revoked and a join token is at hand). Retries while the server cannot be reached.
async fn sign_in(config: &Config, http: &reqwest::Client, backend: &Backend) -> Result<Credential, AgentError> {
    let mut attempt = 0;
    loop {
        let mut inventory =
            with_backend(backend, |b| b.inventory()).await.map_err(|e| AgentError::Backend(e.to_string()))?;
        if config.kube.is_some() {
            // The backend only reads; GPU Operator writes.
            inventory.backend = "kube".to_string();
        }
        let stored: Option<Credential> = std::fs::read_to_string(credential_path(&config.state_dir))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .filter(|c: &Credential| c.server == config.server);
        let result = match &stored {
            Some(cred) => report_inventory(config, http, cred, &inventory).await.map(|()| cred.clone()),
            None => match &config.join_token {
                Some(token) => join(config, http, token, inventory).await,
                None => return Err(AgentError::NotJoined(config.state_dir.display().to_string())),
            },
        };
        match result {
            Ok(cred) => return Ok(cred),
            Err(Attempt::Refused(detail)) if stored.is_some() && config.join_token.is_some() => {
                tracing::warn!(%detail, "the node credential was refused; joining again with the join token");
                let _ = std::fs::remove_file(credential_path(&config.state_dir));
                let _ = std::fs::remove_file(join_credential_path(&config.state_dir));
            }
            Err(Attempt::Refused(detail)) => return Err(AgentError::Refused(detail)),
            Err(Attempt::Fatal(e)) => return Err(e),
            Err(Attempt::Retry(detail)) => {
                let wait = backoff(attempt);
                tracing::warn!(%detail, ?wait, "server not reachable; retrying");
                tokio::time::sleep(wait).await;
                attempt += 1;
            }
        }
    }
}

/// A failed exchange with the server.
enum Attempt {
    /// Try again later (network, 5xx).
    Retry(String),
    /// The server said no (401/403/409/422).
    Refused(String),
    /// Stop.
    Fatal(AgentError),
}

async fn problem(response: reqwest::Response) -> Attempt {
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    let detail = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| Some(format!("{} ({})", v.get("detail")?.as_str()?, v.get("code")?.as_str()?)))
        .unwrap_or_else(|| format!("HTTP {status}: {body}"));
    if status.is_server_error() || status == reqwest::StatusCode::REQUEST_TIMEOUT || status.as_u16() == 429 {
        Attempt::Retry(detail)
    } else {
        Attempt::Refused(detail)
    }
}

async fn join(
    config: &Config,
    http: &reqwest::Client,
    token: &str,
    inventory: Inventory,
) -> Result<Credential, Attempt> {
    let proposed = join_credential(&config.state_dir).map_err(Attempt::Fatal)?;
    let body = JoinRequest { token: token.to_string(), inventory, credential: Some(proposed) };
    let response = http
        .post(format!("{}/api/v1/agent/join", config.server))
        .json(&body)
        .send()
        .await
        .map_err(|e| Attempt::Retry(e.to_string()))?;
    if !response.status().is_success() {
        return Err(problem(response).await);
    }
    let joined: Joined = response.json().await.map_err(|e| Attempt::Retry(e.to_string()))?;
    let cred = Credential {
        server: config.server.clone(),
        node_id: joined.node_id,
        node_name: joined.node_name,
        credential: joined.credential,
    };
    write_credential(&config.state_dir, &cred).map_err(Attempt::Fatal)?;
    let _ = std::fs::remove_file(join_credential_path(&config.state_dir));
    // A new identity: what was applied under another one says nothing about this spec's generations.
    write_applied(&config.state_dir, 0).map_err(Attempt::Fatal)?;
    Ok(cred)
}

async fn report_inventory(
    config: &Config,
    http: &reqwest::Client,
    cred: &Credential,
    inventory: &Inventory,
) -> Result<(), Attempt> {
    let response = http
        .put(format!("{}/api/v1/agent/inventory", config.server))
        .bearer_auth(&cred.credential)
        .json(inventory)
        .send()
        .await
        .map_err(|e| Attempt::Retry(e.to_string()))?;
    if response.status().is_success() { Ok(()) } else { Err(problem(response).await) }
}

/// What of the GPUs' health matters for reporting early: per GPU, the newest XID and the state judged from the
/// report alone.
fn health_signature(
    reports: &[(String, tessera_core::health::GpuHealthReport)],
) -> Vec<(String, Option<i64>, tessera_core::health::HealthState)> {
    let now = now_ms();
    let mut v: Vec<_> = reports
        .iter()
        .map(|(uuid, h)| (uuid.clone(), h.latest_xid_ms(), tessera_core::health::judge(h, 0, now).0))
        .collect();
    v.sort();
    v
}

/// What a status told the server of the GPUs' health ([`health_signature`]) and processes
/// ([`process_signature`]).
type Signature = (Vec<(String, Option<i64>, tessera_core::health::HealthState)>, Vec<(String, u32)>);

/// The signature of the last status sent.
type Reported = Arc<std::sync::Mutex<Option<Signature>>>;

/// Which processes run on which devices, sorted.
fn process_signature<'a>(
    processes: impl Iterator<Item = &'a tessera_core::attribution::GpuProcess>,
) -> Vec<(String, u32)> {
    let mut v: Vec<_> = processes.map(|p| (p.device.clone(), p.pid)).collect();
    v.sort();
    v
}

/// The signature of a status as sent.
fn status_signature(status: &NodeStatus) -> Signature {
    let reports: Vec<(String, tessera_core::health::GpuHealthReport)> =
        status.gpus.iter().filter_map(|g| Some((g.uuid.clone(), g.health.clone()?))).collect();
    (health_signature(&reports), process_signature(status.gpus.iter().flat_map(|g| &g.processes)))
}

/// Reads the GPUs' health and processes every `every` and wakes the status loop when they differ from what the
/// last status sent told the server (a new XID, a GPU judged otherwise, a process started or ended), so that a
/// fault or a stray process is reported at once rather than at the next periodic status. Comparing with what was
/// sent, not with the watch's own last reading, a change that came before the watch's first reading is reported
/// at once too.
async fn watch_health(backend: Backend, every: Duration, reported: Reported, changed: Arc<tokio::sync::Notify>) {
    loop {
        tokio::time::sleep(every).await;
        let now = with_backend(&backend, |b| {
            let health = health_signature(&b.health());
            (health, process_signature(b.processes().iter()))
        })
        .await;
        let told = reported.lock().ok().and_then(|r| r.clone());
        if told.is_some_and(|t| t != now) {
            changed.notify_one();
        }
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Applies the newest spec whenever one arrives, and reports status.
async fn apply_loop(
    config: Config,
    http: reqwest::Client,
    cred: Credential,
    backend: Backend,
    mut specs: watch::Receiver<Option<NodeSpec>>,
    known: Arc<std::sync::atomic::AtomicI64>,
) -> Result<(), AgentError> {
    let mut applied = read_applied(&config.state_dir);
    let mut current: Option<NodeSpec> = None;
    let mut retry_errors = false;
    let mut last_report = tokio::time::Instant::now();
    let mut unsent: Option<NodeStatus> = None;
    let health_changed = Arc::new(tokio::sync::Notify::new());
    let reported: Reported = Arc::default();
    let watcher =
        tokio::spawn(watch_health(backend.clone(), config.health_every, reported.clone(), health_changed.clone()));
    let _stop_watcher = AbortOnDrop(watcher);
    loop {
        let wait = if retry_errors || unsent.is_some() { config.retry_every } else { config.status_every };
        let mut health_woke = false;
        let woke_by_spec = tokio::select! {
            changed = specs.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
                true
            }
            _ = tokio::time::sleep(wait) => false,
            () = health_changed.notified() => {
                health_woke = true;
                false
            }
        };
        if woke_by_spec {
            let newest = specs.borrow_and_update().clone();
            if let Some(spec) = newest {
                if spec.generation < applied {
                    tracing::warn!(got = spec.generation, applied, "ignoring a spec older than the one applied");
                } else if current.as_ref().is_none_or(|c| c.generation != spec.generation) || retry_errors {
                    current = Some(spec);
                }
            }
        }
        let status = match &current {
            Some(spec) if woke_by_spec || retry_errors => {
                let spec = spec.clone();
                let generation = spec.generation;
                let status = match &config.kube {
                    Some(kube) => kube.apply(&backend, &spec).await,
                    None => with_backend(&backend, move |b| reconcile::reconcile(b, &spec)).await?,
                };
                applied = generation;
                known.store(generation, std::sync::atomic::Ordering::SeqCst);
                write_applied(&config.state_dir, applied)?;
                retry_errors = reconcile::has_errors(&status);
                Some(status)
            }
            _ if last_report.elapsed() >= config.status_every || unsent.is_some() || health_woke => {
                let generation = applied;
                Some(
                    with_backend(&backend, move |b| reconcile::observe(b, generation, Default::default(), Vec::new()))
                        .await,
                )
            }
            _ => None,
        };
        if let Some(mut status) = status {
            if let Some(identifier) = &config.attribution {
                identify(identifier, &mut status).await;
            }
            unsent = Some(status);
        }
        if let Some(status) = &unsent {
            match send_status(&config, &http, &cred, status).await {
                Ok(()) => {
                    if let Ok(mut r) = reported.lock() {
                        *r = Some(status_signature(status));
                    }
                    unsent = None;
                    last_report = tokio::time::Instant::now();
                }
                Err(e) => tracing::warn!(error = %e, "status not delivered; retrying"),
            }
        }
    }
}

/// Fills in who runs each process of `status` (user, command, pod).
async fn identify(identifier: &crate::attribution::Identifier, status: &mut NodeStatus) {
    let mut all: Vec<_> = status.gpus.iter_mut().flat_map(|g| std::mem::take(&mut g.processes)).collect();
    identifier.identify(&mut all).await;
    for p in all {
        if let Some(g) =
            status.gpus.iter_mut().find(|g| g.uuid == p.device || g.instances.iter().any(|i| i.uuid == p.device))
        {
            g.processes.push(p);
        }
    }
}

async fn send_status(
    config: &Config,
    http: &reqwest::Client,
    cred: &Credential,
    status: &NodeStatus,
) -> Result<(), String> {
    let response = http
        .put(format!("{}/api/v1/agent/status", config.server))
        .bearer_auth(&cred.credential)
        .json(status)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if response.status().is_success() { Ok(()) } else { Err(format!("HTTP {}", response.status())) }
}

/// Keeps a push channel open and hands every spec to the apply loop.
async fn receive_loop(
    config: Config,
    http: reqwest::Client,
    cred: Credential,
    specs: watch::Sender<Option<NodeSpec>>,
    known: Arc<std::sync::atomic::AtomicI64>,
) -> Result<(), AgentError> {
    let mut attempt = 0u32;
    let mut websocket = config.transport == Transport::Auto;
    loop {
        let outcome = if websocket {
            websocket_session(&config, &cred, &specs).await
        } else {
            long_poll_session(&config, &http, &cred, &specs, &known).await
        };
        match outcome {
            Session::Served => attempt = 0,
            Session::Unsupported(detail) => {
                tracing::warn!(%detail, "no WebSocket; falling back to long-polling");
                websocket = false;
                continue;
            }
            Session::Refused(detail) => return Err(AgentError::Refused(detail)),
            Session::Failed(detail) => tracing::warn!(%detail, "connection to the server lost"),
        }
        let wait = backoff(attempt);
        attempt = attempt.saturating_add(1);
        tokio::time::sleep(wait).await;
        // Try the WebSocket again after a long-poll round, in case it was a passing refusal.
        if config.transport == Transport::Auto {
            websocket = true;
        }
    }
}

/// How a push session ended.
enum Session {
    /// It was up and ended (server restart, network): reconnect from the first backoff step.
    Served,
    /// The server or a proxy does not do WebSockets.
    Unsupported(String),
    /// The credential is refused.
    Refused(String),
    /// It could not be set up.
    Failed(String),
}

fn push_spec(specs: &watch::Sender<Option<NodeSpec>>, spec: NodeSpec) {
    specs.send_if_modified(|current| {
        let newer = current.as_ref().is_none_or(|c| spec.generation > c.generation);
        if newer {
            *current = Some(spec);
        }
        newer
    });
}

async fn websocket_session(config: &Config, cred: &Credential, specs: &watch::Sender<Option<NodeSpec>>) -> Session {
    let url = format!("{}/api/v1/agent/ws", config.server.replacen("http", "ws", 1));
    let mut request = match url.as_str().into_client_request() {
        Ok(r) => r,
        Err(e) => return Session::Failed(e.to_string()),
    };
    let Ok(auth) = format!("Bearer {}", cred.credential).parse() else {
        return Session::Refused("the credential is not a valid header value".to_string());
    };
    request.headers_mut().insert("authorization", auth);
    let connect = tokio::time::timeout(Duration::from_secs(10), tokio_tungstenite::connect_async(request)).await;
    let mut socket = match connect {
        Err(_) => return Session::Failed("WebSocket connect timed out".to_string()),
        Ok(Err(tungstenite::Error::Http(response))) => {
            let status = response.status().as_u16();
            let body = response.body().as_ref().map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default();
            return match status {
                401 | 403 => Session::Refused(format!("HTTP {status}: {body}")),
                500..=599 => Session::Failed(format!("HTTP {status}")),
                _ => Session::Unsupported(format!("HTTP {status}")),
            };
        }
        Ok(Err(e)) => return Session::Failed(e.to_string()),
        Ok(Ok((socket, _))) => socket,
    };
    tracing::info!("connected (WebSocket)");
    let mut beat = tokio::time::interval(config.heartbeat);
    let silent_limit = config.heartbeat * 3 + Duration::from_secs(30);
    loop {
        tokio::select! {
            _ = beat.tick() => {
                let text = serde_json::to_string(&AgentMessage::Heartbeat).unwrap_or_default();
                if socket.send(tungstenite::Message::Text(text.into())).await.is_err() {
                    return Session::Served;
                }
            }
            got = tokio::time::timeout(silent_limit, socket.next()) => match got {
                Err(_) => return Session::Served,
                Ok(None | Some(Err(_))) => return Session::Served,
                Ok(Some(Ok(tungstenite::Message::Text(text)))) => match serde_json::from_str::<ServerMessage>(&text) {
                    Ok(ServerMessage::Spec { spec }) => push_spec(specs, spec),
                    Err(e) => tracing::warn!(error = %e, "unreadable server message"),
                },
                Ok(Some(Ok(tungstenite::Message::Close(_)))) => return Session::Served,
                Ok(Some(Ok(_))) => {}
            },
        }
    }
}

async fn long_poll_session(
    config: &Config,
    http: &reqwest::Client,
    cred: &Credential,
    specs: &watch::Sender<Option<NodeSpec>>,
    known: &std::sync::atomic::AtomicI64,
) -> Session {
    let mut served = false;
    loop {
        let have =
            specs.borrow().as_ref().map_or(0, |s| s.generation).max(known.load(std::sync::atomic::Ordering::SeqCst));
        // The first poll asks for the spec at once (the agent may have missed changes while away).
        let query = if served { format!("?after={have}&wait_s=10") } else { String::new() };
        let response =
            http.get(format!("{}/api/v1/agent/spec{query}", config.server)).bearer_auth(&cred.credential).send().await;
        let response = match response {
            Ok(r) => r,
            Err(e) => return if served { Session::Served } else { Session::Failed(e.to_string()) },
        };
        match response.status().as_u16() {
            200 => match response.json::<NodeSpec>().await {
                Ok(spec) => push_spec(specs, spec),
                Err(e) => return Session::Failed(e.to_string()),
            },
            204 => {}
            401 | 403 => return Session::Refused(format!("HTTP {}", response.status())),
            _ => return if served { Session::Served } else { Session::Failed(format!("HTTP {}", response.status())) },
        }
        if !served {
            tracing::info!("connected (long-poll)");
        }
        served = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_may_ask_for_longer_batch_intervals_but_never_shorter_ones() {
        let own = Duration::from_secs(1);
        assert_eq!(paced(own, None), own, "a server that does not pace");
        assert_eq!(paced(own, Some(4_500)), Duration::from_millis(4_500));
        assert_eq!(paced(Duration::from_secs(5), Some(1_000)), Duration::from_secs(5), "never sooner than its own");
        assert_eq!(paced(own, Some(u64::MAX)), MAX_PACED);
    }

    #[test]
    fn the_proposed_join_credential_is_kept_until_the_join_is_answered() {
        let dir = std::env::temp_dir().join(format!("tessera-agent-join-{}-{}", std::process::id(), fastrand::u64(..)));
        std::fs::create_dir_all(&dir).expect("dir");
        let first = join_credential(&dir).expect("made");
        assert!(node_credential_well_formed(&first), "{first}");
        // Sent again, or after a restart: the same one.
        assert_eq!(join_credential(&dir).expect("kept"), first);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(join_credential_path(&dir)).expect("file").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        // Once answered (or refused for good) it is dropped: the next join proposes a new one.
        std::fs::remove_file(join_credential_path(&dir)).expect("remove");
        assert_ne!(join_credential(&dir).expect("new"), first);
        // A damaged file is replaced, not sent.
        std::fs::write(join_credential_path(&dir), "tsn_damaged").expect("write");
        let replaced = join_credential(&dir).expect("replaced");
        assert!(node_credential_well_formed(&replaced));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
