//! The Kubernetes objects Tessera writes into the namespaces it governs for a tenant, built from its own records
//! and typed with `k8s-openapi` (Kubernetes 1.34 and later: `resource.k8s.io/v1`):
//!
//! - a `ResourceClaim` per active allocation, whose one device request selects exactly the allocated device of
//!   NVIDIA's DRA driver by its `uuid` attribute ([`claim`]), so a pod that references the claim gets that device
//!   and no other;
//! - the pod spec "Use this slice" gives, which references that claim ([`claim::pod`]);
//! - a `ResourceQuota` from what the tenant holds there ([`quota`]), so that asking Kubernetes for a device
//!   Tessera did not grant is refused by the API server itself;
//! - the labels and annotations of a governed namespace ([`names::namespace_patch`]);
//! - what a cluster's governed namespaces should hold, and the changes that get them there ([`desired`]).
//!
//! Pure functions, no I/O: the controller that applies them with server-side apply sits above.

pub mod claim;
pub mod desired;
pub mod names;
pub mod quota;

/// An object as YAML, as people read and paste it.
pub fn to_yaml<T: serde::Serialize>(object: &T) -> String {
    serde_saphyr::to_string(object).unwrap_or_default()
}
