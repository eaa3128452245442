//! Admin and self-service routes over real HTTP, each test on SQLite and on PostgreSQL (when
//! `TESSERA_TEST_POSTGRES_URL` is set): the fleet-wide audit log, token and user listings, removing members, approval
//! policies, releasing and reclaiming active requests, and usage with idle allocations, per-profile sums and CSV.
//!
//! Requests become active the way an agent makes them active: the test holds the demo node's credential and
//! reports the reserved instances in the node's status; telemetry goes through the agent route too.

use std::sync::Mutex;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tessera_server::http::auth::{new_node_secret, token_hash};
use tessera_server::store::telemetry::MinuteRow;
use tessera_server::store::{Role, now_ms};

use crate::harness::{TestApp, TestDb, on_both_backends};

on_both_backends!(
    the_fleet_audit_log_filters_pages_newest_first_and_is_for_platform_admins,
    tokens_are_listed_to_their_owner_without_secrets,
    users_are_listed_to_platform_admins_only,
    tenant_admins_remove_members_who_then_lose_sight_of_the_tenant,
    a_tenant_is_found_by_its_name_by_those_who_may_see_it,
    a_new_policy_decides_the_next_request,
    a_removed_limit_leaves_the_resource_unlimited_and_is_audited,
    active_requests_are_released_by_their_tenant_or_reclaimed_with_a_reason,
    usage_flags_idle_allocations_from_stored_minutes_and_the_live_window,
    usage_sums_profiles_and_exports_csv,
    usage_gives_released_allocations_their_mean_use_from_stored_minutes,
    rightsizing_finds_the_smallest_slice_that_carries_a_known_load,
    the_smaller_slice_replaces_its_request_once_active,
    a_request_is_replaced_whole_and_by_one_request_at_a_time,
    prices_cost_what_is_held_and_wasted_and_the_history_keeps_each_day,
    a_clusters_allocations_are_the_active_ones_on_its_nodes,
    the_standing_of_the_hours_since_the_kept_ones_sums_what_was_held_all_through_them,
);

/// The server on a test database, with the demo node (auto-layout on) and its node credential.
pub(crate) struct App {
    pub(crate) app: TestApp,
    pub(crate) node_id: String,
    node_secret: String,
    /// `(gpu uuid, instance)` of every instance reported so far (each status report lists them all).
    pub(crate) reported: Mutex<Vec<(String, Value)>>,
}

impl std::ops::Deref for App {
    type Target = TestApp;
    fn deref(&self) -> &TestApp {
        &self.app
    }
}

pub(crate) async fn spawn(db: &TestDb) -> App {
    with_node_credential(TestApp::on(db).auto_layout().start().await).await
}

/// `app` (started with the demo node, auto-layout on) with the demo node's credential, to report as its agent.
pub(crate) async fn with_node_credential(app: TestApp) -> App {
    let node = app.store.nodes().await.expect("nodes").into_iter().next().expect("the demo node");
    let node_secret = new_node_secret();
    app.store.create_node_credential(&node.id, &token_hash(&node_secret), "test").await.expect("credential");
    App { app, node_id: node.id, node_secret, reported: Mutex::new(Vec::new()) }
}

impl App {
    /// A tenant (created by the admin, with `extra` fields) with a compute-slice limit.
    pub(crate) async fn limited_tenant(&self, name: &str, extra: Value, compute_slices: u32) -> String {
        let id = self.tenant(name, extra).await;
        let r = self.quota(&id, json!({ "compute_slices": compute_slices })).await;
        assert_eq!(r.status(), StatusCode::OK, "{}", r.text().await.unwrap_or_default());
        id
    }

    /// Asks for `count` H100 slices of `profile` as `token`.
    async fn ask(&self, token: &str, tenant: &str, profile: &str, count: u32) -> (StatusCode, Value) {
        let body = json!({"tenant": tenant, "spec": {"mode": "mig", "profile": profile, "model": "H100-80GB"},
            "count": count, "reason": "training"});
        self.send(Method::POST, "/api/v1/requests", token, Some(body)).await
    }

    /// Asks, has the admin approve, and reports the reserved instances as the node's agent would: the request is
    /// active. Returns its id and its allocations (with their `device_uuid`).
    pub(crate) async fn active(&self, token: &str, tenant: &str, profile: &str, count: u32) -> (String, Vec<Value>) {
        let (s, request) = self.ask(token, tenant, profile, count).await;
        assert_eq!(s, StatusCode::CREATED, "{request}");
        self.activate(tenant, &request, count).await
    }

    /// Has the admin approve `request` (as created) if it is pending, and reports its `count` reserved instances as
    /// the node's agent would: it is active. Returns its id and its allocations.
    pub(crate) async fn activate(&self, tenant: &str, request: &Value, count: u32) -> (String, Vec<Value>) {
        let id = request["id"].as_str().expect("id").to_string();
        if request["state"] == "pending" {
            let (s, v) = self.send(Method::POST, &format!("/api/v1/requests/{id}/approve"), &self.admin, None).await;
            assert_eq!(s, StatusCode::OK, "{v}");
        }
        let mine = |list: &Value| -> Vec<Value> {
            list.as_array().into_iter().flatten().filter(|a| a["request"] == id.as_str()).cloned().collect()
        };
        let (_, list) = self.get(&format!("/api/v1/allocations?tenant={tenant}"), &self.admin).await;
        let reserved = mine(&list);
        assert_eq!(reserved.len(), count as usize, "{list}");
        let gpus = {
            let mut reported = self.reported.lock().expect("reported");
            for a in &reserved {
                let instance = json!({"profile": a["profile"], "start": a["start"],
                    "uuid": format!("MIG-{}", uuid::Uuid::new_v4()), "gi_id": 1, "ci_id": 0,
                    "device_name": format!("MIG {} Device 0", a["profile"].as_str().unwrap_or_default())});
                reported.push((a["gpu_uuid"].as_str().expect("gpu").to_string(), instance));
            }
            let mut by_gpu: Vec<Value> = Vec::new();
            for (gpu, instance) in reported.iter() {
                match by_gpu.iter_mut().find(|g| g["uuid"] == gpu.as_str()) {
                    Some(g) => g["instances"].as_array_mut().expect("instances").push(instance.clone()),
                    None => by_gpu.push(json!({"uuid": gpu, "mig_enabled": true, "instances": [instance]})),
                }
            }
            by_gpu
        };
        let status = json!({"observed_generation": 0, "gpus": gpus});
        let (s, outcome) = self.node_call(Method::PUT, "/api/v1/agent/status", status).await;
        assert_eq!((s, outcome["requests_active"].as_u64()), (StatusCode::OK, Some(1)), "{outcome}");
        let (_, list) = self.get(&format!("/api/v1/allocations?tenant={tenant}"), &self.admin).await;
        let active = mine(&list);
        assert!(active.iter().all(|a| a["state"] == "active" && a["device_uuid"].is_string()), "{list}");
        (id, active)
    }

    /// Calls an agent route with the demo node's credential (with a JSON body unless `body` is null).
    pub(crate) async fn node_call(&self, method: Method, path: &str, body: Value) -> (StatusCode, Value) {
        let mut r = self.client.request(method, format!("{}{path}", self.base)).bearer_auth(&self.node_secret);
        if !body.is_null() {
            r = r.json(&body);
        }
        let r = r.send().await.expect("send");
        let status = r.status();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Moves an allocation's activation `ago_ms` into the past (as if it had been active that long).
    pub(crate) async fn backdate(&self, db: &TestDb, allocation: &str, ago_ms: i64) {
        let sql = "UPDATE allocations SET activated_at_ms = $1 WHERE id = $2";
        let at = now_ms() - ago_ms;
        let done = if db.url.starts_with("sqlite:") {
            let pool = sqlx::SqlitePool::connect(&db.url).await.expect("sqlite");
            let done = sqlx::query(sql).bind(at).bind(allocation).execute(&pool).await.expect("update");
            pool.close().await;
            done.rows_affected()
        } else {
            let pool = sqlx::PgPool::connect(&db.url).await.expect("postgres");
            let done = sqlx::query(sql).bind(at).bind(allocation).execute(&pool).await.expect("update");
            pool.close().await;
            done.rows_affected()
        };
        assert_eq!(done, 1);
        // Use moved into hours the sweep may have kept already: they are kept again, as the store's own
        // backdating does.
        self.state.store.forget_allocation_hours(at).await.expect("forget");
    }
}

fn code(v: &Value) -> &str {
    v["code"].as_str().unwrap_or_default()
}

async fn the_fleet_audit_log_filters_pages_newest_first_and_is_for_platform_admins(db: &TestDb) {
    let app = spawn(db).await;
    let t = app.limited_tenant("audited", json!({}), 10).await;
    let (_, alice) = app.user("alice", &[(&t, Role::Member)]).await;
    let mut requests = Vec::new();
    for _ in 0..3 {
        let (s, r) = app.ask(&alice, &t, "1g.10gb", 1).await;
        assert_eq!(s, StatusCode::CREATED, "{r}");
        requests.push(r["id"].as_str().expect("id").to_string());
    }
    for id in &requests[..2] {
        let (s, v) = app.send(Method::POST, &format!("/api/v1/requests/{id}/cancel"), &alice, None).await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }
    let limits = json!({"limits": {"memory_gib": 100}});
    let (s, _) = app.send(Method::PUT, &format!("/api/v1/tenants/{t}/quotas"), &app.admin, Some(limits)).await;
    assert_eq!(s, StatusCode::OK);

    // Everything, newest first: the last change leads.
    let (s, all) = app.get("/api/v1/audit/entries?limit=500", &app.admin).await;
    assert_eq!(s, StatusCode::OK, "{all}");
    assert!(all["next"].is_null());
    let all = all["entries"].as_array().expect("entries").clone();
    assert_eq!((all[0]["action"].as_str(), all[0]["actor"].as_str()), (Some("quota.set"), Some("user:admin")));
    assert!(all.windows(2).all(|w| w[0]["at_ms"].as_i64() >= w[1]["at_ms"].as_i64()), "newest first");
    assert!(all.iter().any(|e| e["action"] == "node.register"), "the whole fleet's log");

    // Filters.
    let entries = |v: &Value| v["entries"].as_array().cloned().unwrap_or_default();
    let (_, v) = app.get("/api/v1/audit/entries?object_prefix=request/", &app.admin).await;
    let on_requests = entries(&v);
    assert_eq!(on_requests.len(), 5, "three created, two cancelled: {v}");
    assert!(on_requests.iter().all(|e| e["object"].as_str().is_some_and(|o| o.starts_with("request/"))));
    assert_eq!(on_requests[0]["action"], "request.cancelled");
    assert_eq!(on_requests[4]["action"], "request.create");
    let (_, v) = app.get(&format!("/api/v1/audit/entries?object=request/{}", requests[0]), &app.admin).await;
    let history = entries(&v);
    let actions: Vec<&str> = history.iter().filter_map(|e| e["action"].as_str()).collect();
    assert_eq!(actions, ["request.cancelled", "request.create"]);
    let (_, v) = app.get("/api/v1/audit/entries?actor=user:alice&action=request.c", &app.admin).await;
    assert_eq!(entries(&v).len(), 5);
    assert!(entries(&v).iter().all(|e| e["actor"] == "user:alice"));
    let (_, v) = app.get("/api/v1/audit/entries?action=request.cancel", &app.admin).await;
    assert_eq!(entries(&v).len(), 2);
    let (_, v) = app.get("/api/v1/audit/entries?actor=user:nobody", &app.admin).await;
    assert_eq!(v, json!({"entries": [], "next": null}));
    let pivot = on_requests[2]["at_ms"].as_i64().expect("at");
    let (_, v) = app.get(&format!("/api/v1/audit/entries?from={pivot}&object_prefix=request/"), &app.admin).await;
    assert!(!entries(&v).is_empty() && entries(&v).iter().all(|e| e["at_ms"].as_i64() >= Some(pivot)));
    let (_, v) = app.get(&format!("/api/v1/audit/entries?to={pivot}&object_prefix=request/"), &app.admin).await;
    assert!(entries(&v).iter().all(|e| e["at_ms"].as_i64() < Some(pivot)));

    // Pages of two: every entry exactly once, in the same order as the whole.
    let mut paged = Vec::new();
    let mut path = "/api/v1/audit/entries?limit=2".to_string();
    let mut pages = 0;
    loop {
        let (s, page) = app.get(&path, &app.admin).await;
        assert_eq!(s, StatusCode::OK, "{page}");
        pages += 1;
        let got = entries(&page);
        assert!(got.len() <= 2);
        paged.extend(got);
        match page["next"].as_str() {
            Some(next) => path = format!("/api/v1/audit/entries?limit=2&before={next}"),
            None => break,
        }
    }
    assert!(pages >= 3, "{pages} pages");
    assert_eq!(paged, all);
    // A filtered listing pages the same way.
    let (_, first) = app.get("/api/v1/audit/entries?object_prefix=request/&limit=3", &app.admin).await;
    let next = first["next"].as_str().expect("a second page");
    let (_, second) =
        app.get(&format!("/api/v1/audit/entries?object_prefix=request/&limit=3&before={next}"), &app.admin).await;
    assert!(second["next"].is_null());
    let both: Vec<Value> = entries(&first).into_iter().chain(entries(&second)).collect();
    assert_eq!(both, on_requests);

    // Bad queries, and callers who are not platform admins.
    for (query, status, expected) in [
        ("limit=0", StatusCode::UNPROCESSABLE_ENTITY, "invalid_limit"),
        ("limit=501", StatusCode::UNPROCESSABLE_ENTITY, "invalid_limit"),
        ("before=bm90LWEtY3Vyc29y", StatusCode::UNPROCESSABLE_ENTITY, "invalid_cursor"),
        ("from=10&to=5", StatusCode::UNPROCESSABLE_ENTITY, "audit_range"),
        ("limit=many", StatusCode::BAD_REQUEST, "invalid_query"),
    ] {
        let (s, v) = app.get(&format!("/api/v1/audit/entries?{query}"), &app.admin).await;
        assert_eq!((s, code(&v)), (status, expected), "{query}: {v}");
    }
    let (s, v) = app.get("/api/v1/audit/entries", &alice).await;
    assert_eq!((s, code(&v)), (StatusCode::FORBIDDEN, "forbidden"));
    // The per-object history is unchanged: oldest first, a plain list.
    let (s, v) = app.get(&format!("/api/v1/audit?object=request/{}", requests[0]), &app.admin).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v[0]["action"], "request.create");
    assert_eq!(v[1]["action"], "request.cancelled");
    // Members read their own requests' history (the dashboard's "History"), nothing else of the log.
    let (s, mine) = app.get(&format!("/api/v1/audit?object=request/{}", requests[0]), &alice).await;
    assert_eq!((s, mine), (StatusCode::OK, v));
    let other = app.limited_tenant("other", json!({}), 10).await;
    let (_, bob) = app.user("bob", &[(&other, Role::Member)]).await;
    let (s, v) = app.get(&format!("/api/v1/audit?object=request/{}", requests[0]), &bob).await;
    assert_eq!((s, code(&v)), (StatusCode::NOT_FOUND, "not_found"), "{v}");
    let (s, v) = app.get(&format!("/api/v1/audit?object=tenant/{t}"), &alice).await;
    assert_eq!((s, code(&v)), (StatusCode::FORBIDDEN, "forbidden"), "{v}");
}

async fn tokens_are_listed_to_their_owner_without_secrets(db: &TestDb) {
    let app = spawn(db).await;
    let (_, alice) = app.user("alice", &[]).await;
    let (_, bob) = app.user("bob", &[]).await;
    let (s, created) = app.send(Method::POST, "/api/v1/tokens", &alice, Some(json!({"name": "ci"}))).await;
    assert_eq!(s, StatusCode::CREATED, "{created}");
    let id = created["id"].as_str().expect("id").to_string();
    let secret = created["secret"].as_str().expect("secret").to_string();

    let r = app.client.get(format!("{}/api/v1/tokens", app.base)).bearer_auth(&alice).send().await.expect("send");
    assert_eq!(r.status(), StatusCode::OK);
    let text = r.text().await.expect("text");
    assert!(!text.contains(&secret) && !text.contains(&token_hash(&secret)), "no secret, no hash: {text}");
    let list: Value = serde_json::from_str(&text).expect("json");
    let names: Vec<&str> = list.as_array().expect("list").iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, ["ci", "test"], "newest first");
    let ci = &list[0];
    assert_eq!(ci["id"], id.as_str());
    let mut keys: Vec<&str> = ci.as_object().expect("object").keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["created_at_ms", "id", "name", "revoked_at_ms"]);
    assert!(ci["created_at_ms"].as_i64().is_some_and(|t| t > 0) && ci["revoked_at_ms"].is_null());

    let (s, _) = app.send(Method::POST, &format!("/api/v1/tokens/{id}/revoke"), &alice, None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (_, list) = app.get("/api/v1/tokens", &alice).await;
    let ci = list.as_array().expect("list").iter().find(|t| t["id"] == id.as_str()).expect("still listed").clone();
    assert!(ci["revoked_at_ms"].as_i64() >= ci["created_at_ms"].as_i64(), "{ci}");

    // Bob sees his own only; the admin too.
    let (s, list) = app.get("/api/v1/tokens", &bob).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(list.as_array().map(Vec::len), Some(1));
    assert!(list[0]["id"] != id.as_str());
    let (_, list) = app.get("/api/v1/tokens", &app.admin).await;
    let names: Vec<&str> = list.as_array().expect("list").iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, ["bootstrap"]);

    // A name is 1-100 characters as sent, as the API document states: blanks around it count, and a character
    // is a character, not a byte.
    let padded = format!("\u{c}{}", "*".repeat(100));
    let (s, v) = app.send(Method::POST, "/api/v1/tokens", &bob, Some(json!({"name": padded}))).await;
    assert_eq!((s, code(&v)), (StatusCode::UNPROCESSABLE_ENTITY, "invalid_name"), "{v}");
    let (s, v) = app.send(Method::POST, "/api/v1/tokens", &bob, Some(json!({"name": " \t "}))).await;
    assert_eq!((s, code(&v)), (StatusCode::UNPROCESSABLE_ENTITY, "invalid_name"), "{v}");
    let wide = "é".repeat(100);
    let (s, v) = app.send(Method::POST, "/api/v1/tokens", &bob, Some(json!({"name": wide}))).await;
    assert_eq!((s, v["name"].as_str()), (StatusCode::CREATED, Some(wide.as_str())), "{v}");
    let (s, v) = app.send(Method::POST, "/api/v1/tokens", &bob, Some(json!({"name": " laptop "}))).await;
    assert_eq!((s, v["name"].as_str()), (StatusCode::CREATED, Some("laptop")), "{v}");
}

async fn users_are_listed_to_platform_admins_only(db: &TestDb) {
    let app = spawn(db).await;
    let t = app.limited_tenant("people", json!({}), 1).await;
    let (_, zoe) = app.user("zoe", &[(&t, Role::TenantAdmin)]).await;
    app.user("bea", &[]).await;
    let (s, users) = app.get("/api/v1/users", &app.admin).await;
    assert_eq!(s, StatusCode::OK, "{users}");
    let names: Vec<&str> = users.as_array().expect("users").iter().filter_map(|u| u["name"].as_str()).collect();
    assert_eq!(names, ["admin", "bea", "zoe"]);
    assert_eq!(users[0]["platform_admin"], true);
    assert_eq!(users[2]["platform_admin"], false);
    assert!(users[2]["id"].is_string());
    let (s, v) = app.get("/api/v1/users", &zoe).await;
    assert_eq!((s, code(&v)), (StatusCode::FORBIDDEN, "forbidden"));
}

async fn a_tenant_is_found_by_its_name_by_those_who_may_see_it(db: &TestDb) {
    let app = spawn(db).await;
    let team = app.limited_tenant("team", json!({}), 1).await;
    let other = app.limited_tenant("other-team", json!({}), 1).await;
    let (_, alice) = app.user("alice", &[(&team, Role::Member)]).await;
    let (s, v) = app.get("/api/v1/tenants/team", &alice).await;
    assert_eq!((s, v["id"].as_str()), (StatusCode::OK, Some(team.as_str())), "{v}");
    let (s, v) = app.get(&format!("/api/v1/tenants/{team}"), &alice).await;
    assert_eq!((s, v["name"].as_str()), (StatusCode::OK, Some("team")), "{v}");
    // Another tenant is not found, by name or by id, exactly as one that does not exist.
    for key in ["other-team", other.as_str(), "no-such-team", "Not A Name!"] {
        let (s, v) = app.get(&format!("/api/v1/tenants/{}", key.replace(' ', "%20")), &alice).await;
        assert_eq!((s, code(&v)), (StatusCode::NOT_FOUND, "not_found"), "{key}: {v}");
        assert_eq!(v["detail"], json!("tenant not found"), "{key}: the same answer either way");
    }
    let (s, v) = app.get("/api/v1/tenants/other-team", &app.admin).await;
    assert_eq!((s, v["id"].as_str()), (StatusCode::OK, Some(other.as_str())), "{v}");
}

async fn tenant_admins_remove_members_who_then_lose_sight_of_the_tenant(db: &TestDb) {
    let app = spawn(db).await;
    let t = app.limited_tenant("team", json!({}), 1).await;
    let (alice_id, alice) = app.user("alice", &[(&t, Role::Member)]).await;
    let (_, carol) = app.user("carol", &[(&t, Role::TenantAdmin)]).await;
    let (dave_id, dave) = app.user("dave", &[(&t, Role::Member)]).await;
    let (s, _) = app.get(&format!("/api/v1/tenants/{t}"), &alice).await;
    assert_eq!(s, StatusCode::OK);
    let member = |user: &str| format!("/api/v1/tenants/{t}/members/{user}");

    let (s, v) = app.send(Method::DELETE, &member(&alice_id), &dave, None).await;
    assert_eq!((s, code(&v)), (StatusCode::FORBIDDEN, "forbidden"), "a plain member may not");
    let (s, v) = app.send(Method::DELETE, &member(&alice_id), &carol, None).await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{v}");
    // At once (the credential cache is cleared): alice no longer sees the tenant.
    let (s, v) = app.get(&format!("/api/v1/tenants/{t}"), &alice).await;
    assert_eq!((s, code(&v)), (StatusCode::NOT_FOUND, "not_found"));
    let (_, tenants) = app.get("/api/v1/tenants", &alice).await;
    assert_eq!(tenants, json!([]));
    let (s, v) = app.ask(&alice, &t, "1g.10gb", 1).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    let (s, v) = app.send(Method::DELETE, &member(&alice_id), &carol, None).await;
    assert_eq!((s, code(&v)), (StatusCode::NOT_FOUND, "not_found"), "not a member any more");

    // A platform admin may too; the audit log says who did it.
    let (s, _) = app.send(Method::DELETE, &member(&dave_id), &app.admin, None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (_, members) = app.get(&format!("/api/v1/tenants/{t}/members"), &carol).await;
    let names: Vec<&str> = members.as_array().expect("members").iter().filter_map(|m| m["name"].as_str()).collect();
    assert_eq!(names, ["carol"]);
    let (_, history) = app.get(&format!("/api/v1/audit?object=tenant/{t}/member/{alice_id}"), &app.admin).await;
    let last = history.as_array().and_then(|h| h.last()).expect("entry").clone();
    assert_eq!((last["action"].as_str(), last["actor"].as_str()), (Some("membership.remove"), Some("user:carol")));
    assert!(last["before"].as_str().is_some_and(|b| b.contains("member")), "{last}");
}

async fn a_new_policy_decides_the_next_request(db: &TestDb) {
    let app = spawn(db).await;
    let t = app.limited_tenant("policed", json!({"auto_approve": false}), 20).await;
    let (_, alice) = app.user("alice", &[(&t, Role::Member)]).await;
    let (s, r) = app.ask(&alice, &t, "1g.10gb", 1).await;
    assert_eq!((s, r["state"].as_str()), (StatusCode::CREATED, Some("pending")));

    let path = format!("/api/v1/tenants/{t}/policy");
    let policy = |body: Value| app.send(Method::PUT, &path, &app.admin, Some(body));
    let (s, view) = policy(json!({"auto_approve": true, "auto_approve_max_compute_slices": 2})).await;
    assert_eq!(s, StatusCode::OK, "{view}");
    assert_eq!((view["id"].as_str(), view["name"].as_str()), (Some(t.as_str()), Some("policed")));
    assert_eq!(
        (view["auto_approve"].as_bool(), view["auto_approve_max_compute_slices"].as_u64()),
        (Some(true), Some(2))
    );
    let (s, r) = app.ask(&alice, &t, "1g.10gb", 1).await;
    assert_eq!((s, r["state"].as_str()), (StatusCode::CREATED, Some("approved")), "{r}");
    // Over the policy's size: waits for an admin again.
    let (s, r) = app.ask(&alice, &t, "3g.40gb", 1).await;
    assert_eq!((s, r["state"].as_str()), (StatusCode::CREATED, Some("pending")), "{r}");
    let (_, now) = app.get(&format!("/api/v1/tenants/{t}"), &alice).await;
    assert_eq!(now["auto_approve"], true);

    let (s, v) = policy(json!({"auto_approve": true, "auto_approve_max_compute_slices": 4_294_967_295u64})).await;
    assert_eq!((s, code(&v)), (StatusCode::UNPROCESSABLE_ENTITY, "invalid_policy"));
    let (s, v) = policy(json!({"auto_approve": true, "approver": "me"})).await;
    assert_eq!((s, code(&v)), (StatusCode::UNPROCESSABLE_ENTITY, "invalid_body"));
    let (s, v) = app.send(Method::PUT, "/api/v1/tenants/nope/policy", &app.admin, Some(json!({}))).await;
    assert_eq!((s, code(&v)), (StatusCode::NOT_FOUND, "not_found"));
    let (s, v) = app.send(Method::PUT, &format!("/api/v1/tenants/{t}/policy"), &alice, Some(json!({}))).await;
    assert_eq!((s, code(&v)), (StatusCode::FORBIDDEN, "forbidden"));
    // Absent fields take the creation defaults: auto-approval off.
    let (s, view) = policy(json!({})).await;
    assert_eq!((s, view["auto_approve"].as_bool()), (StatusCode::OK, Some(false)));
    let (s, r) = app.ask(&alice, &t, "1g.10gb", 1).await;
    assert_eq!((s, r["state"].as_str()), (StatusCode::CREATED, Some("pending")));
    let (_, history) = app.get(&format!("/api/v1/audit?object=tenant/{t}"), &app.admin).await;
    let policies: Vec<&Value> =
        history.as_array().expect("history").iter().filter(|e| e["action"] == "tenant.policy").collect();
    assert_eq!(policies.len(), 2);
    let after: Value = serde_json::from_str(policies[0]["after"].as_str().expect("after")).expect("json");
    assert_eq!(after["policy"]["auto_approve_max_compute_slices"], 2);
}

async fn a_removed_limit_leaves_the_resource_unlimited_and_is_audited(db: &TestDb) {
    let app = spawn(db).await;
    let t =
        app.limited_tenant("limited", json!({"auto_approve": true, "auto_approve_max_compute_slices": 7}), 20).await;
    let (_, alice) = app.user("alice", &[(&t, Role::Member)]).await;
    let path = format!("/api/v1/tenants/{t}/quotas");
    let put = |limits: Value| app.send(Method::PUT, &path, &app.admin, Some(json!({ "limits": limits })));
    let key = "mig/H100-80GB/1g.10gb";
    let (s, v) = put(json!({ key: 1 })).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = app.ask(&alice, &t, "1g.10gb", 2).await;
    assert_eq!((s, code(&v)), (StatusCode::CONFLICT, "quota_exceeded"), "{v}");

    // One bad key and nothing changes, the removal included.
    let (s, v) = put(json!({ key: null, "mig/H100-80GB/9g.1tb": null })).await;
    assert_eq!((s, code(&v)), (StatusCode::UNPROCESSABLE_ENTITY, "quota_bad_resource"), "{v}");
    let (_, view) = app.get(&path, &alice).await;
    let limit_of = |view: &Value, key: &str| {
        view["resources"].as_array().expect("lines").iter().find(|l| l["resource"] == key).map(|l| l["limit"].clone())
    };
    assert_eq!(limit_of(&view, key), Some(json!(1.0)));

    // Removed: the line is gone (nothing is held) and two fit under the remaining compute-slice limit.
    let (s, view) = put(json!({ key: null })).await;
    assert_eq!(s, StatusCode::OK, "{view}");
    assert_eq!(limit_of(&view, key), None, "{view}");
    assert_eq!(limit_of(&view, "compute_slices"), Some(json!(20.0)), "other limits stay");
    let (s, v) = app.ask(&alice, &t, "1g.10gb", 2).await;
    assert_eq!((s, v["state"].as_str()), (StatusCode::CREATED, Some("approved")), "{v}");
    // Held but unlimited: listed with a null limit.
    let (_, view) = app.get(&path, &alice).await;
    assert_eq!(limit_of(&view, key), Some(Value::Null), "{view}");

    // Removing what is not there changes nothing and is not audited.
    let (s, _) = put(json!({ "mig/H100-80GB/2g.20gb": null })).await;
    assert_eq!(s, StatusCode::OK);
    let (_, history) = app.get(&format!("/api/v1/audit?object=tenant/{t}/quota/{key}"), &app.admin).await;
    // Before and after are JSON text (PostgreSQL keeps them as jsonb, so compare them parsed).
    let entries: Vec<(String, Value, Value)> = history
        .as_array()
        .expect("history")
        .iter()
        .map(|e| {
            let field = |f: &str| e[f].as_str().map_or(Value::Null, |t| serde_json::from_str(t).expect("json"));
            (e["action"].as_str().expect("action").to_string(), field("before"), field("after"))
        })
        .collect();
    assert_eq!(
        entries,
        vec![
            ("quota.set".to_string(), Value::Null, json!({"limit_milli": 1000})),
            ("quota.remove".to_string(), json!({"limit_milli": 1000}), Value::Null),
        ]
    );
    let (_, none) = app.get(&format!("/api/v1/audit?object=tenant/{t}/quota/mig/H100-80GB/2g.20gb"), &app.admin).await;
    assert_eq!(none, json!([]));
    let (s, v) = app.send(Method::PUT, &path, &alice, Some(json!({"limits": { key: null }}))).await;
    assert_eq!((s, code(&v)), (StatusCode::FORBIDDEN, "forbidden"));
}

async fn active_requests_are_released_by_their_tenant_or_reclaimed_with_a_reason(db: &TestDb) {
    let app = spawn(db).await;
    let t = app.limited_tenant("releasing", json!({}), 2).await;
    let (_, alice) = app.user("alice", &[(&t, Role::Member)]).await;
    let (active, allocations) = app.active(&alice, &t, "1g.10gb", 1).await;
    let allocation = allocations[0]["id"].as_str().expect("id").to_string();
    let (s, pending) = app.ask(&alice, &t, "1g.10gb", 1).await;
    assert_eq!((s, pending["state"].as_str()), (StatusCode::CREATED, Some("pending")));
    let pending = pending["id"].as_str().expect("id").to_string();
    let (s, v) = app.ask(&alice, &t, "1g.10gb", 1).await;
    assert_eq!((s, code(&v)), (StatusCode::CONFLICT, "quota_exceeded"), "both slices of the quota are held");
    let release = |id: &str| format!("/api/v1/requests/{id}/release");

    // Only an active request is released.
    let (s, v) = app.send(Method::POST, &release(&pending), &alice, None).await;
    assert_eq!((s, code(&v)), (StatusCode::CONFLICT, "request_invalid_transition"), "{v}");
    // If-Match like every other action.
    let r =
        app.client.post(format!("{}{}", app.base, release(&active))).bearer_auth(&alice).header("If-Match", "\"v1\"");
    let r = r.send().await.expect("send");
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert_eq!(code(&r.json().await.expect("json")), "version_conflict");
    let (s, v) = app.send(Method::POST, &release(&active), &alice, Some(json!({"because": "done"}))).await;
    assert_eq!((s, code(&v)), (StatusCode::UNPROCESSABLE_ENTITY, "invalid_body"));
    let (s, current) = app.get(&format!("/api/v1/requests/{active}"), &alice).await;
    assert_eq!((s, current["state"].as_str()), (StatusCode::OK, Some("active")));
    let version = current["version"].as_i64().expect("version");
    let (_, nodes) = app.get("/api/v1/nodes", &app.admin).await;
    let generation = nodes[0]["generation"].as_i64().expect("generation");

    // The member releases it, without a body.
    let r = app
        .client
        .post(format!("{}{}", app.base, release(&active)))
        .bearer_auth(&alice)
        .header("If-Match", format!("\"v{version}\""))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["etag"].to_str().expect("etag"), format!("\"v{}\"", version + 1));
    let released: Value = r.json().await.expect("json");
    assert_eq!((released["state"].as_str(), released["reason"].as_str()), (Some("released"), Some("training")));
    // Its instance is given back (and metered as released), its node told, its quota freed.
    let (_, list) = app.get(&format!("/api/v1/allocations?tenant={t}"), &alice).await;
    assert!(list.as_array().expect("list").iter().all(|a| a["id"] != allocation.as_str()), "{list}");
    let (_, usage) = app.get(&format!("/api/v1/usage?tenant={t}"), &alice).await;
    let metered =
        usage["allocations"].as_array().expect("rows").iter().find(|a| a["allocation"] == allocation.as_str());
    let metered = metered.expect("metered").clone();
    assert_eq!((metered["state"].as_str(), metered["idle"].as_bool()), (Some("released"), Some(false)));
    assert!(metered["util_mean"].is_null() && metered["to_ms"].as_i64() <= Some(now_ms()));
    let (_, nodes) = app.get("/api/v1/nodes", &app.admin).await;
    assert!(nodes[0]["generation"].as_i64().expect("generation") > generation, "the node's spec moved on");
    let (s, spec) = app.node_call(Method::GET, "/api/v1/agent/spec", Value::Null).await;
    assert_eq!(s, StatusCode::OK, "{spec}");
    assert!(!spec.to_string().contains(&allocation), "the spec no longer holds it: {spec}");
    let (_, quota) = app.get(&format!("/api/v1/tenants/{t}/quotas"), &alice).await;
    let held = quota["resources"].as_array().expect("lines").iter().find(|l| l["resource"] == "compute_slices");
    assert_eq!(held.expect("compute_slices")["held"], 1.0, "{quota}");
    let (s, v) = app.ask(&alice, &t, "1g.10gb", 1).await;
    assert_eq!(s, StatusCode::CREATED, "the freed slice fits again: {v}");
    let (s, v) = app.send(Method::POST, &release(&active), &alice, None).await;
    assert_eq!((s, code(&v)), (StatusCode::CONFLICT, "request_invalid_transition"), "released once");

    // A platform admin reclaims another tenant's request: with a reason only.
    let u = app.limited_tenant("reclaimed", json!({}), 7).await;
    let (_, bob) = app.user("bob", &[(&u, Role::Member)]).await;
    let (idle, _) = app.active(&bob, &u, "1g.10gb", 1).await;
    let (s, v) = app.send(Method::POST, &release(&idle), &alice, Some(json!({"reason": "mine now"}))).await;
    assert_eq!((s, code(&v)), (StatusCode::NOT_FOUND, "not_found"), "another tenant's member");
    for body in [None, Some(json!({})), Some(json!({"reason": "  "}))] {
        let (s, v) = app.send(Method::POST, &release(&idle), &app.admin, body.clone()).await;
        assert_eq!((s, code(&v)), (StatusCode::UNPROCESSABLE_ENTITY, "reason_required"), "{body:?}: {v}");
    }
    let why = json!({"reason": "idle for 3 days"});
    let (s, v) = app.send(Method::POST, &release(&idle), &app.admin, Some(why)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!((v["state"].as_str(), v["reason"].as_str()), (Some("released"), Some("idle for 3 days")));
    let (_, history) = app.get(&format!("/api/v1/audit?object=request/{idle}"), &app.admin).await;
    let last = history.as_array().and_then(|h| h.last()).expect("entry").clone();
    assert_eq!((last["action"].as_str(), last["actor"].as_str()), (Some("request.released"), Some("user:admin")));
    let after: Value = serde_json::from_str(last["after"].as_str().expect("after")).expect("json");
    assert_eq!((after["state"].as_str(), after["reason"].as_str()), (Some("released"), Some("idle for 3 days")));
    let (_, quota) = app.get(&format!("/api/v1/tenants/{u}/quotas"), &bob).await;
    assert!(quota["resources"].as_array().expect("lines").iter().all(|l| l["held"] == 0.0), "{quota}");
}

/// A minute row of `device` (on `gpu`) at `minute_ms`: 60 samples of `util` %.
pub(crate) fn minute(app: &App, device: &str, gpu: &str, minute_ms: i64, util: f64) -> MinuteRow {
    MinuteRow {
        device: device.into(),
        minute_ms,
        node_id: app.node_id.clone(),
        gpu: gpu.into(),
        profile: Some("1g.10gb".into()),
        start: Some(0),
        samples: 60,
        util_avg: util,
        util_max: util,
        mem_used_avg: 100.0,
        mem_used_max: None,
        mem_total: 10_000.0,
        power_avg: None,
        temp_max: None,
    }
}

async fn usage_flags_idle_allocations_from_stored_minutes_and_the_live_window(db: &TestDb) {
    let app = spawn(db).await;
    let t = app.limited_tenant("idlers", json!({}), 7).await;
    let (_, alice) = app.user("alice", &[(&t, Role::Member)]).await;
    let mut allocations = Vec::new();
    for _ in 0..3 {
        let (_, a) = app.active(&alice, &t, "1g.10gb", 1).await;
        allocations.push(a[0].clone());
    }
    let field = |a: &Value, f: &str| a[f].as_str().expect(f).to_string();
    let (quiet, busy, unseen) = (&allocations[0], &allocations[1], &allocations[2]);
    for a in &allocations {
        app.backdate(db, &field(a, "id"), 3 * 3_600_000).await;
    }

    // Stored minutes from 100 to 21 minutes ago (before the live window), and from 5 minutes ago to now, which the
    // window covers and which must not count twice.
    let now = now_ms();
    let this_minute = now - now.rem_euclid(60_000);
    let mut rows = Vec::new();
    for (a, old, recent) in [(quiet, 2.0, 100.0), (busy, 50.0, 0.0)] {
        let (device, gpu) = (field(a, "device_uuid"), field(a, "gpu_uuid"));
        rows.extend((21..=100).map(|k| minute(&app, &device, &gpu, this_minute - k * 60_000, old)));
        rows.extend((1..=5).map(|k| minute(&app, &device, &gpu, this_minute - k * 60_000, recent)));
    }
    app.state.store.write_minutes(&rows).await.expect("minutes");
    // The live window: ten seconds of samples through the agent route.
    let series = |a: &Value, util: f32| {
        json!({"device": field(a, "device_uuid"), "gpu": field(a, "gpu_uuid"), "profile": "1g.10gb", "start": a["start"],
            "samples": (1..=10).map(|s| json!({"t": now - s * 1000, "util": util, "mem_used_mib": 100.0,
                "mem_total_mib": 10_000.0})).collect::<Vec<_>>()})
    };
    let batch = json!({"dropped": 0, "devices": [series(quiet, 8.0), series(busy, 90.0)]});
    let (s, accepted) = app.node_call(Method::POST, "/api/v1/agent/telemetry", batch).await;
    assert_eq!((s, accepted["accepted"].as_u64()), (StatusCode::OK, Some(20)), "{accepted}");

    let usage = |query: &'static str| usage_of(&app, &alice, &t, query, [quiet, busy, unseen]);
    // The defaults: the last 2 hours, below 5 %. Stored minutes count by samples, window seconds one each.
    let (report, [q, b, u]) = usage("").await;
    assert_eq!((report["idle_below"].as_f64(), report["idle_hours"].as_f64()), (Some(5.0), Some(2.0)));
    let expect_quiet = (80.0 * 60.0 * 2.0 + 10.0 * 8.0) / (80.0 * 60.0 + 10.0);
    let expect_busy = (80.0 * 60.0 * 50.0 + 10.0 * 90.0) / (80.0 * 60.0 + 10.0);
    let mean = |r: &Value| r["util_mean"].as_f64().expect("util_mean");
    assert!((mean(&q) - expect_quiet).abs() < 1e-6, "{q}");
    assert!((mean(&b) - expect_busy).abs() < 1e-6, "{b}");
    assert_eq!((q["idle"].as_bool(), b["idle"].as_bool()), (Some(true), Some(false)));
    assert_eq!((u["util_mean"].clone(), u["idle"].as_bool()), (Value::Null, Some(false)), "no samples, not idle");
    // The idle sweep tells the tenant of the idle one, once.
    let warn = tessera_server::services::notifications::warn_idle;
    assert_eq!(warn(&app.state, now_ms()).await.expect("sweep"), 1);
    assert_eq!(warn(&app.state, now_ms()).await.expect("sweep"), 0, "told once");
    let (_, inbox) = app.get("/api/v1/inbox?limit=500", &alice).await;
    let idle: Vec<&Value> = inbox.as_array().into_iter().flatten().filter(|e| e["type"] == "allocation.idle").collect();
    assert_eq!(idle.len(), 1, "{inbox:#}");
    assert_eq!(idle[0]["data"]["after"]["allocation_id"], quiet["id"], "{inbox:#}");
    // A stricter threshold.
    let (_, [q, _, _]) = usage("&idle_below=2").await;
    assert_eq!(q["idle"], false);
    // The last 18 seconds: the live window alone.
    let (report, [q, b, _]) = usage("&idle_hours=0.005").await;
    assert_eq!(report["idle_hours"], 0.005);
    assert_eq!((mean(&q), mean(&b)), (8.0, 90.0));
    assert_eq!(q["idle"], false);
    let (_, [q, _, _]) = usage("&idle_hours=0.005&idle_below=10").await;
    assert_eq!(q["idle"], true);
    // Active for 3 hours only: not idle over the last 4.
    let (_, [q, _, _]) = usage("&idle_hours=4").await;
    assert!(mean(&q) < 5.0 && q["idle"] == false, "{q}");
    // A member of another tenant sees none of it.
    let other = app.limited_tenant("others", json!({}), 1).await;
    let (_, olga) = app.user("olga", &[(&other, Role::Member)]).await;
    let (s, v) = app.get("/api/v1/usage", &olga).await;
    assert_eq!((s, v["allocations"].clone()), (StatusCode::OK, json!([])));
}

/// Each allocation's mean use over its time in the period comes from its device's stored minutes, released ones
/// included: minutes before its activation, after its release or outside the period do not count.
async fn usage_gives_released_allocations_their_mean_use_from_stored_minutes(db: &TestDb) {
    let app = spawn(db).await;
    let t = app.limited_tenant("past", json!({}), 7).await;
    let (_, alice) = app.user("alice", &[(&t, Role::Member)]).await;
    let (gone_request, gone) = app.active(&alice, &t, "1g.10gb", 1).await;
    let (_, kept) = app.active(&alice, &t, "1g.10gb", 1).await;
    let (_, quiet) = app.active(&alice, &t, "1g.10gb", 1).await;
    let field = |a: &Value, f: &str| a[f].as_str().expect(f).to_string();
    let (gone, kept, quiet) = (&gone[0], &kept[0], &quiet[0]);
    for a in [gone, kept, quiet] {
        app.backdate(db, &field(a, "id"), 3 * 3_600_000).await;
    }
    let now = now_ms();
    let this_minute = now - now.rem_euclid(60_000);
    let at = |minutes_ago: i64| this_minute - minutes_ago * 60_000;
    let (gone_device, kept_device) = (field(gone, "device_uuid"), field(kept, "device_uuid"));
    let mut rows = Vec::new();
    // Before the activation (4 hours ago): not its use.
    rows.push(minute(&app, &gone_device, &field(gone, "gpu_uuid"), at(240), 100.0));
    // Its use: 60 minutes at 40 %, then 60 at 20 % (mean 30 %).
    rows.extend((61..=120).map(|k| minute(&app, &gone_device, &field(gone, "gpu_uuid"), at(k), 40.0)));
    rows.extend((1..=60).map(|k| minute(&app, &gone_device, &field(gone, "gpu_uuid"), at(k), 20.0)));
    rows.extend((1..=120).map(|k| minute(&app, &kept_device, &field(kept, "gpu_uuid"), at(k), 70.0)));
    app.state.store.write_minutes(&rows).await.expect("minutes");
    let (s, v) = app.send(Method::POST, &format!("/api/v1/requests/{gone_request}/release"), &alice, None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    // After its release: another holder's use of the device, not its own.
    let later = now_ms() + 120_000;
    app.state
        .store
        .write_minutes(&[minute(&app, &gone_device, &field(gone, "gpu_uuid"), later, 99.0)])
        .await
        .expect("later");

    let usage = |query: String| {
        let app = &app;
        let alice = &alice;
        let t = &t;
        async move { usage_of(app, alice, t, &query, [gone, kept, quiet]).await }
    };
    let within = |v: &Value, want: f64| (v["util_in_period"].as_f64().expect("a mean") - want).abs() < 1e-6;
    // A period reaching an hour past now: the release bounds the released one's use, not the period.
    let (_, [g, k, q]) = usage(format!("&from={}&to={}", now - 6 * 3_600_000, now + 3_600_000)).await;
    assert_eq!(g["state"], "released", "{g}");
    assert!(within(&g, 30.0), "released: its minutes between activation and release {g}");
    assert!(within(&k, 70.0), "{k}");
    assert_eq!(q["util_in_period"], Value::Null, "no minute stored: {q}");
    // A period that ends an hour ago: only the 40 % hour.
    let (_, [g, _, _]) = usage(format!("&from={}&to={}", now - 6 * 3_600_000, at(60))).await;
    assert!(within(&g, 40.0), "{g}");
    // Under a limit the allocations answered keep their means: the two active ones first (the released one is
    // left out), each with the figure it has in the whole answer.
    let query = format!("/api/v1/usage?tenant={t}&from={}&to={}&limit=2", now - 6 * 3_600_000, now + 3_600_000);
    let (s, v) = app.get(&query, &alice).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let rows = v["allocations"].as_array().expect("rows");
    assert_eq!((rows.len(), v["allocation_count"].as_u64()), (2, Some(3)), "{v:#}");
    assert!(rows.iter().all(|r| r["state"] == "active"), "{v:#}");
    let kept_row = rows.iter().find(|r| r["allocation"] == kept["id"]).expect("the kept one");
    assert!(within(kept_row, 70.0), "{kept_row}");
    // Its mean over the idle look-back: a member's read (their devices only) says what the admin's fleet-wide read
    // says.
    let fleet = format!("/api/v1/usage?from={}&to={}", now - 6 * 3_600_000, now + 3_600_000);
    let (_, as_admin) = app.get(&fleet, &app.admin).await;
    let (_, as_member) = app.get(&fleet, &alice).await;
    let mean_of = |v: &Value| {
        let rows = v["allocations"].as_array().expect("rows");
        rows.iter().find(|r| r["allocation"] == kept["id"]).map(|r| r["util_mean"].clone())
    };
    let (admin_mean, member_mean) = (mean_of(&as_admin), mean_of(&as_member));
    assert!(admin_mean.as_ref().and_then(Value::as_f64).is_some_and(|u| (u - 70.0).abs() < 1e-6), "{admin_mean:?}");
    assert_eq!(member_mean, admin_mean);
    // The CSV has the same figure in its last column.
    let csv = format!("{}/api/v1/usage?tenant={t}&format=csv&to={}", app.base, now + 3_600_000);
    let r = app.client.get(csv).bearer_auth(&alice).send().await;
    let text = r.expect("csv").text().await.expect("csv");
    let line = text.lines().find(|l| l.contains(&field(gone, "id"))).expect("a line for it");
    assert_eq!(line.rsplit(',').next(), Some("30"), "{line}");
    // The efficiency report measures the released one too: 3 slice-hours at 30 % beside 3 at 70 %, the quiet one
    // unmeasured.
    let (s, v) = app.get("/api/v1/efficiency?hours=4", &app.admin).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let row = v["tenants"].as_array().and_then(|r| r.iter().find(|r| r["tenant_id"] == t.as_str())).expect("row");
    let near = |f: &str, want: f64| (row[f].as_f64().unwrap_or(f64::NAN) - want).abs() < 0.05;
    assert!(near("held_slice_hours", 9.0) && near("measured_slice_hours", 6.0), "{row:#}");
    assert!(near("used_slice_hours", 3.0 * 0.3 + 3.0 * 0.7), "{row:#}");
}

/// The tenant's usage report as `token` (with `query` appended), and the rows of `allocations` in it.
async fn usage_of(app: &App, token: &str, tenant: &str, query: &str, allocations: [&Value; 3]) -> (Value, [Value; 3]) {
    let (s, v) = app.get(&format!("/api/v1/usage?tenant={tenant}{query}"), token).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let rows = allocations.map(|a| {
        let row = v["allocations"].as_array().expect("rows").iter().find(|r| r["allocation"] == a["id"]).cloned();
        row.unwrap_or_else(|| panic!("no row for {a} in {v}"))
    });
    (v, rows)
}

async fn usage_sums_profiles_and_exports_csv(db: &TestDb) {
    let app = spawn(db).await;
    let t = app.limited_tenant("sums", json!({}), 7).await;
    let (_, alice) = app.user("alice", &[(&t, Role::Member)]).await;
    app.active(&alice, &t, "1g.10gb", 2).await;
    app.active(&alice, &t, "2g.20gb", 1).await;
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let (from, to) = (now_ms() - 3_600_000, now_ms() + 3_600_000);
    let query = format!("/api/v1/usage?tenant={t}&from={from}&to={to}");
    let (s, report) = app.get(&query, &alice).await;
    assert_eq!(s, StatusCode::OK, "{report}");
    let rows = report["allocations"].as_array().expect("rows").clone();
    assert_eq!(rows.len(), 3);

    // Per profile: by model then profile, summing its allocations.
    let profiles = report["profiles"].as_array().expect("profiles");
    let keys: Vec<(&str, &str, u64)> = profiles
        .iter()
        .map(|p| {
            (
                p["model"].as_str().expect("model"),
                p["profile"].as_str().expect("profile"),
                p["allocations"].as_u64().expect("n"),
            )
        })
        .collect();
    assert_eq!(keys, [("H100-80GB", "1g.10gb", 2), ("H100-80GB", "2g.20gb", 1)]);
    for p in profiles {
        let mine: Vec<&Value> = rows.iter().filter(|r| r["profile"] == p["profile"]).collect();
        let sum = |f: &str| mine.iter().filter_map(|r| r[f].as_f64()).sum::<f64>();
        assert!((p["slice_seconds"].as_f64().expect("sum") - sum("slice_seconds")).abs() < 1e-9, "{p}");
        assert!((p["gpu_hours"].as_f64().expect("sum") - sum("gpu_hours")).abs() < 1e-12, "{p}");
        assert!(sum("slice_seconds") > 0.0);
    }
    let slice_seconds: f64 = profiles.iter().filter_map(|p| p["slice_seconds"].as_f64()).sum();
    assert!((report["tenants"][0]["slice_seconds"].as_f64().expect("tenant") - slice_seconds).abs() < 1e-9);

    // The same allocations as CSV: a header, then a line each.
    let r = app.client.get(format!("{}{query}&format=csv", app.base)).bearer_auth(&alice).send().await.expect("send");
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["content-type"], "text/csv; charset=utf-8");
    assert_eq!(
        r.headers()["content-disposition"].to_str().expect("disposition"),
        format!("attachment; filename=\"tessera-usage-{from}-{to}.csv\"")
    );
    let text = r.text().await.expect("csv");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "tenant,allocation,request,node,gpu_uuid,device_uuid,model,profile,weight,state,from,to,seconds,\
         slice_seconds,gpu_hours,util_mean_pct,idle,util_in_period_pct"
    );
    assert_eq!(lines.len(), 1 + rows.len(), "{text}");
    for line in &lines[1..] {
        let cells: Vec<&str> = line.split(',').collect();
        assert_eq!(cells.len(), 18, "{line}");
        let row = rows.iter().find(|r| r["allocation"] == cells[1]).expect("a metered allocation");
        assert_eq!(cells[0], "sums");
        assert_eq!(
            (cells[5], cells[6], cells[7]),
            (row["device_uuid"].as_str().expect("device"), "H100-80GB", row["profile"].as_str().expect("profile"))
        );
        assert_eq!((cells[9], cells[15], cells[16], cells[17]), ("active", "", "false", ""), "no minutes stored");
        assert_eq!(cells[8].parse::<f64>().ok(), row["weight"].as_f64());
        // Times in ISO 8601 (UTC, to the second); numbers without float noise.
        let from_ms = row["from_ms"].as_i64().expect("from");
        assert_eq!(cells[10], tessera_core::clock::iso8601(from_ms));
        assert!(cells[10].ends_with('Z') && cells[10].len() == 20, "{}", cells[10]);
        assert!(cells[13].split('.').nth(1).is_none_or(|d| d.len() <= 1), "slice-seconds to 0.1: {}", cells[13]);
        assert!(cells[14].split('.').nth(1).is_none_or(|d| d.len() <= 4), "GPU-hours to 0.0001: {}", cells[14]);
    }
    // JSON stays the default; `format=json` is the same.
    let (s, v) = app.get(&format!("{query}&format=json"), &alice).await;
    assert_eq!((s, v["allocations"].as_array().map(Vec::len)), (StatusCode::OK, Some(3)));
    assert_eq!((v["allocation_count"].as_u64(), v["idle_count"].as_u64()), (Some(3), Some(0)));

    // A limit answers that many allocations in the attention order (none idle: the most GPU-hours first), with the
    // sums and counts of all of them; the CSV file stays whole.
    for limit in [0, 1, 2, 3, 10] {
        let (s, v) = app.get(&format!("{query}&limit={limit}"), &alice).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        let rows = v["allocations"].as_array().expect("rows");
        assert_eq!(rows.len(), limit.min(3), "{v:#}");
        assert_eq!((v["allocation_count"].as_u64(), v["idle_count"].as_u64()), (Some(3), Some(0)));
        // Sums of all (their seconds grow with the clock between the two reads: the counts are compared).
        let counts = |r: &Value, key: &str| -> Vec<(String, u64)> {
            let rows = r[key].as_array().expect("sums");
            rows.iter()
                .map(|x| (format!("{}{}", x["tenant"], x["profile"]), x["allocations"].as_u64().expect("a count")))
                .collect()
        };
        assert_eq!(counts(&v, "tenants"), counts(&report, "tenants"));
        assert_eq!(counts(&v, "profiles"), counts(&report, "profiles"));
        let hours: Vec<f64> = rows.iter().filter_map(|r| r["gpu_hours"].as_f64()).collect();
        assert!(hours.windows(2).all(|w| w[0] >= w[1]), "most GPU-hours first: {hours:?}");
    }
    let r = app.client.get(format!("{}{query}&format=csv&limit=1", app.base)).bearer_auth(&alice).send().await;
    assert_eq!(r.expect("send").text().await.expect("csv").lines().count(), 4, "the CSV file is whole");

    for (params, status, expected) in [
        ("format=xml", StatusCode::UNPROCESSABLE_ENTITY, "invalid_format"),
        ("idle_below=101", StatusCode::UNPROCESSABLE_ENTITY, "invalid_idle"),
        ("idle_below=-1", StatusCode::UNPROCESSABLE_ENTITY, "invalid_idle"),
        ("idle_hours=0.001", StatusCode::UNPROCESSABLE_ENTITY, "invalid_idle"),
        ("idle_hours=721", StatusCode::UNPROCESSABLE_ENTITY, "invalid_idle"),
        ("idle_hours=NaN", StatusCode::UNPROCESSABLE_ENTITY, "invalid_idle"),
        ("idle_below=lots", StatusCode::BAD_REQUEST, "invalid_query"),
        ("from=10&to=5", StatusCode::UNPROCESSABLE_ENTITY, "usage_range"),
        ("limit=100001", StatusCode::UNPROCESSABLE_ENTITY, "invalid_limit"),
        ("limit=-1", StatusCode::BAD_REQUEST, "invalid_query"),
    ] {
        let (s, v) = app.get(&format!("/api/v1/usage?{params}"), &alice).await;
        assert_eq!((s, code(&v)), (status, expected), "{params}: {v}");
    }
}

/// Allocations whose load is known (minute rows written as the telemetry flush writes them): a 3g.40gb that peaked
/// at 6,000 MiB and sat at 10 % for 95 % of its minutes fits a 1g.10gb with 20 % headroom; a busy 1g.10gb is at its
/// limit; a 2g.20gb with half an hour of telemetry is not judged; the window, the headroom and who sees what hold.
async fn rightsizing_finds_the_smallest_slice_that_carries_a_known_load(db: &TestDb) {
    let app = spawn(db).await;
    let t = app.limited_tenant("sizers", json!({}), 7).await;
    let (_, alice) = app.user("alice", &[(&t, Role::Member)]).await;
    let (_, big) = app.active(&alice, &t, "3g.40gb", 1).await;
    let (_, busy) = app.active(&alice, &t, "1g.10gb", 1).await;
    let (_, young) = app.active(&alice, &t, "2g.20gb", 1).await;
    let (big, busy, young) = (&big[0], &busy[0], &young[0]);
    let field = |a: &Value, f: &str| a[f].as_str().expect(f).to_string();
    for a in [big, busy, young] {
        app.backdate(db, &field(a, "id"), 4 * 3_600_000).await;
    }
    let now = now_ms();
    let this_minute = now - now.rem_euclid(60_000);
    let row = |a: &Value, k: i64, util: f64, mem_avg: f64, mem_max: Option<f64>| MinuteRow {
        profile: a["profile"].as_str().map(str::to_string),
        mem_used_avg: mem_avg,
        mem_used_max: mem_max,
        util_max: (util * 1.2).min(100.0),
        ..minute(&app, &field(a, "device_uuid"), &field(a, "gpu_uuid"), this_minute - k * 60_000, util)
    };
    let mut rows = Vec::new();
    // 120 minutes: 114 at 10.2 % and 6 at 70 %; memory 3,000 MiB on average, 6,000 at its peak once. The peak is
    // what counts, not the mean.
    for k in 1..=120 {
        let util = if k % 20 == 0 { 70.0 } else { 10.2 };
        rows.push(row(big, k, util, 3_000.0, Some(if k == 7 { 6_000.0 } else { 3_500.0 })));
        rows.push(row(busy, k, 90.0, 100.0, Some(150.0)));
    }
    // Rows written before peaks were kept count their mean.
    rows.push(row(busy, 121, 90.0, 4_000.0, None));
    rows.extend((1..=30).map(|k| row(young, k, 1.0, 100.0, Some(100.0))));
    app.state.store.write_minutes(&rows).await.expect("minutes");

    let of = |v: &Value, a: &Value| -> Value {
        let found = v["allocations"].as_array().expect("rows").iter().find(|r| r["allocation"] == a["id"]).cloned();
        found.unwrap_or_else(|| panic!("no row for {a} in {v:#}"))
    };
    let (s, v) = app.get(&format!("/api/v1/rightsizing?tenant={t}"), &alice).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["headroom_pct"], 20.0);
    assert_eq!(v["allocations"].as_array().map(Vec::len), Some(3), "{v:#}");
    let b = of(&v, big);
    assert_eq!(
        (b["verdict"].as_str(), b["suggested_profile"].as_str(), b["minutes"].as_u64()),
        (Some("smaller"), Some("1g.10gb"), Some(120)),
        "{b:#}"
    );
    // 95 % of 120 minutes is 114: the 10 % bucket, reported at its upper edge.
    assert_eq!((b["p95_util_pct"].as_f64(), b["peak_mem_mib"].as_f64()), (Some(10.5), Some(6_000.0)), "{b:#}");
    assert!((b["need_compute_slices"].as_f64().expect("need") - 0.105 * 3.0 * 1.2).abs() < 1e-9, "{b:#}");
    assert!((b["need_mem_mib"].as_f64().expect("need") - 7_200.0).abs() < 1e-9, "{b:#}");
    assert_eq!((b["compute_slices"].as_u64(), b["compute_slices_saved"].as_u64()), (Some(3), Some(2)), "{b:#}");
    assert_eq!((b["memory_slices_saved"].as_u64(), b["slice_hours_saved_per_day"].as_f64()), (Some(3), Some(48.0)));
    // Over the window it was held (4 hours): two slices for 4 hours.
    let saved = b["slice_hours_saved"].as_f64().expect("saved");
    assert!((saved - 8.0).abs() < 0.01, "{b:#}");
    let u = of(&v, busy);
    assert_eq!((u["verdict"].as_str(), u["p95_util_pct"].as_f64()), (Some("at_limit"), Some(90.5)), "{u:#}");
    assert_eq!(u["peak_mem_mib"].as_f64(), Some(4_000.0), "the mean of a row without a peak: {u:#}");
    let y = of(&v, young);
    assert_eq!((y["verdict"].as_str(), y["minutes"].as_u64()), (Some("not_enough_data"), Some(30)), "{y:#}");
    // Smaller first; the totals are theirs.
    assert_eq!(v["allocations"][0]["allocation"], big["id"]);
    assert_eq!((v["smaller"].as_u64(), v["compute_slices_saved"].as_u64()), (Some(1), Some(2)));
    assert_eq!(v["slice_hours_saved_per_day"].as_f64(), Some(48.0));

    // The CLI prints the same report.
    let (code, out) = app.cli(&alice, &["request", "rightsize", "--tenant", &t]).await;
    assert_eq!(code, Some(0), "{out}");
    let printed: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(
        (printed["smaller"].as_u64(), of(&printed, big)["suggested_profile"].as_str()),
        (Some(1), Some("1g.10gb"))
    );

    // No headroom: the busy 1g.10gb needs 0.905 of its slice, right-sized; 6,000 MiB still fits a 1g.10gb.
    let (_, v) = app.get(&format!("/api/v1/rightsizing?tenant={t}&headroom_pct=0"), &alice).await;
    assert_eq!(of(&v, busy)["verdict"], "right_sized", "{v:#}");
    assert_eq!(of(&v, big)["suggested_profile"], "1g.10gb");
    // 100 % headroom: 12,000 MiB needs a 1g.20gb.
    let (_, v) = app.get(&format!("/api/v1/rightsizing?tenant={t}&headroom_pct=100"), &alice).await;
    assert_eq!(of(&v, big)["suggested_profile"], "1g.20gb", "{v:#}");
    // The window: the last day holds the same minutes; all of them are within it.
    let (_, v) = app.get(&format!("/api/v1/rightsizing?tenant={t}&days=1"), &alice).await;
    assert_eq!(of(&v, big)["minutes"], 120);

    // Bounds, each with its code.
    let unprocessable = StatusCode::UNPROCESSABLE_ENTITY;
    for (query, status, code) in [
        ("days=0", unprocessable, "invalid_days"),
        ("days=31", unprocessable, "invalid_days"),
        ("days=99999999999", StatusCode::BAD_REQUEST, "invalid_query"),
        ("headroom_pct=-1", unprocessable, "invalid_headroom"),
        ("headroom_pct=100.5", unprocessable, "invalid_headroom"),
        ("headroom_pct=NaN", unprocessable, "invalid_headroom"),
    ] {
        let (s, v) = app.get(&format!("/api/v1/rightsizing?{query}"), &alice).await;
        assert_eq!((s, v["code"].as_str()), (status, Some(code)), "{query}: {v}");
    }
    // A member of another tenant sees none of it, and may not name this tenant; the admin sees the fleet.
    let other = app.limited_tenant("others", json!({}), 1).await;
    let (_, olga) = app.user("olga", &[(&other, Role::Member)]).await;
    let (s, v) = app.get("/api/v1/rightsizing", &olga).await;
    assert_eq!((s, v["allocations"].clone()), (StatusCode::OK, json!([])));
    let (s, _) = app.get(&format!("/api/v1/rightsizing?tenant={t}"), &olga).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, v) = app.get("/api/v1/rightsizing", &app.admin).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(of(&v, big)["tenant"], "sizers");
}

/// "Request the smaller slice": a new request of the smaller profile, checked like any other; both are held until
/// it is active, and then the old request is released in the same transaction, by `system:rightsize`.
async fn the_smaller_slice_replaces_its_request_once_active(db: &TestDb) {
    let app = spawn(db).await;
    let t = app.limited_tenant("shrinkers", json!({}), 5).await;
    let (_, alice) = app.user("alice", &[(&t, Role::Member)]).await;
    let (old, held) = app.active(&alice, &t, "3g.40gb", 1).await;
    let allocation = held[0]["id"].as_str().expect("id").to_string();
    let path = format!("/api/v1/allocations/{allocation}/rightsize");
    let held_quota = |v: &Value| -> f64 {
        let lines = v["resources"].as_array().expect("lines");
        lines.iter().find(|l| l["resource"] == "compute_slices").and_then(|l| l["held"].as_f64()).expect("held")
    };

    // Refused, each with its code, and nothing created.
    let long = "x".repeat(65);
    for (body, status, code) in [
        (json!({"profile": "3g.40gb"}), StatusCode::UNPROCESSABLE_ENTITY, "not_smaller"),
        (json!({"profile": "4g.40gb"}), StatusCode::UNPROCESSABLE_ENTITY, "not_smaller"),
        (json!({"profile": "1g.10gb+me"}), StatusCode::UNPROCESSABLE_ENTITY, "not_smaller"),
        (json!({"profile": "9g.900gb"}), StatusCode::UNPROCESSABLE_ENTITY, "unknown_profile"),
        (json!({"profile": long}), StatusCode::UNPROCESSABLE_ENTITY, "value_too_long"),
        (json!({"profile": "1g.10gb", "reason": "x".repeat(2001)}), StatusCode::UNPROCESSABLE_ENTITY, "invalid_reason"),
        (json!({"profile": "1g.10gb", "extra": 1}), StatusCode::UNPROCESSABLE_ENTITY, "invalid_body"),
    ] {
        let (s, v) = app.send(Method::POST, &path, &alice, Some(body.clone())).await;
        assert_eq!((s, v["code"].as_str()), (status, Some(code)), "{body}: {v}");
    }
    let (s, _) =
        app.send(Method::POST, "/api/v1/allocations/nope/rightsize", &alice, Some(json!({"profile": "1g.10gb"}))).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let other = app.limited_tenant("others", json!({}), 7).await;
    let (_, olga) = app.user("olga", &[(&other, Role::Member)]).await;
    let (s, _) = app.send(Method::POST, &path, &olga, Some(json!({"profile": "1g.10gb"}))).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "another tenant's member");
    let (_, list) = app.get(&format!("/api/v1/requests?tenant={t}"), &alice).await;
    assert_eq!(list["items"].as_array().map(Vec::len), Some(1), "nothing created: {list}");

    // Asked (with the CLI): as many slices as the request holds, of the smaller profile, pending like any request
    // of the tenant.
    let (code, out) = app.cli(&alice, &["request", "resize", &allocation, "--profile", "1g.10gb"]).await;
    assert_eq!(code, Some(0), "{out}");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["replaces"], old.as_str());
    let new = v["request"].clone();
    assert_eq!((new["spec"]["profile"].as_str(), new["count"].as_u64()), (Some("1g.10gb"), Some(1)), "{new}");
    assert!(new["reason"].as_str().expect("reason").contains(&old), "{new}");
    assert!(new["duration_s"].is_null(), "an unlimited request's replacement is unlimited: {new}");
    // One at a time; and until it is active both are held.
    let (s, v) = app.send(Method::POST, &path, &alice, Some(json!({"profile": "2g.20gb"}))).await;
    assert_eq!((s, v["code"].as_str()), (StatusCode::CONFLICT, Some("replacement_open")), "{v}");
    let (_, quota) = app.get(&format!("/api/v1/tenants/{t}/quotas"), &alice).await;
    assert_eq!(held_quota(&quota), 4.0, "{quota}");
    // A 2g.20gb would not fit the quota beside them (4 + 2 > 5).
    let (s, v) = app.ask(&alice, &t, "2g.20gb", 1).await;
    assert_eq!((s, v["code"].as_str()), (StatusCode::CONFLICT, Some("quota_exceeded")), "{v}");

    // Approved and reported: the new request is active and the old one released, by system:rightsize.
    let (new_id, _) = app.activate(&t, &new, 1).await;
    let (_, old_now) = app.get(&format!("/api/v1/requests/{old}"), &alice).await;
    assert_eq!(old_now["state"], "released", "{old_now}");
    assert!(old_now["reason"].as_str().expect("reason").contains(&new_id), "{old_now}");
    let (_, history) = app.get(&format!("/api/v1/audit?object=request/{old}"), &app.admin).await;
    let last = history.as_array().and_then(|h| h.last()).expect("entry").clone();
    assert_eq!((last["action"].as_str(), last["actor"].as_str()), (Some("request.released"), Some("system:rightsize")));
    let (_, allocations) = app.get(&format!("/api/v1/allocations?tenant={t}"), &alice).await;
    let live: Vec<&str> = allocations.as_array().expect("list").iter().filter_map(|a| a["profile"].as_str()).collect();
    assert_eq!(live, ["1g.10gb"], "{allocations}");
    let (_, quota) = app.get(&format!("/api/v1/tenants/{t}/quotas"), &alice).await;
    assert_eq!(held_quota(&quota), 1.0, "{quota}");
    // The released allocation is not resized again.
    let (s, v) = app.send(Method::POST, &path, &alice, Some(json!({"profile": "1g.10gb"}))).await;
    assert_eq!((s, v["code"].as_str()), (StatusCode::CONFLICT, Some("allocation_not_active")), "{v}");
}

/// A request of several slices is replaced whole, so each of its other slices must fit the smaller profile; a
/// platform admin shrinking a tenant they are not in gives a reason; two replacements asked for at once make one.
async fn a_request_is_replaced_whole_and_by_one_request_at_a_time(db: &TestDb) {
    let app = spawn(db).await;
    let t = app.limited_tenant("pairs", json!({}), 14).await;
    let (_, alice) = app.user("alice", &[(&t, Role::Member)]).await;
    let (_, mixed) = app.active(&alice, &t, "2g.20gb", 2).await;
    let (light_id, light) = app.active(&alice, &t, "2g.20gb", 2).await;
    let field = |a: &Value, f: &str| a[f].as_str().expect(f).to_string();
    for a in mixed.iter().chain(&light) {
        app.backdate(db, &field(a, "id"), 4 * 3_600_000).await;
    }
    let now = now_ms();
    let this_minute = now - now.rem_euclid(60_000);
    let mut rows = Vec::new();
    for (a, util) in [(&mixed[0], 5.0), (&mixed[1], 90.0), (&light[0], 5.0), (&light[1], 5.0)] {
        for k in 1..=90 {
            rows.push(MinuteRow {
                profile: Some("2g.20gb".into()),
                mem_used_max: Some(1_000.0),
                ..minute(&app, &field(a, "device_uuid"), &field(a, "gpu_uuid"), this_minute - k * 60_000, util)
            });
        }
    }
    app.state.store.write_minutes(&rows).await.expect("minutes");
    let path = |a: &Value| format!("/api/v1/allocations/{}/rightsize", field(a, "id"));
    let smaller = json!({"profile": "1g.10gb"});

    // The busy sibling needs both of its slices: the request is not shrunk for its idle one.
    let (s, v) = app.send(Method::POST, &path(&mixed[0]), &alice, Some(smaller.clone())).await;
    assert_eq!((s, v["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("siblings_do_not_fit")), "{v}");
    assert!(v["detail"].as_str().expect("detail").contains(&field(&mixed[1], "id")), "{v}");
    // The admin is no member of the tenant: a reason, or nothing.
    let (s, v) = app.send(Method::POST, &path(&light[0]), &app.admin, Some(smaller.clone())).await;
    assert_eq!((s, v["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("reason_required")), "{v}");
    // Two at once (from both slices of the idle request): one replacement, one refusal.
    let (first, second) = (path(&light[0]), path(&light[1]));
    let (a, b) = tokio::join!(
        app.send(Method::POST, &first, &alice, Some(smaller.clone())),
        app.send(Method::POST, &second, &alice, Some(smaller.clone())),
    );
    let mut statuses = [a.0, b.0];
    statuses.sort();
    assert_eq!(statuses, [StatusCode::CREATED, StatusCode::CONFLICT], "{} / {}", a.1, b.1);
    let made = if a.0 == StatusCode::CREATED { &a.1 } else { &b.1 };
    let refused = if a.0 == StatusCode::CREATED { &b.1 } else { &a.1 };
    assert_eq!(refused["code"], "replacement_open", "{refused}");
    assert_eq!((made["replaces"].as_str(), made["request"]["count"].as_u64()), (Some(light_id.as_str()), Some(2)));
    let (_, list) = app.get(&format!("/api/v1/requests?tenant={t}"), &alice).await;
    let asked: Vec<&Value> =
        list["items"].as_array().expect("items").iter().filter(|r| r["spec"]["profile"] == "1g.10gb").collect();
    assert_eq!(asked.len(), 1, "{list}");
}

/// A 3g.40gb of an H100 (7 compute slices) held for 3 hours at 25 % utilisation: the efficiency report and the daily
/// history cost it at the price list's rate, once a price is set; the price list's bounds; the history is sampled
/// once per slot, keeps 90 days, and is for platform admins.
async fn prices_cost_what_is_held_and_wasted_and_the_history_keeps_each_day(db: &TestDb) {
    let app = spawn(db).await;
    let t = app.limited_tenant("payers", json!({}), 7).await;
    let (_, alice) = app.user("alice", &[(&t, Role::Member)]).await;
    let (_, held) = app.active(&alice, &t, "3g.40gb", 1).await;
    let a = &held[0];
    let field = |f: &str| a[f].as_str().expect(f).to_string();
    let model = field("model");
    app.backdate(db, &field("id"), 3 * 3_600_000).await;
    let now = now_ms();
    let this_minute = now - now.rem_euclid(60_000);
    // Stored minutes at 25 % from 180 to 16 minutes ago: before the live window, which holds none of this device.
    let rows: Vec<MinuteRow> = (16..=180)
        .map(|k| MinuteRow {
            profile: Some("3g.40gb".into()),
            ..minute(&app, &field("device_uuid"), &field("gpu_uuid"), this_minute - k * 60_000, 25.0)
        })
        .collect();
    app.state.store.write_minutes(&rows).await.expect("minutes");
    let close = |v: &Value, want: f64| (v.as_f64().unwrap_or(f64::NAN) - want).abs() < 1e-3;

    // No price yet: GPU-hours, no cost.
    let tenant_of = |v: &Value| -> Value {
        let rows = v["tenants"].as_array().expect("tenants");
        rows.iter().find(|r| r["tenant_id"] == t.as_str()).cloned().unwrap_or_else(|| panic!("{v:#}"))
    };
    let (s, v) = app.get("/api/v1/efficiency?hours=2", &app.admin).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let row = tenant_of(&v);
    assert!(close(&row["held_slice_hours"], 6.0) && close(&row["held_gpu_hours"], 6.0 / 7.0), "{row:#}");
    assert!(close(&row["wasted_gpu_hours"], 6.0 / 7.0 * 0.75), "{row:#}");
    assert_eq!(
        (row["held_cost"].clone(), row["waste_cost"].clone(), v["currency"].clone()),
        (Value::Null, Value::Null, Value::Null)
    );
    assert!(close(&row["unpriced_gpu_hours"], 6.0 / 7.0) && close(&v["unpriced_gpu_hours"], 6.0 / 7.0), "{row:#}");
    let (s, v) = app.get("/api/v1/prices", &alice).await;
    assert_eq!((s, v["currency"].clone(), v["models"].clone()), (StatusCode::OK, Value::Null, json!([])));

    // The price list's bounds, none of which changes it.
    let put = |body: Value, token: String| {
        let app = &app;
        async move { app.send(Method::PUT, "/api/v1/prices", &token, Some(body)).await }
    };
    let admin = app.admin.clone();
    for (body, want) in [
        (json!({"currency": "eur", "models": []}), "invalid_currency"),
        (json!({"currency": "EURO", "models": []}), "invalid_currency"),
        (json!({"currency": "EUR", "models": [{"model": "nope", "per_gpu_hour": 1.0}]}), "unknown_model"),
        (json!({"currency": "EUR", "models": [{"model": model, "per_gpu_hour": -0.5}]}), "invalid_price"),
        (json!({"currency": "EUR", "models": [{"model": model, "per_gpu_hour": 1_000_000.5}]}), "invalid_price"),
        (
            json!({"currency": "EUR", "models": [{"model": model, "per_gpu_hour": 1.0}, {"model": model, "per_gpu_hour": 2.0}]}),
            "duplicate_model",
        ),
        (json!({"currency": "EUR", "models": [{"model": "x".repeat(65), "per_gpu_hour": 1.0}]}), "value_too_long"),
    ] {
        let (s, v) = put(body.clone(), admin.clone()).await;
        assert_eq!((s, code(&v)), (StatusCode::UNPROCESSABLE_ENTITY, want), "{body}: {v}");
    }
    let (s, v) = put(json!({"currency": "EUR", "models": [], "extra": 1}), admin.clone()).await;
    assert_eq!((s, code(&v)), (StatusCode::UNPROCESSABLE_ENTITY, "invalid_body"), "{v}");
    let (s, v) =
        put(json!({"currency": "EUR", "models": [{"model": model, "per_gpu_hour": 7.0}]}), alice.clone()).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    let (_, v) = app.get("/api/v1/prices", &alice).await;
    assert_eq!(v["models"], json!([]), "refusals change nothing");

    // 7 EUR per H100-hour: the 3g costs 3 EUR an hour, and three quarters of it is wasted.
    let (s, v) =
        put(json!({"currency": "EUR", "models": [{"model": model, "per_gpu_hour": 7.0}]}), admin.clone()).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        (v["currency"].as_str(), v["models"][0]["model"].as_str(), v["updated_by"].as_str()),
        (Some("EUR"), Some(model.as_str()), Some("user:admin"))
    );
    let (_, v) = app.get("/api/v1/efficiency?hours=2", &app.admin).await;
    let row = tenant_of(&v);
    assert!(close(&row["held_cost"], 6.0) && close(&row["waste_cost"], 4.5), "{row:#}");
    assert!(close(&row["unpriced_gpu_hours"], 0.0) && close(&v["waste_cost"], 4.5), "{v:#}");
    assert!(close(&v["unpriced_gpu_hours"], 0.0), "{v:#}");
    assert_eq!(v["currency"], "EUR");
    let (_, audit) = app.get("/api/v1/audit/entries?action=prices.set", &app.admin).await;
    assert_eq!(audit["entries"].as_array().map(Vec::len), Some(1), "{audit}");
    let after: Value = serde_json::from_str(audit["entries"][0]["after"].as_str().expect("after")).expect("json");
    assert_eq!(after, json!([{"model": model, "currency": "EUR", "per_gpu_hour": 7.0}]));

    // History: two samples in one slot count once, a second slot counts again; the days before hold capacity only.
    let record = tessera_server::services::efficiency::record;
    let day = 86_400_000;
    let today = now - now.rem_euclid(day);
    let slot = 600_000;
    let at = today + (now - today) / slot * slot;
    for when in [at - 2 * day, at - day, at, at + 1, at - slot] {
        record(&app.state, when).await.expect("record");
    }
    // Too old to keep: written, then dropped by the next sample.
    record(&app.state, at - 95 * day).await.expect("record");
    record(&app.state, at).await.expect("record");
    let (capacity, kept) = app.state.store.efficiency_history(0).await.expect("history");
    assert!(capacity.iter().all(|c| c.day_ms >= today - 89 * day), "{capacity:?}");
    assert!(kept.iter().all(|u| u.day_ms >= today - 89 * day) && !kept.is_empty(), "{kept:?}");
    let (s, v) = app.get("/api/v1/efficiency/history?days=3", &app.admin).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let days = v["days"].as_array().expect("days");
    assert_eq!(days.len(), 3, "{v:#}");
    assert_eq!((v["currency"].as_str(), v["sample_minutes"].as_u64()), (Some("EUR"), Some(10)));
    let last = &days[2];
    assert_eq!(last["day_ms"].as_i64(), Some(today), "{v:#}");
    // In the first 10 minutes of a day, the slot before `at` is yesterday's.
    let (samples_today, samples_yesterday) = if at - slot >= today { (2, 1) } else { (1, 2) };
    assert_eq!(last["samples"].as_u64(), Some(samples_today), "{last:#}");
    assert_eq!((days[0]["samples"].as_u64(), days[1]["samples"].as_u64()), (Some(1), Some(samples_yesterday)));
    assert!(days[0]["gpus"].as_f64().expect("gpus") >= 1.0, "{v:#}");
    // Today's use: held since the later of its start and midnight; measured at 25 %.
    let hours_today = (at - (now - 3 * 3_600_000).max(today)) as f64 / 3_600_000.0;
    assert!((last["held_slice_hours"].as_f64().expect("held") - 3.0 * hours_today).abs() < 0.01, "{last:#}");
    // Measured when today's span holds stored minutes (they end 16 minutes before now).
    if at - today > 20 * 60_000 {
        assert!(close(&last["efficiency"], 0.25), "{last:#}");
    } else {
        assert!(last["efficiency"].is_null() || close(&last["efficiency"], 0.25), "{last:#}");
    }
    assert!(close(&last["unpriced_gpu_hours"], 0.0), "{last:#}");
    let held_cost = last["held_cost"].as_f64().expect("cost");
    assert!((held_cost - 3.0 * hours_today).abs() < 0.01, "{last:#}");
    // Wasted: the unused 75 % of what was held, when measured; nothing is counted wasted unmeasured (the first
    // minutes of a UTC day, before today's span holds stored minutes).
    let unused = if last["efficiency"].is_null() { 0.0 } else { 0.75 };
    assert!((last["waste_cost"].as_f64().expect("waste") - unused * held_cost).abs() < 0.01, "{last:#}");
    assert_eq!(last["day"].as_str().map(str::len), Some(10));
    // Of one model: its capacity alone; another model's days hold no use.
    let (_, one) = app.get(&format!("/api/v1/efficiency/history?days=1&model={model}"), &app.admin).await;
    assert_eq!(one["days"][0]["held_slice_hours"], last["held_slice_hours"], "{one:#}");
    assert!(one["days"][0]["gpus"].as_f64() <= last["gpus"].as_f64(), "{one:#}");
    for (query, want) in [("days=0", "invalid_days"), ("days=91", "invalid_days"), ("model=nope", "unknown_model")] {
        let (s, v) = app.get(&format!("/api/v1/efficiency/history?{query}"), &app.admin).await;
        assert_eq!((s, code(&v)), (StatusCode::UNPROCESSABLE_ENTITY, want), "{query}: {v}");
    }
    let (s, _) = app.get("/api/v1/efficiency/history?days=99999999999", &app.admin).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let (s, _) = app.get("/api/v1/efficiency/history", &alice).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
}

/// What a cluster's objects are built from: the active allocations on its nodes (with their device), whichever
/// tenant holds them; none once the node leaves the cluster or the request is released.
async fn a_clusters_allocations_are_the_active_ones_on_its_nodes(db: &TestDb) {
    let app = spawn(db).await;
    let t = app.limited_tenant("team-a", json!({"auto_approve": true, "auto_approve_max_compute_slices": 8}), 8).await;
    let dev = app.member("ann", &t).await;
    let (s, c) =
        app.send(Method::POST, "/api/v1/clusters", &app.admin, Some(json!({"name": "prod", "mode": "dra"}))).await;
    assert_eq!(s, StatusCode::CREATED, "{c}");
    let cluster = c["id"].as_str().expect("id").to_string();
    assert_eq!(app.store.cluster_allocations(&cluster).await.expect("read"), [], "no nodes yet");
    let (request, active) = app.active(&dev, &t, "1g.10gb", 2).await;
    assert_eq!(app.store.cluster_allocations(&cluster).await.expect("read"), [], "the node is in no cluster");
    let path = format!("/api/v1/nodes/{}/cluster", app.node_id);
    let (s, p) = app.send(Method::PUT, &path, &app.admin, Some(json!({"cluster": "prod"}))).await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{p}");
    let found = app.store.cluster_allocations(&cluster).await.expect("read");
    let mut expected: Vec<(String, String, String)> = active
        .iter()
        .map(|a| {
            (a["id"].as_str().unwrap_or("").into(), a["device_uuid"].as_str().unwrap_or("").into(), "1g.10gb".into())
        })
        .collect();
    expected.sort();
    let got: Vec<(String, String, String)> =
        found.iter().map(|a| (a.id.clone(), a.device_uuid.clone(), a.profile.clone())).collect();
    assert_eq!(got, expected);
    assert!(found.iter().all(|a| a.tenant_id == t && a.request_id == request));
    let (s, v) = app.send(Method::POST, &format!("/api/v1/requests/{request}/release"), &dev, None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(app.store.cluster_allocations(&cluster).await.expect("read"), [], "released: nothing to claim");
}

/// A standing reads the hours since the last one kept with what was held and used all through them summed per
/// tenant: a request active for three hours says the same whether its hours were read whole (the first standing
/// after it moved back, from its hour) or summed from the current hour (the next, once those hours are kept).
async fn the_standing_of_the_hours_since_the_kept_ones_sums_what_was_held_all_through_them(db: &TestDb) {
    let app = spawn(db).await;
    let t = app.limited_tenant("steady", json!({}), 7).await;
    let (_, alice) = app.user("alice", &[(&t, Role::Member)]).await;
    let (request, _) = app.active(&alice, &t, "2g.20gb", 2).await;
    let (_, small) = app.active(&alice, &t, "1g.10gb", 1).await;
    let at = now_ms() - 3 * 3_600_000 - 600_000;
    app.state.store.backdate_request(&request, at).await.expect("moved back");
    let line = |st: &Value| -> Value {
        let steady = st["tenants"].as_array().and_then(|a| a.iter().find(|x| x["name"] == "steady")).cloned();
        let lines = steady.expect("steady")["lines"].as_array().cloned().unwrap_or_default();
        lines.into_iter().find(|l| l["resource"] == "compute_slices").expect("a compute line")
    };
    let (s, first) = app.get("/api/v1/quota-standing", &app.admin).await;
    assert_eq!(s, StatusCode::OK, "{first}");
    // Kept now up to the current hour (or the one before while it settles): the next standing reads from there,
    // where the moved request was held and used all through.
    let (s, next) = app.get("/api/v1/quota-standing", &app.admin).await;
    assert_eq!(s, StatusCode::OK, "{next}");
    let (a, b) = (line(&first), line(&next));
    assert_eq!((a["held"].clone(), a["peak_held_30d"].clone()), (json!(5.0), json!(5.0)), "{first}");
    assert_eq!((b["held"].clone(), b["peak_held_30d"].clone()), (json!(5.0), json!(5.0)), "{next}");
    // Four slices in use for three hours and more, the fifth since now: over 30 days of hours, about 12 slice-hours
    // and a little.
    let (used_a, used_b) = (a["mean_used_30d"].as_f64().expect("mean"), b["mean_used_30d"].as_f64().expect("mean"));
    assert!((used_a - used_b).abs() <= 0.002, "{used_a} then {used_b}");
    let hours = 30.0 * 24.0;
    assert!(used_b > 4.0 * 3.0 / hours && used_b < (4.0 * 4.2 + 1.2) / hours, "{used_b}");
    assert!(!small.is_empty());
}
