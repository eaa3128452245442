//! Sign-in records: identities from the OpenID provider and the memberships their claims map to, local password
//! hashes, browser sessions, login attempts in flight and node credentials.
//!
//! One SQL body for both backends (see [`super::dialect`]).

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use super::writes::audit_insert;
use super::{Principal, Role, Store, StoreError, User, UserRow, new_id, now_ms, on_constraint, role_from, user_from};

/// Every membership of a user, by tenant id.
macro_rules! memberships_of {
    ($conn:expr, $user_id:expr) => {{
        let rows: Vec<(String, String)> =
            sqlx::query_as("SELECT tenant_id, role FROM memberships WHERE user_id = $1 ORDER BY tenant_id")
                .bind($user_id)
                .fetch_all($conn)
                .await?;
        rows.into_iter().map(|(t, r)| Ok((t, role_from(&r)?))).collect::<Result<Vec<_>, StoreError>>()?
    }};
}

/// Who the provider says signed in, with the provider's claims already mapped to Tessera.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SsoIdentity {
    /// The provider (`iss`).
    pub issuer: String,
    /// The user at the provider (`sub`).
    pub subject: String,
    /// The user name the provider suggests (e.g. `preferred_username`); used when the user is created.
    pub name: String,
    /// E-mail, if the provider gives one.
    pub email: Option<String>,
    /// Whether the user is a platform admin; `None` when the mapping does not manage platform admins.
    pub platform_admin: Option<bool>,
    /// Tenant memberships by tenant name; `None` when the token carries no groups claim at all (then the
    /// memberships are left as they are: some providers put groups in ID tokens only).
    pub memberships: Option<Vec<(String, Role)>>,
}

/// The outcome of a single sign-on.
#[derive(Debug, Clone)]
pub struct SignedIn {
    /// The user, with every membership (mapped and set by hand).
    pub principal: Principal,
    /// Tenant names the mapping granted that do not exist (skipped).
    pub unknown_tenants: Vec<String>,
    /// Whether the user was created by this sign-in.
    pub created: bool,
}

/// A browser session as stored (the session id itself is only kept as a SHA-256).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct SessionRecord {
    /// The signed-in user.
    pub user_id: String,
    /// The token that cookie-authenticated state changes must echo.
    pub csrf_token: String,
    /// The provider's ID token, kept as the hint for RP-initiated logout.
    pub id_token: Option<String>,
    /// UTC milliseconds.
    pub created_at_ms: i64,
    /// UTC milliseconds, updated at most once a minute.
    pub last_seen_at_ms: i64,
    /// Absolute expiry, UTC milliseconds.
    pub expires_at_ms: i64,
}

/// A login that went to the provider and has not come back yet.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct LoginAttempt {
    /// SHA-256 of the `state` parameter.
    pub state_sha256: String,
    /// SHA-256 of the secret in the browser's login cookie (never in a URL), binding the login to that browser.
    pub browser_sha256: String,
    /// The `nonce` the ID token must carry.
    pub nonce: String,
    /// The PKCE code verifier.
    pub pkce_verifier: String,
    /// Where to go after signing in (a path on this server).
    pub return_to: String,
    /// UTC milliseconds.
    pub created_at_ms: i64,
}

/// A node, as its credential identifies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePrincipal {
    /// The node's id.
    pub node_id: String,
    /// The node's name.
    pub node_name: String,
}

impl NodePrincipal {
    /// Audit-log actor name.
    pub fn actor(&self) -> String {
        format!("node:{}", self.node_name)
    }
}

/// A membership as the identity provider's mapping compares it.
#[derive(Debug, sqlx::FromRow)]
struct MembershipRow {
    tenant_id: String,
    role: String,
    source: String,
}

/// The columns of a [`SessionRecord`].
const SESSION_COLUMNS: &str = "user_id, csrf_token, id_token, created_at_ms, last_seen_at_ms, expires_at_ms";

fn rank(role: Role) -> u8 {
    match role {
        Role::Member => 0,
        Role::TenantAdmin => 1,
    }
}

impl Store {
    /// Signs in a user the provider vouched for: finds them by `(issuer, subject)` or creates them, then makes
    /// their `sso` memberships exactly the mapped ones (memberships set by hand stay as they are) and, when the
    /// mapping manages it, their platform-admin flag. Every change is audited; a sign-in that changes nothing writes
    /// nothing.
    pub async fn sso_sign_in(&self, who: &SsoIdentity) -> Result<SignedIn, StoreError> {
        match self.sso_sign_in_once(who).await {
            // Two first sign-ins of one new user raced; the loser finds the winner's row.
            Err(StoreError::Conflict { .. }) => self.sso_sign_in_once(who).await,
            other => other,
        }
    }

    async fn sso_sign_in_once(&self, who: &SsoIdentity) -> Result<SignedIn, StoreError> {
        let actor = format!("sso:{}", who.issuer);
        // Highest role per tenant name.
        let mut wanted: BTreeMap<&str, Role> = BTreeMap::new();
        for (tenant, role) in who.memberships.iter().flatten() {
            let entry = wanted.entry(tenant.as_str()).or_insert(*role);
            if rank(*role) > rank(*entry) {
                *entry = *role;
            }
        }
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let found: Option<UserRow> = sqlx::query_as(&format!(
                "SELECT id, name, platform_admin, {} FROM users WHERE oidc_issuer = $1 AND oidc_subject = $2",
                "created_at_ms"
            ))
            .bind(&who.issuer)
            .bind(&who.subject)
            .fetch_optional(&mut *tx)
            .await?;
            let (user, created) = match found {
                Some(row) => {
                    let user = user_from(row);
                    let admin = who.platform_admin.unwrap_or(user.platform_admin);
                    let changed = sqlx::query(
                        "UPDATE users SET platform_admin = $1, email = $2 WHERE id = $3 \
                         AND (platform_admin <> $1 OR email IS DISTINCT FROM $2)",
                    )
                    .bind(admin)
                    .bind(&who.email)
                    .bind(&user.id)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                    if changed > 0 && admin != user.platform_admin {
                        let object = format!("user/{}", user.id);
                        let before = serde_json::json!({ "platform_admin": user.platform_admin }).to_string();
                        let after = serde_json::json!({ "platform_admin": admin }).to_string();
                        audit_insert(&mut tx, &actor, "user.platform-admin", &object, Some(before), Some(after)).await?;
                    }
                    (User { platform_admin: admin, ..user }, false)
                }
                None => {
                    let taken: Option<(String,)> = sqlx::query_as("SELECT id FROM users WHERE lower(name) = lower($1)")
                        .bind(&who.name)
                        .fetch_optional(&mut *tx)
                        .await?;
                    // A provider's user never takes over a local account that happens to share the name.
                    let name = match taken {
                        None => who.name.clone(),
                        Some(_) => {
                            let digest = Sha256::digest(format!("{}\n{}", who.issuer, who.subject).as_bytes());
                            let tag: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
                            format!("{}~{tag}", who.name)
                        }
                    };
                    let user = User {
                        id: new_id(),
                        name,
                        platform_admin: who.platform_admin.unwrap_or(false),
                        created_at_ms: now_ms(),
                    };
                    sqlx::query(
                        "INSERT INTO users (id, name, platform_admin, email, oidc_issuer, oidc_subject, created_at_ms) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7)",
                    )
                        .bind(&user.id)
                        .bind(&user.name)
                        .bind(user.platform_admin)
                        .bind(&who.email)
                        .bind(&who.issuer)
                        .bind(&who.subject)
                        .bind(user.created_at_ms)
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| on_constraint(e, "users"))?;
                    let after = serde_json::to_string(&user).ok();
                    audit_insert(&mut tx, &actor, "user.create", &format!("user/{}", user.id), None, after).await?;
                    (user, true)
                }
            };
            let tenants: Vec<(String, String)> = sqlx::query_as("SELECT name, id FROM tenants").fetch_all(&mut *tx).await?;
            let tenant_ids: BTreeMap<String, String> = tenants.into_iter().collect();
            let mut unknown_tenants = Vec::new();
            let mut mapped: BTreeMap<String, Role> = BTreeMap::new();
            for (name, role) in &wanted {
                match tenant_ids.get(*name) {
                    Some(id) => {
                        mapped.insert(id.clone(), *role);
                    }
                    None => unknown_tenants.push((*name).to_string()),
                }
            }
            let rows: Vec<MembershipRow> =
                sqlx::query_as("SELECT tenant_id, role, source FROM memberships WHERE user_id = $1")
                    .bind(&user.id)
                    .fetch_all(&mut *tx)
                    .await?;
            let mut existing: BTreeMap<String, (Role, String)> = BTreeMap::new();
            for MembershipRow { tenant_id, role, source } in rows {
                existing.insert(tenant_id, (role_from(&role)?, source));
            }
            for (tenant, (role, source)) in &existing {
                if who.memberships.is_some() && source == "sso" && !mapped.contains_key(tenant) {
                    sqlx::query("DELETE FROM memberships WHERE user_id = $1 AND tenant_id = $2 AND source = 'sso'")
                        .bind(&user.id)
                        .bind(tenant)
                        .execute(&mut *tx)
                        .await?;
                    let before = serde_json::json!({ "role": role.as_str(), "source": "sso" }).to_string();
                    let object = format!("tenant/{tenant}/member/{}", user.id);
                    audit_insert(&mut tx, &actor, "membership.remove", &object, Some(before), None).await?;
                }
            }
            for (tenant, role) in mapped.iter().filter(|_| who.memberships.is_some()) {
                let before = existing.get(tenant);
                match before {
                    // Set by hand: the mapping leaves it alone.
                    Some((_, source)) if source != "sso" => continue,
                    Some((old, _)) if old == role => continue,
                    _ => {}
                }
                sqlx::query(
                    "INSERT INTO memberships (user_id, tenant_id, role, source) VALUES ($1, $2, $3, 'sso') \
                     ON CONFLICT (user_id, tenant_id) DO UPDATE SET role = excluded.role \
                     WHERE memberships.source = 'sso'",
                )
                .bind(&user.id)
                .bind(tenant)
                .bind(role.as_str())
                .execute(&mut *tx)
                .await?;
                let before = before.map(|(r, _)| serde_json::json!({ "role": r.as_str(), "source": "sso" }).to_string());
                let after = serde_json::json!({ "role": role.as_str(), "source": "sso" }).to_string();
                let object = format!("tenant/{tenant}/member/{}", user.id);
                audit_insert(&mut tx, &actor, "membership.set", &object, before, Some(after)).await?;
            }
            let memberships = memberships_of!(&mut *tx, &user.id);
            tx.commit().await?;
            Ok(SignedIn { principal: Principal { user, memberships }, unknown_tenants, created })
        })
    }

    /// A user with all their memberships.
    pub async fn principal(&self, user_id: &str) -> Result<Principal, StoreError> {
        on_pool!(self, pool, dialect => {
            let mut conn = pool.acquire().await?;
            let row: Option<UserRow> = sqlx::query_as(&format!(
                "SELECT id, name, platform_admin, {} FROM users WHERE id = $1",
                "created_at_ms"
            ))
            .bind(user_id)
            .fetch_optional(&mut *conn)
            .await?;
            let user = row.map(user_from).ok_or_else(|| StoreError::NotFound { what: format!("user {user_id}") })?;
            let memberships = memberships_of!(&mut *conn, user_id);
            Ok(Principal { user, memberships })
        })
    }

    /// Sets (or, with `None`, removes) a user's local password hash.
    pub async fn set_password_hash(&self, user_id: &str, hash: Option<&str>, actor: &str) -> Result<(), StoreError> {
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let done = sqlx::query("UPDATE users SET password_hash = $1 WHERE id = $2")
                .bind(hash)
                .bind(user_id)
                .execute(&mut *tx)
                .await?;
            if done.rows_affected() == 0 {
                return Err(StoreError::NotFound { what: format!("user {user_id}") });
            }
            let action = if hash.is_some() { "user.password.set" } else { "user.password.remove" };
            audit_insert(&mut tx, actor, action, &format!("user/{user_id}"), None, None).await?;
            tx.commit().await?;
            Ok(())
        })
    }

    /// A local user's id and password hash, by name (`None` when there is no such user or no password).
    pub async fn password_hash(&self, name: &str) -> Result<Option<(String, String)>, StoreError> {
        on_pool!(self, pool, _dialect => {
            let row: Option<(String, Option<String>)> =
                sqlx::query_as("SELECT id, password_hash FROM users WHERE name = $1")
                    .bind(name)
                    .fetch_optional(pool)
                    .await?;
            Ok(row.and_then(|(id, hash)| hash.map(|h| (id, h))))
        })
    }

    /// Whether a user signs in through the identity provider.
    pub async fn is_sso_user(&self, user_id: &str) -> Result<bool, StoreError> {
        on_pool!(self, pool, _dialect => {
            let row: Option<(Option<String>,)> = sqlx::query_as("SELECT oidc_subject FROM users WHERE id = $1")
                .bind(user_id)
                .fetch_optional(pool)
                .await?;
            Ok(row.is_some_and(|(s,)| s.is_some()))
        })
    }

    /// Ends every session of a user; returns how many.
    pub async fn delete_user_sessions(&self, user_id: &str) -> Result<u64, StoreError> {
        on_pool!(self, pool, _dialect => {
            let done = sqlx::query("DELETE FROM sessions WHERE user_id = $1").bind(user_id).execute(pool).await?;
            Ok(done.rows_affected())
        })
    }

    /// Records a new session.
    pub async fn create_session(&self, id_sha256: &str, session: &SessionRecord) -> Result<(), StoreError> {
        on_pool!(self, pool, _dialect => {
            sqlx::query(&format!(
                "INSERT INTO sessions (id_sha256, {SESSION_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7)"
            ))
            .bind(id_sha256)
            .bind(&session.user_id)
            .bind(&session.csrf_token)
            .bind(&session.id_token)
            .bind(session.created_at_ms)
            .bind(session.last_seen_at_ms)
            .bind(session.expires_at_ms)
            .execute(pool)
            .await
            .map_err(|e| on_constraint(e, "sessions"))?;
            Ok(())
        })
    }

    /// A session by the SHA-256 of its id, however old (the caller judges expiry).
    pub async fn session(&self, id_sha256: &str) -> Result<Option<SessionRecord>, StoreError> {
        on_pool!(self, pool, _dialect => {
            Ok(sqlx::query_as(&format!("SELECT {SESSION_COLUMNS} FROM sessions WHERE id_sha256 = $1"))
                .bind(id_sha256)
                .fetch_optional(pool)
                .await?)
        })
    }

    /// Notes that a session was used at `at_ms`.
    pub async fn touch_session(&self, id_sha256: &str, at_ms: i64) -> Result<(), StoreError> {
        on_pool!(self, pool, _dialect => {
            sqlx::query("UPDATE sessions SET last_seen_at_ms = $1 WHERE id_sha256 = $2 AND last_seen_at_ms < $1")
                .bind(at_ms)
                .bind(id_sha256)
                .execute(pool)
                .await?;
            Ok(())
        })
    }

    /// Ends a session; returns it if it existed.
    pub async fn delete_session(&self, id_sha256: &str) -> Result<Option<SessionRecord>, StoreError> {
        on_pool!(self, pool, _dialect => {
            Ok(sqlx::query_as(&format!("DELETE FROM sessions WHERE id_sha256 = $1 RETURNING {SESSION_COLUMNS}"))
                .bind(id_sha256)
                .fetch_optional(pool)
                .await?)
        })
    }

    /// Stores a one-time sign-in link for `user_id` (its secret's hash), replacing any link the user had; audited
    /// without the secret.
    pub async fn create_sign_in_link(
        &self,
        user_id: &str,
        secret_sha256: &str,
        expires_at_ms: i64,
        actor: &str,
    ) -> Result<(), StoreError> {
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let user: Option<(String,)> = sqlx::query_as("SELECT id FROM users WHERE id = $1")
                .bind(user_id)
                .fetch_optional(&mut *tx)
                .await?;
            if user.is_none() {
                return Err(StoreError::NotFound { what: format!("user {user_id}") });
            }
            sqlx::query("DELETE FROM sign_in_links WHERE user_id = $1").bind(user_id).execute(&mut *tx).await?;
            sqlx::query(
                "INSERT INTO sign_in_links (secret_sha256, user_id, created_at_ms, expires_at_ms) VALUES ($1, $2, $3, $4)",
            )
            .bind(secret_sha256)
            .bind(user_id)
            .bind(now_ms())
            .bind(expires_at_ms)
            .execute(&mut *tx)
            .await?;
            let after = serde_json::json!({ "expires_at_ms": expires_at_ms });
            audit_insert(&mut tx, actor, "user.sign_in_link", &format!("user/{user_id}"), None, Some(after.to_string())).await?;
            tx.commit().await?;
            Ok(())
        })
    }

    /// Takes a sign-in link: the user it signs in, if it exists and has not expired at `now_ms`. A link is taken
    /// once (deleted as it is read, so two racing uses get one user between them).
    pub async fn take_sign_in_link(&self, secret_sha256: &str, now_ms: i64) -> Result<Option<String>, StoreError> {
        on_pool!(self, pool, _dialect => {
            let row: Option<(String, i64)> = sqlx::query_as(
                "DELETE FROM sign_in_links WHERE secret_sha256 = $1 RETURNING user_id, expires_at_ms",
            )
            .bind(secret_sha256)
            .fetch_optional(pool)
            .await?;
            Ok(row.filter(|(_, expires)| *expires > now_ms).map(|(user, _)| user))
        })
    }

    /// Deletes sessions past their absolute expiry or idle since before `idle_before_ms`, login attempts
    /// started before `attempts_before_ms` and expired sign-in links. Returns how many sessions went.
    pub async fn purge_sign_in(
        &self,
        now_ms: i64,
        idle_before_ms: i64,
        attempts_before_ms: i64,
    ) -> Result<u64, StoreError> {
        on_pool!(self, pool, _dialect => {
            let gone = sqlx::query("DELETE FROM sessions WHERE expires_at_ms <= $1 OR last_seen_at_ms < $2")
                .bind(now_ms)
                .bind(idle_before_ms)
                .execute(pool)
                .await?
                .rows_affected();
            sqlx::query("DELETE FROM login_attempts WHERE created_at_ms < $1")
                .bind(attempts_before_ms)
                .execute(pool)
                .await?;
            sqlx::query("DELETE FROM sign_in_links WHERE expires_at_ms <= $1").bind(now_ms).execute(pool).await?;
            Ok(gone)
        })
    }

    /// Records a login on its way to the provider.
    pub async fn create_login_attempt(&self, attempt: &LoginAttempt) -> Result<(), StoreError> {
        on_pool!(self, pool, _dialect => {
            sqlx::query(
                "INSERT INTO login_attempts (state_sha256, browser_sha256, nonce, pkce_verifier, return_to, \
                 created_at_ms) VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(&attempt.state_sha256)
            .bind(&attempt.browser_sha256)
            .bind(&attempt.nonce)
            .bind(&attempt.pkce_verifier)
            .bind(&attempt.return_to)
            .bind(attempt.created_at_ms)
            .execute(pool)
            .await
            .map_err(|e| on_constraint(e, "login_attempts"))?;
            Ok(())
        })
    }

    /// Takes a login attempt by the SHA-256 of its `state` and of the browser's login secret: the first caller
    /// with both gets it, every later one (and anybody without the browser's secret) `None`.
    pub async fn take_login_attempt(
        &self,
        state_sha256: &str,
        browser_sha256: &str,
    ) -> Result<Option<LoginAttempt>, StoreError> {
        on_pool!(self, pool, _dialect => {
            Ok(sqlx::query_as(
                "DELETE FROM login_attempts WHERE state_sha256 = $1 AND browser_sha256 = $2 \
                 RETURNING state_sha256, browser_sha256, nonce, pkce_verifier, return_to, created_at_ms",
            )
            .bind(state_sha256)
            .bind(browser_sha256)
            .fetch_optional(pool)
            .await?)
        })
    }

    /// Issues a credential for a node (its secret's SHA-256 is given); returns the credential's id.
    pub async fn create_node_credential(
        &self,
        node_id: &str,
        secret_sha256: &str,
        actor: &str,
    ) -> Result<String, StoreError> {
        let id = new_id();
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let node: Option<(String,)> = sqlx::query_as("SELECT id FROM nodes WHERE id = $1")
                .bind(node_id)
                .fetch_optional(&mut *tx)
                .await?;
            if node.is_none() {
                return Err(StoreError::NotFound { what: format!("node {node_id}") });
            }
            sqlx::query(
                "INSERT INTO node_credentials (id, node_id, secret_sha256, created_at_ms) VALUES ($1, $2, $3, $4)",
            )
            .bind(&id)
            .bind(node_id)
            .bind(secret_sha256)
            .bind(now_ms())
            .execute(&mut *tx)
            .await
            .map_err(|e| on_constraint(e, "node_credentials"))?;
            let object = format!("node/{node_id}/credential/{id}");
            audit_insert(&mut tx, actor, "node.credential.create", &object, None, None).await?;
            tx.commit().await?;
            Ok(id)
        })
    }

    /// Revokes every credential of a node; returns how many were live.
    pub async fn revoke_node_credentials(&self, node_id: &str, actor: &str) -> Result<u64, StoreError> {
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let n = sqlx::query(
                "UPDATE node_credentials SET revoked_at_ms = $1 WHERE node_id = $2 AND revoked_at_ms IS NULL",
            )
            .bind(now_ms())
            .bind(node_id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            audit_insert(&mut tx, actor, "node.credential.revoke", &format!("node/{node_id}"), None, None).await?;
            tx.commit().await?;
            self.changes.node_credentials_revoked(node_id);
            Ok(n)
        })
    }

    /// The node a live credential belongs to.
    pub async fn node_by_credential(&self, secret_sha256: &str) -> Result<Option<NodePrincipal>, StoreError> {
        on_pool!(self, pool, _dialect => {
            let row: Option<(String, String)> = sqlx::query_as(
                "SELECT n.id, n.name FROM node_credentials c JOIN nodes n ON n.id = c.node_id \
                 WHERE c.secret_sha256 = $1 AND c.revoked_at_ms IS NULL",
            )
            .bind(secret_sha256)
            .fetch_optional(pool)
            .await?;
            Ok(row.map(|(node_id, node_name)| NodePrincipal { node_id, node_name }))
        })
    }
}
