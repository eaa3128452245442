//! Usage and chargeback: GPU-hours per tenant and profile, idle allocations.

use serde::{Deserialize, Serialize};

/// Which usage, and how.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct UsageQuery {
    /// Start, UTC ms (default: 30 days before `to`).
    #[cfg_attr(feature = "openapi", param(minimum = 0, maximum = 253_402_300_799_999_i64))]
    pub from: Option<i64>,
    /// End, UTC ms (default: now).
    #[cfg_attr(feature = "openapi", param(minimum = 0, maximum = 253_402_300_799_999_i64))]
    pub to: Option<i64>,
    /// One tenant (id); default: every tenant the caller may see.
    pub tenant: Option<String>,
    /// An active allocation whose device was used less than this on average (%, 0-100, default 5) over the last
    /// `idle_hours` is idle.
    pub idle_below: Option<f64>,
    /// How far back idleness is judged, hours before now (0.005-720, default 2); an allocation active for less
    /// is never idle.
    pub idle_hours: Option<f64>,
    /// `json` (default) or `csv` (one line per allocation, as a file to download).
    #[cfg_attr(feature = "openapi", param(pattern = "^(json|csv)$"))]
    pub format: Option<String>,
    /// At most this many allocations in `allocations` (JSON only; the CSV file is always whole): those that need
    /// attention first (see [`attention_order`]), and only theirs have `util_in_period` read. The sums per tenant
    /// and per profile, `allocation_count` and `idle_count` still cover every allocation. Default: all of them.
    #[cfg_attr(feature = "openapi", param(minimum = 0, maximum = 100_000))]
    pub limit: Option<u32>,
}

/// The most allocations a `limit` may ask for.
pub const USAGE_LIMIT_MAX: u32 = 100_000;

/// The order of allocations by the attention they need: the idle ones first, then the other active ones, then the
/// rest; within each, the most GPU-hours first (then by allocation id, so that the order is total).
pub fn attention_order(list: &mut [AllocationUsage]) {
    let rank = |a: &AllocationUsage| match (a.idle, a.state.as_str()) {
        (true, _) => 0,
        (false, "active") => 1,
        _ => 2,
    };
    list.sort_by(|a, b| {
        rank(a)
            .cmp(&rank(b))
            .then_with(|| b.gpu_hours.total_cmp(&a.gpu_hours))
            .then_with(|| a.allocation.cmp(&b.allocation))
    });
}

/// One allocation's use in the period.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AllocationUsage {
    /// Allocation id.
    pub allocation: String,
    /// Its request.
    pub request: String,
    /// Tenant id.
    pub tenant_id: String,
    /// Tenant name.
    pub tenant: String,
    /// Node name.
    pub node: String,
    /// GPU UUID.
    pub gpu_uuid: String,
    /// MIG device or GPU UUID.
    pub device_uuid: Option<String>,
    /// Catalog model key.
    pub model: String,
    /// MIG profile, or the sharing of a whole-GPU share (`exclusive`, `timeslice:4`, `mps:2`).
    pub profile: String,
    /// Compute slices the allocation weighs.
    pub weight: f64,
    /// `active` or `released`.
    pub state: String,
    /// Start of its use within the period, UTC ms.
    pub from_ms: i64,
    /// End of its use within the period, UTC ms (the period's end, or now, while it is still active).
    pub to_ms: i64,
    /// Seconds in use within the period.
    pub seconds: f64,
    /// `seconds × weight`.
    pub slice_seconds: f64,
    /// `slice_seconds` as hours of a whole GPU of its model.
    pub gpu_hours: f64,
    /// Mean utilisation of its device over the last `idle_hours`, %; only for allocations still active with a
    /// device, and `null` when no sample of it was seen.
    pub util_mean: Option<f64>,
    /// Active for at least `idle_hours` and `util_mean` below `idle_below`.
    pub idle: bool,
    /// Mean utilisation of its device over its use within the period (`from_ms` to `to_ms`), %, weighted by the
    /// samples of the stored minutes; for released allocations too. `null` when no minute of it was stored (no
    /// device, or no telemetry).
    pub util_in_period: Option<f64>,
}

/// A tenant's use in the period.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TenantUsage {
    /// Tenant id.
    pub tenant_id: String,
    /// Tenant name.
    pub tenant: String,
    /// Allocations in use at some time in the period.
    pub allocations: usize,
    /// Sum of their slice-seconds.
    pub slice_seconds: f64,
    /// Sum of their whole-GPU hours.
    pub gpu_hours: f64,
}

/// The use of one profile of one model in the period, over every tenant in the report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProfileUsage {
    /// Catalog model key.
    pub model: String,
    /// MIG profile, or the sharing of a whole-GPU share (`exclusive`, `timeslice:4`, `mps:2`).
    pub profile: String,
    /// Allocations in use at some time in the period.
    pub allocations: usize,
    /// Sum of their slice-seconds.
    pub slice_seconds: f64,
    /// Sum of their whole-GPU hours.
    pub gpu_hours: f64,
}

/// Usage in a period.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UsageReport {
    /// Start, UTC ms.
    pub from_ms: i64,
    /// End, UTC ms.
    pub to_ms: i64,
    /// Utilisation (%) below which an allocation counts as idle.
    pub idle_below: f64,
    /// How far back idleness was judged, hours before now.
    pub idle_hours: f64,
    /// Per tenant, by name.
    pub tenants: Vec<TenantUsage>,
    /// Per model and profile, by model then profile.
    pub profiles: Vec<ProfileUsage>,
    /// Per allocation, by tenant then allocation; with `limit`, the first `limit` in [`attention_order`].
    pub allocations: Vec<AllocationUsage>,
    /// Allocations in use at some time in the period, all of them (more than `allocations` holds under `limit`).
    #[serde(default)]
    pub allocation_count: usize,
    /// Of those, the ones idle now.
    #[serde(default)]
    pub idle_count: usize,
}
