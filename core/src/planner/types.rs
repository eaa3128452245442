//! Planner input and output in wire form (the `tessera mig plan` JSON and, later, the REST API's).

use serde::{Deserialize, Serialize};

use crate::layout::{LayoutError, PlacedInstance};

/// What to plan: the fleet as it is and the slices wanted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanInput {
    /// GPUs in MIG mode, with their current layouts.
    pub gpus: Vec<GpuInput>,
    /// Slices wanted.
    pub demand: Vec<DemandInput>,
}

/// One GPU as it is now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuInput {
    /// Unique id (UUID or `node/index`).
    pub id: String,
    /// Catalog model key, product name or PCI device id.
    pub model: String,
    /// Current MIG instances.
    #[serde(default)]
    pub instances: Vec<InstanceInput>,
    /// A cordoned GPU gets nothing new.
    #[serde(default)]
    pub cordoned: bool,
    /// A layout change for it waits for approval: it gets nothing new until that is decided (counted apart from
    /// cordoned GPUs in the reasons a demand goes unplaced).
    #[serde(default)]
    pub layout_pending: bool,
}

/// An existing MIG instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceInput {
    /// Profile name.
    pub profile: String,
    /// Start unit.
    pub start: u8,
    /// Whether an active allocation holds it (then it is never destroyed nor handed out again).
    #[serde(default)]
    pub in_use: bool,
}

/// Wanted: `count` instances of `profile`, optionally only on GPUs of `model`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DemandInput {
    /// Profile name, e.g. `1g.10gb`; without `model`, any model with a profile of that name qualifies.
    pub profile: String,
    /// How many.
    pub count: u32,
    /// Only GPUs of this model (key, product name or PCI id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// The planner's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Plan {
    /// Every placed slice: bound to an existing free instance (`new: false`) or to an instance to create.
    pub placed: Vec<PlacedSlice>,
    /// Demand that could not be placed, per demand entry, with the reason.
    pub unplaced: Vec<Unplaced>,
    /// GPUs whose layout changes, with the full new layout.
    pub changed_gpus: Vec<ChangedGpu>,
    /// Existing free instances the plan destroys (never one in use).
    pub destroyed: Vec<GpuInstance>,
    /// Totals.
    pub summary: PlanSummary,
}

/// One demanded slice and where it goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PlacedSlice {
    /// Index of the demand entry it serves.
    pub demand: usize,
    /// GPU id.
    pub gpu: String,
    /// Profile name.
    pub profile: String,
    /// Start unit.
    pub start: u8,
    /// True when the instance is to be created; false when it exists and is free.
    pub new: bool,
}

/// Demand the plan leaves unplaced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Unplaced {
    /// Index of the demand entry.
    pub demand: usize,
    /// Profile name.
    pub profile: String,
    /// Model constraint, as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// How many slices of the entry are left.
    pub count: u32,
    /// Stable reason code: `no_matching_gpu`, `all_matching_gpus_cordoned` or `insufficient_capacity`.
    pub code: String,
    /// Why, for people.
    pub reason: String,
}

/// A GPU whose layout the plan changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ChangedGpu {
    /// GPU id.
    pub gpu: String,
    /// Catalog model key.
    pub model: String,
    /// The complete new layout, by start.
    pub layout: Vec<PlacedInstance>,
    /// Instances to create.
    pub created: Vec<PlacedInstance>,
    /// Instances to destroy.
    pub destroyed: Vec<PlacedInstance>,
}

/// An instance on a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuInstance {
    /// GPU id.
    pub gpu: String,
    /// Profile name.
    pub profile: String,
    /// Start unit.
    pub start: u8,
}

/// Plan totals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PlanSummary {
    /// Slices demanded.
    pub demanded: u32,
    /// Slices placed.
    pub placed: u32,
    /// GPUs whose layout changes.
    pub gpus_touched: u32,
    /// Existing free instances destroyed.
    pub destroyed: u32,
    /// Free compute slices, over all schedulable GPUs after the plan, that the largest profile still creatable on
    /// their GPU cannot use (0 = every GPU's free space is one usable block).
    pub stranded_compute_slices: u32,
}

/// Input the planner cannot work with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// Two GPUs share an id.
    #[error("gpu `{id}` is listed twice")]
    DuplicateGpu {
        /// The id.
        id: String,
    },
    /// A model string matches nothing in the catalog.
    #[error("{context}: unknown GPU model `{model}`; known models are {known}")]
    UnknownModel {
        /// Where it was found (`gpu X` or `demand N`).
        context: String,
        /// The string given.
        model: String,
        /// Catalog keys.
        known: String,
    },
    /// A profile name matches nothing (for the model, or in the whole catalog).
    #[error("{context}: unknown MIG profile `{profile}`{}", model.as_ref().map(|m| format!(" on {m}")).unwrap_or_default())]
    UnknownProfile {
        /// Where it was found.
        context: String,
        /// The profile given.
        profile: String,
        /// The model it was looked up on, if any.
        model: Option<String>,
    },
    /// A GPU's current layout is not valid.
    #[error("gpu `{gpu}`: current layout is invalid: {}", errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    InvalidLayout {
        /// GPU id.
        gpu: String,
        /// Every problem.
        errors: Vec<LayoutError>,
    },
    /// All demand entries together ask for more than the planner accepts in one call.
    #[error("demand asks for {total} slices in total; one plan takes at most {max}")]
    TooMuchDemand {
        /// The total asked for.
        total: u64,
        /// The limit.
        max: u64,
    },
    /// A demand entry with a count of 0 or beyond the limit.
    #[error("demand {index}: count must be between 1 and {max}, got {count}")]
    BadCount {
        /// Demand index.
        index: usize,
        /// The count given.
        count: u32,
        /// The limit.
        max: u32,
    },
}

impl PlanError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            PlanError::DuplicateGpu { .. } => "plan_duplicate_gpu",
            PlanError::UnknownModel { .. } => "unknown_gpu_model",
            PlanError::UnknownProfile { .. } => "mig_unknown_profile",
            PlanError::InvalidLayout { .. } => "mig_layout_invalid",
            PlanError::BadCount { .. } => "plan_bad_count",
            PlanError::TooMuchDemand { .. } => "plan_too_much_demand",
        }
    }
}
