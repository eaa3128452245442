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

use tessera_core::attribution::{GpuProcess, PodRef};

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
    /// The kubelet's pod-resources socket, where there is one.
    pub pod_resources: Option<PathBuf>,
    /// `--kube`: the client that lists the node's pods.
    pub kube: Option<crate::kube::KubeApplier>,
    /// How long each call to the kubelet or the API server may take.
    pub timeout: Duration,
}

impl Identifier {
    /// Reads from the host's usual places; the pod-resources socket where it exists.
    pub fn host(kube: Option<crate::kube::KubeApplier>) -> Identifier {
        let socket = PathBuf::from("/var/lib/kubelet/pod-resources/kubelet.sock");
        Identifier {
            proc_root: PathBuf::from("/proc"),
            passwd: PathBuf::from("/etc/passwd"),
            pod_resources: socket.exists().then_some(socket),
            kube,
            timeout: Duration::from_secs(5),
        }
    }

    /// Fills in the user, command and pod of every process (the backend gave device and pid).
    pub async fn identify(&self, processes: &mut [GpuProcess]) {
        if processes.is_empty() {
            return;
        }
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
        let need_assignments = infos.iter().any(|i| match i {
            None => true,
            Some(ProcInfo { placement: Placement::Pod(_), .. }) => pods.is_none(),
            Some(_) => false,
        });
        let assignments = match (&self.pod_resources, need_assignments) {
            (Some(socket), true) => match podresources::list(socket, self.timeout).await {
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
            resolve(p, info, &users, by_uid.as_ref(), &assignments);
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
) {
    let Some(info) = info else {
        p.pod = assignments.only_holder(&p.device).cloned();
        return;
    };
    p.command = info.command.map(|c| bounded(&c));
    p.user = info.uid.map(|uid| users.get(&uid).cloned().unwrap_or_else(|| uid.to_string()));
    p.pod = match info.placement {
        Placement::Host => None,
        Placement::Pod(cg) => match pods {
            Some(pods) => Some(match pods.get(cg.pod_uid.as_str()) {
                Some(pod) => PodRef {
                    namespace: pod.namespace.clone(),
                    pod: pod.name.clone(),
                    container: container_of(pod, cg.container_id.as_deref()),
                },
                None => unknown(&cg.pod_uid),
            }),
            None => Some(assignments.only_holder(&p.device).cloned().unwrap_or_else(|| unknown(&cg.pod_uid))),
        },
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

/// A field as the server takes it: printable, at most 256 characters.
fn bounded(s: &str) -> String {
    s.chars().filter(|c| !c.is_control()).take(256).collect()
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
        resolve(&mut p, Some(in_pod("u-1", Some("c2"))), &users, Some(&by_uid), &assigned("MIG-1", "other"));
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
        resolve(&mut p, Some(in_pod("u-9", None)), &users, Some(&by_uid), &Assignments::default());
        assert_eq!(p.pod.as_ref().map(|x| x.namespace.as_str()), Some(UNKNOWN));
        // A container id the statuses do not have, in a pod of two containers: the container is unknown.
        let mut p = process("MIG-1");
        resolve(&mut p, Some(in_pod("u-1", Some("c9"))), &users, Some(&by_uid), &Assignments::default());
        assert_eq!(p.pod.as_ref().map(|x| x.container.as_str()), Some(UNKNOWN));
        // A uid the passwd file does not name is reported as the number.
        let mut p = process("MIG-1");
        resolve(
            &mut p,
            Some(ProcInfo { placement: Placement::Host, ..in_pod("x", None) }),
            &HashMap::new(),
            None,
            &Assignments::default(),
        );
        assert_eq!((p.user.as_deref(), p.pod.is_none()), (Some("1001"), true));
    }

    #[test]
    fn without_the_pods_or_proc_the_kubelets_assignment_names_the_pod() {
        let users = HashMap::new();
        let mut p = process("MIG-1");
        resolve(&mut p, Some(in_pod("u-1", None)), &users, None, &assigned("MIG-1", "b-0"));
        assert_eq!(p.pod.as_ref().map(|x| x.pod.as_str()), Some("b-0"));
        let mut p = process("MIG-1");
        resolve(&mut p, None, &users, None, &assigned("MIG-1", "b-0"));
        assert_eq!(p.pod.as_ref().map(|x| x.pod.as_str()), Some("b-0"));
        assert_eq!((p.user, p.command), (None, None), "nothing read from /proc");
        // In a pod, nothing names it: unknown rather than nobody's.
        let mut p = process("MIG-2");
        resolve(&mut p, Some(in_pod("u-1", None)), &users, None, &assigned("MIG-1", "b-0"));
        assert_eq!(p.pod.as_ref().map(|x| x.namespace.as_str()), Some(UNKNOWN));
    }
}
