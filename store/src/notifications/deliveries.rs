//! Webhook deliveries: one event to one endpoint. The sender claims due deliveries for a lease
//! ([`Store::claim_deliveries`], see [`super::lease`]), sends them and records how it went
//! ([`Store::finish_deliveries`]); an endpoint receives a subject's events in order, since a delivery waits while an
//! earlier one of its subject to the same endpoint is pending.

use std::collections::HashMap;

use sqlx::QueryBuilder;

use super::events::{EVENT_COLUMNS, EventRecord};
use super::lease::{LeaseQueue, after_attempt};
use super::webhooks::{WEBHOOK_COLUMNS, WebhookRecord, WebhookRow, webhook_from};
use crate::{Store, StoreError, now_ms};

/// One event to one endpoint.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct DeliveryRecord {
    pub id: i64,
    pub webhook_id: String,
    pub event_id: String,
    pub kind: String,
    pub subject: String,
    /// `pending`, `delivered` or `failed`.
    pub state: String,
    pub attempts: i64,
    pub first_at_ms: i64,
    pub next_at_ms: i64,
    pub last_status: Option<i64>,
    pub last_error: String,
    pub delivered_at_ms: Option<i64>,
}

/// A delivery claimed for sending: the delivery, its endpoint and its event.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub delivery: i64,
    pub attempts: i64,
    pub first_at_ms: i64,
    pub webhook: WebhookRecord,
    pub event: EventRecord,
}

/// How sending a delivery went: the answer's status, or why there was none.
#[derive(Debug, Clone)]
pub struct Sent {
    pub delivery: i64,
    pub attempts: i64,
    pub first_at_ms: i64,
    pub status: Option<u16>,
    pub error: String,
}

impl Sent {
    fn ok(&self) -> bool {
        self.status.is_some_and(|s| (200..300).contains(&s))
    }
}

/// The columns of a [`DeliveryRecord`], and the tables.
const DELIVERY_COLUMNS: &str = "d.id, d.webhook_id, e.id AS event_id, e.type AS kind, d.subject, d.state, d.attempts, \
                                d.first_at_ms, d.next_at_ms, d.last_status, d.last_error, d.delivered_at_ms \
                                FROM webhook_deliveries d JOIN events e ON e.seq = d.event_seq";

/// A delivery as claimed, before its endpoint and event are read.
#[derive(Debug, sqlx::FromRow)]
struct ClaimedRow {
    id: i64,
    attempts: i64,
    first_at_ms: i64,
    webhook_id: String,
    event_seq: i64,
}

/// Webhook deliveries: a subject's deliveries to one endpoint go one at a time, in event order.
const DELIVERY_QUEUE: LeaseQueue = LeaseQueue {
    table: "webhook_deliveries",
    alias: "d",
    also: " AND NOT EXISTS (SELECT 1 FROM webhook_deliveries o WHERE o.webhook_id = d.webhook_id \
            AND o.subject = d.subject AND o.state = 'pending' AND o.event_seq < d.event_seq)",
    order: "d.event_seq",
};

impl Store {
    /// Claims up to `limit` due deliveries for `lease_ms` (none whose subject has an earlier delivery pending to
    /// the same endpoint), with their endpoints and events.
    pub async fn claim_deliveries(&self, limit: u32, lease_ms: i64) -> Result<Vec<Claimed>, StoreError> {
        let now = now_ms();
        on_pool!(self, pool, dialect, DB => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let rows: Vec<ClaimedRow> = DELIVERY_QUEUE
                .claim(
                    &mut tx,
                    "d.id, d.attempts, d.first_at_ms, d.webhook_id, d.event_seq FROM webhook_deliveries d",
                    now,
                    limit,
                    lease_ms,
                )
                .await?;
            if rows.is_empty() {
                return Ok(Vec::new());
            }
            let mut q = QueryBuilder::<DB>::new(format!("SELECT {WEBHOOK_COLUMNS} WHERE id IN ("));
            let mut list = q.separated(", ");
            for r in &rows {
                list.push_bind(r.webhook_id.clone());
            }
            q.push(")");
            let hooks: Vec<WebhookRow> = q.build_query_as().fetch_all(&mut *tx).await?;
            let hooks: HashMap<String, WebhookRecord> =
                hooks.into_iter().map(webhook_from).map(|w| (w.id.clone(), w)).collect();
            let mut q = QueryBuilder::<DB>::new(format!("SELECT {EVENT_COLUMNS} WHERE seq IN ("));
            let mut list = q.separated(", ");
            for r in &rows {
                list.push_bind(r.event_seq);
            }
            q.push(")");
            let events: Vec<EventRecord> = q.build_query_as().fetch_all(&mut *tx).await?;
            let events: HashMap<i64, EventRecord> = events.into_iter().map(|e| (e.seq, e)).collect();
            tx.commit().await?;
            Ok(rows
                .into_iter()
                .filter_map(|r| {
                    Some(Claimed {
                        delivery: r.id,
                        attempts: r.attempts,
                        first_at_ms: r.first_at_ms,
                        webhook: hooks.get(&r.webhook_id)?.clone(),
                        event: events.get(&r.event_seq)?.clone(),
                    })
                })
                .collect())
        })
    }

    /// Records how sending went: delivered on a 2xx answer; otherwise tried again after the backoff (at most
    /// `cap_ms` between attempts) or, a day after the first attempt, failed.
    pub async fn finish_deliveries(&self, sent: &[Sent], cap_ms: i64) -> Result<(), StoreError> {
        if sent.is_empty() {
            return Ok(());
        }
        let now = now_ms();
        on_pool!(self, pool, dialect => {
            // In id order, as a delete takes them (see `Store::delete_webhook`): two writers never wait on each other.
            let mut sent: Vec<&Sent> = sent.iter().collect();
            sent.sort_unstable_by_key(|s| s.delivery);
            let mut tx = pool.begin_with(dialect.begin()).await?;
            for s in sent {
                let (state, next, delivered, attempts) =
                    after_attempt(s.ok(), false, s.first_at_ms, s.attempts, now, cap_ms);
                let error: String = s.error.chars().take(500).collect();
                sqlx::query(
                    "UPDATE webhook_deliveries SET state = $2, attempts = $3, next_at_ms = $4, lease_until_ms = 0, \
                     last_status = $5, last_error = $6, delivered_at_ms = $7 WHERE id = $1 AND state = 'pending'",
                )
                .bind(s.delivery)
                .bind(state)
                .bind(attempts)
                .bind(next)
                .bind(s.status.map(i64::from))
                .bind(error)
                .bind(delivered)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
        });
        Ok(())
    }

    /// An endpoint's deliveries, newest first, older than `before_id` when given; at most `limit`.
    pub async fn deliveries(
        &self,
        webhook_id: &str,
        before_id: Option<i64>,
        limit: u32,
    ) -> Result<Vec<DeliveryRecord>, StoreError> {
        let sql = format!(
            "SELECT {DELIVERY_COLUMNS} WHERE d.webhook_id = $1 AND (CAST($2 AS BIGINT) IS NULL OR d.id < $2) \
             ORDER BY d.id DESC LIMIT $3"
        );
        Ok(on_pool!(self, pool, _dialect => {
            sqlx::query_as(&sql).bind(webhook_id).bind(before_id).bind(i64::from(limit)).fetch_all(pool).await?
        }))
    }

    /// Sends a delivery again: pending from now, tried for another day.
    pub async fn redeliver(&self, webhook_id: &str, delivery_id: i64) -> Result<DeliveryRecord, StoreError> {
        let now = now_ms();
        on_pool!(self, pool, _dialect => {
            let done = sqlx::query(
                "UPDATE webhook_deliveries SET state = 'pending', first_at_ms = $3, next_at_ms = $3, \
                 lease_until_ms = 0 WHERE id = $2 AND webhook_id = $1",
            )
            .bind(webhook_id)
            .bind(delivery_id)
            .bind(now)
            .execute(pool)
            .await?;
            if done.rows_affected() == 0 {
                return Err(StoreError::NotFound { what: format!("delivery {delivery_id}") });
            }
        });
        let sql = format!("SELECT {DELIVERY_COLUMNS} WHERE d.id = $1");
        let row: DeliveryRecord =
            on_pool!(self, pool, _dialect => sqlx::query_as(&sql).bind(delivery_id).fetch_one(pool).await?);
        Ok(row)
    }
}
