//! Signing in: the methods offered, the login round trip, the session.

use crate::people::{Role, UserView};
use serde::{Deserialize, Serialize};

/// How one may sign in here.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SignInMethods {
    /// Single sign-on is configured: send the browser to `/auth/login`.
    pub sso: bool,
    /// The name to show on the single sign-on button.
    pub sso_name: Option<String>,
    /// Local user names and passwords are accepted at `/auth/local`.
    pub local: bool,
}

/// Where to go after signing in.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct LoginQuery {
    /// A path on this server (default `/`).
    pub return_to: Option<String>,
}

/// A one-time sign-in link's secret.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct LinkQuery {
    /// `tsl_...`, as printed by `tessera serve` or `tessera user sign-in-link`, or issued by a platform admin.
    #[cfg_attr(feature = "openapi", param(max_length = 128))]
    pub token: String,
}

/// A one-time sign-in link, just issued: it signs its user in once, until it expires, and replaces the user's
/// previous link. The secret is in this answer only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SignInLink {
    /// The link's path on this server (`/auth/link?token=tsl_...`): prefix it with the portal's address.
    pub path: String,
    /// When it stops working (UTC milliseconds).
    pub expires_at_ms: i64,
}

/// What the provider sends back.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct CallbackQuery {
    /// The authorization code.
    pub code: Option<String>,
    /// The login's `state`.
    pub state: Option<String>,
    /// The provider's error, when it refused.
    pub error: Option<String>,
    /// Its description.
    pub error_description: Option<String>,
    /// The issuer (RFC 9207), when the provider sends it.
    pub iss: Option<String>,
}

/// A local sign-in.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LocalSignIn {
    /// User name.
    pub name: String,
    /// Password.
    pub password: String,
}

/// Who is signed in, and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionView {
    /// The user.
    pub user: UserView,
    /// Tenant memberships.
    pub memberships: Vec<MembershipView>,
    /// `session` (cookie) or `token` (bearer).
    pub method: String,
    /// The user signs in with single sign-on and has no local password.
    pub single_sign_on: bool,
    /// With a session: echo it in `X-CSRF-Token` on state changes.
    pub csrf_token: Option<String>,
    /// With a session: when it ends at the latest (UTC milliseconds).
    pub expires_at_ms: Option<i64>,
}

/// One membership.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MembershipView {
    /// Tenant id.
    pub tenant: String,
    /// Role.
    pub role: Role,
}

/// Where the browser goes after logout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SignedOut {
    /// The provider's end-session URL (RP-initiated logout) when it offers one, else `/`.
    pub redirect_to: String,
}
