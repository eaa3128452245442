//! The wire types are the contract: every JSON answer of the `tessera` binary decodes into the `tessera-api` (or
//! `tessera-core`) type that the OpenAPI document names for that operation and status, and encodes back to the
//! very same JSON, so a field the type does not know, a renamed field or a changed shape fails here. The test
//! walks the API as people use it (a tenant with quota, a member, a request approved onto a simulated agent's MIG
//! GPU, its layout change, allocations, audit, usage, telemetry) and at the end checks that every JSON operation of
//! the document was decoded at least once, but for the agent's own routes (their types are `tessera-core`'s,
//! shared by the agent) and the streams.

use std::collections::BTreeSet;

use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tessera_server::http::auth::new_token_secret;

use crate::agents::{Server, SimAgent, first_allocation_active, free_port, sqlite_url};

/// Decodes `v` as `T` and checks that encoding it again gives `v` back.
fn roundtrip<T: DeserializeOwned + Serialize>(what: &str, v: &Value) {
    let typed: T = serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{what}: does not decode: {e}\n{v}"));
    let again = serde_json::to_value(&typed).expect("encode");
    assert_eq!(&again, v, "{what}: the type does not carry every field of the answer");
}

/// Decodes `v` with the type the document calls `schema` (`Vec<...>` for arrays).
fn decode(what: &str, schema: &str, v: &Value) {
    use tessera_api::{
        agents, allocations, audit, catalog, cohorts, layouts, nodes, people, requests, signin, telemetry,
    };
    use tessera_api::{efficiency, tenants, usage};
    macro_rules! as_type {
        ($($name:literal => $t:ty),* $(,)?) => {
            match schema {
                $($name => roundtrip::<$t>(what, v),)*
                $(concat!("[", $name, "]") => roundtrip::<Vec<$t>>(what, v),)*
                other => panic!("{what}: no wire type is mapped to the schema `{other}`"),
            }
        };
    }
    as_type!(
        "AllocationView" => allocations::AllocationView,
        "ApprovalView" => requests::ApprovalView,
        "AuditPage" => audit::AuditPage,
        "AuditView" => audit::AuditView,
        "CohortView" => cohorts::CohortView,
        "ClusterView" => tessera_api::clusters::ClusterView,
        "NamespaceView" => tessera_api::clusters::NamespaceView,
        "BudgetView" => tessera_api::budgets::BudgetView,
        "WebhookSecret" => tessera_api::notifications::WebhookSecret,
        "WebhookView" => tessera_api::notifications::WebhookView,
        "DeliveryView" => tessera_api::notifications::DeliveryView,
        "TestSent" => tessera_api::notifications::TestSent,
        "EventView" => tessera_api::notifications::EventView,
        "EventTypeView" => tessera_api::notifications::EventTypeView,
        "InboxCount" => tessera_api::notifications::InboxCount,
        "NotificationSettings" => tessera_api::notifications::NotificationSettings,
        "QuotaTimeline" => tessera_api::quotas::QuotaTimeline,
        "Waiting" => requests::Waiting,
        "RequestPreview" => requests::RequestPreview,
        "QuotaStanding" => tessera_api::quotas::QuotaStanding,
        "CreatedToken" => people::CreatedToken,
        "GpuView" => nodes::GpuView,
        "GpuDrain" => nodes::GpuDrain,
        "DefragReport" => layouts::DefragReport,
        "Heatmap" => telemetry::Heatmap,
        "JoinTokenView" => agents::JoinTokenView,
        "LayoutVerdict" => catalog::LayoutVerdict,
        "LayoutView" => layouts::LayoutView,
        "MemberView" => people::MemberView,
        "ModelView" => catalog::ModelView,
        "NodeCredential" => nodes::NodeCredential,
        "NodeView" => nodes::NodeView,
        "Offerings" => nodes::Offerings,
        "Plan" => tessera_core::planner::Plan,
        "Problem" => tessera_api::Problem,
        "QuotaView" => tenants::QuotaView,
        "QuotaRequestView" => tessera_api::quotas::QuotaRequestView,
        "QuotaRequestPage" => tessera_api::quotas::QuotaRequestPage,
        "ReservationView" => tessera_api::reservations::ReservationView,
        "ReservationPage" => tessera_api::reservations::ReservationPage,
        "ReservationPreview" => tessera_api::reservations::ReservationPreview,
        "ReservationPolicyView" => tessera_api::reservations::ReservationPolicyView,
        "CalendarView" => tessera_api::reservations::CalendarView,
        "LimitChangeView" => tessera_api::quotas::LimitChangeView,
        "RequestPage" => requests::RequestPage,
        "RequestView" => requests::RequestView,
        "Revoked" => nodes::Revoked,
        "SessionView" => signin::SessionView,
        "SignInLink" => signin::SignInLink,
        "SignInMethods" => signin::SignInMethods,
        "TenantView" => tenants::TenantView,
        "TokenView" => people::TokenView,
        "UsageReport" => usage::UsageReport,
        "EfficiencyReport" => efficiency::EfficiencyReport,
        "EfficiencyHistory" => efficiency::EfficiencyHistory,
        "Prices" => efficiency::Prices,
        "RightsizeReport" => tessera_api::rightsize::RightsizeReport,
        "Replacement" => tessera_api::rightsize::Replacement,
        "UserView" => people::UserView,
    )
}

/// The schema the document names for `method path` answering `status` with JSON: `Name` or `[Name]`.
fn documented(doc: &Value, method: &Method, path: &str, status: StatusCode) -> String {
    let op = &doc["paths"][path][method.as_str().to_lowercase()];
    assert!(op.is_object(), "{method} {path} is not in the OpenAPI document");
    let content = &op["responses"][status.as_str()]["content"];
    let json = if status.is_success() { "application/json" } else { "application/problem+json" };
    let schema = &content[json]["schema"];
    let name = |r: &Value| r["$ref"].as_str().and_then(|r| r.rsplit('/').next()).map(str::to_string);
    if let Some(n) = name(schema) {
        return n;
    }
    if schema["type"] == "array"
        && let Some(n) = name(&schema["items"])
    {
        return format!("[{n}]");
    }
    panic!("{method} {path} {status}: the document names no JSON schema: {schema}")
}

/// Calls the server and decodes its answer.
struct Walk {
    server: Server,
    doc: Value,
    covered: BTreeSet<(String, String, u16)>,
}

impl Walk {
    /// `template` is the document's path; `path` the concrete one (with a query, if any).
    async fn call(
        &mut self,
        token: &str,
        method: Method,
        template: &str,
        path: &str,
        body: Option<Value>,
        status: StatusCode,
    ) -> Value {
        self.call_keyed(token, method, template, path, body, None, status).await
    }

    /// [`Walk::call`] with an `Idempotency-Key`.
    #[allow(clippy::too_many_arguments)]
    async fn call_keyed(
        &mut self,
        token: &str,
        method: Method,
        template: &str,
        path: &str,
        body: Option<Value>,
        key: Option<&str>,
        status: StatusCode,
    ) -> Value {
        let mut r =
            self.server.client.request(method.clone(), format!("{}{path}", self.server.base)).bearer_auth(token);
        if let Some(k) = key {
            r = r.header("Idempotency-Key", k);
        }
        if let Some(b) = body {
            r = r.json(&b);
        }
        let r = r.send().await.expect("send");
        let got = r.status();
        let text = r.text().await.expect("body");
        assert_eq!(got, status, "{method} {path}: {text}");
        let v: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {text}"));
        let schema = documented(&self.doc, &method, template, status);
        decode(&format!("{method} {path} {status}"), &schema, &v);
        self.covered.insert((method.as_str().to_string(), template.to_string(), status.as_u16()));
        v
    }
}

fn id(v: &Value) -> String {
    v["id"].as_str().unwrap_or_else(|| panic!("no id in {v}")).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_json_answer_decodes_into_the_documented_wire_type_and_back() {
    let doc: Value = serde_json::from_str(include_str!("../../../openapi/openapi.json")).expect("openapi.json");
    let server = Server::start(&sqlite_url(), free_port(), &new_token_secret()).await;
    let mut agent = SimAgent::new(&server.base, "wire", "H100-80GB:1", server.join_token(None).await);
    agent.start();
    server.settled("wire").await;
    let admin = server.admin.clone();
    let mut w = Walk { server, doc, covered: BTreeSet::new() };
    use Method as M;
    use StatusCode as S;

    w.call(&admin, M::GET, "/auth/methods", "/auth/methods", None, S::OK).await;
    w.call(&admin, M::GET, "/api/v1/session", "/api/v1/session", None, S::OK).await;
    let tenant =
        w.call(&admin, M::POST, "/api/v1/tenants", "/api/v1/tenants", Some(json!({"name": "wire"})), S::CREATED).await;
    let t = id(&tenant);
    w.call(&admin, M::GET, "/api/v1/tenants", "/api/v1/tenants", None, S::OK).await;
    w.call(&admin, M::GET, "/api/v1/tenants/{id}", &format!("/api/v1/tenants/{t}"), None, S::OK).await;
    let policy = json!({"auto_approve": false, "auto_approve_max_compute_slices": 0});
    w.call(&admin, M::PUT, "/api/v1/tenants/{id}/policy", &format!("/api/v1/tenants/{t}/policy"), Some(policy), S::OK)
        .await;
    let limits = json!({"limits": {"compute_slices": 14, "mig/H100-80GB/1g.10gb": 4}});
    w.call(&admin, M::PUT, "/api/v1/tenants/{id}/quotas", &format!("/api/v1/tenants/{t}/quotas"), Some(limits), S::OK)
        .await;
    w.call(&admin, M::GET, "/api/v1/tenants/{id}/quotas", &format!("/api/v1/tenants/{t}/quotas"), None, S::OK).await;
    // Quota requests: asked, listed, read, granted, refused, withdrawn; the limits' history.
    let asks = format!("/api/v1/tenants/{t}/quota-requests");
    let mut qr = Vec::new();
    for limit in [30, 31, 32] {
        let body = json!({"limits": {"compute_slices": limit}, "reason": "wire"});
        qr.push(id(&w
            .call(&admin, M::POST, "/api/v1/tenants/{id}/quota-requests", &asks, Some(body), S::CREATED)
            .await));
    }
    w.call(&admin, M::GET, "/api/v1/quota-requests", "/api/v1/quota-requests", None, S::OK).await;
    let one = format!("/api/v1/quota-requests/{}", qr[0]);
    w.call(&admin, M::GET, "/api/v1/quota-requests/{id}", &one, None, S::OK).await;
    let grant = Some(json!({"limits": {"compute_slices": 29}, "comment": "part"}));
    w.call(&admin, M::POST, "/api/v1/quota-requests/{id}/approve", &format!("{one}/approve"), grant, S::OK).await;
    let reject = format!("/api/v1/quota-requests/{}/reject", qr[1]);
    w.call(&admin, M::POST, "/api/v1/quota-requests/{id}/reject", &reject, Some(json!({"reason": "no"})), S::OK).await;
    let cancel = format!("/api/v1/quota-requests/{}/cancel", qr[2]);
    w.call(&admin, M::POST, "/api/v1/quota-requests/{id}/cancel", &cancel, None, S::OK).await;
    let history = format!("/api/v1/tenants/{t}/quota-history");
    w.call(&admin, M::GET, "/api/v1/tenants/{id}/quota-history", &history, None, S::OK).await;
    // Timelines, the standing of every tenant, budgets.
    let timeline = format!("/api/v1/tenants/{t}/quota-timeline?days=2");
    let tl = w.call(&admin, M::GET, "/api/v1/tenants/{id}/quota-timeline", &timeline, None, S::OK).await;
    assert_eq!(tl["held"].as_array().map(Vec::len), Some(48), "{tl}");
    w.call(&admin, M::GET, "/api/v1/quota-standing", "/api/v1/quota-standing", None, S::OK).await;
    let budget = format!("/api/v1/tenants/{t}/budget");
    let limits = Some(json!({"policy": "warn", "limits": {"compute_slice_hours": 500, "gpu_hours/H100-80GB": 20}}));
    w.call(&admin, M::PUT, "/api/v1/tenants/{id}/budget", &budget, limits, S::OK).await;
    let b = w.call(&admin, M::GET, "/api/v1/tenants/{id}/budget", &budget, None, S::OK).await;
    assert_eq!(b["lines"].as_array().map(Vec::len), Some(2), "{b}");
    // Webhooks: a tenant's and a platform one, listed, read, tested, their log, a redelivery, a rotation; the
    // event types and the inbox.
    let hooks = format!("/api/v1/tenants/{t}/webhooks");
    // A name that never resolves (`.invalid`): a tenant's endpoint may not point inside the network.
    let body = Some(json!({"url": "http://hooks.invalid:9/hook", "types": ["request.*"], "description": "wire"}));
    let made = w.call(&admin, M::POST, "/api/v1/tenants/{id}/webhooks", &hooks, body, S::CREATED).await;
    let hook = made["webhook"]["id"].as_str().expect("id").to_string();
    w.call(&admin, M::GET, "/api/v1/tenants/{id}/webhooks", &hooks, None, S::OK).await;
    let body = Some(json!({"url": "http://127.0.0.1:9/all", "format": "slack"}));
    let platform = w.call(&admin, M::POST, "/api/v1/webhooks", "/api/v1/webhooks", body, S::CREATED).await;
    w.call(&admin, M::GET, "/api/v1/webhooks", "/api/v1/webhooks", None, S::OK).await;
    let one = format!("/api/v1/webhooks/{hook}");
    w.call(&admin, M::GET, "/api/v1/webhooks/{id}", &one, None, S::OK).await;
    w.call(&admin, M::POST, "/api/v1/webhooks/{id}/test", &format!("{one}/test"), None, S::ACCEPTED).await;
    let log = format!("{one}/deliveries");
    let mut delivery = None;
    for _ in 0..100 {
        let d = w.call(&admin, M::GET, "/api/v1/webhooks/{id}/deliveries", &log, None, S::OK).await;
        delivery = d[0]["id"].as_i64();
        if delivery.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let delivery = delivery.expect("the test event was dispatched");
    let again = format!("{log}/{delivery}/redeliver");
    w.call(&admin, M::POST, "/api/v1/webhooks/{id}/deliveries/{delivery}/redeliver", &again, None, S::ACCEPTED).await;
    w.call(&admin, M::POST, "/api/v1/webhooks/{id}/rotate-secret", &format!("{one}/rotate-secret"), None, S::OK).await;
    w.call(&admin, M::GET, "/api/v1/event-types", "/api/v1/event-types", None, S::OK).await;
    w.call(&admin, M::GET, "/api/v1/inbox", "/api/v1/inbox", None, S::OK).await;
    let c = w.call(&admin, M::GET, "/api/v1/inbox/unread", "/api/v1/inbox/unread", None, S::OK).await;
    let read = Some(json!({"up_to": c["latest_seq"]}));
    w.call(&admin, M::POST, "/api/v1/inbox/read", "/api/v1/inbox/read", read, S::OK).await;
    let settings = "/api/v1/notification-settings";
    w.call(&admin, M::GET, settings, settings, None, S::OK).await;
    w.call(&admin, M::PUT, settings, settings, Some(json!({"email_types": ["request.*"]})), S::OK).await;
    let gone = w.server.client.delete(format!("{}/api/v1/webhooks/{}", w.server.base, id(&platform["webhook"])));
    assert_eq!(gone.bearer_auth(&admin).send().await.expect("send").status(), S::NO_CONTENT);
    // Reservations: previewed, booked, listed, read, accepted, refused, withdrawn; their policies.
    let start = tessera_server::store::now_ms() + 86_400_000;
    let booking = |h: i64| {
        json!({"spec": {"mode": "mig", "profile": "1g.10gb", "model": "H100-80GB"}, "count": 1,
               "start_ms": start + h * 3_600_000, "end_ms": start + (h + 1) * 3_600_000, "reason": "wire"})
    };
    let books = format!("/api/v1/tenants/{t}/reservations");
    let p = format!("{books}/preview");
    w.call(&admin, M::POST, "/api/v1/tenants/{id}/reservations/preview", &p, Some(booking(0)), S::OK).await;
    let mut rs = Vec::new();
    for h in 0..3 {
        rs.push(id(&w
            .call(&admin, M::POST, "/api/v1/tenants/{id}/reservations", &books, Some(booking(h)), S::CREATED)
            .await));
    }
    let list = format!("/api/v1/reservations?tenant={t}");
    w.call(&admin, M::GET, "/api/v1/reservations", &list, None, S::OK).await;
    let one = format!("/api/v1/reservations/{}", rs[0]);
    let r0 = w.call(&admin, M::GET, "/api/v1/reservations/{id}", &one, None, S::OK).await;
    if r0["state"] == "pending" {
        w.call(&admin, M::POST, "/api/v1/reservations/{id}/approve", &format!("{one}/approve"), None, S::OK).await;
        let reject = format!("/api/v1/reservations/{}/reject", rs[1]);
        w.call(&admin, M::POST, "/api/v1/reservations/{id}/reject", &reject, Some(json!({"reason": "no"})), S::OK)
            .await;
    } else {
        panic!("the wire tenant waits for approval: {r0}");
    }
    let cancel = format!("/api/v1/reservations/{}/cancel", rs[2]);
    w.call(&admin, M::POST, "/api/v1/reservations/{id}/cancel", &cancel, None, S::OK).await;
    let policy = json!({"max_duration_s": 604_800, "max_ahead_s": 2_592_000, "max_concurrent": 10});
    w.call(&admin, M::PUT, "/api/v1/reservation-policy", "/api/v1/reservation-policy", Some(policy.clone()), S::OK)
        .await;
    w.call(&admin, M::GET, "/api/v1/reservation-policy", "/api/v1/reservation-policy", None, S::OK).await;
    let cal = w.call(&admin, M::GET, "/api/v1/calendar", "/api/v1/calendar?model=H100-80GB", None, S::OK).await;
    assert!(cal["gpus"].as_array().is_some_and(|g| !g.is_empty()), "{cal}");
    let tp = format!("/api/v1/tenants/{t}/reservation-policy");
    w.call(&admin, M::PUT, "/api/v1/tenants/{id}/reservation-policy", &tp, Some(policy), S::OK).await;
    w.call(&admin, M::GET, "/api/v1/tenants/{id}/reservation-policy", &tp, None, S::OK).await;
    // Why requests wait, and what one would do.
    let waits = format!("/api/v1/tenants/{t}/waiting");
    w.call(&admin, M::GET, "/api/v1/tenants/{id}/waiting", &waits, None, S::OK).await;
    let ask = json!({"tenant": t, "spec": {"mode": "mig", "profile": "1g.10gb"}, "count": 1});
    let p = w.call(&admin, M::POST, "/api/v1/requests/preview", "/api/v1/requests/preview", Some(ask), S::OK).await;
    assert!(p["outcome"].is_string(), "{p}");
    // Clusters: registered, listed, read, changed; the tenant is given a namespace (new, then again).
    let (m, p) = ("/api/v1/clusters", "/api/v1/clusters");
    let cluster = id(&w.call(&admin, M::POST, m, p, Some(json!({"name": "wire", "mode": "dra"})), S::CREATED).await);
    w.call(&admin, M::GET, m, p, None, S::OK).await;
    let (m, p) = ("/api/v1/clusters/{id}", format!("/api/v1/clusters/{cluster}"));
    w.call(&admin, M::GET, m, &p, None, S::OK).await;
    w.call(&admin, M::PATCH, m, &p, Some(json!({"mode": "device_plugin"})), S::OK).await;
    let (m, p) = ("/api/v1/clusters/{id}/namespaces/{namespace}", format!("/api/v1/clusters/{cluster}/namespaces/ml"));
    w.call(&admin, M::PUT, m, &p, Some(json!({"tenant": t})), S::CREATED).await;
    w.call(&admin, M::PUT, m, &p, Some(json!({"tenant": t})), S::OK).await;
    let p = format!("/api/v1/tenants/{t}/namespaces");
    w.call(&admin, M::GET, "/api/v1/tenants/{id}/namespaces", &p, None, S::OK).await;
    // Cohorts: created, listed, read, changed; the tenant joins one.
    let cohort =
        w.call(&admin, M::POST, "/api/v1/cohorts", "/api/v1/cohorts", Some(json!({"name": "wire"})), S::CREATED).await;
    let c = id(&cohort);
    w.call(&admin, M::GET, "/api/v1/cohorts", "/api/v1/cohorts", None, S::OK).await;
    w.call(&admin, M::GET, "/api/v1/cohorts/{id}", &format!("/api/v1/cohorts/{c}"), None, S::OK).await;
    let grace = Some(json!({"grace_s": 120}));
    w.call(&admin, M::PATCH, "/api/v1/cohorts/{id}", &format!("/api/v1/cohorts/{c}"), grace, S::OK).await;
    let join = Some(json!({"cohort": c, "weight": 2}));
    let path = format!("/api/v1/tenants/{t}/cohort");
    let joined = w.call(&admin, M::PUT, "/api/v1/tenants/{id}/cohort", &path, join, S::OK).await;
    assert_eq!(joined["cohort"], c.as_str(), "{joined}");

    let alice =
        w.call(&admin, M::POST, "/api/v1/users", "/api/v1/users", Some(json!({"name": "alice"})), S::CREATED).await;
    w.call(&admin, M::GET, "/api/v1/users", "/api/v1/users", None, S::OK).await;
    let link = format!("/api/v1/users/{}/sign-in-link", id(&alice));
    w.call(&admin, M::POST, "/api/v1/users/{id}/sign-in-link", &link, None, S::CREATED).await;
    let member = format!("{}/api/v1/tenants/{t}/members/{}", w.server.base, id(&alice));
    let r = w.server.client.put(member).bearer_auth(&admin).json(&json!({"role": "member"})).send().await;
    assert_eq!(r.expect("send").status(), S::NO_CONTENT);
    w.call(&admin, M::GET, "/api/v1/tenants/{id}/members", &format!("/api/v1/tenants/{t}/members"), None, S::OK).await;
    w.call(&admin, M::POST, "/api/v1/tokens", "/api/v1/tokens", Some(json!({"name": "laptop"})), S::CREATED).await;
    w.call(&admin, M::GET, "/api/v1/tokens", "/api/v1/tokens", None, S::OK).await;

    w.call(&admin, M::GET, "/api/v1/catalog/models", "/api/v1/catalog/models", None, S::OK).await;
    w.call(&admin, M::GET, "/api/v1/catalog/models/{model}", "/api/v1/catalog/models/H100-80GB", None, S::OK).await;
    let layout = json!({"instances": [{"profile": "1g.10gb", "start": 0}]});
    let path = "/api/v1/catalog/models/H100-80GB/validate";
    w.call(&admin, M::POST, "/api/v1/catalog/models/{model}/validate", path, Some(layout), S::OK).await;
    w.call(&admin, M::GET, "/api/v1/join-tokens", "/api/v1/join-tokens", None, S::OK).await;
    w.call(&admin, M::POST, "/api/v1/join-tokens", "/api/v1/join-tokens", Some(json!({})), S::CREATED).await;
    let nodes = w.call(&admin, M::GET, "/api/v1/nodes", "/api/v1/nodes", None, S::OK).await;
    let node = nodes.as_array().and_then(|n| n.iter().find(|n| n["name"] == "wire")).expect("the agent's node").clone();
    let gpu = node["gpus"][0]["id"].as_str().expect("gpu").to_string();
    w.call(&admin, M::GET, "/api/v1/offerings", "/api/v1/offerings", None, S::OK).await;

    // A request made, placed, approved onto a layout change, and running on the agent.
    let ask = json!({"tenant": t, "spec": {"mode": "mig", "profile": "2g.20gb", "model": "H100-80GB"}, "count": 1});
    let request = w.call(&admin, M::POST, "/api/v1/requests", "/api/v1/requests", Some(ask), S::CREATED).await;
    let r = id(&request);
    w.call(&admin, M::GET, "/api/v1/requests", &format!("/api/v1/requests?tenant={t}"), None, S::OK).await;
    w.call(&admin, M::GET, "/api/v1/requests/{id}", &format!("/api/v1/requests/{r}"), None, S::OK).await;
    w.call(&admin, M::GET, "/api/v1/requests/{id}/placement", &format!("/api/v1/requests/{r}/placement"), None, S::OK)
        .await;
    let approval = w
        .call(&admin, M::POST, "/api/v1/requests/{id}/approve", &format!("/api/v1/requests/{r}/approve"), None, S::OK)
        .await;
    w.call(&admin, M::GET, "/api/v1/layouts", "/api/v1/layouts", None, S::OK).await;
    for proposal in approval["layout_proposals"].as_array().into_iter().flatten() {
        let p = id(proposal);
        w.call(&admin, M::GET, "/api/v1/layouts/{id}", &format!("/api/v1/layouts/{p}"), None, S::OK).await;
        if proposal["state"] == "proposed" {
            let path = format!("/api/v1/layouts/{p}/approve");
            w.call(&admin, M::POST, "/api/v1/layouts/{id}/approve", &path, None, S::OK).await;
        }
    }
    let active = first_allocation_active(&w.server, &t).await;
    // The smaller slice asked for in its place (pending: the tenant's policy approves nothing by itself).
    let path = format!("/api/v1/allocations/{}/rightsize", id(&active));
    let smaller = Some(json!({"profile": "1g.10gb", "reason": "wire"}));
    let replacement = w.call(&admin, M::POST, "/api/v1/allocations/{id}/rightsize", &path, smaller, S::CREATED).await;
    assert_eq!(replacement["replaces"], r.as_str(), "{replacement}");
    w.call(&admin, M::GET, "/api/v1/allocations", &format!("/api/v1/allocations?tenant={t}"), None, S::OK).await;
    w.call(&admin, M::GET, "/api/v1/nodes", "/api/v1/nodes", None, S::OK).await;
    w.call(&admin, M::GET, "/api/v1/audit", &format!("/api/v1/audit?object=request/{r}"), None, S::OK).await;
    w.call(&admin, M::GET, "/api/v1/audit/entries", "/api/v1/audit/entries?limit=5", None, S::OK).await;
    w.call(&admin, M::GET, "/api/v1/usage", "/api/v1/usage", None, S::OK).await;
    let prices = Some(json!({"currency": "EUR", "models": [{"model": "H100-80GB", "per_gpu_hour": 2.5}]}));
    w.call(&admin, M::PUT, "/api/v1/prices", "/api/v1/prices", prices, S::OK).await;
    w.call(&admin, M::GET, "/api/v1/prices", "/api/v1/prices", None, S::OK).await;
    w.call(&admin, M::GET, "/api/v1/efficiency", "/api/v1/efficiency", None, S::OK).await;
    w.call(&admin, M::GET, "/api/v1/efficiency/history", "/api/v1/efficiency/history?days=7", None, S::OK).await;
    w.call(&admin, M::GET, "/api/v1/rightsizing", "/api/v1/rightsizing", None, S::OK).await;
    w.call(&admin, M::GET, "/api/v1/telemetry/heatmap", "/api/v1/telemetry/heatmap?node=wire", None, S::OK).await;
    let path = format!("/api/v1/requests/{r}/release");
    w.call(&admin, M::POST, "/api/v1/requests/{id}/release", &path, Some(json!({"reason": "done"})), S::OK).await;

    // A second request: rejected; a third: cancelled.
    let ask = json!({"tenant": t, "spec": {"mode": "mig", "profile": "1g.10gb"}, "count": 1});
    let second =
        id(&w.call(&admin, M::POST, "/api/v1/requests", "/api/v1/requests", Some(ask.clone()), S::CREATED).await);
    let path = format!("/api/v1/requests/{second}/reject");
    w.call(&admin, M::POST, "/api/v1/requests/{id}/reject", &path, Some(json!({"reason": "no"})), S::OK).await;
    let key = Some("wire-1");
    let (m, p) = ("/api/v1/requests", "/api/v1/requests");
    let third = id(&w.call_keyed(&admin, M::POST, m, p, Some(ask.clone()), key, S::CREATED).await);
    let replay = w.call_keyed(&admin, M::POST, m, p, Some(ask), key, S::OK).await;
    assert_eq!(id(&replay), third, "a replay answers with the request the key created");
    let path = format!("/api/v1/requests/{third}/cancel");
    w.call(&admin, M::POST, "/api/v1/requests/{id}/cancel", &path, None, S::OK).await;

    // Fleet changes by hand.
    w.call(&admin, M::POST, "/api/v1/gpus/{id}/cordon", &format!("/api/v1/gpus/{gpu}/cordon"), None, S::OK).await;
    let drain = Some(json!({"deadline_s": 60, "reason": "wire"}));
    w.call(&admin, M::POST, "/api/v1/gpus/{id}/drain", &format!("/api/v1/gpus/{gpu}/drain"), drain, S::OK).await;
    w.call(&admin, M::POST, "/api/v1/gpus/{id}/uncordon", &format!("/api/v1/gpus/{gpu}/uncordon"), None, S::OK).await;
    let path = format!("/api/v1/gpus/{gpu}/auto-layout");
    w.call(&admin, M::PUT, "/api/v1/gpus/{id}/auto-layout", &path, Some(json!({"enabled": false})), S::OK).await;
    let nodes = w.call(&admin, M::GET, "/api/v1/nodes", "/api/v1/nodes", None, S::OK).await;
    let now = nodes.as_array().and_then(|n| n.iter().find(|n| n["name"] == "wire")).expect("node")["gpus"][0].clone();
    assert_eq!(now["layout"][0]["profile"], "2g.20gb", "{now}");
    let edit = json!({"instances": [{"profile": "7g.80gb", "start": 0}]});
    let proposal = w
        .call(&admin, M::PUT, "/api/v1/gpus/{id}/layout", &format!("/api/v1/gpus/{gpu}/layout"), Some(edit), S::CREATED)
        .await;
    let path = format!("/api/v1/layouts/{}/reject", id(&proposal));
    w.call(&admin, M::POST, "/api/v1/layouts/{id}/reject", &path, Some(json!({"reason": "not now"})), S::OK).await;
    let (m, p) = ("/api/v1/defragmentation", "/api/v1/defragmentation?profile=7g.80gb");
    let seen = w.call(&admin, M::GET, m, p, None, S::OK).await;
    assert_eq!(seen["gpus"][0]["target"], "7g.80gb", "{seen}");
    let made = w.call(&admin, M::POST, m, m, Some(json!({"profile": "7g.80gb"})), S::OK).await;
    let path = format!("/api/v1/layouts/{}/reject", made["gpus"][0]["proposal_id"].as_str().expect("a proposal"));
    w.call(&admin, M::POST, "/api/v1/layouts/{id}/reject", &path, Some(json!({"reason": "not now"})), S::OK).await;
    let spare = w
        .call(&admin, M::POST, "/api/v1/nodes", "/api/v1/nodes", Some(json!({"name": "spare", "gpus": []})), S::CREATED)
        .await;
    let n = id(&spare);
    let path = format!("/api/v1/nodes/{n}/credentials");
    w.call(&admin, M::POST, "/api/v1/nodes/{id}/credentials", &path, None, S::CREATED).await;
    w.call(&admin, M::DELETE, "/api/v1/nodes/{id}/credentials", &path, None, S::OK).await;

    // Refusals are problem reports of the documented shape.
    w.call(&admin, M::GET, "/api/v1/requests/{id}", "/api/v1/requests/nope", None, S::NOT_FOUND).await;
    let bad = json!({"tenant": t, "spec": {"mode": "mig", "profile": "1g.10gb"}, "count": 99});
    let refused = w.call(&admin, M::POST, "/api/v1/requests", "/api/v1/requests", Some(bad), S::CONFLICT).await;
    assert_eq!(refused["code"], "quota_exceeded", "{refused}");
    assert!(refused["errors"].as_array().is_some_and(|e| !e.is_empty()), "every limit is listed: {refused}");

    // Every JSON success answer of the document was decoded, but the agent's (core types, shared with the agent)
    // and sign-in by password (the browser's; its answer is the session view decoded above).
    let mut missing = Vec::new();
    for (path, ops) in w.doc["paths"].as_object().expect("paths") {
        for (method, op) in ops.as_object().expect("operations") {
            for status in ["200", "201"] {
                let json = op["responses"][status]["content"]["application/json"].is_object();
                let skipped = path.starts_with("/api/v1/agent/") || path == "/auth/local" || path == "/auth/logout";
                let done = w.covered.contains(&(method.to_uppercase(), path.clone(), status.parse().expect("status")));
                if json && !skipped && !done {
                    missing.push(format!("{} {path} {status}", method.to_uppercase()));
                }
            }
        }
    }
    assert!(missing.is_empty(), "JSON answers never decoded through the wire types: {missing:#?}");
    drop(agent);
}
