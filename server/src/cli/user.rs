//! `tessera user`: what an operator on the server's host does to a user's sign-in, straight on the database (no
//! token needed): a one-time sign-in link, or a password.

use std::io::{BufRead, Write};

use clap::{Args, Subcommand};

use super::error::{CliError, EXIT_NO, EXIT_OK};
use tessera_services::auth::links::{PRINTED_LINK_TTL_MS, base_for, issue};
use tessera_store::{Store, StoreError};

/// Which database, as `tessera serve` finds it.
#[derive(Debug, Args)]
pub struct Place {
    /// Where the embedded SQLite database lives [default: as `tessera serve`].
    #[arg(long, env = "TESSERA_DATA_DIR", global = true)]
    data_dir: Option<std::path::PathBuf>,
    /// `sqlite://PATH` or `postgres://...` [default: sqlite://<data-dir>/tessera.db].
    #[arg(long, env = "TESSERA_DATABASE_URL", global = true)]
    database_url: Option<String>,
    /// The server's TOML settings file.
    #[arg(long, env = "TESSERA_CONFIG", global = true)]
    config: Option<std::path::PathBuf>,
    /// Address the server listens on, for the link [default: as `tessera serve`].
    #[arg(long, env = "TESSERA_LISTEN", global = true)]
    listen: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Print a one-time sign-in link for user NAME (it works once, for an hour, and replaces the user's last link).
    SignInLink {
        /// The user's name.
        name: String,
        /// The portal's address as its users reach it [default: http://<listen address>].
        #[arg(long)]
        url: Option<String>,
    },
    /// Set the local password of user NAME, read from the first line of standard input.
    SetPassword {
        /// The user's name.
        name: String,
    },
}

/// Runs a `tessera user` command.
pub fn run(place: Place, cmd: UserCommand, input: &mut dyn BufRead, out: &mut dyn Write) -> Result<u8, CliError> {
    let file = match &place.config {
        Some(path) => crate::config::load(path).map_err(CliError::BadInput)?,
        None => crate::config::FileConfig::default(),
    };
    let flags = crate::config::Overrides {
        listen: place.listen,
        data_dir: place.data_dir,
        database_url: place.database_url,
        demo: false,
    };
    let config = crate::config::resolve(flags, file, crate::config::process_env).map_err(CliError::BadInput)?;
    let password = match &cmd {
        UserCommand::SetPassword { .. } => {
            let mut line = String::new();
            input.read_line(&mut line)?;
            let password = line.trim_end_matches(['\n', '\r']).to_string();
            if password.chars().count() < tessera_services::auth::MIN_PASSWORD {
                return Err(CliError::BadInput(format!(
                    "a password has at least {} characters",
                    tessera_services::auth::MIN_PASSWORD
                )));
            }
            Some(password)
        }
        UserCommand::SignInLink { .. } => None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let url = &config.database_url;
        let store = Store::connect(url)
            .await
            .map_err(|e| CliError::BadInput(format!("{}: {e}", tessera_services::redact::url(url))))?;
        store.migrate().await.map_err(|e| CliError::BadInput(e.to_string()))?;
        let result = match cmd {
            UserCommand::SignInLink { name, url } => {
                let user = match find(&store, &name, out).await? {
                    Some(u) => u,
                    None => return Ok(EXIT_NO),
                };
                if store.is_sso_user(&user.id).await.map_err(store_error)? {
                    writeln!(out, "`{name}` signs in with single sign-on: no link is issued")?;
                    return Ok(EXIT_NO);
                }
                let base = match url {
                    Some(u) => u,
                    None => config
                        .listen
                        .parse::<std::net::SocketAddr>()
                        .map(base_for)
                        .unwrap_or_else(|_| format!("http://{}", config.listen)),
                };
                let link = issue(&store, &user.id, PRINTED_LINK_TTL_MS, "system:cli").await.map_err(store_error)?;
                writeln!(out, "{}", link.url(&base))?;
                Ok(EXIT_OK)
            }
            UserCommand::SetPassword { name } => {
                let user = match find(&store, &name, out).await? {
                    Some(u) => u,
                    None => return Ok(EXIT_NO),
                };
                let password = password.unwrap_or_default();
                let hash = tokio::task::spawn_blocking(move || tessera_services::auth::hash_password(&password))
                    .await
                    .map_err(|e| CliError::BadInput(e.to_string()))?
                    .map_err(CliError::BadInput)?;
                store.set_password_hash(&user.id, Some(&hash), "system:cli").await.map_err(store_error)?;
                writeln!(out, "Password of `{name}` set.")?;
                Ok(EXIT_OK)
            }
        };
        store.close().await;
        result
    })
}

async fn find(store: &Store, name: &str, out: &mut dyn Write) -> Result<Option<tessera_store::User>, CliError> {
    match store.user_by_name(name).await {
        Ok(u) => Ok(Some(u)),
        Err(StoreError::NotFound { .. }) => {
            writeln!(out, "no user `{name}`")?;
            Ok(None)
        }
        Err(e) => Err(store_error(e)),
    }
}

fn store_error(e: StoreError) -> CliError {
    CliError::BadInput(e.to_string())
}
