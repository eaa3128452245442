//! Reservations: slices booked for a window ahead, their decisions, previews and the policy that bounds them.

use serde::{Deserialize, Serialize};
use tessera_core::request::SliceSpec;
pub use tessera_core::reservation::{ReservationPolicy, ReservationState};

/// A reservation to book (`POST /api/v1/tenants/{id}/reservations`, and its preview).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NewReservationBody {
    /// What one slice is.
    pub spec: SliceSpec,
    /// How many slices (1-1000).
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1000))]
    pub count: u32,
    /// Window start, UTC milliseconds (from now on, within the policy's `max_ahead_s`).
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 253_402_300_799_999_i64))]
    pub start_ms: i64,
    /// Window end, UTC milliseconds (after the start, within the policy's `max_duration_s`).
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 253_402_300_799_999_i64))]
    pub end_ms: i64,
    /// Why (shown to approvers).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(max_length = 2000))]
    pub reason: String,
}

/// A reservation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReservationView {
    /// Id (UUIDv7).
    pub id: String,
    /// Tenant id.
    pub tenant: String,
    /// What one slice is.
    pub spec: SliceSpec,
    /// How many slices.
    pub count: u32,
    /// Window start, UTC milliseconds.
    pub start_ms: i64,
    /// Window end, UTC milliseconds.
    pub end_ms: i64,
    /// Where it is in its life.
    pub state: ReservationState,
    /// Why it was booked.
    pub reason: String,
    /// Why it was rejected, or why it failed.
    pub decision: String,
    /// The request made for it at its lead time (10 minutes before its start): its slices, and their state.
    pub request: Option<String>,
    /// Who booked it.
    pub created_by: String,
    /// Who accepted or rejected it (`system:auto-approve` for the tenant's policy).
    pub decided_by: Option<String>,
    /// Version; also the `ETag`.
    pub version: i64,
    /// UTC milliseconds.
    pub created_at_ms: i64,
    /// UTC milliseconds.
    pub updated_at_ms: i64,
    /// Its window ends within the hour: its holders should save their work (the slices are released at `end_ms`).
    pub ending_soon: bool,
}

/// A page of reservations, by start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReservationPage {
    /// Reservations, by start.
    pub items: Vec<ReservationView>,
}

/// Which reservations to list.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct ReservationQuery {
    /// Only this tenant's (id or name); platform admins see every tenant's without it.
    pub tenant: Option<String>,
    /// Only in this state.
    pub state: Option<ReservationState>,
    /// Only windows ending after this time, UTC milliseconds (default: 7 days ago).
    #[cfg_attr(feature = "openapi", param(minimum = 0, maximum = 253_402_300_799_999_i64))]
    pub from_ms: Option<i64>,
    /// Only windows starting before this time, UTC milliseconds (default: no bound).
    #[cfg_attr(feature = "openapi", param(minimum = 0, maximum = 253_402_300_799_999_i64))]
    pub to_ms: Option<i64>,
    /// At most this many: 1-1000 (default 500).
    #[cfg_attr(feature = "openapi", param(minimum = 1, maximum = 1000))]
    pub limit: Option<u32>,
}

/// What booking would do, without writing anything.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReservationPreview {
    /// It would be booked: accepted at once (`auto_approve`) or pending for a platform admin.
    pub fits: bool,
    /// The tenant's policy accepts it on its own.
    pub auto_approve: bool,
    /// The problem booking would answer with (policy, quota, no room), when it would be refused.
    pub refused: Option<crate::Problem>,
    /// How many slices of this spec the fleet could hold for the whole window, with every accepted reservation and
    /// every allocation whose end is known, counted up to `free_in_window_limit`: equal to it means that many or
    /// more.
    pub free_in_window: u32,
    /// What `free_in_window` is counted up to: 64, or the asked count when larger (0 from servers that counted
    /// up to 1000 and did not say).
    #[serde(default)]
    pub free_in_window_limit: u32,
    /// The policy that applies to the tenant.
    pub policy: ReservationPolicy,
}

/// A reservation policy, and where it comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReservationPolicyView {
    /// The limits in force.
    pub policy: ReservationPolicy,
    /// `tenant` (set for this tenant), `global` (set for every tenant) or `default` (nothing set).
    pub source: String,
}

/// Which part of the calendar to read.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct CalendarQuery {
    /// From, UTC milliseconds (default: now).
    #[cfg_attr(feature = "openapi", param(minimum = 0, maximum = 253_402_300_799_999_i64))]
    pub from_ms: Option<i64>,
    /// To, UTC milliseconds (default: 7 days after `from_ms`; at most 31 days after it).
    #[cfg_attr(feature = "openapi", param(minimum = 0, maximum = 253_402_300_799_999_i64))]
    pub to_ms: Option<i64>,
    /// Only GPUs of this model (key or product name).
    pub model: Option<String>,
}

/// The fleet's calendar: per GPU, what is held and booked over a time range.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CalendarView {
    /// From, UTC milliseconds.
    pub from_ms: i64,
    /// To, UTC milliseconds.
    pub to_ms: i64,
    /// One row per GPU, by node then index.
    pub gpus: Vec<CalendarGpu>,
}

/// One GPU's row of the calendar.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CalendarGpu {
    /// GPU id.
    pub gpu: String,
    /// Node name.
    pub node: String,
    /// Index on the node.
    pub index: u32,
    /// Catalog model key.
    pub model: String,
    /// In MIG mode.
    pub mig: bool,
    /// Cordoned: nothing new goes there.
    pub cordoned: bool,
    /// What is held or booked on it within the range, by start.
    pub blocks: Vec<CalendarBlock>,
}

/// A slice held or booked on a GPU for a time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CalendarBlock {
    /// `allocation` (held now) or `reservation` (booked: where the planner would place it at its start).
    pub kind: BlockKind,
    /// From, UTC milliseconds (now for what is held now).
    pub start_ms: i64,
    /// Until, UTC milliseconds; `null`: no known end.
    pub end_ms: Option<i64>,
    /// MIG profile, or the sharing of a whole GPU (`exclusive`, `timeslice:4`, ...).
    pub profile: String,
    /// Start unit, or share index.
    pub slot: u8,
    /// The tenant's id, when the caller may see that tenant.
    pub tenant: Option<String>,
    /// The request or reservation it belongs to, when the caller may see its tenant.
    pub owner: Option<String>,
}

/// What a calendar block is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum BlockKind {
    /// A live allocation.
    Allocation,
    /// An accepted reservation's slice, where the planner would place it at its start.
    Reservation,
}
