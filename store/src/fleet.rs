//! Nodes and their GPUs, registered by hand or by a joining agent, and the GPU flags an admin sets. One SQL body
//! for both backends (see [`super::dialect`]).

use tessera_core::health::{self, Finding, GpuHealthReport, HealthState};

use super::writes::{audit_insert, system_event};
use super::{
    DrainRecord, Gpu, GpuRow, NewGpu, Node, NodeRow, Store, StoreError, gpu_from, new_id, nodes_from, now_ms,
    on_constraint, to_json,
};

/// The columns of a [`GpuRow`].
pub(super) const GPU_FIELDS: &str = "id, node_id, idx, uuid, model, mig_enabled, cordoned, \
                                     CAST(layout AS TEXT) AS layout, layout_version, auto_layout, health, \
                                     health_findings, health_since_ms";
/// The same columns as SQLite's `json_array` takes them ([`super::json_rows`]).
pub(super) const GPU_JSON: &str = "id, node_id, idx, uuid, model, mig_enabled, cordoned, layout, layout_version, \
                                   auto_layout, health, health_findings, health_since_ms";

/// A GPU flag an admin sets; only these columns reach SQL.
#[derive(Debug, Clone, Copy)]
enum Flag {
    Cordoned,
    AutoLayout,
}

impl Flag {
    fn column(self) -> &'static str {
        match self {
            Flag::Cordoned => "cordoned",
            Flag::AutoLayout => "auto_layout",
        }
    }
}

/// The fleet as read at one `fleet_version`.
type FleetAt = (i64, std::sync::Arc<Vec<Node>>);

/// The fleet as last read, under the `fleet_version` read before it.
#[derive(Debug, Clone, Default)]
pub(crate) struct FleetCache(std::sync::Arc<std::sync::Mutex<Option<FleetAt>>>);

impl FleetCache {
    fn get(&self, version: i64) -> Option<std::sync::Arc<Vec<Node>>> {
        let kept = self.0.lock().ok()?;
        kept.as_ref().filter(|(v, _)| *v == version).map(|(_, nodes)| nodes.clone())
    }

    fn put(&self, version: i64, nodes: std::sync::Arc<Vec<Node>>) {
        if let Ok(mut kept) = self.0.lock() {
            *kept = Some((version, nodes));
        }
    }
}

impl Store {
    /// Registers a node with its GPUs, in one transaction. A taken node name or GPU UUID is a conflict.
    pub async fn register_node(&self, name: &str, gpus: &[NewGpu], actor: &str) -> Result<Node, StoreError> {
        let node_id = new_id();
        let node = Node {
            id: node_id.clone(),
            name: name.to_string(),
            created_at_ms: now_ms(),
            gpus: gpus
                .iter()
                .map(|g| Gpu {
                    id: new_id(),
                    node_id: node_id.clone(),
                    index: g.index,
                    uuid: g.uuid.clone(),
                    model: g.model.clone(),
                    mig_enabled: g.mig_enabled,
                    cordoned: false,
                    layout: g.layout.clone(),
                    layout_version: 1,
                    auto_layout: false,
                    health: Default::default(),
                })
                .collect(),
        };
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            sqlx::query("INSERT INTO nodes (id, name, created_at_ms) VALUES ($1, $2, $3)")
                .bind(&node.id)
                .bind(&node.name)
                .bind(node.created_at_ms)
                .execute(&mut *tx)
                .await
                .map_err(|e| on_constraint(e, "nodes.name"))?;
            for g in &node.gpus {
                sqlx::query(&format!(
                    "INSERT INTO gpus (id, node_id, idx, uuid, model, mig_enabled, cordoned, layout, layout_version) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, {}, $9)",
                    dialect.json(8)
                ))
                .bind(&g.id)
                .bind(&g.node_id)
                .bind(i64::from(g.index))
                .bind(&g.uuid)
                .bind(&g.model)
                .bind(g.mig_enabled)
                .bind(g.cordoned)
                .bind(to_json(&g.layout))
                .bind(g.layout_version)
                .execute(&mut *tx)
                .await
                .map_err(|e| on_constraint(e, "gpus.uuid"))?;
            }
            let object = format!("node/{}", node.id);
            audit_insert(&mut tx, actor, "node.register", &object, None, Some(to_json(&node))).await?;
            tx.commit().await?;
        });
        Ok(node)
    }

    /// Every node with its GPUs, by name.
    ///
    /// Read again only when the fleet changed: every change to a node or a GPU moves `fleet_version` in its own
    /// transaction (triggers, migration `fleet_version`, on every replica's writes), and the fleet read last is kept
    /// under the version read before it. At 10,000 nodes and 80,000 GPUs the read took one to two seconds of a
    /// busy server; an approval, the fleet page and `/metrics` each made one.
    pub async fn nodes(&self) -> Result<Vec<Node>, StoreError> {
        Ok(self.fleet().await?.as_ref().clone())
    }

    /// The fleet as [`Store::nodes`] reads it, shared rather than copied (the sweep's refresh of every spec reads
    /// it each 15 s: a copy of 80,000 GPUs is tens of milliseconds).
    pub(crate) async fn fleet(&self) -> Result<std::sync::Arc<Vec<Node>>, StoreError> {
        let version: i64 = on_pool!(self, pool, _dialect => {
            sqlx::query_scalar("SELECT version FROM fleet_version WHERE id = 1").fetch_one(pool).await?
        });
        if let Some(nodes) = self.fleet.get(version) {
            return Ok(nodes);
        }
        let node_columns = "id, name, created_at_ms";
        let mut nodes: Vec<NodeRow> = self.read_rows(node_columns, node_columns, "FROM nodes", "nodes").await?;
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        let rows: Vec<GpuRow> = self.read_rows(GPU_FIELDS, GPU_JSON, "FROM gpus", "gpus").await?;
        let gpus = rows.into_iter().map(gpu_from).collect::<Result<Vec<Gpu>, _>>()?;
        let nodes = std::sync::Arc::new(nodes_from(nodes, gpus));
        self.fleet.put(version, nodes.clone());
        Ok(nodes)
    }

    /// Cordons or uncordons a GPU; returns it.
    pub async fn set_cordoned(
        &self,
        gpu_id: &str,
        cordoned: bool,
        actor: &str,
        reason: Option<&str>,
    ) -> Result<Gpu, StoreError> {
        self.set_flag(gpu_id, Flag::Cordoned, cordoned, actor, reason).await
    }

    /// Turns auto-layout on or off for a GPU.
    pub async fn set_auto_layout(&self, gpu_id: &str, enabled: bool, actor: &str) -> Result<Gpu, StoreError> {
        self.set_flag(gpu_id, Flag::AutoLayout, enabled, actor, None).await
    }

    /// Sets a GPU's flag; `reason`, when given, is kept in the audit line.
    async fn set_flag(
        &self,
        gpu_id: &str,
        flag: Flag,
        value: bool,
        actor: &str,
        reason: Option<&str>,
    ) -> Result<Gpu, StoreError> {
        let after = reason.map(|r| serde_json::json!({ "reason": r }).to_string());
        let update = format!("UPDATE gpus SET {} = $1 WHERE id = $2", flag.column());
        let read = format!("SELECT {GPU_FIELDS} FROM gpus WHERE id = $1");
        let action = format!("gpu.{}.{}", flag.column(), if value { "on" } else { "off" });
        let row: GpuRow = on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let done = sqlx::query(&update).bind(value).bind(gpu_id).execute(&mut *tx).await?;
            if done.rows_affected() == 0 {
                return Err(StoreError::NotFound { what: format!("gpu {gpu_id}") });
            }
            // Uncordoning an unhealthy GPU returns it to service: healthy until its agent reports a new fault; a
            // drain ends.
            if matches!(flag, Flag::Cordoned) && !value {
                sqlx::query("DELETE FROM gpu_drains WHERE gpu_id = $1").bind(gpu_id).execute(&mut *tx).await?;
                let back = sqlx::query(
                    "UPDATE gpus SET health = 'healthy', health_findings = '[]', health_since_ms = $1 \
                     WHERE id = $2 AND health = 'unhealthy'",
                )
                .bind(now_ms())
                .bind(gpu_id)
                .execute(&mut *tx)
                .await?;
                if back.rows_affected() == 1 {
                    let after = serde_json::json!({"gpu_id": gpu_id, "state": "healthy", "from": "unhealthy",
                        "returned_by": actor});
                    system_event(&mut tx, "gpu.healthy", None, &format!("gpu/{gpu_id}"),
                        actor, after).await?;
                }
            }
            let row = sqlx::query_as(&read).bind(gpu_id).fetch_one(&mut *tx).await?;
            audit_insert(&mut tx, actor, &action, &format!("gpu/{gpu_id}"), None, after.clone()).await?;
            tx.commit().await?;
            row
        });
        gpu_from(row)
    }

    /// Judges the health reports of a node's GPUs ([`tessera_core::health::judge`]) and records what changed, in one
    /// transaction: a GPU turning unhealthy is cordoned (`gpu.cordoned`) and stays unhealthy, keeping the findings
    /// that made it so, until an admin uncordons it; every change of state is an event (`gpu.unhealthy`,
    /// `gpu.degraded`, `gpu.healthy`) for the platform and, for an unhealthy GPU, for each tenant holding slices on
    /// it. Reports of GPUs the node does not have are ignored. The changes made.
    pub async fn record_health(
        &self,
        node_id: &str,
        reports: &[(String, GpuHealthReport)],
    ) -> Result<Vec<HealthChange>, StoreError> {
        let now = now_ms();
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let node: Option<(String,)> =
                sqlx::query_as("SELECT name FROM nodes WHERE id = $1").bind(node_id).fetch_optional(&mut *tx).await?;
            let Some((node_name,)) = node else { return Ok(Vec::new()) };
            let mut changes = Vec::new();
            for (uuid, report) in reports {
                let row: Option<HealthRow> = sqlx::query_as(
                    "SELECT id, idx, health, cordoned, health_findings, health_xid_ms, health_since_ms FROM gpus \
                     WHERE node_id = $1 AND uuid = $2",
                )
                .bind(node_id)
                .bind(uuid)
                .fetch_optional(&mut *tx)
                .await?;
                let Some(HealthRow {
                    id: gpu_id,
                    idx: index,
                    health: held,
                    cordoned,
                    health_findings: old_findings,
                    health_xid_ms: xid_ms,
                    health_since_ms: since,
                }) = row
                else {
                    continue;
                };
                let held = HealthState::parse(&held).unwrap_or_default();
                let old_findings: Vec<Finding> = serde_json::from_str(&old_findings).unwrap_or_default();
                let (judged, found) = health::judge(report, xid_ms, now);
                let next = health::next_state(held, since, judged, now);
                let seen_xid = xid_ms.max(report.latest_xid_ms().unwrap_or(0));
                // An unhealthy GPU keeps what made it so, and gains what else makes it unhealthy.
                let findings = if held == HealthState::Unhealthy {
                    let mut kept = old_findings.clone();
                    for f in found.into_iter().filter(|f| f.state == HealthState::Unhealthy) {
                        if kept.len() < MAX_FINDINGS && !kept.iter().any(|k| k.code == f.code) {
                            kept.push(f);
                        }
                    }
                    kept
                } else {
                    found
                };
                // Unchanged: nothing written (the findings' words carry readings, such as a temperature, that move
                // on every report; their codes are what changes the record). A GPU held degraded keeps its findings.
                let codes = |f: &[Finding]| f.iter().map(|f| f.code.clone()).collect::<Vec<_>>();
                let findings = if next == HealthState::Degraded && judged == HealthState::Healthy { old_findings.clone() } else { findings };
                if next == held && codes(&findings) == codes(&old_findings) && seen_xid == xid_ms {
                    continue;
                }
                sqlx::query(
                    "UPDATE gpus SET health = $1, health_findings = $2, health_xid_ms = $3, \
                     health_since_ms = CASE WHEN $4 THEN $5 ELSE health_since_ms END WHERE id = $6",
                )
                .bind(next.as_str())
                .bind(to_json(&findings))
                .bind(seen_xid)
                .bind(next != held)
                .bind(now)
                .bind(&gpu_id)
                .execute(&mut *tx)
                .await?;
                if next == held {
                    continue;
                }
                let mut holders: Vec<String> = Vec::new();
                let mut newly_cordoned = false;
                if next == HealthState::Unhealthy {
                    if !cordoned {
                        sqlx::query("UPDATE gpus SET cordoned = $1 WHERE id = $2")
                            .bind(true)
                            .bind(&gpu_id)
                            .execute(&mut *tx)
                            .await?;
                        audit_insert(&mut tx, HEALTH_ACTOR, "gpu.cordoned.on", &format!("gpu/{gpu_id}"), None, None)
                            .await?;
                        newly_cordoned = true;
                    }
                    let rows: Vec<(String,)> = sqlx::query_as(
                        "SELECT DISTINCT tenant_id FROM allocations WHERE gpu_id = $1 AND state IN ('reserved', 'active') \
                         ORDER BY tenant_id",
                    )
                    .bind(&gpu_id)
                    .fetch_all(&mut *tx)
                    .await?;
                    holders = rows.into_iter().map(|r| r.0).collect();
                }
                let kind = match next {
                    HealthState::Unhealthy => "gpu.unhealthy",
                    HealthState::Degraded => "gpu.degraded",
                    HealthState::Healthy => "gpu.healthy",
                };
                let subject = format!("gpu/{gpu_id}");
                let after = serde_json::json!({"gpu_id": gpu_id, "node_id": node_id, "node": node_name, "index": index,
                    "uuid": uuid, "state": next, "from": held, "findings": findings, "cordoned": next == HealthState::Unhealthy || cordoned});
                system_event(&mut tx, kind, None, &subject, HEALTH_ACTOR, after.clone()).await?;
                for tenant in &holders {
                    system_event(&mut tx, kind, Some(tenant), &subject, HEALTH_ACTOR, after.clone())
                        .await?;
                }
                changes.push(HealthChange { gpu_id, uuid: uuid.clone(), from: held, to: next, findings, newly_cordoned, holders });
            }
            tx.commit().await?;
            Ok(changes)
        })
    }
}

/// The most health changes one heatmap reads.
pub const MAX_HEALTH_CHANGES: i64 = 5_000;

/// A recorded change of a GPU's health: `(gpu id, at ms, state, finding codes)`.
pub type HealthChangeRow = (String, i64, HealthState, Vec<String>);

impl Store {
    /// The changes of the health of the GPUs `gpu_ids` recorded in `[from_ms, to_ms)`, oldest first: the platform's
    /// `gpu.unhealthy`, `gpu.degraded` and `gpu.healthy` events, or with `tenants`, only the copies those tenants
    /// were sent (a holder is told when its GPU turns unhealthy). The newest [`MAX_HEALTH_CHANGES`] when there are
    /// more.
    pub async fn health_changes(
        &self,
        gpu_ids: &[String],
        tenants: Option<&[String]>,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<HealthChangeRow>, StoreError> {
        let mut rows: Vec<HealthEventRow> = Vec::new();
        let subjects: Vec<String> = gpu_ids.iter().map(|g| format!("gpu/{g}")).collect();
        let readers: Vec<Option<&str>> = match tenants {
            None => vec![None],
            Some(t) => t.iter().map(|t| Some(t.as_str())).collect(),
        };
        for chunk in subjects.chunks(200) {
            let list = (0..chunk.len()).map(|i| format!("${}", i + 5)).collect::<Vec<_>>().join(", ");
            let sql = format!(
                "SELECT subject, at_ms, CAST(data AS TEXT) AS data FROM events \
                 WHERE type IN ('gpu.unhealthy', 'gpu.degraded', \
                 'gpu.healthy') AND at_ms >= $1 AND at_ms < $2 AND (tenant_id = $3 OR ($3 IS NULL AND tenant_id IS NULL)) \
                 AND subject IN ({list}) ORDER BY at_ms DESC, seq DESC LIMIT $4"
            );
            for reader in &readers {
                let got: Vec<HealthEventRow> = on_pool!(self, pool, _dialect => {
                    let mut q = sqlx::query_as(&sql).bind(from_ms).bind(to_ms).bind(*reader).bind(MAX_HEALTH_CHANGES);
                    for subject in chunk {
                        q = q.bind(subject);
                    }
                    q.fetch_all(pool).await?
                });
                rows.extend(got);
            }
        }
        // Newest first, each change once (several tenants may have been told of the same one), at most the cap.
        rows.sort_by(|a, b| b.at_ms.cmp(&a.at_ms).then_with(|| a.subject.cmp(&b.subject)));
        rows.dedup_by(|a, b| a.subject == b.subject && a.at_ms == b.at_ms);
        rows.truncate(usize::try_from(MAX_HEALTH_CHANGES).unwrap_or(usize::MAX));
        let mut out: Vec<HealthChangeRow> = rows
            .into_iter()
            .filter_map(|HealthEventRow { subject, at_ms, data }| {
                let gpu = subject.strip_prefix("gpu/")?.to_string();
                let data: serde_json::Value = serde_json::from_str(&data).ok()?;
                let after = &data["after"];
                let state = HealthState::parse(after["state"].as_str()?)?;
                let codes = after["findings"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|f| f["code"].as_str().map(str::to_string))
                    .collect();
                Some((gpu, at_ms, state, codes))
            })
            .collect();
        out.reverse();
        Ok(out)
    }
}

impl Store {
    /// Starts draining a GPU (or moves the deadline of its drain), in one transaction: cordoned, the drain recorded,
    /// `gpu.draining` told to the platform and to each tenant holding slices on it. The tenants told.
    pub async fn start_drain(
        &self,
        gpu_id: &str,
        deadline_ms: i64,
        reason: &str,
        actor: &str,
    ) -> Result<Vec<String>, StoreError> {
        let now = now_ms();
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let gpu: Option<DrainedGpu> = sqlx::query_as(
                "SELECT g.node_id, g.idx, n.name AS node_name FROM gpus g JOIN nodes n ON n.id = g.node_id \
                 WHERE g.id = $1",
            )
            .bind(gpu_id)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(DrainedGpu { node_id, idx: index, node_name: node }) = gpu else {
                return Err(StoreError::NotFound { what: format!("gpu {gpu_id}") });
            };
            let cordoned = sqlx::query("UPDATE gpus SET cordoned = $1 WHERE id = $2 AND cordoned = $3")
                .bind(true)
                .bind(gpu_id)
                .bind(false)
                .execute(&mut *tx)
                .await?;
            if cordoned.rows_affected() == 1 {
                audit_insert(&mut tx, actor, "gpu.cordoned.on", &format!("gpu/{gpu_id}"), None, None).await?;
            }
            sqlx::query(
                "INSERT INTO gpu_drains (gpu_id, deadline_ms, started_ms, started_by, reason) VALUES ($1, $2, $3, $4, $5) \
                 ON CONFLICT (gpu_id) DO UPDATE SET deadline_ms = excluded.deadline_ms, reason = excluded.reason, \
                 drained_at_ms = NULL",
            )
            .bind(gpu_id)
            .bind(deadline_ms)
            .bind(now)
            .bind(actor)
            .bind(reason)
            .execute(&mut *tx)
            .await?;
            let after = serde_json::json!({"gpu_id": gpu_id, "node_id": node_id, "node": node, "index": index,
                "deadline_ms": deadline_ms, "reason": reason});
            audit_insert(&mut tx, actor, "gpu.drain", &format!("gpu/{gpu_id}"), None, Some(after.to_string())).await?;
            let rows: Vec<(String,)> = sqlx::query_as(
                "SELECT DISTINCT tenant_id FROM allocations WHERE gpu_id = $1 AND state IN ('reserved', 'active') \
                 ORDER BY tenant_id",
            )
            .bind(gpu_id)
            .fetch_all(&mut *tx)
            .await?;
            let holders: Vec<String> = rows.into_iter().map(|r| r.0).collect();
            let subject = format!("gpu/{gpu_id}");
            system_event(&mut tx, "gpu.draining", None, &subject, actor, after.clone()).await?;
            for tenant in &holders {
                system_event(&mut tx, "gpu.draining", Some(tenant), &subject, actor, after.clone())
                    .await?;
            }
            tx.commit().await?;
            Ok(holders)
        })
    }

    /// Every drain, draining or drained.
    pub async fn drains(&self) -> Result<Vec<DrainRecord>, StoreError> {
        let rows: Vec<DrainRecord> = on_pool!(self, pool, _dialect => {
            sqlx::query_as(
                "SELECT gpu_id, deadline_ms, started_ms, started_by, reason, drained_at_ms FROM gpu_drains ORDER BY gpu_id",
            )
            .fetch_all(pool)
            .await?
        });
        Ok(rows)
    }

    /// Makes a drained GPU draining again (it holds slices once more).
    pub async fn reopen_drain(&self, gpu_id: &str) -> Result<(), StoreError> {
        on_pool!(self, pool, _dialect => {
            sqlx::query("UPDATE gpu_drains SET drained_at_ms = NULL WHERE gpu_id = $1").bind(gpu_id).execute(pool).await?;
        });
        Ok(())
    }

    /// Marks a draining GPU drained if it holds nothing any more (`gpu.drained`); whether it did.
    pub async fn finish_drain(&self, gpu_id: &str) -> Result<bool, StoreError> {
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let (held,): (i64,) = sqlx::query_as(
                "SELECT COUNT(*) FROM allocations WHERE gpu_id = $1 AND state IN ('reserved', 'active')",
            )
            .bind(gpu_id)
            .fetch_one(&mut *tx)
            .await?;
            if held > 0 {
                return Ok(false);
            }
            let done = sqlx::query("UPDATE gpu_drains SET drained_at_ms = $1 WHERE gpu_id = $2 AND drained_at_ms IS NULL")
                .bind(now_ms())
                .bind(gpu_id)
                .execute(&mut *tx)
                .await?;
            if done.rows_affected() == 1 {
                let after = serde_json::json!({"gpu_id": gpu_id});
                system_event(&mut tx, "gpu.drained", None, &format!("gpu/{gpu_id}"),
                    DRAIN_ACTOR, after).await?;
            }
            tx.commit().await?;
            Ok(done.rows_affected() == 1)
        })
    }
}

/// The actor a drain's deadline ends requests under.
pub const DRAIN_ACTOR: &str = "system:drain";

/// What [`Store::record_health`] reads of a GPU.
#[derive(Debug, sqlx::FromRow)]
struct HealthRow {
    id: String,
    idx: i64,
    health: String,
    cordoned: bool,
    /// The findings, as JSON.
    health_findings: String,
    health_xid_ms: i64,
    health_since_ms: Option<i64>,
}

/// A health event of a GPU (`gpu/<id>`), its data as JSON.
#[derive(Debug, sqlx::FromRow)]
struct HealthEventRow {
    subject: String,
    at_ms: i64,
    data: String,
}

/// Where a GPU being drained is.
#[derive(Debug, sqlx::FromRow)]
struct DrainedGpu {
    node_id: String,
    idx: i64,
    node_name: String,
}

/// The actor health changes are written under.
pub const HEALTH_ACTOR: &str = "system:health";
/// Most findings kept for a GPU.
const MAX_FINDINGS: usize = 32;

/// A GPU whose health state changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthChange {
    /// The GPU's id.
    pub gpu_id: String,
    /// Its UUID.
    pub uuid: String,
    /// The state before.
    pub from: HealthState,
    /// The state now.
    pub to: HealthState,
    /// Why.
    pub findings: Vec<Finding>,
    /// Whether this change cordoned it.
    pub newly_cordoned: bool,
    /// Tenants holding slices on it that were told (for an unhealthy GPU).
    pub holders: Vec<String>,
}
