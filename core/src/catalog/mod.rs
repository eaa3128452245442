//! The GPU catalog: every MIG-capable GPU model Tessera knows, with its GPU instance profiles and the exact placements
//! the driver accepts for each.
//!
//! The data is embedded from `core/data/mig-profiles.json` (compiled from NVIDIA's MIG user guide, `nvidia-smi mig
//! -lgip/-lgipp` outputs and NVIDIA's go-nvml/go-nvlib sources). Each model and profile carries a `confidence` record
//! saying which values are exact and which are derived, so that a caller (and a person reading the portal) can tell a
//! documented placement from an inferred one. What a real GPU reports wins over this file.
//!
//! Placements are in NVML placement units (`nvmlGpuInstancePlacement_t`): 8 units on A100/H100/H200/B200, 4 on A30,
//! 12 on RTX PRO 6000 Blackwell (where a 1g instance is 3 units wide).

pub mod model;

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

pub use model::*;

/// The embedded catalog data, as shipped.
pub const CATALOG_JSON: &str = include_str!("../../data/mig-profiles.json");

/// The set of GPU models Tessera can place MIG instances on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Catalog {
    /// Data format, `mig-profiles/v1`.
    pub schema: String,
    /// When and from what the data was compiled.
    pub compiled: String,
    /// GPU models, in catalog order.
    pub models: Vec<GpuModel>,
}

/// How a lookup string was matched, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchedBy {
    /// The model key (`H100-80GB`).
    Key,
    /// A product name (`NVIDIA H100 80GB HBM3`).
    ProductName,
    /// A PCI device id (`0x233010DE`).
    PciDeviceId,
}

/// Product names NVML reports that the source data does not spell out (it lists marketing or `-lgip` names).
/// Each maps a name exactly as `nvmlDeviceGetName` returns it to a model key.
const NVML_NAME_ALIASES: &[(&str, &str)] = &[
    ("NVIDIA A30", "A30-24GB"),
    ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
    ("NVIDIA A100-PCIE-40GB", "A100-40GB"),
    ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
    ("NVIDIA A100 80GB PCIe", "A100-80GB"),
    ("NVIDIA A800-SXM4-80GB", "A100-80GB"),
    ("NVIDIA H100 80GB HBM3", "H100-80GB"),
    ("NVIDIA H100 PCIe", "H100-80GB"),
    ("NVIDIA H800", "H100-80GB"),
    ("NVIDIA H100 NVL", "H100-94GB"),
    ("NVIDIA GH200 480GB", "GH200-96GB"),
    ("NVIDIA H20", "GH200-96GB"),
    ("NVIDIA GH200 144G HBM3e", "GH200-144GB"),
    ("NVIDIA H200", "H200-141GB"),
    ("NVIDIA H200 NVL", "H200-141GB"),
    ("NVIDIA B200", "B200-180GB"),
];

/// Reduces a product name to comparable tokens: upper case, a leading `NVIDIA` dropped, any run of
/// non-alphanumerics one space. `NVIDIA H100 80GB HBM3` and `h100-80gb-hbm3` compare equal.
fn normalize_product(name: &str) -> String {
    let upper = name.trim().to_ascii_uppercase();
    let tokens: Vec<&str> = upper.split(|c: char| !c.is_ascii_alphanumeric()).filter(|t| !t.is_empty()).collect();
    let tokens = match tokens.first() {
        Some(&"NVIDIA") => &tokens[1..],
        _ => &tokens[..],
    };
    tokens.join(" ")
}

/// Every normalized name a catalog product string stands for: the whole string, and for `OUTER (INNER)` both
/// parts (the data writes `H100-SXM5-80GB (NVIDIA H100 80GB HBM3)`).
fn product_names(product: &str) -> Vec<String> {
    let mut names = vec![normalize_product(product)];
    if let (Some(open), Some(close)) = (product.find('('), product.rfind(')'))
        && open < close
    {
        names.push(normalize_product(&product[open + 1..close]));
        let outer = format!("{}{}", &product[..open], &product[close + 1..]);
        names.push(normalize_product(&outer));
    }
    names
}

/// Parses a PCI device id in the forms NVML and `lspci` print: `0x233010DE`, `233010de`, `10de:2330`.
pub fn parse_pci_device_id(text: &str) -> Option<u32> {
    let t = text.trim();
    if let Some((vendor, device)) = t.split_once(':') {
        let vendor = u32::from_str_radix(vendor.trim_start_matches("0x"), 16).ok()?;
        let device = u32::from_str_radix(device.trim_start_matches("0x"), 16).ok()?;
        return (vendor <= 0xFFFF && device <= 0xFFFF).then_some((device << 16) | vendor);
    }
    let hex = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")).unwrap_or(t);
    if hex.len() != 8 {
        return None;
    }
    u32::from_str_radix(hex, 16).ok()
}

impl Catalog {
    /// The catalog embedded in this build. Parsed once.
    pub fn builtin() -> &'static Catalog {
        static CATALOG: OnceLock<Catalog> = OnceLock::new();
        CATALOG.get_or_init(|| {
            // The embedded file is part of the build and checked by tests; failing here is a build defect.
            #[allow(clippy::expect_used)]
            Catalog::from_json(CATALOG_JSON).expect("embedded mig-profiles.json is valid")
        })
    }

    /// Parses catalog data and checks that it is internally consistent.
    pub fn from_json(text: &str) -> Result<Catalog, CatalogError> {
        let mut catalog: Catalog = serde_json::from_str(text).map_err(|e| CatalogError::Parse(e.to_string()))?;
        catalog.check()?;
        for m in &mut catalog.models {
            m.derive_engine_limits();
        }
        Ok(catalog)
    }

    fn check(&self) -> Result<(), CatalogError> {
        for m in &self.models {
            if m.placement_units_total == 0 || m.placement_units_total > 16 {
                return Err(CatalogError::Inconsistent(format!(
                    "{}: placement units {} out of 1..=16",
                    m.key, m.placement_units_total
                )));
            }
            if m.profiles.len() > MAX_PROFILES {
                return Err(CatalogError::Inconsistent(format!(
                    "{}: {} profiles, more than the {} supported",
                    m.key,
                    m.profiles.len(),
                    MAX_PROFILES
                )));
            }
            for p in &m.profiles {
                if p.placements.is_empty() {
                    return Err(CatalogError::Inconsistent(format!("{}: {} has no placements", m.key, p.name)));
                }
                for pl in &p.placements {
                    if pl.size == 0 || u16::from(pl.start) + u16::from(pl.size) > u16::from(m.placement_units_total) {
                        return Err(CatalogError::Inconsistent(format!(
                            "{}: {} placement {}:{} outside {} units",
                            m.key, p.name, pl.start, pl.size, m.placement_units_total
                        )));
                    }
                }
                if p.placements.iter().any(|pl| pl.size != p.placements[0].size) {
                    return Err(CatalogError::Inconsistent(format!(
                        "{}: {} has placements of different sizes",
                        m.key, p.name
                    )));
                }
                if p.compute_slices == 0 || p.compute_slices > m.compute_slices_total || p.max_instances == 0 {
                    return Err(CatalogError::Inconsistent(format!("{}: {} has bad slice counts", m.key, p.name)));
                }
            }
        }
        Ok(())
    }

    /// Looks a model up by key (case-insensitive), product name as NVML reports it, or PCI device id.
    pub fn resolve(&self, text: &str) -> Option<(&GpuModel, MatchedBy)> {
        if let Some(m) = self.model(text) {
            return Some((m, MatchedBy::Key));
        }
        if let Some(m) = self.model_by_product(text) {
            return Some((m, MatchedBy::ProductName));
        }
        parse_pci_device_id(text).and_then(|id| self.model_by_pci_id(id)).map(|m| (m, MatchedBy::PciDeviceId))
    }

    /// Looks a model up by its key, ignoring case (`h100-80gb` finds `H100-80GB`).
    pub fn model(&self, key: &str) -> Option<&GpuModel> {
        self.models.iter().find(|m| m.key.eq_ignore_ascii_case(key.trim()))
    }

    /// Looks a model up by product name, as NVML (`nvmlDeviceGetName`) or the catalog spells it.
    pub fn model_by_product(&self, name: &str) -> Option<&GpuModel> {
        let wanted = normalize_product(name);
        if wanted.is_empty() {
            return None;
        }
        if let Some((_, key)) = NVML_NAME_ALIASES.iter().find(|(alias, _)| normalize_product(alias) == wanted) {
            return self.model(key);
        }
        self.models.iter().find(|m| m.products.iter().any(|p| product_names(p).contains(&wanted)))
    }

    /// Looks a model up by PCI device id as NVML reports it (`pciDeviceId`: device << 16 | vendor).
    pub fn model_by_pci_id(&self, id: u32) -> Option<&GpuModel> {
        self.models.iter().find(|m| m.pci_device_ids.iter().any(|p| parse_pci_device_id(p) == Some(id)))
    }

    /// The keys of every model, in catalog order.
    pub fn keys(&self) -> Vec<&str> {
        self.models.iter().map(|m| m.key.as_str()).collect()
    }
}

impl GpuModel {
    /// Fills the derived engine fields. A GPU's engines are those of its whole-GPU profile (the base profile with
    /// all compute slices); instances may not together own more of an engine than that. The limit is enforced only
    /// where every maximal layout of base profiles respects it: where the catalog's own counts contradict it (as
    /// for B200, whose whole-GPU NVDEC count equals one 1g instance's), the engine is left unchecked rather than
    /// rejecting layouts the driver accepts.
    fn derive_engine_limits(&mut self) {
        for p in &mut self.profiles {
            for (k, e) in ENGINES.iter().enumerate() {
                p.engine_needs[k] = p.engines.get(*e).copied().flatten().map_or(0, |n| n.min(255) as u8);
            }
        }
        let whole = self
            .profiles
            .iter()
            .filter(|p| p.compute_slices == self.compute_slices_total)
            .min_by_key(|p| p.variant != "base");
        let Some(whole) = whole else { return };
        let mut limits = [None; ENGINES.len()];
        for (k, e) in ENGINES.iter().enumerate() {
            limits[k] = whole.engines.get(*e).copied().flatten().map(|n| n.min(255) as u8);
        }
        let base: Vec<ProfileIdx> = self.base_profiles().collect();
        for layout in crate::layout::maximal_layouts(self, Some(&base)) {
            for (k, limit) in limits.iter_mut().enumerate() {
                let used: u32 = layout.iter().map(|i| u32::from(self.profiles[i.profile].engine_needs[k])).sum();
                if limit.is_some_and(|l| used > u32::from(l)) {
                    *limit = None;
                }
            }
        }
        self.engine_limits = limits;
    }
}

/// Problems with catalog data.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    /// The data is not valid JSON of the expected shape.
    #[error("catalog data does not parse: {0}")]
    Parse(String),
    /// The data parses but contradicts itself.
    #[error("catalog data is inconsistent: {0}")]
    Inconsistent(String),
}
