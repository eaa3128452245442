//! Kubernetes clusters Tessera governs, and the namespaces in them it maps to tenants: the rules on their names and
//! how each cluster hands out GPUs.

use serde::{Deserialize, Serialize};

/// The most namespaces a tenant has in one cluster (which bounds what a member reads of them).
pub const MAX_NAMESPACES_PER_TENANT: usize = 64;

/// How a cluster's pods get NVIDIA devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Dynamic Resource Allocation (`resource.k8s.io/v1`) through NVIDIA's DRA driver: a ResourceClaim names one
    /// device, so Tessera pins each allocation to its own.
    Dra,
    /// NVIDIA's device plugin (`nvidia.com/gpu`, `nvidia.com/mig-<profile>`): a pod asks for a count of a kind,
    /// and the plugin picks which free device of that kind on the node it gets.
    DevicePlugin,
}

impl Mode {
    /// Every mode, in the order they are listed.
    pub const ALL: [Mode; 2] = [Mode::Dra, Mode::DevicePlugin];

    /// The stored and wire name: `dra` or `device_plugin`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Dra => "dra",
            Mode::DevicePlugin => "device_plugin",
        }
    }

    /// The mode named `name`.
    pub fn parse(name: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.as_str() == name)
    }

    /// Whether an allocation's device can be pinned for the pods that use it (only a DRA claim names one device).
    pub fn pins_devices(self) -> bool {
        matches!(self, Mode::Dra)
    }
}

/// Whether `name` is a cluster name: a DNS label (1-63 characters of `a-z`, `0-9` and `-`, beginning and ending
/// with a letter or digit).
pub fn valid_cluster_name(name: &str) -> bool {
    dns_label(name)
}

/// Why `namespace` cannot be governed, or `None` when it can: it must be a Kubernetes namespace name (a DNS label),
/// and not one of the namespaces Kubernetes keeps for itself (`kube-*`) or `default`, where a ResourceQuota of
/// Tessera's would refuse GPUs to workloads no tenant owns.
pub fn namespace_problem(namespace: &str) -> Option<&'static str> {
    if !dns_label(namespace) {
        return Some(
            "a namespace name is a DNS label: 1-63 characters of a-z, 0-9 and -, beginning and ending with a letter \
             or digit",
        );
    }
    if namespace.starts_with("kube-") || namespace == "default" {
        return Some(
            "Kubernetes keeps `default` and the `kube-` namespaces for itself: they cannot belong to a tenant",
        );
    }
    None
}

/// RFC 1123 label, as Kubernetes checks namespace names.
fn dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=63).contains(&b.len())
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_round_trip_and_only_dra_pins() {
        for m in Mode::ALL {
            assert_eq!(Mode::parse(m.as_str()), Some(m));
        }
        assert_eq!(Mode::parse("DRA"), None);
        assert!(Mode::Dra.pins_devices());
        assert!(!Mode::DevicePlugin.pins_devices());
    }

    #[test]
    fn namespaces_are_dns_labels_outside_what_kubernetes_keeps() {
        for ok in ["ml-team", "a", "team1", &"x".repeat(63)] {
            assert_eq!(namespace_problem(ok), None, "{ok}");
        }
        for bad in ["", "-a", "a-", "Team", "a_b", "a.b", &"x".repeat(64)] {
            assert!(namespace_problem(bad).is_some_and(|w| w.contains("DNS label")), "{bad}");
        }
        for kept in ["kube-system", "kube-public", "kube-node-lease", "default"] {
            assert!(namespace_problem(kept).is_some_and(|w| w.contains("keeps")), "{kept}");
        }
        assert!(valid_cluster_name("prod-east-1"));
        assert!(!valid_cluster_name("Prod"));
    }
}
