//! `tessera serve --demo`: simulated agents in this process, so a fresh machine shows the whole loop with live
//! data. The registered demo node gets an agent whose simulated GPUs carry the node's GPU UUIDs, a second node
//! joins on its own, and at first start two tenants with auto-approval get a few slices, so the heatmaps show
//! load at once. The agents speak to the server over real HTTP on loopback, as remote ones do.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tessera_agent::agent::{self, Config};
use tessera_agent::backend::sim::{SimBackend, SimGpu, SimNode};
use tessera_core::quota::{ApprovalPolicy, Resource};
use tessera_core::request::SliceSpec;
use tessera_core::sharing::{GpuSharing, Sharing};

use crate::app::AppState;
use crate::auth::BOOTSTRAP_ADMIN;
use crate::auth::secrets::token_hash;
use crate::services::requests::Ask;
use crate::store::{NewGpu, Role};
use tessera_core::layout::{InstanceSpec, validate};

/// Name of the node `--demo` registers.
pub const DEMO_NODE: &str = "demo-node-1";

/// The demo node's GPUs: two H100s (one with instances), an A100-40GB in MIG mode and an A30 without MIG.
pub(crate) fn demo_gpus() -> Vec<NewGpu> {
    let catalog = tessera_core::Catalog::builtin();
    let gpu = |index: u32, model: &str, mig: bool, layout: &str| {
        let specs: Vec<InstanceSpec> = layout.split_whitespace().filter_map(|s| s.parse().ok()).collect();
        let placed = catalog.model(model).and_then(|m| validate(m, &specs).ok()).unwrap_or_default();
        NewGpu {
            index,
            uuid: format!("GPU-00000000-0000-4000-8000-{:012x}", 0xdead_0000 + u64::from(index)),
            model: model.to_string(),
            mig_enabled: mig,
            layout: placed,
        }
    };
    vec![
        gpu(0, "H100-80GB", true, ""),
        gpu(1, "H100-80GB", true, "3g.40gb@0 1g.10gb@6"),
        gpu(2, "A100-40GB", true, ""),
        gpu(3, "A30-24GB", false, ""),
    ]
}

/// The node that joins by itself.
pub const SECOND_NODE: &str = "demo-node-2";

/// The simulated hardware of `name`: for the registered demo node, its GPUs (same UUIDs, models and MIG modes);
/// for the second node, two H100s and an A100-80GB.
fn hardware(name: &str) -> SimNode {
    if name != DEMO_NODE {
        let gpus = [("H100-80GB".to_string(), 2), ("A100-80GB".to_string(), 1)];
        return SimNode::new(name, &gpus);
    }
    let mut node = SimNode::new(name, &[]);
    node.gpus = demo_gpus()
        .into_iter()
        .map(|g| SimGpu {
            index: g.index,
            uuid: g.uuid,
            model: g.model,
            mig_enabled: g.mig_enabled,
            instances: Vec::new(),
            sharing: GpuSharing { mig_enabled: g.mig_enabled, gpu: Sharing::Exclusive, instances: Vec::new() },
            next_gi: 1,
        })
        .collect();
    node
}

/// The demo's tenant member: a user of tenant `vision` with no platform rights, so both sides of the portal can be
/// tried (`tessera serve --demo` prints a sign-in link for it).
pub const DEMO_MEMBER: &str = "dana";

/// The demo member, created if missing, and a member of `vision` once that tenant exists (the seeding adds it
/// when it creates the tenant).
pub(crate) async fn member(state: &AppState) -> Result<crate::store::User, crate::store::StoreError> {
    let user = match state.store.user_by_name(DEMO_MEMBER).await {
        Ok(u) => u,
        Err(crate::store::StoreError::NotFound { .. }) => {
            state.store.create_user(DEMO_MEMBER, false, "system:demo").await?
        }
        Err(e) => return Err(e),
    };
    if let Some(vision) = state.store.tenants().await?.into_iter().find(|t| t.name == "vision") {
        state.store.set_membership(&user.id, &vision.id, Role::Member, "system:demo").await?;
    }
    Ok(user)
}

/// Starts the demo agents against the server at `addr`, keeping their state under `data_dir/demo-agents`.
pub async fn start(state: &AppState, addr: SocketAddr, data_dir: &Path) -> Result<(), String> {
    let port = addr.port();
    let base = format!("http://127.0.0.1:{port}");
    for name in [DEMO_NODE, SECOND_NODE] {
        let dir = data_dir.join("demo-agents").join(name);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let secret = format!(
            "{}{}{}",
            crate::auth::secrets::JOIN_TOKEN_PREFIX,
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        let expires = crate::store::now_ms() + 3_600_000;
        state
            .store
            .create_join_token(&token_hash(&secret), Some(name), expires, "system:demo")
            .await
            .map_err(|e| e.to_string())?;
        let mut fresh = hardware(name);
        fresh.seed = 1;
        let sim = SimBackend::with_file(dir.join("sim-gpus.json"), fresh)?;
        let config = Config::new(&base, Some(secret), dir);
        tokio::spawn(async move {
            loop {
                let backend = Box::new(sim.clone());
                match agent::run(config.clone(), backend).await {
                    Ok(()) => return,
                    Err(e) => tracing::warn!(node = name, error = %e, "demo agent stopped; restarting in 5 s"),
                }
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        });
    }
    let state = state.clone();
    tokio::spawn(async move {
        if let Err(e) = seed(&state).await {
            tracing::warn!(error = %e, "demo tenants not seeded");
        }
    });
    Ok(())
}

/// At first start: tenants `vision` and `llm-serving` with quotas and auto-approval, auto-layout on the demo
/// GPUs, and a few slices for each, placed by the planner as any request is.
async fn seed(state: &AppState) -> Result<(), String> {
    let tenants = state.store.tenants().await.map_err(|e| e.to_string())?;
    if tenants.iter().any(|t| t.name == "vision" || t.name == "llm-serving") {
        return Ok(());
    }
    // Wait until both nodes have joined and reported their GPUs.
    let mut joined = false;
    for _ in 0..60 {
        let nodes = state.store.nodes().await.map_err(|e| e.to_string())?;
        if nodes.iter().any(|n| n.name == SECOND_NODE && !n.gpus.is_empty()) {
            for gpu in nodes.iter().flat_map(|n| n.gpus.iter()).filter(|g| g.mig_enabled) {
                state.store.set_auto_layout(&gpu.id, true, "system:demo").await.map_err(|e| e.to_string())?;
            }
            joined = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if !joined {
        return Err(format!("{SECOND_NODE} did not join"));
    }
    let admin = state.store.user_by_name(BOOTSTRAP_ADMIN).await.map_err(|e| e.to_string())?;
    let admin = state.store.principal(&admin.id).await.map_err(|e| e.to_string())?;
    let policy = ApprovalPolicy { auto_approve: true, auto_approve_max_compute_slices: 14 };
    // (tenant, [(profile, model, count)]).
    type Slices<'a> = &'a [(&'a str, &'a str, u32)];
    let asks: [(&str, Slices); 2] = [
        ("vision", &[("3g.40gb", "H100-80GB", 1), ("1g.10gb", "H100-80GB", 3), ("2g.20gb", "A100-80GB", 1)]),
        ("llm-serving", &[("4g.40gb", "H100-80GB", 1), ("2g.10gb", "A100-40GB", 2), ("1g.10gb", "H100-80GB", 2)]),
    ];
    for (name, slices) in asks {
        let tenant = state.store.create_tenant(name, policy, "system:demo").await.map_err(|e| e.to_string())?;
        if name == "vision"
            && let Ok(member) = state.store.user_by_name(DEMO_MEMBER).await
        {
            state
                .store
                .set_membership(&member.id, &tenant.id, Role::Member, "system:demo")
                .await
                .map_err(|e| e.to_string())?;
        }
        state
            .store
            .set_quotas(&tenant.id, &[(Resource::ComputeSlices, Some(28_000))], "system:demo")
            .await
            .map_err(|e| e.to_string())?;
        for (profile, model, count) in slices {
            let spec = SliceSpec::Mig { profile: (*profile).to_string(), model: Some((*model).to_string()) };
            let ask = Ask { tenant: &tenant.id, spec: &spec, count: *count, reason: "demo", duration_s: None };
            if let Err(e) = crate::services::requests::create(state, &admin, ask, None).await {
                tracing::warn!(tenant = name, profile, error = %e, "demo request not created");
            }
        }
    }
    Ok(())
}
