//! Starting the control plane: connect and migrate the store, make sure a platform admin exists, serve.
//! `prepare` and `serve` take their inputs (settings, a bound listener, a shutdown future), so tests start the real
//! server on port 0.

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::app::{App, AppState};
use crate::http::auth::{TOKEN_PREFIX, new_token_secret, token_hash};
use crate::store::{Store, StoreError};

/// What the server needs to start.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `sqlite://PATH` or `postgres://...`.
    pub database_url: String,
    /// Token for the bootstrap admin (`TESSERA_BOOTSTRAP_TOKEN`); generated when absent.
    pub bootstrap_token: Option<String>,
}

/// Name of the platform admin created at first start.
pub const BOOTSTRAP_ADMIN: &str = "admin";

/// Startup failures.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The store could not be opened or migrated.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The bootstrap token is malformed.
    #[error("the bootstrap token must start with `{TOKEN_PREFIX}` and have at least 32 characters after it")]
    BadBootstrapToken,
    /// The server failed.
    #[error("server: {0}")]
    Io(#[from] std::io::Error),
}

/// Opens the store, migrates it and, on first start, creates the platform admin `admin`. Returns the state and,
/// when a token was generated, its secret (shown once; only its hash is stored).
pub async fn prepare(settings: &Settings) -> Result<(AppState, Option<String>), ServeError> {
    let store = Store::connect(&settings.database_url).await?;
    store.migrate().await?;
    let generated = match store.user_by_name(BOOTSTRAP_ADMIN).await {
        Ok(_) => None,
        Err(StoreError::NotFound { .. }) => {
            let (secret, generated) = match &settings.bootstrap_token {
                Some(t) if t.starts_with(TOKEN_PREFIX) && t.len() >= TOKEN_PREFIX.len() + 32 => (t.clone(), false),
                Some(_) => return Err(ServeError::BadBootstrapToken),
                None => (new_token_secret(), true),
            };
            let admin = store.create_user(BOOTSTRAP_ADMIN, true, "system").await?;
            store.create_token(&admin.id, "bootstrap", &token_hash(&secret), "system").await?;
            generated.then_some(secret)
        }
        Err(e) => return Err(e.into()),
    };
    let state = AppState(Arc::new(App { store, catalog: tessera_core::Catalog::builtin() }));
    Ok((state, generated))
}

/// Serves the API on `listener` until `shutdown` completes.
pub async fn serve(
    state: AppState,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let app = crate::http::router(state);
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await?;
    Ok(())
}
