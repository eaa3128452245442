//! The HTTP API: one router per resource, merged with their OpenAPI descriptions (routes and spec come from the
//! same `#[utoipa::path]` annotations), behind tracing, request ids, compression, a body limit and a timeout.

pub mod agents;
mod audit;
pub mod auth;
mod catalog;
mod docs;
pub mod error;
mod health;
mod layouts;
pub(crate) mod nodes;
mod people;
mod requests;
pub mod signin;
pub mod telemetry;
mod tenants;
pub mod usage;

use std::time::Duration;

use axum::Router;
use axum::http::{HeaderName, StatusCode};
use tower_http::compression::CompressionLayer;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::AppState;

/// Largest request body accepted.
pub const BODY_LIMIT: usize = 1024 * 1024;
/// Longest a request may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(OpenApi)]
#[openapi(
    info(title = "Tessera", description = "Self-service GPU slices: MIG, time-slicing, MPS, with quotas and approvals."),
    modifiers(&BearerToken),
    tags(
        (name = "health", description = "Liveness and readiness"),
        (name = "catalog", description = "GPU models and MIG profiles"),
        (name = "tenants", description = "Tenants and quotas"),
        (name = "requests", description = "Slice requests and approvals"),
        (name = "fleet", description = "Nodes and GPUs"),
        (name = "layouts", description = "MIG layout proposals"),
        (name = "people", description = "Users, memberships and API tokens"),
        (name = "audit", description = "Who changed what, when"),
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
        .routes(routes!(requests::create_request, requests::list_requests))
        .routes(routes!(requests::get_request))
        .routes(routes!(requests::approve_request))
        .routes(routes!(requests::reject_request))
        .routes(routes!(requests::cancel_request))
        .routes(routes!(requests::release_request))
        .routes(routes!(nodes::request_placement))
        .routes(routes!(nodes::register_node, nodes::list_nodes))
        .routes(routes!(nodes::cordon_gpu))
        .routes(routes!(nodes::uncordon_gpu))
        .routes(routes!(layouts::set_auto_layout))
        .routes(routes!(layouts::list_layouts))
        .routes(routes!(layouts::get_layout))
        .routes(routes!(layouts::edit_layout))
        .routes(routes!(nodes::list_allocations))
        .routes(routes!(nodes::offerings))
        .routes(routes!(layouts::approve_layout))
        .routes(routes!(layouts::reject_layout))
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
        .routes(routes!(signin::logout))
        .routes(routes!(signin::whoami))
        .routes(routes!(signin::set_password))
        .routes(routes!(signin::create_node_credential, signin::revoke_node_credentials))
        .routes(routes!(signin::agent_node))
        .routes(routes!(agents::create_join_token, agents::list_join_tokens))
        .routes(routes!(agents::delete_join_token))
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
}

/// The OpenAPI 3.1 description of the API.
pub fn openapi() -> utoipa::openapi::OpenApi {
    api().split_for_parts().1
}

/// The application, ready to serve.
pub fn router(state: AppState) -> Router {
    let request_id = HeaderName::from_static("x-request-id");
    let (router, _) = api().split_for_parts();
    let api: Router = router
        .route("/api/docs", axum::routing::get(docs::reference))
        .route("/api/openapi.json", axum::routing::get(docs::openapi_json))
        .with_state(state);
    api.clone()
        .merge(crate::portal::routes(api))
        .layer(CompressionLayer::new())
        .layer(RequestBodyLimitLayer::new(BODY_LIMIT))
        .layer(TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, REQUEST_TIMEOUT))
        .layer(PropagateRequestIdLayer::new(request_id.clone()))
        .layer(TraceLayer::new_for_http())
        .layer(SetRequestIdLayer::new(request_id, MakeRequestUuid))
}
