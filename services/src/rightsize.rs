//! Right-sizing (`GET /api/v1/rightsizing`): per active allocation, its peak memory and 95th percentile utilisation
//! from the stored series (minutes, or 10-minute means past 48 hours), judged by [`tessera_core::rightsize`].

use tessera_core::rightsize::{self, Held, Usage, Verdict};
use tessera_core::rollup::Tier;
use tessera_core::sharing::Sharing;

use crate::app::AppState;
pub use tessera_api::rightsize::{RightsizeAllocation, RightsizeQuery, RightsizeReport, RightsizeVerdict};
use tessera_store::StoreError;
use tessera_store::telemetry::Metered;

/// The window unless the caller says otherwise, days.
pub const DEFAULT_DAYS: u32 = 7;
/// The windows callers may give, days (the 10-minute series is kept 35).
pub const DAYS: std::ops::RangeInclusive<u32> = 1..=30;

/// Judges the active allocations of `tenants` (all with `None`) over the last `days` before `now` with
/// `headroom_pct` % of headroom: reads each one's device in its window from the finest stored series that covers it
/// (one indexed range scan per allocation, grouped in the database, 300 to a query).
pub async fn report(
    state: &AppState,
    tenants: Option<&[String]>,
    days: u32,
    headroom_pct: f64,
    now: i64,
) -> Result<RightsizeReport, StoreError> {
    let headroom = headroom_pct / 100.0;
    let from = now - i64::from(days) * 86_400_000;
    // The allocations judged: the caller's tenants' (every tenant's for the fleet), active now.
    let allocations = match tenants {
        None => state.store.metered(None, now, now + 1).await?,
        Some(tenants) => {
            let mut all = Vec::new();
            for t in tenants {
                all.extend(state.store.metered(Some(t), now, now + 1).await?);
            }
            all
        }
    };
    let judged: Vec<&Metered> =
        allocations.iter().filter(|a| a.released_at_ms.is_none() && a.state == "active").collect();
    // A device two active allocations share (time-slicing, MPS) reports their sum: its holders are counted among
    // every tenant's, for the devices judged only.
    let devices: std::collections::BTreeSet<String> = judged.iter().filter_map(|a| a.device_uuid.clone()).collect();
    let holders = state.store.device_holders(&devices.into_iter().collect::<Vec<_>>()).await?;
    // Each window read from the finest series that covers it, all windows of a series in one grouped query.
    let mut windows: std::collections::BTreeMap<Tier, Vec<(usize, String, i64)>> = Default::default();
    for (i, a) in judged.iter().enumerate() {
        if let Some(d) = &a.device_uuid {
            let start = a.activated_at_ms.max(from).min(now);
            windows.entry(Tier::for_span(start, now)).or_default().push((i, d.clone(), start));
        }
    }
    let mut used: Vec<Option<tessera_store::telemetry::DeviceUse>> = vec![None; judged.len()];
    for (tier, windows) in windows {
        let asked: Vec<(String, i64)> = windows.iter().map(|(_, d, s)| (d.clone(), *s)).collect();
        for ((i, _, _), u) in windows.iter().zip(state.store.devices_use(tier, &asked, now).await?) {
            used[*i] = Some(u);
        }
    }
    let mut rows = Vec::new();
    for (a, used) in judged.iter().zip(&used) {
        let start = a.activated_at_ms.max(from).min(now);
        let shared = a.device_uuid.as_deref().is_some_and(|d| holders.get(d).copied().unwrap_or(0) > 1);
        rows.push(judge(state.catalog, a, start, now, used.as_ref(), shared, headroom));
    }
    rows.sort_by(|x, y| {
        let smaller = |r: &RightsizeAllocation| r.verdict != RightsizeVerdict::Smaller;
        smaller(x)
            .cmp(&smaller(y))
            .then(y.slice_hours_saved_per_day.total_cmp(&x.slice_hours_saved_per_day))
            .then(x.tenant.cmp(&y.tenant))
            .then(x.allocation.cmp(&y.allocation))
    });
    let smaller: Vec<&RightsizeAllocation> = rows.iter().filter(|r| r.verdict == RightsizeVerdict::Smaller).collect();
    Ok(RightsizeReport {
        from_ms: from,
        to_ms: now,
        headroom_pct,
        smaller: u32::try_from(smaller.len()).unwrap_or(u32::MAX),
        compute_slices_saved: smaller.iter().map(|r| r.compute_slices_saved).sum(),
        slice_hours_saved_per_day: smaller.iter().map(|r| r.slice_hours_saved_per_day).sum(),
        allocations: rows,
    })
}

/// The judgement on one active allocation whose window is `[from, to)` and whose device's minutes there are `used`.
pub fn judge(
    catalog: &tessera_core::Catalog,
    a: &Metered,
    from: i64,
    to: i64,
    used: Option<&tessera_store::telemetry::DeviceUse>,
    shared: bool,
    headroom: f64,
) -> RightsizeAllocation {
    let mut row = RightsizeAllocation {
        allocation: a.id.clone(),
        request: a.request_id.clone(),
        tenant_id: a.tenant_id.clone(),
        tenant: a.tenant_name.clone(),
        node: a.node.clone(),
        model: a.model.clone(),
        held: a.profile.clone(),
        compute_slices: 0,
        memory_mib: 0.0,
        from_ms: from,
        to_ms: to,
        minutes: used.map_or(0, |u| u.minutes),
        peak_mem_mib: used.and_then(|u| u.peak_mem_mib),
        p95_util_pct: None,
        need_compute_slices: None,
        need_mem_mib: None,
        verdict: RightsizeVerdict::UnknownModel,
        suggested_profile: None,
        compute_slices_saved: 0,
        memory_slices_saved: 0,
        slice_hours_saved: 0.0,
        slice_hours_saved_per_day: 0.0,
    };
    let Some(model) = catalog.model(&a.model) else { return row };
    let held = if a.mig_enabled {
        match model.profile_index(&a.profile) {
            Some(p) => Held::Instance(p),
            None => return row,
        }
    } else {
        match Sharing::from_key(&a.profile) {
            Some(Sharing::Exclusive) => Held::WholeGpu,
            Some(_) => {
                row.compute_slices = u32::from(model.compute_slices_total);
                row.memory_mib = rightsize::whole_memory_mib(model);
                row.verdict = RightsizeVerdict::SharedDevice;
                return row;
            }
            None => return row,
        }
    };
    let (compute, memory) = match held {
        Held::Instance(p) => {
            (model.profiles[p].compute_slices, rightsize::profile_memory_mib(model, &model.profiles[p]))
        }
        Held::WholeGpu => (model.compute_slices_total, rightsize::whole_memory_mib(model)),
    };
    row.compute_slices = u32::from(compute);
    row.memory_mib = memory;
    if shared {
        row.verdict = RightsizeVerdict::SharedDevice;
        return row;
    }
    let Some(used) = used else {
        row.verdict = RightsizeVerdict::NotEnoughData;
        return row;
    };
    let p95 =
        rightsize::util_measured(model, held).then(|| rightsize::quantile_upper(&used.util_minutes, 0.95)).flatten();
    row.p95_util_pct = p95;
    let usage = Usage { minutes: used.minutes, peak_mem_mib: used.peak_mem_mib.unwrap_or(0.0), p95_util: p95 };
    if used.peak_mem_mib.is_some()
        && let Some(n) = rightsize::need(model, held, &usage, headroom)
    {
        row.need_compute_slices = Some(n.compute);
        row.need_mem_mib = Some(n.memory_mib);
    }
    row.verdict = match rightsize::judge(model, held, &usage, headroom) {
        Some(Verdict::Smaller { profile, compute_saved, memory_saved }) => {
            row.suggested_profile = Some(model.profiles[profile].name.clone());
            row.compute_slices_saved = u32::from(compute_saved);
            row.memory_slices_saved = u32::from(memory_saved);
            row.slice_hours_saved = f64::from(compute_saved) * (to - from).max(0) as f64 / 3_600_000.0;
            row.slice_hours_saved_per_day = f64::from(compute_saved) * 24.0;
            RightsizeVerdict::Smaller
        }
        Some(Verdict::RightSized) => RightsizeVerdict::RightSized,
        Some(Verdict::AtLimit) => RightsizeVerdict::AtLimit,
        Some(Verdict::NotEnoughData) => RightsizeVerdict::NotEnoughData,
        None => RightsizeVerdict::UnknownModel,
    };
    row
}

/// A verdict in words, for refusals.
fn verdict_words(v: RightsizeVerdict) -> &'static str {
    match v {
        RightsizeVerdict::Smaller => "it needs more than that",
        RightsizeVerdict::RightSized => "it is right-sized",
        RightsizeVerdict::AtLimit => "it is at its limit",
        RightsizeVerdict::NotEnoughData => "under an hour of telemetry",
        RightsizeVerdict::SharedDevice => "its device is shared",
        RightsizeVerdict::UnknownModel => "its model is unknown",
    }
}

/// Most characters of a profile name in a right-sizing body.
pub const MAX_PROFILE_LEN: usize = 64;

/// "Request the smaller slice": asks, for the tenant of the active allocation `allocation_id`, for as many slices of
/// `profile` (smaller than what it holds: [`rightsize::is_smaller`]) as its request holds, with the request's
/// priority and no duration, through the same checks, quota and policy as any request
/// ([`super::requests::create_replacing`]); when the new request turns active, the old one is released in that
/// transaction. One replacement at a time per request (`replacement_open`).
pub async fn replace(
    state: &AppState,
    p: &tessera_store::Principal,
    allocation_id: &str,
    profile: &str,
    reason: Option<&str>,
) -> Result<(tessera_store::SliceRequest, String), crate::error::ApiError> {
    use crate::error::ApiError;
    if profile.chars().count() > MAX_PROFILE_LEN {
        let detail = format!("`profile` is at most {MAX_PROFILE_LEN} characters");
        return Err(ApiError::invalid("value_too_long", detail));
    }
    let now = tessera_store::now_ms();
    let not_found = || ApiError::NotFound(format!("allocation {allocation_id} not found"));
    let stored = state.store.allocation(allocation_id).await?.ok_or_else(not_found)?;
    if !p.can_see(&stored.tenant_id) {
        return Err(not_found());
    }
    let not_active = || {
        let detail = format!("allocation {allocation_id} is {}, not active", stored.state);
        ApiError::conflict("allocation_not_active", detail)
    };
    if stored.state != "active" {
        return Err(not_active());
    }
    let a = state
        .store
        .metered(Some(&stored.tenant_id), now, now + 1)
        .await?
        .into_iter()
        .find(|a| a.id == allocation_id && a.released_at_ms.is_none())
        .ok_or_else(not_active)?;
    let old = state.store.request(&a.request_id).await?;
    if old.state != tessera_core::request::RequestState::Active {
        let detail = format!("its request {} is {}, not active", old.id, old.state);
        return Err(ApiError::conflict("request_not_active", detail));
    }
    let model = state.catalog.model(&a.model).ok_or_else(|| {
        ApiError::invalid("unknown_model", format!("the GPU's model {} is not in the catalog", a.model))
    })?;
    let held = if a.mig_enabled {
        Held::Instance(model.profile_index(&a.profile).ok_or_else(|| {
            ApiError::invalid("unknown_profile", format!("{} is not a profile of {}", a.profile, model.key))
        })?)
    } else if Sharing::from_key(&a.profile) == Some(Sharing::Exclusive) {
        Held::WholeGpu
    } else {
        let detail = "a time-sliced or MPS share is not replaced by a MIG slice: ask for one and release the share";
        return Err(ApiError::invalid("shared_device", detail));
    };
    let to = model
        .profile_index(profile)
        .ok_or_else(|| ApiError::invalid("unknown_profile", format!("{profile} is not a profile of {}", model.key)))?;
    if !rightsize::is_smaller(model, held, to) {
        let detail = format!(
            "{profile} is not smaller than the {} held: same variant, no more compute or memory slices, fewer of one",
            a.profile
        );
        return Err(ApiError::invalid("not_smaller", detail));
    }
    // A platform admin shrinking a tenant they are not a member of gives the tenant a reason, as a reclaim does.
    if p.role_in(&old.tenant_id).is_none() && reason.is_none_or(|r| r.trim().is_empty()) {
        let detail = "shrinking another tenant's request needs a reason the tenant sees";
        return Err(ApiError::invalid("reason_required", detail));
    }
    if let Some(open) = state.store.open_replacement(&old.id).await? {
        let detail = format!("request {open} already replaces request {}", old.id);
        return Err(ApiError::conflict("replacement_open", detail));
    }
    // The whole request is replaced: every other slice of it must fit the smaller profile too, judged as the report
    // judges them by default.
    if old.count > 1 {
        let metered = state.store.metered(Some(&old.tenant_id), now, now + 1).await?;
        let from = now - i64::from(DEFAULT_DAYS) * 86_400_000;
        for sibling in metered.iter().filter(|s| s.request_id == old.id && s.id != a.id && s.released_at_ms.is_none()) {
            let start = sibling.activated_at_ms.max(from).min(now);
            let used = match &sibling.device_uuid {
                Some(d) => Some(state.store.device_use(Tier::for_span(start, now), d, start, now).await?),
                None => None,
            };
            let row = judge(state.catalog, sibling, start, now, used.as_ref(), false, rightsize::DEFAULT_HEADROOM);
            let fits = row.verdict == RightsizeVerdict::Smaller
                && row
                    .need_compute_slices
                    .is_some_and(|c| (c - 1e-9).ceil().max(1.0) <= f64::from(model.profiles[to].compute_slices))
                && row.need_mem_mib.is_some_and(|m| m <= rightsize::profile_memory_mib(model, &model.profiles[to]));
            if !fits {
                let detail = format!(
                    "request {} holds {} slices, and allocation {} of it does not fit a {profile} ({}): right-sizing \
                     replaces the whole request",
                    old.id,
                    old.count,
                    sibling.id,
                    verdict_words(row.verdict)
                );
                return Err(ApiError::invalid("siblings_do_not_fit", detail));
            }
        }
    }
    // What is left of a limited request carries over (at least the shortest duration a request may have).
    let duration_s = old.expires_at_ms.map(|e| {
        let left = u64::try_from((e - now).max(0) / 1000).unwrap_or(0);
        left.clamp(super::requests::MIN_DURATION_S, super::requests::MAX_DURATION_S)
    });
    let spec = tessera_core::request::SliceSpec::Mig { profile: profile.to_string(), model: Some(model.key.clone()) };
    let default_reason = format!("right-sizing: {} in place of the {} of request {}", profile, a.profile, old.id);
    let ask = super::requests::Ask {
        tenant: &old.tenant_id,
        spec: &spec,
        count: old.count,
        reason: reason.unwrap_or(&default_reason),
        duration_s,
        priority: old.priority,
    };
    let (request, _) = super::requests::create_replacing(state, p, ask, None, Some(&old.id)).await?;
    Ok((request, old.id))
}
