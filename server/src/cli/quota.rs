//! `tessera quota ...`: quota requests and the history of limits, from the command line.

use std::collections::BTreeMap;
use std::io::Write;

use clap::Subcommand;
use reqwest::Method;
use tessera_api::cohorts::{CohortMembership, CohortView, NewCohort};
use tessera_api::quotas::{
    GrantBody, LimitChangeView, NewQuotaRequest, QuotaRequestPage, QuotaRequestState, QuotaRequestView,
};
use tessera_api::requests::RejectBody;
use tessera_api::tenants::{QuotaUpdate, QuotaView, TenantView};

use super::api::{Api, print};
use super::error::CliError;

#[derive(Debug, Subcommand)]
pub enum QuotaCommand {
    /// Ask for new limits for a tenant (its admins): `RESOURCE=LIMIT ...`, e.g. `compute_slices=14
    /// gpu/H100-80GB=2`; prints the quota request.
    Ask {
        /// Tenant id or name.
        #[arg(long)]
        tenant: String,
        /// Why (shown to approvers; required).
        #[arg(long)]
        reason: String,
        /// A temporary increase: taken back after this many hours (1 to 8784).
        #[arg(long)]
        for_hours: Option<u32>,
        /// `RESOURCE=LIMIT`, one or more.
        #[arg(required = true, value_name = "RESOURCE=LIMIT")]
        limits: Vec<String>,
    },
    /// List quota requests, newest first (every page).
    List {
        /// Tenant id or name.
        #[arg(long)]
        tenant: Option<String>,
        /// Only in this state (`pending`, `approved`, `rejected`, `cancelled`, `ended`).
        #[arg(long)]
        state: Option<String>,
    },
    /// Show a quota request.
    Get {
        /// Quota request id.
        id: String,
    },
    /// Grant a quota request (platform admins): everything asked, or only the `RESOURCE=LIMIT` given.
    Approve {
        /// Quota request id.
        id: String,
        /// A comment for the tenant.
        #[arg(long, default_value = "")]
        comment: String,
        /// `RESOURCE=LIMIT` to grant less than asked; resources left out are not granted.
        #[arg(value_name = "RESOURCE=LIMIT")]
        limits: Vec<String>,
    },
    /// Refuse a quota request (platform admins).
    Reject {
        /// Quota request id.
        id: String,
        /// Why (required).
        #[arg(long)]
        reason: String,
    },
    /// Withdraw a pending quota request (the tenant's admins).
    Cancel {
        /// Quota request id.
        id: String,
    },
    /// Every change of a tenant's limits, newest first.
    History {
        /// Tenant id or name.
        #[arg(long)]
        tenant: String,
    },
    /// Set a tenant's guarantees (platform admins): `RESOURCE=LIMIT ...`, with `--max RESOURCE=MAX` to let it
    /// borrow up to MAX from its cohort and `--lend RESOURCE=LEND` to lend at most LEND of its unused guarantee.
    Set {
        /// Tenant id or name.
        #[arg(long)]
        tenant: String,
        /// Why (kept in the limits' history).
        #[arg(long, default_value = "")]
        reason: String,
        /// `RESOURCE=MAX`: the most it may hold by borrowing.
        #[arg(long = "max", value_name = "RESOURCE=MAX")]
        maximums: Vec<String>,
        /// `RESOURCE=LEND`: the most of its unused guarantee it lends.
        #[arg(long = "lend", value_name = "RESOURCE=LEND")]
        lending: Vec<String>,
        /// `RESOURCE=LIMIT`, the guarantees.
        #[arg(value_name = "RESOURCE=LIMIT")]
        limits: Vec<String>,
    },
    /// Create a cohort (platform admins): tenants that lend each other what they guarantee but do not use.
    CohortCreate {
        /// Its name.
        name: String,
        /// Seconds between telling holders their borrowed slices are taken back and releasing them.
        #[arg(long)]
        grace: Option<u32>,
    },
    /// List cohorts with what each member guarantees, holds, borrows and can lend (platform admins).
    Cohorts,
    /// Put a tenant in a cohort (platform admins), or take it out with `--none`.
    Join {
        /// Tenant id or name.
        #[arg(long)]
        tenant: String,
        /// Cohort id or name.
        #[arg(long, required_unless_present = "none")]
        cohort: Option<String>,
        /// Take the tenant out of its cohort.
        #[arg(long, conflicts_with = "cohort")]
        none: bool,
        /// Its weight in sharing borrowed capacity (1-1000).
        #[arg(long)]
        weight: Option<u32>,
    },
}

/// `RESOURCE=LIMIT` pairs as a map, or which one is not.
fn limits(pairs: &[String]) -> Result<BTreeMap<String, f64>, CliError> {
    pairs
        .iter()
        .map(|pair| {
            let bad = || CliError::BadInput(format!("`{pair}`: write RESOURCE=LIMIT, e.g. compute_slices=14"));
            let (resource, limit) = pair.split_once('=').ok_or_else(bad)?;
            let limit: f64 = limit.trim().parse().map_err(|_| bad())?;
            Ok((resource.trim().to_string(), limit))
        })
        .collect()
}

pub(super) async fn run(api: &Api, cmd: QuotaCommand, out: &mut dyn Write) -> Result<u8, CliError> {
    match cmd {
        QuotaCommand::Ask { tenant, reason, for_hours, limits: pairs } => {
            let until_ms = for_hours.map(|h| tessera_core::clock::now_ms() + i64::from(h) * 3_600_000);
            let body = NewQuotaRequest { limits: limits(&pairs)?, reason, until_ms };
            let path = format!("/api/v1/tenants/{tenant}/quota-requests");
            print(out, api.call::<_, QuotaRequestView>(Method::POST, &path, Some(&body), None).await?)
        }
        QuotaCommand::List { tenant, state } => {
            if let Some(s) = &state
                && QuotaRequestState::ALL.iter().all(|k| k.as_str() != s)
            {
                return Err(CliError::BadInput(format!(
                    "unknown state `{s}`: use pending, approved, rejected, cancelled or ended"
                )));
            }
            let pages =
                api.all_pages("/api/v1/quota-requests", tenant.as_deref(), state.as_deref(), |p: QuotaRequestPage| {
                    (p.items, p.next_cursor)
                });
            print(out, pages.await?)
        }
        QuotaCommand::Get { id } => {
            print(out, api.get::<QuotaRequestView>(&format!("/api/v1/quota-requests/{id}")).await?)
        }
        QuotaCommand::Approve { id, comment, limits: pairs } => {
            let body = GrantBody { limits: if pairs.is_empty() { None } else { Some(limits(&pairs)?) }, comment };
            let path = format!("/api/v1/quota-requests/{id}/approve");
            print(out, api.call::<_, QuotaRequestView>(Method::POST, &path, Some(&body), None).await?)
        }
        QuotaCommand::Reject { id, reason } => {
            let path = format!("/api/v1/quota-requests/{id}/reject");
            print(out, api.call::<_, QuotaRequestView>(Method::POST, &path, Some(&RejectBody { reason }), None).await?)
        }
        QuotaCommand::Cancel { id } => {
            let path = format!("/api/v1/quota-requests/{id}/cancel");
            print(out, api.call::<(), QuotaRequestView>(Method::POST, &path, None, None).await?)
        }
        QuotaCommand::History { tenant } => {
            print(out, api.get::<Vec<LimitChangeView>>(&format!("/api/v1/tenants/{tenant}/quota-history")).await?)
        }
        QuotaCommand::Set { tenant, reason, maximums, lending, limits: pairs } => {
            let some = |m: BTreeMap<String, f64>| m.into_iter().map(|(k, v)| (k, Some(v))).collect();
            let body = QuotaUpdate {
                limits: some(limits(&pairs)?),
                maximums: some(limits(&maximums)?),
                lending_limits: some(limits(&lending)?),
                reason,
            };
            let path = format!("/api/v1/tenants/{tenant}/quotas");
            print(out, api.call::<_, QuotaView>(Method::PUT, &path, Some(&body), None).await?)
        }
        QuotaCommand::CohortCreate { name, grace } => {
            let body = NewCohort { name, grace_s: grace };
            print(out, api.call::<_, CohortView>(Method::POST, "/api/v1/cohorts", Some(&body), None).await?)
        }
        QuotaCommand::Cohorts => print(out, api.get::<Vec<CohortView>>("/api/v1/cohorts").await?),
        QuotaCommand::Join { tenant, cohort, none, weight } => {
            let body = CohortMembership { cohort: if none { None } else { cohort }, weight };
            let path = format!("/api/v1/tenants/{tenant}/cohort");
            print(out, api.call::<_, TenantView>(Method::PUT, &path, Some(&body), None).await?)
        }
    }
}
