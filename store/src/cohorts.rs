//! Cohorts and reclaim: creating cohorts, putting tenants in them (with a weight), maximums and lending limits
//! beside each guarantee, and rebalancing a cohort: marking which live requests are borrowed, telling the holders
//! of the borrowed requests a lender needs back (with a deadline: now plus the cohort's grace period), withdrawing
//! that notice when the need goes away, and releasing what is due. The rules are `tessera_core::cohort`'s.
//!
//! Admissions into a cohort lock the cohort's row after their tenants' rows (see [`super::batch`]); a rebalance
//! locks the same row, so it never interleaves with an admission into the cohort. Releasing only lowers what is
//! held, which can never break a cohort's balance, so releases need no cohort lock.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use tessera_core::cohort::{Candidate, Held, Member, choose_reclaim, mark_borrowed};
use tessera_core::quota::{Milli, Resource, Usage};
use tessera_core::request::RequestState;

use super::batch::{LimitRow, MilliRow, groups, usage_by_tenant};
use super::requests::{TENANT_COLUMNS, quotas_in};
use super::writes::{REQUEST_COLUMNS, adjust_usage, audit_insert, release_allocations};
use super::{
    RequestRow, SliceRequest, Store, StoreError, Tenant, TenantRow, new_id, now_ms, on_constraint, request_from,
    tenant_from, to_json,
};

/// The audit actor of reclaims.
pub use tessera_core::event::RECLAIMER;

/// A cohort.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Cohort {
    /// UUIDv7.
    pub id: String,
    /// Unique name.
    pub name: String,
    /// Seconds between telling a holder its borrowed request is reclaimed and releasing it.
    pub grace_s: u32,
    /// UTC ms.
    pub created_at_ms: i64,
    /// Member tenants' ids, by name.
    pub members: Vec<String>,
}

/// Which bound beside a guarantee.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// The most the tenant may hold by borrowing.
    Maximum,
    /// The most of its unused guarantee others may borrow.
    Lending,
}

impl Bound {
    fn column(self) -> &'static str {
        match self {
            Bound::Maximum => "max_milli",
            Bound::Lending => "lend_milli",
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Bound::Maximum => "maximum",
            Bound::Lending => "lending",
        }
    }
}

/// What one rebalance did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rebalanced {
    /// Requests whose holders were told now.
    pub told: Vec<String>,
    /// Notices withdrawn (the lender no longer needs them).
    pub withdrawn: Vec<String>,
    /// Requests released or cancelled now, their deadline passed.
    pub released: Vec<SliceRequest>,
    /// GPUs whose allocations were released.
    pub gpus: Vec<String>,
}

/// A cohort row, without its members.
#[derive(Debug, sqlx::FromRow)]
struct CohortRow {
    id: String,
    name: String,
    grace_s: i64,
    created_at_ms: i64,
}

async fn cohort_rows<'c>(
    conn: impl Into<super::dialect::Conn<'c>>,
    id: Option<&str>,
) -> Result<Vec<Cohort>, StoreError> {
    let (rows, members): (Vec<CohortRow>, Vec<(String, String)>) = on_conn!(conn.into(), conn, _dialect => {
        let rows = match id {
            Some(id) => {
                sqlx::query_as("SELECT id, name, grace_s, created_at_ms FROM cohorts WHERE id = $1")
                    .bind(id)
                    .fetch_all(&mut *conn)
                    .await?
            }
            None => sqlx::query_as("SELECT id, name, grace_s, created_at_ms FROM cohorts ORDER BY name")
                .fetch_all(&mut *conn)
                .await?,
        };
        let members = sqlx::query_as("SELECT cohort_id, id FROM tenants WHERE cohort_id IS NOT NULL ORDER BY name")
            .fetch_all(&mut *conn)
            .await?;
        (rows, members)
    });
    let mut by_cohort: HashMap<String, Vec<String>> = HashMap::new();
    for (cohort, tenant) in members {
        by_cohort.entry(cohort).or_default().push(tenant);
    }
    Ok(rows
        .into_iter()
        .map(|CohortRow { id, name, grace_s, created_at_ms }| Cohort {
            members: by_cohort.remove(&id).unwrap_or_default(),
            id,
            name,
            grace_s: u32::try_from(grace_s).unwrap_or(u32::MAX),
            created_at_ms,
        })
        .collect())
}

impl Store {
    /// Creates a cohort; a taken name is a conflict on `cohorts.name`.
    pub async fn create_cohort(&self, name: &str, grace_s: u32, actor: &str) -> Result<Cohort, StoreError> {
        let c = Cohort { id: new_id(), name: name.to_string(), grace_s, created_at_ms: now_ms(), members: vec![] };
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            sqlx::query("INSERT INTO cohorts (id, name, grace_s, created_at_ms) VALUES ($1, $2, $3, $4)")
                .bind(&c.id)
                .bind(&c.name)
                .bind(i64::from(c.grace_s))
                .bind(c.created_at_ms)
                .execute(&mut *tx)
                .await
                .map_err(|e| on_constraint(e, "cohorts"))?;
            audit_insert(&mut tx, actor, "cohort.create", &format!("cohort/{}", c.id), None, Some(to_json(&c))).await?;
            tx.commit().await?;
        });
        Ok(c)
    }

    /// Every cohort, by name.
    pub async fn cohorts(&self) -> Result<Vec<Cohort>, StoreError> {
        on_pool!(self, pool, _dialect => cohort_rows(&mut *pool.acquire().await?, None).await)
    }

    /// A cohort by id.
    pub async fn cohort(&self, id: &str) -> Result<Cohort, StoreError> {
        let found = on_pool!(self, pool, _dialect => cohort_rows(&mut *pool.acquire().await?, Some(id)).await?);
        found.into_iter().next().ok_or_else(|| StoreError::NotFound { what: format!("cohort {id}") })
    }

    /// Changes a cohort's grace period (deadlines already given stand).
    pub async fn set_cohort_grace(&self, id: &str, grace_s: u32, actor: &str) -> Result<Cohort, StoreError> {
        let before = self.cohort(id).await?;
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            sqlx::query("UPDATE cohorts SET grace_s = $1 WHERE id = $2")
                .bind(i64::from(grace_s))
                .bind(id)
                .execute(&mut *tx)
                .await?;
            let after = Cohort { grace_s, ..before.clone() };
            let object = format!("cohort/{id}");
            audit_insert(&mut tx, actor, "cohort.grace", &object, Some(to_json(&before)), Some(to_json(&after))).await?;
            tx.commit().await?;
        });
        self.cohort(id).await
    }

    /// Puts a tenant in a cohort (`None`: in none) with a weight. Its borrowed requests stay until the next
    /// rebalance of its cohorts decides on them.
    pub async fn set_cohort(
        &self,
        tenant_id: &str,
        cohort_id: Option<&str>,
        weight: u32,
        actor: &str,
    ) -> Result<Tenant, StoreError> {
        let _changing = self.changing();
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let read = format!("SELECT {TENANT_COLUMNS} WHERE id = $1");
            let row: Option<TenantRow> =
                sqlx::query_as(&format!("{read}{}", dialect.lock())).bind(tenant_id).fetch_optional(&mut *tx).await?;
            let before = tenant_from(row.ok_or_else(|| StoreError::NotFound { what: format!("tenant {tenant_id}") })?);
            if let Some(c) = cohort_id {
                let found: Option<(String,)> =
                    sqlx::query_as(&format!("SELECT id FROM cohorts WHERE id = $1{}", dialect.lock()))
                        .bind(c)
                        .fetch_optional(&mut *tx)
                        .await?;
                if found.is_none() {
                    return Err(StoreError::NotFound { what: format!("cohort {c}") });
                }
            }
            sqlx::query("UPDATE tenants SET cohort_id = $1, weight = $2 WHERE id = $3")
                .bind(cohort_id)
                .bind(i64::from(weight.max(1)))
                .bind(tenant_id)
                .execute(&mut *tx)
                .await?;
            let row: TenantRow = sqlx::query_as(&read).bind(tenant_id).fetch_one(&mut *tx).await?;
            let after = tenant_from(row);
            let object = format!("tenant/{tenant_id}");
            audit_insert(&mut tx, actor, "tenant.cohort", &object, Some(to_json(&before)), Some(to_json(&after))).await?;
            tx.commit().await?;
            Ok(after)
        })
    }

    /// A tenant's maximums and lending limits, by resource.
    pub async fn bounds(&self, tenant_id: &str) -> Result<(Usage, Usage), StoreError> {
        let rows: Vec<LimitRow> = on_pool!(self, pool, _dialect => {
            sqlx::query_as(
                "SELECT tenant_id, resource, limit_milli, max_milli, lend_milli FROM quotas WHERE tenant_id = $1",
            )
            .bind(tenant_id)
            .fetch_all(pool)
            .await?
        });
        let t = Tenant {
            id: tenant_id.to_string(),
            name: String::new(),
            policy: tessera_core::quota::ApprovalPolicy { auto_approve: false, auto_approve_max_compute_slices: 0 },
            created_at_ms: 0,
            cohort_id: None,
            weight: 1,
        };
        let mut g = groups(&[t], rows, HashMap::new())?;
        let m = g.drain().next().and_then(|(_, mut v)| v.pop()).unwrap_or_default();
        Ok((m.maximum, m.lending))
    }

    /// Sets limits (guarantees) and the bounds beside them in one transaction, keeping each change. A bound needs
    /// the resource's guarantee (after `limits`); a maximum is at least the guarantee.
    pub async fn set_quota_lines(
        &self,
        tenant_id: &str,
        limits: &[(Resource, Option<Milli>)],
        bounds: &[(Resource, Bound, Option<Milli>)],
        actor: &str,
        why: &str,
    ) -> Result<(), StoreError> {
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            sqlx::query_as::<_, (String,)>(&format!("SELECT id FROM tenants WHERE id = $1{}", dialect.lock()))
                .bind(tenant_id)
                .fetch_optional(&mut *tx)
                .await?
                .ok_or_else(|| StoreError::NotFound { what: format!("tenant {tenant_id}") })?;
            let current = quotas_in(&mut tx, tenant_id).await?;
            for (resource, limit) in limits {
                let before = current.get(resource).copied();
                super::quotas::write_limit(&mut tx, tenant_id, &resource.to_string(), before, *limit, actor, why, None)
                    .await?;
            }
            let guarantees = quotas_in(&mut tx, tenant_id).await?;
            for (resource, bound, value) in bounds {
                let key = resource.to_string();
                let Some(&g) = guarantees.get(resource) else {
                    return Err(StoreError::Rule {
                        code: "quota_bound_without_limit",
                        detail: format!("{key} has no limit: set its guarantee before a {}", bound.kind()),
                    });
                };
                if *bound == Bound::Maximum && value.is_some_and(|m| m < g) {
                    return Err(StoreError::Rule {
                        code: "quota_maximum_below_guarantee",
                        detail: format!("the maximum of {key} must be at least its guarantee ({})", tessera_core::quota::show(g)),
                    });
                }
                let column = bound.column();
                let before: Option<(Option<i64>,)> = sqlx::query_as(&format!(
                    "SELECT {column} FROM quotas WHERE tenant_id = $1 AND resource = $2"
                ))
                .bind(tenant_id)
                .bind(&key)
                .fetch_optional(&mut *tx)
                .await?;
                let before = before.and_then(|(b,)| b).map(|b| u64::try_from(b).unwrap_or(0));
                if before == *value {
                    continue;
                }
                let db = value.map(|v| i64::try_from(v).unwrap_or(i64::MAX));
                sqlx::query(&format!("UPDATE quotas SET {column} = $1 WHERE tenant_id = $2 AND resource = $3"))
                    .bind(db)
                    .bind(tenant_id)
                    .bind(&key)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(
                    "INSERT INTO quota_limit_changes (tenant_id, resource, at_ms, actor, before_milli, after_milli, \
                     why, kind) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                )
                .bind(tenant_id)
                .bind(&key)
                .bind(now_ms())
                .bind(actor)
                .bind(before.map(|b| i64::try_from(b).unwrap_or(i64::MAX)))
                .bind(db)
                .bind(why)
                .bind(bound.kind())
                .execute(&mut *tx)
                .await?;
                let object = format!("tenant/{tenant_id}/quota/{key}");
                let json = |m: Option<Milli>| m.map(|m| format!("{{\"{}_milli\":{m}}}", bound.kind()));
                audit_insert(&mut tx, actor, &format!("quota.{}", bound.kind()), &object, json(before), json(*value))
                    .await?;
            }
            tx.commit().await?;
        });
        Ok(())
    }

    /// Rebalances one cohort at `now` (see the module docs). `cause`: the tenant whose request made the cohort
    /// short, named on the notices given now. `for_room`: borrowed requests to reclaim beside what the quota needs,
    /// so that waiting requests within their guarantee find room on the fleet, each with the tenant (id) it makes
    /// room for (the services choose them with the planner); any that is no longer borrowed is left alone.
    pub async fn rebalance(
        &self,
        cohort_id: &str,
        now: i64,
        cause: Option<&str>,
        for_room: &[(String, String)],
    ) -> Result<Rebalanced, StoreError> {
        let _changing = self.changing();
        let mut done = Rebalanced::default();
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let grace: Option<(i64,)> =
                sqlx::query_as(&format!("SELECT grace_s FROM cohorts WHERE id = $1{}", dialect.lock()))
                    .bind(cohort_id)
                    .fetch_optional(&mut *tx)
                    .await?;
            let Some((grace_s,)) = grace else {
                return Err(StoreError::NotFound { what: format!("cohort {cohort_id}") });
            };
            let tenants: Vec<Tenant> = sqlx::query_as::<_, TenantRow>(&format!(
                "SELECT {TENANT_COLUMNS} WHERE cohort_id = $1 ORDER BY id"
            ))
            .bind(cohort_id)
            .fetch_all(&mut *tx)
            .await?
            .into_iter()
            .map(tenant_from)
            .collect();
            if tenants.is_empty() {
                tx.commit().await?;
                return Ok(done);
            }
            let limits: Vec<LimitRow> = sqlx::query_as(
                "SELECT q.tenant_id, q.resource, q.limit_milli, q.max_milli, q.lend_milli FROM quotas q \
                 JOIN tenants t ON t.id = q.tenant_id WHERE t.cohort_id = $1",
            )
            .bind(cohort_id)
            .fetch_all(&mut *tx)
            .await?;
            let held = usage_by_tenant(
                sqlx::query_as(
                    "SELECT u.tenant_id AS owner_id, u.resource, u.held_milli AS milli FROM tenant_usage u \
                     JOIN tenants t ON t.id = u.tenant_id WHERE t.cohort_id = $1 AND u.held_milli > 0",
                )
                .bind(cohort_id)
                .fetch_all(&mut *tx)
                .await?,
            )?;
            let members: Vec<Member> = groups(&tenants, limits, held)?.remove(cohort_id).unwrap_or_default();
            let live: Vec<SliceRequest> = sqlx::query_as::<_, RequestRow>(&format!(
                "SELECT {REQUEST_COLUMNS} WHERE tenant_id IN (SELECT id FROM tenants WHERE cohort_id = $1) \
                 AND state IN ('pending', 'approved', 'provisioning', 'active') ORDER BY id"
            ))
            .bind(cohort_id)
            .fetch_all(&mut *tx)
            .await?
            .into_iter()
            .map(request_from)
            .collect::<Result<_, _>>()?;
            let charge_rows: Vec<MilliRow> = sqlx::query_as(
                "SELECT c.request_id AS owner_id, c.resource, c.amount_milli AS milli FROM request_charges c \
                 JOIN slice_requests r ON r.id = c.request_id JOIN tenants t ON t.id = r.tenant_id \
                 WHERE t.cohort_id = $1 \
                 AND r.state IN ('pending', 'approved', 'provisioning', 'active')",
            )
            .bind(cohort_id)
            .fetch_all(&mut *tx)
            .await?;
            let charges = usage_by_tenant(charge_rows)?;
            let empty = Usage::new();

            // Which live requests are borrowed, tenant by tenant.
            let mut borrowed: BTreeMap<&str, bool> = BTreeMap::new();
            for m in &members {
                let mine: Vec<&SliceRequest> = live.iter().filter(|r| r.tenant_id == m.tenant).collect();
                let held: Vec<Held<'_>> = mine
                    .iter()
                    .map(|r| Held {
                        priority: r.priority,
                        created_at_ms: r.created_at_ms,
                        charge: charges.get(&r.id).unwrap_or(&empty),
                    })
                    .collect();
                for (r, b) in mine.iter().zip(mark_borrowed(&m.guaranteed, &held)) {
                    borrowed.insert(r.id.as_str(), b);
                }
            }
            let index: HashMap<&str, usize> = members.iter().enumerate().map(|(i, m)| (m.tenant.as_str(), i)).collect();
            let candidates: Vec<Candidate> = live
                .iter()
                .filter(|r| borrowed.get(r.id.as_str()).copied().unwrap_or(false))
                .filter_map(|r| {
                    Some(Candidate {
                        id: r.id.clone(),
                        member: *index.get(r.tenant_id.as_str())?,
                        priority: r.priority,
                        created_at_ms: r.created_at_ms,
                        running: matches!(r.state, RequestState::Active | RequestState::Provisioning),
                        charge: charges.get(&r.id).cloned().unwrap_or_default(),
                        reclaim_at_ms: r.reclaim_at_ms,
                    })
                })
                .collect();
            let picked: BTreeSet<&str> =
                choose_reclaim(&members, &candidates).into_iter().map(|i| candidates[i].id.as_str()).collect();

            for r in &live {
                let is_borrowed = borrowed.get(r.id.as_str()).copied().unwrap_or(false);
                let room_for = for_room.iter().find(|(id, _)| *id == r.id).map(|(_, t)| t.as_str()).filter(|_| is_borrowed);
                let reclaim = picked.contains(r.id.as_str()) || room_for.is_some();
                let object = format!("request/{}", r.id);
                if reclaim && r.reclaim_at_ms.is_some_and(|at| at <= now) {
                    // Due: released (running) or cancelled (not yet running), giving back quota and instances.
                    let to = if r.state == RequestState::Active { RequestState::Released } else { RequestState::Cancelled };
                    let to = r.state.transition(to)?;
                    let lender = r.reclaim_for.clone().unwrap_or_else(|| "another tenant of the cohort".to_string());
                    let after = SliceRequest {
                        state: to,
                        reason: format!("reclaimed: borrowed capacity returned to {lender} after the grace period"),
                        version: r.version + 1,
                        updated_at_ms: now,
                        ..r.clone()
                    };
                    sqlx::query(
                        "UPDATE slice_requests SET state = $1, reason = $2, version = $3, updated_at_ms = $4 \
                         WHERE id = $5",
                    )
                    .bind(after.state.as_str())
                    .bind(&after.reason)
                    .bind(after.version)
                    .bind(after.updated_at_ms)
                    .bind(&after.id)
                    .execute(&mut *tx)
                    .await?;
                    let gpus: Vec<(String,)> = sqlx::query_as(
                        "SELECT DISTINCT gpu_id FROM allocations WHERE request_id = $1 AND state IN ('reserved', 'active')",
                    )
                    .bind(&r.id)
                    .fetch_all(&mut *tx)
                    .await?;
                    done.gpus.extend(gpus.into_iter().map(|(g,)| g));
                    release_allocations(&mut tx, &r.id).await?;
                    adjust_usage(&mut tx, &r.tenant_id, &r.id, -1).await?;
                    let action = format!("request.{}", after.state);
                    audit_insert(&mut tx, RECLAIMER, &action, &object, Some(to_json(r)), Some(to_json(&after))).await?;
                    done.released.push(after);
                    continue;
                }
                let (at, to) = match (reclaim, r.reclaim_at_ms) {
                    (true, Some(at)) => (Some(at), r.reclaim_for.clone()),
                    (true, None) => {
                        let lender = room_for
                            .or(cause)
                            .and_then(|c| tenants.iter().find(|t| t.id == c))
                            .map(|t| t.name.clone());
                        (Some(now.saturating_add(grace_s.saturating_mul(1000))), lender)
                    }
                    (false, _) => (None, None),
                };
                if is_borrowed == r.borrowed && at == r.reclaim_at_ms && to == r.reclaim_for {
                    continue;
                }
                let noticed = at != r.reclaim_at_ms;
                let version = if noticed { r.version + 1 } else { r.version };
                sqlx::query(
                    "UPDATE slice_requests SET borrowed = $1, reclaim_at_ms = $2, reclaim_for = $3, version = $4, \
                     updated_at_ms = $5 WHERE id = $6",
                )
                .bind(is_borrowed)
                .bind(at)
                .bind(&to)
                .bind(version)
                .bind(if noticed { now } else { r.updated_at_ms })
                .bind(&r.id)
                .execute(&mut *tx)
                .await?;
                if noticed {
                    let after = SliceRequest {
                        borrowed: is_borrowed,
                        reclaim_at_ms: at,
                        reclaim_for: to.clone(),
                        version,
                        updated_at_ms: now,
                        ..r.clone()
                    };
                    let action = if at.is_some() { "request.reclaim" } else { "request.reclaim_withdrawn" };
                    audit_insert(&mut tx, RECLAIMER, action, &object, Some(to_json(r)), Some(to_json(&after))).await?;
                    if at.is_some() {
                        done.told.push(r.id.clone());
                    } else {
                        done.withdrawn.push(r.id.clone());
                    }
                }
            }
            tx.commit().await?;
        });
        done.gpus.sort();
        done.gpus.dedup();
        Ok(done)
    }

    /// The quota group a tenant's admission is decided in, as it is now (no lock: for previews): its cohort's
    /// members (or the tenant alone), the tenant's index among them, and whether it is a cohort.
    pub async fn quota_group(&self, tenant_id: &str) -> Result<(Vec<Member>, usize, bool), StoreError> {
        let tenant = self.tenant(tenant_id).await?;
        let tenants: Vec<Tenant> = match &tenant.cohort_id {
            Some(c) => self.tenants().await?.into_iter().filter(|t| t.cohort_id.as_deref() == Some(c)).collect(),
            None => vec![tenant.clone()],
        };
        let ids: Vec<String> = tenants.iter().map(|t| t.id.clone()).collect();
        let (limits, held): (Vec<LimitRow>, Vec<MilliRow>) = on_pool!(self, pool, _dialect => {
            let mut limits = Vec::new();
            let mut held = Vec::new();
            for id in &ids {
                let l: Vec<LimitRow> = sqlx::query_as(
                    "SELECT tenant_id, resource, limit_milli, max_milli, lend_milli FROM quotas WHERE tenant_id = $1",
                )
                .bind(id)
                .fetch_all(pool)
                .await?;
                limits.extend(l);
                let h: Vec<MilliRow> = sqlx::query_as(
                    "SELECT tenant_id AS owner_id, resource, held_milli AS milli FROM tenant_usage \
                     WHERE tenant_id = $1 AND held_milli > 0",
                )
                .bind(id)
                .fetch_all(pool)
                .await?;
                held.extend(h);
            }
            (limits, held)
        });
        let key = tenant.cohort_id.clone().unwrap_or_else(|| format!("tenant:{}", tenant.id));
        let members = groups(&tenants, limits, usage_by_tenant(held)?)?.remove(&key).unwrap_or_default();
        let who = members
            .iter()
            .position(|m| m.tenant == tenant.id)
            .ok_or_else(|| StoreError::NotFound { what: format!("tenant {tenant_id}") })?;
        Ok((members, who, tenant.cohort_id.is_some()))
    }

    /// Clears the borrowed flags and reclaim notices of a tenant's requests (it left its cohort).
    pub async fn clear_borrowed(&self, tenant_id: &str) -> Result<(), StoreError> {
        let _changing = self.changing();
        on_pool!(self, pool, _dialect => {
            sqlx::query(
                "UPDATE slice_requests SET borrowed = $2, reclaim_at_ms = NULL, reclaim_for = NULL \
                 WHERE tenant_id = $1 AND (borrowed = $3 OR reclaim_at_ms IS NOT NULL)",
            )
            .bind(tenant_id)
            .bind(false)
            .bind(true)
            .execute(pool)
            .await?;
        });
        Ok(())
    }
}
