//! Each claim's selector, evaluated with a CEL implementation (cel-rust's `cel` crate) against the devices of a
//! ResourceSlice shaped as NVIDIA's DRA driver publishes them (`tests/data/resourceslice-gpu-node-1.json`: one
//! H100 with four MIG devices, one whole H100), together with the selector of the claim's device class: exactly
//! the allocated device matches, and no other.

use std::collections::HashMap;
use std::sync::Arc;

use cel::objects::{Key, Value};
use cel::{Context, Program};
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use tessera_kubernetes::claim::{self, Claim, DRIVER, Device as Held, Slice};

/// The device classes as the driver's Helm chart defines them (`deviceClassName` -> its selector).
fn class_selector(class: &str) -> &'static str {
    match class {
        claim::GPU_CLASS => "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
        claim::MIG_CLASS => "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",
        other => panic!("no device class {other}"),
    }
}

fn slice() -> ResourceSlice {
    serde_json::from_str(include_str!("data/resourceslice-gpu-node-1.json")).expect("a ResourceSlice")
}

/// `device` as DRA's CEL environment sees it: `driver`, `attributes` by domain (unqualified names are the
/// driver's), `capacity` by domain.
fn cel_device(driver: &str, d: &Device) -> Value {
    let mut by_domain: HashMap<String, HashMap<Key, Value>> = HashMap::new();
    for (name, a) in d.attributes.iter().flatten() {
        let (domain, name) = name.split_once('/').unwrap_or((driver, name));
        let value = if let Some(s) = &a.string {
            Value::String(Arc::new(s.clone()))
        } else if let Some(i) = a.int {
            Value::Int(i)
        } else if let Some(b) = a.bool {
            Value::Bool(b)
        } else if let Some(v) = &a.version {
            Value::String(Arc::new(v.clone()))
        } else {
            continue;
        };
        by_domain.entry(domain.to_string()).or_default().insert(Key::String(Arc::new(name.to_string())), value);
    }
    let attributes: HashMap<Key, Value> =
        by_domain.into_iter().map(|(k, v)| (Key::String(Arc::new(k)), Value::from(v))).collect();
    let mut device: HashMap<Key, Value> = HashMap::new();
    device.insert(Key::String(Arc::new("driver".into())), Value::String(Arc::new(driver.to_string())));
    device.insert(Key::String(Arc::new("attributes".into())), Value::from(attributes));
    Value::from(device)
}

fn matches(expression: &str, device: &Value) -> bool {
    let program = Program::compile(expression).unwrap_or_else(|e| panic!("{expression}: {e:?}"));
    let mut context = Context::default();
    context.add_variable_from_value("device", device.clone());
    // A selector that cannot be evaluated on a device (an attribute it lacks) does not select it.
    matches!(program.execute(&context), Ok(Value::Bool(true)))
}

/// The names of the devices of `slice` that the pinned claim for `held` can be allocated.
fn selected(slice: &ResourceSlice, held: Held<'_>) -> Vec<String> {
    let s = Slice { allocation: "a-1", request: "r-1", tenant: "vision", namespace: "vision-ml", device: held };
    let Claim::Pinned(c) = claim::claim(&s) else { panic!("{held:?} is pinned") };
    let request = c.spec.devices.and_then(|d| d.requests).expect("requests").remove(0).exactly.expect("exactly");
    assert_eq!(request.count, Some(1));
    let class = class_selector(&request.device_class_name);
    let selectors: Vec<String> =
        request.selectors.into_iter().flatten().filter_map(|s| s.cel.map(|c| c.expression)).collect();
    assert_eq!(selectors.len(), 1);
    slice
        .spec
        .devices
        .iter()
        .flatten()
        .filter(|d| {
            let v = cel_device(&slice.spec.driver, d);
            matches(class, &v) && selectors.iter().all(|e| matches(e, &v))
        })
        .map(|d| d.name.clone())
        .collect()
}

fn attribute(d: &Device, name: &str) -> Option<String> {
    d.attributes.as_ref()?.get(name)?.string.clone()
}

#[test]
fn each_claim_selects_exactly_its_device() {
    let slice = slice();
    assert_eq!(slice.spec.driver, DRIVER);
    let devices = slice.spec.devices.clone().unwrap_or_default();
    assert_eq!(devices.len(), 5);
    for d in &devices {
        let uuid = attribute(d, "uuid").expect("uuid");
        let held = match attribute(d, "type").as_deref() {
            Some("mig") => Held::Mig { uuid: &uuid, profile: "" },
            Some("gpu") => Held::Gpu { uuid: &uuid },
            other => panic!("type {other:?}"),
        };
        assert_eq!(selected(&slice, held), vec![d.name.clone()], "the claim for {uuid}");
    }
}

#[test]
fn a_claim_in_the_wrong_class_or_for_a_device_not_published_selects_nothing() {
    let slice = slice();
    // A MIG device's UUID asked as a whole GPU: the class keeps it out.
    assert!(selected(&slice, Held::Gpu { uuid: "MIG-00000000-0000-0000-0001-000000000001" }).is_empty());
    // The parent of MIG devices is not a whole GPU one can be given.
    assert!(selected(&slice, Held::Gpu { uuid: "GPU-00000000-0000-0000-0000-000000000001" }).is_empty());
    // A device the driver does not publish (gone, or on another node).
    assert!(selected(&slice, Held::Mig { uuid: "MIG-00000000-0000-0000-0001-00000000000f", profile: "" }).is_empty());
}
