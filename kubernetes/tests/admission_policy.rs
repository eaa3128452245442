//! The shipped ValidatingAdmissionPolicy (`deploy/kubernetes/tessera-gpu-policy.yaml`) evaluated on admission
//! requests as the API server would (its CEL by cel-python, `tests/admission_policy.py`), with the very claims and
//! quota Tessera writes: in a governed namespace only Tessera creates or deletes GPU claims and changes its quota;
//! Kubernetes' own components, other device classes, other quotas, other namespaces and Tessera itself pass.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use tessera_kubernetes::claim::{self, Claim, Device, Slice};
use tessera_kubernetes::{names, quota};

const TESSERA: &str = "system:serviceaccount:tessera-system:tessera";

mod support;
use support::python;

fn request(user: &str, operation: &str, resource: &str, group: &str) -> Value {
    json!({"operation": operation, "namespace": "vision-ml", "userInfo": {"username": user},
           "resource": {"group": group, "version": "v1", "resource": resource}})
}

#[test]
fn only_tessera_makes_or_deletes_gpu_claims_and_changes_its_quota_in_the_namespaces_it_governs() {
    let slice = Slice {
        allocation: "0193a2b4-7c1d-7e2f-9a00-000000000001",
        request: "0193a2b4-0000-7000-8000-000000000002",
        tenant: "vision",
        namespace: "vision-ml",
        device: Device::Mig { uuid: "MIG-1c2d3e4f-0000-5555-aaaa-000000000001", profile: "1g.10gb" },
    };
    let Claim::Pinned(ours) = claim::claim(&slice) else { panic!("pinned") };
    let ours = serde_json::to_value(&*ours).expect("claim");
    // A claim of the tenant's own, asking for another tenant's device.
    let mut theirs = ours.clone();
    theirs["metadata"] = json!({"name": "mine", "namespace": "vision-ml"});
    theirs["spec"]["devices"]["requests"][0]["exactly"]["selectors"] =
        json!([{"cel": {"expression": "device.attributes[\"gpu.nvidia.com\"].uuid == \"MIG-other\""}}]);
    let fpga = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "fpga", "namespace": "vision-ml"},
        "spec": {"devices": {"requests": [{"name": "f", "exactly": {"deviceClassName": "fpga.example.com"}}]}}});
    let first_available = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "any-gpu", "namespace": "vision-ml"},
        "spec": {"devices": {"requests": [{"name": "g", "firstAvailable": [
            {"name": "small", "deviceClassName": "fpga.example.com"},
            {"name": "big", "deviceClassName": "gpu.nvidia.com"}]}]}}});
    let held = quota::Held { mig: BTreeMap::from([("1g.10gb".to_string(), 1)]), gpus: 0, shares: 0 };
    let rq = serde_json::to_value(quota::resource_quota("vision-ml", "vision", quota::Mode::Dra, &held, &["1g.10gb"]))
        .expect("quota");
    let compute = json!({"apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "compute", "namespace": "vision-ml"}, "spec": {"hard": {"requests.cpu": "64"}}});
    let governed: Value = serde_json::to_value(names::labels("vision")).expect("labels");
    let ann = "ann@example.com";
    let claims = "resourceclaims";
    let group = "resource.k8s.io";
    let claim_controller = "system:serviceaccount:kube-system:resource-claim-controller";
    let namespace_controller = "system:serviceaccount:kube-system:namespace-controller";
    let mut finalized = ours.clone();
    finalized["metadata"]["finalizers"] = json!(["resource.kubernetes.io/delete-protection"]);
    // (name, request, object, old object, namespace labels, allowed)
    let cases = [
        (
            "tessera creates its claim",
            request(TESSERA, "CREATE", claims, group),
            ours.clone(),
            Value::Null,
            &governed,
            true,
        ),
        (
            "tessera deletes its claim",
            request(TESSERA, "DELETE", claims, group),
            Value::Null,
            ours.clone(),
            &governed,
            true,
        ),
        (
            "a member deletes tessera's claim",
            request(ann, "DELETE", claims, group),
            Value::Null,
            ours.clone(),
            &governed,
            false,
        ),
        (
            "a member makes a claim on another device",
            request(ann, "CREATE", claims, group),
            theirs.clone(),
            Value::Null,
            &governed,
            false,
        ),
        (
            "a member's GPU claim by first available",
            request(ann, "CREATE", claims, group),
            first_available.clone(),
            Value::Null,
            &governed,
            false,
        ),
        (
            "a member's claim of another class",
            request(ann, "CREATE", claims, group),
            fpga,
            Value::Null,
            &governed,
            true,
        ),
        // Kubernetes' own work on claims passes: the scheduler's finalizer (an update), a template's claim by the
        // resource-claim controller (bounded by the quota), a namespace being emptied.
        (
            "the scheduler adds its finalizer",
            request("system:kube-scheduler", "UPDATE", claims, group),
            finalized,
            ours.clone(),
            &governed,
            true,
        ),
        (
            "a template's claim by the claim controller",
            request(claim_controller, "CREATE", claims, group),
            first_available,
            Value::Null,
            &governed,
            true,
        ),
        (
            "the namespace controller empties the namespace",
            request(namespace_controller, "DELETE", claims, group),
            Value::Null,
            ours.clone(),
            &governed,
            true,
        ),
        (
            "a member changes tessera's quota",
            request(ann, "UPDATE", "resourcequotas", ""),
            rq.clone(),
            rq.clone(),
            &governed,
            false,
        ),
        (
            "a member deletes tessera's quota",
            request(ann, "DELETE", "resourcequotas", ""),
            Value::Null,
            rq.clone(),
            &governed,
            false,
        ),
        (
            "tessera applies its quota",
            request(TESSERA, "UPDATE", "resourcequotas", ""),
            rq.clone(),
            rq,
            &governed,
            true,
        ),
        (
            "an admin's compute quota",
            request(ann, "UPDATE", "resourcequotas", ""),
            compute.clone(),
            compute,
            &governed,
            true,
        ),
        (
            "a namespace tessera does not govern",
            request(ann, "CREATE", claims, group),
            theirs,
            Value::Null,
            &json!({}),
            true,
        ),
    ];
    let input: Vec<Value> = cases
        .iter()
        .map(|(name, request, object, old, labels, _)| {
            json!({"name": name, "request": request, "object": object, "oldObject": old, "namespaceLabels": labels})
        })
        .collect();
    let policy = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/kubernetes/tessera-gpu-policy.yaml");
    let mut child = Command::new(python())
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/admission_policy.py"))
        .arg(policy)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python");
    child.stdin.take().expect("stdin").write_all(Value::Array(input).to_string().as_bytes()).expect("write");
    let out = child.wait_with_output().expect("run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let results: Vec<Value> = serde_json::from_slice(&out.stdout).expect("results");
    for ((name, .., allowed), r) in cases.iter().zip(&results) {
        assert_eq!(r["allowed"].as_bool(), Some(*allowed), "{name}: {r}");
        if !allowed {
            let message = r["message"].as_str().unwrap_or("");
            assert!(
                message.starts_with("GPU devices in namespace vision-ml are granted by Tessera"),
                "{name}: {message}"
            );
        }
    }
    let refused = results.iter().find(|r| r["name"] == "a member deletes tessera's claim").expect("case");
    assert_eq!(
        refused["message"],
        "GPU devices in namespace vision-ml are granted by Tessera: ann@example.com may not delete its resourceclaims; \
         request a slice in Tessera and reference its claim"
    );
}
