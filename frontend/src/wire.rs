//! What the portal reads into the `tessera-api` views it decodes: how a GPU's state shows, what a role is called
//! for people, a tenant's approval policy as the core takes it. Free functions, since the views belong to the API
//! crate; the views themselves are never copied here.

use tessera_api::Role;
use tessera_api::nodes::{GpuView, NodeView};
use tessera_api::tenants::TenantView;
use tessera_core::quota::ApprovalPolicy;

/// `ready`, `applying` (the agent has not shown the desired layout yet), `failed`, `cordoned` or `unknown` (the
/// node is not heard from): what the fleet page shows per GPU.
pub fn gpu_state(gpu: &GpuView, node_state: &str) -> &'static str {
    if !gpu.errors.is_empty() {
        return "failed";
    }
    if gpu.cordoned {
        return "cordoned";
    }
    let matches = gpu.applied.as_ref().is_some_and(|applied| {
        applied.len() == gpu.layout.len()
            && gpu.layout.iter().all(|want| applied.iter().any(|a| a.profile == want.profile && a.start == want.start))
    });
    match node_state {
        "not-ready" | "not-joined" => "unknown",
        _ if !gpu.mig_enabled || matches => "ready",
        _ => "applying",
    }
}

/// A node of one GPU, named `name`: enough to name the GPU where a node list is expected.
pub fn node_with_gpu(name: String, gpu: GpuView) -> NodeView {
    NodeView {
        id: String::new(),
        name,
        created_at_ms: 0,
        gpus: vec![gpu],
        state: String::new(),
        generation: 0,
        observed_generation: 0,
        last_seen_ms: None,
        agent: None,
        errors: Vec::new(),
    }
}

/// The tenant's approval policy, as the core decides with it.
pub fn approval_policy(tenant: &TenantView) -> ApprovalPolicy {
    ApprovalPolicy {
        auto_approve: tenant.auto_approve,
        auto_approve_max_compute_slices: tenant.auto_approve_max_compute_slices,
    }
}

/// A role as people read it: `member`, `tenant admin`.
pub fn role_label(role: Role) -> &'static str {
    match role {
        Role::Member => "member",
        Role::TenantAdmin => "tenant admin",
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use tessera_api::nodes::GpuView;
    use tessera_core::api::ObservedInstance;
    use tessera_core::layout::PlacedInstance;

    use super::*;

    /// A GPU in MIG mode with nothing on it, as `GET /api/v1/nodes` lists it.
    pub(crate) fn gpu(id: &str, index: u32, uuid: &str) -> GpuView {
        GpuView {
            id: id.into(),
            index,
            uuid: uuid.into(),
            model: "H100-80GB".into(),
            mig_enabled: true,
            cordoned: false,
            layout: Vec::new(),
            layout_version: 0,
            auto_layout: false,
            applied: None,
            errors: Vec::new(),
            in_use: Vec::new(),
            health: Default::default(),
            drain: None,
            now: None,
            layout_waiting: None,
            processes: vec![],
        }
    }

    #[test]
    fn a_gpu_is_applying_until_the_agent_shows_its_layout() {
        let mut gpu =
            GpuView { layout: vec![PlacedInstance { profile: "3g.40gb".into(), start: 4 }], ..gpu("g", 0, "GPU-1") };
        gpu.applied = Some(Vec::new());
        assert_eq!(gpu_state(&gpu, "applying"), "applying");
        gpu.applied = Some(vec![ObservedInstance {
            profile: "3g.40gb".into(),
            start: 4,
            uuid: "MIG-1".into(),
            gi_id: 1,
            ci_id: 0,
            device_name: "MIG 3g.40gb Device 0".into(),
            processes: Vec::new(),
        }]);
        assert_eq!(gpu_state(&gpu, "ready"), "ready");
        assert_eq!(gpu_state(&gpu, "not-ready"), "unknown");
        gpu.cordoned = true;
        assert_eq!(gpu_state(&gpu, "ready"), "cordoned");
    }

    #[test]
    fn roles_read_as_people_say_them() {
        assert_eq!(role_label(Role::TenantAdmin), "tenant admin");
        assert_eq!(role_label(Role::Member), "member");
    }
}
