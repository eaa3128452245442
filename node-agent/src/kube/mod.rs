//! `--kube` mode: the node's layout and sharing are put in effect by NVIDIA's GPU Operator instead of NVML writes.
//!
//! - MIG: the agent writes its node's entry into the mig-parted config (a ConfigMap shared by every node; each
//!   agent touches only its own key, with optimistic concurrency on the ConfigMap's `resourceVersion`), sets the
//!   node label `nvidia.com/mig.config` to that entry, and follows `nvidia.com/mig.config.state` (`pending` ->
//!   `success` | `failed`) that mig-manager reports.
//! - Sharing: the agent writes its node's device-plugin config (time-slicing or MPS) into the plugin's ConfigMap
//!   and sets the node label `nvidia.com/device-plugin.config` to it.
//!
//! What mig-parted cannot do, and what the agent does about it:
//! - mig-parted counts profiles per GPU and lets the driver choose placements. After `success` the agent reads
//!   the placements back (NVML, read-only) and reports every instance that is not where the planner put it as
//!   `placement_mismatch`.
//! - mig-manager re-creates every instance of a GPU whose layout changes, and does not wait for the processes in
//!   them. So the agent leaves a GPU at its current layout while any instance on it runs a process
//!   (`instance_busy`), and changes it once they have ended.
//! - The device plugin's sharing config is per node and per resource name: one replica count for all devices of a
//!   resource, time-slicing or MPS for the whole node. A GPU whose sharing cannot be expressed that way is reported
//!   (`sharing_not_uniform`, `sharing_mode_conflict`) and gets what the node's config gives it.
//! - The agent never changes MIG mode (as with NVML): each GPU's entry keeps its current mode.

#[cfg(feature = "kube")]
mod apply;
mod plan;

use std::time::Duration;

#[cfg(feature = "kube")]
pub use apply::{KubeApplier, KubeError};
pub use plan::*;

/// Built without the `kube` feature (as the server's in-process demo agents are, which never run under GPU
/// Operator), the crate has no Kubernetes client: this type has no values, so `Config::kube` is always `None`
/// and the agent applies through its backend.
#[cfg(not(feature = "kube"))]
#[derive(Debug, Clone)]
pub enum KubeApplier {}

#[cfg(not(feature = "kube"))]
impl KubeApplier {
    /// Where it writes (never called: there is no value to call it on).
    pub fn settings(&self) -> &KubeSettings {
        match *self {}
    }

    /// The node's pods (never called: there is no value to call it on).
    pub async fn pods_on_node(&self) -> Result<Vec<NodePod>, std::convert::Infallible> {
        match *self {}
    }

    /// Puts `spec` in effect (never called: there is no value to call it on).
    pub async fn apply(
        &self,
        _backend: &crate::backend::Backend,
        _spec: &tessera_core::api::NodeSpec,
    ) -> tessera_core::api::NodeStatus {
        match *self {}
    }
}

/// A pod on this node, as the API server has it (for naming the pod a GPU process runs in).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePod {
    /// `metadata.uid`.
    pub uid: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `(container id without the runtime prefix, container name)` from the container statuses.
    pub containers: Vec<(String, String)>,
    /// Every container's name (`spec.containers` and init containers).
    pub names: Vec<String>,
}

/// Node label that selects the node's mig-parted config.
pub const MIG_CONFIG_LABEL: &str = "nvidia.com/mig.config";
/// Node label in which mig-manager reports progress.
pub const MIG_STATE_LABEL: &str = "nvidia.com/mig.config.state";
/// Node label that selects the node's device-plugin config.
pub const PLUGIN_CONFIG_LABEL: &str = "nvidia.com/device-plugin.config";
/// The key of the mig-parted config in its ConfigMap.
pub const MIG_CONFIG_KEY: &str = "config.yaml";

/// Where the agent writes, and how long it waits.
#[derive(Debug, Clone)]
pub struct KubeSettings {
    /// The Kubernetes node this agent runs on.
    pub node: String,
    /// Namespace of both ConfigMaps (GPU Operator's).
    pub namespace: String,
    /// The mig-parted ConfigMap (ClusterPolicy `migManager.config.name`).
    pub mig_configmap: String,
    /// The device-plugin ConfigMap (ClusterPolicy `devicePlugin.config.name`).
    pub plugin_configmap: String,
    /// How often mig-manager's state label is read while it works.
    pub poll: Duration,
    /// How long mig-manager may take before the apply is reported as `mig_manager_timeout`.
    pub timeout: Duration,
}

impl KubeSettings {
    /// GPU Operator's usual namespace and Tessera's ConfigMap names.
    pub fn new(node: &str) -> KubeSettings {
        KubeSettings {
            node: node.to_string(),
            namespace: "gpu-operator".to_string(),
            mig_configmap: "tessera-mig-parted-config".to_string(),
            plugin_configmap: "tessera-device-plugin-config".to_string(),
            poll: Duration::from_secs(1),
            timeout: Duration::from_secs(15 * 60),
        }
    }
}
