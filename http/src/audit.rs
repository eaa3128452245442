//! The audit log (platform admins): who changed what, before and after, when; one object's history, or the whole
//! fleet's filtered and a page at a time.

use crate::auth::Caller;
use axum::extract::State;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use tessera_services::auth::Permissions;

use super::error::{ApiError, ApiJson, ApiQuery, Problem};
pub use tessera_api::audit::{AuditEntriesQuery, AuditPage, AuditQuery, AuditView};
use tessera_services::app::AppState;
use tessera_store::audit::AuditFilter;

/// An object's history, oldest first. Platform admins read any object's; tenant members read the history of
/// their tenants' requests (`request/<id>`), which the tenant dashboard shows.
#[utoipa::path(get, path = "/api/v1/audit", tag = "audit", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])), params(AuditQuery),
    responses((status = 200, body = Vec<AuditView>), (status = 403, body = Problem), (status = 404, body = Problem)))]
pub async fn audit(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiQuery(q): ApiQuery<AuditQuery>,
) -> Result<ApiJson<Vec<AuditView>>, ApiError> {
    let entries = tessera_services::audit::history(&state, &p, &q.object).await?;
    Ok(ApiJson(entries.into_iter().map(AuditView::from).collect()))
}

/// The opaque cursor of the entries older than the one with `id`.
pub fn cursor(id: i64) -> String {
    URL_SAFE_NO_PAD.encode(format!("audit:{id}"))
}

/// The audit id a cursor from [`cursor`] names.
pub fn cursor_id(text: &str) -> Result<i64, ApiError> {
    URL_SAFE_NO_PAD
        .decode(text)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .and_then(|s| s.strip_prefix("audit:").and_then(|id| id.parse::<i64>().ok()))
        .filter(|id| *id > 0)
        .ok_or_else(|| ApiError::invalid("invalid_cursor", "`before` must be a `next` value from this API"))
}

/// The whole fleet's audit log, newest first, filtered, a page at a time (platform admins).
#[utoipa::path(get, path = "/api/v1/audit/entries", tag = "audit", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    params(AuditEntriesQuery),
    responses((status = 200, body = AuditPage), (status = 403, body = Problem),
        (status = 422, body = Problem, description = "invalid_limit, invalid_cursor, invalid_time or audit_range")))]
pub async fn entries(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiQuery(q): ApiQuery<AuditEntriesQuery>,
) -> Result<ApiJson<AuditPage>, ApiError> {
    p.require_platform_admin()?;
    let limit = q.limit.unwrap_or(100);
    if !(1..=500).contains(&limit) {
        return Err(ApiError::invalid("invalid_limit", "limit must be between 1 and 500"));
    }
    super::time_param("from", q.from)?;
    super::time_param("to", q.to)?;
    if let (Some(from), Some(to)) = (q.from, q.to)
        && from >= to
    {
        return Err(ApiError::invalid("audit_range", "`from` must be before `to`"));
    }
    let before_id = q.before.as_deref().map(cursor_id).transpose()?;
    let filter = AuditFilter {
        object: q.object.as_deref(),
        object_prefix: q.object_prefix.as_deref(),
        actor: q.actor.as_deref(),
        action_prefix: q.action.as_deref(),
        from_ms: q.from,
        to_ms: q.to,
        before_id,
        limit: limit + 1,
    };
    let mut rows = state.store.audit_entries(filter).await?;
    let next = if rows.len() > limit as usize {
        rows.truncate(limit as usize);
        rows.last().map(|(id, _)| cursor(*id))
    } else {
        None
    };
    Ok(ApiJson(AuditPage { entries: rows.into_iter().map(|(_, e)| e.into()).collect(), next }))
}
