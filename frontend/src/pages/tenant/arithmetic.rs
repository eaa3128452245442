//! The tenant dashboard's quota arithmetic: the bars (used, pending, limit) and the new-request form's feedback.
//!
//! Both are the core's quota arithmetic (`charge`, `check`, the approval policy), the same the server runs when the
//! request is made; the server's answer is still what counts.

use tessera_api::requests::RequestView;
use tessera_api::tenants::QuotaView;
use tessera_core::catalog::Catalog;
use tessera_core::quota::{self, Decision, MILLI, Milli, QuotaError, Resource as QuotaResource, Usage};
use tessera_core::request::{RequestState, SliceSpec};

/// One quota bar: amounts in thousandths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaBar {
    /// Resource key.
    pub resource: String,
    /// What people call it (`Compute slices`, `GPU memory`, ...).
    pub name: String,
    /// The unit of its amounts (`slices`, `GiB`, ...).
    pub unit: &'static str,
    /// Held by approved, provisioning and active requests.
    pub used: Milli,
    /// Held by pending requests.
    pub pending: Milli,
    /// The limit (`None`: unlimited): what the tenant is guaranteed.
    pub limit: Option<Milli>,
    /// In a cohort, the most it may hold by borrowing what the others do not use.
    pub maximum: Option<Milli>,
    /// More is held than allowed (the server's word: past the maximum in a cohort, past the limit otherwise).
    pub over: bool,
    /// What it holds above its guarantee, borrowed from its cohort (the server's word: 0 outside a cohort).
    pub borrowed: Milli,
}

impl QuotaBar {
    /// Widths of the used and pending parts, in percent of the limit; `None` when unlimited (no bar is drawn:
    /// there is nothing to fill).
    pub fn widths(&self) -> Option<(f64, f64)> {
        let whole = self.limit?.max(self.maximum.unwrap_or(0)).max(1) as f64;
        let used = (self.used as f64 / whole * 100.0).min(100.0);
        let pending = (self.pending as f64 / whole * 100.0).min(100.0 - used);
        Some((used, pending))
    }

    /// What is held above the limit (borrowed in a cohort, over it outside one).
    fn above_limit(&self) -> Milli {
        self.limit.map_or(0, |l| (self.used + self.pending).saturating_sub(l))
    }

    /// Where the limit sits on the bar, in percent of its length, when a maximum lies beyond it.
    pub fn limit_mark(&self) -> Option<f64> {
        let (l, m) = (self.limit?, self.maximum?);
        (m > l).then(|| l as f64 / m.max(1) as f64 * 100.0)
    }

    /// `12 of 20 slices used · 2 pending`, `19.6 GiB used · no limit`: amounts to one decimal, with the unit.
    pub fn text(&self) -> String {
        let n = |m: Milli| quota::show_places(m, 1);
        let pending = if self.pending > 0 { format!(" · {} pending", n(self.pending)) } else { String::new() };
        // Over what it may hold (the server's word): over, not borrowing, whether in a cohort or not. Borrowed is
        // the server's word too: only in a cohort.
        let borrowed = if self.over {
            " · over what it may hold: new requests are refused until it is back under".to_string()
        } else if self.borrowed > 0 {
            match self.maximum {
                Some(m) => format!(" · {} borrowed (at most {})", n(self.borrowed), n(m)),
                None => format!(" · {} borrowed", n(self.borrowed)),
            }
        } else if self.above_limit() > 0 {
            format!(" · {} over its limit", n(self.above_limit()))
        } else {
            match self.maximum {
                Some(m) if self.limit.is_some_and(|l| m > l) => format!(" · up to {} with the cohort", n(m)),
                _ => String::new(),
            }
        };
        match self.limit {
            Some(l) => format!("{} of {} {} used{pending}{borrowed}", n(self.used), n(l), self.unit),
            None => format!("{} {} used{pending} · no limit", n(self.used), self.unit),
        }
    }
}

fn milli(v: f64) -> Milli {
    (v.max(0.0) * MILLI as f64).round() as Milli
}

/// The tenant's limits and holdings as the core counts them, from the quota view.
pub fn limits_and_held(q: &QuotaView) -> (Usage, Usage) {
    let catalog = Catalog::builtin();
    let (mut limits, mut held) = (Usage::new(), Usage::new());
    for line in &q.resources {
        let Ok(r) = QuotaResource::parse(catalog, &line.resource) else { continue };
        if let Some(l) = line.limit {
            limits.insert(r.clone(), milli(l));
        }
        held.insert(r, milli(line.held));
    }
    (limits, held)
}

/// What the tenant's pending requests hold, per resource (the core's `charge` of each).
pub fn pending_usage(requests: &[RequestView]) -> Usage {
    let mut usage = Usage::new();
    for r in requests.iter().filter(|r| r.state == RequestState::Pending) {
        if let Ok(c) = quota::charge(Catalog::builtin(), &r.spec, r.count) {
            quota::accumulate(&mut usage, &c);
        }
    }
    usage
}

/// The bars: every resource with a limit or holdings, used and pending apart.
pub fn quota_bars(q: &QuotaView, requests: &[RequestView]) -> Vec<QuotaBar> {
    let (limits, held) = limits_and_held(q);
    let pending = pending_usage(requests);
    let mut keys: Vec<&QuotaResource> = limits.keys().chain(held.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .map(|r| {
            let h = held.get(r).copied().unwrap_or(0);
            let p = pending.get(r).copied().unwrap_or(0).min(h);
            let (name, unit) = r.describe();
            let line = q
                .resources
                .iter()
                .find(|l| QuotaResource::parse(Catalog::builtin(), &l.resource).ok().as_ref() == Some(r));
            QuotaBar {
                resource: r.to_string(),
                name,
                unit,
                used: h - p,
                pending: p,
                limit: limits.get(r).copied(),
                maximum: line.and_then(|l| l.maximum).map(milli),
                over: line.is_some_and(|l| l.over),
                borrowed: line.map_or(0, |l| milli(l.borrowed)),
            }
        })
        .filter(|b| b.limit.is_some() || b.used + b.pending > 0)
        .collect()
}

/// What the form says about a request before it is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Feedback {
    /// What it charges, per resource.
    pub charges: Vec<Charge>,
    /// Limits it would exceed, in the core's words; empty when it fits.
    pub over: Vec<String>,
    /// Whether it would be approved at once.
    pub decision: Option<Decision>,
    /// A request the core cannot charge (unknown model, bad replicas).
    pub invalid: Option<String>,
    /// When over quota: the limits that would let it through (resource key, amount), what a quota request asking
    /// for exactly what is missing names (the core's `needed_limits`, as the server's `ask_for`).
    pub needed: Vec<(String, String)>,
}

/// One resource a request takes, in words: `Compute slices`, `2 slices`, `10 left after`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    /// The quota key (`compute_slices`), for a title and for tests.
    pub key: String,
    /// What people call it.
    pub name: String,
    /// The amount with its unit, to one decimal.
    pub amount: String,
    /// What the limit leaves after it, with its unit; `None`: unlimited.
    pub left: Option<String>,
}

/// The feedback for `count` slices of `spec` under `quotas` and `policy`.
pub fn feedback(
    spec: &SliceSpec,
    count: u32,
    quotas: &QuotaView,
    policy: tessera_core::quota::ApprovalPolicy,
) -> Feedback {
    let requested = match quota::charge(Catalog::builtin(), spec, count) {
        Ok(r) => r,
        Err(e) => {
            return Feedback {
                charges: vec![],
                over: vec![],
                decision: None,
                invalid: Some(e.to_string()),
                needed: vec![],
            };
        }
    };
    let (limits, held) = limits_and_held(quotas);
    // In a cohort a tenant may hold more than its limit, borrowing what the others do not use: the server says how
    // much more it may take now, and the check counts that.
    let limits: Usage = limits
        .into_iter()
        .map(|(r, l)| {
            let line = quotas
                .resources
                .iter()
                .find(|x| QuotaResource::parse(Catalog::builtin(), &x.resource).ok().as_ref() == Some(&r));
            let reach =
                line.and_then(|x| x.available).map(|a| held.get(&r).copied().unwrap_or(0).saturating_add(milli(a)));
            (r, reach.filter(|&m| m > l).unwrap_or(l))
        })
        .collect();
    let charges = requested
        .iter()
        .map(|(r, &a)| {
            let (name, unit) = r.describe();
            let n = |m: Milli| format!("{} {unit}", quota::show_places(m, 1));
            let left = limits.get(r).map(|&l| n(l.saturating_sub(held.get(r).copied().unwrap_or(0)).saturating_sub(a)));
            Charge { key: r.to_string(), name, amount: n(a), left }
        })
        .collect();
    match quota::check(&limits, &held, &requested) {
        Ok(()) => {
            Feedback { charges, over: vec![], decision: Some(policy.decide(&requested)), invalid: None, needed: vec![] }
        }
        Err(errors) => Feedback {
            charges,
            over: errors.iter().map(QuotaError::in_words).collect(),
            decision: None,
            invalid: None,
            needed: tessera_core::quota_request::needed_limits(&errors)
                .into_iter()
                .map(|(r, m)| (r.to_string(), quota::show(m)))
                .collect(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_api::tenants::QuotaLine;

    fn quotas(held: f64, limit: f64) -> QuotaView {
        QuotaView {
            tenant: "t".into(),
            resources: vec![QuotaLine {
                resource: "compute_slices".into(),
                held,
                limit: Some(limit),
                over: held > limit,
                maximum: None,
                lending_limit: None,
                borrowed: 0.0,
                available: Some((limit - held).max(0.0)),
            }],
        }
    }

    fn request(state: RequestState, profile: &str, count: u32) -> RequestView {
        RequestView {
            id: "r".into(),
            tenant: "t".into(),
            spec: SliceSpec::Mig { profile: profile.into(), model: Some("H100-80GB".into()) },
            count,
            state,
            reason: String::new(),
            version: 1,
            created_at_ms: 0,
            updated_at_ms: 0,
            duration_s: None,
            expires_at_ms: None,
            priority: Default::default(),
            borrowed: false,
            reclaim_at_ms: None,
            reclaim_for: None,
            waiting: None,
        }
    }

    #[test]
    fn bars_split_what_is_held_into_used_and_pending() {
        // 3 compute slices held: a pending 2g (2) and an active 1g (1).
        let reqs = [request(RequestState::Pending, "2g.20gb", 1), request(RequestState::Active, "1g.10gb", 1)];
        let bars = quota_bars(&quotas(3.0, 7.0), &reqs);
        let bar = bars.iter().find(|b| b.resource == "compute_slices").expect("bar");
        assert_eq!((bar.used, bar.pending, bar.limit), (1000, 2000, Some(7000)));
        let (u, p) = bar.widths().expect("limited");
        assert!((u - 14.28).abs() < 0.1 && (p - 28.57).abs() < 0.1, "{u} {p}");
        assert_eq!(bar.text(), "1 of 7 slices used · 2 pending");
        // Unlimited: no bar to fill, and the amount rounded with its unit.
        let free = QuotaBar {
            resource: "memory_gib".into(),
            name: "GPU memory".into(),
            unit: "GiB",
            used: 19_625,
            pending: 0,
            limit: None,
            maximum: None,
            over: false,
            borrowed: 0,
        };
        assert_eq!((free.widths(), free.text()), (None, "19.6 GiB used · no limit".to_string()));
        // In a cohort: the bar runs to the maximum, the guarantee marked on it, and what is above it borrowed (as
        // the server says).
        let cohort = QuotaBar {
            used: 9_000,
            pending: 0,
            limit: Some(7_000),
            maximum: Some(14_000),
            borrowed: 2_000,
            ..free.clone()
        };
        assert_eq!(cohort.text(), "9 of 7 GiB used · 2 borrowed (at most 14)");
        assert_eq!((cohort.widths(), cohort.limit_mark()), (Some((9.0 / 14.0 * 100.0, 0.0)), Some(50.0)));
        let lender = QuotaBar { used: 3_000, borrowed: 0, ..cohort.clone() };
        assert_eq!(lender.text(), "3 of 7 GiB used · up to 14 with the cohort");
        // Above its limit outside a cohort (the server says nothing is borrowed): over its limit, not borrowing.
        let alone = QuotaBar { used: 9_000, limit: Some(7_000), maximum: None, borrowed: 0, ..free.clone() };
        assert_eq!(alone.text(), "9 of 7 GiB used · 2 over its limit");
        // Over a limit lowered under what it holds, with a maximum set but in no cohort: over, never "borrowed".
        let over = QuotaBar { used: 9_000, over: true, ..cohort };
        assert_eq!(
            over.text(),
            "9 of 7 GiB used · over what it may hold: new requests are refused until it is back under"
        );
    }

    #[test]
    fn feedback_is_the_core_quota_check_and_policy() {
        let policy = tessera_core::quota::ApprovalPolicy { auto_approve: true, auto_approve_max_compute_slices: 2 };
        let spec = SliceSpec::Mig { profile: "1g.10gb".into(), model: Some("H100-80GB".into()) };
        let f = feedback(&spec, 2, &quotas(3.0, 7.0), policy);
        assert_eq!(f.decision, Some(Decision::AutoApprove));
        let slices = f.charges.iter().find(|c| c.key == "compute_slices").expect("compute slices charged");
        assert_eq!(
            (slices.name.as_str(), slices.amount.as_str(), slices.left.as_deref()),
            ("Compute slices", "2 slices", Some("2 slices"))
        );
        let f = feedback(&spec, 3, &quotas(3.0, 7.0), policy);
        assert_eq!(f.decision, Some(Decision::NeedsAdmin));
        let f = feedback(&spec, 5, &quotas(3.0, 7.0), policy);
        assert_eq!(f.decision, None);
        assert_eq!(
            f.over,
            vec!["Compute slices: 3 held and 5 asked for would pass the limit of 7 slices.".to_string()]
        );
        let bad = SliceSpec::Timeslice { model: "H100-80GB".into(), replicas: 1 };
        assert!(feedback(&bad, 1, &quotas(0.0, 7.0), policy).invalid.is_some_and(|e| e.contains("replicas")));
    }
}
