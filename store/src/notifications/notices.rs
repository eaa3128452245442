//! Findings told once: a sweep's finding (an idle slice) writes its event only when its key was not told before,
//! and is forgotten when it no longer holds, so that it is told again when found again.

use sqlx::QueryBuilder;

use crate::writes::system_event;
use crate::{Store, StoreError, now_ms};

/// An active allocation with the device that serves it.
#[derive(Debug, sqlx::FromRow)]
struct ActiveDevice {
    id: String,
    request_id: String,
    tenant_id: String,
    profile: String,
    device_uuid: String,
    activated_at_ms: i64,
}

impl Store {
    /// Writes an event for a finding once: when `key` was not told before (see the `notices` table). Whether it
    /// wrote it.
    pub async fn tell_once(
        &self,
        key: &str,
        kind: &'static str,
        tenant: Option<&str>,
        subject: &str,
        actor: &str,
        after: serde_json::Value,
    ) -> Result<bool, StoreError> {
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let done = sqlx::query("INSERT INTO notices (key, at_ms) VALUES ($1, $2) ON CONFLICT DO NOTHING")
                .bind(key)
                .bind(now_ms())
                .execute(&mut *tx)
                .await?;
            if done.rows_affected() == 0 {
                return Ok(false);
            }
            system_event(&mut tx, kind, tenant, subject, actor, after).await?;
            tx.commit().await?;
            Ok(true)
        })
    }

    /// Forgets findings told, so that they are told again when found again.
    pub async fn forget_notices(&self, keys: &[String]) -> Result<(), StoreError> {
        if keys.is_empty() {
            return Ok(());
        }
        on_pool!(self, pool, _dialect, DB => {
            for chunk in keys.chunks(500) {
                let mut q = QueryBuilder::<DB>::new("DELETE FROM notices WHERE key IN (");
                let mut list = q.separated(", ");
                for k in chunk {
                    list.push_bind(k.clone());
                }
                q.push(")");
                q.build().execute(pool).await?;
            }
        });
        Ok(())
    }

    /// Active allocations with the device that serves them, prepared ones (a window ahead) left out:
    /// `(id, request, tenant, profile, device, activated at)`.
    pub async fn active_devices(&self) -> Result<Vec<(String, String, String, String, String, i64)>, StoreError> {
        let rows: Vec<ActiveDevice> = on_pool!(self, pool, _dialect => {
            sqlx::query_as(
                "SELECT id, request_id, tenant_id, profile, device_uuid, activated_at_ms FROM allocations \
                 WHERE state = 'active' AND device_uuid IS NOT NULL AND activated_at_ms IS NOT NULL \
                 AND activated_at_ms <= $1 ORDER BY id",
            )
            .bind(now_ms())
            .fetch_all(pool)
            .await?
        });
        Ok(rows
            .into_iter()
            .map(|a| (a.id, a.request_id, a.tenant_id, a.profile, a.device_uuid, a.activated_at_ms))
            .collect())
    }
}
