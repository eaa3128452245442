//! `--kube` mode against a Kubernetes API test double that speaks the API server's JSON wire format (objects,
//! `Status` errors, `resourceVersion` conflicts, JSON merge patches), and a mig-manager double that follows the
//! node label as GPU Operator's does: it reads the node's mig-parted entry, re-creates the instances of every GPU
//! whose profile counts differ, lets the "driver" choose placements (first free allowed start), and reports
//! `nvidia.com/mig.config.state`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tessera_agent::backend::sim::{SimBackend, SimNode};
use tessera_agent::backend::{Backend, GpuBackend};
use tessera_agent::kube::{
    KubeApplier, KubeSettings, MIG_CONFIG_KEY, MIG_CONFIG_LABEL, MIG_STATE_LABEL, PLUGIN_CONFIG_LABEL,
};
use tessera_core::Catalog;
use tessera_core::api::{GpuSpec, NodeSpec, NodeStatus};
use tessera_core::layout::PlacedInstance;
use tessera_core::sharing::{GpuSharing, Sharing};

const NS: &str = "gpu-operator";
const NODE: &str = "gpu-node-1";

#[derive(Default)]
struct Cluster {
    nodes: BTreeMap<String, Value>,
    configmaps: BTreeMap<String, Value>,
    version: u64,
    /// Requests as `METHOD path`.
    log: Vec<String>,
    /// The next PUT of a ConfigMap is refused with 409, after this change by "another node".
    race_next_put: Option<(String, Value)>,
    /// mig-manager reports `failed` instead of applying.
    mig_manager_fails: bool,
}

type Shared = Arc<Mutex<Cluster>>;

fn status(code: u16, reason: &str, message: String) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code,
    });
    (StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), axum::Json(body)).into_response()
}

/// RFC 7386 JSON merge patch.
fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().expect("object");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

fn bump(c: &mut Cluster, obj: &mut Value) {
    c.version += 1;
    obj["metadata"]["resourceVersion"] = json!(c.version.to_string());
}

async fn node_handler(
    State(c): State<Shared>,
    method: Method,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    let mut c = c.lock().expect("cluster");
    c.log.push(format!("{method} /api/v1/nodes/{name}"));
    let Some(mut obj) = c.nodes.get(&name).cloned() else {
        return status(404, "NotFound", format!("nodes \"{name}\" not found"));
    };
    if method == Method::PATCH {
        if headers.get("content-type").and_then(|v| v.to_str().ok()) != Some("application/merge-patch+json") {
            return status(415, "UnsupportedMediaType", "the body of the request was in an unknown format".into());
        }
        let patch: Value = match serde_json::from_slice(&body) {
            Ok(p) => p,
            Err(e) => return status(400, "BadRequest", e.to_string()),
        };
        merge(&mut obj, &patch);
        bump(&mut c, &mut obj);
        c.nodes.insert(name, obj.clone());
    }
    axum::Json(obj).into_response()
}

async fn configmap_handler(
    State(c): State<Shared>,
    method: Method,
    headers: HeaderMap,
    Path((ns, name)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let mut c = c.lock().expect("cluster");
    c.log.push(format!("{method} /api/v1/namespaces/{ns}/configmaps/{name}"));
    let key = format!("{ns}/{name}");
    let Some(mut obj) = c.configmaps.get(&key).cloned() else {
        return status(404, "NotFound", format!("configmaps \"{name}\" not found"));
    };
    match method {
        Method::GET => {}
        Method::PUT => {
            let new: Value = match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(e) => return status(400, "BadRequest", e.to_string()),
            };
            if let Some((other_key, other)) = c.race_next_put.take() {
                // Another node's agent writes first.
                let mut text: Value =
                    serde_saphyr::from_str(obj["data"][MIG_CONFIG_KEY].as_str().unwrap_or("{}")).expect("yaml");
                text["mig-configs"][other_key] = other;
                obj["data"][MIG_CONFIG_KEY] = json!(serde_saphyr::to_string(&text).expect("yaml"));
                bump(&mut c, &mut obj);
                c.configmaps.insert(key, obj);
                return status(
                    409,
                    "Conflict",
                    format!(
                        "Operation cannot be fulfilled on configmaps \"{name}\": the object has been modified; please \
                         apply your changes to the latest version and try again"
                    ),
                );
            }
            if new["metadata"]["resourceVersion"] != obj["metadata"]["resourceVersion"] {
                return status(409, "Conflict", format!("Operation cannot be fulfilled on configmaps \"{name}\""));
            }
            obj = new;
            bump(&mut c, &mut obj);
            c.configmaps.insert(key, obj.clone());
        }
        Method::PATCH => {
            if headers.get("content-type").and_then(|v| v.to_str().ok()) != Some("application/merge-patch+json") {
                return status(415, "UnsupportedMediaType", "the body of the request was in an unknown format".into());
            }
            let patch: Value = serde_json::from_slice(&body).expect("json");
            merge(&mut obj, &patch);
            bump(&mut c, &mut obj);
            c.configmaps.insert(key, obj.clone());
        }
        _ => return status(405, "MethodNotAllowed", "method not allowed".into()),
    }
    axum::Json(obj).into_response()
}

async fn create_configmap(State(c): State<Shared>, Path(ns): Path<String>, body: Bytes) -> Response {
    let mut c = c.lock().expect("cluster");
    c.log.push(format!("POST /api/v1/namespaces/{ns}/configmaps"));
    let mut obj: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return status(400, "BadRequest", e.to_string()),
    };
    let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let key = format!("{ns}/{name}");
    if c.configmaps.contains_key(&key) {
        return status(409, "AlreadyExists", format!("configmaps \"{name}\" already exists"));
    }
    if obj["kind"] != "ConfigMap" || obj["apiVersion"] != "v1" {
        return status(400, "BadRequest", "kind/apiVersion missing".into());
    }
    bump(&mut c, &mut obj);
    c.configmaps.insert(key, obj.clone());
    (StatusCode::CREATED, axum::Json(obj)).into_response()
}

/// GPU Operator's mig-manager, as far as the agent can tell: follows the node label, applies profile counts with
/// driver-chosen placements, reports the state label.
fn mig_manager(cluster: Shared, sim: Arc<Mutex<SimNode>>) {
    tokio::spawn(async move {
        let mut done: Option<String> = None;
        loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let (name, text, fail) = {
                let c = cluster.lock().expect("cluster");
                let labels = &c.nodes[NODE]["metadata"]["labels"];
                let Some(name) = labels[MIG_CONFIG_LABEL].as_str().map(str::to_string) else { continue };
                if done.as_deref() == Some(name.as_str()) {
                    continue;
                }
                let text = c
                    .configmaps
                    .get(&format!("{NS}/tessera-mig-parted-config"))
                    .map(|cm| cm["data"][MIG_CONFIG_KEY].clone());
                (name, text, c.mig_manager_fails)
            };
            let outcome = if fail { "failed" } else { apply_mig_parted(&sim, &name, text) };
            let mut c = cluster.lock().expect("cluster");
            let mut node = c.nodes[NODE].clone();
            node["metadata"]["labels"][MIG_STATE_LABEL] = json!(outcome);
            bump(&mut c, &mut node);
            c.nodes.insert(NODE.to_string(), node);
            done = Some(name);
        }
    });
}

fn apply_mig_parted(sim: &Arc<Mutex<SimNode>>, name: &str, text: Option<Value>) -> &'static str {
    let Some(config) = text.and_then(|t| serde_saphyr::from_str::<Value>(t.as_str()?).ok()) else { return "failed" };
    let Some(entries) = config["mig-configs"][name].as_array().cloned() else { return "failed" };
    let mut backend = SimBackend::new(sim.clone());
    let catalog = Catalog::builtin();
    for entry in entries {
        let want: BTreeMap<String, u64> = entry["mig-devices"]
            .as_object()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0))).collect())
            .unwrap_or_default();
        for index in entry["devices"].as_array().into_iter().flatten().filter_map(Value::as_u64) {
            let gpu = sim.lock().expect("sim").gpus[index as usize].clone();
            let mut have: BTreeMap<String, u64> = BTreeMap::new();
            for i in &gpu.instances {
                *have.entry(i.profile.clone()).or_default() += 1;
            }
            if have == want {
                continue;
            }
            for i in &gpu.instances {
                if backend.destroy_instance(&gpu.uuid, &i.profile, i.start).is_err() {
                    return "failed";
                }
            }
            // The "driver" places: largest profiles first, each at its highest free allowed start.
            let model = catalog.model(&gpu.model).expect("model");
            let mut order: Vec<(&String, &u64)> = want.iter().collect();
            order.sort_by_key(|(p, _)| std::cmp::Reverse(model.profile(p).map_or(0, |p| p.memory_slices)));
            for (profile, n) in order {
                let starts = model.profile(profile).expect("profile").allowed_starts();
                for _ in 0..*n {
                    if !starts.iter().rev().any(|&s| backend.create_instance(&gpu.uuid, profile, s).is_ok()) {
                        return "failed";
                    }
                }
            }
        }
    }
    "success"
}

struct Fixture {
    cluster: Shared,
    sim: Arc<Mutex<SimNode>>,
    backend: Backend,
    applier: KubeApplier,
}

async fn fixture(gpus: &[(&str, u32)]) -> Fixture {
    let gpus: Vec<(String, u32)> = gpus.iter().map(|&(m, n)| (m.to_string(), n)).collect();
    let node = SimNode::new(NODE, &gpus);
    let sim = Arc::new(Mutex::new(node));
    let cluster: Shared = Arc::default();
    cluster.lock().expect("cluster").nodes.insert(
        NODE.to_string(),
        json!({ "apiVersion": "v1", "kind": "Node",
                "metadata": { "name": NODE, "resourceVersion": "1", "labels": { "kubernetes.io/hostname": NODE } } }),
    );
    let app = Router::new()
        .route("/api/v1/nodes/{name}", get(node_handler).patch(node_handler))
        .route("/api/v1/namespaces/{ns}/configmaps", post(create_configmap))
        .route(
            "/api/v1/namespaces/{ns}/configmaps/{name}",
            get(configmap_handler).put(configmap_handler).patch(configmap_handler),
        )
        .with_state(cluster.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    mig_manager(cluster.clone(), sim.clone());
    let mut settings = KubeSettings::new(NODE);
    settings.poll = Duration::from_millis(20);
    settings.timeout = Duration::from_secs(10);
    let applier = KubeApplier::connect(Some(&format!("http://{addr}")), settings).await.expect("connect");
    let backend: Backend = Arc::new(Mutex::new(Box::new(SimBackend::new(sim.clone())) as Box<dyn GpuBackend>));
    Fixture { cluster, sim, backend, applier }
}

fn gpu_spec(f: &Fixture, index: usize, layout: &[(&str, u8)], sharing: GpuSharing) -> GpuSpec {
    let node = f.sim.lock().expect("sim");
    let g = &node.gpus[index];
    GpuSpec {
        uuid: g.uuid.clone(),
        index: g.index,
        mig_enabled: g.mig_enabled,
        layout: layout.iter().map(|&(p, s)| PlacedInstance { profile: p.into(), start: s }).collect(),
        sharing,
        allocations: vec![],
    }
}

fn exclusive(mig: bool) -> GpuSharing {
    GpuSharing { mig_enabled: mig, gpu: Sharing::Exclusive, instances: vec![] }
}

fn placements(status: &NodeStatus, gpu: usize) -> Vec<(String, u8)> {
    let mut p: Vec<_> = status.gpus[gpu].instances.iter().map(|i| (i.profile.clone(), i.start)).collect();
    p.sort_by_key(|(_, s)| *s);
    p
}

fn codes(status: &NodeStatus, gpu: usize) -> Vec<String> {
    status.gpus[gpu].errors.iter().map(|e| e.code.clone()).collect()
}

fn mig_config(f: &Fixture) -> Value {
    let c = f.cluster.lock().expect("cluster");
    let text = c.configmaps[&format!("{NS}/tessera-mig-parted-config")]["data"][MIG_CONFIG_KEY]
        .as_str()
        .expect("text")
        .to_string();
    serde_saphyr::from_str(&text).expect("mig-parted yaml")
}

fn labels(f: &Fixture) -> Value {
    f.cluster.lock().expect("cluster").nodes[NODE]["metadata"]["labels"].clone()
}

#[tokio::test]
async fn a_layout_goes_through_the_mig_parted_config_and_the_node_label() {
    let f = fixture(&[("H100-80GB", 2)]).await;
    let layout = [("1g.10gb", 0), ("1g.10gb", 1), ("2g.20gb", 2), ("3g.40gb", 4)];
    let spec = NodeSpec {
        node: NODE.into(),
        generation: 3,
        gpus: vec![gpu_spec(&f, 0, &layout, exclusive(true)), gpu_spec(&f, 1, &[("7g.80gb", 0)], exclusive(true))],
    };
    let status = f.applier.apply(&f.backend, &spec).await;
    assert!(status.errors.is_empty(), "{:?}", status.errors);
    assert_eq!(codes(&status, 0), Vec::<String>::new());
    assert_eq!(status.observed_generation, 3);
    assert_eq!(placements(&status, 0), layout.iter().map(|&(p, s)| (p.to_string(), s)).collect::<Vec<_>>());
    assert_eq!(placements(&status, 1), [("7g.80gb".to_string(), 0)]);
    // The ConfigMap holds the node's entry in mig-parted's format, and the node is labelled with it.
    let config = mig_config(&f);
    assert_eq!(config["version"], "v1");
    let name = labels(&f)[MIG_CONFIG_LABEL].as_str().expect("label").to_string();
    assert!(name.starts_with("tessera-") && name.len() <= 63, "{name}");
    assert_eq!(
        config["mig-configs"][&name],
        json!([
            { "devices": [0], "mig-enabled": true, "mig-devices": { "1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1 } },
            { "devices": [1], "mig-enabled": true, "mig-devices": { "7g.80gb": 1 } },
        ])
    );
    assert_eq!(labels(&f)[MIG_STATE_LABEL], "success");
    // Applying the same spec again writes nothing.
    let writes = |f: &Fixture| f.cluster.lock().expect("cluster").log.iter().filter(|l| !l.starts_with("GET")).count();
    let before = writes(&f);
    let again = f.applier.apply(&f.backend, &spec).await;
    assert_eq!(writes(&f), before, "{:?}", f.cluster.lock().expect("cluster").log);
    assert_eq!(placements(&again, 0), placements(&status, 0));

    // A new layout replaces the node's entry; the old one is removed from the ConfigMap.
    let spec = NodeSpec {
        generation: 4,
        gpus: vec![gpu_spec(&f, 0, &[("4g.40gb", 0), ("3g.40gb", 4)], exclusive(true)), spec.gpus[1].clone()],
        ..spec
    };
    let status = f.applier.apply(&f.backend, &spec).await;
    assert_eq!(codes(&status, 0), Vec::<String>::new());
    assert_eq!(placements(&status, 0), [("4g.40gb".to_string(), 0), ("3g.40gb".to_string(), 4)]);
    let config = mig_config(&f);
    let names: Vec<&String> = config["mig-configs"].as_object().expect("map").keys().collect();
    assert_eq!(names, [labels(&f)[MIG_CONFIG_LABEL].as_str().expect("label")]);
}

#[tokio::test]
async fn placements_the_driver_chose_differently_are_reported() {
    let f = fixture(&[("H100-80GB", 1)]).await;
    // The planner puts one 1g.10gb at 0; mig-parted only says "one 1g.10gb" and the driver takes another slot.
    let spec =
        NodeSpec { node: NODE.into(), generation: 1, gpus: vec![gpu_spec(&f, 0, &[("1g.10gb", 0)], exclusive(true))] };
    let status = f.applier.apply(&f.backend, &spec).await;
    assert_eq!(placements(&status, 0), [("1g.10gb".to_string(), 6)]);
    assert_eq!(codes(&status, 0), ["placement_mismatch"]);
    assert!(status.gpus[0].errors[0].message.contains("1g.10gb@6"), "{:?}", status.gpus[0].errors);
    // Applied again: the counts already match, so there is nothing mig-parted could do; still reported.
    let status = f.applier.apply(&f.backend, &spec).await;
    assert_eq!(codes(&status, 0), ["placement_mismatch"]);
}

#[tokio::test]
async fn a_gpu_with_a_busy_instance_keeps_its_layout() {
    let f = fixture(&[("H100-80GB", 1)]).await;
    let spec = NodeSpec {
        node: NODE.into(),
        generation: 1,
        gpus: vec![gpu_spec(&f, 0, &[("3g.40gb", 0), ("3g.40gb", 4)], exclusive(true))],
    };
    let status = f.applier.apply(&f.backend, &spec).await;
    assert_eq!(codes(&status, 0), Vec::<String>::new());
    let busy = status.gpus[0].instances[0].uuid.clone();
    f.sim.lock().expect("sim").start_process(&busy).expect("pid");
    // mig-manager would re-create both instances: the agent keeps the GPU's entry as it is.
    let spec = NodeSpec {
        generation: 2,
        gpus: vec![gpu_spec(&f, 0, &[("3g.40gb", 4), ("2g.20gb", 2), ("1g.10gb", 1)], exclusive(true))],
        ..spec
    };
    let status = f.applier.apply(&f.backend, &spec).await;
    assert_eq!(codes(&status, 0), ["instance_busy"]);
    assert_eq!(placements(&status, 0), [("3g.40gb".to_string(), 0), ("3g.40gb".to_string(), 4)]);
    let name = labels(&f)[MIG_CONFIG_LABEL].as_str().expect("label").to_string();
    assert_eq!(mig_config(&f)["mig-configs"][&name][0]["mig-devices"], json!({ "3g.40gb": 2 }));
    // Once the process ends, the next apply changes it.
    f.sim.lock().expect("sim").stop_processes(&busy);
    let status = f.applier.apply(&f.backend, &spec).await;
    assert_eq!(codes(&status, 0), Vec::<String>::new());
    assert_eq!(status.gpus[0].instances.len(), 3);
}

#[tokio::test]
async fn a_conflicting_write_by_another_node_is_retried_and_both_entries_stay() {
    let f = fixture(&[("H100-80GB", 1)]).await;
    let spec =
        NodeSpec { node: NODE.into(), generation: 1, gpus: vec![gpu_spec(&f, 0, &[("7g.80gb", 0)], exclusive(true))] };
    f.applier.apply(&f.backend, &spec).await;
    let other = json!([{ "devices": "all", "mig-enabled": true, "mig-devices": { "1g.10gb": 7 } }]);
    f.cluster.lock().expect("cluster").race_next_put = Some(("tessera-00000000-other".into(), other.clone()));
    let spec = NodeSpec { generation: 2, gpus: vec![gpu_spec(&f, 0, &[("4g.40gb", 0)], exclusive(true))], ..spec };
    let status = f.applier.apply(&f.backend, &spec).await;
    assert!(status.errors.is_empty(), "{:?}", status.errors);
    assert_eq!(placements(&status, 0), [("4g.40gb".to_string(), 0)]);
    let config = mig_config(&f);
    assert_eq!(config["mig-configs"]["tessera-00000000-other"], other);
    let name = labels(&f)[MIG_CONFIG_LABEL].as_str().expect("label").to_string();
    assert_eq!(config["mig-configs"][&name][0]["mig-devices"], json!({ "4g.40gb": 1 }));
    let log = f.cluster.lock().expect("cluster").log.clone();
    let puts = log.iter().filter(|l| l.starts_with("PUT")).count();
    // The first write created the ConfigMap. Then: a replace that lost the race, the one that won, and the one
    // that removed this node's previous entry after mig-manager's `success`.
    assert_eq!(puts, 3, "{log:?}");
}

#[tokio::test]
async fn mig_manager_failure_and_timeout_are_reported_per_gpu() {
    let f = fixture(&[("H100-80GB", 1)]).await;
    f.cluster.lock().expect("cluster").mig_manager_fails = true;
    let spec =
        NodeSpec { node: NODE.into(), generation: 1, gpus: vec![gpu_spec(&f, 0, &[("7g.80gb", 0)], exclusive(true))] };
    let status = f.applier.apply(&f.backend, &spec).await;
    assert_eq!(codes(&status, 0), ["mig_manager_failed"]);
    assert!(status.gpus[0].instances.is_empty());
}

#[tokio::test]
async fn sharing_becomes_the_device_plugin_config_and_what_it_cannot_express_is_reported() {
    let f = fixture(&[("A100-40GB", 2), ("H100-80GB", 2)]).await;
    for index in [2, 3] {
        f.sim.lock().expect("sim").set_mig(index, false).expect("MIG off");
    }
    let ts = |r| GpuSharing { mig_enabled: false, gpu: Sharing::Timeslice { replicas: r }, instances: vec![] };
    let mig = GpuSharing {
        mig_enabled: true,
        gpu: Sharing::Exclusive,
        instances: vec![tessera_core::sharing::InstanceSharing {
            profile: "1g.5gb".into(),
            start: 0,
            sharing: Sharing::Timeslice { replicas: 3 },
        }],
    };
    let spec = NodeSpec {
        node: NODE.into(),
        generation: 1,
        gpus: vec![
            gpu_spec(&f, 0, &[("1g.5gb", 0), ("4g.20gb", 4)], mig),
            gpu_spec(&f, 1, &[], exclusive(true)),
            gpu_spec(&f, 2, &[], ts(4)),
            gpu_spec(&f, 3, &[], ts(2)),
        ],
    };
    let status = f.applier.apply(&f.backend, &spec).await;
    let name = labels(&f)[PLUGIN_CONFIG_LABEL].as_str().expect("plugin label").to_string();
    let text = f.cluster.lock().expect("cluster").configmaps[&format!("{NS}/tessera-device-plugin-config")]["data"]
        [&name]
        .as_str()
        .expect("config")
        .to_string();
    let config: Value = serde_saphyr::from_str(&text).expect("device-plugin yaml");
    assert_eq!(config["version"], "v1");
    assert_eq!(config["flags"]["migStrategy"], "mixed");
    assert_eq!(
        config["sharing"]["timeSlicing"]["resources"],
        json!([{ "name": "nvidia.com/mig-1g.5gb", "replicas": 3 }, { "name": "nvidia.com/gpu", "replicas": 4 }])
    );
    // Both whole GPUs share `nvidia.com/gpu`: the lower index's 4 replicas win, the other GPU is told why.
    assert_eq!(codes(&status, 2), Vec::<String>::new());
    assert_eq!(codes(&status, 3), ["sharing_not_uniform"]);
    assert_eq!(status.gpus[3].sharing.as_ref().map(|s| s.gpu), Some(Sharing::Timeslice { replicas: 4 }));
    assert_eq!(status.gpus[0].sharing.as_ref().map(|s| s.instances.len()), Some(1));
}

#[test]
fn one_sharing_per_resource_and_one_mode_per_node() {
    use tessera_agent::kube::plan_plugin;
    let node = SimNode::new("n", &[("H100-80GB".to_string(), 3)]);
    let spec = NodeSpec {
        node: "n".into(),
        generation: 1,
        gpus: node
            .gpus
            .iter()
            .zip([Sharing::Mps { replicas: 4 }, Sharing::Mps { replicas: 4 }, Sharing::Timeslice { replicas: 2 }])
            .map(|(g, s)| GpuSpec {
                uuid: g.uuid.clone(),
                index: g.index,
                mig_enabled: false,
                layout: vec![],
                sharing: GpuSharing { mig_enabled: false, gpu: s, instances: vec![] },
                allocations: vec![],
            })
            .collect(),
    };
    let plan = plan_plugin(&spec);
    assert_eq!(plan.config["sharing"]["mps"]["resources"], json!([{ "name": "nvidia.com/gpu", "replicas": 4 }]));
    assert!(plan.config["sharing"].get("timeSlicing").is_none());
    let uuid = &spec.gpus[2].uuid;
    let codes: Vec<&str> = plan.errors[uuid].iter().map(|e| e.code.as_str()).collect();
    assert_eq!(codes, ["sharing_mode_conflict"]);
    assert_eq!(plan.effective[2].sharing.gpu, Sharing::Mps { replicas: 4 });
}
