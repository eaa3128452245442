//! What tenants' budgets have spent, as the sweep last found it.

use std::collections::HashMap;
use std::sync::RwLock;

use tessera_core::budget::{self, BudgetLevel, BudgetPolicy, BudgetUnit};
use tessera_core::quota::Milli;

/// One tenant's budgets with what is spent of each this month.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Standing {
    /// Its policy.
    pub policy: BudgetPolicy,
    /// Each budget: unit, limit (thousandths of an hour), spent hours.
    pub lines: Vec<(BudgetUnit, Milli, f64)>,
}

impl Standing {
    /// The worst level of its budgets.
    pub fn level(&self) -> BudgetLevel {
        self.lines.iter().map(|(_, limit, spent)| budget::level(*spent, *limit)).max().unwrap_or_default()
    }
}

/// What the sweep last found spent, by tenant (only tenants with budgets).
#[derive(Debug, Default)]
pub struct BudgetCache(RwLock<HashMap<String, Standing>>);

impl BudgetCache {
    /// A tenant's budgets as last seen.
    pub fn get(&self, tenant: &str) -> Option<Standing> {
        self.0.read().ok()?.get(tenant).cloned()
    }

    pub(crate) fn put(&self, tenant: &str, s: Option<Standing>) {
        if let Ok(mut map) = self.0.write() {
            match s {
                Some(s) => map.insert(tenant.to_string(), s),
                None => map.remove(tenant),
            };
        }
    }

    pub(crate) fn replace(&self, all: HashMap<String, Standing>) {
        if let Ok(mut map) = self.0.write() {
            *map = all;
        }
    }
}
