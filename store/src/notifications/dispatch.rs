//! The dispatcher: turns each undispatched event into one delivery per matching webhook endpoint and one e-mail
//! delivery per user who chose to be mailed its type and may read it. One dispatcher runs at a time across
//! replicas (an advisory lock on PostgreSQL), so deliveries follow event order.

use sqlx::QueryBuilder;
use tessera_core::event;

use crate::{Store, StoreError, now_ms};

/// Someone who chose to be mailed, as stored: the types as JSON, the identity's address if any.
#[derive(Debug, sqlx::FromRow)]
struct SubscriberRow {
    user_id: String,
    types: String,
    since_ms: i64,
    email: Option<String>,
    name: String,
    platform_admin: bool,
}

/// Someone who chose to be mailed.
#[derive(Debug)]
struct Subscriber {
    user_id: String,
    filter: event::TypeFilter,
    /// Only events from this time on.
    since_ms: i64,
    address: String,
    platform_admin: bool,
    /// The tenants they are a member of.
    tenants: Vec<String>,
}

/// An endpoint as stored: the types as JSON.
#[derive(Debug, sqlx::FromRow)]
struct HookRow {
    id: String,
    tenant_id: Option<String>,
    types: String,
    created_at_ms: i64,
}

/// An endpoint as the dispatcher matches events to it.
#[derive(Debug)]
struct Hook {
    id: String,
    tenant_id: Option<String>,
    filter: event::TypeFilter,
    /// Only events from this time on (when it was made).
    created_at_ms: i64,
}

/// An event not dispatched yet.
#[derive(Debug, sqlx::FromRow)]
struct PendingEvent {
    seq: i64,
    kind: String,
    tenant_id: Option<String>,
    subject: String,
    /// The only endpoint a test event is for.
    webhook_id: Option<String>,
    at_ms: i64,
}

/// How old an event must be to be passed over when no endpoint exists.
const QUIET_MS: i64 = 5_000;

/// The advisory lock key of the dispatcher (one at a time across replicas, so deliveries follow event order).
const DISPATCH_LOCK: i64 = 0x7e55_e7a0;

impl Store {
    /// Turns up to `limit` undispatched events into deliveries, one per matching endpoint and, when `email`, one per
    /// user who chose to be mailed the event's type and may read it; how many events it dispatched. One dispatcher
    /// runs at a time across replicas.
    pub async fn dispatch_events(&self, limit: u32, email: bool) -> Result<usize, StoreError> {
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
                let rows: Vec<SubscriberRow> = sqlx::query_as(
                    "SELECT p.user_id, CAST(p.types AS TEXT) AS types, p.since_ms, u.email, u.name, u.platform_admin \
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
                    .filter_map(|SubscriberRow { user_id, types, since_ms, email, name, platform_admin }| {
                        let types: Vec<String> = serde_json::from_str(&types).unwrap_or_default();
                        if types.is_empty() {
                            return None;
                        }
                        let filter = event::TypeFilter::new(&types).ok()?;
                        // The identity's address, else a name that is one (local accounts are often named so).
                        let address = email.filter(|a| !a.is_empty()).or(name.contains('@').then_some(name))?;
                        let tenants = members.iter().filter(|(u, _)| *u == user_id).map(|(_, t)| t.clone()).collect();
                        Some(Subscriber { user_id, filter, since_ms, address, platform_admin, tenants })
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
            let events: Vec<PendingEvent> = sqlx::query_as(
                "SELECT seq, type AS kind, tenant_id, subject, webhook_id, at_ms FROM events WHERE dispatched = 0 \
                 ORDER BY seq LIMIT $1",
            )
            .bind(i64::from(limit))
            .fetch_all(&mut *tx)
            .await?;
            if events.is_empty() {
                return Ok(0);
            }
            // Shared locks: an endpoint being deleted now is deleted before or after this dispatch, never between
            // reading it and writing its deliveries.
            let hooks: Vec<HookRow> = sqlx::query_as(&format!(
                "SELECT id, tenant_id, CAST(types AS TEXT) AS types, created_at_ms FROM webhooks ORDER BY id{}",
                dialect.share_lock()
            ))
            .fetch_all(&mut *tx)
            .await?;
            let hooks: Vec<Hook> = hooks
                .into_iter()
                .map(|HookRow { id, tenant_id, types, created_at_ms }| {
                    let types: Vec<String> = serde_json::from_str(&types).unwrap_or_default();
                    Hook { id, tenant_id, filter: event::TypeFilter::new(&types).unwrap_or_default(), created_at_ms }
                })
                .collect();
            let now = now_ms();
            let mut rows: Vec<(&str, i64, &str)> = Vec::new();
            for e in &events {
                for hook in &hooks {
                    // An endpoint gets the events of changes made since it was made.
                    let wanted = match &e.webhook_id {
                        Some(only) => *only == hook.id,
                        None => {
                            hook.created_at_ms <= e.at_ms
                                && event::reaches(e.tenant_id.as_deref(), hook.tenant_id.as_deref())
                                && hook.filter.wants(&e.kind)
                        }
                    };
                    if wanted {
                        rows.push((&hook.id, e.seq, &e.subject));
                    }
                }
            }
            let mut mails: Vec<(&str, &str, i64)> = Vec::new();
            for e in &events {
                if e.webhook_id.is_some() {
                    continue;
                }
                for s in &subscribers {
                    let readable = s.platform_admin || e.tenant_id.as_ref().is_some_and(|t| s.tenants.contains(t));
                    if readable && s.since_ms <= e.at_ms && s.filter.wants(&e.kind) {
                        mails.push((&s.user_id, &s.address, e.seq));
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
            for e in &events {
                list.push_bind(e.seq);
            }
            q.push(")");
            q.build().execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(events.len())
        })
    }
}
