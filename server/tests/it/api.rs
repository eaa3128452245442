//! The REST API over real HTTP: a server on port 0, each test on a fresh SQLite database and a fresh PostgreSQL one
//! (when `TESSERA_TEST_POSTGRES_URL` is set).

use reqwest::{Method, Response, StatusCode};
use serde_json::{Value, json};
use tessera_server::http::auth::new_token_secret;
use tessera_server::store::Role;

use crate::harness::{TestApp, TestDb, on_both_backends};

on_both_backends!(
    health_readiness_and_request_ids,
    every_api_route_needs_a_valid_token,
    tenants_are_created_by_admins_and_hidden_from_others,
    quota_updates_are_checked_whole_before_anything_is_written,
    requests_are_held_against_the_quota_and_refused_beyond_it,
    sixty_four_clients_racing_over_http_for_the_last_five_units_get_exactly_five,
    a_retried_post_with_the_same_idempotency_key_creates_one_request,
    small_requests_are_auto_approved_under_the_tenant_policy,
    approvals_use_if_match_so_one_of_two_admins_wins,
    if_match_is_read_strictly_on_every_change,
    requests_are_listed_a_page_at_a_time,
    listed_pages_show_every_change_at_once,
    malformed_and_oversized_bodies_are_problems_not_panics,
    nodes_are_checked_against_the_catalog_and_the_mig_rules,
    approvers_see_where_the_planner_would_place_a_request,
    approval_places_slices_and_layout_changes_wait_for_an_admin,
    users_members_and_tokens_are_managed_with_their_roles,
    layouts_are_validated_with_the_core_rules,
    hand_edited_layouts_keep_instances_in_use_and_tenants_see_their_allocations,
    whole_gpu_slices_are_placed_on_gpus_shared_the_same_way,
    the_request_commands_drive_the_api_from_scripts,
    time_slicing_and_mps_never_share_a_node,
    the_api_reference_is_served_without_any_outside_asset,
    portal_pages_are_rendered_on_the_server_with_what_the_viewer_may_see,
    pages_arrive_whole_under_load,
    offerings_show_any_signed_in_user_the_fleet_by_model_and_the_queue,
    the_tenant_dashboard_and_approvals_are_rendered_for_who_may_see_them,
);

/// Asks for `count` H100 1g.10gb slices as `token`.
trait Ask {
    async fn ask(&self, token: &str, tenant: &str, count: u32) -> Response;
}

impl Ask for TestApp {
    async fn ask(&self, token: &str, tenant: &str, count: u32) -> Response {
        self.call(Method::POST, "/api/v1/requests", Some(token))
            .json(&json!({"tenant": tenant, "spec": {"mode": "mig", "profile": "1g.10gb", "model": "H100-80GB"}, "count": count, "reason": "eval"}))
            .send()
            .await
            .expect("send")
    }
}

async fn problem(r: Response, status: StatusCode, code: &str) -> Value {
    assert_eq!(r.status(), status);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["code"], code, "{body}");
    assert_eq!(body["status"], status.as_u16());
    assert!(body["detail"].as_str().is_some_and(|d| !d.is_empty()));
    body
}

async fn health_readiness_and_request_ids(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let r = app.call(Method::GET, "/healthz", None).send().await.expect("send");
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers().contains_key("x-request-id"));
    let r = app.call(Method::GET, "/readyz", None).header("x-request-id", "abc-123").send().await.expect("send");
    assert_eq!((r.status(), r.headers()["x-request-id"].to_str().expect("id")), (StatusCode::OK, "abc-123"));
}

async fn every_api_route_needs_a_valid_token(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    problem(
        app.call(Method::GET, "/api/v1/catalog/models", None).send().await.expect("send"),
        StatusCode::UNAUTHORIZED,
        "unauthenticated",
    )
    .await;
    let fake = new_token_secret();
    problem(
        app.call(Method::GET, "/api/v1/catalog/models", Some(&fake)).send().await.expect("send"),
        StatusCode::UNAUTHORIZED,
        "invalid_token",
    )
    .await;
    let r = app
        .call(Method::GET, "/api/v1/catalog/models/NVIDIA%20H100%2080GB%20HBM3", Some(&app.admin))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::OK);
    let model: Value = r.json().await.expect("json");
    assert_eq!(model["key"], "H100-80GB");
    assert_eq!(model["profiles"][4]["placements"], json!([[0, 4], [4, 4]]));
}

async fn tenants_are_created_by_admins_and_hidden_from_others(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let a = app.tenant("team-a", json!({})).await;
    let b = app.tenant("team-b", json!({})).await;
    let alice = app.member("alice", &a).await;
    problem(
        app.call(Method::POST, "/api/v1/tenants", Some(&alice))
            .json(&json!({"name": "mine"}))
            .send()
            .await
            .expect("send"),
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
    problem(
        app.call(Method::POST, "/api/v1/tenants", Some(&app.admin))
            .json(&json!({"name": "team-a"}))
            .send()
            .await
            .expect("send"),
        StatusCode::CONFLICT,
        "already_exists",
    )
    .await;
    problem(
        app.call(Method::POST, "/api/v1/tenants", Some(&app.admin))
            .json(&json!({"name": "Team A!"}))
            .send()
            .await
            .expect("send"),
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_name",
    )
    .await;
    let r = app.call(Method::GET, &format!("/api/v1/tenants/{a}"), Some(&alice)).send().await.expect("send");
    assert_eq!(r.status(), StatusCode::OK);
    problem(
        app.call(Method::GET, &format!("/api/v1/tenants/{b}"), Some(&alice)).send().await.expect("send"),
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    problem(
        app.call(Method::GET, &format!("/api/v1/tenants/{b}/quotas"), Some(&alice)).send().await.expect("send"),
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
}

async fn quota_updates_are_checked_whole_before_anything_is_written(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let t = app.tenant("quota-team", json!({})).await;
    problem(
        app.quota(&t, json!({"compute_slices": 10, "mig/H100-80GB/9g.9gb": 1})).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "quota_bad_resource",
    )
    .await;
    problem(app.quota(&t, json!({"compute_slices": -1})).await, StatusCode::UNPROCESSABLE_ENTITY, "quota_bad_limit")
        .await;
    let r = app.call(Method::GET, &format!("/api/v1/tenants/{t}/quotas"), Some(&app.admin)).send().await.expect("send");
    assert_eq!(r.json::<Value>().await.expect("json")["resources"], json!([]), "nothing half-applied");
    let r = app.quota(&t, json!({"mig/h100-80gb/1g.10gb": 2, "compute_slices": 1.75})).await;
    assert_eq!(r.status(), StatusCode::OK);
    let view: Value = r.json().await.expect("json");
    assert_eq!(
        view["resources"],
        json!([
            {"resource": "mig/H100-80GB/1g.10gb", "limit": 2.0, "held": 0.0, "over": false, "maximum": null,
             "lending_limit": null, "borrowed": 0.0, "available": 2.0},
            {"resource": "compute_slices", "limit": 1.75, "held": 0.0, "over": false, "maximum": null,
             "lending_limit": null, "borrowed": 0.0, "available": 1.75},
        ])
    );
}

async fn requests_are_held_against_the_quota_and_refused_beyond_it(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let t = app.tenant("req-team", json!({})).await;
    app.quota(&t, json!({"mig/H100-80GB/1g.10gb": 3})).await;
    let alice = app.member("alice", &t).await;
    let r = app.ask(&alice, &t, 2).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(r.headers()["etag"], "\"v1\"");
    let location = r.headers()["location"].to_str().expect("location").to_string();
    let created: Value = r.json().await.expect("json");
    assert_eq!((created["state"].as_str(), created["count"].as_u64()), (Some("pending"), Some(2)));
    assert_eq!(location, format!("/api/v1/requests/{}", created["id"].as_str().expect("id")));
    let body = problem(app.ask(&alice, &t, 2).await, StatusCode::CONFLICT, "quota_exceeded").await;
    assert_eq!(body["errors"][0]["message"], "mig/H100-80GB/1g.10gb: 2 held + 2 requested would exceed the limit of 3");
    problem(app.ask(&alice, &t, 0).await, StatusCode::UNPROCESSABLE_ENTITY, "invalid_count").await;
    let short = json!({"tenant": t, "spec": {"mode": "exclusive", "model": "A30-24GB"}, "count": 1, "duration_s": 5});
    problem(
        app.call(Method::POST, "/api/v1/requests", Some(&alice)).json(&short).send().await.expect("send"),
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_duration",
    )
    .await;
    let day = json!({"tenant": t, "spec": {"mode": "exclusive", "model": "A30-24GB"}, "count": 1, "duration_s": 86400});
    let r: Value = app
        .call(Method::POST, "/api/v1/requests", Some(&alice))
        .json(&day)
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!((r["duration_s"].as_u64(), r["expires_at_ms"].clone()), (Some(86400), Value::Null));
    let bad = json!({"tenant": t, "spec": {"mode": "mig", "profile": "3g.20gb", "model": "H100-80GB"}, "count": 1});
    problem(
        app.call(Method::POST, "/api/v1/requests", Some(&alice)).json(&bad).send().await.expect("send"),
        StatusCode::UNPROCESSABLE_ENTITY,
        "request_invalid",
    )
    .await;
    let other = app.tenant("other", json!({})).await;
    problem(app.ask(&alice, &other, 1).await, StatusCode::NOT_FOUND, "not_found").await;
}

async fn sixty_four_clients_racing_over_http_for_the_last_five_units_get_exactly_five(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let t = app.tenant("race-http", json!({})).await;
    app.quota(&t, json!({"mig/H100-80GB/1g.10gb": 5})).await;
    let alice = app.member("alice", &t).await;
    let app = std::sync::Arc::new(app);
    let clients: Vec<_> = (0..64)
        .map(|_| {
            let (app, alice, t) = (app.clone(), alice.clone(), t.clone());
            tokio::spawn(async move { app.ask(&alice, &t, 1).await.status() })
        })
        .collect();
    let mut statuses = Vec::new();
    for c in clients {
        statuses.push(c.await.expect("task"));
    }
    let created = statuses.iter().filter(|s| **s == StatusCode::CREATED).count();
    let refused = statuses.iter().filter(|s| **s == StatusCode::CONFLICT).count();
    assert_eq!((created, refused), (5, 59), "{statuses:?}");
}

async fn a_retried_post_with_the_same_idempotency_key_creates_one_request(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let t = app.tenant("idem-team", json!({})).await;
    let alice = app.member("alice", &t).await;
    let body = json!({"tenant": t, "spec": {"mode": "exclusive", "model": "A100-80GB"}, "count": 1, "reason": "x"});
    let send = || {
        app.call(Method::POST, "/api/v1/requests", Some(&alice)).header("Idempotency-Key", "job-42").json(&body).send()
    };
    let first = send().await.expect("send");
    assert_eq!(first.status(), StatusCode::CREATED);
    let again = send().await.expect("send");
    assert_eq!(again.status(), StatusCode::OK);
    let (a, b): (Value, Value) = (first.json().await.expect("json"), again.json().await.expect("json"));
    assert_eq!(a["id"], b["id"]);
    // The key belongs to that request: the same key for something else is refused, not answered with the old one.
    let other = json!({"tenant": t, "spec": {"mode": "exclusive", "model": "A30-24GB"}, "count": 1, "reason": "x"});
    let r = app
        .call(Method::POST, "/api/v1/requests", Some(&alice))
        .header("Idempotency-Key", "job-42")
        .json(&other)
        .send()
        .await
        .expect("send");
    problem(r, StatusCode::UNPROCESSABLE_ENTITY, "idempotency_key_reused").await;
}

async fn small_requests_are_auto_approved_under_the_tenant_policy(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let t = app.tenant("auto", json!({"auto_approve": true, "auto_approve_max_compute_slices": 2})).await;
    let alice = app.member("alice", &t).await;
    let small: Value = app.ask(&alice, &t, 2).await.json().await.expect("json");
    assert_eq!(small["state"], "approved");
    let big: Value = app.ask(&alice, &t, 3).await.json().await.expect("json");
    assert_eq!(big["state"], "pending");
    // Auto-approval places the slices like an admin's approval does, and says who approved.
    let log: Value = app
        .call(
            Method::GET,
            &format!("/api/v1/audit?object=request/{}", small["id"].as_str().expect("id")),
            Some(&app.admin),
        )
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(
        (log[1]["action"].as_str(), log[1]["actor"].as_str()),
        (Some("request.approved"), Some("system:auto-approve"))
    );
    let held: Value = app
        .call(Method::GET, &format!("/api/v1/allocations?tenant={t}"), Some(&alice))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(held.as_array().map(Vec::len), Some(2), "two instances reserved");
    // Within the policy but beyond the fleet: it waits for an admin instead of being approved unplaced.
    let roomy = app.tenant("auto-roomy", json!({"auto_approve": true, "auto_approve_max_compute_slices": 100})).await;
    let bob = app.member("bob", &roomy).await;
    let body =
        json!({"tenant": roomy, "spec": {"mode": "mig", "profile": "7g.80gb", "model": "H100-80GB"}, "count": 3});
    let r: Value = app
        .call(Method::POST, "/api/v1/requests", Some(&bob))
        .json(&body)
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(r["state"], "pending");
    // Tenants are listed to those who may see them.
    let mine: Value =
        app.call(Method::GET, "/api/v1/tenants", Some(&bob)).send().await.expect("send").json().await.expect("json");
    assert_eq!(
        mine.as_array().map(|v| v.iter().map(|t| t["name"].clone()).collect::<Vec<_>>()),
        Some(vec![json!("auto-roomy")])
    );
    let all: Value = app
        .call(Method::GET, "/api/v1/tenants", Some(&app.admin))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(all.as_array().map(Vec::len), Some(2));
}

async fn approvals_use_if_match_so_one_of_two_admins_wins(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let t = app.tenant("approve-team", json!({})).await;
    let alice = app.member("alice", &t).await;
    let req: Value = app.ask(&alice, &t, 1).await.json().await.expect("json");
    let id = req["id"].as_str().expect("id").to_string();
    problem(
        app.call(Method::POST, &format!("/api/v1/requests/{id}/approve"), Some(&alice)).send().await.expect("send"),
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
    let approve = || {
        app.call(Method::POST, &format!("/api/v1/requests/{id}/approve"), Some(&app.admin))
            .header("If-Match", "\"v1\"")
            .send()
    };
    let (r1, r2) = tokio::join!(approve(), approve());
    let mut statuses = [r1.expect("send").status(), r2.expect("send").status()];
    statuses.sort();
    assert_eq!(statuses, [StatusCode::OK, StatusCode::CONFLICT]);
    let r = app
        .call(Method::POST, &format!("/api/v1/requests/{id}/reject"), Some(&app.admin))
        .json(&json!({"reason": "  "}))
        .send()
        .await
        .expect("send");
    problem(r, StatusCode::UNPROCESSABLE_ENTITY, "reason_required").await;
    let r = app
        .call(Method::POST, &format!("/api/v1/requests/{id}/cancel"), Some(&alice))
        .header("If-Match", "\"v2\"")
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["etag"], "\"v3\"");
    let r =
        app.call(Method::POST, &format!("/api/v1/requests/{id}/approve"), Some(&app.admin)).send().await.expect("send");
    problem(r, StatusCode::CONFLICT, "request_invalid_transition").await;
    let mallory = app.user("mallory", &[]).await.1;
    problem(
        app.call(Method::GET, &format!("/api/v1/requests/{id}"), Some(&mallory)).send().await.expect("send"),
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
}

/// `If-Match` is optional, but when sent it follows its documented pattern `^(\*|(W/)?"v(0|[1-9][0-9]{0,17})")$`
/// (no leading zeros): every other form is 400 `invalid_if_match` on every change (requests, quota requests,
/// reservations), and the object is left as it was.
async fn if_match_is_read_strictly_on_every_change(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let t = app.tenant("etag-team", json!({})).await;
    let alice = app.member("alice", &t).await;
    let lead = app.user("lead", &[(&t, Role::TenantAdmin)]).await.1;
    let request: Value = app.ask(&alice, &t, 1).await.json().await.expect("json");
    let request = request["id"].as_str().expect("id").to_string();
    let r = app
        .call(Method::POST, &format!("/api/v1/tenants/{t}/quota-requests"), Some(&lead))
        .json(&json!({"limits": {"compute_slices": 10}, "reason": "more"}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::CREATED);
    let quota_request = r.json::<Value>().await.expect("json")["id"].as_str().expect("id").to_string();
    let start = tessera_server::store::now_ms() + 86_400_000;
    let r = app
        .call(Method::POST, &format!("/api/v1/tenants/{t}/reservations"), Some(&alice))
        .json(&json!({"spec": {"mode": "mig", "profile": "1g.10gb", "model": "H100-80GB"}, "count": 1,
                      "start_ms": start, "end_ms": start + 3_600_000}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::CREATED);
    let reservation = r.json::<Value>().await.expect("json")["id"].as_str().expect("id").to_string();
    let malformed = [
        "v1",
        "\"v1",
        "v1\"",
        "\"v01\"",
        "\"v00\"",
        "\"v\"",
        "\"1\"",
        "\"V1\"",
        "W/v1",
        "w/\"v1\"",
        "\"v1\", \"v2\"",
        "\"v-1\"",
        "\"v+1\"",
        "\"v1x\"",
        "**",
        "\"v1000000000000000000\"",
        "\"v 1\"",
    ];
    let (reject, grant) = (json!({"reason": "no"}), json!({}));
    let changes: Vec<(String, &str, Option<&Value>)> = vec![
        (format!("/api/v1/requests/{request}/cancel"), alice.as_str(), None),
        (format!("/api/v1/requests/{request}/approve"), app.admin.as_str(), None),
        (format!("/api/v1/requests/{request}/reject"), app.admin.as_str(), Some(&reject)),
        (format!("/api/v1/requests/{request}/release"), alice.as_str(), None),
        (format!("/api/v1/quota-requests/{quota_request}/cancel"), lead.as_str(), None),
        (format!("/api/v1/quota-requests/{quota_request}/approve"), app.admin.as_str(), Some(&grant)),
        (format!("/api/v1/quota-requests/{quota_request}/reject"), app.admin.as_str(), Some(&reject)),
        (format!("/api/v1/reservations/{reservation}/cancel"), alice.as_str(), None),
        (format!("/api/v1/reservations/{reservation}/approve"), app.admin.as_str(), None),
        (format!("/api/v1/reservations/{reservation}/reject"), app.admin.as_str(), Some(&reject)),
    ];
    for (path, token, body) in &changes {
        for value in malformed {
            let mut r = app.call(Method::POST, path, Some(token)).header("If-Match", value);
            if let Some(b) = body {
                r = r.json(b);
            }
            let r = r.send().await.expect("send");
            assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{path} If-Match: {value}");
            problem(r, StatusCode::BAD_REQUEST, "invalid_if_match").await;
        }
        // Two headers, even two good ones, are one too many.
        let mut r = app.call(Method::POST, path, Some(token)).header("If-Match", "\"v1\"").header("If-Match", "\"v1\"");
        if let Some(b) = body {
            r = r.json(b);
        }
        problem(r.send().await.expect("send"), StatusCode::BAD_REQUEST, "invalid_if_match").await;
    }
    // Nothing changed; the ETag each answer gives is what cancels.
    for (path, token) in [
        (format!("/api/v1/requests/{request}"), &alice),
        (format!("/api/v1/quota-requests/{quota_request}"), &lead),
        (format!("/api/v1/reservations/{reservation}"), &alice),
    ] {
        let r = app.call(Method::GET, &path, Some(token)).send().await.expect("send");
        let etag = r.headers()["etag"].to_str().expect("etag").to_string();
        let v: Value = r.json().await.expect("json");
        assert_eq!((etag.as_str(), v["state"].as_str()), ("\"v1\"", Some("pending")), "{path}: {v}");
        let r = app
            .call(Method::POST, &format!("{path}/cancel"), Some(token))
            .header("If-Match", etag)
            .send()
            .await
            .expect("send");
        assert_eq!(r.status(), StatusCode::OK, "{path}");
        assert_eq!(r.headers()["etag"], "\"v2\"", "{path}");
    }
    // A weak tag and `*` are read too: `W/"v0"` names version 0 (a conflict here), `*` any version.
    let request: Value = app.ask(&alice, &t, 1).await.json().await.expect("json");
    let cancel = format!("/api/v1/requests/{}/cancel", request["id"].as_str().expect("id"));
    let r = app.call(Method::POST, &cancel, Some(&alice)).header("If-Match", "W/\"v0\"").send().await.expect("send");
    problem(r, StatusCode::CONFLICT, "version_conflict").await;
    let r = app.call(Method::POST, &cancel, Some(&alice)).header("If-Match", "*").send().await.expect("send");
    assert_eq!(r.status(), StatusCode::OK);
}

async fn requests_are_listed_a_page_at_a_time(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let t = app.tenant("pages", json!({})).await;
    let alice = app.member("alice", &t).await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        let r: Value = app.ask(&alice, &t, 1).await.json().await.expect("json");
        ids.push(r["id"].as_str().expect("id").to_string());
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/api/v1/requests?limit=2&cursor={c}"),
            None => "/api/v1/requests?limit=2".to_string(),
        };
        let page: Value =
            app.call(Method::GET, &path, Some(&alice)).send().await.expect("send").json().await.expect("json");
        seen.extend(page["items"].as_array().expect("items").iter().map(|i| i["id"].as_str().expect("id").to_string()));
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(seen, ids);
    // Newest first, a page at a time; live ones only, or ended ones only.
    let cancel = format!("/api/v1/requests/{}/cancel", ids[1]);
    assert_eq!(app.call(Method::POST, &cancel, Some(&alice)).send().await.expect("send").status(), StatusCode::OK);
    let list = |path: String| {
        let app = &app;
        let alice = &alice;
        async move {
            let page: Value =
                app.call(Method::GET, &path, Some(alice)).send().await.expect("send").json().await.expect("json");
            let items: Vec<String> =
                page["items"].as_array().expect("items").iter().map(|i| i["id"].as_str().expect("id").into()).collect();
            (items, page["next_cursor"].as_str().map(str::to_string))
        }
    };
    let (first, cursor) = list(format!("/api/v1/requests?tenant={t}&order=newest&limit=3")).await;
    assert_eq!(first, vec![ids[4].clone(), ids[3].clone(), ids[2].clone()]);
    let (rest, end) =
        list(format!("/api/v1/requests?tenant={t}&order=newest&limit=3&cursor={}", cursor.expect("more"))).await;
    assert_eq!((rest, end), (vec![ids[1].clone(), ids[0].clone()], None));
    let (live, _) = list(format!("/api/v1/requests?tenant={t}&open=true&order=newest")).await;
    assert_eq!(live, vec![ids[4].clone(), ids[3].clone(), ids[2].clone(), ids[0].clone()]);
    let (ended, _) = list(format!("/api/v1/requests?tenant={t}&open=false")).await;
    assert_eq!(ended, vec![ids[1].clone()]);
    let pending: Value = app
        .call(Method::GET, &format!("/api/v1/requests?tenant={t}&state=cancelled"), Some(&app.admin))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(
        pending["items"].as_array().map(|i| i.iter().map(|r| r["id"].clone()).collect::<Vec<_>>()),
        Some(vec![json!(ids[1])])
    );
    problem(
        app.call(Method::GET, "/api/v1/requests?limit=0", Some(&alice)).send().await.expect("send"),
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_limit",
    )
    .await;
}

/// Lists are served from a cache between writes; every change to a request shows in the next read, and one
/// tenant's page never reaches another's members.
async fn listed_pages_show_every_change_at_once(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let t = app.tenant("fresh", json!({})).await;
    let other = app.tenant("other", json!({})).await;
    let alice = app.member("alice", &t).await;
    let bob = app.member("bob", &other).await;
    let list = |token: String, query: String| {
        let call = app.call(Method::GET, &format!("/api/v1/requests?{query}"), Some(&token));
        async move {
            let page: Value = call.send().await.expect("send").json().await.expect("json");
            page["items"]
                .as_array()
                .expect("items")
                .iter()
                .map(|i| (i["id"].clone(), i["state"].clone()))
                .collect::<Vec<_>>()
        }
    };
    assert!(list(alice.clone(), String::new()).await.is_empty());
    assert!(list(alice.clone(), String::new()).await.is_empty(), "a second read, from the cache");
    let r: Value = app.ask(&alice, &t, 1).await.json().await.expect("json");
    let id = r["id"].clone();
    assert_eq!(list(alice.clone(), String::new()).await, vec![(id.clone(), json!("pending"))]);
    let pending = format!("tenant={t}&state=pending");
    assert_eq!(list(app.admin.clone(), pending.clone()).await.len(), 1);
    let cancel = app.call(Method::POST, &format!("/api/v1/requests/{}/cancel", id.as_str().expect("id")), Some(&alice));
    assert_eq!(cancel.send().await.expect("send").status(), StatusCode::OK);
    assert_eq!(list(alice.clone(), String::new()).await, vec![(id, json!("cancelled"))]);
    assert!(list(app.admin.clone(), pending).await.is_empty());
    // The same query string from a member of another tenant names that tenant's requests, not the cached page.
    assert!(list(bob, String::new()).await.is_empty());
}

async fn malformed_and_oversized_bodies_are_problems_not_panics(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let post = |body: String| {
        app.call(Method::POST, "/api/v1/tenants", Some(&app.admin))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    problem(post("{not json".into()).await.expect("send"), StatusCode::BAD_REQUEST, "invalid_body").await;
    problem(
        post(r#"{"name": "x", "colour": "red"}"#.into()).await.expect("send"),
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_body",
    )
    .await;
    // Refused by its Content-Length before any of it is read: the answer comes while the body is still unsent
    // (a client that goes on writing may see the connection reset instead, which is why none is sent here).
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(app.base.trim_start_matches("http://")).await.expect("connect");
    let head = format!(
        "POST /api/v1/tenants HTTP/1.1\r\nhost: tessera\r\nauthorization: Bearer {}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        app.admin,
        2 * 1024 * 1024
    );
    socket.write_all(head.as_bytes()).await.expect("write");
    let mut answer = Vec::new();
    let read = async {
        let mut chunk = [0u8; 4096];
        while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = socket.read(&mut chunk).await.expect("read");
            assert!(n > 0, "closed without an answer");
            answer.extend_from_slice(&chunk[..n]);
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), read).await.expect("an answer before the body");
    let answer = String::from_utf8_lossy(&answer).to_ascii_lowercase();
    assert!(answer.starts_with("http/1.1 413"), "{answer}");
    assert!(answer.contains("content-type: application/problem+json"), "{answer}");
}

async fn nodes_are_checked_against_the_catalog_and_the_mig_rules(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let nodes: Value = app
        .call(Method::GET, "/api/v1/nodes", Some(&app.admin))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(nodes.as_array().map(Vec::len), Some(1), "the --demo node");
    assert_eq!(nodes[0]["gpus"].as_array().map(Vec::len), Some(4));
    let register = |body: Value| app.call(Method::POST, "/api/v1/nodes", Some(&app.admin)).json(&body).send();
    let gpu = |model: &str, mig: bool, instances: Value| json!({"index": 0, "uuid": "GPU-x", "model": model, "mig_enabled": mig, "instances": instances});
    problem(
        register(json!({"name": "n1", "gpus": [gpu("Tesla T4", true, json!([]))]})).await.expect("send"),
        StatusCode::UNPROCESSABLE_ENTITY,
        "unknown_gpu_model",
    )
    .await;
    let body = problem(
        register(json!({"name": "n1", "gpus": [gpu("NVIDIA H100 80GB HBM3", true, json!([{"profile": "3g.40gb", "start": 2}]))]})).await.expect("send"),
        StatusCode::UNPROCESSABLE_ENTITY,
        "mig_layout_invalid",
    )
    .await;
    assert!(body["detail"].as_str().is_some_and(|d| d.contains("allowed starts are 0, 4")), "{body}");
    problem(
        register(json!({"name": "n1", "gpus": [gpu("A30-24GB", false, json!([{"profile": "4g.24gb", "start": 0}]))]}))
            .await
            .expect("send"),
        StatusCode::UNPROCESSABLE_ENTITY,
        "mig_disabled",
    )
    .await;
    let dup_uuid = json!({"name": "n1", "gpus": [{"index": 0, "uuid": nodes[0]["gpus"][0]["uuid"], "model": "A30-24GB", "mig_enabled": false}]});
    problem(register(dup_uuid).await.expect("send"), StatusCode::CONFLICT, "already_exists").await;
    let ok =
        register(json!({"name": "n1", "gpus": [gpu("0x233010DE", true, json!([{"profile": "1g.10gb", "start": 6}]))]}))
            .await
            .expect("send");
    assert_eq!(ok.status(), StatusCode::CREATED);
    let node: Value = ok.json().await.expect("json");
    assert_eq!(
        (node["gpus"][0]["model"].as_str(), node["gpus"][0]["layout"][0]["start"].as_u64()),
        (Some("H100-80GB"), Some(6))
    );
    let alice = app.user("alice", &[]).await.1;
    problem(
        app.call(Method::GET, "/api/v1/nodes", Some(&alice)).send().await.expect("send"),
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
}

async fn approvers_see_where_the_planner_would_place_a_request(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let t = app.tenant("plan-team", json!({})).await;
    let alice = app.member("alice", &t).await;
    let req: Value = app.ask(&alice, &t, 2).await.json().await.expect("json");
    let path = format!("/api/v1/requests/{}/placement", req["id"].as_str().expect("id"));
    let plan: Value =
        app.call(Method::GET, &path, Some(&app.admin)).send().await.expect("send").json().await.expect("json");
    // demo-node-1/1 holds a free 1g.10gb at unit 6: it is handed out, and the second slice joins it there.
    assert_eq!(plan["summary"]["placed"], 2, "{plan}");
    assert!(
        plan["placed"]
            .as_array()
            .expect("placed")
            .iter()
            .any(|s| s["gpu"] == "demo-node-1/1" && s["start"] == 6 && s["new"] == false),
        "{plan}"
    );
    assert_eq!(plan["changed_gpus"].as_array().map(Vec::len), Some(1));
    // With both H100s cordoned there is nowhere to go, and the plan says why.
    let nodes: Value = app
        .call(Method::GET, "/api/v1/nodes", Some(&app.admin))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    for g in nodes[0]["gpus"].as_array().expect("gpus").iter().filter(|g| g["model"] == "H100-80GB") {
        let r = app
            .call(Method::POST, &format!("/api/v1/gpus/{}/cordon", g["id"].as_str().expect("id")), Some(&app.admin))
            .send()
            .await
            .expect("send");
        assert_eq!(r.status(), StatusCode::OK);
    }
    let plan: Value =
        app.call(Method::GET, &path, Some(&app.admin)).send().await.expect("send").json().await.expect("json");
    assert_eq!(plan["unplaced"][0]["code"], "all_matching_gpus_cordoned", "{plan}");
    // Plans show the fleet: members of the tenant may not see them.
    problem(app.call(Method::GET, &path, Some(&alice)).send().await.expect("send"), StatusCode::FORBIDDEN, "forbidden")
        .await;
    let whole: Value = app
        .call(Method::POST, "/api/v1/requests", Some(&alice))
        .json(&json!({"tenant": t, "spec": {"mode": "exclusive", "model": "A30-24GB"}, "count": 1}))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    let r = app
        .call(
            Method::GET,
            &format!("/api/v1/requests/{}/placement", whole["id"].as_str().expect("id")),
            Some(&app.admin),
        )
        .send()
        .await
        .expect("send");
    problem(r, StatusCode::UNPROCESSABLE_ENTITY, "placement_not_planned").await;
}

async fn approval_places_slices_and_layout_changes_wait_for_an_admin(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let t = app.tenant("flow", json!({})).await;
    app.quota(&t, json!({"compute_slices": 100})).await;
    let alice = app.member("alice", &t).await;
    let ask = |profile: &str, model: &str, count: u32| {
        let body = json!({"tenant": t, "spec": {"mode": "mig", "profile": profile, "model": model}, "count": count});
        app.call(Method::POST, "/api/v1/requests", Some(&alice)).json(&body).send()
    };
    let approve =
        |id: String| app.call(Method::POST, &format!("/api/v1/requests/{id}/approve"), Some(&app.admin)).send();
    let id_of = |v: &Value| v["id"].as_str().expect("id").to_string();
    let nodes: Value = app
        .call(Method::GET, "/api/v1/nodes", Some(&app.admin))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    let gpu_id = |i: usize| nodes[0]["gpus"][i]["id"].as_str().expect("gpu id").to_string();

    // A 4g needs a new instance: the empty H100 (gpu 0) gets a proposal; the slice is reserved on it.
    let big: Value = ask("4g.40gb", "H100-80GB", 1).await.expect("send").json().await.expect("json");
    let r = approve(id_of(&big)).await.expect("send");
    assert_eq!(r.status(), StatusCode::OK);
    let approval: Value = r.json().await.expect("json");
    assert_eq!(approval["request"]["state"], "approved");
    assert_eq!(approval["reservations"], json!([{"gpu": gpu_id(0), "profile": "4g.40gb", "start": 0, "new": true}]));
    assert_eq!(approval["layout_proposals"][0]["state"], "proposed");
    let proposal = approval["layout_proposals"][0]["id"].as_str().expect("id").to_string();

    // While gpu 0 has an open proposal it takes nothing new: a 2g goes to gpu 1's free units, proposed there.
    let small: Value = ask("2g.20gb", "H100-80GB", 1).await.expect("send").json().await.expect("json");
    let approval: Value = approve(id_of(&small)).await.expect("send").json().await.expect("json");
    assert_eq!(approval["reservations"][0]["gpu"], gpu_id(1), "{approval}");
    let second = approval["layout_proposals"][0]["id"].as_str().expect("id").to_string();
    let open: Value = app
        .call(Method::GET, "/api/v1/layouts?state=proposed", Some(&app.admin))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(open.as_array().map(Vec::len), Some(2));

    // Approving the first applies it; rejecting the second fails the request that waited for it.
    let r = app
        .call(Method::POST, &format!("/api/v1/layouts/{proposal}/approve"), Some(&app.admin))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::OK);
    let nodes: Value = app
        .call(Method::GET, "/api/v1/nodes", Some(&app.admin))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(
        (nodes[0]["gpus"][0]["layout"].clone(), nodes[0]["gpus"][0]["layout_version"].clone()),
        (json!([{"profile": "4g.40gb", "start": 0}]), json!(2))
    );
    let r = app
        .call(Method::POST, &format!("/api/v1/layouts/{second}/reject"), Some(&app.admin))
        .json(&json!({"reason": ""}))
        .send()
        .await
        .expect("send");
    problem(r, StatusCode::UNPROCESSABLE_ENTITY, "reason_required").await;
    let r = app
        .call(Method::POST, &format!("/api/v1/layouts/{second}/reject"), Some(&app.admin))
        .json(&json!({"reason": "maintenance"}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::OK);
    let failed: Value = app
        .call(Method::GET, &format!("/api/v1/requests/{}", id_of(&small)), Some(&alice))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(failed["state"], "failed");
    assert!(failed["reason"].as_str().is_some_and(|r| r.contains("maintenance")));

    // On a GPU with auto-layout the change applies at once.
    let r = app
        .call(Method::PUT, &format!("/api/v1/gpus/{}/auto-layout", gpu_id(2)), Some(&app.admin))
        .json(&json!({"enabled": true}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::OK);
    let a100: Value = ask("3g.20gb", "A100-40GB", 1).await.expect("send").json().await.expect("json");
    let approval: Value = approve(id_of(&a100)).await.expect("send").json().await.expect("json");
    assert_eq!(
        (approval["layout_proposals"][0]["state"].as_str(), approval["layout_proposals"][0]["decided_by"].as_str()),
        (Some("approved"), Some("auto-layout"))
    );
    let nodes: Value = app
        .call(Method::GET, "/api/v1/nodes", Some(&app.admin))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(nodes[0]["gpus"][2]["layout"].as_array().map(Vec::len), Some(1));

    // More than the fleet holds: refused with the planner's reason, the request stays pending.
    let huge: Value = ask("7g.80gb", "H100-80GB", 3).await.expect("send").json().await.expect("json");
    let body = problem(approve(id_of(&huge)).await.expect("send"), StatusCode::CONFLICT, "no_capacity").await;
    assert!(body["detail"].as_str().is_some_and(|d| d.contains("7g.80gb")), "{body}");
    let still: Value = app
        .call(Method::GET, &format!("/api/v1/requests/{}", id_of(&huge)), Some(&alice))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(still["state"], "pending");
}

async fn users_members_and_tokens_are_managed_with_their_roles(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let t = app.tenant("people", json!({})).await;
    let r = app
        .call(Method::POST, "/api/v1/users", Some(&app.admin))
        .json(&json!({"name": "carol"}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::CREATED);
    let carol: Value = r.json().await.expect("json");
    let carol_id = carol["id"].as_str().expect("id").to_string();
    problem(
        app.call(Method::POST, "/api/v1/users", Some(&app.admin))
            .json(&json!({"name": "carol"}))
            .send()
            .await
            .expect("send"),
        StatusCode::CONFLICT,
        "already_exists",
    )
    .await;
    // A plain member cannot add members; a tenant admin can, for their own tenant only.
    let member = app.member("mo", &t).await;
    let put = |token: &str, tenant: &str, role: &str| {
        app.call(Method::PUT, &format!("/api/v1/tenants/{tenant}/members/{carol_id}"), Some(token))
            .json(&json!({"role": role}))
            .send()
    };
    problem(put(&member, &t, "member").await.expect("send"), StatusCode::FORBIDDEN, "forbidden").await;
    let lead = app.user("lead", &[]).await.1;
    let lead_id = app.store.user_by_name("lead").await.expect("lead").id;
    app.store.set_membership(&lead_id, &t, Role::TenantAdmin, "test").await.expect("promote");
    assert_eq!(put(&lead, &t, "member").await.expect("send").status(), StatusCode::NO_CONTENT);
    let members: Value = app
        .call(Method::GET, &format!("/api/v1/tenants/{t}/members"), Some(&member))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    let names: Vec<(String, String)> = members
        .as_array()
        .expect("members")
        .iter()
        .map(|m| (m["name"].as_str().unwrap_or("").to_string(), m["role"].as_str().unwrap_or("").to_string()))
        .collect();
    assert_eq!(
        names,
        [("carol", "member"), ("lead", "tenant-admin"), ("mo", "member")].map(|(a, b)| (a.to_string(), b.to_string()))
    );
    let other = app.tenant("other-people", json!({})).await;
    problem(put(&lead, &other, "member").await.expect("send"), StatusCode::NOT_FOUND, "not_found").await;

    // Tokens: the secret is returned once and works; revoked, it stops working; others' tokens are not found.
    let r = app
        .call(Method::POST, "/api/v1/tokens", Some(&member))
        .json(&json!({"name": "ci"}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::CREATED);
    let token: Value = r.json().await.expect("json");
    let secret = token["secret"].as_str().expect("secret").to_string();
    assert!(secret.starts_with("tsr_"));
    let me = app.call(Method::GET, &format!("/api/v1/tenants/{t}"), Some(&secret)).send().await.expect("send");
    assert_eq!(me.status(), StatusCode::OK);
    let revoke = |by: &str| {
        app.call(Method::POST, &format!("/api/v1/tokens/{}/revoke", token["id"].as_str().expect("id")), Some(by)).send()
    };
    problem(revoke(&lead).await.expect("send"), StatusCode::NOT_FOUND, "not_found").await;
    assert_eq!(revoke(&member).await.expect("send").status(), StatusCode::NO_CONTENT);
    problem(
        app.call(Method::GET, &format!("/api/v1/tenants/{t}"), Some(&secret)).send().await.expect("send"),
        StatusCode::UNAUTHORIZED,
        "invalid_token",
    )
    .await;

    // Every change is in the audit log, for admins only.
    let log: Value = app
        .call(Method::GET, &format!("/api/v1/audit?object=tenant/{t}/member/{carol_id}"), Some(&app.admin))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(log[0]["action"], "membership.set");
    assert_eq!(log[0]["actor"], "user:lead");
    problem(
        app.call(Method::GET, &format!("/api/v1/audit?object=tenant/{t}"), Some(&member)).send().await.expect("send"),
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
}

async fn layouts_are_validated_with_the_core_rules(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let check = |model: &str, instances: Value| {
        app.call(Method::POST, &format!("/api/v1/catalog/models/{model}/validate"), Some(&app.admin))
            .json(&json!({"instances": instances}))
            .send()
    };
    let ok: Value = check("H100-80GB", json!([{"profile": "3g.40gb", "start": 4}, {"profile": "1g.10gb"}]))
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(ok["valid"], true);
    assert_eq!(ok["instances"][1]["profile"], "1g.10gb");
    let bad: Value =
        check("A30-24GB", json!([{"profile": "1g.6gb+me", "start": 0}, {"profile": "2g.12gb+me", "start": 2}]))
            .await
            .expect("send")
            .json()
            .await
            .expect("json");
    assert_eq!(bad["valid"], false);
    assert_eq!(bad["errors"][0]["code"], "mig_engines_exceeded");
    problem(check("T4", json!([])).await.expect("send"), StatusCode::NOT_FOUND, "not_found").await;
}

async fn hand_edited_layouts_keep_instances_in_use_and_tenants_see_their_allocations(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let t = app.tenant("edit", json!({})).await;
    let alice = app.member("alice", &t).await;
    // The request takes demo-node-1/1's free 1g.10gb at unit 6.
    let req: Value = app.ask(&alice, &t, 1).await.json().await.expect("json");
    let r = app
        .call(Method::POST, &format!("/api/v1/requests/{}/approve", req["id"].as_str().expect("id")), Some(&app.admin))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::OK);
    let allocations: Value = app
        .call(Method::GET, &format!("/api/v1/allocations?tenant={t}"), Some(&alice))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(allocations[0]["node"], "demo-node-1");
    assert_eq!((allocations[0]["gpu_index"].as_u64(), allocations[0]["start"].as_u64()), (Some(1), Some(6)));
    assert_eq!(allocations[0]["k8s_resource"], "nvidia.com/mig-1g.10gb");
    assert_eq!(allocations[0]["waiting_for_layout"], false);
    let mallory = app.user("mallory", &[]).await.1;
    problem(
        app.call(Method::GET, &format!("/api/v1/allocations?tenant={t}"), Some(&mallory)).send().await.expect("send"),
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;

    let nodes: Value = app
        .call(Method::GET, "/api/v1/nodes", Some(&app.admin))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    let gpu = nodes[0]["gpus"][1]["id"].as_str().expect("id").to_string();
    let edit = |instances: Value| {
        app.call(Method::PUT, &format!("/api/v1/gpus/{gpu}/layout"), Some(&app.admin))
            .json(&json!({"instances": instances}))
            .send()
    };
    problem(
        edit(json!([{"profile": "3g.40gb", "start": 0}, {"profile": "1g.10gb", "start": 6}])).await.expect("send"),
        StatusCode::UNPROCESSABLE_ENTITY,
        "layout_unchanged",
    )
    .await;
    let body = problem(
        edit(json!([{"profile": "7g.80gb", "start": 0}])).await.expect("send"),
        StatusCode::CONFLICT,
        "instance_in_use",
    )
    .await;
    assert!(body["detail"].as_str().is_some_and(|d| d.contains("1g.10gb@6")), "{body}");
    problem(
        edit(json!([{"profile": "3g.40gb", "start": 2}])).await.expect("send"),
        StatusCode::UNPROCESSABLE_ENTITY,
        "mig_layout_invalid",
    )
    .await;
    let r =
        edit(json!([{"profile": "3g.40gb", "start": 0}, {"profile": "2g.20gb"}, {"profile": "1g.10gb", "start": 6}]))
            .await
            .expect("send");
    assert_eq!(r.status(), StatusCode::CREATED);
    let proposal: Value = r.json().await.expect("json");
    assert_eq!(
        (proposal["state"].as_str(), proposal["created"].clone()),
        (Some("proposed"), json!([{"profile": "2g.20gb", "start": 4}]))
    );
    problem(
        edit(json!([{"profile": "1g.10gb", "start": 6}])).await.expect("send"),
        StatusCode::CONFLICT,
        "layout_proposal_open",
    )
    .await;
    let got: Value = app
        .call(Method::GET, &format!("/api/v1/layouts/{}", proposal["id"].as_str().expect("id")), Some(&app.admin))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(got["id"], proposal["id"]);
}

async fn whole_gpu_slices_are_placed_on_gpus_shared_the_same_way(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let t = app.tenant("whole", json!({})).await;
    let alice = app.member("alice", &t).await;
    let ask = |spec: Value, count: u32| {
        app.call(Method::POST, "/api/v1/requests", Some(&alice))
            .json(&json!({"tenant": t, "spec": spec, "count": count}))
            .send()
    };
    let approve = |id: &str| app.call(Method::POST, &format!("/api/v1/requests/{id}/approve"), Some(&app.admin)).send();
    let id = |v: &Value| v["id"].as_str().expect("id").to_string();
    // The demo's A30 is not in MIG mode: three quarter-shares of it go there.
    let shares: Value = ask(json!({"mode": "timeslice", "model": "A30-24GB", "replicas": 4}), 3)
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    let approval: Value = approve(&id(&shares)).await.expect("send").json().await.expect("json");
    let starts: Vec<u64> =
        approval["reservations"].as_array().expect("reservations").iter().filter_map(|r| r["start"].as_u64()).collect();
    assert_eq!(starts, vec![0, 1, 2], "{approval}");
    assert_eq!(approval["reservations"][0]["profile"], "timeslice:4");
    // One share is left; exclusive use, MPS, or another time-slice split cannot have the GPU; two more shares do not fit.
    for (spec, count) in [
        (json!({"mode": "exclusive", "model": "A30-24GB"}), 1),
        (json!({"mode": "mps", "model": "A30-24GB", "replicas": 2}), 1),
        (json!({"mode": "timeslice", "model": "A30-24GB", "replicas": 2}), 1),
        (json!({"mode": "timeslice", "model": "A30-24GB", "replicas": 4}), 2),
    ] {
        let r: Value = ask(spec.clone(), count).await.expect("send").json().await.expect("json");
        problem(approve(&id(&r)).await.expect("send"), StatusCode::CONFLICT, "no_capacity").await;
    }
    let last: Value = ask(json!({"mode": "timeslice", "model": "A30-24GB", "replicas": 4}), 1)
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(approve(&id(&last)).await.expect("send").status(), StatusCode::OK);
    let held: Value = app
        .call(Method::GET, &format!("/api/v1/allocations?tenant={t}"), Some(&alice))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(held.as_array().map(Vec::len), Some(4));
    assert!(
        held.as_array()
            .expect("held")
            .iter()
            .all(|a| a["k8s_resource"] == "nvidia.com/gpu" && a["waiting_for_layout"] == false)
    );
    // Released shares make room again.
    let r = app
        .call(Method::POST, &format!("/api/v1/requests/{}/cancel", id(&shares)), Some(&alice))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::OK);
    let again: Value = ask(json!({"mode": "timeslice", "model": "A30-24GB", "replicas": 4}), 3)
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(approve(&id(&again)).await.expect("send").status(), StatusCode::OK);
}

async fn the_request_commands_drive_the_api_from_scripts(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let t = app.tenant("cli", json!({})).await;
    let alice = app.member("alice", &t).await;
    let run = |token: String, args: Vec<String>| {
        let base = app.base.clone();
        tokio::task::spawn_blocking(move || {
            let o = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
                .arg("request")
                .args(&args)
                .env("TESSERA_SERVER", base)
                .env("TESSERA_TOKEN", token)
                .output()
                .expect("run tessera");
            (o.status.code(), String::from_utf8_lossy(&o.stdout).into_owned())
        })
    };
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let (code, out) = run(
        alice.clone(),
        args(&[
            "create",
            "--tenant",
            &t,
            "--profile",
            "1g.10gb",
            "--model",
            "H100-80GB",
            "--count",
            "2",
            "--idempotency-key",
            "nightly-1",
        ]),
    )
    .await
    .expect("join");
    assert_eq!(code, Some(0), "{out}");
    let created: Value = serde_json::from_str(&out).expect("json");
    let id = created["id"].as_str().expect("id").to_string();
    let (_, out) = run(alice.clone(), args(&["list", "--tenant", &t])).await.expect("join");
    assert_eq!(serde_json::from_str::<Value>(&out).expect("json").as_array().map(Vec::len), Some(1));
    let (code, out) = run(alice.clone(), args(&["approve", &id])).await.expect("join");
    assert_eq!((code, out.lines().next()), (Some(1), Some("error[forbidden]: platform admins only")));
    let (code, out) = run(app.admin.clone(), args(&["approve", &id])).await.expect("join");
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(serde_json::from_str::<Value>(&out).expect("json")["request"]["state"], "approved");
    let (code, out) =
        run(alice.clone(), args(&["create", "--tenant", &t, "--mode", "timeslice", "--model", "A30-24GB"]))
            .await
            .expect("join");
    assert_eq!(code, Some(2), "{out}");
}

async fn time_slicing_and_mps_never_share_a_node(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let nodes: Value = app
        .call(Method::GET, "/api/v1/nodes", Some(&app.admin))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    let demo_a30 = nodes[0]["gpus"][3]["id"].as_str().expect("id").to_string();
    let r = app
        .call(Method::POST, &format!("/api/v1/gpus/{demo_a30}/cordon"), Some(&app.admin))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::OK);
    let a30 = |i: u32| json!({"index": i, "uuid": format!("GPU-a30-{i}"), "model": "A30-24GB", "mig_enabled": false});
    let r = app
        .call(Method::POST, "/api/v1/nodes", Some(&app.admin))
        .json(&json!({"name": "twin", "gpus": [a30(0), a30(1)]}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::CREATED);
    let t = app.tenant("mixers", json!({})).await;
    let alice = app.member("alice", &t).await;
    let ask = |spec: Value| {
        app.call(Method::POST, "/api/v1/requests", Some(&alice))
            .json(&json!({"tenant": t, "spec": spec, "count": 1}))
            .send()
    };
    let approve =
        |id: String| app.call(Method::POST, &format!("/api/v1/requests/{id}/approve"), Some(&app.admin)).send();
    let ts: Value = ask(json!({"mode": "timeslice", "model": "A30-24GB", "replicas": 2}))
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(approve(ts["id"].as_str().expect("id").to_string()).await.expect("send").status(), StatusCode::OK);
    // The twin's other A30 is free, but MPS beside time-slicing on one node is what the device plugin cannot do.
    let mps: Value = ask(json!({"mode": "mps", "model": "A30-24GB", "replicas": 2}))
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    problem(
        approve(mps["id"].as_str().expect("id").to_string()).await.expect("send"),
        StatusCode::CONFLICT,
        "no_capacity",
    )
    .await;
    // Exclusive use of that other A30 is fine.
    let whole: Value =
        ask(json!({"mode": "exclusive", "model": "A30-24GB"})).await.expect("send").json().await.expect("json");
    assert_eq!(approve(whole["id"].as_str().expect("id").to_string()).await.expect("send").status(), StatusCode::OK);
}

async fn the_api_reference_is_served_without_any_outside_asset(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let r = app.call(Method::GET, "/api/docs", None).send().await.expect("send");
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers()["content-type"].to_str().expect("type").starts_with("text/html"));
    let page = r.text().await.expect("text");
    for needle in [
        "<span class=\"m post\">POST</span> <code>/api/v1/requests</code>",
        "id=\"schema-RequestView\"",
        "quota_exceeded",
    ] {
        assert!(page.contains(needle), "missing {needle}");
    }
    for outside in ["<script", "http://", "https://", "@import"] {
        assert!(!page.contains(outside), "the page loads something from outside: {outside}");
    }
    let spec: Value =
        app.call(Method::GET, "/api/openapi.json", None).send().await.expect("send").json().await.expect("json");
    assert_eq!(spec, serde_json::to_value(tessera_server::http::openapi()).expect("json"));
}

#[test]
fn the_checked_in_openapi_matches_the_code() {
    let generated = tessera_server::http::openapi().to_pretty_json().expect("json");
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../openapi/openapi.json");
    let checked_in = std::fs::read_to_string(path).expect("openapi/openapi.json");
    assert!(
        checked_in.trim_end() == generated.trim_end(),
        "openapi/openapi.json is out of date: run `cargo run --bin tessera -- openapi > openapi/openapi.json`"
    );
}

async fn portal_pages_are_rendered_on_the_server_with_what_the_viewer_may_see(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let page = |token: Option<&str>, path: &'static str| {
        let r = app.call(Method::GET, path, token);
        async move {
            let resp = r.send().await.expect("send");
            assert_eq!(resp.status(), StatusCode::OK, "{path}");
            assert!(resp.headers()["content-type"].to_str().unwrap_or("").starts_with("text/html"), "{path}");
            resp.text().await.expect("html")
        }
    };
    // The admin sees the demo node, its GPUs and generations in the HTML itself (no script needed).
    let html = page(Some(&app.admin), "/fleet").await;
    assert!(html.contains("data-node=\"demo-node-1\""), "{html}");
    assert!(html.contains("H100-80GB") && html.contains("(its agent has applied 0)"), "{html}");
    // Per GPU what is held and what is free, in words.
    assert!(html.contains(">0 of 7 compute slices held") && html.contains("free: 3g.40gb@0, 1g.10gb@6"), "{html}");
    assert!(html.contains("/pkg/tessera.css"), "stylesheet linked");
    // A user in no tenant sees no nodes; nobody signed in is asked to sign in.
    let outsider = app.user("outsider", &[]).await.1;
    let html = page(Some(&outsider), "/fleet").await;
    assert!(!html.contains("demo-node-1"), "{html}");
    let html = page(None, "/fleet").await;
    assert!(html.contains("Sign in to see this page"), "{html}");
    let html = page(None, "/signin").await;
    assert!(html.contains("Sign in to Tessera"), "{html}");
    // The stylesheet is embedded in the binary; unknown pages are the portal's 404.
    let css = app.call(Method::GET, "/pkg/tessera.css", None).send().await.expect("css");
    assert_eq!(css.status(), StatusCode::OK);
    assert!(css.text().await.expect("css").contains("--accent"));
    // The tab icon is linked from every page and answered where browsers look for it unasked.
    assert!(html.contains("/pkg/icon.svg"), "{html}");
    for path in ["/pkg/icon.svg", "/favicon.ico"] {
        let icon = app.call(Method::GET, path, None).send().await.expect("icon");
        assert_eq!(
            (icon.status(), icon.headers()[reqwest::header::CONTENT_TYPE].to_str().ok()),
            (StatusCode::OK, Some("image/svg+xml")),
            "{path}"
        );
        assert!(icon.text().await.expect("svg").starts_with("<svg"), "{path}");
    }
    let missing = app.call(Method::GET, "/no/such/page", None).send().await.expect("404");
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
}

async fn offerings_show_any_signed_in_user_the_fleet_by_model_and_the_queue(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let tenant = app.tenant("offer-team", json!({})).await;
    let member = app.member("offer-member", &tenant).await;
    let r = app.call(Method::GET, "/api/v1/offerings", Some(&member)).send().await.expect("send");
    assert_eq!(r.status(), StatusCode::OK);
    let body: Value = r.json().await.expect("json");
    let model = |key: &str| body["models"].as_array().and_then(|m| m.iter().find(|o| o["model"] == key)).cloned();
    // The demo node: two H100s and an A100-40GB in MIG mode, an A30 without.
    let h100 = model("H100-80GB").expect("H100 offered");
    assert_eq!(
        (h100["gpus"].as_u64(), h100["mig_gpus"].as_u64(), h100["whole_gpus"].as_u64()),
        (Some(2), Some(2), Some(0))
    );
    assert!(h100["profiles"].as_array().is_some_and(|p| p.iter().any(|p| p == "3g.40gb")), "{h100}");
    let a30 = model("A30-24GB").expect("A30 offered");
    assert_eq!((a30["mig_gpus"].as_u64(), a30["whole_gpus"].as_u64()), (Some(0), Some(1)));
    assert_eq!(body["pending_requests"], 0);
    // A request waiting for an admin shows in the queue; nobody signed in sees nothing.
    assert_eq!(app.ask(&member, &tenant, 1).await.status(), StatusCode::CREATED);
    let body: Value = app
        .call(Method::GET, "/api/v1/offerings", Some(&member))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(body["pending_requests"], 1);
    assert!(body["oldest_pending_ms"].as_i64().is_some_and(|t| t > 0), "{body}");
    problem(
        app.call(Method::GET, "/api/v1/offerings", None).send().await.expect("send"),
        StatusCode::UNAUTHORIZED,
        "unauthenticated",
    )
    .await;
}

async fn the_tenant_dashboard_and_approvals_are_rendered_for_who_may_see_them(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let tenant = app.tenant("dash-team", json!({})).await;
    assert_eq!(app.quota(&tenant, json!({"compute_slices": 14})).await.status(), StatusCode::OK);
    let member = app.member("dash-member", &tenant).await;
    assert_eq!(app.ask(&member, &tenant, 2).await.status(), StatusCode::CREATED);
    let html = |token: String, path: String| {
        let r = app.call(Method::GET, &path, Some(&token));
        async move { r.send().await.expect("send").text().await.expect("html") }
    };
    // The member's dashboard: the quota bar with 2 compute slices pending of 14, the pending request, the form.
    let page = html(member.clone(), format!("/t/{tenant}")).await;
    assert!(page.contains("dash-team"), "{page}");
    assert!(page.contains("0 of 14 slices used · 2 pending"), "{page}");
    let unlimited = page.split("data-resource=\"mig/H100-80GB/1g.10gb\"").nth(1).and_then(|s| s.split("</li>").next());
    assert!(
        unlimited
            .is_some_and(|li| li.contains("0 instances used · 2 pending · no limit") && !li.contains("class=\"bar\"")),
        "an unlimited resource has its use in words and no bar: {page}"
    );
    assert!(page.contains("2 × MIG 1g.10gb on H100-80GB") && page.contains("data-state=\"pending\""), "{page}");
    assert!(page.contains("data-testid=\"request-form\""), "{page}");
    // Another tenant's member gets the API's 404 in the page, not the data.
    let other = app.tenant("dash-other", json!({})).await;
    let outsider = app.member("dash-outsider", &other).await;
    let page = html(outsider.clone(), format!("/t/{tenant}")).await;
    assert!(!page.contains("dash-team") && page.contains("not_found"), "{page}");
    // Approvals: the admin sees the request with the planner's placement; a member is refused.
    let page = html(app.admin.clone(), "/approvals".into()).await;
    assert!(page.contains("dash-team") && page.contains("1g.10gb@"), "{page}");
    let page = html(member, "/approvals".into()).await;
    assert!(page.contains("forbidden") && !page.contains("1g.10gb@"), "{page}");
}

/// Hundreds of page renders at once, as the admin (every page reads several resources in nested `<Suspense>`):
/// each arrives whole, in time. Leptos' streaming renderer stalls a render now and then under such load; the
/// server renders a page whole and tries again when a render stalls (`portal::whole_pages`).
async fn pages_arrive_whole_under_load(db: &TestDb) {
    use futures_util::StreamExt;
    let app = TestApp::on(db).start().await;
    let t = app.tenant("load-team", json!({})).await;
    let pages =
        ["/fleet".to_string(), "/".to_string(), "/approvals".to_string(), format!("/t/{t}"), "/admin/tenants".into()];
    let started = std::time::Instant::now();
    let mut calls = Vec::new();
    for i in 0..200 {
        let path = pages[i % pages.len()].clone();
        let r = app.call(Method::GET, &path, Some(&app.admin));
        calls.push(async move {
            let resp = tokio::time::timeout(std::time::Duration::from_secs(40), r.send()).await;
            let resp = resp.unwrap_or_else(|_| panic!("{path}: no answer in 40 s")).expect("send");
            let status = resp.status();
            let html = tokio::time::timeout(std::time::Duration::from_secs(40), resp.text()).await;
            let html = html.unwrap_or_else(|_| panic!("{path}: the body never ended")).expect("html");
            (path, status, html)
        });
    }
    let mut done = futures_util::stream::iter(calls).buffer_unordered(24);
    let mut n = 0;
    while let Some((path, status, html)) = done.next().await {
        assert_eq!(status, StatusCode::OK, "{path}: {html}");
        assert!(html.contains("</html>"), "{path}: the page arrived whole");
        n += 1;
    }
    assert_eq!(n, 200);
    assert!(started.elapsed() < std::time::Duration::from_secs(120), "{:?}", started.elapsed());
}

/// The browser half must have been compiled with the server's view setting (Leptos's `erase_components`, see
/// `.cargo/config.toml`): a site whose `views` file says otherwise, or says nothing, is refused with a message that
/// says how to rebuild; a matching one is served.
#[test]
fn a_browser_half_compiled_with_other_views_is_refused() {
    let dir = std::env::temp_dir().join(format!("tessera-site-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("tessera.js"), "export default function(){}").expect("js");
    std::fs::write(dir.join("tessera_bg.wasm"), b"\0asm\x01\0\0\0").expect("wasm");
    let here = if cfg!(erase_components) { "erased" } else { "typed" };
    let other = if here == "erased" { "typed" } else { "erased" };
    let unrecorded = tessera_portal::Site::load(&dir).expect_err("no views file");
    assert!(unrecorded.contains("unrecorded views") && unrecorded.contains("cargo xtask site"), "{unrecorded}");
    std::fs::write(dir.join("views"), format!("{other}\n")).expect("views");
    let refused = tessera_portal::Site::load(&dir).expect_err("other views");
    assert!(refused.contains(&format!("built with {other} views and this server renders {here} views")), "{refused}");
    std::fs::write(dir.join("views"), format!("{here}\n")).expect("views");
    let site = tessera_portal::Site::load(&dir).expect("readable").expect("a site");
    assert_eq!(site.size(), "export default function(){}".len() + 8);
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

/// The browser half is served under names that carry its hash, `immutable`, in the stored form the request accepts
/// (brotli, then gzip, then plain, each as `cargo xtask site` left it, never compressed again); the names without
/// the hash and the stylesheet are revalidated by `ETag` (304 while unchanged).
#[tokio::test]
async fn the_browser_half_is_served_as_stored_under_hashed_names() {
    use std::io::Read;
    let dir = std::env::temp_dir().join(format!("tessera-site-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir).expect("dir");
    let wasm: Vec<u8> = b"\0asm\x01\0\0\0".iter().copied().chain((0..4000u32).map(|i| (i % 7) as u8)).collect();
    std::fs::write(dir.join("tessera.js"), "export default function(){}").expect("js");
    std::fs::write(dir.join("tessera_bg.wasm"), &wasm).expect("wasm");
    // Stand-ins for the stored forms: the server sends them as they are, so any bytes tell which one was sent.
    std::fs::write(dir.join("tessera_bg.wasm.br"), b"stored brotli").expect("br");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    std::io::Write::write_all(&mut gz, &wasm).expect("gzip");
    std::fs::write(dir.join("tessera_bg.wasm.gz"), gz.finish().expect("gzip")).expect("gz");
    std::fs::write(dir.join("views"), if cfg!(erase_components) { "erased\n" } else { "typed\n" }).expect("views");
    let site = tessera_portal::Site::load(&dir).expect("readable").expect("a site");
    let hash = site.hash().to_string();
    assert_eq!(hash.len(), 16);
    assert_eq!(site.brotli_size(), None, "the script has no stored brotli form");

    let router = tessera_portal::routes(axum::Router::new(), Some(site));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, router).await });
    let client = reqwest::Client::new();
    let get = |path: String, accept: Option<&'static str>, etag: Option<String>| {
        let mut r = client.get(format!("{base}{path}"));
        if let Some(a) = accept {
            r = r.header("accept-encoding", a);
        }
        if let Some(e) = etag {
            r = r.header("if-none-match", e);
        }
        r.send()
    };
    let header =
        |r: &Response, name: &str| r.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();

    let hashed = format!("/pkg/tessera.{hash}_bg.wasm");
    let br = get(hashed.clone(), Some("gzip, deflate, br"), None).await.expect("br");
    assert_eq!(br.status(), StatusCode::OK);
    assert_eq!(header(&br, "content-encoding"), "br");
    assert_eq!(header(&br, "content-type"), "application/wasm");
    assert_eq!(header(&br, "cache-control"), "public, max-age=31536000, immutable");
    assert_eq!(header(&br, "vary"), "accept-encoding");
    assert_eq!(br.bytes().await.expect("body").as_ref(), b"stored brotli");

    let gz = get(hashed.clone(), Some("gzip;q=1, br;q=0"), None).await.expect("gzip");
    assert_eq!(header(&gz, "content-encoding"), "gzip", "br refused with q=0");
    let mut back = Vec::new();
    flate2::read::GzDecoder::new(gz.bytes().await.expect("body").as_ref()).read_to_end(&mut back).expect("gunzip");
    assert_eq!(back, wasm);

    let plain = get(hashed.clone(), None, None).await.expect("plain");
    assert_eq!(header(&plain, "content-encoding"), "");
    assert_eq!(plain.bytes().await.expect("body").as_ref(), &wasm[..]);

    let js = get(format!("/pkg/tessera.{hash}.js"), Some("br"), None).await.expect("js");
    assert_eq!(header(&js, "content-encoding"), "", "no stored form of the script: plain, not compressed here");
    assert_eq!(header(&js, "content-type"), "text/javascript; charset=utf-8");

    // The old names: the same bytes, revalidated.
    let old = get("/pkg/tessera_bg.wasm".into(), Some("br"), None).await.expect("old name");
    assert_eq!(header(&old, "cache-control"), "no-cache");
    let etag = header(&old, "etag");
    assert!(etag.starts_with('"') && etag.ends_with("-br\""), "{etag}");
    let again = get("/pkg/tessera_bg.wasm".into(), Some("br"), Some(etag.clone())).await.expect("again");
    assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
    assert_eq!(header(&again, "etag"), etag);
    let css = get("/pkg/tessera.css".into(), None, None).await.expect("css");
    let css_tag = header(&css, "etag");
    assert_eq!(header(&css, "cache-control"), "no-cache");
    let css_again = get("/pkg/tessera.css".into(), None, Some(format!("W/{css_tag}"))).await.expect("css again");
    assert_eq!(css_again.status(), StatusCode::NOT_MODIFIED, "weak comparison");
    let wrong = get(format!("/pkg/tessera.{}_bg.wasm", "0".repeat(16)), None, None).await.expect("other hash");
    assert_eq!(wrong.status(), StatusCode::NOT_FOUND, "only this build's hash is served");
    std::fs::remove_dir_all(&dir).expect("cleanup");
}
