//! Every kind of object Tessera writes into a tenant's namespaces, and every manifest it ships
//! (`deploy/kubernetes/`), validated against the official Kubernetes OpenAPI schemas of each version Tessera
//! supports (the oldest with `resource.k8s.io/v1`, 1.34, to the newest the validator knows) by the PyPI package
//! `kubernetes-validate`, strict (no property the schema does not have).
//!
//! The Python with `kubernetes-validate` installed: `TESSERA_TEST_PYTHON`, else `target/webhooks-venv`, which
//! `scripts/test` prepares.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use tessera_kubernetes::claim::{self, Claim, Device, ShareMode, Slice};
use tessera_kubernetes::{names, quota, to_yaml};

/// The Kubernetes versions Tessera writes for.
const VERSIONS: [&str; 4] = ["1.34.0", "1.35.0", "1.36.0", "1.37.0"];

mod support;
use support::python;

/// Checks that the `objects` objects in `files` are valid, strictly, for every version of [`VERSIONS`].
fn valid_for_every_version(python: &str, files: &[PathBuf], objects: usize) {
    for version in VERSIONS {
        let out = Command::new(python)
            .args(["-m", "kubernetes_validate", "--strict", "-k", version])
            .args(files)
            .output()
            .expect("run kubernetes-validate");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "Kubernetes {version}:\n{text}");
        assert_eq!(text.matches(" passed for resource ").count(), objects, "Kubernetes {version}:\n{text}");
    }
}

/// One of each object, as YAML documents by file name.
fn objects() -> BTreeMap<&'static str, String> {
    let slice = |device| Slice {
        allocation: "0193a2b4-7c1d-7e2f-9a00-000000000001",
        request: "0193a2b4-0000-7000-8000-000000000002",
        tenant: "vision",
        namespace: "vision-ml",
        device,
    };
    let pinned = |device| match claim::claim(&slice(device)) {
        Claim::Pinned(c) => to_yaml(&*c),
        Claim::Unpinned { why } => panic!("{why}"),
    };
    let mig = Device::Mig { uuid: "MIG-1c2d3e4f-0000-5555-aaaa-000000000001", profile: "1g.10gb" };
    let gpu = Device::Gpu { uuid: "GPU-00000000-0000-0000-0000-000000000001" };
    assert!(matches!(
        claim::claim(&slice(Device::Share { gpu_uuid: "GPU-1", mode: ShareMode::Mps, replicas: 2 })),
        Claim::Unpinned { .. }
    ));
    let held = quota::Held { mig: BTreeMap::from([("1g.10gb".to_string(), 2)]), gpus: 1, shares: 1 };
    let profiles = ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"];
    BTreeMap::from([
        ("claim-mig.yaml", pinned(mig)),
        ("claim-gpu.yaml", pinned(gpu)),
        ("pod.yaml", to_yaml(&claim::pod("try-it", "vision-ml", "tessera-0193a2b4", "nvidia/cuda:12.4.1-base"))),
        ("quota-dra.yaml", to_yaml(&quota::resource_quota("vision-ml", "vision", quota::Mode::Dra, &held, &profiles))),
        (
            "quota-plugin.yaml",
            to_yaml(&quota::resource_quota("vision-ml", "vision", quota::Mode::DevicePlugin, &held, &profiles)),
        ),
        ("namespace.yaml", to_yaml(&names::namespace_patch("vision-ml", "vision"))),
    ])
}

#[test]
fn every_object_is_valid_for_every_supported_kubernetes_version() {
    let python = python();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kubernetes-objects");
    std::fs::create_dir_all(&dir).expect("dir");
    let mut files = Vec::new();
    for (name, yaml) in objects() {
        let path = dir.join(name);
        std::fs::write(&path, &yaml).expect("write");
        files.push(path);
    }
    valid_for_every_version(&python, &files, files.len());
}

#[test]
fn the_validator_refuses_what_kubernetes_would() {
    // The check above can fail: a property the schema lacks is refused.
    let python = python();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kubernetes-objects-bad");
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("claim.yaml");
    let yaml = objects()["claim-mig.yaml"].replace("deviceClassName:", "deviceClass:");
    std::fs::write(&path, yaml).expect("write");
    let out = Command::new(&python)
        .args(["-m", "kubernetes_validate", "--strict", "-k", VERSIONS[0]])
        .arg(&path)
        .output()
        .expect("run kubernetes-validate");
    assert!(!out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn the_shipped_manifests_are_valid_for_every_supported_kubernetes_version() {
    let python = python();
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/kubernetes"));
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("deploy/kubernetes")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    let documents: usize = files
        .iter()
        .map(|f| std::fs::read_to_string(f).expect("read").lines().filter(|l| l.starts_with("kind: ")).count())
        .sum();
    assert!(files.len() >= 2 && documents >= 10, "{files:?}: {documents} objects");
    valid_for_every_version(&python, &files, documents);
}
