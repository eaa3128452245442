//! Command-line interface of the `tessera` binary.
//!
//! Commands write to the writers they are given and return the process exit code, so tests run them in-process:
//! 0 success, 1 a negative answer (an invalid layout), 2 bad input or usage.

mod api;
mod backup;
mod client;
mod cluster;
mod error;
mod mig;
mod quota;
mod reservation;
mod table;
mod user;

use std::io::Write;

use clap::{Parser, Subcommand};

pub use error::{CliError, EXIT_NO, EXIT_OK, EXIT_USAGE};

/// Tessera: self-service GPU slices (MIG, time-slicing, MPS) with quotas and approvals.
#[derive(Debug, Parser)]
#[command(name = "tessera", version, about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// MIG catalog, layout validation and placement planning.
    #[command(subcommand)]
    Mig(mig::MigCommand),
    /// Run the control plane: the REST API on `--listen`, data in `--database-url` (a SQLite file in `--data-dir` by
    /// default). On first start a platform admin `admin` is created; its token is printed once.
    Serve {
        /// Address to listen on [default: 127.0.0.1:8080].
        #[arg(long, env = "TESSERA_LISTEN")]
        listen: Option<String>,
        /// Where the embedded SQLite database lives [default: $XDG_DATA_HOME/tessera or ~/.local/share/tessera].
        #[arg(long, env = "TESSERA_DATA_DIR")]
        data_dir: Option<std::path::PathBuf>,
        /// `sqlite://PATH` or `postgres://...` [default: sqlite://<data-dir>/tessera.db].
        #[arg(long, env = "TESSERA_DATABASE_URL")]
        database_url: Option<String>,
        /// Register a simulated node with GPUs of several models, to try Tessera without GPUs.
        #[arg(long)]
        demo: bool,
        /// A TOML file with any of `listen`, `data_dir`, `database_url`, `demo` (flags and TESSERA_* win).
        #[arg(long, env = "TESSERA_CONFIG")]
        config: Option<std::path::PathBuf>,
    },
    /// Print the OpenAPI description of the REST API.
    Openapi,
    /// Slice requests on a running server (create, list, get, approve, reject, cancel).
    Request {
        #[command(flatten)]
        conn: api::Connection,
        #[command(subcommand)]
        cmd: client::RequestCommand,
    },
    /// Quota requests on a running server: ask for limits, grant or refuse them, the history of limits.
    Quota {
        #[command(flatten)]
        conn: api::Connection,
        #[command(subcommand)]
        cmd: quota::QuotaCommand,
    },
    /// Reservations on a running server: book slices for a window ahead, preview, list, accept, reject, cancel.
    Reservation {
        #[command(flatten)]
        conn: api::Connection,
        #[command(subcommand)]
        cmd: reservation::ReservationCommand,
    },
    /// Kubernetes clusters on a running server: register them, give tenants namespaces in them, put nodes in them.
    Cluster {
        #[command(flatten)]
        conn: api::Connection,
        #[command(subcommand)]
        cmd: cluster::ClusterCommand,
    },
    /// Nodes on a running server: join tokens for node agents, the node list.
    Node {
        #[command(flatten)]
        conn: api::Connection,
        #[command(subcommand)]
        cmd: client::NodeCommand,
    },
    /// A user's sign-in, on the server's host: a one-time sign-in link, or a password.
    User {
        #[command(flatten)]
        place: user::Place,
        #[command(subcommand)]
        cmd: user::UserCommand,
    },
    /// Write a consistent copy of the SQLite database to `--out` while the server runs (PostgreSQL: `pg_dump`).
    Backup {
        #[command(flatten)]
        place: backup::Place,
        /// The backup file to write (it must not exist).
        #[arg(long)]
        out: std::path::PathBuf,
    },
    /// Put a backup back into an empty data dir, migrated to this release's schema; a backup of a newer release is
    /// refused.
    Restore {
        #[command(flatten)]
        place: backup::Place,
        /// The backup file (`tessera backup --out`).
        file: std::path::PathBuf,
    },
    /// Create or upgrade the database schema.
    Migrate {
        /// `sqlite://PATH` (created if missing) or `postgres://...`.
        #[arg(long, env = "TESSERA_DATABASE_URL")]
        database_url: String,
    },
}

/// Runs a parsed command line.
pub fn run(cli: Cli, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    let result = match cli.command {
        Command::Mig(cmd) => mig::run(cmd, out),
        Command::Migrate { database_url } => migrate(&database_url, out),
        Command::Backup { place, out: file } => backup::backup(place, file, out),
        Command::Restore { place, file } => backup::restore(place, file, out),
        Command::Serve { listen, data_dir, database_url, demo, config } => {
            let file = match config {
                Some(path) => crate::config::load(&path).map_err(CliError::BadInput),
                None => Ok(crate::config::FileConfig::default()),
            };
            file.and_then(|file| {
                let flags = crate::config::Overrides { listen, data_dir, database_url, demo };
                let settings = crate::config::resolve(flags, file, crate::config::process_env);
                settings.map_err(CliError::BadInput).and_then(|settings| serve(settings, out))
            })
        }
        Command::Openapi => openapi(out),
        Command::Request { conn, cmd } => client::run(conn, client::ApiCommand::Request(cmd), out),
        Command::Node { conn, cmd } => client::run(conn, client::ApiCommand::Node(cmd), out),
        Command::Quota { conn, cmd } => client::run(conn, client::ApiCommand::Quota(cmd), out),
        Command::Reservation { conn, cmd } => client::run(conn, client::ApiCommand::Reservation(cmd), out),
        Command::Cluster { conn, cmd } => client::run(conn, client::ApiCommand::Cluster(cmd), out),
        Command::User { place, cmd } => user::run(place, cmd, &mut std::io::stdin().lock(), out),
    };
    match result {
        Ok(code) => code,
        // The reader went away (`| head`): nothing more to say.
        Err(CliError::Io(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => EXIT_NO,
        Err(e) => {
            // Writing the error is best effort: stderr may be closed.
            let _ = writeln!(err, "error: {e}");
            e.exit_code()
        }
    }
}

fn migrate(url: &str, out: &mut dyn Write) -> Result<u8, CliError> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let backend = runtime
        .block_on(async {
            let store = tessera_store::Store::connect(url).await?;
            store.migrate().await?;
            Ok::<_, tessera_store::StoreError>(store.backend())
        })
        .map_err(|e| CliError::BadInput(format!("cannot migrate {}: {e}", tessera_services::redact::url(url))))?;
    writeln!(out, "{backend} database is up to date")?;
    Ok(EXIT_OK)
}

fn openapi(out: &mut dyn Write) -> Result<u8, CliError> {
    let text = tessera_http::openapi().to_pretty_json().map_err(|e| CliError::BadInput(e.to_string()))?;
    writeln!(out, "{text}")?;
    Ok(EXIT_OK)
}

fn serve(settings: crate::serve::Settings, out: &mut dyn Write) -> Result<u8, CliError> {
    let (listen, data_dir, url, demo) =
        (settings.listen.clone(), settings.data_dir.clone(), settings.database_url.clone(), settings.demo);
    let listen = listen.as_str();
    if url.starts_with("sqlite:") {
        tessera_services::sealed::private_dir(&data_dir).map_err(|e| CliError::BadInput(format!("data dir: {e}")))?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let (state, token) = crate::serve::prepare(&settings)
            .await
            .map_err(|e| CliError::BadInput(format!("{}: {e}", tessera_services::redact::url(&url))))?;
        if let Some(token) = token {
            writeln!(out, "Created platform admin `admin`. Its API token, shown only this once:\n\n    {token}\n")?;
        }
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|e| CliError::BadInput(format!("cannot listen on {listen}: {e}")))?;
        let addr = listener.local_addr()?;
        writeln!(out, "Tessera listening on http://{addr}")?;
        if demo {
            crate::demo::start(&state, addr, &data_dir).await.map_err(CliError::BadInput)?;
            writeln!(
                out,
                "Demo: simulated agents `{}` and `{}` are joining; tenants `vision` and `llm-serving` get slices.",
                crate::demo::DEMO_NODE,
                crate::demo::SECOND_NODE
            )?;
        }
        let links = crate::serve::start_links(&state, demo).await.map_err(|e| CliError::BadInput(e.to_string()))?;
        if !links.is_empty() {
            let base = tessera_services::auth::links::base_for(addr);
            writeln!(out, "\nOpen the portal with a one-time sign-in link (each works once, for an hour):")?;
            for (name, link) in &links {
                writeln!(out, "    as {name:<6} {}", link.url(&base))?;
            }
            writeln!(
                out,
                "A new link: `tessera user sign-in-link NAME`; a password: `tessera user set-password NAME`.\n"
            )?;
        }
        out.flush()?;
        // SIGTERM is what Kubernetes, Docker and systemd stop a process with; SIGINT is Ctrl-C.
        let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let shutdown = async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
        };
        crate::serve::serve(state, listener, shutdown).await.map_err(|e| CliError::BadInput(e.to_string()))?;
        Ok(EXIT_OK)
    })
}
