//! Listing people and their API tokens, removing memberships and changing a tenant's approval policy.
//!
//! The SQL is the same on both backends; [`Dialect::ms`] spells what differs (see [`on_pool!`]).

use tessera_core::quota::ApprovalPolicy;

use super::auth::Dialect;
use super::{Db, Role, Store, StoreError, Tenant, TenantRow, User, UserRow, tenant_from, to_json, user_from};

/// An API token as its owner may see it: never its secret or the secret's hash.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// The tenant columns of a [`TenantRow`].
fn tenant_columns(dialect: Dialect) -> String {
    format!(
        "id, name, auto_approve, CAST(auto_approve_max_compute_slices AS BIGINT), {} FROM tenants",
        dialect.ms("created_at")
    )
}

impl Store {
    /// Every user, by name.
    pub async fn users(&self) -> Result<Vec<User>, StoreError> {
        on_pool!(self, pool, dialect, _audit => {
            let rows: Vec<UserRow> = sqlx::query_as(&format!(
                "SELECT id, name, platform_admin, {} FROM users ORDER BY name",
                dialect.ms("created_at")
            ))
            .fetch_all(pool)
            .await?;
            Ok(rows.into_iter().map(user_from).collect())
        })
    }

    /// A user's API tokens, revoked ones included, newest first.
    pub async fn tokens(&self, user_id: &str) -> Result<Vec<TokenInfo>, StoreError> {
        on_pool!(self, pool, dialect, _audit => {
            let rows: Vec<(String, String, i64, Option<i64>)> = sqlx::query_as(&format!(
                "SELECT id, name, {created}, {revoked} FROM api_tokens WHERE user_id = $1 \
                 ORDER BY {created} DESC, id DESC",
                created = dialect.ms("created_at"),
                revoked = dialect.ms("revoked_at"),
            ))
            .bind(user_id)
            .fetch_all(pool)
            .await?;
            Ok(rows
                .into_iter()
                .map(|(id, name, created_at_ms, revoked_at_ms)| TokenInfo { id, name, created_at_ms, revoked_at_ms })
                .collect())
        })
    }

    /// Removes a user from a tenant (whether the membership was set by hand or mapped from the identity provider,
    /// which maps it again at the user's next sign-in if the provider still says so). `NotFound` when the user is
    /// not a member.
    pub async fn remove_membership(&self, user_id: &str, tenant_id: &str, actor: &str) -> Result<(), StoreError> {
        on_pool!(self, pool, dialect, audit => {
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
            let before = serde_json::json!({ "role": Role::parse(&role)?.as_str(), "source": source }).to_string();
            let object = format!("tenant/{tenant_id}/member/{user_id}");
            audit(&mut tx, actor, "membership.remove", &object, Some(before), None).await?;
            tx.commit().await?;
            Ok(())
        })
    }

    /// Replaces a tenant's approval policy; returns the tenant as it is now.
    pub async fn set_policy(&self, tenant_id: &str, policy: ApprovalPolicy, actor: &str) -> Result<Tenant, StoreError> {
        let max = i32::try_from(policy.auto_approve_max_compute_slices).unwrap_or(i32::MAX);
        on_pool!(self, pool, dialect, audit => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let read = format!("SELECT {} WHERE id = $1", tenant_columns(dialect));
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
            audit(&mut tx, actor, "tenant.policy", &object, Some(to_json(&before)), Some(to_json(&after))).await?;
            tx.commit().await?;
            Ok(after)
        })
    }
}
