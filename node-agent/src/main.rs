//! `tessera-agent`: the node agent. It will receive the node's desired MIG layout and sharing config from the
//! server, apply it through NVML or the GPU Operator, and stream telemetry back. This build only identifies GPU
//! models against the catalog; the daemon itself is not part of it yet.

use std::process::ExitCode;

use clap::Parser;
use tessera_core::Catalog;

/// Tessera node agent.
#[derive(Debug, Parser)]
#[command(name = "tessera-agent", version, about)]
struct Args {
    /// Resolve a GPU product name or PCI device id (as NVML reports it) to a catalog model and exit.
    #[arg(long, value_name = "NAME_OR_PCI_ID")]
    identify: Option<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match args.identify {
        Some(name) => match Catalog::builtin().resolve(&name) {
            Some((model, _)) => {
                #[allow(clippy::print_stdout)]
                {
                    println!("{}", model.key);
                }
                ExitCode::SUCCESS
            }
            None => {
                eprintln!("tessera-agent: `{name}` is not a MIG-capable GPU model in the catalog");
                ExitCode::from(1)
            }
        },
        None => {
            eprintln!("tessera-agent: the node agent daemon is not available in this build; see `--help`");
            ExitCode::from(2)
        }
    }
}
