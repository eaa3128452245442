//! Each allocation's hours, kept as they end ([`tessera_store::allocation_hours`]), and the means that read them:
//! a usage or efficiency report sums an allocation's kept hours and reads its device's series only where they do
//! not cover its use ([`tessera_core::rollup::kept_cover`]), so a report's cost follows its allocations, not the
//! hours of telemetry behind each.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tessera_core::rollup::{Tier, mean_parts};
use tessera_store::allocation_hours::{AllocationHour, HoursKept};
use tessera_store::telemetry::Metered;
use tessera_store::{Store, StoreError};

/// The windows of one series a mean reads, and the owner each belongs to.
type Asked = (Vec<usize>, Vec<(String, i64, i64)>);

const HOUR_MS: i64 = 3_600_000;
const DAY_MS: i64 = 86_400_000;

/// How long after an hour ends it is kept; telemetry of the hour that arrives later (an agent that was cut off
/// longer) makes the hours from it on be kept again ([`tessera_core::rollup::late_for_kept_hours`]).
pub const SETTLE_MS: i64 = tessera_core::rollup::KEEP_SETTLE_MS;
/// Days of hours kept; a report reaching further back reads the series for the older part. The 10-minute series'
/// retention: what the minute-exact means beyond the minutes' 48 hours are read from.
pub const KEPT_DAYS: i64 = 35;

/// Device sums over spans: per `(owner, device, s, e)`, the device's stored series over `[s, e)` read as
/// [`mean_parts`] says at `now_ms`, summed per owner as `(util_avg × samples, samples)`. One grouped query per
/// series and 300 windows.
pub async fn span_sums(
    store: &Store,
    spans: &[(usize, &str, i64, i64)],
    now_ms: i64,
) -> Result<HashMap<usize, (f64, i64)>, StoreError> {
    let mut asked: std::collections::BTreeMap<Tier, Asked> = Default::default();
    for &(owner, device, s, e) in spans {
        for (tier, lo, hi) in mean_parts(s, e, now_ms) {
            let (owners, windows) = asked.entry(tier).or_default();
            owners.push(owner);
            windows.push((device.to_string(), lo, hi));
        }
    }
    let mut sums: HashMap<usize, (f64, i64)> = HashMap::new();
    for (tier, (owners, windows)) in asked {
        for (owner, (weighted, samples)) in owners.into_iter().zip(store.window_sums(tier, &windows).await?) {
            let sum = sums.entry(owner).or_default();
            sum.0 += weighted;
            sum.1 += samples;
        }
    }
    Ok(sums)
}

/// What one [`keep`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Kept {
    /// Hours kept.
    pub hours: u32,
    /// Allocation rows written with them.
    pub rows: usize,
    /// Hours that ended and settled still to keep after it.
    pub behind: u32,
}

/// Keeps the hours that ended at least [`SETTLE_MS`] before `now_ms` and are not kept yet, oldest first, for as
/// long as `budget` allows (an hour started is finished), and drops those older than [`KEPT_DAYS`]. The first
/// call starts [`KEPT_DAYS`] back. Replicas may call it together: each hour is kept by one of them
/// ([`Store::keep_allocation_hour`]).
pub async fn keep(store: &Store, now_ms: i64, budget: Duration) -> Result<Kept, StoreError> {
    let oldest = Tier::Hour.bucket_of(now_ms - KEPT_DAYS * DAY_MS);
    let mut kept = match store.allocation_hours_kept().await? {
        Some(k) => k,
        None => store.start_allocation_hours(oldest).await?,
    };
    if kept.from_ms < oldest {
        store.prune_allocation_hours(oldest).await?;
        kept = store.allocation_hours_kept().await?.unwrap_or(kept);
    }
    let began = Instant::now();
    let mut done = Kept::default();
    while kept.to_ms + HOUR_MS + SETTLE_MS <= now_ms && began.elapsed() < budget {
        let rows = hour_rows(store, kept.to_ms, now_ms).await?;
        if !store.keep_allocation_hour(kept, HOUR_MS, &rows).await? {
            // Kept by another replica meanwhile, or written into since: read again.
            match store.allocation_hours_kept().await? {
                Some(now_kept) if now_kept != kept => kept = now_kept,
                _ => break,
            }
            continue;
        }
        done.hours += 1;
        done.rows += rows.len();
        kept.to_ms += HOUR_MS;
    }
    let settled = Tier::Hour.bucket_of(now_ms - SETTLE_MS);
    done.behind = u32::try_from(((settled - kept.to_ms) / HOUR_MS).max(0)).unwrap_or(u32::MAX);
    Ok(done)
}

/// The sums of every allocation held in the hour starting at `hour_ms` over its part of the hour, those with
/// telemetry only.
async fn hour_rows(store: &Store, hour_ms: i64, now_ms: i64) -> Result<Vec<AllocationHour>, StoreError> {
    let held = store.metered(None, hour_ms, hour_ms + HOUR_MS).await?;
    let spans: Vec<(usize, &str, i64, i64)> = held
        .iter()
        .enumerate()
        .filter_map(|(i, a)| {
            let device = a.device_uuid.as_deref()?;
            let s = a.activated_at_ms.max(hour_ms);
            let e = a.released_at_ms.unwrap_or(i64::MAX).min(hour_ms + HOUR_MS);
            (s < e).then_some((i, device, s, e))
        })
        .collect();
    let sums = span_sums(store, &spans, now_ms).await?;
    let mut rows: Vec<AllocationHour> = sums
        .into_iter()
        .filter(|(_, (_, samples))| *samples > 0)
        .map(|(i, (weighted, samples))| AllocationHour { allocation_id: held[i].id.clone(), weighted, samples })
        .collect();
    rows.sort_by(|a, b| a.allocation_id.cmp(&b.allocation_id));
    Ok(rows)
}

/// Per allocation of `of` (`(owner, allocation, its use [s, e) in the report)`), the sums of its device's
/// utilisation over `[s, e)`: its kept hours where they cover it, the stored series for the rest. `metered` holds
/// the allocations' activation, release and device.
pub async fn use_sums(
    store: &Store,
    metered: &[Metered],
    of: &[(usize, &str, i64, i64)],
    now_ms: i64,
) -> Result<HashMap<usize, (f64, i64)>, StoreError> {
    // Read again when kept hours were forgotten or dropped meanwhile (their rows may be gone); at last with none
    // taken as kept, from the series alone.
    let mut kept = store.allocation_hours_kept().await?;
    for _ in 0..3 {
        let sums = use_sums_with(store, metered, of, kept, now_ms).await?;
        let after = store.allocation_hours_kept().await?;
        let same = |a: Option<HoursKept>, b: Option<HoursKept>| {
            a.map(|k| (k.from_ms, k.epoch)) == b.map(|k| (k.from_ms, k.epoch))
        };
        if same(kept, after) {
            return Ok(sums);
        }
        kept = after;
    }
    use_sums_with(store, metered, of, None, now_ms).await
}

/// [`use_sums`] with the hours `kept` taken as kept.
async fn use_sums_with(
    store: &Store,
    metered: &[Metered],
    of: &[(usize, &str, i64, i64)],
    kept: Option<HoursKept>,
    now_ms: i64,
) -> Result<HashMap<usize, (f64, i64)>, StoreError> {
    let by_id: HashMap<&str, &Metered> = metered.iter().map(|m| (m.id.as_str(), m)).collect();
    let mut hours: Vec<(usize, String, i64, i64)> = Vec::new();
    let mut spans: Vec<(usize, &str, i64, i64)> = Vec::new();
    for &(owner, id, s, e) in of {
        let Some(a) = by_id.get(id).copied() else { continue };
        let Some(device) = a.device_uuid.as_deref() else { continue };
        let (from, to) = kept.map_or((0, 0), |k| (k.from_ms, k.to_ms));
        let cover = tessera_core::rollup::kept_cover(s, e, a.activated_at_ms, a.released_at_ms, from, to);
        if let Some((lo, hi)) = cover.hours {
            hours.push((owner, id.to_string(), lo, hi));
        }
        spans.extend(cover.rest.into_iter().map(|(a, b)| (owner, device, a, b)));
    }
    let mut sums = span_sums(store, &spans, now_ms).await?;
    let windows: Vec<(String, i64, i64)> = hours.iter().map(|(_, id, lo, hi)| (id.clone(), *lo, *hi)).collect();
    for ((owner, ..), (weighted, samples)) in hours.iter().zip(store.allocation_hour_sums(&windows).await?) {
        let sum = sums.entry(*owner).or_default();
        sum.0 += weighted;
        sum.1 += samples;
    }
    Ok(sums)
}
