//! Who is calling. A request carries one credential:
//! - `Authorization: Bearer tsr_...`: a Tessera API token (only a SHA-256 of each secret is stored);
//! - `Authorization: Bearer <JWT>`: an access token from the identity provider, validated and mapped like a
//!   sign-in (see [`tessera_services::auth`]);
//! - `Authorization: Bearer tsn_...`: a node credential, good for the agent routes only;
//! - the `tessera_session` cookie of a browser session; state changes must then echo the session's CSRF token in
//!   `X-CSRF-Token`.
//!
//! User routes take a [`Principal`], agent routes a [`NodeAuth`]; each refuses the other's credentials.

use axum::extract::FromRequestParts;
use axum::http::header::{AUTHORIZATION, COOKIE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method};

use super::error::ApiError;
use tessera_services::app::{AppState, Resolved};
use tessera_services::auth::oidc::{TokenError, constant_time_eq};
use tessera_store::Principal;
use tessera_store::auth::NodePrincipal;

/// The session cookie (HttpOnly).
pub const SESSION_COOKIE: &str = "tessera_session";
/// A readable copy of the session's CSRF token, for the portal's scripts.
pub const CSRF_COOKIE: &str = "tessera_csrf";
/// The header cookie-authenticated state changes must carry.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// How often a session's last use is written (idle expiry is this coarse).
pub const TOUCH_EVERY_MS: i64 = 60_000;

pub use tessera_services::auth::secrets::{
    NODE_TOKEN_PREFIX, TOKEN_PREFIX, new_node_secret, new_token_secret, token_hash,
};

/// A cookie's value from the request's `Cookie` headers.
pub fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim_matches('"').to_string())
}

/// The credential a request carries.
#[derive(Clone)]
enum Credential {
    ApiToken(String),
    Node(String),
    Jwt(String),
    Session(String),
}

fn credential(parts: &Parts) -> Result<Option<Credential>, ApiError> {
    if let Some(header) = parts.headers.get(AUTHORIZATION) {
        let token = header
            .to_str()
            .ok()
            .and_then(|h| h.strip_prefix("Bearer ").or_else(|| h.strip_prefix("bearer ")))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| ApiError::Unauthenticated("the Authorization header must be `Bearer <token>`".into()))?;
        return Ok(Some(if token.starts_with(TOKEN_PREFIX) {
            Credential::ApiToken(token.to_string())
        } else if token.starts_with(NODE_TOKEN_PREFIX) {
            Credential::Node(token.to_string())
        } else {
            Credential::Jwt(token.to_string())
        }));
    }
    Ok(cookie(&parts.headers, SESSION_COOKIE).filter(|c| !c.is_empty()).map(Credential::Session))
}

fn token_error(e: TokenError) -> ApiError {
    match e {
        TokenError::Provider(detail) => ApiError::Unavailable(format!("cannot check the token: {detail}")),
        other => ApiError::unauthorized(other.code(), other.to_string()),
    }
}

fn is_safe(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Resolves a browser session: live, not idle too long, and for a state change the CSRF token echoed.
async fn session(parts: &Parts, state: &AppState, id: &str) -> Result<Principal, ApiError> {
    let hash = format!("session:{}", token_hash(id));
    let (record, principal) = match state.principals.get(&hash) {
        Some(Resolved::Session(record, principal)) => (record, principal),
        _ => {
            let record = state
                .store
                .session(&hash["session:".len()..])
                .await?
                .ok_or_else(|| ApiError::unauthorized("session_expired", "the session has ended; sign in again"))?;
            let principal = state.store.principal(&record.user_id).await?;
            state.principals.put(hash.clone(), Resolved::Session(record.clone(), principal.clone()));
            (record, principal)
        }
    };
    let now = tessera_store::now_ms();
    let idle_ms = state.auth.session_idle.as_millis() as i64;
    if now >= record.expires_at_ms || now - record.last_seen_at_ms >= idle_ms {
        state.principals.remove(&hash);
        let _ = state.store.delete_session(&hash["session:".len()..]).await;
        return Err(ApiError::unauthorized("session_expired", "the session has ended; sign in again"));
    }
    if !is_safe(&parts.method) {
        let sent = parts.headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok()).unwrap_or("");
        if !constant_time_eq(sent.as_bytes(), record.csrf_token.as_bytes()) {
            return Err(ApiError::forbidden(
                "csrf_failed",
                format!(
                    "a state change with the session cookie must carry the session's CSRF token in `{CSRF_HEADER}`"
                ),
            ));
        }
    }
    if now - record.last_seen_at_ms >= TOUCH_EVERY_MS {
        state.store.touch_session(&hash["session:".len()..], now).await?;
        // The next request reads the session afresh (re-caching here would stretch the cache's staleness).
        state.principals.remove(&hash);
    }
    Ok(principal)
}

/// Resolves a JWT access token from the identity provider to a user, creating or updating them.
async fn access_token(state: &AppState, token: &str) -> Result<Principal, ApiError> {
    let Some(sso) = &state.auth.sso else {
        return Err(ApiError::unauthorized(
            "invalid_token",
            "unknown token: send a Tessera API token (`tsr_...`); single sign-on is not configured",
        ));
    };
    let hash = format!("jwt:{}", token_hash(token));
    if let Some(Resolved::User(p)) = state.principals.get(&hash) {
        return Ok(p);
    }
    let claims = sso.provider.validate_access_token(token).await.map_err(token_error)?;
    let identity = sso.mapping.identity(&claims).map_err(|e| ApiError::unauthorized("token_claims", e.to_string()))?;
    let signed_in = state.store.sso_sign_in(&identity).await?;
    state.principals.put(hash, Resolved::User(signed_in.principal.clone()));
    Ok(signed_in.principal)
}

/// The signed-in caller of a route: a handler that takes it answers only callers with a user credential (a session,
/// an API token or the identity provider's access token).
#[derive(Debug, Clone)]
pub struct Caller(pub Principal);

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        principal(parts, state).await.map(Caller)
    }
}

/// The principal behind a request's user credential.
async fn principal(parts: &mut Parts, state: &AppState) -> Result<Principal, ApiError> {
    {
        match credential(parts)? {
            None => Err(ApiError::Unauthenticated(
                "sign in, or send `Authorization: Bearer <token>` (a Tessera API token or the identity provider's \
                 access token)"
                    .to_string(),
            )),
            Some(Credential::Node(_)) => Err(ApiError::forbidden(
                "node_credential",
                "node credentials may call only the agent routes (`/api/v1/agent/...`)",
            )),
            Some(Credential::Session(id)) => session(parts, state, &id).await,
            Some(Credential::Jwt(token)) => access_token(state, &token).await,
            Some(Credential::ApiToken(token)) => {
                let hash = token_hash(&token);
                if let Some(Resolved::User(p)) = state.principals.get(&hash) {
                    return Ok(p);
                }
                let principal = state
                    .store
                    .principal_by_token(&hash)
                    .await?
                    .ok_or_else(|| ApiError::unauthorized("invalid_token", "unknown or revoked token"))?;
                state.principals.put(hash, Resolved::User(principal.clone()));
                Ok(principal)
            }
        }
    }
}

/// A caller of a long-lived stream: the principal, and the credential it was resolved from, so that the stream can
/// ask again while it runs ([`Right::holds`]).
#[derive(Clone)]
pub struct Right {
    /// Who opened the stream.
    pub principal: Principal,
    credential: Credential,
}

impl std::fmt::Debug for Right {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Right").field("user", &self.principal.user.id).finish_non_exhaustive()
    }
}

impl FromRequestParts<AppState> for Right {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let principal = principal(parts, state).await?;
        let credential = credential(parts)?.ok_or_else(|| ApiError::Unauthenticated("sign in".into()))?;
        Ok(Right { principal, credential })
    }
}

impl Right {
    /// Whether the credential is still good and resolves to the same user with the same platform role and the same
    /// memberships and roles. Reads the database unless a resolution of the credential is younger than half of
    /// [`tessera_services::streams::RIGHT_RECHECK`]; a revocation or membership change on this replica clears
    /// that at once, so a stream on any replica sees it within its next check.
    pub async fn holds(&self, state: &AppState) -> bool {
        match self.resolve_again(state).await {
            Ok(Some(now)) => same_right(&self.principal, &now),
            Ok(None) => false,
            // The database is away: keep the stream until it answers rather than end every stream at once.
            Err(e) => {
                tracing::debug!(error = %e, "stream: right not checked");
                true
            }
        }
    }

    async fn resolve_again(&self, state: &AppState) -> Result<Option<Principal>, ApiError> {
        let fresh = tessera_services::streams::RIGHT_RECHECK / 2;
        match &self.credential {
            Credential::ApiToken(token) => {
                let hash = token_hash(token);
                if let Some(Resolved::User(p)) = state.principals.get_within(&hash, fresh) {
                    return Ok(Some(p));
                }
                let found = state.store.principal_by_token(&hash).await?;
                if let Some(p) = &found {
                    state.principals.put(hash, Resolved::User(p.clone()));
                }
                Ok(found)
            }
            Credential::Session(id) => {
                let hash = format!("session:{}", token_hash(id));
                let (record, principal) = match state.principals.get_within(&hash, fresh) {
                    Some(Resolved::Session(record, principal)) => (record, principal),
                    _ => {
                        let Some(record) = state.store.session(&hash["session:".len()..]).await? else {
                            return Ok(None);
                        };
                        let principal = state.store.principal(&record.user_id).await?;
                        state.principals.put(hash, Resolved::Session(record.clone(), principal.clone()));
                        (record, principal)
                    }
                };
                let now = tessera_store::now_ms();
                let idle_ms = state.auth.session_idle.as_millis() as i64;
                let live = now < record.expires_at_ms && now - record.last_seen_at_ms < idle_ms;
                Ok(live.then_some(principal))
            }
            Credential::Jwt(token) => {
                let Some(sso) = &state.auth.sso else { return Ok(None) };
                if sso.provider.validate_access_token(token).await.is_err() {
                    return Ok(None);
                }
                // Memberships as the database has them now (an admin may have removed the user from a tenant).
                Ok(Some(state.store.principal(&self.principal.user.id).await?))
            }
            Credential::Node(_) => Ok(None),
        }
    }
}

/// Whether two resolutions give the same rights: same user, same platform role, same memberships and roles.
fn same_right(a: &Principal, b: &Principal) -> bool {
    a.user.id == b.user.id
        && a.user.platform_admin == b.user.platform_admin
        && a.memberships.len() == b.memberships.len()
        && a.memberships.iter().all(|m| b.memberships.contains(m))
}

/// The node whose credential the request carries (agent routes).
#[derive(Debug, Clone)]
pub struct NodeAuth(pub NodePrincipal);

impl FromRequestParts<AppState> for NodeAuth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        match credential(parts)? {
            None => Err(ApiError::Unauthenticated("send `Authorization: Bearer tsn_...` (a node credential)".into())),
            Some(Credential::Node(token)) => {
                let hash = format!("node:{}", token_hash(&token));
                if let Some(n) = state.principals.get_node(&hash, state.store.sees_every_change()) {
                    return Ok(NodeAuth(n));
                }
                let epoch = state.principals.epoch();
                let node = state
                    .store
                    .node_by_credential(&hash["node:".len()..])
                    .await?
                    .ok_or_else(|| ApiError::unauthorized("invalid_token", "unknown or revoked node credential"))?;
                state.principals.put_node(hash, node.clone(), epoch);
                Ok(NodeAuth(node))
            }
            Some(_) => Err(ApiError::forbidden("user_credential", "agent routes take a node credential (`tsn_...`)")),
        }
    }
}

/// The store's hash of the node credential in `headers` (`Authorization: Bearer tsn_...`), if there is one.
pub fn node_credential_hash(headers: &HeaderMap) -> Option<String> {
    let token = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let token = token.strip_prefix("Bearer ").or_else(|| token.strip_prefix("bearer "))?.trim();
    token.starts_with(NODE_TOKEN_PREFIX).then(|| token_hash(token))
}

/// A `Set-Cookie` value.
pub fn set_cookie(name: &str, value: &str, max_age_s: i64, http_only: bool, secure: bool) -> String {
    let mut c = format!("{name}={value}; Path=/; Max-Age={max_age_s}; SameSite=Lax");
    if http_only {
        c.push_str("; HttpOnly");
    }
    if secure {
        c.push_str("; Secure");
    }
    c
}
