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
    let options = SqliteConnectOptions::from_str(url)?;
    private_file(options.get_filename());
    let options = options
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .foreign_keys(true)
        .busy_timeout(Duration::from_secs(30));
    Ok(SqlitePoolOptions::new().max_connections(8).connect_with(options).await?)
}

/// Makes the database file readable by its owner only (mode 0600): created so when missing, so SQLite's journal
/// files, which take the database file's mode, are private too; an existing file is narrowed to it. In-memory
/// databases have no file.
fn private_file(path: &std::path::Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let name = path.to_string_lossy();
        if name.is_empty() || name == ":memory:" || name.starts_with("file:") {
            return;
        }
        let made = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path);
        if let Err(e) = made
            && e.kind() == std::io::ErrorKind::AlreadyExists
            && let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        {
            tracing::warn!(path = %path.display(), error = %e, "cannot make the database file private (mode 0600)");
        }
    }
}
