//! Many request creations in one transaction (see `store::batch`). The batch's tenants are locked in id order
//! (`SELECT ... FOR UPDATE`), so it serialises with every other writer for them and two batches cannot deadlock.

use std::collections::BTreeSet;

use sqlx::postgres::PgConnection;
use sqlx::{PgPool, Postgres, QueryBuilder};

use super::{ms, request_columns};
use crate::store::batch::{
    Created, KeyedRequestRow, Loaded, charge_rows, key_rows, keyed_requests, plan, usage_by_tenant,
};
use crate::store::{NewRequest, SliceRequest, StoreError, TenantRow, now_ms, on_constraint, tenant_from, to_json};

pub(in crate::store) async fn create_requests(
    pool: &PgPool,
    items: &[(SliceRequest, NewRequest<'_>)],
) -> Result<Vec<Result<Created, StoreError>>, StoreError> {
    let mut tx = pool.begin().await?;
    let conn: &mut PgConnection = &mut tx;
    let loaded = load(conn, items).await?;
    let plan = plan(items, loaded);
    let inserted: Vec<&(SliceRequest, NewRequest<'_>)> = plan.inserts.iter().map(|&i| &items[i]).collect();
    if inserted.is_empty() {
        tx.commit().await?;
        return Ok(plan.outcomes);
    }
    let mut q = QueryBuilder::<Postgres>::new(
        "INSERT INTO slice_requests (id, tenant_id, spec, count, state, reason, version, created_at, updated_at, \
             duration_s) ",
    );
    q.push_values(&inserted, |mut b, (r, _)| {
        b.push_bind(&r.id).push_bind(&r.tenant_id).push_bind(to_json(&r.spec)).push_unseparated("::jsonb");
        b.push_bind(i32::try_from(r.count).unwrap_or(i32::MAX))
            .push_bind(r.state.as_str())
            .push_bind(&r.reason)
            .push_bind(r.version);
        push_time(&mut b, r.created_at_ms);
        push_time(&mut b, r.updated_at_ms);
        b.push_bind(r.duration_s.and_then(|d| i64::try_from(d).ok()));
    });
    q.build().execute(&mut *conn).await?;
    let charges = charge_rows(&inserted);
    if !charges.is_empty() {
        let mut q = QueryBuilder::<Postgres>::new("INSERT INTO request_charges (request_id, resource, amount_milli) ");
        q.push_values(&charges, |mut b, (id, res, m)| {
            b.push_bind(*id).push_bind(res).push_bind(*m);
        });
        q.build().execute(&mut *conn).await?;
    }
    if !plan.usage.is_empty() {
        let mut q = QueryBuilder::<Postgres>::new("INSERT INTO tenant_usage (tenant_id, resource, held_milli) ");
        q.push_values(&plan.usage, |mut b, ((t, res), m)| {
            b.push_bind(t).push_bind(res).push_bind(*m);
        });
        q.push(" ON CONFLICT (tenant_id, resource) DO UPDATE SET held_milli = tenant_usage.held_milli + excluded.held_milli");
        q.build().execute(&mut *conn).await?;
    }
    let keyed = key_rows(&inserted);
    if !keyed.is_empty() {
        let mut q = QueryBuilder::<Postgres>::new("INSERT INTO idempotency_keys (user_id, key, request_id) ");
        q.push_values(&keyed, |mut b, (u, k, id)| {
            b.push_bind(*u).push_bind(*k).push_bind(*id);
        });
        q.build().execute(&mut *conn).await.map_err(|e| on_constraint(e, "idempotency_keys"))?;
    }
    let at = now_ms();
    let mut q =
        QueryBuilder::<Postgres>::new("INSERT INTO audit_log (at, actor, action, object, before_json, after_json) ");
    q.push_values(&inserted, |mut b, (r, n)| {
        push_time(&mut b, at);
        b.push_bind(n.actor)
            .push_bind("request.create")
            .push_bind(format!("request/{}", r.id))
            .push_bind(None::<String>)
            .push_unseparated("::jsonb")
            .push_bind(to_json(r))
            .push_unseparated("::jsonb");
    });
    q.build().execute(&mut *conn).await?;
    tx.commit().await?;
    Ok(plan.outcomes)
}

/// Locks the batch's tenants and reads what it needs.
async fn load(conn: &mut PgConnection, items: &[(SliceRequest, NewRequest<'_>)]) -> Result<Loaded, StoreError> {
    let tenant_ids: BTreeSet<&str> = items.iter().map(|(r, _)| r.tenant_id.as_str()).collect();
    let mut loaded = Loaded::default();
    let mut q = QueryBuilder::<Postgres>::new(format!(
        "SELECT id, name, auto_approve, auto_approve_max_compute_slices::bigint, {} FROM tenants WHERE id IN (",
        ms("created_at")
    ));
    push_list(&mut q, &tenant_ids);
    q.push(" ORDER BY id FOR UPDATE");
    for row in q.build_query_as::<TenantRow>().fetch_all(&mut *conn).await? {
        let tenant = tenant_from(row);
        loaded.tenants.insert(tenant.id.clone(), tenant);
    }
    let mut q =
        QueryBuilder::<Postgres>::new("SELECT tenant_id, resource, limit_milli FROM quotas WHERE tenant_id IN (");
    push_list(&mut q, &tenant_ids);
    loaded.limits = usage_by_tenant(q.build_query_as().fetch_all(&mut *conn).await?)?;
    let mut q = QueryBuilder::<Postgres>::new(
        "SELECT tenant_id, resource, held_milli FROM tenant_usage WHERE held_milli > 0 AND tenant_id IN (",
    );
    push_list(&mut q, &tenant_ids);
    loaded.held = usage_by_tenant(q.build_query_as().fetch_all(&mut *conn).await?)?;
    let keys: BTreeSet<(&str, &str)> = items.iter().filter_map(|(_, n)| n.idempotency).collect();
    if !keys.is_empty() {
        let mut q = QueryBuilder::<Postgres>::new(format!(
            "SELECT k.user_id, k.key, {} JOIN idempotency_keys k ON k.request_id = slice_requests.id \
             WHERE (k.user_id, k.key) IN (VALUES ",
            request_columns()
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

/// Binds UTC milliseconds as a `timestamptz` value.
fn push_time(b: &mut sqlx::query_builder::Separated<'_, '_, Postgres, &'static str>, at_ms: i64) {
    b.push("to_timestamp(").push_bind_unseparated(at_ms).push_unseparated("::double precision / 1000.0)");
}

fn push_list<'a>(q: &mut QueryBuilder<'a, Postgres>, values: &BTreeSet<&'a str>) {
    let mut list = q.separated(", ");
    for v in values {
        list.push_bind(*v);
    }
    q.push(")");
}
