//! Who runs on each device, over real HTTP on SQLite and PostgreSQL: the demo node (in a cluster whose namespaces
//! belong to two tenants) reports, as its agent would, the processes on its devices; each is judged against the
//! device's allocations. A pod of the holder's namespace is the holder's; another tenant's pod, a pod of a
//! namespace no tenant governs, and a process on a device nothing holds are unallocated use: an event (once, to
//! platform admins and the device's holders), a gauge, and the fleet's view of the GPU; the allocation shows who
//! runs on it.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::admin::{App, with_node_credential};
use crate::harness::{TestApp, TestDb, on_both_backends};

on_both_backends!(stray_processes_are_unallocated_use_and_known_ones_are_their_holders,);

/// The demo node's whole A30 (MIG off), which nothing holds.
const FREE_GPU: &str = "GPU-00000000-0000-4000-8000-0000dead0003";

/// A status of the demo node with the instances reported so far, the free A30, and these processes per GPU UUID.
fn status(app: &App, processes: &[(&str, Value)]) -> Value {
    let reported = app.reported.lock().expect("reported").clone();
    let mut gpus: Vec<Value> = Vec::new();
    for (gpu, instance) in reported {
        match gpus.iter_mut().find(|g| g["uuid"] == gpu.as_str()) {
            Some(g) => g["instances"].as_array_mut().expect("instances").push(instance),
            None => gpus.push(json!({"uuid": gpu, "mig_enabled": true, "instances": [instance]})),
        }
    }
    gpus.push(json!({"uuid": FREE_GPU, "mig_enabled": false, "instances": []}));
    for (gpu, p) in processes {
        let g = gpus.iter_mut().find(|g| g["uuid"] == *gpu).expect("the GPU of the process");
        let list = g.as_object_mut().expect("gpu").entry("processes").or_insert(json!([]));
        list.as_array_mut().expect("list").push(p.clone());
    }
    json!({"observed_generation": 0, "gpus": gpus})
}

fn pod(device: &str, pid: u32, namespace: &str, name: &str) -> Value {
    json!({"device": device, "pid": pid, "user": "1000", "command": "python3",
        "pod": {"namespace": namespace, "pod": name, "container": "main"}})
}

async fn inbox(app: &App, token: &str) -> Vec<Value> {
    let (_, inbox) = app.get("/api/v1/inbox?limit=500", token).await;
    inbox.as_array().into_iter().flatten().filter(|e| e["type"] == "gpu.unallocated_use").cloned().collect()
}

async fn stray_processes_are_unallocated_use_and_known_ones_are_their_holders(db: &TestDb) {
    let app = with_node_credential(TestApp::on(db).auto_layout().start().await).await;
    let a = app.limited_tenant("team-a", json!({"auto_approve": true, "auto_approve_max_compute_slices": 8}), 8).await;
    let b = app.limited_tenant("team-b", json!({}), 8).await;
    let (ann, bob) = (app.member("ann", &a).await, app.member("bob", &b).await);
    let (s, c) =
        app.send(Method::POST, "/api/v1/clusters", &app.admin, Some(json!({"name": "prod", "mode": "dra"}))).await;
    assert_eq!(s, StatusCode::CREATED, "{c}");
    for (ns, t) in [("ml-a", &a), ("ml-b", &b)] {
        let path = format!("/api/v1/clusters/prod/namespaces/{ns}");
        let (s, _) = app.send(Method::PUT, &path, &app.admin, Some(json!({"tenant": t}))).await;
        assert_eq!(s, StatusCode::CREATED);
    }
    let path = format!("/api/v1/nodes/{}/cluster", app.node_id);
    let (s, _) = app.send(Method::PUT, &path, &app.admin, Some(json!({"cluster": "prod"}))).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (_, active) = app.active(&ann, &a, "1g.10gb", 1).await;
    let (allocation, device, gpu) = (
        active[0]["id"].as_str().expect("id").to_string(),
        active[0]["device_uuid"].as_str().expect("device").to_string(),
        active[0]["gpu_uuid"].as_str().expect("gpu").to_string(),
    );

    // Four processes: the holder's pod, another tenant's pod and a pod of no tenant's namespace on its device, and
    // a bare process (user and command, no pod) on the A30 nothing holds.
    let processes = [
        (gpu.as_str(), pod(&device, 101, "ml-a", "trainer-0")),
        (gpu.as_str(), pod(&device, 102, "ml-b", "sneaky-0")),
        (gpu.as_str(), pod(&device, 103, "default", "stray-0")),
        (FREE_GPU, json!({"device": FREE_GPU, "pid": 104, "user": "mallory", "command": "miner"})),
    ];
    let (s, outcome) = app.node_call(Method::PUT, "/api/v1/agent/status", status(&app, &processes)).await;
    assert_eq!(s, StatusCode::OK, "{outcome}");

    // The fleet's view: every process with whose it is.
    let (_, nodes) = app.get("/api/v1/nodes", &app.admin).await;
    let gpus: Vec<Value> = nodes
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|n| n["gpus"].as_array().cloned().unwrap_or_default())
        .collect();
    let on = |uuid: &str| {
        gpus.iter().find(|g| g["uuid"] == uuid).expect("gpu")["processes"].as_array().cloned().unwrap_or_default()
    };
    let verdicts: Vec<(u64, Value, Value)> = on(&gpu)
        .iter()
        .chain(on(FREE_GPU).iter())
        .map(|p| (p["pid"].as_u64().unwrap_or(0), p["allocation"].clone(), p["unallocated"].clone()))
        .collect();
    assert_eq!(
        verdicts,
        [
            (101, json!(allocation), Value::Null),
            (102, Value::Null, json!("other_tenant")),
            (103, Value::Null, json!("ungoverned_pod")),
            (104, Value::Null, json!("no_allocation")),
        ]
    );
    let miner = on(FREE_GPU)[0].clone();
    assert_eq!(
        (miner["user"].as_str(), miner["command"].as_str(), &miner["pod"]),
        (Some("mallory"), Some("miner"), &Value::Null)
    );

    // The heatmap: who runs on each row's device under the allocations the caller sees, and how much unallocated
    // use there is (a member: only on a device it holds).
    let now = tessera_server::store::now_ms();
    let series = |device: &str, gpu: &str, profile: Value, start: Value| {
        json!({"device": device, "gpu": gpu, "profile": profile, "start": start,
            "samples": (1..=3).map(|s| json!({"t": now - s * 1000, "util": 50.0, "mem_used_mib": 1.0,
                "mem_total_mib": 10.0})).collect::<Vec<_>>()})
    };
    let batch = json!({"dropped": 0, "devices": [
        series(&device, &gpu, json!("1g.10gb"), active[0]["start"].clone()),
        series(FREE_GPU, FREE_GPU, Value::Null, Value::Null),
    ]});
    let (s, accepted) = app.node_call(Method::POST, "/api/v1/agent/telemetry", batch).await;
    assert_eq!((s, accepted["accepted"].as_u64()), (StatusCode::OK, Some(6)), "{accepted}");
    let heat = |token: String| {
        let app = &app;
        async move {
            let (s, h) = app.get("/api/v1/telemetry/heatmap?metric=util", &token).await;
            assert_eq!(s, StatusCode::OK, "{h}");
            h["rows"].as_array().cloned().unwrap_or_default()
        }
    };
    let row_of = |rows: &[Value], d: &str| rows.iter().find(|r| r["device"] == d).cloned();
    let admin_rows = heat(app.admin.clone()).await;
    let slice = row_of(&admin_rows, &device).expect("the slice's row");
    let pids: Vec<&Value> = slice["processes"].as_array().into_iter().flatten().map(|p| &p["pid"]).collect();
    assert_eq!((pids, slice["unallocated"].as_u64()), (vec![&json!(101)], Some(2)), "{slice}");
    assert_eq!(slice["processes"][0]["allocation"], json!(allocation));
    assert_eq!(row_of(&admin_rows, FREE_GPU).expect("the A30's row")["unallocated"].as_u64(), Some(1));
    let ann_rows = heat(ann.clone()).await;
    let mine = row_of(&ann_rows, &device).expect("ann sees her slice");
    assert_eq!((mine["processes"].as_array().map(Vec::len), mine["unallocated"].as_u64()), (Some(1), Some(2)));
    assert!(row_of(&ann_rows, FREE_GPU).is_none_or(|r| r["unallocated"] == 0), "not her device");
    let bob_rows = heat(bob.clone()).await;
    assert!(
        bob_rows.iter().all(|r| r["processes"] == json!([]) && r["unallocated"] == 0),
        "team-b holds nothing there: {bob_rows:?}"
    );

    // The allocation shows who runs on it: its holder's pod only.
    let (_, mine) = app.get(&format!("/api/v1/allocations?tenant={a}"), &ann).await;
    let runs = mine.as_array().and_then(|l| l.iter().find(|x| x["id"] == allocation.as_str())).expect("allocation")["processes"].clone();
    assert_eq!(runs.as_array().map(Vec::len), Some(1), "{runs}");
    assert_eq!(runs[0]["pod"], json!({"namespace": "ml-a", "pod": "trainer-0", "container": "main"}));

    // Events: three, once each, to platform admins; the holder's copies for its device; nothing to team-b.
    let admin_events = inbox(&app, &app.admin).await;
    let mut reasons: Vec<&str> = admin_events
        .iter()
        .filter(|e| e["tenant"].is_null())
        .filter_map(|e| e["data"]["after"]["reason"].as_str())
        .collect();
    reasons.sort_unstable();
    assert_eq!(reasons, ["no_allocation", "other_tenant", "ungoverned_pod"], "{admin_events:#?}");
    let to_a = inbox(&app, &ann).await;
    let mut a_reasons: Vec<&str> = to_a.iter().filter_map(|e| e["data"]["after"]["reason"].as_str()).collect();
    a_reasons.sort_unstable();
    a_reasons.dedup();
    assert_eq!(
        a_reasons,
        ["other_tenant", "ungoverned_pod"],
        "team-a is told of use of its slice, not of the A30: {to_a:#?}"
    );
    let told_a =
        to_a.iter().find(|e| e["data"]["after"]["reason"] == "other_tenant").expect("told")["data"]["after"].clone();
    let sentence = told_a["sentence"].as_str().unwrap_or("");
    assert!(sentence.contains("pid 102") && sentence.contains("another tenant"), "{told_a}");
    assert!(
        !told_a.to_string().contains("ml-b") && !told_a.to_string().contains("sneaky") && told_a["pod"].is_null(),
        "the holder is told what happens on its slice, not another tenant's names: {told_a}"
    );
    let told_admin = admin_events
        .iter()
        .find(|e| e["tenant"].is_null() && e["data"]["after"]["reason"] == "other_tenant")
        .expect("told");
    assert!(
        told_admin["data"]["after"]["sentence"].as_str().is_some_and(|s| s.contains("pod ml-b/sneaky-0")),
        "admins see who"
    );
    assert!(inbox(&app, &bob).await.is_empty(), "team-b holds nothing there");

    // The same report again: no new event; the gauges count what runs.
    let (s, _) = app.node_call(Method::PUT, "/api/v1/agent/status", status(&app, &processes)).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        inbox(&app, &app.admin).await.len(),
        admin_events.len(),
        "a process is reported once, not on every status"
    );
    let metrics =
        app.call(Method::GET, "/metrics", Some(&app.admin)).send().await.expect("metrics").text().await.expect("text");
    let stray_lines: Vec<&str> =
        metrics.lines().filter(|l| l.starts_with("tessera_gpu_unallocated_processes{")).collect();
    assert_eq!(stray_lines.len(), 3, "{stray_lines:#?}");
    assert!(
        stray_lines
            .iter()
            .any(|l| l.contains(&format!("device=\"{device}\",reason=\"other_tenant\"")) && l.ends_with(" 1"))
    );
    assert!(metrics.lines().any(|l| l.starts_with("tessera_gpu_processes{")
        && l.contains("namespace=\"ml-a\",pod=\"trainer-0\",container=\"main\"")
        && l.contains(&format!("allocation=\"{allocation}\",unallocated=\"\""))));

    // A process on a device its GPU does not have is refused, and nothing of the status is taken.
    let wrong = [(FREE_GPU, json!({"device": device, "pid": 9}))];
    let (s, p) = app.node_call(Method::PUT, "/api/v1/agent/status", status(&app, &wrong)).await;
    assert_eq!((s, p["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_process_device")), "{p}");
    let bad = [(FREE_GPU, json!({"device": FREE_GPU, "pid": 9, "user": "a\u{0}b"}))];
    let (s, p) = app.node_call(Method::PUT, "/api/v1/agent/status", status(&app, &bad)).await;
    assert_eq!((s, p["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_process")), "{p}");

    // Ended: a report without processes clears them, and the gauge.
    let (s, _) = app.node_call(Method::PUT, "/api/v1/agent/status", status(&app, &[])).await;
    assert_eq!(s, StatusCode::OK);
    let (_, nodes) = app.get("/api/v1/nodes", &app.admin).await;
    assert!(nodes.to_string().contains("\"processes\":[]") && !nodes.to_string().contains("\"pid\""), "cleared");
    let metrics =
        app.call(Method::GET, "/metrics", Some(&app.admin)).send().await.expect("metrics").text().await.expect("text");
    assert!(!metrics.contains("tessera_gpu_unallocated_processes{"));
}
