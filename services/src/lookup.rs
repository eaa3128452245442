//! Reads of one object the caller may see, shared by the services that act on it (an object the caller may not
//! see is "not found", never "forbidden", so its existence does not leak).

use crate::app::AppState;
use crate::error::ApiError;
use tessera_store::{Principal, SliceRequest};

/// A request the principal may see.
pub async fn get(state: &AppState, p: &Principal, id: &str) -> Result<SliceRequest, ApiError> {
    let request = state.store.request(id).await?;
    if !p.can_see(&request.tenant_id) {
        return Err(ApiError::NotFound(format!("request {id} not found")));
    }
    Ok(request)
}
