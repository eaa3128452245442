//! Creating many requests in one transaction (group commit). The backend locks and reads what every request of
//! the batch needs (its tenant, the tenant's limits and running usage, idempotency keys already used), [`plan`]
//! decides each request in arrival order exactly as one transaction per request would have, and the backend writes
//! what was accepted with one multi-row statement per table. A batch costs about ten statements however many
//! requests it holds, where one request alone costs about twelve.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use sqlx::QueryBuilder;
use tessera_core::cohort::{Member, admit};
use tessera_core::quota::{Usage, accumulate};

use super::requests::TENANT_COLUMNS;
use super::writes::{REQUEST_COLUMNS, event_of};
use super::{
    NewRequest, RequestRow, SliceRequest, Store, StoreError, Tenant, TenantRow, now_ms, on_constraint, tenant_from,
    to_json,
};

/// Most requests in one batch (each row binds at most 12 values; SQLite allows 32,766 per statement).
pub const MAX_BATCH: usize = 256;

/// A request of a batch, as created or replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Created {
    /// The request (for a replay, the one its key created first).
    pub request: SliceRequest,
    /// `false`: an idempotent replay.
    pub created: bool,
    /// Its tenant, read under the batch's lock (for the approval policy).
    pub tenant: Tenant,
}

/// What the backend read for a batch, under its locks.
#[derive(Debug, Default)]
pub(super) struct Loaded {
    /// Tenants by id (missing: no such tenant).
    pub tenants: HashMap<String, Tenant>,
    /// The quota groups the batch's tenants are in: a cohort's members (by cohort id), or a tenant alone (by
    /// `tenant:<id>`).
    pub groups: HashMap<String, Vec<Member>>,
    /// Requests by the `(user, key)` that created them, for the keys the batch uses.
    pub keyed: HashMap<(String, String), SliceRequest>,
}

/// Where a tenant's quota is decided: its group's key, its index in the group, and whether the group is a cohort.
fn place(tenant: &Tenant, groups: &HashMap<String, Vec<Member>>) -> Option<(String, usize, bool)> {
    let (key, in_cohort) = match &tenant.cohort_id {
        Some(c) => (c.clone(), true),
        None => (format!("tenant:{}", tenant.id), false),
    };
    let index = groups.get(&key)?.iter().position(|m| m.tenant == tenant.id)?;
    Some((key, index, in_cohort))
}

/// Builds the quota groups of `tenants` (the batch's and their cohorts' members) from their limits and holdings.
pub(super) fn groups(
    tenants: &[Tenant],
    limits: Vec<LimitRow>,
    mut held: HashMap<String, Usage>,
) -> Result<HashMap<String, Vec<Member>>, StoreError> {
    let mut members: HashMap<String, Member> = tenants
        .iter()
        .map(|t| {
            let m = Member {
                tenant: t.id.clone(),
                held: held.remove(&t.id).unwrap_or_default(),
                weight: t.weight,
                ..Member::default()
            };
            (t.id.clone(), m)
        })
        .collect();
    let catalog = tessera_core::Catalog::builtin();
    for LimitRow { tenant_id: tenant, resource, limit_milli: limit, max_milli: max, lend_milli: lend } in limits {
        let Some(m) = members.get_mut(&tenant) else { continue };
        let r = tessera_core::quota::Resource::parse(catalog, &resource)
            .map_err(|e| StoreError::Corrupt(format!("quota resource `{resource}`: {e}")))?;
        let milli = |v: i64| u64::try_from(v).unwrap_or(0);
        m.guaranteed.insert(r.clone(), milli(limit));
        if let Some(max) = max {
            m.maximum.insert(r.clone(), milli(max));
        }
        if let Some(lend) = lend {
            m.lending.insert(r, milli(lend));
        }
    }
    let mut groups: HashMap<String, Vec<Member>> = HashMap::new();
    for t in tenants {
        let key = t.cohort_id.clone().unwrap_or_else(|| format!("tenant:{}", t.id));
        if let Some(m) = members.remove(&t.id) {
            groups.entry(key).or_default().push(m);
        }
    }
    Ok(groups)
}

/// A tenant's bounds on one resource, in thousandths.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct LimitRow {
    pub tenant_id: String,
    pub resource: String,
    pub limit_milli: i64,
    pub max_milli: Option<i64>,
    pub lend_milli: Option<i64>,
}

/// An amount of one resource, in thousandths, held by or charged to `owner_id` (a tenant, or a request).
#[derive(Debug, sqlx::FromRow)]
pub(super) struct MilliRow {
    pub owner_id: String,
    pub resource: String,
    pub milli: i64,
}

/// What to write for a batch, and what each request gets.
#[derive(Debug)]
pub(super) struct Plan {
    /// One per request, in order.
    pub outcomes: Vec<Result<Created, StoreError>>,
    /// Indexes of the requests to insert.
    pub inserts: Vec<usize>,
    /// Change of running usage per `(tenant, resource)`, in thousandths.
    pub usage: BTreeMap<(String, String), i64>,
}

/// Decides each request of `items` in order against `loaded`, as if each ran in its own transaction after the
/// ones before it.
pub(super) fn plan(items: &[(SliceRequest, NewRequest<'_>)], mut loaded: Loaded) -> Plan {
    let mut plan = Plan { outcomes: Vec::with_capacity(items.len()), inserts: Vec::new(), usage: BTreeMap::new() };
    for (i, (request, new)) in items.iter().enumerate() {
        let Some(tenant) = loaded.tenants.get(&request.tenant_id).cloned() else {
            plan.outcomes.push(Err(StoreError::NotFound { what: format!("tenant {}", request.tenant_id) }));
            continue;
        };
        let key = new.idempotency.map(|(u, k)| (u.to_string(), k.to_string()));
        if let Some(first) = key.as_ref().and_then(|k| loaded.keyed.get(k)) {
            plan.outcomes.push(Ok(Created { request: first.clone(), created: false, tenant }));
            continue;
        }
        let mut request = request.clone();
        if request.state.holds_quota() {
            let Some((group, who, in_cohort)) = place(&tenant, &loaded.groups) else {
                plan.outcomes.push(Err(StoreError::NotFound { what: format!("tenant {}", tenant.id) }));
                continue;
            };
            let members = loaded.groups.get_mut(&group).expect("placed in it");
            match admit(members, who, in_cohort, new.charge) {
                Err(errors) => {
                    plan.outcomes.push(Err(StoreError::Quota(errors)));
                    continue;
                }
                Ok(admission) => request.borrowed = admission.borrowed,
            }
            accumulate(&mut members[who].held, new.charge);
            for (resource, amount) in new.charge {
                let delta = plan.usage.entry((tenant.id.clone(), resource.to_string())).or_default();
                *delta = delta.saturating_add(i64::try_from(*amount).unwrap_or(i64::MAX));
            }
        }
        if let Some(k) = key {
            loaded.keyed.insert(k, request.clone());
        }
        plan.inserts.push(i);
        plan.outcomes.push(Ok(Created { request, created: true, tenant }));
    }
    plan
}

/// A request row with the key that created it, as `<user id>/<key>` (user ids are UUIDs, with no `/`).
#[derive(Debug, sqlx::FromRow)]
pub(super) struct KeyedRequestRow {
    user_key: String,
    #[sqlx(flatten)]
    request: RequestRow,
}

/// Files keyed request rows by their key.
pub(super) fn keyed_requests(rows: Vec<KeyedRequestRow>, into: &mut Loaded) -> Result<(), StoreError> {
    for KeyedRequestRow { user_key: uk, request } in rows {
        let (u, k) = uk.split_once('/').ok_or_else(|| StoreError::Corrupt(format!("idempotency key `{uk}`")))?;
        into.keyed.insert((u.to_string(), k.to_string()), super::request_from(request)?);
    }
    Ok(())
}

/// The accepted requests' `request_charges` rows: `(request id, resource, milli)`.
pub(super) fn charge_rows<'a>(inserted: &[&'a (SliceRequest, NewRequest<'a>)]) -> Vec<(&'a str, String, i64)> {
    inserted
        .iter()
        .flat_map(|(r, n)| {
            n.charge.iter().map(|(res, m)| (r.id.as_str(), res.to_string(), i64::try_from(*m).unwrap_or(i64::MAX)))
        })
        .collect()
}

/// The accepted requests' `idempotency_keys` rows: `(user, key, request id)`.
pub(super) fn key_rows<'a>(inserted: &[&'a (SliceRequest, NewRequest<'a>)]) -> Vec<(&'a str, &'a str, &'a str)> {
    inserted.iter().filter_map(|(r, n)| n.idempotency.map(|(u, k)| (u, k, r.id.as_str()))).collect()
}

/// Whether a batch failed because of a concurrent writer (a unique key taken meanwhile, a deadlock, a
/// serialization failure): then nothing was committed, and its requests can be tried one at a time.
pub(super) fn lost_to_another_writer(e: &StoreError) -> bool {
    match e {
        StoreError::Conflict { .. } => true,
        StoreError::Other(sqlx::Error::Database(db)) => {
            db.is_unique_violation() || matches!(db.code().as_deref(), Some("40P01" | "40001"))
        }
        _ => false,
    }
}

/// Groups amounts by their owner (a tenant, or a request).
pub(super) fn usage_by_tenant(rows: Vec<MilliRow>) -> Result<HashMap<String, Usage>, StoreError> {
    let mut grouped: HashMap<String, Vec<(String, i64)>> = HashMap::new();
    for MilliRow { owner_id, resource, milli } in rows {
        grouped.entry(owner_id).or_default().push((resource, milli));
    }
    grouped.into_iter().map(|(t, rows)| Ok((t, super::usage_from_rows(rows)?))).collect()
}

/// Closes a list of bound values opened by the caller's `... IN (`.
fn push_list<'a, DB: sqlx::Database>(q: &mut QueryBuilder<'a, DB>, values: &BTreeSet<&'a str>)
where
    &'a str: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
{
    if values.is_empty() {
        // `IN ()` is a syntax error on PostgreSQL; `IN (NULL)` matches nothing on both backends.
        q.push("NULL)");
        return;
    }
    let mut list = q.separated(", ");
    for v in values {
        list.push_bind(*v);
    }
    q.push(")");
}

impl Store {
    /// Creates many requests in one transaction (group commit): each is decided in order exactly as
    /// [`Store::create_request`] would decide it, and gets its own outcome. More than [`MAX_BATCH`] go in several
    /// transactions. Where a batch fails as a whole because of another writer (a concurrent writer took one of its
    /// idempotency keys, a deadlock or serialization failure), its requests are created one at a time instead, so
    /// one request never fails another; any other failure (the database is unreachable, the commit was lost) is
    /// every request's outcome, never retried, because the commit may have happened.
    pub async fn create_requests(&self, batch: &[NewRequest<'_>]) -> Vec<Result<Created, StoreError>> {
        let mut outcomes = Vec::with_capacity(batch.len());
        for chunk in batch.chunks(MAX_BATCH) {
            outcomes.extend(self.create_batch(chunk).await);
        }
        outcomes
    }

    async fn create_batch(&self, batch: &[NewRequest<'_>]) -> Vec<Result<Created, StoreError>> {
        let now = now_ms();
        let items: Vec<(SliceRequest, NewRequest<'_>)> = batch.iter().map(|n| (n.to_request(now), *n)).collect();
        let done = {
            let _changing = self.changing();
            self.write_batch(&items).await
        };
        match done {
            Ok(outcomes) => outcomes,
            Err(e) if batch.len() == 1 => vec![Err(e)],
            Err(e) if lost_to_another_writer(&e) => {
                tracing::debug!(error = %e, size = batch.len(), "batch lost to another writer; creating one at a time");
                let mut outcomes = Vec::with_capacity(batch.len());
                for new in batch {
                    outcomes.push(self.create_one(*new).await);
                }
                outcomes
            }
            Err(e) => {
                let failed = e.to_string();
                let mut outcomes = vec![Err(e)];
                outcomes.extend((1..batch.len()).map(|_| Err(StoreError::Failed(failed.clone()))));
                outcomes
            }
        }
    }

    async fn create_one(&self, new: NewRequest<'_>) -> Result<Created, StoreError> {
        let (request, created) = self.create_request(new).await?;
        let tenant = self.tenant(new.tenant_id).await?;
        Ok(Created { request, created, tenant })
    }

    /// Locks and reads what the batch needs (the batch's tenants in id order, so it serialises with every other
    /// writer for them and two batches cannot deadlock; on SQLite the transaction holds the write lock), plans it,
    /// and writes what was accepted with one statement per table.
    pub(super) async fn write_batch(
        &self,
        items: &[(SliceRequest, NewRequest<'_>)],
    ) -> Result<Vec<Result<Created, StoreError>>, StoreError> {
        let tenant_ids: BTreeSet<&str> = items.iter().map(|(r, _)| r.tenant_id.as_str()).collect();
        let keys: BTreeSet<(&str, &str)> = items.iter().filter_map(|(_, n)| n.idempotency).collect();
        on_pool!(self, pool, dialect, DB => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let mut loaded = Loaded::default();
            let mut q = QueryBuilder::<DB>::new(format!("SELECT {TENANT_COLUMNS} WHERE id IN ("));
            push_list(&mut q, &tenant_ids);
            q.push(format!(" ORDER BY id{}", dialect.lock()));
            for row in q.build_query_as::<TenantRow>().fetch_all(&mut *tx).await? {
                let tenant = tenant_from(row);
                loaded.tenants.insert(tenant.id.clone(), tenant);
            }
            // A cohort's admissions serialise on its row (after every tenant row, in id order: no deadlock), and
            // read every member's limits and holdings.
            let cohort_ids: BTreeSet<String> = loaded.tenants.values().filter_map(|t| t.cohort_id.clone()).collect();
            let mut everyone: Vec<Tenant> = loaded.tenants.values().cloned().collect();
            if !cohort_ids.is_empty() {
                let ids: BTreeSet<&str> = cohort_ids.iter().map(String::as_str).collect();
                let mut q = QueryBuilder::<DB>::new("SELECT id FROM cohorts WHERE id IN (");
                push_list(&mut q, &ids);
                q.push(format!(" ORDER BY id{}", dialect.lock()));
                let _: Vec<(String,)> = q.build_query_as().fetch_all(&mut *tx).await?;
                let mut q = QueryBuilder::<DB>::new(format!("SELECT {TENANT_COLUMNS} WHERE cohort_id IN ("));
                push_list(&mut q, &ids);
                for row in q.build_query_as::<TenantRow>().fetch_all(&mut *tx).await? {
                    let t = tenant_from(row);
                    if !loaded.tenants.contains_key(&t.id) {
                        everyone.push(t);
                    }
                }
            }
            let all_ids: BTreeSet<&str> = everyone.iter().map(|t| t.id.as_str()).collect();
            let mut q = QueryBuilder::<DB>::new(
                "SELECT tenant_id, resource, limit_milli, max_milli, lend_milli FROM quotas WHERE tenant_id IN (",
            );
            push_list(&mut q, &all_ids);
            let limits: Vec<LimitRow> = q.build_query_as().fetch_all(&mut *tx).await?;
            let mut q = QueryBuilder::<DB>::new(
                "SELECT tenant_id AS owner_id, resource, held_milli AS milli FROM tenant_usage \
                 WHERE held_milli > 0 AND tenant_id IN (",
            );
            push_list(&mut q, &all_ids);
            let held = usage_by_tenant(q.build_query_as().fetch_all(&mut *tx).await?)?;
            loaded.groups = groups(&everyone, limits, held)?;
            if !keys.is_empty() {
                let mut q = QueryBuilder::<DB>::new(format!(
                    "SELECT k.user_id || '/' || k.key AS user_key, {REQUEST_COLUMNS} JOIN idempotency_keys k \
                     ON k.request_id = slice_requests.id WHERE (k.user_id, k.key) IN (VALUES "
                ));
                let mut list = q.separated(", ");
                for (u, k) in &keys {
                    list.push("(").push_bind_unseparated(*u).push_unseparated(", ").push_bind_unseparated(*k);
                    list.push_unseparated(")");
                }
                q.push(")");
                keyed_requests(q.build_query_as::<KeyedRequestRow>().fetch_all(&mut *tx).await?, &mut loaded)?;
            }

            // A request is replaced by one request at a time: checked under the tenant's lock taken above, so two
            // replacements asked for at once cannot both pass (the batch then goes one request at a time, and only
            // the second replacement fails).
            let mut replaced = BTreeSet::new();
            for old in items.iter().filter_map(|(_, n)| n.replaces) {
                let open: Option<(String,)> = sqlx::query_as(super::requests::OPEN_REPLACEMENT)
                    .bind(old)
                    .fetch_optional(&mut *tx)
                    .await?;
                if open.is_some() || !replaced.insert(old) {
                    return Err(StoreError::Conflict { constraint: "replacement_open".to_string() });
                }
            }
            let plan = plan(items, loaded);
            let borrowed: BTreeSet<&str> = plan
                .outcomes
                .iter()
                .filter_map(|o| o.as_ref().ok())
                .filter(|c| c.created && c.request.borrowed)
                .map(|c| c.request.id.as_str())
                .collect();
            let inserted: Vec<&(SliceRequest, NewRequest<'_>)> = plan.inserts.iter().map(|&i| &items[i]).collect();
            if inserted.is_empty() {
                tx.commit().await?;
                return Ok(plan.outcomes);
            }
            let mut q = QueryBuilder::<DB>::new(
                "INSERT INTO slice_requests (id, tenant_id, spec, count, state, reason, version, created_at_ms, \
                 updated_at_ms, duration_s, priority, borrowed) ",
            );
            q.push_values(&inserted, |mut b, (r, _)| {
                b.push_bind(&r.id).push_bind(&r.tenant_id).push_bind(to_json(&r.spec));
                b.push_unseparated(dialect.json_cast())
                    .push_bind(i64::from(r.count))
                    .push_bind(r.state.as_str())
                    .push_bind(&r.reason)
                    .push_bind(r.version)
                    .push_bind(r.created_at_ms)
                    .push_bind(r.updated_at_ms)
                    .push_bind(r.duration_s.and_then(|d| i64::try_from(d).ok()))
                    .push_bind(r.priority.as_str())
                    .push_bind(borrowed.contains(r.id.as_str()));
            });
            q.build().execute(&mut *tx).await?;
            let replacing: Vec<(&str, &str, i64)> = inserted
                .iter()
                .filter_map(|(r, n)| Some((r.id.as_str(), n.replaces?, r.created_at_ms)))
                .collect();
            if !replacing.is_empty() {
                let mut q = QueryBuilder::<DB>::new(
                    "INSERT INTO request_replacements (request_id, replaces_request_id, created_at_ms) ",
                );
                q.push_values(&replacing, |mut b, (id, old, at)| {
                    b.push_bind(*id).push_bind(*old).push_bind(*at);
                });
                q.build().execute(&mut *tx).await?;
            }
            let charges = charge_rows(&inserted);
            if !charges.is_empty() {
                let mut q = QueryBuilder::<DB>::new("INSERT INTO request_charges (request_id, resource, amount_milli) ");
                q.push_values(&charges, |mut b, (id, res, m)| {
                    b.push_bind(*id).push_bind(res).push_bind(*m);
                });
                q.build().execute(&mut *tx).await?;
            }
            if !plan.usage.is_empty() {
                let mut q = QueryBuilder::<DB>::new("INSERT INTO tenant_usage (tenant_id, resource, held_milli) ");
                q.push_values(&plan.usage, |mut b, ((t, res), m)| {
                    b.push_bind(t).push_bind(res).push_bind(*m);
                });
                q.push(
                    " ON CONFLICT (tenant_id, resource) DO UPDATE \
                     SET held_milli = tenant_usage.held_milli + excluded.held_milli",
                );
                q.build().execute(&mut *tx).await?;
            }
            let keyed = key_rows(&inserted);
            if !keyed.is_empty() {
                let mut q = QueryBuilder::<DB>::new("INSERT INTO idempotency_keys (user_id, key, request_id) ");
                q.push_values(&keyed, |mut b, (u, k, id)| {
                    b.push_bind(*u).push_bind(*k).push_bind(*id);
                });
                q.build().execute(&mut *tx).await.map_err(|e| on_constraint(e, "idempotency_keys"))?;
            }
            let at = now_ms();
            let mut q = QueryBuilder::<DB>::new(
                "INSERT INTO audit_log (at_ms, actor, action, object, before_json, after_json) ",
            );
            q.push_values(&inserted, |mut b, (r, n)| {
                b.push_bind(at)
                    .push_bind(n.actor)
                    .push_bind("request.create")
                    .push_bind(format!("request/{}", r.id))
                    .push_bind(None::<String>)
                    .push_unseparated(dialect.json_cast())
                    .push_bind(to_json(&SliceRequest { borrowed: borrowed.contains(r.id.as_str()), ..(*r).clone() }))
                    .push_unseparated(dialect.json_cast());
            });
            q.build().execute(&mut *tx).await?;
            // The outbox: one `request.created` event per request, in the same transaction.
            let events: Vec<(String, &'static str, Option<String>, String, String)> = inserted
                .iter()
                .filter_map(|(r, n)| {
                    let after = to_json(&SliceRequest { borrowed: borrowed.contains(r.id.as_str()), ..(*r).clone() });
                    let (id, kind, tenant, data) =
                        event_of(n.actor, "request.create", None, Some(&after))?;
                    Some((id, kind, tenant, format!("request/{}", r.id), data))
                })
                .collect();
            if !events.is_empty() {
                let mut q = QueryBuilder::<DB>::new("INSERT INTO events (id, type, tenant_id, subject, at_ms, data) ");
                q.push_values(&events, |mut b, (id, kind, tenant, subject, data)| {
                    b.push_bind(id)
                        .push_bind(*kind)
                        .push_bind(tenant)
                        .push_bind(subject)
                        .push_bind(at)
                        .push_bind(data)
                        .push_unseparated(dialect.json_cast());
                });
                q.build().execute(&mut *tx).await?;
            }
            tx.commit().await?;
            Ok(plan.outcomes)
        })
    }
}
