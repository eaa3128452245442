//! The GPU catalog over HTTP: models, profiles, placements and how sure the data is.

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use serde::Serialize;
use utoipa::ToSchema;

use super::error::{ApiError, ApiJson};
use crate::app::AppState;
use crate::store::Principal;

/// A GPU model and its MIG profiles.
#[derive(Debug, Serialize, ToSchema)]
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
#[derive(Debug, Serialize, ToSchema)]
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

fn view(m: &tessera_core::GpuModel) -> ModelView {
    ModelView {
        key: m.key.clone(),
        architecture: m.architecture.clone(),
        products: m.products.clone(),
        pci_device_ids: m.pci_device_ids.clone(),
        compute_slices_total: m.compute_slices_total,
        memory_slices_total: m.memory_slices_total,
        placement_units_total: m.placement_units_total,
        total_memory_gb_nominal: m.total_memory_gb_nominal,
        confidence: m.confidence.clone(),
        profiles: m
            .profiles
            .iter()
            .map(|p| ProfileView {
                name: p.name.clone(),
                variant: p.variant.clone(),
                compute_slices: p.compute_slices,
                memory_slices: p.memory_slices,
                max_instances: p.max_instances,
                placements: p.placements.iter().map(|&pl| pl.into()).collect(),
                memory_mib: p.memory_mib,
                smi_profile_id: p.smi_profile_id,
                k8s_resource: p.k8s_resource_name(),
                confidence: p.confidence.clone(),
            })
            .collect(),
    }
}

/// Every GPU model in the catalog.
#[utoipa::path(get, path = "/api/v1/catalog/models", tag = "catalog", security(("token" = ["user"]), ("session" = ["user"])),
    responses((status = 200, body = Vec<ModelView>), (status = 401, body = super::error::Problem)))]
pub async fn list_models(State(state): State<AppState>, _p: Principal) -> ApiJson<Vec<ModelView>> {
    ApiJson(state.catalog.models.iter().map(view).collect())
}

/// One GPU model, by key, product name or PCI device id.
#[utoipa::path(get, path = "/api/v1/catalog/models/{model}", tag = "catalog", security(("token" = ["user"]), ("session" = ["user"])),
    params(("model" = String, Path, description = "key, product name or PCI device id")),
    responses((status = 200, body = ModelView), (status = 404, body = super::error::Problem)))]
pub async fn get_model(
    State(state): State<AppState>,
    _p: Principal,
    Path(model): Path<String>,
) -> Result<ApiJson<ModelView>, ApiError> {
    let (m, _) =
        state.catalog.resolve(&model).ok_or_else(|| ApiError::NotFound(format!("GPU model {model} not found")))?;
    Ok(ApiJson(view(m)))
}

/// A layout to check.
#[derive(Debug, serde::Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LayoutCheck {
    /// Instances; those without a start get the best placement that exists.
    pub instances: Vec<tessera_core::layout::InstanceSpec>,
}

/// The verdict on a layout.
#[derive(Debug, Serialize, ToSchema)]
pub struct LayoutVerdict {
    /// Whether the driver would accept it.
    pub valid: bool,
    /// The layout with every instance placed (empty when invalid).
    pub instances: Vec<tessera_core::layout::PlacedInstance>,
    /// Every problem, with a stable code.
    pub errors: Vec<super::error::ProblemItem>,
}

/// Check a MIG layout for a model, with the same rules the planner and the node agent use.
#[utoipa::path(post, path = "/api/v1/catalog/models/{model}/validate", tag = "catalog", security(("token" = ["user"]), ("session" = ["user"])),
    params(("model" = String, Path)), request_body = LayoutCheck,
    responses((status = 200, body = LayoutVerdict), (status = 404, body = super::error::Problem),
        (status = 422, body = super::error::Problem)))]
pub async fn validate_layout(
    State(state): State<AppState>,
    _p: Principal,
    Path(model): Path<String>,
    ApiJson(body): ApiJson<LayoutCheck>,
) -> Result<ApiJson<LayoutVerdict>, ApiError> {
    let (m, _) =
        state.catalog.resolve(&model).ok_or_else(|| ApiError::NotFound(format!("GPU model {model} not found")))?;
    if body.instances.len() > 64 {
        return Err(ApiError::invalid("too_many_instances", "a layout has at most 64 instances"));
    }
    Ok(ApiJson(match tessera_core::layout::validate(m, &body.instances) {
        Ok(instances) => LayoutVerdict { valid: true, instances, errors: vec![] },
        Err(errors) => LayoutVerdict {
            valid: false,
            instances: vec![],
            errors: errors
                .iter()
                .map(|e| super::error::ProblemItem { code: e.code().to_string(), message: e.to_string() })
                .collect(),
        },
    }))
}
