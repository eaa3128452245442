//! Wire types between the server and the node agent: what a node has (inventory), what it should have (spec, with a
//! generation), what it has now (status, with the generation it observed), and its telemetry.
//!
//! Spec and status follow the Kubernetes pattern: the server bumps `generation` whenever the desired state of the
//! node changes; the agent reports `observed_generation`, the generation of the last spec it finished acting on, so
//! `observed_generation == generation` with no errors means "applied".

use serde::{Deserialize, Serialize};

use crate::layout::PlacedInstance;
use crate::sharing::GpuSharing;

/// What an agent finds on its node; sent when it joins and every time it starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Inventory {
    /// The node's host name (the name it joins under unless the join token names one).
    pub hostname: String,
    /// Agent version.
    pub agent_version: String,
    /// `nvml`, `sim` or `kube`.
    pub backend: String,
    /// NVIDIA driver version, when a driver is there.
    #[serde(default)]
    pub driver_version: Option<String>,
    /// CUDA driver API version, e.g. `12.8`.
    #[serde(default)]
    pub cuda_version: Option<String>,
    /// GPUs by index.
    pub gpus: Vec<GpuInventory>,
}

/// One GPU as the agent sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuInventory {
    /// Index (NVML order).
    pub index: u32,
    /// NVML UUID, `GPU-...`.
    pub uuid: String,
    /// Product name as NVML reports it, e.g. `NVIDIA H100 80GB HBM3`; resolved through the catalog by the server.
    pub name: String,
    /// PCI device id, e.g. `0x233010DE`, the fallback for resolving the model.
    #[serde(default)]
    pub pci_device_id: Option<String>,
    /// Framebuffer memory, MiB.
    pub memory_mib: u64,
    /// Whether the GPU supports MIG.
    pub mig_capable: bool,
    /// Whether MIG mode is on (current mode).
    pub mig_enabled: bool,
    /// MIG mode after the next GPU reset, when it differs from the current one.
    #[serde(default)]
    pub mig_pending: Option<bool>,
    /// MIG instances that exist now.
    #[serde(default)]
    pub instances: Vec<ObservedInstance>,
}

/// A MIG instance that exists on a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ObservedInstance {
    /// Profile name, e.g. `3g.40gb`.
    pub profile: String,
    /// Start unit of its placement.
    pub start: u8,
    /// MIG device UUID (`MIG-...`): what `CUDA_VISIBLE_DEVICES` takes.
    pub uuid: String,
    /// GPU instance id.
    pub gi_id: u32,
    /// Compute instance id.
    pub ci_id: u32,
    /// Device name, e.g. `MIG 3g.40gb Device 0`.
    pub device_name: String,
    /// Processes running in it (PIDs on the node).
    #[serde(default)]
    pub processes: Vec<u32>,
}

/// The desired state of one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeSpec {
    /// Node id.
    pub node: String,
    /// Bumped whenever anything below changes.
    pub generation: i64,
    /// Desired state per GPU.
    pub gpus: Vec<GpuSpec>,
}

/// The desired state of one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuSpec {
    /// NVML UUID.
    pub uuid: String,
    /// Index on the node.
    pub index: u32,
    /// MIG mode the GPU must be in (the agent never changes MIG mode: that may need a GPU reset, which is the
    /// admin's call; a GPU in the wrong mode is reported as an error).
    pub mig_enabled: bool,
    /// Every MIG instance the GPU should have, at its exact placement (empty when MIG is off).
    pub layout: Vec<PlacedInstance>,
    /// How the GPU or its instances are shared (time-slicing, MPS).
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub sharing: GpuSharing,
    /// The live allocations on the GPU (the agent labels telemetry with them, and reports idle ones).
    #[serde(default)]
    pub allocations: Vec<SpecAllocation>,
}

/// A live allocation, as its node's agent sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SpecAllocation {
    /// Allocation id.
    pub allocation: String,
    /// The MIG instance's start unit; absent for a share of a whole GPU.
    #[serde(default)]
    pub start: Option<u8>,
}

/// What a node has now, reported after every change and on every heartbeat interval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeStatus {
    /// Generation of the last spec the agent finished acting on (0: none yet).
    pub observed_generation: i64,
    /// Whether the agent is still working on a newer spec than `observed_generation`.
    #[serde(default)]
    pub applying: bool,
    /// Per GPU.
    pub gpus: Vec<GpuStatus>,
    /// Errors not tied to one GPU (e.g. writing the device-plugin config).
    #[serde(default)]
    pub errors: Vec<StepError>,
}

/// What one GPU has now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuStatus {
    /// NVML UUID.
    pub uuid: String,
    /// MIG mode now.
    pub mig_enabled: bool,
    /// MIG instances that exist now, with their UUIDs and processes.
    pub instances: Vec<ObservedInstance>,
    /// Sharing config in effect.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    #[serde(default)]
    pub sharing: Option<GpuSharing>,
    /// Steps of the last apply that failed, or wait (e.g. `instance_busy`).
    #[serde(default)]
    pub errors: Vec<StepError>,
    /// What the driver says of the GPU's health (absent from agents that do not read it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<crate::health::GpuHealthReport>,
    /// Every compute process on the GPU and its MIG devices, with who runs it (absent from agents that do not
    /// read them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<crate::attribution::GpuProcess>,
}

/// One step of applying a spec that did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepError {
    /// The step, e.g. `destroy 3g.40gb@4` or `create 1g.10gb@6`.
    pub step: String,
    /// Stable code, e.g. `instance_busy`, `placement_occupied`, `mig_mode_mismatch`, `driver_error`.
    pub code: String,
    /// What went wrong, for people.
    pub message: String,
}

/// A message from the server to an agent on its WebSocket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerMessage {
    /// The node's current spec (sent on connect and on every change).
    Spec {
        /// The spec.
        spec: NodeSpec,
    },
}

/// A message from an agent to the server on its WebSocket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AgentMessage {
    /// Still here.
    Heartbeat,
    /// What the node has now.
    Status {
        /// The status.
        status: NodeStatus,
    },
}

/// What a node credential is exchanged for at joining.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JoinRequest {
    /// The join token an admin created (`tsj_...`).
    pub token: String,
    /// What the node has.
    pub inventory: Inventory,
    /// A node credential the agent made for itself (`tsn_` and 64 lowercase hex digits, 256 random bits), kept in
    /// its state directory before it asks. With it a join is safe to send again: a join whose answer was lost,
    /// sent again with the same token and credential, is answered as the first one was (the token is not spent
    /// twice, the node not joined twice). Without it the server makes the credential, and a lost answer spends the
    /// token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
}

/// The server closes a connection whose next request's headers have not arrived this long after it connected or
/// answered the previous request: an idle keep-alive connection is closed after this.
pub const SERVER_IDLE_CLOSE: std::time::Duration = std::time::Duration::from_secs(5);

/// The longest a client (the agent, the CLI) keeps an idle connection for its next request: well under
/// [`SERVER_IDLE_CLOSE`], so that a request is never written on a connection the server is closing at that moment
/// (the request and the close would cross, and the request fail with "connection closed" while the server is up).
/// An agent that sends a batch every 5 s opens a connection for each.
pub const CLIENT_IDLE_KEEP: std::time::Duration = std::time::Duration::from_secs(3);

// At least a second between the two, for a client's delay between taking a pooled connection and writing on it.
const _: () = assert!(CLIENT_IDLE_KEEP.as_millis() + 1_000 <= SERVER_IDLE_CLOSE.as_millis());

/// Prefix of node credentials.
pub const NODE_CREDENTIAL_PREFIX: &str = "tsn_";

/// Whether `credential` has the shape of a node credential: the prefix and 64 lowercase hex digits.
pub fn node_credential_well_formed(credential: &str) -> bool {
    credential
        .strip_prefix(NODE_CREDENTIAL_PREFIX)
        .is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

/// The answer to a join.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Joined {
    /// The node's id.
    pub node_id: String,
    /// The node's name.
    pub node_name: String,
    /// The node credential (`tsn_...`), shown once: the agent keeps it in its state directory.
    pub credential: String,
}

/// A batch of telemetry samples from one agent (sent gzip-compressed to `POST /api/v1/agent/telemetry`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TelemetryBatch {
    /// Samples the agent dropped since it started because its buffer was full while the server could not be
    /// reached (a running total).
    #[serde(default)]
    pub dropped: u64,
    /// Series per device.
    pub devices: Vec<DeviceSeries>,
}

/// Samples of one device: a whole GPU, or one MIG instance of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeviceSeries {
    /// `GPU-...` for a GPU, `MIG-...` for a MIG instance.
    pub device: String,
    /// The GPU's UUID (the device itself for a GPU).
    pub gpu: String,
    /// MIG profile, for an instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// MIG start unit, for an instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<u8>,
    /// Samples, oldest first.
    pub samples: Vec<Sample>,
}

/// One sample of one device.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Sample {
    /// When, in ms since the Unix epoch.
    pub t: i64,
    /// Utilisation in percent (0-100): SM activity of the GPU, graphics engine activity of a MIG instance.
    pub util: f32,
    /// Frame-buffer memory used, MiB.
    pub mem_used_mib: f32,
    /// Frame-buffer memory total, MiB.
    pub mem_total_mib: f32,
    /// Power draw, W (whole GPUs only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_w: Option<f32>,
    /// Temperature, °C (whole GPUs only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temp_c: Option<f32>,
}

/// What the server made of a telemetry batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TelemetryAccepted {
    /// Samples kept.
    pub accepted: u64,
    /// Samples refused: a device not on this node, or a time too far from the server's clock.
    pub rejected: u64,
    /// The interval, in milliseconds, the server asks the agent to send its batches at (never sooner than the
    /// agent's own `--telemetry-batch-ms`): longer while the server runs late, back to its floor once it has room.
    /// Absent from servers that do not pace their agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_batch_ms: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_credential_is_the_prefix_and_64_lowercase_hex_digits() {
        let good = format!("tsn_{}", "0123456789abcdef".repeat(4));
        assert!(node_credential_well_formed(&good));
        for bad in [
            String::new(),
            "tsn_".to_string(),
            format!("tsn_{}", "a".repeat(63)),
            format!("tsn_{}", "a".repeat(65)),
            format!("tsn_{}", "A".repeat(64)),
            format!("tsn_{}", "g".repeat(64)),
            format!("tsr_{}", "a".repeat(64)),
            format!(" tsn_{}", "a".repeat(64)),
            format!("tsn_{}é", "a".repeat(62)),
        ] {
            assert!(!node_credential_well_formed(&bad), "{bad:?}");
        }
    }

    #[test]
    fn a_join_without_a_proposed_credential_reads_and_writes_as_before() {
        let old = r#"{"token":"tsj_x","inventory":{"hostname":"h","agent_version":"0","backend":"sim","gpus":[]}}"#;
        let parsed: JoinRequest = serde_json::from_str(old).expect("an older agent's join");
        assert_eq!(parsed.credential, None);
        assert!(!serde_json::to_string(&parsed).expect("json").contains("credential"));
    }
}
