//! Downsampled telemetry (one row per device and minute) and the allocation intervals usage is metered from.
//!
//! The SQL is the same on both backends; see [`on_pool!`].

use std::collections::HashMap;

use tessera_core::rollup::Tier;

use super::{Store, StoreError};
use crate::windows::{Placeholders, Summed, WINDOWS_PER_QUERY, windowed_sums_sql};

/// One device's minute.
#[derive(Debug, Clone, PartialEq)]
pub struct MinuteRow {
    /// `GPU-...` or `MIG-...`.
    pub device: String,
    /// Start of the minute, ms since the epoch.
    pub minute_ms: i64,
    /// The node.
    pub node_id: String,
    /// The GPU's UUID.
    pub gpu: String,
    /// MIG profile, for an instance.
    pub profile: Option<String>,
    /// MIG start unit, for an instance.
    pub start: Option<u8>,
    /// Samples in it.
    pub samples: i64,
    /// Mean utilisation, %.
    pub util_avg: f64,
    /// Highest utilisation, %.
    pub util_max: f64,
    /// Mean memory used, MiB.
    pub mem_used_avg: f64,
    /// Highest memory used, MiB (`None` on rows written before it was kept).
    pub mem_used_max: Option<f64>,
    /// Memory total, MiB.
    pub mem_total: f64,
    /// Mean power, W.
    pub power_avg: Option<f64>,
    /// Highest temperature, °C.
    pub temp_max: Option<f64>,
}

/// Rows per statement (15 parameters each, well under SQLite's limit).
const CHUNK: usize = 200;

/// A stored minute row.
#[derive(Debug, sqlx::FromRow)]
struct StoredMinute {
    device: String,
    minute_ms: i64,
    node_id: String,
    gpu: String,
    profile: Option<String>,
    start: Option<i64>,
    samples: i64,
    util_avg: f64,
    util_max: f64,
    mem_used_avg: f64,
    mem_total: f64,
    power_avg: Option<f64>,
    temp_max: Option<f64>,
    mem_used_max: Option<f64>,
}

fn from_row(r: StoredMinute) -> MinuteRow {
    MinuteRow {
        device: r.device,
        minute_ms: r.minute_ms,
        node_id: r.node_id,
        gpu: r.gpu,
        profile: r.profile,
        start: r.start.and_then(|s| u8::try_from(s).ok()),
        samples: r.samples,
        util_avg: r.util_avg,
        util_max: r.util_max,
        mem_used_avg: r.mem_used_avg,
        mem_total: r.mem_total,
        power_avg: r.power_avg,
        temp_max: r.temp_max,
        mem_used_max: r.mem_used_max,
    }
}

/// A device's utilisation over minutes: what a sample-weighted mean needs.
#[derive(Debug, sqlx::FromRow)]
struct UtilSum {
    device: String,
    /// Sum of `util_avg × samples`.
    weighted: f64,
    samples: i64,
}

/// How many of a device's minutes had one mean utilisation (a whole percent), and their highest memory in use.
#[derive(Debug, sqlx::FromRow)]
struct UtilBucket {
    pct: i64,
    minutes: i64,
    peak_mem_mib: Option<f64>,
}

/// [`UtilBucket`] of one window of [`Store::devices_use`].
#[derive(Debug, sqlx::FromRow)]
struct WindowBucket {
    k: i64,
    pct: i64,
    minutes: i64,
    peak_mem_mib: Option<f64>,
}

/// An allocation in use, with where it ran (a row, or on SQLite an array of its columns in this order).
#[derive(Debug, sqlx::FromRow, serde::Deserialize)]
struct MeteredRow {
    id: String,
    request_id: String,
    tenant_id: String,
    tenant_name: String,
    node: String,
    gpu_uuid: String,
    model: String,
    profile: String,
    start: i64,
    mig_enabled: bool,
    state: String,
    activated_at_ms: i64,
    released_at_ms: Option<i64>,
    device_uuid: Option<String>,
}

/// One device's minutes in a window ([`Store::device_use`]).
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceUse {
    /// Minutes with telemetry.
    pub minutes: u32,
    /// Highest memory in use, MiB.
    pub peak_mem_mib: Option<f64>,
    /// Minutes per mean utilisation rounded to a whole percent.
    pub util_minutes: [u64; 101],
}

/// A live or past allocation with the times it was in use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metered {
    /// Allocation id.
    pub id: String,
    /// Its request.
    pub request_id: String,
    /// Its tenant.
    pub tenant_id: String,
    /// The tenant's name.
    pub tenant_name: String,
    /// Node name.
    pub node: String,
    /// GPU UUID.
    pub gpu_uuid: String,
    /// Catalog model key.
    pub model: String,
    /// MIG profile, or the sharing key of a whole-GPU share.
    pub profile: String,
    /// Start unit.
    pub start: u8,
    /// Whether the GPU is in MIG mode.
    pub mig_enabled: bool,
    /// `active` or `released`.
    pub state: String,
    /// When it became active.
    pub activated_at_ms: i64,
    /// When it was released.
    pub released_at_ms: Option<i64>,
    /// MIG or GPU UUID.
    pub device_uuid: Option<String>,
}

/// The SQL of [`Store::window_sums`] for `n` windows of `tier`, bound `k, device, lo, hi` per window.
fn window_sums_sql(dialect: crate::dialect::Dialect, tier: Tier, n: usize) -> String {
    windowed_sums_sql(dialect, series_summed(tier), n)
}

/// A telemetry series as [`windowed_sums_sql`] sums it: by device and bucket start.
const fn series_summed(tier: Tier) -> Summed {
    Summed { table: table(tier), key: "device", time: "minute_ms", weighted: "m.util_avg * m.samples" }
}

/// The SQL of [`Store::devices_use`] for `n` windows of `tier`, bound `k, device, from_ms` per window and then
/// `to_ms`; held to one range scan of the primary key per window as [`window_sums_sql`] is.
fn devices_use_sql(dialect: crate::dialect::Dialect, tier: Tier, n: usize) -> String {
    let mut p = Placeholders::new(dialect);
    let values: Vec<String> = (0..n)
        .map(|_| format!("(CAST({} AS BIGINT), CAST({} AS TEXT), CAST({} AS BIGINT))", p.next(), p.next(), p.next()))
        .collect();
    let values = values.join(", ");
    let to = p.next();
    let from_table = table(tier);
    let buckets = "CAST(ROUND(m.util_avg) AS BIGINT) AS pct, CAST(SUM(m.minutes) AS BIGINT) AS minutes, \
                   MAX(COALESCE(m.mem_used_max, m.mem_used_avg)) AS peak_mem_mib";
    let range = format!("m.device = w.device AND m.minute_ms >= w.from_ms AND m.minute_ms < {to}");
    match dialect {
        crate::dialect::Dialect::Sqlite => format!(
            "WITH w(k, device, from_ms) AS (VALUES {values}) SELECT w.k, {buckets} FROM w CROSS JOIN {from_table} m \
             ON {range} GROUP BY w.k, CAST(ROUND(m.util_avg) AS BIGINT)"
        ),
        crate::dialect::Dialect::Postgres => format!(
            "WITH w(k, device, from_ms) AS (VALUES {values}) SELECT w.k, b.pct, b.minutes, b.peak_mem_mib FROM w \
             CROSS JOIN LATERAL (SELECT {buckets} FROM {from_table} m WHERE {range} \
             GROUP BY CAST(ROUND(m.util_avg) AS BIGINT)) b"
        ),
    }
}

/// The table holding a series.
pub(crate) const fn table(tier: Tier) -> &'static str {
    match tier {
        Tier::Minute => "telemetry_minutes",
        Tier::TenMinutes => "telemetry_tenminutes",
        Tier::Hour => "telemetry_hours",
    }
}

/// How a row written into a series merges with the one already stored for its device and bucket: means weighted
/// by samples, maxima kept, minutes with telemetry added up to the bucket's length. The same rule as [`merge`].
fn merge_sql(tier: Tier) -> String {
    let t = table(tier);
    let minutes = tier.minutes();
    format!(
        "ON CONFLICT (device, minute_ms) DO UPDATE SET \
    util_avg = ({t}.util_avg * {t}.samples + excluded.util_avg * excluded.samples) \
        / ({t}.samples + excluded.samples), \
    util_max = CASE WHEN {t}.util_max > excluded.util_max THEN {t}.util_max ELSE excluded.util_max END, \
    mem_used_avg = ({t}.mem_used_avg * {t}.samples + excluded.mem_used_avg * excluded.samples) \
        / ({t}.samples + excluded.samples), \
    mem_total = excluded.mem_total, \
    power_avg = CASE WHEN excluded.power_avg IS NULL THEN {t}.power_avg \
        WHEN {t}.power_avg IS NULL THEN excluded.power_avg \
        ELSE ({t}.power_avg * {t}.samples + excluded.power_avg * excluded.samples) \
        / ({t}.samples + excluded.samples) END, \
    temp_max = CASE WHEN {t}.temp_max > excluded.temp_max \
        THEN {t}.temp_max ELSE COALESCE(excluded.temp_max, {t}.temp_max) END, \
    mem_used_max = CASE WHEN {t}.mem_used_max > excluded.mem_used_max \
        THEN {t}.mem_used_max ELSE COALESCE(excluded.mem_used_max, {t}.mem_used_max) END, \
    minutes = CASE WHEN {t}.minutes + excluded.minutes > {minutes} THEN {minutes} \
        ELSE {t}.minutes + excluded.minutes END, \
    samples = {t}.samples + excluded.samples"
    )
}

/// A row of one series as it is written: a minute, or minutes folded into a longer bucket.
#[derive(Debug, Clone)]
struct Folded {
    row: MinuteRow,
    minutes: i64,
}

/// Folds `b` into `a` (same device and bucket), as [`merge_sql`] does in the database.
fn merge(a: &mut Folded, b: &MinuteRow, bucket_minutes: i64) {
    let (wa, wb) = (a.row.samples.max(0) as f64, b.samples.max(0) as f64);
    let total = wa + wb;
    let mean = |x: f64, y: f64| if total > 0.0 { (x * wa + y * wb) / total } else { (x + y) / 2.0 };
    let r = &mut a.row;
    r.util_avg = mean(r.util_avg, b.util_avg);
    r.util_max = r.util_max.max(b.util_max);
    r.mem_used_avg = mean(r.mem_used_avg, b.mem_used_avg);
    r.mem_total = b.mem_total;
    r.power_avg = match (r.power_avg, b.power_avg) {
        (Some(x), Some(y)) => Some(mean(x, y)),
        (x, y) => x.or(y),
    };
    r.temp_max = max_of(r.temp_max, b.temp_max);
    r.mem_used_max = max_of(r.mem_used_max, b.mem_used_max);
    r.samples += b.samples;
    a.minutes = (a.minutes + 1).min(bucket_minutes);
}

fn max_of(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, y) => x.or(y),
    }
}

/// The rows of `tier` that `rows` (minutes) make: one per device and bucket, in a stable order.
fn fold(rows: &[MinuteRow], tier: Tier) -> Vec<Folded> {
    let mut out: Vec<Folded> = Vec::new();
    let mut at: HashMap<(&str, i64), usize> = HashMap::new();
    for r in rows {
        let bucket = tier.bucket_of(r.minute_ms);
        match at.get(&(r.device.as_str(), bucket)) {
            Some(&i) => merge(&mut out[i], r, tier.minutes()),
            None => {
                at.insert((r.device.as_str(), bucket), out.len());
                out.push(Folded { row: MinuteRow { minute_ms: bucket, ..r.clone() }, minutes: 1 });
            }
        }
    }
    out
}

/// What [`Store::keep_telemetry`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Kept {
    /// Rows deleted past their series' retention.
    pub rows_deleted: u64,
    /// Partitions made ahead of time (PostgreSQL).
    pub partitions_made: u32,
    /// Whole partitions dropped past the retention (PostgreSQL).
    pub partitions_dropped: u32,
}

/// How wide one PostgreSQL partition of a series is: a day of minutes, a week of 10 minutes, 30 days of hours
/// (a few partitions each within its retention, so that dropping a partition frees most of what is past it).
pub const fn partition_ms(tier: Tier) -> i64 {
    match tier {
        Tier::Minute => 86_400_000,
        Tier::TenMinutes => 7 * 86_400_000,
        Tier::Hour => 30 * 86_400_000,
    }
}

/// The name of the partition of `tier` that starts at `start_ms` (`telemetry_minutes_20261129`).
fn partition_name(tier: Tier, start_ms: i64) -> String {
    let (y, m, d) = tessera_core::clock::civil(start_ms.div_euclid(86_400_000));
    format!("{}_{y:04}{m:02}{d:02}", table(tier))
}

/// The start of the partition named `name` of `tier`, if it is one of Tessera's.
fn partition_start(tier: Tier, name: &str) -> Option<i64> {
    let date = name.strip_prefix(table(tier))?.strip_prefix('_')?;
    if date.len() != 8 || !date.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (y, m, d) = (date[..4].parse().ok()?, date[4..6].parse().ok()?, date[6..].parse().ok()?);
    Some(tessera_core::clock::days_from_civil(y, m, d) * 86_400_000)
}

/// A partition of a series (PostgreSQL).
#[derive(Debug, sqlx::FromRow)]
struct Partition {
    name: String,
}

/// Rows and bytes one series holds ([`Store::telemetry_footprint`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint {
    /// The series.
    pub tier: Tier,
    /// Rows stored.
    pub rows: i64,
    /// Bytes on disk, table and indexes (PostgreSQL: every partition's; SQLite: their pages, from `dbstat`).
    pub bytes: i64,
}

impl Store {
    /// Writes minute rows, and folds them into the 10-minute and hour series, in one transaction; a row for a
    /// device and bucket already stored is merged into it (means weighted by sample counts, maxima kept), so a
    /// minute that arrives in parts, or late, is counted once in every series. Minutes late enough that their hour
    /// may be kept ([`tessera_core::rollup::late_for_kept_hours`]) forget the kept hours from theirs on.
    pub async fn write_minutes(&self, rows: &[MinuteRow]) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        let series: Vec<(Tier, Vec<Folded>)> = Tier::ALL.into_iter().map(|t| (t, fold(rows, t))).collect();
        // A bulk write: an approval's writes go first (see [`crate::turns`]).
        self.bulk_turn().await;
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            for (tier, folded) in &series {
                let merge = merge_sql(*tier);
                for chunk in folded.chunks(CHUNK) {
                    // SQLite: anonymous `?` placeholders. sqlx looks each numbered one up by its name, a scan of
                    // the statement's names, so 3,000 numbered ones cost millions of steps a statement (a fifth
                    // of the server's CPU under 10,000 agents).
                    let numbered = !matches!(dialect, crate::dialect::Dialect::Sqlite);
                    let values: Vec<String> = (0..chunk.len())
                        .map(|i| {
                            let b = i * 15;
                            let p: Vec<String> = (1..=15)
                                .map(|k| if numbered { format!("${}", b + k) } else { "?".to_string() })
                                .collect();
                            format!("({})", p.join(", "))
                        })
                        .collect();
                    let sql = format!(
                        "INSERT INTO {} (device, minute_ms, node_id, gpu, profile, start, samples, util_avg, \
                         util_max, mem_used_avg, mem_total, power_avg, temp_max, mem_used_max, minutes) VALUES {} \
                         {merge}",
                        table(*tier),
                        values.join(", ")
                    );
                    let mut q = sqlx::query(&sql);
                    for Folded { row: r, minutes } in chunk {
                        q = q
                            .bind(&r.device)
                            .bind(r.minute_ms)
                            .bind(&r.node_id)
                            .bind(&r.gpu)
                            .bind(&r.profile)
                            .bind(r.start.map(i64::from))
                            .bind(r.samples)
                            .bind(r.util_avg)
                            .bind(r.util_max)
                            .bind(r.mem_used_avg)
                            .bind(r.mem_total)
                            .bind(r.power_avg)
                            .bind(r.temp_max)
                            .bind(r.mem_used_max)
                            .bind(*minutes);
                    }
                    q.execute(&mut *tx).await?;
                }
            }
            // Minutes of an hour that may be kept already: it is worked out again, with them. Last, so that the
            // progress row is held only for the commit; judged now, after any wait for the write lock.
            let now = crate::now_ms();
            let late = rows.iter().map(|r| r.minute_ms).filter(|&m| tessera_core::rollup::late_for_kept_hours(m, now));
            if let Some(first) = late.min() {
                crate::allocation_hours::forget_kept_hours(&mut *tx, first).await?;
            }
            tx.commit().await?;
            Ok(())
        })
    }

    /// Minute rows with `from_ms <= minute_ms < to_ms`, of one node or all, by device then time.
    pub async fn minutes(&self, node_id: Option<&str>, from_ms: i64, to_ms: i64) -> Result<Vec<MinuteRow>, StoreError> {
        self.series(Tier::Minute, node_id, from_ms, to_ms).await
    }

    /// Rows of a series whose bucket starts in `[from_ms, to_ms)` (`minute_ms` is the bucket's start), of one node
    /// or all, by device then time.
    pub async fn series(
        &self,
        tier: Tier,
        node_id: Option<&str>,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<MinuteRow>, StoreError> {
        let sql = format!(
            "SELECT device, minute_ms, node_id, gpu, profile, CAST(start AS BIGINT) AS start, \
             CAST(samples AS BIGINT) AS samples, \
             util_avg, util_max, mem_used_avg, mem_total, power_avg, temp_max, mem_used_max FROM {} \
             WHERE minute_ms >= $1 AND minute_ms < $2 AND ($3 IS NULL OR node_id = $3) \
             ORDER BY device, minute_ms",
            table(tier)
        );
        on_pool!(self, pool, _dialect => {
            let rows: Vec<StoredMinute> =
                sqlx::query_as(&sql).bind(from_ms).bind(to_ms).bind(node_id).fetch_all(pool).await?;
            Ok(rows.into_iter().map(from_row).collect())
        })
    }

    /// Per device, the utilisation of a series' rows whose bucket starts in `[from_ms, to_ms)` as `(device, sum of
    /// util_avg × samples, samples)`: what a sample-weighted mean needs, without reading every row.
    pub async fn util_sums(&self, tier: Tier, from_ms: i64, to_ms: i64) -> Result<Vec<(String, f64, i64)>, StoreError> {
        let sql = format!(
            "SELECT device, CAST(SUM(util_avg * samples) AS DOUBLE PRECISION) AS weighted, \
             CAST(SUM(samples) AS BIGINT) AS samples FROM {} \
             WHERE minute_ms >= $1 AND minute_ms < $2 GROUP BY device ORDER BY device",
            table(tier)
        );
        let rows: Vec<UtilSum> = on_pool!(self, pool, _dialect => {
            sqlx::query_as(&sql).bind(from_ms).bind(to_ms).fetch_all(pool).await?
        });
        Ok(rows.into_iter().map(|u| (u.device, u.weighted, u.samples)).collect())
    }

    /// Per window `(device, lo, hi)`, the utilisation of the device's rows of a series whose bucket starts in
    /// `[lo, hi)`, as `(sum of util_avg × samples, samples)`: what a sample-weighted mean needs, in the order asked
    /// ([`tessera_core::rollup::mean_parts`] says which rows make a mean). One grouped query per 300 windows (windows sharing a range: per 1,000 keys), each
    /// window one indexed range scan (both sums from the same rows).
    pub async fn window_sums(&self, tier: Tier, windows: &[(String, i64, i64)]) -> Result<Vec<(f64, i64)>, StoreError> {
        self.windowed_sums(series_summed(tier), windows).await
    }

    /// One device's rows of a series whose bucket starts in `[from_ms, to_ms)` as right-sizing reads them: how many
    /// minutes had telemetry, the highest memory in use (each row's peak, or its mean on rows written before peaks
    /// were kept), and how many minutes had each mean utilisation rounded to a whole percent (`util_minutes[p]`,
    /// clamped to 0-100; a longer row's minutes all count at its mean). One indexed range scan, grouped in the
    /// database.
    pub async fn device_use(
        &self,
        tier: Tier,
        device: &str,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<DeviceUse, StoreError> {
        let sql = format!(
            "SELECT CAST(ROUND(util_avg) AS BIGINT) AS pct, CAST(SUM(minutes) AS BIGINT) AS minutes, \
             MAX(COALESCE(mem_used_max, mem_used_avg)) AS peak_mem_mib FROM {} \
             WHERE device = $1 AND minute_ms >= $2 AND minute_ms < $3 GROUP BY CAST(ROUND(util_avg) AS BIGINT)",
            table(tier)
        );
        let rows: Vec<UtilBucket> = on_pool!(self, pool, _dialect => {
            sqlx::query_as(&sql).bind(device).bind(from_ms).bind(to_ms).fetch_all(pool).await?
        });
        let mut out = DeviceUse { minutes: 0, peak_mem_mib: None, util_minutes: [0; 101] };
        for UtilBucket { pct, minutes: n, peak_mem_mib: mem } in rows {
            let n = u64::try_from(n).unwrap_or(0);
            out.util_minutes[usize::try_from(pct.clamp(0, 100)).unwrap_or(0)] += n;
            out.minutes = out.minutes.saturating_add(u32::try_from(n).unwrap_or(u32::MAX));
            if let Some(m) = mem {
                out.peak_mem_mib = Some(out.peak_mem_mib.map_or(m, |p: f64| p.max(m)));
            }
        }
        Ok(out)
    }

    /// [`Store::device_use`] of many windows at once: `windows[k]` is `(device, from_ms)`, each read up to `to_ms`;
    /// the answer is in the same order. One grouped query per 300 windows (windows sharing a range: per 1,000 keys), each window one indexed range scan.
    pub async fn devices_use(
        &self,
        tier: Tier,
        windows: &[(String, i64)],
        to_ms: i64,
    ) -> Result<Vec<DeviceUse>, StoreError> {
        let mut out = vec![DeviceUse { minutes: 0, peak_mem_mib: None, util_minutes: [0; 101] }; windows.len()];
        for (c, chunk) in windows.chunks(WINDOWS_PER_QUERY).enumerate() {
            let rows: Vec<WindowBucket> = on_pool!(self, pool, dialect => {
                let sql = devices_use_sql(dialect, tier, chunk.len());
                let mut q = sqlx::query_as(&sql);
                for (i, (device, from)) in chunk.iter().enumerate() {
                    q = q.bind(i64::try_from(c * WINDOWS_PER_QUERY + i).unwrap_or(i64::MAX)).bind(device).bind(from);
                }
                q.bind(to_ms).fetch_all(pool).await?
            });
            for WindowBucket { k, pct, minutes: n, peak_mem_mib: mem } in rows {
                let Some(u) = usize::try_from(k).ok().and_then(|k| out.get_mut(k)) else { continue };
                let n = u64::try_from(n).unwrap_or(0);
                u.util_minutes[usize::try_from(pct.clamp(0, 100)).unwrap_or(0)] += n;
                u.minutes = u.minutes.saturating_add(u32::try_from(n).unwrap_or(u32::MAX));
                if let Some(m) = mem {
                    u.peak_mem_mib = Some(u.peak_mem_mib.map_or(m, |p: f64| p.max(m)));
                }
            }
        }
        Ok(out)
    }

    /// The plans the database makes for [`Store::window_sums`] and [`Store::devices_use`] of `windows` windows on
    /// `tier`, and for `windows` windows sharing one range (SQLite: `EXPLAIN QUERY PLAN`'s steps; PostgreSQL:
    /// `EXPLAIN`'s lines), in that order: what the
    /// query-plan test checks, as the plan a database chooses can change with the number of windows.
    pub async fn window_read_plans(&self, tier: Tier, windows: usize) -> Result<[String; 3], StoreError> {
        let n = windows.clamp(1, WINDOWS_PER_QUERY);
        let mut out = [String::new(), String::new(), String::new()];
        for (slot, sums) in out.iter_mut().zip([true, false]) {
            *slot = on_pool!(self, pool, dialect => {
                let (sql, per) = if sums {
                    (window_sums_sql(dialect, tier, n), 4)
                } else {
                    (devices_use_sql(dialect, tier, n), 3)
                };
                let explain = match dialect {
                    crate::dialect::Dialect::Sqlite => format!("EXPLAIN QUERY PLAN {sql}"),
                    crate::dialect::Dialect::Postgres => format!("EXPLAIN (COSTS OFF) {sql}"),
                };
                let mut q = sqlx::query(&explain);
                for i in 0..n {
                    q = q.bind(i64::try_from(i).unwrap_or(0)).bind(format!("GPU-{i}")).bind(0_i64);
                    if per == 4 {
                        q = q.bind(60_000_i64);
                    }
                }
                if per == 3 {
                    q = q.bind(60_000_i64);
                }
                let rows = q.fetch_all(pool).await?;
                let column = match dialect {
                    crate::dialect::Dialect::Sqlite => "detail",
                    crate::dialect::Dialect::Postgres => "QUERY PLAN",
                };
                let mut lines = Vec::new();
                for r in &rows {
                    lines.push(sqlx::Row::try_get::<String, _>(r, column)?);
                }
                lines.join("\n")
            });
        }
        // Windows sharing their range, read as one range of their keys.
        let keys: Vec<String> = (0..n).map(|i| format!("GPU-{i}")).collect();
        let sql = crate::windows::shared_range_sums_sql;
        out[2] = match &self.db {
            crate::Db::Sqlite(pool) => {
                let rows: Vec<(i64, i64, i64, String)> = sqlx::query_as(&format!(
                    "EXPLAIN QUERY PLAN {}",
                    sql(crate::dialect::Dialect::Sqlite, series_summed(tier))
                ))
                .bind(serde_json::to_string(&keys).unwrap_or_default())
                .bind(0_i64)
                .bind(60_000_i64)
                .fetch_all(pool)
                .await?;
                rows.into_iter().map(|r| r.3).collect::<Vec<_>>().join("\n")
            }
            crate::Db::Postgres(pool) => {
                let rows: Vec<(String,)> = sqlx::query_as(&format!(
                    "EXPLAIN (COSTS OFF) {}",
                    sql(crate::dialect::Dialect::Postgres, series_summed(tier))
                ))
                .bind(&keys)
                .bind(0_i64)
                .bind(60_000_i64)
                .fetch_all(pool)
                .await?;
                rows.into_iter().map(|r| r.0).collect::<Vec<_>>().join("\n")
            }
        };
        Ok(out)
    }

    /// How many active allocations hold each of `devices` now (a device time-sliced or under MPS has several);
    /// devices nobody holds are left out. Read through the index of active allocations by device, 500 at a time.
    pub async fn device_holders(&self, devices: &[String]) -> Result<HashMap<String, u32>, StoreError> {
        let mut out = HashMap::new();
        for chunk in devices.chunks(500) {
            let rows: Vec<(String, i64)> = on_pool!(self, pool, _dialect, Db => {
                let mut q = sqlx::QueryBuilder::<Db>::new(
                    "SELECT device_uuid, CAST(COUNT(*) AS BIGINT) FROM allocations WHERE state = 'active' \
                     AND device_uuid IN (",
                );
                let mut list = q.separated(", ");
                for d in chunk {
                    list.push_bind(d.clone());
                }
                q.push(") GROUP BY device_uuid");
                q.build_query_as::<(String, i64)>().fetch_all(pool).await?
            });
            out.extend(rows.into_iter().map(|(d, n)| (d, u32::try_from(n).unwrap_or(u32::MAX))));
        }
        Ok(out)
    }

    /// Deletes minute rows older than `before_ms`; returns how many.
    pub async fn prune_minutes(&self, before_ms: i64) -> Result<u64, StoreError> {
        self.prune_series(Tier::Minute, before_ms).await
    }

    /// Deletes a series' rows whose bucket starts before `before_ms`; returns how many.
    pub async fn prune_series(&self, tier: Tier, before_ms: i64) -> Result<u64, StoreError> {
        let sql = format!("DELETE FROM {} WHERE minute_ms < $1", table(tier));
        on_pool!(self, pool, _dialect => {
            Ok(sqlx::query(&sql).bind(before_ms).execute(pool).await?.rows_affected())
        })
    }

    /// Keeps each series within its retention at `now_ms` ([`Tier::kept_from`]). On PostgreSQL, first makes the
    /// partitions from the retention's start to two partitions ahead (rows the default partition holds for one are
    /// moved into it), then drops every partition wholly past the retention, then deletes what is left past it
    /// (rows of the partition the retention's edge falls in, and of the default partition). On SQLite, deletes by
    /// the time index; the freed pages are reused, so the file stays at the size the retention needs.
    pub async fn keep_telemetry(&self, now_ms: i64) -> Result<Kept, StoreError> {
        let mut kept = Kept::default();
        for tier in Tier::ALL {
            let cutoff = tier.kept_from(now_ms);
            if let crate::Db::Postgres(pool) = &self.db {
                let width = partition_ms(tier);
                let existing: Vec<Partition> = sqlx::query_as(
                    "SELECT c.relname::TEXT AS name FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
                     JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = $1",
                )
                .bind(table(tier))
                .fetch_all(pool)
                .await?;
                let starts: Vec<(String, i64)> = existing
                    .into_iter()
                    .filter_map(|p| Some((p.name.clone(), partition_start(tier, &p.name)?)))
                    .collect();
                for (name, start) in &starts {
                    if start + width <= cutoff {
                        sqlx::query(&format!("DROP TABLE IF EXISTS {name}")).execute(pool).await?;
                        kept.partitions_dropped += 1;
                    }
                }
                let mut start = cutoff.div_euclid(width) * width;
                while start <= now_ms + 2 * width {
                    if !starts.iter().any(|(_, s)| *s == start) {
                        make_partition(pool, tier, start, width).await?;
                        kept.partitions_made += 1;
                    }
                    start += width;
                }
            }
            kept.rows_deleted += self.prune_series(tier, cutoff).await?;
        }
        Ok(kept)
    }

    /// Frees the row versions merges left behind in every series (PostgreSQL's `VACUUM`, what its autovacuum does
    /// in time; nothing on SQLite, which updates rows in place).
    pub async fn vacuum_telemetry(&self) -> Result<(), StoreError> {
        if let crate::Db::Postgres(pool) = &self.db {
            for tier in Tier::ALL {
                sqlx::query(&format!("VACUUM {}", table(tier))).execute(pool).await?;
            }
        }
        Ok(())
    }

    /// Rows and bytes each series holds now: what the bytes stored per device are measured from.
    pub async fn telemetry_footprint(&self) -> Result<Vec<Footprint>, StoreError> {
        let mut out = Vec::new();
        for tier in Tier::ALL {
            let t = table(tier);
            let count = format!("SELECT CAST(COUNT(*) AS BIGINT) FROM {t}");
            let (rows, bytes): (i64, i64) = match &self.db {
                crate::Db::Postgres(pool) => {
                    let rows: i64 = sqlx::query_scalar(&count).fetch_one(pool).await?;
                    let bytes: i64 = sqlx::query_scalar(
                        "SELECT CAST(COALESCE(SUM(pg_total_relation_size(relid)), 0) AS BIGINT) \
                         FROM pg_partition_tree($1::regclass)",
                    )
                    .bind(t)
                    .fetch_one(pool)
                    .await?;
                    (rows, bytes)
                }
                crate::Db::Sqlite(pool) => {
                    let rows: i64 = sqlx::query_scalar(&count).fetch_one(pool).await?;
                    let bytes: i64 = sqlx::query_scalar(
                        "SELECT CAST(COALESCE(SUM(pgsize), 0) AS BIGINT) FROM dbstat WHERE name = $1 \
                         OR name IN (SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = $1)",
                    )
                    .bind(t)
                    .fetch_one(pool)
                    .await?;
                    (rows, bytes)
                }
            };
            out.push(Footprint { tier, rows, bytes });
        }
        Ok(out)
    }

    /// Allocations in use at some time in `[from_ms, to_ms)` (activated before `to_ms`, not released before
    /// `from_ms`), of one tenant or all.
    pub async fn metered(&self, tenant_id: Option<&str>, from_ms: i64, to_ms: i64) -> Result<Vec<Metered>, StoreError> {
        on_pool!(self, pool, dialect => {
            // The fleet's through the release index (those released in the period, and those still held); a
            // tenant's through the tenant index. Sorted here, so that neither plan is led by the order. SQLite
            // answers them as one JSON array (sqlx hands its rows over one by one, at about 25 us each: a
            // fleet's day of 3,000 allocations took 100 ms).
            let from_where = "FROM allocations a JOIN gpus g ON g.id = a.gpu_id JOIN nodes n ON n.id = g.node_id \
                 JOIN tenants t ON t.id = a.tenant_id \
                 WHERE a.activated_at_ms IS NOT NULL AND a.activated_at_ms < $1 \
                 AND (a.released_at_ms IS NULL OR a.released_at_ms > $2)";
            let of_tenant = if tenant_id.is_some() { " AND a.tenant_id = $3" } else { "" };
            let mut rows: Vec<MeteredRow> = match dialect {
                crate::dialect::Dialect::Sqlite => {
                    let sql = format!(
                        "SELECT json_group_array(json_array(a.id, a.request_id, a.tenant_id, t.name, n.name, g.uuid, \
                         g.model, a.profile, a.start, json(CASE WHEN g.mig_enabled THEN 'true' ELSE 'false' END), \
                         a.state, a.activated_at_ms, a.released_at_ms, a.device_uuid)) {from_where}{of_tenant}"
                    );
                    let q = sqlx::query_as(&sql).bind(to_ms).bind(from_ms);
                    let (json,): (String,) = match tenant_id {
                        Some(t) => q.bind(t).fetch_one(pool).await?,
                        None => q.fetch_one(pool).await?,
                    };
                    serde_json::from_str(&json).map_err(|e| StoreError::Corrupt(format!("metered allocations: {e}")))?
                }
                crate::dialect::Dialect::Postgres => {
                    let sql = format!(
                        "SELECT a.id, a.request_id, a.tenant_id, t.name AS tenant_name, n.name AS node, \
                         g.uuid AS gpu_uuid, g.model, a.profile, CAST(a.start AS BIGINT) AS start, g.mig_enabled, \
                         a.state, a.activated_at_ms, a.released_at_ms, a.device_uuid {from_where}{of_tenant}"
                    );
                    let q = sqlx::query_as(&sql).bind(to_ms).bind(from_ms);
                    match tenant_id {
                        Some(t) => q.bind(t).fetch_all(pool).await?,
                        None => q.fetch_all(pool).await?,
                    }
                }
            };
            rows.sort_unstable_by(|a, b| (&a.tenant_id, &a.id).cmp(&(&b.tenant_id, &b.id)));
            Ok(rows
                .into_iter()
                .map(|r| Metered {
                    id: r.id,
                    request_id: r.request_id,
                    tenant_id: r.tenant_id,
                    tenant_name: r.tenant_name,
                    node: r.node,
                    gpu_uuid: r.gpu_uuid,
                    model: r.model,
                    profile: r.profile,
                    start: u8::try_from(r.start).unwrap_or(0),
                    mig_enabled: r.mig_enabled,
                    state: r.state,
                    activated_at_ms: r.activated_at_ms,
                    released_at_ms: r.released_at_ms,
                    device_uuid: r.device_uuid,
                })
                .collect())
        })
    }
}

/// Makes the partition of `tier` for `[start, start + width)` unless it exists, moving into it the rows the default
/// partition holds for its range; one replica at a time (an advisory lock), in one transaction.
async fn make_partition(pool: &sqlx::PgPool, tier: Tier, start: i64, width: i64) -> Result<(), StoreError> {
    let (t, name, end) = (table(tier), partition_name(tier, start), start + width);
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(7310000001)").execute(&mut *tx).await?;
    let range = format!("minute_ms >= {start} AND minute_ms < {end}");
    sqlx::query(&format!("CREATE TEMPORARY TABLE moving ON COMMIT DROP AS SELECT * FROM {t}_default WHERE {range}"))
        .execute(&mut *tx)
        .await?;
    sqlx::query(&format!("DELETE FROM {t}_default WHERE {range}")).execute(&mut *tx).await?;
    // A rollup's row is merged into again and again while its bucket runs: room in its page lets each merge be a
    // heap-only update that the next visit to the page cleans up, so the table stays near twice its live rows.
    let fill = if tier == Tier::Minute { 90 } else { 50 };
    sqlx::query(&format!(
        "CREATE TABLE IF NOT EXISTS {name} PARTITION OF {t} FOR VALUES FROM ({start}) TO ({end}) \
         WITH (fillfactor = {fill})"
    ))
    .execute(&mut *tx)
    .await?;
    sqlx::query(&format!("INSERT INTO {t} SELECT * FROM moving")).execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(())
}
