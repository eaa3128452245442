-- Cohorts: tenants that lend each other what they guarantee but do not use. A tenant's limit is its guarantee; a
-- maximum above it says how far it may borrow, a lending limit how much of its unused guarantee others may borrow.
-- Requests carry a priority within their tenant; a request holding more than its tenant's guarantee is borrowed,
-- and a borrowed request being reclaimed carries when it will be released and for which tenant.

CREATE TABLE cohorts (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    grace_s BIGINT NOT NULL DEFAULT 600 CHECK (grace_s >= 0),
    created_at_ms BIGINT NOT NULL
);

ALTER TABLE tenants ADD COLUMN cohort_id TEXT REFERENCES cohorts (id);
ALTER TABLE tenants ADD COLUMN weight BIGINT NOT NULL DEFAULT 1 CHECK (weight >= 1);
CREATE INDEX tenants_by_cohort ON tenants (cohort_id);

ALTER TABLE quotas ADD COLUMN max_milli BIGINT CHECK (max_milli >= 0);
ALTER TABLE quotas ADD COLUMN lend_milli BIGINT CHECK (lend_milli >= 0);

-- What changed: the guarantee (`limit`), the maximum or the lending limit.
ALTER TABLE quota_limit_changes ADD COLUMN kind TEXT NOT NULL DEFAULT 'limit'
    CHECK (kind IN ('limit', 'maximum', 'lending'));

ALTER TABLE slice_requests ADD COLUMN priority TEXT NOT NULL DEFAULT 'normal'
    CHECK (priority IN ('low', 'normal', 'high'));
ALTER TABLE slice_requests ADD COLUMN borrowed BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE slice_requests ADD COLUMN reclaim_at_ms BIGINT;
ALTER TABLE slice_requests ADD COLUMN reclaim_for TEXT;
