//! The kubelet's pod-resources API (v1 `List`, on the unix socket `/var/lib/kubelet/pod-resources/kubelet.sock`):
//! which container the kubelet handed each device, as dcgm-exporter reads it. The messages carry the field numbers
//! of `node-agent/proto/podresources-v1.proto` (the upstream file), checked against a server generated from it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tessera_core::attribution::PodRef;

/// `ListPodResourcesRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodResourcesRequest {}

/// `ListPodResourcesResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodResourcesResponse {
    /// Every pod with resources.
    #[prost(message, repeated, tag = "1")]
    pub pod_resources: Vec<PodResources>,
}

/// `PodResources`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodResources {
    /// Pod name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Namespace.
    #[prost(string, tag = "2")]
    pub namespace: String,
    /// Its containers.
    #[prost(message, repeated, tag = "3")]
    pub containers: Vec<ContainerResources>,
}

/// `ContainerResources` (CPU and memory fields are not read).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerResources {
    /// Container name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Devices from device plugins.
    #[prost(message, repeated, tag = "2")]
    pub devices: Vec<ContainerDevices>,
    /// Devices from Dynamic Resource Allocation claims.
    #[prost(message, repeated, tag = "5")]
    pub dynamic_resources: Vec<DynamicResource>,
}

/// `ContainerDevices`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerDevices {
    /// E.g. `nvidia.com/gpu`, `nvidia.com/mig-3g.40gb`.
    #[prost(string, tag = "1")]
    pub resource_name: String,
    /// The plugin's device ids: NVIDIA's are GPU or MIG UUIDs, with `::<n>` for a time-sliced replica.
    #[prost(string, repeated, tag = "2")]
    pub device_ids: Vec<String>,
}

/// `DynamicResource`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DynamicResource {
    /// The device class.
    #[prost(string, tag = "1")]
    pub class_name: String,
    /// The claim's name.
    #[prost(string, tag = "2")]
    pub claim_name: String,
    /// The claim's namespace.
    #[prost(string, tag = "3")]
    pub claim_namespace: String,
}

/// Which containers the kubelet handed each device (device id without a replica suffix).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Assignments {
    /// `(device id, container)`, sorted.
    pub devices: Vec<(String, PodRef)>,
}

impl Assignments {
    /// From a `List` answer.
    pub fn from_response(r: &ListPodResourcesResponse) -> Assignments {
        let mut devices = Vec::new();
        for pod in &r.pod_resources {
            for c in &pod.containers {
                for d in &c.devices {
                    for id in &d.device_ids {
                        let id = id.split("::").next().unwrap_or(id);
                        let who = PodRef {
                            namespace: pod.namespace.clone(),
                            pod: pod.name.clone(),
                            container: c.name.clone(),
                        };
                        devices.push((id.to_string(), who));
                    }
                }
            }
        }
        devices.sort();
        devices.dedup();
        Assignments { devices }
    }

    /// The one container the kubelet handed `device` to; `None` when none was, or several were (a time-sliced
    /// GPU): the assignment cannot say which of them runs a process.
    pub fn only_holder(&self, device: &str) -> Option<&PodRef> {
        let mut of = self.devices.iter().filter(|(d, _)| d == device).map(|(_, p)| p);
        let first = of.next()?;
        of.all(|p| p == first).then_some(first)
    }
}

/// A `List` call failed.
#[derive(Debug, thiserror::Error)]
#[error("pod-resources {socket}: {message}")]
pub struct PodResourcesError {
    /// The socket.
    pub socket: String,
    /// What went wrong.
    pub message: String,
}

/// Calls `List` on the kubelet's socket, within `timeout`.
pub async fn list(socket: &Path, timeout: Duration) -> Result<ListPodResourcesResponse, PodResourcesError> {
    let error = |message: String| PodResourcesError { socket: socket.display().to_string(), message };
    let path: PathBuf = socket.to_path_buf();
    let call = async {
        // The URI is not used: every connection goes to the socket.
        let channel = tonic::transport::Endpoint::from_static("http://kubelet.sock")
            .connect_timeout(timeout)
            .timeout(timeout)
            .connect_with_connector(tower::service_fn(move |_: http::Uri| {
                let path = path.clone();
                async move {
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tokio::net::UnixStream::connect(path).await?))
                }
            }))
            .await
            .map_err(|e| error(format!("connect: {e}")))?;
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.map_err(|e| error(format!("connect: {e}")))?;
        let path = http::uri::PathAndQuery::from_static("/v1.PodResourcesLister/List");
        let codec = tonic_prost::ProstCodec::<ListPodResourcesRequest, ListPodResourcesResponse>::default();
        grpc.unary(tonic::Request::new(ListPodResourcesRequest {}), path, codec)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| error(format!("List: {} {}", s.code(), s.message())))
    };
    tokio::time::timeout(timeout, call).await.map_err(|_| error(format!("no answer in {timeout:?}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(ns: &str, pod: &str, name: &str, ids: &[&str]) -> PodResources {
        PodResources {
            name: pod.into(),
            namespace: ns.into(),
            containers: vec![ContainerResources {
                name: name.into(),
                devices: vec![ContainerDevices {
                    resource_name: "nvidia.com/gpu".into(),
                    device_ids: ids.iter().map(|s| s.to_string()).collect(),
                }],
                dynamic_resources: vec![],
            }],
        }
    }

    #[test]
    fn a_device_handed_to_one_container_names_it_and_a_time_sliced_one_names_none() {
        let r = ListPodResourcesResponse {
            pod_resources: vec![
                container("team-a", "train", "main", &["MIG-1"]),
                container("team-a", "a", "c", &["GPU-2::0"]),
                container("team-b", "b", "c", &["GPU-2::1"]),
                container("team-c", "c", "c", &["GPU-3::0", "GPU-3::1"]),
            ],
        };
        let a = Assignments::from_response(&r);
        assert_eq!(a.only_holder("MIG-1").map(|p| p.pod.as_str()), Some("train"));
        assert_eq!(a.only_holder("GPU-2"), None, "two pods share the GPU");
        assert_eq!(a.only_holder("GPU-3").map(|p| p.namespace.as_str()), Some("team-c"), "two replicas, one pod");
        assert_eq!(a.only_holder("GPU-9"), None);
    }
}
