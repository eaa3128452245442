//! Simulated GPUs of any catalog model, enforcing the rules the driver enforces: an instance only at an allowed
//! placement of its profile, never overlapping another, within the GPU's compute slices and engines (the core's
//! layout validation), only in MIG mode, and never destroyed while a process runs in it.
//!
//! The simulated hardware is shared (`Arc<Mutex<SimNode>>`) and outlives the agent, as real GPUs outlive an agent
//! process: a restarted agent finds what the previous one left. With a state file it also outlives the process.
//! Faults can be injected: a create that fails, slow steps, a crash after a number of steps, and GPU health signals
//! (XIDs, row remaps, ECC errors, throttling, heat: [`SimGpu::inject`], or `sim-health.json` beside the state file).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tessera_core::Catalog;
use tessera_core::api::{GpuInventory, GpuSpec, Inventory, ObservedInstance, Sample};
use tessera_core::health::{GpuHealthReport, RemappedRows};
use tessera_core::layout::{InstanceSpec, LayoutError, validate};
use tessera_core::sharing::{GpuSharing, Sharing};

use super::{BackendError, GpuBackend, Reading};

/// A simulated node.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SimNode {
    /// Host name.
    pub hostname: String,
    /// GPUs by index.
    pub gpus: Vec<SimGpu>,
    /// Injected faults.
    #[serde(default)]
    pub faults: Faults,
    /// Next process id handed out.
    #[serde(default = "first_pid")]
    pub next_pid: u32,
    /// Seed of the synthetic load: the same seed, allocations and times give the same samples.
    #[serde(default)]
    pub seed: u64,
    /// Percentage of allocations that sit idle (picked by the seed), as unused allocations do.
    #[serde(default = "default_idle_percent")]
    pub idle_percent: u8,
    /// Allocations that sit idle whatever the seed picks (a demo's allocation for reclaim to find).
    #[serde(default)]
    pub idle_allocations: Vec<String>,
    /// Allocations at the steady light load [`LIGHT`] (a demo's oversized allocation for right-sizing to find).
    #[serde(default)]
    pub light_allocations: Vec<String>,
    /// The compute processes running on the node's devices, with who runs them (the simulator's pids are no
    /// host's: it says itself what `/proc` and the kubelet would).
    #[serde(default)]
    pub processes: Vec<tessera_core::attribution::GpuProcess>,
}

fn default_idle_percent() -> u8 {
    20
}

fn first_pid() -> u32 {
    4000
}

/// A simulated GPU.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SimGpu {
    /// Index.
    pub index: u32,
    /// `GPU-...`.
    pub uuid: String,
    /// Catalog model key.
    pub model: String,
    /// MIG mode.
    pub mig_enabled: bool,
    /// MIG instances.
    pub instances: Vec<ObservedInstance>,
    /// Sharing config in effect.
    pub sharing: GpuSharing,
    /// Next GPU instance id.
    pub next_gi: u32,
    /// What the GPU tells of its health (quiet unless a test or `sim-health.json` injects a fault).
    #[serde(default = "quiet")]
    pub health: GpuHealthReport,
}

/// A healthy GPU's report: no XID, no ECC error, no remap, 45 °C of a 90 °C slowdown.
pub fn quiet() -> GpuHealthReport {
    GpuHealthReport {
        ecc_uncorrected_volatile: Some(0),
        ecc_uncorrected_aggregate: Some(0),
        ecc_corrected_volatile: Some(0),
        remapped_rows: Some(RemappedRows::default()),
        temperature_c: Some(45),
        slowdown_temperature_c: Some(90),
        ..Default::default()
    }
}

/// A fault injected through `sim-health.json` (beside the simulated node's file), per GPU UUID or index: XIDs seen
/// now, and signals that replace the GPU's.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Injected {
    /// XIDs, seen when the file is read.
    #[serde(default)]
    pub xids: Vec<u32>,
    /// Row remapping.
    #[serde(default)]
    pub remapped_rows: Option<RemappedRows>,
    /// Uncorrected ECC errors since the last reset.
    #[serde(default)]
    pub ecc_uncorrected_volatile: Option<u64>,
    /// Pages pending retirement.
    #[serde(default)]
    pub retired_pages_pending: Option<bool>,
    /// Retired pages.
    #[serde(default)]
    pub retired_pages: Option<u32>,
    /// Active throttle reasons.
    #[serde(default)]
    pub throttle: Option<Vec<String>>,
    /// Temperature, °C.
    #[serde(default)]
    pub temperature_c: Option<u32>,
}

impl SimGpu {
    /// Applies an injected fault at `now_ms`.
    pub fn inject(&mut self, fault: &Injected, now_ms: i64) {
        let h = &mut self.health;
        for code in &fault.xids {
            h.xids.push(tessera_core::health::Xid { code: *code, at_ms: now_ms });
        }
        let excess = h.xids.len().saturating_sub(tessera_core::health::MAX_XIDS);
        h.xids.drain(..excess);
        if fault.remapped_rows.is_some() {
            h.remapped_rows = fault.remapped_rows;
        }
        if fault.ecc_uncorrected_volatile.is_some() {
            h.ecc_uncorrected_volatile = fault.ecc_uncorrected_volatile;
        }
        if fault.retired_pages_pending.is_some() {
            h.retired_pages_pending = fault.retired_pages_pending;
        }
        if fault.retired_pages.is_some() {
            h.retired_pages = fault.retired_pages;
        }
        if let Some(t) = &fault.throttle {
            h.throttle = t.clone();
        }
        if fault.temperature_c.is_some() {
            h.temperature_c = fault.temperature_c;
        }
    }
}

/// Faults to inject.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Faults {
    /// Creating an instance of this profile fails (`driver_error`).
    #[serde(default)]
    pub fail_create: Option<String>,
    /// Every create and destroy takes this long.
    #[serde(default)]
    pub step_delay_ms: u64,
    /// After this many more successful create/destroy steps, the next one crashes the agent (before acting).
    #[serde(default)]
    pub crash_after_steps: Option<u32>,
}

/// Shared handle on a simulated node.
pub type SimHandle = Arc<Mutex<SimNode>>;

/// Parses `MODEL:COUNT[,MODEL:COUNT...]`, e.g. `H100-80GB:4,A100-40GB:2`, against the catalog.
pub fn parse_gpus(text: &str) -> Result<Vec<(String, u32)>, String> {
    let catalog = Catalog::builtin();
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|part| {
            let (model, count) = part.rsplit_once(':').unwrap_or((part, "1"));
            let (m, _) = catalog
                .resolve(model)
                .ok_or_else(|| format!("`{model}` is not a catalog model; known: {}", catalog.keys().join(", ")))?;
            let count: u32 = count.parse().map_err(|_| format!("`{part}`: the count after `:` must be a number"))?;
            if count == 0 || count > 64 {
                return Err(format!("`{part}`: a node has 1 to 64 GPUs of a model"));
            }
            Ok((m.key.clone(), count))
        })
        .collect()
}

/// A stable pseudo-UUID from a seed text (FNV-1a, twice).
fn uuid_from(prefix: &str, seed: &str) -> String {
    let mut a: u64 = 0xcbf2_9ce4_8422_2325;
    let mut b: u64 = 0x8422_2325_cbf2_9ce4;
    for byte in seed.bytes() {
        a = (a ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        b = (b ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3 ^ 0x55);
    }
    let h = format!("{a:016x}{b:016x}");
    format!("{prefix}-{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

impl SimNode {
    /// A node `hostname` with `gpus` (`(model key, count)`), all in MIG mode with no instances.
    pub fn new(hostname: &str, gpus: &[(String, u32)]) -> SimNode {
        let mut out = Vec::new();
        for (model, count) in gpus {
            for _ in 0..*count {
                let index = out.len() as u32;
                out.push(SimGpu {
                    index,
                    uuid: uuid_from("GPU", &format!("{hostname}/{index}")),
                    model: model.clone(),
                    mig_enabled: true,
                    instances: Vec::new(),
                    sharing: GpuSharing { mig_enabled: true, gpu: Sharing::Exclusive, instances: Vec::new() },
                    next_gi: 1,
                    health: quiet(),
                });
            }
        }
        SimNode {
            hostname: hostname.to_string(),
            gpus: out,
            faults: Faults::default(),
            next_pid: first_pid(),
            seed: 0,
            idle_percent: default_idle_percent(),
            idle_allocations: Vec::new(),
            light_allocations: Vec::new(),
            processes: Vec::new(),
        }
    }

    /// The synthetic load of `allocation` at second `t_s` (see [`load`]); idle for the allocations named idle.
    fn load(&self, allocation: &str, t_s: u64) -> (f64, f64) {
        if self.idle_allocations.iter().any(|a| a == allocation) {
            return IDLE;
        }
        if self.light_allocations.iter().any(|a| a == allocation) {
            return LIGHT;
        }
        load(self.seed, self.idle_percent, allocation, t_s)
    }

    /// Turns MIG mode off on GPU `index` (for whole-GPU sharing); only while it has no instances.
    pub fn set_mig(&mut self, index: u32, enabled: bool) -> Result<(), BackendError> {
        let gpu = self
            .gpus
            .iter_mut()
            .find(|g| g.index == index)
            .ok_or_else(|| BackendError::new("gpu_missing", "no such GPU"))?;
        if !gpu.instances.is_empty() {
            return Err(BackendError::new("in_use", "MIG mode changes only on a GPU without instances"));
        }
        gpu.mig_enabled = enabled;
        gpu.sharing.mig_enabled = enabled;
        Ok(())
    }

    /// Starts a (simulated) process in the MIG instance `instance_uuid`, run by user `sim` outside any pod;
    /// returns its PID.
    pub fn start_process(&mut self, instance_uuid: &str) -> Option<u32> {
        self.start_process_as(instance_uuid, "sim", "sim-load", None)
    }

    /// Starts a (simulated) process on `device` (a MIG instance's UUID, or a GPU's without MIG) as `user`
    /// running `command`, in `pod` where given; returns its PID.
    pub fn start_process_as(
        &mut self,
        device: &str,
        user: &str,
        command: &str,
        pod: Option<tessera_core::attribution::PodRef>,
    ) -> Option<u32> {
        let pid = self.next_pid;
        if let Some(inst) = self.gpus.iter_mut().flat_map(|g| g.instances.iter_mut()).find(|i| i.uuid == device) {
            inst.processes.push(pid);
        } else if !self.gpus.iter().any(|g| g.uuid == device && !g.mig_enabled) {
            return None;
        }
        self.processes.push(tessera_core::attribution::GpuProcess {
            device: device.to_string(),
            pid,
            user: Some(user.to_string()),
            command: Some(command.to_string()),
            pod,
        });
        self.next_pid += 1;
        Some(pid)
    }

    /// Ends every process on `device` (a MIG instance or a GPU).
    pub fn stop_processes(&mut self, device: &str) {
        for inst in self.gpus.iter_mut().flat_map(|g| g.instances.iter_mut()).filter(|i| i.uuid == device) {
            inst.processes.clear();
        }
        self.processes.retain(|p| p.device != device);
    }

    fn gpu_mut(&mut self, uuid: &str) -> Result<&mut SimGpu, BackendError> {
        self.gpus
            .iter_mut()
            .find(|g| g.uuid == uuid)
            .ok_or_else(|| BackendError::new("gpu_missing", format!("no GPU {uuid}")))
    }

    /// Counts a step against the crash fault and waits the step delay.
    fn step(&mut self) -> Result<(), BackendError> {
        if let Some(n) = self.faults.crash_after_steps {
            if n == 0 {
                self.faults.crash_after_steps = None;
                return Err(BackendError { code: "crash", message: "injected crash".to_string(), crash: true });
            }
            self.faults.crash_after_steps = Some(n - 1);
        }
        Ok(())
    }
}

/// The simulated backend over a shared node, optionally saved to a file after every change.
#[derive(Debug, Clone)]
pub struct SimBackend {
    node: SimHandle,
    file: Option<PathBuf>,
}

impl SimBackend {
    /// A backend over `node`.
    pub fn new(node: SimHandle) -> SimBackend {
        SimBackend { node, file: None }
    }

    /// A backend whose node lives in `file`: loaded from it when it exists (else `fresh` is used), saved after
    /// every change.
    pub fn with_file(file: PathBuf, fresh: SimNode) -> Result<SimBackend, String> {
        let node = match std::fs::read_to_string(&file) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => fresh,
            Err(e) => return Err(format!("{}: {e}", file.display())),
        };
        let backend = SimBackend { node: Arc::new(Mutex::new(node)), file: Some(file) };
        backend.save(&backend.lock())?;
        Ok(backend)
    }

    /// The shared node.
    pub fn handle(&self) -> SimHandle {
        self.node.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SimNode> {
        self.node.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn save(&self, node: &SimNode) -> Result<(), String> {
        let Some(file) = &self.file else { return Ok(()) };
        let text = serde_json::to_string_pretty(node).map_err(|e| e.to_string())?;
        let tmp = file.with_extension("tmp");
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, file))
            .map_err(|e| format!("{}: {e}", file.display()))
    }

    fn delay(&self) {
        let ms = self.lock().faults.step_delay_ms;
        if ms > 0 {
            std::thread::sleep(Duration::from_millis(ms));
        }
    }
}

fn product_name(model: &str) -> String {
    Catalog::builtin()
        .model(model)
        .and_then(|m| m.products.first().cloned())
        .unwrap_or_else(|| format!("NVIDIA {model}"))
}

impl GpuBackend for SimBackend {
    fn inventory(&mut self) -> Result<Inventory, BackendError> {
        let node = self.lock();
        let catalog = Catalog::builtin();
        Ok(Inventory {
            hostname: node.hostname.clone(),
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            backend: "sim".to_string(),
            driver_version: Some("580.95.05-sim".to_string()),
            cuda_version: Some("13.0".to_string()),
            gpus: node
                .gpus
                .iter()
                .map(|g| {
                    let model = catalog.model(&g.model);
                    GpuInventory {
                        index: g.index,
                        uuid: g.uuid.clone(),
                        name: product_name(&g.model),
                        pci_device_id: model.and_then(|m| m.pci_device_ids.first().cloned()),
                        memory_mib: model.map_or(0, |m| {
                            m.total_memory_mib_observed.map_or(u64::from(m.total_memory_gb_nominal) * 1024, u64::from)
                        }),
                        mig_capable: true,
                        mig_enabled: g.mig_enabled,
                        mig_pending: None,
                        instances: g.instances.clone(),
                    }
                })
                .collect(),
        })
    }

    fn create_instance(&mut self, gpu_uuid: &str, profile: &str, start: u8) -> Result<ObservedInstance, BackendError> {
        self.delay();
        let mut node = self.lock();
        if node.faults.fail_create.as_deref() == Some(profile) {
            return Err(BackendError::new("driver_error", format!("injected failure creating {profile}@{start}")));
        }
        let hostname = node.hostname.clone();
        let gpu = node.gpu_mut(gpu_uuid)?;
        if !gpu.mig_enabled {
            return Err(BackendError::new("mig_disabled", "MIG mode is off on this GPU"));
        }
        let model = Catalog::builtin()
            .model(&gpu.model)
            .ok_or_else(|| BackendError::new("driver_error", format!("unknown model {}", gpu.model)))?;
        let Some(p) = model.profile(profile) else {
            return Err(BackendError::new("profile_unknown", format!("{} has no profile {profile}", model.key)));
        };
        if p.placement_at(start).is_none() {
            return Err(BackendError::new(
                "placement_invalid",
                format!("{profile} cannot start at {start}; allowed: {:?}", p.allowed_starts()),
            ));
        }
        if gpu.instances.iter().any(|i| i.profile == profile && i.start == start) {
            return Err(BackendError::new("placement_occupied", format!("{profile}@{start} exists already")));
        }
        let mut specs: Vec<InstanceSpec> =
            gpu.instances.iter().map(|i| InstanceSpec { profile: i.profile.clone(), start: Some(i.start) }).collect();
        specs.push(InstanceSpec { profile: profile.to_string(), start: Some(start) });
        if let Err(errors) = validate(model, &specs) {
            let code = if errors.iter().any(|e| matches!(e, LayoutError::Overlap { .. })) {
                "placement_occupied"
            } else {
                "insufficient_resources"
            };
            let list = errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
            return Err(BackendError::new(code, list));
        }
        let gi = gpu.next_gi;
        gpu.next_gi += 1;
        let device = gpu.instances.len();
        let created = ObservedInstance {
            profile: profile.to_string(),
            start,
            uuid: uuid_from("MIG", &format!("{hostname}/{}/{gi}/{profile}@{start}", gpu.uuid)),
            gi_id: gi,
            ci_id: 0,
            device_name: format!("MIG {profile} Device {device}"),
            processes: Vec::new(),
        };
        // The crash fault strikes before the driver acts, so a crash never leaves a half-made instance.
        node.step()?;
        let gpu = node.gpu_mut(gpu_uuid)?;
        gpu.instances.push(created.clone());
        gpu.instances.sort_by_key(|i| i.start);
        let snapshot = node.clone();
        drop(node);
        self.save(&snapshot).map_err(|e| BackendError::new("driver_error", e))?;
        Ok(created)
    }

    fn destroy_instance(&mut self, gpu_uuid: &str, profile: &str, start: u8) -> Result<(), BackendError> {
        self.delay();
        let mut node = self.lock();
        let gpu = node.gpu_mut(gpu_uuid)?;
        let Some(pos) = gpu.instances.iter().position(|i| i.profile == profile && i.start == start) else {
            return Err(BackendError::new("not_found", format!("no instance {profile}@{start}")));
        };
        if !gpu.instances[pos].processes.is_empty() {
            return Err(BackendError::new(
                "in_use",
                format!("{profile}@{start} has running processes {:?}", gpu.instances[pos].processes),
            ));
        }
        node.step()?;
        node.gpu_mut(gpu_uuid)?.instances.remove(pos);
        let snapshot = node.clone();
        drop(node);
        self.save(&snapshot).map_err(|e| BackendError::new("driver_error", e))
    }

    fn apply_sharing(&mut self, gpus: &[GpuSpec]) -> Result<(), BackendError> {
        tessera_core::sharing::validate_node(gpus.iter().map(|g| (g.uuid.as_str(), &g.sharing)))
            .map_err(|e| BackendError::new("sharing_invalid", e.to_string()))?;
        let mut node = self.lock();
        for spec in gpus {
            if let Some(gpu) = node.gpus.iter_mut().find(|g| g.uuid == spec.uuid) {
                gpu.sharing = spec.sharing.clone();
            }
        }
        let snapshot = node.clone();
        drop(node);
        self.save(&snapshot).map_err(|e| BackendError::new("driver_error", e))
    }

    fn sharing(&mut self) -> Vec<(String, GpuSharing)> {
        self.lock().gpus.iter().map(|g| (g.uuid.clone(), g.sharing.clone())).collect()
    }

    fn sample(&mut self, t_ms: i64, spec: &[GpuSpec]) -> Result<Vec<Reading>, BackendError> {
        Ok(synthetic(&self.lock(), t_ms, spec))
    }

    fn processes(&mut self) -> Vec<tessera_core::attribution::GpuProcess> {
        let node = self.lock();
        let live = |p: &tessera_core::attribution::GpuProcess| {
            node.gpus.iter().any(|g| {
                (g.uuid == p.device && !g.mig_enabled)
                    || g.instances.iter().any(|i| i.uuid == p.device && i.processes.contains(&p.pid))
            })
        };
        node.processes.iter().filter(|p| live(p)).cloned().collect()
    }

    fn health(&mut self) -> Vec<(String, GpuHealthReport)> {
        // Faults injected into a running agent: `sim-health.json` beside the node's file, read once and removed.
        if let Some(file) = self.file.as_ref().map(|f| f.with_file_name("sim-health.json"))
            && let Ok(text) = std::fs::read_to_string(&file)
        {
            let _ = std::fs::remove_file(&file);
            match serde_json::from_str::<std::collections::BTreeMap<String, Injected>>(&text) {
                Ok(faults) => {
                    let now = tessera_core::clock::now_ms();
                    let mut node = self.lock();
                    for (key, fault) in &faults {
                        match node.gpus.iter_mut().find(|g| g.uuid == *key || g.index.to_string() == *key) {
                            Some(g) => g.inject(fault, now),
                            None => tracing::warn!(gpu = %key, "sim-health.json: no such GPU"),
                        }
                    }
                    if let Err(e) = self.save(&node) {
                        tracing::warn!(error = %e, "simulated node not saved");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "sim-health.json is not a map of GPU to fault"),
            }
        }
        self.lock().gpus.iter().map(|g| (g.uuid.clone(), g.health.clone())).collect()
    }
}

/// A number in [0, 1) from a seed, a key and a counter (FNV-1a of the key, then SplitMix64).
fn unit(seed: u64, key: &str, n: u64) -> f64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.bytes() {
        h = (h ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    let mut z = h ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ n.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// The load of an allocation nobody uses: no utilisation, its memory barely touched.
/// An idle allocation's load: (utilisation %, share of its memory in use).
pub const IDLE: (f64, f64) = (0.0, 0.02);
/// A light allocation's steady load: 12 % busy, 15 % of its memory in use (a 3g.40gb at that load fits a 1g.10gb
/// with 20 % headroom).
pub const LIGHT: (f64, f64) = (12.0, 0.15);

/// The synthetic load of one allocation at second `t_s`: (utilisation %, share of its memory in use).
/// `idle_percent` of the allocations sit idle (allocations nobody uses, as reclaim should find); the others move
/// between levels of 35-95 % that change each minute, with per-second noise.
fn load(seed: u64, idle_percent: u8, allocation: &str, t_s: u64) -> (f64, f64) {
    if unit(seed, allocation, u64::MAX) * 100.0 < f64::from(idle_percent) {
        return IDLE;
    }
    let minute = t_s / 60;
    let (a, b) = (unit(seed, allocation, minute), unit(seed, allocation, minute + 1));
    let f = (t_s % 60) as f64 / 60.0;
    let level = 35.0 + 60.0 * (a + (b - a) * f);
    let noise = (unit(seed, allocation, t_s ^ 0x5eed_0000_0000_0000) - 0.5) * 10.0;
    ((level + noise).clamp(0.0, 100.0), 0.3 + 0.6 * a)
}

/// Board power limit and idle draw of a model, W (approximate, for the simulation only).
fn power_range(model: &str) -> (f64, f64) {
    let tdp = if model.starts_with("A30") {
        165.0
    } else if model.starts_with("A100") {
        400.0
    } else if model.starts_with("RTX") {
        600.0
    } else if model.starts_with("B200") {
        1000.0
    } else {
        700.0
    };
    (tdp * 0.1, tdp)
}

fn round1(x: f64) -> f32 {
    ((x * 10.0).round() / 10.0) as f32
}

/// Samples of every GPU and instance of `node` at `t_ms`, driven by the allocations of `spec`. A GPU in MIG
/// mode is as busy as its instances weighted by their compute slices; a shared whole GPU adds each consumer's
/// load divided by the replica count.
fn synthetic(node: &SimNode, t_ms: i64, spec: &[GpuSpec]) -> Vec<Reading> {
    let catalog = Catalog::builtin();
    let t_s = (t_ms.max(0) / 1000) as u64;
    let mut out = Vec::new();
    for gpu in &node.gpus {
        let Some(model) = catalog.model(&gpu.model) else { continue };
        let gpu_spec = spec.iter().find(|g| g.uuid == gpu.uuid);
        let total_mib = f64::from(model.total_memory_mib_observed.unwrap_or(model.total_memory_gb_nominal * 1024));
        let (idle_w, tdp) = power_range(&gpu.model);
        let (mut util, mut used) = (0.0, 0.0);
        if gpu.mig_enabled {
            for inst in &gpu.instances {
                let profile = model.profile(&inst.profile);
                let inst_mib = profile.and_then(|p| p.memory_mib).map_or(0.0, f64::from);
                let slices = profile.map_or(1.0, |p| f64::from(p.compute_slices));
                let allocation = gpu_spec
                    .and_then(|g| g.allocations.iter().find(|a| a.start == Some(inst.start)))
                    .map(|a| a.allocation.as_str());
                let (u, m) = match allocation {
                    Some(id) => node.load(id, t_s),
                    None if !inst.processes.is_empty() => load(node.seed, 0, &inst.uuid, t_s),
                    None => (0.0, 0.0),
                };
                let inst_used = (inst_mib * m).round();
                util += u * slices / f64::from(model.compute_slices_total.max(1));
                used += inst_used;
                out.push(Reading {
                    device: inst.uuid.clone(),
                    gpu: gpu.uuid.clone(),
                    profile: Some(inst.profile.clone()),
                    start: Some(inst.start),
                    sample: Sample {
                        t: t_ms,
                        util: round1(u),
                        mem_used_mib: inst_used as f32,
                        mem_total_mib: inst_mib as f32,
                        power_w: None,
                        temp_c: None,
                    },
                });
            }
        } else if let Some(g) = gpu_spec {
            let share = 1.0 / f64::from(g.sharing.gpu.replicas().max(1));
            for a in &g.allocations {
                let (u, m) = node.load(&a.allocation, t_s);
                util += u * share;
                used += total_mib * m * share;
            }
        }
        let util = util.min(100.0);
        let jitter = unit(node.seed, &gpu.uuid, t_s) - 0.5;
        out.push(Reading {
            device: gpu.uuid.clone(),
            gpu: gpu.uuid.clone(),
            profile: None,
            start: None,
            sample: Sample {
                t: t_ms,
                util: round1(util),
                mem_used_mib: used.min(total_mib).round() as f32,
                mem_total_mib: total_mib as f32,
                power_w: Some(round1(idle_w + (tdp - idle_w) * util / 100.0 + jitter * 6.0)),
                temp_c: Some(round1(30.0 + 0.4 * util + jitter * 2.0)),
            },
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_core::api::SpecAllocation;

    fn node_with(layout: &[(&str, u8)]) -> SimBackend {
        let mut node = SimNode::new("n", &[("H100-80GB".to_string(), 1)]);
        node.idle_percent = 0;
        node.seed = 7;
        let mut b = SimBackend::new(Arc::new(Mutex::new(node)));
        let uuid = b.handle().lock().expect("sim").gpus[0].uuid.clone();
        for (profile, start) in layout {
            b.create_instance(&uuid, profile, *start).expect("create");
        }
        b
    }

    fn spec(b: &SimBackend, allocated: &[(&str, u8)]) -> Vec<GpuSpec> {
        let gpu = b.handle().lock().expect("sim").gpus[0].clone();
        vec![GpuSpec {
            uuid: gpu.uuid,
            index: 0,
            mig_enabled: true,
            layout: vec![],
            sharing: gpu.sharing,
            allocations: allocated
                .iter()
                .map(|(id, start)| SpecAllocation { allocation: (*id).to_string(), start: Some(*start) })
                .collect(),
        }]
    }

    #[test]
    fn load_follows_allocations_and_the_gpu_sums_its_instances_by_compute_slices() {
        let mut b = node_with(&[("3g.40gb", 0), ("3g.40gb", 4)]);
        let spec = spec(&b, &[("alloc-1", 4)]);
        let t = 1_700_000_000_000;
        let readings = b.sample(t, &spec).expect("sample");
        assert_eq!(readings.len(), 3, "two instances and the GPU");
        let at = |start: Option<u8>| readings.iter().find(|r| r.start == start).expect("reading").sample;
        let (idle, busy, gpu) = (at(Some(0)), at(Some(4)), at(None));
        assert_eq!(idle.util, 0.0);
        assert!((30.0..=100.0).contains(&busy.util), "{busy:?}");
        assert!(busy.mem_used_mib > 0.0 && busy.mem_used_mib <= busy.mem_total_mib);
        assert!((f64::from(gpu.util) - f64::from(busy.util) * 3.0 / 7.0).abs() < 0.11, "{gpu:?} vs {busy:?}");
        assert!(gpu.power_w.is_some() && gpu.temp_c.is_some() && busy.power_w.is_none());
        // Seeded: the same inputs give the same samples; another second gives other noise.
        assert_eq!(b.sample(t, &spec).expect("again"), readings);
        let later = b.sample(t + 17_000, &spec).expect("later");
        assert_ne!(later.iter().find(|r| r.start == Some(4)).expect("busy").sample.util, busy.util);
    }

    #[test]
    fn a_share_of_idle_allocations_sits_idle() {
        let mut node = SimNode::new("n", &[("H100-80GB".to_string(), 1)]);
        node.idle_percent = 50;
        let idle = (0..400).filter(|i| load(node.seed, node.idle_percent, &format!("a{i}"), 100).0 == 0.0).count();
        assert!((150..=250).contains(&idle), "{idle} of 400 idle at 50 %");
    }

    #[test]
    fn allocations_named_idle_sit_idle_whatever_the_seed() {
        let mut node = SimNode::new("n", &[("H100-80GB".to_string(), 1)]);
        node.idle_percent = 0;
        let busy = (0..50).map(|i| format!("a{i}")).find(|a| node.load(a, 100).0 > 0.0).expect("a busy allocation");
        node.idle_allocations.push(busy.clone());
        assert!((0..600).all(|t| node.load(&busy, t) == IDLE));
        assert!(node.load("another", 100).0 > 0.0);
    }
}
