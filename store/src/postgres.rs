//! The PostgreSQL backend. Writes that check before they insert lock the rows they read first (`SELECT ... FOR
//! UPDATE`, see [`super::dialect::Dialect::lock`]), so all writers for one tenant serialise while other tenants
//! proceed. JSON columns are `jsonb`.

use std::time::Duration;

use sqlx::PgPool;
use sqlx::migrate::Migrator;
use sqlx::postgres::PgPoolOptions;

use super::StoreError;

pub(super) static MIGRATOR: Migrator = sqlx::migrate!("../migrations/postgres");

pub(super) async fn connect(url: &str) -> Result<PgPool, StoreError> {
    Ok(PgPoolOptions::new().max_connections(16).acquire_timeout(Duration::from_secs(30)).connect(url).await?)
}
