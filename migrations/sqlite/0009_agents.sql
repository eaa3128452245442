-- Node agents: join tokens (single use, only a SHA-256 of the secret is stored), each node's spec generation and
-- the status its agent last reported, and when allocations became active or were released (usage metering).

CREATE TABLE join_tokens (
    id TEXT PRIMARY KEY,
    secret_sha256 TEXT NOT NULL UNIQUE,
    node_name TEXT,
    created_by TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    used_at_ms INTEGER,
    node_id TEXT REFERENCES nodes (id) ON DELETE SET NULL
);

ALTER TABLE nodes ADD COLUMN generation INTEGER NOT NULL DEFAULT 1;
ALTER TABLE nodes ADD COLUMN spec_hash TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN observed_generation INTEGER NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN status TEXT;
ALTER TABLE nodes ADD COLUMN status_at_ms INTEGER;
ALTER TABLE nodes ADD COLUMN last_seen_ms INTEGER;
ALTER TABLE nodes ADD COLUMN inventory TEXT;

ALTER TABLE allocations ADD COLUMN device_uuid TEXT;
ALTER TABLE allocations ADD COLUMN activated_at_ms INTEGER;
ALTER TABLE allocations ADD COLUMN released_at_ms INTEGER;
