//! The ResourceQuota of a governed namespace: GPU devices only as Tessera granted them.
//!
//! A ResourceQuota limits only what it names, so every way to ask Kubernetes for an NVIDIA device is named: the DRA
//! device classes (`<class>.deviceclass.resource.k8s.io/devices`, which count the devices of every claim in the
//! namespace, Tessera's included) and the device plugin's extended resources (`requests.nvidia.com/gpu`,
//! `requests.nvidia.com/mig-<profile>` for every profile the catalog knows). Each is set to what the tenant holds
//! there through Tessera, so a claim or a pod asking for more is refused by the API server, and to 0 for what the
//! tenant may use only through its Tessera claims.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ResourceQuota, ResourceQuotaSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::claim::{GPU_CLASS, MIG_CLASS};
use crate::names;

/// How a cluster hands out NVIDIA devices (the rule is the core's: only a DRA claim pins a device).
pub use tessera_core::cluster::Mode;

/// What a tenant holds through Tessera in one namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    /// MIG instances by profile.
    pub mig: BTreeMap<String, u32>,
    /// Whole GPUs held alone.
    pub gpus: u32,
    /// Time-sliced and MPS shares of GPUs.
    pub shares: u32,
}

/// The quota key of a DRA device class.
pub fn class_key(class: &str) -> String {
    format!("{class}.deviceclass.resource.k8s.io/devices")
}

/// The quota key of the device plugin's resource for MIG `profile` (mixed strategy).
pub fn mig_key(profile: &str) -> String {
    format!("requests.nvidia.com/mig-{profile}")
}

/// The quota key of the device plugin's whole-GPU resource.
pub const GPU_KEY: &str = "requests.nvidia.com/gpu";

/// The quota Tessera keeps in `namespace` for `tenant`, which holds `held` there, on a cluster in `mode`; every
/// profile of `profiles` (the catalog's) is named.
pub fn resource_quota(namespace: &str, tenant: &str, mode: Mode, held: &Held, profiles: &[&str]) -> ResourceQuota {
    let mig_total: u32 = held.mig.values().sum();
    let mut hard: BTreeMap<String, u32> = BTreeMap::new();
    match mode {
        Mode::Dra => {
            hard.insert(class_key(MIG_CLASS), mig_total);
            hard.insert(class_key(GPU_CLASS), held.gpus);
            hard.insert(GPU_KEY.to_string(), held.shares);
            for p in profiles {
                hard.insert(mig_key(p), 0);
            }
        }
        Mode::DevicePlugin => {
            hard.insert(class_key(MIG_CLASS), 0);
            hard.insert(class_key(GPU_CLASS), 0);
            hard.insert(GPU_KEY.to_string(), held.gpus.saturating_add(held.shares));
            for p in profiles {
                hard.insert(mig_key(p), held.mig.get(*p).copied().unwrap_or(0));
            }
        }
    }
    ResourceQuota {
        metadata: ObjectMeta {
            name: Some(names::QUOTA_NAME.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(names::labels(tenant)),
            ..ObjectMeta::default()
        },
        spec: Some(ResourceQuotaSpec {
            hard: Some(hard.into_iter().map(|(k, n)| (k, Quantity(n.to_string()))).collect()),
            ..ResourceQuotaSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hard(q: &ResourceQuota) -> BTreeMap<String, String> {
        q.spec.as_ref().and_then(|s| s.hard.clone()).unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)).collect()
    }

    #[test]
    fn devices_only_as_granted_on_either_kind_of_cluster() {
        let held = Held { mig: BTreeMap::from([("1g.10gb".to_string(), 2)]), gpus: 1, shares: 3 };
        let profiles = ["1g.10gb", "3g.40gb"];
        let dra = hard(&resource_quota("vision-ml", "vision", Mode::Dra, &held, &profiles));
        assert_eq!(dra["mig.nvidia.com.deviceclass.resource.k8s.io/devices"], "2");
        assert_eq!(dra["gpu.nvidia.com.deviceclass.resource.k8s.io/devices"], "1");
        assert_eq!(dra["requests.nvidia.com/gpu"], "3", "shares through the device plugin");
        assert_eq!(dra["requests.nvidia.com/mig-1g.10gb"], "0", "MIG only through the claims");
        assert_eq!(dra["requests.nvidia.com/mig-3g.40gb"], "0");
        let plugin = hard(&resource_quota("vision-ml", "vision", Mode::DevicePlugin, &held, &profiles));
        assert_eq!(plugin["requests.nvidia.com/mig-1g.10gb"], "2");
        assert_eq!(plugin["requests.nvidia.com/mig-3g.40gb"], "0", "a profile not held is refused");
        assert_eq!(plugin["requests.nvidia.com/gpu"], "4");
        assert_eq!(plugin["mig.nvidia.com.deviceclass.resource.k8s.io/devices"], "0");
    }
}
