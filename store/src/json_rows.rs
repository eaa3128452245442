//! Large reads answered on SQLite as one JSON array of their rows.
//!
//! sqlx hands SQLite's rows over one at a time through its worker thread, about 25 us a row whatever the row
//! holds: the fleet's 80,000 GPUs took two seconds that way, a day's 3,000 metered allocations 100 ms. SQLite
//! builds the same rows as one `json_group_array(json_array(..))` value in a fraction of that, and serde reads an
//! array into a struct's fields in their order. PostgreSQL's rows come over its wire protocol at a few
//! microseconds each and are read as rows.

use serde::de::{self, DeserializeOwned, Deserializer};
use sqlx::postgres::PgRow;
use sqlx::sqlite::SqliteRow;

use super::{Db, Store, StoreError};

/// A flag stored as SQLite's 0 or 1 (or a JSON boolean), read as a `bool`.
pub(crate) fn flag<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    struct Flag;
    impl de::Visitor<'_> for Flag {
        type Value = bool;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("0, 1 or a boolean")
        }
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<bool, E> {
            Ok(v)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<bool, E> {
            Ok(v != 0)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<bool, E> {
            Ok(v != 0)
        }
    }
    d.deserialize_any(Flag)
}

/// The rows of one JSON array, each an array of a `T`'s fields in order; `what` names them in an error.
pub(crate) fn decode<T: DeserializeOwned>(json: &str, what: &str) -> Result<Vec<T>, StoreError> {
    serde_json::from_str(json).map_err(|e| StoreError::Corrupt(format!("{what}: {e}")))
}

impl Store {
    /// Every row of `SELECT {columns} {from}` (no parameters; `from` without `ORDER BY`, the order is the
    /// caller's to make). On SQLite the same rows as one array of `json_columns` (the columns as `json_array`
    /// takes them: no aliases or casts, flags read with [`flag`]).
    pub(crate) async fn read_rows<T>(
        &self,
        columns: &str,
        json_columns: &str,
        from: &str,
        what: &str,
    ) -> Result<Vec<T>, StoreError>
    where
        T: DeserializeOwned + for<'r> sqlx::FromRow<'r, SqliteRow> + for<'r> sqlx::FromRow<'r, PgRow> + Send + Unpin,
    {
        match &self.db {
            Db::Sqlite(pool) => {
                let sql = format!("SELECT json_group_array(json_array({json_columns})) {from}");
                let (json,): (String,) = sqlx::query_as(&sql).fetch_one(pool).await?;
                decode(&json, what)
            }
            Db::Postgres(pool) => Ok(sqlx::query_as(&format!("SELECT {columns} {from}")).fetch_all(pool).await?),
        }
    }
}
