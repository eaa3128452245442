//! Slice requests: creating, listing, approving, rejecting, cancelling, releasing.

use serde::{Deserialize, Serialize};
use tessera_core::cohort::Priority;
pub use tessera_core::pending::{ModelRoom, WaitReason};
use tessera_core::request::{RequestState, SliceSpec};

/// A request to create.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NewRequestBody {
    /// Tenant id.
    pub tenant: String,
    /// What one slice is.
    pub spec: SliceSpec,
    /// How many slices (1-1000).
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1000))]
    pub count: u32,
    /// Why (shown to approvers).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(max_length = 2000))]
    pub reason: String,
    /// How long the slices are wanted once active, in seconds (60 to 90 days); absent: until released.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(minimum = 60, maximum = 7_776_000))]
    pub duration_s: Option<u64>,
    /// Its priority within the tenant (default `normal`): high-priority requests fill the tenant's guarantee
    /// first, and low-priority borrowed ones are reclaimed first.
    #[serde(default)]
    pub priority: Priority,
}

/// A slice request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RequestView {
    /// Id (UUIDv7).
    pub id: String,
    /// Tenant id.
    pub tenant: String,
    /// What one slice is.
    pub spec: SliceSpec,
    /// How many slices.
    pub count: u32,
    /// Where it is in its life.
    pub state: RequestState,
    /// Why it was asked for, or why it was rejected.
    pub reason: String,
    /// Version; also the `ETag`.
    pub version: i64,
    /// UTC milliseconds.
    pub created_at_ms: i64,
    /// UTC milliseconds.
    pub updated_at_ms: i64,
    /// How long the slices are wanted once active, in seconds.
    pub duration_s: Option<u64>,
    /// When it expires (set once active with a duration), UTC milliseconds.
    pub expires_at_ms: Option<i64>,
    /// Its priority within the tenant.
    #[serde(default)]
    pub priority: Priority,
    /// It holds more than the tenant's guarantee, borrowed from what other tenants of its cohort do not use.
    #[serde(default)]
    pub borrowed: bool,
    /// When a lender takes it back: the request is released (or cancelled, if not yet running) at this time, UTC
    /// milliseconds. `None` while nobody needs it back.
    #[serde(default)]
    pub reclaim_at_ms: Option<i64>,
    /// The tenant (name) it is reclaimed for, when known.
    #[serde(default)]
    pub reclaim_for: Option<String>,
    /// Why it waits (pending, approved and provisioning requests), as of this answer: in `GET /requests/{id}` and
    /// `GET /tenants/{id}/waiting`; absent from lists.
    #[serde(default)]
    pub waiting: Option<Waiting>,
}

/// Why a request waits, where it stands and when it could start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Waiting {
    /// The request's id.
    pub request: String,
    /// The reason, with its details (`code` is one of `awaiting_approval`, `queued`, `quota_exceeded`,
    /// `no_capacity`, `waiting_for_reclaim`, `layout_awaiting_approval`, `gpu_cordoned`, `node_not_ready`,
    /// `being_applied`, `reserved`, `reservation_not_started`).
    pub reason: WaitReason,
    /// The reason as a sentence.
    pub sentence: String,
    /// Pending requests only: 1 + the pending requests made before it that compete for the same slices (the same
    /// MIG profile on a model both may use, or whole GPUs of the same model). `null` in the answer to creation,
    /// which does not read the queue: `GET` the request for it.
    pub queue_position: Option<u32>,
    /// Pending requests only: the earliest time it could start, UTC milliseconds: now when there is room, else the
    /// first known end of a slice (an expiry or a reclaim deadline) after which the planner finds room; `null` when
    /// nothing known frees enough.
    pub earliest_start_ms: Option<i64>,
}

/// A page of requests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RequestPage {
    /// Requests, in the order asked for (oldest first by default).
    pub items: Vec<RequestView>,
    /// Pass as `cursor` for the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// List filters.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct ListQuery {
    /// Tenant id (required for users who are not platform admins and belong to several tenants).
    pub tenant: Option<String>,
    /// Only requests in this state.
    pub state: Option<RequestState>,
    /// From the previous page's `next_cursor`.
    pub cursor: Option<String>,
    /// Page size, 1-500 (default 100).
    #[cfg_attr(feature = "openapi", param(minimum = 1, maximum = 500))]
    pub limit: Option<u32>,
    /// `true`: only requests still live (pending, approved, provisioning, active); `false`: only ended ones.
    pub open: Option<bool>,
    /// `oldest` first (the default) or `newest` first; the cursor continues in the same order.
    pub order: Option<ListOrder>,
}

/// The order of a list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ListOrder {
    /// Oldest first.
    #[default]
    Oldest,
    /// Newest first.
    Newest,
}

/// A rejection.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RejectBody {
    /// Why (required; shown to the tenant).
    #[cfg_attr(feature = "openapi", schema(max_length = 2000))]
    pub reason: String,
}

/// Why an active request is released (optional for the tenant's members; required of a platform admin
/// reclaiming another tenant's request).
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ReleaseBody {
    /// Why; when given it replaces the request's `reason` (shown to the tenant).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(max_length = 2000))]
    pub reason: Option<String>,
}

/// What an approval did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ApprovalView {
    /// The request, now approved.
    pub request: RequestView,
    /// The exact instances reserved for its slices.
    pub reservations: Vec<ReservedInstance>,
    /// Layout changes it needs: `proposed` (waiting for an admin) or `approved` (GPUs with auto-layout).
    pub layout_proposals: Vec<super::layouts::LayoutView>,
}

/// An instance reserved for one slice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReservedInstance {
    /// GPU id.
    pub gpu: String,
    /// Profile name.
    pub profile: String,
    /// Start unit.
    pub start: u8,
    /// Whether the instance is created by a layout change (else it exists and was free).
    pub new: bool,
}

/// What creating a request would do now, without writing anything (`POST /api/v1/requests/preview`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RequestPreview {
    /// The tenant's id.
    pub tenant: String,
    /// What would happen.
    pub outcome: PreviewOutcome,
    /// The problem creation would answer with (quota, budget), when it would be refused.
    pub refused: Option<crate::Problem>,
    /// Per resource it charges: what it takes, what the tenant holds, its limit and maximum, what it would hold.
    pub quota: Vec<PreviewLine>,
    /// It would hold more than the tenant's guarantee, borrowed from its cohort.
    pub borrowed: bool,
    /// It would take back capacity lent out: borrowed requests of the cohort would be reclaimed.
    pub reclaims: bool,
    /// The tenant's policy approves it on its own.
    pub auto_approve: bool,
    /// Where the planner would place it now (empty when it cannot).
    pub slices: Vec<PreviewSlice>,
    /// Why it would wait, when it would be pending.
    pub waiting: Option<WaitReason>,
    /// That reason as a sentence.
    pub sentence: Option<String>,
    /// When it could start, when it would be pending (see `Waiting`).
    pub earliest_start_ms: Option<i64>,
}

/// What creating a request would do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum PreviewOutcome {
    /// Approved at once and placed on existing instances or on layout changes that apply at once.
    ApprovedNow,
    /// Approved at once; a layout change it needs waits for a platform admin.
    ApprovedWaitingForLayout,
    /// Created pending (see `waiting`).
    Pending,
    /// Refused (see `refused`).
    Refused,
}

/// One resource a previewed request charges.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PreviewLine {
    /// Resource key.
    pub resource: String,
    /// What the request charges.
    pub charge: f64,
    /// What the tenant holds now.
    pub held: f64,
    /// The limit (guarantee), if any.
    pub limit: Option<f64>,
    /// In a cohort, the most it may hold by borrowing.
    pub maximum: Option<f64>,
    /// What it would hold with the request.
    pub after: f64,
}

/// Where one slice of a previewed request would go.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PreviewSlice {
    /// Node name.
    pub node: String,
    /// GPU id.
    pub gpu: String,
    /// GPU index on the node.
    pub gpu_index: u32,
    /// Catalog model key.
    pub model: String,
    /// MIG profile, or the sharing key of a whole-GPU share.
    pub profile: String,
    /// Start unit, or share index.
    pub start: u8,
    /// The instance is created by a layout change.
    pub new_instance: bool,
    /// That layout change waits for a platform admin (the GPU has no auto-layout).
    pub layout_change_needs_admin: bool,
}
