//! What the commands against a running server share: where it is and who is calling (`Connection`), the REST
//! client (`Api`) and its answers, how an answer is printed, and the flags that describe slices. The dispatcher
//! (`client.rs`) and the sub-commands (`quota.rs`, `reservation.rs`) import it; it imports none of them.

use std::io::Write;

use clap::Args;
use reqwest::Method;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tessera_api::Problem;
use tessera_core::request::SliceSpec;

use super::error::{CliError, EXIT_NO, EXIT_OK};

/// Where the server is and who is calling.
#[derive(Debug, Args)]
pub struct Connection {
    /// Base URL of the Tessera server.
    #[arg(long, env = "TESSERA_SERVER", default_value = "http://127.0.0.1:8080", global = true)]
    server: String,
    /// API token (`tsr_...`).
    #[arg(long, env = "TESSERA_TOKEN", hide_env_values = true, global = true)]
    token: Option<String>,
}

/// What one slice is and how many, as requests and reservations take them.
#[derive(Debug, clap::Args)]
pub struct SpecArgs {
    /// `mig`, `timeslice`, `mps` or `exclusive`.
    #[arg(long, default_value = "mig")]
    mode: String,
    /// MIG profile (mode `mig`), e.g. 1g.10gb.
    #[arg(long)]
    profile: Option<String>,
    /// GPU model (required except for `mig`).
    #[arg(long)]
    model: Option<String>,
    /// Shares per GPU (modes `timeslice` and `mps`).
    #[arg(long)]
    replicas: Option<u32>,
    /// How many slices.
    #[arg(long, default_value_t = 1)]
    pub(super) count: u32,
}

impl SpecArgs {
    /// The spec the flags describe.
    pub(super) fn spec(&self) -> Result<SliceSpec, CliError> {
        let mode = self.mode.as_str();
        let need = |v: &Option<String>, what: &str| {
            v.clone().ok_or_else(|| CliError::BadInput(format!("mode {mode} needs --{what}")))
        };
        let replicas = || self.replicas.ok_or_else(|| CliError::BadInput(format!("mode {mode} needs --replicas")));
        Ok(match mode {
            "mig" => SliceSpec::Mig { profile: need(&self.profile, "profile")?, model: self.model.clone() },
            "exclusive" => SliceSpec::Exclusive { model: need(&self.model, "model")? },
            "timeslice" => SliceSpec::Timeslice { model: need(&self.model, "model")?, replicas: replicas()? },
            "mps" => SliceSpec::Mps { model: need(&self.model, "model")?, replicas: replicas()? },
            other => {
                return Err(CliError::BadInput(format!(
                    "unknown mode `{other}`: use mig, timeslice, mps or exclusive"
                )));
            }
        })
    }
}

/// What the server answered: the typed view, or its problem report.
pub(super) enum Answer<T> {
    Ok(T),
    Refused(Problem),
}

/// The REST API, typed with the server's own wire types (`tessera-api`).
pub(super) struct Api {
    client: reqwest::Client,
    base: String,
    token: String,
}

impl Api {
    /// The client for `conn`; a token is required.
    pub(super) fn connect(conn: Connection) -> Result<Api, CliError> {
        let token = conn.token.ok_or_else(|| CliError::BadInput("give --token or set TESSERA_TOKEN".to_string()))?;
        let client = reqwest::Client::builder()
            .pool_idle_timeout(tessera_core::api::CLIENT_IDLE_KEEP)
            .build()
            .map_err(|e| CliError::BadInput(format!("cannot make an HTTP client: {e}")))?;
        Ok(Api { client, base: conn.server.trim_end_matches('/').to_string(), token })
    }

    pub(super) async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        key: Option<&str>,
    ) -> Result<Answer<T>, CliError> {
        let mut r = self.client.request(method, format!("{}{path}", self.base)).bearer_auth(&self.token);
        if let Some(b) = body {
            r = r.json(b);
        }
        if let Some(k) = key {
            r = r.header("Idempotency-Key", k);
        }
        let resp = r.send().await.map_err(|e| CliError::BadInput(format!("cannot reach {}: {e}", self.base)))?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| CliError::BadInput(format!("reading the answer: {e}")))?;
        if status.is_success() {
            // No content (204) reads as `null`, which `()` and options decode.
            let text = if text.trim().is_empty() { "null" } else { text.as_str() };
            return serde_json::from_str(text).map(Answer::Ok).map_err(|e| {
                CliError::BadInput(format!("the server's answer to {path} is not what this client knows: {e}"))
            });
        }
        Ok(Answer::Refused(serde_json::from_str(&text).unwrap_or_else(|_| Problem {
            kind: "about:blank".to_string(),
            title: status.canonical_reason().unwrap_or("error").to_string(),
            status: status.as_u16(),
            detail: "the server refused the request".to_string(),
            code: "error".to_string(),
            errors: Vec::new(),
            ask_for: None,
        })))
    }

    pub(super) async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<Answer<T>, CliError> {
        self.call(Method::GET, path, None::<&()>, None).await
    }

    /// Every item of a paged listing at `path` (500 a page, following `next_cursor`), filtered by tenant and state.
    pub(super) async fn all_pages<P: DeserializeOwned, T>(
        &self,
        path: &str,
        tenant: Option<&str>,
        state: Option<&str>,
        split: impl Fn(P) -> (Vec<T>, Option<String>),
    ) -> Result<Answer<Vec<T>>, CliError> {
        let mut items: Vec<T> = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut q = vec!["limit=500".to_string()];
            q.extend(tenant.iter().map(|t| format!("tenant={t}")));
            q.extend(state.iter().map(|s| format!("state={s}")));
            q.extend(cursor.iter().map(|c| format!("cursor={c}")));
            match self.get::<P>(&format!("{path}?{}", q.join("&"))).await? {
                Answer::Refused(p) => return Ok(Answer::Refused(p)),
                Answer::Ok(page) => {
                    let (page_items, next) = split(page);
                    items.extend(page_items);
                    match next {
                        Some(c) => cursor = Some(c),
                        None => return Ok(Answer::Ok(items)),
                    }
                }
            }
        }
    }
}

/// Prints an answer: the view as JSON on success, else the problem's code, detail and errors.
pub(super) fn print<T: Serialize>(out: &mut dyn Write, answer: Answer<T>) -> Result<u8, CliError> {
    match answer {
        Answer::Ok(value) => {
            serde_json::to_writer_pretty(&mut *out, &value).map_err(std::io::Error::from)?;
            writeln!(out)?;
            Ok(EXIT_OK)
        }
        Answer::Refused(problem) => {
            writeln!(out, "error[{}]: {}", problem.code, problem.detail)?;
            for e in &problem.errors {
                writeln!(out, "  - {}", e.message)?;
            }
            if let Some(limits) = &problem.ask_for {
                let args: Vec<String> = limits.iter().map(|(r, l)| format!("{r}={l}")).collect();
                writeln!(out, "  ask for it: tessera quota ask --tenant TENANT --reason WHY {}", args.join(" "))?;
            }
            Ok(EXIT_NO)
        }
    }
}

/// A line for people, on standard error.
pub(super) fn say(line: &str) {
    #[allow(clippy::print_stderr)]
    {
        eprintln!("{line}");
    }
}
