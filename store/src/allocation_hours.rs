//! What each allocation's device did in each hour it was held, kept once the hour has ended (`allocation_hours`):
//! the sums of a sample-weighted mean over the allocation's part of the hour, and the allocation's running sums up
//! to it. A report's mean for an allocation then sums its kept hours from two of them (the last's running sums less
//! those before the first: a few seeks of the primary key an allocation, however many hours) and reads the stored
//! series only for the parts of its use the kept hours do not cover.

use crate::dialect::{Conn, Dialect};
use crate::windows::{Placeholders, WINDOWS_PER_QUERY, window_values};
use crate::{Store, StoreError};

/// The hours kept ([`Store::allocation_hours_kept`]): every hour starting in `[from_ms, to_ms)` is in the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
pub struct HoursKept {
    /// The first hour kept (its start).
    pub from_ms: i64,
    /// The end of the last hour kept: the next hour to keep starts here.
    pub to_ms: i64,
    /// Moved on by every write into hours already kept, or into the hour that is next to keep.
    pub epoch: i64,
}

/// One allocation's sums over its part of one hour.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocationHour {
    /// The allocation.
    pub allocation_id: String,
    /// Sum of `util_avg × samples` of its device's rows in its part of the hour.
    pub weighted: f64,
    /// Samples of those rows.
    pub samples: i64,
}

/// Forgets the kept hours from the one starting at `$1` on (they end there, or where they start if that is
/// later), for a write that changes what allocations held in them: use recorded or moved into the past. The rows
/// of those hours go with them ([`FORGET_ROWS_SQL`]); they are kept again as the next hours to keep.
const FORGET_KEPT_SQL: &str = "UPDATE allocation_hours_kept SET to_ms = CASE WHEN to_ms <= $1 THEN to_ms \
     WHEN from_ms >= $1 THEN from_ms ELSE $1 END, epoch = epoch + 1 WHERE id = 1 AND to_ms >= $1";
/// The rows of the hours [`FORGET_KEPT_SQL`] forgets.
const FORGET_ROWS_SQL: &str = "DELETE FROM allocation_hours WHERE hour_ms >= $1";

/// The start of the hour `t_ms` falls in.
const fn hour_of(t_ms: i64) -> i64 {
    tessera_core::rollup::Tier::Hour.bucket_of(t_ms)
}

/// Inside a write that records use or telemetry at `t_ms` or later in the past, or moves use there: the kept
/// hours from the one `t_ms` falls in on are forgotten ([`FORGET_KEPT_SQL`]), and an hour being worked out from
/// there is not kept. Nothing is written when they all end before it.
pub(crate) async fn forget_kept_hours<'c>(conn: impl Into<Conn<'c>>, t_ms: i64) -> Result<(), StoreError> {
    let hour = hour_of(t_ms);
    on_conn!(conn.into(), conn, _dialect => {
        let forgot = sqlx::query(FORGET_KEPT_SQL).bind(hour).execute(&mut *conn).await?.rows_affected();
        if forgot > 0 {
            sqlx::query(FORGET_ROWS_SQL).bind(hour).execute(&mut *conn).await?;
        }
    });
    Ok(())
}

/// A window's sums of kept hours.
#[derive(Debug, sqlx::FromRow)]
struct RunningSum {
    k: i64,
    weighted: f64,
    samples: i64,
}

/// The sums of each of `n` windows of kept hours, bound `k, allocation, lo, hi` each, answered as
/// `(k, weighted, samples)`: the running sums of the window's last kept hour less those before its first (the
/// first's running sums less its own), 0 for a window with no kept hour. Four seeks of the primary key a window,
/// the windows the outer loop.
fn running_sums_sql(dialect: Dialect, n: usize) -> String {
    let values = window_values(dialect, n);
    let seek = |what: &str, order: &str| {
        format!(
            "(SELECT {what} FROM allocation_hours m WHERE m.allocation_id = w.a AND m.hour_ms >= w.lo \
             AND m.hour_ms < w.hi ORDER BY m.hour_ms {order} LIMIT 1)"
        )
    };
    format!(
        "WITH w(k, a, lo, hi) AS (VALUES {values}) SELECT w.k, \
         CAST(COALESCE({} - {}, 0) AS DOUBLE PRECISION) AS weighted, \
         CAST(COALESCE({} - {}, 0) AS BIGINT) AS samples FROM w",
        seek("m.running_weighted", "DESC"),
        seek("m.running_weighted - m.weighted", "ASC"),
        seek("m.running_samples", "DESC"),
        seek("m.running_samples - m.samples", "ASC"),
    )
}

impl Store {
    /// The hours kept, `None` before the first is kept.
    pub async fn allocation_hours_kept(&self) -> Result<Option<HoursKept>, StoreError> {
        Ok(on_pool!(self, pool, _dialect => {
            sqlx::query_as("SELECT from_ms, to_ms, epoch FROM allocation_hours_kept WHERE id = 1")
                .fetch_optional(pool)
                .await?
        }))
    }

    /// Starts keeping hours at `from_ms` (an hour's start) unless some are kept already; the hours kept after it.
    pub async fn start_allocation_hours(&self, from_ms: i64) -> Result<HoursKept, StoreError> {
        on_pool!(self, pool, _dialect => {
            sqlx::query(
                "INSERT INTO allocation_hours_kept (id, from_ms, to_ms) VALUES (1, $1, $1) ON CONFLICT (id) DO NOTHING",
            )
            .bind(from_ms)
            .execute(pool)
            .await?;
        });
        self.allocation_hours_kept()
            .await?
            .ok_or_else(|| StoreError::Corrupt("allocation_hours_kept has no row after its insert".into()))
    }

    /// Keeps the hour starting at `hour_ms` with its `rows` (allocations without telemetry in it have none), as
    /// worked out when the hours kept were `seen`: `false` (nothing written) unless it is still the next hour to
    /// keep and nothing was written into it since (another writer kept it first, or telemetry or use arrived for
    /// it). One transaction: the rows and the moved end are written together or not at all.
    pub async fn keep_allocation_hour(
        &self,
        seen: HoursKept,
        hour_len_ms: i64,
        rows: &[AllocationHour],
    ) -> Result<bool, StoreError> {
        let hour_ms = seen.to_ms;
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let moved = sqlx::query(
                "UPDATE allocation_hours_kept SET to_ms = $1 WHERE id = 1 AND to_ms = $2 AND epoch = $3",
            )
                .bind(hour_ms + hour_len_ms)
                .bind(hour_ms)
                .bind(seen.epoch)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if moved == 0 {
                tx.rollback().await?;
                return Ok(false);
            }
            // Each row with its allocation's running sums: its own added to those of the allocation's last kept
            // hour before it (hours are kept in order, so none after it is kept yet).
            let before = |column: &str| {
                format!(
                    "COALESCE((SELECT p.{column} FROM allocation_hours p WHERE p.allocation_id = v.a \
                     AND p.hour_ms < v.h ORDER BY p.hour_ms DESC LIMIT 1), 0)"
                )
            };
            for chunk in rows.chunks(500) {
                let values = values_sql(dialect, chunk.len());
                let sql = format!(
                    "WITH v(a, h, w, s) AS (VALUES {values}) \
                     INSERT INTO allocation_hours (allocation_id, hour_ms, weighted, samples, running_weighted, \
                     running_samples) SELECT v.a, v.h, v.w, v.s, v.w + {}, v.s + {} FROM v WHERE true \
                     ON CONFLICT (allocation_id, hour_ms) DO UPDATE SET weighted = excluded.weighted, \
                     samples = excluded.samples, running_weighted = excluded.running_weighted, \
                     running_samples = excluded.running_samples",
                    before("running_weighted"),
                    before("running_samples")
                );
                let mut q = sqlx::query(&sql);
                for r in chunk {
                    q = q.bind(&r.allocation_id).bind(hour_ms).bind(r.weighted).bind(r.samples);
                }
                q.execute(&mut *tx).await?;
            }
            tx.commit().await?;
            Ok(true)
        })
    }

    /// Per window `(allocation, lo, hi)`, the sums of its kept hours starting in `[lo, hi)`, as
    /// `(sum of util_avg × samples, samples)`, in the order asked: the running sums of the last of them less those
    /// before the first ([`running_sums_sql`]), four seeks of the primary key a window however many hours it spans.
    /// One query per 300 windows.
    pub async fn allocation_hour_sums(&self, windows: &[(String, i64, i64)]) -> Result<Vec<(f64, i64)>, StoreError> {
        let mut out = vec![(0.0, 0); windows.len()];
        for (c, chunk) in windows.chunks(WINDOWS_PER_QUERY).enumerate() {
            let rows: Vec<RunningSum> = on_pool!(self, pool, dialect => {
                let sql = running_sums_sql(dialect, chunk.len());
                let mut q = sqlx::query_as(&sql);
                for (i, (key, lo, hi)) in chunk.iter().enumerate() {
                    q = q.bind(i64::try_from(c * WINDOWS_PER_QUERY + i).unwrap_or(i64::MAX)).bind(key).bind(lo).bind(hi);
                }
                q.fetch_all(pool).await?
            });
            for RunningSum { k, weighted, samples } in rows {
                if let Some(slot) = usize::try_from(k).ok().and_then(|k| out.get_mut(k)) {
                    *slot = (weighted, samples);
                }
            }
        }
        Ok(out)
    }

    /// Forgets the kept hours from the one `t_ms` falls in on (see [`forget_kept_hours`]), and the quota
    /// standing's, for a write made behind the store's back (a repair, a test's history).
    pub async fn forget_allocation_hours(&self, t_ms: i64) -> Result<(), StoreError> {
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            forget_kept_hours(&mut *tx, t_ms).await?;
            crate::governance::forget_standing_hours(&mut *tx, t_ms).await?;
            tx.commit().await?;
            Ok(())
        })
    }

    /// Drops the kept hours starting before `before_ms`; the hours kept start there from then on. Rows removed.
    pub async fn prune_allocation_hours(&self, before_ms: i64) -> Result<u64, StoreError> {
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            // Kept from `before_ms` on; kept hours that all end before it leave nothing, and the next to keep is
            // the one starting there (older ones would only be dropped again).
            sqlx::query(
                "UPDATE allocation_hours_kept SET from_ms = $1, to_ms = CASE WHEN to_ms < $1 THEN $1 ELSE to_ms END \
                 WHERE id = 1 AND from_ms < $1",
            )
            .bind(before_ms)
            .execute(&mut *tx)
            .await?;
            let n = sqlx::query("DELETE FROM allocation_hours WHERE hour_ms < $1")
                .bind(before_ms)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            tx.commit().await?;
            Ok(n)
        })
    }
}

/// `n` rows of four placeholders for an `INSERT … VALUES`.
fn values_sql(dialect: Dialect, n: usize) -> String {
    let mut p = Placeholders::new(dialect);
    (0..n)
        .map(|_| {
            format!(
                "(CAST({} AS TEXT), CAST({} AS BIGINT), CAST({} AS DOUBLE PRECISION), CAST({} AS BIGINT))",
                p.next(),
                p.next(),
                p.next(),
                p.next()
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}
