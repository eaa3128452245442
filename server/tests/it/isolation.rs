//! The tenant isolation matrix, generated from the OpenAPI description: every operation declares the role it
//! needs (its security scopes), and every operation is called by everybody on tenant B's objects. A route added
//! without a role, a fixture for its path parameters or a body fails this test, so none can be forgotten.
//!
//! - Nobody signed in: 401. A node credential on a user route, or a user credential on an agent route: 403.
//! - Members and tenant admins of tenant A acting on tenant B's objects: 404, with nothing of B in the answer.
//! - Tenant-admin routes: B's plain member gets 403. Platform-admin routes: every non-admin gets 403 (or 404).
//! - The rightful caller gets past authorization (not 401, 403 or 404), so the 404s above are not fixture typos.

use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use tessera_server::http::auth::{new_node_secret, new_token_secret, token_hash};
use tessera_server::store::{Role, Store};

use crate::harness::TestApp;

struct World {
    base: String,
    store: Store,
    admin: String,
    a_member: String,
    a_admin: String,
    b_member: String,
    b_admin: String,
    node: String,
    b_tenant: String,
    b_user: String,
    b_spare: String,
    b_token_ids: Vec<String>,
    b_requests: Vec<String>,
    /// The allocation of B's approved request.
    b_allocation: String,
    b_quota_requests: Vec<String>,
    b_reservations: Vec<String>,
    b_webhooks: Vec<String>,
    b_delivery: String,
    gpu: String,
    node_id: String,
    join_token_id: String,
    layout: String,
    cohort: String,
    /// A cluster in which B has a namespace (so that deleting the cluster is refused).
    cluster: String,
    _app: TestApp,
}

/// Names that must never show up in an answer to a caller outside tenant B.
const B_NAME: &str = "tenant-b-secret";
const B_USER: &str = "bea-of-b";

async fn user(app: &TestApp, name: &str, tenant: &str, role: Role) -> (String, String) {
    app.user(name, &[(tenant, role)]).await
}

async fn world() -> World {
    let app = TestApp::sqlite().start().await;
    let (base, admin, store) = (app.base.clone(), app.admin.clone(), app.store.clone());
    let client = Client::new();
    let call = |method: Method, path: &str, body: Value| {
        client.request(method, format!("{base}{path}")).bearer_auth(&admin).json(&body).send()
    };
    let mut tenants = Vec::new();
    for name in ["tenant-a", B_NAME] {
        let r = call(Method::POST, "/api/v1/tenants", json!({"name": name})).await.expect("send");
        assert_eq!(r.status(), StatusCode::CREATED);
        let id = r.json::<Value>().await.expect("json")["id"].as_str().expect("id").to_string();
        let r = call(Method::PUT, &format!("/api/v1/tenants/{id}/quotas"), json!({"limits": {"compute_slices": 50}}))
            .await
            .expect("send");
        assert!(r.status().is_success(), "{}", r.text().await.unwrap_or_default());
        tenants.push(id);
    }
    let (a, b) = (tenants[0].clone(), tenants[1].clone());
    let (_, a_member) = user(&app, "al-of-a", &a, Role::Member).await;
    let (_, a_admin) = user(&app, "ace-of-a", &a, Role::TenantAdmin).await;
    let (b_user, b_member) = user(&app, B_USER, &b, Role::Member).await;
    let (_, b_admin) = user(&app, "boss-of-b", &b, Role::TenantAdmin).await;
    // Removed from B by the matrix (removing `b_user` would take B's member out of every later call).
    let (b_spare, _) = user(&app, "spare-of-b", &b, Role::Member).await;
    let mut b_token_ids = Vec::new();
    for i in 0..8 {
        b_token_ids.push(
            store
                .create_token(&b_user, &format!("spare-{i}"), &token_hash(&new_token_secret()), "test")
                .await
                .expect("token"),
        );
    }
    let mut b_requests = Vec::new();
    for _ in 0..8 {
        let r = client
            .post(format!("{base}/api/v1/requests"))
            .bearer_auth(&b_member)
            .json(
                &json!({"tenant": b, "spec": {"mode": "mig", "profile": "1g.10gb", "model": "H100-80GB"}, "count": 1}),
            )
            .send()
            .await
            .expect("send");
        assert!(r.status().is_success(), "{:?}", r.text().await);
        b_requests.push(r.json::<Value>().await.expect("json")["id"].as_str().expect("id").to_string());
    }
    let mut b_quota_requests = Vec::new();
    for i in 0..8 {
        let r = client
            .post(format!("{base}/api/v1/tenants/{b}/quota-requests"))
            .bearer_auth(&b_admin)
            .json(&json!({"limits": {"compute_slices": 60 + i}, "reason": "matrix"}))
            .send()
            .await
            .expect("send");
        assert!(r.status().is_success(), "{:?}", r.text().await);
        b_quota_requests.push(r.json::<Value>().await.expect("json")["id"].as_str().expect("id").to_string());
    }
    let mut b_reservations = Vec::new();
    let day = 86_400_000;
    for i in 0..8 {
        let start = tessera_server::store::now_ms() + (i + 1) * day;
        let r = client
            .post(format!("{base}/api/v1/tenants/{b}/reservations"))
            .bearer_auth(&b_member)
            .json(&json!({"spec": {"mode": "mig", "profile": "1g.10gb", "model": "H100-80GB"}, "count": 1,
                          "start_ms": start, "end_ms": start + 3_600_000}))
            .send()
            .await
            .expect("send");
        assert!(r.status().is_success(), "{:?}", r.text().await);
        b_reservations.push(r.json::<Value>().await.expect("json")["id"].as_str().expect("id").to_string());
    }
    // B's webhook endpoints (to a port nobody listens on), and a delivery of a test event to the first.
    let mut b_webhooks = Vec::new();
    for _ in 0..8 {
        let r = client
            .post(format!("{base}/api/v1/tenants/{b}/webhooks"))
            .bearer_auth(&b_admin)
            .json(&json!({"url": "http://127.0.0.1:9/hook"}))
            .send()
            .await
            .expect("send");
        assert!(r.status().is_success(), "{:?}", r.text().await);
        b_webhooks.push(r.json::<Value>().await.expect("json")["webhook"]["id"].as_str().expect("id").to_string());
    }
    let r = client
        .post(format!("{base}/api/v1/webhooks/{}/test", b_webhooks[0]))
        .bearer_auth(&b_admin)
        .send()
        .await
        .expect("send");
    assert!(r.status().is_success(), "{:?}", r.text().await);
    let mut b_delivery = String::new();
    for _ in 0..300 {
        let log: Value = client
            .get(format!("{base}/api/v1/webhooks/{}/deliveries", b_webhooks[0]))
            .bearer_auth(&b_admin)
            .send()
            .await
            .expect("send")
            .json()
            .await
            .expect("json");
        if let Some(id) = log[0]["id"].as_i64() {
            b_delivery = id.to_string();
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(!b_delivery.is_empty(), "the test event was dispatched");
    // One of B's requests is approved.
    let r = client
        .post(format!("{base}/api/v1/requests/{}/approve", b_requests[7]))
        .bearer_auth(&admin)
        .send()
        .await
        .expect("send");
    assert!(r.status().is_success(), "{:?}", r.text().await);
    // Its allocation (reserved, the request being approved).
    let listed: Value = call(Method::GET, &format!("/api/v1/allocations?tenant={b}"), json!(null))
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    let b_allocation = listed[0]["id"].as_str().expect("B's allocation").to_string();
    let nodes: Value = call(Method::GET, "/api/v1/nodes", json!(null)).await.expect("send").json().await.expect("json");
    let node_id = nodes[0]["id"].as_str().expect("node").to_string();
    let gpu = nodes[0]["gpus"][0]["id"].as_str().expect("gpu").to_string();
    let r = call(
        Method::PUT,
        &format!("/api/v1/gpus/{gpu}/layout"),
        json!({"instances": [{"profile": "1g.10gb", "start": 0}]}),
    )
    .await
    .expect("send");
    assert!(r.status().is_success(), "{:?}", r.text().await);
    let layout = r.json::<Value>().await.expect("json")["id"].as_str().expect("a layout proposal").to_string();
    let r = call(Method::POST, "/api/v1/cohorts", json!({"name": "matrix-cohort"})).await.expect("send");
    assert_eq!(r.status(), StatusCode::CREATED);
    let cohort = r.json::<Value>().await.expect("json")["id"].as_str().expect("cohort").to_string();
    let r =
        call(Method::POST, "/api/v1/clusters", json!({"name": "matrix-cluster", "mode": "dra"})).await.expect("send");
    assert_eq!(r.status(), StatusCode::CREATED);
    let cluster = r.json::<Value>().await.expect("json")["id"].as_str().expect("cluster").to_string();
    // `b-matrix` is the fixture of the namespace routes (given up, then given again); `b-kept` stays.
    for ns in ["b-kept", "b-matrix"] {
        let r = call(Method::PUT, &format!("/api/v1/clusters/{cluster}/namespaces/{ns}"), json!({"tenant": b}))
            .await
            .expect("send");
        assert_eq!(r.status(), StatusCode::CREATED);
    }
    let node = new_node_secret();
    store.create_node_credential(&node_id, &token_hash(&node), "test").await.expect("node credential");
    let join_token_id =
        store.create_join_token(&token_hash(&new_token_secret()), None, i64::MAX, "test").await.expect("join token").id;
    World {
        base,
        store,
        admin,
        a_member,
        a_admin,
        b_member,
        b_admin,
        node,
        b_tenant: b,
        b_user,
        b_spare,
        b_token_ids,
        b_requests,
        b_allocation,
        b_quota_requests,
        b_reservations,
        b_webhooks,
        b_delivery,
        gpu,
        node_id,
        join_token_id,
        layout,
        cohort,
        cluster,
        _app: app,
    }
}

/// The role an operation declares (the scope of its `token` or `session` requirement), `public` or `node`.
fn declared_role(op: &Value) -> String {
    let Some(requirements) = op["security"].as_array() else { return "undeclared".into() };
    if requirements.iter().any(|r| r.as_object().is_some_and(|o| o.is_empty())) {
        return "public".into();
    }
    if requirements.iter().any(|r| r.get("node").is_some()) {
        return "node".into();
    }
    let roles: Vec<&str> = requirements
        .iter()
        .filter_map(|r| r.get("token").or_else(|| r.get("session")))
        .filter_map(|s| s.as_array())
        .flat_map(|s| s.iter().filter_map(Value::as_str))
        .collect();
    match roles.first() {
        Some(r) if roles.iter().all(|x| x == r) => (*r).to_string(),
        _ => "undeclared".into(),
    }
}

/// The concrete URL and body for an operation on tenant B's objects. `round` picks a fresh object where a call
/// consumes one.
fn concrete(w: &World, method: &str, template: &str, round: usize) -> (String, Value) {
    let mut path = String::new();
    let segments: Vec<&str> = template.split('/').collect();
    for (i, segment) in segments.iter().enumerate() {
        if i > 0 {
            path.push('/');
        }
        if !(segment.starts_with('{') && segment.ends_with('}')) {
            path.push_str(segment);
            continue;
        }
        let collection = segments[i - 1];
        let value = match (collection, *segment) {
            ("tenants", "{id}") => w.b_tenant.clone(),
            ("members", "{user}") if method == "delete" => w.b_spare.clone(),
            ("members", "{user}") => w.b_user.clone(),
            ("requests", "{id}") => w.b_requests[round % 7].clone(),
            ("allocations", "{id}") => w.b_allocation.clone(),
            ("quota-requests", "{id}") => w.b_quota_requests[round % w.b_quota_requests.len()].clone(),
            ("reservations", "{id}") => w.b_reservations[round % w.b_reservations.len()].clone(),
            ("gpus", "{id}") => w.gpu.clone(),
            ("layouts", "{id}") => w.layout.clone(),
            ("users", "{id}") => w.b_user.clone(),
            ("tokens", "{id}") => w.b_token_ids[round % w.b_token_ids.len()].clone(),
            ("nodes", "{id}") => w.node_id.clone(),
            ("join-tokens", "{id}") => w.join_token_id.clone(),
            ("models", "{model}") => "H100-80GB".into(),
            ("cohorts", "{id}") => w.cohort.clone(),
            ("clusters", "{id}") => w.cluster.clone(),
            ("namespaces", "{namespace}") => "b-matrix".into(),
            // The delivery belongs to the first endpoint, which is never deleted.
            ("webhooks", "{id}") if template.contains("{delivery}") => w.b_webhooks[0].clone(),
            ("webhooks", "{id}") => w.b_webhooks[1 + round % (w.b_webhooks.len() - 1)].clone(),
            ("deliveries", "{delivery}") => w.b_delivery.clone(),
            _ => {
                panic!("{method} {template}: add a fixture for {segment} after `{collection}` to the isolation matrix")
            }
        };
        path.push_str(&value);
    }
    let query = match (method, template) {
        ("get", "/api/v1/requests")
        | ("get", "/api/v1/allocations")
        | ("get", "/api/v1/quota-requests")
        | ("get", "/api/v1/reservations") => {
            format!("?tenant={}", w.b_tenant)
        }
        ("get", "/api/v1/audit") => format!("?object=tenant/{}", w.b_tenant),
        ("get", "/api/v1/usage") | ("get", "/api/v1/rightsizing") => format!("?tenant={}", w.b_tenant),
        ("get", "/auth/link") => "?token=tsl_unknown".to_string(),
        _ => String::new(),
    };
    let unique = uuid::Uuid::now_v7().simple().to_string();
    let body = match (method, template) {
        ("post", "/api/v1/requests") => {
            json!({"tenant": w.b_tenant, "spec": {"mode": "mig", "profile": "1g.10gb", "model": "H100-80GB"}, "count": 1})
        }
        ("post", "/api/v1/tenants") => json!({"name": format!("t{}", &unique[20..])}),
        ("post", "/api/v1/inbox/read") => json!({"up_to": 0}),
        ("put", "/api/v1/notification-settings") => json!({"email_types": ["request.*"]}),
        ("post", "/api/v1/tenants/{id}/webhooks") | ("post", "/api/v1/webhooks") => {
            json!({"url": "http://127.0.0.1:9/hook", "types": ["request.*"]})
        }
        ("put", "/api/v1/tenants/{id}/quotas") => json!({"limits": {"compute_slices": 50}}),
        ("post", "/api/v1/tenants/{id}/quota-requests") | ("post", "/api/v1/tenants/{id}/quota-suggestions") => {
            json!({"limits": {"compute_slices": 70}, "reason": "matrix"})
        }
        ("post", "/api/v1/quota-requests/{id}/approve") => json!({}),
        ("post", "/api/v1/tenants/{id}/reservations") | ("post", "/api/v1/tenants/{id}/reservations/preview") => {
            let start = tessera_server::store::now_ms() + 20 * 86_400_000;
            json!({"spec": {"mode": "mig", "profile": "1g.10gb", "model": "H100-80GB"}, "count": 1,
                   "start_ms": start, "end_ms": start + 3_600_000})
        }
        ("put", "/api/v1/reservation-policy") | ("put", "/api/v1/tenants/{id}/reservation-policy") => {
            json!({"max_duration_s": 604_800, "max_ahead_s": 2_592_000, "max_concurrent": 10})
        }
        ("post", "/api/v1/reservations/{id}/reject") => json!({"reason": "matrix"}),
        ("post", "/api/v1/quota-requests/{id}/reject") => json!({"reason": "matrix"}),
        ("put", "/api/v1/tenants/{id}/members/{user}") => json!({"role": "member"}),
        ("put", "/api/v1/tenants/{id}/policy") => json!({"auto_approve": false}),
        ("post", "/api/v1/cohorts") => json!({"name": format!("c-{}", &unique[20..])}),
        ("patch", "/api/v1/cohorts/{id}") => json!({"grace_s": 60}),
        ("post", "/api/v1/clusters") => json!({"name": format!("c-{}", &unique[20..]), "mode": "dra"}),
        ("patch", "/api/v1/clusters/{id}") => json!({"mode": "dra"}),
        ("put", "/api/v1/clusters/{id}/namespaces/{namespace}") => json!({"tenant": w.b_tenant}),
        ("put", "/api/v1/nodes/{id}/cluster") => json!({"cluster": w.cluster}),
        ("put", "/api/v1/tenants/{id}/cohort") => json!({"cohort": w.cohort, "weight": 2}),
        ("put", "/api/v1/tenants/{id}/budget") => json!({"limits": {"compute_slice_hours": 100}}),
        ("post", "/api/v1/requests/preview") => {
            json!({"tenant": w.b_tenant, "spec": {"mode": "mig", "profile": "1g.10gb", "model": "H100-80GB"}, "count": 1})
        }
        ("post", "/api/v1/requests/{id}/release") => json!({"reason": "matrix"}),
        ("post", "/api/v1/requests/{id}/reject") | ("post", "/api/v1/layouts/{id}/reject") => {
            json!({"reason": "matrix"})
        }
        ("post", "/api/v1/catalog/models/{model}/validate") => json!({"instances": [{"profile": "1g.10gb"}]}),
        ("put", "/api/v1/gpus/{id}/auto-layout") => json!({"enabled": false}),
        ("post", "/api/v1/gpus/{id}/drain") => json!({"deadline_s": 3600, "reason": "isolation"}),
        ("post", "/api/v1/gpus/{id}/cordon" | "/api/v1/gpus/{id}/uncordon") => json!({"reason": "isolation"}),
        ("post", "/api/v1/defragmentation") => json!({"max_gpus": 1}),
        ("post", "/api/v1/allocations/{id}/rightsize") => json!({"profile": "1g.10gb"}),
        ("put", "/api/v1/prices") => json!({"currency": "EUR", "models": []}),
        ("put", "/api/v1/gpus/{id}/layout") => json!({"instances": [{"profile": "1g.10gb", "start": 0}]}),
        ("post", "/api/v1/nodes") => json!({"name": format!("n-{unique}"), "gpus": []}),
        ("post", "/api/v1/tokens") => json!({"name": "matrix"}),
        ("post", "/api/v1/users") => json!({"name": format!("u-{unique}")}),
        ("put", "/api/v1/users/{id}/password") => json!({"password": "a long enough password"}),
        ("post", "/api/v1/join-tokens") => json!({"ttl_s": 60}),
        ("post", "/api/v1/agent/join") => {
            json!({"token": "tsj_unknown", "inventory": {"hostname": "h", "agent_version": "0", "backend": "sim", "gpus": []}})
        }
        ("put", "/api/v1/agent/inventory") => {
            json!({"hostname": "h", "agent_version": "0", "backend": "sim", "gpus": []})
        }
        ("put", "/api/v1/agent/status") => json!({"observed_generation": 0, "gpus": []}),
        ("post", "/api/v1/agent/telemetry") => json!({"dropped": 0, "devices": []}),
        ("post", "/auth/local") => json!({"name": B_USER, "password": "not the password"}),
        _ => Value::Null,
    };
    (format!("{path}{query}"), body)
}

async fn send(w: &World, method: &str, url: &str, body: &Value, token: Option<&str>) -> (StatusCode, String) {
    let method = Method::from_bytes(method.to_ascii_uppercase().as_bytes()).expect("method");
    let mut r = Client::new().request(method, format!("{}{url}", w.base));
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    if !body.is_null() {
        r = r.json(body);
    }
    let r = r.send().await.expect("send");
    // An event stream does not end: its status and headers are the answer.
    let streaming = r.headers().get("content-type").is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if streaming {
        return (r.status(), String::new());
    }
    (r.status(), r.text().await.unwrap_or_default())
}

/// Whether `text` names anything of tenant B that the caller did not send itself (`url`, `body`): its name, its
/// users, or the id of the tenant, a user, a request, an allocation, a token, a quota request, a reservation or a
/// webhook of B.
fn names_b(w: &World, text: &str, url: &str, body: &Value) -> bool {
    let sent = format!("{url} {body}");
    let ids = [&w.b_tenant, &w.b_user, &w.b_spare, &w.b_allocation]
        .into_iter()
        .chain(&w.b_requests)
        .chain(&w.b_token_ids)
        .chain(&w.b_quota_requests)
        .chain(&w.b_reservations)
        .chain(&w.b_webhooks);
    text.contains(B_NAME)
        || text.contains(B_USER)
        || ids.filter(|id| !sent.contains(id.as_str())).any(|id| text.contains(id.as_str()))
}

fn past_authorization(status: StatusCode) -> bool {
    !matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN | StatusCode::NOT_FOUND)
        && !status.is_server_error()
}

#[tokio::test]
async fn every_route_keeps_tenants_apart_and_roles_enforced() {
    let w = world().await;
    let spec: Value = serde_json::to_value(tessera_server::http::openapi()).expect("spec");
    let mut checked = 0;
    let mut failures = Vec::new();
    let mut fail = |what: String| failures.push(what);
    for (template, ops) in spec["paths"].as_object().expect("paths") {
        for (method, op) in ops.as_object().expect("operations") {
            let role = declared_role(op);
            let name = format!("{} {template} [{role}]", method.to_uppercase());
            checked += 1;
            let (url, body) = concrete(&w, method, template, checked);
            if op.get("requestBody").is_some() && body.is_null() {
                panic!("{name}: add a body to the isolation matrix");
            }
            match role.as_str() {
                "public" => {
                    let (status, text) = send(&w, method, &url, &body, None).await;
                    let demands_credentials = text.contains("\"unauthenticated\"") || text.contains("credential\"");
                    if status == StatusCode::FORBIDDEN || demands_credentials {
                        fail(format!("{name}: public route answered {status} {text} without credentials"));
                    }
                    continue;
                }
                "node" => {
                    for (who, token) in [("b member", &w.b_member), ("platform admin", &w.admin)] {
                        let (status, text) = send(&w, method, &url, &body, Some(token)).await;
                        if status != StatusCode::FORBIDDEN || !text.contains("user_credential") {
                            fail(format!("{name}: {who} got {status} {text}"));
                        }
                    }
                    let (status, _) = send(&w, method, &url, &body, None).await;
                    if status != StatusCode::UNAUTHORIZED {
                        fail(format!("{name}: anonymous got {status}"));
                    }
                    let (status, text) = send(&w, method, &url, &body, Some(&w.node)).await;
                    // The WebSocket route, called without an upgrade, gets past authorization to the upgrade check.
                    let upgrade_refused = template.ends_with("/ws") && status == StatusCode::BAD_REQUEST;
                    if !status.is_success() && !upgrade_refused {
                        fail(format!("{name}: the node itself got {status} {text}"));
                    }
                    continue;
                }
                "user" | "tenant-member" | "tenant-admin" | "platform-admin" => {}
                other => {
                    fail(format!("{name}: declares no role (`{other}`): give it security scopes"));
                    continue;
                }
            }
            // Everybody but the rightful caller first (the rightful call may consume the object).
            let (status, _) = send(&w, method, &url, &body, None).await;
            if status != StatusCode::UNAUTHORIZED {
                fail(format!("{name}: anonymous got {status}"));
            }
            let (status, text) = send(&w, method, &url, &body, Some(&w.node)).await;
            if status != StatusCode::FORBIDDEN || !text.contains("node_credential") {
                fail(format!("{name}: a node credential got {status} {text}"));
            }
            let touches_b = url.contains(&w.b_tenant)
                || url.contains(&w.b_user)
                || url.contains(&w.b_spare)
                || url.contains(&w.b_allocation)
                || w.b_requests
                    .iter()
                    .chain(&w.b_token_ids)
                    .chain(&w.b_quota_requests)
                    .chain(&w.b_reservations)
                    .chain(&w.b_webhooks)
                    .any(|id| url.contains(id.as_str()))
                || body.to_string().contains(&w.b_tenant);
            for (who, token) in [("a member", &w.a_member), ("a tenant admin", &w.a_admin)] {
                let (status, text) = send(&w, method, &url, &body, Some(token)).await;
                let leaked = names_b(&w, &text, &url, &body);
                match role.as_str() {
                    "platform-admin" => {
                        if !matches!(status, StatusCode::FORBIDDEN | StatusCode::NOT_FOUND) || leaked {
                            fail(format!("{name}: {who} got {status} {text}"));
                        }
                    }
                    _ if touches_b => {
                        if status != StatusCode::NOT_FOUND || leaked {
                            fail(format!("{name}: {who} on B's object got {status} {text}"));
                        }
                    }
                    // Routes on no particular object: allowed, but nothing of B may show.
                    _ => {
                        if leaked || !past_authorization(status) {
                            fail(format!("{name}: {who} got {status} {text}"));
                        }
                    }
                }
            }
            if role == "tenant-admin" {
                let (status, text) = send(&w, method, &url, &body, Some(&w.b_member)).await;
                if status != StatusCode::FORBIDDEN {
                    fail(format!("{name}: B's plain member got {status} {text}"));
                }
            }
            if role == "platform-admin" {
                for (who, token) in [("b member", &w.b_member), ("b tenant admin", &w.b_admin)] {
                    let (status, text) = send(&w, method, &url, &body, Some(token)).await;
                    if status != StatusCode::FORBIDDEN {
                        fail(format!("{name}: {who} got {status} {text}"));
                    }
                }
            }
            let owner = match role.as_str() {
                "platform-admin" => &w.admin,
                "tenant-admin" => &w.b_admin,
                _ => &w.b_member,
            };
            let (status, text) = send(&w, method, &url, &body, Some(owner)).await;
            if !past_authorization(status) {
                fail(format!("{name}: the rightful caller got {status} {text} (fixture wrong?)"));
            }
        }
    }
    assert!(checked >= 40, "the matrix covered only {checked} operations");
    assert!(failures.is_empty(), "{} isolation failures:\n{}", failures.len(), failures.join("\n"));
    // The store was not bypassed: B's data is still B's (less the member its admin removed).
    let members = w.store.members(&w.b_tenant).await.expect("members");
    assert_eq!(members.len(), 2, "{members:?}");
    assert!(members.iter().all(|(u, _)| u.id != w.b_spare));
}

/// Explanations name only the caller's tenants' objects: the requests whose instances would move to make room
/// (`make_room[].moves[].request`) and the reservation that booked the room (`reserved`'s `reservation`) are
/// `null` to a member of another tenant, in the preview, the request's `waiting` and the tenant's waiting list; a
/// platform admin and the owning tenant see the ids.
#[tokio::test]
async fn waiting_reasons_and_previews_name_no_other_tenants_objects() {
    let app = TestApp::sqlite().auto_layout().start().await;
    app.one_gpu_of("H100-80GB").await;
    let gpu = app.mig_gpus("H100-80GB").await[0].clone();
    app.heard_node_of(&gpu).await;
    let b = app.tenant(B_NAME, json!({"auto_approve": true, "auto_approve_max_compute_slices": 14})).await;
    let b_dev = app.member(B_USER, &b).await;
    let a = app.tenant("tenant-a", json!({})).await;
    let a_dev = app.member("al-of-a", &a).await;
    let mig = |t: &str, profile: &str| json!({"tenant": t, "spec": {"mode": "mig", "profile": profile, "model": "H100-80GB"}, "count": 1});
    let of_b =
        |text: &str, ids: &[&str]| text.contains(&b) || text.contains(B_NAME) || ids.iter().any(|i| text.contains(i));
    // Where A's answers say why A waits: the preview, the request, the tenant's list.
    let answers = |request: String| {
        let (app, a, a_dev) = (&app, a.clone(), a_dev.clone());
        async move {
            let (s, got) = app.get(&format!("/api/v1/requests/{request}"), &a_dev).await;
            assert_eq!(s, StatusCode::OK, "{got}");
            let (s, list) = app.get(&format!("/api/v1/tenants/{a}/waiting"), &a_dev).await;
            assert_eq!(s, StatusCode::OK, "{list}");
            let (_, by_admin) = app.get(&format!("/api/v1/requests/{request}"), &app.admin).await;
            (got["waiting"].clone(), list, by_admin["waiting"].clone())
        }
    };

    // B's 1g.10gb instances at units 0 and 4 leave no 3g.40gb placement: making room would move one of them.
    let mut b_requests = Vec::new();
    for _ in 0..7 {
        let (s, r) = app.send(Method::POST, "/api/v1/requests", &b_dev, Some(mig(&b, "1g.10gb"))).await;
        assert_eq!((s, r["state"].clone()), (StatusCode::CREATED, json!("approved")), "{r}");
        b_requests.push(r["id"].as_str().expect("id").to_string());
    }
    let (_, allocations) = app.get(&format!("/api/v1/allocations?tenant={b}"), &b_dev).await;
    let b_allocations: Vec<String> =
        allocations.as_array().into_iter().flatten().filter_map(|a| a["id"].as_str().map(str::to_string)).collect();
    let mut kept = Vec::new();
    for a in allocations.as_array().into_iter().flatten() {
        let path = format!("/api/v1/requests/{}/cancel", a["request"].as_str().expect("request"));
        if a["start"] == 0 || a["start"] == 4 {
            kept.push(path);
            continue;
        }
        let (s, body) = app.send(Method::POST, &path, &b_dev, None).await;
        assert_eq!(s, StatusCode::OK, "{body}");
    }
    let b_ids: Vec<&str> = b_requests.iter().chain(&b_allocations).map(String::as_str).collect();
    let moves = |v: &Value| v["models"][0]["make_room"][0]["moves"].clone();
    let (s, p) = app.send(Method::POST, "/api/v1/requests/preview", &a_dev, Some(mig(&a, "3g.40gb"))).await;
    assert_eq!((s, p["waiting"]["code"].clone()), (StatusCode::OK, json!("no_capacity")), "{p}");
    assert_eq!(moves(&p["waiting"]).as_array().map(Vec::len), Some(1), "one move makes room: {p}");
    assert_eq!(moves(&p["waiting"])[0]["request"], Value::Null, "{p}");
    assert!(!of_b(&p.to_string(), &b_ids), "A's preview names B's objects: {p}");
    let (_, p) = app.send(Method::POST, "/api/v1/requests/preview", &app.admin, Some(mig(&a, "3g.40gb"))).await;
    assert!(moves(&p["waiting"])[0]["request"].as_str().is_some_and(|r| b_requests.iter().any(|b| b == r)), "{p}");
    let (_, p) = app.send(Method::POST, "/api/v1/requests/preview", &b_dev, Some(mig(&b, "3g.40gb"))).await;
    assert!(moves(&p["waiting"])[0]["request"].as_str().is_some_and(|r| b_requests.iter().any(|b| b == r)), "{p}");
    let (s, r) = app.send(Method::POST, "/api/v1/requests", &a_dev, Some(mig(&a, "3g.40gb"))).await;
    assert_eq!((s, r["state"].clone()), (StatusCode::CREATED, json!("pending")), "{r}");
    let a_request = r["id"].as_str().expect("id").to_string();
    let (got, list, by_admin) = answers(a_request.clone()).await;
    assert_eq!(got["reason"]["code"], "no_capacity", "{got}");
    assert_eq!(moves(&got["reason"])[0]["request"], Value::Null, "{got}");
    assert_eq!(moves(&list[0]["reason"])[0]["request"], Value::Null, "{list}");
    assert!(!of_b(&got.to_string(), &b_ids) && !of_b(&list.to_string(), &b_ids), "{got} {list}");
    let by_admin = moves(&by_admin["reason"]);
    assert!(by_admin[0]["request"].as_str().is_some_and(|r| b_requests.iter().any(|b| b == r)), "{by_admin}");
    // Everything let go: the GPU is free again.
    let (s, body) = app.send(Method::POST, &format!("/api/v1/requests/{a_request}/cancel"), &a_dev, None).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    for path in kept {
        let (s, body) = app.send(Method::POST, &path, &b_dev, None).await;
        assert_eq!(s, StatusCode::OK, "{body}");
    }

    // B's accepted reservation of the whole GPU in an hour: A's request without a duration waits for it.
    let start = tessera_server::store::now_ms() + 3_600_000;
    let (s, booked) = app
        .send(
            Method::POST,
            &format!("/api/v1/tenants/{b}/reservations"),
            &b_dev,
            Some(json!({"spec": {"mode": "mig", "profile": "7g.80gb", "model": "H100-80GB"}, "count": 1,
                        "start_ms": start, "end_ms": start + 3_600_000})),
        )
        .await;
    assert_eq!((s, booked["state"].clone()), (StatusCode::CREATED, json!("accepted")), "{booked}");
    let rid = booked["id"].as_str().expect("id").to_string();
    let (s, p) = app.send(Method::POST, "/api/v1/requests/preview", &a_dev, Some(mig(&a, "1g.10gb"))).await;
    assert_eq!((s, p["waiting"]["code"].clone()), (StatusCode::OK, json!("reserved")), "{p}");
    assert_eq!(p["waiting"]["reservation"], Value::Null, "{p}");
    assert!(p["sentence"].as_str().is_some_and(|t| t.contains("another tenant's reservation")), "{p}");
    assert!(!of_b(&p.to_string(), &[&rid]), "A's preview names B's reservation: {p}");
    let (_, p) = app.send(Method::POST, "/api/v1/requests/preview", &app.admin, Some(mig(&a, "1g.10gb"))).await;
    assert_eq!(p["waiting"]["reservation"], rid.as_str(), "a platform admin sees it: {p}");
    let (_, p) = app.send(Method::POST, "/api/v1/requests/preview", &b_dev, Some(mig(&b, "1g.10gb"))).await;
    assert_eq!(p["waiting"]["reservation"], rid.as_str(), "B sees its own: {p}");
    let (s, r) = app.send(Method::POST, "/api/v1/requests", &a_dev, Some(mig(&a, "1g.10gb"))).await;
    assert_eq!((s, r["state"].clone()), (StatusCode::CREATED, json!("pending")), "{r}");
    let a_request = r["id"].as_str().expect("id").to_string();
    let (got, list, by_admin) = answers(a_request.clone()).await;
    assert_eq!((got["reason"]["code"].clone(), got["reason"]["reservation"].clone()), (json!("reserved"), Value::Null));
    assert!(!of_b(&got.to_string(), &[&rid]) && !of_b(&list.to_string(), &[&rid]), "{got} {list}");
    assert_eq!(list[0]["reason"]["reservation"], Value::Null, "{list}");
    assert_eq!(by_admin["reason"]["reservation"], rid.as_str(), "{by_admin}");
}
