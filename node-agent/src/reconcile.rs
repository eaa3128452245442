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

/// The error of a GPU whose MIG mode is not the spec's: the agent never changes MIG mode (that may need a GPU
/// reset, which is the admin's call), with any backend.
pub(crate) fn mig_mode_mismatch(have: bool, want: bool) -> StepError {
    let mode = |on: bool| if on { "on" } else { "off" };
    StepError {
        step: "mig mode".to_string(),
        code: "mig_mode_mismatch".to_string(),
        message: format!(
            "MIG mode is {} but the spec wants it {}; the agent never changes MIG mode (that may need a GPU reset): \
             change it on the node, then the agent applies the layout",
            mode(have),
            mode(want)
        ),
    }
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
                    errors.push(mig_mode_mismatch(have.mig_enabled, want.mig_enabled));
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
    let mut health = backend.health();
    let mut processes = backend.processes();
    if processes.len() > tessera_core::attribution::MAX_PROCESSES_PER_NODE {
        // The server refuses a status with more (and all of it with them): the first ones are reported.
        tracing::warn!(
            processes = processes.len(),
            reported = tessera_core::attribution::MAX_PROCESSES_PER_NODE,
            "more GPU processes than a status carries"
        );
        processes.truncate(tessera_core::attribution::MAX_PROCESSES_PER_NODE);
    }
    let gpus = match backend.inventory() {
        Ok(inventory) => inventory
            .gpus
            .into_iter()
            .map(|g| GpuStatus {
                sharing: sharing.iter().find(|(u, _)| *u == g.uuid).map(|(_, s)| s.clone()),
                errors: gpu_errors.remove(&g.uuid).unwrap_or_default(),
                health: health.iter().position(|(u, _)| *u == g.uuid).map(|i| health.swap_remove(i).1),
                processes: {
                    let on_gpu = |p: &tessera_core::attribution::GpuProcess| {
                        p.device == g.uuid || g.instances.iter().any(|i| i.uuid == p.device)
                    };
                    let (mine, rest) = std::mem::take(&mut processes).into_iter().partition(on_gpu);
                    processes = rest;
                    mine
                },
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

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tessera_core::api::GpuSpec;
    use tessera_core::layout::PlacedInstance;
    use tessera_core::sharing::{GpuSharing, Sharing};

    use super::*;
    use crate::backend::sim::{SimBackend, SimNode};

    fn spec(sim: &SimNode, generation: i64, layout: &[(&str, u8)]) -> NodeSpec {
        NodeSpec {
            node: "n".into(),
            generation,
            gpus: vec![GpuSpec {
                uuid: sim.gpus[0].uuid.clone(),
                index: 0,
                mig_enabled: true,
                layout: layout.iter().map(|&(p, s)| PlacedInstance { profile: p.into(), start: s }).collect(),
                sharing: GpuSharing { mig_enabled: true, gpu: Sharing::Exclusive, instances: vec![] },
                allocations: vec![],
            }],
        }
    }

    fn placements(b: &SimBackend) -> Vec<(String, u8)> {
        let node = b.handle();
        let node = node.lock().expect("sim");
        node.gpus[0].instances.iter().map(|i| (i.profile.clone(), i.start)).collect()
    }

    #[test]
    fn a_crash_at_any_step_then_a_rerun_converges_to_the_spec() {
        let target = [("3g.40gb", 4), ("1g.10gb", 0), ("1g.10gb", 1), ("2g.20gb", 2)];
        for crash_at in 0..6 {
            let node = SimNode::new("n", &[("H100-80GB".to_string(), 1)]);
            let mut b = SimBackend::new(Arc::new(Mutex::new(node.clone())));
            reconcile(&mut b, &spec(&node, 1, &[("7g.80gb", 0)])).expect("first layout");
            b.handle().lock().expect("sim").faults.crash_after_steps = Some(crash_at);
            let want = spec(&node, 2, &target);
            let first = reconcile(&mut b, &want);
            // Five steps (one destroy, four creates): a crash at step 5 or later never comes.
            assert_eq!(first.is_err(), crash_at < 5, "crash at {crash_at}");
            let status = reconcile(&mut b, &want).expect("rerun");
            assert!(!has_errors(&status), "{status:?}");
            let mut want_sorted: Vec<(String, u8)> = target.iter().map(|&(p, s)| (p.to_string(), s)).collect();
            want_sorted.sort_by_key(|&(_, s)| s);
            assert_eq!(placements(&b), want_sorted, "crash at {crash_at}");
            // Once converged, running again changes nothing.
            let again = reconcile(&mut b, &want).expect("again");
            assert_eq!(again.gpus[0].instances, status.gpus[0].instances);
        }
    }

    #[test]
    fn a_busy_instance_is_kept_and_what_overlaps_it_waits() {
        let node = SimNode::new("n", &[("H100-80GB".to_string(), 1)]);
        let mut b = SimBackend::new(Arc::new(Mutex::new(node.clone())));
        reconcile(&mut b, &spec(&node, 1, &[("4g.40gb", 0)])).expect("layout");
        let uuid = b.handle().lock().expect("sim").gpus[0].instances[0].uuid.clone();
        b.handle().lock().expect("sim").start_process(&uuid).expect("pid");
        let status = reconcile(&mut b, &spec(&node, 2, &[("7g.80gb", 0)])).expect("no crash");
        let codes: Vec<&str> = status.gpus[0].errors.iter().map(|e| e.code.as_str()).collect();
        assert_eq!(codes, ["instance_busy", "placement_occupied"]);
        assert_eq!(placements(&b), [("4g.40gb".to_string(), 0)]);
        assert_eq!(status.observed_generation, 2);
    }

    #[test]
    fn the_simulator_refuses_what_the_driver_refuses() {
        let node = SimNode::new("n", &[("A100-40GB".to_string(), 1)]);
        let mut b = SimBackend::new(Arc::new(Mutex::new(node.clone())));
        let gpu = node.gpus[0].uuid.clone();
        use crate::backend::GpuBackend;
        assert_eq!(b.create_instance(&gpu, "3g.20gb", 1).map_err(|e| e.code), Err("placement_invalid"));
        assert_eq!(b.create_instance(&gpu, "9g.99gb", 0).map_err(|e| e.code), Err("profile_unknown"));
        b.create_instance(&gpu, "4g.20gb", 0).expect("4g at 0");
        assert_eq!(b.create_instance(&gpu, "3g.20gb", 0).map_err(|e| e.code), Err("placement_occupied"));
        b.create_instance(&gpu, "3g.20gb", 4).expect("3g at 4");
        b.handle().lock().expect("sim").faults.fail_create = Some("1g.5gb".into());
        b.destroy_instance(&gpu, "3g.20gb", 4).expect("destroy");
        assert_eq!(b.create_instance(&gpu, "1g.5gb", 4).map_err(|e| e.code), Err("driver_error"));
        assert_eq!(b.destroy_instance(&gpu, "3g.20gb", 4).map_err(|e| e.code), Err("not_found"));
    }

    #[test]
    fn backoff_grows_to_thirty_seconds_with_jitter() {
        for attempt in 0..20 {
            let cap = (500u64 << attempt.min(6)).min(30_000);
            let d = crate::agent::backoff(attempt).as_millis() as u64;
            assert!((cap / 2..=cap).contains(&d), "attempt {attempt}: {d} ms");
        }
    }
}
