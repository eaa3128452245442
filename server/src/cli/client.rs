//! `tessera request ...` and `tessera node ...`: the REST API from the command line, for scripts and CI jobs.

use std::io::Write;

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::{CliError, EXIT_NO, EXIT_OK};

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

#[derive(Debug, Subcommand)]
pub enum RequestCommand {
    /// Ask for slices; prints the request.
    Create {
        /// Tenant id.
        #[arg(long)]
        tenant: String,
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
        count: u32,
        /// Why.
        #[arg(long, default_value = "")]
        reason: String,
        /// Seconds wanted once active.
        #[arg(long)]
        duration: Option<u64>,
        /// Retry key: the same key never creates two requests.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// List a tenant's requests (every page).
    List {
        /// Tenant id.
        #[arg(long)]
        tenant: Option<String>,
        /// Only in this state.
        #[arg(long)]
        state: Option<String>,
    },
    /// Show a request.
    Get {
        /// Request id.
        id: String,
    },
    /// Approve a request (platform admins); prints the reservations and layout proposals.
    Approve {
        /// Request id.
        id: String,
    },
    /// Reject a request (platform admins).
    Reject {
        /// Request id.
        id: String,
        /// Why (required).
        #[arg(long)]
        reason: String,
    },
    /// Cancel a request that is not active yet.
    Cancel {
        /// Request id.
        id: String,
    },
}

fn spec(mode: &str, profile: Option<String>, model: Option<String>, replicas: Option<u32>) -> Result<Value, CliError> {
    let need =
        |v: Option<String>, what: &str| v.ok_or_else(|| CliError::BadInput(format!("mode {mode} needs --{what}")));
    Ok(match mode {
        "mig" => json!({"mode": "mig", "profile": need(profile, "profile")?, "model": model}),
        "exclusive" => json!({"mode": "exclusive", "model": need(model, "model")?}),
        "timeslice" | "mps" => json!({
            "mode": mode,
            "model": need(model, "model")?,
            "replicas": replicas.ok_or_else(|| CliError::BadInput(format!("mode {mode} needs --replicas")))?,
        }),
        other => {
            return Err(CliError::BadInput(format!("unknown mode `{other}`: use mig, timeslice, mps or exclusive")));
        }
    })
}

/// Nodes and their agents.
#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// Create a join token for a node agent (platform admins); the secret is printed once.
    JoinToken {
        /// The name the node takes (default: its host name).
        #[arg(long)]
        name: Option<String>,
        /// Seconds until the token expires.
        #[arg(long, default_value_t = 3600)]
        ttl: u64,
    },
    /// List nodes with their state, generations and GPUs (platform admins).
    List,
}

/// A command against a running server.
#[derive(Debug)]
pub enum ApiCommand {
    /// `tessera request ...`.
    Request(RequestCommand),
    /// `tessera node ...`.
    Node(NodeCommand),
}

pub fn run(conn: Connection, cmd: ApiCommand, out: &mut dyn Write) -> Result<u8, CliError> {
    let token = conn.token.ok_or_else(|| CliError::BadInput("give --token or set TESSERA_TOKEN".to_string()))?;
    let base = conn.server.trim_end_matches('/').to_string();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let client = reqwest::Client::new();
    let call = |method: reqwest::Method, path: String, body: Option<Value>, key: Option<String>| {
        let mut r = client.request(method, format!("{base}{path}")).bearer_auth(&token);
        if let Some(b) = body {
            r = r.json(&b);
        }
        if let Some(k) = key {
            r = r.header("Idempotency-Key", k);
        }
        let server = base.clone();
        async move {
            let resp = r.send().await.map_err(|e| CliError::BadInput(format!("cannot reach {server}: {e}")))?;
            let ok = resp.status().is_success();
            let value: Value = resp.json().await.unwrap_or(Value::Null);
            Ok::<_, CliError>((ok, value))
        }
    };
    use reqwest::Method;
    runtime.block_on(async {
        let cmd = match cmd {
            ApiCommand::Request(cmd) => cmd,
            ApiCommand::Node(NodeCommand::JoinToken { name, ttl }) => {
                let body = json!({"node_name": name, "ttl_s": ttl});
                let (ok, value) = call(Method::POST, "/api/v1/join-tokens".into(), Some(body), None).await?;
                return print(out, ok, &value);
            }
            ApiCommand::Node(NodeCommand::List) => {
                let (ok, value) = call(Method::GET, "/api/v1/nodes".into(), None, None).await?;
                return print(out, ok, &value);
            }
        };
        let (ok, value) = match cmd {
            RequestCommand::Create {
                tenant,
                mode,
                profile,
                model,
                replicas,
                count,
                reason,
                duration,
                idempotency_key,
            } => {
                let body = json!({"tenant": tenant, "spec": spec(&mode, profile, model, replicas)?, "count": count,
                    "reason": reason, "duration_s": duration});
                call(Method::POST, "/api/v1/requests".into(), Some(body), idempotency_key).await?
            }
            RequestCommand::List { tenant, state } => {
                let mut items = Vec::new();
                let mut cursor: Option<String> = None;
                loop {
                    let mut q = vec!["limit=500".to_string()];
                    q.extend(tenant.iter().map(|t| format!("tenant={t}")));
                    q.extend(state.iter().map(|s| format!("state={s}")));
                    q.extend(cursor.iter().map(|c| format!("cursor={c}")));
                    let (ok, page) = call(Method::GET, format!("/api/v1/requests?{}", q.join("&")), None, None).await?;
                    if !ok {
                        break (false, page);
                    }
                    items.extend(page["items"].as_array().cloned().unwrap_or_default());
                    match page["next_cursor"].as_str() {
                        Some(c) => cursor = Some(c.to_string()),
                        None => break (true, Value::Array(items)),
                    }
                }
            }
            RequestCommand::Get { id } => call(Method::GET, format!("/api/v1/requests/{id}"), None, None).await?,
            RequestCommand::Approve { id } => {
                call(Method::POST, format!("/api/v1/requests/{id}/approve"), None, None).await?
            }
            RequestCommand::Reject { id, reason } => {
                call(Method::POST, format!("/api/v1/requests/{id}/reject"), Some(json!({"reason": reason})), None)
                    .await?
            }
            RequestCommand::Cancel { id } => {
                call(Method::POST, format!("/api/v1/requests/{id}/cancel"), None, None).await?
            }
        };
        print(out, ok, &value)
    })
}

/// Prints an answer: the JSON on success, else the problem's code, detail and errors.
fn print(out: &mut dyn Write, ok: bool, value: &Value) -> Result<u8, CliError> {
    if ok {
        serde_json::to_writer_pretty(&mut *out, value).map_err(std::io::Error::from)?;
        writeln!(out)?;
        Ok(EXIT_OK)
    } else {
        let code = value["code"].as_str().unwrap_or("error");
        let detail = value["detail"].as_str().unwrap_or("the server refused the request");
        writeln!(out, "error[{code}]: {detail}")?;
        for e in value["errors"].as_array().into_iter().flatten() {
            writeln!(out, "  - {}", e["message"].as_str().unwrap_or(""))?;
        }
        Ok(EXIT_NO)
    }
}
