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

    /// Requires a platform admin or an admin of `tenant_id` (after [`Principal::require_visible`]): other members
    /// get 403.
    pub fn require_tenant_admin(&self, tenant_id: &str) -> Result<(), ApiError> {
        self.require_visible(tenant_id, "tenant")?;
        if self.user.platform_admin || self.role_in(tenant_id) == Some(crate::store::Role::TenantAdmin) {
            Ok(())
        } else {
            Err(ApiError::Forbidden("only platform admins and the tenant's admins manage members".to_string()))
        }
    }
}
