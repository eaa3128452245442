//! Kubernetes clusters Tessera governs, the namespaces in them that belong to tenants, and the nodes in each.

use serde::{Deserialize, Serialize};
pub use tessera_core::cluster::Mode;

/// A cluster to register.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NewCluster {
    /// Unique name: a DNS label (1-63 characters of `a-z`, `0-9` and `-`, beginning and ending with a letter or
    /// digit).
    #[cfg_attr(feature = "openapi", schema(pattern = "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"))]
    pub name: String,
    /// How its pods get NVIDIA devices: `dra` (NVIDIA's DRA driver; each allocation becomes a ResourceClaim on
    /// exactly its device) or `device_plugin` (NVIDIA's device plugin, which cannot pin a device).
    pub mode: Mode,
    /// The name of a kubeconfig in the server's settings (`[kubernetes.kubeconfigs]`) to reach the cluster with;
    /// absent or null: the server's own in-cluster service account. The file itself is never sent or shown.
    #[serde(default)]
    pub kubeconfig: Option<String>,
}

/// A change to a cluster; absent fields are left as they are.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ClusterUpdate {
    /// A new mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// A kubeconfig name from the server's settings; `null`: the in-cluster service account; absent: unchanged.
    #[serde(default, deserialize_with = "present_or_null", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub kubeconfig: Option<Option<String>>,
}

/// A cluster with its governed namespaces and its nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClusterView {
    /// Id (UUIDv7).
    pub id: String,
    /// Unique name.
    pub name: String,
    /// How its pods get devices.
    pub mode: Mode,
    /// The kubeconfig (by its name in the server's settings) it is reached with; null: the in-cluster service
    /// account.
    pub kubeconfig: Option<String>,
    /// Why this server cannot reach the cluster with those credentials (no kubeconfig of that name in its settings,
    /// or not running in a pod for the in-cluster account); null when it has what it needs.
    pub credentials_problem: Option<String>,
    /// UTC milliseconds.
    pub created_at_ms: i64,
    /// Its namespaces that belong to tenants, by name.
    pub namespaces: Vec<NamespaceView>,
    /// Its nodes, by name.
    pub nodes: Vec<ClusterNode>,
    /// How the controller's last reconcile of it went.
    pub sync: ClusterSync,
}

/// How the controller's last reconcile of a cluster went.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClusterSync {
    /// When the last reconcile completed (every governed namespace holds what Tessera says), UTC milliseconds;
    /// null: none has yet.
    pub synced_at_ms: Option<i64>,
    /// What went wrong since (the cluster unreachable, a call refused, a governed namespace missing); null when
    /// nothing did.
    pub error: Option<String>,
    /// When it went wrong, UTC milliseconds.
    pub error_at_ms: Option<i64>,
}

/// A node of a cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClusterNode {
    /// Node id.
    pub id: String,
    /// Node name.
    pub name: String,
}

/// A namespace of a cluster that belongs to a tenant: Tessera labels it, keeps its ResourceQuota and writes the
/// tenant's ResourceClaims in it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NamespaceView {
    /// The cluster's id.
    pub cluster: String,
    /// The cluster's name.
    pub cluster_name: String,
    /// The cluster's mode.
    pub mode: Mode,
    /// The namespace.
    pub namespace: String,
    /// The tenant's id.
    pub tenant: String,
    /// The tenant's name.
    pub tenant_name: String,
    /// UTC milliseconds.
    pub created_at_ms: i64,
}

/// Whose a namespace is.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct GovernNamespace {
    /// The tenant's id or name.
    pub tenant: String,
}

/// Which cluster a node is in.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NodeCluster {
    /// The cluster's id or name; `null`: in none. Required, so that an empty body never takes a node out.
    #[serde(deserialize_with = "present")]
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub cluster: Option<String>,
}

/// A field that must be present, `null` allowed.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Option::<String>::deserialize(d)
}

/// A field that, when present, is a value or `null` (absent is the outer `None`, by `default`).
fn present_or_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}
