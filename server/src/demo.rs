//! `tessera serve --demo`: simulated agents in this process, so a fresh machine shows the whole loop with live
//! data. The registered demo node gets an agent whose simulated GPUs carry the node's GPU UUIDs, a second node
//! joins on its own, and at first start two tenants with auto-approval get a few slices, so the heatmaps show
//! load at once. The agents speak to the server over real HTTP on loopback, as remote ones do.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tessera_agent::agent::{self, Config};
use tessera_agent::backend::sim::{SimBackend, SimGpu, SimHandle, SimNode};
use tessera_core::quota::{ApprovalPolicy, Resource};
use tessera_core::request::SliceSpec;
use tessera_core::sharing::{GpuSharing, Sharing};

use tessera_core::layout::{InstanceSpec, validate};
use tessera_services::app::AppState;
use tessera_services::auth::BOOTSTRAP_ADMIN;
use tessera_services::auth::secrets::token_hash;
use tessera_services::requests::Ask;
use tessera_store::history::PastAllocation;
use tessera_store::telemetry::MinuteRow;
use tessera_store::{NewGpu, Role};

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
            health: tessera_agent::backend::sim::quiet(),
        })
        .collect();
    node
}

/// The demo's tenant member: a user of tenant `vision` with no platform rights, so both sides of the portal can be
/// tried (`tessera serve --demo` prints a sign-in link for it).
pub const DEMO_MEMBER: &str = "dana";

/// The demo member, created if missing, and a member of `vision` once that tenant exists (the seeding adds it
/// when it creates the tenant).
pub(crate) async fn member(state: &AppState) -> Result<tessera_store::User, tessera_store::StoreError> {
    let user = match state.store.user_by_name(DEMO_MEMBER).await {
        Ok(u) => u,
        Err(tessera_store::StoreError::NotFound { .. }) => {
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
    let mut sims = Vec::new();
    for name in [DEMO_NODE, SECOND_NODE] {
        let dir = data_dir.join("demo-agents").join(name);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let secret = format!(
            "{}{}{}",
            tessera_services::auth::secrets::JOIN_TOKEN_PREFIX,
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        let expires = tessera_store::now_ms() + 3_600_000;
        state
            .store
            .create_join_token(&token_hash(&secret), Some(name), expires, "system:demo")
            .await
            .map_err(|e| e.to_string())?;
        let mut fresh = hardware(name);
        fresh.seed = 1;
        // Which allocation sits idle is the demo's choice (see `seed`), not the seed's.
        fresh.idle_percent = 0;
        let sim = SimBackend::with_file(dir.join("sim-gpus.json"), fresh)?;
        sims.push((name.to_string(), sim.handle()));
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
        if let Err(e) = seed(&state, &sims).await {
            tracing::warn!(error = %e, "demo tenants not seeded");
        }
    });
    Ok(())
}

/// How the demo tenants' week looks: when it starts, relative to the first start.
const WEEK_MS: i64 = 7 * 24 * 3_600_000;
/// How long the demo's idle allocation has been held when the demo starts.
const IDLE_FOR_MS: i64 = 3 * 24 * 3_600_000;

/// At first start, a fleet with work waiting on every side:
/// - tenant `vision` (with the demo member `dana`) approves its own requests up to 14 compute slices; tenant
///   `llm-serving` waits for an admin;
/// - auto-layout on every MIG GPU of `demo-node-2` and on GPU 1 of `demo-node-1`; that node's GPU 0 and A100 wait
///   for an admin's approval of their layout changes;
/// - a cohort `ml` of both: vision is guaranteed 7 compute slices and may borrow up to 14, llm-serving lends what it
///   does not use;
/// - vision's slices, placed by the planner as any request is, one of them held for three days and idle, a
///   3g.40gb held for a day at a light load (12 %, 15 % of its memory) that right-sizing finds would fit a 1g.10gb,
///   one borrowed;
///   llm-serving's approved requests, one of them waiting for a layout change on the A100, one pending request,
///   and a quota request for a month of more compute, waiting for an admin;
/// - a week of released allocations for both tenants, with their minute telemetry, so usage, chargeback and the
///   24 h heatmap have data at once.
async fn seed(state: &AppState, sims: &[(String, SimHandle)]) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let tenants = state.store.tenants().await.map_err(|e| err(&e))?;
    if tenants.iter().any(|t| t.name == "vision" || t.name == "llm-serving") {
        return Ok(());
    }
    let started_ms = tessera_store::now_ms();
    // Wait until both nodes have joined and reported their GPUs.
    let mut joined = false;
    for _ in 0..60 {
        let nodes = state.store.nodes().await.map_err(|e| err(&e))?;
        if nodes.iter().any(|n| n.name == SECOND_NODE && !n.gpus.is_empty()) {
            for node in &nodes {
                for gpu in node.gpus.iter().filter(|g| g.mig_enabled) {
                    let auto = node.name == SECOND_NODE || gpu.index == 1;
                    state.store.set_auto_layout(&gpu.id, auto, "system:demo").await.map_err(|e| err(&e))?;
                }
            }
            joined = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if !joined {
        return Err(format!("{SECOND_NODE} did not join"));
    }
    let admin = state.store.user_by_name(BOOTSTRAP_ADMIN).await.map_err(|e| err(&e))?;
    let admin = state.store.principal(&admin.id).await.map_err(|e| err(&e))?;
    let tenant = |name: &'static str, auto_approve: bool| async move {
        let policy =
            ApprovalPolicy { auto_approve, auto_approve_max_compute_slices: if auto_approve { 14 } else { 0 } };
        let t = state.store.create_tenant(name, policy, "system:demo").await?;
        state.store.set_quotas(&t.id, &[(Resource::ComputeSlices, Some(28_000))], "system:demo", "demo").await?;
        Ok::<_, tessera_store::StoreError>(t)
    };
    let vision = tenant("vision", true).await.map_err(|e| err(&e))?;
    if let Ok(member) = state.store.user_by_name(DEMO_MEMBER).await {
        state.store.set_membership(&member.id, &vision.id, Role::Member, "system:demo").await.map_err(|e| err(&e))?;
    }
    let llm = tenant("llm-serving", false).await.map_err(|e| err(&e))?;
    // A cohort: vision is guaranteed 7 compute slices and borrows up to 14 of what llm-serving does not use, so a
    // newcomer sees a borrowed slice and what reclaim would take.
    let ml = state
        .store
        .create_cohort("ml", tessera_core::cohort::DEFAULT_GRACE_S, "system:demo")
        .await
        .map_err(|e| err(&e))?;
    let guarantee = [(Resource::ComputeSlices, Some(7_000))];
    let maximum = [(Resource::ComputeSlices, tessera_store::cohorts::Bound::Maximum, Some(14_000))];
    state
        .store
        .set_quota_lines(&vision.id, &guarantee, &maximum, "system:demo", "demo: vision borrows from llm-serving")
        .await
        .map_err(|e| err(&e))?;
    for t in [&vision, &llm] {
        state.store.set_cohort(&t.id, Some(&ml.id), 1, "system:demo").await.map_err(|e| err(&e))?;
    }
    let ask = |tenant: &str, profile: &str, model: &str, count: u32, reason: &str| {
        let (tenant, reason) = (tenant.to_string(), reason.to_string());
        let spec = SliceSpec::Mig { profile: profile.to_string(), model: Some(model.to_string()) };
        let admin = admin.clone();
        async move {
            let ask = Ask {
                tenant: &tenant,
                spec: &spec,
                count,
                reason: &reason,
                duration_s: None,
                priority: Default::default(),
            };
            match tessera_services::requests::create(state, &admin, ask, None).await {
                Ok((r, _)) => Some(r),
                Err(e) => {
                    tracing::warn!(tenant, profile = ?spec, error = %e, "demo request not created");
                    None
                }
            }
        }
    };
    // The free 1g.10gb on demo-node-1's GPU 1 goes to this one at once: it becomes the idle allocation.
    let idle = ask(&vision.id, "1g.10gb", "H100-80GB", 1, "label QA notebook").await;
    if let Some(r) = &idle {
        set_load(state, sims, &r.id, Held::Idle).await;
    }
    // The free 3g.40gb there goes to this one: a day at a light load makes it the oversized one right-sizing finds.
    let light = ask(&vision.id, "3g.40gb", "H100-80GB", 1, "training: detector v7").await;
    if let Some(r) = &light {
        set_load(state, sims, &r.id, Held::Light).await;
    }
    ask(&vision.id, "2g.20gb", "A100-80GB", 1, "evaluation sweeps").await;
    ask(&vision.id, "1g.10gb", "H100-80GB", 2, "development notebooks").await;
    for (profile, model, count, reason) in
        [("4g.40gb", "H100-80GB", 1, "serving: chat-7b"), ("2g.10gb", "A100-40GB", 2, "embedding batch jobs")]
    {
        if let Some(r) = ask(&llm.id, profile, model, count, reason).await
            && let Err(e) = tessera_services::approvals::approve(state, &admin, &r.id, None).await
        {
            tracing::warn!(profile, error = %e, "demo request not approved");
        }
    }
    ask(&llm.id, "1g.10gb", "H100-80GB", 2, "canary for chat-7b v2").await;
    // A quota request waiting for an admin: llm-serving wants room for a second model for a month.
    let month = 30 * 24 * 3_600_000;
    let more = [(Resource::ComputeSlices, 42_000)];
    let why = "second serving model (chat-13b) for the launch";
    if let Err(e) = state.store.create_quota_request(&llm.id, &more, why, Some(started_ms + month), "system:demo").await
    {
        tracing::warn!(error = %e, "demo quota request not created");
    }

    let quiet = match idle {
        Some(r) => make_held(state, &r.id, started_ms, Held::Idle).await.map_err(|e| err(&e))?,
        None => None,
    };
    // On the same GPU, and held for less time than the idle one: the history already leaves room for it.
    if let Some(r) = light {
        make_held(state, &r.id, started_ms, Held::Light).await.map_err(|e| err(&e))?;
    }
    let nodes = state.store.nodes().await.map_err(|e| err(&e))?;
    let (past, minutes) = history(&nodes, &[&vision.id, &llm.id], started_ms, quiet.as_ref());
    // The minutes first: the history's audit entry says the demo is ready.
    for chunk in minutes.chunks(4_000) {
        state.store.write_minutes(chunk).await.map_err(|e| err(&e))?;
    }
    state.store.record_history(&past, "system:demo").await.map_err(|e| err(&e))?;
    tracing::info!(allocations = past.len(), minutes = minutes.len(), "demo history recorded");
    // Today's efficiency sample again, now that the demo's slices are held.
    tessera_services::efficiency::record(state, tessera_store::now_ms()).await.map_err(|e| err(&e))?;
    Ok(())
}

/// How a demo allocation made to look held for a while was used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// Unused for three days: reclaim and the idle alert find it.
    Idle,
    /// A day at a known light load (12 %, 15 % of its memory): right-sizing finds it oversized.
    Light,
}

/// A light allocation's day.
const LIGHT_FOR_MS: i64 = 24 * 3_600_000;

/// Gives the request's allocations the load `held` says on the simulated nodes, as soon as they exist and before
/// their instances do (the request was placed when it was made), so that no sample at another load is sent for
/// them: one busy minute would be a light allocation's peak. Allocation ids are unique: every node may know them.
async fn set_load(state: &AppState, sims: &[(String, SimHandle)], request_id: &str, held: Held) {
    let live = match state.store.live_allocations().await {
        Ok(live) => live,
        Err(e) => return tracing::warn!(error = %e, "demo load not set"),
    };
    for a in live.iter().filter(|a| a.request_id == request_id) {
        for (_, sim) in sims {
            let mut sim = sim.lock().unwrap_or_else(|e| e.into_inner());
            match held {
                Held::Idle => sim.idle_allocations.push(a.id.clone()),
                Held::Light => sim.light_allocations.push(a.id.clone()),
            }
        }
    }
}

/// Waits for the request's allocation to turn active, then makes it look held as `held` says: the simulated node
/// keeps that load ([`set_load`]), its times move back, and its device's minutes since then are recorded at that load. Returns
/// the GPU and the time from which its history must leave room for it.
async fn make_held(
    state: &AppState,
    request_id: &str,
    started_ms: i64,
    held: Held,
) -> Result<Option<(String, i64)>, tessera_store::StoreError> {
    let mut active = None;
    for _ in 0..120 {
        let metered = state.store.metered(None, started_ms - 60_000, tessera_store::now_ms() + 60_000).await?;
        if let Some(m) = metered.into_iter().find(|m| m.request_id == request_id && m.device_uuid.is_some()) {
            active = Some(m);
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let Some(m) = active else {
        tracing::warn!(?held, "a demo allocation did not turn active within a minute");
        return Ok(None);
    };
    let (since, (util, mem_share)) = match held {
        Held::Idle => (started_ms - IDLE_FOR_MS, tessera_agent::backend::sim::IDLE),
        Held::Light => (started_ms - LIGHT_FOR_MS, tessera_agent::backend::sim::LIGHT),
    };
    state.store.backdate_request(request_id, since).await?;
    let nodes = state.store.nodes().await?;
    let Some((node, gpu)) = nodes.iter().find_map(|n| n.gpus.iter().find(|g| g.uuid == m.gpu_uuid).map(|g| (n, g)))
    else {
        return Ok(None);
    };
    let mem_total = profile_mib(&gpu.model, &m.profile);
    let device = m.device_uuid.clone().unwrap_or_default();
    let rows: Vec<MinuteRow> = minute_times(since, started_ms)
        .map(|(minute_ms, samples)| MinuteRow {
            device: device.clone(),
            minute_ms,
            node_id: node.id.clone(),
            gpu: gpu.uuid.clone(),
            profile: Some(m.profile.clone()),
            start: Some(m.start),
            samples,
            util_avg: util,
            util_max: util,
            mem_used_avg: (mem_total * mem_share).round(),
            mem_used_max: Some((mem_total * mem_share).round()),
            mem_total,
            power_avg: None,
            temp_max: None,
        })
        .collect();
    for chunk in rows.chunks(4_000) {
        state.store.write_minutes(chunk).await?;
    }
    Ok(Some((gpu.id.clone(), since)))
}

/// A profile's memory, MiB (0 when the catalog does not know it).
fn profile_mib(model: &str, profile: &str) -> f64 {
    let catalog = tessera_core::Catalog::builtin();
    catalog.model(model).and_then(|m| m.profile(profile)).and_then(|p| p.memory_mib).map_or(0.0, f64::from)
}

/// The minute rows' times from `from_ms` to the minute before `until_ms`: every minute for the last 24 hours,
/// every ten minutes before (each row then counts ten minutes of samples), as `(minute_ms, samples)`.
fn minute_times(from_ms: i64, until_ms: i64) -> impl Iterator<Item = (i64, i64)> {
    let last = until_ms - until_ms.rem_euclid(60_000) - 60_000;
    let day = last - 24 * 3_600_000;
    let first = from_ms - from_ms.rem_euclid(600_000) + 600_000;
    let coarse = (first..day).step_by(600_000).map(|t| (t, 600));
    let fine = (day.max(first)..=last).step_by(60_000).map(|t| (t, 60));
    coarse.chain(fine)
}

/// A small deterministic generator (splitmix64), so every demo has the same week.
struct Dice(u64);

impl Dice {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[lo, hi)` hours, in ms.
    fn hours(&mut self, lo: f64, hi: f64) -> i64 {
        ((lo + (hi - lo) * self.unit()) * 3_600_000.0) as i64
    }
}

/// The instances past allocations used on a GPU of each model: lanes in which allocations follow one another.
fn lanes(model: &str) -> Vec<tessera_core::layout::PlacedInstance> {
    let layout = match model {
        "A100-40GB" => "3g.20gb@0 2g.10gb@4 1g.5gb@6",
        _ => "3g.40gb@0 2g.20gb@4 1g.10gb@6",
    };
    let specs: Vec<InstanceSpec> = layout.split_whitespace().filter_map(|s| s.parse().ok()).collect();
    let catalog = tessera_core::Catalog::builtin();
    catalog.model(model).and_then(|m| validate(m, &specs).ok()).unwrap_or_default()
}

/// A week of released allocations before `now_ms` on every MIG GPU of `nodes`, alternating between `tenants`, and
/// the minute telemetry of their instances and GPUs: busier in working hours, one allocation in eight barely used.
/// On `quiet`'s GPU the history ends where the allocation held since then begins.
fn history(
    nodes: &[tessera_store::Node],
    tenants: &[&str],
    now_ms: i64,
    quiet: Option<&(String, i64)>,
) -> (Vec<PastAllocation>, Vec<MinuteRow>) {
    let catalog = tessera_core::Catalog::builtin();
    let mut dice = Dice(0x07e5_5e7a);
    let mut past = Vec::new();
    let mut minutes = Vec::new();
    let times: Vec<(i64, i64)> = minute_times(now_ms - WEEK_MS, now_ms).collect();
    let reasons = ["training run", "hyper-parameter sweep", "notebook", "batch inference", "evaluation"];
    for node in nodes {
        for gpu in node.gpus.iter().filter(|g| g.mig_enabled) {
            let Some(model) = catalog.model(&gpu.model) else { continue };
            let end = match quiet {
                Some((id, since)) if *id == gpu.id => *since - 3_600_000,
                _ => now_ms - 600_000,
            };
            // Per minute of this GPU: its utilisation and memory in use, summed over its instances.
            let mut gpu_util = vec![0.0; times.len()];
            let mut gpu_mem = vec![0.0; times.len()];
            for lane in lanes(&gpu.model) {
                let Some(profile) = model.profile(&lane.profile) else { continue };
                let share = f64::from(profile.compute_slices) / f64::from(model.compute_slices_total.max(1));
                let mem_total = profile.memory_mib.map_or(0.0, f64::from);
                let mut t = now_ms - WEEK_MS + dice.hours(0.0, 12.0);
                loop {
                    let (from, to) = (t, t + dice.hours(2.0, 30.0));
                    if to > end {
                        break;
                    }
                    let tenant = tenants[(dice.next() % tenants.len() as u64) as usize];
                    let level = if dice.next().is_multiple_of(8) { 2.0 } else { 35.0 + 55.0 * dice.unit() };
                    let device = format!("MIG-{}", uuid::Uuid::from_u64_pair(dice.next(), dice.next()));
                    past.push(PastAllocation {
                        tenant_id: tenant.to_string(),
                        spec: SliceSpec::Mig { profile: lane.profile.clone(), model: Some(gpu.model.clone()) },
                        reason: reasons[(dice.next() % reasons.len() as u64) as usize].to_string(),
                        gpu_id: gpu.id.clone(),
                        profile: lane.profile.clone(),
                        start: lane.start,
                        device_uuid: device.clone(),
                        activated_at_ms: from,
                        released_at_ms: to,
                    });
                    for (i, &(minute_ms, samples)) in times.iter().enumerate() {
                        if minute_ms < from || minute_ms >= to {
                            continue;
                        }
                        let hour = (minute_ms / 3_600_000).rem_euclid(24) as f64;
                        let daytime = 0.6 + 0.4 * (std::f64::consts::PI * (hour - 8.0) / 12.0).sin().max(0.0);
                        let util = (level * daytime + (dice.unit() - 0.5) * 8.0).clamp(0.0, 100.0);
                        let used = (mem_total * (0.25 + 0.6 * util / 100.0)).round();
                        gpu_util[i] += util * share;
                        gpu_mem[i] += used;
                        minutes.push(MinuteRow {
                            device: device.clone(),
                            minute_ms,
                            node_id: node.id.clone(),
                            gpu: gpu.uuid.clone(),
                            profile: Some(lane.profile.clone()),
                            start: Some(lane.start),
                            samples,
                            util_avg: round1(util),
                            util_max: round1((util * 1.15).min(100.0)),
                            mem_used_avg: used,
                            mem_used_max: Some((used * 1.05).min(mem_total).round()),
                            mem_total,
                            power_avg: None,
                            temp_max: None,
                        });
                    }
                    t = to + dice.hours(1.0, 12.0);
                }
            }
            let total = f64::from(model.total_memory_mib_observed.unwrap_or(model.total_memory_gb_nominal * 1024));
            for (i, &(minute_ms, samples)) in times.iter().enumerate() {
                let util = gpu_util[i].min(100.0);
                minutes.push(MinuteRow {
                    device: gpu.uuid.clone(),
                    minute_ms,
                    node_id: node.id.clone(),
                    gpu: gpu.uuid.clone(),
                    profile: None,
                    start: None,
                    samples,
                    util_avg: round1(util),
                    util_max: round1((util * 1.15).min(100.0)),
                    mem_used_avg: gpu_mem[i],
                    mem_used_max: Some(gpu_mem[i]),
                    mem_total: total,
                    power_avg: Some(round1(70.0 + 3.3 * util)),
                    temp_max: Some(round1(32.0 + 0.4 * util)),
                });
            }
        }
    }
    (past, minutes)
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minute_times_are_fine_for_a_day_and_coarse_before() {
        let now = 1_700_000_000_000 - 1_700_000_000_000 % 60_000 + 30_000;
        let times: Vec<_> = minute_times(now - WEEK_MS, now).collect();
        let last = *times.last().expect("some");
        assert_eq!(last, (now - 30_000 - 60_000, 60), "ends a whole minute before the current one");
        assert!(times.windows(2).all(|w| w[0].0 < w[1].0), "in order, no minute twice");
        let fine = times.iter().filter(|t| t.1 == 60).count();
        assert_eq!(fine, 24 * 60 + 1);
        let covered: i64 = times.iter().map(|t| t.1).sum::<i64>() * 1000;
        assert!((WEEK_MS - covered).abs() <= 20 * 60_000, "{covered} ms of samples in a week");
    }

    #[test]
    fn a_week_of_history_never_overlaps_on_an_instance_and_spares_the_quiet_gpu() {
        let now = 1_700_000_000_000;
        let nodes = vec![tessera_store::Node {
            id: "n1".into(),
            name: DEMO_NODE.into(),
            created_at_ms: 0,
            gpus: demo_gpus()
                .into_iter()
                .map(|g| tessera_store::Gpu {
                    id: format!("g{}", g.index),
                    node_id: "n1".into(),
                    index: g.index,
                    uuid: g.uuid,
                    model: g.model,
                    mig_enabled: g.mig_enabled,
                    cordoned: false,
                    layout: Vec::new(),
                    layout_version: 1,
                    auto_layout: false,
                    health: Default::default(),
                })
                .collect(),
        }];
        let quiet = ("g1".to_string(), now - IDLE_FOR_MS);
        let (past, minutes) = history(&nodes, &["a", "b"], now, Some(&quiet));
        assert!(past.len() >= 20, "{} allocations", past.len());
        assert!(past.iter().all(|a| a.gpu_id != "g3"), "the A30 is not in MIG mode");
        assert!(past.iter().any(|a| a.tenant_id == "a") && past.iter().any(|a| a.tenant_id == "b"));
        for a in &past {
            assert!(a.activated_at_ms < a.released_at_ms && a.released_at_ms <= now, "{a:?}");
            assert!(
                !past.iter().any(|b| !std::ptr::eq(a, b)
                    && b.gpu_id == a.gpu_id
                    && b.start == a.start
                    && b.activated_at_ms < a.released_at_ms
                    && a.activated_at_ms < b.released_at_ms),
                "{a:?} overlaps another allocation of its instance"
            );
            if a.gpu_id == "g1" {
                assert!(a.released_at_ms < quiet.1, "{a:?} runs into the quiet GPU's idle allocation");
            }
        }
        // Every instance's minutes lie within its allocation; GPU rows cover the week up to the last minute.
        for m in minutes.iter().filter(|m| m.profile.is_some()) {
            let a = past.iter().find(|a| a.device_uuid == m.device).expect("its allocation");
            assert!((a.activated_at_ms..a.released_at_ms).contains(&m.minute_ms));
            assert!((0.0..=100.0).contains(&m.util_avg));
        }
        let gpu0: Vec<_> = minutes.iter().filter(|m| m.device == nodes[0].gpus[0].uuid).collect();
        assert_eq!(gpu0.len(), minute_times(now - WEEK_MS, now).count());
        assert!(gpu0.iter().any(|m| m.util_avg > 10.0), "the GPU was used");
    }
}
