//! `tessera request ...` and `tessera node ...`: the REST API from the command line, for scripts and CI jobs; it
//! also hands `tessera quota ...` and `tessera reservation ...` to their modules, with the client of `api.rs`.

use std::io::Write;

use clap::Subcommand;
use reqwest::Method;
use tessera_api::agents::{JoinTokenView, NewJoinToken};
use tessera_api::nodes::{GpuView, NodeView};
use tessera_api::requests::{
    ApprovalView, NewRequestBody, RejectBody, RequestPage, RequestPreview, RequestView, Waiting,
};
use tessera_core::request::RequestState;

use super::api::{Answer, Api, Connection, SpecArgs, print, say};
use super::error::CliError;

/// What a request asks for, as `create` and `preview` take it.
#[derive(Debug, clap::Args)]
pub struct AskArgs {
    /// Tenant id.
    #[arg(long)]
    tenant: String,
    #[command(flatten)]
    slices: SpecArgs,
    /// Why.
    #[arg(long, default_value = "")]
    reason: String,
    /// Seconds wanted once active.
    #[arg(long)]
    duration: Option<u64>,
    /// `low`, `normal` or `high`: high fills the tenant's guarantee first, low is reclaimed first.
    #[arg(long, default_value = "normal", value_parser = parse_priority)]
    priority: tessera_core::cohort::Priority,
}

impl AskArgs {
    fn body(self) -> Result<NewRequestBody, CliError> {
        Ok(NewRequestBody {
            spec: self.slices.spec()?,
            tenant: self.tenant,
            count: self.slices.count,
            reason: self.reason,
            duration_s: self.duration,
            priority: self.priority,
        })
    }
}

#[derive(Debug, Subcommand)]
pub enum RequestCommand {
    /// Ask for slices; prints the request.
    Create {
        #[command(flatten)]
        ask: AskArgs,
        /// Retry key: the same key never creates two requests.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// What asking for slices would do now, without asking: quota, approval, placement, why it would wait.
    Preview {
        #[command(flatten)]
        ask: AskArgs,
    },
    /// List a tenant's requests (every page).
    List {
        /// Tenant id.
        #[arg(long)]
        tenant: Option<String>,
        /// Only in this state (`pending`, `approved`, `provisioning`, `active`, ...).
        #[arg(long)]
        state: Option<RequestState>,
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
    /// Right-sizing: per active allocation you may see (platform admins: the fleet), its peak memory and 95th
    /// percentile utilisation, and the smallest profile that would carry them with headroom.
    Rightsize {
        /// Tenant id.
        #[arg(long)]
        tenant: Option<String>,
        /// The window, days before now (1-30).
        #[arg(long)]
        days: Option<u32>,
        /// Headroom over the peak memory and the 95th percentile utilisation, % (0-100).
        #[arg(long)]
        headroom_pct: Option<f64>,
    },
    /// Request the smaller slice in place of an active allocation's request: as many slices of PROFILE as the
    /// request holds; the old request is released when the new one is active.
    Resize {
        /// Allocation id (`tessera request rightsize`).
        allocation: String,
        /// The smaller profile (the right-sizing report's suggestion).
        #[arg(long)]
        profile: String,
        /// Why (shown to approvers).
        #[arg(long)]
        reason: Option<String>,
    },
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
    /// Cordon one GPU (platform admins): nothing new is placed on it; what it holds keeps running.
    Cordon {
        /// The GPU's id (`tessera node list`).
        gpu: String,
        /// Why, kept in the audit log.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Uncordon one GPU (platform admins): it takes new work again; an unhealthy one returns to service, a drain
    /// ends.
    Uncordon {
        /// The GPU's id (`tessera node list`).
        gpu: String,
        /// Why, kept in the audit log.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Drain one GPU for maintenance (platform admins): cordoned at once, its holders told, their requests ended at
    /// the deadline; the node's other GPUs keep serving. `tessera node list` shows the drain; uncordoning ends it.
    Drain {
        /// The GPU's id (`tessera node list`).
        gpu: String,
        /// Seconds its holders keep their slices (0 to 604800).
        #[arg(long, default_value_t = tessera_core::health::DEFAULT_DRAIN_S)]
        deadline_s: u32,
        /// Why, told to its holders.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Lay out the free part of MIG GPUs again for the profiles people ask for, every instance held kept (platform
    /// admins). Lists the GPUs that gain with before and after figures; `--propose` makes each a layout proposal to
    /// approve like any other.
    Defragment {
        /// The profile to make room for (default: on each model, the largest one asked for).
        #[arg(long)]
        profile: Option<String>,
        /// Only GPUs of this model.
        #[arg(long)]
        model: Option<String>,
        /// At most this many GPUs, those that gain most first.
        #[arg(long)]
        max_gpus: Option<u32>,
        /// Make the layout proposals (without it, nothing is written).
        #[arg(long)]
        propose: bool,
    },
}

/// A command against a running server.
#[derive(Debug)]
pub enum ApiCommand {
    /// `tessera request ...`.
    Request(RequestCommand),
    /// `tessera node ...`.
    Node(NodeCommand),
    /// `tessera quota ...`.
    Quota(super::quota::QuotaCommand),
    /// `tessera reservation ...`.
    Reservation(super::reservation::ReservationCommand),
    /// `tessera cluster ...`.
    Cluster(super::cluster::ClusterCommand),
}

pub fn run(conn: Connection, cmd: ApiCommand, out: &mut dyn Write) -> Result<u8, CliError> {
    let api = Api::connect(conn)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let cmd = match cmd {
            ApiCommand::Request(cmd) => cmd,
            ApiCommand::Node(NodeCommand::JoinToken { name, ttl }) => {
                let body = NewJoinToken { node_name: name, ttl_s: Some(ttl) };
                let answer: Answer<JoinTokenView> =
                    api.call(Method::POST, "/api/v1/join-tokens", Some(&body), None).await?;
                return print(out, answer);
            }
            ApiCommand::Node(NodeCommand::List) => {
                return print(out, api.get::<Vec<NodeView>>("/api/v1/nodes").await?);
            }
            ApiCommand::Node(NodeCommand::Cordon { gpu, reason }) => {
                let body = tessera_api::nodes::CordonBody { reason };
                let answer: Answer<GpuView> =
                    api.call(Method::POST, &format!("/api/v1/gpus/{gpu}/cordon"), Some(&body), None).await?;
                return print(out, answer);
            }
            ApiCommand::Node(NodeCommand::Uncordon { gpu, reason }) => {
                let body = tessera_api::nodes::CordonBody { reason };
                let answer: Answer<GpuView> =
                    api.call(Method::POST, &format!("/api/v1/gpus/{gpu}/uncordon"), Some(&body), None).await?;
                return print(out, answer);
            }
            ApiCommand::Node(NodeCommand::Drain { gpu, deadline_s, reason }) => {
                let body = tessera_api::nodes::DrainBody { deadline_s: Some(deadline_s), reason };
                let path = format!("/api/v1/gpus/{gpu}/drain");
                let answer: Answer<tessera_api::nodes::GpuDrain> =
                    api.call(Method::POST, &path, Some(&body), None).await?;
                return print(out, answer);
            }
            ApiCommand::Node(NodeCommand::Defragment { profile, model, max_gpus, propose }) => {
                let q = tessera_api::layouts::DefragQuery { profile, model, max_gpus };
                let answer: Answer<tessera_api::layouts::DefragReport> = if propose {
                    api.call(Method::POST, "/api/v1/defragmentation", Some(&q), None).await?
                } else {
                    let mut query = url::form_urlencoded::Serializer::new(String::new());
                    if let Some(v) = &q.profile {
                        query.append_pair("profile", v);
                    }
                    if let Some(v) = &q.model {
                        query.append_pair("model", v);
                    }
                    if let Some(v) = q.max_gpus {
                        query.append_pair("max_gpus", &v.to_string());
                    }
                    api.get(&format!("/api/v1/defragmentation?{}", query.finish())).await?
                };
                if let Answer::Ok(r) = &answer {
                    say(&defrag_text(r, propose));
                }
                return print(out, answer);
            }
            ApiCommand::Quota(cmd) => return super::quota::run(&api, cmd, out).await,
            ApiCommand::Reservation(cmd) => return super::reservation::run(&api, cmd, out).await,
            ApiCommand::Cluster(cmd) => return super::cluster::run(&api, cmd, out).await,
        };
        match cmd {
            RequestCommand::Create { ask, idempotency_key } => {
                let body = ask.body()?;
                let key = idempotency_key.as_deref();
                let answer = api.call::<_, RequestView>(Method::POST, "/api/v1/requests", Some(&body), key).await?;
                if let Answer::Ok(RequestView { waiting: Some(w), .. }) = &answer {
                    say(&waiting_text(w));
                }
                print(out, answer)
            }
            RequestCommand::Preview { ask } => {
                let body = ask.body()?;
                let answer =
                    api.call::<_, RequestPreview>(Method::POST, "/api/v1/requests/preview", Some(&body), None).await?;
                if let Answer::Ok(p) = &answer {
                    say(&preview_text(p));
                }
                print(out, answer)
            }
            RequestCommand::List { tenant, state } => {
                let state = state.map(|s| s.to_string());
                let pages = api.all_pages("/api/v1/requests", tenant.as_deref(), state.as_deref(), |p: RequestPage| {
                    (p.items, p.next_cursor)
                });
                print(out, pages.await?)
            }
            RequestCommand::Get { id } => {
                let answer = api.get::<RequestView>(&format!("/api/v1/requests/{id}")).await?;
                // The JSON stays alone on standard output for scripts; why it waits goes to people on standard error.
                if let Answer::Ok(RequestView { waiting: Some(w), .. }) = &answer {
                    say(&waiting_text(w));
                }
                print(out, answer)
            }
            RequestCommand::Approve { id } => {
                let path = format!("/api/v1/requests/{id}/approve");
                print(out, api.call::<(), ApprovalView>(Method::POST, &path, None, None).await?)
            }
            RequestCommand::Reject { id, reason } => {
                let path = format!("/api/v1/requests/{id}/reject");
                let body = RejectBody { reason };
                print(out, api.call::<_, RequestView>(Method::POST, &path, Some(&body), None).await?)
            }
            RequestCommand::Cancel { id } => {
                let path = format!("/api/v1/requests/{id}/cancel");
                print(out, api.call::<(), RequestView>(Method::POST, &path, None, None).await?)
            }
            RequestCommand::Rightsize { tenant, days, headroom_pct } => {
                let mut query = url::form_urlencoded::Serializer::new(String::new());
                if let Some(v) = &tenant {
                    query.append_pair("tenant", v);
                }
                if let Some(v) = days {
                    query.append_pair("days", &v.to_string());
                }
                if let Some(v) = headroom_pct {
                    query.append_pair("headroom_pct", &v.to_string());
                }
                let answer: Answer<tessera_api::rightsize::RightsizeReport> =
                    api.get(&format!("/api/v1/rightsizing?{}", query.finish())).await?;
                if let Answer::Ok(r) = &answer {
                    say(&rightsize_text(r));
                }
                print(out, answer)
            }
            RequestCommand::Resize { allocation, profile, reason } => {
                let path = format!("/api/v1/allocations/{allocation}/rightsize");
                let body = tessera_api::rightsize::RightsizeBody { profile, reason };
                let answer: Answer<tessera_api::rightsize::Replacement> =
                    api.call(Method::POST, &path, Some(&body), None).await?;
                if let Answer::Ok(r) = &answer {
                    say(&format!(
                        "Request {} ({}) asks for the smaller slice; request {} is released when it is active.",
                        r.request.id, r.request.state, r.replaces
                    ));
                }
                print(out, answer)
            }
        }
    })
}

/// Why a request waits, in a sentence with its place in the queue and its earliest start.
pub fn waiting_text(w: &Waiting) -> String {
    let mut text = format!("waiting: {}", w.sentence);
    if let Some(p) = w.queue_position {
        text.push_str(&format!(" Position {p} in the queue for these slices."));
    }
    match (w.queue_position, w.earliest_start_ms) {
        (_, Some(at)) => text.push_str(&format!(" Earliest start {} (UTC).", tessera_core::clock::utc_minute(at))),
        (Some(_), None) => text.push_str(" No known end of other slices makes room for it."),
        (None, None) => {}
    }
    text
}

/// What a preview says, in a sentence.
pub fn preview_text(p: &RequestPreview) -> String {
    use tessera_api::requests::PreviewOutcome;
    let place = p
        .slices
        .first()
        .map(|s| format!(" on {} GPU {} ({} at {})", s.node, s.gpu_index, s.profile, s.start))
        .unwrap_or_default();
    match p.outcome {
        PreviewOutcome::ApprovedNow => format!("preview: approved at once{place}."),
        PreviewOutcome::ApprovedWaitingForLayout => {
            format!("preview: approved at once{place}; a layout change it needs waits for a platform admin.")
        }
        PreviewOutcome::Pending => format!("preview: pending. {}", p.sentence.clone().unwrap_or_default()),
        PreviewOutcome::Refused => {
            format!("preview: refused: {}", p.refused.as_ref().map(|r| r.detail.clone()).unwrap_or_default())
        }
    }
}

fn parse_priority(text: &str) -> Result<tessera_core::cohort::Priority, String> {
    tessera_core::cohort::Priority::parse(text).ok_or_else(|| format!("`{text}`: use low, normal or high"))
}

/// A right-sizing report in one sentence per allocation that could be smaller, then the totals.
pub fn rightsize_text(r: &tessera_api::rightsize::RightsizeReport) -> String {
    let mut lines: Vec<String> = r
        .allocations
        .iter()
        .filter_map(|a| {
            let to = a.suggested_profile.as_deref()?;
            let peak = a.peak_mem_mib.map_or_else(|| "?".to_string(), |m| format!("{:.1} GiB", m / 1024.0));
            let util = a.p95_util_pct.map_or_else(|| "not measured".to_string(), |u| format!("{u}%"));
            Some(format!(
                "{} ({}, {} on {}): peaked at {peak}, p95 utilisation {util}: a {to} would do, \
                 {} compute slices and {} slice-hours a day saved",
                a.allocation, a.tenant, a.held, a.node, a.compute_slices_saved, a.slice_hours_saved_per_day
            ))
        })
        .collect();
    lines.push(format!(
        "{} of {} active allocations could be smaller with {}% headroom: {} compute slices, {} slice-hours a day.",
        r.smaller,
        r.allocations.len(),
        r.headroom_pct,
        r.compute_slices_saved,
        r.slice_hours_saved_per_day
    ));
    lines.join("\n")
}

/// A defragmentation report in one sentence per GPU, then the fleet's figures.
fn defrag_text(r: &tessera_api::layouts::DefragReport, proposed: bool) -> String {
    let mut lines: Vec<String> = r
        .gpus
        .iter()
        .map(|g| {
            let made = g.proposal_id.as_deref().map(|id| format!(" (proposal {id})")).unwrap_or_default();
            format!(
                "{} on {}: {} free {} instances instead of {}, {} ready compute slices instead of {}{made}",
                g.gpu,
                g.node,
                g.after.target_instances,
                g.target,
                g.before.target_instances,
                g.after.ready_slices,
                g.before.ready_slices
            )
        })
        .collect();
    let verb = if proposed { "proposed for" } else { "would gain on" };
    let mut left: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for s in &r.skipped {
        *left.entry(s.code.as_str()).or_default() += 1;
    }
    let left = if left.is_empty() {
        String::new()
    } else {
        let parts: Vec<String> = left.iter().map(|(code, n)| format!("{n} {code}")).collect();
        format!(" GPUs that would gain but were left out: {}.", parts.join(", "))
    };
    lines.push(format!(
        "Defragmentation {verb} {} GPUs: free target instances {} -> {}, slices needing a layout change {} -> {} \
         (at least {} stay stranded by instances in use).{left}",
        r.gpus.len(),
        r.before.target_instances,
        r.after.target_instances,
        r.before.not_ready_slices,
        r.after.not_ready_slices,
        r.stranded_slices,
    ));
    lines.join("\n")
}
