-- Layout proposals (one open per GPU), allocations of exact MIG instances (one live per instance), auto-layout.

ALTER TABLE gpus ADD COLUMN auto_layout INTEGER NOT NULL DEFAULT 0 CHECK (auto_layout IN (0, 1));

CREATE TABLE layout_proposals (
    id TEXT PRIMARY KEY,
    gpu_id TEXT NOT NULL REFERENCES gpus (id) ON DELETE CASCADE,
    base_version INTEGER NOT NULL,
    layout TEXT NOT NULL,
    created TEXT NOT NULL,
    destroyed TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('proposed', 'approved', 'rejected')),
    reason TEXT NOT NULL DEFAULT '',
    created_by TEXT NOT NULL,
    decided_by TEXT,
    created_at_ms INTEGER NOT NULL
);
CREATE UNIQUE INDEX layout_proposals_open ON layout_proposals (gpu_id) WHERE state = 'proposed';

CREATE TABLE allocations (
    id TEXT PRIMARY KEY,
    request_id TEXT NOT NULL REFERENCES slice_requests (id),
    tenant_id TEXT NOT NULL REFERENCES tenants (id),
    gpu_id TEXT NOT NULL REFERENCES gpus (id),
    profile TEXT NOT NULL,
    start INTEGER NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('reserved', 'active', 'released')),
    proposal_id TEXT REFERENCES layout_proposals (id),
    created_at_ms INTEGER NOT NULL
);
CREATE UNIQUE INDEX allocations_live_instance ON allocations (gpu_id, start) WHERE state IN ('reserved', 'active');
CREATE INDEX allocations_by_request ON allocations (request_id);
