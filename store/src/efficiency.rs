//! The price list per GPU model, and the fleet efficiency history: MIG capacity sampled per slot, and per UTC day
//! the slice-hours held, measured and used. One SQL body for both backends (see [`super::dialect`]).

use super::writes::audit_insert;
use super::{Store, StoreError, now_ms, to_json};

/// One day of capacity, summed over its samples, per model.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct CapacityDay {
    /// Start of the UTC day, ms.
    pub day_ms: i64,
    /// Catalog model key.
    pub model: String,
    /// Sums over the day's samples.
    pub gpus: i64,
    /// Sum of allocated compute slices.
    pub allocated: i64,
    /// Sum of placeable compute slices.
    pub placeable: i64,
    /// Sum of stranded compute slices.
    pub stranded: i64,
    /// Sum of free compute slices on cordoned GPUs.
    pub cordoned: i64,
    /// Samples taken that day (of any model).
    pub samples: i64,
}

/// One day of use of one model.
#[derive(Debug, Clone, Default, PartialEq, sqlx::FromRow)]
pub struct DayUse {
    /// Start of the UTC day, ms.
    pub day_ms: i64,
    /// Catalog model key.
    pub model: String,
    /// Compute-slice-hours held.
    pub held_slice_hours: f64,
    /// Of those, with a known utilisation.
    pub measured_slice_hours: f64,
    /// Measured, weighted by utilisation.
    pub used_slice_hours: f64,
    /// GPU-hours held.
    pub held_gpu_hours: f64,
    /// GPU-hours measured and unused.
    pub wasted_gpu_hours: f64,
}

/// A capacity sample of one model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CapacitySample {
    /// MIG GPUs.
    pub gpus: u32,
    /// Allocated compute slices.
    pub allocated: u32,
    /// Placeable compute slices.
    pub placeable: u32,
    /// Stranded compute slices.
    pub stranded: u32,
    /// Free compute slices on cordoned GPUs.
    pub cordoned: u32,
}

/// The stored price list: `(model, currency, per GPU-hour, set at ms, set by)` per model.
pub type PriceRow = (String, String, f64, i64, String);

/// A row of [`PriceRow`].
#[derive(Debug, sqlx::FromRow)]
struct StoredPrice {
    model: String,
    currency: String,
    per_gpu_hour: f64,
    updated_at_ms: i64,
    updated_by: String,
}

/// A price as the audit entry of a change keeps it.
#[derive(Debug, sqlx::FromRow)]
struct PriceEntry {
    model: String,
    currency: String,
    per_gpu_hour: f64,
}

const DAY_MS: i64 = 86_400_000;

impl Store {
    /// The price list, by model.
    pub async fn prices(&self) -> Result<Vec<PriceRow>, StoreError> {
        let sql = "SELECT model, currency, per_gpu_hour, updated_at_ms, updated_by FROM gpu_prices ORDER BY model";
        let rows: Vec<StoredPrice> = on_pool!(self, pool, _dialect => sqlx::query_as(sql).fetch_all(pool).await?);
        Ok(rows.into_iter().map(|p| (p.model, p.currency, p.per_gpu_hour, p.updated_at_ms, p.updated_by)).collect())
    }

    /// Replaces the price list whole, in one transaction (`prices.set` in the audit log, with the lists before and
    /// after).
    pub async fn set_prices(&self, currency: &str, prices: &[(String, f64)], actor: &str) -> Result<(), StoreError> {
        let now = now_ms();
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let before: Vec<PriceEntry> =
                sqlx::query_as("SELECT model, currency, per_gpu_hour FROM gpu_prices ORDER BY model")
                    .fetch_all(&mut *tx)
                    .await?;
            let entry = |(model, currency, price): (&str, &str, f64)| {
                serde_json::json!({"model": model, "currency": currency, "per_gpu_hour": price})
            };
            let before: Vec<_> = before.iter().map(|p| entry((&p.model, &p.currency, p.per_gpu_hour))).collect();
            sqlx::query("DELETE FROM gpu_prices").execute(&mut *tx).await?;
            for (model, price) in prices {
                sqlx::query(
                    "INSERT INTO gpu_prices (model, currency, per_gpu_hour, updated_at_ms, updated_by) \
                     VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(model)
                .bind(currency)
                .bind(price)
                .bind(now)
                .bind(actor)
                .execute(&mut *tx)
                .await?;
            }
            let after: Vec<_> = prices.iter().map(|(m, p)| entry((m, currency, *p))).collect();
            audit_insert(&mut tx, actor, "prices.set", "prices", Some(to_json(&before)), Some(to_json(&after))).await?;
            tx.commit().await?;
            Ok(())
        })
    }

    /// Records the capacity of each model in the sampling slot starting at `slot_ms`; a slot already sampled (by
    /// this or another replica) takes the newer figures and still counts once.
    pub async fn record_capacity(&self, slot_ms: i64, models: &[(String, CapacitySample)]) -> Result<(), StoreError> {
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            for (model, c) in models {
                sqlx::query(
                    "INSERT INTO capacity_samples (slot_ms, model, gpus, allocated, placeable, stranded, cordoned) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (slot_ms, model) DO UPDATE SET \
                     gpus = excluded.gpus, allocated = excluded.allocated, placeable = excluded.placeable, \
                     stranded = excluded.stranded, cordoned = excluded.cordoned",
                )
                .bind(slot_ms)
                .bind(model)
                .bind(i64::from(c.gpus))
                .bind(i64::from(c.allocated))
                .bind(i64::from(c.placeable))
                .bind(i64::from(c.stranded))
                .bind(i64::from(c.cordoned))
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            Ok(())
        })
    }

    /// Writes the use of each model on the day starting at `day_ms`, in place of what was there: each model's row
    /// upserted, then the day's rows this write did not touch removed (two replicas writing at once cannot collide).
    pub async fn record_day_use(&self, day_ms: i64, rows: &[DayUse]) -> Result<(), StoreError> {
        let now = now_ms();
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            for r in rows {
                sqlx::query(
                    "INSERT INTO efficiency_days (day_ms, model, held_slice_hours, measured_slice_hours, \
                     used_slice_hours, held_gpu_hours, wasted_gpu_hours, updated_at_ms) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (day_ms, model) DO UPDATE SET \
                     held_slice_hours = excluded.held_slice_hours, measured_slice_hours = excluded.measured_slice_hours, \
                     used_slice_hours = excluded.used_slice_hours, held_gpu_hours = excluded.held_gpu_hours, \
                     wasted_gpu_hours = excluded.wasted_gpu_hours, updated_at_ms = excluded.updated_at_ms",
                )
                .bind(day_ms)
                .bind(&r.model)
                .bind(r.held_slice_hours)
                .bind(r.measured_slice_hours)
                .bind(r.used_slice_hours)
                .bind(r.held_gpu_hours)
                .bind(r.wasted_gpu_hours)
                .bind(now)
                .execute(&mut *tx)
                .await?;
            }
            sqlx::query("DELETE FROM efficiency_days WHERE day_ms = $1 AND updated_at_ms < $2")
                .bind(day_ms)
                .bind(now)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(())
        })
    }

    /// When the use of the day starting at `day_ms` was last written (`None`: never, or nothing was held).
    pub async fn day_use_written(&self, day_ms: i64) -> Result<Option<i64>, StoreError> {
        let sql = "SELECT MAX(updated_at_ms) FROM efficiency_days WHERE day_ms = $1";
        let row: (Option<i64>,) =
            on_pool!(self, pool, _dialect => sqlx::query_as(sql).bind(day_ms).fetch_one(pool).await?);
        Ok(row.0)
    }

    /// The history from the day starting at `from_day_ms`: per day and model, capacity summed over the day's
    /// samples (with their number); and per day and model, the use.
    pub async fn efficiency_history(&self, from_day_ms: i64) -> Result<(Vec<CapacityDay>, Vec<DayUse>), StoreError> {
        // The samples of each day are counted in the same statement as the sums: one snapshot on both backends.
        let capacity = "SELECT d.day AS day_ms, d.model, d.gpus, d.allocated, d.placeable, d.stranded, d.cordoned, \
                        (SELECT CAST(COUNT(DISTINCT c.slot_ms) AS BIGINT) FROM capacity_samples c \
                         WHERE c.slot_ms >= d.day AND c.slot_ms < d.day + 86400000) AS samples \
                        FROM (SELECT slot_ms - slot_ms % 86400000 AS day, model, CAST(SUM(gpus) AS BIGINT) AS gpus, \
                        CAST(SUM(allocated) AS BIGINT) AS allocated, CAST(SUM(placeable) AS BIGINT) AS placeable, \
                        CAST(SUM(stranded) AS BIGINT) AS stranded, CAST(SUM(cordoned) AS BIGINT) AS cordoned \
                        FROM capacity_samples WHERE slot_ms >= $1 \
                        GROUP BY slot_ms - slot_ms % 86400000, model) d ORDER BY d.day, d.model";
        let used = "SELECT day_ms, model, held_slice_hours, measured_slice_hours, used_slice_hours, held_gpu_hours, \
                    wasted_gpu_hours FROM efficiency_days WHERE day_ms >= $1 ORDER BY day_ms, model";
        Ok(on_pool!(self, pool, _dialect => (
            sqlx::query_as(capacity).bind(from_day_ms).fetch_all(pool).await?,
            sqlx::query_as(used).bind(from_day_ms).fetch_all(pool).await?,
        )))
    }

    /// Deletes the history from before the day holding `before_ms`; how many rows.
    pub async fn prune_efficiency(&self, before_ms: i64) -> Result<u64, StoreError> {
        let day = before_ms - before_ms.rem_euclid(DAY_MS);
        on_pool!(self, pool, _dialect => {
            let a = sqlx::query("DELETE FROM capacity_samples WHERE slot_ms < $1").bind(day).execute(pool).await?;
            let b = sqlx::query("DELETE FROM efficiency_days WHERE day_ms < $1").bind(day).execute(pool).await?;
            Ok(a.rows_affected() + b.rows_affected())
        })
    }
}
