//! Allocation hours kept as they end (`tessera_services::use_hours`), on both backends: reports that sum them say
//! what the stored series say; the kept hours are what is read; late telemetry and use moved into the past make
//! them be kept again; replicas keeping together keep each hour once.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tessera_server::services::use_hours::{SETTLE_MS, keep, span_sums};
use tessera_server::store::{Role, now_ms};

use crate::admin::{App, minute, spawn};
use crate::harness::{TestDb, on_both_backends};

on_both_backends!(reports_read_kept_hours_and_say_what_the_series_says);

const HOUR: i64 = 3_600_000;
const FOREVER: std::time::Duration = std::time::Duration::from_secs(600);

/// The start of the last hour that has settled: the end of the hours kept once keeping has caught up.
fn settled() -> i64 {
    let t = now_ms() - SETTLE_MS;
    t - t.rem_euclid(HOUR)
}

/// Keeps hours until none that has settled is left (the server's sweep may keep some meanwhile).
async fn catch_up(app: &App) {
    for _ in 0..100 {
        if keep(&app.state.store, now_ms(), FOREVER).await.expect("keep").behind == 0 {
            return;
        }
    }
    panic!("keeping never caught up");
}

/// Per allocation of `ids`: its `util_in_period` in the admin's usage of `query`, and its mean read from the
/// stored series alone over the same span.
async fn means(app: &App, query: &str, ids: &[&str]) -> Vec<(f64, f64)> {
    means_of(app, &app.admin, query, ids).await
}

/// [`means`] as `token` reads them.
async fn means_of(app: &App, token: &str, query: &str, ids: &[&str]) -> Vec<(f64, f64)> {
    let (s, v) = app.get(&format!("/api/v1/usage?{query}"), token).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let rows = v["allocations"].as_array().expect("rows");
    let mut out = Vec::new();
    for id in ids {
        let row = rows.iter().find(|r| r["allocation"] == *id).unwrap_or_else(|| panic!("{id} in {v}"));
        let reported = row["util_in_period"].as_f64().unwrap_or_else(|| panic!("a mean for {id}: {row}"));
        let device = row["device_uuid"].as_str().expect("device");
        let span = (0, device, row["from_ms"].as_i64().expect("from"), row["to_ms"].as_i64().expect("to"));
        let sums = span_sums(&app.state.store, &[span], now_ms()).await.expect("series");
        let (weighted, samples) = sums.get(&0).copied().expect("series sums");
        out.push((reported, weighted / samples as f64));
    }
    out
}

/// The tenant's `(measured, used)` slice-hours in the efficiency report of the last 6 hours.
async fn efficiency(app: &App, tenant: &str) -> (f64, f64) {
    let (s, v) = app.get("/api/v1/efficiency?hours=6", &app.admin).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let t = v["tenants"].as_array().expect("tenants").iter().find(|t| t["tenant_id"] == tenant).cloned();
    let t = t.unwrap_or_else(|| panic!("{tenant} in {v}"));
    (t["measured_slice_hours"].as_f64().expect("measured"), t["used_slice_hours"].as_f64().expect("used"))
}

fn same(got: &[(f64, f64)]) -> bool {
    got.iter().all(|(reported, series)| (reported - series).abs() < 1e-9)
}

async fn reports_read_kept_hours_and_say_what_the_series_says(db: &TestDb) {
    let app = spawn(db).await;
    let t = app.limited_tenant("kept", json!({}), 7).await;
    let (_, alice) = app.user("alice", &[(&t, Role::Member)]).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        let (request, a) = app.active(&alice, &t, "1g.10gb", 1).await;
        let a = a[0].clone();
        app.backdate(db, a["id"].as_str().expect("id"), 5 * HOUR).await;
        held.push((request, a));
    }
    let field = |a: &Value, f: &str| a[f].as_str().expect(f).to_string();
    let now = now_ms();
    let this_minute = now - now.rem_euclid(60_000);
    let at = |k: i64| this_minute - k * 60_000;
    // Five hours of minutes: the first device's use climbs hour by hour, the second's is even, the third's jumps.
    let mut rows = Vec::new();
    for k in 1..=300 {
        let utils = [10.0 + (k / 60) as f64 * 15.0, 50.0, if k % 7 == 0 { 95.0 } else { 5.0 }];
        for ((_, a), util) in held.iter().zip(utils) {
            rows.push(minute(&app, &field(a, "device_uuid"), &field(a, "gpu_uuid"), at(k), util));
        }
    }
    // The second device, busy before it was held (within the efficiency report's 6 hours): counted for nobody.
    for k in 303..=355 {
        rows.push(minute(&app, &field(&held[1].1, "device_uuid"), &field(&held[1].1, "gpu_uuid"), at(k), 100.0));
    }
    app.state.store.write_minutes(&rows).await.expect("minutes");
    let (s, v) = app.send(Method::POST, &format!("/api/v1/requests/{}/release", held[0].0), &alice, None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let ids: Vec<String> = held.iter().map(|(_, a)| field(a, "id")).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    // The whole use, and a period that cuts it at both ends.
    let whole = format!("from={}&to={}", now - 6 * HOUR, now + HOUR);
    let cut = format!("from={}&to={}", now - 2 * HOUR - 17 * 60_000, now - 31 * 60_000);
    let efficiency_before = efficiency(&app, &t).await;

    // Kept up to the last hour that has settled, each allocation's hours with telemetry: the reports say what the
    // series say.
    catch_up(&app).await;
    let kept = app.state.store.allocation_hours_kept().await.expect("kept").expect("some kept");
    assert_eq!(kept.to_ms, settled());
    let (whole_1, cut_1) = (means(&app, &whole, &ids).await, means(&app, &cut, &ids).await);
    assert!(same(&whole_1) && same(&cut_1), "{whole_1:?} {cut_1:?}");
    assert!((whole_1[1].0 - 50.0).abs() < 1e-9, "{whole_1:?}");
    let (as_member, paged) =
        (means_of(&app, &alice, &whole, &ids).await, means(&app, &format!("{whole}&limit=3"), &ids).await);
    let alike = |a: &[(f64, f64)]| a.iter().zip(&whole_1).all(|(x, y)| (x.0 - y.0).abs() < 1e-9);
    assert!(alike(&as_member) && alike(&paged), "a member's read and a page say the same: {as_member:?} {paged:?}");
    let efficiency_after = efficiency(&app, &t).await;
    // The same share used (the two held ones' hours grow meanwhile, at their own means: a drift of about 1e-5 a
    // second; a released allocation measured wrongly moves it by a tenth).
    let ratio = |(measured, used): (f64, f64)| used / measured;
    let drift = (ratio(efficiency_before) - ratio(efficiency_after)).abs();
    assert!(drift < 1e-3, "{efficiency_before:?} {efficiency_after:?}");
    // Each allocation measured over its own use, active or released: the share used is that of the usage report's
    // means, weighted by what each held (the second device's busy hour before it was held moves it by 0.02).
    let (s, v) = app.get(&format!("/api/v1/usage?{whole}"), &app.admin).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (held_s, used_s) = v["allocations"].as_array().expect("rows").iter().filter(|r| r["tenant_id"] == t).fold(
        (0.0, 0.0),
        |(h, u), r| {
            let seconds = r["slice_seconds"].as_f64().expect("slice seconds");
            (h + seconds, u + seconds * r["util_in_period"].as_f64().expect("mean") / 100.0)
        },
    );
    let own = used_s / held_s;
    assert!((ratio(efficiency_after) - own).abs() < 1e-3, "{efficiency_after:?} against {own}");

    // The series changed behind the servers' backs (no server writes a row's mean over): the reports still say
    // what the kept hours hold, so they are what is read.
    // (The hours kept only: the hour since, read from the series, is not.)
    let moved = "UPDATE telemetry_hours SET util_avg = 100 WHERE device = $1 AND minute_ms < $2";
    let even_device = field(&held[1].1, "device_uuid");
    if db.url.starts_with("sqlite:") {
        let pool = sqlx::SqlitePool::connect(&db.url).await.expect("sqlite");
        sqlx::query(moved).bind(&even_device).bind(kept.to_ms).execute(&pool).await.expect("moved");
        pool.close().await;
    } else {
        let pool = sqlx::PgPool::connect(&db.url).await.expect("postgres");
        sqlx::query(moved).bind(&even_device).bind(kept.to_ms).execute(&pool).await.expect("moved");
        pool.close().await;
    }
    let read = means(&app, &whole, &ids).await;
    assert!((read[1].0 - 50.0).abs() < 1e-9 && read[1].1 > 50.0, "kept {read:?}");

    // A minute that arrives late for a kept hour: the hours from it on are forgotten and the reports read it at
    // once from the series; kept again, they say the same.
    let late_at = kept.to_ms - 2 * HOUR + 30 * 60_000;
    let late = minute(&app, &field(&held[2].1, "device_uuid"), &field(&held[2].1, "gpu_uuid"), late_at, 100.0);
    app.state.store.write_minutes(&[late]).await.expect("late minute");
    let forgotten = app.state.store.allocation_hours_kept().await.expect("kept").expect("kept");
    assert!(forgotten.to_ms <= late_at - late_at.rem_euclid(HOUR) && forgotten.epoch > kept.epoch, "{forgotten:?}");
    let with_late = means(&app, &whole, &ids).await;
    assert!(with_late[2].0 > whole_1[2].0 && (with_late[2].0 - with_late[2].1).abs() < 1e-9, "{with_late:?}");
    catch_up(&app).await;
    let again = means(&app, &whole, &ids).await;
    assert!((again[2].0 - with_late[2].0).abs() < 1e-9, "{again:?} {with_late:?}");

    // Use moved into the past by the store: the hours from there on are kept again, by two replicas at once
    // (beside the server's own sweep) each hour once, and say what the series say.
    app.state.store.backdate_request(&held[1].0, now - 5 * HOUR).await.expect("backdate");
    let back = app.state.store.allocation_hours_kept().await.expect("kept").expect("kept");
    assert!(back.to_ms <= (now - 5 * HOUR) - (now - 5 * HOUR).rem_euclid(HOUR), "{back:?}");
    let store = &app.state.store;
    let (a, b) = tokio::join!(keep(store, now_ms(), FOREVER), keep(store, now_ms(), FOREVER));
    let (a, b) = (a.expect("one"), b.expect("other"));
    assert!(i64::from(a.hours + b.hours) <= (settled() - back.to_ms) / HOUR, "each hour once: {a:?} {b:?}");
    catch_up(&app).await;
    let last = means(&app, &whole, &ids).await;
    assert!((last[1].0 - last[1].1).abs() < 1e-9 && last[1].0 > 50.0, "the changed series, kept again: {last:?}");
    assert!((last[0].0 - whole_1[0].0).abs() < 1e-9, "{last:?}");

    // Any run of an allocation's kept hours sums, from the running sums of its ends, what its rows hold: after
    // hours were forgotten and kept again, and after the oldest were dropped.
    runs_sum_their_rows(db, &app, &ids).await;
    let first = app.state.store.allocation_hours_kept().await.expect("kept").expect("kept").from_ms;
    let hour_of = |t: i64| t - t.rem_euclid(HOUR);
    app.state.store.prune_allocation_hours(hour_of(now - 3 * HOUR).max(first)).await.expect("prune");
    runs_sum_their_rows(db, &app, &ids).await;
}

/// For every run of hours within the last 7 (whole, cut, empty, reaching past the kept ones), each allocation's
/// [`Store::allocation_hour_sums`] equals the sums of its rows in the run.
///
/// [`Store::allocation_hour_sums`]: tessera_server::store::Store::allocation_hour_sums
async fn runs_sum_their_rows(db: &TestDb, app: &App, ids: &[&str]) {
    let now = now_ms();
    let base = now - now.rem_euclid(HOUR) - 7 * HOUR;
    let mut windows = Vec::new();
    for id in ids {
        for lo in 0..8 {
            for hi in lo..9 {
                windows.push((
                    id.to_string(),
                    base + lo * HOUR - (lo % 2) * 60_000,
                    base + hi * HOUR + (hi % 3) * 1_000,
                ));
            }
        }
    }
    let got = app.state.store.allocation_hour_sums(&windows).await.expect("sums");
    let sql = "SELECT CAST(COALESCE(SUM(weighted), 0) AS DOUBLE PRECISION), CAST(COALESCE(SUM(samples), 0) AS BIGINT) \
               FROM allocation_hours WHERE allocation_id = $1 AND hour_ms >= $2 AND hour_ms < $3";
    let mut want = Vec::new();
    if db.url.starts_with("sqlite:") {
        let pool = sqlx::SqlitePool::connect(&db.url).await.expect("sqlite");
        for (id, lo, hi) in &windows {
            want.push(
                sqlx::query_as::<_, (f64, i64)>(sql).bind(id).bind(lo).bind(hi).fetch_one(&pool).await.expect("sum"),
            );
        }
        pool.close().await;
    } else {
        let pool = sqlx::PgPool::connect(&db.url).await.expect("postgres");
        for (id, lo, hi) in &windows {
            want.push(
                sqlx::query_as::<_, (f64, i64)>(sql).bind(id).bind(lo).bind(hi).fetch_one(&pool).await.expect("sum"),
            );
        }
        pool.close().await;
    }
    assert!(want.iter().any(|w| w.1 > 0), "some runs hold kept hours");
    for ((w, g), window) in want.iter().zip(&got).zip(&windows) {
        assert!(w.1 == g.1 && (w.0 - g.0).abs() < 1e-6 * w.0.abs().max(1.0), "{window:?}: {g:?}, its rows {w:?}");
    }
}
