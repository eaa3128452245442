//! Nodes and their GPUs, registered by hand or by a joining agent, and the GPU flags an admin sets. One SQL body
//! for both backends (see [`super::dialect`]).

use super::requests::audit_insert;
use super::{
    Gpu, GpuRow, NewGpu, Node, Store, StoreError, gpu_from, new_id, nodes_from, now_ms, on_constraint, to_json,
};

/// The columns of a [`GpuRow`] (the table is aliased `g` where it is joined).
pub(super) const GPU_FIELDS: &str =
    "id, node_id, idx, uuid, model, mig_enabled, cordoned, CAST(layout AS TEXT), layout_version, auto_layout";

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
    pub async fn nodes(&self) -> Result<Vec<Node>, StoreError> {
        let gpus = format!("SELECT {GPU_FIELDS} FROM gpus");
        let (nodes, rows): (Vec<(String, String, i64)>, Vec<GpuRow>) = on_pool!(self, pool, _dialect => (
            sqlx::query_as("SELECT id, name, created_at_ms FROM nodes ORDER BY name").fetch_all(pool).await?,
            sqlx::query_as(&gpus).fetch_all(pool).await?,
        ));
        let gpus = rows.into_iter().map(gpu_from).collect::<Result<Vec<Gpu>, _>>()?;
        Ok(nodes_from(nodes, gpus))
    }

    /// Cordons or uncordons a GPU; returns it.
    pub async fn set_cordoned(&self, gpu_id: &str, cordoned: bool, actor: &str) -> Result<Gpu, StoreError> {
        self.set_flag(gpu_id, Flag::Cordoned, cordoned, actor).await
    }

    /// Turns auto-layout on or off for a GPU.
    pub async fn set_auto_layout(&self, gpu_id: &str, enabled: bool, actor: &str) -> Result<Gpu, StoreError> {
        self.set_flag(gpu_id, Flag::AutoLayout, enabled, actor).await
    }

    async fn set_flag(&self, gpu_id: &str, flag: Flag, value: bool, actor: &str) -> Result<Gpu, StoreError> {
        let update = format!("UPDATE gpus SET {} = $1 WHERE id = $2", flag.column());
        let read = format!("SELECT {GPU_FIELDS} FROM gpus WHERE id = $1");
        let action = format!("gpu.{}.{}", flag.column(), if value { "on" } else { "off" });
        let row: GpuRow = on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let done = sqlx::query(&update).bind(value).bind(gpu_id).execute(&mut *tx).await?;
            if done.rows_affected() == 0 {
                return Err(StoreError::NotFound { what: format!("gpu {gpu_id}") });
            }
            let row = sqlx::query_as(&read).bind(gpu_id).fetch_one(&mut *tx).await?;
            audit_insert(&mut tx, actor, &action, &format!("gpu/{gpu_id}"), None, None).await?;
            tx.commit().await?;
            row
        });
        gpu_from(row)
    }
}
