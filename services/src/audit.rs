//! The audit log: who may read which part of it.

use crate::app::AppState;
use crate::auth::Permissions;
use crate::error::ApiError;
use tessera_store::{AuditEntry, Principal};

/// One object's history, oldest first: a request's for whoever may see the request (404 for others, as
/// everywhere), any other object's for platform admins.
pub async fn history(state: &AppState, p: &Principal, object: &str) -> Result<Vec<AuditEntry>, ApiError> {
    match object.strip_prefix("request/") {
        Some(id) if !p.is_platform_admin() => {
            super::requests::get(state, p, id).await?;
        }
        _ => p.require_platform_admin()?,
    }
    Ok(state.store.audit(object).await?)
}
