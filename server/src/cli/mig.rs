//! `tessera mig`: the MIG catalog, layout validation and placement planning from the command line.

use std::io::{Read, Write};
use std::path::PathBuf;

use clap::Subcommand;
use serde_json::json;
use tessera_core::catalog::{Catalog, GpuModel, Profile};
use tessera_core::layout::{InstanceSpec, PlacedInstance, maximal_layouts, to_placed, validate};
use tessera_core::planner::{self, PlanInput};

use super::error::{CliError, EXIT_NO, EXIT_OK};
use super::table::write_table;

#[derive(Debug, Subcommand)]
pub enum MigCommand {
    /// List the GPU models in the catalog.
    Models {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// List a model's GPU instance profiles and their allowed placements.
    Profiles {
        /// Model key (H100-80GB), product name (NVIDIA H100 80GB HBM3) or PCI device id (0x233010DE).
        #[arg(long, short)]
        model: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// List every maximal layout of a model: those to which no instance can be added.
    Layouts {
        /// Model key, product name or PCI device id.
        #[arg(long, short)]
        model: String,
        /// Include media-engine and graphics variants (+me, -me, +gfx); by default only base profiles.
        #[arg(long)]
        all_variants: bool,
        /// Print JSON instead of one layout per line.
        #[arg(long)]
        json: bool,
    },
    /// Check a layout; exit 0 and print it placed when valid, exit 1 and print every problem when not.
    Validate {
        /// Model key, product name or PCI device id.
        #[arg(long, short)]
        model: String,
        /// Instances as PROFILE or PROFILE@START, e.g. 3g.40gb@4 1g.10gb.
        #[arg(required = true, value_name = "PROFILE[@START]")]
        instances: Vec<String>,
        /// Print JSON: {"valid", "instances", "errors"}.
        #[arg(long)]
        json: bool,
    },
    /// Plan demand onto GPUs and print the plan as JSON.
    Plan {
        /// Plan input as JSON ({"gpus": [...], "demand": [...]}); `-` reads standard input.
        #[arg(long, short)]
        input: PathBuf,
    },
}

pub fn run(cmd: MigCommand, out: &mut dyn Write) -> Result<u8, CliError> {
    let catalog = Catalog::builtin();
    match cmd {
        MigCommand::Models { json } => models(catalog, json, out),
        MigCommand::Profiles { model, json } => profiles(resolve(catalog, &model)?, json, out),
        MigCommand::Layouts { model, all_variants, json } => {
            layouts(resolve(catalog, &model)?, all_variants, json, out)
        }
        MigCommand::Validate { model, instances, json } => {
            let model = resolve(catalog, &model)?;
            let specs = instances
                .iter()
                .map(|s| s.parse::<InstanceSpec>())
                .collect::<Result<Vec<_>, _>>()
                .map_err(CliError::BadInput)?;
            validate_cmd(model, &specs, json, out)
        }
        MigCommand::Plan { input } => plan(catalog, &input, out),
    }
}

fn resolve<'c>(catalog: &'c Catalog, text: &str) -> Result<&'c GpuModel, CliError> {
    catalog.resolve(text).map(|(m, _)| m).ok_or_else(|| {
        CliError::BadInput(format!("unknown GPU model `{text}`; known models: {}", catalog.keys().join(", ")))
    })
}

/// One word for a record of confidences: the weakest claim in it.
fn confidence_word<'a>(values: impl IntoIterator<Item = &'a String>) -> &'static str {
    let all: Vec<&String> = values.into_iter().collect();
    if all.iter().any(|v| v.contains("uncertain")) {
        "uncertain"
    } else if all.iter().any(|v| v.contains("derived")) {
        "partly derived"
    } else {
        "exact"
    }
}

fn models(catalog: &Catalog, json: bool, out: &mut dyn Write) -> Result<u8, CliError> {
    if json {
        let list: Vec<_> = catalog
            .models
            .iter()
            .map(|m| {
                json!({
                    "key": m.key,
                    "products": m.products,
                    "pci_device_ids": m.pci_device_ids,
                    "architecture": m.architecture,
                    "compute_slices_total": m.compute_slices_total,
                    "memory_slices_total": m.memory_slices_total,
                    "placement_units_total": m.placement_units_total,
                    "total_memory_gb_nominal": m.total_memory_gb_nominal,
                    "profiles": m.profile_names(),
                    "confidence": m.confidence,
                })
            })
            .collect();
        serde_json::to_writer_pretty(&mut *out, &list).map_err(std::io::Error::from)?;
        writeln!(out)?;
        return Ok(EXIT_OK);
    }
    let rows: Vec<Vec<String>> = catalog
        .models
        .iter()
        .map(|m| {
            vec![
                m.key.clone(),
                m.architecture.clone(),
                format!("{}", m.compute_slices_total),
                format!("{}", m.memory_slices_total),
                format!("{}", m.placement_units_total),
                format!("{}", m.total_memory_gb_nominal),
                format!("{}", m.profiles.len()),
                confidence_word(m.profiles.iter().flat_map(|p| p.confidence.values()).chain([&m.confidence])).into(),
            ]
        })
        .collect();
    write_table(out, &["MODEL", "ARCHITECTURE", "COMPUTE", "MEMORY", "UNITS", "GB", "PROFILES", "CONFIDENCE"], &rows)?;
    Ok(EXIT_OK)
}

fn placements(p: &Profile) -> String {
    let starts: Vec<String> = p.placements.iter().map(|pl| pl.start.to_string()).collect();
    format!("{{{}}}:{}", starts.join(","), p.size())
}

fn profiles(model: &GpuModel, json: bool, out: &mut dyn Write) -> Result<u8, CliError> {
    if json {
        serde_json::to_writer_pretty(&mut *out, &json!({"model": model.key, "profiles": model.profiles}))
            .map_err(std::io::Error::from)?;
        writeln!(out)?;
        return Ok(EXIT_OK);
    }
    writeln!(
        out,
        "{} ({}): {} compute slices, {} memory slices, {} placement units",
        model.key,
        model.architecture,
        model.compute_slices_total,
        model.memory_slices_total,
        model.placement_units_total
    )?;
    let rows: Vec<Vec<String>> = model
        .profiles
        .iter()
        .map(|p| {
            vec![
                p.name.clone(),
                p.smi_profile_id.to_string(),
                p.compute_slices.to_string(),
                p.memory_slices.to_string(),
                p.max_instances.to_string(),
                placements(p),
                p.memory_mib.map_or("?".into(), |m| m.to_string()),
                p.min_driver.clone().unwrap_or_default(),
                confidence_word(p.confidence.values()).into(),
            ]
        })
        .collect();
    write_table(
        out,
        &["PROFILE", "ID", "COMPUTE", "MEMORY", "MAX", "PLACEMENTS", "MIB", "MIN DRIVER", "CONFIDENCE"],
        &rows,
    )?;
    Ok(EXIT_OK)
}

fn layouts(model: &GpuModel, all_variants: bool, json: bool, out: &mut dyn Write) -> Result<u8, CliError> {
    let base: Vec<usize> = model.base_profiles().collect();
    let all = maximal_layouts(model, if all_variants { None } else { Some(&base) });
    let placed: Vec<Vec<PlacedInstance>> =
        all.iter().map(|l| l.iter().map(|&i| to_placed(model, i)).collect()).collect();
    if json {
        serde_json::to_writer_pretty(&mut *out, &json!({"model": model.key, "layouts": placed}))
            .map_err(std::io::Error::from)?;
        writeln!(out)?;
        return Ok(EXIT_OK);
    }
    let kind = if all_variants { "all profiles" } else { "base profiles" };
    writeln!(out, "{}: {} maximal layouts ({kind})", model.key, placed.len())?;
    for layout in &placed {
        let items: Vec<String> = layout.iter().map(|i| format!("{}@{}", i.profile, i.start)).collect();
        writeln!(out, "  {}", items.join(" "))?;
    }
    Ok(EXIT_OK)
}

fn validate_cmd(model: &GpuModel, specs: &[InstanceSpec], json: bool, out: &mut dyn Write) -> Result<u8, CliError> {
    let result = validate(model, specs);
    if json {
        let body = match &result {
            Ok(placed) => json!({"valid": true, "instances": placed, "errors": []}),
            Err(errors) => json!({
                "valid": false,
                "instances": [],
                "errors": errors.iter().map(|e| e.problem()).collect::<Vec<_>>(),
            }),
        };
        serde_json::to_writer_pretty(&mut *out, &body).map_err(std::io::Error::from)?;
        writeln!(out)?;
    } else {
        match &result {
            Ok(placed) => {
                writeln!(out, "valid layout on {}:", model.key)?;
                write_units(model, placed, out)?;
            }
            Err(errors) => {
                let n = errors.len();
                writeln!(out, "invalid layout on {}: {n} problem{}", model.key, if n == 1 { "" } else { "s" })?;
                for e in errors {
                    writeln!(out, "  [{}] {e}", e.code())?;
                }
            }
        }
    }
    Ok(if result.is_ok() { EXIT_OK } else { EXIT_NO })
}

/// Draws the placement units with a letter per instance, then the legend.
fn write_units(model: &GpuModel, placed: &[PlacedInstance], out: &mut dyn Write) -> std::io::Result<()> {
    let units = usize::from(model.placement_units_total);
    let mut cells = vec!['.'; units];
    for (k, inst) in placed.iter().enumerate() {
        let letter = char::from(b'A' + (k % 26) as u8);
        let size = model.profile(&inst.profile).map_or(0, Profile::size);
        let start = usize::from(inst.start).min(units);
        let end = (start + usize::from(size)).min(units);
        cells[start..end].fill(letter);
    }
    let header: Vec<String> = (0..units).map(|u| format!("{u:>2}")).collect();
    let row: Vec<String> = cells.iter().map(|c| format!("{c:>2}")).collect();
    writeln!(out, "  unit  {}", header.join(""))?;
    writeln!(out, "        {}", row.join(""))?;
    for (k, inst) in placed.iter().enumerate() {
        writeln!(out, "  {}  {}@{}", char::from(b'A' + (k % 26) as u8), inst.profile, inst.start)?;
    }
    Ok(())
}

fn plan(catalog: &Catalog, path: &std::path::Path, out: &mut dyn Write) -> Result<u8, CliError> {
    let text = if path.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).map_err(|e| CliError::BadInput(format!("cannot read stdin: {e}")))?;
        s
    } else {
        std::fs::read_to_string(path).map_err(|e| CliError::BadInput(format!("cannot read {}: {e}", path.display())))?
    };
    let input: PlanInput =
        serde_json::from_str(&text).map_err(|e| CliError::BadInput(format!("plan input is not valid: {e}")))?;
    let plan = planner::plan(catalog, &input).map_err(|e| CliError::BadInput(format!("[{}] {e}", e.code())))?;
    serde_json::to_writer_pretty(&mut *out, &plan).map_err(std::io::Error::from)?;
    writeln!(out)?;
    // A plan that leaves demand unplaced is still a plan: it says what and why.
    Ok(EXIT_OK)
}
