-- Quota requests: a tenant's admin asks for new limits (optionally until an end date), a platform admin grants
-- them in full or in part or refuses; granting changes the limits in the same transaction. Every change of a
-- limit, by whatever route, is kept in quota_limit_changes (who, when, why, via which quota request).
-- Times are UTC milliseconds; amounts are thousandths of a unit, as in quotas.

CREATE TABLE quota_requests (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL REFERENCES tenants (id),
    requested_by TEXT NOT NULL,
    reason TEXT NOT NULL,
    until_ms BIGINT,
    state TEXT NOT NULL CHECK (state IN ('pending', 'approved', 'rejected', 'cancelled', 'ended')),
    decided_by TEXT,
    comment TEXT NOT NULL DEFAULT '',
    version BIGINT NOT NULL DEFAULT 1,
    created_at_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL
);
CREATE INDEX quota_requests_by_tenant ON quota_requests (tenant_id, id);
CREATE INDEX quota_requests_by_state ON quota_requests (state, until_ms);

-- One row per resource asked for: the limit asked, the limit when asked, and once granted the limit granted and
-- the limit in force just before (what a temporary grant gives back at its end).
CREATE TABLE quota_request_lines (
    request_id TEXT NOT NULL REFERENCES quota_requests (id) ON DELETE CASCADE,
    resource TEXT NOT NULL,
    asked_milli BIGINT NOT NULL CHECK (asked_milli >= 0),
    before_milli BIGINT,
    granted_milli BIGINT,
    granted_before_milli BIGINT,
    PRIMARY KEY (request_id, resource)
);

CREATE TABLE quota_limit_changes (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id TEXT NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    resource TEXT NOT NULL,
    at_ms BIGINT NOT NULL,
    actor TEXT NOT NULL,
    before_milli BIGINT,
    after_milli BIGINT,
    why TEXT NOT NULL DEFAULT '',
    quota_request_id TEXT
);
CREATE INDEX quota_limit_changes_by_tenant ON quota_limit_changes (tenant_id, id);
