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
use tessera_core::timeline;

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

/// How long after an hour's end its standing is kept: a request or allocation written by a replica whose clock is
/// behind this one's lands in the hour before for that long.
const SETTLE_MS: i64 = 120_000;

/// Per resource and tenant, the most of the resource it held in any of the `n` hours from `start` up to `now_ms`,
/// and the sum of what it used on average each hour (the current hour over its elapsed part). The hours that have
/// ended are kept in the store ([`tessera_store::Store::keep_standing_hours`], on every replica and across
/// restarts); only the hours from the first one not kept are read from the requests and allocations (every
/// resource's at once), so a standing costs the activity since the last one (at most the hour since the sweep's,
/// [`keep_hours`]) plus a sum per tenant of what is live, not the 30 days'.
async fn thirty_days(
    state: &AppState,
    resources: &BTreeSet<Resource>,
    start: i64,
    n: usize,
    now_ms: i64,
) -> Result<BTreeMap<Resource, BTreeMap<String, (Milli, f64)>>, ApiError> {
    let hour = timeline::HOUR_MS;
    let current = start + (n.max(1) as i64 - 1) * hour;
    let mut kept = Vec::with_capacity(resources.len());
    for r in resources {
        let (figures, first) = state.store.standing_hours(&r.to_string(), start, current, hour).await?;
        kept.push((r, figures, first));
    }
    // Read once from the earliest hour any resource needs: spans from before a resource's own first hour count
    // there as what it held when that hour began.
    let read_from = kept.iter().map(|(_, _, first)| *first).min().unwrap_or(current);
    let list: Vec<Resource> = resources.iter().cloned().collect();
    let mut spans_of = state.store.spans_of(None, &list, read_from).await?;
    let mut out = BTreeMap::new();
    for (resource, mut totals, first) in kept {
        let key = resource.to_string();
        let fresh = usize::try_from((current - first) / hour).unwrap_or(0) + 1;
        // The hours before the current one have ended; the last of them is kept once it has settled.
        let settled = if now_ms >= current + SETTLE_MS { fresh - 1 } else { fresh.saturating_sub(2) };
        let mut ended: Vec<tessera_store::governance::StandingHour> =
            (0..settled).map(|h| (first + h as i64 * hour, Vec::new())).collect();
        for (tenant, spans) in spans_of.remove(&key).unwrap_or_default() {
            let peaks = timeline::hourly_peak(&spans.held, first, fresh, now_ms);
            let used = timeline::hourly_mean(&spans.used, first, fresh, now_ms);
            let total = totals.entry(tenant.clone()).or_default();
            for (h, (peak, used)) in peaks.into_iter().zip(used).enumerate() {
                total.0 = total.0.max(peak);
                total.1 += used;
                if let Some((_, tenants)) = ended.get_mut(h)
                    && (peak != 0 || used != 0.0)
                {
                    tenants.push((tenant.clone(), peak, used));
                }
            }
        }
        if !ended.is_empty()
            && let Err(e) = state.store.keep_standing_hours(&key, &ended, start).await
        {
            // The answer stands; the next standing works these hours out again.
            tracing::warn!(error = %e, resource = %key, "cannot keep the quota standing's hours");
        }
        out.insert(resource.clone(), totals);
    }
    Ok(out)
}

/// Where every tenant stands (platform admins).
pub async fn standing(state: &AppState, p: &Principal) -> Result<QuotaStanding, ApiError> {
    p.require_platform_admin()?;
    standing_at(state, now_ms()).await
}

/// Works the quota standing's ended hours out and keeps them (the sweep, once each hour has ended): a standing then
/// reads the requests and allocations of the hour since.
pub async fn keep_hours(state: &AppState, now: i64) -> Result<(), ApiError> {
    standing_at(state, now).await.map(|_| ())
}

/// Where every tenant stands at `now`.
async fn standing_at(state: &AppState, now: i64) -> Result<QuotaStanding, ApiError> {
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
    // Each resource's 30-day figures for every tenant: the ended hours kept from earlier standings, the rest from
    // the requests and allocations of those hours (and the live ones), read once.
    let figures = thirty_days(state, &resources, start, n, now).await?;
    let mut out = Vec::with_capacity(tenants.len());
    for (t, limits, held, maximums) in per_tenant {
        let keys: BTreeSet<&Resource> = limits.keys().chain(held.keys()).collect();
        let in_cohort = t.cohort_id.is_some();
        let lines: Vec<StandingLine> = keys
            .into_iter()
            .map(|r| {
                let (peak, used_sum) = figures.get(r).and_then(|m| m.get(&t.id)).copied().unwrap_or_default();
                let limit = limits.get(r).copied();
                let h = held.get(r).copied().unwrap_or(0);
                StandingLine {
                    resource: r.to_string(),
                    limit: opt_units(limit),
                    maximum: opt_units(maximums.get(r).copied()),
                    held: units(h as f64),
                    borrowed: units(cohort::reported_borrowed(limit, maximums.get(r).copied(), h, in_cohort) as f64),
                    over: units(cohort::over(limit, maximums.get(r).copied(), h, in_cohort) as f64),
                    peak_held_30d: units(peak as f64),
                    mean_used_30d: units(used_sum / n.max(1) as f64),
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
