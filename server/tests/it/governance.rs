//! Quota governance over real HTTP, on SQLite and PostgreSQL: a tenant's timeline of limit, held and used hour by
//! hour (past use written as the demo writes it, and a live request); where every tenant stands (borrowing,
//! starved, holding quota it does not use); monthly budgets with what is spent, their levels, and the `block`
//! policy refusing only requests that could spend from a spent budget.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tessera_core::request::SliceSpec;
use tessera_core::timeline::{HOUR_MS, hours};
use tessera_server::store::Role;
use tessera_server::store::history::PastAllocation;

use crate::harness::{TestApp, TestDb, on_both_backends};

on_both_backends!(
    a_timeline_counts_what_was_held_and_used_each_hour,
    the_standing_names_who_borrows_who_waits_and_who_does_not_use_its_quota,
    over_a_lowered_limit_outside_a_cohort_is_over_not_borrowing,
    budgets_count_this_months_spending_and_block_only_what_could_spend,
    recorded_history_sorts_by_time_among_the_tenants_requests,
    the_standing_reads_the_hours_that_ended_once,
);

fn code(body: &Value) -> &str {
    body["code"].as_str().unwrap_or("")
}

async fn first_gpu(app: &TestApp, model: &str) -> String {
    let (_, nodes) = app.get("/api/v1/nodes", &app.admin).await;
    let gpu = nodes
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|n| n["gpus"].as_array().cloned().unwrap_or_default())
        .find(|g| g["model"] == model)
        .unwrap_or_else(|| panic!("a {model} in {nodes}"));
    gpu["id"].as_str().expect("id").to_string()
}

/// One released 3g.40gb allocation of `tenant` on an H100, active over `[from, to)`.
async fn past_use(app: &TestApp, tenant: &str, from: i64, to: i64) {
    let past = PastAllocation {
        tenant_id: tenant.to_string(),
        spec: SliceSpec::Mig { profile: "3g.40gb".into(), model: Some("H100-80GB".into()) },
        reason: "training".into(),
        gpu_id: first_gpu(app, "H100-80GB").await,
        profile: "3g.40gb".into(),
        start: 4,
        device_uuid: "MIG-past".into(),
        activated_at_ms: from,
        released_at_ms: to,
    };
    app.store.record_history(&[past], "test").await.expect("history");
}

async fn a_timeline_counts_what_was_held_and_used_each_hour(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let t = app.tenant("vision", json!({})).await;
    let dev = app.member("vision-dev", &t).await;
    let now = tessera_server::store::now_ms();
    let (start, n) = hours(now, 1);
    // Used for hours 20 and 21 of the day (asked a minute before hour 20).
    past_use(&app, &t, start + 20 * HOUR_MS, start + 22 * HOUR_MS).await;
    let (s, q) = app
        .send(
            Method::PUT,
            &format!("/api/v1/tenants/{t}/quotas"),
            &app.admin,
            Some(json!({"limits": {"compute_slices": 7}})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{q}");
    let ask = json!({"tenant": t, "spec": {"mode": "mig", "profile": "1g.10gb", "model": "H100-80GB"}, "count": 1});
    let (s, r) = app.send(Method::POST, "/api/v1/requests", &dev, Some(ask)).await;
    assert_eq!(s, StatusCode::CREATED, "{r}");

    let (s, tl) = app.get("/api/v1/tenants/vision/quota-timeline?days=1", &dev).await;
    assert_eq!(s, StatusCode::OK, "{tl}");
    assert_eq!((tl["start_ms"].as_i64(), tl["step_ms"].as_i64()), (Some(start), Some(HOUR_MS)));
    let series = |name: &str| -> Vec<Value> { tl[name].as_array().cloned().unwrap_or_default() };
    for name in ["limit", "maximum", "held", "peak_held", "used"] {
        assert_eq!(series(name).len(), n, "{name}: one value an hour");
    }
    let used = series("used");
    assert_eq!(
        (used[19].clone(), used[20].clone(), used[21].clone(), used[22].clone()),
        (json!(0.0), json!(3.0), json!(3.0), json!(0.0))
    );
    let held = series("held");
    assert_eq!(held[19], json!(0.05), "asked a minute before the hour ended: 3 x 60 s / 3600 s");
    assert_eq!((held[20].clone(), held[21].clone()), (json!(3.0), json!(3.0)));
    assert_eq!(series("peak_held")[19], json!(3.0));
    assert_eq!(series("peak_held")[n - 1], json!(1.0), "the live request holds 1 now");
    // The limit was set now: none before this hour.
    assert_eq!((series("limit")[n - 2].clone(), series("limit")[n - 1].clone()), (Value::Null, json!(7.0)));
    assert_eq!(tl["summary"]["peak_held"], 3.0);
    assert_eq!(tl["summary"]["never_used"], 4.0, "a guarantee of 7, never more than 3 held");
    // Another resource, in its own unit.
    let (s, tl) =
        app.get(&format!("/api/v1/tenants/{t}/quota-timeline?days=1&resource=mig/H100-80GB/3g.40gb"), &dev).await;
    assert_eq!(s, StatusCode::OK, "{tl}");
    assert_eq!(tl["used"][20], 1.0, "one instance");

    // Bounds and owners.
    for (query, expected) in
        [("days=0", "invalid_days"), ("days=91", "invalid_days"), ("resource=gpu/nope", "quota_bad_resource")]
    {
        let (s, b) = app.get(&format!("/api/v1/tenants/{t}/quota-timeline?{query}"), &dev).await;
        assert_eq!((s, code(&b)), (StatusCode::UNPROCESSABLE_ENTITY, expected), "{query}: {b}");
    }
    let (s, b) = app.get(&format!("/api/v1/tenants/{t}/quota-timeline?days=4294967296"), &dev).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "past u32: {b}");
    let other = app.tenant("speech", json!({})).await;
    let outsider = app.member("speech-dev", &other).await;
    let (s, _) = app.get(&format!("/api/v1/tenants/{t}/quota-timeline"), &outsider).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, full) = app.get(&format!("/api/v1/tenants/{t}/quota-timeline?days=90"), &app.admin).await;
    assert_eq!((s, full["used"].as_array().map(Vec::len)), (StatusCode::OK, Some(90 * 24)));
}

async fn the_standing_names_who_borrows_who_waits_and_who_does_not_use_its_quota(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let (s, c) = app.send(Method::POST, "/api/v1/cohorts", &app.admin, Some(json!({"name": "research"}))).await;
    assert_eq!(s, StatusCode::CREATED, "{c}");
    let mut tokens = Vec::new();
    for (name, g, max) in [("vision", 3.0, 10.0), ("speech", 7.0, 7.0), ("audio", 10.0, 10.0)] {
        let t = app.tenant(name, json!({})).await;
        let body = json!({"limits": {"compute_slices": g}, "maximums": {"compute_slices": max}});
        let (s, q) = app.send(Method::PUT, &format!("/api/v1/tenants/{t}/quotas"), &app.admin, Some(body)).await;
        assert_eq!(s, StatusCode::OK, "{q}");
        let (s, m) = app
            .send(Method::PUT, &format!("/api/v1/tenants/{t}/cohort"), &app.admin, Some(json!({"cohort": "research"})))
            .await;
        assert_eq!(s, StatusCode::OK, "{m}");
        tokens.push((t.clone(), app.user(&format!("{name}-dev"), &[(&t, Role::Member)]).await.1));
    }
    // vision borrows 3 above its 3; speech waits within its guarantee; audio holds nothing of its 10.
    let ask = |t: &str, n: u32| json!({"tenant": t, "spec": {"mode": "mig", "profile": "3g.40gb", "model": "H100-80GB"}, "count": n});
    let (s, b) = app.send(Method::POST, "/api/v1/requests", &tokens[0].1, Some(ask(&tokens[0].0, 2))).await;
    assert_eq!((s, b["borrowed"].clone()), (StatusCode::CREATED, json!(true)), "{b}");
    let (s, w) = app.send(Method::POST, "/api/v1/requests", &tokens[1].1, Some(ask(&tokens[1].0, 1))).await;
    assert_eq!(s, StatusCode::CREATED, "{w}");

    let (s, st) = app.get("/api/v1/quota-standing", &app.admin).await;
    assert_eq!(s, StatusCode::OK, "{st}");
    let of =
        |name: &str| st["tenants"].as_array().and_then(|a| a.iter().find(|t| t["name"] == name)).cloned().expect(name);
    let (vision, speech, audio) = (of("vision"), of("speech"), of("audio"));
    assert_eq!((vision["borrowing"].clone(), vision["cohort"].clone()), (json!(true), json!("research")), "{vision}");
    let line = vision["lines"]
        .as_array()
        .and_then(|l| l.iter().find(|l| l["resource"] == "compute_slices"))
        .cloned()
        .expect("line");
    assert_eq!(
        (line["held"].clone(), line["borrowed"].clone(), line["maximum"].clone()),
        (json!(6.0), json!(3.0), json!(10.0))
    );
    assert_eq!((line["peak_held_30d"].clone(), line["over"].clone()), (json!(6.0), json!(0.0)), "under its maximum");
    assert_eq!(
        (speech["starved"].clone(), speech["waiting_within_guarantee"].clone()),
        (json!(true), json!(1)),
        "{speech}"
    );
    assert!(speech["oldest_waiting_ms"].as_i64().is_some());
    assert_eq!(vision["starved"], false, "its one request (6 slices) is borrowed as a whole: {vision}");
    assert_eq!((audio["idle_quota"].clone(), vision["idle_quota"].clone()), (json!(true), json!(false)), "{audio}");
    assert_eq!(audio["budget"], "ok");
    let (s, _) = app.get("/api/v1/quota-standing", &tokens[0].1).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
}

async fn over_a_lowered_limit_outside_a_cohort_is_over_not_borrowing(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let t = app.tenant("vision", json!({})).await;
    let dev = app.member("vision-dev", &t).await;
    let limit = |n: u32| json!({"limits": {"compute_slices": n}});
    let (s, q) = app.send(Method::PUT, &format!("/api/v1/tenants/{t}/quotas"), &app.admin, Some(limit(7))).await;
    assert_eq!(s, StatusCode::OK, "{q}");
    let ask = json!({"tenant": t, "spec": {"mode": "mig", "profile": "3g.40gb", "model": "H100-80GB"}, "count": 1});
    let (s, r) = app.send(Method::POST, "/api/v1/requests", &dev, Some(ask)).await;
    assert_eq!((s, r["borrowed"].clone()), (StatusCode::CREATED, json!(false)), "{r}");
    // The limit lowered under what it holds (3 slices): over by 2, and in no cohort, so nobody lends it anything.
    let (s, q) = app.send(Method::PUT, &format!("/api/v1/tenants/{t}/quotas"), &app.admin, Some(limit(1))).await;
    assert_eq!(s, StatusCode::OK, "{q}");

    let (s, st) = app.get("/api/v1/quota-standing", &app.admin).await;
    assert_eq!(s, StatusCode::OK, "{st}");
    let vision =
        st["tenants"].as_array().and_then(|a| a.iter().find(|x| x["name"] == "vision")).cloned().expect("vision");
    assert_eq!(
        (vision["cohort"].clone(), vision["borrowing"].clone(), vision["over_limit"].clone()),
        (Value::Null, json!(false), json!(true)),
        "{vision}"
    );
    let line = vision["lines"].as_array().and_then(|l| l.iter().find(|l| l["resource"] == "compute_slices")).cloned();
    let line = line.expect("a compute line");
    assert_eq!(
        (line["held"].clone(), line["limit"].clone(), line["borrowed"].clone(), line["over"].clone()),
        (json!(3.0), json!(1.0), json!(0.0), json!(2.0)),
        "{line}"
    );

    let (s, q) = app.get(&format!("/api/v1/tenants/{t}/quotas"), &dev).await;
    assert_eq!(s, StatusCode::OK, "{q}");
    let line = q["resources"].as_array().and_then(|l| l.iter().find(|l| l["resource"] == "compute_slices")).cloned();
    let line = line.expect("a compute line");
    assert_eq!((line["borrowed"].clone(), line["over"].clone()), (json!(0.0), json!(true)), "{line}");
}

async fn budgets_count_this_months_spending_and_block_only_what_could_spend(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let t = app.tenant("vision", json!({})).await;
    let dev = app.member("vision-dev", &t).await;
    let now = tessera_server::store::now_ms();
    let (month_start, _) = tessera_core::budget::month(now);
    // 3 compute slices on an H100 for up to 2 hours of this month, ended a minute ago.
    let from = month_start.max(now - 2 * HOUR_MS);
    let to = (now - 60_000).max(from + 1);
    past_use(&app, &t, from, to).await;
    let slice_hours = 3.0 * (to - from) as f64 / HOUR_MS as f64;
    let gpu_hours = slice_hours / 7.0;
    let path = format!("/api/v1/tenants/{t}/budget");

    let (s, b) = app.get(&path, &dev).await;
    assert_eq!(
        (s, b["level"].clone(), b["policy"].clone(), b["lines"].clone()),
        (StatusCode::OK, json!("ok"), json!("warn"), json!([]))
    );
    assert_eq!(b["month_start_ms"].as_i64(), Some(month_start));

    // A warning from 80 %; spent from 100 %.
    let body = json!({"limits": {"compute_slice_hours": 1000.0, "gpu_hours/h100-80gb": gpu_hours / 0.9}});
    let (s, b) = app.send(Method::PUT, &path, &app.admin, Some(body)).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let line = |b: &Value, unit: &str| {
        b["lines"].as_array().and_then(|l| l.iter().find(|l| l["unit"] == unit)).cloned().expect(unit)
    };
    let h100 = line(&b, "gpu_hours/H100-80GB");
    assert!((h100["spent"].as_f64().unwrap_or(0.0) - gpu_hours).abs() < 0.002, "{h100} against {gpu_hours}");
    assert_eq!((h100["level"].clone(), h100["label"].clone()), (json!("warning"), json!("GPU-hours on H100-80GB")));
    let all = line(&b, "compute_slice_hours");
    assert!((all["spent"].as_f64().unwrap_or(0.0) - slice_hours).abs() < 0.002, "{all} against {slice_hours}");
    assert_eq!((all["level"].clone(), b["level"].clone()), (json!("ok"), json!("warning")));
    // The sweep tells the tenant's members, once per budget and level this month.
    let budget_events = || async {
        let (_, inbox) = app.get("/api/v1/inbox?limit=500", &dev).await;
        inbox
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["type"].as_str().is_some_and(|k| k.starts_with("budget.")))
            .map(|e| (e["type"].as_str().unwrap_or("").to_string(), e["data"]["after"]["unit"].clone()))
            .collect::<Vec<_>>()
    };
    for _ in 0..2 {
        tessera_server::services::budgets::refresh(&app.state).await.expect("sweep");
    }
    assert_eq!(budget_events().await, [("budget.warning".to_string(), json!("gpu_hours/H100-80GB"))]);

    // Spent, under `warn`: requests go on.
    let (s, b) = app
        .send(Method::PUT, &path, &app.admin, Some(json!({"limits": {"gpu_hours/H100-80GB": gpu_hours / 2.0}})))
        .await;
    assert_eq!((s, b["level"].clone()), (StatusCode::OK, json!("exhausted")), "{b}");
    for _ in 0..2 {
        tessera_server::services::budgets::refresh(&app.state).await.expect("sweep");
    }
    let told = budget_events().await;
    assert_eq!(told.len(), 2, "{told:?}");
    assert_eq!(told[0], ("budget.exhausted".to_string(), json!("gpu_hours/H100-80GB")), "newest first: {told:?}");
    let ask =
        |model: &str| json!({"tenant": t, "spec": {"mode": "mig", "profile": "1g.10gb", "model": model}, "count": 1});
    let (s, r) = app.send(Method::POST, "/api/v1/requests", &dev, Some(ask("H100-80GB"))).await;
    assert_eq!(s, StatusCode::CREATED, "warn does not block: {r}");
    // Under `block`: an H100 request, or one that may land on an H100, is refused; an A100 one is not.
    let (s, b) = app.send(Method::PUT, &path, &app.admin, Some(json!({"policy": "block"}))).await;
    assert_eq!((s, b["policy"].clone()), (StatusCode::OK, json!("block")));
    let (s, r) = app.send(Method::POST, "/api/v1/requests", &dev, Some(ask("H100-80GB"))).await;
    assert_eq!((s, code(&r)), (StatusCode::CONFLICT, "budget_exhausted"), "{r}");
    assert!(r["detail"].as_str().unwrap_or("").contains("GPU-hours on H100-80GB"), "{r}");
    let anywhere = json!({"tenant": t, "spec": {"mode": "mig", "profile": "1g.10gb"}, "count": 1});
    let (s, _) = app.send(Method::POST, "/api/v1/requests", &dev, Some(anywhere)).await;
    assert_eq!(s, StatusCode::CONFLICT);
    let (s, r) = app.send(Method::POST, "/api/v1/requests", &dev, Some(ask("A100-40GB"))).await;
    assert_eq!(s, StatusCode::CREATED, "another model's budget is not spent: {r}");
    // A larger budget lets requests through at once.
    let (s, _) =
        app.send(Method::PUT, &path, &app.admin, Some(json!({"limits": {"gpu_hours/H100-80GB": 10_000}}))).await;
    assert_eq!(s, StatusCode::OK);
    let (s, r) = app.send(Method::POST, "/api/v1/requests", &dev, Some(ask("H100-80GB"))).await;
    assert_eq!(s, StatusCode::CREATED, "{r}");

    // Checked whole, nothing half-applied; platform admins only; the change is audited.
    for (body, expected) in [
        (json!({"limits": {"dollars": 5}}), "budget_bad_unit"),
        (json!({"limits": {"compute_slice_hours": 5, "gpu_hours/H100-80GB": -1}}), "budget_bad_amount"),
        (json!({"limits": {"compute_slice_hours": 1e10}}), "budget_bad_amount"),
    ] {
        let (s, b) = app.send(Method::PUT, &path, &app.admin, Some(body.clone())).await;
        assert_eq!((s, code(&b)), (StatusCode::UNPROCESSABLE_ENTITY, expected), "{body}: {b}");
    }
    let many: serde_json::Map<String, Value> = (0..33).map(|i| (format!("gpu_hours/x{i}"), json!(1))).collect();
    let (s, b) = app.send(Method::PUT, &path, &app.admin, Some(json!({"limits": many}))).await;
    assert_eq!((s, code(&b)), (StatusCode::UNPROCESSABLE_ENTITY, "budget_too_many"), "{b}");
    let (_, b) = app.get(&path, &dev).await;
    assert_eq!(line(&b, "compute_slice_hours")["limit"], 1000.0, "nothing half-applied: {b}");
    let (s, _) = app.send(Method::PUT, &path, &dev, Some(json!({"policy": "warn"}))).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (_, audit) = app.get(&format!("/api/v1/audit?object=tenant/{t}/budget"), &app.admin).await;
    assert!(audit.to_string().contains("tenant.budget"), "{audit}");
}

/// Released requests recorded for the past (as the demo does) get ids of their time: a tenant's list newest first
/// puts them below what was asked today, oldest first above it.
async fn recorded_history_sorts_by_time_among_the_tenants_requests(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let t = app.tenant("vision", json!({})).await;
    let dev = app.member("vision-dev", &t).await;
    let ask = json!({"tenant": t, "spec": {"mode": "mig", "profile": "1g.10gb", "model": "H100-80GB"}, "count": 1});
    let (s, today) = app.send(Method::POST, "/api/v1/requests", &dev, Some(ask)).await;
    assert_eq!(s, StatusCode::CREATED, "{today}");
    let now = tessera_server::store::now_ms();
    past_use(&app, &t, now - 3 * 86_400_000, now - 2 * 86_400_000).await;
    past_use(&app, &t, now - 2 * 86_400_000, now - 86_400_000).await;
    let (_, page) = app.get(&format!("/api/v1/requests?tenant={t}&order=newest"), &dev).await;
    let created: Vec<i64> =
        page["items"].as_array().expect("items").iter().map(|r| r["created_at_ms"].as_i64().expect("time")).collect();
    assert_eq!(created.len(), 3, "{page}");
    assert_eq!(page["items"][0]["id"], today["id"], "{page}");
    assert!(created.windows(2).all(|w| w[0] > w[1]), "newest first by time too: {created:?}");
    let (_, ended) = app.get(&format!("/api/v1/requests?tenant={t}&open=false&order=newest"), &dev).await;
    assert_eq!(ended["items"].as_array().map(Vec::len), Some(2), "{ended}");
}

/// The standing's 30 days: the hours that ended are worked out once (they do not change) and kept in the database,
/// and each later standing, on any replica and after a restart, reads only the hours since, with the live
/// requests; its figures are those of a standing that read the 30 days. A write into kept hours behind the
/// servers' backs is not seen until the store is told (as its own writes of the past do): then they are read again.
async fn the_standing_reads_the_hours_that_ended_once(db: &TestDb) {
    let one = TestApp::on(db).start().await;
    let t = one.tenant("vision", json!({})).await;
    let dev = one.member("vision-dev", &t).await;
    assert_eq!(one.quota(&t, json!({"compute_slices": 14})).await.status(), StatusCode::OK);
    let now = tessera_server::store::now_ms();
    let (start, n) = hours(now, 30);
    // 3 slices used and held for ten hours two days ago.
    let (from, to) = (start + (n as i64 - 50) * HOUR_MS, start + (n as i64 - 40) * HOUR_MS);
    past_use(&one, &t, from, to).await;
    let line = |st: &Value| -> Value {
        let vision = st["tenants"].as_array().and_then(|a| a.iter().find(|x| x["name"] == "vision")).cloned();
        let lines = vision.expect("vision")["lines"].as_array().cloned().unwrap_or_default();
        lines.into_iter().find(|l| l["resource"] == "compute_slices").expect("a compute line")
    };
    let (s, first) = one.get("/api/v1/quota-standing", &one.admin).await;
    assert_eq!(s, StatusCode::OK, "{first}");
    let mean = (3.0 * 10.0 / n as f64 * 1000.0_f64).round() / 1000.0;
    assert_eq!(
        (line(&first)["peak_held_30d"].clone(), line(&first)["mean_used_30d"].clone()),
        (json!(3.0), json!(mean))
    );

    // Live requests now (the current hour is read by every standing): 7 slices held at once.
    let ask = |p: &str| json!({"tenant": t, "spec": {"mode": "mig", "profile": p, "model": "H100-80GB"}, "count": 1});
    for p in ["3g.40gb", "4g.40gb"] {
        let (s, r) = one.send(Method::POST, "/api/v1/requests", &dev, Some(ask(p))).await;
        assert_eq!(s, StatusCode::CREATED, "{r}");
    }
    let (s, second) = one.get("/api/v1/quota-standing", &one.admin).await;
    assert_eq!(s, StatusCode::OK, "{second}");
    assert_eq!((line(&second)["peak_held_30d"].clone(), line(&second)["held"].clone()), (json!(7.0), json!(7.0)));
    // A replica that has worked nothing out yet reads the 30 days and says the same.
    let two = TestApp::on(db).start().await;
    let (s, fresh) = two.get("/api/v1/quota-standing", &one.admin).await;
    assert_eq!(s, StatusCode::OK, "{fresh}");
    assert_eq!(line(&fresh), line(&second));

    // Every ended hour is kept once, with a row saying so: the 30 days' hours before the current one, but for the
    // last while it settles.
    let kept = one.store.standing_hours("compute_slices", start, start + (n as i64 - 1) * HOUR_MS, HOUR_MS).await;
    let (figures, first_not_kept) = kept.expect("kept hours");
    assert!(first_not_kept >= start + (n as i64 - 2) * HOUR_MS, "{first_not_kept} of {start} + {n} hours");
    assert_eq!(figures.get(&t).map(|f| f.0), Some(3000), "{figures:?}");

    // The past use moved out of the 30 days behind the servers' backs (no server writes an ended hour): the kept
    // hours stand, on the replicas that worked them out and on a fresh one alike.
    let moved = "UPDATE allocations SET activated_at_ms = activated_at_ms - CAST(3456000000 AS BIGINT), \
                 released_at_ms = released_at_ms - CAST(3456000000 AS BIGINT) WHERE device_uuid = 'MIG-past'";
    if db.url.starts_with("sqlite:") {
        let pool = sqlx::SqlitePool::connect(&db.url).await.expect("sqlite");
        sqlx::query(moved).execute(&pool).await.expect("moved");
        pool.close().await;
    } else {
        let pool = sqlx::PgPool::connect(&db.url).await.expect("postgres");
        sqlx::query(moved).execute(&pool).await.expect("moved");
        pool.close().await;
    }
    let (_, again) = two.get("/api/v1/quota-standing", &one.admin).await;
    assert_eq!(line(&again)["mean_used_30d"], json!(mean), "the ended hours are not read again: {again}");
    let three = TestApp::on(db).start().await;
    let (_, third) = three.get("/api/v1/quota-standing", &one.admin).await;
    assert_eq!(line(&third)["mean_used_30d"], json!(mean), "nor by a fresh replica: {third}");
    // Told of the write (as the store's own writes of the past tell it), every replica reads those hours again.
    three.store.forget_allocation_hours(from - 3_456_000_000).await.expect("forget");
    for app in [&one, &three] {
        let (_, read) = app.get("/api/v1/quota-standing", &one.admin).await;
        assert_eq!(line(&read)["mean_used_30d"], json!(0.0), "the moved use is out of the 30 days: {read}");
        assert_eq!(line(&read)["peak_held_30d"], json!(7.0), "{read}");
    }
}
