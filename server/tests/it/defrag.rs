//! Defragmentation over real HTTP on SQLite and PostgreSQL: an admin sees, without anything written, how the free
//! part of a MIG GPU would be laid out again for the profile asked for, proposes it, and approves the proposal like
//! any other; every instance held stays, and bad input is refused with its code.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::harness::{TestApp, TestDb, on_both_backends};

on_both_backends!(the_free_part_of_a_gpu_is_laid_out_again_for_the_profile_asked_for);

fn instances(v: &Value) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = v
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| (i["profile"].as_str().unwrap_or_default().to_string(), i["start"].as_u64().unwrap_or(99)))
        .collect();
    out.sort_by_key(|(p, s)| (*s, p.clone()));
    out
}

async fn gpu_view(app: &TestApp, gpu: &str) -> Value {
    let (_, nodes) = app.get("/api/v1/nodes", &app.admin).await;
    nodes
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|n| n["gpus"].as_array().cloned().unwrap_or_default())
        .find(|g| g["id"] == gpu)
        .expect("the GPU")
}

async fn the_free_part_of_a_gpu_is_laid_out_again_for_the_profile_asked_for(db: &TestDb) {
    let app = TestApp::on(db).auto_layout().start().await;
    app.one_gpu_of("H100-80GB").await;
    let gpu = app.mig_gpus("H100-80GB").await[0].clone();
    // The GPU's node is heard from (a node that is not ready gets no proposal).
    app.heard_node_of(&gpu).await;
    let t = app.tenant("vision", json!({"auto_approve": true, "auto_approve_max_compute_slices": 7})).await;
    let dev = app.member("vision-dev", &t).await;
    // One 1g.10gb held; then the GPU's layout waits for an admin.
    let ask = json!({"tenant": t, "spec": {"mode": "mig", "profile": "1g.10gb", "model": "H100-80GB"}, "count": 1});
    let (s, r) = app.send(Method::POST, "/api/v1/requests", &dev, Some(ask)).await;
    assert_eq!((s, r["state"].clone()), (StatusCode::CREATED, json!("approved")), "{r}");
    let (_, mine) = app.get(&format!("/api/v1/allocations?tenant={t}"), &dev).await;
    let held = (mine[0]["profile"].as_str().expect("profile").to_string(), mine[0]["start"].as_u64().expect("start"));
    let path = format!("/api/v1/gpus/{gpu}/auto-layout");
    let (s, b) = app.send(Method::PUT, &path, &app.admin, Some(json!({"enabled": false}))).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let before = gpu_view(&app, &gpu).await;

    // Admins only; bad input is refused with its code.
    let (s, _) = app.get("/api/v1/defragmentation", &dev).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let long = "x".repeat(65);
    for (query, code) in [
        ("max_gpus=0", "invalid_max_gpus"),
        ("max_gpus=1001", "invalid_max_gpus"),
        ("profile=9g.900gb", "unknown_profile"),
        ("model=nope", "unknown_model"),
        (&format!("profile={long}") as &str, "value_too_long"),
    ] {
        let (s, p) = app.get(&format!("/api/v1/defragmentation?{query}"), &app.admin).await;
        assert_eq!((s, p["code"].clone()), (StatusCode::UNPROCESSABLE_ENTITY, json!(code)), "{query}: {p}");
    }

    // The preview: the GPU gains 3g.40gb instances, keeps the held one, and nothing is written.
    let q = "/api/v1/defragmentation?profile=3g.40gb&model=H100-80GB";
    let (s, seen) = app.get(q, &app.admin).await;
    assert_eq!(s, StatusCode::OK, "{seen}");
    let mine = seen["gpus"].as_array().into_iter().flatten().find(|g| g["gpu"] == gpu.as_str()).cloned();
    let mine = mine.unwrap_or_else(|| panic!("the GPU gains: {seen:#}"));
    assert_eq!((mine["target"].clone(), mine["model"].clone()), (json!("3g.40gb"), json!("H100-80GB")));
    let figure = |v: &Value, k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"));
    let (b, a) = (&mine["before"], &mine["after"]);
    assert!(figure(a, "target_instances") > figure(b, "target_instances"), "{mine:#}");
    assert!(figure(a, "ready_slices") >= figure(b, "ready_slices"), "{mine:#}");
    assert!(figure(a, "not_ready_slices") <= figure(b, "not_ready_slices"), "{mine:#}");
    // Free slices are the same before and after: only their layout changes.
    let free = |v: &Value| figure(v, "ready_slices") + figure(v, "not_ready_slices");
    assert_eq!(free(a), free(b), "{mine:#}");
    assert!(instances(&mine["layout"]).contains(&held), "the held instance stays: {mine:#}");
    assert!(!instances(&mine["destroyed"]).contains(&held), "{mine:#}");
    assert_eq!(mine["base_version"], before["layout_version"]);
    assert!(mine.get("proposal_id").is_none(), "{mine}");
    // The other H100s are cordoned: left out, with the reason.
    let skipped = seen["skipped"].as_array().cloned().unwrap_or_default();
    assert!(!skipped.is_empty() && skipped.iter().all(|s| s["code"] == "cordoned"), "{seen:#}");
    let (_, open) = app.get("/api/v1/layouts?state=proposed", &app.admin).await;
    assert_eq!(open, json!([]), "the preview writes nothing");
    // The fleet's figures count the listed GPU's change once; `max_gpus` bounds the list.
    for k in ["target_instances", "ready_slices", "not_ready_slices"] {
        let fleet = |w: &str| seen[w][k].as_i64().unwrap_or_else(|| panic!("{w}.{k}"));
        let gpu = |v: &Value| v[k].as_i64().unwrap_or_else(|| panic!("{k}"));
        assert_eq!(fleet("after") - fleet("before"), gpu(a) - gpu(b), "{k}: {seen:#}");
    }
    let (_, one) = app.get(&format!("{q}&max_gpus=1"), &app.admin).await;
    assert_eq!(one["gpus"].as_array().map(Vec::len), Some(1), "{one:#}");

    // Proposed: one layout proposal, as the preview said, waiting like any other.
    let body = json!({"profile": "3g.40gb", "model": "H100-80GB"});
    let (s, made) = app.send(Method::POST, "/api/v1/defragmentation", &app.admin, Some(body.clone())).await;
    assert_eq!(s, StatusCode::OK, "{made}");
    let ours = made["gpus"].as_array().into_iter().flatten().find(|g| g["gpu"] == gpu.as_str()).cloned();
    let ours = ours.unwrap_or_else(|| panic!("proposed: {made:#}"));
    assert_eq!(instances(&ours["layout"]), instances(&mine["layout"]));
    let id = ours["proposal_id"].as_str().expect("a proposal").to_string();
    let (s, proposal) = app.get(&format!("/api/v1/layouts/{id}"), &app.admin).await;
    assert_eq!(
        (s, proposal["state"].clone(), proposal["gpu"].clone()),
        (StatusCode::OK, json!("proposed"), json!(gpu))
    );
    assert_eq!(instances(&proposal["layout"]), instances(&mine["layout"]));
    assert_eq!(instances(&proposal["created"]), instances(&mine["created"]));
    assert_eq!(instances(&proposal["destroyed"]), instances(&mine["destroyed"]));
    // Again while it waits: left out, not proposed twice.
    let (s, again) = app.send(Method::POST, "/api/v1/defragmentation", &app.admin, Some(body)).await;
    assert_eq!(s, StatusCode::OK, "{again}");
    assert!(again["gpus"].as_array().is_some_and(|g| g.iter().all(|g| g["gpu"] != gpu.as_str())), "{again:#}");
    let left = again["skipped"].as_array().into_iter().flatten().find(|s| s["gpu"] == gpu.as_str()).cloned();
    assert_eq!(left.map(|l| l["code"].clone()), Some(json!("layout_proposal_open")), "{again:#}");
    let (_, audit) = app.get(&format!("/api/v1/audit?object=gpu/{gpu}"), &app.admin).await;
    assert!(audit.to_string().contains("layout.propose"), "{audit}");

    // Approved: the GPU has the new layout, the held slice is still held, and there is nothing more to gain.
    let (s, b) = app.send(Method::POST, &format!("/api/v1/layouts/{id}/approve"), &app.admin, None).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let now = gpu_view(&app, &gpu).await;
    assert_eq!(instances(&now["layout"]), instances(&mine["layout"]), "{now:#}");
    let (_, still) = app.get(&format!("/api/v1/allocations?tenant={t}"), &dev).await;
    assert_eq!((still[0]["profile"].as_str(), still[0]["start"].as_u64()), (Some(held.0.as_str()), Some(held.1)));
    let (_, after) = app.get(q, &app.admin).await;
    assert!(after["gpus"].as_array().is_some_and(|g| g.iter().all(|g| g["gpu"] != gpu.as_str())), "{after:#}");

    // The CLI says it in a sentence and prints the report.
    let (code, out) =
        app.cli(&app.admin, &["node", "defragment", "--profile", "3g.40gb", "--model", "H100-80GB"]).await;
    assert_eq!(code, Some(0), "{out}");
    let printed: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(printed["before"], after["before"], "{out}");
}
