//! The SQLite backend: a file in the data dir, WAL, foreign keys on, a busy timeout. Writing transactions begin
//! with `BEGIN IMMEDIATE` (see [`super::dialect::Dialect::begin`]).

use std::str::FromStr;
use std::time::Duration;

use sqlx::SqlitePool;
use sqlx::migrate::Migrator;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use super::StoreError;

pub(super) static MIGRATOR: Migrator = sqlx::migrate!("../migrations/sqlite");

pub(super) async fn connect(url: &str) -> Result<SqlitePool, StoreError> {
    let options = SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .foreign_keys(true)
        .busy_timeout(Duration::from_secs(30));
    Ok(SqlitePoolOptions::new().max_connections(8).connect_with(options).await?)
}
