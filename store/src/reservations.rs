//! Reservations: booking, deciding, starting (the request made for one), ending; per-scope policies; the
//! calendar's version. One SQL body for both backends.
//!
//! Admission is decided by the services from the calendar they read (`tessera_core::reservation`); the store makes
//! it exact: a reservation is accepted only if nothing the decision read changed before it commits. The calendar
//! row's `bookings_version` is bumped by every acceptance (so of two bookings racing for the last room one commits,
//! the other reads again) and checked by every approval that places slices (under a shared lock on PostgreSQL,
//! the write lock on SQLite); an acceptance also checks that the live allocations are the ones it read
//! ([`Holdings`]).

use tessera_core::quota::Usage;
use tessera_core::request::{RequestState, SliceSpec};
use tessera_core::reservation::{ReservationPolicy, ReservationState};

use super::dialect::Conn;
use super::writes::{adjust_usage, audit_insert};
use super::{Store, StoreError, new_id, now_ms, to_json, usage_from_rows};

/// Who accepts a reservation at booking: the tenant's policy (the same actor as for requests).
pub const AUTO_APPROVER: &str = "system:auto-approve";

/// A reservation.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ReservationRecord {
    /// UUIDv7.
    pub id: String,
    /// Tenant id.
    pub tenant_id: String,
    /// What one slice is.
    pub spec: SliceSpec,
    /// How many slices.
    pub count: u32,
    /// Window start, UTC milliseconds.
    pub start_ms: i64,
    /// Window end, UTC milliseconds.
    pub end_ms: i64,
    /// Where it is in its life.
    pub state: ReservationState,
    /// Why it was booked.
    pub reason: String,
    /// Why it was rejected or failed.
    pub decision: String,
    /// The request made for it at its lead time.
    pub request_id: Option<String>,
    /// Version (`ETag`).
    pub version: i64,
    /// Who booked it.
    pub created_by: String,
    /// Who accepted or rejected it.
    pub decided_by: Option<String>,
    /// UTC milliseconds.
    pub created_at_ms: i64,
    /// UTC milliseconds.
    pub updated_at_ms: i64,
}

/// A reservation row (the columns of [`COLUMNS`]); the spec is JSON.
#[derive(Debug, sqlx::FromRow)]
struct ReservationRow {
    id: String,
    tenant_id: String,
    spec: String,
    count: i64,
    start_ms: i64,
    end_ms: i64,
    state: String,
    reason: String,
    decision: String,
    request_id: Option<String>,
    version: i64,
    created_by: String,
    decided_by: Option<String>,
    created_at_ms: i64,
    updated_at_ms: i64,
}

const COLUMNS: &str = "id, tenant_id, CAST(spec AS TEXT) AS spec, count, start_ms, end_ms, state, reason, decision, \
                       request_id, version, created_by, decided_by, created_at_ms, updated_at_ms FROM reservations";

fn from_row(row: ReservationRow) -> Result<ReservationRecord, StoreError> {
    let ReservationRow {
        id,
        tenant_id,
        spec,
        count,
        start_ms,
        end_ms,
        state,
        reason,
        decision,
        request_id,
        version,
        created_by,
        decided_by,
        created_at_ms,
        updated_at_ms,
    } = row;
    Ok(ReservationRecord {
        spec: serde_json::from_str(&spec).map_err(|e| StoreError::Corrupt(format!("reservation {id} spec: {e}")))?,
        count: u32::try_from(count).map_err(|_| StoreError::Corrupt(format!("reservation {id} count")))?,
        state: ReservationState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("reservation {id} state {state}")))?
            .at(start_ms, now_ms()),
        id,
        tenant_id,
        start_ms,
        end_ms,
        reason,
        decision,
        request_id,
        version,
        created_by,
        decided_by,
        created_at_ms,
        updated_at_ms,
    })
}

/// What an acceptance read: the calendar's version and the live allocations (how many, and the newest id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holdings {
    /// `reservation_calendar.bookings_version`.
    pub bookings_version: i64,
    /// Live (reserved or active) allocations.
    pub live: i64,
    /// The newest live allocation's id (UUIDv7 ids grow with time), `""` when none.
    pub newest: String,
}

async fn holdings_in<'c>(conn: impl Into<Conn<'c>>, lock: bool) -> Result<Holdings, StoreError> {
    on_conn!(conn.into(), conn, dialect => {
        let lock = if lock { dialect.lock() } else { "" };
        let (bookings_version,): (i64,) =
            sqlx::query_as(&format!("SELECT bookings_version FROM reservation_calendar WHERE id = 1{lock}"))
                .fetch_one(&mut *conn)
                .await?;
        let (live, newest): (i64, String) = sqlx::query_as(
            "SELECT COUNT(*), COALESCE(MAX(id), '') FROM allocations WHERE state IN ('reserved', 'active')",
        )
        .fetch_one(&mut *conn)
        .await?;
        Ok(Holdings { bookings_version, live, newest })
    })
}

/// Checks, inside an approval's transaction, that no reservation was accepted since `bookings_version` was read
/// (a shared lock on PostgreSQL: approvals do not wait for each other, only for an acceptance).
pub(super) async fn check_bookings<'c>(conn: impl Into<Conn<'c>>, bookings_version: i64) -> Result<(), StoreError> {
    let (now,): (i64,) = on_conn!(conn.into(), conn, dialect => {
        sqlx::query_as(&format!("SELECT bookings_version FROM reservation_calendar WHERE id = 1{}", dialect.share_lock()))
            .fetch_one(&mut *conn)
            .await?
    });
    if now == bookings_version {
        Ok(())
    } else {
        Err(StoreError::Conflict { constraint: "reservation_calendar".into() })
    }
}

/// A reservation to book.
#[derive(Debug, Clone, Copy)]
pub struct NewReservation<'a> {
    /// Tenant id.
    pub tenant_id: &'a str,
    /// What one slice is.
    pub spec: &'a SliceSpec,
    /// How many slices.
    pub count: u32,
    /// Window start, UTC milliseconds.
    pub start_ms: i64,
    /// Window end, UTC milliseconds.
    pub end_ms: i64,
    /// Why.
    pub reason: &'a str,
    /// What one booking of it charges.
    pub charge: &'a Usage,
    /// Who books it.
    pub actor: &'a str,
}

/// Where a live request's time is bounded: `(request id, starts_at_ms, ends_by_ms, reservation id)`.
pub type RequestWindow = (String, Option<i64>, Option<i64>, Option<String>);

/// A row of [`RequestWindow`].
#[derive(Debug, sqlx::FromRow)]
struct WindowRow {
    id: String,
    starts_at_ms: Option<i64>,
    ends_by_ms: Option<i64>,
    reservation_id: Option<String>,
}

/// What one booking of a reservation charges of one resource, in thousandths.
#[derive(Debug, sqlx::FromRow)]
struct ChargeRow {
    reservation_id: String,
    resource: String,
    amount_milli: i64,
}

/// A reservation policy as stored.
#[derive(Debug, sqlx::FromRow)]
struct PolicyRow {
    max_duration_s: i64,
    max_ahead_s: i64,
    max_concurrent: i64,
}

impl Store {
    /// The calendar's version and the live allocations, as an acceptance must find them unchanged.
    pub async fn holdings(&self) -> Result<Holdings, StoreError> {
        on_pool!(self, pool, _dialect => holdings_in(&mut *pool.acquire().await?, false).await)
    }

    /// Books a reservation: `accepted` when `accept` holds what the admission read (then only if nothing changed
    /// since: else `Conflict { constraint: "reservation_calendar" }`), else `pending`. The tenant's open
    /// reservations are counted under its row lock: more than `max_open` already, and nothing is written.
    pub async fn book(
        &self,
        new: NewReservation<'_>,
        accept: Option<&Holdings>,
        max_open: u32,
    ) -> Result<ReservationRecord, StoreError> {
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let _: Option<(String,)> = sqlx::query_as(&format!("SELECT id FROM tenants WHERE id = $1{}", dialect.lock()))
                .bind(new.tenant_id)
                .fetch_optional(&mut *tx)
                .await?;
            let (open,): (i64,) = sqlx::query_as(
                "SELECT COUNT(*) FROM reservations WHERE tenant_id = $1 AND state IN ('pending', 'accepted', 'started')",
            )
            .bind(new.tenant_id)
            .fetch_one(&mut *tx)
            .await?;
            if open >= i64::from(max_open) {
                return Err(StoreError::Rule {
                    code: "too_many_reservations",
                    detail: format!(
                        "the tenant has {open} open reservations, the most its policy allows ({max_open}); cancel one or \
                         wait for one to end"
                    ),
                });
            }
            if let Some(read) = accept {
                let now = holdings_in(&mut *tx, true).await?;
                if now != *read {
                    return Err(StoreError::Conflict { constraint: "reservation_calendar".into() });
                }
                sqlx::query("UPDATE reservation_calendar SET bookings_version = bookings_version + 1 WHERE id = 1")
                    .execute(&mut *tx)
                    .await?;
            }
            let at = now_ms();
            let state = if accept.is_some() { ReservationState::Accepted } else { ReservationState::Pending };
            let record = ReservationRecord {
                id: new_id(),
                tenant_id: new.tenant_id.to_string(),
                spec: new.spec.clone(),
                count: new.count,
                start_ms: new.start_ms,
                end_ms: new.end_ms,
                state,
                reason: new.reason.to_string(),
                decision: String::new(),
                request_id: None,
                version: 1,
                created_by: new.actor.to_string(),
                // Accepted when booked only by the tenant's policy.
                decided_by: accept.map(|_| AUTO_APPROVER.to_string()),
                created_at_ms: at,
                updated_at_ms: at,
            };
            sqlx::query(&format!(
                "INSERT INTO reservations (id, tenant_id, spec, count, start_ms, end_ms, state, reason, created_by, \
                 decided_by, created_at_ms, updated_at_ms) VALUES ($1, $2, {}, $4, $5, $6, $7, $8, $9, $10, $11, $11)",
                dialect.json(3)
            ))
            .bind(&record.id)
            .bind(&record.tenant_id)
            .bind(to_json(&record.spec))
            .bind(i64::from(record.count))
            .bind(record.start_ms)
            .bind(record.end_ms)
            .bind(record.state.stored())
            .bind(&record.reason)
            .bind(&record.created_by)
            .bind(&record.decided_by)
            .bind(at)
            .execute(&mut *tx)
            .await?;
            for (resource, amount) in new.charge {
                sqlx::query("INSERT INTO reservation_charges (reservation_id, resource, amount_milli) VALUES ($1, $2, $3)")
                    .bind(&record.id)
                    .bind(resource.to_string())
                    .bind(i64::try_from(*amount).unwrap_or(i64::MAX))
                    .execute(&mut *tx)
                    .await?;
            }
            let object = format!("reservation/{}", record.id);
            audit_insert(&mut tx, new.actor, "reservation.create", &object, None, Some(to_json(&record))).await?;
            tx.commit().await?;
            Ok(record)
        })
    }

    /// A reservation by id.
    pub async fn reservation(&self, id: &str) -> Result<ReservationRecord, StoreError> {
        let row: Option<ReservationRow> = on_pool!(self, pool, _dialect => {
            sqlx::query_as(&format!("SELECT {COLUMNS} WHERE id = $1")).bind(id).fetch_optional(pool).await?
        });
        from_row(row.ok_or_else(|| StoreError::NotFound { what: format!("reservation {id}") })?)
    }

    /// Reservations: one tenant's or (`None`) every tenant's, in `states` when given, whose window ends after
    /// `after_ms` and starts before `before_ms`; by start, at most `limit`.
    pub async fn reservations(
        &self,
        tenant: Option<&str>,
        states: &[ReservationState],
        after_ms: i64,
        before_ms: i64,
        limit: u32,
    ) -> Result<Vec<ReservationRecord>, StoreError> {
        // A started reservation is preparing until its start ($5: now).
        let by_time = states.iter().any(|s| matches!(s, ReservationState::Preparing | ReservationState::Started));
        let states: Vec<String> = states
            .iter()
            .map(|s| match s {
                ReservationState::Preparing => "(state = 'started' AND start_ms > $5)".to_string(),
                ReservationState::Started => "(state = 'started' AND start_ms <= $5)".to_string(),
                other => format!("state = '{}'", other.stored()),
            })
            .collect();
        let in_states = if states.is_empty() { String::new() } else { format!(" AND ({})", states.join(" OR ")) };
        let sql = format!(
            "SELECT {COLUMNS} WHERE (CAST($1 AS TEXT) IS NULL OR tenant_id = $1) AND end_ms > $2 AND start_ms < $3\
             {in_states} ORDER BY start_ms, id LIMIT $4"
        );
        let rows: Vec<ReservationRow> = on_pool!(self, pool, _dialect => {
            let q = sqlx::query_as(&sql).bind(tenant).bind(after_ms).bind(before_ms).bind(i64::from(limit));
            let q = if by_time { q.bind(now_ms()) } else { q };
            q.fetch_all(pool).await?
        });
        rows.into_iter().map(from_row).collect()
    }

    /// What each of a tenant's reservations in `states` charges: `(reservation id, charge)`.
    pub async fn reservation_charges(&self, tenant: &str) -> Result<Vec<(String, Usage)>, StoreError> {
        let sql = "SELECT c.reservation_id, c.resource, c.amount_milli FROM reservation_charges c \
                   JOIN reservations r ON r.id = c.reservation_id WHERE r.tenant_id = $1 \
                   AND r.state IN ('pending', 'accepted') ORDER BY c.reservation_id";
        let rows: Vec<ChargeRow> =
            on_pool!(self, pool, _dialect => sqlx::query_as(sql).bind(tenant).fetch_all(pool).await?);
        let mut out: Vec<(String, Usage)> = Vec::new();
        for ChargeRow { reservation_id: id, resource, amount_milli } in rows {
            let one = usage_from_rows(vec![(resource, amount_milli)])?;
            match out.last_mut() {
                Some((last, usage)) if *last == id => usage.extend(one),
                _ => out.push((id, one)),
            }
        }
        Ok(out)
    }

    /// Moves a reservation to `to` if its life allows it and nobody changed it since `expected_version`. Accepting
    /// needs `accept` (what the admission read, as for [`Store::book`]); `decision` is kept for rejections and
    /// failures.
    pub async fn decide_reservation(
        &self,
        id: &str,
        expected_version: Option<i64>,
        to: ReservationState,
        decision: Option<&str>,
        accept: Option<&Holdings>,
        actor: &str,
    ) -> Result<ReservationRecord, StoreError> {
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let row: Option<ReservationRow> =
                sqlx::query_as(&format!("SELECT {COLUMNS} WHERE id = $1{}", dialect.lock()))
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await?;
            let before = from_row(row.ok_or_else(|| StoreError::NotFound { what: format!("reservation {id}") })?)?;
            if expected_version.is_some_and(|v| v != before.version) {
                return Err(StoreError::Conflict { constraint: "version".into() });
            }
            let state = before.state.transition(to).map_err(|e| StoreError::Rule {
                code: "invalid_transition",
                detail: format!("{e}; reload it to see where it stands"),
            })?;
            if state == ReservationState::Accepted {
                let read = accept.ok_or_else(|| StoreError::Failed("accepting needs the admission's reading".into()))?;
                if holdings_in(&mut *tx, true).await? != *read {
                    return Err(StoreError::Conflict { constraint: "reservation_calendar".into() });
                }
                sqlx::query("UPDATE reservation_calendar SET bookings_version = bookings_version + 1 WHERE id = 1")
                    .execute(&mut *tx)
                    .await?;
            }
            let after = ReservationRecord {
                state,
                decision: decision.map_or_else(|| before.decision.clone(), str::to_string),
                decided_by: if matches!(to, ReservationState::Accepted | ReservationState::Rejected) {
                    Some(actor.to_string())
                } else {
                    before.decided_by.clone()
                },
                version: before.version + 1,
                updated_at_ms: now_ms(),
                ..before.clone()
            };
            sqlx::query(
                "UPDATE reservations SET state = $1, decision = $2, decided_by = $3, version = $4, updated_at_ms = $5 \
                 WHERE id = $6",
            )
            .bind(after.state.stored())
            .bind(&after.decision)
            .bind(&after.decided_by)
            .bind(after.version)
            .bind(after.updated_at_ms)
            .bind(&after.id)
            .execute(&mut *tx)
            .await?;
            let object = format!("reservation/{}", after.id);
            let action = format!("reservation.{}", after.state);
            audit_insert(&mut tx, actor, &action, &object, Some(to_json(&before)), Some(to_json(&after))).await?;
            tx.commit().await?;
            Ok(after)
        })
    }

    /// Starts an accepted reservation: makes its request (pending, charged to the tenant without a quota check —
    /// the window's quota was checked when it was booked — not active before the reservation's start and ending
    /// by its end) and marks the reservation started, in one transaction. Returns the reservation and the request's
    /// id.
    pub async fn start_reservation(&self, id: &str, actor: &str) -> Result<(ReservationRecord, String), StoreError> {
        let _changing = self.changing();
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let row: Option<ReservationRow> =
                sqlx::query_as(&format!("SELECT {COLUMNS} WHERE id = $1{}", dialect.lock()))
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await?;
            let before = from_row(row.ok_or_else(|| StoreError::NotFound { what: format!("reservation {id}") })?)?;
            let state = before.state.transition(ReservationState::Started).map_err(|e| StoreError::Rule {
                code: "invalid_transition",
                detail: e.to_string(),
            })?;
            let at = now_ms();
            let request_id = new_id();
            let duration_s = ((before.end_ms - before.start_ms) / 1000).max(1);
            let reason = tessera_core::reservation::request_reason(&before.id, &before.reason);
            sqlx::query(&format!(
                "INSERT INTO slice_requests (id, tenant_id, spec, count, state, reason, version, created_at_ms, \
                 updated_at_ms, duration_s, priority, borrowed, starts_at_ms, ends_by_ms, reservation_id) \
                 VALUES ($1, $2, {}, $4, 'pending', $5, 1, $6, $6, $7, 'normal', FALSE, $8, $9, $10)",
                dialect.json(3)
            ))
            .bind(&request_id)
            .bind(&before.tenant_id)
            .bind(to_json(&before.spec))
            .bind(i64::from(before.count))
            .bind(reason.chars().take(tessera_core::text::MAX_REASON_CHARS).collect::<String>())
            .bind(at)
            .bind(duration_s)
            .bind(before.start_ms)
            .bind(before.end_ms)
            .bind(&before.id)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "INSERT INTO request_charges (request_id, resource, amount_milli) \
                 SELECT $1, resource, amount_milli FROM reservation_charges WHERE reservation_id = $2",
            )
            .bind(&request_id)
            .bind(&before.id)
            .execute(&mut *tx)
            .await?;
            adjust_usage(&mut tx, &before.tenant_id, &request_id, 1).await?;
            let after = ReservationRecord {
                state: state.at(before.start_ms, at),
                request_id: Some(request_id.clone()),
                version: before.version + 1,
                updated_at_ms: at,
                ..before.clone()
            };
            sqlx::query("UPDATE reservations SET state = $1, request_id = $2, version = $3, updated_at_ms = $4 WHERE id = $5")
                .bind(after.state.stored())
                .bind(&request_id)
                .bind(after.version)
                .bind(at)
                .bind(&after.id)
                .execute(&mut *tx)
                .await?;
            let object = format!("reservation/{}", after.id);
            audit_insert(&mut tx, actor, "reservation.started", &object, Some(to_json(&before)), Some(to_json(&after)))
                .await?;
            audit_insert(&mut tx, actor, "request.create", &format!("request/{request_id}"), None, Some(to_json(&after)))
                .await?;
            tx.commit().await?;
            Ok((after, request_id))
        })
    }

    /// Live requests whose time is bounded (made for a reservation, or limited to end before one).
    pub async fn request_windows(&self) -> Result<Vec<RequestWindow>, StoreError> {
        let sql = "SELECT id, starts_at_ms, ends_by_ms, reservation_id FROM slice_requests WHERE state IN \
                   ('pending', 'approved', 'provisioning', 'active') AND (starts_at_ms IS NOT NULL OR ends_by_ms IS NOT NULL)";
        let rows: Vec<WindowRow> = on_pool!(self, pool, _dialect => sqlx::query_as(sql).fetch_all(pool).await?);
        Ok(rows.into_iter().map(|w| (w.id, w.starts_at_ms, w.ends_by_ms, w.reservation_id)).collect())
    }

    /// When a request may start (`None`: at once).
    pub async fn request_starts_at(&self, id: &str) -> Result<Option<i64>, StoreError> {
        let sql = "SELECT starts_at_ms FROM slice_requests WHERE id = $1";
        let row: Option<(Option<i64>,)> =
            on_pool!(self, pool, _dialect => sqlx::query_as(sql).bind(id).fetch_optional(pool).await?);
        Ok(row.and_then(|r| r.0))
    }

    /// Requests made for reservations that are provisioning with every allocation active and whose start has come:
    /// `(id, version)`.
    pub async fn due_starts(&self, now: i64) -> Result<Vec<(String, i64)>, StoreError> {
        let sql = "SELECT r.id, r.version FROM slice_requests r WHERE r.state = 'provisioning' \
                   AND r.starts_at_ms IS NOT NULL AND r.starts_at_ms <= $1 AND NOT EXISTS \
                   (SELECT 1 FROM allocations a WHERE a.request_id = r.id AND a.state = 'reserved')";
        Ok(on_pool!(self, pool, _dialect => sqlx::query_as(sql).bind(now).fetch_all(pool).await?))
    }

    /// Started reservations whose request has ended, or whose window is over: `(reservation id, version)`.
    pub async fn reservations_over(&self, now: i64) -> Result<Vec<(String, i64)>, StoreError> {
        let sql = "SELECT v.id, v.version FROM reservations v LEFT JOIN slice_requests r ON r.id = v.request_id \
                   WHERE v.state = 'started' AND (v.end_ms <= $1 OR r.id IS NULL OR r.state NOT IN \
                   ('pending', 'approved', 'provisioning', 'active'))";
        Ok(on_pool!(self, pool, _dialect => sqlx::query_as(sql).bind(now).fetch_all(pool).await?))
    }

    /// Where the calendar's last simulation placed the slices of reservations still accepted: `(reservation id,
    /// slices as JSON)`.
    pub async fn reservation_slices(&self) -> Result<Vec<(String, String)>, StoreError> {
        let sql = "SELECT s.reservation_id, s.slices FROM reservation_slices s \
                   JOIN reservations r ON r.id = s.reservation_id WHERE r.state = 'accepted' ORDER BY s.reservation_id";
        Ok(on_pool!(self, pool, _dialect => sqlx::query_as(sql).fetch_all(pool).await?))
    }

    /// Keeps where a simulation placed reservations' slices (`(reservation id, slices as JSON)`), replacing what
    /// was kept for them. Rows for reservations that no longer exist are skipped.
    pub async fn set_reservation_slices(&self, placed: &[(String, String)]) -> Result<(), StoreError> {
        if placed.is_empty() {
            return Ok(());
        }
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            for (id, slices) in placed {
                sqlx::query(
                    "INSERT INTO reservation_slices (reservation_id, slices) \
                     SELECT id, $2 FROM reservations WHERE id = $1 \
                     ON CONFLICT (reservation_id) DO UPDATE SET slices = excluded.slices",
                )
                .bind(id)
                .bind(slices)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            Ok(())
        })
    }

    /// The reservation policy of `scope` (a tenant id, or `*` for every tenant), if one is set.
    pub async fn reservation_policy(&self, scope: &str) -> Result<Option<ReservationPolicy>, StoreError> {
        let sql = "SELECT max_duration_s, max_ahead_s, max_concurrent FROM reservation_policies WHERE scope = $1";
        let row: Option<PolicyRow> =
            on_pool!(self, pool, _dialect => sqlx::query_as(sql).bind(scope).fetch_optional(pool).await?);
        Ok(row.map(|p| ReservationPolicy {
            max_duration_s: p.max_duration_s.max(0) as u64,
            max_ahead_s: p.max_ahead_s.max(0) as u64,
            max_concurrent: p.max_concurrent.clamp(0, i64::from(u32::MAX)) as u32,
        }))
    }

    /// Sets (`Some`) or removes (`None`) the reservation policy of `scope`.
    pub async fn set_reservation_policy(
        &self,
        scope: &str,
        policy: Option<&ReservationPolicy>,
        actor: &str,
    ) -> Result<(), StoreError> {
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            sqlx::query("DELETE FROM reservation_policies WHERE scope = $1").bind(scope).execute(&mut *tx).await?;
            if let Some(p) = policy {
                sqlx::query(
                    "INSERT INTO reservation_policies (scope, max_duration_s, max_ahead_s, max_concurrent) \
                     VALUES ($1, $2, $3, $4)",
                )
                .bind(scope)
                .bind(p.max_duration_s as i64)
                .bind(p.max_ahead_s as i64)
                .bind(i64::from(p.max_concurrent))
                .execute(&mut *tx)
                .await?;
            }
            let object = format!("reservation-policy/{scope}");
            audit_insert(&mut tx, actor, "reservation_policy.set", &object, None, policy.map(to_json)).await?;
            tx.commit().await?;
            Ok(())
        })
    }
}

/// Whether a request in `state` made at `starts_at_ms` may turn active at `now`.
pub fn may_activate(state: RequestState, starts_at_ms: Option<i64>, now: i64) -> bool {
    state == RequestState::Provisioning && starts_at_ms.is_none_or(|s| s <= now)
}
