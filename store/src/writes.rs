//! Writes that several objects' transactions share: the audit entry every change writes and the event it tells of
//! (the outbox), a request read and locked for a change and its new state written back, the running usage its
//! charges move, and the instances it gives back when it ends. Each runs in the caller's transaction ([`Conn`]),
//! one SQL body for both backends (see [`super::dialect`]).
//!
//! Requests, layouts, reservations, cohorts and the rest take these from here, so that none of them imports
//! another object's module for them.

use serde::Deserialize;
use tessera_core::event;

use super::dialect::Conn;
use super::{RequestRow, SliceRequest, StoreError, new_id, now_ms, request_from, to_json};

/// The columns of a [`RequestRow`].
macro_rules! request_fields {
    () => {
        "id, tenant_id, CAST(spec AS TEXT) AS spec, count, state, reason, version, created_at_ms, updated_at_ms, \
         duration_s, expires_at_ms, priority, borrowed, reclaim_at_ms, reclaim_for"
    };
}

/// The columns of a [`RequestRow`].
pub(super) const REQUEST_FIELDS: &str = request_fields!();
/// The columns of a [`RequestRow`], and the table.
pub(super) const REQUEST_COLUMNS: &str = concat!(request_fields!(), " FROM slice_requests");
/// The same columns as SQLite's `json_array` takes them ([`super::json_rows`]).
pub(super) const REQUEST_JSON: &str = "id, tenant_id, spec, count, state, reason, version, created_at_ms, \
                                       updated_at_ms, duration_s, expires_at_ms, priority, borrowed, reclaim_at_ms, \
                                       reclaim_for";

/// Writes an audit entry, and the event it tells of if any (see [`event_insert`]), in the caller's transaction.
pub(super) async fn audit_insert<'c>(
    conn: impl Into<Conn<'c>>,
    actor: &str,
    action: &str,
    object: &str,
    before: Option<String>,
    after: Option<String>,
) -> Result<(), StoreError> {
    on_conn!(conn.into(), conn, dialect => {
        sqlx::query(&format!(
            "INSERT INTO audit_log (at_ms, actor, action, object, before_json, after_json) \
             VALUES ($1, $2, $3, $4, {}, {})",
            dialect.json(5),
            dialect.json(6)
        ))
        .bind(now_ms())
        .bind(actor)
        .bind(action)
        .bind(object)
        .bind(before.as_deref())
        .bind(after.as_deref())
        .execute(&mut *conn)
        .await?;
        // The event the change tells of, if any: in the same transaction (the outbox).
        event_insert(&mut *conn, actor, action, object, before.as_deref(), after.as_deref()).await?;
    });
    Ok(())
}

/// The tenant a record names (`tenant_id`), if it has one.
#[derive(Deserialize)]
struct TenantOf {
    #[serde(default)]
    tenant_id: Option<String>,
}

fn tenant_of(json: Option<&str>) -> Option<String> {
    serde_json::from_str::<TenantOf>(json?).ok()?.tenant_id
}

/// The event an audit entry tells of, if any: `(id, type, tenant, data)`.
pub(super) fn event_of(
    actor: &str,
    action: &str,
    before: Option<&str>,
    after: Option<&str>,
) -> Option<(String, &'static str, Option<String>, String)> {
    let kind = event::from_audit(action, actor)?;
    let tenant = tenant_of(after).or_else(|| tenant_of(before));
    let data = format!(
        "{{\"actor\":{},\"action\":{},\"before\":{},\"after\":{}}}",
        to_json(&actor),
        to_json(&action),
        before.unwrap_or("null"),
        after.unwrap_or("null")
    );
    Some((new_id(), kind, tenant, data))
}

/// Writes the event an audit entry tells of, if any, in the caller's transaction.
pub(super) async fn event_insert<'c>(
    conn: impl Into<Conn<'c>>,
    actor: &str,
    action: &str,
    object: &str,
    before: Option<&str>,
    after: Option<&str>,
) -> Result<(), StoreError> {
    let Some((id, kind, tenant, data)) = event_of(actor, action, before, after) else { return Ok(()) };
    on_conn!(conn.into(), conn, dialect => {
        sqlx::query(&format!(
            "INSERT INTO events (id, type, tenant_id, subject, at_ms, data) VALUES ($1, $2, $3, $4, $5, {})",
            dialect.json(6)
        ))
        .bind(&id)
        .bind(kind)
        .bind(tenant)
        .bind(object)
        .bind(now_ms())
        .bind(data)
        .execute(&mut *conn)
        .await?;
    });
    Ok(())
}

/// Writes an event no audit entry tells of (a node's report, a sweep's finding), in the caller's transaction.
pub(super) async fn system_event<'c>(
    conn: impl Into<Conn<'c>>,
    kind: &'static str,
    tenant: Option<&str>,
    subject: &str,
    actor: &str,
    after: serde_json::Value,
) -> Result<(), StoreError> {
    debug_assert!(event::is_type(kind), "{kind}");
    let data = serde_json::json!({ "actor": actor, "action": kind, "before": null, "after": after });
    on_conn!(conn.into(), conn, dialect => {
        sqlx::query(&format!(
            "INSERT INTO events (id, type, tenant_id, subject, at_ms, data) VALUES ($1, $2, $3, $4, $5, {})",
            dialect.json(6)
        ))
        .bind(new_id())
        .bind(kind)
        .bind(tenant)
        .bind(subject)
        .bind(now_ms())
        .bind(data.to_string())
        .execute(&mut *conn)
        .await?;
    });
    Ok(())
}

/// A request by id; `lock` locks its row on PostgreSQL (inside a writing transaction).
pub(super) async fn request_in<'c>(
    conn: impl Into<Conn<'c>>,
    id: &str,
    lock: bool,
) -> Result<SliceRequest, StoreError> {
    let row: Option<RequestRow> = on_conn!(conn.into(), conn, dialect => {
        let lock = if lock { dialect.lock() } else { "" };
        sqlx::query_as(&format!("SELECT {REQUEST_COLUMNS} WHERE id = $1{lock}"))
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?
    });
    request_from(row.ok_or_else(|| StoreError::NotFound { what: format!("request {id}") })?)
}

/// Writes a request's new state, if it is still at `before_version`.
pub(super) async fn set_request<'c>(
    conn: impl Into<Conn<'c>>,
    r: &SliceRequest,
    before_version: i64,
) -> Result<(), StoreError> {
    let done = on_conn!(conn.into(), conn, _dialect => {
        sqlx::query(
            "UPDATE slice_requests SET state = $1, reason = $2, version = $3, updated_at_ms = $4 \
             WHERE id = $5 AND version = $6",
        )
        .bind(r.state.as_str())
        .bind(&r.reason)
        .bind(r.version)
        .bind(r.updated_at_ms)
        .bind(&r.id)
        .bind(before_version)
        .execute(&mut *conn)
        .await?
        .rows_affected()
    });
    if done == 1 { Ok(()) } else { Err(StoreError::Conflict { constraint: "version".to_string() }) }
}

/// Adds (`sign` 1) or takes back (`sign` -1) a request's charges in its tenant's running usage.
pub(super) async fn adjust_usage<'c>(
    conn: impl Into<Conn<'c>>,
    tenant_id: &str,
    request_id: &str,
    sign: i64,
) -> Result<(), StoreError> {
    on_conn!(conn.into(), conn, dialect => {
        // In byte order of resource, as batches write them, so two writers never take a tenant's usage rows in
        // opposite orders (a deadlock).
        let charges: Vec<(String, i64)> = sqlx::query_as(&format!(
            "SELECT resource, amount_milli FROM request_charges WHERE request_id = $1 ORDER BY resource{}",
            dialect.bytewise()
        ))
        .bind(request_id)
        .fetch_all(&mut *conn)
        .await?;
        for (resource, amount) in charges {
            sqlx::query(
                "INSERT INTO tenant_usage (tenant_id, resource, held_milli) VALUES ($1, $2, $3) ON CONFLICT \
                 (tenant_id, resource) DO UPDATE SET held_milli = tenant_usage.held_milli + excluded.held_milli",
            )
            .bind(tenant_id)
            .bind(resource)
            .bind(sign * amount)
            .execute(&mut *conn)
            .await?;
        }
    });
    Ok(())
}

/// Gives back the instances a request held, when it ends (released, cancelled, rejected, expired, failed).
pub(super) async fn release_allocations<'c>(conn: impl Into<Conn<'c>>, request_id: &str) -> Result<(), StoreError> {
    on_conn!(conn.into(), conn, _dialect => {
        sqlx::query(
            "UPDATE allocations SET state = 'released', released_at_ms = $2 \
             WHERE request_id = $1 AND state IN ('reserved', 'active')",
        )
        .bind(request_id)
        .bind(now_ms())
        .execute(&mut *conn)
        .await?;
    });
    Ok(())
}
