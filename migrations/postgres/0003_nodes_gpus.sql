-- GPU nodes and their GPUs, with each GPU's current MIG layout (JSON list of {profile, start}).

CREATE TABLE nodes (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    created_at TIMESTAMPTZ NOT NULL
);

CREATE TABLE gpus (
    id TEXT PRIMARY KEY,
    node_id TEXT NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    idx INTEGER NOT NULL CHECK (idx >= 0),
    uuid TEXT NOT NULL UNIQUE,
    model TEXT NOT NULL,
    mig_enabled BOOLEAN NOT NULL,
    cordoned BOOLEAN NOT NULL DEFAULT FALSE,
    layout JSONB NOT NULL DEFAULT '[]',
    layout_version BIGINT NOT NULL DEFAULT 1,
    UNIQUE (node_id, idx)
);
