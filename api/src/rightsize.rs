//! Right-sizing: per active allocation, what it used (peak memory, 95th percentile utilisation) and the smallest
//! slice that would carry that with headroom.

use serde::{Deserialize, Serialize};

/// Whose allocations, over which window, with how much headroom.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct RightsizeQuery {
    /// One tenant (id); default: every tenant the caller may see.
    pub tenant: Option<String>,
    /// The window, days before now (1-30, default 7; the minute series is kept 30 days). An allocation active for
    /// less is judged over its life.
    #[cfg_attr(feature = "openapi", param(minimum = 1, maximum = 30))]
    pub days: Option<u32>,
    /// Headroom over the peak memory and the 95th percentile utilisation, % (0-100, default 20).
    #[cfg_attr(feature = "openapi", param(minimum = 0, maximum = 100))]
    pub headroom_pct: Option<f64>,
}

/// The judgement on one allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum RightsizeVerdict {
    /// A smaller profile (`suggested_profile`) carries its use with the headroom.
    Smaller,
    /// Nothing smaller of its model and variant does.
    RightSized,
    /// Its use with the headroom is more than it holds: it may want a larger slice.
    AtLimit,
    /// Fewer than 60 minutes with telemetry in the window.
    NotEnoughData,
    /// A time-sliced or MPS share: its device's figures are every holder's at once.
    SharedDevice,
    /// Its GPU's model or profile is not in the catalog.
    UnknownModel,
}

/// One active allocation: what it used in the window and what would carry it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RightsizeAllocation {
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
    /// Catalog model key.
    pub model: String,
    /// What it holds: a MIG profile, or `exclusive`, `timeslice:N`, `mps:N` for a whole-GPU share.
    pub held: String,
    /// Compute slices it holds (a whole GPU holds all of its model's).
    pub compute_slices: u32,
    /// Memory of what it holds, MiB.
    pub memory_mib: f64,
    /// Window start (the later of `days` before now and its activation), UTC ms.
    pub from_ms: i64,
    /// Window end (now), UTC ms.
    pub to_ms: i64,
    /// Minutes with telemetry in the window.
    pub minutes: u32,
    /// Highest memory in use in the window, MiB.
    pub peak_mem_mib: Option<f64>,
    /// 95th percentile of its one-minute mean utilisation, % of what it holds (rounded up to the next half
    /// percent); `null` where the GPU reports none per MIG instance (Ampere: A100, A30), which is judged as using all
    /// of its compute.
    pub p95_util_pct: Option<f64>,
    /// Compute slices needed: p95 utilisation × compute slices × (1 + headroom).
    pub need_compute_slices: Option<f64>,
    /// Memory needed: peak × (1 + headroom), MiB.
    pub need_mem_mib: Option<f64>,
    /// The judgement.
    pub verdict: RightsizeVerdict,
    /// The smaller profile, when `verdict` is `smaller`.
    pub suggested_profile: Option<String>,
    /// Compute slices the smaller profile gives back.
    pub compute_slices_saved: u32,
    /// Memory slices it gives back.
    pub memory_slices_saved: u32,
    /// Compute-slice-hours it would have saved over the window.
    pub slice_hours_saved: f64,
    /// Compute-slice-hours it saves a day from now on.
    pub slice_hours_saved_per_day: f64,
}

/// Right-sizing over the window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RightsizeReport {
    /// `days` before now, UTC ms.
    pub from_ms: i64,
    /// Now, UTC ms.
    pub to_ms: i64,
    /// The headroom used, %.
    pub headroom_pct: f64,
    /// Active allocations the caller may see: those that could be smaller first (most saved first), then the rest
    /// by tenant and id.
    pub allocations: Vec<RightsizeAllocation>,
    /// How many could be smaller.
    pub smaller: u32,
    /// Compute slices they would give back.
    pub compute_slices_saved: u32,
    /// Compute-slice-hours a day they would save.
    pub slice_hours_saved_per_day: f64,
}

/// Ask for the smaller slice in place of an allocation's request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RightsizeBody {
    /// The smaller profile (the report's `suggested_profile`, or another of the same model and variant with no
    /// more compute or memory slices).
    #[cfg_attr(feature = "openapi", schema(max_length = 64))]
    pub profile: String,
    /// Why (shown to approvers; default: the right-sizing that suggested it).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(max_length = 2000))]
    pub reason: Option<String>,
}

/// A request for the smaller slice, made to replace another.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Replacement {
    /// The new request: as many slices of the smaller profile as the request it replaces holds, pending or
    /// approved as any request of the tenant would be.
    pub request: crate::requests::RequestView,
    /// The request it replaces: released, in the same transaction, when the new one turns active.
    pub replaces: String,
}
