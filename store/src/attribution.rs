//! Who runs on each device: the processes a node's agent reports, judged by `tessera_core::attribution`, kept per
//! node as last reported, and an event (`gpu.unallocated_use`) the first time a process is seen as unallocated use.

use std::collections::HashSet;

use tessera_core::attribution::{GpuProcess, PodRef, Stray};

use super::writes::system_event;
use super::{Store, StoreError, now_ms};

/// The actor of attribution events.
pub const ATTRIBUTION_ACTOR: &str = "system:attribution";

/// A process, judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JudgedProcess {
    /// The GPU (id) whose device it runs on.
    pub gpu_id: String,
    /// The process.
    pub process: GpuProcess,
    /// The allocation it runs under.
    pub allocation: Option<String>,
    /// Why it is unallocated use.
    pub stray: Option<Stray>,
    /// The tenants holding the device (told of unallocated use on it).
    pub holders: Vec<String>,
}

/// A process as last reported.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ProcessRow {
    /// The node.
    pub node_id: String,
    /// The GPU.
    pub gpu_id: String,
    /// The device (MIG device or GPU UUID).
    pub device: String,
    /// Process id.
    pub pid: i64,
    /// User.
    pub user_name: Option<String>,
    /// Command.
    pub command: Option<String>,
    /// Namespace, pod and container, on a Kubernetes node.
    pub namespace: Option<String>,
    /// Pod.
    pub pod: Option<String>,
    /// Container.
    pub container: Option<String>,
    /// The allocation it runs under.
    pub allocation_id: Option<String>,
    /// Why it is unallocated use (a [`Stray`] code).
    pub stray: Option<String>,
    /// First seen, UTC ms.
    pub since_ms: i64,
}

impl ProcessRow {
    /// Its pod, when it has one.
    pub fn pod_ref(&self) -> Option<PodRef> {
        Some(PodRef { namespace: self.namespace.clone()?, pod: self.pod.clone()?, container: self.container.clone()? })
    }
}

const PROCESS_COLUMNS: &str = "node_id, gpu_id, device, pid, user_name, command, namespace, pod, container, \
                               allocation_id, stray, since_ms";

/// An active allocation on a node's device: `(device UUID, allocation id, tenant id)`.
pub type NodeHolder = (String, String, String);

impl Store {
    /// The active allocations on a node's devices.
    pub async fn node_holders(&self, node_id: &str) -> Result<Vec<NodeHolder>, StoreError> {
        Ok(on_pool!(self, pool, _dialect => {
            sqlx::query_as(
                "SELECT a.device_uuid, a.id, a.tenant_id FROM allocations a JOIN gpus g ON g.id = a.gpu_id \
                 WHERE g.node_id = $1 AND a.state = 'active' AND a.device_uuid IS NOT NULL ORDER BY a.id",
            )
            .bind(node_id)
            .fetch_all(pool)
            .await?
        }))
    }

    /// The namespaces of the node's cluster that tenants govern: `(namespace, tenant id)`; none when the node is
    /// in no cluster.
    pub async fn node_namespaces(&self, node_id: &str) -> Result<Vec<(String, String)>, StoreError> {
        Ok(on_pool!(self, pool, _dialect => {
            sqlx::query_as(
                "SELECT c.namespace, c.tenant_id FROM cluster_namespaces c JOIN nodes n ON n.cluster_id = c.cluster_id \
                 WHERE n.id = $1 ORDER BY c.namespace",
            )
            .bind(node_id)
            .fetch_all(pool)
            .await?
        }))
    }

    /// Whether processes of the node are kept (so that a report without any clears them).
    pub async fn node_has_processes(&self, node_id: &str) -> Result<bool, StoreError> {
        let found: Option<(i64,)> = on_pool!(self, pool, _dialect => {
            sqlx::query_as("SELECT pid FROM gpu_processes WHERE node_id = $1 LIMIT 1").bind(node_id).fetch_optional(pool).await?
        });
        Ok(found.is_some())
    }

    /// The node's GPUs: `(id, uuid)`.
    pub async fn node_gpu_ids(&self, node_id: &str) -> Result<Vec<(String, String)>, StoreError> {
        Ok(on_pool!(self, pool, _dialect => {
            sqlx::query_as("SELECT id, uuid FROM gpus WHERE node_id = $1 ORDER BY idx").bind(node_id).fetch_all(pool).await?
        }))
    }

    /// Replaces the node's processes with `judged`, in one transaction. Unallocated use of a kind (device and
    /// reason) not seen in the previous report is a `gpu.unallocated_use` event, to platform admins (who, in full)
    /// and to the tenants holding the device (what, without another tenant's names). Answers the processes told.
    pub async fn record_processes(
        &self,
        node_id: &str,
        node_name: &str,
        judged: &[JudgedProcess],
    ) -> Result<Vec<JudgedProcess>, StoreError> {
        let now = now_ms();
        let select = format!("SELECT {PROCESS_COLUMNS} FROM gpu_processes WHERE node_id = $1");
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let before: Vec<ProcessRow> = sqlx::query_as(&select).bind(node_id).fetch_all(&mut *tx).await?;
            let before_by: std::collections::HashMap<(&str, i64), &ProcessRow> =
                before.iter().map(|b| ((b.device.as_str(), b.pid), b)).collect();
            // Unallocated use told already, per device and reason: a new pid of the same kind on the same device
            // (a restarted process, a busy loop of short ones) is not told again while it lasts.
            let told: HashSet<(&str, &str)> =
                before.iter().filter_map(|b| b.stray.as_deref().map(|r| (b.device.as_str(), r))).collect();
            let mut telling: HashSet<(String, &'static str)> = HashSet::new();
            sqlx::query("DELETE FROM gpu_processes WHERE node_id = $1").bind(node_id).execute(&mut *tx).await?;
            let mut new_strays = Vec::new();
            let mut written: HashSet<(&str, u32)> = HashSet::new();
            for j in judged {
                let p = &j.process;
                if !written.insert((p.device.as_str(), p.pid)) {
                    continue;
                }
                let was = before_by.get(&(p.device.as_str(), i64::from(p.pid))).copied();
                let since = was.map_or(now, |b| b.since_ms);
                let stray = j.stray.map(Stray::code);
                let pod = p.pod.as_ref();
                sqlx::query(&format!(
                    "INSERT INTO gpu_processes ({PROCESS_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
                ))
                .bind(node_id)
                .bind(&j.gpu_id)
                .bind(&p.device)
                .bind(i64::from(p.pid))
                .bind(&p.user)
                .bind(&p.command)
                .bind(pod.map(|x| x.namespace.as_str()))
                .bind(pod.map(|x| x.pod.as_str()))
                .bind(pod.map(|x| x.container.as_str()))
                .bind(&j.allocation)
                .bind(stray)
                .bind(since)
                .execute(&mut *tx)
                .await?;
                let Some(reason) = j.stray else { continue };
                if told.contains(&(p.device.as_str(), reason.code())) || !telling.insert((p.device.clone(), reason.code())) {
                    continue;
                }
                let subject = format!("gpu/{}", j.gpu_id);
                let who = match (&p.pod, &p.user) {
                    (Some(pod), _) => format!("pod {}/{} (container {})", pod.namespace, pod.pod, pod.container),
                    (None, Some(user)) => format!("a process of {user}"),
                    (None, None) => "a process".to_string(),
                };
                let after = serde_json::json!({
                    "node_id": node_id, "node": node_name, "gpu_id": j.gpu_id, "device": p.device, "pid": p.pid,
                    "user": p.user, "command": p.command, "pod": p.pod, "reason": reason.code(),
                    "sentence": format!("{who} (pid {}) {} ({} on {node_name})", p.pid, reason.sentence(), p.device),
                    "holders": j.holders,
                });
                system_event(&mut tx, "gpu.unallocated_use", None, &subject, ATTRIBUTION_ACTOR, after).await?;
                // The holders' copy says what happens on their slice, not who (another tenant's namespace, pod,
                // user or command are not theirs to read).
                let redacted = serde_json::json!({
                    "node": node_name, "gpu_id": j.gpu_id, "device": p.device, "pid": p.pid, "reason": reason.code(),
                    "sentence": format!("A process (pid {}) {} ({} on {node_name})", p.pid, reason.sentence(), p.device),
                });
                for tenant in &j.holders {
                    system_event(&mut tx, "gpu.unallocated_use", Some(tenant), &subject, ATTRIBUTION_ACTOR, redacted.clone())
                        .await?;
                }
                new_strays.push(j.clone());
            }
            tx.commit().await?;
            Ok(new_strays)
        })
    }

    /// Every process as last reported, in the whole fleet (at most [`tessera_core::attribution::MAX_PROCESSES_PER_NODE`]
    /// a node), by node, device and pid.
    pub async fn gpu_processes(&self) -> Result<Vec<ProcessRow>, StoreError> {
        let sql = format!("SELECT {PROCESS_COLUMNS} FROM gpu_processes ORDER BY node_id, device, pid");
        Ok(on_pool!(self, pool, _dialect => sqlx::query_as(&sql).fetch_all(pool).await?))
    }

    /// Forgets what a node reported running (it stopped reporting).
    pub async fn forget_processes(&self, node_id: &str) -> Result<(), StoreError> {
        on_pool!(self, pool, _dialect => {
            sqlx::query("DELETE FROM gpu_processes WHERE node_id = $1").bind(node_id).execute(pool).await?;
        });
        Ok(())
    }

    /// The processes on these devices (a heatmap's rows), by device and pid; read in chunks of 500 devices.
    pub async fn device_processes(&self, devices: &[String]) -> Result<Vec<ProcessRow>, StoreError> {
        let mut out = Vec::new();
        for chunk in devices.chunks(500) {
            let sql = format!(
                "SELECT {PROCESS_COLUMNS} FROM gpu_processes WHERE device IN ({}) ORDER BY device, pid",
                super::dialect::marks(1, chunk.len())
            );
            let rows: Vec<ProcessRow> = on_pool!(self, pool, _dialect => {
                let mut q = sqlx::query_as(&sql);
                for d in chunk {
                    q = q.bind(d);
                }
                q.fetch_all(pool).await?
            });
            out.extend(rows);
        }
        Ok(out)
    }

    /// The processes running under these allocations (one read per listing of allocations).
    pub async fn allocation_processes(&self, allocation_ids: &[String]) -> Result<Vec<ProcessRow>, StoreError> {
        if allocation_ids.is_empty() {
            return Ok(vec![]);
        }
        let sql = format!(
            "SELECT {PROCESS_COLUMNS} FROM gpu_processes WHERE allocation_id IN ({}) ORDER BY device, pid",
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
