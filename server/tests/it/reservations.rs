//! Reservations over real HTTP on SQLite and PostgreSQL: a booking is accepted only if the fleet has room for its
//! whole window (and the tenant's quota then), its preview says how many slices fit; racing bookings for the last
//! room accept exactly what fits; booked room is protected from requests made meanwhile (they wait with reason
//! `reserved`, or end before the reservation starts); a reservation's slices are placed at its lead time, turn
//! active at its start and are released at its end; and the calendar keeps time-slicing and MPS off one node.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tessera_server::store::now_ms;

use crate::harness::{TestApp, TestDb, on_both_backends};

on_both_backends!(
    a_booking_fits_its_window_or_says_how_many_do,
    racing_bookings_for_the_last_room_accept_exactly_what_fits,
    booked_room_is_protected_from_requests_made_meanwhile,
    a_reservation_turns_active_at_its_start_and_ends_with_its_window,
    a_starting_reservation_is_placed_on_the_slices_kept_for_it,
    time_slicing_and_mps_never_share_a_node_in_the_calendar,
);

const HOUR: i64 = 3_600_000;

fn mig(profile: &str, count: u32, start_ms: i64, end_ms: i64) -> Value {
    json!({"spec": {"mode": "mig", "profile": profile, "model": "H100-80GB"}, "count": count,
           "start_ms": start_ms, "end_ms": end_ms, "reason": "training run"})
}

async fn book(app: &TestApp, tenant: &str, token: &str, body: Value) -> (StatusCode, Value) {
    app.send(Method::POST, &format!("/api/v1/tenants/{tenant}/reservations"), token, Some(body)).await
}

/// A tenant whose policy approves up to 14 compute slices on its own.
async fn auto_tenant(app: &TestApp, name: &str) -> String {
    app.tenant(name, json!({"auto_approve": true, "auto_approve_max_compute_slices": 14})).await
}

async fn a_booking_fits_its_window_or_says_how_many_do(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    app.one_gpu_of("H100-80GB").await;
    let t = auto_tenant(&app, "vision").await;
    let dev = app.member("vision-dev", &t).await;
    let now = now_ms();
    let (a, b) = (now + HOUR, now + 3 * HOUR);
    // The one H100 for two hours: accepted at once (the policy approves it).
    let (s, first) = book(&app, &t, &dev, mig("7g.80gb", 1, a, b)).await;
    assert_eq!(s, StatusCode::CREATED, "{first}");
    assert_eq!(
        (first["state"].clone(), first["decided_by"].clone()),
        (json!("accepted"), json!("system:auto-approve"))
    );
    // The same window again: no room; the preview says none fits; an overlapping 1g too.
    let (s, again) = book(&app, &t, &dev, mig("7g.80gb", 1, a + HOUR, b + HOUR)).await;
    assert_eq!((s, again["code"].clone()), (StatusCode::CONFLICT, json!("no_room_in_window")), "{again}");
    let path = format!("/api/v1/tenants/{t}/reservations/preview");
    let (s, p) = app.send(Method::POST, &path, &dev, Some(mig("1g.10gb", 3, a + HOUR, b + HOUR))).await;
    assert_eq!(s, StatusCode::OK, "{p}");
    assert_eq!((p["fits"].clone(), p["free_in_window"].clone()), (json!(false), json!(0)), "{p}");
    assert_eq!(p["refused"]["code"], "no_room_in_window", "{p}");
    // A body booking would refuse as malformed is a 422, not a preview.
    for (body, code) in [
        (mig("1g.10gb", 0, a, b), "invalid_count"),
        (mig("1g.10gb", 1001, a, b), "invalid_count"),
        (mig("9g.1gb", 1, a, b), "request_invalid"),
        (
            json!({"spec": {"mode": "mps", "model": "H100-80GB", "replicas": 2_147_483_648u64}, "count": 1,
                "start_ms": a, "end_ms": b}),
            "request_invalid",
        ),
        (
            json!({"spec": {"mode": "exclusive", "model": "H100-80GB"}, "count": 1, "start_ms": a, "end_ms": b,
                "reason": "x".repeat(2001)}),
            "invalid_reason",
        ),
    ] {
        let (s, e) = app.send(Method::POST, &path, &dev, Some(body)).await;
        assert_eq!((s, e["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some(code)), "{e}");
    }
    // Right after it, the GPU is free again: seven 1g slices fit, not eight.
    let (s, p) = app.send(Method::POST, &path, &dev, Some(mig("1g.10gb", 8, b, b + HOUR))).await;
    assert_eq!((s, p["free_in_window"].clone(), p["fits"].clone()), (StatusCode::OK, json!(7), json!(false)), "{p}");
    let (s, later) = book(&app, &t, &dev, mig("1g.10gb", 7, b, b + HOUR)).await;
    assert_eq!((s, later["state"].clone()), (StatusCode::CREATED, json!("accepted")), "{later}");
    // The policy bounds each window.
    let (s, e) = book(&app, &t, &dev, mig("1g.10gb", 1, now - 10 * 60_000, now + HOUR)).await;
    assert_eq!((s, e["code"].clone()), (StatusCode::UNPROCESSABLE_ENTITY, json!("invalid_window")), "{e}");
    let (s, e) = book(&app, &t, &dev, mig("1g.10gb", 1, b + HOUR, b + HOUR + 8 * 24 * HOUR)).await;
    assert_eq!((s, e["code"].clone()), (StatusCode::UNPROCESSABLE_ENTITY, json!("reservation_too_long")), "{e}");
    let policy = json!({"max_duration_s": 86_400, "max_ahead_s": 86_400, "max_concurrent": 2});
    let (s, e) =
        app.send(Method::PUT, &format!("/api/v1/tenants/{t}/reservation-policy"), &dev, Some(policy.clone())).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "only platform admins set policies: {e}");
    let (s, e) =
        app.send(Method::PUT, &format!("/api/v1/tenants/{t}/reservation-policy"), &app.admin, Some(policy)).await;
    assert_eq!(s, StatusCode::OK, "{e}");
    let (s, e) = book(&app, &t, &dev, mig("1g.10gb", 1, b + 2 * HOUR, b + 3 * HOUR)).await;
    assert_eq!((s, e["code"].clone()), (StatusCode::UNPROCESSABLE_ENTITY, json!("too_many_reservations")), "{e}");
    let (s, pol) = app.get(&format!("/api/v1/tenants/{t}/reservation-policy"), &dev).await;
    assert_eq!(
        (s, pol["source"].clone(), pol["policy"]["max_concurrent"].clone()),
        (StatusCode::OK, json!("tenant"), json!(2))
    );
    // Cancelling gives the window back.
    let id = first["id"].as_str().expect("id");
    let (s, c) = app.send(Method::POST, &format!("/api/v1/reservations/{id}/cancel"), &dev, None).await;
    assert_eq!((s, c["state"].clone()), (StatusCode::OK, json!("cancelled")), "{c}");
    let (s, p) = app.send(Method::POST, &path, &dev, Some(mig("1g.10gb", 3, a, b))).await;
    assert_eq!((s, p["fits"].clone(), p["free_in_window"].clone()), (StatusCode::OK, json!(true), json!(7)), "{p}");
    assert_eq!(p["free_in_window_limit"], json!(tessera_core::reservation::PREVIEW_COUNT), "{p}");
    let (_, p) = app.send(Method::POST, &path, &dev, Some(mig("1g.10gb", 100, a, b))).await;
    assert_eq!((p["free_in_window"].clone(), p["free_in_window_limit"].clone()), (json!(7), json!(100)), "{p}");
    // Running into the seven 1g booked from `b`: none fits.
    let (s, p) = app.send(Method::POST, &path, &dev, Some(mig("1g.10gb", 3, a, b + 60_000))).await;
    assert_eq!((s, p["fits"].clone(), p["free_in_window"].clone()), (StatusCode::OK, json!(false), json!(0)), "{p}");

    // Quota over the window: a tenant limited to 7 compute slices holds a 7g for ever; a window overlapping it is
    // refused, whatever the fleet has.
    let q = auto_tenant(&app, "speech").await;
    let body = json!({"limits": {"compute_slices": 7}});
    let (s, r) = app.send(Method::PUT, &format!("/api/v1/tenants/{q}/quotas"), &app.admin, Some(body)).await;
    assert_eq!(s, StatusCode::OK, "{r}");
    let (s, e) = book(&app, &q, &app.admin, mig("1g.10gb", 7, now + 5 * HOUR, now + 6 * HOUR)).await;
    assert_eq!(s, StatusCode::CREATED, "{e}");
    let (s, e) = book(&app, &q, &app.admin, mig("1g.10gb", 1, now + 5 * HOUR + 60_000, now + 7 * HOUR)).await;
    assert_eq!((s, e["code"].clone()), (StatusCode::CONFLICT, json!("quota_exceeded")), "{e}");

    // A tenant without auto-approval: pending, then an admin accepts or rejects it; members may not.
    let m = app.tenant("manual", json!({})).await;
    let mdev = app.member("manual-dev", &m).await;
    let (s, pending) = book(&app, &m, &mdev, mig("3g.40gb", 1, now + 10 * HOUR, now + 11 * HOUR)).await;
    assert_eq!((s, pending["state"].clone()), (StatusCode::CREATED, json!("pending")), "{pending}");
    let pid = pending["id"].as_str().expect("id");
    let (s, _) = app.send(Method::POST, &format!("/api/v1/reservations/{pid}/approve"), &mdev, None).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, ok) = app.send(Method::POST, &format!("/api/v1/reservations/{pid}/approve"), &app.admin, None).await;
    assert_eq!(
        (s, ok["state"].clone(), ok["decided_by"].clone()),
        (StatusCode::OK, json!("accepted"), json!("user:admin")),
        "{ok}"
    );
    let (s, _) = app.send(Method::POST, &format!("/api/v1/reservations/{pid}/approve"), &app.admin, None).await;
    assert_eq!(s, StatusCode::CONFLICT, "accepted once");
    let (_, other) = book(&app, &m, &mdev, mig("1g.10gb", 1, now + 12 * HOUR, now + 13 * HOUR)).await;
    let oid = other["id"].as_str().expect("id");
    let reject = json!({"reason": "that week is for the audit"});
    let (s, r) = app.send(Method::POST, &format!("/api/v1/reservations/{oid}/reject"), &app.admin, Some(reject)).await;
    assert_eq!(
        (s, r["state"].clone(), r["decision"].clone()),
        (StatusCode::OK, json!("rejected"), json!("that week is for the audit"))
    );
    // Lists: the tenant's own; another tenant's member sees none of it.
    let (s, list) = app.get(&format!("/api/v1/reservations?tenant={m}"), &mdev).await;
    assert_eq!(s, StatusCode::OK, "{list}");
    assert_eq!(list["items"].as_array().map(Vec::len), Some(2), "{list}");
    let (s, _) = app.get(&format!("/api/v1/reservations/{pid}"), &dev).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "not visible across tenants");
    let (s, _) = app.get(&format!("/api/v1/reservations?tenant={m}"), &dev).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

async fn racing_bookings_for_the_last_room_accept_exactly_what_fits(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    app.one_gpu_of("H100-80GB").await;
    let t = auto_tenant(&app, "vision").await;
    let now = now_ms();
    // Two 3g.40gb fit one H100: eight bookings race for them.
    let body = mig("3g.40gb", 1, now + 2 * HOUR, now + 4 * HOUR);
    let racers = (0..8).map(|_| book(&app, &t, &app.admin, body.clone()));
    let answers = futures_util::future::join_all(racers).await;
    let accepted = answers.iter().filter(|(s, b)| *s == StatusCode::CREATED && b["state"] == "accepted").count();
    assert_eq!(accepted, 2, "{answers:?}");
    for (s, b) in answers.iter().filter(|(s, _)| *s != StatusCode::CREATED) {
        assert_eq!(*s, StatusCode::CONFLICT, "{b}");
        assert!(["no_room_in_window", "calendar_busy"].contains(&b["code"].as_str().unwrap_or("")), "{b}");
    }
    let (_, list) = app.get(&format!("/api/v1/reservations?tenant={t}&state=accepted"), &app.admin).await;
    assert_eq!(list["items"].as_array().map(Vec::len), Some(2), "{list}");
    // Where the simulation put them is kept (as the sweep keeps it): one 3g.40gb each, at different starts.
    tessera_server::services::reservations::keep_slices(&app.state).await.expect("keep");
    let kept = app.store.reservation_slices().await.expect("kept slices");
    let mut starts: Vec<i64> = kept
        .iter()
        .map(|(_, json)| {
            let v: Value = serde_json::from_str(json).expect("json");
            assert_eq!((v.as_array().map(Vec::len), v[0][1].as_str()), (Some(1), Some("3g.40gb")), "{v}");
            v[0][2].as_i64().expect("start")
        })
        .collect();
    starts.sort_unstable();
    assert_eq!(starts, vec![0, 4], "{kept:?}");
}

async fn booked_room_is_protected_from_requests_made_meanwhile(db: &TestDb) {
    let app = TestApp::on(db).auto_layout().start().await;
    app.one_gpu_of("H100-80GB").await;
    let t = auto_tenant(&app, "vision").await;
    let dev = app.member("vision-dev", &t).await;
    let start = now_ms() + HOUR;
    let (s, r) = book(&app, &t, &dev, mig("7g.80gb", 1, start, start + HOUR)).await;
    assert_eq!((s, r["state"].clone()), (StatusCode::CREATED, json!("accepted")), "{r}");
    let rid = r["id"].as_str().expect("id");
    // The calendar shows where it would go, with its owner to the tenant and anonymous to others.
    let (s, cal) = app.get("/api/v1/calendar?model=H100-80GB", &dev).await;
    assert_eq!(s, StatusCode::OK, "{cal}");
    let blocks: Vec<Value> = cal["gpus"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["blocks"].as_array().cloned().unwrap_or_default())
        .collect();
    let mine = blocks.iter().find(|b| b["kind"] == "reservation").expect("the reservation's block");
    assert_eq!(
        (mine["owner"].clone(), mine["profile"].clone(), mine["start_ms"].clone()),
        (json!(rid), json!("7g.80gb"), json!(start))
    );
    let other = app.tenant("other", json!({})).await;
    let stranger = app.member("other-dev", &other).await;
    let (_, cal) = app.get("/api/v1/calendar?model=H100-80GB", &stranger).await;
    assert!(!cal.to_string().contains(rid) && !cal.to_string().contains(&t), "anonymous to other tenants: {cal}");
    let (s, e) = app.get("/api/v1/calendar?from_ms=10&to_ms=5", &dev).await;
    assert_eq!((s, e["code"].clone()), (StatusCode::UNPROCESSABLE_ENTITY, json!("invalid_range")));
    let ask = |duration_s: Option<u64>| {
        let mut b =
            json!({"tenant": t, "spec": {"mode": "mig", "profile": "1g.10gb", "model": "H100-80GB"}, "count": 1});
        if let Some(d) = duration_s {
            b["duration_s"] = json!(d);
        }
        b
    };
    // Until released, a slice would still hold the GPU at the reservation's start: it waits, and says why.
    let (s, p) = app.send(Method::POST, "/api/v1/requests/preview", &dev, Some(ask(None))).await;
    assert_eq!(
        (s, p["outcome"].clone(), p["waiting"]["code"].clone()),
        (StatusCode::OK, json!("pending"), json!("reserved")),
        "{p}"
    );
    let (s, forever) = app.send(Method::POST, "/api/v1/requests", &dev, Some(ask(None))).await;
    assert_eq!((s, forever["state"].clone()), (StatusCode::CREATED, json!("pending")), "{forever}");
    let (_, got) = app.get(&format!("/api/v1/requests/{}", forever["id"].as_str().expect("id")), &dev).await;
    assert_eq!(got["waiting"]["reason"]["code"], "reserved", "{got}");
    assert_eq!(got["waiting"]["reason"]["reservation"], rid, "{got}");
    assert!(got["waiting"]["sentence"].as_str().unwrap_or("").contains("booked by reservation"), "{got}");
    // An admin cannot place it either.
    let path = format!("/api/v1/requests/{}/approve", forever["id"].as_str().expect("id"));
    let (s, e) = app.send(Method::POST, &path, &app.admin, None).await;
    assert_eq!((s, e["code"].clone()), (StatusCode::CONFLICT, json!("reserved")), "{e}");
    // Half an hour ends before the start: placed at once. Two hours would run into it: placed, limited to end
    // before.
    let (s, short) = app.send(Method::POST, "/api/v1/requests", &dev, Some(ask(Some(1800)))).await;
    assert_eq!((s, short["state"].clone()), (StatusCode::CREATED, json!("approved")), "{short}");
    let (s, long) = app.send(Method::POST, "/api/v1/requests", &dev, Some(ask(Some(7200)))).await;
    assert_eq!((s, long["state"].clone()), (StatusCode::CREATED, json!("approved")), "{long}");
    // Once the reservation is cancelled, the first request is placed by the sweep.
    let (s, _) = app.send(Method::POST, &format!("/api/v1/reservations/{rid}/cancel"), &dev, None).await;
    assert_eq!(s, StatusCode::OK);
    tessera_server::services::requests::place_queued(&app.state, None).await.expect("sweep");
    let (_, got) = app.get(&format!("/api/v1/requests/{}", forever["id"].as_str().expect("id")), &dev).await;
    assert_eq!(got["state"], "approved", "{got}");
}

async fn a_reservation_turns_active_at_its_start_and_ends_with_its_window(db: &TestDb) {
    let app = TestApp::on(db).auto_layout().start().await;
    app.one_gpu_of("H100-80GB").await;
    let t = auto_tenant(&app, "vision").await;
    let dev = app.member("vision-dev", &t).await;
    let start = now_ms() + 4_000;
    let end = start + 61_000;
    let (s, r) = book(&app, &t, &dev, mig("2g.20gb", 2, start, end)).await;
    assert_eq!((s, r["state"].clone()), (StatusCode::CREATED, json!("accepted")), "{r}");
    let rid = r["id"].as_str().expect("id").to_string();
    // Within its lead time: the sweep makes its request and places it.
    let swept = tessera_server::services::reservations::sweep(&app.state).await.expect("sweep");
    assert_eq!(swept.started, 1, "{swept:?}");
    let (_, r) = app.get(&format!("/api/v1/reservations/{rid}"), &dev).await;
    assert_eq!(r["state"], "preparing", "made at its lead time, usable at its start: {r}");
    let request = r["request"].as_str().expect("request").to_string();
    let (_, req) = app.get(&format!("/api/v1/requests/{request}"), &dev).await;
    assert_eq!((req["state"].clone(), req["count"].clone()), (json!("approved"), json!(2)), "{req}");
    // The node reports the instances before the start: provisioning, not active.
    let allocations: Vec<(String, String)> = app
        .store
        .tenant_allocations(&t)
        .await
        .expect("allocations")
        .into_iter()
        .filter(|a| a.request_id == request)
        .map(|a| (a.id.clone(), format!("MIG-{}", a.id)))
        .collect();
    assert_eq!(allocations.len(), 2);
    app.store.activate_allocations(&allocations, "test").await.expect("activate");
    let t1 = tessera_server::store::Transition {
        id: &request,
        expected_version: None,
        to: tessera_core::request::RequestState::Provisioning,
        reason: None,
        actor: "test",
    };
    app.store.transition(t1).await.expect("provisioning");
    tessera_server::services::reservations::sweep(&app.state).await.expect("sweep");
    let (_, req) = app.get(&format!("/api/v1/requests/{request}"), &dev).await;
    assert_eq!(req["state"], "provisioning", "not before its start: {req}");
    assert_eq!(req["waiting"]["reason"]["code"], "node_not_ready", "the demo node has no agent: {req}");
    // Before its start every view says prepared, not in use: the reservation is preparing (and not ending soon
    // although its window is short), its slices prepared without a device to use, nothing metered.
    let (_, r) = app.get(&format!("/api/v1/reservations/{rid}"), &dev).await;
    assert_eq!((r["state"].clone(), r["ending_soon"].clone()), (json!("preparing"), json!(false)), "{r}");
    let (_, listed) = app.get(&format!("/api/v1/reservations?tenant={t}&state=preparing"), &dev).await;
    assert_eq!(listed["items"].as_array().map(Vec::len), Some(1), "{listed}");
    let (_, listed) = app.get(&format!("/api/v1/reservations?tenant={t}&state=started"), &dev).await;
    assert_eq!(listed["items"].as_array().map(Vec::len), Some(0), "{listed}");
    let (_, list) = app.get(&format!("/api/v1/allocations?tenant={t}"), &dev).await;
    let mine: Vec<&Value> =
        list.as_array().expect("list").iter().filter(|a| a["request"] == request.as_str()).collect();
    assert_eq!(mine.len(), 2, "{list}");
    for a in &mine {
        assert_eq!((a["state"].clone(), a["device_uuid"].clone()), (json!("prepared"), Value::Null), "{a}");
        assert!(a["cuda_visible_devices"].is_null(), "{a}");
    }
    let (_, usage) = app.get(&format!("/api/v1/usage?tenant={t}"), &dev).await;
    let metered = usage["allocations"].as_array().expect("rows");
    assert!(metered.iter().all(|a| a["request"] != request.as_str()), "nothing metered before the start: {usage}");
    // At its start: active, expiring at the window's end.
    tokio::time::sleep(std::time::Duration::from_millis((start - now_ms()).max(0) as u64 + 50)).await;
    let swept = tessera_server::services::reservations::sweep(&app.state).await.expect("sweep");
    assert_eq!(swept.activated, 1, "{swept:?}");
    let (_, req) = app.get(&format!("/api/v1/requests/{request}"), &dev).await;
    assert_eq!((req["state"].clone(), req["expires_at_ms"].clone()), (json!("active"), json!(end)), "{req}");
    let (_, r) = app.get(&format!("/api/v1/reservations/{rid}"), &dev).await;
    assert_eq!((r["state"].clone(), r["ending_soon"].clone()), (json!("started"), json!(true)), "{r}");
    let (_, list) = app.get(&format!("/api/v1/allocations?tenant={t}"), &dev).await;
    for a in list.as_array().expect("list").iter().filter(|a| a["request"] == request.as_str()) {
        assert_eq!(a["state"], "active", "{a}");
        assert!(a["device_uuid"].as_str().is_some_and(|d| d.starts_with("MIG-")), "{a}");
    }
    // Metered from the window's start, not from when the instances were made.
    let (_, usage) = app.get(&format!("/api/v1/usage?tenant={t}"), &dev).await;
    let rows: Vec<&Value> =
        usage["allocations"].as_array().expect("rows").iter().filter(|a| a["request"] == request.as_str()).collect();
    assert_eq!(rows.len(), 2, "{usage}");
    assert!(rows.iter().all(|a| a["from_ms"] == json!(start)), "{usage}");
    // At its end: released (expired), the reservation ended, the instances free.
    let swept = tessera_server::services::reservations::sweep_at(&app.state, end).await.expect("sweep");
    assert_eq!(swept.ended, 1, "{swept:?}");
    let (_, req) = app.get(&format!("/api/v1/requests/{request}"), &dev).await;
    assert_eq!(req["state"], "expired", "{req}");
    let (_, r) = app.get(&format!("/api/v1/reservations/{rid}"), &dev).await;
    assert_eq!(r["state"], "ended", "{r}");
    let live = app.store.tenant_allocations(&t).await.expect("allocations");
    assert!(live.iter().all(|a| a.request_id != request || a.state == "released"), "{live:?}");
}

async fn a_starting_reservation_is_placed_on_the_slices_kept_for_it(db: &TestDb) {
    let app = TestApp::on(db).auto_layout().start().await;
    app.one_gpu_of("H100-80GB").await;
    let t = auto_tenant(&app, "vision").await;
    let dev = app.member("vision-dev", &t).await;
    // A slice held now; a reservation booked beside it, its slice kept where the calendar's simulation put it.
    let ask = json!({"tenant": t, "spec": {"mode": "mig", "profile": "1g.10gb", "model": "H100-80GB"}, "count": 1});
    let (s, held) = app.send(Method::POST, "/api/v1/requests", &dev, Some(ask.clone())).await;
    assert_eq!((s, held["state"].clone()), (StatusCode::CREATED, json!("approved")), "{held}");
    let start = now_ms() + 60_000;
    let (s, r) = book(&app, &t, &dev, mig("1g.10gb", 1, start, start + HOUR)).await;
    assert_eq!((s, r["state"].clone()), (StatusCode::CREATED, json!("accepted")), "{r}");
    let rid = r["id"].as_str().expect("id").to_string();
    let kept = app.store.reservation_slices().await.expect("kept");
    let kept: Vec<(String, String, u8)> =
        serde_json::from_str(&kept.iter().find(|(id, _)| *id == rid).expect("kept slices").1).expect("json");
    assert_eq!(kept.len(), 1, "{kept:?}");
    // The held slice is cancelled: the planner alone would now put a 1g.10gb elsewhere than the kept slice.
    let path = format!("/api/v1/requests/{}/cancel", held["id"].as_str().expect("id"));
    let (s, b) = app.send(Method::POST, &path, &dev, None).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let (_, p) = app.send(Method::POST, "/api/v1/requests/preview", &dev, Some(ask)).await;
    let planner_start = p["slices"][0]["start"].as_u64().expect("planned start");
    assert_ne!(planner_start, u64::from(kept[0].2), "the scenario needs the planner to choose otherwise: {p}");
    // Within its lead time the sweep starts it, on the kept slice.
    let swept = tessera_server::services::reservations::sweep(&app.state).await.expect("sweep");
    assert_eq!(swept.started, 1, "{swept:?}");
    let (_, r) = app.get(&format!("/api/v1/reservations/{rid}"), &dev).await;
    let request = r["request"].as_str().expect("request").to_string();
    let (_, allocations) = app.get(&format!("/api/v1/allocations?tenant={t}"), &dev).await;
    let placed: Vec<(String, u64)> = allocations
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["request"] == request.as_str())
        .map(|a| (a["profile"].as_str().unwrap_or("").to_string(), a["start"].as_u64().unwrap_or(99)))
        .collect();
    assert_eq!(placed, vec![("1g.10gb".to_string(), u64::from(kept[0].2))], "kept {kept:?}");
}

/// Two whole A30s on one node (the demo's own A30 cordoned): while a time-sliced reservation holds one, an MPS
/// reservation overlapping it has no room (the other A30 shares the node), and fits once it has ended; the calendar
/// then keeps a time-sliced request made now for ever off the node, since it would leave the MPS reservation no GPU.
async fn time_slicing_and_mps_never_share_a_node_in_the_calendar(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let (_, nodes) = app.get("/api/v1/nodes", &app.admin).await;
    for g in nodes.as_array().into_iter().flatten().flat_map(|n| n["gpus"].as_array().cloned().unwrap_or_default()) {
        if g["mig_enabled"] == false {
            let path = format!("/api/v1/gpus/{}/cordon", g["id"].as_str().expect("id"));
            let (s, b) = app.send(Method::POST, &path, &app.admin, None).await;
            assert_eq!(s, StatusCode::OK, "{b}");
        }
    }
    let a30 = |i: u32| json!({"index": i, "uuid": format!("GPU-a30-{i}"), "model": "A30-24GB", "mig_enabled": false});
    let (s, b) = app
        .send(Method::POST, "/api/v1/nodes", &app.admin, Some(json!({"name": "twin", "gpus": [a30(0), a30(1)]})))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let t = auto_tenant(&app, "vision").await;
    let dev = app.member("vision-dev", &t).await;
    let share = |mode: &str, start_ms: i64, end_ms: i64| {
        json!({"spec": {"mode": mode, "model": "A30-24GB", "replicas": 2}, "count": 1, "start_ms": start_ms,
               "end_ms": end_ms, "reason": "inference"})
    };
    let start = now_ms() + HOUR;
    let (s, ts) = book(&app, &t, &dev, share("timeslice", start, start + 2 * HOUR)).await;
    assert_eq!(s, StatusCode::CREATED, "{ts}");
    accepted(&app, &dev, ts).await;
    // MPS overlapping it: the node's other A30 is free, but not for MPS then; the preview agrees.
    let (s, e) = book(&app, &t, &dev, share("mps", start + HOUR, start + 3 * HOUR)).await;
    assert_eq!((s, e["code"].clone()), (StatusCode::CONFLICT, json!("no_room_in_window")), "{e}");
    let path = format!("/api/v1/tenants/{t}/reservations/preview");
    let (s, p) = app.send(Method::POST, &path, &dev, Some(share("mps", start + HOUR, start + 3 * HOUR))).await;
    assert_eq!(s, StatusCode::OK, "{p}");
    assert_eq!((p["fits"].clone(), p["free_in_window"].clone()), (json!(false), json!(0)), "{p}");
    // More time-slicing fits beside it (the other A30, or the second share of the first).
    let (s, p) = app.send(Method::POST, &path, &dev, Some(share("timeslice", start + HOUR, start + 3 * HOUR))).await;
    assert_eq!((s, p["fits"].clone()), (StatusCode::OK, json!(true)), "{p}");
    // Once the time-slicing has ended, MPS fits.
    let (s, mps) = book(&app, &t, &dev, share("mps", start + 2 * HOUR, start + 3 * HOUR)).await;
    assert_eq!(s, StatusCode::CREATED, "{mps}");
    accepted(&app, &dev, mps).await;
    // A time-sliced request made now, held for ever, would leave the MPS reservation no GPU on the node: it waits.
    let ask = json!({"tenant": t, "spec": {"mode": "timeslice", "model": "A30-24GB", "replicas": 2}, "count": 1});
    let (s, p) = app.send(Method::POST, "/api/v1/requests/preview", &dev, Some(ask.clone())).await;
    assert_eq!(
        (s, p["outcome"].clone(), p["waiting"]["code"].clone()),
        (StatusCode::OK, json!("pending"), json!("reserved")),
        "{p}"
    );
    // A starting share goes on the share the calendar kept for it when that is free now (here the second share of
    // one A30, though the other A30 is unused), and not at all beside MPS on its node.
    use tessera_server::services::placement::{FleetNow, placement_on};
    let (_, nodes) = app.get("/api/v1/nodes", &app.admin).await;
    let twin: Vec<String> = nodes
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| n["name"] == "twin")
        .flat_map(|n| n["gpus"].as_array().cloned().unwrap_or_default())
        .filter_map(|g| g["id"].as_str().map(str::to_string))
        .collect();
    assert_eq!(twin.len(), 2);
    let spec = |mode: &str| -> tessera_core::request::SliceSpec {
        serde_json::from_value(json!({"mode": mode, "model": "A30-24GB", "replicas": 2})).expect("spec")
    };
    let kept = |gpu: &str, mode: &str| {
        vec![tessera_core::reservation::Hold {
            gpu: gpu.into(),
            profile: format!("{mode}:2"),
            start: 1,
            until_ms: None,
        }]
    };
    let fleet = FleetNow::read(&app.state).await.expect("fleet");
    let (changes, placed) =
        placement_on(&app.state, &fleet, &spec("timeslice"), 1, &kept(&twin[1], "timeslice")).expect("free now");
    assert!(changes.is_empty());
    assert_eq!(
        (placed[0].gpu_id.as_str(), placed[0].start, placed[0].profile.as_str()),
        (twin[1].as_str(), 1, "timeslice:2")
    );
    assert!(placement_on(&app.state, &fleet, &spec("timeslice"), 2, &kept(&twin[1], "timeslice")).is_none(), "count");
    // Half an hour of MPS ends before the reservations start: placed now, on one A30.
    let mut short = ask;
    short["spec"]["mode"] = json!("mps");
    short["duration_s"] = json!(1800);
    let (s, r) = app.send(Method::POST, "/api/v1/requests", &dev, Some(short)).await;
    assert_eq!((s, r["state"].clone()), (StatusCode::CREATED, json!("approved")), "{r}");
    let live = app.store.tenant_allocations(&t).await.expect("allocations");
    let on = live.iter().find(|a| a.request_id == r["id"]).expect("the MPS share").gpu_id.clone();
    let other = twin.iter().find(|g| **g != on).expect("the other A30");
    let fleet = FleetNow::read(&app.state).await.expect("fleet");
    assert!(placement_on(&app.state, &fleet, &spec("timeslice"), 1, &kept(other, "timeslice")).is_none(), "beside MPS");
    assert!(placement_on(&app.state, &fleet, &spec("mps"), 1, &kept(other, "mps")).is_some(), "MPS beside MPS");
}

/// The reservation `r` just booked, accepted by an admin where the tenant's policy left it pending.
async fn accepted(app: &TestApp, token: &str, r: Value) {
    let id = r["id"].as_str().expect("id").to_string();
    if r["state"] == "pending" {
        let (s, b) = app.send(Method::POST, &format!("/api/v1/reservations/{id}/approve"), &app.admin, None).await;
        assert_eq!(s, StatusCode::OK, "{b}");
    }
    let (_, r) = app.get(&format!("/api/v1/reservations/{id}"), token).await;
    assert_eq!(r["state"], "accepted", "{r}");
}
