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

/// A member's ask passed to the tenant's admins (`POST /tenants/{id}/quota-suggestions`): what it asks, and who was
/// told.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QuotaSuggestion {
    /// The tenant's id.
    pub tenant: String,
    /// Resource -> the limit asked for, as in a quota request.
    pub limits: BTreeMap<String, f64>,
    /// Why.
    pub reason: String,
    /// Who made it (`user:<name>`).
    pub suggested_by: String,
    /// The tenant's admins, by name: told in their inbox (and by e-mail where they chose quota events).
    pub tenant_admins: Vec<String>,
    /// Where the tenant has no admin: the platform admins, by name, told instead (they read every tenant's inbox).
    pub platform_admins: Vec<String>,
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
    /// What changed: the guarantee (`limit`), the maximum a tenant may borrow up to (`maximum`), or the most it
    /// lends (`lending`).
    #[serde(default)]
    pub kind: LimitKind,
}

/// Which bound of a resource a change is about.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum LimitKind {
    /// The limit: what the tenant is guaranteed.
    #[default]
    Limit,
    /// The most it may hold by borrowing from its cohort.
    Maximum,
    /// The most of its unused guarantee it lends to its cohort.
    Lending,
}

impl LimitKind {
    /// Parses the stored name.
    pub fn parse(text: &str) -> Option<LimitKind> {
        match text {
            "limit" => Some(LimitKind::Limit),
            "maximum" => Some(LimitKind::Maximum),
            "lending" => Some(LimitKind::Lending),
            _ => None,
        }
    }
}

/// Which timeline to read.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct TimelineQuery {
    /// The resource (default `compute_slices`).
    pub resource: Option<String>,
    /// How many days back from now, 1-90 (default 30).
    #[cfg_attr(feature = "openapi", param(minimum = 1, maximum = 90))]
    pub days: Option<u32>,
}

/// A tenant's limit, maximum, held and used amounts of one resource, hour by hour (UTC hours, oldest first, the
/// last being the current hour so far). Each series has one value per hour.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QuotaTimeline {
    /// The tenant's id.
    pub tenant: String,
    /// Resource key.
    pub resource: String,
    /// Start of the first hour, UTC milliseconds.
    pub start_ms: i64,
    /// Length of each step: one hour (3,600,000 ms).
    pub step_ms: i64,
    /// The limit (guarantee) in force at the end of each hour (`null`: none, unlimited).
    pub limit: Vec<Option<f64>>,
    /// The maximum (borrowing) in force at the end of each hour (`null`: none).
    pub maximum: Vec<Option<f64>>,
    /// Held by live requests (pending to active), the mean over each hour.
    pub held: Vec<f64>,
    /// The most held at any moment of each hour.
    pub peak_held: Vec<f64>,
    /// Held by running allocations (from the agent reporting them to their release), the mean over each hour.
    pub used: Vec<f64>,
    /// The whole window at a glance.
    pub summary: TimelineSummary,
}

/// A timeline's window at a glance.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TimelineSummary {
    /// The most held at any moment.
    pub peak_held: f64,
    /// Mean held.
    pub mean_held: f64,
    /// Mean used.
    pub mean_used: f64,
    /// The limit now (`null`: unlimited).
    pub limit: Option<f64>,
    /// The limit less the peak held: quota never used in the window (`null` without a limit).
    pub never_used: Option<f64>,
}

/// Where every tenant stands (platform admins): who borrows, who waits within its guarantee, who holds quota it
/// does not use, and how far its budgets are spent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QuotaStanding {
    /// Start of the look-back of the 30-day figures, UTC milliseconds.
    pub since_ms: i64,
    /// One per tenant, by name.
    pub tenants: Vec<TenantStanding>,
}

/// Where one tenant stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TenantStanding {
    /// Tenant id.
    pub tenant: String,
    /// Tenant name.
    pub name: String,
    /// Its cohort's name, if any.
    pub cohort: Option<String>,
    /// It holds more than its guarantee on some resource, borrowed from its cohort (never outside a cohort).
    pub borrowing: bool,
    /// It holds more than it may on some resource (its limit outside a cohort, its maximum in one): after a limit
    /// was lowered or a temporary increase ended. Its new requests are refused until it is back under.
    pub over_limit: bool,
    /// Requests within its guarantee wait (pending): it is starved.
    pub starved: bool,
    /// Pending requests within its guarantee.
    pub waiting_within_guarantee: u32,
    /// When the oldest of them was made, UTC milliseconds.
    pub oldest_waiting_ms: Option<i64>,
    /// Borrowed requests being taken back from it.
    pub being_reclaimed: u32,
    /// Its compute-slice guarantee is at least half unused: its peak in 30 days held under half of it.
    pub idle_quota: bool,
    /// How far its budgets are spent this month (the worst of them; `ok` without budgets).
    pub budget: tessera_core::budget::BudgetLevel,
    /// One line per resource it has a limit on or holds.
    pub lines: Vec<StandingLine>,
}

/// One resource of a tenant's standing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StandingLine {
    /// Resource key.
    pub resource: String,
    /// The limit (guarantee), if any.
    pub limit: Option<f64>,
    /// The maximum by borrowing, if any.
    pub maximum: Option<f64>,
    /// Held now by live requests.
    pub held: f64,
    /// In a cohort, held now above the guarantee up to the maximum: lent by the other members. Always 0 outside a
    /// cohort, where nobody lends.
    pub borrowed: f64,
    /// Held now above the most it may hold (the limit outside a cohort, the maximum in one).
    pub over: f64,
    /// The most held at any moment in the last 30 days.
    pub peak_held_30d: f64,
    /// Mean used (by running allocations) over the last 30 days.
    pub mean_used_30d: f64,
}
