//! The `tessera` binary: parses the command line and runs the command.

use std::process::ExitCode;

use clap::Parser;

/// The log filter without `TESSERA_LOG`: warnings from everything, and what the server's own layers say at info.
const DEFAULT_LOG: &str = "warn,tessera_server=info,tessera_http=info,tessera_services=info,tessera_store=info";

fn main() -> ExitCode {
    let cli = tessera_server::cli::Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TESSERA_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG)),
        )
        .with_writer(std::io::stderr)
        .init();
    // Unlocked handles: each write takes the lock for that write only. Holding `stderr.lock()` for the whole run
    // would block every tokio worker at its first log line (tracing writes to stderr from those threads).
    let code = tessera_server::cli::run(cli, &mut std::io::stdout(), &mut std::io::stderr());
    ExitCode::from(code)
}
