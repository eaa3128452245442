//! Telemetry views: heatmaps, the live view and the latest samples.

use serde::{Deserialize, Serialize};
use tessera_core::api::Sample;

/// Which heatmap.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct HeatmapQuery {
    /// A node (id or name); all nodes when absent.
    pub node: Option<String>,
    /// Start, UTC ms (default: 15 minutes before `to`).
    #[cfg_attr(feature = "openapi", param(minimum = 0, maximum = 253_402_300_799_999_i64))]
    pub from: Option<i64>,
    /// End, UTC ms (default: now).
    #[cfg_attr(feature = "openapi", param(minimum = 0, maximum = 253_402_300_799_999_i64))]
    pub to: Option<i64>,
    /// Column width in seconds (at most a year). Within the live window (the last 15 minutes) any whole number of
    /// seconds; before it, whole buckets of the stored series read (`source`: a minute, 10 minutes or an hour;
    /// rounded up, and `from` down to a bucket's start). Default: the range in at most 900 columns.
    #[cfg_attr(feature = "openapi", param(minimum = 1, maximum = 31_536_000))]
    pub step: Option<i64>,
    /// `util` (default), `mem_used`, `mem_pct`, `power` or `temp`.
    pub metric: Option<Metric>,
    /// One row per `node` or per GPU `model`, or one for the whole `fleet` (in `groups`, `rows` empty), instead of
    /// one per device: what a fleet of thousands of GPUs fits in one answer. Drill down with `node` (and `model`).
    pub group: Option<HeatmapGroup>,
    /// Only the GPUs of this catalog model (and their MIG instances).
    pub model: Option<String>,
}

/// How a heatmap's rows are grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum HeatmapGroup {
    /// One row per node.
    Node,
    /// One row per GPU model.
    Model,
    /// One row: the whole fleet (what the caller sees of it).
    Fleet,
}

/// A group's row: a node's or a GPU model's devices together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HeatmapGroupRow {
    /// The node's id, or the model's catalog key (`unknown` for GPUs the fleet no longer lists), or `fleet`.
    pub key: String,
    /// The node's name, or the model's key, or `fleet`.
    pub name: String,
    /// How many devices the row sums: for a platform admin the group's GPUs (a GPU in MIG mode reports its
    /// instances' use together), for anyone else the devices they see in it (whole GPUs and MIG instances).
    pub devices: u32,
    /// One value per column: the mean of the devices' values in it (for `temp`, the highest); `null` where none
    /// of them has a sample.
    pub values: Vec<Option<f32>>,
}

/// A heatmap: one row per GPU and per MIG instance, one column per step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Heatmap {
    /// What the cells are.
    pub metric: Metric,
    /// Their unit.
    pub unit: String,
    /// Start of the first column, UTC ms.
    pub from_ms: i64,
    /// End of the last column, UTC ms.
    pub to_ms: i64,
    /// Column width, ms.
    pub step_ms: i64,
    /// Number of columns.
    pub columns: usize,
    /// Where the cells come from: `live` (the in-memory window, 1 s resolution), or a stored series: `minutes`
    /// (kept 48 hours), `ten_minutes` (35 days) or `hours` (400 days); before the live window the heatmap reads the
    /// coarsest series its step allows that still reaches back to its start.
    pub source: String,
    /// Rows: by node name, GPU index, then the GPU's instances by start unit (empty with `group`).
    pub rows: Vec<HeatmapRow>,
    /// With `group`: its rows, by node name or by model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups: Option<Vec<HeatmapGroupRow>>,
}

/// One device's row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HeatmapRow {
    /// Node id.
    pub node_id: String,
    /// Node name.
    pub node: String,
    /// The GPU's UUID.
    pub gpu_uuid: String,
    /// The GPU's index on its node.
    pub gpu_index: Option<u32>,
    /// Catalog model key.
    pub model: Option<String>,
    /// `GPU-...` or `MIG-...`.
    pub device: String,
    /// `gpu` or `mig`.
    pub kind: String,
    /// MIG profile.
    pub profile: Option<String>,
    /// MIG start unit.
    pub start: Option<u8>,
    /// Live allocations on the device now.
    pub allocations: Vec<RowAllocation>,
    /// One value per column (`null`: no sample in it).
    pub values: Vec<Option<f32>>,
    /// A GPU row: the GPU's health now (`null` for an instance row, or a GPU the server does not know).
    #[serde(default)]
    pub health: Option<tessera_core::health::HealthState>,
    /// A GPU row: the changes of its health within the heatmap's range, oldest first (at most 50, the newest kept).
    #[serde(default)]
    pub health_marks: Vec<HealthMark>,
    /// Who runs on the device now under the allocations the caller sees (its agent's last report, at most 20).
    #[serde(default)]
    pub processes: Vec<RowProcess>,
    /// How many processes on the device are unallocated use now (for a tenant member: only on a device it holds
    /// now; who they are is for platform admins, on the fleet page).
    #[serde(default)]
    pub unallocated: u32,
}

/// A process on a heatmap row's device, under an allocation the caller sees.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RowProcess {
    /// Process id on the node.
    pub pid: u32,
    /// The user it runs as.
    pub user: Option<String>,
    /// Its command.
    pub command: Option<String>,
    /// Its pod and container, on a Kubernetes node.
    pub pod: Option<tessera_core::attribution::PodRef>,
    /// The allocation it runs under.
    pub allocation: String,
}

/// A change of a GPU's health: a marker on its heatmap row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HealthMark {
    /// When, UTC ms.
    pub at_ms: i64,
    /// The state it turned to.
    pub state: tessera_core::health::HealthState,
    /// The codes of the findings behind it, worst first (e.g. `xid_79`, `row_remap_pending`).
    pub codes: Vec<String>,
}

/// An allocation on a heatmap row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RowAllocation {
    /// Allocation id.
    pub allocation: String,
    /// Tenant name.
    pub tenant: String,
}

/// Which live stream.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct LiveQuery {
    /// A node (id or name); all nodes when absent.
    pub node: Option<String>,
    /// The first event also carries the samples taken after this time (ms since the Unix epoch; at most 60 s back,
    /// earlier values count as 60 s back), so that a client that just fetched a heatmap misses nothing. Without
    /// it the stream starts at each device's newest sample.
    pub since: Option<i64>,
}

/// What a heatmap shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Utilisation, %.
    Util,
    /// Memory used, MiB.
    MemUsed,
    /// Memory used, % of the device's memory.
    MemPct,
    /// Power draw, W (GPUs only).
    Power,
    /// Temperature, °C (GPUs only; the minute series keeps the maximum).
    Temp,
}

impl Metric {
    /// Its unit.
    pub fn unit(self) -> &'static str {
        match self {
            Metric::Util | Metric::MemPct => "%",
            Metric::MemUsed => "MiB",
            Metric::Power => "W",
            Metric::Temp => "°C",
        }
    }
}

/// The latest sample of a device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Latest {
    /// The node's id.
    pub node_id: String,
    /// `GPU-...` or `MIG-...`.
    pub device: String,
    /// The GPU's UUID.
    pub gpu: String,
    /// MIG profile, for an instance.
    pub profile: Option<String>,
    /// MIG start unit, for an instance.
    pub start: Option<u8>,
    /// The sample.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub sample: Sample,
}
