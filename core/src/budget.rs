//! Monthly budgets: how much a tenant may spend in a UTC calendar month, in compute-slice-hours over everything or
//! in GPU-hours on one model; how far it is (below 80 %, from 80 %, from 100 %); and whether a new request is
//! refused for it (only under the `block` policy, and only by a budget the request could spend from).
//!
//! Spending is metered as chargeback meters it (`crate::quota::weight`): an allocation spends its weight in
//! compute slices for every hour it runs; on its model's GPU-hours budget that divided by the model's compute
//! slices (a 3g instance of an H100 for an hour: 3 compute-slice-hours, 3/7 of a GPU-hour).

use serde::{Deserialize, Serialize};

use crate::catalog::Catalog;
use crate::quota::{MILLI, Milli};
use crate::request::SliceSpec;

/// From this share of a budget on, the tenant and the platform admins are warned.
pub const WARN_AT: f64 = 0.8;
/// The largest budget, in hours (a thousand GPUs around the clock for a month is 744,000 GPU-hours).
pub const MAX_HOURS: f64 = 1e9;
/// Most budgets a tenant may have (one per model and one over everything).
pub const MAX_LINES: usize = 32;

/// What a budget counts.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BudgetUnit {
    /// Compute-slice-hours over every model (`compute_slice_hours`).
    ComputeSliceHours,
    /// GPU-hours on one model (`gpu_hours/<model>`).
    GpuHours {
        /// Catalog model key.
        model: String,
    },
}

impl std::fmt::Display for BudgetUnit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BudgetUnit::ComputeSliceHours => f.write_str("compute_slice_hours"),
            BudgetUnit::GpuHours { model } => write!(f, "gpu_hours/{model}"),
        }
    }
}

/// Why a budget or its amount is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BudgetError {
    /// Not a unit.
    #[error("`{0}` is not a budget unit: use compute_slice_hours or gpu_hours/<model>")]
    BadUnit(String),
    /// Not an amount.
    #[error("{unit}: a budget is between 0 and {MAX_HOURS} hours, got {amount}")]
    BadAmount {
        /// The unit.
        unit: String,
        /// What was given.
        amount: f64,
    },
    /// Too many.
    #[error("a tenant has at most {MAX_LINES} budgets")]
    TooMany,
}

impl BudgetError {
    /// The stable problem code.
    pub fn code(&self) -> &'static str {
        match self {
            BudgetError::BadUnit(_) => "budget_bad_unit",
            BudgetError::BadAmount { .. } => "budget_bad_amount",
            BudgetError::TooMany => "budget_too_many",
        }
    }
}

impl BudgetUnit {
    /// Parses `compute_slice_hours` or `gpu_hours/<model>` (the model as the catalog knows it, any case).
    pub fn parse(catalog: &Catalog, text: &str) -> Result<BudgetUnit, BudgetError> {
        match text.trim() {
            "compute_slice_hours" => Ok(BudgetUnit::ComputeSliceHours),
            t => {
                let model = t.strip_prefix("gpu_hours/").and_then(|m| catalog.model(m));
                model
                    .map(|m| BudgetUnit::GpuHours { model: m.key.clone() })
                    .ok_or_else(|| BudgetError::BadUnit(t.chars().take(64).collect()))
            }
        }
    }

    /// How people read it: `compute-slice-hours`, `GPU-hours on H100-80GB`.
    pub fn describe(&self) -> String {
        match self {
            BudgetUnit::ComputeSliceHours => "compute-slice-hours".to_string(),
            BudgetUnit::GpuHours { model } => format!("GPU-hours on {model}"),
        }
    }

    /// What an allocation of weight `weight_slices` (compute slices) on `model`, with `model_slices` compute
    /// slices to a GPU, spends of this unit per hour it runs (`None`: nothing, it is another model's).
    pub fn per_hour(&self, model: &str, weight_slices: f64, model_slices: u8) -> Option<f64> {
        match self {
            BudgetUnit::ComputeSliceHours => Some(weight_slices),
            BudgetUnit::GpuHours { model: m } if m == model => Some(weight_slices / f64::from(model_slices.max(1))),
            BudgetUnit::GpuHours { .. } => None,
        }
    }

    /// Whether a request for `spec` could spend from this budget: every request spends compute-slice-hours; a
    /// request spends GPU-hours of a model when it names it, or names none (it may land there).
    pub fn applies_to(&self, spec: &SliceSpec) -> bool {
        let named = match spec {
            SliceSpec::Mig { model, .. } => model.as_deref(),
            SliceSpec::Timeslice { model, .. } | SliceSpec::Mps { model, .. } | SliceSpec::Exclusive { model } => {
                Some(model.as_str())
            }
        };
        match self {
            BudgetUnit::ComputeSliceHours => true,
            BudgetUnit::GpuHours { model } => named.is_none_or(|n| n.eq_ignore_ascii_case(model)),
        }
    }
}

/// Checks an amount of hours and turns it into thousandths.
pub fn amount(unit: &BudgetUnit, hours: f64) -> Result<Milli, BudgetError> {
    if !hours.is_finite() || !(0.0..=MAX_HOURS).contains(&hours) {
        return Err(BudgetError::BadAmount { unit: unit.to_string(), amount: hours });
    }
    Ok((hours * MILLI as f64).round() as Milli)
}

/// What happens when a budget is spent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum BudgetPolicy {
    /// The tenant and the admins are told; requests go on.
    #[default]
    Warn,
    /// New requests that could spend from a spent budget are refused until the next month (or a larger budget).
    Block,
}

impl BudgetPolicy {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetPolicy::Warn => "warn",
            BudgetPolicy::Block => "block",
        }
    }

    /// Parses the stored name.
    pub fn parse(text: &str) -> Option<BudgetPolicy> {
        [BudgetPolicy::Warn, BudgetPolicy::Block].into_iter().find(|p| p.as_str() == text)
    }
}

/// How far a budget is spent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum BudgetLevel {
    /// Below 80 %.
    #[default]
    Ok,
    /// From 80 %.
    Warning,
    /// From 100 %.
    Exhausted,
}

/// The level of `spent` hours against a budget of `limit` thousandths (a budget of 0 is spent from the start).
pub fn level(spent: f64, limit: Milli) -> BudgetLevel {
    let limit = limit as f64 / MILLI as f64;
    if spent >= limit {
        BudgetLevel::Exhausted
    } else if spent >= WARN_AT * limit {
        BudgetLevel::Warning
    } else {
        BudgetLevel::Ok
    }
}

/// The UTC calendar month `now_ms` is in: its first and its last millisecond plus one.
pub fn month(now_ms: i64) -> (i64, i64) {
    let (y, m, _) = crate::clock::civil(now_ms.div_euclid(86_400_000));
    let start = days_from_civil(y, m, 1) * 86_400_000;
    let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
    (start, days_from_civil(ny, nm, 1) * 86_400_000)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (the inverse of `clock::civil`).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The budgets a new request for `spec` is refused by: under `block`, every spent budget it could spend from.
pub fn blocking<'a>(
    policy: BudgetPolicy,
    lines: &'a [(BudgetUnit, Milli, f64)],
    spec: &SliceSpec,
) -> Vec<&'a (BudgetUnit, Milli, f64)> {
    if policy != BudgetPolicy::Block {
        return Vec::new();
    }
    lines
        .iter()
        .filter(|(unit, limit, spent)| level(*spent, *limit) == BudgetLevel::Exhausted && unit.applies_to(spec))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mig(model: Option<&str>) -> SliceSpec {
        SliceSpec::Mig { profile: "1g.10gb".into(), model: model.map(str::to_string) }
    }

    #[test]
    fn units_parse_and_spend_by_model() {
        let c = Catalog::builtin();
        let h100 = BudgetUnit::parse(c, "gpu_hours/h100-80gb").expect("a model");
        assert_eq!(h100.to_string(), "gpu_hours/H100-80GB");
        assert_eq!(BudgetUnit::parse(c, "compute_slice_hours"), Ok(BudgetUnit::ComputeSliceHours));
        assert!(BudgetUnit::parse(c, "gpu_hours/nope").is_err());
        assert!(BudgetUnit::parse(c, "dollars").is_err());
        assert_eq!(h100.per_hour("H100-80GB", 3.0, 7), Some(3.0 / 7.0));
        assert_eq!(h100.per_hour("A100-40GB", 3.0, 7), None);
        assert_eq!(BudgetUnit::ComputeSliceHours.per_hour("A100-40GB", 3.0, 7), Some(3.0));
        assert!(amount(&h100, -1.0).is_err() && amount(&h100, f64::NAN).is_err() && amount(&h100, 2e9).is_err());
        assert_eq!(amount(&h100, 12.5), Ok(12_500));
    }

    #[test]
    fn levels_warn_at_80_and_block_at_100_only_where_the_request_could_spend() {
        assert_eq!(level(79.9, 100_000), BudgetLevel::Ok);
        assert_eq!(level(80.0, 100_000), BudgetLevel::Warning);
        assert_eq!(level(100.0, 100_000), BudgetLevel::Exhausted);
        assert_eq!(level(0.0, 0), BudgetLevel::Exhausted, "a budget of 0 is spent");
        let h100 = BudgetUnit::GpuHours { model: "H100-80GB".into() };
        let lines = vec![(h100.clone(), 10_000, 10.5), (BudgetUnit::ComputeSliceHours, 100_000, 50.0)];
        assert_eq!(blocking(BudgetPolicy::Warn, &lines, &mig(Some("H100-80GB"))).len(), 0, "warn never blocks");
        assert_eq!(blocking(BudgetPolicy::Block, &lines, &mig(Some("H100-80GB"))).len(), 1);
        assert_eq!(blocking(BudgetPolicy::Block, &lines, &mig(None)).len(), 1, "it may land on an H100");
        assert_eq!(blocking(BudgetPolicy::Block, &lines, &mig(Some("A100-40GB"))).len(), 0);
        let exclusive = SliceSpec::Exclusive { model: "H100-80GB".into() };
        assert_eq!(blocking(BudgetPolicy::Block, &lines, &exclusive).len(), 1);
    }

    #[test]
    fn months_are_utc_calendar_months() {
        // 2026-11-25T12:00Z is in November 2026; 2024-02-29 in a leap February; December rolls into January.
        let nov = month(1_795_608_000_000);
        assert_eq!(
            (crate::clock::iso8601(nov.0), crate::clock::iso8601(nov.1)),
            ("2026-11-01T00:00:00Z".into(), "2026-12-01T00:00:00Z".into())
        );
        let feb = month(1_709_208_000_000);
        assert_eq!(crate::clock::iso8601(feb.0), "2024-02-01T00:00:00Z");
        assert_eq!(feb.1 - feb.0, 29 * 86_400_000);
        let dec = month(1_798_000_000_000);
        assert_eq!(crate::clock::iso8601(dec.1), "2027-01-01T00:00:00Z");
        for day in [0i64, 59, 60, 365, 10_957, 20_000, -1, -400] {
            let (y, m, d) = crate::clock::civil(day);
            assert_eq!(days_from_civil(y, m, d), day);
        }
    }
}
