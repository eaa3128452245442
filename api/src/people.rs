//! Users, memberships and roles, API tokens, passwords.

use serde::{Deserialize, Serialize};

/// A role inside a tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Requests slices, sees the tenant's objects.
    Member,
    /// Also manages the tenant's members and tokens.
    TenantAdmin,
}

impl Role {
    /// Wire and storage name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Member => "member",
            Role::TenantAdmin => "tenant-admin",
        }
    }
}

impl std::str::FromStr for Role {
    type Err = String;

    fn from_str(text: &str) -> Result<Role, String> {
        match text {
            "member" => Ok(Role::Member),
            "tenant-admin" => Ok(Role::TenantAdmin),
            other => Err(format!("unknown role `{other}`")),
        }
    }
}

/// A user to create.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NewUser {
    /// Unique name (login or e-mail), 1-254 characters with no control, invisible or text-direction characters;
    /// names differing only in letter case are the same name (409).
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 254))]
    pub name: String,
    /// Platform admins manage every tenant, quota, approval and layout.
    #[serde(default)]
    pub platform_admin: bool,
}

/// A user.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UserView {
    /// Id.
    pub id: String,
    /// Name.
    pub name: String,
    /// Platform admin.
    pub platform_admin: bool,
}

/// A membership.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Membership {
    /// `member` or `tenant-admin`.
    pub role: Role,
}

/// A token to create for yourself.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NewToken {
    /// What it is for, e.g. `ci` (1-100 characters).
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 100))]
    pub name: String,
}

/// A created token. The secret is shown only in this response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreatedToken {
    /// Token id (for revoking).
    pub id: String,
    /// Its name.
    pub name: String,
    /// The secret: send it as `Authorization: Bearer <secret>`.
    pub secret: String,
}

/// One of your API tokens (never its secret).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TokenView {
    /// Token id (for revoking).
    pub id: String,
    /// What it is for.
    pub name: String,
    /// Creation time, UTC milliseconds.
    pub created_at_ms: i64,
    /// When it was revoked, UTC milliseconds; `null` while it is valid.
    pub revoked_at_ms: Option<i64>,
}

/// A member of a tenant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MemberView {
    /// User id.
    pub id: String,
    /// User name.
    pub name: String,
    /// Role in the tenant.
    pub role: Role,
}

/// A new local password.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NewPassword {
    /// At least 12 characters.
    #[cfg_attr(feature = "openapi", schema(min_length = 12))]
    pub password: String,
    /// The current password (when changing your own and you have one).
    pub current_password: Option<String>,
}
