//! One-time sign-in links (`/auth/link?token=tsl_...`): the way into the portal for a user who has no password
//! yet and no identity provider, as Jupyter prints its token URL. `tessera serve` prints one for the bootstrap
//! admin while it has no other way in (and, with `--demo`, one for a demo tenant member); `tessera user
//! sign-in-link` and platform admins (`POST /api/v1/users/{id}/sign-in-link`) issue them, e.g. for a user just
//! created, who then sets a password.
//!
//! Only the secret's SHA-256 is stored; a link works once and until it expires, and a new link for the same user
//! replaces the old one.

use tessera_store::{Store, StoreError, now_ms};

use super::secrets::token_hash;

/// Prefix of sign-in link secrets.
pub const LINK_PREFIX: &str = "tsl_";

/// How long a link printed by `tessera serve` or `tessera user sign-in-link` works.
pub const PRINTED_LINK_TTL_MS: i64 = 3600 * 1000;

/// How long a link issued through the API works (it is passed on to its user, who may not open it at once).
pub const ISSUED_LINK_TTL_MS: i64 = 72 * 3600 * 1000;

/// Longest secret a link may carry; anything longer is refused before it is hashed.
pub const MAX_LINK_SECRET: usize = 128;

/// A link just issued; the secret exists only here.
pub struct IssuedLink {
    /// `tsl_` and 244 random bits in hex.
    pub secret: String,
    /// When it stops working (UTC milliseconds).
    pub expires_at_ms: i64,
}

impl std::fmt::Debug for IssuedLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedLink").field("secret", &"<redacted>").field("expires_at_ms", &self.expires_at_ms).finish()
    }
}

impl IssuedLink {
    /// The link's path on the server.
    pub fn path(&self) -> String {
        format!("/auth/link?token={}", self.secret)
    }

    /// The whole link on the server at `base` (`http://host:port`, no trailing slash needed).
    pub fn url(&self, base: &str) -> String {
        format!("{}{}", base.trim_end_matches('/'), self.path())
    }
}

/// Issues a link for `user_id` that works for `ttl_ms`, replacing the user's previous link.
pub async fn issue(store: &Store, user_id: &str, ttl_ms: i64, actor: &str) -> Result<IssuedLink, StoreError> {
    let secret = format!("{LINK_PREFIX}{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
    let expires_at_ms = now_ms() + ttl_ms;
    store.create_sign_in_link(user_id, &token_hash(&secret), expires_at_ms, actor).await?;
    Ok(IssuedLink { secret, expires_at_ms })
}

/// Takes the link with `secret`: the user it signs in, or `None` when it is unknown, used, expired or malformed.
pub async fn take(store: &Store, secret: &str) -> Result<Option<String>, StoreError> {
    if secret.len() > MAX_LINK_SECRET || !secret.starts_with(LINK_PREFIX) {
        return Ok(None);
    }
    store.take_sign_in_link(&token_hash(secret), now_ms()).await
}

/// The base URL to print for a server listening on `addr`: loopback when it listens on every address.
pub fn base_for(addr: std::net::SocketAddr) -> String {
    let ip = if addr.ip().is_unspecified() { std::net::IpAddr::from([127, 0, 0, 1]) } else { addr.ip() };
    format!("http://{}", std::net::SocketAddr::new(ip, addr.port()))
}
