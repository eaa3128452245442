//! Who runs each GPU process, read the way the agent reads it on a node: a `/proc` tree (cgroups of both kubelet
//! drivers, `comm`, `status`) and a passwd file laid out as the host has them, the kubelet's pod-resources service
//! generated from the upstream proto file (`tests/podresources_server.py`, grpcio on a unix socket), and a
//! Kubernetes API double that answers the node's pod list in the API server's JSON wire format.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tessera_agent::attribution::{Identifier, UNKNOWN};
use tessera_agent::kube::{KubeApplier, KubeSettings};
use tessera_core::attribution::GpuProcess;

const NODE: &str = "gpu-node-1";
const TRAIN_UID: &str = "0f5b1a8e-6c0d-4a7e-9d57-3c2f7d1e9b44";
const GONE_UID: &str = "9a9a9a9a-0000-4000-8000-000000000001";
const MAIN_ID: &str = "5d3c0b5e0f4a2c1b9e8d7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c";
const SIDECAR_ID: &str = "aaaabbbbccccddddeeeeffff0000111122223333444455556666777788889999";

/// The Python with `grpcio` and `grpcio-tools`: `TESSERA_TEST_PYTHON`, else `target/webhooks-venv` (scripts/test
/// makes it).
fn python() -> String {
    let path = std::env::var("TESSERA_TEST_PYTHON")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../target/webhooks-venv/bin/python").to_string());
    assert!(
        Path::new(&path).exists(),
        "{path} is missing: `python3 -m venv target/webhooks-venv && target/webhooks-venv/bin/pip install \
         grpcio==1.85.1 grpcio-tools==1.85.1` (scripts/test does it)"
    );
    path
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tessera-attribution-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// A process in the fake `/proc`.
fn proc_entry(root: &Path, pid: u32, comm: &str, uid: u32, cgroup: &str) {
    let dir = root.join(pid.to_string());
    std::fs::create_dir_all(&dir).expect("proc dir");
    std::fs::write(dir.join("comm"), format!("{comm}\n")).expect("comm");
    std::fs::write(dir.join("status"), format!("Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t100\n"))
        .expect("status");
    std::fs::write(dir.join("cgroup"), cgroup).expect("cgroup");
}

/// The kubelet's pod-resources service, stopped on drop.
struct Kubelet {
    child: Child,
    socket: PathBuf,
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Kubelet {
    fn start(dir: &Path, answer: &Value) -> Kubelet {
        let socket = dir.join("kubelet.sock");
        let answer_file = dir.join("answer.json");
        std::fs::write(&answer_file, answer.to_string()).expect("answer");
        let here = env!("CARGO_MANIFEST_DIR");
        let mut child = Command::new(python())
            .arg(format!("{here}/tests/podresources_server.py"))
            .arg(format!("{here}/proto/podresources-v1.proto"))
            .arg(&socket)
            .arg(&answer_file)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the pod-resources server");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        std::io::BufReader::new(stdout).read_line(&mut line).expect("read");
        assert_eq!(line.trim(), "ready", "the pod-resources server did not start");
        Kubelet { child, socket }
    }

    fn calls(&self) -> usize {
        let log = PathBuf::from(format!("{}.calls", self.socket.display()));
        std::fs::read_to_string(log).map(|t| t.lines().count()).unwrap_or(0)
    }
}

/// What the kubelet answers: containers of two namespaces with device-plugin devices (a whole GPU, a MIG device,
/// a time-sliced replica) and the fields the agent does not read (CPUs, memory, topology, DRA claims).
fn kubelet_answer() -> Value {
    json!({
        "podResources": [
            {
                "name": "train-0", "namespace": "team-a",
                "containers": [{
                    "name": "main",
                    "devices": [{"resourceName": "nvidia.com/mig-3g.40gb", "deviceIds": ["MIG-aaaa"],
                                 "topology": {"nodes": [{"ID": "0"}]}}],
                    "cpuIds": ["2", "3"],
                    "memory": [{"memoryType": "memory", "size": "1073741824"}],
                    "dynamicResources": [{"className": "gpu.nvidia.com", "claimName": "c", "claimNamespace": "team-a",
                                          "claimResources": [{"cdiDevices": [{"name": "k8s.gpu.nvidia.com/gpu=0"}]}]}]
                }]
            },
            {
                "name": "infer-0", "namespace": "team-b",
                "containers": [{"name": "server",
                                "devices": [{"resourceName": "nvidia.com/gpu", "deviceIds": ["GPU-cccc::1"]}]}]
            }
        ]
    })
}

#[derive(Default)]
struct Api {
    /// The `fieldSelector` of each pod list.
    selectors: Vec<String>,
}

async fn list_pods(
    State(api): State<Arc<Mutex<Api>>>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Response {
    let selector = q.get("fieldSelector").cloned().unwrap_or_default();
    api.lock().expect("api").selectors.push(selector.clone());
    if selector != format!("spec.nodeName={NODE}") {
        let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403,
                          "reason": "Forbidden", "message": "the agent may list only its node's pods"});
        return (StatusCode::FORBIDDEN, axum::Json(body)).into_response();
    }
    let container = |name: &str, id: &str| {
        json!({"name": name, "containerID": format!("containerd://{id}"),
        "image": "x", "imageID": "", "ready": true, "restartCount": 0})
    };
    axum::Json(json!({
        "kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "7"},
        "items": [{
            "metadata": {"name": "train-0", "namespace": "team-a", "uid": TRAIN_UID},
            "spec": {"nodeName": NODE, "containers": [{"name": "main"}, {"name": "sidecar"}]},
            "status": {"phase": "Running",
                       "containerStatuses": [container("main", MAIN_ID), container("sidecar", SIDECAR_ID)]}
        }]
    }))
    .into_response()
}

async fn api_double() -> (String, Arc<Mutex<Api>>) {
    let api = Arc::new(Mutex::new(Api::default()));
    let app = axum::Router::new().route("/api/v1/pods", axum::routing::get(list_pods)).with_state(api.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, api)
}

fn process(device: &str, pid: u32) -> GpuProcess {
    GpuProcess { device: device.into(), pid, user: None, command: None, pod: None }
}

fn who(p: &GpuProcess) -> Option<(&str, &str, &str)> {
    p.pod.as_ref().map(|x| (x.namespace.as_str(), x.pod.as_str(), x.container.as_str()))
}

/// The node: pid 101 is the sidecar of team-a's pod (systemd driver, cgroup v2), 102 a host process, 104 a
/// process of a pod the API server does not list (cgroupfs driver, v1); 103 has no `/proc` entry.
fn node(dir: &Path) -> (PathBuf, PathBuf) {
    let root = dir.join("proc");
    let systemd = |uid: &str, id: &str| {
        format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{id}.scope\n",
            uid.replace('-', "_")
        )
    };
    proc_entry(&root, 101, "python3", 1001, &systemd(TRAIN_UID, SIDECAR_ID));
    proc_entry(&root, 102, "nvidia-smi", 0, "0::/user.slice/user-0.slice/session-1.scope\n");
    proc_entry(&root, 104, "miner", 65534, &format!("11:memory:/kubepods/besteffort/pod{GONE_UID}/{MAIN_ID}\n"));
    let passwd = dir.join("passwd");
    std::fs::write(&passwd, "root:x:0:0:root:/root:/bin/bash\nann:x:1001:100::/home/ann:/bin/sh\n").expect("passwd");
    (root, passwd)
}

#[tokio::test]
async fn every_process_is_named_by_its_cgroup_the_nodes_pods_and_the_kubelet() {
    let dir = scratch("kube");
    let (proc_root, passwd) = node(&dir);
    let kubelet = Kubelet::start(&dir, &kubelet_answer());
    let (url, api) = api_double().await;
    let kube = KubeApplier::connect(Some(&url), KubeSettings::new(NODE)).await.expect("kube client");
    let identifier = Identifier {
        proc_root,
        passwd,
        pod_resources: Some(kubelet.socket.clone()),
        kube: Some(kube),
        timeout: Duration::from_secs(10),
    };
    let mut processes =
        vec![process("MIG-aaaa", 101), process("MIG-bbbb", 102), process("GPU-cccc", 103), process("MIG-aaaa", 104)];
    identifier.identify(&mut processes).await;

    // The cgroup names the pod and the container (the sidecar, not the container the kubelet handed the device).
    assert_eq!(who(&processes[0]), Some(("team-a", "train-0", "sidecar")));
    assert_eq!((processes[0].user.as_deref(), processes[0].command.as_deref()), (Some("ann"), Some("python3")));
    // A host process: no pod, the user by name.
    assert_eq!(who(&processes[1]), None);
    assert_eq!((processes[1].user.as_deref(), processes[1].command.as_deref()), (Some("root"), Some("nvidia-smi")));
    // No /proc entry: the kubelet's assignment of the device (a time-sliced replica, `::1`) names the container.
    assert_eq!(who(&processes[2]), Some(("team-b", "infer-0", "server")));
    assert_eq!((processes[2].user.as_deref(), processes[2].command.as_deref()), (None, None));
    // A pod the API server does not list: unknown (no tenant governs it), the uid as the only name there is.
    let unknown = processes[3].pod.as_ref().expect("pod");
    assert_eq!((unknown.namespace.as_str(), unknown.pod.clone()), (UNKNOWN, format!("uid {GONE_UID}")));
    assert_eq!(processes[3].user.as_deref(), Some("65534"), "a uid the passwd file does not name");

    // One list of the node's pods, selected by the node; one call to the kubelet.
    assert_eq!(api.lock().expect("api").selectors, [format!("spec.nodeName={NODE}")]);
    assert_eq!(kubelet.calls(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn without_the_api_server_only_unread_processes_are_named_by_the_kubelet_and_pods_are_unknown() {
    let dir = scratch("plain");
    let (proc_root, passwd) = node(&dir);
    let kubelet = Kubelet::start(&dir, &kubelet_answer());
    let mut identifier = Identifier {
        proc_root,
        passwd,
        pod_resources: Some(kubelet.socket.clone()),
        kube: None,
        timeout: Duration::from_secs(10),
    };
    let mut processes =
        vec![process("MIG-aaaa", 101), process("MIG-bbbb", 102), process("MIG-dddd", 104), process("GPU-cccc", 103)];
    identifier.identify(&mut processes).await;
    // In a pod's cgroup, without the node's pods: unknown, even on the device the kubelet handed team-a's
    // container (another tenant's pod may reach it: the assignment would file that under the holder).
    assert_eq!(processes[0].pod.as_ref().map(|p| p.namespace.as_str()), Some(UNKNOWN));
    assert_eq!(processes[0].user.as_deref(), Some("ann"));
    assert_eq!(who(&processes[1]), None, "a host process stays nobody's pod");
    assert_eq!(processes[2].pod.as_ref().map(|p| p.namespace.as_str()), Some(UNKNOWN));
    // Nothing read of it: the kubelet's one holder of the device names it.
    assert_eq!(who(&processes[3]), Some(("team-b", "infer-0", "server")));
    assert_eq!(kubelet.calls(), 1);

    // The kubelet gone (restarting, its socket left behind): not waited for; a process nothing was read of is a pod
    // nobody can name, never nobody's.
    drop(kubelet);
    identifier.timeout = Duration::from_secs(2);
    let mut processes = vec![process("MIG-aaaa", 101), process("GPU-cccc", 103)];
    let started = std::time::Instant::now();
    identifier.identify(&mut processes).await;
    assert!(started.elapsed() < Duration::from_secs(5), "a missing kubelet is not waited for");
    assert_eq!(processes[0].user.as_deref(), Some("ann"));
    assert_eq!(processes[1].pod.as_ref().map(|p| p.namespace.as_str()), Some(UNKNOWN));

    // A bare-metal node (no kubelet socket, no API server): a process nothing was read of is nobody's pod.
    let bare = Identifier { pod_resources: Some(dir.join("no-such.sock")), ..identifier };
    let mut processes = vec![process("GPU-cccc", 103)];
    bare.identify(&mut processes).await;
    assert_eq!(who(&processes[0]), None);
    let _ = std::fs::remove_dir_all(&dir);
}
