//! Liveness and readiness.

use axum::extract::State;

use super::error::ApiError;
use tessera_services::app::AppState;

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "health", security(()), responses((status = 200, description = "alive", body = String)))]
pub async fn healthz() -> &'static str {
    "ok"
}

/// Readiness: the database answers.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "health",
    security(()),
    responses((status = 200, description = "ready", body = String), (status = 503, description = "database unavailable"))
)]
pub async fn readyz(State(state): State<AppState>) -> Result<&'static str, ApiError> {
    state.store.ping().await.map_err(|e| ApiError::Unavailable(format!("database: {e}")))?;
    Ok("ready")
}
