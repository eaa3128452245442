//! Tenants, their quotas and running usage, slice requests and their life, and the audit entries to read back.
//! Every change writes its audit entry in its own transaction (see [`super::writes`]). One SQL body for both
//! backends (see [`super::dialect`]).
//!
//! Creating a request checks the tenant's quota and inserts it in one transaction that serialises with every other
//! writer for that tenant: SQLite takes the database write lock up front (`BEGIN IMMEDIATE`), PostgreSQL locks the
//! tenant's row (`SELECT ... FOR UPDATE`).

use tessera_core::quota::{ApprovalPolicy, Usage};
use tessera_core::request::RequestState;

use super::dialect::Conn;
use super::writes::{REQUEST_COLUMNS, adjust_usage, audit_insert, release_allocations, request_in, set_request};
use super::{
    AuditEntry, AuditRow, NewRequest, RequestFilter, RequestRow, SliceRequest, Store, StoreError, Tenant, TenantRow,
    Transition, audit_from, expiry, new_id, now_ms, on_constraint, request_from, tenant_from, to_json, usage_from_rows,
};

/// The columns of a [`TenantRow`], and the table.
pub(super) const TENANT_COLUMNS: &str =
    "id, name, auto_approve, auto_approve_max_compute_slices, created_at_ms, cohort_id, weight FROM tenants";

/// A tenant's limits.
pub(super) async fn quotas_in<'c>(conn: impl Into<Conn<'c>>, tenant_id: &str) -> Result<Usage, StoreError> {
    let sql = "SELECT resource, limit_milli FROM quotas WHERE tenant_id = $1";
    let rows: Vec<(String, i64)> = on_conn!(conn.into(), conn, _dialect => {
        sqlx::query_as(sql).bind(tenant_id).fetch_all(&mut *conn).await?
    });
    usage_from_rows(rows)
}

/// What a tenant's live requests hold.
async fn held_in<'c>(conn: impl Into<Conn<'c>>, tenant_id: &str) -> Result<Usage, StoreError> {
    let sql = "SELECT resource, held_milli FROM tenant_usage WHERE tenant_id = $1 AND held_milli > 0";
    let rows: Vec<(String, i64)> = on_conn!(conn.into(), conn, _dialect => {
        sqlx::query_as(sql).bind(tenant_id).fetch_all(&mut *conn).await?
    });
    usage_from_rows(rows)
}

/// The request still on its way (pending, approved or provisioning) made to replace `$1`, if any.
pub(super) const OPEN_REPLACEMENT: &str = "SELECT r.id FROM request_replacements x \
    JOIN slice_requests r ON r.id = x.request_id \
    WHERE x.replaces_request_id = $1 AND r.state IN ('pending', 'approved', 'provisioning') ORDER BY r.id LIMIT 1";

/// The actor that releases a request replaced by a right-sized one.
pub const RIGHTSIZE_ACTOR: &str = "system:rightsize";

/// When `new` turns active: the request it replaces (right-sizing's smaller slice), if it is still active and of
/// the same tenant, is released in the same transaction, as [`RIGHTSIZE_ACTOR`], its reason naming `new`. Returns
/// it when it was released.
async fn release_replaced<'c>(
    conn: impl Into<Conn<'c>>,
    new: &SliceRequest,
) -> Result<Option<SliceRequest>, StoreError> {
    on_conn!(conn.into(), conn, _dialect => {
        let old: Option<(String,)> =
            sqlx::query_as("SELECT replaces_request_id FROM request_replacements WHERE request_id = $1")
                .bind(&new.id)
                .fetch_optional(&mut *conn)
                .await?;
        let Some((old,)) = old else { return Ok(None) };
        let before = request_in(&mut *conn, &old, true).await?;
        if before.state != RequestState::Active || before.tenant_id != new.tenant_id {
            return Ok(None);
        }
        let state = before.state.transition(RequestState::Released)?;
        let now = now_ms();
        let after = SliceRequest {
            state,
            reason: format!("replaced by the right-sized request {}", new.id),
            version: before.version + 1,
            updated_at_ms: now,
            ..before.clone()
        };
        set_request(&mut *conn, &after, before.version).await?;
        release_allocations(&mut *conn, &after.id).await?;
        if before.state.holds_quota() {
            adjust_usage(&mut *conn, &after.tenant_id, &after.id, -1).await?;
        }
        let object = format!("request/{}", after.id);
        let (b, a) = (Some(to_json(&before)), Some(to_json(&after)));
        audit_insert(&mut *conn, RIGHTSIZE_ACTOR, "request.released", &object, b, a).await?;
        Ok(Some(after))
    })
}

impl Store {
    /// Creates a tenant; a taken name is a conflict on `tenants.name`.
    pub async fn create_tenant(&self, name: &str, policy: ApprovalPolicy, actor: &str) -> Result<Tenant, StoreError> {
        let t = Tenant {
            id: new_id(),
            name: name.to_string(),
            policy,
            created_at_ms: now_ms(),
            cohort_id: None,
            weight: 1,
        };
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            sqlx::query(
                "INSERT INTO tenants (id, name, auto_approve, auto_approve_max_compute_slices, created_at_ms) \
                 VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(&t.id)
            .bind(&t.name)
            .bind(t.policy.auto_approve)
            .bind(i64::from(t.policy.auto_approve_max_compute_slices))
            .bind(t.created_at_ms)
            .execute(&mut *tx)
            .await
            .map_err(|e| on_constraint(e, "tenants.name"))?;
            audit_insert(&mut tx, actor, "tenant.create", &format!("tenant/{}", t.id), None, Some(to_json(&t))).await?;
            tx.commit().await?;
        });
        Ok(t)
    }

    /// Every tenant, by name.
    pub async fn tenants(&self) -> Result<Vec<Tenant>, StoreError> {
        let sql = format!("SELECT {TENANT_COLUMNS} ORDER BY name");
        let rows: Vec<TenantRow> = on_pool!(self, pool, _dialect => sqlx::query_as(&sql).fetch_all(pool).await?);
        Ok(rows.into_iter().map(tenant_from).collect())
    }

    /// A tenant by id.
    pub async fn tenant(&self, id: &str) -> Result<Tenant, StoreError> {
        let sql = format!("SELECT {TENANT_COLUMNS} WHERE id = $1");
        let row: Option<TenantRow> =
            on_pool!(self, pool, _dialect => sqlx::query_as(&sql).bind(id).fetch_optional(pool).await?);
        row.map(tenant_from).ok_or_else(|| StoreError::NotFound { what: format!("tenant {id}") })
    }

    /// Sets (or replaces) a tenant's limit on one resource, in thousandths.
    pub async fn set_quota(
        &self,
        tenant_id: &str,
        resource: &tessera_core::quota::Resource,
        limit_milli: u64,
        actor: &str,
    ) -> Result<(), StoreError> {
        self.set_quotas(tenant_id, &[(resource.clone(), Some(limit_milli))], actor, "").await
    }

    /// A tenant's limits.
    pub async fn quotas(&self, tenant_id: &str) -> Result<Usage, StoreError> {
        on_pool!(self, pool, _dialect => quotas_in(&mut *pool.acquire().await?, tenant_id).await)
    }

    /// What a tenant's live requests (pending, approved, provisioning, active) hold.
    pub async fn held(&self, tenant_id: &str) -> Result<Usage, StoreError> {
        on_pool!(self, pool, _dialect => held_in(&mut *pool.acquire().await?, tenant_id).await)
    }

    /// Creates a request if it fits the tenant's quota, atomically with respect to every other request of the
    /// tenant. Fails with [`StoreError::Quota`] listing every limit it would exceed. With an idempotency key already
    /// used by the same user, returns the request it created and `false`.
    pub async fn create_request(&self, new: NewRequest<'_>) -> Result<(SliceRequest, bool), StoreError> {
        let items = [(new.to_request(now_ms()), new)];
        let outcome = {
            let _changing = self.changing();
            self.write_batch(&items).await?
        };
        let created = outcome.into_iter().next().ok_or_else(|| StoreError::Failed("no outcome".to_string()))??;
        Ok((created.request, created.created))
    }

    /// A request by id.
    pub async fn request(&self, id: &str) -> Result<SliceRequest, StoreError> {
        on_pool!(self, pool, _dialect => request_in(&mut *pool.acquire().await?, id, false).await)
    }

    /// Moves a request to another state if its life allows it and nobody changed it since `expected_version`.
    pub async fn transition(&self, t: Transition<'_>) -> Result<SliceRequest, StoreError> {
        let _changing = self.changing();
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let before = request_in(&mut tx, t.id, true).await?;
            if t.expected_version.is_some_and(|v| v != before.version) {
                return Err(StoreError::Conflict { constraint: "version".to_string() });
            }
            let state = before.state.transition(t.to)?;
            let now = now_ms();
            let mut expires_at_ms = expiry(state, before.duration_s, now, before.expires_at_ms);
            if state == RequestState::Active {
                // A request made for a reservation, or limited to end before one, ends by then at the latest.
                let (ends_by,): (Option<i64>,) = sqlx::query_as("SELECT ends_by_ms FROM slice_requests WHERE id = $1")
                    .bind(t.id)
                    .fetch_one(&mut *tx)
                    .await?;
                if let Some(by) = ends_by {
                    expires_at_ms = Some(expires_at_ms.map_or(by, |e| e.min(by)));
                }
            }
            let after = SliceRequest {
                state,
                reason: t.reason.map_or_else(|| before.reason.clone(), str::to_string),
                version: before.version + 1,
                updated_at_ms: now,
                expires_at_ms,
                ..before.clone()
            };
            let done = sqlx::query(
                "UPDATE slice_requests SET state = $1, reason = $2, version = $3, updated_at_ms = $4, \
                 expires_at_ms = $7 WHERE id = $5 AND version = $6",
            )
            .bind(after.state.as_str())
            .bind(&after.reason)
            .bind(after.version)
            .bind(after.updated_at_ms)
            .bind(&after.id)
            .bind(before.version)
            .bind(after.expires_at_ms)
            .execute(&mut *tx)
            .await?;
            if done.rows_affected() != 1 {
                return Err(StoreError::Conflict { constraint: "version".to_string() });
            }
            if after.state.is_terminal() {
                release_allocations(&mut tx, &after.id).await?;
                if before.state.holds_quota() {
                    adjust_usage(&mut tx, &after.tenant_id, &after.id, -1).await?;
                }
            }
            let action = format!("request.{}", after.state);
            let object = format!("request/{}", after.id);
            audit_insert(&mut tx, t.actor, &action, &object, Some(to_json(&before)), Some(to_json(&after))).await?;
            if after.state == RequestState::Active {
                release_replaced(&mut tx, &after).await?;
            }
            tx.commit().await?;
            Ok(after)
        })
    }

    /// A request still on its way (pending, approved or provisioning) made to replace `request_id`, if any.
    pub async fn open_replacement(&self, request_id: &str) -> Result<Option<String>, StoreError> {
        let row: Option<(String,)> = on_pool!(self, pool, _dialect => {
            sqlx::query_as(OPEN_REPLACEMENT).bind(request_id).fetch_optional(pool).await?
        });
        Ok(row.map(|(id,)| id))
    }

    /// The request `request_id` replaces once active, if it was made to replace one.
    pub async fn replaces(&self, request_id: &str) -> Result<Option<String>, StoreError> {
        let row: Option<(String,)> = on_pool!(self, pool, _dialect => {
            sqlx::query_as("SELECT replaces_request_id FROM request_replacements WHERE request_id = $1")
                .bind(request_id)
                .fetch_optional(pool)
                .await?
        });
        Ok(row.map(|(id,)| id))
    }

    /// Requests matching `filter`, by id (creation order).
    pub async fn list_requests(&self, filter: RequestFilter<'_>) -> Result<Vec<SliceRequest>, StoreError> {
        let (conditions, values) = filter.conditions();
        // The limit is bound, not spliced in, so every page size shares one prepared statement.
        let order = if filter.newest_first { "id DESC" } else { "id" };
        let sql =
            format!("SELECT {REQUEST_COLUMNS} WHERE 1 = 1{conditions} ORDER BY {order} LIMIT ${}", values.len() + 1);
        let rows: Vec<RequestRow> = on_pool!(self, pool, _dialect => {
            let mut query = sqlx::query_as(&sql);
            for v in &values {
                query = query.bind(v);
            }
            query.bind(i64::from(filter.limit)).fetch_all(pool).await?
        });
        rows.into_iter().map(request_from).collect()
    }

    /// Moves every active request whose duration has run out at `now` to expired (which frees its instances).
    /// Returns how many expired.
    pub async fn expire_due(&self, now: i64) -> Result<usize, StoreError> {
        let sql = "SELECT id, version FROM slice_requests WHERE state = 'active' AND expires_at_ms <= $1";
        let due: Vec<(String, i64)> =
            on_pool!(self, pool, _dialect => sqlx::query_as(sql).bind(now).fetch_all(pool).await?);
        let mut expired = 0;
        for (id, version) in due {
            let t = Transition {
                id: &id,
                expected_version: Some(version),
                to: RequestState::Expired,
                reason: None,
                actor: "system:expiry",
            };
            match self.transition(t).await {
                Ok(_) => expired += 1,
                // Changed meanwhile (released, failed): the next sweep sees its new state.
                Err(StoreError::Conflict { .. } | StoreError::Transition(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(expired)
    }

    /// Audit entries about `object`, oldest first.
    pub async fn audit(&self, object: &str) -> Result<Vec<AuditEntry>, StoreError> {
        let sql = "SELECT at_ms, actor, action, object, CAST(before_json AS TEXT) AS before_json, \
                   CAST(after_json AS TEXT) AS after_json FROM audit_log WHERE object = $1 ORDER BY id";
        let rows: Vec<AuditRow> =
            on_pool!(self, pool, _dialect => sqlx::query_as(sql).bind(object).fetch_all(pool).await?);
        Ok(rows.into_iter().map(audit_from).collect())
    }
}
