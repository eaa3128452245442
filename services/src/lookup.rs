//! Reads of one object the caller may see, shared by the services that act on it (an object the caller may not
//! see is "not found", never "forbidden", so its existence does not leak).

use crate::app::AppState;
use crate::auth::Permissions;
use crate::error::ApiError;
use tessera_store::{Principal, SliceRequest, Tenant};

/// A request the principal may see.
pub async fn get(state: &AppState, p: &Principal, id: &str) -> Result<SliceRequest, ApiError> {
    let request = state.store.request(id).await?;
    if !p.can_see(&request.tenant_id) {
        return Err(ApiError::NotFound(format!("request {id} not found")));
    }
    Ok(request)
}

/// A tenant the caller may see.
/// A tenant the caller may see, by id or by name (ids are tried first; a tenant the caller may not see is not
/// found, whichever way it is named).
pub async fn tenant(state: &AppState, p: &Principal, key: &str) -> Result<Tenant, ApiError> {
    let tenant = if valid_name(key) {
        state.store.tenants().await?.into_iter().find(|t| t.id == key || t.name == key)
    } else {
        None
    };
    let tenant = match tenant {
        Some(t) => t,
        None => {
            p.require_visible(key, "tenant")?;
            state.store.tenant(key).await?
        }
    };
    p.require_visible(&tenant.id, "tenant")?;
    Ok(tenant)
}

/// Whether `name` is a tenant name (a DNS label: lowercase letters, digits and `-`, 1 to 63 characters), so that a
/// key is read as a name rather than an id.
pub(crate) fn valid_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
}
