//! Pure planning for `--kube` mode: the mig-parted entry and the device-plugin config a spec asks for, with no
//! API calls, so every rule here is tested without a cluster.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tessera_core::api::{GpuInventory, GpuSpec, Inventory, NodeSpec, StepError};
use tessera_core::sharing::{GpuSharing, InstanceSharing, Sharing};

/// One entry of a mig-parted config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigEntry {
    /// GPU indexes.
    pub devices: Vec<u32>,
    /// MIG mode.
    #[serde(rename = "mig-enabled")]
    pub mig_enabled: bool,
    /// Instances per profile.
    #[serde(rename = "mig-devices", default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mig_devices: BTreeMap<String, u32>,
}

/// What the node's mig-parted entry is, and what cannot be done now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigPlan {
    /// One entry per GPU, by index.
    pub entries: Vec<MigEntry>,
    /// GPUs whose layout the entry changes.
    pub changed: Vec<String>,
    /// Errors per GPU UUID.
    pub errors: BTreeMap<String, Vec<StepError>>,
}

fn counts<'a>(profiles: impl Iterator<Item = &'a str>) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for p in profiles {
        *out.entry(p.to_string()).or_insert(0) += 1;
    }
    out
}

pub(super) fn placements<'a>(instances: impl Iterator<Item = (&'a str, u8)>) -> BTreeSet<(String, u8)> {
    instances.map(|(p, s)| (p.to_string(), s)).collect()
}

pub(super) fn error(step: &str, code: &str, message: String) -> StepError {
    StepError { step: step.to_string(), code: code.to_string(), message }
}

/// The node's mig-parted entry for `spec`, given what the GPUs have now.
pub fn plan_mig(spec: &NodeSpec, inventory: &Inventory) -> MigPlan {
    let mut plan = MigPlan { entries: Vec::new(), changed: Vec::new(), errors: BTreeMap::new() };
    let mut gpus: Vec<&GpuInventory> = inventory.gpus.iter().collect();
    gpus.sort_by_key(|g| g.index);
    for have in gpus {
        let current = counts(have.instances.iter().map(|i| i.profile.as_str()));
        let keep = MigEntry { devices: vec![have.index], mig_enabled: have.mig_enabled, mig_devices: current };
        let Some(want) = spec.gpus.iter().find(|g| g.uuid == have.uuid) else {
            plan.entries.push(keep);
            continue;
        };
        let errors = plan.errors.entry(have.uuid.clone()).or_default();
        if have.mig_enabled != want.mig_enabled {
            errors.push(crate::reconcile::mig_mode_mismatch(have.mig_enabled, want.mig_enabled));
            plan.entries.push(keep);
            continue;
        }
        if !want.mig_enabled {
            plan.entries.push(keep);
            continue;
        }
        let observed = placements(have.instances.iter().map(|i| (i.profile.as_str(), i.start)));
        let desired = placements(want.layout.iter().map(|i| (i.profile.as_str(), i.start)));
        if observed == desired {
            plan.entries.push(keep);
            continue;
        }
        let wanted = counts(want.layout.iter().map(|i| i.profile.as_str()));
        if wanted == keep.mig_devices {
            // Same profiles, other placements: mig-parted sees nothing to do, and would not place them anyway.
            errors.push(error(
                "placement",
                "placement_mismatch",
                format!(
                    "the GPU has {} but the layout places them at {}; mig-manager only counts profiles, so it \
                     cannot move an instance: re-plan the layout around the current placements",
                    describe(&observed),
                    describe(&desired)
                ),
            ));
            plan.entries.push(keep);
            continue;
        }
        let busy: Vec<_> = have.instances.iter().filter(|i| !i.processes.is_empty()).collect();
        if !busy.is_empty() {
            for i in busy {
                errors.push(error(
                    &format!("reconfigure {}@{}", i.profile, i.start),
                    "instance_busy",
                    format!(
                        "processes {:?} run in it; mig-manager re-creates every instance of a GPU whose layout \
                         changes, so the GPU keeps its layout until they end",
                        i.processes
                    ),
                ));
            }
            plan.entries.push(keep);
            continue;
        }
        plan.changed.push(have.uuid.clone());
        plan.entries.push(MigEntry { devices: vec![have.index], mig_enabled: true, mig_devices: wanted });
    }
    for want in &spec.gpus {
        if !inventory.gpus.iter().any(|g| g.uuid == want.uuid) {
            plan.errors.entry(want.uuid.clone()).or_default().push(error(
                "find",
                "gpu_missing",
                format!("GPU {} is not on this node", want.uuid),
            ));
        }
    }
    plan.errors.retain(|_, e| !e.is_empty());
    plan
}

pub(super) fn describe(placements: &BTreeSet<(String, u8)>) -> String {
    if placements.is_empty() {
        return "no instances".to_string();
    }
    placements.iter().map(|(p, s)| format!("{p}@{s}")).collect::<Vec<_>>().join(", ")
}

/// The device plugin's resource name of a MIG profile (mixed strategy): `nvidia.com/mig-1g.10gb`; a `+` (media
/// extensions) becomes `.`, as resource names allow no `+`.
pub fn mig_resource(profile: &str) -> String {
    format!("nvidia.com/mig-{}", profile.replace('+', "."))
}

/// Whole GPUs' resource name.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// The node's device-plugin config, what it puts in effect per GPU, and what it cannot express.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginPlan {
    /// The config (serialised as YAML into the ConfigMap).
    pub config: Value,
    /// The sharing in effect on each GPU of the spec under this config.
    pub effective: Vec<GpuSpec>,
    /// Errors per GPU UUID.
    pub errors: BTreeMap<String, Vec<StepError>>,
}

/// The node's device-plugin config for `spec`: one sharing per resource name (the most common one among its
/// devices; ties go to the device on the lowest GPU index), and one mode for the node (the mode with more shared
/// devices; ties go to time-slicing).
pub fn plan_plugin(spec: &NodeSpec) -> PluginPlan {
    let mut gpus: Vec<&GpuSpec> = spec.gpus.iter().collect();
    gpus.sort_by_key(|g| g.index);
    // (resource, GPU UUID, placement, sharing), in GPU index order.
    type Device<'a> = (String, &'a str, Option<(String, u8)>, Sharing);
    let mut devices: Vec<Device<'_>> = Vec::new();
    for g in &gpus {
        if g.mig_enabled {
            for i in &g.layout {
                let sharing = g
                    .sharing
                    .instances
                    .iter()
                    .find(|s| s.profile == i.profile && s.start == i.start)
                    .map_or(Sharing::Exclusive, |s| s.sharing);
                devices.push((mig_resource(&i.profile), &g.uuid, Some((i.profile.clone(), i.start)), sharing));
            }
        } else {
            devices.push((GPU_RESOURCE.to_string(), &g.uuid, None, g.sharing.gpu));
        }
    }
    let mut errors: BTreeMap<String, Vec<StepError>> = BTreeMap::new();
    // One sharing per resource name.
    let mut chosen: BTreeMap<String, Sharing> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    for (resource, _, _, _) in &devices {
        if !order.contains(resource) {
            order.push(resource.clone());
        }
    }
    for resource in &order {
        let mut tally: Vec<(Sharing, usize)> = Vec::new();
        for (_, _, _, s) in devices.iter().filter(|d| &d.0 == resource) {
            match tally.iter_mut().find(|(t, _)| t == s) {
                Some((_, n)) => *n += 1,
                None => tally.push((*s, 1)),
            }
        }
        let best = tally.iter().fold(None::<(Sharing, usize)>, |best, &(s, n)| match best {
            Some((_, m)) if m >= n => best,
            _ => Some((s, n)),
        });
        if let Some((s, _)) = best {
            chosen.insert(resource.clone(), s);
        }
    }
    // MPS only for whole GPUs.
    for (resource, s) in chosen.iter_mut() {
        if resource != GPU_RESOURCE && matches!(s, Sharing::Mps { .. }) {
            *s = Sharing::Exclusive;
        }
    }
    // One mode per node.
    let count = |mps: bool| {
        devices
            .iter()
            .filter(|d| matches!(chosen.get(&d.0), Some(Sharing::Mps { .. })) == mps)
            .filter(|d| chosen.get(&d.0).is_some_and(|s| *s != Sharing::Exclusive))
            .count()
    };
    let mps_node = count(true) > count(false);
    for s in chosen.values_mut() {
        let conflicts = match s {
            Sharing::Mps { .. } => !mps_node,
            Sharing::Timeslice { .. } => mps_node,
            Sharing::Exclusive => false,
        };
        if conflicts {
            *s = Sharing::Exclusive;
        }
    }
    for (resource, uuid, placement, want) in &devices {
        let got = chosen.get(resource).copied().unwrap_or(Sharing::Exclusive);
        if got == *want {
            continue;
        }
        let device = match placement {
            Some((p, s)) => format!("{p}@{s}"),
            None => "the GPU".to_string(),
        };
        let wrong_mode = match want {
            Sharing::Mps { .. } => !mps_node,
            Sharing::Timeslice { .. } => mps_node,
            Sharing::Exclusive => false,
        };
        let (code, why) = if matches!(want, Sharing::Mps { .. }) && resource != GPU_RESOURCE {
            ("sharing_unsupported", "the device plugin offers MPS for whole GPUs only".to_string())
        } else if wrong_mode {
            let mode = if mps_node { "MPS" } else { "time-slicing" };
            ("sharing_mode_conflict", format!("the node's device plugin runs {mode} (one mode per node)"))
        } else {
            (
                "sharing_not_uniform",
                format!("every {resource} device on the node is shared alike; the node's config gives {}", got.key()),
            )
        };
        errors.entry(uuid.to_string()).or_default().push(error(
            &format!("sharing {device}"),
            code,
            format!("{device} should be {} but is {}: {why}", want.key(), got.key()),
        ));
    }
    // The config.
    let mig = gpus.iter().any(|g| g.mig_enabled);
    let mut config = json!({ "version": "v1", "flags": { "migStrategy": if mig { "mixed" } else { "none" } } });
    let shared: Vec<Value> = order
        .iter()
        .filter_map(|r| match chosen.get(r) {
            Some(Sharing::Timeslice { replicas } | Sharing::Mps { replicas }) => {
                Some(json!({ "name": r, "replicas": replicas }))
            }
            _ => None,
        })
        .collect();
    if !shared.is_empty() {
        let block = if mps_node { "mps" } else { "timeSlicing" };
        let mut body = json!({ "renameByDefault": false, "resources": shared });
        if !mps_node {
            body["failRequestsGreaterThanOne"] = json!(true);
        }
        config["sharing"] = json!({ block: body });
    }
    let effective = gpus
        .iter()
        .map(|g| {
            let mut g = (*g).clone();
            if g.mig_enabled {
                g.sharing = GpuSharing {
                    mig_enabled: true,
                    gpu: Sharing::Exclusive,
                    instances: g
                        .layout
                        .iter()
                        .filter_map(|i| {
                            let s = chosen.get(&mig_resource(&i.profile)).copied()?;
                            (s != Sharing::Exclusive).then(|| InstanceSharing {
                                profile: i.profile.clone(),
                                start: i.start,
                                sharing: s,
                            })
                        })
                        .collect(),
                };
            } else {
                g.sharing = GpuSharing {
                    mig_enabled: false,
                    gpu: chosen.get(GPU_RESOURCE).copied().unwrap_or(Sharing::Exclusive),
                    instances: Vec::new(),
                };
            }
            g
        })
        .collect();
    PluginPlan { config, effective, errors }
}

/// `tessera-<node hash>-<content hash>`: a label value (at most 63 characters), the same for the same content, and
/// recognisable as this node's so that its stale entries can be removed.
pub fn config_name(node: &str, content: &str) -> String {
    format!("{}-{}", node_prefix(node), &hex(&Sha256::digest(content.as_bytes()))[..10])
}

pub(super) fn node_prefix(node: &str) -> String {
    format!("tessera-{}", &hex(&Sha256::digest(node.as_bytes()))[..8])
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
