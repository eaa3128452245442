//! The catalog's types: a GPU model, its profiles and placements, and the unit masks the layout rules work on.
//! They depend on nothing else in the crate, so the layout rules and the catalog loader both build on them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Most profiles a model may have (the catalog loader checks it).
pub const MAX_PROFILES: usize = 16;

/// Index of a profile inside its model's `profiles` list.
pub type ProfileIdx = usize;

/// A bit set of placement units; bit `u` is set when unit `u` is covered. Models have at most 16 units.
pub type UnitMask = u16;

/// One GPU model (e.g. `H100-80GB`) and its MIG geometry.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GpuModel {
    /// Stable key, e.g. `H100-80GB`.
    pub key: String,
    /// Product names, as NVIDIA and `nvidia-smi` print them (some with an alias in parentheses).
    pub products: Vec<String>,
    /// PCI device ids as NVML reports them (`0x233010DE`: device id in the high 16 bits, vendor `10DE` low).
    pub pci_device_ids: Vec<String>,
    /// Architecture and die, e.g. `Hopper GH100`.
    pub architecture: String,
    /// Compute slices (the `Ng` of profile names) of the whole GPU.
    pub compute_slices_total: u8,
    /// Memory slices of the whole GPU.
    pub memory_slices_total: u8,
    /// NVML placement units (what placements are counted in).
    pub placement_units_total: u8,
    /// Nominal memory of the product in GB.
    pub total_memory_gb_nominal: u32,
    /// Total memory observed on a real device, when known.
    pub total_memory_mib_observed: Option<u32>,
    /// GPU instance profiles, smallest first.
    pub profiles: Vec<Profile>,
    /// Free-form notes from the sources.
    #[serde(default)]
    pub notes: Vec<String>,
    /// Where the data came from.
    #[serde(default)]
    pub sources: Vec<String>,
    /// How sure the data is, as a summary (`exact-from-doc`, `derived ...`, `uncertain`).
    pub confidence: String,
    /// Per engine of [`ENGINES`]: how many the whole GPU has, where the catalog's engine counts are consistent
    /// enough to enforce (see [`Catalog::from_json`]); `None` leaves that engine unchecked.
    #[serde(skip)]
    pub engine_limits: [Option<u8>; ENGINES.len()],
}

/// A GPU instance profile of one model, e.g. `3g.40gb` on `H100-80GB`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Profile {
    /// Profile name as `nvidia-smi mig -lgip` prints it (without the `MIG ` prefix), e.g. `1g.10gb+me`.
    pub name: String,
    /// `base`, `+me`, `+me.all`, `-me` or `+gfx`.
    pub variant: String,
    /// The `NVML_GPU_INSTANCE_PROFILE_*` name.
    pub nvml_profile: String,
    /// The value of that NVML enum.
    pub nvml_profile_value: u32,
    /// The profile id that `nvidia-smi mig -cgi` and `nvmlDeviceCreateGpuInstanceWithPlacement` take (per device).
    pub smi_profile_id: u32,
    /// Compute slices.
    pub compute_slices: u8,
    /// Memory slices (in units of the model's memory slice).
    pub memory_slices: u8,
    /// Most instances of this profile on one GPU.
    pub max_instances: u8,
    /// Allowed placements, `[start, size]` in placement units.
    pub placements: Vec<Placement>,
    /// Memory in GiB as `nvidia-smi mig -lgip` prints it (driver-dependent), when known.
    pub memory_gib_lgip: Option<f64>,
    /// Memory in MiB, when known.
    pub memory_mib: Option<u32>,
    /// Streaming multiprocessors, when known.
    pub sm_count: Option<u32>,
    /// Engine counts (`copy`, `nvdec`, `nvenc`, `jpeg`, `ofa`); `None` where unknown.
    #[serde(default)]
    pub engines: BTreeMap<String, Option<u32>>,
    /// Oldest driver branch that offers the profile, when it is newer than MIG itself.
    pub min_driver: Option<String>,
    /// Which values are exact and which derived, per group of fields.
    #[serde(default)]
    pub confidence: BTreeMap<String, String>,
    /// Free-form notes from the sources.
    #[serde(default)]
    pub notes: Vec<String>,
    /// Per engine of [`ENGINES`]: how many an instance takes (unknown counts as none).
    #[serde(skip)]
    pub engine_needs: [u8; ENGINES.len()],
}

/// The engine kinds a MIG instance may own, in the order of [`GpuModel::engine_limits`].
pub const ENGINES: [&str; 5] = ["copy", "nvdec", "nvenc", "jpeg", "ofa"];

/// Where an instance may sit: `size` placement units from `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(from = "[u8; 2]", into = "[u8; 2]")]
pub struct Placement {
    /// First placement unit.
    pub start: u8,
    /// Number of placement units.
    pub size: u8,
}

impl From<[u8; 2]> for Placement {
    fn from([start, size]: [u8; 2]) -> Self {
        Placement { start, size }
    }
}

impl From<Placement> for [u8; 2] {
    fn from(p: Placement) -> Self {
        [p.start, p.size]
    }
}

impl Placement {
    /// The units this placement covers.
    pub fn mask(self) -> UnitMask {
        units_mask(self.start, self.size)
    }

    /// One past the last unit.
    pub fn end(self) -> u8 {
        self.start + self.size
    }
}

/// The mask of `size` units from `start` (units past 16 are ignored; the catalog never has them).
pub fn units_mask(start: u8, size: u8) -> UnitMask {
    let bits: u32 = ((1u32 << size) - 1) << start;
    (bits & 0xFFFF) as UnitMask
}

impl GpuModel {
    /// Index of a profile by name, ignoring case and an `MIG ` prefix as `nvidia-smi` prints it.
    pub fn profile_index(&self, name: &str) -> Option<ProfileIdx> {
        // The name as the catalog spells it (how every stored instance and allocation names it): one comparison each.
        if let Some(i) = self.profiles.iter().position(|p| p.name == name) {
            return Some(i);
        }
        let name = name.trim();
        let name = name.strip_prefix("MIG ").unwrap_or(name);
        self.profiles.iter().position(|p| p.name.eq_ignore_ascii_case(name))
    }

    /// A profile by name (see [`GpuModel::profile_index`]).
    pub fn profile(&self, name: &str) -> Option<&Profile> {
        self.profile_index(name).map(|i| &self.profiles[i])
    }

    /// Mask of every placement unit of the GPU.
    pub fn all_units(&self) -> UnitMask {
        units_mask(0, self.placement_units_total)
    }

    /// Profile names, in catalog order.
    pub fn profile_names(&self) -> Vec<String> {
        self.profiles.iter().map(|p| p.name.clone()).collect()
    }

    /// Indexes of the `base` profiles (no media-engine or graphics variants).
    pub fn base_profiles(&self) -> impl Iterator<Item = ProfileIdx> + '_ {
        self.profiles.iter().enumerate().filter(|(_, p)| p.variant == "base").map(|(i, _)| i)
    }
}

impl Profile {
    /// The allowed start units.
    pub fn allowed_starts(&self) -> Vec<u8> {
        self.placements.iter().map(|p| p.start).collect()
    }

    /// The placement starting at `start`, if allowed.
    pub fn placement_at(&self, start: u8) -> Option<Placement> {
        self.placements.iter().copied().find(|p| p.start == start)
    }

    /// Placement width in units (the same for every placement of a profile in the catalog).
    pub fn size(&self) -> u8 {
        self.placements.first().map_or(0, |p| p.size)
    }

    /// The Kubernetes extended resource name the device plugin advertises with the `mixed` strategy.
    pub fn k8s_resource_name(&self) -> String {
        format!("nvidia.com/mig-{}", self.name)
    }
}
