//! The events outbox as read: one event per change worth telling (written in the change's transaction, see
//! [`crate::writes::event_insert`]), and which of them a reader may see.

use sqlx::QueryBuilder;

use crate::{Store, StoreError};

/// An event as stored.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
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

/// The columns of an [`EventRecord`], and the table.
pub(super) const EVENT_COLUMNS: &str =
    "seq, id, type AS kind, tenant_id, subject, at_ms, CAST(data AS TEXT) AS data FROM events";

/// The condition on `events` of what a reader may see: its tenants' events (every one, and the platform's, when
/// `platform`), never a test event for one endpoint.
pub(super) fn readable<'a, DB: sqlx::Database>(q: &mut QueryBuilder<'a, DB>, tenants: &'a [String], platform: bool)
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
    /// The newest event's `seq` (0 without any).
    pub async fn latest_event_seq(&self) -> Result<i64, StoreError> {
        on_pool!(self, pool, _dialect => {
            let (latest,): (Option<i64>,) = sqlx::query_as("SELECT MAX(seq) FROM events").fetch_one(pool).await?;
            Ok(latest.unwrap_or(0))
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
            Ok(q.build_query_as().fetch_all(pool).await?)
        })
    }
}
