//! Authentication: `Authorization: Bearer tsr_...` API tokens resolve to a [`Principal`]. Only a SHA-256 of each
//! secret is stored; the secret itself is shown once, when the token is created.

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use sha2::{Digest, Sha256};

use super::error::ApiError;
use crate::app::AppState;
use crate::store::Principal;

/// Prefix of every Tessera API token, so leaked tokens are easy to recognise.
pub const TOKEN_PREFIX: &str = "tsr_";

/// A fresh token secret: the prefix and 244 random bits in hex.
pub fn new_token_secret() -> String {
    format!("{TOKEN_PREFIX}{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

/// What the store keeps of a secret.
pub fn token_hash(secret: &str) -> String {
    Sha256::digest(secret.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

impl FromRequestParts<AppState> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let header = parts
            .headers
            .get(AUTHORIZATION)
            .ok_or_else(|| ApiError::Unauthenticated("send `Authorization: Bearer <token>`".to_string()))?;
        let token = header
            .to_str()
            .ok()
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| t.starts_with(TOKEN_PREFIX))
            .ok_or_else(|| {
                ApiError::Unauthenticated("the Authorization header must be `Bearer tsr_...`".to_string())
            })?;
        let hash = token_hash(token);
        if let Some(p) = state.principals.get(&hash) {
            return Ok(p);
        }
        let principal = state
            .store
            .principal_by_token(&hash)
            .await?
            .ok_or_else(|| ApiError::Unauthenticated("unknown or revoked token".to_string()))?;
        state.principals.put(hash, principal.clone());
        Ok(principal)
    }
}

/// Requires a platform admin.
pub fn require_platform_admin(p: &Principal) -> Result<(), ApiError> {
    if p.user.platform_admin { Ok(()) } else { Err(ApiError::Forbidden("platform admins only".to_string())) }
}

/// Requires that `p` may see `tenant_id`'s objects; others get 404, never a hint that the object exists.
pub fn require_visible(p: &Principal, tenant_id: &str, what: &str) -> Result<(), ApiError> {
    if p.can_see(tenant_id) { Ok(()) } else { Err(ApiError::NotFound(format!("{what} not found"))) }
}
