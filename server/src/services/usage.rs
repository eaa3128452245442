//! Usage metering for chargeback: the time each allocation was in use (from the agent reporting its instance to
//! its release), within a period, weighted by the size of the slice (compute slices: a 3g instance weighs 3, a
//! whole H100 7, a quarter time-slice share of it 1.75).

use serde::Serialize;
use tessera_core::Catalog;
use utoipa::ToSchema;

use crate::store::telemetry::Metered;

/// One allocation's use in the period.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct AllocationUsage {
    /// Allocation id.
    pub allocation: String,
    /// Its request.
    pub request: String,
    /// Tenant id.
    pub tenant_id: String,
    /// Tenant name.
    pub tenant: String,
    /// Node name.
    pub node: String,
    /// GPU UUID.
    pub gpu_uuid: String,
    /// MIG device or GPU UUID.
    pub device_uuid: Option<String>,
    /// Catalog model key.
    pub model: String,
    /// MIG profile, or the sharing of a whole-GPU share (`exclusive`, `timeslice:4`, `mps:2`).
    pub profile: String,
    /// Compute slices the allocation weighs.
    pub weight: f64,
    /// `active` or `released`.
    pub state: String,
    /// Start of its use within the period, UTC ms.
    pub from_ms: i64,
    /// End of its use within the period, UTC ms (the period's end, or now, while it is still active).
    pub to_ms: i64,
    /// Seconds in use within the period.
    pub seconds: f64,
    /// `seconds × weight`.
    pub slice_seconds: f64,
    /// `slice_seconds` as hours of a whole GPU of its model.
    pub gpu_hours: f64,
}

/// A tenant's use in the period.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct TenantUsage {
    /// Tenant id.
    pub tenant_id: String,
    /// Tenant name.
    pub tenant: String,
    /// Allocations in use at some time in the period.
    pub allocations: usize,
    /// Sum of their slice-seconds.
    pub slice_seconds: f64,
    /// Sum of their whole-GPU hours.
    pub gpu_hours: f64,
}

/// Usage in a period.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct UsageReport {
    /// Start, UTC ms.
    pub from_ms: i64,
    /// End, UTC ms.
    pub to_ms: i64,
    /// Per tenant, by name.
    pub tenants: Vec<TenantUsage>,
    /// Per allocation, by tenant then allocation.
    pub allocations: Vec<AllocationUsage>,
}

/// Meters `allocations` over `[from_ms, to_ms)`, with `now_ms` as the end of allocations still active.
pub fn meter(catalog: &Catalog, allocations: &[Metered], from_ms: i64, to_ms: i64, now_ms: i64) -> UsageReport {
    let mut rows = Vec::new();
    for a in allocations {
        let Some(model) = catalog.model(&a.model) else { continue };
        let weight = tessera_core::quota::weight(model, &a.profile).unwrap_or(0.0);
        let start = a.activated_at_ms.max(from_ms);
        let end = a.released_at_ms.unwrap_or(now_ms).min(to_ms).min(now_ms.max(from_ms));
        if end <= start {
            continue;
        }
        let seconds = (end - start) as f64 / 1000.0;
        let slice_seconds = seconds * weight;
        rows.push(AllocationUsage {
            allocation: a.id.clone(),
            request: a.request_id.clone(),
            tenant_id: a.tenant_id.clone(),
            tenant: a.tenant_name.clone(),
            node: a.node.clone(),
            gpu_uuid: a.gpu_uuid.clone(),
            device_uuid: a.device_uuid.clone(),
            model: model.key.clone(),
            profile: a.profile.clone(),
            weight,
            state: a.state.clone(),
            from_ms: start,
            to_ms: end,
            seconds,
            slice_seconds,
            gpu_hours: slice_seconds / f64::from(model.compute_slices_total.max(1)) / 3600.0,
        });
    }
    let mut tenants: Vec<TenantUsage> = Vec::new();
    for r in &rows {
        match tenants.iter_mut().find(|t| t.tenant_id == r.tenant_id) {
            Some(t) => {
                t.allocations += 1;
                t.slice_seconds += r.slice_seconds;
                t.gpu_hours += r.gpu_hours;
            }
            None => tenants.push(TenantUsage {
                tenant_id: r.tenant_id.clone(),
                tenant: r.tenant.clone(),
                allocations: 1,
                slice_seconds: r.slice_seconds,
                gpu_hours: r.gpu_hours,
            }),
        }
    }
    tenants.sort_by(|a, b| a.tenant.cmp(&b.tenant));
    UsageReport { from_ms, to_ms, tenants, allocations: rows }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metered(profile: &str, model: &str, from: i64, to: Option<i64>) -> Metered {
        Metered {
            id: format!("a-{profile}"),
            request_id: "r".into(),
            tenant_id: "t".into(),
            tenant_name: "ml".into(),
            node: "n".into(),
            gpu_uuid: "GPU-1".into(),
            model: model.into(),
            profile: profile.into(),
            start: 0,
            mig_enabled: true,
            state: if to.is_some() { "released" } else { "active" }.into(),
            activated_at_ms: from,
            released_at_ms: to,
            device_uuid: None,
        }
    }

    #[test]
    fn slice_seconds_are_time_in_the_period_times_compute_slices() {
        let catalog = Catalog::builtin();
        let rows = [
            // 3g for 100 s, of which 60 s in the period.
            metered("3g.40gb", "H100-80GB", 40_000, Some(140_000)),
            // A whole H100 from before the period, still active at "now" (150 s).
            metered("exclusive", "H100-80GB", 0, None),
            // A quarter time-slice share of an A30 (4 slices): weight 1, for the whole period.
            metered("timeslice:4", "A30-24GB", 0, None),
        ];
        let report = meter(catalog, &rows, 80_000, 200_000, 150_000);
        let by = |p: &str| report.allocations.iter().find(|a| a.profile == p).expect(p).clone();
        assert_eq!((by("3g.40gb").seconds, by("3g.40gb").slice_seconds), (60.0, 180.0));
        assert_eq!((by("exclusive").seconds, by("exclusive").slice_seconds), (70.0, 490.0));
        assert!((by("exclusive").gpu_hours - 70.0 / 3600.0).abs() < 1e-12);
        assert_eq!(by("timeslice:4").weight, 1.0);
        assert_eq!(report.tenants.len(), 1);
        assert_eq!(report.tenants[0].slice_seconds, 180.0 + 490.0 + 70.0);
    }

    #[test]
    fn allocations_outside_the_period_count_nothing() {
        let catalog = Catalog::builtin();
        let rows = [metered("1g.10gb", "H100-80GB", 0, Some(10_000))];
        let report = meter(catalog, &rows, 20_000, 30_000, 40_000);
        assert!(report.allocations.is_empty());
        assert!(report.tenants.is_empty());
    }
}
