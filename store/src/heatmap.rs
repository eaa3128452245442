//! Heatmaps of the stored series, grouped in the database: one cell per device and column, or one per node or GPU
//! model and column.
//!
//! The SQL is the same on both backends; see [`on_pool!`].

use serde::Deserialize;
use sqlx::QueryBuilder;
use tessera_api::telemetry::{HeatmapGroup, Metric};
use tessera_core::rollup::Tier;

use super::{Store, StoreError};
use crate::telemetry::table;

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

/// What a heatmap reads of a stored series: columns `(minute_ms - from_ms) / step_ms` of
/// `[from_ms, from_ms + step_ms × columns)`, `from_ms` and `step_ms` whole buckets of `tier`. Scoped in SQL: with
/// `tenants`, only devices those tenants held an allocation on at some time in `[from_ms, held_to_ms)` (`None` is
/// the whole fleet); with `node_id`, that node's devices; with `model`, the devices of that model's GPUs.
#[derive(Debug, Clone, Copy)]
pub struct CellQuery<'a> {
    /// The series read.
    pub tier: Tier,
    /// The caller's tenants, or `None` for the whole fleet.
    pub tenants: Option<&'a [String]>,
    /// One node's devices only.
    pub node_id: Option<&'a str>,
    /// The devices of this catalog model's GPUs only.
    pub model: Option<&'a str>,
    /// What the cells are.
    pub metric: Metric,
    /// Start of the first column, ms.
    pub from_ms: i64,
    /// Column width, ms.
    pub step_ms: i64,
    /// Number of columns.
    pub columns: usize,
    /// The end of the holding that makes a device visible to `tenants`, ms.
    pub held_to_ms: i64,
}

/// A group's cell ([`Store::group_cells`]): `col` -1 carries how many devices the group has in the whole range.
#[derive(Debug, Clone, PartialEq, Deserialize, sqlx::FromRow)]
pub struct GroupCell {
    /// The node's id or the model's key (`unknown` for a GPU the fleet no longer lists).
    pub key: String,
    /// The column, from 0; -1 for the group's device count.
    pub col: i64,
    /// Devices with a value in the column (in the range, for -1).
    pub devices: i64,
    /// The mean of the devices' values in the column (temperature: the highest).
    pub value: Option<f64>,
}

impl CellQuery<'_> {
    fn end_ms(&self) -> i64 {
        self.from_ms.saturating_add(self.step_ms.saturating_mul(i64::try_from(self.columns).unwrap_or(i64::MAX)))
    }

    fn empty(&self) -> bool {
        self.tenants.is_some_and(<[String]>::is_empty) || self.columns == 0 || self.step_ms <= 0
    }

    /// The metric's value per row (rows without one are left out, as are cells without any).
    fn value(&self) -> &'static str {
        match self.metric {
            Metric::Util => "util_avg",
            Metric::MemUsed => "mem_used_avg",
            Metric::MemPct => "CASE WHEN mem_total > 0 THEN mem_used_avg * 100.0 / mem_total END",
            Metric::Power => "power_avg",
            Metric::Temp => "temp_max",
        }
    }

    /// A device's cell from its rows in the column: sample-weighted mean, or for temperature the highest.
    fn cell(&self) -> String {
        if self.metric == Metric::Temp {
            format!("MAX({})", self.value())
        } else {
            let w = "CASE WHEN samples > 0 THEN samples ELSE 1 END";
            format!("SUM(({}) * {w}) / SUM({w})", self.value())
        }
    }

    /// `SELECT device, node_id, gpu, profile, start, col, value ... GROUP BY device, col`: one cell per device and
    /// column, within the query's scope; with `gpus_only`, GPU rows only (a GPU in MIG mode reports its instances'
    /// use together).
    fn push_device_cells<'q, DB: sqlx::Database>(&'q self, q: &mut QueryBuilder<'q, DB>, gpus_only: bool)
    where
        i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    {
        q.push(
            "SELECT device, MAX(node_id) AS node_id, MAX(gpu) AS gpu, MAX(profile) AS profile, \
             CAST(MAX(start) AS BIGINT) AS start, CAST((minute_ms - ",
        );
        q.push_bind(self.from_ms).push(") / ").push_bind(self.step_ms);
        q.push(format!(
            " AS BIGINT) AS col, CAST({} AS DOUBLE PRECISION) AS value FROM {} WHERE minute_ms >= ",
            self.cell(),
            table(self.tier)
        ));
        q.push_bind(self.from_ms).push(" AND minute_ms < ").push_bind(self.end_ms());
        q.push(format!(" AND ({}) IS NOT NULL", self.value()));
        if gpus_only {
            q.push(" AND profile IS NULL");
        }
        if let Some(node) = self.node_id {
            q.push(" AND node_id = ").push_bind(node);
        }
        if let Some(model) = self.model {
            q.push(" AND gpu IN (SELECT uuid FROM gpus WHERE model = ").push_bind(model).push(")");
        }
        if let Some(tenants) = self.tenants {
            q.push(
                " AND device IN (SELECT COALESCE(a.device_uuid, g.uuid) FROM allocations a \
                 JOIN gpus g ON g.id = a.gpu_id WHERE a.activated_at_ms IS NOT NULL AND a.activated_at_ms < ",
            );
            q.push_bind(self.held_to_ms).push(" AND (a.released_at_ms IS NULL OR a.released_at_ms > ");
            q.push_bind(self.from_ms).push(") AND a.tenant_id IN (");
            let mut list = q.separated(", ");
            for t in tenants {
                list.push_bind(t.as_str());
            }
            q.push(")");
            q.push(")");
        }
        q.push(" GROUP BY device, col");
    }
}

impl Store {
    /// A heatmap of a series, grouped in the database: per device and column `(minute_ms - from_ms) / step_ms` of
    /// `[from_ms, from_ms + step_ms × columns)`, the sample-weighted mean of `metric` (the highest, for
    /// temperature); `from_ms` and `step_ms` are whole buckets of `tier`. Scoped in SQL: with `tenants`, only
    /// devices those tenants held an allocation on at some time in `[from_ms, held_to_ms)`; `None` is the whole
    /// fleet. At most `limit` cells are read, so the cost is bounded by the answer: a caller past it gets `limit`
    /// cells and is told the answer is too large.
    #[allow(clippy::too_many_arguments)]
    pub async fn minute_cells(
        &self,
        tier: Tier,
        tenants: Option<&[String]>,
        node_id: Option<&str>,
        metric: Metric,
        from_ms: i64,
        step_ms: i64,
        columns: usize,
        held_to_ms: i64,
        limit: usize,
    ) -> Result<Vec<MinuteCell>, StoreError> {
        let query = CellQuery { tier, tenants, node_id, model: None, metric, from_ms, step_ms, columns, held_to_ms };
        self.device_cells(&query, limit).await
    }

    /// [`Store::minute_cells`] of a [`CellQuery`] (which may name a model): ordered by device and column, at most
    /// `limit` cells.
    pub async fn device_cells(&self, query: &CellQuery<'_>, limit: usize) -> Result<Vec<MinuteCell>, StoreError> {
        if query.empty() {
            return Ok(Vec::new());
        }
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        on_pool!(self, pool, _dialect, Db => {
            let mut q = QueryBuilder::<Db>::new("");
            query.push_device_cells(&mut q, false);
            q.push(" ORDER BY device, col LIMIT ").push_bind(limit);
            Ok(q.build_query_as::<MinuteCell>().fetch_all(pool).await?)
        })
    }

    /// A heatmap of a series with one row per node or GPU model: per group and column, the mean of its devices'
    /// cells ([`Store::device_cells`]; for temperature the highest) and how many had one, and per group (column -1)
    /// how many devices had a value in the whole range. The whole fleet (`tenants` `None`) is summed from its GPU
    /// rows (a GPU in MIG mode reports its instances' use together); tenants from every device they see. The
    /// caller bounds the answer (groups × columns) before it asks, and refuses one that reaches `limit`.
    /// At most `limit` cells are read.
    pub async fn group_cells(
        &self,
        query: &CellQuery<'_>,
        group: HeatmapGroup,
        limit: usize,
    ) -> Result<Vec<GroupCell>, StoreError> {
        if query.empty() {
            return Ok(Vec::new());
        }
        let (key, join) = match group {
            HeatmapGroup::Node => ("d.node_id", ""),
            HeatmapGroup::Model => ("COALESCE(g.model, 'unknown')", " LEFT JOIN gpus g ON g.uuid = d.gpu"),
            HeatmapGroup::Fleet => ("'fleet'", ""),
        };
        let across = if query.metric == Metric::Temp { "MAX" } else { "AVG" };
        let mut cells: Vec<GroupCell> = on_pool!(self, pool, dialect, Db => {
            // On SQLite one JSON array: sqlx hands its rows over one at a time (see `json_rows`).
            let sqlite = matches!(dialect, crate::dialect::Dialect::Sqlite);
            let head = if sqlite {
                "SELECT json_group_array(json_array(key, col, devices, value)) FROM (SELECT key, col, devices, value FROM ("
            } else {
                "SELECT key, col, devices, value FROM ("
            };
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let mut q = QueryBuilder::<Db>::new("WITH d AS (");
            query.push_device_cells(&mut q, query.tenants.is_none());
            q.push(format!(
                "), k AS (SELECT d.device, d.col, d.value, {key} AS key FROM d{join}) {head}\
                 SELECT key, col, CAST(COUNT(*) AS BIGINT) AS devices, \
                 CAST({across}(value) AS DOUBLE PRECISION) AS value FROM k GROUP BY key, col \
                 UNION ALL SELECT key, CAST(-1 AS BIGINT) AS col, CAST(COUNT(DISTINCT device) AS BIGINT) AS devices, \
                 CAST(NULL AS DOUBLE PRECISION) AS value FROM k GROUP BY key) cells LIMIT "
            ));
            q.push_bind(limit);
            if sqlite {
                q.push(") limited");
            }
            if sqlite {
                let (json,): (String,) = q.build_query_as().fetch_one(pool).await?;
                crate::json_rows::decode(&json, "heatmap groups")?
            } else {
                q.build_query_as::<GroupCell>().fetch_all(pool).await?
            }
        });
        cells.sort_by(|a, b| (&a.key, a.col).cmp(&(&b.key, b.col)));
        Ok(cells)
    }
}
