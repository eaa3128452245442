//! Quota governance at a glance: a tenant's limit, held and used amounts of a resource hour by hour (its members,
//! platform admins), and where every tenant stands (platform admins): who borrows, who waits within its
//! guarantee, who holds quota it does not use, how far its budgets are spent. The arithmetic is
//! `tessera_core::timeline`'s and `tessera_core::cohort`'s.

use crate::auth::Permissions;
use std::collections::{BTreeMap, BTreeSet};

use tessera_api::quotas::{QuotaStanding, QuotaTimeline, StandingLine, TenantStanding, TimelineQuery, TimelineSummary};
use tessera_core::cohort;
use tessera_core::quota::{MILLI, Milli, Resource};
use tessera_core::request::RequestState;
use tessera_core::timeline::{self, Span};

use crate::app::AppState;
use crate::error::ApiError;
use tessera_store::{Principal, now_ms};

/// The look-back of the standing's figures, in days.
pub const STANDING_DAYS: u32 = 30;

fn units(m: f64) -> f64 {
    (m / MILLI as f64 * 1000.0).round() / 1000.0
}

fn opt_units(m: Option<Milli>) -> Option<f64> {
    m.map(|m| units(m as f64))
}

/// Mean of `values` (thousandths) over the hours up to now.
fn mean(values: &[f64]) -> f64 {
    if values.is_empty() { 0.0 } else { values.iter().sum::<f64>() / values.len() as f64 }
}

/// A tenant's timeline of one resource.
pub async fn timeline(
    state: &AppState,
    p: &Principal,
    tenant: &str,
    q: &TimelineQuery,
) -> Result<QuotaTimeline, ApiError> {
    let t = crate::lookup::tenant(state, p, tenant).await?;
    let days = q.days.unwrap_or(30);
    if !(1..=timeline::MAX_DAYS).contains(&days) {
        return Err(ApiError::invalid("invalid_days", format!("days is between 1 and {}", timeline::MAX_DAYS)));
    }
    let key = q.resource.as_deref().unwrap_or("compute_slices");
    let resource =
        Resource::parse(state.catalog, key).map_err(|e| ApiError::invalid("quota_bad_resource", e.to_string()))?;
    let now = now_ms();
    let (start, n) = timeline::hours(now, days);
    let spans = state.store.spans(Some(&t.id), &resource, start).await?.remove(&t.id).unwrap_or_default();
    let (changes, limit_now, max_now) = state.store.limit_changes_of(&t.id, &resource, start).await?;
    let none = Vec::new();
    let limit = timeline::in_force(limit_now, changes.get("limit").unwrap_or(&none), start, n);
    let maximum = timeline::in_force(max_now, changes.get("maximum").unwrap_or(&none), start, n);
    let held = timeline::hourly_mean(&spans.held, start, n, now);
    let peak = timeline::hourly_peak(&spans.held, start, n, now);
    let used = timeline::hourly_mean(&spans.used, start, n, now);
    let peak_held = peak.iter().copied().max().unwrap_or(0);
    let summary = TimelineSummary {
        peak_held: units(peak_held as f64),
        mean_held: units(mean(&held)),
        mean_used: units(mean(&used)),
        limit: opt_units(limit_now),
        never_used: limit_now.map(|l| units(l.saturating_sub(peak_held) as f64)),
    };
    Ok(QuotaTimeline {
        tenant: t.id,
        resource: resource.to_string(),
        start_ms: start,
        step_ms: timeline::HOUR_MS,
        limit: limit.into_iter().map(opt_units).collect(),
        maximum: maximum.into_iter().map(opt_units).collect(),
        held: held.into_iter().map(units).collect(),
        peak_held: peak.into_iter().map(|m| units(m as f64)).collect(),
        used: used.into_iter().map(units).collect(),
        summary,
    })
}

/// Where every tenant stands (platform admins).
pub async fn standing(state: &AppState, p: &Principal) -> Result<QuotaStanding, ApiError> {
    p.require_platform_admin()?;
    let now = now_ms();
    let (start, n) = timeline::hours(now, STANDING_DAYS);
    let tenants = state.store.tenants().await?;
    let cohorts = state.store.cohorts().await?;
    let live = state.store.live_requests().await?;
    let mut per_tenant = Vec::with_capacity(tenants.len());
    let mut resources: BTreeSet<Resource> = BTreeSet::new();
    for t in &tenants {
        let limits = state.store.quotas(&t.id).await?;
        let held = state.store.held(&t.id).await?;
        let (maximums, _) = state.store.bounds(&t.id).await?;
        resources.extend(limits.keys().cloned());
        resources.extend(held.keys().cloned());
        per_tenant.push((t, limits, held, maximums));
    }
    // Each resource's spans for every tenant, read once.
    let mut spans: BTreeMap<Resource, BTreeMap<String, tessera_store::governance::Spans>> = BTreeMap::new();
    for r in &resources {
        spans.insert(r.clone(), state.store.spans(None, r, start).await?);
    }
    let empty: Vec<Span> = Vec::new();
    let mut out = Vec::with_capacity(tenants.len());
    for (t, limits, held, maximums) in per_tenant {
        let keys: BTreeSet<&Resource> = limits.keys().chain(held.keys()).collect();
        let in_cohort = t.cohort_id.is_some();
        let lines: Vec<StandingLine> = keys
            .into_iter()
            .map(|r| {
                let s = spans.get(r).and_then(|m| m.get(&t.id));
                let peak = timeline::hourly_peak(s.map_or(&empty, |s| &s.held), start, n, now);
                let used = timeline::hourly_mean(s.map_or(&empty, |s| &s.used), start, n, now);
                let limit = limits.get(r).copied();
                let h = held.get(r).copied().unwrap_or(0);
                StandingLine {
                    resource: r.to_string(),
                    limit: opt_units(limit),
                    maximum: opt_units(maximums.get(r).copied()),
                    held: units(h as f64),
                    borrowed: units(cohort::reported_borrowed(limit, maximums.get(r).copied(), h, in_cohort) as f64),
                    over: units(cohort::over(limit, maximums.get(r).copied(), h, in_cohort) as f64),
                    peak_held_30d: units(peak.iter().copied().max().unwrap_or(0) as f64),
                    mean_used_30d: units(mean(&used)),
                }
            })
            .collect();
        let mine: Vec<_> = live.iter().filter(|r| r.tenant_id == t.id).collect();
        let waiting: Vec<_> = mine.iter().filter(|r| r.state == RequestState::Pending && !r.borrowed).collect();
        let compute = lines.iter().find(|l| l.resource == Resource::ComputeSlices.to_string());
        out.push(TenantStanding {
            tenant: t.id.clone(),
            name: t.name.clone(),
            cohort: t.cohort_id.as_ref().and_then(|c| cohorts.iter().find(|x| &x.id == c)).map(|c| c.name.clone()),
            borrowing: lines.iter().any(|l| l.borrowed > 0.0),
            over_limit: lines.iter().any(|l| l.over > 0.0),
            starved: !waiting.is_empty(),
            waiting_within_guarantee: u32::try_from(waiting.len()).unwrap_or(u32::MAX),
            oldest_waiting_ms: waiting.iter().map(|r| r.created_at_ms).min(),
            being_reclaimed: u32::try_from(mine.iter().filter(|r| r.reclaim_at_ms.is_some()).count()).unwrap_or(0),
            idle_quota: compute.is_some_and(|l| l.limit.is_some_and(|g| g > 0.0 && l.peak_held_30d * 2.0 < g)),
            budget: state.budgets.get(&t.id).map(|s| s.level()).unwrap_or_default(),
            lines,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(QuotaStanding { since_ms: start, tenants: out })
}
