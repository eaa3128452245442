-- The Kubernetes controller: one replica at a time holds its lease (renewed while it runs; another takes over once
-- it expires); per cluster, how the last reconcile went; per allocation, its claims as the cluster last showed them.

CREATE TABLE leases (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    expires_at_ms BIGINT NOT NULL
);

CREATE TABLE cluster_sync (
    cluster_id TEXT PRIMARY KEY REFERENCES clusters (id) ON DELETE CASCADE,
    -- The last reconcile that completed, UTC ms (NULL: none yet).
    synced_at_ms BIGINT,
    -- The last failure and when (NULL once a reconcile completes after it).
    error TEXT,
    error_at_ms BIGINT
);

CREATE TABLE allocation_claims (
    allocation_id TEXT NOT NULL,
    cluster_id TEXT NOT NULL REFERENCES clusters (id) ON DELETE CASCADE,
    namespace TEXT NOT NULL,
    claim TEXT NOT NULL,
    allocated BOOLEAN NOT NULL,
    -- The pods the claim is reserved for, as a JSON list of names.
    pods TEXT NOT NULL,
    observed_at_ms BIGINT NOT NULL,
    PRIMARY KEY (allocation_id, cluster_id, namespace)
);
CREATE INDEX allocation_claims_by_cluster ON allocation_claims (cluster_id);
