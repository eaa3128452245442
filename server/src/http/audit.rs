//! The audit log (platform admins): who changed what, before and after, when.

use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::auth::require_platform_admin;
use super::error::{ApiError, ApiJson, ApiQuery, Problem};
use crate::app::AppState;
use crate::store::Principal;

/// Which object's history.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// Object, e.g. `request/<id>`, `tenant/<id>`, `gpu/<id>`.
    pub object: String,
}

/// One audit entry.
#[derive(Debug, Serialize, ToSchema)]
pub struct AuditView {
    /// UTC milliseconds.
    pub at_ms: i64,
    /// Who (`user:<name>`, `system`, `auto-layout`).
    pub actor: String,
    /// What, e.g. `request.approved`.
    pub action: String,
    /// On what.
    pub object: String,
    /// State before, as JSON text.
    pub before: Option<String>,
    /// State after, as JSON text.
    pub after: Option<String>,
}

/// An object's history, oldest first.
#[utoipa::path(get, path = "/api/v1/audit", tag = "audit", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])), params(AuditQuery),
    responses((status = 200, body = Vec<AuditView>), (status = 403, body = Problem)))]
pub async fn audit(
    State(state): State<AppState>,
    p: Principal,
    ApiQuery(q): ApiQuery<AuditQuery>,
) -> Result<ApiJson<Vec<AuditView>>, ApiError> {
    require_platform_admin(&p)?;
    let entries = state.store.audit(&q.object).await?;
    Ok(ApiJson(
        entries
            .into_iter()
            .map(|e| AuditView {
                at_ms: e.at_ms,
                actor: e.actor,
                action: e.action,
                object: e.object,
                before: e.before,
                after: e.after,
            })
            .collect(),
    ))
}
