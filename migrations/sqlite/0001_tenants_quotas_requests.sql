-- Tenants, quotas, slice requests with their quota charges, and the audit log.
-- Times are UTC milliseconds since the epoch; ids are UUIDv7 text; JSON is stored as text.

CREATE TABLE tenants (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    auto_approve INTEGER NOT NULL DEFAULT 0 CHECK (auto_approve IN (0, 1)),
    auto_approve_max_compute_slices INTEGER NOT NULL DEFAULT 0 CHECK (auto_approve_max_compute_slices >= 0),
    created_at_ms INTEGER NOT NULL
);

CREATE TABLE quotas (
    tenant_id TEXT NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    resource TEXT NOT NULL,
    limit_milli INTEGER NOT NULL CHECK (limit_milli >= 0),
    PRIMARY KEY (tenant_id, resource)
);

CREATE TABLE slice_requests (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL REFERENCES tenants (id),
    spec TEXT NOT NULL,
    count INTEGER NOT NULL CHECK (count > 0),
    state TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    version INTEGER NOT NULL DEFAULT 1,
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL
);
CREATE INDEX slice_requests_by_tenant_state ON slice_requests (tenant_id, state);

CREATE TABLE request_charges (
    request_id TEXT NOT NULL REFERENCES slice_requests (id) ON DELETE CASCADE,
    resource TEXT NOT NULL,
    amount_milli INTEGER NOT NULL CHECK (amount_milli >= 0),
    PRIMARY KEY (request_id, resource)
);

CREATE TABLE audit_log (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms INTEGER NOT NULL,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    object TEXT NOT NULL,
    before_json TEXT,
    after_json TEXT
);
