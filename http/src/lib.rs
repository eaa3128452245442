//! The HTTP API: one router per resource, merged with their OpenAPI descriptions (routes and spec come from the
//! same `#[utoipa::path]` annotations), behind tracing, request ids, compression, a body limit and a timeout.

pub mod agents;
mod allocations;
pub mod audit;
pub mod auth;
mod budgets;
mod catalog;
mod clusters;
mod cohorts;
mod docs;
pub mod error;
mod health;
mod layouts;
pub mod listen;
pub mod malformed;
pub(crate) mod nodes;
mod notifications;
mod people;
pub mod precondition;
mod quotas;
mod requests;
mod reservations;
pub mod signin;
mod streams;
pub mod telemetry;
mod tenants;
pub mod usage;

use std::time::Duration;

use axum::Router;
use axum::http::{HeaderName, StatusCode};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::compression::CompressionLayer;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use tessera_services::app::AppState;

pub use tessera_services::error::BODY_LIMIT;
/// Longest a request may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Latest time a query parameter may name, UTC ms (9999-12-31T23:59:59.999Z). Times are in `0..=MAX_TIME_MS`, so
/// that no arithmetic on them (ranges, steps, defaults such as "30 days before") can overflow.
pub const MAX_TIME_MS: i64 = 253_402_300_799_999;

/// Checks a time parameter: `None` stays `None`; a value outside `0..=MAX_TIME_MS` is a 422 `invalid_time`.
pub fn time_param(name: &str, value: Option<i64>) -> Result<Option<i64>, error::ApiError> {
    match value {
        Some(v) if !(0..=MAX_TIME_MS).contains(&v) => Err(error::ApiError::invalid(
            "invalid_time",
            format!("`{name}` is a time in UTC milliseconds from 0 to {MAX_TIME_MS}"),
        )),
        v => Ok(v),
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "Tessera", description = "Self-service GPU slices: MIG, time-slicing, MPS, with quotas and approvals."),
    modifiers(&BearerToken),
    // Named only by query parameters, which utoipa does not collect.
    components(schemas(tessera_api::requests::ListOrder)),
    tags(
        (name = "health", description = "Liveness and readiness"),
        (name = "catalog", description = "GPU models and MIG profiles"),
        (name = "tenants", description = "Tenants, quotas and cohorts"),
        (name = "reservations", description = "Slices booked for a window ahead, and the policies that bound them"),
        (name = "requests", description = "Slice requests and approvals"),
        (name = "fleet", description = "Nodes and GPUs"),
        (name = "clusters", description = "Kubernetes clusters, the namespaces tenants get in them, and their nodes"),
        (name = "layouts", description = "MIG layout proposals"),
        (name = "people", description = "Users, memberships and API tokens"),
        (name = "audit", description = "Who changed what, when"),
        (name = "notifications", description = "Webhooks, their deliveries, and the inbox of events"),
        (name = "auth", description = "Signing in and out"),
        (name = "telemetry", description = "Heatmaps, live samples and Prometheus metrics"),
        (name = "usage", description = "Metered usage for chargeback"),
    )
)]
struct ApiDoc;

struct BearerToken;

impl Modify for BearerToken {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let token = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .bearer_format("tsr_... or a JWT access token from the identity provider")
            .description(Some(
                "A Tessera API token or the identity provider's access token. Each operation lists, as this \
                 scheme's scopes, the role it needs: `user` (anybody signed in; objects of tenants the caller is \
                 not in are 404), `tenant-member`, `tenant-admin`, `platform-admin`.",
            ))
            .build();
        components.add_security_scheme("token", SecurityScheme::Http(token));
        let session = ApiKey::Cookie(ApiKeyValue::with_description(
            "tessera_session",
            "Browser session from /auth/callback or /auth/local; state changes also need the `X-CSRF-Token` header.",
        ));
        components.add_security_scheme("session", SecurityScheme::ApiKey(session));
        let node = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .bearer_format("tsn_...")
            .description(Some("A node credential: the agent routes of its own node only."))
            .build();
        components.add_security_scheme("node", SecurityScheme::Http(node));
    }
}

fn api() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(catalog::list_models))
        .routes(routes!(catalog::get_model))
        .routes(routes!(catalog::validate_layout))
        .routes(routes!(tenants::create_tenant, tenants::list_tenants))
        .routes(routes!(tenants::get_tenant))
        .routes(routes!(tenants::get_quotas, tenants::set_quotas))
        .routes(routes!(tenants::set_policy))
        .routes(routes!(cohorts::create_cohort, cohorts::list_cohorts))
        .routes(routes!(cohorts::get_cohort, cohorts::update_cohort))
        .routes(routes!(cohorts::set_membership))
        .routes(routes!(clusters::create_cluster, clusters::list_clusters))
        .routes(routes!(clusters::get_cluster, clusters::update_cluster, clusters::delete_cluster))
        .routes(routes!(clusters::govern_namespace, clusters::release_namespace))
        .routes(routes!(clusters::set_node_cluster))
        .routes(routes!(clusters::tenant_namespaces))
        .routes(routes!(quotas::create_quota_request))
        .routes(routes!(quotas::suggest_quota))
        .routes(routes!(quotas::quota_history))
        .routes(routes!(quotas::quota_timeline))
        .routes(routes!(quotas::quota_standing))
        .routes(routes!(budgets::get_budget, budgets::set_budget))
        .routes(routes!(requests::tenant_waiting))
        .routes(routes!(requests::preview_request))
        .routes(routes!(quotas::list_quota_requests))
        .routes(routes!(quotas::get_quota_request))
        .routes(routes!(quotas::approve_quota_request))
        .routes(routes!(quotas::reject_quota_request))
        .routes(routes!(quotas::cancel_quota_request))
        .routes(routes!(reservations::create_reservation))
        .routes(routes!(reservations::preview_reservation))
        .routes(routes!(reservations::list_reservations))
        .routes(routes!(reservations::get_reservation))
        .routes(routes!(reservations::approve_reservation))
        .routes(routes!(reservations::reject_reservation))
        .routes(routes!(reservations::cancel_reservation))
        .routes(routes!(reservations::get_global_policy, reservations::set_global_policy))
        .routes(routes!(reservations::calendar))
        .routes(routes!(reservations::get_tenant_policy, reservations::set_tenant_policy))
        .routes(routes!(requests::create_request, requests::list_requests))
        .routes(routes!(requests::get_request))
        .routes(routes!(requests::approve_request))
        .routes(routes!(requests::reject_request))
        .routes(routes!(requests::cancel_request))
        .routes(routes!(requests::release_request))
        .routes(routes!(allocations::request_placement))
        .routes(routes!(nodes::register_node, nodes::list_nodes))
        .routes(routes!(nodes::cordon_gpu))
        .routes(routes!(nodes::uncordon_gpu))
        .routes(routes!(nodes::drain_gpu))
        .routes(routes!(nodes::set_auto_layout))
        .routes(routes!(layouts::list_layouts))
        .routes(routes!(layouts::get_layout))
        .routes(routes!(layouts::edit_layout))
        .routes(routes!(allocations::list_allocations))
        .routes(routes!(allocations::rightsize_allocation))
        .routes(routes!(nodes::offerings))
        .routes(routes!(layouts::approve_layout))
        .routes(routes!(layouts::reject_layout))
        .routes(routes!(layouts::preview_defragmentation, layouts::propose_defragmentation))
        .routes(routes!(people::create_user, people::list_users))
        .routes(routes!(people::set_member, people::remove_member))
        .routes(routes!(people::list_members))
        .routes(routes!(people::create_token, people::list_tokens))
        .routes(routes!(people::revoke_token))
        .routes(routes!(audit::audit))
        .routes(routes!(audit::entries))
        .routes(routes!(signin::methods))
        .routes(routes!(signin::login))
        .routes(routes!(signin::callback))
        .routes(routes!(signin::local))
        .routes(routes!(signin::link))
        .routes(routes!(signin::logout))
        .routes(routes!(signin::whoami))
        .routes(routes!(people::set_password))
        .routes(routes!(people::sign_in_link))
        .routes(routes!(nodes::create_node_credential, nodes::revoke_node_credentials))
        .routes(routes!(nodes::agent_node))
        .routes(routes!(nodes::create_join_token, nodes::list_join_tokens))
        .routes(routes!(nodes::delete_join_token))
        .routes(routes!(agents::join))
        .routes(routes!(agents::put_inventory))
        .routes(routes!(agents::get_spec))
        .routes(routes!(agents::put_status))
        .routes(routes!(agents::heartbeat))
        .routes(routes!(agents::websocket))
        .routes(routes!(telemetry::ingest))
        .routes(routes!(telemetry::heatmap))
        .routes(routes!(telemetry::live))
        .routes(routes!(telemetry::metrics))
        .routes(routes!(usage::usage))
        .routes(routes!(usage::efficiency))
        .routes(routes!(usage::efficiency_history))
        .routes(routes!(usage::prices, usage::set_prices))
        .routes(routes!(usage::rightsizing))
        .routes(routes!(notifications::create_tenant_webhook, notifications::list_tenant_webhooks))
        .routes(routes!(notifications::create_webhook, notifications::list_webhooks))
        .routes(routes!(notifications::get_webhook, notifications::delete_webhook))
        .routes(routes!(notifications::rotate_secret))
        .routes(routes!(notifications::test_webhook))
        .routes(routes!(notifications::list_deliveries))
        .routes(routes!(notifications::redeliver))
        .routes(routes!(notifications::event_types))
        .routes(routes!(notifications::inbox))
        .routes(routes!(notifications::inbox_unread))
        .routes(routes!(notifications::inbox_read))
        .routes(routes!(notifications::inbox_stream))
        .routes(routes!(notifications::notification_settings, notifications::set_notification_settings))
}

/// The OpenAPI 3.1 description of the API.
pub fn openapi() -> utoipa::openapi::OpenApi {
    complete(api().split_for_parts().1)
}

/// Adds to every operation what any handler can answer beyond what its annotation lists, so that the document is a
/// contract: problem reports as `application/problem+json`; 400 for an unreadable query, path or header; 401 and
/// 403 where credentials are needed; 413, 415 and 422 where a body is read; 408 (the request timeout), 500 and 503 (the
/// database) everywhere.
fn complete(doc: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    let Ok(mut v) = serde_json::to_value(&doc) else { return doc };
    let problem = serde_json::json!({"$ref": "#/components/schemas/Problem"});
    let answer = |description: &str| serde_json::json!({"description": description, "content": {"application/problem+json": {"schema": problem}}});
    for item in v.get_mut("paths").and_then(|p| p.as_object_mut()).into_iter().flat_map(|p| p.values_mut()) {
        let Some(item) = item.as_object_mut() else { continue };
        for (method, op) in item.iter_mut() {
            if !matches!(method.as_str(), "get" | "put" | "post" | "delete" | "patch") {
                continue;
            }
            let has_body = op.get("requestBody").is_some();
            let has_params = op.get("parameters").and_then(|p| p.as_array()).is_some_and(|p| !p.is_empty());
            let secured = op
                .get("security")
                .and_then(|s| s.as_array())
                .is_some_and(|s| !s.is_empty() && s.iter().all(|r| r.as_object().is_some_and(|r| !r.is_empty())));
            let Some(responses) = op.get_mut("responses").and_then(|r| r.as_object_mut()) else { continue };
            for response in responses.values_mut() {
                let Some(content) = response.get_mut("content").and_then(|c| c.as_object_mut()) else { continue };
                if content.get("application/json").and_then(|c| c.get("schema")) == Some(&problem)
                    && let Some(c) = content.remove("application/json")
                {
                    content.insert("application/problem+json".to_string(), c);
                }
            }
            let mut add = |code: &str, description: &str| {
                responses.entry(code.to_string()).or_insert_with(|| answer(description));
            };
            if has_body || has_params {
                add("400", "invalid_query, invalid_body or a malformed header");
            }
            if secured {
                add("401", "unauthenticated or invalid_token");
                // A node credential on a user route, a user's on an agent route, or a role below the one needed.
                add("403", "forbidden, node_credential or user_credential");
            }
            if has_body {
                add("413", "body_too_large: the body has more than 1 MiB");
                add("415", "invalid_body: the body is not `application/json`");
                add("422", "invalid_body: the body does not match its schema");
            }
            add("408", "request_timeout: the request took longer than 30 s");
            add("500", "internal: a fault of the server (logged)");
            add("503", "unavailable: the database cannot be reached");
        }
    }
    serde_json::from_value(v).unwrap_or(doc)
}

/// Logs a failed answer: a 503 (a replica shutting down answers its readiness probes so, a database that does not
/// answer) as a warning, every other server error as an error.
fn log_failure(
    class: tower_http::classify::ServerErrorsFailureClass,
    latency: std::time::Duration,
    _span: &tracing::Span,
) {
    let latency_ms = latency.as_millis();
    match class {
        tower_http::classify::ServerErrorsFailureClass::StatusCode(StatusCode::SERVICE_UNAVAILABLE) => {
            tracing::warn!(latency_ms, "answered 503 Service Unavailable");
        }
        class => tracing::error!(%class, latency_ms, "response failed"),
    }
}

/// The application, ready to serve: the API, and `pages` (the portal's routes, given the API router they read
/// through: `tessera_portal::routes`), behind the same limits, timeouts, problem reports and tracing.
pub fn router(state: AppState, pages: impl FnOnce(Router) -> Router) -> Router {
    let request_id = HeaderName::from_static("x-request-id");
    let (router, _) = api().split_for_parts();
    let api: Router = router
        .route("/api/docs", axum::routing::get(docs::reference))
        .route("/api/openapi.json", axum::routing::get(docs::openapi_json))
        .with_state(state);
    api.clone()
        .merge(pages(api))
        .layer(CompressionLayer::new())
        .layer(RequestBodyLimitLayer::new(BODY_LIMIT))
        .layer(TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, REQUEST_TIMEOUT))
        // The limit and timeout layers answer by themselves, in plain text or with no body: problem reports instead.
        .layer(axum::middleware::map_response(error::problem_for_bare_errors))
        // A backstop, not a way of handling input: a panicking handler answers 500 problem+json and is logged.
        .layer(CatchPanicLayer::custom(error::panic_response))
        .layer(PropagateRequestIdLayer::new(request_id.clone()))
        .layer(TraceLayer::new_for_http().on_failure(log_failure))
        .layer(SetRequestIdLayer::new(request_id, MakeRequestUuid))
}
