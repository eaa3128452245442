//! Sums of a sample-weighted mean read in windows of many keys at once (`(key, lo, hi)`: a device's series), one
//! range scan of the primary key per window or, for windows sharing a range, per key; and the placeholders such
//! statements bind (shared with the allocation hours' reads).

use crate::{Store, StoreError};

/// Windows read by one statement (the window sums, a device's use in windows).
pub(crate) const WINDOWS_PER_QUERY: usize = 300;
/// Windows of one range `[lo, hi)` from which they are read as one range of many keys ([`shared_range_sums_sql`])
/// rather than one window each: a report's windows mostly share their ranges (every allocation that spans the
/// report's start is cut there; every active one reads the same recent minutes).
pub(crate) const SHARED_RANGE_MIN: usize = 8;
/// Keys read by one shared-range statement.
pub(crate) const KEYS_PER_QUERY: usize = 1_000;

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

/// `n` rows of a `VALUES` list of windows, bound `k, key, lo, hi` each (`BIGINT, TEXT, BIGINT, BIGINT`).
pub(crate) fn window_values(dialect: crate::dialect::Dialect, n: usize) -> String {
    let mut p = Placeholders::new(dialect);
    let row = |p: &mut Placeholders| {
        format!(
            "(CAST({} AS BIGINT), CAST({} AS TEXT), CAST({} AS BIGINT), CAST({} AS BIGINT))",
            p.next(),
            p.next(),
            p.next(),
            p.next()
        )
    };
    (0..n).map(|_| row(&mut p)).collect::<Vec<_>>().join(", ")
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
    let values = window_values(dialect, n);
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

/// Sums of `source`'s rows per key over one range, for the keys bound as one value (a JSON array on SQLite, a
/// `text[]` on PostgreSQL) and the range's `lo, hi`, answered as `(k_key, weighted, samples)` rows; a key with no
/// row may have no answer row. One statement text (prepared once per connection). SQLite is held to one range scan
/// of the primary key per key by `CROSS JOIN` (the keys the outer loop); PostgreSQL plans `= ANY` as its
/// statistics say: the primary key per key, or the range's rows of every key through the time index (bounded by
/// the range, not the series). A lateral subquery per key, as [`windowed_sums_sql`], was measured slower: its
/// partitions are pruned per key while it runs (efficiency at 1,000 GPUs 142 -> 232 ms p50).
pub(crate) fn shared_range_sums_sql(dialect: crate::dialect::Dialect, source: Summed) -> String {
    let Summed { table: from_table, key, time, weighted } = source;
    let sums = format!(
        "CAST(COALESCE(SUM({weighted}), 0) AS DOUBLE PRECISION) AS weighted, \
         CAST(COALESCE(SUM(m.samples), 0) AS BIGINT) AS samples"
    );
    match dialect {
        crate::dialect::Dialect::Sqlite => format!(
            "SELECT m.{key} AS k_key, {sums} FROM json_each(?) j CROSS JOIN {from_table} m \
             ON m.{key} = j.value AND m.{time} >= ? AND m.{time} < ? GROUP BY m.{key}"
        ),
        crate::dialect::Dialect::Postgres => format!(
            "SELECT m.{key} AS k_key, {sums} FROM {from_table} m \
             WHERE m.{key} = ANY($1) AND m.{time} >= $2 AND m.{time} < $3 GROUP BY m.{key}"
        ),
    }
}

/// A key's utilisation sums over a shared range.
#[derive(Debug, sqlx::FromRow)]
struct KeySum {
    k_key: String,
    weighted: f64,
    samples: i64,
}

impl Store {
    /// Per window `(key, lo, hi)`, the sums of `source`'s rows of that key whose time is in `[lo, hi)`, in the
    /// order asked. Windows that share their range, [`SHARED_RANGE_MIN`] or more of them, are read as one range
    /// of their keys ([`shared_range_sums_sql`], 1,000 keys a query); the rest one range scan each
    /// ([`windowed_sums_sql`], 300 windows a query).
    pub(crate) async fn windowed_sums(
        &self,
        source: Summed,
        windows: &[(String, i64, i64)],
    ) -> Result<Vec<(f64, i64)>, StoreError> {
        let mut out = vec![(0.0, 0); windows.len()];
        let mut by_range: std::collections::HashMap<(i64, i64), Vec<usize>> = Default::default();
        for (i, (_, lo, hi)) in windows.iter().enumerate() {
            if lo < hi {
                by_range.entry((*lo, *hi)).or_default().push(i);
            }
        }
        let mut alone: Vec<usize> = Vec::new();
        let mut shared: Vec<((i64, i64), Vec<usize>)> = Vec::new();
        for (range, of) in by_range {
            if of.len() >= SHARED_RANGE_MIN { shared.push((range, of)) } else { alone.extend(of) }
        }
        // In the order asked, so that the same windows make the same statements.
        alone.sort_unstable();
        shared.sort_unstable_by_key(|(range, _)| *range);
        for ((lo, hi), of) in shared {
            let mut keys: Vec<&str> = of.iter().map(|&i| windows[i].0.as_str()).collect();
            keys.sort_unstable();
            keys.dedup();
            let mut sums: std::collections::HashMap<String, (f64, i64)> = Default::default();
            for chunk in keys.chunks(KEYS_PER_QUERY) {
                let rows: Vec<KeySum> = match &self.db {
                    crate::Db::Sqlite(pool) => {
                        sqlx::query_as(&shared_range_sums_sql(crate::dialect::Dialect::Sqlite, source))
                            .bind(serde_json::to_string(chunk).unwrap_or_default())
                            .bind(lo)
                            .bind(hi)
                            .fetch_all(pool)
                            .await?
                    }
                    crate::Db::Postgres(pool) => {
                        sqlx::query_as(&shared_range_sums_sql(crate::dialect::Dialect::Postgres, source))
                            .bind(chunk)
                            .bind(lo)
                            .bind(hi)
                            .fetch_all(pool)
                            .await?
                    }
                };
                sums.extend(rows.into_iter().map(|r| (r.k_key, (r.weighted, r.samples))));
            }
            for i in of {
                if let Some(sum) = sums.get(&windows[i].0) {
                    out[i] = *sum;
                }
            }
        }
        for chunk in alone.chunks(WINDOWS_PER_QUERY) {
            let rows: Vec<WindowSum> = on_pool!(self, pool, dialect => {
                let sql = windowed_sums_sql(dialect, source, chunk.len());
                let mut q = sqlx::query_as(&sql);
                for &i in chunk {
                    let (key, lo, hi) = &windows[i];
                    q = q.bind(i64::try_from(i).unwrap_or(i64::MAX)).bind(key).bind(lo).bind(hi);
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
