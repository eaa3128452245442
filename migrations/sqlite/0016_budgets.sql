-- Monthly budgets: per tenant, hours of compute slices over everything (`compute_slice_hours`) or GPU-hours on one
-- model (`gpu_hours/<model>`), in thousandths; and what a spent budget does (`warn`, or `block` new requests).

CREATE TABLE budgets (
    tenant_id TEXT NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    unit TEXT NOT NULL,
    limit_milli INTEGER NOT NULL CHECK (limit_milli >= 0),
    PRIMARY KEY (tenant_id, unit)
);

CREATE TABLE budget_policies (
    tenant_id TEXT PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    policy TEXT NOT NULL CHECK (policy IN ('warn', 'block'))
);

-- Timelines read a tenant's charges by resource, and allocations by tenant.
CREATE INDEX request_charges_by_resource ON request_charges (resource, request_id);
CREATE INDEX allocations_by_tenant ON allocations (tenant_id, activated_at_ms);
