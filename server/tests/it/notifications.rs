//! Notifications over real HTTP on SQLite and PostgreSQL: events written with the changes they tell of, delivered
//! to webhook receivers that verify every signature with the `standardwebhooks` package (PyPI; a Python receiver,
//! `server/tests/support/webhooks/receiver.py`), routed by tenant and type, in order per subject, retried through
//! a receiver's outage, with secret rotation, test events, the delivery log, redelivery and the inbox; and mail to a
//! real SMTP server (`aiosmtpd`, `server/tests/support/smtp/server.py`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tessera_server::store::Role;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};

use crate::harness::{TestApp, TestDb, on_both_backends};

on_both_backends!(
    events_reach_the_endpoints_allowed_to_see_them_signed_and_in_order,
    a_receiver_that_fails_for_a_while_gets_everything_in_order_afterwards,
    two_replicas_deliver_each_event_once,
    active_requests_are_told_a_day_and_an_hour_before_their_end,
    a_server_killed_with_a_thousand_events_pending_delivers_every_one_after_restart,
    mail_reaches_the_users_who_chose_it_and_may_read_it,
    tenants_webhooks_never_point_inside_the_network,
    the_inbox_stream_tells_each_change_to_those_who_may_read_it,
);

/// The Python with `standardwebhooks` installed: `TESSERA_TEST_PYTHON`, else `target/webhooks-venv` (scripts/test
/// makes it).
fn python() -> String {
    let path = std::env::var("TESSERA_TEST_PYTHON")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../target/webhooks-venv/bin/python").to_string());
    assert!(
        std::path::Path::new(&path).exists(),
        "{path} is missing: `python3 -m venv target/webhooks-venv && target/webhooks-venv/bin/pip install \
         standardwebhooks==1.1.0` (scripts/test does)"
    );
    path
}

/// Starts a Python script of `tests/support` that prints `{"listening": PORT}` and then a JSON line per thing it
/// saw: the process, the port and what it prints from then on.
async fn spawn_script(script: &str, args: &[String]) -> (Child, u16, Arc<Mutex<Vec<Value>>>) {
    let path = format!("{}/tests/support/{script}", env!("CARGO_MANIFEST_DIR"));
    let mut child = Command::new(python())
        .arg(path)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the script");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the script starts")
        .expect("read")
        .expect("a line");
    let port = serde_json::from_str::<Value>(&first).expect("json")["listening"].as_u64().expect("port");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                sink.lock().expect("lock").push(v);
            }
        }
    });
    (child, u16::try_from(port).expect("port"), seen)
}

/// A running receiver and what it has printed.
pub(crate) struct Receiver {
    _child: Child,
    stdin: ChildStdin,
    pub(crate) url: String,
    seen: Arc<Mutex<Vec<Value>>>,
}

impl Receiver {
    pub(crate) async fn start(extra: &[&str]) -> Receiver {
        Receiver::start_on(0, extra).await
    }

    async fn start_on(port: u16, extra: &[&str]) -> Receiver {
        let mut args = vec!["--port".to_string(), port.to_string()];
        args.extend(extra.iter().map(|a| a.to_string()));
        let (mut child, port, seen) = spawn_script("webhooks/receiver.py", &args).await;
        let stdin = child.stdin.take().expect("stdin");
        Receiver { _child: child, stdin, url: format!("http://127.0.0.1:{port}/hook"), seen }
    }

    pub(crate) async fn secret(&mut self, how: &str, secret: &str) {
        self.stdin.write_all(format!("{how} {secret}\n").as_bytes()).await.expect("write");
        self.stdin.flush().await.expect("flush");
    }

    pub(crate) fn all(&self) -> Vec<Value> {
        self.seen.lock().expect("lock").clone()
    }

    /// Verified deliveries (the first of each event id).
    fn verified(&self) -> Vec<Value> {
        let mut out: Vec<Value> = Vec::new();
        for v in self.all().into_iter().filter(|v| v["verified"] == true) {
            if !out.iter().any(|o| o["id"] == v["id"]) {
                out.push(v);
            }
        }
        out
    }

    /// Waits until `done` holds for the verified deliveries (at most 60 s).
    pub(crate) async fn until(&self, what: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        for _ in 0..600 {
            let v = self.verified();
            if done(&v) {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{what}: the receiver saw {:#?}", self.all());
    }
}

fn types_of(seen: &[Value], subject: &str) -> Vec<String> {
    seen.iter().filter(|v| v["subject"] == subject).filter_map(|v| v["type"].as_str().map(str::to_string)).collect()
}

fn mig(t: &str) -> Value {
    json!({"tenant": t, "spec": {"mode": "mig", "profile": "1g.10gb", "model": "H100-80GB"}, "count": 1})
}

async fn events_reach_the_endpoints_allowed_to_see_them_signed_and_in_order(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let vision = app.tenant("vision", json!({})).await;
    let audio = app.tenant("audio", json!({})).await;
    let (_, vision_admin) = app.user("vision-lead", &[(&vision, Role::TenantAdmin)]).await;
    let vision_dev = app.member("vision-dev", &vision).await;
    let (_, audio_admin) = app.user("audio-lead", &[(&audio, Role::TenantAdmin)]).await;
    let audio_dev = app.member("audio-dev", &audio).await;

    let mut tenant_rx = Receiver::start(&[]).await;
    let mut platform_rx = Receiver::start(&[]).await;
    let slack_rx = Receiver::start(&["--slack"]).await;

    // Who may make endpoints: the tenant's admins (members get 403, other tenants' admins 404), platform admins.
    let hook = |url: &str, types: Value| json!({"url": url, "types": types, "description": "ops"});
    let path = format!("/api/v1/tenants/{vision}/webhooks");
    let (s, _) = app.send(Method::POST, &path, &vision_dev, Some(hook(&tenant_rx.url, json!([])))).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _) = app.send(Method::POST, &path, &audio_admin, Some(hook(&tenant_rx.url, json!([])))).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = app.send(Method::POST, "/api/v1/webhooks", &vision_admin, Some(hook(&tenant_rx.url, json!([])))).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    for (body, code) in [
        (hook("file:///etc/passwd", json!([])), "webhook_bad_url"),
        (hook(&tenant_rx.url, json!(["request.nope"])), "webhook_bad_type"),
        (json!({"url": tenant_rx.url, "format": "xml"}), "webhook_bad_format"),
    ] {
        let (s, p) = app.send(Method::POST, &path, &vision_admin, Some(body)).await;
        assert_eq!((s, p["code"].clone()), (StatusCode::UNPROCESSABLE_ENTITY, json!(code)), "{p}");
    }
    let (s, made) =
        app.send(Method::POST, &path, &vision_admin, Some(hook(&tenant_rx.url, json!(["request.*"])))).await;
    assert_eq!(s, StatusCode::CREATED, "{made}");
    let tenant_hook = made["webhook"]["id"].as_str().expect("id").to_string();
    let secret = made["secret"].as_str().expect("secret").to_string();
    assert!(secret.starts_with("whsec_"), "{made}");
    tenant_rx.secret("add", &secret).await;
    let (s, made) =
        app.send(Method::POST, "/api/v1/webhooks", &app.admin, Some(hook(&platform_rx.url, json!([])))).await;
    assert_eq!(s, StatusCode::CREATED, "{made}");
    platform_rx.secret("add", made["secret"].as_str().expect("secret")).await;
    let slack = json!({"url": slack_rx.url, "format": "slack", "types": ["request.created"]});
    let (s, _) = app.send(Method::POST, "/api/v1/webhooks", &app.admin, Some(slack)).await;
    assert_eq!(s, StatusCode::CREATED);
    // The secret is shown once: reading the endpoint back never shows it.
    let (s, read) = app.get(&format!("/api/v1/webhooks/{tenant_hook}"), &vision_admin).await;
    assert_eq!(s, StatusCode::OK);
    assert!(!read.to_string().contains(&secret), "{read}");
    let (s, _) = app.get(&format!("/api/v1/webhooks/{tenant_hook}"), &audio_admin).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "another tenant's admin does not see the endpoint");
    let (s, _) = app.get(&format!("/api/v1/webhooks/{tenant_hook}"), &vision_dev).await;
    assert_eq!(s, StatusCode::FORBIDDEN);

    // A request of each tenant, approved, then released or cancelled.
    let (_, mine) = app.send(Method::POST, "/api/v1/requests", &vision_dev, Some(mig(&vision))).await;
    let (_, theirs) = app.send(Method::POST, "/api/v1/requests", &audio_dev, Some(mig(&audio))).await;
    let mine_id = mine["id"].as_str().expect("id").to_string();
    let theirs_id = theirs["id"].as_str().expect("id").to_string();
    let (s, b) = app.send(Method::POST, &format!("/api/v1/requests/{mine_id}/approve"), &app.admin, None).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let (s, b) = app.send(Method::POST, &format!("/api/v1/requests/{mine_id}/cancel"), &vision_dev, None).await;
    assert!(s.is_success(), "{b}");
    let (s, b) = app.send(Method::POST, &format!("/api/v1/requests/{theirs_id}/cancel"), &audio_dev, None).await;
    assert!(s.is_success(), "{b}");

    // The tenant's endpoint gets its tenant's request events only, in the order they happened, each verified.
    let subject = format!("request/{mine_id}");
    let seen = tenant_rx
        .until("the tenant's request events", |v| {
            types_of(v, &subject).last().is_some_and(|t| t == "request.cancelled")
        })
        .await;
    assert_eq!(types_of(&seen, &subject), ["request.created", "request.approved", "request.cancelled"], "{seen:#?}");
    assert!(seen.iter().all(|v| v["tenant"] == vision.as_str()), "only its tenant's events: {seen:#?}");
    assert!(seen.iter().all(|v| v["id"] == v["ce_id"] && v["specversion"] == "1.0"), "{seen:#?}");
    assert!(seen.iter().all(|v| v["content_type"] == "application/cloudevents+json"), "{seen:#?}");
    // The platform endpoint gets both tenants' events.
    let other = format!("request/{theirs_id}");
    let seen = platform_rx
        .until("both tenants' events", |v| {
            types_of(v, &subject).len() == 3 && types_of(v, &other).last().is_some_and(|t| t == "request.cancelled")
        })
        .await;
    assert_eq!(types_of(&seen, &other), ["request.created", "request.cancelled"], "{seen:#?}");
    // The chat endpoint gets a line per created request.
    for _ in 0..300 {
        if slack_rx.all().len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let lines = slack_rx.all();
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert!(lines.iter().all(|l| l["text"].as_str().is_some_and(|t| t.starts_with("[request.created] request/"))));

    // No receiver ever saw a delivery it could not verify.
    for rx in [&tenant_rx, &platform_rx] {
        let bad: Vec<Value> = rx.all().into_iter().filter(|v| v["verified"] == false).collect();
        assert!(bad.iter().all(|v| v["error"] == "no secret yet"), "{bad:#?}");
    }

    // A test event reaches that endpoint only; the delivery log shows it delivered.
    let (s, t) = app.send(Method::POST, &format!("/api/v1/webhooks/{tenant_hook}/test"), &vision_admin, None).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{t}");
    let test_id = t["event_id"].clone();
    tenant_rx.until("the test event", |v| v.iter().any(|x| x["id"] == test_id)).await;
    let (s, log) = app.get(&format!("/api/v1/webhooks/{tenant_hook}/deliveries"), &vision_admin).await;
    assert_eq!(s, StatusCode::OK, "{log}");
    let log = log.as_array().cloned().unwrap_or_default();
    assert_eq!(log.len(), 4, "three request events and the test: {log:#?}");
    assert_eq!(log[0]["event_id"], test_id, "newest first: {log:#?}");
    assert!(log.iter().all(|d| d["state"] == "delivered" && d["last_status"] == 204), "{log:#?}");
    assert!(!platform_rx.all().iter().any(|v| v["id"] == test_id), "the test went to one endpoint");

    // Rotation: deliveries carry both signatures during the overlap, so a receiver that knows only the old secret,
    // or only the new one, verifies them.
    let (s, rotated) =
        app.send(Method::POST, &format!("/api/v1/webhooks/{tenant_hook}/rotate-secret"), &vision_admin, None).await;
    assert_eq!(s, StatusCode::OK, "{rotated}");
    let new_secret = rotated["secret"].as_str().expect("secret").to_string();
    assert_ne!(new_secret, secret);
    assert!(rotated["webhook"]["previous_secret_until_ms"].as_i64().is_some(), "{rotated}");
    let (_, r2) = app.send(Method::POST, "/api/v1/requests", &vision_dev, Some(mig(&vision))).await;
    let r2_subject = format!("request/{}", r2["id"].as_str().expect("id"));
    let seen = tenant_rx.until("signed with both secrets", |v| !types_of(v, &r2_subject).is_empty()).await;
    let last = seen.iter().find(|v| v["subject"] == r2_subject).expect("seen");
    assert_eq!(last["signatures"], 2, "{last}");
    tenant_rx.secret("only", &new_secret).await;
    let (s, b) = app
        .send(Method::POST, &format!("/api/v1/requests/{}/cancel", r2["id"].as_str().expect("id")), &vision_dev, None)
        .await;
    assert!(s.is_success(), "{b}");
    tenant_rx
        .until("verified with the new secret alone", |v| {
            types_of(v, &r2_subject).iter().any(|t| t == "request.cancelled")
        })
        .await;

    // Redelivery sends the same event again, with the same id.
    let first = log.last().expect("a delivery")["id"].as_i64().expect("id");
    let again_of = log.last().expect("a delivery")["event_id"].clone();
    let path = format!("/api/v1/webhooks/{tenant_hook}/deliveries/{first}/redeliver");
    let (s, d) = app.send(Method::POST, &path, &vision_admin, None).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{d}");
    for _ in 0..300 {
        if tenant_rx.all().iter().filter(|v| v["id"] == again_of && v["verified"] == true).count() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(tenant_rx.all().iter().filter(|v| v["id"] == again_of && v["verified"] == true).count(), 2);

    // The inbox: members read their tenant's events, never another's; platform admins read all.
    let (s, inbox) = app.get("/api/v1/inbox?limit=500", &vision_dev).await;
    assert_eq!(s, StatusCode::OK, "{inbox}");
    let inbox = inbox.as_array().cloned().unwrap_or_default();
    assert!(inbox.iter().any(|e| e["subject"] == subject && e["type"] == "request.cancelled"), "{inbox:#?}");
    assert!(inbox.iter().all(|e| e["tenant"] == vision.as_str()), "{inbox:#?}");
    let (_, all) = app.get("/api/v1/inbox?limit=500", &app.admin).await;
    assert!(all.as_array().into_iter().flatten().any(|e| e["subject"] == other), "{all}");
    let (s, _) = app.get("/api/v1/inbox?limit=0", &vision_dev).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    // Unread counts: what the member has not read, then nothing once read up to the newest; a new event is one.
    let (_, count) = app.get("/api/v1/inbox/unread", &vision_dev).await;
    assert_eq!(count["unread"].as_u64(), Some(inbox.len() as u64), "{count}");
    assert_eq!(count["latest_seq"], inbox[0]["seq"], "{count}");
    let read = json!({"up_to": count["latest_seq"]});
    let (s, after) = app.send(Method::POST, "/api/v1/inbox/read", &vision_dev, Some(read)).await;
    assert_eq!((s, after["unread"].clone()), (StatusCode::OK, json!(0)), "{after}");
    let (s, after) = app.send(Method::POST, "/api/v1/inbox/read", &vision_dev, Some(json!({"up_to": 0}))).await;
    assert_eq!((s, after["unread"].clone()), (StatusCode::OK, json!(0)), "never backwards: {after}");
    let (s, _) = app.send(Method::POST, "/api/v1/inbox/read", &vision_dev, Some(json!({"up_to": -1}))).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    app.send(Method::POST, "/api/v1/requests", &vision_dev, Some(mig(&vision))).await;
    let (_, count) = app.get("/api/v1/inbox/unread", &vision_dev).await;
    assert_eq!(count["unread"], 1, "{count}");
    // Another tenant's new event is not the member's to read.
    app.send(Method::POST, "/api/v1/requests", &audio_dev, Some(mig(&audio))).await;
    let (_, count) = app.get("/api/v1/inbox/unread", &vision_dev).await;
    assert_eq!(count["unread"], 1, "{count}");

    // Deleting the endpoint: gone, and its log with it.
    let (s, _) = app.send(Method::DELETE, &format!("/api/v1/webhooks/{tenant_hook}"), &audio_admin, None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = app.send(Method::DELETE, &format!("/api/v1/webhooks/{tenant_hook}"), &vision_admin, None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _) = app.get(&format!("/api/v1/webhooks/{tenant_hook}/deliveries"), &vision_admin).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

async fn a_receiver_that_fails_for_a_while_gets_everything_in_order_afterwards(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let t = app.tenant("vision", json!({})).await;
    let dev = app.member("vision-dev", &t).await;
    let mut rx = Receiver::start(&["--fail-for", "6"]).await;
    let (s, made) = app.send(Method::POST, "/api/v1/webhooks", &app.admin, Some(json!({"url": rx.url}))).await;
    assert_eq!(s, StatusCode::CREATED, "{made}");
    rx.secret("add", made["secret"].as_str().expect("secret")).await;
    // Five requests, each created then cancelled, while the receiver answers 500.
    let mut subjects = Vec::new();
    for _ in 0..5 {
        let (s, r) = app.send(Method::POST, "/api/v1/requests", &dev, Some(mig(&t))).await;
        assert_eq!(s, StatusCode::CREATED, "{r}");
        let id = r["id"].as_str().expect("id").to_string();
        let (s, b) = app.send(Method::POST, &format!("/api/v1/requests/{id}/cancel"), &dev, None).await;
        assert!(s.is_success(), "{b}");
        subjects.push(format!("request/{id}"));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(rx.all().iter().any(|v| v["status"] == 500), "the receiver was failing: {:#?}", rx.all());
    let seen = rx
        .until("every event after the outage", |v| {
            subjects.iter().all(|s| types_of(v, s) == ["request.created", "request.cancelled"])
        })
        .await;
    // In order per subject: the first event of each that the receiver accepted was its creation.
    let all = rx.all();
    for s in &subjects {
        let order: Vec<&str> = all
            .iter()
            .filter(|v| v["subject"] == *s && v["status"] == 204)
            .filter_map(|v| v["type"].as_str())
            .collect();
        assert_eq!(order.first().copied(), Some("request.created"), "{s}: {order:?}");
    }
    assert_eq!(seen.len(), 10, "{seen:#?}");
    // The receiver counts a delivery when it answers; the log records it once the server has read that answer, a
    // moment later.
    let log_path = format!("/api/v1/webhooks/{}/deliveries", made["webhook"]["id"].as_str().expect("id"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let log = loop {
        let (_, log) = app.get(&log_path, &app.admin).await;
        let log = log.as_array().cloned().unwrap_or_default();
        if log.iter().all(|d| d["state"] == "delivered") || tokio::time::Instant::now() > deadline {
            break log;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(log.iter().all(|d| d["state"] == "delivered"), "{log:#?}");
    assert!(log.iter().any(|d| d["attempts"].as_i64().is_some_and(|a| a > 1)), "some were retried: {log:#?}");
    // Forgetting the old: finished deliveries and dispatched events before the cut go, nothing newer does.
    let now = tessera_server::store::now_ms();
    assert_eq!(app.store.purge_notifications(now - 60_000).await.expect("purge"), 0);
    let removed = app.store.purge_notifications(now + 1).await.expect("purge");
    assert!(removed >= 10, "{removed}");
    let (_, inbox) = app.get("/api/v1/inbox", &dev).await;
    assert_eq!(inbox, json!([]));
}

/// Makes `n` requests of tenant `t` as `token`, 25 at a time, spread over `bases` (servers on one database); their
/// ids.
async fn many_requests(bases: &[String], token: &str, t: &str, n: usize) -> Vec<String> {
    let client = reqwest::Client::new();
    let mut ids = Vec::new();
    for chunk in 0..n.div_ceil(25) {
        let calls = (0..25.min(n - chunk * 25)).map(|i| {
            let base = &bases[(chunk * 25 + i) % bases.len()];
            client.post(format!("{base}/api/v1/requests")).bearer_auth(token).json(&mig(t)).send()
        });
        for r in futures_util::future::join_all(calls).await {
            let r = r.expect("send");
            assert_eq!(r.status(), StatusCode::CREATED);
            ids.push(r.json::<Value>().await.expect("json")["id"].as_str().expect("id").to_string());
        }
    }
    ids
}

/// Every `request.created` event the inbox holds for `token`: their ids.
async fn created_events(base: &str, token: &str) -> Vec<String> {
    let client = reqwest::Client::new();
    let (mut ids, mut before) = (Vec::new(), None::<i64>);
    loop {
        let cursor = before.map(|b| format!("&before={b}")).unwrap_or_default();
        let page: Value = client
            .get(format!("{base}/api/v1/inbox?limit=500{cursor}"))
            .bearer_auth(token)
            .send()
            .await
            .expect("send")
            .json()
            .await
            .expect("json");
        let page = page.as_array().cloned().unwrap_or_default();
        let Some(last) = page.last() else { return ids };
        before = last["seq"].as_i64();
        ids.extend(
            page.iter().filter(|e| e["type"] == "request.created").filter_map(|e| e["id"].as_str().map(str::to_string)),
        );
    }
}

async fn two_replicas_deliver_each_event_once(db: &TestDb) {
    let one = TestApp::on(db).start().await;
    let two = TestApp::on(db).start().await;
    let admin = one.admin.clone();
    let t = one.tenant("vision", json!({})).await;
    let mut rx = Receiver::start(&[]).await;
    let (s, made) = one.send(Method::POST, "/api/v1/webhooks", &admin, Some(json!({"url": rx.url}))).await;
    assert_eq!(s, StatusCode::CREATED, "{made}");
    rx.secret("add", made["secret"].as_str().expect("secret")).await;
    // Requests made on both replicas; both run the delivery worker on the one database.
    let ids = many_requests(&[one.base.clone(), two.base.clone()], &admin, &t, 300).await;
    let events = created_events(&one.base, &admin).await;
    assert_eq!(events.len(), ids.len());
    rx.until("every event", |v| events.iter().all(|e| v.iter().any(|x| x["id"] == e.as_str()))).await;
    // One delivery per event, each recorded as delivered.
    let hook = made["webhook"]["id"].as_str().expect("id");
    let mut log = Vec::new();
    for _ in 0..600 {
        let (_, page) = one.get(&format!("/api/v1/webhooks/{hook}/deliveries?limit=500"), &admin).await;
        log = page.as_array().cloned().unwrap_or_default();
        if log.iter().all(|d| d["state"] == "delivered") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(log.len(), events.len(), "one delivery per event: {log:#?}");
    // Each attempt was made by one replica only: the receiver got no more posts of an event than its delivery
    // counts attempts (two replicas sending one claim would post twice for one attempt). A post that timed out at
    // the sender and was answered late is a counted attempt, retried with the same id (at least once).
    let all = rx.all();
    for e in &events {
        let posts = all.iter().filter(|v| v["id"] == e.as_str()).count() as i64;
        let row = log.iter().find(|d| d["event_id"] == e.as_str()).expect("its delivery");
        assert!(posts >= 1 && posts <= row["attempts"].as_i64().unwrap_or(0), "event {e}: {posts} posts, {row}");
    }
}

async fn a_server_killed_with_a_thousand_events_pending_delivers_every_one_after_restart(db: &TestDb) {
    use crate::agents::{Server, free_port};
    let admin = tessera_server::http::auth::new_token_secret();
    let fast = [("TESSERA_WEBHOOK_RETRY_CAP_S", "2")];
    let mut server = Server::start_with(&db.url, free_port(), &admin, &fast).await;
    let (s, tenant) = server.call(Method::POST, "/api/v1/tenants", Some(json!({"name": "vision"}))).await;
    assert_eq!(s, StatusCode::CREATED, "{tenant}");
    let t = tenant["id"].as_str().expect("id").to_string();
    // The receiver is down: every delivery fails and stays pending.
    let port = crate::agents::free_port();
    let url = format!("http://127.0.0.1:{port}/hook");
    let (s, made) = server.call(Method::POST, "/api/v1/webhooks", Some(json!({"url": url}))).await;
    assert_eq!(s, StatusCode::CREATED, "{made}");
    let hook = made["webhook"]["id"].as_str().expect("id").to_string();
    let ids = many_requests(std::slice::from_ref(&server.base), &admin, &t, 1000).await;
    // Killed (SIGKILL) once deliveries have been tried and failed.
    for _ in 0..300 {
        let (_, log) = server.call(Method::GET, &format!("/api/v1/webhooks/{hook}/deliveries?limit=1"), None).await;
        if log[0]["attempts"].as_i64().is_some_and(|a| a > 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.stop().await;
    let mut server = Server::start_with(&db.url, server.port, &admin, &fast).await;
    let events = created_events(&server.base, &admin).await;
    assert_eq!(events.len(), ids.len(), "an event for every request made");
    let mut rx = Receiver::start_on(port, &[]).await;
    rx.secret("add", made["secret"].as_str().expect("secret")).await;
    for _ in 0..1200 {
        let seen = rx.verified();
        if events.iter().all(|e| seen.iter().any(|x| x["id"] == e.as_str())) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seen = rx.verified();
    let missing = events.iter().filter(|e| !seen.iter().any(|x| x["id"] == e.as_str())).count();
    assert_eq!(missing, 0, "{missing} of {} events never arrived", events.len());
    // A copy of an event (sent before the kill, answered after) carries the same id, so receivers drop it.
    assert!(rx.all().iter().filter(|v| v["verified"] == true).all(|v| events.iter().any(|e| v["id"] == e.as_str())));
    server.stop().await;
}

async fn active_requests_are_told_a_day_and_an_hour_before_their_end(db: &TestDb) {
    use tessera_core::request::RequestState;
    use tessera_server::store::Transition;
    let app = TestApp::on(db).start().await;
    let t = app.tenant("vision", json!({})).await;
    let dev = app.member("vision-dev", &t).await;
    let hour = 3_600_000i64;
    // Two active requests: one for two days, one for two hours.
    let mut active = Vec::new();
    for hours in [48, 2] {
        let mut body = mig(&t);
        body["duration_s"] = json!(hours * 3600);
        let (s, r) = app.send(Method::POST, "/api/v1/requests", &dev, Some(body)).await;
        assert_eq!(s, StatusCode::CREATED, "{r}");
        let id = r["id"].as_str().expect("id").to_string();
        for to in [RequestState::Approved, RequestState::Provisioning, RequestState::Active] {
            let t = Transition { id: &id, expected_version: None, to, reason: None, actor: "test" };
            app.store.transition(t).await.expect("transition");
        }
        active.push(id);
    }
    let now = tessera_server::store::now_ms();
    let reminders = |app: &TestApp, id: &str| {
        let (base, dev, id) = (app.base.clone(), dev.clone(), id.to_string());
        async move {
            let inbox: Value = reqwest::Client::new()
                .get(format!("{base}/api/v1/inbox?limit=500"))
                .bearer_auth(&dev)
                .send()
                .await
                .expect("send")
                .json()
                .await
                .expect("json");
            inbox
                .as_array()
                .into_iter()
                .flatten()
                .filter(|e| e["type"] == "request.expiring" && e["subject"] == format!("request/{id}"))
                .map(|e| e["data"]["after"]["reminder_ms"].as_i64().expect("lead"))
                .collect::<Vec<i64>>()
        }
    };
    // Nothing is near yet.
    assert_eq!(app.store.remind_expiring(now).await.expect("remind"), 0);
    // An hour and a half later: the short request has an hour left.
    assert_eq!(app.store.remind_expiring(now + 90 * 60_000).await.expect("remind"), 1);
    assert_eq!(reminders(&app, &active[1]).await, [hour]);
    // The day before the long one ends, then its last hour; each reminder once.
    assert_eq!(app.store.remind_expiring(now + 25 * hour).await.expect("remind"), 1);
    assert_eq!(app.store.remind_expiring(now + 25 * hour).await.expect("remind"), 0);
    assert_eq!(app.store.remind_expiring(now + 47 * hour + 30 * 60_000).await.expect("remind"), 1);
    assert_eq!(reminders(&app, &active[0]).await, [hour, 24 * hour], "newest first");
    // The other tenant's members never read them.
    let other = app.tenant("audio", json!({})).await;
    let stranger = app.member("audio-dev", &other).await;
    let (_, inbox) = app.get("/api/v1/inbox?limit=500", &stranger).await;
    assert_eq!(inbox, json!([]));
}

/// A running SMTP server and the messages it took.
struct MailServer {
    _child: Child,
    port: u16,
    seen: Arc<Mutex<Vec<Value>>>,
}

impl MailServer {
    async fn start(extra: &[&str]) -> MailServer {
        let args: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
        let (child, port, seen) = spawn_script("smtp/server.py", &args).await;
        MailServer { _child: child, port, seen }
    }

    pub(crate) fn all(&self) -> Vec<Value> {
        self.seen.lock().expect("lock").clone()
    }

    /// The messages taken for `to`.
    fn to(&self, to: &str) -> Vec<Value> {
        self.all()
            .into_iter()
            .filter(|m| {
                m["rcpt_tos"].as_array().is_some_and(|r| r.iter().any(|a| a == to)) && m.get("subject").is_some()
            })
            .collect()
    }

    /// Waits until the text of `to`'s messages holds every one of `words` (at most 60 s); the messages.
    async fn until(&self, to: &str, words: &[&str]) -> Vec<Value> {
        for _ in 0..600 {
            let got = self.to(to);
            let text: String = got.iter().filter_map(|m| m["text"].as_str()).collect();
            if words.iter().all(|w| text.contains(w)) {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("mail to {to} with {words:?}: the server took {:#?}", self.all());
    }
}

async fn mail_reaches_the_users_who_chose_it_and_may_read_it(db: &TestDb) {
    // The mail server defers each recipient's first message (451): mail is tried again, not lost.
    let smtp = MailServer::start(&["--defer-first", "--refuse", "gone@vision.example"]).await;
    let app = TestApp::on(db)
        .email(tessera_server::services::email::EmailSettings {
            smtp_url: format!("smtp://127.0.0.1:{}", smtp.port),
            from: "Tessera <tessera@example.com>".into(),
            portal_url: "https://gpus.example.com".into(),
        })
        .start()
        .await;
    let vision = app.tenant("vision", json!({})).await;
    let audio = app.tenant("audio", json!({})).await;
    let dev = app.member("dev@vision.example", &vision).await;
    let quiet = app.member("quiet@vision.example", &vision).await;
    let gone = app.member("gone@vision.example", &vision).await;
    let ops = app.member("ops@audio.example", &audio).await;
    let nameless = app.member("vision-bot", &vision).await;

    // Settings: mail is on, the address is the user's name (an address), nothing is chosen yet.
    let (s, got) = app.get("/api/v1/notification-settings", &dev).await;
    assert_eq!(s, StatusCode::OK, "{got}");
    assert_eq!((got["email_enabled"].clone(), got["email"].clone()), (json!(true), json!("dev@vision.example")));
    assert_eq!(got["email_types"], json!([]), "{got}");
    let (_, got) = app.get("/api/v1/notification-settings", &nameless).await;
    assert_eq!(got["email"], Value::Null, "a name that is no address gives no address: {got}");
    // Choices are checked: known types or areas, at most 64, never the webhook test.
    let many: Vec<String> = (0..65).map(|_| "request.*".to_string()).collect();
    for bad in [json!(["request.nope"]), json!(["webhook.test"]), json!(many)] {
        let body = json!({ "email_types": bad });
        let (s, p) = app.send(Method::PUT, "/api/v1/notification-settings", &dev, Some(body)).await;
        assert_eq!((s, p["code"].clone()), (StatusCode::UNPROCESSABLE_ENTITY, json!("email_bad_type")), "{p}");
    }
    let choose = |types: Value| Some(json!({ "email_types": types }));
    let (s, got) = app
        .send(
            Method::PUT,
            "/api/v1/notification-settings",
            &dev,
            choose(json!(["request.created", "request.approved"])),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{got}");
    assert_eq!(got["email_types"], json!(["request.created", "request.approved"]));
    for who in [&ops, &gone, &nameless] {
        let (s, got) = app.send(Method::PUT, "/api/v1/notification-settings", who, choose(json!(["*"]))).await;
        assert_eq!(s, StatusCode::OK, "{got}");
    }

    // A vision request, approved, then cancelled; an audio request.
    let (s, mine) = app.send(Method::POST, "/api/v1/requests", &dev, Some(mig(&vision))).await;
    assert_eq!(s, StatusCode::CREATED, "{mine}");
    let mine_id = mine["id"].as_str().expect("id").to_string();
    let (s, b) = app.send(Method::POST, &format!("/api/v1/requests/{mine_id}/approve"), &app.admin, None).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let (s, b) = app.send(Method::POST, &format!("/api/v1/requests/{mine_id}/cancel"), &dev, None).await;
    assert!(s.is_success(), "{b}");
    let (s, theirs) = app.send(Method::POST, "/api/v1/requests", &ops, Some(mig(&audio))).await;
    assert_eq!(s, StatusCode::CREATED, "{theirs}");
    let theirs_id = theirs["id"].as_str().expect("id").to_string();

    // The member is mailed the two types chosen, not the cancellation; plain text and HTML, each with a link to
    // the request's page, marked as sent by a machine.
    let mail = smtp.until("dev@vision.example", &["A slice request was made", "A request was approved"]).await;
    let link = format!("https://gpus.example.com/requests/{mine_id}");
    for m in &mail {
        assert_eq!(m["multipart"], "multipart/alternative", "{m:#}");
        assert_eq!(m["auto_submitted"], "auto-generated", "{m:#}");
        assert!(m["from"].as_str().is_some_and(|f| f.contains("tessera@example.com")), "{m:#}");
        assert!(m["subject"].as_str().is_some_and(|s| s.starts_with("[Tessera] ")), "{m:#}");
        let (text, html) = (m["text"].as_str().unwrap_or_default(), m["html"].as_str().unwrap_or_default());
        assert!(text.contains(&link) && text.contains(&format!("request/{mine_id}")), "{text}");
        assert!(html.contains(&format!("<a href=\"{link}\">")), "{html}");
        assert!(!text.contains("cancelled") && !text.contains(&theirs_id), "only what was chosen: {text}");
    }
    let deferred =
        |to: &str| smtp.all().iter().any(|m| m["deferred"].as_array().is_some_and(|r| r.iter().any(|a| a == to)));
    assert!(deferred("dev@vision.example"), "the first attempt was deferred");
    // The mail server keeps a message before it answers 250, so the log may still say "pending" for a moment.
    let mut got = Value::Null;
    for _ in 0..300 {
        (_, got) = app.get("/api/v1/notification-settings", &dev).await;
        if got["recent"].as_array().is_some_and(|r| r.len() >= 2 && r.iter().all(|d| d["state"] == "delivered")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let recent = got["recent"].as_array().cloned().unwrap_or_default();
    assert_eq!(recent.len(), 2, "{got:#}");
    assert!(recent.iter().all(|d| d["state"] == "delivered" && d["address"] == "dev@vision.example"), "{got:#}");
    assert!(recent.iter().any(|d| d["attempts"].as_i64().is_some_and(|a| a >= 2)), "tried again: {got:#}");

    // Another tenant's member chose every type and gets its own tenant's events only.
    let mail = smtp.until("ops@audio.example", &[&format!("request/{theirs_id}")]).await;
    for m in &mail {
        let text = m["text"].as_str().unwrap_or_default();
        assert!(!text.contains(&mine_id) && !text.contains(&vision), "never another tenant's: {text}");
    }
    // A refused address fails at once, with the server's answer in the log.
    let mut failed = Value::Null;
    for _ in 0..300 {
        let (_, got) = app.get("/api/v1/notification-settings", &gone).await;
        if got["recent"].as_array().is_some_and(|r| !r.is_empty() && r.iter().all(|d| d["state"] == "failed")) {
            failed = got;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let recent = failed["recent"].as_array().cloned().unwrap_or_default();
    assert!(!recent.is_empty(), "the refused address's deliveries fail: {failed:#}");
    assert!(recent.iter().all(|d| d["last_error"].as_str().is_some_and(|e| e.contains("550"))), "{failed:#}");
    // Who chose nothing, or has no address, is mailed nothing.
    assert!(smtp.to("quiet@vision.example").is_empty());
    let (_, got) = app.get("/api/v1/notification-settings", &quiet).await;
    assert_eq!(got["recent"], json!([]), "{got}");
    let (_, got) = app.get("/api/v1/notification-settings", &nameless).await;
    assert_eq!(got["recent"], json!([]), "{got}");
    // Choosing nothing stops the mail.
    let (s, _) = app.send(Method::PUT, "/api/v1/notification-settings", &dev, choose(json!([]))).await;
    assert_eq!(s, StatusCode::OK);
    let before = smtp.to("dev@vision.example").len();
    let (s, _) = app.send(Method::POST, "/api/v1/requests", &dev, Some(mig(&vision))).await;
    assert_eq!(s, StatusCode::CREATED);
    // An event after it, mailed to someone else: once that arrives, the one before was dispatched too.
    let (_, later) = app.send(Method::POST, "/api/v1/requests", &ops, Some(mig(&audio))).await;
    smtp.until("ops@audio.example", &[&format!("request/{}", later["id"].as_str().expect("id"))]).await;
    assert_eq!(smtp.to("dev@vision.example").len(), before, "no mail once nothing is chosen");
}

async fn tenants_webhooks_never_point_inside_the_network(db: &TestDb) {
    // As `tessera serve` runs by default: tenants' endpoints reach internet addresses only.
    let app = TestApp::on(db).strict_webhooks().start().await;
    let t = app.tenant("vision", json!({})).await;
    let (_, lead) = app.user("vision-lead", &[(&t, Role::TenantAdmin)]).await;
    let path = format!("/api/v1/tenants/{t}/webhooks");
    for url in [
        "http://127.0.0.1:9/hook",
        "http://localhost:9/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://10.0.0.7/hook",
        "http://[::1]:9/hook",
        "http://[fd00::1]/hook",
        "http://0.0.0.0:9/hook",
        "http://[64:ff9b::a9fe:a9fe]/latest/meta-data",
        "http://[64:ff9b::a00:1]/hook",
        "http://[64:ff9b:1::a00:1]/hook",
        "http://[::a00:1]/hook",
        "http://[::ffff:a9fe:a9fe]/hook",
        "http://[2002:a9fe:a9fe::1]/hook",
        "http://[2001:0:4136:e378:8000:63bf:f5ff:fffe]/hook",
        "http://[fec0::1]/hook",
        "http://198.18.0.1/hook",
        "http://192.0.0.8/hook",
        "http://240.0.0.1/hook",
        "http://100.64.0.1/hook",
        "http://224.0.0.1/hook",
        "http://192.0.2.1/hook",
        "http://255.255.255.255/hook",
    ] {
        let (s, p) = app.send(Method::POST, &path, &lead, Some(json!({ "url": url }))).await;
        assert_eq!(
            (s, p["code"].clone()),
            (StatusCode::UNPROCESSABLE_ENTITY, json!("webhook_internal_address")),
            "{url}: {p}"
        );
    }
    let (_, list) = app.get(&path, &lead).await;
    assert_eq!(list, json!([]), "nothing half-made");
    let (s, made) = app.send(Method::POST, &path, &lead, Some(json!({ "url": "https://hooks.example.com/x" }))).await;
    assert_eq!(s, StatusCode::CREATED, "{made}");
    // Platform admins run the platform: theirs may point anywhere.
    let (s, made) =
        app.send(Method::POST, "/api/v1/webhooks", &app.admin, Some(json!({ "url": "http://127.0.0.1:9/x" }))).await;
    assert_eq!(s, StatusCode::CREATED, "{made}");
}

/// The next `inbox` event of a server-sent event stream within `within`, its data parsed; `None` when none came.
async fn next_inbox(r: &mut reqwest::Response, buf: &mut String, within: Duration) -> Option<Value> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            if block.lines().any(|l| l == "event: inbox") {
                let data = block.lines().find_map(|l| l.strip_prefix("data: ")).expect("data line");
                return Some(serde_json::from_str(data).expect("json"));
            }
            continue;
        }
        match tokio::time::timeout_at(deadline, r.chunk()).await {
            Ok(Ok(Some(chunk))) => buf.push_str(&String::from_utf8_lossy(&chunk)),
            _ => return None,
        }
    }
}

async fn the_inbox_stream_tells_each_change_to_those_who_may_read_it(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let vision = app.tenant("vision", json!({})).await;
    let audio = app.tenant("audio", json!({})).await;
    let vision_dev = app.member("vision-dev", &vision).await;
    let audio_dev = app.member("audio-dev", &audio).await;
    // Something to read before the stream opens.
    app.send(Method::POST, "/api/v1/requests", &vision_dev, Some(mig(&vision))).await;

    let open = |token: &str| app.client.get(format!("{}/api/v1/inbox/stream", app.base)).bearer_auth(token).send();
    let mut stream = open(&vision_dev).await.expect("send");
    assert_eq!(stream.status(), StatusCode::OK);
    let kind = stream.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    assert!(kind.starts_with("text/event-stream"), "{kind}");
    let mut buf = String::new();
    let first = next_inbox(&mut stream, &mut buf, Duration::from_secs(5)).await.expect("the count at once");
    let (_, count) = app.get("/api/v1/inbox/unread", &vision_dev).await;
    assert_eq!(first, count, "the stream's first event is the unread count");
    assert_eq!(first["unread"], 1, "{first}");
    assert!(buf.is_empty() || !buf.contains("event: inbox"));

    // A new event of the member's tenant reaches the stream within seconds (the watch asks every second).
    let started = std::time::Instant::now();
    app.send(Method::POST, "/api/v1/requests", &vision_dev, Some(mig(&vision))).await;
    let next = next_inbox(&mut stream, &mut buf, Duration::from_secs(5)).await.expect("told of the new event");
    assert_eq!(next["unread"], 2, "{next}");
    assert!(next["latest_seq"].as_i64() > first["latest_seq"].as_i64(), "{next} after {first}");
    assert!(started.elapsed() < Duration::from_secs(3), "told after {:?}", started.elapsed());

    // Another tenant's event is not the member's: its stream stays quiet, while the other tenant's member is told.
    let mut audio_stream = open(&audio_dev).await.expect("send");
    let mut audio_buf = String::new();
    let audio_first = next_inbox(&mut audio_stream, &mut audio_buf, Duration::from_secs(5)).await.expect("count");
    assert_eq!(audio_first["unread"], 0, "{audio_first}");
    app.send(Method::POST, "/api/v1/requests", &audio_dev, Some(mig(&audio))).await;
    let told = next_inbox(&mut audio_stream, &mut audio_buf, Duration::from_secs(5)).await.expect("audio told");
    assert_eq!(told["unread"], 1, "{told}");
    assert_eq!(next_inbox(&mut stream, &mut buf, Duration::from_secs(3)).await, None, "vision's stream stays quiet");

    // Reading the inbox (say in another tab) is told at once.
    let read = json!({"up_to": next["latest_seq"]});
    let (s, _) = app.send(Method::POST, "/api/v1/inbox/read", &vision_dev, Some(read)).await;
    assert_eq!(s, StatusCode::OK);
    let cleared = next_inbox(&mut stream, &mut buf, Duration::from_secs(3)).await.expect("told of the read");
    assert_eq!(cleared["unread"], 0, "{cleared}");

    // At most 32 streams a user on one replica (browser tabs): the 33rd is refused.
    let mut tabs = Vec::new();
    for _ in 0..31 {
        let r = open(&vision_dev).await.expect("send");
        assert_eq!(r.status(), StatusCode::OK);
        tabs.push(r);
    }
    let r = open(&vision_dev).await.expect("send");
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let body: Value = r.json().await.expect("problem");
    assert_eq!(body["code"], "too_many_streams", "{body}");
    assert_eq!(open(&audio_dev).await.expect("send").status(), StatusCode::OK, "another user's streams are their own");

    // Without credentials: 401, no stream.
    let r = app.client.get(format!("{}/api/v1/inbox/stream", app.base)).send().await.expect("send");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
}
