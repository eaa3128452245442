//! Users, tenant memberships and API tokens. Token secrets are returned once, at creation; only their hash is kept,
//! and no listing returns either.

use axum::extract::{Path, State};
use axum::http::StatusCode;

use super::auth::{new_token_secret, require_platform_admin, require_visible, token_hash};
use super::error::{ApiError, ApiJson, Problem};
use crate::app::AppState;
use crate::auth::{MIN_PASSWORD, hash_password, verify_password};
use crate::store::people::TokenInfo;
use crate::store::{Principal, Role, User};
pub use tessera_api::people::{
    CreatedToken, MemberView, Membership, NewPassword, NewToken, NewUser, TokenView, UserView,
};

impl From<User> for UserView {
    fn from(u: User) -> Self {
        UserView { id: u.id, name: u.name, platform_admin: u.platform_admin }
    }
}

/// Create a user (platform admins).
#[utoipa::path(post, path = "/api/v1/users", tag = "people", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])), request_body = NewUser,
    responses((status = 201, body = UserView), (status = 403, body = Problem), (status = 409, body = Problem),
        (status = 422, body = Problem)))]
pub async fn create_user(
    State(state): State<AppState>,
    p: Principal,
    ApiJson(body): ApiJson<NewUser>,
) -> Result<(StatusCode, ApiJson<UserView>), ApiError> {
    require_platform_admin(&p)?;
    let name = body.name.trim();
    tessera_core::text::check_user_name(name).map_err(|e| ApiError::invalid("invalid_name", e.to_string()))?;
    let user = state.store.create_user(name, body.platform_admin, &p.actor()).await?;
    Ok((StatusCode::CREATED, ApiJson(user.into())))
}

/// Every user, by name (platform admins).
#[utoipa::path(get, path = "/api/v1/users", tag = "people", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    responses((status = 200, body = Vec<UserView>), (status = 403, body = Problem)))]
pub async fn list_users(State(state): State<AppState>, p: Principal) -> Result<ApiJson<Vec<UserView>>, ApiError> {
    require_platform_admin(&p)?;
    Ok(ApiJson(state.store.users().await?.into_iter().map(Into::into).collect()))
}

/// Add a user to a tenant or change their role (platform admins, or the tenant's own admins).
#[utoipa::path(put, path = "/api/v1/tenants/{id}/members/{user}", tag = "people", security(("token" = ["tenant-admin"]), ("session" = ["tenant-admin"])),
    params(("id" = String, Path), ("user" = String, Path, description = "user id")), request_body = Membership,
    responses((status = 204), (status = 403, body = Problem), (status = 404, body = Problem)))]
pub async fn set_member(
    State(state): State<AppState>,
    p: Principal,
    Path((tenant, user)): Path<(String, String)>,
    ApiJson(body): ApiJson<Membership>,
) -> Result<StatusCode, ApiError> {
    require_visible(&p, &tenant, "tenant")?;
    if !p.user.platform_admin && p.role_in(&tenant) != Some(Role::TenantAdmin) {
        return Err(ApiError::Forbidden("only platform admins and the tenant's admins manage members".to_string()));
    }
    state.store.set_membership(&user, &tenant, body.role, &p.actor()).await?;
    state.principals.clear();
    Ok(StatusCode::NO_CONTENT)
}

/// Take a user out of a tenant (platform admins, or the tenant's own admins).
#[utoipa::path(delete, path = "/api/v1/tenants/{id}/members/{user}", tag = "people", security(("token" = ["tenant-admin"]), ("session" = ["tenant-admin"])),
    params(("id" = String, Path), ("user" = String, Path, description = "user id")),
    responses((status = 204), (status = 403, body = Problem),
        (status = 404, body = Problem, description = "no such tenant, or the user is not a member")))]
pub async fn remove_member(
    State(state): State<AppState>,
    p: Principal,
    Path((tenant, user)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    require_visible(&p, &tenant, "tenant")?;
    if !p.user.platform_admin && p.role_in(&tenant) != Some(Role::TenantAdmin) {
        return Err(ApiError::Forbidden("only platform admins and the tenant's admins manage members".to_string()));
    }
    state.store.remove_membership(&user, &tenant, &p.actor()).await?;
    state.principals.clear();
    Ok(StatusCode::NO_CONTENT)
}

impl From<TokenInfo> for TokenView {
    fn from(t: TokenInfo) -> Self {
        TokenView { id: t.id, name: t.name, created_at_ms: t.created_at_ms, revoked_at_ms: t.revoked_at_ms }
    }
}

/// Your own API tokens, revoked ones included, newest first.
#[utoipa::path(get, path = "/api/v1/tokens", tag = "people", security(("token" = ["user"]), ("session" = ["user"])),
    responses((status = 200, body = Vec<TokenView>)))]
pub async fn list_tokens(State(state): State<AppState>, p: Principal) -> Result<ApiJson<Vec<TokenView>>, ApiError> {
    Ok(ApiJson(state.store.tokens(&p.user.id).await?.into_iter().map(Into::into).collect()))
}

/// Create an API token for yourself; the secret is in the response and nowhere else.
#[utoipa::path(post, path = "/api/v1/tokens", tag = "people", security(("token" = ["user"]), ("session" = ["user"])), request_body = NewToken,
    responses((status = 201, body = CreatedToken), (status = 422, body = Problem)))]
pub async fn create_token(
    State(state): State<AppState>,
    p: Principal,
    ApiJson(body): ApiJson<NewToken>,
) -> Result<(StatusCode, ApiJson<CreatedToken>), ApiError> {
    let name = body.name.trim();
    if name.is_empty() || name.len() > 100 {
        return Err(ApiError::invalid("invalid_name", "a token name is 1-100 characters"));
    }
    let secret = new_token_secret();
    let id = state.store.create_token(&p.user.id, name, &token_hash(&secret), &p.actor()).await?;
    Ok((StatusCode::CREATED, ApiJson(CreatedToken { id, name: name.to_string(), secret })))
}

/// Revoke a token: your own, or anyone's as a platform admin.
#[utoipa::path(post, path = "/api/v1/tokens/{id}/revoke", tag = "people", security(("token" = ["user"]), ("session" = ["user"])),
    params(("id" = String, Path)), responses((status = 204), (status = 404, body = Problem)))]
pub async fn revoke_token(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let owner = if p.user.platform_admin { None } else { Some(p.user.id.as_str()) };
    state.store.revoke_token(&id, owner, &p.actor()).await?;
    state.principals.clear();
    Ok(StatusCode::NO_CONTENT)
}

/// A tenant's members (its members, or platform admins).
#[utoipa::path(get, path = "/api/v1/tenants/{id}/members", tag = "people", security(("token" = ["tenant-member"]), ("session" = ["tenant-member"])),
    params(("id" = String, Path)), responses((status = 200, body = Vec<MemberView>), (status = 404, body = Problem)))]
pub async fn list_members(
    State(state): State<AppState>,
    p: Principal,
    Path(tenant): Path<String>,
) -> Result<ApiJson<Vec<MemberView>>, ApiError> {
    require_visible(&p, &tenant, "tenant")?;
    state.store.tenant(&tenant).await?;
    let members = state.store.members(&tenant).await?;
    Ok(ApiJson(members.into_iter().map(|(u, role)| MemberView { id: u.id, name: u.name, role }).collect()))
}

/// Set a local password: your own (with the current one, if set), or anybody's (platform admins).
#[utoipa::path(put, path = "/api/v1/users/{id}/password", tag = "people",
    security(("token" = ["user"]), ("session" = ["user"])), params(("id" = String, Path)), request_body = NewPassword,
    responses((status = 204), (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 404, body = Problem), (status = 422, body = Problem)))]
pub async fn set_password(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<NewPassword>,
) -> Result<StatusCode, ApiError> {
    let own = p.user.id == id;
    if !own && !p.user.platform_admin {
        return Err(ApiError::NotFound("user not found".into()));
    }
    if !state.auth.local_accounts {
        return Err(ApiError::forbidden("local_accounts_disabled", "local accounts are turned off"));
    }
    // A password would let a provider's user sign in past the provider (its MFA, its deprovisioning).
    if own && !p.user.platform_admin && state.store.is_sso_user(&id).await? {
        return Err(ApiError::forbidden("sso_user", "users who sign in with single sign-on have no local password"));
    }
    if body.password.chars().count() < MIN_PASSWORD {
        return Err(ApiError::invalid("weak_password", format!("a password has at least {MIN_PASSWORD} characters")));
    }
    if own && let Some((_, current)) = state.store.password_hash(&p.user.name).await? {
        let given = body.current_password.clone().unwrap_or_default();
        let ok = tokio::task::spawn_blocking(move || verify_password(&given, &current))
            .await
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        if !ok {
            return Err(ApiError::forbidden("bad_credentials", "the current password is wrong"));
        }
    }
    let password = body.password;
    let hash = tokio::task::spawn_blocking(move || hash_password(&password))
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?
        .map_err(ApiError::Internal)?;
    state.store.set_password_hash(&id, Some(&hash), &p.actor()).await?;
    // Every session of the user ends: whoever knew the old password is signed out.
    state.store.delete_user_sessions(&id).await?;
    state.principals.clear();
    Ok(StatusCode::NO_CONTENT)
}
