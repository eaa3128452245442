//! Each user's inbox: the events they may read (see [`super::events`]), how many are unread, and how far they have
//! read.

use sqlx::QueryBuilder;

use super::events::readable;
use crate::{Store, StoreError};

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
}
