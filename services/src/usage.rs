//! Usage metering for chargeback: the time each allocation was in use (from the agent reporting its instance to
//! its release), within a period, weighted by the size of the slice (compute slices: a 3g instance weighs 3, a
//! whole H100 7, a quarter time-slice share of it 1.75); sums per tenant and per profile; and which active
//! allocations sit idle (see [`crate::idle`]).

use std::collections::HashMap;

use tessera_core::Catalog;

use crate::idle::{is_idle, lookback_start};
pub use tessera_api::usage::{AllocationUsage, ProfileUsage, TenantUsage, UsageReport};
use tessera_store::telemetry::Metered;
use tessera_store::{Store, StoreError};

/// Fills the `util_in_period` of each allocation `wanted` from its device's utilisation over its use within the
/// report's period: its kept hours where they cover it, the stored series for the rest (whole hours, whole
/// 10-minute rows beside them, minutes at its edges: [`tessera_core::rollup::mean_parts`]); see
/// [`crate::use_hours::use_sums`]. `metered` is what the report was metered from.
pub async fn add_use_means(
    store: &Store,
    metered: &[Metered],
    report: &mut UsageReport,
    wanted: impl Fn(&AllocationUsage) -> bool,
) -> Result<(), StoreError> {
    let now = tessera_store::now_ms();
    let of: Vec<(usize, &str, i64, i64)> = report
        .allocations
        .iter()
        .enumerate()
        .filter(|(_, a)| a.device_uuid.is_some() && wanted(a))
        .map(|(i, a)| (i, a.allocation.as_str(), a.from_ms, a.to_ms))
        .collect();
    let sums = crate::use_hours::use_sums(store, metered, &of, now).await?;
    for (i, a) in report.allocations.iter_mut().enumerate() {
        a.util_in_period = sums.get(&i).filter(|s| s.1 > 0).map(|&(weighted, samples)| weighted / samples as f64);
    }
    Ok(())
}

/// How idle allocations are told apart.
#[derive(Debug, Clone, Copy)]
pub struct IdleRule<'a> {
    /// Utilisation (%) below which an allocation is idle.
    pub below: f64,
    /// The look-back, hours before now.
    pub hours: f64,
    /// Mean utilisation per device over the look-back (see [`crate::idle::device_utilisation`]).
    pub util: &'a HashMap<String, f64>,
}

/// Meters `allocations` over `[from_ms, to_ms)`, with `now_ms` as the end of allocations still active, and flags
/// the active ones that are idle by `idle`.
pub fn meter(
    catalog: &Catalog,
    allocations: &[Metered],
    from_ms: i64,
    to_ms: i64,
    now_ms: i64,
    idle: IdleRule<'_>,
) -> UsageReport {
    let look_from_ms = lookback_start(now_ms, idle.hours);
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
        let active = a.released_at_ms.is_none();
        let util_mean = a.device_uuid.as_ref().filter(|_| active).and_then(|d| idle.util.get(d).copied());
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
            util_mean,
            idle: is_idle(active, a.activated_at_ms, look_from_ms, util_mean, idle.below),
            util_in_period: None,
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
    let mut profiles: Vec<ProfileUsage> = Vec::new();
    for r in &rows {
        match profiles.iter_mut().find(|p| p.model == r.model && p.profile == r.profile) {
            Some(p) => {
                p.allocations += 1;
                p.slice_seconds += r.slice_seconds;
                p.gpu_hours += r.gpu_hours;
            }
            None => profiles.push(ProfileUsage {
                model: r.model.clone(),
                profile: r.profile.clone(),
                allocations: 1,
                slice_seconds: r.slice_seconds,
                gpu_hours: r.gpu_hours,
            }),
        }
    }
    profiles.sort_by(|a, b| (&a.model, &a.profile).cmp(&(&b.model, &b.profile)));
    UsageReport {
        from_ms,
        to_ms,
        idle_below: idle.below,
        idle_hours: idle.hours,
        tenants,
        profiles,
        allocation_count: rows.len(),
        idle_count: rows.iter().filter(|a| a.idle).count(),
        allocations: rows,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_idle(util: &HashMap<String, f64>) -> IdleRule<'_> {
        IdleRule { below: 5.0, hours: 2.0, util }
    }

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
        let report = meter(catalog, &rows, 80_000, 200_000, 150_000, no_idle(&HashMap::new()));
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
        let report = meter(catalog, &rows, 20_000, 30_000, 40_000, no_idle(&HashMap::new()));
        assert!(report.allocations.is_empty());
        assert!(report.tenants.is_empty() && report.profiles.is_empty());
    }

    #[test]
    fn profiles_sum_their_allocations_by_model_then_profile() {
        let catalog = Catalog::builtin();
        let mut rows = vec![
            metered("1g.10gb", "H100-80GB", 0, None),
            metered("1g.10gb", "H100-80GB", 50_000, None),
            metered("3g.20gb", "A100-40GB", 0, Some(10_000)),
        ];
        rows[1].id = "a-second".into();
        let report = meter(catalog, &rows, 0, 100_000, 100_000, no_idle(&HashMap::new()));
        let keys: Vec<(&str, &str, usize)> =
            report.profiles.iter().map(|p| (p.model.as_str(), p.profile.as_str(), p.allocations)).collect();
        assert_eq!(keys, [("A100-40GB", "3g.20gb", 1), ("H100-80GB", "1g.10gb", 2)]);
        assert_eq!(report.profiles[0].slice_seconds, 30.0);
        assert_eq!(report.profiles[1].slice_seconds, 150.0);
        assert!((report.profiles[1].gpu_hours - 150.0 / 7.0 / 3600.0).abs() < 1e-12);
    }

    #[test]
    fn active_allocations_with_a_low_mean_over_the_whole_look_back_are_idle() {
        let catalog = Catalog::builtin();
        let hour = 3_600_000;
        let now = 10 * hour;
        let mut rows = Vec::new();
        for (id, device, activated, released) in [
            ("quiet", Some("MIG-quiet"), 0, None),
            ("busy", Some("MIG-busy"), 0, None),
            ("recent", Some("MIG-quiet"), now - hour, None),
            ("unseen", Some("MIG-unseen"), 0, None),
            ("no-device", None, 0, None),
            ("gone", Some("MIG-quiet"), 0, Some(now - 1000)),
        ] {
            let mut m = metered("1g.10gb", "H100-80GB", activated, released);
            m.id = id.into();
            m.device_uuid = device.map(str::to_string);
            rows.push(m);
        }
        let util: HashMap<String, f64> = [("MIG-quiet".to_string(), 1.5), ("MIG-busy".to_string(), 60.0)].into();
        let report = meter(catalog, &rows, 0, now, now, IdleRule { below: 5.0, hours: 2.0, util: &util });
        assert_eq!((report.idle_below, report.idle_hours), (5.0, 2.0));
        let by = |id: &str| report.allocations.iter().find(|a| a.allocation == id).cloned().expect(id);
        assert_eq!((by("quiet").util_mean, by("quiet").idle), (Some(1.5), true));
        assert_eq!((by("busy").util_mean, by("busy").idle), (Some(60.0), false));
        assert_eq!((by("recent").util_mean, by("recent").idle), (Some(1.5), false), "active for only an hour");
        assert_eq!((by("unseen").util_mean, by("unseen").idle), (None, false));
        assert_eq!((by("no-device").util_mean, by("no-device").idle), (None, false));
        assert_eq!((by("gone").util_mean, by("gone").idle), (None, false), "released");
    }
}
