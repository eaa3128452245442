//! A ResourceClaim per allocation, pinned to exactly its device, and the pod spec that uses it.
//!
//! NVIDIA's DRA driver (`gpu.nvidia.com`) publishes whole GPUs in device class `gpu.nvidia.com` and MIG devices in
//! `mig.nvidia.com`, each with the attribute `gpu.nvidia.com/uuid` (`GPU-...` or `MIG-...`). A claim whose one
//! request selects `device.attributes["gpu.nvidia.com"].uuid == "<uuid>"` in the right class can be allocated only
//! that device: a pod referencing it gets the slice Tessera allocated, and no pod of another namespace can
//! reference it (claims are namespaced).
//!
//! A time-sliced or MPS share of a GPU that other tenants share too cannot be pinned that way: the driver
//! allocates a device to one claim at a time (its sharing settings share a device between the pods of one claim),
//! so a claim of one tenant would keep the GPU from the others. Such a share has no claim ([`Claim::Unpinned`]
//! says why); it is used through the device plugin's shared resource, which picks the GPU itself.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, Pod, PodResourceClaim, PodSpec, ResourceClaim as ContainerClaim, ResourceRequirements,
};
use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, DeviceClaim, DeviceRequest, DeviceSelector, ExactDeviceRequest, ResourceClaim, ResourceClaimSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::names;

/// The DRA driver's name, also the domain of its device attributes.
pub const DRIVER: &str = "gpu.nvidia.com";

/// The device class of whole GPUs.
pub const GPU_CLASS: &str = "gpu.nvidia.com";

/// The device class of MIG devices.
pub const MIG_CLASS: &str = "mig.nvidia.com";

/// The name of the claim's one device request, and of the claim in a pod that uses it.
pub const REQUEST: &str = "gpu";

/// How a whole GPU is shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShareMode {
    /// Time-slicing.
    Timeslice,
    /// CUDA MPS.
    Mps,
}

/// The device an allocation holds, once active.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device<'a> {
    /// A MIG instance: its `MIG-...` UUID and its profile.
    Mig {
        /// The MIG device's UUID.
        uuid: &'a str,
        /// Its profile (`1g.10gb`, ...).
        profile: &'a str,
    },
    /// A whole GPU held alone: its `GPU-...` UUID.
    Gpu {
        /// The GPU's UUID.
        uuid: &'a str,
    },
    /// A share of a whole GPU that other allocations may share too.
    Share {
        /// The GPU's UUID.
        gpu_uuid: &'a str,
        /// How it is shared.
        mode: ShareMode,
        /// Into how many shares.
        replicas: u32,
    },
}

/// An allocation as a claim sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slice<'a> {
    /// The allocation's id.
    pub allocation: &'a str,
    /// The request it serves.
    pub request: &'a str,
    /// Its tenant's name.
    pub tenant: &'a str,
    /// The namespace its claim goes to.
    pub namespace: &'a str,
    /// Its device.
    pub device: Device<'a>,
}

/// The claim an allocation gets.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// A claim that can be allocated only the allocation's device.
    Pinned(Box<ResourceClaim>),
    /// No claim can pin this device; why, in a sentence.
    Unpinned {
        /// Why.
        why: String,
    },
}

/// Whether `uuid` is a device UUID as NVML writes them (`GPU-` or `MIG-` then hex digits and `-`), so that it can
/// stand inside a CEL string literal as it is.
pub fn is_device_uuid(uuid: &str) -> bool {
    let rest = uuid.strip_prefix("GPU-").or_else(|| uuid.strip_prefix("MIG-"));
    rest.is_some_and(|r| !r.is_empty() && r.len() <= 64 && r.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
}

/// The CEL expression that selects the device with `uuid` and no other.
pub fn selector(uuid: &str) -> String {
    format!("device.attributes[\"{DRIVER}\"].uuid == \"{uuid}\"")
}

/// The claim for `slice`: pinned to its device by UUID in the device class of its kind, or why it cannot be.
pub fn claim(slice: &Slice<'_>) -> Claim {
    let (uuid, class) = match slice.device {
        Device::Mig { uuid, .. } => (uuid, MIG_CLASS),
        Device::Gpu { uuid } => (uuid, GPU_CLASS),
        Device::Share { mode, replicas, .. } => {
            let how = match mode {
                ShareMode::Timeslice => "time-sliced",
                ShareMode::Mps => "MPS",
            };
            return Claim::Unpinned {
                why: format!(
                    "a {how} share (1 of {replicas}) of a GPU other allocations share too: the DRA driver gives a \
                     device to one claim at a time, so a claim cannot pin a share; use the device plugin's shared \
                     resource nvidia.com/gpu, which picks the GPU itself"
                ),
            };
        }
    };
    if !is_device_uuid(uuid) {
        return Claim::Unpinned { why: format!("the device's UUID `{uuid}` is not one NVML writes") };
    }
    let mut labels = names::labels(slice.tenant);
    labels.insert(names::ALLOCATION.to_string(), names::label_value(slice.allocation));
    let annotations = BTreeMap::from([(names::REQUEST.to_string(), slice.request.to_string())]);
    Claim::Pinned(Box::new(ResourceClaim {
        metadata: ObjectMeta {
            name: Some(names::claim_name(slice.allocation)),
            namespace: Some(slice.namespace.to_string()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(vec![DeviceRequest {
                    name: REQUEST.to_string(),
                    exactly: Some(ExactDeviceRequest {
                        device_class_name: class.to_string(),
                        allocation_mode: Some("ExactCount".to_string()),
                        count: Some(1),
                        selectors: Some(vec![DeviceSelector {
                            cel: Some(CELDeviceSelector { expression: selector(uuid) }),
                        }]),
                        ..ExactDeviceRequest::default()
                    }),
                    ..DeviceRequest::default()
                }]),
                ..DeviceClaim::default()
            }),
        },
        status: None,
    }))
}

/// A pod that runs `image` on the device of the claim named `claim_name` (in the claim's namespace).
pub fn pod(name: &str, namespace: &str, claim_name: &str, image: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            resource_claims: Some(vec![PodResourceClaim {
                name: REQUEST.to_string(),
                resource_claim_name: Some(claim_name.to_string()),
                ..PodResourceClaim::default()
            }]),
            containers: vec![Container {
                name: "main".to_string(),
                image: Some(image.to_string()),
                command: Some(vec!["nvidia-smi".to_string(), "-L".to_string()]),
                resources: Some(ResourceRequirements {
                    claims: Some(vec![ContainerClaim { name: REQUEST.to_string(), request: None }]),
                    ..ResourceRequirements::default()
                }),
                ..Container::default()
            }],
            restart_policy: Some("Never".to_string()),
            ..PodSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(device: Device<'_>) -> Slice<'_> {
        Slice { allocation: "0193a2b4", request: "r-1", tenant: "vision", namespace: "vision-ml", device }
    }

    #[test]
    fn a_mig_instance_and_a_whole_gpu_are_pinned_by_uuid_in_their_class() {
        let mig = Device::Mig { uuid: "MIG-1c2d3e4f-0000-5555-aaaa-000000000001", profile: "1g.10gb" };
        let Claim::Pinned(c) = claim(&slice(mig)) else { panic!("pinned") };
        let v = serde_json::to_value(&*c).expect("json");
        assert_eq!((v["apiVersion"].as_str(), v["kind"].as_str()), (Some("resource.k8s.io/v1"), Some("ResourceClaim")));
        assert_eq!(v["metadata"]["name"], "tessera-0193a2b4");
        assert_eq!(v["metadata"]["namespace"], "vision-ml");
        assert_eq!(v["metadata"]["labels"]["tessera.io/allocation"], "0193a2b4");
        let request = &v["spec"]["devices"]["requests"][0];
        assert_eq!(request["exactly"]["deviceClassName"], MIG_CLASS);
        assert_eq!(
            request["exactly"]["selectors"][0]["cel"]["expression"],
            "device.attributes[\"gpu.nvidia.com\"].uuid == \"MIG-1c2d3e4f-0000-5555-aaaa-000000000001\""
        );
        let Claim::Pinned(c) = claim(&slice(Device::Gpu { uuid: "GPU-00000000-0000-0000-0000-000000000001" })) else {
            panic!("pinned")
        };
        let class =
            c.spec.devices.and_then(|d| d.requests).and_then(|r| r[0].exactly.clone()).map(|e| e.device_class_name);
        assert_eq!(class.as_deref(), Some(GPU_CLASS));
    }

    #[test]
    fn a_share_or_a_strange_uuid_is_not_pinned_and_says_why() {
        let share = Device::Share { gpu_uuid: "GPU-1", mode: ShareMode::Timeslice, replicas: 4 };
        let Claim::Unpinned { why } = claim(&slice(share)) else { panic!("unpinned") };
        assert!(why.contains("time-sliced share (1 of 4)"), "{why}");
        // Nothing that is not a UUID reaches a CEL expression.
        for bad in ["MIG-1\" || true || \"", "GPU-", "gpu-1", "MIG-a b"] {
            assert!(matches!(claim(&slice(Device::Gpu { uuid: bad })), Claim::Unpinned { .. }), "{bad}");
        }
    }

    #[test]
    fn the_pod_uses_the_claim_by_name() {
        let v =
            serde_json::to_value(pod("try-it", "vision-ml", "tessera-0193a2b4", "nvidia/cuda:12.4.1-base-ubuntu22.04"))
                .expect("json");
        assert_eq!(
            v["spec"]["resourceClaims"][0],
            serde_json::json!({"name": "gpu", "resourceClaimName": "tessera-0193a2b4"})
        );
        assert_eq!(v["spec"]["containers"][0]["resources"]["claims"][0]["name"], "gpu");
    }
}
