//! Telemetry: agents' sample batches in, heatmaps, a live stream (server-sent events) and Prometheus exposition
//! out.
//!
//! Platform admins see every device; other users see the devices their tenants hold (or held, for past ranges)
//! allocations on.

use crate::auth::Caller;
use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::time::Duration;
use tessera_services::auth::Permissions;

use axum::body::Bytes;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use tessera_core::api::{TelemetryAccepted, TelemetryBatch};

use super::auth::{NodeAuth, Right};
use super::error::{ApiError, ApiJson, ApiQuery, Problem};
use crate::listen::ClientAddr;
pub use tessera_api::telemetry::{
    HealthMark, Heatmap, HeatmapGroup, HeatmapGroupRow, HeatmapQuery, HeatmapRow, LiveQuery, RowAllocation, RowProcess,
};
use tessera_core::rollup::Tier;
use tessera_services::app::AppState;
use tessera_services::auth::permissions::Scope;
use tessera_services::streams::StreamKind;
use tessera_services::telemetry::{DeviceKey, Latest, MAX_COLUMNS, Metric, Owned, cell_rows};
use tessera_store::telemetry::Metered;
use tessera_store::{Node, Principal, now_ms};

/// Most cells (rows × columns) in one heatmap answer (about 10 MB of JSON).
const MAX_CELLS: usize = 1_500_000;
/// Widest heatmap column, seconds (a year).
const MAX_STEP_S: i64 = 365 * 24 * 3600;

/// Largest drop count an agent may report (2^53 - 1: exact in every JSON reader, and in Prometheus' floats).
const MAX_DROPPED: u64 = (1 << 53) - 1;

/// Most bytes a batch may have once decompressed.
const MAX_BATCH_BYTES: u64 = 32 * 1024 * 1024;

fn bad_body(code: &'static str, detail: String) -> ApiError {
    ApiError::Invalid { status: StatusCode::BAD_REQUEST, code, detail }
}

/// Send a batch of samples (JSON, optionally `Content-Encoding: gzip`). Only the node's own devices are taken:
/// its registered GPUs and the MIG instances its last status reports on them. Series of other devices, series
/// past the server's series limit, and samples dated more than 5 minutes ahead or past the retention are refused
/// (counted in the answer and in `tessera_telemetry_refused_series_total`). The answer says how often to send
/// batches (`next_batch_ms`): longer while the server runs late (see `tessera_services::state::pace`).
#[utoipa::path(post, path = "/api/v1/agent/telemetry", tag = "agent", security(("node" = [])),
    request_body = TelemetryBatch,
    responses((status = 200, body = TelemetryAccepted), (status = 400, body = Problem), (status = 401, body = Problem),
        (status = 403, body = Problem), (status = 422, body = Problem)))]
pub async fn ingest(
    State(state): State<AppState>,
    NodeAuth(node): NodeAuth,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<ApiJson<TelemetryAccepted>, ApiError> {
    let body = body?;
    let gzip = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("gzip"));
    let batch: TelemetryBatch = if gzip {
        let mut json = Vec::with_capacity(body.len() * 6);
        flate2::read::GzDecoder::new(&body[..])
            .take(MAX_BATCH_BYTES + 1)
            .read_to_end(&mut json)
            .map_err(|e| bad_body("invalid_gzip", format!("the body is not valid gzip: {e}")))?;
        if json.len() as u64 > MAX_BATCH_BYTES {
            return Err(ApiError::Invalid {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                code: "batch_too_large",
                detail: format!("a batch decompresses to at most {MAX_BATCH_BYTES} bytes"),
            });
        }
        serde_json::from_slice(&json)
    } else {
        serde_json::from_slice(&body)
    }
    .map_err(|e| ApiError::invalid("invalid_body", format!("not a telemetry batch: {e}")))?;
    state.hub.seen(&node.node_id);
    if batch.dropped > MAX_DROPPED {
        return Err(ApiError::invalid("invalid_body", format!("`dropped` is at most {MAX_DROPPED}")));
    }
    let owned = owned_devices(&state, &node.node_id).await?;
    let mut answer = state.telemetry.ingest(&node.node_id, &owned, batch, now_ms());
    answer.next_batch_ms = Some(state.pace.next_batch_ms());
    Ok(ApiJson(answer))
}

/// The devices the node owns (cached until they change, see [`tessera_services::app::NodeGpuCache`]): its
/// registered GPUs, and the MIG instances its last stored status reports on them.
async fn owned_devices(state: &AppState, node_id: &str) -> Result<tessera_services::app::GpuSet, ApiError> {
    if let Some(owned) = state.node_gpus.get(node_id, state.store.sees_every_change()) {
        return Ok(owned);
    }
    let epoch = state.node_gpus.epoch(node_id);
    let inputs = state.store.spec_inputs(node_id).await?;
    let record = state.store.agent_record(node_id).await?;
    let status = record.status.as_deref().and_then(|s| serde_json::from_str::<tessera_core::api::NodeStatus>(s).ok());
    let owned = std::sync::Arc::new(Owned::of(inputs.gpus.iter().map(|g| g.uuid.as_str()), status.as_ref()));
    state.node_gpus.put(node_id, owned.clone(), epoch);
    Ok(owned)
}

/// What `p` may see: `None` for everything (platform admin), else the devices their tenants held allocations on at
/// some time in `[from, to)`.
async fn visible_devices(
    state: &AppState,
    p: &Principal,
    from: i64,
    to: i64,
) -> Result<Option<HashSet<String>>, ApiError> {
    Ok(held(state, p, from, to).await?.map(|held| held.into_iter().map(|(device, _)| device).collect()))
}

/// `(device, GPU)` of every allocation `p`'s tenants held at some time in `[from, to)`; `None` for a platform admin.
async fn held(state: &AppState, p: &Principal, from: i64, to: i64) -> Result<Option<Vec<(String, String)>>, ApiError> {
    let Scope::Tenants(tenants) = p.reading_scope(None)? else { return Ok(None) };
    let mut out = Vec::new();
    for tenant in &tenants {
        for a in state.store.metered(Some(tenant), from, to).await? {
            out.push((a.device_uuid.unwrap_or_else(|| a.gpu_uuid.clone()), a.gpu_uuid));
        }
    }
    Ok(Some(out))
}

fn find_node<'a>(nodes: &'a [Node], key: &str) -> Result<&'a Node, ApiError> {
    nodes
        .iter()
        .find(|n| n.id == key || n.name == key)
        .ok_or_else(|| ApiError::NotFound(format!("node `{key}` not found")))
}

/// A heatmap of one node or every node (or one GPU model's devices), from the live window or a stored series: one
/// row per device, or with `group` one per node or GPU model, each the mean of its devices. At most 1,500,000 cells
/// (`422 heatmap_too_large`, told before anything is read: a row per device of the live window counts its devices, of
/// a stored series the fleet's GPUs for a platform admin; a group answers at most the fleet's nodes or models).
#[utoipa::path(get, path = "/api/v1/telemetry/heatmap", tag = "telemetry",
    security(("token" = ["user"]), ("session" = ["user"])), params(HeatmapQuery),
    responses((status = 200, body = Heatmap), (status = 400, body = Problem), (status = 404, body = Problem),
        (status = 422, body = Problem)))]
pub async fn heatmap(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiQuery(q): ApiQuery<HeatmapQuery>,
) -> Result<ApiJson<Heatmap>, ApiError> {
    let now = now_ms();
    let metric = q.metric.unwrap_or(Metric::Util);
    // Every time is within `0..=MAX_TIME_MS` and the step within a year: none of the arithmetic below can overflow.
    let to = super::time_param("to", q.to)?.unwrap_or(now);
    let from = super::time_param("from", q.from)?.unwrap_or((to - 15 * 60 * 1000).max(0));
    if from >= to {
        return Err(ApiError::invalid("heatmap_range", "`from` must be before `to`"));
    }
    if q.step.is_some_and(|s| !(1..=MAX_STEP_S).contains(&s)) {
        return Err(ApiError::invalid(
            "heatmap_step",
            format!("`step` is a whole number of seconds from 1 to {MAX_STEP_S}"),
        ));
    }
    let live = from >= now - state.telemetry.window_ms();
    let span = to - from;
    let step_ms = match q.step {
        Some(s) => s.saturating_mul(1000),
        None => (span / 900).max(1),
    };
    // Before the live window, the coarsest stored series the step allows that still reaches back to `from`: whole
    // buckets of it make each column.
    let tier = (!live).then(|| Tier::for_read(from, step_ms, now));
    let unit_ms = tier.map_or(1000, Tier::bucket_ms);
    let step_ms = ((step_ms + unit_ms - 1) / unit_ms).max(1) * unit_ms;
    let from = from - from.rem_euclid(unit_ms);
    let columns = (to - from + step_ms - 1) / step_ms;
    if columns > MAX_COLUMNS {
        return Err(ApiError::invalid(
            "heatmap_too_large",
            format!("{columns} columns asked for; at most {MAX_COLUMNS}: use a larger `step` or a shorter range"),
        ));
    }
    let columns = columns as usize;
    let nodes = state.store.nodes().await?;
    let node_id = match &q.node {
        Some(key) => Some(find_node(&nodes, key)?.id.clone()),
        None => None,
    };
    let fleet = Fleet::of(&nodes);
    let model = q.model.as_deref();
    let of_model = |gpu: &str| model.is_none_or(|m| fleet.gpus.get(gpu).is_some_and(|g| g.model == m));
    // Devices the caller's tenants held at some time from `from` until now; scoped in the database, so that the
    // cost of an answer is bounded by the answer, not by the fleet's history.
    let held_to = to.max(now);
    let tenants = match p.reading_scope(None)? {
        Scope::Fleet => None,
        Scope::Tenants(t) => Some(t),
    };
    let cells = tessera_store::heatmap::CellQuery {
        tier: tier.unwrap_or(Tier::Minute),
        tenants: tenants.as_deref(),
        node_id: node_id.as_deref(),
        model,
        metric,
        from_ms: from,
        step_ms,
        columns,
        held_to_ms: held_to,
    };
    let answer = |rows: Vec<HeatmapRow>, groups: Option<Vec<HeatmapGroupRow>>| Heatmap {
        metric,
        unit: metric.unit().to_string(),
        from_ms: from,
        to_ms: from + step_ms * columns as i64,
        step_ms,
        columns,
        source: tier.map_or("live", Tier::name).to_string(),
        rows,
        groups,
    };
    if let Some(group) = q.group {
        // At most one row per node or model of what the caller sees (the fleet, or the GPUs their tenants held):
        // the answer's size is known before anything is read, and a member learns nothing of the rest of the fleet.
        let held = held(&state, &p, from, held_to).await?;
        let gpus: Vec<&tessera_store::Gpu> = match &held {
            None => fleet.gpus.values().copied().collect(),
            Some(held) => held.iter().filter_map(|(_, gpu)| fleet.gpus.get(gpu.as_str()).copied()).collect(),
        };
        let most = match (group, &node_id, model) {
            (HeatmapGroup::Node, Some(_), _) | (HeatmapGroup::Model, _, Some(_)) | (HeatmapGroup::Fleet, _, _) => 1,
            (HeatmapGroup::Node, None, _) => gpus.iter().map(|g| g.node_id.as_str()).collect::<HashSet<_>>().len(),
            (HeatmapGroup::Model, _, None) => gpus.iter().map(|g| g.model.as_str()).collect::<HashSet<_>>().len(),
        };
        if most.max(1).saturating_mul(columns) > MAX_CELLS {
            return Err(too_large(format!("{most} groups of {columns} columns")));
        }
        // The stored series may name nodes no longer in the fleet, or GPUs it no longer lists (`unknown`): a
        // read past the bound is refused, not answered.
        let limit = (most + 1).saturating_mul(columns + 1);
        let groups = if live {
            let visible: Option<HashSet<String>> =
                held.map(|held| held.into_iter().map(|(device, _)| device).collect());
            let whole_fleet = visible.is_none();
            let seen = |d: &str, gpu: &str| visible.as_ref().is_none_or(|v| v.contains(d)) && of_model(gpu);
            let group_of = |node: &str, _device: &str, gpu: &str, instance: bool| {
                (!(whole_fleet && instance)).then(|| match group {
                    HeatmapGroup::Node => node.to_string(),
                    HeatmapGroup::Model => fleet.gpus.get(gpu).map_or("unknown", |g| g.model.as_str()).to_string(),
                    HeatmapGroup::Fleet => "fleet".to_string(),
                })
            };
            state
                .telemetry
                .window_groups(node_id.as_deref(), seen, group_of, metric, from, step_ms, columns)
                .into_iter()
                .map(|(key, g)| {
                    let values = g.columns.into_iter().map(|(v, _)| v.map(|v| v as f32)).collect();
                    (key, g.devices, values)
                })
                .collect()
        } else {
            let cells = state.store.group_cells(&cells, group, limit).await?;
            if cells.len() >= limit {
                return Err(too_large(format!("more than {most} groups of {columns} columns")));
            }
            group_rows(cells, columns)
        };
        let mut groups: Vec<HeatmapGroupRow> = groups
            .into_iter()
            .map(|(key, devices, values)| HeatmapGroupRow {
                name: match group {
                    HeatmapGroup::Node => fleet.node(&key).map_or_else(|| key.clone(), |n| n.name.clone()),
                    HeatmapGroup::Model | HeatmapGroup::Fleet => key.clone(),
                },
                key,
                devices,
                values,
            })
            .collect();
        groups.sort_by(|a, b| (&a.name, &a.key).cmp(&(&b.name, &b.key)));
        return Ok(ApiJson(answer(Vec::new(), Some(groups))));
    }
    let raw = if live {
        let visible = visible_devices(&state, &p, from, held_to).await?;
        let seen = |d: &str, gpu: &str| visible.as_ref().is_none_or(|v| v.contains(d)) && of_model(gpu);
        // Counted before a value is read: 80,000 devices' rows would be refused after costing half a gigabyte.
        let devices = state.telemetry.window_devices(node_id.as_deref(), seen);
        if devices.saturating_mul(columns) > MAX_CELLS {
            return Err(too_large(format!("{devices} rows of {columns} columns")));
        }
        state.telemetry.window_rows(node_id.as_deref(), seen, metric, from, step_ms, columns)
    } else {
        // The whole fleet's rows are at least its GPUs that reported: refused before a read that would stop at the
        // bound only after reading it (1.5 million cells take seconds).
        if tenants.is_none() {
            let gpus = nodes
                .iter()
                .filter(|n| node_id.as_ref().is_none_or(|id| *id == n.id))
                .flat_map(|n| &n.gpus)
                .filter(|g| model.is_none_or(|m| g.model == m))
                .count();
            if gpus.saturating_mul(columns) > MAX_CELLS {
                return Err(too_large(format!("{gpus} GPUs' rows of {columns} columns")));
            }
        }
        let cells = state.store.device_cells(&cells, MAX_CELLS + 1).await?;
        if cells.len() > MAX_CELLS {
            return Err(too_large(format!("more than {MAX_CELLS} cells with values")));
        }
        cell_rows(cells, columns)
    };
    let holders = current_holders(&state, &p).await?;
    let mut rows: Vec<HeatmapRow> = raw.into_iter().map(|(k, values)| row(&fleet, &holders, k, values)).collect();
    if rows.len().saturating_mul(columns) > MAX_CELLS {
        return Err(too_large(format!("{} rows of {columns} columns", rows.len())));
    }
    mark_health(&state, &p, &nodes, &holders, &mut rows, from, from + step_ms * columns as i64).await?;
    mark_processes(&state, &p, &holders, &mut rows).await?;
    rows.sort_by(|a, b| {
        (&a.node, a.gpu_index, &a.gpu_uuid, a.start.is_some(), a.start, &a.device).cmp(&(
            &b.node,
            b.gpu_index,
            &b.gpu_uuid,
            b.start.is_some(),
            b.start,
            &b.device,
        ))
    });
    Ok(ApiJson(answer(rows, None)))
}

/// A group's row from the store's cells ([`tessera_store::Store::group_cells`], column -1 its device count), as
/// `(key, devices, values)`.
fn group_rows(cells: Vec<tessera_store::heatmap::GroupCell>, columns: usize) -> Vec<(String, u32, Vec<Option<f32>>)> {
    let mut out: Vec<(String, u32, Vec<Option<f32>>)> = Vec::new();
    for c in cells {
        if out.last().is_none_or(|(key, _, _)| *key != c.key) {
            out.push((c.key.clone(), 0, vec![None; columns]));
        }
        let Some((_, devices, values)) = out.last_mut() else { continue };
        match usize::try_from(c.col) {
            Ok(col) if col < columns => values[col] = c.value.map(|v| v as f32),
            Ok(_) => {}
            Err(_) => *devices = u32::try_from(c.devices).unwrap_or(u32::MAX),
        }
    }
    out
}

/// The refusal of a heatmap with more than [`MAX_CELLS`] cells.
fn too_large(what: String) -> ApiError {
    ApiError::invalid(
        "heatmap_too_large",
        format!(
            "{what} asked for; at most {MAX_CELLS} cells: choose a `node`, a `group`, a larger `step` or a shorter range"
        ),
    )
}

/// The most health markers on one row (the newest kept).
const MAX_MARKS_PER_ROW: usize = 50;

/// Puts on each GPU row the changes of its health within `[from, to)`, and its health now. A platform admin sees
/// every change; a tenant member the changes its tenants were told of (a GPU they held turning unhealthy), and the
/// health now of the GPUs they hold slices on now.
async fn mark_health(
    state: &AppState,
    p: &Principal,
    nodes: &[Node],
    holders: &HashMap<String, Vec<Metered>>,
    rows: &mut [HeatmapRow],
    from: i64,
    to: i64,
) -> Result<(), ApiError> {
    let tenants = match p.reading_scope(None)? {
        Scope::Fleet => None,
        Scope::Tenants(t) => Some(t),
    };
    if tenants.is_some() {
        let held_now: HashSet<&str> = holders.values().flatten().map(|a| a.gpu_uuid.as_str()).collect();
        for r in rows.iter_mut().filter(|r| !held_now.contains(r.gpu_uuid.as_str())) {
            r.health = None;
        }
    }
    let shown: HashSet<&str> = rows.iter().filter(|r| r.kind == "gpu").map(|r| r.gpu_uuid.as_str()).collect();
    if shown.is_empty() {
        return Ok(());
    }
    let gpus: HashMap<&str, &str> = nodes
        .iter()
        .flat_map(|n| n.gpus.iter())
        .filter(|g| shown.contains(g.uuid.as_str()))
        .map(|g| (g.id.as_str(), g.uuid.as_str()))
        .collect();
    let ids: Vec<String> = gpus.keys().map(|id| id.to_string()).collect();
    let mut marks: HashMap<&str, Vec<HealthMark>> = HashMap::new();
    for (gpu, at_ms, health, codes) in state.store.health_changes(&ids, tenants.as_deref(), from, to).await? {
        let Some(uuid) = gpus.get(gpu.as_str()) else { continue };
        marks.entry(uuid).or_default().push(HealthMark { at_ms, state: health, codes });
    }
    for r in rows.iter_mut().filter(|r| r.kind == "gpu") {
        if let Some(mut m) = marks.remove(r.gpu_uuid.as_str()) {
            m.drain(..m.len().saturating_sub(MAX_MARKS_PER_ROW));
            r.health_marks = m;
        }
    }
    Ok(())
}

/// The most processes listed on one heatmap row.
const MAX_PROCESSES_PER_ROW: usize = 20;

/// Puts on each row who runs on its device under the allocations the caller sees, and how many processes there
/// are unallocated use (a tenant member: only on devices it holds now). One read, bounded by the rows.
async fn mark_processes(
    state: &AppState,
    p: &Principal,
    holders: &HashMap<String, Vec<Metered>>,
    rows: &mut [HeatmapRow],
) -> Result<(), ApiError> {
    let fleet = matches!(p.reading_scope(None)?, Scope::Fleet);
    let devices: Vec<String> =
        rows.iter().filter(|r| fleet || holders.contains_key(&r.device)).map(|r| r.device.clone()).collect();
    if devices.is_empty() {
        return Ok(());
    }
    let mut by_device: HashMap<String, Vec<tessera_store::attribution::ProcessRow>> = HashMap::new();
    for row in state.store.device_processes(&devices).await? {
        by_device.entry(row.device.clone()).or_default().push(row);
    }
    for r in rows.iter_mut() {
        let Some(processes) = by_device.get(&r.device) else { continue };
        if !fleet && !holders.contains_key(&r.device) {
            continue;
        }
        let seen: HashSet<&str> = holders.get(&r.device).into_iter().flatten().map(|a| a.id.as_str()).collect();
        r.unallocated = u32::try_from(processes.iter().filter(|x| x.stray.is_some()).count()).unwrap_or(u32::MAX);
        r.processes = processes
            .iter()
            .filter_map(|x| {
                let allocation = x.allocation_id.as_deref().filter(|a| fleet || seen.contains(a))?;
                Some(RowProcess {
                    pid: u32::try_from(x.pid).unwrap_or_default(),
                    user: x.user_name.clone(),
                    command: x.command.clone(),
                    pod: x.pod_ref(),
                    allocation: allocation.to_string(),
                })
            })
            .take(MAX_PROCESSES_PER_ROW)
            .collect();
    }
    Ok(())
}

/// Live allocations by device UUID (only the caller's tenants', read per tenant, unless a platform admin).
async fn current_holders(state: &AppState, p: &Principal) -> Result<HashMap<String, Vec<Metered>>, ApiError> {
    let now = now_ms();
    let live = match p.reading_scope(None)? {
        Scope::Fleet => state.store.metered(None, now, now + 1).await?,
        Scope::Tenants(tenants) => {
            let mut all = Vec::new();
            for t in &tenants {
                all.extend(state.store.metered(Some(t), now, now + 1).await?);
            }
            all
        }
    };
    let mut out: HashMap<String, Vec<Metered>> = HashMap::new();
    for a in live {
        if a.released_at_ms.is_some() || !p.can_see(&a.tenant_id) {
            continue;
        }
        out.entry(a.device_uuid.clone().unwrap_or_else(|| a.gpu_uuid.clone())).or_default().push(a);
    }
    Ok(out)
}

/// Nodes by id and GPUs by UUID, so that labelling a series costs a lookup, not a scan of the fleet (80,000 series
/// of 10,000 nodes took seconds of CPU per `/metrics` call).
struct Fleet<'a> {
    nodes: HashMap<&'a str, &'a Node>,
    gpus: HashMap<&'a str, &'a tessera_store::Gpu>,
}

impl<'a> Fleet<'a> {
    fn of(nodes: &'a [Node]) -> Fleet<'a> {
        Fleet {
            nodes: nodes.iter().map(|n| (n.id.as_str(), n)).collect(),
            gpus: nodes.iter().flat_map(|n| &n.gpus).map(|g| (g.uuid.as_str(), g)).collect(),
        }
    }

    fn node(&self, id: &str) -> Option<&'a Node> {
        self.nodes.get(id).copied()
    }

    /// The GPU `uuid` of node `node_id`.
    fn gpu(&self, node_id: &str, uuid: &str) -> Option<&'a tessera_store::Gpu> {
        self.gpus.get(uuid).copied().filter(|g| g.node_id == node_id)
    }
}

fn row(
    fleet: &Fleet<'_>,
    holders: &HashMap<String, Vec<Metered>>,
    k: DeviceKey,
    values: Vec<Option<f32>>,
) -> HeatmapRow {
    let node = fleet.node(&k.node_id);
    let gpu = fleet.gpu(&k.node_id, &k.gpu);
    HeatmapRow {
        health: gpu.filter(|_| k.profile.is_none()).map(|g| g.health.state),
        health_marks: Vec::new(),
        processes: Vec::new(),
        unallocated: 0,
        node: node.map_or_else(|| k.node_id.clone(), |n| n.name.clone()),
        node_id: k.node_id,
        gpu_uuid: k.gpu,
        gpu_index: gpu.map(|g| g.index),
        model: gpu.map(|g| g.model.clone()),
        kind: if k.profile.is_some() { "mig" } else { "gpu" }.to_string(),
        allocations: holders
            .get(&k.device)
            .map(|v| {
                v.iter().map(|a| RowAllocation { allocation: a.id.clone(), tenant: a.tenant_name.clone() }).collect()
            })
            .unwrap_or_default(),
        device: k.device,
        profile: k.profile,
        start: k.start,
        values,
    }
}

/// How far back `since` may reach on the live stream, ms.
const LIVE_SINCE_MAX_MS: i64 = 60_000;
/// How long the live stream gathers after a batch arrives before it sends, so that one event carries the batches
/// of many nodes that arrive together.
const LIVE_GATHER: Duration = Duration::from_millis(50);

/// Server-sent events: a `samples` event as soon as agents' batches bring new samples (gathered for 50 ms), with
/// every sample newer than the last one sent for its device, oldest first: a JSON array of
/// `{node_id, device, gpu, profile, start, sample}`, several items per device when it sent several samples. A
/// device seen for the first time starts after `since` (at most 60 s back; default: only its newest sample).
///
/// A stream lasts 5 minutes and asks the client to reconnect after 2 s (`retry`); it ends within 5 s when the
/// caller's credential is revoked, their session ends, or their memberships or roles change. A user holds at most
/// 32 live streams on one replica, a client address at most 64 streams, and streams together at most half the
/// server's connections (`429 too_many_streams` past any of them).
#[utoipa::path(get, path = "/api/v1/telemetry/live", tag = "telemetry",
    security(("token" = ["user"]), ("session" = ["user"])), params(LiveQuery),
    responses((status = 200, description = "`text/event-stream` of `samples` events", content_type = "text/event-stream"),
        (status = 400, body = Problem), (status = 404, body = Problem), (status = 422, body = Problem),
        (status = 429, body = Problem, description = "too_many_streams")))]
pub async fn live(
    State(state): State<AppState>,
    right: Right,
    addr: Option<Extension<ClientAddr>>,
    ApiQuery(q): ApiQuery<LiveQuery>,
) -> Result<Response, ApiError> {
    let p = right.principal.clone();
    let node_id = match &q.node {
        Some(key) => Some(find_node(&state.store.nodes().await?, key)?.id.clone()),
        None => None,
    };
    let now = now_ms();
    // Devices first seen: samples after `since`, clamped to the last minute; without it, only the newest sample.
    let first_after = match super::time_param("since", q.since)? {
        Some(since) => since.clamp(now - LIVE_SINCE_MAX_MS, now),
        None => -1,
    };
    struct Cursor {
        state: AppState,
        p: Principal,
        node_id: Option<String>,
        sent: HashMap<String, i64>,
        first_after: i64,
        visible: Option<HashSet<String>>,
        visible_at: Option<tokio::time::Instant>,
        changes: tokio::sync::watch::Receiver<u64>,
    }
    let held = super::streams::place(&state, StreamKind::Telemetry, &right, addr.as_deref())?;
    let changes = state.telemetry.subscribe();
    let cursor = Cursor {
        state: state.clone(),
        p,
        node_id,
        sent: HashMap::new(),
        first_after,
        visible: None,
        visible_at: None,
        changes,
    };
    let stream = futures_util::stream::unfold(cursor, |mut c| async move {
        let mut first = true;
        loop {
            if !first {
                // New samples, or a second without any (the visible set is kept fresh either way).
                let _ = tokio::time::timeout(Duration::from_secs(1), c.changes.changed()).await;
                tokio::time::sleep(LIVE_GATHER).await;
            }
            first = false;
            c.changes.borrow_and_update();
            if c.visible_at.is_none_or(|at| at.elapsed() > Duration::from_secs(10)) {
                let now = now_ms();
                if let Ok(v) = visible_devices(&c.state, &c.p, now - 1, now + 1).await {
                    c.visible = v;
                    c.visible_at = Some(tokio::time::Instant::now());
                }
            }
            // Without `since`, a device first seen starts at its newest sample.
            let first_after = if c.first_after < 0 { now_ms() - 1500 } else { c.first_after };
            let visible = &c.visible;
            let fresh: Vec<Latest> = c.state.telemetry.newer(
                c.node_id.as_deref(),
                |d| visible.as_ref().is_none_or(|v| v.contains(d)),
                &mut c.sent,
                first_after,
            );
            // After the first event, devices new to this stream (a new MIG instance) start at their first sample.
            c.first_after = 0;
            if fresh.is_empty() {
                continue;
            }
            let event = Event::default().event("samples").json_data(&fresh).unwrap_or_default();
            return Some((event, c));
        }
    });
    let stream = super::streams::guarded(state, right, held, stream);
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response())
}

/// Prometheus exposition (platform admins): per GPU and MIG instance the newest sample under DCGM exporter names
/// (`DCGM_FI_DEV_GPU_UTIL`, `DCGM_FI_PROF_GR_ENGINE_ACTIVE`, `DCGM_FI_DEV_FB_USED`, `DCGM_FI_DEV_FB_FREE`,
/// `DCGM_FI_DEV_POWER_USAGE`, `DCGM_FI_DEV_GPU_TEMP`) with `tenant` and `allocation` labels, and the server's own
/// `tessera_*` metrics.
#[utoipa::path(get, path = "/metrics", tag = "telemetry", security(("token" = ["platform-admin"])),
    responses((status = 200, description = "Prometheus text format 0.0.4", content_type = "text/plain"),
        (status = 401, body = Problem), (status = 403, body = Problem)))]
pub async fn metrics(State(state): State<AppState>, Caller(p): Caller) -> Result<Response, ApiError> {
    p.require_platform_admin()?;
    let nodes = state.store.nodes().await?;
    let holders = current_holders(&state, &p).await?;
    let now = now_ms();
    let mut text = exposition(&state, &nodes, &holders, now);
    // Why requests wait, counted by reason (every reason, 0 included, so a series never vanishes).
    {
        use std::fmt::Write;
        let counts = tessera_services::waits::counts(&state).await?;
        let _ = writeln!(
            text,
            "# HELP tessera_pending_requests Requests waiting (pending, approved or provisioning), by why they wait.\n\
             # TYPE tessera_pending_requests gauge"
        );
        for (reason, n) in counts {
            let _ = writeln!(text, "tessera_pending_requests{{reason=\"{reason}\"}} {n}");
        }
    }
    fleet_gauges(&mut text, &state, nodes).await?;
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response())
}

/// Node states (every state, 0 included, so that an alert on `ready == 0` sees a node that stops answering), and
/// per GPU its health state and whether it is cordoned; the shipped alert rules (`deploy/prometheus/`) select on
/// them.
async fn fleet_gauges(text: &mut String, state: &AppState, nodes: Vec<Node>) -> Result<(), ApiError> {
    use std::fmt::Write;
    const NODE_STATES: [&str; 5] = ["ready", "applying", "failed", "not-ready", "not-joined"];
    const HEALTH: [&str; 3] = ["healthy", "degraded", "unhealthy"];
    let records = state.store.agent_records().await?;
    let records: HashMap<&str, &tessera_store::agents::AgentRecord> =
        records.iter().map(|r| (r.node_id.as_str(), r)).collect();
    let now = now_ms();
    let _ = writeln!(
        text,
        "# HELP tessera_node_state A node's state (1 for the state it is in): ready, applying (a newer layout than \
         the applied one), failed (applied with errors), not-ready (no heartbeat for 20 s), not-joined.\n\
         # TYPE tessera_node_state gauge"
    );
    let mut gpus = Vec::new();
    let all_nodes = nodes.clone();
    for n in nodes {
        let record = records.get(n.id.as_str()).copied();
        let view = super::nodes::node_view(n.clone(), record, state, now);
        for s in NODE_STATES {
            let _ = writeln!(
                text,
                "tessera_node_state{{Hostname=\"{}\",state=\"{s}\"}} {}",
                esc(&view.name),
                u8::from(view.state == s)
            );
        }
        gpus.extend(n.gpus.into_iter().map(|g| (view.name.clone(), g)));
    }
    let labels = |host: &str, g: &tessera_store::Gpu| {
        format!(
            "gpu=\"{}\",UUID=\"{}\",modelName=\"{}\",Hostname=\"{}\"",
            g.index,
            esc(&g.uuid),
            esc(&g.model),
            esc(host)
        )
    };
    let _ = writeln!(
        text,
        "# HELP tessera_gpu_health A GPU's health as judged from its agent's reports (1 for its state): healthy, \
         degraded, unhealthy.\n# TYPE tessera_gpu_health gauge"
    );
    for (host, g) in &gpus {
        for s in HEALTH {
            let _ = writeln!(
                text,
                "tessera_gpu_health{{{},state=\"{s}\"}} {}",
                labels(host, g),
                u8::from(g.health.state.as_str() == s)
            );
        }
    }
    let _ = writeln!(
        text,
        "# HELP tessera_gpu_cordoned Whether a GPU is cordoned (gets nothing new).\n# TYPE tessera_gpu_cordoned gauge"
    );
    for (host, g) in &gpus {
        let _ = writeln!(text, "tessera_gpu_cordoned{{{}}} {}", labels(host, g), u8::from(g.cordoned));
    }
    // Who runs on each device, named as dcgm-exporter names pods (namespace, pod, container), and which use no
    // allocation covers.
    let processes = state.store.gpu_processes().await?;
    let mut who: std::collections::BTreeMap<String, u32> = std::collections::BTreeMap::new();
    let mut strays: std::collections::BTreeMap<String, u32> = std::collections::BTreeMap::new();
    let by_id: HashMap<&str, &(String, tessera_store::Gpu)> = gpus.iter().map(|hg| (hg.1.id.as_str(), hg)).collect();
    for p in &processes {
        let Some((host, g)) = by_id.get(p.gpu_id.as_str()).copied() else { continue };
        let pod = p.pod_ref();
        let key = format!(
            "{},device=\"{}\",namespace=\"{}\",pod=\"{}\",container=\"{}\",allocation=\"{}\",unallocated=\"{}\"",
            labels(host, g),
            esc(&p.device),
            esc(pod.as_ref().map_or("", |x| x.namespace.as_str())),
            esc(pod.as_ref().map_or("", |x| x.pod.as_str())),
            esc(pod.as_ref().map_or("", |x| x.container.as_str())),
            esc(p.allocation_id.as_deref().unwrap_or("")),
            esc(p.stray.as_deref().unwrap_or(""))
        );
        *who.entry(key).or_default() += 1;
        if let Some(reason) = &p.stray {
            let key = format!("{},device=\"{}\",reason=\"{}\"", labels(host, g), esc(&p.device), esc(reason));
            *strays.entry(key).or_default() += 1;
        }
    }
    let _ = writeln!(
        text,
        "# HELP tessera_gpu_processes Compute processes on a device as its agent last reported them, by pod (namespace, \
         pod, container; empty off Kubernetes), the allocation they run under, and why they are unallocated use \
         (empty when an allocation covers them).\n# TYPE tessera_gpu_processes gauge"
    );
    for (key, n) in &who {
        let _ = writeln!(text, "tessera_gpu_processes{{{key}}} {n}");
    }
    let _ = writeln!(
        text,
        "# HELP tessera_gpu_unallocated_processes Processes on a device that no allocation covers: no_allocation (the \
         device holds none), other_tenant (another tenant's pod), ungoverned_pod (a pod of a namespace no tenant \
         governs).\n# TYPE tessera_gpu_unallocated_processes gauge"
    );
    for (key, n) in &strays {
        let _ = writeln!(text, "tessera_gpu_unallocated_processes{{{key}}} {n}");
    }
    let (by_model, _) = tessera_services::efficiency::fleet_capacity_of(state, &all_nodes).await?;
    let _ = writeln!(
        text,
        "# HELP tessera_compute_slices MIG compute slices by model: allocated (instances in use), placeable (free and \
         usable by the profiles live requests ask for), stranded (free and usable by none of them), cordoned (free \
         on cordoned GPUs).\n# TYPE tessera_compute_slices gauge"
    );
    for m in &by_model {
        for (state, n) in
            [("allocated", m.allocated), ("placeable", m.placeable), ("stranded", m.stranded), ("cordoned", m.cordoned)]
        {
            let _ = writeln!(text, "tessera_compute_slices{{modelName=\"{}\",state=\"{state}\"}} {n}", esc(&m.model));
        }
    }
    Ok(())
}

/// Escapes a label value (backslash, quote, newline).
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn exposition(state: &AppState, nodes: &[Node], holders: &HashMap<String, Vec<Metered>>, now: i64) -> String {
    use std::fmt::Write;
    let latest: Vec<Latest> = state.telemetry.latest(None).into_iter().filter(|l| now - l.sample.t < 60_000).collect();
    let mut families: Vec<(&str, &str, &str, Vec<String>)> = vec![
        ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", Vec::new()),
        (
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            "gauge",
            "Ratio of time the graphics engine is active (MIG instances).",
            Vec::new(),
        ),
        ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", Vec::new()),
        ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", Vec::new()),
        ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", Vec::new()),
        ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", Vec::new()),
    ];
    let fleet = Fleet::of(nodes);
    for l in &latest {
        let node = fleet.node(&l.node_id);
        let gpu = fleet.gpu(&l.node_id, &l.gpu);
        let held = holders.get(&l.device).map(Vec::as_slice).unwrap_or_default();
        let mut labels = format!(
            "gpu=\"{}\",UUID=\"{}\",device=\"nvidia{}\",modelName=\"{}\",Hostname=\"{}\"",
            gpu.map_or(String::new(), |g| g.index.to_string()),
            esc(&l.gpu),
            gpu.map_or(String::new(), |g| g.index.to_string()),
            esc(&gpu.map_or(String::new(), |g| g.model.clone())),
            esc(&node.map_or(l.node_id.clone(), |n| n.name.clone())),
        );
        if let Some(profile) = &l.profile {
            let _ = write!(
                labels,
                ",GPU_I_PROFILE=\"{}\",GPU_I_START=\"{}\",MIG_UUID=\"{}\"",
                esc(profile),
                l.start.unwrap_or(0),
                esc(&l.device)
            );
        }
        let tenants = held.iter().map(|a| a.tenant_name.as_str()).collect::<Vec<_>>().join(",");
        let allocations = held.iter().map(|a| a.id.as_str()).collect::<Vec<_>>().join(",");
        let _ = write!(labels, ",tenant=\"{}\",allocation=\"{}\"", esc(&tenants), esc(&allocations));
        let s = &l.sample;
        let ts = s.t;
        if l.profile.is_some() {
            families[1].3.push(format!("{{{labels}}} {} {ts}", f64::from(s.util) / 100.0));
        } else {
            families[0].3.push(format!("{{{labels}}} {} {ts}", s.util));
        }
        families[2].3.push(format!("{{{labels}}} {} {ts}", s.mem_used_mib));
        families[3].3.push(format!("{{{labels}}} {} {ts}", (s.mem_total_mib - s.mem_used_mib).max(0.0)));
        if let Some(w) = s.power_w {
            families[4].3.push(format!("{{{labels}}} {w} {ts}"));
        }
        if let Some(c) = s.temp_c {
            families[5].3.push(format!("{{{labels}}} {c} {ts}"));
        }
    }
    let mut out = String::with_capacity(256 + latest.len() * 600);
    for (name, kind, help, lines) in &families {
        if lines.is_empty() {
            continue;
        }
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for line in lines {
            let _ = writeln!(out, "{name}{line}");
        }
    }
    let turns = state.store.turn_counts();
    let _ = writeln!(
        out,
        "# HELP tessera_bulk_write_waits_total The fleet's bulk writes (routine status reports, heartbeats, telemetry \
         flushes) that waited on SQLite for an approval's writes to finish, by outcome: `freed` (it finished) or \
         `limit` (the bulk write went ahead after a second).\n# TYPE tessera_bulk_write_waits_total counter\n\
         tessera_bulk_write_waits_total{{outcome=\"freed\"}} {}\ntessera_bulk_write_waits_total{{outcome=\"limit\"}} {}",
        turns.waited.saturating_sub(turns.gave_up),
        turns.gave_up
    );
    let t = &state.telemetry;
    let _ = writeln!(
        out,
        "# HELP tessera_agents_connected Agents with a push connection to this replica.\n\
         # TYPE tessera_agents_connected gauge\ntessera_agents_connected {}",
        state.hub.connected()
    );
    let _ = writeln!(
        out,
        "# HELP tessera_telemetry_samples_total Samples accepted by this replica.\n\
         # TYPE tessera_telemetry_samples_total counter\ntessera_telemetry_samples_total {}",
        t.accepted.load(std::sync::atomic::Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP tessera_telemetry_rejected_samples_total Samples refused by this replica.\n\
         # TYPE tessera_telemetry_rejected_samples_total counter\ntessera_telemetry_rejected_samples_total {}",
        t.rejected.load(std::sync::atomic::Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP tessera_telemetry_refused_series_total Device series refused by this replica, by reason: \
         `not_owned` (a device the sending node does not own) or `series_limit` (the replica holds its most \
         series).\n# TYPE tessera_telemetry_refused_series_total counter\n\
         tessera_telemetry_refused_series_total{{reason=\"not_owned\"}} {}\n\
         tessera_telemetry_refused_series_total{{reason=\"series_limit\"}} {}",
        t.refused_not_owned.load(std::sync::atomic::Ordering::Relaxed),
        t.refused_series_limit.load(std::sync::atomic::Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP tessera_telemetry_batches_total Batches received by this replica.\n\
         # TYPE tessera_telemetry_batches_total counter\ntessera_telemetry_batches_total {}",
        t.batches.load(std::sync::atomic::Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP tessera_telemetry_batch_interval_seconds The interval this replica asks agents to send their \
         telemetry batches at (its floor while it runs on time).\n\
         # TYPE tessera_telemetry_batch_interval_seconds gauge\ntessera_telemetry_batch_interval_seconds {}\n\
         # HELP tessera_runtime_lateness_seconds How late this replica's runtime ran over the last second (the \
         worst wait of a ready task for a thread).\n# TYPE tessera_runtime_lateness_seconds gauge\n\
         tessera_runtime_lateness_seconds {}",
        state.pace.next_batch_ms() as f64 / 1000.0,
        state.pace.late().as_secs_f64()
    );
    let _ = writeln!(
        out,
        "# HELP tessera_telemetry_series Devices in the live window.\n# TYPE tessera_telemetry_series gauge\n\
         tessera_telemetry_series {}",
        t.series_count()
    );
    let _ = writeln!(
        out,
        "# HELP tessera_telemetry_lost_minute_rows_total Minute aggregates dropped because the store was away too \
         long.\n# TYPE tessera_telemetry_lost_minute_rows_total counter\ntessera_telemetry_lost_minute_rows_total {}",
        t.lost_rows()
    );
    let drops = t.agent_drops();
    if !drops.is_empty() {
        let _ = writeln!(
            out,
            "# HELP tessera_telemetry_agent_dropped_samples Samples an agent dropped from its full buffer since it \
             started.\n# TYPE tessera_telemetry_agent_dropped_samples gauge"
        );
        for (node_id, n) in drops {
            let name = fleet.node(&node_id).map_or(node_id.clone(), |x| x.name.clone());
            let _ = writeln!(out, "tessera_telemetry_agent_dropped_samples{{Hostname=\"{}\"}} {n}", esc(&name));
        }
    }
    out
}
