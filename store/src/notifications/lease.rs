//! The lease queue that webhook and e-mail deliveries share: rows are claimed for a while by one sender, so that of
//! several replicas one sends each, and after each attempt they are delivered, tried again after a backoff, or
//! failed.

use sqlx::QueryBuilder;
use sqlx::postgres::PgRow;
use sqlx::sqlite::SqliteRow;
use tessera_core::event;

use crate::StoreError;
use crate::dialect::Conn;

/// A table of rows that senders lease while they send them, so that of several replicas one sends each: a row is
/// due when it is pending, its next attempt has come (`next_at_ms`) and no lease on it runs (`lease_until_ms`). On
/// PostgreSQL replicas claim with `FOR UPDATE SKIP LOCKED`, so they never wait on each other's claims.
pub(super) struct LeaseQueue {
    /// The table.
    pub(super) table: &'static str,
    /// The table's alias in `also`, `order` and the columns read back.
    pub(super) alias: &'static str,
    /// What else a due row must meet (` AND ...`), or `""`.
    pub(super) also: &'static str,
    /// The order rows are claimed and read back in.
    pub(super) order: &'static str,
}

impl LeaseQueue {
    /// Claims up to `limit` rows due at `now` for `lease_ms`, in the caller's transaction, and reads them back in
    /// order with `columns` (`<columns> FROM <table> <alias> [JOIN ...]`); none when none is due.
    pub(super) async fn claim<'c, T>(
        &self,
        conn: impl Into<Conn<'c>>,
        columns: &str,
        now: i64,
        limit: u32,
        lease_ms: i64,
    ) -> Result<Vec<T>, StoreError>
    where
        T: for<'r> sqlx::FromRow<'r, SqliteRow> + for<'r> sqlx::FromRow<'r, PgRow> + Send + Unpin,
    {
        let LeaseQueue { table, alias: a, also, order } = self;
        on_conn!(conn.into(), conn, dialect, DB => {
            let ids: Vec<(i64,)> = sqlx::query_as(&format!(
                "SELECT {a}.id FROM {table} {a} WHERE {a}.state = 'pending' AND {a}.next_at_ms <= $1 \
                 AND {a}.lease_until_ms <= $1{also} ORDER BY {order} LIMIT $2{}",
                dialect.lock_skipping()
            ))
            .bind(now)
            .bind(i64::from(limit))
            .fetch_all(&mut *conn)
            .await?;
            if ids.is_empty() {
                return Ok(Vec::new());
            }
            let mut q = QueryBuilder::<DB>::new(format!("UPDATE {table} SET lease_until_ms = "));
            q.push_bind(now.saturating_add(lease_ms)).push(" WHERE id IN (");
            let mut list = q.separated(", ");
            for (id,) in &ids {
                list.push_bind(*id);
            }
            q.push(")");
            q.build().execute(&mut *conn).await?;
            let mut q = QueryBuilder::<DB>::new(format!("SELECT {columns} WHERE {a}.id IN ("));
            let mut list = q.separated(", ");
            for (id,) in &ids {
                list.push_bind(*id);
            }
            q.push(format!(") ORDER BY {order}"));
            Ok(q.build_query_as().fetch_all(&mut *conn).await?)
        })
    }

    /// Gives claimed rows back untouched, for the next round.
    pub(super) async fn release<'c>(&self, conn: impl Into<Conn<'c>>, ids: &[i64]) -> Result<(), StoreError> {
        let table = self.table;
        on_conn!(conn.into(), conn, _dialect, DB => {
            let mut q = QueryBuilder::<DB>::new(format!("UPDATE {table} SET lease_until_ms = 0 WHERE id IN ("));
            let mut list = q.separated(", ");
            for id in ids {
                list.push_bind(*id);
            }
            q.push(")");
            q.build().execute(&mut *conn).await?;
        });
        Ok(())
    }
}

/// After an attempt: `(state, next attempt, delivered at, attempts)`. Delivered when `ok`; failed at once when
/// `permanent`; otherwise pending after the backoff (at most `cap_ms` between attempts), or failed a day after the
/// first attempt.
pub(super) fn after_attempt(
    ok: bool,
    permanent: bool,
    first_at_ms: i64,
    attempts: i64,
    now: i64,
    cap_ms: i64,
) -> (&'static str, i64, Option<i64>, i64) {
    let attempts = attempts.saturating_add(1);
    let tries = u32::try_from(attempts).unwrap_or(u32::MAX);
    let (state, next, delivered) = if ok {
        ("delivered", now, Some(now))
    } else if permanent {
        ("failed", now, None)
    } else {
        match event::next_attempt(first_at_ms, tries, now, cap_ms) {
            Some(next) => ("pending", next, None),
            None => ("failed", now, None),
        }
    };
    (state, next, delivered, attempts)
}
