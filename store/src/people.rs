//! Listing people and their API tokens, removing memberships and changing a tenant's approval policy.
//!
//! Also users, their tenant memberships and API tokens (only a SHA-256 of each token's secret is stored). One SQL
//! body for both backends (see [`super::dialect`]).

use tessera_core::quota::ApprovalPolicy;

use super::requests::TENANT_COLUMNS;
use super::writes::audit_insert;
use super::{
    Principal, Role, Store, StoreError, Tenant, TenantRow, User, UserRow, new_id, now_ms, on_constraint, role_from,
    tenant_from, to_json, user_from,
};

/// An API token as its owner may see it: never its secret or the secret's hash.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct TokenInfo {
    /// Token id.
    pub id: String,
    /// What it is for.
    pub name: String,
    /// UTC milliseconds.
    pub created_at_ms: i64,
    /// When it was revoked, UTC milliseconds.
    pub revoked_at_ms: Option<i64>,
}

/// The columns of a [`UserRow`] of table alias `u`.
const USER_FIELDS: &str = "u.id, u.name, u.platform_admin, u.created_at_ms";

/// A member of a tenant, with their role there.
#[derive(Debug, sqlx::FromRow)]
struct MemberRow {
    #[sqlx(flatten)]
    user: UserRow,
    role: String,
}

impl Store {
    /// Every user, by name.
    pub async fn users(&self) -> Result<Vec<User>, StoreError> {
        let sql = format!("SELECT {USER_FIELDS} FROM users u ORDER BY u.name");
        let rows: Vec<UserRow> = on_pool!(self, pool, _dialect => sqlx::query_as(&sql).fetch_all(pool).await?);
        Ok(rows.into_iter().map(user_from).collect())
    }

    /// A user's API tokens, revoked ones included, newest first.
    pub async fn tokens(&self, user_id: &str) -> Result<Vec<TokenInfo>, StoreError> {
        let sql = "SELECT id, name, created_at_ms, revoked_at_ms FROM api_tokens WHERE user_id = $1 \
                   ORDER BY created_at_ms DESC, id DESC";
        Ok(on_pool!(self, pool, _dialect => sqlx::query_as(sql).bind(user_id).fetch_all(pool).await?))
    }

    /// Removes a user from a tenant (whether the membership was set by hand or mapped from the identity provider,
    /// which maps it again at the user's next sign-in if the provider still says so). `NotFound` when the user is
    /// not a member.
    pub async fn remove_membership(&self, user_id: &str, tenant_id: &str, actor: &str) -> Result<(), StoreError> {
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let row: Option<(String, String)> =
                sqlx::query_as(&format!(
                "SELECT role, source FROM memberships WHERE user_id = $1 AND tenant_id = $2{}",
                dialect.lock()
            ))
                    .bind(user_id)
                    .bind(tenant_id)
                    .fetch_optional(&mut *tx)
                    .await?;
            let Some((role, source)) = row else {
                return Err(StoreError::NotFound { what: format!("member {user_id} of tenant {tenant_id}") });
            };
            sqlx::query("DELETE FROM memberships WHERE user_id = $1 AND tenant_id = $2")
                .bind(user_id)
                .bind(tenant_id)
                .execute(&mut *tx)
                .await?;
            let before = serde_json::json!({ "role": role_from(&role)?.as_str(), "source": source }).to_string();
            let object = format!("tenant/{tenant_id}/member/{user_id}");
            audit_insert(&mut tx, actor, "membership.remove", &object, Some(before), None).await?;
            tx.commit().await?;
            Ok(())
        })
    }

    /// Replaces a tenant's approval policy; returns the tenant as it is now.
    pub async fn set_policy(&self, tenant_id: &str, policy: ApprovalPolicy, actor: &str) -> Result<Tenant, StoreError> {
        let max = i64::from(policy.auto_approve_max_compute_slices);
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let read = format!("SELECT {TENANT_COLUMNS} WHERE id = $1");
            let locked = format!("{read}{}", dialect.lock());
            let row: Option<TenantRow> = sqlx::query_as(&locked).bind(tenant_id).fetch_optional(&mut *tx).await?;
            let before = tenant_from(row.ok_or_else(|| StoreError::NotFound { what: format!("tenant {tenant_id}") })?);
            sqlx::query("UPDATE tenants SET auto_approve = $1, auto_approve_max_compute_slices = $2 WHERE id = $3")
                .bind(policy.auto_approve)
                .bind(max)
                .bind(tenant_id)
                .execute(&mut *tx)
                .await?;
            let row: TenantRow = sqlx::query_as(&read).bind(tenant_id).fetch_one(&mut *tx).await?;
            let after = tenant_from(row);
            let object = format!("tenant/{tenant_id}");
            audit_insert(&mut tx, actor, "tenant.policy", &object, Some(to_json(&before)), Some(to_json(&after))).await?;
            tx.commit().await?;
            Ok(after)
        })
    }

    /// Creates a user.
    pub async fn create_user(&self, name: &str, platform_admin: bool, actor: &str) -> Result<User, StoreError> {
        let u = User { id: new_id(), name: name.to_string(), platform_admin, created_at_ms: now_ms() };
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            sqlx::query("INSERT INTO users (id, name, platform_admin, created_at_ms) VALUES ($1, $2, $3, $4)")
                .bind(&u.id)
                .bind(&u.name)
                .bind(u.platform_admin)
                .bind(u.created_at_ms)
                .execute(&mut *tx)
                .await
                .map_err(|e| on_constraint(e, "users.name"))?;
            audit_insert(&mut tx, actor, "user.create", &format!("user/{}", u.id), None, Some(to_json(&u))).await?;
            tx.commit().await?;
        });
        Ok(u)
    }

    /// A user by name.
    pub async fn user_by_name(&self, name: &str) -> Result<User, StoreError> {
        let sql = format!("SELECT {USER_FIELDS} FROM users u WHERE u.name = $1");
        let row: Option<UserRow> =
            on_pool!(self, pool, _dialect => sqlx::query_as(&sql).bind(name).fetch_optional(pool).await?);
        row.map(user_from).ok_or_else(|| StoreError::NotFound { what: format!("user {name}") })
    }

    /// Adds (or changes) a user's membership of a tenant.
    pub async fn set_membership(
        &self,
        user_id: &str,
        tenant_id: &str,
        role: Role,
        actor: &str,
    ) -> Result<(), StoreError> {
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            sqlx::query(
                "INSERT INTO memberships (user_id, tenant_id, role) VALUES ($1, $2, $3) \
                 ON CONFLICT (user_id, tenant_id) DO UPDATE SET role = excluded.role",
            )
            .bind(user_id)
            .bind(tenant_id)
            .bind(role.as_str())
            .execute(&mut *tx)
            .await
            .map_err(|e| on_constraint(e, "memberships"))?;
            let object = format!("tenant/{tenant_id}/member/{user_id}");
            let after = Some(format!("\"{}\"", role.as_str()));
            audit_insert(&mut tx, actor, "membership.set", &object, None, after).await?;
            tx.commit().await?;
        });
        Ok(())
    }

    /// A tenant's members `(user, role)`, by name.
    pub async fn members(&self, tenant_id: &str) -> Result<Vec<(User, Role)>, StoreError> {
        let sql = format!(
            "SELECT {USER_FIELDS}, m.role FROM memberships m JOIN users u ON u.id = m.user_id \
             WHERE m.tenant_id = $1 ORDER BY u.name"
        );
        let rows: Vec<MemberRow> =
            on_pool!(self, pool, _dialect => sqlx::query_as(&sql).bind(tenant_id).fetch_all(pool).await?);
        rows.into_iter().map(|r| Ok((user_from(r.user), role_from(&r.role)?))).collect()
    }

    /// Stores an API token for a user: only the SHA-256 of its secret.
    pub async fn create_token(
        &self,
        user_id: &str,
        name: &str,
        secret_sha256: &str,
        actor: &str,
    ) -> Result<String, StoreError> {
        let id = new_id();
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            sqlx::query(
                "INSERT INTO api_tokens (id, user_id, name, secret_sha256, created_at_ms) VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(&id)
            .bind(user_id)
            .bind(name)
            .bind(secret_sha256)
            .bind(now_ms())
            .execute(&mut *tx)
            .await
            .map_err(|e| on_constraint(e, "api_tokens"))?;
            audit_insert(&mut tx, actor, "token.create", &format!("user/{user_id}/token/{id}"), None, None).await?;
            tx.commit().await?;
        });
        Ok(id)
    }

    /// Revokes a token. With `owner`, only that user's token matches (others get `NotFound`).
    pub async fn revoke_token(&self, id: &str, owner: Option<&str>, actor: &str) -> Result<(), StoreError> {
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let done = sqlx::query(
                "UPDATE api_tokens SET revoked_at_ms = $1 WHERE id = $2 AND revoked_at_ms IS NULL \
                 AND (CAST($3 AS TEXT) IS NULL OR user_id = CAST($3 AS TEXT))",
            )
            .bind(now_ms())
            .bind(id)
            .bind(owner)
            .execute(&mut *tx)
            .await?;
            if done.rows_affected() == 0 {
                return Err(StoreError::NotFound { what: format!("token {id}") });
            }
            audit_insert(&mut tx, actor, "token.revoke", &format!("token/{id}"), None, None).await?;
            tx.commit().await?;
        });
        Ok(())
    }

    /// The principal behind a token's secret hash, unless unknown or revoked.
    pub async fn principal_by_token(&self, secret_sha256: &str) -> Result<Option<Principal>, StoreError> {
        let sql = format!(
            "SELECT {USER_FIELDS} FROM api_tokens t JOIN users u ON u.id = t.user_id \
             WHERE t.secret_sha256 = $1 AND t.revoked_at_ms IS NULL"
        );
        let memberships = "SELECT tenant_id, role FROM memberships WHERE user_id = $1";
        let (row, rows): (Option<UserRow>, Vec<(String, String)>) = on_pool!(self, pool, _dialect => {
            let row: Option<UserRow> = sqlx::query_as(&sql).bind(secret_sha256).fetch_optional(pool).await?;
            let Some(user) = &row else { return Ok(None) };
            (row.clone(), sqlx::query_as(memberships).bind(&user.id).fetch_all(pool).await?)
        });
        let Some(user) = row.map(user_from) else { return Ok(None) };
        let memberships = rows.into_iter().map(|(t, r)| Ok((t, role_from(&r)?))).collect::<Result<_, StoreError>>()?;
        Ok(Some(Principal { user, memberships }))
    }
}
