//! What the portal reads from the API: the fields it shows, with the core's own types where the API uses them.

use serde::{Deserialize, Serialize};
use tessera_core::api::{ObservedInstance, StepError};
use tessera_core::layout::PlacedInstance;

/// `GET /api/v1/session`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Session {
    /// The user.
    pub user: SessionUser,
    /// Tenant memberships.
    #[serde(default)]
    pub memberships: Vec<Membership>,
}

/// The signed-in user.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionUser {
    /// Id.
    pub id: String,
    /// Name.
    pub name: String,
    /// Platform admin.
    #[serde(default)]
    pub platform_admin: bool,
}

/// A membership.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Membership {
    /// Tenant id.
    pub tenant: String,
    /// `member` or `admin`.
    pub role: String,
}

/// `GET /auth/methods`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SignInMethods {
    /// Single sign-on is configured.
    pub sso: bool,
    /// The identity provider's name.
    #[serde(default)]
    pub sso_name: Option<String>,
    /// Local accounts are accepted.
    pub local: bool,
}

/// A node of `GET /api/v1/nodes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetNode {
    /// Id.
    pub id: String,
    /// Name.
    pub name: String,
    /// `ready`, `applying`, `failed`, `not-ready` or `not-joined`.
    pub state: String,
    /// Desired generation.
    pub generation: i64,
    /// Applied generation.
    pub observed_generation: i64,
    /// Last heartbeat, UTC ms.
    #[serde(default)]
    pub last_seen_ms: Option<i64>,
    /// Its agent.
    #[serde(default)]
    pub agent: Option<AgentInfo>,
    /// Node-level errors of the last apply.
    #[serde(default)]
    pub errors: Vec<StepError>,
    /// GPUs.
    pub gpus: Vec<FleetGpu>,
}

/// A node's agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentInfo {
    /// Version.
    pub version: String,
    /// `nvml`, `sim` or `kube`.
    pub backend: String,
    /// Driver.
    #[serde(default)]
    pub driver_version: Option<String>,
}

/// A GPU of a node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetGpu {
    /// Id.
    pub id: String,
    /// Index on the node.
    pub index: u32,
    /// UUID.
    pub uuid: String,
    /// Catalog model.
    pub model: String,
    /// MIG mode.
    pub mig_enabled: bool,
    /// Cordoned.
    #[serde(default)]
    pub cordoned: bool,
    /// Desired layout.
    #[serde(default)]
    pub layout: Vec<PlacedInstance>,
    /// What the agent reported.
    #[serde(default)]
    pub applied: Option<Vec<ObservedInstance>>,
    /// Errors of the last apply.
    #[serde(default)]
    pub errors: Vec<StepError>,
}

impl FleetGpu {
    /// `ready`, `applying` (the agent has not shown the desired layout yet), `failed` or `cordoned`: what the
    /// fleet page shows per GPU.
    pub fn state(&self, node_state: &str) -> &'static str {
        if !self.errors.is_empty() {
            return "failed";
        }
        if self.cordoned {
            return "cordoned";
        }
        let matches = self.applied.as_ref().is_some_and(|applied| {
            applied.len() == self.layout.len()
                && self
                    .layout
                    .iter()
                    .all(|want| applied.iter().any(|a| a.profile == want.profile && a.start == want.start))
        });
        match node_state {
            "not-ready" | "not-joined" => "unknown",
            _ if !self.mig_enabled || matches => "ready",
            _ => "applying",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_is_applying_until_the_agent_shows_its_layout() {
        let mut gpu: FleetGpu = serde_json::from_value(serde_json::json!({
            "id": "g", "index": 0, "uuid": "GPU-1", "model": "H100-80GB", "mig_enabled": true,
            "layout": [{"profile": "3g.40gb", "start": 4}], "applied": []
        }))
        .expect("gpu");
        assert_eq!(gpu.state("applying"), "applying");
        gpu.applied = Some(vec![serde_json::from_value(serde_json::json!({
            "profile": "3g.40gb", "start": 4, "uuid": "MIG-1", "gi_id": 1, "ci_id": 0, "device_name": "MIG 3g.40gb Device 0", "processes": []
        }))
        .expect("instance")]);
        assert_eq!(gpu.state("ready"), "ready");
        assert_eq!(gpu.state("not-ready"), "unknown");
        gpu.cordoned = true;
        assert_eq!(gpu.state("ready"), "cordoned");
    }
}
