//! Records as the API shows them: one record, one REST type from `tessera-api`, field for field. The conversions
//! sit beside the records because Rust's orphan rule lets only the crate of one side write them; a view that needs
//! rules or other reads (standing, waiting reasons, explanations) is built by its service in `tessera-services`.
//! The HTTP layer builds no views.

use tessera_api::agents::JoinTokenView;
use tessera_api::audit::AuditView;
use tessera_api::layouts::LayoutView;
use tessera_api::nodes::{GpuHealth, GpuView, NodeView};
use tessera_api::people::{TokenView, UserView};
use tessera_api::quotas::{LimitChangeView, QuotaRequestLine, QuotaRequestView};
use tessera_api::requests::RequestView;
use tessera_api::tenants::TenantView;
use tessera_core::quota::MILLI;

use crate::people::TokenInfo;
use crate::quotas::{LimitChange, QuotaRequest};
use crate::{AuditEntry, Gpu, LayoutProposal, Node, SliceRequest, Tenant, User};

/// Milli-units as the API's decimal units.
fn units(m: u64) -> f64 {
    m as f64 / MILLI as f64
}

impl From<crate::agents::JoinToken> for JoinTokenView {
    fn from(t: crate::agents::JoinToken) -> Self {
        JoinTokenView {
            id: t.id,
            token: None,
            node_name: t.node_name,
            created_by: t.created_by,
            created_at_ms: t.created_at_ms,
            expires_at_ms: t.expires_at_ms,
            used_at_ms: t.used_at_ms,
            node_id: t.node_id,
        }
    }
}

impl From<AuditEntry> for AuditView {
    fn from(e: AuditEntry) -> Self {
        AuditView {
            at_ms: e.at_ms,
            actor: e.actor,
            action: e.action,
            object: e.object,
            before: e.before,
            after: e.after,
        }
    }
}

impl From<LayoutProposal> for LayoutView {
    fn from(p: LayoutProposal) -> Self {
        LayoutView {
            id: p.id,
            gpu: p.gpu_id,
            base_version: p.base_version,
            layout: p.layout,
            created: p.created,
            destroyed: p.destroyed,
            state: p.state,
            reason: p.reason,
            created_by: p.created_by,
            decided_by: p.decided_by,
            created_at_ms: p.created_at_ms,
            decided_at_ms: p.decided_at_ms,
            needed_by: Vec::new(),
        }
    }
}

impl From<Gpu> for GpuView {
    fn from(g: Gpu) -> Self {
        GpuView {
            id: g.id,
            index: g.index,
            uuid: g.uuid,
            model: g.model,
            mig_enabled: g.mig_enabled,
            cordoned: g.cordoned,
            layout: g.layout,
            layout_version: g.layout_version,
            auto_layout: g.auto_layout,
            applied: None,
            errors: Vec::new(),
            in_use: Vec::new(),
            health: GpuHealth {
                state: g.health.state,
                findings: g.health.findings,
                since_ms: g.health.since_ms,
                report: None,
            },
            drain: None,
            now: None,
            layout_waiting: None,
            processes: Vec::new(),
        }
    }
}

impl From<crate::attribution::ProcessRow> for tessera_api::nodes::ProcessView {
    fn from(p: crate::attribution::ProcessRow) -> Self {
        tessera_api::nodes::ProcessView {
            pod: p.pod_ref(),
            device: p.device,
            pid: u32::try_from(p.pid).unwrap_or(0),
            user: p.user_name,
            command: p.command,
            allocation: p.allocation_id,
            unallocated: p.stray.as_deref().and_then(tessera_core::attribution::Stray::parse),
            since_ms: p.since_ms,
        }
    }
}

impl From<Node> for NodeView {
    fn from(n: Node) -> Self {
        NodeView {
            id: n.id,
            name: n.name,
            created_at_ms: n.created_at_ms,
            gpus: n.gpus.into_iter().map(Into::into).collect(),
            state: "not-joined".to_string(),
            generation: 0,
            observed_generation: 0,
            last_seen_ms: None,
            agent: None,
            errors: Vec::new(),
        }
    }
}

impl From<User> for UserView {
    fn from(u: User) -> Self {
        UserView { id: u.id, name: u.name, platform_admin: u.platform_admin }
    }
}

impl From<TokenInfo> for TokenView {
    fn from(t: TokenInfo) -> Self {
        TokenView { id: t.id, name: t.name, created_at_ms: t.created_at_ms, revoked_at_ms: t.revoked_at_ms }
    }
}

impl From<QuotaRequest> for QuotaRequestView {
    fn from(r: QuotaRequest) -> Self {
        QuotaRequestView {
            id: r.id,
            tenant: r.tenant_id,
            requested_by: r.requested_by,
            reason: r.reason,
            until_ms: r.until_ms,
            state: r.state,
            lines: r
                .lines
                .into_iter()
                .map(|l| QuotaRequestLine {
                    resource: l.line.resource.to_string(),
                    asked: units(l.line.asked),
                    before: l.line.before.map(units),
                    granted: l.granted.map(units),
                })
                .collect(),
            decided_by: r.decided_by,
            comment: r.comment,
            version: r.version,
            created_at_ms: r.created_at_ms,
            updated_at_ms: r.updated_at_ms,
        }
    }
}

impl From<LimitChange> for LimitChangeView {
    fn from(c: LimitChange) -> Self {
        LimitChangeView {
            resource: c.resource,
            at_ms: c.at_ms,
            actor: c.actor,
            before: c.before.map(units),
            after: c.after.map(units),
            why: c.why,
            quota_request: c.quota_request,
            kind: tessera_api::quotas::LimitKind::parse(&c.kind).unwrap_or_default(),
        }
    }
}

impl From<SliceRequest> for RequestView {
    fn from(r: SliceRequest) -> Self {
        RequestView {
            id: r.id,
            tenant: r.tenant_id,
            spec: r.spec,
            count: r.count,
            state: r.state,
            reason: r.reason,
            version: r.version,
            created_at_ms: r.created_at_ms,
            updated_at_ms: r.updated_at_ms,
            duration_s: r.duration_s,
            expires_at_ms: r.expires_at_ms,
            priority: r.priority,
            borrowed: r.borrowed,
            reclaim_at_ms: r.reclaim_at_ms,
            reclaim_for: r.reclaim_for,
            waiting: None,
        }
    }
}

impl From<Tenant> for TenantView {
    fn from(t: Tenant) -> Self {
        TenantView {
            id: t.id,
            name: t.name,
            auto_approve: t.policy.auto_approve,
            auto_approve_max_compute_slices: t.policy.auto_approve_max_compute_slices,
            created_at_ms: t.created_at_ms,
            cohort: t.cohort_id,
            weight: t.weight,
        }
    }
}
