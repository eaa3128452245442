//! Backups of the SQLite database, and restoring one. A backup is a SQLite file made with `VACUUM INTO` on a
//! read transaction: a consistent snapshot of a live database (the server keeps writing meanwhile; the snapshot
//! holds every transaction committed before it began and none after), compacted, its schema version inside (the
//! migrations table). A restore checks the file (SQLite's integrity check, migrations this build knows with the
//! same checksums), copies it into an empty place and migrates it to this build's schema. PostgreSQL has its own
//! tools for this (`pg_dump` / `pg_restore`, or base backups with WAL archiving for point-in-time recovery).

use std::path::{Path, PathBuf};
use std::str::FromStr;

use sqlx::Connection;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};

use super::StoreError;

/// What a backup file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupInfo {
    /// The newest migration applied to it.
    pub schema_version: i64,
    /// The newest migration this build has.
    pub build_version: i64,
    /// Its size in bytes.
    pub bytes: u64,
}

/// Why a backup or a restore was refused.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// PostgreSQL is backed up with its own tools.
    #[error(
        "a PostgreSQL database is backed up with PostgreSQL's tools: `pg_dump --format=custom --file tessera.dump \
         URL`, restored with `pg_restore --no-owner --dbname NEW_URL tessera.dump` into an empty database (or base \
         backups with WAL archiving for point-in-time recovery; see docs/operations.md, Backups)"
    )]
    Postgres,
    /// The URL is neither SQLite nor PostgreSQL.
    #[error("unsupported database URL: use sqlite://PATH")]
    BadUrl,
    /// There is no database where the backup was asked of.
    #[error("no database at {0}")]
    Missing(PathBuf),
    /// The backup file or the restore's target exists already.
    #[error("{0} exists already: {1}")]
    Exists(PathBuf, &'static str),
    /// The file is not a Tessera database, or is damaged.
    #[error("{0} is not a usable Tessera backup: {1}")]
    Unusable(PathBuf, String),
    /// The backup was made by a newer build (or another one) than this.
    #[error(
        "{path} has schema version {found}, which this tessera (schema version {known}) does not know: restore it \
         with the release that made it, or a newer one"
    )]
    Newer {
        /// The file.
        path: PathBuf,
        /// Its newest migration.
        found: i64,
        /// This build's newest.
        known: i64,
    },
    /// A database error.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A file error.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl From<sqlx::Error> for BackupError {
    fn from(e: sqlx::Error) -> Self {
        BackupError::Store(StoreError::Other(e))
    }
}

/// The file of a `sqlite:` URL.
fn sqlite_path(url: &str) -> Result<PathBuf, BackupError> {
    if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        return Err(BackupError::Postgres);
    }
    if !url.starts_with("sqlite:") {
        return Err(BackupError::BadUrl);
    }
    let options = SqliteConnectOptions::from_str(url).map_err(|_| BackupError::BadUrl)?;
    Ok(options.get_filename().to_path_buf())
}

/// A connection that reads `path` only, and creates nothing.
async fn read_only(path: &Path) -> Result<SqliteConnection, BackupError> {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .read_only(true)
        .create_if_missing(false)
        .busy_timeout(std::time::Duration::from_secs(30));
    Ok(SqliteConnection::connect_with(&options).await?)
}

/// The newest migration of this build.
fn build_version() -> i64 {
    super::sqlite::MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0)
}

/// Writes a consistent snapshot of the SQLite database at `url` to `out` (which must not exist) while the server
/// may keep writing to it.
pub async fn backup(url: &str, out: &Path) -> Result<BackupInfo, BackupError> {
    let path = sqlite_path(url)?;
    if !path.is_file() {
        return Err(BackupError::Missing(path));
    }
    if out.exists() {
        return Err(BackupError::Exists(out.to_path_buf(), "a backup is never written over a file"));
    }
    let mut conn = read_only(&path).await?;
    // A schema this build does not know could not be restored by it either: say so now.
    let found = applied(&mut conn, &path).await?;
    sqlx::query("VACUUM INTO ?").bind(out.to_string_lossy().as_ref()).execute(&mut conn).await?;
    conn.close().await?;
    private(out);
    let bytes = std::fs::metadata(out)?.len();
    Ok(BackupInfo { schema_version: found, build_version: build_version(), bytes })
}

/// Checks that `file` is a backup this build can restore; what it holds.
pub async fn inspect(file: &Path) -> Result<BackupInfo, BackupError> {
    if !file.is_file() {
        return Err(BackupError::Missing(file.to_path_buf()));
    }
    let unusable = |why: String| BackupError::Unusable(file.to_path_buf(), why);
    let mut conn = read_only(file).await.map_err(|e| unusable(e.to_string()))?;
    let check: String = sqlx::query_scalar("PRAGMA integrity_check(1)")
        .fetch_one(&mut conn)
        .await
        .map_err(|e| unusable(e.to_string()))?;
    if check != "ok" {
        return Err(unusable(format!("SQLite's integrity check says: {check}")));
    }
    let found = applied(&mut conn, file).await?;
    conn.close().await?;
    Ok(BackupInfo { schema_version: found, build_version: build_version(), bytes: std::fs::metadata(file)?.len() })
}

/// The newest migration applied to the database behind `conn`, checked against this build's: each applied one
/// succeeded and is this build's, with its checksum.
async fn applied(conn: &mut SqliteConnection, path: &Path) -> Result<i64, BackupError> {
    let unusable = |why: String| BackupError::Unusable(path.to_path_buf(), why);
    let rows: Vec<(i64, bool, Vec<u8>)> =
        sqlx::query_as("SELECT version, success, checksum FROM _sqlx_migrations ORDER BY version")
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| unusable(format!("no Tessera schema in it ({e})")))?;
    let found = rows.iter().map(|r| r.0).max().ok_or_else(|| unusable("no migration applied".into()))?;
    let known = build_version();
    for (version, success, checksum) in &rows {
        if !success {
            return Err(unusable(format!("migration {version} did not finish")));
        }
        match super::sqlite::MIGRATOR.iter().find(|m| m.version == *version) {
            None => return Err(BackupError::Newer { path: path.to_path_buf(), found, known }),
            Some(m) if m.checksum.as_ref() != checksum.as_slice() => {
                return Err(unusable(format!("migration {version} differs from this build's")));
            }
            Some(_) => {}
        }
    }
    Ok(found)
}

/// Restores the backup `file` into the SQLite database of `url`, which must not exist or be empty, and migrates it
/// to this build's schema (a backup of an older release is upgraded as a start of the server would).
pub async fn restore(file: &Path, url: &str) -> Result<BackupInfo, BackupError> {
    let target = sqlite_path(url)?;
    let info = inspect(file).await?;
    if std::fs::metadata(&target).is_ok_and(|m| m.len() > 0) {
        return Err(BackupError::Exists(target, "a restore goes into an empty data dir or database only"));
    }
    for leftover in ["-wal", "-shm", "-journal"] {
        let side = PathBuf::from(format!("{}{leftover}", target.display()));
        if side.exists() {
            return Err(BackupError::Exists(side, "a restore goes into an empty data dir or database only"));
        }
    }
    if let Some(dir) = target.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    // An empty file left by an earlier try is replaced (VACUUM INTO writes only into a missing or empty file).
    let _ = std::fs::remove_file(&target);
    let mut conn = read_only(file).await?;
    sqlx::query("VACUUM INTO ?").bind(target.to_string_lossy().as_ref()).execute(&mut conn).await?;
    conn.close().await?;
    private(&target);
    let store = super::Store::connect(url).await?;
    store.migrate().await?;
    store.close().await;
    Ok(info)
}

/// Makes a written file readable by its owner only, as the database itself is.
fn private(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)) {
            tracing::warn!(path = %path.display(), error = %e, "cannot make the file private (mode 0600)");
        }
    }
}
