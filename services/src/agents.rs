//! Node agents: what each node's spec is, when it moves to a new generation, who is told, and what a status
//! report changes (allocations turn active when the status shows their instance).
//!
//! A node's spec is computed from the store (its GPUs' approved layouts and the sharing its live allocations
//! need). [`refresh`] recomputes specs after every change that may touch them and moves a node to a new generation
//! when the content changed; the [`Hub`] wakes the connections of agents on this replica, and with PostgreSQL the
//! generation change is also notified to every other replica (see `store::changes`). The sweeper refreshes every
//! node periodically too, so a change whose refresh was lost (a crash between commit and refresh, or two replicas
//! racing) is still pushed within one sweep.

use tessera_core::api::{GpuSpec, Inventory, NodeSpec, NodeStatus, SpecAllocation};
use tessera_core::request::RequestState;
use tessera_core::sharing::{GpuSharing, Sharing};

use crate::app::AppState;
use crate::error::ApiError;
pub use tessera_api::agents::StatusOutcome;
use tessera_store::agents::SpecInputs;
use tessera_store::auth::NodePrincipal;
use tessera_store::{Allocation, Gpu, NewGpu, StoreError, Transition};

pub use super::hub::{HEARTBEAT, Hub, MAX_SOCKETS_PER_NODE, NOT_READY_AFTER_MS, SocketSlot};

/// Forwards node spec changes from the store (this process's and other replicas') to the hub's connections, forgets
/// cached node credentials and device lists when they change, and writes heartbeats to the store every
/// `HEARTBEAT`, until the store is dropped.
pub fn start_background(state: &AppState) -> tokio::task::JoinHandle<()> {
    let state = state.clone();
    tokio::spawn(async move {
        let mut changes = state.store.node_spec_changes();
        let mut revoked = state.store.node_credential_revocations();
        let mut devices = state.store.node_device_changes();
        let mut flush = tokio::time::interval(HEARTBEAT);
        let mut beating: Option<tokio::task::JoinHandle<()>> = None;
        loop {
            tokio::select! {
                // What a node may send telemetry for changed (on this replica or another).
                got = devices.recv() => match got {
                    Ok(node) if node != tessera_store::changes::EVERY_NODE => state.node_gpus.forget(&node),
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => state.node_gpus.clear(),
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                },
                // A revoked node credential must stop working at once: forget every resolved credential (the
                // node's sockets close by themselves, see `http::agents`).
                got = revoked.recv() => match got {
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => state.principals.clear(),
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                },
                got = changes.recv() => match got {
                    Ok((node, generation)) => state.hub.notify(&node, generation),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        // Missed some: tell every node its current generation.
                        if let Ok(heads) = state.store.spec_heads().await {
                            for (node, generation, _) in heads {
                                state.hub.notify(&node, generation);
                            }
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                },
                // Written beside this loop, one write at a time: a heartbeat write may wait (for SQLite's writer,
                // or for an approval's turn, see `tessera_store::turns`), and spec changes reach the nodes meanwhile.
                _ = flush.tick() => if beating.as_ref().is_none_or(|b| b.is_finished()) {
                    let seen = state.hub.take_unsaved();
                    let store = state.store.clone();
                    beating = Some(tokio::spawn(async move {
                        if let Err(e) = store.touch_nodes(&seen).await {
                            tracing::warn!(error = %e, "cannot write node heartbeats");
                        }
                    }));
                }
            }
        }
    })
}

/// The desired state of a node's GPUs: the approved layout of each, and the sharing its live allocations take (a
/// GPU not in MIG mode whose allocations are time-slice or MPS shares is shared that way; every other device is
/// exclusive). A cordoned GPU starts nothing new: its allocations not active yet are left out, so they wait
/// (`gpu_cordoned`) until it is uncordoned, while what runs there keeps running.
pub fn desired(gpus: &[Gpu], live: &[Allocation]) -> Vec<GpuSpec> {
    gpus.iter()
        .map(|g| {
            let live: Vec<&Allocation> =
                live.iter().filter(|a| a.gpu_id == g.id && (!g.cordoned || a.state == "active")).collect();
            let shared = (!g.mig_enabled)
                .then(|| live.iter().find_map(|a| Sharing::from_key(&a.profile)))
                .flatten()
                .unwrap_or(Sharing::Exclusive);
            GpuSpec {
                uuid: g.uuid.clone(),
                index: g.index,
                mig_enabled: g.mig_enabled,
                layout: if g.mig_enabled { g.layout.clone() } else { Vec::new() },
                sharing: GpuSharing { mig_enabled: g.mig_enabled, gpu: shared, instances: Vec::new() },
                allocations: live
                    .iter()
                    .map(|a| SpecAllocation { allocation: a.id.clone(), start: g.mig_enabled.then_some(a.start) })
                    .collect(),
            }
        })
        .collect()
}

/// A digest of a spec's content.
pub fn spec_hash(gpus: &[GpuSpec]) -> String {
    crate::auth::secrets::token_hash(&serde_json::to_string(gpus).unwrap_or_default())
}

/// The spec of `inputs`' node, under the generation stored for it.
fn spec_of(node_id: &str, inputs: &SpecInputs) -> NodeSpec {
    NodeSpec { node: node_id.to_string(), generation: inputs.generation, gpus: desired(&inputs.gpus, &inputs.live) }
}

/// The node's current spec. The generation is read before the content, so the content is never older than its
/// generation says (it may be newer; the next generation then carries the same content).
pub async fn current_spec(state: &AppState, node_id: &str) -> Result<NodeSpec, StoreError> {
    Ok(spec_of(node_id, &state.store.spec_inputs(node_id).await?))
}

/// Recomputes the specs of `nodes` (every node when `None`) and moves each whose content changed to a new
/// generation, telling its connections. Refreshes on this replica run one at a time: each reads its nodes and
/// bumps them in its turn, so that a refresh never writes a spec read before another's newer one.
///
/// Every node (the sweep's, each 15 s) is read outside that turn, and only the nodes whose spec differs from the
/// one stored are read again and bumped in it: the fleet's read (10,000 nodes, 80,000 GPUs) held the turn for
/// seconds, and every approval's refresh waited behind it. A node whose content changed after that read is left to
/// the refresh of the change that made it (every change refreshes its nodes once it is written; a change written
/// before the read is in it).
pub async fn refresh(state: &AppState, nodes: Option<&[String]>) -> Result<(), StoreError> {
    match nodes {
        Some(ids) => {
            let _one = state.hub.refresh.lock().await;
            refresh_in_turn(state, ids).await
        }
        None => {
            let differ: Vec<String> = state
                .store
                .all_spec_inputs()
                .await?
                .into_iter()
                .filter(|(_, inputs)| spec_hash(&desired(&inputs.gpus, &inputs.live)) != inputs.spec_hash)
                .map(|(id, _)| id)
                .collect();
            if differ.is_empty() {
                return Ok(());
            }
            let _one = state.hub.refresh.lock().await;
            refresh_in_turn(state, &differ).await
        }
    }
}

/// Reads each of `ids`' spec inputs and bumps the nodes whose content changed, holding the refresh turn.
async fn refresh_in_turn(state: &AppState, ids: &[String]) -> Result<(), StoreError> {
    for id in ids {
        let inputs = match state.store.spec_inputs(id).await {
            Ok(inputs) => inputs,
            Err(StoreError::NotFound { .. }) => continue,
            Err(e) => return Err(e),
        };
        let hash = spec_hash(&desired(&inputs.gpus, &inputs.live));
        if hash != inputs.spec_hash
            && let Some(generation) = state.store.bump_spec(id, &hash).await?
        {
            state.hub.notify(id, generation);
        }
    }
    Ok(())
}

/// Refreshes the specs of the nodes holding `gpu_ids`, logging (not failing) when it cannot: the sweeper retries.
pub async fn refresh_gpus(state: &AppState, gpu_ids: &[String]) {
    let ids = match state.store.nodes_of_gpus(gpu_ids).await {
        Ok(ids) => ids,
        Err(e) => {
            tracing::warn!(error = %e, "cannot refresh node specs");
            return;
        }
    };
    if let Err(e) = refresh(state, Some(&ids)).await {
        tracing::warn!(error = %e, "cannot refresh node specs");
    }
}

/// Cordons or uncordons a GPU (platform admins), and tells its node at once: on a cordoned GPU nothing new starts
/// (its slices not active yet wait, `gpu_cordoned`); uncordoned, they start. An uncordon also ends a drain.
pub async fn set_cordoned(
    state: &AppState,
    p: &tessera_store::Principal,
    gpu_id: &str,
    cordoned: bool,
    reason: Option<&str>,
) -> Result<Gpu, ApiError> {
    crate::auth::Permissions::require_platform_admin(p)?;
    let reason = reason.map(str::trim).filter(|r| !r.is_empty());
    if let Some(r) = reason {
        tessera_core::text::check_reason(r).map_err(|e| ApiError::invalid("invalid_reason", e.to_string()))?;
    }
    let gpu = state.store.set_cordoned(gpu_id, cordoned, &p.actor(), reason).await?;
    refresh_gpus(state, &[gpu_id.to_string()]).await;
    Ok(gpu)
}

/// Most MIG instances a status may list on one GPU (the largest GPUs have 7; compute instances share theirs).
pub const MAX_INSTANCES_PER_GPU: usize = 16;
/// Longest GPU or MIG device UUID a status may carry.
pub const MAX_DEVICE_ID_LEN: usize = 96;

/// Checks an inventory's GPUs against the catalog: what to register. GPUs of models the catalog does not know are
/// left out (reported, not refused: a node may also hold GPUs Tessera does not manage).
pub fn inventory_gpus(state: &AppState, inventory: &Inventory) -> Result<Vec<NewGpu>, ApiError> {
    if inventory.gpus.len() > crate::fleet::MAX_GPUS_PER_NODE {
        return Err(ApiError::invalid(
            "too_many_gpus",
            format!("a node has at most {} GPUs", crate::fleet::MAX_GPUS_PER_NODE),
        ));
    }
    let mut out = Vec::new();
    for g in &inventory.gpus {
        if inventory.gpus.iter().filter(|o| o.index == g.index || o.uuid == g.uuid).count() > 1 {
            return Err(ApiError::invalid("duplicate_gpu", format!("gpu {} is listed twice", g.index)));
        }
        let resolved = state
            .catalog
            .resolve(&g.name)
            .or_else(|| g.pci_device_id.as_deref().and_then(|p| state.catalog.resolve(p)));
        let Some((model, _)) = resolved else {
            tracing::warn!(gpu = %g.uuid, name = %g.name, "GPU model not in the catalog; not managed");
            continue;
        };
        let report = crate::fleet::GpuReport {
            index: g.index,
            uuid: g.uuid.clone(),
            model: model.key.clone(),
            mig_enabled: g.mig_enabled,
            // A GPU with MIG off has no instances to register; under MIG they are checked by the MIG rules.
            instances: if g.mig_enabled {
                g.instances
                    .iter()
                    .map(|i| tessera_core::layout::PlacedInstance { profile: i.profile.clone(), start: i.start })
                    .collect()
            } else {
                Vec::new()
            },
        };
        out.push(crate::fleet::check_gpu(model, &report)?);
    }
    Ok(out)
}

pub use tessera_core::attribution::MAX_PROCESS_FIELD_LEN;

/// Refuses a status whose processes are too many, name a device the GPU does not have, or carry overlong fields.
fn check_processes(status: &NodeStatus) -> Result<(), ApiError> {
    use tessera_core::attribution::MAX_PROCESSES_PER_NODE;
    let count: usize = status.gpus.iter().map(|g| g.processes.len()).sum();
    if count > MAX_PROCESSES_PER_NODE {
        return Err(ApiError::invalid(
            "too_many_processes",
            format!("a status lists at most {MAX_PROCESSES_PER_NODE} processes; this one lists {count}"),
        ));
    }
    for g in &status.gpus {
        for p in &g.processes {
            if p.device != g.uuid && !g.instances.iter().any(|i| i.uuid == p.device) {
                return Err(ApiError::invalid(
                    "invalid_process_device",
                    format!(
                        "process {} runs on {}, which is neither GPU {} nor one of its MIG devices",
                        p.pid, p.device, g.uuid
                    ),
                ));
            }
            let pod = p.pod.iter().flat_map(|x| [&x.namespace, &x.pod, &x.container]);
            let fields = p.user.iter().chain(&p.command).chain(pod);
            if let Some(f) = fields.into_iter().find(|f| !tessera_core::attribution::valid_field(f)) {
                return Err(ApiError::invalid(
                    "invalid_process",
                    format!(
                        "process {}: `{}` is not 1-{MAX_PROCESS_FIELD_LEN} printable characters",
                        p.pid,
                        f.escape_debug()
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Judges every process the node reports (`tessera_core::attribution`) and keeps them; the first sight of a process
/// as unallocated use is an event to platform admins and the device's holders.
async fn attribute(state: &AppState, node: &NodePrincipal, status: &NodeStatus) -> Result<(), ApiError> {
    use tessera_core::attribution::{Holder, Verdict, judge};
    use tessera_store::attribution::JudgedProcess;
    let reported = status.gpus.iter().any(|g| !g.processes.is_empty());
    if !reported && !state.store.node_has_processes(&node.node_id).await? {
        return Ok(());
    }
    let holders = state.store.node_holders(&node.node_id).await?;
    let namespaces = state.store.node_namespaces(&node.node_id).await?;
    let gpu_ids = state.store.node_gpu_ids(&node.node_id).await?;
    let held: Vec<Holder<'_>> =
        holders.iter().map(|(device, allocation, tenant)| Holder { device, allocation, tenant }).collect();
    let tenant_of = |ns: &str| namespaces.iter().find(|(n, _)| n == ns).map(|(_, t)| t.as_str());
    let mut judged = Vec::new();
    for g in &status.gpus {
        // A GPU the node does not have (by UUID) is not judged: the status's other checks say so elsewhere.
        let Some((gpu_id, _)) = gpu_ids.iter().find(|(_, uuid)| *uuid == g.uuid) else { continue };
        for p in &g.processes {
            // A node in no cluster (or a cluster with no governed namespace) cannot tell whose a pod is: its pods
            // are judged as processes of no pod.
            let bare;
            let judged_as = if namespaces.is_empty() && p.pod.is_some() {
                bare = tessera_core::attribution::GpuProcess { pod: None, ..p.clone() };
                &bare
            } else {
                p
            };
            let (allocation, stray) = match judge(judged_as, &held, tenant_of) {
                Verdict::Allocated(h) => (Some(h.allocation.to_string()), None),
                Verdict::Shared => (None, None),
                Verdict::Unallocated(why) => (None, Some(why)),
            };
            let mut tenants: Vec<String> =
                held.iter().filter(|h| h.device == p.device).map(|h| h.tenant.to_string()).collect();
            tenants.sort_unstable();
            tenants.dedup();
            judged.push(JudgedProcess {
                gpu_id: gpu_id.clone(),
                process: p.clone(),
                allocation,
                stray,
                holders: tenants,
            });
        }
    }
    for j in state.store.record_processes(&node.node_id, &node.node_name, &judged).await? {
        tracing::warn!(node = %node.node_name, device = %j.process.device, pid = j.process.pid,
            reason = j.stray.map(|s| s.code()).unwrap_or_default(), "unallocated GPU use");
    }
    Ok(())
}

/// Stores a node's status and activates the allocations whose instance it shows: a MIG allocation when its GPU
/// has the instance at its placement, a whole-GPU allocation when the agent has applied the current spec (and so
/// the GPU's sharing) without an error on that GPU. A request turns active once all its allocations are.
pub async fn ingest_status(
    state: &AppState,
    node: &NodePrincipal,
    status: &NodeStatus,
) -> Result<StatusOutcome, ApiError> {
    let outcome = store_status(state, node, status).await?;
    // After the activations: a process on a device this very status activated runs under its allocation.
    if outcome.stored {
        attribute(state, node, status).await?;
    }
    Ok(outcome)
}

async fn store_status(state: &AppState, node: &NodePrincipal, status: &NodeStatus) -> Result<StatusOutcome, ApiError> {
    if status.gpus.len() > crate::fleet::MAX_GPUS_PER_NODE {
        return Err(ApiError::invalid("too_many_gpus", "a status lists at most 64 GPUs"));
    }
    if let Some(g) = status.gpus.iter().find(|g| g.instances.len() > MAX_INSTANCES_PER_GPU) {
        return Err(ApiError::invalid(
            "too_many_instances",
            format!("GPU {} lists {} instances; a GPU has at most {MAX_INSTANCES_PER_GPU}", g.uuid, g.instances.len()),
        ));
    }
    let too_long = |id: &str| id.is_empty() || id.len() > MAX_DEVICE_ID_LEN;
    if status.gpus.iter().any(|g| too_long(&g.uuid) || g.instances.iter().any(|i| too_long(&i.uuid))) {
        return Err(ApiError::invalid(
            "invalid_uuid",
            format!("GPU and MIG device UUIDs are 1-{MAX_DEVICE_ID_LEN} characters"),
        ));
    }
    let mut seen = std::collections::HashSet::new();
    if let Some(g) = status.gpus.iter().find(|g| !seen.insert(g.uuid.as_str())) {
        return Err(ApiError::invalid("duplicate_gpu", format!("GPU {} is listed twice", g.uuid)));
    }
    check_processes(status)?;
    let now = tessera_store::now_ms();
    if let Some((g, e)) =
        status.gpus.iter().find_map(|g| g.health.as_ref().and_then(|h| h.check(now).err()).map(|e| (g, e)))
    {
        return Err(ApiError::invalid("invalid_health", format!("GPU {}: {}", g.uuid, e.0)));
    }
    state.hub.seen(&node.node_id);
    let stored = state.store.record_status(&node.node_id, status).await?;
    if stored {
        // The instances it reports are the MIG devices it may send telemetry for from now on (other replicas hear
        // of it from the store when they changed).
        state.node_gpus.observe_status(&node.node_id, status);
        // Health: judged per GPU of this node (the store looks each UUID up under the node: a node cannot judge
        // another node's GPU).
        let reports: Vec<(String, tessera_core::health::GpuHealthReport)> =
            status.gpus.iter().filter_map(|g| g.health.clone().map(|h| (g.uuid.clone(), h))).collect();
        if !reports.is_empty() {
            for change in state.store.record_health(&node.node_id, &reports).await? {
                tracing::warn!(gpu = %change.uuid, from = change.from.as_str(), to = change.to.as_str(),
                    findings = ?change.findings.iter().map(|f| f.code.as_str()).collect::<Vec<_>>(),
                    cordoned = change.newly_cordoned, "GPU health changed");
            }
        }
    }
    let mut outcome = StatusOutcome { stored, ..Default::default() };
    if !stored {
        return Ok(outcome);
    }
    let pending = state.store.provisioning(&node.node_id).await?;
    if pending.is_empty() {
        return Ok(outcome);
    }
    let inputs = state.store.spec_inputs(&node.node_id).await?;
    let applied = status.observed_generation >= inputs.generation && !status.applying;
    let mut found = Vec::new();
    for p in pending.iter().filter(|p| !p.active) {
        let Some(gpu) = inputs.gpus.iter().find(|g| g.id == p.gpu_id) else { continue };
        // Nothing new starts on a cordoned GPU, even where its instance already exists: it waits (`gpu_cordoned`).
        if gpu.cordoned {
            continue;
        }
        let Some(seen) = status.gpus.iter().find(|s| s.uuid == gpu.uuid) else { continue };
        let device = if gpu.mig_enabled {
            seen.instances.iter().find(|i| i.profile == p.profile && i.start == p.start).map(|i| i.uuid.clone())
        } else {
            (applied && !seen.mig_enabled && seen.errors.is_empty()).then(|| gpu.uuid.clone())
        };
        if let Some(device) = device {
            found.push((p.allocation_id.clone(), device));
        }
    }
    let actor = node.actor();
    // What an approval waits for: its writes go before the fleet's bulk (see [`tessera_store::turns`]).
    let _turn = (!found.is_empty()).then(|| state.store.interactive());
    if !found.is_empty() {
        outcome.activated = state.store.activate_allocations(&found, &actor).await?;
    }
    // Requests move on from what is active now (so a report after a crash between the two steps still does it).
    let mut requests: Vec<&str> = pending.iter().map(|p| p.request_id.as_str()).collect();
    requests.sort_unstable();
    requests.dedup();
    for request_id in requests {
        let mine: Vec<_> = pending.iter().filter(|p| p.request_id == request_id).collect();
        let active =
            |p: &&tessera_store::agents::Provisioning| p.active || found.iter().any(|(id, _)| *id == p.allocation_id);
        let all = mine.iter().all(active);
        let any = mine.iter().any(active);
        let mut now = mine[0].request_state;
        let mut steps = Vec::new();
        if any && now == RequestState::Approved {
            steps.push(RequestState::Provisioning);
            now = RequestState::Provisioning;
        }
        // Slices made for a reservation turn active at its start (the server's sweep does it then), not before.
        if all
            && now == RequestState::Provisioning
            && tessera_store::reservations::may_activate(
                now,
                state.store.request_starts_at(request_id).await?,
                tessera_store::now_ms(),
            )
        {
            steps.push(RequestState::Active);
        }
        for to in steps {
            let t = Transition { id: request_id, expected_version: None, to, reason: None, actor: &actor };
            match state.store.transition(t).await {
                Ok(r) if r.state == RequestState::Active => outcome.requests_active += 1,
                Ok(_) => {}
                // Another report or an admin moved it meanwhile: the next report looks again.
                Err(StoreError::Conflict { .. } | StoreError::Transition(_)) => break,
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(outcome)
}

/// Tells of nodes that stopped reporting or report again (`node.not_ready`, `node.ready`), judged as
/// [`ready`] judges; a node never heard from is not judged. How many changes it told (each once across replicas).
pub async fn tell_readiness(state: &AppState) -> Result<usize, ApiError> {
    let now = tessera_store::now_ms();
    let mut told = 0;
    for (id, _name, was, stored_last_seen) in state.store.readiness_told().await? {
        let (ready, last) = ready(state, &id, stored_last_seen, now);
        if last.is_none() || was == Some(ready) {
            continue;
        }
        let changed = state.store.tell_readiness(&id, was, ready, last).await?;
        if changed && !ready {
            // What a silent node last reported running is not running now as far as anyone knows: its next
            // status says again.
            state.store.forget_processes(&id).await?;
        }
        if changed && was.is_some() {
            told += 1;
        }
    }
    Ok(told)
}

/// Per node id with an agent record, whether it counts as ready at `now` ([`ready`]).
pub async fn ready_nodes(state: &AppState, now: i64) -> Result<std::collections::HashMap<String, bool>, StoreError> {
    Ok(state
        .store
        .agent_records()
        .await?
        .into_iter()
        .map(|r| {
            let (ok, _) = ready(state, &r.node_id, r.last_seen_ms, now);
            (r.node_id, ok)
        })
        .collect())
}

/// Whether a node counts as ready: heard from within [`NOT_READY_AFTER_MS`] (by this replica, or as written to
/// the store by any replica).
pub fn ready(state: &AppState, node_id: &str, stored_last_seen: Option<i64>, now: i64) -> (bool, Option<i64>) {
    let last = state.hub.last_seen(node_id).max(stored_last_seen);
    (last.is_some_and(|t| now - t < NOT_READY_AFTER_MS), last)
}
