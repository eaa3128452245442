//! Users, tenant memberships, API tokens and local passwords: who may manage whom, and what each change ends
//! (a changed membership or a revoked token stops working at once on this replica; a new password signs the user
//! out everywhere).

use crate::app::AppState;
use crate::auth::Permissions;
use crate::auth::secrets::{new_token_secret, token_hash};
use crate::auth::{MIN_PASSWORD, hash_password, verify_password};
use crate::error::ApiError;
use tessera_store::people::TokenInfo;
use tessera_store::{Principal, Role, User};

/// Most characters of a token's name.
const MAX_TOKEN_NAME: usize = 100;

/// Creates a user (platform admins).
pub async fn create_user(state: &AppState, p: &Principal, name: &str, platform_admin: bool) -> Result<User, ApiError> {
    p.require_platform_admin()?;
    let name = name.trim();
    tessera_core::text::check_user_name(name).map_err(|e| ApiError::invalid("invalid_name", e.to_string()))?;
    Ok(state.store.create_user(name, platform_admin, &p.actor()).await?)
}

/// Every user, by name (platform admins).
pub async fn users(state: &AppState, p: &Principal) -> Result<Vec<User>, ApiError> {
    p.require_platform_admin()?;
    Ok(state.store.users().await?)
}

/// Adds a user to a tenant or changes their role (platform admins, or the tenant's own admins).
pub async fn set_member(state: &AppState, p: &Principal, tenant: &str, user: &str, role: Role) -> Result<(), ApiError> {
    p.require_tenant_admin(tenant)?;
    state.store.set_membership(user, tenant, role, &p.actor()).await?;
    state.principals.clear();
    Ok(())
}

/// Takes a user out of a tenant (platform admins, or the tenant's own admins).
pub async fn remove_member(state: &AppState, p: &Principal, tenant: &str, user: &str) -> Result<(), ApiError> {
    p.require_tenant_admin(tenant)?;
    state.store.remove_membership(user, tenant, &p.actor()).await?;
    state.principals.clear();
    Ok(())
}

/// A tenant's members with their roles (its members, or platform admins).
pub async fn members(state: &AppState, p: &Principal, tenant: &str) -> Result<Vec<(User, Role)>, ApiError> {
    p.require_visible(tenant, "tenant")?;
    state.store.tenant(tenant).await?;
    Ok(state.store.members(tenant).await?)
}

/// The caller's own API tokens, revoked ones included, newest first.
pub async fn tokens(state: &AppState, p: &Principal) -> Result<Vec<TokenInfo>, ApiError> {
    Ok(state.store.tokens(&p.user.id).await?)
}

/// Creates an API token for the caller: `(id, name, secret)`; the secret is nowhere else.
pub async fn create_token(state: &AppState, p: &Principal, name: &str) -> Result<(String, String, String), ApiError> {
    // The length is the one the API document states: characters as sent, before trimming.
    let too_long = name.chars().count() > MAX_TOKEN_NAME;
    let name = name.trim();
    if name.is_empty() || too_long {
        return Err(ApiError::invalid("invalid_name", "a token name is 1-100 characters"));
    }
    let secret = new_token_secret();
    let id = state.store.create_token(&p.user.id, name, &token_hash(&secret), &p.actor()).await?;
    Ok((id, name.to_string(), secret))
}

/// Revokes a token: the caller's own, or anyone's as a platform admin (another's is "not found").
pub async fn revoke_token(state: &AppState, p: &Principal, id: &str) -> Result<(), ApiError> {
    let owner = if p.user.platform_admin { None } else { Some(p.user.id.as_str()) };
    state.store.revoke_token(id, owner, &p.actor()).await?;
    state.principals.clear();
    Ok(())
}

/// Sets a local password: the caller's own (with the current one, if set), or anybody's (platform admins).
pub async fn set_password(
    state: &AppState,
    p: &Principal,
    id: &str,
    password: String,
    current_password: Option<String>,
) -> Result<(), ApiError> {
    let own = p.user.id == id;
    if !own && !p.user.platform_admin {
        return Err(ApiError::NotFound("user not found".into()));
    }
    if !state.auth.local_accounts {
        return Err(ApiError::forbidden("local_accounts_disabled", "local accounts are turned off"));
    }
    // A password would let a provider's user sign in past the provider (its MFA, its deprovisioning).
    if own && !p.user.platform_admin && state.store.is_sso_user(id).await? {
        return Err(ApiError::forbidden("sso_user", "users who sign in with single sign-on have no local password"));
    }
    if password.chars().count() < MIN_PASSWORD {
        return Err(ApiError::invalid("weak_password", format!("a password has at least {MIN_PASSWORD} characters")));
    }
    if own && let Some((_, current)) = state.store.password_hash(&p.user.name).await? {
        let given = current_password.unwrap_or_default();
        let ok = tokio::task::spawn_blocking(move || verify_password(&given, &current))
            .await
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        if !ok {
            return Err(ApiError::forbidden("bad_credentials", "the current password is wrong"));
        }
    }
    let hash = tokio::task::spawn_blocking(move || hash_password(&password))
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?
        .map_err(ApiError::Internal)?;
    state.store.set_password_hash(id, Some(&hash), &p.actor()).await?;
    // Every session of the user ends: whoever knew the old password is signed out.
    state.store.delete_user_sessions(id).await?;
    state.principals.clear();
    Ok(())
}

/// A one-time sign-in link for `id` (platform admins). Users of the identity provider get none: a link would let
/// them in past the provider (its MFA, its deprovisioning).
pub async fn sign_in_link(
    state: &AppState,
    p: &Principal,
    id: &str,
) -> Result<crate::auth::links::IssuedLink, ApiError> {
    p.require_platform_admin()?;
    if !state.auth.local_accounts {
        return Err(ApiError::forbidden("local_accounts_disabled", "local accounts are turned off"));
    }
    if state.store.is_sso_user(id).await? {
        return Err(ApiError::forbidden("sso_user", "this user signs in with single sign-on, not with a link"));
    }
    Ok(crate::auth::links::issue(&state.store, id, crate::auth::links::ISSUED_LINK_TTL_MS, &p.actor()).await?)
}
