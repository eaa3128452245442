//! Kubernetes clusters Tessera governs, the namespaces in them that belong to tenants, and which cluster each node
//! is in. Every change is audited in its own transaction; the rules on names and modes are
//! `tessera_core::cluster`'s.

use std::collections::HashMap;

use tessera_core::cluster::{MAX_NAMESPACES_PER_TENANT, Mode};

use super::writes::audit_insert;
use super::{Store, StoreError, new_id, now_ms, on_constraint, to_json};

/// A cluster, with its governed namespaces and its nodes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Cluster {
    /// UUIDv7.
    pub id: String,
    /// Unique name.
    pub name: String,
    /// How its pods get devices.
    pub mode: Mode,
    /// The name of the kubeconfig in the server's settings it is reached with; `None`: the server's in-cluster
    /// service account.
    pub kubeconfig: Option<String>,
    /// UTC ms.
    pub created_at_ms: i64,
    /// Its governed namespaces, by name.
    pub namespaces: Vec<GovernedNamespace>,
    /// Its nodes (id, name), by name.
    pub nodes: Vec<(String, String)>,
}

/// A namespace of a cluster that belongs to a tenant.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GovernedNamespace {
    /// The cluster's id.
    pub cluster_id: String,
    /// The cluster's name.
    pub cluster_name: String,
    /// The cluster's mode.
    pub mode: Mode,
    /// The namespace.
    pub namespace: String,
    /// The tenant's id.
    pub tenant_id: String,
    /// The tenant's name.
    pub tenant_name: String,
    /// UTC ms.
    pub created_at_ms: i64,
}

/// A change to a cluster: each field `None` is left as it is.
#[derive(Debug, Clone, Default)]
pub struct ClusterChange {
    /// A new mode.
    pub mode: Option<Mode>,
    /// A new kubeconfig name (`Some(None)`: the in-cluster service account).
    pub kubeconfig: Option<Option<String>>,
}

#[derive(Debug, sqlx::FromRow)]
struct ClusterRow {
    id: String,
    name: String,
    mode: String,
    kubeconfig: Option<String>,
    created_at_ms: i64,
}

#[derive(Debug, sqlx::FromRow)]
struct NamespaceRow {
    cluster_id: String,
    cluster_name: String,
    mode: String,
    namespace: String,
    tenant_id: String,
    tenant_name: String,
    created_at_ms: i64,
}

#[derive(Debug, sqlx::FromRow)]
struct ClusterNodeRow {
    id: String,
    name: String,
    cluster_id: String,
}

fn mode_from(stored: &str) -> Result<Mode, StoreError> {
    Mode::parse(stored).ok_or_else(|| StoreError::Corrupt(format!("cluster mode `{stored}`")))
}

fn namespace_from(r: NamespaceRow) -> Result<GovernedNamespace, StoreError> {
    Ok(GovernedNamespace {
        mode: mode_from(&r.mode)?,
        cluster_id: r.cluster_id,
        cluster_name: r.cluster_name,
        namespace: r.namespace,
        tenant_id: r.tenant_id,
        tenant_name: r.tenant_name,
        created_at_ms: r.created_at_ms,
    })
}

const NAMESPACE_SELECT: &str = "SELECT n.cluster_id, c.name AS cluster_name, c.mode, n.namespace, n.tenant_id, \
                                t.name AS tenant_name, n.created_at_ms FROM cluster_namespaces n \
                                JOIN clusters c ON c.id = n.cluster_id JOIN tenants t ON t.id = n.tenant_id";

impl Store {
    /// Registers a cluster; a taken name is a conflict on `clusters.name`.
    pub async fn create_cluster(
        &self,
        name: &str,
        mode: Mode,
        kubeconfig: Option<&str>,
        actor: &str,
    ) -> Result<Cluster, StoreError> {
        let c = Cluster {
            id: new_id(),
            name: name.to_string(),
            mode,
            kubeconfig: kubeconfig.map(str::to_string),
            created_at_ms: now_ms(),
            namespaces: vec![],
            nodes: vec![],
        };
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            sqlx::query("INSERT INTO clusters (id, name, mode, kubeconfig, created_at_ms) VALUES ($1, $2, $3, $4, $5)")
                .bind(&c.id)
                .bind(&c.name)
                .bind(c.mode.as_str())
                .bind(&c.kubeconfig)
                .bind(c.created_at_ms)
                .execute(&mut *tx)
                .await
                .map_err(|e| on_constraint(e, "name"))?;
            audit_insert(&mut tx, actor, "cluster.create", &format!("cluster/{}", c.id), None, Some(to_json(&c))).await?;
            tx.commit().await?;
        });
        Ok(c)
    }

    /// Every cluster with its namespaces and nodes, by name.
    pub async fn clusters(&self) -> Result<Vec<Cluster>, StoreError> {
        self.cluster_rows(None).await
    }

    /// A cluster by id.
    pub async fn cluster(&self, id: &str) -> Result<Cluster, StoreError> {
        let found = self.cluster_rows(Some(id)).await?;
        found.into_iter().next().ok_or_else(|| StoreError::NotFound { what: format!("cluster {id}") })
    }

    async fn cluster_rows(&self, id: Option<&str>) -> Result<Vec<Cluster>, StoreError> {
        let (rows, namespaces, nodes): (Vec<ClusterRow>, Vec<NamespaceRow>, Vec<ClusterNodeRow>) = on_pool!(self, pool, _dialect => {
            let mut conn = pool.acquire().await?;
            // `$1` NULL reads every cluster.
            let rows = sqlx::query_as(
                "SELECT id, name, mode, kubeconfig, created_at_ms FROM clusters \
                 WHERE $1 IS NULL OR id = $1 ORDER BY name",
            )
            .bind(id)
            .fetch_all(&mut *conn)
            .await?;
            let namespaces = sqlx::query_as(&format!(
                "{NAMESPACE_SELECT} WHERE $1 IS NULL OR n.cluster_id = $1 ORDER BY n.namespace"
            ))
            .bind(id)
            .fetch_all(&mut *conn)
            .await?;
            let nodes = sqlx::query_as(
                "SELECT id, name, cluster_id FROM nodes \
                 WHERE cluster_id IS NOT NULL AND ($1 IS NULL OR cluster_id = $1) ORDER BY name",
            )
            .bind(id)
            .fetch_all(&mut *conn)
            .await?;
            (rows, namespaces, nodes)
        });
        let mut ns_by: HashMap<String, Vec<GovernedNamespace>> = HashMap::new();
        for r in namespaces {
            ns_by.entry(r.cluster_id.clone()).or_default().push(namespace_from(r)?);
        }
        let mut nodes_by: HashMap<String, Vec<(String, String)>> = HashMap::new();
        for n in nodes {
            nodes_by.entry(n.cluster_id).or_default().push((n.id, n.name));
        }
        rows.into_iter()
            .map(|r| {
                Ok(Cluster {
                    mode: mode_from(&r.mode)?,
                    namespaces: ns_by.remove(&r.id).unwrap_or_default(),
                    nodes: nodes_by.remove(&r.id).unwrap_or_default(),
                    id: r.id,
                    name: r.name,
                    kubeconfig: r.kubeconfig,
                    created_at_ms: r.created_at_ms,
                })
            })
            .collect()
    }

    /// Changes a cluster's mode or credentials.
    pub async fn update_cluster(&self, id: &str, change: &ClusterChange, actor: &str) -> Result<Cluster, StoreError> {
        let before = self.cluster(id).await?;
        let after = Cluster {
            mode: change.mode.unwrap_or(before.mode),
            kubeconfig: change.kubeconfig.clone().unwrap_or_else(|| before.kubeconfig.clone()),
            ..before.clone()
        };
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let done = sqlx::query("UPDATE clusters SET mode = $1, kubeconfig = $2 WHERE id = $3")
                .bind(after.mode.as_str())
                .bind(&after.kubeconfig)
                .bind(id)
                .execute(&mut *tx)
                .await?;
            if done.rows_affected() == 0 {
                return Err(StoreError::NotFound { what: format!("cluster {id}") });
            }
            let object = format!("cluster/{id}");
            audit_insert(&mut tx, actor, "cluster.update", &object, Some(to_json(&before)), Some(to_json(&after)))
                .await?;
            tx.commit().await?;
        });
        self.cluster(id).await
    }

    /// Forgets a cluster (its nodes are then in none). Refused while namespaces of it belong to tenants: each must
    /// be given up first, so that no tenant loses a namespace without a decision about it.
    pub async fn delete_cluster(&self, id: &str, actor: &str) -> Result<(), StoreError> {
        let before = self.cluster(id).await?;
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let locked: Option<(String,)> =
                sqlx::query_as(&format!("SELECT id FROM clusters WHERE id = $1{}", dialect.lock()))
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await?;
            if locked.is_none() {
                return Err(StoreError::NotFound { what: format!("cluster {id}") });
            }
            let (governed,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM cluster_namespaces WHERE cluster_id = $1")
                .bind(id)
                .fetch_one(&mut *tx)
                .await?;
            if governed > 0 {
                return Err(StoreError::InUse {
                    code: "cluster_has_namespaces",
                    detail: format!(
                        "cluster {} still governs {governed} namespace(s) of tenants; give each up \
                         (DELETE /api/v1/clusters/{}/namespaces/NAME) first",
                        before.name, before.id
                    ),
                });
            }
            sqlx::query("UPDATE nodes SET cluster_id = NULL WHERE cluster_id = $1").bind(id).execute(&mut *tx).await?;
            sqlx::query("DELETE FROM clusters WHERE id = $1").bind(id).execute(&mut *tx).await?;
            audit_insert(&mut tx, actor, "cluster.delete", &format!("cluster/{id}"), Some(to_json(&before)), None)
                .await?;
            tx.commit().await?;
        });
        Ok(())
    }

    /// Gives `namespace` of a cluster to a tenant. Answers the mapping and whether it is new; giving it again to
    /// the same tenant changes nothing. A namespace of another tenant is refused (`namespace_taken`: it must be
    /// given up first), as is a tenant past [`MAX_NAMESPACES_PER_TENANT`] in the cluster.
    pub async fn govern_namespace(
        &self,
        cluster_id: &str,
        namespace: &str,
        tenant_id: &str,
        actor: &str,
    ) -> Result<(GovernedNamespace, bool), StoreError> {
        let created = on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let cluster: Option<(String,)> =
                sqlx::query_as(&format!("SELECT id FROM clusters WHERE id = $1{}", dialect.lock()))
                    .bind(cluster_id)
                    .fetch_optional(&mut *tx)
                    .await?;
            if cluster.is_none() {
                return Err(StoreError::NotFound { what: format!("cluster {cluster_id}") });
            }
            let holder: Option<(String, String)> = sqlx::query_as(
                "SELECT n.tenant_id, t.name FROM cluster_namespaces n JOIN tenants t ON t.id = n.tenant_id \
                 WHERE n.cluster_id = $1 AND n.namespace = $2",
            )
            .bind(cluster_id)
            .bind(namespace)
            .fetch_optional(&mut *tx)
            .await?;
            let created = match holder {
                Some((holder, _)) if holder == tenant_id => false,
                Some((_, holder_name)) => {
                    return Err(StoreError::InUse {
                        code: "namespace_taken",
                        detail: format!(
                            "namespace {namespace} belongs to tenant {holder_name}; give it up first \
                             (DELETE it) if it is to change hands"
                        ),
                    });
                }
                None => {
                    let (held,): (i64,) = sqlx::query_as(
                        "SELECT COUNT(*) FROM cluster_namespaces WHERE cluster_id = $1 AND tenant_id = $2",
                    )
                    .bind(cluster_id)
                    .bind(tenant_id)
                    .fetch_one(&mut *tx)
                    .await?;
                    if held >= MAX_NAMESPACES_PER_TENANT as i64 {
                        return Err(StoreError::Rule {
                            code: "too_many_namespaces",
                            detail: format!("a tenant has at most {MAX_NAMESPACES_PER_TENANT} namespaces per cluster"),
                        });
                    }
                    let at = now_ms();
                    sqlx::query(
                        "INSERT INTO cluster_namespaces (cluster_id, namespace, tenant_id, created_at_ms) \
                         VALUES ($1, $2, $3, $4)",
                    )
                    .bind(cluster_id)
                    .bind(namespace)
                    .bind(tenant_id)
                    .bind(at)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| on_constraint(e, "namespace"))?;
                    let after = serde_json::json!({"cluster": cluster_id, "namespace": namespace, "tenant": tenant_id});
                    let object = format!("cluster/{cluster_id}/namespace/{namespace}");
                    audit_insert(&mut tx, actor, "cluster.namespace.govern", &object, None, Some(after.to_string()))
                        .await?;
                    true
                }
            };
            tx.commit().await?;
            created
        });
        let found = self.governed_namespace(cluster_id, namespace).await?;
        Ok((found.ok_or_else(|| StoreError::NotFound { what: format!("namespace {namespace}") })?, created))
    }

    /// One governed namespace.
    pub async fn governed_namespace(
        &self,
        cluster_id: &str,
        namespace: &str,
    ) -> Result<Option<GovernedNamespace>, StoreError> {
        let row: Option<NamespaceRow> = on_pool!(self, pool, _dialect => {
            sqlx::query_as(&format!("{NAMESPACE_SELECT} WHERE n.cluster_id = $1 AND n.namespace = $2"))
                .bind(cluster_id)
                .bind(namespace)
                .fetch_optional(pool)
                .await?
        });
        row.map(namespace_from).transpose()
    }

    /// A tenant's governed namespaces in every cluster, by cluster and namespace name (at most
    /// [`MAX_NAMESPACES_PER_TENANT`] per cluster).
    pub async fn tenant_namespaces(&self, tenant_id: &str) -> Result<Vec<GovernedNamespace>, StoreError> {
        let rows: Vec<NamespaceRow> = on_pool!(self, pool, _dialect => {
            sqlx::query_as(&format!("{NAMESPACE_SELECT} WHERE n.tenant_id = $1 ORDER BY c.name, n.namespace"))
                .bind(tenant_id)
                .fetch_all(pool)
                .await?
        });
        rows.into_iter().map(namespace_from).collect()
    }

    /// Gives a namespace up: Tessera no longer governs it.
    pub async fn release_namespace(&self, cluster_id: &str, namespace: &str, actor: &str) -> Result<(), StoreError> {
        let before = self
            .governed_namespace(cluster_id, namespace)
            .await?
            .ok_or_else(|| StoreError::NotFound { what: format!("namespace {namespace} of cluster {cluster_id}") })?;
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let done = sqlx::query("DELETE FROM cluster_namespaces WHERE cluster_id = $1 AND namespace = $2")
                .bind(cluster_id)
                .bind(namespace)
                .execute(&mut *tx)
                .await?;
            if done.rows_affected() == 0 {
                return Err(StoreError::NotFound { what: format!("namespace {namespace} of cluster {cluster_id}") });
            }
            let object = format!("cluster/{cluster_id}/namespace/{namespace}");
            audit_insert(&mut tx, actor, "cluster.namespace.release", &object, Some(to_json(&before)), None).await?;
            tx.commit().await?;
        });
        Ok(())
    }

    /// Puts a node in a cluster (`None`: in none).
    pub async fn set_node_cluster(
        &self,
        node_id: &str,
        cluster_id: Option<&str>,
        actor: &str,
    ) -> Result<(), StoreError> {
        on_pool!(self, pool, dialect => {
            let mut tx = pool.begin_with(dialect.begin()).await?;
            let before: Option<(Option<String>,)> =
                sqlx::query_as(&format!("SELECT cluster_id FROM nodes WHERE id = $1{}", dialect.lock()))
                    .bind(node_id)
                    .fetch_optional(&mut *tx)
                    .await?;
            let Some((before,)) = before else {
                return Err(StoreError::NotFound { what: format!("node {node_id}") });
            };
            if let Some(c) = cluster_id {
                let found: Option<(String,)> =
                    sqlx::query_as(&format!("SELECT id FROM clusters WHERE id = $1{}", dialect.lock()))
                        .bind(c)
                        .fetch_optional(&mut *tx)
                        .await?;
                if found.is_none() {
                    return Err(StoreError::NotFound { what: format!("cluster {c}") });
                }
            }
            sqlx::query("UPDATE nodes SET cluster_id = $1 WHERE id = $2")
                .bind(cluster_id)
                .bind(node_id)
                .execute(&mut *tx)
                .await?;
            let (b, a) = (serde_json::json!({"cluster": before}), serde_json::json!({"cluster": cluster_id}));
            audit_insert(&mut tx, actor, "node.cluster", &format!("node/{node_id}"), Some(b.to_string()), Some(a.to_string()))
                .await?;
            tx.commit().await?;
        });
        Ok(())
    }
}

impl Store {
    /// A node's id from its id or its name.
    pub async fn node_id(&self, key: &str) -> Result<String, StoreError> {
        let found: Option<(String,)> = on_pool!(self, pool, _dialect => {
            sqlx::query_as("SELECT id FROM nodes WHERE id = $1 OR name = $1 ORDER BY id = $1 DESC LIMIT 1")
                .bind(key)
                .fetch_optional(pool)
                .await?
        });
        found.map(|(id,)| id).ok_or_else(|| StoreError::NotFound { what: format!("node {key}") })
    }
}

/// An active allocation on a node of a cluster, as the cluster's objects need it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ClusterAllocation {
    /// The allocation's id.
    pub id: String,
    /// The request it serves.
    pub request_id: String,
    /// Its tenant's id.
    pub tenant_id: String,
    /// MIG profile, or `exclusive`, `timeslice:<n>`, `mps:<n>`.
    pub profile: String,
    /// The device serving it (MIG device or GPU UUID).
    pub device_uuid: String,
}

impl Store {
    /// The active allocations on the nodes of a cluster, by id (bounded by the cluster's devices).
    pub async fn cluster_allocations(&self, cluster_id: &str) -> Result<Vec<ClusterAllocation>, StoreError> {
        Ok(on_pool!(self, pool, _dialect => {
            sqlx::query_as(
                "SELECT a.id, a.request_id, a.tenant_id, a.profile, a.device_uuid FROM allocations a \
                 JOIN gpus g ON g.id = a.gpu_id JOIN nodes n ON n.id = g.node_id \
                 WHERE n.cluster_id = $1 AND a.state = 'active' AND a.device_uuid IS NOT NULL ORDER BY a.id",
            )
            .bind(cluster_id)
            .fetch_all(pool)
            .await?
        }))
    }
}
