//! The GPU catalog: models, MIG profiles, and checking a layout.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A GPU model and its MIG profiles.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelView {
    /// Catalog key, e.g. `H100-80GB`.
    pub key: String,
    /// Architecture and die.
    pub architecture: String,
    /// Product names.
    pub products: Vec<String>,
    /// PCI device ids as NVML reports them.
    pub pci_device_ids: Vec<String>,
    /// Compute slices of the whole GPU.
    pub compute_slices_total: u8,
    /// Memory slices of the whole GPU.
    pub memory_slices_total: u8,
    /// Placement units (what placements count in).
    pub placement_units_total: u8,
    /// Nominal memory in GB.
    pub total_memory_gb_nominal: u32,
    /// How sure the model's data is.
    pub confidence: String,
    /// GPU instance profiles.
    pub profiles: Vec<ProfileView>,
}

/// A MIG profile of a model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProfileView {
    /// Name, e.g. `3g.40gb`.
    pub name: String,
    /// `base`, `+me`, `+me.all`, `-me` or `+gfx`.
    pub variant: String,
    /// Compute slices.
    pub compute_slices: u8,
    /// Memory slices.
    pub memory_slices: u8,
    /// Most instances per GPU.
    pub max_instances: u8,
    /// Allowed placements as `[start, size]` in placement units.
    pub placements: Vec<[u8; 2]>,
    /// Memory in MiB, when known.
    pub memory_mib: Option<u32>,
    /// Profile id for `nvidia-smi mig -cgi`.
    pub smi_profile_id: u32,
    /// Kubernetes resource name (mixed strategy).
    pub k8s_resource: String,
    /// Which values are exact and which derived.
    pub confidence: BTreeMap<String, String>,
}

/// A layout to check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LayoutCheck {
    /// Instances; those without a start get the best placement that exists.
    pub instances: Vec<tessera_core::layout::InstanceSpec>,
}

/// The verdict on a layout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LayoutVerdict {
    /// Whether the driver would accept it.
    pub valid: bool,
    /// The layout with every instance placed (empty when invalid).
    pub instances: Vec<tessera_core::layout::PlacedInstance>,
    /// Every problem, with a stable code.
    pub errors: Vec<crate::problem::ProblemItem>,
}
