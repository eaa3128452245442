//! Creating many requests in one transaction (group commit). The backend locks and reads what every request of
//! the batch needs (its tenant, the tenant's limits and running usage, idempotency keys already used), [`plan`]
//! decides each request in arrival order exactly as one transaction per request would have, and the backend writes
//! what was accepted with one multi-row statement per table. A batch costs about ten statements however many
//! requests it holds, where one request alone costs about twelve.

use std::collections::{BTreeMap, HashMap};

use tessera_core::quota::{Usage, accumulate, check};

use super::{NewRequest, SliceRequest, StoreError, Tenant};

/// Most requests in one batch (each row binds at most 11 values; SQLite allows 32,766 per statement).
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
    /// Limits by tenant.
    pub limits: HashMap<String, Usage>,
    /// Running usage by tenant.
    pub held: HashMap<String, Usage>,
    /// Requests by the `(user, key)` that created them, for the keys the batch uses.
    pub keyed: HashMap<(String, String), SliceRequest>,
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
        if request.state.holds_quota() {
            let empty = Usage::new();
            let limits = loaded.limits.get(&tenant.id).unwrap_or(&empty);
            let held = loaded.held.entry(tenant.id.clone()).or_default();
            if let Err(errors) = check(limits, held, new.charge) {
                plan.outcomes.push(Err(StoreError::Quota(errors)));
                continue;
            }
            accumulate(held, new.charge);
            for (resource, amount) in new.charge {
                let delta = plan.usage.entry((tenant.id.clone(), resource.to_string())).or_default();
                *delta = delta.saturating_add(i64::try_from(*amount).unwrap_or(i64::MAX));
            }
        }
        if let Some(k) = key {
            loaded.keyed.insert(k, request.clone());
        }
        plan.inserts.push(i);
        plan.outcomes.push(Ok(Created { request: request.clone(), created: true, tenant }));
    }
    plan
}

/// A request row led by the `(user, key)` that created it.
pub(super) type KeyedRequestRow =
    (String, String, String, String, String, i64, String, String, i64, i64, i64, Option<i64>, Option<i64>);

/// Files keyed request rows by their key.
pub(super) fn keyed_requests(rows: Vec<KeyedRequestRow>, into: &mut Loaded) -> Result<(), StoreError> {
    for (u, k, id, tenant, spec, count, state, reason, version, created, updated, duration, expires) in rows {
        let row = (id, tenant, spec, count, state, reason, version, created, updated, duration, expires);
        into.keyed.insert((u, k), super::request_from(row)?);
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

/// Groups `(tenant, resource, milli)` rows by tenant.
pub(super) fn usage_by_tenant(rows: Vec<(String, String, i64)>) -> Result<HashMap<String, Usage>, StoreError> {
    let mut grouped: HashMap<String, Vec<(String, i64)>> = HashMap::new();
    for (tenant, resource, milli) in rows {
        grouped.entry(tenant).or_default().push((resource, milli));
    }
    grouped.into_iter().map(|(t, rows)| Ok((t, super::usage_from_rows(rows)?))).collect()
}
