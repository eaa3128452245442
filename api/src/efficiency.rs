//! Fleet efficiency: MIG capacity by what it can do (allocated, placeable, stranded), and how much of what each
//! tenant holds it uses.

use serde::{Deserialize, Serialize};

/// Over which look-back, and what counts as idle.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct EfficiencyQuery {
    /// The look-back, hours before now (0.005-720, default 24): slice-hours held and used are counted over it.
    pub hours: Option<f64>,
    /// An allocation active for the whole look-back whose device was used less than this on average (%, 0-100,
    /// default 20) is idle.
    pub idle_below: Option<f64>,
}

/// MIG compute slices of one model (or of the whole fleet, `model` = `total`) by what they can do now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelCapacity {
    /// Catalog model key, or `total`.
    pub model: String,
    /// GPUs in MIG mode.
    pub gpus: u32,
    /// Held by instances in use (or reserved for an approved request).
    pub allocated: u32,
    /// Free, and usable by instances of the profiles the live requests ask for (all the model's profiles when
    /// nobody asks for one), given legal placements, the profiles' maxima and the engines.
    pub placeable: u32,
    /// Free, and usable by none of them: capacity that exists and that nobody can be given without moving someone.
    pub stranded: u32,
    /// Free on cordoned GPUs.
    pub cordoned: u32,
}

/// What one tenant held and used over the look-back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TenantEfficiency {
    /// Tenant id.
    pub tenant_id: String,
    /// Tenant name.
    pub tenant: String,
    /// Compute-slice-hours held (a 3g instance held for an hour is 3).
    pub held_slice_hours: f64,
    /// Of those, the ones whose utilisation is known (allocations still active with telemetry over the look-back).
    pub measured_slice_hours: f64,
    /// Measured slice-hours weighted by their device's mean utilisation: what was used.
    pub used_slice_hours: f64,
    /// `used / measured` (`null` when nothing was measured).
    pub efficiency: Option<f64>,
    /// Active allocations idle over the whole look-back (ids).
    pub idle_allocations: Vec<String>,
}

/// The fleet's efficiency now and over the look-back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EfficiencyReport {
    /// Look-back start, UTC ms.
    pub from_ms: i64,
    /// Now, UTC ms.
    pub to_ms: i64,
    /// The idle threshold used, %.
    pub idle_below: f64,
    /// MIG capacity per model, by model key.
    pub models: Vec<ModelCapacity>,
    /// MIG capacity of the whole fleet.
    pub total: ModelCapacity,
    /// Per tenant that held anything in the look-back, by name.
    pub tenants: Vec<TenantEfficiency>,
}
