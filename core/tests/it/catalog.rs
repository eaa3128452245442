use tessera_core::catalog::{Catalog, MatchedBy, parse_pci_device_id};

#[test]
fn builtin_catalog_loads_every_model() {
    let c = Catalog::builtin();
    assert_eq!(c.schema, "mig-profiles/v1");
    let keys = c.keys();
    for k in ["A30-24GB", "A100-40GB", "A100-80GB", "H100-80GB", "H100-94GB", "H200-141GB", "B200-180GB"] {
        assert!(keys.contains(&k), "{k} missing from {keys:?}");
    }
}

#[test]
fn confidence_is_kept_for_models_and_profiles() {
    let c = Catalog::builtin();
    for m in &c.models {
        assert!(!m.confidence.is_empty(), "{} has no confidence", m.key);
        for p in &m.profiles {
            assert!(!p.confidence.is_empty(), "{}/{} has no confidence", m.key, p.name);
        }
    }
    assert!(c.model("GH200-144GB").is_some_and(|m| m.confidence.contains("uncertain")));
}

#[test]
fn models_resolve_by_key_product_name_and_pci_id() {
    let c = Catalog::builtin();
    let key = |s: &str| c.resolve(s).map(|(m, by)| (m.key.as_str(), by));
    assert_eq!(key("H100-80GB"), Some(("H100-80GB", MatchedBy::Key)));
    assert_eq!(key("h100-80gb"), Some(("H100-80GB", MatchedBy::Key)));
    assert_eq!(key("NVIDIA H100 80GB HBM3"), Some(("H100-80GB", MatchedBy::ProductName)));
    assert_eq!(key("H100-SXM5-80GB"), Some(("H100-80GB", MatchedBy::ProductName)));
    assert_eq!(key("NVIDIA A100-SXM4-40GB"), Some(("A100-40GB", MatchedBy::ProductName)));
    assert_eq!(key("NVIDIA A100 80GB PCIe"), Some(("A100-80GB", MatchedBy::ProductName)));
    assert_eq!(key("NVIDIA H100 NVL"), Some(("H100-94GB", MatchedBy::ProductName)));
    assert_eq!(key("NVIDIA A30"), Some(("A30-24GB", MatchedBy::ProductName)));
    assert_eq!(
        key("RTX PRO 6000 Blackwell Server Edition"),
        Some(("RTX-PRO-6000-Blackwell-96GB", MatchedBy::ProductName))
    );
    assert_eq!(key("0x233010DE"), Some(("H100-80GB", MatchedBy::PciDeviceId)));
    assert_eq!(key("10de:20b0"), Some(("A100-40GB", MatchedBy::PciDeviceId)));
    assert_eq!(key("NVIDIA GeForce RTX 4090"), None);
    assert_eq!(key(""), None);
}

#[test]
fn pci_ids_parse_in_nvml_and_lspci_forms() {
    assert_eq!(parse_pci_device_id("0x233010DE"), Some(0x2330_10DE));
    assert_eq!(parse_pci_device_id("233010de"), Some(0x2330_10DE));
    assert_eq!(parse_pci_device_id("10de:2330"), Some(0x2330_10DE));
    assert_eq!(parse_pci_device_id("0x2330"), None);
    assert_eq!(parse_pci_device_id("zz"), None);
}

#[test]
fn profiles_resolve_with_or_without_the_mig_prefix() {
    let m = Catalog::builtin().model("H100-80GB").expect("model");
    assert_eq!(m.profile("3g.40gb").map(|p| p.compute_slices), Some(3));
    assert_eq!(m.profile("MIG 1g.10gb+me").map(|p| p.max_instances), Some(1));
    assert!(m.profile("3g.20gb").is_none());
    let p = m.profile("2g.20gb").expect("profile");
    assert_eq!(p.allowed_starts(), vec![0, 2, 4]);
    assert_eq!(p.k8s_resource_name(), "nvidia.com/mig-2g.20gb");
}

#[test]
fn catalog_rejects_placements_outside_the_gpu() {
    let text = tessera_core::catalog::CATALOG_JSON.replacen(
        "[\n       6,\n       2\n      ]",
        "[\n       7,\n       2\n      ]",
        1,
    );
    assert_ne!(text, tessera_core::catalog::CATALOG_JSON, "fixture edit did not apply");
    let err = Catalog::from_json(&text).expect_err("must reject");
    assert!(err.to_string().contains("outside"), "{err}");
    assert!(Catalog::from_json("{").is_err());
}

#[test]
fn catalog_rejects_overflowing_and_mixed_size_placements() {
    let data = |placements: &str| {
        format!(
            r#"{{"schema": "mig-profiles/v1", "compiled": "test", "models": [{{
                "key": "X", "products": [], "pci_device_ids": [], "architecture": "x", "compute_slices_total": 7,
                "memory_slices_total": 8, "placement_units_total": 8, "total_memory_gb_nominal": 80,
                "total_memory_mib_observed": null, "confidence": "test",
                "profiles": [{{"name": "1g.10gb", "variant": "base", "nvml_profile": "P", "nvml_profile_value": 0,
                    "smi_profile_id": 19, "compute_slices": 1, "memory_slices": 1, "max_instances": 7,
                    "placements": {placements}, "memory_gib_lgip": null, "memory_mib": null, "sm_count": null,
                    "min_driver": null}}]}}]}}"#
        )
    };
    assert!(Catalog::from_json(&data("[[0, 1], [1, 1]]")).is_ok());
    let err = Catalog::from_json(&data("[[250, 10]]")).expect_err("overflow");
    assert!(err.to_string().contains("outside"), "{err}");
    let err = Catalog::from_json(&data("[[0, 1], [2, 2]]")).expect_err("mixed sizes");
    assert!(err.to_string().contains("different sizes"), "{err}");
}
