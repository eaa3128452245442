//! Who may do what: one check per kind of action, as methods on [`Principal`] beside [`Principal::can_see`], so
//! that handlers and services ask the same question the same way.

use crate::error::ApiError;
use crate::store::Principal;

impl Principal {
    /// Requires a platform admin: others get 403.
    pub fn require_platform_admin(&self) -> Result<(), ApiError> {
        if self.user.platform_admin { Ok(()) } else { Err(ApiError::Forbidden("platform admins only".to_string())) }
    }

    /// Requires that the caller may see `tenant_id`'s objects; others get 404 naming `what`, never a hint that the
    /// object exists.
    pub fn require_visible(&self, tenant_id: &str, what: &str) -> Result<(), ApiError> {
        if self.can_see(tenant_id) { Ok(()) } else { Err(ApiError::NotFound(format!("{what} not found"))) }
    }
}
