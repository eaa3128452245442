//! Reminders: an active request whose end is near is told once per lead time (`request.expiring`).

use tessera_core::event;

use crate::writes::REQUEST_COLUMNS;
use crate::{RequestRow, Store, StoreError, new_id, request_from};

/// Who sends reminders, in events' data.
pub const REMINDER: &str = "system:reminder";

impl Store {
    /// Tells active requests whose end is near (`tessera_core::event::expiry_reminder`): one `request.expiring`
    /// event per request and lead time, written with the note that it was sent. How many it wrote.
    pub async fn remind_expiring(&self, now_ms: i64) -> Result<usize, StoreError> {
        let horizon = now_ms.saturating_add(event::EXPIRY_REMINDERS_MS[0]);
        let sql = format!(
            "SELECT {} WHERE state = 'active' AND expires_at_ms > $1 AND expires_at_ms <= $2 ORDER BY id",
            REQUEST_COLUMNS
        );
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let rows: Vec<RequestRow> =
                sqlx::query_as(&sql).bind(now_ms).bind(horizon).fetch_all(&mut *tx).await?;
            let mut written = 0;
            for row in rows {
                let r = request_from(row)?;
                let (Some(end), Some(duration)) = (r.expires_at_ms, r.duration_s) else { continue };
                let duration_ms = i64::try_from(duration).unwrap_or(i64::MAX / 2).saturating_mul(1000);
                let Some(lead) = event::expiry_reminder(duration_ms, end, now_ms) else { continue };
                let done = sqlx::query(
                    "INSERT INTO reminders (request_id, kind, at_ms) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                )
                .bind(&r.id)
                .bind(lead)
                .bind(now_ms)
                .execute(&mut *tx)
                .await?;
                if done.rows_affected() == 0 {
                    continue;
                }
                let mut after = serde_json::to_value(&r).unwrap_or_default();
                after["minutes_left"] = serde_json::json!((end - now_ms) / 60_000);
                after["reminder_ms"] = serde_json::json!(lead);
                let data = serde_json::json!({ "actor": REMINDER, "action": "request.expiring", "before": null,
                    "after": after });
                sqlx::query(&format!(
                    "INSERT INTO events (id, type, tenant_id, subject, at_ms, data) \
                     VALUES ($1, 'request.expiring', $2, $3, $4, {})",
                    dialect.json(5)
                ))
                .bind(new_id())
                .bind(&r.tenant_id)
                .bind(format!("request/{}", r.id))
                .bind(now_ms)
                .bind(data.to_string())
                .execute(&mut *tx)
                .await?;
                written += 1;
            }
            tx.commit().await?;
            Ok(written)
        })
    }
}
