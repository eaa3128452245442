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
