//! Many request creations in one `BEGIN IMMEDIATE` transaction (see `store::batch`).

use std::collections::BTreeSet;

use sqlx::sqlite::SqliteConnection;
use sqlx::{QueryBuilder, Sqlite, SqlitePool};

use super::{REQUEST_COLUMNS, immediate};
use crate::store::batch::{
    Created, KeyedRequestRow, Loaded, charge_rows, key_rows, keyed_requests, plan, usage_by_tenant,
};
use crate::store::{NewRequest, SliceRequest, StoreError, TenantRow, now_ms, on_constraint, tenant_from, to_json};

pub(in crate::store) async fn create_requests(
    pool: &SqlitePool,
    items: &[(SliceRequest, NewRequest<'_>)],
) -> Result<Vec<Result<Created, StoreError>>, StoreError> {
    immediate(pool, async |conn: &mut SqliteConnection| {
        let loaded = load(conn, items).await?;
        let plan = plan(items, loaded);
        let inserted: Vec<&(SliceRequest, NewRequest<'_>)> = plan.inserts.iter().map(|&i| &items[i]).collect();
        if inserted.is_empty() {
            return Ok(plan.outcomes);
        }
        let mut q = QueryBuilder::<Sqlite>::new(
            "INSERT INTO slice_requests (id, tenant_id, spec, count, state, reason, version, created_at_ms, \
             updated_at_ms, duration_s) ",
        );
        q.push_values(&inserted, |mut b, (r, _)| {
            b.push_bind(&r.id)
                .push_bind(&r.tenant_id)
                .push_bind(to_json(&r.spec))
                .push_bind(i64::from(r.count))
                .push_bind(r.state.as_str())
                .push_bind(&r.reason)
                .push_bind(r.version)
                .push_bind(r.created_at_ms)
                .push_bind(r.updated_at_ms)
                .push_bind(r.duration_s.and_then(|d| i64::try_from(d).ok()));
        });
        q.build().execute(&mut *conn).await?;
        let charges = charge_rows(&inserted);
        if !charges.is_empty() {
            let mut q = QueryBuilder::<Sqlite>::new("INSERT INTO request_charges (request_id, resource, amount_milli) ");
            q.push_values(&charges, |mut b, (id, res, m)| {
                b.push_bind(*id).push_bind(res).push_bind(*m);
            });
            q.build().execute(&mut *conn).await?;
        }
        if !plan.usage.is_empty() {
            let mut q = QueryBuilder::<Sqlite>::new("INSERT INTO tenant_usage (tenant_id, resource, held_milli) ");
            q.push_values(&plan.usage, |mut b, ((t, res), m)| {
                b.push_bind(t).push_bind(res).push_bind(*m);
            });
            q.push(" ON CONFLICT (tenant_id, resource) DO UPDATE SET held_milli = tenant_usage.held_milli + excluded.held_milli");
            q.build().execute(&mut *conn).await?;
        }
        let keyed = key_rows(&inserted);
        if !keyed.is_empty() {
            let mut q = QueryBuilder::<Sqlite>::new("INSERT INTO idempotency_keys (user_id, key, request_id) ");
            q.push_values(&keyed, |mut b, (u, k, id)| {
                b.push_bind(*u).push_bind(*k).push_bind(*id);
            });
            q.build().execute(&mut *conn).await.map_err(|e| on_constraint(e, "idempotency_keys"))?;
        }
        let at = now_ms();
        let mut q = QueryBuilder::<Sqlite>::new(
            "INSERT INTO audit_log (at_ms, actor, action, object, before_json, after_json) ",
        );
        q.push_values(&inserted, |mut b, (r, n)| {
            b.push_bind(at)
                .push_bind(n.actor)
                .push_bind("request.create")
                .push_bind(format!("request/{}", r.id))
                .push_bind(None::<String>)
                .push_bind(to_json(r));
        });
        q.build().execute(&mut *conn).await?;
        Ok(plan.outcomes)
    })
    .await
}

/// Reads what the batch needs; the transaction already holds the write lock.
async fn load(conn: &mut SqliteConnection, items: &[(SliceRequest, NewRequest<'_>)]) -> Result<Loaded, StoreError> {
    let tenant_ids: BTreeSet<&str> = items.iter().map(|(r, _)| r.tenant_id.as_str()).collect();
    let mut loaded = Loaded::default();
    let mut q = QueryBuilder::<Sqlite>::new(
        "SELECT id, name, auto_approve, auto_approve_max_compute_slices, created_at_ms FROM tenants WHERE id IN (",
    );
    push_list(&mut q, &tenant_ids);
    for row in q.build_query_as::<TenantRow>().fetch_all(&mut *conn).await? {
        let tenant = tenant_from(row);
        loaded.tenants.insert(tenant.id.clone(), tenant);
    }
    let mut q = QueryBuilder::<Sqlite>::new("SELECT tenant_id, resource, limit_milli FROM quotas WHERE tenant_id IN (");
    push_list(&mut q, &tenant_ids);
    loaded.limits = usage_by_tenant(q.build_query_as().fetch_all(&mut *conn).await?)?;
    let mut q = QueryBuilder::<Sqlite>::new(
        "SELECT tenant_id, resource, held_milli FROM tenant_usage WHERE held_milli > 0 AND tenant_id IN (",
    );
    push_list(&mut q, &tenant_ids);
    loaded.held = usage_by_tenant(q.build_query_as().fetch_all(&mut *conn).await?)?;
    let keys: BTreeSet<(&str, &str)> = items.iter().filter_map(|(_, n)| n.idempotency).collect();
    if !keys.is_empty() {
        let mut q = QueryBuilder::<Sqlite>::new(format!(
            "SELECT k.user_id, k.key, {} JOIN idempotency_keys k ON k.request_id = slice_requests.id \
             WHERE (k.user_id, k.key) IN (VALUES ",
            qualified_request_columns()
        ));
        let mut list = q.separated(", ");
        for (u, k) in &keys {
            list.push("(").push_bind_unseparated(*u).push_unseparated(", ").push_bind_unseparated(*k);
            list.push_unseparated(")");
        }
        q.push(")");
        keyed_requests(q.build_query_as::<KeyedRequestRow>().fetch_all(&mut *conn).await?, &mut loaded)?;
    }
    Ok(loaded)
}

/// `REQUEST_COLUMNS` with each column named by its table, for joins.
fn qualified_request_columns() -> String {
    let (columns, from) = REQUEST_COLUMNS.split_once(" FROM ").unwrap_or((REQUEST_COLUMNS, "slice_requests"));
    let columns: Vec<String> = columns.split(',').map(|c| format!("slice_requests.{}", c.trim())).collect();
    format!("{} FROM {from}", columns.join(", "))
}

fn push_list<'a>(q: &mut QueryBuilder<'a, Sqlite>, values: &BTreeSet<&'a str>) {
    let mut list = q.separated(", ");
    for v in values {
        list.push_bind(*v);
    }
    q.push(")");
}
