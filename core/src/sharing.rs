//! Sharing on top of a layout: how one device (a whole GPU, or one MIG instance) is handed out.
//!
//! The rules are those of NVIDIA's stack (k8s-device-plugin sharing config and CUDA MPS):
//! - `exclusive`: one consumer per device.
//! - `timeslice`: `replicas` consumers take turns; allowed on whole GPUs and on MIG instances.
//! - `mps`: `replicas` clients run concurrently under the MPS daemon, each limited to an equal share of memory.
//!   Only on whole GPUs (the device plugin offers MPS for `nvidia.com/gpu` only, not for MIG devices), and at
//!   most 48 clients (the CUDA MPS client limit since Volta).
//! - A node uses either time-slicing or MPS, never both (the plugin's `sharing` block takes one of them).
//! - A GPU in MIG mode has no whole-GPU device to share; its MIG instances are shared one by one.
//! - Replicas below 2 are not sharing: use `exclusive`.

use serde::{Deserialize, Serialize};

use crate::catalog::GpuModel;
use crate::layout::PlacedInstance;

/// Most MPS clients per device (CUDA MPS limit on Volta and newer).
pub const MPS_MAX_CLIENTS: u32 = 48;
/// Most time-slice replicas Tessera accepts per device; the device plugin sets no limit, but beyond this each
/// consumer's turn is too short to be useful and the count is almost certainly a typo.
pub const TIMESLICE_MAX_REPLICAS: u32 = 256;

/// How one device is shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Sharing {
    /// One consumer.
    Exclusive,
    /// Consumers take turns on the device.
    Timeslice {
        /// Consumers per device (2 or more).
        replicas: u32,
    },
    /// Concurrent clients under the MPS daemon.
    Mps {
        /// Clients per device (2 to 48).
        replicas: u32,
    },
}

impl Sharing {
    /// A compact key: `exclusive`, `timeslice:<replicas>` or `mps:<replicas>` (how allocations record it).
    pub fn key(self) -> String {
        match self {
            Sharing::Exclusive => "exclusive".to_string(),
            Sharing::Timeslice { replicas } => format!("timeslice:{replicas}"),
            Sharing::Mps { replicas } => format!("mps:{replicas}"),
        }
    }

    /// Parses [`Sharing::key`]'s form.
    pub fn from_key(key: &str) -> Option<Sharing> {
        match key.split_once(':') {
            None if key == "exclusive" => Some(Sharing::Exclusive),
            Some(("timeslice", n)) => n.parse().ok().map(|replicas| Sharing::Timeslice { replicas }),
            Some(("mps", n)) => n.parse().ok().map(|replicas| Sharing::Mps { replicas }),
            _ => None,
        }
    }

    /// Whether a device shared this way and one shared `other`'s way cannot be on one node: time-slicing beside MPS
    /// (see [`validate_node`]).
    pub fn clashes_with(self, other: Sharing) -> bool {
        matches!(
            (self, other),
            (Sharing::Timeslice { .. }, Sharing::Mps { .. }) | (Sharing::Mps { .. }, Sharing::Timeslice { .. })
        )
    }

    /// How many consumers the device serves.
    pub fn replicas(self) -> u32 {
        match self {
            Sharing::Exclusive => 1,
            Sharing::Timeslice { replicas } | Sharing::Mps { replicas } => replicas,
        }
    }
}

/// The sharing of one GPU: either the whole GPU (MIG off) or each MIG instance (MIG on).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuSharing {
    /// Whether the GPU is in MIG mode.
    pub mig_enabled: bool,
    /// Sharing of the whole GPU; must be `exclusive` when MIG is on.
    pub gpu: Sharing,
    /// Sharing per MIG instance; instances not listed are exclusive.
    #[serde(default)]
    pub instances: Vec<InstanceSharing>,
}

/// Sharing of one MIG instance, named by its placement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceSharing {
    /// Profile name.
    pub profile: String,
    /// Start unit.
    pub start: u8,
    /// How it is shared.
    pub sharing: Sharing,
}

/// A sharing configuration NVIDIA's stack would reject.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SharingError {
    /// Replicas outside what the mode allows.
    #[error("{device}: {mode} needs between {min} and {max} replicas, got {replicas}")]
    ReplicasOutOfRange {
        /// The device, e.g. `GPU` or `3g.40gb@4`.
        device: String,
        /// `timeslice` or `mps`.
        mode: &'static str,
        /// Given.
        replicas: u32,
        /// Smallest allowed.
        min: u32,
        /// Largest allowed.
        max: u32,
    },
    /// MPS asked for on a MIG instance.
    #[error("{device}: MPS is only available on whole GPUs, not on MIG instances; use timeslice")]
    MpsOnMig {
        /// The instance.
        device: String,
    },
    /// Whole-GPU sharing on a GPU in MIG mode.
    #[error("the GPU is in MIG mode, so it has no whole-GPU device to share; share its instances instead")]
    WholeGpuSharingOnMig,
    /// Per-instance sharing on a GPU without MIG.
    #[error("{device}: the GPU is not in MIG mode, so it has no MIG instances to share")]
    MigDisabled {
        /// The instance named.
        device: String,
    },
    /// An instance that is not in the layout.
    #[error("{device}: no such instance in the GPU's layout")]
    UnknownInstance {
        /// The instance named.
        device: String,
    },
    /// The same instance listed twice.
    #[error("{device}: listed more than once")]
    DuplicateInstance {
        /// The instance named.
        device: String,
    },
    /// Time-slicing and MPS on one node.
    #[error("a node uses either time-slicing or MPS, not both (time-slicing on {timeslice}, MPS on {mps})")]
    MixedStrategies {
        /// A device using time-slicing.
        timeslice: String,
        /// A device using MPS.
        mps: String,
    },
}

impl SharingError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            SharingError::ReplicasOutOfRange { .. } => "sharing_replicas_out_of_range",
            SharingError::MpsOnMig { .. } => "sharing_mps_on_mig",
            SharingError::WholeGpuSharingOnMig => "sharing_whole_gpu_on_mig",
            SharingError::MigDisabled { .. } => "sharing_mig_disabled",
            SharingError::UnknownInstance { .. } => "sharing_unknown_instance",
            SharingError::DuplicateInstance { .. } => "sharing_duplicate_instance",
            SharingError::MixedStrategies { .. } => "sharing_mixed_strategies",
        }
    }
}

fn check_replicas(device: &str, sharing: Sharing, errors: &mut Vec<SharingError>) {
    let (mode, min, max) = match sharing {
        Sharing::Exclusive => return,
        Sharing::Timeslice { .. } => ("timeslice", 2, TIMESLICE_MAX_REPLICAS),
        Sharing::Mps { .. } => ("mps", 2, MPS_MAX_CLIENTS),
    };
    let replicas = sharing.replicas();
    if !(min..=max).contains(&replicas) {
        errors.push(SharingError::ReplicasOutOfRange { device: device.to_string(), mode, replicas, min, max });
    }
}

/// Checks one GPU's sharing against its (already validated) layout. Reports every problem.
pub fn validate_gpu(
    model: &GpuModel,
    layout: &[PlacedInstance],
    sharing: &GpuSharing,
) -> Result<(), Vec<SharingError>> {
    let mut errors = Vec::new();
    check_replicas("GPU", sharing.gpu, &mut errors);
    if sharing.mig_enabled && sharing.gpu != Sharing::Exclusive {
        errors.push(SharingError::WholeGpuSharingOnMig);
    }
    let mut seen: Vec<(String, u8)> = Vec::new();
    for inst in &sharing.instances {
        let device = format!("{}@{}", inst.profile, inst.start);
        if !sharing.mig_enabled {
            errors.push(SharingError::MigDisabled { device });
            continue;
        }
        let name = model.profile(&inst.profile).map_or(inst.profile.as_str(), |p| p.name.as_str());
        if !layout.iter().any(|l| l.profile == name && l.start == inst.start) {
            errors.push(SharingError::UnknownInstance { device: device.clone() });
        }
        if seen.iter().any(|(p, s)| p == name && *s == inst.start) {
            errors.push(SharingError::DuplicateInstance { device: device.clone() });
        }
        seen.push((name.to_string(), inst.start));
        if matches!(inst.sharing, Sharing::Mps { .. }) {
            errors.push(SharingError::MpsOnMig { device: device.clone() });
        }
        check_replicas(&device, inst.sharing, &mut errors);
    }
    if errors.is_empty() { Ok(()) } else { Err(errors) }
}

/// Checks the node-wide rule: time-slicing and MPS are not mixed on one node. `gpus` pairs a GPU name with its
/// sharing.
pub fn validate_node<'a>(gpus: impl IntoIterator<Item = (&'a str, &'a GpuSharing)>) -> Result<(), SharingError> {
    let mut timeslice = None;
    let mut mps = None;
    for (name, gpu) in gpus {
        let devices = std::iter::once((name.to_string(), gpu.gpu))
            .chain(gpu.instances.iter().map(|i| (format!("{name}/{}@{}", i.profile, i.start), i.sharing)));
        for (device, sharing) in devices {
            match sharing {
                Sharing::Timeslice { .. } => timeslice = timeslice.or(Some(device)),
                Sharing::Mps { .. } => mps = mps.or(Some(device)),
                Sharing::Exclusive => {}
            }
        }
    }
    match (timeslice, mps) {
        (Some(timeslice), Some(mps)) => Err(SharingError::MixedStrategies { timeslice, mps }),
        _ => Ok(()),
    }
}
