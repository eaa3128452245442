-- GPU nodes and their GPUs, with each GPU's current MIG layout (JSON list of {profile, start}).

CREATE TABLE nodes (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    created_at_ms INTEGER NOT NULL
);

CREATE TABLE gpus (
    id TEXT PRIMARY KEY,
    node_id TEXT NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    idx INTEGER NOT NULL CHECK (idx >= 0),
    uuid TEXT NOT NULL UNIQUE,
    model TEXT NOT NULL,
    mig_enabled INTEGER NOT NULL CHECK (mig_enabled IN (0, 1)),
    cordoned INTEGER NOT NULL DEFAULT 0 CHECK (cordoned IN (0, 1)),
    layout TEXT NOT NULL DEFAULT '[]',
    layout_version INTEGER NOT NULL DEFAULT 1,
    UNIQUE (node_id, idx)
);
