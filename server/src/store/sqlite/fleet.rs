//! Nodes and GPUs on SQLite.

use sqlx::SqlitePool;

use super::audit_insert;
use crate::store::{Gpu, GpuRow, Node, StoreError, gpu_from, nodes_from, on_constraint, to_json};

const GPU_FIELDS: &str = "id, node_id, idx, uuid, model, mig_enabled, cordoned, layout, layout_version, auto_layout";

pub(crate) async fn register_node(pool: &SqlitePool, node: &Node, actor: &str) -> Result<(), StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO nodes (id, name, created_at_ms) VALUES ($1, $2, $3)")
        .bind(&node.id)
        .bind(&node.name)
        .bind(node.created_at_ms)
        .execute(&mut *tx)
        .await
        .map_err(|e| on_constraint(e, "nodes.name"))?;
    for g in &node.gpus {
        sqlx::query(
            "INSERT INTO gpus (id, node_id, idx, uuid, model, mig_enabled, cordoned, layout, layout_version) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
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
    audit_insert(&mut tx, actor, "node.register", &format!("node/{}", node.id), None, Some(to_json(node))).await?;
    tx.commit().await?;
    Ok(())
}

pub(crate) async fn nodes(pool: &SqlitePool) -> Result<Vec<Node>, StoreError> {
    let nodes: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT id, name, created_at_ms FROM nodes ORDER BY name").fetch_all(pool).await?;
    let rows: Vec<GpuRow> = sqlx::query_as(&format!("SELECT {GPU_FIELDS} FROM gpus")).fetch_all(pool).await?;
    let gpus = rows.into_iter().map(gpu_from).collect::<Result<Vec<Gpu>, _>>()?;
    Ok(nodes_from(nodes, gpus))
}

pub(crate) async fn set_flag(
    pool: &SqlitePool,
    gpu_id: &str,
    flag: &str,
    value: bool,
    actor: &str,
) -> Result<Gpu, StoreError> {
    let mut tx = pool.begin().await?;
    let done = sqlx::query(&format!("UPDATE gpus SET {} = $1 WHERE id = $2", column(flag)?))
        .bind(value)
        .bind(gpu_id)
        .execute(&mut *tx)
        .await?;
    if done.rows_affected() == 0 {
        return Err(StoreError::NotFound { what: format!("gpu {gpu_id}") });
    }
    let row: GpuRow = sqlx::query_as(&format!("SELECT {GPU_FIELDS} FROM gpus WHERE id = $1"))
        .bind(gpu_id)
        .fetch_one(&mut *tx)
        .await?;
    let action = format!("gpu.{flag}.{}", if value { "on" } else { "off" });
    audit_insert(&mut tx, actor, &action, &format!("gpu/{gpu_id}"), None, None).await?;
    tx.commit().await?;
    gpu_from(row)
}

/// The column behind a GPU flag; only known flags reach SQL.
fn column(flag: &str) -> Result<&'static str, StoreError> {
    match flag {
        "cordoned" => Ok("cordoned"),
        "auto_layout" => Ok("auto_layout"),
        other => Err(StoreError::Corrupt(format!("unknown GPU flag {other}"))),
    }
}
