//! What the Kubernetes controller keeps: a lease that one replica at a time holds, how each cluster's last
//! reconcile went, and each allocation's claims as the cluster last showed them.

use super::{Store, StoreError, now_ms};

/// How a cluster's last reconcile went.
#[derive(Debug, Clone, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct ClusterSync {
    /// The last reconcile that completed, UTC ms.
    pub synced_at_ms: Option<i64>,
    /// The last failure since then.
    pub error: Option<String>,
    /// When it happened, UTC ms.
    pub error_at_ms: Option<i64>,
}

/// A claim of an allocation, as its cluster last showed it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct AllocationClaim {
    /// The allocation.
    pub allocation_id: String,
    /// The cluster's id.
    pub cluster_id: String,
    /// The namespace.
    pub namespace: String,
    /// The claim's name.
    pub claim: String,
    /// Whether the DRA driver allocated it its device.
    pub allocated: bool,
    /// The pods it is reserved for, as a JSON list of names.
    pub pods: String,
    /// When it was read, UTC ms.
    pub observed_at_ms: i64,
    /// The cluster's name (read with the claim; empty when recording).
    #[sqlx(default)]
    pub cluster_name: String,
}

impl AllocationClaim {
    /// The pods it is reserved for.
    pub fn pod_names(&self) -> Vec<String> {
        serde_json::from_str(&self.pods).unwrap_or_default()
    }
}

impl Store {
    /// Takes or renews the lease `name` for `holder` until `now + ttl_ms`: granted when nobody holds it, its holder
    /// is `holder`, or its holder let it expire. Answers whether `holder` holds it now. "Now" is the database's
    /// clock, so that replicas whose clocks drift apart never both hold it.
    pub async fn hold_lease(&self, name: &str, holder: &str, ttl_ms: i64) -> Result<bool, StoreError> {
        let held: Option<(String,)> = on_pool!(self, pool, dialect => {
            let now = dialect.now_ms_sql();
            let sql = format!(
                "INSERT INTO leases (name, holder, expires_at_ms) VALUES ($1, $2, {now} + $3) \
                 ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at_ms = excluded.expires_at_ms \
                 WHERE leases.holder = excluded.holder OR leases.expires_at_ms < {now}"
            );
            sqlx::query(&sql)
            .bind(name)
            .bind(holder)
            .bind(ttl_ms)
            .execute(pool)
            .await?;
            sqlx::query_as("SELECT holder FROM leases WHERE name = $1").bind(name).fetch_optional(pool).await?
        });
        Ok(held.is_some_and(|(h,)| h == holder))
    }

    /// The lease `name`: its holder and until when (UTC ms by the database's clock), if anybody holds it.
    pub async fn lease(&self, name: &str) -> Result<Option<(String, i64)>, StoreError> {
        Ok(on_pool!(self, pool, _dialect => {
            sqlx::query_as("SELECT holder, expires_at_ms FROM leases WHERE name = $1")
                .bind(name)
                .fetch_optional(pool)
                .await?
        }))
    }

    /// Gives the lease up, if `holder` holds it (a replica stopping hands over at once).
    pub async fn drop_lease(&self, name: &str, holder: &str) -> Result<(), StoreError> {
        on_pool!(self, pool, _dialect => {
            sqlx::query("DELETE FROM leases WHERE name = $1 AND holder = $2").bind(name).bind(holder).execute(pool).await?;
        });
        Ok(())
    }

    /// Records a completed reconcile of a cluster, with the claims it showed (replacing those recorded before).
    pub async fn record_sync(&self, cluster_id: &str, claims: &[AllocationClaim]) -> Result<(), StoreError> {
        let now = now_ms();
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            sqlx::query(
                "INSERT INTO cluster_sync (cluster_id, synced_at_ms, error, error_at_ms) VALUES ($1, $2, NULL, NULL) \
                 ON CONFLICT (cluster_id) DO UPDATE SET synced_at_ms = excluded.synced_at_ms, error = NULL, \
                 error_at_ms = NULL",
            )
            .bind(cluster_id)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(|e| super::on_constraint(e, "cluster"))?;
            sqlx::query("DELETE FROM allocation_claims WHERE cluster_id = $1").bind(cluster_id).execute(&mut *tx).await?;
            for c in claims {
                sqlx::query(
                    "INSERT INTO allocation_claims (allocation_id, cluster_id, namespace, claim, allocated, pods, \
                     observed_at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
                )
                .bind(&c.allocation_id)
                .bind(cluster_id)
                .bind(&c.namespace)
                .bind(&c.claim)
                .bind(c.allocated)
                .bind(&c.pods)
                .bind(c.observed_at_ms)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
        });
        Ok(())
    }

    /// Records a failed reconcile of a cluster (what was recorded of its claims stays).
    pub async fn record_sync_error(&self, cluster_id: &str, error: &str) -> Result<(), StoreError> {
        let error: String = error.chars().take(2000).collect();
        on_pool!(self, pool, _dialect => {
            sqlx::query(
                "INSERT INTO cluster_sync (cluster_id, synced_at_ms, error, error_at_ms) VALUES ($1, NULL, $2, $3) \
                 ON CONFLICT (cluster_id) DO UPDATE SET error = excluded.error, error_at_ms = excluded.error_at_ms",
            )
            .bind(cluster_id)
            .bind(&error)
            .bind(now_ms())
            .execute(pool)
            .await
            .map_err(|e| super::on_constraint(e, "cluster"))?;
        });
        Ok(())
    }

    /// How a cluster's last reconcile went (default: never).
    pub async fn cluster_sync(&self, cluster_id: &str) -> Result<ClusterSync, StoreError> {
        let found: Option<ClusterSync> = on_pool!(self, pool, _dialect => {
            sqlx::query_as("SELECT synced_at_ms, error, error_at_ms FROM cluster_sync WHERE cluster_id = $1")
                .bind(cluster_id)
                .fetch_optional(pool)
                .await?
        });
        Ok(found.unwrap_or_default())
    }

    /// The claims recorded for these allocations (at most one read per listing page of allocations).
    pub async fn allocation_claims(&self, allocation_ids: &[String]) -> Result<Vec<AllocationClaim>, StoreError> {
        if allocation_ids.is_empty() {
            return Ok(vec![]);
        }
        let sql = format!(
            "SELECT a.allocation_id, a.cluster_id, a.namespace, a.claim, a.allocated, a.pods, a.observed_at_ms, \
             c.name AS cluster_name FROM allocation_claims a JOIN clusters c ON c.id = a.cluster_id \
             WHERE a.allocation_id IN ({}) ORDER BY a.allocation_id, a.namespace",
            super::dialect::marks(1, allocation_ids.len())
        );
        Ok(on_pool!(self, pool, _dialect => {
            let mut q = sqlx::query_as(&sql);
            for id in allocation_ids {
                q = q.bind(id);
            }
            q.fetch_all(pool).await?
        }))
    }
}
