//! Past use written in one go: requests that were granted and released before now, with their allocations' times,
//! so that usage, chargeback and idle reports have a history (`tessera serve --demo` records a week of it at first
//! start), and moving a live request's times back. One SQL body for both backends (see [`super::dialect`]).

use tessera_core::request::{RequestState, SliceSpec};

use super::allocation_hours::forget_kept_hours;
use super::governance::forget_standing_hours;
use super::writes::audit_insert;
use super::{Store, StoreError, new_id_at, to_json};

/// One released allocation of the past, with the request it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct PastAllocation {
    /// Its tenant.
    pub tenant_id: String,
    /// What was asked for.
    pub spec: SliceSpec,
    /// Why.
    pub reason: String,
    /// The GPU it was on.
    pub gpu_id: String,
    /// MIG profile, or the sharing key of a whole-GPU share.
    pub profile: String,
    /// Start unit.
    pub start: u8,
    /// The device the node reported for it (`MIG-...`).
    pub device_uuid: String,
    /// When it became active, UTC ms.
    pub activated_at_ms: i64,
    /// When it was released, UTC ms.
    pub released_at_ms: i64,
}

impl Store {
    /// Records released requests with one allocation each, in one transaction; an audit entry names how many and
    /// who wrote them. Nothing live changes: the allocations are released, so they hold no instance and count
    /// against no quota.
    pub async fn record_history(&self, past: &[PastAllocation], actor: &str) -> Result<(), StoreError> {
        let _changing = self.changing();
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            for a in past {
                debug_assert!(a.activated_at_ms < a.released_at_ms, "{a:?}");
                // Asked for and granted a minute before it became active; its id made then, so that lists by id
                // put it in time order among the others.
                let asked = a.activated_at_ms - 60_000;
                let request_id = new_id_at(asked);
                sqlx::query(&format!(
                    "INSERT INTO slice_requests (id, tenant_id, spec, count, state, reason, version, created_at_ms, \
                     updated_at_ms) VALUES ($1, $2, {}, 1, $4, $5, 4, $6, $7)",
                    dialect.json(3)
                ))
                .bind(&request_id)
                .bind(&a.tenant_id)
                .bind(to_json(&a.spec))
                .bind(RequestState::Released.as_str())
                .bind(&a.reason)
                .bind(asked)
                .bind(a.released_at_ms)
                .execute(&mut *tx)
                .await?;
                // What it charged, so timelines of held and used quota count it as they count live requests.
                let charge = tessera_core::quota::charge(tessera_core::Catalog::builtin(), &a.spec, 1)
                    .map_err(|e| StoreError::Corrupt(format!("past allocation: {e}")))?;
                for (resource, amount) in &charge {
                    sqlx::query("INSERT INTO request_charges (request_id, resource, amount_milli) VALUES ($1, $2, $3)")
                        .bind(&request_id)
                        .bind(resource.to_string())
                        .bind(i64::try_from(*amount).unwrap_or(i64::MAX))
                        .execute(&mut *tx)
                        .await?;
                }
                sqlx::query(
                    "INSERT INTO allocations (id, request_id, tenant_id, gpu_id, profile, start, state, created_at_ms, \
                     device_uuid, activated_at_ms, released_at_ms) \
                     VALUES ($1, $2, $3, $4, $5, $6, 'released', $7, $8, $9, $10)",
                )
                .bind(new_id_at(asked))
                .bind(&request_id)
                .bind(&a.tenant_id)
                .bind(&a.gpu_id)
                .bind(&a.profile)
                .bind(i64::from(a.start))
                .bind(asked)
                .bind(&a.device_uuid)
                .bind(a.activated_at_ms)
                .bind(a.released_at_ms)
                .execute(&mut *tx)
                .await?;
            }
            // Use recorded in hours already kept: they are kept again, with it.
            if let Some(first) = past.iter().map(|a| a.activated_at_ms).min() {
                forget_kept_hours(&mut *tx, first).await?;
            }
            // Requests held in hours whose quota standing is kept (each asked a minute before its activation):
            // worked out again, with them.
            if let Some(first) = past.iter().map(|a| a.activated_at_ms - 60_000).min() {
                forget_standing_hours(&mut *tx, first).await?;
            }
            let after = serde_json::json!({ "released_allocations": past.len() }).to_string();
            audit_insert(&mut tx, actor, "history.record", "history", None, Some(after)).await?;
            tx.commit().await?;
            Ok(())
        })
    }

    /// Moves a live request's times back to `at_ms`: when it was asked for, approved and became active (its
    /// allocations' activation and creation). For a demo whose allocations have been in use for days.
    pub async fn backdate_request(&self, request_id: &str, at_ms: i64) -> Result<(), StoreError> {
        let _changing = self.changing();
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let done = sqlx::query("UPDATE slice_requests SET created_at_ms = $1 WHERE id = $2")
                .bind(at_ms - 60_000)
                .bind(request_id)
                .execute(&mut *tx)
                .await?;
            if done.rows_affected() == 0 {
                return Err(StoreError::NotFound { what: format!("request {request_id}") });
            }
            sqlx::query(
                "UPDATE allocations SET created_at_ms = $1, activated_at_ms = $2 \
                 WHERE request_id = $3 AND activated_at_ms IS NOT NULL",
            )
            .bind(at_ms - 60_000)
            .bind(at_ms)
            .bind(request_id)
            .execute(&mut *tx)
            .await?;
            forget_kept_hours(&mut *tx, at_ms).await?;
            forget_standing_hours(&mut *tx, at_ms - 60_000).await?;
            tx.commit().await?;
            Ok(())
        })
    }
}
