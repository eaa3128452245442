//! Downsampled telemetry (one row per device and minute) and the allocation intervals usage is metered from.
//!
//! The SQL is the same on both backends; see [`on_pool!`].

use tessera_api::telemetry::Metric;

use super::{Store, StoreError};

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

/// One heatmap cell of the minute series ([`Store::minute_cells`]).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct MinuteCell {
    /// `GPU-...` or `MIG-...`.
    pub device: String,
    /// The node.
    pub node_id: String,
    /// The GPU's UUID.
    pub gpu: String,
    /// MIG profile, for an instance.
    pub profile: Option<String>,
    /// MIG start unit, for an instance.
    pub start: Option<i64>,
    /// The column, from 0.
    pub col: i64,
    /// The column's value.
    pub value: Option<f64>,
}

/// Rows per statement (14 parameters each, well under SQLite's limit).
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

/// An allocation's device utilisation summed over the minutes of its use ([`Store::use_means`]).
#[derive(Debug, sqlx::FromRow)]
struct UseMean {
    id: String,
    /// Sum of `util_avg × samples`.
    weighted: f64,
    samples: i64,
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

/// An allocation in use, with where it ran.
#[derive(Debug, sqlx::FromRow)]
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

const MERGE: &str = "ON CONFLICT (device, minute_ms) DO UPDATE SET \
    util_avg = (telemetry_minutes.util_avg * telemetry_minutes.samples + excluded.util_avg * excluded.samples) \
        / (telemetry_minutes.samples + excluded.samples), \
    util_max = CASE WHEN telemetry_minutes.util_max > excluded.util_max \
        THEN telemetry_minutes.util_max ELSE excluded.util_max END, \
    mem_used_avg = (telemetry_minutes.mem_used_avg * telemetry_minutes.samples \
        + excluded.mem_used_avg * excluded.samples) / (telemetry_minutes.samples + excluded.samples), \
    mem_total = excluded.mem_total, \
    power_avg = CASE WHEN excluded.power_avg IS NULL THEN telemetry_minutes.power_avg \
        WHEN telemetry_minutes.power_avg IS NULL THEN excluded.power_avg \
        ELSE (telemetry_minutes.power_avg * telemetry_minutes.samples + excluded.power_avg * excluded.samples) \
        / (telemetry_minutes.samples + excluded.samples) END, \
    temp_max = CASE WHEN telemetry_minutes.temp_max > excluded.temp_max \
        THEN telemetry_minutes.temp_max ELSE COALESCE(excluded.temp_max, telemetry_minutes.temp_max) END, \
    mem_used_max = CASE WHEN telemetry_minutes.mem_used_max > excluded.mem_used_max \
        THEN telemetry_minutes.mem_used_max ELSE COALESCE(excluded.mem_used_max, telemetry_minutes.mem_used_max) END, \
    samples = telemetry_minutes.samples + excluded.samples";

impl Store {
    /// Writes minute rows in one transaction; a row for a device and minute already stored is merged into it
    /// (means weighted by sample counts, maxima kept).
    pub async fn write_minutes(&self, rows: &[MinuteRow]) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            for chunk in rows.chunks(CHUNK) {
                let values: Vec<String> = (0..chunk.len())
                    .map(|i| {
                        let b = i * 14;
                        let p: Vec<String> = (1..=14).map(|k| format!("${}", b + k)).collect();
                        format!("({})", p.join(", "))
                    })
                    .collect();
                let sql = format!(
                    "INSERT INTO telemetry_minutes (device, minute_ms, node_id, gpu, profile, start, samples, \
                     util_avg, util_max, mem_used_avg, mem_total, power_avg, temp_max, mem_used_max) VALUES {} {MERGE}",
                    values.join(", ")
                );
                let mut q = sqlx::query(&sql);
                for r in chunk {
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
                        .bind(r.mem_used_max);
                }
                q.execute(&mut *tx).await?;
            }
            tx.commit().await?;
            Ok(())
        })
    }

    /// Minute rows with `from_ms <= minute_ms < to_ms`, of one node or all, by device then time.
    pub async fn minutes(&self, node_id: Option<&str>, from_ms: i64, to_ms: i64) -> Result<Vec<MinuteRow>, StoreError> {
        on_pool!(self, pool, _dialect => {
            let rows: Vec<StoredMinute> = sqlx::query_as(
                "SELECT device, minute_ms, node_id, gpu, profile, CAST(start AS BIGINT) AS start, \
                 CAST(samples AS BIGINT) AS samples, \
                 util_avg, util_max, mem_used_avg, mem_total, power_avg, temp_max, mem_used_max FROM telemetry_minutes \
                 WHERE minute_ms >= $1 AND minute_ms < $2 AND ($3 IS NULL OR node_id = $3) \
                 ORDER BY device, minute_ms",
            )
            .bind(from_ms)
            .bind(to_ms)
            .bind(node_id)
            .fetch_all(pool)
            .await?;
            Ok(rows.into_iter().map(from_row).collect())
        })
    }

    /// A heatmap of the minute series, grouped in the database: per device and column `(minute_ms - from_ms) /
    /// step_ms` of `[from_ms, from_ms + step_ms × columns)`, the sample-weighted mean of `metric` (the highest, for
    /// temperature). Scoped in SQL: with `tenants`, only devices those tenants held an allocation on at some time in
    /// `[from_ms, held_to_ms)`; `None` is the whole fleet. At most `limit` cells are read, so the cost is bounded by
    /// the answer: a caller past it gets `limit` cells and is told the answer is too large.
    #[allow(clippy::too_many_arguments)]
    pub async fn minute_cells(
        &self,
        tenants: Option<&[String]>,
        node_id: Option<&str>,
        metric: Metric,
        from_ms: i64,
        step_ms: i64,
        columns: usize,
        held_to_ms: i64,
        limit: usize,
    ) -> Result<Vec<MinuteCell>, StoreError> {
        if tenants.is_some_and(<[String]>::is_empty) || columns == 0 || step_ms <= 0 {
            return Ok(Vec::new());
        }
        let to_ms = from_ms.saturating_add(step_ms.saturating_mul(i64::try_from(columns).unwrap_or(i64::MAX)));
        // Each metric's value per minute row; rows without one are left out, as are cells without any.
        let value = match metric {
            Metric::Util => "util_avg",
            Metric::MemUsed => "mem_used_avg",
            Metric::MemPct => "CASE WHEN mem_total > 0 THEN mem_used_avg * 100.0 / mem_total END",
            Metric::Power => "power_avg",
            Metric::Temp => "temp_max",
        };
        let cell = if metric == Metric::Temp {
            format!("MAX({value})")
        } else {
            let w = "CASE WHEN samples > 0 THEN samples ELSE 1 END";
            format!("SUM(({value}) * {w}) / SUM({w})")
        };
        on_pool!(self, pool, _dialect, Db => {
            let mut q = sqlx::QueryBuilder::<Db>::new(
                "SELECT device, MAX(node_id) AS node_id, MAX(gpu) AS gpu, MAX(profile) AS profile, \
                 CAST(MAX(start) AS BIGINT) AS start, CAST((minute_ms - ",
            );
            q.push_bind(from_ms).push(") / ").push_bind(step_ms);
            q.push(format!(" AS BIGINT) AS col, CAST({cell} AS DOUBLE PRECISION) AS value FROM telemetry_minutes WHERE minute_ms >= "));
            q.push_bind(from_ms).push(" AND minute_ms < ").push_bind(to_ms);
            q.push(format!(" AND ({value}) IS NOT NULL"));
            if let Some(node) = node_id {
                q.push(" AND node_id = ").push_bind(node.to_string());
            }
            if let Some(tenants) = tenants {
                q.push(
                    " AND device IN (SELECT COALESCE(a.device_uuid, g.uuid) FROM allocations a \
                     JOIN gpus g ON g.id = a.gpu_id WHERE a.activated_at_ms IS NOT NULL AND a.activated_at_ms < ",
                );
                q.push_bind(held_to_ms).push(" AND (a.released_at_ms IS NULL OR a.released_at_ms > ");
                q.push_bind(from_ms).push(") AND a.tenant_id IN (");
                let mut list = q.separated(", ");
                for t in tenants {
                    list.push_bind(t.clone());
                }
                q.push("))");
            }
            q.push(" GROUP BY device, col ORDER BY device, col LIMIT ");
            q.push_bind(i64::try_from(limit).unwrap_or(i64::MAX));
            Ok(q.build_query_as::<MinuteCell>().fetch_all(pool).await?)
        })
    }

    /// Per device, the utilisation of minute rows with `from_ms <= minute_ms < to_ms` as `(device, sum of
    /// util_avg × samples, samples)`: what a sample-weighted mean needs, without reading every row.
    pub async fn util_sums(&self, from_ms: i64, to_ms: i64) -> Result<Vec<(String, f64, i64)>, StoreError> {
        let rows: Vec<UtilSum> = on_pool!(self, pool, _dialect => {
            sqlx::query_as(
                "SELECT device, CAST(SUM(util_avg * samples) AS DOUBLE PRECISION) AS weighted, \
                 CAST(SUM(samples) AS BIGINT) AS samples FROM telemetry_minutes \
                 WHERE minute_ms >= $1 AND minute_ms < $2 GROUP BY device ORDER BY device",
            )
            .bind(from_ms)
            .bind(to_ms)
            .fetch_all(pool)
            .await?
        });
        Ok(rows.into_iter().map(|u| (u.device, u.weighted, u.samples)).collect())
    }

    /// Per allocation of `ids` with a device, the sample-weighted mean utilisation of that device's stored minutes
    /// overlapping its use within `[from_ms, to_ms)` (from its activation to its release, or to `to_ms`):
    /// `(allocation id, mean %)`. Allocations without such a minute are left out. Bounded by the answer: one indexed
    /// range scan of `telemetry_minutes` per allocation asked for, summed in the database, `ids` in chunks of 500.
    pub async fn use_means(&self, ids: &[String], from_ms: i64, to_ms: i64) -> Result<Vec<(String, f64)>, StoreError> {
        let mut means = Vec::new();
        for chunk in ids.chunks(500) {
            let rows: Vec<UseMean> = on_pool!(self, pool, _dialect, Db => {
                let mut q = sqlx::QueryBuilder::<Db>::new(
                    "SELECT a.id, CAST(SUM(m.util_avg * m.samples) AS DOUBLE PRECISION) AS weighted, \
                     CAST(SUM(m.samples) AS BIGINT) AS samples FROM allocations a \
                     JOIN telemetry_minutes m ON m.device = a.device_uuid AND m.minute_ms > (CASE WHEN \
                     a.activated_at_ms > ",
                );
                q.push_bind(from_ms).push(" THEN a.activated_at_ms ELSE ").push_bind(from_ms);
                q.push(" END) - 60000 AND m.minute_ms < (CASE WHEN a.released_at_ms IS NOT NULL AND a.released_at_ms < ");
                q.push_bind(to_ms).push(" THEN a.released_at_ms ELSE ").push_bind(to_ms);
                q.push(" END) WHERE a.activated_at_ms IS NOT NULL AND a.id IN (");
                let mut list = q.separated(", ");
                for id in chunk {
                    list.push_bind(id.clone());
                }
                q.push(") GROUP BY a.id");
                q.build_query_as::<UseMean>().fetch_all(pool).await?
            });
            means.extend(rows.into_iter().filter(|r| r.samples > 0).map(|r| (r.id, r.weighted / r.samples as f64)));
        }
        Ok(means)
    }

    /// One device's minutes with `from_ms <= minute_ms < to_ms` as right-sizing reads them: how many, the highest
    /// memory in use (each minute's peak, or its mean on rows written before peaks were kept), and how many minutes
    /// had each mean utilisation rounded to a whole percent (`util_minutes[p]`, clamped to 0-100). One indexed range
    /// scan, grouped in the database.
    pub async fn device_use(&self, device: &str, from_ms: i64, to_ms: i64) -> Result<DeviceUse, StoreError> {
        let rows: Vec<UtilBucket> = on_pool!(self, pool, _dialect => {
            sqlx::query_as(
                "SELECT CAST(ROUND(util_avg) AS BIGINT) AS pct, CAST(COUNT(*) AS BIGINT) AS minutes, \
                 MAX(COALESCE(mem_used_max, mem_used_avg)) AS peak_mem_mib FROM telemetry_minutes \
                 WHERE device = $1 AND minute_ms >= $2 AND minute_ms < $3 GROUP BY CAST(ROUND(util_avg) AS BIGINT)",
            )
            .bind(device)
            .bind(from_ms)
            .bind(to_ms)
            .fetch_all(pool)
            .await?
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

    /// Deletes minute rows older than `before_ms`; returns how many.
    pub async fn prune_minutes(&self, before_ms: i64) -> Result<u64, StoreError> {
        on_pool!(self, pool, _dialect => {
            let done = sqlx::query("DELETE FROM telemetry_minutes WHERE minute_ms < $1").bind(before_ms).execute(pool).await?;
            Ok(done.rows_affected())
        })
    }

    /// Allocations in use at some time in `[from_ms, to_ms)` (activated before `to_ms`, not released before
    /// `from_ms`), of one tenant or all.
    pub async fn metered(&self, tenant_id: Option<&str>, from_ms: i64, to_ms: i64) -> Result<Vec<Metered>, StoreError> {
        on_pool!(self, pool, _dialect => {
            let rows: Vec<MeteredRow> = sqlx::query_as(
                "SELECT a.id, a.request_id, a.tenant_id, t.name AS tenant_name, n.name AS node, g.uuid AS gpu_uuid, \
                 g.model, a.profile, CAST(a.start AS BIGINT) AS start, g.mig_enabled, a.state, a.activated_at_ms, \
                 a.released_at_ms, a.device_uuid \
                 FROM allocations a JOIN gpus g ON g.id = a.gpu_id JOIN nodes n ON n.id = g.node_id \
                 JOIN tenants t ON t.id = a.tenant_id \
                 WHERE a.activated_at_ms IS NOT NULL AND a.activated_at_ms < $1 \
                 AND (a.released_at_ms IS NULL OR a.released_at_ms > $2) AND ($3 IS NULL OR a.tenant_id = $3) \
                 ORDER BY a.tenant_id, a.id",
            )
            .bind(to_ms)
            .bind(from_ms)
            .bind(tenant_id)
            .fetch_all(pool)
            .await?;
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
