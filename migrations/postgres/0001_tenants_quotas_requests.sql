-- Tenants, quotas, slice requests with their quota charges, and the audit log.
-- Times are timestamptz (UTC); ids are UUIDv7 text; JSON is jsonb.

CREATE TABLE tenants (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    auto_approve BOOLEAN NOT NULL DEFAULT FALSE,
    auto_approve_max_compute_slices INTEGER NOT NULL DEFAULT 0 CHECK (auto_approve_max_compute_slices >= 0),
    created_at TIMESTAMPTZ NOT NULL
);

CREATE TABLE quotas (
    tenant_id TEXT NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    resource TEXT NOT NULL,
    limit_milli BIGINT NOT NULL CHECK (limit_milli >= 0),
    PRIMARY KEY (tenant_id, resource)
);

CREATE TABLE slice_requests (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL REFERENCES tenants (id),
    spec JSONB NOT NULL,
    count INTEGER NOT NULL CHECK (count > 0),
    state TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    version BIGINT NOT NULL DEFAULT 1,
    created_at TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX slice_requests_by_tenant_state ON slice_requests (tenant_id, state);

CREATE TABLE request_charges (
    request_id TEXT NOT NULL REFERENCES slice_requests (id) ON DELETE CASCADE,
    resource TEXT NOT NULL,
    amount_milli BIGINT NOT NULL CHECK (amount_milli >= 0),
    PRIMARY KEY (request_id, resource)
);

CREATE TABLE audit_log (
    id BIGSERIAL PRIMARY KEY,
    at TIMESTAMPTZ NOT NULL,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    object TEXT NOT NULL,
    before_json JSONB,
    after_json JSONB
);
