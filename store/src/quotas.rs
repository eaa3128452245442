//! Limits and quota requests: setting limits, asking for new ones, granting (in full or in part), refusing,
//! cancelling, and ending temporary increases; every change of a limit is kept in `quota_limit_changes` and
//! audited, in the transaction that makes it.
//!
//! Every writer here first locks the tenant (PostgreSQL: its row `FOR UPDATE`; SQLite: the write lock of `BEGIN
//! IMMEDIATE`), as creating a slice request does, so a grant and a request's quota check never interleave. The
//! rules (what may be asked, what may be granted, what an end gives back) are `tessera_core::quota_request`'s.

use std::collections::BTreeMap;

use tessera_core::quota::{Milli, Resource};
use tessera_core::quota_request::{self, Change, Line, QuotaRequestState};

use super::dialect::Conn;
use super::requests::quotas_in;
use super::writes::audit_insert;
use super::{Store, StoreError, new_id, now_ms, on_constraint, to_json};

/// A quota request as stored.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct QuotaRequest {
    /// UUIDv7.
    pub id: String,
    /// Tenant id.
    pub tenant_id: String,
    /// Who asked (`user:<name>`).
    pub requested_by: String,
    /// Why.
    pub reason: String,
    /// End of a temporary increase, UTC ms.
    pub until_ms: Option<i64>,
    /// Where it stands.
    pub state: QuotaRequestState,
    /// Who decided or cancelled it.
    pub decided_by: Option<String>,
    /// The approver's comment or the refusal's reason.
    pub comment: String,
    /// Optimistic version.
    pub version: i64,
    /// UTC ms.
    pub created_at_ms: i64,
    /// UTC ms.
    pub updated_at_ms: i64,
    /// One per resource, in resource order.
    pub lines: Vec<QuotaRequestLine>,
}

/// One resource of a stored quota request.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct QuotaRequestLine {
    /// The resource and what was asked.
    #[serde(skip)]
    pub line: Line,
    /// The limit granted.
    pub granted: Option<Milli>,
    /// The limit in force just before the grant.
    pub granted_before: Option<Milli>,
}

impl QuotaRequestLine {
    fn key(&self) -> String {
        self.line.resource.to_string()
    }
}

/// What a decision on a pending quota request is.
#[derive(Debug, Clone, PartialEq)]
pub enum QuotaDecision {
    /// Grant these amounts (`None`: everything as asked), with a comment.
    Grant(Option<BTreeMap<Resource, Milli>>),
    /// Refuse.
    Reject,
    /// Withdrawn by the tenant.
    Cancel,
}

/// A change of one limit, as kept.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitChange {
    /// Resource key.
    pub resource: String,
    /// UTC ms.
    pub at_ms: i64,
    /// Who.
    pub actor: String,
    /// Before (`None`: unlimited).
    pub before: Option<Milli>,
    /// After (`None`: unlimited).
    pub after: Option<Milli>,
    /// Why.
    pub why: String,
    /// Via which quota request.
    pub quota_request: Option<String>,
    /// What changed: `limit`, `maximum` or `lending`.
    pub kind: String,
}

/// Which quota requests a listing returns.
#[derive(Debug, Clone, Copy, Default)]
pub struct QuotaRequestFilter<'a> {
    /// Only these tenants' (`None`: all).
    pub tenants: Option<&'a [String]>,
    /// Only in this state.
    pub state: Option<QuotaRequestState>,
    /// Ids below this one (newest first).
    pub before: Option<&'a str>,
    /// At most this many.
    pub limit: u32,
}

fn milli(m: Option<i64>) -> Option<Milli> {
    m.map(|m| u64::try_from(m).unwrap_or(0))
}

fn db_milli(m: Milli) -> i64 {
    i64::try_from(m).unwrap_or(i64::MAX)
}

/// A quota request row, without its lines.
#[derive(Debug, sqlx::FromRow)]
struct RequestRow {
    id: String,
    tenant_id: String,
    requested_by: String,
    reason: String,
    until_ms: Option<i64>,
    state: String,
    decided_by: Option<String>,
    comment: String,
    version: i64,
    created_at_ms: i64,
    updated_at_ms: i64,
}

/// One line of a quota request, in thousandths.
#[derive(Debug, sqlx::FromRow)]
struct LineRow {
    request_id: String,
    resource: String,
    asked_milli: i64,
    before_milli: Option<i64>,
    granted_milli: Option<i64>,
    granted_before_milli: Option<i64>,
}

/// A change of one of a tenant's limits.
#[derive(Debug, sqlx::FromRow)]
struct LimitChangeRow {
    resource: String,
    at_ms: i64,
    actor: String,
    before_milli: Option<i64>,
    after_milli: Option<i64>,
    why: String,
    quota_request_id: Option<String>,
    kind: String,
}

const REQUEST_COLUMNS: &str = "id, tenant_id, requested_by, reason, until_ms, state, decided_by, comment, version, \
                               created_at_ms, updated_at_ms FROM quota_requests";

fn assemble(rows: Vec<RequestRow>, lines: Vec<LineRow>) -> Result<Vec<QuotaRequest>, StoreError> {
    let catalog = tessera_core::Catalog::builtin();
    let mut by_request: BTreeMap<String, Vec<QuotaRequestLine>> = BTreeMap::new();
    for l in lines {
        let resource = Resource::parse(catalog, &l.resource).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let line = Line { resource, asked: milli(Some(l.asked_milli)).unwrap_or(0), before: milli(l.before_milli) };
        by_request.entry(l.request_id).or_default().push(QuotaRequestLine {
            line,
            granted: milli(l.granted_milli),
            granted_before: milli(l.granted_before_milli),
        });
    }
    rows.into_iter()
        .map(|r| {
            let RequestRow {
                id,
                tenant_id,
                requested_by,
                reason,
                until_ms,
                state,
                decided_by,
                comment,
                version,
                created_at_ms,
                updated_at_ms,
            } = r;
            let state = QuotaRequestState::parse(&state)
                .ok_or_else(|| StoreError::Corrupt(format!("quota request {id}: state `{state}`")))?;
            let mut lines = by_request.remove(&id).unwrap_or_default();
            lines.sort_by(|a, b| a.line.resource.cmp(&b.line.resource));
            Ok(QuotaRequest {
                id,
                tenant_id,
                requested_by,
                reason,
                until_ms,
                state,
                decided_by,
                comment,
                version,
                created_at_ms,
                updated_at_ms,
                lines,
            })
        })
        .collect()
}

/// The quota requests with these ids' lines, and the requests, in the order of `rows`.
async fn with_lines<'c>(conn: impl Into<Conn<'c>>, rows: Vec<RequestRow>) -> Result<Vec<QuotaRequest>, StoreError> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let placeholders: Vec<String> = (1..=rows.len()).map(|i| format!("${i}")).collect();
    let sql = format!(
        "SELECT request_id, resource, asked_milli, before_milli, granted_milli, granted_before_milli \
         FROM quota_request_lines WHERE request_id IN ({})",
        placeholders.join(", ")
    );
    let lines: Vec<LineRow> = on_conn!(conn.into(), conn, _dialect => {
        let mut q = sqlx::query_as(&sql);
        for r in &rows {
            q = q.bind(&r.id);
        }
        q.fetch_all(&mut *conn).await?
    });
    assemble(rows, lines)
}

async fn request_row<'c>(conn: impl Into<Conn<'c>>, id: &str, lock: bool) -> Result<RequestRow, StoreError> {
    let row: Option<RequestRow> = on_conn!(conn.into(), conn, dialect => {
        let lock = if lock { dialect.lock() } else { "" };
        sqlx::query_as(&format!("SELECT {REQUEST_COLUMNS} WHERE id = $1{lock}"))
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?
    });
    row.ok_or_else(|| StoreError::NotFound { what: format!("quota request {id}") })
}

/// Locks `tenant_id` for the rest of the transaction (a no-op on SQLite, whose writers hold the database lock), or
/// says it does not exist.
async fn lock_tenant<'c>(conn: impl Into<Conn<'c>>, tenant_id: &str) -> Result<(), StoreError> {
    let found: Option<(String,)> = on_conn!(conn.into(), conn, dialect => {
        sqlx::query_as(&format!("SELECT id FROM tenants WHERE id = $1{}", dialect.lock()))
            .bind(tenant_id)
            .fetch_optional(&mut *conn)
            .await?
    });
    found.map(|_| ()).ok_or_else(|| StoreError::NotFound { what: format!("tenant {tenant_id}") })
}

/// Sets one limit (`None` removes it) and keeps the change, in the caller's transaction. Nothing is written when
/// the limit is already `after`.
#[allow(clippy::too_many_arguments)]
pub(super) async fn write_limit<'c>(
    conn: impl Into<Conn<'c>>,
    tenant_id: &str,
    resource: &str,
    before: Option<Milli>,
    after: Option<Milli>,
    actor: &str,
    why: &str,
    quota_request: Option<&str>,
) -> Result<(), StoreError> {
    if before == after {
        return Ok(());
    }
    let now = now_ms();
    let conn: Conn<'c> = conn.into();
    on_conn!(conn, conn, dialect => {
        match after {
            Some(limit) => {
                sqlx::query(
                    "INSERT INTO quotas (tenant_id, resource, limit_milli) VALUES ($1, $2, $3) \
                     ON CONFLICT (tenant_id, resource) DO UPDATE SET limit_milli = excluded.limit_milli",
                )
                .bind(tenant_id)
                .bind(resource)
                .bind(db_milli(limit))
                .execute(&mut *conn)
                .await
                .map_err(|e| on_constraint(e, "quotas"))?;
            }
            None => {
                sqlx::query("DELETE FROM quotas WHERE tenant_id = $1 AND resource = $2")
                    .bind(tenant_id)
                    .bind(resource)
                    .execute(&mut *conn)
                    .await?;
            }
        }
        sqlx::query(
            "INSERT INTO quota_limit_changes (tenant_id, resource, at_ms, actor, before_milli, after_milli, why, \
             quota_request_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(tenant_id)
        .bind(resource)
        .bind(now)
        .bind(actor)
        .bind(before.map(db_milli))
        .bind(after.map(db_milli))
        .bind(why)
        .bind(quota_request)
        .execute(&mut *conn)
        .await?;
        let object = format!("tenant/{tenant_id}/quota/{resource}");
        let json = |m: Option<Milli>| m.map(|m| format!("{{\"limit_milli\":{m}}}"));
        let action = if after.is_some() { "quota.set" } else { "quota.remove" };
        audit_insert(&mut *conn, actor, action, &object, json(before), json(after)).await?;
    });
    Ok(())
}

impl Store {
    /// Sets several limits in one transaction: all of them or none. `None` removes a limit (the resource is then
    /// unlimited); each change is kept with `why` and audited with the limit before it.
    pub async fn set_quotas(
        &self,
        tenant_id: &str,
        limits: &[(Resource, Option<Milli>)],
        actor: &str,
        why: &str,
    ) -> Result<(), StoreError> {
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            lock_tenant(&mut tx, tenant_id).await?;
            let current = quotas_in(&mut tx, tenant_id).await?;
            for (resource, limit) in limits {
                let before = current.get(resource).copied();
                write_limit(&mut tx, tenant_id, &resource.to_string(), before, *limit, actor, why, None).await?;
            }
            tx.commit().await?;
        });
        Ok(())
    }

    /// Records what a tenant's admin asks for, checked against the limits in force (see
    /// [`quota_request::check_ask`]).
    pub async fn create_quota_request(
        &self,
        tenant_id: &str,
        asked: &[(Resource, Milli)],
        reason: &str,
        until_ms: Option<i64>,
        actor: &str,
    ) -> Result<QuotaRequest, StoreError> {
        let now = now_ms();
        let id = new_id();
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            lock_tenant(&mut tx, tenant_id).await?;
            let limits = quotas_in(&mut tx, tenant_id).await?;
            let lines = quota_request::check_ask(asked, &limits, until_ms, now).map_err(StoreError::QuotaAsk)?;
            sqlx::query(
                "INSERT INTO quota_requests (id, tenant_id, requested_by, reason, until_ms, state, comment, version, \
                 created_at_ms, updated_at_ms) VALUES ($1, $2, $3, $4, $5, 'pending', '', 1, $6, $6)",
            )
            .bind(&id)
            .bind(tenant_id)
            .bind(actor)
            .bind(reason)
            .bind(until_ms)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            for l in &lines {
                sqlx::query(
                    "INSERT INTO quota_request_lines (request_id, resource, asked_milli, before_milli) \
                     VALUES ($1, $2, $3, $4)",
                )
                .bind(&id)
                .bind(l.resource.to_string())
                .bind(db_milli(l.asked))
                .bind(l.before.map(db_milli))
                .execute(&mut *tx)
                .await?;
            }
            let row = request_row(&mut tx, &id, false).await?;
            let created = with_lines(&mut tx, vec![row]).await?.remove(0);
            let object = format!("quota-request/{id}");
            audit_insert(&mut tx, actor, "quota_request.create", &object, None, Some(to_json(&created))).await?;
            tx.commit().await?;
            Ok(created)
        })
    }

    /// A quota request by id.
    pub async fn quota_request(&self, id: &str) -> Result<QuotaRequest, StoreError> {
        on_pool!(self, pool, _dialect => {
            let mut conn = pool.acquire().await?;
            let row = request_row(&mut *conn, id, false).await?;
            Ok(with_lines(&mut *conn, vec![row]).await?.remove(0))
        })
    }

    /// Quota requests matching `filter`, newest first.
    pub async fn list_quota_requests(&self, filter: QuotaRequestFilter<'_>) -> Result<Vec<QuotaRequest>, StoreError> {
        let mut conditions = String::new();
        let mut values: Vec<String> = Vec::new();
        if let Some(tenants) = filter.tenants {
            if tenants.is_empty() {
                return Ok(Vec::new());
            }
            let start = values.len();
            values.extend(tenants.iter().cloned());
            let marks: Vec<String> = (start + 1..=values.len()).map(|i| format!("${i}")).collect();
            conditions.push_str(&format!(" AND tenant_id IN ({})", marks.join(", ")));
        }
        if let Some(state) = filter.state {
            values.push(state.as_str().to_string());
            conditions.push_str(&format!(" AND state = ${}", values.len()));
        }
        if let Some(before) = filter.before {
            values.push(before.to_string());
            conditions.push_str(&format!(" AND id < ${}", values.len()));
        }
        let sql =
            format!("SELECT {REQUEST_COLUMNS} WHERE 1 = 1{conditions} ORDER BY id DESC LIMIT ${}", values.len() + 1);
        on_pool!(self, pool, _dialect => {
            let mut conn = pool.acquire().await?;
            let mut q = sqlx::query_as(&sql);
            for v in &values {
                q = q.bind(v);
            }
            let rows: Vec<RequestRow> = q.bind(i64::from(filter.limit)).fetch_all(&mut *conn).await?;
            with_lines(&mut *conn, rows).await
        })
    }

    /// Decides a pending quota request, or withdraws it; `expected_version` (from `If-Match`) must match when
    /// given. A grant changes the limits in the same transaction (see [`quota_request::check_grant`]).
    pub async fn decide_quota_request(
        &self,
        id: &str,
        expected_version: Option<i64>,
        decision: QuotaDecision,
        comment: &str,
        actor: &str,
    ) -> Result<QuotaRequest, StoreError> {
        let to = match decision {
            QuotaDecision::Grant(_) => QuotaRequestState::Approved,
            QuotaDecision::Reject => QuotaRequestState::Rejected,
            QuotaDecision::Cancel => QuotaRequestState::Cancelled,
        };
        let now = now_ms();
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            // The tenant first, as every writer of its limits and requests does, then the request.
            let tenant_id: Option<(String,)> = sqlx::query_as("SELECT tenant_id FROM quota_requests WHERE id = $1")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
            let Some((tenant_id,)) = tenant_id else {
                return Err(StoreError::NotFound { what: format!("quota request {id}") });
            };
            lock_tenant(&mut tx, &tenant_id).await?;
            let row = request_row(&mut tx, id, true).await?;
            let before = with_lines(&mut tx, vec![row]).await?.remove(0);
            if expected_version.is_some_and(|v| v != before.version) {
                return Err(StoreError::Conflict { constraint: "version".to_string() });
            }
            if !before.state.next_states().contains(&to) {
                return Err(StoreError::QuotaState { from: before.state, to });
            }
            if let QuotaDecision::Grant(granted) = &decision {
                let limits = quotas_in(&mut tx, &tenant_id).await?;
                let lines: Vec<Line> = before.lines.iter().map(|l| l.line.clone()).collect();
                let changes: Vec<Change> =
                    quota_request::check_grant(&lines, granted.as_ref(), &limits).map_err(StoreError::QuotaAsk)?;
                let why = if comment.is_empty() { before.reason.clone() } else { comment.to_string() };
                for c in &changes {
                    let key = c.resource.to_string();
                    write_limit(&mut tx, &tenant_id, &key, c.before, Some(c.after), actor, &why, Some(id)).await?;
                    sqlx::query(
                        "UPDATE quota_request_lines SET granted_milli = $3, granted_before_milli = $4 \
                         WHERE request_id = $1 AND resource = $2",
                    )
                    .bind(id)
                    .bind(&key)
                    .bind(db_milli(c.after))
                    .bind(c.before.map(db_milli))
                    .execute(&mut *tx)
                    .await?;
                }
            }
            let done = sqlx::query(
                "UPDATE quota_requests SET state = $1, decided_by = $2, comment = $3, version = version + 1, \
                 updated_at_ms = $4 WHERE id = $5 AND version = $6",
            )
            .bind(to.as_str())
            .bind(actor)
            .bind(comment)
            .bind(now)
            .bind(id)
            .bind(before.version)
            .execute(&mut *tx)
            .await?;
            if done.rows_affected() != 1 {
                return Err(StoreError::Conflict { constraint: "version".to_string() });
            }
            let row = request_row(&mut tx, id, false).await?;
            let after = with_lines(&mut tx, vec![row]).await?.remove(0);
            let object = format!("quota-request/{id}");
            let action = format!("quota_request.{to}");
            audit_insert(&mut tx, actor, &action, &object, Some(to_json(&before)), Some(to_json(&after))).await?;
            tx.commit().await?;
            Ok(after)
        })
    }

    /// Ends every approved temporary increase whose end is at or before `now`: each takes back the increment it
    /// gave ([`quota_request::revert`]), never anything held. Returns how many ended.
    pub async fn end_due_quota_requests(&self, now: i64) -> Result<usize, StoreError> {
        let sql = "SELECT id FROM quota_requests WHERE state = 'approved' AND until_ms IS NOT NULL AND until_ms <= $1 \
                   ORDER BY id";
        let due: Vec<(String,)> =
            on_pool!(self, pool, _dialect => sqlx::query_as(sql).bind(now).fetch_all(pool).await?);
        let mut ended = 0;
        for (id,) in due {
            match self.end_quota_request(&id, now).await {
                Ok(true) => ended += 1,
                Ok(false) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(ended)
    }

    async fn end_quota_request(&self, id: &str, now: i64) -> Result<bool, StoreError> {
        let actor = "system:quota-end";
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let tenant_id: (String,) = sqlx::query_as("SELECT tenant_id FROM quota_requests WHERE id = $1")
                .bind(id)
                .fetch_one(&mut *tx)
                .await?;
            lock_tenant(&mut tx, &tenant_id.0).await?;
            let row = request_row(&mut tx, id, true).await?;
            let before = with_lines(&mut tx, vec![row]).await?.remove(0);
            // Ended or changed meanwhile (another replica's sweep): nothing to do.
            if before.state != QuotaRequestState::Approved || before.until_ms.is_none_or(|u| u > now) {
                return Ok(false);
            }
            let limits = quotas_in(&mut tx, &before.tenant_id).await?;
            let why = format!("temporary increase ended: {}", before.reason);
            for l in &before.lines {
                let Some(granted) = l.granted else { continue };
                let current = limits.get(&l.line.resource).copied();
                let after = quota_request::revert(current, l.granted_before, granted);
                write_limit(&mut tx, &before.tenant_id, &l.key(), current, after, actor, &why, Some(id)).await?;
            }
            sqlx::query(
                "UPDATE quota_requests SET state = 'ended', version = version + 1, updated_at_ms = $1 WHERE id = $2",
            )
            .bind(now)
            .bind(id)
            .execute(&mut *tx)
            .await?;
            let row = request_row(&mut tx, id, false).await?;
            let after = with_lines(&mut tx, vec![row]).await?.remove(0);
            let object = format!("quota-request/{id}");
            audit_insert(&mut tx, actor, "quota_request.ended", &object, Some(to_json(&before)), Some(to_json(&after)))
                .await?;
            tx.commit().await?;
            Ok(true)
        })
    }

    /// The changes of a tenant's limits, newest first, at most `limit`.
    pub async fn limit_changes(&self, tenant_id: &str, limit: u32) -> Result<Vec<LimitChange>, StoreError> {
        let sql = "SELECT resource, at_ms, actor, before_milli, after_milli, why, quota_request_id, kind \
                   FROM quota_limit_changes WHERE tenant_id = $1 ORDER BY id DESC LIMIT $2";
        let rows: Vec<LimitChangeRow> = on_pool!(self, pool, _dialect => {
            sqlx::query_as(sql).bind(tenant_id).bind(i64::from(limit)).fetch_all(pool).await?
        });
        Ok(rows
            .into_iter()
            .map(|r| LimitChange {
                resource: r.resource,
                at_ms: r.at_ms,
                actor: r.actor,
                before: milli(r.before_milli),
                after: milli(r.after_milli),
                why: r.why,
                quota_request: r.quota_request_id,
                kind: r.kind,
            })
            .collect())
    }
}

impl Store {
    /// Records a member's ask to the tenant's admins (`after`: the suggestion as JSON, with `tenant_id`), with its
    /// audit entry and the `quota_request.suggested` event it tells of, in one transaction. Nothing else changes.
    pub async fn suggest_quota(&self, tenant_id: &str, after: &str, actor: &str) -> Result<(), StoreError> {
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let object = format!("tenant/{tenant_id}/quota");
            audit_insert(&mut tx, actor, "quota_request.suggest", &object, None, Some(after.to_string())).await?;
            tx.commit().await?;
            Ok(())
        })
    }
}
