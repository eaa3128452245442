//! Monthly budgets: how much a tenant may spend in a UTC calendar month, in compute-slice-hours or in GPU-hours on
//! one model, how far it is, and what happens when a budget is spent.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
pub use tessera_core::budget::{BudgetLevel, BudgetPolicy};

/// A tenant's budgets this month, with what is spent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BudgetView {
    /// The tenant's id.
    pub tenant: String,
    /// What a spent budget does: `warn` (requests go on) or `block` (new requests that could spend from it are
    /// refused until the month ends or the budget grows).
    pub policy: BudgetPolicy,
    /// The month: its first millisecond (UTC).
    pub month_start_ms: i64,
    /// The month's end: the first millisecond of the next.
    pub month_end_ms: i64,
    /// The worst level of its budgets (`ok` without budgets).
    pub level: BudgetLevel,
    /// One line per budget, by unit.
    pub lines: Vec<BudgetLine>,
}

/// One budget.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BudgetLine {
    /// `compute_slice_hours` or `gpu_hours/<model>`.
    pub unit: String,
    /// In words: `compute-slice-hours`, `GPU-hours on H100-80GB`.
    pub label: String,
    /// The budget, in hours.
    pub limit: f64,
    /// Spent this month so far, in hours (allocations running this month, up to now).
    pub spent: f64,
    /// `spent / limit` (1 or more when spent; a budget of 0 counts as spent).
    pub fraction: f64,
    /// `ok` below 80 %, `warning` from 80 %, `exhausted` from 100 %.
    pub level: BudgetLevel,
}

/// A change of a tenant's budgets (platform admins).
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct BudgetUpdate {
    /// The new policy (absent: unchanged).
    #[serde(default)]
    pub policy: Option<BudgetPolicy>,
    /// Unit (`compute_slice_hours`, `gpu_hours/<model>`) -> hours a month (0 to 1e9), or `null` to remove it. At
    /// most 32 budgets a tenant.
    #[serde(default)]
    pub limits: BTreeMap<String, Option<f64>>,
}
