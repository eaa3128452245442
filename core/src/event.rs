//! Events: what changed, told to the people it concerns (webhooks, and later e-mail and the portal's inbox).
//!
//! An event is written in the same transaction as the change it tells of, from the change's audit entry: its type
//! comes from the audit action ([`from_audit`]), its tenant from the object's own record. Who may receive it
//! follows the API's roles ([`reaches`]): a tenant's events reach that tenant's endpoints, and platform-wide
//! endpoints (platform admins see every tenant) receive every event. Filters name types or `prefix.*` patterns
//! ([`TypeFilter`]). A delivery that fails is tried again after [`retry_delay`], for up to [`RETRY_FOR_MS`].

/// Every event type, with what it tells. Stable: receivers filter on them.
pub const TYPES: &[(&str, &str)] = &[
    ("request.created", "a slice request was made"),
    ("request.approved", "a request was approved (placed, or waiting for a layout change)"),
    ("request.provisioning", "a request's slices are being set up on its node"),
    ("request.active", "a request's slices are ready to use"),
    ("request.rejected", "a request was rejected"),
    ("request.cancelled", "a request was cancelled before it was active"),
    ("request.released", "a request's slices were given back"),
    ("request.expired", "a request reached the end of its duration"),
    ("request.failed", "a request's slices could not be set up"),
    ("request.expiring", "an active request ends soon: 24 hours and 1 hour before its end"),
    ("request.reclaimed", "a borrowed request was released to give capacity back to its lender"),
    ("request.reclaim_scheduled", "a borrowed request will be reclaimed at a deadline"),
    ("request.reclaim_withdrawn", "a scheduled reclaim was withdrawn"),
    (
        "allocation.idle",
        "an active slice has been almost unused (under 5 % for 2 hours): release it if it is not needed",
    ),
    ("layout.proposed", "a MIG layout change was proposed for a GPU"),
    ("layout.approved", "a MIG layout change was approved"),
    ("layout.rejected", "a MIG layout change was rejected"),
    ("layout.applied", "a node applied the MIG layouts and sharing it was given"),
    ("layout.failed", "a node could not apply what it was given: the steps that failed, per GPU"),
    ("quota_request.created", "a tenant asked for more quota"),
    ("quota_request.suggested", "a member asked the tenant's admins to ask for more quota"),
    ("quota_request.approved", "a quota request was granted"),
    ("quota_request.rejected", "a quota request was refused"),
    ("quota_request.cancelled", "a quota request was withdrawn"),
    ("quota_request.ended", "a temporary quota increase ended"),
    ("budget.warning", "a tenant has spent 80 % of a monthly budget"),
    ("budget.exhausted", "a tenant has spent a monthly budget"),
    ("reservation.created", "a reservation was booked"),
    ("reservation.accepted", "a reservation was accepted"),
    ("reservation.rejected", "a reservation was rejected"),
    ("reservation.cancelled", "a reservation was cancelled"),
    ("reservation.started", "a reservation's slices were requested at its lead time"),
    ("reservation.ended", "a reservation's window ended"),
    ("reservation.failed", "a reservation could not be placed at its start"),
    ("node.registered", "a node was registered"),
    ("node.rejoined", "a node joined again"),
    ("node.not_ready", "a node stopped reporting: nothing heard from it for 20 seconds"),
    ("node.ready", "a node that was not ready reports again"),
    ("gpu.cordoned", "a GPU was cordoned: nothing new is placed on it"),
    ("gpu.uncordoned", "a GPU was returned to service"),
    ("gpu.unhealthy", "a GPU reported a fatal error (an XID, a pending row remap): cordoned, its holders told"),
    ("gpu.degraded", "a GPU serves with something to look at (throttling, heat, a contained ECC error)"),
    ("gpu.healthy", "a degraded GPU reports nothing wrong again, or an unhealthy one was returned to service"),
    ("gpu.draining", "a GPU is being drained for maintenance: cordoned, its holders' slices end at a deadline"),
    ("gpu.drained", "a drained GPU holds nothing: it is empty for maintenance"),
    (
        "gpu.unallocated_use",
        "a process runs on a device no allocation covers: one nothing holds, or another tenant's pod on a tenant's slice",
    ),
    ("webhook.test", "a test event sent on request to one endpoint"),
];

/// The actor the cohort sweep writes when it releases a borrowed request.
pub const RECLAIMER: &str = "system:reclaim";

/// How long a delivery is tried, from its first attempt: 24 hours.
pub const RETRY_FOR_MS: i64 = 24 * 3_600_000;

/// Longest wait between two attempts of a delivery by default: one hour.
pub const RETRY_CAP_MS: i64 = 3_600_000;

/// How long before an active request's end it is reminded of (`request.expiring`), longest first: 24 hours, 1 hour.
pub const EXPIRY_REMINDERS_MS: [i64; 2] = [24 * 3_600_000, 3_600_000];

/// The reminder due for a request of `duration_ms` that ends at `end_ms`, at `now_ms`: the shortest lead time it has
/// reached, among those shorter than the request's whole duration (a 2-hour request is told an hour before its end,
/// not a day; a 30-minute one is not told). `None` once it has ended, or before the first lead time.
pub fn expiry_reminder(duration_ms: i64, end_ms: i64, now_ms: i64) -> Option<i64> {
    if now_ms >= end_ms {
        return None;
    }
    let left = end_ms - now_ms;
    EXPIRY_REMINDERS_MS.iter().rev().copied().find(|&lead| left <= lead && duration_ms > lead)
}

/// Whether `t` is an event type.
pub fn is_type(t: &str) -> bool {
    TYPES.iter().any(|(name, _)| *name == t)
}

/// The event an audit entry tells of, if any: its type. `actor` tells a reclaim from a release.
pub fn from_audit(action: &str, actor: &str) -> Option<&'static str> {
    let t = match action {
        "request.create" => "request.created",
        "request.released" if actor == RECLAIMER => "request.reclaimed",
        "request.reclaim" => "request.reclaim_scheduled",
        "layout.propose" | "layout.auto_apply" => "layout.proposed",
        "layout.approve" => "layout.approved",
        "layout.reject" => "layout.rejected",
        "quota_request.create" => "quota_request.created",
        "quota_request.suggest" => "quota_request.suggested",
        "reservation.create" => "reservation.created",
        "node.register" => "node.registered",
        "node.rejoin" => "node.rejoined",
        "gpu.cordoned.on" => "gpu.cordoned",
        "gpu.cordoned.off" => "gpu.uncordoned",
        other => return TYPES.iter().map(|(name, _)| *name).find(|name| *name == other),
    };
    Some(t)
}

/// Which event types an endpoint wants: exact types, `prefix.*` patterns, or (empty) every type.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TypeFilter(Vec<String>);

/// Most patterns in a filter.
pub const MAX_PATTERNS: usize = 64;

/// Why a filter was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadPattern(pub String);

impl TypeFilter {
    /// A filter of `patterns`: each an event type, `area.*` for a known area, or `*`; at most [`MAX_PATTERNS`].
    pub fn new(patterns: &[String]) -> Result<TypeFilter, BadPattern> {
        if patterns.len() > MAX_PATTERNS {
            return Err(BadPattern(format!("at most {MAX_PATTERNS} patterns")));
        }
        for p in patterns {
            let known = match p.strip_suffix(".*") {
                Some(area) => TYPES.iter().any(|(t, _)| t.split('.').next() == Some(area)),
                None => p == "*" || is_type(p),
            };
            if !known {
                return Err(BadPattern(format!("`{}` is not an event type nor `area.*` of one", clip(p))));
            }
        }
        Ok(TypeFilter(patterns.to_vec()))
    }

    /// The patterns.
    pub fn patterns(&self) -> &[String] {
        &self.0
    }

    /// Whether the filter lets `t` through. A test event always passes.
    pub fn wants(&self, t: &str) -> bool {
        t == "webhook.test"
            || self.0.is_empty()
            || self.0.iter().any(|p| {
                p == "*" || p == t || p.strip_suffix(".*").is_some_and(|area| t.split('.').next() == Some(area))
            })
    }
}

fn clip(s: &str) -> &str {
    match s.char_indices().nth(64) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// Whether an event of `tenant` (`None`: platform-wide) reaches an endpoint of `endpoint_tenant` (`None`: a
/// platform endpoint, which receives everything).
pub fn reaches(event_tenant: Option<&str>, endpoint_tenant: Option<&str>) -> bool {
    match endpoint_tenant {
        None => true,
        Some(mine) => event_tenant == Some(mine),
    }
}

/// How long to wait after the `attempts`-th failed attempt (1 for the first): doubling from 1 s, at most `cap_ms`.
pub fn retry_delay(attempts: u32, cap_ms: i64) -> i64 {
    let exp = attempts.saturating_sub(1).min(30);
    (1_000i64 << exp).min(cap_ms.max(1_000))
}

/// The next attempt of a delivery first tried at `first_ms` that failed for the `attempts`-th time at `now_ms`, or
/// `None` when it has been tried for [`RETRY_FOR_MS`] (it has failed).
pub fn next_attempt(first_ms: i64, attempts: u32, now_ms: i64, cap_ms: i64) -> Option<i64> {
    let next = now_ms.saturating_add(retry_delay(attempts, cap_ms));
    (next <= first_ms.saturating_add(RETRY_FOR_MS)).then_some(next)
}

/// One line about an event, for chat channels: "request/abc (tenant atlas): request.active by user:dana".
pub fn sentence(t: &str, subject: &str, tenant: Option<&str>, actor: &str) -> String {
    let what = TYPES.iter().find(|(name, _)| *name == t).map_or("", |(_, d)| d);
    match tenant {
        Some(tenant) => format!("[{t}] {subject} (tenant {tenant}): {what}, by {actor}"),
        None => format!("[{t}] {subject}: {what}, by {actor}"),
    }
}

/// Whether `ip` is anything but a globally routable unicast address (see [`crate::address::is_global`]): loopback,
/// private, link-local (cloud metadata services live there), shared (CGNAT), special-purpose, multicast, or an IPv6
/// form that carries such an IPv4 address. A tenant's webhook never reaches such an address unless the operator
/// allows it.
pub fn is_internal(ip: std::net::IpAddr) -> bool {
    !crate::address::is_global(ip)
}

/// Where the portal shows what an event of type `t` about `subject` is about, as a path: a request's own page, the
/// tenant's page for its reservations, quota requests, allocations and budget, approvals for layouts, the fleet for
/// nodes and GPUs, else the inbox.
pub fn portal_path(t: &str, subject: &str, tenant: Option<&str>) -> String {
    let area = t.split('.').next().unwrap_or_default();
    if let Some(id) = subject.strip_prefix("request/").filter(|id| !id.is_empty() && !id.contains('/'))
        && area == "request"
    {
        return format!("/requests/{id}");
    }
    match (area, tenant) {
        ("request" | "reservation" | "quota_request" | "allocation" | "budget", Some(tenant)) => format!("/t/{tenant}"),
        ("layout", _) => "/approvals".to_string(),
        ("node" | "gpu", _) => "/fleet".to_string(),
        _ => "/inbox".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_addresses_are_told_from_the_internet() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "::ffff:10.0.0.1",
            "ff02::1",
            "192.0.2.1",
            "64:ff9b::a9fe:a9fe",
        ] {
            assert!(is_internal(ip.parse().expect("ip")), "{ip}");
        }
        for ip in ["8.8.8.8", "172.32.0.1", "100.128.0.1", "2001:4860:4860::8888", "::ffff:1.1.1.1"] {
            assert!(!is_internal(ip.parse().expect("ip")), "{ip}");
        }
    }

    #[test]
    fn events_link_to_the_page_that_shows_their_object() {
        assert_eq!(portal_path("request.active", "request/r-1", Some("atlas")), "/requests/r-1");
        assert_eq!(portal_path("request.active", "request/r-1", None), "/requests/r-1");
        assert_eq!(portal_path("request.active", "other", Some("atlas")), "/t/atlas");
        assert_eq!(portal_path("quota_request.approved", "quota_request/q-1", Some("atlas")), "/t/atlas");
        assert_eq!(portal_path("layout.proposed", "layout/l-1", None), "/approvals");
        assert_eq!(portal_path("gpu.cordoned", "gpu/g-1", None), "/fleet");
        assert_eq!(portal_path("request.active", "other", None), "/inbox");
        assert_eq!(portal_path("webhook.test", "webhook/w", Some("atlas")), "/inbox");
    }

    #[test]
    fn audit_actions_map_to_documented_types() {
        assert_eq!(from_audit("request.create", "user:a"), Some("request.created"));
        assert_eq!(from_audit("request.active", "node:n"), Some("request.active"));
        assert_eq!(from_audit("request.released", "user:a"), Some("request.released"));
        assert_eq!(from_audit("request.released", RECLAIMER), Some("request.reclaimed"));
        assert_eq!(from_audit("gpu.cordoned.on", "user:a"), Some("gpu.cordoned"));
        assert_eq!(from_audit("tenant.policy", "user:a"), None);
        assert_eq!(from_audit("user.sign_in_link", "user:a"), None);
        for action in ["request.pending", "token.create", "membership.set"] {
            assert_eq!(from_audit(action, "user:a"), None, "{action}");
        }
        for (t, _) in TYPES {
            assert!(t.contains('.'), "{t}");
        }
    }

    #[test]
    fn reminders_come_a_day_and_an_hour_ahead_when_the_request_lasts_longer() {
        let h = 3_600_000;
        // A two-day request: nothing until a day is left, then the day's reminder, then the hour's.
        assert_eq!(expiry_reminder(48 * h, 48 * h, 0), None);
        assert_eq!(expiry_reminder(48 * h, 48 * h, 24 * h), Some(24 * h));
        assert_eq!(expiry_reminder(48 * h, 48 * h, 47 * h), Some(h));
        assert_eq!(expiry_reminder(48 * h, 48 * h, 48 * h), None);
        // A two-hour request is told an hour ahead only; a half-hour one never.
        assert_eq!(expiry_reminder(2 * h, 2 * h, 0), None);
        assert_eq!(expiry_reminder(2 * h, 2 * h, h), Some(h));
        assert_eq!(expiry_reminder(h / 2, h / 2, 0), None);
    }

    #[test]
    fn filters_take_types_areas_and_everything() {
        let f = TypeFilter::new(&["request.*".into(), "layout.approved".into()]).expect("valid");
        assert!(f.wants("request.active") && f.wants("layout.approved") && f.wants("webhook.test"));
        assert!(!f.wants("layout.proposed") && !f.wants("requests.active"));
        assert!(TypeFilter::default().wants("node.registered"));
        assert!(TypeFilter::new(&["*".into()]).expect("valid").wants("gpu.cordoned"));
        assert!(TypeFilter::new(&["request.nope".into()]).is_err());
        assert!(TypeFilter::new(&["nope.*".into()]).is_err());
        assert!(TypeFilter::new(&vec!["*".to_string(); MAX_PATTERNS + 1]).is_err());
    }

    #[test]
    fn tenants_see_their_events_and_platform_endpoints_see_all() {
        assert!(reaches(Some("t1"), Some("t1")));
        assert!(!reaches(Some("t2"), Some("t1")));
        assert!(!reaches(None, Some("t1")));
        assert!(reaches(Some("t2"), None) && reaches(None, None));
    }

    #[test]
    fn retries_double_up_to_the_cap_and_stop_after_a_day() {
        assert_eq!(retry_delay(1, RETRY_CAP_MS), 1_000);
        assert_eq!(retry_delay(2, RETRY_CAP_MS), 2_000);
        assert_eq!(retry_delay(13, RETRY_CAP_MS), RETRY_CAP_MS);
        assert_eq!(retry_delay(u32::MAX, RETRY_CAP_MS), RETRY_CAP_MS);
        assert_eq!(next_attempt(0, 1, 10, RETRY_CAP_MS), Some(1_010));
        assert_eq!(next_attempt(0, 40, RETRY_FOR_MS - 10, RETRY_CAP_MS), None);
        // A day of attempts at the default cap: about 35 tries.
        let (mut now, mut n) = (0i64, 0u32);
        while let Some(next) = next_attempt(0, n + 1, now, RETRY_CAP_MS) {
            now = next;
            n += 1;
        }
        assert!((30..40).contains(&n), "{n} attempts");
    }
}
