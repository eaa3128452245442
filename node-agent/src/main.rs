//! `tessera-agent`: the node agent daemon (see the library docs).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use tessera_agent::agent::{self, Config, Transport};
use tessera_agent::backend::GpuBackend;
use tessera_agent::backend::nvml::NvmlBackend;
use tessera_agent::backend::sim::{Faults, SimBackend, SimNode, parse_gpus};
use tessera_agent::kube::{KubeApplier, KubeSettings};
use tessera_agent::telemetry::TelemetryConfig;
use tessera_core::Catalog;

/// Tessera node agent: applies the node's MIG layout and sharing config, reports status.
#[derive(Debug, Parser)]
#[command(name = "tessera-agent", version, about)]
struct Args {
    /// Resolve a GPU product name or PCI device id (as NVML reports it) to a catalog model and exit.
    #[arg(long, value_name = "NAME_OR_PCI_ID")]
    identify: Option<String>,
    /// Print the backend's inventory and one telemetry sample as JSON and exit (read-only: nothing is changed).
    #[arg(long)]
    inventory: bool,
    /// The Tessera server, e.g. https://tessera.example.com.
    #[arg(long, env = "TESSERA_SERVER")]
    server: Option<String>,
    /// A join token from an admin (`tessera node join-token`); needed the first time only.
    #[arg(long, env = "TESSERA_JOIN_TOKEN")]
    join_token: Option<String>,
    /// Where the node credential and the applied generation are kept.
    #[arg(long, env = "TESSERA_AGENT_STATE", default_value = "/var/lib/tessera-agent")]
    state_dir: PathBuf,
    /// GPU backend.
    #[arg(long, value_enum, default_value = "nvml")]
    backend: BackendKind,
    /// Simulated GPUs for `--backend sim`: MODEL:COUNT,..., e.g. H100-80GB:4,A100-40GB:2.
    #[arg(long, default_value = "H100-80GB:2")]
    sim_gpus: String,
    /// Host name to report (default: the machine's).
    #[arg(long, env = "TESSERA_NODE_NAME")]
    hostname: Option<String>,
    /// Simulated fault: creating this profile fails.
    #[arg(long)]
    sim_fail_create: Option<String>,
    /// Simulated fault: every create/destroy takes this many milliseconds.
    #[arg(long, default_value_t = 0)]
    sim_step_delay_ms: u64,
    /// Simulated fault: crash after this many create/destroy steps.
    #[arg(long)]
    sim_crash_after: Option<u32>,
    /// Seed of the simulated load (the same seed gives the same samples).
    #[arg(long, default_value_t = 0)]
    sim_seed: u64,
    /// Receive specs by long-polling only (no WebSocket).
    #[arg(long)]
    long_poll: bool,
    /// Telemetry: sample every GPU and MIG instance this often (ms); 0 turns telemetry off.
    #[arg(long, default_value_t = 1000)]
    telemetry_every_ms: u64,
    /// Telemetry: send a batch at most this often (ms); it goes right after the sample that makes it due.
    #[arg(long, default_value_t = 1000)]
    telemetry_batch_ms: u64,
    /// Telemetry: most samples kept while the server cannot be reached (the oldest are dropped and counted).
    #[arg(long, default_value_t = 200_000)]
    telemetry_buffer: usize,
    /// Put layouts and sharing in effect through GPU Operator (mig-parted config and node labels, device-plugin
    /// config) instead of NVML writes; the backend is only read.
    #[arg(long)]
    kube: bool,
    /// `--kube`: the API server's URL (default: in-cluster service account, else the kubeconfig's context).
    #[arg(long, env = "TESSERA_KUBE_API")]
    kube_api: Option<String>,
    /// `--kube`: this node's Kubernetes name (default: the host name reported to Tessera).
    #[arg(long, env = "NODE_NAME")]
    kube_node: Option<String>,
    /// `--kube`: namespace of the mig-parted and device-plugin ConfigMaps.
    #[arg(long, default_value = "gpu-operator")]
    kube_namespace: String,
    /// `--kube`: the mig-parted ConfigMap (ClusterPolicy `migManager.config.name`).
    #[arg(long, default_value = "tessera-mig-parted-config")]
    kube_mig_configmap: String,
    /// `--kube`: the device-plugin ConfigMap (ClusterPolicy `devicePlugin.config.name`).
    #[arg(long, default_value = "tessera-device-plugin-config")]
    kube_plugin_configmap: String,
    /// `--kube`: seconds mig-manager may take to apply a config.
    #[arg(long, default_value_t = 900)]
    kube_timeout_s: u64,
    /// The host's `/proc`, where who runs each GPU process is read (the agent needs the host's process namespace,
    /// or the host's `/proc` mounted here).
    #[arg(long, default_value = "/proc")]
    proc_root: std::path::PathBuf,
    /// The host's passwd file, for the user names of GPU processes.
    #[arg(long, default_value = "/etc/passwd")]
    passwd: std::path::PathBuf,
    /// The kubelet's pod-resources socket (read where it exists): which container each device was handed to.
    #[arg(long, default_value = "/var/lib/kubelet/pod-resources/kubelet.sock")]
    pod_resources_socket: std::path::PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum BackendKind {
    /// NVIDIA's management library (needs the driver).
    Nvml,
    /// Simulated GPUs.
    Sim,
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "node".to_string())
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(name) = &args.identify {
        return match Catalog::builtin().resolve(name) {
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
        };
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let server = match (&args.server, args.inventory) {
        (Some(s), _) => s.clone(),
        (None, true) => String::new(),
        (None, false) => {
            eprintln!("tessera-agent: --server URL is needed (or --identify NAME, or --inventory)");
            return ExitCode::from(2);
        }
    };
    let backend: Box<dyn GpuBackend> = match args.backend {
        BackendKind::Nvml => {
            let name = args.hostname.clone().unwrap_or_else(hostname);
            if let Err(e) = std::fs::create_dir_all(&args.state_dir) {
                eprintln!("tessera-agent: {}: {e}", args.state_dir.display());
                return ExitCode::from(1);
            }
            match NvmlBackend::new(&name, args.state_dir.clone()) {
                Ok(b) => Box::new(b),
                Err(e) => {
                    eprintln!("tessera-agent: {e}");
                    return ExitCode::from(2);
                }
            }
        }
        BackendKind::Sim => {
            let gpus = match parse_gpus(&args.sim_gpus) {
                Ok(g) => g,
                Err(e) => {
                    eprintln!("tessera-agent: --sim-gpus: {e}");
                    return ExitCode::from(2);
                }
            };
            let name = args.hostname.clone().unwrap_or_else(hostname);
            if let Err(e) = std::fs::create_dir_all(&args.state_dir) {
                eprintln!("tessera-agent: {}: {e}", args.state_dir.display());
                return ExitCode::from(1);
            }
            let sim = match SimBackend::with_file(args.state_dir.join("sim-gpus.json"), SimNode::new(&name, &gpus)) {
                Ok(b) => b,
                Err(e) => {
                    eprintln!("tessera-agent: {e}");
                    return ExitCode::from(1);
                }
            };
            {
                let handle = sim.handle();
                let mut node = handle.lock().unwrap_or_else(|e| e.into_inner());
                node.hostname = name;
                node.seed = args.sim_seed;
                node.faults = Faults {
                    fail_create: args.sim_fail_create.clone(),
                    step_delay_ms: args.sim_step_delay_ms,
                    crash_after_steps: args.sim_crash_after,
                };
            }
            Box::new(sim)
        }
    };
    let identifier = |kube: Option<KubeApplier>| tessera_agent::attribution::Identifier {
        proc_root: args.proc_root.clone(),
        passwd: args.passwd.clone(),
        pod_resources: args.pod_resources_socket.exists().then(|| args.pod_resources_socket.clone()),
        kube,
        timeout: Duration::from_secs(5),
    };
    if args.inventory {
        let identifier = backend.host_pids().then(|| identifier(None));
        return print_inventory(backend, identifier);
    }
    let mut config = Config::new(&server, args.join_token.clone(), args.state_dir.clone());
    if args.long_poll {
        config.transport = Transport::LongPoll;
    }
    config.telemetry = (args.telemetry_every_ms > 0).then(|| TelemetryConfig {
        every: Duration::from_millis(args.telemetry_every_ms),
        batch_every: Duration::from_millis(args.telemetry_batch_ms.max(args.telemetry_every_ms)),
        buffer: args.telemetry_buffer,
        ..TelemetryConfig::default()
    });
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tessera-agent: {e}");
            return ExitCode::from(1);
        }
    };
    if args.kube {
        let node = args.kube_node.clone().or_else(|| args.hostname.clone()).unwrap_or_else(hostname);
        let mut settings = KubeSettings::new(&node);
        settings.namespace = args.kube_namespace.clone();
        settings.mig_configmap = args.kube_mig_configmap.clone();
        settings.plugin_configmap = args.kube_plugin_configmap.clone();
        settings.timeout = Duration::from_secs(args.kube_timeout_s);
        match runtime.block_on(KubeApplier::connect(args.kube_api.as_deref(), settings)) {
            Ok(applier) => config.kube = Some(applier),
            Err(e) => {
                eprintln!("tessera-agent: --kube: {e}");
                return ExitCode::from(2);
            }
        }
    }
    if backend.host_pids() {
        config.attribution = Some(identifier(config.kube.clone()));
    }
    match runtime.block_on(agent::run(config, backend)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(agent::AgentError::Crashed(c)) => {
            eprintln!("tessera-agent: {c}");
            ExitCode::from(70)
        }
        Err(e) => {
            eprintln!("tessera-agent: {e}");
            ExitCode::from(1)
        }
    }
}

/// `--inventory`: what the backend sees, one sample a second after another (GPM needs two), and each GPU's health
/// with the judgement the server would make of it.
fn print_inventory(
    mut backend: Box<dyn GpuBackend>,
    identifier: Option<tessera_agent::attribution::Identifier>,
) -> ExitCode {
    let inventory = match backend.inventory() {
        Ok(i) => i,
        Err(e) => {
            eprintln!("tessera-agent: {e}");
            return ExitCode::from(1);
        }
    };
    let now = agent::now_ms;
    let _ = backend.sample(now(), &[]);
    std::thread::sleep(Duration::from_secs(1));
    let readings = match backend.sample(now(), &[]) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tessera-agent: {e}");
            return ExitCode::from(1);
        }
    };
    let batch = tessera_agent::telemetry::batch(&readings, 0);
    let health: Vec<serde_json::Value> = backend
        .health()
        .into_iter()
        .map(|(uuid, report)| {
            let (state, findings) = tessera_core::health::judge(&report, 0, agent::now_ms());
            serde_json::json!({ "uuid": uuid, "report": report, "state": state, "findings": findings })
        })
        .collect();
    let mut processes = backend.processes();
    if let Some(identifier) = identifier
        && let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build()
    {
        runtime.block_on(identifier.identify(&mut processes));
    }
    let out = serde_json::json!({
        "inventory": inventory,
        "telemetry": batch,
        "health": health,
        "processes": processes,
    });
    #[allow(clippy::print_stdout)]
    {
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    }
    ExitCode::SUCCESS
}
