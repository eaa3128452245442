//! Long-lived streams (live telemetry, inbox): caps per user, per client address and in all, a lifetime, and the
//! caller's right checked while they run, so that one member cannot take the connections everybody else needs
//! and a revoked member's stream ends within 5 s.

use std::time::{Duration, Instant};

use reqwest::{Method, Response, StatusCode};
use serde_json::{Value, json};
use tessera_server::store::Role;

use crate::harness::TestApp;

const STREAMS: [&str; 2] = ["/api/v1/telemetry/live", "/api/v1/inbox/stream"];

async fn open(app: &TestApp, path: &str, token: &str) -> Response {
    app.call(Method::GET, path, Some(token)).send().await.expect("send")
}

/// Reads `r` until it ends; how long that took, or `None` when it was still open after `within`.
async fn ended_within(r: &mut Response, within: Duration) -> Option<Duration> {
    let started = Instant::now();
    tokio::time::timeout(within, async { while let Ok(Some(_)) = r.chunk().await {} })
        .await
        .ok()
        .map(|()| started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_user_holds_at_most_32_live_streams_and_everybody_else_is_still_served() {
    let app = TestApp::sqlite().start().await;
    let tenant = app.tenant("vision", json!({})).await;
    let member = app.member("greedy", &tenant).await;
    let mut held = Vec::new();
    for i in 0..32 {
        let r = open(&app, STREAMS[0], &member).await;
        assert_eq!(r.status(), StatusCode::OK, "stream {i}");
        held.push(r);
    }
    let r = open(&app, STREAMS[0], &member).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let body: Value = r.json().await.expect("problem");
    assert_eq!(body["code"], "too_many_streams", "{body}");
    assert!(body["detail"].as_str().is_some_and(|d| d.contains("32 live telemetry streams a user")), "{body}");

    // Everybody else: anonymous health, the platform admin, another tenant's member.
    let t = Instant::now();
    let r = app.call(Method::GET, "/healthz", None).send().await.expect("healthz");
    assert_eq!(r.status(), StatusCode::OK);
    assert!(t.elapsed() < Duration::from_secs(1), "healthz took {:?}", t.elapsed());
    let other_tenant = app.tenant("audio", json!({})).await;
    let other = app.member("other", &other_tenant).await;
    for token in [&app.admin, &other] {
        let r = open(&app, STREAMS[0], token).await;
        assert_eq!(r.status(), StatusCode::OK, "another user's streams are their own");
        held.push(r);
    }
    // The inbox is another kind: the greedy member still has its own 32 of those.
    let r = open(&app, STREAMS[1], &member).await;
    assert_eq!(r.status(), StatusCode::OK);
    held.push(r);

    // A place is free again once a stream is closed.
    held.swap_remove(0);
    let again = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let r = open(&app, STREAMS[0], &member).await;
            if r.status() == StatusCode::OK {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(again.is_ok(), "a closed stream's place comes back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_client_address_holds_at_most_64_streams() {
    let app = TestApp::sqlite().start().await;
    let tenant = app.tenant("vision", json!({})).await;
    let mut held = Vec::new();
    // Three users from one address (127.0.0.1): 32 + 32 streams, then the address is at its cap.
    let first = app.member("first", &tenant).await;
    let second = app.member("second", &tenant).await;
    let third = app.member("third", &tenant).await;
    for token in [&first, &second] {
        for _ in 0..32 {
            let r = open(&app, STREAMS[0], token).await;
            assert_eq!(r.status(), StatusCode::OK);
            held.push(r);
        }
    }
    let r = open(&app, STREAMS[1], &third).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let body: Value = r.json().await.expect("problem");
    assert_eq!(body["code"], "too_many_streams", "{body}");
    assert!(body["detail"].as_str().is_some_and(|d| d.contains("64 streams from one client address")), "{body}");
    // Plain requests from the address are still served.
    let (s, _) = app.get("/api/v1/session", &third).await;
    assert_eq!(s, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_ends_after_its_lifetime_with_a_reconnect_hint() {
    let app = TestApp::sqlite().stream_lifetime(Duration::from_secs(3)).start().await;
    for path in STREAMS {
        let mut r = open(&app, path, &app.admin).await;
        assert_eq!(r.status(), StatusCode::OK);
        let first = r.chunk().await.expect("read").expect("a first chunk");
        assert!(String::from_utf8_lossy(&first).contains("retry: 2000"), "{first:?}");
        let took = ended_within(&mut r, Duration::from_secs(10)).await;
        assert!(took.is_some_and(|t| t < Duration::from_secs(5)), "{path} ended after {took:?}");
    }
}

/// The user's token ids, as they list them.
async fn token_ids(app: &TestApp, token: &str) -> Vec<String> {
    let (s, list) = app.get("/api/v1/tokens", token).await;
    assert_eq!(s, StatusCode::OK, "{list}");
    list.as_array().expect("array").iter().map(|t| t["id"].as_str().expect("id").to_string()).collect()
}

/// Opens both kinds of stream as `token`, does `change`, and asserts both end within 5 s.
async fn streams_end_after(app: &TestApp, token: &str, what: &str, change: impl std::future::Future<Output = ()>) {
    let mut open_streams = Vec::new();
    for path in STREAMS {
        let r = open(app, path, token).await;
        assert_eq!(r.status(), StatusCode::OK, "{path}");
        open_streams.push(r);
    }
    // Still open a moment later: nothing ends a stream whose right holds.
    for r in &mut open_streams {
        let _ = tokio::time::timeout(Duration::from_millis(300), r.chunk()).await;
    }
    change.await;
    for (r, path) in open_streams.iter_mut().zip(STREAMS) {
        let took = ended_within(r, Duration::from_secs(8)).await;
        eprintln!("{path} ended {took:?} after {what}");
        assert!(took.is_some_and(|t| t <= Duration::from_secs(5)), "{path} after {what}: ended after {took:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_revocation_a_removal_or_a_role_change_ends_every_stream_within_5_s() {
    let app = TestApp::sqlite().start().await;
    let tenant = app.tenant("vision", json!({})).await;

    // A revoked token.
    let (_, revoked) = app.user("revoked", &[(&tenant, Role::Member)]).await;
    let id = token_ids(&app, &revoked).await.remove(0);
    streams_end_after(&app, &revoked, "a revocation", async {
        let (s, b) = app.send(Method::POST, &format!("/api/v1/tokens/{id}/revoke"), &revoked, None).await;
        assert!(s.is_success(), "{s} {b}");
    })
    .await;
    let r = open(&app, STREAMS[0], &revoked).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "a revoked token opens no new stream");

    // A removal from the tenant.
    let (removed_id, removed) = app.user("removed", &[(&tenant, Role::Member)]).await;
    streams_end_after(&app, &removed, "a removal", async {
        let path = format!("/api/v1/tenants/{tenant}/members/{removed_id}");
        let (s, b) = app.send(Method::DELETE, &path, &app.admin, None).await;
        assert!(s.is_success(), "{s} {b}");
    })
    .await;

    // A role change.
    let (changed_id, changed) = app.user("changed", &[(&tenant, Role::TenantAdmin)]).await;
    streams_end_after(&app, &changed, "a role change", async {
        let path = format!("/api/v1/tenants/{tenant}/members/{changed_id}");
        let (s, b) = app.send(Method::PUT, &path, &app.admin, Some(json!({"role": "member"}))).await;
        assert!(s.is_success(), "{s} {b}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_revocation_on_one_replica_ends_the_stream_on_another() {
    let Some(db) = crate::harness::postgres().await else { return };
    let one = TestApp::on(&db).start().await;
    let two = TestApp::on(&db).bare().start().await;
    let tenant = one.tenant("vision", json!({})).await;
    let (_, token) = one.user("member", &[(&tenant, Role::Member)]).await;
    let id = token_ids(&one, &token).await.remove(0);
    // Warm the second replica's cache of the token, so that only the stream's own check can notice.
    let (s, _) = two.get("/api/v1/session", &token).await;
    assert_eq!(s, StatusCode::OK);
    streams_end_after(&two, &token, "a revocation on the other replica", async {
        let (s, b) = one.send(Method::POST, &format!("/api/v1/tokens/{id}/revoke"), &token, None).await;
        assert!(s.is_success(), "{s} {b}");
    })
    .await;
    drop((one, two));
    db.close().await;
}
