//! Who may do what: one check per kind of action, as methods on [`Principal`] (the [`Permissions`] trait, beside
//! the store's [`Principal::can_see`]), so that handlers and services ask the same question the same way.

use crate::error::ApiError;
use tessera_store::Principal;

/// The permission checks, answered from a signed-in caller's roles.
pub trait Permissions {
    /// Requires a platform admin: others get 403.
    fn require_platform_admin(&self) -> Result<(), ApiError>;
    /// Requires that the caller may see `tenant_id`'s objects; others get 404 naming `what`, never a hint that the
    /// object exists.
    fn require_visible(&self, tenant_id: &str, what: &str) -> Result<(), ApiError>;
    /// Requires a platform admin or an admin of `tenant_id` (after [`Permissions::require_visible`]): other members
    /// get 403.
    fn require_tenant_admin(&self, tenant_id: &str) -> Result<(), ApiError>;
    /// As [`Permissions::require_tenant_admin`], saying what only admins may do (`"ask for quota"`).
    fn require_tenant_admin_to(&self, tenant_id: &str, action: &str) -> Result<(), ApiError>;
    /// Whether the caller acts for the whole fleet (a platform admin).
    fn is_platform_admin(&self) -> bool;
    /// What a reading across tenants (usage, the heatmap) covers: the named tenant when the caller may see it (404
    /// otherwise); with none named, the whole fleet for platform admins and the caller's own tenants for others.
    fn reading_scope(&self, tenant: Option<&str>) -> Result<Scope, ApiError>;
    /// The one tenant a listing of requests shows: the named one when the caller may see it (404 otherwise); with
    /// none named, every tenant (`None`) for platform admins, the only tenant of a member of one, and otherwise a
    /// 422 asking to name it.
    fn listing_tenant(&self, tenant: Option<&str>) -> Result<Option<String>, ApiError>;
}

impl Permissions for Principal {
    /// Requires a platform admin: others get 403.
    fn require_platform_admin(&self) -> Result<(), ApiError> {
        if self.user.platform_admin { Ok(()) } else { Err(ApiError::Forbidden("platform admins only".to_string())) }
    }

    /// Requires that the caller may see `tenant_id`'s objects; others get 404 naming `what`, never a hint that the
    /// object exists.
    fn require_visible(&self, tenant_id: &str, what: &str) -> Result<(), ApiError> {
        if self.can_see(tenant_id) { Ok(()) } else { Err(ApiError::NotFound(format!("{what} not found"))) }
    }

    /// Requires a platform admin or an admin of `tenant_id` (after [`Permissions::require_visible`]): other members
    /// get 403.
    fn require_tenant_admin(&self, tenant_id: &str) -> Result<(), ApiError> {
        self.require_tenant_admin_to(tenant_id, "manage members")
    }

    /// As [`Permissions::require_tenant_admin`], saying what only admins may do (`"ask for quota"`).
    fn require_tenant_admin_to(&self, tenant_id: &str, action: &str) -> Result<(), ApiError> {
        self.require_visible(tenant_id, "tenant")?;
        if self.user.platform_admin || self.role_in(tenant_id) == Some(tessera_store::Role::TenantAdmin) {
            Ok(())
        } else {
            Err(ApiError::Forbidden(format!("only platform admins and the tenant's admins {action}")))
        }
    }

    /// Whether the caller acts for the whole fleet (a platform admin).
    fn is_platform_admin(&self) -> bool {
        self.user.platform_admin
    }

    /// What a reading across tenants (usage, the heatmap) covers: the named tenant when the caller may see it (404
    /// otherwise); with none named, the whole fleet for platform admins and the caller's own tenants for others.
    fn reading_scope(&self, tenant: Option<&str>) -> Result<Scope, ApiError> {
        match tenant {
            Some(t) => {
                self.require_visible(t, "tenant")?;
                Ok(Scope::Tenants(vec![t.to_string()]))
            }
            None if self.user.platform_admin => Ok(Scope::Fleet),
            None => Ok(Scope::Tenants(self.memberships.iter().map(|(t, _)| t.clone()).collect())),
        }
    }

    /// The one tenant a listing of requests shows: the named one when the caller may see it (404 otherwise); with
    /// none named, every tenant (`None`) for platform admins, the only tenant of a member of one, and otherwise a
    /// 422 asking to name it.
    fn listing_tenant(&self, tenant: Option<&str>) -> Result<Option<String>, ApiError> {
        match (tenant, self.user.platform_admin, self.memberships.as_slice()) {
            (Some(t), _, _) if self.can_see(t) => Ok(Some(t.to_string())),
            (Some(t), _, _) => Err(ApiError::NotFound(format!("tenant {t} not found"))),
            (None, true, _) => Ok(None),
            (None, false, [(only, _)]) => Ok(Some(only.clone())),
            (None, false, _) => Err(ApiError::invalid("tenant_required", "name the tenant: ?tenant=<id>")),
        }
    }
}

/// The tenants a reading covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every tenant and the whole fleet (platform admins).
    Fleet,
    /// These tenants only.
    Tenants(Vec<String>),
}

impl Scope {
    /// Whether the scope covers `tenant_id`.
    pub fn covers(&self, tenant_id: &str) -> bool {
        match self {
            Scope::Fleet => true,
            Scope::Tenants(ts) => ts.iter().any(|t| t == tenant_id),
        }
    }
}
