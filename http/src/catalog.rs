//! The GPU catalog over HTTP: models, profiles, placements and how sure the data is.

use crate::auth::Caller;
use axum::extract::State;

use super::error::{ApiError, ApiJson, ApiPath};
pub use tessera_api::catalog::{LayoutCheck, LayoutVerdict, ModelView, ProfileView};
use tessera_services::app::AppState;

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
pub async fn list_models(State(state): State<AppState>, Caller(_p): Caller) -> ApiJson<Vec<ModelView>> {
    ApiJson(state.catalog.models.iter().map(view).collect())
}

/// One GPU model, by key, product name or PCI device id.
#[utoipa::path(get, path = "/api/v1/catalog/models/{model}", tag = "catalog", security(("token" = ["user"]), ("session" = ["user"])),
    params(("model" = String, Path, description = "key, product name or PCI device id")),
    responses((status = 200, body = ModelView), (status = 404, body = super::error::Problem)))]
pub async fn get_model(
    State(state): State<AppState>,
    Caller(_p): Caller,
    ApiPath(model): ApiPath<String>,
) -> Result<ApiJson<ModelView>, ApiError> {
    let (m, _) =
        state.catalog.resolve(&model).ok_or_else(|| ApiError::NotFound(format!("GPU model {model} not found")))?;
    Ok(ApiJson(view(m)))
}

/// Check a MIG layout for a model, with the same rules the planner and the node agent use.
#[utoipa::path(post, path = "/api/v1/catalog/models/{model}/validate", tag = "catalog", security(("token" = ["user"]), ("session" = ["user"])),
    params(("model" = String, Path)), request_body = LayoutCheck,
    responses((status = 200, body = LayoutVerdict), (status = 404, body = super::error::Problem),
        (status = 422, body = super::error::Problem)))]
pub async fn validate_layout(
    State(state): State<AppState>,
    Caller(_p): Caller,
    ApiPath(model): ApiPath<String>,
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
