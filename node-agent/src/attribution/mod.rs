//! Who runs each process on the node's GPUs: the user and command from `/proc`, and on a Kubernetes node the pod
//! and container.
//!
//! The backend lists the compute processes per device (NVML: per GPU, and per MIG device by its GPU instance).
//! For each, in this order:
//!
//! 1. `/proc/<pid>/cgroup` says whether it runs in a pod, and which (pod UID, container id) — both cgroup drivers,
//!    v1 and v2 ([`procfs::parse_cgroup`]); `/proc/<pid>/comm` and the real uid (named from the passwd file) give
//!    the command and user.
//! 2. The pod UID is named through the pods the API server has on this node (`--kube`: a list with
//!    `fieldSelector=spec.nodeName=<node>`), the container through its status's `containerID`. A pod the list
//!    does not have (it started after the list, or it is a static pod the API server was not told of) is reported
//!    as the pod of no namespace, [`UNKNOWN`], which no tenant governs: unknown is never taken as allowed.
//! 3. Where the pods cannot be listed (not `--kube`), or `/proc/<pid>` cannot be read (the agent does not share
//!    the host's process namespace), the kubelet's pod-resources `List` names the container the device was handed
//!    to, as dcgm-exporter does — only when exactly one container holds the device (a time-sliced GPU's
//!    several holders cannot be told apart by assignment).

pub mod podresources;
pub mod procfs;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use tessera_core::attribution::{GpuProcess, PodRef, field};

pub use crate::kube::NodePod;
use podresources::Assignments;
use procfs::{Placement, ProcInfo};

/// The namespace reported for a process in a pod the agent cannot name: not a DNS label, so no tenant governs it.
pub const UNKNOWN: &str = "(unknown)";

/// Where the agent reads who runs each process.
#[derive(Debug, Clone)]
pub struct Identifier {
    /// The host's `/proc` (the agent runs with the host's process namespace, or has it mounted here).
    pub proc_root: PathBuf,
    /// The host's passwd file, for user names.
    pub passwd: PathBuf,
    /// The kubelet's pod-resources socket (used while it exists).
    pub pod_resources: Option<PathBuf>,
    /// `--kube`: the client that lists the node's pods.
    pub kube: Option<crate::kube::KubeApplier>,
    /// How long each call to the kubelet or the API server may take.
    pub timeout: Duration,
}

impl Identifier {
    /// Reads from the host's usual places; the pod-resources socket where it exists.
    pub fn host(kube: Option<crate::kube::KubeApplier>) -> Identifier {
        Identifier {
            proc_root: PathBuf::from("/proc"),
            passwd: PathBuf::from("/etc/passwd"),
            pod_resources: Some(PathBuf::from("/var/lib/kubelet/pod-resources/kubelet.sock")),
            kube,
            timeout: Duration::from_secs(5),
        }
    }

    /// Fills in the user, command and pod of every process (the backend gave device and pid).
    pub async fn identify(&self, processes: &mut [GpuProcess]) {
        if processes.is_empty() {
            return;
        }
        let kubernetes = self.kube.is_some() || self.pod_resources.as_ref().is_some_and(|s| s.exists());
        let root = self.proc_root.clone();
        let passwd = self.passwd.clone();
        let pids: Vec<u32> = processes.iter().map(|p| p.pid).collect();
        let read = move || {
            let users = std::fs::read_to_string(&passwd).map(|t| procfs::parse_passwd(&t)).unwrap_or_default();
            let infos: Vec<Option<ProcInfo>> = pids.iter().map(|&pid| procfs::read(&root, pid)).collect();
            (users, infos)
        };
        let Ok((users, infos)) = tokio::task::spawn_blocking(read).await else { return };
        let in_pods = infos.iter().any(|i| matches!(i, Some(ProcInfo { placement: Placement::Pod(_), .. })));
        let pods = match (&self.kube, in_pods) {
            (Some(kube), true) => match tokio::time::timeout(self.timeout, kube.pods_on_node()).await {
                Ok(Ok(pods)) => Some(pods),
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "cannot list this node's pods; pods are named by device assignment");
                    None
                }
                Err(_) => {
                    tracing::warn!("listing this node's pods took too long; pods are named by device assignment");
                    None
                }
            },
            _ => None,
        };
        let need_assignments = infos.iter().any(Option::is_none);
        let assignments = match (&self.pod_resources, need_assignments) {
            // Looked for at each call: the kubelet may start after the agent, or make a new socket when it restarts.
            (Some(socket), true) if socket.exists() => match podresources::list(socket, self.timeout).await {
                Ok(r) => Assignments::from_response(&r),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the kubelet's device assignments");
                    Assignments::default()
                }
            },
            _ => Assignments::default(),
        };
        let by_uid: Option<HashMap<&str, &NodePod>> =
            pods.as_ref().map(|pods| pods.iter().map(|p| (p.uid.as_str(), p)).collect());
        for (p, info) in processes.iter_mut().zip(infos) {
            resolve(p, info, &users, by_uid.as_ref(), &assignments, kubernetes);
        }
    }
}

/// Fills in `p` from what was read (see the module's order).
pub fn resolve(
    p: &mut GpuProcess,
    info: Option<ProcInfo>,
    users: &HashMap<u32, String>,
    pods: Option<&HashMap<&str, &NodePod>>,
    assignments: &Assignments,
    kubernetes: bool,
) {
    let Some(info) = info else {
        // Nothing read of the process: on a Kubernetes node, the one container the device was handed to, else a
        // pod nobody can name (never nobody's: that would let any process pass as the holder's).
        p.pod = match assignments.only_holder(&p.device) {
            Some(holder) => Some(bounded_pod(holder.clone())),
            None if kubernetes => Some(unknown("not readable")),
            None => None,
        };
        return;
    };
    p.command = info.command.as_deref().and_then(field);
    p.user = info.uid.and_then(|uid| field(&users.get(&uid).cloned().unwrap_or_else(|| uid.to_string())));
    p.pod = match info.placement {
        Placement::Host => None,
        // Named only through the API server's pods, which know the pod's UID: the kubelet's assignment says which
        // container was handed the device, not that this process is that container's (another tenant's pod may
        // reach the device), so it never names a process whose cgroup names a pod.
        Placement::Pod(cg) => Some(match pods.and_then(|pods| pods.get(cg.pod_uid.as_str())) {
            Some(pod) => bounded_pod(PodRef {
                namespace: pod.namespace.clone(),
                pod: pod.name.clone(),
                container: container_of(pod, cg.container_id.as_deref()),
            }),
            None => unknown(&cg.pod_uid),
        }),
    };
}

fn container_of(pod: &NodePod, id: Option<&str>) -> String {
    if let Some(name) = id.and_then(|id| pod.containers.iter().find(|(c, _)| c == id)).map(|(_, n)| n) {
        return name.clone();
    }
    match pod.names.as_slice() {
        [only] => only.clone(),
        _ => UNKNOWN.to_string(),
    }
}

fn unknown(uid: &str) -> PodRef {
    PodRef { namespace: UNKNOWN.to_string(), pod: format!("uid {uid}"), container: UNKNOWN.to_string() }
}

/// A pod's names as a status may carry them (an empty one is unknown).
fn bounded_pod(p: PodRef) -> PodRef {
    let f = |s: &str| field(s).unwrap_or_else(|| UNKNOWN.to_string());
    PodRef { namespace: f(&p.namespace), pod: f(&p.pod), container: f(&p.container) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use procfs::CgroupPod;

    fn process(device: &str) -> GpuProcess {
        GpuProcess { device: device.into(), pid: 7, user: None, command: None, pod: None }
    }

    fn pod() -> NodePod {
        NodePod {
            uid: "u-1".into(),
            namespace: "team-a".into(),
            name: "train-0".into(),
            containers: vec![("c1".into(), "main".into()), ("c2".into(), "sidecar".into())],
            names: vec!["main".into(), "sidecar".into()],
        }
    }

    fn in_pod(uid: &str, container: Option<&str>) -> ProcInfo {
        ProcInfo {
            command: Some("python".into()),
            uid: Some(1001),
            placement: Placement::Pod(CgroupPod { pod_uid: uid.into(), container_id: container.map(Into::into) }),
        }
    }

    fn assigned(device: &str, pod: &str) -> Assignments {
        Assignments {
            devices: vec![(
                device.into(),
                PodRef { namespace: "team-b".into(), pod: pod.into(), container: "c".into() },
            )],
        }
    }

    #[test]
    fn a_process_is_named_by_its_cgroup_and_the_nodes_pods() {
        let users = HashMap::from([(1001, "ann".to_string())]);
        let pods = [pod()];
        let by_uid: HashMap<&str, &NodePod> = pods.iter().map(|p| (p.uid.as_str(), p)).collect();
        let mut p = process("MIG-1");
        resolve(&mut p, Some(in_pod("u-1", Some("c2"))), &users, Some(&by_uid), &assigned("MIG-1", "other"), true);
        assert_eq!(p.user.as_deref(), Some("ann"));
        assert_eq!(p.command.as_deref(), Some("python"));
        let who = p.pod.expect("pod");
        // The cgroup wins over the kubelet's assignment: it says who runs, not who was handed the device.
        assert_eq!(
            (who.namespace.as_str(), who.pod.as_str(), who.container.as_str()),
            ("team-a", "train-0", "sidecar")
        );

        // A pod the API server does not list: unknown, which no tenant governs.
        let mut p = process("MIG-1");
        resolve(&mut p, Some(in_pod("u-9", None)), &users, Some(&by_uid), &Assignments::default(), true);
        assert_eq!(p.pod.as_ref().map(|x| x.namespace.as_str()), Some(UNKNOWN));
        // A container id the statuses do not have, in a pod of two containers: the container is unknown.
        let mut p = process("MIG-1");
        resolve(&mut p, Some(in_pod("u-1", Some("c9"))), &users, Some(&by_uid), &Assignments::default(), true);
        assert_eq!(p.pod.as_ref().map(|x| x.container.as_str()), Some(UNKNOWN));
        // A uid the passwd file does not name is reported as the number.
        let mut p = process("MIG-1");
        let host = ProcInfo { placement: Placement::Host, ..in_pod("x", None) };
        resolve(&mut p, Some(host), &HashMap::new(), None, &Assignments::default(), false);
        assert_eq!((p.user.as_deref(), p.pod.is_none()), (Some("1001"), true));
    }

    #[test]
    fn the_kubelets_assignment_names_only_a_process_nothing_was_read_of() {
        let users = HashMap::new();
        // In a pod's cgroup, without the node's pods: unknown, even where the kubelet handed the device to a
        // container (another tenant's pod may reach the device: the assignment would file it under the holder).
        let mut p = process("MIG-1");
        resolve(&mut p, Some(in_pod("u-1", None)), &users, None, &assigned("MIG-1", "b-0"), true);
        assert_eq!(p.pod.as_ref().map(|x| x.namespace.as_str()), Some(UNKNOWN));
        // Nothing read of it: the device's one holder.
        let mut p = process("MIG-1");
        resolve(&mut p, None, &users, None, &assigned("MIG-1", "b-0"), true);
        assert_eq!(p.pod.as_ref().map(|x| x.pod.as_str()), Some("b-0"));
        assert_eq!((p.user, p.command), (None, None), "nothing read from /proc");
        // Nothing read, no holder: on a Kubernetes node unknown rather than nobody's; on a bare node nobody's pod.
        let mut p = process("MIG-2");
        resolve(&mut p, None, &users, None, &assigned("MIG-1", "b-0"), true);
        assert_eq!(p.pod.as_ref().map(|x| x.namespace.as_str()), Some(UNKNOWN));
        let mut p = process("MIG-2");
        resolve(&mut p, None, &users, None, &Assignments::default(), false);
        assert_eq!(p.pod, None);
    }

    #[test]
    fn fields_a_status_would_refuse_are_dropped_not_sent() {
        // A process may name itself with control characters only (prctl PR_SET_NAME): no command rather than an
        // empty one, which the server would refuse with the whole status.
        let mut p = process("MIG-1");
        let info = ProcInfo { command: Some("\u{1}\u{2}".into()), uid: Some(5), placement: Placement::Host };
        resolve(&mut p, Some(info), &HashMap::from([(5, "x".repeat(400))]), None, &Assignments::default(), false);
        assert_eq!(p.command, None);
        assert_eq!(p.user.as_ref().map(|u| u.chars().count()), Some(tessera_core::attribution::MAX_PROCESS_FIELD_LEN));
        assert!(p.user.iter().chain(&p.command).all(|f| tessera_core::attribution::valid_field(f)));
    }
}
