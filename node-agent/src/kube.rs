//! `--kube` mode: the node's layout and sharing are put in effect by NVIDIA's GPU Operator instead of NVML writes.
//!
//! - MIG: the agent writes its node's entry into the mig-parted config (a ConfigMap shared by every node; each
//!   agent touches only its own key, with optimistic concurrency on the ConfigMap's `resourceVersion`), sets the
//!   node label `nvidia.com/mig.config` to that entry, and follows `nvidia.com/mig.config.state` (`pending` ->
//!   `success` | `failed`) that mig-manager reports.
//! - Sharing: the agent writes its node's device-plugin config (time-slicing or MPS) into the plugin's ConfigMap
//!   and sets the node label `nvidia.com/device-plugin.config` to it.
//!
//! What mig-parted cannot do, and what the agent does about it:
//! - mig-parted counts profiles per GPU and lets the driver choose placements. After `success` the agent reads
//!   the placements back (NVML, read-only) and reports every instance that is not where the planner put it as
//!   `placement_mismatch`.
//! - mig-manager re-creates every instance of a GPU whose layout changes, and does not wait for the processes in
//!   them. So the agent leaves a GPU at its current layout while any instance on it runs a process
//!   (`instance_busy`), and changes it once they have ended.
//! - The device plugin's sharing config is per node and per resource name: one replica count for all devices of a
//!   resource, time-slicing or MPS for the whole node. A GPU whose sharing cannot be expressed that way is reported
//!   (`sharing_not_uniform`, `sharing_mode_conflict`) and gets what the node's config gives it.
//! - The agent never changes MIG mode (as with NVML): each GPU's entry keeps its current mode.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tessera_core::api::{GpuInventory, GpuSpec, Inventory, NodeSpec, NodeStatus, StepError};
use tessera_core::sharing::{GpuSharing, InstanceSharing, Sharing};

/// Node label that selects the node's mig-parted config.
pub const MIG_CONFIG_LABEL: &str = "nvidia.com/mig.config";
/// Node label in which mig-manager reports progress.
pub const MIG_STATE_LABEL: &str = "nvidia.com/mig.config.state";
/// Node label that selects the node's device-plugin config.
pub const PLUGIN_CONFIG_LABEL: &str = "nvidia.com/device-plugin.config";
/// The key of the mig-parted config in its ConfigMap.
pub const MIG_CONFIG_KEY: &str = "config.yaml";

/// Where the agent writes, and how long it waits.
#[derive(Debug, Clone)]
pub struct KubeSettings {
    /// The Kubernetes node this agent runs on.
    pub node: String,
    /// Namespace of both ConfigMaps (GPU Operator's).
    pub namespace: String,
    /// The mig-parted ConfigMap (ClusterPolicy `migManager.config.name`).
    pub mig_configmap: String,
    /// The device-plugin ConfigMap (ClusterPolicy `devicePlugin.config.name`).
    pub plugin_configmap: String,
    /// How often mig-manager's state label is read while it works.
    pub poll: Duration,
    /// How long mig-manager may take before the apply is reported as `mig_manager_timeout`.
    pub timeout: Duration,
}

impl KubeSettings {
    /// GPU Operator's usual namespace and Tessera's ConfigMap names.
    pub fn new(node: &str) -> KubeSettings {
        KubeSettings {
            node: node.to_string(),
            namespace: "gpu-operator".to_string(),
            mig_configmap: "tessera-mig-parted-config".to_string(),
            plugin_configmap: "tessera-device-plugin-config".to_string(),
            poll: Duration::from_secs(1),
            timeout: Duration::from_secs(15 * 60),
        }
    }
}

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

fn placements<'a>(instances: impl Iterator<Item = (&'a str, u8)>) -> BTreeSet<(String, u8)> {
    instances.map(|(p, s)| (p.to_string(), s)).collect()
}

fn error(step: &str, code: &str, message: String) -> StepError {
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

fn describe(placements: &BTreeSet<(String, u8)>) -> String {
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

fn node_prefix(node: &str) -> String {
    format!("tessera-{}", &hex(&Sha256::digest(node.as_bytes()))[..8])
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A failure talking to the API server.
#[derive(Debug, thiserror::Error)]
#[error("{code}: {message}")]
pub struct KubeError {
    /// `kube_api`, `kube_conflict`, `kube_config`.
    pub code: &'static str,
    /// What went wrong.
    pub message: String,
}

impl From<kube::Error> for KubeError {
    fn from(e: kube::Error) -> KubeError {
        KubeError { code: "kube_api", message: e.to_string() }
    }
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// The GPU Operator side of the agent.
#[derive(Clone)]
pub struct KubeApplier {
    client: kube::Client,
    settings: KubeSettings,
}

impl std::fmt::Debug for KubeApplier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeApplier").field("settings", &self.settings).finish_non_exhaustive()
    }
}

impl KubeApplier {
    /// Connects to `api` (a URL, for tests and proxies), or else to the cluster the agent runs in (service
    /// account) or the current kubeconfig context.
    pub async fn connect(api: Option<&str>, settings: KubeSettings) -> Result<KubeApplier, KubeError> {
        let config = match api {
            Some(url) => {
                let uri = url.parse().map_err(|e| KubeError { code: "kube_config", message: format!("{url}: {e}") })?;
                kube::Config::new(uri)
            }
            None => {
                kube::Config::infer().await.map_err(|e| KubeError { code: "kube_config", message: e.to_string() })?
            }
        };
        let client =
            kube::Client::try_from(config).map_err(|e| KubeError { code: "kube_config", message: e.to_string() })?;
        Ok(KubeApplier { client, settings })
    }

    /// The settings.
    pub fn settings(&self) -> &KubeSettings {
        &self.settings
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    fn configmaps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), &self.settings.namespace)
    }

    /// The node's labels now.
    pub async fn node_labels(&self) -> Result<BTreeMap<String, String>, KubeError> {
        let node = self.nodes().get(&self.settings.node).await?;
        Ok(node.metadata.labels.unwrap_or_default())
    }

    /// Writes the node's mig-parted entry `name` (and removes this node's other entries but `keep`).
    async fn write_mig_config(&self, name: &str, entries: &[MigEntry], keep: Option<&str>) -> Result<(), KubeError> {
        let api = self.configmaps();
        let cm_name = &self.settings.mig_configmap;
        let prefix = node_prefix(&self.settings.node);
        let entries =
            serde_json::to_value(entries).map_err(|e| KubeError { code: "kube_api", message: e.to_string() })?;
        for _attempt in 0..8 {
            let existing = match api.get(cm_name).await {
                Ok(cm) => Some(cm),
                Err(e) if is_status(&e, 404) => None,
                Err(e) => return Err(e.into()),
            };
            let mut config: Value = match existing.as_ref().and_then(|cm| cm.data.as_ref()?.get(MIG_CONFIG_KEY)) {
                Some(text) => serde_saphyr::from_str(text).map_err(|e| KubeError {
                    code: "kube_config",
                    message: format!("{cm_name}/{MIG_CONFIG_KEY} is not a mig-parted config: {e}"),
                })?,
                None => json!({ "version": "v1", "mig-configs": {} }),
            };
            if !config.get("mig-configs").is_some_and(Value::is_object) {
                config["mig-configs"] = json!({});
            }
            let configs = config["mig-configs"].as_object_mut().ok_or_else(|| KubeError {
                code: "kube_config",
                message: format!("{cm_name}: mig-configs is not a map"),
            })?;
            let stale = |k: &String| k.starts_with(&format!("{prefix}-")) && k != name && Some(k.as_str()) != keep;
            if configs.get(name) == Some(&entries) && !configs.keys().any(stale) {
                return Ok(());
            }
            configs.retain(|k, _| !stale(k));
            configs.insert(name.to_string(), entries.clone());
            let text =
                serde_saphyr::to_string(&config).map_err(|e| KubeError { code: "kube_api", message: e.to_string() })?;
            let result = match existing {
                Some(mut cm) => {
                    cm.data.get_or_insert_with(Default::default).insert(MIG_CONFIG_KEY.to_string(), text);
                    // `resourceVersion` stays as read: a write by another node in between is refused (409).
                    api.replace(cm_name, &PostParams::default(), &cm).await.map(|_| ())
                }
                None => {
                    let mut cm = ConfigMap::default();
                    cm.metadata.name = Some(cm_name.clone());
                    cm.metadata.namespace = Some(self.settings.namespace.clone());
                    cm.data = Some([(MIG_CONFIG_KEY.to_string(), text)].into_iter().collect());
                    api.create(&PostParams::default(), &cm).await.map(|_| ())
                }
            };
            match result {
                Ok(()) => return Ok(()),
                Err(e) if is_status(&e, 409) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(KubeError { code: "kube_conflict", message: format!("{cm_name}: changed by others 8 times in a row") })
    }

    /// Writes the node's device-plugin config `name` (and removes this node's other configs but `keep`).
    async fn write_plugin_config(&self, name: &str, text: &str, keep: Option<&str>) -> Result<(), KubeError> {
        let api = self.configmaps();
        let cm_name = &self.settings.plugin_configmap;
        let prefix = node_prefix(&self.settings.node);
        match api.get(cm_name).await {
            Ok(cm) => {
                let data = cm.data.unwrap_or_default();
                if data.get(name).map(String::as_str) == Some(text) {
                    return Ok(());
                }
                let mut patch = serde_json::Map::new();
                for k in data.keys() {
                    if k.starts_with(&format!("{prefix}-")) && k != name && Some(k.as_str()) != keep {
                        patch.insert(k.clone(), Value::Null);
                    }
                }
                patch.insert(name.to_string(), json!(text));
                api.patch(cm_name, &PatchParams::default(), &Patch::Merge(json!({ "data": patch }))).await?;
                Ok(())
            }
            Err(e) if is_status(&e, 404) => {
                let mut cm = ConfigMap::default();
                cm.metadata.name = Some(cm_name.clone());
                cm.metadata.namespace = Some(self.settings.namespace.clone());
                cm.data = Some([(name.to_string(), text.to_string())].into_iter().collect());
                match api.create(&PostParams::default(), &cm).await {
                    // Created by another node in between: patch it.
                    Err(e) if is_status(&e, 409) => {
                        let patch = json!({ "data": { name: text } });
                        api.patch(cm_name, &PatchParams::default(), &Patch::Merge(patch)).await?;
                        Ok(())
                    }
                    r => r.map(|_| ()).map_err(Into::into),
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn label(&self, labels: Value) -> Result<(), KubeError> {
        let patch = json!({ "metadata": { "labels": labels } });
        self.nodes().patch(&self.settings.node, &PatchParams::default(), &Patch::Merge(patch)).await?;
        Ok(())
    }

    /// Waits until mig-manager reports `success` or `failed` (or the timeout).
    async fn wait_for_mig_manager(&self) -> Result<String, KubeError> {
        let deadline = tokio::time::Instant::now() + self.settings.timeout;
        loop {
            let labels = self.node_labels().await?;
            match labels.get(MIG_STATE_LABEL).map(String::as_str) {
                Some(s @ ("success" | "failed")) => return Ok(s.to_string()),
                _ if tokio::time::Instant::now() >= deadline => {
                    return Err(KubeError {
                        code: "mig_manager_timeout",
                        message: format!(
                            "mig-manager did not report success or failure in {} s (state: {})",
                            self.settings.timeout.as_secs(),
                            labels.get(MIG_STATE_LABEL).map_or("none", String::as_str)
                        ),
                    });
                }
                _ => tokio::time::sleep(self.settings.poll).await,
            }
        }
    }

    /// Puts `spec` in effect through GPU Operator and returns the node's status after it. `backend` is only read
    /// (inventory, placements, processes); the sharing in effect is recorded through it.
    pub async fn apply(&self, backend: &crate::agent::Backend, spec: &NodeSpec) -> NodeStatus {
        let mut node_errors = Vec::new();
        let inventory = crate::agent::with_backend(backend, |b| b.inventory()).await;
        let mut gpu_errors = match inventory {
            Err(e) => {
                node_errors.push(error("inventory", e.code, e.message));
                BTreeMap::new()
            }
            Ok(inventory) => match self.apply_inner(backend, spec, &inventory, &mut node_errors).await {
                Ok(errors) => errors,
                Err(e) => {
                    node_errors.push(error("kubernetes", e.code, e.message));
                    BTreeMap::new()
                }
            },
        };
        gpu_errors.retain(|_, e| !e.is_empty());
        let generation = spec.generation;
        crate::agent::with_backend(backend, move |b| crate::reconcile::observe(b, generation, gpu_errors, node_errors))
            .await
    }

    async fn apply_inner(
        &self,
        backend: &crate::agent::Backend,
        spec: &NodeSpec,
        inventory: &Inventory,
        node_errors: &mut Vec<StepError>,
    ) -> Result<BTreeMap<String, Vec<StepError>>, KubeError> {
        let plan = plan_mig(spec, inventory);
        let mut errors = plan.errors.clone();
        let labels = self.node_labels().await?;
        let current = labels.get(MIG_CONFIG_LABEL).cloned();
        let mig_text = serde_json::to_string(&plan.entries).unwrap_or_default();
        let mig_name = config_name(&self.settings.node, &mig_text);
        let plugin = plan_plugin(spec);
        let plugin_text = serde_saphyr::to_string(&plugin.config)
            .map_err(|e| KubeError { code: "kube_api", message: e.to_string() })?;
        let plugin_name = config_name(&self.settings.node, &plugin_text);
        let relabel = current.as_deref() != Some(mig_name.as_str());
        self.write_mig_config(&mig_name, &plan.entries, current.as_deref()).await?;
        self.write_plugin_config(&plugin_name, &plugin_text, labels.get(PLUGIN_CONFIG_LABEL).map(String::as_str))
            .await?;
        let mut new_labels = serde_json::Map::new();
        if relabel {
            new_labels.insert(MIG_CONFIG_LABEL.to_string(), json!(mig_name));
            // Set with the config so that a `success` left from the previous config is never read as this one's;
            // mig-manager takes it from here.
            new_labels.insert(MIG_STATE_LABEL.to_string(), json!("pending"));
        }
        if labels.get(PLUGIN_CONFIG_LABEL) != Some(&plugin_name) {
            new_labels.insert(PLUGIN_CONFIG_LABEL.to_string(), json!(plugin_name));
        }
        if !new_labels.is_empty() {
            self.label(Value::Object(new_labels)).await?;
        }
        // The sharing now in effect (the device plugin reloads its config on the label change).
        for (uuid, e) in plugin.errors {
            errors.entry(uuid).or_default().extend(e);
        }
        let effective = plugin.effective;
        if let Err(e) = crate::agent::with_backend(backend, move |b| b.apply_sharing(&effective)).await {
            node_errors.push(error("sharing", e.code, e.message));
        }
        match self.wait_for_mig_manager().await {
            Ok(state) if state == "failed" => {
                for uuid in &plan.changed {
                    errors.entry(uuid.clone()).or_default().push(error(
                        "mig-manager",
                        "mig_manager_failed",
                        format!(
                            "mig-manager reported `failed` for config {mig_name} (see the nvidia-mig-manager pod's \
                             log on node {})",
                            self.settings.node
                        ),
                    ));
                }
                return Ok(errors);
            }
            Ok(_) => {}
            Err(e) => {
                for uuid in &plan.changed {
                    errors.entry(uuid.clone()).or_default().push(error("mig-manager", e.code, e.message.clone()));
                }
                return Ok(errors);
            }
        }
        // The previous entry is no longer read by mig-manager.
        self.write_mig_config(&mig_name, &plan.entries, None).await?;
        // mig-parted counted; the driver placed. Read the placements back.
        let after = crate::agent::with_backend(backend, |b| b.inventory())
            .await
            .map_err(|e| KubeError { code: e.code, message: e.message })?;
        for uuid in &plan.changed {
            let (Some(want), Some(have)) =
                (spec.gpus.iter().find(|g| &g.uuid == uuid), after.gpus.iter().find(|g| &g.uuid == uuid))
            else {
                continue;
            };
            let desired = placements(want.layout.iter().map(|i| (i.profile.as_str(), i.start)));
            let observed = placements(have.instances.iter().map(|i| (i.profile.as_str(), i.start)));
            if desired != observed {
                errors.entry(uuid.clone()).or_default().push(error(
                    "placement",
                    "placement_mismatch",
                    format!(
                        "mig-manager created {} where the layout places {}; allocations on instances that are not \
                         where the layout puts them stay pending",
                        describe(&observed),
                        describe(&desired)
                    ),
                ));
            }
        }
        Ok(errors)
    }
}
