//! Who runs on each GPU and MIG device, and which use no allocation covers.
//!
//! A node's agent reports every compute process on its devices ([`GpuProcess`]: the device, the process id, its
//! user and command, and on a Kubernetes node the pod and container it belongs to). Each is judged against the
//! device's active allocations and the namespaces their tenants govern ([`judge`]):
//!
//! - on a device no active allocation holds, any process is **unallocated use**;
//! - on a held device, a process of a pod is the holder's only if the pod's namespace belongs to a tenant holding
//!   the device; a pod of another tenant, or of a namespace no tenant governs, is unallocated use;
//! - on a held device, a process of no pod (a bare-metal node, or a process outside Kubernetes) is taken as the
//!   holder's: nothing on the node says otherwise; on a device several tenants share, it is nobody's (no tenant
//!   is shown another's process).

use serde::{Deserialize, Serialize};

/// The most processes one status reports (per node): a report with more is refused.
pub const MAX_PROCESSES_PER_NODE: usize = 4_096;

/// The longest user, command, namespace, pod or container name a status may carry (a DNS subdomain's length).
pub const MAX_PROCESS_FIELD_LEN: usize = 253;

/// Whether a process's field is as a status may carry it: 1 to [`MAX_PROCESS_FIELD_LEN`] characters, none a
/// control character.
pub fn valid_field(f: &str) -> bool {
    !f.is_empty() && f.chars().count() <= MAX_PROCESS_FIELD_LEN && !f.chars().any(char::is_control)
}

/// `s` made a field a status may carry (control characters dropped, cut to [`MAX_PROCESS_FIELD_LEN`]); `None`
/// when nothing is left.
pub fn field(s: &str) -> Option<String> {
    let f: String = s.chars().filter(|c| !c.is_control()).take(MAX_PROCESS_FIELD_LEN).collect();
    (!f.is_empty()).then_some(f)
}

/// A compute process on a device, as the node's agent sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuProcess {
    /// The device it runs on: the MIG device's UUID (`MIG-...`) or the GPU's (`GPU-...`).
    pub device: String,
    /// Process id on the node.
    pub pid: u32,
    /// The user it runs as (a name where the node knows one, else the uid).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Its command (`/proc/<pid>/comm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// The Kubernetes pod and container it belongs to, on a Kubernetes node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
}

/// A container of a pod, named as dcgm-exporter names them (`namespace`, `pod`, `container`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PodRef {
    /// Namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name.
    pub container: String,
}

/// An active allocation on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder<'a> {
    /// The device (MIG device or GPU UUID).
    pub device: &'a str,
    /// The allocation.
    pub allocation: &'a str,
    /// Its tenant's id.
    pub tenant: &'a str,
}

/// Why a process is unallocated use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Stray {
    /// The device has no active allocation.
    NoAllocation,
    /// A pod of another tenant than the device's holders.
    OtherTenant,
    /// A pod of a namespace no tenant governs, on a held device.
    UngovernedPod,
}

impl Stray {
    /// The stable code.
    pub fn code(self) -> &'static str {
        match self {
            Stray::NoAllocation => "no_allocation",
            Stray::OtherTenant => "other_tenant",
            Stray::UngovernedPod => "ungoverned_pod",
        }
    }

    /// The code's reason.
    pub fn parse(code: &str) -> Option<Stray> {
        [Stray::NoAllocation, Stray::OtherTenant, Stray::UngovernedPod].into_iter().find(|s| s.code() == code)
    }

    /// What it means, in a sentence.
    pub fn sentence(self) -> &'static str {
        match self {
            Stray::NoAllocation => "runs on a device no allocation holds",
            Stray::OtherTenant => "is a pod of another tenant than the one the device is allocated to",
            Stray::UngovernedPod => "is a pod of a namespace no tenant governs, on a device allocated to a tenant",
        }
    }
}

/// Whose a process is: the allocation it runs under, or why it is unallocated use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict<'a> {
    /// It runs under this allocation (the first of the device's holders that the pod's tenant holds).
    Allocated(&'a Holder<'a>),
    /// It runs on a device several tenants share and nothing says whose it is (no pod): it is shown to no tenant.
    Shared,
    /// Unallocated use.
    Unallocated(Stray),
}

/// Judges `p` against the device's active allocations (`holders`, any devices) and `tenant_of`, the tenant that
/// governs a namespace of the node's cluster (`None`: no tenant does, or the node is in no cluster).
pub fn judge<'a>(
    p: &GpuProcess,
    holders: &'a [Holder<'a>],
    tenant_of: impl Fn(&str) -> Option<&'a str>,
) -> Verdict<'a> {
    let mut on_device = holders.iter().filter(|h| h.device == p.device).peekable();
    let Some(first) = on_device.peek().copied() else { return Verdict::Unallocated(Stray::NoAllocation) };
    let Some(pod) = &p.pod else {
        let shared = holders.iter().any(|h| h.device == p.device && h.tenant != first.tenant);
        return if shared { Verdict::Shared } else { Verdict::Allocated(first) };
    };
    match tenant_of(&pod.namespace) {
        None => Verdict::Unallocated(Stray::UngovernedPod),
        Some(t) => {
            on_device.find(|h| h.tenant == t).map_or(Verdict::Unallocated(Stray::OtherTenant), Verdict::Allocated)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(device: &str, pod: Option<&str>) -> GpuProcess {
        GpuProcess {
            device: device.into(),
            pid: 42,
            user: Some("ann".into()),
            command: Some("python".into()),
            pod: pod.map(|ns| PodRef { namespace: ns.into(), pod: "trainer-0".into(), container: "main".into() }),
        }
    }

    const HOLDERS: [Holder<'static>; 3] = [
        Holder { device: "MIG-a", allocation: "a1", tenant: "ta" },
        Holder { device: "GPU-shared", allocation: "a2", tenant: "ta" },
        Holder { device: "GPU-shared", allocation: "b1", tenant: "tb" },
    ];

    fn tenant_of(ns: &str) -> Option<&'static str> {
        match ns {
            "ml-a" => Some("ta"),
            "ml-b" => Some("tb"),
            _ => None,
        }
    }

    #[test]
    fn a_process_is_its_holders_or_unallocated_use_and_says_why() {
        fn allocated(v: Verdict<'static>) -> Option<&'static str> {
            match v {
                Verdict::Allocated(h) => Some(h.allocation),
                Verdict::Shared | Verdict::Unallocated(_) => None,
            }
        }
        assert_eq!(judge(&process("MIG-free", None), &HOLDERS, tenant_of), Verdict::Unallocated(Stray::NoAllocation));
        assert_eq!(
            judge(&process("MIG-free", Some("ml-a")), &HOLDERS, tenant_of),
            Verdict::Unallocated(Stray::NoAllocation)
        );
        assert_eq!(
            allocated(judge(&process("MIG-a", None), &HOLDERS, tenant_of)),
            Some("a1"),
            "bare metal: the holder's"
        );
        assert_eq!(allocated(judge(&process("MIG-a", Some("ml-a")), &HOLDERS, tenant_of)), Some("a1"));
        assert_eq!(
            judge(&process("MIG-a", Some("ml-b")), &HOLDERS, tenant_of),
            Verdict::Unallocated(Stray::OtherTenant)
        );
        assert_eq!(
            judge(&process("MIG-a", Some("default")), &HOLDERS, tenant_of),
            Verdict::Unallocated(Stray::UngovernedPod)
        );
        assert_eq!(
            allocated(judge(&process("GPU-shared", Some("ml-b")), &HOLDERS, tenant_of)),
            Some("b1"),
            "a share: its own tenant's"
        );
        assert_eq!(allocated(judge(&process("GPU-shared", Some("ml-a")), &HOLDERS, tenant_of)), Some("a2"));
        assert_eq!(judge(&process("GPU-shared", None), &HOLDERS, tenant_of), Verdict::Shared, "whose, nothing says");
        for s in [Stray::NoAllocation, Stray::OtherTenant, Stray::UngovernedPod] {
            assert_eq!(Stray::parse(s.code()), Some(s));
        }
    }

    #[test]
    fn the_wire_form_leaves_out_what_the_agent_does_not_know() {
        let bare = GpuProcess { device: "GPU-1".into(), pid: 7, user: None, command: None, pod: None };
        assert_eq!(serde_json::to_value(&bare).expect("json"), serde_json::json!({"device": "GPU-1", "pid": 7}));
        let back: GpuProcess = serde_json::from_value(serde_json::json!({"device": "GPU-1", "pid": 7})).expect("parse");
        assert_eq!(back, bare);
    }
}
