//! Notifications: the events outbox, webhook endpoints and their deliveries. One SQL body for both backends (see
//! [`super::dialect`]).
//!
//! Every audit entry whose action tells of an event (`tessera_core::event::from_audit`) writes the event in the same
//! transaction ([`super::writes::event_insert`]), so a change that rolls back has no event and a committed one always
//! has. The dispatcher ([`Store::dispatch_events`]) turns each event into one delivery per matching endpoint; the sender claims
//! due deliveries for a lease ([`Store::claim_deliveries`]), sends them and records how it went
//! ([`Store::finish_deliveries`]). On PostgreSQL replicas claim with `FOR UPDATE SKIP LOCKED`, so each delivery is
//! sent by one of them; an endpoint receives a subject's events in order, since a delivery waits while an earlier
//! one of its subject to the same endpoint is pending.

use std::collections::HashMap;

use sqlx::QueryBuilder;
use sqlx::postgres::PgRow;
use sqlx::sqlite::SqliteRow;
use tessera_core::event;

use super::dialect::Conn;
use super::writes::{REQUEST_COLUMNS, audit_insert, system_event};
use super::{Store, StoreError, new_id, now_ms, to_json};

/// An event as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRecord {
    /// Position in the outbox.
    pub seq: i64,
    /// Stable id (receivers de-duplicate with it).
    pub id: String,
    /// Its type (`tessera_core::event::TYPES`).
    pub kind: String,
    /// The tenant it concerns (`None`: platform-wide).
    pub tenant_id: Option<String>,
    /// What it is about, e.g. `request/<id>`.
    pub subject: String,
    /// When, UTC ms.
    pub at_ms: i64,
    /// The change: `{"actor", "action", "before", "after"}` (JSON text).
    pub data: String,
}

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

/// One event to one endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// An endpoint's secrets as stored (sealed, or plain text from before sealing).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct StoredSecrets {
    pub id: String,
    pub secret: String,
    pub previous_secret: Option<String>,
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

/// One event to one user's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmailRecord {
    pub id: i64,
    pub address: String,
    pub event_id: String,
    pub kind: String,
    pub subject: String,
    /// `pending`, `delivered` or `failed`.
    pub state: String,
    pub attempts: i64,
    pub first_at_ms: i64,
    pub next_at_ms: i64,
    pub last_error: String,
    pub delivered_at_ms: Option<i64>,
}

/// An e-mail delivery claimed for sending, with its event.
#[derive(Debug, Clone)]
pub struct ClaimedEmail {
    pub delivery: i64,
    pub attempts: i64,
    pub first_at_ms: i64,
    pub user_id: String,
    pub address: String,
    pub event: EventRecord,
}

/// How sending an e-mail delivery went.
#[derive(Debug, Clone)]
pub struct SentEmail {
    pub delivery: i64,
    pub attempts: i64,
    pub first_at_ms: i64,
    /// The server took it.
    pub ok: bool,
    /// It can never be taken (a bad address, a 5xx answer): failed without more attempts.
    pub permanent: bool,
    pub error: String,
}

/// Someone who chose to be mailed: `(user, filter, since, address, platform admin, tenants)`.
type Subscriber = (String, event::TypeFilter, i64, String, bool, Vec<String>);

/// After an attempt: `(state, next attempt, delivered at, attempts)`. Delivered when `ok`; failed at once when
/// `permanent`; otherwise pending after the backoff (at most `cap_ms` between attempts), or failed a day after the
/// first attempt.
fn after_attempt(
    ok: bool,
    permanent: bool,
    first_at_ms: i64,
    attempts: i64,
    now: i64,
    cap_ms: i64,
) -> (&'static str, i64, Option<i64>, i64) {
    let attempts = attempts.saturating_add(1);
    let tries = u32::try_from(attempts).unwrap_or(u32::MAX);
    let (state, next, delivered) = if ok {
        ("delivered", now, Some(now))
    } else if permanent {
        ("failed", now, None)
    } else {
        match event::next_attempt(first_at_ms, tries, now, cap_ms) {
            Some(next) => ("pending", next, None),
            None => ("failed", now, None),
        }
    };
    (state, next, delivered, attempts)
}

/// How old an event must be to be passed over when no endpoint exists.
const QUIET_MS: i64 = 5_000;

/// Who sends reminders, in events' data.
pub const REMINDER: &str = "system:reminder";

/// The advisory lock key of the dispatcher (one at a time across replicas, so deliveries follow event order).
const DISPATCH_LOCK: i64 = 0x7e55_e7a0;

const WEBHOOK_COLUMNS: &str = "id, tenant_id, url, format, CAST(types AS TEXT), description, secret, previous_secret, \
                               previous_until_ms, created_by, created_at_ms FROM webhooks";
type WebhookRow =
    (String, Option<String>, String, String, String, String, String, Option<String>, Option<i64>, String, i64);

fn webhook_from(r: WebhookRow) -> WebhookRecord {
    WebhookRecord {
        id: r.0,
        tenant_id: r.1,
        url: r.2,
        format: r.3,
        types: serde_json::from_str(&r.4).unwrap_or_default(),
        description: r.5,
        secret: r.6,
        previous_secret: r.7,
        previous_until_ms: r.8,
        created_by: r.9,
        created_at_ms: r.10,
    }
}

const EVENT_COLUMNS: &str = "seq, id, type, tenant_id, subject, at_ms, CAST(data AS TEXT) FROM events";
type EventRow = (i64, String, String, Option<String>, String, i64, String);

fn event_from(r: EventRow) -> EventRecord {
    EventRecord { seq: r.0, id: r.1, kind: r.2, tenant_id: r.3, subject: r.4, at_ms: r.5, data: r.6 }
}

const DELIVERY_COLUMNS: &str = "d.id, d.webhook_id, e.id, e.type, d.subject, d.state, d.attempts, d.first_at_ms, \
                                d.next_at_ms, d.last_status, d.last_error, d.delivered_at_ms \
                                FROM webhook_deliveries d JOIN events e ON e.seq = d.event_seq";
type DeliveryRow = (i64, String, String, String, String, String, i64, i64, i64, Option<i64>, String, Option<i64>);

fn delivery_from(r: DeliveryRow) -> DeliveryRecord {
    DeliveryRecord {
        id: r.0,
        webhook_id: r.1,
        event_id: r.2,
        kind: r.3,
        subject: r.4,
        state: r.5,
        attempts: r.6,
        first_at_ms: r.7,
        next_at_ms: r.8,
        last_status: r.9,
        last_error: r.10,
        delivered_at_ms: r.11,
    }
}

/// A table of rows that senders lease while they send them, so that of several replicas one sends each: a row is
/// due when it is pending, its next attempt has come (`next_at_ms`) and no lease on it runs (`lease_until_ms`). On
/// PostgreSQL replicas claim with `FOR UPDATE SKIP LOCKED`, so they never wait on each other's claims.
struct LeaseQueue {
    /// The table.
    table: &'static str,
    /// The table's alias in `also`, `order` and the columns read back.
    alias: &'static str,
    /// What else a due row must meet (` AND ...`), or `""`.
    also: &'static str,
    /// The order rows are claimed and read back in.
    order: &'static str,
}

/// Webhook deliveries: a subject's deliveries to one endpoint go one at a time, in event order.
const DELIVERY_QUEUE: LeaseQueue = LeaseQueue {
    table: "webhook_deliveries",
    alias: "d",
    also: " AND NOT EXISTS (SELECT 1 FROM webhook_deliveries o WHERE o.webhook_id = d.webhook_id \
            AND o.subject = d.subject AND o.state = 'pending' AND o.event_seq < d.event_seq)",
    order: "d.event_seq",
};

/// E-mail deliveries, oldest first.
const EMAIL_QUEUE: LeaseQueue = LeaseQueue { table: "email_deliveries", alias: "m", also: "", order: "m.id" };

impl LeaseQueue {
    /// Claims up to `limit` rows due at `now` for `lease_ms`, in the caller's transaction, and reads them back in
    /// order with `columns` (`<columns> FROM <table> <alias> [JOIN ...]`); none when none is due.
    async fn claim<'c, T>(
        &self,
        conn: impl Into<Conn<'c>>,
        columns: &str,
        now: i64,
        limit: u32,
        lease_ms: i64,
    ) -> Result<Vec<T>, StoreError>
    where
        T: for<'r> sqlx::FromRow<'r, SqliteRow> + for<'r> sqlx::FromRow<'r, PgRow> + Send + Unpin,
    {
        let LeaseQueue { table, alias: a, also, order } = self;
        on_conn!(conn.into(), conn, dialect, DB => {
            let ids: Vec<(i64,)> = sqlx::query_as(&format!(
                "SELECT {a}.id FROM {table} {a} WHERE {a}.state = 'pending' AND {a}.next_at_ms <= $1 \
                 AND {a}.lease_until_ms <= $1{also} ORDER BY {order} LIMIT $2{}",
                dialect.lock_skipping()
            ))
            .bind(now)
            .bind(i64::from(limit))
            .fetch_all(&mut *conn)
            .await?;
            if ids.is_empty() {
                return Ok(Vec::new());
            }
            let mut q = QueryBuilder::<DB>::new(format!("UPDATE {table} SET lease_until_ms = "));
            q.push_bind(now.saturating_add(lease_ms)).push(" WHERE id IN (");
            let mut list = q.separated(", ");
            for (id,) in &ids {
                list.push_bind(*id);
            }
            q.push(")");
            q.build().execute(&mut *conn).await?;
            let mut q = QueryBuilder::<DB>::new(format!("SELECT {columns} WHERE {a}.id IN ("));
            let mut list = q.separated(", ");
            for (id,) in &ids {
                list.push_bind(*id);
            }
            q.push(format!(") ORDER BY {order}"));
            Ok(q.build_query_as().fetch_all(&mut *conn).await?)
        })
    }

    /// Gives claimed rows back untouched, for the next round.
    async fn release<'c>(&self, conn: impl Into<Conn<'c>>, ids: &[i64]) -> Result<(), StoreError> {
        let table = self.table;
        on_conn!(conn.into(), conn, _dialect, DB => {
            let mut q = QueryBuilder::<DB>::new(format!("UPDATE {table} SET lease_until_ms = 0 WHERE id IN ("));
            let mut list = q.separated(", ");
            for id in ids {
                list.push_bind(*id);
            }
            q.push(")");
            q.build().execute(&mut *conn).await?;
        });
        Ok(())
    }
}

/// The condition on `events` of what a reader may see: its tenants' events (every one, and the platform's, when
/// `platform`), never a test event for one endpoint.
fn readable<'a, DB: sqlx::Database>(q: &mut QueryBuilder<'a, DB>, tenants: &'a [String], platform: bool)
where
    String: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
{
    q.push("webhook_id IS NULL AND (");
    if platform {
        q.push("1 = 1");
    } else {
        q.push("tenant_id IN (");
        let mut list = q.separated(", ");
        list.push_bind(String::new());
        for t in tenants {
            list.push_bind(t.clone());
        }
        q.push(")");
    }
    q.push(")");
}

impl Store {
    /// How many events `user_id` may read (see [`Store::events_for`]) are newer than what it has read, counted up
    /// to `cap`; and the newest one's `seq` (0 without any).
    pub async fn unread(
        &self,
        user_id: &str,
        tenants: &[String],
        platform: bool,
        cap: u32,
    ) -> Result<(u32, i64), StoreError> {
        on_pool!(self, pool, _dialect, DB => {
            let seen: Option<(i64,)> = sqlx::query_as("SELECT seen_seq FROM inbox_reads WHERE user_id = $1")
                .bind(user_id)
                .fetch_optional(pool)
                .await?;
            let seen = seen.map_or(0, |s| s.0);
            let mut q = QueryBuilder::<DB>::new("SELECT COUNT(*) FROM (SELECT seq FROM events WHERE ");
            readable(&mut q, tenants, platform);
            q.push(" AND seq > ").push_bind(seen).push(" LIMIT ").push_bind(i64::from(cap)).push(") AS unread");
            let (n,): (i64,) = q.build_query_as().fetch_one(pool).await?;
            let mut q = QueryBuilder::<DB>::new("SELECT MAX(seq) FROM events WHERE ");
            readable(&mut q, tenants, platform);
            let (latest,): (Option<i64>,) = q.build_query_as().fetch_one(pool).await?;
            Ok((u32::try_from(n).unwrap_or(cap), latest.unwrap_or(0)))
        })
    }

    /// The newest event's `seq` (0 without any).
    pub async fn latest_event_seq(&self) -> Result<i64, StoreError> {
        on_pool!(self, pool, _dialect => {
            let (latest,): (Option<i64>,) = sqlx::query_as("SELECT MAX(seq) FROM events").fetch_one(pool).await?;
            Ok(latest.unwrap_or(0))
        })
    }

    /// Marks `user_id`'s inbox read up to `seq` (never backwards).
    pub async fn mark_read(&self, user_id: &str, seq: i64) -> Result<(), StoreError> {
        on_pool!(self, pool, _dialect => {
            sqlx::query(
                "INSERT INTO inbox_reads (user_id, seen_seq) VALUES ($1, $2) ON CONFLICT (user_id) DO UPDATE \
                 SET seen_seq = CASE WHEN inbox_reads.seen_seq > excluded.seen_seq THEN inbox_reads.seen_seq \
                 ELSE excluded.seen_seq END",
            )
            .bind(user_id)
            .bind(seq)
            .execute(pool)
            .await?;
        });
        Ok(())
    }

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
            .map_err(|e| super::on_constraint(e, "webhooks"))?;
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
    pub async fn delete_webhook(&self, id: &str, actor: &str) -> Result<(), StoreError> {
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            sqlx::query("DELETE FROM webhook_deliveries WHERE webhook_id = $1").bind(id).execute(&mut *tx).await?;
            let done = sqlx::query("DELETE FROM webhooks WHERE id = $1").bind(id).execute(&mut *tx).await?;
            if done.rows_affected() == 0 {
                return Err(StoreError::NotFound { what: format!("webhook {id}") });
            }
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

    /// Turns up to `limit` undispatched events into deliveries, one per matching endpoint and, when `email`, one per
    /// user who chose to be mailed the event's type and may read it; how many events it dispatched. One dispatcher
    /// runs at a time across replicas.
    pub async fn dispatch_events(&self, limit: u32, email: bool) -> Result<usize, StoreError> {
        type Ev = (i64, String, Option<String>, String, Option<String>, i64);
        on_pool!(self, pool, dialect, DB => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let (mine,): (bool,) = sqlx::query_as(&dialect.try_exclusive(DISPATCH_LOCK)).fetch_one(&mut *tx).await?;
            if !mine {
                return Ok(0);
            }
            // Without any endpoint there is nothing to deliver: events are marked in one statement. Only those a
            // few seconds old, so that an endpoint whose creation is committing now still gets what follows it.
            let (hooks_n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM webhooks").fetch_one(&mut *tx).await?;
            let subscribers: Vec<Subscriber> = if email {
                let rows: Vec<(String, String, i64, Option<String>, String, bool)> = sqlx::query_as(
                    "SELECT p.user_id, CAST(p.types AS TEXT), p.since_ms, u.email, u.name, u.platform_admin \
                     FROM email_prefs p JOIN users u ON u.id = p.user_id ORDER BY p.user_id",
                )
                .fetch_all(&mut *tx)
                .await?;
                let members: Vec<(String, String)> = sqlx::query_as(
                    "SELECT user_id, tenant_id FROM memberships WHERE user_id IN (SELECT user_id FROM email_prefs)",
                )
                .fetch_all(&mut *tx)
                .await?;
                rows.into_iter()
                    .filter_map(|(user, types, since, address, name, platform)| {
                        let types: Vec<String> = serde_json::from_str(&types).unwrap_or_default();
                        if types.is_empty() {
                            return None;
                        }
                        let filter = event::TypeFilter::new(&types).ok()?;
                        // The identity's address, else a name that is one (local accounts are often named so).
                        let address = address.filter(|a| !a.is_empty()).or(name.contains('@').then_some(name))?;
                        let tenants = members.iter().filter(|(u, _)| *u == user).map(|(_, t)| t.clone()).collect();
                        Some((user, filter, since, address, platform, tenants))
                    })
                    .collect()
            } else {
                Vec::new()
            };
            if hooks_n == 0 && subscribers.is_empty() {
                let done = sqlx::query("UPDATE events SET dispatched = 1 WHERE dispatched = 0 AND at_ms < $1")
                    .bind(now_ms() - QUIET_MS)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                return Ok(usize::try_from(done.rows_affected()).unwrap_or(usize::MAX));
            }
            let events: Vec<Ev> = sqlx::query_as(
                "SELECT seq, type, tenant_id, subject, webhook_id, at_ms FROM events WHERE dispatched = 0 \
                 ORDER BY seq LIMIT $1",
            )
            .bind(i64::from(limit))
            .fetch_all(&mut *tx)
            .await?;
            if events.is_empty() {
                return Ok(0);
            }
            let hooks: Vec<(String, Option<String>, String, i64)> =
                sqlx::query_as("SELECT id, tenant_id, CAST(types AS TEXT), created_at_ms FROM webhooks")
                    .fetch_all(&mut *tx)
                    .await?;
            let hooks: Vec<(String, Option<String>, event::TypeFilter, i64)> = hooks
                .into_iter()
                .map(|(id, tenant, types, since)| {
                    let types: Vec<String> = serde_json::from_str(&types).unwrap_or_default();
                    (id, tenant, event::TypeFilter::new(&types).unwrap_or_default(), since)
                })
                .collect();
            let now = now_ms();
            let mut rows: Vec<(&str, i64, &str)> = Vec::new();
            for (seq, kind, tenant, subject, only, at) in &events {
                for (id, hook_tenant, filter, since) in &hooks {
                    // An endpoint gets the events of changes made since it was made.
                    let wanted = match only {
                        Some(only) => only == id,
                        None => {
                            *since <= *at
                                && event::reaches(tenant.as_deref(), hook_tenant.as_deref())
                                && filter.wants(kind)
                        }
                    };
                    if wanted {
                        rows.push((id, *seq, subject));
                    }
                }
            }
            let mut mails: Vec<(&str, &str, i64)> = Vec::new();
            for (seq, kind, tenant, _, only, at) in &events {
                if only.is_some() {
                    continue;
                }
                for (user, filter, since, address, platform, tenants) in &subscribers {
                    let readable = *platform || tenant.as_ref().is_some_and(|t| tenants.contains(t));
                    if readable && *since <= *at && filter.wants(kind) {
                        mails.push((user, address, *seq));
                    }
                }
            }
            for chunk in mails.chunks(1000) {
                let mut q = QueryBuilder::<DB>::new(
                    "INSERT INTO email_deliveries (user_id, address, event_seq, state, first_at_ms, next_at_ms) ",
                );
                q.push_values(chunk, |mut b, (user, address, seq)| {
                    b.push_bind(*user).push_bind(*address).push_bind(*seq).push_bind("pending").push_bind(now)
                        .push_bind(now);
                });
                q.build().execute(&mut *tx).await?;
            }
            for chunk in rows.chunks(1000) {
                let mut q = QueryBuilder::<DB>::new(
                    "INSERT INTO webhook_deliveries (webhook_id, event_seq, subject, state, first_at_ms, next_at_ms) ",
                );
                q.push_values(chunk, |mut b, (id, seq, subject)| {
                    b.push_bind(*id).push_bind(*seq).push_bind(*subject).push_bind("pending").push_bind(now).push_bind(now);
                });
                q.build().execute(&mut *tx).await?;
            }
            let mut q = QueryBuilder::<DB>::new("UPDATE events SET dispatched = 1 WHERE seq IN (");
            let mut list = q.separated(", ");
            for (seq, ..) in &events {
                list.push_bind(*seq);
            }
            q.push(")");
            q.build().execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(events.len())
        })
    }

    /// Claims up to `limit` due deliveries for `lease_ms` (none whose subject has an earlier delivery pending to
    /// the same endpoint), with their endpoints and events.
    pub async fn claim_deliveries(&self, limit: u32, lease_ms: i64) -> Result<Vec<Claimed>, StoreError> {
        let now = now_ms();
        on_pool!(self, pool, dialect, DB => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let rows: Vec<(i64, i64, i64, String, i64)> = DELIVERY_QUEUE
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
                list.push_bind(r.3.clone());
            }
            q.push(")");
            let hooks: Vec<WebhookRow> = q.build_query_as().fetch_all(&mut *tx).await?;
            let hooks: HashMap<String, WebhookRecord> =
                hooks.into_iter().map(webhook_from).map(|w| (w.id.clone(), w)).collect();
            let mut q = QueryBuilder::<DB>::new(format!("SELECT {EVENT_COLUMNS} WHERE seq IN ("));
            let mut list = q.separated(", ");
            for r in &rows {
                list.push_bind(r.4);
            }
            q.push(")");
            let events: Vec<EventRow> = q.build_query_as().fetch_all(&mut *tx).await?;
            let events: HashMap<i64, EventRecord> = events.into_iter().map(|r| (r.0, event_from(r))).collect();
            tx.commit().await?;
            Ok(rows
                .into_iter()
                .filter_map(|(delivery, attempts, first_at_ms, webhook, seq)| {
                    Some(Claimed {
                        delivery,
                        attempts,
                        first_at_ms,
                        webhook: hooks.get(&webhook)?.clone(),
                        event: events.get(&seq)?.clone(),
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
        let rows: Vec<DeliveryRow> = on_pool!(self, pool, _dialect => {
            sqlx::query_as(&sql).bind(webhook_id).bind(before_id).bind(i64::from(limit)).fetch_all(pool).await?
        });
        Ok(rows.into_iter().map(delivery_from).collect())
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
        let row: DeliveryRow =
            on_pool!(self, pool, _dialect => sqlx::query_as(&sql).bind(delivery_id).fetch_one(pool).await?);
        Ok(delivery_from(row))
    }

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
            let rows: Vec<super::RequestRow> =
                sqlx::query_as(&sql).bind(now_ms).bind(horizon).fetch_all(&mut *tx).await?;
            let mut written = 0;
            for row in rows {
                let r = super::request_from(row)?;
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

    /// Events whose tenant is one of `tenants`, or platform-wide ones too when `platform`, newest first, older than
    /// `before_seq` when given; at most `limit`.
    pub async fn events_for(
        &self,
        tenants: &[String],
        platform: bool,
        before_seq: Option<i64>,
        limit: u32,
    ) -> Result<Vec<EventRecord>, StoreError> {
        on_pool!(self, pool, _dialect, DB => {
            let mut q = QueryBuilder::<DB>::new(format!("SELECT {EVENT_COLUMNS} WHERE "));
            readable(&mut q, tenants, platform);
            if let Some(before) = before_seq {
                q.push(" AND seq < ").push_bind(before);
            }
            q.push(" ORDER BY seq DESC LIMIT ").push_bind(i64::from(limit));
            let rows: Vec<EventRow> = q.build_query_as().fetch_all(pool).await?;
            Ok(rows.into_iter().map(event_from).collect())
        })
    }
}

const EMAIL_COLUMNS: &str = "m.id, m.address, e.id, e.type, e.subject, m.state, m.attempts, m.first_at_ms, \
                             m.next_at_ms, m.last_error, m.delivered_at_ms \
                             FROM email_deliveries m JOIN events e ON e.seq = m.event_seq";
type EmailRow = (i64, String, String, String, String, String, i64, i64, i64, String, Option<i64>);

fn email_from(r: EmailRow) -> EmailRecord {
    EmailRecord {
        id: r.0,
        address: r.1,
        event_id: r.2,
        kind: r.3,
        subject: r.4,
        state: r.5,
        attempts: r.6,
        first_at_ms: r.7,
        next_at_ms: r.8,
        last_error: r.9,
        delivered_at_ms: r.10,
    }
}

impl Store {
    /// The event types `user_id` chose to be mailed (empty: none).
    pub async fn email_prefs(&self, user_id: &str) -> Result<Vec<String>, StoreError> {
        let row: Option<(String,)> = on_pool!(self, pool, _dialect => {
            sqlx::query_as("SELECT CAST(types AS TEXT) FROM email_prefs WHERE user_id = $1")
                .bind(user_id)
                .fetch_optional(pool)
                .await?
        });
        Ok(row.and_then(|(t,)| serde_json::from_str(&t).ok()).unwrap_or_default())
    }

    /// Sets the event types `user_id` is mailed, from now on (empty: none).
    pub async fn set_email_prefs(&self, user_id: &str, types: &[String]) -> Result<(), StoreError> {
        on_pool!(self, pool, dialect => {
            sqlx::query(&format!(
                "INSERT INTO email_prefs (user_id, types, since_ms) VALUES ($1, {}, $3) ON CONFLICT (user_id) \
                 DO UPDATE SET types = excluded.types, since_ms = excluded.since_ms",
                dialect.json(2)
            ))
            .bind(user_id)
            .bind(to_json(&types))
            .bind(now_ms())
            .execute(pool)
            .await?;
        });
        Ok(())
    }

    /// Where `user_id`'s mail goes: the identity's address, else the user's name when it is one.
    pub async fn user_email(&self, user_id: &str) -> Result<Option<String>, StoreError> {
        let row: Option<(Option<String>, String)> = on_pool!(self, pool, _dialect => {
            sqlx::query_as("SELECT email, name FROM users WHERE id = $1").bind(user_id).fetch_optional(pool).await?
        });
        Ok(row.and_then(|(email, name)| email.filter(|a| !a.is_empty()).or(name.contains('@').then_some(name))))
    }

    /// Gives claimed e-mail deliveries back untouched, for the next round.
    pub async fn release_emails(&self, ids: &[i64]) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        on_pool!(self, pool, _dialect => EMAIL_QUEUE.release(&mut *pool.acquire().await?, ids).await)
    }

    /// The e-mail deliveries to `user_id`, newest first; at most `limit`.
    pub async fn email_deliveries(&self, user_id: &str, limit: u32) -> Result<Vec<EmailRecord>, StoreError> {
        let sql = format!("SELECT {EMAIL_COLUMNS} WHERE m.user_id = $1 ORDER BY m.id DESC LIMIT $2");
        let rows: Vec<EmailRow> = on_pool!(self, pool, _dialect => {
            sqlx::query_as(&sql).bind(user_id).bind(i64::from(limit)).fetch_all(pool).await?
        });
        Ok(rows.into_iter().map(email_from).collect())
    }

    /// Claims up to `limit` due e-mail deliveries for `lease_ms`, with their events, oldest first.
    pub async fn claim_emails(&self, limit: u32, lease_ms: i64) -> Result<Vec<ClaimedEmail>, StoreError> {
        let now = now_ms();
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            type Row = (i64, i64, i64, String, String, i64, String, String, Option<String>, String, i64, String);
            let rows: Vec<Row> = EMAIL_QUEUE
                .claim(
                    &mut tx,
                    "m.id, m.attempts, m.first_at_ms, m.user_id, m.address, e.seq, e.id, e.type, e.tenant_id, \
                     e.subject, e.at_ms, CAST(e.data AS TEXT) FROM email_deliveries m JOIN events e ON e.seq = m.event_seq",
                    now,
                    limit,
                    lease_ms,
                )
                .await?;
            if rows.is_empty() {
                return Ok(Vec::new());
            }
            tx.commit().await?;
            Ok(rows
                .into_iter()
                .map(|r| ClaimedEmail {
                    delivery: r.0,
                    attempts: r.1,
                    first_at_ms: r.2,
                    user_id: r.3,
                    address: r.4,
                    event: event_from((r.5, r.6, r.7, r.8, r.9, r.10, r.11)),
                })
                .collect())
        })
    }

    /// Records how sending went: delivered when the server took it; failed at once when it never can; otherwise
    /// tried again after the backoff (at most `cap_ms` between attempts) or, a day after the first attempt, failed.
    pub async fn finish_emails(&self, sent: &[SentEmail], cap_ms: i64) -> Result<(), StoreError> {
        if sent.is_empty() {
            return Ok(());
        }
        let now = now_ms();
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            for s in sent {
                let (state, next, delivered, attempts) =
                    after_attempt(s.ok, s.permanent, s.first_at_ms, s.attempts, now, cap_ms);
                let error: String = s.error.chars().take(500).collect();
                sqlx::query(
                    "UPDATE email_deliveries SET state = $2, attempts = $3, next_at_ms = $4, lease_until_ms = 0, \
                     last_error = $5, delivered_at_ms = $6 WHERE id = $1 AND state = 'pending'",
                )
                .bind(s.delivery)
                .bind(state)
                .bind(attempts)
                .bind(next)
                .bind(error)
                .bind(delivered)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
        });
        Ok(())
    }
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

    /// Active allocations with the device that serves them: `(id, request, tenant, profile, device, activated at)`.
    pub async fn active_devices(&self) -> Result<Vec<(String, String, String, String, String, i64)>, StoreError> {
        on_pool!(self, pool, _dialect => {
            Ok(sqlx::query_as(
                "SELECT id, request_id, tenant_id, profile, device_uuid, activated_at_ms FROM allocations \
                 WHERE state = 'active' AND device_uuid IS NOT NULL AND activated_at_ms IS NOT NULL ORDER BY id",
            )
            .fetch_all(pool)
            .await?)
        })
    }
}
