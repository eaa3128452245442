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
    /// Of those, the ones whose utilisation is known (allocations with telemetry over their use in the look-back).
    pub measured_slice_hours: f64,
    /// Measured slice-hours weighted by the mean utilisation of their device over the allocation's own use in the
    /// look-back: what was used.
    pub used_slice_hours: f64,
    /// `used / measured` (`null` when nothing was measured).
    pub efficiency: Option<f64>,
    /// Active allocations idle over the whole look-back (ids).
    pub idle_allocations: Vec<String>,
    /// GPU-hours held (compute-slice-hours over the model's compute slices: a 3g of 7 held an hour is 3/7).
    pub held_gpu_hours: f64,
    /// Measured GPU-hours weighted by how much of their device went unused (`1 - utilisation`): what was wasted.
    pub wasted_gpu_hours: f64,
    /// What was held cost, at the models' prices per GPU-hour (`null` when none of its models has a price).
    pub held_cost: Option<f64>,
    /// What was wasted cost, at the models' prices (`null` when none of its models has a price).
    pub waste_cost: Option<f64>,
    /// GPU-hours of models without a price, left out of both costs.
    pub unpriced_gpu_hours: f64,
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
    /// The prices' currency (`null` when no price is set, and then every cost is `null`).
    pub currency: Option<String>,
    /// The cost of waste of all tenants (`null` when no price is set).
    pub waste_cost: Option<f64>,
    /// GPU-hours of models without a price, left out of every cost.
    pub unpriced_gpu_hours: f64,
}

/// The price of one GPU model per GPU-hour.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelPrice {
    /// Catalog model key (a name the catalog knows is accepted and stored as its key).
    pub model: String,
    /// Price of one whole GPU for an hour, in the list's currency (0 to 1,000,000; a MIG slice or a share costs
    /// its weight's part of it).
    pub per_gpu_hour: f64,
}

/// The price list: what a GPU-hour of each model costs, in one currency.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Prices {
    /// ISO 4217 code, e.g. `EUR` (`null` before a price is set).
    pub currency: Option<String>,
    /// One price per priced model, by model key.
    pub models: Vec<ModelPrice>,
    /// When the list was last set, UTC ms.
    pub updated_at_ms: Option<i64>,
    /// Who set it.
    pub updated_by: Option<String>,
}

/// A new price list, replacing the whole old one (an empty `models` removes every price).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PricesBody {
    /// ISO 4217 code: three capital letters, e.g. `EUR`.
    pub currency: String,
    /// At most one price per model of the catalog.
    pub models: Vec<ModelPrice>,
}

/// Which days of the efficiency history.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct HistoryQuery {
    /// The last `days` UTC days, today included (1-90, default 90).
    #[cfg_attr(feature = "openapi", param(minimum = 1, maximum = 90))]
    pub days: Option<u32>,
    /// One GPU model (key or name); the whole fleet when absent.
    pub model: Option<String>,
}

/// One UTC day of fleet efficiency.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EfficiencyDay {
    /// The day, `YYYY-MM-DD` (UTC).
    pub day: String,
    /// Its start, UTC ms.
    pub day_ms: i64,
    /// Capacity samples taken that day (one per sampling interval while a server ran).
    pub samples: u32,
    /// MIG GPUs, mean over the day's samples.
    pub gpus: f64,
    /// Compute slices allocated, mean over the day's samples.
    pub allocated: f64,
    /// Compute slices free and placeable, mean.
    pub placeable: f64,
    /// Compute slices free and stranded, mean.
    pub stranded: f64,
    /// Compute slices free on cordoned GPUs, mean.
    pub cordoned: f64,
    /// Compute-slice-hours held that day.
    pub held_slice_hours: f64,
    /// Of those, the ones whose utilisation was known.
    pub measured_slice_hours: f64,
    /// Measured slice-hours weighted by their device's mean utilisation.
    pub used_slice_hours: f64,
    /// `used / measured` (`null` when nothing was measured).
    pub efficiency: Option<f64>,
    /// GPU-hours held.
    pub held_gpu_hours: f64,
    /// GPU-hours measured and unused.
    pub wasted_gpu_hours: f64,
    /// What the held GPU-hours cost at today's prices (`null` when none of the day's models has a price).
    pub held_cost: Option<f64>,
    /// What the wasted GPU-hours cost at today's prices (`null` when none of the day's models has a price).
    pub waste_cost: Option<f64>,
    /// GPU-hours held of models without a price, left out of both costs.
    pub unpriced_gpu_hours: f64,
}

/// Fleet efficiency per UTC day, oldest first; days with nothing recorded are left out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EfficiencyHistory {
    /// The first day asked for, UTC ms.
    pub from_ms: i64,
    /// The model asked for (`null`: the whole fleet).
    pub model: Option<String>,
    /// The prices' currency (`null` when no price is set).
    pub currency: Option<String>,
    /// Minutes between capacity samples.
    pub sample_minutes: u32,
    /// The days.
    pub days: Vec<EfficiencyDay>,
}
