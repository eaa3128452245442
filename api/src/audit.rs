//! The audit log: entries about one object, and the fleet-wide log a page at a time.

use serde::{Deserialize, Serialize};

/// Which object's history.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct AuditQuery {
    /// Object, e.g. `request/<id>`, `tenant/<id>`, `gpu/<id>`.
    pub object: String,
}

/// One audit entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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

/// Which entries of the fleet-wide log. Every filter given must hold.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct AuditEntriesQuery {
    /// Exactly this object, e.g. `request/<id>`.
    pub object: Option<String>,
    /// Objects whose name starts with this, e.g. `request/` or `tenant/<id>/` (case-sensitive).
    pub object_prefix: Option<String>,
    /// Exactly this actor, e.g. `user:alice` or `system:auto-approve`.
    pub actor: Option<String>,
    /// Actions that start with this, e.g. `request.` or `membership.` (case-sensitive).
    pub action: Option<String>,
    /// At or after this time, UTC ms.
    #[cfg_attr(feature = "openapi", param(minimum = 0, maximum = 253_402_300_799_999_i64))]
    pub from: Option<i64>,
    /// Before this time, UTC ms.
    #[cfg_attr(feature = "openapi", param(minimum = 0, maximum = 253_402_300_799_999_i64))]
    pub to: Option<i64>,
    /// Page size, 1-500 (default 100).
    #[cfg_attr(feature = "openapi", param(minimum = 1, maximum = 500))]
    pub limit: Option<u32>,
    /// The previous page's `next`, for the entries after it.
    pub before: Option<String>,
}

/// A page of the audit log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditPage {
    /// Entries, newest first.
    pub entries: Vec<AuditView>,
    /// Pass as `before` for the next (older) page; `null` on the last page.
    pub next: Option<String>,
}
