//! The fleet-wide audit log, filtered and read a page at a time, newest first.
//!
//! One SQL body for both backends (see [`super::dialect`]).

use super::{AuditEntry, AuditRow, Store, StoreError, audit_from};

/// Which audit entries to read. Every condition given must hold.
#[derive(Debug, Clone, Copy, Default)]
pub struct AuditFilter<'a> {
    /// Only about exactly this object, e.g. `request/<id>`.
    pub object: Option<&'a str>,
    /// Only about objects whose name starts with this, e.g. `request/` (case-sensitive).
    pub object_prefix: Option<&'a str>,
    /// Only by exactly this actor, e.g. `user:alice`.
    pub actor: Option<&'a str>,
    /// Only actions that start with this, e.g. `request.` (case-sensitive).
    pub action_prefix: Option<&'a str>,
    /// Only at or after this time, UTC ms.
    pub from_ms: Option<i64>,
    /// Only before this time, UTC ms.
    pub to_ms: Option<i64>,
    /// Only entries older than the one with this id (the cursor of the previous page).
    pub before_id: Option<i64>,
    /// At most this many.
    pub limit: u32,
}

/// A value bound to a condition.
enum Bound<'a> {
    Text(&'a str),
    Int(i64),
}

impl<'a> AuditFilter<'a> {
    /// SQL conditions and their values, numbered from `$1`.
    fn conditions(&self) -> (String, Vec<Bound<'a>>) {
        let at = "at_ms";
        let mut sql = String::new();
        let mut values = Vec::new();
        let mut add = |condition: &dyn Fn(usize) -> String, value: Bound<'a>| {
            values.push(value);
            sql.push_str(" AND ");
            sql.push_str(&condition(values.len()));
        };
        // Prefixes are compared as substrings, not with LIKE: LIKE is case-insensitive on SQLite and would treat
        // `_` and `%` in the prefix as wildcards.
        let prefix = |column: &'static str| move |n: usize| format!("substr({column}, 1, length(${n})) = ${n}");
        if let Some(v) = self.object {
            add(&|n| format!("object = ${n}"), Bound::Text(v));
        }
        if let Some(v) = self.object_prefix {
            add(&prefix("object"), Bound::Text(v));
        }
        if let Some(v) = self.actor {
            add(&|n| format!("actor = ${n}"), Bound::Text(v));
        }
        if let Some(v) = self.action_prefix {
            add(&prefix("action"), Bound::Text(v));
        }
        if let Some(v) = self.from_ms {
            add(&|n| format!("{at} >= ${n}"), Bound::Int(v));
        }
        if let Some(v) = self.to_ms {
            add(&|n| format!("{at} < ${n}"), Bound::Int(v));
        }
        if let Some(v) = self.before_id {
            add(&|n| format!("id < ${n}"), Bound::Int(v));
        }
        (sql, values)
    }
}

/// An audit row with its id.
#[derive(Debug, sqlx::FromRow)]
struct NumberedRow {
    id: i64,
    #[sqlx(flatten)]
    entry: AuditRow,
}

impl Store {
    /// Audit entries matching `filter` with their ids, newest (highest id) first.
    pub async fn audit_entries(&self, filter: AuditFilter<'_>) -> Result<Vec<(i64, AuditEntry)>, StoreError> {
        on_pool!(self, pool, dialect => {
            let (conditions, values) = filter.conditions();
            // The limit is bound, not spliced in, so every page size shares one prepared statement.
            let sql = format!(
                "SELECT id, at_ms, actor, action, object, CAST(before_json AS TEXT) AS before_json, \
                 CAST(after_json AS TEXT) AS after_json FROM audit_log WHERE 1 = 1{conditions} \
                 ORDER BY id DESC LIMIT ${}",
                values.len() + 1
            );
            let mut query = sqlx::query_as::<_, NumberedRow>(&sql);
            for v in values {
                query = match v {
                    Bound::Text(t) => query.bind(t),
                    Bound::Int(i) => query.bind(i),
                };
            }
            let rows = query.bind(i64::from(filter.limit)).fetch_all(pool).await?;
            Ok(rows.into_iter().map(|r| (r.id, audit_from(r.entry))).collect())
        })
    }
}
