//! Approvals with placements, layout proposals and allocations. One SQL body for both backends (see
//! [`super::dialect`]): on PostgreSQL writes lock the rows they check (the request, then the GPUs in id order, so
//! concurrent approvals cannot deadlock); on SQLite every write holds the database's write lock.

use std::collections::HashMap;

use tessera_core::layout::PlacedInstance;
use tessera_core::request::RequestState;

use super::dialect::Conn;
use super::writes::{adjust_usage, audit_insert, release_allocations, request_in, set_request};
use super::{
    Allocation, AllocationRow, Guard, LayoutChange, LayoutProposal, ProposalRow, Reservation, SliceRequest, Store,
    StoreError, Transition, allocation_from, layout_from, new_id, now_ms, on_constraint, proposal_from, to_json,
};

/// The columns of a [`ProposalRow`], and the table.
const PROPOSAL_COLUMNS: &str = "id, gpu_id, base_version, CAST(layout AS TEXT) AS layout, \
                                CAST(created AS TEXT) AS created, CAST(destroyed AS TEXT) AS destroyed, state, reason, \
                                created_by, decided_by, created_at_ms, decided_at_ms FROM layout_proposals";

/// The columns of an [`AllocationRow`] of table alias `a`.
pub(super) const ALLOCATION_FIELDS: &str =
    "a.id, a.request_id, a.tenant_id, a.gpu_id, a.profile, a.start, a.state, a.proposal_id";
/// The same columns as SQLite's `json_array` takes them ([`super::json_rows`]).
pub(super) const ALLOCATION_JSON: &str = ALLOCATION_FIELDS;

/// A GPU's layout version, locked for the rest of the transaction on PostgreSQL.
async fn layout_version<'c>(conn: impl Into<Conn<'c>>, gpu_id: &str) -> Result<i64, StoreError> {
    let v: Option<(i64,)> = on_conn!(conn.into(), conn, dialect => {
        sqlx::query_as(&format!("SELECT layout_version FROM gpus WHERE id = $1{}", dialect.lock()))
            .bind(gpu_id)
            .fetch_optional(&mut *conn)
            .await?
    });
    v.map(|(v,)| v).ok_or_else(|| StoreError::NotFound { what: format!("gpu {gpu_id}") })
}

async fn apply_layout<'c>(conn: impl Into<Conn<'c>>, gpu_id: &str, layout: &str) -> Result<(), StoreError> {
    on_conn!(conn.into(), conn, dialect => {
        sqlx::query(&format!(
            "UPDATE gpus SET layout = {}, layout_version = layout_version + 1 WHERE id = $2",
            dialect.json(1)
        ))
        .bind(layout)
        .bind(gpu_id)
        .execute(&mut *conn)
        .await?;
    });
    Ok(())
}

/// What an approval reads of a GPU it places on; the layout is JSON.
#[derive(Debug, sqlx::FromRow)]
struct GpuNowRow {
    layout_version: i64,
    layout: String,
    mig_enabled: bool,
}

/// A GPU's layout version, layout and MIG mode, locked for the rest of the transaction on PostgreSQL.
async fn gpu_now<'c>(conn: impl Into<Conn<'c>>, gpu_id: &str) -> Result<(i64, Vec<PlacedInstance>, bool), StoreError> {
    let row: Option<GpuNowRow> = on_conn!(conn.into(), conn, dialect => {
        sqlx::query_as(&format!(
            "SELECT layout_version, CAST(layout AS TEXT) AS layout, mig_enabled FROM gpus WHERE id = $1{}",
            dialect.lock()
        ))
        .bind(gpu_id)
        .fetch_optional(&mut *conn)
        .await?
    });
    let row = row.ok_or_else(|| StoreError::NotFound { what: format!("gpu {gpu_id}") })?;
    Ok((row.layout_version, layout_from(&row.layout)?, row.mig_enabled))
}

/// Whether every live allocation on a whole (non-MIG) GPU is shared the way `profile` says (`exclusive`,
/// `timeslice:<n>`, `mps:<n>`): one GPU is shared one way at a time.
async fn shared_alike<'c>(conn: impl Into<Conn<'c>>, gpu_id: &str, profile: &str) -> Result<bool, StoreError> {
    let sql = "SELECT id FROM allocations WHERE gpu_id = $1 AND state IN ('reserved', 'active') AND profile <> $2";
    let other: Option<(String,)> = on_conn!(conn.into(), conn, _dialect => {
        sqlx::query_as(sql).bind(gpu_id).bind(profile).fetch_optional(&mut *conn).await?
    });
    Ok(other.is_none())
}

/// Whether a live allocation (other than those waiting for `except`) holds the instance at `start`.
async fn in_use<'c>(
    conn: impl Into<Conn<'c>>,
    gpu_id: &str,
    start: u8,
    except: Option<&str>,
) -> Result<bool, StoreError> {
    let sql = "SELECT id FROM allocations WHERE gpu_id = $1 AND start = $2 AND state IN ('reserved', 'active') \
               AND (CAST($3 AS TEXT) IS NULL OR proposal_id IS NULL OR proposal_id <> CAST($3 AS TEXT))";
    let held: Option<(String,)> = on_conn!(conn.into(), conn, _dialect => {
        sqlx::query_as(sql).bind(gpu_id).bind(i64::from(start)).bind(except).fetch_optional(&mut *conn).await?
    });
    Ok(held.is_some())
}

/// Inserts the proposal for `ch` (approved at once when it auto-applies); a second open proposal for the GPU is a
/// conflict on `layout_proposals_open`.
async fn insert_proposal<'c>(
    conn: impl Into<Conn<'c>>,
    ch: &LayoutChange,
    actor: &str,
) -> Result<LayoutProposal, StoreError> {
    let p = LayoutProposal {
        id: new_id(),
        gpu_id: ch.gpu_id.clone(),
        base_version: ch.base_version,
        layout: ch.layout.clone(),
        created: ch.created.clone(),
        destroyed: ch.destroyed.clone(),
        state: if ch.auto_apply { "approved" } else { "proposed" }.to_string(),
        reason: String::new(),
        created_by: actor.to_string(),
        decided_by: ch.auto_apply.then(|| "auto-layout".to_string()),
        created_at_ms: now_ms(),
        decided_at_ms: ch.auto_apply.then(now_ms),
    };
    on_conn!(conn.into(), conn, dialect => {
        sqlx::query(&format!(
            "INSERT INTO layout_proposals (id, gpu_id, base_version, layout, created, destroyed, state, reason, \
             created_by, decided_by, created_at_ms, decided_at_ms) \
             VALUES ($1, $2, $3, {}, {}, {}, $7, $8, $9, $10, $11, $12)",
            dialect.json(4),
            dialect.json(5),
            dialect.json(6)
        ))
        .bind(&p.id)
        .bind(&p.gpu_id)
        .bind(p.base_version)
        .bind(to_json(&p.layout))
        .bind(to_json(&p.created))
        .bind(to_json(&p.destroyed))
        .bind(&p.state)
        .bind(&p.reason)
        .bind(&p.created_by)
        .bind(&p.decided_by)
        .bind(p.created_at_ms)
        .bind(p.decided_at_ms)
        .execute(&mut *conn)
        .await
        .map_err(|e| on_constraint(e, "layout_proposals_open"))?;
    });
    Ok(p)
}

/// How long a live allocation lasts: `(allocation id, expires_at_ms, borrowed, reclaim_at_ms, reclaim_for)`, from
/// its request.
pub type AllocationTerms = (String, Option<i64>, bool, Option<i64>, Option<String>);

/// A row of [`AllocationTerms`].
#[derive(Debug, sqlx::FromRow)]
struct TermsRow {
    allocation_id: String,
    expires_at_ms: Option<i64>,
    borrowed: bool,
    reclaim_at_ms: Option<i64>,
    reclaim_for: Option<String>,
}

impl Store {
    /// Approves a request with its placement, in one transaction: the request moves to approved (version
    /// checked), each layout change becomes a proposal (or is applied, on auto-layout GPUs, if the GPU's layout
    /// version is still the one planned on), and each slice reserves its exact instance. Fails with a conflict, and
    /// changes nothing, if the request, a GPU's layout, an open proposal or a reserved instance changed meanwhile.
    pub async fn approve_request(
        &self,
        t: Transition<'_>,
        changes: &[LayoutChange],
        reservations: &[Reservation],
        guard: Guard,
    ) -> Result<(SliceRequest, Vec<LayoutProposal>), StoreError> {
        let _changing = self.changing();
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let before = request_in(&mut tx, t.id, true).await?;
            // No reservation accepted since the placement was checked against the calendar.
            super::reservations::check_bookings(&mut tx, guard.bookings_version).await?;
            if let Some(by) = guard.ends_by_ms {
                sqlx::query("UPDATE slice_requests SET ends_by_ms = $1 WHERE id = $2 AND (ends_by_ms IS NULL OR ends_by_ms > $1)")
                    .bind(by)
                    .bind(&before.id)
                    .execute(&mut *tx)
                    .await?;
            }
            // Every GPU the approval touches, locked in id order (concurrent approvals cannot deadlock).
            let mut gpu_ids: Vec<&str> = changes
                .iter()
                .map(|c| c.gpu_id.as_str())
                .chain(reservations.iter().map(|r| r.gpu_id.as_str()))
                .collect();
            gpu_ids.sort_unstable();
            gpu_ids.dedup();
            let mut current: HashMap<String, (i64, Vec<PlacedInstance>, bool)> = HashMap::new();
            for id in gpu_ids {
                current.insert(id.to_string(), gpu_now(&mut tx, id).await?);
            }
            if t.expected_version.is_some_and(|v| v != before.version) {
                return Err(StoreError::Conflict { constraint: "version".to_string() });
            }
            let state = before.state.transition(RequestState::Approved)?;
            let mut proposals = Vec::with_capacity(changes.len());
            for ch in changes {
                if current.get(&ch.gpu_id).map(|c| c.0) != Some(ch.base_version) {
                    return Err(StoreError::Conflict { constraint: "gpu_layout_version".to_string() });
                }
                if ch.auto_apply {
                    // Applied now, so checked now: nothing it destroys may be held (a reservation made since
                    // planning).
                    for d in &ch.destroyed {
                        if in_use(&mut tx, &ch.gpu_id, d.start, None).await? {
                            return Err(StoreError::Conflict { constraint: "instance_in_use".to_string() });
                        }
                    }
                    apply_layout(&mut tx, &ch.gpu_id, &to_json(&ch.layout)).await?;
                }
                let p = insert_proposal(&mut tx, ch, t.actor).await?;
                let action = if ch.auto_apply { "layout.auto_apply" } else { "layout.propose" };
                audit_insert(&mut tx, t.actor, action, &format!("gpu/{}", p.gpu_id), None, Some(to_json(&p))).await?;
                proposals.push(p);
            }
            for r in reservations {
                // A MIG instance must exist on the GPU as it is now, or be created by one of this approval's
                // changes; a share of a whole GPU must match how the GPU is already shared.
                let exists = match (r.change, current.get(&r.gpu_id)) {
                    (None, Some((_, _, false))) => shared_alike(&mut tx, &r.gpu_id, &r.profile).await?,
                    (None, Some((_, layout, true))) => {
                        layout.iter().any(|i| i.profile == r.profile && i.start == r.start)
                    }
                    (Some(k), _) => changes.get(k).is_some_and(|c| {
                        c.gpu_id == r.gpu_id && c.created.iter().any(|i| i.profile == r.profile && i.start == r.start)
                    }),
                    (None, None) => false,
                };
                if !exists {
                    return Err(StoreError::Conflict { constraint: "gpu_layout_version".to_string() });
                }
                let proposal = r.change.and_then(|i| proposals.get(i)).map(|p| p.id.clone());
                sqlx::query(
                    "INSERT INTO allocations (id, request_id, tenant_id, gpu_id, profile, start, state, proposal_id, \
                     created_at_ms) VALUES ($1, $2, $3, $4, $5, $6, 'reserved', $7, $8)",
                )
                .bind(new_id())
                .bind(&before.id)
                .bind(&before.tenant_id)
                .bind(&r.gpu_id)
                .bind(&r.profile)
                .bind(i64::from(r.start))
                .bind(proposal)
                .bind(now_ms())
                .execute(&mut *tx)
                .await
                .map_err(|e| on_constraint(e, "allocations_live_instance"))?;
            }
            let after = SliceRequest { state, version: before.version + 1, updated_at_ms: now_ms(), ..before.clone() };
            set_request(&mut tx, &after, before.version).await?;
            let object = format!("request/{}", after.id);
            let (was, is) = (Some(to_json(&before)), Some(to_json(&after)));
            audit_insert(&mut tx, t.actor, "request.approved", &object, was, is).await?;
            tx.commit().await?;
            Ok((after, proposals))
        })
    }

    /// Proposes a layout for one GPU by hand (an admin's edit), if its layout is still at `change.base_version` and
    /// no other proposal is open for it.
    pub async fn propose_layout(&self, ch: &LayoutChange, actor: &str) -> Result<LayoutProposal, StoreError> {
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            if layout_version(&mut tx, &ch.gpu_id).await? != ch.base_version {
                return Err(StoreError::Conflict { constraint: "gpu_layout_version".to_string() });
            }
            let p = insert_proposal(&mut tx, ch, actor).await?;
            audit_insert(&mut tx, actor, "layout.propose", &format!("gpu/{}", p.gpu_id), None, Some(to_json(&p)))
                .await?;
            tx.commit().await?;
            Ok(p)
        })
    }

    /// A tenant's allocations that hold an instance, oldest first.
    pub async fn tenant_allocations(&self, tenant_id: &str) -> Result<Vec<Allocation>, StoreError> {
        Ok(self.live_allocations().await?.into_iter().filter(|a| a.tenant_id == tenant_id).collect())
    }

    /// When the requests behind a tenant's live allocations expire: (allocation id, its request's expiry).
    pub async fn allocation_expiries(&self, tenant_id: &str) -> Result<Vec<AllocationTerms>, StoreError> {
        let rows: Vec<TermsRow> = on_pool!(self, pool, _dialect => {
            sqlx::query_as(
                "SELECT a.id AS allocation_id, r.expires_at_ms, r.borrowed, r.reclaim_at_ms, r.reclaim_for \
                 FROM allocations a JOIN slice_requests r ON r.id = a.request_id \
                 WHERE a.tenant_id = $1 AND a.state IN ('reserved', 'active')",
            )
            .bind(tenant_id)
            .fetch_all(pool)
            .await?
        });
        Ok(rows
            .into_iter()
            .map(|r| (r.allocation_id, r.expires_at_ms, r.borrowed, r.reclaim_at_ms, r.reclaim_for))
            .collect())
    }

    /// An allocation by id, in whatever state.
    pub async fn allocation(&self, id: &str) -> Result<Option<Allocation>, StoreError> {
        let sql = format!("SELECT {ALLOCATION_FIELDS} FROM allocations a WHERE a.id = $1");
        let row: Option<AllocationRow> =
            on_pool!(self, pool, _dialect => sqlx::query_as(&sql).bind(id).fetch_optional(pool).await?);
        Ok(row.map(allocation_from))
    }

    /// Allocations that hold their instance (reserved or active).
    pub async fn live_allocations(&self) -> Result<Vec<Allocation>, StoreError> {
        let sql = format!("SELECT {ALLOCATION_FIELDS} FROM allocations a WHERE a.state IN ('reserved', 'active')");
        let rows: Vec<AllocationRow> = on_pool!(self, pool, _dialect => sqlx::query_as(&sql).fetch_all(pool).await?);
        Ok(rows.into_iter().map(allocation_from).collect())
    }

    /// Layout proposals, newest first, optionally only in one state.
    pub async fn proposals(&self, state: Option<&str>) -> Result<Vec<LayoutProposal>, StoreError> {
        let sql = format!(
            "SELECT {PROPOSAL_COLUMNS} WHERE CAST($1 AS TEXT) IS NULL OR state = CAST($1 AS TEXT) ORDER BY id DESC"
        );
        let rows: Vec<ProposalRow> =
            on_pool!(self, pool, _dialect => sqlx::query_as(&sql).bind(state).fetch_all(pool).await?);
        rows.into_iter().map(proposal_from).collect()
    }

    /// What each open proposal unblocks: the live requests whose allocations wait for it, `(proposal id, request
    /// id, tenant id, tenant name, spec as JSON, count, allocations it creates)`. Bounded by the open proposals.
    pub async fn proposal_needs(&self) -> Result<Vec<ProposalNeed>, StoreError> {
        let sql = "SELECT a.proposal_id, r.id AS request_id, r.tenant_id, t.name AS tenant_name,                    CAST(r.spec AS TEXT) AS spec, r.count, COUNT(*) AS slices FROM allocations a                    JOIN layout_proposals p ON p.id = a.proposal_id JOIN slice_requests r ON r.id = a.request_id                    JOIN tenants t ON t.id = r.tenant_id WHERE p.state = 'proposed' AND a.state IN ('reserved', 'active')                    GROUP BY a.proposal_id, r.id, r.tenant_id, t.name, CAST(r.spec AS TEXT), r.count                    ORDER BY a.proposal_id, r.id";
        Ok(on_pool!(self, pool, _dialect => sqlx::query_as(sql).fetch_all(pool).await?))
    }

    /// Approves a proposal (applies the layout if the GPU is still on the version planned on and nothing it
    /// destroys is in use) or rejects it (its reserved allocations are released and their requests fail, with the
    /// reason).
    pub async fn decide_proposal(
        &self,
        id: &str,
        approve: bool,
        reason: &str,
        actor: &str,
    ) -> Result<LayoutProposal, StoreError> {
        let _changing = self.changing();
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let row: Option<ProposalRow> =
                sqlx::query_as(&format!("SELECT {PROPOSAL_COLUMNS} WHERE id = $1{}", dialect.lock()))
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await?;
            let found = row.ok_or_else(|| StoreError::NotFound { what: format!("layout proposal {id}") })?;
            let before = proposal_from(found)?;
            if before.state != "proposed" {
                return Err(StoreError::Conflict { constraint: "proposal_decided".to_string() });
            }
            if approve {
                if layout_version(&mut tx, &before.gpu_id).await? != before.base_version {
                    return Err(StoreError::Conflict { constraint: "gpu_layout_version".to_string() });
                }
                for d in &before.destroyed {
                    if in_use(&mut tx, &before.gpu_id, d.start, Some(&before.id)).await? {
                        return Err(StoreError::Conflict { constraint: "instance_in_use".to_string() });
                    }
                }
                apply_layout(&mut tx, &before.gpu_id, &to_json(&before.layout)).await?;
            } else {
                // The slices waiting for this layout lose their instances; their requests fail with the reason.
                let waiting: Vec<(String,)> = sqlx::query_as(
                    "SELECT DISTINCT request_id FROM allocations WHERE proposal_id = $1 AND state = 'reserved'",
                )
                .bind(&before.id)
                .fetch_all(&mut *tx)
                .await?;
                sqlx::query("UPDATE allocations SET state = 'released' WHERE proposal_id = $1 AND state = 'reserved'")
                    .bind(&before.id)
                    .execute(&mut *tx)
                    .await?;
                for (request_id,) in waiting {
                    let r = request_in(&mut tx, &request_id, true).await?;
                    let Ok(state) = r.state.transition(RequestState::Failed) else { continue };
                    let why = format!("the layout change it needed was rejected: {reason}");
                    let version = r.version + 1;
                    let after = SliceRequest { state, reason: why, version, updated_at_ms: now_ms(), ..r.clone() };
                    set_request(&mut tx, &after, r.version).await?;
                    release_allocations(&mut tx, &r.id).await?;
                    adjust_usage(&mut tx, &r.tenant_id, &r.id, -1).await?;
                    let object = format!("request/{}", after.id);
                    let (was, is) = (Some(to_json(&r)), Some(to_json(&after)));
                    audit_insert(&mut tx, actor, "request.failed", &object, was, is).await?;
                }
            }
            let after = LayoutProposal {
                state: if approve { "approved" } else { "rejected" }.to_string(),
                reason: reason.to_string(),
                decided_by: Some(actor.to_string()),
                decided_at_ms: Some(now_ms()),
                ..before.clone()
            };
            sqlx::query(
                "UPDATE layout_proposals SET state = $1, reason = $2, decided_by = $3, decided_at_ms = $5 \
                 WHERE id = $4",
            )
            .bind(&after.state)
            .bind(&after.reason)
            .bind(&after.decided_by)
            .bind(&after.id)
            .bind(after.decided_at_ms)
            .execute(&mut *tx)
            .await?;
            let action = if approve { "layout.approve" } else { "layout.reject" };
            let (was, is) = (Some(to_json(&before)), Some(to_json(&after)));
            audit_insert(&mut tx, actor, action, &format!("gpu/{}", after.gpu_id), was, is).await?;
            tx.commit().await?;
            Ok(after)
        })
    }
}

/// A live request waiting for an open layout proposal (see [`Store::proposal_needs`]).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ProposalNeed {
    /// The proposal.
    pub proposal_id: String,
    /// The request.
    pub request_id: String,
    /// Its tenant.
    pub tenant_id: String,
    /// Its tenant's name.
    pub tenant_name: String,
    /// What one slice is, as JSON.
    pub spec: String,
    /// How many slices it asked for.
    pub count: i64,
    /// How many of its allocations the proposal creates.
    pub slices: i64,
}
