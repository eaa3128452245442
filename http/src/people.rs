//! Users, tenant memberships and API tokens. Token secrets are returned once, at creation; only their hash is kept,
//! and no listing returns either.

use crate::auth::Caller;
use axum::extract::State;
use axum::http::StatusCode;

use super::error::{ApiError, ApiJson, ApiPath, Problem};
pub use tessera_api::people::{
    CreatedToken, MemberView, Membership, NewPassword, NewToken, NewUser, TokenView, UserView,
};
use tessera_api::signin::SignInLink;
use tessera_services::app::AppState;
use tessera_services::people;

/// Create a user (platform admins).
#[utoipa::path(post, path = "/api/v1/users", tag = "people", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])), request_body = NewUser,
    responses((status = 201, body = UserView), (status = 403, body = Problem), (status = 409, body = Problem),
        (status = 422, body = Problem)))]
pub async fn create_user(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiJson(body): ApiJson<NewUser>,
) -> Result<(StatusCode, ApiJson<UserView>), ApiError> {
    let user = people::create_user(&state, &p, &body.name, body.platform_admin).await?;
    Ok((StatusCode::CREATED, ApiJson(user.into())))
}

/// Every user, by name (platform admins).
#[utoipa::path(get, path = "/api/v1/users", tag = "people", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    responses((status = 200, body = Vec<UserView>), (status = 403, body = Problem)))]
pub async fn list_users(State(state): State<AppState>, Caller(p): Caller) -> Result<ApiJson<Vec<UserView>>, ApiError> {
    Ok(ApiJson(people::users(&state, &p).await?.into_iter().map(Into::into).collect()))
}

/// Add a user to a tenant or change their role (platform admins, or the tenant's own admins).
#[utoipa::path(put, path = "/api/v1/tenants/{id}/members/{user}", tag = "people", security(("token" = ["tenant-admin"]), ("session" = ["tenant-admin"])),
    params(("id" = String, Path), ("user" = String, Path, description = "user id")), request_body = Membership,
    responses((status = 204), (status = 403, body = Problem), (status = 404, body = Problem)))]
pub async fn set_member(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath((tenant, user)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<Membership>,
) -> Result<StatusCode, ApiError> {
    people::set_member(&state, &p, &tenant, &user, body.role).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Take a user out of a tenant (platform admins, or the tenant's own admins).
#[utoipa::path(delete, path = "/api/v1/tenants/{id}/members/{user}", tag = "people", security(("token" = ["tenant-admin"]), ("session" = ["tenant-admin"])),
    params(("id" = String, Path), ("user" = String, Path, description = "user id")),
    responses((status = 204), (status = 403, body = Problem),
        (status = 404, body = Problem, description = "no such tenant, or the user is not a member")))]
pub async fn remove_member(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath((tenant, user)): ApiPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    people::remove_member(&state, &p, &tenant, &user).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Your own API tokens, revoked ones included, newest first.
#[utoipa::path(get, path = "/api/v1/tokens", tag = "people", security(("token" = ["user"]), ("session" = ["user"])),
    responses((status = 200, body = Vec<TokenView>)))]
pub async fn list_tokens(
    State(state): State<AppState>,
    Caller(p): Caller,
) -> Result<ApiJson<Vec<TokenView>>, ApiError> {
    Ok(ApiJson(people::tokens(&state, &p).await?.into_iter().map(Into::into).collect()))
}

/// Create an API token for yourself; the secret is in the response and nowhere else.
#[utoipa::path(post, path = "/api/v1/tokens", tag = "people", security(("token" = ["user"]), ("session" = ["user"])), request_body = NewToken,
    responses((status = 201, body = CreatedToken), (status = 422, body = Problem)))]
pub async fn create_token(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiJson(body): ApiJson<NewToken>,
) -> Result<(StatusCode, ApiJson<CreatedToken>), ApiError> {
    let (id, name, secret) = people::create_token(&state, &p, &body.name).await?;
    Ok((StatusCode::CREATED, ApiJson(CreatedToken { id, name, secret })))
}

/// Revoke a token: your own, or anyone's as a platform admin.
#[utoipa::path(post, path = "/api/v1/tokens/{id}/revoke", tag = "people", security(("token" = ["user"]), ("session" = ["user"])),
    params(("id" = String, Path)), responses((status = 204), (status = 404, body = Problem)))]
pub async fn revoke_token(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    people::revoke_token(&state, &p, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A tenant's members (its members, or platform admins).
#[utoipa::path(get, path = "/api/v1/tenants/{id}/members", tag = "people", security(("token" = ["tenant-member"]), ("session" = ["tenant-member"])),
    params(("id" = String, Path)), responses((status = 200, body = Vec<MemberView>), (status = 404, body = Problem)))]
pub async fn list_members(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(tenant): ApiPath<String>,
) -> Result<ApiJson<Vec<MemberView>>, ApiError> {
    let members = people::members(&state, &p, &tenant).await?;
    Ok(ApiJson(members.into_iter().map(|(u, role)| MemberView { id: u.id, name: u.name, role }).collect()))
}

/// Set a local password: your own (with the current one, if set), or anybody's (platform admins).
#[utoipa::path(put, path = "/api/v1/users/{id}/password", tag = "people",
    security(("token" = ["user"]), ("session" = ["user"])), params(("id" = String, Path)), request_body = NewPassword,
    responses((status = 204), (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 404, body = Problem), (status = 422, body = Problem)))]
pub async fn set_password(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<NewPassword>,
) -> Result<StatusCode, ApiError> {
    people::set_password(&state, &p, &id, body.password, body.current_password).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Issue a one-time sign-in link for a user (platform admins), e.g. one just created: the user opens it, is
/// signed in, and sets a password. It works once, for 72 hours, and replaces the user's previous link.
#[utoipa::path(post, path = "/api/v1/users/{id}/sign-in-link", tag = "people",
    security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])), params(("id" = String, Path)),
    responses((status = 201, body = SignInLink), (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 404, body = Problem)))]
pub async fn sign_in_link(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<(StatusCode, ApiJson<SignInLink>), ApiError> {
    let link = people::sign_in_link(&state, &p, &id).await?;
    Ok((StatusCode::CREATED, ApiJson(SignInLink { path: link.path(), expires_at_ms: link.expires_at_ms })))
}
