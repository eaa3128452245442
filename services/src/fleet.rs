//! The fleet: registering nodes and their GPUs (checked against the catalog and the MIG rules), cordoning, and
//! asking the planner where a request would go.

use std::collections::HashMap;

use crate::auth::Permissions;
use tessera_core::layout::{InstanceSpec, PlacedInstance, validate};
use tessera_core::planner::{DemandInput, GpuInput, InstanceInput, Plan, PlanInput, plan};
use tessera_core::request::SliceSpec;

use crate::app::AppState;
use crate::error::ApiError;
use tessera_store::{LayoutProposal, NewGpu, Node, Principal};

/// Most GPUs one node may have.
pub const MAX_GPUS_PER_NODE: usize = 64;

/// A GPU as reported at registration.
#[derive(Debug, Clone)]
pub struct GpuReport {
    /// Index on the node.
    pub index: u32,
    /// NVML UUID.
    pub uuid: String,
    /// Model key, product name or PCI device id.
    pub model: String,
    /// MIG mode.
    pub mig_enabled: bool,
    /// Current MIG instances.
    pub instances: Vec<PlacedInstance>,
}

/// Whether `name` is a usable node name.
pub fn valid_node_name(name: &str) -> bool {
    (1..=253).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
}

/// Checks a node's report against the catalog and the MIG rules and registers it; nothing is stored unless all of
/// it is valid.
pub async fn register(state: &AppState, p: &Principal, name: &str, gpus: &[GpuReport]) -> Result<Node, ApiError> {
    p.require_platform_admin()?;
    if !valid_node_name(name) {
        return Err(ApiError::invalid(
            "invalid_name",
            "a node name is 1-253 characters of a-z, A-Z, 0-9, '-', '.', '_'",
        ));
    }
    if gpus.len() > MAX_GPUS_PER_NODE {
        return Err(ApiError::invalid("too_many_gpus", format!("a node has at most {MAX_GPUS_PER_NODE} GPUs")));
    }
    let mut checked = Vec::with_capacity(gpus.len());
    for g in gpus {
        if gpus.iter().filter(|o| o.index == g.index).count() > 1 {
            return Err(ApiError::invalid("duplicate_gpu_index", format!("gpu {} is listed twice", g.index)));
        }
        let (model, _) = state.catalog.resolve(&g.model).ok_or_else(|| {
            ApiError::invalid(
                "unknown_gpu_model",
                format!("gpu {}: `{}` is not a MIG-capable model in the catalog", g.index, g.model),
            )
        })?;
        checked.push(check_gpu(model, g)?);
    }
    Ok(state.store.register_node(name, &checked, &p.actor()).await?)
}

/// Checks one reported GPU of a resolved `model`: its UUID, and its MIG instances against the MIG rules (none when
/// MIG is off). Returns it as registered.
pub fn check_gpu(model: &tessera_core::GpuModel, g: &GpuReport) -> Result<NewGpu, ApiError> {
    let at = format!("gpu {}", g.index);
    if g.uuid.trim().is_empty() || g.uuid.len() > 128 {
        return Err(ApiError::invalid("invalid_gpu_uuid", format!("{at}: a GPU UUID is 1-128 characters")));
    }
    let layout = if g.mig_enabled {
        let specs: Vec<InstanceSpec> =
            g.instances.iter().map(|i| InstanceSpec { profile: i.profile.clone(), start: Some(i.start) }).collect();
        validate(model, &specs).map_err(|errors| {
            let list = errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
            ApiError::invalid("mig_layout_invalid", format!("{at}: {list}"))
        })?
    } else if g.instances.is_empty() {
        Vec::new()
    } else {
        return Err(ApiError::invalid("mig_disabled", format!("{at}: MIG is off, so it has no MIG instances")));
    };
    Ok(NewGpu {
        index: g.index,
        uuid: g.uuid.trim().to_string(),
        model: model.key.clone(),
        mig_enabled: g.mig_enabled,
        layout,
    })
}

/// Where the planner would put a request's slices on the fleet as it is now, exactly as approval would plan them
/// (nothing is changed).
pub async fn placement(state: &AppState, p: &Principal, request_id: &str) -> Result<Plan, ApiError> {
    let request = super::lookup::get(state, p, request_id).await?;
    // The plan shows nodes, GPUs and layouts: fleet details, for platform admins only.
    p.require_platform_admin()?;
    let SliceSpec::Mig { profile, model } = &request.spec else {
        return Err(ApiError::invalid(
            "placement_not_planned",
            "placements are planned for MIG requests; time-slice, MPS and exclusive requests take whole GPUs",
        ));
    };
    let nodes = state.store.nodes().await?;
    let live = state.store.live_allocations().await?;
    let open = state.store.proposals(Some("proposed")).await?;
    let demand = DemandInput { profile: profile.clone(), count: request.count, model: model.clone() };
    let input = planner_input(&nodes, &live, &open, demand, |n, g| format!("{}/{}", n.name, g.index));
    plan(state.catalog, &input).map_err(|e| ApiError::invalid(e.code(), e.to_string()))
}

/// The planner's view of the fleet for one MIG demand, the same for previews and approvals: instances with a live
/// allocation are in use, and GPUs with an undecided layout proposal take no new instances. `label` names each GPU
/// in the plan.
pub fn planner_input(
    nodes: &[tessera_store::Node],
    live: &[tessera_store::Allocation],
    open: &[LayoutProposal],
    demand: DemandInput,
    label: impl Fn(&tessera_store::Node, &tessera_store::Gpu) -> String,
) -> PlanInput {
    let gpus = nodes
        .iter()
        .flat_map(|n| n.gpus.iter().map(move |g| (n, g)))
        .filter(|(_, g)| g.mig_enabled)
        .map(|(n, g)| GpuInput {
            id: label(n, g),
            model: g.model.clone(),
            instances: g
                .layout
                .iter()
                .map(|i| InstanceInput {
                    profile: i.profile.clone(),
                    start: i.start,
                    in_use: live.iter().any(|a| a.gpu_id == g.id && a.start == i.start),
                })
                .collect(),
            cordoned: g.cordoned,
            layout_pending: open.iter().any(|o| o.gpu_id == g.id),
        })
        .collect();
    PlanInput { gpus, demand: vec![demand] }
}

/// A tenant's allocations with what a workload needs to find them (its members, or platform admins).
pub async fn allocations(
    state: &AppState,
    p: &Principal,
    tenant: &str,
) -> Result<Vec<tessera_api::allocations::AllocationView>, ApiError> {
    use tessera_api::allocations::AllocationView;
    p.require_visible(tenant, "tenant")?;
    let nodes = state.store.nodes().await?;
    let allocations = state.store.tenant_allocations(tenant).await?;
    let devices = state.store.allocation_devices(tenant).await?;
    let expiries = state.store.allocation_expiries(tenant).await?;
    let now = tessera_store::now_ms();
    let ids: Vec<String> = allocations.iter().map(|a| a.id.clone()).collect();
    let claims = state.store.allocation_claims(&ids).await?;
    let processes = state.store.allocation_processes(&ids).await?;
    // Each looked up by id: a tenant holding thousands of allocations on a fleet of 10,000 GPUs costs lookups, not
    // a scan of the fleet and of every list per allocation.
    let gpus: HashMap<&str, (&Node, &tessera_store::Gpu)> =
        nodes.iter().flat_map(|n| n.gpus.iter().map(move |g| (g.id.as_str(), (n, g)))).collect();
    let expiries: HashMap<&str, _> = expiries.iter().map(|t| (t.0.as_str(), t)).collect();
    let devices: HashMap<&str, (&String, i64)> =
        devices.iter().map(|(id, d, from)| (id.as_str(), (d, *from))).collect();
    let mut claims_of: HashMap<&str, Vec<_>> = HashMap::new();
    for c in &claims {
        claims_of.entry(c.allocation_id.as_str()).or_default().push(c);
    }
    let mut processes_of: HashMap<&str, Vec<&tessera_store::attribution::ProcessRow>> = HashMap::new();
    for p in &processes {
        if let Some(a) = p.allocation_id.as_deref() {
            processes_of.entry(a).or_default().push(p);
        }
    }
    let views = allocations
        .into_iter()
        .filter_map(|a| {
            let (node, gpu) = gpus.get(a.gpu_id.as_str()).copied()?;
            let whole = !gpu.mig_enabled;
            let terms = expiries.get(a.id.as_str()).copied();
            // A reservation's slice made before its window is prepared: no device to use until the start.
            let (device, prepared) = match devices.get(a.id.as_str()) {
                Some((_, from)) if *from > now => (None, true),
                Some((d, _)) => (Some((*d).clone()), false),
                None => (None, false),
            };
            let claims = claims_of
                .get(a.id.as_str())
                .into_iter()
                .flatten()
                .map(|c| tessera_api::allocations::ClaimView {
                    cluster: c.cluster_name.clone(),
                    namespace: c.namespace.clone(),
                    name: c.claim.clone(),
                    allocated: c.allocated,
                    pods: c.pod_names(),
                    observed_at_ms: c.observed_at_ms,
                })
                .collect();
            let processes =
                processes_of.get(a.id.as_str()).into_iter().flatten().map(|p| (*p).clone().into()).collect();
            Some(AllocationView {
                claims,
                processes,
                k8s_resource: if whole {
                    "nvidia.com/gpu".to_string()
                } else {
                    format!("nvidia.com/mig-{}", a.profile)
                },
                waiting_for_layout: !whole && !gpu.layout.iter().any(|i| i.profile == a.profile && i.start == a.start),
                device_uuid: device.clone(),
                cuda_visible_devices: device,
                expires_at_ms: terms.map(|t| t.1).unwrap_or(None),
                borrowed: terms.is_some_and(|t| t.2),
                reclaim_at_ms: terms.and_then(|t| t.3),
                reclaim_for: terms.and_then(|t| t.4.clone()),
                model: gpu.model.clone(),
                id: a.id,
                request: a.request_id,
                state: if prepared { "prepared".to_string() } else { a.state },
                node: node.name.clone(),
                gpu_uuid: gpu.uuid.clone(),
                gpu_index: gpu.index,
                profile: a.profile,
                start: a.start,
            })
        })
        .collect();
    Ok(views)
}

/// Drains a GPU for maintenance (platform admins): cordoned at once (nothing new is placed there), its holders told
/// (`gpu.draining`, with the deadline and the reason), and at the deadline the requests still holding slices on it
/// end ([`drain_sweep`]); once it holds nothing it is drained (`gpu.drained`) and stays cordoned, empty, until an
/// admin uncordons it. The node's other GPUs keep serving. Draining a draining GPU again moves its deadline.
pub async fn drain(
    state: &AppState,
    p: &Principal,
    gpu_id: &str,
    body: &tessera_api::nodes::DrainBody,
) -> Result<tessera_api::nodes::GpuDrain, ApiError> {
    use tessera_core::health::{DEFAULT_DRAIN_S, MAX_DRAIN_S};
    p.require_platform_admin()?;
    let seconds = body.deadline_s.unwrap_or(DEFAULT_DRAIN_S);
    if seconds > MAX_DRAIN_S {
        return Err(ApiError::invalid("drain_bad_deadline", format!("`deadline_s` is 0 to {MAX_DRAIN_S} (7 days)")));
    }
    let reason = body.reason.as_deref().unwrap_or("").trim();
    if !reason.is_empty() {
        tessera_core::text::check_reason(reason).map_err(|e| ApiError::invalid("invalid_reason", e.to_string()))?;
    }
    let deadline = tessera_store::now_ms() + i64::from(seconds) * 1000;
    state.store.start_drain(gpu_id, deadline, reason, &p.actor()).await?;
    // A GPU that holds nothing is drained at once.
    state.store.finish_drain(gpu_id).await?;
    drain_view(state, gpu_id).await?.ok_or_else(|| ApiError::NotFound(format!("gpu {gpu_id}")))
}

/// A GPU's drain as the API shows it, with the requests still holding slices on it.
pub async fn drain_view(state: &AppState, gpu_id: &str) -> Result<Option<tessera_api::nodes::GpuDrain>, ApiError> {
    let drains = state.store.drains().await?;
    let live = state.store.live_allocations().await?;
    Ok(drains.into_iter().find(|d| d.gpu_id == gpu_id).map(|d| drain_of(d, &live)))
}

/// A drain record with its holders among `live` allocations.
pub fn drain_of(d: tessera_store::DrainRecord, live: &[tessera_store::Allocation]) -> tessera_api::nodes::GpuDrain {
    let mut holders: Vec<String> = live.iter().filter(|a| a.gpu_id == d.gpu_id).map(|a| a.request_id.clone()).collect();
    holders.sort();
    holders.dedup();
    tessera_api::nodes::GpuDrain {
        deadline_ms: d.deadline_ms,
        started_ms: d.started_ms,
        started_by: d.started_by,
        reason: d.reason,
        drained_at_ms: d.drained_at_ms,
        holders,
    }
}

/// Moves drains on (every sweep): a GPU whose holders are gone is drained; past the deadline, the requests still
/// holding slices on it end (`core::request::RequestState::ended_by_drain`). How many requests it ended.
pub async fn drain_sweep(state: &AppState, now: i64) -> Result<usize, ApiError> {
    let drains = state.store.drains().await?;
    if drains.is_empty() {
        return Ok(0);
    }
    let live = state.store.live_allocations().await?;
    let mut ended = 0;
    for d in &drains {
        let mut holders: Vec<&str> =
            live.iter().filter(|a| a.gpu_id == d.gpu_id).map(|a| a.request_id.as_str()).collect();
        holders.sort_unstable();
        holders.dedup();
        if holders.is_empty() {
            if d.drained_at_ms.is_none() {
                state.store.finish_drain(&d.gpu_id).await?;
            }
            continue;
        }
        // A drained GPU holds slices again (placed by a replica that read it before it was cordoned): draining.
        if d.drained_at_ms.is_some() {
            state.store.reopen_drain(&d.gpu_id).await?;
        }
        if now < d.deadline_ms {
            continue;
        }
        for id in holders {
            let request = match state.store.request(id).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, request = id, "drain: request not read");
                    continue;
                }
            };
            let Some(to) = request.state.ended_by_drain() else { continue };
            let t = tessera_store::Transition {
                id,
                expected_version: Some(request.version),
                to,
                reason: None,
                actor: tessera_store::fleet::DRAIN_ACTOR,
            };
            match state.store.transition(t).await {
                Ok(_) => ended += 1,
                // Ended or moved on meanwhile (released by its holder, expired, turned active): the next sweep
                // looks again.
                Err(tessera_store::StoreError::Conflict { .. } | tessera_store::StoreError::Transition(_)) => {}
                Err(e) => tracing::warn!(error = %e, request = id, "drain: request not ended"),
            }
        }
        state.store.finish_drain(&d.gpu_id).await?;
    }
    Ok(ended)
}
