//! Desired spec against what the GPUs have: destroy the instances the spec dropped (never one with a process in
//! it: that is reported as `instance_busy` and retried later), create the ones it added at their exact placements,
//! put the sharing config in effect, and report what is there now.
//!
//! Every step is decided from what the backend reports at the start, so running it again after a crash at any
//! step picks up where the crash left off: it is idempotent.

use std::collections::BTreeMap;

use tessera_core::api::{GpuStatus, NodeSpec, NodeStatus, StepError};

use crate::backend::{BackendError, GpuBackend};

/// The agent must stop (an injected crash).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("crashed during {step}")]
pub struct Crashed {
    /// The step it crashed at.
    pub step: String,
}

fn step_error(step: String, e: &BackendError) -> StepError {
    let code = match e.code {
        "in_use" => "instance_busy",
        other => other,
    };
    StepError { step, code: code.to_string(), message: e.message.clone() }
}

/// Applies `spec` through `backend` and returns the status after it. `Err` only for a crash.
pub fn reconcile(backend: &mut dyn GpuBackend, spec: &NodeSpec) -> Result<NodeStatus, Crashed> {
    let mut node_errors = Vec::new();
    let mut gpu_errors: BTreeMap<String, Vec<StepError>> = BTreeMap::new();
    match backend.inventory() {
        Err(e) => node_errors.push(step_error("inventory".to_string(), &e)),
        Ok(inventory) => {
            for want in &spec.gpus {
                let errors = gpu_errors.entry(want.uuid.clone()).or_default();
                let Some(have) = inventory.gpus.iter().find(|g| g.uuid == want.uuid) else {
                    errors.push(StepError {
                        step: "find".to_string(),
                        code: "gpu_missing".to_string(),
                        message: format!("GPU {} is not on this node", want.uuid),
                    });
                    continue;
                };
                if have.mig_enabled != want.mig_enabled {
                    errors.push(StepError {
                        step: "mig mode".to_string(),
                        code: "mig_mode_mismatch".to_string(),
                        message: format!(
                            "MIG mode is {} but the spec wants it {}; the agent never changes MIG mode (that may \
                             need a GPU reset): change it on the node, then the agent applies the layout",
                            if have.mig_enabled { "on" } else { "off" },
                            if want.mig_enabled { "on" } else { "off" }
                        ),
                    });
                    continue;
                }
                if !want.mig_enabled {
                    continue;
                }
                let keep =
                    |profile: &str, start: u8| want.layout.iter().any(|i| i.profile == profile && i.start == start);
                for gone in have.instances.iter().filter(|i| !keep(&i.profile, i.start)) {
                    let step = format!("destroy {}@{}", gone.profile, gone.start);
                    if !gone.processes.is_empty() {
                        errors.push(StepError {
                            step,
                            code: "instance_busy".to_string(),
                            message: format!("processes {:?} run in it; it is destroyed once they end", gone.processes),
                        });
                        continue;
                    }
                    match backend.destroy_instance(&want.uuid, &gone.profile, gone.start) {
                        Ok(()) => {}
                        Err(e) if e.crash => return Err(Crashed { step }),
                        Err(e) => errors.push(step_error(step, &e)),
                    }
                }
                let mut missing: Vec<_> = want
                    .layout
                    .iter()
                    .filter(|i| !have.instances.iter().any(|h| h.profile == i.profile && h.start == i.start))
                    .collect();
                missing.sort_by_key(|i| i.start);
                for new in missing {
                    let step = format!("create {}@{}", new.profile, new.start);
                    match backend.create_instance(&want.uuid, &new.profile, new.start) {
                        Ok(_) => {}
                        Err(e) if e.crash => return Err(Crashed { step }),
                        Err(e) => errors.push(step_error(step, &e)),
                    }
                }
            }
            if let Err(e) = backend.apply_sharing(&spec.gpus) {
                if e.crash {
                    return Err(Crashed { step: "sharing".to_string() });
                }
                node_errors.push(step_error("sharing".to_string(), &e));
            }
        }
    }
    Ok(observe(backend, spec.generation, gpu_errors, node_errors))
}

/// What the node has now, as a status for `generation`.
pub fn observe(
    backend: &mut dyn GpuBackend,
    generation: i64,
    mut gpu_errors: BTreeMap<String, Vec<StepError>>,
    mut node_errors: Vec<StepError>,
) -> NodeStatus {
    let sharing = backend.sharing();
    let gpus = match backend.inventory() {
        Ok(inventory) => inventory
            .gpus
            .into_iter()
            .map(|g| GpuStatus {
                sharing: sharing.iter().find(|(u, _)| *u == g.uuid).map(|(_, s)| s.clone()),
                errors: gpu_errors.remove(&g.uuid).unwrap_or_default(),
                uuid: g.uuid,
                mig_enabled: g.mig_enabled,
                instances: g.instances,
            })
            .collect(),
        Err(e) => {
            node_errors.push(step_error("inventory".to_string(), &e));
            Vec::new()
        }
    };
    // Errors of GPUs the node does not have (`gpu_missing`) stay visible at node level.
    for (uuid, errors) in gpu_errors {
        node_errors.extend(errors.into_iter().map(|e| StepError { step: format!("{uuid}: {}", e.step), ..e }));
    }
    NodeStatus { observed_generation: generation, applying: false, gpus, errors: node_errors }
}

/// Whether a status has errors worth retrying the spec for.
pub fn has_errors(status: &NodeStatus) -> bool {
    !status.errors.is_empty() || status.gpus.iter().any(|g| !g.errors.is_empty())
}
