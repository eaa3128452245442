//! Single sign-on against a real OpenID provider (`oidc-provider` under Node, `tests/support/oidc`): the whole
//! authorization-code flow over HTTP with a cookie jar, JWT access tokens on the API, and every way a token or a
//! login can be wrong.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::header::{LOCATION, SET_COOKIE};
use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use tessera_server::auth::{AuthConfig, OidcConfig};
use tokio::io::AsyncBufReadExt;

use crate::harness::TestApp;

/// The test provider, running until dropped.
pub struct Idp {
    pub issuer: String,
    keys_file: PathBuf,
    _child: tokio::process::Child,
}

/// Starts the provider with `redirect_uri` registered for the `tessera` client.
pub async fn start_idp(server_base: &str) -> Idp {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/support/oidc");
    assert!(
        dir.join("node_modules/oidc-provider").is_dir(),
        "the test OpenID provider is not installed: run `npm ci --prefix server/tests/support/oidc`"
    );
    let work = std::env::temp_dir().join(format!("tessera-idp-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&work).expect("temp dir");
    let keys_file = work.join("keys.json");
    let config = json!({
        "redirect_uris": [format!("{server_base}/auth/callback")],
        "post_logout_redirect_uris": [format!("{server_base}/")],
        "accounts": {
            "alice": {"email": "alice@example.com", "name": "Alice", "groups": ["tessera:team-a:member"]},
            "root": {"email": "root@example.com", "name": "Root", "groups": ["tessera-admins"]},
        },
        "ci_groups": ["tessera:team-a:member"],
        "keys_file": keys_file,
    });
    let config_file = work.join("config.json");
    std::fs::write(&config_file, config.to_string()).expect("config");
    let log = std::fs::File::create(work.join("provider.log")).expect("log");
    let mut child = tokio::process::Command::new("node")
        .arg(dir.join("provider.mjs"))
        .arg("--config")
        .arg(&config_file)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("start node (is Node.js installed?)");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the provider starts within 30 s")
        .expect("read")
        .unwrap_or_else(|| panic!("the provider exited; see {}", work.join("provider.log").display()));
    let ready: Value = serde_json::from_str(&line).expect("ready line");
    Idp { issuer: ready["issuer"].as_str().expect("issuer").to_string(), keys_file, _child: child }
}

impl Idp {
    /// The provider's current keys, newest first.
    pub fn keys(&self) -> Vec<Value> {
        serde_json::from_str(&std::fs::read_to_string(&self.keys_file).expect("keys")).expect("keys json")
    }

    /// Signs `claims` with the provider's newest key (or key `index`), with `kid` overridable.
    pub fn mint(&self, claims: &Value, kid: Option<&str>) -> String {
        let key = &self.keys()[0];
        let mut header = Header::new(Algorithm::RS256);
        header.kid = Some(kid.unwrap_or(key["kid"].as_str().expect("kid")).to_string());
        header.typ = Some("at+jwt".into());
        let pem = key["private_pem"].as_str().expect("pem");
        jsonwebtoken::encode(&header, claims, &EncodingKey::from_rsa_pem(pem.as_bytes()).expect("key")).expect("sign")
    }

    /// Claims of a valid API access token for `sub` with `groups`.
    pub fn claims(&self, sub: &str, groups: &[&str]) -> Value {
        let now = chrono_now();
        json!({"iss": self.issuer, "sub": sub, "aud": "tessera-api", "iat": now, "exp": now + 600, "groups": groups,
               "preferred_username": sub})
    }

    pub async fn stats(&self) -> Value {
        reqwest::get(format!("{}/__test/stats", self.issuer)).await.expect("stats").json().await.expect("json")
    }

    pub async fn rotate(&self) -> String {
        let r = Client::new().post(format!("{}/__test/rotate", self.issuer)).send().await.expect("rotate");
        r.json::<Value>().await.expect("json")["kid"].as_str().expect("kid").to_string()
    }

    /// A client-credentials access token for the `ci` client.
    pub async fn ci_token(&self) -> String {
        let r = Client::new()
            .post(format!("{}/token", self.issuer))
            .basic_auth("ci", Some("ci-secret"))
            .form(&[("grant_type", "client_credentials"), ("resource", "tessera-api")])
            .send()
            .await
            .expect("token");
        assert_eq!(r.status(), StatusCode::OK);
        r.json::<Value>().await.expect("json")["access_token"].as_str().expect("access token").to_string()
    }
}

fn chrono_now() -> i64 {
    tessera_server::store::now_ms() / 1000
}

/// A server configured against the provider.
pub(crate) struct SsoApp {
    app: TestApp,
    pub idp: Idp,
}

impl std::ops::Deref for SsoApp {
    type Target = TestApp;
    fn deref(&self) -> &TestApp {
        &self.app
    }
}

pub const BOOTSTRAP_PASSWORD: &str = "correct horse battery staple";

/// Starts the provider and a server signed up with it; `tune` adjusts the sign-in settings.
pub(crate) async fn spawn_sso_app(tune: impl FnOnce(&mut AuthConfig)) -> SsoApp {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let idp = start_idp(&base).await;
    let mut auth = AuthConfig {
        oidc: Some(OidcConfig {
            issuer: idp.issuer.clone(),
            client_id: "tessera".into(),
            client_secret: Some("tessera-secret".into()),
            redirect_url: format!("{base}/auth/callback"),
            api_audience: Some("tessera-api".into()),
            admin_groups: vec!["tessera-admins".into()],
            tenant_group_pattern: Some("tessera:{tenant}:{role}".into()),
            jwks_refetch_floor_s: Some(5),
            ..OidcConfig::default()
        }),
        ..AuthConfig::default()
    };
    tune(&mut auth);
    let app = TestApp::sqlite().auth(auth).bootstrap_password(BOOTSTRAP_PASSWORD).listener(listener).start().await;
    let app = SsoApp { app, idp };
    for name in ["team-a", "team-b"] {
        let r = app.call(Method::POST, "/api/v1/tenants", Some(&app.admin)).json(&json!({"name": name})).send().await;
        assert_eq!(r.expect("send").status(), StatusCode::CREATED);
    }
    app
}

/// A browser: cookies kept, redirects not followed (the test follows them).
pub fn browser() -> Client {
    Client::builder().cookie_store(true).redirect(reqwest::redirect::Policy::none()).build().expect("client")
}

fn location(r: &reqwest::Response, base: &str) -> String {
    let l = r.headers().get(LOCATION).expect("Location").to_str().expect("ascii").to_string();
    if l.starts_with('/') { format!("{base}{l}") } else { l }
}

impl SsoApp {
    pub async fn tenant_id(&self, name: &str) -> String {
        let tenants: Value = self
            .call(Method::GET, "/api/v1/tenants", Some(&self.admin))
            .send()
            .await
            .expect("send")
            .json()
            .await
            .expect("json");
        tenants.as_array().expect("list").iter().find(|t| t["name"] == name).expect("tenant")["id"]
            .as_str()
            .expect("id")
            .to_string()
    }

    /// Drives a browser from `/auth/login` through the provider's login form as `login`, up to (not into) the
    /// server's callback; returns the callback URL.
    pub async fn to_callback(&self, browser: &Client, login: &str, return_to: &str) -> String {
        let r = browser.get(format!("{}/auth/login?return_to={return_to}", self.base)).send().await.expect("login");
        assert_eq!(r.status(), StatusCode::SEE_OTHER, "login redirects to the provider");
        let mut url = location(&r, &self.base);
        assert!(url.starts_with(&self.idp.issuer), "to the provider: {url}");
        let query: Vec<(String, String)> = reqwest::Url::parse(&url).expect("url").query_pairs().into_owned().collect();
        let has = |k: &str| query.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(has("code_challenge_method").as_deref(), Some("S256"), "PKCE");
        assert!(has("code_challenge").is_some() && has("state").is_some() && has("nonce").is_some());
        for _ in 0..20 {
            if url.starts_with(&format!("{}/auth/callback", self.base)) {
                return url;
            }
            let r = browser.get(&url).send().await.expect("follow");
            if r.status() == StatusCode::OK {
                // The provider's login form.
                let form = url.clone() + "/login";
                let r = browser.post(&form).form(&[("login", login)]).send().await.expect("login form");
                assert_eq!(r.status(), StatusCode::SEE_OTHER, "the login form accepts {login}");
                url = location(&r, &self.idp.issuer);
                continue;
            }
            assert_eq!(r.status(), StatusCode::SEE_OTHER, "{url} redirects");
            url = location(&r, &self.idp.issuer);
        }
        panic!("the provider never sent the browser back");
    }

    /// Signs a browser in as `login`; returns its CSRF token.
    pub async fn sign_in(&self, browser: &Client, login: &str) -> String {
        let callback = self.to_callback(browser, login, "/dashboard").await;
        let r = browser.get(&callback).send().await.expect("callback");
        assert_eq!(r.status(), StatusCode::SEE_OTHER, "{:?}", r.text().await);
        assert_eq!(r.headers().get(LOCATION).expect("Location"), "/dashboard", "back where the login started");
        let cookies: Vec<String> =
            r.headers().get_all(SET_COOKIE).iter().map(|v| v.to_str().expect("ascii").to_string()).collect();
        let session = cookies.iter().find(|c| c.starts_with("tessera_session=")).expect("session cookie");
        assert!(session.contains("HttpOnly") && session.contains("SameSite=Lax"), "{session}");
        let me: Value =
            browser.get(format!("{}/api/v1/session", self.base)).send().await.expect("me").json().await.expect("json");
        me["csrf_token"].as_str().expect("csrf token").to_string()
    }
}

fn session_cookie(r: &reqwest::Response) -> String {
    r.headers()
        .get_all(SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|c| c.strip_prefix("tessera_session="))
        .and_then(|c| c.split(';').next())
        .expect("session cookie")
        .to_string()
}

fn code_of(body: &Value) -> &str {
    body["code"].as_str().unwrap_or("")
}

#[tokio::test]
async fn the_code_flow_signs_in_maps_groups_calls_the_api_and_signs_out() {
    let app = spawn_sso_app(|_| {}).await;
    let team_a = app.tenant_id("team-a").await;
    let alice = browser();
    let csrf = app.sign_in(&alice, "alice").await;

    let me: Value =
        alice.get(format!("{}/api/v1/session", app.base)).send().await.expect("me").json().await.expect("json");
    assert_eq!(me["user"]["name"], "alice");
    assert_eq!(me["method"], "session");
    assert_eq!(me["single_sign_on"], true, "alice has no local password: {me}");
    assert_eq!(me["user"]["platform_admin"], false);
    assert_eq!(me["memberships"], json!([{"tenant": team_a, "role": "member"}]), "groups claim -> membership");

    // A state change with the cookie needs the CSRF token.
    let ask =
        json!({"tenant": team_a, "spec": {"mode": "mig", "profile": "1g.10gb", "model": "H100-80GB"}, "count": 1});
    let r = alice.post(format!("{}/api/v1/requests", app.base)).json(&ask).send().await.expect("send");
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert_eq!(code_of(&r.json().await.expect("json")), "csrf_failed");
    let r = alice
        .post(format!("{}/api/v1/requests", app.base))
        .header("x-csrf-token", "not-the-token")
        .json(&ask)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::FORBIDDEN, "a wrong token is no token");
    let r = alice
        .post(format!("{}/api/v1/requests", app.base))
        .header("x-csrf-token", &csrf)
        .json(&ask)
        .send()
        .await
        .expect("send");
    assert!(r.status().is_success(), "{:?}", r.text().await);
    // Reads need no token; the tenant's requests are visible, the other tenant's are not.
    let team_b = app.tenant_id("team-b").await;
    let r = alice.get(format!("{}/api/v1/requests?tenant={team_b}", app.base)).send().await.expect("send");
    assert_eq!(r.status(), StatusCode::NOT_FOUND);

    // Sessions live in the database: a session id that is not there is not a session.
    let forged = browser();
    let r = forged
        .get(format!("{}/api/v1/session", app.base))
        .header("cookie", "tessera_session=made-up")
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);

    // Sign out: needs the CSRF token, ends the session here, and sends the browser to the provider's logout.
    let r = alice.post(format!("{}/auth/logout", app.base)).send().await.expect("send");
    assert_eq!(r.status(), StatusCode::FORBIDDEN, "logout is a state change too");
    let r = alice.post(format!("{}/auth/logout", app.base)).header("x-csrf-token", &csrf).send().await.expect("send");
    assert_eq!(r.status(), StatusCode::OK);
    let out: Value = r.json().await.expect("json");
    let end = reqwest::Url::parse(out["redirect_to"].as_str().expect("redirect")).expect("url");
    assert!(end.as_str().starts_with(&format!("{}/session/end", app.idp.issuer)), "RP-initiated logout: {end}");
    let params: std::collections::HashMap<String, String> = end.query_pairs().into_owned().collect();
    assert!(params.contains_key("id_token_hint"));
    assert_eq!(params.get("post_logout_redirect_uri").map(String::as_str), Some(format!("{}/", app.base).as_str()));
    let r = alice.get(end.as_str()).send().await.expect("provider logout");
    assert_eq!(r.status(), StatusCode::OK, "the provider accepts the logout request");
    let r = alice.get(format!("{}/api/v1/session", app.base)).send().await.expect("send");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "signed out");
}

#[tokio::test]
async fn logins_cannot_be_replayed_moved_between_browsers_or_redeemed_without_pkce() {
    let app = spawn_sso_app(|_| {}).await;

    // A code intercepted on its way back is useless without the PKCE verifier, which only the server holds.
    let browser_a = browser();
    let callback = app.to_callback(&browser_a, "alice", "/").await;
    let url = reqwest::Url::parse(&callback).expect("url");
    let params: std::collections::HashMap<String, String> = url.query_pairs().into_owned().collect();
    let r = Client::new()
        .post(format!("{}/token", app.idp.issuer))
        .basic_auth("tessera", Some("tessera-secret"))
        .form(&[
            ("grant_type", "authorization_code"),
            ("code", &params["code"]),
            ("redirect_uri", &format!("{}/auth/callback", app.base)),
        ])
        .send()
        .await
        .expect("token");
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(r.json::<Value>().await.expect("json")["error"], "invalid_grant", "missing verifier");

    // The callback in another browser (no login cookie) is refused.
    let r = browser().get(&callback).send().await.expect("send");
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(code_of(&r.json().await.expect("json")), "login_state_mismatch");
    // Whoever sees the callback URL (a proxy log, a pasted link) cannot forge the browser's login cookie from it.
    for guess in [params["state"].as_str(), params["code"].as_str(), "x"] {
        let r =
            Client::new().get(&callback).header("cookie", format!("tessera_login={guess}")).send().await.expect("send");
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        assert_eq!(code_of(&r.json().await.expect("json")), "login_state_unknown");
    }

    // The right browser signs in (the attempts above did not use up its login).
    let r = browser_a.get(&callback).send().await.expect("send");
    assert_eq!(r.status(), StatusCode::SEE_OTHER);

    // Replaying the same callback is refused: a login is used once.
    let r = browser_a.get(&callback).send().await.expect("send");
    assert_eq!(r.status(), StatusCode::BAD_REQUEST, "the login cookie was cleared");
    let login_cookie = "tessera_login=whatever";
    let r = Client::new().get(&callback).header("cookie", login_cookie).send().await.expect("send");
    assert_eq!(code_of(&r.json().await.expect("json")), "login_state_unknown");

    // The provider's refusal is reported, not a crash.
    let r = browser_a
        .get(format!("{}/auth/callback?error=access_denied&error_description=nope&state=x", app.base))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(code_of(&r.json().await.expect("json")), "sign_in_refused");

    // Only local paths are return targets (the unit test of `local_path` covers the spellings).
    let r2 = app.to_callback(&browser_a, "alice", "https://evil.example.com/").await;
    let r = browser_a.get(&r2).send().await.expect("send");
    assert_eq!(r.headers().get(LOCATION).expect("Location"), "/", "never an open redirect");
}

#[tokio::test]
async fn bad_access_tokens_are_refused_with_their_reason() {
    let app = spawn_sso_app(|_| {}).await;
    let idp = &app.idp;
    let call = |token: String| {
        let request = app.call(Method::GET, "/api/v1/session", Some(&token));
        async move {
            let r = request.send().await.expect("send");
            let status = r.status();
            let challenge = r.headers().get("www-authenticate").map(|v| v.to_str().unwrap_or("").to_string());
            let body: Value = r.json().await.unwrap_or(Value::Null);
            (status, code_of(&body).to_string(), challenge)
        }
    };
    // A real client-credentials token from the provider works and maps its groups.
    let ci = idp.ci_token().await;
    let r = app.call(Method::GET, "/api/v1/session", Some(&ci)).send().await.expect("send");
    assert_eq!(r.status(), StatusCode::OK);
    let me: Value = r.json().await.expect("json");
    assert_eq!(me["user"]["name"], "ci");
    assert_eq!(me["memberships"][0]["role"], "member");
    assert_eq!(me["method"], "token");

    let now = chrono_now();
    let good = idp.claims("carol", &[]);
    let with = |patch: Value| {
        let mut c = good.clone();
        c.as_object_mut().expect("object").extend(patch.as_object().cloned().unwrap_or_default());
        c
    };
    let (status, code, challenge) = call(idp.mint(&good, None)).await;
    assert_eq!((status, code.as_str()), (StatusCode::OK, ""), "a well-formed minted token passes");
    assert_eq!(challenge, None);

    let cases = [
        ("expired", idp.mint(&with(json!({"exp": now - 3600, "iat": now - 4000})), None), "token_expired"),
        ("not yet valid", idp.mint(&with(json!({"nbf": now + 3600})), None), "token_not_yet_valid"),
        ("wrong audience", idp.mint(&with(json!({"aud": "someone-else"})), None), "token_wrong_audience"),
        ("wrong issuer", idp.mint(&with(json!({"iss": "https://evil.example.com"})), None), "token_wrong_issuer"),
        (
            "no subject",
            idp.mint(&json!({"iss": idp.issuer, "aud": "tessera-api", "exp": now + 60}), None),
            "token_missing_claim",
        ),
    ];
    for (what, token, expected) in cases {
        let (status, code, challenge) = call(token).await;
        assert_eq!((status, code.as_str()), (StatusCode::UNAUTHORIZED, expected), "{what}");
        assert!(challenge.is_some_and(|c| c.contains("invalid_token")), "{what}: WWW-Authenticate");
    }

    // Tampered: another payload under the original signature.
    let token = idp.mint(&good, None);
    let parts: Vec<&str> = token.split('.').collect();
    let b64 = |v: &Value| {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    let tampered = format!("{}.{}.{}", parts[0], b64(&with(json!({"groups": ["tessera-admins"]}))), parts[2]);
    assert_eq!(call(tampered).await.1, "token_bad_signature");

    // `alg: none`.
    let none = format!("{}.{}.", b64(&json!({"alg": "none", "typ": "at+jwt"})), b64(&good));
    assert_eq!(call(none).await.1, "token_algorithm_not_allowed");

    // HS256 keyed with the provider's public key (the classic confusion attack).
    let key = &idp.keys()[0];
    let mut header = Header::new(Algorithm::HS256);
    header.kid = key["kid"].as_str().map(str::to_string);
    let public = key["public_pem"].as_str().expect("public pem");
    let hs = jsonwebtoken::encode(&header, &good, &EncodingKey::from_secret(public.as_bytes())).expect("sign");
    assert_eq!(call(hs).await.1, "token_algorithm_not_allowed");

    // An ID token is not an access token: the audience is the client, not the API.
    let id_like = idp.mint(&with(json!({"aud": "tessera", "nonce": "n"})), None);
    assert_eq!(call(id_like).await.1, "token_wrong_audience");
}

#[tokio::test]
async fn id_tokens_never_work_on_the_api_even_when_the_api_audience_is_the_client() {
    // Dex-style: access tokens carry the client id as audience, like ID tokens do.
    let app = spawn_sso_app(|a| a.oidc.as_mut().expect("oidc").api_audience = None).await;
    let idp = &app.idp;
    let now = chrono_now();
    let base = json!({"iss": idp.issuer, "sub": "frank", "aud": "tessera", "iat": now, "exp": now + 600,
                      "groups": ["tessera:team-a:member"]});
    let call = |claims: Value| {
        let request = app.call(Method::GET, "/api/v1/session", Some(&idp.mint(&claims, None)));
        async move { request.send().await.expect("send").status() }
    };
    assert_eq!(call(base.clone()).await, StatusCode::OK, "an access token for the client id");
    for claim in ["nonce", "at_hash", "c_hash"] {
        let mut id_token = base.clone();
        id_token[claim] = json!("x");
        assert_eq!(call(id_token).await, StatusCode::UNAUTHORIZED, "{claim}: an ID token");
    }
    // A real ID token from a browser sign-in is refused on the API.
    let b = browser();
    let callback = app.to_callback(&b, "alice", "/").await;
    let r = b.get(&callback).send().await.expect("callback");
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let csrf = b
        .get(format!("{}/api/v1/session", app.base))
        .send()
        .await
        .expect("me")
        .json::<Value>()
        .await
        .expect("json")["csrf_token"]
        .as_str()
        .expect("csrf")
        .to_string();
    let out: Value = b
        .post(format!("{}/auth/logout", app.base))
        .header("x-csrf-token", csrf)
        .send()
        .await
        .expect("logout")
        .json()
        .await
        .expect("json");
    let end = reqwest::Url::parse(out["redirect_to"].as_str().expect("redirect")).expect("url");
    let hint = end.query_pairs().find(|(k, _)| k == "id_token_hint").expect("hint").1.to_string();
    let r = app.call(Method::GET, "/api/v1/session", Some(&hint)).send().await.expect("send");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "the logout hint is no API credential");
}

#[tokio::test]
async fn key_rotation_is_followed_and_unknown_key_ids_refetch_no_more_than_the_floor() {
    let app = spawn_sso_app(|_| {}).await;
    let idp = &app.idp;
    let me = |token: String| {
        let request = app.call(Method::GET, "/api/v1/session", Some(&token));
        async move {
            let r = request.send().await.expect("send");
            let status = r.status();
            (status, code_of(&r.json().await.unwrap_or(Value::Null)).to_string())
        }
    };
    let jwks = || async { idp.stats().await["jwks_requests"].as_u64().expect("count") };
    assert_eq!(me(idp.mint(&idp.claims("dave", &[]), None)).await.0, StatusCode::OK);
    let fetched = jwks().await;
    assert_eq!(fetched, 1, "the keys are fetched once");

    // Unknown key ids within the floor: refused without asking the provider again.
    for _ in 0..5 {
        assert_eq!(me(idp.mint(&idp.claims("dave", &[]), Some("no-such-key"))).await.1, "token_unknown_key");
    }
    assert_eq!(jwks().await, fetched, "no refetch within the floor");

    // The provider rotates; a token with the new key within the floor is refused, after the floor it is accepted
    // after exactly one refetch.
    let new_kid = idp.rotate().await;
    let rotated = idp.mint(&idp.claims("dave", &[]), None);
    assert_eq!(me(rotated.clone()).await.1, "token_unknown_key");
    tokio::time::sleep(Duration::from_millis(5200)).await;
    assert_eq!(me(rotated).await.0, StatusCode::OK, "new key {new_kid} found after a refetch");
    assert_eq!(jwks().await, fetched + 1);
    // The old key is still published and still verifies; garbage key ids right after the refetch cost nothing.
    let old = idp.keys()[1].clone();
    assert_ne!(old["kid"], new_kid);
    assert_eq!(me(idp.mint(&idp.claims("dave", &[]), Some("another-unknown"))).await.1, "token_unknown_key");
    assert_eq!(jwks().await, fetched + 1);
}

#[tokio::test]
async fn the_mapping_is_re_evaluated_at_each_sign_in_and_leaves_hand_set_memberships_alone() {
    let app = spawn_sso_app(|_| {}).await;
    let idp = &app.idp;
    let (team_a, team_b) = (app.tenant_id("team-a").await, app.tenant_id("team-b").await);
    let me = |groups: &[&str]| {
        let token = idp.mint(&idp.claims("erin", groups), None);
        let request = app.call(Method::GET, "/api/v1/session", Some(&token));
        async move { request.send().await.expect("send").json::<Value>().await.expect("json") }
    };
    let first = me(&["tessera:team-a:admin", "tessera-admins"]).await;
    assert_eq!(first["user"]["platform_admin"], true);
    assert_eq!(first["memberships"], json!([{"tenant": team_a, "role": "tenant-admin"}]));
    let user_id = first["user"]["id"].as_str().expect("id").to_string();

    // A platform admin adds erin to team-b by hand.
    let r = app
        .call(Method::PUT, &format!("/api/v1/tenants/{team_b}/members/{user_id}"), Some(&app.admin))
        .json(&json!({"role": "member"}))
        .send()
        .await
        .expect("send");
    assert!(r.status().is_success());

    // Groups change at the provider: demoted, no longer an admin, and the hand-set membership stays.
    let later = me(&["tessera:team-a:member"]).await;
    assert_eq!(later["user"]["id"], user_id.as_str(), "same user (by issuer and subject)");
    assert_eq!(later["user"]["platform_admin"], false);
    let mut memberships = later["memberships"].as_array().expect("list").clone();
    memberships.sort_by_key(|m| m["tenant"].as_str().unwrap_or("").to_string());
    let mut expected = vec![json!({"tenant": team_a, "role": "member"}), json!({"tenant": team_b, "role": "member"})];
    expected.sort_by_key(|m| m["tenant"].as_str().unwrap_or("").to_string());
    assert_eq!(memberships, expected);
    // Every change is in the audit log.
    let history = |object: String| {
        let request = app.call(Method::GET, &format!("/api/v1/audit?object={object}"), Some(&app.admin));
        async move {
            let entries: Value = request.send().await.expect("send").json().await.expect("json");
            entries
                .as_array()
                .expect("list")
                .iter()
                .map(|e| (e["actor"].clone(), e["action"].clone()))
                .collect::<Vec<_>>()
        }
    };
    let actor = json!(format!("sso:{}", idp.issuer));
    assert_eq!(
        history(format!("user/{user_id}")).await,
        vec![(actor.clone(), json!("user.create")), (actor.clone(), json!("user.platform-admin"))]
    );
    assert_eq!(
        history(format!("tenant/{team_a}/member/{user_id}")).await,
        vec![(actor.clone(), json!("membership.set")), (actor, json!("membership.set"))],
        "granted as admin, then demoted"
    );

    // An identity never takes over a local user of the same name.
    let r = me(&[]).await;
    assert_eq!(r["user"]["name"], "erin");
    let token = idp.mint(&idp.claims("admin", &[]), None);
    let r: Value =
        app.call(Method::GET, "/api/v1/session", Some(&token)).send().await.expect("send").json().await.expect("json");
    assert_ne!(r["user"]["name"], "admin");
    assert_eq!(r["user"]["platform_admin"], false);
    assert!(r["user"]["name"].as_str().expect("name").starts_with("admin~"));
}

#[tokio::test]
async fn local_accounts_sign_in_with_argon2_passwords_are_throttled_and_can_be_turned_off() {
    let app = spawn_sso_app(|_| {}).await;
    let b = browser();
    let r = b
        .post(format!("{}/auth/local", app.base))
        .json(&json!({"name": "admin", "password": BOOTSTRAP_PASSWORD}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::OK);
    let first_cookie = session_cookie(&r);
    let me: Value = r.json().await.expect("json");
    assert_eq!(me["user"]["platform_admin"], true);
    // Signing in again in the same browser replaces the session: the old id is dead (no fixation).
    let r = b
        .post(format!("{}/auth/local", app.base))
        .json(&json!({"name": "admin", "password": BOOTSTRAP_PASSWORD}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::OK);
    assert_ne!(session_cookie(&r), first_cookie);
    let me: Value = r.json().await.expect("json");
    let r = Client::new()
        .get(format!("{}/api/v1/session", app.base))
        .header("cookie", format!("tessera_session={first_cookie}"))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "the replaced session is gone");
    let csrf = me["csrf_token"].as_str().expect("csrf").to_string();
    let r = b
        .post(format!("{}/api/v1/tenants", app.base))
        .header("x-csrf-token", &csrf)
        .json(&json!({"name": "team-c"}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::CREATED);
    // A form post from another site cannot sign anybody in (JSON only).
    let r = browser()
        .post(format!("{}/auth/local", app.base))
        .form(&[("name", "admin"), ("password", BOOTSTRAP_PASSWORD)])
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);

    for _ in 0..tessera_server::auth::MAX_FAILURES {
        let r = browser()
            .post(format!("{}/auth/local", app.base))
            .json(&json!({"name": "admin", "password": "wrong wrong wrong"}))
            .send()
            .await
            .expect("send");
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(code_of(&r.json().await.expect("json")), "bad_credentials");
    }
    let r = browser()
        .post(format!("{}/auth/local", app.base))
        .json(&json!({"name": "admin", "password": BOOTSTRAP_PASSWORD}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "locked out for a while, even with the right password");
    let r = browser()
        .post(format!("{}/auth/local", app.base))
        .json(&json!({"name": "nobody", "password": "whatever whatever"}))
        .send()
        .await
        .expect("send");
    assert_eq!(code_of(&r.json().await.expect("json")), "bad_credentials", "unknown users look like wrong passwords");

    let off = spawn_sso_app(|a| a.local_accounts = Some(false)).await;
    let r = browser()
        .post(format!("{}/auth/local", off.base))
        .json(&json!({"name": "admin", "password": BOOTSTRAP_PASSWORD}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert_eq!(code_of(&r.json().await.expect("json")), "local_accounts_disabled");
    let methods: Value =
        reqwest::get(format!("{}/auth/methods", off.base)).await.expect("send").json().await.expect("json");
    assert_eq!(methods, json!({"sso": true, "sso_name": "Single sign-on", "local": false}));
}

#[tokio::test]
async fn an_unreachable_provider_is_a_clear_503_not_a_hang() {
    // Port 9 (discard) on loopback: nothing listens.
    let auth = AuthConfig {
        oidc: Some(OidcConfig {
            issuer: "http://127.0.0.1:9".into(),
            client_id: "tessera".into(),
            redirect_url: "http://127.0.0.1:1/auth/callback".into(),
            ..OidcConfig::default()
        }),
        ..AuthConfig::default()
    };
    let app = TestApp::sqlite().bare().auth(auth).start().await;
    let base = &app.base;
    for _ in 0..2 {
        let r = browser().get(format!("{base}/auth/login")).send().await.expect("send");
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body: Value = r.json().await.expect("json");
        assert!(body["detail"].as_str().is_some_and(|d| d.contains("identity provider")), "{body}");
    }
    let jwt = "eyJhbGciOiJSUzI1NiIsImtpZCI6ImsifQ.eyJzdWIiOiJ4In0.c2ln";
    let r = Client::new().get(format!("{base}/api/v1/session")).bearer_auth(jwt).send().await.expect("send");
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE, "a token cannot be checked while the provider is away");
}

#[tokio::test]
async fn sessions_end_at_their_absolute_and_idle_expiry() {
    use tessera_server::http::auth::token_hash;
    use tessera_server::store::auth::SessionRecord;
    let app = spawn_sso_app(|a| a.session_idle_minutes = Some(30)).await;
    let admin_id = app
        .call(Method::GET, "/api/v1/session", Some(&app.admin))
        .send()
        .await
        .expect("send")
        .json::<Value>()
        .await
        .expect("json")["user"]["id"]
        .as_str()
        .expect("id")
        .to_string();
    let now = tessera_server::store::now_ms();
    let session = |created: i64, seen: i64, expires: i64| SessionRecord {
        user_id: admin_id.clone(),
        csrf_token: "c".into(),
        id_token: None,
        created_at_ms: created,
        last_seen_at_ms: seen,
        expires_at_ms: expires,
    };
    let cases = [
        ("fresh", session(now - 1_000, now - 1_000, now + 3_600_000), StatusCode::OK),
        ("seen 20 min ago", session(now - 1_200_000, now - 1_200_000, now + 3_600_000), StatusCode::OK),
        ("idle 31 min", session(now - 1_860_000, now - 1_860_000, now + 3_600_000), StatusCode::UNAUTHORIZED),
        ("past absolute expiry", session(now - 90_000_000, now - 1_000, now - 1), StatusCode::UNAUTHORIZED),
    ];
    for (what, record, expected) in cases {
        let id = format!("s-{}", uuid::Uuid::now_v7().simple());
        app.store.create_session(&token_hash(&id), &record).await.expect("session");
        let r = Client::new()
            .get(format!("{}/api/v1/session", app.base))
            .header("cookie", format!("tessera_session={id}"))
            .send()
            .await
            .expect("send");
        assert_eq!(r.status(), expected, "{what}");
        if expected == StatusCode::UNAUTHORIZED {
            assert_eq!(code_of(&r.json().await.expect("json")), "session_expired", "{what}");
            assert_eq!(app.store.session(&token_hash(&id)).await.expect("read"), None, "{what}: deleted");
        }
    }
    // A session used after 20 minutes has its last use written (idle expiry counts from there).
    let id = "s-touched";
    app.store
        .create_session(&token_hash(id), &session(now - 1_200_000, now - 1_200_000, now + 3_600_000))
        .await
        .expect("session");
    let r = Client::new()
        .get(format!("{}/api/v1/session", app.base))
        .header("cookie", format!("tessera_session={id}"))
        .send();
    assert_eq!(r.await.expect("send").status(), StatusCode::OK);
    let seen = app.store.session(&token_hash(id)).await.expect("read").expect("live").last_seen_at_ms;
    assert!(seen >= now, "touched");
}
