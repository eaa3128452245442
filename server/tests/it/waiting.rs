//! Why requests wait and what a request would do, over real HTTP on SQLite and PostgreSQL: each waiting request
//! carries one reason from the documented list, kept current as approvals, layouts, cordons and reclaims change;
//! its place in the queue and its earliest start; a Prometheus gauge by reason; the CLI's sentence; and a preview
//! that writes nothing and agrees with the creation that follows it.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tessera_server::store::Role;

use crate::harness::{TestApp, TestDb, on_both_backends};

on_both_backends!(
    every_waiting_request_says_why_and_where_it_stands,
    a_request_waiting_for_reclaimed_room_knows_when_it_can_start,
    a_preview_writes_nothing_and_the_creation_that_follows_agrees,
    a_scattered_gpu_names_the_instances_to_move_to_make_room,
    gpus_that_take_no_new_work_are_counted_by_cause,
);

async fn waiting(app: &TestApp, id: &Value) -> Value {
    let (s, r) = app.get(&format!("/api/v1/requests/{}", id.as_str().expect("id")), &app.admin).await;
    assert_eq!(s, StatusCode::OK, "{r}");
    r["waiting"].clone()
}

fn mig(t: &str, profile: &str, count: u32) -> Value {
    json!({"tenant": t, "spec": {"mode": "mig", "profile": profile, "model": "H100-80GB"}, "count": count})
}

async fn every_waiting_request_says_why_and_where_it_stands(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let t = app.tenant("vision", json!({})).await;
    let dev = app.member("vision-dev", &t).await;
    // Two pending requests for the same slices: both wait for an admin, in the order they were made.
    let (_, first) = app.send(Method::POST, "/api/v1/requests", &dev, Some(mig(&t, "2g.20gb", 1))).await;
    let (_, second) = app.send(Method::POST, "/api/v1/requests", &dev, Some(mig(&t, "2g.20gb", 1))).await;
    // The creation answers why it waits, as a read of it does, without its place in the queue (it does not read
    // the queue).
    let w = waiting(&app, &first["id"]).await;
    assert_eq!(first["state"], "pending", "{first}");
    for (created, read) in [(&first, &w), (&second, &waiting(&app, &second["id"]).await)] {
        let created = &created["waiting"];
        assert_eq!(created["queue_position"], Value::Null, "{created}");
        for field in ["request", "reason", "sentence"] {
            assert_eq!(created[field], read[field], "{field}: {created} against {read}");
        }
        let now = tessera_server::store::now_ms();
        assert!(created["earliest_start_ms"].as_i64().is_some_and(|t| (now - 5_000..=now).contains(&t)), "{created}");
    }
    assert_eq!(waiting(&app, &second["id"]).await["queue_position"], 2);
    assert_eq!(w["reason"]["code"], "awaiting_approval", "{w}");
    assert_eq!(w["reason"]["approvers"], json!(["admin"]), "{w}");
    assert_eq!((w["queue_position"].clone(), w["request"].clone()), (json!(1), first["id"].clone()));
    let now = tessera_server::store::now_ms();
    assert!(w["earliest_start_ms"].as_i64().is_some_and(|t| (now - 5_000..=now).contains(&t)), "room now: {w}");
    assert_eq!(waiting(&app, &second["id"]).await["queue_position"], 2);
    // More than the fleet has: no capacity, per model, with what is free and what it needs.
    let (_, huge) = app.send(Method::POST, "/api/v1/requests", &dev, Some(mig(&t, "7g.80gb", 5))).await;
    let w = waiting(&app, &huge["id"]).await;
    assert_eq!(w["reason"]["code"], "no_capacity", "{w}");
    assert_eq!((&huge["waiting"]["reason"], &huge["waiting"]["earliest_start_ms"]), (&w["reason"], &Value::Null));
    let h100 = &w["reason"]["models"][0];
    assert_eq!(
        (h100["model"].clone(), h100["needed_slices"].clone(), h100["fragmented"].clone()),
        (json!("H100-80GB"), json!(35.0), json!(false))
    );
    assert_eq!(w["earliest_start_ms"], Value::Null, "nothing known frees enough: {w}");
    assert!(w["sentence"].as_str().unwrap_or("").contains("no room"), "{w}");
    // Approved onto a layout change that waits for an admin; then the GPU is cordoned after the change.
    let path = format!("/api/v1/requests/{}/approve", first["id"].as_str().expect("id"));
    let (s, approval) = app.send(Method::POST, &path, &app.admin, None).await;
    assert_eq!(s, StatusCode::OK, "{approval}");
    let w = waiting(&app, &first["id"]).await;
    match approval["layout_proposals"].as_array().map(Vec::len) {
        Some(1..) => {
            assert_eq!(w["reason"]["code"], "layout_awaiting_approval", "{w}");
            assert_eq!(w["reason"]["proposal"], approval["layout_proposals"][0]["id"], "{w}");
            // The waiting change names what it unblocks: this request, its tenant by name, its numbers.
            let (_, open) = app.get("/api/v1/layouts?state=proposed", &app.admin).await;
            let change = open
                .as_array()
                .expect("layouts")
                .iter()
                .find(|l| l["id"] == approval["layout_proposals"][0]["id"])
                .expect("the change")
                .clone();
            let need = &change["needed_by"][0];
            assert_eq!(
                (need["request"].clone(), need["tenant_name"].clone(), need["count"].clone(), need["slices"].clone()),
                (first["id"].clone(), json!("vision"), json!(1), json!(1)),
                "{change}"
            );
            // The fleet marks the GPU whose layout change waits.
            let (_, nodes) = app.get("/api/v1/nodes", &app.admin).await;
            let marked: Vec<&Value> = nodes
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|n| n["gpus"].as_array().into_iter().flatten())
                .filter(|g| !g["layout_waiting"].is_null())
                .collect();
            assert_eq!(marked.len(), 1, "{nodes:#}");
            assert_eq!((&marked[0]["id"], &marked[0]["layout_waiting"]), (&change["gpu"], &change["id"]), "{nodes:#}");
        }
        _ => assert_eq!(
            w["reason"]["code"], "node_not_ready",
            "on a free instance, the demo node has no agent here: {w}"
        ),
    }
    assert_eq!(w["queue_position"], Value::Null, "only pending requests queue");
    let gpu = approval["reservations"][0]["gpu"].as_str().expect("gpu").to_string();
    for l in approval["layout_proposals"].as_array().into_iter().flatten() {
        let path = format!("/api/v1/layouts/{}/approve", l["id"].as_str().expect("id"));
        let (s, b) = app.send(Method::POST, &path, &app.admin, None).await;
        assert_eq!(s, StatusCode::OK, "{b}");
    }
    let (_, nodes) = app.get("/api/v1/nodes", &app.admin).await;
    let approved_gpus = nodes.as_array().into_iter().flatten().flat_map(|n| n["gpus"].as_array().into_iter().flatten());
    assert!(approved_gpus.clone().all(|g| g["layout_waiting"].is_null()), "approved, nothing waits: {nodes:#}");
    // The demo node has no agent here: no sample, so nothing to say about its use now.
    assert!(approved_gpus.clone().all(|g| g["now"].is_null()), "{nodes:#}");
    // Cordoned with a reason (the CLI's), which the audit log keeps; a reason that is not text is refused.
    let path = format!("/api/v1/gpus/{gpu}/cordon");
    let (s, b) = app.send(Method::POST, &path, &app.admin, Some(json!({"reason": "x".repeat(2001)}))).await;
    assert_eq!((s, b["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_reason")), "{b}");
    let (s, b) = app.send(Method::POST, &path, &app.admin, Some(json!({"why": "typo"}))).await;
    assert_eq!((s, b["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_body")), "{b}");
    let r = app.call(Method::POST, &path, Some(&app.admin)).body("{not json").send().await.expect("send");
    assert_eq!(r.status(), StatusCode::BAD_REQUEST, "a body that is not JSON");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["node", "cordon", &gpu, "--reason", "fan noise"])
        .env("TESSERA_SERVER", &app.base)
        .env("TESSERA_TOKEN", &app.admin)
        .output()
        .expect("run tessera");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cordoned: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(cordoned["cordoned"], true, "{cordoned}");
    let (_, audit) = app.get(&format!("/api/v1/audit?object=gpu/{gpu}"), &app.admin).await;
    let line = audit.as_array().into_iter().flatten().find(|a| a["action"] == "gpu.cordoned.on").expect("audited");
    assert_eq!(
        serde_json::from_str::<Value>(line["after"].as_str().unwrap_or("null")).ok(),
        Some(json!({"reason": "fan noise"})),
        "{audit}"
    );
    let w = waiting(&app, &first["id"]).await;
    assert_eq!((w["reason"]["code"].clone(), w["reason"]["gpu"].clone()), (json!("gpu_cordoned"), json!(gpu)), "{w}");
    // The tenant's list, oldest first; other tenants see nothing of it.
    let (s, list) = app.get(&format!("/api/v1/tenants/{t}/waiting"), &dev).await;
    assert_eq!(s, StatusCode::OK, "{list}");
    let codes: Vec<&str> = list.as_array().into_iter().flatten().filter_map(|w| w["reason"]["code"].as_str()).collect();
    assert_eq!(codes, vec!["gpu_cordoned", "awaiting_approval", "no_capacity"], "{list}");
    let other = app.tenant("speech", json!({})).await;
    let outsider = app.member("speech-dev", &other).await;
    let (s, _) = app.get(&format!("/api/v1/tenants/{t}/waiting"), &outsider).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = app.get(&format!("/api/v1/requests/{}", first["id"].as_str().expect("id")), &outsider).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    // Counted by reason for Prometheus, every reason present.
    let metrics =
        app.call(Method::GET, "/metrics", Some(&app.admin)).send().await.expect("metrics").text().await.expect("text");
    for (reason, n) in [("awaiting_approval", 1), ("no_capacity", 1), ("gpu_cordoned", 1), ("queued", 0)] {
        let line = format!("tessera_pending_requests{{reason=\"{reason}\"}} {n}");
        assert!(metrics.lines().any(|l| l == line), "{line} in:\n{metrics}");
    }
    // The CLI prints the JSON, and the reason as a sentence for people.
    let id = second["id"].as_str().expect("id").to_string();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["request", "get", &id])
        .env("TESSERA_SERVER", &app.base)
        .env("TESSERA_TOKEN", &dev)
        .output()
        .expect("run tessera");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(serde_json::from_str::<Value>(&stdout).expect("json")["waiting"]["reason"]["code"], "awaiting_approval");
    assert!(
        stderr.contains("waiting: It waits for a platform admin to approve it (admin). Position 1 in the queue"),
        "{stderr}"
    );
    // Creating says why it waits too (without the place in the queue, which the creation does not read).
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["request", "create", "--tenant", &t, "--profile", "1g.10gb", "--model", "H100-80GB"])
        .env("TESSERA_SERVER", &app.base)
        .env("TESSERA_TOKEN", &dev)
        .output()
        .expect("run tessera");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(serde_json::from_str::<Value>(&stdout).expect("json")["state"], "pending", "{stdout}");
    assert!(
        stderr.starts_with("waiting: It waits for a platform admin to approve it (admin). Earliest start ")
            && !stderr.contains("Position"),
        "{stderr}"
    );
    // A creation retried with its Idempotency-Key answers the request as it is now, as a read does: here over a
    // limit lowered since it was made.
    let keyed = || {
        app.call(Method::POST, "/api/v1/requests", Some(&dev))
            .header("Idempotency-Key", "nightly-7")
            .json(&mig(&t, "1g.10gb", 1))
    };
    let made: Value = keyed().send().await.expect("send").json().await.expect("json");
    assert_eq!(made["waiting"]["reason"]["code"], "awaiting_approval", "{made}");
    let limits = json!({"limits": {"compute_slices": 1}});
    let (s, _) = app.send(Method::PUT, &format!("/api/v1/tenants/{t}/quotas"), &app.admin, Some(limits)).await;
    assert_eq!(s, StatusCode::OK);
    let again = keyed().send().await.expect("send");
    assert_eq!(again.status(), StatusCode::OK, "the earlier request");
    let again: Value = again.json().await.expect("json");
    let w = waiting(&app, &made["id"]).await;
    assert_eq!(w["reason"]["code"], "quota_exceeded", "{w}");
    assert_eq!((&again["id"], &again["waiting"]["reason"]), (&made["id"], &w["reason"]), "{again}");
}

async fn a_request_waiting_for_reclaimed_room_knows_when_it_can_start(db: &TestDb) {
    let app = TestApp::on(db).auto_layout().start().await;
    let (s, c) =
        app.send(Method::POST, "/api/v1/cohorts", &app.admin, Some(json!({"name": "research", "grace_s": 300}))).await;
    assert_eq!(s, StatusCode::CREATED, "{c}");
    let auto = json!({"auto_approve": true, "auto_approve_max_compute_slices": 14});
    let mut tokens = Vec::new();
    for (name, g, max) in [("vision", 4.0, 14.0), ("speech", 10.0, 10.0)] {
        let t = app.tenant(name, auto.clone()).await;
        let body = json!({"limits": {"compute_slices": g}, "maximums": {"compute_slices": max}});
        app.send(Method::PUT, &format!("/api/v1/tenants/{t}/quotas"), &app.admin, Some(body)).await;
        app.send(Method::PUT, &format!("/api/v1/tenants/{t}/cohort"), &app.admin, Some(json!({"cohort": "research"})))
            .await;
        tokens.push((t.clone(), app.user(&format!("{name}-dev"), &[(&t, Role::Member)]).await.1));
    }
    // One H100 takes new work; the others are cordoned.
    app.one_gpu_of("H100-80GB").await;
    let (vision, vision_dev) = &tokens[0];
    app.send(Method::POST, "/api/v1/requests", vision_dev, Some(mig(vision, "3g.40gb", 1))).await;
    let (_, borrowed) = app.send(Method::POST, "/api/v1/requests", vision_dev, Some(mig(vision, "4g.40gb", 1))).await;
    let (speech, speech_dev) = &tokens[1];
    // The preview says it would wait for the room being taken back, and from when.
    let (s, p) = app.send(Method::POST, "/api/v1/requests/preview", speech_dev, Some(mig(speech, "1g.10gb", 1))).await;
    assert_eq!(s, StatusCode::OK, "{p}");
    assert_eq!(p["outcome"], "pending", "{p}");
    assert_eq!(p["waiting"]["code"], "no_capacity", "nobody is told yet when it is only previewed: {p}");
    let (_, w) = app.send(Method::POST, "/api/v1/requests", speech_dev, Some(mig(speech, "1g.10gb", 1))).await;
    let told = app.get(&format!("/api/v1/requests/{}", borrowed["id"].as_str().expect("id")), &app.admin).await.1;
    let until = told["reclaim_at_ms"].as_i64().expect("the borrowed 4g is told");
    let why = waiting(&app, &w["id"]).await;
    assert_eq!(
        (why["reason"]["code"].clone(), why["reason"]["until_ms"].clone()),
        (json!("waiting_for_reclaim"), json!(until)),
        "{why}"
    );
    assert_eq!(why["earliest_start_ms"], until, "it fits once the 4g's deadline passes: {why}");
}

async fn a_preview_writes_nothing_and_the_creation_that_follows_agrees(db: &TestDb) {
    let app = TestApp::on(db).auto_layout().start().await;
    let t = app.tenant("vision", json!({"auto_approve": true, "auto_approve_max_compute_slices": 7})).await;
    let (s, _) = app
        .send(
            Method::PUT,
            &format!("/api/v1/tenants/{t}/quotas"),
            &app.admin,
            Some(json!({"limits": {"compute_slices": 4}})),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let dev = app.member("vision-dev", &t).await;
    let (_, audit_before) = app.get("/api/v1/audit?object=request/", &app.admin).await;
    let (s, p) = app.send(Method::POST, "/api/v1/requests/preview", &dev, Some(mig(&t, "3g.40gb", 1))).await;
    assert_eq!(s, StatusCode::OK, "{p}");
    assert_eq!(
        (p["outcome"].clone(), p["auto_approve"].clone(), p["refused"].clone()),
        (json!("approved_now"), json!(true), Value::Null),
        "{p}"
    );
    let line = p["quota"]
        .as_array()
        .and_then(|l| l.iter().find(|l| l["resource"] == "compute_slices"))
        .cloned()
        .expect("line");
    assert_eq!(
        (line["charge"].clone(), line["held"].clone(), line["limit"].clone(), line["after"].clone()),
        (json!(3.0), json!(0.0), json!(4.0), json!(3.0))
    );
    let slice = p["slices"][0].clone();
    // Nothing was written.
    let (_, page) = app.get(&format!("/api/v1/requests?tenant={t}"), &dev).await;
    assert_eq!(page["items"], json!([]), "{page}");
    assert_eq!(app.get("/api/v1/audit?object=request/", &app.admin).await.1, audit_before);
    // The creation a moment later lands where the preview said.
    let (s, r) = app.send(Method::POST, "/api/v1/requests", &dev, Some(mig(&t, "3g.40gb", 1))).await;
    assert_eq!((s, r["state"].clone()), (StatusCode::CREATED, json!("approved")), "{r}");
    // Approved by the policy, it waits for its node, said in the creation's answer as a read of it says it.
    let w = waiting(&app, &r["id"]).await;
    assert!(w["reason"]["code"].is_string(), "{w}");
    assert_eq!((&r["waiting"]["reason"], &r["waiting"]["sentence"]), (&w["reason"], &w["sentence"]), "{r}");
    let (_, allocations) = app.get(&format!("/api/v1/allocations?tenant={t}"), &dev).await;
    let a = &allocations[0];
    assert_eq!(
        (a["node"].clone(), a["gpu_index"].clone(), a["profile"].clone(), a["start"].clone()),
        (slice["node"].clone(), slice["gpu_index"].clone(), slice["profile"].clone(), slice["start"].clone()),
        "preview {slice}, allocation {a}"
    );
    // Over the quota: refused with the problem creation answers, and what to ask for.
    let (s, p) = app.send(Method::POST, "/api/v1/requests/preview", &dev, Some(mig(&t, "2g.20gb", 1))).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        (p["outcome"].clone(), p["refused"]["code"].clone(), p["refused"]["ask_for"]["compute_slices"].clone()),
        (json!("refused"), json!("quota_exceeded"), json!(5.0)),
        "{p}"
    );
    let (s, r) = app.send(Method::POST, "/api/v1/requests", &dev, Some(mig(&t, "2g.20gb", 1))).await;
    assert_eq!((s, r["code"].clone()), (StatusCode::CONFLICT, json!("quota_exceeded")), "the creation agrees: {r}");
    // Bounds and owners, as creation checks them.
    let (s, b) = app.send(Method::POST, "/api/v1/requests/preview", &dev, Some(mig(&t, "1g.10gb", 0))).await;
    assert_eq!((s, b["code"].clone()), (StatusCode::UNPROCESSABLE_ENTITY, json!("invalid_count")), "{b}");
    let other = app.tenant("speech", json!({})).await;
    let (s, _) = app.send(Method::POST, "/api/v1/requests/preview", &dev, Some(mig(&other, "1g.10gb", 1))).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    // The CLI says it in a sentence.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["request", "preview", "--tenant", &t, "--profile", "1g.10gb", "--model", "H100-80GB"])
        .env("TESSERA_SERVER", &app.base)
        .env("TESSERA_TOKEN", &dev)
        .output()
        .expect("run tessera");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("preview: approved at once on "), "{stderr}");
    assert_eq!(serde_json::from_slice::<Value>(&out.stdout).expect("json")["outcome"], "approved_now");
}

async fn a_scattered_gpu_names_the_instances_to_move_to_make_room(db: &TestDb) {
    let app = TestApp::on(db).auto_layout().start().await;
    app.one_gpu_of("H100-80GB").await;
    let gpu = app.mig_gpus("H100-80GB").await[0].clone();
    // The node's agent is heard from: its free slices count.
    let node = app.heard_node_of(&gpu).await;
    let t = app.tenant("vision", json!({"auto_approve": true, "auto_approve_max_compute_slices": 7})).await;
    let dev = app.member("vision-dev", &t).await;
    // Seven 1g.10gb fill the GPU; all but those at units 0 and 4 are cancelled: five compute slices are free, and
    // neither 3g.40gb placement (units 0-3, 4-7) is.
    let mut at = std::collections::BTreeMap::new();
    for _ in 0..7 {
        let (s, r) = app.send(Method::POST, "/api/v1/requests", &dev, Some(mig(&t, "1g.10gb", 1))).await;
        assert_eq!((s, r["state"].clone()), (StatusCode::CREATED, json!("approved")), "{r}");
        let id = r["id"].as_str().expect("id").to_string();
        let (_, allocations) = app.get(&format!("/api/v1/allocations?tenant={t}"), &dev).await;
        let a = allocations.as_array().into_iter().flatten().find(|a| a["request"] == id.as_str()).expect("slice");
        at.insert(a["start"].as_u64().expect("start"), id);
    }
    assert_eq!(at.keys().copied().collect::<Vec<_>>(), vec![0, 1, 2, 3, 4, 5, 6]);
    for (start, id) in &at {
        if *start != 0 && *start != 4 {
            let (s, b) = app.send(Method::POST, &format!("/api/v1/requests/{id}/cancel"), &dev, None).await;
            assert_eq!(s, StatusCode::OK, "{b}");
        }
    }
    let (s, p) = app.send(Method::POST, "/api/v1/requests/preview", &dev, Some(mig(&t, "3g.40gb", 1))).await;
    assert_eq!(s, StatusCode::OK, "{p}");
    assert_eq!((p["outcome"].clone(), p["waiting"]["code"].clone()), (json!("pending"), json!("no_capacity")), "{p}");
    let h100 = &p["waiting"]["models"][0];
    assert_eq!(
        (h100["free_slices"].clone(), h100["needed_slices"].clone(), h100["fragmented"].clone()),
        (json!(5.0), json!(3.0), json!(true)),
        "{h100}"
    );
    // One move makes room: one of the two 1g.10gb goes next to the other, and the 3g.40gb takes the half it left.
    let change = &h100["make_room"][0];
    assert_eq!(
        (change["gpu"].clone(), change["node"].clone(), change["fits"].clone()),
        (json!(gpu), node["name"].clone(), json!(1))
    );
    let moves = change["moves"].as_array().expect("moves");
    assert_eq!(moves.len(), 1, "{change}");
    let (from, to) = (moves[0]["from"].as_u64().expect("from"), moves[0]["to"].as_u64().expect("to"));
    assert_eq!(moves[0]["request"], at[&from].as_str(), "{change}");
    assert!((from == 4 && to < 4) || (from == 0 && to >= 4), "{change}");
    let layout: Vec<(String, u64)> = change["layout"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| (i["profile"].as_str().unwrap_or("").to_string(), i["start"].as_u64().unwrap_or(99)))
        .collect();
    assert_eq!(layout.len(), 3, "{change}");
    assert!(layout.contains(&("3g.40gb".to_string(), if from == 4 { 4 } else { 0 })), "{change}");
    let sentence = p["sentence"].as_str().unwrap_or("");
    assert!(
        sentence.contains(&format!(
            "moving 1 instance in use would make room (GPU {} of {}: 1g.10gb from unit {from} to {to})",
            change["index"],
            node["name"].as_str().unwrap_or("")
        )),
        "{sentence}"
    );
    // The request made pends for the same reason, and says so in GET.
    let (_, r) = app.send(Method::POST, "/api/v1/requests", &dev, Some(mig(&t, "3g.40gb", 1))).await;
    let w = waiting(&app, &r["id"]).await;
    assert_eq!(w["reason"]["models"][0]["make_room"], h100["make_room"], "{w}");
    // A 4g.40gb has one placement (units 0-3): the 1g.10gb at 0 must go, the one at 4 may stay.
    let (_, p) = app.send(Method::POST, "/api/v1/requests/preview", &dev, Some(mig(&t, "4g.40gb", 1))).await;
    let moves = &p["waiting"]["models"][0]["make_room"][0]["moves"];
    assert_eq!((moves[0]["from"].clone(), moves[0]["request"].clone()), (json!(0), json!(at[&0])), "{p}");
    assert_eq!(moves.as_array().map(Vec::len), Some(1), "{p}");
    // More than five compute slices is not fragmentation: no change is named.
    let (_, p) = app.send(Method::POST, "/api/v1/requests/preview", &dev, Some(mig(&t, "2g.20gb", 3))).await;
    assert_eq!(
        (p["waiting"]["models"][0]["fragmented"].clone(), p["waiting"]["models"][0]["make_room"].clone()),
        (json!(false), json!([])),
        "{p}"
    );
}

/// A GPU with a layout change waiting for approval takes no new work, as a cordoned one does, but it is not
/// cordoned: the waiting reason and the planner's refusal count each cause apart, and the free slices on those
/// GPUs are said, not dropped.
async fn gpus_that_take_no_new_work_are_counted_by_cause(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let t = app.tenant("vision", json!({})).await;
    let dev = app.member("vision-dev", &t).await;
    let gpus = app.mig_gpus("H100-80GB").await;
    assert_eq!(gpus.len(), 2, "the demo node's two H100s: {gpus:?}");
    app.one_gpu_of("H100-80GB").await;
    // A whole H100 instance: neither GPU has one, so the approval waits for a layout change on the uncordoned one.
    let (s, first) = app.send(Method::POST, "/api/v1/requests", &dev, Some(mig(&t, "7g.80gb", 1))).await;
    assert_eq!(s, StatusCode::CREATED, "{first}");
    let path = format!("/api/v1/requests/{}/approve", first["id"].as_str().expect("id"));
    let (s, approval) = app.send(Method::POST, &path, &app.admin, None).await;
    assert_eq!(s, StatusCode::OK, "{approval}");
    assert_eq!(approval["layout_proposals"].as_array().map(Vec::len), Some(1), "{approval}");
    assert_eq!(approval["layout_proposals"][0]["gpu"], gpus[0].as_str(), "{approval}");

    let (s, second) = app.send(Method::POST, "/api/v1/requests", &dev, Some(mig(&t, "7g.80gb", 1))).await;
    assert_eq!(s, StatusCode::CREATED, "{second}");
    // The demo node has no agent here: marked heard from, so that its GPUs count as on a ready node.
    app.heard_node_of(&gpus[0]).await;
    let w = waiting(&app, &second["id"]).await;
    assert_eq!(w["reason"]["code"], "no_capacity", "{w}");
    let h100 = &w["reason"]["models"][0];
    assert_eq!((h100["model"].clone(), h100["free_slices"].clone()), (json!("H100-80GB"), json!(0.0)), "{w}");
    assert_eq!(
        h100["held_back"],
        json!({"cordoned": 1, "node_not_ready": 0, "layout_pending": 1, "free_slices": 7.0}),
        "one cordoned (7 free), one with the first request's layout change waiting (its 7 taken by it): {w}"
    );
    let sentence = w["sentence"].as_str().unwrap_or("");
    assert!(
        sentence.contains(
            "not taking new work: 1 GPU cordoned, 1 GPU with a layout change waiting for approval; 7 compute slices \
             free there"
        ),
        "{sentence}"
    );
    // The planner's refusal says the same: one cordoned, one waiting, not "2 GPUs cordoned".
    let path = format!("/api/v1/requests/{}/approve", second["id"].as_str().expect("id"));
    let (s, refused) = app.send(Method::POST, &path, &app.admin, None).await;
    assert_eq!((s, refused["code"].clone()), (StatusCode::CONFLICT, json!("no_capacity")), "{refused}");
    let detail = refused["detail"].as_str().unwrap_or("");
    assert!(
        detail.contains("1 GPU cordoned, 1 GPU with a layout change waiting for approval")
            && !detail.contains("2 GPUs"),
        "{detail}"
    );
}

/// The document's `Waiting.reason` names every code a request can wait with.
#[test]
fn the_document_lists_every_wait_code() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../openapi/openapi.json");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("openapi/openapi.json")).expect("json");
    let described =
        doc["components"]["schemas"]["Waiting"]["properties"]["reason"]["description"].as_str().unwrap_or("");
    for code in tessera_core::pending::WaitReason::CODES {
        assert!(described.contains(&format!("`{code}`")), "{code} is not in Waiting.reason's description: {described}");
    }
}
