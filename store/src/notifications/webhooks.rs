//! Webhook endpoints: a tenant's or the platform's, the event types they want, their signing secrets (rotated with
//! an overlap, sealed at rest by the services), and the test event sent to one of them.

use crate::writes::audit_insert;
use crate::{Store, StoreError, new_id, now_ms, on_constraint, to_json};

/// A webhook endpoint as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookRecord {
    /// Its id.
    pub id: String,
    /// Its tenant (`None`: platform-wide).
    pub tenant_id: Option<String>,
    /// Where deliveries are posted.
    pub url: String,
    /// `standard` (CloudEvents, signed) or `slack` (`{"text": ...}`).
    pub format: String,
    /// Type patterns (empty: every type).
    pub types: Vec<String>,
    /// Free text.
    pub description: String,
    /// The signing secret (`whsec_...`).
    pub secret: String,
    /// The secret before the last rotation, still signing until `previous_until_ms`.
    pub previous_secret: Option<String>,
    /// Until when the previous secret signs too.
    pub previous_until_ms: Option<i64>,
    /// Who made it.
    pub created_by: String,
    /// When, UTC ms.
    pub created_at_ms: i64,
}

/// What a new endpoint is.
#[derive(Debug, Clone)]
pub struct NewWebhook<'a> {
    pub tenant_id: Option<&'a str>,
    pub url: &'a str,
    pub format: &'a str,
    pub types: &'a [String],
    pub description: &'a str,
    pub secret: &'a str,
    pub actor: &'a str,
}

/// An endpoint's secrets as stored (sealed, or plain text from before sealing).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct StoredSecrets {
    pub id: String,
    pub secret: String,
    pub previous_secret: Option<String>,
}

/// The columns of a [`WebhookRow`], and the table.
pub(super) const WEBHOOK_COLUMNS: &str = "id, tenant_id, url, format, CAST(types AS TEXT) AS types, description, \
                                          secret, previous_secret, previous_until_ms, created_by, created_at_ms \
                                          FROM webhooks";
/// An endpoint row (the columns of [`WEBHOOK_COLUMNS`]): the types as JSON.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct WebhookRow {
    id: String,
    tenant_id: Option<String>,
    url: String,
    format: String,
    types: String,
    description: String,
    secret: String,
    previous_secret: Option<String>,
    previous_until_ms: Option<i64>,
    created_by: String,
    created_at_ms: i64,
}

pub(super) fn webhook_from(r: WebhookRow) -> WebhookRecord {
    WebhookRecord {
        id: r.id,
        tenant_id: r.tenant_id,
        url: r.url,
        format: r.format,
        types: serde_json::from_str(&r.types).unwrap_or_default(),
        description: r.description,
        secret: r.secret,
        previous_secret: r.previous_secret,
        previous_until_ms: r.previous_until_ms,
        created_by: r.created_by,
        created_at_ms: r.created_at_ms,
    }
}

impl Store {
    /// Creates an endpoint.
    pub async fn create_webhook(&self, new: NewWebhook<'_>) -> Result<WebhookRecord, StoreError> {
        let w = WebhookRecord {
            id: new_id(),
            tenant_id: new.tenant_id.map(str::to_string),
            url: new.url.to_string(),
            format: new.format.to_string(),
            types: new.types.to_vec(),
            description: new.description.to_string(),
            secret: new.secret.to_string(),
            previous_secret: None,
            previous_until_ms: None,
            created_by: new.actor.to_string(),
            created_at_ms: now_ms(),
        };
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            sqlx::query(&format!(
                "INSERT INTO webhooks (id, tenant_id, url, format, types, description, secret, created_by, \
                 created_at_ms) VALUES ($1, $2, $3, $4, {}, $6, $7, $8, $9)",
                dialect.json(5)
            ))
            .bind(&w.id)
            .bind(&w.tenant_id)
            .bind(&w.url)
            .bind(&w.format)
            .bind(to_json(&w.types))
            .bind(&w.description)
            .bind(&w.secret)
            .bind(&w.created_by)
            .bind(w.created_at_ms)
            .execute(&mut *tx)
            .await
            .map_err(|e| on_constraint(e, "webhooks"))?;
            let after = serde_json::json!({"tenant_id": w.tenant_id, "url": w.url, "format": w.format, "types": w.types});
            audit_insert(&mut tx, new.actor, "webhook.create", &format!("webhook/{}", w.id), None,
                Some(after.to_string())).await?;
            tx.commit().await?;
        });
        Ok(w)
    }

    /// The endpoints of a tenant (`Some`), or the platform's (`None`), oldest first.
    pub async fn webhooks(&self, tenant_id: Option<&str>) -> Result<Vec<WebhookRecord>, StoreError> {
        let sql = format!(
            "SELECT {WEBHOOK_COLUMNS} WHERE (tenant_id = $1 OR (CAST($1 AS TEXT) IS NULL AND tenant_id IS NULL)) \
             ORDER BY created_at_ms, id"
        );
        let rows: Vec<WebhookRow> =
            on_pool!(self, pool, _dialect => sqlx::query_as(&sql).bind(tenant_id).fetch_all(pool).await?);
        Ok(rows.into_iter().map(webhook_from).collect())
    }

    /// An endpoint by id.
    pub async fn webhook(&self, id: &str) -> Result<WebhookRecord, StoreError> {
        let sql = format!("SELECT {WEBHOOK_COLUMNS} WHERE id = $1");
        let row: Option<WebhookRow> =
            on_pool!(self, pool, _dialect => sqlx::query_as(&sql).bind(id).fetch_optional(pool).await?);
        row.map(webhook_from).ok_or_else(|| StoreError::NotFound { what: format!("webhook {id}") })
    }

    /// Deletes an endpoint and its deliveries.
    ///
    /// Locks are taken in the order the delivery workers take them, so that a delete never deadlocks with one: the
    /// endpoint first (the dispatcher's new deliveries wait for it, or it for them), then its deliveries in id order
    /// (the order [`Store::finish_deliveries`] updates them in), then the rows go.
    pub async fn delete_webhook(&self, id: &str, actor: &str) -> Result<(), StoreError> {
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let found: Option<(String,)> =
                sqlx::query_as(&format!("SELECT id FROM webhooks WHERE id = $1{}", dialect.lock()))
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await?;
            if found.is_none() {
                return Err(StoreError::NotFound { what: format!("webhook {id}") });
            }
            let _: Vec<(i64,)> = sqlx::query_as(&format!(
                "SELECT id FROM webhook_deliveries WHERE webhook_id = $1 ORDER BY id{}",
                dialect.lock()
            ))
            .bind(id)
            .fetch_all(&mut *tx)
            .await?;
            sqlx::query("DELETE FROM webhook_deliveries WHERE webhook_id = $1").bind(id).execute(&mut *tx).await?;
            sqlx::query("DELETE FROM webhooks WHERE id = $1").bind(id).execute(&mut *tx).await?;
            audit_insert(&mut tx, actor, "webhook.delete", &format!("webhook/{id}"), None, None)
                .await?;
            tx.commit().await?;
            Ok(())
        })
    }

    /// Replaces an endpoint's secret with `secret`; the old one signs too until `overlap_until_ms`.
    pub async fn rotate_webhook_secret(
        &self,
        id: &str,
        secret: &str,
        overlap_until_ms: i64,
        actor: &str,
    ) -> Result<WebhookRecord, StoreError> {
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let done = sqlx::query(
                "UPDATE webhooks SET previous_secret = secret, previous_until_ms = $2, secret = $3 WHERE id = $1",
            )
            .bind(id)
            .bind(overlap_until_ms)
            .bind(secret)
            .execute(&mut *tx)
            .await?;
            if done.rows_affected() == 0 {
                return Err(StoreError::NotFound { what: format!("webhook {id}") });
            }
            let after = serde_json::json!({ "previous_until_ms": overlap_until_ms });
            audit_insert(&mut tx, actor, "webhook.rotate", &format!("webhook/{id}"), None,
                Some(after.to_string())).await?;
            tx.commit().await?;
        });
        self.webhook(id).await
    }

    /// Every endpoint's stored secrets (for sealing them again at start).
    pub async fn webhook_secrets(&self) -> Result<Vec<StoredSecrets>, StoreError> {
        let sql = "SELECT id, secret, previous_secret FROM webhooks ORDER BY id";
        Ok(on_pool!(self, pool, _dialect => sqlx::query_as(sql).fetch_all(pool).await?))
    }

    /// Replaces an endpoint's stored secrets with `new` when they are still `old` (a rotation in between wins);
    /// whether they were replaced.
    pub async fn reseal_webhook_secrets(&self, old: &StoredSecrets, new: &StoredSecrets) -> Result<bool, StoreError> {
        let done = on_pool!(self, pool, _dialect => {
            sqlx::query(
                "UPDATE webhooks SET secret = $2, previous_secret = $3 WHERE id = $1 AND secret = $4 \
                 AND previous_secret IS NOT DISTINCT FROM $5",
            )
            .bind(&old.id)
            .bind(&new.secret)
            .bind(&new.previous_secret)
            .bind(&old.secret)
            .bind(&old.previous_secret)
            .execute(pool)
            .await?
            .rows_affected()
        });
        Ok(done == 1)
    }

    /// Queues a `webhook.test` event for one endpoint only; its event id.
    pub async fn test_webhook(&self, w: &WebhookRecord, actor: &str) -> Result<String, StoreError> {
        let id = new_id();
        let data = serde_json::json!({ "actor": actor, "action": "webhook.test", "before": null,
            "after": { "webhook": w.id } });
        on_pool!(self, pool, dialect => {
            sqlx::query(&format!(
                "INSERT INTO events (id, type, tenant_id, subject, at_ms, data, webhook_id) \
                 VALUES ($1, 'webhook.test', $2, $3, $4, {}, $6)",
                dialect.json(5)
            ))
            .bind(&id)
            .bind(&w.tenant_id)
            .bind(format!("webhook/{}", w.id))
            .bind(now_ms())
            .bind(data.to_string())
            .bind(&w.id)
            .execute(pool)
            .await?;
        });
        Ok(id)
    }
}
