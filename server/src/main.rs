//! The `tessera` binary: parses the command line and runs the command.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = tessera_server::cli::Cli::parse();
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    let code = tessera_server::cli::run(cli, &mut stdout.lock(), &mut stderr.lock());
    ExitCode::from(code)
}
