//! Three replicas on the local PostgreSQL behind HAProxy (Debian's package), as a deployment runs them, through a
//! rolling restart (SIGTERM one replica, wait for it to be ready again, then the next): clients that never retry
//! create tenants, change their quotas and read them back through the balancer without one failed request, and
//! the simulated agents connected through it are all on the other replicas within 5 s of each replica's SIGTERM.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use reqwest::{Client, StatusCode};
use serde_json::json;
use tessera_server::http::auth::new_token_secret;

use crate::agents::{Server, SimAgent, free_port, wait_for};

/// HAProxy in front of `backends`, checking each with `GET /readyz` every 250 ms: out after one failure (a 503, or
/// no answer within 2 s: a busy replica may take longer than the interval to answer), in after two successes. No keep-alive to the servers (each request opens its connection, so a replica that closes its
/// listener refuses a connection, which HAProxy retries on another), WebSockets tunnelled.
fn haproxy_config(port: u16, backends: &[u16]) -> String {
    let servers: String =
        backends.iter().enumerate().map(|(i, p)| format!("    server r{i} 127.0.0.1:{p} check\n")).collect();
    format!(
        "global\n    maxconn 4096\n\
         defaults\n    mode http\n    timeout connect 1s\n    timeout client 60s\n    timeout server 60s\n    \
         timeout tunnel 1h\n    timeout check 2s\n    retries 3\n    option redispatch\n    retry-on conn-failure\n    \
         option http-server-close\n\
         frontend api\n    bind 127.0.0.1:{port}\n    default_backend tessera\n\
         backend tessera\n    balance roundrobin\n    option httpchk GET /readyz\n    http-check expect status 200\n    \
         default-server inter 250ms fall 1 rise 2\n{servers}"
    )
}

struct Balancer {
    child: tokio::process::Child,
    base: String,
    config: std::path::PathBuf,
}

impl Balancer {
    async fn start(backends: &[u16]) -> Balancer {
        let port = free_port();
        let config = std::env::temp_dir().join(format!("tessera-haproxy-{}.cfg", uuid::Uuid::now_v7().simple()));
        std::fs::write(&config, haproxy_config(port, backends)).expect("config");
        // Debian puts it in /usr/sbin, which a user's PATH may leave out.
        let bin = if std::path::Path::new("/usr/sbin/haproxy").exists() { "/usr/sbin/haproxy" } else { "haproxy" };
        let child = tokio::process::Command::new(bin)
            .args(["-db", "-f", &config.display().to_string()])
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("HAProxy is installed where PostgreSQL's tests run (Debian: apt install haproxy)");
        let base = format!("http://127.0.0.1:{port}");
        let up = wait_for(Duration::from_secs(10), || async {
            let r = Client::new().get(format!("{base}/readyz")).send().await.ok()?;
            (r.status() == StatusCode::OK).then_some(())
        })
        .await;
        assert!(up.is_some(), "HAProxy answers");
        Balancer { child, base, config }
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_file(&self.config);
    }
}

/// Agents connected to each replica, as its `/metrics` says.
async fn connected(replicas: &[Server]) -> u64 {
    let mut total = 0;
    for r in replicas {
        let Ok(resp) = r.client.get(format!("{}/metrics", r.base)).bearer_auth(&r.admin).send().await else {
            continue;
        };
        let text = resp.text().await.unwrap_or_default();
        total += text
            .lines()
            .find_map(|l| l.strip_prefix("tessera_agents_connected "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    total
}

/// Agents a test connects through the balancer.
const AGENTS: u64 = 30;

/// Three replicas on `db_url` with `env`, HAProxy in front, and [`AGENTS`] simulated agents connected through it
/// (named `prefix-<i>`), spread over the replicas by it.
async fn cluster(
    db_url: &str,
    admin: &str,
    env: &[(&str, &str)],
    prefix: &str,
) -> (Vec<Server>, Balancer, Vec<SimAgent>) {
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(Server::start_with(db_url, free_port(), admin, env).await);
    }
    let ports: Vec<u16> = replicas.iter().map(|r| r.port).collect();
    let balancer = Balancer::start(&ports).await;
    let mut agents = Vec::new();
    for i in 0..AGENTS {
        let token = replicas[0].join_token(None).await;
        let mut a = SimAgent::new(&balancer.base, &format!("{prefix}-{i}"), "H100-80GB:1", token);
        a.start();
        agents.push(a);
    }
    let all = wait_for(Duration::from_secs(30), || async { (connected(&replicas).await == AGENTS).then_some(()) });
    assert!(all.await.is_some(), "every agent connects: {}", connected(&replicas).await);
    (replicas, balancer, agents)
}

/// Stops what [`cluster`] started and drops the database.
async fn teardown(replicas: Vec<Server>, balancer: Balancer, agents: Vec<SimAgent>, db: crate::harness::ScratchDb) {
    for mut a in agents {
        a.kill();
    }
    for mut r in replicas {
        r.stop().await;
    }
    drop(balancer);
    db.drop().await;
}

/// Agents connected to the replicas but `skip`.
async fn connected_but(replicas: &[Server], skip: usize) -> u64 {
    let mut total = 0;
    for (j, r) in replicas.iter().enumerate() {
        if j != skip {
            total += connected(std::slice::from_ref(r)).await;
        }
    }
    total
}

/// What the clients did: operations, and failures with what they were.
#[derive(Default)]
struct Tally {
    requests: AtomicU64,
    retries: AtomicU64,
    failures: std::sync::Mutex<Vec<String>>,
    /// Requests acknowledged to a client: (its `Idempotency-Key`, the id it was given).
    created: std::sync::Mutex<Vec<(String, String)>>,
}

/// One client: create a tenant, set its quota, read it back, again and again, never retrying.
async fn client(base: String, admin: String, id: usize, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
    let http = Client::new();
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        let name = format!("c{id}-{n}");
        n += 1;
        let fail = |what: String| tally.failures.lock().expect("lock").push(what);
        let created =
            http.post(format!("{base}/api/v1/tenants")).bearer_auth(&admin).json(&json!({"name": name})).send().await;
        tally.requests.fetch_add(1, Ordering::Relaxed);
        let tenant = match created {
            Ok(r) if r.status() == StatusCode::CREATED => {
                r.json::<serde_json::Value>().await.expect("json")["id"].as_str().expect("id").to_string()
            }
            Ok(r) => {
                fail(format!("create {name}: {}", r.status()));
                continue;
            }
            Err(e) => {
                fail(format!("create {name}: {e}"));
                continue;
            }
        };
        let quota = json!({"limits": {"compute_slices": n}});
        let put =
            http.put(format!("{base}/api/v1/tenants/{tenant}/quotas")).bearer_auth(&admin).json(&quota).send().await;
        tally.requests.fetch_add(1, Ordering::Relaxed);
        match put {
            Ok(r) if r.status().is_success() => {}
            Ok(r) => fail(format!("quota {name}: {}", r.status())),
            Err(e) => fail(format!("quota {name}: {e}")),
        }
        let read = http.get(format!("{base}/api/v1/tenants/{tenant}")).bearer_auth(&admin).send().await;
        tally.requests.fetch_add(1, Ordering::Relaxed);
        match read {
            Ok(r) if r.status() == StatusCode::OK => {}
            Ok(r) => fail(format!("read {name}: {}", r.status())),
            Err(e) => fail(format!("read {name}: {e}")),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolling_restart_behind_haproxy_fails_no_request_and_moves_every_agent() {
    let Some(db) = crate::harness::ScratchDb::create("a_rolling_restart_behind_haproxy").await else { return };
    let admin = new_token_secret();
    let env = [("TESSERA_SHUTDOWN_DELAY_S", "2"), ("TESSERA_MAX_CONNECTIONS_PER_ADDRESS", "0")];
    let (mut replicas, balancer, agents) = cluster(&db.url, &admin, &env, "lb").await;

    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let clients: Vec<_> = (0..20)
        .map(|i| tokio::spawn(client(balancer.base.clone(), admin.clone(), i, stop.clone(), tally.clone())))
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut moved = Vec::new();
    for i in 0..replicas.len() {
        let stopping = Instant::now();
        replicas[i].terminate();
        // Its agents are on the other two, within the shutdown delay.
        let back = wait_for(Duration::from_secs(10), || async {
            (connected_but(&replicas, i).await == AGENTS).then(|| stopping.elapsed())
        })
        .await;
        let took = back.unwrap_or_else(|| panic!("replica {i}'s agents did not all reconnect"));
        moved.push(took);
        let exit = replicas[i].exited(Duration::from_secs(30)).await.expect("the replica stops");
        assert_eq!(exit.code(), Some(0), "{exit:?}");
        let port = replicas[i].port;
        replicas[i] = Server::start_with(&db.url, port, &admin, &env).await;
        // In the balancer again (two checks of 250 ms).
        tokio::time::sleep(Duration::from_millis(800)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.await.expect("client");
    }
    let requests = tally.requests.load(Ordering::Relaxed);
    let failures = tally.failures.lock().expect("lock").clone();
    eprintln!(
        "rolling restart of 3 replicas behind HAProxy: {requests} requests, {} failed; {AGENTS} agents, all on the \
         other replicas {moved:?} after each stop began (shutdown delay 2 s)",
        failures.len()
    );
    assert!(requests > 100, "the clients kept working: {requests}");
    assert!(failures.is_empty(), "clients that do not retry saw failures: {failures:#?}");
    for t in &moved {
        assert!(*t < Duration::from_secs(5), "agents moved after {t:?}");
    }
    teardown(replicas, balancer, agents, db).await;
}

/// One client that retries what a dead replica leaves unanswered: a connection error or a 502, 503 or 504 is
/// sent again with the same `Idempotency-Key`. Each request it creates is named by its key (`reason`).
async fn retrying_client(base: String, admin: String, tenant: String, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
    let http = Client::builder().timeout(Duration::from_secs(10)).build().expect("client");
    let retried = |status: Option<StatusCode>| status.is_none_or(|s| matches!(s.as_u16(), 502..=504));
    while !stop.load(Ordering::SeqCst) {
        let key = uuid::Uuid::now_v7().simple().to_string();
        let body = json!({"tenant": tenant, "spec": {"mode": "exclusive", "model": "H100-80GB"}, "count": 1,
            "reason": key});
        let until = Instant::now() + Duration::from_secs(30);
        let id = loop {
            let r = http
                .post(format!("{base}/api/v1/requests"))
                .bearer_auth(&admin)
                .header("Idempotency-Key", &key)
                .json(&body)
                .send()
                .await;
            tally.requests.fetch_add(1, Ordering::Relaxed);
            let status = r.as_ref().ok().map(|r| r.status());
            match r {
                Ok(r) if matches!(r.status(), StatusCode::CREATED | StatusCode::OK) => {
                    break Some(
                        r.json::<serde_json::Value>().await.expect("json")["id"].as_str().expect("id").to_string(),
                    );
                }
                _ if retried(status) && Instant::now() < until => {
                    tally.retries.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                r => {
                    tally.failures.lock().expect("lock").push(format!("create {key}: {:?}", r.map(|r| r.status())));
                    break None;
                }
            }
        };
        let Some(id) = id else { continue };
        tally.created.lock().expect("lock").push((key, id.clone()));
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let r = http.get(format!("{base}/api/v1/requests/{id}")).bearer_auth(&admin).send().await;
            tally.requests.fetch_add(1, Ordering::Relaxed);
            let status = r.as_ref().ok().map(|r| r.status());
            match status {
                Some(StatusCode::OK) => break,
                s if retried(s) && Instant::now() < until => {
                    tally.retries.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                s => {
                    tally.failures.lock().expect("lock").push(format!("read {id}: {s:?}"));
                    break;
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_killed_every_10_s_behind_haproxy_loses_and_repeats_nothing_and_agents_come_back() {
    let Some(db) = crate::harness::ScratchDb::create("a_replica_killed_every_10_s_behind_haproxy").await else {
        return;
    };
    let admin = new_token_secret();
    let env = [("TESSERA_MAX_CONNECTIONS_PER_ADDRESS", "0")];
    let (mut replicas, balancer, agents) = cluster(&db.url, &admin, &env, "kill").await;
    let (_, tenant) = replicas[0].call(reqwest::Method::POST, "/api/v1/tenants", Some(json!({"name": "jobs"}))).await;
    let tenant = tenant["id"].as_str().expect("tenant").to_string();

    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let clients: Vec<_> = (0..20)
        .map(|_| {
            let (base, admin, tenant) = (balancer.base.clone(), admin.clone(), tenant.clone());
            tokio::spawn(retrying_client(base, admin, tenant, stop.clone(), tally.clone()))
        })
        .collect();
    let mut back = Vec::new();
    for kill in 0..6 {
        tokio::time::sleep(Duration::from_secs(10)).await;
        let i = kill % replicas.len();
        let killed = Instant::now();
        replicas[i].stop().await;
        // Its agents are on the other two (through the balancer) before it is started again.
        let again = wait_for(Duration::from_secs(15), || async {
            (connected_but(&replicas, i).await == AGENTS).then(|| killed.elapsed())
        })
        .await;
        back.push(again.unwrap_or_else(|| panic!("agents of the replica killed at kill {kill} did not come back")));
        let port = replicas[i].port;
        replicas[i] = Server::start_with(&db.url, port, &admin, &env).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.await.expect("client");
    }
    let failures = tally.failures.lock().expect("lock").clone();
    let created = tally.created.lock().expect("lock").clone();
    // Every acknowledged request is there once: one row per key, with the id the client was given.
    let pool = sqlx::PgPool::connect(&db.url).await.expect("postgres");
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT reason, id FROM slice_requests").fetch_all(&pool).await.expect("requests");
    pool.close().await;
    let mut by_key: std::collections::HashMap<&str, Vec<&str>> = std::collections::HashMap::new();
    for (reason, id) in &rows {
        by_key.entry(reason.as_str()).or_default().push(id.as_str());
    }
    let duplicates: Vec<_> = by_key.iter().filter(|(_, ids)| ids.len() > 1).collect();
    let lost: Vec<_> = created.iter().filter(|(k, id)| by_key.get(k.as_str()) != Some(&vec![id.as_str()])).collect();
    back.sort();
    eprintln!(
        "kill -9 of a replica every 10 s for a minute behind HAProxy: {} requests ({} retried), {} created, {} failed, \
         {} duplicated, {} lost; {AGENTS} agents all connected again {:?} after each kill (slowest last)",
        tally.requests.load(Ordering::Relaxed),
        tally.retries.load(Ordering::Relaxed),
        created.len(),
        failures.len(),
        duplicates.len(),
        lost.len(),
        back
    );
    assert!(created.len() > 100, "the clients kept working: {}", created.len());
    assert!(failures.is_empty(), "failed operations: {failures:#?}");
    assert!(duplicates.is_empty(), "requests made twice: {duplicates:?}");
    assert!(lost.is_empty(), "acknowledged and not stored: {lost:?}");
    assert!(back.iter().all(|t| *t < Duration::from_secs(5)), "every agent back within 5 s: {back:?}");
    teardown(replicas, balancer, agents, db).await;
}
