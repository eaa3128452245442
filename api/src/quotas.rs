//! Quota requests (a tenant's admin asks for new limits, a platform admin grants them in full or in part, or
//! refuses) and the history of every limit.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
pub use tessera_core::quota_request::QuotaRequestState;

/// A quota request to make.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NewQuotaRequest {
    /// Resource (`compute_slices`, `memory_gib`, `mig/<model>/<profile>`, `gpu/<model>`, `timeslice/<model>`,
    /// `mps/<model>`) -> the limit asked for, 0 to 1e12 (fractions allowed: `1.75`). 1 to 32 resources, each
    /// different from the limit in force.
    pub limits: BTreeMap<String, f64>,
    /// Why (shown to approvers): 1-2000 characters.
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 2000))]
    pub reason: String,
    /// For a temporary increase, when it ends (UTC milliseconds, 1 hour to 366 days ahead): the increment is then
    /// taken back. Absent: the change stays.
    #[serde(default)]
    pub until_ms: Option<i64>,
}

/// A quota request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QuotaRequestView {
    /// Id (UUIDv7).
    pub id: String,
    /// Tenant id.
    pub tenant: String,
    /// Who asked (`user:<name>`).
    pub requested_by: String,
    /// Why it was asked for.
    pub reason: String,
    /// When a temporary increase ends, UTC milliseconds; absent for a lasting change.
    pub until_ms: Option<i64>,
    /// Where it stands.
    pub state: QuotaRequestState,
    /// One line per resource asked for, in resource order.
    pub lines: Vec<QuotaRequestLine>,
    /// Who decided (`user:<name>`), or who cancelled it.
    pub decided_by: Option<String>,
    /// The approver's comment, or the reason for refusing it.
    pub comment: String,
    /// Version; also the `ETag`.
    pub version: i64,
    /// UTC milliseconds.
    pub created_at_ms: i64,
    /// UTC milliseconds.
    pub updated_at_ms: i64,
}

/// One resource of a quota request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QuotaRequestLine {
    /// Resource key.
    pub resource: String,
    /// The limit asked for.
    pub asked: f64,
    /// The limit when it was asked for (absent: unlimited).
    pub before: Option<f64>,
    /// The limit granted (absent: not granted, or not decided yet).
    pub granted: Option<f64>,
}

/// A page of quota requests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QuotaRequestPage {
    /// Quota requests, newest first.
    pub items: Vec<QuotaRequestView>,
    /// Pass as `cursor` for the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// Filters of the quota request list.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct QuotaRequestQuery {
    /// Only this tenant's (its id or name).
    pub tenant: Option<String>,
    /// Only requests in this state.
    pub state: Option<QuotaRequestState>,
    /// From the previous page's `next_cursor`.
    pub cursor: Option<String>,
    /// Page size, 1-500 (default 100).
    #[cfg_attr(feature = "openapi", param(minimum = 1, maximum = 500))]
    pub limit: Option<u32>,
}

/// A grant (platform admins).
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct GrantBody {
    /// Resource -> the limit granted, from the limit in force to the amount asked; resources left out are not
    /// granted. Absent: everything as asked.
    #[serde(default)]
    pub limits: Option<BTreeMap<String, f64>>,
    /// A comment for the tenant (0-2000 characters).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(max_length = 2000))]
    pub comment: String,
}

/// One change of one limit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LimitChangeView {
    /// Resource key.
    pub resource: String,
    /// UTC milliseconds.
    pub at_ms: i64,
    /// Who changed it (`user:<name>`, or `system:quota-end` when a temporary increase ended).
    pub actor: String,
    /// The limit before (absent: unlimited).
    pub before: Option<f64>,
    /// The limit after (absent: unlimited).
    pub after: Option<f64>,
    /// Why: the quota request's reason, or the admin's.
    pub why: String,
    /// The quota request that made the change, if one did.
    pub quota_request: Option<String>,
}
