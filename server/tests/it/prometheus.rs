//! `/metrics` as Prometheus reads it: the exposition of a live server, with a simulated agent sending GPU and MIG
//! samples, passes `promtool check metrics`, and a real Prometheus server scrapes it with the admin's bearer token
//! and answers queries over the DCGM series with their tenant and allocation labels.
//!
//! Both tools come from Debian's `prometheus` package (`scripts/test` installs it).

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use tessera_server::http::auth::new_token_secret;
use tokio::io::AsyncWriteExt;

use crate::agents::{Server, SimAgent, free_port, sqlite_url, wait_for};
use crate::telemetry::{active_slice, fast};

/// A tool of the `prometheus` package, which must be installed.
fn tool(name: &str) -> String {
    let path = format!("/usr/bin/{name}");
    assert!(
        Path::new(&path).exists(),
        "{path} is missing: install Debian's prometheus package (`apt-get install prometheus`; scripts/test does)"
    );
    path
}

/// The server's current exposition.
async fn scrape(server: &Server) -> String {
    let r =
        server.client.get(format!("{}/metrics", server.base)).bearer_auth(&server.admin).send().await.expect("send");
    assert_eq!(r.status(), StatusCode::OK);
    r.text().await.expect("text")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn prometheus_lints_and_scrapes_the_exposition_with_tenant_labels() {
    let promtool = tool("promtool");
    let prometheus = tool("prometheus");
    let server = Server::start(&sqlite_url(), free_port(), &new_token_secret()).await;
    let mut agent = SimAgent::new(&server.base, "prom", "H100-80GB:1", server.join_token(None).await);
    agent.sim.lock().expect("sim").idle_percent = 0;
    agent.telemetry = fast(10_000);
    agent.start();
    server.settled("prom").await;
    let (_, allocation) = active_slice(&server, "vision").await;
    let device = allocation["device_uuid"].as_str().expect("device").to_string();
    let alloc_id = allocation["id"].as_str().expect("id").to_string();
    let text = wait_for(Duration::from_secs(20), || async {
        let text = scrape(&server).await;
        text.lines().any(|l| l.starts_with("DCGM_FI_PROF_GR_ENGINE_ACTIVE{") && l.contains(&device)).then_some(text)
    })
    .await
    .expect("the instance's series is exposed");

    // promtool's parser and linter over the exposition as served.
    let mut check = tokio::process::Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start promtool");
    check.stdin.take().expect("stdin").write_all(text.as_bytes()).await.expect("write");
    let out = check.wait_with_output().await.expect("promtool");
    let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    // The one lint accepted: DCGM exporter's own label `modelName` (DCGM dashboards select on it), which promtool
    // would have in snake_case. A parse error or any other lint fails.
    let problems: Vec<&str> = report
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter(|l| !l.ends_with("label names should be written in 'snake_case' not 'camelCase'"))
        .collect();
    assert!(
        problems.is_empty() && (out.status.success() || !report.is_empty()),
        "promtool check metrics refused the exposition:\n{report}\n---\n{text}"
    );
    assert!(text.contains("modelName=\""), "the accepted lint is about modelName:\n{text}");

    // A real Prometheus scrapes the server with the admin's token, as a deployment would.
    let work = std::env::temp_dir().join(format!("tessera-prometheus-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&work).expect("temp dir");
    let token_file = work.join("token");
    std::fs::write(&token_file, &server.admin).expect("token file");
    let config = work.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: tessera\n    \
             authorization:\n      credentials_file: {}\n    static_configs:\n      - targets: ['127.0.0.1:{}']\n",
            token_file.display(),
            server.port
        ),
    )
    .expect("config");
    let web = free_port();
    let mut child = tokio::process::Command::new(&prometheus)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", work.join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{web}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(work.join("prometheus.log")).expect("log"))
        .kill_on_drop(true)
        .spawn()
        .expect("start prometheus");
    let query = |q: String| {
        let client = server.client.clone();
        async move {
            let r = client
                .get(format!("http://127.0.0.1:{web}/api/v1/query"))
                .query(&[("query", q.as_str())])
                .send()
                .await
                .ok()?;
            let v: Value = r.json().await.ok()?;
            let result = v["data"]["result"].as_array()?.clone();
            (!result.is_empty()).then_some(result)
        }
    };
    let up = wait_for(Duration::from_secs(30), || query("up{job=\"tessera\"} == 1".to_string())).await;
    assert!(
        up.is_some(),
        "Prometheus did not scrape the server; its log:\n{}",
        std::fs::read_to_string(work.join("prometheus.log")).unwrap_or_default()
    );
    let series = wait_for(Duration::from_secs(30), || {
        query(format!("DCGM_FI_PROF_GR_ENGINE_ACTIVE{{MIG_UUID=\"{device}\",tenant=\"vision\"}}"))
    })
    .await
    .expect("Prometheus stored the instance's engine-active series with its tenant");
    assert_eq!(series[0]["metric"]["allocation"], alloc_id.as_str(), "{series:?}");
    assert_eq!(series[0]["metric"]["GPU_I_PROFILE"], "1g.10gb", "{series:?}");
    assert_eq!(series[0]["metric"]["Hostname"], "prom", "{series:?}");
    let ratio: f64 = series[0]["value"][1].as_str().expect("value").parse().expect("number");
    assert!((0.0..=1.0).contains(&ratio), "{series:?}");
    let counted = wait_for(Duration::from_secs(10), || query("tessera_telemetry_samples_total > 0".to_string())).await;
    assert!(counted.is_some(), "the server's own counters are scraped too");

    let _ = child.kill().await;
    drop(agent);
    let _ = std::fs::remove_dir_all(work);
}
