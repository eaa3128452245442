//! Sums of a sample-weighted mean read in windows of many keys at once (`(key, lo, hi)`: a device's series, an
//! allocation's kept hours), one range scan of the primary key per window, and the placeholders such statements
//! bind. Shared by the telemetry series' reads and the allocation hours'.

use crate::{Store, StoreError};

/// Windows read by one statement (the window sums, a device's use in windows).
pub(crate) const WINDOWS_PER_QUERY: usize = 300;

/// Placeholders of a statement, in bind order: SQLite's anonymous `?` (sqlx looks each numbered one up by a scan of
/// the statement's names), PostgreSQL's `$1`, `$2`, ...
pub(crate) struct Placeholders {
    numbered: bool,
    n: usize,
}

impl Placeholders {
    pub(crate) fn new(dialect: crate::dialect::Dialect) -> Placeholders {
        Placeholders { numbered: dialect == crate::dialect::Dialect::Postgres, n: 0 }
    }

    pub(crate) fn next(&mut self) -> String {
        self.n += 1;
        if self.numbered { format!("${}", self.n) } else { "?".to_string() }
    }
}

/// A window's utilisation sums.
#[derive(Debug, sqlx::FromRow)]
struct WindowSum {
    k: i64,
    /// Sum of `util_avg × samples`.
    weighted: f64,
    samples: i64,
}

/// A table whose rows [`windowed_sums_sql`] sums in windows: a key column, a time column, and the two sums of a
/// sample-weighted mean (`samples` is a column of every such table).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Summed {
    pub(crate) table: &'static str,
    pub(crate) key: &'static str,
    pub(crate) time: &'static str,
    /// What each row adds to the weighted sum, over its alias `m`.
    pub(crate) weighted: &'static str,
}

/// Sums of `source`'s rows per window, for `n` windows bound `k, key, lo, hi` each (rows whose time is in
/// `[lo, hi)`), answered as `(k, weighted, samples)` rows; a window with no row may have no answer row. One range
/// scan of the primary key per window on both backends, the windows the outer loop: SQLite is held to that order by
/// `CROSS JOIN` (left to itself, its planner scans the whole series through the time index once there are a few
/// hundred windows, and looks each row's window up), PostgreSQL by a lateral subquery (a plain join lets it hash the
/// whole series).
pub(crate) fn windowed_sums_sql(dialect: crate::dialect::Dialect, source: Summed, n: usize) -> String {
    let mut p = Placeholders::new(dialect);
    let values: Vec<String> = (0..n)
        .map(|_| {
            format!(
                "(CAST({} AS BIGINT), CAST({} AS TEXT), CAST({} AS BIGINT), CAST({} AS BIGINT))",
                p.next(),
                p.next(),
                p.next(),
                p.next()
            )
        })
        .collect();
    let values = values.join(", ");
    let Summed { table: from_table, key, time, weighted } = source;
    let sums = format!(
        "CAST(COALESCE(SUM({weighted}), 0) AS DOUBLE PRECISION) AS weighted, \
         CAST(COALESCE(SUM(m.samples), 0) AS BIGINT) AS samples"
    );
    let range = format!("m.{key} = w.k_key AND m.{time} >= w.lo AND m.{time} < w.hi");
    match dialect {
        crate::dialect::Dialect::Sqlite => format!(
            "WITH w(k, k_key, lo, hi) AS (VALUES {values}) SELECT w.k, {sums} FROM w CROSS JOIN {from_table} m \
             ON {range} GROUP BY w.k"
        ),
        crate::dialect::Dialect::Postgres => format!(
            "WITH w(k, k_key, lo, hi) AS (VALUES {values}) SELECT w.k, s.weighted, s.samples FROM w \
             CROSS JOIN LATERAL (SELECT {sums} FROM {from_table} m WHERE {range}) s"
        ),
    }
}

impl Store {
    /// Per window `(key, lo, hi)`, the sums of `source`'s rows of that key whose time is in `[lo, hi)`, in the
    /// order asked ([`windowed_sums_sql`], 300 windows a query).
    pub(crate) async fn windowed_sums(
        &self,
        source: Summed,
        windows: &[(String, i64, i64)],
    ) -> Result<Vec<(f64, i64)>, StoreError> {
        let mut out = vec![(0.0, 0); windows.len()];
        for (c, chunk) in windows.chunks(WINDOWS_PER_QUERY).enumerate() {
            let rows: Vec<WindowSum> = on_pool!(self, pool, dialect => {
                let sql = windowed_sums_sql(dialect, source, chunk.len());
                let mut q = sqlx::query_as(&sql);
                for (i, (key, lo, hi)) in chunk.iter().enumerate() {
                    q = q.bind(i64::try_from(c * WINDOWS_PER_QUERY + i).unwrap_or(i64::MAX)).bind(key).bind(lo).bind(hi);
                }
                q.fetch_all(pool).await?
            });
            for WindowSum { k, weighted, samples } in rows {
                if let Some(slot) = usize::try_from(k).ok().and_then(|k| out.get_mut(k)) {
                    *slot = (weighted, samples);
                }
            }
        }
        Ok(out)
    }
}
