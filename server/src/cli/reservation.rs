//! `tessera reservation ...`: slices booked for a window ahead, from the command line.

use std::io::Write;

use clap::Subcommand;
use reqwest::Method;
use tessera_api::requests::RejectBody;
use tessera_api::reservations::{NewReservationBody, ReservationPage, ReservationPreview, ReservationView};

use super::api::{Answer, Api, SpecArgs, print, say};
use super::error::CliError;

/// What to book: the slices and the window.
#[derive(Debug, clap::Args)]
pub struct BookArgs {
    /// Tenant id or name.
    #[arg(long)]
    tenant: String,
    #[command(flatten)]
    slices: SpecArgs,
    /// When the window starts: `+30m`, `+2h`, `+1d` from now, or UTC `2026-12-01T09:00`.
    #[arg(long)]
    start: String,
    /// When it ends (same forms; `+...` counts from the start).
    #[arg(long)]
    end: String,
    /// Why (shown to approvers).
    #[arg(long, default_value = "")]
    reason: String,
}

impl BookArgs {
    fn body(self) -> Result<NewReservationBody, CliError> {
        let now = tessera_core::clock::now_ms();
        let bad = |what: &str, v: &str| {
            CliError::BadInput(format!("--{what} `{v}`: write +30m, +2h, +1d or a UTC time such as 2026-12-01T09:00"))
        };
        let start_ms = tessera_core::clock::parse_time(&self.start, now).ok_or_else(|| bad("start", &self.start))?;
        let end_ms = tessera_core::clock::parse_time(&self.end, start_ms).ok_or_else(|| bad("end", &self.end))?;
        Ok(NewReservationBody {
            spec: self.slices.spec()?,
            count: self.slices.count,
            start_ms,
            end_ms,
            reason: self.reason,
        })
    }
}

#[derive(Debug, Subcommand)]
pub enum ReservationCommand {
    /// Book slices for a window (the tenant's members): accepted at once where the tenant's policy approves them,
    /// else pending for a platform admin.
    Book {
        #[command(flatten)]
        book: BookArgs,
    },
    /// What booking would do, and how many slices of the spec the window has room for; writes nothing.
    Preview {
        #[command(flatten)]
        book: BookArgs,
    },
    /// Reservations by start (a tenant's, or every tenant's for platform admins).
    List {
        /// Tenant id or name.
        #[arg(long)]
        tenant: Option<String>,
        /// Only in this state (`pending`, `accepted`, `started`, `ended`, `rejected`, `cancelled`, `failed`).
        #[arg(long)]
        state: Option<String>,
    },
    /// Show a reservation.
    Get {
        /// Reservation id.
        id: String,
    },
    /// Accept a pending reservation (platform admins).
    Approve {
        /// Reservation id.
        id: String,
    },
    /// Reject a pending reservation (platform admins).
    Reject {
        /// Reservation id.
        id: String,
        /// Why (required).
        #[arg(long)]
        reason: String,
    },
    /// Withdraw a reservation (a started one releases its slices).
    Cancel {
        /// Reservation id.
        id: String,
    },
}

pub(super) async fn run(api: &Api, cmd: ReservationCommand, out: &mut dyn Write) -> Result<u8, CliError> {
    match cmd {
        ReservationCommand::Book { book } => {
            let path = format!("/api/v1/tenants/{}/reservations", book.tenant);
            let body = book.body()?;
            print(out, api.call::<_, ReservationView>(Method::POST, &path, Some(&body), None).await?)
        }
        ReservationCommand::Preview { book } => {
            let path = format!("/api/v1/tenants/{}/reservations/preview", book.tenant);
            let body = book.body()?;
            let count = body.count;
            let answer = api.call::<_, ReservationPreview>(Method::POST, &path, Some(&body), None).await?;
            if let Answer::Ok(p) = &answer {
                let free = if p.free_in_window_limit > 0 && p.free_in_window >= p.free_in_window_limit {
                    format!("{} or more", p.free_in_window)
                } else {
                    p.free_in_window.to_string()
                };
                say(&match &p.refused {
                    None if p.auto_approve => {
                        format!("It fits and is accepted at once ({free} of this spec fit).")
                    }
                    None => format!("It fits; a platform admin accepts it ({free} of this spec fit)."),
                    Some(problem) => {
                        format!("It would be refused: {} ({} of {count} fit the window).", problem.detail, free)
                    }
                });
            }
            print(out, answer)
        }
        ReservationCommand::List { tenant, state } => {
            if let Some(s) = &state
                && tessera_api::reservations::ReservationState::parse(s).is_none()
            {
                return Err(CliError::BadInput(format!(
                    "unknown state `{s}`: use pending, accepted, started, ended, rejected, cancelled or failed"
                )));
            }
            let mut query: Vec<String> = Vec::new();
            if let Some(t) = tenant {
                query.push(format!("tenant={t}"));
            }
            if let Some(s) = state {
                query.push(format!("state={s}"));
            }
            let path = format!("/api/v1/reservations?{}", query.join("&"));
            print(out, api.get::<ReservationPage>(&path).await?)
        }
        ReservationCommand::Get { id } => {
            print(out, api.get::<ReservationView>(&format!("/api/v1/reservations/{id}")).await?)
        }
        ReservationCommand::Approve { id } => {
            let path = format!("/api/v1/reservations/{id}/approve");
            print(out, api.call::<(), ReservationView>(Method::POST, &path, None, None).await?)
        }
        ReservationCommand::Reject { id, reason } => {
            let path = format!("/api/v1/reservations/{id}/reject");
            print(out, api.call::<_, ReservationView>(Method::POST, &path, Some(&RejectBody { reason }), None).await?)
        }
        ReservationCommand::Cancel { id } => {
            let path = format!("/api/v1/reservations/{id}/cancel");
            print(out, api.call::<(), ReservationView>(Method::POST, &path, None, None).await?)
        }
    }
}
