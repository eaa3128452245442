//! Names, labels and annotations of what Tessera writes, and the patch that marks a namespace as governed.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The field manager of Tessera's server-side applies: the fields it owns are the ones it set.
pub const FIELD_MANAGER: &str = "tessera";

/// `app.kubernetes.io/managed-by` on every object Tessera writes.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";

/// The allocation a claim serves (its id).
pub const ALLOCATION: &str = "tessera.io/allocation";

/// The registered cluster (its id in Tessera) an object was written for.
pub const CLUSTER: &str = "tessera.io/cluster";

/// The tenant (by name) a namespace or an object belongs to.
pub const TENANT: &str = "tessera.io/tenant";

/// The request an allocation serves (annotation).
pub const REQUEST: &str = "tessera.io/request";

/// The ResourceQuota Tessera keeps in each governed namespace.
pub const QUOTA_NAME: &str = "tessera-gpus";

/// The ResourceClaim serving allocation `id`: `tessera-<id>`, a DNS subdomain whatever the id holds (lower case,
/// letters, digits and `-`; at most 253 characters).
pub fn claim_name(allocation_id: &str) -> String {
    let mut name = String::from("tessera-");
    for c in allocation_id.chars() {
        name.push(if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' });
    }
    name.truncate(253);
    while name.ends_with('-') {
        name.pop();
    }
    name
}

/// `value` as a label value: at most 63 characters of letters, digits, `-`, `_` and `.`, beginning and ending with
/// a letter or digit (others become `-`, and the ends are trimmed).
pub fn label_value(value: &str) -> String {
    let mapped: String = value
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '-' })
        .take(63)
        .collect();
    mapped.trim_matches(|c: char| !c.is_ascii_alphanumeric()).to_string()
}

/// The labels every object written for `tenant` carries.
pub fn labels(tenant: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(MANAGED_BY.to_string(), "tessera".to_string()), (TENANT.to_string(), label_value(tenant))])
}

/// What Tessera applies to a namespace it governs for `tenant`: its labels and an annotation saying so (its own
/// fields only: labels and annotations others set stay).
pub fn namespace_patch(namespace: &str, tenant: &str) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(namespace.to_string()),
            labels: Some(labels(tenant)),
            annotations: Some(BTreeMap::from([(
                "tessera.io/governed".to_string(),
                format!(
                    "GPU devices in this namespace are granted by Tessera to tenant {tenant}: through its \
                     ResourceClaims, within the ResourceQuota {QUOTA_NAME}"
                ),
            )])),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_labels_are_what_kubernetes_accepts() {
        assert_eq!(claim_name("0193A2B4-7c1d-7e2f"), "tessera-0193a2b4-7c1d-7e2f");
        assert_eq!(claim_name("a/b_c."), "tessera-a-b-c");
        assert!(claim_name(&"x".repeat(400)).len() <= 253);
        assert_eq!(label_value("-team a/b-"), "team-a-b");
        assert_eq!(label_value(&"y".repeat(100)).len(), 63);
        assert_eq!(label_value("vision"), "vision");
    }
}
