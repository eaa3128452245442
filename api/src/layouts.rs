//! Layout proposals and their decisions, hand edits and auto-layout.

use serde::{Deserialize, Serialize};
use tessera_core::layout::PlacedInstance;

/// A layout proposal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LayoutView {
    /// Id.
    pub id: String,
    /// GPU id.
    pub gpu: String,
    /// The GPU layout version it applies to.
    pub base_version: i64,
    /// The complete new layout.
    pub layout: Vec<PlacedInstance>,
    /// Instances it creates.
    pub created: Vec<PlacedInstance>,
    /// Instances it destroys (never one in use).
    pub destroyed: Vec<PlacedInstance>,
    /// `proposed`, `approved` or `rejected`.
    pub state: String,
    /// Why it was rejected.
    pub reason: String,
    /// Who caused it.
    pub created_by: String,
    /// Who decided it (`auto-layout` when applied automatically).
    pub decided_by: Option<String>,
    /// UTC milliseconds.
    pub created_at_ms: i64,
    /// When it was decided, UTC milliseconds.
    pub decided_at_ms: Option<i64>,
    /// While it is proposed: the requests whose slices wait for it (what approving it unblocks).
    #[serde(default)]
    pub needed_by: Vec<LayoutNeed>,
}

/// A request whose slices wait for a layout change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LayoutNeed {
    /// The request's id.
    pub request: String,
    /// Its tenant's id.
    pub tenant: String,
    /// Its tenant's name.
    pub tenant_name: String,
    /// What one of its slices is.
    pub spec: tessera_core::request::SliceSpec,
    /// How many slices it asked for.
    pub count: u32,
    /// How many of them this change creates.
    pub slices: u32,
}

/// Filter.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct LayoutQuery {
    /// `proposed`, `approved` or `rejected`.
    pub state: Option<String>,
}

/// A rejection.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RejectLayout {
    /// Why (required).
    #[cfg_attr(feature = "openapi", schema(max_length = 2000))]
    pub reason: String,
}

/// Turning auto-layout on or off.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AutoLayout {
    /// Apply layout changes for this GPU without an admin's approval.
    pub enabled: bool,
}

/// A hand-edited layout.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LayoutEdit {
    /// The complete new layout; instances without a start are placed.
    pub instances: Vec<tessera_core::layout::InstanceSpec>,
}

/// Which GPUs to lay out again, and for which profile (`GET` and `POST /api/v1/defragmentation`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams, utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
#[serde(deny_unknown_fields)]
pub struct DefragQuery {
    /// The profile to make room for, by name (e.g. `3g.40gb`; at most 64 characters). Default: on each model, the
    /// largest profile the live requests ask for; a model nobody asks for is left alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// Only GPUs of this model (catalog key, product name or PCI id; at most 64 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// At most this many GPUs, those that gain most first (1-1000, default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_gpus: Option<u32>,
}

/// What a layout has ready for the profiles people ask for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DefragFigures {
    /// Free instances of the target profile: requests for it are placed on them at once, without a layout change.
    pub target_instances: u32,
    /// Compute slices in free instances of the demanded profiles.
    pub ready_slices: u32,
    /// Free compute slices in no such instance: a request gets them only after a layout change.
    pub not_ready_slices: u32,
}

/// A new layout for one GPU: its free instances and free units laid out again, every instance held kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DefragGpu {
    /// GPU id.
    pub gpu: String,
    /// Its node's name.
    pub node: String,
    /// Catalog model key.
    pub model: String,
    /// The profile it makes room for.
    pub target: String,
    /// The GPU layout version it was planned on.
    pub base_version: i64,
    /// The complete new layout.
    pub layout: Vec<PlacedInstance>,
    /// Instances it creates.
    pub created: Vec<PlacedInstance>,
    /// Free instances it destroys (never one held).
    pub destroyed: Vec<PlacedInstance>,
    /// The GPU as it is.
    pub before: DefragFigures,
    /// The GPU laid out again.
    pub after: DefragFigures,
    /// The layout proposal made for it (`POST` only; approve it like any other).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proposal_id: Option<String>,
}

/// A GPU left out, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DefragSkipped {
    /// GPU id.
    pub gpu: String,
    /// `cordoned`, `node_not_ready`, `auto_layout` (its layout changes when a request needs it),
    /// `layout_proposal_open`, `layout_unreadable` (an instance or a holder of a profile its model does not have),
    /// `layout_stale` (it changed while proposing), `gpu_gone` (removed while proposing) or `over_max_gpus`.
    pub code: String,
}

/// Defragmentation: per GPU that gains, the new layout with before and after figures; the fleet's figures over the
/// GPUs considered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DefragReport {
    /// GPUs whose layout gains, those that gain most first.
    pub gpus: Vec<DefragGpu>,
    /// The GPUs considered (MIG mode, a model with a target) as they are; `target_instances` adds up each model's
    /// own target profile.
    pub before: DefragFigures,
    /// The same GPUs with the listed layouts.
    pub after: DefragFigures,
    /// Free compute slices that no demanded instance can take beside the instances held: the floor of
    /// `not_ready_slices`, which only moving a holder lowers.
    pub stranded_slices: u32,
    /// GPUs that would gain but were left out.
    pub skipped: Vec<DefragSkipped>,
}
