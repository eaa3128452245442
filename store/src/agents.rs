//! Node agents: join tokens, joining (a token exchanged once for a node credential, with the node's inventory),
//! each node's spec generation, the status its agent reports, heartbeats, and allocations turning active when the
//! status shows their instance.
//!
//! One SQL body for both backends (see [`super::dialect`]).

use tessera_core::api::{Inventory, NodeStatus};
use tessera_core::layout::PlacedInstance;
use tessera_core::request::RequestState;

use super::fleet::GPU_FIELDS;
use super::layouts::ALLOCATION_FIELDS;
use super::writes::{audit_insert, system_event};
use super::{NewGpu, Store, StoreError, new_id, now_ms, on_constraint, state_from, to_json};

/// Registers the GPUs of `$gpus` a node does not have yet and updates index and MIG mode of those it has (a GPU
/// whose MIG mode changed takes the instances it reports as its layout). A GPU UUID that belongs to another node is
/// a conflict.
macro_rules! sync_gpus {
    ($conn:expr, $dialect:expr, $node_id:expr, $gpus:expr) => {{
        let conn = $conn;
        let node_id: &str = $node_id;
        for g in $gpus {
            let found: Option<KnownGpu> = sqlx::query_as("SELECT id, node_id, mig_enabled FROM gpus WHERE uuid = $1")
                .bind(&g.uuid)
                .fetch_optional(&mut *conn)
                .await?;
            match found {
                Some(KnownGpu { node_id: owner, .. }) if owner != node_id => {
                    return Err(StoreError::Conflict { constraint: "gpus.uuid".to_string() });
                }
                Some(KnownGpu { id, mig_enabled: mig, .. }) => {
                    sqlx::query("UPDATE gpus SET idx = $1 WHERE id = $2")
                        .bind(i64::from(g.index))
                        .bind(&id)
                        .execute(&mut *conn)
                        .await
                        .map_err(|e| on_constraint(e, "gpus.idx"))?;
                    if mig != g.mig_enabled {
                        sqlx::query(&format!(
                            "UPDATE gpus SET mig_enabled = $1, layout = {}, layout_version = layout_version + 1 \
                             WHERE id = $3",
                            $dialect.json(2)
                        ))
                        .bind(g.mig_enabled)
                        .bind(to_json::<Vec<PlacedInstance>>(&g.layout))
                        .bind(&id)
                        .execute(&mut *conn)
                        .await?;
                    }
                }
                None => {
                    sqlx::query(&format!(
                        "INSERT INTO gpus (id, node_id, idx, uuid, model, mig_enabled, layout) \
                         VALUES ($1, $2, $3, $4, $5, $6, {})",
                        $dialect.json(7)
                    ))
                    .bind(new_id())
                    .bind(node_id)
                    .bind(i64::from(g.index))
                    .bind(&g.uuid)
                    .bind(&g.model)
                    .bind(g.mig_enabled)
                    .bind(to_json::<Vec<PlacedInstance>>(&g.layout))
                    .execute(&mut *conn)
                    .await
                    .map_err(|e| on_constraint(e, "gpus.idx"))?;
                }
            }
        }
    }};
}

/// A join token as stored (the secret itself is only kept as a SHA-256).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
pub struct JoinToken {
    /// UUIDv7.
    pub id: String,
    /// The name the joining node takes; `None`: its host name.
    pub node_name: Option<String>,
    /// Who created it.
    pub created_by: String,
    /// UTC milliseconds.
    pub created_at_ms: i64,
    /// Unusable after this, UTC milliseconds.
    pub expires_at_ms: i64,
    /// When a node joined with it.
    pub used_at_ms: Option<i64>,
    /// The node that joined with it.
    pub node_id: Option<String>,
}

const JOIN_TOKEN_FIELDS: &str = "id, node_name, created_by, created_at_ms, expires_at_ms, used_at_ms, node_id";

/// What the server knows of a node's agent.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct AgentRecord {
    /// Node id.
    pub node_id: String,
    /// Spec generation.
    pub generation: i64,
    /// The generation the agent last reported acting on.
    pub observed_generation: i64,
    /// The last status, as JSON (parsed by the caller).
    pub status: Option<String>,
    /// When the last status came, UTC milliseconds.
    pub status_at_ms: Option<i64>,
    /// The last heartbeat written to the store, UTC milliseconds.
    pub last_seen_ms: Option<i64>,
    /// The last inventory, as JSON.
    pub inventory: Option<String>,
}

/// What a node's spec is computed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecInputs {
    /// The stored generation.
    pub generation: i64,
    /// The hash of the spec content that generation was given for.
    pub spec_hash: String,
    /// The node's GPUs by index.
    pub gpus: Vec<super::Gpu>,
    /// Live allocations on them.
    pub live: Vec<super::Allocation>,
}

/// The columns of an [`AgentRecord`], and the table.
const AGENT_COLUMNS: &str =
    "id AS node_id, generation, observed_generation, status, status_at_ms, last_seen_ms, inventory FROM nodes";

/// A GPU as registration finds it by its UUID.
#[derive(Debug, sqlx::FromRow)]
struct KnownGpu {
    id: String,
    node_id: String,
    mig_enabled: bool,
}

/// A node's spec generation and hash (or on SQLite an array of the three).
#[derive(Debug, sqlx::FromRow, serde::Deserialize)]
struct SpecHead {
    id: String,
    generation: i64,
    spec_hash: String,
}

/// A node's readiness last told, and when it was last heard from.
#[derive(Debug, sqlx::FromRow)]
struct Readiness {
    id: String,
    name: String,
    told_ready: Option<bool>,
    last_seen_ms: Option<i64>,
}

/// A live allocation whose request is not active yet, with the request's state.
#[derive(Debug, sqlx::FromRow)]
struct ProvisioningRow {
    allocation_id: String,
    request_id: String,
    gpu_id: String,
    profile: String,
    start: i64,
    state: String,
    request_state: String,
}

/// A live allocation on a node whose request is not active yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provisioning {
    /// Allocation id.
    pub allocation_id: String,
    /// Its request.
    pub request_id: String,
    /// The GPU.
    pub gpu_id: String,
    /// Profile name or whole-GPU sharing key.
    pub profile: String,
    /// Start unit.
    pub start: u8,
    /// Whether the allocation is active already.
    pub active: bool,
    /// The request's state (`approved` or `provisioning`).
    pub request_state: RequestState,
}

impl Store {
    /// Stores a new join token.
    pub async fn create_join_token(
        &self,
        secret_sha256: &str,
        node_name: Option<&str>,
        expires_at_ms: i64,
        actor: &str,
    ) -> Result<JoinToken, StoreError> {
        let token = JoinToken {
            id: new_id(),
            node_name: node_name.map(str::to_string),
            created_by: actor.to_string(),
            created_at_ms: now_ms(),
            expires_at_ms,
            used_at_ms: None,
            node_id: None,
        };
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            sqlx::query(
                "INSERT INTO join_tokens (id, secret_sha256, node_name, created_by, created_at_ms, expires_at_ms) \
                 VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(&token.id)
            .bind(secret_sha256)
            .bind(&token.node_name)
            .bind(&token.created_by)
            .bind(token.created_at_ms)
            .bind(token.expires_at_ms)
            .execute(&mut *tx)
            .await
            .map_err(|e| on_constraint(e, "join_tokens"))?;
            audit_insert(&mut tx, actor, "join_token.create", &format!("join-token/{}", token.id), None, Some(to_json(&token)))
                .await?;
            tx.commit().await?;
            Ok(token)
        })
    }

    /// Every join token, newest first.
    pub async fn join_tokens(&self) -> Result<Vec<JoinToken>, StoreError> {
        on_pool!(self, pool, _dialect => {
            Ok(sqlx::query_as(&format!("SELECT {JOIN_TOKEN_FIELDS} FROM join_tokens ORDER BY id DESC"))
                .fetch_all(pool)
                .await?)
        })
    }

    /// Deletes an unused join token.
    pub async fn delete_join_token(&self, id: &str, actor: &str) -> Result<(), StoreError> {
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let done = sqlx::query("DELETE FROM join_tokens WHERE id = $1").bind(id).execute(&mut *tx).await?;
            if done.rows_affected() == 0 {
                return Err(StoreError::NotFound { what: format!("join token {id}") });
            }
            audit_insert(&mut tx, actor, "join_token.delete", &format!("join-token/{id}"), None, None).await?;
            tx.commit().await?;
            Ok(())
        })
    }

    /// Joins a node, in one transaction: takes the join token (unused and unexpired, else `NotFound`), creates the
    /// node under the token's name or `hostname` (or, with a token that names it, takes over the node of that
    /// name: its old credentials are revoked, as when an agent lost its state directory; an unnamed token naming
    /// an existing node by host name is a `nodes.name` conflict), registers GPUs it does not know yet and updates the
    /// index and MIG mode of those it knows, and stores the new node credential. Returns `(node id, node name)`.
    /// A spent token with the credential its join stored (not revoked) is the same join sent again: it changes
    /// nothing and returns the same answer.
    pub async fn join_node(
        &self,
        token_sha256: &str,
        hostname: &str,
        gpus: &[NewGpu],
        credential_sha256: &str,
        inventory: &Inventory,
    ) -> Result<(String, String), StoreError> {
        let now = now_ms();
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let token: Option<(String, Option<String>)> = sqlx::query_as(
                "UPDATE join_tokens SET used_at_ms = $1 \
                 WHERE secret_sha256 = $2 AND used_at_ms IS NULL AND expires_at_ms > $1 RETURNING id, node_name",
            )
            .bind(now)
            .bind(token_sha256)
            .fetch_optional(&mut *tx)
            .await?;
            let Some((token_id, token_name)) = token else {
                // The same join sent again (its answer was lost): the token is spent on this node and the
                // credential the agent proposed is that node's, so the answer is the first one's.
                let again: Option<(String, String)> = sqlx::query_as(
                    "SELECT n.id, n.name FROM join_tokens t JOIN nodes n ON n.id = t.node_id \
                     JOIN node_credentials c ON c.node_id = n.id \
                     WHERE t.secret_sha256 = $1 AND t.used_at_ms IS NOT NULL \
                       AND c.secret_sha256 = $2 AND c.revoked_at_ms IS NULL",
                )
                .bind(token_sha256)
                .bind(credential_sha256)
                .fetch_optional(&mut *tx)
                .await?;
                return again.ok_or_else(|| StoreError::NotFound { what: "join token".to_string() });
            };
            let named = token_name.is_some();
            let name = token_name.unwrap_or_else(|| hostname.to_string());
            let existing: Option<(String,)> =
                sqlx::query_as("SELECT id FROM nodes WHERE name = $1").bind(&name).fetch_optional(&mut *tx).await?;
            let (node_id, action) = match existing {
                // Taking over a node (and revoking its credentials) needs a token an admin made for that node: an
                // unnamed token only ever creates a node, whatever host name its holder reports.
                Some(_) if !named => return Err(StoreError::Conflict { constraint: "nodes.name".to_string() }),
                Some((id,)) => {
                    sqlx::query(
                        "UPDATE node_credentials SET revoked_at_ms = $1 WHERE node_id = $2 AND revoked_at_ms IS NULL",
                    )
                    .bind(now)
                    .bind(&id)
                    .execute(&mut *tx)
                    .await?;
                    (id, "node.rejoin")
                }
                None => {
                    let id = new_id();
                    sqlx::query("INSERT INTO nodes (id, name, created_at_ms) VALUES ($1, $2, $3)")
                        .bind(&id)
                        .bind(&name)
                        .bind(now)
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| on_constraint(e, "nodes.name"))?;
                    (id, "node.join")
                }
            };
            sync_gpus!(&mut *tx, dialect, &node_id, gpus);
            sqlx::query(
                "INSERT INTO node_credentials (id, node_id, secret_sha256, created_at_ms) VALUES ($1, $2, $3, $4)",
            )
            .bind(new_id())
            .bind(&node_id)
            .bind(credential_sha256)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(|e| on_constraint(e, "node_credentials"))?;
            sqlx::query("UPDATE join_tokens SET node_id = $1 WHERE id = $2")
                .bind(&node_id)
                .bind(&token_id)
                .execute(&mut *tx)
                .await?;
            sqlx::query("UPDATE nodes SET inventory = $1, last_seen_ms = $2 WHERE id = $3")
                .bind(to_json(inventory))
                .bind(now)
                .bind(&node_id)
                .execute(&mut *tx)
                .await?;
            let after = serde_json::json!({ "name": name, "join_token": token_id, "inventory": inventory });
            audit_insert(&mut tx, &format!("node:{name}"), action, &format!("node/{node_id}"), None, Some(after.to_string()))
                .await?;
            tx.commit().await?;
            if action == "node.rejoin" {
                // The node's previous credentials are revoked: its open sockets close (every replica).
                self.changes.node_credentials_revoked(&node_id);
                self.changes.node_devices_changed(&node_id);
            }
            Ok((node_id, name))
        })
    }

    /// Records a node's inventory (agents send it every time they start): GPUs it does not know yet are
    /// registered, known ones get their index and MIG mode updated.
    pub async fn update_inventory(
        &self,
        node_id: &str,
        gpus: &[NewGpu],
        inventory: &Inventory,
        actor: &str,
    ) -> Result<(), StoreError> {
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let before: Option<(Option<String>,)> = sqlx::query_as("SELECT inventory FROM nodes WHERE id = $1")
                .bind(node_id)
                .fetch_optional(&mut *tx)
                .await?;
            let Some((before,)) = before else {
                return Err(StoreError::NotFound { what: format!("node {node_id}") });
            };
            sync_gpus!(&mut *tx, dialect, node_id, gpus);
            let after = to_json(inventory);
            sqlx::query("UPDATE nodes SET inventory = $1, last_seen_ms = $2 WHERE id = $3")
                .bind(&after)
                .bind(now_ms())
                .bind(node_id)
                .execute(&mut *tx)
                .await?;
            if before.as_deref() != Some(after.as_str()) {
                audit_insert(&mut tx, actor, "node.inventory", &format!("node/{node_id}"), before, Some(after)).await?;
            }
            tx.commit().await?;
            self.changes.node_devices_changed(node_id);
            Ok(())
        })
    }

    /// Every node's agent record.
    pub async fn agent_records(&self) -> Result<Vec<AgentRecord>, StoreError> {
        on_pool!(self, pool, _dialect => {
            Ok(sqlx::query_as(&format!("SELECT {AGENT_COLUMNS}")).fetch_all(pool).await?)
        })
    }

    /// One node's agent record.
    pub async fn agent_record(&self, node_id: &str) -> Result<AgentRecord, StoreError> {
        on_pool!(self, pool, _dialect => {
            let row: Option<AgentRecord> = sqlx::query_as(&format!("SELECT {AGENT_COLUMNS} WHERE id = $1"))
                .bind(node_id)
                .fetch_optional(pool)
                .await?;
            row.ok_or_else(|| StoreError::NotFound { what: format!("node {node_id}") })
        })
    }

    /// What a node's spec is made of: its spec generation and stored spec hash (read first), then its GPUs and the
    /// live allocations on them.
    pub async fn spec_inputs(&self, node_id: &str) -> Result<SpecInputs, StoreError> {
        on_pool!(self, pool, dialect => {
            let head: Option<(i64, String)> = sqlx::query_as("SELECT generation, spec_hash FROM nodes WHERE id = $1")
                .bind(node_id)
                .fetch_optional(pool)
                .await?;
            let Some((generation, spec_hash)) = head else {
                return Err(StoreError::NotFound { what: format!("node {node_id}") });
            };
            let rows: Vec<super::GpuRow> = sqlx::query_as(&format!(
                "SELECT {GPU_FIELDS} FROM gpus WHERE node_id = $1 ORDER BY idx"
            ))
            .bind(node_id)
            .fetch_all(pool)
            .await?;
            let gpus = rows.into_iter().map(super::gpu_from).collect::<Result<Vec<_>, _>>()?;
            let rows: Vec<super::AllocationRow> = sqlx::query_as(&format!(
                "SELECT {ALLOCATION_FIELDS} FROM allocations a JOIN gpus g ON g.id = a.gpu_id \
                 WHERE g.node_id = $1 AND a.state IN ('reserved', 'active')"
            ))
            .bind(node_id)
            .fetch_all(pool)
            .await?;
            let live = rows.into_iter().map(super::allocation_from).collect();
            Ok(SpecInputs { generation, spec_hash, gpus, live })
        })
    }

    /// The nodes holding any of `gpu_ids` (GPU ids), each once, by id: the nodes whose specs a change to those GPUs
    /// moves (an approval reads these two or three, not the fleet).
    pub async fn nodes_of_gpus(&self, gpu_ids: &[String]) -> Result<Vec<String>, StoreError> {
        let mut out = std::collections::BTreeSet::new();
        for chunk in gpu_ids.chunks(500) {
            let sql =
                format!("SELECT DISTINCT node_id FROM gpus WHERE id IN ({})", super::dialect::marks(1, chunk.len()));
            let rows: Vec<(String,)> = on_pool!(self, pool, _dialect => {
                let mut q = sqlx::query_as(&sql);
                for id in chunk {
                    q = q.bind(id);
                }
                q.fetch_all(pool).await?
            });
            out.extend(rows.into_iter().map(|(id,)| id));
        }
        Ok(out.into_iter().collect())
    }

    /// Every node's [`SpecInputs`], by node id: the fleet as [`Store::nodes`] keeps it (read again only when it
    /// changed), every node's generation and the live allocations (the sweep's refresh of every spec: three reads a
    /// node held the refresh lock for seconds at 10,000 nodes, and a read of the 80,000 GPUs took two).
    pub async fn all_spec_inputs(&self) -> Result<Vec<(String, SpecInputs)>, StoreError> {
        let head_columns = "id, generation, spec_hash";
        let heads: Vec<SpecHead> = self.read_rows(head_columns, head_columns, "FROM nodes", "spec heads").await?;
        let fleet = self.fleet().await?;
        let live: Vec<super::AllocationRow> = self
            .read_rows(
                super::layouts::ALLOCATION_FIELDS,
                super::layouts::ALLOCATION_JSON,
                "FROM allocations a WHERE a.state IN ('reserved', 'active')",
                "live allocations",
            )
            .await?;
        let mut by_node: std::collections::HashMap<String, SpecInputs> = heads
            .into_iter()
            .map(|h| {
                (h.id, SpecInputs { generation: h.generation, spec_hash: h.spec_hash, gpus: vec![], live: vec![] })
            })
            .collect();
        let mut node_of_gpu: std::collections::HashMap<&str, &str> = std::collections::HashMap::new();
        for node in fleet.iter() {
            if let Some(inputs) = by_node.get_mut(&node.id) {
                for gpu in &node.gpus {
                    node_of_gpu.insert(&gpu.id, &node.id);
                }
                inputs.gpus = node.gpus.clone();
            }
        }
        for row in live {
            let a: super::Allocation = super::allocation_from(row);
            if let Some(inputs) = node_of_gpu.get(a.gpu_id.as_str()).and_then(|n| by_node.get_mut(*n)) {
                inputs.live.push(a);
            }
        }
        let mut out: Vec<(String, SpecInputs)> = by_node.into_iter().collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Every node's spec generation and hash, by node id.
    pub async fn spec_heads(&self) -> Result<Vec<(String, i64, String)>, StoreError> {
        let rows: Vec<SpecHead> = on_pool!(self, pool, _dialect => {
            sqlx::query_as("SELECT id, generation, spec_hash FROM nodes").fetch_all(pool).await?
        });
        Ok(rows.into_iter().map(|h| (h.id, h.generation, h.spec_hash)).collect())
    }

    /// Moves a node's spec to a new generation when its content (`spec_hash`) changed; returns the new generation,
    /// or `None` when the spec was already that.
    pub async fn bump_spec(&self, node_id: &str, spec_hash: &str) -> Result<Option<i64>, StoreError> {
        on_pool!(self, pool, _dialect => {
            let row: Option<(i64,)> = sqlx::query_as(
                "UPDATE nodes SET generation = generation + 1, spec_hash = $1 \
                 WHERE id = $2 AND spec_hash <> $1 RETURNING generation",
            )
            .bind(spec_hash)
            .bind(node_id)
            .fetch_optional(pool)
            .await?;
            if let Some((generation,)) = row {
                self.changes.node_spec(node_id, generation);
            }
            Ok(row.map(|(g,)| g))
        })
    }

    /// Stores the status a node's agent reported (and counts it as a heartbeat). A status older than the stored
    /// one (a lower `observed_generation`, e.g. a late retry) is not stored; returns whether it was. A status equal
    /// to the stored one (an agent repeats its status every 30 s) counts as stored without a write: at 10,000
    /// nodes those writes were 333 transactions a second that every other writer (an approval, a spec bump) queued
    /// behind on SQLite; the node's heartbeat is written with the others (`touch_nodes`).
    ///
    /// A status that finished a spec generation not told of yet writes `layout.applied` (no step failed) or
    /// `layout.failed` (with the failed steps per GPU), once per generation; a generation told failed is told
    /// applied once a later report shows it without errors.
    pub async fn record_status(&self, node_id: &str, status: &NodeStatus) -> Result<bool, StoreError> {
        let json = to_json(status);
        let stored: Option<(Option<String>, i64)> = on_pool!(self, pool, _dialect => {
            sqlx::query_as("SELECT status, CAST(observed_generation AS BIGINT) FROM nodes WHERE id = $1")
                .bind(node_id)
                .fetch_optional(pool)
                .await?
        });
        let routine = stored.as_ref().is_some_and(|(_, g)| *g == status.observed_generation);
        if stored.and_then(|(s, _)| s).as_deref() == Some(json.as_str()) {
            return Ok(true);
        }
        // A routine report (the generation it applied is told already) is a bulk write: an approval's commit goes
        // first (see [`crate::turns`]).
        if routine {
            self.bulk_turn().await;
        }
        let now = now_ms();
        let errors: Vec<serde_json::Value> = status
            .gpus
            .iter()
            .flat_map(|g| {
                g.errors
                    .iter()
                    .map(|e| serde_json::json!({"gpu": g.uuid, "step": e.step, "code": e.code, "message": e.message}))
            })
            .chain(
                status
                    .errors
                    .iter()
                    .map(|e| serde_json::json!({"gpu": null, "step": e.step, "code": e.code, "message": e.message})),
            )
            .collect();
        let ok = errors.is_empty();
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let done = sqlx::query(
                "UPDATE nodes SET status = $1, observed_generation = $2, status_at_ms = $3, last_seen_ms = $3 \
                 WHERE id = $4 AND observed_generation <= $2",
            )
            .bind(&json)
            .bind(status.observed_generation)
            .bind(now)
            .bind(node_id)
            .execute(&mut *tx)
            .await?;
            let stored = done.rows_affected() == 1;
            if stored && !status.applying && status.observed_generation > 0 {
                // A newer generation is told either way; the same one again only when it went from failed to
                // applied.
                let sql = if ok {
                    "UPDATE nodes SET told_generation = $2, told_ok = $3 WHERE id = $1 AND (told_generation < $2 \
                     OR (told_generation = $2 AND told_ok = $4))"
                } else {
                    "UPDATE nodes SET told_generation = $2, told_ok = $3 WHERE id = $1 AND told_generation < $2"
                };
                let mut q = sqlx::query(sql).bind(node_id).bind(status.observed_generation).bind(ok);
                if ok {
                    q = q.bind(false);
                }
                let told = q.execute(&mut *tx).await?;
                if told.rows_affected() == 1 {
                    let (name,): (String,) =
                        sqlx::query_as("SELECT name FROM nodes WHERE id = $1").bind(node_id).fetch_one(&mut *tx).await?;
                    let kind = if ok { "layout.applied" } else { "layout.failed" };
                    let after = serde_json::json!({"node_id": node_id, "node": name,
                        "generation": status.observed_generation, "errors": errors});
                    system_event(&mut tx, kind, None, &format!("node/{node_id}"),
                        &format!("node:{name}"), after).await?;
                }
            }
            tx.commit().await?;
            Ok(stored)
        })
    }

    /// Every node with the readiness last told of it (`None`: not judged yet) and when it was last heard from.
    pub async fn readiness_told(&self) -> Result<Vec<(String, String, Option<bool>, Option<i64>)>, StoreError> {
        let rows: Vec<Readiness> = on_pool!(self, pool, _dialect => {
            sqlx::query_as("SELECT id, name, told_ready, last_seen_ms FROM nodes ORDER BY id").fetch_all(pool).await?
        });
        Ok(rows.into_iter().map(|r| (r.id, r.name, r.told_ready, r.last_seen_ms)).collect())
    }

    /// Records that `node_id` is `ready` where it was told `was`; a change from a known readiness writes
    /// `node.ready` or `node.not_ready`. Whether this call recorded it (another replica may have first).
    pub async fn tell_readiness(
        &self,
        node_id: &str,
        was: Option<bool>,
        ready: bool,
        last_seen_ms: Option<i64>,
    ) -> Result<bool, StoreError> {
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let done = match was {
                Some(was) => sqlx::query("UPDATE nodes SET told_ready = $2 WHERE id = $1 AND told_ready = $3")
                    .bind(node_id)
                    .bind(ready)
                    .bind(was)
                    .execute(&mut *tx)
                    .await?,
                None => sqlx::query("UPDATE nodes SET told_ready = $2 WHERE id = $1 AND told_ready IS NULL")
                    .bind(node_id)
                    .bind(ready)
                    .execute(&mut *tx)
                    .await?,
            };
            if done.rows_affected() != 1 {
                return Ok(false);
            }
            if was.is_some() {
                let (name,): (String,) =
                    sqlx::query_as("SELECT name FROM nodes WHERE id = $1").bind(node_id).fetch_one(&mut *tx).await?;
                let kind = if ready { "node.ready" } else { "node.not_ready" };
                let after = serde_json::json!({"node_id": node_id, "node": name, "last_seen_ms": last_seen_ms});
                system_event(&mut tx, kind, None, &format!("node/{node_id}"), "system:health",
                    after).await?;
            }
            tx.commit().await?;
            Ok(true)
        })
    }

    /// Writes heartbeats: the last time each node was heard from (never moving backwards), in one transaction.
    pub async fn touch_nodes(&self, seen: &[(String, i64)]) -> Result<(), StoreError> {
        if seen.is_empty() {
            return Ok(());
        }
        // A bulk write: an approval's writes go first (see [`crate::turns`]).
        self.bulk_turn().await;
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            for (node_id, at) in seen {
                sqlx::query(
                    "UPDATE nodes SET last_seen_ms = $1 WHERE id = $2 AND (last_seen_ms IS NULL OR last_seen_ms < $1)",
                )
                .bind(at)
                .bind(node_id)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            Ok(())
        })
    }

    /// Live allocations on `node_id`'s GPUs whose request is approved or provisioning (not active yet).
    pub async fn provisioning(&self, node_id: &str) -> Result<Vec<Provisioning>, StoreError> {
        on_pool!(self, pool, _dialect => {
            let rows: Vec<ProvisioningRow> = sqlx::query_as(
                "SELECT a.id AS allocation_id, a.request_id, a.gpu_id, a.profile, CAST(a.start AS BIGINT) AS start, \
                 a.state, r.state AS request_state \
                 FROM allocations a JOIN gpus g ON g.id = a.gpu_id JOIN slice_requests r ON r.id = a.request_id \
                 WHERE g.node_id = $1 AND a.state IN ('reserved', 'active') \
                 AND r.state IN ('approved', 'provisioning') ORDER BY a.id",
            )
            .bind(node_id)
            .fetch_all(pool)
            .await?;
            rows.into_iter()
                .map(|ProvisioningRow { allocation_id, request_id, gpu_id, profile, start, state, request_state }| {
                    Ok(Provisioning {
                        allocation_id,
                        request_id,
                        gpu_id,
                        profile,
                        start: u8::try_from(start).unwrap_or(u8::MAX),
                        active: state == "active",
                        request_state: state_from(&request_state)?,
                    })
                })
                .collect()
        })
    }

    /// Marks reserved allocations active with the device that serves them (`(allocation id, device UUID)`), in one
    /// transaction; allocations no longer reserved are left alone. Returns how many changed. An allocation whose
    /// request's window starts later (a reservation's) is prepared: its activation time is that start, so that
    /// nothing meters, shows or counts it as in use before then.
    pub async fn activate_allocations(&self, found: &[(String, String)], actor: &str) -> Result<usize, StoreError> {
        let now = now_ms();
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let mut changed = 0;
            for (id, device) in found {
                let done = sqlx::query(
                    "UPDATE allocations SET state = 'active', device_uuid = $1, activated_at_ms = COALESCE(\
                     (SELECT CASE WHEN r.starts_at_ms > $2 THEN r.starts_at_ms END FROM slice_requests r \
                     WHERE r.id = allocations.request_id), $2) WHERE id = $3 AND state = 'reserved'",
                )
                .bind(device)
                .bind(now)
                .bind(id)
                .execute(&mut *tx)
                .await?;
                if done.rows_affected() == 1 {
                    changed += 1;
                    let after = serde_json::json!({ "device_uuid": device }).to_string();
                    audit_insert(&mut tx, actor, "allocation.active", &format!("allocation/{id}"), None, Some(after)).await?;
                }
            }
            tx.commit().await?;
            Ok(changed)
        })
    }

    /// The device UUID of every active allocation and when it is usable from (a prepared one's is ahead):
    /// `(allocation id, device UUID, activated at)`.
    pub async fn allocation_devices(&self, tenant_id: &str) -> Result<Vec<(String, String, i64)>, StoreError> {
        on_pool!(self, pool, _dialect => {
            Ok(sqlx::query_as(
                "SELECT id, device_uuid, COALESCE(activated_at_ms, 0) FROM allocations \
                 WHERE tenant_id = $1 AND state = 'active' AND device_uuid IS NOT NULL",
            )
            .bind(tenant_id)
            .fetch_all(pool)
            .await?)
        })
    }
}

impl Store {
    /// Nodes whose credentials are revoked from now on (by hand or by a rejoin): this process's, and with
    /// PostgreSQL every replica's.
    pub fn node_credential_revocations(&self) -> tokio::sync::broadcast::Receiver<String> {
        self.changes.node_credential_revocations()
    }

    /// Nodes whose devices (the GPUs registered to them, the MIG instances of their stored status) change from now
    /// on: this process's joins and inventories, and with PostgreSQL every writer's, statuses included (a status
    /// stored by this process is not announced here: its caller knows it).
    pub fn node_device_changes(&self) -> tokio::sync::broadcast::Receiver<String> {
        self.changes.node_device_changes()
    }

    /// Whether every change other writers make is seen as it commits (always with SQLite; with PostgreSQL while
    /// the change listener is connected): what is cached may then live until a change says otherwise.
    pub fn sees_every_change(&self) -> bool {
        self.changes.current().is_some()
    }

    /// Node spec changes `(node id, generation)` from now on: this process's, and with PostgreSQL every
    /// replica's.
    pub fn node_spec_changes(&self) -> tokio::sync::broadcast::Receiver<(String, i64)> {
        self.changes.node_specs()
    }
}
