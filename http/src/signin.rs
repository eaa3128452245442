//! Signing in and out (the `auth` tag): the OpenID Connect code flow (`/auth/login` -> provider ->
//! `/auth/callback`), local passwords (`/auth/local`), one-time sign-in links (`/auth/link`), the current session,
//! and logout (RP-initiated at the provider when it offers it).

use crate::auth::Caller;
use axum::extract::State;
use axum::http::header::{AUTHORIZATION, LOCATION, SET_COOKIE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::auth::{CSRF_COOKIE, SESSION_COOKIE, cookie, set_cookie, token_hash};
use super::error::{ApiError, ApiJson, ApiQuery, Problem};
use tessera_services::app::{AppState, Resolved};
use tessera_services::auth::oidc::{TokenError, random_secret};
use tessera_services::auth::{decoy_hash, verify_password};
use tessera_store::auth::{LoginAttempt, SessionRecord};
use tessera_store::{Principal, now_ms};

/// The cookie binding a login in flight to the browser that started it.
pub const LOGIN_COOKIE: &str = "tessera_login";
pub use tessera_api::signin::{
    CallbackQuery, LinkQuery, LocalSignIn, LoginQuery, MembershipView, SessionView, SignInLink, SignInMethods,
    SignedOut,
};
pub use tessera_services::auth::LOGIN_TTL_MS;

/// How one may sign in here.
#[utoipa::path(get, path = "/auth/methods", tag = "auth", security(()),
    responses((status = 200, body = SignInMethods)))]
pub async fn methods(State(state): State<AppState>) -> ApiJson<SignInMethods> {
    ApiJson(SignInMethods {
        sso: state.auth.sso.is_some(),
        sso_name: state.auth.sso.as_ref().map(|s| s.display_name.clone()),
        local: state.auth.local_accounts,
    })
}

/// Only local paths: never an open redirect.
pub fn local_path(path: Option<&str>) -> String {
    match path {
        Some(p)
            if p.starts_with('/')
                && !p.starts_with("//")
                && !p.contains('\\')
                && p.len() <= 2000
                && p.bytes().all(|b| b.is_ascii_graphic()) =>
        {
            p.to_string()
        }
        _ => "/".to_string(),
    }
}

fn sso_of(state: &AppState) -> Result<&tessera_services::auth::Sso, ApiError> {
    state.auth.sso.as_ref().ok_or_else(|| ApiError::NotFound("single sign-on is not configured".into()))
}

fn provider_error(e: TokenError) -> ApiError {
    match e {
        TokenError::Provider(detail) => {
            ApiError::Unavailable(format!("the identity provider is unavailable: {detail}"))
        }
        other => ApiError::unauthorized(other.code(), other.to_string()),
    }
}

/// Start single sign-on: redirects the browser to the identity provider (authorization code flow with PKCE).
#[utoipa::path(get, path = "/auth/login", tag = "auth", security(()), params(LoginQuery),
    responses((status = 303, description = "To the identity provider"), (status = 404, body = Problem),
        (status = 503, body = Problem)))]
pub async fn login(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<LoginQuery>,
) -> Result<Response, ApiError> {
    let sso = sso_of(&state)?;
    let (login_state, nonce, verifier, browser) = (random_secret(), random_secret(), random_secret(), random_secret());
    let url = sso.provider.authorization_url(&login_state, &nonce, &verifier).await.map_err(provider_error)?;
    state
        .store
        .create_login_attempt(&LoginAttempt {
            state_sha256: token_hash(&login_state),
            browser_sha256: token_hash(&browser),
            nonce,
            pkce_verifier: verifier,
            return_to: local_path(q.return_to.as_deref()),
            created_at_ms: now_ms(),
        })
        .await?;
    let bind = set_cookie(LOGIN_COOKIE, &browser, LOGIN_TTL_MS / 1000, true, secure(&state, &headers));
    let mut response = StatusCode::SEE_OTHER.into_response();
    let out = response.headers_mut();
    out.insert(LOCATION, header_value(&url)?);
    out.append(SET_COOKIE, header_value(&bind)?);
    Ok(response)
}

fn header_value(text: &str) -> Result<HeaderValue, ApiError> {
    HeaderValue::from_str(text).map_err(|e| ApiError::Internal(format!("header value: {e}")))
}

fn bad_login(code: &'static str, detail: impl Into<String>) -> ApiError {
    ApiError::Invalid { status: StatusCode::BAD_REQUEST, code, detail: detail.into() }
}

/// Finish single sign-on: checks `state` against this browser's login, exchanges the code with the PKCE verifier,
/// validates the ID token (signature, issuer, audience, expiry, nonce), maps its claims to memberships, starts a
/// session and redirects to where the login started.
#[utoipa::path(get, path = "/auth/callback", tag = "auth", security(()), params(CallbackQuery),
    responses((status = 303, description = "Signed in; the session cookie is set"),
        (status = 400, body = Problem), (status = 401, body = Problem),
        (status = 404, body = Problem, description = "single sign-on is not configured"),
        (status = 503, body = Problem)))]
pub async fn callback(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<CallbackQuery>,
) -> Result<Response, ApiError> {
    let sso = sso_of(&state)?;
    if let Some(error) = &q.error {
        let description: String = q.error_description.as_deref().unwrap_or("").chars().take(300).collect();
        return Err(ApiError::unauthorized(
            "sign_in_refused",
            format!("the identity provider said {error}: {description}"),
        ));
    }
    let login_state =
        q.state.as_deref().filter(|s| !s.is_empty()).ok_or_else(|| bad_login("login_state_missing", "no `state`"))?;
    let Some(browser) = cookie(&headers, LOGIN_COOKIE).filter(|c| !c.is_empty()) else {
        return Err(bad_login("login_state_mismatch", "this login was not started by this browser; sign in again"));
    };
    let attempt = state
        .store
        .take_login_attempt(&token_hash(login_state), &token_hash(&browser))
        .await?
        .filter(|a| now_ms() - a.created_at_ms < LOGIN_TTL_MS)
        .ok_or_else(|| {
            bad_login(
                "login_state_unknown",
                "this login was already used, has expired or was started in another browser; sign in again",
            )
        })?;
    if let Some(iss) = &q.iss
        && iss != &sso.provider.settings().issuer
    {
        return Err(ApiError::unauthorized("token_wrong_issuer", "the answer comes from another provider"));
    }
    let code = q.code.as_deref().filter(|c| !c.is_empty()).ok_or_else(|| bad_login("code_missing", "no `code`"))?;
    let tokens = sso.provider.exchange_code(code, &attempt.pkce_verifier).await.map_err(provider_error)?;
    let id_token =
        tokens.id_token.ok_or_else(|| ApiError::unauthorized("token_missing", "the provider sent no ID token"))?;
    let mut claims = sso.provider.validate_id_token(&id_token, &attempt.nonce).await.map_err(provider_error)?;
    // Some providers put groups only in userinfo.
    if !claims.contains_key(&sso.mapping.groups_claim)
        && let Some(access) = &tokens.access_token
        && let Ok(Some(info)) = sso.provider.userinfo(access).await
        && info.get("sub") == claims.get("sub")
    {
        for (k, v) in info {
            claims.entry(k).or_insert(v);
        }
    }
    let identity = sso.mapping.identity(&claims).map_err(|e| ApiError::unauthorized("token_claims", e.to_string()))?;
    let signed_in = state.store.sso_sign_in(&identity).await?;
    if !signed_in.unknown_tenants.is_empty() {
        tracing::warn!(user = %signed_in.principal.user.name, tenants = ?signed_in.unknown_tenants,
            "groups map to tenants that do not exist");
    }
    end_previous_session(&state, &headers).await?;
    let (cookies, _) = start_session(&state, &headers, &signed_in.principal.user.id, Some(id_token)).await?;
    let mut response = StatusCode::SEE_OTHER.into_response();
    let h = response.headers_mut();
    h.insert(LOCATION, header_value(&attempt.return_to)?);
    for c in cookies {
        h.append(SET_COOKIE, header_value(&c)?);
    }
    h.append(SET_COOKIE, header_value(&set_cookie(LOGIN_COOKIE, "", 0, true, secure(&state, &headers)))?);
    Ok(response)
}

/// Whether cookies get `Secure`: configured so (the default behind an https redirect URL), or the request came
/// through a proxy that terminated https (`X-Forwarded-Proto: https`).
fn secure(state: &AppState, headers: &HeaderMap) -> bool {
    state.auth.secure_cookies
        || headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|p| p.eq_ignore_ascii_case("https"))
}

/// Ends the session the browser brought along, if any: a sign-in always starts a fresh session id (no fixation).
async fn end_previous_session(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    if let Some(id) = cookie(headers, SESSION_COOKIE).filter(|c| !c.is_empty()) {
        let hash = token_hash(&id);
        state.principals.remove(&format!("session:{hash}"));
        state.store.delete_session(&hash).await?;
    }
    Ok(())
}

/// Starts a session; returns its cookies and record.
async fn start_session(
    state: &AppState,
    headers: &HeaderMap,
    user_id: &str,
    id_token: Option<String>,
) -> Result<(Vec<String>, SessionRecord), ApiError> {
    let id = random_secret();
    let now = now_ms();
    let absolute_ms = state.auth.session_absolute.as_millis() as i64;
    let record = SessionRecord {
        user_id: user_id.to_string(),
        csrf_token: random_secret(),
        id_token,
        created_at_ms: now,
        last_seen_at_ms: now,
        expires_at_ms: now + absolute_ms,
    };
    state.store.create_session(&token_hash(&id), &record).await?;
    let secure = secure(state, headers);
    let max_age = absolute_ms / 1000;
    let cookies = vec![
        set_cookie(SESSION_COOKIE, &id, max_age, true, secure),
        set_cookie(CSRF_COOKIE, &record.csrf_token, max_age, false, secure),
    ];
    Ok((cookies, record))
}

async fn session_view(
    state: &AppState,
    p: Principal,
    session: Option<&SessionRecord>,
) -> Result<SessionView, ApiError> {
    let single_sign_on = state.store.is_sso_user(&p.user.id).await?;
    Ok(SessionView {
        single_sign_on,
        memberships: p.memberships.iter().map(|(t, r)| MembershipView { tenant: t.clone(), role: *r }).collect(),
        user: p.user.into(),
        method: if session.is_some() { "session" } else { "token" }.to_string(),
        csrf_token: session.map(|s| s.csrf_token.clone()),
        expires_at_ms: session.map(|s| s.expires_at_ms),
    })
}

/// Sign in with a local user name and password (when local accounts are on); starts a session.
#[utoipa::path(post, path = "/auth/local", tag = "auth", security(()), request_body = LocalSignIn,
    responses((status = 200, body = SessionView, description = "Signed in; the session cookie is set"),
        (status = 401, body = Problem), (status = 403, body = Problem), (status = 429, body = Problem)))]
pub async fn local(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<LocalSignIn>,
) -> Result<Response, ApiError> {
    if !state.auth.local_accounts {
        return Err(ApiError::forbidden(
            "local_accounts_disabled",
            "local accounts are turned off; use single sign-on",
        ));
    }
    if !state.auth.begin_password_attempt(&body.name) {
        return Err(ApiError::Invalid {
            status: StatusCode::TOO_MANY_REQUESTS,
            code: "too_many_attempts",
            detail: "too many failed sign-ins for this user; wait a few minutes".into(),
        });
    }
    let found = state.store.password_hash(&body.name).await?;
    let hash = found.as_ref().map_or_else(|| decoy_hash().to_string(), |(_, h)| h.clone());
    let password = body.password.clone();
    let matches = {
        let _slot = state.auth.password_slots.acquire().await.map_err(|e| ApiError::Internal(e.to_string()))?;
        tokio::task::spawn_blocking(move || verify_password(&password, &hash))
            .await
            .map_err(|e| ApiError::Internal(e.to_string()))?
    };
    let user_id = match (found, matches) {
        (Some((id, _)), true) => id,
        _ => return Err(ApiError::unauthorized("bad_credentials", "wrong user name or password")),
    };
    state.auth.password_succeeded(&body.name);
    end_previous_session(&state, &headers).await?;
    let (cookies, record) = start_session(&state, &headers, &user_id, None).await?;
    let principal = state.store.principal(&user_id).await?;
    let mut response = ApiJson(session_view(&state, principal, Some(&record)).await?).into_response();
    for c in cookies {
        response.headers_mut().append(SET_COOKIE, header_value(&c)?);
    }
    Ok(response)
}

/// Sign in with a one-time link (`tessera serve` prints one for the bootstrap admin; platform admins issue them
/// for users without a password). The link is used up by this call, whatever happens next.
#[utoipa::path(get, path = "/auth/link", tag = "auth", security(()), params(LinkQuery),
    responses((status = 303, description = "Signed in: the session cookie is set and the browser goes to the \
        portal (`/`). An unknown, used or expired link goes to the sign-in page (`/signin?link=invalid`) instead, \
        with no cookie."),
        (status = 400, body = Problem, description = "invalid_query: no `token`, or one over 128 characters"),
        (status = 403, body = Problem, description = "local_accounts_disabled")))]
pub async fn link(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<LinkQuery>,
) -> Result<Response, ApiError> {
    if !state.auth.local_accounts {
        return Err(ApiError::forbidden(
            "local_accounts_disabled",
            "local accounts are turned off; use single sign-on",
        ));
    }
    if q.token.chars().count() > tessera_services::auth::links::MAX_LINK_SECRET {
        return Err(ApiError::Invalid {
            status: StatusCode::BAD_REQUEST,
            code: "invalid_query",
            detail: format!("token: at most {} characters", tessera_services::auth::links::MAX_LINK_SECRET),
        });
    }
    let mut response = StatusCode::SEE_OTHER.into_response();
    let Some(user_id) = tessera_services::auth::links::take(&state.store, &q.token).await? else {
        response.headers_mut().insert(LOCATION, HeaderValue::from_static("/signin?link=invalid"));
        return Ok(response);
    };
    end_previous_session(&state, &headers).await?;
    let (cookies, _) = start_session(&state, &headers, &user_id, None).await?;
    let out = response.headers_mut();
    out.insert(LOCATION, HeaderValue::from_static("/"));
    for c in cookies {
        out.append(SET_COOKIE, header_value(&c)?);
    }
    Ok(response)
}

/// The session record behind a cookie-authenticated request, if that is how it came.
async fn session_of(state: &AppState, headers: &HeaderMap) -> Result<Option<(String, SessionRecord)>, ApiError> {
    if headers.contains_key(AUTHORIZATION) {
        return Ok(None);
    }
    let Some(id) = cookie(headers, SESSION_COOKIE) else { return Ok(None) };
    let hash = token_hash(&id);
    if let Some(Resolved::Session(record, _)) = state.principals.get(&format!("session:{hash}")) {
        return Ok(Some((hash, record)));
    }
    Ok(state.store.session(&hash).await?.map(|r| (hash, r)))
}

/// Who is calling: the user, their memberships, and for a browser session its CSRF token.
#[utoipa::path(get, path = "/api/v1/session", tag = "auth", security(("token" = ["user"]), ("session" = ["user"])),
    responses((status = 200, body = SessionView), (status = 401, body = Problem)))]
pub async fn whoami(
    State(state): State<AppState>,
    headers: HeaderMap,
    Caller(p): Caller,
) -> Result<ApiJson<SessionView>, ApiError> {
    let session = session_of(&state, &headers).await?;
    Ok(ApiJson(session_view(&state, p, session.as_ref().map(|(_, r)| r)).await?))
}

/// Sign out: ends the session (a cookie-authenticated state change: send `X-CSRF-Token`) and, when the identity
/// provider offers RP-initiated logout, says where to send the browser to sign out there too.
#[utoipa::path(post, path = "/auth/logout", tag = "auth", security(("session" = ["user"])),
    responses((status = 200, body = SignedOut), (status = 400, body = Problem), (status = 401, body = Problem),
        (status = 403, body = Problem)))]
pub async fn logout(
    State(state): State<AppState>,
    headers: HeaderMap,
    Caller(_p): Caller,
) -> Result<Response, ApiError> {
    let Some((hash, _)) = session_of(&state, &headers).await? else {
        return Err(bad_login("not_a_session", "only a browser session signs out; revoke tokens instead"));
    };
    state.principals.remove(&format!("session:{hash}"));
    let ended = state.store.delete_session(&hash).await?;
    let id_token = ended.and_then(|s| s.id_token);
    let redirect_to = match (&state.auth.sso, &id_token) {
        (Some(sso), Some(hint)) => sso.provider.end_session_url(Some(hint)).await.unwrap_or_else(|| "/".into()),
        _ => "/".to_string(),
    };
    let mut response = ApiJson(SignedOut { redirect_to }).into_response();
    let secure = secure(&state, &headers);
    for c in [set_cookie(SESSION_COOKIE, "", 0, true, secure), set_cookie(CSRF_COOKIE, "", 0, false, secure)] {
        response.headers_mut().append(SET_COOKIE, header_value(&c)?);
    }
    Ok(response)
}
