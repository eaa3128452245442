//! What quota governance reads and writes beside the limits: the spans a tenant held and used a resource (for
//! timelines, `tessera_core::timeline`), the limit's changes on one resource, and monthly budgets with their
//! policy (`tessera_core::budget`).

use std::collections::BTreeMap;

use tessera_core::budget::{BudgetPolicy, BudgetUnit};
use tessera_core::quota::{Milli, Resource};
use tessera_core::timeline::{Change, Span};

use super::writes::{REQUEST_COLUMNS, REQUEST_FIELDS, REQUEST_JSON, audit_insert};
use super::{RequestRow, SliceRequest, Store, StoreError, request_from, to_json};

/// One ended hour of the quota standing: its start, and per tenant with anything in it `(tenant, peak held, mean
/// used)`.
pub type StandingHour = (i64, Vec<(String, Milli, f64)>);

/// Rows of the quota standing's hours a statement inserts (four parameters each, and the resource).
const STANDING_ROWS_PER_INSERT: usize = 200;

/// The live states: a request in one of them holds its charge.
const LIVE: &str = "('pending', 'approved', 'provisioning', 'active')";

/// What a tenant held and used of one resource from some time on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Spans {
    /// Requests' charges, from creation until they ended (those live all through the start of the read summed
    /// into one span from it).
    pub held: Vec<Span>,
    /// Allocations' shares of their requests' charges, from activation until release (those in use all through
    /// the start of the read summed into one span from it).
    pub used: Vec<Span>,
}

/// A tenant's budgets.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Budgets {
    /// What a spent budget does.
    pub policy: BudgetPolicy,
    /// Unit key (`compute_slice_hours`, `gpu_hours/<model>`) -> hours, in thousandths.
    pub limits: BTreeMap<String, Milli>,
}

/// A span a request held a resource: from its creation to its end (`None`: still live).
#[derive(Debug, sqlx::FromRow)]
struct HeldRow {
    resource: String,
    tenant_id: String,
    from_ms: i64,
    to_ms: Option<i64>,
    amount_milli: i64,
}

/// A span an allocation used its share of a request's charge: from its activation to its release.
#[derive(Debug, sqlx::FromRow)]
struct UsedRow {
    resource: String,
    tenant_id: String,
    activated_at_ms: i64,
    released_at_ms: Option<i64>,
    amount_milli: i64,
    /// The request's slices, which share its charge.
    count: i64,
}

/// A change of one of a tenant's bounds.
#[derive(Debug, sqlx::FromRow)]
struct BoundChangeRow {
    kind: String,
    at_ms: i64,
    before_milli: Option<i64>,
    after_milli: Option<i64>,
}

/// A tenant's budget on one unit.
#[derive(Debug, sqlx::FromRow)]
struct BudgetLine {
    tenant_id: String,
    unit: String,
    limit_milli: i64,
}

/// Inside a write that records requests or allocations in the past (history, a request moved back): the quota
/// standing's hours kept from the one `t_ms` falls in on are forgotten, and worked out again by the next standing.
pub(crate) async fn forget_standing_hours<'c>(
    conn: impl Into<crate::dialect::Conn<'c>>,
    t_ms: i64,
) -> Result<(), StoreError> {
    let hour = tessera_core::rollup::Tier::Hour.bucket_of(t_ms);
    on_conn!(conn.into(), conn, _dialect => {
        sqlx::query("DELETE FROM standing_hours WHERE hour_ms >= $1").bind(hour).execute(&mut *conn).await?;
    });
    Ok(())
}

fn milli(v: i64) -> Milli {
    u64::try_from(v).unwrap_or(0)
}

impl Store {
    /// What tenants (one, or every one) held and used of `resource` at any time from `from_ms` on, by tenant
    /// (see [`Store::spans_of`]).
    pub async fn spans(
        &self,
        tenant_id: Option<&str>,
        resource: &Resource,
        from_ms: i64,
    ) -> Result<BTreeMap<String, Spans>, StoreError> {
        let mut of = self.spans_of(tenant_id, std::slice::from_ref(resource), from_ms).await?;
        Ok(of.remove(&resource.to_string()).unwrap_or_default())
    }

    /// What tenants (one, or every one) held and used of each of `resources` at any time from `from_ms` on, by
    /// resource key and tenant, in four reads whatever the resources. What was held (or used) all through
    /// `from_ms` and still is comes summed, one span per tenant from `from_ms` with no end: a standing of the last
    /// hour reads what started or ended since, and a sum per tenant, not every live request and allocation.
    pub async fn spans_of(
        &self,
        tenant_id: Option<&str>,
        resources: &[Resource],
        from_ms: i64,
    ) -> Result<BTreeMap<String, BTreeMap<String, Spans>>, StoreError> {
        let mut out: BTreeMap<String, BTreeMap<String, Spans>> = BTreeMap::new();
        if resources.is_empty() {
            return Ok(out);
        }
        let keys: Vec<String> = resources.iter().map(Resource::to_string).collect();
        let of_keys = super::dialect::marks(3, keys.len());
        type Through = Vec<(String, String, i64)>;
        let (held, used, held_through, used_through): (Vec<HeldRow>, Vec<UsedRow>, Through, Through) = on_pool!(self, pool, dialect => {
            // Found from the requests and allocations (live ones by state, the others by their last change or
            // release since `from_ms`), then their charges: a read of the recent hours costs what happened in them
            // and the live ones, not every request of the resource. SQLite is held to that order by `CROSS JOIN`
            // (PostgreSQL's takes no `ON`, and plans it so by itself). A request that ended holds until its last
            // change (ended requests change no more).
            let join = if dialect == crate::dialect::Dialect::Sqlite { "CROSS JOIN" } else { "JOIN" };
            let held_from = format!(
                "FROM slice_requests r {join} request_charges c ON c.request_id = r.id AND c.resource IN ({of_keys}) \
                 WHERE (CAST($1 AS TEXT) IS NULL OR r.tenant_id = CAST($1 AS TEXT))"
            );
            let used_from = format!(
                "FROM allocations a {join} slice_requests r ON r.id = a.request_id \
                 {join} request_charges c ON c.request_id = r.id AND c.resource IN ({of_keys}) \
                 WHERE a.activated_at_ms IS NOT NULL AND (CAST($1 AS TEXT) IS NULL OR a.tenant_id = CAST($1 AS TEXT))"
            );
            let statements = [
                format!(
                    "SELECT c.resource, r.tenant_id, r.created_at_ms AS from_ms, \
                     CASE WHEN r.state IN {LIVE} THEN NULL ELSE r.updated_at_ms END AS to_ms, c.amount_milli \
                     {held_from} AND ((r.state IN {LIVE} AND r.created_at_ms > $2) \
                     OR (r.state NOT IN {LIVE} AND r.updated_at_ms > $2))"
                ),
                format!(
                    "SELECT c.resource, r.tenant_id, CAST(SUM(c.amount_milli) AS BIGINT) {held_from} \
                     AND r.state IN {LIVE} AND r.created_at_ms <= $2 GROUP BY c.resource, r.tenant_id"
                ),
                format!(
                    "SELECT c.resource, a.tenant_id, a.activated_at_ms, a.released_at_ms, c.amount_milli, r.count \
                     {used_from} AND ((a.released_at_ms IS NULL AND a.activated_at_ms > $2) OR a.released_at_ms > $2)"
                ),
                // Each of a request's allocations uses an equal share of its charge (as below).
                format!(
                    "SELECT c.resource, a.tenant_id, CAST(SUM(CASE WHEN c.amount_milli > 0 \
                     THEN c.amount_milli / (CASE WHEN r.count > 1 THEN r.count ELSE 1 END) ELSE 0 END) AS BIGINT) \
                     {used_from} AND a.released_at_ms IS NULL AND a.activated_at_ms <= $2 \
                     GROUP BY c.resource, a.tenant_id"
                ),
            ];
            macro_rules! bound {
                ($sql:expr) => {{
                    let mut q = sqlx::query_as($sql).bind(tenant_id).bind(from_ms);
                    for k in &keys {
                        q = q.bind(k);
                    }
                    q.fetch_all(pool).await?
                }};
            }
            (bound!(&statements[0]), bound!(&statements[2]), bound!(&statements[1]), bound!(&statements[3]))
        });
        for (resource, tenant_id, amount) in held_through {
            let spans = out.entry(resource).or_default().entry(tenant_id).or_default();
            spans.held.push(Span { from_ms, to_ms: None, amount: milli(amount) });
        }
        for (resource, tenant_id, amount) in used_through {
            let spans = out.entry(resource).or_default().entry(tenant_id).or_default();
            spans.used.push(Span { from_ms, to_ms: None, amount: milli(amount) });
        }
        for HeldRow { resource, tenant_id, from_ms, to_ms, amount_milli } in held {
            let spans = out.entry(resource).or_default().entry(tenant_id).or_default();
            spans.held.push(Span { from_ms, to_ms, amount: milli(amount_milli) });
        }
        for UsedRow { resource, tenant_id, activated_at_ms, released_at_ms, amount_milli, count } in used {
            // Each of a request's allocations uses an equal share of its charge.
            let amount = milli(amount_milli) / milli(count).max(1);
            let spans = out.entry(resource).or_default().entry(tenant_id).or_default();
            spans.used.push(Span { from_ms: activated_at_ms, to_ms: released_at_ms, amount });
        }
        Ok(out)
    }

    /// The quota standing's hours of `resource` kept ([`Store::keep_standing_hours`]) from `from_ms` without a gap,
    /// up to `until_ms`: per tenant, the most it held at once in any of them and the sum of its hourly means used,
    /// and the first hour from `from_ms` not kept (`until_ms` when every one before it is). Two reads of the
    /// primary key's range, whatever the requests of those hours.
    pub async fn standing_hours(
        &self,
        resource: &str,
        from_ms: i64,
        until_ms: i64,
        hour_ms: i64,
    ) -> Result<(BTreeMap<String, (Milli, f64)>, i64), StoreError> {
        let kept: Vec<(i64,)> = on_pool!(self, pool, _dialect => {
            sqlx::query_as(
                "SELECT hour_ms FROM standing_hours WHERE resource = $1 AND hour_ms >= $2 AND hour_ms < $3 \
                 AND tenant_id = '' ORDER BY hour_ms",
            )
            .bind(resource)
            .bind(from_ms)
            .bind(until_ms)
            .fetch_all(pool)
            .await?
        });
        let mut next = from_ms;
        for (h,) in kept {
            if h != next {
                break;
            }
            next += hour_ms;
        }
        let mut out = BTreeMap::new();
        if next > from_ms {
            let rows: Vec<(String, i64, f64)> = on_pool!(self, pool, _dialect => {
                sqlx::query_as(
                    "SELECT tenant_id, MAX(peak_milli), SUM(used_milli) FROM standing_hours \
                     WHERE resource = $1 AND hour_ms >= $2 AND hour_ms < $3 AND tenant_id <> '' GROUP BY tenant_id",
                )
                .bind(resource)
                .bind(from_ms)
                .bind(next)
                .fetch_all(pool)
                .await?
            });
            out.extend(rows.into_iter().map(|(t, peak, used)| (t, (milli(peak), used))));
        }
        Ok((out, next))
    }

    /// Keeps the quota standing's ended `hours` of `resource` worked out (each hour's start with its tenants'
    /// `(tenant, peak held, mean used)`, tenants with nothing in it left out), with a row saying each is kept;
    /// an hour already kept (by another replica) is left as it is. Forgets the hours before `keep_from_ms`.
    pub async fn keep_standing_hours(
        &self,
        resource: &str,
        hours: &[StandingHour],
        keep_from_ms: i64,
    ) -> Result<(), StoreError> {
        let rows: Vec<(i64, &str, i64, f64)> = hours
            .iter()
            .flat_map(|(h, tenants)| {
                std::iter::once((*h, "", 0, 0.0)).chain(
                    tenants
                        .iter()
                        .map(|(t, peak, used)| (*h, t.as_str(), i64::try_from(*peak).unwrap_or(i64::MAX), *used)),
                )
            })
            .collect();
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            sqlx::query("DELETE FROM standing_hours WHERE resource = $1 AND hour_ms < $2")
                .bind(resource)
                .bind(keep_from_ms)
                .execute(&mut *tx)
                .await?;
            for chunk in rows.chunks(STANDING_ROWS_PER_INSERT) {
                let values = (0..chunk.len())
                    .map(|i| {
                        let b = 2 + i * 4;
                        format!("($1, CAST(${b} AS BIGINT), ${}, CAST(${} AS BIGINT), CAST(${} AS DOUBLE PRECISION))", b + 1, b + 2, b + 3)
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                let sql = format!(
                    "INSERT INTO standing_hours (resource, hour_ms, tenant_id, peak_milli, used_milli) VALUES {values} \
                     ON CONFLICT (resource, hour_ms, tenant_id) DO NOTHING"
                );
                let mut q = sqlx::query(&sql).bind(resource);
                for (h, t, peak, used) in chunk {
                    q = q.bind(*h).bind(*t).bind(*peak).bind(*used);
                }
                q.execute(&mut *tx).await?;
            }
            tx.commit().await?;
            Ok(())
        })
    }

    /// The changes of a tenant's `kind` bound (`limit`, `maximum`, `lending`) on `resource` from `from_ms` on, with
    /// the values in force now: `(limit, maximum)`.
    pub async fn limit_changes_of(
        &self,
        tenant_id: &str,
        resource: &Resource,
        from_ms: i64,
    ) -> Result<(BTreeMap<String, Vec<Change>>, Option<Milli>, Option<Milli>), StoreError> {
        let key = resource.to_string();
        let (rows, now): (Vec<BoundChangeRow>, Option<(i64, Option<i64>)>) = on_pool!(self, pool, _dialect => {
            let rows = sqlx::query_as(
                "SELECT kind, at_ms, before_milli, after_milli FROM quota_limit_changes \
                 WHERE tenant_id = $1 AND resource = $2 AND at_ms >= $3 ORDER BY id",
            )
            .bind(tenant_id)
            .bind(&key)
            .bind(from_ms)
            .fetch_all(pool)
            .await?;
            let now = sqlx::query_as("SELECT limit_milli, max_milli FROM quotas WHERE tenant_id = $1 AND resource = $2")
                .bind(tenant_id)
                .bind(&key)
                .fetch_optional(pool)
                .await?;
            (rows, now)
        });
        let mut changes: BTreeMap<String, Vec<Change>> = BTreeMap::new();
        for BoundChangeRow { kind, at_ms, before_milli, after_milli } in rows {
            let change = Change { at_ms, before: before_milli.map(milli), after: after_milli.map(milli) };
            changes.entry(kind).or_default().push(change);
        }
        let (limit, maximum) = match now {
            Some((l, m)) => (Some(milli(l)), m.map(milli)),
            None => (None, None),
        };
        Ok((changes, limit, maximum))
    }

    /// The live requests that hold slices or are about to (approved, provisioning, active), by id: bounded by the
    /// fleet, not by the queue.
    pub async fn placed_requests(&self) -> Result<Vec<SliceRequest>, StoreError> {
        let from = "FROM slice_requests WHERE state IN ('approved', 'provisioning', 'active')";
        let rows: Vec<RequestRow> = self.read_rows(REQUEST_FIELDS, REQUEST_JSON, from, "placed requests").await?;
        let mut placed = rows.into_iter().map(request_from).collect::<Result<Vec<_>, _>>()?;
        placed.sort_unstable_by(|a, b| a.id.cmp(&b.id));
        Ok(placed)
    }

    /// The pending requests, every tenant's or one tenant's, by id: the queue.
    pub async fn pending_requests(&self, tenant_id: Option<&str>) -> Result<Vec<SliceRequest>, StoreError> {
        let sql = format!(
            "SELECT {REQUEST_COLUMNS} WHERE state = 'pending' \
             AND (CAST($1 AS TEXT) IS NULL OR tenant_id = CAST($1 AS TEXT)) ORDER BY id"
        );
        let rows: Vec<RequestRow> =
            on_pool!(self, pool, _dialect => sqlx::query_as(&sql).bind(tenant_id).fetch_all(pool).await?);
        rows.into_iter().map(request_from).collect()
    }

    /// Every live request (pending to active), by id.
    pub async fn live_requests(&self) -> Result<Vec<SliceRequest>, StoreError> {
        let from = format!("FROM slice_requests WHERE state IN {LIVE}");
        let rows: Vec<RequestRow> = self.read_rows(REQUEST_FIELDS, REQUEST_JSON, &from, "live requests").await?;
        let mut live = rows.into_iter().map(request_from).collect::<Result<Vec<_>, _>>()?;
        live.sort_unstable_by(|a, b| a.id.cmp(&b.id));
        Ok(live)
    }

    /// A tenant's budgets (none: the `warn` policy and no limits).
    pub async fn budgets(&self, tenant_id: &str) -> Result<Budgets, StoreError> {
        Ok(self.all_budgets(Some(tenant_id)).await?.remove(tenant_id).unwrap_or_default())
    }

    /// Budgets by tenant: one tenant's, or every tenant's that has a budget or a policy.
    pub async fn all_budgets(&self, tenant_id: Option<&str>) -> Result<BTreeMap<String, Budgets>, StoreError> {
        let (policies, lines): (Vec<(String, String)>, Vec<BudgetLine>) = on_pool!(self, pool, _dialect => {
            let policies = sqlx::query_as(
                "SELECT tenant_id, policy FROM budget_policies WHERE CAST($1 AS TEXT) IS NULL OR tenant_id = CAST($1 AS TEXT)",
            )
            .bind(tenant_id)
            .fetch_all(pool)
            .await?;
            let lines = sqlx::query_as(
                "SELECT tenant_id, unit, limit_milli FROM budgets \
                 WHERE CAST($1 AS TEXT) IS NULL OR tenant_id = CAST($1 AS TEXT)",
            )
            .bind(tenant_id)
            .fetch_all(pool)
            .await?;
            (policies, lines)
        });
        let mut out: BTreeMap<String, Budgets> = BTreeMap::new();
        for (tenant, policy) in policies {
            let policy =
                BudgetPolicy::parse(&policy).ok_or_else(|| StoreError::Corrupt(format!("policy `{policy}`")))?;
            out.entry(tenant).or_default().policy = policy;
        }
        for BudgetLine { tenant_id, unit, limit_milli } in lines {
            out.entry(tenant_id).or_default().limits.insert(unit, milli(limit_milli));
        }
        Ok(out)
    }

    /// Changes a tenant's budgets in one transaction: the policy (if given), and each unit's limit (`None`
    /// removes it); audited as `tenant.budget` with the budgets before and after.
    pub async fn set_budgets(
        &self,
        tenant_id: &str,
        policy: Option<BudgetPolicy>,
        limits: &[(BudgetUnit, Option<Milli>)],
        actor: &str,
    ) -> Result<Budgets, StoreError> {
        let before = self.budgets(tenant_id).await?;
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let found: Option<(String,)> =
                sqlx::query_as(&format!("SELECT id FROM tenants WHERE id = $1{}", dialect.lock()))
                    .bind(tenant_id)
                    .fetch_optional(&mut *tx)
                    .await?;
            if found.is_none() {
                return Err(StoreError::NotFound { what: format!("tenant {tenant_id}") });
            }
            if let Some(policy) = policy {
                sqlx::query(
                    "INSERT INTO budget_policies (tenant_id, policy) VALUES ($1, $2) \
                     ON CONFLICT (tenant_id) DO UPDATE SET policy = excluded.policy",
                )
                .bind(tenant_id)
                .bind(policy.as_str())
                .execute(&mut *tx)
                .await?;
            }
            for (unit, limit) in limits {
                match limit {
                    Some(l) => {
                        sqlx::query(
                            "INSERT INTO budgets (tenant_id, unit, limit_milli) VALUES ($1, $2, $3) \
                             ON CONFLICT (tenant_id, unit) DO UPDATE SET limit_milli = excluded.limit_milli",
                        )
                        .bind(tenant_id)
                        .bind(unit.to_string())
                        .bind(i64::try_from(*l).unwrap_or(i64::MAX))
                        .execute(&mut *tx)
                        .await?;
                    }
                    None => {
                        sqlx::query("DELETE FROM budgets WHERE tenant_id = $1 AND unit = $2")
                            .bind(tenant_id)
                            .bind(unit.to_string())
                            .execute(&mut *tx)
                            .await?;
                    }
                }
            }
            let count: (i64,) = sqlx::query_as("SELECT COUNT(*) FROM budgets WHERE tenant_id = $1")
                .bind(tenant_id)
                .fetch_one(&mut *tx)
                .await?;
            if usize::try_from(count.0).unwrap_or(usize::MAX) > tessera_core::budget::MAX_LINES {
                return Err(StoreError::Rule {
                    code: "budget_too_many",
                    detail: tessera_core::budget::BudgetError::TooMany.to_string(),
                });
            }
            let mut after = before.clone();
            if let Some(p) = policy {
                after.policy = p;
            }
            for (unit, limit) in limits {
                match limit {
                    Some(l) => after.limits.insert(unit.to_string(), *l),
                    None => after.limits.remove(&unit.to_string()),
                };
            }
            let object = format!("tenant/{tenant_id}/budget");
            audit_insert(&mut tx, actor, "tenant.budget", &object, Some(to_json(&before)), Some(to_json(&after))).await?;
            tx.commit().await?;
        });
        self.budgets(tenant_id).await
    }
}
