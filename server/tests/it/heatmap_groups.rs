//! Heatmaps of a fleet too large for a row per device: one row per node or GPU model (`group`), live and from the
//! stored series, on both backends. A group's cell is the mean of its GPUs' (a MIG instance is not counted beside
//! its GPU for a platform admin; a member's groups hold only the devices they see), a group says how many devices
//! it sums, and `node` and `model` drill down.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tessera_server::http::auth::{new_node_secret, token_hash};
use tessera_server::store::telemetry::MinuteRow;
use tessera_server::store::{NewGpu, now_ms};

use crate::admin::{App, with_node_credential};
use crate::harness::{TestApp, TestDb, on_both_backends};

on_both_backends!(groups_are_the_means_of_their_gpus_live_and_stored_and_drill_down_by_node_and_model,);

const MINUTE: i64 = 60_000;

/// `(name, devices, first value)` of each group of a heatmap, in the answer's order.
fn groups(h: &Value) -> Vec<(String, u64, Option<f64>)> {
    let groups = h["groups"].as_array().unwrap_or_else(|| panic!("groups in {h}"));
    assert_eq!(h["rows"].as_array().map(Vec::len), Some(0), "a grouped heatmap has no device rows: {h}");
    groups
        .iter()
        .map(|g| {
            let first = g["values"].as_array().into_iter().flatten().find_map(Value::as_f64);
            (g["name"].as_str().unwrap_or("").to_string(), g["devices"].as_u64().unwrap_or(0), first)
        })
        .collect()
}

fn close(got: &[(String, u64, Option<f64>)], want: &[(&str, u64, f64)]) -> bool {
    got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|((n, d, v), (wn, wd, wv))| n == wn && d == wd && v.is_some_and(|v| (v - wv).abs() < 0.01))
}

async fn heat(app: &App, path: &str, token: &str) -> Value {
    let (s, h) = app.get(path, token).await;
    assert_eq!(s, StatusCode::OK, "{path}: {h}");
    h
}

async fn groups_are_the_means_of_their_gpus_live_and_stored_and_drill_down_by_node_and_model(db: &TestDb) {
    let app = with_node_credential(TestApp::on(db).auto_layout().start().await).await;
    let a = app.limited_tenant("team-a", json!({"auto_approve": true, "auto_approve_max_compute_slices": 8}), 8).await;
    let ann = app.member("ann", &a).await;
    let (_, active) = app.active(&ann, &a, "1g.10gb", 1).await;
    let (allocation, instance, h100) = (
        active[0]["id"].as_str().expect("id").to_string(),
        active[0]["device_uuid"].as_str().expect("device").to_string(),
        active[0]["gpu_uuid"].as_str().expect("gpu").to_string(),
    );
    let demo = app.store.nodes().await.expect("nodes").into_iter().next().expect("the demo node");
    let h100_model = demo.gpus.iter().find(|g| g.uuid == h100).expect("the H100").model.clone();
    let other = demo.gpus.iter().find(|g| g.model != h100_model).expect("a GPU of another model");
    let (other_gpu, other_model) = (other.uuid.clone(), other.model.clone());
    // A second node of two GPUs of the H100's model.
    let rack: Vec<String> = (1..=2).map(|i| format!("GPU-00000000-0000-4000-8000-00000000020{i}")).collect();
    let new_gpus: Vec<NewGpu> = rack
        .iter()
        .enumerate()
        .map(|(i, uuid)| NewGpu {
            index: i as u32,
            uuid: uuid.clone(),
            model: h100_model.clone(),
            mig_enabled: false,
            layout: vec![],
        })
        .collect();
    let second = app.store.register_node("rack-2", &new_gpus, "test").await.expect("node");
    let secret = new_node_secret();
    app.store.create_node_credential(&second.id, &token_hash(&secret), "test").await.expect("credential");

    // Live: the H100 at 30 % (its instance at 90 %), the other model's GPU at 10 %; rack-2's GPUs at 20 and 60 %.
    let now = now_ms();
    let series = |device: &str, gpu: &str, profile: Value, start: Value, util: f64| {
        json!({"device": device, "gpu": gpu, "profile": profile, "start": start,
            "samples": (1..=3).map(|s| json!({"t": now - s * 1000, "util": util, "mem_used_mib": 1.0,
                "mem_total_mib": 10.0})).collect::<Vec<_>>()})
    };
    let batch = json!({"dropped": 0, "devices": [
        series(&h100, &h100, Value::Null, Value::Null, 30.0),
        series(&instance, &h100, json!("1g.10gb"), active[0]["start"].clone(), 90.0),
        series(&other_gpu, &other_gpu, Value::Null, Value::Null, 10.0),
    ]});
    let (s, accepted) = app.node_call(Method::POST, "/api/v1/agent/telemetry", batch).await;
    assert_eq!((s, accepted["accepted"].as_u64()), (StatusCode::OK, Some(9)), "{accepted}");
    let batch = json!({"dropped": 0, "devices": [
        series(&rack[0], &rack[0], Value::Null, Value::Null, 20.0),
        series(&rack[1], &rack[1], Value::Null, Value::Null, 60.0),
    ]});
    let r = app
        .client
        .post(format!("{}/api/v1/agent/telemetry", app.base))
        .bearer_auth(&secret)
        .json(&batch)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::OK);

    let live = "/api/v1/telemetry/heatmap?metric=util&step=1";
    let by_node = heat(&app, &format!("{live}&group=node"), &app.admin).await;
    let nodes = groups(&by_node);
    assert!(close(&nodes, &[(&demo.name, 2, 20.0), ("rack-2", 2, 40.0)]), "{nodes:?}");
    assert_eq!(by_node["source"], "live");
    let keys: Vec<&str> =
        by_node["groups"].as_array().into_iter().flatten().filter_map(|g| g["key"].as_str()).collect();
    assert_eq!(keys, [demo.id.as_str(), second.id.as_str()], "a node's group is keyed by its id");
    let by_model = groups(&heat(&app, &format!("{live}&group=model"), &app.admin).await);
    let mut want = vec![(h100_model.as_str(), 3, 110.0 / 3.0), (other_model.as_str(), 1, 10.0)];
    want.sort_by(|x, y| x.0.cmp(y.0));
    assert!(close(&by_model, &want), "{by_model:?}");
    let fleet = groups(&heat(&app, &format!("{live}&group=fleet"), &app.admin).await);
    assert!(close(&fleet, &[("fleet", 4, 30.0)]), "the whole fleet is the mean of its GPUs: {fleet:?}");
    // Drill-down: one model's nodes, then one node's devices.
    let of_model = groups(&heat(&app, &format!("{live}&group=node&model={other_model}"), &app.admin).await);
    assert!(close(&of_model, &[(&demo.name, 1, 10.0)]), "{of_model:?}");
    let rows = heat(&app, &format!("{live}&node=rack-2"), &app.admin).await;
    let devices: Vec<&str> =
        rows["rows"].as_array().into_iter().flatten().filter_map(|r| r["device"].as_str()).collect();
    assert_eq!(devices, [rack[0].as_str(), rack[1].as_str()]);
    assert!(rows.get("groups").is_none(), "device rows without groups: {rows}");
    let rows = heat(&app, &format!("{live}&model={other_model}"), &app.admin).await;
    let devices: Vec<&str> =
        rows["rows"].as_array().into_iter().flatten().filter_map(|r| r["device"].as_str()).collect();
    assert_eq!(devices, [other_gpu.as_str()]);
    // A member: only the instance they hold, in its node's group.
    let mine = groups(&heat(&app, &format!("{live}&group=node"), &ann).await);
    assert!(close(&mine, &[(&demo.name, 1, 90.0)]), "{mine:?}");
    let (s, v) = app.get(&format!("{live}&group=rack"), &app.admin).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "an unknown grouping is refused: {v}");

    // Stored: the same values three hours ago, read from the series (the member's slice held since then).
    app.backdate(db, &allocation, 5 * 3_600_000).await;
    let t0 = (now - 3 * 3_600_000) / 3_600_000 * 3_600_000;
    let row = |device: &str, gpu: &str, node: &str, profile: Option<&str>, k: i64, util: f64| MinuteRow {
        device: device.into(),
        minute_ms: t0 + k * MINUTE,
        node_id: node.into(),
        gpu: gpu.into(),
        profile: profile.map(str::to_string),
        start: profile.map(|_| 0),
        samples: 60,
        util_avg: util,
        util_max: util,
        mem_used_avg: 1.0,
        mem_used_max: None,
        mem_total: 10.0,
        power_avg: None,
        temp_max: None,
    };
    let mut rows = Vec::new();
    for k in 0..60 {
        rows.push(row(&h100, &h100, &demo.id, None, k, 30.0));
        rows.push(row(&instance, &h100, &demo.id, Some("1g.10gb"), k, 90.0));
        rows.push(row(&other_gpu, &other_gpu, &demo.id, None, k, 10.0));
        rows.push(row(&rack[0], &rack[0], &second.id, None, k, 20.0));
        rows.push(row(&rack[1], &rack[1], &second.id, None, k, 60.0));
    }
    app.state.store.write_minutes(&rows).await.expect("minutes");
    let stored = format!("/api/v1/telemetry/heatmap?metric=util&from={t0}&to={}&step=600", t0 + 3_600_000);
    let by_node = heat(&app, &format!("{stored}&group=node"), &app.admin).await;
    assert_ne!(by_node["source"], "live");
    assert_eq!(by_node["groups"][0]["values"].as_array().map(Vec::len), Some(6), "{by_node}");
    let nodes = groups(&by_node);
    assert!(close(&nodes, &[(&demo.name, 2, 20.0), ("rack-2", 2, 40.0)]), "{nodes:?}");
    let by_model = groups(&heat(&app, &format!("{stored}&group=model"), &app.admin).await);
    assert!(close(&by_model, &want), "{by_model:?}");
    let fleet = groups(&heat(&app, &format!("{stored}&group=fleet"), &app.admin).await);
    assert!(close(&fleet, &[("fleet", 4, 30.0)]), "{fleet:?}");
    let of_model = groups(&heat(&app, &format!("{stored}&group=node&model={other_model}"), &app.admin).await);
    assert!(close(&of_model, &[(&demo.name, 1, 10.0)]), "{of_model:?}");
    let one = groups(&heat(&app, &format!("{stored}&group=node&node=rack-2"), &app.admin).await);
    assert!(close(&one, &[("rack-2", 2, 40.0)]), "{one:?}");
    let mine = groups(&heat(&app, &format!("{stored}&group=node"), &ann).await);
    assert!(close(&mine, &[(&demo.name, 1, 90.0)]), "{mine:?}");
    let rows = heat(&app, &format!("{stored}&model={other_model}"), &app.admin).await;
    let devices: Vec<&str> =
        rows["rows"].as_array().into_iter().flatten().filter_map(|r| r["device"].as_str()).collect();
    assert_eq!(devices, [other_gpu.as_str()]);
}
