//! What one cluster's governed namespaces should hold, and what to change to get there.
//!
//! [`desired`] turns Tessera's records for one cluster (its governed namespaces and the active allocations on its
//! nodes) into the objects each namespace should hold: its labels, its ResourceQuota, and on a DRA cluster a
//! ResourceClaim per allocation of its tenant. A tenant with several namespaces in a cluster gets each claim in
//! each of them (a pod can reference only a claim of its own namespace); the driver allocates a device to one claim
//! at a time, so only one of them can be in use, and each namespace's quota counts them all.
//!
//! [`plan`] compares that with what the cluster holds (the objects carrying Tessera's `managed-by` label, as read
//! back) and says what to apply and what to delete: an object missing or changed by hand is applied again (drift
//! repaired), a claim of Tessera's that no allocation needs any more is deleted after the pods using it are asked
//! to leave through the Eviction API with the grace period, and a namespace given up loses all of Tessera's objects
//! and labels (before it can be given to another tenant).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::claim::{self, Claim, Device, ShareMode, Slice};
use crate::names;
use crate::quota::{self, Held, Mode};

/// A namespace of the cluster that belongs to a tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Governed<'a> {
    /// The namespace.
    pub namespace: &'a str,
    /// The tenant's id.
    pub tenant_id: &'a str,
    /// The tenant's name.
    pub tenant: &'a str,
}

/// An active allocation on one of the cluster's nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Active<'a> {
    /// The allocation's id.
    pub allocation: &'a str,
    /// The request it serves.
    pub request: &'a str,
    /// The tenant's id.
    pub tenant_id: &'a str,
    /// MIG profile, or how a whole GPU is held: `exclusive`, `timeslice:<n>`, `mps:<n>`.
    pub profile: &'a str,
    /// The device serving it: the MIG device's UUID, or the GPU's.
    pub device_uuid: &'a str,
}

impl<'a> Active<'a> {
    /// Its device as a claim sees it; `None` for a profile that is none of the above.
    pub fn device(&self) -> Option<Device<'a>> {
        let share =
            |mode, n: &str| n.parse().ok().map(|replicas| Device::Share { gpu_uuid: self.device_uuid, mode, replicas });
        match self.profile.split_once(':') {
            Some(("timeslice", n)) => share(ShareMode::Timeslice, n),
            Some(("mps", n)) => share(ShareMode::Mps, n),
            Some(_) => None,
            None if self.profile == "exclusive" => Some(Device::Gpu { uuid: self.device_uuid }),
            None => Some(Device::Mig { uuid: self.device_uuid, profile: self.profile }),
        }
    }
}

/// What one governed namespace should hold.
#[derive(Debug, Clone, PartialEq)]
pub struct NamespaceObjects {
    /// The namespace.
    pub namespace: String,
    /// Its labels and annotation.
    pub labels: Namespace,
    /// Its ResourceQuota.
    pub quota: ResourceQuota,
    /// A claim per allocation of its tenant, by name.
    pub claims: BTreeMap<String, ResourceClaim>,
    /// Allocations of its tenant that get no claim, with why.
    pub unpinned: BTreeMap<String, String>,
}

/// The objects every governed namespace of a cluster in `mode` should hold, by namespace, given the active
/// allocations on the cluster's nodes; `profiles` are the catalog's MIG profiles (each is named in the quota).
pub fn desired(
    cluster: &str,
    mode: Mode,
    governed: &[Governed<'_>],
    active: &[Active<'_>],
    profiles: &[&str],
) -> Vec<NamespaceObjects> {
    let mut by_namespace: BTreeMap<&str, NamespaceObjects> = BTreeMap::new();
    for g in governed {
        let mine: Vec<&Active<'_>> = active.iter().filter(|a| a.tenant_id == g.tenant_id).collect();
        let mut held = Held::default();
        let mut claims = BTreeMap::new();
        let mut unpinned = BTreeMap::new();
        for a in mine {
            let Some(device) = a.device() else {
                unpinned
                    .insert(a.allocation.to_string(), format!("its profile `{}` is not one Tessera knows", a.profile));
                continue;
            };
            match device {
                Device::Mig { profile, .. } => *held.mig.entry(profile.to_string()).or_default() += 1,
                Device::Gpu { .. } => held.gpus += 1,
                Device::Share { .. } => held.shares += 1,
            }
            if mode == Mode::DevicePlugin {
                unpinned.insert(
                    a.allocation.to_string(),
                    "the cluster hands out devices through NVIDIA's device plugin, which cannot pin one".to_string(),
                );
                continue;
            }
            let slice = Slice {
                allocation: a.allocation,
                request: a.request,
                tenant: g.tenant,
                namespace: g.namespace,
                device,
            };
            match claim::claim(&slice) {
                Claim::Pinned(c) => {
                    claims.insert(names::claim_name(a.allocation), *c);
                }
                Claim::Unpinned { why } => {
                    unpinned.insert(a.allocation.to_string(), why);
                }
            }
        }
        let mut labels = names::namespace_patch(g.namespace, g.tenant);
        let mut quota = quota::resource_quota(g.namespace, g.tenant, mode, &held, profiles);
        for meta in
            [&mut labels.metadata, &mut quota.metadata].into_iter().chain(claims.values_mut().map(|c| &mut c.metadata))
        {
            meta.labels
                .get_or_insert_with(Default::default)
                .insert(names::CLUSTER.to_string(), names::label_value(cluster));
        }
        by_namespace.insert(
            g.namespace,
            NamespaceObjects { namespace: g.namespace.to_string(), labels, quota, claims, unpinned },
        );
    }
    by_namespace.into_values().collect()
}

/// The label selector of what Tessera wrote in a cluster it registered as `cluster` (an id): another registration
/// of the same cluster, or another installation, has objects of its own that this one never touches.
pub fn selector(cluster: &str) -> String {
    format!("{}=tessera,{}={}", names::MANAGED_BY, names::CLUSTER, names::label_value(cluster))
}

/// A claim of Tessera's as the cluster holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct ObservedClaim {
    /// The claim.
    pub claim: ResourceClaim,
}

impl ObservedClaim {
    fn namespace(&self) -> &str {
        self.claim.metadata.namespace.as_deref().unwrap_or("")
    }

    fn name(&self) -> &str {
        self.claim.metadata.name.as_deref().unwrap_or("")
    }

    /// The pods the claim is reserved for (its consumers), by name.
    pub fn pods(&self) -> Vec<String> {
        let reserved = self.claim.status.as_ref().and_then(|s| s.reserved_for.as_ref());
        reserved.into_iter().flatten().filter(|r| r.resource == "pods").map(|r| r.name.clone()).collect()
    }

    /// Whether the driver allocated it a device.
    pub fn allocated(&self) -> bool {
        self.claim.status.as_ref().is_some_and(|s| s.allocation.is_some())
    }
}

/// What a cluster holds of Tessera's (objects labelled `app.kubernetes.io/managed-by: tessera`) in its governed
/// namespaces, as read back.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {
    /// Namespaces, by name, with their labels and annotations.
    pub namespaces: BTreeMap<String, Namespace>,
    /// Tessera's quotas, by namespace.
    pub quotas: BTreeMap<String, ResourceQuota>,
    /// Tessera's claims.
    pub claims: Vec<ObservedClaim>,
}

/// One change to make.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Apply the namespace's labels and annotation (server-side apply: only Tessera's fields).
    LabelNamespace(Namespace),
    /// Apply the namespace's ResourceQuota.
    ApplyQuota(ResourceQuota),
    /// Apply a claim (missing, or its spec changed by hand).
    ApplyClaim(Box<ResourceClaim>),
    /// Delete the ResourceQuota of a namespace Tessera no longer governs.
    DeleteQuota {
        /// The namespace.
        namespace: String,
    },
    /// Take Tessera's labels and annotation off a namespace it no longer governs (applying none of them: server-side
    /// apply removes the fields its manager owned).
    UnlabelNamespace(String),
    /// Ask each pod using the claim to leave through the Eviction API with this grace, then delete the claim.
    DeleteClaim {
        /// The namespace.
        namespace: String,
        /// The claim.
        name: String,
        /// Pods reserved for it, to evict first.
        evict: Vec<String>,
    },
}

/// What to change so that `observed` holds what `desired` says; nothing for what already matches. A namespace's
/// quota comes before its claims, so that it is raised before a new claim needs it (lowering it below what exists
/// refuses only new claims); a claim whose spec differs is deleted and made again (a claim's spec cannot change);
/// the claims, quotas and labels no governed namespace needs go last.
pub fn plan(desired: &[NamespaceObjects], observed: &Observed) -> Vec<Action> {
    let mut applies = Vec::new();
    let mut wanted: BTreeSet<(&str, &str)> = BTreeSet::new();
    for d in desired {
        let ns = d.namespace.as_str();
        let labelled = observed.namespaces.get(ns).is_some_and(|n| carries(n, &d.labels));
        if !labelled {
            applies.push(Action::LabelNamespace(d.labels.clone()));
        }
        let quota_ok = observed.quotas.get(ns).is_some_and(|q| q.spec == d.quota.spec);
        if !quota_ok {
            applies.push(Action::ApplyQuota(d.quota.clone()));
        }
        for (name, c) in &d.claims {
            wanted.insert((ns, name.as_str()));
            let found = observed.claims.iter().find(|o| o.namespace() == ns && o.name() == name);
            match found {
                // A claim's spec cannot change once it exists: one that selects anything else (edited by
                // recreating it, say) is deleted, its pods evicted, and made again.
                Some(o) if o.claim.spec != c.spec => {
                    applies.push(Action::DeleteClaim {
                        namespace: ns.to_string(),
                        name: name.clone(),
                        evict: o.pods(),
                    });
                    applies.push(Action::ApplyClaim(Box::new(c.clone())));
                }
                Some(o) if carries_labels(&o.claim.metadata.labels, &c.metadata.labels) => {}
                _ => applies.push(Action::ApplyClaim(Box::new(c.clone()))),
            }
        }
    }
    // Every claim of Tessera's for this cluster (the observed ones carry its labels) that no allocation needs goes: in
    // a governed namespace when its allocation ended, in a namespace given up (which may be given to another tenant
    // next) with all of Tessera's objects there.
    let deletions = observed.claims.iter().filter(|o| !wanted.contains(&(o.namespace(), o.name())));
    applies.extend(deletions.map(|o| Action::DeleteClaim {
        namespace: o.namespace().to_string(),
        name: o.name().to_string(),
        evict: o.pods(),
    }));
    let governed: BTreeSet<&str> = desired.iter().map(|d| d.namespace.as_str()).collect();
    applies.extend(
        observed
            .quotas
            .keys()
            .filter(|ns| !governed.contains(ns.as_str()))
            .map(|ns| Action::DeleteQuota { namespace: ns.clone() }),
    );
    let managed = |n: &Namespace| {
        n.metadata.labels.as_ref().is_some_and(|l| l.get(names::MANAGED_BY).is_some_and(|v| v == "tessera"))
    };
    applies.extend(
        observed
            .namespaces
            .iter()
            .filter(|(ns, n)| !governed.contains(ns.as_str()) && managed(n))
            .map(|(ns, _)| Action::UnlabelNamespace(ns.clone())),
    );
    applies
}

/// Whether `observed` carries every label and annotation of `wanted` with the same value.
fn carries(observed: &Namespace, wanted: &Namespace) -> bool {
    carries_labels(&observed.metadata.labels, &wanted.metadata.labels)
        && carries_labels(&observed.metadata.annotations, &wanted.metadata.annotations)
}

fn carries_labels(observed: &Option<BTreeMap<String, String>>, wanted: &Option<BTreeMap<String, String>>) -> bool {
    let empty = BTreeMap::new();
    let have = observed.as_ref().unwrap_or(&empty);
    wanted.as_ref().unwrap_or(&empty).iter().all(|(k, v)| have.get(k) == Some(v))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::resource::v1::{ResourceClaimConsumerReference, ResourceClaimStatus};

    use super::*;

    const PROFILES: [&str; 2] = ["1g.10gb", "3g.40gb"];

    fn governed() -> Vec<Governed<'static>> {
        vec![
            Governed { namespace: "ml-a", tenant_id: "ta", tenant: "team-a" },
            Governed { namespace: "ml-b", tenant_id: "tb", tenant: "team-b" },
        ]
    }

    fn active() -> Vec<Active<'static>> {
        let a = |allocation, tenant_id, profile, device_uuid| Active {
            allocation,
            request: "r",
            tenant_id,
            profile,
            device_uuid,
        };
        vec![
            a("a1", "ta", "1g.10gb", "MIG-aaaa-1111"),
            a("a2", "ta", "exclusive", "GPU-bbbb-2222"),
            a("b1", "tb", "timeslice:4", "GPU-cccc-3333"),
            a("b2", "tb", "fractal:2", "GPU-cccc-3333"),
        ]
    }

    fn hard(q: &ResourceQuota, key: &str) -> String {
        q.spec.as_ref().and_then(|s| s.hard.as_ref()).and_then(|h| h.get(key)).map(|v| v.0.clone()).unwrap_or_default()
    }

    fn expression(c: &ResourceClaim) -> String {
        let requests = c.spec.devices.as_ref().and_then(|d| d.requests.as_ref()).expect("requests");
        let exactly = requests[0].exactly.as_ref().expect("exactly");
        let selectors = exactly.selectors.as_ref().expect("selectors");
        format!("{} {}", exactly.device_class_name, selectors[0].cel.as_ref().expect("cel").expression)
    }

    #[test]
    fn each_namespace_gets_its_tenants_claims_and_a_quota_of_what_it_holds() {
        let d = desired("c1", Mode::Dra, &governed(), &active(), &PROFILES);
        assert_eq!(d.len(), 2);
        let (a, b) = (&d[0], &d[1]);
        assert_eq!(a.namespace, "ml-a");
        assert_eq!(a.claims.keys().collect::<Vec<_>>(), ["tessera-a1", "tessera-a2"]);
        assert!(
            expression(&a.claims["tessera-a1"]).starts_with("mig.nvidia.com "),
            "{}",
            expression(&a.claims["tessera-a1"])
        );
        assert!(expression(&a.claims["tessera-a1"]).contains("\"MIG-aaaa-1111\""));
        assert!(expression(&a.claims["tessera-a2"]).starts_with("gpu.nvidia.com "));
        assert!(expression(&a.claims["tessera-a2"]).contains("\"GPU-bbbb-2222\""));
        assert!(a.claims.values().all(|c| c.metadata.namespace.as_deref() == Some("ml-a")));
        assert_eq!(hard(&a.quota, "mig.nvidia.com.deviceclass.resource.k8s.io/devices"), "1");
        assert_eq!(hard(&a.quota, "gpu.nvidia.com.deviceclass.resource.k8s.io/devices"), "1");
        assert_eq!(hard(&a.quota, "requests.nvidia.com/mig-1g.10gb"), "0", "MIG only through Tessera's claims");
        assert!(b.claims.is_empty(), "a share is not pinned, and team-a's claims are never in team-b's namespace");
        assert!(b.unpinned["b1"].contains("time-sliced share"), "{:?}", b.unpinned);
        assert!(b.unpinned["b2"].contains("fractal:2"), "{:?}", b.unpinned);
        assert_eq!(hard(&b.quota, "requests.nvidia.com/gpu"), "1", "its share through the device plugin");
        assert_eq!(hard(&b.quota, "mig.nvidia.com.deviceclass.resource.k8s.io/devices"), "0");
    }

    #[test]
    fn on_the_device_plugin_nothing_is_claimed_and_the_quota_counts_each_kind() {
        let d = desired("c1", Mode::DevicePlugin, &governed(), &active(), &PROFILES);
        assert!(d.iter().all(|n| n.claims.is_empty()));
        assert!(d[0].unpinned["a1"].contains("device plugin"));
        assert_eq!(hard(&d[0].quota, "requests.nvidia.com/mig-1g.10gb"), "1");
        assert_eq!(hard(&d[0].quota, "requests.nvidia.com/gpu"), "1");
        assert_eq!(hard(&d[0].quota, "mig.nvidia.com.deviceclass.resource.k8s.io/devices"), "0");
    }

    #[test]
    fn a_tenant_with_two_namespaces_gets_each_claim_in_both() {
        let mut g = governed();
        g.push(Governed { namespace: "ml-a2", tenant_id: "ta", tenant: "team-a" });
        let d = desired("c1", Mode::Dra, &g, &active(), &PROFILES);
        let second = d.iter().find(|n| n.namespace == "ml-a2").expect("ml-a2");
        assert_eq!(second.claims.keys().collect::<Vec<_>>(), ["tessera-a1", "tessera-a2"]);
        assert!(second.claims.values().all(|c| c.metadata.namespace.as_deref() == Some("ml-a2")));
    }

    fn observed_as(d: &[NamespaceObjects]) -> Observed {
        Observed {
            namespaces: d.iter().map(|n| (n.namespace.clone(), n.labels.clone())).collect(),
            quotas: d.iter().map(|n| (n.namespace.clone(), n.quota.clone())).collect(),
            claims: d.iter().flat_map(|n| n.claims.values().map(|c| ObservedClaim { claim: c.clone() })).collect(),
        }
    }

    #[test]
    fn the_plan_applies_what_is_missing_or_changed_and_deletes_what_no_allocation_needs() {
        let d = desired("c1", Mode::Dra, &governed(), &active(), &PROFILES);
        let first = plan(&d, &Observed::default());
        assert_eq!(first.iter().filter(|a| matches!(a, Action::LabelNamespace(_))).count(), 2);
        assert_eq!(first.iter().filter(|a| matches!(a, Action::ApplyQuota(_))).count(), 2);
        assert_eq!(first.iter().filter(|a| matches!(a, Action::ApplyClaim(_))).count(), 2);
        let mut now = observed_as(&d);
        assert_eq!(plan(&d, &now), [], "nothing to do once the cluster holds it");

        // Drift: a selector edited by hand, a quota raised by hand, a label removed.
        let edited = &mut now.claims[0].claim;
        let request = &mut edited.spec.devices.as_mut().and_then(|x| x.requests.as_mut()).expect("requests")[0];
        request.exactly.as_mut().and_then(|e| e.selectors.as_mut()).expect("selectors")[0] =
            k8s_openapi::api::resource::v1::DeviceSelector {
                cel: Some(k8s_openapi::api::resource::v1::CELDeviceSelector { expression: "true".into() }),
            };
        let q = now.quotas.get_mut("ml-b").expect("quota");
        q.spec.as_mut().and_then(|s| s.hard.as_mut()).expect("hard").insert(
            "requests.nvidia.com/gpu".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("8".into()),
        );
        now.namespaces.get_mut("ml-a").and_then(|n| n.metadata.labels.as_mut()).expect("labels").remove(names::TENANT);
        let repaired = plan(&d, &now);
        assert_eq!(repaired.len(), 4, "{repaired:?}");
        assert!(matches!(&repaired[0], Action::LabelNamespace(n) if n.metadata.name.as_deref() == Some("ml-a")));
        assert_eq!(
            repaired[1],
            Action::DeleteClaim { namespace: "ml-a".into(), name: "tessera-a1".into(), evict: vec![] },
            "a claim's spec cannot change: it is made again"
        );
        assert!(matches!(&repaired[2], Action::ApplyClaim(c) if c.metadata.name.as_deref() == Some("tessera-a1")));
        assert!(matches!(&repaired[3], Action::ApplyQuota(q) if q.metadata.namespace.as_deref() == Some("ml-b")));
        assert!(
            d.iter().all(|n| n.quota.metadata.labels.as_ref().is_some_and(|l| l[names::CLUSTER] == "c1")
                && n.claims.values().all(|c| c.metadata.labels.as_ref().is_some_and(|l| l[names::CLUSTER] == "c1"))),
            "every object names the registration it was written for"
        );

        // Released: a1's allocation is gone; its claim, in use by a pod, is deleted after the pod is evicted.
        let now = {
            let mut o = observed_as(&d);
            o.claims[0].claim.status = Some(ResourceClaimStatus {
                reserved_for: Some(vec![ResourceClaimConsumerReference {
                    resource: "pods".into(),
                    name: "trainer-0".into(),
                    uid: "u1".into(),
                    api_group: None,
                }]),
                ..ResourceClaimStatus::default()
            });
            o
        };
        let after: Vec<Active<'_>> = active().into_iter().filter(|a| a.allocation != "a1").collect();
        let d = desired("c1", Mode::Dra, &governed(), &after, &PROFILES);
        let released = plan(&d, &now);
        assert!(
            matches!(released.first(), Some(Action::ApplyQuota(q)) if q.metadata.namespace.as_deref() == Some("ml-a")),
            "the quota follows: {released:?}"
        );
        assert_eq!(
            released.last(),
            Some(&Action::DeleteClaim {
                namespace: "ml-a".into(),
                name: "tessera-a1".into(),
                evict: vec!["trainer-0".into()]
            }),
            "deleted last, its pod evicted first: {released:?}"
        );
        assert_eq!(released.len(), 2, "{released:?}");

        // ml-b given up: its claims, its quota and its labels go (it may be given to another tenant next); ml-a's
        // stay as they are.
        let d = desired("c1", Mode::Dra, &governed(), &active(), &PROFILES);
        let mut held = observed_as(&d);
        held.claims.push(ObservedClaim {
            claim: ResourceClaim {
                metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                    name: Some("tessera-b9".into()),
                    namespace: Some("ml-b".into()),
                    ..Default::default()
                },
                ..d[0].claims["tessera-a1"].clone()
            },
        });
        let only_a: Vec<Governed<'_>> = governed().into_iter().filter(|g| g.namespace == "ml-a").collect();
        let d = desired("c1", Mode::Dra, &only_a, &active(), &PROFILES);
        let given_up = plan(&d, &held);
        assert_eq!(
            given_up,
            [
                Action::DeleteClaim { namespace: "ml-b".into(), name: "tessera-b9".into(), evict: vec![] },
                Action::DeleteQuota { namespace: "ml-b".into() },
                Action::UnlabelNamespace("ml-b".into()),
            ]
        );
    }
}
