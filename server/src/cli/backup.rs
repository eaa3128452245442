//! `tessera backup` and `tessera restore`: a consistent copy of the SQLite database while the server runs, and
//! that copy put back into an empty data dir (`tessera_store::backup`). PostgreSQL is backed up with its own tools.

use std::io::Write;
use std::path::PathBuf;

use super::error::{CliError, EXIT_OK};

/// Where the database is: as `tessera serve` finds it.
#[derive(Debug, clap::Args)]
pub struct Place {
    /// Where the embedded SQLite database lives [default: $XDG_DATA_HOME/tessera or ~/.local/share/tessera].
    #[arg(long, env = "TESSERA_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// `sqlite://PATH` [default: sqlite://<data-dir>/tessera.db]; a `postgres://` URL is answered with how to use
    /// `pg_dump` and `pg_restore`.
    #[arg(long, env = "TESSERA_DATABASE_URL")]
    database_url: Option<String>,
}

impl Place {
    fn url(self) -> String {
        self.database_url.unwrap_or_else(|| {
            let dir = self.data_dir.unwrap_or_else(crate::config::default_data_dir);
            format!("sqlite://{}", dir.join("tessera.db").display())
        })
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    Ok(tokio::runtime::Builder::new_current_thread().enable_all().build()?)
}

fn failed(e: tessera_store::backup::BackupError) -> CliError {
    CliError::BadInput(e.to_string())
}

/// Writes a consistent snapshot of the database to `out`, the server running or not.
pub(super) fn backup(place: Place, out_file: PathBuf, out: &mut dyn Write) -> Result<u8, CliError> {
    let url = place.url();
    let info = runtime()?.block_on(tessera_store::backup::backup(&url, &out_file)).map_err(failed)?;
    writeln!(
        out,
        "Backed up {} to {} ({} bytes, schema version {}). Restore it with `tessera restore {}` into an empty data dir.",
        tessera_services::redact::url(&url),
        out_file.display(),
        info.bytes,
        info.schema_version,
        out_file.display()
    )?;
    Ok(EXIT_OK)
}

/// Restores `file` into an empty data dir (or SQLite database), migrated to this release's schema.
pub(super) fn restore(place: Place, file: PathBuf, out: &mut dyn Write) -> Result<u8, CliError> {
    let url = place.url();
    if let Some(dir) = url.strip_prefix("sqlite://").and_then(|p| std::path::Path::new(p).parent())
        && !dir.as_os_str().is_empty()
    {
        tessera_services::sealed::private_dir(dir).map_err(|e| CliError::BadInput(format!("data dir: {e}")))?;
    }
    let info = runtime()?.block_on(tessera_store::backup::restore(&file, &url)).map_err(failed)?;
    let upgraded = if info.schema_version < info.build_version {
        format!(", upgraded to schema version {}", info.build_version)
    } else {
        String::new()
    };
    writeln!(
        out,
        "Restored {} (schema version {}{upgraded}) into {}. Start the server on it with the same --data-dir or \
         --database-url.",
        file.display(),
        info.schema_version,
        tessera_services::redact::url(&url)
    )?;
    Ok(EXIT_OK)
}
