//! Quota requests over real HTTP, on SQLite and PostgreSQL: a tenant's admin asks, a platform admin grants part,
//! the limits change in the same transaction and the history says who, when, why and via which request; a
//! refusal for quota names exactly what to ask for; temporary increases end without taking anything held.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tessera_server::store::Role;

use crate::harness::{TestApp, TestDb, on_both_backends};

on_both_backends!(
    a_tenant_admin_asks_and_a_platform_admin_grants_part,
    a_refusal_for_quota_names_exactly_what_to_ask_for,
    temporary_increases_end_without_taking_back_what_is_held,
    quota_requests_are_checked_against_their_bounds,
    of_two_admins_deciding_the_same_version_one_wins,
    the_quota_commands_ask_grant_and_show_the_history,
    approving_an_ask_the_limit_already_gives_never_lowers_it,
    a_member_passes_an_ask_to_the_tenant_admins,
);

async fn post(app: &TestApp, path: &str, token: &str, body: Value, version: Option<i64>) -> (StatusCode, Value) {
    let mut r = app.call(Method::POST, path, Some(token)).json(&body);
    if let Some(v) = version {
        r = r.header("If-Match", format!("\"v{v}\""));
    }
    crate::harness::answer(r).await
}

fn code(body: &Value) -> &str {
    body["code"].as_str().unwrap_or("")
}

/// A tenant named `name` with `compute_slices` limited to `limit`, its admin's and a plain member's tokens.
async fn team(app: &TestApp, name: &str, limit: f64) -> (String, String, String) {
    let t = app.tenant(name, json!({})).await;
    assert_eq!(app.quota(&t, json!({"compute_slices": limit})).await.status(), StatusCode::OK);
    let lead = app.user(&format!("{name}-lead"), &[(&t, Role::TenantAdmin)]).await.1;
    let member = app.member(&format!("{name}-member"), &t).await;
    (t, lead, member)
}

async fn limit_of(app: &TestApp, tenant: &str, resource: &str) -> Value {
    let (s, q) = app.get(&format!("/api/v1/tenants/{tenant}/quotas"), &app.admin).await;
    assert_eq!(s, StatusCode::OK);
    q["resources"].as_array().expect("lines").iter().find(|l| l["resource"] == resource).cloned().unwrap_or(Value::Null)
}

async fn a_tenant_admin_asks_and_a_platform_admin_grants_part(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let (t, lead, member) = team(&app, "vision", 7.0).await;
    let (other, other_lead, _) = team(&app, "speech", 7.0).await;
    let ask = json!({"limits": {"compute_slices": 14, "gpu/h100-80gb": 2}, "reason": "training the new model"});

    // Members ask their admins; other tenants' admins do not see this one at all.
    let (s, b) = post(&app, &format!("/api/v1/tenants/{t}/quota-requests"), &member, ask.clone(), None).await;
    assert_eq!((s, code(&b)), (StatusCode::FORBIDDEN, "forbidden"), "{b}");
    let (s, _) = post(&app, &format!("/api/v1/tenants/{t}/quota-requests"), &other_lead, ask.clone(), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    // By name, as the portal addresses tenants.
    let (s, asked) = post(&app, "/api/v1/tenants/vision/quota-requests", &lead, ask, None).await;
    assert_eq!(s, StatusCode::CREATED, "{asked}");
    let id = asked["id"].as_str().expect("id").to_string();
    assert_eq!(asked["state"], "pending");
    assert_eq!(asked["requested_by"], "user:vision-lead");
    assert_eq!(
        asked["lines"],
        json!([
            {"resource": "gpu/H100-80GB", "asked": 2.0, "before": null, "granted": null},
            {"resource": "compute_slices", "asked": 14.0, "before": 7.0, "granted": null},
        ])
    );

    // Who sees it: the tenant's members and platform admins, nobody else.
    let (_, page) = app.get("/api/v1/quota-requests", &member).await;
    assert_eq!(page["items"].as_array().map(Vec::len), Some(1), "{page}");
    let (_, page) = app.get("/api/v1/quota-requests", &other_lead).await;
    assert_eq!(page["items"], json!([]));
    let (s, _) = app.get(&format!("/api/v1/quota-requests/{id}"), &other_lead).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (_, page) = app.get("/api/v1/quota-requests?state=pending", &app.admin).await;
    assert_eq!(page["items"][0]["id"], id.as_str());
    let (s, b) = app.get(&format!("/api/v1/quota-requests?tenant={other}"), &lead).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{b}");

    // Only platform admins decide.
    let approve = format!("/api/v1/quota-requests/{id}/approve");
    let (s, _) = post(&app, &approve, &lead, json!({}), None).await;
    assert_eq!(s, StatusCode::FORBIDDEN);

    // More than asked, or below the limit in force, is not a grant.
    for bad in [json!({"compute_slices": 15}), json!({"compute_slices": 6}), json!({"memory_gib": 10})] {
        let (s, b) = post(&app, &approve, &app.admin, json!({"limits": bad}), Some(1)).await;
        assert_eq!((s, code(&b)), (StatusCode::UNPROCESSABLE_ENTITY, "quota_grant_invalid"), "{b}");
    }
    assert_eq!(limit_of(&app, &t, "compute_slices").await["limit"], 7.0, "nothing half-applied");

    // Part of it: 10 of the 14 slices, no GPUs.
    let grant = json!({"limits": {"compute_slices": 10}, "comment": "10 now, more once the H200s arrive"});
    let (s, granted) = post(&app, &approve, &app.admin, grant, Some(1)).await;
    assert_eq!(s, StatusCode::OK, "{granted}");
    assert_eq!(granted["state"], "approved");
    assert_eq!(granted["version"], 2);
    assert_eq!(granted["decided_by"], "user:admin");
    assert_eq!(granted["lines"][1]["granted"], 10.0);
    assert_eq!(granted["lines"][0]["granted"], Value::Null);
    assert_eq!(limit_of(&app, &t, "compute_slices").await["limit"], 10.0);
    assert_eq!(limit_of(&app, &t, "gpu/H100-80GB").await, Value::Null, "not granted, so not limited");

    // Decided once.
    let (s, b) = post(&app, &approve, &app.admin, json!({}), None).await;
    assert_eq!((s, code(&b)), (StatusCode::CONFLICT, "quota_request_invalid_transition"), "{b}");

    // The history: who, why, via which request; the admin's first limit before it.
    let (s, history) = app.get("/api/v1/tenants/vision/quota-history", &member).await;
    assert_eq!(s, StatusCode::OK, "{history}");
    assert_eq!(history[0]["resource"], "compute_slices");
    assert_eq!((history[0]["before"].clone(), history[0]["after"].clone()), (json!(7.0), json!(10.0)));
    assert_eq!(history[0]["actor"], "user:admin");
    assert_eq!(history[0]["why"], "10 now, more once the H200s arrive");
    assert_eq!(history[0]["quota_request"], id.as_str());
    assert_eq!((history[1]["before"].clone(), history[1]["after"].clone()), (Value::Null, json!(7.0)));
    assert_eq!(history[1]["quota_request"], Value::Null);
    assert_eq!(history.as_array().map(Vec::len), Some(2));
    let (s, _) = app.get(&format!("/api/v1/tenants/{t}/quota-history"), &other_lead).await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    // A withdrawn request cannot be granted; members cannot withdraw.
    let (_, again) = post(
        &app,
        &format!("/api/v1/tenants/{t}/quota-requests"),
        &lead,
        json!({"limits": {"compute_slices": 12}, "reason": "more"}),
        None,
    )
    .await;
    let again_id = again["id"].as_str().expect("id");
    let (s, _) = post(&app, &format!("/api/v1/quota-requests/{again_id}/cancel"), &member, json!({}), None).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, cancelled) =
        post(&app, &format!("/api/v1/quota-requests/{again_id}/cancel"), &lead, json!({}), Some(1)).await;
    assert_eq!((s, cancelled["state"].as_str()), (StatusCode::OK, Some("cancelled")), "{cancelled}");
    let (s, _) = post(&app, &format!("/api/v1/quota-requests/{again_id}/approve"), &app.admin, json!({}), None).await;
    assert_eq!(s, StatusCode::CONFLICT);

    // Refusing needs a reason.
    let (_, third) = post(
        &app,
        &format!("/api/v1/tenants/{t}/quota-requests"),
        &lead,
        json!({"limits": {"compute_slices": 20}, "reason": "all of it"}),
        None,
    )
    .await;
    let reject = format!("/api/v1/quota-requests/{}/reject", third["id"].as_str().expect("id"));
    let (s, b) = post(&app, &reject, &app.admin, json!({"reason": " "}), None).await;
    assert_eq!((s, code(&b)), (StatusCode::UNPROCESSABLE_ENTITY, "reason_required"));
    let (s, b) = post(&app, &reject, &app.admin, json!({"reason": "the fleet is full this month"}), None).await;
    assert_eq!(
        (s, b["state"].as_str(), b["comment"].as_str()),
        (StatusCode::OK, Some("rejected"), Some("the fleet is full this month"))
    );
    assert_eq!(limit_of(&app, &t, "compute_slices").await["limit"], 10.0);
}

async fn a_refusal_for_quota_names_exactly_what_to_ask_for(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let (t, lead, _) = team(&app, "nlp", 2.0).await;
    let ask = |n: u32| json!({"tenant": t, "spec": {"mode": "mig", "profile": "1g.10gb", "model": "H100-80GB"}, "count": n, "reason": "eval"});
    let (s, held) = app.send(Method::POST, "/api/v1/requests", &lead, Some(ask(1))).await;
    assert_eq!(s, StatusCode::CREATED, "{held}");
    let (s, refused) = app.send(Method::POST, "/api/v1/requests", &lead, Some(ask(3))).await;
    assert_eq!((s, code(&refused)), (StatusCode::CONFLICT, "quota_exceeded"), "{refused}");
    // 1 held + 3 asked: a limit of 4 lets it through.
    assert_eq!(refused["ask_for"], json!({"compute_slices": 4.0}));

    let body = json!({"limits": refused["ask_for"], "reason": "the evaluation needs 3 more"});
    let (s, q) = post(&app, &format!("/api/v1/tenants/{t}/quota-requests"), &lead, body, None).await;
    assert_eq!(s, StatusCode::CREATED, "{q}");
    let (s, _) = post(
        &app,
        &format!("/api/v1/quota-requests/{}/approve", q["id"].as_str().expect("id")),
        &app.admin,
        json!({}),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let (s, b) = app.send(Method::POST, "/api/v1/requests", &lead, Some(ask(3))).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let line = limit_of(&app, &t, "compute_slices").await;
    assert_eq!(
        (line["limit"].clone(), line["held"].clone(), line["over"].clone()),
        (json!(4.0), json!(4.0), json!(false))
    );
}

async fn temporary_increases_end_without_taking_back_what_is_held(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let (t, lead, _) = team(&app, "burst", 2.0).await;
    // An hour and a minute ahead (the server's clock has moved on when it checks the end is an hour away).
    let now = tessera_server::store::now_ms() + 60_000;
    let hour = 3_600_000;
    let body = json!({"limits": {"compute_slices": 5}, "reason": "conference deadline", "until_ms": now + hour});
    let (s, q) = post(&app, &format!("/api/v1/tenants/{t}/quota-requests"), &lead, body, None).await;
    assert_eq!(s, StatusCode::CREATED, "{q}");
    assert_eq!(q["until_ms"], now + hour);
    let id = q["id"].as_str().expect("id").to_string();
    let (s, _) = post(&app, &format!("/api/v1/quota-requests/{id}/approve"), &app.admin, json!({}), None).await;
    assert_eq!(s, StatusCode::OK);
    // Meanwhile an admin adds one slice for good; the tenant takes 4 of its 6.
    assert_eq!(app.quota(&t, json!({"compute_slices": 6})).await.status(), StatusCode::OK);
    let ask = |n: u32| json!({"tenant": t, "spec": {"mode": "mig", "profile": "1g.10gb", "model": "H100-80GB"}, "count": n, "reason": "eval"});
    let (s, held) = app.send(Method::POST, "/api/v1/requests", &lead, Some(ask(4))).await;
    assert_eq!(s, StatusCode::CREATED, "{held}");

    // Not due yet: nothing ends.
    assert_eq!(app.store.end_due_quota_requests(now + hour - 1).await.expect("sweep"), 0);
    // Due: the 3 it gave are taken back, the admin's 1 stays; the 4 held stay held, over the limit of 3.
    assert_eq!(app.store.end_due_quota_requests(now + hour).await.expect("sweep"), 1);
    assert_eq!(app.store.end_due_quota_requests(now + 2 * hour).await.expect("sweep"), 0, "ends once");
    let line = limit_of(&app, &t, "compute_slices").await;
    assert_eq!(
        (line["limit"].clone(), line["held"].clone(), line["over"].clone()),
        (json!(3.0), json!(4.0), json!(true))
    );
    let (_, ended) = app.get(&format!("/api/v1/quota-requests/{id}"), &lead).await;
    assert_eq!(ended["state"], "ended");
    let (_, request) = app.get(&format!("/api/v1/requests/{}", held["id"].as_str().expect("id")), &lead).await;
    assert_eq!(request["state"], "pending", "nothing held is taken");
    // Over the limit: new requests are refused until it is back under.
    let (s, refused) = app.send(Method::POST, "/api/v1/requests", &lead, Some(ask(1))).await;
    assert_eq!((s, code(&refused)), (StatusCode::CONFLICT, "quota_exceeded"));
    let (_, history) = app.get(&format!("/api/v1/tenants/{t}/quota-history"), &lead).await;
    assert_eq!(history[0]["actor"], "system:quota-end");
    assert_eq!((history[0]["before"].clone(), history[0]["after"].clone()), (json!(6.0), json!(3.0)));
    assert_eq!(history[0]["quota_request"], id.as_str());
}

async fn quota_requests_are_checked_against_their_bounds(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let (t, lead, _) = team(&app, "bounds", 4.0).await;
    let path = format!("/api/v1/tenants/{t}/quota-requests");
    let now = tessera_server::store::now_ms();
    // 33 resources that all exist: one more than a request may name.
    let many: serde_json::Map<String, Value> = tessera_core::Catalog::builtin()
        .models
        .iter()
        .flat_map(|m| ["gpu", "timeslice", "mps"].map(|k| (format!("{k}/{}", m.key), json!(1))))
        .chain(["compute_slices", "memory_gib", "mig/H100-80GB/1g.10gb"].map(|k| (k.to_string(), json!(8))))
        .take(33)
        .collect();
    assert_eq!(many.len(), 33);
    let cases = [
        (json!({"limits": {}, "reason": "r"}), "quota_request_invalid"),
        (json!({"limits": {"compute_slices": 8}, "reason": ""}), "reason_required"),
        (json!({"limits": {"compute_slices": 8}, "reason": "x".repeat(2001)}), "invalid_reason"),
        (json!({"limits": {"compute_slices": 8}, "reason": "a\u{202E}b"}), "invalid_reason"),
        (json!({"limits": {"compute_slices": 1e13}, "reason": "r"}), "quota_bad_limit"),
        (json!({"limits": {"compute_slices": -1}, "reason": "r"}), "quota_bad_limit"),
        (json!({"limits": {"compute_slices": 4}, "reason": "r"}), "quota_unchanged"),
        (json!({"limits": {"cpu": 4}, "reason": "r"}), "quota_bad_resource"),
        (json!({"limits": {"compute_slices": 8}, "reason": "r", "until_ms": now}), "invalid_time"),
        (json!({"limits": {"compute_slices": 8}, "reason": "r", "until_ms": i64::MAX}), "invalid_time"),
        (
            json!({"limits": {"compute_slices": 3}, "reason": "r", "until_ms": now + 7_200_000}),
            "quota_temporary_not_increase",
        ),
        (
            json!({"limits": {"memory_gib": 80}, "reason": "r", "until_ms": now + 7_200_000}),
            "quota_temporary_not_increase",
        ),
    ];
    for (body, expected) in cases {
        let (s, b) = post(&app, &path, &lead, body.clone(), None).await;
        assert_eq!((s, code(&b)), (StatusCode::UNPROCESSABLE_ENTITY, expected), "{body}: {b}");
    }
    let body = json!({"limits": many, "reason": "r"});
    let (s, b) = post(&app, &path, &lead, body, None).await;
    assert_eq!((s, code(&b)), (StatusCode::UNPROCESSABLE_ENTITY, "quota_request_invalid"), "{b}");
    let (s, b) =
        post(&app, &path, &lead, json!({"limits": {"compute_slices": 8}, "reason": "r", "extra": 1}), None).await;
    assert!(s.is_client_error(), "{s} {b}");
    for q in ["limit=0", "limit=501", "limit=99999999999", "state=granted"] {
        let (s, b) = app.get(&format!("/api/v1/quota-requests?{q}"), &app.admin).await;
        assert!(s.is_client_error(), "{q}: {s} {b}");
    }
    for q in ["limit=0", "limit=1001"] {
        let (s, b) = app.get(&format!("/api/v1/tenants/{t}/quota-history?{q}"), &lead).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{q}: {b}");
    }
    let (_, page) = app.get("/api/v1/quota-requests", &app.admin).await;
    assert_eq!(page["items"], json!([]), "nothing was written");
}

async fn of_two_admins_deciding_the_same_version_one_wins(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let (t, lead, _) = team(&app, "race", 4.0).await;
    let second = app.store.create_user("second-admin", true, "test").await.expect("admin");
    let second_token = tessera_server::http::auth::new_token_secret();
    let hash = tessera_server::http::auth::token_hash(&second_token);
    app.store.create_token(&second.id, "test", &hash, "test").await.expect("token");
    let (_, q) = post(
        &app,
        &format!("/api/v1/tenants/{t}/quota-requests"),
        &lead,
        json!({"limits": {"compute_slices": 8}, "reason": "r"}),
        None,
    )
    .await;
    let id = q["id"].as_str().expect("id");
    let approve = format!("/api/v1/quota-requests/{id}/approve");
    let reject = format!("/api/v1/quota-requests/{id}/reject");
    let (a, b) = tokio::join!(
        post(&app, &approve, &app.admin, json!({}), Some(1)),
        post(&app, &reject, &second_token, json!({"reason": "no"}), Some(1)),
    );
    let statuses = [a.0, b.0];
    assert_eq!(statuses.iter().filter(|s| **s == StatusCode::OK).count(), 1, "{a:?} {b:?}");
    assert_eq!(statuses.iter().filter(|s| **s == StatusCode::CONFLICT).count(), 1, "{a:?} {b:?}");
    let expected = if a.0 == StatusCode::OK { 8.0 } else { 4.0 };
    assert_eq!(limit_of(&app, &t, "compute_slices").await["limit"], expected);
}

async fn the_quota_commands_ask_grant_and_show_the_history(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let (t, lead, _) = team(&app, "cli-team", 2.0).await;
    // A refusal for quota prints the command that asks for what is missing.
    let (code, out) = app
        .cli(
            &lead,
            &["request", "create", "--tenant", &t, "--profile", "1g.10gb", "--model", "H100-80GB", "--count", "3"],
        )
        .await;
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("tessera quota ask --tenant TENANT --reason WHY compute_slices=3"), "{out}");

    let ask = ["quota", "ask", "--tenant", "cli-team", "--reason", "evaluation", "compute_slices=3", "memory_gib=40"];
    let (code, out) = app.cli(&lead, &ask).await;
    assert_eq!(code, Some(0), "{out}");
    let id = serde_json::from_str::<Value>(&out).expect("json")["id"].as_str().expect("id").to_string();
    let (code, out) =
        app.cli(&lead, &["quota", "ask", "--tenant", "cli-team", "--reason", "r", "compute_slices"]).await;
    assert_eq!(code, Some(2), "RESOURCE=LIMIT: {out}");
    let (code, out) = app.cli(&lead, &["quota", "list", "--state", "pending"]).await;
    assert_eq!(
        (code, serde_json::from_str::<Value>(&out).expect("json")[0]["id"].as_str()),
        (Some(0), Some(id.as_str()))
    );
    let (code, out) = app.cli(&lead, &["quota", "approve", &id]).await;
    assert_eq!((code, out.lines().next()), (Some(1), Some("error[forbidden]: platform admins only")));
    let (code, out) = app.cli(&app.admin, &["quota", "approve", &id, "compute_slices=3", "--comment", "ok"]).await;
    assert_eq!(code, Some(0), "{out}");
    let granted: Value = serde_json::from_str(&out).expect("json");
    assert_eq!((granted["state"].as_str(), granted["comment"].as_str()), (Some("approved"), Some("ok")));
    let (code, out) = app.cli(&lead, &["quota", "history", "--tenant", "cli-team"]).await;
    assert_eq!(code, Some(0), "{out}");
    let history: Value = serde_json::from_str(&out).expect("json");
    assert_eq!((history[0]["after"].clone(), history[0]["quota_request"].clone()), (json!(3.0), json!(id)));
    assert_eq!(limit_of(&app, &t, "memory_gib").await, Value::Null, "memory was not granted");
}

/// The tenant at 7 asks for 10; an admin sets 12 before deciding. Approving as asked would set 10: it is refused
/// (409 `quota_ask_already_met`) and changes nothing; with a second line still open, only that line is granted.
async fn approving_an_ask_the_limit_already_gives_never_lowers_it(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let (t, lead, _) = team(&app, "vision", 7.0).await;
    let ask = json!({"limits": {"compute_slices": 10}, "reason": "a bigger training run"});
    let (s, asked) = post(&app, &format!("/api/v1/tenants/{t}/quota-requests"), &lead, ask, None).await;
    assert_eq!(s, StatusCode::CREATED, "{asked}");
    let id = asked["id"].as_str().expect("id").to_string();
    assert_eq!(app.quota(&t, json!({"compute_slices": 12})).await.status(), StatusCode::OK);

    let approve = format!("/api/v1/quota-requests/{id}/approve");
    for grant in [json!({}), json!({"limits": {"compute_slices": 10}})] {
        let (s, b) = post(&app, &approve, &app.admin, grant, None).await;
        assert_eq!((s, code(&b)), (StatusCode::CONFLICT, "quota_ask_already_met"), "{b}");
        assert!(b["detail"].as_str().is_some_and(|d| d.contains("12")), "names the limit in force: {b}");
    }
    assert_eq!(limit_of(&app, &t, "compute_slices").await["limit"], 12.0, "never lowered");
    let (_, still) = app.get(&format!("/api/v1/quota-requests/{id}"), &app.admin).await;
    assert_eq!(still["state"], "pending", "{still}");
    let (s, history) = app.get(&format!("/api/v1/tenants/{t}/quota-history"), &app.admin).await;
    assert_eq!(s, StatusCode::OK, "{history}");
    assert!(!history.to_string().contains("\"after\":10"), "no change to 10 recorded: {history}");

    // Two lines, one given meanwhile: approving in full grants the other alone.
    let ask = json!({"limits": {"compute_slices": 14, "gpu/h100-80gb": 2}, "reason": "both"});
    let (s, asked) = post(&app, &format!("/api/v1/tenants/{t}/quota-requests"), &lead, ask, None).await;
    assert_eq!(s, StatusCode::CREATED, "{asked}");
    let id = asked["id"].as_str().expect("id").to_string();
    assert_eq!(app.quota(&t, json!({"compute_slices": 15})).await.status(), StatusCode::OK);
    let (s, granted) = post(&app, &format!("/api/v1/quota-requests/{id}/approve"), &app.admin, json!({}), None).await;
    assert_eq!(s, StatusCode::OK, "{granted}");
    assert_eq!(limit_of(&app, &t, "compute_slices").await["limit"], 15.0, "kept, not lowered to 14");
    assert_eq!(limit_of(&app, &t, "gpu/H100-80GB").await["limit"], 2.0, "{granted}");
}

/// A member cannot ask for quota, but can pass the prepared ask to the tenant's admins: they are named, told in
/// their inbox with the amounts, and nothing else changes; bad asks, floods and tenants without an admin are refused.
async fn a_member_passes_an_ask_to_the_tenant_admins(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let (t, lead, member) = team(&app, "vision", 7.0).await;
    let ask = json!({"limits": {"compute_slices": 10}, "reason": "the sweep needs 3 more"});
    let path = format!("/api/v1/tenants/{t}/quota-suggestions");
    let (s, sent) = post(&app, &path, &member, ask.clone(), None).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{sent}");
    assert_eq!(
        (sent["tenant_admins"].clone(), sent["suggested_by"].clone(), sent["limits"].clone()),
        (json!(["vision-lead"]), json!("user:vision-member"), json!({"compute_slices": 10.0})),
        "{sent}"
    );
    // The admin's inbox has it, with the amounts; the limit is as it was and no quota request was made.
    let (s, inbox) = app.get("/api/v1/inbox", &lead).await;
    assert_eq!(s, StatusCode::OK, "{inbox}");
    let told = inbox
        .as_array()
        .expect("events")
        .iter()
        .find(|e| e["type"] == "quota_request.suggested")
        .unwrap_or_else(|| panic!("the suggestion in the admin's inbox: {inbox}"))
        .clone();
    assert_eq!(
        (
            told["tenant"].clone(),
            told["data"]["actor"].clone(),
            told["data"]["after"]["limits"]["compute_slices"].clone()
        ),
        (json!(t), json!("user:vision-member"), json!(10.0)),
        "{told}"
    );
    assert_eq!(limit_of(&app, &t, "compute_slices").await["limit"], 7.0);
    let (_, asks) = app.get(&format!("/api/v1/quota-requests?tenant={t}"), &lead).await;
    assert_eq!(asks["items"], json!([]), "{asks}");
    // Again at once: refused for 10 s.
    let (s, b) = post(&app, &path, &member, ask.clone(), None).await;
    assert_eq!((s, code(&b)), (StatusCode::TOO_MANY_REQUESTS, "rate_limited"), "{b}");
    // Checked like a quota request.
    let (s, b) = post(&app, &path, &lead, json!({"limits": {}, "reason": "x"}), None).await;
    assert_eq!((s, code(&b)), (StatusCode::UNPROCESSABLE_ENTITY, "quota_request_invalid"), "{b}");
    let (s, b) = post(&app, &path, &lead, json!({"limits": {"compute_slices": 10}, "reason": " "}), None).await;
    assert_eq!((s, code(&b)), (StatusCode::UNPROCESSABLE_ENTITY, "reason_required"), "{b}");
    assert_eq!(sent["platform_admins"], json!([]), "the tenant has an admin: {sent}");
    // Another tenant's member: not found; a tenant without an admin: its platform admins are told.
    let other = app.tenant("speech", json!({})).await;
    let (s, _) = post(&app, &format!("/api/v1/tenants/{other}/quota-suggestions"), &member, ask.clone(), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let lonely = app.member("speech-member", &other).await;
    let (s, b) = post(&app, &format!("/api/v1/tenants/{other}/quota-suggestions"), &lonely, ask, None).await;
    assert_eq!(
        (s, b["tenant_admins"].clone(), b["platform_admins"].clone()),
        (StatusCode::ACCEPTED, json!([]), json!(["admin"])),
        "{b}"
    );
    let (_, inbox) = app.get("/api/v1/inbox", &app.admin).await;
    assert!(
        inbox
            .as_array()
            .expect("events")
            .iter()
            .any(|e| e["type"] == "quota_request.suggested" && e["tenant"] == json!(other)),
        "the platform admin's inbox has it: {inbox}"
    );
}
