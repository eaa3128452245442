//! The dispatcher: turns each undispatched event into one delivery per matching webhook endpoint and one e-mail
//! delivery per user who chose to be mailed its type and may read it. One dispatcher runs at a time across
//! replicas (an advisory lock on PostgreSQL), so deliveries follow event order.

use sqlx::QueryBuilder;
use tessera_core::event;

use crate::{Store, StoreError, now_ms};

/// Someone who chose to be mailed: `(user, filter, since, address, platform admin, tenants)`.
type Subscriber = (String, event::TypeFilter, i64, String, bool, Vec<String>);

/// How old an event must be to be passed over when no endpoint exists.
const QUIET_MS: i64 = 5_000;

/// The advisory lock key of the dispatcher (one at a time across replicas, so deliveries follow event order).
const DISPATCH_LOCK: i64 = 0x7e55_e7a0;

impl Store {
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
}
