//! Nodes and GPUs on PostgreSQL.

use sqlx::PgPool;

use super::{audit_insert, ms, ts};
use crate::store::{Gpu, GpuRow, Node, StoreError, gpu_from, nodes_from, on_constraint, to_json};

const GPU_FIELDS: &str =
    "id, node_id, idx::bigint, uuid, model, mig_enabled, cordoned, layout::text, layout_version, auto_layout";

pub(crate) async fn register_node(pool: &PgPool, node: &Node, actor: &str) -> Result<(), StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query(&format!("INSERT INTO nodes (id, name, created_at) VALUES ($1, $2, {})", ts(3)))
        .bind(&node.id)
        .bind(&node.name)
        .bind(node.created_at_ms)
        .execute(&mut *tx)
        .await
        .map_err(|e| on_constraint(e, "nodes.name"))?;
    for g in &node.gpus {
        sqlx::query(
            "INSERT INTO gpus (id, node_id, idx, uuid, model, mig_enabled, cordoned, layout, layout_version) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9)",
        )
        .bind(&g.id)
        .bind(&g.node_id)
        .bind(i32::try_from(g.index).unwrap_or(i32::MAX))
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

pub(crate) async fn nodes(pool: &PgPool) -> Result<Vec<Node>, StoreError> {
    let nodes: Vec<(String, String, i64)> =
        sqlx::query_as(&format!("SELECT id, name, {} FROM nodes ORDER BY name", ms("created_at")))
            .fetch_all(pool)
            .await?;
    let rows: Vec<GpuRow> = sqlx::query_as(&format!("SELECT {GPU_FIELDS} FROM gpus")).fetch_all(pool).await?;
    let gpus = rows.into_iter().map(gpu_from).collect::<Result<Vec<Gpu>, _>>()?;
    Ok(nodes_from(nodes, gpus))
}

pub(crate) async fn set_flag(
    pool: &PgPool,
    gpu_id: &str,
    flag: &str,
    value: bool,
    actor: &str,
) -> Result<Gpu, StoreError> {
    let mut tx = pool.begin().await?;
    let row: Option<GpuRow> =
        sqlx::query_as(&format!("UPDATE gpus SET {} = $1 WHERE id = $2 RETURNING {GPU_FIELDS}", column(flag)?))
            .bind(value)
            .bind(gpu_id)
            .fetch_optional(&mut *tx)
            .await?;
    let row = row.ok_or_else(|| StoreError::NotFound { what: format!("gpu {gpu_id}") })?;
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
