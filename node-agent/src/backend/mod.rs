//! GPU backends: what the agent can see and do on its node's GPUs.
//!
//! Every backend speaks in placements (profile + start unit), as the spec does: instances are created at their
//! exact placement and found again by it, never by "the first free slot" the driver would pick.

pub mod nvml;
pub mod sim;

use std::sync::{Arc, Mutex};

use tessera_core::api::{GpuSpec, Inventory, ObservedInstance, Sample};

/// What a backend call failed with: a stable code (as reported in status) and a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct BackendError {
    /// Stable code, e.g. `in_use`, `placement_occupied`, `placement_invalid`, `mig_disabled`, `driver_error`.
    pub code: &'static str,
    /// What went wrong.
    pub message: String,
    /// The agent must stop at once, as if it crashed (fault injection).
    pub crash: bool,
}

impl BackendError {
    /// An error with `code`.
    pub fn new(code: &'static str, message: impl Into<String>) -> BackendError {
        BackendError { code, message: message.into(), crash: false }
    }
}

/// A node's GPUs, as the agent drives them.
pub trait GpuBackend: Send {
    /// The node's GPUs, MIG instances (with their processes) and driver.
    fn inventory(&mut self) -> Result<Inventory, BackendError>;

    /// Creates a GPU instance and its compute instance at exactly `start` on the GPU `gpu_uuid`.
    fn create_instance(&mut self, gpu_uuid: &str, profile: &str, start: u8) -> Result<ObservedInstance, BackendError>;

    /// Destroys the MIG instance at `start` (its compute instances first). Fails with `in_use` when processes run
    /// in it.
    fn destroy_instance(&mut self, gpu_uuid: &str, profile: &str, start: u8) -> Result<(), BackendError>;

    /// Puts the sharing config (time-slicing / MPS) of every GPU in effect.
    fn apply_sharing(&mut self, gpus: &[GpuSpec]) -> Result<(), BackendError>;

    /// The sharing config in effect, per GPU UUID.
    fn sharing(&mut self) -> Vec<(String, tessera_core::sharing::GpuSharing)>;

    /// One sample of every GPU and every MIG instance, taken at `t_ms`. `spec` is the spec last applied (the
    /// simulator drives its synthetic load from the allocations in it).
    fn sample(&mut self, t_ms: i64, spec: &[GpuSpec]) -> Result<Vec<Reading>, BackendError>;

    /// Every compute process on the node's GPUs and MIG devices (`device` and `pid`; the simulator also says who
    /// runs it).
    fn processes(&mut self) -> Vec<tessera_core::attribution::GpuProcess> {
        Vec::new()
    }

    /// Whether the pids of [`GpuBackend::processes`] are the host's, so that `/proc` and the kubelet say who runs
    /// them (the agent's attribution module); the simulator's are not.
    fn host_pids(&self) -> bool {
        false
    }

    /// What the driver says of each GPU's health, per GPU UUID (none where the backend cannot tell).
    fn health(&mut self) -> Vec<(String, tessera_core::health::GpuHealthReport)> {
        Vec::new()
    }
}

/// One device's sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    /// `GPU-...` or `MIG-...`.
    pub device: String,
    /// The GPU's UUID.
    pub gpu: String,
    /// MIG profile, for an instance.
    pub profile: Option<String>,
    /// MIG start unit, for an instance.
    pub start: Option<u8>,
    /// The values.
    pub sample: Sample,
}

/// The backend, shared by the agent's tasks.
pub type Backend = Arc<Mutex<Box<dyn GpuBackend>>>;

/// Runs `f` on the backend on a blocking thread.
pub async fn with_backend<T: Send + 'static>(
    backend: &Backend,
    f: impl FnOnce(&mut dyn GpuBackend) -> T + Send + 'static,
) -> T {
    let backend = backend.clone();
    let run = move || {
        let mut guard = backend.lock().unwrap_or_else(|e| e.into_inner());
        f(guard.as_mut())
    };
    match tokio::task::spawn_blocking(run).await {
        Ok(t) => t,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}
