//! Webhooks as a way into the network or out of the database: tenants' endpoints never reach an internal address,
//! in any of its forms or when sending, unless the operator's allow list names it; the delivery log tells a status
//! and a class, never what the target answered; signing secrets are sealed at rest (on SQLite and PostgreSQL), and
//! rows from before sealing keep signing and are sealed at the next start; tests and redeliveries are throttled.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tessera_server::store::Role;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness::{TestApp, TestDb, on_both_backends};
use crate::notifications::Receiver;

on_both_backends!(secrets_are_sealed_at_rest_and_plain_rows_from_before_still_sign);

/// Reads one column of one row of `db` by raw SQL.
async fn stored(db: &TestDb, sql: &str, id: &str) -> Option<String> {
    if db.url.starts_with("sqlite:") {
        let pool = sqlx::SqlitePool::connect(&db.url).await.expect("sqlite");
        let v = sqlx::query_scalar(sql).bind(id).fetch_one(&pool).await.expect("read");
        pool.close().await;
        v
    } else {
        let pool = sqlx::PgPool::connect(&db.url).await.expect("postgres");
        let v = sqlx::query_scalar(sql).bind(id).fetch_one(&pool).await.expect("read");
        pool.close().await;
        v
    }
}

/// Writes an endpoint's secret as plain text, as stored before secrets were sealed.
async fn store_plain(db: &TestDb, id: &str, secret: &str) {
    let sql = "UPDATE webhooks SET secret = $1, previous_secret = NULL WHERE id = $2";
    let done = if db.url.starts_with("sqlite:") {
        let pool = sqlx::SqlitePool::connect(&db.url).await.expect("sqlite");
        let done = sqlx::query(sql).bind(secret).bind(id).execute(&pool).await.expect("update").rows_affected();
        pool.close().await;
        done
    } else {
        let pool = sqlx::PgPool::connect(&db.url).await.expect("postgres");
        let done = sqlx::query(sql).bind(secret).bind(id).execute(&pool).await.expect("update").rows_affected();
        pool.close().await;
        done
    };
    assert_eq!(done, 1);
}

fn tests_seen(seen: &[Value]) -> usize {
    seen.iter().filter(|v| v["type"] == "webhook.test").count()
}

async fn secrets_are_sealed_at_rest_and_plain_rows_from_before_still_sign(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let mut rx = Receiver::start(&[]).await;
    let (s, made) = app.send(Method::POST, "/api/v1/webhooks", &app.admin, Some(json!({"url": rx.url}))).await;
    assert_eq!(s, StatusCode::CREATED, "{made}");
    let id = made["webhook"]["id"].as_str().expect("id").to_string();
    let secret = made["secret"].as_str().expect("secret").to_string();
    let column = stored(db, "SELECT secret FROM webhooks WHERE id = $1", &id).await.expect("secret");
    assert!(column.starts_with("enc:v1:"), "sealed: {column}");
    assert!(!column.contains(&secret) && !column.contains(&secret["whsec_".len()..]), "{column}");
    rx.secret("add", &secret).await;
    let (s, sent) = app.send(Method::POST, &format!("/api/v1/webhooks/{id}/test"), &app.admin, None).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{sent}");
    rx.until("a test signed with the sealed secret", |v| tests_seen(v) == 1).await;
    // A rotation seals the new secret; the previous one stays sealed.
    let (s, rotated) = app.send(Method::POST, &format!("/api/v1/webhooks/{id}/rotate-secret"), &app.admin, None).await;
    assert_eq!(s, StatusCode::OK, "{rotated}");
    let new_secret = rotated["secret"].as_str().expect("secret");
    let column = stored(db, "SELECT secret FROM webhooks WHERE id = $1", &id).await.expect("secret");
    let previous = stored(db, "SELECT previous_secret FROM webhooks WHERE id = $1", &id).await.expect("previous");
    assert!(column.starts_with("enc:v1:") && !column.contains(&new_secret["whsec_".len()..]), "{column}");
    assert!(previous.starts_with("enc:v1:") && !previous.contains(&secret["whsec_".len()..]), "{previous}");
    // A row from before sealing: plain text signs as it did.
    let plain = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    store_plain(db, &id, plain).await;
    rx.secret("only", plain).await;
    tokio::time::sleep(Duration::from_secs(10)).await; // the test throttle: one per endpoint per 10 s
    let (s, sent) = app.send(Method::POST, &format!("/api/v1/webhooks/{id}/test"), &app.admin, None).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{sent}");
    rx.until("a test signed with the plain-text secret", |v| tests_seen(v) == 2).await;
    let admin = app.admin.clone();
    drop(app);
    // The next start seals it, and it still signs.
    let again = TestApp::on(db).start().await;
    let column = stored(db, "SELECT secret FROM webhooks WHERE id = $1", &id).await.expect("secret");
    assert!(column.starts_with("enc:v1:") && !column.contains(&plain["whsec_".len()..]), "sealed at start: {column}");
    let (s, sent) = again.send(Method::POST, &format!("/api/v1/webhooks/{id}/test"), &admin, None).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{sent}");
    rx.until("a test signed with the secret sealed at start", |v| tests_seen(v) == 3).await;
}

/// Waits for an endpoint's newest delivery to have been tried; the delivery log's entry.
async fn tried(app: &TestApp, hook: &str) -> Value {
    for _ in 0..300 {
        let (s, log) = app.get(&format!("/api/v1/webhooks/{hook}/deliveries"), &app.admin).await;
        assert_eq!(s, StatusCode::OK, "{log}");
        if let Some(d) = log.as_array().and_then(|l| l.first()).filter(|d| d["attempts"].as_i64() > Some(0)) {
            return d.clone();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no attempt to {hook}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_allow_list_lets_named_receivers_in_and_literal_addresses_are_checked_again_when_sending() {
    let app = TestApp::sqlite().webhook_allow(&["127.0.0.1/32"]).start().await;
    let t = app.tenant("vision", json!({})).await;
    let (_, lead) = app.user("vision-lead", &[(&t, Role::TenantAdmin)]).await;
    let path = format!("/api/v1/tenants/{t}/webhooks");
    let mut rx = Receiver::start(&[]).await;
    let (s, made) = app.send(Method::POST, &path, &lead, Some(json!({ "url": rx.url }))).await;
    assert_eq!(s, StatusCode::CREATED, "an allowed network: {made}");
    rx.secret("add", made["secret"].as_str().expect("secret")).await;
    let id = made["webhook"]["id"].as_str().expect("id");
    let (s, sent) = app.send(Method::POST, &format!("/api/v1/webhooks/{id}/test"), &lead, None).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{sent}");
    rx.until("the test event at an allowed address", |v| tests_seen(v) == 1).await;
    for url in ["http://[::1]:9/hook", "http://127.0.0.2/hook", "http://[64:ff9b::a9fe:a9fe]/hook", "http://10.0.0.1/"]
    {
        let (s, p) = app.send(Method::POST, &path, &lead, Some(json!({ "url": url }))).await;
        assert_eq!(
            (s, p["code"].clone()),
            (StatusCode::UNPROCESSABLE_ENTITY, json!("webhook_internal_address")),
            "{url}"
        );
    }

    // An endpoint written before the rule (or a setting that changed since) is refused when sending: the HTTP
    // client connects to a literal address without resolving it, so it is checked before.
    let strict = TestApp::sqlite().strict_webhooks().start().await;
    let t = strict.tenant("vision", json!({})).await;
    let (_, lead) = strict.user("vision-lead", &[(&t, Role::TenantAdmin)]).await;
    let rx = Receiver::start(&[]).await;
    let w = strict
        .store
        .create_webhook(tessera_server::store::notifications::NewWebhook {
            tenant_id: Some(&t),
            url: &rx.url,
            format: "standard",
            types: &[],
            description: "",
            secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            actor: "test",
        })
        .await
        .expect("written");
    let (s, sent) = strict.send(Method::POST, &format!("/api/v1/webhooks/{}/test", w.id), &lead, None).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{sent}");
    let d = tried(&strict, &w.id).await;
    assert_eq!((d["last_error"].clone(), d["last_status"].clone()), (json!("address_not_allowed"), Value::Null), "{d}");
    assert!(rx.all().iter().all(|v| v.get("type").is_none()), "nothing reached the receiver: {:?}", rx.all());
}

/// A receiver that answers every request with `answer` (a status line and headers), then `body`; its URL.
async fn answering(answer: &'static str, body: &'static str) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                // The request: its head, then as many bytes as its Content-Length.
                loop {
                    let Ok(n) = conn.read(&mut buf).await else { return };
                    if n == 0 {
                        return;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&seen).to_ascii_lowercase();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let len = text
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        if seen.len() >= end + 4 + len {
                            break;
                        }
                    }
                }
                let reply = format!("{answer}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
                let _ = conn.write_all(reply.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_delivery_log_shows_the_status_and_a_class_never_what_the_target_answered() {
    let app = TestApp::sqlite().start().await;
    let failing = answering("HTTP/1.1 500 Internal Server Error", "db password=INTERNAL-ONLY-hunter2").await;
    let moved = answering("HTTP/1.1 302 Found\r\nlocation: http://169.254.169.254/latest", "INTERNAL-ONLY moved").await;
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        format!("http://{}/hook", l.local_addr().expect("addr"))
    };
    for (url, status, class) in [
        (failing, json!(500), "http_status"),
        (moved, json!(302), "redirect_refused"),
        (closed, Value::Null, "connect_failed"),
    ] {
        let (s, made) = app.send(Method::POST, "/api/v1/webhooks", &app.admin, Some(json!({ "url": url }))).await;
        assert_eq!(s, StatusCode::CREATED, "{made}");
        let id = made["webhook"]["id"].as_str().expect("id");
        let (s, _) = app.send(Method::POST, &format!("/api/v1/webhooks/{id}/test"), &app.admin, None).await;
        assert_eq!(s, StatusCode::ACCEPTED);
        let d = tried(&app, id).await;
        assert_eq!((d["last_status"].clone(), d["last_error"].as_str()), (status, Some(class)), "{url}: {d}");
        let (_, log) = app.get(&format!("/api/v1/webhooks/{id}/deliveries"), &app.admin).await;
        assert!(!log.to_string().contains("INTERNAL-ONLY"), "{url}: {log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tests_and_redeliveries_are_throttled_with_a_429_and_when_to_retry() {
    let app = TestApp::sqlite().start().await;
    let mut hooks = Vec::new();
    for _ in 0..2 {
        let (s, made) =
            app.send(Method::POST, "/api/v1/webhooks", &app.admin, Some(json!({"url": "http://127.0.0.1:9/x"}))).await;
        assert_eq!(s, StatusCode::CREATED, "{made}");
        hooks.push(made["webhook"]["id"].as_str().expect("id").to_string());
    }
    let test = |id: &str| format!("/api/v1/webhooks/{id}/test");
    let first = app.call(Method::POST, &test(&hooks[0]), Some(&app.admin)).send().await.expect("send");
    assert_eq!(first.status(), StatusCode::ACCEPTED);
    let again = app.call(Method::POST, &test(&hooks[0]), Some(&app.admin)).send().await.expect("send");
    assert_eq!(again.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = again.headers()["retry-after"].to_str().expect("text").parse().expect("seconds");
    assert!((1..=10).contains(&retry), "{retry}");
    assert_eq!(again.headers()["content-type"], "application/problem+json");
    let p: Value = again.json().await.expect("json");
    assert_eq!((p["code"].as_str(), p["status"].as_u64()), (Some("rate_limited"), Some(429)), "{p}");
    // Another endpoint has its own turn.
    let other = app.call(Method::POST, &test(&hooks[1]), Some(&app.admin)).send().await.expect("send");
    assert_eq!(other.status(), StatusCode::ACCEPTED);
    // A redelivery: once per delivery per 10 s.
    let d = tried(&app, &hooks[0]).await;
    let redeliver = format!("/api/v1/webhooks/{}/deliveries/{}/redeliver", hooks[0], d["id"]);
    let (s, body) = app.send(Method::POST, &redeliver, &app.admin, None).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{body}");
    let (s, body) = app.send(Method::POST, &redeliver, &app.admin, None).await;
    assert_eq!((s, body["code"].as_str()), (StatusCode::TOO_MANY_REQUESTS, Some("rate_limited")), "{body}");
}

#[cfg(unix)]
#[tokio::test]
async fn the_sqlite_database_file_is_for_its_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let db = crate::harness::sqlite().await;
    let path = db.url.trim_start_matches("sqlite://").to_string();
    let mode = std::fs::metadata(&path).expect("file").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{path}");
    db.close().await;
}
