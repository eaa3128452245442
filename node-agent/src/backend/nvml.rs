//! The real backend: NVIDIA's management library, loaded at run time (`libnvidia-ml.so.1`) through nvml-wrapper.
//!
//! Reads go through nvml-wrapper's safe API. MIG instances are created and destroyed through the raw NVML calls
//! (nvml-wrapper-sys), because the wrapper has no way to create a GPU instance at a chosen placement (and its
//! `possible_placements` answers an empty list): `nvmlDeviceCreateGpuInstanceWithPlacement` with the catalog's
//! start and size, then one compute instance spanning the GPU instance. Instances are found again by placement
//! (`nvmlGpuInstanceGetInfo`), never by creation order. Utilisation: device rates on GPUs without MIG, GPM graphics
//! activity per GPU instance on Hopper and later (two samples a period apart), memory per MIG device handle.
//!
//! The agent never changes MIG mode and never resets a GPU: both are the admin's call.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::path::PathBuf;

use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{
    EccCounter, MemoryError, RetirementCause, TemperatureSensor, TemperatureThreshold,
};
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::gpm::{GpmSample, gpm_metrics_get};
use nvml_wrapper_sys::bindings as sys;
use tessera_core::Catalog;
use tessera_core::api::{GpuInventory, GpuSpec, Inventory, ObservedInstance, Sample};
use tessera_core::attribution::GpuProcess;
use tessera_core::catalog::GpuModel;
use tessera_core::health::{self, GpuHealthReport, RemappedRows, Xid};
use tessera_core::sharing::GpuSharing;

use super::{BackendError, GpuBackend, Reading};

/// NVML return codes the agent tells apart.
const NVML_ERROR_INVALID_ARGUMENT: u32 = 2;
const NVML_ERROR_NOT_SUPPORTED: u32 = 3;
const NVML_ERROR_NO_PERMISSION: u32 = 4;
const NVML_ERROR_NOT_FOUND: u32 = 6;
const NVML_ERROR_IN_USE: u32 = 19;
const NVML_ERROR_INSUFFICIENT_RESOURCES: u32 = 23;
/// Compute-instance profile index per GPU-instance slice count (`NVML_COMPUTE_INSTANCE_PROFILE_*_SLICE`).
const CI_PROFILE_BY_SLICES: [(u32, u32); 7] = [(1, 0), (2, 1), (3, 2), (4, 3), (7, 4), (8, 5), (6, 6)];
/// Most GPU instances of one profile on a GPU.
const MAX_GI: usize = 8;

/// The NVML backend.
pub struct NvmlBackend {
    nvml: &'static Nvml,
    hostname: String,
    /// Where the sharing config in effect is kept (time-slicing and MPS are the device plugin's and the MPS
    /// daemon's business; the agent records what the spec asks for and reports it).
    sharing_file: PathBuf,
    /// The last GPM sample per (GPU UUID, GPU instance id), to take activity over the period since.
    gpm: HashMap<(String, u32), GpmSample<'static>>,
    /// The latest XIDs per GPU UUID, oldest first (at most [`health::MAX_XIDS`]), written by one watcher thread per
    /// GPU ([`NvmlBackend::watch_xids`]).
    xids: Xids,
}

impl std::fmt::Debug for NvmlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlBackend").field("hostname", &self.hostname).finish_non_exhaustive()
    }
}

/// The latest XIDs per GPU UUID, shared with the watcher threads.
#[derive(Debug, Clone, Default)]
struct Xids(std::sync::Arc<std::sync::Mutex<HashMap<String, Vec<Xid>>>>);

impl Xids {
    fn push(&self, uuid: &str, code: u32, at_ms: i64) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let list = map.entry(uuid.to_string()).or_default();
        list.push(Xid { code, at_ms });
        let excess = list.len().saturating_sub(health::MAX_XIDS);
        list.drain(..excess);
    }

    fn of(&self, uuid: &str) -> Vec<Xid> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).get(uuid).cloned().unwrap_or_default()
    }
}

/// Active throttle reasons by name (`hw_slowdown`, `sw_power_cap`, ...), as [`GpuHealthReport::throttle`] has them.
fn throttle_names(reasons: ThrottleReasons) -> Vec<String> {
    const NAMES: [(ThrottleReasons, &str); 9] = [
        (ThrottleReasons::GPU_IDLE, "gpu_idle"),
        (ThrottleReasons::APPLICATIONS_CLOCKS_SETTING, "applications_clocks_setting"),
        (ThrottleReasons::SW_POWER_CAP, "sw_power_cap"),
        (ThrottleReasons::HW_SLOWDOWN, "hw_slowdown"),
        (ThrottleReasons::SYNC_BOOST, "sync_boost"),
        (ThrottleReasons::SW_THERMAL_SLOWDOWN, "sw_thermal_slowdown"),
        (ThrottleReasons::HW_THERMAL_SLOWDOWN, "hw_thermal_slowdown"),
        (ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN, "hw_power_brake_slowdown"),
        (ThrottleReasons::DISPLAY_CLOCK_SETTING, "display_clock_setting"),
    ];
    NAMES.iter().filter(|(flag, _)| reasons.contains(*flag)).map(|(_, name)| (*name).to_string()).collect()
}

fn nvml_error(step: &str, e: NvmlError) -> BackendError {
    let code = match &e {
        NvmlError::InUse => "in_use",
        NvmlError::NoPermission => "no_permission",
        NvmlError::NotSupported => "not_supported",
        NvmlError::NotFound => "not_found",
        _ => "driver_error",
    };
    BackendError::new(code, format!("{step}: {e}"))
}

fn raw_error(step: &str, rc: u32) -> BackendError {
    let code = match rc {
        NVML_ERROR_INVALID_ARGUMENT => "placement_invalid",
        NVML_ERROR_NOT_SUPPORTED => "not_supported",
        NVML_ERROR_NO_PERMISSION => "no_permission",
        NVML_ERROR_NOT_FOUND => "not_found",
        NVML_ERROR_IN_USE => "in_use",
        NVML_ERROR_INSUFFICIENT_RESOURCES => "placement_occupied",
        _ => "driver_error",
    };
    BackendError::new(code, format!("{step}: NVML error {rc}"))
}

/// Calls a raw NVML function that may be missing from an old driver; `Err` names it.
macro_rules! raw {
    ($lib:expr, $name:ident ( $($arg:expr),* )) => {{
        match $lib.$name.as_ref() {
            Ok(f) => {
                // SAFETY: the function comes from the loaded NVML library and is called with handles NVML gave
                // out and pointers to live, properly typed locals, as its C signature requires.
                let rc = unsafe { f($($arg),*) };
                if rc == sys::nvmlReturn_enum_NVML_SUCCESS { Ok(()) } else { Err(raw_error(stringify!($name), rc)) }
            }
            Err(_) => Err(BackendError::new(
                "not_supported",
                concat!("the NVIDIA driver has no ", stringify!($name), " (too old for MIG placements)"),
            )),
        }
    }};
}

impl NvmlBackend {
    /// Loads NVML. Fails with a message for people when there is no NVIDIA driver.
    pub fn new(hostname: &str, state_dir: PathBuf) -> Result<NvmlBackend, String> {
        let nvml = Nvml::init().map_err(|e| match e {
            NvmlError::LibloadingError(_) => {
                "cannot load libnvidia-ml.so.1: no NVIDIA driver on this machine (use --backend sim to simulate GPUs)"
                    .to_string()
            }
            NvmlError::DriverNotLoaded => "the NVIDIA driver is installed but not loaded".to_string(),
            other => format!("NVML did not start: {other}"),
        })?;
        let nvml: &'static Nvml = Box::leak(Box::new(nvml));
        Ok(NvmlBackend {
            nvml,
            hostname: hostname.to_string(),
            sharing_file: state_dir.join("sharing.json"),
            gpm: HashMap::new(),
            xids: Self::watch_xids(nvml),
        })
    }

    /// Starts one thread per GPU that supports critical XID events, each with its own event set (a GPU that
    /// refuses leaves the others watched), blocked in `nvmlEventSetWait` so that every event is taken as it comes:
    /// the event carries the device's latest XID, so reading a queue late could name a later, milder error for a
    /// fatal one. The UUID is the one read at registration (a GPU that fell off the bus may not answer for it).
    fn watch_xids(nvml: &'static Nvml) -> Xids {
        let xids = Xids::default();
        for index in 0..nvml.device_count().unwrap_or(0) {
            let Ok(device) = nvml.device_by_index(index) else { continue };
            let Ok(uuid) = device.uuid() else { continue };
            if !device.supported_event_types().is_ok_and(|t| t.contains(EventTypes::CRITICAL_XID_ERROR)) {
                continue;
            }
            let set = match nvml.create_event_set() {
                Ok(set) => set,
                Err(e) => {
                    tracing::warn!(error = %e, gpu = index, "XID events cannot be watched");
                    continue;
                }
            };
            let set = match device.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                Ok(set) => set,
                Err(e) => {
                    tracing::warn!(error = %e.error, gpu = index, "XID events cannot be watched");
                    continue;
                }
            };
            let sink = xids.clone();
            let spawned = std::thread::Builder::new().name(format!("xid-{index}")).spawn(move || {
                loop {
                    match set.wait(5_000) {
                        Ok(event) => {
                            if let Some(XidError::Value(code)) = event.event_data {
                                let code = u32::try_from(code).unwrap_or(u32::MAX);
                                tracing::warn!(gpu = %uuid, xid = code, "XID error");
                                sink.push(&uuid, code, tessera_core::clock::now_ms());
                            }
                        }
                        Err(NvmlError::Timeout) => {}
                        Err(e) => {
                            tracing::debug!(error = %e, gpu = %uuid, "XID wait failed");
                            std::thread::sleep(std::time::Duration::from_secs(5));
                        }
                    }
                }
            });
            if let Err(e) = spawned {
                tracing::warn!(error = %e, gpu = index, "XID watcher not started");
            }
        }
        xids
    }

    /// What the driver says of one GPU's health (each signal it does not support left out).
    fn gpu_health(&self, device: &nvml_wrapper::Device<'static>, uuid: &str) -> GpuHealthReport {
        let remapped_rows = {
            let mut corr = 0;
            let mut unc = 0;
            let mut pending = 0;
            let mut failure = 0;
            // SAFETY: the handle of a device NVML gave out; the library is never unloaded.
            let handle = unsafe { device.handle() };
            raw!(self.lib(), nvmlDeviceGetRemappedRows(handle, &mut corr, &mut unc, &mut pending, &mut failure))
                .ok()
                .map(|()| RemappedRows {
                    correctable: corr,
                    uncorrectable: unc,
                    pending: pending != 0,
                    failure: failure != 0,
                })
        };
        let retired_pages = [RetirementCause::MultipleSingleBitEccErrors, RetirementCause::DoubleBitEccError]
            .into_iter()
            .map(|cause| device.retired_pages(cause).map(|p| p.len()))
            .collect::<Result<Vec<usize>, _>>()
            .ok()
            .map(|n| u32::try_from(n.iter().sum::<usize>()).unwrap_or(u32::MAX));
        let ecc = |error, counter| device.total_ecc_errors(error, counter).ok();
        GpuHealthReport {
            xids: self.xids.of(uuid),
            ecc_uncorrected_volatile: ecc(MemoryError::Uncorrected, EccCounter::Volatile),
            ecc_uncorrected_aggregate: ecc(MemoryError::Uncorrected, EccCounter::Aggregate),
            ecc_corrected_volatile: ecc(MemoryError::Corrected, EccCounter::Volatile),
            retired_pages,
            retired_pages_pending: device.are_pages_pending_retired().ok(),
            remapped_rows,
            throttle: device.current_throttle_reasons().map(throttle_names).unwrap_or_default(),
            temperature_c: device.temperature(TemperatureSensor::Gpu).ok(),
            slowdown_temperature_c: device.temperature_threshold(TemperatureThreshold::Slowdown).ok(),
        }
    }

    fn lib(&self) -> &'static sys::NvmlLib {
        self.nvml.lib()
    }

    fn model(name: &str, pci: Option<&str>) -> Option<&'static GpuModel> {
        let catalog = Catalog::builtin();
        catalog.resolve(name).or_else(|| pci.and_then(|p| catalog.resolve(p))).map(|(m, _)| m)
    }

    /// The GPU-instance profile info of `profile` on `device`.
    fn profile_info(
        &self,
        handle: sys::nvmlDevice_t,
        model: &GpuModel,
        profile: &str,
    ) -> Result<sys::nvmlGpuInstanceProfileInfo_t, BackendError> {
        let p = model
            .profile(profile)
            .ok_or_else(|| BackendError::new("profile_unknown", format!("{} has no profile {profile}", model.key)))?;
        let mut info = empty_profile_info();
        raw!(self.lib(), nvmlDeviceGetGpuInstanceProfileInfo(handle, p.nvml_profile_value, &mut info))?;
        Ok(info)
    }

    /// Profile names by NVML GPU-instance profile id, for `model` on `handle`.
    fn profile_names(&self, handle: sys::nvmlDevice_t, model: &GpuModel) -> HashMap<u32, String> {
        let mut out = HashMap::new();
        for p in &model.profiles {
            let mut info = empty_profile_info();
            if raw!(self.lib(), nvmlDeviceGetGpuInstanceProfileInfo(handle, p.nvml_profile_value, &mut info)).is_ok() {
                out.insert(info.id, p.name.clone());
            }
        }
        out
    }

    /// The MIG instances of one GPU, with their processes.
    fn instances(
        &self,
        device: &nvml_wrapper::Device<'static>,
        model: &GpuModel,
    ) -> Result<Vec<ObservedInstance>, BackendError> {
        // SAFETY: the handle of a device NVML gave out, used while the library stays loaded (it is never unloaded).
        let handle = unsafe { device.handle() };
        let names = self.profile_names(handle, model);
        let processes = device.running_compute_processes().unwrap_or_default();
        let max = device.mig_device_count().map_err(|e| nvml_error("max MIG devices", e))?;
        let mut out = Vec::new();
        for index in 0..max {
            let mig = match device.mig_device_by_index(index) {
                Ok(m) => m,
                Err(NvmlError::NotFound | NvmlError::InvalidArg) => continue,
                Err(e) => return Err(nvml_error("MIG device", e)),
            };
            // SAFETY: as above, for the MIG device's handle.
            let mig_handle = unsafe { mig.handle() };
            let (mut gi_id, mut ci_id) = (0u32, 0u32);
            raw!(self.lib(), nvmlDeviceGetGpuInstanceId(mig_handle, &mut gi_id))?;
            raw!(self.lib(), nvmlDeviceGetComputeInstanceId(mig_handle, &mut ci_id))?;
            let mut gi: sys::nvmlGpuInstance_t = std::ptr::null_mut();
            raw!(self.lib(), nvmlDeviceGetGpuInstanceById(handle, gi_id, &mut gi))?;
            let mut info = empty_gi_info();
            raw!(self.lib(), nvmlGpuInstanceGetInfo(gi, &mut info))?;
            let profile = names.get(&info.profileId).cloned().unwrap_or_else(|| format!("profile-{}", info.profileId));
            out.push(ObservedInstance {
                device_name: format!("MIG {profile} Device {index}"),
                profile,
                start: u8::try_from(info.placement.start).unwrap_or(u8::MAX),
                uuid: mig.uuid().map_err(|e| nvml_error("MIG UUID", e))?,
                gi_id,
                ci_id,
                processes: processes.iter().filter(|p| p.gpu_instance_id == Some(gi_id)).map(|p| p.pid).collect(),
            });
        }
        out.sort_by_key(|i| i.start);
        Ok(out)
    }

    /// The GPU instance at `start` of `profile_id`.
    fn gpu_instance_at(
        &self,
        handle: sys::nvmlDevice_t,
        profile_id: u32,
        start: u8,
    ) -> Result<Option<(sys::nvmlGpuInstance_t, u32)>, BackendError> {
        let mut list: [sys::nvmlGpuInstance_t; MAX_GI] = [std::ptr::null_mut(); MAX_GI];
        let mut count = 0u32;
        raw!(self.lib(), nvmlDeviceGetGpuInstances(handle, profile_id, list.as_mut_ptr(), &mut count))?;
        for gi in list.iter().take(count as usize) {
            let mut info = empty_gi_info();
            raw!(self.lib(), nvmlGpuInstanceGetInfo(*gi, &mut info))?;
            if info.placement.start == u32::from(start) {
                return Ok(Some((*gi, info.id)));
            }
        }
        Ok(None)
    }

    /// The compute-instance profile `ci_profile` (an index) of a GPU instance, with shared engines.
    fn ci_profile_info(
        &self,
        gi: sys::nvmlGpuInstance_t,
        ci_profile: u32,
    ) -> Result<sys::nvmlComputeInstanceProfileInfo_t, BackendError> {
        let mut info = empty_ci_profile_info();
        let shared = sys::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED;
        raw!(self.lib(), nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, ci_profile, shared, &mut info))?;
        Ok(info)
    }

    fn read_sharing(&self) -> HashMap<String, GpuSharing> {
        std::fs::read_to_string(&self.sharing_file).ok().and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default()
    }
}

fn empty_profile_info() -> sys::nvmlGpuInstanceProfileInfo_t {
    sys::nvmlGpuInstanceProfileInfo_t {
        id: 0,
        isP2pSupported: 0,
        sliceCount: 0,
        instanceCount: 0,
        multiprocessorCount: 0,
        copyEngineCount: 0,
        decoderCount: 0,
        encoderCount: 0,
        jpegCount: 0,
        ofaCount: 0,
        memorySizeMB: 0,
    }
}

fn empty_gi_info() -> sys::nvmlGpuInstanceInfo_t {
    sys::nvmlGpuInstanceInfo_t {
        device: std::ptr::null_mut(),
        id: 0,
        profileId: 0,
        placement: sys::nvmlGpuInstancePlacement_t { start: 0, size: 0 },
    }
}

fn empty_ci_profile_info() -> sys::nvmlComputeInstanceProfileInfo_t {
    sys::nvmlComputeInstanceProfileInfo_t {
        id: 0,
        sliceCount: 0,
        instanceCount: 0,
        multiprocessorCount: 0,
        sharedCopyEngineCount: 0,
        sharedDecoderCount: 0,
        sharedEncoderCount: 0,
        sharedJpegCount: 0,
        sharedOfaCount: 0,
    }
}

const MIB: u64 = 1024 * 1024;

impl GpuBackend for NvmlBackend {
    fn inventory(&mut self) -> Result<Inventory, BackendError> {
        let nvml = self.nvml;
        let count = nvml.device_count().map_err(|e| nvml_error("device count", e))?;
        let mut gpus = Vec::new();
        for index in 0..count {
            let device = nvml.device_by_index(index).map_err(|e| nvml_error("device", e))?;
            let name = device.name().map_err(|e| nvml_error("name", e))?;
            let pci = device.pci_info().ok().map(|p| format!("0x{:08X}", p.pci_device_id));
            let mig = device.mig_mode().ok();
            let mig_enabled = mig.as_ref().is_some_and(|m| m.current == sys::NVML_DEVICE_MIG_ENABLE);
            let instances = match (mig_enabled, Self::model(&name, pci.as_deref())) {
                (true, Some(model)) => self.instances(&device, model)?,
                _ => Vec::new(),
            };
            gpus.push(GpuInventory {
                index,
                uuid: device.uuid().map_err(|e| nvml_error("UUID", e))?,
                name,
                pci_device_id: pci,
                memory_mib: device.memory_info().map(|m| m.total / MIB).unwrap_or(0),
                mig_capable: mig.is_some(),
                mig_enabled,
                mig_pending: mig.map(|m| m.pending == sys::NVML_DEVICE_MIG_ENABLE),
                instances,
            });
        }
        Ok(Inventory {
            hostname: self.hostname.clone(),
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            backend: "nvml".to_string(),
            driver_version: nvml.sys_driver_version().ok(),
            cuda_version: nvml.sys_cuda_driver_version().ok().map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10)),
            gpus,
        })
    }

    fn create_instance(&mut self, gpu_uuid: &str, profile: &str, start: u8) -> Result<ObservedInstance, BackendError> {
        let device = self.nvml.device_by_uuid(gpu_uuid).map_err(|e| nvml_error("device", e))?;
        let name = device.name().map_err(|e| nvml_error("name", e))?;
        let pci = device.pci_info().ok().map(|p| format!("0x{:08X}", p.pci_device_id));
        let model = Self::model(&name, pci.as_deref())
            .ok_or_else(|| BackendError::new("model_unknown", format!("{name} is not in the catalog")))?;
        let placement = model
            .profile(profile)
            .and_then(|p| p.placement_at(start))
            .ok_or_else(|| BackendError::new("placement_invalid", format!("{profile} cannot start at {start}")))?;
        // SAFETY: the handle of a device NVML gave out; the library is never unloaded.
        let handle = unsafe { device.handle() };
        let info = self.profile_info(handle, model, profile)?;
        let wanted = sys::nvmlGpuInstancePlacement_t { start: u32::from(start), size: u32::from(placement.size) };
        let mut gi: sys::nvmlGpuInstance_t = std::ptr::null_mut();
        raw!(self.lib(), nvmlDeviceCreateGpuInstanceWithPlacement(handle, info.id, &wanted, &mut gi))?;
        let ci_profile = CI_PROFILE_BY_SLICES.iter().find(|(s, _)| *s == info.sliceCount).map(|(_, p)| *p);
        let made = ci_profile
            .ok_or_else(|| BackendError::new("driver_error", "no compute profile spans the instance"))
            .and_then(|ci_profile| {
                let ci_info = self.ci_profile_info(gi, ci_profile)?;
                let mut ci: sys::nvmlComputeInstance_t = std::ptr::null_mut();
                raw!(self.lib(), nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id, &mut ci))
            });
        if let Err(e) = made {
            // Leave nothing half-made: a GPU instance without its compute instance is useless.
            let _ = raw!(self.lib(), nvmlGpuInstanceDestroy(gi));
            return Err(e);
        }
        self.instances(&device, model)?.into_iter().find(|i| i.start == start && i.profile == profile).ok_or_else(
            || BackendError::new("driver_error", format!("{profile}@{start} was created but is not listed")),
        )
    }

    fn destroy_instance(&mut self, gpu_uuid: &str, profile: &str, start: u8) -> Result<(), BackendError> {
        let device = self.nvml.device_by_uuid(gpu_uuid).map_err(|e| nvml_error("device", e))?;
        let name = device.name().map_err(|e| nvml_error("name", e))?;
        let model = Self::model(&name, None)
            .ok_or_else(|| BackendError::new("model_unknown", format!("{name} is not in the catalog")))?;
        // SAFETY: the handle of a device NVML gave out; the library is never unloaded.
        let handle = unsafe { device.handle() };
        let info = self.profile_info(handle, model, profile)?;
        let Some((gi, gi_id)) = self.gpu_instance_at(handle, info.id, start)? else {
            return Err(BackendError::new("not_found", format!("no instance {profile}@{start}")));
        };
        let busy: Vec<u32> = device
            .running_compute_processes()
            .unwrap_or_default()
            .into_iter()
            .filter(|p| p.gpu_instance_id == Some(gi_id))
            .map(|p| p.pid)
            .collect();
        if !busy.is_empty() {
            return Err(BackendError::new("in_use", format!("{profile}@{start} has running processes {busy:?}")));
        }
        for (_, ci_profile) in CI_PROFILE_BY_SLICES {
            let Ok(ci_info) = self.ci_profile_info(gi, ci_profile) else { continue };
            let mut list: [sys::nvmlComputeInstance_t; MAX_GI] = [std::ptr::null_mut(); MAX_GI];
            let mut count = 0u32;
            raw!(self.lib(), nvmlGpuInstanceGetComputeInstances(gi, ci_info.id, list.as_mut_ptr(), &mut count))?;
            for ci in list.iter().take(count as usize) {
                raw!(self.lib(), nvmlComputeInstanceDestroy(*ci))?;
            }
        }
        raw!(self.lib(), nvmlGpuInstanceDestroy(gi))?;
        self.gpm.remove(&(gpu_uuid.to_string(), gi_id));
        Ok(())
    }

    fn apply_sharing(&mut self, gpus: &[GpuSpec]) -> Result<(), BackendError> {
        tessera_core::sharing::validate_node(gpus.iter().map(|g| (g.uuid.as_str(), &g.sharing)))
            .map_err(|e| BackendError::new("sharing_invalid", e.to_string()))?;
        let map: HashMap<&str, &GpuSharing> = gpus.iter().map(|g| (g.uuid.as_str(), &g.sharing)).collect();
        let text = serde_json::to_string_pretty(&map).map_err(|e| BackendError::new("driver_error", e.to_string()))?;
        let tmp = self.sharing_file.with_extension("tmp");
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, &self.sharing_file))
            .map_err(|e| BackendError::new("driver_error", format!("{}: {e}", self.sharing_file.display())))
    }

    fn sharing(&mut self) -> Vec<(String, GpuSharing)> {
        self.read_sharing().into_iter().collect()
    }

    fn processes(&mut self) -> Vec<GpuProcess> {
        let Ok(inventory) = self.inventory() else { return Vec::new() };
        let mut out = Vec::new();
        let on = |device: &str, pid: u32| GpuProcess {
            device: device.to_string(),
            pid,
            user: None,
            command: None,
            pod: None,
        };
        for g in &inventory.gpus {
            if g.mig_enabled {
                // NVML lists a MIG GPU's processes on the GPU with their GPU instance: `instances` maps them to
                // the MIG device of that instance.
                out.extend(g.instances.iter().flat_map(|i| i.processes.iter().map(|&pid| on(&i.uuid, pid))));
            } else if let Ok(device) = self.nvml.device_by_uuid(g.uuid.as_str()) {
                out.extend(device.running_compute_processes().unwrap_or_default().iter().map(|p| on(&g.uuid, p.pid)));
            }
        }
        out
    }

    fn host_pids(&self) -> bool {
        true
    }

    fn health(&mut self) -> Vec<(String, GpuHealthReport)> {
        let nvml = self.nvml;
        let mut out = Vec::new();
        for index in 0..nvml.device_count().unwrap_or(0) {
            let Ok(device) = nvml.device_by_index(index) else { continue };
            let Ok(uuid) = device.uuid() else { continue };
            let report = self.gpu_health(&device, &uuid);
            out.push((uuid, report));
        }
        out
    }

    fn sample(&mut self, t_ms: i64, _spec: &[GpuSpec]) -> Result<Vec<Reading>, BackendError> {
        let nvml = self.nvml;
        let count = nvml.device_count().map_err(|e| nvml_error("device count", e))?;
        let mut out = Vec::new();
        for index in 0..count {
            let Ok(device) = nvml.device_by_index(index) else { continue };
            let Ok(uuid) = device.uuid() else { continue };
            let memory = device.memory_info().ok();
            let mig_enabled = device.mig_mode().is_ok_and(|m| m.current == sys::NVML_DEVICE_MIG_ENABLE);
            let mut util = if mig_enabled { None } else { device.utilization_rates().ok().map(|u| u.gpu as f32) };
            if mig_enabled {
                let name = device.name().unwrap_or_default();
                let model = Self::model(&name, None);
                let instances = model.map(|m| self.instances(&device, m)).transpose()?.unwrap_or_default();
                let mut weighted = 0.0f32;
                let gpm = device.gpm_support().unwrap_or(false);
                for inst in instances {
                    let Ok(mig) = nvml.device_by_uuid(inst.uuid.as_str()) else { continue };
                    let mem = mig.memory_info().ok();
                    let activity = if gpm { self.gpm_activity(&device, &uuid, inst.gi_id) } else { None };
                    let slices = model
                        .and_then(|m| {
                            m.profile(&inst.profile)
                                .map(|p| f32::from(p.compute_slices) / f32::from(m.compute_slices_total.max(1)))
                        })
                        .unwrap_or(0.0);
                    weighted += activity.unwrap_or(0.0) * slices;
                    out.push(Reading {
                        device: inst.uuid.clone(),
                        gpu: uuid.clone(),
                        profile: Some(inst.profile.clone()),
                        start: Some(inst.start),
                        sample: Sample {
                            t: t_ms,
                            util: activity.unwrap_or(0.0),
                            mem_used_mib: mem.as_ref().map_or(0.0, |m| (m.used / MIB) as f32),
                            mem_total_mib: mem.as_ref().map_or(0.0, |m| (m.total / MIB) as f32),
                            power_w: None,
                            temp_c: None,
                        },
                    });
                }
                if gpm {
                    util = Some(weighted);
                }
            }
            out.push(Reading {
                device: uuid.clone(),
                gpu: uuid,
                profile: None,
                start: None,
                sample: Sample {
                    t: t_ms,
                    util: util.unwrap_or(0.0),
                    mem_used_mib: memory.as_ref().map_or(0.0, |m| (m.used / MIB) as f32),
                    mem_total_mib: memory.as_ref().map_or(0.0, |m| (m.total / MIB) as f32),
                    power_w: device.power_usage().ok().map(|mw| mw as f32 / 1000.0),
                    temp_c: device.temperature(TemperatureSensor::Gpu).ok().map(|c| c as f32),
                },
            });
        }
        Ok(out)
    }
}

impl NvmlBackend {
    /// Graphics-engine activity (%) of GPU instance `gi_id` since the previous call for it (none the first time).
    fn gpm_activity(&mut self, device: &nvml_wrapper::Device<'static>, gpu_uuid: &str, gi_id: u32) -> Option<f32> {
        let now = device.gpm_mig_sample(gi_id).ok()?;
        let key = (gpu_uuid.to_string(), gi_id);
        let before = self.gpm.insert(key.clone(), now)?;
        let latest = self.gpm.get(&key)?;
        let results = gpm_metrics_get(self.nvml, &before, latest, &[GpmMetricId::GraphicsUtil]).ok()?;
        results.into_iter().next()?.ok().map(|r| r.value as f32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a driver the backend says so plainly; with one (a GPU machine), the inventory is read (read-only:
    /// nothing is created, destroyed or switched).
    #[test]
    fn without_a_driver_it_says_so_and_with_one_it_reads_the_inventory() {
        let dir = std::env::temp_dir();
        match NvmlBackend::new("probe", dir) {
            Err(message) => assert!(
                message.contains("no NVIDIA driver") || message.contains("not loaded") || message.contains("NVML"),
                "{message}"
            ),
            Ok(mut backend) => {
                let inventory = backend.inventory().expect("inventory");
                assert_eq!(inventory.backend, "nvml");
                assert!(inventory.gpus.iter().all(|g| g.uuid.starts_with("GPU-")), "{inventory:?}");
                let readings = backend.sample(0, &[]).expect("sample");
                assert!(readings.iter().filter(|r| r.profile.is_none()).count() == inventory.gpus.len());
            }
        }
    }
}
