//! Sign-in: OpenID Connect single sign-on and JWT bearer tokens ([`oidc`]), claims to memberships ([`mapping`]),
//! local accounts with argon2 password hashes, and browser sessions kept in the database (any replica serves them).
//!
//! ```toml
//! [auth]
//! local_accounts = true          # password sign-in for local users; false turns it off
//! session_idle_minutes = 480     # a session unused this long ends
//! session_absolute_hours = 24    # and every session ends this long after sign-in
//! # secure_cookies = true        # default: true when the redirect URL is https
//!
//! [auth.oidc]
//! issuer = "https://keycloak.example.com/realms/acme"
//! client_id = "tessera"
//! # client_secret: better in TESSERA_OIDC_CLIENT_SECRET
//! redirect_url = "https://tessera.example.com/auth/callback"
//! scopes = ["openid", "profile", "email", "groups"]
//! api_audience = "tessera-api"   # `aud` of access tokens for the API; default: the client id
//! admin_groups = ["tessera-admins"]
//! tenant_group_pattern = "tessera:{tenant}:{role}"
//! ```
//! (claim mapping: see [`mapping`]).

pub mod links;
pub mod mapping;
pub mod oidc;
pub mod permissions;
pub use permissions::Permissions;
pub mod secrets;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use argon2::Argon2;
use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use serde::Deserialize;

/// Name of the platform admin created at first start.
pub const BOOTSTRAP_ADMIN: &str = "admin";

/// How long a login may stay at the provider (the sweeper forgets older logins and attempts).
pub const LOGIN_TTL_MS: i64 = 10 * 60 * 1000;

use mapping::{ClaimMapping, GroupRule, Pattern};
use oidc::{Provider, ProviderSettings};

/// The `[auth]` table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// Password sign-in for local users (default true).
    pub local_accounts: Option<bool>,
    /// Idle expiry of sessions, minutes (default 480).
    pub session_idle_minutes: Option<u64>,
    /// Absolute expiry of sessions, hours (default 24).
    pub session_absolute_hours: Option<u64>,
    /// `Secure` cookies (default: when the redirect URL is https).
    pub secure_cookies: Option<bool>,
    /// Single sign-on.
    pub oidc: Option<OidcConfig>,
}

/// The `[auth.oidc]` table.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OidcConfig {
    /// Issuer URL.
    pub issuer: String,
    /// Client id.
    pub client_id: String,
    /// Client secret (or `TESSERA_OIDC_CLIENT_SECRET`).
    pub client_secret: Option<String>,
    /// This server's callback, `https://HOST/auth/callback`.
    pub redirect_url: String,
    /// Where the provider returns the browser after logout (default: this server's `/`).
    pub post_logout_redirect_url: Option<String>,
    /// Scopes (default `openid profile email groups`).
    pub scopes: Option<Vec<String>>,
    /// `aud` of API access tokens (default: the client id).
    pub api_audience: Option<String>,
    /// Claim with the user name (default `preferred_username`).
    pub username_claim: Option<String>,
    /// Claim with the groups (default `groups`).
    pub groups_claim: Option<String>,
    /// Groups whose members are platform admins.
    #[serde(default)]
    pub admin_groups: Vec<String>,
    /// Group-to-tenant rules.
    #[serde(default)]
    pub tenant_groups: Vec<GroupRule>,
    /// Group-name pattern with `{tenant}` and `{role}`.
    pub tenant_group_pattern: Option<String>,
    /// Clock skew allowed, seconds (default 60).
    pub leeway_s: Option<u64>,
    /// Least seconds between key refetches caused by unknown key ids (default 60).
    pub jwks_refetch_floor_s: Option<u64>,
    /// Name on the sign-in button (default `Single sign-on`).
    pub display_name: Option<String>,
}

impl std::fmt::Debug for OidcConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OidcConfig")
            .field("issuer", &self.issuer)
            .field("client_id", &self.client_id)
            .field("client_secret", &crate::redact::secret(&self.client_secret))
            .field("redirect_url", &self.redirect_url)
            .field("post_logout_redirect_url", &self.post_logout_redirect_url)
            .field("scopes", &self.scopes)
            .field("api_audience", &self.api_audience)
            .field("username_claim", &self.username_claim)
            .field("groups_claim", &self.groups_claim)
            .field("admin_groups", &self.admin_groups)
            .field("tenant_groups", &self.tenant_groups)
            .field("tenant_group_pattern", &self.tenant_group_pattern)
            .field("leeway_s", &self.leeway_s)
            .field("jwks_refetch_floor_s", &self.jwks_refetch_floor_s)
            .field("display_name", &self.display_name)
            .finish()
    }
}

/// Sign-in as configured and running.
#[derive(Debug)]
pub struct Auth {
    /// Password sign-in for local users.
    pub local_accounts: bool,
    /// Idle expiry.
    pub session_idle: Duration,
    /// Absolute expiry.
    pub session_absolute: Duration,
    /// `Secure` on cookies.
    pub secure_cookies: bool,
    /// Single sign-on, when configured.
    pub sso: Option<Sso>,
    /// Recent failed password sign-ins per user name.
    failures: Mutex<HashMap<String, (Instant, u32)>>,
    /// Password checks running at once (argon2 takes 19 MiB and tens of milliseconds each).
    pub password_slots: tokio::sync::Semaphore,
}

/// Single sign-on: the provider and the claim mapping.
#[derive(Debug)]
pub struct Sso {
    /// The relying party.
    pub provider: Provider,
    /// Claims to memberships.
    pub mapping: ClaimMapping,
    /// Name on the sign-in button.
    pub display_name: String,
}

impl Default for Auth {
    fn default() -> Self {
        Auth {
            local_accounts: true,
            session_idle: Duration::from_secs(480 * 60),
            session_absolute: Duration::from_secs(24 * 3600),
            secure_cookies: false,
            sso: None,
            failures: Mutex::new(HashMap::new()),
            password_slots: tokio::sync::Semaphore::new(4),
        }
    }
}

/// Failed password sign-ins allowed per user name per [`FAILURE_WINDOW`].
pub const MAX_FAILURES: u32 = 5;
/// The window over which failures count.
pub const FAILURE_WINDOW: Duration = Duration::from_secs(15 * 60);
/// Most user names with recent failures tracked at once.
const MAX_TRACKED_NAMES: usize = 100_000;
/// Shortest local password.
pub const MIN_PASSWORD: usize = 12;

impl Auth {
    /// Checks and builds the configuration (with `TESSERA_OIDC_CLIENT_SECRET` already folded in).
    pub fn from_config(config: &AuthConfig) -> Result<Auth, String> {
        let defaults = Auth::default();
        let mut auth = Auth {
            local_accounts: config.local_accounts.unwrap_or(true),
            session_idle: config.session_idle_minutes.map_or(defaults.session_idle, |m| Duration::from_secs(m * 60)),
            session_absolute: config
                .session_absolute_hours
                .map_or(defaults.session_absolute, |h| Duration::from_secs(h * 3600)),
            ..defaults
        };
        if auth.session_idle.is_zero() || auth.session_absolute.is_zero() {
            return Err("auth: session lifetimes must be positive".into());
        }
        let mut https = false;
        if let Some(o) = &config.oidc {
            let url = |what: &str, value: &str| {
                reqwest::Url::parse(value)
                    .ok()
                    .filter(|u| matches!(u.scheme(), "http" | "https"))
                    .ok_or_else(|| format!("auth.oidc.{what} `{value}` is not an http(s) URL"))
            };
            url("issuer", &o.issuer)?;
            let redirect = url("redirect_url", &o.redirect_url)?;
            https = redirect.scheme() == "https";
            if o.client_id.trim().is_empty() {
                return Err("auth.oidc.client_id is empty".into());
            }
            let post_logout = match &o.post_logout_redirect_url {
                Some(u) => url("post_logout_redirect_url", u)?.to_string(),
                None => format!("{}/", redirect.origin().ascii_serialization()),
            };
            let pattern = o.tenant_group_pattern.as_deref().map(Pattern::parse).transpose()?;
            let scopes = o
                .scopes
                .clone()
                .unwrap_or_else(|| ["openid", "profile", "email", "groups"].iter().map(|s| s.to_string()).collect());
            if !scopes.iter().any(|s| s == "openid") {
                return Err("auth.oidc.scopes must include `openid`".into());
            }
            let settings = ProviderSettings {
                issuer: o.issuer.clone(),
                client_id: o.client_id.clone(),
                client_secret: o.client_secret.clone().filter(|s| !s.is_empty()),
                scopes,
                redirect_url: o.redirect_url.clone(),
                post_logout_redirect_url: post_logout,
                api_audience: o.api_audience.clone().unwrap_or_else(|| o.client_id.clone()),
                leeway: Duration::from_secs(o.leeway_s.unwrap_or(60)),
                jwks_refetch_floor: Duration::from_secs(o.jwks_refetch_floor_s.unwrap_or(60)),
                jwks_max_age: Duration::from_secs(3600),
            };
            let mapping = ClaimMapping {
                username_claim: o.username_claim.clone().unwrap_or_else(|| "preferred_username".into()),
                groups_claim: o.groups_claim.clone().unwrap_or_else(|| "groups".into()),
                admin_groups: o.admin_groups.clone(),
                tenant_groups: o.tenant_groups.clone(),
                pattern,
            };
            let display_name = o.display_name.clone().unwrap_or_else(|| "Single sign-on".into());
            auth.sso = Some(Sso { provider: Provider::new(settings), mapping, display_name });
        }
        auth.secure_cookies = config.secure_cookies.unwrap_or(https);
        Ok(auth)
    }

    /// Starts a password attempt for `name`: counts it as a failure up front (so that parallel guesses count
    /// too) and says whether it may go ahead. Locked out after [`MAX_FAILURES`] in [`FAILURE_WINDOW`]; when the
    /// table of names is full, every attempt waits until it empties.
    pub fn begin_password_attempt(&self, name: &str) -> bool {
        let Ok(mut failures) = self.failures.lock() else { return false };
        failures.retain(|_, (at, _)| at.elapsed() < FAILURE_WINDOW);
        if !failures.contains_key(name) && failures.len() >= MAX_TRACKED_NAMES {
            return false;
        }
        let entry = failures.entry(name.to_string()).or_insert((Instant::now(), 0));
        if entry.1 >= MAX_FAILURES {
            return false;
        }
        entry.1 += 1;
        true
    }

    /// A password attempt for `name` succeeded: its failures are forgotten.
    pub fn password_succeeded(&self, name: &str) {
        if let Ok(mut failures) = self.failures.lock() {
            failures.remove(name);
        }
    }
}

/// An argon2id hash of a password (PHC string).
pub fn hash_password(password: &str) -> Result<String, String> {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default().hash_password(password.as_bytes(), &salt).map(|h| h.to_string()).map_err(|e| e.to_string())
}

/// Whether `password` matches a stored hash.
pub fn verify_password(password: &str, hash: &str) -> bool {
    PasswordHash::new(hash).is_ok_and(|h| Argon2::default().verify_password(password.as_bytes(), &h).is_ok())
}

/// A hash no password matches, verified against when the user does not exist so that both cases take as long.
pub fn decoy_hash() -> &'static str {
    static DECOY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DECOY.get_or_init(|| hash_password(&oidc::random_secret()).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_hash_with_argon2id_and_verify() {
        let hash = hash_password("correct horse battery").expect("hash");
        assert!(hash.starts_with("$argon2id$"));
        assert!(verify_password("correct horse battery", &hash));
        assert!(!verify_password("correct horse batterx", &hash));
        assert!(!verify_password("anything", "not a hash"));
        assert_ne!(hash, hash_password("correct horse battery").expect("hash"), "salted");
    }

    #[test]
    fn repeated_failures_lock_a_name_out() {
        let auth = Auth::default();
        for _ in 0..MAX_FAILURES {
            assert!(auth.begin_password_attempt("ada"));
        }
        assert!(!auth.begin_password_attempt("ada"), "attempts count before they are checked");
        assert!(auth.begin_password_attempt("bob"), "per name");
        auth.password_succeeded("bob");
        assert!(auth.failures.lock().expect("lock").get("bob").is_none());
    }

    #[test]
    fn configuration_errors_are_explained() {
        let bad = AuthConfig {
            oidc: Some(OidcConfig { issuer: "ftp://x".into(), ..OidcConfig::default() }),
            ..AuthConfig::default()
        };
        assert!(Auth::from_config(&bad).expect_err("bad").contains("issuer"));
        let good = AuthConfig {
            oidc: Some(OidcConfig {
                issuer: "https://idp.example.com".into(),
                client_id: "tessera".into(),
                redirect_url: "https://tessera.example.com/auth/callback".into(),
                tenant_group_pattern: Some("tessera:{tenant}:{role}".into()),
                ..OidcConfig::default()
            }),
            ..AuthConfig::default()
        };
        let auth = Auth::from_config(&good).expect("good");
        assert!(auth.secure_cookies, "https redirect: Secure cookies");
        let sso = auth.sso.expect("sso");
        assert_eq!(sso.provider.settings().post_logout_redirect_url, "https://tessera.example.com/");
        assert_eq!(sso.provider.settings().api_audience, "tessera");
    }
}
