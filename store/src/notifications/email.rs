//! The e-mail outbox: which event types each user chose to be mailed, where their mail goes, and the deliveries
//! the dispatcher made for them, claimed for a lease (see [`super::lease`]), sent and recorded like webhook
//! deliveries.

use super::events::EventRecord;
use super::lease::{LeaseQueue, after_attempt};
use crate::{Store, StoreError, now_ms, to_json};

/// One event to one user's address.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
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
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ClaimedEmail {
    pub delivery: i64,
    pub attempts: i64,
    pub first_at_ms: i64,
    pub user_id: String,
    pub address: String,
    #[sqlx(flatten)]
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

/// E-mail deliveries, oldest first.
const EMAIL_QUEUE: LeaseQueue = LeaseQueue { table: "email_deliveries", alias: "m", also: "", order: "m.id" };

/// The columns of an [`EmailRecord`], and the tables.
const EMAIL_COLUMNS: &str = "m.id, m.address, e.id AS event_id, e.type AS kind, e.subject, m.state, m.attempts, \
                             m.first_at_ms, m.next_at_ms, m.last_error, m.delivered_at_ms \
                             FROM email_deliveries m JOIN events e ON e.seq = m.event_seq";

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
        Ok(on_pool!(self, pool, _dialect => {
            sqlx::query_as(&sql).bind(user_id).bind(i64::from(limit)).fetch_all(pool).await?
        }))
    }

    /// Claims up to `limit` due e-mail deliveries for `lease_ms`, with their events, oldest first.
    pub async fn claim_emails(&self, limit: u32, lease_ms: i64) -> Result<Vec<ClaimedEmail>, StoreError> {
        let now = now_ms();
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let rows: Vec<ClaimedEmail> = EMAIL_QUEUE
                .claim(
                    &mut tx,
                    "m.id AS delivery, m.attempts, m.first_at_ms, m.user_id, m.address, e.seq, e.id, e.type AS kind, \
                     e.tenant_id, e.subject, e.at_ms, CAST(e.data AS TEXT) AS data \
                     FROM email_deliveries m JOIN events e ON e.seq = m.event_seq",
                    now,
                    limit,
                    lease_ms,
                )
                .await?;
            if rows.is_empty() {
                return Ok(Vec::new());
            }
            tx.commit().await?;
            Ok(rows)
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
