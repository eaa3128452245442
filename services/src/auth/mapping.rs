//! From the provider's claims to Tessera: which user, which tenant memberships and roles, platform admin or not.
//!
//! ```toml
//! [auth.oidc]
//! username_claim = "preferred_username"   # falls back to `email`, then `sub`
//! groups_claim = "groups"                 # a list of strings (a single string is one group)
//! admin_groups = ["tessera-admins"]       # any of these makes a platform admin; empty: admins are set by hand
//! tenant_group_pattern = "tessera:{tenant}:{role}"   # role is `member` or `admin`
//! tenant_groups = [{ group = "/ml-research", tenant = "ml", role = "member" }]
//! ```

use serde::Deserialize;
use serde_json::{Map, Value};

use tessera_store::Role;
use tessera_store::auth::SsoIdentity;

/// One group that grants a membership.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupRule {
    /// The group, exactly as the claim carries it (Keycloak's full paths start with `/`).
    pub group: String,
    /// The tenant's name.
    pub tenant: String,
    /// `member` (the default) or `admin`.
    #[serde(default)]
    pub role: RuleRole,
}

/// A role as a mapping names it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RuleRole {
    /// Tenant member.
    #[default]
    Member,
    /// Tenant admin (`admin` or `tenant-admin`).
    #[serde(alias = "tenant-admin")]
    Admin,
}

impl From<RuleRole> for Role {
    fn from(r: RuleRole) -> Role {
        match r {
            RuleRole::Member => Role::Member,
            RuleRole::Admin => Role::TenantAdmin,
        }
    }
}

/// How claims map to Tessera.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimMapping {
    /// Claim holding the user name.
    pub username_claim: String,
    /// Claim holding the groups.
    pub groups_claim: String,
    /// Groups whose members are platform admins; empty: the mapping leaves platform admins alone.
    pub admin_groups: Vec<String>,
    /// Explicit group-to-tenant rules.
    pub tenant_groups: Vec<GroupRule>,
    /// `prefix{tenant}infix{role}suffix`, split at the placeholders.
    pub pattern: Option<Pattern>,
}

/// A group-name pattern with a `{tenant}` and an optional `{role}` placeholder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    source: String,
}

impl Pattern {
    /// Checks a pattern: `{tenant}` exactly once, `{role}` at most once and not next to `{tenant}`.
    pub fn parse(text: &str) -> Result<Pattern, String> {
        if text.matches("{tenant}").count() != 1 || text.matches("{role}").count() > 1 {
            return Err(format!("tenant_group_pattern `{text}` needs `{{tenant}}` once and `{{role}}` at most once"));
        }
        if text.contains("{tenant}{role}") || text.contains("{role}{tenant}") {
            return Err(format!("tenant_group_pattern `{text}`: put a separator between `{{tenant}}` and `{{role}}`"));
        }
        Ok(Pattern { source: text.to_string() })
    }

    /// The tenant name and role a group matches, if it does.
    pub fn matches(&self, group: &str) -> Option<(String, Role)> {
        // Split into literal pieces around the placeholders, in order.
        let mut pieces: Vec<(&str, Option<&str>)> = Vec::new();
        let mut rest = self.source.as_str();
        while let Some(at) = rest.find('{') {
            let close = rest[at..].find('}').map(|c| at + c)?;
            pieces.push((&rest[..at], Some(&rest[at + 1..close])));
            rest = &rest[close + 1..];
        }
        pieces.push((rest, None));
        let mut text = group;
        let mut tenant = None;
        let mut role = Role::Member;
        for (i, (literal, placeholder)) in pieces.iter().enumerate() {
            text = text.strip_prefix(literal)?;
            let Some(name) = placeholder else { break };
            // The placeholder takes everything up to the next literal (or the end).
            let next = pieces.get(i + 1).map(|(l, _)| *l).unwrap_or("");
            let end = if next.is_empty() { text.len() } else { text.find(next)? };
            let value = &text[..end];
            if value.is_empty() {
                return None;
            }
            match *name {
                "tenant" => tenant = Some(value.to_string()),
                "role" => {
                    role = match value {
                        "member" => Role::Member,
                        "admin" | "tenant-admin" => Role::TenantAdmin,
                        _ => return None,
                    }
                }
                _ => return None,
            }
            text = &text[end..];
        }
        if !text.is_empty() {
            return None;
        }
        tenant.map(|t| (t, role))
    }
}

/// Why claims cannot sign anybody in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MappingError {
    /// `sub` or `iss` is missing.
    #[error("the token has no `{0}` claim")]
    Missing(&'static str),
    /// The groups claim is neither a string nor a list of strings.
    #[error("the `{0}` claim must be a list of strings")]
    BadGroups(String),
}

impl ClaimMapping {
    /// The groups the claims carry.
    pub fn groups(&self, claims: &Map<String, Value>) -> Result<Vec<String>, MappingError> {
        match claims.get(&self.groups_claim) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::String(s)) => Ok(vec![s.clone()]),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_str().map(str::to_string).ok_or_else(|| MappingError::BadGroups(self.groups_claim.clone()))
                })
                .collect(),
            Some(_) => Err(MappingError::BadGroups(self.groups_claim.clone())),
        }
    }

    /// Maps validated claims to an identity.
    pub fn identity(&self, claims: &Map<String, Value>) -> Result<SsoIdentity, MappingError> {
        let text = |name: &str| claims.get(name).and_then(Value::as_str).filter(|s| !s.trim().is_empty());
        let issuer = text("iss").ok_or(MappingError::Missing("iss"))?.to_string();
        let subject = text("sub").ok_or(MappingError::Missing("sub"))?.to_string();
        let name = text(&self.username_claim).or_else(|| text("email")).unwrap_or(&subject);
        let name: String = name.trim().chars().filter(|c| !c.is_control()).take(200).collect();
        let groups = self.groups(claims)?;
        let has_groups = claims.get(&self.groups_claim).is_some_and(|g| !g.is_null());
        let platform_admin = if self.admin_groups.is_empty() || !has_groups {
            None
        } else {
            Some(groups.iter().any(|g| self.admin_groups.contains(g)))
        };
        let mut memberships = Vec::new();
        for group in &groups {
            for rule in self.tenant_groups.iter().filter(|r| &r.group == group) {
                memberships.push((rule.tenant.clone(), rule.role.into()));
            }
            if let Some(m) = self.pattern.as_ref().and_then(|p| p.matches(group)) {
                memberships.push(m);
            }
        }
        Ok(SsoIdentity {
            issuer,
            subject,
            name,
            email: text("email").map(str::to_string),
            platform_admin,
            memberships: has_groups.then_some(memberships),
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn mapping() -> ClaimMapping {
        ClaimMapping {
            username_claim: "preferred_username".into(),
            groups_claim: "groups".into(),
            admin_groups: vec!["tessera-admins".into()],
            tenant_groups: vec![GroupRule { group: "/ml/research".into(), tenant: "ml".into(), role: RuleRole::Admin }],
            pattern: Some(Pattern::parse("tessera:{tenant}:{role}").expect("pattern")),
        }
    }

    fn claims(value: Value) -> Map<String, Value> {
        value.as_object().cloned().expect("object")
    }

    #[test]
    fn groups_map_to_memberships_roles_and_platform_admin() {
        let who = mapping()
            .identity(&claims(json!({
                "iss": "https://idp", "sub": "u1", "preferred_username": "ada", "email": "ada@example.com",
                "groups": ["/ml/research", "tessera:vision:member", "tessera:nlp:admin", "tessera::member",
                           "tessera:x:owner", "other"]
            })))
            .expect("identity");
        assert_eq!(who.name, "ada");
        assert_eq!(who.platform_admin, Some(false));
        assert_eq!(
            who.memberships,
            Some(vec![
                ("ml".to_string(), Role::TenantAdmin),
                ("vision".to_string(), Role::Member),
                ("nlp".to_string(), Role::TenantAdmin)
            ])
        );
        let admin = mapping()
            .identity(&claims(json!({"iss": "i", "sub": "u2", "groups": "tessera-admins", "email": "r@x"})))
            .expect("identity");
        assert_eq!(admin.platform_admin, Some(true));
        assert_eq!(admin.name, "r@x", "falls back to the e-mail");
    }

    #[test]
    fn bad_claims_are_clear_errors() {
        let m = mapping();
        assert_eq!(m.identity(&claims(json!({"iss": "i"}))), Err(MappingError::Missing("sub")));
        assert_eq!(
            m.identity(&claims(json!({"iss": "i", "sub": "s", "groups": [1]}))),
            Err(MappingError::BadGroups("groups".into()))
        );
        let without_admins = ClaimMapping { admin_groups: vec![], ..mapping() };
        let who = without_admins.identity(&claims(json!({"iss": "i", "sub": "s", "groups": []}))).expect("identity");
        assert_eq!(who.platform_admin, None, "no admin groups: platform admins are left alone");
        assert_eq!(who.memberships, Some(vec![]), "an empty list is known to be empty");
        assert_eq!(who.name, "s");
        let no_claim = mapping().identity(&claims(json!({"iss": "i", "sub": "s"}))).expect("identity");
        assert_eq!((no_claim.platform_admin, no_claim.memberships), (None, None), "no groups claim: nothing known");
    }

    #[test]
    fn patterns_match_whole_groups_only() {
        let p = Pattern::parse("team-{tenant}").expect("pattern");
        assert_eq!(p.matches("team-ml"), Some(("ml".into(), Role::Member)));
        assert_eq!(p.matches("xteam-ml"), None);
        let p = Pattern::parse("/tessera/{tenant}/{role}s").expect("pattern");
        assert_eq!(p.matches("/tessera/ml/admins"), Some(("ml".into(), Role::TenantAdmin)));
        assert_eq!(p.matches("/tessera/ml/admins/x"), None);
        assert!(Pattern::parse("{tenant}{role}").is_err());
        assert!(Pattern::parse("no-placeholder").is_err());
    }
}
