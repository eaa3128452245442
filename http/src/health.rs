//! Liveness and readiness.

use axum::extract::State;

use super::error::{ApiError, Problem};
use tessera_services::app::AppState;

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "health", security(()), responses((status = 200, description = "alive", body = String)))]
pub async fn healthz() -> &'static str {
    "ok"
}

/// Readiness: the database answers and the replica is not shutting down. From SIGTERM (or SIGINT) on it answers
/// 503 `shutting_down` while the replica still serves requests for `TESSERA_SHUTDOWN_DELAY_S`, so that a load
/// balancer's or Kubernetes' probe takes it out before its listener closes.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "health",
    security(()),
    responses((status = 200, description = "ready", body = String),
        (status = 503, body = Problem, description = "unavailable (the database does not answer), shutting_down"))
)]
pub async fn readyz(State(state): State<AppState>) -> Result<&'static str, ApiError> {
    if state.draining.is_draining() {
        return Err(ApiError::Invalid {
            status: axum::http::StatusCode::SERVICE_UNAVAILABLE,
            code: "shutting_down",
            detail: "this replica is shutting down: send new work to another".into(),
        });
    }
    state.store.ping().await.map_err(|e| ApiError::Unavailable(format!("database: {e}")))?;
    Ok("ready")
}
