//! One-time sign-in links, the way a newcomer meets them: `tessera serve --demo` with its default settings prints
//! a link for `admin` and one for the demo member; each signs its user into the portal once, a restart prints
//! fresh ones and the old stop working; `tessera user` issues links and sets passwords on the database; platform
//! admins issue links through the API; `TESSERA_BOOTSTRAP_PASSWORD` applies to an admin without a password.

use std::time::Duration;

use reqwest::header::{LOCATION, SET_COOKIE};
use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::agents::free_port;
use crate::harness::{TestApp, TestDb, on_both_backends};

on_both_backends!(platform_admins_issue_links_that_sign_in_once_and_replace_the_last);

/// `tessera serve` on `data_dir` with its default settings (and `--demo`), until it has printed its links.
struct Served {
    _child: tokio::process::Child,
    base: String,
    /// `(user name, link)` as printed.
    links: Vec<(String, String)>,
}

async fn serve(data_dir: &std::path::Path, env: &[(&str, &str)]) -> Served {
    let port = free_port();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["serve", "--demo", "--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
        .arg(data_dir)
        .env_remove("TESSERA_LOG")
        .env_remove("RUST_LOG")
        .env_remove("TESSERA_BOOTSTRAP_TOKEN")
        .env_remove("TESSERA_BOOTSTRAP_PASSWORD")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start tessera serve");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut links = Vec::new();
    let read = async {
        while let Some(line) = lines.next_line().await.expect("stdout") {
            let words: Vec<&str> = line.split_whitespace().collect();
            if let ["as", name, url] = words.as_slice() {
                links.push((name.to_string(), url.to_string()));
            }
            if line.starts_with("A new link:") {
                return;
            }
        }
        panic!("the server's output ended before its sign-in links");
    };
    tokio::time::timeout(Duration::from_secs(60), read).await.expect("sign-in links within 60 s");
    // Keep the pipe drained so the server never blocks on its own output.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Served { _child: child, base: format!("http://127.0.0.1:{port}"), links }
}

impl Served {
    fn link(&self, name: &str) -> Option<String> {
        self.links.iter().find(|(n, _)| n == name).map(|(_, l)| l.clone())
    }
}

/// A data directory of its own, removed when dropped.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new() -> TempDir {
        let dir = std::env::temp_dir().join(format!("tessera-links-{}", uuid::Uuid::now_v7().simple()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }

    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A browser: cookies kept, redirects not followed.
fn browser() -> Client {
    Client::builder().cookie_store(true).redirect(reqwest::redirect::Policy::none()).build().expect("client")
}

/// Opens `link` in `browser`: where it sends the browser, and whether it set a session cookie.
async fn open(browser: &Client, link: &str) -> (StatusCode, String, bool) {
    let r = browser.get(link).send().await.expect("open the link");
    let location = r.headers().get(LOCATION).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    let session =
        r.headers().get_all(SET_COOKIE).iter().any(|c| c.to_str().is_ok_and(|c| c.starts_with("tessera_session=")));
    (r.status(), location, session)
}

/// Who the browser is signed in as: `(name, platform admin)`.
async fn who(browser: &Client, base: &str) -> Option<(String, bool)> {
    let r = browser.get(format!("{base}/api/v1/session")).send().await.expect("session");
    if r.status() != StatusCode::OK {
        return None;
    }
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["single_sign_on"], false, "a user signed in by a link is a local user: {v}");
    Some((v["user"]["name"].as_str()?.to_string(), v["user"]["platform_admin"].as_bool()?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_prints_links_that_sign_in_once_and_a_restart_replaces_them() {
    let dir = TempDir::new();
    let first = serve(dir.path(), &[]).await;
    let admin_link = first.link("admin").expect("a link for admin, who has no password");
    let member_link = first.link("dana").expect("a link for the demo member");
    assert!(admin_link.starts_with(&format!("{}/auth/link?token=tsl_", first.base)), "{admin_link}");

    let admin = browser();
    assert_eq!(open(&admin, &admin_link).await, (StatusCode::SEE_OTHER, "/".to_string(), true));
    assert_eq!(who(&admin, &first.base).await, Some(("admin".to_string(), true)));
    // Used up: a second browser gets the sign-in page and no session.
    let late = browser();
    assert_eq!(open(&late, &admin_link).await, (StatusCode::SEE_OTHER, "/signin?link=invalid".to_string(), false));
    assert_eq!(who(&late, &first.base).await, None);
    // A tampered secret goes the same way; one past the documented bound (128 characters) is a bad query.
    assert_eq!(open(&late, &format!("{admin_link}x")).await.1, "/signin?link=invalid");
    let long = format!("{}/auth/link?token=tsl_{}", first.base, "a".repeat(125));
    let r = late.get(&long).send().await.expect("send");
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(r.json::<Value>().await.expect("problem")["code"], "invalid_query");

    // A restart prints fresh links; the unused one from before stops working.
    drop(first);
    let second = serve(dir.path(), &[]).await;
    let fresh = second.link("dana").expect("a fresh link for the demo member");
    assert_ne!(fresh, member_link);
    let stale = member_link.replace(&member_link[..member_link.find("/auth").expect("path")], &second.base);
    assert_eq!(open(&browser(), &stale).await.1, "/signin?link=invalid");
    let member = browser();
    assert_eq!(open(&member, &fresh).await.0, StatusCode::SEE_OTHER);
    assert_eq!(who(&member, &second.base).await, Some(("dana".to_string(), false)));

    // The member sets a password (it has none, so no current one is asked for); admin still has none, so the
    // next start prints admin a link again, and the member none beyond the demo's.
    let (_, me) = {
        let r = member.get(format!("{}/api/v1/session", second.base)).send().await.expect("session");
        let v: Value = r.json().await.expect("json");
        ((), v)
    };
    let csrf = me["csrf_token"].as_str().expect("csrf").to_string();
    let id = me["user"]["id"].as_str().expect("id").to_string();
    let r = member
        .request(Method::PUT, format!("{}/api/v1/users/{id}/password", second.base))
        .header("x-csrf-token", csrf)
        .json(&json!({"password": "a long enough password"}))
        .send()
        .await
        .expect("set password");
    assert_eq!(r.status(), StatusCode::NO_CONTENT, "{}", r.text().await.unwrap_or_default());
    let r = Client::new()
        .post(format!("{}/auth/local", second.base))
        .json(&json!({"name": "dana", "password": "a long enough password"}))
        .send()
        .await
        .expect("sign in");
    assert_eq!(r.status(), StatusCode::OK);
}

/// The status of `admin`'s password sign-in at `base`.
async fn admin_sign_in(base: &str, password: &str) -> StatusCode {
    let body = json!({"name": "admin", "password": password});
    Client::new().post(format!("{base}/auth/local")).json(&body).send().await.expect("send").status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_with_a_password_gets_no_link_and_the_bootstrap_password_fills_only_an_empty_one() {
    let dir = TempDir::new();
    let first = serve(dir.path(), &[]).await;
    assert!(first.link("admin").is_some());
    drop(first);
    // Restarted with a bootstrap password: admin had none, so it is set, and no admin link is printed.
    let second = serve(dir.path(), &[("TESSERA_BOOTSTRAP_PASSWORD", "first password, long")]).await;
    assert_eq!(second.link("admin"), None, "{:?}", second.links);
    assert_eq!(admin_sign_in(&second.base, "first password, long").await, StatusCode::OK);
    drop(second);
    // A later bootstrap password never overwrites the one set.
    let third = serve(dir.path(), &[("TESSERA_BOOTSTRAP_PASSWORD", "second password, long")]).await;
    assert_eq!(admin_sign_in(&third.base, "second password, long").await, StatusCode::UNAUTHORIZED);
    assert_eq!(admin_sign_in(&third.base, "first password, long").await, StatusCode::OK);
    drop(third);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_user_command_issues_links_and_sets_passwords_on_the_database() {
    let dir = TempDir::new();
    let served = serve(dir.path(), &[]).await;
    let tessera = |args: &[&str], stdin: &str| {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
            .arg("user")
            .args(args)
            .arg("--data-dir")
            .arg(dir.path())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run tessera user");
        use std::io::Write;
        child.stdin.take().expect("stdin").write_all(stdin.as_bytes()).expect("write stdin");
        let o = child.wait_with_output().expect("output");
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).trim().to_string(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (code, link, err) = tessera(&["sign-in-link", "dana", "--url", &served.base], "");
    assert_eq!(code, Some(0), "{err}");
    let b = browser();
    assert_eq!(open(&b, &link).await.1, "/");
    assert_eq!(who(&b, &served.base).await, Some(("dana".to_string(), false)));
    assert_eq!(tessera(&["sign-in-link", "nobody"], "").0, Some(1));

    assert_eq!(tessera(&["set-password", "dana"], "short\n").0, Some(2), "too short");
    let (code, out, err) = tessera(&["set-password", "dana"], "dana's own passphrase\n");
    assert_eq!((code, out.as_str()), (Some(0), "Password of `dana` set."), "{err}");
    let r = Client::new()
        .post(format!("{}/auth/local", served.base))
        .json(&json!({"name": "dana", "password": "dana's own passphrase"}))
        .send()
        .await
        .expect("sign in");
    assert_eq!(r.status(), StatusCode::OK);
}

async fn platform_admins_issue_links_that_sign_in_once_and_replace_the_last(db: &TestDb) {
    let app = TestApp::on(db).start().await;
    let t = app.tenant("team", json!({})).await;
    let (id, member) = app.user("newcomer", &[(t.as_str(), tessera_server::store::Role::TenantAdmin)]).await;
    let path = format!("/api/v1/users/{id}/sign-in-link");
    // A tenant admin cannot sign in as anybody, even a member of their own tenant.
    let (s, v) = app.send(Method::POST, &path, &member, None).await;
    assert_eq!((s, v["code"].as_str()), (StatusCode::FORBIDDEN, Some("forbidden")), "{v}");
    let (s, v) = app.send(Method::POST, "/api/v1/users/no-such-user/sign-in-link", &app.admin, None).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");

    let (s, first) = app.send(Method::POST, &path, &app.admin, None).await;
    assert_eq!(s, StatusCode::CREATED, "{first}");
    let (s, second) = app.send(Method::POST, &path, &app.admin, None).await;
    assert_eq!(s, StatusCode::CREATED, "{second}");
    let expires = second["expires_at_ms"].as_i64().expect("expiry");
    let now = tessera_server::store::now_ms();
    assert!((now + 71 * 3600 * 1000..=now + 72 * 3600 * 1000).contains(&expires), "{second}");
    let url = |v: &Value| format!("{}{}", app.base, v["path"].as_str().expect("path"));
    // The first link was replaced by the second.
    assert_eq!(open(&browser(), &url(&first)).await.1, "/signin?link=invalid");
    let b = browser();
    assert_eq!(open(&b, &url(&second)).await, (StatusCode::SEE_OTHER, "/".to_string(), true));
    assert_eq!(who(&b, &app.base).await, Some(("newcomer".to_string(), false)));
    assert_eq!(open(&browser(), &url(&second)).await.1, "/signin?link=invalid");
    // Audited without the secret.
    let (_, log) = app.get(&format!("/api/v1/audit?object=user/{id}"), &app.admin).await;
    let issued: Vec<&Value> =
        log.as_array().expect("log").iter().filter(|e| e["action"] == "user.sign_in_link").collect();
    assert_eq!(issued.len(), 2, "{log}");
    assert!(!log.to_string().contains("tsl_"), "{log}");
}

/// What a newcomer finds on first start of the demo, signed in by the printed admin link: a request and layout
/// changes waiting for an admin, an idle allocation to reclaim, and a week of usage and minute telemetry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_starts_with_work_waiting_and_a_week_of_history() {
    let dir = TempDir::new();
    let served = serve(dir.path(), &[]).await;
    let admin = browser();
    let (status, _, session) = open(&admin, &served.link("admin").expect("admin link")).await;
    assert!(status == StatusCode::SEE_OTHER && session);
    let get = |path: String| {
        let (admin, url) = (admin.clone(), format!("{}{path}", served.base));
        async move {
            let r = admin.get(&url).send().await.expect("send");
            assert_eq!(r.status(), StatusCode::OK, "{url}");
            r.json::<Value>().await.expect("json")
        }
    };
    // The demo is seeded once both simulated nodes have joined and its idle allocation is active.
    let mut recorded = false;
    for _ in 0..240 {
        let audit = get("/api/v1/audit?object=history".into()).await;
        if audit.as_array().is_some_and(|a| a.iter().any(|e| e["action"] == "history.record")) {
            recorded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(recorded, "the demo's history was not recorded within 2 minutes");
    let tenants = get("/api/v1/tenants".into()).await;
    let id =
        |name: &str| tenants.as_array().expect("tenants").iter().find(|t| t["name"] == name).expect(name)["id"].clone();
    let llm = id("llm-serving");
    assert_eq!(
        tenants.as_array().expect("tenants").iter().find(|t| t["id"] == llm).expect("llm")["auto_approve"],
        false
    );
    let pending = get("/api/v1/requests?state=pending".into()).await;
    let pending = pending["items"].as_array().expect("items").clone();
    assert!(pending.iter().any(|r| r["tenant"] == llm), "a request waits for an admin: {pending:?}");
    let proposed = get("/api/v1/layouts?state=proposed".into()).await;
    assert!(!proposed.as_array().expect("layouts").is_empty(), "a layout change waits for an admin");
    let asks = get("/api/v1/quota-requests?state=pending".into()).await;
    let asks = asks["items"].as_array().expect("items").clone();
    assert!(
        asks.iter().any(|q| q["tenant"] == llm && q["until_ms"].is_i64()),
        "a temporary quota increase waits for an admin: {asks:?}"
    );
    let week = 7 * 24 * 3_600_000_i64;
    let now =
        i64::try_from(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("now").as_millis())
            .expect("ms");
    let usage = get(format!("/api/v1/usage?from={}&to={now}", now - week)).await;
    let allocations = usage["allocations"].as_array().expect("allocations");
    let idle: Vec<_> = allocations.iter().filter(|a| a["idle"] == true).collect();
    assert_eq!(idle.len(), 1, "one idle allocation under the default threshold and look-back: {idle:?}");
    assert_eq!(idle[0]["tenant"], "vision");
    // vision borrows from llm-serving in the cohort `ml`: 8 compute slices held against a guarantee of 7.
    let cohorts = get("/api/v1/cohorts".into()).await;
    let vision_line = cohorts[0]["members"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["name"] == "vision"))
        .and_then(|m| m["resources"].as_array()?.iter().find(|r| r["resource"] == "compute_slices").cloned())
        .unwrap_or_else(|| panic!("vision in the demo cohort: {cohorts}"));
    assert_eq!((cohorts[0]["name"].clone(), vision_line["guaranteed"].clone()), (json!("ml"), json!(7.0)), "{cohorts}");
    assert!(vision_line["borrowed"].as_f64().is_some_and(|b| b > 0.0), "vision borrows: {vision_line}");
    for tenant in ["vision", "llm-serving"] {
        let released = allocations.iter().filter(|a| a["tenant"] == tenant && a["state"] == "released").count();
        assert!(released >= 20, "{tenant} used {released} slices in the past week");
    }
    let early = allocations.iter().filter_map(|a| a["from_ms"].as_i64()).min().expect("some");
    assert!(early < now - 6 * 24 * 3_600_000, "the history reaches back a week");
    // The last 24 hours of the heatmap are filled for every MIG GPU, minute by minute.
    let heatmap = get(format!("/api/v1/telemetry/heatmap?from={}&to={now}", now - 24 * 3_600_000)).await;
    let rows = heatmap["rows"].as_array().expect("rows");
    let nodes = get("/api/v1/nodes".into()).await;
    let mig: Vec<Value> = nodes
        .as_array()
        .expect("nodes")
        .iter()
        .flat_map(|n| n["gpus"].as_array().expect("gpus").iter())
        .filter(|g| g["mig_enabled"] == true)
        .map(|g| g["uuid"].clone())
        .collect();
    let gpus: Vec<_> = rows.iter().filter(|r| r["kind"] == "gpu" && mig.contains(&r["gpu_uuid"])).collect();
    assert_eq!(gpus.len(), mig.len(), "a row for every MIG GPU");
    for r in &gpus {
        let values = r["values"].as_array().expect("values");
        let filled = values.iter().filter(|v| !v.is_null()).count();
        assert!(filled * 10 >= values.len() * 9, "{} of {} columns of {} filled", filled, values.len(), r["device"]);
    }
}
