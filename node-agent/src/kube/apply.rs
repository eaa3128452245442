//! Applying for `--kube` mode: the ConfigMap and label writes, and following mig-manager's state label.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tessera_core::api::{Inventory, NodeSpec, NodeStatus, StepError};

use super::plan::{describe, error, node_prefix, placements};
use super::*;

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

    /// The pods the API server has on this node (a list with `fieldSelector=spec.nodeName=<node>`, so bounded by
    /// the node, not the cluster), for naming the pod a process's cgroup places it in.
    pub async fn pods_on_node(&self) -> Result<Vec<NodePod>, KubeError> {
        use k8s_openapi::api::core::v1::Pod;
        let pods: Api<Pod> = Api::all(self.client.clone());
        let params = kube::api::ListParams::default().fields(&format!("spec.nodeName={}", self.settings.node));
        let list = pods.list(&params).await?;
        Ok(list
            .items
            .into_iter()
            .filter_map(|pod| {
                let uid = pod.metadata.uid?;
                let spec = pod.spec.unwrap_or_default();
                let names = spec
                    .containers
                    .iter()
                    .chain(spec.init_containers.iter().flatten())
                    .map(|c| c.name.clone())
                    .collect();
                let status = pod.status.unwrap_or_default();
                let containers = status
                    .container_statuses
                    .iter()
                    .flatten()
                    .chain(status.init_container_statuses.iter().flatten())
                    .filter_map(|c| {
                        // `containerd://<id>`, `cri-o://<id>`, `docker://<id>`.
                        let id = c.container_id.as_deref()?.rsplit("://").next()?.to_string();
                        Some((id, c.name.clone()))
                    })
                    .collect();
                Some(NodePod { uid, namespace: pod.metadata.namespace?, name: pod.metadata.name?, containers, names })
            })
            .collect())
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
    pub async fn apply(&self, backend: &crate::backend::Backend, spec: &NodeSpec) -> NodeStatus {
        let mut node_errors = Vec::new();
        let inventory = crate::backend::with_backend(backend, |b| b.inventory()).await;
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
        crate::backend::with_backend(backend, move |b| {
            crate::reconcile::observe(b, generation, gpu_errors, node_errors)
        })
        .await
    }

    async fn apply_inner(
        &self,
        backend: &crate::backend::Backend,
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
        if let Err(e) = crate::backend::with_backend(backend, move |b| b.apply_sharing(&effective)).await {
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
        let after = crate::backend::with_backend(backend, |b| b.inventory())
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
