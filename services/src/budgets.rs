//! Monthly budgets: reading a tenant's (its members), changing them (platform admins), what is spent this month
//! (metered as chargeback meters it), and refusing new requests under the `block` policy. The rules are
//! `tessera_core::budget`'s.
//!
//! Request creation checks [`BudgetCache`], which the server's sweep fills every `EXPIRY_SWEEP` (15 s) from what
//! is spent, and a budget change fills at once for its tenant: spending grows with time, so a check against the
//! spending of a few seconds ago is as exact as any. Each replica keeps its own.

use crate::auth::Permissions;
use std::collections::{BTreeMap, HashMap};

use tessera_api::budgets::{BudgetLine, BudgetUpdate, BudgetView};
use tessera_core::budget::{self, BudgetLevel, BudgetUnit};
use tessera_core::quota::{MILLI, Milli};
use tessera_core::request::SliceSpec;

use crate::app::AppState;
use crate::error::ApiError;
use crate::state::budgets::Standing;
use tessera_store::governance::Budgets;
use tessera_store::{Principal, now_ms};

/// What `budgets` have spent this month by `now_ms`, per tenant.
async fn spent(
    state: &AppState,
    tenant: Option<&str>,
    budgets: BTreeMap<String, Budgets>,
    now_ms: i64,
) -> Result<HashMap<String, Standing>, ApiError> {
    let (start, _) = budget::month(now_ms);
    if budgets.values().all(|b| b.limits.is_empty()) {
        return Ok(HashMap::new());
    }
    let metered = state.store.metered(tenant, start, now_ms).await?;
    let mut out = HashMap::new();
    for (tenant, b) in budgets {
        let mut lines: Vec<(BudgetUnit, Milli, f64)> = Vec::new();
        for (unit, limit) in &b.limits {
            let Ok(unit) = BudgetUnit::parse(state.catalog, unit) else { continue };
            lines.push((unit, *limit, 0.0));
        }
        for a in metered.iter().filter(|a| a.tenant_id == tenant) {
            let Some(model) = state.catalog.model(&a.model) else { continue };
            let Some(weight) = tessera_core::quota::weight(model, &a.profile) else { continue };
            let from = a.activated_at_ms.max(start);
            let to = a.released_at_ms.unwrap_or(now_ms).min(now_ms);
            if to <= from {
                continue;
            }
            let hours = (to - from) as f64 / 3_600_000.0;
            for (unit, _, spent) in &mut lines {
                if let Some(rate) = unit.per_hour(&model.key, weight, model.compute_slices_total) {
                    *spent += rate * hours;
                }
            }
        }
        out.insert(tenant, Standing { policy: b.policy, lines });
    }
    Ok(out)
}

/// Refills the cache from every tenant's budgets (the sweep).
///
/// A budget found past 80 % or spent is told to its tenant (`budget.warning`, `budget.exhausted`), once per budget,
/// level and month.
pub async fn refresh(state: &AppState) -> Result<usize, ApiError> {
    let budgets = state.store.all_budgets(None).await?;
    let now = now_ms();
    let all = spent(state, None, budgets, now).await?;
    let n = all.len();
    let (month_start_ms, _) = budget::month(now);
    for (tenant, standing) in &all {
        for (unit, limit, spent) in &standing.lines {
            let kind = match budget::level(*spent, *limit) {
                BudgetLevel::Ok => continue,
                BudgetLevel::Warning => "budget.warning",
                BudgetLevel::Exhausted => "budget.exhausted",
            };
            let key = format!("budget/{tenant}/{unit}/{month_start_ms}/{kind}");
            let limit = *limit as f64 / MILLI as f64;
            let after = serde_json::json!({"tenant_id": tenant, "unit": unit.to_string(), "label": unit.describe(),
                "limit": limit, "spent": (spent * 1000.0).round() / 1000.0, "month_start_ms": month_start_ms,
                "policy": standing.policy});
            let subject = format!("tenant/{tenant}/budget");
            state.store.tell_once(&key, kind, Some(tenant), &subject, "system:budget", after).await?;
        }
    }
    state.budgets.replace(all);
    Ok(n)
}

/// A tenant's budgets with what is spent, read now (and put in the cache).
async fn standing(state: &AppState, tenant: &str) -> Result<Standing, ApiError> {
    let budgets = state.store.budgets(tenant).await?;
    let mut map = BTreeMap::new();
    map.insert(tenant.to_string(), budgets);
    let s = spent(state, Some(tenant), map, now_ms()).await?.remove(tenant).unwrap_or_default();
    state.budgets.put(tenant, (!s.lines.is_empty()).then(|| s.clone()));
    Ok(s)
}

fn view(tenant: &str, s: Standing, now: i64) -> BudgetView {
    let (month_start_ms, month_end_ms) = budget::month(now);
    let level = s.level();
    let lines = s
        .lines
        .into_iter()
        .map(|(unit, limit, spent)| {
            let l = limit as f64 / MILLI as f64;
            BudgetLine {
                label: unit.describe(),
                unit: unit.to_string(),
                limit: l,
                spent: (spent * 1000.0).round() / 1000.0,
                fraction: if l > 0.0 { spent / l } else { 1.0 },
                level: budget::level(spent, limit),
            }
        })
        .collect();
    BudgetView { tenant: tenant.to_string(), policy: s.policy, month_start_ms, month_end_ms, level, lines }
}

/// A tenant's budgets this month (its members, platform admins).
pub async fn get(state: &AppState, p: &Principal, tenant: &str) -> Result<BudgetView, ApiError> {
    let t = crate::lookup::tenant(state, p, tenant).await?;
    let s = standing(state, &t.id).await?;
    Ok(view(&t.id, s, now_ms()))
}

/// Changes a tenant's budgets (platform admins): every unit and amount is checked before anything is written.
pub async fn set(state: &AppState, p: &Principal, tenant: &str, update: &BudgetUpdate) -> Result<BudgetView, ApiError> {
    p.require_platform_admin()?;
    let t = crate::lookup::tenant(state, p, tenant).await?;
    if update.limits.len() > budget::MAX_LINES {
        return Err(ApiError::invalid("budget_too_many", budget::BudgetError::TooMany.to_string()));
    }
    let mut limits = Vec::with_capacity(update.limits.len());
    for (key, hours) in &update.limits {
        let unit = BudgetUnit::parse(state.catalog, key).map_err(|e| ApiError::invalid(e.code(), e.to_string()))?;
        let limit = match hours {
            Some(h) => Some(budget::amount(&unit, *h).map_err(|e| ApiError::invalid(e.code(), e.to_string()))?),
            None => None,
        };
        limits.push((unit, limit));
    }
    state.store.set_budgets(&t.id, update.policy, &limits, &p.actor()).await?;
    get(state, p, &t.id).await
}

/// Refuses a new request for `spec` when the tenant's policy is `block` and a budget it could spend from is spent.
pub fn check(state: &AppState, tenant: &str, spec: &SliceSpec) -> Result<(), ApiError> {
    let Some(s) = state.budgets.get(tenant) else { return Ok(()) };
    let blocking = budget::blocking(s.policy, &s.lines, spec);
    if blocking.is_empty() {
        return Ok(());
    }
    let (_, end) = budget::month(now_ms());
    let spent: Vec<String> = blocking
        .iter()
        .map(|(unit, limit, spent)| {
            // Small budgets keep three decimals, so `0.044 of 0.01` does not read `0 of 0`.
            let n = |v: f64| tessera_core::clock::rounded(v, if v.abs() < 10.0 { 3 } else { 1 });
            format!("{}: {} of {} spent this month", unit.describe(), n(*spent), n(*limit as f64 / MILLI as f64))
        })
        .collect();
    Err(ApiError::Conflict {
        code: "budget_exhausted",
        detail: format!(
            "{}. The tenant's budget policy refuses new requests until {} (UTC) or until a platform admin raises \
             the budget.",
            spent.join("; "),
            tessera_core::clock::utc_minute(end)
        ),
        errors: vec![],
    })
}
