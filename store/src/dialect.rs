//! What one SQL body needs to run on both backends.
//!
//! Both schemas keep times as UTC milliseconds in `<name>_ms` integer columns and integers as 64-bit, so almost
//! every statement is the same text on SQLite and PostgreSQL. [`Dialect`] spells the few real differences: how a
//! writing transaction takes its locks, how JSON is bound (PostgreSQL keeps it as `jsonb`), and byte-order
//! collation. Reads of JSON columns use `CAST(column AS TEXT)`, which both accept.
//!
//! [`on_pool!`] runs a body against whichever pool the store has; helpers that run inside a transaction take a
//! [`Conn`] and run their one body through [`on_conn!`].

use sqlx::postgres::PgConnection;
use sqlx::sqlite::SqliteConnection;
use sqlx::{Postgres, Sqlite, Transaction};

/// Runs `$body` with `$pool` bound to the store's pool and `$dialect` to its [`Dialect`]; with `$db`, that names
/// the backend's [`sqlx::Database`] type too (for a [`sqlx::QueryBuilder`]).
macro_rules! on_pool {
    ($store:expr, $pool:ident, $dialect:ident, $db:ident => $body:expr) => {
        match &$store.db {
            $crate::Db::Sqlite($pool) => {
                #[allow(unused_variables)]
                let $dialect = $crate::dialect::Dialect::Sqlite;
                #[allow(dead_code)]
                type $db = sqlx::Sqlite;
                $body
            }
            $crate::Db::Postgres($pool) => {
                #[allow(unused_variables)]
                let $dialect = $crate::dialect::Dialect::Postgres;
                #[allow(dead_code)]
                type $db = sqlx::Postgres;
                $body
            }
        }
    };
    ($store:expr, $pool:ident, $dialect:ident => $body:expr) => {
        match &$store.db {
            $crate::Db::Sqlite($pool) => {
                #[allow(unused_variables)]
                let $dialect = $crate::dialect::Dialect::Sqlite;
                $body
            }
            $crate::Db::Postgres($pool) => {
                #[allow(unused_variables)]
                let $dialect = $crate::dialect::Dialect::Postgres;
                $body
            }
        }
    };
}

/// Runs `$body` with `$conn` bound to the connection inside a [`Conn`] and `$dialect` to its [`Dialect`]; with
/// `$db`, that names the backend's [`sqlx::Database`] type too (for a [`sqlx::QueryBuilder`]).
macro_rules! on_conn {
    ($c:expr, $conn:ident, $dialect:ident, $db:ident => $body:expr) => {
        match $c {
            $crate::dialect::Conn::Sqlite($conn) => {
                #[allow(unused_variables)]
                let $dialect = $crate::dialect::Dialect::Sqlite;
                #[allow(dead_code)]
                type $db = sqlx::Sqlite;
                $body
            }
            $crate::dialect::Conn::Postgres($conn) => {
                #[allow(unused_variables)]
                let $dialect = $crate::dialect::Dialect::Postgres;
                #[allow(dead_code)]
                type $db = sqlx::Postgres;
                $body
            }
        }
    };
    ($c:expr, $conn:ident, $dialect:ident => $body:expr) => {
        match $c {
            $crate::dialect::Conn::Sqlite($conn) => {
                #[allow(unused_variables)]
                let $dialect = $crate::dialect::Dialect::Sqlite;
                $body
            }
            $crate::dialect::Conn::Postgres($conn) => {
                #[allow(unused_variables)]
                let $dialect = $crate::dialect::Dialect::Postgres;
                $body
            }
        }
    };
}

/// The backend a statement is written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dialect {
    Sqlite,
    Postgres,
}

impl Dialect {
    /// The database's own clock, in UTC milliseconds, as an SQL expression: what replicas agree on when their own
    /// clocks drift apart (PostgreSQL's `clock_timestamp()`; SQLite's clock is this process's machine's anyway).
    pub(crate) fn now_ms_sql(self) -> &'static str {
        match self {
            Dialect::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
            Dialect::Postgres => "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
        }
    }

    /// How a writing transaction begins: SQLite takes the write lock up front, so that a transaction that reads
    /// before it writes never fails to upgrade its lock (and two such writers never interleave).
    pub(super) fn begin(self) -> &'static str {
        match self {
            Dialect::Sqlite => "BEGIN IMMEDIATE",
            Dialect::Postgres => "BEGIN",
        }
    }

    /// What takes a shared lock on the rows a `SELECT` reads inside a writing transaction (others may share it,
    /// a writer waits): PostgreSQL's `FOR SHARE`; SQLite holds the database's write lock already.
    pub(super) fn share_lock(self) -> &'static str {
        match self {
            Dialect::Sqlite => "",
            Dialect::Postgres => " FOR SHARE",
        }
    }

    /// What locks the rows a `SELECT` inside a writing transaction reads: PostgreSQL locks them; SQLite holds the
    /// database's write lock already (see [`Dialect::begin`]).
    pub(super) fn lock(self) -> &'static str {
        match self {
            Dialect::Sqlite => "",
            Dialect::Postgres => " FOR UPDATE",
        }
    }

    /// What locks the rows a `SELECT` reads inside a writing transaction, passing over rows another transaction has
    /// locked (PostgreSQL's `FOR UPDATE SKIP LOCKED`, so that replicas share a queue without waiting on each other);
    /// SQLite holds the database's write lock already.
    pub(super) fn lock_skipping(self) -> &'static str {
        match self {
            Dialect::Sqlite => "",
            Dialect::Postgres => " FOR UPDATE SKIP LOCKED",
        }
    }

    /// A statement that makes the rest of the transaction the only one of its `key` across replicas, answering
    /// one row whose value is true if it got it: PostgreSQL's transaction-scoped advisory lock, tried without
    /// waiting. SQLite's write lock makes every writing transaction the only one already.
    pub(super) fn try_exclusive(self, key: i64) -> String {
        match self {
            Dialect::Sqlite => "SELECT 1 = 1".to_string(),
            Dialect::Postgres => format!("SELECT pg_try_advisory_xact_lock({key})"),
        }
    }

    /// A JSON value bound as text at `$n`.
    pub(super) fn json(self, n: usize) -> String {
        match self {
            Dialect::Sqlite => format!("${n}"),
            Dialect::Postgres => format!("${n}::jsonb"),
        }
    }

    /// What follows a bound JSON value in a [`sqlx::QueryBuilder`] (see [`Dialect::json`]).
    pub(super) fn json_cast(self) -> &'static str {
        match self {
            Dialect::Sqlite => "",
            Dialect::Postgres => "::jsonb",
        }
    }

    /// Byte-order collation for an `ORDER BY` on text (SQLite's default already is).
    pub(super) fn bytewise(self) -> &'static str {
        match self {
            Dialect::Sqlite => "",
            Dialect::Postgres => " COLLATE \"C\"",
        }
    }
}

/// A connection inside a transaction, on either backend.
pub(super) enum Conn<'a> {
    Sqlite(&'a mut SqliteConnection),
    Postgres(&'a mut PgConnection),
}

impl<'a> From<&'a mut SqliteConnection> for Conn<'a> {
    fn from(conn: &'a mut SqliteConnection) -> Self {
        Conn::Sqlite(conn)
    }
}

impl<'a> From<&'a mut PgConnection> for Conn<'a> {
    fn from(conn: &'a mut PgConnection) -> Self {
        Conn::Postgres(conn)
    }
}

impl<'a> From<&'a mut Transaction<'_, Sqlite>> for Conn<'a> {
    fn from(tx: &'a mut Transaction<'_, Sqlite>) -> Self {
        Conn::Sqlite(tx)
    }
}

impl<'a> From<&'a mut Transaction<'_, Postgres>> for Conn<'a> {
    fn from(tx: &'a mut Transaction<'_, Postgres>) -> Self {
        Conn::Postgres(tx)
    }
}

/// `$first, $first+1, ...`: `count` numbered placeholders, for an `IN (...)` list.
pub(crate) fn marks(first: usize, count: usize) -> String {
    (first..first + count).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ")
}
