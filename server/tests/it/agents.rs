//! Node agents end to end over real HTTP on loopback: the `tessera` server as a process, simulated agents (the
//! agent library with the sim backend) joining with join tokens, specs pushed over WebSockets or long-polled,
//! layouts applied at exact placements, allocations turning active with their MIG device UUIDs, agents killed
//! mid-apply and restarted, the server restarted, and busy instances never destroyed.

use std::path::PathBuf;
use std::time::Duration;

use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use tessera_agent::agent::{self, AgentError, Config, Transport};
use tessera_agent::backend::sim::{SimBackend, SimHandle, SimNode, parse_gpus};
use tessera_server::http::auth::new_token_secret;
use tokio::task::JoinHandle;

/// The `tessera` server as a child process on a fixed port (so it can be restarted at the same address).
pub(crate) struct Server {
    child: tokio::process::Child,
    pub(crate) port: u16,
    pub(crate) database_url: String,
    pub(crate) admin: String,
    pub(crate) base: String,
    pub(crate) client: Client,
}

pub(crate) fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

impl Server {
    pub(crate) async fn start(database_url: &str, port: u16, admin: &str) -> Server {
        Server::start_with(database_url, port, admin, &[]).await
    }

    pub(crate) async fn start_with(database_url: &str, port: u16, admin: &str, env: &[(&str, &str)]) -> Server {
        Server::start_logging(database_url, port, admin, env, std::process::Stdio::inherit()).await
    }

    /// Starts the server with its default logging (whatever the test's environment says), its log lines going to
    /// `stderr`.
    pub(crate) async fn start_logging(
        database_url: &str,
        port: u16,
        admin: &str,
        env: &[(&str, &str)],
        stderr: std::process::Stdio,
    ) -> Server {
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--database-url", database_url])
            .env_remove("TESSERA_LOG")
            .env_remove("RUST_LOG")
            .envs(env.iter().copied())
            .env("TESSERA_BOOTSTRAP_TOKEN", admin)
            .stdout(std::process::Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .expect("start tessera serve");
        let server = Server {
            child,
            port,
            database_url: database_url.to_string(),
            admin: admin.to_string(),
            base: format!("http://127.0.0.1:{port}"),
            client: Client::new(),
        };
        let up = wait_for(Duration::from_secs(30), || async {
            let r = server.client.get(format!("{}/readyz", server.base)).send().await.ok()?;
            (r.status() == StatusCode::OK).then_some(())
        })
        .await;
        assert!(up.is_some(), "the server did not come up");
        server
    }

    /// The server process's id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id().expect("the server is running")
    }

    pub(crate) async fn stop(&mut self) {
        let _ = self.child.kill().await;
    }

    /// Stops the server as Kubernetes, Docker and systemd do: SIGTERM.
    pub(crate) fn terminate(&self) {
        let status =
            std::process::Command::new("kill").args(["-TERM", &self.pid().to_string()]).status().expect("kill");
        assert!(status.success(), "kill -TERM");
    }

    /// How the server process ended, if it did within `limit`.
    pub(crate) async fn exited(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        tokio::time::timeout(limit, self.child.wait()).await.ok().map(|s| s.expect("wait"))
    }

    pub(crate) async fn restart(&mut self) {
        self.stop().await;
        *self = Server::start(&self.database_url, self.port, &self.admin).await;
    }

    pub(crate) async fn call(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut r = self.client.request(method, format!("{}{path}", self.base)).bearer_auth(&self.admin);
        if let Some(b) = body {
            r = r.json(&b);
        }
        crate::harness::answer(r).await
    }

    pub(crate) async fn join_token(&self, name: Option<&str>) -> String {
        let (s, v) = self.call(Method::POST, "/api/v1/join-tokens", Some(json!({ "node_name": name }))).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        v["token"].as_str().expect("token").to_string()
    }

    pub(crate) async fn nodes(&self) -> Vec<Value> {
        let (s, v) = self.call(Method::GET, "/api/v1/nodes", None).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        v.as_array().cloned().unwrap_or_default()
    }

    pub(crate) async fn node(&self, name: &str) -> Option<Value> {
        self.nodes().await.into_iter().find(|n| n["name"] == name)
    }

    /// Waits until node `name` has applied its current spec without errors.
    pub(crate) async fn settled(&self, name: &str) -> Value {
        let node = wait_for(Duration::from_secs(30), || async {
            let n = self.node(name).await?;
            (n["state"] == "ready" && n["observed_generation"] == n["generation"]).then_some(n)
        })
        .await;
        match node {
            Some(n) => n,
            None => panic!("node {name} did not settle: {:?}", self.node(name).await),
        }
    }

    /// Proposes `layout` for a GPU by hand and approves it.
    pub(crate) async fn set_layout(&self, gpu_id: &str, layout: Value) {
        let (s, v) = self
            .call(Method::PUT, &format!("/api/v1/gpus/{gpu_id}/layout"), Some(json!({ "instances": layout })))
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        let id = v["id"].as_str().expect("id");
        let (s, v) = self.call(Method::POST, &format!("/api/v1/layouts/{id}/approve"), None).await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }
}

/// Polls `f` every 100 ms until it gives something or `limit` passes.
pub(crate) async fn wait_for<T, F, Fut>(limit: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let until = tokio::time::Instant::now() + limit;
    loop {
        if let Some(t) = f().await {
            return Some(t);
        }
        if tokio::time::Instant::now() >= until {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A simulated node: its hardware outlives its agent, as real GPUs outlive an agent process.
pub(crate) struct SimAgent {
    pub(crate) sim: SimHandle,
    pub(crate) dir: PathBuf,
    base: String,
    token: Option<String>,
    pub(crate) transport: Transport,
    pub(crate) telemetry: Option<tessera_agent::telemetry::TelemetryConfig>,
    /// How often the agent sends its status unasked (2 s unless a test says otherwise).
    pub(crate) status_every: Duration,
    task: Option<JoinHandle<Result<(), AgentError>>>,
}

impl SimAgent {
    pub(crate) fn new(base: &str, name: &str, gpus: &str, token: String) -> SimAgent {
        let dir = std::env::temp_dir().join(format!("tessera-agent-{}", uuid::Uuid::now_v7().simple()));
        let sim = std::sync::Arc::new(std::sync::Mutex::new(SimNode::new(name, &parse_gpus(gpus).expect("gpus"))));
        SimAgent {
            sim,
            dir,
            base: base.to_string(),
            token: Some(token),
            transport: Transport::Auto,
            telemetry: None,
            status_every: Duration::from_secs(2),
            task: None,
        }
    }

    pub(crate) fn start(&mut self) {
        let mut config = Config::new(&self.base, self.token.clone(), self.dir.clone());
        config.transport = self.transport;
        config.heartbeat = Duration::from_millis(500);
        config.retry_every = Duration::from_millis(200);
        config.status_every = self.status_every;
        config.health_every = Duration::from_millis(300);
        config.telemetry = self.telemetry;
        let backend = Box::new(SimBackend::new(self.sim.clone()));
        self.task = Some(tokio::spawn(agent::run(config, backend)));
    }

    /// Kills the agent at once (its task is dropped wherever it is).
    pub(crate) fn kill(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }

    pub(crate) fn instances(&self, gpu: usize) -> Vec<(String, u8, String)> {
        let node = self.sim.lock().expect("sim");
        node.gpus[gpu].instances.iter().map(|i| (i.profile.clone(), i.start, i.uuid.clone())).collect()
    }
}

impl Drop for SimAgent {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The tenant's first allocation once it is `active` (20 s at most).
pub(crate) async fn first_allocation_active(server: &Server, tenant: &str) -> Value {
    wait_for(Duration::from_secs(20), || async {
        let (_, list) = server.call(Method::GET, &format!("/api/v1/allocations?tenant={tenant}"), None).await;
        let first = list.as_array()?.first()?.clone();
        (first["state"] == "active").then_some(first)
    })
    .await
    .expect("the allocation turns active")
}

pub(crate) fn sqlite_url() -> String {
    let file = std::env::temp_dir().join(format!("tessera-agents-{}.db", uuid::Uuid::now_v7().simple()));
    format!("sqlite://{}", file.display())
}

pub(crate) fn gpu_id(node: &Value, index: usize) -> String {
    node["gpus"][index]["id"].as_str().expect("gpu id").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_sim_agents_apply_layouts_and_survive_crashes_and_a_server_restart() {
    let mut server = Server::start(&sqlite_url(), free_port(), &new_token_secret()).await;
    let mut a = SimAgent::new(&server.base, "gpu-a", "H100-80GB:2", server.join_token(None).await);
    let mut b = SimAgent::new(&server.base, "gpu-b", "A100-40GB:2", server.join_token(None).await);
    // A token may name the node; it wins over the host name the agent reports.
    let mut c = SimAgent::new(&server.base, "host-c", "H100-80GB:1", server.join_token(Some("gpu-c")).await);
    for agent in [&mut a, &mut b, &mut c] {
        agent.start();
    }
    for name in ["gpu-a", "gpu-b", "gpu-c"] {
        let node = server.settled(name).await;
        assert_eq!(node["agent"]["backend"], "sim", "{node}");
    }
    let node_a = server.node("gpu-a").await.expect("gpu-a");
    assert_eq!(node_a["gpus"].as_array().map(Vec::len), Some(2));
    assert_eq!(node_a["gpus"][0]["model"], "H100-80GB");
    assert_eq!(node_a["gpus"][0]["uuid"].as_str().map(|u| u.starts_with("GPU-")), Some(true));
    assert!(server.node("host-c").await.is_none(), "the token's node name wins");

    // Request -> approve -> layout approved -> pushed -> applied -> active, with the MIG device UUID.
    let (_, tenant) = server.call(Method::POST, "/api/v1/tenants", Some(json!({"name": "ml"}))).await;
    let tenant = tenant["id"].as_str().expect("tenant").to_string();
    let (s, _) = server
        .call(
            Method::PUT,
            &format!("/api/v1/tenants/{tenant}/quotas"),
            Some(json!({"limits": {"compute_slices": 100}})),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let ask =
        json!({"tenant": tenant, "spec": {"mode": "mig", "profile": "3g.40gb", "model": "H100-80GB"}, "count": 1});
    let (s, request) = server.call(Method::POST, "/api/v1/requests", Some(ask.clone())).await;
    assert_eq!(s, StatusCode::CREATED, "{request}");
    let request_id = request["id"].as_str().expect("id").to_string();
    let (s, approval) = server.call(Method::POST, &format!("/api/v1/requests/{request_id}/approve"), None).await;
    assert_eq!(s, StatusCode::OK, "{approval}");
    let proposal = approval["layout_proposals"][0]["id"].as_str().expect("a layout change").to_string();
    let placed = approval["reservations"][0].clone();
    let (s, _) = server.call(Method::POST, &format!("/api/v1/layouts/{proposal}/approve"), None).await;
    assert_eq!(s, StatusCode::OK);
    let active = first_allocation_active(&server, &tenant).await;
    let device = active["device_uuid"].as_str().expect("device uuid").to_string();
    assert!(device.starts_with("MIG-"), "{active}");
    assert_eq!(active["cuda_visible_devices"], device.as_str());
    let (_, request) = server.call(Method::GET, &format!("/api/v1/requests/{request_id}"), None).await;
    assert_eq!(request["state"], "active", "{request}");
    // It is on the node the planner chose, at the exact placement, and the status carries the same UUID.
    let on = [&a, &b, &c]
        .into_iter()
        .flat_map(|ag| (0..2).flat_map(move |g| ag.sim.lock().expect("sim").gpus.get(g).map(|x| x.instances.clone())))
        .flatten()
        .find(|i| i.uuid == device)
        .expect("the device exists on a simulated GPU");
    assert_eq!((on.profile.as_str(), i64::from(on.start)), ("3g.40gb", placed["start"].as_i64().expect("start")));

    // Kill an agent mid-apply, restart it: it converges.
    c.sim.lock().expect("sim").faults.step_delay_ms = 150;
    let node_c = server.node("gpu-c").await.expect("gpu-c");
    let seven: Vec<Value> = (0..7).map(|s| json!({"profile": "1g.10gb", "start": s})).collect();
    server.set_layout(&gpu_id(&node_c, 0), json!(seven)).await;
    let started = wait_for(Duration::from_secs(10), || async { (!c.instances(0).is_empty()).then_some(()) }).await;
    assert!(started.is_some(), "the apply started");
    c.kill();
    let half = c.instances(0).len();
    assert!(half < 7, "killed mid-apply ({half} of 7 made)");
    c.sim.lock().expect("sim").faults.step_delay_ms = 0;
    c.start();
    let node_c = server.settled("gpu-c").await;
    let made: Vec<(String, u8)> = c.instances(0).into_iter().map(|(p, s, _)| (p, s)).collect();
    assert_eq!(made, (0..7).map(|s| ("1g.10gb".to_string(), s)).collect::<Vec<_>>());
    assert_eq!(node_c["gpus"][0]["applied"].as_array().map(Vec::len), Some(7));

    // A crash (injected before a driver call) stops the agent; restarted, it converges.
    c.sim.lock().expect("sim").faults.crash_after_steps = Some(2);
    server.set_layout(&gpu_id(&node_c, 0), json!([{"profile": "7g.80gb", "start": 0}])).await;
    let crashed = tokio::time::timeout(Duration::from_secs(20), c.task.take().expect("task")).await;
    assert!(matches!(crashed, Ok(Ok(Err(AgentError::Crashed(_))))), "{crashed:?}");
    assert_eq!(c.instances(0).len(), 5, "two destroys done, then the crash");
    c.start();
    server.settled("gpu-c").await;
    assert_eq!(c.instances(0).into_iter().map(|(p, s, _)| (p, s)).collect::<Vec<_>>(), [("7g.80gb".to_string(), 0)]);

    // Restart the server: the agents reconnect, nothing is lost, and new specs still reach them.
    server.restart().await;
    let (_, list) = server.call(Method::GET, &format!("/api/v1/allocations?tenant={tenant}"), None).await;
    assert_eq!(list[0]["state"], "active");
    assert_eq!(list[0]["device_uuid"], device.as_str());
    let node_b = server.node("gpu-b").await.expect("gpu-b");
    server.set_layout(&gpu_id(&node_b, 1), json!([{"profile": "3g.20gb", "start": 4}])).await;
    server.settled("gpu-b").await;
    assert_eq!(b.instances(1).into_iter().map(|(p, s, _)| (p, s)).collect::<Vec<_>>(), [("3g.20gb".to_string(), 4)]);
    for name in ["gpu-a", "gpu-b", "gpu-c"] {
        server.settled(name).await;
    }
    server.stop().await;
}

/// Injects a fault into a simulated GPU now.
fn inject(agent: &SimAgent, gpu: usize, fault: Value) {
    let fault: tessera_agent::backend::sim::Injected = serde_json::from_value(fault).expect("fault");
    agent.sim.lock().expect("sim").gpus[gpu].inject(&fault, tessera_server::store::now_ms());
}

/// The GPU `index` of node `name` once `check` holds for it (10 s at most).
async fn gpu_when(server: &Server, name: &str, index: usize, check: impl Fn(&Value) -> bool) -> Value {
    let found = wait_for(Duration::from_secs(10), || async {
        let g = server.node(name).await?["gpus"][index].clone();
        check(&g).then_some(g)
    })
    .await;
    match found {
        Some(g) => g,
        None => panic!("GPU {index} of {name} never got there: {:#}", server.node(name).await.unwrap_or_default()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gpu_reporting_a_fatal_error_is_cordoned_and_its_holders_told() {
    let mut server = Server::start(&sqlite_url(), free_port(), &new_token_secret()).await;
    let mut a = SimAgent::new(&server.base, "sick", "H100-80GB:2", server.join_token(None).await);
    // Statuses unasked every 6 s: a change told within 4 s of its injection came by the health watch's own report.
    a.status_every = Duration::from_secs(6);
    // Telemetry, so that the heatmap has the GPUs' rows to mark.
    a.telemetry = crate::telemetry::fast(10_000);
    a.start();
    let node = server.settled("sick").await;
    for g in node["gpus"].as_array().expect("gpus") {
        assert_eq!(g["health"]["state"], "healthy", "{g:#}");
        assert_eq!(g["health"]["report"]["temperature_c"], 45, "the agent's report is shown: {g:#}");
    }
    // A tenant's slice on GPU 0 (GPU 1 cordoned meanwhile, so the planner picks GPU 0).
    let (gpu0, gpu1) = (gpu_id(&node, 0), gpu_id(&node, 1));
    let (s, _) = server.call(Method::POST, &format!("/api/v1/gpus/{gpu1}/cordon"), None).await;
    assert_eq!(s, StatusCode::OK);
    let (_, tenant) = server.call(Method::POST, "/api/v1/tenants", Some(json!({"name": "ml"}))).await;
    let tenant = tenant["id"].as_str().expect("tenant").to_string();
    let quota = json!({"limits": {"compute_slices": 100}});
    server.call(Method::PUT, &format!("/api/v1/tenants/{tenant}/quotas"), Some(quota)).await;
    let ask =
        json!({"tenant": tenant, "spec": {"mode": "mig", "profile": "3g.40gb", "model": "H100-80GB"}, "count": 1});
    let (_, request) = server.call(Method::POST, "/api/v1/requests", Some(ask)).await;
    let request_id = request["id"].as_str().expect("id").to_string();
    let (s, approval) = server.call(Method::POST, &format!("/api/v1/requests/{request_id}/approve"), None).await;
    assert_eq!(s, StatusCode::OK, "{approval}");
    let proposal = approval["layout_proposals"][0]["id"].as_str().expect("a layout change").to_string();
    server.call(Method::POST, &format!("/api/v1/layouts/{proposal}/approve"), None).await;
    first_allocation_active(&server, &tenant).await;

    // XID 79 (fallen off the bus) on GPU 0: reported at once (not at the next 6 s status), judged unhealthy,
    // cordoned; the platform and the tenant holding a slice there are told.
    let injected = std::time::Instant::now();
    inject(&a, 0, json!({"xids": [79]}));
    let sick = gpu_when(&server, "sick", 0, |g| g["health"]["state"] == "unhealthy").await;
    assert!(injected.elapsed() < Duration::from_secs(4), "reported after {:?}", injected.elapsed());
    assert_eq!(sick["cordoned"], true, "{sick:#}");
    assert_eq!(sick["health"]["findings"][0]["code"], "xid_79", "{sick:#}");
    assert_eq!(sick["health"]["report"]["xids"][0]["code"], 79, "{sick:#}");
    assert!(sick["health"]["since_ms"].is_i64(), "{sick:#}");
    let events = |kind: &'static str| {
        let server = &server;
        async move {
            let (_, inbox) = server.call(Method::GET, "/api/v1/inbox?limit=500", None).await;
            inbox.as_array().into_iter().flatten().filter(|e| e["type"] == kind).cloned().collect::<Vec<Value>>()
        }
    };
    let told = events("gpu.unhealthy").await;
    assert!(told.iter().all(|e| e["subject"] == format!("gpu/{gpu0}")), "{told:#?}");
    let mut tenants: Vec<Value> = told.iter().map(|e| e["tenant"].clone()).collect();
    tenants.sort_by_key(|t| t.to_string());
    assert_eq!(tenants, [json!(tenant), Value::Null], "the platform and the holder, once each: {told:#?}");
    assert_eq!(told[0]["data"]["after"]["findings"][0]["code"], "xid_79");
    let cordons = events("gpu.cordoned").await;
    assert!(
        cordons.iter().any(|e| e["subject"] == format!("gpu/{gpu0}") && e["data"]["actor"] == "system:health"),
        "{cordons:#?}"
    );
    // Later reports do not tell it again, and it stays unhealthy though the XID is not repeated.
    tokio::time::sleep(Duration::from_millis(6500)).await;
    assert_eq!(events("gpu.unhealthy").await.len(), 2);
    assert_eq!(server.node("sick").await.expect("node")["gpus"][0]["health"]["state"], "unhealthy");

    // Throttling on GPU 1: degraded (it serves), told once. Throttling that comes and goes does not flap the
    // state: degraded holds 10 minutes (core `next_state`), with what made it so.
    inject(&a, 1, json!({"throttle": ["hw_thermal_slowdown"]}));
    let warm = gpu_when(&server, "sick", 1, |g| g["health"]["state"] == "degraded").await;
    assert_eq!(warm["health"]["findings"][0]["code"], "throttle_hw_thermal_slowdown", "{warm:#}");
    assert_eq!(warm["cordoned"], true, "still cordoned by the admin, not by its health");
    for throttle in [json!([]), json!(["hw_thermal_slowdown"]), json!([])] {
        inject(&a, 1, json!({"throttle": throttle}));
        tokio::time::sleep(Duration::from_millis(800)).await;
    }
    let g = server.node("sick").await.expect("node")["gpus"][1].clone();
    assert_eq!(g["health"]["state"], "degraded", "{g:#}");
    assert_eq!(g["health"]["findings"][0]["code"], "throttle_hw_thermal_slowdown", "{g:#}");
    assert_eq!(events("gpu.degraded").await.len(), 1);
    assert_eq!(events("gpu.healthy").await.len(), 0);

    // An admin returns GPU 0 to service: healthy, and the old XID is not judged again.
    let (s, back) = server.call(Method::POST, &format!("/api/v1/gpus/{gpu0}/uncordon"), None).await;
    assert_eq!((s, back["cordoned"].clone()), (StatusCode::OK, json!(false)), "{back}");
    tokio::time::sleep(Duration::from_millis(6500)).await;
    let g = server.node("sick").await.expect("node")["gpus"][0].clone();
    assert_eq!((g["health"]["state"].as_str(), g["cordoned"].as_bool()), (Some("healthy"), Some(false)), "{g:#}");
    let healthy = events("gpu.healthy").await;
    assert_eq!(healthy.len(), 1, "{healthy:#?}");
    assert_eq!(healthy[0]["data"]["after"]["from"], "unhealthy");
    // A row remap pending: unhealthy again, until the GPU is reset.
    inject(&a, 0, json!({"remapped_rows": {"correctable": 0, "uncorrectable": 1, "pending": true, "failure": false}}));
    let again = gpu_when(&server, "sick", 0, |g| g["health"]["state"] == "unhealthy").await;
    assert_eq!(
        (again["cordoned"].as_bool(), again["health"]["findings"][0]["code"].as_str()),
        (Some(true), Some("row_remap_pending"))
    );
    // The heatmap marks each change on its GPU's row, with what caused it, and says how each GPU is now.
    let (s, map) = server.call(Method::GET, "/api/v1/telemetry/heatmap?node=sick", None).await;
    assert_eq!(s, StatusCode::OK, "{map}");
    let gpu_row = |index: u64| -> Value {
        let rows = map["rows"].as_array().expect("rows");
        let found = rows.iter().find(|r| r["kind"] == "gpu" && r["gpu_index"].as_u64() == Some(index)).cloned();
        found.unwrap_or_else(|| panic!("no row of GPU {index}: {map:#}"))
    };
    let (row0, row1) = (gpu_row(0), gpu_row(1));
    let marks = |r: &Value| -> Vec<(String, Vec<String>)> {
        r["health_marks"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| {
                let codes = m["codes"].as_array().into_iter().flatten().filter_map(|c| c.as_str().map(String::from));
                (m["state"].as_str().unwrap_or_default().to_string(), codes.collect())
            })
            .collect()
    };
    let owned = |v: &[&str]| v.iter().map(|c| c.to_string()).collect::<Vec<_>>();
    assert_eq!(row0["health"], "unhealthy", "{row0:#}");
    assert_eq!(
        marks(&row0),
        [
            ("unhealthy".to_string(), owned(&["xid_79"])),
            ("healthy".to_string(), owned(&[])),
            ("unhealthy".to_string(), owned(&["row_remap_pending"]))
        ],
        "{row0:#}"
    );
    let times: Vec<i64> =
        row0["health_marks"].as_array().expect("marks").iter().filter_map(|m| m["at_ms"].as_i64()).collect();
    assert!(
        times.windows(2).all(|w| w[0] <= w[1]) && times.iter().all(|t| *t >= map["from_ms"].as_i64().unwrap_or(0)),
        "{row0:#}"
    );
    assert_eq!(
        (row1["health"].as_str(), marks(&row1)),
        (Some("degraded"), vec![("degraded".to_string(), owned(&["throttle_hw_thermal_slowdown"]))])
    );
    let mig_rows: Vec<&Value> = map["rows"].as_array().expect("rows").iter().filter(|r| r["kind"] == "mig").collect();
    assert!(
        !mig_rows.is_empty() && mig_rows.iter().all(|r| r["health"].is_null() && r["health_marks"] == json!([])),
        "{map:#}"
    );
    // Just before the first change: the rows, without a marker.
    let first = times[0];
    let (_, old) = server
        .call(
            Method::GET,
            &format!("/api/v1/telemetry/heatmap?node=sick&from={}&to={}", first - 5_000, first - 1_000),
            None,
        )
        .await;
    let old_rows = old["rows"].as_array().expect("rows");
    assert!(!old_rows.is_empty() && old_rows.iter().all(|r| r["health_marks"] == json!([])), "{old:#}");
    // A tenant reads only what it was told: the holder's copies of GPU 0 turning unhealthy, twice; another
    // tenant nothing. (A member's heatmap shows GPU rows of whole GPUs it held only; this slice is an instance.)
    let store = tessera_server::store::Store::connect(&server.database_url).await.expect("store");
    let told = store
        .health_changes(std::slice::from_ref(&gpu0), Some(std::slice::from_ref(&tenant)), 0, i64::MAX / 2)
        .await
        .expect("changes");
    let told: Vec<(String, Vec<String>)> =
        told.into_iter().map(|(_, _, s, codes)| (s.as_str().to_string(), codes)).collect();
    assert_eq!(
        told,
        [("unhealthy".to_string(), owned(&["xid_79"])), ("unhealthy".to_string(), owned(&["row_remap_pending"]))]
    );
    let nobody = store
        .health_changes(&[gpu0.clone(), gpu1.clone()], Some(&["someone-else".to_string()]), 0, i64::MAX / 2)
        .await
        .expect("changes");
    assert!(nobody.is_empty(), "{nobody:?}");
    let (_, holder) =
        crate::harness::user_with_token(&store, "holder", &[(&tenant, tessera_server::store::Role::Member)]).await;
    let r = server
        .client
        .get(format!("{}/api/v1/telemetry/heatmap?node=sick", server.base))
        .bearer_auth(&holder)
        .send()
        .await
        .expect("send");
    let seen: Value = r.json().await.expect("json");
    let rows = seen["rows"].as_array().expect("rows");
    assert!(!rows.is_empty() && rows.iter().all(|r| r["kind"] == "mig" && r["health_marks"] == json!([])), "{seen:#}");

    // Reports are bounded: 17 XIDs, an XID from the future (it would hide every later one) and a GPU listed twice are
    // refused, and nothing of them is taken.
    let cred: Value =
        serde_json::from_str(&std::fs::read_to_string(a.dir.join("credential.json")).expect("credential"))
            .expect("json");
    let put = |status: Value| {
        let (server, token) = (&server, cred["credential"].as_str().expect("credential").to_string());
        async move {
            let r = server
                .client
                .put(format!("{}/api/v1/agent/status", server.base))
                .bearer_auth(token)
                .json(&status)
                .send()
                .await
                .expect("send");
            let s = r.status();
            (s, r.json::<Value>().await.unwrap_or_default())
        }
    };
    let gpu_status =
        |health: Value| json!({"uuid": sick["uuid"], "mig_enabled": true, "instances": [], "health": health});
    let xids: Vec<Value> = (0..17).map(|i| json!({"code": 13, "at_ms": i})).collect();
    let (s, body) = put(json!({"observed_generation": 0, "gpus": [gpu_status(json!({"xids": xids}))]})).await;
    assert_eq!((s, body["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_health")), "{body}");
    let future = json!({"xids": [{"code": 48, "at_ms": tessera_server::store::now_ms() + 3_600_000}]});
    let (s, body) = put(json!({"observed_generation": 0, "gpus": [gpu_status(future)]})).await;
    assert_eq!((s, body["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_health")), "{body}");
    let twice = json!({"observed_generation": 0, "gpus": [gpu_status(json!({})), gpu_status(json!({}))]});
    let (s, body) = put(twice).await;
    assert_eq!((s, body["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("duplicate_gpu")), "{body}");
    server.stop().await;
}

/// Every other signal the simulated driver can report, each on a GPU of its own, through the real agent and server:
/// the state and finding the fleet shows, and the automatic cordon for the unhealthy ones only.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_health_signal_reaches_its_gpus_state_through_the_simulated_driver() {
    use tessera_core::health::{DEGRADING_XIDS, HOT_C, RETIRED_PAGES_DEGRADED};
    let mut server = Server::start(&sqlite_url(), free_port(), &new_token_secret()).await;
    let mut a = SimAgent::new(&server.base, "signals", "H100-80GB:6", server.join_token(None).await);
    a.start();
    server.settled("signals").await;
    let remap_failed = json!({"correctable": 0, "uncorrectable": 1, "pending": false, "failure": true});
    let cases = [
        (json!({"ecc_uncorrected_volatile": 2}), "degraded", "ecc_uncorrected"),
        (json!({"retired_pages_pending": true}), "unhealthy", "pages_pending_retirement"),
        (json!({"temperature_c": HOT_C + 3}), "degraded", "hot"),
        (json!({"retired_pages": RETIRED_PAGES_DEGRADED}), "degraded", "retired_pages"),
        (json!({"remapped_rows": remap_failed}), "unhealthy", "row_remap_failure"),
        (json!({"xids": [DEGRADING_XIDS[0]]}), "degraded", "xid_63"),
    ];
    for (i, (fault, _, _)) in cases.iter().enumerate() {
        inject(&a, i, fault.clone());
    }
    for (i, (fault, state, code)) in cases.iter().enumerate() {
        let g = gpu_when(&server, "signals", i, |g| g["health"]["state"] == *state).await;
        assert_eq!(g["health"]["findings"][0]["code"], *code, "{fault}: {g:#}");
        assert_eq!(
            g["cordoned"].as_bool(),
            Some(*state == "unhealthy"),
            "{fault}: only unhealthy GPUs are cordoned: {g:#}"
        );
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn draining_one_gpu_ends_its_holders_at_the_deadline_while_the_others_serve() {
    let mut server = Server::start(&sqlite_url(), free_port(), &new_token_secret()).await;
    let mut a = SimAgent::new(&server.base, "maint", "H100-80GB:2", server.join_token(None).await);
    a.start();
    server.settled("maint").await;
    let (_, tenant) = server.call(Method::POST, "/api/v1/tenants", Some(json!({"name": "ml"}))).await;
    let tenant = tenant["id"].as_str().expect("tenant").to_string();
    let quota = json!({"limits": {"compute_slices": 100}});
    server.call(Method::PUT, &format!("/api/v1/tenants/{tenant}/quotas"), Some(quota)).await;
    // Two 4g.40gb slices: one per GPU (an H100 has room for one).
    let mut requests = Vec::new();
    for _ in 0..2 {
        let ask =
            json!({"tenant": tenant, "spec": {"mode": "mig", "profile": "4g.40gb", "model": "H100-80GB"}, "count": 1});
        let (_, request) = server.call(Method::POST, "/api/v1/requests", Some(ask)).await;
        let id = request["id"].as_str().expect("id").to_string();
        let (s, approval) = server.call(Method::POST, &format!("/api/v1/requests/{id}/approve"), None).await;
        assert_eq!(s, StatusCode::OK, "{approval}");
        for p in approval["layout_proposals"].as_array().into_iter().flatten() {
            let pid = p["id"].as_str().expect("proposal");
            server.call(Method::POST, &format!("/api/v1/layouts/{pid}/approve"), None).await;
        }
        requests.push(id);
    }
    let active = wait_for(Duration::from_secs(30), || async {
        let mut states = Vec::new();
        for id in &requests {
            states.push(server.call(Method::GET, &format!("/api/v1/requests/{id}"), None).await.1["state"].clone());
        }
        states.iter().all(|s| s == "active").then_some(())
    })
    .await;
    assert!(active.is_some(), "both requests turn active");
    let node = server.node("maint").await.expect("node");
    let holder = |i: usize| node["gpus"][i]["in_use"][0]["request"].as_str().map(str::to_string);
    let (gpu, kept_gpu) = if holder(0).as_deref() == Some(requests[0].as_str()) { (0, 1) } else { (1, 0) };
    assert_eq!(holder(gpu).as_deref(), Some(requests[0].as_str()), "{node:#}");
    assert_eq!(holder(kept_gpu).as_deref(), Some(requests[1].as_str()), "{node:#}");
    let (gpu_id, kept_id) = (gpu_id(&node, gpu), gpu_id(&node, kept_gpu));

    // Bounds: past 7 days, a reason with a control character, a GPU that does not exist.
    let path = format!("/api/v1/gpus/{gpu_id}/drain");
    let (s, v) = server.call(Method::POST, &path, Some(json!({"deadline_s": 604_801}))).await;
    assert_eq!((s, v["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("drain_bad_deadline")), "{v}");
    let (s, v) = server.call(Method::POST, &path, Some(json!({"reason": "bad\u{0007}"}))).await;
    assert_eq!((s, v["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_reason")), "{v}");
    let (s, _) = server.call(Method::POST, "/api/v1/gpus/nope/drain", Some(json!({}))).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(
        server.node("maint").await.expect("node")["gpus"][gpu]["drain"].is_null(),
        "a refused drain changes nothing"
    );

    // Drain with a long deadline: cordoned, its holder told; then drained again with 1 s, which moves the deadline.
    let (s, drain) = server.call(Method::POST, &path, Some(json!({"deadline_s": 600, "reason": "fan swap"}))).await;
    assert_eq!(s, StatusCode::OK, "{drain}");
    assert_eq!(drain["holders"], json!([requests[0]]), "{drain}");
    assert!(drain["drained_at_ms"].is_null(), "{drain}");
    let (_, inbox) = server.call(Method::GET, "/api/v1/inbox?limit=500", None).await;
    let told: Vec<&Value> = inbox.as_array().into_iter().flatten().filter(|e| e["type"] == "gpu.draining").collect();
    assert!(
        told.iter().any(|e| e["tenant"] == tenant.as_str() && e["data"]["after"]["reason"] == "fan swap"),
        "{told:#?}"
    );
    let g = &server.node("maint").await.expect("node")["gpus"][gpu];
    assert_eq!((g["cordoned"].as_bool(), g["drain"]["reason"].as_str()), (Some(true), Some("fan swap")), "{g:#}");
    let started = std::time::Instant::now();
    let (s, drain) = server.call(Method::POST, &path, Some(json!({"deadline_s": 1, "reason": "fan swap"}))).await;
    assert_eq!(s, StatusCode::OK, "{drain}");

    // At the deadline (the sweep runs every 15 s) its holder's request is released; then the GPU is drained.
    let drained = wait_for(Duration::from_secs(40), || async {
        let g = server.node("maint").await?["gpus"][gpu].clone();
        g["drain"]["drained_at_ms"].is_i64().then_some(g)
    })
    .await
    .expect("the GPU is drained");
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert_eq!(drained["in_use"], json!([]), "{drained:#}");
    assert_eq!(drained["cordoned"], true, "stays cordoned, empty for maintenance");
    let (_, ended) = server.call(Method::GET, &format!("/api/v1/requests/{}", requests[0]), None).await;
    assert_eq!(ended["state"], "released", "{ended}");
    let (_, audit) = server.call(Method::GET, &format!("/api/v1/audit?object=request/{}", requests[0]), None).await;
    assert!(audit.as_array().into_iter().flatten().any(|e| e["actor"] == "system:drain"), "{audit:#}");
    let (_, inbox) = server.call(Method::GET, "/api/v1/inbox?limit=500", None).await;
    assert!(
        inbox
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["type"] == "gpu.drained" && e["subject"] == format!("gpu/{gpu_id}"))
    );
    // The node's other GPU kept serving: its request is active, it is not cordoned.
    let (_, other) = server.call(Method::GET, &format!("/api/v1/requests/{}", requests[1]), None).await;
    assert_eq!(other["state"], "active", "{other}");
    let kept = &server.node("maint").await.expect("node")["gpus"][kept_gpu];
    assert_eq!((kept["cordoned"].as_bool(), kept["drain"].is_null()), (Some(false), true), "{kept:#}");
    assert_eq!(kept["id"], kept_id.as_str());

    // Uncordoning ends the drain; the CLI drains an empty GPU at once.
    let (s, _) = server.call(Method::POST, &format!("/api/v1/gpus/{gpu_id}/uncordon"), None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(server.node("maint").await.expect("node")["gpus"][gpu]["drain"].is_null());
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["node", "drain", &gpu_id, "--deadline-s", "0", "--reason", "firmware", "--server", &server.base])
        .env("TESSERA_TOKEN", &server.admin)
        .output()
        .await
        .expect("tessera node drain");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    let printed: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert!(printed["drained_at_ms"].is_i64() && printed["holders"] == json!([]), "{printed}");
    server.stop().await;
}

/// A cordon holds back what has not started: a request approved onto a GPU that is then cordoned waits
/// (`gpu_cordoned`), even when the layout change it needs is approved and applied meanwhile, and starts once the GPU
/// is uncordoned. What already runs there keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cordoned_gpu_starts_nothing_new_until_uncordoned() {
    let mut server = Server::start(&sqlite_url(), free_port(), &new_token_secret()).await;
    let mut a = SimAgent::new(&server.base, "cord", "H100-80GB:2", server.join_token(None).await);
    a.start();
    server.settled("cord").await;
    let (_, tenant) = server.call(Method::POST, "/api/v1/tenants", Some(json!({"name": "ml"}))).await;
    let tenant = tenant["id"].as_str().expect("tenant").to_string();
    let quota = json!({"limits": {"compute_slices": 100}});
    server.call(Method::PUT, &format!("/api/v1/tenants/{tenant}/quotas"), Some(quota)).await;
    let ask = |profile: &str| json!({"tenant": tenant, "spec": {"mode": "mig", "profile": profile, "model": "H100-80GB"}, "count": 1});
    let state_of = |id: String| {
        let server = &server;
        async move { server.call(Method::GET, &format!("/api/v1/requests/{id}"), None).await.1 }
    };

    // One slice running before the cordon.
    let (_, running) = server.call(Method::POST, "/api/v1/requests", Some(ask("3g.40gb"))).await;
    let running = running["id"].as_str().expect("id").to_string();
    let (s, approval) = server.call(Method::POST, &format!("/api/v1/requests/{running}/approve"), None).await;
    assert_eq!(s, StatusCode::OK, "{approval}");
    for p in approval["layout_proposals"].as_array().into_iter().flatten() {
        let pid = p["id"].as_str().expect("proposal");
        server.call(Method::POST, &format!("/api/v1/layouts/{pid}/approve"), None).await;
    }
    let active = wait_for(Duration::from_secs(30), || async {
        (state_of(running.clone()).await["state"] == "active").then_some(())
    })
    .await;
    assert!(active.is_some(), "the first request turns active");

    // A whole-GPU instance approved onto a layout change of the other GPU, then that GPU is cordoned and the
    // change approved.
    let (_, second) = server.call(Method::POST, "/api/v1/requests", Some(ask("7g.80gb"))).await;
    let second = second["id"].as_str().expect("id").to_string();
    let (s, approval) = server.call(Method::POST, &format!("/api/v1/requests/{second}/approve"), None).await;
    assert_eq!(s, StatusCode::OK, "{approval}");
    let proposals: Vec<String> = approval["layout_proposals"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["id"].as_str().map(str::to_string))
        .collect();
    assert_eq!(proposals.len(), 1, "the 7g.80gb needs a layout change: {approval}");
    let gpu = approval["reservations"][0]["gpu"].as_str().expect("gpu").to_string();
    let (s, _) = server.call(Method::POST, &format!("/api/v1/gpus/{gpu}/cordon"), None).await;
    assert_eq!(s, StatusCode::OK);
    let (s, v) = server.call(Method::POST, &format!("/api/v1/layouts/{}/approve", proposals[0]), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    // The agent applies everything it is sent (the new layout) and reports back; the held-back slice is not sent.
    let node = server.settled("cord").await;
    let g = node["gpus"].as_array().into_iter().flatten().find(|g| g["id"] == gpu.as_str()).cloned().expect("gpu");
    assert!(
        g["layout"].as_array().into_iter().flatten().any(|i| i["profile"] == "7g.80gb"),
        "the layout change is applied: {node:#}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = state_of(second.clone()).await;
    assert_ne!(held["state"], "active", "nothing new starts on a cordoned GPU: {held}");
    assert_eq!(held["waiting"]["reason"]["code"], "gpu_cordoned", "{held}");
    assert_eq!(state_of(running.clone()).await["state"], "active", "what ran keeps running");

    // Uncordoned: it starts.
    let (s, _) = server.call(Method::POST, &format!("/api/v1/gpus/{gpu}/uncordon"), None).await;
    assert_eq!(s, StatusCode::OK);
    let started = wait_for(Duration::from_secs(30), || async {
        (state_of(second.clone()).await["state"] == "active").then_some(())
    })
    .await;
    assert!(started.is_some(), "it starts once uncordoned: {}", state_of(second.clone()).await);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_busy_instance_is_never_destroyed_and_goes_once_its_processes_end() {
    let mut server = Server::start(&sqlite_url(), free_port(), &new_token_secret()).await;
    let mut a = SimAgent::new(&server.base, "busy", "H100-80GB:1", server.join_token(None).await);
    a.transport = Transport::LongPoll;
    a.start();
    let node = server.settled("busy").await;
    let gpu = gpu_id(&node, 0);
    server.set_layout(&gpu, json!([{"profile": "3g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 4}])).await;
    server.settled("busy").await;
    let busy = a.instances(0).into_iter().find(|(_, s, _)| *s == 4).expect("instance at 4").2;
    let pid = a.sim.lock().expect("sim").start_process(&busy).expect("process");

    // A layout without it: the agent refuses to destroy it while the process runs, and says why.
    server.set_layout(&gpu, json!([{"profile": "3g.40gb", "start": 0}, {"profile": "1g.10gb", "start": 6}])).await;
    let failed = wait_for(Duration::from_secs(20), || async {
        let n = server.node("busy").await?;
        (n["state"] == "failed" && n["observed_generation"] == n["generation"]).then_some(n)
    })
    .await
    .expect("the node reports the busy instance");
    let codes: Vec<&str> =
        failed["gpus"][0]["errors"].as_array().expect("errors").iter().filter_map(|e| e["code"].as_str()).collect();
    assert!(codes.contains(&"instance_busy"), "{failed}");
    let applied = failed["gpus"][0]["applied"].as_array().expect("applied");
    assert!(applied.iter().any(|i| i["uuid"] == busy.as_str() && i["processes"] == json!([pid])), "{failed}");
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(a.instances(0).iter().any(|(_, _, u)| *u == busy), "still there after retries");
    // Platform admins are told: `layout.failed` for that generation, with the failed step per GPU.
    let subject = format!("node/{}", failed["id"].as_str().expect("id"));
    let generation = failed["generation"].clone();
    let told = |kind: &'static str| {
        let (server, subject, generation) = (&server, subject.clone(), generation.clone());
        async move {
            wait_for(Duration::from_secs(20), || async {
                let (_, inbox) = server.call(Method::GET, "/api/v1/inbox?limit=500", None).await;
                inbox
                    .as_array()?
                    .iter()
                    .find(|e| {
                        e["type"] == kind
                            && e["subject"] == subject.as_str()
                            && e["data"]["after"]["generation"] == generation
                    })
                    .cloned()
            })
            .await
        }
    };
    let event = told("layout.failed").await.expect("layout.failed is told");
    let errors = event["data"]["after"]["errors"].as_array().cloned().unwrap_or_default();
    assert!(errors.iter().any(|e| e["code"] == "instance_busy" && e["gpu"].is_string()), "{event:#}");
    // The agent reports who runs the process (the simulator's user and command, no pod), and, as no allocation
    // holds the instance, the server judges it unallocated use and tells platform admins.
    let shown = wait_for(Duration::from_secs(20), || async {
        let n = server.node("busy").await?;
        n["gpus"][0]["processes"].as_array()?.iter().find(|p| p["pid"] == json!(pid)).cloned()
    })
    .await
    .expect("the node's GPU lists the process");
    assert_eq!(
        (&shown["device"], &shown["user"], &shown["command"], &shown["pod"], &shown["unallocated"]),
        (&json!(busy), &json!("sim"), &json!("sim-load"), &Value::Null, &json!("no_allocation")),
        "{shown}"
    );
    let stray = wait_for(Duration::from_secs(20), || async {
        let (_, inbox) = server.call(Method::GET, "/api/v1/inbox?limit=500", None).await;
        inbox.as_array()?.iter().find(|e| e["type"] == "gpu.unallocated_use").cloned()
    })
    .await;
    assert!(stray.is_some(), "gpu.unallocated_use is told");

    // The process ends: the next retry destroys it and creates what the layout wants.
    a.sim.lock().expect("sim").stop_processes(&busy);
    server.settled("busy").await;
    let now: Vec<(String, u8)> = a.instances(0).into_iter().map(|(p, s, _)| (p, s)).collect();
    assert_eq!(now, [("3g.40gb".to_string(), 0), ("1g.10gb".to_string(), 6)]);
    // ... and told applied, once.
    told("layout.applied").await.expect("layout.applied is told once the same generation is applied");
    let (_, inbox) = server.call(Method::GET, "/api/v1/inbox?limit=500", None).await;
    let failures = inbox.as_array().into_iter().flatten().filter(|e| e["type"] == "layout.failed").count();
    assert_eq!(failures, 1, "each retry's report is not told again: {inbox:#}");
    server.stop().await;
}

/// A join whose answer was lost is sent again by the agent with the same token and the credential it proposed:
/// the answer is the first one's, the node is not joined twice, and nobody else can use the token.
async fn a_join_sent_again_gets_the_same_answer(url: &str) {
    let mut server = Server::start(url, free_port(), &new_token_secret()).await;
    let token = server.join_token(None).await;
    let join = |credential: Value| {
        let server = &server;
        let token = token.clone();
        async move {
            let inventory = json!({"hostname": "again", "agent_version": "0", "backend": "sim", "gpus": []});
            let r = server
                .client
                .post(format!("{}/api/v1/agent/join", server.base))
                .json(&json!({"token": token, "inventory": inventory, "credential": credential}))
                .send()
                .await
                .expect("send");
            let status = r.status();
            (status, r.json::<Value>().await.expect("json"))
        }
    };
    // A proposal that is not a credential is refused before the token is spent.
    for bad in [json!("tsn_short"), json!(format!("tsn_{}", "G".repeat(64))), json!(format!("tsr_{}", "a".repeat(64)))]
    {
        let (status, body) = join(bad.clone()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {body}");
        assert_eq!(body["code"], "invalid_credential");
    }
    let proposed = format!("tsn_{}", "0123456789abcdef".repeat(4));
    let (status, first) = join(json!(proposed)).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    assert_eq!(first["credential"], json!(proposed));
    // The same join again (the first answer was lost): the same answer, one node.
    for _ in 0..2 {
        let (status, again) = join(json!(proposed)).await;
        assert_eq!(status, StatusCode::CREATED, "{again}");
        assert_eq!(again, first);
    }
    let joined = server.nodes().await.into_iter().filter(|n| n["name"] == "again").count();
    assert_eq!(joined, 1);
    let (_, audit) = server.call(Method::GET, "/api/v1/audit/entries?limit=500", None).await;
    let joins = audit["entries"].as_array().into_iter().flatten().filter(|e| e["action"] == "node.join").count();
    assert_eq!(joins, 1, "one join is audited: {audit:#}");
    // The credential works.
    let r = server.client.get(format!("{}/api/v1/agent/spec", server.base)).bearer_auth(&proposed).send().await;
    assert_eq!(r.expect("send").status(), StatusCode::OK);
    // The spent token with another credential, or with none: refused.
    let (status, body) = join(json!(format!("tsn_{}", "f".repeat(64)))).await;
    assert_eq!((status, body["code"].clone()), (StatusCode::UNAUTHORIZED, json!("join_token_invalid")), "{body}");
    let (status, _) = join(Value::Null).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // Once the credential is revoked (the node joined again with a token made for it), the old join is over.
    let rejoin = server.join_token(Some("again")).await;
    let inventory = json!({"hostname": "again", "agent_version": "0", "backend": "sim", "gpus": []});
    let r = server
        .client
        .post(format!("{}/api/v1/agent/join", server.base))
        .json(&json!({"token": rejoin, "inventory": inventory}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::CREATED);
    let (status, _) = join(json!(proposed)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "a revoked credential does not replay its join");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_join_sent_again_gets_the_same_answer_on_sqlite() {
    a_join_sent_again_gets_the_same_answer(&sqlite_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_join_sent_again_gets_the_same_answer_on_postgres() {
    let Some(db) = crate::harness::ScratchDb::create("a_join_sent_again_gets_the_same_answer_on_postgres").await else {
        return;
    };
    a_join_sent_again_gets_the_same_answer(&db.url).await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn join_tokens_are_single_use_and_nodes_go_not_ready_without_heartbeats() {
    let mut server = Server::start(&sqlite_url(), free_port(), &new_token_secret()).await;
    // Join tokens come from the CLI too.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["node", "join-token", "--name", "once", "--ttl", "600", "--server", &server.base])
        .env("TESSERA_TOKEN", &server.admin)
        .output()
        .await
        .expect("tessera node join-token");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    let printed: Value = serde_json::from_slice(&out.stdout).expect("json");
    let token = printed["token"].as_str().expect("token").to_string();
    assert!(token.starts_with("tsj_"));
    let mut a = SimAgent::new(&server.base, "host-of-once", "A100-80GB:1", token.clone());
    a.start();
    server.settled("once").await;

    // The token is spent: a second node cannot join with it.
    let inventory = json!({"hostname": "twice", "agent_version": "0", "backend": "sim", "gpus": []});
    let r = server
        .client
        .post(format!("{}/api/v1/agent/join", server.base))
        .json(&json!({"token": token, "inventory": inventory}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["code"], "join_token_invalid");
    let (_, tokens) = server.call(Method::GET, "/api/v1/join-tokens", None).await;
    assert!(tokens[0]["used_at_ms"].is_i64() && tokens[0]["token"].is_null(), "{tokens}");

    // Agent routes take node credentials only.
    let r = server.client.get(format!("{}/api/v1/agent/spec", server.base)).bearer_auth(&server.admin).send().await;
    assert_eq!(r.expect("send").status(), StatusCode::FORBIDDEN);

    // A process runs on the node (an instance with nothing allocated): the node's view lists it.
    let node = server.settled("once").await;
    server.set_layout(&gpu_id(&node, 0), json!([{"profile": "7g.80gb", "start": 0}])).await;
    server.settled("once").await;
    let instance = a.instances(0)[0].2.clone();
    let pid = a.sim.lock().expect("sim").start_process(&instance).expect("process");
    let processes = || {
        let server = &server;
        async move { server.node("once").await.map(|n| n["gpus"][0]["processes"].clone()).unwrap_or(Value::Null) }
    };
    let listed = wait_for(Duration::from_secs(20), || async {
        processes().await.as_array()?.iter().any(|p| p["pid"] == json!(pid)).then_some(())
    })
    .await;
    assert!(listed.is_some(), "{}", processes().await);

    // No heartbeat for 20 s: not ready.
    a.kill();
    let gone = wait_for(Duration::from_secs(30), || async {
        let n = server.node("once").await?;
        (n["state"] == "not-ready").then_some(())
    })
    .await;
    assert!(gone.is_some(), "{:?}", server.node("once").await);
    // ... and told (by the sweep, within its 15 s).
    let told = |kind: &'static str| {
        let server = &server;
        async move {
            wait_for(Duration::from_secs(40), || async {
                let (_, inbox) = server.call(Method::GET, "/api/v1/inbox?limit=500", None).await;
                inbox.as_array()?.iter().find(|e| e["type"] == kind && e["data"]["after"]["node"] == "once").cloned()
            })
            .await
        }
    };
    told("node.not_ready").await.expect("node.not_ready is told");
    // What a silent node last said runs on it is not shown as running now.
    assert_eq!(processes().await, json!([]), "a node not ready lists no processes");
    // Back: ready again, with the same identity (the credential from the state directory).
    a.token = None;
    a.start();
    server.settled("once").await;
    assert_eq!(server.nodes().await.len(), 1);
    told("node.ready").await.expect("node.ready is told");
    let again = wait_for(Duration::from_secs(20), || async {
        processes().await.as_array()?.iter().any(|p| p["pid"] == json!(pid)).then_some(())
    })
    .await;
    assert!(again.is_some(), "its next status lists the process again: {}", processes().await);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_postgres_a_change_made_on_one_replica_is_pushed_by_the_replica_the_agent_is_on() {
    let Some(db) = crate::harness::ScratchDb::create("the two-replica test").await else { return };
    let url = db.url.clone();
    let admin = new_token_secret();
    let mut one = Server::start(&url, free_port(), &admin).await;
    let mut two = Server::start(&url, free_port(), &admin).await;

    // The agent joins and stays connected through replica one.
    let mut agent = SimAgent::new(&one.base, "replicated", "H100-80GB:1", one.join_token(None).await);
    agent.start();
    let node = one.settled("replicated").await;
    let gpu = node["gpus"][0]["uuid"].as_str().expect("uuid").to_string();
    let cred = std::fs::read_to_string(agent.dir.join("credential.json")).expect("credential");
    let cred: Value = serde_json::from_str(&cred).expect("credential json");
    let credential = cred["credential"].as_str().expect("credential").to_string();
    // Replica two takes the node's telemetry too (behind a load balancer any replica may): it now holds the node's
    // credential and devices, the GPU alone.
    let sample = |device: &str| {
        json!({"devices": [{"device": device, "gpu": gpu, "samples": [
            {"t": tessera_server::store::now_ms(), "util": 50.0, "mem_used_mib": 1.0, "mem_total_mib": 81_559.0}]}]})
    };
    let telemetry = |server: &Server, batch: Value| {
        let request = server.client.post(format!("{}/api/v1/agent/telemetry", server.base)).bearer_auth(&credential);
        async move {
            let r = request.json(&batch).send().await.expect("send");
            (r.status(), r.json::<Value>().await.unwrap_or_default())
        }
    };
    let (s, took) = telemetry(&two, sample(&gpu)).await;
    assert_eq!((s, took["accepted"].as_u64()), (StatusCode::OK, Some(1)), "{took}");
    let (_, tenant) = two.call(Method::POST, "/api/v1/tenants", Some(json!({"name": "pg"}))).await;
    let tenant = tenant["id"].as_str().expect("tenant").to_string();
    two.call(Method::PUT, &format!("/api/v1/tenants/{tenant}/quotas"), Some(json!({"limits": {"compute_slices": 7}})))
        .await;

    // Everything else happens on replica two; the spec must reach the agent well before any periodic re-check
    // (the sweep runs every 15 s, the socket's own re-check every 30 s): through LISTEN/NOTIFY.
    let ask =
        json!({"tenant": tenant, "spec": {"mode": "mig", "profile": "2g.20gb", "model": "H100-80GB"}, "count": 1});
    let (s, request) = two.call(Method::POST, "/api/v1/requests", Some(ask)).await;
    assert_eq!(s, StatusCode::CREATED, "{request}");
    let id = request["id"].as_str().expect("id").to_string();
    let (s, approval) = two.call(Method::POST, &format!("/api/v1/requests/{id}/approve"), None).await;
    assert_eq!(s, StatusCode::OK, "{approval}");
    let proposal = approval["layout_proposals"][0]["id"].as_str().expect("layout change").to_string();
    let before = two.node("replicated").await.expect("node")["generation"].as_i64().expect("generation");
    let started = tokio::time::Instant::now();
    let (s, _) = two.call(Method::POST, &format!("/api/v1/layouts/{proposal}/approve"), None).await;
    assert_eq!(s, StatusCode::OK);
    let active = wait_for(Duration::from_secs(5), || async {
        let (_, r) = two.call(Method::GET, &format!("/api/v1/requests/{id}"), None).await;
        (r["state"] == "active").then_some(())
    })
    .await;
    if active.is_none() {
        let (_, r) = two.call(Method::GET, &format!("/api/v1/requests/{id}"), None).await;
        let cred = std::fs::read_to_string(agent.dir.join("credential.json")).unwrap_or_default();
        let cred: Value = serde_json::from_str(&cred).unwrap_or_default();
        let status = json!({"observed_generation": 0, "gpus": []});
        let put = one
            .client
            .put(format!("{}/api/v1/agent/status", one.base))
            .bearer_auth(cred["credential"].as_str().unwrap_or_default())
            .json(&status)
            .send()
            .await
            .expect("send");
        let put = put.text().await.unwrap_or_default();
        panic!("not pushed through replica one within 5 s: {r} {:?} status: {put}", two.node("replicated").await);
    }
    let took = started.elapsed();
    let after = one.settled("replicated").await;
    assert!(after["generation"].as_i64().expect("generation") > before);
    assert_eq!(agent.instances(0).len(), 1);
    eprintln!("layout approved on replica two -> active through replica one: {took:?}");
    assert_eq!(node["gpus"][0]["uuid"], after["gpus"][0]["uuid"]);

    // The status reporting the new instance was stored through replica one; replica two, which cached the node's
    // devices without it (and keeps them for minutes), hears of it from the database and takes its samples.
    let mig = agent.instances(0)[0].2.clone();
    let batch = |mig: &str| {
        let mut b = sample(mig);
        b["devices"][0]["profile"] = json!("2g.20gb");
        b["devices"][0]["start"] = json!(agent.instances(0)[0].1);
        b
    };
    let taken = wait_for(Duration::from_secs(2), || async {
        let (s, r) = telemetry(&two, batch(&mig)).await;
        (s == StatusCode::OK && r["accepted"] == 1).then_some(())
    })
    .await;
    assert!(taken.is_some(), "replica two takes the new instance's samples: {:?}", telemetry(&two, batch(&mig)).await);

    // Revoked through replica one, the credential replica two cached (for minutes) stops working there at once.
    let node_id = node["id"].as_str().expect("node id");
    let (s, r) = one.call(Method::DELETE, &format!("/api/v1/nodes/{node_id}/credentials"), None).await;
    assert_eq!(s, StatusCode::OK, "{r}");
    let refused = wait_for(Duration::from_secs(2), || async {
        (telemetry(&two, sample(&gpu)).await.0 == StatusCode::UNAUTHORIZED).then_some(())
    })
    .await;
    assert!(refused.is_some(), "a revoked credential is refused by the other replica within 2 s");

    agent.kill();
    one.stop().await;
    two.stop().await;
    db.drop().await;
}

/// The `tessera-agent` binary next to `tessera` (./scripts/test builds every binary before the tests).
fn agent_binary() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_BIN_EXE_tessera")).with_file_name("tessera-agent");
    assert!(
        path.exists(),
        "{} is missing: build it first (`cargo build --workspace --bins`, as ./scripts/test does)",
        path.display()
    );
    path
}

fn agent_process(base: &str, dir: &std::path::Path, token: &str, delay_ms: u64) -> tokio::process::Child {
    tokio::process::Command::new(agent_binary())
        .args(["--server", base, "--backend", "sim", "--sim-gpus", "H100-80GB:1", "--hostname", "proc"])
        .args(["--sim-step-delay-ms", &delay_ms.to_string()])
        .arg("--state-dir")
        .arg(dir)
        .env("TESSERA_JOIN_TOKEN", token)
        .env_remove("RUST_LOG")
        .kill_on_drop(true)
        .spawn()
        .expect("start tessera-agent")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_agent_process_joins_with_a_bootstrap_token_and_converges_after_kill_9_mid_apply() {
    let token = "tsj_bootstrap_for_the_agent_process_00000000";
    let admin = new_token_secret();
    let mut server =
        Server::start_with(&sqlite_url(), free_port(), &admin, &[("TESSERA_BOOTSTRAP_JOIN_TOKENS", token)]).await;
    let dir = std::env::temp_dir().join(format!("tessera-agent-proc-{}", uuid::Uuid::now_v7().simple()));
    let mut agent = agent_process(&server.base, &dir, token, 0);
    let node = server.settled("proc").await;
    let sim_file = dir.join("sim-gpus.json");
    let instances = || -> Vec<(String, u8)> {
        let text = std::fs::read_to_string(&sim_file).unwrap_or_default();
        let v: Value = serde_json::from_str(&text).unwrap_or_default();
        v["gpus"][0]["instances"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|i| (i["profile"].as_str().unwrap_or("").to_string(), i["start"].as_u64().unwrap_or(99) as u8))
                    .collect()
            })
            .unwrap_or_default()
    };

    // Slow steps, and kill -9 once the first instance exists.
    agent.kill().await.expect("kill");
    let mut agent = agent_process(&server.base, &dir, token, 300);
    server.settled("proc").await;
    let seven: Vec<Value> = (0..7).map(|s| json!({"profile": "1g.10gb", "start": s})).collect();
    server.set_layout(&gpu_id(&node, 0), json!(seven)).await;
    let started = wait_for(Duration::from_secs(10), || async { (!instances().is_empty()).then_some(()) }).await;
    assert!(started.is_some(), "the apply started");
    agent.kill().await.expect("kill -9");
    let half = instances().len();
    assert!(half < 7, "killed mid-apply ({half} of 7)");

    // Restarted (the credential and the simulated GPUs are in the state directory; the token is spent): converges.
    let _agent = agent_process(&server.base, &dir, token, 0);
    let node = server.settled("proc").await;
    assert_eq!(instances(), (0..7).map(|s| ("1g.10gb".to_string(), s)).collect::<Vec<_>>());
    assert_eq!(node["gpus"][0]["applied"].as_array().map(Vec::len), Some(7));
    assert_eq!(server.nodes().await.len(), 1, "the same node, not a second one");
    server.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
