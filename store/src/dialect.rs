//! What one SQL body needs to run on both backends.
//!
//! Both schemas keep times as UTC milliseconds in `<name>_ms` integer columns and integers as 64-bit, so almost
//! every statement is the same text on SQLite and PostgreSQL. [`Dialect`] spells the few real differences: how a
//! writing transaction takes its locks, how JSON is bound (PostgreSQL keeps it as `jsonb`), and byte-order
//! collation. Reads of JSON columns use `CAST(column AS TEXT)`, which both accept.
//!
//! [`on_pool!`] runs a body against whichever pool the store has; helpers that run inside a transaction take a
//! [`Conn`] and run their one body through [`on_conn!`].

use std::sync::Arc;

use sqlx::postgres::PgConnection;
use sqlx::sqlite::SqliteConnection;
use sqlx::{Database, Pool, Postgres, Sqlite, Transaction};

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

/// The queue of this process's writing transactions for SQLite's one writer, first come first served.
///
/// SQLite lets one connection write at a time; a `BEGIN IMMEDIATE` that finds the lock taken sleeps in its busy
/// handler (1, 2, 5 ... then 100 ms at a time) and tries again, and whoever asks at the moment the lock is free takes
/// it. Under a steady stream of writes (10,000 agents' heartbeats, a fleet minute's telemetry in 40 transactions) a
/// write that waited once kept losing to writes that came after it: an approval's four writes took seconds at the
/// p95. Here each writing transaction first takes its turn in a fair queue (tokio's mutex wakes waiters in order), so
/// it waits only for the writes before it; SQLite's busy handler is left to other processes on the same file. On
/// PostgreSQL, whose writers lock rows rather than the database, there is no queue.
#[derive(Debug, Clone, Default)]
pub(crate) struct WriteGate(Arc<tokio::sync::Mutex<()>>);

impl crate::Store {
    /// Begins a writing transaction on `pool` (the store's, from [`on_pool!`]): on SQLite after this process's
    /// writers before it (see [`WriteGate`]), with its write lock taken up front ([`Dialect::begin`]).
    pub(crate) async fn write_tx<'p, DB: Database>(
        &self,
        pool: &'p Pool<DB>,
        dialect: Dialect,
    ) -> Result<WriteTx<'p, DB>, sqlx::Error> {
        let turn = match dialect {
            Dialect::Sqlite => Some(self.gate.0.clone().lock_owned().await),
            Dialect::Postgres => None,
        };
        let tx = pool.begin_with(dialect.begin()).await?;
        Ok(WriteTx { tx, _turn: turn })
    }

    /// This process's turn to write on SQLite, for a write outside a transaction (see [`WriteGate`]): held until
    /// dropped; `None` on PostgreSQL.
    pub(crate) async fn write_turn(&self, dialect: Dialect) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        match dialect {
            Dialect::Sqlite => Some(self.gate.0.clone().lock_owned().await),
            Dialect::Postgres => None,
        }
    }
}

/// A writing transaction holding its turn ([`WriteGate`]) until it is committed, rolled back or dropped. It derefs
/// to its connection, as a [`Transaction`] does (`&mut *tx` is an executor).
pub(crate) struct WriteTx<'p, DB: Database> {
    tx: Transaction<'p, DB>,
    _turn: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl<DB: Database> WriteTx<'_, DB> {
    pub(crate) async fn commit(self) -> Result<(), sqlx::Error> {
        self.tx.commit().await
    }

    #[allow(dead_code)]
    pub(crate) async fn rollback(self) -> Result<(), sqlx::Error> {
        self.tx.rollback().await
    }
}

impl<DB: Database> std::ops::Deref for WriteTx<'_, DB> {
    type Target = DB::Connection;
    fn deref(&self) -> &DB::Connection {
        &self.tx
    }
}

impl<DB: Database> std::ops::DerefMut for WriteTx<'_, DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        &mut self.tx
    }
}

impl<'a> From<&'a mut WriteTx<'_, Sqlite>> for Conn<'a> {
    fn from(tx: &'a mut WriteTx<'_, Sqlite>) -> Self {
        Conn::Sqlite(tx)
    }
}

impl<'a> From<&'a mut WriteTx<'_, Postgres>> for Conn<'a> {
    fn from(tx: &'a mut WriteTx<'_, Postgres>) -> Self {
        Conn::Postgres(tx)
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
