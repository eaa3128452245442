//! The PostgreSQL store. Writes that check before they insert lock the tenant's row first (`SELECT ... FOR
//! UPDATE`), so all writers for one tenant serialise while other tenants proceed. Times are `timestamptz`, converted
//! to and from UTC milliseconds in SQL; JSON is `jsonb`.

use std::time::Duration;

use sqlx::PgPool;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnection, PgPoolOptions};
use tessera_core::quota::{ApprovalPolicy, Usage};

use super::{
    AuditEntry, AuditRow, Principal, RequestFilter, RequestRow, Role, SliceRequest, StoreError, Tenant, TenantRow,
    Transition, User, UserRow, audit_from, expiry, now_ms, on_constraint, request_from, tenant_from, to_json,
    usage_from_rows, user_from,
};

pub(super) static MIGRATOR: Migrator = sqlx::migrate!("../migrations/postgres");

/// `timestamptz` from UTC milliseconds bound as `$n`.
const TS: &str = "to_timestamp($N::double precision / 1000.0)";
/// UTC milliseconds from a `timestamptz` column.
fn ms(column: &str) -> String {
    format!("(extract(epoch from {column}) * 1000)::bigint")
}
fn ts(n: usize) -> String {
    TS.replace("$N", &format!("${n}"))
}

pub(super) async fn connect(url: &str) -> Result<PgPool, StoreError> {
    Ok(PgPoolOptions::new().max_connections(16).acquire_timeout(Duration::from_secs(30)).connect(url).await?)
}

pub(super) async fn audit_insert(
    conn: &mut PgConnection,
    actor: &str,
    action: &str,
    object: &str,
    before: Option<String>,
    after: Option<String>,
) -> Result<(), StoreError> {
    sqlx::query(&format!(
        "INSERT INTO audit_log (at, actor, action, object, before_json, after_json) \
         VALUES ({}, $2, $3, $4, $5::jsonb, $6::jsonb)",
        ts(1)
    ))
    .bind(now_ms())
    .bind(actor)
    .bind(action)
    .bind(object)
    .bind(before)
    .bind(after)
    .execute(conn)
    .await?;
    Ok(())
}

pub(super) async fn create_tenant(pool: &PgPool, t: &Tenant, actor: &str) -> Result<(), StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query(&format!(
        "INSERT INTO tenants (id, name, auto_approve, auto_approve_max_compute_slices, created_at) \
         VALUES ($1, $2, $3, $4, {})",
        ts(5)
    ))
    .bind(&t.id)
    .bind(&t.name)
    .bind(t.policy.auto_approve)
    .bind(i32::try_from(t.policy.auto_approve_max_compute_slices).unwrap_or(i32::MAX))
    .bind(t.created_at_ms)
    .execute(&mut *tx)
    .await
    .map_err(|e| on_constraint(e, "tenants.name"))?;
    audit_insert(&mut tx, actor, "tenant.create", &format!("tenant/{}", t.id), None, Some(to_json(t))).await?;
    tx.commit().await?;
    Ok(())
}

pub(super) async fn tenant(pool: &PgPool, id: &str) -> Result<Tenant, StoreError> {
    let row: Option<(String, String, bool, i32, i64)> = sqlx::query_as(&format!(
        "SELECT id, name, auto_approve, auto_approve_max_compute_slices, {} FROM tenants WHERE id = $1",
        ms("created_at")
    ))
    .bind(id)
    .fetch_optional(pool)
    .await?;
    let (id, name, auto_approve, max, created_at_ms) =
        row.ok_or_else(|| StoreError::NotFound { what: format!("tenant {id}") })?;
    let policy = ApprovalPolicy { auto_approve, auto_approve_max_compute_slices: u32::try_from(max).unwrap_or(0) };
    Ok(Tenant { id, name, policy, created_at_ms })
}

pub(super) async fn set_quotas(
    pool: &PgPool,
    tenant_id: &str,
    limits: &[(String, Option<i64>)],
    actor: &str,
) -> Result<(), StoreError> {
    let mut tx = pool.begin().await?;
    for (resource, limit) in limits {
        let before: Option<i64> =
            sqlx::query_scalar("SELECT limit_milli FROM quotas WHERE tenant_id = $1 AND resource = $2")
                .bind(tenant_id)
                .bind(resource)
                .fetch_optional(&mut *tx)
                .await?;
        let object = format!("tenant/{tenant_id}/quota/{resource}");
        let before_json = before.map(|b| format!("{{\"limit_milli\":{b}}}"));
        match limit {
            Some(limit) => {
                sqlx::query(
                    "INSERT INTO quotas (tenant_id, resource, limit_milli) VALUES ($1, $2, $3) \
                     ON CONFLICT (tenant_id, resource) DO UPDATE SET limit_milli = excluded.limit_milli",
                )
                .bind(tenant_id)
                .bind(resource)
                .bind(limit)
                .execute(&mut *tx)
                .await
                .map_err(|e| on_constraint(e, "quotas"))?;
                let after = Some(format!("{{\"limit_milli\":{limit}}}"));
                audit_insert(&mut tx, actor, "quota.set", &object, before_json, after).await?;
            }
            // Removing a limit that is not there is a no-op, and not audited.
            None if before.is_none() => {}
            None => {
                sqlx::query("DELETE FROM quotas WHERE tenant_id = $1 AND resource = $2")
                    .bind(tenant_id)
                    .bind(resource)
                    .execute(&mut *tx)
                    .await?;
                audit_insert(&mut tx, actor, "quota.remove", &object, before_json, None).await?;
            }
        }
    }
    tx.commit().await?;
    Ok(())
}

async fn quotas_in(conn: &mut PgConnection, tenant_id: &str) -> Result<Usage, StoreError> {
    let rows: Vec<(String, i64)> = sqlx::query_as("SELECT resource, limit_milli FROM quotas WHERE tenant_id = $1")
        .bind(tenant_id)
        .fetch_all(conn)
        .await?;
    usage_from_rows(rows)
}

async fn held_in(conn: &mut PgConnection, tenant_id: &str) -> Result<Usage, StoreError> {
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT resource, held_milli FROM tenant_usage WHERE tenant_id = $1 AND held_milli > 0")
            .bind(tenant_id)
            .fetch_all(conn)
            .await?;
    usage_from_rows(rows)
}

/// Adds (`sign` 1) or takes back (`sign` -1) a request's charges in its tenant's running usage.
pub(super) async fn adjust_usage(
    conn: &mut PgConnection,
    tenant_id: &str,
    request_id: &str,
    sign: i64,
) -> Result<(), StoreError> {
    // In byte order of resource, as batches write them, so two writers never take a tenant's usage rows in
    // opposite orders (a deadlock).
    let charges: Vec<(String, i64)> = sqlx::query_as(
        "SELECT resource, amount_milli FROM request_charges WHERE request_id = $1 ORDER BY resource COLLATE \"C\"",
    )
    .bind(request_id)
    .fetch_all(&mut *conn)
    .await?;
    for (resource, amount) in charges {
        sqlx::query(
            "INSERT INTO tenant_usage (tenant_id, resource, held_milli) VALUES ($1, $2, $3) \
             ON CONFLICT (tenant_id, resource) DO UPDATE SET held_milli = tenant_usage.held_milli + excluded.held_milli",
        )
        .bind(tenant_id)
        .bind(resource)
        .bind(sign * amount)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

pub(super) async fn quotas(pool: &PgPool, tenant_id: &str) -> Result<Usage, StoreError> {
    quotas_in(&mut *pool.acquire().await?, tenant_id).await
}

pub(super) async fn held(pool: &PgPool, tenant_id: &str) -> Result<Usage, StoreError> {
    held_in(&mut *pool.acquire().await?, tenant_id).await
}

pub(super) async fn create_request(
    pool: &PgPool,
    r: &SliceRequest,
    charge: &Usage,
    actor: &str,
    idempotency: Option<(&str, &str)>,
) -> Result<Option<SliceRequest>, StoreError> {
    let mut tx = pool.begin().await?;
    let locked: Option<(i32,)> = sqlx::query_as("SELECT 1 FROM tenants WHERE id = $1 FOR UPDATE")
        .bind(&r.tenant_id)
        .fetch_optional(&mut *tx)
        .await?;
    if locked.is_none() {
        return Err(StoreError::NotFound { what: format!("tenant {}", r.tenant_id) });
    }
    // Under the tenant's lock, so two retries with one key cannot both create.
    if let Some((user, key)) = idempotency {
        let first: Option<(String,)> =
            sqlx::query_as("SELECT request_id FROM idempotency_keys WHERE user_id = $1 AND key = $2")
                .bind(user)
                .bind(key)
                .fetch_optional(&mut *tx)
                .await?;
        if let Some((id,)) = first {
            return Ok(Some(request_in(&mut tx, &id, false).await?));
        }
    }
    if r.state.holds_quota() {
        let limits = quotas_in(&mut tx, &r.tenant_id).await?;
        let held = held_in(&mut tx, &r.tenant_id).await?;
        tessera_core::quota::check(&limits, &held, charge).map_err(StoreError::Quota)?;
    }
    sqlx::query(&format!(
        "INSERT INTO slice_requests (id, tenant_id, spec, count, state, reason, version, created_at, updated_at, \
         duration_s) VALUES ($1, $2, $3::jsonb, $4, $5, $6, $7, {}, {}, $10)",
        ts(8),
        ts(9)
    ))
    .bind(&r.id)
    .bind(&r.tenant_id)
    .bind(to_json(&r.spec))
    .bind(i32::try_from(r.count).unwrap_or(i32::MAX))
    .bind(r.state.as_str())
    .bind(&r.reason)
    .bind(r.version)
    .bind(r.created_at_ms)
    .bind(r.updated_at_ms)
    .bind(r.duration_s.and_then(|d| i64::try_from(d).ok()))
    .execute(&mut *tx)
    .await?;
    for (resource, amount) in charge {
        sqlx::query("INSERT INTO request_charges (request_id, resource, amount_milli) VALUES ($1, $2, $3)")
            .bind(&r.id)
            .bind(resource.to_string())
            .bind(i64::try_from(*amount).unwrap_or(i64::MAX))
            .execute(&mut *tx)
            .await?;
    }
    if r.state.holds_quota() {
        adjust_usage(&mut tx, &r.tenant_id, &r.id, 1).await?;
    }
    if let Some((user, key)) = idempotency {
        sqlx::query("INSERT INTO idempotency_keys (user_id, key, request_id) VALUES ($1, $2, $3)")
            .bind(user)
            .bind(key)
            .bind(&r.id)
            .execute(&mut *tx)
            .await
            .map_err(|e| on_constraint(e, "idempotency_keys"))?;
    }
    audit_insert(&mut tx, actor, "request.create", &format!("request/{}", r.id), None, Some(to_json(r))).await?;
    tx.commit().await?;
    Ok(None)
}

fn request_columns() -> String {
    format!(
        "id, tenant_id, spec::text, count::bigint, state, reason, version, {}, {}, duration_s, {} FROM slice_requests",
        ms("created_at"),
        ms("updated_at"),
        ms("expires_at")
    )
}

async fn request_in(conn: &mut PgConnection, id: &str, lock: bool) -> Result<SliceRequest, StoreError> {
    let row: Option<RequestRow> =
        sqlx::query_as(&format!("SELECT {} WHERE id = $1{}", request_columns(), if lock { " FOR UPDATE" } else { "" }))
            .bind(id)
            .fetch_optional(conn)
            .await?;
    request_from(row.ok_or_else(|| StoreError::NotFound { what: format!("request {id}") })?)
}

pub(super) async fn request(pool: &PgPool, id: &str) -> Result<SliceRequest, StoreError> {
    request_in(&mut *pool.acquire().await?, id, false).await
}

pub(super) async fn transition(pool: &PgPool, t: Transition<'_>) -> Result<SliceRequest, StoreError> {
    let mut tx = pool.begin().await?;
    let before = request_in(&mut tx, t.id, true).await?;
    if t.expected_version.is_some_and(|v| v != before.version) {
        return Err(StoreError::Conflict { constraint: "version".to_string() });
    }
    let state = before.state.transition(t.to)?;
    let now = now_ms();
    let after = SliceRequest {
        state,
        reason: t.reason.map_or_else(|| before.reason.clone(), str::to_string),
        version: before.version + 1,
        updated_at_ms: now,
        expires_at_ms: expiry(state, before.duration_s, now, before.expires_at_ms),
        ..before.clone()
    };
    sqlx::query(&format!(
        "UPDATE slice_requests SET state = $1, reason = $2, version = $3, updated_at = {}, expires_at = {} WHERE id = $5",
        ts(4),
        ts(6)
    ))
    .bind(after.state.as_str())
    .bind(&after.reason)
    .bind(after.version)
    .bind(after.updated_at_ms)
    .bind(&after.id)
    .bind(after.expires_at_ms)
    .execute(&mut *tx)
    .await?;
    if after.state.is_terminal() {
        release_allocations(&mut tx, &after.id).await?;
        if before.state.holds_quota() {
            adjust_usage(&mut tx, &after.tenant_id, &after.id, -1).await?;
        }
    }
    let action = format!("request.{}", after.state);
    let object = format!("request/{}", after.id);
    audit_insert(&mut tx, t.actor, &action, &object, Some(to_json(&before)), Some(to_json(&after))).await?;
    tx.commit().await?;
    Ok(after)
}

pub(super) async fn audit(pool: &PgPool, object: &str) -> Result<Vec<AuditEntry>, StoreError> {
    let rows: Vec<AuditRow> = sqlx::query_as(&format!(
        "SELECT {}, actor, action, object, before_json::text, after_json::text FROM audit_log \
         WHERE object = $1 ORDER BY id",
        ms("at")
    ))
    .bind(object)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(audit_from).collect())
}

pub(super) async fn create_user(pool: &PgPool, u: &User, actor: &str) -> Result<(), StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query(&format!("INSERT INTO users (id, name, platform_admin, created_at) VALUES ($1, $2, $3, {})", ts(4)))
        .bind(&u.id)
        .bind(&u.name)
        .bind(u.platform_admin)
        .bind(u.created_at_ms)
        .execute(&mut *tx)
        .await
        .map_err(|e| on_constraint(e, "users.name"))?;
    audit_insert(&mut tx, actor, "user.create", &format!("user/{}", u.id), None, Some(to_json(u))).await?;
    tx.commit().await?;
    Ok(())
}

pub(super) async fn user_by_name(pool: &PgPool, name: &str) -> Result<User, StoreError> {
    let row: Option<UserRow> =
        sqlx::query_as(&format!("SELECT id, name, platform_admin, {} FROM users WHERE name = $1", ms("created_at")))
            .bind(name)
            .fetch_optional(pool)
            .await?;
    row.map(user_from).ok_or_else(|| StoreError::NotFound { what: format!("user {name}") })
}

pub(super) async fn set_membership(
    pool: &PgPool,
    user_id: &str,
    tenant_id: &str,
    role: Role,
    actor: &str,
) -> Result<(), StoreError> {
    let mut tx = pool.begin().await?;
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
    audit_insert(&mut tx, actor, "membership.set", &object, None, Some(format!("\"{}\"", role.as_str()))).await?;
    tx.commit().await?;
    Ok(())
}

pub(super) async fn create_token(
    pool: &PgPool,
    id: &str,
    user_id: &str,
    name: &str,
    secret_sha256: &str,
    actor: &str,
) -> Result<(), StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query(&format!(
        "INSERT INTO api_tokens (id, user_id, name, secret_sha256, created_at) VALUES ($1, $2, $3, $4, {})",
        ts(5)
    ))
    .bind(id)
    .bind(user_id)
    .bind(name)
    .bind(secret_sha256)
    .bind(now_ms())
    .execute(&mut *tx)
    .await
    .map_err(|e| on_constraint(e, "api_tokens"))?;
    audit_insert(&mut tx, actor, "token.create", &format!("user/{user_id}/token/{id}"), None, None).await?;
    tx.commit().await?;
    Ok(())
}

pub(super) async fn principal_by_token(pool: &PgPool, secret_sha256: &str) -> Result<Option<Principal>, StoreError> {
    let row: Option<UserRow> = sqlx::query_as(&format!(
        "SELECT u.id, u.name, u.platform_admin, {} FROM api_tokens t JOIN users u ON u.id = t.user_id \
         WHERE t.secret_sha256 = $1 AND t.revoked_at IS NULL",
        ms("u.created_at")
    ))
    .bind(secret_sha256)
    .fetch_optional(pool)
    .await?;
    let Some(user) = row.map(user_from) else { return Ok(None) };
    let rows: Vec<(String, String)> = sqlx::query_as("SELECT tenant_id, role FROM memberships WHERE user_id = $1")
        .bind(&user.id)
        .fetch_all(pool)
        .await?;
    let memberships = rows.into_iter().map(|(t, r)| Ok((t, Role::parse(&r)?))).collect::<Result<_, StoreError>>()?;
    Ok(Some(Principal { user, memberships }))
}

pub(super) async fn list_requests(pool: &PgPool, f: RequestFilter<'_>) -> Result<Vec<SliceRequest>, StoreError> {
    let (conditions, values) = f.conditions();
    // The limit is bound, not spliced in, so every page size shares one prepared statement.
    let sql = format!("SELECT {} WHERE TRUE{conditions} ORDER BY id LIMIT ${}", request_columns(), values.len() + 1);
    let mut query = sqlx::query_as::<_, RequestRow>(&sql);
    for v in values {
        query = query.bind(v);
    }
    query.bind(i64::from(f.limit)).fetch_all(pool).await?.into_iter().map(request_from).collect()
}
pub(super) mod batch;
pub(super) mod fleet;
pub(super) mod layouts;

pub(super) async fn revoke_token(pool: &PgPool, id: &str, owner: Option<&str>, actor: &str) -> Result<(), StoreError> {
    let mut tx = pool.begin().await?;
    let done = sqlx::query(&format!("UPDATE api_tokens SET revoked_at = {} WHERE id = $2 AND revoked_at IS NULL AND ($3::text IS NULL OR user_id = $3::text)", ts(1)))
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
    Ok(())
}

pub(super) async fn tenants(pool: &PgPool) -> Result<Vec<Tenant>, StoreError> {
    let rows: Vec<TenantRow> = sqlx::query_as(&format!(
        "SELECT id, name, auto_approve, auto_approve_max_compute_slices::bigint, {} FROM tenants ORDER BY name",
        ms("created_at")
    ))
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(tenant_from).collect())
}

pub(super) async fn members(pool: &PgPool, tenant_id: &str) -> Result<Vec<(User, Role)>, StoreError> {
    let rows: Vec<(String, String, bool, i64, String)> = sqlx::query_as(&format!(
        "SELECT u.id, u.name, u.platform_admin, {}, m.role FROM memberships m \
         JOIN users u ON u.id = m.user_id WHERE m.tenant_id = $1 ORDER BY u.name",
        ms("u.created_at")
    ))
    .bind(tenant_id)
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|(id, name, admin, at, role)| Ok((user_from((id, name, admin, at)), Role::parse(&role)?)))
        .collect()
}

/// Gives back the instances a request held, when it ends (released, cancelled, rejected, expired, failed).
pub(super) async fn release_allocations(conn: &mut PgConnection, request_id: &str) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE allocations SET state = 'released', released_at_ms = $2 \
         WHERE request_id = $1 AND state IN ('reserved', 'active')",
    )
    .bind(request_id)
    .bind(super::now_ms())
    .execute(conn)
    .await?;
    Ok(())
}

pub(super) async fn due_requests(pool: &PgPool, now: i64) -> Result<Vec<(String, i64)>, StoreError> {
    Ok(sqlx::query_as(&format!(
        "SELECT id, version FROM slice_requests WHERE state = 'active' AND expires_at <= {}",
        ts(1)
    ))
    .bind(now)
    .fetch_all(pool)
    .await?)
}
