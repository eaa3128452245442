//! `/metrics` as Prometheus reads it: the exposition of a live server, with a simulated agent sending GPU and MIG
//! samples, passes `promtool check metrics`, and a real Prometheus server scrapes it with the admin's bearer token
//! and answers queries over the DCGM series with their tenant and allocation labels. The shipped alert rules
//! (`deploy/prometheus/`) pass `promtool check rules` and their unit tests, fire in that Prometheus on the
//! simulated idle allocation (windows shortened), and every query of the shipped Grafana dashboard
//! (`deploy/grafana/`) is answered.
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
    // Every allocation idle: the idle alert's case.
    agent.sim.lock().expect("sim").idle_percent = 100;
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

    // The shipped rules: checked and unit-tested by promtool.
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let rules = deploy.join("prometheus/tessera-alerts.yml");
    for args in [
        vec!["check".to_string(), "rules".to_string(), rules.display().to_string()],
        vec![
            "test".to_string(),
            "rules".to_string(),
            deploy.join("prometheus/tessera-alerts.test.yml").display().to_string(),
        ],
    ] {
        let out = tokio::process::Command::new(&promtool).args(&args).output().await.expect("promtool");
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // A real Prometheus scrapes the server with the admin's token, as a deployment would, and evaluates the shipped
    // rules with their windows shortened from hours to seconds (the expressions are the shipped ones).
    let work = std::env::temp_dir().join(format!("tessera-prometheus-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&work).expect("temp dir");
    let shipped = std::fs::read_to_string(&rules).expect("rules");
    assert!(shipped.contains("[15m]") && shipped.contains("for: 4h"), "the windows the test shortens are there");
    let fast_rules = work.join("rules.yml");
    std::fs::write(&fast_rules, shipped.replace("[15m]", "[5s]").replace("for: 4h", "for: 5s")).expect("rules copy");
    let token_file = work.join("token");
    std::fs::write(&token_file, &server.admin).expect("token file");
    let config = work.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: tessera\n    authorization:\n      credentials_file: {}\n    \
             static_configs:\n      - targets: ['127.0.0.1:{}']\n",
            fast_rules.display(),
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

    // The fleet gauges the rules select on.
    let ready = wait_for(Duration::from_secs(10), || {
        query("tessera_node_state{Hostname=\"prom\",state=\"ready\"} == 1".to_string())
    })
    .await;
    assert!(ready.is_some(), "the node's state is scraped");
    let health = query("tessera_gpu_health{Hostname=\"prom\",state=\"healthy\"} == 1".to_string()).await;
    assert!(health.is_some(), "the GPU's health is scraped");
    let slices =
        query("sum(tessera_compute_slices{modelName=\"H100-80GB\",state=\"allocated\"}) >= 1".to_string()).await;
    assert!(slices.is_some(), "the allocated instance's compute slices are counted");

    // The idle allocation's alert fires, naming it and its tenant.
    let alerts = |client: reqwest::Client| async move {
        let v: Value =
            client.get(format!("http://127.0.0.1:{web}/api/v1/alerts")).send().await.ok()?.json().await.ok()?;
        v["data"]["alerts"].as_array().cloned()
    };
    let fired = wait_for(Duration::from_secs(60), || {
        let (client, alloc_id) = (server.client.clone(), alloc_id.clone());
        async move {
            alerts(client).await?.into_iter().find(|a| {
                a["labels"]["alertname"] == "TesseraAllocationIdle"
                    && a["state"] == "firing"
                    && a["labels"]["allocation"] == alloc_id.as_str()
            })
        }
    })
    .await;
    let Some(fired) = fired else {
        panic!(
            "TesseraAllocationIdle did not fire for {alloc_id}; alerts: {:?}; log:\n{}",
            alerts(server.client.clone()).await,
            std::fs::read_to_string(work.join("prometheus.log")).unwrap_or_default()
        )
    };
    assert_eq!(fired["labels"]["tenant"], "vision", "{fired}");
    let all = alerts(server.client.clone()).await.unwrap_or_default();
    for quiet in ["TesseraNodeNotReady", "TesseraGpuUnhealthy", "TesseraLayoutFailed"] {
        assert!(!all.iter().any(|a| a["labels"]["alertname"] == quiet), "{quiet} fired on a healthy node: {all:?}");
    }

    // The efficiency report: the H100's seven compute slices split by what they can do, and the tenant's idle
    // allocation, used at 0 % of what it held.
    let efficiency = |query: &'static str| {
        let client = server.client.clone();
        let (base, admin) = (server.base.clone(), server.admin.clone());
        async move {
            let r = client.get(format!("{base}/api/v1/efficiency{query}")).bearer_auth(admin).send().await.ok()?;
            Some((r.status(), r.json::<Value>().await.ok()?))
        }
    };
    let (status, report) = efficiency("").await.expect("efficiency");
    assert_eq!(status, StatusCode::OK, "{report}");
    let total = &report["total"];
    let slices = ["allocated", "placeable", "stranded", "cordoned"].map(|k| total[k].as_u64().expect("count"));
    assert_eq!((total["gpus"].as_u64(), slices), (Some(1), [1, 6, 0, 0]), "{report}");
    assert_eq!(report["models"][0]["model"], "H100-80GB", "{report}");
    let seen = wait_for(Duration::from_secs(30), || async {
        let (_, r) = efficiency("?hours=0.005").await?;
        let t = r["tenants"].as_array()?.iter().find(|t| t["tenant"] == "vision")?.clone();
        t["idle_allocations"].as_array()?.iter().any(|a| a == alloc_id.as_str()).then_some(t)
    })
    .await
    .expect("the idle allocation is listed once active for the whole look-back");
    assert!(seen["held_slice_hours"].as_f64().is_some_and(|h| h > 0.0), "{seen}");
    assert_eq!((seen["used_slice_hours"].as_f64(), seen["efficiency"].as_f64()), (Some(0.0), Some(0.0)), "{seen}");
    let (status, bad) = efficiency("?hours=721").await.expect("efficiency");
    assert_eq!((status, bad["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_idle")), "{bad}");

    // Every query of the shipped dashboard is valid PromQL over these series, and the fleet's panels have data.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(deploy.join("grafana/tessera-dashboard.json")).expect("dashboard"),
    )
    .expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10, "{} panels", panels.len());
    let mut with_data = 0;
    for panel in panels {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("expr").replace("$__rate_interval", "1m");
            let v: Value = server
                .client
                .get(format!("http://127.0.0.1:{web}/api/v1/query"))
                .query(&[("query", expr.as_str())])
                .send()
                .await
                .expect("query")
                .json()
                .await
                .expect("json");
            assert_eq!(v["status"], "success", "panel {}: {expr}: {v}", panel["title"]);
            with_data += usize::from(v["data"]["result"].as_array().is_some_and(|r| !r.is_empty()));
        }
    }
    assert!(with_data >= panels.len() - 2, "only {with_data} of {} panels have data", panels.len());

    let _ = child.kill().await;
    drop(agent);
    let _ = std::fs::remove_dir_all(work);
}
