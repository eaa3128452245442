//! What `tessera-agent --backend nvml --inventory` printed on a real H100 80GB HBM3 (driver 580.159.04, MIG off,
//! idle; recorded 2026-11-26 in `tests/data/nvml-h100-80gb-hbm3.json`, with `nvidia-smi -q -d
//! ECC,TEMPERATURE,PERFORMANCE,ROW_REMAPPER,PAGE_RETIREMENT` of the same GPU beside it). The record is read back
//! through the wire types the server reads, and its health is judged as the server judges it: the formats the NVML
//! backend writes are the ones the rest of the product reads, and what it read agrees with nvidia-smi.

use tessera_core::api::{Inventory, TelemetryBatch};
use tessera_core::health::{GpuHealthReport, HealthState, judge};

fn record() -> serde_json::Value {
    serde_json::from_str(include_str!("data/nvml-h100-80gb-hbm3.json")).expect("json")
}

#[test]
fn the_h100_record_reads_back_as_the_server_reads_it() {
    let r = record();
    let inventory: Inventory = serde_json::from_value(r["inventory"].clone()).expect("inventory");
    assert_eq!(inventory.backend, "nvml");
    let gpu = &inventory.gpus[0];
    assert_eq!((gpu.name.as_str(), gpu.pci_device_id.as_deref()), ("NVIDIA H100 80GB HBM3", Some("0x233010DE")));
    let model = tessera_core::Catalog::builtin().resolve(&gpu.name).expect("in the catalog").0;
    assert_eq!(model.key, "H100-80GB");
    let batch: TelemetryBatch = serde_json::from_value(r["telemetry"].clone()).expect("telemetry");
    assert_eq!(batch.devices[0].device, gpu.uuid);
}

#[test]
fn the_h100_health_report_agrees_with_nvidia_smi_and_is_healthy() {
    let r = record();
    let health = &r["health"][0];
    let report: GpuHealthReport = serde_json::from_value(health["report"].clone()).expect("report");
    assert_eq!(report.check(tessera_core::clock::now_ms()), Ok(()));
    let smi = include_str!("data/nvml-h100-80gb-hbm3.nvidia-smi.txt");
    // `name` in the section of nvidia-smi's log that starts at the line `section`.
    let field = |section: &str, name: &str| {
        smi.lines()
            .skip_while(|l| l.trim() != section)
            .find_map(|l| {
                l.trim().strip_prefix(name).and_then(|v| v.trim().strip_prefix(':')).map(|v| v.trim().to_string())
            })
            .unwrap_or_else(|| panic!("{section} / {name} in nvidia-smi -q"))
    };
    let celsius = |name: &str| -> i64 {
        field("Temperature", name).trim_end_matches(" C").parse().unwrap_or_else(|_| panic!("{name} in degrees"))
    };
    // Temperature; nvidia-smi gives the slowdown threshold as margins from the current temperature
    // (T.Limit) and from that limit (Slowdown T.Limit): 37 + 50 - (-2) = 89 °C, as NVML told the agent.
    assert_eq!(report.temperature_c.map(i64::from), Some(celsius("GPU Current Temp")));
    let slowdown = celsius("GPU Current Temp") + celsius("GPU T.Limit Temp") - celsius("GPU Slowdown T.Limit Temp");
    assert_eq!(report.slowdown_temperature_c.map(i64::from), Some(slowdown));
    // Row remapping (Hopper remaps rows; it retires no pages: NVML says "not supported", nvidia-smi "N/A").
    let rows = report.remapped_rows.expect("row remapping");
    assert_eq!(rows.pending, field("Remapped Rows", "Pending") == "Yes");
    assert_eq!(rows.failure, field("Remapped Rows", "Remapping Failure Occurred") == "Yes");
    assert_eq!(
        i64::from(rows.uncorrectable),
        field("Remapped Rows", "Uncorrectable Error").parse::<i64>().expect("count")
    );
    assert_eq!(field("Retired Pages", "Single Bit ECC"), "N/A");
    assert_eq!(report.retired_pages, None);
    // The clocks were held back only because the GPU was idle.
    assert_eq!(field("Clocks Event Reasons", "Idle"), "Active");
    assert_eq!(field("Clocks Event Reasons", "HW Slowdown"), "Not Active");
    let dram = field("Volatile", "DRAM Uncorrectable").parse::<u64>().expect("count");
    assert_eq!(report.throttle, ["gpu_idle"]);
    assert_eq!(report.ecc_uncorrected_volatile, Some(dram));
    assert_eq!(judge(&report, 0, tessera_core::clock::now_ms()), (HealthState::Healthy, vec![]));
    assert_eq!(health["state"], "healthy");
}
