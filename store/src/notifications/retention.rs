//! Retention: what the notifications keep is forgotten after a while.

use crate::{Store, StoreError};

impl Store {
    /// Forgets what is older than `before_ms`: deliveries no longer pending, then dispatched events that no delivery
    /// refers to. How many events it removed.
    pub async fn purge_notifications(&self, before_ms: i64) -> Result<u64, StoreError> {
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            sqlx::query("DELETE FROM webhook_deliveries WHERE state <> 'pending' AND first_at_ms < $1")
                .bind(before_ms)
                .execute(&mut *tx)
                .await?;
            sqlx::query("DELETE FROM email_deliveries WHERE state <> 'pending' AND first_at_ms < $1")
                .bind(before_ms)
                .execute(&mut *tx)
                .await?;
            sqlx::query("DELETE FROM notices WHERE at_ms < $1")
                .bind(before_ms)
                .execute(&mut *tx)
                .await?;
            let done = sqlx::query(
                "DELETE FROM events WHERE dispatched = 1 AND at_ms < $1 \
                 AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.event_seq = events.seq) \
                 AND NOT EXISTS (SELECT 1 FROM email_deliveries m WHERE m.event_seq = events.seq)",
            )
            .bind(before_ms)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(done.rows_affected())
        })
    }
}
