//! Approvals with placements, layout proposals and allocations on PostgreSQL. Writes lock the rows they check (the
//! request, then the GPUs in id order, so concurrent approvals cannot deadlock).

use sqlx::PgPool;
use sqlx::postgres::PgConnection;

use super::{audit_insert, ms, request_in, ts};
use crate::store::{
    Allocation, AllocationRow, LayoutChange, LayoutProposal, ProposalRow, Reservation, SliceRequest, StoreError,
    Transition, allocation_from, layout_from, new_id, now_ms, on_constraint, proposal_from, to_json,
};
use tessera_core::layout::PlacedInstance;
use tessera_core::request::RequestState;

fn proposal_select() -> String {
    format!(
        "id, gpu_id, base_version, layout::text, created::text, destroyed::text, state, reason, created_by, \
         decided_by, {}, {} FROM layout_proposals",
        ms("created_at"),
        ms("decided_at")
    )
}
const ALLOCATION_FIELDS: &str = "id, request_id, tenant_id, gpu_id, profile, start::bigint, state, proposal_id";

async fn layout_version(conn: &mut PgConnection, gpu_id: &str) -> Result<i64, StoreError> {
    let v: Option<(i64,)> = sqlx::query_as("SELECT layout_version FROM gpus WHERE id = $1 FOR UPDATE")
        .bind(gpu_id)
        .fetch_optional(conn)
        .await?;
    v.map(|(v,)| v).ok_or_else(|| StoreError::NotFound { what: format!("gpu {gpu_id}") })
}

async fn apply_layout(conn: &mut PgConnection, gpu_id: &str, layout: &str) -> Result<(), StoreError> {
    sqlx::query("UPDATE gpus SET layout = $1::jsonb, layout_version = layout_version + 1 WHERE id = $2")
        .bind(layout)
        .bind(gpu_id)
        .execute(conn)
        .await?;
    Ok(())
}

async fn set_request(conn: &mut PgConnection, r: &SliceRequest, before_version: i64) -> Result<(), StoreError> {
    let done = sqlx::query(&format!(
        "UPDATE slice_requests SET state = $1, reason = $2, version = $3, updated_at = {} WHERE id = $5 AND version = $6",
        ts(4)
    ))
    .bind(r.state.as_str())
    .bind(&r.reason)
    .bind(r.version)
    .bind(r.updated_at_ms)
    .bind(&r.id)
    .bind(before_version)
    .execute(conn)
    .await?;
    if done.rows_affected() == 1 { Ok(()) } else { Err(StoreError::Conflict { constraint: "version".to_string() }) }
}

/// A GPU's layout version, layout and MIG mode, locked for the rest of the transaction.
async fn gpu_now(conn: &mut PgConnection, gpu_id: &str) -> Result<(i64, Vec<PlacedInstance>, bool), StoreError> {
    let row: Option<(i64, String, bool)> =
        sqlx::query_as("SELECT layout_version, layout::text, mig_enabled FROM gpus WHERE id = $1 FOR UPDATE")
            .bind(gpu_id)
            .fetch_optional(&mut *conn)
            .await?;
    let (version, layout, mig) = row.ok_or_else(|| StoreError::NotFound { what: format!("gpu {gpu_id}") })?;
    Ok((version, layout_from(&layout)?, mig))
}

/// Whether every live allocation on a whole (non-MIG) GPU is shared the way `profile` says (`exclusive`,
/// `timeslice:<n>`, `mps:<n>`): one GPU is shared one way at a time.
async fn shared_alike(conn: &mut PgConnection, gpu_id: &str, profile: &str) -> Result<bool, StoreError> {
    let other: Option<(String,)> = sqlx::query_as(
        "SELECT id FROM allocations WHERE gpu_id = $1 AND state IN ('reserved', 'active') AND profile <> $2",
    )
    .bind(gpu_id)
    .bind(profile)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(other.is_none())
}

/// Whether a live allocation (other than those waiting for `except`) holds the instance at `start`.
async fn in_use(conn: &mut PgConnection, gpu_id: &str, start: u8, except: Option<&str>) -> Result<bool, StoreError> {
    let held: Option<(String,)> = sqlx::query_as(
        "SELECT id FROM allocations WHERE gpu_id = $1 AND start = $2 AND state IN ('reserved', 'active') \
         AND ($3::text IS NULL OR proposal_id IS NULL OR proposal_id <> $3::text)",
    )
    .bind(gpu_id)
    .bind(i32::from(start))
    .bind(except)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(held.is_some())
}

pub(crate) async fn approve_request(
    pool: &PgPool,
    t: Transition<'_>,
    changes: &[LayoutChange],
    reservations: &[Reservation],
) -> Result<(SliceRequest, Vec<LayoutProposal>), StoreError> {
    let mut tx = pool.begin().await?;
    let conn: &mut PgConnection = &mut tx;
    let result = async {
        let before = request_in(conn, t.id, true).await?;
        // Every GPU the approval touches, locked in id order (concurrent approvals cannot deadlock).
        let mut gpu_ids: Vec<&str> =
            changes.iter().map(|c| c.gpu_id.as_str()).chain(reservations.iter().map(|r| r.gpu_id.as_str())).collect();
        gpu_ids.sort_unstable();
        gpu_ids.dedup();
        let mut current = std::collections::HashMap::new();
        for id in gpu_ids {
            current.insert(id.to_string(), gpu_now(conn, id).await?);
        }
        if t.expected_version.is_some_and(|v| v != before.version) {
            return Err(StoreError::Conflict { constraint: "version".to_string() });
        }
        let state = before.state.transition(RequestState::Approved)?;
        let mut proposals = Vec::with_capacity(changes.len());
        for ch in changes {
            if current.get(&ch.gpu_id).map(|c: &(i64, Vec<PlacedInstance>, bool)| c.0) != Some(ch.base_version) {
                return Err(StoreError::Conflict { constraint: "gpu_layout_version".to_string() });
            }
            if ch.auto_apply {
                // Applied now, so checked now: nothing it destroys may be held (a reservation made since planning).
                for d in &ch.destroyed {
                    if in_use(conn, &ch.gpu_id, d.start, None).await? {
                        return Err(StoreError::Conflict { constraint: "instance_in_use".to_string() });
                    }
                }
                apply_layout(conn, &ch.gpu_id, &to_json(&ch.layout)).await?;
            }
            let p = insert_proposal(conn, ch, t.actor).await?;
            let action = if ch.auto_apply { "layout.auto_apply" } else { "layout.propose" };
            audit_insert(conn, t.actor, action, &format!("gpu/{}", p.gpu_id), None, Some(to_json(&p))).await?;
            proposals.push(p);
        }
        for r in reservations {
            // The instance must exist on the GPU as it is now, or be created by one of this approval's changes.
            // A MIG instance must exist on the GPU as it is now, or be created by one of this approval's changes; a
            // share of a whole GPU must match how the GPU is already shared.
            let exists = match (r.change, current.get(&r.gpu_id)) {
                (None, Some((_, _, false))) => shared_alike(conn, &r.gpu_id, &r.profile).await?,
                (None, Some((_, layout, true))) => layout.iter().any(|i| i.profile == r.profile && i.start == r.start),
                (Some(k), _) => changes.get(k).is_some_and(|c| {
                    c.gpu_id == r.gpu_id && c.created.iter().any(|i| i.profile == r.profile && i.start == r.start)
                }),
                (None, None) => false,
            };
            if !exists {
                return Err(StoreError::Conflict { constraint: "gpu_layout_version".to_string() });
            }
            let proposal = r.change.and_then(|i| proposals.get(i)).map(|p| p.id.clone());
            sqlx::query(&format!(
                "INSERT INTO allocations (id, request_id, tenant_id, gpu_id, profile, start, state, proposal_id, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, 'reserved', $7, {})",
                ts(8)
            ))
                .bind(new_id())
                .bind(&before.id)
                .bind(&before.tenant_id)
                .bind(&r.gpu_id)
                .bind(&r.profile)
                .bind(i32::from(r.start))
                .bind(proposal)
                .bind(now_ms())
                .execute(&mut *conn)
                .await
                .map_err(|e| on_constraint(e, "allocations_live_instance"))?;
        }
        let after = SliceRequest { state, version: before.version + 1, updated_at_ms: now_ms(), ..before.clone() };
        set_request(conn, &after, before.version).await?;
        let object = format!("request/{}", after.id);
        audit_insert(conn, t.actor, "request.approved", &object, Some(to_json(&before)), Some(to_json(&after))).await?;
        Ok((after, proposals))
    }
    .await;
    if result.is_ok() {
        tx.commit().await?;
    }
    result
}

/// Inserts the proposal for `ch` (approved at once when it auto-applies); a second open proposal for the GPU is a
/// conflict on `layout_proposals_open`.
async fn insert_proposal(
    conn: &mut PgConnection,
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
    sqlx::query(&format!(
                "INSERT INTO layout_proposals (id, gpu_id, base_version, layout, created, destroyed, state, reason, \
                 created_by, decided_by, created_at, decided_at) VALUES ($1, $2, $3, $4::jsonb, $5::jsonb, $6::jsonb, $7, $8, \
                 $9, $10, {}, {})",
                ts(11),
                ts(12)
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
    .execute(conn)
    .await
    .map_err(|e| on_constraint(e, "layout_proposals_open"))?;
    Ok(p)
}

pub(crate) async fn live_allocations(pool: &PgPool) -> Result<Vec<Allocation>, StoreError> {
    let rows: Vec<AllocationRow> =
        sqlx::query_as(&format!("SELECT {ALLOCATION_FIELDS} FROM allocations WHERE state IN ('reserved', 'active')"))
            .fetch_all(pool)
            .await?;
    Ok(rows.into_iter().map(allocation_from).collect())
}

pub(crate) async fn proposals(pool: &PgPool, state: Option<&str>) -> Result<Vec<LayoutProposal>, StoreError> {
    let rows: Vec<ProposalRow> = sqlx::query_as(&format!(
        "SELECT {} WHERE $1::text IS NULL OR state = $1::text ORDER BY id DESC",
        proposal_select()
    ))
    .bind(state)
    .fetch_all(pool)
    .await?;
    rows.into_iter().map(proposal_from).collect()
}

pub(crate) async fn decide_proposal(
    pool: &PgPool,
    id: &str,
    approve: bool,
    reason: &str,
    actor: &str,
) -> Result<LayoutProposal, StoreError> {
    let mut tx = pool.begin().await?;
    let conn: &mut PgConnection = &mut tx;
    let result = async {
        let row: Option<ProposalRow> =
            sqlx::query_as(&format!("SELECT {} WHERE id = $1 FOR UPDATE", proposal_select()))
                .bind(id)
                .fetch_optional(&mut *conn)
                .await?;
        let before = proposal_from(row.ok_or_else(|| StoreError::NotFound { what: format!("layout proposal {id}") })?)?;
        if before.state != "proposed" {
            return Err(StoreError::Conflict { constraint: "proposal_decided".to_string() });
        }
        if approve {
            if layout_version(conn, &before.gpu_id).await? != before.base_version {
                return Err(StoreError::Conflict { constraint: "gpu_layout_version".to_string() });
            }
            for d in &before.destroyed {
                if in_use(conn, &before.gpu_id, d.start, Some(&before.id)).await? {
                    return Err(StoreError::Conflict { constraint: "instance_in_use".to_string() });
                }
            }
            apply_layout(conn, &before.gpu_id, &to_json(&before.layout)).await?;
        } else {
            // The slices waiting for this layout lose their instances; their requests fail with the reason.
            let waiting: Vec<(String,)> = sqlx::query_as(
                "SELECT DISTINCT request_id FROM allocations WHERE proposal_id = $1 AND state = 'reserved'",
            )
            .bind(&before.id)
            .fetch_all(&mut *conn)
            .await?;
            sqlx::query("UPDATE allocations SET state = 'released' WHERE proposal_id = $1 AND state = 'reserved'")
                .bind(&before.id)
                .execute(&mut *conn)
                .await?;
            for (request_id,) in waiting {
                let r = request_in(conn, &request_id, true).await?;
                let Ok(state) = r.state.transition(RequestState::Failed) else { continue };
                let why = format!("the layout change it needed was rejected: {reason}");
                let after =
                    SliceRequest { state, reason: why, version: r.version + 1, updated_at_ms: now_ms(), ..r.clone() };
                set_request(conn, &after, r.version).await?;
                super::release_allocations(conn, &r.id).await?;
                super::adjust_usage(conn, &r.tenant_id, &r.id, -1).await?;
                let object = format!("request/{}", after.id);
                audit_insert(conn, actor, "request.failed", &object, Some(to_json(&r)), Some(to_json(&after))).await?;
            }
        }
        let after = LayoutProposal {
            state: if approve { "approved" } else { "rejected" }.to_string(),
            reason: reason.to_string(),
            decided_by: Some(actor.to_string()),
            decided_at_ms: Some(now_ms()),
            ..before.clone()
        };
        sqlx::query(&format!(
            "UPDATE layout_proposals SET state = $1, reason = $2, decided_by = $3, decided_at = {} WHERE id = $4",
            ts(5)
        ))
        .bind(&after.state)
        .bind(&after.reason)
        .bind(&after.decided_by)
        .bind(&after.id)
        .bind(after.decided_at_ms)
        .execute(&mut *conn)
        .await?;
        let action = if approve { "layout.approve" } else { "layout.reject" };
        audit_insert(
            conn,
            actor,
            action,
            &format!("gpu/{}", after.gpu_id),
            Some(to_json(&before)),
            Some(to_json(&after)),
        )
        .await?;
        Ok(after)
    }
    .await;
    if result.is_ok() {
        tx.commit().await?;
    }
    result
}

pub(crate) async fn propose_layout(
    pool: &PgPool,
    ch: &LayoutChange,
    actor: &str,
) -> Result<LayoutProposal, StoreError> {
    let mut tx = pool.begin().await?;
    let conn: &mut PgConnection = &mut tx;
    let result = async {
        if layout_version(conn, &ch.gpu_id).await? != ch.base_version {
            return Err(StoreError::Conflict { constraint: "gpu_layout_version".to_string() });
        }
        let p = insert_proposal(conn, ch, actor).await?;
        audit_insert(conn, actor, "layout.propose", &format!("gpu/{}", p.gpu_id), None, Some(to_json(&p))).await?;
        Ok(p)
    }
    .await;
    if result.is_ok() {
        tx.commit().await?;
    }
    result
}
