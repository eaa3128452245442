//! Metered usage for chargeback, as JSON or as a CSV file: per allocation, per tenant and per profile, with the
//! active allocations that sit idle flagged. Tenant members see their tenants' usage only.

use crate::auth::Caller;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use tessera_core::clock::{iso8601, rounded};
use tessera_services::auth::Permissions;

use super::error::{ApiError, ApiJson, ApiQuery, Problem};
pub use tessera_api::efficiency::{
    EfficiencyHistory, EfficiencyQuery, EfficiencyReport, HistoryQuery, Prices, PricesBody,
};
pub use tessera_api::rightsize::{RightsizeQuery, RightsizeReport};
pub use tessera_api::usage::UsageQuery;
use tessera_api::usage::{USAGE_LIMIT_MAX, attention_order};
use tessera_services::app::AppState;
use tessera_services::auth::permissions::Scope;
use tessera_services::idle::{DEFAULT_IDLE_BELOW, DEFAULT_IDLE_HOURS, IDLE_BELOW, IDLE_HOURS, device_utilisation};
use tessera_services::usage::{AllocationUsage, IdleRule, UsageReport, add_use_means, meter};
use tessera_store::now_ms;
use tessera_store::telemetry::Metered;

/// The columns of the CSV report, one line per allocation.
pub const CSV_HEADER: &str = "tenant,allocation,request,node,gpu_uuid,device_uuid,model,profile,weight,state,from,to,\
                              seconds,slice_seconds,gpu_hours,util_mean_pct,idle,util_in_period_pct";

/// Metered usage for chargeback: per allocation, the seconds it was in use within the period times its weight in
/// compute slices (slice-seconds), with the mean utilisation of its device over its use in the period (from the
/// stored minutes), over the last `idle_hours`, and whether it is idle; per tenant and per profile the sums. Tenant members see their tenants only. `format=csv` gives the
/// allocations as a CSV file (`text/csv`, a header line first). `limit` bounds the allocations answered (and
/// measured) to those that need attention first; the sums and counts still cover all.
#[utoipa::path(get, path = "/api/v1/usage", tag = "usage", security(("token" = ["user"]), ("session" = ["user"])),
    params(UsageQuery),
    responses((status = 200, description = "the report, or with `format=csv` its allocations as CSV",
            content((UsageReport = "application/json"), (String = "text/csv"))),
        (status = 404, body = Problem),
        (status = 422, body = Problem, description = "usage_range, invalid_time, invalid_idle, invalid_format or invalid_limit")))]
pub async fn usage(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiQuery(q): ApiQuery<UsageQuery>,
) -> Result<Response, ApiError> {
    let csv = match q.format.as_deref() {
        None | Some("json") => false,
        Some("csv") => true,
        Some(_) => return Err(ApiError::invalid("invalid_format", "`format` is `json` or `csv`")),
    };
    let idle_below = q.idle_below.unwrap_or(DEFAULT_IDLE_BELOW);
    let idle_hours = q.idle_hours.unwrap_or(DEFAULT_IDLE_HOURS);
    check_idle(idle_below, "idle_hours", idle_hours)?;
    let limit = q.limit;
    if limit.is_some_and(|l| l > USAGE_LIMIT_MAX) {
        return Err(ApiError::invalid("invalid_limit", format!("`limit` is 0 to {USAGE_LIMIT_MAX}")));
    }
    let now = now_ms();
    let to = super::time_param("to", q.to)?.unwrap_or(now);
    let from = super::time_param("from", q.from)?.unwrap_or((to - 30 * 24 * 3600 * 1000).max(0));
    if from >= to {
        return Err(ApiError::invalid("usage_range", "`from` must be before `to`"));
    }
    let (metered, fleet) = match p.reading_scope(q.tenant.as_deref())? {
        Scope::Fleet => (state.store.metered(None, from, to).await?, true),
        Scope::Tenants(tenants) => {
            let mut all = Vec::new();
            for t in &tenants {
                all.extend(state.store.metered(Some(t), from, to).await?);
            }
            (all, false)
        }
    };
    let watched: std::collections::BTreeSet<String> =
        metered.iter().filter(|a| a.released_at_ms.is_none()).filter_map(|a: &Metered| a.device_uuid.clone()).collect();
    let util = if watched.is_empty() {
        Default::default()
    } else {
        // The fleet's in one grouped read; a member's, of their devices only.
        device_utilisation(&state, idle_hours, now, (!fleet).then_some(&watched)).await?
    };
    let idle = IdleRule { below: idle_below, hours: idle_hours, util: &util };
    let mut report = meter(state.catalog, &metered, from, to, now, idle);
    if let Some(limit) = limit.filter(|_| !csv) {
        // Only the allocations answered: the means of the rest are not read.
        attention_order(&mut report.allocations);
        report.allocations.truncate(limit as usize);
    }
    add_use_means(&state.store, &metered, &mut report, |_| true).await?;
    if !csv {
        return Ok(ApiJson(report).into_response());
    }
    let disposition = format!("attachment; filename=\"tessera-usage-{}-{}.csv\"", report.from_ms, report.to_ms);
    let mut response = csv_report(&report).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/csv; charset=utf-8"));
    if let Ok(value) = HeaderValue::from_str(&disposition) {
        headers.insert(header::CONTENT_DISPOSITION, value);
    }
    Ok(response)
}

/// A CSV field, quoted (RFC 4180) when it holds a comma, a quote or a line break.
pub fn field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) { format!("\"{}\"", text.replace('"', "\"\"")) } else { text.to_string() }
}

/// One line of the CSV report.
pub fn csv_line(a: &AllocationUsage) -> String {
    let cells = [
        field(&a.tenant),
        field(&a.allocation),
        field(&a.request),
        field(&a.node),
        field(&a.gpu_uuid),
        field(a.device_uuid.as_deref().unwrap_or("")),
        field(&a.model),
        field(&a.profile),
        rounded(a.weight, 4),
        field(&a.state),
        iso8601(a.from_ms),
        iso8601(a.to_ms),
        rounded(a.seconds, 0),
        rounded(a.slice_seconds, 1),
        rounded(a.gpu_hours, 4),
        a.util_mean.map(|u| rounded(u, 1)).unwrap_or_default(),
        a.idle.to_string(),
        a.util_in_period.map(|u| rounded(u, 1)).unwrap_or_default(),
    ];
    cells.join(",")
}

/// The report's allocations as CSV: [`CSV_HEADER`], then one line per allocation, each ended by CRLF.
pub fn csv_report(report: &UsageReport) -> String {
    let mut out = String::with_capacity(200 * (report.allocations.len() + 1));
    out.push_str(CSV_HEADER);
    out.push_str("\r\n");
    for a in &report.allocations {
        out.push_str(&csv_line(a));
        out.push_str("\r\n");
    }
    out
}

/// Fleet efficiency (platform admins): MIG compute slices per model and in total by what they can do now
/// (allocated, placeable for the profiles the live requests ask for, stranded, free on cordoned GPUs), and per tenant
/// the compute-slice-hours held over the last `hours`, the share of them measured, what was used (weighted by each
/// device's mean utilisation) and the allocations idle over the whole look-back.
#[utoipa::path(get, path = "/api/v1/efficiency", tag = "usage", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    params(EfficiencyQuery),
    responses((status = 200, body = EfficiencyReport), (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 422, body = Problem, description = "invalid_idle")))]
pub async fn efficiency(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiQuery(q): ApiQuery<EfficiencyQuery>,
) -> Result<ApiJson<EfficiencyReport>, ApiError> {
    use tessera_services::efficiency::{DEFAULT_EFFICIENCY_HOURS, DEFAULT_EFFICIENCY_IDLE_BELOW, report};
    p.require_platform_admin()?;
    let hours = q.hours.unwrap_or(DEFAULT_EFFICIENCY_HOURS);
    let idle_below = q.idle_below.unwrap_or(DEFAULT_EFFICIENCY_IDLE_BELOW);
    check_idle(idle_below, "hours", hours)?;
    Ok(ApiJson(report(&state, hours, idle_below, now_ms()).await?))
}

/// Fleet efficiency per UTC day over the last `days` (at most 90; platform admins): MIG compute slices allocated,
/// placeable, stranded and cordoned (means over the day's samples, one every 10 minutes while a server runs), the
/// compute-slice-hours held, measured and used, and the GPU-hours held and wasted, with their cost at today's
/// prices; of one model or the whole fleet. Days with nothing recorded are left out.
#[utoipa::path(get, path = "/api/v1/efficiency/history", tag = "usage", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    params(HistoryQuery),
    responses((status = 200, body = EfficiencyHistory), (status = 400, body = Problem), (status = 401, body = Problem),
        (status = 403, body = Problem),
        (status = 422, body = Problem, description = "invalid_days, unknown_model or value_too_long")))]
pub async fn efficiency_history(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiQuery(q): ApiQuery<HistoryQuery>,
) -> Result<ApiJson<EfficiencyHistory>, ApiError> {
    Ok(ApiJson(tessera_services::efficiency::history(&state, &p, &q, now_ms()).await?))
}

/// The price list: what a GPU-hour of each model costs, in one currency (any signed-in user). The efficiency report
/// and its history cost what was held and wasted with it.
#[utoipa::path(get, path = "/api/v1/prices", tag = "usage", security(("token" = ["user"]), ("session" = ["user"])),
    responses((status = 200, body = Prices), (status = 401, body = Problem)))]
pub async fn prices(State(state): State<AppState>, Caller(_p): Caller) -> Result<ApiJson<Prices>, ApiError> {
    Ok(ApiJson(tessera_services::efficiency::prices(&state).await?))
}

/// Replaces the price list whole (platform admins; `prices.set` in the audit log): a currency (ISO 4217, three
/// capital letters) and at most one price per GPU-hour (0 to 1,000,000) per catalog model. An empty list removes
/// every price.
#[utoipa::path(put, path = "/api/v1/prices", tag = "usage", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    request_body = PricesBody,
    responses((status = 200, body = Prices), (status = 400, body = Problem), (status = 401, body = Problem),
        (status = 403, body = Problem),
        (status = 422, body = Problem, description = "invalid_currency, unknown_model, duplicate_model, invalid_price or value_too_long")))]
pub async fn set_prices(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiJson(body): ApiJson<PricesBody>,
) -> Result<ApiJson<Prices>, ApiError> {
    Ok(ApiJson(tessera_services::efficiency::set_prices(&state, &p, &body).await?))
}

/// `422 invalid_idle` unless `below` is a percentage and `hours` (the parameter `name`) a look-back the telemetry
/// keeps.
fn check_idle(below: f64, name: &str, hours: f64) -> Result<(), ApiError> {
    if IDLE_BELOW.contains(&below) && IDLE_HOURS.contains(&hours) {
        return Ok(());
    }
    Err(ApiError::invalid(
        "invalid_idle",
        format!(
            "`idle_below` is a percentage from {} to {}, `{name}` a number of hours from {} to {}",
            IDLE_BELOW.start(),
            IDLE_BELOW.end(),
            IDLE_HOURS.start(),
            IDLE_HOURS.end()
        ),
    ))
}

/// Right-sizing: per active allocation the caller may see (platform admins: the fleet), its peak memory and the
/// 95th percentile of its one-minute mean utilisation over the last `days` (or its life, when shorter), and the
/// smallest profile of its model and variant that would carry both with `headroom_pct`, with the compute slices and
/// slice-hours that would save. Time-sliced and MPS shares are listed as `shared_device` (their device reports every
/// holder at once); allocations with under an hour of telemetry as `not_enough_data`.
#[utoipa::path(get, path = "/api/v1/rightsizing", tag = "usage", security(("token" = ["user"]), ("session" = ["user"])),
    params(RightsizeQuery),
    responses((status = 200, body = RightsizeReport), (status = 401, body = Problem), (status = 404, body = Problem),
        (status = 422, body = Problem, description = "invalid_days or invalid_headroom")))]
pub async fn rightsizing(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiQuery(q): ApiQuery<RightsizeQuery>,
) -> Result<ApiJson<RightsizeReport>, ApiError> {
    use tessera_core::rightsize::{DEFAULT_HEADROOM, MAX_HEADROOM};
    use tessera_services::rightsize::{DAYS, DEFAULT_DAYS, report};
    let days = q.days.unwrap_or(DEFAULT_DAYS);
    if !DAYS.contains(&days) {
        return Err(ApiError::invalid(
            "invalid_days",
            format!("`days` is a whole number of days from {} to {}", DAYS.start(), DAYS.end()),
        ));
    }
    let headroom_pct = q.headroom_pct.unwrap_or(DEFAULT_HEADROOM * 100.0);
    if !(0.0..=MAX_HEADROOM * 100.0).contains(&headroom_pct) {
        return Err(ApiError::invalid(
            "invalid_headroom",
            format!("`headroom_pct` is a percentage from 0 to {}", MAX_HEADROOM * 100.0),
        ));
    }
    let tenants = match p.reading_scope(q.tenant.as_deref())? {
        Scope::Fleet => None,
        Scope::Tenants(tenants) => Some(tenants),
    };
    Ok(ApiJson(report(&state, tenants.as_deref(), days, headroom_pct, now_ms()).await?))
}
