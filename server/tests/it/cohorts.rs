//! Cohorts over real HTTP, on SQLite and PostgreSQL: a tenant borrows above its guarantee what another does not
//! use, up to its maximum and the lender's lending limit; when the lender asks within its guarantee, the borrowed
//! request is told (with a deadline and for whom), and released after the grace period, never a guaranteed one;
//! the notice is withdrawn when the need goes; priorities decide which requests fill the guarantee; and concurrent
//! borrowers together never borrow more than the cohort lends.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tessera_server::store::Role;

use crate::harness::{TestApp, TestDb, on_both_backends};

on_both_backends!(
    borrowing_is_bounded_and_a_lender_takes_its_guarantee_back,
    priorities_decide_what_fills_the_guarantee,
    concurrent_borrowers_never_borrow_more_than_the_cohort_lends,
    cohorts_are_for_platform_admins_and_checked,
    the_cohort_commands_create_join_and_set_bounds,
    room_is_reclaimed_for_a_request_within_its_guarantee,
    weights_share_what_is_lent_between_borrowers,
);

fn code(body: &Value) -> &str {
    body["code"].as_str().unwrap_or("")
}

async fn cohort(app: &TestApp, name: &str, grace_s: u32) -> String {
    let (s, c) =
        app.send(Method::POST, "/api/v1/cohorts", &app.admin, Some(json!({"name": name, "grace_s": grace_s}))).await;
    assert_eq!(s, StatusCode::CREATED, "{c}");
    c["id"].as_str().expect("id").to_string()
}

/// A tenant in `cohort` guaranteed `g` compute slices, with a maximum and a lending limit; a member's token.
async fn member_of(
    app: &TestApp,
    cohort: &str,
    name: &str,
    g: f64,
    max: Option<f64>,
    lend: Option<f64>,
) -> (String, String) {
    let t = app.tenant(name, json!({})).await;
    let mut body = json!({"limits": {"compute_slices": g}});
    if let Some(m) = max {
        body["maximums"] = json!({"compute_slices": m});
    }
    if let Some(l) = lend {
        body["lending_limits"] = json!({"compute_slices": l});
    }
    let (s, q) = app.send(Method::PUT, &format!("/api/v1/tenants/{t}/quotas"), &app.admin, Some(body)).await;
    assert_eq!(s, StatusCode::OK, "{q}");
    let (s, v) = app
        .send(Method::PUT, &format!("/api/v1/tenants/{name}/cohort"), &app.admin, Some(json!({"cohort": cohort})))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["cohort"], cohort);
    let token = app.user(&format!("{name}-dev"), &[(&t, Role::Member)]).await.1;
    (t, token)
}

/// Asks for `count` 3g.40gb instances on H100-80GB (3 compute slices each).
async fn ask(app: &TestApp, token: &str, tenant: &str, count: u32, priority: &str) -> (StatusCode, Value) {
    let body = json!({"tenant": tenant, "spec": {"mode": "mig", "profile": "3g.40gb", "model": "H100-80GB"},
        "count": count, "priority": priority});
    app.send(Method::POST, "/api/v1/requests", token, Some(body)).await
}

async fn request(app: &TestApp, id: &Value) -> Value {
    let (s, r) = app.get(&format!("/api/v1/requests/{}", id.as_str().expect("id")), &app.admin).await;
    assert_eq!(s, StatusCode::OK, "{r}");
    r
}

async fn line(app: &TestApp, tenant: &str) -> Value {
    let (_, q) = app.get(&format!("/api/v1/tenants/{tenant}/quotas"), &app.admin).await;
    q["resources"].as_array().expect("lines").iter().find(|l| l["resource"] == "compute_slices").cloned().expect("line")
}

async fn sweep(app: &TestApp) -> usize {
    tessera_server::services::cohorts::sweep(&app.state).await.expect("sweep")
}

async fn borrowing_is_bounded_and_a_lender_takes_its_guarantee_back(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let c = cohort(&app, "research", 2).await;
    let (a, a_dev) = member_of(&app, &c, "vision", 7.0, Some(14.0), None).await;
    let (b, b_dev) = member_of(&app, &c, "speech", 7.0, None, Some(5.0)).await;

    // vision: 6 within its guarantee, then 6 more, 5 of them borrowed from speech (which lends at most 5).
    let (s, first) = ask(&app, &a_dev, &a, 2, "normal").await;
    assert_eq!(s, StatusCode::CREATED, "{first}");
    assert_eq!(first["borrowed"], false);
    let (s, second) = ask(&app, &a_dev, &a, 2, "normal").await;
    assert_eq!(s, StatusCode::CREATED, "{second}");
    assert_eq!(second["borrowed"], true, "{second}");
    let l = line(&app, &a).await;
    assert_eq!((l["limit"].clone(), l["maximum"].clone(), l["held"].clone()), (json!(7.0), json!(14.0), json!(12.0)));
    assert_eq!((l["borrowed"].clone(), l["over"].clone()), (json!(5.0), json!(false)), "{l}");

    // Past its maximum, or past what speech lends: refused, saying which.
    let (s, b1) = ask(&app, &a_dev, &a, 1, "normal").await;
    assert_eq!((s, code(&b1)), (StatusCode::CONFLICT, "quota_exceeded"), "{b1}");
    assert_eq!(b1["errors"][0]["code"], "quota_exceeded", "15 would pass the maximum of 14: {b1}");
    let small = json!({"tenant": a, "spec": {"mode": "mig", "profile": "1g.10gb", "model": "H100-80GB"}, "count": 1});
    let (s, b2) = app.send(Method::POST, "/api/v1/requests", &a_dev, Some(small)).await;
    assert_eq!((s, code(&b2)), (StatusCode::CONFLICT, "quota_exceeded"), "{b2}");
    assert_eq!(b2["errors"][0]["code"], "quota_nothing_to_borrow", "{b2}");
    assert_eq!(b2["ask_for"]["compute_slices"], 13.0, "a guarantee of 13 would let it through: {b2}");

    // speech asks for 3 within its guarantee: it can now lend only 4 of the 5 vision borrows. vision's borrowed
    // request is told, for speech, with the cohort's grace period; the guaranteed one is not.
    let (s, lender) = ask(&app, &b_dev, &b, 1, "normal").await;
    assert_eq!(s, StatusCode::CREATED, "{lender}");
    let told = request(&app, &second["id"]).await;
    let at = told["reclaim_at_ms"].as_i64().expect("a deadline");
    let now = tessera_server::store::now_ms();
    assert!((now..=now + 2_500).contains(&at), "deadline {at} is the grace period from now ({now})");
    assert_eq!(told["reclaim_for"], "speech");
    assert_eq!(
        request(&app, &first["id"]).await["reclaim_at_ms"],
        Value::Null,
        "guaranteed requests are never reclaimed"
    );
    let (s, view) = app.get("/api/v1/cohorts/research", &app.admin).await;
    assert_eq!(s, StatusCode::OK, "{view}");
    assert_eq!(view["deficits"], json!({"compute_slices": 1.0}), "{view}");

    // The need goes (speech withdraws): the notice is withdrawn, nothing is released.
    let path = format!("/api/v1/requests/{}/cancel", lender["id"].as_str().expect("id"));
    let (s, _) = app.send(Method::POST, &path, &b_dev, None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(sweep(&app).await, 0);
    let calm = request(&app, &second["id"]).await;
    assert_eq!((calm["reclaim_at_ms"].clone(), calm["state"].clone()), (Value::Null, json!("pending")), "{calm}");

    // speech asks again; before the deadline nothing is released, after it the borrowed request is.
    let (s, _) = ask(&app, &b_dev, &b, 1, "normal").await;
    assert_eq!(s, StatusCode::CREATED);
    assert_eq!(sweep(&app).await, 0, "not before the grace period ends");
    tokio::time::sleep(std::time::Duration::from_millis(2_200)).await;
    assert_eq!(sweep(&app).await, 1);
    let gone = request(&app, &second["id"]).await;
    assert_eq!(gone["state"], "cancelled", "not yet running, so cancelled: {gone}");
    assert!(gone["reason"].as_str().unwrap_or("").starts_with("reclaimed"), "{gone}");
    assert_eq!(request(&app, &first["id"]).await["state"], "pending");
    assert_eq!(line(&app, &a).await["held"], 6.0);
    let (_, view) = app.get(&format!("/api/v1/cohorts/{c}"), &app.admin).await;
    assert_eq!(view["deficits"], json!({}), "{view}");
    let (_, audit) =
        app.get(&format!("/api/v1/audit?object=request/{}", second["id"].as_str().expect("id")), &app.admin).await;
    let actions: Vec<&str> =
        audit.as_array().map(|a| a.iter().filter_map(|e| e["action"].as_str()).collect()).unwrap_or_default();
    for action in ["request.reclaim", "request.reclaim_withdrawn", "request.cancelled"] {
        assert!(actions.contains(&action), "{action} audited: {actions:?}");
    }
}

async fn priorities_decide_what_fills_the_guarantee(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let c = cohort(&app, "research", 600).await;
    let (a, a_dev) = member_of(&app, &c, "vision", 7.0, Some(14.0), None).await;
    member_of(&app, &c, "speech", 7.0, None, None).await;
    let (_, normal) = ask(&app, &a_dev, &a, 2, "normal").await;
    let (s, high) = ask(&app, &a_dev, &a, 2, "high").await;
    assert_eq!(s, StatusCode::CREATED, "{high}");
    assert_eq!(high["priority"], "high");
    // The high-priority request fills the guarantee; the older normal one is now the borrowed one.
    assert_eq!(request(&app, &high["id"]).await["borrowed"], false);
    assert_eq!(request(&app, &normal["id"]).await["borrowed"], true);
    let (s, b) = app
        .send(
            Method::POST,
            "/api/v1/requests",
            &a_dev,
            Some(json!({"tenant": a, "spec": {"mode": "mig", "profile": "3g.40gb"},
            "count": 1, "priority": "urgent"})),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
}

async fn concurrent_borrowers_never_borrow_more_than_the_cohort_lends(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let c = cohort(&app, "research", 1).await;
    let (a, a_dev) = member_of(&app, &c, "vision", 2.0, Some(40.0), None).await;
    let (b, b_dev) = member_of(&app, &c, "speech", 2.0, Some(40.0), None).await;
    member_of(&app, &c, "audio", 10.0, None, None).await;
    // 15 one-slice requests each, at once: 2 + 2 guaranteed and 10 to lend. Whoever borrows first may take more
    // than half of it; the other is then admitted by fair sharing up to an even split, which is reclaimed from the
    // first after the grace period. Never more than an even split is admitted past what is lent.
    let one =
        |t: &str| json!({"tenant": t, "spec": {"mode": "mig", "profile": "1g.10gb", "model": "H100-80GB"}, "count": 1});
    let mut calls = Vec::new();
    for i in 0..30 {
        let (t, token) = if i % 2 == 0 { (&a, &a_dev) } else { (&b, &b_dev) };
        calls.push(app.send(Method::POST, "/api/v1/requests", token, Some(one(t))));
    }
    let answers = futures_util::future::join_all(calls).await;
    let created = answers.iter().filter(|(s, _)| *s == StatusCode::CREATED).count() as f64;
    for (s, body) in &answers {
        assert!(matches!(*s, StatusCode::CREATED | StatusCode::CONFLICT), "{s} {body}");
    }
    let (_, view) = app.get(&format!("/api/v1/cohorts/{c}"), &app.admin).await;
    let short = view["deficits"]["compute_slices"].as_f64().unwrap_or(0.0);
    assert_eq!(created - short, 14.0, "what is held past what is lent is exactly what is short: {view}");
    let (held_a, held_b) = (line(&app, &a).await["held"].as_f64(), line(&app, &b).await["held"].as_f64());
    assert!(held_a >= Some(2.0) && held_b >= Some(2.0), "both hold their guarantee: {view}");
    tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
    sweep(&app).await;
    let (_, view) = app.get(&format!("/api/v1/cohorts/{c}"), &app.admin).await;
    assert_eq!(view["deficits"], json!({}), "{view}");
    let (held_a, held_b) =
        (line(&app, &a).await["held"].as_f64().unwrap_or(0.0), line(&app, &b).await["held"].as_f64().unwrap_or(0.0));
    assert_eq!(held_a + held_b, 14.0, "{view}");
    assert!((held_a - held_b).abs() <= 1.0, "the same weight borrows the same: {held_a} and {held_b}");
}

/// Of two borrowers, the one with three times the weight keeps three times as much once both have asked.
async fn weights_share_what_is_lent_between_borrowers(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let c = cohort(&app, "research", 1).await;
    let (a, a_dev) = member_of(&app, &c, "vision", 1.0, Some(40.0), None).await;
    let (b, b_dev) = member_of(&app, &c, "speech", 1.0, Some(40.0), None).await;
    member_of(&app, &c, "audio", 8.0, None, None).await;
    let (s, _) = app
        .send(Method::PUT, &format!("/api/v1/tenants/{b}/cohort"), &app.admin, Some(json!({"cohort": c, "weight": 3})))
        .await;
    assert_eq!(s, StatusCode::OK);
    let one =
        |t: &str| json!({"tenant": t, "spec": {"mode": "mig", "profile": "1g.10gb", "model": "H100-80GB"}, "count": 1});
    // vision takes its 1 and all 8 lent; then speech asks, one slice at a time, until refused.
    for _ in 0..9 {
        let (s, r) = app.send(Method::POST, "/api/v1/requests", &a_dev, Some(one(&a))).await;
        assert_eq!(s, StatusCode::CREATED, "{r}");
    }
    let mut speech = 0;
    loop {
        let (s, r) = app.send(Method::POST, "/api/v1/requests", &b_dev, Some(one(&b))).await;
        if s != StatusCode::CREATED {
            assert_eq!(r["errors"][0]["code"], "quota_nothing_to_borrow", "{r}");
            break;
        }
        speech += 1;
        assert!(speech < 20, "speech is refused at some point");
    }
    tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
    sweep(&app).await;
    let (held_a, held_b) =
        (line(&app, &a).await["held"].as_f64().unwrap_or(0.0), line(&app, &b).await["held"].as_f64().unwrap_or(0.0));
    // 8 lent: speech borrows 6, vision 2 (3 to 1).
    assert_eq!((held_a - 1.0, held_b - 1.0), (2.0, 6.0), "borrowed by weight");
}

async fn cohorts_are_for_platform_admins_and_checked(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let c = cohort(&app, "research", 600).await;
    let (t, dev) = member_of(&app, &c, "vision", 7.0, None, None).await;
    let (s, _) = app.get("/api/v1/cohorts", &dev).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _) =
        app.send(Method::PUT, &format!("/api/v1/tenants/{t}/cohort"), &dev, Some(json!({"cohort": null}))).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let post = |body: Value| app.send(Method::POST, "/api/v1/cohorts", &app.admin, Some(body));
    let (s, b) = post(json!({"name": "research"})).await;
    assert_eq!(s, StatusCode::CONFLICT, "{b}");
    let (s, b) = post(json!({"name": "Bad Name"})).await;
    assert_eq!((s, code(&b)), (StatusCode::UNPROCESSABLE_ENTITY, "invalid_name"));
    let (s, b) = post(json!({"name": "slow", "grace_s": 604_801})).await;
    assert_eq!((s, code(&b)), (StatusCode::UNPROCESSABLE_ENTITY, "invalid_grace"));
    let (s, b) = app.send(Method::PATCH, "/api/v1/cohorts/research", &app.admin, Some(json!({"grace_s": 60}))).await;
    assert_eq!((s, b["grace_s"].clone()), (StatusCode::OK, json!(60)));
    let (s, b) = app
        .send(Method::PUT, &format!("/api/v1/tenants/{t}/cohort"), &app.admin, Some(json!({"cohort": c, "weight": 0})))
        .await;
    assert_eq!((s, code(&b)), (StatusCode::UNPROCESSABLE_ENTITY, "invalid_weight"));
    let (s, b) = app
        .send(Method::PUT, &format!("/api/v1/tenants/{t}/cohort"), &app.admin, Some(json!({"cohort": "nowhere"})))
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{b}");
    // A maximum below the guarantee, or a bound on an unlimited resource: refused, nothing written.
    let quotas = format!("/api/v1/tenants/{t}/quotas");
    let put = |body: Value| app.send(Method::PUT, &quotas, &app.admin, Some(body));
    let (s, b) = put(json!({"limits": {"compute_slices": 8}, "maximums": {"compute_slices": 6}})).await;
    assert_eq!((s, code(&b)), (StatusCode::UNPROCESSABLE_ENTITY, "quota_maximum_below_guarantee"), "{b}");
    assert_eq!(line(&app, &t).await["limit"], 7.0, "nothing half-applied");
    let (s, b) = put(json!({"maximums": {"memory_gib": 100}})).await;
    assert_eq!((s, code(&b)), (StatusCode::UNPROCESSABLE_ENTITY, "quota_bound_without_limit"), "{b}");
    // Out of the cohort: its maximum no longer counts.
    let (s, v) = app
        .send(
            Method::PUT,
            &format!("/api/v1/tenants/{t}/cohort"),
            &app.admin,
            Some(json!({"cohort": null, "weight": 3})),
        )
        .await;
    assert_eq!((s, v["cohort"].clone(), v["weight"].clone()), (StatusCode::OK, Value::Null, json!(3)), "{v}");
}

async fn the_cohort_commands_create_join_and_set_bounds(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let t = app.tenant("vision", json!({})).await;
    let json = |out: &str| serde_json::from_str::<Value>(out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let (code, out) = app.cli(&app.admin, &["quota", "cohort-create", "research", "--grace", "120"]).await;
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(json(&out)["grace_s"], 120);
    // By name: limits, a maximum and a lending limit in one change.
    let set = [
        "quota",
        "set",
        "--tenant",
        "vision",
        "--reason",
        "pilot",
        "--max",
        "compute_slices=14",
        "--lend",
        "compute_slices=3",
        "compute_slices=7",
    ];
    let (code, out) = app.cli(&app.admin, &set).await;
    assert_eq!(code, Some(0), "{out}");
    let q = json(&out);
    let l = &q["resources"][0];
    assert_eq!(
        (l["limit"].clone(), l["maximum"].clone(), l["lending_limit"].clone()),
        (json!(7.0), json!(14.0), json!(3.0))
    );
    let (code, out) =
        app.cli(&app.admin, &["quota", "join", "--tenant", "vision", "--cohort", "research", "--weight", "4"]).await;
    assert_eq!(code, Some(0), "{out}");
    assert_eq!((json(&out)["id"].as_str(), json(&out)["weight"].as_u64()), (Some(t.as_str()), Some(4)));
    let (code, out) = app.cli(&app.admin, &["quota", "cohorts"]).await;
    assert_eq!(code, Some(0), "{out}");
    let line = &json(&out)[0]["members"][0]["resources"][0];
    assert_eq!(
        (line["guaranteed"].clone(), line["maximum"].clone(), line["lendable"].clone()),
        (json!(7.0), json!(14.0), json!(3.0))
    );
    let (code, out) = app.cli(&app.admin, &["quota", "join", "--tenant", "vision", "--none"]).await;
    assert_eq!((code, json(&out)["cohort"].clone()), (Some(0), Value::Null), "{out}");
    // The history keeps the maximum and lending limit beside the guarantee.
    let (_, history) = app.get(&format!("/api/v1/tenants/{t}/quota-history"), &app.admin).await;
    assert_eq!(history.as_array().map(Vec::len), Some(3), "{history}");
}

/// The quota lets a request within its guarantee in, but the fleet has no room for it: the borrowed request that
/// holds the room is reclaimed (chosen with the planner), never the guaranteed one, and once it is gone the waiting
/// request is placed.
async fn room_is_reclaimed_for_a_request_within_its_guarantee(db: &TestDb) {
    let app = TestApp::on(db).auto_layout().start().await;
    let c = cohort(&app, "research", 1).await;
    let auto = json!({"auto_approve": true, "auto_approve_max_compute_slices": 14});
    let mut tokens = Vec::new();
    for (name, g, max) in [("vision", 4.0, 14.0), ("speech", 10.0, 10.0)] {
        let t = app.tenant(name, auto.clone()).await;
        let body = json!({"limits": {"compute_slices": g}, "maximums": {"compute_slices": max}});
        let (s, q) = app.send(Method::PUT, &format!("/api/v1/tenants/{t}/quotas"), &app.admin, Some(body)).await;
        assert_eq!(s, StatusCode::OK, "{q}");
        let (s, _) =
            app.send(Method::PUT, &format!("/api/v1/tenants/{t}/cohort"), &app.admin, Some(json!({"cohort": c}))).await;
        assert_eq!(s, StatusCode::OK);
        tokens.push((t.clone(), app.user(&format!("{name}-dev"), &[(&t, Role::Member)]).await.1));
    }
    // One H100 takes new work; the others are cordoned.
    app.one_gpu_of("H100-80GB").await;
    let ask = |t: &str, profile: &str| json!({"tenant": t, "spec": {"mode": "mig", "profile": profile, "model": "H100-80GB"}, "count": 1});
    let (vision, vision_dev) = &tokens[0];
    let (s, guaranteed) = app.send(Method::POST, "/api/v1/requests", vision_dev, Some(ask(vision, "3g.40gb"))).await;
    assert_eq!((s, guaranteed["state"].clone()), (StatusCode::CREATED, json!("approved")), "{guaranteed}");
    let (s, borrowed) = app.send(Method::POST, "/api/v1/requests", vision_dev, Some(ask(vision, "4g.40gb"))).await;
    assert_eq!(
        (s, borrowed["state"].clone(), borrowed["borrowed"].clone()),
        (StatusCode::CREATED, json!("approved"), json!(true)),
        "{borrowed}"
    );
    // speech asks for a 1g within its guarantee: the quota has room (it lends 10, vision borrows 3), the GPU not.
    let (speech, speech_dev) = &tokens[1];
    let (s, waiting) = app.send(Method::POST, "/api/v1/requests", speech_dev, Some(ask(speech, "1g.10gb"))).await;
    assert_eq!((s, waiting["state"].clone()), (StatusCode::CREATED, json!("pending")), "no room yet: {waiting}");
    let (_, view) = app.get(&format!("/api/v1/cohorts/{c}"), &app.admin).await;
    assert_eq!(view["deficits"], json!({}), "the quota is not short: {view}");
    let told = request(&app, &borrowed["id"]).await;
    assert!(told["reclaim_at_ms"].is_i64(), "the borrowed 4g holds the room: {told}");
    assert_eq!(told["reclaim_for"], "speech");
    assert_eq!(
        request(&app, &guaranteed["id"]).await["reclaim_at_ms"],
        Value::Null,
        "the guaranteed 3g is never taken"
    );
    tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
    assert_eq!(sweep(&app).await, 1);
    assert_eq!(request(&app, &borrowed["id"]).await["state"], "cancelled");
    assert_eq!(request(&app, &guaranteed["id"]).await["state"], "approved");
    let placed = request(&app, &waiting["id"]).await;
    assert_eq!(placed["state"], "approved", "speech's 1g is placed once the room is free: {placed}");
}
