//! Monthly budgets of a tenant: read by its members, changed by platform admins.

use crate::auth::Caller;
use axum::extract::State;

use super::error::{ApiError, ApiJson, ApiPath, Problem};
pub use tessera_api::budgets::{BudgetUpdate, BudgetView};
use tessera_services::app::AppState;
use tessera_services::budgets;

/// A tenant's budgets this month: each with what is spent so far and how far (`ok`, `warning` from 80 %,
/// `exhausted` from 100 %), and what a spent budget does.
#[utoipa::path(get, path = "/api/v1/tenants/{id}/budget", tag = "tenants", security(("token" = ["tenant-member"]), ("session" = ["tenant-member"])),
    params(("id" = String, Path, description = "The tenant's id or its name")),
    responses((status = 200, body = BudgetView), (status = 404, body = Problem)))]
pub async fn get_budget(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<ApiJson<BudgetView>, ApiError> {
    Ok(ApiJson(budgets::get(&state, &p, &id).await?))
}

/// Set or remove a tenant's budgets and set its policy (platform admins). Every unit and amount is checked before
/// anything is written; all of it is written in one transaction.
#[utoipa::path(put, path = "/api/v1/tenants/{id}/budget", tag = "tenants", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    params(("id" = String, Path, description = "The tenant's id or its name")), request_body = BudgetUpdate,
    responses((status = 200, body = BudgetView), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 422, body = Problem, description = "budget_bad_unit, budget_bad_amount or budget_too_many")))]
pub async fn set_budget(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<BudgetUpdate>,
) -> Result<ApiJson<BudgetView>, ApiError> {
    Ok(ApiJson(budgets::set(&state, &p, &id, &body).await?))
}
